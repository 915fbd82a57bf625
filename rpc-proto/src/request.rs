//! Requests (client → server payloads), spec §5.1 and `rpc_msg_*_req` upstream.

use crate::command::{Command, Major};
use crate::consts::{
    COMM_HOST_SIZE, CONN_CAPS_SIZE, GGML_MAX_SRC, SET_TENSOR_2D_HEADER_SIZE, SET_TENSOR_HEADER_SIZE,
};
use crate::error::DecodeError;
use crate::frame::{check_payload_size, Limits, Parts};
use crate::graph::Graph;
use crate::tensor::RpcTensor;
use crate::wire::{patch_len, put_tensor, put_u32, put_u64, put_u8, reserve_len, Reader};

/// A decoded request. Variable-size data (`SET_TENSOR` bytes, graphs) is borrowed
/// from the payload buffer.
///
/// Tensors are stored inline (296 bytes each): a request is decoded, handled and
/// dropped, so the size is a stack copy, not a heap cost.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    /// HELLO (14): the client's transport capabilities (all zero without RDMA).
    Hello {
        /// Opaque transport-capability blob.
        caps: [u8; CONN_CAPS_SIZE],
    },
    /// ALLOC_BUFFER (0).
    AllocBuffer {
        /// Device index.
        device: u32,
        /// Requested buffer size in bytes (unbounded on the wire).
        size: u64,
    },
    /// GET_ALIGNMENT (1).
    GetAlignment {
        /// Device index.
        device: u32,
    },
    /// GET_MAX_SIZE (2).
    GetMaxSize {
        /// Device index.
        device: u32,
    },
    /// BUFFER_GET_BASE (3).
    BufferGetBase {
        /// Buffer handle from ALLOC_BUFFER.
        remote_ptr: u64,
    },
    /// FREE_BUFFER (4); no response.
    FreeBuffer {
        /// Buffer handle from ALLOC_BUFFER.
        remote_ptr: u64,
    },
    /// BUFFER_CLEAR (5); no response.
    BufferClear {
        /// Buffer handle from ALLOC_BUFFER.
        remote_ptr: u64,
        /// Fill byte.
        value: u8,
    },
    /// SET_TENSOR (6); no response.
    SetTensor {
        /// Destination tensor.
        tensor: RpcTensor,
        /// Non-zero: the server may store the data in its hash cache (new in 7.0.0).
        cache_flag: u8,
        /// Byte offset inside the tensor's data.
        offset: u64,
        /// The bytes to write (`req_size - 305` of them).
        data: &'a [u8],
    },
    /// SET_TENSOR_HASH (7).
    SetTensorHash {
        /// Destination tensor.
        tensor: RpcTensor,
        /// Byte offset inside the tensor's data.
        offset: u64,
        /// FNV-1a 64 of the data the client would send.
        hash: u64,
    },
    /// GET_TENSOR (8).
    GetTensor {
        /// Source tensor.
        tensor: RpcTensor,
        /// Byte offset inside the tensor's data.
        offset: u64,
        /// Number of bytes to read (the response carries exactly this many).
        size: u64,
    },
    /// COPY_TENSOR (9).
    CopyTensor {
        /// Source tensor.
        src: RpcTensor,
        /// Destination tensor.
        dst: RpcTensor,
    },
    /// GRAPH_COMPUTE (10); no response.
    GraphCompute(Graph<'a>),
    /// GET_DEVICE_MEMORY (11).
    GetDeviceMemory {
        /// Device index.
        device: u32,
    },
    /// INIT_TENSOR (12); no response.
    InitTensor {
        /// Tensor to initialise.
        tensor: RpcTensor,
    },
    /// GET_ALLOC_SIZE (13).
    GetAllocSize {
        /// Device index.
        device: u32,
        /// Tensor whose allocation size is asked.
        tensor: RpcTensor,
        /// Its sources (null tensors where absent).
        srcs: Box<[RpcTensor; GGML_MAX_SRC]>,
    },
    /// DEVICE_COUNT (15): empty payload.
    DeviceCount,
    /// GRAPH_RECOMPUTE (16); no response.
    GraphRecompute {
        /// Device index.
        device: u32,
        /// 8.0.0: the uid of the stored graph to run; `None`: 7.0.0 (the device's last graph).
        uid: Option<u64>,
    },
    /// MEMSET_TENSOR (17); no response.
    MemsetTensor {
        /// Destination tensor.
        tensor: RpcTensor,
        /// Byte offset inside the tensor's data.
        offset: u64,
        /// Number of bytes to fill.
        size: u64,
        /// Fill byte.
        value: u8,
    },
    /// SET_TENSOR_2D (18, 8.0); no response. Chunk `i` (`size` bytes at `data[i·size..]`) goes to
    /// tensor byte offset `offset + i·stride`.
    SetTensor2d {
        /// Destination tensor.
        tensor: RpcTensor,
        /// The copy's strided geometry.
        region: Region2d,
        /// `size · n_copies` bytes, exactly (checked when decoded).
        data: &'a [u8],
    },
    /// GET_TENSOR_2D (19, 8.0): the reply carries `size · n_copies` bytes.
    GetTensor2d {
        /// Source tensor.
        tensor: RpcTensor,
        /// The copy's strided geometry.
        region: Region2d,
    },
    /// COMM_INIT (20, 8.0): join a pairwise communicator; the reply is one byte.
    CommInit(CommInit),
    /// COMM_ALLREDUCE (21, 8.0); no response: `tensor += peer's tensor`.
    CommAllreduce {
        /// Device index.
        device: u32,
        /// The partial to sum (F32 in the stock client).
        tensor: RpcTensor,
    },
    /// COMM_FREE (22, 8.0); no response.
    CommFree {
        /// Device index.
        device: u32,
    },
    /// LINK_PROBE (0xE0, ours): empty payload.
    LinkProbe,
    /// LINK_OPEN (0xE1, ours): open the link of `slot` (< [`LINK_SLOTS`](crate::LINK_SLOTS)) as
    /// a COMM_INIT would (`init.device` is ignored: the link belongs to no device).
    LinkOpen {
        /// The connection's link slot.
        slot: u32,
        /// Rank, world, and rank 0's port and host.
        init: CommInit,
    },
    /// LINK_SEND (0xE2, ours); no response: `size` bytes of `tensor` from its start go over the
    /// slot's link (`size` must be the tensor's byte count).
    LinkSend {
        /// The connection's link slot.
        slot: u32,
        /// Source tensor.
        tensor: RpcTensor,
        /// Bytes to send.
        size: u64,
    },
    /// LINK_RECV (0xE3, ours); no response: `size` bytes from the slot's link go into `tensor`
    /// from its start.
    LinkRecv {
        /// The connection's link slot.
        slot: u32,
        /// Destination tensor.
        tensor: RpcTensor,
        /// Bytes to receive (what the peer's LINK_SEND sends).
        size: u64,
    },
    /// LINK_CLOSE (0xE4, ours); no response.
    LinkClose {
        /// The connection's link slot.
        slot: u32,
    },
}

