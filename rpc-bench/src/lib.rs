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
//! - [`tools`]: the processes they drive (stock tools run to their end with their logs, servers
//!   killed on drop); [`conn`]: the benchmark's connection (TCP or RDMA) and server targets.
//! - the output (markdown, CSV, PNG charts, progress) is the `bench-report` crate.
//!
//! Each benchmark's module holds its config, which is its command line (`LatencyConfig`,
//! `E2eConfig`, `LoadConfig` derive clap `Args`; [`cli::Common`] has the flags all share), its
//! run (`run`), and its report (`command`: runs, then prose, tables and chart); the binary
//! dispatches (and reports `link-emu`'s own `emulator-check` and `links`).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cli;
pub mod conn;
pub mod e2e;
pub mod echo;
pub mod latency;
pub mod load;
pub mod tools;

pub use link_emu::{links, relay, stats, traffic};

/// Where a row's numbers come from (the `numbers` column of every table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// Measured with the client straight to the server (`latency`).
    Measured,
    /// Measured with the client straight to the server over a real link (`e2e --direct`).
    MeasuredDirect,
    /// Measured through the counting relay without delay.
    MeasuredRelay,
    /// Measured through the user-space link emulator.
    MeasuredEmulated,
    /// Computed from the measured base and the link's published figures.
    Projected,
}

impl Origin {
    /// Label for tables.
    pub fn label(self) -> &'static str {
        match self {
            Origin::Measured => "measured",
            Origin::MeasuredDirect => "measured (direct, real link)",
            Origin::MeasuredRelay => "measured (relay, no delay)",
            Origin::MeasuredEmulated => "measured (emulated link)",
            Origin::Projected => "projected",
        }
    }
}
