//! Rules of the copy family: DUP, CONT, CPY (with type conversion, `ggml_compute_forward_dup*`),
//! ACC and SET (writes into a view), REPEAT, REPEAT_BACK, CONCAT.

use super::*;

/// DUP and CONT: a copy of the same type, DUP possibly in place, CONT into a fresh tensor.
pub(super) fn dup_cont(n: &Node<'_>, cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let op = d.op;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(a.nelements() == d.nelements(), "element counts differ");
    ensure!(a.ty() == d.ty(), "DUP/CONT keep the type");
    if op == ops::DUP {
        fresh_or_inplace(d, a)?;
    } else {
        fresh(d)?;
    }
    copy_rules(a, d, cpu)?;
    Ok(())
}

/// CPY (`ggml_cpy`, `ggml_cast`): a copy into src[1], with type conversion.
pub(super) fn cpy(n: &Node<'_>, cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    // The result is a view of b (ggml_cpy) or b itself (ggml_cast); kernels write through
    // the result with b's shape and strides.
    ensure!(
        same_shape(b, d) && same_stride(b, d) && b.ty() == d.ty(),
        "CPY result must be its destination src[1]"
    );
    ensure!(
        a.nelements() == d.nelements(),
        "element counts differ ({} vs {})",
        a.nelements(),
        d.nelements()
    );
    copy_rules(a, d, cpu)?;
    Ok(())
}

/// ACC and SET: src[1] added to / written into a strided view of src[0], placed by op_params.
pub(super) fn acc_set(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let op = d.op;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(b.nelements() <= a.nelements(), "src[1] larger than src[0]");
    ensure!(same_shape(a, d), "result shape differs from src[0]");
    ensure!(
        a.contiguous() && d.contiguous(),
        "ACC/SET need contiguous tensors"
    );
    let esz: u64 = match (op, a.ty()) {
        (ops::ACC, ty::F32) => 4,
        (ops::SET, ty::F32) | (ops::SET, ty::I32) => 4,
        _ => return Err("ACC/SET type".into()),
    };
    ensure!(b.ty() == a.ty() && d.ty() == a.ty(), "ACC/SET types differ");
    nb0_is_ts(b, "src[1]")?;
    // op_params: nb1, nb2, nb3, offset (int32, used as size_t), inplace.
    let p: Vec<i64> = (0..4).map(|i| d.op_i32(i) as i64).collect();
    ensure!(
        p.iter().all(|&x| x >= 0),
        "negative stride or offset in op_params"
    );
    let mut last: i128 = p[3] as i128;
    last += (b.ne(0).max(1) - 1) as i128 * esz as i128;
    for i in 1..4 {
        last += (b.ne(i).max(1) - 1) as i128 * p[i - 1] as i128;
    }
    ensure!(
        last + esz as i128 <= d.nbytes() as i128,
        "ACC/SET writes past the result"
    );
    ensure!(
        last + esz as i128 <= a.nbytes() as i128,
        "ACC/SET reads past src[0]"
    );
    ensure!(matches!(d.op_i32(4), 0 | 1), "inplace flag");
    if d.op_i32(4) == 1 {
        ensure!(
            d.spec().buffer.as_ref().map(|x| x.1) == a.spec().buffer.as_ref().map(|x| x.1),
            "in-place ACC/SET must alias src[0]"
        );
    }
    Ok(())
}

/// REPEAT: src[0] tiled to the result's shape.
pub(super) fn repeat(n: &Node<'_>, cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(can_repeat(a, d), "src[0] cannot be repeated to the result");
    ensure!(d.ty() == a.ty(), "REPEAT keeps the type");
    fresh(d)?;
    if cpu {
        ty_in(a, &[ty::F32, ty::F16, ty::BF16, ty::I16, ty::I32], "src[0]")?;
        // `ggml_compute_forward_repeat_f32/_f16` assert both nb[0] are the element size (the
        // result's is free in ggml's contiguity when ne[0] = 1).
        nb0_is_ts(a, "src[0]")?;
        nb0_is_ts(d, "result")?;
    }
    Ok(())
}

