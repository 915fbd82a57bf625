//! Unit tests of the validator: shape helpers against ggml's, and a few rules by op.

use super::*;

fn t(type_: u32, ne: [u32; 4]) -> TensorSpec {
    let info = type_info(type_).unwrap();
    let mut nb = [0u64; 4];
    nb[0] = info.type_size;
    nb[1] = nb[0] * ne[0] as u64 / info.blck_size;
    nb[2] = nb[1] * ne[1] as u64;
    nb[3] = nb[2] * ne[2] as u64;
    TensorSpec {
        type_,
        ne,
        nb,
        op: 0,
        op_params: [0; 16],
        flags: 0,
        buffer: None,
        view_offs: 0,
        name: [0; 64],
    }
}

fn node<'a>(d: &'a TensorSpec, srcs: &[&'a TensorSpec]) -> Node<'a> {
    let mut src = [None; 10];
    let mut src_idx = [None; 10];
    for (i, s) in srcs.iter().enumerate() {
        src[i] = Some(*s);
        src_idx[i] = Some(i as u32 + 1);
    }
    Node { d, src, src_idx }
}

#[test]
fn contiguity_matches_ggml() {
    let a = t(ty::F32, [4, 3, 2, 1]);
    assert!(a.contiguous() && a.contiguous_1() && a.contiguous_rows());
    let mut p = a.clone();
    p.ne = [3, 4, 2, 1];
    p.nb = [16, 4, 48, 96];
    assert!(!p.contiguous() && p.transposed());
}

#[test]
fn mul_mat_shapes() {
    let a = t(ty::F32, [8, 4, 1, 1]);
    let b = t(ty::F32, [8, 3, 1, 1]);
    let mut d = t(ty::F32, [4, 3, 1, 1]);
    d.op = ops::MUL_MAT;
    assert!(check_node(&node(&d, &[&a, &b]), true).is_ok());
    let mut bad = t(ty::F32, [4, 30, 1, 1]);
    bad.op = ops::MUL_MAT;
    assert!(check_node(&node(&bad, &[&a, &b]), true).is_err());
    let b2 = t(ty::F32, [9, 3, 1, 1]);
    assert!(check_node(&node(&d, &[&a, &b2]), true).is_err());
    // zero broadcast divisor
    let a0 = t(ty::F32, [8, 4, 0, 1]);
    assert!(check_node(&node(&d, &[&a0, &b]), true).is_err());
    // I32 has no dot product
    let ai = t(ty::I32, [8, 4, 1, 1]);
    assert!(check_node(&node(&d, &[&ai, &b]), true).is_err());
}

#[test]
fn get_rows_shapes_and_index_check() {
    let a = t(ty::F32, [16, 10, 2, 1]);
    let rows = t(ty::I32, [5, 2, 1, 1]);
    let mut d = t(ty::F32, [16, 5, 2, 1]);
    d.op = ops::GET_ROWS;
    let c = check_node(&node(&d, &[&a, &rows]), true).unwrap();
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].bound, 10);
    // #26825: src0 ne[2] != rows ne[1]
    let rows1 = t(ty::I32, [5, 1, 1, 1]);
    let mut d1 = t(ty::F32, [16, 5, 1, 1]);
    d1.op = ops::GET_ROWS;
    assert!(check_node(&node(&d1, &[&a, &rows1]), true).is_err());
}

#[test]
fn set_rows_shapes() {
    let dst = t(ty::F32, [4, 8, 1, 1]);
    let vals = t(ty::F32, [4, 2, 1, 1]);
    let ids = t(ty::I64, [2, 1, 1, 1]);
    let mut d = dst.clone();
    d.op = ops::SET_ROWS;
    assert!(check_node(&node(&d, &[&vals, &ids, &dst]), true).is_ok());
    // #26912: dst ne[2] != values ne[2]
    let vals2 = t(ty::F32, [4, 2, 4, 1]);
    let ids2 = t(ty::I64, [2, 4, 1, 1]);
    assert!(check_node(&node(&d, &[&vals2, &ids2, &dst]), true).is_err());
}

