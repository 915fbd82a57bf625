//! Connections to a worker: TCP setup with bounded timeouts and keepalive, then HELLO and the
//! RDMA negotiation inside it in upstream's two flavors (client role, `rpc_client`).
//!
//! A per-client upstream connection is opened through a [`Connector`]. The [`RealConnector`]
//! offers RDMA in HELLO when the TCP socket's local address belongs to an RDMA device (the same
//! rule as a stock client), and falls back to TCP when the worker answers zero caps or activation
//! fails. With `--transport tcp` it never offers RDMA.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use rpc_client::negotiate_client;
use rpc_proto::{Command, Limits, Major};
use rpc_transport::rdma::negotiate::{ClientConfig, ClientConn};
use rpc_transport::rdma::real::RdmaOptions;
use rpc_transport::rdma::Flavor;
use rpc_transport::Transport;

pub use rpc_transport::cli::{FlavorChoice, TransportMode};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ShimError;

/// Timeouts and limits of a worker's connections.
#[derive(Debug, Clone)]
pub struct Options {
    /// TCP connect (per attempt).
    pub connect_timeout: Duration,
    /// HELLO reply, RDMA setup and readiness exchange.
    pub handshake_timeout: Duration,
    /// One query over the control connection (round trip).
    pub query_timeout: Duration,
    /// Fill the cache (DEVICE_COUNT, GET_ALIGNMENT, GET_MAX_SIZE of every device) as soon as the
    /// control connection is up, and open it at start-up.
    pub prefetch: bool,
    /// Frame checks applied to client requests.
    pub limits: Limits,
    /// TCP keepalive on upstream sockets: idle time before the first probe (`None`: off).
    pub keepalive: Option<Duration>,
    /// One endpoint: probe 8.0 workers for worker-to-worker links (LINK_*) and carry copies
    /// between two of ours over them (`--no-worker-links`: false).
    pub worker_links: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            connect_timeout: Duration::from_secs(5),
            handshake_timeout: Duration::from_secs(10),
            query_timeout: Duration::from_secs(30),
            prefetch: true,
            limits: Limits::default(),
            keepalive: Some(Duration::from_secs(10)),
            worker_links: true,
        }
    }
}

/// Opens per-client upstream connections to one worker, HELLO included.
pub trait Connector: Send + Sync + 'static {
    /// The connection after HELLO.
    type Conn: Transport + 'static;

    /// Connects, performs HELLO (and transport negotiation) and returns the connection with the
    /// protocol major the worker announced in its HELLO reply, within bounded time.
    fn open(&self) -> impl Future<Output = Result<(Self::Conn, Major), ShimError>> + Send;

    /// An activated RDMA connection failed in a way that points at the RDMA path itself (a
    /// corrupt or lost frame, an error completion, no completion in time): the client's connection
    /// has been closed (its session is gone with it); later connections should use TCP.
    fn rdma_failed(&self, _err: &io::Error) {}
}

/// Whether an error on an activated RDMA connection blames the RDMA path (rather than the
/// worker going away, which ends the stream or resets the anchor).
pub fn blames_rdma(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::InvalidData | io::ErrorKind::TimedOut | io::ErrorKind::Other
    )
}

// ---------------------------------------------------------------------------------------------
// Wire helpers
// ---------------------------------------------------------------------------------------------

