//! Rules of pooling, padding and resampling: POOL_1D, POOL_2D, POOL_2D_BACK, UPSCALE, PAD,
//! PAD_REFLECT_1D, ROLL, and SAM's windows WIN_PART, WIN_UNPART.

use super::*;

/// POOL_1D: max or average pooling over rows.
pub(super) fn pool_1d(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    let (pop, k0, s0, p0) = (
        d.op_i32(0),
        d.op_i32(1) as i64,
        d.op_i32(2) as i64,
        d.op_i32(3) as i64,
    );
    ensure!(
        matches!(pop, 0 | 1) && k0 > 0 && s0 > 0,
        "POOL_1D parameters"
    );
    let w = (a.ne(0) + 2 * p0 - k0) / s0 + 1;
    ensure!(w > 0, "POOL_1D: empty result");
    ne_eq(d, [w, a.ne(1), a.ne(2), a.ne(3)])?;
    ty_is(d, ty::F32, "result")?;
    ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
    // Rows are addressed as `i*nb[1]` over all rows (dims 1..3 flattened).
    ensure!(a.flat_rows_fit() && d.flat_rows_fit(), "POOL_1D row layout");
    Ok(())
}

/// POOL_2D: max or average pooling over planes.
pub(super) fn pool_2d(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    let (w, h) = pool_2d_out(d, a, "POOL_2D")?;
    ensure!(w > 0 && h > 0, "POOL_2D: empty result");
    ne_eq(d, [w, h, a.ne(2), a.ne(3)])?;
    ty_is(d, ty::F32, "result")?;
    ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
    ensure!(
        a.contiguous() && d.contiguous(),
        "POOL_2D needs contiguous tensors"
    );
    planes_walk("POOL_2D", a, a, a.row_size(), d.ne(2) * d.ne(3))?;
    Ok(())
}

/// POOL_2D_BACK: the gradient of POOL_2D.
pub(super) fn pool_2d_back(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let af = n.s(1)?;
    n.none_from(2)?;
    ne_eq(d, [af.ne(0), af.ne(1), af.ne(2), af.ne(3)])?;
    let (w, h) = pool_2d_out(d, af, "POOL_2D_BACK")?;
    ensure!(
        a.ne(0) == w && a.ne(1) == h && a.ne(2) == af.ne(2) && a.ne(3) == af.ne(3),
        "POOL_2D_BACK shapes"
    );
    ty_is(d, ty::F32, "result")?;
    ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
    ensure!(
        af.ty() == d.ty() || af.ty() == ty::F16,
        "POOL_2D_BACK types"
    );
    ensure!(
        a.contiguous() && af.contiguous() && d.contiguous(),
        "POOL_2D_BACK needs contiguous tensors"
    );
    // The walk is over the result's bytes and strides; src[1] (the forward input) is read with
    // them too, and as the result's type (an f16 src[1] is read as f32 rows: twice its bytes).
    let planes = a.ne(2) * a.ne(3);
    planes_walk("POOL_2D_BACK", d, d, d.row_size(), planes)?;
    planes_walk("POOL_2D_BACK", d, af, d.row_size(), planes)?;
    Ok(())
}

/// UPSCALE: nearest, bilinear or bicubic resampling.
pub(super) fn upscale(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    let mode = d.op_i32(0);
    ensure!(
        (mode & 0xff) < 3 && (mode & !0x3ff) == 0,
        "UPSCALE mode {mode:#x}"
    );
    ensure!(
        mode & (1 << 9) == 0 || mode & 0xff == 1,
        "UPSCALE antialias needs bilinear"
    );
    ty_is(a, ty::F32, "src[0]")?;
    ty_is(d, ty::F32, "result")?;
    ensure!(!a.is_empty() || d.is_empty(), "UPSCALE of an empty tensor");
    ensure!(
        (0..4).all(|i| d.ne(i) < (1 << 22) && a.ne(i) < (1 << 22)),
        "UPSCALE dimensions too large"
    );
    Ok(())
}

/// PAD: zeros (or circular wrap) added around each dimension.
pub(super) fn pad(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    let p: Vec<i64> = (0..8).map(|i| d.op_i32(i) as i64).collect();
    ensure!(
        p.iter().all(|&x| x >= 0),
        "PAD amounts must not be negative"
    );
    ensure!(matches!(d.op_i32(8), 0 | 1), "PAD circular flag");
    ne_eq(
        d,
        [
            a.ne(0) + p[0] + p[1],
            a.ne(1) + p[2] + p[3],
            a.ne(2) + p[4] + p[5],
            a.ne(3) + p[6] + p[7],
        ],
    )?;
    ty_is(a, ty::F32, "src[0]")?;
    ty_is(d, ty::F32, "result")?;
    fresh(d)?;
    if d.op_i32(8) == 1 {
        ensure!(!a.is_empty(), "circular PAD of an empty tensor");
    }
    Ok(())
}

