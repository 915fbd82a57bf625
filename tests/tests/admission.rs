//! Admission and request deadlines (`admission.rs`, `server.rs`, `connection.rs`): connections
//! from outside `--allow` and over a peer's share are closed unread; a connection takes a slot
//! only once its HELLO is in, and must send all of it in time; a started request must keep
//! arriving whatever the idle timeout; a request body is charged to the memory budget before a
//! byte of it is read, and memory follows the bytes that arrive, not the size a header claims.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use rpc_proto::Command;
use rpc_server::admission::AllowList;
use rpc_server::server::ServerOptions;
use rpc_server::session::MemoryLimits;
use rpc_server::stats::Refusal;
use rpc_tests::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn hello() -> Vec<u8> {
    frame(Command::Hello as u8, &[0u8; rpc_proto::CONN_CAPS_SIZE])
}

async fn raw(addr: SocketAddr) -> TcpStream {
    within("connect", TcpStream::connect(addr))
        .await
        .expect("connect")
}

/// How long until the server closes `s` (reading and discarding anything it sends), or `None`
/// if it is still open after `limit`.
async fn closed_after(s: &mut TcpStream, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    let mut b = [0u8; 256];
    loop {
        match tokio::time::timeout_at((start + limit).into(), s.read(&mut b)).await {
            Err(_) => return None,
            Ok(Ok(n)) if n > 0 => continue,
            Ok(_) => return Some(start.elapsed()),
        }
    }
}

/// Whether the server answers a HELLO on `s` (reads the 8-byte size prefix of the reply).
async fn answers_hello(s: &mut TcpStream, limit: Duration) -> bool {
    if s.write_all(&hello()).await.is_err() {
        return false;
    }
    let mut b = [0u8; 8];
    matches!(
        tokio::time::timeout(limit, s.read_exact(&mut b)).await,
        Ok(Ok(_))
    )
}

