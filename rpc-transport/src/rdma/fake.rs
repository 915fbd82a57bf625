//! An in-process RDMA fabric for fast tests. It enforces the hardware rules the flavors depend
//! on, so a framing bug shows up as the same error it would cause on real hardware:
//!
//! - RC: a SEND larger than the receive it lands in fails both sides (local length error); a
//!   SEND with no receive posted waits (RNR retry); a dead peer fails the sender (retry exceeded).
//! - UC (Apple): a SEND and its receive must span the same number of 4 KiB frames, else the
//!   receive fails; a dead peer is silent: sends complete, nothing arrives.
//! - A device allows a bounded number of queue pairs (Apple: 10); more fail with EBUSY.
//! - Faults can be injected on the next SEND: drop it (UC), corrupt one byte, fail it. Real RC
//!   never delivers a packet that fails the fabric's ICRC, so corruption on RC stands for a fault
//!   past it (a bad DMA, a driver bug): lean catches that only while its frames carry checksums.
//! - A SEND that finds no receive posted is counted ([`FakeQp::unmatched`]: an RNR wait on RC,
//!   a hardware credit wait on Apple's UC); with [`FakeQp::drop_unmatched`] a UC SEND that finds
//!   none is lost instead, as rxe's UC does, so software credits can be tested.

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::verbs::{Verbs, Wc};

/// Which hardware rules the fabric enforces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rules {
    Rc,
    Uc,
}

/// A fault applied to the next SEND of an endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The SEND completes but never arrives (only UC can lose data silently).
    Drop,
    /// Flip the bits of the byte at this offset of the message.
    Corrupt(usize),
    /// The SEND completes with an error status.
    Error,
}

pub const FRAME: usize = 4096;
const STATUS_LOC_LEN_ERR: u32 = 1;
const STATUS_REM_OP_ERR: u32 = 11;
const STATUS_RETRY_EXC_ERR: u32 = 12;
const STATUS_GENERAL_ERR: u32 = 21;

#[derive(Default)]
struct Endpoint {
    posted: VecDeque<(u64, usize, usize)>,
    /// Messages on their way to this endpoint: (sender wr_id, bytes).
    incoming: VecDeque<(u64, Vec<u8>)>,
    completions: VecDeque<Wc>,
    dead: bool,
    fault: Option<Fault>,
    sends: u64,
    bytes_sent: u64,
    inline_sends: u64,
    /// Length of every SEND posted, in order (for packet counts at any MTU).
    send_lens: Vec<usize>,
    /// SENDs of the peer that found no receive posted here.
    unmatched: u64,
}

struct Wire {
    rules: Rules,
    /// UC: a SEND that finds no receive posted is dropped (rxe), instead of waiting (Apple).
    drop_unmatched: bool,
    eps: [Endpoint; 2],
}

/// A device with a queue-pair budget.
pub struct FakeDevice {
    max_qps: usize,
    active: Arc<AtomicUsize>,
}

