//! The 24-byte transport capability blob carried in HELLO, in upstream's two layouts.
//!
//! ```text
//! Linux RC : | u32 qpn | u32 psn = qpn & 0xffffff | u8 gid[16] |
//! Apple UC : | u32 qpn | u16 lid | u16 reserved=0 | u8 gid[16] |
//! ```
//! All-zero means "no RDMA". Stock peers treat any non-zero byte as an offer.
//!
//! # Lean marker (our peers only)
//!
//! Our own client and server negotiate the lean framing ([`super::lean`]) inside the same blob,
//! with a marker that is still a valid upstream offer of the same flavor, so a stock peer that
//! receives it simply speaks upstream's framing (and never sends the marker back):
//!
//! ```text
//! RC lean : | u32 qpn | u32 psn = lean_rc_psn(qpn) | gid |   psn = 0x800000 | ((qpn ^ 0x4C454E) & 0x7fffff)
//! UC lean : | u32 qpn | u16 lid | u16 0x4E4C ("LN") | gid |
//! ```
//!
//! - RC: a stock server accepts any psn (it becomes its `rq_psn`); the offering client then uses
//!   that psn as its `sq_psn` whether or not the reply is lean. The lean psn always differs from
//!   `qpn & 0xffffff` (its low 23 bits differ), so it is never a stock RC blob, and its bit 23 is
//!   set, so bytes 6..8 are non-zero: never a stock UC blob either.
//! - UC: a stock Apple peer ignores `reserved`. The marker is ≥ 0x100, so bytes 4..8 read as a
//!   psn exceed 24 bits: never an RC blob.
//!
//! A server replies with the marker only when it accepts the lean framing; a reply without it is
//! a stock peer (or one that declined), and the client speaks upstream's framing.

use std::net::{IpAddr, Ipv6Addr};

pub const CAPS_SIZE: usize = rpc_proto::CONN_CAPS_SIZE;

/// Upstream's two RDMA flavors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// `transport.cpp`: RoCE/InfiniBand, RC queue pair, one SEND per `send_data()` piece.
    LinuxRc,
    /// `transport-apple.cpp`: Thunderbolt, UC queue pair, 128 KiB strides, readiness byte.
    AppleUc,
}

impl Flavor {
    /// The flavor this platform's stock peers speak: Apple UC on macOS, Linux RC elsewhere
    /// (what a stock client offers; decides caps that fit both layouts).
    pub fn native() -> Flavor {
        if cfg!(target_os = "macos") {
            Flavor::AppleUc
        } else {
            Flavor::LinuxRc
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Flavor::LinuxRc => "RDMA/RC (Linux flavor)",
            Flavor::AppleUc => "RDMA/UC (Apple flavor)",
        }
    }
}

/// The `reserved` field of a UC blob offering (or accepting) the lean framing.
pub const LEAN_UC_MARK: u16 = u16::from_le_bytes(*b"LN");
const LEAN_RC_XOR: u32 = 0x4C_454E;

/// The psn an RC blob carries to offer (or accept) the lean framing: never `qpn & 0xffffff`,
/// always 24 bits with bit 23 set.
pub const fn lean_rc_psn(qpn: u32) -> u32 {
    0x80_0000 | ((qpn ^ LEAN_RC_XOR) & 0x7f_ffff)
}

/// A decoded RDMA offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub flavor: Flavor,
    pub qpn: u32,
    /// RC: the packet sequence number (upstream: `qpn & 0xffffff`; lean: [`lean_rc_psn`]); UC: 0.
    pub psn: u32,
    /// UC: the port LID; RC: 0.
    pub lid: u16,
    pub gid: [u8; 16],
    /// Carries the lean marker: an offer (client) or an acceptance (server) of the lean framing.
    pub lean: bool,
}

impl Caps {
    pub fn rc(qpn: u32, gid: [u8; 16]) -> Caps {
        Caps {
            flavor: Flavor::LinuxRc,
            qpn,
            psn: qpn & 0xff_ffff,
            lid: 0,
            gid,
            lean: false,
        }
    }

    pub fn uc(qpn: u32, lid: u16, gid: [u8; 16]) -> Caps {
        Caps {
            flavor: Flavor::AppleUc,
            qpn,
            psn: 0,
            lid,
            gid,
            lean: false,
        }
    }

    /// An RC blob with the lean marker (psn = [`lean_rc_psn`]).
    pub fn rc_lean(qpn: u32, gid: [u8; 16]) -> Caps {
        Caps {
            flavor: Flavor::LinuxRc,
            qpn,
            psn: lean_rc_psn(qpn),
            lid: 0,
            gid,
            lean: true,
        }
    }