/// The geometry of SET_TENSOR_2D / GET_TENSOR_2D: `n_copies` chunks of `size` bytes at tensor
/// byte offsets `offset + i·stride`, packed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region2d {
    /// Byte offset of the first chunk inside the tensor's data.
    pub offset: u64,
    /// Bytes per chunk.
    pub size: u64,
    /// Number of chunks.
    pub n_copies: u64,
    /// Distance between chunk starts in the tensor (0 is legal: the same chunk each time).
    pub stride: u64,
}

impl Region2d {
    /// Bytes on the wire: `size · n_copies`, `None` on overflow.
    pub fn wire_len(&self) -> Option<u64> {
        self.size.checked_mul(self.n_copies)
    }

    /// Bytes of the tensor the chunks reach from `offset`: `(n_copies − 1)·stride + size`,
    /// `None` on overflow or when either count is 0.
    pub fn span(&self) -> Option<u64> {
        if self.size == 0 || self.n_copies == 0 {
            return None;
        }
        (self.n_copies - 1)
            .checked_mul(self.stride)?
            .checked_add(self.size)
    }

    /// SET_TENSOR_2D's rule for the data that follows its head, as the stock server applies
    /// it: size and count non-zero, and exactly `size · n_copies` bytes (overflow-safe).
    pub fn check_data_len(&self, len: u64) -> Result<(), DecodeError> {
        if self.size == 0 || self.n_copies == 0 {
            return Err(DecodeError::Malformed(
                "SET_TENSOR_2D with a zero size or count",
            ));
        }
        if self.wire_len() != Some(len) {
            return Err(DecodeError::Malformed(
                "SET_TENSOR_2D data is not size × n_copies bytes",
            ));
        }
        Ok(())
    }