#[test]
fn acc_offsets_are_bounded() {
    let a = t(ty::F32, [16, 1, 1, 1]);
    let b = t(ty::F32, [4, 1, 1, 1]);
    let mut d = a.clone();
    d.op = ops::ACC;
    d.op_params[0] = 64;
    d.op_params[1] = 64;
    d.op_params[2] = 64;
    d.op_params[3] = 48;
    assert!(check_node(&node(&d, &[&a, &b]), true).is_ok());
    d.op_params[3] = 52;
    assert!(check_node(&node(&d, &[&a, &b]), true).is_err());
    d.op_params[3] = -4;
    assert!(check_node(&node(&d, &[&a, &b]), true).is_err());
}

#[test]
fn unknown_and_custom_ops_refused() {
    let a = t(ty::F32, [4, 1, 1, 1]);
    let mut d = a.clone();
    d.op = ops::CUSTOM;
    assert!(check_node(&node(&d, &[&a]), true).is_err());
    d.op = ops::FLASH_ATTN_BACK;
    assert!(check_node(&node(&d, &[&a]), true).is_err());
}

#[test]
fn small_strides_refused() {
    let mut a = t(ty::F32, [4, 2, 1, 1]);
    a.nb[0] = 0;
    assert!(check_layout(&a).is_err());
}

#[test]
fn rope_freq_factors_by_mode() {
    // test-backend-ops' shapes: [80, 32, 2, 1] with n_dims 20 and n_dims/2 factors (normal), and
    // the qwen2vl ViT case [80, 16, 2, 1] in vision mode with ne0/2 factors.
    let a = t(ty::F32, [80, 32, 2, 1]);
    let pos = t(ty::I32, [2, 1, 1, 1]);
    let mut d = a.clone();
    d.op = ops::ROPE;
    d.op_params[1] = 20;
    assert!(check_node(&node(&d, &[&a, &pos, &t(ty::F32, [10, 1, 1, 1])]), true).is_ok());
    assert!(check_node(&node(&d, &[&a, &pos, &t(ty::F32, [9, 1, 1, 1])]), true).is_err());
    // Factors with no elements (an empty dimension) have no extent to read.
    assert!(check_node(&node(&d, &[&a, &pos, &t(ty::F32, [10, 0, 1, 1])]), true).is_err());

    let a = t(ty::F32, [80, 16, 2, 1]);
    let pos = t(ty::I32, [8, 1, 1, 1]);
    let mut d = a.clone();
    d.op = ops::ROPE;
    d.op_params[1] = 40;
    d.op_params[2] = 24; // vision: the whole row is rotated, ne0/2 factors used
    d.op_params[11] = 20;
    d.op_params[12] = 20;
    assert!(check_node(&node(&d, &[&a, &pos, &t(ty::F32, [40, 1, 1, 1])]), true).is_ok());
    assert!(check_node(&node(&d, &[&a, &pos, &t(ty::F32, [20, 1, 1, 1])]), true).is_err());
}

#[test]
fn group_norm_groups_bounded_by_channels() {
    let a = t(ty::F32, [9, 9, 1280, 1]);
    let mut d = a.clone();
    d.op = ops::GROUP_NORM;
    d.op_params[0] = 32;
    assert!(check_node(&node(&d, &[&a]), true).is_ok());
    d.op_params[0] = 1280;
    assert!(check_node(&node(&d, &[&a]), true).is_ok());
    d.op_params[0] = 1281;
    assert!(check_node(&node(&d, &[&a]), true).is_err());
    d.op_params[0] = i32::MAX;
    assert!(check_node(&node(&d, &[&a]), true).is_err());
}

