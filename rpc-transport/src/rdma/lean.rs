//! The lean framing between our own peers (negotiated with the caps marker, see [`super::caps`]),
//! over an RC or a UC queue pair.
//!
//! A byte stream cut into frames, one frame per SEND:
//!
//! ```text
//! | u32 magic "LEAN" | u32 seq | u32 len | u16 credits | u16 flags=0 | u32 crc32 | payload[len] |
//! ```
//!
//! - `seq` counts frames per direction from 0; `crc32` (IEEE, `crc32fast`) covers the first 16
//!   header bytes and the payload. A SEND whose length is not `20 + len`, a bad magic, a checksum
//!   mismatch or a sequence gap (a frame lost on UC) **fails the connection**: a frame is checked
//!   whole before any of its bytes is handed out, so corrupt data is never delivered.
//! - **Credits**: each side may have at most as many frames outstanding as the peer has receives
//!   posted (the geometry is fixed per queue-pair type, so both sides know the peer's count).
//!   A receive is re-posted once its frame is consumed, and counted in `credits` of the next frame
//!   this side sends (piggybacked); when `RETURN_AT` re-posted receives are still unreported, a
//!   credit-only frame (`len = 0`) carries them. Data frames keep [`RESERVE`] credits back, so a
//!   credit-only frame can always go out; it has its own send slot. rxe's UC drops a SEND that
//!   finds no receive, Apple's holds it: with credits neither ever happens.
//! - RC: receives of 256 KiB (24, as upstream), one SEND per message or per burst of messages
//!   given in one [`Flavored`] message (up to 256 KiB per SEND), inline when small, up to 3 SENDs
//!   in flight.
//! - UC (Apple's rule: a SEND and its receive span the same number of 4 KiB frames): receives of
//!   one 4 KiB frame (512), so every SEND is at most 4 KiB; a message is split across frames and
//!   only what is used is sent (no padding at all).
//! - Idle links send a credit-only frame now and then ([`Flavored::keepalive`]): it keeps Apple's
//!   queue pairs awake, returns credits, and reveals a lost last frame through its `seq`.

use std::collections::VecDeque;
use std::io;

use super::caps::Flavor;
use super::verbs::{wc_error, Verbs, Wc};
use super::Flavored;

pub const LEAN_MAGIC: u32 = u32::from_le_bytes(*b"LEAN");
pub const LEAN_HEADER: usize = 20;
/// Credits a data frame leaves for credit-only frames.
pub const RESERVE: usize = 2;

const TX_TAG: u64 = 1 << 41;
const RX_TAG: u64 = 1 << 42;
const SLOT_MASK: u64 = 0xffff_ffff;

/// Receive and send layout of a lean link (fixed per queue-pair type: both sides use the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Receives posted (= the peer's initial credits).
    pub rx_slots: usize,
    /// Size of one receive (and the largest SEND).
    pub rx_slot: usize,
    /// Send slots; the last one is reserved for credit-only frames.
    pub tx_slots: usize,
    pub tx_slot: usize,
    /// Re-posted receives that trigger a credit-only frame when no data frame carries them.
    pub return_at: usize,
}

impl Geometry {
    /// RC: 24 receives of 256 KiB (upstream's memory), 4 send slots of 256 KiB (QP: 4 send WRs).
    pub const RC: Geometry = Geometry {
        rx_slots: 24,
        rx_slot: 256 * 1024,
        tx_slots: 4,
        tx_slot: 256 * 1024,
        return_at: 12,
    };
    /// UC: 512 receives of one 4 KiB frame, 512 send slots (upstream's 2 × 2 MiB, 512 WRs).
    pub const UC: Geometry = Geometry {
        rx_slots: 512,
        rx_slot: 4096,
        tx_slots: 512,
        tx_slot: 4096,
        return_at: 128,
    };

    pub fn for_flavor(f: Flavor) -> Geometry {
        match f {
            Flavor::LinuxRc => Geometry::RC,
            Flavor::AppleUc => Geometry::UC,
        }
    }

    pub const fn tx_size(&self) -> usize {
        self.tx_slots * self.tx_slot
    }

