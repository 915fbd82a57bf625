//! The structure of a wire graph, before any tensor is resolved: ids indexed, the tensors the
//! nodes reach walked without recursion (cycles refused), which of them compute reads, their
//! links, and the nodes that run. Plain data in, plain data out: no buffer, no ggml call.

use std::collections::HashMap;

use rpc_proto::{Graph as WireGraph, RpcTensor};

use super::SessionError;
use rpc_ggml::{ops, GraphLinks};

/// Edges of a tensor in the walk: `src[0..10]`, then `view_src`.
const EDGES: usize = 11;

/// The wire tensors by id: id → index into the wire's tensor list.
pub(super) struct Ids(HashMap<u64, u32>);

impl Ids {
    /// Indexes the wire's tensors. An id 0 is refused; the first occurrence of a duplicate id
    /// wins (as upstream).
    pub(super) fn index(tensors: &[RpcTensor]) -> Result<Ids, SessionError> {
        let mut index = HashMap::with_capacity(tensors.len());
        for (i, t) in tensors.iter().enumerate() {
            let id = t.id.get();
            if id == 0 {
                return Err(SessionError::InvalidGraph(format!("tensor #{i} has id 0")));
            }
            index.entry(id).or_insert(i as u32);
        }
        Ok(Ids(index))
    }

    /// The wire index of `id`, which `what` references.
    fn get(&self, id: u64, what: &str) -> Result<u32, SessionError> {
        self.0.get(&id).copied().ok_or_else(|| {
            SessionError::InvalidGraph(format!("{what} references unknown tensor id {id:#x}"))
        })
    }
}

/// The tensors the nodes reach, sources before users.
pub(super) struct Reached {
    /// Wire index of each reached tensor, in post-order: every tensor after its sources and
    /// its view source. A tensor's position here is its local index.
    pub(super) order: Vec<u32>,
    /// Wire index → local index, for the reached tensors.
    local: HashMap<u32, u32>,
    /// Wire index of each node, in the client's order.
    pub(super) nodes: Vec<u32>,
}

impl Reached {
    /// The local index of the tensor `id` names.
    fn local_of(&self, ids: &Ids, id: u64) -> Result<u32, SessionError> {
        ids.0
            .get(&id)
            .and_then(|wi| self.local.get(wi))
            .copied()
            .ok_or_else(|| SessionError::InvalidGraph(format!("unreachable tensor id {id:#x}")))
    }

    /// Number of reached tensors.
    pub(super) fn len(&self) -> usize {
        self.order.len()
    }
}

/// DFS colour of a tensor while checking that the graph is acyclic.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mark {
    New,
    Open,
    Done,
}

/// Walks everything reachable from the nodes, depth first on an explicit stack, refusing a node
/// id 0, an id no tensor has and a cycle.
pub(super) fn walk(g: &WireGraph<'_>, ids: &Ids) -> Result<Reached, SessionError> {
    let mut mark = vec![Mark::New; g.tensors.len()];
    let mut order: Vec<u32> = Vec::new();
    let mut stack: Vec<(u32, usize)> = Vec::new();
    let mut nodes = Vec::with_capacity(g.node_ids.len());
    for (n, id) in g.node_ids.iter().enumerate() {
        let id = id.get();
        if id == 0 {
            return Err(SessionError::InvalidGraph(format!("node #{n} has id 0")));
        }
        let root = ids.get(id, "node")?;
        nodes.push(root);
        if mark[root as usize] != Mark::New {
            continue;
        }
        mark[root as usize] = Mark::Open;
        stack.push((root, 0));
        while let Some((cur, edge)) = stack.last_mut() {
            let (cur, e) = (*cur, *edge);
            if e == EDGES {
                mark[cur as usize] = Mark::Done;
                order.push(cur);
                stack.pop();
                continue;
            }
            *edge += 1;
            let Some(child) = edge_target(g.tensors, ids, cur, e)? else {
                continue;
            };
            match mark[child as usize] {
                Mark::Done => {}
                Mark::Open => {
                    return Err(SessionError::InvalidGraph(format!(
                        "cycle through tensor id {:#x}",
                        g.tensors[child as usize].id.get()
                    )))
                }
                Mark::New => {
                    mark[child as usize] = Mark::Open;
                    stack.push((child, 0));
                }
            }
        }
    }
    let local = order
        .iter()
        .enumerate()
        .map(|(li, &wi)| (wi, li as u32))
        .collect();
    Ok(Reached {
        order,
        local,
        nodes,
    })
}

