//! The server-to-server link of 8.0's collectives (delta §C): COMM_INIT sets it up, each
//! COMM_ALLREDUCE sums a tensor with the peer's over it.
//!
//! The wire is the stock one, so that one of ours pairs with a stock 8.0 server in either rank:
//! one TCP connection, rank 1 → rank 0, no framing at all: 24 caps bytes rank 1 → rank 0, 24
//! back, then per allreduce rank 0 sends its partial and reads the peer's, rank 1 reads then
//! sends. A partial is the tensor's bytes, except F32 tensors of [`COMM_BF16_MIN_ELEMENTS`] or
//! more, which travel as bf16 (ggml's round-to-nearest-even); each rank then adds the peer's
//! partial, as received, to its own (so with bf16 the ranks differ, as stock's do). Our caps
//! are all zero: the link stays on TCP.
//!
//! Safer than stock where it costs nothing: rank 0 listens on the address the client reached
//! this server at (stock: every interface), accepts one peer within a deadline (stock: forever,
//! and the client with it) and only from `--allow`; every read and write on the link has a
//! deadline. A link that cannot be set up answers COMM_INIT with 0: the client then reduces
//! through itself.
//!
//! The session (sans-IO) sees only [`Connector`] and [`PeerLink`]; [`TcpConnector`] is the real
//! thing, tests pair two sessions in memory.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use rpc_proto::{CommInit, COMM_BF16_MIN_ELEMENTS, CONN_CAPS_SIZE};

use crate::cidr::AllowList;

/// One established pairwise link.
pub trait PeerLink: Send {
    /// Sends `send` and receives exactly `recv.len()` bytes, in the rank's order.
    fn exchange(&mut self, send: &[u8], recv: &mut [u8]) -> std::io::Result<()>;
}

/// Sets up links for COMM_INIT.
pub trait Connector: Send + Sync + std::fmt::Debug {
    /// The link for `init`, or why there is none (then COMM_INIT answers 0).
    fn connect(&self, init: &CommInit) -> std::io::Result<Box<dyn PeerLink>>;
}

/// How the real link is set up.
#[derive(Debug, Clone)]
pub struct TcpConnector {
    /// Where rank 0 listens: the address the client reached this server at.
    pub bind_ip: IpAddr,
    /// Peers rank 0 accepts (empty: all), as `--allow`.
    pub allow: AllowList,
    /// How long rank 0 waits for its peer, and rank 1 keeps dialing.
    pub setup_timeout: Duration,
    /// Deadline of every read and write on the link.
    pub io_timeout: Duration,
}

/// How long rank 0 waits for its peer (rank 1 of a stock server dials for ~5 s).
pub const SETUP_TIMEOUT: Duration = Duration::from_secs(10);

impl Connector for TcpConnector {
    fn connect(&self, init: &CommInit) -> std::io::Result<Box<dyn PeerLink>> {
        let stream = self.establish(init)?;
        link(stream, init.rank, self.io_timeout)
    }
}

/// The link over an established connection: deadlines, then the caps exchange (rank 1 first).
/// Ours are all zero (TCP); the peer's are read and ignored (a stock RDMA-built peer then stays
/// on TCP too).
pub fn link(
    mut stream: TcpStream,
    rank: u32,
    io_timeout: Duration,
) -> std::io::Result<Box<dyn PeerLink>> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(io_timeout))?;
    stream.set_write_timeout(Some(io_timeout))?;
    let mut peer_caps = [0u8; CONN_CAPS_SIZE];
    if rank == 0 {
        stream.read_exact(&mut peer_caps)?;
        stream.write_all(&[0; CONN_CAPS_SIZE])?;
    } else {
        stream.write_all(&[0; CONN_CAPS_SIZE])?;
        stream.read_exact(&mut peer_caps)?;
    }
    Ok(Box::new(TcpLink { stream, rank }))
}

impl TcpConnector {
    /// The TCP connection of `init`: rank 0 accepts one peer, rank 1 dials rank 0 (both within
    /// [`TcpConnector::setup_timeout`]).
    pub fn establish(&self, init: &CommInit) -> std::io::Result<TcpStream> {
        // Rank 0 listens only on an unprivileged port (the server may run as root: a client, or a
        // compromised session asking its front, must not take over a system service's port).
        let lowest = if init.rank == 0 { 1024 } else { 1 };
        let port = u16::try_from(init.port)
            .ok()
            .filter(|&p| p >= lowest)
            .ok_or_else(|| bad(format!("comm port {} out of range", init.port)))?;
        match init.rank {
            0 => self.accept(port),
            _ => self.dial(init, port),
        }
    }

