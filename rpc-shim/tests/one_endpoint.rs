//! `--one-endpoint` against in-process rpc-servers: the endpoint's devices are the workers',
//! data written on one device is read back from it, COPY_TENSOR between workers lands (and
//! within one worker too), graphs run on their device's worker, and the hostile cases are refused
//! or fail cleanly: another client's handle, a copy larger than its destination, a worker that
//! dies mid-copy (the client connection closes promptly, never hangs).

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rpc_shim::RunningEndpoint;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A TCP-only one endpoint over `workers`, speaking `major` to its clients.
async fn endpoint(workers: &[SocketAddr], major: Major) -> RunningEndpoint<RealConnector> {
    let opts = test_opts();
    let ws: Arc<[_]> = workers
        .iter()
        .map(|a| {
            let a = a.to_string();
            Worker::new(
                a.clone(),
                RealConnector::new(a, opts.clone(), RdmaSettings::tcp()),
                opts.clone(),
            )
        })
        .collect();
    rpc_shim::start_endpoint("127.0.0.1:0", major, ws)
        .await
        .expect("bind the endpoint")
}

/// ALLOC_BUFFER on `device` + BUFFER_GET_BASE.
async fn alloc_on(c: &mut Client, device: u32, size: u64) -> Buf {
    let b = c
        .alloc_buffer(device, size)
        .await
        .expect("ALLOC_BUFFER")
        .expect("a handle");
    let base = c.buffer_get_base(b.handle).await.expect("BUFFER_GET_BASE");
    Buf {
        handle: b.handle,
        base,
        size: b.size,
    }
}

async fn set(c: &mut Client, t: &RpcTensor, data: &[u8]) {
    c.set_tensor(t, 0, data, false).await.expect("SET_TENSOR");
}