/// The tensor edge `e` of tensor `cur` leads to (`src[e]`, or `view_src` for `e == 10`), if it is
/// followed. ggml_cast builds a CPY whose src[1] is the result itself (the destination of the
/// copy): that edge is not followed, not a cycle. Any other self-reference is.
fn edge_target(
    tensors: &[RpcTensor],
    ids: &Ids,
    cur: u32,
    e: usize,
) -> Result<Option<u32>, SessionError> {
    let t = &tensors[cur as usize];
    let id = if e < 10 {
        t.src[e].get()
    } else {
        t.view_src.get()
    };
    if id == 0 {
        return Ok(None);
    }
    let child = ids.get(id, "source")?;
    if child == cur && e == 1 && t.op.get() == ops::CPY {
        return Ok(None);
    }
    Ok(Some(child))
}

/// Which reached tensors compute reads or writes, by local index, and for each the first
/// tensor found reading it (for the error message).
pub(super) struct DataNeeds {
    pub(super) needed: Vec<bool>,
    pub(super) reader: Vec<Option<u32>>,
}

/// The computing nodes and, transitively, the `src[]` of every computing tensor need data. A
/// node that computes nothing (a view) needs data only if something reads it; view-like ops
/// (NONE, RESHAPE, VIEW, PERMUTE, TRANSPOSE) do not read their sources. A tensor reached only as
/// a `view_src` (e.g. a host input whose view was copied to this server) is never dereferenced
/// and may legitimately have no buffer here.
pub(super) fn needs_data(
    tensors: &[RpcTensor],
    ids: &Ids,
    reached: &Reached,
) -> Result<DataNeeds, SessionError> {
    let computes = |wi: u32| !ops::is_empty(tensors[wi as usize].op.get());
    let mut needed = vec![false; reached.len()];
    let mut reader: Vec<Option<u32>> = vec![None; reached.len()];
    for &wi in &reached.nodes {
        if let Some(&li) = reached.local.get(&wi) {
            if computes(wi) {
                needed[li as usize] = true;
            }
        }
    }
    // Users come after their sources in `order`: walking it backwards visits every reader
    // before what it reads.
    for (li, &wi) in reached.order.iter().enumerate().rev() {
        if !needed[li] || !computes(wi) {
            continue;
        }
        for s in tensors[wi as usize].src.iter() {
            if s.get() != 0 {
                let c = reached.local_of(ids, s.get())? as usize;
                needed[c] = true;
                reader[c].get_or_insert(wi);
            }
        }
    }
    Ok(DataNeeds { needed, reader })
}

/// The source and view links of each reached tensor, as local indices.
pub(super) fn link(
    tensors: &[RpcTensor],
    ids: &Ids,
    reached: &Reached,
) -> Result<Vec<GraphLinks>, SessionError> {
    let mut links = Vec::with_capacity(reached.len());
    for &wi in &reached.order {
        let t = &tensors[wi as usize];
        let mut l = GraphLinks::default();
        for (slot, s) in t.src.iter().enumerate() {
            if s.get() != 0 {
                l.src[slot] = Some(reached.local_of(ids, s.get())?);
            }
        }
        if t.view_src.get() != 0 {
            l.view_src = Some(reached.local_of(ids, t.view_src.get())?);
        }
        links.push(l);
    }
    Ok(links)
}

/// The nodes ggml's backends would run, as local indices, in the client's order. Those the
/// backends skip are left out of the graph, so that no backend can run them, and out of the
/// rules and index checks: those without the COMPUTE flag (the branches
/// `ggml_build_forward_select` did not select, e.g. llama.cpp 8.0's mixed token/embedding input,
/// whose row ids hold whatever the client left there) and those whose result has no element (a
/// batch of 0 rows, as llama-server sends: their strides collapse to 0).
pub(super) fn running_nodes(
    tensors: &[RpcTensor],
    reached: &Reached,
) -> Result<Vec<u32>, SessionError> {
    let runs = |t: &RpcTensor| {
        t.flags.get() & rpc_proto::TENSOR_FLAG_COMPUTE != 0 && t.ne.iter().all(|n| n.get() != 0)
    };
    reached
        .nodes
        .iter()
        .filter(|&&wi| runs(&tensors[wi as usize]))
        .map(|wi| {
            reached
                .local
                .get(wi)
                .copied()
                .ok_or_else(|| SessionError::InvalidGraph("node not materialized".into()))
        })
        .collect()
}
