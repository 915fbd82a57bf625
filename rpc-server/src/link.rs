//! The comm link's transport: the caps exchange and what it leads to (TCP, upstream's RDMA
//! flavors, or our lean framing), run in the process that will own the link's queue pair (a
//! session process, or the one process of `--no-isolate`), on a connection
//! [`crate::comm::CommPolicy::establish`] made and vetted.
//!
//! The roles are HELLO's (stock runs the same negotiation on the link): rank 1 is the client
//! (prepares a queue pair, sends its caps first, activates what the answer says), rank 0 the
//! server (reads the peer's caps, answers ours only if it can activate, else all zero). So a
//! stock RDMA-built 8.0 server in either rank moves partials over RDMA with one of ours, and
//! two of ours speak the lean framing. Everything is decided before the first partial: a link
//! that cannot activate stays on TCP (rank 0 answers zero caps; over UC either side's
//! readiness byte says no), except where upstream gives no way back (a stock rank 0 that
//! answered RC caps has switched: rank 1 must activate or the link fails, and COMM_INIT
//! answers 0). Every step has a deadline.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use rpc_proto::CONN_CAPS_SIZE;
use rpc_session::peer::PeerLink;
use rpc_transport::cli::TransportMode;
use rpc_transport::rdma::blocking::BlockingLink;
use rpc_transport::rdma::negotiate::{client_choice, lean_name, server_choice, Choice, READY};
use rpc_transport::rdma::real::{self, Prepared, RdmaOptions};
use rpc_transport::rdma::{Caps, Flavor, Flavored, KEEPALIVE};

/// Whether `b` is a caps block a ggml RPC server sends: all zero (no RDMA), or an RDMA offer in
/// one of upstream's two layouts (a queue-pair number of 24 bits, a psn or LID that fits it).
pub fn caps_well_formed(b: &[u8; CONN_CAPS_SIZE]) -> bool {
    b.iter().all(|&x| x == 0) || Caps::decode(b, Flavor::native()).is_some()
}

/// After a caps block, nothing may be waiting (a peer's partial only follows a request, which
/// has not been made yet; a service answering with an error line has more to say).
pub(crate) fn nothing_more(s: &TcpStream) -> std::io::Result<()> {
    nothing_more_after(s, 0)
}

/// [`nothing_more`] than the `unread` bytes still waiting on `s`.
pub(crate) fn nothing_more_after(s: &TcpStream, unread: usize) -> std::io::Result<()> {
    s.set_nonblocking(true)?;
    let mut buf = [0u8; CONN_CAPS_SIZE + 1];
    let r = s.peek(&mut buf[..unread + 1]);
    s.set_nonblocking(false)?;
    match r {
        Ok(n) if n > unread => Err(not_rpc("it sent more than a caps block")),
        Ok(0) => Err(not_rpc("it closed the connection after its caps")),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(()),
        Err(e) => Err(e),
    }
}

pub(crate) fn not_rpc(why: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("the peer is not a ggml RPC server: {why}"),
    )
}

/// What the link may use besides TCP (from the server's options: `--transport`,
/// `--rdma-device`, `--rdma-gid-index`, `GGML_RPC_NO_RDMA`, `RPC_RDMA_LEAN`).
#[derive(Debug, Clone)]
pub struct LinkRdma {
    /// The flavor offered as rank 1 (rank 0 answers the peer's).
    pub flavor: Flavor,
    pub mode: TransportMode,
    pub opts: RdmaOptions,
    /// Speak the lean framing with a peer that is ours.
    pub lean: bool,
}

impl LinkRdma {
    /// TCP only.
    pub fn off() -> LinkRdma {
        LinkRdma {
            flavor: Flavor::native(),
            mode: TransportMode::Tcp,
            opts: RdmaOptions::default(),
            lean: false,
        }
    }

    fn on(&self) -> bool {
        self.mode != TransportMode::Tcp
    }
}

/// The link over `stream` for `rank`, its caps exchanged here: every later read and write has
/// `io_timeout`.
pub fn finish(
    stream: TcpStream,
    rank: u32,
    rdma: &LinkRdma,
    io_timeout: Duration,
) -> std::io::Result<Box<dyn PeerLink>> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(io_timeout))?;
    stream.set_write_timeout(Some(io_timeout))?;
    let activated = match rank {
        0 => as_rank0(&stream, rdma)?,
        _ => as_rank1(&stream, rdma)?,
    };
    match activated {
        None => {
            tracing::info!(rank, "comm link: on TCP");
            Ok(Box::new(TcpLink { stream, rank }))
        }
        Some(link) => ready(stream, link, rank, io_timeout),
    }
}