    pub const fn rx_size(&self) -> usize {
        self.rx_slots * self.rx_slot
    }

    /// Payload bytes per full frame.
    pub const fn payload(&self) -> usize {
        self.tx_slot - LEAN_HEADER
    }
}

/// Frames sent and received, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeanStats {
    pub data_frames: u64,
    pub credit_frames: u64,
    pub inline_frames: u64,
    pub bytes_sent: u64,
    pub frames_received: u64,
}

/// The lean framing over a queue pair `V`.
pub struct LeanLink<V: Verbs> {
    v: V,
    g: Geometry,
    /// Data send slots not in use.
    free_tx: VecDeque<usize>,
    /// The credit-only slot is posted and not completed.
    ctrl_busy: bool,
    /// The frame being filled: (slot, payload bytes).
    open: Option<(usize, usize)>,
    /// Filled frames waiting for a credit: (slot, payload bytes).
    ready: VecDeque<(usize, usize)>,
    /// Checked frames not fully consumed: (slot, payload length, consumed).
    rx: VecDeque<(usize, usize, usize)>,
    /// Receives the peer has posted for us.
    credits: usize,
    /// Receives re-posted here and not yet reported to the peer.
    unreturned: usize,
    tx_seq: u32,
    rx_seq: u32,
    broken: Option<String>,
    wcs: Vec<Wc>,
    stats: LeanStats,
    recvs: u64,
}

impl<V: Verbs> LeanLink<V> {
    /// Wraps a queue pair whose send region holds `g.tx_size()` bytes and whose receive region
    /// `g.rx_size()`. Receives are posted by [`LeanLink::post_all_receives`].
    pub fn new(v: V, g: Geometry) -> LeanLink<V> {
        assert!(
            g.tx_slots >= 2
                && g.rx_slots > g.return_at + RESERVE
                && g.return_at >= 2
                && g.tx_slot > LEAN_HEADER
        );
        assert!(g.tx_slot <= g.rx_slot && g.rx_slots <= u16::MAX as usize);
        LeanLink {
            v,
            g,
            free_tx: (0..g.tx_slots - 1).collect(),
            ctrl_busy: false,
            open: None,
            ready: VecDeque::new(),
            rx: VecDeque::new(),
            credits: g.rx_slots,
            unreturned: 0,
            tx_seq: 0,
            rx_seq: 0,
            broken: None,
            wcs: Vec::new(),
            stats: LeanStats::default(),
            recvs: 0,
        }
    }

    /// Posts every receive (RC: before RTR; UC: after RTS, as Apple's provider requires).
    pub fn post_all_receives(&mut self) -> io::Result<()> {
        for slot in 0..self.g.rx_slots {
            self.repost(slot)?;
        }
        Ok(())
    }

    pub fn verbs(&mut self) -> &mut V {
        &mut self.v
    }

    pub fn geometry(&self) -> Geometry {
        self.g
    }

    /// Credits left toward the peer (its receives we may still fill).
    pub fn credits(&self) -> usize {
        self.credits
    }

    pub fn stats(&self) -> LeanStats {
        self.stats
    }

    fn repost(&mut self, slot: usize) -> io::Result<()> {
        self.v
            .post_recv(RX_TAG | slot as u64, slot * self.g.rx_slot, self.g.rx_slot)
    }

    fn check(&self) -> io::Result<()> {
        match &self.broken {
            Some(m) => Err(io::Error::new(io::ErrorKind::InvalidData, m.clone())),
            None => Ok(()),
        }
    }

    /// Marks the link broken: every later call fails with the same error.
    fn fail(&mut self, msg: String) -> io::Error {
        tracing::error!("{msg}");
        self.broken = Some(msg.clone());
        io::Error::new(io::ErrorKind::InvalidData, msg)
    }

    fn ctrl_slot(&self) -> usize {
        self.g.tx_slots - 1
    }