    fn read(r: &mut Reader<'_>) -> Result<Region2d, DecodeError> {
        Ok(Region2d {
            offset: r.u64()?,
            size: r.u64()?,
            n_copies: r.u64()?,
            stride: r.u64()?,
        })
    }

    fn encode(&self, out: &mut Vec<u8>) {
        put_u64(out, self.offset);
        put_u64(out, self.size);
        put_u64(out, self.n_copies);
        put_u64(out, self.stride);
    }
}

/// COMM_INIT's request: which rank of how many this server is for `device`, and where rank 0
/// listens (`host` empty for rank 0 itself; rank 1 dials `host:port`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommInit {
    /// Device index.
    pub device: u32,
    /// This server's rank.
    pub rank: u32,
    /// Number of ranks (the stock 8.0 server supports 2).
    pub world: u32,
    /// Port rank 0 listens on (the client's rank-0 endpoint port + 1000).
    pub port: u32,
    /// Rank 0's host as the client spelled it, NUL-padded.
    pub host: [u8; COMM_HOST_SIZE],
}

impl CommInit {
    fn read(r: &mut Reader<'_>) -> Result<CommInit, DecodeError> {
        Ok(CommInit {
            device: r.u32()?,
            rank: r.u32()?,
            world: r.u32()?,
            port: r.u32()?,
            host: r.array()?,
        })
    }

    fn encode(&self, out: &mut Vec<u8>) {
        put_u32(out, self.device);
        put_u32(out, self.rank);
        put_u32(out, self.world);
        put_u32(out, self.port);
        out.extend_from_slice(&self.host);
    }

    /// The host text up to its first NUL, if it is UTF-8.
    pub fn host_str(&self) -> Option<&str> {
        let end = self
            .host
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.host.len());
        core::str::from_utf8(self.host.get(..end)?).ok()
    }

    /// `host` NUL-padded into the fixed field; `None` when it does not fit with its NUL.
    pub fn host_field(host: &str) -> Option<[u8; COMM_HOST_SIZE]> {
        let mut f = [0u8; COMM_HOST_SIZE];
        if host.len() >= COMM_HOST_SIZE {
            return None;
        }
        f.get_mut(..host.len())?.copy_from_slice(host.as_bytes());
        Some(f)
    }
}

impl<'a> Request<'a> {
    /// The command of this request.
    pub fn command(&self) -> Command {
        match self {
            Request::Hello { .. } => Command::Hello,
            Request::AllocBuffer { .. } => Command::AllocBuffer,
            Request::GetAlignment { .. } => Command::GetAlignment,
            Request::GetMaxSize { .. } => Command::GetMaxSize,
            Request::BufferGetBase { .. } => Command::BufferGetBase,
            Request::FreeBuffer { .. } => Command::FreeBuffer,
            Request::BufferClear { .. } => Command::BufferClear,
            Request::SetTensor { .. } => Command::SetTensor,
            Request::SetTensorHash { .. } => Command::SetTensorHash,
            Request::GetTensor { .. } => Command::GetTensor,
            Request::CopyTensor { .. } => Command::CopyTensor,
            Request::GraphCompute(_) => Command::GraphCompute,
            Request::GetDeviceMemory { .. } => Command::GetDeviceMemory,
            Request::InitTensor { .. } => Command::InitTensor,
            Request::GetAllocSize { .. } => Command::GetAllocSize,
            Request::DeviceCount => Command::DeviceCount,
            Request::GraphRecompute { .. } => Command::GraphRecompute,
            Request::MemsetTensor { .. } => Command::MemsetTensor,
            Request::SetTensor2d { .. } => Command::SetTensor2d,
            Request::GetTensor2d { .. } => Command::GetTensor2d,
            Request::CommInit(_) => Command::CommInit,
            Request::CommAllreduce { .. } => Command::CommAllreduce,
            Request::CommFree { .. } => Command::CommFree,
            Request::LinkProbe => Command::LinkProbe,
            Request::LinkOpen { .. } => Command::LinkOpen,
            Request::LinkSend { .. } => Command::LinkSend,
            Request::LinkRecv { .. } => Command::LinkRecv,
            Request::LinkClose { .. } => Command::LinkClose,
        }
    }

