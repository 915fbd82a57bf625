//! Where each command of a one-endpoint client goes, sans-IO: the endpoint's devices are the
//! workers' devices in worker order, and its buffer handles are the shim's own, each standing for
//! one worker's handle. [`Router::route`] rewrites a request in place (device index → the worker's
//! own index, buffer handle → the worker's own handle) and says where it goes; nothing here does
//! I/O, so every rule is tested in memory.
//!
//! # Rules
//!
//! - A device index names a worker ([`Router::worker_of_device`]); one past the last is refused, as
//!   a server refuses it (it closes the connection).
//! - A buffer handle the client got from ALLOC_BUFFER on this connection names a worker; any other
//!   handle (another connection's, another worker's, a made-up one) is refused. Handles are
//!   per connection here as on a server, so a client can never reach another client's buffers.
//! - Every tensor of a command lies on one worker: the graph of GRAPH_COMPUTE on the worker of its
//!   device, a tensor command on the worker of its buffer. The one exception is COPY_TENSOR,
//!   whose source and destination may lie on two workers: that is a [`CrossCopy`].
//! - GET_ALLOC_SIZE asks about a tensor description: a tensor (or source) whose buffer lies on
//!   another worker is described without its buffer there (buffer and address zero), which is
//!   what a server does with a buffer it does not know.
//! - What a command names, and where in its payload, is rpc-proto's [`Command::target`]: a command
//!   without a rule of its own here goes by it, so a new one needs nothing of this module. One
//!   that names nothing of the connection's (a device, buffer, tensor) goes to the first worker.
//! - COMM_INIT is answered 0 (no pairwise link between devices of one endpoint: the client then
//!   reduces with COPY_TENSOR and ADD graphs, which this module routes), and COMM_ALLREDUCE without
//!   a communicator is refused, as a server refuses it.

use std::collections::HashMap;

use rpc_proto::{Command, Graph, Limits, Major, RpcTensor, Target, GGML_MAX_SRC, RPC_TENSOR_SIZE};

pub use crate::error::RouteError;

/// The part of a request [`Router::route`] needs: the head of the commands whose data may be
/// large ([`Command::data_head`]; the data is streamed on to the worker as it comes), the whole
/// payload of every other.
pub fn head_len(cmd: Command) -> Option<usize> {
    cmd.data_head()
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Answered here with this response payload; no worker sees the request.
    Answer(Vec<u8>),
    /// The (rewritten) request goes to this worker.
    Worker(usize),
    /// A COPY_TENSOR from one worker's tensor into another's.
    Copy(Box<CrossCopy>),
}

/// A COPY_TENSOR whose tensors lie on two workers: `bytes` bytes from the start of `src` (on
/// worker `from`) to the start of `dst` (on worker `to`), both already in their worker's handles.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrossCopy {
    /// The worker holding the source.
    pub from: usize,
    /// The source tensor, in `from`'s handles.
    pub src: RpcTensor,
    /// The worker holding the destination.
    pub to: usize,
    /// The destination tensor, in `to`'s handles.
    pub dst: RpcTensor,
    /// `ggml_nbytes(src)`, at most `ggml_nbytes(dst)`.
    pub bytes: u64,
}

/// One client connection's view of the endpoint: devices and buffer handles.
#[derive(Debug)]
pub struct Router {
    /// What the client speaks (the layout of its graphs).
    major: Major,
    /// Endpoint device index → (worker, that worker's own device index).
    devices: Vec<(usize, u32)>,
    /// Handle given to the client → (worker, that worker's handle).
    handles: HashMap<u64, (usize, u64)>,
    next_handle: u64,
}

/// First handle given to a client: far from small integers and from a worker's own handles in
/// logs, so a handle passed through unrewritten stands out.
const FIRST_HANDLE: u64 = 0x5e1f_0000_0000_0001;

