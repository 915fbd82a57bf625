//! `rpc-bench`: what each link between a llama.cpp client and its ggml RPC workers costs.
//!
//! - [`latency`]: per-command round-trip latency (p50, p99, histogram) for the sizes that matter
//!   per token, over TCP or RDMA, against any protocol 7.0.0 server (ours or stock).
//! - [`e2e`]: tokens/s and per-token latency of stock `llama-bench` through a worker, with the
//!   exact network round trips and bytes per token counted by a protocol-aware relay.
//! - [`relay`]: that relay, which also emulates a link in user space (one-way delay with a
//!   precise timer and a bandwidth limit), since the kernel here has no `netem`; [`emucheck`]
//!   validates it against its own configured figures.
//! - [`links`]: the link profiles (2.5 GbE, 10 GbE, Thunderbolt 5 TCP, projected Thunderbolt 5
//!   RDMA) with the published figures they come from, and the analytic projection.
//! - [`echo`]: the floor of a round trip, a do-nothing server measured beside the real ones.
//! - [`report`] and [`chart`]: markdown, CSV and PNG output.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod chart;
pub mod conn;
pub mod e2e;
pub mod echo;
pub mod emucheck;
pub mod latency;
pub mod links;
pub mod relay;
pub mod report;
pub mod stats;
pub mod traffic;