    /// Decode the complete payload of a `cmd` request on a `major` connection.
    ///
    /// Re-checks the command and the payload size like [`check_frame`](crate::check_frame), so
    /// it is safe on any bytes; never panics. Trailing bytes are impossible for fixed-size
    /// commands and rejected for GRAPH_COMPUTE and SET_TENSOR_2D.
    pub fn decode(
        major: Major,
        cmd: Command,
        payload: &'a [u8],
        limits: &Limits,
    ) -> Result<Request<'a>, DecodeError> {
        if major.command(cmd.as_u8()).is_none() {
            return Err(DecodeError::UnknownCommand(cmd.as_u8()));
        }
        check_payload_size(major, cmd, payload.len() as u64, limits)?;
        let mut r = Reader::new(payload, cmd.name());
        let req = match cmd {
            Command::Hello => Request::Hello { caps: r.array()? },
            Command::AllocBuffer => Request::AllocBuffer {
                device: r.u32()?,
                size: r.u64()?,
            },
            Command::GetAlignment => Request::GetAlignment { device: r.u32()? },
            Command::GetMaxSize => Request::GetMaxSize { device: r.u32()? },
            Command::BufferGetBase => Request::BufferGetBase {
                remote_ptr: r.u64()?,
            },
            Command::FreeBuffer => Request::FreeBuffer {
                remote_ptr: r.u64()?,
            },
            Command::BufferClear => Request::BufferClear {
                remote_ptr: r.u64()?,
                value: r.u8()?,
            },
            Command::SetTensor => {
                let h = SetTensorHeader::read(&mut r)?;
                return Ok(Request::SetTensor {
                    tensor: h.tensor,
                    cache_flag: h.cache_flag,
                    offset: h.offset,
                    data: r.rest(),
                });
            }
            Command::SetTensorHash => Request::SetTensorHash {
                tensor: r.tensor()?,
                offset: r.u64()?,
                hash: r.u64()?,
            },
            Command::GetTensor => Request::GetTensor {
                tensor: r.tensor()?,
                offset: r.u64()?,
                size: r.u64()?,
            },
            Command::CopyTensor => Request::CopyTensor {
                src: r.tensor()?,
                dst: r.tensor()?,
            },
            Command::GraphCompute => {
                return Graph::decode(major, payload, limits).map(Request::GraphCompute)
            }
            Command::GetDeviceMemory => Request::GetDeviceMemory { device: r.u32()? },
            Command::InitTensor => Request::InitTensor {
                tensor: r.tensor()?,
            },
            Command::GetAllocSize => {
                let device = r.u32()?;
                let tensor = r.tensor()?;
                let mut srcs = Box::new([RpcTensor::default(); GGML_MAX_SRC]);
                for src in srcs.iter_mut() {
                    *src = r.tensor()?;
                }
                Request::GetAllocSize {
                    device,
                    tensor,
                    srcs,
                }
            }
            Command::DeviceCount => Request::DeviceCount,
            Command::GraphRecompute => Request::GraphRecompute {
                device: r.u32()?,
                uid: match major {
                    Major::V7 => None,
                    Major::V8 => Some(r.u64()?),
                },
            },
            Command::MemsetTensor => Request::MemsetTensor {
                tensor: r.tensor()?,
                offset: r.u64()?,
                size: r.u64()?,
                value: r.u8()?,
            },
            Command::SetTensor2d => {
                let tensor = r.tensor()?;
                let region = Region2d::read(&mut r)?;
                let data = r.rest();
                region.check_data_len(data.len() as u64)?;
                return Ok(Request::SetTensor2d {
                    tensor,
                    region,
                    data,
                });
            }
            Command::GetTensor2d => Request::GetTensor2d {
                tensor: r.tensor()?,
                region: Region2d::read(&mut r)?,
            },
            Command::CommInit => Request::CommInit(CommInit::read(&mut r)?),
            Command::CommAllreduce => Request::CommAllreduce {
                device: r.u32()?,
                tensor: r.tensor()?,
            },
            Command::CommFree => Request::CommFree { device: r.u32()? },
            Command::LinkProbe => Request::LinkProbe,
            Command::LinkOpen => Request::LinkOpen {
                slot: r.u32()?,
                init: CommInit::read(&mut r)?,
            },
            Command::LinkSend => Request::LinkSend {
                slot: r.u32()?,
                tensor: r.tensor()?,
                size: r.u64()?,
            },
            Command::LinkRecv => Request::LinkRecv {
                slot: r.u32()?,
                tensor: r.tensor()?,
                size: r.u64()?,
            },
            Command::LinkClose => Request::LinkClose { slot: r.u32()? },
        };
        r.finish("trailing bytes after request")?;
        Ok(req)
    }

    /// Append the whole frame: command byte, `u64` LE payload size, payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_u8(out, self.command().as_u8());
        let pos = reserve_len(out);
        self.encode_payload(out);
        patch_len(out, pos);
    }

    /// Encodes the whole frame into `buf` (cleared first) and returns it cut into upstream's
    /// `send_data()` parts ([`Parts`]): what a client hands to a transport as one message.
    pub fn parts<'b>(&self, buf: &'b mut Vec<u8>) -> Parts<'b> {
        buf.clear();
        self.encode(buf);
        Parts::of_frame(buf)
    }

    /// Append the payload only (no command byte, no size).
    pub fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            Request::Hello { caps } => out.extend_from_slice(caps),
            Request::AllocBuffer { device, size } => {
                put_u32(out, *device);
                put_u64(out, *size);
            }
            Request::GetAlignment { device }
            | Request::GetMaxSize { device }
            | Request::GetDeviceMemory { device }
            | Request::CommFree { device } => put_u32(out, *device),
            Request::GraphRecompute { device, uid } => {
                put_u32(out, *device);
                if let Some(uid) = uid {
                    put_u64(out, *uid);
                }
            }
            Request::BufferGetBase { remote_ptr } | Request::FreeBuffer { remote_ptr } => {
                put_u64(out, *remote_ptr)
            }
            Request::BufferClear { remote_ptr, value } => {
                put_u64(out, *remote_ptr);
                put_u8(out, *value);
            }
            Request::SetTensor {
                tensor,
                cache_flag,
                offset,
                data,
            } => {
                let h = SetTensorHeader {
                    tensor: *tensor,
                    cache_flag: *cache_flag,
                    offset: *offset,
                };
                h.encode(out);
                out.extend_from_slice(data);
            }
            Request::SetTensorHash {
                tensor,
                offset,
                hash,
            } => {
                put_tensor(out, tensor);
                put_u64(out, *offset);
                put_u64(out, *hash);
            }
            Request::GetTensor {
                tensor,
                offset,
                size,
            } => {
                put_tensor(out, tensor);
                put_u64(out, *offset);
                put_u64(out, *size);
            }
            Request::CopyTensor { src, dst } => {
                put_tensor(out, src);
                put_tensor(out, dst);
            }
            Request::GraphCompute(graph) => graph.encode(out),
            Request::InitTensor { tensor } => put_tensor(out, tensor),
            Request::GetAllocSize {
                device,
                tensor,
                srcs,
            } => {
                put_u32(out, *device);
                put_tensor(out, tensor);
                for src in srcs.iter() {
                    put_tensor(out, src);
                }
            }
            Request::DeviceCount => {}
            Request::MemsetTensor {
                tensor,
                offset,
                size,
                value,
            } => {
                put_tensor(out, tensor);
                put_u64(out, *offset);
                put_u64(out, *size);
                put_u8(out, *value);
            }
            Request::SetTensor2d {
                tensor,
                region,
                data,
            } => {
                put_tensor(out, tensor);
                region.encode(out);
                out.extend_from_slice(data);
            }
            Request::GetTensor2d { tensor, region } => {
                put_tensor(out, tensor);
                region.encode(out);
            }
            Request::CommInit(c) => c.encode(out),
            Request::LinkProbe => {}
            Request::LinkOpen { slot, init } => {
                put_u32(out, *slot);
                init.encode(out);
            }
            Request::LinkSend { slot, tensor, size } | Request::LinkRecv { slot, tensor, size } => {
                put_u32(out, *slot);
                put_tensor(out, tensor);
                put_u64(out, *size);
            }
            Request::LinkClose { slot } => put_u32(out, *slot),
            Request::CommAllreduce { device, tensor } => {
                put_u32(out, *device);
                put_tensor(out, tensor);
            }
        }
    }

    /// The byte count a reply to this request carries, for a client to check the reply's size
    /// prefix before reading it ([`Response::check_header`](crate::Response::check_header)):
    /// GET_TENSOR's `size`, GET_TENSOR_2D's `size · n_copies` (saturating; no such reply can
    /// be accepted), 0 for the rest.
    pub fn reply_data_len(&self) -> u64 {
        match self {
            Request::GetTensor { size, .. } => *size,
            Request::GetTensor2d { region, .. } => region.wire_len().unwrap_or(u64::MAX),
            _ => 0,
        }
    }
}