impl Router {
    /// A router over workers with `device_counts[i]` devices each, for a client speaking `major`.
    pub fn new(major: Major, device_counts: &[u32]) -> Router {
        let devices = device_counts
            .iter()
            .enumerate()
            .flat_map(|(w, &n)| (0..n).map(move |d| (w, d)))
            .collect();
        Router {
            major,
            devices,
            handles: HashMap::new(),
            next_handle: FIRST_HANDLE,
        }
    }

    /// The endpoint's device count (the sum of the workers').
    pub fn device_count(&self) -> u32 {
        u32::try_from(self.devices.len()).unwrap_or(u32::MAX)
    }

    /// The worker of endpoint device `device` and its own index there.
    pub fn worker_of_device(&self, cmd: Command, device: u32) -> Result<(usize, u32), RouteError> {
        self.devices
            .get(device as usize)
            .copied()
            .ok_or(RouteError::NoSuchDevice {
                cmd,
                device,
                count: self.device_count(),
            })
    }

    /// Buffers the client holds now.
    pub fn buffers(&self) -> usize {
        self.handles.len()
    }

    /// Rewrites `payload` (the whole payload, or the [`head_len`] of SET_TENSOR and SET_TENSOR_2D)
    /// of a `cmd` request for the worker it goes to, and says which that is. HELLO is not routed
    /// (the session answers it).
    pub fn route(&mut self, cmd: Command, payload: &mut [u8]) -> Result<Route, RouteError> {
        let need = head_len(cmd).unwrap_or(cmd.target().head_len());
        if payload.len() < need {
            return Err(malformed(
                cmd,
                format!("{} bytes, need {need}", payload.len()),
            ));
        }
        // The commands with a rule of their own here; every other goes where what it names
        // lies ([`Command::target`], declared with the command in rpc-proto).
        match cmd {
            Command::DeviceCount => Ok(Route::Answer(self.device_count().to_le_bytes().to_vec())),
            Command::Hello => Err(malformed(cmd, "HELLO is answered by the session".into())),
            Command::CopyTensor => self.copy(payload),
            Command::GetAllocSize => {
                let w = self.device_field(cmd, payload)?;
                for i in 0..=GGML_MAX_SRC {
                    self.tensor_at(
                        cmd,
                        payload,
                        4 + i * RPC_TENSOR_SIZE,
                        Placement::Describe(w),
                    )?;
                }
                Ok(Route::Worker(w))
            }
            Command::CommInit => Ok(Route::Answer(vec![0])),
            Command::CommAllreduce => Err(RouteError::NoCommunicator(read_u32(payload))),
            Command::LinkProbe => Err(links_are_ours(cmd)),
            _ => self.by_target(cmd, payload),
        }
    }

    /// A command without a rule of its own: to the worker of what it names, every tensor of it
    /// there; one that names nothing of the connection's to the first worker (any would answer
    /// it); the link slots are the endpoint's own.
    fn by_target(&mut self, cmd: Command, payload: &mut [u8]) -> Result<Route, RouteError> {
        match cmd.target() {
            Target::Server => Ok(Route::Worker(0)),
            Target::Device { tensors } => {
                let w = self.device_field(cmd, payload)?;
                for i in 0..tensors {
                    self.tensor_at(cmd, payload, 4 + i * RPC_TENSOR_SIZE, Placement::On(w))?;
                }
                Ok(Route::Worker(w))
            }
            Target::Graph => self.graph(payload),
            Target::Buffer => {
                let mine = read_u64(payload);
                let (w, real) = self.handle(cmd, mine)?;
                payload[..8].copy_from_slice(&real.to_le_bytes());
                if cmd == Command::FreeBuffer {
                    self.handles.remove(&mine);
                }
                Ok(Route::Worker(w))
            }
            Target::Tensors(n) => {
                let w = self
                    .tensor_at(cmd, payload, 0, Placement::Anywhere)?
                    .expect("a tensor command's tensor names its worker");
                for i in 1..n {
                    self.tensor_at(cmd, payload, i * RPC_TENSOR_SIZE, Placement::On(w))?;
                }
                Ok(Route::Worker(w))
            }
            Target::LinkSlot { .. } => Err(links_are_ours(cmd)),
        }
    }

