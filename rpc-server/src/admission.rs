//! Who may connect and how many at once: the `--allow` network list and each peer's share of the
//! connection slots, both checked when a connection is accepted, before a byte of it is read.
//!
//! Loopback peers (this machine's own processes, e.g. a local `rpc-shim`) are not held to a
//! share by default: they could exhaust the machine in other ways anyway.
//!
//! A peer is an IPv4 address or an IPv6 /64 (the smallest block a host is usually given, so one
//! machine cannot claim more shares by using more of its own addresses). IPv4-mapped IPv6
//! addresses (a dual-stack listener) count as the IPv4 address they carry.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::str::FromStr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

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
fn mask(width: u32, prefix: u32) -> u128 {
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

/// The peers not held to a share by default: loopback (`127.0.0.0/8`, `::1`).
pub fn loopback() -> Vec<Cidr> {
    vec![
        Cidr {
            net: IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 0)),
            prefix: 8,
        },
        Cidr {
            net: IpAddr::V6(Ipv6Addr::LOCALHOST),
            prefix: 128,
        },
    ]
}

/// The key a peer's share is counted under: its IPv4 address, or its IPv6 /64.
pub fn peer_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & mask(128, 64))),
        v4 => v4,
    }
}

/// Connections per peer (handshaking or served), each bounded by `max`.
#[derive(Debug)]
pub struct PeerShares {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One connection's place in its peer's share; given back when dropped.
#[derive(Debug)]
pub struct PeerShare {
    shares: Arc<PeerShares>,
    key: IpAddr,
}

impl PeerShares {
    pub fn new(max: usize) -> Arc<PeerShares> {
        Arc::new(PeerShares {
            max: max.max(1),
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for one more connection from `ip`, or `None` when its peer already has `max`.
    pub fn try_take(self: &Arc<Self>, ip: IpAddr) -> Option<PeerShare> {
        let key = peer_key(ip);
        // A poisoned map is still a consistent map: each update below is one statement.
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(key).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(PeerShare {
            shares: self.clone(),
            key,
        })
    }

    /// Connections `ip`'s peer has now.
    pub fn open(&self, ip: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.get(&peer_key(ip)).copied().unwrap_or(0)
    }
}

impl Drop for PeerShare {
    fn drop(&mut self) {
        let mut open = self
            .shares
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.key);
            }
        }
    }
}

/// The default `--max-connections-per-peer`: half the slots, so that one peer (or one address
/// an attacker controls) cannot take them all.
pub fn default_peer_share(max_connections: usize) -> usize {
    max_connections.div_ceil(2).max(1)
}

/// A connection accepted but not yet served: it holds a handshake place (bounded, and only for
/// the HELLO deadline) and its peer's share, not yet one of the connection slots.
#[derive(Debug)]
pub struct Admission {
    handshake: OwnedSemaphorePermit,
    slots: Arc<Semaphore>,
    share: Option<PeerShare>,
}

/// A connection being served: holds its slot and its peer's share until dropped.
#[derive(Debug)]
pub struct Admitted {
    _slot: OwnedSemaphorePermit,
    _share: Option<PeerShare>,
}

impl Admission {
    pub fn new(
        handshake: OwnedSemaphorePermit,
        slots: Arc<Semaphore>,
        share: Option<PeerShare>,
    ) -> Self {
        Admission {
            handshake,
            slots,
            share,
        }
    }

