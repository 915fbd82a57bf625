//! Upstream's Linux flavor (`transport.cpp`) over an RC queue pair.
//!
//! Wire rules (rdma-transports.md §3.5): every `send_data()` piece of at most 256 KiB is one
//! SEND, stop-and-wait (one SEND outstanding); the stock receiver copies whole completions, so
//! a part must never be coalesced with another. Receives: 24 slots of 256 KiB, posted before RTR.
//! Unlike upstream, the receiver here is a byte stream that never copies past what it was asked
//! for, and rejects completions larger than a slot.

use std::collections::VecDeque;
use std::io;

use super::verbs::{wc_error, Verbs, Wc};
use super::Flavored;

/// Size of one SEND and of one receive slot.
pub const RC_CHUNK: usize = 256 * 1024;
/// Receive slots.
pub const RC_RX_DEPTH: usize = 24;
/// Send buffer size (one chunk).
pub const RC_TX_SIZE: usize = RC_CHUNK;
/// Receive region size.
pub const RC_RX_SIZE: usize = RC_CHUNK * RC_RX_DEPTH;

const SEND_WR: u64 = 1 << 40;

/// The RC flavor state over a queue pair `V`.
pub struct RcLink<V: Verbs> {
    v: V,
    /// Completed receives not fully consumed: (slot, length, consumed).
    rx: VecDeque<(usize, usize, usize)>,
    send_outstanding: bool,
    wcs: Vec<Wc>,
    pub(crate) sends: u64,
    pub(crate) recvs: u64,
}

impl<V: Verbs> RcLink<V> {
    /// Wraps a queue pair whose send region holds at least [`RC_TX_SIZE`] bytes and whose
    /// receive region [`RC_RX_SIZE`].
    pub fn new(v: V) -> RcLink<V> {
        RcLink {
            v,
            rx: VecDeque::new(),
            send_outstanding: false,
            wcs: Vec::new(),
            sends: 0,
            recvs: 0,
        }
    }

    /// Posts every receive slot. Must happen before the QP reaches RTR (upstream order).
    pub fn post_all_receives(&mut self) -> io::Result<()> {
        for slot in 0..RC_RX_DEPTH {
            self.v.post_recv(slot as u64, slot * RC_CHUNK, RC_CHUNK)?;
        }
        Ok(())
    }

    pub fn verbs(&mut self) -> &mut V {
        &mut self.v
    }
}

impl<V: Verbs> Flavored for RcLink<V> {
    fn progress(&mut self) -> io::Result<bool> {
        self.wcs.clear();
        self.v.poll(&mut self.wcs)?;
        let any = !self.wcs.is_empty();
        for i in 0..self.wcs.len() {
            let wc = self.wcs[i];
            if wc.error.is_some() {
                return Err(wc_error(if wc.recv { "receive" } else { "send" }, &wc));
            }
            if wc.recv {
                let slot = wc.wr_id as usize;
                let len = wc.byte_len as usize;
                if slot >= RC_RX_DEPTH || len > RC_CHUNK {
                    return Err(io::Error::other(format!(
                        "RDMA receive: bad completion slot={slot} len={len}"
                    )));
                }
                self.recvs += 1;
                if len == 0 {
                    self.v.post_recv(slot as u64, slot * RC_CHUNK, RC_CHUNK)?;
                } else {
                    self.rx.push_back((slot, len, 0));
                }
            } else if wc.wr_id == SEND_WR {
                self.send_outstanding = false;
            }
        }
        Ok(any)
    }

    fn read_available(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() {
            let Some((slot, len, consumed)) = self.rx.front_mut() else {
                break;
            };
            let take = (*len - *consumed).min(buf.len() - n);
            let start = *slot * RC_CHUNK + *consumed;
            buf[n..n + take].copy_from_slice(&self.v.recv_mem()[start..start + take]);
            n += take;
            *consumed += take;
            if *consumed == *len {
                let slot = *slot;
                self.rx.pop_front();
                self.v.post_recv(slot as u64, slot * RC_CHUNK, RC_CHUNK)?;
            }
        }
        Ok(n)
    }

    fn write_part(&mut self, part: &[u8]) -> io::Result<usize> {
        if self.send_outstanding || part.is_empty() {
            return Ok(0);
        }
        let n = part.len().min(RC_CHUNK);
        let inline = n <= self.v.max_inline();
        self.v.send_mem()[..n].copy_from_slice(&part[..n]);
        self.v.post_send(SEND_WR, 0, n, inline)?;
        self.send_outstanding = true;
        self.sends += 1;
        Ok(n)
    }

    fn end_message(&mut self) -> io::Result<()> {
        Ok(())
    }

    fn sends_pending(&self) -> bool {
        self.send_outstanding
    }

    fn arm(&mut self) -> io::Result<Option<rdma_verbs::CompChannel>> {
        self.v.arm()
    }

    fn counters(&self) -> (u64, u64) {
        (self.sends, self.recvs)
    }
}
