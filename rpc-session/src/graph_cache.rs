//! The graphs a connection keeps for GRAPH_RECOMPUTE, per device, with each major's rules.
//!
//! - 7.0.0: one graph per device, the last GRAPH_COMPUTE's; FREE_BUFFER drops the graphs that
//!   point into the freed buffer (upstream #25703).
//! - 8.0.0 (delta §B.1): a map uid → graph. uid 0 is never stored; a GRAPH_COMPUTE of a uid when
//!   [`GRAPH_CACHE_MAX`] entries are stored clears them all first (the stock client mirrors this
//!   rule to know which uids it may still recompute, so keeping fewer would make it abort);
//!   FREE_BUFFER of any buffer drops every graph of every device, the entries staying (they
//!   still count toward the 1024), so a later GRAPH_RECOMPUTE of any of them is a miss.
//!
//! Generic over the stored value so that the rules are tested without ggml. Every stored value
//! has a size in bytes, charged by the session to its memory budget; the cache reports what it
//! frees.

use std::collections::HashMap;

use rpc_proto::GRAPH_CACHE_MAX;

/// Where a graph is kept: 7.0's one slot per device, or an 8.0 uid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Slot {
    /// 7.0.0: the device's last graph.
    Last,
    /// 8.0.0: the client's uid (never 0 here).
    Uid(u64),
}

impl Slot {
    /// The slot a GRAPH_COMPUTE or GRAPH_RECOMPUTE names: `None` (7.0) is the last graph; 8.0's
    /// uid 0 names no slot (run, never stored).
    pub(crate) fn of(uid: Option<u64>) -> Option<Slot> {
        match uid {
            None => Some(Slot::Last),
            Some(0) => None,
            Some(u) => Some(Slot::Uid(u)),
        }
    }
}

struct Entry<G> {
    /// `None` once a FREE_BUFFER dropped it (8.0: the entry still counts).
    graph: Option<G>,
    bytes: u64,
}

/// One device's stored graphs.
pub(crate) struct GraphCache<G> {
    entries: HashMap<Slot, Entry<G>>,
}

impl<G> Default for GraphCache<G> {
    fn default() -> Self {
        GraphCache {
            entries: HashMap::new(),
        }
    }
}

impl<G> GraphCache<G> {
    /// What storing a graph in `slot` would free first: the old graph of that slot, or, for a
    /// new 8.0 uid at [`GRAPH_CACHE_MAX`] entries, every entry (the stock clear-all rule).
    /// Returns the bytes freed; call before charging the new graph.
    pub(crate) fn make_room(&mut self, slot: Slot) -> u64 {
        let clear_all = match slot {
            Slot::Last => true,
            // Stock: the count is checked before the uid is looked up.
            Slot::Uid(_) => self.entries.len() >= GRAPH_CACHE_MAX,
        };
        if clear_all {
            return self.entries.drain().map(|(_, e)| live_bytes(&e)).sum();
        }
        self.entries.remove(&slot).map_or(0, |e| live_bytes(&e))
    }

    /// Stores `graph` (`bytes` charged) in `slot`, after [`GraphCache::make_room`].
    pub(crate) fn insert(&mut self, slot: Slot, graph: G, bytes: u64) {
        self.entries.insert(
            slot,
            Entry {
                graph: Some(graph),
                bytes,
            },
        );
    }

    /// The graph stored in `slot`, if it is still there.
    pub(crate) fn get_mut(&mut self, slot: Slot) -> Option<&mut G> {
        self.entries.get_mut(&slot)?.graph.as_mut()
    }

    /// Drops the graphs `doomed` says so of; their entries stay (8.0 counts them). Returns the
    /// bytes freed.
    pub(crate) fn drop_graphs(&mut self, mut doomed: impl FnMut(&G) -> bool) -> u64 {
        let mut freed = 0;
        for e in self.entries.values_mut() {
            if e.graph.as_ref().is_some_and(&mut doomed) {
                e.graph = None;
                freed += e.bytes;
            }
        }
        freed
    }

    /// Whether any graph is stored.
    pub(crate) fn holds_any(&self) -> bool {
        self.entries.values().any(|e| e.graph.is_some())
    }

    /// Entries, dropped graphs included (what the 1024 rule counts).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

fn live_bytes<G>(e: &Entry<G>) -> u64 {
    if e.graph.is_some() {
        e.bytes
    } else {
        0
    }
}

/// The session's side of the cache: GRAPH_COMPUTE keeps what it built, GRAPH_RECOMPUTE finds it.
impl super::Session {
    /// GRAPH_COMPUTE: builds and runs the graph (`graph.rs`), then keeps it in the slot its uid
    /// names (7.0: the device's last graph; 8.0's uid 0: not kept), charged to the budget.
    pub(super) fn compute_and_keep(
        &mut self,
        g: &rpc_proto::Graph<'_>,
    ) -> Result<(), super::SessionError> {
        self.device(g.device)?;
        let d = g.device as usize;
        let slot = Slot::of(g.uid);
        // The slot's old graph (or, at 1024, every graph) goes before the new one is built,
        // even if that fails.
        if let Some(slot) = slot {
            let freed = self.graphs[d].make_room(slot);
            self.release(freed);
        }
        let stored = self.graph_compute(g)?;
        if let Some(slot) = slot {
            let bytes = stored.footprint();
            if !self.budget.try_reserve(self.held, bytes) {
                return Err(super::SessionError::OutOfMemory(
                    "stored graphs over the memory limit (--max-alloc-per-connection)",
                ));
            }
            self.held += bytes;
            self.graphs[d].insert(slot, stored, bytes);
        }
        Ok(())
    }

