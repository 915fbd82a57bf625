//! What one flushed message costs on the wire under each RDMA framing: SENDs, packets at a given
//! MTU, and bytes. Sans-IO arithmetic over the framing rules of [`super::rc`], [`super::uc`] and
//! [`super::lean`] (their constants, not copies of them); `rpc-bench` applies it to the traffic it
//! captures from a real llama.cpp client, and `tests/wire_cost.rs` checks it against the framings
//! themselves running on the fake fabric.
//!
//! A *message* is what a sender hands over before it flushes: a stock request is the parts
//! `cmd (1) | size (8) | payload`, a response `size (8) | payload`; with the lean framing a peer of
//! ours may flush several requests as one burst.
//!
//! The lean framing's credit-only frames are counted as an upper bound: the receiver of a message
//! of `F` frames returns credits in at most `F / return_at` credit-only frames (fewer when it
//! consumes many frames in one read; none when its own next message carries them, which is the
//! case for every message shorter than [`Geometry::return_at`] frames). UC keepalives on idle
//! links are not modelled.

use super::lean::{Geometry, LEAN_HEADER};
use super::rc::RC_CHUNK;
use super::uc::{UC_PAYLOAD, UC_STRIDE};

/// A framing of the byte stream into SENDs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framing {
    /// Upstream's Linux flavor: every `send_data()` part is its own SEND (≤ 256 KiB each).
    UpstreamRc,
    /// Upstream's Apple flavor: every flush posts whole 128 KiB strides.
    AppleUc,
    /// Ours over RC: one SEND per message or burst (≤ 256 KiB each).
    LeanRc,
    /// Ours over UC: 4 KiB frames, only what is used is sent.
    LeanUc,
}

impl Framing {
    pub const ALL: [Framing; 4] = [
        Framing::UpstreamRc,
        Framing::AppleUc,
        Framing::LeanRc,
        Framing::LeanUc,
    ];

    /// Short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Framing::UpstreamRc => "upstream RC (Linux)",
            Framing::AppleUc => "upstream UC (Apple)",
            Framing::LeanRc => "lean RC (ours)",
            Framing::LeanUc => "lean UC (ours)",
        }
    }

    /// True for the framings only our own peers speak.
    pub fn is_lean(self) -> bool {
        matches!(self, Framing::LeanRc | Framing::LeanUc)
    }

    /// The cost of one flushed message made of `parts` (byte lengths of upstream's `send_data()`
    /// calls; only [`Framing::UpstreamRc`] cares about the boundaries) on a link with this MTU.
    pub fn message(self, parts: &[usize], mtu: usize) -> WireCost {
        // Closed forms (a length field from the network can be huge: no loop per chunk).
        let total = parts.iter().fold(0usize, |a, &p| a.saturating_add(p));
        let mut c = WireCost::default();
        match self {
            Framing::UpstreamRc => {
                for &p in parts {
                    c.sends_of(p / RC_CHUNK, RC_CHUNK, mtu);
                    c.sends_of(usize::from(p % RC_CHUNK > 0), p % RC_CHUNK, mtu);
                }
            }
            Framing::AppleUc => c.sends_of(total.div_ceil(UC_PAYLOAD), UC_STRIDE, mtu),
            Framing::LeanRc | Framing::LeanUc => {
                let g = if self == Framing::LeanRc {
                    Geometry::RC
                } else {
                    Geometry::UC
                };
                let cap = g.payload();
                let (full, rest) = (total / cap, total % cap);
                c.sends_of(full, LEAN_HEADER + cap, mtu);
                c.sends_of(usize::from(rest > 0), LEAN_HEADER + rest, mtu);
                // The receiver's credit-only frames (upper bound, see the module docs).
                let credit = (full + usize::from(rest > 0)) / g.return_at;
                c.sends_of(credit, LEAN_HEADER, mtu);
                c.credit_sends += credit as u64;
            }
        }
        c
    }
}

/// SENDs, packets and bytes on the wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireCost {
    /// Every SEND, by either side (a lean receiver's credit-only frames included).
    pub sends: u64,
    pub packets: u64,
    pub bytes: u64,
    /// Of `sends`: lean credit-only frames (an upper bound).
    pub credit_sends: u64,
}

