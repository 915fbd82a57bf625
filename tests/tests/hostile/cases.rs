//! The malicious requests. Each case opens its own attacker connection(s), sends one attack and
//! reports whether the server refused it (closed the connection, or answered a failure where the
//! protocol has one). Tensors use the base address each buffer was given, so the same bytes work
//! against the stock server (absolute addresses) and ours (per-connection virtual ones).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use rpc_proto::RpcTensor;

use super::client::*;

/// How long a refused request may take to close the connection.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

pub enum Verdict {
    /// The server refused the request.
    Refused,
    /// The server accepted it (computed a bad graph, returned data, ...).
    Accepted(String),
    /// The attack holds these connections open while the bystander and the fresh client are
    /// checked; refused if the server keeps serving them.
    Hold(Vec<Conn>),
}

pub struct Case {
    pub name: &'static str,
    /// Upstream report or advisory this reproduces, if any.
    pub refs: &'static str,
    pub run: fn(SocketAddr) -> io::Result<Verdict>,
}

mod op {
    pub const ADD: u32 = 2;
    pub const CUMSUM: u32 = 16;
    pub const COUNT_EQUAL: u32 = 19;
    pub const REPEAT: u32 = 20;
    pub const SILU_BACK: u32 = 23;
    pub const GROUP_NORM: u32 = 27;
    pub const SCALE: u32 = 32;
    pub const DIAG_MASK_INF: u32 = 44;
    pub const DIAG_MASK_ZERO: u32 = 45;
    pub const POOL_2D: u32 = 61;
    pub const UNARY: u32 = 91;
    pub const ADD_ID: u32 = 3;
    pub const ACC: u32 = 5;
    pub const CONCAT: u32 = 22;
    pub const RMS_NORM: u32 = 25;
    pub const MUL_MAT: u32 = 29;
    pub const MUL_MAT_ID: u32 = 30;
    pub const OUT_PROD: u32 = 31;
    pub const CPY: u32 = 34;
    pub const CLAMP: u32 = 50;
    pub const GET_ROWS: u32 = 40;
    pub const SET_ROWS: u32 = 42;
    pub const SOFT_MAX: u32 = 46;
    pub const ROPE: u32 = 48;
    pub const FLASH_ATTN_EXT: u32 = 74;
    pub const OPT_STEP_ADAMW: u32 = 98;
    pub const MAP_CUSTOM1: u32 = 92;
    pub const CUSTOM: u32 = 95;
}

fn expect_close(mut c: Conn) -> io::Result<Verdict> {
    if c.closed_within(CLOSE_WAIT) {
        return Ok(Verdict::Refused);
    }
    // Still open: is it still in sync (request silently executed)?
    let state = match c.ping() {
        Ok(_) => "request executed, connection kept",
        Err(_) => "connection neither closed nor answering",
    };
    Ok(Verdict::Accepted(state.into()))
}

/// An attacker with a 1 MiB buffer: (connection, handle, base).
fn attacker(addr: SocketAddr) -> io::Result<(Conn, u64, u64)> {
    let mut c = Conn::open(addr)?;
    let (h, base) = c.buffer(1 << 20)?;
    Ok((c, h, base))
}

const MIB: u64 = 1 << 20;

fn node(t: RpcTensor, op: u32, params: &[i32], srcs: &[u64]) -> RpcTensor {
    t.with_op(op, params)
        .with_srcs(srcs)
        .with_flags(FLAG_COMPUTE)
}

/// ROPE's op_params (mode 0, freq_base 10000, freq_scale 1, attn_factor 1) for `n_dims`.
fn rope_params(n_dims: i32) -> [i32; 16] {
    let mut p = [0i32; 16];
    p[1] = n_dims;
    p[5] = 10000f32.to_bits() as i32;
    p[6] = 1f32.to_bits() as i32;
    p[8] = 1f32.to_bits() as i32;
    p
}

/// Sends a graph whose only node is the last tensor.
fn graph_of(c: &mut Conn, tensors: &[RpcTensor]) -> io::Result<()> {
    let last = tensors.last().map(|t| t.id.get()).unwrap_or(1);
    c.graph(0, &[last], tensors)
}

