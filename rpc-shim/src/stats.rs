//! Counters of one worker's traffic through the shim (logs, tests).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What the shim did for one worker.
#[derive(Debug, Default)]
pub struct ShimStats {
    /// Client (downstream) connections accepted.
    pub client_connections: AtomicU64,
    /// Control connections opened to the worker.
    pub control_connections: AtomicU64,
    /// Per-client upstream connections opened to the worker.
    pub session_connections: AtomicU64,
    /// ... of which run over RDMA.
    pub rdma_sessions: AtomicU64,
    /// Queries answered from the cache.
    pub cache_hits: AtomicU64,
    /// Cacheable queries that had to be forwarded.
    pub cache_misses: AtomicU64,
    /// Queries sent over the control connection (prefetch included).
    pub control_queries: AtomicU64,
    /// Request frames forwarded over per-client upstream connections.
    pub frames_forwarded: AtomicU64,
    /// Responses relayed from per-client upstream connections.
    pub responses_relayed: AtomicU64,
}

/// A plain copy of [`ShimStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// See [`ShimStats::client_connections`].
    pub client_connections: u64,
    /// See [`ShimStats::control_connections`].
    pub control_connections: u64,
    /// See [`ShimStats::session_connections`].
    pub session_connections: u64,
    /// See [`ShimStats::rdma_sessions`].
    pub rdma_sessions: u64,
    /// See [`ShimStats::cache_hits`].
    pub cache_hits: u64,
    /// See [`ShimStats::cache_misses`].
    pub cache_misses: u64,
    /// See [`ShimStats::control_queries`].
    pub control_queries: u64,
    /// See [`ShimStats::frames_forwarded`].
    pub frames_forwarded: u64,
    /// See [`ShimStats::responses_relayed`].
    pub responses_relayed: u64,
}

impl ShimStats {
    /// Adds one to a counter.
    pub(crate) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }

    /// The current values.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            client_connections: self.client_connections.load(Relaxed),
            control_connections: self.control_connections.load(Relaxed),
            session_connections: self.session_connections.load(Relaxed),
            rdma_sessions: self.rdma_sessions.load(Relaxed),
            cache_hits: self.cache_hits.load(Relaxed),
            cache_misses: self.cache_misses.load(Relaxed),
            control_queries: self.control_queries.load(Relaxed),
            frames_forwarded: self.frames_forwarded.load(Relaxed),
            responses_relayed: self.responses_relayed.load(Relaxed),
        }
    }
}
