//! One client connection: reads framed requests, feeds them to its [`Session`], writes replies.
//!
//! Framing (spec §3): `| cmd u8 | size u64 LE | payload |` in, `| size u64 LE | payload |` out,
//! only for commands that have a reply. Requests without a reply arrive pipelined, so the loop
//! reads strictly by framing, never in request/response lockstep.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_proto::{check_frame, Command, DecodeError, FrameHeader, Limits, Major, Request, Response};
use rpc_transport::rdma::negotiate::{lean_name, READY};
use rpc_transport::rdma::{Flavor, RdmaTransport};
use rpc_transport::{BlockingTcpTransport, Transport};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::admission::Admitted;
use crate::options::{Deadlines, ServerOptions};
use crate::rdma::{Activated, RdmaConfig};
use crate::session::{
    Intake, MemoryBudget, Reply, Session, SessionConfig, SessionError, SetTensorBody,
};
use crate::stats::Stats;

/// Request bodies larger than this are charged to the memory budget while they are read and
/// handled (smaller ones, every per-token command among them, cost less than the accounting).
const CHARGE_MIN: u64 = 64 << 10;
/// Largest request buffer kept between commands.
const KEEP_PAYLOAD_CAPACITY: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed request: {0}")]
    Decode(#[from] DecodeError),
    #[error("{cmd}: {err}")]
    Session {
        cmd: &'static str,
        err: SessionError,
    },
    #[error("expected HELLO as the first command, got command {0} (client too old?)")]
    ExpectedHello(u8),
    #[error("request of {0} bytes does not fit in memory")]
    OutOfMemory(u64),
    #[error("request of {0} bytes is over the memory limits (--max-alloc-per-connection, --max-alloc-total)")]
    OverBudget(u64),
    #[error("no complete HELLO within {0} s of connecting")]
    NoHello(u64),
    #[error("silent for {0} s while holding no buffer or graph; closing")]
    Idle(u64),
    #[error("request stalled: no byte for {0} s in the middle of a request; closing")]
    Stalled(u64),
}

/// Reads a frame header: waits up to `idle` for its first byte (`Ok(None)` on a clean end of
/// stream before it), then up to `stall` for the rest. The first read asks for the whole header
/// (a transport that reads no further than asked, the front's, then takes it in one `recv`),
/// and the rest is read only if it did not all come.
async fn read_header<R: Transport>(
    rd: &mut R,
    idle: Option<Duration>,
    stall: Option<Duration>,
) -> Result<Option<FrameHeader>, ConnectionError> {
    let mut b = [0u8; rpc_proto::FRAME_HEADER_SIZE];
    let deadline = idle.map(|t| Instant::now() + t);
    let Some(n) = rd.read_by(&mut b, deadline).await? else {
        return Err(ConnectionError::Idle(idle.unwrap_or_default().as_secs()));
    };
    if n == 0 {
        return Ok(None);
    }
    if n < b.len() {
        read_body(rd, &mut b[n..], stall).await?;
    }
    Ok(Some(FrameHeader::decode(&b)))
}

/// Reads exactly `buf.len()` bytes by `deadline`: `Ok(false)` when it passed first.
async fn read_exact_by<R: Transport>(
    rd: &mut R,
    buf: &mut [u8],
    deadline: Option<Instant>,
) -> std::io::Result<bool> {
    let mut done = 0;
    while done < buf.len() {
        match rd.read_by(&mut buf[done..], deadline).await? {
            None => return Ok(false),
            Some(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "peer closed the connection mid-request",
                ))
            }
            Some(n) => done += n,
        }
    }
    Ok(true)
}

/// A session of this connection: its major, the shared budget, and the collectives link set up
/// from the address the client reached us at (`comm.rs`), unless the context brings its own way
/// (a session process asks its front).
fn new_session(ctx: &ConnectionContext, local: std::net::SocketAddr) -> Session {
    let mut s = Session::new(ctx.config.clone(), ctx.major, ctx.budget.clone());
    s.set_connector(match &ctx.comm {
        Some(c) => c.clone(),
        None => Arc::new(ctx.options.comm_policy(local)),
    });
    s
}

