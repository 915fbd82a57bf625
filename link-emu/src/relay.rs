//! The relay between client and server: counts protocol traffic ([`crate::traffic`]) and, for
//! an emulated link, adds a one-way delay and a bandwidth limit to each direction.
//!
//! The kernel here has no `netem`, so the link lives in user space. Everything runs on plain OS
//! threads with blocking sockets (no async runtime, whose timers are 1 ms granular):
//!
//! - a reader thread per direction reads whatever arrived (≤ 256 KiB), timestamps it, counts it,
//!   and computes when its last byte leaves the emulated wire: serialisation starts when both the
//!   chunk has arrived and the link is free (`start = max(arrival, link_free)`,
//!   `link_free = start + len ÷ bandwidth`), and the bytes arrive `one_way` later;
//! - a writer thread per direction sleeps until that instant with [`wait_until`] (sleep, then spin
//!   for the last [`SPIN_MARGIN`]) and writes the chunk.
//!
//! The two directions are independent (full duplex). A bounded queue between reader and writer
//! gives TCP back-pressure to the sender instead of buffering a whole model upload. A relay with
//! no delay and no bandwidth limit takes the same path (the writer then never waits), so its
//! overhead is exactly the base the emulated links add their delay to.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::links::LinkProfile;
use crate::traffic::{Counters, RequestParser, ResponseParser};

/// Largest chunk the relay reads (and forwards) at once.
pub const CHUNK: usize = 256 * 1024;
/// Chunks queued per direction before the reader blocks (back-pressure): at most 16 MiB.
const QUEUE_CHUNKS: usize = 64;
/// [`wait_until`] sleeps until this long before the deadline, then spins.
pub const SPIN_MARGIN: Duration = Duration::from_micros(200);

/// Waits until `deadline` with microsecond precision: `thread::sleep` while far away (the
/// kernel oversleeps by tens of µs), then a busy spin for the last [`SPIN_MARGIN`].
pub fn wait_until(deadline: Instant) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let left = deadline - now;
        if left > SPIN_MARGIN {
            thread::sleep(left - SPIN_MARGIN);
        } else {
            std::hint::spin_loop();
        }
    }
}

/// The emulated wire of one direction.
#[derive(Debug, Clone, Copy)]
pub struct Wire {
    /// One-way propagation delay.
    pub one_way: Duration,
    /// Bytes per second (`None`: unlimited).
    pub bytes_per_sec: Option<f64>,
}

impl Wire {
    /// The wire of a link profile (half its RTT each way, its bandwidth).
    pub fn of(link: &LinkProfile) -> Wire {
        Wire {
            one_way: link.one_way(),
            bytes_per_sec: link.bytes_per_sec(),
        }
    }

    /// A wire that adds nothing.
    pub fn transparent() -> Wire {
        Wire {
            one_way: Duration::ZERO,
            bytes_per_sec: None,
        }
    }

    /// Whether this wire adds nothing.
    pub fn is_transparent(&self) -> bool {
        self.one_way.is_zero() && self.bytes_per_sec.is_none()
    }
}

/// Serialisation state of one direction.
#[derive(Debug)]
struct Shaper {
    wire: Wire,
    link_free: Option<Instant>,
}

impl Shaper {
    /// When the last byte of `len` bytes that arrived at `arrival` is delivered.
    fn deliver_at(&mut self, arrival: Instant, len: usize) -> Instant {
        let start = match self.link_free {
            Some(free) if free > arrival => free,
            _ => arrival,
        };
        let ser = self.wire.bytes_per_sec.map_or(Duration::ZERO, |bps| {
            Duration::from_secs_f64(len as f64 / bps)
        });
        let done = start + ser;
        self.link_free = Some(done);
        done + self.wire.one_way
    }
}