async fn get(c: &mut Client, t: &RpcTensor, n: u64) -> Vec<u8> {
    c.get_tensor(t, 0, n).await.expect("GET_TENSOR")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn devices_buffers_copies_and_graphs_across_three_workers() {
    let servers = [
        TestServer::start(),
        TestServer::start(),
        TestServer::start(),
    ];
    for major in Major::ALL {
        let addrs: Vec<SocketAddr> = servers
            .iter()
            .map(|s| if major == Major::V8 { s.addr8 } else { s.addr })
            .collect();
        let ep = endpoint(&addrs, major).await;
        let mut c = connect(ep.local).await;
        assert_eq!(c.device_count().await.unwrap(), 3, "{major}");
        let n = 1000u32;
        let bytes = u64::from(n) * 4;
        let bufs = [
            alloc_on(&mut c, 0, 4 * bytes).await,
            alloc_on(&mut c, 1, 4 * bytes).await,
            alloc_on(&mut c, 2, 4 * bytes).await,
        ];
        // Each worker's first buffer may well have the same handle: the client's differ.
        assert!(bufs[0].handle != bufs[1].handle && bufs[1].handle != bufs[2].handle);
        let data = pattern(bytes as usize, 7);
        let t = |b: usize, id: u64, off: u64| bufs[b].f32(id, &[n], off).build();
        set(&mut c, &t(0, 1, 0), &data).await;
        // Worker 0 → worker 1 → worker 2, then within worker 2.
        assert!(c.copy_tensor(&t(0, 1, 0), &t(1, 2, bytes)).await.unwrap());
        assert!(c.copy_tensor(&t(1, 2, bytes), &t(2, 3, 0)).await.unwrap());
        assert!(c.copy_tensor(&t(2, 3, 0), &t(2, 4, bytes)).await.unwrap());
        assert_eq!(get(&mut c, &t(1, 2, bytes), bytes).await, data, "{major}");
        assert_eq!(get(&mut c, &t(2, 4, bytes), bytes).await, data, "{major}");
        // A graph on device 2 (worker 2): c = a + b over the copied data.
        let (a, b, sum) = add_graph(&bufs[2], n);
        set(&mut c, &a, &data).await;
        set(&mut c, &b, &data).await;
        c.graph_compute(2, &[3], &[a, b, sum]).await.unwrap();
        let want: Vec<f32> = bytes_f32(&data).iter().map(|x| x + x).collect();
        let got = bytes_f32(&get(&mut c, &sum, bytes).await);
        assert!(
            got.iter()
                .zip(&want)
                .all(|(g, w)| g == w || (g.is_nan() && w.is_nan())),
            "{major}: the sum"
        );
        // A source larger than its destination: answered 0, the destination untouched.
        let big = bufs[0].f32(5, &[n + 1], 0).build();
        assert!(!c.copy_tensor(&big, &t(1, 6, 2 * bytes)).await.unwrap());
        assert_eq!(
            get(&mut c, &t(1, 6, 2 * bytes), 16).await,
            vec![0u8; 16],
            "{major}: nothing was copied"
        );
        // Freed: gone; the other buffers still work.
        c.free_buffer(bufs[0].handle).await.unwrap();
        assert_eq!(get(&mut c, &t(1, 2, bytes), 16).await, data[..16]);
        assert_closed(
            within("GET_TENSOR", c.get_tensor(&t(0, 1, 0), 0, 16)).await,
            "a freed buffer",
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn another_clients_buffer_is_out_of_reach() {
    let servers = [TestServer::start(), TestServer::start()];
    let ep = endpoint(&[servers[0].addr8, servers[1].addr8], Major::V8).await;
    let mut a = connect(ep.local).await;
    let mut b = connect(ep.local).await;
    let ba = alloc_on(&mut a, 1, 4096).await;
    let bb = alloc_on(&mut b, 1, 4096).await;
    let secret = pattern(64, 1);
    set(&mut a, &ba.f32(1, &[16], 0).build(), &secret).await;
    // b names a's handle: refused (closed), and a's data is untouched.
    let stolen = ba.f32(1, &[16], 0).build();
    assert_closed(
        within("GET_TENSOR", b.get_tensor(&stolen, 0, 64)).await,
        "another client's handle",
    );
    // And a copy from a's buffer into one of the attacker's own, on a fresh connection.
    let mut b = connect(ep.local).await;
    let mine = alloc_on(&mut b, 0, 4096).await;
    assert_closed(
        within(
            "COPY_TENSOR",
            b.copy_tensor(&stolen, &mine.f32(2, &[16], 0).build()),
        )
        .await,
        "a copy out of another client's buffer",
    );
    assert_eq!(get(&mut a, &ba.f32(1, &[16], 0).build(), 64).await, secret);
    let _ = bb;
}

/// A worker that answers HELLO (8.0.0), DEVICE_COUNT (1), ALLOC_BUFFER and BUFFER_GET_BASE, takes
/// SET_TENSOR, and dies on GET_TENSOR (a copy's read of its tensor).
async fn dies_on_get_tensor() -> SocketAddr {
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
                let mut rsp = 28u64.to_le_bytes().to_vec();
                rsp.extend_from_slice(&[8, 0, 0, 0]);
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
                    let mut p = vec![0u8; n.min(1 << 20)];
                    if s.read_exact(&mut p).await.is_err() {
                        return;
                    }
                    let answer: Option<Vec<u8>> = match h[0] {
                        15 => Some(1u32.to_le_bytes().to_vec()),
                        1 => Some(32u64.to_le_bytes().to_vec()),
                        2 => Some(u64::MAX.to_le_bytes().to_vec()),
                        0 => Some([0x10u64.to_le_bytes(), 65536u64.to_le_bytes()].concat()),
                        3 => Some(0x1000u64.to_le_bytes().to_vec()),
                        6 => None,
                        _ => return, // GET_TENSOR and anything else: it dies
                    };
                    if let Some(a) = answer {
                        let mut r = (a.len() as u64).to_le_bytes().to_vec();
                        r.extend_from_slice(&a);
                        if s.write_all(&r).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_dying_mid_copy_closes_the_client_promptly() {
    let healthy = TestServer::start();
    let dying = dies_on_get_tensor().await;
    let ep = endpoint(&[dying, healthy.addr8], Major::V8).await;
    let mut c = connect(ep.local).await;
    assert_eq!(c.device_count().await.unwrap(), 2);
    let src = alloc_on(&mut c, 0, 65536).await;
    let dst = alloc_on(&mut c, 1, 65536).await;
    let t0 = Instant::now();
    // Answered at once (the copy is carried after the answer) ...
    let answered = within(
        "COPY_TENSOR",
        c.copy_tensor(
            &src.f32(1, &[256], 0).build(),
            &dst.f32(2, &[256], 0).build(),
        ),
    )
    .await;
    // ... and then the connection closes: the next command fails, promptly.
    let next = within(
        "GET_TENSOR",
        c.get_tensor(&dst.f32(2, &[256], 0).build(), 0, 16),
    )
    .await;
    assert!(
        answered.is_err() || next.is_err(),
        "a copy whose source worker died must not look done: {answered:?} then {next:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // The healthy worker lives on.
    assert_healthy(healthy.addr8).await;
}