    fn accept(&self, port: u16) -> std::io::Result<TcpStream> {
        let listener = TcpListener::bind(SocketAddr::new(self.bind_ip, port))?;
        listener.set_nonblocking(true)?;
        let deadline = Instant::now() + self.setup_timeout;
        loop {
            match listener.accept() {
                Ok((s, peer)) if self.allow.permits(peer.ip()) => {
                    s.set_nonblocking(false)?;
                    tracing::info!(%peer, "comm link: peer connected");
                    return Ok(s);
                }
                Ok((_, peer)) => {
                    tracing::warn!(%peer, "comm link: refused a peer outside --allow");
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

    fn dial(&self, init: &CommInit, port: u16) -> std::io::Result<TcpStream> {
        let host = init
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| bad("rank 1 without rank 0's host".into()))?;
        let deadline = Instant::now() + self.setup_timeout;
        let mut last = None;
        while Instant::now() < deadline {
            for addr in (host, port).to_socket_addrs()? {
                if !self.allow.permits(addr.ip()) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::PermissionDenied,
                        format!("rank 0 at {addr} is outside --allow"),
                    ));
                }
                match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                    Ok(s) => return Ok(s),
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
}

fn bad(what: String) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, what)
}

struct TcpLink {
    stream: TcpStream,
    rank: u32,
}

impl PeerLink for TcpLink {
    fn exchange(&mut self, send: &[u8], recv: &mut [u8]) -> std::io::Result<()> {
        if self.rank == 0 {
            self.stream.write_all(send)?;
            self.stream.read_exact(recv)
        } else {
            self.stream.read_exact(recv)?;
            self.stream.write_all(send)
        }
    }
}

/// Whether an F32 partial of `n` elements travels as bf16.
pub fn travels_as_bf16(n: u64) -> bool {
    n >= COMM_BF16_MIN_ELEMENTS
}

/// ggml's `fp32 → bf16`: round to nearest even; a NaN stays a (quiet) NaN.
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    ((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16
}

/// `bf16 → f32`.
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// One allreduce of an F32 partial (`own`, little-endian f32s) over `link`: `own += peer`, in
/// place, the peer's partial as received. `scratch` (reused between calls) holds what is sent and
/// what is received; returns the bytes that crossed the link each way.
pub fn allreduce_f32(
    link: &mut dyn PeerLink,
    own: &mut [u8],
    scratch: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let n = (own.len() / 4) as u64;
    let bf16 = travels_as_bf16(n);
    let wire = if bf16 { own.len() / 2 } else { own.len() };
    scratch.clear();
    scratch.resize(2 * wire, 0);
    let (send, recv) = scratch.split_at_mut(wire);
    if bf16 {
        for (c, out) in own.chunks_exact(4).zip(send.chunks_exact_mut(2)) {
            let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            out.copy_from_slice(&f32_to_bf16(x).to_le_bytes());
        }
    } else {
        send.copy_from_slice(own);
    }
    link.exchange(send, recv)?;
    for (i, c) in own.chunks_exact_mut(4).enumerate() {
        let x = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        let y = if bf16 {
            let b = recv.get(2 * i..2 * i + 2).unwrap_or(&[0, 0]);
            bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))
        } else {
            let b = recv.get(4 * i..4 * i + 4).unwrap_or(&[0, 0, 0, 0]);
            f32::from_le_bytes([b[0], b[1], b[2], b[3]])
        };
        c.copy_from_slice(&(x + y).to_le_bytes());
    }
    Ok(wire)
}

/// Two ends of an in-memory link (tests): each `exchange` hands the bytes to the other end.
#[cfg(test)]
pub(crate) mod memory {
    use std::sync::mpsc::{channel, Receiver, Sender};

    use super::PeerLink;

    pub(crate) struct MemLink {
        pub(crate) tx: Sender<Vec<u8>>,
        pub(crate) rx: Receiver<Vec<u8>>,
    }

    pub(crate) fn pair() -> (MemLink, MemLink) {
        let (a_tx, b_rx) = channel();
        let (b_tx, a_rx) = channel();
        (
            MemLink { tx: a_tx, rx: a_rx },
            MemLink { tx: b_tx, rx: b_rx },
        )
    }

