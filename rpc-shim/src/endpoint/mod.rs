//! One endpoint over many workers (`rpc-shim --one-endpoint`): a client connection whose devices
//! are every worker's devices, in worker order.
//!
//! llama.cpp copies a tensor between two devices of one endpoint with one COPY_TENSOR on that
//! endpoint's connection (layer split's hidden state at a stage boundary; tensor split's
//! reductions when it has no pairwise communicator, which is always the case with more than two
//! servers). Behind one endpoint, those copies go from worker to worker here and never through the
//! client.
//!
//! - [`route`]: where each request goes and how it is rewritten (device indices and buffer
//!   handles), sans-IO.
//! - This file: the connection's I/O. HELLO and DEVICE_COUNT are answered here; queries come from
//!   the worker's cache (or its control connection) as in the one-worker relay; everything else
//!   goes over the client connection's own upstream connection to that worker (one per worker,
//!   opened on first need: TCP or RDMA, as `--transport` says), no-response frames collected per
//!   worker into one write. A request that names no worker's buffer (another connection's
//!   handle, a made-up one), tensors on two workers in one command, or a device past the last
//!   closes the client connection, as a server closes it.
//!
//! # COPY_TENSOR between workers
//!
//! The client is answered 1 at once; then the source is read from its worker (GET_TENSOR, after
//! every command already sent there, so after the compute that produced it) and written to the
//! destination's worker (SET_TENSOR, before any later command of the client reaches that worker).
//! The client's next command is read only after both are on their way, so no command can overtake
//! the copy. If the transfer then fails, the client connection is closed: the client sees its
//! next read fail, as when a server dies (docs/one-endpoint.md). A source larger than the
//! destination is answered 0 (the client then copies through itself, as after a stock server's 0).
//! The bytes pass through the shim's process (both of its connections); they never reach the
//! client.

mod direct;
pub mod route;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use rpc_client::LAST_GRAPH_UID;
use rpc_proto::{
    check_frame, Command, FrameHeader, Major, Request, Response, FRAME_HEADER_SIZE,
    RESPONSE_HEADER_SIZE, SET_TENSOR_HEADER_SIZE,
};
use rpc_transport::Transport;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

pub use route::{CrossCopy, Route, RouteError, Router};

use crate::cache::{is_cacheable, DEVICE_COUNT_FRAME};
use crate::error::ShimError;
use crate::session::{
    pump_payload, read_hello, read_response_size, write_hello, Batch, BATCH_MAX, CHUNK, INLINE_MAX,
    READ_BUFFER, RELAY_CHUNK,
};
use crate::stats::ShimStats;
use crate::upstream::Connector;
use crate::worker::Worker;

/// Serves one client connection of a one-endpoint listener until it closes or fails.
pub(crate) async fn serve<C: Connector>(
    stream: TcpStream,
    peer: SocketAddr,
    workers: Arc<[Arc<Worker<C>>]>,
    major: Major,
) {
    if let Some(w) = workers.first() {
        ShimStats::inc(&w.core.stats.client_connections);
    }
    if let Err(e) = stream.set_nodelay(true) {
        tracing::warn!(%peer, "cannot set TCP_NODELAY on the client connection: {e}");
        return;
    }
    let mut s = Endpoint::new(stream, workers, major);
    let r = s.run().await;
    if s.copies.0 + s.copies.1 > 0 {
        tracing::info!(%peer, between_workers = s.copies.0, bytes_between_workers = s.copies.2,
            over_worker_links = s.copies.3, within_a_worker = s.copies.1, "copies of this client connection");
    }
    match r {
        Ok(()) => tracing::debug!(%peer, "client connection closed"),
        Err(e) if e.is_upstream() => tracing::warn!(%peer, "closing the client connection: {e}"),
        Err(e) => tracing::info!(%peer, "closing the client connection: {e}"),
    }
}

/// The client connection's own connection to one worker.
struct Up<T> {
    conn: T,
    /// What the worker speaks.
    major: Major,
    /// No-response frames not yet written.
    batch: Batch,
}

