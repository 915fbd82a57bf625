//! The TCP listener: accepts connections concurrently (bounded) and shuts down gracefully (stop
//! accepting, let running commands finish, free everything).
//!
//! Admission (`admission.rs`): a connection from outside `--allow`, or from a peer that already
//! has its share of the slots, is closed before a byte is read. An accepted connection holds only
//! a handshake place until its HELLO arrives (within `--hello-timeout`), and one of the
//! `--max-connections` slots after: clients that connect and say nothing cannot fill the slots,
//! and when the slots are all taken a new client takes the slot of the oldest connection that
//! holds nothing (`admission::Slots`), so that clients which sent a HELLO and nothing else cannot
//! either.
//!
//! Each connection gets **its own OS thread** running a single-threaded runtime: its I/O, its
//! session and every ggml call it makes (graph compute included) stay on that one thread for the
//! connection's life. ggml's CPU backend starts its worker team (OpenMP) per calling thread; a
//! compute that hopped between runtime workers made a new team on each thread it landed on, and
//! those teams and the runtime's own workers competed with the one doing the work for the cores.
//! A token's round trip also crosses no thread: the thread that computed reads the next request.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use rpc_proto::{Limits, Major};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::admission::{default_peer_share, Admission, AllowList, PeerShares, Slots};
use crate::connection::{self, ConnectionContext, ConnectionError, ConnectionOptions};
use crate::rdma::{RdmaConfig, TransportMode};
use crate::session::{MemoryBudget, MemoryLimits, SessionConfig};
use crate::stats::{Refusal, Stats};

/// Listener settings.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub limits: Limits,
    /// Connections served at once (after their HELLO); further clients wait.
    pub max_connections: usize,
    /// Connections one peer (an IPv4 address, an IPv6 /64) may have at once, served or
    /// handshaking; more are closed unread. `None`: half of `max_connections`.
    pub max_per_peer: Option<usize>,
    /// Peers not held to a share (default: loopback).
    pub share_exempt: Vec<crate::admission::Cidr>,
    /// Addresses that may connect (empty: all).
    pub allow: AllowList,
    /// How long a new connection may take to send its whole HELLO.
    pub hello_timeout: Duration,
    /// The longest a started request may go without progress (every 1 MiB of a body and the
    /// rest of a frame header must arrive within it), whatever the idle timeout.
    pub request_timeout: Duration,
    /// RDMA negotiation settings.
    pub rdma: Arc<RdmaConfig>,
    /// ALLOC_BUFFER limits, per connection and for all connections together.
    pub memory: MemoryLimits,
    /// Close a connection that holds nothing and starts no request for this long (`None`:
    /// never); see [`ConnectionOptions::idle_timeout`].
    pub idle_timeout: Option<Duration>,
    /// TCP keepalive on every accepted connection (`None`: off); see [`set_keepalive`].
    pub keepalive: Option<Duration>,
    /// See [`ConnectionOptions::poll_window`].
    pub poll_window: Duration,
    /// On shutdown, how long running commands may take to finish before the server exits
    /// without them.
    pub shutdown_grace: Duration,
    /// A process per session (the binary's default, see `isolate.rs`); `None`: sessions run here.
    #[cfg(unix)]
    pub isolate: Option<Arc<crate::isolate::Isolation>>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            limits: Limits::default(),
            max_connections: 128,
            max_per_peer: None,
            share_exempt: crate::admission::loopback(),
            allow: AllowList::default(),
            hello_timeout: DEFAULT_HELLO_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            rdma: Arc::new(RdmaConfig::new(TransportMode::Auto, Default::default(), 8)),
            memory: MemoryLimits::default(),
            idle_timeout: None,
            keepalive: Some(DEFAULT_KEEPALIVE),
            poll_window: rpc_transport::tcp::DEFAULT_POLL_WINDOW,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            #[cfg(unix)]
            isolate: None,
        }
    }
}

/// Default `--hello-timeout`: a client sends HELLO as soon as it connects.
pub const DEFAULT_HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// Default `--request-timeout`: a body must arrive at 35 KB/s at least.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Default `--shutdown-grace`: below launchd's default `ExitTimeOut` (20 s), after which a
/// service is killed (a killed RDMA process can leave queue pairs behind).
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Default `--keepalive`: a vanished peer is found within about two minutes.
pub const DEFAULT_KEEPALIVE: Duration = Duration::from_secs(60);
/// Unanswered probes before the kernel declares the peer dead.
const KEEPALIVE_PROBES: u32 = 6;

