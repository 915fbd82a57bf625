//! Rules of reductions and sorts along rows: SUM, SUM_ROWS, MEAN, CUMSUM, ARGMAX, COUNT_EQUAL,
//! ARGSORT, TOP_K.

use super::*;

/// SUM: all elements into one.
pub(super) fn sum(n: &Node<'_>, cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ne_eq(d, [1, 1, 1, 1])?;
    ensure!(d.ty() == a.ty(), "SUM keeps the type");
    if cpu {
        ty_in(a, &[ty::F32, ty::F16, ty::BF16], "src[0]")?;
    }
    Ok(())
}

/// SUM_ROWS and MEAN: one value per row.
pub(super) fn sum_rows_mean(n: &Node<'_>, cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let op = d.op;
    let a = n.s(0)?;
    n.none_from(1)?;
    ne_eq(d, [1, a.ne(1), a.ne(2), a.ne(3)])?;
    if op == ops::MEAN {
        ty_is(d, ty::F32, "result")?;
    } else {
        ensure!(d.ty() == a.ty(), "SUM_ROWS keeps the type");
    }
    if cpu {
        ty_is(a, ty::F32, "src[0]")?;
        nb0_is_ts(a, "src[0]")?;
        nb0_is_ts(d, "result")?;
    }
    Ok(())
}

/// CUMSUM: running sums along rows.
pub(super) fn cumsum(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ty_is(a, ty::F32, "src[0]")?;
    ensure!(same_shape(a, d) && d.ty() == ty::F32, "CUMSUM result");
    fresh(d)?;
    // `ggml_compute_forward_cumsum_f32` asserts both nb[0] are 4 (free in ggml's contiguity when
    // ne[0] = 1).
    f32_rows(&[(d, "result"), (a, "src[0]")])?;
    Ok(())
}

/// ARGMAX: the index of each row's maximum.
pub(super) fn argmax(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(
        a.is_matrix() && a.ne(0) <= i32::MAX as i64,
        "ARGMAX needs a matrix"
    );
    ne_eq(d, [a.ne(1), 1, 1, 1])?;
    ty_is(d, ty::I32, "result")?;
    ty_is(a, ty::F32, "src[0]")?;
    nb0_is_ts(a, "src[0]")?;
    fresh(d)?;
    Ok(())
}

/// COUNT_EQUAL: the number of equal elements of two i32 tensors.
pub(super) fn count_equal(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(same_shape(a, b), "COUNT_EQUAL shapes");
    ne_eq(d, [1, 1, 1, 1])?;
    ty_is(d, ty::I64, "result")?;
    ty_is(a, ty::I32, "src[0]")?;
    ty_is(b, ty::I32, "src[1]")?;
    ensure!(
        count_equal_split_exact(a.ne(1), a.ne(2), a.ne(3)),
        "COUNT_EQUAL: the kernel's row split is wrong for shape {:?}",
        a.ne
    );
    Ok(())
}

/// Whether `ggml_compute_forward_count_equal_i32` (ops.cpp) finds the real indices of every row
/// of a `[_, ne1, ne2, ne3]` pair. It splits the row number `ir` into dims 1..3 itself, and takes
/// `i03 = ir / (ne2*ne1)` but then subtracts `i03*ne3` (not `i03*ne2*ne1`) before dividing by ne1
/// for `i02`, and subtracts `i02*ne2` (not `i02*ne1`) for `i01`. The split is the real one exactly
/// when ne3 is 1 or ne1*ne2, and ne2 is 1 or ne1; for any other shape some rows get indices out
/// of range, negative ones included, and the kernel reads `nb`-strided rows outside both tensors.
/// (ggml-opt's accuracy count, the one stock user, compares two ARGMAX results: vectors.)
pub(super) fn count_equal_split_exact(ne1: i64, ne2: i64, ne3: i64) -> bool {
    (ne3 == 1 || ne3 == ne1 * ne2) && (ne2 == 1 || ne2 == ne1)
}

/// ARGSORT: the indices that sort each row.
pub(super) fn argsort(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(matches!(d.op_i32(0), 0 | 1), "ARGSORT order");
    ensure!(same_shape(a, d) && d.ty() == ty::I32, "ARGSORT result");
    ty_is(a, ty::F32, "src[0]")?;
    ensure!(a.ne(0) <= i32::MAX as i64, "ARGSORT row too long");
    nb0_is_ts(d, "result")?;
    ensure!(a.flat_rows_fit() && d.flat_rows_fit(), "ARGSORT row layout");
    Ok(())
}

/// TOP_K: the indices of each row's k largest values.
pub(super) fn top_k(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(
        d.ne(0) <= a.ne(0) && (1..4).all(|i| d.ne(i) == a.ne(i)),
        "TOP_K shapes"
    );
    ty_is(d, ty::I32, "result")?;
    ty_is(a, ty::F32, "src[0]")?;
    nb0_is_ts(d, "result")?;
    ensure!(a.flat_rows_fit() && d.flat_rows_fit(), "TOP_K row layout");
    Ok(())
}
