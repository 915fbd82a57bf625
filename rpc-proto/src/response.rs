//! Responses (server → client payloads), spec §5.1 and `rpc_msg_*_rsp` upstream.

use crate::command::{Command, Major};
use crate::consts::{CONN_CAPS_SIZE, RESPONSE_HEADER_SIZE};
use crate::error::DecodeError;
use crate::wire::{patch_len, put_u32, put_u64, put_u8, reserve_len, Reader};

/// A response payload. Only the commands of the response matrix have one (11 in 7.0.0, 13 in
/// 8.0.0; see [`Command::has_response`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// HELLO: the server's version and transport capabilities (28 bytes with one padding byte).
    Hello {
        /// Protocol major version.
        major: u8,
        /// Protocol minor version.
        minor: u8,
        /// Protocol patch version.
        patch: u8,
        /// Server transport capabilities; all zero for a server without RDMA.
        caps: [u8; CONN_CAPS_SIZE],
    },
    /// ALLOC_BUFFER: `remote_ptr == 0` means the allocation failed.
    AllocBuffer {
        /// Opaque buffer handle, 0 on failure.
        remote_ptr: u64,
        /// Actual buffer size.
        remote_size: u64,
    },
    /// GET_ALIGNMENT.
    GetAlignment {
        /// Buffer alignment of the device.
        alignment: u64,
    },
    /// GET_MAX_SIZE.
    GetMaxSize {
        /// Largest buffer the device can allocate.
        max_size: u64,
    },
    /// BUFFER_GET_BASE.
    BufferGetBase {
        /// Base address of the buffer (non-zero, aligned).
        base_ptr: u64,
    },
    /// SET_TENSOR_HASH: 1 if the server found the data in its cache and wrote it.
    SetTensorHash {
        /// 1 = written from the cache, 0 = not cached.
        result: u8,
    },
    /// GET_TENSOR: exactly the requested number of bytes.
    GetTensor(Vec<u8>),
    /// COPY_TENSOR.
    CopyTensor {
        /// Backend result of the copy (1 = copied).
        result: u8,
    },
    /// GET_DEVICE_MEMORY.
    GetDeviceMemory {
        /// Free device memory in bytes.
        free: u64,
        /// Total device memory in bytes.
        total: u64,
    },
    /// GET_ALLOC_SIZE.
    GetAllocSize {
        /// Bytes the tensor needs in a buffer.
        alloc_size: u64,
    },
    /// DEVICE_COUNT.
    DeviceCount {
        /// Number of devices the server exposes.
        count: u32,
    },
    /// GET_TENSOR_2D (8.0): exactly `size · n_copies` bytes, the chunks packed.
    GetTensor2d(Vec<u8>),
    /// COMM_INIT (8.0): 1 = joined, 0 = no communicator (the client falls back).
    CommInit {
        /// 1 or 0.
        ok: u8,
    },
    /// LINK_PROBE (ours): the extension version and the RPC port the server serves the
    /// connection on (a link's rank 0 listens on that port + 1000).
    LinkProbe {
        /// [`LINK_VERSION`](crate::LINK_VERSION) of the server.
        version: u32,
        /// The server's own RPC port.
        port: u32,
    },
    /// LINK_OPEN (ours): 1 = the slot's link is open, 0 = no link.
    LinkOpen {
        /// 1 or 0.
        ok: u8,
    },
}

impl Response {
    /// The HELLO reply of a `major` server with the given caps.
    pub fn hello(major: Major, caps: [u8; CONN_CAPS_SIZE]) -> Response {
        let (major, minor, patch) = major.version();
        Response::Hello {
            major,
            minor,
            patch,
            caps,
        }
    }

