//! Rules of attention ops: FLASH_ATTN_EXT, LIGHTNING_INDEXER, and SAM's relative positions
//! GET_REL_POS, ADD_REL_POS.

use super::*;

/// FLASH_ATTN_EXT: q, k, v, an optional mask and sinks.
pub(super) fn flash_attn_ext(n: &Node<'_>, cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let q = n.s(0)?;
    let k = n.s(1)?;
    let v = n.s(2)?;
    n.none_from(5)?;
    ensure!(
        k.ne(0) == q.ne(0) && divides(k.ne(2), q.ne(2)) && divides(k.ne(3), q.ne(3)),
        "FLASH_ATTN_EXT: q {:?} k {:?}",
        q.ne,
        k.ne
    );
    ensure!(
        q.ne(3) == k.ne(3) && q.ne(3) == v.ne(3),
        "FLASH_ATTN_EXT batch"
    );
    ensure!(divides(v.ne(2), q.ne(2)), "FLASH_ATTN_EXT: v heads");
    ensure!(v.ne(1) == k.ne(1), "FLASH_ATTN_EXT: k and v lengths differ");
    ne_eq(d, [v.ne(0), q.ne(2), q.ne(1), q.ne(3)])?;
    // op_params[3] is the precision; the CPU kernel knows DEFAULT (0) and F32 (10).
    ensure!(
        !cpu || matches!(d.op_i32(3), 0 | 10),
        "FLASH_ATTN_EXT precision {}",
        d.op_i32(3)
    );
    ty_is(d, ty::F32, "result")?;
    nb0_is_ts(d, "result")?;
    strides_increase(d)?;
    // The kernel copies nb[1] bytes per result row to row `(i3*ne2 + i2)*ne1 + i1` counted in
    // nb[1] (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`, ops.cpp): a packed result.
    ensure!(d.contiguous(), "FLASH_ATTN_EXT result must be contiguous");
    // The copy is nb[1] bytes from a scratch row of ne[0] floats (every variant: one_chunk,
    // tiled, the split-KV reduction): nb[1] is the row size, which ggml's contiguity leaves free
    // when ne[1] = 1.
    ensure!(
        d.nb(1) == d.row_size(),
        "FLASH_ATTN_EXT: result nb[1]={} is not the row size {}",
        d.nb(1),
        d.row_size()
    );
    for (t, w) in [(q, "q"), (k, "k"), (v, "v")] {
        nb0_is_ts(t, w)?;
    }
    if cpu {
        // Every variant reads q as f32: `_one_chunk` hands a q row to the K type's
        // `from_float` (a row of DK floats), `_tiled` copies DK floats per row (ops.cpp). An f16
        // q row is half as long, so its last row is read past the tensor's end.
        ensure!(
            q.ty() == ty::F32,
            "FLASH_ATTN_EXT: q type {}: the CPU kernel reads q rows as f32",
            q.ty()
        );
        let kt = type_info(k.ty()).ok_or("k type")?;
        ensure!(
            k.ty() == ty::F32 || k.ty() == ty::F16 || kt.has_to_float || kt.cpu_vec_dot,
            "FLASH_ATTN_EXT k type"
        );
        let vt = type_info(v.ty()).ok_or("v type")?;
        ensure!(
            v.ty() == ty::F32 || v.ty() == ty::F16 || vt.has_to_float,
            "FLASH_ATTN_EXT v type"
        );
    }
    let covers = |m: &TensorSpec| {
        ensure!(
            m.ne(0) >= k.ne(1) && m.ne(1) >= q.ne(1),
            "FLASH_ATTN_EXT: mask {:?} too small for {} kv x {} q",
            m.ne,
            k.ne(1),
            q.ne(1)
        );
        Ok(())
    };
    let mask = n.src[3];
    mask_and_sinks("FLASH_ATTN_EXT", d, q, mask, &[ty::F16], covers, n.src[4])
}

/// GET_REL_POS: relative position embeddings (SAM).
pub(super) fn get_rel_pos(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    let k = d.ne(1);
    ensure!(
        d.ne(2) == k && 2 * k - 1 == a.ne(1) && d.ne(0) == a.ne(0) && d.ne(3) == 1,
        "GET_REL_POS shapes"
    );
    ty_is(a, ty::F16, "src[0]")?;
    ty_is(d, ty::F16, "result")?;
    ensure!(
        a.contiguous() && d.contiguous(),
        "GET_REL_POS needs contiguous tensors"
    );
    Ok(())
}

/// ADD_REL_POS: decomposed relative positions added to attention scores (SAM).
pub(super) fn add_rel_pos(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let pw = n.s(1)?;
    let ph = n.s(2)?;
    n.none_from(3)?;
    ensure!(
        same_shape(pw, ph) && a.contiguous() && pw.contiguous() && ph.contiguous(),
        "ADD_REL_POS sources"
    );
    ensure!(
        ph.ty() == ty::F32 && pw.ty() == ty::F32 && a.ty() == ty::F32 && d.ty() == ty::F32,
        "ADD_REL_POS types"
    );
    ensure!(
        pw.ne(3) == a.ne(2) && pw.ne(0) * pw.ne(0) == a.ne(0) && pw.ne(1) * pw.ne(2) == a.ne(1),
        "ADD_REL_POS shapes"
    );
    ensure!(same_shape(a, d) && d.contiguous(), "ADD_REL_POS result");
    ensure!(matches!(d.op_i32(0), 0 | 1), "ADD_REL_POS inplace flag");
    Ok(())
}

/// LIGHTNING_INDEXER: the DeepSeek sparse-attention indexer scores.
pub(super) fn lightning_indexer(n: &Node<'_>, cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let q = n.s(0)?;
    let k = n.s(1)?;
    let w = n.s(2)?;
    let m = n.s(3)?;
    n.none_from(4)?;
    ensure!(
        q.ty() == ty::F32 && w.ty() == ty::F32 && m.ty() == ty::F16 && d.ty() == ty::F32,
        "LIGHTNING_INDEXER types"
    );
    ensure!(
        q.ne(0) == k.ne(0) && m.ne(0) == k.ne(2) && q.ne(1) == w.ne(0) && k.ne(1) == 1,
        "LIGHTNING_INDEXER shapes"
    );
    ensure!(
        m.ne(1) == q.ne(2) && q.ne(2) == w.ne(1) && w.ne(2) == 1 && m.ne(2) == 1,
        "LIGHTNING_INDEXER shapes"
    );
    ensure!(
        q.ne(3) == k.ne(3) && k.ne(3) == w.ne(3) && divides(m.ne(3), w.ne(3)),
        "LIGHTNING_INDEXER batch"
    );
    ne_eq(d, [k.ne(2), q.ne(2), 1, q.ne(3)])?;
    for (t, wn) in [
        (d, "result"),
        (q, "q"),
        (k, "k"),
        (w, "weights"),
        (m, "mask"),
    ] {
        nb0_is_ts(t, wn)?;
    }
    if cpu {
        let kt = type_info(k.ty()).ok_or("k type")?;
        ensure!(
            k.ty() == ty::F32 || kt.has_to_float || k.ty() == ty::F16 || k.ty() == ty::BF16,
            "LIGHTNING_INDEXER k type"
        );
    }
    Ok(())
}
