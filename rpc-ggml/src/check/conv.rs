//! Rules of convolutions: IM2COL, IM2COL_BACK, IM2COL_3D, COL2IM_1D, CONV_2D, CONV_3D, CONV_2D_DW,
//! CONV_TRANSPOSE_1D, CONV_TRANSPOSE_2D.

use super::*;

/// IM2COL: 1d or 2d convolution input unrolled into columns.
pub(super) fn im2col(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    let (want, is2d) = im2col_shape(d, a, b, "IM2COL")?;
    if is2d {
        ensure!(a.ne(2) == b.ne(2), "IM2COL channels");
    } else {
        ensure!(b.ne(1) == a.ne(1) && b.ne(3) == 1, "IM2COL 1d shapes");
    }
    ne_eq(d, want)?;
    ty_in(d, &[ty::F32, ty::F16], "result")?;
    ty_in(b, &[ty::F32, ty::F16], "src[1]")?;
    if d.ty() == ty::F32 {
        ty_is(b, ty::F32, "src[1]")?;
    }
    fresh(d)?;
    nb0_is_ts(b, "src[1]")?;
    ensure!(
        b.contiguous_rows() && two_d_planes_fit(b, is2d),
        "IM2COL input layout"
    );
    Ok(())
}

/// CONV_TRANSPOSE_1D.
pub(super) fn conv_transpose_1d(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(
        b.is_matrix() && a.ne(2) == b.ne(1) && a.ne(3) == 1,
        "CONV_TRANSPOSE_1D shapes"
    );
    let (s0, p0, d0) = (d.op_i32(0) as i64, d.op_i32(1), d.op_i32(2));
    ensure!(s0 > 0 && p0 == 0 && d0 == 1, "CONV_TRANSPOSE_1D parameters");
    ne_eq(d, [(b.ne(0) - 1) * s0 + a.ne(0), a.ne(1), b.ne(2), 1])?;
    ty_is(d, ty::F32, "result")?;
    ty_is(b, ty::F32, "src[1]")?;
    ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
    fresh(d)?;
    ensure!(
        a.contiguous() && b.contiguous(),
        "CONV_TRANSPOSE_1D needs contiguous sources"
    );
    Ok(())
}

/// IM2COL_BACK: the gradient of IM2COL.
pub(super) fn im2col_back(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ty_is(a, ty::F32, "src[0]")?;
    ty_in(b, &[ty::F32, ty::F16], "src[1]")?;
    ty_is(d, ty::F32, "result")?;
    // The result has the shape of the original im2col input; the gradient src[0] the shape
    // im2col produced from it with kernel src[1].
    let (want, is2d) = im2col_shape(d, b, d, "IM2COL_BACK")?;
    ne_eq(a, want).map_err(|e| e.about("IM2COL_BACK gradient"))?;
    if is2d {
        ensure!(d.ne(2) == b.ne(2), "IM2COL_BACK channels");
    } else {
        ensure!(d.ne(1) == b.ne(1) && d.ne(3) == 1, "IM2COL_BACK channels");
    }
    ensure!(a.contiguous() && d.contiguous(), "IM2COL_BACK contiguity");
    // Asserted by `ggml_compute_forward_im2col_back_f32`; free in ggml's contiguity when
    // ne[0] = 1.
    nb0_is_ts(d, "result")?;
    Ok(())
}

/// IM2COL_3D: 3d convolution input unrolled into columns.
pub(super) fn im2col_3d(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    let p: Vec<i64> = (0..10).map(|i| d.op_i32(i) as i64).collect();
    let ic = p[9];
    ensure!(
        p[0] > 0 && p[1] > 0 && p[2] > 0 && p[3] >= 0 && p[4] >= 0 && p[5] >= 0,
        "IM2COL_3D parameters"
    );
    // With fewer input channels than IC there is no batch (N = 0) and the result is
    // empty, which the CPU backend skips (the kernel would divide by N).
    ensure!(
        p[6] > 0 && p[7] > 0 && p[8] > 0 && ic > 0 && (b.ne(3) >= ic || d.is_empty()),
        "IM2COL_3D parameters"
    );
    let n_b = b.ne(3) / ic;
    let od = conv_out(b.ne(2), a.ne(2), p[2], p[5], p[8]);
    let oh = conv_out(b.ne(1), a.ne(1), p[1], p[4], p[7]);
    let ow = conv_out(b.ne(0), a.ne(0), p[0], p[3], p[6]);
    ensure!(
        od > 0 && oh > 0 && ow > 0,
        "IM2COL_3D: input smaller than the kernel"
    );
    ne_eq(d, [a.ne(0) * a.ne(1) * a.ne(2) * ic, ow, oh, od * n_b])?;
    ty_in(d, &[ty::F32, ty::F16], "result")?;
    ty_is(b, ty::F32, "src[1]")?;
    nb0_is_ts(b, "src[1]")?;
    fresh(d)?;
    Ok(())
}