    /// Writes the header of the frame in `slot` and posts it.
    fn post_frame(&mut self, slot: usize, len: usize) -> io::Result<()> {
        debug_assert!(self.credits >= 1);
        let base = slot * self.g.tx_slot;
        let total = LEAN_HEADER + len;
        let returned = self.unreturned.min(u16::MAX as usize);
        let seq = self.tx_seq;
        let mem = self.v.send_mem();
        let frame = &mut mem[base..base + total];
        frame[0..4].copy_from_slice(&LEAN_MAGIC.to_le_bytes());
        frame[4..8].copy_from_slice(&seq.to_le_bytes());
        frame[8..12].copy_from_slice(&(len as u32).to_le_bytes());
        frame[12..14].copy_from_slice(&(returned as u16).to_le_bytes());
        frame[14..16].copy_from_slice(&0u16.to_le_bytes());
        let mut h = crc32fast::Hasher::new();
        h.update(&frame[..16]);
        h.update(&frame[LEAN_HEADER..]);
        frame[16..20].copy_from_slice(&h.finalize().to_le_bytes());
        let inline = total <= self.v.max_inline();
        if let Err(e) = self.v.post_send(TX_TAG | slot as u64, base, total, inline) {
            return Err(self.fail(format!("RDMA(lean): post_send failed: {e}")));
        }
        self.unreturned -= returned;
        self.credits -= 1;
        self.tx_seq = self.tx_seq.wrapping_add(1);
        self.stats.bytes_sent += total as u64;
        if inline {
            self.stats.inline_frames += 1;
        }
        if len == 0 {
            self.stats.credit_frames += 1;
        } else {
            self.stats.data_frames += 1;
        }
        Ok(())
    }

    /// Posts filled frames while credits beyond the reserve last.
    fn post_ready(&mut self) -> io::Result<()> {
        while self.credits > RESERVE {
            let Some((slot, len)) = self.ready.pop_front() else {
                break;
            };
            self.post_frame(slot, len)?;
        }
        Ok(())
    }

    /// Sends a credit-only frame if too many re-posted receives are unreported.
    fn return_credits(&mut self) -> io::Result<()> {
        if self.unreturned >= self.g.return_at && self.credits >= 1 && !self.ctrl_busy {
            self.ctrl_busy = true;
            self.post_frame(self.ctrl_slot(), 0)?;
        }
        Ok(())
    }

    /// Checks a received frame and queues its payload.
    fn on_receive(&mut self, wc: &Wc) -> io::Result<()> {
        let slot = (wc.wr_id & SLOT_MASK) as usize;
        if wc.wr_id & RX_TAG == 0 || slot >= self.g.rx_slots {
            return Err(self.fail(format!(
                "RDMA(lean): receive completion with unknown wr_id {:#x}",
                wc.wr_id
            )));
        }
        let n = wc.byte_len as usize;
        let expect = self.rx_seq;
        if n < LEAN_HEADER || n > self.g.rx_slot {
            return Err(self.fail(format!(
                "RDMA(lean): frame #{expect} has a bad length ({n} bytes)"
            )));
        }
        let base = slot * self.g.rx_slot;
        let f = &self.v.recv_mem()[base..base + n];
        let magic = u32::from_le_bytes([f[0], f[1], f[2], f[3]]);
        let seq = u32::from_le_bytes([f[4], f[5], f[6], f[7]]);
        let len = u32::from_le_bytes([f[8], f[9], f[10], f[11]]) as usize;
        let returned = u16::from_le_bytes([f[12], f[13]]) as usize;
        let crc = u32::from_le_bytes([f[16], f[17], f[18], f[19]]);
        let mut h = crc32fast::Hasher::new();
        h.update(&f[..16]);
        h.update(&f[LEAN_HEADER..]);
        let ok_crc = h.finalize() == crc;
        if magic != LEAN_MAGIC {
            return Err(self.fail(format!(
                "RDMA(lean): bad frame magic {magic:#010x} (frame #{expect})"
            )));
        }
        if !ok_crc {
            return Err(self.fail(format!("RDMA(lean): checksum mismatch in frame #{expect} ({n} bytes): corrupted on the wire")));
        }
        if LEAN_HEADER + len != n {
            return Err(self.fail(format!(
                "RDMA(lean): frame #{expect} says {len} payload bytes but {n} arrived"
            )));
        }
        if seq != expect {
            return Err(self.fail(format!(
                "RDMA(lean): frame lost: expected frame #{expect}, got #{seq} ({} frame(s) missing)",
                seq.wrapping_sub(expect)
            )));
        }
        self.rx_seq = expect.wrapping_add(1);
        self.credits += returned;
        if self.credits > self.g.rx_slots {
            return Err(self.fail(format!(
                "RDMA(lean): peer returned more credits than it has receives ({})",
                self.credits
            )));
        }
        self.recvs += 1;
        self.stats.frames_received += 1;
        if len == 0 {
            self.repost(slot)?;
            self.unreturned += 1;
        } else {
            self.rx.push_back((slot, len, 0));
        }
        Ok(())
    }