    /// ALLOC_BUFFER's reply from `worker` (`handle | size`): the worker's handle is kept and a
    /// handle of the endpoint's own goes to the client in its place (0, a failed allocation,
    /// stays 0).
    pub fn alloc_reply(&mut self, worker: usize, reply: &mut [u8]) -> Result<(), RouteError> {
        let cmd = Command::AllocBuffer;
        if reply.len() < 8 {
            return Err(malformed(cmd, "reply shorter than a handle".into()));
        }
        let real = read_u64(reply);
        if real == 0 {
            return Ok(());
        }
        let mine = self.next_handle;
        self.next_handle = self.next_handle.wrapping_add(1).max(FIRST_HANDLE);
        self.handles.insert(mine, (worker, real));
        reply[..8].copy_from_slice(&mine.to_le_bytes());
        Ok(())
    }

    /// Rewrites the device field at the start of `payload`; its worker.
    fn device_field(&self, cmd: Command, payload: &mut [u8]) -> Result<usize, RouteError> {
        let (w, local) = self.worker_of_device(cmd, read_u32(payload))?;
        payload[..4].copy_from_slice(&local.to_le_bytes());
        Ok(w)
    }

    fn handle(&self, cmd: Command, handle: u64) -> Result<(usize, u64), RouteError> {
        self.handles
            .get(&handle)
            .copied()
            .ok_or(RouteError::UnknownBuffer { cmd, handle })
    }

    /// Rewrites the tensor at `at` in `payload`. Its worker, `None` for a tensor without a buffer.
    fn tensor_at(
        &self,
        cmd: Command,
        payload: &mut [u8],
        at: usize,
        place: Placement,
    ) -> Result<Option<usize>, RouteError> {
        let bytes = &mut payload[at..at + RPC_TENSOR_SIZE];
        let mut t = RpcTensor::from_wire(bytes).expect("a tensor's size");
        let handle = t.buffer.get();
        let found = match (handle, place) {
            (0, Placement::Anywhere) => return Err(RouteError::UnknownBuffer { cmd, handle }),
            (0, _) => return Ok(None),
            _ => self.handles.get(&handle).copied(),
        };
        match (found, place) {
            (Some((w, real)), Placement::Anywhere) => {
                t.buffer.set(real);
                bytes.copy_from_slice(&t.to_wire());
                Ok(Some(w))
            }
            (Some((w, real)), Placement::On(on)) if w == on => {
                t.buffer.set(real);
                bytes.copy_from_slice(&t.to_wire());
                Ok(Some(w))
            }
            (Some((w, _)), Placement::On(on)) => Err(RouteError::Split { cmd, a: on, b: w }),
            (Some((w, real)), Placement::Describe(on)) if w == on => {
                t.buffer.set(real);
                bytes.copy_from_slice(&t.to_wire());
                Ok(Some(w))
            }
            (_, Placement::Describe(_)) => {
                t.buffer.set(0);
                t.data.set(0);
                bytes.copy_from_slice(&t.to_wire());
                Ok(None)
            }
            (None, _) => Err(RouteError::UnknownBuffer { cmd, handle }),
        }
    }

    /// GRAPH_COMPUTE: on its device's worker, every tensor with a buffer there.
    fn graph(&self, payload: &mut [u8]) -> Result<Route, RouteError> {
        let cmd = Command::GraphCompute;
        // Layout checked whole (counts bounded by the payload itself: it is already in memory).
        let unbounded = Limits {
            max_request_size: u64::MAX,
            max_graph_nodes: u32::MAX,
            max_graph_tensors: u32::MAX,
        };
        let n_tensors = Graph::decode(self.major, payload, &unbounded)
            .map_err(|e| malformed(cmd, e.to_string()))?
            .tensors
            .len();
        let w = self.device_field(cmd, payload)?;
        // The tensor array ends the payload (decode refuses trailing bytes).
        let first = payload.len() - n_tensors * RPC_TENSOR_SIZE;
        for i in 0..n_tensors {
            self.tensor_at(cmd, payload, first + i * RPC_TENSOR_SIZE, Placement::On(w))?;
        }
        Ok(Route::Worker(w))
    }

