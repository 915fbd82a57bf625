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
