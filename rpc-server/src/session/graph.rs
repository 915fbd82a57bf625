//! GRAPH_COMPUTE: validating a wire graph and rebuilding it in ggml without recursion.

use std::collections::HashMap;

use std::sync::Arc;

use rpc_proto::Graph as WireGraph;

use super::tensor::{nbytes, UnknownBuffer};
use super::validate;
use super::{Session, SessionError};
use crate::ggml::{ops, Backend, Buffer, DeviceKind, Graph, GraphLinks, TensorSpec};

/// DFS colour of a tensor while checking that the graph is acyclic.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    New,
    Open,
    Done,
}

impl Session {
    /// Validates, builds and runs a wire graph; returns it for the caller to keep (or not).
    pub(super) fn graph_compute(&mut self, g: &WireGraph<'_>) -> Result<StoredGraph, SessionError> {
        let started = std::time::Instant::now();
        self.device(g.device)?;
        let device = g.device as usize;

        // id -> index into g.tensors; the first occurrence of a duplicate id wins (as upstream).
        let mut index: HashMap<u64, u32> = HashMap::with_capacity(g.tensors.len());
        for (i, t) in g.tensors.iter().enumerate() {
            let id = t.id.get();
            if id == 0 {
                return Err(SessionError::InvalidGraph(format!("tensor #{i} has id 0")));
            }
            index.entry(id).or_insert(i as u32);
        }
        let lookup = |id: u64, what: &str| {
            index.get(&id).copied().ok_or_else(|| {
                SessionError::InvalidGraph(format!("{what} references unknown tensor id {id:#x}"))
            })
        };

        // Walk everything reachable from the nodes, iteratively, rejecting cycles.
        let mut mark = vec![Mark::New; g.tensors.len()];
        let mut order: Vec<u32> = Vec::new(); // post-order: sources before users
        let mut stack: Vec<(u32, usize)> = Vec::new();
        let mut node_idx = Vec::with_capacity(g.node_ids.len());
        for (n, id) in g.node_ids.iter().enumerate() {
            let id = id.get();
            if id == 0 {
                return Err(SessionError::InvalidGraph(format!("node #{n} has id 0")));
            }
            let root = lookup(id, "node")?;
            node_idx.push(root);
            if mark[root as usize] != Mark::New {
                continue;
            }
            mark[root as usize] = Mark::Open;
            stack.push((root, 0));
            while let Some((cur, edge)) = stack.last_mut() {
                let t = &g.tensors[*cur as usize];
                // edges 0..10 are src[], 10 is view_src
                if *edge > 10 {
                    mark[*cur as usize] = Mark::Done;
                    order.push(*cur);
                    stack.pop();
                    continue;
                }
                let e = *edge;
                *edge += 1;
                let child_id = if e < 10 {
                    t.src[e].get()
                } else {
                    t.view_src.get()
                };
                if child_id == 0 {
                    continue;
                }
                let child = lookup(child_id, "source")?;
                if child == *cur && e == 1 && t.op.get() == ops::CPY {
                    // ggml_cast builds a CPY whose src[1] is the result itself (the destination
                    // of the copy); that is not a cycle. Any other self-reference is.
                    continue;
                }
                match mark[child as usize] {
                    Mark::Done => {}
                    Mark::Open => {
                        return Err(SessionError::InvalidGraph(format!(
                            "cycle through tensor id {child_id:#x}"
                        )))
                    }
                    Mark::New => {
                        mark[child as usize] = Mark::Open;
                        stack.push((child, 0));
                    }
                }
            }
        }

        // Materialize the reachable tensors in post-order.
        let mut local: HashMap<u32, u32> = HashMap::with_capacity(order.len());
        for (li, &wi) in order.iter().enumerate() {
            local.insert(wi, li as u32);
        }
        let local_of = |id: u64| {
            index
                .get(&id)
                .and_then(|wi| local.get(wi))
                .copied()
                .ok_or_else(|| SessionError::InvalidGraph(format!("unreachable tensor id {id:#x}")))
        };
        // Which tensors are read or written by compute: the computing nodes and, transitively,
        // the src[] of every computing tensor.
        // A tensor reached only as a view_src (e.g. a host input whose view was copied to this
        // server) is never dereferenced and may legitimately have no buffer here.
        let mut needs_data = vec![false; order.len()];
        let mut reader: Vec<Option<u32>> = vec![None; order.len()];
        for &wi in &node_idx {
            if let Some(&li) = local.get(&wi) {
                // A node that computes nothing (a view) needs data only if something reads it.
                if !ops::is_empty(g.tensors[wi as usize].op.get()) {
                    needs_data[li as usize] = true;
                }
            }
        }
        for (li, &wi) in order.iter().enumerate().rev() {
            // View-like ops (NONE, RESHAPE, VIEW, PERMUTE, TRANSPOSE) compute nothing and do not
            // read their sources.
            if needs_data[li] && !ops::is_empty(g.tensors[wi as usize].op.get()) {
                for s in g.tensors[wi as usize].src.iter() {
                    if s.get() != 0 {
                        let c = local_of(s.get())?;
                        needs_data[c as usize] = true;
                        reader[c as usize].get_or_insert(wi);
                    }
                }
            }
        }
        let mut specs = Vec::with_capacity(order.len());
        let mut links = Vec::with_capacity(order.len());
        for (li, &wi) in order.iter().enumerate() {
            let t = &g.tensors[wi as usize];
            let spec = self.resolve_tensor(t, UnknownBuffer::Reject)?;
            if spec.buffer.is_none() && needs_data[li] {
                let by = match reader[li] {
                    Some(r) => {
                        let r = &g.tensors[r as usize];
                        format!(
                            "read by '{}' (op {})",
                            r.name_str(),
                            crate::ggml::ops::name(r.op.get()).unwrap_or_default()
                        )
                    }
                    None => "a graph node".to_string(),
                };
                return Err(SessionError::tensor(
                    t,
                    format!(
                        "{by} but not in a buffer of this connection (op {}, flags {})",
                        t.op.get(),
                        t.flags.get()
                    ),
                ));
            }
            let mut l = GraphLinks::default();
            for (slot, s) in t.src.iter().enumerate() {
                let id = s.get();
                if id != 0 {
                    l.src[slot] = Some(local_of(id)?);
                }
            }
            if t.view_src.get() != 0 {
                l.view_src = Some(local_of(t.view_src.get())?);
            }
            specs.push(spec);
            links.push(l);
        }
        // Nodes that ggml's backends skip are left out of the graph, so that no backend can run
        // them, and out of the rules and index checks: those without the COMPUTE flag (the
        // branches `ggml_build_forward_select` did not select, e.g. llama.cpp 8.0's mixed
        // token/embedding input, whose row ids hold whatever the client left there) and those
        // whose result has no element (a batch of 0 rows, as llama-server sends: their strides
        // collapse to 0).
        let runs = |t: &rpc_proto::RpcTensor| {
            t.flags.get() & rpc_proto::TENSOR_FLAG_COMPUTE != 0 && t.ne.iter().all(|n| n.get() != 0)
        };
        let nodes: Vec<u32> = node_idx
            .iter()
            .filter(|&&wi| runs(&g.tensors[wi as usize]))
            .map(|wi| {
                local
                    .get(wi)
                    .copied()
                    .ok_or_else(|| SessionError::InvalidGraph("node not materialized".into()))
            })
            .collect::<Result<_, _>>()?;

        // Views stay inside the tensor they view.
        for (li, l) in links.iter().enumerate() {
            if let Some(v) = l.view_src {
                validate::check_view(&specs[li], &specs[v as usize])
                    .map_err(|e| SessionError::tensor(&g.tensors[order[li] as usize], e))?;
            }
        }

        // Per-node rules; collect the checks on index tensor contents.
        let cpu = self.config.devices[device].kind() == DeviceKind::Cpu;
        let mut pending: Vec<(usize, validate::IndexCheck)> = Vec::new();
        for (pos, &ni) in nodes.iter().enumerate() {
            let d = &specs[ni as usize];
            if ops::is_empty(d.op) {
                continue;
            }
            let l = &links[ni as usize];
            let mut src = [None; 10];
            for (slot, s) in l.src.iter().enumerate() {
                src[slot] = s.map(|i| &specs[i as usize]);
            }
            let node = validate::Node {
                d,
                src,
                src_idx: l.src,
            };
            let checks = validate::check_node(&node, cpu).map_err(|e| {
                let t = &g.tensors[order[ni as usize] as usize];
                SessionError::tensor(
                    t,
                    format!("{} node: {e}", ops::name(d.op).unwrap_or_default()),
                )
            })?;
            pending.extend(checks.into_iter().map(|c| (pos, c)));
        }
        let (cuts, checks) = schedule_checks(&specs, &links, &nodes, pending)?;

        let graph = Graph::build(&specs, &links, &nodes, &cuts)?;
        if let Some(n) = graph.first_unsupported(&self.config.devices[device]) {
            let t = &g.tensors[order[n as usize] as usize];
            return Err(SessionError::tensor(
                t,
                format!(
                    "op {} with these types is not supported by device {}",
                    ops::name(t.op.get()).unwrap_or_default(),
                    self.config.devices[device].name()
                ),
            ));
        }
        let mut stored = StoredGraph { graph, checks };
        let built = started.elapsed();
        run_graph(self.backend(device)?, &mut stored)?;
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

/// Upper bound on (checks x writing nodes) comparisons when scheduling checks.
const MAX_SCHEDULE_WORK: usize = 200_000_000;

/// Decides where each index check runs. A check on a tensor that no earlier node writes runs
/// before the graph; otherwise the graph is cut after the last node that writes the tensor's
/// memory (and at or before its consumer), and the check runs at that cut. Cuts are shared
/// between checks where possible (interval stabbing, greedy by consumer position).
fn schedule_checks(
    specs: &[TensorSpec],
    links: &[GraphLinks],
    nodes: &[u32],
    pending: Vec<(usize, validate::IndexCheck)>,
) -> Result<(Vec<usize>, Vec<Vec<DataCheck>>), SessionError> {
    if pending.is_empty() {
        return Ok((Vec::new(), vec![Vec::new()]));
    }
    // Memory each node writes: its result, and for optimizer steps their state sources too.
    let mut writers: Vec<(usize, &Arc<Buffer>, u64, u64)> = Vec::new();
    for (pos, &ni) in nodes.iter().enumerate() {
        let d = &specs[ni as usize];
        if ops::is_empty(d.op) {
            continue;
        }
        let mut written = vec![ni];
        if d.op == ops::OPT_STEP_ADAMW || d.op == ops::OPT_STEP_SGD {
            written.extend(links[ni as usize].src.iter().flatten().copied());
        }
        for w in written {
            let t = &specs[w as usize];
            if let Some((b, off)) = &t.buffer {
                let len = nbytes(t.type_, &t.ne, &t.nb).unwrap_or(u64::MAX);
                writers.push((pos, b, *off, off.saturating_add(len)));
            }
        }
    }
    if pending.len().saturating_mul(writers.len().max(1)) > MAX_SCHEDULE_WORK {
        return Err(SessionError::InvalidGraph(
            "too many index checks for the graph size".into(),
        ));
    }
    // (earliest cut, consumer position, check)
    let mut items: Vec<(usize, usize, DataCheck)> = Vec::with_capacity(pending.len());
    for (consumer, c) in pending {
        let t = &specs[c.tensor as usize];
        let Some((buf, off)) = &t.buffer else {
            return Err(SessionError::InvalidGraph(format!(
                "{}: index tensor not in a buffer",
                c.what
            )));
        };
        let len = nbytes(t.type_, &t.ne, &t.nb).unwrap_or(u64::MAX);
        let end = off.saturating_add(len);
        let mut last_writer: Option<usize> = None;
        for &(pos, b, woff, wend) in &writers {
            if pos > consumer || !Arc::ptr_eq(b, buf) || woff >= end || *off >= wend || len == 0 {
                continue;
            }
            if pos == consumer {
                return Err(SessionError::InvalidGraph(format!(
                    "{}: the node writes over its own index tensor",
                    c.what
                )));
            }
            last_writer = Some(last_writer.map_or(pos, |p: usize| p.max(pos)));
        }
        let lo = last_writer.map_or(0, |w| w + 1);
        let check = DataCheck {
            buf: buf.clone(),
            off: *off,
            ne: t.ne,
            nb: t.nb,
            type_: c.type_,
            bound: c.bound,
            what: c.what,
        };
        items.push((lo, consumer, check));
    }
    items.sort_by_key(|x| x.1);
    let mut cuts: Vec<usize> = Vec::new();
    let mut assigned: Vec<(usize, DataCheck)> = Vec::with_capacity(items.len());
    for (lo, consumer, check) in items {
        if lo == 0 {
            assigned.push((0, check));
        } else if cuts.last().is_some_and(|&k| k >= lo) {
            assigned.push((*cuts.last().unwrap_or(&0), check));
        } else {
            cuts.push(consumer);
            assigned.push((consumer, check));
        }
    }
    let mut checks: Vec<Vec<DataCheck>> = (0..=cuts.len()).map(|_| Vec::new()).collect();
    for (cut, check) in assigned {
        let seg = if cut == 0 {
            0
        } else {
            cuts.iter().position(|&k| k == cut).map_or(0, |i| i + 1)
        };
        checks[seg].push(check);
    }
    Ok((cuts, checks))
}

/// A check that every value of an index tensor lies in `[0, bound)`.
pub(crate) struct DataCheck {
    buf: Arc<Buffer>,
    off: u64,
    ne: [u32; 4],
    nb: [u64; 4],
    type_: u32,
    bound: u64,
    what: &'static str,
}

impl DataCheck {
    pub(crate) fn run(&self) -> Result<(), SessionError> {
        let len = nbytes(self.type_, &self.ne, &self.nb)
            .ok_or(SessionError::OutOfMemory("index check"))?;
        let ulen = usize::try_from(len).map_err(|_| SessionError::OutOfMemory("index check"))?;
        let owned;
        let bytes: &[u8] = match self.buf.host_slice(self.off, ulen) {
            Some(s) => s,
            None => {
                let mut v = Vec::new();
                v.try_reserve_exact(ulen)
                    .map_err(|_| SessionError::OutOfMemory("index check"))?;
                v.resize(ulen, 0);
                if !self.buf.read(self.off, &mut v) {
                    return Err(SessionError::OutOfMemory("index check"));
                }
                owned = v;
                &owned
            }
        };
        let wide = self.type_ == validate::ty::I64;
        let esz = if wide { 8 } else { 4 };
        let ne = self.ne.map(|x| x as u64);
        for i3 in 0..ne[3] {
            for i2 in 0..ne[2] {
                for i1 in 0..ne[1] {
                    let row = i3 * self.nb[3] + i2 * self.nb[2] + i1 * self.nb[1];
                    for i0 in 0..ne[0] {
                        let at = (row + i0 * self.nb[0]) as usize;
                        let v: i64 = match bytes.get(at..at + esz) {
                            Some(b) if wide => i64::from_le_bytes(b.try_into().unwrap_or([0; 8])),
                            Some(b) => i32::from_le_bytes(b.try_into().unwrap_or([0; 4])) as i64,
                            None => return Err(SessionError::OutOfMemory("index check")),
                        };
                        if v < 0 || v as u64 >= self.bound {
                            return Err(SessionError::OutOfBounds {
                                what: self.what,
                                detail: format!(
                                    "index {v} at [{i0}, {i1}, {i2}, {i3}] not in [0, {}) (type {}, ne {:?}, nb {:?})",
                                    self.bound, self.type_, self.ne, self.nb
                                ),
                            });
                        }
                    }
                }
            }
        }
        Ok(())
    }
}
