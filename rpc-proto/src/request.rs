//! Requests (client → server payloads), spec §5.1 and `rpc_msg_*_req` upstream.

use crate::command::Command;
use crate::consts::{CONN_CAPS_SIZE, GGML_MAX_SRC, SET_TENSOR_HEADER_SIZE};
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
        }
    }

    /// Decode the complete payload of a `cmd` request.
    ///
    /// Re-checks the payload size like [`check_frame`](crate::check_frame), so it is
    /// safe on any bytes; never panics. Trailing bytes are impossible for
    /// fixed-size commands and rejected for GRAPH_COMPUTE.
    pub fn decode(
        cmd: Command,
        payload: &'a [u8],
        limits: &Limits,
    ) -> Result<Request<'a>, DecodeError> {
        check_payload_size(cmd, payload.len() as u64, limits)?;
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
                return Graph::decode(payload, limits).map(Request::GraphCompute)
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
            Command::GraphRecompute => Request::GraphRecompute { device: r.u32()? },
            Command::MemsetTensor => Request::MemsetTensor {
                tensor: r.tensor()?,
                offset: r.u64()?,
                size: r.u64()?,
                value: r.u8()?,
            },
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
            | Request::GraphRecompute { device } => put_u32(out, *device),
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
