//! GRAPH_COMPUTE: validating a wire graph and rebuilding it in ggml without recursion.
//!
//! [`Session::graph_compute`] is a pipeline of named steps, each in its own function:
//!
//! | step | what it does | where |
//! |---|---|---|
//! | [`Ids::index`] | ids → wire index; id 0 refused | `graph/walk.rs` |
//! | [`walk::walk`] | what the nodes reach, sources first; unknown ids and cycles refused | `graph/walk.rs` |
//! | [`walk::needs_data`] | which reached tensors compute reads | `graph/walk.rs` |
//! | [`walk::link`] | sources and views as local indices | `graph/walk.rs` |
//! | [`Session::resolve_tensors`] | wire tensors → [`TensorSpec`]s in this connection's buffers | here |
//! | [`walk::running_nodes`] | the nodes a backend would run | `graph/walk.rs` |
//! | [`rules::check_views`] | views inside what they view | `graph/rules.rs` |
//! | [`rules::check_rules`] | each node's op rule; the index checks it needs | `graph/rules.rs` |
//! | [`schedule::schedule_checks`] | where the graph is cut for the index checks | `graph/schedule.rs` |
//! | [`Session::build`] | the ggml graph, refused if the device cannot run a node | here |
//! | [`run_graph`] | each segment's index checks, then the segment | here |
//!
//! The graph is kept for GRAPH_RECOMPUTE by `graph_cache.rs`, which runs only the last step again.

mod rules;
mod schedule;
#[cfg(test)]
mod tests;
mod walk;

use rpc_proto::{Graph as WireGraph, RpcTensor};

use super::tensor::UnknownBuffer;
use super::validate;
use super::{Session, SessionError};
use rpc_ggml::{ops, Backend, DeviceKind, Graph, GraphLinks, TensorSpec};
use schedule::DataCheck;
use walk::{DataNeeds, Ids, Reached};

impl Session {
    /// Validates, builds and runs a wire graph; returns it for the caller to keep (or not).
    pub(super) fn graph_compute(&mut self, g: &WireGraph<'_>) -> Result<StoredGraph, SessionError> {
        let started = std::time::Instant::now();
        let device = self.device(g.device)?;
        let cpu = device.kind() == DeviceKind::Cpu;
        let ids = Ids::index(g.tensors)?;
        let reached = walk::walk(g, &ids)?;
        let needs = walk::needs_data(g.tensors, &ids, &reached)?;
        let links = walk::link(g.tensors, &ids, &reached)?;
        let specs = self.resolve_tensors(g.tensors, &reached, &needs)?;
        let nodes = walk::running_nodes(g.tensors, &reached)?;
        let resolved = Resolved {
            wire: g.tensors,
            order: reached.order,
            specs,
            links,
        };
        rules::check_views(&resolved)?;
        let pending = rules::check_rules(&resolved, &nodes, cpu)?;
        let schedule =
            schedule::schedule_checks(&resolved.specs, &resolved.links, &nodes, pending)?;
        let graph = self.build(g.device, &resolved, &nodes, &schedule.cuts)?;
        let mut stored = StoredGraph {
            graph,
            checks: schedule.checks,
        };
        let built = started.elapsed();
        run_graph(self.backend(g.device as usize)?, &mut stored)?;
        tracing::debug!(
            nodes = nodes.len(),
            segments = stored.graph.segments(),
            index_checks = stored.checks.iter().map(Vec::len).sum::<usize>(),
            validate_build_us = built.as_micros() as u64,
            total_us = started.elapsed().as_micros() as u64,
            "GRAPH_COMPUTE"
        );
        Ok(stored)
    }

