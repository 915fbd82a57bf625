//! The `rpc-server` program (also installed as `ggml-rpc-server`, upstream's name): parse flags,
//! pick devices, print the banner, serve. `src/main.rs` and `src/bin/ggml-rpc-server.rs` call
//! [`main`].

use std::sync::Arc;

use crate::cache::{default_cache_dir, WeightCache};
use crate::cli::Args;
use crate::ggml::{Device, DeviceKind};
use crate::local_weights::LocalWeights;
use crate::rdma::{RdmaConfig, TransportMode};
use crate::server::{self, ServerOptions};
use crate::session::{MemoryLimits, SessionConfig};
use crate::stats::Stats;
use anyhow::{bail, Context};
use clap::Parser;

const MIB: u64 = 1024 * 1024;

/// A device as the stock tool lists it: `  NAME: DESCRIPTION (TOTAL MiB, FREE MiB free)`.
fn device_line(d: &Device) -> String {
    let (free, total) = d.memory();
    format!(
        "  {}: {} ({} MiB, {} MiB free)",
        d.name(),
        d.description(),
        total / MIB,
        free / MIB
    )
}

fn select_devices(args: &Args) -> anyhow::Result<Vec<Device>> {
    let names = args.device_names();
    let all = Device::all();
    if !names.is_empty() {
        let mut out = Vec::new();
        for n in &names {
            match Device::by_name(n) {
                Some(d) => out.push(d),
                None => {
                    eprintln!("error: unknown device: {n}");
                    eprintln!("available devices:");
                    for d in &all {
                        eprintln!("  {}: {}", d.name(), d.description());
                    }
                    bail!("no such device: {n}");
                }
            }
        }
        return Ok(out);
    }
    let gpus: Vec<Device> = all
        .iter()
        .filter(|d| !matches!(d.kind(), DeviceKind::Cpu | DeviceKind::Accel))
        .cloned()
        .collect();
    if !gpus.is_empty() {
        return Ok(gpus);
    }
    all.into_iter()
        .find(|d| d.kind() == DeviceKind::Cpu)
        .map(|d| vec![d])
        .context("no CPU device found")
}

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
    // Before any thread exists: a few malloc arenas, a fixed mmap threshold (see tune_malloc).
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    crate::ggml::tune_malloc(cores.clamp(2, 8));
    if let Err(e) = real_main() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// What a session process sees read-only besides the system: the weight cache directory, the
/// `--gguf` files and the directory of their index.
fn session_view(args: &Args) -> (Vec<std::path::PathBuf>, Vec<std::path::PathBuf>) {
    let cache_dir = if args.cache || args.cache_dir.is_some() {
        args.cache_dir.clone().or_else(default_cache_dir)
    } else {
        None
    };
    let mut dirs: Vec<std::path::PathBuf> = cache_dir.clone().into_iter().collect();
    if !args.gguf.is_empty() {
        // The index is read through a handle on its directory (`local_weights.rs`).
        if let Some(d) = cache_dir.or_else(default_cache_dir) {
            if !dirs.contains(&d) {
                dirs.push(d);
            }
        }
    }
    (dirs, args.gguf.clone())
}

/// Containment of a session process (Linux), the first thing it does: the outer stage makes
/// the namespaces, forks the inner one into them and waits for it (this never returns there);
/// the inner stage enters its own root, drops its identity and installs the sandbox, then
/// returns to serve.
/// Any failure refuses the session: the process exits with `isolate::SANDBOX_REFUSED`.
#[cfg(target_os = "linux")]
fn contain(args: &Args) {
    let refuse = |e: &dyn std::fmt::Display| -> ! {
        tracing::error!(
            "session refused: its containment cannot be set up: {e} (--no-sandbox serves without it)"
        );
        std::process::exit(crate::isolate::SANDBOX_REFUSED)
    };
    let identity = match crate::namespaces::run_outer() {
        Ok(crate::namespaces::Outer::Exited(code)) => std::process::exit(code),
        Ok(crate::namespaces::Outer::Inner(identity)) => identity,
        Err(e) => refuse(&e),
    };
    let rdma = !args.session_tcp_only
        && args.transport != TransportMode::Tcp
        && std::env::var_os("GGML_RPC_NO_RDMA").is_none();
    let (dirs, files) = session_view(args);
    let view = crate::namespaces::View {
        dirs: dirs.clone(),
        files: files.clone(),
        rdma,
    };
    if let Err(e) = crate::namespaces::enter_view(&view) {
        refuse(&e)
    }
    if let Err(e) = crate::namespaces::drop_identity(identity) {
        refuse(&e)
    }
    // The verbs library and its providers are loaded (and the devices listed) before the
    // filter, which allows no executable mapping, and under the credentials the queue pair
    // will be used with.
    if rdma && rdma_verbs::load().is_ok() {
        let _ = rdma_verbs::devices();
    }
    let own_uid = matches!(identity, crate::namespaces::Identity::Dedicated(_));
    match crate::sandbox::install(
        crate::sandbox::Needs::of_build(rdma),
        &dirs,
        &files,
        own_uid,
    ) {
        Ok(i) => {
            let layers = format!(
                "{}; PID, network, mount, IPC, UTS and cgroup namespaces; a read-only root of its own; seccomp allow-list of {} system calls; Landlock {}; rlimits",
                identity.describe(),
                i.syscalls,
                i.landlock
            );
            if args.sandbox_probe {
                println!("{layers}");
                std::process::exit(0);
            }
            tracing::debug!(layers, "session contained");
        }
        Err(e) => refuse(&e),
    }
}

