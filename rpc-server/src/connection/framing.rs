//! The wire side of a connection: frame headers with their idle and stall deadlines, HELLO,
//! request bodies read as their bytes arrive (memory follows the bytes, not a header's claim),
//! SET_TENSOR's body streamed where its session says, and replies sent as upstream sends them.

use std::time::{Duration, Instant};

use rpc_proto::{check_frame, Command, FrameHeader, Limits, Major, Response};
use rpc_session::{DataBody, Reply, Session, SessionError};
use rpc_transport::Transport;

use super::ConnectionError;

/// Reads a frame header: waits up to `idle` for its first byte (`Ok(None)` on a clean end of
/// stream before it), then up to `stall` for the rest. The first read asks for the whole header
/// (a transport that reads no further than asked, the front's, then takes it in one `recv`),
/// and the rest is read only if it did not all come.
pub(super) async fn read_header<R: Transport>(
    rd: &mut R,
    idle: Option<Duration>,
    stall: Option<Duration>,
) -> Result<Option<FrameHeader>, ConnectionError> {
    let mut b = [0u8; rpc_proto::FRAME_HEADER_SIZE];
    let deadline = idle.map(|t| Instant::now() + t);
    let Some(n) = rd.read_by(&mut b, deadline).await? else {
        return Err(ConnectionError::Idle(idle.unwrap_or_default().as_secs()));
    };
    if n == 0 {
        return Ok(None);
    }
    if n < b.len() {
        read_body(rd, &mut b[n..], stall).await?;
    }
    Ok(Some(FrameHeader::decode(&b)))
}

/// Reads exactly `buf.len()` bytes by `deadline`: `Ok(false)` when it passed first.
pub(super) async fn read_exact_by<R: Transport>(
    rd: &mut R,
    buf: &mut [u8],
    deadline: Option<Instant>,
) -> std::io::Result<bool> {
    let mut done = 0;
    while done < buf.len() {
        match rd.read_by(&mut buf[done..], deadline).await? {
            None => return Ok(false),
            Some(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "peer closed the connection mid-request",
                ))
            }
            Some(n) => done += n,
        }
    }
    Ok(true)
}

/// Bytes read per stall deadline: a body must keep arriving, however large it is.
const STALL_CHUNK: usize = 1 << 20;

/// Reads exactly `buf.len()` bytes of a request whose header has arrived; fails when no
/// [`STALL_CHUNK`] completes within `stall` (a slow link is fine, a silent one is not).
pub(super) async fn read_body<R: Transport>(
    rd: &mut R,
    buf: &mut [u8],
    stall: Option<Duration>,
) -> Result<(), ConnectionError> {
    let Some(t) = stall else {
        return Ok(rd.read_exact(buf).await?);
    };
    for chunk in buf.chunks_mut(STALL_CHUNK) {
        if !read_exact_by(rd, chunk, Some(Instant::now() + t)).await? {
            return Err(ConnectionError::Stalled(t.as_secs()));
        }
    }
    Ok(())
}

/// Reads the HELLO that opens a connection, all of it `within` the given time; `Ok(None)` on a clean end
/// of stream before its first byte.
pub(crate) async fn read_hello<R: Transport>(
    rd: &mut R,
    within: Duration,
    major: Major,
    limits: &Limits,
) -> Result<Option<[u8; rpc_proto::CONN_CAPS_SIZE]>, ConnectionError> {
    let deadline = Instant::now() + within;
    let no_hello = || ConnectionError::NoHello(within.as_secs());
    let mut b = [0u8; rpc_proto::FRAME_HEADER_SIZE];
    match rd.read_by(&mut b[..1], Some(deadline)).await? {
        None => return Err(no_hello()),
        Some(0) => return Ok(None),
        Some(_) => {}
    }
    if !read_exact_by(rd, &mut b[1..], Some(deadline)).await? {
        return Err(no_hello());
    }
    let h = FrameHeader::decode(&b);
    if h.cmd != Command::Hello as u8 {
        return Err(ConnectionError::ExpectedHello(h.cmd));
    }
    check_frame(major, &h, limits)?;
    let mut caps = [0u8; rpc_proto::CONN_CAPS_SIZE];
    if !read_exact_by(rd, &mut caps, Some(deadline)).await? {
        return Err(no_hello());
    }
    Ok(Some(caps))
}