/// The fixed head of a request whose data follows it (the streamed-body class,
/// [`Command::data_head`]), decoded before the data arrives, so a server can check where the
/// data goes and then put each byte there as it comes: one definition of each such head, for
/// [`Request::decode`] and a streaming server alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataHead {
    /// SET_TENSOR's head: the data goes to one run of the tensor.
    SetTensor(SetTensorHeader),
    /// SET_TENSOR_2D's head: the data goes to `n_copies` runs of `size` bytes, `stride` apart.
    SetTensor2d {
        /// Destination tensor.
        tensor: RpcTensor,
        /// The copy's strided geometry, checked against the data's length.
        region: Region2d,
    },
}

impl DataHead {
    /// Decodes the head of `cmd` from the first [`Command::data_head`] bytes of `head`, with
    /// `data_len` bytes of data to follow; refused as [`Request::decode`] refuses the whole
    /// request (a SET_TENSOR_2D whose data is not `size · n_copies` bytes, a head too short, a
    /// command without a data head).
    pub fn decode(cmd: Command, head: &[u8], data_len: u64) -> Result<DataHead, DecodeError> {
        match cmd {
            Command::SetTensor => Ok(DataHead::SetTensor(SetTensorHeader::decode(head)?)),
            Command::SetTensor2d => {
                let mut r = Reader::new(head, "SET_TENSOR_2D header");
                if r.remaining() < SET_TENSOR_2D_HEADER_SIZE {
                    return Err(DecodeError::TooShort {
                        what: "SET_TENSOR_2D header",
                        need: SET_TENSOR_2D_HEADER_SIZE as u64,
                        got: r.remaining() as u64,
                    });
                }
                let tensor = r.tensor()?;
                let region = Region2d::read(&mut r)?;
                region.check_data_len(data_len)?;
                Ok(DataHead::SetTensor2d { tensor, region })
            }
            _ => Err(DecodeError::Malformed("a request without a data head")),
        }
    }
}