/// REPEAT_BACK: the gradient of REPEAT, summed back to the smaller shape.
pub(super) fn repeat_back(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(can_repeat(d, a), "result cannot be repeated to src[0]");
    ensure!(d.ty() == a.ty(), "REPEAT_BACK keeps the type");
    fresh(d)?;
    ty_is(a, ty::F32, "src[0]")?;
    // Both nb[0] asserted (`ggml_compute_forward_repeat_back_f32`).
    nb0_is_ts(a, "src[0]")?;
    nb0_is_ts(d, "result")?;
    Ok(())
}

/// CONCAT: two tensors joined along one dimension.
pub(super) fn concat(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    let dim = d.op_i32(0);
    ensure!((0..4).contains(&dim), "CONCAT dim {dim}");
    let dim = dim as usize;
    ensure!(a.ty() == b.ty() && d.ty() == a.ty(), "CONCAT types differ");
    let mut want = [0i64; 4];
    for (i, w) in want.iter_mut().enumerate() {
        if i == dim {
            *w = a.ne(i) + b.ne(i);
        } else {
            ensure!(a.ne(i) == b.ne(i), "CONCAT shapes differ in dim {i}");
            *w = a.ne(i);
        }
    }
    ne_eq(d, want)?;
    fresh(d)?;
    // The f32/f16/i8-sized kernels copy element by element through the strides; the
    // generic one copies whole rows.
    if !matches!(
        a.ty(),
        ty::F32 | ty::I32 | ty::F16 | ty::BF16 | ty::I16 | ty::I8
    ) {
        ensure!(
            a.contiguous_rows() && b.contiguous_rows(),
            "CONCAT sources need contiguous rows"
        );
    }
    Ok(())
}

/// Rules of the copy kernels (`ggml_compute_forward_dup*`).
fn copy_rules(a: &TensorSpec, d: &TensorSpec, cpu: bool) -> R {
    if !cpu {
        return Ok(());
    }
    if a.ty() == d.ty() {
        // dup_bytes copies whole blocks.
        ensure!(
            !a.quantized() || (a.ne(0) % a.blck() == 0 && d.ne(0) % d.blck() == 0),
            "partial blocks"
        );
        return Ok(());
    }
    match (a.ty(), d.ty()) {
        (ty::F16 | ty::BF16 | ty::F32, ty::F16 | ty::BF16 | ty::F32)
        | (ty::F32, ty::I32)
        | (ty::I32, ty::F32) => Ok(()),
        (ty::F16 | ty::BF16 | ty::F32, q) if type_info(q).is_some_and(|i| i.is_quantized) => {
            // dup_to_q: contiguous destination, one quantized row per source row.
            let qi = type_info(q).ok_or("type")?;
            ensure!(qi.cpu_from_float, "no conversion to type {q}");
            ensure!(
                d.contiguous() && a.nb(0) == a.ts(),
                "copy to a quantized type needs a contiguous destination"
            );
            ensure!(
                a.ne(0) % qi.blck_size as i64 == 0,
                "source rows are not whole blocks"
            );
            Ok(())
        }
        (q, ty::F32) if type_info(q).is_some_and(|i| i.is_quantized && i.has_to_float) => {
            // dup_from_q: addresses the destination with src[1]'s strides (equal to the result's,
            // checked by the CPY rule); DUP/CONT keep the type so never get here.
            ensure!(d.nb(0) == 4, "destination must be contiguous in dim 0");
            ensure!(
                d.ne(0) % a.blck() == 0 || d.contiguous(),
                "destination rows are not whole blocks"
            );
            Ok(())
        }
        (s, t) => Err(refuse!("no copy from type {s} to type {t}")),
    }
}
