//! Unit tests of the validator: shape helpers against ggml's, and rules by op. Every refusal is
//! asserted by the rule that refused ([`Rule`]), next to a near miss that passes, so that a test
//! cannot pass because some other rule refused.

use super::*;
use crate::{BufferRef, Device, DeviceKind};

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

/// The refusal of a node that must be refused (by the CPU backend's rules).
fn refused(n: &Node<'_>) -> Refusal {
    check_node(n, true).expect_err("must be refused")
}

/// The rule that refused a node that must be refused.
fn rule_of(n: &Node<'_>) -> Rule {
    refused(n).rule()
}

/// A host buffer of the CPU device, shared as tensors hold it.
fn cpu_buffer(size: u64) -> BufferRef {
    let dev = Device::all()
        .into_iter()
        .find(|d| d.kind() == DeviceKind::Cpu)
        .expect("a CPU device");
    dev.alloc_buffer(size).expect("a CPU buffer").share()
}

/// `t` placed at `off` in `buf`.
fn at(mut t: TensorSpec, buf: &BufferRef, off: u64) -> TensorSpec {
    t.buffer = Some((buf.clone(), off));
    t
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

const MUL_MAT_SHAPES: Rule =
    Rule::Check("MUL_MAT: src[0] {:?} and src[1] {:?} cannot be multiplied");

#[test]
fn mul_mat_shapes() {
    let a = t(ty::F32, [8, 4, 1, 1]);
    let b = t(ty::F32, [8, 3, 1, 1]);
    let mut d = t(ty::F32, [4, 3, 1, 1]);
    d.op = ops::MUL_MAT;
    assert!(check_node(&node(&d, &[&a, &b]), true).is_ok());
    let mut bad = t(ty::F32, [4, 30, 1, 1]);
    bad.op = ops::MUL_MAT;
    assert_eq!(rule_of(&node(&bad, &[&a, &b])), Rule::ResultShape);
    let b2 = t(ty::F32, [9, 3, 1, 1]);
    assert_eq!(rule_of(&node(&d, &[&a, &b2])), MUL_MAT_SHAPES);
    // zero broadcast divisor
    let a0 = t(ty::F32, [8, 4, 0, 1]);
    assert_eq!(rule_of(&node(&d, &[&a0, &b])), MUL_MAT_SHAPES);
    // I32 has no dot product on the CPU; the rule is the CPU kernel's alone.
    let ai = t(ty::I32, [8, 4, 1, 1]);
    assert_eq!(
        rule_of(&node(&d, &[&ai, &b])),
        Rule::Check("no CPU dot product for type {a}")
    );
    assert!(check_node(&node(&d, &[&ai, &b]), false).is_ok());
}

/// The shared rules of a node's sources and result, each refusing one change of a MUL_MAT that
/// passes.
#[test]
fn mul_mat_shared_rules() {
    let a = t(ty::F32, [8, 4, 1, 1]);
    let b = t(ty::F32, [8, 3, 1, 1]);
    let mut d = t(ty::F32, [4, 3, 1, 1]);
    d.op = ops::MUL_MAT;
    assert_eq!(rule_of(&node(&d, &[&a])), Rule::MissingSource);
    assert_eq!(rule_of(&node(&d, &[&a, &b, &b])), Rule::ExtraSource);
    let mut at = a.clone();
    at.nb = [16, 4, 128, 128];
    assert_eq!(
        rule_of(&node(&d, &[&at, &b])),
        Rule::Check("MUL_MAT: src[0] is transposed")
    );
    let mut d16 = t(ty::F16, [4, 3, 1, 1]);
    d16.op = ops::MUL_MAT;
    assert_eq!(rule_of(&node(&d16, &[&a, &b])), Rule::Type);
    let mut dn = d.clone();
    dn.nb = [4, 16, 12, 12];
    assert_eq!(rule_of(&node(&dn, &[&a, &b])), Rule::StridesIncrease);
    let mut bs = b.clone();
    bs.nb = [8, 64, 192, 192];
    let e = refused(&node(&d, &[&a, &bs]));
    assert_eq!(e.rule(), Rule::ElementStride);
    assert!(e.to_string().starts_with("src[1]: nb[0]=8"), "{e}");
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
    assert_eq!(
        rule_of(&node(&d1, &[&a, &rows1])),
        Rule::Check("GET_ROWS: src[0] {:?} rows {:?}")
    );
    // Row ids are i32.
    let rows64 = t(ty::I64, [5, 2, 1, 1]);
    let e = refused(&node(&d, &[&a, &rows64]));
    assert_eq!(e.rule(), Rule::Type);
    assert!(e.to_string().starts_with("row ids: type"), "{e}");
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
    assert_eq!(
        rule_of(&node(&d, &[&vals2, &ids2, &dst])),
        Rule::Check("SET_ROWS: destination {:?} values {:?}")
    );
    // Values are f32 or f16.
    let vals_i = t(ty::I32, [4, 2, 1, 1]);
    assert_eq!(rule_of(&node(&d, &[&vals_i, &ids, &dst])), Rule::Type);
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
    assert_eq!(
        rule_of(&node(&d, &[&a, &b])),
        Rule::Check("ACC/SET writes past the result")
    );
    d.op_params[3] = -4;
    assert_eq!(
        rule_of(&node(&d, &[&a, &b])),
        Rule::Check("negative stride or offset in op_params")
    );
    // ACC adds f32 only (SET also copies i32).
    let ai = t(ty::I32, [16, 1, 1, 1]);
    let bi = t(ty::I32, [4, 1, 1, 1]);
    let mut di = ai.clone();
    di.op = ops::SET;
    di.op_params[..4].copy_from_slice(&[64, 64, 64, 48]);
    assert!(check_node(&node(&di, &[&ai, &bi]), true).is_ok());
    di.op = ops::ACC;
    assert_eq!(
        rule_of(&node(&di, &[&ai, &bi])),
        Rule::Check("ACC/SET type")
    );
}

#[test]
fn unknown_and_custom_ops_refused() {
    let a = t(ty::F32, [4, 1, 1, 1]);
    let mut d = a.clone();
    for op in [
        ops::CUSTOM,
        ops::MAP_CUSTOM1,
        ops::FLASH_ATTN_BACK,
        ops::VIEW,
    ] {
        d.op = op;
        assert_eq!(rule_of(&node(&d, &[&a])), Rule::UnsupportedOp, "{op}");
    }
    // The same node with an op that has a rule passes.
    d.op = ops::SQR;
    assert!(check_node(&node(&d, &[&a]), true).is_ok());
}

#[test]
fn small_strides_refused() {
    let mut a = t(ty::F32, [4, 2, 1, 1]);
    assert!(check_layout(&a).is_ok());
    a.nb[0] = 0;
    assert_eq!(check_layout(&a).unwrap_err().rule(), Rule::Layout);
    // Through a node: the layout rule runs on every source, named in the message.
    let mut d = t(ty::F32, [4, 2, 1, 1]);
    d.op = ops::SQR;
    let e = refused(&node(&d, &[&a]));
    assert_eq!(e.rule(), Rule::Layout);
    assert!(e.to_string().starts_with("src[0]: nb[0]=0"), "{e}");
}

#[test]
fn too_many_elements_refused() {
    let ok = t(ty::I8, [1 << 16, 1 << 16, 1 << 16, 1 << 13]);
    assert!(check_layout(&ok).is_ok());
    let big = t(ty::I8, [1 << 16, 1 << 16, 1 << 16, 1 << 14]);
    let e = check_layout(&big).unwrap_err();
    assert_eq!(e.rule(), Rule::Layout);
    assert_eq!(e.to_string(), "too many elements");
}

/// A fresh result is contiguous; an in-place one has its source's layout.
#[test]
fn results_fresh_or_in_place() {
    let a = t(ty::F32, [4, 2, 1, 1]);
    let mut d = a.clone();
    d.op = ops::CONT;
    assert!(check_node(&node(&d, &[&a]), true).is_ok());
    d.nb = [8, 4, 32, 32];
    assert_eq!(rule_of(&node(&d, &[&a])), Rule::FreshResult);
    // DUP may write in place: the strided result is its strided source.
    let mut at = a.clone();
    at.nb = d.nb;
    d.op = ops::DUP;
    assert!(check_node(&node(&d, &[&at]), true).is_ok());
    assert_eq!(rule_of(&node(&d, &[&a])), Rule::FreshResult);
}

/// A result that starts inside a source's memory, elsewhere than the source, is refused; in
/// place or apart passes.
#[test]
fn partial_overlap_refused() {
    let buf = cpu_buffer(4096);
    let b = t(ty::F32, [4, 2, 1, 1]);
    let mut d = at(t(ty::F32, [4, 2, 1, 1]), &buf, 0);
    d.op = ops::ADD;
    for off in [0, 32, 64] {
        let a = at(t(ty::F32, [4, 2, 1, 1]), &buf, off);
        assert!(check_node(&node(&d, &[&a, &b]), true).is_ok(), "{off}");
    }
    for off in [4, 16, 28] {
        let a = at(t(ty::F32, [4, 2, 1, 1]), &buf, off);
        assert_eq!(rule_of(&node(&d, &[&a, &b])), Rule::PartialOverlap, "{off}");
    }
    // The same offsets in another buffer do not overlap.
    let other = cpu_buffer(4096);
    let a = at(t(ty::F32, [4, 2, 1, 1]), &other, 16);
    assert!(check_node(&node(&d, &[&a, &b]), true).is_ok());
}

/// A view stays inside the memory of the tensor it views, in the same buffer.
#[test]
fn views_stay_inside() {
    let buf = cpu_buffer(4096);
    let src = at(t(ty::F32, [4, 1, 1, 1]), &buf, 64);
    let inside = at(t(ty::F32, [2, 1, 1, 1]), &buf, 72);
    assert!(check_view(&inside, &src).is_ok());
    assert!(check_view(&src, &src).is_ok());
    for (ne, off) in [(2, 76), (4, 68), (1, 60), (1, 80)] {
        let v = at(t(ty::F32, [ne, 1, 1, 1]), &buf, off);
        assert_eq!(
            check_view(&v, &src).unwrap_err().rule(),
            Rule::ViewBounds,
            "{ne} at {off}"
        );
    }
    let other = cpu_buffer(4096);
    let v = at(t(ty::F32, [2, 1, 1, 1]), &other, 72);
    assert_eq!(check_view(&v, &src).unwrap_err().rule(), Rule::ViewBounds);
    // Without buffers there is no memory to leave.
    assert!(check_view(&t(ty::F32, [8, 1, 1, 1]), &t(ty::F32, [1, 1, 1, 1])).is_ok());
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
    assert_eq!(
        rule_of(&node(&d, &[&a, &pos, &t(ty::F32, [9, 1, 1, 1])])),
        ROPE_FACTORS
    );
    // Factors with no elements (an empty dimension) have no extent to read.
    assert_eq!(
        rule_of(&node(&d, &[&a, &pos, &t(ty::F32, [10, 0, 1, 1])])),
        ROPE_FACTORS
    );

    let a = t(ty::F32, [80, 16, 2, 1]);
    let pos = t(ty::I32, [8, 1, 1, 1]);
    let mut d = a.clone();
    d.op = ops::ROPE;
    d.op_params[1] = 40;
    d.op_params[2] = 24; // vision: the whole row is rotated, ne0/2 factors used
    d.op_params[11] = 20;
    d.op_params[12] = 20;
    assert!(check_node(&node(&d, &[&a, &pos, &t(ty::F32, [40, 1, 1, 1])]), true).is_ok());
    assert_eq!(
        rule_of(&node(&d, &[&a, &pos, &t(ty::F32, [20, 1, 1, 1])])),
        ROPE_FACTORS
    );
}

const ROPE_FACTORS: Rule = Rule::Check("ROPE: {} freq factors, {used} used");

#[test]
fn group_norm_groups_bounded_by_channels() {
    let a = t(ty::F32, [9, 9, 1280, 1]);
    let mut d = a.clone();
    d.op = ops::GROUP_NORM;
    d.op_params[0] = 32;
    assert!(check_node(&node(&d, &[&a]), true).is_ok());
    d.op_params[0] = 1280;
    assert!(check_node(&node(&d, &[&a]), true).is_ok());
    for groups in [1281, i32::MAX, 0, -1] {
        d.op_params[0] = groups;
        assert_eq!(
            rule_of(&node(&d, &[&a])),
            Rule::Check("GROUP_NORM: {groups} groups for {} channels"),
            "{groups}"
        );
    }
}

#[test]
fn pool_2d_plane_walk() {
    let a = t(ty::F32, [13, 1, 1, 2]);
    let mut d = t(ty::F32, [7, 1, 1, 2]);
    d.op = ops::POOL_2D;
    d.op_params[..7].copy_from_slice(&[0, 1, 1, 2, 2, 0, 0]);
    assert!(check_node(&node(&d, &[&a]), true).is_ok());
    // ne[2] = 1 leaves nb[2] free in ggml's contiguity; the kernel steps through the source by it.
    for (nb2, rule) in [
        (0, "{what}: zero plane stride"),
        (4, "{what}: {steps} plane steps for {planes} planes"),
        (26, "{what}: {steps} plane steps for {planes} planes"),
    ] {
        let mut b = a.clone();
        b.nb[2] = nb2;
        assert!(b.contiguous());
        assert_eq!(
            rule_of(&node(&d, &[&b])),
            Rule::Check(rule),
            "nb[2] = {nb2}"
        );
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
        assert_eq!(rule_of(&node(&d, &[&bad])), Rule::ElementStride, "{op} src");
        let mut d2 = bad.clone();
        d2.op = op;
        assert_eq!(
            rule_of(&node(&d2, &[&a])),
            Rule::ElementStride,
            "{op} result"
        );
    }
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
    let e = refused(&node(&d, &[&q16, &k, &v, &mask]));
    assert_eq!(
        e.rule(),
        Rule::Check("FLASH_ATTN_EXT: q type {}: the CPU kernel reads q rows as f32")
    );
    assert!(
        e.to_string()
            .contains("q type 1: the CPU kernel reads q rows as f32"),
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
    let split = Rule::Check("COUNT_EQUAL: the kernel's row split is wrong for shape {:?}");
    assert_eq!(rule_of(&node(&d, &[&a, &a])), split);
    // Plainly contiguous, yet i01 runs past ne[1] on the second plane.
    let a = t(ty::I32, [4, 3, 2, 1]);
    assert_eq!(rule_of(&node(&d, &[&a, &a])), split);
}

/// The tiled K-quant MUL_MAT / MUL_MAT_ID kernels find a Q8_K src[1]'s rows every nb[1] bytes.
#[test]
fn q8_k_src1_rows_every_nb1() {
    let msg = "a Q8_K src[1] is read by the tiled kernel as rows every nb[1] bytes";
    let q8k = Rule::Check(
        "{op}: a Q8_K src[1] is read by the tiled kernel as rows every nb[1] bytes; ne {:?} nb {:?} are not",
    );
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
        let e = refused(&node(&d, &[&w, &qs]));
        assert_eq!(e.rule(), q8k);
        assert!(e.to_string().contains(&format!("MUL_MAT: {msg}")), "{e}");
        // Permuted (dims 1 and 2 swapped).
        let mut qp = t(ty::Q8_K, [256, 256, 8, 1]);
        qp.ne = [256, 8, 256, 1];
        qp.nb = [292, 292 * 256, 292, 292 * 256 * 8];
        let e = refused(&node(&d, &[&w, &qp]));
        assert_eq!(e.rule(), q8k);
        assert!(e.to_string().contains(&format!("MUL_MAT: {msg}")), "{e}");
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
    let e = refused(&node(&d, &[&w, &qf, &ids]));
    assert_eq!(e.rule(), q8k);
    assert!(e.to_string().contains(&format!("MUL_MAT_ID: {msg}")), "{e}");
}
