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
