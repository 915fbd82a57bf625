//! Protocol 8.0.0 against an in-process `rpc-server` that also serves 7.0.0 (one server, a
//! listener per major): HELLO bytes per port, the graph cache's stock rules (delta §B.1), the
//! strided copies and their bounds (§B.3), the collectives' answers without a communicator (§C),
//! and 8.0 commands refused on the 7.0 port. References (§) are to
//! `ggml-rpc-protocol-8.md`.

use rpc_client::{Client, CommInit, Major, Region2d, RpcTensor};
use rpc_proto::{Command, Request, GRAPH_CACHE_MAX};
use rpc_tests::*;

fn enc(req: Request<'_>) -> Vec<u8> {
    let mut v = Vec::new();
    req.encode(&mut v);
    v
}

/// A raw HELLO on `addr`: the reply's 36 bytes.
async fn raw_hello(addr: std::net::SocketAddr) -> Vec<u8> {
    let mut c = within("connect", Client::connect_raw(addr)).await.unwrap();
    c.send_bytes(&enc(Request::Hello { caps: [0; 24] }))
        .await
        .unwrap();
    within("HELLO reply", c.recv_raw(36)).await.unwrap()
}

#[tokio::test]
async fn each_port_speaks_its_major() {
    let s = shared_server();
    for (addr, major) in [(s.addr8, 8u8), (s.addr, 7)] {
        let r = raw_hello(addr).await;
        // §A: | u64 28 | major | 0 | 0 | pad | caps[24] |
        let mut want = vec![28, 0, 0, 0, 0, 0, 0, 0, major, 0, 0, 0];
        want.extend([0; 24]);
        assert_eq!(r, want, "HELLO reply on the {major}.0.0 port");
    }
    let c8 = connect(s.addr8).await;
    assert_eq!(c8.major(), Major::V8);
    let c7 = connect(s.addr).await;
    assert_eq!(c7.major(), Major::V7);
}

/// `a + b` over 16 values with `a` and `b` set; the graph's tensors.
async fn add_setup(c: &mut Client) -> (Buf, [RpcTensor; 3]) {
    let buf = alloc(c, 3 * 64).await;
    let (a, b, sum) = add_graph(&buf, 16);
    let av: Vec<f32> = (0..16).map(|i| i as f32).collect();
    let bv: Vec<f32> = (0..16).map(|i| 100.0 * i as f32).collect();
    c.set_tensor(&a, 0, &f32_bytes(&av), false).await.unwrap();
    c.set_tensor(&b, 0, &f32_bytes(&bv), false).await.unwrap();
    (buf, [a, b, sum])
}

async fn sum_of(c: &mut Client, sum: &RpcTensor) -> Vec<f32> {
    bytes_f32(&c.get_tensor(sum, 0, 64).await.unwrap())
}

#[tokio::test]
async fn graphs_are_kept_per_uid_and_recomputed() {
    within("uid cache", async {
        let mut c = connect(shared_server().addr8).await;
        let (_buf, [a, b, sum]) = add_setup(&mut c).await;
        c.graph_compute_uid(0, 21, &[3], &[a, b, sum])
            .await
            .unwrap();
        assert_eq!(sum_of(&mut c, &sum).await[5], 505.0);
        // New inputs, then the stored graph by its uid.
        c.set_tensor(&a, 0, &f32_bytes(&[1.0; 16]), false)
            .await
            .unwrap();
        c.graph_recompute_uid(0, 21).await.unwrap();
        assert_eq!(sum_of(&mut c, &sum).await[5], 501.0);
        // uid 0 runs without being stored.
        c.set_tensor(&a, 0, &f32_bytes(&[2.0; 16]), false)
            .await
            .unwrap();
        c.graph_compute_uid(0, 0, &[3], &[a, b, sum]).await.unwrap();
        assert_eq!(sum_of(&mut c, &sum).await[5], 502.0);
        // uid 21 is still there beside it.
        c.graph_recompute_uid(0, 21).await.unwrap();
        assert_eq!(sum_of(&mut c, &sum).await[5], 502.0);
    })
    .await;
}

