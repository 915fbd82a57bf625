//! Async client (tokio) for the ggml RPC protocol, **8.0.0** and **7.0.0** (whichever the server
//! announces in HELLO), the protocol of llama.cpp's `ggml-rpc-server` and of this workspace's
//! `rpc-server`.
//!
//! [`Client`] has one method per command over any `rpc_transport::Transport` and shares the wire
//! codec with the server (`rpc-proto`): over TCP with [`Client::connect`], or over whatever
//! [`negotiate_client`] negotiated in HELLO (RDMA in upstream's flavors or our lean framing, TCP
//! otherwise). [`TensorBuilder`] (`rpc_proto`'s, re-exported) makes [`RpcTensor`]s by hand
//! (tests, benchmarks).
//!
//! ```no_run
//! use rpc_client::{ops, Client, TensorBuilder, TENSOR_FLAG_COMPUTE};
//!
//! # async fn demo() -> Result<(), rpc_client::ClientError> {
//! let mut c = Client::connect("127.0.0.1:50052").await?;
//! let buf = c.alloc_buffer(0, 3 * 16).await?.expect("allocation failed");
//! let base = c.buffer_get_base(buf.handle).await?;
//! let t = |id, off| TensorBuilder::f32(id).ne(&[4]).data(buf.handle, base + off);
//! let (a, b) = (t(1, 0).build(), t(2, 16).build());
//! let sum = t(3, 32).op(ops::ADD, &[]).srcs(&[1, 2]).flags(TENSOR_FLAG_COMPUTE).build();
//! let bytes = |v: [f32; 4]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
//! c.set_tensor(&a, 0, &bytes([1.0, 2.0, 3.0, 4.0]), false).await?;
//! c.set_tensor(&b, 0, &bytes([10.0, 20.0, 30.0, 40.0]), false).await?;
//! c.graph_compute(0, &[3], &[a, b, sum]).await?;
//! let out = c.get_tensor(&sum, 0, 16).await?;
//! # let _ = out;
//! # Ok(())
//! # }
//! ```
//!
//! Errors: the protocol has no error replies, a server refuses a request by closing the
//! connection, seen as [`ClientError::Closed`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod client;
mod error;
mod negotiate;

pub use client::{Client, DeviceMemory, RemoteBuffer, Result, LAST_GRAPH_UID};
pub use error::ClientError;
pub use negotiate::{negotiate_client, Negotiated};

pub use rpc_proto::{
    contiguous_nb, fnv1a64, nbytes, type_traits, CommInit, Command, Major, Region2d, RpcTensor,
    TensorBuilder, TENSOR_FLAG_COMPUTE, TENSOR_FLAG_INPUT, TENSOR_FLAG_LOSS, TENSOR_FLAG_OUTPUT,
    TENSOR_FLAG_PARAM,
};

/// `ggml_type` numbers, defined once in [`rpc_proto::ggml_type`]; any `u32` can still be put in
/// a tensor with [`TensorBuilder::new`]. [`type_traits`] knows the sizes of a few.
pub mod types {
    pub use rpc_proto::ggml_type::*;
}

/// `ggml_op` numbers, defined once in [`rpc_proto::ggml_op`].
pub mod ops {
    pub use rpc_proto::ggml_op::*;
}
