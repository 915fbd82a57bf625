//! The commands whose bytes the session touches where they lie: a streamed body (SET_TENSOR,
//! SET_TENSOR_2D: the class [`Command::data_head`] defines in rpc-proto) consumed as it arrives,
//! its data read straight into tensor memory or staged in bounded chunks, and a GET_TENSOR reply
//! that borrows tensor memory (sent from where it is). The connection layer only moves bytes
//! between the transport and the slices these hand out; what goes where, the checks and the
//! weight cache's store are decided here, in the session, the one place each command is
//! handled.
//!
//! Use of a streamed body, as the connection does it:
//!
//! ```text
//! if let Some(mut body) = DataBody::of(cmd, size) {
//!     while let Some(mut space) = session.body_space(&mut body)? {
//!         transport.read_exact(&mut space)?;     // fills the slice
//!         drop(space);
//!         session.body_filled(&mut body)?;
//!     }
//! }
//! ```

use std::ops::{Deref, DerefMut};

use rpc_proto::{Command, DataHead, Response, DATA_HEAD_MAX};

use super::limits::Charge;
use super::{Session, SessionError};
use rpc_ggml::{HostMut, HostRef};

/// Device memory (and the runs of a strided copy) is written from host memory in chunks of at
/// most this size.
pub const STAGING_CHUNK: usize = 8 << 20;

/// A streamed body on its way in: its fixed head first, then the data.
#[derive(Debug)]
pub struct DataBody {
    cmd: Command,
    /// Bytes of the head ([`Command::data_head`]).
    head_len: usize,
    /// Bytes of data after the head.
    len: u64,
    head: [u8; DATA_HEAD_MAX],
    state: State,
}

#[derive(Debug)]
enum State {
    /// The head is being read.
    Head,
    /// The data goes straight into the host buffer `handle` at `off` (one slice).
    Host {
        handle: u64,
        off: u64,
        cache: bool,
    },
    /// The data is staged through host memory and written to its runs.
    Staged(Staging),
    Done,
}

/// Where the data of a body goes in its buffer: byte `p` of the data to
/// `off + (p / size)·stride + p % size` (one run when `size` is the whole data).
#[derive(Debug, Clone, Copy)]
struct Runs {
    off: u64,
    size: u64,
    stride: u64,
}

/// A destination written through host memory in chunks.
#[derive(Debug)]
struct Staging {
    handle: u64,
    runs: Runs,
    /// Bytes written so far.
    done: u64,
    cache: bool,
    /// Bytes staged at a time.
    chunk: usize,
    staged: Vec<u8>,
    _charge: Charge,
}

impl DataBody {
    /// The body of a `cmd` request of `size` bytes, if it is streamed: a request of the
    /// streamed-body class ([`Command::data_head`]) at least as long as its head. Anything else
    /// is read whole (one too short for its head, and refused by the decoder).
    pub fn of(cmd: Command, size: u64) -> Option<DataBody> {
        let head_len = cmd.data_head().filter(|&h| size >= h as u64)?;
        Some(DataBody {
            cmd,
            head_len,
            len: size - head_len as u64,
            head: [0; DATA_HEAD_MAX],
            state: State::Head,
        })
    }
}

/// Where the next bytes of a body go: a slice of tensor memory or of the body's own storage.
pub enum Space<'a> {
    Host(HostMut<'a>),
    Own(&'a mut [u8]),
}

impl Deref for Space<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Space::Host(h) => h,
            Space::Own(b) => b,
        }
    }
}

impl DerefMut for Space<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Space::Host(h) => h,
            Space::Own(b) => b,
        }
    }
}

/// A reply, possibly borrowing tensor memory (GET_TENSOR from a host buffer).
pub enum Reply<'a> {
    Owned(Response),
    /// GET_TENSOR's data, where it lies.
    Tensor(HostRef<'a>),
}

impl Reply<'_> {
    /// The reply as an owned [`Response`] (the tensor's bytes copied).
    pub fn into_response(self) -> Response {
        match self {
            Reply::Owned(r) => r,
            Reply::Tensor(data) => Response::GetTensor(data.to_vec()),
        }
    }
}