/// §B.1 (run): each of these closes the connection on the stock server, so on ours.
#[tokio::test]
async fn recompute_misses_close_like_stock() {
    within("misses", async {
        let addr = shared_server().addr8;
        // An unknown uid.
        let mut c = connect(addr).await;
        let (_buf, [a, b, sum]) = add_setup(&mut c).await;
        c.graph_compute_uid(0, 5, &[3], &[a, b, sum]).await.unwrap();
        c.graph_recompute_uid(0, 6).await.unwrap();
        assert_closed(c.device_count().await, "RECOMPUTE of an unknown uid");
        // uid 0 after a uid-0 compute.
        let mut c = connect(addr).await;
        let (_buf, [a, b, sum]) = add_setup(&mut c).await;
        c.graph_compute_uid(0, 0, &[3], &[a, b, sum]).await.unwrap();
        c.graph_recompute_uid(0, 0).await.unwrap();
        assert_closed(c.device_count().await, "RECOMPUTE of uid 0");
        // Any FREE_BUFFER drops every stored graph, even one that does not use the buffer.
        let mut c = connect(addr).await;
        let (_buf, [a, b, sum]) = add_setup(&mut c).await;
        let other = alloc(&mut c, 64).await;
        c.graph_compute_uid(0, 9, &[3], &[a, b, sum]).await.unwrap();
        c.free_buffer(other.handle).await.unwrap();
        c.graph_recompute_uid(0, 9).await.unwrap();
        assert_closed(c.device_count().await, "RECOMPUTE after FREE_BUFFER");
        // A 7.0-sized (4-byte) GRAPH_RECOMPUTE is malformed on the 8.0 port.
        let mut c = connect(addr).await;
        c.send_bytes(&frame(Command::GraphRecompute as u8, &[0; 4]))
            .await
            .unwrap();
        expect_closed(&mut c, "4-byte GRAPH_RECOMPUTE on 8.0").await;
    })
    .await;
}

/// §B.1 (run): with 1024 uids stored an early one still recomputes; the 1025th distinct uid
/// clears the device's graphs, after which the early uid is a miss and the new one is kept.
#[tokio::test]
async fn the_1025th_uid_clears_the_device() {
    within("1025 uids", async {
        let mut c = connect(shared_server().addr8).await;
        let (_buf, [a, b, sum]) = add_setup(&mut c).await;
        for uid in 1..=GRAPH_CACHE_MAX as u64 {
            c.graph_compute_uid(0, uid, &[3], &[a, b, sum])
                .await
                .unwrap();
        }
        c.set_tensor(&a, 0, &f32_bytes(&[7.0; 16]), false)
            .await
            .unwrap();
        c.graph_recompute_uid(0, 7).await.unwrap();
        assert_eq!(sum_of(&mut c, &sum).await[1], 107.0);
        c.graph_compute_uid(0, 5000, &[3], &[a, b, sum])
            .await
            .unwrap();
        c.graph_recompute_uid(0, 5000).await.unwrap();
        assert_eq!(sum_of(&mut c, &sum).await[1], 107.0);
        c.graph_recompute_uid(0, 7).await.unwrap();
        assert_closed(c.device_count().await, "RECOMPUTE of a uid cleared at 1025");
    })
    .await;
}

/// A U8 tensor of `n` bytes at `offset` of `buf`.
fn bytes_tensor(buf: &Buf, id: u64, n: u32, offset: u64) -> RpcTensor {
    rpc_client::TensorBuilder::new(id, rpc_client::types::I8)
        .ne(&[n])
        .data(buf.handle, buf.at(offset))
        .build()
}

fn region(offset: u64, size: u64, n_copies: u64, stride: u64) -> Region2d {
    Region2d {
        offset,
        size,
        n_copies,
        stride,
    }
}

