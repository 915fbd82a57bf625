//! One remote worker: its query cache, its control connection and its liveness signal.
//!
//! # Control connection
//!
//! A task per worker owns one TCP connection to it (opened at start-up, and again on demand). It
//! carries the queries of client connections that have no upstream connection of their own
//! (GET_DEVICE_MEMORY, cache misses), one at a time, and fills the cache at connect time
//! (DEVICE_COUNT, then GET_ALIGNMENT and GET_MAX_SIZE of every device), so the stock client's
//! burst of short connections during model load costs no network round trip and no queue pair.
//! It stays on TCP: it carries a handful of queries per model load, and a queue pair is scarce
//! (Apple: ≤ 10 per device).
//!
//! The stock `ggml-rpc-server` serves **one connection at a time** (the next waits in the accept
//! backlog until the current one closes). So the control connection is released as soon as a
//! client connection opens its own upstream connection, and reopened when the last of those
//! closes (or on demand), before the next burst of short connections arrives.
//!
//! # Liveness
//!
//! While idle, the control task watches its connection. A worker may close it after its idle
//! timeout (it holds nothing): the task reconnects at once. If the worker cannot be reached again
//! (process killed, machine gone), or the connection fails, [`Worker::down`] fires and every client connection without
//! an upstream connection of its own is closed, like a direct client connection would be.

use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rpc_client::Client;
use rpc_proto::{Command, Major, Request};
use rpc_transport::{TcpTransport, Transport};
use tokio::sync::{mpsc, oneshot, watch};

use crate::cache::{QueryCache, DEVICE_COUNT_FRAME};
use crate::error::ShimError;
use crate::stats::ShimStats;
use crate::upstream::{connect_tcp, timeout, Connector, Options};

/// The control connection: a client over TCP.
type Control = Client<TcpTransport>;

/// A control connection the worker closes sooner than this after it was opened is not reopened
/// (that worker is refusing us, not timing out an idle connection).
const MIN_CONTROL_LIFE: Duration = Duration::from_secs(1);

/// What the control task is asked to do.
enum ControlMsg {
    /// Forward a query frame, answer its response payload.
    Query {
        frame: Vec<u8>,
        reply: oneshot::Sender<Result<Vec<u8>, ShimError>>,
    },
    /// Close the control connection (a client connection is opening its own).
    Release,
    /// Connect (and prefetch) now if not connected.
    Warmup,
}

/// State shared by a worker's client connections and its control task.
pub(crate) struct Core {
    /// `host:port` of the worker.
    pub addr: String,
    pub cache: QueryCache,
    pub stats: Arc<ShimStats>,
    pub opts: Options,
    down: watch::Sender<u64>,
    /// Client connections holding an upstream connection of their own.
    sessions: AtomicUsize,
    /// The major the worker announced in its last HELLO reply (0: not known yet).
    major: AtomicU8,
    /// What LINK_PROBE found: [`LINKS_UNKNOWN`] before the first probe, 0 for a worker
    /// without our LINK_* extension (stock), else the RPC port it serves on.
    link_port: AtomicU32,
}

/// [`Core::link_port`] before the worker was probed.
const LINKS_UNKNOWN: u32 = u32::MAX;

impl Core {
    /// Signals that the worker is gone: client connections without their own upstream close.
    pub fn mark_down(&self) {
        self.down.send_modify(|n| *n += 1);
    }

    /// The protocol major the worker announced in its last HELLO reply, once one was read.
    pub fn major(&self) -> Option<Major> {
        Major::from_number(self.major.load(SeqCst))
    }

    /// What LINK_PROBE found: `None` before the first probe, `Some(None)` for a worker without
    /// worker-to-worker links, `Some(Some(port))` for one of ours serving on `port`.
    pub fn links(&self) -> Option<Option<u16>> {
        match self.link_port.load(SeqCst) {
            LINKS_UNKNOWN => None,
            p => Some(u16::try_from(p).ok().filter(|&p| p != 0)),
        }
    }

    /// Records what LINK_PROBE found (see [`Core::links`]).
    pub fn set_links(&self, port: Option<u16>) {
        let old = self.link_port.swap(port.map_or(0, u32::from), SeqCst);
        if old == LINKS_UNKNOWN {
            match port {
                Some(port) => tracing::info!(worker = %self.addr, port,
                    "the worker has worker-to-worker links (LINK_*)"),
                None => tracing::info!(worker = %self.addr,
                    "the worker has no worker-to-worker links (a stock server): copies from and to it pass through the shim"),
            }
        }
    }

    /// Records the major of a HELLO reply of the worker (control or upstream connection).
    pub fn set_major(&self, major: Major) {
        let old = self.major.swap(major.number(), SeqCst);
        if old != major.number() {
            tracing::info!(worker = %self.addr, "the worker speaks protocol {major}");
        }
    }

