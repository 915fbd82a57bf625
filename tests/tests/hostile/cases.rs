//! The malicious requests, as a table: each [`Case`] is a name, the upstream report it
//! reproduces, the attacker's connection ([`Setup`]), the request(s) it sends ([`Attack`], built
//! with rpc-proto's encoders; malformed frames are valid ones corrupted, or raw frames from
//! `rpc_proto::encode_raw` / `FrameHeader`) and what the server must do ([`Expect`]). [`run`]
//! plays one. Tensors use the base address each buffer was given, so the same bytes work against
//! the stock server (absolute addresses) and ours (per-connection virtual ones).

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use rpc_proto::ggml_op as op;
use rpc_proto::ggml_type::{F16, F32, I32, I64, Q4_0, Q4_K, Q8_K, REMOVED_Q4_2};
use rpc_proto::{
    encode_graph, encode_raw, Command, FrameHeader, Major, Request, RpcTensor, SetTensorHeader,
    TensorBuilder, CONN_CAPS_SIZE, GGML_MAX_SRC, SET_TENSOR_HEADER_SIZE, TENSOR_FLAG_COMPUTE,
    TENSOR_FLAG_PARAM,
};

use super::client::{Buf, Conn};

/// How long a refused request may take to close the connection.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

const MIB: u64 = 1 << 20;

pub enum Verdict {
    /// The server refused the request.
    Refused,
    /// The server accepted it (computed a bad graph, returned data, ...).
    Accepted(String),
    /// The attack holds these connections open while the bystander and the fresh client are
    /// checked; refused if the server keeps serving them.
    Hold(Vec<Conn>),
}

/// The attacker's connection when the attack starts.
#[derive(Clone, Copy)]
pub enum Setup {
    /// None: the attack opens its own connections.
    Nothing,
    /// Connected, no HELLO yet.
    Connected,
    /// After HELLO.
    Hello,
    /// After HELLO, with a 1 MiB buffer (the [`Buf`] the attack gets).
    Buffer,
}