    /// COPY_TENSOR: on one worker as it came; across two a [`CrossCopy`], or refused with 0 (as a
    /// server answers a copy that does not fit) when the source is larger than the destination.
    fn copy(&self, payload: &mut [u8]) -> Result<Route, RouteError> {
        let cmd = Command::CopyTensor;
        let from = self.tensor_at(cmd, payload, 0, Placement::Anywhere)?;
        let to = self.tensor_at(cmd, payload, RPC_TENSOR_SIZE, Placement::Anywhere)?;
        let (Some(from), Some(to)) = (from, to) else {
            unreachable!("tensor_at(Anywhere) names a worker or refuses")
        };
        if from == to {
            return Ok(Route::Worker(from));
        }
        let src = RpcTensor::from_wire(&payload[..RPC_TENSOR_SIZE]).expect("a tensor's size");
        let dst = RpcTensor::from_wire(&payload[RPC_TENSOR_SIZE..2 * RPC_TENSOR_SIZE])
            .expect("a tensor's size");
        match (nbytes(&src), nbytes(&dst)) {
            (Some(bytes), Some(room)) if bytes <= room => Ok(Route::Copy(Box::new(CrossCopy {
                from,
                src,
                to,
                dst,
                bytes,
            }))),
            _ => Ok(Route::Answer(vec![0])),
        }
    }
}

/// Where a tensor of a command may lie.
#[derive(Debug, Clone, Copy)]
enum Placement {
    /// On any worker; it decides the command's worker. A tensor without a buffer is refused.
    Anywhere,
    /// On this worker (or without a buffer).
    On(usize),
    /// A description for this worker: a buffer elsewhere (or unknown) is dropped from it.
    Describe(usize),
}

fn malformed(cmd: Command, why: String) -> RouteError {
    RouteError::Malformed { cmd, why }
}

/// Our LINK_* extension on a client's connection: refused.
fn links_are_ours(cmd: Command) -> RouteError {
    malformed(
        cmd,
        "worker-to-worker links are the endpoint's own, not a client's".into(),
    )
}

