//! The `rpc-server` program (also installed as `ggml-rpc-server`, upstream's name): parse flags,
//! pick devices, print the banner, serve. `src/main.rs` and `src/bin/ggml-rpc-server.rs` call
//! [`main`].

use std::sync::Arc;

use crate::cli::Args;
use crate::control::{SessionStart, SANDBOX_REFUSED};
use crate::options::{ServerOptions, SessionOptions};
use crate::rdma::TransportMode;
use crate::server;
use crate::stats::Stats;
use anyhow::{bail, Context};
use clap::Parser;
use rpc_ggml::{Device, DeviceKind};
use rpc_session::SessionConfig;
use rpc_weights::cache::WeightCache;
use rpc_weights::local_weights::LocalWeights;

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

fn select_devices(names: &[String]) -> anyhow::Result<Vec<Device>> {
    let all = Device::all();
    if !names.is_empty() {
        let mut out = Vec::new();
        for n in names {
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
    if let Err(e) = real_main() {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// What a session process sees read-only besides the system: the weight cache directory, the
/// `--gguf` files and the directory of their index.
fn session_view(o: &SessionOptions) -> (Vec<std::path::PathBuf>, Vec<std::path::PathBuf>) {
    let mut dirs: Vec<std::path::PathBuf> = o.cache_dir.clone().into_iter().collect();
    if !o.gguf.is_empty() {
        // The index is read through a handle on its directory (`rpc_weights::local_weights`).
        if let Some(d) = o.gguf_index.as_deref().and_then(|i| i.parent()) {
            if !dirs.iter().any(|x| x == d) {
                dirs.push(d.to_path_buf());
            }
        }
    }
    (dirs, o.gguf.clone())
}

/// Whether a session process gets the RDMA device (the verbs ioctl, RDMA netlink, the device
/// files): a client that offered RDMA and has a place, or a protocol 8.0 session on a machine
/// with an RDMA device, whose COMM_INIT may put the server-to-server link on RDMA (the link's
/// queue pair is the session's, `link.rs`). Never with `--transport tcp` or `GGML_RPC_NO_RDMA`.
#[cfg(target_os = "linux")]
fn session_needs_rdma(start: &SessionStart) -> bool {
    let allowed = start.options.rdma_mode() != TransportMode::Tcp;
    let link = start.major == rpc_proto::Major::V8.number() && has_rdma_device();
    allowed && (!start.tcp_only || link)
}

/// An RDMA verbs device file exists (`/dev/infiniband/uverbs*`).
#[cfg(target_os = "linux")]
fn has_rdma_device() -> bool {
    std::fs::read_dir("/dev/infiniband").is_ok_and(|d| {
        d.flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("uverbs"))
    })
}

/// Containment of a session process (Linux), the first thing it does: the outer stage makes
/// the namespaces, forks the inner one into them and waits for it (this never returns there);
/// the inner stage enters its own root, drops its identity and installs the sandbox, then
/// returns to serve.
/// Any failure refuses the session: the process exits with `control::SANDBOX_REFUSED`.
#[cfg(target_os = "linux")]
fn contain(start: &SessionStart, probe: bool) {
    let refuse = |e: &dyn std::fmt::Display| -> ! {
        tracing::error!(
            "session refused: its containment cannot be set up: {e} (--no-sandbox serves without it)"
        );
        std::process::exit(SANDBOX_REFUSED)
    };
    let identity = match rpc_contain::namespaces::run_outer() {
        Ok(rpc_contain::namespaces::Outer::Exited(code)) => std::process::exit(code),
        Ok(rpc_contain::namespaces::Outer::Inner(identity)) => identity,
        Err(e) => refuse(&e),
    };
    let rdma = session_needs_rdma(start);
    let (dirs, files) = session_view(&start.options.session);
    let view = rpc_contain::namespaces::View {
        dirs: dirs.clone(),
        files: files.clone(),
        rdma,
    };
    if let Err(e) = rpc_contain::namespaces::enter_view(&view) {
        refuse(&e)
    }
    if rdma {
        if let Err(e) = rpc_contain::sandbox::allow_rdma_memlock() {
            tracing::info!("session: the locked-memory limit stays as it is ({e}); RDMA that needs more stays on TCP");
        }
    }
    if let Err(e) = rpc_contain::namespaces::drop_identity(identity) {
        refuse(&e)
    }
    // The verbs library and its providers are loaded (and the devices listed) before the
    // filter, which allows no executable mapping, and under the credentials the queue pair
    // will be used with.
    if rdma && rdma_verbs::load().is_ok() {
        let _ = rdma_verbs::devices();
    }
    let own_uid = matches!(identity, rpc_contain::namespaces::Identity::Dedicated(_));
    match rpc_contain::sandbox::install(
        rpc_contain::sandbox::Needs::of_build(rdma),
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
            if probe {
                if let Err(e) = session_reach(&start.options.session) {
                    // The front refuses to start with this (its last line).
                    eprintln!("{e}");
                    std::process::exit(PROBE_UNREADABLE);
                }
                println!("{layers}");
                std::process::exit(0);
            }
            tracing::debug!(layers, "session contained");
        }
        Err(e) => refuse(&e),
    }
}

/// The containment probe's exit status when a session process could not read what it serves
/// (`session_reach`): the front's refusal then says only that, and how to fix it.
#[cfg(target_os = "linux")]
const PROBE_UNREADABLE: i32 = 4;

/// A probe session process's refusal that is about files, not containment.
#[cfg(target_os = "linux")]
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Unreadable(String);

/// In the containment probe (Linux): whether a session process, with its identity and view,
/// can read the `--gguf` files and their index. (The weight cache it never reads itself: the
/// front opens its entries for it.) A `--gguf` file it cannot open would be skipped by every
/// session without a word, so the front refuses to start instead, saying how to fix it.
#[cfg(target_os = "linux")]
fn session_reach(o: &SessionOptions) -> Result<(), String> {
    let fix = "make it readable by every user (a file: chmod o+r; a directory: chmod o+rx, and \
               o+r on its files; the directories above it do not matter), or serve with \
               --no-sandbox";
    for p in &o.gguf {
        let r = match p.is_dir() {
            true => std::fs::read_dir(p).map(drop),
            false => std::fs::File::open(p).map(drop),
        };
        if let Err(e) = r {
            return Err(format!(
                "session processes cannot read --gguf {} ({e}): they run as a user of their own; {fix}",
                p.display()
            ));
        }
    }
    if let Some(ix) = o.gguf_index.as_deref().filter(|_| !o.gguf.is_empty()) {
        match std::fs::File::open(ix) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(format!(
                    "session processes cannot read the --gguf index {} ({e}): they run as a user \
                     of their own; it lives in the cache directory: make that searchable and the \
                     index readable by every user (chmod o+x {}; chmod o+r {}), name another \
                     with --cache-dir, or serve with --no-sandbox",
                    ix.display(),
                    ix.parent().unwrap_or(ix).display(),
                    ix.display()
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The front's check at start that sessions can be contained here: one probe session process
/// (`--sandbox-probe`) sets up every layer and says what it installed. `Err` says why not.
#[cfg(target_os = "linux")]
fn probe_containment(options: &ServerOptions) -> anyhow::Result<String> {
    let exe = std::env::current_exe()?;
    let start = SessionStart {
        options: options.clone(),
        caps: [0; rpc_proto::CONN_CAPS_SIZE],
        pending: None,
        peer: String::new(),
        major: rpc_proto::Major::V8.number(),
        tcp_only: false,
    };
    let out = std::process::Command::new(exe)
        .arg("--sandbox-probe")
        .env(crate::control::SESSION_START_ENV, start.encode())
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
        if out.status.code() == Some(PROBE_UNREADABLE) {
            return Err(Unreadable(why).into());
        }
        bail!("{why}")
    }
}

/// What each session computes with, from its options: the devices, the weight cache and the
/// `--gguf` weights. A session process opens the cache read-only (its writes go to the front)
/// and reads the `--gguf` index its front made.
fn session_config(o: &SessionOptions, in_child: bool) -> anyhow::Result<SessionConfig> {
    let devices = select_devices(&o.devices)?
        .into_iter()
        .map(|d| d.reporting(o.reported_memory))
        .collect();
    let cache = match &o.cache_dir {
        Some(dir) => {
            let opened = match in_child {
                true => WeightCache::open_read_only(dir, o.cache_max_size),
                false => WeightCache::open(dir, o.cache_max_size),
            };
            // Only this process (the front) must reach the directory: a session process has its
            // entries opened by the front (Linux) or shares its uid (macOS).
            let cache = opened
                .with_context(|| match in_child {
                    true => format!("cannot open cache directory {}", dir.display()),
                    false => format!(
                        "cannot open cache directory {}: the server creates, reads and writes it \
                         as the user it runs as; give that user access to it (its owner or mode, \
                         and search permission on its parents), or name another with --cache-dir",
                        dir.display()
                    ),
                })?
                .verify_every_load(o.verify_loads);
            Some(match o.trusted_seeded_before {
                Some(t) => cache.trusted_only(i128::from(t)),
                None => cache,
            })
        }
        None => None,
    };
    let local = match o.gguf.is_empty() {
        true => None,
        false => {
            let index = o.gguf_index.clone();
            let local = match in_child {
                true => LocalWeights::from_index(&o.gguf, index)?,
                false => {
                    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
                    LocalWeights::build(&o.gguf, index, threads)?
                }
            };
            Some(local.verify_every_load(o.verify_loads))
        }
    };
    Ok(SessionConfig {
        devices,
        n_threads: o.threads,
        cache,
        local,
    })
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

/// A session process (`--session-child`), or the front's containment probe
/// (`--sandbox-probe`): configured by the front's message alone (`start`, its switches
/// included).
#[cfg(unix)]
fn session_main(start: SessionStart, probe: bool, pooled: bool) -> anyhow::Result<()> {
    rpc_ggml::use_huge_pages(start.options.session.huge_pages);
    #[cfg(target_os = "linux")]
    if start.options.sandbox {
        contain(&start, probe);
    }
    if probe {
        bail!("--sandbox-probe: no containment to probe (--no-sandbox)");
    }
    rpc_ggml::load_backends_from(start.options.backend_path.as_deref());
    let config = Arc::new(session_config(&start.options.session, true)?);
    if !pooled {
        let handed = crate::child::Handed::from_stdio()
            .context("a session process started without its socket and control line")?;
        std::process::exit(crate::child::child_main(start, config, handed));
    }
    // Pooled: what a session's first command would do first happens now, while it waits: a
    // backend on each device (on a Mac, the Metal device's command queue and its kernel
    // library, which stays loaded for the process).
    for d in &config.devices {
        drop(d.init_backend(start.options.session.threads));
    }
    match crate::child::await_connection(&start) {
        Ok(Some((start, handed))) => {
            std::process::exit(crate::child::child_main(start, config, handed))
        }
        Ok(None) => std::process::exit(0),
        Err(e) => bail!("a pooled session process: {e}"),
    }
}

fn real_main() -> anyhow::Result<()> {
    let args = Args::parse();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // A session process's log is limited where the front relays it (and a session process may
    // start no thread here); its options, the environment switches included, are the front's.
    #[cfg(unix)]
    if args.session_child || args.sandbox_probe {
        let start = SessionStart::from_env()
            .context("a session process is started by its front, which passes its configuration")?
            .map_err(|e| anyhow::anyhow!("the front's message: {e}"))?;
        start_up(&start.options, ansi, None);
        return session_main(start, args.sandbox_probe, args.session_wait);
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

    if args.list_devices {
        println!("Available devices:");
        for d in Device::all() {
            println!("{}", device_line(&d));
        }
        return Ok(());
    }
    let config = Arc::new(session_config(&opts.session, false)?);
    let memory = opts.memory(server::device_memory(&config));

    // Every session process will be contained, or the server does not start (fail closed).
    #[cfg(target_os = "linux")]
    let containment =
        match (opts.isolate, opts.sandbox) {
            (true, true) => Some(probe_containment(&opts).map_err(|e| {
                match e.is::<Unreadable>() {
            true => e,
            false => e.context(
                "session processes cannot be contained on this machine; --no-sandbox serves them \
                 in processes of their own without namespaces, seccomp and Landlock",
            ),
        }
            })?),
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
        println!("  threads        : {}", opts.session.threads);
        println!("  transport      : {}", rdma.describe());
        #[cfg(target_os = "linux")]
        if containment.is_some()
            && rdma.mode != TransportMode::Tcp
            && rpc_contain::namespaces::rdma_netns_exclusive()
        {
            println!("  WARNING        : RDMA devices are in exclusive network-namespace mode: contained sessions see none and stay on TCP (`rdma system set netns shared`, the kernel's default, or --no-sandbox)");
        }
        println!(
            "  connections    : up to {} at once, {} per peer{}; from {}",
            opts.max_connections,
            opts.peer_share(),
            match opts.share_exempt.is_empty() {
                true => String::new(),
                false => format!(
                    " (none for {})",
                    crate::cidr::AllowList(opts.share_exempt.clone()).describe()
                ),
            },
            opts.allow_list().describe()
        );
        if let Some(l) = listeners.iter().find(|l| l.major == rpc_proto::Major::V8) {
            let comm = opts.comm_policy(l.socket.local_addr()?);
            let ports: Vec<String> = comm.peer_ports.iter().map(|r| r.to_string()).collect();
            println!(
                "  tensor split   : as rank 0 listens on port {} for {}; as rank 1 dials those on RPC ports {} + {} (--comm-peers, --comm-peer-ports)",
                comm.rank0_port().map_or_else(|| "none".to_string(), |p| p.to_string()),
                comm.peers.describe(),
                ports.join(","),
                rpc_proto::COMM_PORT_OFFSET
            );
        }
        #[cfg(unix)]
        println!(
            "  sessions       : {}",
            describe_sessions(opts.isolate)
        );
        #[cfg(target_os = "linux")]
        match (&containment, opts.isolate) {
            (Some(layers), _) => println!("  containment    : {layers}"),
            (None, true) => println!("  containment    : off (--no-sandbox): sessions run with this process's identity and view"),
            (None, false) => {}
        }
        if let Some(m) = &metrics {
            println!("  metrics        : http://{}/metrics", m.local_addr()?);
        }
        println!(
            "  limits         : {} MiB per connection, {} MiB in total",
            memory.per_connection / MIB,
            memory.total / MIB,
        );
        println!(
            "  liveness       : idle timeout {} (connections holding nothing), keepalive {}",
            match opts.idle_timeout {
                Some(t) => format!("{} s", t.as_secs()),
                None => "off".into(),
            },
            match opts.keepalive {
                Some(k) => format!(
                    "{} s (a vanished peer is dropped after ~{} s)",
                    k.as_secs(),
                    server::keepalive_deadline(k).as_secs()
                ),
                None => "off".into(),
            }
        );
        use std::io::Write;
        let _ = std::io::stdout().flush();

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
        // What was dropped since the last summary.
        if let Some(l) = &limiter {
            l.report();
        }
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

/// One line for the banner.
fn describe_sessions(isolate: bool) -> &'static str {
    match isolate {
        true => "a process of its own per session (--no-isolate: all in this one)",
        false => "all in this process (--no-isolate): no containment",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `-m/--mem`: what every device reports (GET_DEVICE_MEMORY answers from `Device::memory`),
    /// and the default `--max-alloc-total` it bounds: a device counts with the smaller of what it
    /// reports and what it has.
    #[test]
    fn mem_is_what_the_devices_report_and_bounds_the_default_total() {
        let cpu = |reported| SessionOptions {
            devices: vec!["CPU".into()],
            reported_memory: reported,
            ..SessionOptions::default()
        };
        let own = session_config(&cpu(None), false).unwrap();
        let (_, has) = own.devices[0].actual_memory();
        assert_eq!(own.devices[0].memory(), own.devices[0].actual_memory());
        assert_eq!(server::device_memory(&own), has);
        let less = session_config(&cpu(Some(64 << 20)), false).unwrap();
        assert_eq!(less.devices[0].memory(), (64 << 20, 64 << 20));
        assert_eq!(server::device_memory(&less), 64 << 20);
        let more = session_config(&cpu(Some(has * 4)), false).unwrap();
        assert_eq!(more.devices[0].memory(), (has * 4, has * 4));
        assert_eq!(server::device_memory(&more), has, "bounded by what it has");
        // The options a session process is configured from carry it.
        let o = ServerOptions {
            session: cpu(Some(64 << 20)),
            ..ServerOptions::default()
        };
        assert_eq!(o.memory(server::device_memory(&less)).total, 64 << 20);
    }
}
