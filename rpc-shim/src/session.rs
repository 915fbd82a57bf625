//! One client (downstream) connection: local HELLO, cached queries, and the relay of everything
//! else over the connection's own upstream connection.
//!
//! # Framing
//!
//! Requests are read strictly by framing (`cmd | size | payload`, checked with
//! [`rpc_proto::check_frame`] before anything is allocated). A command with a response is
//! forwarded and its response (size prefix checked against the request) relayed before the next
//! request is read; a command without one is forwarded and nothing is awaited for it.
//!
//! # Pipelining
//!
//! Frames without a response are collected into one upstream write while the *whole* next frame
//! is already in the read buffer; before anything that may wait (reading a frame that is not fully
//! buffered, waiting for a response, answering from the cache) the collected frames are sent. So
//! a burst of SET_TENSORs costs one write, and a no-response command is never held back waiting
//! for the client or the worker. Each frame keeps upstream's part boundaries (cmd, size, payload),
//! which the Linux RDMA flavor requires; large payloads are streamed in chunks.
//!
//! # Protocol majors
//!
//! A client connection speaks the major of the listener it came in on (8.0.0 or 7.0.0): its
//! HELLO is answered with it and every frame is parsed by it. Toward the worker the upstream
//! connection speaks whatever the worker announced. A 7.0 client with an 8.0 worker is
//! translated: GRAPH_COMPUTE gets the fixed uid [`rpc_client::LAST_GRAPH_UID`] and GRAPH_RECOMPUTE
//! `{device}` becomes `{device, LAST_GRAPH_UID}`, which keeps 7.0's "the device's last graph"
//! (each GRAPH_COMPUTE overwrites that one stored graph). An 8.0 client with a 7.0 worker is
//! refused (closed, with an error naming both versions): graph uids, strided copies and
//! collectives have no faithful 7.0 form.
//!
//! # Upstream connection
//!
//! Opened on the first command that the cache cannot answer and that is not a query answerable
//! on any connection (ALLOC_BUFFER, SET_TENSOR, GRAPH_COMPUTE, ...), because buffers and graphs
//! live per connection on the server. Closed when the client closes; a failure on it (including
//! the worker closing it while idle) closes the client connection.

use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::sync::Arc;

use rpc_client::LAST_GRAPH_UID;
use rpc_proto::{
    check_frame, Command, FrameHeader, Major, Request, Response, CONN_CAPS_SIZE, FRAME_HEADER_SIZE,
    RESPONSE_HEADER_SIZE,
};
use rpc_transport::Transport;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::watch;

use crate::cache::{device_of, is_cacheable};
use crate::error::ShimError;
use crate::stats::ShimStats;
use crate::upstream::Connector;
use crate::worker::Worker;

/// Read buffer of the client connection: a token's burst of small frames fits many times.
pub(crate) const READ_BUFFER: usize = 256 * 1024;
/// No-response frames up to this payload size are collected; larger ones are streamed.
pub(crate) const INLINE_MAX: u64 = 64 * 1024;
/// Collected bytes that force a write even if more frames are buffered.
pub(crate) const BATCH_MAX: usize = 1 << 20;
/// Chunk size for streamed request payloads.
pub(crate) const CHUNK: usize = 1 << 20;
/// Largest piece of a large response passed on at once: small enough that the client receives
/// the first bytes while the rest is still being read, and at least the upstream TCP read buffer
/// (256 KiB), so such reads bypass it instead of being copied through it.
pub(crate) const RELAY_CHUNK: usize = 256 * 1024;
/// Responses up to this size are read whole and written in one go.
const SMALL_RESPONSE: u64 = 64 * 1024;

/// Serves one client connection of a `major` listener until it closes or fails; logs the
/// outcome.
pub(crate) async fn serve<C: Connector>(
    stream: TcpStream,
    peer: SocketAddr,
    worker: Arc<Worker<C>>,
    major: Major,
) {
    ShimStats::inc(&worker.core.stats.client_connections);
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(%peer, "cannot set TCP_NODELAY on the client connection: {e}");
        return;
    }
    let mut s = Session::new(stream, worker, major);
    let r = s.run().await;
    if let Err(ShimError::Upstream { err, .. }) = &r {
        let over_rdma = s.up.as_ref().is_some_and(|u| u.name().starts_with("RDMA"));
        if over_rdma && crate::upstream::blames_rdma(err) {
            s.worker.connector.rdma_failed(err);
        }
    }
    match r {
        Ok(()) => tracing::debug!(%peer, worker = %s.worker.addr(), "client connection closed"),
        Err(e @ ShimError::WorkerTooOld { .. }) => {
            tracing::error!(%peer, "closing the client connection: {e}")
        }
        Err(e) if e.is_upstream() => tracing::warn!(%peer, "closing the client connection: {e}"),
        Err(e) => {
            tracing::info!(%peer, worker = %s.worker.addr(), "closing the client connection: {e}")
        }
    }
}

