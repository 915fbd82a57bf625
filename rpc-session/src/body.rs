//! The commands whose bytes the session touches where they lie: a SET_TENSOR body consumed as it
//! arrives (its data read straight into tensor memory), and a GET_TENSOR reply that borrows
//! tensor memory (sent from where it is). The connection layer only moves bytes between the
//! transport and the slices these hand out; what goes where, the checks and the weight cache's
//! store are decided here, in the session, the one place each command is handled.
//!
//! Use of a streamed body, as the connection does it:
//!
//! ```text
//! let mut body = SetTensorBody::new(size);
//! while let Some(mut space) = session.body_space(&mut body)? {
//!     transport.read_exact(&mut space)?;     // fills the slice
//!     drop(space);
//!     session.body_filled(&mut body)?;
//! }
//! ```

use std::ops::{Deref, DerefMut};

use rpc_proto::{Command, Response, SetTensorHeader, SET_TENSOR_HEADER_SIZE};

use super::limits::Charge;
use super::{Session, SessionError};
use rpc_ggml::{HostMut, HostRef};

/// Device memory is written from host memory in chunks of at most this size.
pub const STAGING_CHUNK: usize = 8 << 20;

/// How the body of a request whose header arrived is read.
#[derive(Debug, PartialEq, Eq)]
pub enum Intake {
    /// Whole, into a payload buffer, then decoded and handled ([`Session::reply`]).
    Whole,
    /// As it arrives, through [`Session::body_space`] and [`Session::body_filled`].
    Streamed,
}

impl Intake {
    /// SET_TENSOR is streamed (every one: the header alone is 305 bytes); every other request is
    /// read whole.
    pub fn of(cmd: Command, size: u64) -> Intake {
        match cmd == Command::SetTensor && size >= SET_TENSOR_HEADER_SIZE as u64 {
            true => Intake::Streamed,
            false => Intake::Whole,
        }
    }
}

/// A SET_TENSOR body on its way in: its header first, then the data.
#[derive(Debug)]
pub struct SetTensorBody {
    /// Bytes of data after the header.
    len: u64,
    header: [u8; SET_TENSOR_HEADER_SIZE],
    state: State,
}

#[derive(Debug)]
enum State {
    /// The header is being read.
    Header,
    /// The data goes straight into the host buffer `handle` at `off` (one slice).
    Host {
        handle: u64,
        off: u64,
        cache: bool,
    },
    /// The data is staged through host memory into a device buffer.
    Staged(Staging),
    Done,
}

/// A device-memory destination written through host memory in chunks.
#[derive(Debug)]
struct Staging {
    handle: u64,
    off: u64,
    /// Bytes written so far.
    done: u64,
    cache: bool,
    /// Bytes staged at a time.
    chunk: usize,
    staged: Vec<u8>,
    _charge: Charge,
}

impl SetTensorBody {
    /// The body of a SET_TENSOR of `size` bytes (at least its header: see [`Intake::of`]).
    pub fn new(size: u64) -> SetTensorBody {
        SetTensorBody {
            len: size.saturating_sub(SET_TENSOR_HEADER_SIZE as u64),
            header: [0; SET_TENSOR_HEADER_SIZE],
            state: State::Header,
        }
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
        body: &'a mut SetTensorBody,
    ) -> Result<Option<Space<'a>>, SessionError> {
        let len = usize::try_from(body.len).map_err(|_| SessionError::OutOfMemory("SET_TENSOR"))?;
        Ok(match &mut body.state {
            State::Header => Some(Space::Own(&mut body.header)),
            State::Host { handle, off, .. } => {
                let buf = self.buffer_mut(*handle)?;
                let host = buf
                    .host_mut(*off, len)
                    .ok_or(SessionError::BufferBusy("SET_TENSOR"))?;
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

    /// The slice [`Session::body_space`] gave was filled: the header is decoded and its
    /// destination checked, or the data written (staged) and, when the client asked, stored in
    /// the weight cache.
    pub fn body_filled(&mut self, body: &mut SetTensorBody) -> Result<(), SessionError> {
        let len = body.len;
        let next = match std::mem::replace(&mut body.state, State::Done) {
            State::Header => self.set_tensor_destination(&body.header, len)?,
            State::Host { handle, off, cache } => {
                if cache {
                    self.store_uploaded(handle, off, len);
                }
                State::Done
            }
            State::Staged(mut st) => {
                self.buffer_mut(st.handle)?
                    .write(st.off + st.done, &st.staged)
                    .map_err(SessionError::access("SET_TENSOR"))?;
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
            // Nothing to read after the header.
            (State::Host { .. } | State::Staged(_), 0) => State::Done,
            (s, _) => s,
        };
        Ok(())
    }

    /// A SET_TENSOR header that arrived: where its `len` bytes of data go (checked like any
    /// SET_TENSOR), and how: into host memory directly, or staged in bounded chunks (the whole
    /// payload when it must be cached, since a cache entry is written from one slice), the
    /// staging charged to the budget like a body.
    fn set_tensor_destination(
        &mut self,
        header: &[u8; SET_TENSOR_HEADER_SIZE],
        len: u64,
    ) -> Result<State, SessionError> {
        let hdr = SetTensorHeader::decode(header)?;
        let (buf, off) = self.resolve_region("SET_TENSOR", &hdr.tensor, hdr.offset, len)?;
        let handle = hdr.tensor.buffer.get();
        let cache = hdr.cache_flag != 0 && self.config.cache.is_some();
        if buf.is_host() {
            return Ok(State::Host { handle, off, cache });
        }
        let ulen = usize::try_from(len).map_err(|_| SessionError::OutOfMemory("SET_TENSOR"))?;
        let chunk = if cache { ulen } else { ulen.min(STAGING_CHUNK) };
        let charge = self
            .budget
            .charge(self.held, chunk as u64)
            .ok_or(SessionError::OverBudget(chunk as u64))?;
        let mut staged = Vec::new();
        staged
            .try_reserve_exact(chunk)
            .map_err(|_| SessionError::OutOfMemory("SET_TENSOR"))?;
        Ok(State::Staged(Staging {
            handle,
            off,
            done: 0,
            cache,
            chunk,
            staged,
            _charge: charge,
        }))
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

    use rpc_proto::{Major, Request, RpcTensor};

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

    /// Feeds `payload` as a connection would, counting the slices asked for.
    fn stream(s: &mut Session, payload: &[u8]) -> Result<Vec<usize>, SessionError> {
        let mut body = SetTensorBody::new(payload.len() as u64);
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
    fn every_set_tensor_is_streamed_and_nothing_else() {
        assert_eq!(
            Intake::of(Command::SetTensor, SET_TENSOR_HEADER_SIZE as u64),
            Intake::Streamed
        );
        assert_eq!(Intake::of(Command::SetTensor, 1 << 30), Intake::Streamed);
        // Too short for its header: read whole, and refused by the decoder.
        assert_eq!(Intake::of(Command::SetTensor, 10), Intake::Whole);
        assert_eq!(Intake::of(Command::GraphCompute, 1 << 30), Intake::Whole);
        assert_eq!(Intake::of(Command::SetTensorHash, 400), Intake::Whole);
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
        let mut body = SetTensorBody::new(payload.len() as u64);
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