/// What the attacker sends.
#[derive(Clone, Copy)]
pub enum Attack {
    /// Bytes as they are: a malformed frame.
    Bytes(fn() -> Vec<u8>),
    /// Requests, one message each.
    Requests(fn(&Buf) -> Vec<Request<'static>>),
    /// GRAPH_COMPUTE on device 0 of these tensors, its one node the last of them.
    Graph(fn(&Buf) -> Vec<TensorBuilder>),
    /// Anything that needs the connection in between (inputs, a second buffer, a reply).
    Steps(fn(&mut Conn, &Buf) -> io::Result<()>),
    /// ALLOC_BUFFER of this many bytes on device 0.
    Alloc(u64),
    /// This many connections, each sending these bytes and then nothing.
    Silent(usize, fn() -> Vec<u8>),
}

/// What the server must do.
#[derive(Clone, Copy)]
pub enum Expect {
    /// Close the attacker's connection within [`CLOSE_WAIT`].
    Close,
    /// Answer ALLOC_BUFFER with a null handle and stay in sync.
    NullHandle,
    /// Keep serving everyone else while the attacker's connections stay open.
    KeepServing,
}

pub struct Case {
    pub name: &'static str,
    /// Upstream report or advisory this reproduces, if any.
    pub refs: &'static str,
    pub setup: Setup,
    pub attack: Attack,
    pub expect: Expect,
}

/// Every case, in the report's order.
pub fn all() -> Vec<Case> {
    [
        framing(),
        buffers(),
        graph_structure(),
        op_shapes(),
        fuzz_found(),
        fuzz_closed(),
        kernel_contracts(),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Plays `case` against the server at `addr`.
pub fn run(case: &Case, addr: SocketAddr) -> io::Result<Verdict> {
    let (mut c, buf) = match case.setup {
        Setup::Nothing => {
            let Attack::Silent(n, bytes) = case.attack else {
                return Err(io::Error::other(
                    "only a Silent attack opens its own connections",
                ));
            };
            let mut held = Vec::new();
            // From another address than the bystanders' (127.0.0.1): the server's per-peer
            // share applies to the attacker alone.
            let attacker = std::net::IpAddr::from([127, 0, 0, 2]);
            for _ in 0..n {
                let Ok(mut c) = Conn::connect_from(addr, attacker) else {
                    break;
                };
                let _ = c.send_bytes(&bytes());
                held.push(c);
            }
            return Ok(Verdict::Hold(held));
        }
        Setup::Connected => (Conn::connect(addr)?, Buf::default()),
        Setup::Hello => (Conn::open(addr)?, Buf::default()),
        Setup::Buffer => {
            let mut c = Conn::open(addr)?;
            let b = c.buffer(MIB)?;
            (c, b)
        }
    };
    let mut allocated = None;
    match case.attack {
        Attack::Bytes(f) => c.send_bytes(&f())?,
        Attack::Requests(f) => {
            for r in f(&buf) {
                c.send(&r)?;
            }
        }
        Attack::Graph(f) => graph_of(&mut c, &f(&buf))?,
        Attack::Steps(f) => f(&mut c, &buf)?,
        Attack::Alloc(size) => allocated = Some(c.alloc(size)?),
        Attack::Silent(..) => {
            return Err(io::Error::other(
                "a Silent attack opens its own connections",
            ))
        }
    }
    match case.expect {
        Expect::Close => expect_close(c),
        Expect::NullHandle => match allocated {
            Some(Some(b)) => Ok(Verdict::Accepted(format!(
                "handle {:#x} for {} bytes",
                b.handle, b.size
            ))),
            Some(None) => {
                c.ping()?;
                Ok(Verdict::Refused)
            }
            None => Err(io::Error::other("no ALLOC_BUFFER was sent")),
        },
        Expect::KeepServing => Ok(Verdict::Hold(vec![c])),
    }
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

/// Malformed bytes, sent as they are, on a connection in state `setup`; the server must close it.
fn bytes(name: &'static str, refs: &'static str, setup: Setup, f: fn() -> Vec<u8>) -> Case {
    Case {
        name,
        refs,
        setup,
        attack: Attack::Bytes(f),
        expect: Expect::Close,
    }
}

/// Well-formed requests the server must refuse by closing the connection.
fn requests(
    name: &'static str,
    refs: &'static str,
    setup: Setup,
    f: fn(&Buf) -> Vec<Request<'static>>,
) -> Case {
    Case {
        name,
        refs,
        setup,
        attack: Attack::Requests(f),
        expect: Expect::Close,
    }
}

/// A graph in the attacker's buffer the server must refuse by closing the connection.
fn graph(name: &'static str, refs: &'static str, f: fn(&Buf) -> Vec<TensorBuilder>) -> Case {
    Case {
        name,
        refs,
        setup: Setup::Buffer,
        attack: Attack::Graph(f),
        expect: Expect::Close,
    }
}

/// Steps on a connection with a buffer, the last of which the server must refuse by closing.
fn steps(name: &'static str, refs: &'static str, f: fn(&mut Conn, &Buf) -> io::Result<()>) -> Case {
    Case {
        name,
        refs,
        setup: Setup::Buffer,
        attack: Attack::Steps(f),
        expect: Expect::Close,
    }
}

/// A contiguous tensor of type `ty` and shape `ne` at `addr` in `buffer`.
fn tensor(id: u64, ty: u32, ne: [u32; 4], buffer: u64, addr: u64) -> TensorBuilder {
    TensorBuilder::new(id, ty).ne(&ne).data(buffer, addr)
}

/// `t` as a graph node: `op` with `params` over `srcs`, to be computed.
fn node(t: TensorBuilder, op: u32, params: &[i32], srcs: &[u64]) -> TensorBuilder {
    t.op(op, params).srcs(srcs).flags(TENSOR_FLAG_COMPUTE)
}

fn built(ts: &[TensorBuilder]) -> Vec<RpcTensor> {
    ts.iter().map(TensorBuilder::build).collect()
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
fn graph_of(c: &mut Conn, tensors: &[TensorBuilder]) -> io::Result<()> {
    let last = tensors.last().map(|t| t.build().id.get()).unwrap_or(1);
    c.graph(0, &[last], &built(tensors))
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// A request frame with `payload` under any command byte.
fn raw(cmd: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    encode_raw(cmd, payload, &mut f);
    f
}

/// GRAPH_COMPUTE's 7.0.0 payload.
fn graph_payload(device: u32, nodes: &[u64], tensors: &[RpcTensor]) -> Vec<u8> {
    let mut p = Vec::new();
    encode_graph(device, None, nodes, tensors, &mut p);
    p
}

/// GET_ALLOC_SIZE of `tensor` on device 0, without sources.
fn alloc_size(tensor: TensorBuilder) -> Request<'static> {
    Request::GetAllocSize {
        device: 0,
        tensor: tensor.build(),
        srcs: Box::new([RpcTensor::default(); GGML_MAX_SRC]),
    }
}

/// Framing and handshake.
fn framing() -> Vec<Case> {
    vec![
        requests(
            "first command is not HELLO",
            "spec §4.2",
            Setup::Connected,
            |_| vec![Request::DeviceCount],
        ),
        bytes(
            "0-byte HELLO (pre-4.0 client)",
            "spec §4.2",
            Setup::Connected,
            || raw(Command::Hello.as_u8(), &[]),
        ),
        requests(
            "second HELLO inside the session",
            "spec §4.2",
            Setup::Hello,
            |_| {
                vec![Request::Hello {
                    caps: [0; CONN_CAPS_SIZE],
                }]
            },
        ),
        bytes(
            "command 18 (RPC_CMD_NONE)",
            "spec §5.1",
            Setup::Hello,
            || raw(Major::V7.cmd_none(), &[]),
        ),
        bytes("command 255", "spec §5.1", Setup::Hello, || {
            raw(u8::MAX, &[0; 8])
        }),
        bytes(
            "fixed-size command with the wrong size",
            "spec §3.2",
            Setup::Hello,
            || raw(Command::GetAlignment.as_u8(), &[0; 5]),
        ),
        bytes(
            "SET_TENSOR announcing 2^63 bytes",
            "spec §3.2 (allocation before validation)",
            Setup::Hello,
            || {
                // The frame head of a null tensor's SET_TENSOR whose data would make it 2^63 bytes.
                let mut f = Vec::new();
                SetTensorHeader {
                    tensor: RpcTensor::default(),
                    cache_flag: 0,
                    offset: 0,
                }
                .encode_frame_head((1u64 << 63) - SET_TENSOR_HEADER_SIZE as u64, &mut f);
                f
            },
        ),
        bytes(
            "GRAPH_COMPUTE announcing 2^40 bytes",
            "spec §14 (unbounded req_size)",
            Setup::Hello,
            || {
                let mut f = FrameHeader::new(Command::GraphCompute, 1 << 40)
                    .encode()
                    .to_vec();
                f.extend_from_slice(&[0u8; 64]);
                f
            },
        ),
        bytes(
            "GRAPH_COMPUTE with n_nodes = 2^31 in a 16-byte body",
            "spec §14 (unbounded n_nodes)",
            Setup::Hello,
            || {
                // One node (id 0), no tensors; then n_nodes made 2^31 and the body cut to 16 bytes.
                let mut p = graph_payload(0, &[0], &[]);
                p[4..8].copy_from_slice(&(1u32 << 31).to_le_bytes());
                p.truncate(16);
                raw(Command::GraphCompute.as_u8(), &p)
            },
        ),
        bytes(
            "GRAPH_COMPUTE with more tensors than its body holds",
            "spec §7",
            Setup::Hello,
            || {
                // One node, one tensor; then n_tensors (after the node id) made 1000.
                let mut p = graph_payload(0, &[1], &[RpcTensor::new(1, F32)]);
                p[16..20].copy_from_slice(&1000u32.to_le_bytes());
                raw(Command::GraphCompute.as_u8(), &p)
            },
        ),
        Case {
            name: "200 silent connections (slowloris)",
            refs: "spec §15.4 (serial accept)",
            setup: Setup::Nothing,
            // Half a HELLO header, then silence.
            attack: Attack::Silent(200, || {
                FrameHeader::new(Command::Hello, CONN_CAPS_SIZE as u64).encode()[..2].to_vec()
            }),
            expect: Expect::KeepServing,
        },
    ]
}

/// Buffers and the data commands.
fn buffers() -> Vec<Case> {
    vec![
        Case {
            name: "ALLOC_BUFFER of 2^62 bytes",
            refs: "spec §14 (ALLOC_BUFFER unbounded)",
            setup: Setup::Hello,
            attack: Attack::Alloc(1 << 62),
            expect: Expect::NullHandle,
        },
        requests(
            "ALLOC_BUFFER on device 7",
            "spec §13.3",
            Setup::Hello,
            |_| {
                vec![Request::AllocBuffer {
                    device: 7,
                    size: 4096,
                }]
            },
        ),
        requests(
            "BUFFER_GET_BASE of an unknown handle",
            "spec §13.4",
            Setup::Hello,
            |_| {
                vec![Request::BufferGetBase {
                    remote_ptr: 0x4141_4141_4141_4141,
                }]
            },
        ),
        requests(
            "FREE_BUFFER twice (double free)",
            "spec §13.4",
            Setup::Buffer,
            |b| {
                let free = Request::FreeBuffer {
                    remote_ptr: b.handle,
                };
                vec![free.clone(), free]
            },
        ),
        requests(
            "BUFFER_CLEAR of a freed buffer (use after free)",
            "spec §13.4",
            Setup::Buffer,
            |b| {
                vec![
                    Request::FreeBuffer {
                        remote_ptr: b.handle,
                    },
                    Request::BufferClear {
                        remote_ptr: b.handle,
                        value: 0x41,
                    },
                ]
            },
        ),
        steps(
            "SET_TENSOR past the end of its buffer (heap write)",
            "spec §9",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let t = tensor(1, F32, [16, 1, 1, 1], h, base);
                c.set_tensor(t, MIB - 8, &[0x41; 64])?;
                Ok(())
            },
        ),
        steps(
            "SET_TENSOR with data+offset wrapping past 2^64",
            "spec §9, §14 (wrapping data+offset)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                // data + offset wraps to base + 16: inside the buffer for a naive range check, then
                // ggml_backend_tensor_set sees offset + size > nbytes (stock: GGML_ASSERT abort).
                let t = tensor(1, F32, [16, 1, 1, 1], h, base + 32);
                c.set_tensor(t, 0u64.wrapping_sub(16), &[0x41; 32])?;
                Ok(())
            },
        ),
        requests(
            "GET_TENSOR past the end of its buffer (heap read)",
            "spec §9",
            Setup::Buffer,
            |b| {
                vec![Request::GetTensor {
                    tensor: tensor(1, F32, [16, 1, 1, 1], b.handle, b.base).build(),
                    offset: 0,
                    size: 2 * MIB,
                }]
            },
        ),
        requests(
            "GET_TENSOR with a wrapping offset",
            "spec §14 (wrapping data+offset)",
            Setup::Buffer,
            |b| {
                vec![Request::GetTensor {
                    tensor: tensor(1, F32, [16, 1, 1, 1], b.handle, b.base + 0x200).build(),
                    offset: 0u64.wrapping_sub(0x100),
                    size: 64,
                }]
            },
        ),
        requests(
            "MEMSET_TENSOR past its tensor",
            "spec §9",
            Setup::Buffer,
            |b| {
                vec![Request::MemsetTensor {
                    tensor: tensor(1, F32, [16, 1, 1, 1], b.handle, b.base + MIB - 64).build(),
                    offset: 0,
                    size: 4096,
                    value: 0x41,
                }]
            },
        ),
        steps(
            "tensor data outside its buffer (deserialize assert)",
            "spec §6.2, §14 (GGML_ASSERT abort)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let t = tensor(1, F32, [16, 1, 1, 1], h, base + 4 * MIB);
                c.set_tensor(t, 0, &[0x41; 16])?;
                Ok(())
            },
        ),
        steps(
            "tensor extent overflowing 64 bits",
            "spec §6.2 (ggml_nbytes overflow)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let t = TensorBuilder::new(1, F32)
                    .ne(&[u32::MAX; 4])
                    .nb([u32::MAX; 4])
                    .data(h, base);
                c.set_tensor(t, 0, &[0x41; 16])?;
                Ok(())
            },
        ),
        steps("tensor of removed type 4 (Q4_2)", "issue #13067", |c, b| {
            let (h, base) = (b.handle, b.base);
            let t = TensorBuilder::new(1, REMOVED_Q4_2)
                .ne(&[32, 1, 1, 1])
                .nb([20, 20, 20, 20])
                .data(h, base);
            c.set_tensor(t, 0, &[0x41; 16])?;
            Ok(())
        }),
        steps("tensor of type 1000", "issue #13067", |c, b| {
            let (h, base) = (b.handle, b.base);
            let t = TensorBuilder::new(1, 1000)
                .ne(&[4, 1, 1, 1])
                .nb([4, 16, 16, 16])
                .data(h, base);
            c.set_tensor(t, 0, &[0x41; 16])?;
            Ok(())
        }),
        requests(
            "Q4_0 tensor with ne[0] = 33 (not whole blocks)",
            "issue #25288",
            Setup::Buffer,
            |b| {
                vec![alloc_size(
                    TensorBuilder::new(1, Q4_0)
                        .ne(&[33, 1, 1, 1])
                        .nb([18, 36, 36, 36])
                        .data(b.handle, b.base),
                )]
            },
        ),
        requests(
            "GET_ALLOC_SIZE of a tensor with 2^64 elements (found by fuzzing)",
            "ggml_new_tensor int64 overflow assert",
            Setup::Hello,
            |_| {
                vec![alloc_size(
                    TensorBuilder::new(1, F32).ne(&[65536; 4]).nb([4, 4, 4, 4]),
                )]
            },
        ),
        graph(
            "FLASH_ATTN_EXT with an unknown precision (found by fuzzing)",
            "GGML_ABORT in the CPU kernel",
            |b| {
                let (h, base) = (b.handle, b.base);
                let q = tensor(1, F32, [16, 1, 1, 1], h, base);
                let k = TensorBuilder::new(2, F16)
                    .ne(&[16, 4, 1, 1])
                    .nb([2, 32, 128, 128])
                    .data(h, base + 4096);
                let v = TensorBuilder::new(3, F16)
                    .ne(&[16, 4, 1, 1])
                    .nb([2, 32, 128, 128])
                    .data(h, base + 8192);
                let mut p = [0i32; 16];
                p[0] = 1f32.to_bits() as i32;
                p[3] = 77; // precision
                let out = node(
                    tensor(4, F32, [16, 1, 1, 1], h, base + 65536),
                    op::FLASH_ATTN_EXT,
                    &p,
                    &[1, 2, 3],
                );
                vec![q, k, v, out]
            },
        ),
        graph(
            "RMS_NORM result overlapping its source 16 bytes later (found by fuzzing)",
            "overlapping memcpy in the CPU kernel (ASan)",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [4096, 1, 1, 1], h, base);
                let mut p = [0i32; 16];
                p[0] = 1e-6f32.to_bits() as i32;
                let out = node(
                    tensor(2, F32, [4096, 1, 1, 1], h, base + 16),
                    op::RMS_NORM,
                    &p,
                    &[1],
                );
                vec![x, out]
            },
        ),
        steps(
            "COPY_TENSOR into a smaller destination (cpy_tensor overflow)",
            "GHSA-5vm9-p64x-gqw9 style",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let Buf {
                    handle: h2,
                    base: base2,
                } = c.buffer(4096)?;
                c.send(&Request::CopyTensor {
                    src: tensor(1, F32, [65536, 1, 1, 1], h, base).build(),
                    dst: tensor(2, F32, [4, 1, 1, 1], h2, base2 + 4096 - 16).build(),
                })
            },
        ),
        requests(
            "COPY_TENSOR from a tensor without a buffer (NULL buffer)",
            "GHSA-wcr5-566p-9cwj style",
            Setup::Buffer,
            |b| {
                vec![Request::CopyTensor {
                    src: tensor(1, F32, [16, 1, 1, 1], 0, 0x4141_4141_4141).build(),
                    dst: tensor(2, F32, [16, 1, 1, 1], b.handle, b.base).build(),
                }]
            },
        ),
        requests(
            "INIT_TENSOR with a tensor outside its buffer",
            "spec §9",
            Setup::Buffer,
            |b| {
                vec![Request::InitTensor {
                    tensor: tensor(1, F32, [1024, 1, 1, 1], b.handle, b.base + MIB - 16).build(),
                }]
            },
        ),
        requests(
            "GET_ALLOC_SIZE with a tensor outside its buffer",
            "spec §9 (deserialize assert)",
            Setup::Buffer,
            |b| {
                vec![alloc_size(tensor(
                    1,
                    F32,
                    [1024, 1, 1, 1],
                    b.handle,
                    b.base + MIB - 16,
                ))]
            },
        ),
    ]
}

