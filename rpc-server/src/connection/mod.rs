//! One client connection: reads framed requests, feeds them to its [`Session`], writes replies.
//!
//! Framing (spec §3): `| cmd u8 | size u64 LE | payload |` in, `| size u64 LE | payload |` out,
//! only for commands that have a reply. Requests without a reply arrive pipelined, so the loop
//! reads strictly by framing, never in request/response lockstep. The one loop ([`run`]) serves
//! every transport: TCP here, an activated queue pair of either flavor or the lean framing
//! through `rdma.rs`.

mod framing;
mod rdma;

pub(crate) use framing::{encode_reply, read_hello, read_payload, send_reply};
use framing::{read_exact_by, read_header, read_streamed};

use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_proto::{check_frame, Command, DecodeError, FrameHeader, Limits, Major, Request, Response};
use rpc_session::{DataBody, MemoryBudget, Reply, Session, SessionConfig, SessionError};
use rpc_transport::{BlockingTcpTransport, Transport};
use tokio::sync::watch;

use crate::admission::Admitted;
use crate::options::{Deadlines, ServerOptions};
use crate::rdma::RdmaConfig;
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
    /// at the connection's address). A session process asks its front (`child/`).
    pub comm: Option<Arc<dyn rpc_session::peer::Connector>>,
    pub shutdown: watch::Receiver<bool>,
}

/// Serves a connection whose HELLO (`caps`) has been read: the reply (transport negotiation),
/// then the command loop over TCP or RDMA. In this process, or in a session process of its own
/// (`child/`). `ready` runs once the transport is set up, before the first command is read
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
    let Some(activated) = activated else {
        if let Some(s) = slot {
            s.release();
        }
        let (stats, shutdown) = (ctx.stats, ctx.shutdown);
        let scope = Scope::Session(slot);
        run_in(&mut tcp, session, limits, stats, deadlines, shutdown, scope).await?;
        return Ok(());
    };
    rdma::serve(tcp, activated, session, limits, ctx, deadlines).await
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
    let scope = Scope::Session(None);
    run_in(rd, session, limits, stats, deadlines, shutdown, scope).await?;
    Ok(())
}

/// What one run of the command loop serves.
#[derive(Clone, Copy)]
pub(crate) enum Scope<'a> {
    /// Every command, until the client closes or the server stops. With a slot of this
    /// process's: while the session holds nothing the connection may be evicted between
    /// commands; before acting on a command it claims the slot (an evicted connection ends
    /// there, unserved), and gives the claim back once the session holds nothing again.
    Session(Option<&'a Admitted>),
    /// The front of a contained connection before its hand-off: only what
    /// [`Scope::front_answers`] says; the loop stops before any other command and returns its
    /// header, nothing of its body read.
    FrontQueries,
}

impl<'a> Scope<'a> {
    /// The queries a contained server's front answers itself: they read only what every
    /// session sees the same (the devices), carry a few bytes and change nothing. That is
    /// rpc-proto's [`Command::is_device_property`]: the device queries but GET_ALLOC_SIZE,
    /// whose tensors may name a buffer only a session knows.
    fn front_answers(cmd: Command, size: u64) -> bool {
        cmd.is_device_property() && size <= 64
    }

    fn serves(self, cmd: Command, size: u64) -> bool {
        match self {
            Scope::Session(_) => true,
            Scope::FrontQueries => Self::front_answers(cmd, size),
        }
    }

    fn slot(self) -> Option<&'a Admitted> {
        match self {
            Scope::Session(slot) => slot,
            Scope::FrontQueries => None,
        }
    }
}

/// The one command loop: [`run`] in a `scope` (a session's, with or without a slot of this
/// process's, or the front's queries before a hand-off). Returns the header of the command it
/// stopped before (only [`Scope::FrontQueries`] stops so), else `None`.
pub(crate) async fn run_in<T: Transport>(
    rd: &mut T,
    mut session: Session,
    limits: Limits,
    stats: Arc<Stats>,
    deadlines: Deadlines,
    mut shutdown: watch::Receiver<bool>,
    scope: Scope<'_>,
) -> Result<Option<FrameHeader>, ConnectionError> {
    let slot = scope.slot();
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
        if !scope.serves(cmd, h.size) {
            return Ok(Some(h));
        }
        // A token's server-side time starts with its GRAPH_RECOMPUTE's header (read just now).
        let arrived = (cmd == Command::GraphRecompute).then(Instant::now);
        if let Some(body) = DataBody::of(cmd, h.size) {
            read_streamed(rd, &mut session, body, deadlines.stall)
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
    Ok(None)
}