    /// The command this response answers.
    pub fn command(&self) -> Command {
        match self {
            Response::Hello { .. } => Command::Hello,
            Response::AllocBuffer { .. } => Command::AllocBuffer,
            Response::GetAlignment { .. } => Command::GetAlignment,
            Response::GetMaxSize { .. } => Command::GetMaxSize,
            Response::BufferGetBase { .. } => Command::BufferGetBase,
            Response::SetTensorHash { .. } => Command::SetTensorHash,
            Response::GetTensor(_) => Command::GetTensor,
            Response::CopyTensor { .. } => Command::CopyTensor,
            Response::GetDeviceMemory { .. } => Command::GetDeviceMemory,
            Response::GetAllocSize { .. } => Command::GetAllocSize,
            Response::DeviceCount { .. } => Command::DeviceCount,
            Response::GetTensor2d(_) => Command::GetTensor2d,
            Response::CommInit { .. } => Command::CommInit,
            Response::LinkProbe { .. } => Command::LinkProbe,
            Response::LinkOpen { .. } => Command::LinkOpen,
        }
    }

    /// Payload size of the fixed-size response to `cmd`; `None` for GET_TENSOR and
    /// GET_TENSOR_2D (their size is the requested one) and for commands without a response.
    pub fn fixed_size(cmd: Command) -> Option<u64> {
        match cmd {
            Command::Hello => Some(4 + CONN_CAPS_SIZE as u64),
            Command::AllocBuffer | Command::GetDeviceMemory => Some(16),
            Command::GetAlignment
            | Command::GetMaxSize
            | Command::BufferGetBase
            | Command::GetAllocSize
            | Command::LinkProbe => Some(8),
            Command::SetTensorHash
            | Command::CopyTensor
            | Command::CommInit
            | Command::LinkOpen => Some(1),
            Command::DeviceCount => Some(4),
            Command::GetTensor
            | Command::GetTensor2d
            | Command::FreeBuffer
            | Command::BufferClear
            | Command::SetTensor
            | Command::GraphCompute
            | Command::InitTensor
            | Command::GraphRecompute
            | Command::MemsetTensor
            | Command::SetTensor2d
            | Command::CommAllreduce
            | Command::CommFree
            | Command::LinkSend
            | Command::LinkRecv
            | Command::LinkClose => None,
        }
    }

    /// The only payload size a client may accept for `cmd`: [`Response::fixed_size`],
    /// or `get_tensor_size` (the bytes the request asked for,
    /// [`Request::reply_data_len`](crate::Request::reply_data_len)) for GET_TENSOR and
    /// GET_TENSOR_2D. `None` for commands without a response.
    pub fn expected_size(cmd: Command, get_tensor_size: u64) -> Option<u64> {
        match cmd {
            Command::GetTensor | Command::GetTensor2d => Some(get_tensor_size),
            _ => Self::fixed_size(cmd),
        }
    }

    /// Client side: check a received size prefix *before* reading (and allocating)
    /// the payload, like upstream's `RPC_STATUS_ASSERT` but without aborting.
    pub fn check_size(cmd: Command, got: u64, get_tensor_size: u64) -> Result<(), DecodeError> {
        match Self::expected_size(cmd, get_tensor_size) {
            None => Err(DecodeError::NoResponse(cmd)),
            Some(expected) if got != expected => Err(DecodeError::BadSize { cmd, got, expected }),
            Some(_) => Ok(()),
        }
    }

    /// Client side: decodes the response header (the `u64` size prefix) of the response to `cmd`
    /// and checks it ([`Response::check_size`]) before the payload is read. Returns the payload
    /// size.
    pub fn check_header(
        cmd: Command,
        header: &[u8; RESPONSE_HEADER_SIZE],
        get_tensor_size: u64,
    ) -> Result<u64, DecodeError> {
        let got = u64::from_le_bytes(*header);
        Self::check_size(cmd, got, get_tensor_size)?;
        Ok(got)
    }

    /// The size prefix of a response whose `size`-byte payload is sent from elsewhere (a relay,
    /// a reply read straight out of tensor memory).
    pub fn header(size: u64) -> [u8; RESPONSE_HEADER_SIZE] {
        size.to_le_bytes()
    }

    /// Size of the encoded payload (without the `u64` prefix).
    pub fn payload_len(&self) -> u64 {
        match self {
            Response::GetTensor(data) | Response::GetTensor2d(data) => data.len() as u64,
            other => Self::fixed_size(other.command()).unwrap_or(0),
        }
    }

