//! Compute graphs rebuilt from GRAPH_COMPUTE requests.

use std::sync::Arc;

use super::buffer::Buffer;
use super::tensor::{Context, TensorSpec};
use super::sys;

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("cannot create a ggml context for {0} tensors")]
    Context(usize),
    #[error("graph references tensor index {0} which does not exist")]
    BadIndex(u32),
    #[error("graph compute on {device} failed with ggml status {status}")]
    ComputeFailed { device: String, status: i32 },
}

/// Source and view links of one tensor, as indices into the graph's tensor list.
#[derive(Debug, Clone, Copy, Default)]
pub struct GraphLinks {
    pub src: [Option<u32>; 10],
    pub view_src: Option<u32>,
}

/// A ggml graph with its own context; keeps every buffer it points into alive.
pub struct Graph {
    _ctx: Context,
    graph: *mut sys::ggml_cgraph,
    _buffers: Vec<Arc<Buffer>>,
}

// SAFETY: the graph and its tensors live in `_ctx`, owned by this struct; it is used by one
// session (one thread) at a time.
unsafe impl Send for Graph {}

impl Graph {
    /// Builds a graph: creates every tensor, links sources and views by index (no recursion),
    /// then appends `nodes` in order.
    pub fn build(specs: &[TensorSpec], links: &[GraphLinks], nodes: &[u32]) -> Result<Graph, GraphError> {
        let mut ctx = Context::new(specs.len(), Some(nodes.len().max(1))).ok_or(GraphError::Context(specs.len()))?;
        let tensors: Vec<*mut sys::ggml_tensor> = specs.iter().map(|s| ctx.new_tensor(s)).collect();
        let get = |i: u32| tensors.get(i as usize).copied().ok_or(GraphError::BadIndex(i));
        for (t, l) in tensors.iter().zip(links) {
            for (slot, s) in l.src.iter().enumerate() {
                if let Some(s) = s {
                    let p = get(*s)?;
                    // SAFETY: both tensors live in ctx.
                    unsafe { (**t).src[slot] = p };
                }
            }
            if let Some(v) = l.view_src {
                let p = get(v)?;
                // SAFETY: both tensors live in ctx.
                unsafe { (**t).view_src = p };
            }
        }
        // SAFETY: ctx has room for a graph of nodes.len().max(1) nodes (sized in Context::new).
        let graph = unsafe { sys::ggml_new_graph_custom(ctx.raw(), nodes.len().max(1), false) };
        for &n in nodes {
            let p = get(n)?;
            // SAFETY: the graph was created with capacity for every node; p lives in ctx.
            unsafe { sys::ggml_graph_add_node(graph, p) };
        }
        let mut seen = std::collections::HashSet::new();
        let mut buffers: Vec<Arc<Buffer>> = Vec::new();
        for s in specs {
            if let Some((b, _)) = &s.buffer {
                if seen.insert(Arc::as_ptr(b) as usize) {
                    buffers.push(b.clone());
                }
            }
        }
        Ok(Graph { _ctx: ctx, graph, _buffers: buffers })
    }

    pub(crate) fn raw(&mut self) -> *mut sys::ggml_cgraph {
        self.graph
    }

    /// Whether this graph points into `buffer`.
    pub fn uses(&self, buffer: &Arc<Buffer>) -> bool {
        self._buffers.iter().any(|b| Arc::ptr_eq(b, buffer))
    }
}
