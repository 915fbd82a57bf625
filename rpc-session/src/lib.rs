//! `rpc-session`: the per-connection protocol state of `rpc-server`, sans-IO: buffers, backends
//! and stored graphs, driven by decoded requests. No I/O here: the server's connection layer
//! feeds requests and writes the replies.
//!
//! One [`Session`] per connection. Everything it owns is freed when it is dropped, i.e. when the
//! connection ends, whatever the reason. Every command is handled here ([`Session::reply`]);
//! SET_TENSOR's streamed body and GET_TENSOR's borrowed reply in `body.rs`, wire tensors in
//! `tensor.rs`, GRAPH_COMPUTE's wire side as a pipeline of named steps in `graph.rs` (steps in
//! `graph/`; the per-op rules and index checks are rpc-ggml's, run by `Graph::build` and
//! `Backend::compute`), the graphs kept for GRAPH_RECOMPUTE in `graph_cache.rs`, 8.0's
//! strided copies in `strided.rs` and collectives in `collectives.rs`, our LINK_* slots in
//! `links.rs`, ALLOC_BUFFER budgets in `limits.rs`, errors in `error.rs`.
//!
//! A server-to-server link is reached through [`peer`]'s traits alone ([`peer::Connector`],
//! [`peer::PeerLink`]), which the server implements over its sockets and queue pairs. It
//! depends on `rpc-ggml` (the only way to ggml), `rpc-weights` (SET_TENSOR_HASH from disk),
//! `rpc-proto`, and nothing of the server or of any I/O.

#![forbid(unsafe_code)]

mod body;
mod collectives;
mod error;
mod graph;
mod graph_cache;
mod limits;
mod links;
pub mod peer;
mod strided;
mod tensor;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use rand::Rng;
use rpc_proto::{Command, Major, Request, Response, RpcTensor};

pub use body::{DataBody, Reply, Space};
pub use error::SessionError;
pub use limits::{MemoryBudget, MemoryLimits, Upstream};
/// `ggml_nbytes`, checked (rpc-ggml's, kept here for users of this crate).
pub use rpc_ggml::nbytes;
use tensor::UnknownBuffer;

use crate::peer::Connector;
use graph_cache::GraphCache;
use rpc_ggml::{Backend, Buffer, Device, Graph, ScratchTensors};
use rpc_weights::cache::WeightCache;
use rpc_weights::local_weights::LocalWeights;

/// Server-wide settings every session reads.
pub struct SessionConfig {
    pub devices: Vec<Device>,
    pub n_threads: usize,
    pub cache: Option<WeightCache>,
    /// Tensors of the worker's own GGUF files (`--gguf`), asked before the cache.
    pub local: Option<LocalWeights>,
}

struct BufferEntry {
    /// The buffer's one owner: writing its bytes goes through `&mut` of this entry.
    buffer: Buffer,
    /// The base address this connection was told (random, aligned); `data` fields are
    /// interpreted relative to it.
    vbase: u64,
}

/// Per-connection state.
pub struct Session {
    config: Arc<SessionConfig>,
    /// The protocol major of the connection (fixed by its listener).
    major: Major,
    buffers: HashMap<u64, BufferEntry>,
    backends: Vec<Option<Backend>>,
    /// Per device: the graphs kept for GRAPH_RECOMPUTE (`graph_cache.rs`).
    graphs: Vec<GraphCache<Graph>>,
    /// How COMM_INIT sets up a link to the peer server (`None`: it answers 0).
    connector: Option<Arc<dyn Connector>>,
    /// Per device: the pairwise link of 8.0's collectives, between COMM_INIT and COMM_FREE.
    links: Vec<Option<collectives::Joined>>,
    /// The connection's worker-to-worker links (our LINK_* extension, `links.rs`).
    slots: links::Slots,
    /// Bytes sent and received on those links since [`Session::take_link_bytes`].
    link_bytes: (u64, u64),
    /// Server-wide memory account; `held` is this session's share of it (buffers and stored
    /// graphs).
    budget: Arc<MemoryBudget>,
    held: u64,
    /// Whether this session ever allocated a buffer (its memory is trimmed when it ends).
    allocated_any: bool,
}

/// Virtual base addresses are drawn from [2^40, 2^47): far from 0, no overflow for any size a
/// buffer can have, and 2^47 / alignment possibilities.
const VBASE_MIN: u64 = 1 << 40;
const VBASE_SPAN: u64 = (1 << 47) - (1 << 40);

