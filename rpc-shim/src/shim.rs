//! Listening: one local port per worker and protocol major (8.0.0; 7.0.0 with `--proto7-port`),
//! or one port for all workers (`--one-endpoint`); one task per client connection.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rpc_proto::Major;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::upstream::Connector;
use crate::worker::Worker;
use crate::{endpoint, session};

/// Accepts client connections speaking `major` on `listener` for `worker` until `shutdown`
/// resolves. Client connections already running continue on their own tasks.
pub async fn serve<C: Connector>(
    listener: TcpListener,
    worker: Arc<Worker<C>>,
    major: Major,
    shutdown: impl Future<Output = ()>,
) {
    accept(listener, shutdown, |stream, peer| {
        tracing::debug!(%peer, worker = %worker.addr(), protocol = %major, "client connected");
        tokio::spawn(session::serve(stream, peer, worker.clone(), major));
    })
    .await
}

/// Accepts client connections of one endpoint over all `workers` (`--one-endpoint`), speaking
/// `major`, until `shutdown` resolves.
pub async fn serve_endpoint<C: Connector>(
    listener: TcpListener,
    workers: Arc<[Arc<Worker<C>>]>,
    major: Major,
    shutdown: impl Future<Output = ()>,
) {
    accept(listener, shutdown, |stream, peer| {
        tracing::debug!(%peer, workers = workers.len(), protocol = %major, "client connected to the one endpoint");
        tokio::spawn(endpoint::serve(stream, peer, workers.clone(), major));
    })
    .await
}

/// The accept loop: `on` for each connection, until `shutdown`.
async fn accept(
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    mut on: impl FnMut(TcpStream, SocketAddr),
) {
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        on(stream, peer);
    }
}

/// A one-endpoint listener in the background (see [`start_endpoint`]). Dropping it stops
/// accepting; running client connections continue.
pub struct RunningEndpoint<C: Connector> {
    /// The local address clients connect to.
    pub local: SocketAddr,
    /// The protocol its clients speak.
    pub major: Major,
    /// The workers behind it, in device order.
    pub workers: Arc<[Arc<Worker<C>>]>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl<C: Connector> Drop for RunningEndpoint<C> {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Binds `listen` and serves one endpoint over `workers` on it, from a background task.
pub async fn start_endpoint<C: Connector>(
    listen: &str,
    major: Major,
    workers: Arc<[Arc<Worker<C>>]>,
) -> io::Result<RunningEndpoint<C>> {
    let listener = TcpListener::bind(listen).await?;
    let local = listener.local_addr()?;
    let (stop, rx) = oneshot::channel::<()>();
    let w = workers.clone();
    let task = tokio::spawn(async move {
        serve_endpoint(listener, w, major, async {
            let _ = rx.await;
        })
        .await
    });
    Ok(RunningEndpoint {
        local,
        major,
        workers,
        stop: Some(stop),
        task: Some(task),
    })
}

/// A listener serving one worker in the background (see [`start`]). Dropping it stops
/// accepting; running client connections continue.
pub struct Running<C: Connector> {
    /// The local address clients connect to.
    pub local: SocketAddr,
    /// The protocol its clients speak.
    pub major: Major,
    /// The worker behind it.
    pub worker: Arc<Worker<C>>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl<C: Connector> Running<C> {
    /// `host:port` string of the local address, as given to `llama-cli --rpc`.
    pub fn endpoint(&self) -> String {
        self.local.to_string()
    }
}

impl<C: Connector> Drop for Running<C> {
    fn drop(&mut self) {
        crate::comm::unregister(self.local.port());
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.abort();
        }
    }
}

/// Binds `listen` and serves `worker` on it to clients speaking `major`, from a background task.
pub async fn start<C: Connector>(
    listen: &str,
    major: Major,
    worker: Arc<Worker<C>>,
) -> io::Result<Running<C>> {
    let listener = TcpListener::bind(listen).await?;
    let local = listener.local_addr()?;
    crate::comm::register(local.port(), worker.addr());
    let (stop, rx) = oneshot::channel::<()>();
    let w = worker.clone();
    let task = tokio::spawn(async move {
        serve(listener, w, major, async {
            let _ = rx.await;
        })
        .await
    });
    Ok(Running {
        local,
        major,
        worker,
        stop: Some(stop),
        task: Some(task),
    })
}
