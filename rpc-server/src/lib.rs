//! `rpc-server`: a drop-in replacement for llama.cpp's `ggml-rpc-server` (protocol 8.0.0, and
//! 7.0.0 on a second listener).
//!
//! Layout: [`server`] accepts connections concurrently, admitted by [`admission`] (`--allow`,
//! per-peer shares); [`front`] takes each one through its HELLO and either serves it here or
//! hands it to a session process ([`handoff`] in the front, [`child`] in the session process);
//! [`connection`] frames bytes and drives a [`session::Session`] per client; the session
//! validates requests and calls ggml through the `rpc-ggml` crate (the FFI layer); [`options`] holds
//! every setting, with the command line's defaults;
//! the `rpc-weights` crate answers SET_TENSOR_HASH from disk (the weight cache, the worker's own
//! GGUF files of `--gguf`); [`comm`] is 8.0's server-to-server link for tensor split's
//! collectives.

// No `unsafe` here but in the two OS FFI modules (`sys_linux`: the OS calls rustix marks unsafe;
// `seatbelt`: macOS's sandbox_init), each block with a `// SAFETY:` line; ggml's FFI is the
// `rpc-ggml` crate.
#![deny(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod admission;
pub mod app;
#[cfg(unix)]
pub mod child;
pub mod cidr;
pub mod cli;
pub mod comm;
pub mod connection;
pub mod control;
pub mod doctor;
#[cfg(unix)]
pub mod front;
#[cfg(unix)]
pub mod handoff;
pub mod link;
pub mod metrics;
#[cfg(target_os = "linux")]
pub mod namespaces;
pub mod options;
pub mod peer_log;
pub mod rdma;
#[cfg(target_os = "linux")]
pub mod sandbox;
pub mod sandbox_mac;
#[cfg(target_os = "macos")]
#[allow(unsafe_code)]
mod seatbelt;
pub mod server;
pub mod session;
pub mod stats;
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod sys_linux;
