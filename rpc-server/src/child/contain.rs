//! Containment of a session process, in the order it happens: (Linux) [`contain`] before
//! anything else (namespaces, its own read-only root, a dropped identity, seccomp, Landlock and
//! rlimits, through `rpc-contain`), with the RDMA device only when the session may need it;
//! [`limit_memory`] once its budget is known; [`restrict_syscalls`] once the transport is up
//! (macOS: the Seatbelt profile), with the self-test of `RPC_SANDBOX_SELFTEST`. And the front's
//! check at start that sessions can be contained here at all ([`probe_containment`]: one
//! probe session process, `--sandbox-probe`).

#[cfg(target_os = "linux")]
use crate::control::SessionStart;
use crate::control::SANDBOX_REFUSED;
use crate::options::ServerOptions;
#[cfg(target_os = "linux")]
use crate::options::SessionOptions;
#[cfg(target_os = "linux")]
use crate::rdma::TransportMode;

/// What a session process sees read-only besides the system: the weight cache directory, the
/// `--gguf` files and the directory of their index.
#[cfg(target_os = "linux")]
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
pub(super) fn contain(start: &SessionStart, probe: bool) {
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

/// The front's check at start that every session process will be contained, or the server
/// does not start (fail closed): with contained sessions (Linux, neither `--no-isolate` nor
/// `--no-sandbox`) the layers one probe session process installed (`probe`); `None` when
/// there is nothing to probe. `Err` says why sessions cannot be contained here.
pub fn probe_containment(options: &ServerOptions) -> anyhow::Result<Option<String>> {
    #[cfg(target_os = "linux")]
    if options.isolate && options.sandbox {
        return probe(options)
            .map(Some)
            .map_err(|e| {
                match e.is::<Unreadable>() {
            true => e,
            false => e.context(
                "session processes cannot be contained on this machine; --no-sandbox serves them \
                 in processes of their own without namespaces, seccomp and Landlock",
            ),
        }
            });
    }
    let _ = options;
    Ok(None)
}

/// One probe session process (`--sandbox-probe`) sets up every layer and says what it
/// installed. `Err` says why not.
#[cfg(target_os = "linux")]
fn probe(options: &ServerOptions) -> anyhow::Result<String> {
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
        anyhow::bail!("{why}")
    }
}

/// The memory bound of a contained session (Linux: its address space,
/// `rpc_contain::sandbox::limit_memory`), set once its budget is known, before the client's
/// first byte. A session that cannot be bounded is refused.
pub(super) fn limit_memory(on: bool, budget: u64) -> Result<(), String> {
    #[cfg(target_os = "linux")]
    if on {
        match rpc_contain::sandbox::limit_memory(budget) {
            Ok(Some(n)) => tracing::debug!(bytes = n, "address space bounded"),
            Ok(None) => tracing::debug!("address space not bounded (no budget, or a GPU build)"),
            Err(e) => return Err(format!("cannot bound the session's memory: {e}")),
        }
    }
    let _ = (on, budget);
    Ok(())
}

/// Once the transport is up: the Seatbelt profile on macOS (rpc-contain's `sandbox_mac.rs`; on
/// Linux the sandbox is in place since the process started, its `namespaces.rs` and
/// `sandbox.rs`); then the self-test when `selftest` (`ServerOptions::sandbox_selftest`:
/// `RPC_SANDBOX_SELFTEST=1` where the front started).
pub(super) fn restrict_syscalls(on: bool, selftest: bool, cache_dir: Option<&std::path::Path>) {
    #[cfg(target_os = "macos")]
    if on {
        let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
        match rpc_contain::sandbox_mac::apply(home.as_deref(), cache_dir) {
            Ok(()) => tracing::debug!("sandbox profile applied"),
            // Fail closed, as on Linux.
            Err(e) => {
                tracing::error!(
                    "session refused: its sandbox profile cannot be applied: {e} (--no-sandbox serves without it)"
                );
                std::process::exit(SANDBOX_REFUSED);
            }
        }
    }
    let _ = on;
    if selftest {
        self_test(cache_dir);
    }
}

/// `RPC_SANDBOX_SELFTEST=1`: tries what the sandbox forbids and logs each outcome as
/// `sandbox self-test: <action>: denied (<error>)` or `...: ALLOWED` (`tests/tests/isolate.rs`
/// asserts on those lines).
fn self_test(cache_dir: Option<&std::path::Path>) {
    fn report<T>(what: &str, r: std::io::Result<T>) {
        match r {
            Ok(_) => tracing::warn!("sandbox self-test: {what}: ALLOWED"),
            Err(e) => tracing::info!("sandbox self-test: {what}: denied ({e})"),
        }
    }
    #[cfg(target_os = "linux")]
    report(
        "open /etc/hostname",
        std::fs::read("/etc/hostname").or_else(|_| std::fs::read("/etc/passwd")),
    );
    if let Some(home) = std::env::var_os("HOME") {
        report(
            "read a file in the home directory",
            std::fs::read(std::path::Path::new(&home).join(".rpc-sandbox-probe")),
        );
    }
    report(
        "create a file in /tmp",
        std::fs::write(format!("/tmp/rpc-sandbox-{}", std::process::id()), b"x"),
    );
    report(
        "open a TCP connection",
        std::net::TcpStream::connect("127.0.0.1:9"),
    );
    report(
        "listen on a port",
        std::net::TcpListener::bind("127.0.0.1:0"),
    );
    report(
        "start /bin/true",
        std::process::Command::new("/bin/true").status(),
    );
    if let Some(d) = cache_dir {
        // Only the front writes the cache; sessions read it.
        let p = d.join(format!(".sandbox-selftest-{}", std::process::id()));
        report("write the cache", std::fs::write(&p, b"x"));
        match std::fs::read_dir(d) {
            Ok(_) => tracing::info!("sandbox self-test: list the cache: allowed"),
            Err(e) => tracing::warn!("sandbox self-test: list the cache: DENIED ({e})"),
        }
    }
}