/// Bytes read per stall deadline: a body must keep arriving, however large it is.
const STALL_CHUNK: usize = 1 << 20;

/// Reads exactly `buf.len()` bytes of a request whose header has arrived; fails when no
/// [`STALL_CHUNK`] completes within `stall` (a slow link is fine, a silent one is not).
async fn read_body<R: Transport>(
    rd: &mut R,
    buf: &mut [u8],
    stall: Option<Duration>,
) -> Result<(), ConnectionError> {
    let Some(t) = stall else {
        return Ok(rd.read_exact(buf).await?);
    };
    for chunk in buf.chunks_mut(STALL_CHUNK) {
        if !read_exact_by(rd, chunk, Some(Instant::now() + t)).await? {
            return Err(ConnectionError::Stalled(t.as_secs()));
        }
    }
    Ok(())
}

/// Reads the HELLO that opens a connection, all of it `within` the given time; `Ok(None)` on a clean end
/// of stream before its first byte.
pub(crate) async fn read_hello<R: Transport>(
    rd: &mut R,
    within: Duration,
    major: Major,
    limits: &Limits,
) -> Result<Option<[u8; rpc_proto::CONN_CAPS_SIZE]>, ConnectionError> {
    let deadline = Instant::now() + within;
    let no_hello = || ConnectionError::NoHello(within.as_secs());
    let mut b = [0u8; rpc_proto::FRAME_HEADER_SIZE];
    match rd.read_by(&mut b[..1], Some(deadline)).await? {
        None => return Err(no_hello()),
        Some(0) => return Ok(None),
        Some(_) => {}
    }
    if !read_exact_by(rd, &mut b[1..], Some(deadline)).await? {
        return Err(no_hello());
    }
    let h = FrameHeader::decode(&b);
    if h.cmd != Command::Hello as u8 {
        return Err(ConnectionError::ExpectedHello(h.cmd));
    }
    check_frame(major, &h, limits)?;
    let mut caps = [0u8; rpc_proto::CONN_CAPS_SIZE];
    if !read_exact_by(rd, &mut caps, Some(deadline)).await? {
        return Err(no_hello());
    }
    Ok(Some(caps))
}

/// What serving one connection needs besides its socket: the server's options, shared state
/// and shutdown signal. One per connection (cloned from the server's).
#[derive(Clone)]
pub struct ConnectionContext {
    pub options: Arc<ServerOptions>,
    pub config: Arc<SessionConfig>,
    /// The protocol major of the listener this connection came in on.
    pub major: Major,
    pub stats: Arc<Stats>,
    pub rdma: Arc<RdmaConfig>,
    /// The memory account the session's buffers count against.
    pub budget: Arc<MemoryBudget>,
    /// How COMM_INIT sets up links; `None`: straight from this process (`comm::CommPolicy`
    /// at the connection's address). A session process asks its front (`child.rs`).
    pub comm: Option<Arc<dyn crate::comm::Connector>>,
    pub shutdown: watch::Receiver<bool>,
}

/// Serves a connection whose HELLO (`caps`) has been read: the reply (transport negotiation),
/// then the command loop over TCP or RDMA. In this process, or in a session process of its own
/// (`child.rs`). `ready` runs once the transport is set up, before the first command is read
/// (a session process applies its sandbox there).
pub async fn serve_hello<F: FnOnce()>(
    tcp: BlockingTcpTransport,
    local_ip: std::net::IpAddr,
    caps: [u8; rpc_proto::CONN_CAPS_SIZE],
    ctx: ConnectionContext,
    ready: F,
) -> Result<(), ConnectionError> {
    serve_hello_in(tcp, local_ip, caps, ctx, ready, None).await
}

