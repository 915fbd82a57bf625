//! The async connection over any transport: one method per command of protocol 8.0.0 and 7.0.0
//! (the server's HELLO reply says which the connection speaks).

use std::net::SocketAddr;

use rpc_proto::{
    encode_graph, graph_payload_size, CommInit, Command, FrameHeader, Major, Parts, Region2d,
    Request, Response, RpcTensor, SetTensorHeader, CONN_CAPS_SIZE, FRAME_HEADER_SIZE, GGML_MAX_SRC,
    RESPONSE_HEADER_SIZE, SET_TENSOR_HEADER_SIZE,
};
use rpc_transport::{TcpTransport, Transport};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpStream, ToSocketAddrs};

use crate::error::ClientError;

/// Result of every client call.
pub type Result<T> = std::result::Result<T, ClientError>;

/// A buffer allocated on the server by [`Client::alloc_buffer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteBuffer {
    /// Opaque, non-zero handle (`remote_ptr`) naming the buffer in later requests.
    pub handle: u64,
    /// Actual size of the buffer in bytes (may be larger than requested).
    pub size: u64,
}

/// Free and total memory of a server device ([`Client::get_device_memory`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceMemory {
    /// Free bytes.
    pub free: u64,
    /// Total bytes.
    pub total: u64,
}

/// A connection to a ggml RPC server speaking protocol 8.0.0 or 7.0.0 (whichever its HELLO reply
/// announces: the request is the same in both), over any [`Transport`]: TCP
/// ([`TcpTransport`], the default, [`Client::connect`]) or whatever [`crate::negotiate_client`]
/// negotiated in HELLO (RDMA in upstream's flavors or the lean framing, else TCP).
///
/// Every request is one transport message cut into upstream's `send_data()` parts
/// ([`Request::parts`]), as the stock client sends it. Requests are strictly ordered. Commands without a response (SET_TENSOR, GRAPH_COMPUTE,
/// FREE_BUFFER, ...) only write their frame, so several of them can be in flight at once;
/// commands with a response write their frame and then read exactly the expected reply.
/// Every method has sent its whole message before returning, so nothing stays buffered on the
/// client side.
///
/// A server reports every error by closing the connection: the call that notices it fails
/// with [`ClientError::Closed`] (often the next call with a response, since a refused
/// no-response command cannot be noticed by itself). After any error the connection should
/// be dropped.
pub struct Client<T: Transport = TcpTransport> {
    t: T,
    version: Option<(u8, u8, u8)>,
    major: Option<Major>,
    caps: [u8; CONN_CAPS_SIZE],
    scratch: Vec<u8>,
}

/// The uid [`Client::graph_compute`] stores its graph under on an 8.0 server, so that
/// [`Client::graph_recompute`] keeps 7.0's meaning (the device's last graph) on both majors.
pub const LAST_GRAPH_UID: u64 = 1;

impl<T: Transport> std::fmt::Debug for Client<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("transport", &self.t.name())
            .field("version", &self.version)
            .finish()
    }
}

impl Client<TcpTransport> {
    /// Connects (with `TCP_NODELAY`) and performs the HELLO handshake: sends 24 zero
    /// capability bytes and accepts a server announcing `8.0.x` or `7.0.x`
    /// (else [`ClientError::VersionMismatch`]).
    pub async fn connect(addr: impl ToSocketAddrs) -> Result<Client> {
        let mut c = Self::connect_raw(addr).await?;
        c.hello().await?;
        Ok(c)
    }

    /// Connects (with `TCP_NODELAY`) without sending HELLO, for tests of the handshake.
    /// Call [`Client::hello`] (or send raw frames) next.
    pub async fn connect_raw(addr: impl ToSocketAddrs) -> Result<Client> {
        let stream = TcpStream::connect(addr).await.map_err(ClientError::Io)?;
        Ok(Client::new(
            TcpTransport::new(stream).map_err(ClientError::Io)?,
        ))
    }

