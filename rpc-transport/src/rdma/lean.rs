//! The lean framing between our own peers (negotiated with the caps marker, see [`super::caps`]),
//! over an RC or a UC queue pair.
//!
//! A byte stream cut into frames, one frame per SEND:
//!
//! ```text
//! | u32 magic "LEAN" | u32 seq | u32 len | u16 credits | u16 flags | u32 crc32 | payload[len] |
//! ```
//!
//! - `seq` counts frames per direction from 0; `crc32` (IEEE, `crc32fast`) covers the first 16
//!   header bytes and the payload. A SEND whose length is not `20 + len`, a bad magic, a checksum
//!   mismatch, unknown flags or a sequence gap (a frame lost on UC) **fails the connection**: a
//!   frame is checked whole before any of its bytes is handed out, so corrupt data is never
//!   delivered.
//! - **Checksums only where the queue pair needs them** (`flags`): over RC every side sets
//!   [`FLAG_UNCHECKED_OK`] in each frame it sends ("I take frames without a checksum"); once a
//!   frame carrying it has arrived, the other side sends [`FLAG_UNCHECKED`] frames (crc32 field 0,
//!   not computed nor checked). RC already delivers every message whole, in order and checked:
//!   each packet carries the fabric's 32-bit ICRC, which the responder verifies, and a bad or lost
//!   packet is retransmitted before the receive completes. Our own crc32 on top only costs a pass
//!   over every payload on both sides (and buys no security: it is not a MAC). Over UC, where a
//!   frame can be lost or cut short and nothing retransmits, every frame keeps its checksum, and an
//!   unchecked frame fails the connection. A peer built before the flags existed never sets
//!   [`FLAG_UNCHECKED_OK`], so it keeps receiving checksummed frames (it ignores flags it does not
//!   know, covered by the checksum).
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
/// Flags: the sender takes frames without a checksum (set by RC links only).
pub const FLAG_UNCHECKED_OK: u16 = 1;
/// Flags: this frame's crc32 field is 0 and not checked (sent over RC only, to a peer that set
/// [`FLAG_UNCHECKED_OK`]).
pub const FLAG_UNCHECKED: u16 = 2;
const KNOWN_FLAGS: u16 = FLAG_UNCHECKED_OK | FLAG_UNCHECKED;

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
    /// The queue pair delivers every message whole and in order, checked by the fabric (RC):
    /// frames may go without our own checksum (see the module docs).
    pub reliable: bool,
}

