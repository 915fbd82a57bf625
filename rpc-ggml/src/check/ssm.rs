//! Rules of state-space and recurrent ops: SSM_CONV, SSM_SCAN (Mamba), RWKV_WKV6, RWKV_WKV7,
//! GATED_LINEAR_ATTN, GATED_DELTA_NET.

use super::*;

/// SSM_CONV: the short convolution of Mamba layers.
pub(super) fn ssm_conv(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let sx = n.s(0)?;
    let c = n.s(1)?;
    n.none_from(2)?;
    ensure!(sx.is_3d() && c.is_matrix(), "SSM_CONV source shapes");
    let n_t = sx.ne(0) - c.ne(0) + 1;
    ensure!(n_t >= 0 && sx.ne(1) == c.ne(1), "SSM_CONV shapes");
    ne_eq(d, [c.ne(1), n_t, sx.ne(2), 1])?;
    f32_rows(&[(d, "result"), (sx, "src[0]"), (c, "src[1]")])?;
    ensure!(
        sx.nb(1) == sx.ne(0) as u64 * 4,
        "SSM_CONV: src[0] rows must be packed"
    );
    ensure!(
        c.nb(1) == c.ne(0) as u64 * 4,
        "SSM_CONV: src[1] rows must be packed"
    );
    Ok(())
}

/// SSM_SCAN: the selective scan of Mamba layers, states chosen by ids.
pub(super) fn ssm_scan(n: &Node<'_>, _cpu: bool, checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let s = n.s(0)?;
    let x = n.s(1)?;
    let dt = n.s(2)?;
    let a = n.s(3)?;
    let b = n.s(4)?;
    let c = n.s(5)?;
    let ids = n.s(6)?;
    n.none_from(7)?;
    let kk = d.op_i32(0) as i64;
    ensure!(kk >= 1, "SSM_SCAN K");
    ensure!(
        s.contiguous() && dt.contiguous() && a.contiguous(),
        "SSM_SCAN contiguity"
    );
    for (t, w) in [(x, "x"), (b, "B"), (c, "C")] {
        nb0_is_ts(t, w)?;
        ensure!(
            t.nb(1) == t.ne(0) as u64 * t.nb(0),
            "SSM_SCAN: {w} rows must be packed"
        );
    }
    ensure!(same_shape(b, c), "SSM_SCAN: B and C shapes");
    ty_is(ids, ty::I32, "ids")?;
    for (t, w) in [
        (d, "result"),
        (s, "s"),
        (x, "x"),
        (dt, "dt"),
        (a, "A"),
        (b, "B"),
        (c, "C"),
    ] {
        ty_is(t, ty::F32, w)?;
    }
    let (d_state, head_dim, n_head, n_tok, n_seqs) = (s.ne(0), x.ne(0), x.ne(1), x.ne(2), x.ne(3));
    ensure!(
        dt.ne(0) == n_head && dt.ne(1) == n_tok && dt.ne(2) == n_seqs && dt.is_3d(),
        "SSM_SCAN dt"
    );
    ensure!(s.ne(1) == head_dim && s.ne(2) == n_head, "SSM_SCAN s");
    ensure!(
        b.ne(0) == d_state && b.ne(2) == n_tok && b.ne(3) == n_seqs,
        "SSM_SCAN B"
    );
    ensure!(
        ids.ne(0) == n_seqs && ids.is_vector() && ids.flat_fits(),
        "SSM_SCAN ids"
    );
    ensure!(a.ne(1) == n_head && a.is_matrix(), "SSM_SCAN A");
    ensure!(
        a.ne(0) == 1 || (a.ne(0) == d_state && kk == 1),
        "SSM_SCAN A shape"
    );
    ensure!(divides(b.ne(1), n_head), "SSM_SCAN groups");
    ensure!(s.ne(3) >= 1, "SSM_SCAN states");
    let want = x.nelements() + kk as i128 * (s.ne(0) * s.ne(1) * s.ne(2) * ids.ne(0)) as i128;
    ensure!(
        d.nelements() == want && d.is_vector(),
        "SSM_SCAN result size"
    );
    fresh(d)?;
    ensure!(x.flat_fits() || x.contiguous_rows(), "SSM_SCAN x");
    checks.push(IndexCheck {
        tensor: n.idx(6),
        type_: ty::I32,
        bound: s.ne(3) as u64,
        what: "SSM_SCAN state",
    });
    Ok(())
}

