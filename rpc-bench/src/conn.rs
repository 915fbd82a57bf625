//! A benchmark connection to a ggml RPC server over TCP ([`rpc_client::Client`]) or RDMA.
//!
//! RDMA mirrors the server's negotiation (`rpc-server/src/connection.rs`, `rdma.rs`) in the
//! client role, with `rpc-transport`'s verbs code: prepare a queue pair for the TCP socket's local
//! address, offer its caps in HELLO, and activate with the server's caps if it offers any (RC:
//! straight away; UC: after upstream's readiness byte exchange). Requests then go over the
//! [`Transport`] with upstream's `send_data()` segmentation (`cmd`, `size`, payload as separate
//! parts), which the stock Linux RDMA server depends on.

use std::net::SocketAddr;

use rpc_client::{Client, ClientError, RpcTensor, TensorBuilder};
use rpc_proto::{
    Command, Request, Response, SetTensorHeader, CONN_CAPS_SIZE, RESPONSE_HEADER_SIZE,
};
use rpc_transport::rdma::real::{self, RdmaOptions, RealQp};
use rpc_transport::rdma::{Caps, Flavor, RcLink, RdmaTransport, UcLink};
use rpc_transport::{TcpTransport, Transport};
use tokio::net::TcpStream;

/// Transport to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TransportKind {
    /// TCP (the protocol's native transport).
    Tcp,
    /// RDMA negotiated inside HELLO (upstream Linux RC or Apple UC flavor).
    Rdma,
}

/// RDMA flavor choice on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FlavorArg {
    /// This platform's stock flavor: Apple UC on macOS, Linux RC elsewhere.
    Native,
    /// Upstream `transport.cpp` (RoCE / InfiniBand, RC queue pair).
    Rc,
    /// Upstream `transport-apple.cpp` (Thunderbolt, UC queue pair, 128 KiB strides).
    Uc,
}

impl FlavorArg {
    /// The concrete flavor.
    pub fn flavor(self) -> Flavor {
        match self {
            FlavorArg::Rc => Flavor::LinuxRc,
            FlavorArg::Uc => Flavor::AppleUc,
            FlavorArg::Native if cfg!(target_os = "macos") => Flavor::AppleUc,
            FlavorArg::Native => Flavor::LinuxRc,
        }
    }
}

/// RDMA settings.
#[derive(Debug, Clone)]
pub struct RdmaSettings {
    /// Flavor to offer.
    pub flavor: Flavor,
    /// Device and GID selection.
    pub opts: RdmaOptions,
}

/// Why a benchmark connection failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnError {
    /// Protocol or I/O error.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// RDMA could not engage on this side.
    #[error("RDMA cannot engage on this machine: {0}")]
    LocalRdma(String),
    /// The server answered HELLO with zero caps.
    #[error(
        "the server at {0} declined RDMA (it answered all-zero caps: no RDMA device for that address, \
         --transport tcp, its RDMA budget is used up, or it was built without RDMA)"
    )]
    Declined(SocketAddr),
    /// The server offered the other flavor.
    #[error("the server offered a different RDMA flavor than the {0} this client offered")]
    FlavorMismatch(&'static str),
    /// The server refused to allocate the benchmark buffer.
    #[error("the server could not allocate a {0}-byte buffer")]
    Alloc(u64),
}

impl From<std::io::Error> for ConnError {
    fn from(e: std::io::Error) -> Self {
        ConnError::Client(ClientError::from(e))
    }
}

/// Upstream's readiness byte (Apple flavor).
const READY: u8 = 0x2A;

/// Protocol over any [`Transport`] with upstream's part segmentation (just the commands the
/// benchmark needs).
pub struct WireConn<T: Transport> {
    t: T,
    scratch: Vec<u8>,
}

impl<T: Transport> WireConn<T> {
    async fn call(&mut self, req: &Request<'_>) -> Result<Response, ConnError> {
        let cmd = req.command();
        self.scratch.clear();
        req.encode_payload(&mut self.scratch);
        let size = (self.scratch.len() as u64).to_le_bytes();
        self.t
            .send_message(&[&[cmd.as_u8()], &size, &self.scratch])
            .await?;
        let got = self.read_prefix().await?;
        Response::check_size(cmd, got, 0).map_err(ClientError::from)?;
        let mut payload = vec![0u8; got as usize];
        self.t.read_exact(&mut payload).await?;
        Ok(Response::decode(cmd, &payload).map_err(ClientError::from)?)
    }

    async fn read_prefix(&mut self) -> Result<u64, ConnError> {
        let mut p = [0u8; RESPONSE_HEADER_SIZE];
        self.t.read_exact(&mut p).await?;
        Ok(u64::from_le_bytes(p))
    }