/// No-response frames waiting to be written upstream, with upstream's part boundaries.
#[derive(Default)]
pub(crate) struct Batch {
    bytes: Vec<u8>,
    parts: Vec<Range<usize>>,
}

impl Batch {
    /// Appends a complete frame as the parts cmd, size, payload.
    pub(crate) fn push_frame(&mut self, frame: &[u8]) {
        let s = self.bytes.len();
        self.bytes.extend_from_slice(frame);
        self.parts.push(s..s + 1);
        self.parts.push(s + 1..s + FRAME_HEADER_SIZE);
        if frame.len() > FRAME_HEADER_SIZE {
            self.parts.push(s + FRAME_HEADER_SIZE..s + frame.len());
        }
    }

    /// Bytes collected.
    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    pub(crate) async fn flush<T: Transport>(&mut self, t: &mut T) -> io::Result<()> {
        if self.parts.is_empty() {
            return Ok(());
        }
        let slices: Vec<&[u8]> = self.parts.iter().map(|r| &self.bytes[r.clone()]).collect();
        t.send_message(&slices).await?;
        self.bytes.clear();
        self.parts.clear();
        if self.bytes.capacity() > 4 * BATCH_MAX {
            self.bytes = Vec::new();
        }
        Ok(())
    }
}

/// What woke an idle session.
enum Wake {
    /// The client sent bytes (0: it closed).
    Client(io::Result<usize>),
    /// The upstream connection became readable while no response was pending.
    Upstream(io::Result<usize>),
    /// The worker was found gone.
    WorkerDown,
}

struct Session<C: Connector> {
    worker: Arc<Worker<C>>,
    /// What the client speaks (its listener's major).
    major: Major,
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
    up: Option<C::Conn>,
    /// What the upstream connection speaks (the worker's HELLO), once it is open.
    up_major: Major,
    batch: Batch,
    scratch: Vec<u8>,
    down: watch::Receiver<u64>,
}

impl<C: Connector> Session<C> {
    fn new(stream: TcpStream, worker: Arc<Worker<C>>, major: Major) -> Session<C> {
        let (rd, wr) = stream.into_split();
        let down = worker.down();
        Session {
            worker,
            major,
            rd: BufReader::with_capacity(READ_BUFFER, rd),
            wr,
            up: None,
            up_major: major,
            batch: Batch::default(),
            scratch: Vec::with_capacity(4096),
            down,
        }
    }

    fn addr(&self) -> &str {
        self.worker.addr()
    }

