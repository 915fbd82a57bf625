//! A session process serving its client ([`serve`]): the memory bound, the control line's
//! reader and the counters' reporter started, the session's budget, links and cache writes
//! routed to the front (`front_line.rs`), then the connection's commands from the one the front
//! read (or from HELLO), on the client's socket, until the client or the front ends it.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use rpc_session::{MemoryBudget, SessionConfig};
use tokio::sync::watch;

use super::contain::{limit_memory, restrict_syscalls};
use super::front_line::{
    read_front_lines, ArcFront, Front, FrontConnector, FrontKeeper, Handed, Reporter,
};
use crate::connection::ConnectionContext;
use crate::control::{SessionStart, SANDBOX_REFUSED};
use crate::rdma::RdmaConfig;
use crate::stats::{reported_counters, Stats};

/// How long a session process whose front is gone may take to finish its running command.
const FRONT_GONE_GRACE: Duration = Duration::from_secs(1);

/// Session side: serves the client on its socket (`handed`, stdin unless pooled) after its
/// HELLO, reporting to the front on the control line (stdout). Returns the process's exit
/// status.
pub(super) fn serve(start: SessionStart, config: Arc<SessionConfig>, handed: Handed) -> i32 {
    let span = tracing::info_span!("session", peer = %start.peer, pid = std::process::id());
    let _enter = span.enter();
    rpc_ggml::abort::abort_on_assertions();
    let Some(major) = rpc_proto::Major::from_number(start.major) else {
        tracing::error!(
            major = start.major,
            "session process started for an unknown protocol major"
        );
        return 2;
    };
    let options = Arc::new(start.options);
    let cache_dir = config.cache.as_ref().map(|w| w.dir().to_path_buf());
    // The front resolved the limits against the devices.
    let limits = options.memory(u64::MAX);
    if let Err(e) = limit_memory(options.sandbox, limits.per_connection) {
        tracing::error!("session refused: {e} (--no-sandbox serves without containment)");
        return SANDBOX_REFUSED;
    }
    let Handed { stream, ctl, early } = handed;
    let (stop_tx, stop_rx) = watch::channel(false);
    let reader = match ctl.try_clone() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cannot read the control line");
            return 2;
        }
    };
    // Replies and the front's stop. The end of the line means the front is gone (a front that
    // shuts down sends `Q` and keeps the line open until the session ends): the session stops,
    // and if its command does not finish within FRONT_GONE_GRACE (a long compute), the process
    // ends without it; no session outlives its server.
    // Set when the session ends: read by the front-gone watcher below and by the reporter.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let finished_seen = done.clone();
    let (front, answers) = Front::new(ctl, stop_tx);
    std::thread::spawn(move || {
        read_front_lines(reader, &early, |msg, fd| answers.deliver(msg, fd));
        let _ = answers.stop.send(true);
        let t = std::time::Instant::now();
        while !finished_seen.load(Relaxed) {
            if t.elapsed() >= FRONT_GONE_GRACE {
                tracing::warn!("the server's front process is gone; ending this session now");
                std::process::exit(3);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    let front = Arc::new(front);
    if let Some(cache) = &config.cache {
        // Only the front writes the cache: this session's stores and checks go to it.
        cache.delegate(Box::new(FrontKeeper(front.clone())));
    }
    let budget = Arc::new(MemoryBudget::with_upstream(
        rpc_session::MemoryLimits {
            per_connection: limits.per_connection,
            // The server-wide limit is the front's to enforce.
            total: u64::MAX,
        },
        Box::new(ArcFront(front.clone())),
    ));
    let local = match stream.local_addr() {
        Ok(a) => a,
        Err(e) => {
            tracing::error!(error = %e, "cannot use the client's socket");
            return 2;
        }
    };
    let comm = Arc::new(FrontConnector {
        front: front.clone(),
        policy: options.comm_policy(local),
        devices: config.devices.len(),
    });
    let rdma = match start.tcp_only {
        true => Arc::new(RdmaConfig::new(
            crate::rdma::TransportMode::Tcp,
            Default::default(),
            1,
        )),
        false => options.rdma_config(),
    };
    let stats = Arc::new(Stats::default());
    let reporter = {
        let (stats, rdma, config, front, done, budget) = (
            stats.clone(),
            rdma.clone(),
            config.clone(),
            front.clone(),
            done.clone(),
            budget.clone(),
        );
        std::thread::spawn(move || {
            let counters = reported_counters(&stats, &rdma, &config, &budget);
            let mut r = Reporter {
                last: vec![0; counters.len()],
            };
            while !done.load(Relaxed) {
                std::thread::park_timeout(Duration::from_millis(250));
                r.report(&counters, &front);
            }
            r.report(&counters, &front);
        })
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the session's runtime");
            return 2;
        }
    };
    let local_ip = local.ip();
    let tcp = rpc_transport::BlockingTcpTransport::new(
        stream,
        Some(stop_rx.clone()),
        options.poll_window,
    )
    .and_then(|mut t| match &start.pending {
        Some(h) => t.preload(h).map(|()| t),
        None => Ok(t),
    });
    let tcp = match tcp {
        Ok(t) => t,
        Err(e) => {
            tracing::error!(error = %e, "cannot use the client's socket");
            return 2;
        }
    };
    let (sandbox, selftest) = (options.sandbox, options.sandbox_selftest);
    let ctx = ConnectionContext {
        options,
        config,
        major,
        stats: stats.clone(),
        rdma,
        budget,
        comm: Some(comm),
        shutdown: stop_rx,
    };
    let ready = move || restrict_syscalls(sandbox, selftest, cache_dir.as_deref());
    let r = match start.pending {
        // The front answered the HELLO: the session starts at the command it read.
        Some(_) => rt.block_on(crate::connection::serve_commands(tcp, ctx, ready)),
        None => rt.block_on(crate::connection::serve_hello(
            tcp, local_ip, start.caps, ctx, ready,
        )),
    };
    done.store(true, Relaxed);
    reporter.thread().unpark();
    let _ = reporter.join();
    match r {
        Ok(()) => {
            tracing::info!("client connection closed");
            0
        }
        Err(e) => {
            tracing::error!("closing connection: {e}");
            1
        }
    }
}