/// [`serve_hello`] for a connection that holds a slot of this process's (`slot`, when sessions
/// run here): it tells the slot when it holds something (see [`Admitted::claim`]).
pub(crate) async fn serve_hello_in<F: FnOnce()>(
    mut tcp: BlockingTcpTransport,
    local_ip: std::net::IpAddr,
    caps: [u8; rpc_proto::CONN_CAPS_SIZE],
    ctx: ConnectionContext,
    ready: F,
    slot: Option<&Admitted>,
) -> Result<(), ConnectionError> {
    let deadlines = ctx.options.deadlines();
    let limits = ctx.options.limits();
    // A queue pair is something held: not evicted while one may be set up, nor after.
    if slot.is_some_and(|s| !s.claim()) {
        return Ok(());
    }
    // Blocking (queue-pair setup): fine, this thread serves only this connection.
    let (reply_caps, activated) = crate::rdma::negotiate(&ctx.rdma, local_ip, &caps);
    let session = new_session(&ctx, tcp.local_addr()?);
    send_hello(&mut tcp, session.hello(reply_caps), &ctx.stats).await?;
    ready();
    let (stats, rdma, shutdown) = (ctx.stats, ctx.rdma, ctx.shutdown);
    let Some(activated) = activated else {
        if let Some(s) = slot {
            s.release();
        }
        return run_in(&mut tcp, session, limits, stats, deadlines, shutdown, slot).await;
    };
    match activated {
        Activated::Rc(link, _permit) => {
            let mut t = RdmaTransport::new(link, Some(into_anchor(tcp)?), "RDMA/RC");
            tracing::info!("RDMA activated (Linux RC flavor)");
            let r = run_rdma(&mut t, session, limits, stats, deadlines, shutdown).await;
            finish_rdma(&rdma, &t);
            r
        }
        Activated::Uc(link, _permit) => {
            if !exchange_ready(&mut tcp).await? {
                rdma.fallback(crate::rdma::Fallback::ClientNotReady);
                drop(link);
                return run(&mut tcp, session, limits, stats, deadlines, shutdown).await;
            }
            let mut t = RdmaTransport::new(link, Some(into_anchor(tcp)?), "RDMA/UC");
            tracing::info!("RDMA activated (Apple UC flavor)");
            let r = run_rdma(&mut t, session, limits, stats, deadlines, shutdown).await;
            finish_rdma(&rdma, &t);
            r
        }
        Activated::Lean(link, flavor, _permit) => {
            // Our own client: the lean framing. Over UC the readiness exchange comes first, as
            // for upstream's UC flavor (receives are posted on both sides before any frame).
            if flavor == Flavor::AppleUc && !exchange_ready(&mut tcp).await? {
                rdma.fallback(crate::rdma::Fallback::ClientNotReady);
                drop(link);
                return run(&mut tcp, session, limits, stats, deadlines, shutdown).await;
            }
            let anchor = into_anchor(tcp)?;
            let mut t = RdmaTransport::new(link, Some(anchor), lean_name(flavor));
            tracing::info!(
                "RDMA activated (lean framing over {})",
                if flavor == Flavor::AppleUc {
                    "UC"
                } else {
                    "RC"
                }
            );
            let r = run_rdma(&mut t, session, limits, stats, deadlines, shutdown).await;
            let lean = t.link().stats();
            tracing::info!(
                data_frames = lean.data_frames,
                credit_frames = lean.credit_frames,
                inline_frames = lean.inline_frames,
                bytes_sent = lean.bytes_sent,
                frames_received = lean.frames_received,
                "lean framing stats"
            );
            finish_rdma(&rdma, &t);
            r
        }
    }
}

/// Sends a session's HELLO reply ([`Session::hello`]), counted.
pub(crate) async fn send_hello(
    tcp: &mut BlockingTcpTransport,
    reply: Response,
    stats: &Stats,
) -> Result<(), ConnectionError> {
    let mut out = Vec::with_capacity(64);
    reply.encode(&mut out);
    stats.command(
        tcp.name(),
        Command::Hello,
        rpc_proto::CONN_CAPS_SIZE as u64,
        out.len() as u64,
    );
    let (head, body) = out.split_at(rpc_proto::RESPONSE_HEADER_SIZE.min(out.len()));
    tcp.send_message(&[head, body]).await?;
    Ok(())
}