/// Graph structure.
fn graph_structure() -> Vec<Case> {
    vec![
        graph(
            "MAP_CUSTOM1 with a function pointer in op_params",
            "issue #25289 (remote code execution)",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [4, 1, 1, 1], h, base);
                let y = node(
                    tensor(2, F32, [4, 1, 1, 1], h, base + 64),
                    op::MAP_CUSTOM1,
                    &[0x4141_4141, 0x4141_4141, -1, 0, 0],
                    &[1],
                );
                vec![x, y]
            },
        ),
        graph(
            "GGML_OP_CUSTOM with a function pointer in op_params",
            "issue #25289",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [4, 1, 1, 1], h, base);
                let y = node(
                    tensor(2, F32, [4, 1, 1, 1], h, base + 64),
                    op::CUSTOM,
                    &[0x4141_4141, 0x4141_4141, 1, 0, 0],
                    &[1],
                );
                vec![x, y]
            },
        ),
        graph("op 0xFFFFFFFF", "issue #25289 (op not validated)", |b| {
            let (h, base) = (b.handle, b.base);
            let x = tensor(1, F32, [4, 1, 1, 1], h, base);
            let y = node(
                tensor(2, F32, [4, 1, 1, 1], h, base + 64),
                u32::MAX,
                &[],
                &[1],
            );
            vec![x, y]
        }),
        steps("node id 0 (NULL node)", "spec §7.5, §14", |c, b| {
            let (h, base) = (b.handle, b.base);
            let x = tensor(1, F32, [4, 1, 1, 1], h, base);
            c.graph(0, &[0], &built(&[x]))?;
            Ok(())
        }),
        graph("node naming an unknown tensor id", "spec §7", |b| {
            let (h, base) = (b.handle, b.base);
            let x = tensor(1, F32, [4, 1, 1, 1], h, base);
            let y = node(
                tensor(2, F32, [4, 1, 1, 1], h, base + 64),
                op::ADD,
                &[],
                &[1, 77],
            );
            vec![x, y]
        }),
        steps("two nodes in a cycle", "spec §14", |c, b| {
            let (h, base) = (b.handle, b.base);
            let x = node(tensor(1, F32, [4, 1, 1, 1], h, base), op::ADD, &[], &[2, 2]);
            let y = node(
                tensor(2, F32, [4, 1, 1, 1], h, base + 64),
                op::ADD,
                &[],
                &[1, 1],
            );
            c.graph(0, &[2], &built(&[x, y]))?;
            Ok(())
        }),
        steps(
            "100,000-deep source chain closing a cycle (stack exhaustion)",
            "spec §7.5 (recursive create_node)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let n: u64 = 100_000;
                let mut ts = vec![tensor(n + 1, F32, [4, 1, 1, 1], h, base)];
                for i in 1..=n {
                    let prev = if i == 1 { n } else { i - 1 };
                    ts.push(node(
                        tensor(i, F32, [4, 1, 1, 1], h, base + 64),
                        op::ADD,
                        &[],
                        &[prev, n + 1],
                    ));
                }
                c.graph(0, &[n], &built(&ts))?;
                Ok(())
            },
        ),
        steps("GRAPH_COMPUTE on device 9", "spec §13.3", |c, b| {
            let (h, base) = (b.handle, b.base);
            let x = tensor(1, F32, [4, 1, 1, 1], h, base);
            c.graph(9, &[1], &built(&[x]))?;
            Ok(())
        }),
        graph(
            "tensor with a data pointer but no buffer",
            "GHSA-wcr5-566p-9cwj, PR #20908 (NULL buffer skipped checks)",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [4, 1, 1, 1], 0, 0x4141_4141_4141);
                let b = tensor(2, F32, [4, 1, 1, 1], h, base);
                let y = node(
                    tensor(3, F32, [4, 1, 1, 1], h, base + 64),
                    op::ADD,
                    &[],
                    &[1, 2],
                );
                vec![x, b, y]
            },
        ),
        graph(
            "graph source outside its buffer",
            "spec §6.2 (deserialize assert)",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [4, 1, 1, 1], h, base + 2 * MIB);
                let b = tensor(2, F32, [4, 1, 1, 1], h, base);
                let y = node(
                    tensor(3, F32, [4, 1, 1, 1], h, base + 64),
                    op::ADD,
                    &[],
                    &[1, 2],
                );
                vec![x, b, y]
            },
        ),
    ]
}