    async fn open_control(&self) -> Result<Control, ShimError> {
        let stream = connect_tcp(&self.addr, &self.opts).await?;
        let mut t =
            Client::new(TcpTransport::new(stream).map_err(ShimError::upstream(&self.addr))?);
        match tokio::time::timeout(self.opts.handshake_timeout, t.hello()).await {
            Ok(r) => {
                r.map_err(|e| ShimError::from_client(&self.addr, Command::Hello, e))?;
            }
            Err(_) => {
                return Err(timeout(
                    &self.addr,
                    "HELLO on the control connection",
                    self.opts.handshake_timeout,
                ))
            }
        }
        self.set_major(t.major());
        ShimStats::inc(&self.stats.control_connections);
        tracing::debug!(worker = %self.addr, "control connection up");
        if self.opts.prefetch {
            self.prefetch(&mut t).await?;
        }
        Ok(t)
    }

    /// Fills the cache with the device count and every device's alignment and maximum size.
    async fn prefetch(&self, t: &mut Control) -> Result<(), ShimError> {
        let count = match self.cache.device_count() {
            Some(n) => n,
            None => {
                let rsp = self.query_on(t, &DEVICE_COUNT_FRAME).await?;
                self.cache.insert(&DEVICE_COUNT_FRAME, &rsp);
                self.cache.device_count().unwrap_or(0)
            }
        };
        for device in 0..count.min(64) {
            for req in [
                Request::GetAlignment { device },
                Request::GetMaxSize { device },
            ] {
                let mut frame = Vec::new();
                req.encode(&mut frame);
                if self.cache.get(&frame).is_none() {
                    let rsp = self.query_on(t, &frame).await?;
                    self.cache.insert(&frame, &rsp);
                }
            }
        }
        tracing::debug!(worker = %self.addr, devices = count, entries = self.cache.len(), "cache prefetched");
        Ok(())
    }

    async fn query_on(&self, t: &mut Control, frame: &[u8]) -> Result<Vec<u8>, ShimError> {
        ShimStats::inc(&self.stats.control_queries);
        let Some(cmd) = frame.first().and_then(|&b| t.major().command(b)) else {
            return Err(ShimError::Unsolicited(self.addr.clone()));
        };
        match tokio::time::timeout(self.opts.query_timeout, t.round_trip(frame)).await {
            Ok(r) => r.map_err(|e| ShimError::from_client(&self.addr, cmd, e)),
            Err(_) => Err(timeout(
                &self.addr,
                "query on the control connection",
                self.opts.query_timeout,
            )),
        }
    }
}

/// The control task: see the module docs.
async fn control_task(core: Arc<Core>, mut rx: mpsc::UnboundedReceiver<ControlMsg>) {
    enum Event {
        Msg(Option<ControlMsg>),
        Idle(std::io::Result<usize>),
    }
    let mut conn: Option<Control> = None;
    let mut opened = Instant::now();
    loop {
        let ev = match conn.as_mut() {
            Some(c) => {
                let mut probe = [0u8; 1];
                tokio::select! {
                    m = rx.recv() => Event::Msg(m),
                    r = c.transport_mut().read(&mut probe) => Event::Idle(r),
                }
            }
            None => Event::Msg(rx.recv().await),
        };
        let msg = match ev {
            Event::Msg(Some(m)) => m,
            Event::Msg(None) => break,
            Event::Idle(r) => {
                conn = None;
                let lived = opened.elapsed();
                match r {
                    // A worker may close a connection that holds nothing after its idle timeout
                    // (rpc-server --idle-timeout): that says nothing about the worker. It is gone
                    // only if it cannot be reached again.
                    Ok(0) if lived >= MIN_CONTROL_LIFE && core.sessions.load(SeqCst) == 0 => {
                        match core.open_control().await {
                            Ok(c) => {
                                tracing::debug!(worker = %core.addr, after_s = lived.as_secs(), "the worker closed the idle control connection; reconnected");
                                conn = Some(c);
                                opened = Instant::now();
                            }
                            Err(e) => {
                                tracing::warn!(worker = %core.addr, "the worker closed the idle control connection and cannot be reached again ({e}): worker gone");
                                core.mark_down();
                            }
                        }
                    }
                    Ok(0) => {
                        tracing::warn!(worker = %core.addr, "the worker closed the idle control connection: worker gone");
                        core.mark_down();
                    }
                    Ok(_) => {
                        tracing::warn!(worker = %core.addr, "the worker sent unsolicited bytes on the control connection");
                        core.mark_down();
                    }
                    Err(e) => {
                        tracing::warn!(worker = %core.addr, "control connection failed while idle: {e}");
                        core.mark_down();
                    }
                }
                continue;
            }
        };
        match msg {
            ControlMsg::Release => {
                if conn.take().is_some() {
                    tracing::debug!(worker = %core.addr, "control connection released (a client opened its own)");
                }
            }
            ControlMsg::Warmup => {
                // Not while a client connection has its own: a stock server would make this
                // connection wait in its backlog until that one closes.
                if conn.is_none() && core.sessions.load(SeqCst) == 0 {
                    match core.open_control().await {
                        Ok(c) => {
                            conn = Some(c);
                            opened = Instant::now();
                        }
                        Err(e) => {
                            tracing::warn!("{e} (will retry when a client needs the worker)");
                            if matches!(e, ShimError::Connect { .. } | ShimError::Timeout { .. }) {
                                core.mark_down();
                            }
                        }
                    }
                }
            }
            ControlMsg::Query { frame, reply } => {
                if conn.is_none() {
                    match core.open_control().await {
                        Ok(c) => {
                            conn = Some(c);
                            opened = Instant::now();
                        }
                        Err(e) => {
                            if matches!(e, ShimError::Connect { .. } | ShimError::Timeout { .. }) {
                                core.mark_down();
                            }
                            let _ = reply.send(Err(e));
                            continue;
                        }
                    }
                }
                let Some(c) = conn.as_mut() else { continue };
                let r = core.query_on(c, &frame).await;
                if r.is_err() {
                    // A server refuses a request by closing: the connection is gone either way.
                    conn = None;
                }
                let _ = reply.send(r);
            }
        }
    }
}

