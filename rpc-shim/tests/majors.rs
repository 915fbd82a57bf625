//! Both protocol majors through the shim: an 8.0.0 client on an 8.0.0 listener (graph uids,
//! strided copies, COMM_* relayed), a 7.0.0 client on the `--proto7-port` listener of the same
//! worker (its graphs translated to 8.0's with a fixed uid), the exact bytes the worker gets, and
//! an 8.0.0 client refused in front of a 7.0.0 worker.

mod common;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use rpc_client::LAST_GRAPH_UID;
use rpc_proto::{
    encode_graph, graph_payload_size, CommInit, Command, FrameHeader, Region2d, Request, Response,
    RpcTensor,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Protocol 8.0.0's own features through `addr` (a shim in front of an 8.0.0 worker); answers
/// that do not depend on the connection are compared with `reference` (the worker directly).
/// `fatal_tail`: end with a GRAPH_RECOMPUTE of an unknown uid, which the worker answers by
/// closing. A close with nothing pending marks the worker down in the shim, which closes every
/// client connection still without an upstream of its own: not while another client runs.
async fn exercise8(addr: SocketAddr, reference: SocketAddr, fatal_tail: bool) {
    within("exercise protocol 8.0.0", async {
        let mut c = connect(addr).await;
        assert_eq!(
            c.server_version(),
            Some((8, 0, 0)),
            "HELLO answered with 8.0.0"
        );
        assert_eq!(c.major(), Major::V8);
        let mut d = connect(reference).await;
        assert_eq!(d.major(), Major::V8, "the reference speaks 8.0.0");
        assert_eq!(
            c.device_count().await.unwrap(),
            d.device_count().await.unwrap()
        );

        // Two graphs under two uids: s = a + b (uid 100), t = a + s (uid 200).
        let buf = alloc(&mut c, 1 << 20).await;
        let (a, b, s) = add_graph(&buf, 16);
        let t = buf
            .f32(4, &[16], 3 * 64)
            .op(ops::ADD, &[])
            .srcs(&[1, 3])
            .flags(TENSOR_FLAG_COMPUTE)
            .build();
        let av: Vec<f32> = (0..16).map(|i| i as f32).collect();
        let times = |k: f32| (0..16).map(|i| k * i as f32).collect::<Vec<_>>();
        c.set_tensor(&a, 0, &f32_bytes(&av), false).await.unwrap();
        c.set_tensor(&b, 0, &f32_bytes(&times(1000.0)), false)
            .await
            .unwrap();
        c.graph_compute_uid(0, 100, &[3], &[a, b, s]).await.unwrap();
        c.graph_compute_uid(0, 200, &[4], &[a, b, s, t])
            .await
            .unwrap();
        assert_eq!(
            bytes_f32(&c.get_tensor(&t, 0, 64).await.unwrap()),
            times(1002.0)
        );
        // New b; recompute both by uid, then the first again after the second.
        c.set_tensor(&b, 0, &f32_bytes(&av), false).await.unwrap();
        c.graph_recompute_uid(0, 100).await.unwrap();
        c.graph_recompute_uid(0, 200).await.unwrap();
        assert_eq!(
            bytes_f32(&c.get_tensor(&s, 0, 64).await.unwrap()),
            times(2.0)
        );
        assert_eq!(
            bytes_f32(&c.get_tensor(&t, 0, 64).await.unwrap()),
            times(3.0)
        );
        c.set_tensor(&b, 0, &f32_bytes(&[0.0; 16]), false)
            .await
            .unwrap();
        c.graph_recompute_uid(0, 100).await.unwrap();
        assert_eq!(
            bytes_f32(&c.get_tensor(&s, 0, 64).await.unwrap()),
            av,
            "uid 100 is still stored after uid 200 was"
        );

        // SET_TENSOR_2D / GET_TENSOR_2D (the delta's probe: 8-byte chunks 16 bytes apart).
        let x = buf.f32(5, &[8], 4096).build();
        c.memset_tensor(&x, 0, 32, 0).await.unwrap();
        let chunks: Vec<u8> = (1..=8).chain(11..=18).collect();
        let region = |offset, size, n_copies, stride| Region2d {
            offset,
            size,
            n_copies,
            stride,
        };
        c.set_tensor_2d(&x, region(0, 8, 2, 16), &chunks)
            .await
            .unwrap();
        let mut want = vec![0u8; 32];
        want[..8].copy_from_slice(&chunks[..8]);
        want[16..24].copy_from_slice(&chunks[8..]);
        assert_eq!(
            c.get_tensor(&x, 0, 32).await.unwrap(),
            want,
            "SET_TENSOR_2D"
        );
        assert_eq!(
            c.get_tensor_2d(&x, region(4, 4, 2, 16)).await.unwrap(),
            [5, 6, 7, 8, 15, 16, 17, 18],
            "GET_TENSOR_2D"
        );
        // A large GET_TENSOR_2D reply (128 KiB: relayed in pieces) of every other KiB.
        let y = buf.f32(6, &[64 * 1024], 1 << 18).build();
        let data = pattern(256 * 1024, 7);
        c.set_tensor(&y, 0, &data, false).await.unwrap();
        let got = c
            .get_tensor_2d(&y, region(512, 1024, 128, 2048))
            .await
            .unwrap();
        let want: Vec<u8> = (0..128)
            .flat_map(|i| data[512 + i * 2048..512 + i * 2048 + 1024].iter().copied())
            .collect();
        assert_eq!(got, want, "128 KiB GET_TENSOR_2D");

        // COMM_INIT (world 3: refused by any 8.0 server, stock or ours) answers as directly;
        // COMM_FREE has no reply and keeps the connection.
        let init = CommInit {
            device: 0,
            rank: 1,
            world: 3,
            port: 52111,
            host: CommInit::host_field("127.0.0.1").unwrap(),
        };
        let direct = d.comm_init(init).await.unwrap();
        assert_eq!(c.comm_init(init).await.unwrap(), direct, "COMM_INIT");
        assert!(!direct);
        c.comm_free(0).await.unwrap();
        assert!(c.get_alignment(0).await.unwrap() > 0);

        if fatal_tail {
            // A uid never stored: the worker closes, and so does the shim.
            c.graph_recompute_uid(0, 999).await.unwrap();
            expect_closed(&mut c, "GRAPH_RECOMPUTE of an unknown uid").await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn v8_client_through_the_shim() {
    let server = TestServer::start();
    let shim = shim_tcp_major(server.addr8, Major::V8, test_opts()).await;
    exercise8(shim.local, server.addr8, true).await;
    // Frames of 7.0 only are refused on an 8.0 listener: RPC_CMD_NONE of 8.0 (23) closes.
    let mut c = connect(shim.local).await;
    c.send_bytes(&frame(23, &[])).await.unwrap();
    expect_closed(&mut c, "command 23 on an 8.0.0 connection").await;
    assert_eq!(shim.worker.major(), Some(Major::V8));
}

/// One worker behind both listeners: a 7.0.0 client (translated) and an 8.0.0 client, one after
/// the other and at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn v7_client_on_the_proto7_port_of_an_8_worker() {
    let server = TestServer::start();
    let opts = test_opts();
    let addr = server.addr8.to_string();
    let w = Worker::new(
        addr.clone(),
        RealConnector::new(addr, opts.clone(), RdmaSettings::tcp()),
        opts,
    );
    let s8 = rpc_shim::start("127.0.0.1:0", Major::V8, w.clone())
        .await
        .unwrap();
    let s7 = rpc_shim::start("127.0.0.1:0", Major::V7, w.clone())
        .await
        .unwrap();
    assert_eq!((s8.major, s7.major), (Major::V8, Major::V7));
    // exercise() checks the 7.0.0 HELLO, a graph computed and recomputed, against a 7.0.0
    // connection to the same server.
    exercise(s7.local, server.addr).await;
    exercise8(s8.local, server.addr8, true).await;
    tokio::join!(
        exercise(s7.local, server.addr),
        exercise8(s8.local, server.addr8, false)
    );
    assert_eq!(w.major(), Some(Major::V8));
    // 8.0's commands do not exist on the 7.0.0 port.
    let mut c = connect(s7.local).await;
    assert_eq!(c.major(), Major::V7);
    c.send_bytes(&frame(Command::CommFree.as_u8(), &[0; 4]))
        .await
        .unwrap();
    expect_closed(&mut c, "COMM_FREE on a 7.0.0 connection").await;
}

/// A worker announcing `major` that records every byte its connections send after HELLO.
async fn recording_worker(major: Major) -> (SocketAddr, Arc<Mutex<Vec<u8>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let rec = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let rec = rec.clone();
            tokio::spawn(async move {
                let mut hello = [0u8; 9 + 24];
                if s.read_exact(&mut hello).await.is_err() {
                    return;
                }
                let mut reply = Vec::new();
                Response::hello(major, [0; 24]).encode(&mut reply);
                if s.write_all(&reply).await.is_err() {
                    return;
                }
                let mut b = vec![0u8; 1 << 16];
                while let Ok(n @ 1..) = s.read(&mut b).await {
                    rec.lock().unwrap().extend_from_slice(&b[..n]);
                }
            });
        }
    });
    (addr, seen)
}

/// A graph of `n` tensors (their contents do not matter to a relay).
fn graph(n: usize) -> (Vec<u64>, Vec<RpcTensor>) {
    let tensors = (0..n)
        .map(|i| TensorBuilder::f32(i as u64 + 1).ne(&[4]).build())
        .collect();
    (vec![n as u64], tensors)
}

/// The frame an 8.0 GRAPH_COMPUTE of this graph is on the wire.
fn graph_frame_v8(device: u32, uid: u64, nodes: &[u64], tensors: &[RpcTensor]) -> Vec<u8> {
    let size = graph_payload_size(nodes.len() as u64, tensors.len() as u64).unwrap() + 8;
    let mut v = FrameHeader::new(Command::GraphCompute, size)
        .encode()
        .to_vec();
    encode_graph(device, Some(uid), nodes, tensors, &mut v);
    v
}

async fn wait_bytes(seen: &Mutex<Vec<u8>>, want: &[u8]) {
    wait_for(
        "the worker to get every byte",
        Duration::from_secs(10),
        || seen.lock().unwrap().len() >= want.len(),
    )
    .await;
    let got = std::mem::take(&mut *seen.lock().unwrap());
    assert_eq!(got.len(), want.len());
    assert!(got == want, "the worker got other bytes than expected");
}

/// What an 8.0.0 worker receives: a 7.0.0 client's GRAPH_COMPUTE (small, and large enough to be
/// streamed) with the fixed uid after the device, its GRAPH_RECOMPUTE as 12 bytes; an 8.0.0
/// client's frames byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn translated_frames_on_the_wire() {
    let (worker, seen) = recording_worker(Major::V8).await;
    let opts = Options {
        prefetch: false,
        ..test_opts()
    };
    let s7 = shim_tcp_major(worker, Major::V7, opts.clone()).await;
    let s8 = shim_tcp_major(worker, Major::V8, opts).await;

    let mut c = connect(s7.local).await;
    assert_eq!(c.major(), Major::V7);
    let (small_nodes, small) = graph(3);
    let (big_nodes, big) = graph(300); // 88,816 bytes: streamed
    c.graph_compute(2, &small_nodes, &small).await.unwrap();
    c.graph_recompute(2).await.unwrap();
    c.graph_compute(0, &big_nodes, &big).await.unwrap();
    c.graph_recompute(0).await.unwrap();
    let mut want = graph_frame_v8(2, LAST_GRAPH_UID, &small_nodes, &small);
    Request::GraphRecompute {
        device: 2,
        uid: Some(LAST_GRAPH_UID),
    }
    .encode(&mut want);
    want.extend(graph_frame_v8(0, LAST_GRAPH_UID, &big_nodes, &big));
    Request::GraphRecompute {
        device: 0,
        uid: Some(LAST_GRAPH_UID),
    }
    .encode(&mut want);
    wait_bytes(&seen, &want).await;
    drop(c);

    let mut c = connect(s8.local).await;
    assert_eq!(c.major(), Major::V8);
    c.graph_compute_uid(1, 77, &big_nodes, &big).await.unwrap();
    c.graph_recompute_uid(1, 77).await.unwrap();
    let region = Region2d {
        offset: 8,
        size: 4,
        n_copies: 3,
        stride: 16,
    };
    c.set_tensor_2d(&small[0], region, &[9; 12]).await.unwrap();
    c.comm_allreduce(0, &small[1]).await.unwrap();
    c.comm_free(0).await.unwrap();
    let mut want = graph_frame_v8(1, 77, &big_nodes, &big);
    for r in [
        Request::GraphRecompute {
            device: 1,
            uid: Some(77),
        },
        Request::SetTensor2d {
            tensor: small[0],
            region,
            data: &[9; 12],
        },
        Request::CommAllreduce {
            device: 0,
            tensor: small[1],
        },
        Request::CommFree { device: 0 },
    ] {
        r.encode(&mut want);
    }
    wait_bytes(&seen, &want).await;
}