impl WireCost {
    /// `n` SENDs of `len` bytes each.
    fn sends_of(&mut self, n: usize, len: usize, mtu: usize) {
        let n = n as u64;
        self.sends = self.sends.saturating_add(n);
        self.packets = self
            .packets
            .saturating_add(n.saturating_mul(packets(len, mtu)));
        self.bytes = self.bytes.saturating_add(n.saturating_mul(len as u64));
    }

    pub fn plus(self, o: WireCost) -> WireCost {
        WireCost {
            sends: self.sends + o.sends,
            packets: self.packets + o.packets,
            bytes: self.bytes + o.bytes,
            credit_sends: self.credit_sends + o.credit_sends,
        }
    }

    /// `self - earlier`, saturating (counters only grow).
    pub fn since(self, earlier: WireCost) -> WireCost {
        WireCost {
            sends: self.sends.saturating_sub(earlier.sends),
            packets: self.packets.saturating_sub(earlier.packets),
            bytes: self.bytes.saturating_sub(earlier.bytes),
            credit_sends: self.credit_sends.saturating_sub(earlier.credit_sends),
        }
    }
}

/// Packets of one SEND of `len` bytes on a link with this MTU: RoCE/IB segment a message into
/// MTU-sized packets, and an empty SEND is still one packet. `mtu` 0 is treated as 1.
pub fn packets(len: usize, mtu: usize) -> u64 {
    len.div_ceil(mtu.max(1)).max(1) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_rc_sends_every_part() {
        // A stock SET_TENSOR of 4000 bytes: cmd, size, payload.
        let c = Framing::UpstreamRc.message(&[1, 8, 4000], 1024);
        assert_eq!(
            c,
            WireCost {
                sends: 3,
                packets: 1 + 1 + 4,
                bytes: 4009,
                credit_sends: 0
            }
        );
        // An empty payload is no SEND; a 600 KiB part is three.
        let c = Framing::UpstreamRc.message(&[1, 8, 0], 4096);
        assert_eq!(c.sends, 2);
        assert_eq!(Framing::UpstreamRc.message(&[600 * 1024], 4096).sends, 3);
    }

    #[test]
    fn apple_uc_posts_whole_strides() {
        let c = Framing::AppleUc.message(&[8, 16], 1024);
        assert_eq!(
            c,
            WireCost {
                sends: 1,
                packets: 128,
                bytes: 128 * 1024,
                credit_sends: 0
            }
        );
        assert_eq!(Framing::AppleUc.message(&[UC_PAYLOAD], 4096).sends, 1);
        assert_eq!(Framing::AppleUc.message(&[UC_PAYLOAD + 1], 4096).sends, 2);
        assert_eq!(Framing::AppleUc.message(&[], 4096).sends, 0);
    }

    #[test]
    fn lean_sends_what_is_used() {
        let c = Framing::LeanRc.message(&[1, 8, 4000, 1, 8, 0], 1024);
        assert_eq!(
            c,
            WireCost {
                sends: 1,
                packets: 4,
                bytes: 20 + 4018,
                credit_sends: 0
            }
        );
        let c = Framing::LeanUc.message(&[1, 8, 4000], 4096);
        // 4009 bytes fit one 4076-byte frame payload.
        assert_eq!(
            c,
            WireCost {
                sends: 1,
                packets: 1,
                bytes: 4029,
                credit_sends: 0
            }
        );
        let c = Framing::LeanUc.message(&[10_000], 4096);
        assert_eq!(c.sends, 3);
        assert_eq!(c.bytes, 10_000 + 3 * 20);
        // 1 MiB over UC: 258 data frames; the receiver returns credits at most twice.
        let c = Framing::LeanUc.message(&[1 << 20], 4096);
        assert_eq!((c.sends, c.credit_sends), (258 + 2, 2));
    }

    #[test]
    fn absurd_lengths_do_not_loop_or_overflow() {
        for f in Framing::ALL {
            let c = f.message(&[usize::MAX, usize::MAX, 1], 1);
            assert!(c.sends > 0 && c.packets > 0, "{}", f.name());
        }
    }

    #[test]
    fn packet_rounding() {
        assert_eq!(packets(0, 1024), 1);
        assert_eq!(packets(1024, 1024), 1);
        assert_eq!(packets(1025, 1024), 2);
        assert_eq!(packets(5, 0), 5);
    }
}