#[test]
fn pool_2d_plane_walk() {
    let a = t(ty::F32, [13, 1, 1, 2]);
    let mut d = t(ty::F32, [7, 1, 1, 2]);
    d.op = ops::POOL_2D;
    d.op_params[..7].copy_from_slice(&[0, 1, 1, 2, 2, 0, 0]);
    assert!(check_node(&node(&d, &[&a]), true).is_ok());
    // ne[2] = 1 leaves nb[2] free in ggml's contiguity; the kernel steps through the source by it.
    for nb2 in [0, 4, 26] {
        let mut b = a.clone();
        b.nb[2] = nb2;
        assert!(b.contiguous());
        assert!(check_node(&node(&d, &[&b]), true).is_err(), "nb[2] = {nb2}");
    }
}

#[test]
fn one_element_rows_keep_nb0() {
    // ne[0] = 1 leaves nb[0] free in ggml's contiguity; these kernels assert it anyway.
    let a = t(ty::F32, [1, 4, 2, 2]);
    let mut bad = a.clone();
    bad.nb[0] = 0;
    assert!(bad.contiguous());
    for op in [ops::CUMSUM, ops::DIAG_MASK_INF, ops::DIAG_MASK_ZERO] {
        let mut d = a.clone();
        d.op = op;
        assert!(check_node(&node(&d, &[&a]), true).is_ok(), "{op}");
        assert!(check_node(&node(&d, &[&bad]), true).is_err(), "{op} src");
        let mut d2 = bad.clone();
        d2.op = op;
        assert!(check_node(&node(&d2, &[&a]), true).is_err(), "{op} result");
    }
}

fn refusal(n: &Node<'_>) -> String {
    check_node(n, true).expect_err("must be refused")
}

/// FLASH_ATTN_EXT's CPU kernel reads q rows as f32 (`_one_chunk` converts DK floats per row):
/// an f16 q is refused; llama.cpp's f32 q with f16 K/V (and a mask) passes.
#[test]
fn flash_attn_ext_q_is_f32() {
    let k = t(ty::F16, [128, 256, 4, 1]);
    let v = t(ty::F16, [128, 256, 4, 1]);
    let mask = t(ty::F16, [256, 64, 1, 1]);
    let mut d = t(ty::F32, [128, 8, 7, 1]);
    d.op = ops::FLASH_ATTN_EXT;
    d.op_params[0] = 1f32.to_bits() as i32;
    let q = t(ty::F32, [128, 7, 8, 1]);
    assert!(check_node(&node(&d, &[&q, &k, &v, &mask]), true).is_ok());
    let q16 = t(ty::F16, [128, 7, 8, 1]);
    let e = refusal(&node(&d, &[&q16, &k, &v, &mask]));
    assert!(
        e.contains("q type 1: the CPU kernel reads q rows as f32"),
        "{e}"
    );
}

/// COUNT_EQUAL's kernel splits row numbers into dims 1..3 with its own formula; shapes where
/// that split is not the real one are refused. The rule is checked against that formula for
/// every small shape.
#[test]
fn count_equal_row_split() {
    fn kernel_split_exact(n1: i64, n2: i64, n3: i64) -> bool {
        (0..n1 * n2 * n3).all(|ir| {
            // The kernel's split (ops.cpp, `ggml_compute_forward_count_equal_i32`) ...
            let i3 = ir / (n2 * n1);
            let i2 = (ir - i3 * n3) / n1;
            let i1 = ir - i3 * n3 - i2 * n2;
            // ... against the real one.
            (i1, i2, i3) == (ir % n1, ir / n1 % n2, ir / (n1 * n2))
        })
    }
    for n1 in 1..=6 {
        for n2 in 1..=6 {
            for n3 in 1..=40 {
                assert_eq!(
                    super::reduce::count_equal_split_exact(n1, n2, n3),
                    kernel_split_exact(n1, n2, n3),
                    "{n1} {n2} {n3}"
                );
            }
        }
    }
    let mut d = t(ty::I64, [1, 1, 1, 1]);
    d.op = ops::COUNT_EQUAL;
    // ggml-opt: two ARGMAX results (vectors); a matrix with whole rows also splits right.
    for ne in [[500, 1, 1, 1], [4, 500, 1, 1], [4, 3, 3, 9]] {
        let a = t(ty::I32, ne);
        assert!(check_node(&node(&d, &[&a, &a]), true).is_ok(), "{ne:?}");
    }
    // The hostile case: dim-2 indices 0, -3, -6, -9 with a free (ne[2] = 1) 1 GiB nb[2].
    let mut a = t(ty::I32, [1, 1, 1, 4]);
    a.nb[2] = 1 << 30;
    let e = refusal(&node(&d, &[&a, &a]));
    assert!(
        e.contains("COUNT_EQUAL: the kernel's row split is wrong"),
        "{e}"
    );
    // Plainly contiguous, yet i01 runs past ne[1] on the second plane.
    let a = t(ty::I32, [4, 3, 2, 1]);
    let e = refusal(&node(&d, &[&a, &a]));
    assert!(
        e.contains("COUNT_EQUAL: the kernel's row split is wrong"),
        "{e}"
    );
}

