//! Rules of the ops driven by row ids: GET_ROWS, GET_ROWS_BACK, SET_ROWS (each returns an
//! [`IndexCheck`] on its ids).

use super::*;

/// GET_ROWS: the rows of src[0] that the ids in src[1] name.
pub(super) fn get_rows(n: &Node<'_>, cpu: bool, checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(
        a.ne(2) == b.ne(1) && a.ne(3) == b.ne(2) && b.ne(3) == 1,
        "GET_ROWS: src[0] {:?} rows {:?}",
        a.ne,
        b.ne
    );
    ty_is(b, ty::I32, "row ids")?;
    let want_ty = if a.ty() == ty::I32 { ty::I32 } else { ty::F32 };
    ensure!(d.ty() == want_ty, "GET_ROWS result type {}", d.ty());
    ne_eq(d, [a.ne(0), b.ne(0), b.ne(1), b.ne(2)])?;
    nb0_is_ts(d, "result")?;
    if cpu {
        let ok = matches!(a.ty(), ty::F32 | ty::I32 | ty::F16 | ty::BF16)
            || (a.quantized() && type_info(a.ty()).is_some_and(|i| i.has_to_float));
        ensure!(ok, "GET_ROWS src[0] type {}", a.ty());
        nb0_is_ts(a, "src[0]")?;
    }
    checks.push(IndexCheck {
        tensor: n.idx(1),
        type_: ty::I32,
        bound: a.ne(1) as u64,
        what: "GET_ROWS row",
    });
    Ok(())
}

/// GET_ROWS_BACK: the gradient of GET_ROWS.
pub(super) fn get_rows_back(n: &Node<'_>, _cpu: bool, checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    // ggml_get_rows_back(a, b, c): src[0] = a (gradient rows), src[1] = b (row ids); c
    // only gives the result shape.
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(
        a.is_matrix() && b.is_vector() && b.ty() == ty::I32,
        "GET_ROWS_BACK sources"
    );
    ensure!(d.is_matrix() && a.ne(0) == d.ne(0), "GET_ROWS_BACK shapes");
    ty_is(d, ty::F32, "result")?;
    ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
    fresh(d)?;
    nb0_is_ts(a, "src[0]")?;
    // The kernel reads b as a flat array of nelements(b) ids and src[0] row i for each.
    ensure!(
        b.nelements() <= a.ne(1) as i128,
        "GET_ROWS_BACK: more ids than src[0] rows"
    );
    ensure!(b.flat_fits(), "GET_ROWS_BACK ids layout");
    checks.push(IndexCheck {
        tensor: n.idx(1),
        type_: ty::I32,
        bound: d.ne(1) as u64,
        what: "GET_ROWS_BACK row",
    });
    Ok(())
}

/// SET_ROWS: value rows written into the rows of src[2] that the ids name.
pub(super) fn set_rows(n: &Node<'_>, cpu: bool, checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    // ggml_set_rows(a, b, c): result = view of a, src[0] = b (values), src[1] = c (row
    // ids), src[2] = a.
    let b = n.s(0)?;
    let c = n.s(1)?;
    n.none_from(3)?;
    if let Some(a) = n.src[2] {
        ensure!(
            same_shape(a, d) && same_stride(a, d) && a.ty() == d.ty(),
            "SET_ROWS result must be a view of src[2]"
        );
    }
    ensure!(
        d.ne(0) == b.ne(0) && d.ne(2) == b.ne(2) && d.ne(3) == b.ne(3),
        "SET_ROWS: destination {:?} values {:?}",
        d.ne,
        b.ne
    );
    ensure!(b.ne(1) == c.ne(0), "SET_ROWS: one row id per value row");
    ensure!(
        divides(c.ne(1), b.ne(2)) && divides(c.ne(2), b.ne(3)) && c.ne(3) == 1,
        "SET_ROWS: row ids cannot be broadcast"
    );
    ty_in(b, &[ty::F32, ty::F16], "values")?;
    ty_in(c, &[ty::I64, ty::I32], "row ids")?;
    ensure!(
        d.contiguous_rows() && b.contiguous_rows(),
        "SET_ROWS needs contiguous rows"
    );
    if cpu {
        ensure!(
            type_info(d.ty()).is_some_and(|i| i.cpu_from_float),
            "SET_ROWS: no conversion to type {}",
            d.ty()
        );
        ensure!(
            !d.quantized() || d.ne(0) % d.blck() == 0,
            "SET_ROWS: partial blocks"
        );
    }
    checks.push(IndexCheck {
        tensor: n.idx(1),
        type_: c.ty(),
        bound: d.ne(1) as u64,
        what: "SET_ROWS row",
    });
    Ok(())
}