impl FakeDevice {
    pub fn new(max_qps: usize) -> FakeDevice {
        FakeDevice {
            max_qps,
            active: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Queue pairs currently allocated on this device.
    pub fn active_qps(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// Allocates one queue pair of the budget, or fails with `EBUSY` like Apple's provider.
    pub fn reserve(&self) -> io::Result<QpReservation> {
        let prev = self.active.fetch_add(1, Ordering::SeqCst);
        if prev >= self.max_qps {
            self.active.fetch_sub(1, Ordering::SeqCst);
            return Err(io::Error::from_raw_os_error(16)); // EBUSY
        }
        Ok(QpReservation {
            active: self.active.clone(),
        })
    }
}

/// One queue pair of a [`FakeDevice`]'s budget; released on drop.
pub struct QpReservation {
    active: Arc<AtomicUsize>,
}

impl Drop for QpReservation {
    fn drop(&mut self) {
        self.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One end of a connected fake queue pair.
pub struct FakeQp {
    wire: Arc<Mutex<Wire>>,
    me: usize,
    send_mem: Vec<u8>,
    recv_mem: Vec<u8>,
    max_inline: usize,
    _reservation: Option<QpReservation>,
}

/// Creates two connected queue pairs with the given region sizes.
pub fn pair(
    rules: Rules,
    send_size: usize,
    recv_size: usize,
    max_inline: usize,
) -> (FakeQp, FakeQp) {
    let wire = Arc::new(Mutex::new(Wire {
        rules,
        drop_unmatched: false,
        eps: [Endpoint::default(), Endpoint::default()],
    }));
    let mk = |me| FakeQp {
        wire: wire.clone(),
        me,
        send_mem: vec![0; send_size],
        recv_mem: vec![0; recv_size],
        max_inline,
        _reservation: None,
    };
    (mk(0), mk(1))
}

impl FakeQp {
    fn lock(&self) -> std::sync::MutexGuard<'_, Wire> {
        self.wire.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ties this queue pair to a device budget slot.
    pub fn with_reservation(mut self, r: QpReservation) -> FakeQp {
        self._reservation = Some(r);
        self
    }

    /// Injects a fault into this endpoint's next SEND.
    pub fn inject(&self, f: Fault) {
        self.lock().eps[self.me].fault = Some(f);
    }

    /// Simulates this endpoint's host dying: it stops receiving and completing anything.
    pub fn kill(&self) {
        self.lock().eps[self.me].dead = true;
    }

    /// SENDs posted by this endpoint and their total bytes on the wire.
    pub fn sent(&self) -> (u64, u64) {
        let w = self.lock();
        (w.eps[self.me].sends, w.eps[self.me].bytes_sent)
    }

    /// Packets this endpoint's SENDs took on a link with this MTU (a SEND of `n` bytes is
    /// `max(1, ceil(n / mtu))` packets, as RoCE segments it).
    pub fn packets(&self, mtu: usize) -> u64 {
        let w = self.lock();
        w.eps[self.me]
            .send_lens
            .iter()
            .map(|&n| super::wire::packets(n, mtu))
            .sum()
    }

    /// SENDs posted by this endpoint as inline.
    pub fn sent_inline(&self) -> u64 {
        self.lock().eps[self.me].inline_sends
    }

    /// SENDs of this endpoint that found no receive posted at the peer when they arrived.
    pub fn unmatched(&self) -> u64 {
        let w = self.lock();
        w.eps[1 - self.me].unmatched
    }

    /// UC, both directions: a SEND that finds no receive posted is lost (rxe) instead of
    /// waiting for one (Apple's hardware credits).
    pub fn drop_unmatched(&self, on: bool) {
        self.lock().drop_unmatched = on;
    }

    /// Matches queued incoming messages with posted receives, applying the rules.
    fn deliver(&mut self) {
        let me = self.me;
        let peer = 1 - me;
        let mut w = self.wire.lock().unwrap_or_else(|e| e.into_inner());
        let rules = w.rules;
        if w.eps[me].dead {
            return;
        }
        while !w.eps[me].incoming.is_empty() && !w.eps[me].posted.is_empty() {
            let (swr, msg) = w.eps[me].incoming.pop_front().unwrap_or_default();
            let (rwr, off, len) = w.eps[me].posted.pop_front().unwrap_or_default();
            let ok = match rules {
                Rules::Rc => msg.len() <= len,
                Rules::Uc => msg.len().div_ceil(FRAME).max(1) == len.div_ceil(FRAME).max(1),
            };
            if ok {
                self.recv_mem[off..off + msg.len()].copy_from_slice(&msg);
                w.eps[me].completions.push_back(Wc {
                    wr_id: rwr,
                    recv: true,
                    byte_len: msg.len() as u32,
                    error: None,
                });
                if rules == Rules::Rc {
                    w.eps[peer].completions.push_back(Wc {
                        wr_id: swr,
                        recv: false,
                        byte_len: 0,
                        error: None,
                    });
                }
            } else {
                w.eps[me].completions.push_back(Wc {
                    wr_id: rwr,
                    recv: true,
                    byte_len: 0,
                    error: Some(STATUS_LOC_LEN_ERR),
                });
                if rules == Rules::Rc {
                    w.eps[peer].completions.push_back(Wc {
                        wr_id: swr,
                        recv: false,
                        byte_len: 0,
                        error: Some(STATUS_REM_OP_ERR),
                    });
                }
            }
        }
    }
}

impl Verbs for FakeQp {
    fn send_mem(&mut self) -> &mut [u8] {
        &mut self.send_mem
    }

    fn recv_mem(&self) -> &[u8] {
        &self.recv_mem
    }

    fn post_send(&mut self, wr_id: u64, offset: usize, len: usize, inline: bool) -> io::Result<()> {
        if offset
            .checked_add(len)
            .is_none_or(|e| e > self.send_mem.len())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "post_send outside the send region",
            ));
        }
        if inline && len > self.max_inline {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "inline SEND larger than max_inline",
            ));
        }
        let mut msg = self.send_mem[offset..offset + len].to_vec();
        let me = self.me;
        let peer = 1 - me;
        let mut w = self.lock();
        let rules = w.rules;
        let fault = w.eps[me].fault.take();
        w.eps[me].sends += 1;
        w.eps[me].bytes_sent += len as u64;
        w.eps[me].send_lens.push(len);
        if inline {
            w.eps[me].inline_sends += 1;
        }
        match fault {
            Some(Fault::Error) => {
                w.eps[me].completions.push_back(Wc {
                    wr_id,
                    recv: false,
                    byte_len: 0,
                    error: Some(STATUS_GENERAL_ERR),
                });
                return Ok(());
            }
            Some(Fault::Drop) => {
                w.eps[me].completions.push_back(Wc {
                    wr_id,
                    recv: false,
                    byte_len: 0,
                    error: None,
                });
                return Ok(());
            }
            Some(Fault::Corrupt(i)) => {
                if let Some(b) = msg.get_mut(i) {
                    *b ^= 0xff;
                }
            }
            None => {}
        }
        if w.eps[peer].dead {
            let error = if rules == Rules::Rc {
                Some(STATUS_RETRY_EXC_ERR)
            } else {
                None
            };
            w.eps[me].completions.push_back(Wc {
                wr_id,
                recv: false,
                byte_len: 0,
                error,
            });
            return Ok(());
        }
        let free_receives = w.eps[peer]
            .posted
            .len()
            .saturating_sub(w.eps[peer].incoming.len());
        if free_receives == 0 {
            w.eps[peer].unmatched += 1;
            if rules == Rules::Uc && w.drop_unmatched {
                w.eps[me].completions.push_back(Wc {
                    wr_id,
                    recv: false,
                    byte_len: 0,
                    error: None,
                });
                return Ok(());
            }
        }
        w.eps[peer].incoming.push_back((wr_id, msg));
        if rules == Rules::Uc {
            // No acks: the send completes once the hardware took it.
            w.eps[me].completions.push_back(Wc {
                wr_id,
                recv: false,
                byte_len: 0,
                error: None,
            });
        }
        Ok(())
    }

    fn post_recv(&mut self, wr_id: u64, offset: usize, len: usize) -> io::Result<()> {
        if offset
            .checked_add(len)
            .is_none_or(|e| e > self.recv_mem.len())
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "post_recv outside the receive region",
            ));
        }
        self.lock().eps[self.me]
            .posted
            .push_back((wr_id, offset, len));
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Wc>) -> io::Result<()> {
        self.deliver();
        let mut w = self.lock();
        if w.eps[self.me].dead {
            return Ok(());
        }
        out.extend(w.eps[self.me].completions.drain(..));
        Ok(())
    }

    fn max_inline(&self) -> usize {
        self.max_inline
    }
}