/// An activated queue pair, before the UC readiness exchange.
enum Activated {
    Rc(rpc_transport::rdma::RcLink<real::RealQp>),
    Uc(rpc_transport::rdma::UcLink<real::RealQp>),
    Lean(rpc_transport::rdma::LeanLink<real::RealQp>, Flavor),
}

impl Activated {
    fn flavor(&self) -> Flavor {
        match self {
            Activated::Rc(_) => Flavor::LinuxRc,
            Activated::Uc(_) => Flavor::AppleUc,
            Activated::Lean(_, f) => *f,
        }
    }
}

fn activate(prepared: Prepared, peer: &Caps, lean: bool) -> std::io::Result<Activated> {
    let r = match (peer.flavor, lean) {
        (f, true) => prepared.activate_lean(peer).map(|l| Activated::Lean(l, f)),
        (Flavor::LinuxRc, false) => prepared.activate_rc(peer).map(Activated::Rc),
        (Flavor::AppleUc, false) => prepared.activate_uc(peer).map(Activated::Uc),
    };
    r.map_err(|e| std::io::Error::other(format!("RDMA activation: {e}")))
}

/// Rank 0, the server's role: the peer's caps (already vetted by the front), then ours, all
/// zero unless our queue pair is activated.
fn as_rank0(mut s: &TcpStream, rdma: &LinkRdma) -> std::io::Result<Option<Activated>> {
    let mut peer_caps = [0u8; CONN_CAPS_SIZE];
    s.read_exact(&mut peer_caps)?;
    if !caps_well_formed(&peer_caps) {
        return Err(not_rpc("its caps block is malformed"));
    }
    let mut reply = [0u8; CONN_CAPS_SIZE];
    let mut activated = None;
    if rdma.on() {
        if let Choice::Upstream(peer) | Choice::Lean(peer) =
            server_choice(&peer_caps, Flavor::native(), rdma.lean)
        {
            let lean = peer.lean && rdma.lean;
            let local = s.local_addr()?.ip();
            match real::prepare_with(local, peer.flavor, &rdma.opts, lean) {
                Ok(prepared) => {
                    let ours = prepared.caps();
                    match activate(prepared, &peer, lean) {
                        Ok(a) => {
                            reply = ours.encode();
                            activated = Some(a);
                        }
                        Err(e) => tracing::warn!("comm link: {e}; staying on TCP"),
                    }
                }
                Err(e) => tracing::info!("comm link: RDMA cannot engage ({e}); staying on TCP"),
            }
        }
    }
    s.write_all(&reply)?;
    Ok(activated)
}

/// Rank 1, the client's role: our caps (an offer if a queue pair could be prepared), then the
/// peer's answer.
fn as_rank1(mut s: &TcpStream, rdma: &LinkRdma) -> std::io::Result<Option<Activated>> {
    let prepared = match rdma.on() {
        true => {
            let local = s.local_addr()?.ip();
            match real::prepare_with(local, rdma.flavor, &rdma.opts, rdma.lean) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::info!("comm link: RDMA cannot engage ({e}); offering TCP");
                    None
                }
            }
        }
        false => None,
    };
    let offer = prepared.as_ref().map(|p| p.caps());
    s.write_all(&offer.map_or([0; CONN_CAPS_SIZE], |c| c.encode()))?;
    let mut answer = [0u8; CONN_CAPS_SIZE];
    s.read_exact(&mut answer)?;
    if !caps_well_formed(&answer) {
        return Err(not_rpc("its answer is not a caps block"));
    }
    let (Some(prepared), Some(offer)) = (prepared, offer) else {
        // A stock rank 0 answers its caps whatever we offered, and stays on TCP with our zeros.
        nothing_more(s)?;
        return Ok(None);
    };
    let choice = client_choice(&offer, &answer)
        .map_err(|e| std::io::Error::other(format!("RDMA negotiation on the link: {e}")))?;
    match choice {
        Choice::Tcp => {
            nothing_more(s)?;
            Ok(None)
        }
        Choice::Upstream(peer) => activate(prepared, &peer, false).map(Some),
        Choice::Lean(peer) => activate(prepared, &peer, true).map(Some),
    }
}

