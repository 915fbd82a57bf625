//! GRAPH_COMPUTE: the wire side of a graph, rebuilt without recursion, then checked, built and
//! run by rpc-ggml.
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
//! | [`Graph::build`] | views inside what they view, each node's op rule, the index checks scheduled, the device's support; the ggml graph | rpc-ggml (`check/`, `graph.rs`) |
//! | [`Backend::compute`] | each segment's index checks, then the segment | rpc-ggml (`backend.rs`) |
//!
//! rpc-ggml's refusals are mapped here to the wire tensor they name ([`graph_error`]). The graph
//! is kept for GRAPH_RECOMPUTE by `graph_cache.rs`, which runs only the last step again.

#[cfg(test)]
mod tests;
mod walk;

use rpc_proto::{Graph as WireGraph, RpcTensor};

use super::tensor::UnknownBuffer;
use super::{Session, SessionError};
use rpc_ggml::{ops, Backend, Graph, GraphError, GraphLinks, TensorSpec};
use walk::{DataNeeds, Ids, Reached};

impl Session {
    /// Validates, builds and runs a wire graph; returns it for the caller to keep (or not).
    pub(super) fn graph_compute(&mut self, g: &WireGraph<'_>) -> Result<Graph, SessionError> {
        let started = std::time::Instant::now();
        let device = self.device(g.device)?;
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
        let mut graph = Graph::build(&resolved.specs, &resolved.links, &nodes, device)
            .map_err(|e| graph_error(&resolved, e))?;
        let built = started.elapsed();
        run_graph(self.backend(g.device as usize)?, &mut graph)?;
        tracing::debug!(
            nodes = nodes.len(),
            segments = graph.segments(),
            index_checks = graph.index_checks().iter().sum::<usize>(),
            validate_build_us = built.as_micros() as u64,
            total_us = started.elapsed().as_micros() as u64,
            "GRAPH_COMPUTE"
        );
        Ok(graph)
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
            if spec.buffer().is_none() && needs.needed[li] {
                let reader = needs.reader[li].map(|r| &tensors[r as usize]);
                return Err(unbacked(t, reader));
            }
            specs.push(spec);
        }
        Ok(specs)
    }
}

/// A refusal of [`Graph::build`] as the session reports it: a refusal naming a tensor (a view
/// outside what it views, a node's op rule, a node the device cannot run, an unbacked tensor
/// or one in a buffer the device cannot compute with) as an invalid tensor with the wire
/// tensor's name; the rest as `From<GraphError>` maps it.
fn graph_error(r: &Resolved<'_>, e: GraphError) -> SessionError {
    match e {
        GraphError::Refused { tensor, refusal } => {
            SessionError::tensor(r.wire(tensor as usize), refusal.to_string())
        }
        GraphError::Unsupported { tensor, op, device } => SessionError::tensor(
            r.wire(tensor as usize),
            format!("op {op} with these types is not supported by device {device}"),
        ),
        GraphError::Unbacked(tensor) => unbacked(r.wire(tensor as usize), None),
        GraphError::ForeignBuffer { tensor, device } => SessionError::tensor(
            r.wire(tensor as usize),
            format!("in a buffer device {device} cannot compute with"),
        ),
        e => e.into(),
    }
}

/// Computes every segment, running each segment's data checks first (rpc-ggml's
/// [`Backend::compute`]), with its errors as the session reports them.
pub(crate) fn run_graph(backend: &mut Backend, g: &mut Graph) -> Result<(), SessionError> {
    Ok(backend.compute(g)?)
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