/// Connects to `addr` (`host:port`, resolved on every call) within `opts.connect_timeout`, with
/// `TCP_NODELAY` and keepalive.
pub async fn connect_tcp(addr: &str, opts: &Options) -> Result<TcpStream, ShimError> {
    let connect = async {
        let mut last = None;
        for a in tokio::net::lookup_host(addr).await? {
            match TcpStream::connect(a).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no address")))
    };
    let stream = match tokio::time::timeout(opts.connect_timeout, connect).await {
        Ok(Ok(s)) => s,
        Ok(Err(err)) => {
            return Err(ShimError::Connect {
                worker: addr.to_string(),
                err,
            })
        }
        Err(_) => return Err(timeout(addr, "TCP connect", opts.connect_timeout)),
    };
    stream.set_nodelay(true).map_err(|err| ShimError::Connect {
        worker: addr.to_string(),
        err,
    })?;
    if let Some(idle) = opts.keepalive {
        let ka = socket2::TcpKeepalive::new()
            .with_time(idle)
            .with_interval(Duration::from_secs(5))
            .with_retries(3);
        if let Err(e) = socket2::SockRef::from(&stream).set_tcp_keepalive(&ka) {
            tracing::debug!(worker = addr, "cannot enable TCP keepalive: {e}");
        }
    }
    Ok(stream)
}

pub(crate) fn timeout(worker: &str, what: &'static str, d: Duration) -> ShimError {
    ShimError::Timeout {
        worker: worker.to_string(),
        what,
        secs: d.as_secs_f64(),
    }
}

// ---------------------------------------------------------------------------------------------
// The real connector: TCP, or RDMA negotiated inside HELLO
// ---------------------------------------------------------------------------------------------

/// A per-client upstream connection opened by [`RealConnector`]: TCP, upstream's Linux RC or
/// Apple UC framing, or the lean framing (with our own rpc-server). Over RDMA the TCP socket
/// stays open as the liveness anchor, and the connection holds one slot of the RDMA budget.
pub struct Upstream {
    conn: ClientConn,
    _permit: Option<OwnedSemaphorePermit>,
}

impl Upstream {
    /// RDMA SENDs posted and receives completed (zero on TCP).
    pub fn rdma_counters(&self) -> (u64, u64) {
        self.conn.rdma_counters()
    }

    /// Whether the connection runs over RDMA.
    pub fn is_rdma(&self) -> bool {
        !matches!(self.conn, ClientConn::Tcp(_))
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        if self.is_rdma() {
            let (sends, recvs) = self.rdma_counters();
            tracing::info!(
                sends,
                recvs,
                transport = self.conn.name(),
                "RDMA connection to the worker done"
            );
        }
    }
}

impl Transport for Upstream {
    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.conn.read(buf).await
    }

    async fn read_exact(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.conn.read_exact(buf).await
    }

    async fn send_message(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        self.conn.send_message(parts).await
    }

    fn name(&self) -> &'static str {
        self.conn.name()
    }
}

/// RDMA settings of the shim.
#[derive(Debug, Clone)]
pub struct RdmaSettings {
    /// `--transport`.
    pub mode: TransportMode,
    /// The flavor offered.
    pub flavor: Flavor,
    /// Offer the lean framing too (taken only by our own rpc-server; a stock server answers
    /// with upstream's framing).
    pub lean: bool,
    /// Device / GID selection.
    pub opts: RdmaOptions,
    /// RDMA connections at once over all workers (Apple: ≤ 10 queue pairs per device, shared by
    /// every process); further connections use TCP.
    pub budget: Arc<Semaphore>,
}

impl RdmaSettings {
    /// Settings with a budget of `max_connections` queue pairs (lean framing offered).
    pub fn new(
        mode: TransportMode,
        flavor: Flavor,
        opts: RdmaOptions,
        max_connections: usize,
    ) -> RdmaSettings {
        RdmaSettings {
            mode,
            flavor,
            lean: true,
            opts,
            budget: Arc::new(Semaphore::new(max_connections.max(1))),
        }
    }

    /// TCP only.
    pub fn tcp() -> RdmaSettings {
        RdmaSettings::new(
            TransportMode::Tcp,
            Flavor::LinuxRc,
            RdmaOptions::default(),
            1,
        )
    }
}

/// Opens per-client connections to one worker: TCP connect, then HELLO with an RDMA offer
/// (`rpc_transport::rdma::negotiate::negotiate_client`, the same rules as a stock client, plus
/// the lean marker), then activation; TCP when RDMA does not engage.
pub struct RealConnector {
    addr: String,
    opts: Options,
    rdma: RdmaSettings,
    /// Set after an RDMA failure that cost a connection (RC has no way back to TCP on the same
    /// connection): later connections to this worker stay on TCP.
    rdma_off: AtomicBool,
    /// Whether "RDMA does not engage" was already logged at info level.
    told: AtomicBool,
}

