//! Who may connect and how many at once: the `--allow` network list and each peer's share of the
//! connection slots, both checked when a connection is accepted, before a byte of it is read;
//! the `--max-connections` slots themselves ([`Slots`]), where a new client takes the slot of the
//! oldest connection that holds nothing when all are taken.
//!
//! Every peer is held to its share, loopback included (a client on this machine is no more
//! trusted than one elsewhere); only the blocks the operator names with `--peer-share-exempt`
//! (e.g. a local `rpc-shim` relaying many clients) are not. A connection keeps its place in the
//! share for its whole life, also once it is handed to a session process (`Admitted`).
//!
//! A peer is an IPv4 address or an IPv6 /64 (the smallest block a host is usually given, so one
//! machine cannot claim more shares by using more of its own addresses). IPv4-mapped IPv6
//! addresses (a dual-stack listener) count as the IPv4 address they carry.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::cidr::mask;
use crate::stats::Stats;

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

/// The default `--max-alloc-per-connection`: the total less one connection's fair share
/// (`total / max_connections`), kept for the others, so that no single connection can leave the
/// rest of the slots without memory; with one slot there are no others, and it is the total.
/// With the default 128 slots a lone client may hold 127/128 of the total (a model that fills the
/// worker still loads: llama.cpp's `--fit` leaves 1 GiB per device free by default, more than
/// 1/128 of a device of up to 128 GiB).
pub fn default_alloc_per_connection(total: u64, max_connections: usize) -> u64 {
    match u64::try_from(max_connections) {
        Ok(n) if n > 1 => total - total.div_ceil(n),
        _ => total,
    }
}

/// The `--max-connections` slots and the connections that hold them, in the order they were
/// admitted. When every slot is taken, a new client (its HELLO in) takes the slot of the oldest
/// admitted connection that **holds nothing** (no buffer, no stored graph, no RDMA queue pair,
/// and in a contained server not handed to a session process): that one is closed (its socket
/// shut down) and its slot passes straight to the newcomer. With no such connection the newcomer
/// waits for a slot, as before.
///
/// Whether a connection holds something is its own to say ([`Admitted::claim`] before it acts
/// on a command that may leave state behind, [`Admitted::release`] when it holds nothing again);
/// choosing a victim and claiming take the same lock, so a connection is either evicted before it
/// acts or not evicted at all.
pub struct Slots {
    free: Arc<Semaphore>,
    /// Admitted connections by admission order (oldest first).
    held: Mutex<BTreeMap<u64, Arc<Occupant>>>,
    next: AtomicU64,
    stats: Arc<Stats>,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slots")
            .field("free", &self.free.available_permits())
            .field("admitted", &self.admitted())
            .finish()
    }
}

/// One admitted connection as [`Slots`] sees it.
#[derive(Debug)]
struct Occupant {
    peer: SocketAddr,
    inner: Mutex<Occupancy>,
}