    async fn set_tensor(&mut self, tensor: &RpcTensor, data: &[u8]) -> Result<(), ConnError> {
        let h = SetTensorHeader {
            tensor: *tensor,
            cache_flag: 0,
            offset: 0,
        };
        self.scratch.clear();
        h.encode(&mut self.scratch);
        let size = ((self.scratch.len() + data.len()) as u64).to_le_bytes();
        self.t
            .send_message(&[&[Command::SetTensor.as_u8()], &size, &self.scratch, data])
            .await?;
        Ok(())
    }

    async fn get_tensor_into(
        &mut self,
        tensor: &RpcTensor,
        out: &mut [u8],
    ) -> Result<(), ConnError> {
        let size = out.len() as u64;
        self.scratch.clear();
        Request::GetTensor {
            tensor: *tensor,
            offset: 0,
            size,
        }
        .encode_payload(&mut self.scratch);
        let len = (self.scratch.len() as u64).to_le_bytes();
        self.t
            .send_message(&[&[Command::GetTensor.as_u8()], &len, &self.scratch])
            .await?;
        let got = self.read_prefix().await?;
        Response::check_size(Command::GetTensor, got, size).map_err(ClientError::from)?;
        self.t.read_exact(out).await?;
        Ok(())
    }
}

/// A connection the benchmark drives.
pub enum BenchConn {
    /// TCP, through the workspace's client library.
    Tcp(Client),
    /// RDMA, Linux RC flavor.
    Rc(WireConn<RdmaTransport<RcLink<RealQp>>>),
    /// RDMA, Apple UC flavor.
    Uc(WireConn<RdmaTransport<UcLink<RealQp>>>),
}

impl BenchConn {
    /// Connects over TCP (HELLO with zero caps).
    pub async fn tcp(addr: SocketAddr) -> Result<BenchConn, ConnError> {
        Ok(BenchConn::Tcp(Client::connect(addr).await?))
    }

    /// Connects and negotiates RDMA in HELLO; fails (never falls back) if RDMA does not engage.
    pub async fn rdma(addr: SocketAddr, s: &RdmaSettings) -> Result<BenchConn, ConnError> {
        let stream = TcpStream::connect(addr).await?;
        let local_ip = stream.local_addr()?.ip();
        let prepared = real::prepare(local_ip, s.flavor, &s.opts)
            .map_err(|e| ConnError::LocalRdma(e.to_string()))?;
        let ours = prepared.caps().encode();
        let mut tcp = TcpTransport::new(stream)?;
        let size = (CONN_CAPS_SIZE as u64).to_le_bytes();
        tcp.send_message(&[&[Command::Hello.as_u8()], &size, &ours])
            .await?;
        let mut p = [0u8; RESPONSE_HEADER_SIZE];
        tcp.read_exact(&mut p).await?;
        let got = u64::from_le_bytes(p);
        Response::check_size(Command::Hello, got, 0).map_err(ClientError::from)?;
        let mut payload = vec![0u8; got as usize];
        tcp.read_exact(&mut payload).await?;
        let Response::Hello {
            major,
            minor,
            patch,
            caps,
        } = Response::decode(Command::Hello, &payload).map_err(ClientError::from)?
        else {
            return Err(ClientError::BadResponse("HELLO reply expected".into()).into());
        };
        if !rpc_proto::version_compatible(major, minor) {
            return Err(ClientError::VersionMismatch {
                major,
                minor,
                patch,
            }
            .into());
        }
        if caps.iter().all(|&b| b == 0) {
            return Err(ConnError::Declined(addr));
        }
        let peer =
            Caps::decode(&caps, s.flavor).ok_or(ConnError::FlavorMismatch(s.flavor.name()))?;
        if peer.flavor != s.flavor {
            return Err(ConnError::FlavorMismatch(s.flavor.name()));
        }
        match s.flavor {
            Flavor::LinuxRc => {
                let link = prepared
                    .activate_rc(&peer)
                    .map_err(|e| ConnError::LocalRdma(e.to_string()))?;
                let anchor = anchor(tcp)?;
                let t = RdmaTransport::new(link, Some(anchor), "RDMA/RC");
                Ok(BenchConn::Rc(WireConn {
                    t,
                    scratch: Vec::new(),
                }))
            }
            Flavor::AppleUc => {
                let link = match prepared.activate_uc(&peer) {
                    Ok(l) => l,
                    Err(e) => {
                        let _ = tcp.send_message(&[&[0]]).await;
                        return Err(ConnError::LocalRdma(e.to_string()));
                    }
                };
                tcp.send_message(&[&[READY]]).await?;
                let mut b = [0u8; 1];
                tcp.read_exact(&mut b).await?;
                if b[0] != READY {
                    return Err(ConnError::LocalRdma(format!(
                        "server readiness byte {:#x}",
                        b[0]
                    )));
                }
                let anchor = anchor(tcp)?;
                let t = RdmaTransport::new(link, Some(anchor), "RDMA/UC");
                Ok(BenchConn::Uc(WireConn {
                    t,
                    scratch: Vec::new(),
                }))
            }
        }
    }