    /// The server's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.t
            .peer_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// Shuts down the sending side; the server then ends the connection and frees its buffers
    /// and graphs.
    pub async fn shutdown(self) -> Result<()> {
        let (_rd, mut wr) = self.t.into_inner();
        wr.shutdown().await?;
        Ok(())
    }
}

impl<T: Transport> Client<T> {
    /// A client over a connected transport on which HELLO was not sent yet: call
    /// [`Client::hello`] (or send raw frames) next.
    pub fn new(t: T) -> Client<T> {
        Client {
            t,
            version: None,
            major: None,
            caps: [0; CONN_CAPS_SIZE],
            scratch: Vec::with_capacity(4096),
        }
    }

    /// The transport, e.g. to relay bytes over it after HELLO.
    pub fn into_transport(self) -> T {
        self.t
    }

    /// The transport.
    pub fn transport(&self) -> &T {
        &self.t
    }

    /// The transport, e.g. for a transport-level exchange (RDMA readiness byte).
    pub fn transport_mut(&mut self) -> &mut T {
        &mut self.t
    }

    /// The same connection over the transport `f` makes of this one (HELLO state kept).
    pub fn map_transport<U: Transport>(self, f: impl FnOnce(T) -> U) -> Client<U> {
        Client {
            t: f(self.t),
            version: self.version,
            major: self.major,
            caps: self.caps,
            scratch: self.scratch,
        }
    }

    /// [`Client::map_transport`] with a fallible `f`.
    pub fn try_map_transport<U: Transport, E>(
        self,
        f: impl FnOnce(T) -> std::result::Result<U, E>,
    ) -> std::result::Result<Client<U>, E> {
        Ok(Client {
            t: f(self.t)?,
            version: self.version,
            major: self.major,
            caps: self.caps,
            scratch: self.scratch,
        })
    }

    /// HELLO (14): sends 24 zero capability bytes, checks the server's version, keeps its
    /// capabilities. Returns `(major, minor, patch)`. A server accepts it only as the first
    /// command of a connection.
    pub async fn hello(&mut self) -> Result<(u8, u8, u8)> {
        self.hello_with_caps([0; CONN_CAPS_SIZE]).await
    }

    /// HELLO (14) offering transport capabilities `caps` (an RDMA offer, see
    /// [`crate::negotiate_client`]); otherwise as [`Client::hello`].
    pub async fn hello_with_caps(&mut self, caps: [u8; CONN_CAPS_SIZE]) -> Result<(u8, u8, u8)> {
        let rsp = self.call(&Request::Hello { caps }).await?;
        let Response::Hello {
            major,
            minor,
            patch,
            caps,
        } = rsp
        else {
            return Err(unexpected(&rsp));
        };
        let Some(m) = Major::from_number(major).filter(|m| m.accepts(major, minor)) else {
            return Err(ClientError::VersionMismatch {
                major,
                minor,
                patch,
            });
        };
        self.version = Some((major, minor, patch));
        self.major = Some(m);
        self.caps = caps;
        Ok((major, minor, patch))
    }

    /// The server's protocol version from HELLO (`None` before the handshake).
    pub fn server_version(&self) -> Option<(u8, u8, u8)> {
        self.version
    }

    /// The protocol major this connection speaks: the server's, from HELLO; before the handshake
    /// (raw tests) the current one, [`Major::CURRENT`].
    pub fn major(&self) -> Major {
        self.major.unwrap_or(Major::CURRENT)
    }

    /// Sets the major without a HELLO (tests that send raw frames after a handshake of their own).
    pub fn assume_major(&mut self, major: Major) {
        self.major = Some(major);
    }

    fn needs_v8(&self, what: &'static str) -> Result<()> {
        match self.major() {
            Major::V8 => Ok(()),
            Major::V7 => Err(ClientError::InvalidArgument(what)),
        }
    }