/// §B.3 (run): the stock server's probe results, byte for byte.
#[tokio::test]
async fn strided_copies_match_the_stock_probe() {
    within("2d copies", async {
        let mut c = connect(shared_server().addr8).await;
        let buf = alloc(&mut c, 64).await;
        let t = bytes_tensor(&buf, 1, 32, 0);
        c.set_tensor(&t, 0, &[0; 32], false).await.unwrap();
        let data: Vec<u8> = (1..=8).chain(11..=18).collect();
        c.set_tensor_2d(&t, region(0, 8, 2, 16), &data)
            .await
            .unwrap();
        let mut want = vec![0u8; 32];
        want[..8].copy_from_slice(&data[..8]);
        want[16..24].copy_from_slice(&data[8..]);
        assert_eq!(c.get_tensor(&t, 0, 32).await.unwrap(), want);
        assert_eq!(
            c.get_tensor_2d(&t, region(0, 8, 2, 16)).await.unwrap(),
            data
        );
        assert_eq!(
            c.get_tensor_2d(&t, region(4, 4, 2, 16)).await.unwrap(),
            [5, 6, 7, 8, 15, 16, 17, 18]
        );
        // stride 0 is legal: the same chunk n times.
        assert_eq!(
            c.get_tensor_2d(&t, region(0, 2, 3, 0)).await.unwrap(),
            [1, 2, 1, 2, 1, 2]
        );
        // Overlapping chunks (stride < size) are written in order, the later one winning.
        c.set_tensor_2d(&t, region(0, 4, 2, 2), &[9, 9, 9, 9, 7, 7, 7, 7])
            .await
            .unwrap();
        assert_eq!(
            c.get_tensor(&t, 0, 8).await.unwrap(),
            [9, 9, 7, 7, 7, 7, 7, 8]
        );
        // A span that ends exactly at the tensor's end is fine.
        c.set_tensor_2d(&t, region(24, 4, 2, 4), &[1; 8])
            .await
            .unwrap();
        assert_eq!(c.device_count().await.unwrap(), 1);
    })
    .await;
}

/// §B.3: every bound the stock server checks closes the connection before a byte is copied;
/// and what stock does not bound (a reply of `size · n_copies` with stride 0, which it would try
/// to allocate) is bounded here by the tensor's size.
#[tokio::test]
async fn strided_copies_out_of_bounds_close() {
    within("2d bounds", async {
        let addr = shared_server().addr8;
        // A tensor of 32 bytes at offset 0 of a 64-byte buffer, a second buffer behind it.
        type Attack = fn(RpcTensor) -> Vec<u8>;
        let cases: Vec<(&str, Attack)> = vec![
            ("SET span past the tensor (inside the buffer)", |t| {
                enc(Request::SetTensor2d {
                    tensor: t,
                    region: region(0, 8, 2, 25),
                    data: &[0; 16],
                })
            }),
            ("GET offset past the tensor", |t| {
                enc(Request::GetTensor2d {
                    tensor: t,
                    region: region(33, 1, 1, 0),
                })
            }),
            ("GET span overflowing u64", |t| {
                enc(Request::GetTensor2d {
                    tensor: t,
                    region: region(0, 1, 3, u64::MAX / 2),
                })
            }),
            ("GET size × n_copies overflowing u64 (stride 0)", |t| {
                enc(Request::GetTensor2d {
                    tensor: t,
                    region: region(0, 1 << 33, 1 << 33, 0),
                })
            }),
            (
                "GET of 1 TiB repeating one chunk (stride 0): larger than the tensor",
                |t| {
                    enc(Request::GetTensor2d {
                        tensor: t,
                        region: region(0, 32, 1 << 35, 0),
                    })
                },
            ),
            ("GET with n_copies 0", |t| {
                enc(Request::GetTensor2d {
                    tensor: t,
                    region: region(0, 4, 0, 4),
                })
            }),
            ("SET whose data is not size × n_copies", |t| {
                let mut f = enc(Request::SetTensor2d {
                    tensor: t,
                    region: region(0, 4, 2, 4),
                    data: &[0; 8],
                });
                f.pop();
                let n = f.len() as u64 - 9;
                f[1..9].copy_from_slice(&n.to_le_bytes());
                f
            }),
        ];
        for (what, make) in &cases {
            let mut c = connect(addr).await;
            let buf = alloc(&mut c, 64).await;
            let _other = alloc(&mut c, 64).await;
            let t = bytes_tensor(&buf, 1, 32, 0);
            c.send_bytes(&make(t)).await.unwrap();
            expect_closed(&mut c, what).await;
        }
        // The tensor claims to extend past its buffer: refused as a tensor.
        let mut c = connect(addr).await;
        let buf = alloc(&mut c, 64).await;
        let t = bytes_tensor(&buf, 1, buf.size as u32 + 64, 0);
        c.send_bytes(&enc(Request::GetTensor2d {
            tensor: t,
            region: region(0, 8, 2, 64),
        }))
        .await
        .unwrap();
        expect_closed(&mut c, "a tensor reaching into the next buffer").await;
        assert_healthy(addr).await;
    })
    .await;
}

