//! Server-wide counters: connections, commands and bytes by command and by transport, graph
//! compute and per-token times. Read by the logs, the benchmarks and `--metrics` (`metrics.rs`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rpc_proto::Command;

use rpc_session::MemoryBudget;

/// Transports as [`rpc_transport::Transport::name`] names them; traffic on any other name is
/// counted under `other`.
pub const TRANSPORTS: [&str; 5] = ["TCP", "RDMA/RC", "RDMA/UC", "RDMA/RC+lean", "RDMA/UC+lean"];

fn transport_index(name: &str) -> usize {
    TRANSPORTS
        .iter()
        .position(|t| *t == name)
        .unwrap_or(TRANSPORTS.len())
}

/// Upper bounds (seconds) of the histogram buckets: 100 us to 2.5 s.
pub const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// A latency histogram (Prometheus layout: cumulative buckets when read, plus sum and count).
#[derive(Default)]
pub struct Histogram {
    /// Per-bucket (not cumulative) counts; the last one is `+Inf`.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_ns: AtomicU64,
    count: AtomicU64,
}

/// A point-in-time copy of a [`Histogram`].
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// `(upper bound in seconds, cumulative count)`, the last bound `f64::INFINITY`.
    pub buckets: Vec<(f64, u64)>,
    pub sum_seconds: f64,
    pub count: u64,
}

impl Histogram {
    /// Every counter of the histogram, in a fixed order (see [`Stats::counters`]).
    fn counters(&self) -> impl Iterator<Item = &AtomicU64> {
        self.buckets.iter().chain([&self.sum_ns, &self.count])
    }

    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BUCKETS
            .iter()
            .position(|&b| s <= b)
            .unwrap_or(BUCKETS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_ns
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
        self.count.fetch_add(1, Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut acc = 0;
        let buckets = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| {
                acc += b.load(Relaxed);
                (BUCKETS.get(i).copied().unwrap_or(f64::INFINITY), acc)
            })
            .collect();
        HistogramSnapshot {
            buckets,
            sum_seconds: self.sum_ns.load(Relaxed) as f64 / 1e9,
            count: self.count.load(Relaxed),
        }
    }
}

const NCMD: usize = Command::EVERY.len();

#[derive(Default)]
pub struct Stats {
    /// Connections accepted since start.
    pub connections: AtomicU64,
    /// Connections open now.
    pub active: AtomicU64,
    /// Connections that ended with an error (malformed or refused request, I/O error, deadline).
    pub closed_with_error: AtomicU64,
    /// Connections that held nothing, closed to give their slot to a new client when every slot
    /// was taken (`admission::Slots`).
    pub evicted: AtomicU64,
    /// Session processes the front killed for what they asked on their control line (a
    /// malformed or out-of-order message, a flood, a link outside the policy).
    pub sessions_killed: AtomicU64,
    /// Connections closed unread, by [`Refusal`].
    refused: [AtomicU64; Refusal::ALL.len()],
    commands: [AtomicU64; NCMD],
    bytes_in: [AtomicU64; NCMD],
    bytes_out: [AtomicU64; NCMD],
    transport_in: [AtomicU64; TRANSPORTS.len() + 1],
    transport_out: [AtomicU64; TRANSPORTS.len() + 1],
    /// Wall time of each GRAPH_COMPUTE and GRAPH_RECOMPUTE (validation, graph build, compute).
    pub compute: Histogram,
    /// Per token, server side: from a GRAPH_RECOMPUTE's header to the end of the GET_TENSOR
    /// reply that follows it.
    pub token: Histogram,
    /// The part of [`Stats::token`] that is not the recompute itself: reading the requests,
    /// copying the result out, writing the reply.
    pub token_non_compute: Histogram,
    /// Wall time of each COMM_ALLREDUCE: reading the partial, the exchange with the peer (which
    /// includes waiting for it to reach the same point), the sum, writing it back.
    pub allreduce: Histogram,
    /// 8.0 collectives: bytes sent and received on the server-to-server links.
    pub comm_sent: AtomicU64,
    pub comm_received: AtomicU64,
    /// The memory budget of the server these counters belong to (set when it starts serving).
    budget: OnceLock<Arc<MemoryBudget>>,
}

/// Why a connection was closed before it was served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its address is in no `--allow` block.
    NotAllowed,
    /// Its peer already had its share of the connection slots.
    PeerShare,
    /// No complete HELLO within the HELLO deadline.
    NoHello,
}

impl Refusal {
    pub const ALL: [Refusal; 3] = [Refusal::NotAllowed, Refusal::PeerShare, Refusal::NoHello];

    /// The label value in `--metrics`.
    pub fn name(self) -> &'static str {
        match self {
            Refusal::NotAllowed => "not_allowed",
            Refusal::PeerShare => "peer_share",
            Refusal::NoHello => "no_hello",
        }
    }
}

/// What [`Stats::snapshot`] returns per command.
pub type CommandCounts = (Command, u64, u64, u64);

impl Stats {
    /// Records the server's memory budget (first call wins).
    pub fn set_budget(&self, b: Arc<MemoryBudget>) {
        let _ = self.budget.set(b);
    }

    /// The server's memory budget, once it serves.
    pub fn budget(&self) -> Option<&Arc<MemoryBudget>> {
        self.budget.get()
    }