struct Endpoint<C: Connector> {
    workers: Arc<[Arc<Worker<C>>]>,
    major: Major,
    rd: BufReader<OwnedReadHalf>,
    wr: OwnedWriteHalf,
    ups: Vec<Option<Up<C::Conn>>>,
    /// Built at the first command past HELLO (it needs every worker's device count).
    router: Option<Router>,
    scratch: Vec<u8>,
    /// COPY_TENSORs between workers, within one worker, bytes between workers, and how many of
    /// the copies between workers went over the workers' own link.
    copies: (u64, u64, u64, u64),
    /// Worker pairs `(i, j)`, `i < j`, whose link was tried (`direct.rs`).
    pairs: std::collections::HashMap<(usize, usize), direct::Pair>,
}

impl<C: Connector> Endpoint<C> {
    fn new(stream: TcpStream, workers: Arc<[Arc<Worker<C>>]>, major: Major) -> Endpoint<C> {
        let (rd, wr) = stream.into_split();
        let ups = workers.iter().map(|_| None).collect();
        Endpoint {
            workers,
            major,
            rd: BufReader::with_capacity(READ_BUFFER, rd),
            wr,
            ups,
            router: None,
            scratch: Vec::with_capacity(4096),
            copies: (0, 0, 0, 0),
            pairs: Default::default(),
        }
    }

    fn limits(&self) -> rpc_proto::Limits {
        self.workers[0].core.opts.limits
    }

    fn addr(&self, w: usize) -> String {
        self.workers[w].addr().to_string()
    }

    /// Refuses a worker that cannot serve this client's major (an 8.0 client, a 7.0 worker).
    fn check_worker_major(&self, w: usize, worker: Major) -> Result<(), ShimError> {
        if self.major == Major::V8 && worker == Major::V7 {
            return Err(ShimError::WorkerTooOld {
                worker: self.addr(w),
                worker_major: worker,
                client_major: self.major,
            });
        }
        Ok(())
    }