/// The tiled K-quant MUL_MAT / MUL_MAT_ID kernels find a Q8_K src[1]'s rows every nb[1] bytes.
#[test]
fn q8_k_src1_rows_every_nb1() {
    let msg = "a Q8_K src[1] is read by the tiled kernel as rows every nb[1] bytes";
    for wt in [ty::Q4_K, ty::Q6_K] {
        let w = t(wt, [256, 16, 1, 1]);
        let mut d = t(ty::F32, [16, 8, 256, 1]);
        d.op = ops::MUL_MAT;
        // Near misses that must pass: f32 activations (what llama.cpp sends), strided or not
        // (the kernel packs them into its work buffer), and a contiguous Q8_K src[1].
        let x = t(ty::F32, [256, 8, 256, 1]);
        assert!(check_node(&node(&d, &[&w, &x]), true).is_ok());
        let mut xs = x.clone();
        xs.nb = [4, 65536, 1024, 1024 * 256];
        assert!(check_node(&node(&d, &[&w, &xs]), true).is_ok());
        let q = t(ty::Q8_K, [256, 8, 256, 1]);
        assert!(check_node(&node(&d, &[&w, &q]), true).is_ok());
        // The hostile case: rows 64 KiB apart in dim 1, 292 bytes apart in dim 2.
        let mut qs = q.clone();
        qs.nb = [292, 65536, 292, 292 * 256];
        let e = refusal(&node(&d, &[&w, &qs]));
        assert!(e.contains(&format!("MUL_MAT: {msg}")), "{e}");
        // Permuted (dims 1 and 2 swapped).
        let mut qp = t(ty::Q8_K, [256, 256, 8, 1]);
        qp.ne = [256, 8, 256, 1];
        qp.nb = [292, 292 * 256, 292, 292 * 256 * 8];
        let e = refusal(&node(&d, &[&w, &qp]));
        assert!(e.contains(&format!("MUL_MAT: {msg}")), "{e}");
    }
    // MUL_MAT_ID: ne[1] = 1 leaves nb[1] free in ggml's contiguity; the kernel steps by it.
    let w = t(ty::Q4_K, [256, 16, 2, 1]);
    let ids = t(ty::I32, [1, 8, 1, 1]);
    let mut d = t(ty::F32, [16, 1, 8, 1]);
    d.op = ops::MUL_MAT_ID;
    let q = t(ty::Q8_K, [256, 1, 8, 1]);
    assert!(check_node(&node(&d, &[&w, &q, &ids]), true).is_ok());
    let x = t(ty::F32, [256, 1, 8, 1]);
    assert!(check_node(&node(&d, &[&w, &x, &ids]), true).is_ok());
    let mut qf = q.clone();
    qf.nb[1] = 1 << 30;
    assert!(qf.contiguous());
    let e = refusal(&node(&d, &[&w, &qf, &ids]));
    assert!(e.contains(&format!("MUL_MAT_ID: {msg}")), "{e}");
}
