//! The server-to-server link of 8.0's collectives (delta §C): COMM_INIT sets it up, each
//! COMM_ALLREDUCE sums a tensor with the peer's over it.
//!
//! The wire is the stock one, so that one of ours pairs with a stock 8.0 server in either rank:
//! one TCP connection, rank 1 → rank 0, no framing at all: 24 caps bytes rank 1 → rank 0, 24
//! back, then per allreduce rank 0 sends its partial and reads the peer's, rank 1 reads then
//! sends. A partial is the tensor's bytes, except F32 tensors of [`COMM_BF16_MIN_ELEMENTS`](rpc_proto::COMM_BF16_MIN_ELEMENTS) or
//! more, which travel as bf16 (ggml's round-to-nearest-even); each rank then adds the peer's
//! partial, as received, to its own (so with bf16 the ranks differ, as stock's do). Our caps
//! are all zero: the link stays on TCP.
//!
//! Safer than stock, since a COMM_INIT comes from any client that passed HELLO and names any
//! address and port (a server-side request forgery waiting to happen: dial a loopback service,
//! "allreduce" a zero tensor, read its bytes back with GET_TENSOR). [`CommPolicy`] decides
//! every link from what the operator allows and what it already knows, before any socket:
//! - the request's shape: a device of this server, world 2, rank 0 or 1;
//! - rank 0 listens only on this server's own port + 1000 (the port the stock client asks for),
//!   on the address the client reached this server at (stock: every interface), accepts within
//!   a deadline (stock: forever, and the client with it) and only from `--comm-peers`;
//! - rank 1 dials only a peer in `--comm-peers` (default: what `--allow` permits), checked on
//!   the numeric address before any connection (a host name is resolved once, with a deadline,
//!   and only the addresses it gave are dialed), and only a port that is an allowed RPC port
//!   (`--comm-peer-ports`, default: within [`DEFAULT_PEER_PORT_WINDOW`] of this server's own)
//!   + 1000;
//! - before any partial crosses, the peer must have proved to be a ggml RPC server: it says
//!   nothing before our caps (a service that greets first fails), and answers exactly one
//!   well-formed caps block (all zero, or an RDMA offer in one of upstream's layouts; an HTTP,
//!   SSH or Redis error line is neither). Rank 0 checks its peer's block the same way and keeps
//!   waiting for a real peer instead.
//!
//! A link that cannot be set up answers COMM_INIT with 0: the client then reduces through
//! itself. Every read and write on the link has a deadline. A contained session's links are set
//! up by its front (`handoff/`) with the same policy; the session process checks a request
//! against it before asking, so the front treats a request outside it as a compromised
//! session's.
//!
//! The session (sans-IO, the `rpc-session` crate) sees only its [`Connector`] and [`PeerLink`]
//! traits and runs the allreduce itself (`rpc_session::peer`); [`CommPolicy`] is the real
//! connector; the session's own tests pair two sessions in memory.

use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rpc_proto::{CommInit, COMM_PORT_OFFSET, CONN_CAPS_SIZE};
use rpc_session::peer::{Connector, PeerLink};

use crate::cidr::{AllowList, PortRange};
pub use crate::link::{caps_well_formed, LinkRdma};
use crate::link::{not_rpc, nothing_more_after};

/// How long rank 0 waits for its peer (rank 1 of a stock server dials for ~5 s).
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `--comm-peer-ports`: RPC ports within this distance of this server's own port (a
/// rack's workers share one port; two servers on one host use neighbouring ones).
pub const DEFAULT_PEER_PORT_WINDOW: u16 = 100;
/// How long rank 1 listens for a peer that speaks before it is spoken to (a stock rank 0 never
/// does: it reads our caps first).
const SPEAKS_FIRST_WAIT: Duration = Duration::from_millis(20);
/// How long the one resolution of a host name may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);
/// Host-name resolutions running at once, server-wide (each on a thread of its own).
const MAX_RESOLVING: usize = 4;

