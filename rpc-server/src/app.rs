//! The `rpc-server` program (also installed as `ggml-rpc-server`, upstream's name): parse flags,
//! pick devices, print the banner (`banner.rs`), serve; or, started as a session process
//! (`--session-child`, `--sandbox-probe`), hand over to `child/`. `src/main.rs` and
//! `src/bin/ggml-rpc-server.rs` call [`main`].

use std::sync::Arc;

use crate::banner::Banner;
use crate::cli::Args;
#[cfg(unix)]
use crate::control::SessionStart;
use crate::options::{Listen, ServerOptions};
use crate::rdma::{RdmaConfig, TransportMode};
use crate::server;
use crate::session_config::{device_line, session_config};
use crate::stats::Stats;
use anyhow::{bail, Context};
use clap::Parser;
use rpc_ggml::Device;
use rpc_session::SessionConfig;

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// The whole program: exits the process with status 1 on an error.
pub fn main() {
    if let Err(e) = real_main() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// What every process does first with its options, before any thread exists: the allocator
/// tuning (`rpc_ggml::tune_malloc`: a few malloc arenas, a fixed mmap threshold) and the log (to
/// stderr, filtered by `RPC_LOG` as read into the options; with the front's per-peer `limiter`).
fn start_up(options: &ServerOptions, ansi: bool, limiter: Option<crate::peer_log::PeerLimiter>) {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let (arenas, fixed_mmap_threshold) = options.malloc.plan(cores.clamp(2, 8));
    rpc_ggml::tune_malloc(arenas, fixed_mmap_threshold);
    let filter = options
        .log_filter
        .as_deref()
        .and_then(|f| tracing_subscriber::EnvFilter::try_new(f).ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"));
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .finish();
    tracing_subscriber::util::SubscriberInitExt::init(
        tracing_subscriber::layer::SubscriberExt::with(log, limiter),
    );
}

/// A session process (`--session-child`) or the containment probe (`--sandbox-probe`): the rest
/// is `child/`'s. Its log is limited where the front relays it (and a session process may start
/// no thread here); its options, the environment switches included, are the front's.
#[cfg(unix)]
fn session_process(args: &Args, ansi: bool) -> anyhow::Result<()> {
    let start = SessionStart::from_env()
        .context("a session process is started by its front, which passes its configuration")?
        .map_err(|e| anyhow::anyhow!("the front's message: {e}"))?;
    start_up(&start.options, ansi, None);
    crate::child::main(start, args.sandbox_probe, args.session_wait)
}

/// Flags, options, devices, banner, serve.
fn real_main() -> anyhow::Result<()> {
    let args = Args::parse();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    #[cfg(unix)]
    if args.session_child || args.sandbox_probe {
        return session_process(&args, ansi);
    }
    // The environment is read here, once (`options.rs` lists the switches).
    let opts = args.options().with_environment();
    // The front limits what each peer can make it log (`peer_log.rs`).
    let limiter = Some(crate::peer_log::PeerLimiter::new(ansi));
    start_up(&opts, ansi, limiter.clone());
    rpc_ggml::use_huge_pages(opts.session.huge_pages);
    rpc_ggml::load_backends_from(opts.backend_path.as_deref());

    if let Some(crate::cli::SubCommand::Doctor { peer, probe }) = &args.command {
        crate::doctor::protocols(probe.as_deref());
        crate::doctor::run(peer.as_deref());
        return Ok(());
    }
    let rdma = opts.rdma_config();
    check_rdma_usable(&rdma)?;
    if args.list_devices {
        list_devices();
        return Ok(());
    }
    let config = Arc::new(session_config(&opts.session, false)?);
    // Every session process will be contained, or the server does not start (fail closed).
    #[cfg(unix)]
    let containment = crate::child::probe_containment(&opts)?;
    #[cfg(not(unix))]
    let containment = None;

    // The listener's runtime: one thread that accepts and hands each connection to a thread of its
    // own (server.rs); nothing else runs here, so nothing competes with ggml for the cores.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listeners = bind_listeners(&opts.listen).await?;
        let metrics = bind_metrics(opts.listen.metrics.as_deref()).await?;
        Banner::new(
            &opts,
            &config,
            &rdma,
            &listeners,
            metrics.as_ref(),
            containment,
        )?
        .print();
        serve(listeners, metrics, config, opts, rdma).await;
        // What was dropped since the last summary.
        if let Some(l) = &limiter {
            l.report();
        }
        Ok(())
    })
}

/// `--list-devices`: every device, as the stock tool lists them.
fn list_devices() {
    println!("Available devices:");
    for d in Device::all() {
        println!("{}", device_line(&d));
    }
}

/// `--transport rdma` insists on RDMA: the server does not start without a usable device.
fn check_rdma_usable(rdma: &RdmaConfig) -> anyhow::Result<()> {
    if rdma.mode == TransportMode::Rdma {
        let usable = rdma_verbs::load().is_ok()
            && rdma_verbs::devices()
                .map(|d| !d.is_empty())
                .unwrap_or(false);
        if !usable {
            bail!(
                "--transport rdma: no usable RDMA device on this machine (run `rpc-server doctor`)"
            );
        }
    }
    Ok(())
}

/// Serves until SIGINT or SIGTERM: the listeners, and `--metrics` on the same runtime.
async fn serve(
    listeners: Vec<server::Listener>,
    metrics: Option<tokio::net::TcpListener>,
    config: Arc<SessionConfig>,
    opts: ServerOptions,
    rdma: Arc<RdmaConfig>,
) {
    let stats = Arc::new(Stats::default());
    if let Some(m) = metrics {
        let src = Arc::new(crate::metrics::Sources {
            stats: stats.clone(),
            rdma: rdma.clone(),
            config: config.clone(),
        });
        tokio::spawn(crate::metrics::serve(m, src));
    }
    server::serve(listeners, config, opts, stats, rdma, shutdown_signal()).await;
}

/// The RPC listeners of `listen` (`-H`, `-p`, `--proto7-port`).
async fn bind_listeners(listen: &Listen) -> anyhow::Result<Vec<server::Listener>> {
    let mut out = Vec::new();
    for (port, major) in listen.ports().map_err(anyhow::Error::msg)? {
        let socket = server::bind(&listen.host, port)
            .await
            .with_context(|| format!("cannot listen on {}:{port}", listen.host))?;
        out.push(server::Listener::new(socket, major));
    }
    Ok(out)
}

/// The `--metrics HOST:PORT` listener.
async fn bind_metrics(spec: Option<&str>) -> anyhow::Result<Option<tokio::net::TcpListener>> {
    let Some(spec) = spec else {
        return Ok(None);
    };
    let (host, port) = spec
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .with_context(|| format!("--metrics {spec}: expected HOST:PORT"))?;
    let l = server::bind(host, port)
        .await
        .with_context(|| format!("cannot listen for --metrics on {spec}"))?;
    Ok(Some(l))
}