/// Waits (up to 5 s) until `stats` has counted `n` refusals for `why`: the count is taken as
/// the server's thread ends, just after the client saw its socket close.
async fn refused(s: &TestServer, why: Refusal, n: u64) {
    let t = Instant::now();
    while s.stats.refused(why) != n {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{why:?}: {} refusals counted, expected {n}",
            s.stats.refused(why)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// RSS of this process (the server runs in it), from /proc; 0 where there is none.
fn rss() -> u64 {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb << 10)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_address_outside_allow_is_closed_unread() {
    let s = TestServer::start_with_options(ServerOptions {
        allow: AllowList(vec![
            "10.0.0.0/8".parse().unwrap(),
            "fe80::/10".parse().unwrap(),
        ]),
        ..Default::default()
    });
    let mut c = raw(s.addr).await;
    let closed = closed_after(&mut c, Duration::from_secs(5)).await;
    assert!(
        closed.is_some(),
        "a connection from 127.0.0.1 with --allow 10.0.0.0/8,fe80::/10 stayed open"
    );
    let mut c = raw(s.addr).await;
    assert!(
        !answers_hello(&mut c, Duration::from_secs(2)).await,
        "a HELLO from outside --allow was answered"
    );
    refused(&s, Refusal::NotAllowed, 2).await;
    assert_eq!(s.stats.connections.load(Relaxed), 0, "none was served");

    let open = TestServer::start_with_options(ServerOptions {
        allow: AllowList(vec!["127.0.0.0/8".parse().unwrap()]),
        ..Default::default()
    });
    let mut c = connect(open.addr).await;
    assert_eq!(c.device_count().await.expect("DEVICE_COUNT"), 1);
    assert_eq!(open.stats.refused(Refusal::NotAllowed), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_gets_its_share_of_the_slots_and_no_more() {
    let s = TestServer::start_with_options(ServerOptions {
        max_connections: 8,
        max_per_peer: Some(2),
        // Loopback is exempt by default; these connections come from 127.0.0.1.
        share_exempt: vec![],
        hello_timeout: Duration::from_secs(2),
        ..Default::default()
    });
    let mut a = raw(s.addr).await;
    let mut b = raw(s.addr).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The third connection from 127.0.0.1 is closed at once, long before the HELLO deadline.
    let mut third = raw(s.addr).await;
    let t = closed_after(&mut third, Duration::from_secs(1)).await;
    assert!(t.is_some(), "a third connection over a share of 2 was kept");
    refused(&s, Refusal::PeerShare, 1).await;
    // The two silent ones end on the HELLO deadline and give their places back.
    for c in [&mut a, &mut b] {
        let t = closed_after(c, Duration::from_secs(10)).await;
        assert!(
            t.is_some_and(|t| t < Duration::from_secs(5)),
            "silent connection: {t:?}"
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut c = connect(s.addr).await;
    assert_eq!(c.device_count().await.expect("DEVICE_COUNT"), 1);
    refused(&s, Refusal::NoHello, 2).await;
}

/// Without an idle timeout (`--idle-timeout 0`) a connection that says nothing used to hold a
/// slot for ever; now it holds none, and ends on the HELLO deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_holds_no_slot_and_ends_on_the_hello_deadline() {
    let s = TestServer::start_with_options(ServerOptions {
        max_connections: 2,
        max_per_peer: Some(8),
        idle_timeout: None,
        hello_timeout: Duration::from_secs(3),
        ..Default::default()
    });
    let mut silent = raw(s.addr).await;
    let mut served = connect(s.addr).await;
    let _buf = alloc(&mut served, 4096).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Both slots would be taken if the silent connection held one.
    let mut third = within("a second served connection", connect(s.addr)).await;
    assert_eq!(third.device_count().await.expect("DEVICE_COUNT"), 1);
    let t = closed_after(&mut silent, Duration::from_secs(10)).await;
    assert!(
        t.is_some_and(|t| t >= Duration::from_secs(2) && t < Duration::from_secs(6)),
        "a silent connection with a 3 s HELLO deadline and no idle timeout: {t:?}"
    );
    refused(&s, Refusal::NoHello, 1).await;
}

/// The HELLO deadline is for the whole HELLO, not per byte: a client that trickles it in is
/// closed when the deadline passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_hello_is_closed_on_the_deadline() {
    let s = TestServer::start_with_options(ServerOptions {
        hello_timeout: Duration::from_secs(2),
        ..Default::default()
    });
    let mut c = raw(s.addr).await;
    let start = Instant::now();
    let h = hello();
    let mut sent = 0;
    for byte in &h {
        if c.write_all(std::slice::from_ref(byte)).await.is_err() {
            break;
        }
        sent += 1;
        tokio::time::sleep(Duration::from_millis(250)).await;
        if start.elapsed() > Duration::from_secs(6) {
            break;
        }
    }
    let t = closed_after(&mut c, Duration::from_secs(5)).await;
    assert!(t.is_some(), "the trickling client is still connected");
    assert!(
        sent < h.len(),
        "the server read all {} HELLO bytes at 4 bytes/s (took {:?}) with a 2 s deadline",
        h.len(),
        start.elapsed()
    );
    refused(&s, Refusal::NoHello, 1).await;
}

/// `--idle-timeout 0` switches off only the idle rule: a request whose body stops still ends on
/// `--request-timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_body_ends_on_the_request_timeout_without_an_idle_timeout() {
    let s = TestServer::start_with_options(ServerOptions {
        idle_timeout: None,
        request_timeout: Duration::from_secs(2),
        ..Default::default()
    });
    let mut c = connect(s.addr).await;
    let _buf = alloc(&mut c, 4096).await;
    let mut head = vec![Command::GraphCompute as u8];
    head.extend_from_slice(&(1u64 << 20).to_le_bytes());
    head.extend_from_slice(&[0u8; 100]);
    c.send_bytes(&head).await.expect("send");
    let start = Instant::now();
    expect_closed(&mut c, "a GRAPH_COMPUTE body that stops after 100 bytes").await;
    let t = start.elapsed();
    assert!(
        t >= Duration::from_secs(1) && t < Duration::from_secs(6),
        "closed after {t:?} with a 2 s request timeout"
    );
    assert_healthy(s.addr).await;
}

/// A GRAPH_COMPUTE header claiming more than the budget allows ends the connection before a
/// byte of its body is read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_budget_is_refused_before_it_is_read() {
    let s = TestServer::start_with_options(ServerOptions {
        memory: MemoryLimits {
            per_connection: 64 << 20,
            total: 96 << 20,
        },
        ..Default::default()
    });
    let mut c = connect(s.addr).await;
    let _buf = alloc(&mut c, 4096).await;
    let budget = s.stats.budget().expect("serving").clone();
    let refused = budget.refused();
    let mut head = vec![Command::GraphCompute as u8];
    head.extend_from_slice(&(200u64 << 20).to_le_bytes());
    c.send_bytes(&head).await.expect("send");
    let start = Instant::now();
    expect_closed(&mut c, "a 200 MiB GRAPH_COMPUTE over a 64 MiB budget").await;
    assert!(
        start.elapsed() < Duration::from_secs(3),
        "refused only after {:?}",
        start.elapsed()
    );
    assert_eq!(budget.refused(), refused + 1);
    assert_eq!(
        budget.used(),
        0,
        "the charge and the buffer were given back"
    );
    // Within the budget, the same kind of request is read (and then refused as a malformed graph
    // only when its bytes say so).
    let mut c = connect(s.addr).await;
    assert_eq!(c.device_count().await.expect("DEVICE_COUNT"), 1);
}

/// Memory follows the bytes that arrive: a header claiming 256 MiB followed by a trickle does
/// not make the server reserve (and zero) 256 MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_follows_the_bytes_that_arrive() {
    if rss() == 0 {
        eprintln!("skip: no /proc/self/status here");
        return;
    }
    let s = TestServer::start_with_options(ServerOptions::default());
    let before = rss();
    let mut conns = Vec::new();
    for _ in 0..4 {
        let mut c = connect(s.addr).await;
        let mut head = vec![Command::GraphCompute as u8];
        head.extend_from_slice(&(256u64 << 20).to_le_bytes());
        head.extend_from_slice(&[0u8; 4096]);
        c.send_bytes(&head).await.expect("send");
        conns.push(c);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let grown = rss().saturating_sub(before);
    assert!(
        grown < 64 << 20,
        "4 pending 256 MiB GRAPH_COMPUTE claims with 4 KiB sent each grew RSS by {} MiB",
        grown >> 20
    );
    drop(conns);
    assert_healthy(s.addr).await;
}
