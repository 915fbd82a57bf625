//! `rpc-bench`: what each link between a llama.cpp client and its ggml RPC workers costs.
//! Three benchmarks: [`latency`] (per-command round trips, with [`echo`]'s floor), [`e2e`] (stock
//! `llama-bench` through a worker, exact round trips and bytes per token) and [`load`] (a stock
//! client's model load, stock against ours). The link emulator is the `link-emu` crate, re-exported under the
//! names the benchmark has always used; the output (markdown, CSV, PNG, progress) is
//! `bench-report`. Each benchmark's module holds its config, which is its command line, its run
//! and its report (`command`); [`cli`] has the flags all share, [`tools`] the processes they
//! drive, [`conn`] the connection (TCP or RDMA) and server targets.

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
