//! A connection whose HELLO activated a queue pair: upstream's Linux RC flavor, its Apple UC
//! flavor, or our lean framing over either. One path for the three: the UC readiness byte where
//! the flavor has one (a client that could not activate keeps the connection on TCP), the TCP
//! socket kept idle as the liveness anchor, then the one command loop ([`super::run`]) over the
//! queue pair, and the counters when it ends.

use std::sync::Arc;
use std::time::Instant;

use rpc_proto::Limits;
use rpc_session::Session;
use rpc_transport::rdma::negotiate::{lean_name, READY};
use rpc_transport::rdma::{Flavor, Flavored, RdmaTransport};
use rpc_transport::BlockingTcpTransport;
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::{read_exact_by, run, ConnectionContext, ConnectionError};
use crate::options::Deadlines;
use crate::rdma::{Activated, RdmaConfig};
use crate::stats::Stats;

const READY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How one kind of activated queue pair is served.
struct Arm {
    /// The transport's name (logs, counters).
    name: &'static str,
    /// Upstream's UC readiness exchange comes first.
    ready_first: bool,
    /// The line that says it is active (tests look for it).
    activated: &'static str,
}

/// Serves `session` over the queue pair HELLO activated (see the module docs).
pub(super) async fn serve(
    tcp: BlockingTcpTransport,
    activated: Activated,
    session: Session,
    limits: Limits,
    ctx: ConnectionContext,
    deadlines: Deadlines,
) -> Result<(), ConnectionError> {
    let (stats, rdma, shutdown) = (ctx.stats, ctx.rdma, ctx.shutdown);
    let cx = Cx {
        session,
        limits,
        stats,
        deadlines,
        shutdown,
        rdma: &rdma,
    };
    // Each arm holds its permit (the queue-pair budget) until the connection ends.
    match activated {
        Activated::Rc(link, _permit) => {
            let arm = Arm {
                name: "RDMA/RC",
                ready_first: false,
                activated: "RDMA activated (Linux RC flavor)",
            };
            serve_on(tcp, link, arm, cx, |_| {}).await
        }
        Activated::Uc(link, _permit) => {
            let arm = Arm {
                name: "RDMA/UC",
                ready_first: true,
                activated: "RDMA activated (Apple UC flavor)",
            };
            serve_on(tcp, link, arm, cx, |_| {}).await
        }
        Activated::Lean(link, flavor, _permit) => {
            // Our own client: over UC the readiness exchange comes first, as for upstream's UC
            // flavor (receives are posted on both sides before any frame).
            let uc = flavor == Flavor::AppleUc;
            let arm = Arm {
                name: lean_name(flavor),
                ready_first: uc,
                activated: if uc {
                    "RDMA activated (lean framing over UC)"
                } else {
                    "RDMA activated (lean framing over RC)"
                },
            };
            serve_on(tcp, link, arm, cx, |t| {
                let lean = t.link().stats();
                tracing::info!(
                    data_frames = lean.data_frames,
                    credit_frames = lean.credit_frames,
                    inline_frames = lean.inline_frames,
                    bytes_sent = lean.bytes_sent,
                    frames_received = lean.frames_received,
                    "lean framing stats"
                );
            })
            .await
        }
    }
}

/// What the command loop needs besides the transport.
struct Cx<'a> {
    session: Session,
    limits: Limits,
    stats: Arc<Stats>,
    deadlines: Deadlines,
    shutdown: watch::Receiver<bool>,
    rdma: &'a RdmaConfig,
}

async fn serve_on<F: Flavored>(
    mut tcp: BlockingTcpTransport,
    link: F,
    arm: Arm,
    cx: Cx<'_>,
    after: impl FnOnce(&mut RdmaTransport<F>),
) -> Result<(), ConnectionError> {
    let Cx {
        session,
        limits,
        stats,
        deadlines,
        shutdown,
        rdma,
    } = cx;
    if arm.ready_first && !exchange_ready(&mut tcp).await? {
        rdma.fallback(crate::rdma::Fallback::ClientNotReady);
        drop(link);
        return run(&mut tcp, session, limits, stats, deadlines, shutdown).await;
    }
    let mut t = RdmaTransport::new(link, Some(into_anchor(tcp)?), arm.name);
    tracing::info!("{}", arm.activated);
    // The connection holds a queue pair: no idle timeout.
    let deadlines = deadlines.holding_queue_pair();
    let r = run(&mut t, session, limits, stats, deadlines, shutdown).await;
    after(&mut t);
    finish(rdma, &t);
    r
}

/// Upstream's UC readiness exchange: one byte each way over TCP, [`READY`] = ready. `Ok(false)`
/// when the client could not activate its side (the connection then stays on TCP).
async fn exchange_ready(tcp: &mut BlockingTcpTransport) -> Result<bool, ConnectionError> {
    use rpc_transport::Transport;
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

fn finish<F: Flavored>(rdma: &RdmaConfig, t: &RdmaTransport<F>) {
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