fn keepalive_interval(idle: Duration) -> Duration {
    (idle / KEEPALIVE_PROBES).max(Duration::from_secs(1))
}

/// How long after its last sign of life a vanished peer is dropped with keepalive `idle`.
pub fn keepalive_deadline(idle: Duration) -> Duration {
    idle + keepalive_interval(idle) * KEEPALIVE_PROBES
}

/// Enables TCP keepalive so that a peer that vanished without a FIN or RST (power loss, cable
/// pulled, a machine that slept) is found although the connection is idle by design: the first
/// probe after `idle` of silence, then [`KEEPALIVE_PROBES`] probes `idle / 6` apart; the
/// connection fails after about `2 × idle` without an answer, and its buffers are freed. On Linux
/// `TCP_USER_TIMEOUT` bounds the same way a peer that vanished with data unacknowledged (keepalive
/// only probes a quiet connection).
pub fn set_keepalive(stream: &std::net::TcpStream, idle: Duration) -> std::io::Result<()> {
    let interval = keepalive_interval(idle);
    let ka = socket2::TcpKeepalive::new()
        .with_time(idle)
        .with_interval(interval);
    #[cfg(any(
        target_os = "linux",
        target_os = "macos",
        target_os = "android",
        target_os = "freebsd"
    ))]
    let ka = ka.with_retries(KEEPALIVE_PROBES);
    let sock = socket2::SockRef::from(stream);
    sock.set_tcp_keepalive(&ka)?;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    sock.set_tcp_user_timeout(Some(keepalive_deadline(idle)))?;
    Ok(())
}

/// Stack of a connection thread (it runs the validator and calls ggml's graph compute).
const CONNECTION_STACK: usize = 8 << 20;

/// Resolves `host:port` (IPv4, IPv6 or a host name) and binds the first address that works.
pub async fn bind(host: &str, port: u16) -> std::io::Result<TcpListener> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        match TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("no address for {host}"),
        )
    }))
}

/// A listening socket and the protocol major its connections speak (the HELLO request is the
/// same in both, so the port is what tells them apart).
pub struct Listener {
    pub socket: TcpListener,
    pub major: Major,
}

impl Listener {
    pub fn new(socket: TcpListener, major: Major) -> Listener {
        Listener { socket, major }
    }
}