    fn up_err(&self) -> impl FnOnce(io::Error) -> ShimError + '_ {
        ShimError::upstream(self.worker.addr())
    }

    /// Whether this client's frames are rewritten from 7.0 to 8.0 (GRAPH_COMPUTE, GRAPH_RECOMPUTE).
    fn translates(&self) -> bool {
        self.major == Major::V7 && self.up_major == Major::V8
    }

    /// Refuses a worker that cannot serve this client's major (an 8.0 client, a 7.0 worker).
    fn check_worker_major(&self, worker: Major) -> Result<(), ShimError> {
        if self.major == Major::V8 && worker == Major::V7 {
            return Err(ShimError::WorkerTooOld {
                worker: self.addr().to_string(),
                worker_major: worker,
                client_major: self.major,
            });
        }
        Ok(())
    }

    async fn run(&mut self) -> Result<(), ShimError> {
        if !self.hello().await? {
            return Ok(());
        }
        loop {
            if !self.next_frame_buffered() {
                self.flush().await?;
            }
            if self.rd.buffer().is_empty() {
                match self.wait().await {
                    Wake::Client(Ok(0)) => return Ok(()),
                    Wake::Client(Ok(_)) => {}
                    Wake::Client(Err(e)) => return Err(ShimError::Client(e)),
                    Wake::Upstream(r) => {
                        // Nothing is pending on the upstream connection: closing or sending now
                        // means the worker is gone (or broken).
                        self.worker.core.mark_down();
                        return Err(match r {
                            Ok(0) => ShimError::WorkerDown(self.addr().to_string()),
                            Ok(_) => ShimError::Unsolicited(self.addr().to_string()),
                            Err(e) => self.up_err()(e),
                        });
                    }
                    Wake::WorkerDown => return Err(ShimError::WorkerDown(self.addr().to_string())),
                }
            }
            let h = self.read_header().await?;
            let cmd = check_frame(self.major, &h, &self.worker.core.opts.limits)?;
            if cmd == Command::Hello {
                return Err(ShimError::SecondHello);
            }
            if cmd.is_device_query() {
                self.query(h, cmd).await?;
            } else {
                self.forward(h, cmd).await?;
            }
        }
    }

    /// The client's HELLO, answered locally: the listener's major and zero caps (the client
    /// stays on TCP to the shim). A worker already known to speak an older major than the client
    /// is refused here, so the client fails at its first connection, as it would directly.
    /// `Ok(false)` if the client closed before sending anything.
    async fn hello(&mut self) -> Result<bool, ShimError> {
        if !read_hello(&mut self.rd, self.major, &self.worker.core.opts.limits).await? {
            return Ok(false);
        }
        if let Some(m) = self.worker.major() {
            self.check_worker_major(m)?;
        }
        write_hello(&mut self.wr, self.major).await
    }

    /// Whether the whole next request frame is already in the read buffer.
    fn next_frame_buffered(&self) -> bool {
        rpc_proto::complete_request(self.rd.buffer()).is_some()
    }

    /// Waits for the client, watching the upstream connection (or the worker) meanwhile.
    async fn wait(&mut self) -> Wake {
        match self.up.as_mut() {
            Some(up) => {
                let mut probe = [0u8; 1];
                tokio::select! {
                    biased;
                    r = self.rd.fill_buf() => Wake::Client(r.map(|b| b.len())),
                    r = up.read(&mut probe) => Wake::Upstream(r),
                }
            }
            None => tokio::select! {
                biased;
                r = self.rd.fill_buf() => Wake::Client(r.map(|b| b.len())),
                // (The sender lives in the worker, which this session keeps alive.)
                _ = self.down.changed() => Wake::WorkerDown,
            },
        }
    }

    async fn read_header(&mut self) -> Result<FrameHeader, ShimError> {
        let mut b = [0u8; FRAME_HEADER_SIZE];
        self.rd
            .read_exact(&mut b)
            .await
            .map_err(ShimError::Client)?;
        Ok(FrameHeader::decode(&b))
    }

    /// Reads the payload of a small frame (`h.size` was checked by `check_frame`) and returns
    /// the whole frame.
    async fn read_frame(&mut self, h: FrameHeader) -> Result<Vec<u8>, ShimError> {
        let n = usize::try_from(h.size)
            .map_err(|_| ShimError::Client(io::Error::other("frame too large")))?;
        let mut frame = Vec::with_capacity(FRAME_HEADER_SIZE + n);
        frame.extend_from_slice(&h.encode());
        frame.resize(FRAME_HEADER_SIZE + n, 0);
        self.rd
            .read_exact(&mut frame[FRAME_HEADER_SIZE..])
            .await
            .map_err(ShimError::Client)?;
        Ok(frame)
    }

    /// Sends the collected no-response frames upstream.
    async fn flush(&mut self) -> Result<(), ShimError> {
        if let Some(up) = self.up.as_mut() {
            self.batch
                .flush(up)
                .await
                .map_err(ShimError::upstream(self.worker.addr()))?;
        }
        Ok(())
    }

    /// Writes a response (`size | payload`) to the client in one write.
    async fn respond(&mut self, payload: &[u8]) -> Result<(), ShimError> {
        self.flush().await?;
        self.scratch.clear();
        self.scratch
            .extend_from_slice(&Response::header(payload.len() as u64));
        self.scratch.extend_from_slice(payload);
        self.wr
            .write_all(&self.scratch)
            .await
            .map_err(ShimError::Client)
    }

    /// DEVICE_COUNT, GET_ALIGNMENT, GET_MAX_SIZE, GET_ALLOC_SIZE, GET_DEVICE_MEMORY: from the
    /// cache when possible, else over this connection's upstream connection if it has one, else
    /// over the worker's control connection.
    async fn query(&mut self, h: FrameHeader, cmd: Command) -> Result<(), ShimError> {
        let frame = self.read_frame(h).await?;
        let payload = &frame[FRAME_HEADER_SIZE..];
        let cacheable = is_cacheable(cmd, payload);
        let core = self.worker.core.clone();
        if cacheable {
            if let Some(rsp) = core.cache.get(&frame) {
                ShimStats::inc(&core.stats.cache_hits);
                return self.respond(&rsp).await;
            }
            ShimStats::inc(&core.stats.cache_misses);
        }
        let rsp = if self.up.is_some() {
            self.batch.push_frame(&frame);
            self.flush().await?;
            ShimStats::inc(&core.stats.frames_forwarded);
            self.read_fixed_response(cmd).await?
        } else {
            // A device the worker does not have: the server would close this connection; close
            // it here rather than lose the shared control connection.
            if let (Some(device), Some(count)) =
                (device_of(cmd, payload), core.cache.device_count())
            {
                if device >= count {
                    return Err(ShimError::NoSuchDevice { cmd, device, count });
                }
            }
            self.worker.query(frame.clone()).await?
        };
        if cacheable {
            core.cache.insert(&frame, &rsp);
        }
        self.respond(&rsp).await
    }

    /// Reads a fixed-size response payload from the upstream connection.
    async fn read_fixed_response(&mut self, cmd: Command) -> Result<Vec<u8>, ShimError> {
        let addr = self.worker.core.addr.clone();
        let Some(up) = self.up.as_mut() else {
            return Err(ShimError::WorkerDown(addr));
        };
        let got = read_response_size(up, &addr, cmd, 0).await?;
        let mut rsp = vec![0u8; got as usize];
        up.read_exact(&mut rsp)
            .await
            .map_err(ShimError::upstream(&addr))?;
        ShimStats::inc(&self.worker.core.stats.responses_relayed);
        Ok(rsp)
    }

    /// Opens this connection's upstream connection (releasing the control connection first: a
    /// stock server serves one connection at a time).
    async fn open_upstream(&mut self) -> Result<(), ShimError> {
        self.worker.release_control();
        let (up, up_major) = self.worker.connector.open().await?;
        self.worker.core.set_major(up_major);
        let stats = &self.worker.core.stats;
        ShimStats::inc(&stats.session_connections);
        if up.name() != "TCP" {
            ShimStats::inc(&stats.rdma_sessions);
        }
        tracing::info!(worker = %self.addr(), transport = up.name(), worker_protocol = %up_major, client_protocol = %self.major, "upstream connection opened for a client");
        self.up = Some(up);
        self.up_major = up_major;
        self.worker.session_opened();
        self.check_worker_major(up_major)
    }

    /// Every other command: over this connection's own upstream connection.
    async fn forward(&mut self, h: FrameHeader, cmd: Command) -> Result<(), ShimError> {
        if self.up.is_none() {
            self.open_upstream().await?;
        }
        ShimStats::inc(&self.worker.core.stats.frames_forwarded);
        if cmd.has_response() {
            // ALLOC_BUFFER, BUFFER_GET_BASE, SET_TENSOR_HASH, GET_TENSOR, COPY_TENSOR,
            // GET_TENSOR_2D, COMM_INIT: all small and fixed-size (checked by check_frame).
            let frame = self.read_frame(h).await?;
            let payload = frame.get(FRAME_HEADER_SIZE..).unwrap_or_default();
            let req = Request::decode(self.major, cmd, payload, &self.worker.core.opts.limits)?;
            let reply_len = req.reply_data_len();
            let frame = match req {
                Request::CommInit(init) => self.comm_init(init).unwrap_or(frame),
                _ => frame,
            };
            self.batch.push_frame(&frame);
            self.flush().await?;
            return self.relay_response(cmd, reply_len).await;
        }
        let uid = self.translates().then_some(LAST_GRAPH_UID);
        if h.size <= INLINE_MAX {
            let mut frame = self.read_frame(h).await?;
            if let Some(uid) = uid.filter(|_| cmd.runs_graph()) {
                // (The frame passed check_frame for 7.0: it has its device.)
                frame = rpc_proto::graph_frame_with_uid(&frame, uid).unwrap_or(frame);
            }
            self.batch.push_frame(&frame);
            if self.batch.bytes.len() >= BATCH_MAX {
                self.flush().await?;
            }
            return Ok(());
        }
        let uid = uid.filter(|_| cmd == Command::GraphCompute);
        self.stream_request(h, uid).await
    }

    /// COMM_INIT with rank 0's address rewritten from the shim's listener to the worker behind
    /// it ([`crate::comm`]); `None` to send it as it came.
    fn comm_init(&self, mut init: rpc_proto::CommInit) -> Option<Vec<u8>> {
        match crate::comm::rewrite(&mut init, crate::comm::worker_behind) {
            Ok(Some(how)) => {
                tracing::info!(worker = %self.addr(), "COMM_INIT rewritten: {how}");
                let mut frame = Vec::new();
                Request::CommInit(init).encode(&mut frame);
                Some(frame)
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(worker = %self.addr(), "COMM_INIT sent as it came: {e}");
                None
            }
        }
    }

    /// Streams a large request (SET_TENSOR weights, big graphs) upstream in chunks; with `uid`,
    /// a 7.0 GRAPH_COMPUTE goes out as 8.0's, that uid after the device.
    async fn stream_request(&mut self, h: FrameHeader, uid: Option<u64>) -> Result<(), ShimError> {
        self.flush().await?;
        let addr = self.worker.core.addr.clone();
        let Some(up) = self.up.as_mut() else {
            return Err(ShimError::WorkerDown(addr));
        };
        // With a uid, the 7.0 GRAPH_COMPUTE's header as 8.0's (rpc-proto holds the layout).
        let v8 = uid.and_then(|uid| Some((rpc_proto::graph_header_with_uid(h)?, uid)));
        let mut left = h.size;
        let head = v8.map_or(h, |(h8, _)| h8).encode();
        up.send_message(&[&head[..1], &head[1..]])
            .await
            .map_err(ShimError::upstream(&addr))?;
        if let Some((_, uid)) = v8 {
            // check_frame guaranteed the 7.0 graph header (12 bytes) is there.
            let mut device = [0u8; rpc_proto::GRAPH_DEVICE_SIZE];
            self.rd
                .read_exact(&mut device)
                .await
                .map_err(ShimError::Client)?;
            up.send_message(&[&rpc_proto::graph_device_with_uid(device, uid)])
                .await
                .map_err(ShimError::upstream(&addr))?;
            left -= device.len() as u64;
        }
        pump_payload(&mut self.rd, up, left, &mut self.scratch, &addr).await
    }

    /// Relays the response to `cmd` from the upstream connection to the client.
    async fn relay_response(&mut self, cmd: Command, get_size: u64) -> Result<(), ShimError> {
        let addr = self.worker.core.addr.clone();
        let Some(up) = self.up.as_mut() else {
            return Err(ShimError::WorkerDown(addr));
        };
        let size = read_response_size(up, &addr, cmd, get_size).await?;
        ShimStats::inc(&self.worker.core.stats.responses_relayed);
        self.scratch.clear();
        self.scratch.extend_from_slice(&Response::header(size));
        if size <= SMALL_RESPONSE {
            let n = size as usize;
            self.scratch.resize(RESPONSE_HEADER_SIZE + n, 0);
            up.read_exact(&mut self.scratch[RESPONSE_HEADER_SIZE..])
                .await
                .map_err(ShimError::upstream(&addr))?;
            return self
                .wr
                .write_all(&self.scratch)
                .await
                .map_err(ShimError::Client);
        }
        // Large (GET_TENSOR of logits): pass chunks on as they arrive.
        let mut left = size;
        let mut filled = RESPONSE_HEADER_SIZE;
        self.scratch.resize(RESPONSE_HEADER_SIZE + RELAY_CHUNK, 0);
        while left > 0 {
            let want = (left as usize).min(RELAY_CHUNK);
            let n = up
                .read(&mut self.scratch[filled..filled + want])
                .await
                .map_err(ShimError::upstream(&addr))?;
            if n == 0 {
                return Err(ShimError::upstream(&addr)(
                    io::ErrorKind::UnexpectedEof.into(),
                ));
            }
            left -= n as u64;
            self.wr
                .write_all(&self.scratch[..filled + n])
                .await
                .map_err(ShimError::Client)?;
            filled = 0;
        }
        Ok(())
    }
}