    /// The server's transport capabilities from HELLO (all zero for a TCP-only server).
    pub fn server_caps(&self) -> &[u8; CONN_CAPS_SIZE] {
        &self.caps
    }

    // ----------------------------------------------------------------------------------
    // Commands with a response
    // ----------------------------------------------------------------------------------

    /// DEVICE_COUNT (15): number of devices the server exposes.
    pub async fn device_count(&mut self) -> Result<u32> {
        match self.call(&Request::DeviceCount).await? {
            Response::DeviceCount { count } => Ok(count),
            other => Err(unexpected(&other)),
        }
    }

    /// GET_ALIGNMENT (1): buffer alignment of `device`.
    pub async fn get_alignment(&mut self, device: u32) -> Result<u64> {
        match self.call(&Request::GetAlignment { device }).await? {
            Response::GetAlignment { alignment } => Ok(alignment),
            other => Err(unexpected(&other)),
        }
    }

    /// GET_MAX_SIZE (2): largest buffer `device` can allocate.
    pub async fn get_max_size(&mut self, device: u32) -> Result<u64> {
        match self.call(&Request::GetMaxSize { device }).await? {
            Response::GetMaxSize { max_size } => Ok(max_size),
            other => Err(unexpected(&other)),
        }
    }

    /// GET_DEVICE_MEMORY (11): free and total memory of `device`.
    pub async fn get_device_memory(&mut self, device: u32) -> Result<DeviceMemory> {
        match self.call(&Request::GetDeviceMemory { device }).await? {
            Response::GetDeviceMemory { free, total } => Ok(DeviceMemory { free, total }),
            other => Err(unexpected(&other)),
        }
    }

    /// ALLOC_BUFFER (0): allocates `size` bytes on `device`. `Ok(None)` when the server
    /// could not allocate (a null handle is not an error in the protocol).
    pub async fn alloc_buffer(&mut self, device: u32, size: u64) -> Result<Option<RemoteBuffer>> {
        match self.call(&Request::AllocBuffer { device, size }).await? {
            Response::AllocBuffer {
                remote_ptr: 0,
                remote_size: _,
            } => Ok(None),
            Response::AllocBuffer {
                remote_ptr,
                remote_size,
            } => Ok(Some(RemoteBuffer {
                handle: remote_ptr,
                size: remote_size,
            })),
            other => Err(unexpected(&other)),
        }
    }

    /// BUFFER_GET_BASE (3): base address of a buffer. Tensor `data` addresses in the buffer
    /// are `base + offset`.
    pub async fn buffer_get_base(&mut self, handle: u64) -> Result<u64> {
        match self
            .call(&Request::BufferGetBase { remote_ptr: handle })
            .await?
        {
            Response::BufferGetBase { base_ptr } => Ok(base_ptr),
            other => Err(unexpected(&other)),
        }
    }

    /// SET_TENSOR_HASH (7): asks the server to fill `tensor` at `offset` from its cache entry
    /// for `hash` (FNV-1a 64 of the data, see [`rpc_proto::fnv1a64`]). `true` if it did.
    pub async fn set_tensor_hash(
        &mut self,
        tensor: &RpcTensor,
        offset: u64,
        hash: u64,
    ) -> Result<bool> {
        match self
            .call(&Request::SetTensorHash {
                tensor: *tensor,
                offset,
                hash,
            })
            .await?
        {
            Response::SetTensorHash { result } => Ok(result != 0),
            other => Err(unexpected(&other)),
        }
    }

    /// GET_TENSOR (8): reads `size` bytes of `tensor` starting at `offset`.
    pub async fn get_tensor(
        &mut self,
        tensor: &RpcTensor,
        offset: u64,
        size: u64,
    ) -> Result<Vec<u8>> {
        let len = usize::try_from(size)
            .map_err(|_| ClientError::InvalidArgument("GET_TENSOR size does not fit in memory"))?;
        let mut out = Vec::new();
        out.try_reserve_exact(len)
            .map_err(|_| ClientError::InvalidArgument("GET_TENSOR size does not fit in memory"))?;
        out.resize(len, 0);
        self.get_tensor_into(tensor, offset, &mut out).await?;
        Ok(out)
    }

