//! `rpc-server`: a drop-in replacement for llama.cpp's `ggml-rpc-server` (protocol 8.0.0, and
//! 7.0.0 on a second listener).
//!
//! Layout: [`server`] accepts connections concurrently, admitted by [`admission`] (`--allow`,
//! per-peer shares); [`front`] takes each one through its HELLO and either serves it here or
//! hands it to a session process ([`handoff`] in the front, [`child`] in the session process);
//! [`connection`] frames bytes and drives an [`rpc_session::Session`] per client (the
//! `rpc-session` crate, sans-IO); the session validates requests and calls ggml through the
//! `rpc-ggml` crate (the FFI layer); [`options`] holds
//! every setting, with the command line's defaults;
//! the `rpc-weights` crate answers SET_TENSOR_HASH from disk (the weight cache, the worker's own
//! GGUF files of `--gguf`); [`comm`] is 8.0's server-to-server link for tensor split's
//! collectives; the `rpc-contain` crate holds containment, what a session process does to
//! itself before it serves (Linux namespaces, seccomp, Landlock; the macOS Seatbelt profile).

// No `unsafe` at all: ggml's FFI is the `rpc-ggml` crate, the OS calls of containment that need
// it (`unshare`, `fork`, macOS's `sandbox_init`) are the `rpc-contain` crate's.
#![forbid(unsafe_code)]

pub mod admission;
pub mod app;
pub mod banner;
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
pub mod options;
pub mod peer_log;
pub mod rdma;
pub mod server;
pub mod session_config;
pub mod stats;