impl Session {
    /// The slice the next bytes of `body` must fill, or `None` when the body is complete.
    pub fn body_space<'a>(
        &'a mut self,
        body: &'a mut DataBody,
    ) -> Result<Option<Space<'a>>, SessionError> {
        let what = body.cmd.name();
        let len = usize::try_from(body.len).map_err(|_| SessionError::OutOfMemory(what))?;
        Ok(match &mut body.state {
            State::Head => Some(Space::Own(&mut body.head[..body.head_len])),
            State::Host { handle, off, .. } => {
                let buf = self.buffer_mut(*handle)?;
                let host = buf
                    .host_mut(*off, len)
                    .ok_or(SessionError::BufferBusy(what))?;
                Some(Space::Host(host))
            }
            State::Staged(st) => {
                let n = (body.len - st.done).min(st.chunk as u64) as usize;
                st.staged.clear();
                st.staged.resize(n, 0);
                Some(Space::Own(&mut st.staged))
            }
            State::Done => None,
        })
    }

    /// The slice [`Session::body_space`] gave was filled: the head is decoded and its
    /// destination checked, or the data written (staged) and, when the client asked, stored in
    /// the weight cache.
    pub fn body_filled(&mut self, body: &mut DataBody) -> Result<(), SessionError> {
        let len = body.len;
        let next = match std::mem::replace(&mut body.state, State::Done) {
            State::Head => {
                let head = DataHead::decode(body.cmd, &body.head[..body.head_len], len)?;
                self.body_destination(head, len)?
            }
            State::Host { handle, off, cache } => {
                if cache {
                    self.store_uploaded(handle, off, len);
                }
                State::Done
            }
            State::Staged(mut st) => {
                self.write_runs(body.cmd.name(), &st)?;
                st.done += st.staged.len() as u64;
                if st.done < len {
                    State::Staged(st)
                } else {
                    if st.cache {
                        if let Some(c) = &self.config.cache {
                            c.store(&st.staged);
                        }
                    }
                    State::Done
                }
            }
            State::Done => State::Done,
        };
        body.state = match (next, len) {
            // Nothing to read after the head.
            (State::Host { .. } | State::Staged(_), 0) => State::Done,
            (s, _) => s,
        };
        Ok(())
    }

    /// Where the `len` bytes of data after a head go, checked like the whole request would be:
    /// into host memory directly when they form one run there, else staged in bounded chunks
    /// (the whole payload when it must be cached, since a cache entry is written from one
    /// slice), the staging charged to the budget like a body.
    fn body_destination(&mut self, head: DataHead, len: u64) -> Result<State, SessionError> {
        let (what, handle, runs, cache, host) = match head {
            DataHead::SetTensor(hdr) => {
                let (buf, off) = self.resolve_region("SET_TENSOR", &hdr.tensor, hdr.offset, len)?;
                let host = buf.is_host();
                let cache = hdr.cache_flag != 0 && self.config.cache.is_some();
                let runs = Runs {
                    off,
                    size: len,
                    stride: 0,
                };
                ("SET_TENSOR", hdr.tensor.buffer.get(), runs, cache, host)
            }
            DataHead::SetTensor2d { tensor, region } => {
                let (buf, off) = self.resolve_region_2d("SET_TENSOR_2D", &tensor, region)?;
                let host = buf.is_host();
                // Back to back (one copy, or a stride of exactly one chunk): one run.
                let size = match region.n_copies == 1 || region.stride == region.size {
                    true => len,
                    false => region.size,
                };
                let runs = Runs {
                    off,
                    size,
                    stride: region.stride,
                };
                ("SET_TENSOR_2D", tensor.buffer.get(), runs, false, host)
            }
        };
        if runs.size == len && host {
            return Ok(State::Host {
                handle,
                off: runs.off,
                cache,
            });
        }
        let ulen = usize::try_from(len).map_err(|_| SessionError::OutOfMemory(what))?;
        let chunk = if cache { ulen } else { ulen.min(STAGING_CHUNK) };
        let charge = self
            .budget
            .charge(self.held, chunk as u64)
            .ok_or(SessionError::OverBudget(chunk as u64))?;
        let mut staged = Vec::new();
        staged
            .try_reserve_exact(chunk)
            .map_err(|_| SessionError::OutOfMemory(what))?;
        Ok(State::Staged(Staging {
            handle,
            runs,
            done: 0,
            cache,
            chunk,
            staged,
            _charge: charge,
        }))
    }

    /// Writes the staged bytes (data bytes `done..`) to their runs, in order: where runs
    /// overlap (a stride below the run size) the later one wins, as the stock server does.
    fn write_runs(&mut self, what: &'static str, st: &Staging) -> Result<(), SessionError> {
        let buf = self.buffer_mut(st.handle)?;
        let Runs { off, size, stride } = st.runs;
        let mut at = st.done;
        let mut rest = &st.staged[..];
        while !rest.is_empty() {
            // In bounds: the destination was checked for every run of the data.
            let (run, within) = (at / size, at % size);
            let n = (size - within).min(rest.len() as u64) as usize;
            let (now, later) = rest.split_at(n);
            buf.write(off + run * stride + within, now)
                .map_err(SessionError::access(what))?;
            at += n as u64;
            rest = later;
        }
        Ok(())
    }

    /// Stores an upload the client flagged for the weight cache, from where it now lies.
    fn store_uploaded(&self, handle: u64, off: u64, len: u64) {
        let (Some(cache), Ok(e), Ok(n)) = (
            &self.config.cache,
            self.buffer(handle),
            usize::try_from(len),
        ) else {
            return;
        };
        if let Some(bytes) = e.buffer.host(off, n) {
            cache.store(&bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rpc_proto::{Major, Region2d, Request, RpcTensor, SET_TENSOR_HEADER_SIZE};

    use super::*;
    use crate::tests::{alloc, assert_out_of_bounds, cpu, f32_at, session_on};
    use crate::MemoryBudget;

    /// A CPU session with one 4 KiB buffer, and a 256-float tensor at its base.
    fn cpu_session(cache: Option<rpc_weights::cache::WeightCache>) -> (Session, RpcTensor) {
        let budget = Arc::new(MemoryBudget::unlimited());
        let mut s = session_on(vec![cpu()], Major::V8, budget, cache);
        let (h, base) = alloc(&mut s, 4096);
        (s, f32_at(1, 256, h, base))
    }

    fn set_tensor_payload(t: &RpcTensor, offset: u64, data: &[u8], cache: bool) -> Vec<u8> {
        let mut out = Vec::new();
        Request::SetTensor {
            tensor: *t,
            cache_flag: u8::from(cache),
            offset,
            data,
        }
        .encode_payload(&mut out);
        out
    }

    fn set_tensor_2d_payload(t: &RpcTensor, region: Region2d, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        Request::SetTensor2d {
            tensor: *t,
            region,
            data,
        }
        .encode_payload(&mut out);
        out
    }

    /// Feeds a SET_TENSOR `payload` as a connection would, counting the slices asked for.
    fn stream(s: &mut Session, payload: &[u8]) -> Result<Vec<usize>, SessionError> {
        stream_cmd(s, Command::SetTensor, payload)
    }

    /// Feeds the `cmd` request `payload` as a connection would, counting the slices asked for.
    fn stream_cmd(
        s: &mut Session,
        cmd: Command,
        payload: &[u8],
    ) -> Result<Vec<usize>, SessionError> {
        let mut body = DataBody::of(cmd, payload.len() as u64).expect("a streamed body");
        let (mut at, mut asked) = (0, Vec::new());
        loop {
            let Some(mut space) = s.body_space(&mut body)? else {
                return Ok(asked);
            };
            let n = space.len();
            space.copy_from_slice(&payload[at..at + n]);
            at += n;
            asked.push(n);
            drop(space);
            s.body_filled(&mut body)?;
        }
    }

    fn get(s: &mut Session, t: &RpcTensor, offset: u64, size: u64) -> Vec<u8> {
        match s.reply(Request::GetTensor {
            tensor: *t,
            offset,
            size,
        }) {
            Ok(Some(Reply::Tensor(data))) => data.to_vec(),
            Ok(Some(Reply::Owned(r))) => panic!("a CPU tensor is sent from where it is: {r:?}"),
            other => panic!("GET_TENSOR: {:?}", other.err()),
        }
    }

    #[test]
    fn the_streamed_bodies_are_the_data_head_class_and_nothing_else() {
        let streamed = |cmd, size| DataBody::of(cmd, size).is_some();
        assert!(streamed(Command::SetTensor, SET_TENSOR_HEADER_SIZE as u64));
        assert!(streamed(Command::SetTensor, 1 << 30));
        assert!(streamed(
            Command::SetTensor2d,
            rpc_proto::SET_TENSOR_2D_HEADER_SIZE as u64 + 4
        ));
        // Too short for its head: read whole, and refused by the decoder.
        assert!(!streamed(Command::SetTensor, 10));
        assert!(!streamed(
            Command::SetTensor2d,
            SET_TENSOR_HEADER_SIZE as u64
        ));
        for c in Command::EVERY {
            assert_eq!(streamed(c, 1 << 30), c.data_head().is_some(), "{c}");
        }
    }

    #[test]
    fn a_strided_body_lands_run_by_run_and_a_back_to_back_one_in_one_slice() {
        let (mut s, t) = cpu_session(None);
        // Four runs of 8 bytes, 32 apart, from tensor offset 16.
        let data: Vec<u8> = (1..=32).collect();
        let region = Region2d {
            offset: 16,
            size: 8,
            n_copies: 4,
            stride: 32,
        };
        let payload = set_tensor_2d_payload(&t, region, &data);
        let before = get(&mut s, &t, 0, 256);
        let mut want = before.clone();
        for i in 0..4 {
            let at = 16 + i * 32;
            want[at..at + 8].copy_from_slice(&data[i * 8..i * 8 + 8]);
        }
        let asked = stream_cmd(&mut s, Command::SetTensor2d, &payload).unwrap();
        assert_eq!(asked, vec![rpc_proto::SET_TENSOR_2D_HEADER_SIZE, 32]);
        let back = get(&mut s, &t, 0, 256);
        assert_eq!(back, want, "each run in place, the gaps untouched");
        // The same bytes through the whole request, on the same memory: the same result.
        let (mut whole, t2) = cpu_session(None);
        stream(&mut whole, &set_tensor_payload(&t2, 0, &before, false)).unwrap();
        whole
            .handle(Request::SetTensor2d {
                tensor: t2,
                region,
                data: &data,
            })
            .unwrap();
        assert_eq!(get(&mut whole, &t2, 0, 256), back);
        // Back to back: straight into the tensor, one slice.
        let region = Region2d {
            offset: 512,
            size: 8,
            n_copies: 4,
            stride: 8,
        };
        let payload = set_tensor_2d_payload(&t, region, &data);
        let asked = stream_cmd(&mut s, Command::SetTensor2d, &payload).unwrap();
        assert_eq!(asked, vec![rpc_proto::SET_TENSOR_2D_HEADER_SIZE, 32]);
        assert_eq!(get(&mut s, &t, 512, 32), data);
    }

    #[test]
    fn overlapping_runs_are_written_in_order_the_later_winning() {
        let (mut s, t) = cpu_session(None);
        // Stride 4 under a run of 8: run i+1 overwrites the second half of run i.
        let data: Vec<u8> = (1..=24).collect();
        let region = Region2d {
            offset: 0,
            size: 8,
            n_copies: 3,
            stride: 4,
        };
        let payload = set_tensor_2d_payload(&t, region, &data);
        stream_cmd(&mut s, Command::SetTensor2d, &payload).unwrap();
        let want: Vec<u8> = [&data[0..4], &data[8..12], &data[16..24]].concat();
        assert_eq!(get(&mut s, &t, 0, 16), want);
        // Stride 0: the last run is what stays.
        let region = Region2d {
            offset: 64,
            size: 8,
            n_copies: 3,
            stride: 0,
        };
        let payload = set_tensor_2d_payload(&t, region, &data);
        stream_cmd(&mut s, Command::SetTensor2d, &payload).unwrap();
        assert_eq!(get(&mut s, &t, 64, 8), &data[16..24]);
    }

    #[test]
    fn a_strided_body_is_refused_at_its_head_before_any_data() {
        let (mut s, t) = cpu_session(None);
        let before = get(&mut s, &t, 0, 1024);
        let head_only = |s: &mut Session, payload: &[u8]| {
            let mut body = DataBody::of(Command::SetTensor2d, payload.len() as u64).unwrap();
            let mut space = s.body_space(&mut body).unwrap().expect("the head");
            let n = space.len();
            space.copy_from_slice(&payload[..n]);
            drop(space);
            s.body_filled(&mut body)
        };
        // The last run ends past the 1 KiB tensor (4 × 8 bytes, 300 apart, from 200).
        let region = Region2d {
            offset: 200,
            size: 8,
            n_copies: 4,
            stride: 300,
        };
        let err = head_only(&mut s, &set_tensor_2d_payload(&t, region, &[7; 32])).unwrap_err();
        assert!(matches!(err, SessionError::OutOfBounds { .. }), "{err}");
        // Data that is not size × n_copies bytes: refused as the decoder refuses it.
        let region = Region2d {
            offset: 0,
            size: 8,
            n_copies: 4,
            stride: 8,
        };
        let mut payload = set_tensor_2d_payload(&t, region, &[7; 32]);
        payload.pop();
        let err = head_only(&mut s, &payload).unwrap_err();
        assert!(matches!(err, SessionError::Decode(_)), "{err}");
        // Nothing was written.
        assert_eq!(get(&mut s, &t, 0, 1024), before);
    }

    #[test]
    fn a_streamed_body_lands_in_the_tensor_in_one_slice_after_its_header() {
        let (mut s, t) = cpu_session(None);
        let data: Vec<u8> = (0..512u32).map(|i| (i * 7) as u8).collect();
        let asked = stream(&mut s, &set_tensor_payload(&t, 64, &data, false)).unwrap();
        assert_eq!(
            asked,
            vec![SET_TENSOR_HEADER_SIZE, 512],
            "header, then the data at once"
        );
        assert_eq!(get(&mut s, &t, 64, 512), data);
    }

    #[test]
    fn the_whole_request_takes_the_streamed_path() {
        let (mut s, t) = cpu_session(None);
        let data = vec![0xAB; 100];
        assert!(s
            .handle(Request::SetTensor {
                tensor: t,
                cache_flag: 0,
                offset: 8,
                data: &data,
            })
            .unwrap()
            .is_none());
        assert_eq!(get(&mut s, &t, 8, 100), data);
        // GET_TENSOR through `handle` owns its bytes.
        let Ok(Some(Response::GetTensor(owned))) = s.handle(Request::GetTensor {
            tensor: t,
            offset: 8,
            size: 100,
        }) else {
            panic!("GET_TENSOR")
        };
        assert_eq!(owned, data);
    }

    #[test]
    fn a_body_outside_its_tensor_is_refused_at_its_header_before_any_data() {
        let (mut s, t) = cpu_session(None);
        // A 4096-byte buffer: 1000 bytes at offset 3500 do not fit.
        let payload = set_tensor_payload(&t, 3500, &[1; 1000], false);
        let mut body = DataBody::of(Command::SetTensor, payload.len() as u64).unwrap();
        let mut space = s.body_space(&mut body).unwrap().expect("the header");
        space.copy_from_slice(&payload[..SET_TENSOR_HEADER_SIZE]);
        drop(space);
        let err = s.body_filled(&mut body).unwrap_err();
        assert_out_of_bounds(&err, "SET_TENSOR");
        // A header naming an unknown buffer, likewise.
        let mut other = t;
        other.buffer.set(0xdead);
        let err = stream(&mut s, &set_tensor_payload(&other, 0, &[1; 4], false)).unwrap_err();
        assert!(matches!(err, SessionError::UnknownBuffer(0xdead)), "{err}");
    }

    #[test]
    fn a_flagged_upload_is_stored_in_the_weight_cache_from_the_tensor() {
        let dir = std::env::temp_dir().join(format!("rpc-body-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let cache = rpc_weights::cache::WeightCache::open(&dir, None).unwrap();
        let (mut s, t) = cpu_session(Some(cache));
        let data: Vec<u8> = (0..600u32).map(|i| (i % 251) as u8).collect();
        let hash = rpc_proto::fnv1a64(&data);
        stream(&mut s, &set_tensor_payload(&t, 0, &data, false)).unwrap();
        let cache = s.cache().unwrap();
        assert_eq!(cache.entry_len(hash), None, "not flagged: not stored");
        stream(&mut s, &set_tensor_payload(&t, 0, &data, true)).unwrap();
        assert_eq!(s.cache().unwrap().entry_len(hash), Some(600));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn hello_answers_the_sessions_major() {
        let (s, _) = cpu_session(None);
        let mut out = Vec::new();
        s.hello([0; rpc_proto::CONN_CAPS_SIZE]).encode(&mut out);
        let mut want = Vec::new();
        Response::hello(Major::V8, [0; rpc_proto::CONN_CAPS_SIZE]).encode(&mut want);
        assert_eq!(out, want);
    }
}