    /// GET_TENSOR (8) into a caller-provided slice: reads `out.len()` bytes of `tensor`
    /// starting at `offset`, without allocating.
    pub async fn get_tensor_into(
        &mut self,
        tensor: &RpcTensor,
        offset: u64,
        out: &mut [u8],
    ) -> Result<()> {
        let size = out.len() as u64;
        self.send(&Request::GetTensor {
            tensor: *tensor,
            offset,
            size,
        })
        .await?;
        self.read_header(Command::GetTensor, size).await?;
        self.t.read_exact(out).await?;
        Ok(())
    }

    /// COPY_TENSOR (9): copies `src` into `dst` on the server. `true` if the backend copied.
    pub async fn copy_tensor(&mut self, src: &RpcTensor, dst: &RpcTensor) -> Result<bool> {
        match self
            .call(&Request::CopyTensor {
                src: *src,
                dst: *dst,
            })
            .await?
        {
            Response::CopyTensor { result } => Ok(result != 0),
            other => Err(unexpected(&other)),
        }
    }

    /// GET_ALLOC_SIZE (13): bytes `tensor` needs in a buffer of `device` (or of its own
    /// buffer). `srcs` are its sources (at most 10; missing ones are sent as null tensors).
    pub async fn get_alloc_size(
        &mut self,
        device: u32,
        tensor: &RpcTensor,
        srcs: &[RpcTensor],
    ) -> Result<u64> {
        if srcs.len() > GGML_MAX_SRC {
            return Err(ClientError::InvalidArgument(
                "GET_ALLOC_SIZE takes at most 10 sources",
            ));
        }
        let mut all = Box::new([RpcTensor::default(); GGML_MAX_SRC]);
        for (d, s) in all.iter_mut().zip(srcs) {
            *d = *s;
        }
        match self
            .call(&Request::GetAllocSize {
                device,
                tensor: *tensor,
                srcs: all,
            })
            .await?
        {
            Response::GetAllocSize { alloc_size } => Ok(alloc_size),
            other => Err(unexpected(&other)),
        }
    }

    // ----------------------------------------------------------------------------------
    // Commands without a response (write only)
    // ----------------------------------------------------------------------------------

    /// FREE_BUFFER (4): frees a buffer (and, on the server, stored graphs that use it).
    pub async fn free_buffer(&mut self, handle: u64) -> Result<()> {
        self.send(&Request::FreeBuffer { remote_ptr: handle }).await
    }

    /// BUFFER_CLEAR (5): fills a whole buffer with `value`.
    pub async fn buffer_clear(&mut self, handle: u64, value: u8) -> Result<()> {
        self.send(&Request::BufferClear {
            remote_ptr: handle,
            value,
        })
        .await
    }

    /// SET_TENSOR (6): writes `data` into `tensor` at `offset`. With `cache` set, the server
    /// may store the bytes in its weight cache (for a later [`Client::set_tensor_hash`]).
    ///
    /// The data is sent straight from `data`, without an intermediate copy: the payload goes as
    /// two parts (the header, then the data).
    pub async fn set_tensor(
        &mut self,
        tensor: &RpcTensor,
        offset: u64,
        data: &[u8],
        cache: bool,
    ) -> Result<()> {
        let h = SetTensorHeader {
            tensor: *tensor,
            cache_flag: u8::from(cache),
            offset,
        };
        self.scratch.clear();
        h.encode_frame_head(data.len() as u64, &mut self.scratch);
        debug_assert_eq!(
            self.scratch.len(),
            FRAME_HEADER_SIZE + SET_TENSOR_HEADER_SIZE
        );
        let (cmd, rest) = self.scratch.split_at(1);
        let (size, header) = rest.split_at(8);
        self.t.send_message(&[cmd, size, header, data]).await?;
        Ok(())
    }