pub fn all() -> Vec<Case> {
    vec![
        // ---- framing and handshake ----
        Case {
            name: "first command is not HELLO",
            refs: "spec §4.2",
            run: |a| {
                let mut c = Conn::connect(a)?;
                c.send(DEVICE_COUNT, &[])?;
                expect_close(c)
            },
        },
        Case {
            name: "0-byte HELLO (pre-4.0 client)",
            refs: "spec §4.2",
            run: |a| {
                let mut c = Conn::connect(a)?;
                c.send(HELLO, &[])?;
                expect_close(c)
            },
        },
        Case {
            name: "second HELLO inside the session",
            refs: "spec §4.2",
            run: |a| {
                let mut c = Conn::open(a)?;
                c.send(HELLO, &[0; 24])?;
                expect_close(c)
            },
        },
        Case {
            name: "command 18 (RPC_CMD_NONE)",
            refs: "spec §5.1",
            run: |a| {
                let mut c = Conn::open(a)?;
                c.send(18, &[])?;
                expect_close(c)
            },
        },
        Case {
            name: "command 255",
            refs: "spec §5.1",
            run: |a| {
                let mut c = Conn::open(a)?;
                c.send(255, &[0; 8])?;
                expect_close(c)
            },
        },
        Case {
            name: "fixed-size command with the wrong size",
            refs: "spec §3.2",
            run: |a| {
                let mut c = Conn::open(a)?;
                c.send(GET_ALIGNMENT, &[0; 5])?;
                expect_close(c)
            },
        },
        Case {
            name: "SET_TENSOR announcing 2^63 bytes",
            refs: "spec §3.2 (allocation before validation)",
            run: |a| {
                let mut c = Conn::open(a)?;
                let mut f = vec![SET_TENSOR];
                f.extend_from_slice(&(1u64 << 63).to_le_bytes());
                f.extend_from_slice(&[0u8; 305]);
                c.send_raw(&f)?;
                expect_close(c)
            },
        },
        Case {
            name: "GRAPH_COMPUTE announcing 2^40 bytes",
            refs: "spec §14 (unbounded req_size)",
            run: |a| {
                let mut c = Conn::open(a)?;
                let mut f = vec![GRAPH_COMPUTE];
                f.extend_from_slice(&(1u64 << 40).to_le_bytes());
                f.extend_from_slice(&[0u8; 64]);
                c.send_raw(&f)?;
                expect_close(c)
            },
        },
        Case {
            name: "GRAPH_COMPUTE with n_nodes = 2^31 in a 16-byte body",
            refs: "spec §14 (unbounded n_nodes)",
            run: |a| {
                let mut c = Conn::open(a)?;
                let mut p = 0u32.to_le_bytes().to_vec();
                p.extend_from_slice(&(1u32 << 31).to_le_bytes());
                p.extend_from_slice(&[0u8; 8]);
                c.send(GRAPH_COMPUTE, &p)?;
                expect_close(c)
            },
        },
        Case {
            name: "GRAPH_COMPUTE with more tensors than its body holds",
            refs: "spec §7",
            run: |a| {
                let mut c = Conn::open(a)?;
                let mut p = graph_payload(0, &[1], &[RpcTensor::new(1, F32)]);
                p[16..20].copy_from_slice(&1000u32.to_le_bytes());
                c.send(GRAPH_COMPUTE, &p)?;
                expect_close(c)
            },
        },
        Case {
            name: "200 silent connections (slowloris)",
            refs: "spec §15.4 (serial accept)",
            run: |a| {
                let mut held = Vec::new();
                for _ in 0..200 {
                    let Ok(mut c) = Conn::connect(a) else { break };
                    let _ = c.send_raw(&[HELLO, 24]); // half a header, then silence
                    held.push(c);
                }
                Ok(Verdict::Hold(held))
            },
        },
        // ---- buffers and data commands ----
        Case {
            name: "ALLOC_BUFFER of 2^62 bytes",
            refs: "spec §14 (ALLOC_BUFFER unbounded)",
            run: |a| {
                let mut c = Conn::open(a)?;
                let (h, _) = c.alloc(1 << 62)?;
                if h != 0 {
                    return Ok(Verdict::Accepted(format!("handle {h:#x} for 4 EiB")));
                }
                c.ping()?;
                Ok(Verdict::Refused)
            },
        },
        Case {
            name: "ALLOC_BUFFER on device 7",
            refs: "spec §13.3",
            run: |a| {
                let mut c = Conn::open(a)?;
                let mut p = 7u32.to_le_bytes().to_vec();
                p.extend_from_slice(&4096u64.to_le_bytes());
                c.send(ALLOC_BUFFER, &p)?;
                expect_close(c)
            },
        },
        Case {
            name: "BUFFER_GET_BASE of an unknown handle",
            refs: "spec §13.4",
            run: |a| {
                let mut c = Conn::open(a)?;
                c.send(BUFFER_GET_BASE, &0x4141_4141_4141_4141u64.to_le_bytes())?;
                expect_close(c)
            },
        },
        Case {
            name: "FREE_BUFFER twice (double free)",
            refs: "spec §13.4",
            run: |a| {
                let (mut c, h, _) = attacker(a)?;
                c.send(FREE_BUFFER, &h.to_le_bytes())?;
                c.send(FREE_BUFFER, &h.to_le_bytes())?;
                expect_close(c)
            },
        },
        Case {
            name: "BUFFER_CLEAR of a freed buffer (use after free)",
            refs: "spec §13.4",
            run: |a| {
                let (mut c, h, _) = attacker(a)?;
                c.send(FREE_BUFFER, &h.to_le_bytes())?;
                let mut p = h.to_le_bytes().to_vec();
                p.push(0x41);
                c.send(BUFFER_CLEAR, &p)?;
                expect_close(c)
            },
        },
        Case {
            name: "SET_TENSOR past the end of its buffer (heap write)",
            refs: "spec §9",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let t = t4(1, F32, [16, 1, 1, 1], h, base);
                c.set_tensor(&t, MIB - 8, &[0x41; 64])?;
                expect_close(c)
            },
        },
        Case {
            name: "SET_TENSOR with data+offset wrapping past 2^64",
            refs: "spec §9, §14 (wrapping data+offset)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                // data + offset wraps to base + 16: inside the buffer for a naive range check, then
                // ggml_backend_tensor_set sees offset + size > nbytes (stock: GGML_ASSERT abort).
                let t = t4(1, F32, [16, 1, 1, 1], h, base + 32);
                c.set_tensor(&t, 0u64.wrapping_sub(16), &[0x41; 32])?;
                expect_close(c)
            },
        },
        Case {
            name: "GET_TENSOR past the end of its buffer (heap read)",
            refs: "spec §9",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let t = t4(1, F32, [16, 1, 1, 1], h, base);
                let mut p = t.to_wire().to_vec();
                p.extend_from_slice(&0u64.to_le_bytes());
                p.extend_from_slice(&(2 * MIB).to_le_bytes());
                c.send(GET_TENSOR, &p)?;
                expect_close(c)
            },
        },
        Case {
            name: "GET_TENSOR with a wrapping offset",
            refs: "spec §14 (wrapping data+offset)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let t = t4(1, F32, [16, 1, 1, 1], h, base + 0x200);
                let mut p = t.to_wire().to_vec();
                p.extend_from_slice(&0u64.wrapping_sub(0x100).to_le_bytes());
                p.extend_from_slice(&64u64.to_le_bytes());
                c.send(GET_TENSOR, &p)?;
                expect_close(c)
            },
        },
        Case {
            name: "MEMSET_TENSOR past its tensor",
            refs: "spec §9",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let t = t4(1, F32, [16, 1, 1, 1], h, base + MIB - 64);
                let mut p = t.to_wire().to_vec();
                p.extend_from_slice(&0u64.to_le_bytes());
                p.extend_from_slice(&4096u64.to_le_bytes());
                p.push(0x41);
                c.send(MEMSET_TENSOR, &p)?;
                expect_close(c)
            },
        },
        Case {
            name: "tensor data outside its buffer (deserialize assert)",
            refs: "spec §6.2, §14 (GGML_ASSERT abort)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let t = t4(1, F32, [16, 1, 1, 1], h, base + 4 * MIB);
                c.set_tensor(&t, 0, &[0x41; 16])?;
                expect_close(c)
            },
        },
        Case {
            name: "tensor extent overflowing 64 bits",
            refs: "spec §6.2 (ggml_nbytes overflow)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let t = RpcTensor::new(1, F32)
                    .with_shape([u32::MAX; 4], [u32::MAX; 4])
                    .with_buffer(h, base);
                c.set_tensor(&t, 0, &[0x41; 16])?;
                expect_close(c)
            },
        },
        Case {
            name: "tensor of removed type 4 (Q4_2)",
            refs: "issue #13067",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let t = RpcTensor::new(1, 4)
                    .with_shape([32, 1, 1, 1], [20, 20, 20, 20])
                    .with_buffer(h, base);
                c.set_tensor(&t, 0, &[0x41; 16])?;
                expect_close(c)
            },
        },
        Case {
            name: "tensor of type 1000",
            refs: "issue #13067",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let t = RpcTensor::new(1, 1000)
                    .with_shape([4, 1, 1, 1], [4, 16, 16, 16])
                    .with_buffer(h, base);
                c.set_tensor(&t, 0, &[0x41; 16])?;
                expect_close(c)
            },
        },
        Case {
            name: "Q4_0 tensor with ne[0] = 33 (not whole blocks)",
            refs: "issue #25288",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let t = RpcTensor::new(1, Q4_0)
                    .with_shape([33, 1, 1, 1], [18, 36, 36, 36])
                    .with_buffer(h, base);
                let mut p = 0u32.to_le_bytes().to_vec();
                p.extend_from_slice(&t.to_wire());
                p.extend_from_slice(&[0u8; 296 * 10]);
                c.send(GET_ALLOC_SIZE, &p)?;
                expect_close(c)
            },
        },
        Case {
            name: "GET_ALLOC_SIZE of a tensor with 2^64 elements (found by fuzzing)",
            refs: "ggml_new_tensor int64 overflow assert",
            run: |a| {
                let mut c = Conn::open(a)?;
                let t = RpcTensor::new(1, F32).with_shape([65536; 4], [4, 4, 4, 4]);
                let mut p = 0u32.to_le_bytes().to_vec();
                p.extend_from_slice(&t.to_wire());
                p.extend_from_slice(&[0u8; 296 * 10]);
                c.send(GET_ALLOC_SIZE, &p)?;
                expect_close(c)
            },
        },
        Case {
            name: "FLASH_ATTN_EXT with an unknown precision (found by fuzzing)",
            refs: "GGML_ABORT in the CPU kernel",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let q = t4(1, F32, [16, 1, 1, 1], h, base);
                let k = RpcTensor::new(2, 1)
                    .with_shape([16, 4, 1, 1], [2, 32, 128, 128])
                    .with_buffer(h, base + 4096);
                let v = RpcTensor::new(3, 1)
                    .with_shape([16, 4, 1, 1], [2, 32, 128, 128])
                    .with_buffer(h, base + 8192);
                let mut p = [0i32; 16];
                p[0] = 1f32.to_bits() as i32;
                p[3] = 77; // precision
                let out = node(
                    t4(4, F32, [16, 1, 1, 1], h, base + 65536),
                    op::FLASH_ATTN_EXT,
                    &p,
                    &[1, 2, 3],
                );
                graph_of(&mut c, &[q, k, v, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "RMS_NORM result overlapping its source 16 bytes later (found by fuzzing)",
            refs: "overlapping memcpy in the CPU kernel (ASan)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4096, 1, 1, 1], h, base);
                let mut p = [0i32; 16];
                p[0] = 1e-6f32.to_bits() as i32;
                let out = node(
                    t4(2, F32, [4096, 1, 1, 1], h, base + 16),
                    op::RMS_NORM,
                    &p,
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "COPY_TENSOR into a smaller destination (cpy_tensor overflow)",
            refs: "GHSA-5vm9-p64x-gqw9 style",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let (h2, base2) = c.buffer(4096)?;
                let src = t4(1, F32, [65536, 1, 1, 1], h, base);
                let dst = t4(2, F32, [4, 1, 1, 1], h2, base2 + 4096 - 16);
                let mut p = src.to_wire().to_vec();
                p.extend_from_slice(&dst.to_wire());
                c.send(COPY_TENSOR, &p)?;
                expect_close(c)
            },
        },
        Case {
            name: "COPY_TENSOR from a tensor without a buffer (NULL buffer)",
            refs: "GHSA-wcr5-566p-9cwj style",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let src = t4(1, F32, [16, 1, 1, 1], 0, 0x4141_4141_4141);
                let dst = t4(2, F32, [16, 1, 1, 1], h, base);
                let mut p = src.to_wire().to_vec();
                p.extend_from_slice(&dst.to_wire());
                c.send(COPY_TENSOR, &p)?;
                expect_close(c)
            },
        },
        Case {
            name: "INIT_TENSOR with a tensor outside its buffer",
            refs: "spec §9",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let t = t4(1, F32, [1024, 1, 1, 1], h, base + MIB - 16);
                c.send(INIT_TENSOR, &t.to_wire())?;
                expect_close(c)
            },
        },
        Case {
            name: "GET_ALLOC_SIZE with a tensor outside its buffer",
            refs: "spec §9 (deserialize assert)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let t = t4(1, F32, [1024, 1, 1, 1], h, base + MIB - 16);
                let mut p = 0u32.to_le_bytes().to_vec();
                p.extend_from_slice(&t.to_wire());
                p.extend_from_slice(&[0u8; 296 * 10]);
                c.send(GET_ALLOC_SIZE, &p)?;
                expect_close(c)
            },
        },
        // ---- graph structure ----
        Case {
            name: "MAP_CUSTOM1 with a function pointer in op_params",
            refs: "issue #25289 (remote code execution)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 1], h, base);
                let y = node(
                    t4(2, F32, [4, 1, 1, 1], h, base + 64),
                    op::MAP_CUSTOM1,
                    &[0x4141_4141, 0x4141_4141, -1, 0, 0],
                    &[1],
                );
                graph_of(&mut c, &[x, y])?;
                expect_close(c)
            },
        },
        Case {
            name: "GGML_OP_CUSTOM with a function pointer in op_params",
            refs: "issue #25289",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 1], h, base);
                let y = node(
                    t4(2, F32, [4, 1, 1, 1], h, base + 64),
                    op::CUSTOM,
                    &[0x4141_4141, 0x4141_4141, 1, 0, 0],
                    &[1],
                );
                graph_of(&mut c, &[x, y])?;
                expect_close(c)
            },
        },
        Case {
            name: "op 0xFFFFFFFF",
            refs: "issue #25289 (op not validated)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 1], h, base);
                let y = node(t4(2, F32, [4, 1, 1, 1], h, base + 64), u32::MAX, &[], &[1]);
                graph_of(&mut c, &[x, y])?;
                expect_close(c)
            },
        },
        Case {
            name: "node id 0 (NULL node)",
            refs: "spec §7.5, §14",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 1], h, base);
                c.graph(0, &[0], &[x])?;
                expect_close(c)
            },
        },
        Case {
            name: "node naming an unknown tensor id",
            refs: "spec §7",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 1], h, base);
                let y = node(
                    t4(2, F32, [4, 1, 1, 1], h, base + 64),
                    op::ADD,
                    &[],
                    &[1, 77],
                );
                graph_of(&mut c, &[x, y])?;
                expect_close(c)
            },
        },
        Case {
            name: "two nodes in a cycle",
            refs: "spec §14",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = node(t4(1, F32, [4, 1, 1, 1], h, base), op::ADD, &[], &[2, 2]);
                let y = node(
                    t4(2, F32, [4, 1, 1, 1], h, base + 64),
                    op::ADD,
                    &[],
                    &[1, 1],
                );
                c.graph(0, &[2], &[x, y])?;
                expect_close(c)
            },
        },
        Case {
            name: "100,000-deep source chain closing a cycle (stack exhaustion)",
            refs: "spec §7.5 (recursive create_node)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let n: u64 = 100_000;
                let mut ts = vec![t4(n + 1, F32, [4, 1, 1, 1], h, base)];
                for i in 1..=n {
                    let prev = if i == 1 { n } else { i - 1 };
                    ts.push(node(
                        t4(i, F32, [4, 1, 1, 1], h, base + 64),
                        op::ADD,
                        &[],
                        &[prev, n + 1],
                    ));
                }
                c.graph(0, &[n], &ts)?;
                expect_close(c)
            },
        },
        Case {
            name: "GRAPH_COMPUTE on device 9",
            refs: "spec §13.3",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 1], h, base);
                c.graph(9, &[1], &[x])?;
                expect_close(c)
            },
        },
        Case {
            name: "tensor with a data pointer but no buffer",
            refs: "GHSA-wcr5-566p-9cwj, PR #20908 (NULL buffer skipped checks)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 1], 0, 0x4141_4141_4141);
                let b = t4(2, F32, [4, 1, 1, 1], h, base);
                let y = node(
                    t4(3, F32, [4, 1, 1, 1], h, base + 64),
                    op::ADD,
                    &[],
                    &[1, 2],
                );
                graph_of(&mut c, &[x, b, y])?;
                expect_close(c)
            },
        },
        Case {
            name: "graph source outside its buffer",
            refs: "spec §6.2 (deserialize assert)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 1], h, base + 2 * MIB);
                let b = t4(2, F32, [4, 1, 1, 1], h, base);
                let y = node(
                    t4(3, F32, [4, 1, 1, 1], h, base + 64),
                    op::ADD,
                    &[],
                    &[1, 2],
                );
                graph_of(&mut c, &[x, b, y])?;
                expect_close(c)
            },
        },
        // ---- per-op shapes, strides and parameters ----
        Case {
            name: "GET_ROWS reading past src0 (ne[2] mismatch)",
            refs: "issue #26825",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                // src0: 4 x 2 rows x 1 matrix at the end of the buffer; rows ask for matrix 7.
                let src = t4(1, F32, [4, 2, 1, 1], h, base + MIB - 32);
                let rows = t4(2, I32, [1, 8, 1, 1], h, base);
                c.set_tensor(&rows, 0, &i32_bytes(&[0; 8]))?;
                let out = node(
                    t4(3, F32, [4, 1, 8, 1], h, base + 4096),
                    op::GET_ROWS,
                    &[],
                    &[1, 2],
                );
                graph_of(&mut c, &[src, rows, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "GET_ROWS with a row id out of range",
            refs: "issue #26825 (data-dependent)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let src = t4(1, F32, [4, 2, 1, 1], h, base + MIB - 32);
                let rows = t4(2, I32, [1, 1, 1, 1], h, base);
                c.set_tensor(&rows, 0, &i32_bytes(&[100_000]))?;
                let out = node(
                    t4(3, F32, [4, 1, 1, 1], h, base + 4096),
                    op::GET_ROWS,
                    &[],
                    &[1, 2],
                );
                graph_of(&mut c, &[src, rows, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "SET_ROWS writing past its destination (ne[2] mismatch)",
            refs: "issue #26912",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let (h2, base2) = c.buffer(64)?;
                // destination: 4 x 2 x 1 in a 64-byte buffer; values claim 4 x 1 x 8.
                let dst = t4(1, F32, [4, 2, 1, 1], h2, base2);
                let vals = t4(2, F32, [4, 1, 8, 1], h, base);
                let ids =
                    t4(3, I64, [1, 1, 1, 1], h, base + 4096).with_shape([1, 1, 1, 1], [8, 8, 8, 8]);
                c.set_tensor(&ids, 0, &0i64.to_le_bytes())?;
                let out = node(
                    t4(4, F32, [4, 2, 1, 1], h2, base2),
                    op::SET_ROWS,
                    &[],
                    &[2, 3, 1],
                )
                .with_view(1, 0);
                graph_of(&mut c, &[dst, vals, ids, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "SET_ROWS with a row id out of range",
            refs: "issue #26912 (data-dependent)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let dst = t4(1, F32, [4, 2, 1, 1], h, base + MIB - 32);
                let vals = t4(2, F32, [4, 1, 1, 1], h, base);
                let ids = RpcTensor::new(3, I64)
                    .with_shape([1, 1, 1, 1], [8, 8, 8, 8])
                    .with_buffer(h, base + 4096);
                c.set_tensor(&ids, 0, &1_000_000i64.to_le_bytes())?;
                let out = node(
                    t4(4, F32, [4, 2, 1, 1], h, base + MIB - 32),
                    op::SET_ROWS,
                    &[],
                    &[2, 3, 1],
                )
                .with_view(1, 0);
                graph_of(&mut c, &[dst, vals, ids, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "row ids made out of range before GRAPH_RECOMPUTE",
            refs: "issue #26912 (checked at recompute)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let dst = t4(1, F32, [4, 2, 1, 1], h, base + MIB - 32);
                let vals = t4(2, F32, [4, 1, 1, 1], h, base);
                let ids = RpcTensor::new(3, I64)
                    .with_shape([1, 1, 1, 1], [8, 8, 8, 8])
                    .with_buffer(h, base + 4096);
                c.set_tensor(&ids, 0, &1i64.to_le_bytes())?;
                let out = node(
                    t4(4, F32, [4, 2, 1, 1], h, base + MIB - 32),
                    op::SET_ROWS,
                    &[],
                    &[2, 3, 1],
                )
                .with_view(1, 0);
                graph_of(&mut c, &[dst, vals, ids, out])?;
                c.ping()?; // the valid graph ran
                c.set_tensor(&ids, 0, &(1i64 << 40).to_le_bytes())?;
                c.recompute(0)?;
                expect_close(c)
            },
        },
        Case {
            name: "MUL_MAT with K larger than src1's rows (heap read)",
            refs: "spec §14 (no shape validation)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let w = t4(1, F32, [4096, 4, 1, 1], h, base);
                let x = t4(2, F32, [16, 1, 1, 1], h, base + MIB - 64);
                let out = node(
                    t4(3, F32, [4, 1, 1, 1], h, base + 65536),
                    op::MUL_MAT,
                    &[],
                    &[1, 2],
                );
                graph_of(&mut c, &[w, x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "MUL_MAT result larger than the product (heap write)",
            refs: "spec §14 (no shape validation)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let (h2, base2) = c.buffer(64)?;
                let w = t4(1, F32, [16, 64, 1, 1], h, base);
                let x = t4(2, F32, [16, 64, 1, 1], h, base + 8192);
                // the product is 64 x 64; the result claims 4 x 4 in a 64-byte buffer
                let out = node(
                    t4(3, F32, [4, 4, 1, 1], h2, base2),
                    op::MUL_MAT,
                    &[],
                    &[1, 2],
                );
                graph_of(&mut c, &[w, x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "MUL_MAT_ID with an expert id out of range",
            refs: "spec §14 (data-dependent index)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let experts = t4(1, F32, [8, 4, 2, 1], h, base);
                let x = t4(2, F32, [8, 1, 1, 1], h, base + 4096);
                let ids = t4(3, I32, [1, 1, 1, 1], h, base + 8192);
                c.set_tensor(&ids, 0, &i32_bytes(&[1 << 20]))?;
                let out = node(
                    t4(4, F32, [4, 1, 1, 1], h, base + 16384),
                    op::MUL_MAT_ID,
                    &[],
                    &[1, 2, 3],
                );
                graph_of(&mut c, &[experts, x, ids, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "ADD_ID with ids out of range",
            refs: "spec §14 (data-dependent index)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 2, 1, 1], h, base);
                let b = t4(2, F32, [4, 2, 1, 1], h, base + 4096);
                let ids = t4(3, I32, [2, 1, 1, 1], h, base + 8192);
                c.set_tensor(&ids, 0, &i32_bytes(&[0, 1 << 24]))?;
                let out = node(
                    t4(4, F32, [4, 2, 1, 1], h, base + 16384),
                    op::ADD_ID,
                    &[],
                    &[1, 2, 3],
                );
                graph_of(&mut c, &[x, b, ids, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "CPY into a smaller destination",
            refs: "GHSA-mqp6-7pv6-fqjf style (cpy)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let (h2, base2) = c.buffer(64)?;
                let src = t4(1, F32, [4096, 1, 1, 1], h, base);
                let dst = t4(2, F32, [4, 1, 1, 1], h2, base2);
                let out = node(t4(3, F32, [4, 1, 1, 1], h2, base2), op::CPY, &[], &[1, 2])
                    .with_view(2, 0);
                graph_of(&mut c, &[src, dst, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "CONCAT result larger than its sources (heap read)",
            refs: "spec §14 (no shape validation)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                // 4x2 + 4x2 rows, result claims 4x64: the kernel reads src[1] rows 0..61, from the
                // last 32 bytes of the buffer onwards.
                let x = t4(1, F32, [4, 2, 1, 1], h, base);
                let y = t4(2, F32, [4, 2, 1, 1], h, base + MIB - 32);
                let out = node(
                    t4(3, F32, [4, 64, 1, 1], h, base + 4096),
                    op::CONCAT,
                    &[1],
                    &[1, 2],
                );
                graph_of(&mut c, &[x, y, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "ACC with a negative offset (write before the buffer)",
            refs: "spec §14 (op_params as offsets)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [16, 1, 1, 1], h, base);
                let y = t4(2, F32, [4, 1, 1, 1], h, base + 4096);
                let out = node(
                    t4(3, F32, [16, 1, 1, 1], h, base),
                    op::ACC,
                    &[64, 64, 64, -4096, 1],
                    &[1, 2],
                )
                .with_view(1, 0);
                graph_of(&mut c, &[x, y, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "ROPE with n_dims larger than the row",
            refs: "spec §14 (op_params as sizes)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 1], h, base + MIB - 16);
                let pos = t4(2, I32, [1, 1, 1, 1], h, base);
                let mut p = [0i32; 16];
                p[1] = 4096; // n_dims
                p[5] = 10000f32.to_bits() as i32;
                p[6] = 1f32.to_bits() as i32;
                p[8] = 1f32.to_bits() as i32;
                let out = node(
                    t4(3, F32, [4, 1, 1, 1], h, base + 4096),
                    op::ROPE,
                    &p,
                    &[1, 2],
                );
                graph_of(&mut c, &[x, pos, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "nb[0] = 0 on a source read as whole rows",
            refs: "spec §6.2 (nb not validated)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                // 65536 floats claimed, extent 4 bytes at the very end of the buffer.
                let x = RpcTensor::new(1, F32)
                    .with_shape([65536, 1, 1, 1], [0, 0, 0, 0])
                    .with_buffer(h, base + MIB - 4);
                let mut p = [0i32; 16];
                p[0] = 1e-6f32.to_bits() as i32;
                let out = node(
                    t4(2, F32, [65536, 1, 1, 1], h, base),
                    op::RMS_NORM,
                    &p,
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "FLASH_ATTN_EXT with a mask smaller than the scores (heap read)",
            refs: "spec §14 (no shape validation)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let q = t4(1, F32, [16, 8, 1, 1], h, base);
                let k = RpcTensor::new(2, 1)
                    .with_shape([16, 256, 1, 1], [2, 32, 8192, 8192])
                    .with_buffer(h, base + 4096);
                let v = RpcTensor::new(3, 1)
                    .with_shape([16, 256, 1, 1], [2, 32, 8192, 8192])
                    .with_buffer(h, base + 16384);
                let m = RpcTensor::new(4, 1)
                    .with_shape([1, 1, 1, 1], [2, 2, 2, 2])
                    .with_buffer(h, base + MIB - 2);
                let mut p = [0i32; 16];
                p[0] = 1f32.to_bits() as i32;
                let out = node(
                    t4(5, F32, [16, 1, 8, 1], h, base + 65536),
                    op::FLASH_ATTN_EXT,
                    &p,
                    &[1, 2, 3, 4],
                );
                graph_of(&mut c, &[q, k, v, m, out])?;
                expect_close(c)
            },
        },
        // ---- found by the `ops` fuzz target (fuzz/seeds/ops/regressions) ----
        Case {
            name:
                "MUL_MAT with the Hadamard hint: ne10 floats into a shorter result row (heap write)",
            refs: "fuzz ops: ggml_compute_forward_fwht",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let w = t4(1, F32, [64, 4, 1, 1], h, base);
                let x = t4(2, F32, [64, 1, 1, 1], h, base + 4096);
                // A 4-float result row at the very end of the buffer; the transform writes 64.
                let out = node(
                    t4(3, F32, [4, 1, 1, 1], h, base + MIB - 16),
                    op::MUL_MAT,
                    &[0, 1],
                    &[1, 2],
                );
                graph_of(&mut c, &[w, x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "OPT_STEP_ADAMW with zero-strided moments at the buffer's end (heap write)",
            refs: "fuzz ops: ggml_compute_forward_opt_step_adamw_f32",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let w = t4(1, F32, [16, 64, 1, 1], h, base).with_flags(4); // GGML_TENSOR_FLAG_PARAM
                let g = t4(2, F32, [16, 64, 1, 1], h, base + 8192);
                // One 64-byte row each, claimed 64 times: the kernel uses the weight's row stride.
                let m = RpcTensor::new(3, F32)
                    .with_shape([16, 64, 1, 1], [4, 0, 0, 0])
                    .with_buffer(h, base + MIB - 128);
                let v = RpcTensor::new(4, F32)
                    .with_shape([16, 64, 1, 1], [4, 0, 0, 0])
                    .with_buffer(h, base + MIB - 64);
                let p = t4(5, F32, [7, 1, 1, 1], h, base + 16384);
                let out = node(
                    t4(6, F32, [16, 64, 1, 1], h, base),
                    op::OPT_STEP_ADAMW,
                    &[],
                    &[1, 2, 3, 4, 5],
                )
                .with_view(1, 0);
                graph_of(&mut c, &[w, g, m, v, p, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "ROPE on an odd row at the buffer's end (heap write)",
            refs: "fuzz ops: ggml_compute_forward_rope_flt",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [3, 1, 1, 1], h, base);
                let pos = t4(2, I32, [1, 1, 1, 1], h, base + 4096);
                let mut p = [0i32; 16];
                p[1] = 2; // n_dims
                p[5] = 10000f32.to_bits() as i32;
                p[6] = 1f32.to_bits() as i32;
                p[8] = 1f32.to_bits() as i32;
                // 3 floats at the very end; the copy of the unrotated pair writes a 4th.
                let out = node(
                    t4(3, F32, [3, 1, 1, 1], h, base + MIB - 12),
                    op::ROPE,
                    &p,
                    &[1, 2],
                );
                graph_of(&mut c, &[x, pos, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "CLAMP f16 with a zero outer stride at the buffer's end (heap write)",
            refs: "fuzz ops: ggml_compute_forward_clamp_f16",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = RpcTensor::new(1, 1)
                    .with_shape([4, 1, 1, 64], [2, 8, 8, 0])
                    .with_buffer(h, base);
                let mut p = [0i32; 16];
                p[0] = (-1f32).to_bits() as i32;
                p[1] = 1f32.to_bits() as i32;
                // One 8-byte row claimed 64 times; the kernel writes row j at j*nb[1].
                let out = node(
                    RpcTensor::new(2, 1)
                        .with_shape([4, 1, 1, 64], [2, 8, 8, 0])
                        .with_buffer(h, base + MIB - 8),
                    op::CLAMP,
                    &p,
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "OUT_PROD into a zero-strided result at the buffer's end (heap write)",
            refs: "fuzz ops: ggml_compute_forward_out_prod_f32",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [2, 3, 1, 1], h, base);
                let y = t4(2, F32, [64, 3, 1, 1], h, base + 4096);
                // 2x64 floats claimed in 8 bytes; the kernel zeroes all 128 first.
                let out = node(
                    RpcTensor::new(3, F32)
                        .with_shape([2, 64, 1, 1], [4, 0, 0, 0])
                        .with_buffer(h, base + MIB - 8),
                    op::OUT_PROD,
                    &[],
                    &[1, 2],
                );
                graph_of(&mut c, &[x, y, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "FLASH_ATTN_EXT into a padded result at the buffer's end (heap write)",
            refs: "fuzz ops: ggml_compute_forward_flash_attn_ext_f16_one_chunk",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let q = t4(1, F32, [32, 4, 1, 1], h, base);
                let kv = |id, at| {
                    RpcTensor::new(id, 1) // F16
                        .with_shape([32, 16, 1, 1], strides(2, 1, [32, 16, 1, 1]))
                        .with_buffer(h, at)
                };
                let (k, v) = (kv(2, base + 4096), kv(3, base + 8192));
                let mut p = [0i32; 16];
                p[0] = 0.125f32.to_bits() as i32;
                // Rows of 32 floats 256 bytes apart: extent 896 bytes; the kernel copies 256
                // bytes to row 3 at 3*256.
                let out = node(
                    RpcTensor::new(4, F32)
                        .with_shape([32, 1, 4, 1], [4, 256, 256, 1024])
                        .with_buffer(h, base + MIB - 896),
                    op::FLASH_ATTN_EXT,
                    &p,
                    &[1, 2, 3],
                );
                graph_of(&mut c, &[q, k, v, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "SOFT_MAX with an empty sinks tensor at the buffer's end (heap read)",
            refs: "fuzz ops: ggml_compute_forward_soft_max_f32",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 1], h, base);
                // ne0 = 1 sink claimed, but no elements: extent 0 at the very end.
                let sinks = RpcTensor::new(2, F32)
                    .with_shape([1, 1, 1, 0], [4, 4, 4, 4])
                    .with_buffer(h, base + MIB);
                let mut p = [0i32; 16];
                p[0] = 1f32.to_bits() as i32;
                let out = node(
                    t4(3, F32, [4, 1, 1, 1], h, base + 4096),
                    op::SOFT_MAX,
                    &p,
                    &[1, 0, 2],
                );
                graph_of(&mut c, &[x, sinks, out])?;
                expect_close(c)
            },
        },
        // ---- open findings of the ops fuzz target, closed (fuzz/seeds/ops/regressions) ----
        Case {
            name: "CLAMP f32 with a zero outer stride at the buffer's end (heap write)",
            refs: "fuzz ops: ggml_compute_forward_clamp_f32",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                // One 16-byte row claimed 64 times; the kernel writes row j at j*nb[1].
                let shape = ([4, 1, 1, 64], [4, 16, 16, 0]);
                let x = RpcTensor::new(1, F32)
                    .with_shape(shape.0, shape.1)
                    .with_buffer(h, base);
                let out = node(
                    RpcTensor::new(2, F32)
                        .with_shape(shape.0, shape.1)
                        .with_buffer(h, base + MIB - 16),
                    op::CLAMP,
                    &[(-1f32).to_bits() as i32, 1f32.to_bits() as i32],
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "SCALE into rows 64 bytes apart in a 32-byte result (heap write)",
            refs: "fuzz ops: ggml_compute_forward_scale_f32",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 2], h, base);
                // Contiguous by ggml's definition (ne[1] = 1 leaves nb[1] free), extent 32
                // bytes; the kernel writes row 1 at 1*nb[1] = 64.
                let out = node(
                    RpcTensor::new(2, F32)
                        .with_shape([4, 1, 1, 2], [4, 64, 16, 16])
                        .with_buffer(h, base + MIB - 32),
                    op::SCALE,
                    &[2f32.to_bits() as i32, 0],
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "SILU_BACK into rows 64 bytes apart in a 32-byte result (heap write)",
            refs: "fuzz ops: ggml_compute_forward_silu_back_f32",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let g = t4(1, F32, [4, 1, 1, 2], h, base);
                let x = t4(2, F32, [4, 1, 1, 2], h, base + 4096);
                let out = node(
                    RpcTensor::new(3, F32)
                        .with_shape([4, 1, 1, 2], [4, 64, 64, 16])
                        .with_buffer(h, base + MIB - 32),
                    op::SILU_BACK,
                    &[],
                    &[1, 2],
                );
                graph_of(&mut c, &[g, x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "CUMSUM into a one-element row with nb[0] = 0 (GGML_ASSERT)",
            refs: "fuzz ops: ggml_compute_forward_cumsum_f32",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [1, 1, 1, 1], h, base);
                let out = node(
                    RpcTensor::new(2, F32)
                        .with_shape([1, 1, 1, 1], [0, 4, 4, 4])
                        .with_buffer(h, base + 4096),
                    op::CUMSUM,
                    &[],
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "DIAG_MASK_INF into one-element rows with nb[0] = 12 (GGML_ASSERT)",
            refs: "fuzz ops: ggml_compute_forward_diag_mask_f32",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [1, 3, 1, 1], h, base);
                let out = node(
                    RpcTensor::new(2, F32)
                        .with_shape([1, 3, 1, 1], [12, 4, 12, 12])
                        .with_buffer(h, base + 4096),
                    op::DIAG_MASK_INF,
                    &[0],
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "DIAG_MASK_ZERO of a one-element row with nb[0] = 0 (GGML_ASSERT)",
            refs: "fuzz ops: ggml_compute_forward_diag_mask_f32",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = RpcTensor::new(1, F32)
                    .with_shape([1, 1, 1, 1], [0, 4, 4, 4])
                    .with_buffer(h, base);
                let out = node(
                    t4(2, F32, [1, 1, 1, 1], h, base + 4096),
                    op::DIAG_MASK_ZERO,
                    &[0],
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "DIAG_MASK_INF with a free plane stride (ne[2] = 1) at the buffer's end (heap write)",
            refs: "ggml_compute_forward_diag_mask_f32 (planes k*nb[2], k < ne2*ne3)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 4, 1, 2], h, base);
                // Contiguous by ggml's definition (ne[2] = 1 leaves nb[2] free), extent 128
                // bytes; the kernel masks plane 1 at 1*nb[2] = 1024.
                let out = node(
                    RpcTensor::new(2, F32)
                        .with_shape([4, 4, 1, 2], [4, 16, 1024, 64])
                        .with_buffer(h, base + MIB - 128),
                    op::DIAG_MASK_INF,
                    &[0],
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "REPEAT into one-element rows with nb[0] = 0 (GGML_ASSERT)",
            refs: "fuzz ops: ggml_compute_forward_repeat_f32",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [1, 2, 2, 2], h, base);
                let out = node(
                    RpcTensor::new(2, F32)
                        .with_shape([1, 4, 2, 2], [0, 4, 16, 32])
                        .with_buffer(h, base + 4096),
                    op::REPEAT,
                    &[],
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "GROUP_NORM with INT_MAX groups for 1 channel (CPU for minutes)",
            refs: "fuzz ops: ggml_compute_forward_group_norm_f32",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 4], h, base);
                let out = node(
                    t4(2, F32, [4, 1, 1, 4], h, base + 4096),
                    op::GROUP_NORM,
                    &[i32::MAX, 1e-6f32.to_bits() as i32],
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "POOL_2D over planes 4 bytes apart (ne[2] = 1) at the buffer's end (heap write)",
            refs: "fuzz ops: ggml_compute_forward_pool_2d",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                // Contiguous by ggml's definition; the kernel steps nb[2] = 4 bytes through the
                // 104-byte source (26 planes) and writes a 7-float plane for each: 728 bytes.
                let x = RpcTensor::new(1, F32)
                    .with_shape([13, 1, 1, 2], [4, 52, 4, 52])
                    .with_buffer(h, base);
                let out = node(
                    t4(2, F32, [7, 1, 1, 2], h, base + MIB - 56),
                    op::POOL_2D,
                    &[0, 1, 1, 2, 2, 0, 0],
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "FLASH_ATTN_EXT into one row with nb[1] = 1024 at the buffer's end (heap write)",
            refs: "fuzz ops: ggml_compute_forward_flash_attn_ext_f16_one_chunk",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let q = t4(1, F32, [32, 1, 1, 1], h, base);
                let kv = |id, at| {
                    RpcTensor::new(id, 1) // F16
                        .with_shape([32, 16, 1, 1], strides(2, 1, [32, 16, 1, 1]))
                        .with_buffer(h, at)
                };
                let (k, v) = (kv(2, base + 4096), kv(3, base + 8192));
                // One row of 32 floats, contiguous by ggml's definition; the kernel copies
                // nb[1] = 1024 bytes into it.
                let out = node(
                    RpcTensor::new(4, F32)
                        .with_shape([32, 1, 1, 1], [4, 1024, 1024, 1024])
                        .with_buffer(h, base + MIB - 128),
                    op::FLASH_ATTN_EXT,
                    &[0.125f32.to_bits() as i32],
                    &[1, 2, 3],
                );
                graph_of(&mut c, &[q, k, v, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "ROPE with empty freq factors at the buffer's end (heap read)",
            refs: "fuzz ops: ggml_rope_cache_init",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [64, 1, 1, 1], h, base);
                let pos = t4(2, I32, [1, 1, 1, 1], h, base + 4096);
                // ne[0] = 32 factors claimed, none present (ne[1] = 0): extent 0 at the end.
                let ff = RpcTensor::new(3, F32)
                    .with_shape([32, 0, 1, 1], [4, 128, 128, 128])
                    .with_buffer(h, base + MIB);
                let out = node(
                    t4(4, F32, [64, 1, 1, 1], h, base + 8192),
                    op::ROPE,
                    &rope_params(64),
                    &[1, 2, 3],
                );
                graph_of(&mut c, &[x, pos, ff, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "ROPE reading a row's freq factors past the buffer's end (heap read)",
            refs: "fuzz ops: ggml_rope_cache_init (ne0/2 factors read)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [1024, 1, 1, 1], h, base);
                let pos = t4(2, I32, [1, 1, 1, 1], h, base + 8192);
                // n_dims = 2: one factor is all ggml asks for, and it is the buffer's last
                // float; the rotation cache reads one per pair of the row, 512.
                let ff = t4(3, F32, [1, 1, 1, 1], h, base + MIB - 4);
                let out = node(
                    t4(4, F32, [1024, 1, 1, 1], h, base + 16384),
                    op::ROPE,
                    &rope_params(2),
                    &[1, 2, 3],
                );
                graph_of(&mut c, &[x, pos, ff, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "UNARY XIELU into padded rows (GGML_ASSERT)",
            refs: "fuzz ops: apply_unary_op_functor (unary-ops.cpp)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [24, 4, 2, 2], h, base);
                let out = node(
                    RpcTensor::new(2, F32)
                        .with_shape([24, 4, 2, 2], [4, 104, 420, 840])
                        .with_buffer(h, base + 8192),
                    op::UNARY,
                    &[17], // GGML_UNARY_OP_XIELU
                    &[1],
                );
                graph_of(&mut c, &[x, out])?;
                expect_close(c)
            },
        },
        // ---- kernel contracts: what a CPU kernel assumes of its sources' layout ----
        Case {
            name: "FLASH_ATTN_EXT with an f16 q, read as f32 rows (heap read)",
            refs: "ggml_compute_forward_flash_attn_ext_f16_one_chunk (ops.cpp)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                // One f16 q row of 128 KiB at the buffer's end: the kernel converts it as 256 KiB
                // of floats.
                let dk = 1u32 << 16;
                let q = RpcTensor::new(1, F16)
                    .with_shape([dk, 1, 1, 1], strides(2, 1, [dk, 1, 1, 1]))
                    .with_buffer(h, base + MIB - 2 * dk as u64);
                let k = RpcTensor::new(2, F16)
                    .with_shape([dk, 1, 1, 1], strides(2, 1, [dk, 1, 1, 1]))
                    .with_buffer(h, base);
                let v = RpcTensor::new(3, F16)
                    .with_shape([16, 1, 1, 1], strides(2, 1, [16, 1, 1, 1]))
                    .with_buffer(h, base + 2 * dk as u64);
                let mut p = [0i32; 16];
                p[0] = 1f32.to_bits() as i32;
                let out = node(
                    t4(4, F32, [16, 1, 1, 1], h, base + 2 * dk as u64 + 4096),
                    op::FLASH_ATTN_EXT,
                    &p,
                    &[1, 2, 3],
                );
                graph_of(&mut c, &[q, k, v, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "COUNT_EQUAL over a 4-d shape the kernel splits into rows out of range (heap read)",
            refs: "ggml_compute_forward_count_equal_i32 (ops.cpp)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                // ne = [1, 1, 1, 4]: the kernel's row split gives dim-2 indices 0, -3, -6, -9,
                // and nb[2] (free: ne[2] = 1) is 1 GiB.
                let x = RpcTensor::new(1, I32)
                    .with_shape([1, 1, 1, 4], [4, 4, 1 << 30, 4])
                    .with_buffer(h, base);
                let y = RpcTensor::new(2, I32)
                    .with_shape([1, 1, 1, 4], [4, 4, 1 << 30, 4])
                    .with_buffer(h, base + 4096);
                let out = node(
                    RpcTensor::new(3, I64)
                        .with_shape([1, 1, 1, 1], [8, 8, 8, 8])
                        .with_buffer(h, base + 8192),
                    op::COUNT_EQUAL,
                    &[],
                    &[1, 2],
                );
                graph_of(&mut c, &[x, y, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "MUL_MAT Q4_K x a strided Q8_K src1, rows flattened by the tiled kernel (heap read)",
            refs: "ggml_compute_forward_mul_mat_tiled_one_chunk (tiled/tiled.cpp)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                // src1 rows are 64 KiB apart in dim 1 and 292 bytes apart in dim 2; the tiled
                // kernel reads row r at r*nb[1], up to 128 MiB past the buffer.
                let w = RpcTensor::new(1, Q4_K)
                    .with_shape([256, 16, 1, 1], strides(144, 256, [256, 16, 1, 1]))
                    .with_buffer(h, base);
                let x = RpcTensor::new(2, Q8_K)
                    .with_shape([256, 8, 256, 1], [292, 65536, 292, 292 * 256])
                    .with_buffer(h, base + 4096);
                let out = node(
                    t4(3, F32, [16, 8, 256, 1], h, base + 4096 + 540_000),
                    op::MUL_MAT,
                    &[],
                    &[1, 2],
                );
                graph_of(&mut c, &[w, x, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "MUL_MAT_ID Q4_K x a Q8_K src1 with a free 1 GiB nb[1] (heap read)",
            refs: "ggml_compute_forward_mul_mat_id_tiled_one_expert (tiled/tiled.cpp)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                // ne[1] = 1 leaves nb[1] free in ggml's contiguity; the tiled kernel steps the
                // 8 rows routed to expert 0 by it.
                let w = RpcTensor::new(1, Q4_K)
                    .with_shape([256, 16, 2, 1], strides(144, 256, [256, 16, 2, 1]))
                    .with_buffer(h, base);
                let x = RpcTensor::new(2, Q8_K)
                    .with_shape([256, 1, 8, 1], [292, 1 << 30, 292, 292 * 8])
                    .with_buffer(h, base + 8192);
                let ids = t4(3, I32, [1, 8, 1, 1], h, base + 16384);
                c.set_tensor(&ids, 0, &i32_bytes(&[0; 8]))?;
                let out = node(
                    t4(4, F32, [16, 1, 8, 1], h, base + 32768),
                    op::MUL_MAT_ID,
                    &[],
                    &[1, 2, 3],
                );
                graph_of(&mut c, &[w, x, ids, out])?;
                expect_close(c)
            },
        },
        Case {
            name: "GRAPH_RECOMPUTE without a stored graph",
            refs: "spec §8",
            run: |a| {
                let mut c = Conn::open(a)?;
                c.recompute(0)?;
                expect_close(c)
            },
        },
        Case {
            name: "GRAPH_RECOMPUTE after FREE_BUFFER of its buffer",
            refs: "issue #25703 (use after free)",
            run: |a| {
                let (mut c, h, base) = attacker(a)?;
                let x = t4(1, F32, [4, 1, 1, 1], h, base);
                let y = t4(2, F32, [4, 1, 1, 1], h, base + 64);
                let z = node(
                    t4(3, F32, [4, 1, 1, 1], h, base + 128),
                    op::ADD,
                    &[],
                    &[1, 2],
                );
                graph_of(&mut c, &[x, y, z])?;
                c.send(FREE_BUFFER, &h.to_le_bytes())?;
                c.recompute(0)?;
                expect_close(c)
            },
        },
    ]
}