    /// Moves the open frame (if any bytes) to the ready queue.
    fn close_open(&mut self) {
        if let Some((slot, fill)) = self.open.take() {
            if fill > 0 {
                self.ready.push_back((slot, fill));
            } else {
                self.free_tx.push_front(slot);
            }
        }
    }
}

impl<V: Verbs> Flavored for LeanLink<V> {
    fn progress(&mut self) -> io::Result<bool> {
        self.check()?;
        self.wcs.clear();
        let mut wcs = std::mem::take(&mut self.wcs);
        if let Err(e) = self.v.poll(&mut wcs) {
            self.wcs = wcs;
            return Err(self.fail(format!("RDMA(lean): poll failed: {e}")));
        }
        let any = !wcs.is_empty();
        let mut r = Ok(());
        for wc in &wcs {
            if wc.error.is_some() {
                let e = wc_error(if wc.recv { "receive" } else { "send" }, wc);
                r = Err(self.fail(format!("RDMA(lean): {e}")));
                break;
            }
            if wc.recv {
                if let Err(e) = self.on_receive(wc) {
                    r = Err(e);
                    break;
                }
            } else {
                let slot = (wc.wr_id & SLOT_MASK) as usize;
                if wc.wr_id & TX_TAG == 0 || slot >= self.g.tx_slots {
                    r = Err(self.fail(format!(
                        "RDMA(lean): send completion with unknown wr_id {:#x}",
                        wc.wr_id
                    )));
                    break;
                }
                if slot == self.ctrl_slot() {
                    self.ctrl_busy = false;
                } else {
                    self.free_tx.push_back(slot);
                }
            }
        }
        self.wcs = wcs;
        r?;
        self.post_ready()?;
        self.return_credits()?;
        Ok(any)
    }

    fn read_available(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.check()?;
        let mut n = 0;
        let mut consumed_frames = false;
        while n < buf.len() {
            let Some(&mut (slot, len, ref mut consumed)) = self.rx.front_mut() else {
                break;
            };
            let take = (len - *consumed).min(buf.len() - n);
            let start = slot * self.g.rx_slot + LEAN_HEADER + *consumed;
            buf[n..n + take].copy_from_slice(&self.v.recv_mem()[start..start + take]);
            n += take;
            *consumed += take;
            if *consumed == len {
                self.rx.pop_front();
                self.repost(slot)?;
                self.unreturned += 1;
                consumed_frames = true;
            }
        }
        if n == 0 {
            // About to wait: nothing we hold may be what the peer waits for.
            self.close_open();
        }
        if consumed_frames || n == 0 {
            self.post_ready()?;
            self.return_credits()?;
        }
        Ok(n)
    }

    fn write_part(&mut self, part: &[u8]) -> io::Result<usize> {
        self.check()?;
        let cap = self.g.payload();
        let mut n = 0;
        while n < part.len() {
            let (slot, fill) = match self.open {
                Some(o) => o,
                None => match self.free_tx.pop_front() {
                    Some(s) => (s, 0),
                    None => break,
                },
            };
            let take = (cap - fill).min(part.len() - n);
            let start = slot * self.g.tx_slot + LEAN_HEADER + fill;
            self.v.send_mem()[start..start + take].copy_from_slice(&part[n..n + take]);
            n += take;
            if fill + take == cap {
                self.open = None;
                self.ready.push_back((slot, cap));
            } else {
                self.open = Some((slot, fill + take));
            }
        }
        self.post_ready()?;
        Ok(n)
    }

