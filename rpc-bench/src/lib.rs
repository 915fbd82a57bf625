//! `rpc-bench`: what each link between a llama.cpp client and its ggml RPC workers costs.
//!
//! - [`latency`]: per-command round-trip latency (p50, p99, histogram) for the sizes that matter
//!   per token, over TCP or RDMA, against any protocol 7.0.0 server (ours or stock).
//! - [`e2e`]: tokens/s and per-token latency of stock `llama-bench` through a worker, with the
//!   exact network round trips and bytes per token counted by a protocol-aware relay.
//! - the link emulator is the `link-emu` crate: [`relay`] (the counting relay that also paces
//!   bytes like a link), [`links`] (the profiles and the projection), [`traffic`], [`stats`] and
//!   its self-check; re-exported here under the names the benchmark has always used.
//! - [`load`]: a stock client's model load onto a worker (stock and ours, cold, warm, `--gguf`)
//!   over plain loopback and emulated links.
//! - [`echo`]: the floor of a round trip, a do-nothing server measured beside the real ones.
//! - [`report`] and [`chart`]: markdown, CSV and PNG output.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod chart;
pub mod conn;
pub mod e2e;
pub mod echo;
pub mod latency;
pub mod load;
pub mod report;

pub use link_emu::{links, relay, stats, traffic};
