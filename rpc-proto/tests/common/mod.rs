//! Shared fixtures for the integration tests.
#![allow(dead_code)]

use rpc_proto::*;

/// SplitMix64: small, deterministic, good enough to drive no-panic loops.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform-ish in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

/// A tensor with every field non-zero, so that misplaced bytes show up.
pub fn busy_tensor(id: u64) -> RpcTensor {
    TensorBuilder::new(id, 1)
        .data(0x5555_0000_1000, 0x7f00_dead_0000 + id)
        .ne(&[640, 2, 3, 1])
        .nb([4, 2560, 5120, 15360])
        .op(2, &[1, -2, 3, i32::MIN, i32::MAX])
        .flags(TENSOR_FLAG_INPUT | TENSOR_FLAG_COMPUTE)
        .srcs(&[id + 1, id + 2, 0, u64::MAX])
        .view(id + 3, 128)
        .name(&format!("blk.{id}.attn_q.weight"))
        .use_count(2)
        .build()
}

/// Owns the variable-size parts of the sample requests.
pub struct Fixture {
    pub data: Vec<u8>,
    /// A 7.0.0 GRAPH_COMPUTE payload.
    pub graph: Vec<u8>,
    /// The same graph in 8.0.0's layout (uid 21).
    pub graph8: Vec<u8>,
}

impl Fixture {
    pub fn new() -> Self {
        let tensors: Vec<RpcTensor> = (1..=3).map(busy_tensor).collect();
        let mut graph = Vec::new();
        encode_graph(1, None, &[3, 2], &tensors, &mut graph);
        let mut graph8 = Vec::new();
        encode_graph(1, Some(21), &[3, 2], &tensors, &mut graph8);
        Fixture {
            data: (0..=255u8).cycle().take(1000).collect(),
            graph,
            graph8,
        }
    }

    /// One request per command of `major` (several for some), in command order.
    pub fn requests(&self, major: Major) -> Vec<Request<'_>> {
        let t = busy_tensor(10);
        let mut srcs = Box::new([RpcTensor::default(); GGML_MAX_SRC]);
        for (i, s) in srcs.iter_mut().enumerate().take(3) {
            *s = busy_tensor(20 + i as u64);
        }
        vec![
            Request::AllocBuffer {
                device: 1,
                size: 1 << 33,
            },
            Request::GetAlignment { device: 0 },
            Request::GetMaxSize { device: u32::MAX },
            Request::BufferGetBase {
                remote_ptr: 0x5555_0000_1000,
            },
            Request::FreeBuffer {
                remote_ptr: 0x5555_0000_1000,
            },
            Request::BufferClear {
                remote_ptr: 0x5555_0000_1000,
                value: 0xab,
            },
            Request::SetTensor {
                tensor: t,
                cache_flag: 1,
                offset: 64,
                data: &self.data,
            },
            Request::SetTensor {
                tensor: t,
                cache_flag: 0,
                offset: 0,
                data: &[],
            },
            Request::SetTensorHash {
                tensor: t,
                offset: 8,
                hash: fnv1a64(&self.data),
            },
            Request::GetTensor {
                tensor: t,
                offset: 16,
                size: 1 << 20,
            },
            Request::CopyTensor {
                src: t,
                dst: busy_tensor(11),
            },
            Request::GraphCompute(
                Graph::decode(
                    major,
                    match major {
                        Major::V7 => &self.graph,
                        Major::V8 => &self.graph8,
                    },
                    &Limits::default(),
                )
                .unwrap(),
            ),
            Request::GraphCompute(Graph {
                device: 0,
                uid: (major == Major::V8).then_some(0),
                node_ids: &[],
                tensors: &[],
            }),
            Request::GetDeviceMemory { device: 2 },
            Request::InitTensor { tensor: t },
            Request::GetAllocSize {
                device: 3,
                tensor: t,
                srcs,
            },
            Request::Hello { caps: [0; 24] },
            Request::Hello {
                caps: core::array::from_fn(|i| i as u8 + 1),
            },
            Request::DeviceCount,
            Request::GraphRecompute {
                device: 0,
                uid: (major == Major::V8).then_some(u64::MAX - 1),
            },
            Request::MemsetTensor {
                tensor: t,
                offset: 4,
                size: 100,
                value: 0xff,
            },
        ]
        .into_iter()
        .chain(if major == Major::V8 {
            self.requests_v8_only(t)
        } else {
            Vec::new()
        })
        .collect()
    }

    fn requests_v8_only(&self, t: RpcTensor) -> Vec<Request<'_>> {
        vec![
            Request::SetTensor2d {
                tensor: t,
                region: Region2d {
                    offset: 8,
                    size: 100,
                    n_copies: 10,
                    stride: 128,
                },
                data: &self.data,
            },
            Request::GetTensor2d {
                tensor: t,
                region: Region2d {
                    offset: 0,
                    size: 672,
                    n_copies: 53,
                    stride: 672,
                },
            },
            Request::CommInit(CommInit {
                device: 0,
                rank: 1,
                world: 2,
                port: 52111,
                host: CommInit::host_field("127.0.0.1").unwrap(),
            }),
            Request::CommAllreduce {
                device: 0,
                tensor: t,
            },
            Request::CommFree { device: 3 },
            Request::LinkProbe,
            Request::LinkOpen {
                slot: 2,
                init: CommInit {
                    device: 0,
                    rank: 0,
                    world: 2,
                    port: 51052,
                    host: [0; rpc_proto::COMM_HOST_SIZE],
                },
            },
            Request::LinkSend {
                slot: 2,
                tensor: t,
                size: 2560,
            },
            Request::LinkRecv {
                slot: 7,
                tensor: t,
                size: 2560,
            },
            Request::LinkClose { slot: 7 },
        ]
    }
}

/// One response per command that has one (several for some).
pub fn responses() -> Vec<Response> {
    vec![
        Response::AllocBuffer {
            remote_ptr: 0x5555_0000_1000,
            remote_size: 4096,
        },
        Response::AllocBuffer {
            remote_ptr: 0,
            remote_size: 0,
        },
        Response::GetAlignment { alignment: 32 },
        Response::GetMaxSize { max_size: u64::MAX },
        Response::BufferGetBase {
            base_ptr: 0x7f00_0000_0000,
        },
        Response::SetTensorHash { result: 1 },
        Response::SetTensorHash { result: 0 },
        Response::GetTensor((0..=255u8).collect()),
        Response::GetTensor(Vec::new()),
        Response::CopyTensor { result: 1 },
        Response::GetDeviceMemory {
            free: 1 << 30,
            total: 2 << 30,
        },
        Response::GetAllocSize { alloc_size: 16 },
        Response::hello(Major::V7, [0; 24]),
        Response::hello(Major::V8, [0; 24]),
        Response::GetTensor2d(vec![1, 2, 3, 4]),
        Response::CommInit { ok: 1 },
        Response::CommInit { ok: 0 },
        Response::LinkProbe {
            version: rpc_proto::LINK_VERSION,
            port: 50052,
        },
        Response::LinkOpen { ok: 1 },
        Response::Hello {
            major: 7,
            minor: 0,
            patch: 0,
            caps: [0x11; 24],
        },
        Response::DeviceCount { count: 1 },
    ]
}
