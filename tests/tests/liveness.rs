//! Liveness rules of a connection (`connection.rs`): the idle timeout ends only a connection that
//! holds nothing; one that holds a buffer or a stored graph stays open however long it is silent
//! (a long-running `llama-server` keeps its model on the worker between requests); a request
//! whose header arrived must keep arriving.

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
