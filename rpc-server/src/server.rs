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

use rpc_proto::Major;
use rpc_session::{MemoryBudget, SessionConfig};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch, Semaphore};
use tracing::Instrument;

use crate::admission::{Admission, PeerShares, Slots};
use crate::connection::{ConnectionContext, ConnectionError};
use crate::handoff::Isolation;
use crate::options::ServerOptions;
use crate::rdma::RdmaConfig;
use crate::stats::{Refusal, Stats};

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
/// probe after `idle` of silence, then `KEEPALIVE_PROBES` (6) probes `idle / 6` apart; the
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

/// What the devices have: the default of `--max-alloc-total` (a larger ALLOC_BUFFER would only
/// succeed through overcommit and end in the OOM killer). A device that reports less
/// (`-m/--mem`) counts with what it reports; one that reports more, with what it has.
pub fn device_memory(config: &SessionConfig) -> u64 {
    config
        .devices
        .iter()
        .map(|d| d.memory().1.min(d.actual_memory().1))
        .sum::<u64>()
        .max(1)
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
    rdma: Arc<RdmaConfig>,
    shutdown: impl Future<Output = ()>,
) {
    let max = opts.max_connections.max(1);
    // Accepted connections waiting for their HELLO (or for a slot after it): as many as the
    // slots; further clients wait in the accept backlog.
    let handshakes = Arc::new(Semaphore::new(max));
    let slots = Slots::new(max, stats.clone());
    let shares = PeerShares::new(opts.peer_share());
    let memory = opts.memory(device_memory(&config));
    let budget = Arc::new(MemoryBudget::new(memory));
    stats.set_budget(budget.clone());
    let isolate = match opts.isolate {
        true => match Isolation::new(&opts, memory) {
            Ok(iso) => Some(Arc::new(iso)),
            Err(e) => {
                tracing::error!(error = %e, "cannot find the executable to start session processes; serving none (--no-isolate)");
                return;
            }
        },
        false => None,
    };
    let allow = opts.allow_list();
    let keepalive = opts.keepalive;
    let grace = opts.shutdown_grace;
    let opts = Arc::new(opts);
    let mut refusals = RefusalLog::default();
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
        if !allow.permits(peer.ip()) {
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
            options: opts.clone(),
            config: config.clone(),
            major,
            stats: stats.clone(),
            rdma: rdma.clone(),
            budget: budget.clone(),
            comm: None,
            shutdown: stop_rx.clone(),
        };
        let isolate = isolate.clone();
        let alive = alive_tx.clone();
        let spawned = std::thread::Builder::new().name("rpc-conn".into()).stack_size(CONNECTION_STACK).spawn(move || {
            let _alive = alive;
            let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => return tracing::error!(%peer, error = %e, "cannot start the connection's runtime; dropping it"),
            };
            // Everything this connection makes the front log is charged to its peer
            // (`peer_log.rs`): an error span, so that no log level disables it.
            let span = tracing::error_span!("conn", %peer);
            rt.block_on(handle(stream, peer, admission, keepalive, ctx, isolate.as_deref()).instrument(span));
        });
        if let Err(e) = spawned {
            tracing::error!(%peer, error = %e, "cannot start a thread for the connection; dropping it");
        }
    }
    tracing::info!("shutting down: no new connections, waiting for running commands");
    let _ = stop_tx.send(true);
    drop(listeners);
    drop(alive_tx);
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
    isolate: Option<&Isolation>,
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
    let served = crate::front::serve(stream, admission, ctx, isolate);
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
