//! Raw-protocol integration tests: an in-process `rpc-server` (CPU device, 1 thread) on
//! 127.0.0.1:0, spoken to through `rpc-client` and through hand-made bytes.
//!
//! Spec references (§) are to `docs/ggml-rpc-protocol.md` (protocol 7.0.0).

use rpc_client::{ops, types, Client, ClientError, RpcTensor, TensorBuilder, TENSOR_FLAG_COMPUTE};
use rpc_proto::{encode_graph, fnv1a64, Command, Request, SetTensorHeader};
use rpc_tests::*;

// ---------------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------------

/// The frame of a request, encoded by the shared codec.
fn enc(req: Request<'_>) -> Vec<u8> {
    let mut v = Vec::new();
    req.encode(&mut v);
    v
}

/// A GRAPH_COMPUTE frame.
fn graph_frame(device: u32, nodes: &[u64], tensors: &[RpcTensor]) -> Vec<u8> {
    let mut p = Vec::new();
    encode_graph(device, None, nodes, tensors, &mut p);
    frame(Command::GraphCompute as u8, &p)
}

/// A SET_TENSOR frame.
fn set_frame(t: &RpcTensor, offset: u64, data: &[u8]) -> Vec<u8> {
    enc(Request::SetTensor {
        tensor: *t,
        cache_flag: 0,
        offset,
        data,
    })
}

/// A GET_TENSOR frame.
fn get_frame(t: &RpcTensor, offset: u64, size: u64) -> Vec<u8> {
    enc(Request::GetTensor {
        tensor: *t,
        offset,
        size,
    })
}

/// `c[n][m] = Σ_k a[m][k]·b[n][k]` for `a: [k, m]`, `b: [k, n]` (ggml MUL_MAT), row-major.
/// SET_TENSOR of `v` at offset 0 of `t`; panics if the request fails.
async fn set_f32(c: &mut Client, t: &RpcTensor, v: &[f32]) {
    c.set_tensor(t, 0, &f32_bytes(v), false).await.unwrap();
}

fn mul_mat_ref(a: &[f32], b: &[f32], k: usize, m: usize, n: usize) -> Vec<f32> {
    let mut c = vec![0.0; m * n];
    for j in 0..n {
        for i in 0..m {
            c[j * m + i] = (0..k).map(|x| a[i * k + x] * b[j * k + x]).sum();
        }
    }
    c
}

