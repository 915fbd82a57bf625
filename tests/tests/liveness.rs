//! Liveness rules of a connection (`connection/`): the idle timeout ends only a connection that
//! holds nothing; one that holds a buffer or a stored graph stays open however long it is silent
//! (a long-running `llama-server` keeps its model on the worker between requests); a request
//! whose header arrived must keep arriving. Contained (Linux): a session process that does not
//! end when its client leaves, by closing or by vanishing without a FIN, is ended by the front
//! (`handoff::watch::ClientWatch`), and its slot and peer share come back.

use std::time::Duration;

use rpc_server::options::ServerOptions;
use rpc_tests::*;

const IDLE: Duration = Duration::from_secs(1);

fn server() -> TestServer {
    TestServer::start_with_options(ServerOptions {
        idle_timeout: Some(IDLE),
        ..TestServer::options()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_holds_nothing_is_closed_when_idle() {
    let s = server();
    let mut c = connect(s.addr).await;
    assert_eq!(c.device_count().await.expect("DEVICE_COUNT"), 1);
    tokio::time::sleep(IDLE * 3).await;
    expect_closed(
        &mut c,
        "a query-only connection silent for 3 × the idle timeout",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_holds_a_buffer_survives_any_silence() {
    let s = server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 3 * 64).await;
    let (a, b, sum) = add_graph(&buf, 16);
    let av: Vec<f32> = (0..16).map(|i| i as f32).collect();
    c.set_tensor(&a, 0, &f32_bytes(&av), false)
        .await
        .expect("SET_TENSOR");
    c.set_tensor(&b, 0, &f32_bytes(&av), false)
        .await
        .expect("SET_TENSOR");
    tokio::time::sleep(IDLE * 4).await;
    // Still there, with its data, and it computes.
    let got = bytes_f32(
        &within("GET_TENSOR after silence", c.get_tensor(&a, 0, 64))
            .await
            .expect("GET_TENSOR"),
    );
    assert_eq!(got, av, "buffer contents after 4 × the idle timeout");
    c.graph_compute(0, &[3], &[a, b, sum])
        .await
        .expect("GRAPH_COMPUTE");
    tokio::time::sleep(IDLE * 4).await;
    c.graph_recompute(0)
        .await
        .expect("GRAPH_RECOMPUTE after silence");
    let got = bytes_f32(&c.get_tensor(&sum, 0, 64).await.expect("GET_TENSOR"));
    assert_eq!(got, (0..16).map(|i| 2.0 * i as f32).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn freeing_the_last_buffer_makes_a_connection_idle_again() {
    let s = server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 256).await;
    tokio::time::sleep(IDLE * 2).await;
    c.free_buffer(buf.handle)
        .await
        .expect("FREE_BUFFER after silence");
    tokio::time::sleep(IDLE * 3).await;
    expect_closed(
        &mut c,
        "a connection that freed everything, then stayed silent",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_stops_mid_body_is_cut_even_when_the_connection_holds_a_buffer() {
    let s = server();
    let mut c = connect(s.addr).await;
    let _buf = alloc(&mut c, 4096).await;
    // A SET_TENSOR header announcing 4000 bytes, then 10 of them, then nothing.
    let mut f = frame(rpc_proto::Command::SetTensor.as_u8(), &[0u8; 10]);
    f[1..rpc_proto::FRAME_HEADER_SIZE].copy_from_slice(&4000u64.to_le_bytes());
    c.send_bytes(&f).await.expect("send");
    expect_closed(&mut c, "a SET_TENSOR whose body stopped arriving").await;
    // A frame header cut after its first byte is a stalled request too.
    let mut c = connect(s.addr).await;
    let _buf = alloc(&mut c, 4096).await;
    c.send_bytes(&[8u8]).await.expect("send");
    expect_closed(&mut c, "a frame header cut after one byte").await;
    assert_healthy(s.addr).await;
}

/// Shutdown (SIGTERM in the binary): a connection waiting for its next request, even one that
/// holds a buffer, is closed at once (its thread sleeps in a blocking read and looks at the stop
/// signal on every tick), and the server returns long before its grace period ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_waiting_connections_without_using_the_grace_period() {
    let s = TestServer::start_with_options(ServerOptions {
        shutdown_grace: Duration::from_secs(20),
        ..TestServer::options()
    });
    let mut holding = connect(s.addr).await;
    let _buf = alloc(&mut holding, 4096).await;
    let mut querying = connect(s.addr).await;
    assert_eq!(querying.device_count().await.expect("DEVICE_COUNT"), 1);
    let start = std::time::Instant::now();
    let stopped = tokio::task::spawn_blocking(move || drop(s));
    within("server shutdown", stopped)
        .await
        .expect("server thread");
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(3),
        "shutdown took {took:?} with two idle connections (grace 20 s)"
    );
    expect_closed(&mut holding, "a connection holding a buffer at shutdown").await;
    expect_closed(&mut querying, "a query-only connection at shutdown").await;
}

// ---------------------------------------------------------------------------------------------
// Contained: a session process that outlives its client
// ---------------------------------------------------------------------------------------------

/// A contained server's options (sessions in processes of the release binary): `max_connections`
/// slots, an idle timeout of 3 s, keepalive `keepalive`.
#[cfg(target_os = "linux")]
fn contained(max_connections: usize, keepalive: Duration) -> ServerOptions {
    let mut o = ServerOptions {
        isolate: true,
        session_exe: Some(release_server_bin(BuildServer::IfMissing)),
        max_connections,
        idle_timeout: Some(Duration::from_secs(3)),
        keepalive: Some(keepalive),
        ..TestServer::options()
    };
    o.session.threads = 1;
    o
}

/// Processes that are not zombies and whose command line has `needle` (NUL-separated), from
/// `/proc`: a contained session is two, its outer stage and its inner one.
#[cfg(target_os = "linux")]
fn processes_with(needle: &[u8]) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(") ")
            .is_none_or(|(_, rest)| rest.starts_with(['Z', 'X']));
        if !zombie && cmd.windows(needle.len()).any(|w| w == needle) {
            found.push(pid);
        }
    }
    found.sort_unstable();
    found
}

/// The session processes serving the client at `client` (`--session-peer`).
#[cfg(target_os = "linux")]
fn sessions_of(client: std::net::SocketAddr) -> Vec<u32> {
    processes_with(format!("--session-peer\0{client}\0").as_bytes())
}

/// Waits (at most 10 s) until `f` returns something non-empty.
#[cfg(target_os = "linux")]
fn wait_some(what: &str, f: impl Fn() -> Vec<u32>) -> Vec<u32> {
    let t = std::time::Instant::now();
    loop {
        let v = f();
        if !v.is_empty() {
            return v;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "no {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until none of `pids` runs; how long that took, or `None` past `limit`.
#[cfg(target_os = "linux")]
async fn gone_within(pids: &[u32], limit: Duration) -> Option<Duration> {
    let t = std::time::Instant::now();
    while pids
        .iter()
        .any(|p| std::path::Path::new(&format!("/proc/{p}/cmdline")).exists() && !zombie(*p))
    {
        if t.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Some(t.elapsed())
}

#[cfg(target_os = "linux")]
fn zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.starts_with(['Z', 'X'])))
        .unwrap_or(true)
}

/// Stops `pids` (SIGSTOP): a session process that never reads or ends again, as compromised
/// code in it would.
#[cfg(target_os = "linux")]
fn stop(pids: &[u32]) {
    let st = std::process::Command::new("kill")
        .arg("-STOP")
        .args(pids.iter().map(u32::to_string))
        .status()
        .expect("kill");
    assert!(st.success(), "kill -STOP {pids:?}");
}

/// The bound the README states for a client that closed: the front shuts the socket down
/// `HANGUP_GRACE` after the client left and kills the process `HANGUP_GRACE` later; the rest is
/// slack for a loaded machine.
#[cfg(target_os = "linux")]
const CLOSED_BOUND: Duration =
    Duration::from_secs(2 * rpc_server::handoff::HANGUP_GRACE.as_secs() + 2);

/// A client from `from` that holds a 16 MiB buffer (so its connection is handed to a session
/// process), with a 4 KiB receive buffer; its local address.
#[cfg(target_os = "linux")]
async fn handed_off(
    addr: std::net::SocketAddr,
    from: &str,
) -> (rpc_client::Client, Buf, std::net::SocketAddr) {
    let s = tcp_from(addr, from.parse().unwrap(), Some(4096))
        .await
        .expect("connect");
    let local = s.local_addr().unwrap();
    let mut c = rpc_client::Client::new(rpc_transport::TcpTransport::new(s).unwrap());
    within("HELLO", c.hello()).await.expect("HELLO");
    let buf = alloc(&mut c, 16 << 20).await;
    (c, buf, local)
}

/// The case: with `--max-connections 2`, two clients whose session processes stop
/// reading (one of them blocked writing a 16 MiB GET_TENSOR reply its client never reads) and
/// which then close (one with that reply unread: a reset; the other a FIN). Before, both
/// session processes ran on past every timeout and a new client waited for a slot for ever;
/// now the front ends them and the new client is served, within `CLOSED_BOUND`.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_outlives_its_closed_client_is_ended_by_the_front() {
    use std::sync::atomic::Ordering::Relaxed;
    let s = TestServer::start_with_options(contained(2, Duration::from_secs(2)));
    let mut clients = Vec::new();
    let mut pids = Vec::new();
    for (i, from) in ["127.0.0.2", "127.0.0.3"].into_iter().enumerate() {
        let (mut c, buf, local) = handed_off(s.addr8, from).await;
        let session = wait_some("session process", || sessions_of(local));
        if i == 0 {
            let t = buf.f32(1, &[4 << 20], 0).build();
            let mut f = Vec::new();
            rpc_proto::Request::GetTensor {
                tensor: t,
                offset: 0,
                size: 16 << 20,
            }
            .encode(&mut f);
            c.send_bytes(&f).await.expect("GET_TENSOR");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        stop(&session);
        pids.extend(session);
        clients.push(c);
    }
    drop(clients);
    let took = gone_within(&pids, Duration::from_secs(20))
        .await
        .expect("the session processes of two clients that closed still run 20 s later");
    let (mut c, _buf, _) = within("a new client", handed_off(s.addr8, "127.0.0.4")).await;
    assert_eq!(c.device_count().await.expect("DEVICE_COUNT"), 1);
    eprintln!("sessions of closed clients ended {took:?} after the close");
    assert!(
        took < CLOSED_BOUND,
        "ended after {took:?} (bound {CLOSED_BOUND:?})"
    );
    assert!(s.stats.closed_with_error.load(Relaxed) >= 2);
}

/// The same with `--session-pool 1`: the connection goes to a process started ahead
/// (`handoff::spawn::assign`).
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_session_that_outlives_its_client_is_ended_by_the_front() {
    let s = TestServer::start_with_options(ServerOptions {
        session_pool: 1,
        ..contained(1, Duration::from_secs(2))
    });
    // The pooled process of this server: a child of this process, `--session-wait`.
    let waiting = || {
        let mine = children(std::process::id());
        processes_with(b"--session-wait\0")
            .into_iter()
            .filter(|p| mine.contains(p))
            .collect::<Vec<u32>>()
    };
    let ready = wait_some("pooled session process", waiting);
    let (c, _buf, _) = handed_off(s.addr8, "127.0.0.2").await;
    // The one that took the connection (its replacement starts 50 ms later), and its inner
    // stage.
    let mut session: Vec<u32> = ready.into_iter().filter(|p| !zombie(*p)).collect();
    let inner: Vec<u32> = session.iter().flat_map(|p| children(*p)).collect();
    session.extend(inner);
    assert!(!session.is_empty(), "the pooled session process is gone");
    stop(&session);
    let closed = std::time::Instant::now();
    drop(c);
    let took = gone_within(&session, Duration::from_secs(20))
        .await
        .expect("a pooled session process whose client closed still runs 20 s later");
    let (mut c, _buf, _) = within("a new client", handed_off(s.addr8, "127.0.0.3")).await;
    assert_eq!(c.device_count().await.expect("DEVICE_COUNT"), 1);
    eprintln!(
        "pooled session ended {took:?} after the close ({:?} until a new client held a buffer)",
        closed.elapsed()
    );
    assert!(
        took < CLOSED_BOUND,
        "ended after {took:?} (bound {CLOSED_BOUND:?})"
    );
}

/// The children of `pid` (`/proc/<pid>/task/*/children`).
#[cfg(target_os = "linux")]
fn children(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let c = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        v.extend(c.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
    }
    v
}

/// Environment variable that turns [`vanishing_client_helper`] into a client of this address.
#[cfg(target_os = "linux")]
const VANISH_ENV: &str = "RPC_TESTS_VANISHING_CLIENT";

/// Not a test: run by [`a_session_whose_client_vanished_is_ended_by_the_front`] in a network
/// namespace of its own (with [`VANISH_ENV`]). Connects, holds a buffer (its connection goes to a
/// session process), prints its local address and waits to be killed.
#[cfg(target_os = "linux")]
#[test]
#[ignore = "helper: the client that vanishes (run in a network namespace by a_session_whose_client_vanished_is_ended_by_the_front)"]
fn vanishing_client_helper() {
    let Ok(addr) = std::env::var(VANISH_ENV) else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let s = tokio::net::TcpStream::connect(addr.as_str())
            .await
            .expect("connect");
        let local = s.local_addr().expect("local address");
        let mut c = rpc_client::Client::new(rpc_transport::TcpTransport::new(s).unwrap());
        c.hello().await.expect("HELLO");
        let _buf = alloc(&mut c, 1 << 20).await;
        {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "\nRPC_TESTS_CLIENT={local}");
            let _ = out.flush();
        }
        std::future::pending::<()>().await;
    });
}

/// A network namespace behind a veth pair (`ip`, as root), deleted when dropped: the server
/// listens on the host end, a client runs in the namespace and vanishes when its end goes down.
#[cfg(target_os = "linux")]
struct Netns {
    name: String,
    host_if: String,
    ns_if: String,
    host_ip: String,
}

#[cfg(target_os = "linux")]
impl Netns {
    /// `None` where it cannot be made (not root, no iproute2).
    fn new() -> Option<Netns> {
        let id = std::process::id() % 100_000;
        let net = format!("10.231.{}", 80 + id % 100);
        let n = Netns {
            name: format!("rpclive{id}"),
            host_if: format!("rl{id}h"),
            ns_if: format!("rl{id}n"),
            host_ip: format!("{net}.1"),
        };
        let ns_ip = format!("{net}.2");
        let ok = [
            vec!["netns", "add", &n.name],
            vec![
                "link", "add", &n.host_if, "type", "veth", "peer", "name", &n.ns_if,
            ],
            vec!["link", "set", &n.ns_if, "netns", &n.name],
            vec![
                "addr",
                "add",
                &format!("{}/30", n.host_ip),
                "dev",
                &n.host_if,
            ],
            vec!["link", "set", &n.host_if, "up"],
            vec![
                "-n",
                &n.name,
                "addr",
                "add",
                &format!("{ns_ip}/30"),
                "dev",
                &n.ns_if,
            ],
            vec!["-n", &n.name, "link", "set", &n.ns_if, "up"],
            vec!["-n", &n.name, "link", "set", "lo", "up"],
        ]
        .iter()
        .all(|args| ip(args));
        ok.then_some(n)
    }

    /// The client's end of the link goes down: nothing it sends arrives any more.
    fn cut(&self) {
        assert!(ip(&["-n", &self.name, "link", "set", &self.ns_if, "down"]));
    }
}

#[cfg(target_os = "linux")]
impl Drop for Netns {
    fn drop(&mut self) {
        ip(&["link", "del", &self.host_if]);
        ip(&["netns", "del", &self.name]);
    }
}

#[cfg(target_os = "linux")]
fn ip(args: &[&str]) -> bool {
    std::process::Command::new("ip")
        .args(args)
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A client that vanishes without a FIN (its namespace's link goes down, then it is killed)
/// while its session process never reads (stopped): the kernel gives up on the peer after the
/// keepalive bound (`--keepalive 1`: 1 s of silence, 6 probes 1 s apart), and the front ends the
/// process within `HANGUP_GRACE` × 2 of that. Before, the process ran on and held its slot.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_whose_client_vanished_is_ended_by_the_front() {
    use std::io::BufRead;
    let Some(net) = Netns::new() else {
        eprintln!("skip: a network namespace needs root and iproute2");
        return;
    };
    let keepalive = Duration::from_secs(1);
    let s = TestServer::start_on(&net.host_ip, contained(1, keepalive));
    let mut client = std::process::Command::new("ip")
        .args(["netns", "exec", &net.name])
        .arg(std::env::current_exe().expect("this test binary"))
        .args([
            "vanishing_client_helper",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(VANISH_ENV, s.addr8.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("the namespaced client");
    let out = std::io::BufReader::new(client.stdout.take().expect("stdout"));
    let local: std::net::SocketAddr = out
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            l.split("RPC_TESTS_CLIENT=")
                .nth(1)
                .map(|a| a.trim().to_string())
        })
        .expect("the namespaced client did not get a buffer")
        .parse()
        .expect("an address");
    let session = wait_some("session process", || sessions_of(local));
    stop(&session);
    net.cut();
    let _ = client.kill();
    let _ = client.wait();
    let bound = rpc_server::server::keepalive_deadline(keepalive) + CLOSED_BOUND;
    let took = gone_within(&session, bound + Duration::from_secs(10))
        .await
        .expect("the session process of a client that vanished still runs");
    let mut c = within("a new client", connect(s.addr8)).await;
    let _buf = alloc(&mut c, 4096).await;
    eprintln!("session of a vanished client ended {took:?} after it vanished");
    assert!(took < bound, "ended after {took:?} (bound {bound:?})");
}
