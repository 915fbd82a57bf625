//! A dead worker gives the client a clean connection close, promptly, never a hang: a worker
//! process killed with SIGKILL (with and without a per-client upstream connection), a worker
//! that dies in the middle of a request, one that accepts but never answers, one that is not
//! there; and the shim serves again once the worker is back.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Not a test: the body of the child worker process (see `ChildServer`).
#[test]
#[ignore = "helper: the worker process of the tests that kill it (run by ChildServer::start)"]
fn child_worker() {
    child_server_main();
}

/// An rpc-server in a child process (this test binary re-run as `child_worker`), to be killed
/// with SIGKILL.
fn start_child() -> ChildServer {
    ChildServer::start("child_worker")
}

/// A fixed address in front of a worker that can be replaced: a plain TCP forwarder to whatever
/// `target` currently holds (connections to a dead target fail and are closed).
async fn forwarder(target: Arc<Mutex<SocketAddr>>) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = l.accept().await else {
                return;
            };
            let t = *target.lock().unwrap();
            tokio::spawn(async move {
                if let Ok(mut s) = tokio::net::TcpStream::connect(t).await {
                    let _ = tokio::io::copy_bidirectional(&mut c, &mut s).await;
                }
            });
        }
    });
    addr
}

/// Waits for the shim to close `c`; returns how long it took.
async fn closed_within(c: &mut Client, limit: Duration, what: &str) -> Duration {
    let t0 = Instant::now();
    match tokio::time::timeout(limit, c.wait_closed()).await {
        Ok(Ok(())) => t0.elapsed(),
        Ok(Err(e)) => panic!("{what}: expected a clean close, got {e}"),
        Err(_) => {
            panic!("{what}: the client connection was neither closed nor answered within {limit:?}")
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_closes_a_client_with_a_session_promptly() {
    let mut child = start_child();
    let shim = shim_tcp(child.addr, test_opts()).await;
    let mut c = connect(shim.local).await;
    let buf = alloc(&mut c, 3 * 64).await;
    let (a, b, s) = add_graph(&buf, 16);
    c.set_tensor(&a, 0, &f32_bytes(&[1.0; 16]), false)
        .await
        .unwrap();
    c.set_tensor(&b, 0, &f32_bytes(&[1.0; 16]), false)
        .await
        .unwrap();
    c.graph_compute(0, &[3], &[a, b, s]).await.unwrap();
    assert_eq!(
        bytes_f32(&c.get_tensor(&s, 0, 64).await.unwrap()),
        [2.0; 16]
    );
    child.kill();
    let dt = closed_within(
        &mut c,
        Duration::from_secs(5),
        "idle client after the worker was killed",
    )
    .await;
    assert!(dt < Duration::from_secs(2), "closed after {dt:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_closes_idle_clients_without_a_session() {
    let mut child = start_child();
    let shim = shim_tcp(child.addr, test_opts()).await;
    // Two clients that only asked queries (cache and control connection).
    let mut c1 = connect(shim.local).await;
    assert_eq!(c1.device_count().await.unwrap(), 1);
    let mut c2 = connect(shim.local).await;
    assert!(c2.get_device_memory(0).await.unwrap().total > 0);
    child.kill();
    for c in [&mut c1, &mut c2] {
        let dt = closed_within(
            c,
            Duration::from_secs(5),
            "query-only client after the worker was killed",
        )
        .await;
        assert!(dt < Duration::from_secs(2), "closed after {dt:?}");
    }
    // New clients: HELLO is local, the first command needing the worker closes promptly.
    let mut c = connect(shim.local).await;
    let t0 = Instant::now();
    assert_closed(
        within("GET_DEVICE_MEMORY", c.get_device_memory(0)).await,
        "GET_DEVICE_MEMORY, worker dead",
    );
    assert!(t0.elapsed() < Duration::from_secs(3));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shim_serves_again_when_the_worker_is_back() {
    let mut child = start_child();
    let target = Arc::new(Mutex::new(child.addr));
    let front = forwarder(target.clone()).await;
    let shim = shim_tcp(front, test_opts()).await;
    assert_healthy(shim.local).await;
    child.kill();
    let mut c = connect(shim.local).await;
    assert_closed(
        within("ALLOC_BUFFER", c.alloc_buffer(0, 64)).await,
        "ALLOC_BUFFER, worker dead",
    );
    let child2 = start_child();
    *target.lock().unwrap() = child2.addr;
    assert_healthy(shim.local).await;
    short_connection_burst(shim.local).await;
}

/// A fake worker: answers HELLO, then handles connections with `on_request(cmd)`:
/// `Some(reply)` answers, `None` closes the connection (the worker dies mid-request).
async fn fake_worker(
    answer_hello: bool,
    on_request: fn(u8) -> Option<Vec<u8>>,
    delay: Duration,
) -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut hello = [0u8; 9 + 24];
                if s.read_exact(&mut hello).await.is_err() {
                    return;
                }
                if !answer_hello {
                    // Accept, read, never answer: hold the socket for a long time.
                    tokio::time::sleep(Duration::from_secs(60)).await;
                    return;
                }
                let mut rsp = 28u64.to_le_bytes().to_vec();
                rsp.extend_from_slice(&[7, 0, 0, 0]);
                rsp.extend_from_slice(&[0; 24]);
                if s.write_all(&rsp).await.is_err() {
                    return;
                }
                loop {
                    let mut h = [0u8; 9];
                    if s.read_exact(&mut h).await.is_err() {
                        return;
                    }
                    let n = u64::from_le_bytes(h[1..9].try_into().unwrap()) as usize;
                    let mut p = vec![0u8; n];
                    if s.read_exact(&mut p).await.is_err() {
                        return;
                    }
                    tokio::time::sleep(delay).await;
                    match on_request(h[0]) {
                        Some(payload) => {
                            let mut r = (payload.len() as u64).to_le_bytes().to_vec();
                            r.extend_from_slice(&payload);
                            if s.write_all(&r).await.is_err() {
                                return;
                            }
                        }
                        None => return, // dies: the socket closes
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_dying_mid_request_closes_the_client() {
    // Answers queries; dies while "computing" the first ALLOC_BUFFER.
    fn handler(cmd: u8) -> Option<Vec<u8>> {
        match cmd {
            15 => Some(1u32.to_le_bytes().to_vec()),
            1 => Some(32u64.to_le_bytes().to_vec()),
            2 => Some(u64::MAX.to_le_bytes().to_vec()),
            _ => None,
        }
    }
    let w = fake_worker(true, handler, Duration::from_millis(300)).await;
    let shim = shim_tcp(w, test_opts()).await;
    let mut c = connect(shim.local).await;
    assert_eq!(c.device_count().await.unwrap(), 1);
    let t0 = Instant::now();
    assert_closed(
        within("ALLOC_BUFFER", c.alloc_buffer(0, 64)).await,
        "worker died during ALLOC_BUFFER",
    );
    let dt = t0.elapsed();
    assert!(dt < Duration::from_secs(2), "closed after {dt:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_worker_hits_the_handshake_timeout() {
    fn never(_: u8) -> Option<Vec<u8>> {
        None
    }
    let w = fake_worker(false, never, Duration::ZERO).await;
    let opts = Options {
        prefetch: false,
        ..test_opts()
    }; // handshake timeout 2 s
    let shim = shim_tcp(w, opts).await;
    for what in ["query", "session"] {
        let mut c = connect(shim.local).await;
        let t0 = Instant::now();
        let r = if what == "query" {
            c.device_count().await.map(|_| ())
        } else {
            c.alloc_buffer(0, 64).await.map(|_| ())
        };
        assert_closed(r, what);
        let dt = t0.elapsed();
        assert!(
            dt >= Duration::from_millis(1500) && dt < Duration::from_secs(4),
            "{what}: closed after {dt:?}"
        );
    }
}