    impl PeerLink for MemLink {
        fn exchange(&mut self, send: &[u8], recv: &mut [u8]) -> std::io::Result<()> {
            self.tx
                .send(send.to_vec())
                .map_err(|_| std::io::Error::other("peer gone"))?;
            let got = self
                .rx
                .recv()
                .map_err(|_| std::io::Error::other("peer gone"))?;
            if got.len() != recv.len() {
                return Err(std::io::Error::other("length mismatch"));
            }
            recv.copy_from_slice(&got);
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn back(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn bf16_rounds_to_nearest_even_like_ggml() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        // 1 + 2^-8 is exactly halfway between two bf16 values: ties to even (down).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        // 1 + 3·2^-8 is halfway too: ties to even (up).
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
        assert_eq!(bf16_to_f32(0x4049), 3.140625);
    }

    /// Small partials are summed exactly and both ranks agree; large ones cross as bf16 and
    /// each rank adds the peer's rounded partial to its own exact one (so they differ, as the
    /// stock ranks do).
    #[test]
    fn allreduce_small_exact_large_bf16() {
        for n in [4usize, 32767, 32768] {
            let x: Vec<f32> = (0..n).map(|i| 1.0 + i as f32 * 1e-3).collect();
            let y: Vec<f32> = (0..n).map(|i| 0.5 - i as f32 * 7e-4).collect();
            let (mut a, mut b) = memory::pair();
            let (mut xa, mut yb) = (f32s(&x), f32s(&y));
            let t = std::thread::spawn(move || {
                let mut s = Vec::new();
                let wire = allreduce_f32(&mut b, &mut yb, &mut s).unwrap();
                (yb, wire)
            });
            let mut s = Vec::new();
            allreduce_f32(&mut a, &mut xa, &mut s).unwrap();
            let (yb, wire) = t.join().unwrap();
            let (ra, rb) = (back(&xa), back(&yb));
            if n < 32768 {
                assert_eq!(wire, 4 * n);
                for i in 0..n {
                    assert_eq!(ra[i], x[i] + y[i]);
                    assert_eq!(ra[i].to_bits(), rb[i].to_bits());
                }
            } else {
                assert_eq!(wire, 2 * n);
                for i in [0, 1, n / 2, n - 1] {
                    assert_eq!(ra[i], x[i] + bf16_to_f32(f32_to_bf16(y[i])));
                    assert_eq!(rb[i], y[i] + bf16_to_f32(f32_to_bf16(x[i])));
                }
                assert!((0..n).any(|i| ra[i] != rb[i]));
            }
        }
    }

    /// The real link on loopback: rank 0 accepts within its deadline, rank 1 dials; a peer
    /// that never comes makes rank 0 give up (COMM_INIT then answers 0) instead of hanging.
    #[test]
    fn tcp_link_pairs_and_times_out() {
        let port = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let c = TcpConnector {
            bind_ip: "127.0.0.1".parse().unwrap(),
            allow: AllowList::default(),
            setup_timeout: Duration::from_secs(5),
            io_timeout: Duration::from_secs(5),
        };
        let init = move |rank, host: &str| CommInit {
            device: 0,
            rank,
            world: 2,
            port: u32::from(port),
            host: CommInit::host_field(host).unwrap(),
        };
        let c1 = c.clone();
        let t = std::thread::spawn(move || {
            let mut l = c1.connect(&init(1, "127.0.0.1")).unwrap();
            let mut v = f32s(&[1.0, 2.0]);
            allreduce_f32(l.as_mut(), &mut v, &mut Vec::new()).unwrap();
            back(&v)
        });
        let mut l0 = c.connect(&init(0, "")).unwrap();
        let mut v = f32s(&[10.0, 20.0]);
        allreduce_f32(l0.as_mut(), &mut v, &mut Vec::new()).unwrap();
        assert_eq!(back(&v), [11.0, 22.0]);
        assert_eq!(t.join().unwrap(), [11.0, 22.0]);
        // Rank 0 never listens on a privileged port.
        let privileged = CommInit {
            port: 22,
            ..init(0, "")
        };
        assert!(c.connect(&privileged).is_err());
        // Nobody dials: rank 0 gives up after its deadline.
        let short = TcpConnector {
            setup_timeout: Duration::from_millis(200),
            ..c.clone()
        };
        let t0 = Instant::now();
        assert!(short.connect(&init(0, "")).is_err());
        assert!(t0.elapsed() < Duration::from_secs(3));
        // A peer outside --allow is refused (and the deadline ends the wait).
        let only = TcpConnector {
            allow: AllowList(vec!["10.0.0.0/8".parse().unwrap()]),
            setup_timeout: Duration::from_millis(500),
            ..c
        };
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            TcpStream::connect(("127.0.0.1", port)).map(|_| ())
        });
        assert!(only.connect(&init(0, "")).is_err());
        let _ = t.join();
    }

    /// A peer that dials, sends its caps and then misbehaves on the link: one that sends half a
    /// partial and stalls fails the exchange at the deadline (the session then closes); one that
    /// sends garbage caps and hangs up fails it at once. Neither hangs rank 0.
    #[test]
    fn a_misbehaving_peer_fails_the_exchange_by_its_deadline() {
        for behaviour in ["stall", "hang up"] {
            let port = {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap().port()
            };
            let c = TcpConnector {
                bind_ip: "127.0.0.1".parse().unwrap(),
                allow: AllowList::default(),
                setup_timeout: Duration::from_secs(5),
                io_timeout: Duration::from_millis(300),
            };
            let peer = std::thread::spawn(move || {
                let mut s = loop {
                    if let Ok(s) = TcpStream::connect(("127.0.0.1", port)) {
                        break s;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                s.write_all(&[0xAB; CONN_CAPS_SIZE]).unwrap();
                let mut caps = [0u8; CONN_CAPS_SIZE];
                s.read_exact(&mut caps).unwrap();
                if behaviour == "stall" {
                    s.write_all(&[0x55; 8]).unwrap();
                    std::thread::sleep(Duration::from_secs(2));
                }
            });
            let init = CommInit {
                device: 0,
                rank: 0,
                world: 2,
                port: u32::from(port),
                host: [0; 64],
            };
            let mut link = c.connect(&init).unwrap();
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