/// A session process whose HELLO the front answered: serves the commands (over TCP), the first
/// of them preloaded into `tcp`. `ready` as for [`serve_hello`].
pub async fn serve_commands<F: FnOnce()>(
    mut tcp: BlockingTcpTransport,
    ctx: ConnectionContext,
    ready: F,
) -> Result<(), ConnectionError> {
    ready();
    let session = new_session(&ctx, tcp.local_addr()?);
    let (limits, deadlines) = (ctx.options.limits(), ctx.options.deadlines());
    run(
        &mut tcp,
        session,
        limits,
        ctx.stats,
        deadlines,
        ctx.shutdown,
    )
    .await
}

const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Upstream's UC readiness exchange: one byte each way over TCP, [`READY`] = ready. `Ok(false)`
/// when the client could not activate its side (the connection then stays on TCP).
async fn exchange_ready(tcp: &mut BlockingTcpTransport) -> Result<bool, ConnectionError> {
    tcp.send_message(&[&[READY]]).await?;
    let mut b = [0u8; 1];
    if !read_exact_by(tcp, &mut b, Some(Instant::now() + READY_TIMEOUT)).await? {
        return Err(ConnectionError::Io(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "no RDMA readiness byte from the client",
        )));
    }
    if b[0] != READY {
        tracing::warn!(
            "client could not activate RDMA (readiness byte {:#x}); staying on TCP",
            b[0]
        );
        return Ok(false);
    }
    Ok(true)
}

/// The TCP socket kept open, idle, as the liveness anchor of an RDMA connection (registered
/// with this thread's runtime: the RDMA transport waits on it).
fn into_anchor(tcp: BlockingTcpTransport) -> Result<TcpStream, ConnectionError> {
    let s = tcp.into_stream()?;
    s.set_nonblocking(true)?;
    Ok(TcpStream::from_std(s)?)
}

/// The command loop over an activated queue pair (the connection holds it: no idle timeout).
async fn run_rdma<F: rpc_transport::rdma::Flavored>(
    t: &mut RdmaTransport<F>,
    session: Session,
    limits: Limits,
    stats: Arc<Stats>,
    deadlines: Deadlines,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    let deadlines = deadlines.holding_queue_pair();
    run(t, session, limits, stats, deadlines, shutdown).await
}

fn finish_rdma<F: rpc_transport::rdma::Flavored>(rdma: &RdmaConfig, t: &RdmaTransport<F>) {
    let counters = t.counters();
    rdma.record(counters);
    let (idle, event_wakeups, timer_wakeups) = t.idle_stats();
    tracing::info!(
        sends = counters.0,
        recvs = counters.1,
        idle,
        event_wakeups,
        timer_wakeups,
        "RDMA connection done"
    );
}

/// The next request's header, or `None` when the client closed or the server stops (a blocking
/// transport notices the stop itself and fails the read). `idle`: how long the client may stay
/// silent before it.
pub(crate) async fn next_header<T: Transport>(
    rd: &mut T,
    idle: Option<Duration>,
    stall: Option<Duration>,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<Option<FrameHeader>, ConnectionError> {
    tokio::select! {
        biased;
        r = read_header(rd, idle, stall) => match r {
            Err(_) if *shutdown.borrow() => {
                tracing::debug!("closing connection for shutdown");
                Ok(None)
            }
            r => r,
        },
        _ = shutdown.changed() => {
            tracing::debug!("closing connection for shutdown");
            Ok(None)
        }
    }
}

/// A session's reply to a decoded request; its error names the command.
pub(crate) fn reply<'s>(
    session: &'s mut Session,
    cmd: Command,
    req: Request<'_>,
) -> Result<Option<Reply<'s>>, ConnectionError> {
    session.reply(req).map_err(|err| ConnectionError::Session {
        cmd: cmd.name(),
        err,
    })
}

