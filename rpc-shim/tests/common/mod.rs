//! Shared helpers of the shim's integration tests: a shim in front of an in-process rpc-server,
//! a scenario that exercises every command, small fake workers.

#![allow(dead_code, unused_imports)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub use rpc_client::{
    ops, types, Client, ClientError, RpcTensor, TensorBuilder, TENSOR_FLAG_COMPUTE,
};
pub use rpc_proto::Major;
pub use rpc_shim::{Options, RdmaSettings, RealConnector, Running, Worker};
pub use rpc_tests::*;

/// Short timeouts so failure tests finish quickly.
pub fn test_opts() -> Options {
    Options {
        connect_timeout: Duration::from_secs(2),
        handshake_timeout: Duration::from_secs(2),
        query_timeout: Duration::from_secs(5),
        ..Options::default()
    }
}

/// A TCP-only shim on 127.0.0.1:0 in front of `worker`, speaking 7.0.0 to its clients (the
/// suite written for 7.0.0; `TestServer::addr` is a 7.0.0 worker).
pub async fn shim_tcp(worker: SocketAddr, opts: Options) -> Running<RealConnector> {
    shim_tcp_major(worker, Major::V7, opts).await
}

/// Same, speaking `major` to its clients.
pub async fn shim_tcp_major(
    worker: SocketAddr,
    major: Major,
    opts: Options,
) -> Running<RealConnector> {
    shim_tcp_addr(&worker.to_string(), major, opts).await
}

/// Same, for a worker given as a string.
pub async fn shim_tcp_addr(worker: &str, major: Major, opts: Options) -> Running<RealConnector> {
    let w = Worker::new(
        worker,
        RealConnector::new(worker, opts.clone(), RdmaSettings::tcp()),
        opts,
    );
    rpc_shim::start("127.0.0.1:0", major, w)
        .await
        .expect("bind the shim")
}