impl<C: Connector> Drop for Session<C> {
    fn drop(&mut self) {
        if let Some(up) = self.up.take() {
            drop(up); // closed before the control connection may be reopened
            self.worker.session_closed();
        }
    }
}

/// Streams the next `left` payload bytes of a request from the client to `up`, in pieces of at
/// most [`CHUNK`] as they arrive (`scratch` is the buffer).
pub(crate) async fn pump_payload<T: Transport>(
    rd: &mut BufReader<OwnedReadHalf>,
    up: &mut T,
    mut left: u64,
    scratch: &mut Vec<u8>,
    addr: &str,
) -> Result<(), ShimError> {
    scratch.resize(CHUNK, 0);
    while left > 0 {
        let want = (left as usize).min(CHUNK);
        let n = rd
            .read(&mut scratch[..want])
            .await
            .map_err(ShimError::Client)?;
        if n == 0 {
            return Err(ShimError::Client(io::ErrorKind::UnexpectedEof.into()));
        }
        up.send_message(&[&scratch[..n]])
            .await
            .map_err(ShimError::upstream(addr))?;
        left -= n as u64;
    }
    Ok(())
}

/// Reads the client's HELLO (`Ok(false)`: it closed before sending anything). Its caps are
/// ignored: the client stays on TCP to the shim.
pub(crate) async fn read_hello(
    rd: &mut BufReader<OwnedReadHalf>,
    major: Major,
    limits: &rpc_proto::Limits,
) -> Result<bool, ShimError> {
    let mut first = [0u8; 1];
    if rd.read(&mut first).await.map_err(ShimError::Client)? == 0 {
        return Ok(false);
    }
    if first[0] != Command::Hello as u8 {
        return Err(ShimError::ExpectedHello(first[0]));
    }
    let mut size = [0u8; 8];
    rd.read_exact(&mut size).await.map_err(ShimError::Client)?;
    check_frame(
        major,
        &FrameHeader {
            cmd: first[0],
            size: u64::from_le_bytes(size),
        },
        limits,
    )?;
    let mut caps = [0u8; CONN_CAPS_SIZE];
    rd.read_exact(&mut caps).await.map_err(ShimError::Client)?;
    if caps.iter().any(|&b| b != 0) {
        tracing::debug!(
            "client offered RDMA to the shim; answering zero caps (the client stays on TCP)"
        );
    }
    Ok(true)
}