    /// Server side: append the `u64` LE size prefix and the payload.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let pos = reserve_len(out);
        self.encode_payload(out);
        patch_len(out, pos);
    }

    /// Append the payload only (no size prefix).
    pub fn encode_payload(&self, out: &mut Vec<u8>) {
        match self {
            Response::Hello {
                major,
                minor,
                patch,
                caps,
            } => {
                out.extend_from_slice(&[*major, *minor, *patch, 0]);
                out.extend_from_slice(caps);
            }
            Response::AllocBuffer {
                remote_ptr,
                remote_size,
            } => {
                put_u64(out, *remote_ptr);
                put_u64(out, *remote_size);
            }
            Response::GetAlignment { alignment: v }
            | Response::GetMaxSize { max_size: v }
            | Response::BufferGetBase { base_ptr: v }
            | Response::GetAllocSize { alloc_size: v } => put_u64(out, *v),
            Response::SetTensorHash { result }
            | Response::CopyTensor { result }
            | Response::CommInit { ok: result }
            | Response::LinkOpen { ok: result } => put_u8(out, *result),
            Response::LinkProbe { version, port } => {
                put_u32(out, *version);
                put_u32(out, *port);
            }
            Response::GetTensor(data) | Response::GetTensor2d(data) => out.extend_from_slice(data),
            Response::GetDeviceMemory { free, total } => {
                put_u64(out, *free);
                put_u64(out, *total);
            }
            Response::DeviceCount { count } => put_u32(out, *count),
        }
    }

    /// Client side: decode the response payload to `cmd`.
    ///
    /// Fixed-size responses must have exactly [`Response::fixed_size`] bytes; a
    /// GET_TENSOR payload is taken whole (check its length first with
    /// [`Response::check_size`]). The HELLO padding byte is ignored, as upstream.
    pub fn decode(cmd: Command, payload: &[u8]) -> Result<Response, DecodeError> {
        if !cmd.has_response() {
            return Err(DecodeError::NoResponse(cmd));
        }
        if cmd == Command::GetTensor {
            return Ok(Response::GetTensor(payload.to_vec()));
        }
        if cmd == Command::GetTensor2d {
            return Ok(Response::GetTensor2d(payload.to_vec()));
        }
        Self::check_size(cmd, payload.len() as u64, 0)?;
        let mut r = Reader::new(payload, cmd.name());
        let rsp = match cmd {
            Command::Hello => {
                let [major, minor, patch, _pad] = r.array()?;
                Response::Hello {
                    major,
                    minor,
                    patch,
                    caps: r.array()?,
                }
            }
            Command::AllocBuffer => Response::AllocBuffer {
                remote_ptr: r.u64()?,
                remote_size: r.u64()?,
            },
            Command::GetAlignment => Response::GetAlignment {
                alignment: r.u64()?,
            },
            Command::GetMaxSize => Response::GetMaxSize { max_size: r.u64()? },
            Command::BufferGetBase => Response::BufferGetBase { base_ptr: r.u64()? },
            Command::SetTensorHash => Response::SetTensorHash { result: r.u8()? },
            Command::CopyTensor => Response::CopyTensor { result: r.u8()? },
            Command::GetDeviceMemory => Response::GetDeviceMemory {
                free: r.u64()?,
                total: r.u64()?,
            },
            Command::GetAllocSize => Response::GetAllocSize {
                alloc_size: r.u64()?,
            },
            Command::DeviceCount => Response::DeviceCount { count: r.u32()? },
            Command::CommInit => Response::CommInit { ok: r.u8()? },
            Command::LinkProbe => Response::LinkProbe {
                version: r.u32()?,
                port: r.u32()?,
            },
            Command::LinkOpen => Response::LinkOpen { ok: r.u8()? },
            _ => return Err(DecodeError::NoResponse(cmd)),
        };
        r.finish("trailing bytes after response")?;
        Ok(rsp)
    }
}
