//! Compute graphs rebuilt from GRAPH_COMPUTE requests, checked before they are built: a [`Graph`]
//! exists only if its views, every node's op rule and the device's support passed, and it carries
//! the checks on its index tensors' contents that `Backend::compute` runs before each segment.

use super::buffer::{self, Buffer, BufferRef};
use super::check::rules::{self, GraphLinks, Structure};
use super::check::schedule::{self, DataCheck};
use super::check::{IndexError, Refusal};
use super::context::Context;
use super::device::{Device, DeviceKind};
use super::sys;
use super::tensor::TensorSpec;

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("cannot create a ggml context for {0} tensors")]
    Context(usize),
    #[error("graph references tensor index {0} which does not exist")]
    BadIndex(u32),
    #[error("graph has {links} links for {tensors} tensors")]
    Links { tensors: usize, links: usize },
    /// A computing node, or a source of one, is in no buffer.
    #[error("tensor #{0} is read or written by a computing node but in no buffer")]
    Unbacked(u32),
    /// A view leaves what it views, or a node breaks its op's rule (the message names the op:
    /// "MUL_MAT node: ...").
    #[error("tensor #{tensor}: {refusal}")]
    Refused { tensor: u32, refusal: Refusal },
    /// The device cannot run the node `tensor`.
    #[error("tensor #{tensor}: op {op} with these types is not supported by device {device}")]
    Unsupported {
        tensor: u32,
        op: String,
        device: String,
    },
    /// A computing node, or a source of one, is in a buffer the device cannot compute with
    /// (e.g. device memory of a GPU for the CPU).
    #[error("tensor #{tensor} is in a buffer device {device} cannot compute with")]
    ForeignBuffer { tensor: u32, device: String },
    /// The graph was built (and checked) for another device than the backend's.
    #[error("a graph built for device {graph} cannot run on a backend of device {backend}")]
    WrongDevice { graph: String, backend: String },
    /// An index check cannot be scheduled, or refused the values it read.
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error("graph compute on {device} failed with ggml status {status}")]
    ComputeFailed { device: String, status: i32 },
    #[error("a buffer of the graph is in use (a view of its bytes is alive)")]
    BufferBusy,
}

impl From<Structure> for GraphError {
    fn from(s: Structure) -> GraphError {
        match s {
            Structure::Links { tensors, links } => GraphError::Links { tensors, links },
            Structure::BadIndex(i) => GraphError::BadIndex(i),
            Structure::Unbacked(i) => GraphError::Unbacked(i),
        }
    }
}

fn refused((tensor, refusal): (u32, Refusal)) -> GraphError {
    GraphError::Refused { tensor, refusal }
}

/// A ggml graph with its own context; keeps every buffer it points into alive. It holds them as
/// [`BufferRef`]s, which cannot write; ggml writes them only while the flags
/// `Graph::checked_segment` takes are held (`Backend::compute`).
///
/// The nodes may be split into consecutive segments (ggml graphs of their own, computed one after
/// the other) so that index tensors computed inside the graph are checked after their producer
/// ran and before their consumer runs: `checks[i]` run before segment `i`.
pub struct Graph {
    _ctx: Context,
    segments: Vec<*mut sys::ggml_cgraph>,
    tensors: Vec<*mut sys::ggml_tensor>,
    nodes: Vec<u32>,
    /// Every buffer a tensor of the graph points into, once.
    buffers: Vec<BufferRef>,
    /// The checks on index tensors' contents to run before each segment.
    checks: Vec<Vec<DataCheck>>,
    /// The device the graph was checked for (its rules depend on it), and its name.
    device: (sys::ggml_backend_dev_t, String),
}

// SAFETY: the graphs and their tensors live in `_ctx`, owned by this struct; it is used by one
// session (one thread) at a time.
unsafe impl Send for Graph {}

impl Graph {
    /// Checks and builds a graph of `specs` for `device`: `links[i]` are the sources and view
    /// source of `specs[i]` (indices into `specs`), `nodes` the nodes to run, in order.
    ///
    /// Refused unless every index exists, every computing node and its sources are in buffers,
    /// every view stays inside what it views, every computing node passes its op's rule (for
    /// `device`: the CPU backend's kernels have rules of their own) and the device supports it.
    /// The checks on index tensors' contents the rules ask for are scheduled: the graph is cut
    /// into segments where a check must run after a node writes the index tensor.
    pub fn build(
        specs: &[TensorSpec],
        links: &[GraphLinks],
        nodes: &[u32],
        device: &Device,
    ) -> Result<Graph, GraphError> {
        rules::check_structure(specs, links, nodes)?;
        rules::check_views(specs, links).map_err(refused)?;
        let cpu = device.kind() == DeviceKind::Cpu;
        let pending = rules::check_rules(specs, links, nodes, cpu).map_err(refused)?;
        if let Some(tensor) = foreign_buffer(specs, links, nodes, device) {
            return Err(GraphError::ForeignBuffer {
                tensor,
                device: device.name().to_string(),
            });
        }
        let schedule = schedule::schedule_checks(specs, links, nodes, pending)?;
        let mut graph = Graph::assemble(specs, links, nodes, &schedule.cuts, schedule.checks)?;
        graph.device = (device.raw(), device.name().to_string());
        if let Some(n) = graph.first_unsupported(device) {
            return Err(GraphError::Unsupported {
                tensor: n,
                op: super::ops::name(specs[n as usize].op).unwrap_or_default(),
                device: device.name().to_string(),
            });
        }
        Ok(graph)
    }