/// Answers the client's HELLO: the listener's major and zero caps. `Ok(true)`.
pub(crate) async fn write_hello(wr: &mut OwnedWriteHalf, major: Major) -> Result<bool, ShimError> {
    let mut out = Vec::new();
    Response::hello(major, [0; CONN_CAPS_SIZE]).encode(&mut out);
    wr.write_all(&out).await.map_err(ShimError::Client)?;
    Ok(true)
}

/// Reads the size prefix of the response to `cmd` from the upstream connection and checks it
/// (`get_size`: the size a GET_TENSOR asked for).
pub(crate) async fn read_response_size<T: Transport>(
    up: &mut T,
    addr: &str,
    cmd: Command,
    get_size: u64,
) -> Result<u64, ShimError> {
    let mut header = [0u8; RESPONSE_HEADER_SIZE];
    up.read_exact(&mut header)
        .await
        .map_err(ShimError::upstream(addr))?;
    Response::check_header(cmd, &header, get_size).map_err(|err| ShimError::BadResponse {
        worker: addr.to_string(),
        cmd,
        err: err.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_keeps_part_boundaries() {
        let mut b = Batch::default();
        for req in [
            Request::DeviceCount,
            Request::GraphRecompute {
                device: 0x0403_0201,
                uid: None,
            },
        ] {
            let mut frame = Vec::new();
            req.encode(&mut frame);
            b.push_frame(&frame);
        }
        let lens: Vec<usize> = b.parts.iter().map(|r| r.len()).collect();
        assert_eq!(
            lens,
            [1, 8, 1, 8, 4],
            "cmd, size, payload per frame; no SEND for an empty payload"
        );
    }
}
