//! GRAPH_COMPUTE: validating a wire graph and rebuilding it in ggml without recursion.

use std::collections::HashMap;

use rpc_proto::Graph as WireGraph;

use super::tensor::UnknownBuffer;
use super::{Session, SessionError};
use crate::ggml::{ops, Graph, GraphLinks};

/// DFS colour of a tensor while checking that the graph is acyclic.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    New,
    Open,
    Done,
}

impl Session {
    pub(super) fn graph_compute(&mut self, g: &WireGraph<'_>) -> Result<(), SessionError> {
        self.device(g.device)?;
        let device = g.device as usize;
        // A new graph replaces the stored one even if it fails to build.
        self.graphs[device] = None;

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
            index.get(&id).copied().ok_or_else(|| SessionError::InvalidGraph(format!("{what} references unknown tensor id {id:#x}")))
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
                let child_id = if e < 10 { t.src[e].get() } else { t.view_src.get() };
                if child_id == 0 {
                    continue;
                }
                let child = lookup(child_id, "source")?;
                match mark[child as usize] {
                    Mark::Done => {}
                    Mark::Open => return Err(SessionError::InvalidGraph(format!("cycle through tensor id {child_id:#x}"))),
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
                        format!("read by '{}' (op {})", r.name_str(), crate::ggml::ops::name(r.op.get()).unwrap_or_default())
                    }
                    None => "a graph node".to_string(),
                };
                return Err(SessionError::tensor(t, format!("{by} but not in a buffer of this connection (op {}, flags {})", t.op.get(), t.flags.get())));
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
        let nodes: Vec<u32> = node_idx
            .iter()
            .map(|wi| local.get(wi).copied().ok_or_else(|| SessionError::InvalidGraph("node not materialized".into())))
            .collect::<Result<_, _>>()?;
        let mut graph = Graph::build(&specs, &links, &nodes)?;
        self.backend(device)?.compute(&mut graph)?;
        self.graphs[device] = Some(graph);
        Ok(())
    }
}