/// RWKV_WKV6, GATED_LINEAR_ATTN, RWKV_WKV7: recurrent linear attention with a state per sequence.
pub(super) fn wkv(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let op = d.op;
    let n_in = match op {
        ops::RWKV_WKV6 => 6,
        ops::GATED_LINEAR_ATTN => 5,
        _ => 7,
    };
    let srcs: Vec<&TensorSpec> = (0..n_in).map(|i| n.s(i)).collect::<Result<_, _>>()?;
    n.none_from(n_in)?;
    for (i, t) in srcs.iter().enumerate() {
        ensure!(
            t.contiguous() && t.ty() == ty::F32,
            "src[{i}] must be contiguous f32"
        );
    }
    let k = if op == ops::RWKV_WKV7 {
        srcs[2]
    } else {
        srcs[0]
    };
    let state = srcs[n_in - 1];
    let (sz, h, n_tok, n_seqs) = (k.ne(0), k.ne(1), k.ne(2), state.ne(1));
    ensure!(h > 0 && sz > 0, "empty heads");
    for (i, t) in srcs.iter().enumerate().take(n_in - 1) {
        if op == ops::RWKV_WKV6 && i == 3 {
            ensure!(t.nelements() >= (sz * h) as i128, "time_faaaa size");
            continue;
        }
        ensure!(
            t.ne(0) == sz && t.ne(1) == h && t.ne(2) == n_tok && t.ne(3) == 1,
            "src[{i}] shape"
        );
    }
    ensure!(
        state.nelements() == (sz * sz * h * n_seqs) as i128,
        "state size"
    );
    ensure!(n_seqs > 0 && divides(n_seqs, n_tok), "tokens per sequence");
    ne_eq(d, [sz * h, n_tok + sz * n_seqs, 1, 1])?;
    ty_is(d, ty::F32, "result")?;
    fresh(d)?;
    Ok(())
}

/// GATED_DELTA_NET: the gated delta rule (Qwen3-Next), with a state per sequence.
pub(super) fn gated_delta_net(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let q = n.s(0)?;
    let k = n.s(1)?;
    let v = n.s(2)?;
    let g = n.s(3)?;
    let beta = n.s(4)?;
    let state = n.s(5)?;
    n.none_from(6)?;
    for (t, w) in [
        (q, "q"),
        (k, "k"),
        (v, "v"),
        (g, "g"),
        (beta, "beta"),
        (state, "state"),
    ] {
        ty_is(t, ty::F32, w)?;
    }
    ensure!(
        q.contiguous_rows() && k.contiguous_rows() && v.contiguous_rows(),
        "GATED_DELTA_NET rows"
    );
    ensure!(
        g.contiguous() && beta.contiguous() && state.contiguous(),
        "GATED_DELTA_NET contiguity"
    );
    let (sv, h, n_tok, n_seqs) = (v.ne(0), v.ne(1), v.ne(2), v.ne(3));
    let kk = d.op_i32(0) as i64;
    ensure!(kk >= 1, "GATED_DELTA_NET K");
    ensure!(
        q.ne(0) == sv && k.ne(0) == sv && same_shape(q, k),
        "GATED_DELTA_NET q/k shapes"
    );
    ensure!(
        divides(q.ne(1), h) && q.ne(2) == n_tok && divides(q.ne(3), n_seqs),
        "GATED_DELTA_NET q/k broadcast"
    );
    ensure!(
        (g.ne(0) == 1 || g.ne(0) == sv) && g.ne(1) == h && g.ne(2) == n_tok && g.ne(3) == n_seqs,
        "GATED_DELTA_NET g"
    );
    ensure!(
        beta.ne(0) == 1 && beta.ne(1) == h && beta.ne(2) == n_tok && beta.ne(3) == n_seqs,
        "GATED_DELTA_NET beta"
    );
    ensure!(
        state.ne(0) == sv && state.ne(1) == sv && state.ne(2) == h && state.ne(3) == n_seqs,
        "GATED_DELTA_NET state"
    );
    ne_eq(d, [sv * h, n_tok * n_seqs + kk * sv * n_seqs, 1, 1])?;
    ty_is(d, ty::F32, "result")?;
    fresh(d)?;
    Ok(())
}
