//! Admission and request deadlines (`admission.rs`, `server.rs`, `connection/`): connections
//! from outside `--allow` and over a peer's share are closed unread; a connection takes a slot
//! only once its HELLO is in, and must send all of it in time; a started request must keep
//! arriving whatever the idle timeout; a request body is charged to the memory budget before a
//! byte of it is read, and memory follows the bytes that arrive, not the size a header claims;
//! when every slot is taken a new client takes the slot of the oldest connection that holds
//! nothing (HELLO-only connections cannot lock clients out), never of one that holds a buffer,
//! with sessions in this process (`--no-isolate`) and contained (a session process each).

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use rpc_proto::Command;
use rpc_server::options::ServerOptions;
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
        allow: vec!["10.0.0.0/8".parse().unwrap(), "fe80::/10".parse().unwrap()],
        ..TestServer::options()
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
        allow: vec!["127.0.0.0/8".parse().unwrap()],
        ..TestServer::options()
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
        hello_timeout: Duration::from_secs(2),
        ..TestServer::options()
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
        ..TestServer::options()
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
        ..TestServer::options()
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
        ..TestServer::options()
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
        max_alloc_per_connection: Some(64 << 20),
        max_alloc_total: Some(96 << 20),
        ..TestServer::options()
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
    let s = TestServer::start_with_options(TestServer::options());
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

/// The two ways sessions run: in the server's process (`--no-isolate`), or contained, a process
/// each (the default): the front serves a connection until its first stateful command, then
/// hands it to a session process of the release binary.
#[derive(Debug, Clone, Copy)]
enum Mode {
    InProcess,
    #[cfg(unix)]
    Contained,
}

fn server(mode: Mode, max_connections: usize) -> TestServer {
    server_with(
        mode,
        ServerOptions {
            max_connections,
            // These tests fill every slot from 127.0.0.1: it is exempt from the per-peer share
            // here (`--peer-share-exempt`); the share's own tests are below.
            share_exempt: vec!["127.0.0.1".parse().unwrap()],
            ..TestServer::options()
        },
    )
}

/// A server with `opts`, its sessions run as `mode` says.
fn server_with(mode: Mode, opts: ServerOptions) -> TestServer {
    let opts = match mode {
        Mode::InProcess => opts,
        #[cfg(unix)]
        Mode::Contained => {
            let mut o = ServerOptions {
                isolate: true,
                session_exe: Some(release_server_bin(BuildServer::IfMissing)),
                ..opts
            };
            o.session.threads = 1;
            o
        }
    };
    TestServer::start_with_options(opts)
}

/// Connects, sends a HELLO and reads its whole reply (which comes once the connection holds a
/// slot), then says nothing more.
async fn hello_only(addr: SocketAddr) -> TcpStream {
    let mut s = raw(addr).await;
    s.write_all(&hello()).await.expect("send HELLO");
    let mut size = [0u8; 8];
    within("HELLO reply", s.read_exact(&mut size))
        .await
        .expect("HELLO reply");
    let mut reply = vec![0u8; u64::from_le_bytes(size) as usize];
    s.read_exact(&mut reply).await.expect("HELLO reply");
    s
}

/// Whether a raw connection past its HELLO is still served (DEVICE_COUNT is answered).
async fn still_served(s: &mut TcpStream) -> bool {
    if s.write_all(&frame(Command::DeviceCount as u8, &[]))
        .await
        .is_err()
    {
        return false;
    }
    let mut reply = [0u8; 8 + 4];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut reply)).await,
        Ok(Ok(_))
    )
}

/// A client that holds something: a buffer with a tensor whose bytes it set.
async fn loaded_client(addr: SocketAddr, seed: u64) -> (rpc_client::Client, Buf) {
    let mut c = connect(addr).await;
    let buf = alloc(&mut c, 4096).await;
    let t = buf.f32(1, &[16], 0).build();
    let data = pattern(64, seed);
    c.set_tensor(&t, 0, &data, false).await.expect("SET_TENSOR");
    assert_eq!(c.get_tensor(&t, 0, 64).await.expect("GET_TENSOR"), data);
    (c, buf)
}

