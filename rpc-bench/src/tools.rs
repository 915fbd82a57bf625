//! Processes the benchmarks drive: a stock llama.cpp tool run to its end against a server with
//! its log captured ([`run_tool`]), and a server process that listens on a loopback port and is
//! killed on drop ([`ServerProcess`]: the stock and our `rpc-server` in `load`, the echo floor
//! in `latency`); [`through_relay`]: a run through `link-emu`'s counting relay, with the traffic
//! it caused.

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rpc_proto::Major;

use crate::relay::{Relay, RelayOptions, Wire};
use crate::traffic::Traffic;

/// Default directory of the stock tools speaking `major`: `$STOCK_BIN` (7.0) or `$STOCK_BIN8`
/// (8.0), else the newest TCP-only stock build that `scripts/stock-llama.sh` (`STOCK_PROTO=8`
/// for 8.0) left in its cache (`$RPC_CACHE_DIR`, default `~/.cache/ggml-rpc-rs`, then
/// `llama-cpp-python-0.3.36` or `xllamacpp-2026.10.11549`, then `src-rdma-OFF*/build/bin`; the
/// suffix is a hash of its patches).
pub fn default_bin(major: Major) -> PathBuf {
    let (var, package) = match major {
        Major::V7 => ("STOCK_BIN", "llama-cpp-python-0.3.36"),
        Major::V8 => ("STOCK_BIN8", "xllamacpp-2026.10.11549"),
    };
    if let Some(b) = std::env::var_os(var).filter(|b| !b.is_empty()) {
        return b.into();
    }
    let cache = std::env::var_os("RPC_CACHE_DIR")
        .filter(|c| !c.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/ggml-rpc-rs")
        });
    let root = cache.join(package);
    let newest = std::fs::read_dir(&root).ok().and_then(|rd| {
        rd.filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("src-rdma-OFF"))
            .map(|e| e.path().join("build/bin"))
            .filter(|b| b.join("ggml-rpc-server").is_file())
            .max_by_key(|b| b.metadata().and_then(|m| m.modified()).ok())
    });
    newest.unwrap_or_else(|| root.join("src-rdma-OFF/build/bin"))
}

/// Runs a stock tool to its end (killed after `timeout`), its stdout in `logdir/{tag}.out` and
/// its stderr in `logdir/{tag}.err`; returns its stdout, or an error with the log's last lines if
/// it failed.
pub fn run_tool(
    exe: &Path,
    args: &[String],
    timeout: Duration,
    logdir: &Path,
    tag: &str,
) -> anyhow::Result<String> {
    std::fs::create_dir_all(logdir).ok();
    let [out_path, err_path] = ["out", "err"].map(|x| logdir.join(format!("{tag}.{x}")));
    let create = |p: &PathBuf| {
        std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))
    };
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(create(&out_path)?)
        .stderr(create(&err_path)?);
    tracing::debug!(?cmd, "stock tool");
    let mut child = cmd
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            let log = err_path.display();
            bail!(
                "{} timed out after {timeout:?} ({tag}); log: {log}",
                exe.display()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    if !status.success() {
        let log = std::fs::read_to_string(&err_path).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        bail!(
            "{} failed ({status}, {tag}):\n{}",
            exe.display(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    Ok(std::fs::read_to_string(&out_path)?)
}

/// A server process listening on a loopback port; killed on drop.
pub struct ServerProcess {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ServerProcess {
    /// Starts `cmd` (which is to listen on `127.0.0.1:port`) and waits up to `ready` until it
    /// accepts a connection.
    pub fn start(mut cmd: Command, port: u16, ready: Duration) -> anyhow::Result<ServerProcess> {
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {:?}", cmd.get_program()))?;
        let server = ServerProcess::adopt(child, port);
        let t = Instant::now();
        while TcpStream::connect(server.addr).is_err() {
            if t.elapsed() > ready {
                bail!(
                    "{:?} did not listen on {} within {} s",
                    cmd.get_program(),
                    server.addr,
                    ready.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    /// A running child that listens on `127.0.0.1:port`.
    pub fn adopt(child: Child, port: u16) -> ServerProcess {
        ServerProcess {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }
}

/// Runs `f` against one relay per server over `wire` (`f` gets the relays' addresses, in the
/// order of `servers`) and returns its result and the traffic it caused, summed over the relays.
pub fn through_relay<T>(
    servers: &[SocketAddr],
    wire: Wire,
    f: impl FnOnce(&[SocketAddr]) -> anyhow::Result<T>,
) -> anyhow::Result<(T, Traffic)> {
    let relays = servers
        .iter()
        .map(|&s| Relay::start(s, wire, RelayOptions::default()))
        .collect::<Result<Vec<_>, _>>()?;
    let traffic = || {
        relays
            .iter()
            .fold(Traffic::default(), |t, r| t.plus(&r.counters().snapshot()))
    };
    let before = traffic();
    let out = f(&relays.iter().map(Relay::addr).collect::<Vec<_>>())?;
    // The client has exited; let the relay threads forward the last bytes.
    std::thread::sleep(Duration::from_millis(100));
    Ok((out, traffic().since(&before)))
}
