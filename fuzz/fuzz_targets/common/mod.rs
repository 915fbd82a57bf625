//! Shared harness of the server fuzz targets: an in-process rpc-server session on the CPU
//! backend, driven by command frames whose buffer handles and data addresses are symbolic.
//!
//! A harness speaks one protocol major (7.0.0 or 8.0.0, [`Harness::new`]): command bytes,
//! payload layouts (GRAPH_COMPUTE's uid, 8.0's commands 18..=22) and the session follow it.
//!
//! Input format (what `capture.py` writes from recorded client traffic), repeated:
//!
//! ```text
//! | cmd: u8 | len: u32 LE | payload[len] |
//! ```
//!
//! The payload is the wire payload of the command, except that buffer handles are 1-based
//! indices into the buffers this input allocated, and in every `rpc_tensor` whose `buffer` is such
//! an index, `data` is an offset from that buffer's base. The harness substitutes the real handle
//! and address, then feeds the frame through `check_frame`, `Request::decode` and
//! `Session::handle`, exactly as the connection loop does. Anything the session refuses ends the
//! "connection" (the rest of the input is ignored), as on the real server.

use std::sync::{Arc, OnceLock};

use rpc_ggml::{Device, DeviceKind};
use rpc_proto::{
    check_frame, Command, FrameHeader, Limits, Major, Request, Response, RpcTensor, Target,
    RPC_TENSOR_SIZE,
};
use rpc_session::{MemoryBudget, MemoryLimits, Session, SessionConfig};

/// Largest buffer an input may allocate (larger requests are clamped).
pub const MAX_ALLOC: u64 = 8 << 20;

pub const LIMITS: Limits = Limits {
    max_request_size: 16 << 20,
    max_graph_nodes: 4096,
    max_graph_tensors: 4096,
};

fn config() -> Arc<SessionConfig> {
    static CONFIG: OnceLock<Arc<SessionConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            // No rpc_ggml::load_backends(): it installs the callback that parks a thread
            // on a ggml assertion; under the fuzzer an assertion must abort and be reported.
            let cpu = Device::all()
                .into_iter()
                .find(|d| d.kind() == DeviceKind::Cpu)
                .expect("CPU device");
            Arc::new(SessionConfig {
                devices: vec![cpu],
                n_threads: 1,
                cache: None,
                local: None,
            })
        })
        .clone()
}

pub struct Harness {
    major: Major,
    session: Session,
    handles: Vec<u64>,
    bases: Vec<u64>,
    /// Data of the last GET_TENSOR response.
    last_get: Option<Vec<u8>>,
}

impl Harness {
    /// A fresh session of a `major` connection.
    pub fn new(major: Major) -> Harness {
        let budget = Arc::new(MemoryBudget::new(MemoryLimits {
            per_connection: 64 << 20,
            total: 64 << 20,
        }));
        Harness {
            major,
            session: Session::new(config(), major, budget),
            handles: Vec::new(),
            bases: Vec::new(),
            last_get: None,
        }
    }

    /// Number of buffers allocated so far (the last one's 1-based index).
    #[allow(dead_code)]
    pub fn buffers(&self) -> usize {
        self.handles.len()
    }

    /// Runs one GET_TENSOR command (symbolic payload) and returns the bytes read.
    #[allow(dead_code)]
    pub fn get_tensor(&mut self, payload: &[u8]) -> Option<Vec<u8>> {
        self.last_get = None;
        if self.exec(Command::GetTensor as u8, payload) {
            self.last_get.take()
        } else {
            None
        }
    }

