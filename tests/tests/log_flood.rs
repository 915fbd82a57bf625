//! The log flood a remote party can cause is bounded per peer (`rpc-server/src/peer_log.rs`):
//! one client floods the real server binary with requests that each make it log (COMM_INITs it
//! refuses at once on one connection, connections opened and closed on others) for
//! [`FLOOD`], contained and with `--no-isolate`; the server's log grows by at most the per-peer
//! bound over that time (64 KiB at once, 256 KiB in any minute), names the peer in a
//! `suppressed N log lines` summary, and the server still serves.
//!
//! The bound is the documented one, written out here (not the server's constants), so that the
//! test checks any build against it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rpc_tests::rpc_client::CommInit;
use rpc_tests::*;

/// How long the client floods.
const FLOOD: Duration = Duration::from_secs(12);
/// What a peer may make the server log at once, and per minute (the burst included).
const BURST: f64 = 64.0 * 1024.0;
const PER_MINUTE: f64 = 256.0 * 1024.0;
/// Lines that name no peer, a line charged just before the first measurement, the summaries.
const SLACK: f64 = 8.0 * 1024.0;

/// The server process (its stdout and stderr in one file), killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let port = free_port();
        let log = std::env::temp_dir().join(format!("rpc-log-flood-{port}.log"));
        let f = std::fs::File::create(&log).expect("log file");
        let child = Command::new(release_server_bin(BuildServer::IfMissing))
            .args(["-H", "127.0.0.1", "-p", &port.to_string(), "-t", "1"])
            .args(extra)
            // The default level: what an operator who set nothing gets.
            .env_remove("RPC_LOG")
            .stdin(Stdio::null())
            .stdout(f.try_clone().expect("log"))
            .stderr(f)
            .spawn()
            .expect("start rpc-server");
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        wait_listening(addr);
        Server { child, addr, log }
    }

    fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0)
    }

    fn log(&self) -> String {
        String::from_utf8_lossy(&std::fs::read(&self.log).unwrap_or_default()).into_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A COMM_INIT every server refuses before opening a socket (rank 0 listens only on its own
/// port + 1000, never on a privileged port); the refusal is logged.
fn refused_init() -> CommInit {
    CommInit {
        device: 0,
        rank: 0,
        world: 2,
        port: 80,
        host: CommInit::host_field("").expect("empty host"),
    }
}

async fn flood_is_bounded(extra: &[&str]) {
    let s = Server::start(extra);
    let addr = s.addr;
    let mut c = connect(addr).await;
    // The first one starts the session (contained).
    assert!(!c.comm_init(refused_init()).await.expect("COMM_INIT"));
    let (size0, t0) = (s.log_len(), Instant::now());
    let until = t0 + FLOOD;
    let churn = tokio::spawn(async move {
        let mut n = 0u64;
        while Instant::now() < until {
            if let Ok(c) = tokio::net::TcpStream::connect(addr).await {
                drop(c);
                n += 1;
            }
        }
        n
    });
    let (mut inits, mut reconnects) = (0u64, 0u64);
    while Instant::now() < until {
        match c.comm_init(refused_init()).await {
            Ok(joined) => {
                assert!(!joined, "a COMM_INIT to port 80 joined");
                inits += 1;
            }
            Err(_) => {
                c = connect(addr).await;
                reconnects += 1;
            }
        }
    }
    let churned = churn.await.unwrap();
    let (size1, window) = (s.log_len(), t0.elapsed());
    let grown = size1.saturating_sub(size0) as f64;
    let bound = BURST + (PER_MINUTE - BURST) / 60.0 * window.as_secs_f64() + SLACK;
    eprintln!(
        "{extra:?}: {inits} COMM_INITs ({reconnects} reconnects), {churned} connections in {:.1} s: \
         the log grew by {:.0} KiB (bound {:.0} KiB)",
        window.as_secs_f64(),
        grown / 1024.0,
        bound / 1024.0
    );
    let log = s.log();
    assert!(
        log.contains("COMM_INIT"),
        "the flood's requests are logged: {log}"
    );
    assert!(
        grown <= bound,
        "{extra:?}: the log grew by {grown} bytes in {window:?}, over the per-peer bound of {bound}"
    );
    // The summary names the peer (the first comes 10 s after the first line dropped).
    let t = Instant::now();
    let summary = loop {
        let log = s.log();
        if let Some(l) = log
            .lines()
            .find(|l| l.contains("suppressed ") && l.contains("from peer 127.0.0.1 "))
        {
            break l.to_string();
        }
        assert!(
            t.elapsed() < Duration::from_secs(15),
            "{extra:?}: no summary of the suppressed lines naming the peer: {}",
            log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("{extra:?}: {summary}");
    assert_healthy(addr).await;
    assert!(
        !c.comm_init(refused_init())
            .await
            .expect("COMM_INIT after the flood"),
        "the flooding client is still served"
    );
}

/// Contained (the default): the front's lines and the session process's relayed ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_peer_is_bounded_contained() {
    flood_is_bounded(&[]).await;
}

/// `--no-isolate`: the session logs on the connection's thread, under its `conn` span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_from_one_peer_is_bounded_without_isolation() {
    flood_is_bounded(&["--no-isolate"]).await;
}