    /// GRAPH_RECOMPUTE: runs the graph kept in the slot `uid` names. A stock client recomputes
    /// only what it stored; a miss closes the connection (as stock).
    pub(super) fn recompute(
        &mut self,
        device: u32,
        uid: Option<u64>,
    ) -> Result<(), super::SessionError> {
        self.device(device)?;
        let d = device as usize;
        let missing = || match uid {
            None => super::SessionError::NoStoredGraph(device),
            Some(uid) => super::SessionError::GraphNotFound { device, uid },
        };
        let slot = Slot::of(uid).ok_or_else(missing)?;
        let super::Session {
            graphs, backends, ..
        } = self;
        let graph = graphs[d].get_mut(slot).ok_or_else(missing)?;
        let backend = backends[d].as_mut().ok_or_else(missing)?;
        super::graph::run_graph(backend, graph)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    /// Stores like the session does: room first, then the graph.
    fn store(c: &mut GraphCache<u64>, uid: Option<u64>, bytes: u64) -> u64 {
        let Some(slot) = Slot::of(uid) else { return 0 };
        let freed = c.make_room(slot);
        c.insert(slot, uid.unwrap_or(0), bytes);
        freed
    }

    #[test]
    fn v7_keeps_the_last_graph_only() {
        let mut c = GraphCache::default();
        assert_eq!(store(&mut c, None, 10), 0);
        assert_eq!(store(&mut c, None, 20), 10);
        assert_eq!(c.len(), 1);
        assert!(c.get_mut(Slot::Last).is_some());
    }

    #[test]
    fn uid_zero_is_never_stored() {
        let mut c: GraphCache<u64> = GraphCache::default();
        assert_eq!(Slot::of(Some(0)), None);
        store(&mut c, Some(0), 10);
        assert_eq!(c.len(), 0);
        assert!(!c.holds_any());
    }

    #[test]
    fn the_1025th_uid_clears_all_at_once() {
        let mut c = GraphCache::default();
        for uid in 1..=GRAPH_CACHE_MAX as u64 {
            assert_eq!(store(&mut c, Some(uid), 1), 0);
        }
        assert_eq!(c.len(), GRAPH_CACHE_MAX);
        assert!(c.get_mut(Slot::Uid(7)).is_some());
        // Recomputing an existing uid at the limit also clears (stock counts first).
        assert_eq!(store(&mut c, Some(7), 1), GRAPH_CACHE_MAX as u64);
        assert_eq!(c.len(), 1);
        assert!(c.get_mut(Slot::Uid(8)).is_none());
        assert!(c.get_mut(Slot::Uid(7)).is_some());
    }

    #[test]
    fn free_buffer_drops_graphs_but_entries_still_count() {
        let mut c = GraphCache::default();
        for uid in 1..=3 {
            store(&mut c, Some(uid), 5);
        }
        assert_eq!(c.drop_graphs(|_| true), 15);
        assert_eq!(c.len(), 3);
        assert!(!c.holds_any());
        assert!(c.get_mut(Slot::Uid(2)).is_none());
        // Dropped entries free nothing again.
        assert_eq!(c.make_room(Slot::Uid(2)), 0);
    }

    /// The stock 8.0 client (delta §B.1, client mirror): one set of uids per device; it sends
    /// GRAPH_RECOMPUTE iff the uid is in its set, else GRAPH_COMPUTE, clearing its set first when
    /// it holds 1024. A long session whose batch shapes keep changing (new uids from its
    /// process-wide counter, old shapes coming back) must never find a uid it holds missing here.
    #[test]
    fn a_long_session_never_loses_a_uid_the_client_holds() {
        let mut cache: GraphCache<u64> = GraphCache::default();
        let mut client: HashSet<u64> = HashSet::new();
        let mut next_uid = 1u64;
        // Shapes: each re-split of the scheduler gives fresh uids; a shape seen before may
        // come back with the uid the client kept for it.
        let mut shape_uids: Vec<Vec<u64>> = Vec::new();
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let (mut computes, mut recomputes, mut clears) = (0, 0, 0);
        for _step in 0..20_000 {
            let splits = if shape_uids.is_empty() || rand(10) == 0 {
                // A new batch shape: the scheduler re-splits, 1..=9 subgraphs, new uids.
                let n = 1 + rand(9);
                let uids: Vec<u64> = (0..n)
                    .map(|_| {
                        next_uid += 1;
                        next_uid
                    })
                    .collect();
                shape_uids.push(uids.clone());
                uids
            } else {
                shape_uids[rand(shape_uids.len() as u64) as usize].clone()
            };
            for uid in splits {
                if client.contains(&uid) {
                    recomputes += 1;
                    assert!(
                        cache.get_mut(Slot::Uid(uid)).is_some(),
                        "uid {uid} held by the client was evicted"
                    );
                } else {
                    computes += 1;
                    if client.len() >= GRAPH_CACHE_MAX {
                        client.clear();
                        clears += 1;
                    }
                    client.insert(uid);
                    store(&mut cache, Some(uid), 1);
                }
            }
        }
        assert!(clears > 0 && recomputes > 0 && computes > GRAPH_CACHE_MAX);
        // The two views agree exactly: every uid the client holds is stored, and no more.
        assert_eq!(cache.len(), client.len());
    }
}