    /// GRAPH_COMPUTE (10): builds and runs a graph on `device` and has the server keep it as the
    /// device's last graph (8.0: under [`LAST_GRAPH_UID`]). `node_ids` are the nodes in execution
    /// order; `tensors` must contain every tensor they reach, sources first.
    pub async fn graph_compute(
        &mut self,
        device: u32,
        node_ids: &[u64],
        tensors: &[RpcTensor],
    ) -> Result<()> {
        let uid = (self.major() == Major::V8).then_some(LAST_GRAPH_UID);
        self.send_graph(device, uid, node_ids, tensors).await
    }

    /// GRAPH_COMPUTE (10) with an 8.0 graph uid: the server stores the graph under `uid` (0: runs
    /// it without storing it; at 1024 stored graphs a new uid clears them all first).
    pub async fn graph_compute_uid(
        &mut self,
        device: u32,
        uid: u64,
        node_ids: &[u64],
        tensors: &[RpcTensor],
    ) -> Result<()> {
        self.needs_v8("graph uids need protocol 8")?;
        self.send_graph(device, Some(uid), node_ids, tensors).await
    }

    async fn send_graph(
        &mut self,
        device: u32,
        uid: Option<u64>,
        node_ids: &[u64],
        tensors: &[RpcTensor],
    ) -> Result<()> {
        let size = graph_payload_size(node_ids.len() as u64, tensors.len() as u64)
            .filter(|_| {
                u32::try_from(node_ids.len()).is_ok() && u32::try_from(tensors.len()).is_ok()
            })
            .and_then(|n| n.checked_add(if uid.is_some() { 8 } else { 0 }))
            .ok_or(ClientError::InvalidArgument("graph too large"))?;
        self.scratch.clear();
        self.scratch
            .extend_from_slice(&FrameHeader::new(Command::GraphCompute, size).encode());
        encode_graph(device, uid, node_ids, tensors, &mut self.scratch);
        self.t
            .send_message(Parts::of_frame(&self.scratch).as_slice())
            .await?;
        Ok(())
    }

    /// GRAPH_RECOMPUTE (16): re-runs the device's last graph stored by
    /// [`Client::graph_compute`].
    pub async fn graph_recompute(&mut self, device: u32) -> Result<()> {
        let uid = (self.major() == Major::V8).then_some(LAST_GRAPH_UID);
        self.send(&Request::GraphRecompute { device, uid }).await
    }

    /// GRAPH_RECOMPUTE (16) of the graph an 8.0 server stored under `uid` (a server without it
    /// closes the connection).
    pub async fn graph_recompute_uid(&mut self, device: u32, uid: u64) -> Result<()> {
        self.needs_v8("graph uids need protocol 8")?;
        self.send(&Request::GraphRecompute {
            device,
            uid: Some(uid),
        })
        .await
    }

    /// SET_TENSOR_2D (18, 8.0): writes `data` (`region.size · region.n_copies` bytes) as
    /// `n_copies` chunks at tensor offsets `offset + i·stride`.
    pub async fn set_tensor_2d(
        &mut self,
        tensor: &RpcTensor,
        region: Region2d,
        data: &[u8],
    ) -> Result<()> {
        self.needs_v8("SET_TENSOR_2D needs protocol 8")?;
        if region.wire_len() != Some(data.len() as u64) {
            return Err(ClientError::InvalidArgument(
                "SET_TENSOR_2D data must be size × n_copies bytes",
            ));
        }
        self.send(&Request::SetTensor2d {
            tensor: *tensor,
            region,
            data,
        })
        .await
    }

