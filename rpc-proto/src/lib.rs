//! Sans-IO codec for the ggml RPC protocol, **8.0.0** (llama.cpp since October 2026) and
//! **7.0.0** (before), as `ggml-rpc-server` speaks them. A connection speaks one [`Major`]:
//! every decoder that depends on it takes it.
//!
//! This crate only turns bytes into typed messages and back; it performs no I/O.
//! It is shared by the server, the client library and the tests.
//!
//! # Wire format (spec §3)
//!
//! ```text
//! request  : | cmd: u8 | req_size: u64 LE | req_data[req_size] |
//! response : | rsp_size: u64 LE | rsp_data[rsp_size] |   (only for commands with a response)
//! ```
//!
//! Everything is packed (no padding) and little-endian.
//!
//! # Typical server loop
//!
//! 1. read [`FRAME_HEADER_SIZE`] bytes, [`FrameHeader::decode`] them;
//! 2. [`check_frame`] validates the command and the payload size against [`Limits`]
//!    *before* anything is allocated;
//! 3. read the payload (or, for `SET_TENSOR`, only the [`SET_TENSOR_HEADER_SIZE`]-byte
//!    [`SetTensorHeader`] and stream the rest);
//! 4. [`Request::decode`] it, handle it, and if [`Command::has_response`] write a
//!    [`Response`] with [`Response::encode`].
//!
//! ```
//! use rpc_proto::*;
//!
//! // Client side: a DEVICE_COUNT request frame.
//! let mut wire = Vec::new();
//! Request::DeviceCount.encode(&mut wire);
//!
//! // Server side: header first, then the payload it announces.
//! let (head, payload) = wire.split_first_chunk::<FRAME_HEADER_SIZE>().unwrap();
//! let header = FrameHeader::decode(head);
//! let cmd = check_frame(Major::V8, &header, &Limits::default())?;
//! let req = Request::decode(Major::V8, cmd, payload, &Limits::default())?;
//! assert_eq!(req, Request::DeviceCount);
//!
//! let mut reply = Vec::new();
//! if cmd.has_response() {
//!     Response::DeviceCount { count: 1 }.encode(&mut reply);
//! }
//! assert_eq!(reply, [4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
//! # Ok::<(), DecodeError>(())
//! ```
//!
//! # Robustness
//!
//! No decoder in this crate panics, whatever the input, and no decoder allocates
//! based on a length field before that field was checked against a limit.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod builder;
mod command;
mod consts;
mod error;
mod fnv;
mod frame;
mod ggml_ids;
mod graph;
mod request;
mod response;
mod scan;
mod tensor;
mod wire;

pub use builder::{contiguous_nb, nbytes, type_traits, TensorBuilder};
pub use command::{Command, Major, PayloadSize, Target};
pub use consts::*;
pub use error::DecodeError;
pub use fnv::{fnv1a64, Fnv1a};
pub use frame::{
    check_frame, check_payload_size, encode_raw, graph_payload_size, FrameHeader, Limits, Parts,
};
pub use ggml_ids::{ggml_op, ggml_type};
pub use graph::{
    encode_graph, graph_device_with_uid, graph_frame_with_uid, graph_header_with_uid, Graph,
    GRAPH_DEVICE_SIZE,
};
pub use request::{CommInit, DataHead, Region2d, Request, SetTensorHeader};
pub use response::Response;
pub use scan::{complete_request, Scanned, Scanner};
pub use tensor::{
    RpcTensor, TENSOR_FLAG_COMPUTE, TENSOR_FLAG_INPUT, TENSOR_FLAG_LOSS, TENSOR_FLAG_OUTPUT,
    TENSOR_FLAG_PARAM,
};

/// Little-endian, unaligned integer types used in [`RpcTensor`] and [`Graph`]
/// (re-exported from `zerocopy`). Use `.get()` to read and `::new(v)` to build.
pub use zerocopy::byteorder::little_endian::{I32, U32, U64};
