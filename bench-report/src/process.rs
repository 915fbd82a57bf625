//! Processes a benchmark drives: a tool run to its end with its log captured ([`run_tool`]), and
//! a server on a loopback port, killed on drop ([`ServerProcess`]).

use std::io::BufRead;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// Runs `exe` to its end (killed after `timeout`), its stdout in `logdir/{tag}.out` and its
/// stderr in `logdir/{tag}.err`; returns its stdout, or an error with the log's last lines if it
/// failed.
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

/// `N` distinct loopback ports, free at the time of asking.
pub fn free_ports<const N: usize>() -> std::io::Result<[u16; N]> {
    let held: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    let mut ports = [0; N];
    for (p, l) in ports.iter_mut().zip(&held) {
        *p = l.local_addr()?.port();
    }
    Ok(ports)
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

    /// Starts `cmd`, which prints the loopback port it listens on as its first line of stdout.
    pub fn announced(mut cmd: Command) -> anyhow::Result<ServerProcess> {
        let mut child = cmd.stdout(Stdio::piped()).spawn()?;
        let mut line = String::new();
        let stdout = child.stdout.take().context("no stdout")?;
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        let port = line.trim().parse::<u16>().ok();
        // Adopted first, so that it is killed on every way out.
        let server = ServerProcess::adopt(child, port.unwrap_or(0));
        anyhow::ensure!(port.is_some(), "no port announced (got {line:?})");
        Ok(server)
    }

    /// A running child that listens on `127.0.0.1:port`.
    fn adopt(child: Child, port: u16) -> ServerProcess {
        ServerProcess {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        }
    }
}