    /// Creates every tensor, links sources and views by index (no recursion), then appends
    /// `nodes` in order, starting a new segment at each position in `cuts` (ascending, each in
    /// `1..nodes.len()`). Every index was checked by `check_structure`.
    fn assemble(
        specs: &[TensorSpec],
        links: &[GraphLinks],
        nodes: &[u32],
        cuts: &[usize],
        checks: Vec<Vec<DataCheck>>,
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
        let mut checks = checks;
        checks.resize_with(segments.len().max(checks.len()), Vec::new);
        Ok(Graph {
            _ctx: ctx,
            segments,
            tensors,
            nodes: nodes.to_vec(),
            buffers,
            checks,
            device: (std::ptr::null_mut(), String::new()),
        })
    }

    /// Host memory this graph holds: its context's pool, its index lists and its index checks.
    pub fn footprint(&self) -> u64 {
        let checks: usize = self.checks.iter().map(Vec::len).sum();
        let lists = self.segments.len() * 8
            + self.tensors.len() * 8
            + self.nodes.len() * 4
            + self.buffers.len() * 8
            + checks * std::mem::size_of::<DataCheck>();
        (self._ctx.size() + lists) as u64
    }

    /// Number of segments (at least one).
    pub fn segments(&self) -> usize {
        self.segments.len()
    }

    /// The number of index checks run before each segment.
    pub fn index_checks(&self) -> Vec<usize> {
        self.checks.iter().map(Vec::len).collect()
    }

    /// The graph node (tensor index) of the first node position whose op the device cannot run.
    fn first_unsupported(&self, device: &Device) -> Option<u32> {
        self.nodes.iter().copied().find(|&n| {
            let Some(&t) = self.tensors.get(n as usize) else {
                return true;
            };
            // SAFETY: t lives in our context.
            let op = unsafe { (*t).op } as u32;
            // Every computing node passed its op's rule (its sources exist), what the backends'
            // supports_op read.
            !super::ops::is_empty(op) && !device.supports_op(t)
        })
    }

    /// Whether the graph was built for the device `dev` (a backend's).
    pub(super) fn check_device(
        &self,
        dev: sys::ggml_backend_dev_t,
        backend: &str,
    ) -> Result<(), GraphError> {
        if self.device.0 == dev {
            Ok(())
        } else {
            Err(GraphError::WrongDevice {
                graph: self.device.1.clone(),
                backend: backend.to_string(),
            })
        }
    }

    /// Segment `i`, with the flags of every buffer the graph points into held exclusively for
    /// as long as the second value lives, once the segment's index checks passed under those
    /// flags (so nothing changes the values between their check and the computation): what ggml
    /// may compute it under (`Backend::compute`).
    pub(super) fn checked_segment(
        &mut self,
        i: usize,
    ) -> Result<(*mut sys::ggml_cgraph, buffer::Locked<'_>), GraphError> {
        let g = *self.segments.get(i).ok_or(GraphError::BadIndex(i as u32))?;
        let locked = buffer::lock(&self.buffers).map_err(|_| GraphError::BufferBusy)?;
        for c in self.checks.get(i).map(Vec::as_slice).unwrap_or_default() {
            c.run(&locked)?;
        }
        Ok((g, locked))
    }

    /// Whether this graph points into `buffer`.
    pub fn uses(&self, buffer: &Buffer) -> bool {
        self.buffers.iter().any(|b| buffer.is(b))
    }
}

/// The first tensor a running computing node touches (itself, its sources) that lies in a buffer
/// `device` cannot compute with (indices checked by `check_structure`).
fn foreign_buffer(
    specs: &[TensorSpec],
    links: &[GraphLinks],
    nodes: &[u32],
    device: &Device,
) -> Option<u32> {
    nodes
        .iter()
        .filter(|&&ni| !super::ops::is_empty(specs[ni as usize].op))
        .flat_map(|&ni| std::iter::once(ni).chain(links[ni as usize].src.iter().flatten().copied()))
        .find(|&t| {
            specs[t as usize]
                .buffer
                .as_ref()
                .is_some_and(|(b, _)| !device.supports_buffer(b))
        })
}
