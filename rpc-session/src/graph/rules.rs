//! The validator's rules applied to a resolved graph: views inside what they view, then each
//! running node's op rule, which also names the index tensors whose contents must be checked.

use super::validate::{self, IndexCheck};
use super::{Resolved, SessionError};
use rpc_ggml::ops;

/// Every view stays inside the tensor it views.
pub(super) fn check_views(r: &Resolved<'_>) -> Result<(), SessionError> {
    for (li, l) in r.links.iter().enumerate() {
        if let Some(v) = l.view_src {
            validate::check_view(&r.specs[li], &r.specs[v as usize])
                .map_err(|e| SessionError::tensor(r.wire(li), e))?;
        }
    }
    Ok(())
}

/// Applies the op rule of every running node that computes something (`nodes`: local indices);
/// returns the index checks they need, each with the position in `nodes` of the node that reads
/// the index tensor.
pub(super) fn check_rules(
    r: &Resolved<'_>,
    nodes: &[u32],
    cpu: bool,
) -> Result<Vec<(usize, IndexCheck)>, SessionError> {
    let mut pending = Vec::new();
    for (pos, &ni) in nodes.iter().enumerate() {
        let d = &r.specs[ni as usize];
        if ops::is_empty(d.op) {
            continue;
        }
        let l = &r.links[ni as usize];
        let mut src = [None; 10];
        for (slot, s) in l.src.iter().enumerate() {
            src[slot] = s.map(|i| &r.specs[i as usize]);
        }
        let node = validate::Node {
            d,
            src,
            src_idx: l.src,
        };
        let checks = validate::check_node(&node, cpu).map_err(|e| {
            SessionError::tensor(
                r.wire(ni as usize),
                format!("{} node: {e}", ops::name(d.op).unwrap_or_default()),
            )
        })?;
        pending.extend(checks.into_iter().map(|c| (pos, c)));
    }
    Ok(pending)
}