/// Per-op shapes, strides and parameters.
fn op_shapes() -> Vec<Case> {
    vec![
        steps(
            "GET_ROWS reading past src0 (ne[2] mismatch)",
            "issue #26825",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                // src0: 4 x 2 rows x 1 matrix at the end of the buffer; rows ask for matrix 7.
                let src = tensor(1, F32, [4, 2, 1, 1], h, base + MIB - 32);
                let rows = tensor(2, I32, [1, 8, 1, 1], h, base);
                c.set_tensor(rows, 0, &i32_bytes(&[0; 8]))?;
                let out = node(
                    tensor(3, F32, [4, 1, 8, 1], h, base + 4096),
                    op::GET_ROWS,
                    &[],
                    &[1, 2],
                );
                graph_of(c, &[src, rows, out])?;
                Ok(())
            },
        ),
        steps(
            "GET_ROWS with a row id out of range",
            "issue #26825 (data-dependent)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let src = tensor(1, F32, [4, 2, 1, 1], h, base + MIB - 32);
                let rows = tensor(2, I32, [1, 1, 1, 1], h, base);
                c.set_tensor(rows, 0, &i32_bytes(&[100_000]))?;
                let out = node(
                    tensor(3, F32, [4, 1, 1, 1], h, base + 4096),
                    op::GET_ROWS,
                    &[],
                    &[1, 2],
                );
                graph_of(c, &[src, rows, out])?;
                Ok(())
            },
        ),
        steps(
            "SET_ROWS writing past its destination (ne[2] mismatch)",
            "issue #26912",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let Buf {
                    handle: h2,
                    base: base2,
                } = c.buffer(64)?;
                // destination: 4 x 2 x 1 in a 64-byte buffer; values claim 4 x 1 x 8.
                let dst = tensor(1, F32, [4, 2, 1, 1], h2, base2);
                let vals = tensor(2, F32, [4, 1, 8, 1], h, base);
                let ids = tensor(3, I64, [1, 1, 1, 1], h, base + 4096)
                    .ne(&[1, 1, 1, 1])
                    .nb([8, 8, 8, 8]);
                c.set_tensor(ids, 0, &0i64.to_le_bytes())?;
                let out = node(
                    tensor(4, F32, [4, 2, 1, 1], h2, base2),
                    op::SET_ROWS,
                    &[],
                    &[2, 3, 1],
                )
                .view(1, 0);
                graph_of(c, &[dst, vals, ids, out])?;
                Ok(())
            },
        ),
        steps(
            "SET_ROWS with a row id out of range",
            "issue #26912 (data-dependent)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let dst = tensor(1, F32, [4, 2, 1, 1], h, base + MIB - 32);
                let vals = tensor(2, F32, [4, 1, 1, 1], h, base);
                let ids = TensorBuilder::new(3, I64)
                    .ne(&[1, 1, 1, 1])
                    .nb([8, 8, 8, 8])
                    .data(h, base + 4096);
                c.set_tensor(ids, 0, &1_000_000i64.to_le_bytes())?;
                let out = node(
                    tensor(4, F32, [4, 2, 1, 1], h, base + MIB - 32),
                    op::SET_ROWS,
                    &[],
                    &[2, 3, 1],
                )
                .view(1, 0);
                graph_of(c, &[dst, vals, ids, out])?;
                Ok(())
            },
        ),
        steps(
            "row ids made out of range before GRAPH_RECOMPUTE",
            "issue #26912 (checked at recompute)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let dst = tensor(1, F32, [4, 2, 1, 1], h, base + MIB - 32);
                let vals = tensor(2, F32, [4, 1, 1, 1], h, base);
                let ids = TensorBuilder::new(3, I64)
                    .ne(&[1, 1, 1, 1])
                    .nb([8, 8, 8, 8])
                    .data(h, base + 4096);
                c.set_tensor(ids, 0, &1i64.to_le_bytes())?;
                let out = node(
                    tensor(4, F32, [4, 2, 1, 1], h, base + MIB - 32),
                    op::SET_ROWS,
                    &[],
                    &[2, 3, 1],
                )
                .view(1, 0);
                graph_of(c, &[dst, vals, ids, out])?;
                c.ping()?; // the valid graph ran
                c.set_tensor(ids, 0, &(1i64 << 40).to_le_bytes())?;
                c.recompute(0)?;
                Ok(())
            },
        ),
        graph(
            "MUL_MAT with K larger than src1's rows (heap read)",
            "spec §14 (no shape validation)",
            |b| {
                let (h, base) = (b.handle, b.base);
                let w = tensor(1, F32, [4096, 4, 1, 1], h, base);
                let x = tensor(2, F32, [16, 1, 1, 1], h, base + MIB - 64);
                let out = node(
                    tensor(3, F32, [4, 1, 1, 1], h, base + 65536),
                    op::MUL_MAT,
                    &[],
                    &[1, 2],
                );
                vec![w, x, out]
            },
        ),
        steps(
            "MUL_MAT result larger than the product (heap write)",
            "spec §14 (no shape validation)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let Buf {
                    handle: h2,
                    base: base2,
                } = c.buffer(64)?;
                let w = tensor(1, F32, [16, 64, 1, 1], h, base);
                let x = tensor(2, F32, [16, 64, 1, 1], h, base + 8192);
                // the product is 64 x 64; the result claims 4 x 4 in a 64-byte buffer
                let out = node(
                    tensor(3, F32, [4, 4, 1, 1], h2, base2),
                    op::MUL_MAT,
                    &[],
                    &[1, 2],
                );
                graph_of(c, &[w, x, out])?;
                Ok(())
            },
        ),
        steps(
            "MUL_MAT_ID with an expert id out of range",
            "spec §14 (data-dependent index)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let experts = tensor(1, F32, [8, 4, 2, 1], h, base);
                let x = tensor(2, F32, [8, 1, 1, 1], h, base + 4096);
                let ids = tensor(3, I32, [1, 1, 1, 1], h, base + 8192);
                c.set_tensor(ids, 0, &i32_bytes(&[1 << 20]))?;
                let out = node(
                    tensor(4, F32, [4, 1, 1, 1], h, base + 16384),
                    op::MUL_MAT_ID,
                    &[],
                    &[1, 2, 3],
                );
                graph_of(c, &[experts, x, ids, out])?;
                Ok(())
            },
        ),
        steps(
            "ADD_ID with ids out of range",
            "spec §14 (data-dependent index)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [4, 2, 1, 1], h, base);
                let b = tensor(2, F32, [4, 2, 1, 1], h, base + 4096);
                let ids = tensor(3, I32, [2, 1, 1, 1], h, base + 8192);
                c.set_tensor(ids, 0, &i32_bytes(&[0, 1 << 24]))?;
                let out = node(
                    tensor(4, F32, [4, 2, 1, 1], h, base + 16384),
                    op::ADD_ID,
                    &[],
                    &[1, 2, 3],
                );
                graph_of(c, &[x, b, ids, out])?;
                Ok(())
            },
        ),
        steps(
            "CPY into a smaller destination",
            "GHSA-mqp6-7pv6-fqjf style (cpy)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let Buf {
                    handle: h2,
                    base: base2,
                } = c.buffer(64)?;
                let src = tensor(1, F32, [4096, 1, 1, 1], h, base);
                let dst = tensor(2, F32, [4, 1, 1, 1], h2, base2);
                let out = node(
                    tensor(3, F32, [4, 1, 1, 1], h2, base2),
                    op::CPY,
                    &[],
                    &[1, 2],
                )
                .view(2, 0);
                graph_of(c, &[src, dst, out])?;
                Ok(())
            },
        ),
        graph(
            "CONCAT result larger than its sources (heap read)",
            "spec §14 (no shape validation)",
            |b| {
                let (h, base) = (b.handle, b.base);
                // 4x2 + 4x2 rows, result claims 4x64: the kernel reads src[1] rows 0..61, from the
                // last 32 bytes of the buffer onwards.
                let x = tensor(1, F32, [4, 2, 1, 1], h, base);
                let y = tensor(2, F32, [4, 2, 1, 1], h, base + MIB - 32);
                let out = node(
                    tensor(3, F32, [4, 64, 1, 1], h, base + 4096),
                    op::CONCAT,
                    &[1],
                    &[1, 2],
                );
                vec![x, y, out]
            },
        ),
        graph(
            "ACC with a negative offset (write before the buffer)",
            "spec §14 (op_params as offsets)",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [16, 1, 1, 1], h, base);
                let y = tensor(2, F32, [4, 1, 1, 1], h, base + 4096);
                let out = node(
                    tensor(3, F32, [16, 1, 1, 1], h, base),
                    op::ACC,
                    &[64, 64, 64, -4096, 1],
                    &[1, 2],
                )
                .view(1, 0);
                vec![x, y, out]
            },
        ),
        graph(
            "ROPE with n_dims larger than the row",
            "spec §14 (op_params as sizes)",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [4, 1, 1, 1], h, base + MIB - 16);
                let pos = tensor(2, I32, [1, 1, 1, 1], h, base);
                let mut p = [0i32; 16];
                p[1] = 4096; // n_dims
                p[5] = 10000f32.to_bits() as i32;
                p[6] = 1f32.to_bits() as i32;
                p[8] = 1f32.to_bits() as i32;
                let out = node(
                    tensor(3, F32, [4, 1, 1, 1], h, base + 4096),
                    op::ROPE,
                    &p,
                    &[1, 2],
                );
                vec![x, pos, out]
            },
        ),
        graph(
            "nb[0] = 0 on a source read as whole rows",
            "spec §6.2 (nb not validated)",
            |b| {
                let (h, base) = (b.handle, b.base);
                // 65536 floats claimed, extent 4 bytes at the very end of the buffer.
                let x = TensorBuilder::new(1, F32)
                    .ne(&[65536, 1, 1, 1])
                    .nb([0, 0, 0, 0])
                    .data(h, base + MIB - 4);
                let mut p = [0i32; 16];
                p[0] = 1e-6f32.to_bits() as i32;
                let out = node(
                    tensor(2, F32, [65536, 1, 1, 1], h, base),
                    op::RMS_NORM,
                    &p,
                    &[1],
                );
                vec![x, out]
            },
        ),
        graph(
            "FLASH_ATTN_EXT with a mask smaller than the scores (heap read)",
            "spec §14 (no shape validation)",
            |b| {
                let (h, base) = (b.handle, b.base);
                let q = tensor(1, F32, [16, 8, 1, 1], h, base);
                let k = TensorBuilder::new(2, F16)
                    .ne(&[16, 256, 1, 1])
                    .nb([2, 32, 8192, 8192])
                    .data(h, base + 4096);
                let v = TensorBuilder::new(3, F16)
                    .ne(&[16, 256, 1, 1])
                    .nb([2, 32, 8192, 8192])
                    .data(h, base + 16384);
                let m = TensorBuilder::new(4, F16)
                    .ne(&[1, 1, 1, 1])
                    .nb([2, 2, 2, 2])
                    .data(h, base + MIB - 2);
                let mut p = [0i32; 16];
                p[0] = 1f32.to_bits() as i32;
                let out = node(
                    tensor(5, F32, [16, 1, 8, 1], h, base + 65536),
                    op::FLASH_ATTN_EXT,
                    &p,
                    &[1, 2, 3, 4],
                );
                vec![q, k, v, m, out]
            },
        ),
    ]
}

