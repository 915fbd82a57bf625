//! `rpc-shim`: see the crate docs (`rpc_shim`) and `rpc-shim --help`.

#![forbid(unsafe_code)]

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use rpc_proto::Major;
use rpc_shim::cli::Args;
use rpc_shim::{Options, RdmaSettings, RealConnector, TransportMode, Worker};

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RPC_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(args.threads))
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(run(args))
}

fn describe_transport(
    mode: TransportMode,
    flavor: rpc_transport::rdma::Flavor,
    lean: bool,
) -> String {
    if mode == TransportMode::Tcp {
        return "TCP only (--transport tcp / GGML_RPC_NO_RDMA)".into();
    }
    let devices = match rdma_verbs::load() {
        Err(e) => format!("no RDMA library: {e}"),
        Ok(()) => match rdma_verbs::devices() {
            Ok(d) if !d.is_empty() => format!(
                "devices: {}",
                d.iter()
                    .map(|d| d.name.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            _ => "no RDMA device".into(),
        },
    };
    let fallback = if mode == TransportMode::Rdma {
        "required: connections without it are refused"
    } else {
        "TCP otherwise"
    };
    format!(
        "offers {}{} in HELLO when a local RDMA device owns the route to the worker ({devices}); {fallback}",
        flavor.name(),
        if lean { " (+ lean framing with our rpc-server)" } else { "" }
    )
}

async fn run(args: Args) -> anyhow::Result<()> {
    let listen = args.listen_addrs().map_err(anyhow::Error::msg)?;
    let listen7 = args.proto7_addrs().map_err(anyhow::Error::msg)?;
    let mut mode = args.transport;
    if std::env::var_os("GGML_RPC_NO_RDMA").is_some() && mode == TransportMode::Auto {
        mode = TransportMode::Tcp;
    }
    let rdma_opts = args.rdma.rdma.options();
    if mode == TransportMode::Rdma {
        let usable = rdma_verbs::load().is_ok()
            && rdma_verbs::devices()
                .map(|d| !d.is_empty())
                .unwrap_or(false);
        if !usable {
            bail!(
                "--transport rdma: no usable RDMA device on this machine (see `rpc-server doctor`)"
            );
        }
    }
    let flavor = args.rdma.rdma_flavor.flavor();
    let mut rdma = RdmaSettings::new(mode, flavor, rdma_opts, args.rdma_max_connections);
    let lean_off = matches!(
        std::env::var("RPC_RDMA_LEAN")
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Ok("0" | "off" | "false" | "no")
    );
    rdma.lean = !(args.no_lean || lean_off);
    let opts = Options {
        connect_timeout: Duration::from_secs_f64(args.connect_timeout),
        handshake_timeout: Duration::from_secs_f64(args.handshake_timeout),
        query_timeout: Duration::from_secs_f64(args.query_timeout),
        prefetch: !args.no_prefetch,
        worker_links: !args.no_worker_links,
        ..Options::default()
    };

    if args.one_endpoint {
        return one_endpoint(&args, &listen, &listen7, opts, rdma, mode, flavor).await;
    }

    // One worker (cache, control connection) per --worker, behind its 8.0.0 listener and, with
    // --proto7-port, a 7.0.0 one.
    let mut running = Vec::new();
    for (i, (worker, local)) in args.workers.iter().zip(&listen).enumerate() {
        let w = Worker::new(
            worker.clone(),
            RealConnector::new(worker.clone(), opts.clone(), rdma.clone()),
            opts.clone(),
        );
        let locals =
            std::iter::once((local, Major::V8)).chain(listen7.get(i).map(|a| (a, Major::V7)));
        for (local, major) in locals {
            let r = rpc_shim::start(local, major, w.clone())
                .await
                .with_context(|| {
                    format!("cannot listen on {local} (protocol {major}, for worker {worker})")
                })?;
            running.push(r);
        }
    }

    println!(
        "rpc-shim {} — ggml RPC relay for TCP-only llama.cpp (protocol 8.0.0{})",
        env!("CARGO_PKG_VERSION"),
        if listen7.is_empty() {
            ""
        } else {
            "; 7.0.0 on the --proto7-port / --listen7 ports"
        }
    );
    println!(
        "  transport : {}",
        describe_transport(mode, flavor, rdma.lean)
    );
    for r in &running {
        println!("  {}  speaks {}  ->  {}", r.local, r.major, r.worker.addr());
    }
    for major in [Major::V8, Major::V7] {
        let eps: Vec<String> = running
            .iter()
            .filter(|r| r.major == major)
            .map(|r| r.endpoint())
            .collect();
        if !eps.is_empty() {
            println!(
                "  usage     : llama-cli -m MODEL --rpc {}   (llama.cpp speaking {major})",
                eps.join(",")
            );
        }
    }
    for r in &running {
        tracing::info!(listen = %r.local, protocol = %r.major, worker = %r.worker.addr(), "listening");
    }
    let running: Vec<Arc<_>> = running.into_iter().map(Arc::new).collect();

    until_signalled().await?;
    for r in running.iter().filter(|r| r.major == Major::V8) {
        let s = r.worker.stats().snapshot();
        tracing::info!(worker = %r.worker.addr(), ?s, "totals");
    }
    drop(running);
    Ok(())
}

/// Waits for Ctrl-C or SIGTERM.
async fn until_signalled() -> anyhow::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    Ok(())
}

/// `--one-endpoint`: every worker behind one 8.0.0 listener (and, with --proto7-port, one 7.0.0
/// listener).
async fn one_endpoint(
    args: &Args,
    listen: &[String],
    listen7: &[String],
    opts: Options,
    rdma: RdmaSettings,
    mode: TransportMode,
    flavor: rpc_transport::rdma::Flavor,
) -> anyhow::Result<()> {
    let workers: Arc<[Arc<Worker<RealConnector>>]> = args
        .workers
        .iter()
        .map(|w| {
            Worker::new(
                w.clone(),
                RealConnector::new(w.clone(), opts.clone(), rdma.clone()),
                opts.clone(),
            )
        })
        .collect();
    let mut running = Vec::new();
    let locals = listen
        .iter()
        .map(|a| (a, Major::V8))
        .chain(listen7.iter().map(|a| (a, Major::V7)));
    for (local, major) in locals {
        let r = rpc_shim::start_endpoint(local, major, workers.clone())
            .await
            .with_context(|| {
                format!("cannot listen on {local} (protocol {major}, one endpoint)")
            })?;
        running.push(r);
    }
    println!(
        "rpc-shim {} — ggml RPC relay for TCP-only llama.cpp: one endpoint over {} workers",
        env!("CARGO_PKG_VERSION"),
        workers.len()
    );
    println!(
        "  transport : {}",
        describe_transport(mode, flavor, rdma.lean)
    );
    for r in &running {
        println!(
            "  {}  speaks {}  ->  {}",
            r.local,
            r.major,
            args.workers.join(", ")
        );
        tracing::info!(listen = %r.local, protocol = %r.major, workers = args.workers.len(), "listening (one endpoint)");
    }
    println!("  devices   : each worker's, in this order (DEVICE_COUNT is their sum)");
    for r in &running {
        println!(
            "  usage     : llama-cli -m MODEL --rpc {}   (llama.cpp speaking {})",
            r.local, r.major
        );
    }
    until_signalled().await?;
    for w in workers.iter() {
        let s = w.stats().snapshot();
        tracing::info!(worker = %w.addr(), ?s, "totals");
    }
    drop(running);
    Ok(())
}