impl Session {
    /// A session of a `major` connection whose buffers and stored graphs count against `budget`
    /// (shared by the server's sessions; [`MemoryBudget::unlimited`] for none).
    pub fn new(config: Arc<SessionConfig>, major: Major, budget: Arc<MemoryBudget>) -> Session {
        let n = config.devices.len();
        Session {
            config,
            major,
            buffers: HashMap::new(),
            backends: (0..n).map(|_| None).collect(),
            graphs: (0..n).map(|_| GraphCache::default()).collect(),
            connector: None,
            links: (0..n).map(|_| None).collect(),
            slots: links::Slots::default(),
            link_bytes: (0, 0),
            budget,
            held: 0,
            allocated_any: false,
        }
    }

    fn device(&self, device: u32) -> Result<&Device, SessionError> {
        self.config
            .devices
            .get(device as usize)
            .ok_or(SessionError::BadDevice {
                device,
                count: self.config.devices.len(),
            })
    }

    fn buffer(&self, handle: u64) -> Result<&BufferEntry, SessionError> {
        self.buffers
            .get(&handle)
            .ok_or(SessionError::UnknownBuffer(handle))
    }

    /// The buffer `handle` names, to write to.
    fn buffer_mut(&mut self, handle: u64) -> Result<&mut Buffer, SessionError> {
        self.buffers
            .get_mut(&handle)
            .map(|e| &mut e.buffer)
            .ok_or(SessionError::UnknownBuffer(handle))
    }

    /// The protocol major of this session's connection.
    pub fn major(&self) -> Major {
        self.major
    }

    /// Bytes sent and received on the collectives' links since the last call (for the counters).
    pub fn take_link_bytes(&mut self) -> (u64, u64) {
        std::mem::take(&mut self.link_bytes)
    }

    /// Lets COMM_INIT set up links with `connector` (without one it answers 0: no collectives,
    /// the client reduces through itself).
    pub fn set_connector(&mut self, connector: Arc<dyn Connector>) {
        self.connector = Some(connector);
    }

    /// The memory budget this session's buffers count against.
    pub fn budget(&self) -> &Arc<MemoryBudget> {
        &self.budget
    }

    /// Number of live buffers and their total size.
    pub fn allocated(&self) -> (usize, u64) {
        (
            self.buffers.len(),
            self.buffers.values().map(|e| e.buffer.size()).sum(),
        )
    }

    /// Whether this session holds anything a client relies on: a buffer or a stored graph. A
    /// session that does must never end on silence (a long-running `llama-server` sits idle
    /// between requests with its model here); budgets, not silence, bound what it may hold.
    pub fn holds_state(&self) -> bool {
        !self.buffers.is_empty() || self.graphs.iter().any(GraphCache::holds_any)
    }