/// Why a COMM_INIT gets no link before any socket is opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("device {device} is not one of this server's {devices}")]
    Device { device: u32, devices: usize },
    #[error("world {0}: only pairwise links (world 2)")]
    World(u32),
    #[error("rank {0} of a world of 2")]
    Rank(u32),
    #[error("rank 0 listens only on this server's port + 1000 ({own}), not {asked}")]
    Rank0Port { asked: u32, own: u32 },
    #[error("port {0} is not an allowed comm peer's RPC port + 1000 (--comm-peer-ports)")]
    PeerPort(u32),
    #[error("rank 1 without rank 0's host")]
    NoHost,
    #[error("comm peer {0} is outside --comm-peers")]
    PeerAddress(IpAddr),
}

/// Where a checked COMM_INIT leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Rank 0: listen on this port.
    Listen(u16),
    /// Rank 1: dial `host` (a numeric address, `ip`, or a name resolved at dial time) at `port`.
    Dial {
        host: String,
        ip: Option<IpAddr>,
        port: u16,
    },
}

/// What links a connection may have, and how they are set up (see the module docs).
#[derive(Debug, Clone)]
pub struct CommPolicy {
    /// The address (and port) the client reached this server at: rank 0 listens there, on the
    /// port + 1000.
    pub local: SocketAddr,
    /// Comm peers rank 1 may dial and rank 0 accepts (empty: all).
    pub peers: AllowList,
    /// RPC ports of the comm peers rank 1 may dial (the link is on that port + 1000).
    pub peer_ports: Vec<PortRange>,
    /// How long rank 0 waits for its peer, and rank 1 keeps dialing.
    pub setup_timeout: Duration,
    /// Deadline of every read and write on the link.
    pub io_timeout: Duration,
    /// What the link may run on besides TCP ([`CommPolicy::with_rdma`]; TCP only by default).
    pub rdma: LinkRdma,
}

impl Connector for CommPolicy {
    fn connect(&self, init: &CommInit) -> std::io::Result<Box<dyn PeerLink>> {
        // The session checked the device against its own; here only the rest matters.
        let target = self
            .check(init, (init.device as usize).saturating_add(1))
            .map_err(refused)?;
        let stream = self.establish(&target)?;
        crate::link::finish(stream, init.rank, &self.rdma, self.io_timeout)
    }

    fn port(&self) -> Option<u16> {
        Some(self.local.port())
    }
}

/// A refusal as an I/O error (COMM_INIT answers 0).
pub fn refused(r: Refusal) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::PermissionDenied, r.to_string())
}

impl CommPolicy {
    /// The policy of a connection that reached this server at `local`; `peer_ports` empty: the
    /// default window around `local`'s port.
    pub fn new(
        local: SocketAddr,
        peers: AllowList,
        peer_ports: Vec<PortRange>,
        setup_timeout: Duration,
        io_timeout: Duration,
    ) -> CommPolicy {
        let peer_ports = match peer_ports.is_empty() {
            true => vec![PortRange::around(local.port(), DEFAULT_PEER_PORT_WINDOW)],
            false => peer_ports,
        };
        CommPolicy {
            local,
            peers,
            peer_ports,
            setup_timeout,
            io_timeout,
            rdma: LinkRdma::off(),
        }
    }

    /// The same policy, the link allowed on RDMA as `rdma` says.
    pub fn with_rdma(self, rdma: LinkRdma) -> CommPolicy {
        CommPolicy { rdma, ..self }
    }

    /// The port rank 0 listens on: this server's own + 1000.
    pub fn rank0_port(&self) -> Option<u16> {
        self.local.port().checked_add(COMM_PORT_OFFSET)
    }