    /// Every additive counter of a session's traffic, in a fixed order: commands and bytes per
    /// command and transport, and the histograms (not the connection counts, which the process
    /// that accepts connections keeps). A session process reports these to the front
    /// (`child/`), which the front adds to its own (`handoff/`).
    pub fn counters(&self) -> impl Iterator<Item = &AtomicU64> {
        self.commands
            .iter()
            .chain(&self.bytes_in)
            .chain(&self.bytes_out)
            .chain(&self.transport_in)
            .chain(&self.transport_out)
            .chain(self.compute.counters())
            .chain(self.token.counters())
            .chain(self.token_non_compute.counters())
            .chain(self.allreduce.counters())
            .chain([&self.comm_sent, &self.comm_received])
    }

    /// Counts a connection closed before it was served.
    pub fn refuse(&self, why: Refusal) {
        self.refused[why as usize].fetch_add(1, Relaxed);
    }

    /// Connections closed unread for `why` since start.
    pub fn refused(&self, why: Refusal) -> u64 {
        self.refused[why as usize].load(Relaxed)
    }

    /// Counts one command on `transport` with its request payload size and reply size (prefix
    /// included).
    pub fn command(&self, transport: &str, cmd: Command, req: u64, rsp: u64) {
        let i = cmd.index();
        let wire_in = req.saturating_add(rpc_proto::FRAME_HEADER_SIZE as u64);
        self.commands[i].fetch_add(1, Relaxed);
        self.bytes_in[i].fetch_add(wire_in, Relaxed);
        self.bytes_out[i].fetch_add(rsp, Relaxed);
        let t = transport_index(transport);
        self.transport_in[t].fetch_add(wire_in, Relaxed);
        self.transport_out[t].fetch_add(rsp, Relaxed);
    }

    /// One generated token's server-side time and the recompute's share of it.
    pub fn token(&self, total: Duration, compute: Duration) {
        self.token.observe(total);
        self.token_non_compute
            .observe(total.saturating_sub(compute));
    }

    /// `(command, count, bytes in, bytes out)` for every command seen at least once.
    pub fn snapshot(&self) -> Vec<CommandCounts> {
        Command::EVERY
            .iter()
            .map(|&c| {
                let i = c.index();
                (
                    c,
                    self.commands[i].load(Relaxed),
                    self.bytes_in[i].load(Relaxed),
                    self.bytes_out[i].load(Relaxed),
                )
            })
            .filter(|x| x.1 > 0)
            .collect()
    }

    /// `(transport, bytes in, bytes out)` for every transport that carried a command.
    pub fn transports(&self) -> Vec<(&'static str, u64, u64)> {
        TRANSPORTS
            .iter()
            .copied()
            .chain(["other"])
            .enumerate()
            .map(|(i, t)| {
                (
                    t,
                    self.transport_in[i].load(Relaxed),
                    self.transport_out[i].load(Relaxed),
                )
            })
            .filter(|x| x.1 > 0 || x.2 > 0)
            .collect()
    }
}

/// Every counter a session process reports, in one order for both processes (`budget`: the
/// front's server-wide account, or the session's own, whose refusals are the ones the front did
/// not see).
pub fn reported_counters<'a>(
    stats: &'a Stats,
    rdma: &'a crate::rdma::RdmaConfig,
    config: &'a rpc_session::SessionConfig,
    budget: &'a rpc_session::MemoryBudget,
) -> Vec<&'a AtomicU64> {
    let mut v: Vec<&AtomicU64> = stats.counters().chain(rdma.counters()).collect();
    v.push(budget.refused_counter());
    if let Some(c) = &config.cache {
        v.extend(c.counters().counters());
    }
    if let Some(l) = &config.local {
        v.extend(l.counters().counters());
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_with_sum_and_count() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(50)); // first bucket
        h.observe(Duration::from_micros(100)); // exactly its bound: still the first
        h.observe(Duration::from_millis(3)); // 5 ms bucket
        h.observe(Duration::from_secs(10)); // +Inf
        let s = h.snapshot();
        assert_eq!(s.count, 4);
        assert!((s.sum_seconds - 10.00315).abs() < 1e-9, "{}", s.sum_seconds);
        assert_eq!(s.buckets[0], (0.0001, 2));
        let five_ms = s.buckets.iter().find(|b| b.0 == 0.005).unwrap();
        assert_eq!(five_ms.1, 3);
        assert_eq!(s.buckets.last().unwrap(), &(f64::INFINITY, 4));
    }

    #[test]
    fn traffic_is_counted_per_command_and_per_transport() {
        let s = Stats::default();
        s.command("TCP", Command::GetTensor, 312, 8 + 4096);
        s.command("RDMA/UC+lean", Command::SetTensor, 1000, 0);
        s.command("QUIC", Command::DeviceCount, 0, 12);
        assert_eq!(
            s.transports(),
            vec![
                ("TCP", 321, 4104),
                ("RDMA/UC+lean", 1009, 0),
                ("other", 9, 12)
            ]
        );
        let get = s
            .snapshot()
            .into_iter()
            .find(|c| c.0 == Command::GetTensor)
            .unwrap();
        assert_eq!(get, (Command::GetTensor, 1, 321, 4104));
    }
}
