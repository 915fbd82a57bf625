//! Upstream's Apple Thunderbolt flavor (`transport-apple.cpp`) over a UC queue pair.
//!
//! Wire rules (rdma-transports.md §4): a byte stream cut into 128 KiB strides, each starting
//! with `| u32 magic "RSEG" | u32 len |`; **every SEND is a full stride** (Apple's equal
//! frame-count rule); 16 send and 16 receive buffers; the partial frame is posted at the end of
//! every message (`flush`) or before waiting for input.

use std::collections::VecDeque;
use std::io;

use super::verbs::{wc_error, Verbs, Wc};
use super::Flavored;

pub const UC_NBUF: usize = 16;
pub const UC_STRIDE: usize = 128 * 1024;
pub const UC_HEADER: usize = 8;
pub const UC_PAYLOAD: usize = UC_STRIDE - UC_HEADER;
pub const UC_MAGIC: u32 = 0x5253_4547; // "RSEG"
/// Size of each of the two registered regions.
pub const UC_RING_SIZE: usize = UC_NBUF * UC_STRIDE;
/// `wr_id` tag of receives (buffer index in the low 16 bits), as upstream.
const RECV_WR: u64 = 1 << 20;

pub struct UcLink<V: Verbs> {
    v: V,
    /// Send buffers not in flight.
    free: VecDeque<usize>,
    /// The frame being filled: (buffer, payload bytes so far).
    pending: Option<(usize, usize)>,
    /// Completed receive frames: (buffer, payload length, consumed).
    rx: VecDeque<(usize, usize, usize)>,
    wcs: Vec<Wc>,
    sends: u64,
    recvs: u64,
    /// Keepalives sent since the peer last sent us a frame (bounded: each one occupies one of
    /// the peer's receive buffers until it reads).
    unanswered_keepalives: u32,
}

/// At most this many keepalives wait in the peer's receive ring.
const MAX_UNANSWERED_KEEPALIVES: u32 = 4;

impl<V: Verbs> UcLink<V> {
    pub fn new(v: V) -> UcLink<V> {
        UcLink {
            v,
            free: (0..UC_NBUF).collect(),
            pending: None,
            rx: VecDeque::new(),
            wcs: Vec::new(),
            sends: 0,
            recvs: 0,
            unanswered_keepalives: 0,
        }
    }

    /// Posts every receive buffer (after RTS: Apple's provider rejects receives before).
    pub fn post_all_receives(&mut self) -> io::Result<()> {
        for i in 0..UC_NBUF {
            self.v
                .post_recv(RECV_WR | i as u64, i * UC_STRIDE, UC_STRIDE)?;
        }
        Ok(())
    }

    pub fn verbs(&mut self) -> &mut V {
        &mut self.v
    }

    fn post_pending(&mut self) -> io::Result<()> {
        if let Some((buf, len)) = self.pending.take() {
            let base = buf * UC_STRIDE;
            let mem = self.v.send_mem();
            mem[base..base + 4].copy_from_slice(&UC_MAGIC.to_le_bytes());
            mem[base + 4..base + 8].copy_from_slice(&(len as u32).to_le_bytes());
            self.v.post_send(buf as u64, base, UC_STRIDE, false)?;
            self.sends += 1;
        }
        Ok(())
    }
}

impl<V: Verbs> Flavored for UcLink<V> {
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
                let buf = (wc.wr_id & 0xffff) as usize;
                if wc.wr_id & RECV_WR == 0 || buf >= UC_NBUF {
                    return Err(io::Error::other("RDMA receive: unknown wr_id"));
                }
                let base = buf * UC_STRIDE;
                let hdr = &self.v.recv_mem()[base..base + 8];
                let magic = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
                let len = u32::from_le_bytes([hdr[4], hdr[5], hdr[6], hdr[7]]) as usize;
                if magic != UC_MAGIC {
                    return Err(io::Error::other("RDMA(UC): bad frame magic"));
                }
                if len > UC_PAYLOAD || len + UC_HEADER > wc.byte_len as usize {
                    return Err(io::Error::other(format!(
                        "RDMA(UC): bad frame length {len}"
                    )));
                }
                self.recvs += 1;
                self.unanswered_keepalives = 0;
                if len == 0 {
                    self.v.post_recv(RECV_WR | buf as u64, base, UC_STRIDE)?;
                } else {
                    self.rx.push_back((buf, len, 0));
                }
            } else {
                let buf = wc.wr_id as usize;
                if buf < UC_NBUF {
                    self.free.push_back(buf);
                }
            }
        }
        Ok(any)
    }

    fn read_available(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < out.len() {
            let Some((buf, len, consumed)) = self.rx.front_mut() else {
                break;
            };
            let take = (*len - *consumed).min(out.len() - n);
            let start = *buf * UC_STRIDE + UC_HEADER + *consumed;
            out[n..n + take].copy_from_slice(&self.v.recv_mem()[start..start + take]);
            n += take;
            *consumed += take;
            if *consumed == *len {
                let buf = *buf;
                self.rx.pop_front();
                self.v
                    .post_recv(RECV_WR | buf as u64, buf * UC_STRIDE, UC_STRIDE)?;
            }
        }
        if n == 0 {
            // The peer may be waiting for what we buffered before it answers.
            self.post_pending()?;
        }
        Ok(n)
    }

    fn write_part(&mut self, part: &[u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < part.len() {
            let (buf, fill) = match self.pending {
                Some(p) => p,
                None => match self.free.pop_front() {
                    Some(b) => (b, 0),
                    None => break,
                },
            };
            let take = (UC_PAYLOAD - fill).min(part.len() - n);
            let start = buf * UC_STRIDE + UC_HEADER + fill;
            self.v.send_mem()[start..start + take].copy_from_slice(&part[n..n + take]);
            n += take;
            self.pending = Some((buf, fill + take));
            if fill + take == UC_PAYLOAD {
                self.post_pending()?;
            }
        }
        Ok(n)
    }

    fn end_message(&mut self) -> io::Result<()> {
        self.post_pending()
    }

    fn sends_pending(&self) -> bool {
        false
    }

    fn arm(&mut self) -> io::Result<Option<rdma_verbs::CompChannel>> {
        self.v.arm()
    }

    fn counters(&self) -> (u64, u64) {
        (self.sends, self.recvs)
    }

    /// An empty frame (`len = 0`): upstream's receiver consumes it without effect. Only when
    /// nothing is buffered and a send buffer is free, and at most a few at a time.
    fn keepalive(&mut self) -> io::Result<bool> {
        if self.pending.is_some() || self.unanswered_keepalives >= MAX_UNANSWERED_KEEPALIVES {
            return Ok(false);
        }
        let Some(buf) = self.free.pop_front() else {
            return Ok(false);
        };
        self.pending = Some((buf, 0));
        self.post_pending()?;
        self.unanswered_keepalives += 1;
        Ok(true)
    }
}