    /// A UC blob with the lean marker (`reserved` = [`LEAN_UC_MARK`]).
    pub fn uc_lean(qpn: u32, lid: u16, gid: [u8; 16]) -> Caps {
        Caps {
            flavor: Flavor::AppleUc,
            qpn,
            psn: 0,
            lid,
            gid,
            lean: true,
        }
    }

    /// The same queue pair with the lean marker added (`true`) or removed.
    pub fn with_lean(self, lean: bool) -> Caps {
        match (self.flavor, lean) {
            (Flavor::LinuxRc, true) => Caps::rc_lean(self.qpn, self.gid),
            (Flavor::LinuxRc, false) => Caps::rc(self.qpn, self.gid),
            (Flavor::AppleUc, true) => Caps::uc_lean(self.qpn, self.lid, self.gid),
            (Flavor::AppleUc, false) => Caps::uc(self.qpn, self.lid, self.gid),
        }
    }

    pub fn encode(&self) -> [u8; CAPS_SIZE] {
        let mut b = [0u8; CAPS_SIZE];
        b[0..4].copy_from_slice(&self.qpn.to_le_bytes());
        match self.flavor {
            Flavor::LinuxRc => b[4..8].copy_from_slice(&self.psn.to_le_bytes()),
            Flavor::AppleUc => {
                b[4..6].copy_from_slice(&self.lid.to_le_bytes());
                if self.lean {
                    b[6..8].copy_from_slice(&LEAN_UC_MARK.to_le_bytes());
                }
            }
        }
        b[8..24].copy_from_slice(&self.gid);
        b
    }

    /// Decodes a peer's blob. `None` for "no RDMA" (all zero) and for blobs that fit neither
    /// layout. The layouts are told apart by bytes 4..8: RC carries `qpn & 0xffffff` there, UC
    /// `lid, 0`. Apple's LID is 0 in practice, which no RC blob can carry (its psn is the non-zero
    /// QPN). When both readings fit (an RC QPN below 2^16 reads as a UC LID equal to the QPN),
    /// `prefer` (the platform's native flavor) decides. Blobs with the lean marker (see the
    /// module docs) decode with `lean` set; they fit exactly one layout, whatever `prefer` says.
    pub fn decode(b: &[u8; CAPS_SIZE], prefer: Flavor) -> Option<Caps> {
        if b.iter().all(|&x| x == 0) {
            return None;
        }
        let qpn = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let word = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        let lid = u16::from_le_bytes([b[4], b[5]]);
        let reserved = u16::from_le_bytes([b[6], b[7]]);
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[8..24]);
        if qpn == 0 || qpn > 0xff_ffff {
            return None;
        }
        if reserved == LEAN_UC_MARK {
            return Some(Caps::uc_lean(qpn, lid, gid));
        }
        if word == lean_rc_psn(qpn) {
            return Some(Caps::rc_lean(qpn, gid));
        }
        let rc_fits = word == qpn & 0xff_ffff;
        let uc_fits = reserved == 0;
        match (rc_fits, uc_fits) {
            (true, true) if prefer == Flavor::AppleUc => Some(Caps::uc(qpn, lid, gid)),
            (true, _) => Some(Caps::rc(qpn, gid)),
            (false, true) => Some(Caps::uc(qpn, lid, gid)),
            (false, false) => None,
        }
    }
}

