//! The checks applied to a graph's tensors before it is built: indices in range, every tensor
//! compute touches in a buffer, views inside what they view, then each running node's op rule,
//! which also names the index tensors whose contents must be checked.

use super::{check_node, check_view, IndexCheck, Node, Refusal};
use crate::ops;
use crate::tensor::TensorSpec;

/// Source and view links of one tensor, as indices into the graph's tensor list.
#[derive(Debug, Clone, Copy, Default)]
pub struct GraphLinks {
    pub src: [Option<u32>; 10],
    pub view_src: Option<u32>,
}

/// What is wrong with a graph's structure (before any rule): the caller's bookkeeping, not the
/// network's (the session builds links and nodes from the tensors it indexed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Structure {
    /// `links` does not have one entry per tensor.
    Links { tensors: usize, links: usize },
    /// A link or node names a tensor that does not exist.
    BadIndex(u32),
    /// A running node that computes, or a source of one, is in no buffer: its kernel would
    /// dereference a NULL data pointer.
    Unbacked(u32),
}

/// Every link and node names a tensor of `specs`; every computing node and its sources are in
/// buffers.
pub(crate) fn check_structure(
    specs: &[TensorSpec],
    links: &[GraphLinks],
    nodes: &[u32],
) -> Result<(), Structure> {
    if links.len() != specs.len() {
        return Err(Structure::Links {
            tensors: specs.len(),
            links: links.len(),
        });
    }
    let n = specs.len();
    let known = |i: u32| {
        if (i as usize) < n {
            Ok(i)
        } else {
            Err(Structure::BadIndex(i))
        }
    };
    for l in links {
        for s in l.src.iter().flatten().chain(l.view_src.iter()) {
            known(*s)?;
        }
    }
    for &ni in nodes {
        known(ni)?;
        if ops::is_empty(specs[ni as usize].op) {
            continue;
        }
        let touched = std::iter::once(ni).chain(links[ni as usize].src.iter().flatten().copied());
        for t in touched {
            if specs[t as usize].buffer.is_none() {
                return Err(Structure::Unbacked(t));
            }
        }
    }
    Ok(())
}

/// Every view stays inside the tensor it views. Refused: the view's index and why.
pub(crate) fn check_views(
    specs: &[TensorSpec],
    links: &[GraphLinks],
) -> Result<(), (u32, Refusal)> {
    for (li, l) in links.iter().enumerate() {
        if let Some(v) = l.view_src {
            check_view(&specs[li], &specs[v as usize]).map_err(|e| (li as u32, e))?;
        }
    }
    Ok(())
}

/// Applies the op rule of every running node that computes something (`nodes`: indices into
/// `specs`, after [`check_structure`]); returns the index checks they need, each with the
/// position in `nodes` of the node that reads the index tensor. Refused: the node's index and
/// why, prefixed with its op ("MUL_MAT node: ...").
pub(crate) fn check_rules(
    specs: &[TensorSpec],
    links: &[GraphLinks],
    nodes: &[u32],
    cpu: bool,
) -> Result<Vec<(usize, IndexCheck)>, (u32, Refusal)> {
    let mut pending = Vec::new();
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
        let node = Node {
            d,
            src,
            src_idx: l.src,
        };
        let checks = check_node(&node, cpu).map_err(|e| {
            (
                ni,
                e.about(&format!("{} node", ops::name(d.op).unwrap_or_default())),
            )
        })?;
        pending.extend(checks.into_iter().map(|c| (pos, c)));
    }
    Ok(pending)
}