/// An 8.0.0 client in front of a 7.0.0 worker: refused at HELLO once the shim knows the worker's
/// version (prefetch), else at the first command that needs the worker's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn v8_client_with_a_7_worker_is_refused() {
    let server = TestServer::start();
    let shim = shim_tcp_major(server.addr, Major::V8, test_opts()).await;
    wait_for(
        "the prefetch to learn the worker's version",
        Duration::from_secs(10),
        || shim.worker.major() == Some(Major::V7),
    )
    .await;
    let r = within("HELLO", Client::connect(shim.local)).await;
    assert_closed(r, "HELLO of an 8.0.0 client, 7.0.0 worker");

    let opts = Options {
        prefetch: false,
        ..test_opts()
    };
    let shim = shim_tcp_major(server.addr, Major::V8, opts).await;
    assert_eq!(shim.worker.major(), None);
    let mut c = connect(shim.local).await;
    assert_eq!(
        c.major(),
        Major::V8,
        "answered locally before the worker is known"
    );
    assert_eq!(
        c.device_count().await.unwrap(),
        1,
        "queries are the same in both"
    );
    let allocs = served(&server, Command::AllocBuffer);
    assert_closed(
        c.alloc_buffer(0, 1024).await,
        "ALLOC_BUFFER to a 7.0.0 worker",
    );
    assert_eq!(
        served(&server, Command::AllocBuffer),
        allocs,
        "nothing relayed"
    );
    assert_eq!(shim.worker.major(), Some(Major::V7));
    // The 7.0.0 suite on a 7.0.0 listener of the same worker still works.
    let s7 = rpc_shim::start("127.0.0.1:0", Major::V7, shim.worker.clone())
        .await
        .unwrap();
    exercise(s7.local, server.addr).await;
}