/// Options of a relay.
#[derive(Debug, Clone, Copy)]
pub struct RelayOptions {
    /// Parse the ggml RPC framing and count (off for raw byte streams, e.g. the emulator check:
    /// then only the bytes each way are counted).
    pub protocol: bool,
    /// Zero the client's HELLO transport caps (keeps RDMA-capable clients on TCP).
    pub zero_hello_caps: bool,
    /// How long to keep dialing an upstream that is not listening yet (connection refused)
    /// before giving a client's connection up; zero: one try. For an upstream that starts
    /// listening only when asked to (a rank 0 server's allreduce link, `rpc-bench allreduce`).
    pub upstream_wait: Duration,
    /// With `protocol`: the port every rank 0's COMM_INIT is rewritten to name
    /// ([`RequestParser::comm_rank0_port`]), for a stock 8.0 server whose pairwise link is to
    /// cross a relay listening at the port the client named.
    pub comm_rank0_port: Option<u32>,
}

impl Default for RelayOptions {
    fn default() -> Self {
        RelayOptions {
            protocol: true,
            zero_hello_caps: true,
            upstream_wait: Duration::ZERO,
            comm_rank0_port: None,
        }
    }
}

/// A running relay: listens on loopback, forwards every connection to `upstream`.
pub struct Relay {
    addr: SocketAddr,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    sockets: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl Relay {
    /// Starts a relay on `127.0.0.1:0` in front of `upstream`, emulating `wire` each way.
    pub fn start(upstream: SocketAddr, wire: Wire, opts: RelayOptions) -> io::Result<Relay> {
        Relay::on(TcpListener::bind("127.0.0.1:0")?, upstream, wire, opts)
    }

    /// Starts a relay on a listener the caller bound (a port fixed in advance, e.g. one a server
    /// is told to dial) in front of `upstream`, emulating `wire` each way.
    pub fn on(
        listener: TcpListener,
        upstream: SocketAddr,
        wire: Wire,
        opts: RelayOptions,
    ) -> io::Result<Relay> {
        let addr = listener.local_addr()?;
        let counters = Arc::new(Counters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let sockets: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (c, s, socks) = (counters.clone(), stop.clone(), sockets.clone());
        let accept = thread::Builder::new()
            .name("relay-accept".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(client) = conn else { continue };
                    let dial = Dial {
                        upstream,
                        wait: opts.upstream_wait,
                        stop: &s,
                    };
                    if let Err(e) = spawn_connection(client, dial, wire, opts, &c, &socks) {
                        tracing::warn!("relay: cannot reach the server {upstream}: {e}");
                    }
                }
            })?;
        Ok(Relay {
            addr,
            counters,
            stop,
            sockets,
            accept: Some(accept),
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The relay's traffic counters.
    pub fn counters(&self) -> &Arc<Counters> {
        &self.counters
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr); // wake the accept loop
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
        if let Ok(socks) = self.sockets.lock() {
            for s in socks.iter() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Where and how long a relay dials its upstream ([`RelayOptions::upstream_wait`]).
struct Dial<'a> {
    upstream: SocketAddr,
    wait: Duration,
    stop: &'a AtomicBool,
}

impl Dial<'_> {
    /// Connects, dialing again every 5 ms while refused, until `wait` has passed or the relay
    /// stops.
    fn connect(&self) -> io::Result<TcpStream> {
        let deadline = Instant::now() + self.wait;
        loop {
            match TcpStream::connect(self.upstream) {
                Err(e)
                    if e.kind() == io::ErrorKind::ConnectionRefused
                        && Instant::now() < deadline
                        && !self.stop.load(Ordering::SeqCst) =>
                {
                    thread::sleep(Duration::from_millis(5))
                }
                r => return r,
            }
        }
    }
}

fn spawn_connection(
    client: TcpStream,
    dial: Dial,
    wire: Wire,
    opts: RelayOptions,
    counters: &Arc<Counters>,
    sockets: &Arc<Mutex<Vec<TcpStream>>>,
) -> io::Result<()> {
    let server = match dial.connect() {
        Ok(s) => s,
        Err(e) => {
            let _ = client.shutdown(Shutdown::Both);
            return Err(e);
        }
    };
    client.set_nodelay(true)?;
    server.set_nodelay(true)?;
    if opts.protocol {
        counters.connection();
    }
    if let Ok(mut socks) = sockets.lock() {
        socks.retain(|s| s.peer_addr().is_ok());
        socks.push(client.try_clone()?);
        socks.push(server.try_clone()?);
    }
    let mut requests = RequestParser::new(opts.zero_hello_caps);
    if let Some(port) = opts.comm_rank0_port {
        requests = requests.comm_rank0_port(port);
    }
    let up = Direction::Up(requests);
    let down = Direction::Down(ResponseParser::default());
    let (p_up, p_down) = if opts.protocol {
        (Some(up), Some(down))
    } else {
        (Some(Direction::RawUp), Some(Direction::RawDown))
    };
    spawn_pump(
        "relay-c2s",
        client.try_clone()?,
        server.try_clone()?,
        wire,
        p_up,
        counters.clone(),
    )?;
    spawn_pump("relay-s2c", server, client, wire, p_down, counters.clone())?;
    Ok(())
}

/// Which way a pump forwards, with its parser (raw: bytes counted, nothing parsed).
enum Direction {
    Up(RequestParser),
    Down(ResponseParser),
    RawUp,
    RawDown,
}

impl Direction {
    fn feed(&mut self, data: &mut [u8], c: &Counters) {
        match self {
            Direction::Up(p) => p.feed(data, c),
            Direction::Down(p) => p.feed(data, c),
            Direction::RawUp => c.raw_bytes(true, data.len()),
            Direction::RawDown => c.raw_bytes(false, data.len()),
        }
    }
}

fn spawn_pump(
    name: &str,
    src: TcpStream,
    dst: TcpStream,
    wire: Wire,
    parser: Option<Direction>,
    counters: Arc<Counters>,
) -> io::Result<()> {
    let (tx, rx) = sync_channel::<(Instant, Vec<u8>)>(QUEUE_CHUNKS);
    let dst_w = dst.try_clone()?;
    thread::Builder::new()
        .name(format!("{name}-wire"))
        .spawn(move || writer(rx, dst_w))?;
    thread::Builder::new().name(name.into()).spawn(move || {
        let mut src = src;
        let mut parser = parser;
        let mut shaper = Shaper {
            wire,
            link_free: None,
        };
        let mut rbuf = vec![0u8; CHUNK];
        loop {
            let n = match src.read(&mut rbuf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let arrival = Instant::now();
            let mut buf = rbuf[..n].to_vec();
            if let Some(p) = parser.as_mut() {
                p.feed(&mut buf, &counters);
            }
            let at = shaper.deliver_at(arrival, n);
            if tx.send((at, buf)).is_err() {
                break;
            }
        }
        drop(tx); // the writer drains what is queued, then half-closes
        let _ = dst;
    })?;
    Ok(())
}

/// Delivers queued chunks at their instants.
fn writer(rx: Receiver<(Instant, Vec<u8>)>, mut dst: TcpStream) {
    for (at, data) in rx {
        wait_until(at);
        if dst.write_all(&data).is_err() {
            let _ = dst.shutdown(Shutdown::Both);
            return;
        }
    }
    let _ = dst.shutdown(Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback (one thread per connection).
    fn echo_server() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        thread::spawn(move || {
            for c in l.incoming() {
                let Ok(mut c) = c else { return };
                thread::spawn(move || {
                    let _ = c.set_nodelay(true);
                    let mut r = c.try_clone().unwrap();
                    let _ = io::copy(&mut r, &mut c);
                    let _ = c.shutdown(Shutdown::Write);
                });
            }
        });
        addr
    }

    /// A relay on a port fixed in advance reaches an upstream that starts listening only after
    /// the client connected (`upstream_wait`), and counts a raw stream's bytes each way.
    #[test]
    fn waits_for_a_late_upstream_and_counts_raw_bytes() {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let upstream = SocketAddr::from(([127, 0, 0, 1], port));
        let opts = RelayOptions {
            protocol: false,
            zero_hello_caps: false,
            upstream_wait: Duration::from_secs(10),
            ..RelayOptions::default()
        };
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let relay = Relay::on(listener, upstream, Wire::transparent(), opts).unwrap();
        let late = thread::spawn(move || {
            thread::sleep(Duration::from_millis(200));
            let (mut c, _) = TcpListener::bind(upstream).unwrap().accept().unwrap();
            let mut b = [0u8; 5];
            c.read_exact(&mut b).unwrap();
            c.write_all(&[9; 7]).unwrap();
        });
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        c.write_all(b"hello").unwrap();
        let mut b = [0u8; 7];
        c.read_exact(&mut b).unwrap();
        late.join().unwrap();
        assert_eq!(b, [9; 7]);
        let t = relay.counters().snapshot();
        assert_eq!((t.c2s_bytes, t.s2c_bytes, t.round_trips), (5, 7, 0));
    }

    #[test]
    fn shaper_serialises_back_to_back_chunks() {
        let mut s = Shaper {
            wire: Wire {
                one_way: Duration::from_micros(100),
                bytes_per_sec: Some(1e6),
            },
            link_free: None,
        };
        let t0 = Instant::now();
        let a = s.deliver_at(t0, 1000); // 1 ms on the wire
        let b = s.deliver_at(t0, 1000); // queued behind the first
        assert_eq!(a - t0, Duration::from_micros(1100));
        assert_eq!(b - t0, Duration::from_micros(2100));
        let later = t0 + Duration::from_secs(1);
        assert_eq!(s.deliver_at(later, 0) - later, Duration::from_micros(100));
    }

    #[test]
    fn wait_until_never_returns_early() {
        for us in [0u64, 50, 300, 1500] {
            let d = Instant::now() + Duration::from_micros(us);
            wait_until(d);
            assert!(Instant::now() >= d);
        }
    }

    /// Gross correctness only (never a tight timing bound: the machines are noisy): a ping
    /// through the emulated link takes at least the configured RTT, a bulk transfer at least its
    /// serialisation time, and the bytes arrive intact.
    #[test]
    fn emulated_link_is_never_faster_than_configured() {
        let echo = echo_server();
        let wire = Wire {
            one_way: Duration::from_millis(1),
            bytes_per_sec: Some(50e6),
        };
        let relay = Relay::start(
            echo,
            wire,
            RelayOptions {
                protocol: false,
                zero_hello_caps: false,
                ..RelayOptions::default()
            },
        )
        .unwrap();
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        c.set_nodelay(true).unwrap();
        let mut b = [0u8; 8];
        for i in 0..5u8 {
            let t = Instant::now();
            c.write_all(&[i; 8]).unwrap();
            c.read_exact(&mut b).unwrap();
            assert!(
                t.elapsed() >= Duration::from_millis(2),
                "RTT {:?} below the configured 2 ms",
                t.elapsed()
            );
            assert_eq!(b, [i; 8]);
        }
        // 1 MB each way at 50 MB/s: at least 20 ms of serialisation plus 2 ms of delay.
        let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let t = Instant::now();
        let mut w = c.try_clone().unwrap();
        let d2 = data.clone();
        let sender = thread::spawn(move || w.write_all(&d2).unwrap());
        let mut back = vec![0u8; data.len()];
        c.read_exact(&mut back).unwrap();
        sender.join().unwrap();
        assert!(
            t.elapsed() >= Duration::from_millis(22),
            "bulk took {:?}",
            t.elapsed()
        );
        assert!(back == data, "bytes changed in the relay");
    }

    #[test]
    fn transparent_relay_counts_protocol() {
        let echo = echo_server();
        let relay = Relay::start(echo, Wire::transparent(), RelayOptions::default()).unwrap();
        let mut c = TcpStream::connect(relay.addr()).unwrap();
        let mut frame = Vec::new();
        rpc_proto::Request::DeviceCount.encode(&mut frame);
        c.write_all(&frame).unwrap();
        let mut back = vec![0u8; frame.len()];
        c.read_exact(&mut back).unwrap();
        let t = relay.counters().snapshot();
        assert_eq!(t.round_trips, 1);
        assert_eq!(t.connections, 1);
        assert_eq!(t.c2s_bytes, 9);
    }
}
