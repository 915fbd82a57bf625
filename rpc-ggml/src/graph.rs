//! Compute graphs rebuilt from GRAPH_COMPUTE requests.

use super::buffer::{self, Buffer, BufferRef};
use super::context::Context;
use super::device::Device;
use super::sys;
use super::tensor::TensorSpec;

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("cannot create a ggml context for {0} tensors")]
    Context(usize),
    #[error("graph references tensor index {0} which does not exist")]
    BadIndex(u32),
    #[error("graph compute on {device} failed with ggml status {status}")]
    ComputeFailed { device: String, status: i32 },
    #[error("a buffer of the graph is in use (a view of its bytes is alive)")]
    BufferBusy,
}

/// Source and view links of one tensor, as indices into the graph's tensor list.
#[derive(Debug, Clone, Copy, Default)]
pub struct GraphLinks {
    pub src: [Option<u32>; 10],
    pub view_src: Option<u32>,
}

/// A ggml graph with its own context; keeps every buffer it points into alive. It holds them as
/// [`BufferRef`]s, which cannot write; ggml writes them only while the flags
/// `Graph::segment_locked` takes are held (`Backend::compute`).
///
/// The nodes may be split into consecutive segments (ggml graphs of their own, computed one after
/// the other) so that the session can check data between them: index tensors computed inside the
/// graph are checked after their producer ran and before their consumer runs.
pub struct Graph {
    _ctx: Context,
    segments: Vec<*mut sys::ggml_cgraph>,
    tensors: Vec<*mut sys::ggml_tensor>,
    nodes: Vec<u32>,
    /// Every buffer a tensor of the graph points into, once.
    buffers: Vec<BufferRef>,
}

// SAFETY: the graphs and their tensors live in `_ctx`, owned by this struct; it is used by one
// session (one thread) at a time.
unsafe impl Send for Graph {}

impl Graph {
    /// Builds a graph: creates every tensor, links sources and views by index (no recursion),
    /// then appends `nodes` in order, starting a new segment at each position in `cuts`
    /// (ascending, each in `1..nodes.len()`).
    pub fn build(
        specs: &[TensorSpec],
        links: &[GraphLinks],
        nodes: &[u32],
        cuts: &[usize],
    ) -> Result<Graph, GraphError> {
        let mut bounds: Vec<usize> = vec![0];
        for &c in cuts {
            if c > *bounds.last().unwrap_or(&0) && c < nodes.len() {
                bounds.push(c);
            }
        }
        bounds.push(nodes.len());
        let seg_sizes: Vec<usize> = bounds.windows(2).map(|w| (w[1] - w[0]).max(1)).collect();
        let mut ctx = Context::new_for_graphs(specs.len(), &seg_sizes)
            .ok_or(GraphError::Context(specs.len()))?;
        let tensors: Vec<*mut sys::ggml_tensor> = specs.iter().map(|s| s.build(&mut ctx)).collect();
        let get = |i: u32| {
            tensors
                .get(i as usize)
                .copied()
                .ok_or(GraphError::BadIndex(i))
        };
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
        let mut segments = Vec::with_capacity(seg_sizes.len());
        for (w, &size) in bounds.windows(2).zip(&seg_sizes) {
            // SAFETY: ctx has room for one graph of each segment size (sized in new_for_graphs).
            let graph = unsafe { sys::ggml_new_graph_custom(ctx.raw(), size, false) };
            if graph.is_null() {
                return Err(GraphError::Context(specs.len()));
            }
            for &n in &nodes[w[0]..w[1]] {
                let p = get(n)?;
                // SAFETY: the graph was created with capacity for every node of the segment; p
                // lives in ctx.
                unsafe { sys::ggml_graph_add_node(graph, p) };
            }
            segments.push(graph);
        }
        let buffers = buffer::dedup(
            specs
                .iter()
                .filter_map(|s| s.buffer.as_ref().map(|(b, _)| b.clone())),
        );
        Ok(Graph {
            _ctx: ctx,
            segments,
            tensors,
            nodes: nodes.to_vec(),
            buffers,
        })
    }

    /// Host memory this graph holds: its context's pool and its index lists.
    pub fn footprint(&self) -> u64 {
        let lists = self.segments.len() * 8
            + self.tensors.len() * 8
            + self.nodes.len() * 4
            + self.buffers.len() * 8;
        (self._ctx.size() + lists) as u64
    }

    /// Number of segments (at least one).
    pub fn segments(&self) -> usize {
        self.segments.len()
    }

    /// The graph node (tensor index) of each node position whose op the device cannot run.
    pub fn first_unsupported(&self, device: &Device) -> Option<u32> {
        self.nodes.iter().copied().find(|&n| {
            let Some(&t) = self.tensors.get(n as usize) else {
                return true;
            };
            // SAFETY: t lives in our context.
            let op = unsafe { (*t).op } as u32;
            !super::ops::is_empty(op) && !device.supports_op(t)
        })
    }

    /// Segment `i`, with the flags of every buffer the graph points into held exclusively for
    /// as long as the second value lives: what ggml may compute it under.
    pub(super) fn segment_locked(
        &mut self,
        i: usize,
    ) -> Result<(*mut sys::ggml_cgraph, buffer::Locked<'_>), GraphError> {
        let g = *self.segments.get(i).ok_or(GraphError::BadIndex(i as u32))?;
        let locked = buffer::lock(&self.buffers).map_err(|_| GraphError::BufferBusy)?;
        Ok((g, locked))
    }

    /// Whether this graph points into `buffer`.
    pub fn uses(&self, buffer: &Buffer) -> bool {
        self.buffers.iter().any(|b| buffer.is(b))
    }
}