/// A worker announcing 8.0.0 that reads one COMM_INIT frame per connection, keeps its request and
/// answers `ok = 0` (no collectives here).
async fn comm_worker() -> (SocketAddr, Arc<Mutex<Vec<CommInit>>>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let rec = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let rec = rec.clone();
            tokio::spawn(async move {
                let mut hello = [0u8; 9 + 24];
                if s.read_exact(&mut hello).await.is_err() {
                    return;
                }
                let mut reply = Vec::new();
                Response::hello(Major::V8, [0; 24]).encode(&mut reply);
                s.write_all(&reply).await.unwrap();
                let mut f = [0u8; 9 + 80];
                if s.read_exact(&mut f).await.is_err() {
                    return; // the control connection
                }
                let limits = rpc_proto::Limits::default();
                let req = Request::decode(Major::V8, Command::CommInit, &f[9..], &limits).unwrap();
                let Request::CommInit(init) = req else {
                    panic!("not COMM_INIT")
                };
                rec.lock().unwrap().push(init);
                let mut ok = Vec::new();
                Response::CommInit { ok: 0 }.encode(&mut ok);
                s.write_all(&ok).await.unwrap();
                let _ = s.read(&mut f).await;
            });
        }
    });
    (addr, seen)
}

/// `--rpc SHIM_A,SHIM_B` with tensor split: the stock client names rank 0 by the shim's port
/// (+ 1000) and, to rank 1, the host it used for the shim; each worker gets rank 0's worker port
/// + 1000 and, rank 1, rank 0's worker host instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn comm_init_names_the_real_rank0_worker() {
    let (wa, seen_a) = comm_worker().await;
    let (wb, seen_b) = comm_worker().await;
    let opts = Options {
        prefetch: false,
        ..test_opts()
    };
    let sa = shim_tcp_major(wa, Major::V8, opts.clone()).await;
    let sb = shim_tcp_major(wb, Major::V8, opts).await;
    let port = u32::from(sa.local.port()) + 1000;
    let init = |rank, host: &str| CommInit {
        device: 0,
        rank,
        world: 2,
        port,
        host: CommInit::host_field(host).unwrap(),
    };
    let (mut a, mut b) = (connect(sa.local).await, connect(sb.local).await);
    assert!(!a.comm_init(init(0, "")).await.unwrap());
    assert!(!b.comm_init(init(1, "shim.local")).await.unwrap());
    let real = u32::from(wa.port()) + 1000;
    let got_a = seen_a.lock().unwrap().clone();
    let got_b = seen_b.lock().unwrap().clone();
    assert_eq!(got_a.len(), 1);
    assert_eq!(
        (got_a[0].rank, got_a[0].host_str(), got_a[0].port),
        (0, Some(""), real)
    );
    assert_eq!(got_b.len(), 1);
    assert_eq!(
        (got_b[0].rank, got_b[0].host_str(), got_b[0].port),
        (1, Some("127.0.0.1"), real)
    );
    // A rank 0 that is not behind this shim: sent as it came.
    let mut c = connect(sb.local).await;
    let mut other = init(1, "10.9.9.9");
    other.port = 999;
    assert!(!c.comm_init(other).await.unwrap());
    let got = seen_b.lock().unwrap().last().copied().unwrap();
    assert_eq!((got.host_str(), got.port), (Some("10.9.9.9"), 999));
}
