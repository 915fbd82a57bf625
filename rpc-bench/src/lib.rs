//! `rpc-bench`: what each link between a llama.cpp client and its ggml RPC workers costs. Four
//! benchmarks, [`latency`], [`e2e`], [`load`] and [`allreduce`] (the link between two servers of
//! a tensor split) (layout: ARCHITECTURE.md; use: docs/rpc-bench.md), and [`relay_cmd`], the
//! emulating relay as a process of its own.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod allreduce;
pub mod cli;
pub mod conn;
pub mod e2e;
pub mod echo;
pub mod latency;
pub mod load;
pub mod relay_cmd;
pub mod tools;

pub use link_emu::{links, relay, stats, traffic};

/// Where a row's numbers come from (the `numbers` column of every table, [`Origin::label`]);
/// `Projected`: computed from the measured base and the link's published figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Origin {
    Measured,
    MeasuredDirect,
    MeasuredRelay,
    MeasuredEmulated,
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