/// The front's check at start that sessions can be contained here: one probe session process
/// (`--sandbox-probe`) sets up every layer and says what it installed. `Err` says why not.
#[cfg(target_os = "linux")]
fn probe_containment() -> anyhow::Result<String> {
    let exe = std::env::current_exe()?;
    let out = std::process::Command::new(exe)
        .args(std::env::args_os().skip(1))
        .arg("--sandbox-probe")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() && !said.is_empty() {
        Ok(said)
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        let why = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no output")
            .to_string();
        bail!("{why}")
    }
}

fn real_main() -> anyhow::Result<()> {
    let args = Args::parse();
    crate::ggml::use_huge_pages(!args.no_huge_pages);
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RPC_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    #[cfg(target_os = "linux")]
    if (args.session_child.is_some() || args.sandbox_probe) && !args.no_sandbox {
        contain(&args);
    }
    crate::ggml::load_backends();

    if let Some(crate::cli::SubCommand::Doctor { peer, probe }) = &args.command {
        crate::doctor::protocols(probe.as_deref());
        crate::doctor::run(peer.as_deref());
        return Ok(());
    }
    // Upstream's environment switches keep working.
    let mut mode = args.transport;
    if std::env::var_os("GGML_RPC_NO_RDMA").is_some() {
        mode = TransportMode::Tcp;
    }
    let rdma_opts = args.rdma.options();
    let rdma = Arc::new(RdmaConfig::new(
        mode,
        rdma_opts,
        args.rdma_max_connections.max(1),
    ));
    if mode == TransportMode::Rdma {
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

    if args.list_devices {
        println!("Available devices:");
        for d in Device::all() {
            println!("{}", device_line(&d));
        }
        return Ok(());
    }
    let devices = select_devices(&args)?;
    let cache = if args.cache || args.cache_dir.is_some() {
        let dir = args
            .cache_dir
            .clone()
            .or_else(default_cache_dir)
            .context("cannot determine the cache directory")?;
        // A session process writes nothing there: its stores and checks go to the front.
        let opened = if args.session_child.is_some() {
            WeightCache::open_read_only(&dir, args.cache_max_size)
        } else {
            WeightCache::open(&dir, args.cache_max_size)
        };
        let cache = opened
            .with_context(|| format!("cannot open cache directory {}", dir.display()))?
            .verify_every_load(args.verify_loads);
        Some(match trusted_since(&args) {
            Some(t) => cache.trusted_only(i128::from(t)),
            None => cache,
        })
    } else {
        None
    };

    let local = if args.gguf.is_empty() {
        None
    } else {
        let index = cache
            .as_ref()
            .map(|c| c.dir().to_path_buf())
            .or_else(default_cache_dir)
            .map(|d| d.join(crate::local_weights::INDEX_FILE));
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let local = if args.session_child.is_some() {
            // A session process: the front hashed and saved the index at start.
            LocalWeights::from_index(&args.gguf, index)?
        } else {
            LocalWeights::build(&args.gguf, index, threads)?
        };
        Some(local.verify_every_load(args.verify_loads))
    };

    // Default memory limits: what the devices have (a larger ALLOC_BUFFER would only succeed
    // through overcommit and end in the OOM killer).
    let device_memory: u64 = devices.iter().map(|d| d.memory().1).sum::<u64>().max(1);
    let config = Arc::new(SessionConfig {
        devices,
        n_threads: args.threads,
        cache,
        local,
    });
    let opts = server_options(&args, device_memory, rdma)?;

    #[cfg(unix)]
    if let Some(caps) = &args.session_child {
        let caps = crate::isolate::parse_hex(caps).context("--session-child: bad caps")?;
        let pending = match &args.session_pending {
            Some(h) => Some(crate::isolate::parse_hex(h).context("--session-pending: bad header")?),
            None => None,
        };
        let conn = crate::connection::ConnectionOptions {
            budget: Arc::new(crate::session::MemoryBudget::new(opts.memory)),
            idle_timeout: opts.idle_timeout,
            hello_timeout: opts.hello_timeout,
            request_timeout: opts.request_timeout,
            poll_window: opts.poll_window,
            isolate: None,
            allow: opts.allow.clone(),
            comm: None,
        };
        let rdma = if args.session_tcp_only {
            Arc::new(RdmaConfig::new(TransportMode::Tcp, Default::default(), 1))
        } else {
            opts.rdma.clone()
        };
        let major =
            rpc_proto::Major::from_number(args.session_major).context("--session-major: 7 or 8")?;
        std::process::exit(crate::isolate::child_main(crate::isolate::Child {
            caps,
            pending,
            peer: args.session_peer.clone().unwrap_or_default(),
            config,
            major,
            limits: opts.limits,
            rdma,
            conn,
            sandbox: !args.no_sandbox,
        }));
    }

    // Every session process will be contained, or the server does not start (fail closed).
    #[cfg(target_os = "linux")]
    let containment = match (&opts.isolate, args.no_sandbox) {
        (Some(_), false) => Some(probe_containment().context(
            "session processes cannot be contained on this machine; --no-sandbox serves them in \
             processes of their own without namespaces, seccomp and Landlock",
        )?),
        _ => None,
    };

    // The listener's runtime: one thread that accepts and hands each connection to a thread of its
    // own (server.rs); nothing else runs here, so nothing competes with ggml for the cores.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listeners = bind_listeners(&args).await?;
        let local = listeners[0].socket.local_addr()?;
        let metrics = match &args.metrics {
            Some(spec) => {
                let (host, port) = spec
                    .rsplit_once(':')
                    .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
                    .with_context(|| format!("--metrics {spec}: expected HOST:PORT"))?;
                let l = server::bind(host, port)
                    .await
                    .with_context(|| format!("cannot listen for --metrics on {spec}"))?;
                Some(l)
            }
            None => None,
        };
        if !local.ip().is_loopback() {
            eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
            eprintln!("WARNING: listening on {local}, reachable from other machines.");
            eprintln!("         The ggml RPC protocol has no authentication or encryption:");
            eprintln!("         anyone who can connect can use this machine's devices and memory.");
            eprintln!("         Only expose it on a network you trust, and name that network");
            eprintln!("         with --allow CIDR (e.g. --allow 169.254.0.0/16 on a Thunderbolt");
            eprintln!("         bridge) so that other addresses are refused unread.");
            eprintln!("!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!");
        }
        println!(
            "Starting RPC server v{} (rpc-server {})",
            listeners[0].major,
            env!("CARGO_PKG_VERSION")
        );
        for l in &listeners {
            println!(
                "  endpoint       : {} (protocol {}: {})",
                l.socket.local_addr()?,
                l.major,
                match l.major {
                    rpc_proto::Major::V8 => "llama.cpp since October 2026",
                    rpc_proto::Major::V7 => "llama.cpp before October 2026",
                }
            );
        }
        match &config.cache {
            Some(c) => match c.max_size() {
                Some(m) => println!(
                    "  local cache    : {} (max {} MiB)",
                    c.dir().display(),
                    m / MIB
                ),
                None => println!("  local cache    : {}", c.dir().display()),
            },
            None => println!("  local cache    : n/a"),
        }
        if let Some(l) = &config.local {
            let s = l.summary();
            println!(
                "  local weights  : {} tensors, {} MiB in {} GGUF files (hashed {} MiB in {:.1} s)",
                s.tensors,
                s.bytes / MIB,
                s.files,
                s.bytes_hashed / MIB,
                s.seconds
            );
        }
        println!("Devices:");
        for d in &config.devices {
            println!("{}", device_line(d));
        }
        println!("  threads        : {}", args.threads);
        println!("  transport      : {}", opts.rdma.describe());
        #[cfg(target_os = "linux")]
        if containment.is_some()
            && opts.rdma.mode != TransportMode::Tcp
            && crate::namespaces::rdma_netns_exclusive()
        {
            println!("  WARNING        : RDMA devices are in exclusive network-namespace mode: contained sessions see none and stay on TCP (`rdma system set netns shared`, the kernel's default, or --no-sandbox)");
        }
        println!(
            "  connections    : up to {} at once, {} per peer; from {}",
            args.max_connections,
            opts.max_per_peer.unwrap_or_default(),
            opts.allow.describe()
        );
        #[cfg(unix)]
        println!(
            "  sessions       : {}",
            crate::isolate::describe_mode(opts.isolate.as_deref())
        );
        #[cfg(target_os = "linux")]
        match (&containment, &opts.isolate) {
            (Some(layers), _) => println!("  containment    : {layers}"),
            (None, Some(_)) => println!("  containment    : off (--no-sandbox): sessions run with this process's identity and view"),
            (None, None) => {}
        }
        if let Some(m) = &metrics {
            println!("  metrics        : http://{}/metrics", m.local_addr()?);
        }
        println!(
            "  limits         : {} MiB per connection, {} MiB in total",
            opts.memory.per_connection / MIB,
            opts.memory.total / MIB,
        );
        println!(
            "  liveness       : idle timeout {} (connections holding nothing), keepalive {}",
            if args.idle_timeout > 0 {
                format!("{} s", args.idle_timeout)
            } else {
                "off".into()
            },
            if args.keepalive > 0 {
                let dead =
                    server::keepalive_deadline(std::time::Duration::from_secs(args.keepalive));
                format!(
                    "{} s (a vanished peer is dropped after ~{} s)",
                    args.keepalive,
                    dead.as_secs()
                )
            } else {
                "off".into()
            }
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();

        let stats = Arc::new(Stats::default());
        if let Some(m) = metrics {
            let src = Arc::new(crate::metrics::Sources {
                stats: stats.clone(),
                rdma: opts.rdma.clone(),
                config: config.clone(),
            });
            tokio::spawn(crate::metrics::serve(m, src));
        }
        server::serve(listeners, config, opts, stats, shutdown_signal()).await;
        Ok(())
    })
}