    /// GET_TENSOR_2D (19, 8.0): reads `n_copies` chunks of `size` bytes from tensor offsets
    /// `offset + i·stride`, packed.
    pub async fn get_tensor_2d(&mut self, tensor: &RpcTensor, region: Region2d) -> Result<Vec<u8>> {
        self.needs_v8("GET_TENSOR_2D needs protocol 8")?;
        let len = region
            .wire_len()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or(ClientError::InvalidArgument(
                "GET_TENSOR_2D size does not fit in memory",
            ))?;
        let mut out = Vec::new();
        out.try_reserve_exact(len).map_err(|_| {
            ClientError::InvalidArgument("GET_TENSOR_2D size does not fit in memory")
        })?;
        out.resize(len, 0);
        self.send(&Request::GetTensor2d {
            tensor: *tensor,
            region,
        })
        .await?;
        self.read_header(Command::GetTensor2d, len as u64).await?;
        self.t.read_exact(&mut out).await?;
        Ok(out)
    }

    /// COMM_INIT (20, 8.0): asks the server to join the pairwise communicator of `device` as
    /// `rank` of `world` (rank 0 listens on `port`, rank 1 dials `host:port`). `true` when it
    /// joined; `false` means the client must reduce through itself.
    pub async fn comm_init(&mut self, init: CommInit) -> Result<bool> {
        self.needs_v8("COMM_INIT needs protocol 8")?;
        match self.call(&Request::CommInit(init)).await? {
            Response::CommInit { ok } => Ok(ok != 0),
            other => Err(unexpected(&other)),
        }
    }

    /// COMM_ALLREDUCE (21, 8.0): `tensor += the peer's tensor`, summed between the servers.
    pub async fn comm_allreduce(&mut self, device: u32, tensor: &RpcTensor) -> Result<()> {
        self.needs_v8("COMM_ALLREDUCE needs protocol 8")?;
        self.send(&Request::CommAllreduce {
            device,
            tensor: *tensor,
        })
        .await
    }

    /// COMM_FREE (22, 8.0): leaves the communicator of `device`.
    pub async fn comm_free(&mut self, device: u32) -> Result<()> {
        self.needs_v8("COMM_FREE needs protocol 8")?;
        self.send(&Request::CommFree { device }).await
    }

    /// INIT_TENSOR (12): lets the server's backend initialise `tensor` in its buffer.
    pub async fn init_tensor(&mut self, tensor: &RpcTensor) -> Result<()> {
        self.send(&Request::InitTensor { tensor: *tensor }).await
    }

    /// MEMSET_TENSOR (17): fills `size` bytes of `tensor` from `offset` with `value`.
    pub async fn memset_tensor(
        &mut self,
        tensor: &RpcTensor,
        offset: u64,
        size: u64,
        value: u8,
    ) -> Result<()> {
        self.send(&Request::MemsetTensor {
            tensor: *tensor,
            offset,
            size,
            value,
        })
        .await
    }

    // ----------------------------------------------------------------------------------
    // Raw access (tests)
    // ----------------------------------------------------------------------------------

    /// Sends one frame with an arbitrary command byte: `cmd`, `u64` size = `payload.len()`,
    /// then `payload`. Nothing is validated and nothing is read.
    pub async fn send_raw(&mut self, cmd: u8, payload: &[u8]) -> Result<()> {
        let h = FrameHeader {
            cmd,
            size: payload.len() as u64,
        }
        .encode();
        let (cmd, size) = h.split_at(1);
        self.t.send_message(&[cmd, size, payload]).await?;
        Ok(())
    }