    async fn run(&mut self) -> Result<(), ShimError> {
        let limits = self.limits();
        if !read_hello(&mut self.rd, self.major, &limits).await? {
            return Ok(());
        }
        for w in 0..self.workers.len() {
            if let Some(m) = self.workers[w].major() {
                self.check_worker_major(w, m)?;
            }
        }
        write_hello(&mut self.wr, self.major).await?;
        loop {
            if rpc_proto::complete_request(self.rd.buffer()).is_none() {
                self.flush_all().await?;
            }
            if self.rd.buffer().is_empty()
                && self
                    .rd
                    .fill_buf()
                    .await
                    .map_err(ShimError::Client)?
                    .is_empty()
            {
                return Ok(());
            }
            let h = self.read_header().await?;
            let cmd = check_frame(self.major, &h, &limits)?;
            if cmd == Command::Hello {
                return Err(ShimError::SecondHello);
            }
            if self.router.is_none() {
                self.router = Some(build_router(self.workers.clone(), self.major).await?);
            }
            let head = route::head_len(cmd).unwrap_or(h.size as usize);
            let mut frame = self.read_payload(h, head).await?;
            let route = self
                .router
                .as_mut()
                .expect("built above")
                .route(cmd, &mut frame[FRAME_HEADER_SIZE..])?;
            match route {
                Route::Answer(payload) => self.respond(&payload).await?,
                Route::Worker(w) => self.forward(w, cmd, h, frame).await?,
                Route::Copy(c) => self.copy(*c).await?,
            }
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

    /// The frame header and the first `head` payload bytes (`head <= h.size`, which `check_frame`
    /// bounded), read as they arrive rather than allocated up front.
    async fn read_payload(&mut self, h: FrameHeader, head: usize) -> Result<Vec<u8>, ShimError> {
        let mut frame = Vec::with_capacity(FRAME_HEADER_SIZE + head.min(1 << 20));
        frame.extend_from_slice(&h.encode());
        let got = (&mut self.rd)
            .take(head as u64)
            .read_to_end(&mut frame)
            .await
            .map_err(ShimError::Client)?;
        if got < head {
            return Err(ShimError::Client(io::ErrorKind::UnexpectedEof.into()));
        }
        Ok(frame)
    }

    /// Writes every worker's collected no-response frames.
    async fn flush_all(&mut self) -> Result<(), ShimError> {
        for w in 0..self.ups.len() {
            self.flush(w).await?;
        }
        Ok(())
    }

    async fn flush(&mut self, w: usize) -> Result<(), ShimError> {
        let addr = self.addr(w);
        if let Some(up) = self.ups[w].as_mut() {
            up.batch
                .flush(&mut up.conn)
                .await
                .map_err(ShimError::upstream(&addr))?;
        }
        Ok(())
    }

    /// Writes a response (`size | payload`) to the client.
    async fn respond(&mut self, payload: &[u8]) -> Result<(), ShimError> {
        self.scratch.clear();
        self.scratch
            .extend_from_slice(&Response::header(payload.len() as u64));
        self.scratch.extend_from_slice(payload);
        self.wr
            .write_all(&self.scratch)
            .await
            .map_err(ShimError::Client)
    }

    /// This client connection's own connection to worker `w`, opened on first need.
    async fn up(&mut self, w: usize) -> Result<&mut Up<C::Conn>, ShimError> {
        if self.ups[w].is_none() {
            self.open_up(w).await?;
            let core = &self.workers[w].core;
            if core.opts.worker_links && core.links().is_none() && !self.probe(w).await? {
                // A stock worker closed the connection on LINK_PROBE: again, without.
                self.ups[w] = None;
                self.workers[w].session_closed();
                self.open_up(w).await?;
            }
        }
        Ok(self.ups[w].as_mut().expect("opened above"))
    }

    /// Opens this client connection's own connection to worker `w`.
    async fn open_up(&mut self, w: usize) -> Result<(), ShimError> {
        {
            let worker = self.workers[w].clone();
            worker.release_control();
            let (conn, major) = worker.connector.open().await?;
            worker.core.set_major(major);
            ShimStats::inc(&worker.core.stats.session_connections);
            if conn.name() != "TCP" {
                ShimStats::inc(&worker.core.stats.rdma_sessions);
            }
            tracing::info!(worker = %worker.addr(), transport = conn.name(), worker_protocol = %major,
                client_protocol = %self.major, "upstream connection opened for a one-endpoint client");
            worker.session_opened();
            self.ups[w] = Some(Up {
                conn,
                major,
                batch: Batch::default(),
            });
            self.check_worker_major(w, major)?;
        }
        Ok(())
    }

    /// A routed request to worker `w`: `frame` holds its header and its routed head (the whole
    /// payload but for SET_TENSOR's and SET_TENSOR_2D's data, which follows on the client
    /// connection).
    async fn forward(
        &mut self,
        w: usize,
        cmd: Command,
        h: FrameHeader,
        mut frame: Vec<u8>,
    ) -> Result<(), ShimError> {
        if cmd.is_device_query() && self.ups[w].is_none() {
            return self.query(w, cmd, frame).await;
        }
        let addr = self.addr(w);
        let client = self.major;
        let limits = self.limits();
        let stats = self.workers[w].core.stats.clone();
        ShimStats::inc(&stats.frames_forwarded);
        if cmd == Command::CopyTensor {
            self.copies.1 += 1;
        }
        let rest = h.size - (frame.len() - FRAME_HEADER_SIZE) as u64;
        let up = self.up(w).await?;
        if client == Major::V7 && up.major == Major::V8 {
            // A 7.0 client's graphs toward an 8.0 worker: the device's one graph, a fixed uid.
            if cmd.runs_graph() {
                frame = rpc_proto::graph_frame_with_uid(&frame, LAST_GRAPH_UID).unwrap_or(frame);
            }
        }
        if cmd.has_response() {
            let req = Request::decode(client, cmd, &frame[FRAME_HEADER_SIZE..], &limits)?;
            let get = req.reply_data_len();
            up.batch.push_frame(&frame);
            up.batch
                .flush(&mut up.conn)
                .await
                .map_err(ShimError::upstream(&addr))?;
            let size = read_response_size(&mut up.conn, &addr, cmd, get).await?;
            ShimStats::inc(&stats.responses_relayed);
            if cmd == Command::AllocBuffer {
                let mut rsp = vec![0u8; size as usize];
                up.conn
                    .read_exact(&mut rsp)
                    .await
                    .map_err(ShimError::upstream(&addr))?;
                self.router
                    .as_mut()
                    .expect("routed")
                    .alloc_reply(w, &mut rsp)?;
                return self.respond(&rsp).await;
            }
            return self.relay(w, size).await;
        }
        if rest == 0 {
            up.batch.push_frame(&frame);
            if up.batch.len() >= BATCH_MAX {
                return self.flush(w).await;
            }
            return Ok(());
        }
        if rest <= INLINE_MAX {
            // A small SET_TENSOR: whole, into the batch.
            let at = frame.len();
            frame.resize(at + rest as usize, 0);
            self.rd
                .read_exact(&mut frame[at..])
                .await
                .map_err(ShimError::Client)?;
            let up = self.ups[w].as_mut().expect("opened above");
            up.batch.push_frame(&frame);
            if up.batch.len() >= BATCH_MAX {
                return self.flush(w).await;
            }
            return Ok(());
        }
        self.flush(w).await?;
        let up = self.ups[w].as_mut().expect("opened above");
        // Upstream's parts: cmd, size, then the payload in pieces.
        up.conn
            .send_message(&[&frame[..1], &frame[1..FRAME_HEADER_SIZE]])
            .await
            .map_err(ShimError::upstream(&addr))?;
        up.conn
            .send_message(&[&frame[FRAME_HEADER_SIZE..]])
            .await
            .map_err(ShimError::upstream(&addr))?;
        let up = self.ups[w].as_mut().expect("opened above");
        pump_payload(&mut self.rd, &mut up.conn, rest, &mut self.scratch, &addr).await
    }

    /// A query to worker `w` while this connection has no upstream connection there: from the
    /// worker's cache, else over its control connection (keyed by the worker's own numbering,
    /// so one-worker listeners share the answers).
    async fn query(&mut self, w: usize, cmd: Command, frame: Vec<u8>) -> Result<(), ShimError> {
        let worker = self.workers[w].clone();
        let cacheable = is_cacheable(cmd, &frame[FRAME_HEADER_SIZE..]);
        if cacheable {
            if let Some(rsp) = worker.cache().get(&frame) {
                ShimStats::inc(&worker.core.stats.cache_hits);
                return self.respond(&rsp).await;
            }
            ShimStats::inc(&worker.core.stats.cache_misses);
        }
        let rsp = worker.query(frame.clone()).await?;
        if cacheable {
            worker.cache().insert(&frame, &rsp);
        }
        self.respond(&rsp).await
    }

    /// Passes a `size`-byte response from worker `w` on to the client, in pieces as it arrives.
    async fn relay(&mut self, w: usize, size: u64) -> Result<(), ShimError> {
        let addr = self.addr(w);
        let up = self.ups[w].as_mut().expect("opened");
        self.scratch.clear();
        self.scratch.extend_from_slice(&Response::header(size));
        let mut left = size;
        let mut filled = RESPONSE_HEADER_SIZE;
        self.scratch
            .resize(RESPONSE_HEADER_SIZE + (size as usize).min(RELAY_CHUNK), 0);
        loop {
            let want = (left as usize).min(self.scratch.len() - filled);
            let n = if want == 0 {
                0
            } else {
                up.conn
                    .read(&mut self.scratch[filled..filled + want])
                    .await
                    .map_err(ShimError::upstream(&addr))?
            };
            if n == 0 && want > 0 {
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
            if left == 0 {
                return Ok(());
            }
        }
    }

    /// COPY_TENSOR between two workers (see the module docs).
    async fn copy(&mut self, c: CrossCopy) -> Result<(), ShimError> {
        if self.copy_direct(&c).await? {
            return Ok(());
        }
        self.respond(&[1]).await?;
        let (from_addr, to_addr) = (self.addr(c.from), self.addr(c.to));
        self.up(c.from).await?;
        self.up(c.to).await?;
        self.flush(c.from).await?;
        self.flush(c.to).await?;
        let mut get = Vec::new();
        Request::GetTensor {
            tensor: c.src,
            offset: 0,
            size: c.bytes,
        }
        .encode(&mut get);
        let mut set_head = Vec::with_capacity(FRAME_HEADER_SIZE + SET_TENSOR_HEADER_SIZE);
        set_head.extend_from_slice(
            &FrameHeader::new(Command::SetTensor, SET_TENSOR_HEADER_SIZE as u64 + c.bytes).encode(),
        );
        set_head.extend_from_slice(&c.dst.to_wire());
        set_head.push(0); // not for the hash cache
        set_head.extend_from_slice(&0u64.to_le_bytes()); // offset
        let mut src = self.ups[c.from].take().expect("opened above");
        let mut dst = self.ups[c.to].take().expect("opened above");
        let r = async {
            src.batch.push_frame(&get);
            src.batch
                .flush(&mut src.conn)
                .await
                .map_err(ShimError::upstream(&from_addr))?;
            read_response_size(&mut src.conn, &from_addr, Command::GetTensor, c.bytes).await?;
            dst.conn
                .send_message(&[&set_head[..1], &set_head[1..FRAME_HEADER_SIZE]])
                .await
                .map_err(ShimError::upstream(&to_addr))?;
            dst.conn
                .send_message(&[&set_head[FRAME_HEADER_SIZE..]])
                .await
                .map_err(ShimError::upstream(&to_addr))?;
            let mut left = c.bytes;
            self.scratch.resize(CHUNK, 0);
            while left > 0 {
                let want = (left as usize).min(CHUNK);
                let n = src
                    .conn
                    .read(&mut self.scratch[..want])
                    .await
                    .map_err(ShimError::upstream(&from_addr))?;
                if n == 0 {
                    return Err(ShimError::upstream(&from_addr)(
                        io::ErrorKind::UnexpectedEof.into(),
                    ));
                }
                dst.conn
                    .send_message(&[&self.scratch[..n]])
                    .await
                    .map_err(ShimError::upstream(&to_addr))?;
                left -= n as u64;
            }
            Ok(())
        }
        .await;
        self.ups[c.from] = Some(src);
        self.ups[c.to] = Some(dst);
        if r.is_ok() {
            self.copies.0 += 1;
            self.copies.2 += c.bytes;
        }
        r
    }
}

/// Every worker's device count: from its cache, else over its control connection.
async fn build_router<C: Connector>(
    workers: Arc<[Arc<Worker<C>>]>,
    major: Major,
) -> Result<Router, ShimError> {
    let mut counts = Vec::with_capacity(workers.len());
    for w in workers.iter() {
        let n = match w.cache().device_count() {
            Some(n) => n,
            None => {
                let rsp = w.query(DEVICE_COUNT_FRAME.to_vec()).await?;
                w.cache().insert(&DEVICE_COUNT_FRAME, &rsp);
                match Response::decode(Command::DeviceCount, &rsp) {
                    Ok(Response::DeviceCount { count }) => count,
                    _ => {
                        return Err(ShimError::BadResponse {
                            worker: w.addr().to_string(),
                            cmd: Command::DeviceCount,
                            err: format!("{} bytes", rsp.len()),
                        })
                    }
                }
            }
        };
        counts.push(n);
    }
    Ok(Router::new(major, &counts))
}

impl<C: Connector> Drop for Endpoint<C> {
    fn drop(&mut self) {
        for (w, up) in self.ups.iter_mut().enumerate() {
            if let Some(up) = up.take() {
                drop(up); // closed before the control connection may be reopened
                self.workers[w].session_closed();
            }
        }
    }
}
