//! Rules of the element-wise unary ops: SQR, SQRT, LOG, SIN, COS, UNARY (`unary-ops.cpp`), GLU,
//! CLAMP, LEAKY_RELU, SCALE, FILL, SILU_BACK.

use super::*;

/// `GGML_UNARY_OP_XIELU`.
const UNARY_XIELU: i32 = 17;

/// SQR, SQRT, LOG, SIN, COS (`unary-ops.cpp`).
pub(super) fn math(n: &Node<'_>, cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(same_shape(a, d), "result shape differs from src[0]");
    fresh_or_inplace(d, a)?;
    unary_kernel(a, d, cpu)?;
    Ok(())
}

/// SILU_BACK: the gradient of SILU.
pub(super) fn silu_back(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(same_shape(a, d) && same_shape(a, b), "SILU_BACK shapes");
    fresh(d)?;
    ensure!(
        a.contiguous_1() && b.contiguous_1(),
        "SILU_BACK needs contiguous rows"
    );
    ensure!(a.ty() == d.ty() && b.ty() == d.ty(), "SILU_BACK types");
    ty_in(d, &[ty::F32, ty::F16], "result")?;
    // Both kernels (`ggml_compute_forward_silu_back_f32/_f16`, ops.cpp) address row i < nrows of
    // every tensor as `i*nb[1]`: contiguity by ggml's definition leaves nb[1] free when ne[1] = 1.
    ensure!(
        d.flat_rows_fit() && a.flat_rows_fit() && b.flat_rows_fit(),
        "SILU_BACK row layout"
    );
    Ok(())
}

/// SCALE: `s * x + b`.
pub(super) fn scale(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(a.padded_1d(), "SCALE: src[0] must be padded 1d");
    ensure!(same_shape(a, d) && d.ty() == a.ty(), "SCALE result");
    ensure!(
        a.contiguous() && d.contiguous(),
        "SCALE needs contiguous tensors"
    );
    ty_in(a, &[ty::F32, ty::BF16], "src[0]")?;
    // `ggml_compute_forward_scale_f32/_bf16` (ops.cpp) address row i < nrows as `i*nb[1]`, which
    // ggml's contiguity leaves free when ne[1] = 1; with a bias (op_params[1] != 0) the f32
    // kernel reads src[0]'s rows with the *result's* nb[1].
    ensure!(d.flat_rows_fit() && a.flat_rows_fit(), "SCALE row layout");
    if d.op_f32(1) != 0.0 {
        ensure!(
            a.rows_fit_at(d.nb(1)),
            "SCALE: src[0] rows at the result's stride"
        );
    }
    Ok(())
}

/// CLAMP: values limited to `[min, max]`.
pub(super) fn clamp(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    like_src0(a, d)?;
    fresh_or_inplace(d, a)?;
    ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
    nb0_is_ts(a, "src[0]")?;
    nb0_is_ts(d, "result")?;
    // `ggml_compute_forward_clamp_f32` and `_f16` (ops.cpp) address row j < nrows as `j*nb[1]`.
    ensure!(a.flat_rows_fit() && d.flat_rows_fit(), "CLAMP row layout");
    Ok(())
}

/// LEAKY_RELU: CLAMP's rule, and rows addressed over all rows.
pub(super) fn leaky_relu(n: &Node<'_>, cpu: bool, checks: &mut Vec<IndexCheck>) -> R {
    clamp(n, cpu, checks)?;
    let (d, a) = (n.d, n.s(0)?);
    ensure!(
        a.flat_rows_fit() && d.flat_rows_fit(),
        "LEAKY_RELU row layout"
    );
    Ok(())
}

/// UNARY: the `ggml_unary_op` activations (op_params[0] says which).
pub(super) fn unary(n: &Node<'_>, cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(
        (0..22).contains(&d.op_i32(0)),
        "unknown unary op {}",
        d.op_i32(0)
    );
    ensure!(a.contiguous_rows(), "UNARY: src[0] rows must be contiguous");
    ensure!(same_shape(a, d), "result shape differs from src[0]");
    ensure!(d.ty() == a.ty() || d.contiguous(), "UNARY result");
    unary_kernel(a, d, cpu)?;
    if d.op_i32(0) == UNARY_XIELU {
        // XIELU goes through `apply_unary_op_functor` (unary-ops.cpp), which asserts
        // `ggml_is_contiguous_1` of both tensors; the other activations take any row strides.
        ensure!(
            a.contiguous_1() && d.contiguous_1(),
            "UNARY XIELU needs contiguous tensors"
        );
    }
    Ok(())
}

/// GLU: gated activations (op_params[0] says which), split or with a separate gate src[1].
pub(super) fn glu(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(2)?;
    ensure!(
        (0..7).contains(&d.op_i32(0)),
        "unknown GLU op {}",
        d.op_i32(0)
    );
    ensure!(matches!(d.op_i32(1), 0 | 1), "GLU swapped flag");
    ensure!(a.contiguous_1(), "GLU: src[0] must be contiguous");
    if let Some(b) = n.src[1] {
        ensure!(
            b.contiguous_1() && same_shape(a, b) && a.ty() == b.ty(),
            "GLU: src[1]"
        );
        ne_eq(d, [a.ne(0), a.ne(1), a.ne(2), a.ne(3)])?;
    } else {
        ne_eq(d, [a.ne(0) / 2, a.ne(1), a.ne(2), a.ne(3)])?;
    }
    ensure!(d.ty() == a.ty(), "GLU keeps the type");
    ensure!(d.contiguous_1(), "GLU: result must be contiguous");
    ty_in(a, &[ty::F32, ty::F16, ty::BF16], "src[0]")?;
    match d.op_i32(0) {
        3 => ty_is(a, ty::F32, "src[0]")?, // SWIGLU_OAI: f32 kernel only
        6 => ty_in(a, &[ty::F32, ty::F16], "src[0]")?, // SWIGLU_CLAMP: f32, f16
        _ => {}
    }
    Ok(())
}

/// FILL: every element set to one value.
pub(super) fn fill(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
    ensure!(a.contiguous(), "FILL: src[0] must be contiguous");
    ensure!(same_shape(a, d) && d.ty() == a.ty(), "FILL result");
    fresh_or_inplace(d, a)?;
    nb0_is_ts(d, "result")?;
    Ok(())
}

/// Rules of `unary-ops.cpp` (SQR, SQRT, LOG, SIN, COS, UNARY).
fn unary_kernel(a: &TensorSpec, d: &TensorSpec, cpu: bool) -> R {
    nb0_is_ts(a, "src[0]")?;
    nb0_is_ts(d, "result")?;
    ensure!(
        a.contiguous_rows() && d.contiguous_rows(),
        "rows must be contiguous"
    );
    if cpu {
        let ok = matches!(
            (a.ty(), d.ty()),
            (ty::F32, ty::F32)
                | (ty::F16, ty::F16)
                | (ty::BF16, ty::BF16)
                | (ty::BF16, ty::F32)
                | (ty::F16, ty::F32)
        );
        ensure!(ok, "unsupported types {} -> {}", a.ty(), d.ty());
    }
    Ok(())
}