/// §C: without collectives a server must answer COMM_INIT with 0 (closing would make the
/// stock client abort), refuse COMM_ALLREDUCE (no communicator) and accept COMM_FREE.
#[tokio::test]
async fn collectives_without_a_communicator() {
    within("comm", async {
        let addr = shared_server().addr8;
        let init = |device, rank, world| CommInit {
            device,
            rank,
            world,
            port: 1,
            host: CommInit::host_field("127.0.0.1").unwrap(),
        };
        let mut c = connect(addr).await;
        for (i, what) in [
            (init(7, 0, 2), "a device that does not exist"),
            (init(0, 0, 3), "world 3"),
            (init(0, 2, 2), "rank 2 of 2"),
        ] {
            assert!(!c.comm_init(i).await.unwrap(), "{what}");
        }
        // COMM_FREE with no communicator is fine.
        c.comm_free(0).await.unwrap();
        assert_eq!(c.device_count().await.unwrap(), 1);
        // COMM_ALLREDUCE without a communicator closes (stock: "no communicator").
        let buf = alloc(&mut c, 64).await;
        let t = buf.f32(1, &[16], 0).build();
        c.comm_allreduce(0, &t).await.unwrap();
        assert_closed(c.device_count().await, "COMM_ALLREDUCE without COMM_INIT");
        // COMM_FREE of a device that does not exist closes.
        let mut c = connect(addr).await;
        c.comm_free(9).await.unwrap();
        assert_closed(c.device_count().await, "COMM_FREE of device 9");
    })
    .await;
}

/// The 8.0 commands (and 8.0-sized frames) are not commands on the 7.0.0 port.
#[tokio::test]
async fn v8_commands_close_on_the_v7_port() {
    within("v8 on v7", async {
        let addr = shared_server().addr;
        for cmd in 18..=22u8 {
            let mut c = connect(addr).await;
            c.send_bytes(&frame(cmd, &[0; 4])).await.unwrap();
            expect_closed(&mut c, &format!("command {cmd} on the 7.0 port")).await;
        }
        // A 12-byte GRAPH_RECOMPUTE is malformed in 7.0.
        let mut c = connect(addr).await;
        c.send_bytes(&frame(Command::GraphRecompute as u8, &[0; 12]))
            .await
            .unwrap();
        expect_closed(&mut c, "12-byte GRAPH_RECOMPUTE on 7.0").await;
        // RPC_CMD_NONE of 8.0 (23) on the 8.0 port.
        let mut c = connect(shared_server().addr8).await;
        c.send_bytes(&frame(rpc_proto::Major::V8.cmd_none(), &[]))
            .await
            .unwrap();
        expect_closed(&mut c, "command 23 on the 8.0 port").await;
    })
    .await;
}