    /// Executes one request (a SET_TENSOR already read whole: the network's are streamed,
    /// [`Session::body_space`]). `Ok(None)` for commands without a reply; a GET_TENSOR's reply
    /// borrows the tensor's memory where it can.
    pub fn reply(&mut self, req: Request<'_>) -> Result<Option<Reply<'_>>, SessionError> {
        if let Request::GetTensor {
            tensor,
            offset,
            size,
        } = &req
        {
            return self.get_tensor(tensor, *offset, *size).map(Some);
        }
        Ok(self.handle(req)?.map(Reply::Owned))
    }

    /// [`Session::reply`] with every reply owned (tests, fuzzing).
    pub fn handle(&mut self, req: Request<'_>) -> Result<Option<Response>, SessionError> {
        Ok(match req {
            Request::Hello { .. } => return Err(SessionError::UnexpectedHello),
            Request::DeviceCount => Some(Response::DeviceCount {
                count: self.config.devices.len() as u32,
            }),
            Request::GetAlignment { device } => Some(Response::GetAlignment {
                alignment: self.device(device)?.alignment(),
            }),
            Request::GetMaxSize { device } => Some(Response::GetMaxSize {
                max_size: self.device(device)?.max_size(),
            }),
            Request::GetDeviceMemory { device } => {
                let (free, total) = self.device(device)?.memory();
                Some(Response::GetDeviceMemory { free, total })
            }
            Request::AllocBuffer { device, size } => Some(self.alloc_buffer(device, size)?),
            Request::BufferGetBase { remote_ptr } => Some(Response::BufferGetBase {
                base_ptr: self.buffer(remote_ptr)?.vbase,
            }),
            Request::FreeBuffer { remote_ptr } => {
                let e = self
                    .buffers
                    .remove(&remote_ptr)
                    .ok_or(SessionError::UnknownBuffer(remote_ptr))?;
                self.release(e.buffer.size());
                // 7.0: a stored graph pointing into this buffer can never be recomputed
                // (#25703). 8.0: every stored graph is dropped, as the stock server does.
                let major = self.major;
                let freed: u64 = self
                    .graphs
                    .iter_mut()
                    .map(|c| c.drop_graphs(|g| major == Major::V8 || g.uses(&e.buffer)))
                    .sum();
                self.release(freed);
                None
            }
            Request::BufferClear { remote_ptr, value } => {
                self.buffer_mut(remote_ptr)?
                    .clear(value)
                    .map_err(SessionError::access("BUFFER_CLEAR"))?;
                None
            }
            Request::SetTensor { .. } | Request::SetTensor2d { .. } => {
                // The same path as a body streamed from the network.
                let mut payload = Vec::new();
                req.encode_payload(&mut payload);
                self.feed_body(req.command(), &payload)?;
                None
            }
            Request::SetTensorHash {
                tensor,
                offset,
                hash,
            } => Some(self.set_tensor_hash(&tensor, offset, hash)?),
            Request::GetTensor {
                tensor,
                offset,
                size,
            } => Some(self.get_tensor(&tensor, offset, size)?.into_response()),
            Request::MemsetTensor {
                tensor,
                offset,
                size,
                value,
            } => {
                let spec = self.resolve_tensor(&tensor, UnknownBuffer::Reject)?;
                let tsize = spec.size();
                if offset > tsize || size > tsize - offset {
                    return Err(SessionError::OutOfBounds {
                        what: "MEMSET_TENSOR",
                        detail: format!("offset={offset} size={size} tensor size={tsize}"),
                    });
                }
                let (buf, off) = self.resolve_region_mut("MEMSET_TENSOR", &tensor, offset, size)?;
                buf.memset(off, size, value)
                    .map_err(SessionError::access("MEMSET_TENSOR"))?;
                None
            }
            Request::CopyTensor { src, dst } => Some(self.copy_tensor(&src, &dst)?),
            Request::InitTensor { tensor } => {
                let spec = self.resolve_tensor(&tensor, UnknownBuffer::Reject)?;
                if spec.buffer().is_some() {
                    let mut s = ScratchTensors::new(&[spec])
                        .ok_or(SessionError::OutOfMemory("INIT_TENSOR"))?;
                    s.init_tensor(0).map_err(SessionError::InitTensor)?;
                }
                None
            }
            Request::GetAllocSize {
                device,
                tensor,
                srcs,
            } => {
                let dev = self.device(device)?.clone();
                let main = self.resolve_tensor(&tensor, UnknownBuffer::Ignore)?;
                let mut specs = vec![main];
                let mut slots = Vec::new();
                for (i, s) in srcs.iter().enumerate() {
                    if s.id.get() != 0 {
                        // Like the stock server, a source that does not resolve is left out.
                        if let Ok(spec) = self.resolve_tensor(s, UnknownBuffer::Ignore) {
                            slots.push((i, specs.len()));
                            specs.push(spec);
                        }
                    }
                }
                let mut scratch = ScratchTensors::new(&specs)
                    .ok_or(SessionError::OutOfMemory("GET_ALLOC_SIZE"))?;
                for (slot, idx) in slots {
                    scratch.set_src(0, slot, idx);
                }
                let alloc_size = scratch
                    .alloc_size(0, &dev)
                    .map_err(|why| SessionError::tensor(&tensor, why))?;
                Some(Response::GetAllocSize { alloc_size })
            }
            Request::GraphCompute(g) => {
                self.compute_and_keep(&g)?;
                None
            }
            Request::GraphRecompute { device, uid } => {
                self.recompute(device, uid)?;
                None
            }
            Request::GetTensor2d { tensor, region } => {
                Some(Response::GetTensor2d(self.get_tensor_2d(&tensor, region)?))
            }
            Request::CommInit(init) => Some(Response::CommInit {
                ok: u8::from(self.comm_init(&init)),
            }),
            Request::CommAllreduce { device, tensor } => {
                self.comm_allreduce(device, &tensor)?;
                None
            }
            Request::CommFree { device } => {
                self.device(device)?;
                self.comm_free(device);
                None
            }
            Request::LinkProbe => Some(self.link_probe()),
            Request::LinkOpen { slot, init } => Some(Response::LinkOpen {
                ok: u8::from(self.link_open(slot, &init)),
            }),
            Request::LinkSend { slot, tensor, size } => {
                self.link_send(slot, &tensor, size)?;
                None
            }
            Request::LinkRecv { slot, tensor, size } => {
                self.link_recv(slot, &tensor, size)?;
                None
            }
            Request::LinkClose { slot } => {
                self.link_close(slot);
                None
            }
        })
    }

    /// Gives `n` bytes of this session's holding back to the budget.
    fn release(&mut self, n: u64) {
        self.budget.release(n);
        self.held = self.held.saturating_sub(n);
    }

    fn alloc_buffer(&mut self, device: u32, size: u64) -> Result<Response, SessionError> {
        let dev = self.device(device)?;
        let align = dev
            .alignment()
            .clamp(1, 1 << 30)
            .next_power_of_two()
            .max(4096);
        let null = Response::AllocBuffer {
            remote_ptr: 0,
            remote_size: 0,
        };
        if !self.budget.try_reserve(self.held, size) {
            let l = self.budget.limits();
            tracing::warn!(
                device,
                size,
                held = self.held,
                server_used = self.budget.used(),
                per_connection = l.per_connection,
                total = l.total,
                "ALLOC_BUFFER beyond the memory limit; answering a null handle"
            );
            return Ok(null);
        }
        let Some(buffer) = dev.alloc_buffer(size) else {
            self.budget.release(size);
            tracing::warn!(device, size, "ALLOC_BUFFER failed; answering a null handle");
            return Ok(null);
        };
        let remote_size = buffer.size();
        // Account for the size ggml actually allocated.
        if remote_size > size {
            if !self
                .budget
                .try_reserve(self.held + size, remote_size - size)
            {
                self.budget.release(size);
                return Ok(null);
            }
        } else {
            self.budget.release(size - remote_size);
        }
        self.held += remote_size;
        self.allocated_any = true;
        let mut rng = rand::thread_rng();
        let handle = loop {
            let h: u64 = rng.gen();
            if h != 0 && !self.buffers.contains_key(&h) {
                break h;
            }
        };
        let vbase = (VBASE_MIN + rng.gen_range(0..VBASE_SPAN)) & !(align - 1);
        self.buffers.insert(handle, BufferEntry { buffer, vbase });
        Ok(Response::AllocBuffer {
            remote_ptr: handle,
            remote_size,
        })
    }

    fn set_tensor_hash(
        &mut self,
        tensor: &RpcTensor,
        offset: u64,
        hash: u64,
    ) -> Result<Response, SessionError> {
        if self.set_tensor_hash_local(tensor, offset, hash) {
            return Ok(Response::SetTensorHash { result: 1 });
        }
        let config = self.config.clone();
        let Some(cache) = &config.cache else {
            return Ok(Response::SetTensorHash { result: 0 });
        };
        let Some(len) = cache.entry_len(hash) else {
            cache.record_lookup(None);
            return Ok(Response::SetTensorHash { result: 0 });
        };
        // Device memory is staged through host memory, charged to the budget like a body.
        let (budget, held) = (self.budget.clone(), self.held);
        let (buf, off) = self.resolve_region_mut("SET_TENSOR_HASH", tensor, offset, len)?;
        let hit = cache.load_into(hash, len, buf, off, |n| budget.charge(held, n));
        cache.record_lookup(hit.then_some(len));
        Ok(Response::SetTensorHash {
            result: u8::from(hit),
        })
    }

    /// SET_TENSOR_HASH from a local GGUF file (`--gguf`): true when the tensor now holds the
    /// bytes hashing to `hash`. A region the client's tensor cannot hold is "not found" here
    /// (the client then uploads, and its SET_TENSOR is checked as any).
    fn set_tensor_hash_local(&mut self, tensor: &RpcTensor, offset: u64, hash: u64) -> bool {
        let config = self.config.clone();
        let Some(local) = &config.local else {
            return false;
        };
        let Some(len) = local.entry_len(hash) else {
            return false;
        };
        // Device memory is staged through host memory, charged to the budget like a body.
        let (budget, held) = (self.budget.clone(), self.held);
        let Ok((buf, off)) = self.resolve_region_mut("SET_TENSOR_HASH", tensor, offset, len) else {
            return false;
        };
        local.load_into(hash, len, buf, off, |n| budget.charge(held, n))
    }

    fn copy_tensor(&mut self, src: &RpcTensor, dst: &RpcTensor) -> Result<Response, SessionError> {
        let s = self.resolve_tensor(src, UnknownBuffer::Reject)?;
        let d = self.resolve_tensor(dst, UnknownBuffer::Reject)?;
        let (Some(_), Some((dbuf, doff))) = (s.buffer(), d.buffer()) else {
            return Err(SessionError::tensor(
                dst,
                "COPY_TENSOR needs both tensors in buffers",
            ));
        };
        let ssize = s.size();
        if doff.checked_add(ssize).is_none_or(|end| end > dbuf.size()) {
            return Err(SessionError::OutOfBounds {
                what: "COPY_TENSOR",
                detail: format!(
                    "{ssize} bytes at offset {doff} of a {}-byte buffer",
                    dbuf.size()
                ),
            });
        }
        let scratch =
            ScratchTensors::new(&[s, d]).ok_or(SessionError::OutOfMemory("COPY_TENSOR"))?;
        let copied = scratch
            .copy(0, 1)
            .map_err(SessionError::access("COPY_TENSOR"))?;
        Ok(Response::CopyTensor {
            result: copied as u8,
        })
    }

    fn backend(&mut self, device: usize) -> Result<&mut Backend, SessionError> {
        if self.backends[device].is_none() {
            let dev = &self.config.devices[device];
            let b = dev
                .init_backend(self.config.n_threads)
                .ok_or_else(|| SessionError::Backend(dev.name().into()))?;
            self.backends[device] = Some(b);
        }
        Ok(self.backends[device]
            .as_mut()
            .expect("backend just created"))
    }

    /// HELLO: the reply of this session's major, with the transport's `caps` (all zero: TCP,
    /// negotiated by `rdma.rs`). Only as a connection's first command.
    pub fn hello(&self, caps: [u8; rpc_proto::CONN_CAPS_SIZE]) -> Response {
        Response::hello(self.major, caps)
    }

    /// GET_TENSOR: the bytes of the region, borrowed from a host buffer, else copied out.
    fn get_tensor(
        &self,
        tensor: &RpcTensor,
        offset: u64,
        size: u64,
    ) -> Result<Reply<'_>, SessionError> {
        let (buf, off) = self.resolve_region("GET_TENSOR", tensor, offset, size)?;
        let len =
            usize::try_from(size).map_err(|_| SessionError::OutOfMemory("GET_TENSOR reply"))?;
        if let Some(data) = buf.host(off, len) {
            return Ok(Reply::Tensor(data));
        }
        let mut out = Vec::new();
        out.try_reserve_exact(len)
            .map_err(|_| SessionError::OutOfMemory("GET_TENSOR reply"))?;
        out.resize(len, 0);
        buf.read(off, &mut out)
            .map_err(SessionError::access("GET_TENSOR"))?;
        Ok(Reply::Owned(Response::GetTensor(out)))
    }

    /// A streamed body that is already in memory, through the streamed path.
    fn feed_body(&mut self, cmd: Command, mut payload: &[u8]) -> Result<(), SessionError> {
        // A request that decoded is at least as long as its head.
        let mut body = DataBody::of(cmd, payload.len() as u64).ok_or(SessionError::Decode(
            rpc_proto::DecodeError::Malformed("no data head"),
        ))?;
        loop {
            let Some(mut space) = self.body_space(&mut body)? else {
                return Ok(());
            };
            let n = space.len();
            let (now, rest) = payload.split_at(n.min(payload.len()));
            space[..now.len()].copy_from_slice(now);
            payload = rest;
            drop(space);
            self.body_filled(&mut body)?;
        }
    }

    /// The weight cache, if enabled (`-c`).
    pub fn cache(&self) -> Option<&WeightCache> {
        self.config.cache.as_ref()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // The buffers are freed with the session (and its stored graphs).
        self.budget.release(self.held);
        let used_memory = self.allocated_any || self.backends.iter().any(Option::is_some);
        self.buffers.clear();
        self.graphs.clear();
        self.backends.clear();
        if used_memory {
            rpc_ggml::trim_heap();
        }
    }
}