/// Found by the `ops` fuzz target (fuzz/seeds/ops/regressions).
fn fuzz_found() -> Vec<Case> {
    vec![
        graph(
            "MUL_MAT with the Hadamard hint: ne10 floats into a shorter result row (heap write)",
            "fuzz ops: ggml_compute_forward_fwht",
            |b| {
                let (h, base) = (b.handle, b.base);
                let w = tensor(1, F32, [64, 4, 1, 1], h, base);
                let x = tensor(2, F32, [64, 1, 1, 1], h, base + 4096);
                // A 4-float result row at the very end of the buffer; the transform writes 64.
                let out = node(
                    tensor(3, F32, [4, 1, 1, 1], h, base + MIB - 16),
                    op::MUL_MAT,
                    &[0, 1],
                    &[1, 2],
                );
                vec![w, x, out]
            },
        ),
        graph(
            "OPT_STEP_ADAMW with zero-strided moments at the buffer's end (heap write)",
            "fuzz ops: ggml_compute_forward_opt_step_adamw_f32",
            |b| {
                let (h, base) = (b.handle, b.base);
                let w = tensor(1, F32, [16, 64, 1, 1], h, base).flags(TENSOR_FLAG_PARAM);
                let g = tensor(2, F32, [16, 64, 1, 1], h, base + 8192);
                // One 64-byte row each, claimed 64 times: the kernel uses the weight's row stride.
                let m = TensorBuilder::new(3, F32)
                    .ne(&[16, 64, 1, 1])
                    .nb([4, 0, 0, 0])
                    .data(h, base + MIB - 128);
                let v = TensorBuilder::new(4, F32)
                    .ne(&[16, 64, 1, 1])
                    .nb([4, 0, 0, 0])
                    .data(h, base + MIB - 64);
                let p = tensor(5, F32, [7, 1, 1, 1], h, base + 16384);
                let out = node(
                    tensor(6, F32, [16, 64, 1, 1], h, base),
                    op::OPT_STEP_ADAMW,
                    &[],
                    &[1, 2, 3, 4, 5],
                )
                .view(1, 0);
                vec![w, g, m, v, p, out]
            },
        ),
        graph(
            "ROPE on an odd row at the buffer's end (heap write)",
            "fuzz ops: ggml_compute_forward_rope_flt",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [3, 1, 1, 1], h, base);
                let pos = tensor(2, I32, [1, 1, 1, 1], h, base + 4096);
                let mut p = [0i32; 16];
                p[1] = 2; // n_dims
                p[5] = 10000f32.to_bits() as i32;
                p[6] = 1f32.to_bits() as i32;
                p[8] = 1f32.to_bits() as i32;
                // 3 floats at the very end; the copy of the unrotated pair writes a 4th.
                let out = node(
                    tensor(3, F32, [3, 1, 1, 1], h, base + MIB - 12),
                    op::ROPE,
                    &p,
                    &[1, 2],
                );
                vec![x, pos, out]
            },
        ),
        graph(
            "CLAMP f16 with a zero outer stride at the buffer's end (heap write)",
            "fuzz ops: ggml_compute_forward_clamp_f16",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = TensorBuilder::new(1, F16)
                    .ne(&[4, 1, 1, 64])
                    .nb([2, 8, 8, 0])
                    .data(h, base);
                let mut p = [0i32; 16];
                p[0] = (-1f32).to_bits() as i32;
                p[1] = 1f32.to_bits() as i32;
                // One 8-byte row claimed 64 times; the kernel writes row j at j*nb[1].
                let out = node(
                    TensorBuilder::new(2, F16)
                        .ne(&[4, 1, 1, 64])
                        .nb([2, 8, 8, 0])
                        .data(h, base + MIB - 8),
                    op::CLAMP,
                    &p,
                    &[1],
                );
                vec![x, out]
            },
        ),
        graph(
            "OUT_PROD into a zero-strided result at the buffer's end (heap write)",
            "fuzz ops: ggml_compute_forward_out_prod_f32",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [2, 3, 1, 1], h, base);
                let y = tensor(2, F32, [64, 3, 1, 1], h, base + 4096);
                // 2x64 floats claimed in 8 bytes; the kernel zeroes all 128 first.
                let out = node(
                    TensorBuilder::new(3, F32)
                        .ne(&[2, 64, 1, 1])
                        .nb([4, 0, 0, 0])
                        .data(h, base + MIB - 8),
                    op::OUT_PROD,
                    &[],
                    &[1, 2],
                );
                vec![x, y, out]
            },
        ),
        graph(
            "FLASH_ATTN_EXT into a padded result at the buffer's end (heap write)",
            "fuzz ops: ggml_compute_forward_flash_attn_ext_f16_one_chunk",
            |b| {
                let (h, base) = (b.handle, b.base);
                let q = tensor(1, F32, [32, 4, 1, 1], h, base);
                let kv = |id, at| TensorBuilder::new(id, F16).ne(&[32, 16, 1, 1]).data(h, at);
                let (k, v) = (kv(2, base + 4096), kv(3, base + 8192));
                let mut p = [0i32; 16];
                p[0] = 0.125f32.to_bits() as i32;
                // Rows of 32 floats 256 bytes apart: extent 896 bytes; the kernel copies 256
                // bytes to row 3 at 3*256.
                let out = node(
                    TensorBuilder::new(4, F32)
                        .ne(&[32, 1, 4, 1])
                        .nb([4, 256, 256, 1024])
                        .data(h, base + MIB - 896),
                    op::FLASH_ATTN_EXT,
                    &p,
                    &[1, 2, 3],
                );
                vec![q, k, v, out]
            },
        ),
        graph(
            "SOFT_MAX with an empty sinks tensor at the buffer's end (heap read)",
            "fuzz ops: ggml_compute_forward_soft_max_f32",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [4, 1, 1, 1], h, base);
                // ne0 = 1 sink claimed, but no elements: extent 0 at the very end.
                let sinks = TensorBuilder::new(2, F32)
                    .ne(&[1, 1, 1, 0])
                    .nb([4, 4, 4, 4])
                    .data(h, base + MIB);
                let mut p = [0i32; 16];
                p[0] = 1f32.to_bits() as i32;
                let out = node(
                    tensor(3, F32, [4, 1, 1, 1], h, base + 4096),
                    op::SOFT_MAX,
                    &p,
                    &[1, 0, 2],
                );
                vec![x, sinks, out]
            },
        ),
    ]
}

