//! Relay correctness through the shim over TCP, against an in-process rpc-server.

mod common;

use std::time::Duration;

use common::*;
use rpc_client::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_relays_like_direct() {
    let server = TestServer::start();
    let shim = shim_tcp(server.addr, test_opts()).await;
    exercise(shim.local, server.addr).await;
    // Once more on a fresh client connection, with a warm cache.
    exercise(shim.local, server.addr).await;
    assert_healthy(shim.local).await;
    let st = shim.worker.stats().snapshot();
    assert!(st.cache_hits >= 8, "{st:?}");
    assert_eq!(
        st.session_connections, 3,
        "one upstream connection per client connection that needed one: {st:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_is_answered_locally_even_without_a_worker() {
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap();
    drop(dead); // nothing listens there now
    let shim = shim_tcp(addr, test_opts()).await;
    let mut c = connect(shim.local).await;
    assert_eq!(c.server_version(), Some((7, 0, 0)));
    // The first command that needs the worker closes the connection, promptly.
    let t0 = std::time::Instant::now();
    assert_closed(
        within("DEVICE_COUNT", c.device_count()).await,
        "DEVICE_COUNT without a worker",
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let mut c = connect(shim.local).await;
    assert_closed(
        within("ALLOC_BUFFER", c.alloc_buffer(0, 64)).await,
        "ALLOC_BUFFER without a worker",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_tensor_hash_hits_the_server_cache_through_the_shim() {
    let dir = TempDir::new("shim-hash");
    let server = TestServer::start_with_cache(dir.path());
    let shim = shim_tcp(server.addr, test_opts()).await;
    let mut c = connect(shim.local).await;
    let buf = alloc(&mut c, 1 << 20).await;
    let t = buf.f32(1, &[65536], 0).build();
    let data = pattern(1 << 18, 9);
    let h = rpc_client::fnv1a64(&data);
    assert!(!c.set_tensor_hash(&t, 0, h).await.unwrap(), "cold cache");
    c.set_tensor(&t, 0, &data, true).await.unwrap(); // 256 KiB: streamed, stored in the cache
    c.buffer_clear(buf.handle, 0).await.unwrap();
    assert!(c.set_tensor_hash(&t, 0, h).await.unwrap(), "warm cache");
    assert_eq!(c.get_tensor(&t, 0, data.len() as u64).await.unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_close_only_that_client() {
    let server = TestServer::start();
    let shim = shim_tcp(server.addr, test_opts()).await;

    // A buffer handle the server does not know.
    let mut c = connect(shim.local).await;
    assert_closed(c.buffer_get_base(0x1234_5678).await, "unknown buffer");

    // First command not HELLO.
    let mut c = Client::connect_raw(shim.local).await.unwrap();
    c.send_bytes(&frame(15, &[])).await.unwrap();
    expect_closed(&mut c, "DEVICE_COUNT before HELLO").await;

    // HELLO of the wrong size (an old client).
    let mut c = Client::connect_raw(shim.local).await.unwrap();
    c.send_bytes(&frame(14, &[])).await.unwrap();
    expect_closed(&mut c, "0-byte HELLO").await;

    // A second HELLO.
    let mut c = connect(shim.local).await;
    c.send_bytes(&hello_frame()).await.unwrap();
    expect_closed(&mut c, "second HELLO").await;

    // RPC_CMD_NONE and unknown commands.
    for cmd in [18u8, 19, 200] {
        let mut c = connect(shim.local).await;
        c.send_raw(cmd, &[]).await.unwrap();
        expect_closed(&mut c, "unknown command").await;
    }

    // A fixed-size command with the wrong size.
    let mut c = connect(shim.local).await;
    c.send_raw(Command::GetAlignment as u8, &[0; 5])
        .await
        .unwrap();
    expect_closed(&mut c, "GET_ALIGNMENT of 5 bytes").await;

    // A device the worker does not have, without and with an upstream connection.
    let mut c = connect(shim.local).await;
    assert_closed(c.get_alignment(7).await, "GET_ALIGNMENT device 7");
    let mut c = connect(shim.local).await;
    assert_closed(c.get_device_memory(7).await, "GET_DEVICE_MEMORY device 7");
    let mut c = connect(shim.local).await;
    alloc(&mut c, 64).await;
    assert_closed(
        c.get_device_memory(7).await,
        "GET_DEVICE_MEMORY device 7 on a session",
    );

    // A hostile SET_TENSOR size is refused before anything is read or allocated.
    let mut c = connect(shim.local).await;
    let mut f = vec![Command::SetTensor as u8];
    f.extend_from_slice(&(1u64 << 62).to_le_bytes());
    c.send_bytes(&f).await.unwrap();
    expect_closed(&mut c, "SET_TENSOR of 2^62 bytes").await;

    // The shim (and its cache and control connection) still serve everyone else.
    assert_healthy(shim.local).await;
    exercise(shim.local, server.addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_response_commands_are_never_held_back() {
    let server = TestServer::start();
    let shim = shim_tcp(server.addr, test_opts()).await;
    let mut c = connect(shim.local).await;
    let buf = alloc(&mut c, 4096).await;
    let t = buf.f32(1, &[16], 0).build();

    // One SET_TENSOR, then silence: it must reach the server without any further client frame.
    let before = served(&server, Command::SetTensor);
    c.set_tensor(&t, 0, &pattern(64, 1), false).await.unwrap();
    wait_for(
        "SET_TENSOR forwarded while the client is silent",
        Duration::from_secs(5),
        || served(&server, Command::SetTensor) == before + 1,
    )
    .await;

    // A complete frame followed by half of the next one: the complete one must not wait for the
    // rest of the incomplete one.
    let mut f1 = Vec::new();
    rpc_proto::SetTensorHeader {
        tensor: t,
        cache_flag: 0,
        offset: 0,
    }
    .encode_frame_head(64, &mut f1);
    f1.extend_from_slice(&pattern(64, 2));
    let mut f2 = Vec::new();
    rpc_proto::SetTensorHeader {
        tensor: t,
        cache_flag: 0,
        offset: 0,
    }
    .encode_frame_head(64, &mut f2);
    f2.extend_from_slice(&pattern(64, 3));
    let mut burst = f1.clone();
    burst.extend_from_slice(&f2[..100]);
    c.send_bytes(&burst).await.unwrap();
    wait_for(
        "the complete frame forwarded before the incomplete one",
        Duration::from_secs(5),
        || served(&server, Command::SetTensor) == before + 2,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        served(&server, Command::SetTensor),
        before + 2,
        "half a frame must not be forwarded"
    );
    c.send_bytes(&f2[100..]).await.unwrap();
    assert_eq!(c.get_tensor(&t, 0, 64).await.unwrap(), pattern(64, 3));

    // GRAPH_COMPUTE and GRAPH_RECOMPUTE (async in the stock client) are not held back either.
    let buf = alloc(&mut c, 3 * 64).await;
    let (a, b, s) = add_graph(&buf, 16);
    let gc = served(&server, Command::GraphCompute);
    c.graph_compute(0, &[3], &[a, b, s]).await.unwrap();
    wait_for("GRAPH_COMPUTE forwarded", Duration::from_secs(5), || {
        served(&server, Command::GraphCompute) == gc + 1
    })
    .await;
    let gr = served(&server, Command::GraphRecompute);
    c.graph_recompute(0).await.unwrap();
    wait_for("GRAPH_RECOMPUTE forwarded", Duration::from_secs(5), || {
        served(&server, Command::GraphRecompute) == gr + 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_burst_keeps_order_and_needs_one_round_trip() {
    let server = TestServer::start();
    let shim = shim_tcp(server.addr, test_opts()).await;
    let mut c = connect(shim.local).await;
    let buf = alloc(&mut c, 1 << 20).await;
    let t = buf.f32(1, &[256], 0).build();
    // 500 SET_TENSORs to the same tensor, a GRAPH-free GET_TENSOR at the end, in one write: the
    // server must see them in order (the last value wins) and the client gets exactly one reply.
    let mut burst = Vec::new();
    for i in 0..500u64 {
        rpc_proto::SetTensorHeader {
            tensor: t,
            cache_flag: 0,
            offset: 0,
        }
        .encode_frame_head(1024, &mut burst);
        burst.extend_from_slice(&pattern(1024, i));
    }
    // Plus a few large ones (streamed) in the middle of small ones.
    let big = buf.f32(2, &[65536], 4096).build();
    rpc_proto::SetTensorHeader {
        tensor: big,
        cache_flag: 0,
        offset: 0,
    }
    .encode_frame_head(1 << 18, &mut burst);
    burst.extend_from_slice(&pattern(1 << 18, 777));
    rpc_proto::SetTensorHeader {
        tensor: t,
        cache_flag: 0,
        offset: 0,
    }
    .encode_frame_head(1024, &mut burst);
    burst.extend_from_slice(&pattern(1024, 999));
    let mut get = Vec::new();
    rpc_proto::Request::GetTensor {
        tensor: t,
        offset: 0,
        size: 1024,
    }
    .encode(&mut get);
    burst.extend_from_slice(&get);
    let before = served(&server, Command::SetTensor);
    c.send_bytes(&burst).await.unwrap();
    assert_eq!(
        within("reply", c.recv_response(1024)).await.unwrap(),
        pattern(1024, 999)
    );
    assert_eq!(served(&server, Command::SetTensor), before + 502);
    assert_eq!(
        c.get_tensor(&big, 0, 1 << 18).await.unwrap(),
        pattern(1 << 18, 777)
    );
    // Nothing else came back.
    assert_eq!(c.device_count().await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_clients_are_isolated() {
    let server = TestServer::start();
    let shim = shim_tcp(server.addr, test_opts()).await;
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let addr = shim.local;
        tasks.push(tokio::spawn(async move { assert_healthy(addr).await }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // A buffer of one client is unknown on another client's upstream connection.
    let mut a = connect(shim.local).await;
    let buf = alloc(&mut a, 64).await;
    let mut b = connect(shim.local).await;
    alloc(&mut b, 64).await;
    assert_closed(
        b.buffer_get_base(buf.handle).await,
        "another client's buffer",
    );
    assert_eq!(a.buffer_get_base(buf.handle).await.unwrap(), buf.base);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_local_port_reaches_its_worker() {
    let (s1, s2) = (TestServer::start(), TestServer::start());
    let (m1, m2) = (
        shim_tcp(s1.addr, test_opts()).await,
        shim_tcp(s2.addr, test_opts()).await,
    );
    let mut c1 = connect(m1.local).await;
    let mut c2 = connect(m2.local).await;
    alloc(&mut c1, 64).await;
    alloc(&mut c1, 64).await;
    alloc(&mut c2, 64).await;
    assert_eq!(served(&s1, Command::AllocBuffer), 2);
    assert_eq!(served(&s2, Command::AllocBuffer), 1);
    exercise(m2.local, s2.addr).await;
    exercise(m1.local, s1.addr).await;
}