/// The next connection on any of `listeners`, with the major of the one it came in on.
async fn accept_any(
    listeners: &[Listener],
) -> (std::io::Result<(tokio::net::TcpStream, SocketAddr)>, Major) {
    std::future::poll_fn(|cx| {
        for l in listeners {
            if let std::task::Poll::Ready(r) = l.socket.poll_accept(cx) {
                return std::task::Poll::Ready((r, l.major));
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Serves the connections of every listener (one set of slots, budgets and counters for all)
/// until `shutdown` resolves.
pub async fn serve(
    listeners: Vec<Listener>,
    config: Arc<SessionConfig>,
    opts: ServerOptions,
    stats: Arc<Stats>,
    shutdown: impl Future<Output = ()>,
) {
    let max = opts.max_connections.max(1);
    // Accepted connections waiting for their HELLO (or for a slot after it): as many as the
    // slots; further clients wait in the accept backlog.
    let handshakes = Arc::new(Semaphore::new(max));
    let slots = Slots::new(max, stats.clone());
    let shares = PeerShares::new(opts.max_per_peer.unwrap_or_else(|| default_peer_share(max)));
    let budget = Arc::new(MemoryBudget::new(opts.memory));
    stats.set_budget(budget.clone());
    let conn = ConnectionOptions {
        budget,
        idle_timeout: opts.idle_timeout,
        hello_timeout: opts.hello_timeout,
        request_timeout: opts.request_timeout,
        poll_window: opts.poll_window,
        #[cfg(unix)]
        isolate: opts.isolate.clone(),
        allow: opts.allow.clone(),
        comm: None,
    };
    let mut refusals = RefusalLog::default();
    let keepalive = opts.keepalive;
    let (stop_tx, stop_rx) = watch::channel(false);
    // Every connection thread holds a sender; `recv` answers `None` once all are gone.
    let (alive_tx, mut alive_rx) = mpsc::channel::<()>(1);
    tokio::pin!(shutdown);
    loop {
        let handshake = tokio::select! {
            p = handshakes.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = &mut shutdown => break,
        };
        let (stream, peer, major) = tokio::select! {
            (r, major) = accept_any(&listeners) => match r {
                Ok((s, p)) => (s, p, major),
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Closed unread (the stream is dropped) when the address or its peer's share says no.
        if !opts.allow.permits(peer.ip()) {
            stats.refuse(Refusal::NotAllowed);
            refusals.log(peer, Refusal::NotAllowed, "address not in --allow");
            continue;
        }
        let exempt = opts.share_exempt.iter().any(|c| c.contains(peer.ip()));
        let share = if exempt {
            None
        } else if let Some(share) = shares.try_take(peer.ip()) {
            Some(share)
        } else {
            stats.refuse(Refusal::PeerShare);
            refusals.log(
                peer,
                Refusal::PeerShare,
                "this peer already has its share of the connection slots (--max-connections-per-peer)",
            );
            continue;
        };
        let admission = Admission::new(handshake, slots.clone(), share);
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "cannot take over the accepted socket; dropping connection");
                continue;
            }
        };
        let ctx = ConnectionContext {
            config: config.clone(),
            major,
            limits: opts.limits,
            stats: stats.clone(),
            rdma: opts.rdma.clone(),
            conn: conn.clone(),
            shutdown: stop_rx.clone(),
        };
        let alive = alive_tx.clone();
        let spawned = std::thread::Builder::new().name("rpc-conn".into()).stack_size(CONNECTION_STACK).spawn(move || {
            let _alive = alive;
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return tracing::error!(%peer, error = %e, "cannot start the connection's runtime; dropping it"),
            };
            rt.block_on(handle(stream, peer, admission, keepalive, ctx));
        });
        if let Err(e) = spawned {
            tracing::error!(%peer, error = %e, "cannot start a thread for the connection; dropping it");
        }
    }
    tracing::info!("shutting down: no new connections, waiting for running commands");
    let _ = stop_tx.send(true);
    drop(listeners);
    drop(alive_tx);
    let grace = opts.shutdown_grace;
    if tokio::time::timeout(grace, alive_rx.recv()).await.is_err() {
        tracing::warn!(
            "connections still busy after {} s; exiting without them",
            grace.as_secs_f32()
        );
    }
}

async fn handle(
    stream: std::net::TcpStream,
    peer: SocketAddr,
    admission: Admission,
    keepalive: Option<Duration>,
    ctx: ConnectionContext,
) {
    let stats = ctx.stats.clone();
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(%peer, error = %e, "cannot set TCP_NODELAY; dropping connection");
        return;
    }
    if let Some(idle) = keepalive {
        if let Err(e) = set_keepalive(&stream, idle) {
            tracing::warn!(%peer, error = %e, "cannot enable TCP keepalive; dropping connection");
            return;
        }
    }
    stats.connections.fetch_add(1, Relaxed);
    stats.active.fetch_add(1, Relaxed);
    tracing::info!(%peer, "accepted client connection");
    let served = connection::serve(stream, admission, ctx);
    match served.await {
        Ok(()) => tracing::info!(%peer, "client connection closed"),
        Err(e @ ConnectionError::NoHello(_)) => {
            stats.refuse(Refusal::NoHello);
            tracing::info!(%peer, "closing connection: {e}");
        }
        Err(e) => {
            stats.closed_with_error.fetch_add(1, Relaxed);
            tracing::error!(%peer, "closing connection: {e}");
        }
    }
    stats.active.fetch_sub(1, Relaxed);
}

/// Logs refused connections without letting a flood of them flood the log: at most one line per
/// second per reason, with the count of those not logged.
#[derive(Default)]
struct RefusalLog {
    last: [Option<std::time::Instant>; Refusal::ALL.len()],
    unlogged: [u64; Refusal::ALL.len()],
}

impl RefusalLog {
    fn log(&mut self, peer: SocketAddr, why: Refusal, what: &str) {
        let i = why as usize;
        let now = std::time::Instant::now();
        if self.last[i].is_some_and(|t| now.duration_since(t) < Duration::from_secs(1)) {
            self.unlogged[i] += 1;
            return;
        }
        self.last[i] = Some(now);
        let more = std::mem::take(&mut self.unlogged[i]);
        tracing::warn!(%peer, refused_since_last_line = more, "refused connection: {what}");
    }
}