/// Whether a client's buffer still holds what [`loaded_client`] set.
async fn still_loaded(c: &mut rpc_client::Client, buf: &Buf, seed: u64) -> bool {
    let t = buf.f32(1, &[16], 0).build();
    matches!(c.get_tensor(&t, 0, 64).await, Ok(d) if d == pattern(64, seed))
}

async fn evictions(s: &TestServer, n: u64) {
    let t = Instant::now();
    while s.stats.evicted.load(Relaxed) != n {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{} evictions counted, expected {n}",
            s.stats.evicted.load(Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The outside review's finding: `--max-connections` (128 by default) loopback clients that
/// each send a HELLO and nothing else used to lock every other client out until the idle
/// timeout (600 s). Now a client that comes when all slots are taken gets the slot of the
/// oldest of them, and loads.
async fn hello_only_connections_give_way(mode: Mode) {
    let max = 128;
    let s = server(mode, max);
    let mut idle = Vec::with_capacity(max);
    for _ in 0..max {
        idle.push(hello_only(s.addr).await);
    }
    let (mut c, buf) = within(
        "a client past 128 HELLO-only connections",
        loaded_client(s.addr, 1),
    )
    .await;
    let t = closed_after(&mut idle[0], Duration::from_secs(5)).await;
    assert!(
        t.is_some(),
        "{mode:?}: the oldest HELLO-only connection is still open"
    );
    evictions(&s, 1).await;
    for (i, c) in idle.iter_mut().enumerate().skip(1) {
        assert!(
            still_served(c).await,
            "{mode:?}: HELLO-only connection {i} was closed too"
        );
    }
    // The next client takes the slot of the next oldest.
    let (mut d, dbuf) = within("a second client", loaded_client(s.addr, 2)).await;
    assert!(closed_after(&mut idle[1], Duration::from_secs(5))
        .await
        .is_some());
    evictions(&s, 2).await;
    assert!(still_served(&mut idle[2]).await);
    assert!(still_loaded(&mut c, &buf, 1).await && still_loaded(&mut d, &dbuf, 2).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_only_connections_give_way_to_a_client_no_isolate() {
    hello_only_connections_give_way(Mode::InProcess).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_only_connections_give_way_to_a_client_contained() {
    hello_only_connections_give_way(Mode::Contained).await;
}

/// Only a connection that holds nothing is closed for a new client, the oldest of them: one that
/// holds a buffer never is, however old; when all hold something a new client waits for a slot.
async fn a_connection_that_holds_a_buffer_is_never_evicted(mode: Mode) {
    let s = server(mode, 4);
    let (mut a, abuf) = loaded_client(s.addr, 1).await;
    let mut b = hello_only(s.addr).await;
    let (mut c, cbuf) = loaded_client(s.addr, 3).await;
    let mut d = hello_only(s.addr).await;
    // Full: E takes the slot of B (A is older but holds a buffer), F that of D.
    let (mut e, ebuf) = within("E", loaded_client(s.addr, 5)).await;
    assert!(
        closed_after(&mut b, Duration::from_secs(5)).await.is_some(),
        "{mode:?}: B"
    );
    assert!(still_served(&mut d).await, "{mode:?}: D closed before B");
    let (mut f, fbuf) = within("F", loaded_client(s.addr, 6)).await;
    assert!(
        closed_after(&mut d, Duration::from_secs(5)).await.is_some(),
        "{mode:?}: D"
    );
    evictions(&s, 2).await;
    // All four hold a buffer: G's HELLO waits, unanswered, and nobody is closed for it.
    let mut g = raw(s.addr).await;
    assert!(
        !answers_hello(&mut g, Duration::from_millis(1500)).await,
        "{mode:?}: G was admitted while every slot held a buffer"
    );
    for (name, cl, buf, seed) in [
        ("A", &mut a, &abuf, 1),
        ("C", &mut c, &cbuf, 3),
        ("E", &mut e, &ebuf, 5),
        ("F", &mut f, &fbuf, 6),
    ] {
        assert!(
            still_loaded(cl, buf, seed).await,
            "{mode:?}: {name} lost its buffer"
        );
    }
    assert_eq!(s.stats.evicted.load(Relaxed), 2);
    // A leaves: G gets its slot (the HELLO reply arrives).
    drop(a);
    let mut size = [0u8; 8];
    within("G admitted once A left", g.read_exact(&mut size))
        .await
        .expect("HELLO reply");
    assert_eq!(s.stats.evicted.load(Relaxed), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_holds_a_buffer_is_never_evicted_no_isolate() {
    a_connection_that_holds_a_buffer_is_never_evicted(Mode::InProcess).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_holds_a_buffer_is_never_evicted_contained() {
    a_connection_that_holds_a_buffer_is_never_evicted(Mode::Contained).await;
}

/// In this process a session that freed everything holds nothing again: it may give way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_freed_its_buffer_may_give_way_no_isolate() {
    let s = server(Mode::InProcess, 2);
    let (mut a, abuf) = loaded_client(s.addr, 1).await;
    let (mut b, bbuf) = loaded_client(s.addr, 2).await;
    a.free_buffer(abuf.handle).await.expect("FREE_BUFFER");
    let (_c, _cbuf) = within("C", loaded_client(s.addr, 3)).await;
    expect_closed(&mut a, "A, which holds nothing since its FREE_BUFFER").await;
    assert!(still_loaded(&mut b, &bbuf, 2).await);
    evictions(&s, 1).await;
}

/// A client whose first stateful command races a newcomer for the one slot either keeps its
/// slot (its ALLOC_BUFFER is answered, it stays served, the newcomer waits) or is evicted before
/// the command acts (closed unanswered, the newcomer gets in): never answered and then closed.
async fn a_command_racing_an_eviction_is_served_or_never_acted_on(mode: Mode) {
    let s = server(mode, 1);
    let (mut kept, mut evicted) = (0, 0);
    for i in 0..30 {
        let mut x = connect(s.addr).await;
        let mut y = raw(s.addr).await;
        let (allocated, y_answered) = tokio::join!(x.alloc_buffer(0, 4096), async {
            answers_hello(&mut y, Duration::from_millis(500)).await
        });
        match allocated {
            Ok(Some(b)) => {
                kept += 1;
                assert!(
                    !y_answered,
                    "{mode:?} #{i}: admitted beside a client holding a buffer"
                );
                let base = x.buffer_get_base(b.handle).await;
                assert!(
                    base.is_ok(),
                    "{mode:?} #{i}: the client that won was closed"
                );
                drop(x);
                let mut size = [0u8; 8];
                within(
                    "the newcomer, once the client left",
                    y.read_exact(&mut size),
                )
                .await
                .expect("HELLO reply");
            }
            Ok(None) => panic!("{mode:?} #{i}: ALLOC_BUFFER of 4 KiB refused"),
            Err(_) => {
                evicted += 1;
                assert!(y_answered, "{mode:?} #{i}: evicted, yet the newcomer waits");
            }
        }
    }
    eprintln!(
        "{mode:?}: the racing client kept its slot {kept} times, was evicted {evicted} times"
    );
    // (A newcomer that got in is in turn evicted by the next client when the server has not yet
    // seen it leave.)
    assert!(s.stats.evicted.load(Relaxed) >= evicted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_racing_an_eviction_is_served_or_never_acted_on_no_isolate() {
    a_command_racing_an_eviction_is_served_or_never_acted_on(Mode::InProcess).await;
}

#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_racing_an_eviction_is_served_or_never_acted_on_contained() {
    a_command_racing_an_eviction_is_served_or_never_acted_on(Mode::Contained).await;
}

// ---------------------------------------------------------------------------------------------
// The per-peer share at its default, loopback included (Linux: every 127/8 address is this
// machine's, a peer of its own; macOS has only 127.0.0.1)
// ---------------------------------------------------------------------------------------------

/// The case: with `--max-connections 8` one address opened 8 connections that each hold
/// a 4 KiB buffer, and a client from another address found no slot (loopback was exempt from the
/// share by default). Now every peer gets at most its default share, half the slots, and keeps it
/// counted for each connection's whole life (handed to a session process included): from
/// 127.0.0.2 the `max / 2 + 1`th connection is closed unread, a client from 127.0.0.1 is served,
/// and once one of the held connections ends, its place comes back.
#[cfg(target_os = "linux")]
async fn one_address_gets_its_default_share_and_no_more(mode: Mode, max: usize) {
    let s = server_with(
        mode,
        ServerOptions {
            max_connections: max,
            ..TestServer::options()
        },
    );
    let share = max / 2;
    let from: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let mut held = Vec::with_capacity(share);
    for _ in 0..share {
        let mut c = connect_from(s.addr, from).await;
        let buf = alloc(&mut c, 4096).await;
        held.push((c, buf));
    }
    let mut over = tcp_from(s.addr, from, None).await.expect("connect");
    assert!(
        closed_after(&mut over, Duration::from_secs(2))
            .await
            .is_some(),
        "{mode:?}, {max} slots: connection {} from one address was kept",
        share + 1
    );
    refused(&s, Refusal::PeerShare, 1).await;
    let (mut other, obuf) = within("a client from another address", loaded_client(s.addr, 1)).await;
    assert!(still_loaded(&mut other, &obuf, 1).await);
    // Every connection at its share is still served.
    for (i, (c, buf)) in held.iter_mut().enumerate() {
        let t = buf.f32(1, &[16], 0).build();
        assert!(
            c.get_tensor(&t, 0, 64).await.is_ok(),
            "{mode:?}: connection {i} within the share"
        );
    }
    // One leaves (a contained one: once its session process ended): its place comes back.
    let open = |s: &TestServer| s.stats.active.load(Relaxed);
    let before = open(&s);
    drop(held.pop());
    let t = Instant::now();
    while open(&s) >= before {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{mode:?}: a connection that left is still open"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut again = connect_from(s.addr, from).await;
    assert_eq!(again.device_count().await.expect("DEVICE_COUNT"), 1);
    assert_eq!(s.stats.refused(Refusal::PeerShare), 1);
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_gets_its_default_share_of_8_slots_no_isolate() {
    one_address_gets_its_default_share_and_no_more(Mode::InProcess, 8).await;
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_gets_its_default_share_of_8_slots_contained() {
    one_address_gets_its_default_share_and_no_more(Mode::Contained, 8).await;
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_gets_its_default_share_of_128_slots_no_isolate() {
    one_address_gets_its_default_share_and_no_more(Mode::InProcess, 128).await;
}

/// `--peer-share-exempt` lifts the share for the blocks it names, and only for them.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exempt_address_is_not_held_to_the_share() {
    let s = TestServer::start_with_options(ServerOptions {
        max_connections: 8,
        share_exempt: vec!["127.0.0.2".parse().unwrap()],
        ..TestServer::options()
    });
    let mut held = Vec::new();
    for _ in 0..6 {
        let mut c = connect_from(s.addr, "127.0.0.2".parse().unwrap()).await;
        assert_eq!(c.device_count().await.expect("DEVICE_COUNT"), 1);
        held.push(c);
    }
    let from3: std::net::IpAddr = "127.0.0.3".parse().unwrap();
    let mut three = Vec::new();
    for _ in 0..4 {
        three.push(tcp_from(s.addr, from3, None).await.expect("connect"));
    }
    let mut over = tcp_from(s.addr, from3, None).await.expect("connect");
    assert!(closed_after(&mut over, Duration::from_secs(2))
        .await
        .is_some());
    refused(&s, Refusal::PeerShare, 1).await;
}