/// llama.cpp 8.0's input selection (`ggml_build_forward_select`, its mixed token/embedding
/// input) sends every branch but sets the COMPUTE flag only on the selected one; the others hold
/// whatever the client left in their inputs (row ids of a SET_ROWS included). No ggml backend
/// runs a node without the flag, so neither do we, nor do we check its indices: the graph runs,
/// the unselected SET_ROWS writes nothing, the selected ADD runs. A flagged SET_ROWS with the
/// same ids still closes the connection.
#[tokio::test]
async fn unselected_branches_are_not_run() {
    use rpc_client::{ops, types, TensorBuilder, TENSOR_FLAG_COMPUTE};
    within("select", async {
        for flagged in [false, true] {
            let mut c = connect(shared_server().addr8).await;
            let buf = alloc(&mut c, 4096).await;
            let (a, b, sum) = add_graph(&buf, 16);
            // dst: 8 rows of 4 f32 at 512; values: 2 rows at 768; ids: 2 × I64 at 1024.
            let dst = buf.f32(10, &[4, 8], 512).name("dst").build();
            let vals = buf.f32(11, &[4, 2], 768).name("vals").build();
            let ids = TensorBuilder::new(12, types::I64)
                .ne(&[2])
                .data(buf.handle, buf.at(1024))
                .name("ids")
                .build();
            let rows = buf
                .f32(13, &[4, 8], 512)
                .op(ops::SET_ROWS, &[])
                .srcs(&[11, 12, 10])
                .view(10, 0)
                .flags(if flagged { TENSOR_FLAG_COMPUTE } else { 0 })
                .name("rows")
                .build();
            c.set_tensor(&a, 0, &f32_bytes(&[1.0; 16]), false)
                .await
                .unwrap();
            c.set_tensor(&b, 0, &f32_bytes(&[2.0; 16]), false)
                .await
                .unwrap();
            c.set_tensor(&dst, 0, &f32_bytes(&[5.0; 32]), false)
                .await
                .unwrap();
            c.set_tensor(&vals, 0, &f32_bytes(&[9.0; 8]), false)
                .await
                .unwrap();
            let garbage: Vec<u8> = [0x0000_0001_0000_0001i64, -3]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            c.set_tensor(&ids, 0, &garbage, false).await.unwrap();
            c.graph_compute_uid(0, 0, &[13, 3], &[a, b, sum, dst, vals, ids, rows])
                .await
                .unwrap();
            if flagged {
                assert_closed(c.device_count().await, "flagged SET_ROWS with bad ids");
                continue;
            }
            assert_eq!(
                bytes_f32(&c.get_tensor(&sum, 0, 64).await.unwrap()),
                [3.0; 16]
            );
            assert_eq!(
                bytes_f32(&c.get_tensor(&dst, 0, 128).await.unwrap()),
                [5.0; 32],
                "the unselected SET_ROWS wrote"
            );
        }
    })
    .await;
}

/// A pair of in-process servers joined by COMM_INIT as the stock client does it (both requests
/// out before either answer: rank 0 waits in accept for rank 1), for `n` F32 values each.
async fn comm_pair(n: u32) -> (TestServer, TestServer, [(Client, RpcTensor); 2]) {
    let (s0, s1) = (TestServer::start(), TestServer::start());
    let (mut c0, mut c1) = (connect(s0.addr8).await, connect(s1.addr8).await);
    let (ok0, ok1) = join_pair(&mut c0, &mut c1, s0.addr8.port()).await;
    assert!(ok0 && ok1, "both ranks joined");
    let side = |c: Client| async move {
        let mut c = c;
        let buf = alloc(&mut c, u64::from(n) * 4).await;
        let t = buf.f32(1, &[n], 0).build();
        (c, t)
    };
    let a = side(c0).await;
    let b = side(c1).await;
    (s0, s1, [a, b])
}

fn bf16_round(x: f32) -> f32 {
    // ggml's fp32 → bf16 (round to nearest even), back to f32.
    let u = x.to_bits();
    f32::from_bits(((u + (0x7fff + ((u >> 16) & 1))) >> 16) << 16)
}

