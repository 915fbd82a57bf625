//! Rules of matrix products and matrix-shaped ops: MUL_MAT, MUL_MAT_ID, OUT_PROD, and DIAG, TRI,
//! SOLVE_TRI.

use super::*;

/// MUL_MAT (`ggml_mul_mat`).
pub(super) fn mul_mat(n: &Node<'_>, cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(
        a.ne(0) == b.ne(0) && divides(a.ne(2), b.ne(2)) && divides(a.ne(3), b.ne(3)),
        "MUL_MAT: src[0] {:?} and src[1] {:?} cannot be multiplied",
        a.ne,
        b.ne
    );
    ensure!(!a.transposed(), "MUL_MAT: src[0] is transposed");
    ne_eq(d, [a.ne(1), b.ne(1), b.ne(2), b.ne(3)])?;
    ty_is(d, ty::F32, "result")?;
    nb0_is_ts(d, "result")?;
    strides_increase(d)?;
    ensure!(d.flat_fits() || d.contiguous_rows(), "result layout");
    nb0_is_ts(a, "src[0]")?;
    nb0_is_ts(b, "src[1]")?;
    if cpu {
        mul_mat_types(a.ty(), b.ty())?;
        q8_k_rows_at_nb1("MUL_MAT", b)?;
    }
    // op_params[1] == GGML_HINT_SRC0_IS_HADAMARD (`ggml_mul_mat_set_hint`): the CPU kernel does not
    // multiply but runs a fast Walsh-Hadamard transform of each src[1] row
    // (`ggml_compute_forward_fwht`, ops.cpp): it writes ne10 floats into a result row of ne01,
    // reads src[1] as f32 or f16 and asserts a power-of-two length. src[0] is the square
    // Hadamard matrix.
    if d.op_i32(1) == 1 {
        ensure!(
            a.ty() == ty::F32 && matches!(b.ty(), ty::F32 | ty::F16),
            "MUL_MAT Hadamard hint: types"
        );
        ensure!(
            a.ne(0) == a.ne(1) && a.ne(0) > 0 && a.ne(0) & (a.ne(0) - 1) == 0,
            "MUL_MAT Hadamard hint: src[0] must be a square power-of-two matrix"
        );
    }
    Ok(())
}

/// MUL_MAT_ID: one expert matrix per row, chosen by ids (mixture of experts).
pub(super) fn mul_mat_id(n: &Node<'_>, cpu: bool, checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    let ids = n.s(2)?;
    n.none_from(3)?;
    ensure!(!a.transposed(), "MUL_MAT_ID: src[0] is transposed");
    ty_is(ids, ty::I32, "ids")?;
    ensure!(a.ne(3) == 1 && b.ne(3) == 1, "MUL_MAT_ID needs 3d sources");
    ensure!(
        ids.ne(2) == 1 && ids.ne(3) == 1,
        "MUL_MAT_ID ids must be 2d"
    );
    ensure!(
        ids.ne(1) == b.ne(2),
        "MUL_MAT_ID: one expert list per src[1] row"
    );
    ensure!(
        a.ne(0) == b.ne(0),
        "MUL_MAT_ID: src[0] and src[1] cannot be multiplied"
    );
    ensure!(
        divides(b.ne(1), ids.ne(0)),
        "MUL_MAT_ID: src[1] cannot be broadcast to ids"
    );
    ensure!(a.ne(2) > 0, "MUL_MAT_ID: no experts");
    ne_eq(d, [a.ne(1), ids.ne(0), b.ne(2), 1])?;
    ty_is(d, ty::F32, "result")?;
    nb0_is_ts(d, "result")?;
    strides_increase(d)?;
    nb0_is_ts(a, "src[0]")?;
    nb0_is_ts(b, "src[1]")?;
    if cpu {
        mul_mat_types(a.ty(), b.ty())?;
        q8_k_rows_at_nb1("MUL_MAT_ID", b)?;
    }
    checks.push(IndexCheck {
        tensor: n.idx(2),
        type_: ty::I32,
        bound: a.ne(2) as u64,
        what: "MUL_MAT_ID expert",
    });
    Ok(())
}