/// The command loop after HELLO, over any transport.
pub async fn run<T: Transport>(
    rd: &mut T,
    session: Session,
    limits: Limits,
    stats: Arc<Stats>,
    deadlines: Deadlines,
    shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError> {
    run_in(rd, session, limits, stats, deadlines, shutdown, None).await
}

/// [`run`] for a connection that holds a slot of this process's (`slot`): while the session
/// holds nothing the connection may be evicted between commands; before acting on a command it
/// claims the slot (an evicted connection ends there, unserved), and gives the claim back once
/// the session holds nothing again.
async fn run_in<T: Transport>(
    rd: &mut T,
    mut session: Session,
    limits: Limits,
    stats: Arc<Stats>,
    deadlines: Deadlines,
    mut shutdown: watch::Receiver<bool>,
    slot: Option<&Admitted>,
) -> Result<(), ConnectionError> {
    // Whether `slot` is claimed (not evictable).
    let mut claimed = false;
    let mut out = Vec::with_capacity(64);
    let mut payload: Vec<u8> = Vec::new();
    let transport = rd.name();
    // The token under way: when its GRAPH_RECOMPUTE arrived and how long the recompute took.
    let mut token: Option<(Instant, Duration)> = None;
    loop {
        let holds = session.holds_state();
        if claimed && !holds {
            if let Some(s) = slot {
                s.release();
            }
            claimed = false;
        }
        let idle = if holds { None } else { deadlines.idle };
        let Some(h) = next_header(rd, idle, deadlines.stall, &mut shutdown).await? else {
            break;
        };
        if let (false, Some(s)) = (claimed, slot) {
            if !s.claim() {
                tracing::debug!("evicted for a new client before this command; closing");
                break;
            }
            claimed = true;
        }
        let major = session.major();
        let cmd = check_frame(major, &h, &limits)?;
        // A token's server-side time starts with its GRAPH_RECOMPUTE's header (read just now).
        let arrived = (cmd == Command::GraphRecompute).then(Instant::now);
        if Intake::of(cmd, h.size) == Intake::Streamed {
            read_streamed(rd, &mut session, h.size, deadlines.stall)
                .await
                .map_err(|e| e.named(cmd))?;
            stats.command(transport, cmd, h.size, 0);
            continue;
        }
        // A large body is charged to the memory budget on the size its header claims, before a
        // byte of it is read; memory is then taken only as its bytes arrive.
        let _charge = match h.size > CHARGE_MIN {
            true => Some(
                session
                    .budget()
                    .charge(session.allocated().1, h.size)
                    .ok_or(ConnectionError::OverBudget(h.size))?,
            ),
            false => None,
        };
        read_payload(rd, &mut payload, h.size, deadlines.stall).await?;
        let req = Request::decode(major, cmd, &payload, &limits)?;
        // Computes run right here: the connection's own thread (see `server.rs`).
        let computes = cmd.runs_graph();
        let started = computes.then(Instant::now);
        let reduce_started = (cmd == Command::CommAllreduce).then(Instant::now);
        let reply = reply(&mut session, cmd, req)?;
        if let Some(t0) = started {
            let took = t0.elapsed();
            stats.compute.observe(took);
            if let Some(arrived) = arrived {
                token = Some((arrived, took));
            }
        }
        let sent = reply.as_ref().map_or(0, |r| encode_reply(r, &mut out));
        // Counted before the reply leaves: whoever reads the counters after the client has its
        // answer sees this command.
        stats.command(transport, cmd, h.size, sent);
        if let Some(r) = &reply {
            send_reply(rd, r, &out).await?;
        }
        drop(reply);
        if let Some(reduce_started) = reduce_started {
            stats.allreduce.observe(reduce_started.elapsed());
            let (sent, received) = session.take_link_bytes();
            stats
                .comm_sent
                .fetch_add(sent, std::sync::atomic::Ordering::Relaxed);
            stats
                .comm_received
                .fetch_add(received, std::sync::atomic::Ordering::Relaxed);
        }
        if payload.capacity() > KEEP_PAYLOAD_CAPACITY {
            payload = Vec::new(); // do not hold on to a one-off large request for the session's life
        }
        if cmd == Command::GetTensor {
            if let Some((start, compute)) = token.take() {
                stats.token(start.elapsed(), compute);
            }
        }
    }
    Ok(())
}

/// Reads a request body of `size` bytes into `payload` (cleared first), growing it by at most
/// [`STALL_CHUNK`] ahead of the bytes received: memory follows the bytes that arrive, not the
/// size a header claims.
pub(crate) async fn read_payload<R: Transport>(
    rd: &mut R,
    payload: &mut Vec<u8>,
    size: u64,
    stall: Option<Duration>,
) -> Result<(), ConnectionError> {
    let size = usize::try_from(size).map_err(|_| ConnectionError::OutOfMemory(size))?;
    payload.clear();
    while payload.len() < size {
        let at = payload.len();
        let n = (size - at).min(STALL_CHUNK);
        payload
            .try_reserve(n)
            .map_err(|_| ConnectionError::OutOfMemory(size as u64))?;
        payload.resize(at + n, 0);
        read_body(rd, &mut payload[at..], stall).await?;
    }
    Ok(())
}

/// Encodes a reply into `out` (except GET_TENSOR's data, sent from where it is); returns its
/// size on the wire.
pub(crate) fn encode_reply(r: &Reply<'_>, out: &mut Vec<u8>) -> u64 {
    match r {
        Reply::Tensor(data) => (rpc_proto::RESPONSE_HEADER_SIZE + data.len()) as u64,
        Reply::Owned(Response::GetTensor(data)) => {
            (rpc_proto::RESPONSE_HEADER_SIZE + data.len()) as u64
        }
        Reply::Owned(r) => {
            out.clear();
            r.encode(out);
            out.len() as u64
        }
    }
}

/// Writes a reply encoded by [`encode_reply`] as upstream does: the size prefix and the payload
/// as two sends.
pub(crate) async fn send_reply<T: Transport>(
    t: &mut T,
    r: &Reply<'_>,
    out: &[u8],
) -> Result<(), ConnectionError> {
    let data: &[u8] = match r {
        Reply::Tensor(data) => data,
        Reply::Owned(Response::GetTensor(data)) => data,
        Reply::Owned(_) => {
            let (head, body) = out.split_at(rpc_proto::RESPONSE_HEADER_SIZE.min(out.len()));
            return Ok(t.send_message(&[head, body]).await?);
        }
    };
    let prefix = Response::header(data.len() as u64);
    t.send_message(&[&prefix, data]).await?;
    Ok(())
}

/// Reads a streamed body (SET_TENSOR) into the slices its session hands out, as they are
/// needed: the session decides where each byte goes (`session/body.rs`).
async fn read_streamed<R: Transport>(
    rd: &mut R,
    session: &mut Session,
    size: u64,
    stall: Option<Duration>,
) -> Result<(), StreamError> {
    let mut body = SetTensorBody::new(size);
    loop {
        let Some(mut space) = session.body_space(&mut body)? else {
            return Ok(());
        };
        read_body(rd, &mut space, stall).await?;
        drop(space);
        session.body_filled(&mut body)?;
    }
}

/// Why a streamed body failed: the transport, or the session (named by its command).
enum StreamError {
    Connection(ConnectionError),
    Session(SessionError),
}

impl From<ConnectionError> for StreamError {
    fn from(e: ConnectionError) -> Self {
        StreamError::Connection(e)
    }
}

impl From<SessionError> for StreamError {
    fn from(e: SessionError) -> Self {
        StreamError::Session(e)
    }
}

impl StreamError {
    fn named(self, cmd: Command) -> ConnectionError {
        match self {
            StreamError::Connection(e) => e,
            StreamError::Session(err) => ConnectionError::Session {
                cmd: cmd.name(),
                err,
            },
        }
    }
}