/// §C between two of our servers: small partials summed exactly on both ranks; 32768 elements
/// and more cross as bf16, each rank adding the peer's rounded partial to its own; COMM_FREE
/// ends the communicator (a later COMM_ALLREDUCE closes).
#[tokio::test]
async fn allreduce_between_two_servers() {
    within("allreduce", async {
        for n in [256u32, 32768] {
            let (s0, s1, [(mut c0, t0), (mut c1, t1)]) = comm_pair(n).await;
            let x: Vec<f32> = (0..n).map(|i| 1.0 + i as f32 * 1e-3).collect();
            let y: Vec<f32> = (0..n).map(|i| 0.25 - i as f32 * 3e-4).collect();
            c0.set_tensor(&t0, 0, &f32_bytes(&x), false).await.unwrap();
            c1.set_tensor(&t1, 0, &f32_bytes(&y), false).await.unwrap();
            c0.comm_allreduce(0, &t0).await.unwrap();
            c1.comm_allreduce(0, &t1).await.unwrap();
            let r0 = bytes_f32(&c0.get_tensor(&t0, 0, u64::from(n) * 4).await.unwrap());
            let r1 = bytes_f32(&c1.get_tensor(&t1, 0, u64::from(n) * 4).await.unwrap());
            for i in 0..n as usize {
                if n < 32768 {
                    assert_eq!(r0[i], x[i] + y[i], "rank 0 [{i}]");
                    assert_eq!(r1[i].to_bits(), r0[i].to_bits(), "ranks agree [{i}]");
                } else {
                    assert_eq!(r0[i], x[i] + bf16_round(y[i]), "rank 0 [{i}] (bf16)");
                    assert_eq!(r1[i], y[i] + bf16_round(x[i]), "rank 1 [{i}] (bf16)");
                }
            }
            // The link's bytes are counted (`rpc_comm_*_bytes_total`): 4 bytes a value, 2 as bf16.
            let wire = u64::from(n) * if n < 32768 { 4 } else { 2 };
            let relaxed = std::sync::atomic::Ordering::Relaxed;
            for s in [&s0, &s1] {
                assert_eq!(s.stats.comm_sent.load(relaxed), wire);
                assert_eq!(s.stats.comm_received.load(relaxed), wire);
                assert_eq!(s.stats.allreduce.snapshot().count, 1);
            }
            c0.comm_free(0).await.unwrap();
            c0.comm_allreduce(0, &t0).await.unwrap();
            assert_closed(c0.device_count().await, "COMM_ALLREDUCE after COMM_FREE");
        }
    })
    .await;
}

/// A rank 0 whose peer never dials gives up within its deadline and answers 0 (stock would
/// wait forever, and its client with it); the connection stays usable.
#[tokio::test]
async fn a_peer_that_never_dials() {
    within("lonely rank 0", async {
        let s = TestServer::start();
        let port = s.addr8.port() + rpc_proto::COMM_PORT_OFFSET;
        let mut c = connect(s.addr8).await;
        let t = std::time::Instant::now();
        let ok = c
            .comm_init(CommInit {
                device: 0,
                rank: 0,
                world: 2,
                port: u32::from(port),
                host: [0; 64],
            })
            .await
            .unwrap();
        assert!(!ok);
        assert!(t.elapsed() < std::time::Duration::from_secs(15));
        assert_eq!(c.device_count().await.unwrap(), 1);
    })
    .await;
}