/// OUT_PROD: outer products of columns.
pub(super) fn out_prod(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(
        a.ne(1) == b.ne(1) && divides(a.ne(2), b.ne(2)) && divides(a.ne(3), b.ne(3)),
        "OUT_PROD shapes"
    );
    ensure!(!a.transposed(), "OUT_PROD: src[0] is transposed");
    ne_eq(d, [a.ne(0), b.ne(0), b.ne(2), b.ne(3)])?;
    ty_is(d, ty::F32, "result")?;
    ty_is(b, ty::F32, "src[1]")?;
    nb0_is_ts(d, "result")?;
    // The kernels first zero the result as a flat array of nelements floats
    // (`ggml_vec_set_f32(ne0*ne1*ne2*ne3, dst->data, 0)`, ops.cpp).
    ensure!(d.flat_fits(), "OUT_PROD result layout");
    nb0_is_ts(a, "src[0]")?;
    if a.ty() != ty::F32 {
        ensure!(a.ty() == ty::F16 || a.quantized(), "OUT_PROD src[0] type");
        ensure!(
            a.ne(2) == b.ne(2) && a.ne(3) == b.ne(3),
            "OUT_PROD of f16/quantized does not broadcast"
        );
        ensure!(
            a.ty() == ty::F16 || type_info(a.ty()).is_some_and(|i| i.has_to_float),
            "OUT_PROD: no dequantization"
        );
    }
    Ok(())
}

/// DIAG: a row made into a diagonal matrix.
pub(super) fn diag(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(a.ne(1) == 1, "DIAG: src[0] must be a row");
    ne_eq(d, [a.ne(0), a.ne(0), a.ne(2), a.ne(3)])?;
    ensure!(d.ty() == a.ty(), "DIAG keeps the type");
    ty_is(a, ty::F32, "src[0]")?;
    nb0_is_ts(a, "src[0]")?;
    fresh(d)?;
    // Asserted by `ggml_compute_forward_diag_f32`; free in ggml's contiguity when ne[0] = 1.
    nb0_is_ts(d, "result")?;
    Ok(())
}

/// TRI: the lower or upper triangle of square matrices.
pub(super) fn tri(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(
        a.ty() == ty::F32 && a.contiguous() && a.ne(0) == a.ne(1),
        "TRI source"
    );
    ensure!((0..4).contains(&d.op_i32(0)), "TRI type");
    ensure!(same_shape(a, d) && d.ty() == ty::F32, "TRI result");
    fresh(d)?;
    Ok(())
}

/// SOLVE_TRI: triangular systems solved for the columns of src[1].
pub(super) fn solve_tri(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(
        a.ty() == ty::F32 && b.ty() == ty::F32 && a.contiguous() && b.contiguous(),
        "SOLVE_TRI sources"
    );
    ensure!(
        a.ne(0) == a.ne(1) && a.ne(1) == b.ne(1) && a.ne(2) == b.ne(2) && a.ne(3) == b.ne(3),
        "SOLVE_TRI shapes"
    );
    ensure!(same_shape(b, d) && d.ty() == ty::F32, "SOLVE_TRI result");
    fresh(d)?;
    Ok(())
}

/// A Q8_K `src1` (read in place: it is already the dot product's type of the K-quant and i-quant
/// `src0` types) has its rows every `nb[1]` bytes. The tiled kernels (`ggml-cpu/tiled/tiled.cpp`,
/// taken for those `src0` types from 8 `src1` rows on) address `src1` row `r` at `r*nb[1]`,
/// counting rows across dims 1..3 as one sequence (MUL_MAT: the flattened row index; MUL_MAT_ID:
/// `i11 + i12*ne11`), and never look at `nb[2]`/`nb[3]`. Their gate means to leave a
/// non-contiguous Q8_K `src1` to the strided vec_dot path, but that test sits after the `src0`
/// type switch has returned (`ggml_tiled_supported`) and never runs; and ggml's contiguity leaves
/// `nb[1]` free when `ne[1]` = 1, which MUL_MAT_ID's routed rows still step by. So the rows of
/// dims 1..3 must be evenly spaced by `nb[1]`: `ggml_is_contiguous_1`. (Stock clients send f32
/// activations, which the kernels first pack into their own work buffer.)
fn q8_k_rows_at_nb1(op: &str, b: &TensorSpec) -> R {
    ensure!(
        b.ty() != ty::Q8_K || b.contiguous_1(),
        "{op}: a Q8_K src[1] is read by the tiled kernel as rows every nb[1] bytes; ne {:?} nb {:?} \
         are not",
        b.ne,
        b.nb
    );
    Ok(())
}

/// `src0` needs a CPU dot product; `src1` is f32, bf16 widened, or the dot product's type.
fn mul_mat_types(a: u32, b: u32) -> R {
    let ai = type_info(a).ok_or("type")?;
    ensure!(ai.cpu_vec_dot, "no CPU dot product for type {a}");
    let vdt = ai.vec_dot_type;
    let conv = type_info(vdt).is_some_and(|i| i.cpu_from_float);
    ensure!(
        b == ty::F32 && (vdt == ty::F32 || conv)
            || b == vdt
            || (b == ty::BF16 && vdt == ty::F32)
            || (b == ty::F16 && vdt == ty::F32),
        "src[1] type {b} cannot be multiplied with type {a}"
    );
    Ok(())
}
