//! The TCP listener: accepts connections concurrently (bounded), one task per connection, and
//! shuts down gracefully (stop accepting, let running commands finish, free everything).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use rpc_proto::Limits;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use crate::connection::{self, ConnectionOptions};
use crate::rdma::{RdmaConfig, TransportMode};
use crate::session::{MemoryBudget, MemoryLimits, SessionConfig};
use crate::stats::Stats;

/// Listener settings.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    pub limits: Limits,
    /// Connections served at once; further clients wait in the accept backlog.
    pub max_connections: usize,
    /// RDMA negotiation settings.
    pub rdma: Arc<RdmaConfig>,
    /// ALLOC_BUFFER limits, per connection and for all connections together.
    pub memory: MemoryLimits,
    /// Close a connection that starts no request for this long (`None`: never).
    pub idle_timeout: Option<Duration>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            limits: Limits::default(),
            max_connections: 128,
            rdma: Arc::new(RdmaConfig::new(TransportMode::Auto, Default::default(), 8)),
            memory: MemoryLimits::default(),
            idle_timeout: None,
        }
    }
}

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
    Err(last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("no address for {host}"))))
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    config: Arc<SessionConfig>,
    opts: ServerOptions,
    stats: Arc<Stats>,
    shutdown: impl Future<Output = ()>,
) {
    let permits = Arc::new(Semaphore::new(opts.max_connections.max(1)));
    let conn = ConnectionOptions { budget: Arc::new(MemoryBudget::new(opts.memory)), idle_timeout: opts.idle_timeout };
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
            _ = &mut shutdown => break,
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        while tasks.try_join_next().is_some() {}
        let config = config.clone();
        let limits = opts.limits.clone();
        let stats = stats.clone();
        let stop = stop_rx.clone();
        let rdma = opts.rdma.clone();
        let conn = conn.clone();
        tasks.spawn(async move {
            let _permit = permit;
            handle(stream, peer, config, limits, stats, rdma, conn, stop).await;
        });
    }
    tracing::info!("shutting down: no new connections, waiting for running commands");
    let _ = stop_tx.send(true);
    drop(listener);
    let drain = async { while tasks.join_next().await.is_some() {} };
    if tokio::time::timeout(Duration::from_secs(30), drain).await.is_err() {
        tracing::warn!("connections still busy after 30 s; aborting them");
    }
}

#[allow(clippy::too_many_arguments)]
async fn handle(
    stream: TcpStream,
    peer: SocketAddr,
    config: Arc<SessionConfig>,
    limits: Limits,
    stats: Arc<Stats>,
    rdma: Arc<RdmaConfig>,
    conn: ConnectionOptions,
    stop: watch::Receiver<bool>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(%peer, error = %e, "cannot set TCP_NODELAY; dropping connection");
        return;
    }
    stats.connections.fetch_add(1, Relaxed);
    stats.active.fetch_add(1, Relaxed);
    tracing::info!(%peer, "accepted client connection");
    match connection::serve(stream, config, limits, stats.clone(), rdma, conn, stop).await {
        Ok(()) => tracing::info!(%peer, "client connection closed"),
        Err(e) => tracing::error!(%peer, "closing connection: {e}"),
    }
    stats.active.fetch_sub(1, Relaxed);
}