/// After activation: the UC readiness exchange (both framings, as upstream), then the link over
/// RDMA with the TCP connection as its anchor.
fn ready(
    stream: TcpStream,
    link: Activated,
    rank: u32,
    io_timeout: Duration,
) -> std::io::Result<Box<dyn PeerLink>> {
    if link.flavor() == Flavor::AppleUc {
        (&stream).write_all(&[READY])?;
        let mut b = [0u8; 1];
        (&stream).read_exact(&mut b)?;
        if b[0] != READY {
            tracing::warn!(
                "comm link: the peer could not activate RDMA (readiness byte {:#x}); on TCP",
                b[0]
            );
            return Ok(Box::new(TcpLink { stream, rank }));
        }
    }
    let l: Box<dyn PeerLink> = match link {
        Activated::Rc(l) => rdma_link(l, Flavor::LinuxRc, stream, rank, io_timeout, "RDMA/RC")?,
        Activated::Uc(l) => rdma_link(l, Flavor::AppleUc, stream, rank, io_timeout, "RDMA/UC")?,
        Activated::Lean(l, f) => rdma_link(l, f, stream, rank, io_timeout, lean_name(f))?,
    };
    Ok(l)
}

fn rdma_link<F: Flavored + Send + 'static>(
    link: F,
    flavor: Flavor,
    anchor: TcpStream,
    rank: u32,
    io_timeout: Duration,
    name: &'static str,
) -> std::io::Result<Box<dyn PeerLink>> {
    tracing::info!(rank, transport = name, "comm link: RDMA activated");
    let apple = flavor == Flavor::AppleUc;
    let link = Arc::new(Mutex::new(BlockingLink::new(link, Some(anchor), name)?));
    if apple {
        keep_warm(Arc::downgrade(&link));
    }
    Ok(Box::new(RdmaLink {
        link,
        rank,
        io_timeout,
    }))
}

/// Apple's queue pairs fall asleep after 1-2 s idle and take seconds to wake: between tokens a
/// thread ticks the link ([`BlockingLink::idle_tick`]: a keepalive once it has been idle for
/// `KEEPALIVE`), never while an allreduce holds it. It ends with the link, or at the link's first
/// error (the next allreduce then meets that error itself).
fn keep_warm<F: Flavored + Send + 'static>(link: Weak<Mutex<BlockingLink<F>>>) {
    let spawned = std::thread::Builder::new()
        .name("link-keepalive".into())
        .spawn(move || loop {
            std::thread::sleep(KEEPALIVE);
            let Some(link) = link.upgrade() else {
                return;
            };
            let tick = match link.try_lock() {
                Ok(mut l) => l.idle_tick(),
                Err(std::sync::TryLockError::WouldBlock) => continue,
                Err(std::sync::TryLockError::Poisoned(_)) => return,
            };
            if let Err(e) = tick {
                tracing::debug!("comm link keepalive stopped: {e}");
                return;
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("comm link: no keepalive thread ({e}); an idle Apple link may fall asleep");
    }
}

/// The link over TCP: the stock wire, no framing.
pub(crate) struct TcpLink {
    pub(crate) stream: TcpStream,
    pub(crate) rank: u32,
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

    fn send(&mut self, data: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(data)
    }

    fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        self.stream.read_exact(buf)
    }

    fn transport(&self) -> &'static str {
        "TCP"
    }
}

/// The link over RDMA: one message per partial each way, in the rank's order.
struct RdmaLink<F: Flavored> {
    /// Shared with the keepalive thread of an Apple-flavor link ([`keep_warm`]).
    link: Arc<Mutex<BlockingLink<F>>>,
    rank: u32,
    io_timeout: Duration,
}

impl<F: Flavored + Send> PeerLink for RdmaLink<F> {
    fn exchange(&mut self, send: &[u8], recv: &mut [u8]) -> std::io::Result<()> {
        let deadline = Instant::now() + self.io_timeout;
        let mut link = self.held()?;
        if self.rank == 0 {
            link.send(send, deadline)?;
            link.recv_exact(recv, deadline)
        } else {
            link.recv_exact(recv, deadline)?;
            link.send(send, deadline)
        }
    }

    fn send(&mut self, data: &[u8]) -> std::io::Result<()> {
        let deadline = Instant::now() + self.io_timeout;
        self.held()?.send(data, deadline)
    }

    fn recv(&mut self, buf: &mut [u8]) -> std::io::Result<()> {
        let deadline = Instant::now() + self.io_timeout;
        self.held()?.recv_exact(buf, deadline)
    }

    fn transport(&self) -> &'static str {
        self.held().map_or("RDMA", |l| l.name())
    }

    fn rdma_counters(&self) -> (u64, u64) {
        self.held().map_or((0, 0), |l| l.counters())
    }
}

impl<F: Flavored> RdmaLink<F> {
    /// The link, waiting for a keepalive tick that holds it (microseconds).
    fn held(&self) -> std::io::Result<std::sync::MutexGuard<'_, BlockingLink<F>>> {
        self.link
            .lock()
            .map_err(|_| std::io::Error::other("the link's keepalive thread panicked"))
    }
}
