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
//! - COMM_INIT is answered 0 (no pairwise link between devices of one endpoint: the client then
//!   reduces with COPY_TENSOR and ADD graphs, which this module routes), and COMM_ALLREDUCE without
//!   a communicator is refused, as a server refuses it.

use std::collections::HashMap;

use rpc_proto::{Command, Graph, Limits, Major, RpcTensor, GGML_MAX_SRC, RPC_TENSOR_SIZE};

/// Bytes of a SET_TENSOR request before its data: tensor, cache flag, offset.
pub const SET_TENSOR_HEAD: usize = RPC_TENSOR_SIZE + 1 + 8;
/// Bytes of a SET_TENSOR_2D request before its data: tensor, offset, size, n_copies, stride.
pub const SET_TENSOR_2D_HEAD: usize = RPC_TENSOR_SIZE + 4 * 8;

/// The part of a request [`Router::route`] needs: the head of the two commands whose data may be
/// large (streamed on to the worker as it comes), the whole payload of every other.
pub fn head_len(cmd: Command) -> Option<usize> {
    match cmd {
        Command::SetTensor => Some(SET_TENSOR_HEAD),
        Command::SetTensor2d => Some(SET_TENSOR_2D_HEAD),
        _ => None,
    }
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// Answered here with this response payload; no worker sees the request.
    Answer(Vec<u8>),
    /// The (rewritten) request goes to this worker.
    Worker(usize),
    /// A COPY_TENSOR from one worker's tensor into another's.
    Copy(CrossCopy),
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

/// A request the one endpoint refuses (the client connection is closed, as a server would close
/// it for the same request).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RouteError {
    /// A device index past the endpoint's devices.
    #[error("{cmd}: device {device} does not exist (the endpoint has {count})")]
    NoSuchDevice {
        /// The command.
        cmd: Command,
        /// The index asked for.
        device: u32,
        /// The endpoint's device count.
        count: u32,
    },
    /// A buffer handle this connection was never given (or has freed).
    #[error("{cmd}: buffer {handle:#x} was not allocated on this connection")]
    UnknownBuffer {
        /// The command.
        cmd: Command,
        /// The handle.
        handle: u64,
    },
    /// Tensors of one command on two workers (other than COPY_TENSOR's source and destination).
    #[error("{cmd}: its tensors lie on workers {a} and {b}; one command runs on one worker")]
    Split {
        /// The command.
        cmd: Command,
        /// One worker.
        a: usize,
        /// Another.
        b: usize,
    },
    /// COMM_ALLREDUCE: the endpoint's devices have no communicator.
    #[error("COMM_ALLREDUCE: device {0} has no communicator (the endpoint answered COMM_INIT 0)")]
    NoCommunicator(u32),
    /// A payload too short for its command or a malformed graph.
    #[error("{cmd}: malformed request: {why}")]
    Malformed {
        /// The command.
        cmd: Command,
        /// What is wrong.
        why: String,
    },
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
        let need = match head_len(cmd) {
            Some(n) => n,
            None => match cmd {
                Command::DeviceCount | Command::Hello => 0,
                Command::BufferGetBase | Command::FreeBuffer | Command::BufferClear => 8,
                Command::CopyTensor => 2 * RPC_TENSOR_SIZE,
                Command::GetAllocSize => 4 + (1 + GGML_MAX_SRC) * RPC_TENSOR_SIZE,
                Command::CommAllreduce => 4 + RPC_TENSOR_SIZE,
                Command::SetTensorHash
                | Command::GetTensor
                | Command::InitTensor
                | Command::MemsetTensor
                | Command::GetTensor2d => RPC_TENSOR_SIZE,
                _ => 4,
            },
        };
        if payload.len() < need {
            return Err(malformed(cmd, format!("{} bytes, need {need}", payload.len())));
        }
        match cmd {
            Command::DeviceCount => Ok(Route::Answer(self.device_count().to_le_bytes().to_vec())),
            Command::Hello => Err(malformed(cmd, "HELLO is answered by the session".into())),
            Command::AllocBuffer
            | Command::GetAlignment
            | Command::GetMaxSize
            | Command::GetDeviceMemory
            | Command::GraphRecompute
            | Command::CommFree => self.device_field(cmd, payload).map(Route::Worker),
            Command::GraphCompute => self.graph(payload),
            Command::BufferGetBase | Command::FreeBuffer | Command::BufferClear => {
                let mine = read_u64(payload);
                let (w, real) = self.handle(cmd, mine)?;
                payload[..8].copy_from_slice(&real.to_le_bytes());
                if cmd == Command::FreeBuffer {
                    self.handles.remove(&mine);
                }
                Ok(Route::Worker(w))
            }
            Command::SetTensor
            | Command::SetTensor2d
            | Command::SetTensorHash
            | Command::GetTensor
            | Command::InitTensor
            | Command::MemsetTensor
            | Command::GetTensor2d => {
                let w = self.tensor_at(cmd, payload, 0, Placement::Anywhere)?;
                Ok(Route::Worker(w.expect("a tensor command's tensor names its worker")))
            }
            Command::CopyTensor => self.copy(payload),
            Command::GetAllocSize => {
                let w = self.device_field(cmd, payload)?;
                for i in 0..=GGML_MAX_SRC {
                    self.tensor_at(cmd, payload, 4 + i * RPC_TENSOR_SIZE, Placement::Describe(w))?;
                }
                Ok(Route::Worker(w))
            }
            Command::CommInit => Ok(Route::Answer(vec![0])),
            Command::CommAllreduce => Err(RouteError::NoCommunicator(read_u32(payload))),
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
            (Some(bytes), Some(room)) if bytes <= room => Ok(Route::Copy(CrossCopy {
                from,
                src,
                to,
                dst,
                bytes,
            })),
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