    /// Where `init` may lead on a server with `devices` devices, decided before any socket is
    /// opened (a host name is checked once resolved, in [`CommPolicy::establish`]).
    pub fn check(&self, init: &CommInit, devices: usize) -> Result<Target, Refusal> {
        if init.device as usize >= devices {
            return Err(Refusal::Device {
                device: init.device,
                devices,
            });
        }
        if init.world != 2 {
            return Err(Refusal::World(init.world));
        }
        match init.rank {
            0 => match self.rank0_port() {
                Some(p) if u32::from(p) == init.port => Ok(Target::Listen(p)),
                own => Err(Refusal::Rank0Port {
                    asked: init.port,
                    own: own.map_or(0, u32::from),
                }),
            },
            1 => {
                let port = u16::try_from(init.port)
                    .ok()
                    .filter(|&p| {
                        p.checked_sub(COMM_PORT_OFFSET)
                            .is_some_and(|rpc| self.peer_ports.iter().any(|r| r.contains(rpc)))
                    })
                    .ok_or(Refusal::PeerPort(init.port))?;
                let host = init
                    .host_str()
                    .map(str::trim)
                    .filter(|h| !h.is_empty())
                    .ok_or(Refusal::NoHost)?;
                let bare = host.trim_start_matches('[').trim_end_matches(']');
                let ip = bare.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
                if let Some(ip) = ip.filter(|&ip| !self.peers.permits(ip)) {
                    return Err(Refusal::PeerAddress(ip));
                }
                Ok(Target::Dial {
                    host: bare.to_string(),
                    ip,
                    port,
                })
            }
            r => Err(Refusal::Rank(r)),
        }
    }

    /// The connection of a checked `target`, its caps exchanged: rank 0 accepts one peer that
    /// proves to be a ggml RPC server, rank 1 dials rank 0 and checks it is one (both within
    /// [`CommPolicy::setup_timeout`]).
    pub fn establish(&self, target: &Target) -> std::io::Result<TcpStream> {
        match target {
            Target::Listen(port) => self.accept(*port),
            Target::Dial { host, ip, port } => self.dial(host, *ip, *port),
        }
    }

    fn accept(&self, port: u16) -> std::io::Result<TcpStream> {
        let listener = TcpListener::bind(SocketAddr::new(self.local.ip(), port))?;
        listener.set_nonblocking(true)?;
        let deadline = Instant::now() + self.setup_timeout;
        loop {
            match listener.accept() {
                Ok((s, peer)) if self.peers.permits(peer.ip()) => {
                    match self.greet_rank1(s, deadline) {
                        Ok(s) => {
                            tracing::info!(%peer, "comm link: peer connected");
                            return Ok(s);
                        }
                        Err(e) => {
                            tracing::warn!(%peer, "comm link: not a ggml RPC server ({e}); still waiting for the peer")
                        }
                    }
                }
                Ok((_, peer)) => {
                    tracing::warn!(%peer, "comm link: refused a peer outside --comm-peers");
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "no peer dialed port {port} within {} s",
                        self.setup_timeout.as_secs()
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Rank 0's check of a peer: a well-formed caps block arrives within the deadline and
    /// nothing after it. Looked at, not read: the caps exchange is [`crate::link::finish`]'s,
    /// in the process that will own the link.
    fn greet_rank1(&self, s: TcpStream, deadline: Instant) -> std::io::Result<TcpStream> {
        s.set_nonblocking(false)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(self.io_timeout.min(Duration::from_millis(100))))?;
        let deadline = deadline.min(Instant::now() + self.io_timeout);
        let mut caps = [0u8; CONN_CAPS_SIZE + 1];
        loop {
            match s.peek(&mut caps) {
                Ok(0) => return Err(not_rpc("it closed the connection before its caps")),
                Ok(n) if n > CONN_CAPS_SIZE => {
                    return Err(not_rpc("it sent more than a caps block"))
                }
                Ok(CONN_CAPS_SIZE) => break,
                Ok(_) => std::thread::sleep(Duration::from_millis(1)),
                Err(e) if nothing_yet(&e) => {}
                Err(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the peer sent no caps block in time",
                ));
            }
        }
        let block: [u8; CONN_CAPS_SIZE] = caps[..CONN_CAPS_SIZE].try_into().unwrap_or_default();
        if !caps_well_formed(&block) {
            return Err(not_rpc("its caps block is malformed"));
        }
        nothing_more_after(&s, CONN_CAPS_SIZE)?;
        Ok(s)
    }

    fn dial(&self, host: &str, ip: Option<IpAddr>, port: u16) -> std::io::Result<TcpStream> {
        let deadline = Instant::now() + self.setup_timeout;
        let ips = match ip {
            Some(ip) => vec![ip],
            None => resolve_once(host, RESOLVE_TIMEOUT)?,
        };
        let addrs: Vec<SocketAddr> = ips
            .iter()
            .copied()
            .filter(|&ip| self.peers.permits(ip))
            .map(|ip| SocketAddr::new(ip, port))
            .collect();
        if addrs.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                format!("{host} resolves to {ips:?}: none is in --comm-peers"),
            ));
        }
        let mut last = None;
        while Instant::now() < deadline {
            for addr in &addrs {
                match TcpStream::connect_timeout(addr, Duration::from_millis(500)) {
                    Ok(s) => return self.greet_rank0(s),
                    // Not there yet (rank 0 may still be setting up): dial again.
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::TimedOut
                        ) =>
                    {
                        last = Some(e)
                    }
                    Err(e) => return Err(e),
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(last.unwrap_or_else(|| bad(format!("cannot reach {host}:{port}"))))
    }

    /// Rank 1's check of rank 0 before the caps exchange ([`crate::link::finish`], in the
    /// process that will own the link, checks the answer): a peer that speaks before it is
    /// spoken to is no ggml RPC server (a stock rank 0 reads our caps first).
    fn greet_rank0(&self, s: TcpStream) -> std::io::Result<TcpStream> {
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(SPEAKS_FIRST_WAIT))?;
        let mut one = [0u8; 1];
        match s.peek(&mut one) {
            Ok(0) => return Err(not_rpc("it closed the connection at once")),
            Ok(_) => return Err(not_rpc("it spoke before it was spoken to")),
            Err(e) if nothing_yet(&e) => {}
            Err(e) => return Err(e),
        }
        s.set_read_timeout(Some(self.io_timeout))?;
        s.set_write_timeout(Some(self.io_timeout))?;
        Ok(s)
    }
}