/// The fixed 305-byte head of a SET_TENSOR payload, so a server can decode it
/// first and stream the (possibly huge) data straight into tensor memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetTensorHeader {
    /// Destination tensor.
    pub tensor: RpcTensor,
    /// Non-zero: the server may store the data in its hash cache.
    pub cache_flag: u8,
    /// Byte offset inside the tensor's data.
    pub offset: u64,
}

impl SetTensorHeader {
    /// Decode from the first [`SET_TENSOR_HEADER_SIZE`] bytes of `b`; extra bytes
    /// (the data) are ignored.
    pub fn decode(b: &[u8]) -> Result<SetTensorHeader, DecodeError> {
        Self::read(&mut Reader::new(b, "SET_TENSOR header"))
    }

    fn read(r: &mut Reader<'_>) -> Result<SetTensorHeader, DecodeError> {
        if r.remaining() < SET_TENSOR_HEADER_SIZE {
            return Err(DecodeError::TooShort {
                what: "SET_TENSOR header",
                need: SET_TENSOR_HEADER_SIZE as u64,
                got: r.remaining() as u64,
            });
        }
        Ok(SetTensorHeader {
            tensor: r.tensor()?,
            cache_flag: r.u8()?,
            offset: r.u64()?,
        })
    }

    /// Append the 305 header bytes (no frame header, no data).
    pub fn encode(&self, out: &mut Vec<u8>) {
        put_tensor(out, &self.tensor);
        put_u8(out, self.cache_flag);
        put_u64(out, self.offset);
    }

    /// Client side, for streaming: append the frame header (`SET_TENSOR`,
    /// size `305 + data_len`) and this header. The caller then sends `data_len` bytes.
    pub fn encode_frame_head(&self, data_len: u64, out: &mut Vec<u8>) {
        put_u8(out, Command::SetTensor.as_u8());
        put_u64(
            out,
            (SET_TENSOR_HEADER_SIZE as u64).saturating_add(data_len),
        );
        self.encode(out);
    }
}
