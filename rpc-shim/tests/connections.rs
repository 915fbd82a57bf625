//! Upstream connection economy: the stock client's short connections are answered from the
//! cache and the control connection; per-client upstream connections open only when needed; a
//! serial (stock-like) worker does not deadlock.

mod common;

use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use common::*;
use rpc_client::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_connections_open_no_upstream_connection() {
    let server = TestServer::start();
    let shim = shim_tcp(server.addr, test_opts()).await;
    let st = shim.worker.stats().clone();
    // Start-up: the control connection opens and fills the cache.
    wait_for("control connection up", Duration::from_secs(5), || {
        st.snapshot().control_connections == 1
    })
    .await;
    wait_for("cache prefetched", Duration::from_secs(5), || {
        shim.worker.cache().len() >= 3
    })
    .await;
    assert_eq!(server_connections(&server), 1);

    short_connection_burst(shim.local).await;
    short_connection_burst(shim.local).await; // a second model load by another process
    let s = st.snapshot();
    assert_eq!(
        server_connections(&server),
        1,
        "26 short client connections, no new upstream connection: {s:?}"
    );
    assert_eq!(s.client_connections, 26);
    assert_eq!(s.session_connections, 0, "{s:?}");
    assert_eq!(s.control_connections, 1, "{s:?}");
    // Immutable queries reached the server once each (prefetch, or first GET_ALLOC_SIZE of a
    // shape); GET_DEVICE_MEMORY every time (it changes).
    assert_eq!(served(&server, Command::DeviceCount), 1);
    assert_eq!(served(&server, Command::GetAlignment), 1);
    assert_eq!(served(&server, Command::GetMaxSize), 1);
    assert_eq!(
        served(&server, Command::GetAllocSize),
        5,
        "5 distinct GET_ALLOC_SIZE requests, each asked twice"
    );
    assert_eq!(served(&server, Command::GetDeviceMemory), 10);
    assert_eq!(s.cache_hits, 2 * 4 + 5, "{s:?}");

    // The long-lived connection: one upstream connection, opened by its first ALLOC_BUFFER.
    let mut c = connect(shim.local).await;
    assert_eq!(c.get_alignment(0).await.unwrap(), 32);
    assert_eq!(
        server_connections(&server),
        1,
        "cached queries on the long connection cost nothing"
    );
    let buf = alloc(&mut c, 4096).await;
    assert_eq!(server_connections(&server), 2);
    // Queries on a connection with its own upstream go over it, in order.
    assert!(c.get_device_memory(0).await.unwrap().total > 0);
    let t = buf.f32(1, &[4], 0).build();
    c.set_tensor(&t, 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0]), false)
        .await
        .unwrap();
    assert_eq!(
        bytes_f32(&c.get_tensor(&t, 0, 16).await.unwrap()),
        [1.0, 2.0, 3.0, 4.0]
    );
    assert_eq!(server_connections(&server), 2);
    assert_eq!(st.snapshot().session_connections, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_prefetch_the_first_query_opens_the_control_connection() {
    let server = TestServer::start();
    let shim = shim_tcp(
        server.addr,
        Options {
            prefetch: false,
            ..test_opts()
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        server_connections(&server),
        0,
        "no connection before a client needs one"
    );
    short_connection_burst(shim.local).await;
    assert_eq!(server_connections(&server), 1);
    assert_eq!(
        served(&server, Command::DeviceCount),
        1,
        "the second DEVICE_COUNT came from the cache"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serial_worker_does_not_deadlock() {
    // A stock ggml-rpc-server serves one connection at a time: the shim must release its control
    // connection before a client's own upstream connection can be served.
    let server = TestServer::start();
    let (front, accepted) = serial_front(server.addr).await;
    let shim = shim_tcp(front, test_opts()).await;
    for round in 0..3 {
        short_connection_burst(shim.local).await;
        let mut c = connect(shim.local).await;
        let buf = within("ALLOC_BUFFER on a serial worker", alloc(&mut c, 3 * 64)).await;
        let (a, b, s) = add_graph(&buf, 16);
        c.set_tensor(&a, 0, &f32_bytes(&[1.0; 16]), false)
            .await
            .unwrap();
        c.set_tensor(&b, 0, &f32_bytes(&[2.0; 16]), false)
            .await
            .unwrap();
        c.graph_compute(0, &[3], &[a, b, s]).await.unwrap();
        assert_eq!(
            bytes_f32(&c.get_tensor(&s, 0, 64).await.unwrap()),
            [3.0; 16],
            "round {round}"
        );
        // GET_DEVICE_MEMORY during the session goes over the session's connection.
        assert!(c.get_device_memory(0).await.unwrap().total > 0);
        drop(c);
    }
    // Per round: the control connection (reopened after each session) and one session.
    let n = accepted.load(SeqCst);
    // The first control connection, then per model load the session and the control connection
    // reopened after it.
    assert!(n <= 7, "{n} upstream connections for 3 model loads");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_connection_closes_with_its_client() {
    let server = TestServer::start();
    let shim = shim_tcp(server.addr, test_opts()).await;
    wait_for("control connection up", Duration::from_secs(5), || {
        server.stats.active.load(SeqCst) == 1
    })
    .await;
    let mut c = connect(shim.local).await;
    alloc(&mut c, 64).await;
    // The session's own connection is open and the control connection was released.
    wait_for(
        "control released, session open",
        Duration::from_secs(5),
        || server_connections(&server) == 2 && server.stats.active.load(SeqCst) == 1,
    )
    .await;
    c.shutdown().await.unwrap();
    // The session's connection closes with its client, and the control connection is reopened
    // for the next client.
    wait_for(
        "session closed, control reopened",
        Duration::from_secs(5),
        || server_connections(&server) == 3 && server.stats.active.load(SeqCst) == 1,
    )
    .await;
    assert_eq!(shim.worker.stats().snapshot().control_connections, 2);
}
