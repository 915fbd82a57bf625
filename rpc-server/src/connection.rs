//! One client connection: reads framed requests, feeds them to its [`Session`], writes replies.
//!
//! Framing (spec §3): `| cmd u8 | size u64 LE | payload |` in, `| size u64 LE | payload |` out,
//! only for commands that have a reply. Requests without a reply arrive pipelined, so the loop
//! reads strictly by framing, never in request/response lockstep.

use std::sync::Arc;

use rpc_proto::{check_frame, Command, DecodeError, FrameHeader, Limits, Request, Response, SetTensorHeader};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::watch;

use crate::session::{Session, SessionConfig, SessionError};
use crate::stats::Stats;

/// SET_TENSOR payloads at least this large are read straight into tensor memory.
const STREAM_MIN: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ConnectionError {
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed request: {0}")]
    Decode(#[from] DecodeError),
    #[error("{cmd}: {err}")]
    Session { cmd: &'static str, err: SessionError },
    #[error("expected HELLO as the first command, got command {0} (client too old?)")]
    ExpectedHello(u8),
    #[error("request of {0} bytes does not fit in memory")]
    OutOfMemory(u64),
}

/// Reads a frame header; `Ok(None)` on a clean end of stream before its first byte.
async fn read_header<R: AsyncRead + Unpin>(rd: &mut R) -> Result<Option<FrameHeader>, std::io::Error> {
    let mut b = [0u8; rpc_proto::FRAME_HEADER_SIZE];
    let n = rd.read(&mut b[..1]).await?;
    if n == 0 {
        return Ok(None);
    }
    rd.read_exact(&mut b[1..]).await?;
    Ok(Some(FrameHeader::decode(&b)))
}

/// Serves one connection until the peer closes it, a request is invalid, or shutdown.
pub async fn serve<S>(
    stream: S,
    config: Arc<SessionConfig>,
    limits: Limits,
    stats: Arc<Stats>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let (rd, mut wr) = tokio::io::split(stream);
    let mut rd = BufReader::with_capacity(256 * 1024, rd);
    let mut out = Vec::with_capacity(64);

    // HELLO: exactly 24 bytes of transport caps; we answer 7.0.0 and all-zero caps (TCP).
    let Some(h) = read_header(&mut rd).await? else { return Ok(()) };
    if h.cmd != Command::Hello as u8 {
        return Err(ConnectionError::ExpectedHello(h.cmd));
    }
    check_frame(&h, &limits)?;
    let mut caps = [0u8; rpc_proto::CONN_CAPS_SIZE];
    rd.read_exact(&mut caps).await?;
    Response::Hello { major: rpc_proto::PROTO_MAJOR, minor: rpc_proto::PROTO_MINOR, patch: rpc_proto::PROTO_PATCH, caps: [0; 24] }
        .encode(&mut out);
    wr.write_all(&out).await?;
    stats.command(Command::Hello, h.size, out.len() as u64);

    let mut session = Session::new(config);
    let mut payload: Vec<u8> = Vec::new();
    loop {
        let h = tokio::select! {
            biased;
            r = read_header(&mut rd) => r?,
            _ = shutdown.changed() => { tracing::debug!("closing connection for shutdown"); None }
        };
        let Some(h) = h else { break };
        let cmd = check_frame(&h, &limits)?;
        if cmd == Command::SetTensor && h.size >= STREAM_MIN {
            stream_set_tensor(&mut rd, &mut session, h.size).await?;
            stats.command(cmd, h.size, 0);
            continue;
        }
        let size = usize::try_from(h.size).map_err(|_| ConnectionError::OutOfMemory(h.size))?;
        payload.clear();
        payload.try_reserve(size).map_err(|_| ConnectionError::OutOfMemory(h.size))?;
        payload.resize(size, 0);
        rd.read_exact(&mut payload).await?;
        let req = Request::decode(cmd, &payload, &limits)?;
        let heavy = matches!(
            cmd,
            Command::GraphCompute | Command::GraphRecompute | Command::CopyTensor | Command::SetTensorHash | Command::SetTensor
        );
        let result = if heavy {
            tokio::task::block_in_place(|| session.handle(req))
        } else {
            session.handle(req)
        };
        let reply = result.map_err(|err| ConnectionError::Session { cmd: cmd.name(), err })?;
        let mut sent = 0;
        if let Some(r) = reply {
            out.clear();
            r.encode(&mut out);
            wr.write_all(&out).await?;
            sent = out.len() as u64;
        }
        stats.command(cmd, h.size, sent);
    }
    Ok(())
}

/// Reads a large SET_TENSOR: the 305-byte header first, then the payload directly into the
/// destination tensor memory (host buffers), or through a bounded staging buffer (device memory).
async fn stream_set_tensor<R: AsyncRead + Unpin>(
    rd: &mut R,
    session: &mut Session,
    size: u64,
) -> Result<(), ConnectionError> {
    let mut hb = [0u8; rpc_proto::SET_TENSOR_HEADER_SIZE];
    rd.read_exact(&mut hb).await?;
    let hdr = SetTensorHeader::decode(&hb)?;
    let len = size - rpc_proto::SET_TENSOR_HEADER_SIZE as u64;
    let (buf, off) = session
        .set_tensor_target(&hdr, len)
        .map_err(|err| ConnectionError::Session { cmd: "SET_TENSOR", err })?;
    let ulen = usize::try_from(len).map_err(|_| ConnectionError::OutOfMemory(len))?;
    let want_cache = hdr.cache_flag != 0 && session.cache().is_some();
    if let Some(dst) = buf.host_slice_mut(off, ulen) {
        rd.read_exact(dst).await?;
        if want_cache {
            if let Some(c) = session.cache() {
                tokio::task::block_in_place(|| c.store(dst));
            }
        }
        return Ok(());
    }
    // Device memory: stage through host memory in bounded chunks (whole payload if it must be
    // cached, since the cache entry is written from one slice).
    const CHUNK: usize = 8 << 20;
    let mut staged: Vec<u8> = Vec::new();
    let chunk = if want_cache { ulen } else { ulen.min(CHUNK) };
    staged.try_reserve(chunk).map_err(|_| ConnectionError::OutOfMemory(len))?;
    let mut done = 0usize;
    while done < ulen {
        let n = (ulen - done).min(chunk);
        staged.clear();
        staged.resize(n, 0);
        rd.read_exact(&mut staged).await?;
        buf.write(off + done as u64, &staged);
        done += n;
    }
    if want_cache {
        if let Some(c) = session.cache() {
            tokio::task::block_in_place(|| c.store(&staged));
        }
    }
    Ok(())
}