    /// Transport name for tables.
    pub fn transport_name(&self) -> &'static str {
        match self {
            BenchConn::Tcp(_) => "TCP",
            BenchConn::Rc(c) => c.t.name(),
            BenchConn::Uc(c) => c.t.name(),
        }
    }

    /// DEVICE_COUNT: the empty round trip.
    pub async fn device_count(&mut self) -> Result<u32, ConnError> {
        match self {
            BenchConn::Tcp(c) => Ok(c.device_count().await?),
            BenchConn::Rc(c) => device_count(c).await,
            BenchConn::Uc(c) => device_count(c).await,
        }
    }

    /// Allocates `size` bytes on `device`; returns (handle, base address).
    pub async fn alloc(&mut self, device: u32, size: u64) -> Result<(u64, u64), ConnError> {
        match self {
            BenchConn::Tcp(c) => {
                let b = c
                    .alloc_buffer(device, size)
                    .await?
                    .ok_or(ConnError::Alloc(size))?;
                Ok((b.handle, c.buffer_get_base(b.handle).await?))
            }
            BenchConn::Rc(c) => alloc(c, device, size).await,
            BenchConn::Uc(c) => alloc(c, device, size).await,
        }
    }

    /// SET_TENSOR of `data` at offset 0 (no response).
    pub async fn set_tensor(&mut self, t: &RpcTensor, data: &[u8]) -> Result<(), ConnError> {
        match self {
            BenchConn::Tcp(c) => Ok(c.set_tensor(t, 0, data, false).await?),
            BenchConn::Rc(c) => c.set_tensor(t, data).await,
            BenchConn::Uc(c) => c.set_tensor(t, data).await,
        }
    }

    /// GET_TENSOR of `out.len()` bytes at offset 0.
    pub async fn get_tensor_into(
        &mut self,
        t: &RpcTensor,
        out: &mut [u8],
    ) -> Result<(), ConnError> {
        match self {
            BenchConn::Tcp(c) => Ok(c.get_tensor_into(t, 0, out).await?),
            BenchConn::Rc(c) => c.get_tensor_into(t, out).await,
            BenchConn::Uc(c) => c.get_tensor_into(t, out).await,
        }
    }
}

async fn device_count<T: Transport>(c: &mut WireConn<T>) -> Result<u32, ConnError> {
    match c.call(&Request::DeviceCount).await? {
        Response::DeviceCount { count } => Ok(count),
        _ => Err(ClientError::BadResponse("DEVICE_COUNT reply expected".into()).into()),
    }
}

async fn alloc<T: Transport>(
    c: &mut WireConn<T>,
    device: u32,
    size: u64,
) -> Result<(u64, u64), ConnError> {
    let handle = match c.call(&Request::AllocBuffer { device, size }).await? {
        Response::AllocBuffer { remote_ptr: 0, .. } => return Err(ConnError::Alloc(size)),
        Response::AllocBuffer { remote_ptr, .. } => remote_ptr,
        _ => return Err(ClientError::BadResponse("ALLOC_BUFFER reply expected".into()).into()),
    };
    match c
        .call(&Request::BufferGetBase { remote_ptr: handle })
        .await?
    {
        Response::BufferGetBase { base_ptr } => Ok((handle, base_ptr)),
        _ => Err(ClientError::BadResponse("BUFFER_GET_BASE reply expected".into()).into()),
    }
}

fn anchor(tcp: TcpTransport) -> Result<TcpStream, ConnError> {
    if tcp.buffered() != 0 {
        return Err(ConnError::LocalRdma(
            "server sent TCP bytes after switching to RDMA".into(),
        ));
    }
    let (rd, wr) = tcp.into_inner();
    rd.into_inner()
        .reunite(wr)
        .map_err(|e| ConnError::LocalRdma(e.to_string()))
}

/// A 1-D f32 tensor of `bytes` bytes at `base` in buffer `handle`.
pub fn bench_tensor(id: u64, handle: u64, base: u64, bytes: usize) -> RpcTensor {
    TensorBuilder::f32(id)
        .ne(&[(bytes / 4).max(1) as u32])
        .data(handle, base)
        .build()
}
