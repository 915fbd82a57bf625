//! Rules of position encodings: ROPE, ROPE_BACK, ARANGE, TIMESTEP_EMBEDDING.

use super::*;

/// ROPE and ROPE_BACK: rotary position embeddings (all modes: normal, neox, multi-section, vision, imrope).
pub(super) fn rope(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let pos = n.s(1)?;
    n.none_from(3)?;
    like_src0(a, d)?;
    fresh_or_inplace(d, a)?;
    ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
    ensure!(
        pos.is_vector() && pos.ty() == ty::I32,
        "ROPE positions must be an i32 vector"
    );
    let n_dims = d.op_i32(1) as i64;
    let mode = d.op_i32(2);
    let n_offs = d.op_i32(15) as i64;
    ensure!(matches!(mode, 0 | 2 | 8 | 24 | 40), "ROPE mode {mode}");
    let mrope = mode & 8 != 0;
    let want = if mrope { a.ne(2) * 4 } else { a.ne(2) };
    ensure!(
        pos.ne(0) == want,
        "ROPE: {} positions for {} rows",
        pos.ne(0),
        a.ne(2)
    );
    ensure!(
        n_dims >= 2 && n_dims % 2 == 0 && n_dims <= a.ne(0),
        "ROPE n_dims {n_dims}"
    );
    ensure!(
        n_offs >= 0 && n_offs % 2 == 0 && n_offs + n_dims <= a.ne(0),
        "ROPE offset {n_offs}"
    );
    ensure!(d.nb(0) == a.nb(0) && d.nb(0) == d.ts(), "ROPE strides");
    // Every kernel loop takes the row in pairs, `x[i0]` and `x[i0 + 1]` for `i0 < ne0` (rotated
    // and copied parts alike, ops.cpp): an odd row reads and writes one element past it.
    ensure!(a.ne(0) % 2 == 0, "ROPE: odd row length {}", a.ne(0));
    if mrope {
        let s: Vec<i32> = (11..15).map(|i| d.op_i32(i)).collect();
        ensure!(
            s.iter().all(|&x| x >= 0) && (s[0] > 0 || s[1] > 0 || s[2] > 0),
            "ROPE sections"
        );
        ensure!(
            s.iter().map(|&x| x as i64).sum::<i64>() <= a.ne(0),
            "ROPE sections larger than a row"
        );
    }
    if mode == 24 {
        ensure!(n_dims == a.ne(0) / 2 && n_offs == 0, "ROPE vision dims");
    }
    if let Some(f) = n.src[2] {
        ty_is(f, ty::F32, "freq factors")?;
        nb0_is_ts(f, "freq factors")?;
        // Every mode builds its rotation cache over the whole row (`ggml_rope_cache_init` /
        // `ggml_mrope_cache_init`, ops.cpp): `freq_factors[i0/2]` for i0 < ne0, ne0/2 floats
        // read. Which of them are *used* depends on the mode: normal, neox, mrope and imrope
        // rotate the first n_dims of the row (cache entries i0 < n_dims), so n_dims/2 factors
        // (what ggml asserts and what stock clients, llama.cpp's test-backend-ops among them,
        // build with n_dims < ne0); vision rotates the whole row (`rotate_pairs(ne0, ...)`), so
        // ne0/2 (n_dims is ne0/2 there and test-backend-ops gives ne0/2 factors).
        let used = if mode == 24 { a.ne(0) / 2 } else { n_dims / 2 };
        ensure!(
            f.ne(0) >= used && !f.is_empty(),
            "ROPE: {} freq factors, {used} used",
            f.ne(0)
        );
        // The unused rest is still read: it must be memory of the factors' buffer (their values
        // are discarded), not past its end.
        if let Some((buf, off)) = &f.buffer {
            let read = (a.ne(0) / 2) as u128 * 4;
            ensure!(
                *off as u128 + read <= buf.size() as u128,
                "ROPE: the row's {} freq factors are read past the buffer's end",
                a.ne(0) / 2
            );
        }
    }
    Ok(())
}

/// ARANGE: `start, start + step, ...` below `stop`.
pub(super) fn arange(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    n.none_from(0)?;
    let (start, stop, step) = (d.op_f32(0), d.op_f32(1), d.op_f32(2));
    ensure!(
        stop > start && step > 0.0 && step.is_finite() && start.is_finite() && stop.is_finite(),
        "ARANGE range"
    );
    let steps = ((stop - start) / step).ceil();
    ensure!(
        steps.is_finite() && steps as i128 == d.nelements(),
        "ARANGE: {} elements for {steps} steps",
        d.nelements()
    );
    ty_is(d, ty::F32, "result")?;
    fresh(d)?;
    // Asserted by `ggml_compute_forward_arange_f32`; free in ggml's contiguity for one element.
    nb0_is_ts(d, "result")?;
    Ok(())
}

/// TIMESTEP_EMBEDDING: sinusoidal embeddings of diffusion timesteps.
pub(super) fn timestep_embedding(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    let dim = d.op_i32(0) as i64;
    ensure!(dim >= 0 && d.op_i32(1) > 0, "TIMESTEP_EMBEDDING parameters");
    ne_eq(d, [dim, a.ne(0), 1, 1])?;
    ty_is(a, ty::F32, "src[0]")?;
    ty_is(d, ty::F32, "result")?;
    nb0_is_ts(a, "src[0]")?;
    fresh(d)?;
    Ok(())
}