/// COL2IM_1D: columns folded back into a 1d signal.
pub(super) fn col2im_1d(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    n.none_from(1)?;
    ensure!(a.is_matrix() && a.contiguous(), "COL2IM_1D source");
    ty_in(a, &[ty::F32, ty::F16, ty::BF16], "src[0]")?;
    let (s0, oc, p0) = (d.op_i32(0) as i64, d.op_i32(1) as i64, d.op_i32(2) as i64);
    ensure!(s0 > 0 && oc > 0 && p0 >= 0, "COL2IM_1D parameters");
    let k = a.ne(0) / oc;
    let t_out = (a.ne(1) - 1) * s0 + k - 2 * p0;
    ensure!(a.ne(0) == k * oc && k > 0 && t_out > 0, "COL2IM_1D shapes");
    ne_eq(d, [t_out, oc, 1, 1])?;
    ensure!(d.ty() == a.ty() && d.contiguous(), "COL2IM_1D result");
    Ok(())
}

/// CONV_2D: direct 2d convolution.
pub(super) fn conv_2d(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(a.ne(2) == b.ne(2), "CONV_2D channels");
    let (w, h) = conv_2d_out(d, a, b, "CONV_2D")?;
    ne_eq(d, [w, h, a.ne(3), b.ne(3)])?;
    ensure!(a.contiguous(), "CONV_2D: kernel must be contiguous");
    ty_in(a, &[ty::F32, ty::F16], "kernel")?;
    ty_is(b, ty::F32, "src[1]")?;
    ensure!(d.ty() == b.ty(), "CONV_2D result type");
    // Input and result are addressed through their strides.
    Ok(())
}

/// CONV_3D: direct 3d convolution.
pub(super) fn conv_3d(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    let p: Vec<i64> = (0..12).map(|i| d.op_i32(i) as i64).collect();
    let (c, nn, oc) = (p[9], p[10], p[11]);
    ensure!(
        (0..3).all(|i| p[i] > 0 && p[i + 3] >= 0 && p[i + 6] > 0) && c > 0 && nn > 0 && oc > 0,
        "CONV_3D parameters"
    );
    ensure!(a.ne(3) == c * oc && b.ne(3) == c * nn, "CONV_3D channels");
    let w = conv_out(b.ne(0), a.ne(0), p[0], p[3], p[6]);
    let h = conv_out(b.ne(1), a.ne(1), p[1], p[4], p[7]);
    let dd = conv_out(b.ne(2), a.ne(2), p[2], p[5], p[8]);
    ensure!(
        w > 0 && h > 0 && dd > 0,
        "CONV_3D: input smaller than the kernel"
    );
    ne_eq(d, [w, h, dd, oc * nn])?;
    ty_is(d, ty::F32, "result")?;
    ty_in(a, &[ty::F32, ty::F16], "kernel")?;
    ty_is(b, ty::F32, "src[1]")?;
    ensure!(
        a.contiguous() && b.contiguous() && d.contiguous(),
        "CONV_3D contiguity"
    );
    Ok(())
}

/// CONV_2D_DW: depthwise 2d convolution.
pub(super) fn conv_2d_dw(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(a.ne(2) == 1 && a.ne(3) == b.ne(2), "CONV_2D_DW shapes");
    let (w, h) = conv_2d_out(d, a, b, "CONV_2D_DW")?;
    ne_eq(d, [w, h, b.ne(2), b.ne(3)])?;
    ensure!(d.ty() == b.ty() && b.ty() == ty::F32, "CONV_2D_DW types");
    ty_in(a, &[ty::F32, ty::F16], "kernel")?;
    // Both kernels address kernel, input and result as flat arrays (WHCN when the input
    // is contiguous, channels-innermost CWHN when it is contiguous in channels).
    ensure!(
        a.flat_fits() && b.flat_fits() && d.flat_fits(),
        "CONV_2D_DW: tensors must be packed"
    );
    let channels = |t: &TensorSpec| t.nb(0) > t.nb(2) && t.nb(1) > t.nb(0) && t.nb(2) == t.ts();
    if b.contiguous() {
        ensure!(a.contiguous() && d.contiguous(), "CONV_2D_DW (WHCN) layout");
    } else {
        ensure!(channels(b), "CONV_2D_DW: input layout not supported");
        ensure!(
            a.nb(0) >= a.nb(2) && a.nb(1) >= a.nb(0),
            "CONV_2D_DW (CWHN) kernel layout"
        );
    }
    Ok(())
}