/// Open findings of the ops fuzz target, closed (fuzz/seeds/ops/regressions).
fn fuzz_closed() -> Vec<Case> {
    vec![
        graph(
            "CLAMP f32 with a zero outer stride at the buffer's end (heap write)",
            "fuzz ops: ggml_compute_forward_clamp_f32",
            |b| {
                let (h, base) = (b.handle, b.base);
                // One 16-byte row claimed 64 times; the kernel writes row j at j*nb[1].
                let shape = ([4, 1, 1, 64], [4, 16, 16, 0]);
                let x = TensorBuilder::new(1, F32)
                    .ne(&shape.0)
                    .nb(shape.1)
                    .data(h, base);
                let out = node(
                    TensorBuilder::new(2, F32)
                        .ne(&shape.0)
                        .nb(shape.1)
                        .data(h, base + MIB - 16),
                    op::CLAMP,
                    &[(-1f32).to_bits() as i32, 1f32.to_bits() as i32],
                    &[1],
                );
                vec![x, out]
            },
        ),
        graph(
            "SCALE into rows 64 bytes apart in a 32-byte result (heap write)",
            "fuzz ops: ggml_compute_forward_scale_f32",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [4, 1, 1, 2], h, base);
                // Contiguous by ggml's definition (ne[1] = 1 leaves nb[1] free), extent 32
                // bytes; the kernel writes row 1 at 1*nb[1] = 64.
                let out = node(
                    TensorBuilder::new(2, F32)
                        .ne(&[4, 1, 1, 2])
                        .nb([4, 64, 16, 16])
                        .data(h, base + MIB - 32),
                    op::SCALE,
                    &[2f32.to_bits() as i32, 0],
                    &[1],
                );
                vec![x, out]
            },
        ),
        graph(
            "SILU_BACK into rows 64 bytes apart in a 32-byte result (heap write)",
            "fuzz ops: ggml_compute_forward_silu_back_f32",
            |b| {
                let (h, base) = (b.handle, b.base);
                let g = tensor(1, F32, [4, 1, 1, 2], h, base);
                let x = tensor(2, F32, [4, 1, 1, 2], h, base + 4096);
                let out = node(
                    TensorBuilder::new(3, F32)
                        .ne(&[4, 1, 1, 2])
                        .nb([4, 64, 64, 16])
                        .data(h, base + MIB - 32),
                    op::SILU_BACK,
                    &[],
                    &[1, 2],
                );
                vec![g, x, out]
            },
        ),
        graph(
            "CUMSUM into a one-element row with nb[0] = 0 (GGML_ASSERT)",
            "fuzz ops: ggml_compute_forward_cumsum_f32",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [1, 1, 1, 1], h, base);
                let out = node(
                    TensorBuilder::new(2, F32)
                        .ne(&[1, 1, 1, 1])
                        .nb([0, 4, 4, 4])
                        .data(h, base + 4096),
                    op::CUMSUM,
                    &[],
                    &[1],
                );
                vec![x, out]
            },
        ),
        graph(
            "DIAG_MASK_INF into one-element rows with nb[0] = 12 (GGML_ASSERT)",
            "fuzz ops: ggml_compute_forward_diag_mask_f32",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [1, 3, 1, 1], h, base);
                let out = node(
                    TensorBuilder::new(2, F32)
                        .ne(&[1, 3, 1, 1])
                        .nb([12, 4, 12, 12])
                        .data(h, base + 4096),
                    op::DIAG_MASK_INF,
                    &[0],
                    &[1],
                );
                vec![x, out]
            },
        ),
        graph(
            "DIAG_MASK_ZERO of a one-element row with nb[0] = 0 (GGML_ASSERT)",
            "fuzz ops: ggml_compute_forward_diag_mask_f32",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = TensorBuilder::new(1, F32)
                    .ne(&[1, 1, 1, 1])
                    .nb([0, 4, 4, 4])
                    .data(h, base);
                let out = node(
                    tensor(2, F32, [1, 1, 1, 1], h, base + 4096),
                    op::DIAG_MASK_ZERO,
                    &[0],
                    &[1],
                );
                vec![x, out]
            },
        ),
        graph(
            "DIAG_MASK_INF with a free plane stride (ne[2] = 1) at the buffer's end (heap write)",
            "ggml_compute_forward_diag_mask_f32 (planes k*nb[2], k < ne2*ne3)",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [4, 4, 1, 2], h, base);
                // Contiguous by ggml's definition (ne[2] = 1 leaves nb[2] free), extent 128
                // bytes; the kernel masks plane 1 at 1*nb[2] = 1024.
                let out = node(
                    TensorBuilder::new(2, F32)
                        .ne(&[4, 4, 1, 2])
                        .nb([4, 16, 1024, 64])
                        .data(h, base + MIB - 128),
                    op::DIAG_MASK_INF,
                    &[0],
                    &[1],
                );
                vec![x, out]
            },
        ),
        graph(
            "REPEAT into one-element rows with nb[0] = 0 (GGML_ASSERT)",
            "fuzz ops: ggml_compute_forward_repeat_f32",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [1, 2, 2, 2], h, base);
                let out = node(
                    TensorBuilder::new(2, F32)
                        .ne(&[1, 4, 2, 2])
                        .nb([0, 4, 16, 32])
                        .data(h, base + 4096),
                    op::REPEAT,
                    &[],
                    &[1],
                );
                vec![x, out]
            },
        ),
        graph(
            "GROUP_NORM with INT_MAX groups for 1 channel (CPU for minutes)",
            "fuzz ops: ggml_compute_forward_group_norm_f32",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [4, 1, 1, 4], h, base);
                let out = node(
                    tensor(2, F32, [4, 1, 1, 4], h, base + 4096),
                    op::GROUP_NORM,
                    &[i32::MAX, 1e-6f32.to_bits() as i32],
                    &[1],
                );
                vec![x, out]
            },
        ),
        graph(
            "POOL_2D over planes 4 bytes apart (ne[2] = 1) at the buffer's end (heap write)",
            "fuzz ops: ggml_compute_forward_pool_2d",
            |b| {
                let (h, base) = (b.handle, b.base);
                // Contiguous by ggml's definition; the kernel steps nb[2] = 4 bytes through the
                // 104-byte source (26 planes) and writes a 7-float plane for each: 728 bytes.
                let x = TensorBuilder::new(1, F32)
                    .ne(&[13, 1, 1, 2])
                    .nb([4, 52, 4, 52])
                    .data(h, base);
                let out = node(
                    tensor(2, F32, [7, 1, 1, 2], h, base + MIB - 56),
                    op::POOL_2D,
                    &[0, 1, 1, 2, 2, 0, 0],
                    &[1],
                );
                vec![x, out]
            },
        ),
        graph(
            "FLASH_ATTN_EXT into one row with nb[1] = 1024 at the buffer's end (heap write)",
            "fuzz ops: ggml_compute_forward_flash_attn_ext_f16_one_chunk",
            |b| {
                let (h, base) = (b.handle, b.base);
                let q = tensor(1, F32, [32, 1, 1, 1], h, base);
                let kv = |id, at| TensorBuilder::new(id, F16).ne(&[32, 16, 1, 1]).data(h, at);
                let (k, v) = (kv(2, base + 4096), kv(3, base + 8192));
                // One row of 32 floats, contiguous by ggml's definition; the kernel copies
                // nb[1] = 1024 bytes into it.
                let out = node(
                    TensorBuilder::new(4, F32)
                        .ne(&[32, 1, 1, 1])
                        .nb([4, 1024, 1024, 1024])
                        .data(h, base + MIB - 128),
                    op::FLASH_ATTN_EXT,
                    &[0.125f32.to_bits() as i32],
                    &[1, 2, 3],
                );
                vec![q, k, v, out]
            },
        ),
        graph(
            "ROPE with empty freq factors at the buffer's end (heap read)",
            "fuzz ops: ggml_rope_cache_init",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [64, 1, 1, 1], h, base);
                let pos = tensor(2, I32, [1, 1, 1, 1], h, base + 4096);
                // ne[0] = 32 factors claimed, none present (ne[1] = 0): extent 0 at the end.
                let ff = TensorBuilder::new(3, F32)
                    .ne(&[32, 0, 1, 1])
                    .nb([4, 128, 128, 128])
                    .data(h, base + MIB);
                let out = node(
                    tensor(4, F32, [64, 1, 1, 1], h, base + 8192),
                    op::ROPE,
                    &rope_params(64),
                    &[1, 2, 3],
                );
                vec![x, pos, ff, out]
            },
        ),
        graph(
            "ROPE reading a row's freq factors past the buffer's end (heap read)",
            "fuzz ops: ggml_rope_cache_init (ne0/2 factors read)",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [1024, 1, 1, 1], h, base);
                let pos = tensor(2, I32, [1, 1, 1, 1], h, base + 8192);
                // n_dims = 2: one factor is all ggml asks for, and it is the buffer's last
                // float; the rotation cache reads one per pair of the row, 512.
                let ff = tensor(3, F32, [1, 1, 1, 1], h, base + MIB - 4);
                let out = node(
                    tensor(4, F32, [1024, 1, 1, 1], h, base + 16384),
                    op::ROPE,
                    &rope_params(2),
                    &[1, 2, 3],
                );
                vec![x, pos, ff, out]
            },
        ),
        graph(
            "UNARY XIELU into padded rows (GGML_ASSERT)",
            "fuzz ops: apply_unary_op_functor (unary-ops.cpp)",
            |b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [24, 4, 2, 2], h, base);
                let out = node(
                    TensorBuilder::new(2, F32)
                        .ne(&[24, 4, 2, 2])
                        .nb([4, 104, 420, 840])
                        .data(h, base + 8192),
                    op::UNARY,
                    &[17], // GGML_UNARY_OP_XIELU
                    &[1],
                );
                vec![x, out]
            },
        ),
    ]
}