/// The GID upstream looks for: the TCP socket's local address, IPv4 as `::ffff:a.b.c.d`.
pub fn gid_for_ip(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Human-readable GID (`::ffff:10.77.0.1`).
pub fn gid_to_string(gid: &[u8; 16]) -> String {
    let v6 = Ipv6Addr::from(*gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => format!("::ffff:{v4}"),
        None => v6.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_caps_mean_tcp() {
        assert_eq!(Caps::decode(&[0; 24], Flavor::LinuxRc), None);
    }

    #[test]
    fn rc_round_trips_and_is_recognized() {
        let gid = gid_for_ip("10.77.0.1".parse().unwrap());
        let c = Caps::rc(0x1234, gid);
        let b = c.encode();
        assert_eq!(&b[4..8], &0x1234u32.to_le_bytes());
        assert_eq!(Caps::decode(&b, Flavor::LinuxRc), Some(c));
        // A QPN above 16 bits cannot be read as a UC blob: RC whatever the preference.
        let c = Caps::rc(0x12_3456, gid);
        assert_eq!(Caps::decode(&c.encode(), Flavor::AppleUc), Some(c));
    }

    #[test]
    fn uc_round_trips_and_is_recognized() {
        let gid = gid_for_ip("169.254.1.2".parse().unwrap());
        let c = Caps::uc(17, 0, gid);
        let b = c.encode();
        assert_eq!(&b[4..8], &[0, 0, 0, 0]);
        assert_eq!(Caps::decode(&b, Flavor::LinuxRc), Some(c));
    }

    #[test]
    fn ambiguous_blob_follows_preference() {
        // UC with lid == qpn looks like RC too.
        let b = Caps::uc(5, 5, [1; 16]).encode();
        assert_eq!(
            Caps::decode(&b, Flavor::AppleUc).unwrap().flavor,
            Flavor::AppleUc
        );
        assert_eq!(
            Caps::decode(&b, Flavor::LinuxRc).unwrap().flavor,
            Flavor::LinuxRc
        );
    }

    #[test]
    fn garbage_is_not_an_offer() {
        let mut b = [0xffu8; 24];
        assert_eq!(Caps::decode(&b, Flavor::LinuxRc), None); // qpn > 24 bits
        b[0..4].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(Caps::decode(&b, Flavor::LinuxRc), None); // bytes 4..8 fit neither layout
    }

    #[test]
    fn lean_markers_round_trip_and_keep_their_flavor() {
        let gid = gid_for_ip("10.77.0.1".parse().unwrap());
        for qpn in [
            1u32, 17, 18, 0xffff, 0x1_0000, 0x4C_454E, 0x80_0000, 0xCC_454E, 0xff_ffff,
        ] {
            for prefer in [Flavor::LinuxRc, Flavor::AppleUc] {
                let rc = Caps::rc_lean(qpn, gid);
                assert_eq!(Caps::decode(&rc.encode(), prefer), Some(rc), "qpn {qpn:#x}");
                for lid in [0u16, 1, qpn as u16, 0xffff] {
                    let uc = Caps::uc_lean(qpn, lid, gid);
                    assert_eq!(
                        Caps::decode(&uc.encode(), prefer),
                        Some(uc),
                        "qpn {qpn:#x} lid {lid}"
                    );
                }
            }
        }
    }

    #[test]
    fn lean_rc_psn_is_never_upstream_and_never_reads_as_uc() {
        // Exhaustive over every 24-bit QPN: the marker psn differs from upstream's, is a valid
        // 24-bit psn for a stock server, and its upper 16 bits (UC `reserved`) are neither 0
        // (stock UC) nor the UC marker.
        for qpn in 1..=0xff_ffffu32 {
            let psn = lean_rc_psn(qpn);
            assert_ne!(psn, qpn & 0xff_ffff);
            assert!(psn <= 0xff_ffff);
            let reserved = (psn >> 16) as u16;
            assert_ne!(reserved, 0);
            assert_ne!(reserved, LEAN_UC_MARK);
        }
    }

    #[test]
    fn stock_blobs_never_carry_the_marker() {
        let gid = [7u8; 16];
        for qpn in [1u32, 17, 0xfffe, 0x1_0000, 0x12_3456, 0xff_ffff] {
            for prefer in [Flavor::LinuxRc, Flavor::AppleUc] {
                let d = Caps::decode(&Caps::rc(qpn, gid).encode(), prefer).unwrap();
                assert!(!d.lean, "stock RC qpn {qpn:#x}");
                for lid in [0u16, 1, 0xffff] {
                    let d = Caps::decode(&Caps::uc(qpn, lid, gid).encode(), prefer).unwrap();
                    assert!(!d.lean, "stock UC qpn {qpn:#x} lid {lid}");
                }
            }
        }
        // What a stock RC server does with our lean offer: it answers its own blob, which
        // decodes as stock RC (no marker).
        let reply = Caps::rc(18, gid).encode();
        assert_eq!(
            Caps::decode(&reply, Flavor::LinuxRc),
            Some(Caps::rc(18, gid))
        );
    }

    #[test]
    fn lean_blobs_are_valid_upstream_offers() {
        let gid = [9u8; 16];
        // RC: a stock server reads qpn, psn (any value: its rq_psn) and gid.
        let b = Caps::rc_lean(0x1234, gid).encode();
        assert_eq!(u32::from_le_bytes(b[0..4].try_into().unwrap()), 0x1234);
        assert_eq!(
            u32::from_le_bytes(b[4..8].try_into().unwrap()),
            lean_rc_psn(0x1234)
        );
        assert_eq!(&b[8..], &gid);
        // UC: a stock Apple peer reads qpn, lid and gid; the marker is in the ignored field.
        let b = Caps::uc_lean(0x1234, 3, gid).encode();
        assert_eq!(u16::from_le_bytes([b[4], b[5]]), 3);
        assert_eq!(&b[6..8], b"LN");
        assert_eq!(
            Caps::uc_lean(0x1234, 3, gid).with_lean(false).encode(),
            Caps::uc(0x1234, 3, gid).encode()
        );
        assert_eq!(Caps::rc(5, gid).with_lean(true), Caps::rc_lean(5, gid));
    }

    #[test]
    fn gid_strings() {
        assert_eq!(
            gid_to_string(&gid_for_ip("10.77.0.1".parse().unwrap())),
            "::ffff:10.77.0.1"
        );
    }
}
