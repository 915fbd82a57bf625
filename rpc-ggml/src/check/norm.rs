//! Rules of normalisations and soft_max: NORM, RMS_NORM, L2_NORM, GROUP_NORM, RMS_NORM_BACK,
//! SOFT_MAX, SOFT_MAX_BACK, DIAG_MASK_INF, DIAG_MASK_ZERO.

use super::*;

/// NORM, RMS_NORM, L2_NORM, GROUP_NORM.
pub(super) fn norm(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let op = d.op;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(same_shape(a, d), "result shape differs from src[0]");
    fresh_or_inplace(d, a)?;
    ty_is(a, ty::F32, "src[0]")?;
    ty_is(d, ty::F32, "result")?;
    if op == ops::RMS_NORM || op == ops::GROUP_NORM {
        // NORM and L2_NORM go through the strides; these two read rows as float arrays.
        nb0_is_ts(a, "src[0]")?;
    }
    let eps = if op == ops::GROUP_NORM {
        d.op_f32(1)
    } else {
        d.op_f32(0)
    };
    ensure!(eps >= 0.0, "negative eps");
    if op == ops::GROUP_NORM {
        // `ggml_compute_forward_group_norm_f32` (ops.cpp) loops over op_params[0] groups of
        // ceil(ne2/groups) channels in `int`: groups past the channel count are empty but still
        // iterated (INT_MAX of them run for minutes), and `ne2 + groups - 1` must not overflow.
        let groups = d.op_i32(0) as i64;
        ensure!(
            groups > 0 && groups <= a.ne(2) && a.ne(2) + groups - 1 <= i32::MAX as i64,
            "GROUP_NORM: {groups} groups for {} channels",
            a.ne(2)
        );
    }
    Ok(())
}

/// RMS_NORM_BACK: the gradient of RMS_NORM.
pub(super) fn rms_norm_back(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(same_shape(a, d) && same_shape(a, b), "RMS_NORM_BACK shapes");
    fresh(d)?;
    f32_rows(&[(d, "result"), (a, "src[0]"), (b, "src[1]")])?;
    Ok(())
}

/// DIAG_MASK_INF and DIAG_MASK_ZERO: the causal mask of the old soft_max path.
pub(super) fn diag_mask(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    like_src0(a, d)?;
    ensure!(d.op_i32(0) >= 0, "negative n_past");
    ty_is(a, ty::F32, "src[0]")?;
    ensure!(
        a.contiguous() && d.contiguous(),
        "DIAG_MASK needs contiguous tensors"
    );
    // `ggml_compute_forward_diag_mask_f32` (ops.cpp) asserts both nb[0] are 4 (free in ggml's
    // contiguity when ne[0] = 1) and masks plane k < ne2*ne3 at `k*nb[2]` (free when ne[2] = 1).
    f32_rows(&[(d, "result"), (a, "src[0]")])?;
    ensure!(d.flat_planes_fit(), "DIAG_MASK plane layout");
    Ok(())
}

/// SOFT_MAX (`ggml_soft_max_ext`): with an optional mask and sinks.
pub(super) fn soft_max(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(3)?;
    ensure!(a.contiguous(), "SOFT_MAX: src[0] must be contiguous");
    ensure!(same_shape(a, d), "result shape differs from src[0]");
    fresh_or_inplace(d, a)?;
    ty_is(a, ty::F32, "src[0]")?;
    ty_is(d, ty::F32, "result")?;
    let covers = |m: &TensorSpec| {
        ensure!(
            m.ne(0) == a.ne(0) && m.ne(1) >= a.ne(1),
            "SOFT_MAX: mask {:?} for {:?}",
            m.ne,
            a.ne
        );
        Ok(())
    };
    let mask = n.src[1];
    mask_and_sinks(
        "SOFT_MAX",
        d,
        a,
        mask,
        &[ty::F16, ty::F32],
        covers,
        n.src[2],
    )
}

/// SOFT_MAX_BACK: the gradient of SOFT_MAX.
pub(super) fn soft_max_back(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(same_shape(a, d) && same_shape(b, d), "SOFT_MAX_BACK shapes");
    ensure!(
        a.contiguous() && b.contiguous() && d.contiguous(),
        "SOFT_MAX_BACK needs contiguous tensors"
    );
    for (t, w) in [(d, "result"), (a, "src[0]"), (b, "src[1]")] {
        ty_is(t, ty::F32, w)?;
    }
    ensure!(d.op_f32(1) == 0.0, "SOFT_MAX_BACK: max_bias must be 0");
    Ok(())
}
