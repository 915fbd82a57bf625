//! Rules of the element-wise binary ops: ADD, SUB, MUL, DIV (`binary-ops.cpp`), ADD_ID, ADD1.

use super::*;

/// ADD, SUB, MUL, DIV: element-wise with src[1] broadcast over src[0] (`binary-ops.cpp`), and ADD of a quantized src[0] (`ggml_add_cast`).
pub(super) fn arithmetic(n: &Node<'_>, cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let op = d.op;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(same_shape(a, d), "result shape differs from src[0]");
    if a.quantized() {
        // add_q_f32 (ggml_add_cast): same shapes, src1 f32.
        ensure!(op == ops::ADD, "only ADD takes a quantized src[0]");
        ensure!(
            same_shape(a, b),
            "ADD of a quantized tensor needs equal shapes"
        );
        ty_is(b, ty::F32, "src[1]")?;
        nb0_is_ts(a, "src[0]")?;
        nb0_is_ts(b, "src[1]")?;
        strides_increase(d)?;
        // Rows are dequantized, added, and converted back with the result type's
        // from_float, or copied as `ne0*nb0` bytes of f32 when it has none.
        ensure!(
            type_info(a.ty()).is_some_and(|i| i.has_to_float),
            "no dequantization for type {}",
            a.ty()
        );
        ensure!(
            d.ty() == ty::F32 || type_info(d.ty()).is_some_and(|i| i.cpu_from_float),
            "no conversion to the result type"
        );
        ensure!(
            d.ne(0) % d.blck() == 0 && d.contiguous_rows(),
            "result rows"
        );
    } else {
        ensure!(can_repeat(b, a), "src[1] cannot be broadcast to src[0]");
        if d.ty() == a.ty() {
            fresh_or_inplace(d, a)?;
        } else {
            fresh(d)?;
        }
        nb0_is_ts(d, "result")?;
        nb0_is_ts(a, "src[0]")?;
        if cpu {
            binary_types(a.ty(), b.ty(), d.ty())?;
        }
    }
    Ok(())
}

/// ADD_ID: src[0] plus the rows of src[1] that ids select.
pub(super) fn add_id(n: &Node<'_>, _cpu: bool, checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    let ids = n.s(2)?;
    n.none_from(3)?;
    ensure!(
        a.ne(0) == b.ne(0) && a.ne(1) == ids.ne(0) && a.ne(2) == ids.ne(1),
        "ADD_ID shapes"
    );
    ty_is(ids, ty::I32, "ids")?;
    ensure!(same_shape(a, d), "result shape differs from src[0]");
    fresh(d)?;
    f32_rows(&[(d, "result"), (a, "src[0]"), (b, "src[1]")])?;
    checks.push(IndexCheck {
        tensor: n.idx(2),
        type_: ty::I32,
        bound: b.ne(1) as u64,
        what: "ADD_ID row of src[1]",
    });
    rows_of(ids, 1)?;
    Ok(())
}

/// ADD1: src[0] plus a scalar.
pub(super) fn add1(n: &Node<'_>, cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(b.is_scalar(), "src[1] must be a scalar");
    ensure!(a.padded_1d(), "src[0] must be padded 1d");
    ensure!(same_shape(a, d), "result shape differs from src[0]");
    fresh_or_inplace(d, a)?;
    nb0_is_ts(d, "result")?;
    if cpu {
        let ok = matches!(
            (a.ty(), b.ty(), d.ty()),
            (ty::F32, ty::F32, ty::F32)
                | (ty::F16, ty::F32, ty::F16)
                | (ty::F16, ty::F16, ty::F16)
                | (ty::BF16, ty::F32, ty::BF16)
                | (ty::BF16, ty::BF16, ty::BF16)
        ) || (a.quantized() && a.ty() == d.ty() && b.ty() == ty::F32);
        ensure!(ok, "ADD1 types");
        if a.quantized() {
            strides_increase(d)?;
        }
    }
    Ok(())
}

/// Type combinations of `binary-ops.cpp`.
fn binary_types(a: u32, b: u32, d: u32) -> R {
    let ok = matches!(
        (a, b, d),
        (ty::F32, ty::F32, ty::F32)
            | (ty::F16, ty::F16, ty::F16)
            | (ty::BF16, ty::BF16, ty::BF16)
            | (ty::BF16, ty::F32, ty::BF16)
            | (ty::BF16, ty::F32, ty::F32)
            | (ty::F16, ty::F32, ty::F16)
            | (ty::F16, ty::F32, ty::F32)
    );
    ensure!(ok, "unsupported types {a}, {b} -> {d}");
    Ok(())
}

/// The ids of ADD_ID are read as `ids[i1*nb20 + i2*nb21]`: a 2d tensor with its own strides.
fn rows_of(t: &TensorSpec, _dims: usize) -> R {
    ensure!(t.ne(2) == 1 && t.ne(3) == 1, "ids must be 2d");
    Ok(())
}