    fn handle_of(&self, idx: u64) -> u64 {
        match usize::try_from(idx)
            .ok()
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| self.handles.get(i))
        {
            Some(&h) => h,
            None => idx,
        }
    }

    fn translate_tensor(&self, b: &mut [u8]) {
        let Some(mut t) = RpcTensor::from_wire(b) else {
            return;
        };
        let idx = t.buffer.get();
        if let Some(i) = usize::try_from(idx)
            .ok()
            .and_then(|i| i.checked_sub(1))
            .filter(|&i| i < self.handles.len())
        {
            t.buffer.set(self.handles[i]);
            t.data.set(self.bases[i].wrapping_add(t.data.get()));
        }
        b.copy_from_slice(&t.to_wire());
    }

    fn translate_tensors(&self, p: &mut [u8], at: usize, n: usize) {
        for k in 0..n {
            let s = at + k * RPC_TENSOR_SIZE;
            if let Some(b) = p.get_mut(s..s + RPC_TENSOR_SIZE) {
                self.translate_tensor(b);
            }
        }
    }

    fn translate_handle(&self, p: &mut [u8]) {
        if let Some(b) = p.get_mut(0..8) {
            let idx = u64::from_le_bytes(b.try_into().unwrap());
            b.copy_from_slice(&self.handle_of(idx).to_le_bytes());
        }
    }

    /// Runs one command. Returns false when the session refused it (the server would close the
    /// connection).
    pub fn exec(&mut self, cmd_byte: u8, payload: &[u8]) -> bool {
        let mut p = payload.to_vec();
        let Some(cmd) = self.major.command(cmd_byte) else {
            return false;
        };
        if cmd == Command::AllocBuffer && p.len() == 12 {
            let size = u64::from_le_bytes(p[4..12].try_into().unwrap()).min(MAX_ALLOC);
            p[4..12].copy_from_slice(&size.to_le_bytes());
        }
        // What the request names, where (declared with the command in rpc-proto).
        match cmd.target() {
            Target::Server => {}
            Target::Buffer => self.translate_handle(&mut p),
            Target::Tensors(n) => self.translate_tensors(&mut p, 0, n),
            Target::Device { tensors } | Target::LinkSlot { tensors } => {
                self.translate_tensors(&mut p, 4, tensors)
            }
            Target::Graph => {
                // | u32 device | u64 uid (8.0) | u32 n_nodes | u64 ids[n_nodes] | u32 n_tensors | tensors |
                let n_nodes_at = if self.major == Major::V8 { 12 } else { 4 };
                if let Some(b) = p.get(n_nodes_at..n_nodes_at + 4) {
                    let n_nodes = u32::from_le_bytes(b.try_into().unwrap()) as usize;
                    let at = (n_nodes_at + 4)
                        .saturating_add(n_nodes.saturating_mul(8))
                        .saturating_add(4);
                    if at <= p.len() {
                        let n = (p.len() - at) / RPC_TENSOR_SIZE;
                        self.translate_tensors(&mut p, at, n);
                    }
                }
            }
        }
        let h = FrameHeader {
            cmd: cmd_byte,
            size: p.len() as u64,
        };
        let Ok(cmd) = check_frame(self.major, &h, &LIMITS) else {
            return false;
        };
        if cmd == Command::Hello {
            return true; // handled by the connection layer; a second one is refused there
        }
        let Ok(req) = Request::decode(self.major, cmd, &p, &LIMITS) else {
            return false;
        };
        match self.session.handle(req) {
            Ok(Some(Response::AllocBuffer { remote_ptr, .. })) if remote_ptr != 0 => {
                let base = match self.session.handle(Request::BufferGetBase { remote_ptr }) {
                    Ok(Some(Response::BufferGetBase { base_ptr })) => base_ptr,
                    _ => panic!("BUFFER_GET_BASE of a fresh buffer failed"),
                };
                self.handles.push(remote_ptr);
                self.bases.push(base);
                true
            }
            Ok(Some(Response::GetTensor(data) | Response::GetTensor2d(data))) => {
                self.last_get = Some(data);
                true
            }
            Ok(_) => true,
            Err(_) => false,
        }
    }
}

/// Splits an input into `(cmd, payload)` frames.
#[allow(dead_code)]
pub fn frames(mut data: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    std::iter::from_fn(move || {
        let (&cmd, rest) = data.split_first()?;
        let (len, rest) = rest.split_first_chunk::<4>()?;
        let len = (u32::from_le_bytes(*len) as usize).min(rest.len());
        let (payload, tail) = rest.split_at(len);
        data = tail;
        Some((cmd, payload))
    })
}