    fn end_message(&mut self) -> io::Result<()> {
        self.check()?;
        self.close_open();
        self.post_ready()
    }

    fn flushed(&self) -> bool {
        self.open.is_none() && self.ready.is_empty()
    }

    fn sends_pending(&self) -> bool {
        self.ctrl_busy || self.free_tx.len() < self.g.tx_slots - 1
    }

    fn arm(&mut self) -> io::Result<Option<rdma_verbs::CompChannel>> {
        self.v.arm()
    }

    fn counters(&self) -> (u64, u64) {
        (
            self.stats.data_frames + self.stats.credit_frames,
            self.recvs,
        )
    }

    /// A credit-only frame: keeps Apple's queue pairs awake, returns credits, and its `seq` tells
    /// the peer whether our last frame was lost. Never eats into the reserve.
    fn keepalive(&mut self) -> io::Result<bool> {
        self.check()?;
        if !self.flushed() || self.ctrl_busy || self.credits <= RESERVE {
            return Ok(false);
        }
        self.ctrl_busy = true;
        self.post_frame(self.ctrl_slot(), 0)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rdma::fake::{self, Rules};

    fn pair(g: Geometry, rules: Rules) -> (LeanLink<fake::FakeQp>, LeanLink<fake::FakeQp>) {
        let (a, b) = fake::pair(
            rules,
            g.tx_size(),
            g.rx_size(),
            if rules == Rules::Rc { 256 } else { 0 },
        );
        let mut a = LeanLink::new(a, g);
        let mut b = LeanLink::new(b, g);
        a.post_all_receives().unwrap();
        b.post_all_receives().unwrap();
        (a, b)
    }

    #[test]
    fn header_layout() {
        let (mut a, mut b) = pair(Geometry::UC, Rules::Uc);
        a.write_part(b"abc").unwrap();
        a.end_message().unwrap();
        assert!(a.flushed());
        assert!(b.progress().unwrap());
        let f = &b.verbs().recv_mem()[..LEAN_HEADER + 3];
        assert_eq!(&f[0..4], b"LEAN");
        assert_eq!(u32::from_le_bytes(f[4..8].try_into().unwrap()), 0);
        assert_eq!(u32::from_le_bytes(f[8..12].try_into().unwrap()), 3);
        let mut h = crc32fast::Hasher::new();
        h.update(&f[..16]);
        h.update(b"abc");
        assert_eq!(
            u32::from_le_bytes(f[16..20].try_into().unwrap()),
            h.finalize()
        );
        let mut out = [0u8; 3];
        assert_eq!(b.read_available(&mut out).unwrap(), 3);
        assert_eq!(&out, b"abc");
    }

    #[test]
    fn credits_are_returned_and_never_exceed_the_ring() {
        let g = Geometry::UC;
        let (mut a, mut b) = pair(g, Rules::Uc);
        // Fill almost every receive of b.
        let msg = vec![5u8; g.payload()];
        let mut frames = 0;
        while a.credits() > RESERVE {
            assert_eq!(a.write_part(&msg).unwrap(), msg.len());
            a.progress().unwrap();
            frames += 1;
        }
        assert_eq!(frames, g.rx_slots - RESERVE);
        // Blocked: the next full frame waits in the ready queue.
        a.write_part(&msg).unwrap();
        a.end_message().unwrap();
        assert!(!a.flushed());
        // b consumes; past `return_at` it sends a credit-only frame.
        let mut buf = vec![0u8; g.payload()];
        b.progress().unwrap();
        for _ in 0..g.return_at {
            assert_eq!(b.read_available(&mut buf).unwrap(), buf.len());
        }
        assert_eq!(b.stats().credit_frames, 1);
        a.progress().unwrap();
        assert!(a.flushed(), "credits came back: the waiting frame went out");
        assert_eq!(a.credits(), RESERVE + g.return_at - 1);
    }
}