/// Polls `f` until it is true, at most `limit`.
pub async fn wait_for(what: &str, limit: Duration, f: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !f() {
        if t0.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// How many times the server handled `cmd`.
pub fn served(s: &TestServer, cmd: rpc_client::Command) -> u64 {
    s.stats
        .snapshot()
        .iter()
        .find(|x| x.0 == cmd)
        .map(|x| x.1)
        .unwrap_or(0)
}

/// Connections the server accepted so far.
pub fn server_connections(s: &TestServer) -> u64 {
    s.stats
        .connections
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// Exercises every command of protocol 7.0.0 through `addr` (the shim) and compares every
/// answer that does not depend on the connection with `reference` (the server, directly).
pub async fn exercise(addr: SocketAddr, reference: SocketAddr) {
    within("exercise every command", async {
        let mut c = connect(addr).await; // HELLO
        assert_eq!(
            c.server_version(),
            Some((7, 0, 0)),
            "HELLO answered with 7.0.0"
        );
        assert_eq!(c.server_caps(), &[0u8; 24], "HELLO answered with zero caps");
        let mut d = connect(reference).await;

        // Queries.
        assert_eq!(
            c.device_count().await.unwrap(),
            d.device_count().await.unwrap(),
            "DEVICE_COUNT"
        );
        assert_eq!(
            c.get_alignment(0).await.unwrap(),
            d.get_alignment(0).await.unwrap(),
            "GET_ALIGNMENT"
        );
        assert_eq!(
            c.get_max_size(0).await.unwrap(),
            d.get_max_size(0).await.unwrap(),
            "GET_MAX_SIZE"
        );
        let (mc, md) = (
            c.get_device_memory(0).await.unwrap(),
            d.get_device_memory(0).await.unwrap(),
        );
        assert_eq!(mc.total, md.total, "GET_DEVICE_MEMORY");
        let q = TensorBuilder::new(5, types::Q4_0)
            .ne(&[96, 3])
            .name("q")
            .build();
        let f = TensorBuilder::f32(6).ne(&[16]).build();
        let sum = TensorBuilder::f32(7)
            .ne(&[16])
            .op(ops::ADD, &[])
            .srcs(&[6, 6])
            .build();
        for (t, srcs) in [(&q, &[][..]), (&f, &[][..]), (&sum, &[f, f][..])] {
            assert_eq!(
                c.get_alloc_size(0, t, srcs).await.unwrap(),
                d.get_alloc_size(0, t, srcs).await.unwrap(),
                "GET_ALLOC_SIZE"
            );
        }
        // The same again (cache hits) must give the same answers.
        assert_eq!(
            c.get_alloc_size(0, &q, &[]).await.unwrap(),
            d.get_alloc_size(0, &q, &[]).await.unwrap()
        );

        // ALLOC_BUFFER, BUFFER_GET_BASE, BUFFER_CLEAR.
        let buf = alloc(&mut c, 8 << 20).await;
        assert!(buf.size >= 8 << 20);
        c.buffer_clear(buf.handle, 0).await.unwrap();

        // SET_TENSOR, GRAPH_COMPUTE, GET_TENSOR, GRAPH_RECOMPUTE.
        let (a, b, s) = add_graph(&buf, 16);
        let av: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let bv: Vec<f32> = (0..16).map(|i| 1000.0 * i as f32).collect();
        c.set_tensor(&a, 0, &f32_bytes(&av), false).await.unwrap();
        c.set_tensor(&b, 0, &f32_bytes(&bv), false).await.unwrap();
        c.graph_compute(0, &[3], &[a, b, s]).await.unwrap();
        let got = bytes_f32(&c.get_tensor(&s, 0, 64).await.unwrap());
        assert_eq!(
            got,
            (0..16).map(|i| 1001.0 * i as f32).collect::<Vec<_>>(),
            "a + b"
        );
        c.set_tensor(&b, 0, &f32_bytes(&av), false).await.unwrap();
        c.graph_recompute(0).await.unwrap();
        let got = bytes_f32(&c.get_tensor(&s, 0, 64).await.unwrap());
        assert_eq!(
            got,
            (0..16).map(|i| 2.0 * i as f32).collect::<Vec<_>>(),
            "recompute"
        );

        // GET_ALLOC_SIZE of a tensor in a buffer of this connection (not cacheable: forwarded).
        assert_eq!(c.get_alloc_size(0, &a, &[]).await.unwrap(), 64);

        // MEMSET_TENSOR, INIT_TENSOR (no responses: the next reply must be GET_TENSOR's).
        c.memset_tensor(&a, 8, 16, 0x5A).await.unwrap();
        c.init_tensor(&a).await.unwrap();
        let got = c.get_tensor(&a, 0, 64).await.unwrap();
        assert!(
            got[8..24].iter().all(|&x| x == 0x5A) && got[..8] == f32_bytes(&av)[..8],
            "memset"
        );

        // COPY_TENSOR.
        let dst = buf.f32(8, &[16], 4096).build();
        assert!(c.copy_tensor(&a, &dst).await.unwrap(), "COPY_TENSOR");
        assert_eq!(c.get_tensor(&dst, 0, 64).await.unwrap(), got);

        // SET_TENSOR_HASH without a server cache answers 0.
        assert!(!c
            .set_tensor_hash(&a, 0, rpc_client::fnv1a64(&got))
            .await
            .unwrap());

        // Large SET_TENSOR (streamed) and GET_TENSOR (relayed in chunks), 3 MiB + 12 bytes.
        let n = (3 << 20) / 4 + 3;
        let big = buf.f32(9, &[n], 1 << 20).build();
        let data = pattern(n as usize * 4, 42);
        c.set_tensor(&big, 0, &data, false).await.unwrap();
        assert_eq!(
            c.get_tensor(&big, 0, data.len() as u64).await.unwrap(),
            data,
            "3 MiB round trip"
        );
        assert_eq!(
            c.get_tensor(&big, 4096, 100).await.unwrap(),
            data[4096..4196],
            "partial read"
        );

        // FREE_BUFFER; the freed handle is then refused: the connection is closed.
        c.free_buffer(buf.handle).await.unwrap();
        assert_closed(
            c.buffer_get_base(buf.handle).await,
            "BUFFER_GET_BASE after FREE_BUFFER",
        );
    })
    .await;
}

/// Frames for raw tests.
pub fn hello_frame() -> Vec<u8> {
    frame(14, &[0u8; 24])
}

/// A TCP relay in front of `target` that serves **one connection at a time**, like the stock
/// `ggml-rpc-server` (the next connection waits in the accept backlog until the current one
/// closes). Returns its address; it lives as long as the runtime.
pub async fn serial_front(
    target: SocketAddr,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let n = served.clone();
    tokio::spawn(async move {
        loop {
            let Ok((mut c, _)) = l.accept().await else {
                return;
            };
            let Ok(mut s) = tokio::net::TcpStream::connect(target).await else {
                return;
            };
            n.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let _ = tokio::io::copy_bidirectional(&mut c, &mut s).await;
        }
    });
    (addr, served)
}

/// The stock client's model-load burst (spec §15.4): 13 short connections, each HELLO and one
/// or two queries, then closed: DEVICE_COUNT, 5 × GET_DEVICE_MEMORY, GET_ALIGNMENT +
/// GET_MAX_SIZE, 5 × GET_ALLOC_SIZE, plus a last DEVICE_COUNT.
pub async fn short_connection_burst(addr: SocketAddr) {
    within("short connections", async {
        let mut c = connect(addr).await;
        assert_eq!(c.device_count().await.unwrap(), 1);
        drop(c);
        for _ in 0..5 {
            let mut c = connect(addr).await;
            assert!(c.get_device_memory(0).await.unwrap().total > 0);
        }
        let mut c = connect(addr).await;
        assert!(c.get_alignment(0).await.unwrap() > 0);
        assert!(c.get_max_size(0).await.unwrap() > 0);
        drop(c);
        for i in 0..5u32 {
            let mut c = connect(addr).await;
            let q = TensorBuilder::new(100 + u64::from(i), types::Q4_0)
                .ne(&[96, 1 + i % 2])
                .build();
            assert_eq!(
                c.get_alloc_size(0, &q, &[]).await.unwrap(),
                u64::from(1 + i % 2) * 3 * 18
            );
        }
        let mut c = connect(addr).await;
        assert_eq!(c.device_count().await.unwrap(), 1);
    })
    .await;
}
