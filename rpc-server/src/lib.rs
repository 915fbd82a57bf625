//! `rpc-server`: a drop-in replacement for llama.cpp's `ggml-rpc-server` (protocol 8.0.0, and
//! 7.0.0 on a second listener).
//!
//! Layout: [`server`] accepts connections concurrently, admitted by [`admission`] (`--allow`,
//! per-peer shares); [`front`] takes each one through its HELLO and either serves it here or
//! hands it to a session process ([`handoff`] in the front, [`child`] in the session process);
//! [`connection`] frames bytes and drives a [`session::Session`] per client; the session
//! validates requests and calls the `ggml` FFI layer (the only `unsafe` code); [`options`] holds
//! every setting, with the command line's defaults;
//! [`cache`] is the SET_TENSOR_HASH weight cache; [`local_weights`] answers SET_TENSOR_HASH from
//! the worker's own GGUF files (`--gguf`, headers read by [`gguf`]); [`comm`] is 8.0's
//! server-to-server link for tensor split's collectives.

// `unsafe` only in the FFI layers (ggml, and `sys_linux` for the OS calls rustix marks unsafe),
// each block with a `// SAFETY:` line.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod admission;
pub mod app;
pub mod cache;
#[cfg(unix)]
pub mod child;
pub mod cidr;
pub mod cli;
pub mod comm;
pub mod connection;
pub mod control;
pub mod disk_read;
pub mod doctor;
#[cfg(unix)]
pub mod front;
#[allow(unsafe_code)]
pub(crate) mod ggml;
/// What of the `ggml` layer is used outside the crate (tests, fuzz targets): the devices, and
/// the two process-wide settings made at start-up.
pub mod backend {
    pub use crate::ggml::{load_backends, use_huge_pages, Device, DeviceKind, GraphError};
}
pub mod gguf;
#[cfg(unix)]
pub mod handoff;
pub mod link;
pub mod local_weights;
pub mod metrics;
#[cfg(target_os = "linux")]
pub mod namespaces;
pub mod options;
pub mod peer_log;
pub mod rdma;
#[cfg(target_os = "linux")]
pub mod sandbox;
pub mod sandbox_mac;
pub mod server;
pub mod session;
pub mod stats;
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod sys_linux;
