//! `rpc-server`: a drop-in replacement for llama.cpp's `ggml-rpc-server` (protocol 8.0.0, and
//! 7.0.0 on a second listener).
//!
//! Layout: [`connection`] frames bytes and drives a [`session::Session`] per client; the session
//! validates requests and calls the [`ggml`] FFI layer (the only `unsafe` code); [`server`]
//! accepts connections concurrently, admitted by [`admission`] (`--allow`, per-peer shares);
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
pub mod cli;
pub mod comm;
pub mod connection;
pub mod control;
pub mod disk_read;
pub mod doctor;
#[allow(unsafe_code)]
pub mod ggml;
pub mod gguf;
#[cfg(unix)]
pub mod isolate;
pub mod local_weights;
pub mod metrics;
#[cfg(target_os = "linux")]
pub mod namespaces;
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