/// PAD_REFLECT_1D: rows padded with their reflection.
pub(super) fn pad_reflect_1d(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    let (p0, p1) = (d.op_i32(0) as i64, d.op_i32(1) as i64);
    ensure!(
        p0 >= 0 && p1 >= 0 && p0 < a.ne(0) && p1 < a.ne(0),
        "PAD_REFLECT_1D amounts"
    );
    ensure!(a.contiguous(), "PAD_REFLECT_1D: src[0] must be contiguous");
    ty_is(a, ty::F32, "src[0]")?;
    ty_is(d, ty::F32, "result")?;
    ne_eq(d, [a.ne(0) + p0 + p1, a.ne(1), a.ne(2), a.ne(3)])?;
    fresh(d)?;
    Ok(())
}

/// ROLL: a circular shift in each dimension.
pub(super) fn roll(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    nb0_is_ts(a, "src[0]")?;
    for i in 0..4 {
        ensure!((d.op_i32(i) as i64).abs() < a.ne(i), "ROLL shift {i}");
    }
    like_src0(a, d)?;
    ty_is(a, ty::F32, "src[0]")?;
    fresh(d)?;
    Ok(())
}

/// WIN_PART: planes cut into windows (SAM).
pub(super) fn win_part(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(a.ne(3) == 1 && a.ty() == ty::F32, "WIN_PART source");
    let w = d.op_i32(2) as i64;
    ensure!(w > 0, "WIN_PART window");
    let (npx, npy) = windows(a, w);
    ensure!(
        d.op_i32(0) as i64 == npx && d.op_i32(1) as i64 == npy,
        "WIN_PART parameters"
    );
    ne_eq(d, [a.ne(0), w, w, npx * npy])?;
    ty_is(d, ty::F32, "result")?;
    ensure!(
        a.contiguous() && d.contiguous(),
        "WIN_PART needs contiguous tensors"
    );
    Ok(())
}

/// WIN_UNPART: windows put back together (SAM).
pub(super) fn win_unpart(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    let w = d.op_i32(0) as i64;
    ensure!(
        w > 0 && a.ty() == ty::F32 && d.ty() == ty::F32,
        "WIN_UNPART parameters"
    );
    ensure!(
        d.ne(3) == 1 && d.ne(0) == a.ne(0) && a.ne(1) == w && a.ne(2) == w,
        "WIN_UNPART shapes"
    );
    let (npx, npy) = windows(d, w);
    ensure!(a.ne(3) == npx * npy, "WIN_UNPART window count");
    ensure!(
        a.contiguous() && d.contiguous(),
        "WIN_UNPART needs contiguous tensors"
    );
    Ok(())
}

/// POOL_2D's parameters (`op_params`: op, k0, k1, s0, s1, p0, p1) and the width and height of its
/// result for `input` (POOL_2D's source, POOL_2D_BACK's original input).
fn pool_2d_out(d: &TensorSpec, input: &TensorSpec, what: &str) -> Result<(i64, i64), Refusal> {
    let p: Vec<i64> = (0..7).map(|i| d.op_i32(i) as i64).collect();
    let (pop, k0, k1, s0, s1, p0, p1) = (p[0], p[1], p[2], p[3], p[4], p[5], p[6]);
    ensure!(
        matches!(pop, 0 | 1) && k0 > 0 && k1 > 0 && s0 > 0 && s1 > 0 && p0 >= 0 && p1 >= 0,
        "{what} parameters"
    );
    let w = (input.ne(0) + 2 * p0 - k0) / s0 + 1;
    let h = (input.ne(1) + 2 * p1 - k1) / s1 + 1;
    Ok((w, h))
}

/// The plane walk of `ggml_compute_forward_pool_2d` and `_pool_2d_back` (ops.cpp): a pointer
/// steps `nb[2]` of `walk` at a time while it is below `walk`'s extent (`while (cdata <
/// data_end)`), reading or writing `t`'s rows at `nb[1]` of `walk` in each plane, and the other
/// side advances one packed plane per step. ggml's contiguity leaves nb[2] free when ne[2] = 1:
/// a zero stride never ends and a small one takes more steps than there are planes. So: a
/// positive stride, at most `planes` steps (the packed side's planes), and the last plane's rows
/// inside `t` (`row` bytes each).
fn planes_walk(what: &str, walk: &TensorSpec, t: &TensorSpec, row: u64, planes: i64) -> R {
    let bytes = walk.nbytes();
    if bytes == 0 {
        return Ok(());
    }
    let nb2 = walk.nb(2) as u128;
    ensure!(nb2 > 0, "{what}: zero plane stride");
    let steps = bytes.div_ceil(nb2);
    ensure!(
        steps <= planes.max(0) as u128,
        "{what}: {steps} plane steps for {planes} planes"
    );
    let rows = walk.ne(1).max(1) as u128;
    ensure!(
        (steps - 1) * nb2 + (rows - 1) * walk.nb(1) as u128 + row as u128 <= t.nbytes(),
        "{what}: planes outside the tensor"
    );
    Ok(())
}

/// How many `w`-sized windows cover dims 1 and 2 of `t` (padded up to whole windows), as WIN_PART
/// cuts and WIN_UNPART joins them; `w > 0`.
fn windows(t: &TensorSpec, w: i64) -> (i64, i64) {
    let px = (w - t.ne(1) % w) % w;
    let py = (w - t.ne(2) % w) % w;
    ((px + t.ne(1)) / w, (py + t.ne(2)) / w)
}
