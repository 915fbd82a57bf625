//! `link-emu`: the links between a llama.cpp client and its ggml RPC workers, emulated in user
//! space (this kernel has no `netem`), for `rpc-bench` and anything else that wants a slow link
//! on loopback.
//!
//! - [`links`]: the link profiles (2.5 GbE, 10 GbE, Thunderbolt 5 TCP, projected Thunderbolt 5
//!   RDMA) with the published figures they come from, and the analytic projection.
//! - [`relay`]: a TCP relay that paces bytes (one-way delay with a precise timer, bandwidth
//!   limit) and counts the ggml RPC traffic it carries ([`traffic`], over
//!   [`rpc_proto::Scanner`]).
//! - [`check`]: the emulator's self-check against its own configured figures.
//! - [`stats`]: latency samples: percentiles and histograms.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod check;
pub mod links;
pub mod relay;
pub mod stats;
pub mod traffic;
