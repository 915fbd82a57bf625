//! Rules of training ops: CROSS_ENTROPY_LOSS, CROSS_ENTROPY_LOSS_BACK, OPT_STEP_ADAMW,
//! OPT_STEP_SGD.

use super::*;

/// `GGML_TENSOR_FLAG_PARAM`.
use rpc_proto::TENSOR_FLAG_PARAM as FLAG_PARAM;

/// CROSS_ENTROPY_LOSS.
pub(super) fn cross_entropy_loss(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(
        same_shape(a, b) && a.ty() == ty::F32 && b.ty() == ty::F32,
        "CROSS_ENTROPY_LOSS sources"
    );
    ne_eq(d, [1, 1, 1, 1])?;
    ty_is(d, ty::F32, "result")?;
    nb0_is_ts(a, "src[0]")?;
    nb0_is_ts(b, "src[1]")?;
    ensure!(
        a.flat_rows_fit() && b.flat_rows_fit(),
        "CROSS_ENTROPY_LOSS row layout"
    );
    Ok(())
}

/// CROSS_ENTROPY_LOSS_BACK: its gradient.
pub(super) fn cross_entropy_loss_back(
    n: &Node<'_>,
    _cpu: bool,
    _checks: &mut Vec<IndexCheck>,
) -> R {
    let d = n.d;
    let g = n.s(0)?;
    let a = n.s(1)?;
    let b = n.s(2)?;
    n.none_from(3)?;
    ensure!(
        g.is_scalar() && same_shape(a, b) && same_shape(a, d),
        "CROSS_ENTROPY_LOSS_BACK shapes"
    );
    ensure!(
        d.contiguous() && a.contiguous() && b.contiguous() && g.contiguous(),
        "CROSS_ENTROPY_LOSS_BACK contiguity"
    );
    for (t, w) in [(d, "result"), (g, "grad"), (a, "src[1]"), (b, "src[2]")] {
        ty_is(t, ty::F32, w)?;
    }
    Ok(())
}

/// OPT_STEP_ADAMW and OPT_STEP_SGD: an in-place update of a parameter tensor.
pub(super) fn opt_step(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let op = d.op;
    let a = n.s(0)?;
    let grad = n.s(1)?;
    let (np, params) = if op == ops::OPT_STEP_ADAMW {
        (7, n.s(4)?)
    } else {
        (2, n.s(2)?)
    };
    ensure!(
        a.spec().flags & FLAG_PARAM != 0,
        "optimizer step on a tensor that is not a parameter"
    );
    // The kernels address the gradient (and AdamW's moments) with src[0]'s strides
    // (`ggml_compute_forward_opt_step_adamw_f32` / `_sgd_f32`, ops.cpp).
    ensure!(
        same_shape(a, grad) && same_stride(a, grad),
        "gradient shape and strides"
    );
    if op == ops::OPT_STEP_ADAMW {
        let (m, v) = (n.s(2)?, n.s(3)?);
        ensure!(
            same_shape(a, m) && same_shape(a, v) && same_stride(a, m) && same_stride(a, v),
            "moment shapes and strides"
        );
        n.none_from(5)?;
    } else {
        n.none_from(3)?;
    }
    ensure!(
        params.ty() == ty::F32 && params.nelements() == np && params.flat_fits(),
        "optimizer parameters"
    );
    ensure!(
        same_shape(a, d) && same_stride(a, d) && d.ty() == a.ty(),
        "optimizer step result must be a view of src[0]"
    );
    for i in 0..if op == ops::OPT_STEP_ADAMW { 4 } else { 2 } {
        let t = n.s(i)?;
        ty_is(t, ty::F32, "optimizer tensor")?;
        nb0_is_ts(t, "optimizer tensor")?;
        ensure!(
            t.flat_rows_fit() || t.contiguous_1(),
            "optimizer tensor layout"
        );
    }
    Ok(())
}
