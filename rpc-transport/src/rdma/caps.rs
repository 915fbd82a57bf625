//! The 24-byte transport capability blob carried in HELLO, in upstream's two layouts.
//!
//! ```text
//! Linux RC : | u32 qpn | u32 psn = qpn & 0xffffff | u8 gid[16] |
//! Apple UC : | u32 qpn | u16 lid | u16 reserved=0 | u8 gid[16] |
//! ```
//! All-zero means "no RDMA". Stock peers treat any non-zero byte as an offer.

use std::net::{IpAddr, Ipv6Addr};

pub const CAPS_SIZE: usize = 24;

/// Upstream's two RDMA flavors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// `transport.cpp`: RoCE/InfiniBand, RC queue pair, one SEND per `send_data()` piece.
    LinuxRc,
    /// `transport-apple.cpp`: Thunderbolt, UC queue pair, 128 KiB strides, readiness byte.
    AppleUc,
}

impl Flavor {
    pub fn name(self) -> &'static str {
        match self {
            Flavor::LinuxRc => "RDMA/RC (Linux flavor)",
            Flavor::AppleUc => "RDMA/UC (Apple flavor)",
        }
    }
}

/// A decoded RDMA offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    pub flavor: Flavor,
    pub qpn: u32,
    /// RC: the packet sequence number (upstream: `qpn & 0xffffff`); UC: 0.
    pub psn: u32,
    /// UC: the port LID; RC: 0.
    pub lid: u16,
    pub gid: [u8; 16],
}

impl Caps {
    pub fn rc(qpn: u32, gid: [u8; 16]) -> Caps {
        Caps { flavor: Flavor::LinuxRc, qpn, psn: qpn & 0xff_ffff, lid: 0, gid }
    }

    pub fn uc(qpn: u32, lid: u16, gid: [u8; 16]) -> Caps {
        Caps { flavor: Flavor::AppleUc, qpn, psn: 0, lid, gid }
    }

    pub fn encode(&self) -> [u8; CAPS_SIZE] {
        let mut b = [0u8; CAPS_SIZE];
        b[0..4].copy_from_slice(&self.qpn.to_le_bytes());
        match self.flavor {
            Flavor::LinuxRc => b[4..8].copy_from_slice(&self.psn.to_le_bytes()),
            Flavor::AppleUc => b[4..6].copy_from_slice(&self.lid.to_le_bytes()),
        }
        b[8..24].copy_from_slice(&self.gid);
        b
    }

    /// Decodes a peer's blob. `None` for "no RDMA" (all zero) and for blobs that fit neither
    /// layout. The layouts are told apart by bytes 4..8: RC carries `qpn & 0xffffff` there, UC
    /// `lid, 0`. Apple's LID is 0 in practice, which no RC blob can carry (its psn is the non-zero
    /// QPN). When both readings fit (an RC QPN below 2^16 reads as a UC LID equal to the QPN),
    /// `prefer` (the platform's native flavor) decides.
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
        assert_eq!(Caps::decode(&b, Flavor::AppleUc).unwrap().flavor, Flavor::AppleUc);
        assert_eq!(Caps::decode(&b, Flavor::LinuxRc).unwrap().flavor, Flavor::LinuxRc);
    }

    #[test]
    fn garbage_is_not_an_offer() {
        let mut b = [0xffu8; 24];
        assert_eq!(Caps::decode(&b, Flavor::LinuxRc), None); // qpn > 24 bits
        b[0..4].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(Caps::decode(&b, Flavor::LinuxRc), None); // bytes 4..8 fit neither layout
    }

    #[test]
    fn gid_strings() {
        assert_eq!(gid_to_string(&gid_for_ip("10.77.0.1".parse().unwrap())), "::ffff:10.77.0.1");
    }
}