/// Kernel contracts: what a CPU kernel assumes of its sources' layout; and GRAPH_RECOMPUTE.
fn kernel_contracts() -> Vec<Case> {
    vec![
        graph(
            "FLASH_ATTN_EXT with an f16 q, read as f32 rows (heap read)",
            "ggml_compute_forward_flash_attn_ext_f16_one_chunk (ops.cpp)",
            |b| {
                let (h, base) = (b.handle, b.base);
                // One f16 q row of 128 KiB at the buffer's end: the kernel converts it as 256 KiB
                // of floats.
                let dk = 1u32 << 16;
                let q = TensorBuilder::new(1, F16)
                    .ne(&[dk, 1, 1, 1])
                    .data(h, base + MIB - 2 * dk as u64);
                let k = TensorBuilder::new(2, F16).ne(&[dk, 1, 1, 1]).data(h, base);
                let v = TensorBuilder::new(3, F16)
                    .ne(&[16, 1, 1, 1])
                    .data(h, base + 2 * dk as u64);
                let mut p = [0i32; 16];
                p[0] = 1f32.to_bits() as i32;
                let out = node(
                    tensor(4, F32, [16, 1, 1, 1], h, base + 2 * dk as u64 + 4096),
                    op::FLASH_ATTN_EXT,
                    &p,
                    &[1, 2, 3],
                );
                vec![q, k, v, out]
            },
        ),
        graph(
            "COUNT_EQUAL over a 4-d shape the kernel splits into rows out of range (heap read)",
            "ggml_compute_forward_count_equal_i32 (ops.cpp)",
            |b| {
                let (h, base) = (b.handle, b.base);
                // ne = [1, 1, 1, 4]: the kernel's row split gives dim-2 indices 0, -3, -6, -9,
                // and nb[2] (free: ne[2] = 1) is 1 GiB.
                let x = TensorBuilder::new(1, I32)
                    .ne(&[1, 1, 1, 4])
                    .nb([4, 4, 1 << 30, 4])
                    .data(h, base);
                let y = TensorBuilder::new(2, I32)
                    .ne(&[1, 1, 1, 4])
                    .nb([4, 4, 1 << 30, 4])
                    .data(h, base + 4096);
                let out = node(
                    TensorBuilder::new(3, I64)
                        .ne(&[1, 1, 1, 1])
                        .nb([8, 8, 8, 8])
                        .data(h, base + 8192),
                    op::COUNT_EQUAL,
                    &[],
                    &[1, 2],
                );
                vec![x, y, out]
            },
        ),
        graph(
            "MUL_MAT Q4_K x a strided Q8_K src1, rows flattened by the tiled kernel (heap read)",
            "ggml_compute_forward_mul_mat_tiled_one_chunk (tiled/tiled.cpp)",
            |b| {
                let (h, base) = (b.handle, b.base);
                // src1 rows are 64 KiB apart in dim 1 and 292 bytes apart in dim 2; the tiled
                // kernel reads row r at r*nb[1], up to 128 MiB past the buffer.
                let w = TensorBuilder::new(1, Q4_K)
                    .ne(&[256, 16, 1, 1])
                    .data(h, base);
                let x = TensorBuilder::new(2, Q8_K)
                    .ne(&[256, 8, 256, 1])
                    .nb([292, 65536, 292, 292 * 256])
                    .data(h, base + 4096);
                let out = node(
                    tensor(3, F32, [16, 8, 256, 1], h, base + 4096 + 540_000),
                    op::MUL_MAT,
                    &[],
                    &[1, 2],
                );
                vec![w, x, out]
            },
        ),
        steps(
            "MUL_MAT_ID Q4_K x a Q8_K src1 with a free 1 GiB nb[1] (heap read)",
            "ggml_compute_forward_mul_mat_id_tiled_one_expert (tiled/tiled.cpp)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                // ne[1] = 1 leaves nb[1] free in ggml's contiguity; the tiled kernel steps the
                // 8 rows routed to expert 0 by it.
                let w = TensorBuilder::new(1, Q4_K)
                    .ne(&[256, 16, 2, 1])
                    .data(h, base);
                let x = TensorBuilder::new(2, Q8_K)
                    .ne(&[256, 1, 8, 1])
                    .nb([292, 1 << 30, 292, 292 * 8])
                    .data(h, base + 8192);
                let ids = tensor(3, I32, [1, 8, 1, 1], h, base + 16384);
                c.set_tensor(ids, 0, &i32_bytes(&[0; 8]))?;
                let out = node(
                    tensor(4, F32, [16, 1, 8, 1], h, base + 32768),
                    op::MUL_MAT_ID,
                    &[],
                    &[1, 2, 3],
                );
                graph_of(c, &[w, x, ids, out])?;
                Ok(())
            },
        ),
        requests(
            "GRAPH_RECOMPUTE without a stored graph",
            "spec §8",
            Setup::Hello,
            |_| {
                vec![Request::GraphRecompute {
                    device: 0,
                    uid: None,
                }]
            },
        ),
        steps(
            "GRAPH_RECOMPUTE after FREE_BUFFER of its buffer",
            "issue #25703 (use after free)",
            |c, b| {
                let (h, base) = (b.handle, b.base);
                let x = tensor(1, F32, [4, 1, 1, 1], h, base);
                let y = tensor(2, F32, [4, 1, 1, 1], h, base + 64);
                let z = node(
                    tensor(3, F32, [4, 1, 1, 1], h, base + 128),
                    op::ADD,
                    &[],
                    &[1, 2],
                );
                graph_of(c, &[x, y, z])?;
                c.send(&Request::FreeBuffer { remote_ptr: h })?;
                c.recompute(0)?;
                Ok(())
            },
        ),
    ]
}
