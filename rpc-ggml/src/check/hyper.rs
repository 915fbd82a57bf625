//! Rules of DeepSeek-V4's hyper-connection ops: DSV4_HC_COMB, DSV4_HC_PRE, DSV4_HC_POST.

use super::*;

/// DSV4_HC_COMB: the hyper-connection mixing matrices (Sinkhorn iterations).
pub(super) fn comb(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let mixes = n.s(0)?;
    let scale = n.s(1)?;
    let base = n.s(2)?;
    n.none_from(3)?;
    ensure!(
        mixes.ty() == ty::F32 && scale.ty() == ty::F32 && base.ty() == ty::F32 && d.ty() == ty::F32,
        "DSV4_HC_COMB types"
    );
    ensure!(d.op_i32(1) > 0, "DSV4_HC_COMB iterations");
    let hc = 4;
    ensure!(
        mixes.ne(0) == (2 + hc) * hc && mixes.ne(2) == 1 && mixes.ne(3) == 1,
        "DSV4_HC_COMB mixes"
    );
    ensure!(
        scale.ne(0) >= 3 && scale.is_vector() && base.ne(0) == mixes.ne(0) && base.is_vector(),
        "DSV4_HC_COMB scale/base"
    );
    ne_eq(d, [hc, hc, mixes.ne(1), 1])?;
    ensure!(
        mixes.contiguous() && scale.contiguous() && base.contiguous() && d.contiguous(),
        "DSV4_HC_COMB contiguity"
    );
    Ok(())
}

/// DSV4_HC_PRE: hyper-connection streams mixed into a layer's input.
pub(super) fn pre(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let x = n.s(0)?;
    let w = n.s(1)?;
    n.none_from(2)?;
    ensure!(
        x.ty() == ty::F32 && w.ty() == ty::F32 && d.ty() == ty::F32,
        "DSV4_HC_PRE types"
    );
    let (n_embd, hc, n_tok) = (x.ne(0), x.ne(1), x.ne(2));
    ensure!(hc > 0 && x.ne(3) == 1 && w.ne(3) == 1, "DSV4_HC_PRE shapes");
    match d.op_i32(1) {
        1 => ensure!(
            w.ne(0) == n_embd && w.ne(1) == hc && w.ne(2) == n_tok,
            "DSV4_HC_PRE gate"
        ),
        0 => ensure!(
            w.ne(0) == hc && w.ne(1) == n_tok && w.ne(2) == 1,
            "DSV4_HC_PRE weights"
        ),
        _ => return Err("DSV4_HC_PRE gated flag".into()),
    }
    ne_eq(d, [n_embd, n_tok, 1, 1])?;
    ensure!(
        x.contiguous() && w.contiguous() && d.contiguous(),
        "DSV4_HC_PRE contiguity"
    );
    Ok(())
}

/// DSV4_HC_POST: a layer's output spread back over the streams.
pub(super) fn post(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let x = n.s(0)?;
    let res = n.s(1)?;
    let post = n.s(2)?;
    n.none_from(4)?;
    ensure!(
        x.ty() == ty::F32 && res.ty() == ty::F32 && post.ty() == ty::F32 && d.ty() == ty::F32,
        "DSV4_HC_POST types"
    );
    let (n_embd, n_tok, hc) = (x.ne(0), x.ne(1), res.ne(1));
    ensure!(
        hc > 0 && x.is_matrix() && res.ne(0) == n_embd && res.ne(2) == n_tok && res.ne(3) == 1,
        "DSV4_HC_POST shapes"
    );
    ensure!(
        post.ne(0) == hc && post.ne(1) == n_tok && post.is_matrix(),
        "DSV4_HC_POST post"
    );
    if let Some(c) = n.src[3] {
        ensure!(
            c.ty() == ty::F32
                && c.ne(0) == hc
                && c.ne(1) == hc
                && c.ne(2) == n_tok
                && c.ne(3) == 1
                && c.contiguous(),
            "DSV4_HC_POST comb"
        );
    }
    ne_eq(d, [n_embd, hc, n_tok, 1])?;
    ensure!(
        x.contiguous() && res.contiguous() && post.contiguous() && d.contiguous(),
        "DSV4_HC_POST contiguity"
    );
    Ok(())
}