/// Reads a request body of `size` bytes into `payload` (cleared first), growing it by at most
/// [`STALL_CHUNK`] ahead of the bytes received: memory follows the bytes that arrive, not the
/// size a header claims.
pub(crate) async fn read_payload<R: Transport>(
    rd: &mut R,
    payload: &mut Vec<u8>,
    size: u64,
    stall: Option<Duration>,
) -> Result<(), ConnectionError> {
    let size = usize::try_from(size).map_err(|_| ConnectionError::OutOfMemory(size))?;
    payload.clear();
    while payload.len() < size {
        let at = payload.len();
        let n = (size - at).min(STALL_CHUNK);
        payload
            .try_reserve(n)
            .map_err(|_| ConnectionError::OutOfMemory(size as u64))?;
        payload.resize(at + n, 0);
        read_body(rd, &mut payload[at..], stall).await?;
    }
    Ok(())
}

/// Encodes a reply into `out` (except GET_TENSOR's data, sent from where it is); returns its
/// size on the wire.
pub(crate) fn encode_reply(r: &Reply<'_>, out: &mut Vec<u8>) -> u64 {
    match r {
        Reply::Tensor(data) => (rpc_proto::RESPONSE_HEADER_SIZE + data.len()) as u64,
        Reply::Owned(Response::GetTensor(data)) => {
            (rpc_proto::RESPONSE_HEADER_SIZE + data.len()) as u64
        }
        Reply::Owned(r) => {
            out.clear();
            r.encode(out);
            out.len() as u64
        }
    }
}

/// Writes a reply encoded by [`encode_reply`] as upstream does: the size prefix and the payload
/// as two sends.
pub(crate) async fn send_reply<T: Transport>(
    t: &mut T,
    r: &Reply<'_>,
    out: &[u8],
) -> Result<(), ConnectionError> {
    let data: &[u8] = match r {
        Reply::Tensor(data) => data,
        Reply::Owned(Response::GetTensor(data)) => data,
        Reply::Owned(_) => {
            let (head, body) = out.split_at(rpc_proto::RESPONSE_HEADER_SIZE.min(out.len()));
            return Ok(t.send_message(&[head, body]).await?);
        }
    };
    let prefix = Response::header(data.len() as u64);
    t.send_message(&[&prefix, data]).await?;
    Ok(())
}

/// Reads a streamed body (SET_TENSOR, SET_TENSOR_2D: `Command::data_head`) into the slices its
/// session hands out, as they are needed: the session decides where each byte goes
/// (`rpc-session/src/body.rs`).
pub(super) async fn read_streamed<R: Transport>(
    rd: &mut R,
    session: &mut Session,
    mut body: DataBody,
    stall: Option<Duration>,
) -> Result<(), StreamError> {
    loop {
        let Some(mut space) = session.body_space(&mut body)? else {
            return Ok(());
        };
        read_body(rd, &mut space, stall).await?;
        drop(space);
        session.body_filled(&mut body)?;
    }
}

/// Why a streamed body failed: the transport, or the session (named by its command).
pub(super) enum StreamError {
    Connection(ConnectionError),
    Session(SessionError),
}

impl From<ConnectionError> for StreamError {
    fn from(e: ConnectionError) -> Self {
        StreamError::Connection(e)
    }
}

impl From<SessionError> for StreamError {
    fn from(e: SessionError) -> Self {
        StreamError::Session(e)
    }
}

impl StreamError {
    pub(super) fn named(self, cmd: Command) -> ConnectionError {
        match self {
            StreamError::Connection(e) => e,
            StreamError::Session(err) => ConnectionError::Session {
                cmd: cmd.name(),
                err,
            },
        }
    }
}