    /// Resolves every reached tensor in this connection's buffers, in walk order. A tensor that
    /// compute reads must be in one.
    fn resolve_tensors(
        &self,
        tensors: &[RpcTensor],
        reached: &Reached,
        needs: &DataNeeds,
    ) -> Result<Vec<TensorSpec>, SessionError> {
        let mut specs = Vec::with_capacity(reached.len());
        for (li, &wi) in reached.order.iter().enumerate() {
            let t = &tensors[wi as usize];
            let spec = self.resolve_tensor(t, UnknownBuffer::Reject)?;
            if spec.buffer.is_none() && needs.needed[li] {
                let reader = needs.reader[li].map(|r| &tensors[r as usize]);
                return Err(unbacked(t, reader));
            }
            specs.push(spec);
        }
        Ok(specs)
    }

    /// Builds the ggml graph of the running `nodes`, cut at `cuts`; refused when the device
    /// cannot run one of its nodes.
    fn build(
        &self,
        device: u32,
        r: &Resolved<'_>,
        nodes: &[u32],
        cuts: &[usize],
    ) -> Result<Graph, SessionError> {
        let device = self.device(device)?;
        let graph = Graph::build(&r.specs, &r.links, nodes, cuts)?;
        if let Some(n) = graph.first_unsupported(device) {
            let t = r.wire(n as usize);
            return Err(SessionError::tensor(
                t,
                format!(
                    "op {} with these types is not supported by device {}",
                    ops::name(t.op.get()).unwrap_or_default(),
                    device.name()
                ),
            ));
        }
        Ok(graph)
    }
}

/// The refusal of tensor `t`, which `reader` (or, without one, the graph as a node) reads but
/// which is in no buffer of this connection.
fn unbacked(t: &RpcTensor, reader: Option<&RpcTensor>) -> SessionError {
    let by = match reader {
        Some(r) => format!(
            "read by '{}' (op {})",
            r.name_str(),
            ops::name(r.op.get()).unwrap_or_default()
        ),
        None => "a graph node".to_string(),
    };
    SessionError::tensor(
        t,
        format!(
            "{by} but not in a buffer of this connection (op {}, flags {})",
            t.op.get(),
            t.flags.get()
        ),
    )
}

/// The reached tensors, resolved: `specs[li]` and `links[li]` describe the wire tensor
/// `wire[order[li]]` (`li`: its local index).
pub(super) struct Resolved<'g> {
    wire: &'g [RpcTensor],
    order: Vec<u32>,
    specs: Vec<TensorSpec>,
    links: Vec<GraphLinks>,
}

impl Resolved<'_> {
    /// The wire tensor of local index `li`.
    fn wire(&self, li: usize) -> &RpcTensor {
        &self.wire[self.order[li] as usize]
    }
}

/// A graph kept for GRAPH_RECOMPUTE, with the checks on index data to run before each segment.
pub(crate) struct StoredGraph {
    pub(crate) graph: Graph,
    /// `checks[i]` run right before segment `i` is computed.
    checks: Vec<Vec<DataCheck>>,
}

impl StoredGraph {
    /// Host memory the stored graph takes (its ggml context and bookkeeping), charged to the
    /// connection's budget while it is kept.
    pub(crate) fn footprint(&self) -> u64 {
        let checks: usize = self.checks.iter().map(Vec::len).sum();
        self.graph
            .footprint()
            .saturating_add((checks * std::mem::size_of::<DataCheck>()) as u64)
    }
}

/// Computes every segment, running each segment's data checks first.
pub(crate) fn run_graph(backend: &mut Backend, g: &mut StoredGraph) -> Result<(), SessionError> {
    let mut checking = std::time::Duration::ZERO;
    let started = std::time::Instant::now();
    for seg in 0..g.graph.segments() {
        if let Some(checks) = g.checks.get(seg) {
            let t = std::time::Instant::now();
            for c in checks {
                c.run()?;
            }
            checking += t.elapsed();
        }
        backend.compute(&mut g.graph, seg)?;
    }
    tracing::trace!(
        segments = g.graph.segments(),
        checks_us = checking.as_micros() as u64,
        compute_us = (started.elapsed() - checking).as_micros() as u64,
        "graph run"
    );
    Ok(())
}
