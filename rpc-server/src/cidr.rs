//! Address blocks (`--allow`, `--comm-peers`, `--peer-share-exempt`): `ADDR/PREFIX` or a
//! bare address, IPv4-mapped IPv6 addresses matched as the IPv4 address they carry; and port
//! ranges (`--comm-peer-ports`): `LO-HI` or one port.

use std::net::IpAddr;
use std::str::FromStr;

/// An address block, `ADDR/PREFIX` or a bare address (one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    net: IpAddr,
    prefix: u8,
}

/// Why a `--allow` entry does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CidrError {
    #[error("`{0}` is not an IP address (expected e.g. 192.168.2.0/24, fe80::/10 or 10.0.0.7)")]
    Address(String),
    #[error("prefix length `{0}` is not a number")]
    Prefix(String),
    #[error("prefix length {got} is longer than the address ({max} bits)")]
    PrefixTooLong { got: u32, max: u32 },
}

fn bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn width(ip: IpAddr) -> u32 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

/// The top `prefix` bits of a `width`-bit address.
pub(crate) fn mask(width: u32, prefix: u32) -> u128 {
    let all = if width == 128 {
        u128::MAX
    } else {
        (1u128 << width) - 1
    };
    if prefix == 0 {
        0
    } else {
        all & !((1u128 << (width - prefix)) - 1)
    }
}

impl Cidr {
    /// Whether `ip` lies in this block (an IPv4-mapped IPv6 address as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        if ip.is_ipv4() != self.net.is_ipv4() {
            return false;
        }
        let m = mask(width(ip), u32::from(self.prefix));
        bits(ip) & m == bits(self.net) & m
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Cidr, CidrError> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr = addr.trim_start_matches('[').trim_end_matches(']');
        let net = IpAddr::from_str(addr)
            .map_err(|_| CidrError::Address(addr.to_string()))?
            .to_canonical();
        let max = width(net);
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u32>()
                .map_err(|_| CidrError::Prefix(p.to_string()))?,
        };
        if prefix > max {
            return Err(CidrError::PrefixTooLong { got: prefix, max });
        }
        // `prefix <= 128` here.
        let prefix = u8::try_from(prefix).unwrap_or(128);
        Ok(Cidr { net, prefix })
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.net, self.prefix)
    }
}

/// The `--allow` list: a connection from an address in none of the blocks is closed unread.
/// Empty: everyone may connect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList(pub Vec<Cidr>);

impl AllowList {
    pub fn permits(&self, ip: IpAddr) -> bool {
        self.0.is_empty() || self.0.iter().any(|c| c.contains(ip))
    }

    /// `"192.168.2.0/24, fe80::/10"`, or `"everyone"` when empty.
    pub fn describe(&self) -> String {
        if self.0.is_empty() {
            return "everyone".into();
        }
        self.0
            .iter()
            .map(Cidr::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A range of TCP ports, `LO-HI` (both included) or one port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortRange {
    pub lo: u16,
    pub hi: u16,
}

/// Why a port range does not parse.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PortRangeError {
    #[error("`{0}` is not a port (1-65535)")]
    Port(String),
    #[error("`{0}`: the range's first port is above its last")]
    Reversed(String),
}

impl PortRange {
    pub fn contains(&self, port: u16) -> bool {
        (self.lo..=self.hi).contains(&port)
    }

    /// The ports within `width` of `port` (clamped to 1-65535).
    pub fn around(port: u16, width: u16) -> PortRange {
        PortRange {
            lo: port.saturating_sub(width).max(1),
            hi: port.saturating_add(width),
        }
    }
}

impl FromStr for PortRange {
    type Err = PortRangeError;

    fn from_str(s: &str) -> Result<PortRange, PortRangeError> {
        let s = s.trim();
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| PortRangeError::Port(p.trim().to_string()))
        };
        let (lo, hi) = match s.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => (port(s)?, port(s)?),
        };
        if lo > hi {
            return Err(PortRangeError::Reversed(s.to_string()));
        }
        Ok(PortRange { lo, hi })
    }
}

impl std::fmt::Display for PortRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.lo == self.hi {
            write!(f, "{}", self.lo)
        } else {
            write!(f, "{}-{}", self.lo, self.hi)
        }
    }
}