/// A read with a timeout that found nothing to read yet.
fn nothing_yet(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Resolutions of host names running now ([`MAX_RESOLVING`]).
static RESOLVING: AtomicUsize = AtomicUsize::new(0);

/// One resolution of `host`, on a thread of its own, given up after `timeout` (the system
/// resolver has no deadline of its own; the thread then finishes in the background).
fn resolve_once(host: &str, timeout: Duration) -> std::io::Result<Vec<IpAddr>> {
    if RESOLVING.fetch_add(1, Ordering::AcqRel) >= MAX_RESOLVING {
        RESOLVING.fetch_sub(1, Ordering::AcqRel);
        return Err(std::io::Error::new(
            std::io::ErrorKind::WouldBlock,
            "too many host names being resolved",
        ));
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let name = host.to_string();
    let spawned = std::thread::Builder::new()
        .name("comm-resolve".into())
        .spawn(move || {
            let r = (name.as_str(), 0u16)
                .to_socket_addrs()
                .map(|a| a.map(|a| a.ip().to_canonical()).collect::<Vec<_>>());
            RESOLVING.fetch_sub(1, Ordering::AcqRel);
            let _ = tx.send(r);
        });
    if let Err(e) = spawned {
        RESOLVING.fetch_sub(1, Ordering::AcqRel);
        return Err(e);
    }
    match rx.recv_timeout(timeout) {
        Ok(r) => r,
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("{host} did not resolve within {} s", timeout.as_secs()),
        )),
    }
}

