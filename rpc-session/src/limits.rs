//! Memory limits for ALLOC_BUFFER and request bodies: per connection and for the whole server.
//!
//! An allocation beyond a limit is answered like a failed allocation (a null handle, spec §5.1),
//! which the stock client handles; nothing is closed. A request body (a GRAPH_COMPUTE's graph)
//! is charged before a byte of it is read, on the size its header claims; one beyond a limit
//! ends the connection.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Configured limits, in bytes. `u64::MAX` = unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Total size of the buffers one connection may hold at once.
    pub per_connection: u64,
    /// Total size of the buffers all connections together may hold at once.
    pub total: u64,
}

impl Default for MemoryLimits {
    /// Unlimited (the binary sets the defaults from the devices' memory, see `cli.rs`).
    fn default() -> Self {
        MemoryLimits {
            per_connection: u64::MAX,
            total: u64::MAX,
        }
    }
}

/// Where a session process asks for memory: the front process, which keeps the server-wide
/// account (rpc-server's `handoff/`).
pub trait Upstream: Send + Sync {
    /// Whether `n` more bytes may be held.
    fn reserve(&self, n: u64) -> bool;
    /// `n` bytes are no longer held.
    fn release(&self, n: u64);
}

/// The server-wide account of allocated buffer memory, shared by all sessions. In a session
/// process it holds that session's account and asks the front for every reservation.
pub struct MemoryBudget {
    limits: MemoryLimits,
    used: AtomicU64,
    refused: AtomicU64,
    upstream: Option<Box<dyn Upstream>>,
}

impl std::fmt::Debug for MemoryBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryBudget")
            .field("limits", &self.limits)
            .field("used", &self.used)
            .field("refused", &self.refused)
            .field("upstream", &self.upstream.is_some())
            .finish()
    }
}

impl MemoryBudget {
    pub fn new(limits: MemoryLimits) -> MemoryBudget {
        MemoryBudget {
            limits,
            used: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            upstream: None,
        }
    }

    /// A session process's budget: `limits` checked here, then every reservation asked of
    /// `upstream` (the front's server-wide account).
    pub fn with_upstream(limits: MemoryLimits, upstream: Box<dyn Upstream>) -> MemoryBudget {
        MemoryBudget {
            upstream: Some(upstream),
            ..MemoryBudget::new(limits)
        }
    }

    pub fn unlimited() -> MemoryBudget {
        MemoryBudget::new(MemoryLimits::default())
    }

    pub fn limits(&self) -> MemoryLimits {
        self.limits
    }

    /// Bytes held by all sessions.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// ALLOC_BUFFERs and request bodies refused because they would have exceeded a limit.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Reserves `n` bytes for a session that already holds `held`; false (and counted) if
    /// either limit would be exceeded.
    /// A refusal by the upstream is counted there, not here (a session process reports its own
    /// refusals to the front, whose count is then the server's).
    pub fn try_reserve(&self, held: u64, n: u64) -> bool {
        if !self.reserve(held, n) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        if let Some(up) = &self.upstream {
            if !up.reserve(n) {
                self.give_back(n);
                return false;
            }
        }
        true
    }

    /// The refusal counter itself (see [`MemoryBudget::refused`]), for reporting.
    pub fn refused_counter(&self) -> &AtomicU64 {
        &self.refused
    }

    fn reserve(&self, held: u64, n: u64) -> bool {
        if held
            .checked_add(n)
            .is_none_or(|x| x > self.limits.per_connection)
        {
            return false;
        }
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(n).filter(|&x| x <= self.limits.total) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Charges `n` bytes (a request body) for a session that holds `held`, until the returned
    /// `Charge` is dropped; `None` (and counted as refused) if either limit would be exceeded.
    pub fn charge(self: &Arc<Self>, held: u64, n: u64) -> Option<Charge> {
        self.try_reserve(held, n).then(|| Charge {
            budget: self.clone(),
            n,
        })
    }

    /// `n` bytes reserved with [`MemoryBudget::try_reserve`] are no longer held.
    pub fn release(&self, n: u64) {
        self.give_back(n);
        if let Some(up) = &self.upstream {
            up.release(n);
        }
    }

    fn give_back(&self, n: u64) {
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let next = cur.saturating_sub(n);
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }
}

/// Bytes charged to a [`MemoryBudget`] for as long as this lives.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<MemoryBudget>,
    n: u64,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.release(self.n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_enforced() {
        let b = MemoryBudget::new(MemoryLimits {
            per_connection: 100,
            total: 150,
        });
        assert!(b.try_reserve(0, 100));
        assert!(!b.try_reserve(100, 1), "per-connection limit");
        assert!(b.try_reserve(0, 50));
        assert!(!b.try_reserve(0, 1), "total limit");
        b.release(100);
        assert_eq!(b.used(), 50);
        assert!(b.try_reserve(0, 100));
        assert!(!b.try_reserve(0, u64::MAX), "no overflow");
        assert_eq!(b.refused(), 3);
    }

    #[test]
    fn a_charge_is_given_back_when_dropped() {
        let b = Arc::new(MemoryBudget::new(MemoryLimits {
            per_connection: 100,
            total: 150,
        }));
        let c = b.charge(60, 40).expect("within both limits");
        assert_eq!(b.used(), 40);
        assert!(b.charge(60, 41).is_none(), "per connection: 60 held + 41");
        assert!(b.charge(0, 111).is_none(), "total: 40 charged + 111");
        drop(c);
        assert_eq!(b.used(), 0);
        assert_eq!(b.refused(), 2);
    }
}