#[derive(Debug)]
struct Occupancy {
    state: Holds,
    /// Its slot (taken by the connection that evicts it).
    slot: Option<OwnedSemaphorePermit>,
    /// A second handle on its socket, shut down to evict it (dropped once it can no longer be
    /// evicted, so that this process does not keep a socket a session process owns open).
    socket: Option<std::net::TcpStream>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holds {
    /// Holds nothing: may be evicted.
    Nothing,
    /// Holds something or is acting on a command: may not be evicted.
    Something,
    /// Evicted: must close without acting on another command.
    Evicted,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every update under these locks is a few plain assignments: a poisoned lock is consistent.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Slots {
    /// `max` slots; evictions are counted in `stats`.
    pub fn new(max: usize, stats: Arc<Stats>) -> Arc<Slots> {
        Arc::new(Slots {
            free: Arc::new(Semaphore::new(max.max(1))),
            held: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(0),
            stats,
        })
    }

    /// Closes the oldest admitted connection that holds nothing and returns its slot, for
    /// `newcomer`; `None` when every connection holds something.
    fn evict_oldest_idle(&self, newcomer: SocketAddr) -> Option<OwnedSemaphorePermit> {
        let held = lock(&self.held);
        for occ in held.values() {
            let mut o = lock(&occ.inner);
            if o.state != Holds::Nothing {
                continue;
            }
            let Some(slot) = o.slot.take() else { continue };
            o.state = Holds::Evicted;
            if let Some(s) = o.socket.take() {
                // Wakes its thread (a read returns end of stream) and tells the client.
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            self.stats.evicted.fetch_add(1, Relaxed);
            tracing::info!(
                peer = %occ.peer,
                new_peer = %newcomer,
                "every connection slot is taken: closing the oldest connection that holds nothing to admit a new client"
            );
            return Some(slot);
        }
        None
    }

    /// Connections admitted now.
    pub fn admitted(&self) -> usize {
        lock(&self.held).len()
    }
}

/// A connection accepted but not yet served: it holds a handshake place (bounded, and only for
/// the HELLO deadline) and its peer's share, not yet one of the connection slots.
#[derive(Debug)]
pub struct Admission {
    handshake: OwnedSemaphorePermit,
    slots: Arc<Slots>,
    share: Option<PeerShare>,
}

/// A connection being served: holds its slot and its peer's share until dropped (or until a new
/// client evicts it, see [`Slots`]).
#[derive(Debug)]
pub struct Admitted {
    slots: Arc<Slots>,
    id: u64,
    me: Arc<Occupant>,
    _share: Option<PeerShare>,
}

impl Admission {
    pub fn new(
        handshake: OwnedSemaphorePermit,
        slots: Arc<Slots>,
        share: Option<PeerShare>,
    ) -> Self {
        Admission {
            handshake,
            slots,
            share,
        }
    }

    /// After the HELLO: takes a connection slot, the slot of the oldest connection that holds
    /// nothing when all are taken, or else waits for one (as a client waited in the accept
    /// backlog before); then gives the handshake place back. `socket`: a second handle on the
    /// connection's socket, shut down if it is evicted in turn. `None` on shutdown.
    pub async fn enter(
        self,
        shutdown: &mut watch::Receiver<bool>,
        peer: SocketAddr,
        socket: std::net::TcpStream,
    ) -> Option<Admitted> {
        let slots = self.slots;
        let slot = match slots.free.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(TryAcquireError::Closed) => return None,
            Err(TryAcquireError::NoPermits) => match slots.evict_oldest_idle(peer) {
                Some(p) => p,
                None => tokio::select! {
                    biased;
                    p = slots.free.clone().acquire_owned() => p.ok()?,
                    _ = shutdown.wait_for(|stop| *stop) => return None,
                },
            },
        };
        drop(self.handshake);
        let id = slots.next.fetch_add(1, Relaxed);
        let me = Arc::new(Occupant {
            peer,
            inner: Mutex::new(Occupancy {
                state: Holds::Nothing,
                slot: Some(slot),
                socket: Some(socket),
            }),
        });
        lock(&slots.held).insert(id, me.clone());
        Some(Admitted {
            slots,
            id,
            me,
            _share: self.share,
        })
    }
}

impl Admitted {
    /// Before acting on a command that may leave something held: from now on this connection is
    /// not evicted (until [`Admitted::release`]). `false`: it has been evicted and must close
    /// without acting.
    pub fn claim(&self) -> bool {
        let mut o = lock(&self.me.inner);
        match o.state {
            Holds::Evicted => false,
            _ => {
                o.state = Holds::Something;
                true
            }
        }
    }

    /// It holds nothing again: it may be evicted.
    pub fn release(&self) {
        let mut o = lock(&self.me.inner);
        if o.state == Holds::Something {
            o.state = Holds::Nothing;
        }
    }

    /// It holds something for the rest of its life (a session process of its own, an RDMA queue
    /// pair): never evicted, and the second handle on its socket is dropped. `false`: it has
    /// been evicted and must close without acting.
    pub fn keep(&self) -> bool {
        let mut o = lock(&self.me.inner);
        if o.state == Holds::Evicted {
            return false;
        }
        o.state = Holds::Something;
        o.socket = None;
        true
    }

    /// Whether a new client evicted it.
    pub fn evicted(&self) -> bool {
        lock(&self.me.inner).state == Holds::Evicted
    }
}

impl Drop for Admitted {
    fn drop(&mut self) {
        lock(&self.slots.held).remove(&self.id);
        let mut o = lock(&self.me.inner);
        o.socket = None;
        o.slot = None; // the slot is free again (unless an evicting connection took it)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cidr::{AllowList, Cidr, CidrError};

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
    fn loopback_blocks_hold_loopback() {
        let l: Vec<Cidr> = vec!["127.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()];
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
    fn one_connection_leaves_a_fair_share_for_the_others() {
        const G: u64 = 1 << 30;
        // Alone (or with a nonsensical 0): the whole total.
        assert_eq!(default_alloc_per_connection(64 * G, 1), 64 * G);
        assert_eq!(default_alloc_per_connection(64 * G, 0), 64 * G);
        // Two slots: half each at worst; 128: all but 1/128 (512 MiB of 64 GiB).
        assert_eq!(default_alloc_per_connection(64 * G, 2), 32 * G);
        assert_eq!(default_alloc_per_connection(64 * G, 128), 64 * G - (G >> 1));
        for n in 2..300usize {
            for total in [0, 1, 127, 1_000_003, 64 * G, u64::MAX] {
                let per = default_alloc_per_connection(total, n);
                let fair = total / n as u64;
                assert!(
                    total - per >= fair,
                    "{total} / {n}: {per} leaves less than {fair}"
                );
                assert!(per <= total);
                assert!(total == 0 || per < total || fair == 0 && total < n as u64);
                // More slots, smaller shares to keep: never less for one connection.
                assert!(
                    default_alloc_per_connection(total, n + 1) >= per,
                    "{total} / {n}"
                );
            }
        }
    }

    /// A connected pair of sockets (server side first).
    fn socket_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        (l.accept().unwrap().0, c)
    }

    /// Admits a new connection to `slots` (waits at most 200 ms for a slot); returns it and the
    /// two ends of its socket (the client's first).
    async fn admit(
        slots: &Arc<Slots>,
        handshakes: &Arc<Semaphore>,
    ) -> Option<(Admitted, (std::net::TcpStream, std::net::TcpStream))> {
        let (server, client) = socket_pair();
        let peer = server.peer_addr().unwrap();
        let h = handshakes.clone().try_acquire_owned().unwrap();
        let (_tx, mut stop) = watch::channel(false);
        let evict = server.try_clone().unwrap();
        let entered = Admission::new(h, slots.clone(), None).enter(&mut stop, peer, evict);
        let a = tokio::time::timeout(std::time::Duration::from_millis(200), entered).await;
        Some((a.ok()??, (client, server)))
    }

    fn closed((client, _): &mut (std::net::TcpStream, std::net::TcpStream)) -> bool {
        use std::io::Read;
        client
            .set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .unwrap();
        matches!(client.read(&mut [0u8; 1]), Ok(0))
    }

    #[tokio::test]
    async fn a_new_client_takes_the_slot_of_the_oldest_that_holds_nothing() {
        let stats = Arc::new(Stats::default());
        let slots = Slots::new(3, stats.clone());
        let hs = Arc::new(Semaphore::new(16));
        let (a, mut ca) = admit(&slots, &hs).await.expect("a slot");
        let (b, mut cb) = admit(&slots, &hs).await.expect("a slot");
        let (c, mut cc) = admit(&slots, &hs).await.expect("a slot");
        assert!(a.claim(), "a holds something");
        assert!(c.keep(), "c is handed on");
        // Full: the fourth takes b's slot (the oldest that holds nothing; a is older).
        let (d, _cd) = admit(&slots, &hs).await.expect("b's slot");
        assert!(b.evicted() && !a.evicted() && !c.evicted() && !d.evicted());
        assert!(!b.claim() && !b.keep(), "an evicted connection may not act");
        assert!(closed(&mut cb), "b's socket was shut down");
        assert!(!closed(&mut ca) && !closed(&mut cc));
        assert_eq!(stats.evicted.load(Relaxed), 1);
        // b is still there until its thread ends, but it has no slot: 3 slots, 4 entries.
        assert_eq!(slots.admitted(), 4);
        drop(b);
        assert_eq!(slots.free.available_permits(), 0, "b's slot is d's");
        // d released: evictable; a, once it holds nothing again, too, and it is older.
        assert!(d.claim());
        d.release();
        a.release();
        let (e, _ce) = admit(&slots, &hs).await.expect("a's slot");
        assert!(a.evicted() && !d.evicted());
        assert!(closed(&mut ca));
        drop(a);
        // Everyone left holds something: the next one waits, and gets in once a slot is free.
        assert!(e.claim() && d.claim());
        assert!(
            admit(&slots, &hs).await.is_none(),
            "nothing to evict: waits"
        );
        assert_eq!(stats.evicted.load(Relaxed), 2);
        drop(c);
        assert!(admit(&slots, &hs).await.is_some(), "c's slot, freed");
        assert_eq!(stats.evicted.load(Relaxed), 2);
    }

    #[test]
    fn one_ipv6_machine_is_one_peer() {
        let s = PeerShares::new(1);
        let _a = s.try_take(ip("2001:db8:1:2::1")).expect("first");
        assert!(s.try_take(ip("2001:db8:1:2:ffff::9")).is_none(), "same /64");
        assert!(s.try_take(ip("2001:db8:1:3::1")).is_some(), "another /64");
    }
}