/// The listening sockets: `-p` speaks 8.0.0 (current upstream), `--proto7-port` 7.0.0.
async fn bind_listeners(args: &Args) -> anyhow::Result<Vec<server::Listener>> {
    use rpc_proto::Major;
    let mut ports = vec![(args.port, Major::V8)];
    if let Some(p7) = args.proto7_port {
        if p7 == args.port {
            bail!("--proto7-port {p7} is the same as -p: each port speaks one protocol major");
        }
        if Some(p7) == args.port.checked_add(rpc_proto::COMM_PORT_OFFSET) {
            bail!(
                "--proto7-port {p7} is -p + {}: an 8.0 client's tensor split makes rank 0 listen there",
                rpc_proto::COMM_PORT_OFFSET
            );
        }
        ports.push((p7, Major::V7));
    }
    let mut out = Vec::new();
    for (port, major) in ports {
        let socket = server::bind(&args.host, port)
            .await
            .with_context(|| format!("cannot listen on {}:{port}", args.host))?;
        out.push(server::Listener::new(socket, major));
    }
    Ok(out)
}

/// The listener's settings from the flags (also what a session process configures itself from).
fn server_options(
    args: &Args,
    device_memory: u64,
    rdma: Arc<RdmaConfig>,
) -> anyhow::Result<ServerOptions> {
    let secs = std::time::Duration::from_secs;
    let mut opts = ServerOptions {
        max_connections: args.max_connections,
        max_per_peer: Some(args.max_connections_per_peer.map_or_else(
            || crate::admission::default_peer_share(args.max_connections),
            |n| usize::try_from(n).unwrap_or(usize::MAX),
        )),
        allow: crate::admission::AllowList(args.allow.clone()),
        hello_timeout: secs(args.hello_timeout),
        request_timeout: secs(args.request_timeout),
        rdma,
        ..Default::default()
    };
    opts.limits.max_request_size = args.max_request_size;
    opts.limits.max_graph_nodes = args.max_graph_size;
    opts.limits.max_graph_tensors = args.max_graph_size;
    // Per connection by default: the total less one fair share kept for the other connections
    // (the whole total with --max-connections 1), see `default_alloc_per_connection`.
    let total = args.max_alloc_total.unwrap_or(device_memory);
    opts.memory = MemoryLimits {
        per_connection: args.max_alloc_per_connection.unwrap_or_else(|| {
            crate::admission::default_alloc_per_connection(total, args.max_connections)
        }),
        total,
    };
    opts.idle_timeout = (args.idle_timeout > 0).then(|| secs(args.idle_timeout));
    opts.keepalive = (args.keepalive > 0).then(|| secs(args.keepalive));
    opts.poll_window = std::time::Duration::from_micros(args.poll_window);
    opts.shutdown_grace = secs(args.shutdown_grace);
    #[cfg(unix)]
    if !args.no_isolate {
        let exe = std::env::current_exe()
            .context("cannot find this executable to start session processes (--no-isolate)")?;
        let mut args_os: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
        if let Some(t) = trusted_since(args) {
            // Session processes serve the entries seeded before the front started.
            args_os.push("--trusted-seeded-before".into());
            args_os.push(t.to_string().into());
        }
        opts.isolate = Some(Arc::new(crate::isolate::Isolation { exe, args: args_os }));
    }
    Ok(opts)
}

/// `--trusted-weights-only`: the cache serves only entries whose status-change time is before
/// this (ns since the epoch): the front's start, which its session processes are given.
fn trusted_since(args: &Args) -> Option<u64> {
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    if !args.trusted_weights_only {
        return None;
    }
    Some(args.trusted_seeded_before.unwrap_or_else(|| {
        *START.get_or_init(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        })
    }))
}