fn read_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn read_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// `ggml_nbytes` of a wire tensor from its type, shape and strides; `None` for an unknown type
/// or a size past `u64`.
pub fn nbytes(t: &RpcTensor) -> Option<u64> {
    let (blck, size) = rpc_proto::type_traits(t.r#type.get())?;
    let ne = t.ne().map(u64::from);
    let nb = t.nb().map(u64::from);
    if ne.contains(&0) {
        return Some(0);
    }
    let mut total: u128 = if blck == 1 {
        u128::from(size)
    } else {
        u128::from(ne[0]) * u128::from(nb[0]) / u128::from(blck)
    };
    for i in usize::from(blck != 1)..4 {
        total += u128::from(ne[i] - 1) * u128::from(nb[i]);
    }
    u64::try_from(total).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rpc_proto::{encode_graph, Request, TensorBuilder};

    /// Three workers with 1, 2 and 1 devices.
    fn router() -> Router {
        Router::new(Major::V8, &[1, 2, 1])
    }

    fn payload(req: Request<'_>) -> Vec<u8> {
        let mut v = Vec::new();
        req.encode_payload(&mut v);
        v
    }

    /// ALLOC_BUFFER on endpoint device `device`, answered with `real` by its worker: the
    /// client's handle.
    fn alloc(r: &mut Router, device: u32, real: u64) -> u64 {
        let mut p = payload(Request::AllocBuffer { device, size: 4096 });
        let Route::Worker(w) = r.route(Command::AllocBuffer, &mut p).unwrap() else {
            panic!("ALLOC_BUFFER goes to a worker")
        };
        let mut reply = [real.to_le_bytes(), 4096u64.to_le_bytes()].concat();
        r.alloc_reply(w, &mut reply).unwrap();
        read_u64(&reply)
    }

    fn get(handle: u64) -> Vec<u8> {
        payload(Request::GetTensor {
            tensor: TensorBuilder::f32(9).ne(&[4]).data(handle, 0x1000).build(),
            offset: 0,
            size: 16,
        })
    }

    fn buffer_of(p: &[u8], at: usize) -> u64 {
        RpcTensor::from_wire(&p[at..at + RPC_TENSOR_SIZE])
            .unwrap()
            .buffer
            .get()
    }

    #[test]
    fn devices_are_the_workers_in_order() {
        let mut r = router();
        assert_eq!(r.device_count(), 4);
        let mut p = Vec::new();
        assert_eq!(
            r.route(Command::DeviceCount, &mut p).unwrap(),
            Route::Answer(4u32.to_le_bytes().to_vec())
        );
        for (device, worker, local) in [(0, 0, 0), (1, 1, 0), (2, 1, 1), (3, 2, 0)] {
            let mut p = payload(Request::GetAlignment { device });
            assert_eq!(
                r.route(Command::GetAlignment, &mut p).unwrap(),
                Route::Worker(worker)
            );
            assert_eq!(read_u32(&p), local, "device {device}");
        }
        let mut p = payload(Request::GraphRecompute {
            device: 4,
            uid: Some(7),
        });
        assert_eq!(
            r.route(Command::GraphRecompute, &mut p).unwrap_err(),
            RouteError::NoSuchDevice {
                cmd: Command::GraphRecompute,
                device: 4,
                count: 4
            }
        );
    }

    #[test]
    fn handles_are_the_endpoints_own_and_name_their_worker() {
        let mut r = router();
        // Two workers hand out the same handle value: the client gets two different ones.
        let a = alloc(&mut r, 0, 0x10);
        let b = alloc(&mut r, 3, 0x10);
        assert_ne!(a, b);
        assert_ne!(a, 0x10);
        for (handle, worker) in [(a, 0), (b, 2)] {
            let mut p = get(handle);
            assert_eq!(
                r.route(Command::GetTensor, &mut p).unwrap(),
                Route::Worker(worker)
            );
            assert_eq!(buffer_of(&p, 0), 0x10, "the worker's own handle");
        }
        // A failed allocation stays 0.
        let mut reply = [0u64.to_le_bytes(), 0u64.to_le_bytes()].concat();
        r.alloc_reply(1, &mut reply).unwrap();
        assert_eq!(read_u64(&reply), 0);
        assert_eq!(r.buffers(), 2);
        // FREE_BUFFER goes to its worker with the worker's handle, and the handle is gone.
        let mut p = payload(Request::FreeBuffer { remote_ptr: a });
        assert_eq!(
            r.route(Command::FreeBuffer, &mut p).unwrap(),
            Route::Worker(0)
        );
        assert_eq!(read_u64(&p), 0x10);
        assert_eq!(r.buffers(), 1);
        let mut p = get(a);
        assert_eq!(
            r.route(Command::GetTensor, &mut p).unwrap_err(),
            RouteError::UnknownBuffer {
                cmd: Command::GetTensor,
                handle: a
            }
        );
    }

    #[test]
    fn another_connections_or_a_workers_own_handle_is_refused() {
        let mut mine = router();
        let mut theirs = router();
        let _ = alloc(&mut mine, 0, 0x10);
        let other = alloc(&mut theirs, 1, 0x20);
        // Handles count alike on every connection, so "another client's handle" is one this
        // connection has not been given: its second.
        let other = other + 1;
        for handle in [other, 0x10, 0x20, 0] {
            let mut p = get(handle);
            assert!(
                matches!(
                    mine.route(Command::GetTensor, &mut p),
                    Err(RouteError::UnknownBuffer { .. })
                ),
                "{handle:#x}"
            );
            let mut p = payload(Request::BufferClear {
                remote_ptr: handle,
                value: 0,
            });
            assert!(mine.route(Command::BufferClear, &mut p).is_err());
        }
    }

    fn graph(r: &Router, device: u32, buffers: &[u64]) -> Vec<u8> {
        let tensors: Vec<RpcTensor> = buffers
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                TensorBuilder::f32(i as u64 + 1)
                    .ne(&[4])
                    .data(b, 0x1000 + 16 * i as u64)
                    .build()
            })
            .collect();
        let mut p = Vec::new();
        let uid = (r.major == Major::V8).then_some(5);
        encode_graph(device, uid, &[1], &tensors, &mut p);
        p
    }

    #[test]
    fn a_graph_runs_where_its_device_is_with_every_tensor_there() {
        for major in Major::ALL {
            let mut r = Router::new(major, &[1, 2, 1]);
            let a = alloc(&mut r, 1, 0x100);
            let b = alloc(&mut r, 2, 0x200); // worker 1 too
            let c = alloc(&mut r, 0, 0x300);
            let mut p = graph(&r, 2, &[a, b, 0]);
            assert_eq!(
                r.route(Command::GraphCompute, &mut p).unwrap(),
                Route::Worker(1)
            );
            assert_eq!(read_u32(&p), 1, "the worker's own device index");
            let first = p.len() - 3 * RPC_TENSOR_SIZE;
            let got: Vec<u64> = (0..3)
                .map(|i| buffer_of(&p, first + i * RPC_TENSOR_SIZE))
                .collect();
            assert_eq!(got, [0x100, 0x200, 0]);
            // A tensor on another worker: refused.
            let mut p = graph(&r, 1, &[a, c]);
            assert_eq!(
                r.route(Command::GraphCompute, &mut p).unwrap_err(),
                RouteError::Split {
                    cmd: Command::GraphCompute,
                    a: 1,
                    b: 0
                }
            );
            // Truncated or padded graphs are malformed, not a panic.
            let full = graph(&r, 1, &[a]);
            for len in [0, 3, 4, 11, full.len() - 1] {
                let mut p = full[..len].to_vec();
                assert!(r.route(Command::GraphCompute, &mut p).is_err(), "{len}");
            }
            let mut p = [full.clone(), vec![0]].concat();
            assert!(r.route(Command::GraphCompute, &mut p).is_err());
        }
    }

    fn copy(src: u64, src_ne: u32, dst: u64, dst_ne: u32) -> Vec<u8> {
        payload(Request::CopyTensor {
            src: TensorBuilder::f32(1)
                .ne(&[src_ne])
                .data(src, 0x1000)
                .build(),
            dst: TensorBuilder::f32(2)
                .ne(&[dst_ne])
                .data(dst, 0x2000)
                .build(),
        })
    }

    #[test]
    fn copies_within_a_worker_go_there_and_across_become_cross_copies() {
        let mut r = router();
        let a = alloc(&mut r, 1, 0x100);
        let b = alloc(&mut r, 2, 0x200);
        let c = alloc(&mut r, 3, 0x300);
        let mut p = copy(a, 64, b, 64);
        assert_eq!(
            r.route(Command::CopyTensor, &mut p).unwrap(),
            Route::Worker(1)
        );
        assert_eq!(
            (buffer_of(&p, 0), buffer_of(&p, RPC_TENSOR_SIZE)),
            (0x100, 0x200)
        );
        let mut p = copy(a, 64, c, 100);
        let Route::Copy(x) = r.route(Command::CopyTensor, &mut p).unwrap() else {
            panic!("a copy across workers")
        };
        assert_eq!((x.from, x.to, x.bytes), (1, 2, 256));
        assert_eq!((x.src.buffer.get(), x.dst.buffer.get()), (0x100, 0x300));
        assert_eq!(x.dst.data.get(), 0x2000);
        // Larger than the destination: answered 0, nothing moves.
        let mut p = copy(a, 101, c, 100);
        assert_eq!(
            r.route(Command::CopyTensor, &mut p).unwrap(),
            Route::Answer(vec![0])
        );
        // A side on no buffer of this connection: refused.
        let mut p = copy(a, 4, c + 100, 4);
        assert!(matches!(
            r.route(Command::CopyTensor, &mut p),
            Err(RouteError::UnknownBuffer { .. })
        ));
    }

    #[test]
    fn alloc_size_describes_foreign_sources_without_their_buffer() {
        let mut r = router();
        let a = alloc(&mut r, 0, 0x100);
        let b = alloc(&mut r, 3, 0x200);
        let mut srcs = Box::new([RpcTensor::default(); GGML_MAX_SRC]);
        srcs[0] = TensorBuilder::f32(3).ne(&[4]).data(a, 0x1000).build();
        srcs[1] = TensorBuilder::f32(4).ne(&[4]).data(b, 0x2000).build();
        let mut p = payload(Request::GetAllocSize {
            device: 3,
            tensor: TensorBuilder::f32(5).ne(&[4]).data(b, 0x3000).build(),
            srcs,
        });
        assert_eq!(
            r.route(Command::GetAllocSize, &mut p).unwrap(),
            Route::Worker(2)
        );
        let at = |i: usize| {
            RpcTensor::from_wire(&p[4 + i * RPC_TENSOR_SIZE..][..RPC_TENSOR_SIZE]).unwrap()
        };
        assert_eq!((at(0).buffer.get(), at(0).data.get()), (0x200, 0x3000));
        assert_eq!(
            (at(1).buffer.get(), at(1).data.get()),
            (0, 0),
            "on worker 0: dropped"
        );
        assert_eq!((at(2).buffer.get(), at(2).data.get()), (0x200, 0x2000));
    }

    #[test]
    fn no_communicator_between_devices_of_one_endpoint() {
        let mut r = router();
        let mut p = vec![0u8; 80];
        assert_eq!(
            r.route(Command::CommInit, &mut p).unwrap(),
            Route::Answer(vec![0])
        );
        let mut p = payload(Request::CommAllreduce {
            device: 1,
            tensor: TensorBuilder::f32(1).ne(&[4]).build(),
        });
        assert_eq!(
            r.route(Command::CommAllreduce, &mut p).unwrap_err(),
            RouteError::NoCommunicator(1)
        );
    }

    #[test]
    fn any_bytes_are_routed_or_refused_without_a_panic() {
        let mut r = router();
        let a = alloc(&mut r, 0, 0x100);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for cmd in Command::ALL {
            for _ in 0..300 {
                let len = (next() % 1400) as usize;
                let mut p: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                // Sometimes name a real handle where a tensor's buffer is.
                if p.len() >= 20 && next() % 2 == 0 {
                    p[12..20].copy_from_slice(&a.to_le_bytes());
                }
                let _ = r.route(cmd, &mut p);
            }
        }
    }

    #[test]
    fn nbytes_follows_ggml() {
        let t = TensorBuilder::f32(1).ne(&[4, 3]).build();
        assert_eq!(nbytes(&t), Some(48));
        let q = TensorBuilder::new(1, rpc_proto::ggml_type::Q4_0)
            .ne(&[64, 2])
            .build();
        assert_eq!(nbytes(&q), Some(2 * 2 * 18));
        let mut v = TensorBuilder::f32(1).ne(&[4, 3]).build();
        v.nb[1].set(32); // rows 32 bytes apart: a view of a wider tensor
        assert_eq!(nbytes(&v), Some(4 + 3 * 4 + 2 * 32));
        let unknown = TensorBuilder::new(1, 9999).ne(&[4]).build();
        assert_eq!(nbytes(&unknown), None);
    }
}
