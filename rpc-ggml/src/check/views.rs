//! Views and aliasing: a view stays inside the memory of the tensor it views, and a result does
//! not partly overlap one of its sources.

use super::*;

/// A view of `src` (VIEW/RESHAPE/PERMUTE/TRANSPOSE/NONE with `view_src`, or an in-place result)
/// must stay inside the memory of the tensor it views when both live in buffers.
pub(crate) fn check_view(view: &TensorSpec, src: &TensorSpec) -> R {
    let (Some((vb, voff)), Some((sb, soff))) = (&view.buffer, &src.buffer) else {
        return Ok(());
    };
    let vsize = view.nbytes();
    if vsize == 0 {
        return Ok(());
    }
    ensure!(
        vb == sb,
        Rule::ViewBounds; "view and its view_src are in different buffers"
    );
    let (v0, s0) = (*voff as u128, *soff as u128);
    ensure!(
        v0 >= s0 && v0 + vsize <= s0 + src.nbytes(),
        Rule::ViewBounds; "view [{v0}, +{vsize}) outside its view_src [{s0}, +{})",
        src.nbytes()
    );
    Ok(())
}

/// The result may be computed in place (same memory as a source, from the same address, as
/// ggml's in-place ops and ggml-alloc's buffer reuse do), or in memory no source occupies; a
/// result that starts inside a source's memory elsewhere makes the kernels copy between overlapping
/// ranges (undefined behaviour, found by fuzzing: `memcpy` in RMS_NORM).
pub(super) fn check_no_partial_overlap(n: &Node<'_>) -> R {
    let Some((db, doff)) = &n.d.buffer else {
        return Ok(());
    };
    let dlen = n.d.nbytes();
    for (i, s) in n.src.iter().enumerate() {
        let Some(s) = s else { continue };
        let Some((sb, soff)) = &s.buffer else {
            continue;
        };
        if db != sb || soff == doff {
            continue;
        }
        let (d0, s0) = (*doff as u128, *soff as u128);
        let slen = s.nbytes();
        ensure!(
            d0 + dlen <= s0 || s0 + slen <= d0 || dlen == 0 || slen == 0,
            Rule::PartialOverlap; "result partially overlaps src[{i}]"
        );
    }
    Ok(())
}