/// The server-side request forgery of a COMM_INIT (issue 31): a plain client names, as rank 0,
/// a loopback service on an allowed port, then allreduces a zeroed tensor to read the service's
/// bytes back. A service that greets first (SSH), one that answers our caps with an error line
/// (HTTP) and one that answers 24 bytes of text: COMM_INIT answers 0 before any partial
/// crosses, and the allreduce finds no communicator (the connection closes). The service got at
/// most our 24 zero caps bytes. With the default comm ports (within 100 of the server's own,
/// + 1000), a service elsewhere is never even dialed.
#[tokio::test]
async fn a_comm_init_naming_a_local_service_reads_nothing() {
    use std::io::{Read, Write};
    within("ssrf", async {
        let services: [(&str, &[u8], &[u8]); 3] = [
            ("ssh", b"SSH-2.0-OpenSSH_9.2p1 Debian-2+deb12u3\r\n", b""),
            (
                "http",
                b"",
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n",
            ),
            ("24 bytes of text", b"", b"-ERR unknown command zz\n"),
        ];
        for (what, greeting, answer) in services {
            let s = TestServer::start();
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let port = l.local_addr().unwrap().port();
            let (greeting, answer) = (greeting.to_vec(), answer.to_vec());
            let service = std::thread::spawn(move || {
                let (mut c, _) = l.accept().unwrap();
                let _ = c.write_all(&greeting);
                c.set_read_timeout(Some(std::time::Duration::from_secs(5)))
                    .unwrap();
                let mut got = Vec::new();
                let mut chunk = [0u8; 256];
                while let Ok(n) = c.read(&mut chunk) {
                    if n == 0 {
                        break;
                    }
                    got.extend_from_slice(&chunk[..n]);
                    if got.len() >= 24 {
                        let _ = c.write_all(&answer);
                        // A secret the attacker wants to read back.
                        let _ = c.write_all(&[0x5a; 64]);
                    }
                }
                got
            });
            let mut c = connect(s.addr8).await;
            let buf = alloc(&mut c, 64).await;
            let t = buf.f32(1, &[16], 0).build();
            let ok = c
                .comm_init(CommInit {
                    device: 0,
                    rank: 1,
                    world: 2,
                    port: u32::from(port),
                    host: CommInit::host_field("127.0.0.1").unwrap(),
                })
                .await
                .unwrap();
            assert!(!ok, "{what}: COMM_INIT answered 0");
            c.comm_allreduce(0, &t).await.unwrap();
            assert_closed(
                c.get_tensor(&t, 0, 64).await.map(|_| ()),
                "COMM_ALLREDUCE without a link",
            );
            let got = service.join().unwrap();
            assert!(
                got.iter().all(|&b| b == 0) && got.len() <= 24,
                "{what}: the service got {got:?}"
            );
        }
        // Default comm ports: a service far from the server's own port + 1000 is not dialed.
        let s = TestServer::start_with_options(rpc_server::options::ServerOptions {
            isolate: false,
            ..rpc_server::options::ServerOptions::default()
        });
        let far = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let far_port = far.local_addr().unwrap().port();
        if far_port.abs_diff(s.addr8.port() + rpc_proto::COMM_PORT_OFFSET) > 100 {
            far.set_nonblocking(true).unwrap();
            let mut c = connect(s.addr8).await;
            let ok = c
                .comm_init(CommInit {
                    device: 0,
                    rank: 1,
                    world: 2,
                    port: u32::from(far_port),
                    host: CommInit::host_field("127.0.0.1").unwrap(),
                })
                .await
                .unwrap();
            assert!(!ok);
            assert!(far.accept().is_err(), "the service was never dialed");
            assert_eq!(c.device_count().await.unwrap(), 1);
        }
    })
    .await;
}

/// A node whose result has no element (a batch of 0 rows: `llama-server` sends such graphs, with
/// both majors) is skipped by every ggml backend; its strides collapse to 0 (`nb[2] = nb[1]·0`),
/// which no rule may refuse. Left out of the graph, the rest runs.
#[tokio::test]
async fn empty_nodes_are_skipped() {
    use rpc_client::{ops, TENSOR_FLAG_COMPUTE};
    within("empty nodes", async {
        let s = shared_server();
        for addr in [s.addr, s.addr8] {
            let mut c = connect(addr).await;
            let buf = alloc(&mut c, 4096).await;
            let (a, b, sum) = add_graph(&buf, 16);
            let w = buf.f32(10, &[4, 2], 512).name("w").build();
            let x = buf.f32(11, &[4, 0], 1024).name("x").build();
            let mut y = buf
                .f32(12, &[2, 0], 1536)
                .op(ops::MUL_MAT, &[])
                .srcs(&[10, 11])
                .flags(TENSOR_FLAG_COMPUTE)
                .name("y")
                .build();
            // What ggml computes for ne [2, 0, 1, 1]: nb [4, 8, 0, 0].
            y.nb = [4u32, 8, 0, 0].map(rpc_proto::U32::new);
            c.set_tensor(&a, 0, &f32_bytes(&[1.0; 16]), false)
                .await
                .unwrap();
            c.set_tensor(&b, 0, &f32_bytes(&[4.0; 16]), false)
                .await
                .unwrap();
            c.graph_compute(0, &[12, 3], &[a, b, sum, w, x, y])
                .await
                .unwrap();
            assert_eq!(
                bytes_f32(&c.get_tensor(&sum, 0, 64).await.unwrap()),
                [5.0; 16]
            );
        }
    })
    .await;
}