/// CONV_TRANSPOSE_2D.
pub(super) fn conv_transpose_2d(n: &Node<'_>, _cpu: bool, _checks: &mut Vec<IndexCheck>) -> R {
    let d = n.d;
    let a = n.s(0)?;
    let b = n.s(1)?;
    n.none_from(2)?;
    ensure!(a.ne(3) == b.ne(2), "CONV_TRANSPOSE_2D channels");
    let s = d.op_i32(0) as i64;
    ensure!(s > 0, "CONV_TRANSPOSE_2D stride");
    ne_eq(
        d,
        [
            (b.ne(0) - 1) * s + a.ne(0),
            (b.ne(1) - 1) * s + a.ne(1),
            a.ne(2),
            b.ne(3),
        ],
    )?;
    ty_is(d, ty::F32, "result")?;
    ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
    ty_is(b, ty::F32, "src[1]")?;
    ensure!(
        a.contiguous() && b.contiguous() && d.contiguous(),
        "CONV_TRANSPOSE_2D contiguity"
    );
    Ok(())
}

/// `ggml_calc_conv_output_size`, in i128 to avoid overflow.
fn conv_out(ins: i64, ks: i64, s: i64, p: i64, d: i64) -> i64 {
    if s <= 0 {
        return 0;
    }
    let v = (ins as i128 + 2 * p as i128 - d as i128 * (ks as i128 - 1) - 1) / s as i128 + 1;
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// IM2COL's parameters (`op_params`: s0, s1, p0, p1, d0, d1, is_2D) and the shape im2col makes of
/// `input` with `kernel` (`ggml_im2col`), and whether it is 2d: IM2COL checks its result against
/// it, IM2COL_BACK its gradient.
fn im2col_shape(
    d: &TensorSpec,
    kernel: &TensorSpec,
    input: &TensorSpec,
    what: &str,
) -> Result<([i64; 4], bool), Refusal> {
    let p: Vec<i64> = (0..7).map(|i| d.op_i32(i) as i64).collect();
    let (s0, s1, p0, p1, d0, d1, is2d) = (p[0], p[1], p[2], p[3], p[4], p[5], p[6]);
    ensure!(
        matches!(is2d, 0 | 1) && s0 > 0 && d0 > 0 && p0 >= 0,
        "{what} parameters"
    );
    let is2d = is2d == 1;
    ensure!(!is2d || (s1 > 0 && d1 > 0 && p1 >= 0), "{what} parameters");
    let oh = if is2d {
        conv_out(input.ne(1), kernel.ne(1), s1, p1, d1)
    } else {
        1
    };
    let ow = conv_out(input.ne(0), kernel.ne(0), s0, p0, d0);
    ensure!(oh > 0 && ow > 0, "{what}: input smaller than the kernel");
    let want = [
        if is2d {
            kernel.ne(2) * kernel.ne(1) * kernel.ne(0)
        } else {
            kernel.ne(1) * kernel.ne(0)
        },
        ow,
        if is2d { oh } else { input.ne(2) },
        if is2d { input.ne(3) } else { 1 },
    ];
    Ok((want, is2d))
}

/// CONV_2D's and CONV_2D_DW's parameters (`op_params`: s0, s1, p0, p1, d0, d1) and the width and
/// height of their result for `input` and `kernel`.
fn conv_2d_out(
    d: &TensorSpec,
    kernel: &TensorSpec,
    input: &TensorSpec,
    what: &str,
) -> Result<(i64, i64), Refusal> {
    let p: Vec<i64> = (0..6).map(|i| d.op_i32(i) as i64).collect();
    ensure!(
        p[0] > 0 && p[1] > 0 && p[2] >= 0 && p[3] >= 0 && p[4] > 0 && p[5] > 0,
        "{what} parameters"
    );
    let w = conv_out(input.ne(0), kernel.ne(0), p[0], p[2], p[4]);
    let h = conv_out(input.ne(1), kernel.ne(1), p[1], p[3], p[5]);
    ensure!(w > 0 && h > 0, "{what}: input smaller than the kernel");
    Ok((w, h))
}

/// The IM2COL kernel reads input planes as `[IH, IW]` rows of contiguous floats.
fn two_d_planes_fit(b: &TensorSpec, is2d: bool) -> bool {
    if is2d {
        b.nb(1) as u128 == b.ne(0) as u128 * b.nb(0) as u128
    } else {
        true
    }
}