/// A worker as seen by the shim: cache, control task, connector for per-client connections.
pub struct Worker<C: Connector> {
    pub(crate) core: Arc<Core>,
    pub(crate) connector: C,
    control: mpsc::UnboundedSender<ControlMsg>,
}

impl<C: Connector> Worker<C> {
    /// Creates the worker and its control task (must be called inside a tokio runtime). With
    /// `opts.prefetch`, the control connection is opened and the cache filled right away.
    pub fn new(addr: impl Into<String>, connector: C, opts: Options) -> Arc<Worker<C>> {
        let (down, _) = watch::channel(0u64);
        let prefetch = opts.prefetch;
        let core = Arc::new(Core {
            addr: addr.into(),
            cache: QueryCache::default(),
            stats: Arc::default(),
            opts,
            down,
            sessions: AtomicUsize::new(0),
            major: AtomicU8::new(0),
            link_port: AtomicU32::new(LINKS_UNKNOWN),
        });
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(control_task(core.clone(), rx));
        if prefetch {
            let _ = tx.send(ControlMsg::Warmup);
        }
        Arc::new(Worker {
            core,
            connector,
            control: tx,
        })
    }

    /// `host:port` of the worker.
    pub fn addr(&self) -> &str {
        &self.core.addr
    }

    /// The worker's counters.
    pub fn stats(&self) -> &Arc<ShimStats> {
        &self.core.stats
    }

    /// The protocol major the worker announced in its last HELLO reply (`None` before the
    /// first connection to it).
    pub fn major(&self) -> Option<Major> {
        self.core.major()
    }

    /// The worker's query cache.
    pub fn cache(&self) -> &QueryCache {
        &self.core.cache
    }

    /// A receiver that changes whenever the worker is found gone.
    pub fn down(&self) -> watch::Receiver<u64> {
        self.core.down.subscribe()
    }

    /// Sends a query frame over the control connection and returns the response payload.
    pub(crate) async fn query(&self, frame: Vec<u8>) -> Result<Vec<u8>, ShimError> {
        let (reply, rx) = oneshot::channel();
        self.control
            .send(ControlMsg::Query { frame, reply })
            .map_err(|_| ShimError::WorkerDown(self.core.addr.clone()))?;
        rx.await
            .map_err(|_| ShimError::WorkerDown(self.core.addr.clone()))?
    }

    /// Asks the control task to close its connection (stock servers serve one connection at a
    /// time, and a client connection is about to open its own).
    pub(crate) fn release_control(&self) {
        let _ = self.control.send(ControlMsg::Release);
    }

    /// A client connection now holds an upstream connection of its own.
    pub(crate) fn session_opened(&self) {
        self.core.sessions.fetch_add(1, SeqCst);
    }

    /// A client connection closed its own upstream connection. When it was the last one, the
    /// control connection is reopened (with `prefetch`), so the next client's queries cost no
    /// connection setup and a dead worker is noticed while idle.
    pub(crate) fn session_closed(&self) {
        if self.core.sessions.fetch_sub(1, SeqCst) == 1 && self.core.opts.prefetch {
            let _ = self.control.send(ControlMsg::Warmup);
        }
    }
}