    /// After the HELLO: waits for a connection slot (as a client waited in the accept backlog
    /// before), then gives the handshake place back. `None` on shutdown.
    pub async fn enter(self, shutdown: &mut watch::Receiver<bool>) -> Option<Admitted> {
        let slot = tokio::select! {
            biased;
            p = self.slots.clone().acquire_owned() => p.ok()?,
            _ = shutdown.wait_for(|stop| *stop) => return None,
        };
        drop(self.handshake);
        Some(Admitted {
            _slot: slot,
            _share: self.share,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_contain_what_they_should() {
        let c: Cidr = "192.168.2.0/24".parse().unwrap();
        assert!(c.contains(ip("192.168.2.1")));
        assert!(c.contains(ip("192.168.2.255")));
        assert!(!c.contains(ip("192.168.3.1")));
        assert!(!c.contains(ip("fe80::1")));
        assert!(c.contains(ip("::ffff:192.168.2.9")), "IPv4-mapped");
        let host: Cidr = "10.0.0.7".parse().unwrap();
        assert_eq!(host.to_string(), "10.0.0.7/32");
        assert!(host.contains(ip("10.0.0.7")) && !host.contains(ip("10.0.0.8")));
        let all: Cidr = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains(ip("8.8.8.8")) && !all.contains(ip("::1")));
        let v6: Cidr = "fe80::/10".parse().unwrap();
        assert!(v6.contains(ip("fe80::1234")) && v6.contains(ip("febf::1")));
        assert!(!v6.contains(ip("fec0::1")) && !v6.contains(ip("10.0.0.1")));
        let any6: Cidr = "::/0".parse().unwrap();
        assert!(any6.contains(ip("2001:db8::1")));
        let one6: Cidr = "[::1]".parse().unwrap();
        assert!(one6.contains(ip("::1")) && !one6.contains(ip("::2")));
        // Host bits in the network part are ignored, as `ip route` does.
        let loose: Cidr = "192.168.2.77/24".parse().unwrap();
        assert!(loose.contains(ip("192.168.2.1")));
    }

    #[test]
    fn bad_blocks_are_refused_with_a_reason() {
        assert_eq!(
            "10.0.0.0/33".parse::<Cidr>(),
            Err(CidrError::PrefixTooLong { got: 33, max: 32 })
        );
        assert!(matches!(
            "fe80::/129".parse::<Cidr>(),
            Err(CidrError::PrefixTooLong { .. })
        ));
        assert!(matches!(
            "10.0.0.0/x".parse::<Cidr>(),
            Err(CidrError::Prefix(_))
        ));
        assert!(matches!(
            "bridge0".parse::<Cidr>(),
            Err(CidrError::Address(_))
        ));
        assert!(matches!("".parse::<Cidr>(), Err(CidrError::Address(_))));
    }

    #[test]
    fn an_empty_list_allows_everyone() {
        assert!(AllowList::default().permits(ip("203.0.113.9")));
        let l = AllowList(vec![
            "169.254.0.0/16".parse().unwrap(),
            "::1".parse().unwrap(),
        ]);
        assert!(l.permits(ip("169.254.10.2")) && l.permits(ip("::1")));
        assert!(!l.permits(ip("127.0.0.1")));
        assert_eq!(l.describe(), "169.254.0.0/16, ::1/128");
    }

    #[test]
    fn loopback_is_loopback() {
        let l = loopback();
        for a in ["127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1"] {
            assert!(l.iter().any(|c| c.contains(ip(a))), "{a}");
        }
        for a in ["128.0.0.1", "::2", "10.0.0.1"] {
            assert!(!l.iter().any(|c| c.contains(ip(a))), "{a}");
        }
    }

    #[test]
    fn a_peer_gets_at_most_its_share_and_gets_it_back() {
        let s = PeerShares::new(2);
        let a = s.try_take(ip("10.0.0.1")).expect("first");
        let b = s
            .try_take(ip("::ffff:10.0.0.1"))
            .expect("second, same peer mapped");
        assert!(s.try_take(ip("10.0.0.1")).is_none(), "third over the share");
        assert!(s.try_take(ip("10.0.0.2")).is_some(), "another peer");
        drop(a);
        assert_eq!(s.open(ip("10.0.0.1")), 1);
        let c = s.try_take(ip("10.0.0.1")).expect("a place was given back");
        drop((b, c));
        assert_eq!(s.open(ip("10.0.0.1")), 0);
    }

    #[test]
    fn one_ipv6_machine_is_one_peer() {
        let s = PeerShares::new(1);
        let _a = s.try_take(ip("2001:db8:1:2::1")).expect("first");
        assert!(s.try_take(ip("2001:db8:1:2:ffff::9")).is_none(), "same /64");
        assert!(s.try_take(ip("2001:db8:1:3::1")).is_some(), "another /64");
    }
}