    /// Sends arbitrary bytes as one message (e.g. a frame whose declared size differs from what
    /// follows).
    pub async fn send_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        self.t.send_message(&[bytes]).await?;
        Ok(())
    }

    /// Sends a complete request frame (e.g. one relayed from another client) in upstream's parts
    /// and returns the payload of its response, whose size must be the fixed one of the frame's
    /// command ([`Response::fixed_size`]; else [`ClientError::BadResponse`]).
    pub async fn round_trip(&mut self, frame: &[u8]) -> Result<Vec<u8>> {
        let cmd = frame
            .first()
            .and_then(|&b| self.major().command(b))
            .ok_or(ClientError::InvalidArgument("not a request frame"))?;
        self.t
            .send_message(Parts::of_frame(frame).as_slice())
            .await?;
        let got = self.read_header(cmd, 0).await?;
        // read_header passed: `got` is one of the small fixed sizes.
        self.recv_raw(got).await
    }

    /// Sends `req` (one message in upstream's parts) without reading anything.
    pub async fn request(&mut self, req: &Request<'_>) -> Result<()> {
        self.send(req).await
    }

    /// Reads and decodes the fixed-size response to `cmd` (its size prefix checked before the
    /// payload is read).
    pub async fn response(&mut self, cmd: Command) -> Result<Response> {
        let got = self.read_header(cmd, 0).await?;
        // read_header passed: `got` is one of the small fixed sizes.
        let payload = self.recv_raw(got).await?;
        Ok(Response::decode(cmd, &payload)?)
    }

    /// Reads one response: a `u64` size prefix that must equal `len`
    /// (else [`ClientError::BadResponse`]), then `len` payload bytes.
    pub async fn recv_response(&mut self, len: u64) -> Result<Vec<u8>> {
        let mut p = [0u8; RESPONSE_HEADER_SIZE];
        self.t.read_exact(&mut p).await?;
        let got = u64::from_le_bytes(p);
        if got != len {
            return Err(ClientError::BadResponse(format!(
                "response size prefix is {got}, expected {len}"
            )));
        }
        self.recv_raw(len).await
    }

    /// Reads exactly `n` raw bytes (no size prefix).
    pub async fn recv_raw(&mut self, n: u64) -> Result<Vec<u8>> {
        let n = usize::try_from(n)
            .map_err(|_| ClientError::InvalidArgument("read size does not fit in memory"))?;
        let mut buf = Vec::new();
        buf.try_reserve_exact(n)
            .map_err(|_| ClientError::InvalidArgument("read size does not fit in memory"))?;
        buf.resize(n, 0);
        self.t.read_exact(&mut buf).await?;
        Ok(buf)
    }

    /// Waits until the server closes the connection. `Ok(())` on end of stream or reset;
    /// [`ClientError::BadResponse`] if the server sends data instead. Wrap it in a timeout:
    /// it waits forever on a server that neither answers nor closes.
    pub async fn wait_closed(&mut self) -> Result<()> {
        let mut b = [0u8; 1];
        match self.t.read(&mut b).await {
            Ok(0) => Ok(()),
            Ok(_) => Err(ClientError::BadResponse(format!(
                "expected the connection to be closed, got byte {:#04x}",
                b[0]
            ))),
            Err(e) => match ClientError::from(e) {
                ClientError::Closed => Ok(()),
                other => Err(other),
            },
        }
    }

    // ----------------------------------------------------------------------------------
    // Internals
    // ----------------------------------------------------------------------------------

    /// Sends the frame of `req` as one message in upstream's parts.
    async fn send(&mut self, req: &Request<'_>) -> Result<()> {
        let parts = req.parts(&mut self.scratch);
        self.t.send_message(parts.as_slice()).await?;
        Ok(())
    }

    /// Reads the response header of `cmd` and checks it ([`Response::check_header`]).
    async fn read_header(&mut self, cmd: Command, get_tensor_size: u64) -> Result<u64> {
        let mut p = [0u8; RESPONSE_HEADER_SIZE];
        self.t.read_exact(&mut p).await?;
        Ok(Response::check_header(cmd, &p, get_tensor_size)?)
    }

    /// Sends a request with a fixed-size response and decodes the response.
    async fn call(&mut self, req: &Request<'_>) -> Result<Response> {
        self.send(req).await?;
        self.response(req.command()).await
    }
}

fn unexpected(rsp: &Response) -> ClientError {
    ClientError::BadResponse(format!("unexpected {} response", rsp.command()))
}