impl Geometry {
    /// RC: 24 receives of 256 KiB (upstream's memory), 4 send slots of 256 KiB (QP: 4 send WRs).
    pub const RC: Geometry = Geometry {
        rx_slots: 24,
        rx_slot: 256 * 1024,
        tx_slots: 4,
        tx_slot: 256 * 1024,
        return_at: 12,
        reliable: true,
    };
    /// UC: 512 receives of one 4 KiB frame, 512 send slots (upstream's 2 × 2 MiB, 512 WRs).
    pub const UC: Geometry = Geometry {
        rx_slots: 512,
        rx_slot: 4096,
        tx_slots: 512,
        tx_slot: 4096,
        return_at: 128,
        reliable: false,
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
    /// Frames sent without a checksum ([`FLAG_UNCHECKED`]).
    pub unchecked_frames: u64,
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
    /// A frame from the peer carried [`FLAG_UNCHECKED_OK`] (and this link is reliable).
    peer_takes_unchecked: bool,
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
            peer_takes_unchecked: false,
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
        let flags = self.send_flags();
        let mem = self.v.send_mem();
        let frame = &mut mem[base..base + total];
        frame[0..4].copy_from_slice(&LEAN_MAGIC.to_le_bytes());
        frame[4..8].copy_from_slice(&seq.to_le_bytes());
        frame[8..12].copy_from_slice(&(len as u32).to_le_bytes());
        frame[12..14].copy_from_slice(&(returned as u16).to_le_bytes());
        frame[14..16].copy_from_slice(&flags.to_le_bytes());
        let crc = if flags & FLAG_UNCHECKED != 0 {
            self.stats.unchecked_frames += 1;
            0
        } else {
            frame_crc(frame)
        };
        frame[16..20].copy_from_slice(&crc.to_le_bytes());
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

    /// The flags of the next frame: over RC, that we take unchecked frames, and whether this one
    /// is unchecked (once the peer said it takes them).
    fn send_flags(&self) -> u16 {
        match (self.g.reliable, self.peer_takes_unchecked) {
            (false, _) => 0,
            (true, false) => FLAG_UNCHECKED_OK,
            (true, true) => FLAG_UNCHECKED_OK | FLAG_UNCHECKED,
        }
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
        let flags = u16::from_le_bytes([f[14], f[15]]);
        let crc = u32::from_le_bytes([f[16], f[17], f[18], f[19]]);
        let unchecked = flags & FLAG_UNCHECKED != 0;
        let ok_crc = unchecked || frame_crc(f) == crc;
        if magic != LEAN_MAGIC {
            return Err(self.fail(format!(
                "RDMA(lean): bad frame magic {magic:#010x} (frame #{expect})"
            )));
        }
        if !ok_crc {
            return Err(self.fail(format!("RDMA(lean): checksum mismatch in frame #{expect} ({n} bytes): corrupted on the wire")));
        }
        if flags & !KNOWN_FLAGS != 0 {
            return Err(self.fail(format!(
                "RDMA(lean): frame #{expect} has unknown flags {flags:#06x}"
            )));
        }
        // Unchecked frames: RC only, and only once we have said (in a frame sent) that we take them.
        let invited = self.g.reliable && self.stats.bytes_sent > 0;
        if unchecked && !(invited && flags & FLAG_UNCHECKED_OK != 0) {
            return Err(self.fail(format!(
                "RDMA(lean): frame #{expect} has no checksum, which only an RC link that offered it may receive"
            )));
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
        self.peer_takes_unchecked |= self.g.reliable && flags & FLAG_UNCHECKED_OK != 0;
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

/// crc32 of a frame's first 16 header bytes and its payload.
fn frame_crc(frame: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&frame[..16]);
    h.update(&frame[LEAN_HEADER..]);
    h.finalize()
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

    /// One message from `from` to `to`, read back whole.
    fn carry(
        from: &mut LeanLink<fake::FakeQp>,
        to: &mut LeanLink<fake::FakeQp>,
        msg: &[u8],
    ) -> io::Result<Vec<u8>> {
        assert_eq!(from.write_part(msg)?, msg.len());
        from.end_message()?;
        let mut got = vec![0u8; msg.len()];
        let mut n = 0;
        for _ in 0..1000 {
            from.progress()?;
            to.progress()?;
            n += to.read_available(&mut got[n..])?;
            if n == msg.len() {
                return Ok(got);
            }
        }
        panic!("message not delivered ({n} of {} bytes)", msg.len());
    }

    fn flags_of(link: &mut LeanLink<fake::FakeQp>) -> (u16, u32) {
        let f = &link.verbs().recv_mem()[..LEAN_HEADER];
        (
            u16::from_le_bytes([f[14], f[15]]),
            u32::from_le_bytes([f[16], f[17], f[18], f[19]]),
        )
    }

    #[test]
    fn rc_drops_the_checksum_once_the_peer_takes_it_and_uc_never_does() {
        let msg: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + 3) as u8).collect();
        let (mut a, mut b) = pair(Geometry::RC, Rules::Rc);
        // a has heard nothing from b yet: its first frame is checksummed, and offers.
        assert_eq!(carry(&mut a, &mut b, &msg).unwrap(), msg);
        let (flags, crc) = flags_of(&mut b);
        assert_eq!(flags, FLAG_UNCHECKED_OK);
        assert_ne!(crc, 0);
        assert_eq!(a.stats().unchecked_frames, 0);
        // b heard a's offer: its frames go without a checksum.
        assert_eq!(carry(&mut b, &mut a, &msg).unwrap(), msg);
        let (flags, crc) = flags_of(&mut a);
        assert_eq!(flags, FLAG_UNCHECKED_OK | FLAG_UNCHECKED);
        assert_eq!(crc, 0);
        assert_eq!(b.stats().unchecked_frames, 1);
        // And a's next ones too, intact.
        assert_eq!(carry(&mut a, &mut b, &msg).unwrap(), msg);
        assert_eq!(a.stats().unchecked_frames, 1);

        let msg = &msg[..3000];
        let (mut a, mut b) = pair(Geometry::UC, Rules::Uc);
        for _ in 0..3 {
            assert_eq!(carry(&mut a, &mut b, msg).unwrap(), msg);
            assert_eq!(flags_of(&mut b).0, 0);
            assert_eq!(carry(&mut b, &mut a, msg).unwrap(), msg);
            assert_eq!(flags_of(&mut a).0, 0);
        }
        assert_eq!(a.stats().unchecked_frames + b.stats().unchecked_frames, 0);
    }

    #[test]
    fn an_unchecked_frame_where_none_was_offered_fails_the_link() {
        // Over UC (a peer that skips the checksum anyway), and over RC before this side offered.
        for (g, rules, sent_first) in [
            (Geometry::UC, Rules::Uc, true),
            (Geometry::RC, Rules::Rc, false),
        ] {
            let (mut a, mut b) = pair(g, rules);
            if sent_first {
                carry(&mut b, &mut a, b"hi").unwrap();
            }
            a.peer_takes_unchecked = true;
            a.g.reliable = true;
            let e = carry(&mut a, &mut b, b"no checksum here").unwrap_err();
            assert!(e.to_string().contains("has no checksum"), "{rules:?}: {e}");
            assert_eq!(
                b.read_available(&mut [0u8; 16]).unwrap_err().kind(),
                io::ErrorKind::InvalidData
            );
        }
    }

    #[test]
    fn unknown_flags_fail_the_link() {
        let (mut a, mut b) = pair(Geometry::RC, Rules::Rc);
        // A well-formed frame #0 with one payload byte, but an unknown flag, posted by hand.
        let f = &mut a.verbs().send_mem()[..LEAN_HEADER + 1];
        f[0..4].copy_from_slice(&LEAN_MAGIC.to_le_bytes());
        f[4..8].copy_from_slice(&0u32.to_le_bytes());
        f[8..12].copy_from_slice(&1u32.to_le_bytes());
        f[12..14].copy_from_slice(&0u16.to_le_bytes());
        f[14..16].copy_from_slice(&0x80u16.to_le_bytes());
        f[LEAN_HEADER] = b'x';
        let crc = frame_crc(f);
        f[16..20].copy_from_slice(&crc.to_le_bytes());
        a.verbs()
            .post_send(TX_TAG, 0, LEAN_HEADER + 1, false)
            .unwrap();
        let mut e = None;
        for _ in 0..100 {
            if let Err(err) = b.progress() {
                e = Some(err);
                break;
            }
        }
        let e = e.expect("the frame arrived");
        assert!(e.to_string().contains("unknown flags"), "{e}");
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