impl RealConnector {
    /// A connector for the worker at `addr` (`host:port`).
    pub fn new(addr: impl Into<String>, opts: Options, rdma: RdmaSettings) -> RealConnector {
        RealConnector {
            addr: addr.into(),
            opts,
            rdma,
            rdma_off: AtomicBool::new(false),
            told: AtomicBool::new(false),
        }
    }

    /// Logs (once at info level) or, with `--transport rdma`, refuses a connection without RDMA.
    fn no_rdma(&self, why: &str) -> Result<(), ShimError> {
        if self.rdma.mode == TransportMode::Rdma {
            return Err(ShimError::RdmaRequired {
                worker: self.addr.clone(),
                reason: why.to_string(),
            });
        }
        if !self.told.swap(true, Relaxed) {
            tracing::info!(worker = %self.addr, "RDMA does not engage ({why}); using TCP");
        } else {
            tracing::debug!(worker = %self.addr, "RDMA does not engage ({why}); using TCP");
        }
        Ok(())
    }

    fn negotiation_error(&self, err: rpc_client::ClientError) -> ShimError {
        match err {
            rpc_client::ClientError::Io(e) if e.kind() == io::ErrorKind::TimedOut => timeout(
                &self.addr,
                "HELLO / RDMA setup",
                self.opts.handshake_timeout,
            ),
            err => ShimError::from_client(&self.addr, Command::Hello, err),
        }
    }

    async fn attempt(&self, offer_rdma: bool) -> Result<(Upstream, Major), ShimError> {
        let stream = connect_tcp(&self.addr, &self.opts).await?;
        let permit = if offer_rdma {
            self.rdma.budget.clone().try_acquire_owned().ok()
        } else {
            None
        };
        if offer_rdma && permit.is_none() {
            self.no_rdma("the RDMA connection budget (--rdma-max-connections) is used up")?;
        }
        let cfg = ClientConfig {
            rdma: permit.is_some(),
            flavor: self.rdma.flavor,
            lean: self.rdma.lean,
            opts: self.rdma.opts.clone(),
            timeout: self.opts.handshake_timeout,
        };
        let n = negotiate_client(stream, &cfg)
            .await
            .map_err(|e| self.negotiation_error(e))?;
        let major = n.client.major();
        let conn = n.client.into_transport();
        match n.why_tcp {
            Some(why) => {
                if cfg.rdma {
                    self.no_rdma(&why)?;
                }
                Ok((
                    Upstream {
                        conn,
                        _permit: None,
                    },
                    major,
                ))
            }
            None => {
                let flavor = match self.rdma.flavor {
                    Flavor::LinuxRc => "Linux RC flavor",
                    Flavor::AppleUc => "Apple UC flavor",
                };
                let framing = if matches!(conn, ClientConn::Lean(_)) {
                    "lean"
                } else {
                    "upstream"
                };
                tracing::info!(worker = %self.addr, transport = conn.name(), "RDMA activated ({flavor}, {framing} framing)");
                Ok((
                    Upstream {
                        conn,
                        _permit: permit,
                    },
                    major,
                ))
            }
        }
    }
}

impl Connector for RealConnector {
    type Conn = Upstream;

    fn rdma_failed(&self, err: &io::Error) {
        if self.rdma.mode == TransportMode::Rdma {
            tracing::error!(worker = %self.addr, "RDMA connection failed: {err} (--transport rdma: no TCP fallback)");
        } else if !self.rdma_off.swap(true, Relaxed) {
            tracing::warn!(worker = %self.addr, "RDMA connection failed: {err}; later connections to this worker use TCP");
        }
    }

    async fn open(&self) -> Result<(Upstream, Major), ShimError> {
        let offer = match self.rdma.mode {
            TransportMode::Tcp => false,
            TransportMode::Auto => !self.rdma_off.load(Relaxed),
            TransportMode::Rdma => true,
        };
        match self.attempt(offer).await {
            Err(ShimError::Upstream { err, .. }) if offer => {
                // The connection is unusable after the offer (e.g. an RC worker switched and our
                // activation failed, or it answered the other flavor): start over on TCP, and
                // stay there for this worker.
                self.rdma_off.store(true, Relaxed);
                self.no_rdma(&format!("RDMA negotiation failed: {err}"))?;
                self.attempt(false).await
            }
            r => r,
        }
    }
}