fn bad(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, what)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpc_session::peer::allreduce_f32;
    use std::io::{Read, Write};

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn back(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// A policy for a server whose clients reach it at 127.0.0.1:`rpc_port`, dialing peers on
    /// `peer_ports`.
    fn policy(rpc_port: u16, peer_ports: Vec<PortRange>) -> CommPolicy {
        CommPolicy::new(
            SocketAddr::from(([127, 0, 0, 1], rpc_port)),
            AllowList::default(),
            peer_ports,
            Duration::from_secs(5),
            Duration::from_secs(5),
        )
    }

    fn init(rank: u32, host: &str, port: u16) -> CommInit {
        CommInit {
            device: 0,
            rank,
            world: 2,
            port: u32::from(port),
            host: CommInit::host_field(host).unwrap(),
        }
    }

    /// Two ports `p` (an RPC port) and `p + 1000` (its comm port) that were both free.
    fn free_rpc_port() -> u16 {
        loop {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let p = l.local_addr().unwrap().port();
            if p < 60000 && TcpListener::bind(("127.0.0.1", p + COMM_PORT_OFFSET)).is_ok() {
                return p;
            }
        }
    }

    #[test]
    fn port_ranges_parse_and_the_default_window() {
        assert_eq!(
            "50052".parse(),
            Ok(PortRange {
                lo: 50052,
                hi: 50052
            })
        );
        assert_eq!(
            " 50000-50100".parse(),
            Ok(PortRange {
                lo: 50000,
                hi: 50100
            })
        );
        assert!("0".parse::<PortRange>().is_err());
        assert!("70000".parse::<PortRange>().is_err());
        assert!("9-8".parse::<PortRange>().is_err());
        assert!("a-b".parse::<PortRange>().is_err());
        assert_eq!(PortRange::around(50, 100), PortRange { lo: 1, hi: 150 });
        assert_eq!(
            PortRange::around(65500, 100),
            PortRange {
                lo: 65400,
                hi: 65535
            }
        );
        let p = policy(50052, vec![]);
        assert_eq!(
            p.peer_ports,
            vec![PortRange {
                lo: 49952,
                hi: 50152
            }]
        );
    }

    /// What a COMM_INIT may ask, decided before any socket: the shape, rank 0 only on its own
    /// port + 1000, rank 1 only to an allowed peer's RPC port + 1000 and an allowed address.
    #[test]
    fn a_request_is_checked_before_any_socket() {
        let p = CommPolicy {
            peers: AllowList(vec!["10.0.0.0/8".parse().unwrap()]),
            ..policy(50052, vec![])
        };
        assert_eq!(p.check(&init(0, "", 51052), 1), Ok(Target::Listen(51052)));
        assert_eq!(
            p.check(&init(0, "", 51053), 1),
            Err(Refusal::Rank0Port {
                asked: 51053,
                own: 51052
            })
        );
        assert_eq!(
            p.check(&init(1, "10.1.2.3", 51060), 1),
            Ok(Target::Dial {
                host: "10.1.2.3".into(),
                ip: Some("10.1.2.3".parse().unwrap()),
                port: 51060
            })
        );
        // A loopback service (SSRF), a port that is no RPC port + 1000, the metrics port.
        assert_eq!(
            p.check(&init(1, "127.0.0.1", 51052), 1),
            Err(Refusal::PeerAddress("127.0.0.1".parse().unwrap()))
        );
        for port in [6379u16, 22, 9100, 52000] {
            assert_eq!(
                p.check(&init(1, "10.1.2.3", port), 1),
                Err(Refusal::PeerPort(u32::from(port))),
                "{port}"
            );
        }
        assert_eq!(p.check(&init(1, "", 51052), 1), Err(Refusal::NoHost));
        // A name passes the check; its addresses are checked once resolved.
        assert!(matches!(
            p.check(&init(1, "studio2.local", 51052), 1),
            Ok(Target::Dial { ip: None, .. })
        ));
        let mut i = init(1, "10.1.2.3", 51052);
        i.world = 3;
        assert_eq!(p.check(&i, 1), Err(Refusal::World(3)));
        i.world = 2;
        i.rank = 2;
        assert_eq!(p.check(&i, 1), Err(Refusal::Rank(2)));
        i.rank = 1;
        i.device = 1;
        assert_eq!(
            p.check(&i, 1),
            Err(Refusal::Device {
                device: 1,
                devices: 1
            })
        );
        // A name that resolves outside --comm-peers is refused at dial time.
        let e = p
            .establish(&Target::Dial {
                host: "localhost".into(),
                ip: None,
                port: 51052,
            })
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
    }

    /// The real link on loopback: rank 0 accepts within its deadline, rank 1 dials; a peer
    /// that never comes makes rank 0 give up (COMM_INIT then answers 0) instead of hanging.
    /// LINK_PROBE names the port the client reached this server at: a session whose connector
    /// is the policy of a connection that came in on 127.0.0.1:50052 answers 50052.
    #[test]
    fn link_probe_answers_the_port_the_client_reached() {
        use rpc_proto::{Major, Request, Response};
        use rpc_session::{MemoryBudget, Session, SessionConfig};
        use std::sync::Arc;
        let p = policy(50052, vec![]);
        assert_eq!(Connector::port(&p), Some(50052));
        let cpu = rpc_ggml::Device::all()
            .into_iter()
            .find(|d| d.kind() == rpc_ggml::DeviceKind::Cpu)
            .expect("a CPU device");
        let config = SessionConfig {
            devices: vec![cpu],
            n_threads: 1,
            cache: None,
            local: None,
        };
        let budget = Arc::new(MemoryBudget::unlimited());
        let mut s = Session::new(Arc::new(config), Major::V8, budget);
        s.set_connector(Arc::new(p));
        assert_eq!(
            s.handle(Request::LinkProbe).unwrap(),
            Some(Response::LinkProbe {
                version: rpc_proto::LINK_VERSION,
                port: 50052
            })
        );
    }

    #[test]
    fn tcp_link_pairs_and_times_out() {
        let rpc = free_rpc_port();
        let port = rpc + COMM_PORT_OFFSET;
        let c = policy(rpc, vec![]);
        let c1 = c.clone();
        // As the stock client does: no allreduce before both ranks answered COMM_INIT.
        let both = std::sync::Arc::new(std::sync::Barrier::new(2));
        let both1 = both.clone();
        let t = std::thread::spawn(move || {
            let mut l = c1.connect(&init(1, "127.0.0.1", port)).unwrap();
            both1.wait();
            let mut v = f32s(&[1.0, 2.0]);
            allreduce_f32(l.as_mut(), &mut v, &mut Vec::new()).unwrap();
            back(&v)
        });
        let mut l0 = c.connect(&init(0, "", port)).unwrap();
        both.wait();
        let mut v = f32s(&[10.0, 20.0]);
        allreduce_f32(l0.as_mut(), &mut v, &mut Vec::new()).unwrap();
        assert_eq!(back(&v), [11.0, 22.0]);
        assert_eq!(t.join().unwrap(), [11.0, 22.0]);
        // Nobody dials: rank 0 gives up after its deadline.
        let short = CommPolicy {
            setup_timeout: Duration::from_millis(200),
            ..c.clone()
        };
        let t0 = Instant::now();
        assert!(short.connect(&init(0, "", port)).is_err());
        assert!(t0.elapsed() < Duration::from_secs(3));
        // A peer outside --comm-peers is refused (and the deadline ends the wait).
        let only = CommPolicy {
            peers: AllowList(vec!["10.0.0.0/8".parse().unwrap()]),
            setup_timeout: Duration::from_millis(500),
            ..c
        };
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            TcpStream::connect(("127.0.0.1", port)).map(|_| ())
        });
        assert!(only.connect(&init(0, "", port)).is_err());
        let _ = t.join();
    }

    /// The SSRF of a COMM_INIT naming a local service: whatever the service is, rank 1 reads
    /// none of its bytes into a partial. A service that greets first (SSH, SMTP, MySQL), one that
    /// answers our 24 bytes with an error line (HTTP, Redis), one that answers with 24 bytes of
    /// text and one that answers a well-formed block and then more: each fails the link before
    /// any partial crosses; a real rank 0 (24 zero bytes back, nothing more) passes.
    #[test]
    fn a_service_that_is_no_rpc_server_fails_the_link() {
        // (what, its greeting, its answer to our caps, whether it is an RPC server)
        type Service<'a> = (&'a str, Option<&'a [u8]>, &'a [u8], bool);
        let cases: [Service; 7] = [
            (
                "ssh",
                Some(b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n"),
                b"",
                false,
            ),
            ("mysql", Some(b"\x4a\0\0\0\x0a8.0.33\0"), b"", false),
            (
                "http",
                None,
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
                false,
            ),
            (
                "redis",
                None,
                b"-ERR unknown command '\x00\x00', with args beginning with: \r\n",
                false,
            ),
            (
                "24 bytes of text",
                None,
                b"ERROR: bad request here\n",
                false,
            ),
            ("caps and more", None, &[0u8; 40], false),
            ("rpc server", None, &[0u8; 24], true),
        ];
        for (what, greeting, answer, ok) in cases {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            let (greeting, answer) = (greeting.map(<[u8]>::to_vec), answer.to_vec());
            let service = std::thread::spawn(move || {
                let (mut s, _) = l.accept().unwrap();
                if let Some(g) = greeting {
                    let _ = s.write_all(&g);
                }
                let mut got = [0u8; 24];
                s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
                if s.read_exact(&mut got).is_ok() {
                    let _ = s.write_all(&answer);
                    // A rank 0's partial, once the client asked for an allreduce (well after
                    // rank 1 checked that nothing followed the caps, even on a loaded machine).
                    std::thread::sleep(Duration::from_millis(500));
                    let _ = s.write_all(&[0u8; 24]);
                }
                // What reaches the service after the caps: a partial, if the link was made.
                let mut rest = Vec::new();
                let _ = s.read_to_end(&mut rest);
                rest
            });
            let p = policy(port - COMM_PORT_OFFSET, vec![]);
            let r = p.connect(&init(1, "127.0.0.1", port));
            match r {
                Ok(mut link) => {
                    assert!(ok, "{what}: the link was made");
                    let mut v = f32s(&[7.0; 6]);
                    let send = v.clone();
                    link.exchange(&send, &mut v).unwrap();
                    drop(link);
                }
                Err(e) => assert!(!ok, "{what}: {e}"),
            }
            let rest = service.join().unwrap();
            assert_eq!(
                rest.is_empty(),
                !ok,
                "{what}: a partial crossed only to an RPC server"
            );
        }
    }

    /// Rank 0 keeps waiting for a real peer when something else dials first (a squatter that
    /// sends junk), and pairs with the real one within its deadline.
    #[test]
    fn rank0_skips_a_peer_that_is_no_rpc_server() {
        let rpc = free_rpc_port();
        let port = rpc + COMM_PORT_OFFSET;
        let c = policy(rpc, vec![]);
        let (c0, c1) = (c.clone(), c);
        let both = std::sync::Arc::new(std::sync::Barrier::new(2));
        let both1 = both.clone();
        let t = std::thread::spawn(move || {
            let junk = loop {
                if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                    break s;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            let mut junk = junk;
            junk.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .unwrap();
            std::thread::sleep(Duration::from_millis(100));
            let mut l = c1.connect(&init(1, "127.0.0.1", port)).unwrap();
            both1.wait();
            let mut v = f32s(&[1.0]);
            allreduce_f32(l.as_mut(), &mut v, &mut Vec::new()).unwrap();
            back(&v)
        });
        let mut l0 = c0.connect(&init(0, "", port)).unwrap();
        both.wait();
        let mut v = f32s(&[2.0]);
        allreduce_f32(l0.as_mut(), &mut v, &mut Vec::new()).unwrap();
        assert_eq!(back(&v), [3.0]);
        assert_eq!(t.join().unwrap(), [3.0]);
    }

    /// A peer that dials, sends its caps and then misbehaves on the link: one that sends half a
    /// partial and stalls fails the exchange at the deadline (the session then closes); one that
    /// hangs up fails it at once. Neither hangs rank 0.
    #[test]
    fn a_misbehaving_peer_fails_the_exchange_by_its_deadline() {
        for behaviour in ["stall", "hang up"] {
            let rpc = free_rpc_port();
            let port = rpc + COMM_PORT_OFFSET;
            let c = CommPolicy {
                io_timeout: Duration::from_millis(300),
                ..policy(rpc, vec![])
            };
            let peer = std::thread::spawn(move || {
                let mut s = loop {
                    if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                        break s;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                s.write_all(&[0; CONN_CAPS_SIZE]).unwrap();
                let mut caps = [0u8; CONN_CAPS_SIZE];
                s.read_exact(&mut caps).unwrap();
                if behaviour == "stall" {
                    s.write_all(&[0x55; 8]).unwrap();
                    std::thread::sleep(Duration::from_secs(2));
                }
            });
            let mut link = c.connect(&init(0, "", port)).unwrap();
            let mut own = f32s(&[1.0; 16]);
            let t0 = Instant::now();
            assert!(
                allreduce_f32(link.as_mut(), &mut own, &mut Vec::new()).is_err(),
                "{behaviour}"
            );
            assert!(t0.elapsed() < Duration::from_secs(2), "{behaviour}");
            let _ = peer.join();
        }
    }
}