/// Small integers in [-3, 3], so every sum of products is exact in f32.
fn small_ints(len: usize, seed: u64) -> Vec<f32> {
    pattern(len, seed)
        .into_iter()
        .map(|b| f32::from(b % 7) - 3.0)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Handshake and device queries
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_announces_7_0_0_with_zero_caps() {
    let s = shared_server();
    let c = connect(s.addr).await;
    assert_eq!(c.server_version(), Some((7, 0, 0)));
    assert_eq!(c.server_caps(), &[0u8; 24]);

    // Raw: exactly 28 bytes `07 00 00 00` + 24 zero bytes (§4.2, §18).
    let mut raw = Client::connect_raw(s.addr).await.unwrap();
    raw.send_bytes(&frame(Command::Hello as u8, &[0; 24]))
        .await
        .unwrap();
    let rsp = within("HELLO reply", raw.recv_response(28)).await.unwrap();
    let mut want = vec![7u8, 0, 0, 0];
    want.extend_from_slice(&[0; 24]);
    assert_eq!(rsp, want);
    // The connection is usable afterwards.
    raw.send_bytes(&frame(Command::DeviceCount as u8, &[]))
        .await
        .unwrap();
    assert_eq!(raw.recv_response(4).await.unwrap(), 1u32.to_le_bytes());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_with_nonzero_client_caps_is_answered_with_zero_caps() {
    // A stock client with an RDMA device sends non-zero caps; a TCP-only server answers zeros.
    let s = shared_server();
    let mut raw = Client::connect_raw(s.addr).await.unwrap();
    raw.send_bytes(&frame(Command::Hello as u8, &[0xA5; 24]))
        .await
        .unwrap();
    let rsp = within("HELLO reply", raw.recv_response(28)).await.unwrap();
    assert_eq!(&rsp[..3], &[7, 0, 0]);
    assert_eq!(&rsp[4..], &[0u8; 24]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_queries() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    assert_eq!(c.device_count().await.unwrap(), 1);
    let align = c.get_alignment(0).await.unwrap();
    assert!(align.is_power_of_two(), "alignment {align}");
    assert_eq!(align, 32, "the CPU backend's alignment (§18)");
    let max = c.get_max_size(0).await.unwrap();
    assert_eq!(max, u64::MAX, "the CPU backend answers SIZE_MAX (§18)");
    let mem = c.get_device_memory(0).await.unwrap();
    assert!(mem.total > 0, "{mem:?}");
    assert!(mem.free <= mem.total, "{mem:?}");
}

// ---------------------------------------------------------------------------------------------
// Buffers and tensor data
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alloc_buffer_base_and_handles() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let align = c.get_alignment(0).await.unwrap();
    let b1 = c.alloc_buffer(0, 1000).await.unwrap().expect("allocation");
    let b2 = c.alloc_buffer(0, 1000).await.unwrap().expect("allocation");
    assert_ne!(b1.handle, 0);
    assert_ne!(b2.handle, 0);
    assert_ne!(b1.handle, b2.handle);
    assert!(b1.size >= 1000, "{b1:?}");
    for b in [b1, b2] {
        let base = c.buffer_get_base(b.handle).await.unwrap();
        assert_ne!(base, 0, "a null base breaks ggml-alloc (§9)");
        assert_eq!(base % align, 0, "base {base:#x} not aligned to {align}");
        assert_eq!(
            c.buffer_get_base(b.handle).await.unwrap(),
            base,
            "stable base"
        );
    }
    c.free_buffer(b1.handle).await.unwrap();
    // b2 still works, and the connection is alive.
    let base2 = c.buffer_get_base(b2.handle).await.unwrap();
    assert_ne!(base2, 0);
    // The freed handle is gone: using it closes the connection.
    assert_closed(
        c.buffer_get_base(b1.handle).await,
        "BUFFER_GET_BASE of a freed buffer",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alloc_buffer_too_large_returns_null_and_keeps_the_connection() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let r = within("ALLOC_BUFFER 2^62", c.alloc_buffer(0, 1 << 62))
        .await
        .unwrap();
    assert_eq!(
        r, None,
        "an impossible allocation answers a null handle (§5.1)"
    );
    assert_eq!(c.device_count().await.unwrap(), 1);
    let ok = alloc(&mut c, 64).await;
    assert_ne!(ok.handle, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_and_get_tensor_round_trip() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4 << 20).await;

    // Small, at an offset inside the buffer, read back whole and in parts.
    let t = buf.f32(1, &[256], 4096).build();
    let data = pattern(1024, 1);
    c.set_tensor(&t, 0, &data, false).await.unwrap();
    assert_eq!(c.get_tensor(&t, 0, 1024).await.unwrap(), data);
    assert_eq!(c.get_tensor(&t, 100, 24).await.unwrap(), &data[100..124]);
    // Write with an offset.
    c.set_tensor(&t, 512, &[0xEE; 8], false).await.unwrap();
    let mut want = data.clone();
    want[512..520].fill(0xEE);
    assert_eq!(c.get_tensor(&t, 0, 1024).await.unwrap(), want);
    // Zero-length reads and writes are valid.
    c.set_tensor(&t, 0, &[], false).await.unwrap();
    assert_eq!(c.get_tensor(&t, 0, 0).await.unwrap(), Vec::<u8>::new());

    // Large (streamed on the server: >= 64 KiB) at the very end of the buffer.
    let n = 3 << 20;
    let big_t = buf.f32(2, &[(n / 4) as u32], buf.size - n).build();
    let big = pattern(n as usize, 2);
    c.set_tensor(&big_t, 0, &big, false).await.unwrap();
    assert_eq!(c.get_tensor(&big_t, 0, n).await.unwrap(), big);
    // The small tensor was not disturbed.
    assert_eq!(c.get_tensor(&t, 0, 1024).await.unwrap(), want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffer_clear_fills_the_whole_buffer() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4096).await;
    let all = buf.f32(1, &[(buf.size / 4) as u32], 0).build();
    c.set_tensor(&all, 0, &pattern(buf.size as usize, 3), false)
        .await
        .unwrap();
    c.buffer_clear(buf.handle, 0xAB).await.unwrap();
    assert_eq!(
        c.get_tensor(&all, 0, buf.size).await.unwrap(),
        vec![0xAB; buf.size as usize]
    );
    c.buffer_clear(buf.handle, 0).await.unwrap();
    assert_eq!(
        c.get_tensor(&all, 0, buf.size).await.unwrap(),
        vec![0; buf.size as usize]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memset_tensor_fills_only_its_region() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4096).await;
    let all = buf.f32(1, &[1024], 0).build();
    c.buffer_clear(buf.handle, 0).await.unwrap();
    let t = buf.f32(2, &[16], 128).build();
    c.memset_tensor(&t, 8, 40, 0x5A).await.unwrap();
    let got = c.get_tensor(&all, 0, 4096).await.unwrap();
    let mut want = vec![0u8; 4096];
    want[136..176].fill(0x5A);
    assert_eq!(got, want);
    // The whole tensor.
    c.memset_tensor(&t, 0, 64, 0x11).await.unwrap();
    assert_eq!(c.get_tensor(&t, 0, 64).await.unwrap(), vec![0x11; 64]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_tensor_copies_between_buffers() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let b1 = alloc(&mut c, 4096).await;
    let b2 = alloc(&mut c, 4096).await;
    let src = b1.f32(1, &[64], 256).build();
    let dst = b2.f32(2, &[64], 1024).build();
    let data = pattern(256, 4);
    c.set_tensor(&src, 0, &data, false).await.unwrap();
    c.buffer_clear(b2.handle, 0).await.unwrap();
    assert!(
        c.copy_tensor(&src, &dst).await.unwrap(),
        "COPY_TENSOR answers 1 (§18)"
    );
    assert_eq!(c.get_tensor(&dst, 0, 256).await.unwrap(), data);
    // Inside the same buffer too.
    let dst2 = b1.f32(3, &[64], 2048).build();
    assert!(c.copy_tensor(&src, &dst2).await.unwrap());
    assert_eq!(c.get_tensor(&dst2, 0, 256).await.unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_tensor_has_no_reply_and_keeps_data() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4096).await;
    let t = buf.f32(1, &[16], 0).build();
    let data = pattern(64, 5);
    c.set_tensor(&t, 0, &data, false).await.unwrap();
    c.init_tensor(&t).await.unwrap();
    // A quantized tensor, as the stock client sends (quantized, ne0 % 512 != 0, §9).
    let q = TensorBuilder::new(2, types::Q4_0)
        .ne(&[64, 2])
        .data(buf.handle, buf.at(1024))
        .build();
    c.init_tensor(&q).await.unwrap();
    // Next reply is DEVICE_COUNT's, so INIT_TENSOR answered nothing.
    assert_eq!(c.device_count().await.unwrap(), 1);
    assert_eq!(c.get_tensor(&t, 0, 64).await.unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_alloc_size_answers_nbytes_for_plain_tensors() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    // Without a buffer (device default buffer type).
    let t = TensorBuilder::f32(1).ne(&[16]).build();
    assert_eq!(c.get_alloc_size(0, &t, &[]).await.unwrap(), 64);
    let t2 = TensorBuilder::f32(2).ne(&[3, 5, 2]).build();
    assert_eq!(c.get_alloc_size(0, &t2, &[]).await.unwrap(), 120);
    // In a buffer of this connection.
    let buf = alloc(&mut c, 4096).await;
    let t3 = buf.f32(3, &[16], 64).build();
    assert_eq!(c.get_alloc_size(0, &t3, &[]).await.unwrap(), 64);
    // With sources.
    let sum = TensorBuilder::f32(4)
        .ne(&[16])
        .op(ops::ADD, &[])
        .srcs(&[1, 3])
        .build();
    assert_eq!(c.get_alloc_size(0, &sum, &[t, t3]).await.unwrap(), 64);
    // A quantized tensor: CPU needs exactly nbytes (2 blocks of 18 bytes per row).
    let q = TensorBuilder::new(5, types::Q4_0).ne(&[64, 3]).build();
    assert_eq!(c.get_alloc_size(0, &q, &[]).await.unwrap(), 3 * 36);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_tensor_hash_without_cache_answers_0() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4096).await;
    let t = buf.f32(1, &[16], 0).build();
    let data = pattern(64, 6);
    c.set_tensor(&t, 0, &data, true).await.unwrap(); // cache flag without a cache: ignored
    assert!(!c.set_tensor_hash(&t, 0, fnv1a64(&data)).await.unwrap());
    assert_eq!(c.get_tensor(&t, 0, 64).await.unwrap(), data);
}

// ---------------------------------------------------------------------------------------------
// Graphs
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_add_computes_and_recomputes_with_new_inputs() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 3 * 4 * 8).await;
    let (a, b, sum) = add_graph(&buf, 8);
    let av = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
    let bv = [10.0f32, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0];
    set_f32(&mut c, &a, &av).await;
    set_f32(&mut c, &b, &bv).await;
    c.graph_compute(0, &[3], &[a, b, sum]).await.unwrap();
    let got = bytes_f32(&c.get_tensor(&sum, 0, 32).await.unwrap());
    assert_eq!(got, [11.0, 22.0, 33.0, 44.0, 55.0, 66.0, 77.0, 88.0]);

    // New inputs, GRAPH_RECOMPUTE (13 bytes on the wire), new result.
    for round in 1..=3 {
        let r = round as f32;
        let a2: Vec<f32> = av.iter().map(|x| x * r).collect();
        let b2: Vec<f32> = bv.iter().map(|x| -x / 2.0).collect();
        set_f32(&mut c, &a, &a2).await;
        set_f32(&mut c, &b, &b2).await;
        c.graph_recompute(0).await.unwrap();
        let got = bytes_f32(&c.get_tensor(&sum, 0, 32).await.unwrap());
        let want: Vec<f32> = a2.iter().zip(&b2).map(|(x, y)| x + y).collect();
        assert_eq!(got, want, "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_mul_mat() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let (k, m, n) = (8usize, 5usize, 3usize);
    let buf = alloc(&mut c, 4096).await;
    let a = buf.f32(11, &[k as u32, m as u32], 0).name("w").build();
    let b = buf.f32(12, &[k as u32, n as u32], 512).name("x").build();
    let out = buf
        .f32(13, &[m as u32, n as u32], 1024)
        .op(ops::MUL_MAT, &[])
        .srcs(&[11, 12])
        .flags(TENSOR_FLAG_COMPUTE)
        .name("y")
        .build();
    let av = small_ints(k * m, 7);
    let bv = small_ints(k * n, 8);
    set_f32(&mut c, &a, &av).await;
    set_f32(&mut c, &b, &bv).await;
    c.graph_compute(0, &[13], &[a, b, out]).await.unwrap();
    let got = bytes_f32(&c.get_tensor(&out, 0, (m * n * 4) as u64).await.unwrap());
    assert_eq!(got, mul_mat_ref(&av, &bv, k, m, n));

    let bv2 = small_ints(k * n, 9);
    set_f32(&mut c, &b, &bv2).await;
    c.graph_recompute(0).await.unwrap();
    let got = bytes_f32(&c.get_tensor(&out, 0, (m * n * 4) as u64).await.unwrap());
    assert_eq!(got, mul_mat_ref(&av, &bv2, k, m, n));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_with_two_nodes_and_a_broadcast() {
    // d = (a + b) * s, with s a single value broadcast over the row (GGML_OP_MUL = 7).
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4096).await;
    let (a, b, sum) = add_graph(&buf, 4);
    let sc = buf.f32(4, &[1], 256).name("s").build();
    let d = buf
        .f32(5, &[4], 512)
        .op(ops::MUL, &[])
        .srcs(&[3, 4])
        .flags(TENSOR_FLAG_COMPUTE)
        .name("d")
        .build();
    set_f32(&mut c, &a, &[1.0, 2.0, 3.0, 4.0]).await;
    set_f32(&mut c, &b, &[1.0, 1.0, 1.0, 1.0]).await;
    set_f32(&mut c, &sc, &[3.0]).await;
    // Tensors in DFS post-order, as the stock client serializes them (§7).
    c.graph_compute(0, &[3, 5], &[a, b, sum, sc, d])
        .await
        .unwrap();
    assert_eq!(
        bytes_f32(&c.get_tensor(&d, 0, 16).await.unwrap()),
        [6.0, 9.0, 12.0, 15.0]
    );
    assert_eq!(
        bytes_f32(&c.get_tensor(&sum, 0, 16).await.unwrap()),
        [2.0, 3.0, 4.0, 5.0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_tensors_in_any_order_and_duplicates() {
    // The tensor array need not be in post-order; a duplicated id is harmless (first wins).
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4096).await;
    let (a, b, sum) = add_graph(&buf, 4);
    set_f32(&mut c, &a, &[1.0, 2.0, 3.0, 4.0]).await;
    set_f32(&mut c, &b, &[4.0, 3.0, 2.0, 1.0]).await;
    c.graph_compute(0, &[3], &[sum, b, a, a]).await.unwrap();
    assert_eq!(
        bytes_f32(&c.get_tensor(&sum, 0, 16).await.unwrap()),
        [5.0; 4]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_graph_replaces_the_stored_one() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4096).await;
    let (a, b, sum) = add_graph(&buf, 4);
    let prod = buf
        .f32(6, &[4], 1024)
        .op(ops::MUL, &[])
        .srcs(&[1, 2])
        .flags(TENSOR_FLAG_COMPUTE)
        .build();
    set_f32(&mut c, &a, &[1.0, 2.0, 3.0, 4.0]).await;
    set_f32(&mut c, &b, &[2.0; 4]).await;
    c.graph_compute(0, &[3], &[a, b, sum]).await.unwrap();
    c.graph_compute(0, &[6], &[a, b, prod]).await.unwrap();
    assert_eq!(
        bytes_f32(&c.get_tensor(&prod, 0, 16).await.unwrap()),
        [2.0, 4.0, 6.0, 8.0]
    );
    // Change the inputs and clear both outputs: only the product is recomputed.
    set_f32(&mut c, &a, &[10.0; 4]).await;
    c.memset_tensor(&sum, 0, 16, 0).await.unwrap();
    c.memset_tensor(&prod, 0, 16, 0).await.unwrap();
    c.graph_recompute(0).await.unwrap();
    assert_eq!(
        bytes_f32(&c.get_tensor(&prod, 0, 16).await.unwrap()),
        [20.0; 4]
    );
    assert_eq!(
        bytes_f32(&c.get_tensor(&sum, 0, 16).await.unwrap()),
        [0.0; 4]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn free_buffer_drops_the_stored_graph() {
    // 7.x: FREE_BUFFER drops stored graphs (issue #25703), so GRAPH_RECOMPUTE after freeing the
    // graph's buffer must close the connection instead of touching freed memory (§8).
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4096).await;
    let (a, b, sum) = add_graph(&buf, 4);
    set_f32(&mut c, &a, &[1.0; 4]).await;
    set_f32(&mut c, &b, &[2.0; 4]).await;
    c.graph_compute(0, &[3], &[a, b, sum]).await.unwrap();
    assert_eq!(
        bytes_f32(&c.get_tensor(&sum, 0, 16).await.unwrap()),
        [3.0; 4]
    );
    c.free_buffer(buf.handle).await.unwrap();
    c.graph_recompute(0).await.ok(); // may or may not be noticed while writing
    expect_closed(&mut c, "GRAPH_RECOMPUTE after FREE_BUFFER").await;
    assert_healthy(s.addr).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_frames_in_a_single_write() {
    // The stock dispatcher queues no-response commands back to back (§15.1): the server must
    // parse by framing. Everything below goes out in one write.
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4096).await;
    let (a, b, sum) = add_graph(&buf, 4);
    let mut burst = Vec::new();
    burst.extend(set_frame(&a, 0, &f32_bytes(&[1.0, 2.0, 3.0, 4.0])));
    burst.extend(set_frame(&b, 0, &f32_bytes(&[1.0; 4])));
    burst.extend(graph_frame(0, &[3], &[a, b, sum]));
    burst.extend(get_frame(&sum, 0, 16));
    burst.extend(set_frame(&b, 0, &f32_bytes(&[100.0; 4])));
    burst.extend(enc(Request::GraphRecompute {
        device: 0,
        uid: None,
    }));
    burst.extend(get_frame(&sum, 0, 16));
    burst.extend(enc(Request::DeviceCount));
    c.send_bytes(&burst).await.unwrap();
    let r1 = within("first GET_TENSOR", c.recv_response(16))
        .await
        .unwrap();
    let r2 = within("second GET_TENSOR", c.recv_response(16))
        .await
        .unwrap();
    let r3 = within("DEVICE_COUNT", c.recv_response(4)).await.unwrap();
    assert_eq!(bytes_f32(&r1), [2.0, 3.0, 4.0, 5.0]);
    assert_eq!(bytes_f32(&r2), [101.0, 102.0, 103.0, 104.0]);
    assert_eq!(r3, 1u32.to_le_bytes());
}

// ---------------------------------------------------------------------------------------------
// The 7.x response matrix (§5.1)
// ---------------------------------------------------------------------------------------------

/// Sends `frames`, then DEVICE_COUNT, and checks the very next bytes are DEVICE_COUNT's reply
/// (size prefix 4, count 1): the frames produced no output at all.
async fn assert_silent(c: &mut Client, frames: &[u8], what: &str) {
    let mut bytes = frames.to_vec();
    bytes.extend(frame(Command::DeviceCount as u8, &[]));
    c.send_bytes(&bytes).await.unwrap();
    let next = within(what, c.recv_raw(12))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(
        &next[..8],
        &4u64.to_le_bytes(),
        "{what}: the next 8 bytes must be DEVICE_COUNT's size prefix"
    );
    assert_eq!(&next[8..], &1u32.to_le_bytes(), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_without_response_send_nothing() {
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4096).await;
    let spare = alloc(&mut c, 64).await;
    let (a, b, sum) = add_graph(&buf, 4);
    let t = buf.f32(7, &[16], 1024).build();

    // One at a time, each checked separately.
    let memset = enc(Request::MemsetTensor {
        tensor: t,
        offset: 0,
        size: 64,
        value: 1,
    });
    let one_by_one: [(&str, Vec<u8>); 8] = [
        ("SET_TENSOR", set_frame(&a, 0, &f32_bytes(&[1.0; 4]))),
        ("SET_TENSOR", set_frame(&b, 0, &f32_bytes(&[2.0; 4]))),
        ("GRAPH_COMPUTE", graph_frame(0, &[3], &[a, b, sum])),
        (
            "GRAPH_RECOMPUTE",
            enc(Request::GraphRecompute {
                device: 0,
                uid: None,
            }),
        ),
        ("INIT_TENSOR", enc(Request::InitTensor { tensor: t })),
        ("MEMSET_TENSOR", memset.clone()),
        (
            "BUFFER_CLEAR",
            enc(Request::BufferClear {
                remote_ptr: spare.handle,
                value: 7,
            }),
        ),
        (
            "FREE_BUFFER",
            enc(Request::FreeBuffer {
                remote_ptr: spare.handle,
            }),
        ),
    ];
    for (what, frames) in &one_by_one {
        assert_silent(&mut c, frames, what).await;
    }

    // All together in one write, then the results are still right.
    let spare2 = alloc(&mut c, 64).await;
    let mut all = Vec::new();
    all.extend(set_frame(&a, 0, &f32_bytes(&[5.0; 4])));
    all.extend(graph_frame(0, &[3], &[a, b, sum]));
    all.extend(enc(Request::GraphRecompute {
        device: 0,
        uid: None,
    }));
    all.extend(enc(Request::InitTensor { tensor: t }));
    all.extend(&memset);
    all.extend(enc(Request::BufferClear {
        remote_ptr: spare2.handle,
        value: 7,
    }));
    all.extend(enc(Request::FreeBuffer {
        remote_ptr: spare2.handle,
    }));
    assert_silent(&mut c, &all, "all no-response commands in one write").await;
    assert_eq!(
        bytes_f32(&c.get_tensor(&sum, 0, 16).await.unwrap()),
        [7.0; 4]
    );
    assert_eq!(c.get_tensor(&t, 0, 64).await.unwrap(), vec![1; 64]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_sizes_of_commands_with_response() {
    // Raw frames, raw size prefixes: every command of the matrix answers exactly its size.
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let buf = alloc(&mut c, 4096).await;
    let t = buf.f32(1, &[16], 0).build();
    let cases: Vec<(&str, Vec<u8>, u64)> = vec![
        (
            "ALLOC_BUFFER",
            enc(Request::AllocBuffer {
                device: 0,
                size: 64,
            }),
            16,
        ),
        ("GET_ALIGNMENT", enc(Request::GetAlignment { device: 0 }), 8),
        ("GET_MAX_SIZE", enc(Request::GetMaxSize { device: 0 }), 8),
        (
            "BUFFER_GET_BASE",
            enc(Request::BufferGetBase {
                remote_ptr: buf.handle,
            }),
            8,
        ),
        (
            "SET_TENSOR_HASH",
            enc(Request::SetTensorHash {
                tensor: t,
                offset: 0,
                hash: 1,
            }),
            1,
        ),
        ("GET_TENSOR", get_frame(&t, 0, 20), 20),
        (
            "COPY_TENSOR",
            enc(Request::CopyTensor {
                src: t,
                dst: buf.f32(2, &[16], 64).build(),
            }),
            1,
        ),
        (
            "GET_DEVICE_MEMORY",
            enc(Request::GetDeviceMemory { device: 0 }),
            16,
        ),
        (
            "GET_ALLOC_SIZE",
            enc(Request::GetAllocSize {
                device: 0,
                tensor: t,
                srcs: Box::new([RpcTensor::default(); 10]),
            }),
            8,
        ),
        ("DEVICE_COUNT", enc(Request::DeviceCount), 4),
    ];
    for (name, bytes, len) in cases {
        c.send_bytes(&bytes).await.unwrap();
        within(name, c.recv_response(len))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    assert_silent(&mut c, &[], "nothing left over").await;
}

// ---------------------------------------------------------------------------------------------
// Several connections
// ---------------------------------------------------------------------------------------------

async fn mul_mat_worker(
    addr: std::net::SocketAddr,
    seed: u64,
    rounds: usize,
    start: std::sync::Arc<tokio::sync::Barrier>,
) {
    let (k, m, n) = (64usize, 64usize, 16usize);
    let mut c = connect(addr).await;
    let buf = alloc(&mut c, 64 << 10).await;
    let a = buf.f32(1, &[k as u32, m as u32], 0).build();
    let b = buf.f32(2, &[k as u32, n as u32], 16 << 10).build();
    let out = buf
        .f32(3, &[m as u32, n as u32], 32 << 10)
        .op(ops::MUL_MAT, &[])
        .srcs(&[1, 2])
        .flags(TENSOR_FLAG_COMPUTE)
        .build();
    let av = small_ints(k * m, seed);
    set_f32(&mut c, &a, &av).await;
    start.wait().await;
    for r in 0..rounds {
        let bv = small_ints(k * n, seed * 1000 + r as u64);
        set_f32(&mut c, &b, &bv).await;
        if r == 0 {
            c.graph_compute(0, &[3], &[a, b, out]).await.unwrap();
        } else {
            c.graph_recompute(0).await.unwrap();
        }
        let got = bytes_f32(&c.get_tensor(&out, 0, (m * n * 4) as u64).await.unwrap());
        assert_eq!(
            got,
            mul_mat_ref(&av, &bv, k, m, n),
            "client {seed}, round {r}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_concurrent_clients_compute_their_own_graphs() {
    let s = shared_server();
    let start = std::sync::Arc::new(tokio::sync::Barrier::new(2));
    let t1 = tokio::spawn(mul_mat_worker(s.addr, 1, 40, start.clone()));
    let t2 = tokio::spawn(mul_mat_worker(s.addr, 2, 40, start));
    within("two concurrent clients", async {
        t1.await.expect("client 1");
        t2.await.expect("client 2");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buffer_handles_belong_to_their_connection() {
    let s = shared_server();
    let mut owner = connect(s.addr).await;
    let buf = alloc(&mut owner, 4096).await;
    let t = buf.f32(1, &[16], 0).build();
    let data = pattern(64, 11);
    owner.set_tensor(&t, 0, &data, false).await.unwrap();

    // Every way of naming someone else's buffer closes the intruder's connection only.
    let (a, b, sum) = add_graph(&buf, 4);
    let attempts: Vec<(&str, Vec<u8>)> = vec![
        (
            "BUFFER_GET_BASE",
            enc(Request::BufferGetBase {
                remote_ptr: buf.handle,
            }),
        ),
        (
            "FREE_BUFFER",
            enc(Request::FreeBuffer {
                remote_ptr: buf.handle,
            }),
        ),
        (
            "BUFFER_CLEAR",
            enc(Request::BufferClear {
                remote_ptr: buf.handle,
                value: 0,
            }),
        ),
        ("GET_TENSOR", get_frame(&t, 0, 64)),
        ("SET_TENSOR", set_frame(&t, 0, &[0; 64])),
        (
            "SET_TENSOR (streamed)",
            set_frame(&buf.f32(1, &[32768], 0).build(), 0, &vec![0; 128 << 10]),
        ),
        (
            "MEMSET_TENSOR",
            enc(Request::MemsetTensor {
                tensor: t,
                offset: 0,
                size: 64,
                value: 0,
            }),
        ),
        ("COPY_TENSOR", enc(Request::CopyTensor { src: t, dst: t })),
        ("GRAPH_COMPUTE", graph_frame(0, &[3], &[a, b, sum])),
    ];
    for (name, bytes) in attempts {
        let mut intruder = connect(s.addr).await;
        // The intruder even has a buffer of its own.
        let _own = alloc(&mut intruder, 4096).await;
        let _ = intruder.send_bytes(&bytes).await;
        expect_closed(
            &mut intruder,
            &format!("{name} with another connection's handle"),
        )
        .await;
        // The owner's buffer is intact and usable.
        assert_eq!(
            owner.get_tensor(&t, 0, 64).await.unwrap(),
            data,
            "after {name}"
        );
    }
    assert_eq!(owner.buffer_get_base(buf.handle).await.unwrap(), buf.base);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_short_connections() {
    // The stock client opens a connection per early query (§15.4).
    let s = shared_server();
    for i in 0..40 {
        let mut c = connect(s.addr).await;
        match i % 4 {
            0 => assert_eq!(c.device_count().await.unwrap(), 1),
            1 => assert!(c.get_device_memory(0).await.unwrap().total > 0),
            2 => assert_eq!(c.get_alignment(0).await.unwrap(), 32),
            _ => {
                let t = TensorBuilder::f32(1).ne(&[8]).build();
                assert_eq!(c.get_alloc_size(0, &t, &[]).await.unwrap(), 32);
            }
        }
        c.shutdown().await.unwrap();
    }
    assert_healthy(s.addr).await;
}

// ---------------------------------------------------------------------------------------------
// Weight cache (SET_TENSOR cache_flag + SET_TENSOR_HASH, §10)
// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weight_cache_round_trip_small_and_streamed() {
    let dir = TempDir::new("cache");
    let server = TestServer::start_with_cache(dir.path());
    // > 64 KiB goes through the server's streamed SET_TENSOR path, < 64 KiB through the other.
    let big = pattern(100 << 10, 21);
    let small = pattern(16 << 10, 22);
    let uncached = pattern(8 << 10, 23);
    let (h_big, h_small, h_uncached) = (fnv1a64(&big), fnv1a64(&small), fnv1a64(&uncached));

    {
        let mut c = connect(server.addr).await;
        let buf = alloc(&mut c, 256 << 10).await;
        let tb = buf.f32(1, &[(big.len() / 4) as u32], 0).build();
        let ts = buf.f32(2, &[(small.len() / 4) as u32], 128 << 10).build();
        let tu = buf
            .f32(3, &[(uncached.len() / 4) as u32], 192 << 10)
            .build();
        // Nothing cached yet.
        assert!(!c.set_tensor_hash(&tb, 0, h_big).await.unwrap());
        c.set_tensor(&tb, 0, &big, true).await.unwrap();
        c.set_tensor(&ts, 0, &small, true).await.unwrap();
        c.set_tensor(&tu, 0, &uncached, false).await.unwrap();
        // Round trips: the SET_TENSORs (and their cache writes) are done.
        assert_eq!(c.get_tensor(&tb, 0, big.len() as u64).await.unwrap(), big);
        assert_eq!(
            c.get_tensor(&ts, 0, small.len() as u64).await.unwrap(),
            small
        );
        assert_eq!(
            c.get_tensor(&tu, 0, uncached.len() as u64).await.unwrap(),
            uncached
        );
    }

    // Entries are named by the 16-hex-digit FNV-1a of the payload (stock layout).
    for (h, data) in [(h_big, &big), (h_small, &small)] {
        let p = dir.path().join(format!("{h:016x}"));
        assert_eq!(
            std::fs::read(&p).ok().as_ref(),
            Some(data),
            "cache entry {}",
            p.display()
        );
    }
    assert!(
        !dir.path().join(format!("{h_uncached:016x}")).exists(),
        "cache_flag = 0 must not be cached"
    );

    // A fresh connection fills new tensors from the cache.
    let mut c = connect(server.addr).await;
    let buf = alloc(&mut c, 256 << 10).await;
    c.buffer_clear(buf.handle, 0).await.unwrap();
    let tb = buf.f32(1, &[(big.len() / 4) as u32], 4096).build();
    let ts = buf.f32(2, &[(small.len() / 4) as u32], 150 << 10).build();
    assert!(
        c.set_tensor_hash(&tb, 0, h_big).await.unwrap(),
        "big entry hit"
    );
    assert!(
        c.set_tensor_hash(&ts, 0, h_small).await.unwrap(),
        "small entry hit"
    );
    assert_eq!(c.get_tensor(&tb, 0, big.len() as u64).await.unwrap(), big);
    assert_eq!(
        c.get_tensor(&ts, 0, small.len() as u64).await.unwrap(),
        small
    );
    // Misses.
    assert!(
        !c.set_tensor_hash(&ts, 0, h_uncached).await.unwrap(),
        "uncached payload"
    );
    assert!(
        !c.set_tensor_hash(&ts, 0, 0x0123_4567_89ab_cdef)
            .await
            .unwrap(),
        "unknown hash"
    );
    // A hit at an offset inside a larger tensor.
    let whole = buf.f32(3, &[16384], 0).build();
    c.buffer_clear(buf.handle, 0).await.unwrap();
    assert!(c.set_tensor_hash(&whole, 1000, h_small).await.unwrap());
    let got = c
        .get_tensor(&whole, 0, 1000 + small.len() as u64 + 8)
        .await
        .unwrap();
    assert_eq!(&got[..1000], &[0u8; 1000][..]);
    assert_eq!(&got[1000..1000 + small.len()], &small[..]);
    assert_eq!(&got[1000 + small.len()..], &[0u8; 8]);

    // An entry that does not fit where it is asked to go closes the connection (§9).
    let tiny = alloc(&mut c, 4096).await;
    let t = tiny.f32(9, &[1024], 0).build();
    assert_closed(
        c.set_tensor_hash(&t, 0, h_small).await,
        "SET_TENSOR_HASH larger than the buffer",
    );
    assert_healthy(server.addr).await;
}

// ---------------------------------------------------------------------------------------------
// Malformed requests: each closes only its own connection
// ---------------------------------------------------------------------------------------------

const VICTIM_BUFFER: u64 = 4096;

/// Opens a bystander connection with data in a buffer, then a victim connection that (after
/// HELLO and a 4 KiB buffer, if `hello`) sends `make(&its_buffer)`. Checks that the victim is
/// closed, the bystander is unaffected, and a fresh client gets correct service.
async fn check_rejected(name: &str, hello: bool, make: impl FnOnce(&Buf) -> Vec<u8>) {
    let s = shared_server();
    let mut bystander = connect(s.addr).await;
    let bbuf = alloc(&mut bystander, 256).await;
    let bt = bbuf.f32(1, &[64], 0).build();
    let bdata = pattern(256, 99);
    bystander.set_tensor(&bt, 0, &bdata, false).await.unwrap();

    let mut victim = within("connect", Client::connect_raw(s.addr))
        .await
        .unwrap();
    let vbuf = if hello {
        within("HELLO", victim.hello()).await.unwrap();
        alloc(&mut victim, VICTIM_BUFFER).await
    } else {
        Buf {
            handle: 0x1000,
            base: 0x10_0000,
            size: 0,
        }
    };
    let bytes = make(&vbuf);
    match victim.send_bytes(&bytes).await {
        Ok(()) | Err(ClientError::Closed) => {}
        Err(e) => panic!("{name}: sending failed: {e}"),
    }
    expect_closed(&mut victim, name).await;

    let got = within("bystander", bystander.get_tensor(&bt, 0, 256))
        .await
        .unwrap_or_else(|e| panic!("{name}: the bystander connection broke: {e}"));
    assert_eq!(got, bdata, "{name}: bystander data");
    assert_healthy(s.addr).await;
}

/// A malformed request: its name, whether the victim says HELLO (and gets a 4 KiB buffer)
/// first, and the bytes it then sends (built from that buffer).
type Rejected = (&'static str, bool, fn(&Buf) -> Vec<u8>);

/// [`check_rejected`] for each case of the table, in order.
async fn check_all_rejected(cases: &[Rejected]) {
    for &(name, hello, make) in cases {
        check_rejected(name, hello, make).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_handshake() {
    check_all_rejected(&[
        ("non-HELLO first command (DEVICE_COUNT)", false, |_| {
            frame(Command::DeviceCount as u8, &[])
        }),
        ("non-HELLO first command (ALLOC_BUFFER)", false, |_| {
            enc(Request::AllocBuffer {
                device: 0,
                size: 64,
            })
        }),
        ("HELLO of size 0 (pre-4.0 client)", false, |_| {
            frame(Command::Hello as u8, &[])
        }),
        ("HELLO of size 25", false, |_| {
            frame(Command::Hello as u8, &[0; 25])
        }),
        ("HELLO of size 23", false, |_| {
            frame(Command::Hello as u8, &[0; 23])
        }),
        ("unknown first command 200", false, |_| frame(200, &[])),
        ("second HELLO", true, |_| {
            frame(Command::Hello as u8, &[0; 24])
        }),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_framing() {
    // 7.0's RPC_CMD_NONE (18) and above.
    let none = rpc_proto::Major::V7.cmd_none();
    for cmd in [none, none + 1, none + 2, 200, 255] {
        check_rejected(&format!("unknown command {cmd}"), true, |_| frame(cmd, &[])).await;
    }
    check_rejected("unknown command 18 with a payload", true, |_| {
        frame(rpc_proto::Major::V7.cmd_none(), &[0; 8])
    })
    .await;
    // Fixed-size commands with the wrong size (§3.2): (command, wrong payload size).
    let wrong: [(Command, usize); 16] = [
        (Command::DeviceCount, 4),
        (Command::GetAlignment, 8),
        (Command::GetAlignment, 0),
        (Command::GetMaxSize, 5),
        (Command::GetDeviceMemory, 3),
        (Command::AllocBuffer, 11),
        (Command::AllocBuffer, 16),
        (Command::BufferGetBase, 4),
        (Command::FreeBuffer, 9),
        (Command::BufferClear, 8),
        (Command::SetTensorHash, 311),
        (Command::GetTensor, 313),
        (Command::CopyTensor, 296),
        (Command::InitTensor, 297),
        (Command::GetAllocSize, 3259),
        (Command::MemsetTensor, 312),
    ];
    for (cmd, size) in wrong {
        check_rejected(&format!("{cmd} with a {size}-byte payload"), true, |_| {
            frame(cmd as u8, &vec![0; size])
        })
        .await;
    }
    check_all_rejected(&[
        ("GRAPH_RECOMPUTE with an empty payload", true, |_| {
            frame(Command::GraphRecompute as u8, &[])
        }),
        ("SET_TENSOR shorter than its 305-byte header", true, |_| {
            frame(Command::SetTensor as u8, &[0; 304])
        }),
        (
            "GRAPH_COMPUTE shorter than its 12-byte header",
            true,
            |_| frame(Command::GraphCompute as u8, &[0; 11]),
        ),
        // Hostile sizes: the server must refuse before allocating or reading (§3.2).
        ("GRAPH_COMPUTE announcing 2^40 bytes", true, |_| {
            let mut v = vec![Command::GraphCompute as u8];
            v.extend_from_slice(&(1u64 << 40).to_le_bytes());
            v.extend_from_slice(&[0; 12]);
            v
        }),
        ("SET_TENSOR announcing u64::MAX bytes", true, |b| {
            let h = SetTensorHeader {
                tensor: b.f32(1, &[16], 0).build(),
                cache_flag: 0,
                offset: 0,
            };
            let mut v = vec![Command::SetTensor as u8];
            v.extend_from_slice(&u64::MAX.to_le_bytes());
            h.encode(&mut v);
            v
        }),
        (
            "SET_TENSOR announcing 1 GiB into a 4 KiB buffer",
            true,
            |b| {
                let h = SetTensorHeader {
                    tensor: b.f32(1, &[16], 0).build(),
                    cache_flag: 0,
                    offset: 0,
                };
                let mut v = Vec::new();
                h.encode_frame_head(1 << 30, &mut v);
                v
            },
        ),
        (
            "GRAPH_COMPUTE whose n_nodes exceeds the payload",
            true,
            |b| {
                let (a, bb, sum) = add_graph(b, 4);
                let mut p = Vec::new();
                encode_graph(0, None, &[3], &[a, bb, sum], &mut p);
                p[4..8].copy_from_slice(&1000u32.to_le_bytes());
                frame(Command::GraphCompute as u8, &p)
            },
        ),
        (
            "GRAPH_COMPUTE whose n_tensors exceeds the payload",
            true,
            |b| {
                let (a, bb, sum) = add_graph(b, 4);
                let mut p = Vec::new();
                encode_graph(0, None, &[3], &[a, bb, sum], &mut p);
                p[16..20].copy_from_slice(&4u32.to_le_bytes());
                frame(Command::GraphCompute as u8, &p)
            },
        ),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_devices_and_handles() {
    check_all_rejected(&[
        ("GET_ALIGNMENT on device 1", true, |_| {
            enc(Request::GetAlignment { device: 1 })
        }),
        ("GET_MAX_SIZE on device 1", true, |_| {
            enc(Request::GetMaxSize { device: 1 })
        }),
        ("GET_DEVICE_MEMORY on device u32::MAX", true, |_| {
            enc(Request::GetDeviceMemory { device: u32::MAX })
        }),
        ("ALLOC_BUFFER on device 1", true, |_| {
            enc(Request::AllocBuffer {
                device: 1,
                size: 64,
            })
        }),
        ("GET_ALLOC_SIZE on device 1", true, |_| {
            enc(Request::GetAllocSize {
                device: 1,
                tensor: TensorBuilder::f32(1).ne(&[4]).build(),
                srcs: Box::new([RpcTensor::default(); 10]),
            })
        }),
        ("GRAPH_RECOMPUTE on device 1", true, |_| {
            enc(Request::GraphRecompute {
                device: 1,
                uid: None,
            })
        }),
        ("GRAPH_RECOMPUTE without a stored graph", true, |_| {
            enc(Request::GraphRecompute {
                device: 0,
                uid: None,
            })
        }),
        ("GRAPH_COMPUTE on device 1", true, |b| {
            let (a, bb, sum) = add_graph(b, 4);
            graph_frame(1, &[3], &[a, bb, sum])
        }),
        ("BUFFER_GET_BASE of an unknown handle", true, |b| {
            enc(Request::BufferGetBase {
                remote_ptr: b.handle ^ 1,
            })
        }),
        ("BUFFER_GET_BASE of handle 0", true, |_| {
            enc(Request::BufferGetBase { remote_ptr: 0 })
        }),
        ("FREE_BUFFER of an unknown handle", true, |b| {
            enc(Request::FreeBuffer {
                remote_ptr: b.handle.wrapping_add(4096),
            })
        }),
        ("BUFFER_CLEAR of an unknown handle", true, |b| {
            enc(Request::BufferClear {
                remote_ptr: !b.handle,
                value: 0,
            })
        }),
        ("FREE_BUFFER twice", true, |b| {
            let mut v = enc(Request::FreeBuffer {
                remote_ptr: b.handle,
            });
            v.extend(enc(Request::FreeBuffer {
                remote_ptr: b.handle,
            }));
            v
        }),
        ("SET_TENSOR into a freed buffer", true, |b| {
            let mut v = enc(Request::FreeBuffer {
                remote_ptr: b.handle,
            });
            v.extend(set_frame(&b.f32(1, &[4], 0).build(), 0, &[0; 16]));
            v
        }),
        ("SET_TENSOR with an unknown buffer handle", true, |b| {
            let t = TensorBuilder::f32(1)
                .ne(&[4])
                .data(b.handle ^ 0x10, b.base)
                .build();
            set_frame(&t, 0, &[0; 16])
        }),
        (
            "SET_TENSOR without a buffer (buffer 0, data set)",
            true,
            |b| {
                let t = TensorBuilder::f32(1).ne(&[4]).data(0, b.base).build();
                set_frame(&t, 0, &[0; 16])
            },
        ),
        (
            "SET_TENSOR without a buffer (buffer 0, data 0)",
            true,
            |_| set_frame(&TensorBuilder::f32(1).ne(&[4]).build(), 0, &[0; 16]),
        ),
        ("GET_TENSOR without a buffer", true, |_| {
            get_frame(&TensorBuilder::f32(1).ne(&[4]).build(), 0, 16)
        }),
        ("COPY_TENSOR from a tensor without a buffer", true, |b| {
            enc(Request::CopyTensor {
                src: TensorBuilder::f32(1).ne(&[4]).build(),
                dst: b.f32(2, &[4], 0).build(),
            })
        }),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_data_regions() {
    // GET_TENSOR: the region [data + offset, + size) must lie inside the buffer (§9).
    check_all_rejected(&[
        ("GET_TENSOR past the end", true, |b| {
            get_frame(&b.f32(1, &[16], b.size - 32).build(), 0, 64)
        }),
        ("GET_TENSOR with an offset past the end", true, |b| {
            get_frame(&b.f32(1, &[16], 0).build(), b.size, 4)
        }),
        ("GET_TENSOR of size buffer+1", true, |b| {
            get_frame(&b.f32(1, &[16], 0).build(), 0, b.size + 1)
        }),
        ("GET_TENSOR of size u64::MAX", true, |b| {
            get_frame(&b.f32(1, &[16], 0).build(), 0, u64::MAX)
        }),
        ("GET_TENSOR with a wrapping offset", true, |b| {
            get_frame(&b.f32(1, &[16], 64).build(), u64::MAX - 63, 16)
        }),
        ("GET_TENSOR with data before the base", true, |b| {
            let t = TensorBuilder::f32(1)
                .ne(&[16])
                .data(b.handle, b.base - 4)
                .build();
            get_frame(&t, 0, 4)
        }),
        (
            "GET_TENSOR of a tensor extending past its buffer",
            true,
            |b| {
                // The access is in bounds, the tensor's own extent is not (stock: deserialize_tensor).
                get_frame(&b.f32(1, &[2048], 0).build(), 0, 4)
            },
        ),
        // SET_TENSOR, both server paths (< 64 KiB buffered, >= 64 KiB streamed).
        ("SET_TENSOR past the end", true, |b| {
            set_frame(&b.f32(1, &[16], b.size - 32).build(), 0, &[1; 64])
        }),
        ("SET_TENSOR with an offset past the end", true, |b| {
            set_frame(&b.f32(1, &[16], 0).build(), b.size - 8, &[1; 16])
        }),
        ("SET_TENSOR with a wrapping offset", true, |b| {
            set_frame(&b.f32(1, &[16], 64).build(), u64::MAX - 31, &[1; 16])
        }),
        ("SET_TENSOR with data at the buffer end", true, |b| {
            let t = TensorBuilder::f32(1)
                .ne(&[1])
                .data(b.handle, b.base + b.size)
                .build();
            set_frame(&t, 0, &[1; 4])
        }),
        (
            "SET_TENSOR streamed (100 KiB) into a 4 KiB buffer",
            true,
            |b| set_frame(&b.f32(1, &[16], 0).build(), 0, &vec![1; 100 << 10]),
        ),
        (
            "SET_TENSOR of a tensor extending past its buffer",
            true,
            |b| set_frame(&b.f32(1, &[2048], 0).build(), 0, &[1; 4]),
        ),
        // MEMSET_TENSOR: within the tensor and the buffer.
        ("MEMSET_TENSOR past the tensor", true, |b| {
            enc(Request::MemsetTensor {
                tensor: b.f32(1, &[16], 0).build(),
                offset: 0,
                size: 65,
                value: 0,
            })
        }),
        ("MEMSET_TENSOR with a wrapping offset", true, |b| {
            enc(Request::MemsetTensor {
                tensor: b.f32(1, &[16], 0).build(),
                offset: u64::MAX,
                size: 2,
                value: 0,
            })
        }),
        // COPY_TENSOR: nbytes(src) must fit in dst's buffer from dst.data (§9).
        (
            "COPY_TENSOR overflowing the destination buffer",
            true,
            |b| {
                enc(Request::CopyTensor {
                    src: b.f32(1, &[1024], 0).build(),
                    dst: b.f32(2, &[16], 64).build(),
                })
            },
        ),
        // Tensors whose extent overflows.
        ("SET_TENSOR with huge strides", true, |b| {
            let t = b.f32(1, &[2, 2], 0).nb([4, u32::MAX, 0, 0]).build();
            set_frame(&t, 0, &[1; 4])
        }),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_types() {
    for ty in [4u32, 5, 31, 36, 43, 255, u32::MAX] {
        check_rejected(&format!("SET_TENSOR of type {ty}"), true, |b| {
            let t = TensorBuilder::new(1, ty)
                .ne(&[4])
                .data(b.handle, b.base)
                .build();
            set_frame(&t, 0, &[0; 4])
        })
        .await;
    }
    check_all_rejected(&[
        ("INIT_TENSOR of type 4", true, |b| {
            enc(Request::InitTensor {
                tensor: TensorBuilder::new(1, 4)
                    .ne(&[4])
                    .data(b.handle, b.base)
                    .build(),
            })
        }),
        ("GET_ALLOC_SIZE of type 4", true, |_| {
            enc(Request::GetAllocSize {
                device: 0,
                tensor: TensorBuilder::new(1, 4).ne(&[4]).build(),
                srcs: Box::new([RpcTensor::default(); 10]),
            })
        }),
        ("GRAPH_COMPUTE with a source of type 4", true, |b| {
            let (a, bb, sum) = add_graph(b, 4);
            let mut bad = a;
            bad.r#type.set(types::REMOVED_Q4_2);
            graph_frame(0, &[3], &[bad, bb, sum])
        }),
        // Q4_0 (type 2) has blocks of 32: ne[0] = 31 is not a whole number of blocks (issue #25288).
        ("SET_TENSOR of Q4_0 with ne[0] = 31", true, |b| {
            let t = TensorBuilder::new(1, types::Q4_0)
                .ne(&[31])
                .nb([18, 18, 18, 18])
                .data(b.handle, b.base)
                .build();
            set_frame(&t, 0, &[0; 18])
        }),
        ("GET_TENSOR of Q4_0 with ne[0] = 33", true, |b| {
            let t = TensorBuilder::new(1, types::Q4_0)
                .ne(&[33])
                .nb([18, 36, 36, 36])
                .data(b.handle, b.base)
                .build();
            get_frame(&t, 0, 18)
        }),
        (
            "GRAPH_COMPUTE with a Q4_0 source with ne[0] = 31",
            true,
            |b| {
                let q = TensorBuilder::new(1, types::Q4_0)
                    .ne(&[31])
                    .nb([18, 18, 18, 18])
                    .data(b.handle, b.base)
                    .build();
                let x = b.f32(2, &[31], 1024).build();
                let out = b
                    .f32(3, &[31], 2048)
                    .op(ops::ADD, &[])
                    .srcs(&[1, 2])
                    .flags(TENSOR_FLAG_COMPUTE)
                    .build();
                graph_frame(0, &[3], &[q, x, out])
            },
        ),
        ("GET_ALLOC_SIZE of Q4_0 with ne[0] = 31", true, |_| {
            enc(Request::GetAllocSize {
                device: 0,
                tensor: TensorBuilder::new(1, types::Q4_0)
                    .ne(&[31])
                    .nb([18, 18, 18, 18])
                    .build(),
                srcs: Box::new([RpcTensor::default(); 10]),
            })
        }),
    ])
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_graphs() {
    type Mutate = fn(&mut [RpcTensor; 3], &mut Vec<u64>);
    let cases: Vec<(&str, Mutate)> = vec![
        ("a source id that is not in the graph", |t, _| {
            t[2].src[1].set(99)
        }),
        ("a view_src id that is not in the graph", |t, _| {
            t[2].view_src.set(98)
        }),
        ("a node id that is not in the graph", |_, n| *n = vec![42]),
        ("node id 0", |_, n| *n = vec![0]),
        ("node id 0 after a valid node", |_, n| *n = vec![3, 0]),
        ("a cycle a -> c -> a", |t, _| {
            t[0].op.set(ops::ADD);
            t[0].src[0].set(3);
            t[0].src[1].set(2);
        }),
        ("a self-loop", |t, _| t[2].src[0].set(3)),
        ("a view_src self-loop", |t, _| t[2].view_src.set(3)),
        ("GGML_OP_CUSTOM (95) on the node", |t, _| {
            t[2].op.set(ops::CUSTOM)
        }),
        ("GGML_OP_MAP_CUSTOM1 (92) on the node", |t, _| {
            t[2].op.set(ops::MAP_CUSTOM1)
        }),
        ("GGML_OP_MAP_CUSTOM2 (93) on the node", |t, _| {
            t[2].op.set(ops::MAP_CUSTOM2)
        }),
        ("GGML_OP_MAP_CUSTOM3 (94) on the node", |t, _| {
            t[2].op.set(ops::MAP_CUSTOM3)
        }),
        ("GGML_OP_CUSTOM (95) on a source", |t, _| {
            t[0].op.set(ops::CUSTOM)
        }),
        ("op 101 (GGML_OP_COUNT)", |t, _| t[2].op.set(ops::COUNT)),
        ("op 200", |t, _| t[2].op.set(200)),
        ("op u32::MAX", |t, _| t[2].op.set(u32::MAX)),
        ("a source of type 4", |t, _| t[1].r#type.set(4)),
        ("a tensor with data but no buffer", |t, _| {
            t[0].buffer.set(0)
        }),
        ("a tensor outside its buffer", |t, _| {
            t[1].data.set(t[1].data.get() + (1 << 20))
        }),
        ("a tensor in an unknown buffer", |t, _| {
            t[1].buffer.set(t[1].buffer.get() ^ 0x100)
        }),
    ];
    for (name, mutate) in cases {
        check_rejected(&format!("GRAPH_COMPUTE with {name}"), true, |b| {
            let (a, bb, sum) = add_graph(b, 4);
            let mut t = [a, bb, sum];
            let mut nodes = vec![3u64];
            mutate(&mut t, &mut nodes);
            graph_frame(0, &nodes, &t)
        })
        .await;
    }
    // The same cycle check must not be fooled by a long chain (no recursion, no stack overflow):
    // 100,000 ADD nodes, each adding the previous result to a leaf, is a valid graph on a 1 MiB
    // buffer only if it fits; here every node writes the same 16 bytes, which is allowed, and
    // the chain ends in a cycle back to the first node.
    check_rejected(
        "GRAPH_COMPUTE with a 100,000-long chain closing a cycle",
        true,
        |b| {
            let n: u64 = 100_000;
            let leaf = b.f32(n + 1, &[4], 0).build();
            let mut tensors = vec![leaf];
            for i in 1..=n {
                let prev = if i == 1 { n } else { i - 1 };
                tensors.push(
                    b.f32(i, &[4], 16)
                        .op(ops::ADD, &[])
                        .srcs(&[prev, n + 1])
                        .flags(TENSOR_FLAG_COMPUTE)
                        .build(),
                );
            }
            graph_frame(0, &[n], &tensors)
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_valid_chain_is_computed_without_recursion() {
    // 20,000 chained ADD nodes x_i = x_{i-1} + one, sources listed before users. The stock
    // server builds nodes recursively (crash hazard, §14); a replacement must cope.
    let s = shared_server();
    let mut c = connect(s.addr).await;
    let n: u64 = 20_000;
    let buf = alloc(&mut c, (n + 2) * 16).await;
    let one = buf.f32(n + 1, &[4], 0).build();
    let x0 = buf.f32(n + 2, &[4], 16).build();
    let mut tensors = vec![one, x0];
    let mut nodes = Vec::new();
    for i in 1..=n {
        let prev = if i == 1 { n + 2 } else { i - 1 };
        tensors.push(
            buf.f32(i, &[4], 16 + 16 * i)
                .op(ops::ADD, &[])
                .srcs(&[prev, n + 1])
                .flags(TENSOR_FLAG_COMPUTE)
                .build(),
        );
        nodes.push(i);
    }
    set_f32(&mut c, &one, &[1.0; 4]).await;
    set_f32(&mut c, &x0, &[0.5; 4]).await;
    c.graph_compute(0, &nodes, &tensors).await.unwrap();
    let last = tensors.last().copied().unwrap();
    let got = within("deep chain", c.get_tensor(&last, 0, 16))
        .await
        .unwrap();
    assert_eq!(bytes_f32(&got), [n as f32 + 0.5; 4]);
}

// ---------------------------------------------------------------------------------------------
// Graphs that are well-formed on the wire but semantically invalid (spec §14: "No
// shape/semantic validation of graph nodes"). ggml's CPU kernels GGML_ASSERT on them, which
// aborts the process, so these run against a server in a child process.
// ---------------------------------------------------------------------------------------------

/// Helper for [`ChildServer`]: serves only when started as a child (see `child_server_main`).
#[test]
#[ignore = "helper: the server process of the child-process tests"]
fn child_server() {
    child_server_main();
}

/// Sends one GRAPH_COMPUTE built by `make` (optionally after SET_TENSORs of `inputs`) to a
/// child-process server, then checks that the server process survived and still serves.
/// Whether the victim connection is closed or the graph computed is left open: a server may
/// reject the graph or compute garbage, but it must not die.
async fn check_survives(
    name: &str,
    make: impl FnOnce(&Buf) -> (Vec<u64>, Vec<RpcTensor>, Vec<(RpcTensor, Vec<u8>)>),
) {
    let mut server = ChildServer::start("child_server");
    let mut c = connect(server.addr).await;
    let buf = alloc(&mut c, VICTIM_BUFFER).await;
    let (nodes, tensors, inputs) = make(&buf);
    for (t, data) in &inputs {
        c.set_tensor(t, 0, data, false).await.unwrap();
    }
    let _ = c.graph_compute(0, &nodes, &tensors).await;
    // A round trip: answered if the graph was run or ignored, closed if it was refused.
    let _ = within(name, c.device_count()).await;
    server.assert_alive(name);
    assert_healthy(server.addr).await;
    server.assert_alive(name);
}

fn node(b: &Buf, id: u64, ty: u32, ne: &[u32], off: u64, op: u32, srcs: &[u64]) -> RpcTensor {
    TensorBuilder::new(id, ty)
        .ne(ne)
        .data(b.handle, b.at(off))
        .op(op, &[])
        .srcs(srcs)
        .flags(TENSOR_FLAG_COMPUTE)
        .build()
}

/// A graph that is well-formed on the wire but semantically invalid: its name, and what to send
/// (node ids, tensors, and the inputs to set first) in the victim's buffer.
type Semantic = (
    &'static str,
    fn(&Buf) -> (Vec<u64>, Vec<RpcTensor>, Vec<(RpcTensor, Vec<u8>)>),
);

/// Each case against a server of its own (a child process), in order: the server survives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semantically_invalid_graphs_do_not_kill_the_server() {
    let cases: &[Semantic] = &[
        ("ADD of [4] and [8]", |b| {
            let a = b.f32(1, &[4], 0).build();
            let x = b.f32(2, &[8], 64).build();
            let c = node(b, 3, types::F32, &[4], 128, ops::ADD, &[1, 2]);
            (vec![3], vec![a, x, c], vec![])
        }),
        ("ADD of [4] and [4] into [8]", |b| {
            let a = b.f32(1, &[4], 0).build();
            let x = b.f32(2, &[4], 64).build();
            let c = node(b, 3, types::F32, &[8], 128, ops::ADD, &[1, 2]);
            (vec![3], vec![a, x, c], vec![])
        }),
        ("MUL_MAT [4,3] x [4,2] into [5,2]", |b| {
            let a = b.f32(1, &[4, 3], 0).build();
            let x = b.f32(2, &[4, 2], 256).build();
            let c = node(b, 3, types::F32, &[5, 2], 512, ops::MUL_MAT, &[1, 2]);
            (vec![3], vec![a, x, c], vec![])
        }),
        ("MUL_MAT [4,3] x [8,2] into [3,2]", |b| {
            let a = b.f32(1, &[4, 3], 0).build();
            let x = b.f32(2, &[8, 2], 256).build();
            let c = node(b, 3, types::F32, &[3, 2], 512, ops::MUL_MAT, &[1, 2]);
            (vec![3], vec![a, x, c], vec![])
        }),
        ("ADD of I32 tensors", |b| {
            let a = TensorBuilder::i32(1)
                .ne(&[4])
                .data(b.handle, b.at(0))
                .build();
            let x = TensorBuilder::i32(2)
                .ne(&[4])
                .data(b.handle, b.at(64))
                .build();
            let c = node(b, 3, types::I32, &[4], 128, ops::ADD, &[1, 2]);
            (vec![3], vec![a, x, c], vec![])
        }),
        ("ADD without sources", |b| {
            let c = node(b, 3, types::F32, &[4], 128, ops::ADD, &[]);
            (vec![3], vec![c], vec![])
        }),
        ("UNARY with kind 1000", |b| {
            let a = b.f32(1, &[4], 0).build();
            let c = TensorBuilder::f32(3)
                .ne(&[4])
                .data(b.handle, b.at(128))
                .op(91, &[1000])
                .srcs(&[1])
                .flags(TENSOR_FLAG_COMPUTE)
                .build();
            (vec![3], vec![a, c], vec![])
        }),
        ("CPY of [4] into [8]", |b| {
            let a = b.f32(1, &[4], 0).build();
            let c = node(b, 3, types::F32, &[8], 128, ops::CPY, &[1]);
            (vec![3], vec![a, c], vec![])
        }),
        ("GET_ROWS with index 1000 of 2 rows", |b| {
            let rows = b.f32(1, &[4, 2], 0).build();
            let idx = TensorBuilder::i32(2)
                .ne(&[1])
                .data(b.handle, b.at(64))
                .build();
            let c = node(b, 3, types::F32, &[4, 1], 128, ops::GET_ROWS, &[1, 2]);
            (
                vec![3],
                vec![rows, idx, c],
                vec![(idx, 1000i32.to_le_bytes().to_vec())],
            )
        }),
    ];
    for &(name, make) in cases {
        check_survives(name, make).await;
    }
}
