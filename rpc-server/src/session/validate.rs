//! Per-node validation of GRAPH_COMPUTE graphs, beyond what the stock server checks.
//!
//! Every tensor that reaches here already has a valid type, whole blocks per row and, when it has
//! a buffer, an extent inside that buffer (`session/tensor.rs`). That alone does not make a graph
//! safe: ggml's CPU kernels index one tensor with another tensor's shape, with `op_params`, or with
//! the *contents* of index tensors, and they only `assert()` (compiled out) or `GGML_ASSERT` (abort
//! the whole process) on mismatches. So for every node that computes something this module checks
//!
//! - the relations ggml's op constructor establishes (`ggml.c`: `ggml_mul_mat`, `ggml_get_rows`,
//!   `ggml_concat`, ...): which sources must exist, source/destination shapes and types, and the
//!   destination shape the constructor would have produced;
//! - the layout assumptions and `GGML_ASSERT`s of the CPU kernels (`ggml-cpu/ops.cpp`), e.g. a
//!   destination written as a flat array must be contiguous, `nb[0]` must be the element size;
//! - `op_params` that kernels use as sizes or offsets (views, ACC/SET, ROPE dims, padding, ...);
//! - and it returns the data-dependent checks ([`IndexCheck`]) that must run before *every*
//!   compute and recompute: GET_ROWS / GET_ROWS_BACK / SET_ROWS row ids, MUL_MAT_ID expert ids,
//!   ADD_ID ids, SSM_SCAN state ids.
//!
//! A legitimate client builds its graphs with those same constructors, so it always passes; the
//! raw-protocol suite, the end-to-end tests and llama.cpp's `test-backend-ops` (run against this
//! server) are the evidence. Whatever is unknown is refused.

use crate::ggml::{ops, type_info, TensorSpec};

/// ggml type ids (`enum ggml_type`, fixed by the protocol; defined once in `rpc-proto`).
pub(crate) use rpc_proto::ggml_type as ty;
/// `GGML_TENSOR_FLAG_PARAM`.
use rpc_proto::TENSOR_FLAG_PARAM as FLAG_PARAM;

/// A check on the contents of an index tensor, run before every compute of the graph.
#[derive(Debug, Clone)]
pub(crate) struct IndexCheck {
    /// Index of the index tensor in the graph's tensor list.
    pub tensor: u32,
    /// Element type: I32 or I64.
    pub type_: u32,
    /// Every value must be in `[0, bound)`.
    pub bound: u64,
    /// What the values index, for the error message.
    pub what: &'static str,
}

type R = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {{
        // Negated on purpose: a float condition fails on NaN too.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if !$cond {
            return Err(format!($($fmt)+));
        }
    }};
}

/// Shape helpers with the exact semantics of ggml's (`ggml.c`).
pub(crate) trait Shape {
    fn spec(&self) -> &TensorSpec;
    fn ne(&self, i: usize) -> i64 {
        self.spec().ne[i] as i64
    }
    fn nb(&self, i: usize) -> u64 {
        self.spec().nb[i]
    }
    fn ty(&self) -> u32 {
        self.spec().type_
    }
    fn ts(&self) -> u64 {
        type_info(self.ty()).map(|i| i.type_size).unwrap_or(0)
    }
    fn blck(&self) -> i64 {
        type_info(self.ty())
            .map(|i| i.blck_size as i64)
            .unwrap_or(1)
    }
    fn quantized(&self) -> bool {
        type_info(self.ty()).is_some_and(|i| i.is_quantized)
    }
    fn nelements(&self) -> i128 {
        (0..4).map(|i| self.ne(i) as i128).product()
    }
    fn nrows(&self) -> i128 {
        (1..4).map(|i| self.ne(i) as i128).product()
    }
    fn is_empty(&self) -> bool {
        (0..4).any(|i| self.ne(i) == 0)
    }
    fn is_scalar(&self) -> bool {
        (0..4).all(|i| self.ne(i) == 1)
    }
    fn is_vector(&self) -> bool {
        self.ne(1) == 1 && self.ne(2) == 1 && self.ne(3) == 1
    }
    fn is_matrix(&self) -> bool {
        self.ne(2) == 1 && self.ne(3) == 1
    }
    fn is_3d(&self) -> bool {
        self.ne(3) == 1
    }
    fn row_size(&self) -> u64 {
        self.ts() * (self.ne(0) as u64) / (self.blck() as u64)
    }
    /// `ggml_nbytes`.
    fn nbytes(&self) -> u128 {
        let s = self.spec();
        crate::session::nbytes(s.type_, &s.ne, &s.nb)
            .map(|n| n as u128)
            .unwrap_or(u128::MAX)
    }
    /// `ggml_is_contiguous_m_n`.
    fn contiguous_m_n(&self, m: usize, n: usize) -> bool {
        let mut next_nb = self.ts() as u128;
        if self.ne(0) != self.blck() && self.nb(0) as u128 != next_nb {
            return false;
        }
        next_nb *= (self.ne(0) / self.blck()) as u128;
        for i in 1..n {
            if i > m {
                if self.ne(i) != 1 && self.nb(i) as u128 != next_nb {
                    return false;
                }
                next_nb *= self.ne(i) as u128;
            } else {
                next_nb = self.ne(i) as u128 * self.nb(i) as u128;
            }
        }
        true
    }
    fn contiguous(&self) -> bool {
        self.contiguous_m_n(0, 4)
    }
    fn contiguous_1(&self) -> bool {
        self.contiguous_m_n(1, 4)
    }
    #[allow(dead_code)]
    fn contiguous_2(&self) -> bool {
        self.contiguous_m_n(2, 4)
    }
    fn contiguous_rows(&self) -> bool {
        self.ne(0) == self.blck() || self.nb(0) == self.ts()
    }
    fn transposed(&self) -> bool {
        self.nb(0) > self.nb(1)
    }
    fn padded_1d(&self) -> bool {
        self.nb(0) == self.ts()
            && self.nb(2) as u128 == self.nb(1) as u128 * self.ne(1) as u128
            && self.nb(3) as u128 == self.nb(2) as u128 * self.ne(2) as u128
    }
    /// Rows addressed as `i*nb[1]` for `i < nrows` (kernels that flatten dims 1..3) stay inside the
    /// tensor's extent.
    fn flat_rows_fit(&self) -> bool {
        let nr = self.nrows();
        nr == 0 || (nr - 1) as u128 * self.nb(1) as u128 + self.row_size() as u128 <= self.nbytes()
    }
    /// The tensor can be written or read as a flat array of `nelements` (kernels that index
    /// `data[i]`).
    fn flat_fits(&self) -> bool {
        self.nelements() as u128 * self.ts() as u128 / self.blck() as u128 <= self.nbytes()
    }
    fn op_i32(&self, i: usize) -> i32 {
        self.spec().op_params[i]
    }
    fn op_f32(&self, i: usize) -> f32 {
        f32::from_bits(self.spec().op_params[i] as u32)
    }
}

impl Shape for TensorSpec {
    fn spec(&self) -> &TensorSpec {
        self
    }
}

fn same_shape(a: &TensorSpec, b: &TensorSpec) -> bool {
    a.ne == b.ne
}

fn same_stride(a: &TensorSpec, b: &TensorSpec) -> bool {
    a.nb == b.nb
}

/// `a % b == 0` with `b != 0` (a zero divisor is a SIGFPE in the kernels).
fn divides(b: i64, a: i64) -> bool {
    b != 0 && a % b == 0
}

/// `ggml_can_repeat(t0, t1)`: t0 can be broadcast to t1.
fn can_repeat(t0: &TensorSpec, t1: &TensorSpec) -> bool {
    if t0.is_empty() {
        t1.is_empty()
    } else {
        (0..4).all(|i| divides(t0.ne(i), t1.ne(i)))
    }
}

fn ne_eq(t: &TensorSpec, want: [i64; 4]) -> R {
    let got = [t.ne(0), t.ne(1), t.ne(2), t.ne(3)];
    ensure!(got == want, "result shape {got:?}, expected {want:?}");
    Ok(())
}

/// A fresh result tensor (`ggml_new_tensor`) is contiguous; an in-place result (`ggml_view_tensor`
/// of `src0`) has `src0`'s shape and strides.
fn fresh_or_inplace(d: &TensorSpec, a: &TensorSpec) -> R {
    ensure!(
        d.contiguous() || (same_shape(d, a) && same_stride(d, a)),
        "result must be contiguous or an in-place view of its first source"
    );
    Ok(())
}

fn fresh(d: &TensorSpec) -> R {
    ensure!(d.contiguous(), "result must be contiguous");
    Ok(())
}

fn nb0_is_ts(t: &TensorSpec, what: &str) -> R {
    ensure!(
        t.nb(0) == t.ts(),
        "{what}: nb[0]={} must be the element size {}",
        t.nb(0),
        t.ts()
    );
    Ok(())
}

fn ty_is(t: &TensorSpec, want: u32, what: &str) -> R {
    ensure!(
        t.ty() == want,
        "{what}: type {} where {} is required",
        t.ty(),
        want
    );
    Ok(())
}

fn ty_in(t: &TensorSpec, want: &[u32], what: &str) -> R {
    ensure!(
        want.contains(&t.ty()),
        "{what}: type {} not in {:?}",
        t.ty(),
        want
    );
    Ok(())
}

/// Checks that hold for every tensor of a graph that a kernel may read or write.
pub(crate) fn check_layout(t: &TensorSpec) -> R {
    let info = type_info(t.type_).ok_or("invalid type")?;
    // Elements (or blocks) do not overlap their neighbours in dim 0; with the extent check this
    // bounds every row read or written as `ne[0]` consecutive elements.
    if t.ne.iter().all(|&n| n > 0) && t.ne[0] > 1 {
        ensure!(
            t.nb[0] >= info.type_size,
            "nb[0]={} is smaller than the element size {}",
            t.nb[0],
            info.type_size
        );
    }
    // ggml computes element counts in int64.
    ensure!(t.nelements() < (1i128 << 62), "too many elements");
    Ok(())
}

/// A view of `src` (VIEW/RESHAPE/PERMUTE/TRANSPOSE/NONE with `view_src`, or an in-place result)
/// must stay inside the memory of the tensor it views when both live in buffers.
pub(crate) fn check_view(view: &TensorSpec, src: &TensorSpec) -> R {
    let (Some((vb, voff)), Some((sb, soff))) = (&view.buffer, &src.buffer) else {
        return Ok(());
    };
    let vsize = view.nbytes();
    if vsize == 0 {
        return Ok(());
    }
    ensure!(
        std::sync::Arc::ptr_eq(vb, sb),
        "view and its view_src are in different buffers"
    );
    let (v0, s0) = (*voff as u128, *soff as u128);
    ensure!(
        v0 >= s0 && v0 + vsize <= s0 + src.nbytes(),
        "view [{v0}, +{vsize}) outside its view_src [{s0}, +{})",
        src.nbytes()
    );
    Ok(())
}

/// Sources of a node, by slot.
pub(crate) struct Node<'a> {
    pub d: &'a TensorSpec,
    pub src: [Option<&'a TensorSpec>; 10],
    /// Index of each source in the graph's tensor list.
    pub src_idx: [Option<u32>; 10],
}

impl<'a> Node<'a> {
    fn s(&self, i: usize) -> Result<&'a TensorSpec, String> {
        self.src[i].ok_or_else(|| format!("src[{i}] is missing"))
    }
    fn none_from(&self, i: usize) -> R {
        for j in i..10 {
            ensure!(self.src[j].is_none(), "unexpected src[{j}]");
        }
        Ok(())
    }
    fn idx(&self, i: usize) -> u32 {
        self.src_idx[i].unwrap_or(u32::MAX)
    }
}

/// The result may be computed in place (same memory as a source, from the same address, as
/// ggml's in-place ops and ggml-alloc's buffer reuse do), or in memory no source occupies; a
/// result that starts inside a source's memory elsewhere makes the kernels copy between overlapping
/// ranges (undefined behaviour, found by fuzzing: `memcpy` in RMS_NORM).
fn check_no_partial_overlap(n: &Node<'_>) -> R {
    let Some((db, doff)) = &n.d.buffer else {
        return Ok(());
    };
    let dlen = n.d.nbytes();
    for (i, s) in n.src.iter().enumerate() {
        let Some(s) = s else { continue };
        let Some((sb, soff)) = &s.buffer else {
            continue;
        };
        if !std::sync::Arc::ptr_eq(db, sb) || soff == doff {
            continue;
        }
        let (d0, s0) = (*doff as u128, *soff as u128);
        let slen = s.nbytes();
        ensure!(
            d0 + dlen <= s0 || s0 + slen <= d0 || dlen == 0 || slen == 0,
            "result partially overlaps src[{i}]"
        );
    }
    Ok(())
}

/// Validates one computing node. Returns the data-dependent checks it needs.
pub(crate) fn check_node(n: &Node<'_>, cpu: bool) -> Result<Vec<IndexCheck>, String> {
    let d = n.d;
    let mut checks = Vec::new();
    check_no_partial_overlap(n)?;
    // Every tensor a kernel touches has plausible strides.
    check_layout(d).map_err(|e| format!("result: {e}"))?;
    for (i, s) in n.src.iter().enumerate() {
        if let Some(s) = s {
            check_layout(s).map_err(|e| format!("src[{i}]: {e}"))?;
        }
    }
    let op = d.op;
    match op {
        ops::DUP | ops::CONT => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(a.nelements() == d.nelements(), "element counts differ");
            ensure!(a.ty() == d.ty(), "DUP/CONT keep the type");
            if op == ops::DUP {
                fresh_or_inplace(d, a)?;
            } else {
                fresh(d)?;
            }
            copy_rules(a, d, cpu)?;
        }
        ops::CPY => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            // The result is a view of b (ggml_cpy) or b itself (ggml_cast); kernels write through
            // the result with b's shape and strides.
            ensure!(
                same_shape(b, d) && same_stride(b, d) && b.ty() == d.ty(),
                "CPY result must be its destination src[1]"
            );
            ensure!(
                a.nelements() == d.nelements(),
                "element counts differ ({} vs {})",
                a.nelements(),
                d.nelements()
            );
            copy_rules(a, d, cpu)?;
        }
        ops::ADD | ops::SUB | ops::MUL | ops::DIV => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(same_shape(a, d), "result shape differs from src[0]");
            if a.quantized() {
                // add_q_f32 (ggml_add_cast): same shapes, src1 f32.
                ensure!(op == ops::ADD, "only ADD takes a quantized src[0]");
                ensure!(
                    same_shape(a, b),
                    "ADD of a quantized tensor needs equal shapes"
                );
                ty_is(b, ty::F32, "src[1]")?;
                nb0_is_ts(a, "src[0]")?;
                nb0_is_ts(b, "src[1]")?;
                ensure!(
                    d.nb(0) <= d.nb(1) && d.nb(1) <= d.nb(2) && d.nb(2) <= d.nb(3),
                    "result strides must increase"
                );
                // Rows are dequantized, added, and converted back with the result type's
                // from_float, or copied as `ne0*nb0` bytes of f32 when it has none.
                ensure!(
                    type_info(a.ty()).is_some_and(|i| i.has_to_float),
                    "no dequantization for type {}",
                    a.ty()
                );
                ensure!(
                    d.ty() == ty::F32 || type_info(d.ty()).is_some_and(|i| i.cpu_from_float),
                    "no conversion to the result type"
                );
                ensure!(
                    d.ne(0) % d.blck() == 0 && d.contiguous_rows(),
                    "result rows"
                );
            } else {
                ensure!(can_repeat(b, a), "src[1] cannot be broadcast to src[0]");
                if d.ty() == a.ty() {
                    fresh_or_inplace(d, a)?;
                } else {
                    fresh(d)?;
                }
                nb0_is_ts(d, "result")?;
                nb0_is_ts(a, "src[0]")?;
                if cpu {
                    binary_types(a.ty(), b.ty(), d.ty())?;
                }
            }
        }
        ops::ADD_ID => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            let ids = n.s(2)?;
            n.none_from(3)?;
            ensure!(
                a.ne(0) == b.ne(0) && a.ne(1) == ids.ne(0) && a.ne(2) == ids.ne(1),
                "ADD_ID shapes"
            );
            ty_is(ids, ty::I32, "ids")?;
            ensure!(same_shape(a, d), "result shape differs from src[0]");
            fresh(d)?;
            for (t, w) in [(d, "result"), (a, "src[0]"), (b, "src[1]")] {
                ty_is(t, ty::F32, w)?;
                nb0_is_ts(t, w)?;
            }
            checks.push(IndexCheck {
                tensor: n.idx(2),
                type_: ty::I32,
                bound: b.ne(1) as u64,
                what: "ADD_ID row of src[1]",
            });
            rows_of(ids, 1)?;
        }
        ops::ADD1 => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(b.is_scalar(), "src[1] must be a scalar");
            ensure!(a.padded_1d(), "src[0] must be padded 1d");
            ensure!(same_shape(a, d), "result shape differs from src[0]");
            fresh_or_inplace(d, a)?;
            nb0_is_ts(d, "result")?;
            if cpu {
                let ok = matches!(
                    (a.ty(), b.ty(), d.ty()),
                    (ty::F32, ty::F32, ty::F32)
                        | (ty::F16, ty::F32, ty::F16)
                        | (ty::F16, ty::F16, ty::F16)
                        | (ty::BF16, ty::F32, ty::BF16)
                        | (ty::BF16, ty::BF16, ty::BF16)
                ) || (a.quantized() && a.ty() == d.ty() && b.ty() == ty::F32);
                ensure!(ok, "ADD1 types");
                if a.quantized() {
                    ensure!(
                        d.nb(0) <= d.nb(1) && d.nb(1) <= d.nb(2) && d.nb(2) <= d.nb(3),
                        "result strides must increase"
                    );
                }
            }
        }
        ops::ACC | ops::SET => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(b.nelements() <= a.nelements(), "src[1] larger than src[0]");
            ensure!(same_shape(a, d), "result shape differs from src[0]");
            ensure!(
                a.contiguous() && d.contiguous(),
                "ACC/SET need contiguous tensors"
            );
            let esz: u64 = match (op, a.ty()) {
                (ops::ACC, ty::F32) => 4,
                (ops::SET, ty::F32) | (ops::SET, ty::I32) => 4,
                _ => return Err("ACC/SET type".into()),
            };
            ensure!(b.ty() == a.ty() && d.ty() == a.ty(), "ACC/SET types differ");
            nb0_is_ts(b, "src[1]")?;
            // op_params: nb1, nb2, nb3, offset (int32, used as size_t), inplace.
            let p: Vec<i64> = (0..4).map(|i| d.op_i32(i) as i64).collect();
            ensure!(
                p.iter().all(|&x| x >= 0),
                "negative stride or offset in op_params"
            );
            let mut last: i128 = p[3] as i128;
            last += (b.ne(0).max(1) - 1) as i128 * esz as i128;
            for i in 1..4 {
                last += (b.ne(i).max(1) - 1) as i128 * p[i - 1] as i128;
            }
            ensure!(
                last + esz as i128 <= d.nbytes() as i128,
                "ACC/SET writes past the result"
            );
            ensure!(
                last + esz as i128 <= a.nbytes() as i128,
                "ACC/SET reads past src[0]"
            );
            ensure!(matches!(d.op_i32(4), 0 | 1), "inplace flag");
            if d.op_i32(4) == 1 {
                ensure!(
                    d.spec().buffer.as_ref().map(|x| x.1) == a.spec().buffer.as_ref().map(|x| x.1),
                    "in-place ACC/SET must alias src[0]"
                );
            }
        }
        ops::SQR | ops::SQRT | ops::LOG | ops::SIN | ops::COS => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(same_shape(a, d), "result shape differs from src[0]");
            fresh_or_inplace(d, a)?;
            unary_kernel(a, d, cpu)?;
        }
        ops::SUM => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ne_eq(d, [1, 1, 1, 1])?;
            ensure!(d.ty() == a.ty(), "SUM keeps the type");
            if cpu {
                ty_in(a, &[ty::F32, ty::F16, ty::BF16], "src[0]")?;
            }
        }
        ops::SUM_ROWS | ops::MEAN => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ne_eq(d, [1, a.ne(1), a.ne(2), a.ne(3)])?;
            if op == ops::MEAN {
                ty_is(d, ty::F32, "result")?;
            } else {
                ensure!(d.ty() == a.ty(), "SUM_ROWS keeps the type");
            }
            if cpu {
                ty_is(a, ty::F32, "src[0]")?;
                nb0_is_ts(a, "src[0]")?;
                nb0_is_ts(d, "result")?;
            }
        }
        ops::CUMSUM => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ty_is(a, ty::F32, "src[0]")?;
            ensure!(same_shape(a, d) && d.ty() == ty::F32, "CUMSUM result");
            fresh(d)?;
            nb0_is_ts(a, "src[0]")?;
        }
        ops::ARGMAX => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(
                a.is_matrix() && a.ne(0) <= i32::MAX as i64,
                "ARGMAX needs a matrix"
            );
            ne_eq(d, [a.ne(1), 1, 1, 1])?;
            ty_is(d, ty::I32, "result")?;
            ty_is(a, ty::F32, "src[0]")?;
            nb0_is_ts(a, "src[0]")?;
            fresh(d)?;
        }
        ops::COUNT_EQUAL => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(same_shape(a, b), "COUNT_EQUAL shapes");
            ne_eq(d, [1, 1, 1, 1])?;
            ty_is(d, ty::I64, "result")?;
            ty_is(a, ty::I32, "src[0]")?;
            ty_is(b, ty::I32, "src[1]")?;
        }
        ops::REPEAT => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(can_repeat(a, d), "src[0] cannot be repeated to the result");
            ensure!(d.ty() == a.ty(), "REPEAT keeps the type");
            fresh(d)?;
            if cpu {
                ty_in(a, &[ty::F32, ty::F16, ty::BF16, ty::I16, ty::I32], "src[0]")?;
                nb0_is_ts(a, "src[0]")?;
            }
        }
        ops::REPEAT_BACK => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(can_repeat(d, a), "result cannot be repeated to src[0]");
            ensure!(d.ty() == a.ty(), "REPEAT_BACK keeps the type");
            fresh(d)?;
            ty_is(a, ty::F32, "src[0]")?;
            nb0_is_ts(a, "src[0]")?;
        }
        ops::CONCAT => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            let dim = d.op_i32(0);
            ensure!((0..4).contains(&dim), "CONCAT dim {dim}");
            let dim = dim as usize;
            ensure!(a.ty() == b.ty() && d.ty() == a.ty(), "CONCAT types differ");
            let mut want = [0i64; 4];
            for (i, w) in want.iter_mut().enumerate() {
                if i == dim {
                    *w = a.ne(i) + b.ne(i);
                } else {
                    ensure!(a.ne(i) == b.ne(i), "CONCAT shapes differ in dim {i}");
                    *w = a.ne(i);
                }
            }
            ne_eq(d, want)?;
            fresh(d)?;
            // The f32/f16/i8-sized kernels copy element by element through the strides; the
            // generic one copies whole rows.
            if !matches!(
                a.ty(),
                ty::F32 | ty::I32 | ty::F16 | ty::BF16 | ty::I16 | ty::I8
            ) {
                ensure!(
                    a.contiguous_rows() && b.contiguous_rows(),
                    "CONCAT sources need contiguous rows"
                );
            }
        }
        ops::SILU_BACK => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(same_shape(a, d) && same_shape(a, b), "SILU_BACK shapes");
            fresh(d)?;
            ensure!(
                a.contiguous_1() && b.contiguous_1(),
                "SILU_BACK needs contiguous rows"
            );
            ensure!(a.ty() == d.ty() && b.ty() == d.ty(), "SILU_BACK types");
            ty_in(d, &[ty::F32, ty::F16], "result")?;
        }
        ops::NORM | ops::RMS_NORM | ops::L2_NORM | ops::GROUP_NORM => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(same_shape(a, d), "result shape differs from src[0]");
            fresh_or_inplace(d, a)?;
            ty_is(a, ty::F32, "src[0]")?;
            ty_is(d, ty::F32, "result")?;
            if op == ops::RMS_NORM || op == ops::GROUP_NORM {
                // NORM and L2_NORM go through the strides; these two read rows as float arrays.
                nb0_is_ts(a, "src[0]")?;
            }
            let eps = if op == ops::GROUP_NORM {
                d.op_f32(1)
            } else {
                d.op_f32(0)
            };
            ensure!(eps >= 0.0, "negative eps");
            if op == ops::GROUP_NORM {
                ensure!(d.op_i32(0) > 0, "GROUP_NORM n_groups");
            }
        }
        ops::RMS_NORM_BACK => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(same_shape(a, d) && same_shape(a, b), "RMS_NORM_BACK shapes");
            fresh(d)?;
            for (t, w) in [(d, "result"), (a, "src[0]"), (b, "src[1]")] {
                ty_is(t, ty::F32, w)?;
                nb0_is_ts(t, w)?;
            }
        }
        ops::MUL_MAT => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(
                a.ne(0) == b.ne(0) && divides(a.ne(2), b.ne(2)) && divides(a.ne(3), b.ne(3)),
                "MUL_MAT: src[0] {:?} and src[1] {:?} cannot be multiplied",
                a.ne,
                b.ne
            );
            ensure!(!a.transposed(), "MUL_MAT: src[0] is transposed");
            ne_eq(d, [a.ne(1), b.ne(1), b.ne(2), b.ne(3)])?;
            ty_is(d, ty::F32, "result")?;
            nb0_is_ts(d, "result")?;
            ensure!(
                d.nb(0) <= d.nb(1) && d.nb(1) <= d.nb(2) && d.nb(2) <= d.nb(3),
                "result strides must increase"
            );
            ensure!(d.flat_fits() || d.contiguous_rows(), "result layout");
            nb0_is_ts(a, "src[0]")?;
            nb0_is_ts(b, "src[1]")?;
            if cpu {
                mul_mat_types(a.ty(), b.ty())?;
            }
        }
        ops::MUL_MAT_ID => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            let ids = n.s(2)?;
            n.none_from(3)?;
            ensure!(!a.transposed(), "MUL_MAT_ID: src[0] is transposed");
            ty_is(ids, ty::I32, "ids")?;
            ensure!(a.ne(3) == 1 && b.ne(3) == 1, "MUL_MAT_ID needs 3d sources");
            ensure!(
                ids.ne(2) == 1 && ids.ne(3) == 1,
                "MUL_MAT_ID ids must be 2d"
            );
            ensure!(
                ids.ne(1) == b.ne(2),
                "MUL_MAT_ID: one expert list per src[1] row"
            );
            ensure!(
                a.ne(0) == b.ne(0),
                "MUL_MAT_ID: src[0] and src[1] cannot be multiplied"
            );
            ensure!(
                divides(b.ne(1), ids.ne(0)),
                "MUL_MAT_ID: src[1] cannot be broadcast to ids"
            );
            ensure!(a.ne(2) > 0, "MUL_MAT_ID: no experts");
            ne_eq(d, [a.ne(1), ids.ne(0), b.ne(2), 1])?;
            ty_is(d, ty::F32, "result")?;
            nb0_is_ts(d, "result")?;
            ensure!(
                d.nb(0) <= d.nb(1) && d.nb(1) <= d.nb(2) && d.nb(2) <= d.nb(3),
                "result strides must increase"
            );
            nb0_is_ts(a, "src[0]")?;
            nb0_is_ts(b, "src[1]")?;
            if cpu {
                mul_mat_types(a.ty(), b.ty())?;
            }
            checks.push(IndexCheck {
                tensor: n.idx(2),
                type_: ty::I32,
                bound: a.ne(2) as u64,
                what: "MUL_MAT_ID expert",
            });
        }
        ops::OUT_PROD => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(
                a.ne(1) == b.ne(1) && divides(a.ne(2), b.ne(2)) && divides(a.ne(3), b.ne(3)),
                "OUT_PROD shapes"
            );
            ensure!(!a.transposed(), "OUT_PROD: src[0] is transposed");
            ne_eq(d, [a.ne(0), b.ne(0), b.ne(2), b.ne(3)])?;
            ty_is(d, ty::F32, "result")?;
            ty_is(b, ty::F32, "src[1]")?;
            nb0_is_ts(d, "result")?;
            nb0_is_ts(a, "src[0]")?;
            if a.ty() != ty::F32 {
                ensure!(a.ty() == ty::F16 || a.quantized(), "OUT_PROD src[0] type");
                ensure!(
                    a.ne(2) == b.ne(2) && a.ne(3) == b.ne(3),
                    "OUT_PROD of f16/quantized does not broadcast"
                );
                ensure!(
                    a.ty() == ty::F16 || type_info(a.ty()).is_some_and(|i| i.has_to_float),
                    "OUT_PROD: no dequantization"
                );
            }
        }
        ops::SCALE => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(a.padded_1d(), "SCALE: src[0] must be padded 1d");
            ensure!(same_shape(a, d) && d.ty() == a.ty(), "SCALE result");
            ensure!(
                a.contiguous() && d.contiguous(),
                "SCALE needs contiguous tensors"
            );
            ty_in(a, &[ty::F32, ty::BF16], "src[0]")?;
        }
        ops::GET_ROWS => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(
                a.ne(2) == b.ne(1) && a.ne(3) == b.ne(2) && b.ne(3) == 1,
                "GET_ROWS: src[0] {:?} rows {:?}",
                a.ne,
                b.ne
            );
            ty_is(b, ty::I32, "row ids")?;
            let want_ty = if a.ty() == ty::I32 { ty::I32 } else { ty::F32 };
            ensure!(d.ty() == want_ty, "GET_ROWS result type {}", d.ty());
            ne_eq(d, [a.ne(0), b.ne(0), b.ne(1), b.ne(2)])?;
            nb0_is_ts(d, "result")?;
            if cpu {
                let ok = matches!(a.ty(), ty::F32 | ty::I32 | ty::F16 | ty::BF16)
                    || (a.quantized() && type_info(a.ty()).is_some_and(|i| i.has_to_float));
                ensure!(ok, "GET_ROWS src[0] type {}", a.ty());
                nb0_is_ts(a, "src[0]")?;
            }
            checks.push(IndexCheck {
                tensor: n.idx(1),
                type_: ty::I32,
                bound: a.ne(1) as u64,
                what: "GET_ROWS row",
            });
        }
        ops::GET_ROWS_BACK => {
            // ggml_get_rows_back(a, b, c): src[0] = a (gradient rows), src[1] = b (row ids); c
            // only gives the result shape.
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(
                a.is_matrix() && b.is_vector() && b.ty() == ty::I32,
                "GET_ROWS_BACK sources"
            );
            ensure!(d.is_matrix() && a.ne(0) == d.ne(0), "GET_ROWS_BACK shapes");
            ty_is(d, ty::F32, "result")?;
            ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
            fresh(d)?;
            nb0_is_ts(a, "src[0]")?;
            // The kernel reads b as a flat array of nelements(b) ids and src[0] row i for each.
            ensure!(
                b.nelements() <= a.ne(1) as i128,
                "GET_ROWS_BACK: more ids than src[0] rows"
            );
            ensure!(b.flat_fits(), "GET_ROWS_BACK ids layout");
            checks.push(IndexCheck {
                tensor: n.idx(1),
                type_: ty::I32,
                bound: d.ne(1) as u64,
                what: "GET_ROWS_BACK row",
            });
        }
        ops::SET_ROWS => {
            // ggml_set_rows(a, b, c): result = view of a, src[0] = b (values), src[1] = c (row
            // ids), src[2] = a.
            let b = n.s(0)?;
            let c = n.s(1)?;
            n.none_from(3)?;
            if let Some(a) = n.src[2] {
                ensure!(
                    same_shape(a, d) && same_stride(a, d) && a.ty() == d.ty(),
                    "SET_ROWS result must be a view of src[2]"
                );
            }
            ensure!(
                d.ne(0) == b.ne(0) && d.ne(2) == b.ne(2) && d.ne(3) == b.ne(3),
                "SET_ROWS: destination {:?} values {:?}",
                d.ne,
                b.ne
            );
            ensure!(b.ne(1) == c.ne(0), "SET_ROWS: one row id per value row");
            ensure!(
                divides(c.ne(1), b.ne(2)) && divides(c.ne(2), b.ne(3)) && c.ne(3) == 1,
                "SET_ROWS: row ids cannot be broadcast"
            );
            ty_in(b, &[ty::F32, ty::F16], "values")?;
            ty_in(c, &[ty::I64, ty::I32], "row ids")?;
            ensure!(
                d.contiguous_rows() && b.contiguous_rows(),
                "SET_ROWS needs contiguous rows"
            );
            if cpu {
                ensure!(
                    type_info(d.ty()).is_some_and(|i| i.cpu_from_float),
                    "SET_ROWS: no conversion to type {}",
                    d.ty()
                );
                ensure!(
                    !d.quantized() || d.ne(0) % d.blck() == 0,
                    "SET_ROWS: partial blocks"
                );
            }
            checks.push(IndexCheck {
                tensor: n.idx(1),
                type_: c.ty(),
                bound: d.ne(1) as u64,
                what: "SET_ROWS row",
            });
        }
        ops::DIAG => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(a.ne(1) == 1, "DIAG: src[0] must be a row");
            ne_eq(d, [a.ne(0), a.ne(0), a.ne(2), a.ne(3)])?;
            ensure!(d.ty() == a.ty(), "DIAG keeps the type");
            ty_is(a, ty::F32, "src[0]")?;
            nb0_is_ts(a, "src[0]")?;
            fresh(d)?;
        }
        ops::DIAG_MASK_INF | ops::DIAG_MASK_ZERO => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(
                same_shape(a, d) && d.ty() == a.ty(),
                "result shape differs from src[0]"
            );
            ensure!(d.op_i32(0) >= 0, "negative n_past");
            ty_is(a, ty::F32, "src[0]")?;
            ensure!(
                a.contiguous() && d.contiguous(),
                "DIAG_MASK needs contiguous tensors"
            );
        }
        ops::SOFT_MAX => {
            let a = n.s(0)?;
            n.none_from(3)?;
            ensure!(a.contiguous(), "SOFT_MAX: src[0] must be contiguous");
            ensure!(same_shape(a, d), "result shape differs from src[0]");
            fresh_or_inplace(d, a)?;
            ty_is(a, ty::F32, "src[0]")?;
            ty_is(d, ty::F32, "result")?;
            if let Some(m) = n.src[1] {
                ty_in(m, &[ty::F16, ty::F32], "mask")?;
                ensure!(m.contiguous(), "SOFT_MAX: mask must be contiguous");
                ensure!(
                    m.ne(0) == a.ne(0) && m.ne(1) >= a.ne(1),
                    "SOFT_MAX: mask {:?} for {:?}",
                    m.ne,
                    a.ne
                );
                ensure!(
                    divides(m.ne(2), a.ne(2)) && divides(m.ne(3), a.ne(3)),
                    "SOFT_MAX: mask cannot be broadcast"
                );
            } else {
                ensure!(
                    d.op_f32(1) <= 0.0 || d.op_f32(1).is_nan(),
                    "SOFT_MAX: max_bias without a mask"
                );
            }
            if let Some(s) = n.src[2] {
                ty_is(s, ty::F32, "sinks")?;
                ensure!(s.ne(0) >= a.ne(2) && s.flat_fits(), "SOFT_MAX: sinks");
            }
        }
        ops::SOFT_MAX_BACK => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(same_shape(a, d) && same_shape(b, d), "SOFT_MAX_BACK shapes");
            ensure!(
                a.contiguous() && b.contiguous() && d.contiguous(),
                "SOFT_MAX_BACK needs contiguous tensors"
            );
            for (t, w) in [(d, "result"), (a, "src[0]"), (b, "src[1]")] {
                ty_is(t, ty::F32, w)?;
            }
            ensure!(d.op_f32(1) == 0.0, "SOFT_MAX_BACK: max_bias must be 0");
        }
        ops::ROPE | ops::ROPE_BACK => {
            let a = n.s(0)?;
            let pos = n.s(1)?;
            n.none_from(3)?;
            ensure!(
                same_shape(a, d) && d.ty() == a.ty(),
                "result shape differs from src[0]"
            );
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
                ensure!(f.ne(0) >= n_dims / 2, "ROPE: too few freq factors");
            }
        }
        ops::CLAMP => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(
                same_shape(a, d) && d.ty() == a.ty(),
                "result shape differs from src[0]"
            );
            fresh_or_inplace(d, a)?;
            ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
            nb0_is_ts(a, "src[0]")?;
            nb0_is_ts(d, "result")?;
        }
        ops::LEAKY_RELU => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(
                same_shape(a, d) && d.ty() == a.ty(),
                "result shape differs from src[0]"
            );
            fresh_or_inplace(d, a)?;
            ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
            nb0_is_ts(a, "src[0]")?;
            nb0_is_ts(d, "result")?;
            ensure!(
                a.flat_rows_fit() && d.flat_rows_fit(),
                "LEAKY_RELU row layout"
            );
        }
        ops::UNARY => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(
                (0..22).contains(&d.op_i32(0)),
                "unknown unary op {}",
                d.op_i32(0)
            );
            ensure!(a.contiguous_rows(), "UNARY: src[0] rows must be contiguous");
            ensure!(same_shape(a, d), "result shape differs from src[0]");
            ensure!(d.ty() == a.ty() || d.contiguous(), "UNARY result");
            unary_kernel(a, d, cpu)?;
        }
        ops::GLU => {
            let a = n.s(0)?;
            n.none_from(2)?;
            ensure!(
                (0..7).contains(&d.op_i32(0)),
                "unknown GLU op {}",
                d.op_i32(0)
            );
            ensure!(matches!(d.op_i32(1), 0 | 1), "GLU swapped flag");
            ensure!(a.contiguous_1(), "GLU: src[0] must be contiguous");
            if let Some(b) = n.src[1] {
                ensure!(
                    b.contiguous_1() && same_shape(a, b) && a.ty() == b.ty(),
                    "GLU: src[1]"
                );
                ne_eq(d, [a.ne(0), a.ne(1), a.ne(2), a.ne(3)])?;
            } else {
                ne_eq(d, [a.ne(0) / 2, a.ne(1), a.ne(2), a.ne(3)])?;
            }
            ensure!(d.ty() == a.ty(), "GLU keeps the type");
            ensure!(d.contiguous_1(), "GLU: result must be contiguous");
            ty_in(a, &[ty::F32, ty::F16, ty::BF16], "src[0]")?;
            match d.op_i32(0) {
                3 => ty_is(a, ty::F32, "src[0]")?, // SWIGLU_OAI: f32 kernel only
                6 => ty_in(a, &[ty::F32, ty::F16], "src[0]")?, // SWIGLU_CLAMP: f32, f16
                _ => {}
            }
        }
        ops::IM2COL => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            let p: Vec<i64> = (0..7).map(|i| d.op_i32(i) as i64).collect();
            let (s0, s1, p0, p1, d0, d1, is2d) = (p[0], p[1], p[2], p[3], p[4], p[5], p[6]);
            ensure!(matches!(is2d, 0 | 1), "IM2COL is_2D flag");
            let is2d = is2d == 1;
            ensure!(
                s0 > 0 && d0 > 0 && p0 >= 0 && (!is2d || (s1 > 0 && d1 > 0 && p1 >= 0)),
                "IM2COL parameters"
            );
            if is2d {
                ensure!(a.ne(2) == b.ne(2), "IM2COL channels");
            } else {
                ensure!(b.ne(1) == a.ne(1) && b.ne(3) == 1, "IM2COL 1d shapes");
            }
            let oh = if is2d {
                conv_out(b.ne(1), a.ne(1), s1, p1, d1)
            } else {
                0
            };
            let ow = conv_out(b.ne(0), a.ne(0), s0, p0, d0);
            ensure!(
                (!is2d || oh > 0) && ow > 0,
                "IM2COL: input smaller than the kernel"
            );
            let want = [
                if is2d {
                    a.ne(2) * a.ne(1) * a.ne(0)
                } else {
                    a.ne(1) * a.ne(0)
                },
                ow,
                if is2d { oh } else { b.ne(2) },
                if is2d { b.ne(3) } else { 1 },
            ];
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
        }
        ops::CONV_TRANSPOSE_1D => {
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
        }
        ops::POOL_1D => {
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
        }
        ops::POOL_2D => {
            let a = n.s(0)?;
            n.none_from(1)?;
            let p: Vec<i64> = (0..7).map(|i| d.op_i32(i) as i64).collect();
            let (pop, k0, k1, s0, s1, p0, p1) = (p[0], p[1], p[2], p[3], p[4], p[5], p[6]);
            ensure!(
                matches!(pop, 0 | 1) && k0 > 0 && k1 > 0 && s0 > 0 && s1 > 0 && p0 >= 0 && p1 >= 0,
                "POOL_2D parameters"
            );
            let w = (a.ne(0) + 2 * p0 - k0) / s0 + 1;
            let h = (a.ne(1) + 2 * p1 - k1) / s1 + 1;
            ensure!(w > 0 && h > 0, "POOL_2D: empty result");
            ne_eq(d, [w, h, a.ne(2), a.ne(3)])?;
            ty_is(d, ty::F32, "result")?;
            ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
            ensure!(
                a.contiguous() && d.contiguous(),
                "POOL_2D needs contiguous tensors"
            );
        }
        ops::POOL_2D_BACK => {
            let a = n.s(0)?;
            let af = n.s(1)?;
            n.none_from(2)?;
            ne_eq(d, [af.ne(0), af.ne(1), af.ne(2), af.ne(3)])?;
            let p: Vec<i64> = (0..7).map(|i| d.op_i32(i) as i64).collect();
            let (pop, k0, k1, s0, s1, p0, p1) = (p[0], p[1], p[2], p[3], p[4], p[5], p[6]);
            ensure!(
                matches!(pop, 0 | 1) && k0 > 0 && k1 > 0 && s0 > 0 && s1 > 0 && p0 >= 0 && p1 >= 0,
                "POOL_2D_BACK parameters"
            );
            let w = (af.ne(0) + 2 * p0 - k0) / s0 + 1;
            let h = (af.ne(1) + 2 * p1 - k1) / s1 + 1;
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
        }
        ops::UPSCALE => {
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
        }
        ops::PAD => {
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
        }
        ops::PAD_REFLECT_1D => {
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
        }
        ops::ROLL => {
            let a = n.s(0)?;
            n.none_from(1)?;
            nb0_is_ts(a, "src[0]")?;
            for i in 0..4 {
                ensure!((d.op_i32(i) as i64).abs() < a.ne(i), "ROLL shift {i}");
            }
            ensure!(
                same_shape(a, d) && d.ty() == a.ty(),
                "result shape differs from src[0]"
            );
            ty_is(a, ty::F32, "src[0]")?;
            fresh(d)?;
        }
        ops::ARANGE => {
            n.none_from(0)?;
            let (start, stop, step) = (d.op_f32(0), d.op_f32(1), d.op_f32(2));
            ensure!(
                stop > start
                    && step > 0.0
                    && step.is_finite()
                    && start.is_finite()
                    && stop.is_finite(),
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
        }
        ops::TIMESTEP_EMBEDDING => {
            let a = n.s(0)?;
            n.none_from(1)?;
            let dim = d.op_i32(0) as i64;
            ensure!(dim >= 0 && d.op_i32(1) > 0, "TIMESTEP_EMBEDDING parameters");
            ne_eq(d, [dim, a.ne(0), 1, 1])?;
            ty_is(a, ty::F32, "src[0]")?;
            ty_is(d, ty::F32, "result")?;
            nb0_is_ts(a, "src[0]")?;
            fresh(d)?;
        }
        ops::ARGSORT => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(matches!(d.op_i32(0), 0 | 1), "ARGSORT order");
            ensure!(same_shape(a, d) && d.ty() == ty::I32, "ARGSORT result");
            ty_is(a, ty::F32, "src[0]")?;
            ensure!(a.ne(0) <= i32::MAX as i64, "ARGSORT row too long");
            nb0_is_ts(d, "result")?;
            ensure!(a.flat_rows_fit() && d.flat_rows_fit(), "ARGSORT row layout");
        }
        ops::TOP_K => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(
                d.ne(0) <= a.ne(0) && (1..4).all(|i| d.ne(i) == a.ne(i)),
                "TOP_K shapes"
            );
            ty_is(d, ty::I32, "result")?;
            ty_is(a, ty::F32, "src[0]")?;
            nb0_is_ts(d, "result")?;
            ensure!(a.flat_rows_fit() && d.flat_rows_fit(), "TOP_K row layout");
        }
        ops::TRI => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(
                a.ty() == ty::F32 && a.contiguous() && a.ne(0) == a.ne(1),
                "TRI source"
            );
            ensure!((0..4).contains(&d.op_i32(0)), "TRI type");
            ensure!(same_shape(a, d) && d.ty() == ty::F32, "TRI result");
            fresh(d)?;
        }
        ops::FILL => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ty_in(a, &[ty::F32, ty::F16], "src[0]")?;
            ensure!(a.contiguous(), "FILL: src[0] must be contiguous");
            ensure!(same_shape(a, d) && d.ty() == a.ty(), "FILL result");
            fresh_or_inplace(d, a)?;
            nb0_is_ts(d, "result")?;
        }
        ops::FLASH_ATTN_EXT => {
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
            ensure!(
                d.nb(0) <= d.nb(1) && d.nb(1) <= d.nb(2) && d.nb(2) <= d.nb(3),
                "result strides must increase"
            );
            for (t, w) in [(q, "q"), (k, "k"), (v, "v")] {
                nb0_is_ts(t, w)?;
            }
            if cpu {
                ty_in(q, &[ty::F32, ty::F16], "q")?;
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
            if let Some(m) = n.src[3] {
                ty_is(m, ty::F16, "mask")?;
                ensure!(m.contiguous(), "FLASH_ATTN_EXT: mask must be contiguous");
                ensure!(
                    divides(m.ne(2), q.ne(2)) && divides(m.ne(3), q.ne(3)),
                    "FLASH_ATTN_EXT: mask cannot be broadcast"
                );
                ensure!(
                    m.ne(0) >= k.ne(1) && m.ne(1) >= q.ne(1),
                    "FLASH_ATTN_EXT: mask {:?} too small for {} kv x {} q",
                    m.ne,
                    k.ne(1),
                    q.ne(1)
                );
            } else {
                ensure!(
                    d.op_f32(1) <= 0.0 || d.op_f32(1).is_nan(),
                    "FLASH_ATTN_EXT: max_bias without a mask"
                );
            }
            if let Some(s) = n.src[4] {
                ty_is(s, ty::F32, "sinks")?;
                ensure!(s.ne(0) >= q.ne(2) && s.flat_fits(), "FLASH_ATTN_EXT: sinks");
            }
        }
        ops::SSM_CONV => {
            let sx = n.s(0)?;
            let c = n.s(1)?;
            n.none_from(2)?;
            ensure!(sx.is_3d() && c.is_matrix(), "SSM_CONV source shapes");
            let n_t = sx.ne(0) - c.ne(0) + 1;
            ensure!(n_t >= 0 && sx.ne(1) == c.ne(1), "SSM_CONV shapes");
            ne_eq(d, [c.ne(1), n_t, sx.ne(2), 1])?;
            for (t, w) in [(d, "result"), (sx, "src[0]"), (c, "src[1]")] {
                ty_is(t, ty::F32, w)?;
                nb0_is_ts(t, w)?;
            }
            ensure!(
                sx.nb(1) == sx.ne(0) as u64 * 4,
                "SSM_CONV: src[0] rows must be packed"
            );
            ensure!(
                c.nb(1) == c.ne(0) as u64 * 4,
                "SSM_CONV: src[1] rows must be packed"
            );
        }
        ops::SSM_SCAN => {
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
            let (d_state, head_dim, n_head, n_tok, n_seqs) =
                (s.ne(0), x.ne(0), x.ne(1), x.ne(2), x.ne(3));
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
            let want =
                x.nelements() + kk as i128 * (s.ne(0) * s.ne(1) * s.ne(2) * ids.ne(0)) as i128;
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
        }
        ops::WIN_PART => {
            let a = n.s(0)?;
            n.none_from(1)?;
            ensure!(a.ne(3) == 1 && a.ty() == ty::F32, "WIN_PART source");
            let w = d.op_i32(2) as i64;
            ensure!(w > 0, "WIN_PART window");
            let px = (w - a.ne(1) % w) % w;
            let py = (w - a.ne(2) % w) % w;
            let npx = (px + a.ne(1)) / w;
            let npy = (py + a.ne(2)) / w;
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
        }
        ops::WIN_UNPART => {
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
            let px = (w - d.ne(1) % w) % w;
            let py = (w - d.ne(2) % w) % w;
            let npx = (px + d.ne(1)) / w;
            let npy = (py + d.ne(2)) / w;
            ensure!(a.ne(3) == npx * npy, "WIN_UNPART window count");
            ensure!(
                a.contiguous() && d.contiguous(),
                "WIN_UNPART needs contiguous tensors"
            );
        }
        ops::GET_REL_POS => {
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
        }
        ops::ADD_REL_POS => {
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
                pw.ne(3) == a.ne(2)
                    && pw.ne(0) * pw.ne(0) == a.ne(0)
                    && pw.ne(1) * pw.ne(2) == a.ne(1),
                "ADD_REL_POS shapes"
            );
            ensure!(same_shape(a, d) && d.contiguous(), "ADD_REL_POS result");
            ensure!(matches!(d.op_i32(0), 0 | 1), "ADD_REL_POS inplace flag");
        }
        ops::RWKV_WKV6 | ops::GATED_LINEAR_ATTN | ops::RWKV_WKV7 => {
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
        }
        ops::SOLVE_TRI => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(
                a.ty() == ty::F32 && b.ty() == ty::F32 && a.contiguous() && b.contiguous(),
                "SOLVE_TRI sources"
            );
            ensure!(
                a.ne(0) == a.ne(1)
                    && a.ne(1) == b.ne(1)
                    && a.ne(2) == b.ne(2)
                    && a.ne(3) == b.ne(3),
                "SOLVE_TRI shapes"
            );
            ensure!(same_shape(b, d) && d.ty() == ty::F32, "SOLVE_TRI result");
            fresh(d)?;
        }
        ops::GATED_DELTA_NET => {
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
                (g.ne(0) == 1 || g.ne(0) == sv)
                    && g.ne(1) == h
                    && g.ne(2) == n_tok
                    && g.ne(3) == n_seqs,
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
        }
        ops::LIGHTNING_INDEXER => {
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
        }
        ops::DSV4_HC_COMB => {
            let mixes = n.s(0)?;
            let scale = n.s(1)?;
            let base = n.s(2)?;
            n.none_from(3)?;
            ensure!(
                mixes.ty() == ty::F32
                    && scale.ty() == ty::F32
                    && base.ty() == ty::F32
                    && d.ty() == ty::F32,
                "DSV4_HC_COMB types"
            );
            ensure!(d.op_i32(1) > 0, "DSV4_HC_COMB iterations");
            let hc = 4;
            ensure!(
                mixes.ne(0) == (2 + hc) * hc && mixes.ne(2) == 1 && mixes.ne(3) == 1,
                "DSV4_HC_COMB mixes"
            );
            ensure!(
                scale.ne(0) >= 3
                    && scale.is_vector()
                    && base.ne(0) == mixes.ne(0)
                    && base.is_vector(),
                "DSV4_HC_COMB scale/base"
            );
            ne_eq(d, [hc, hc, mixes.ne(1), 1])?;
            ensure!(
                mixes.contiguous() && scale.contiguous() && base.contiguous() && d.contiguous(),
                "DSV4_HC_COMB contiguity"
            );
        }
        ops::DSV4_HC_PRE => {
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
        }
        ops::DSV4_HC_POST => {
            let x = n.s(0)?;
            let res = n.s(1)?;
            let post = n.s(2)?;
            n.none_from(4)?;
            ensure!(
                x.ty() == ty::F32
                    && res.ty() == ty::F32
                    && post.ty() == ty::F32
                    && d.ty() == ty::F32,
                "DSV4_HC_POST types"
            );
            let (n_embd, n_tok, hc) = (x.ne(0), x.ne(1), res.ne(1));
            ensure!(
                hc > 0
                    && x.is_matrix()
                    && res.ne(0) == n_embd
                    && res.ne(2) == n_tok
                    && res.ne(3) == 1,
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
        }
        ops::CROSS_ENTROPY_LOSS => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(
                same_shape(a, b) && a.ty() == ty::F32 && b.ty() == ty::F32,
                "CROSS_ENTROPY_LOSS sources"
            );
            ne_eq(d, [1, 1, 1, 1])?;
            ty_is(d, ty::F32, "result")?;
            nb0_is_ts(a, "src[0]")?;
            nb0_is_ts(b, "src[1]")?;
            ensure!(
                a.flat_rows_fit() && b.flat_rows_fit(),
                "CROSS_ENTROPY_LOSS row layout"
            );
        }
        ops::CROSS_ENTROPY_LOSS_BACK => {
            let g = n.s(0)?;
            let a = n.s(1)?;
            let b = n.s(2)?;
            n.none_from(3)?;
            ensure!(
                g.is_scalar() && same_shape(a, b) && same_shape(a, d),
                "CROSS_ENTROPY_LOSS_BACK shapes"
            );
            ensure!(
                d.contiguous() && a.contiguous() && b.contiguous() && g.contiguous(),
                "CROSS_ENTROPY_LOSS_BACK contiguity"
            );
            for (t, w) in [(d, "result"), (g, "grad"), (a, "src[1]"), (b, "src[2]")] {
                ty_is(t, ty::F32, w)?;
            }
        }
        ops::OPT_STEP_ADAMW | ops::OPT_STEP_SGD => {
            let a = n.s(0)?;
            let grad = n.s(1)?;
            let (np, params) = if op == ops::OPT_STEP_ADAMW {
                (7, n.s(4)?)
            } else {
                (2, n.s(2)?)
            };
            ensure!(
                a.spec().flags & FLAG_PARAM != 0,
                "optimizer step on a tensor that is not a parameter"
            );
            ensure!(same_shape(a, grad), "gradient shape");
            if op == ops::OPT_STEP_ADAMW {
                ensure!(
                    same_shape(a, n.s(2)?) && same_shape(a, n.s(3)?),
                    "moment shapes"
                );
                n.none_from(5)?;
            } else {
                n.none_from(3)?;
            }
            ensure!(
                params.ty() == ty::F32 && params.nelements() == np && params.flat_fits(),
                "optimizer parameters"
            );
            ensure!(
                same_shape(a, d) && same_stride(a, d) && d.ty() == a.ty(),
                "optimizer step result must be a view of src[0]"
            );
            for i in 0..if op == ops::OPT_STEP_ADAMW { 4 } else { 2 } {
                let t = n.s(i)?;
                ty_is(t, ty::F32, "optimizer tensor")?;
                nb0_is_ts(t, "optimizer tensor")?;
                ensure!(
                    t.flat_rows_fit() || t.contiguous_1(),
                    "optimizer tensor layout"
                );
            }
        }
        ops::IM2COL_BACK => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            let p: Vec<i64> = (0..7).map(|i| d.op_i32(i) as i64).collect();
            let (s0, s1, p0, p1, d0, d1, is2d) = (p[0], p[1], p[2], p[3], p[4], p[5], p[6]);
            ensure!(
                matches!(is2d, 0 | 1) && s0 > 0 && d0 > 0 && p0 >= 0,
                "IM2COL_BACK parameters"
            );
            let is2d = is2d == 1;
            ensure!(
                !is2d || (s1 > 0 && d1 > 0 && p1 >= 0),
                "IM2COL_BACK parameters"
            );
            ty_is(a, ty::F32, "src[0]")?;
            ty_in(b, &[ty::F32, ty::F16], "src[1]")?;
            ty_is(d, ty::F32, "result")?;
            // The result has the shape of the original im2col input; the gradient src[0] the shape
            // im2col produced from it with kernel src[1].
            let oh = if is2d {
                conv_out(d.ne(1), b.ne(1), s1, p1, d1)
            } else {
                1
            };
            let ow = conv_out(d.ne(0), b.ne(0), s0, p0, d0);
            ensure!(
                oh > 0 && ow > 0,
                "IM2COL_BACK: input smaller than the kernel"
            );
            let want = [
                if is2d {
                    b.ne(2) * b.ne(1) * b.ne(0)
                } else {
                    b.ne(1) * b.ne(0)
                },
                ow,
                if is2d { oh } else { d.ne(2) },
                if is2d { d.ne(3) } else { 1 },
            ];
            ne_eq(a, want).map_err(|e| format!("IM2COL_BACK gradient: {e}"))?;
            if is2d {
                ensure!(d.ne(2) == b.ne(2), "IM2COL_BACK channels");
            } else {
                ensure!(d.ne(1) == b.ne(1) && d.ne(3) == 1, "IM2COL_BACK channels");
            }
            ensure!(a.contiguous() && d.contiguous(), "IM2COL_BACK contiguity");
        }
        ops::IM2COL_3D => {
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
        }
        ops::COL2IM_1D => {
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
        }
        ops::CONV_2D => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(a.ne(2) == b.ne(2), "CONV_2D channels");
            let p: Vec<i64> = (0..6).map(|i| d.op_i32(i) as i64).collect();
            ensure!(
                p[0] > 0 && p[1] > 0 && p[2] >= 0 && p[3] >= 0 && p[4] > 0 && p[5] > 0,
                "CONV_2D parameters"
            );
            let w = conv_out(b.ne(0), a.ne(0), p[0], p[2], p[4]);
            let h = conv_out(b.ne(1), a.ne(1), p[1], p[3], p[5]);
            ensure!(w > 0 && h > 0, "CONV_2D: input smaller than the kernel");
            ne_eq(d, [w, h, a.ne(3), b.ne(3)])?;
            ensure!(a.contiguous(), "CONV_2D: kernel must be contiguous");
            ty_in(a, &[ty::F32, ty::F16], "kernel")?;
            ty_is(b, ty::F32, "src[1]")?;
            ensure!(d.ty() == b.ty(), "CONV_2D result type");
            // Input and result are addressed through their strides.
        }
        ops::CONV_3D => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            let p: Vec<i64> = (0..12).map(|i| d.op_i32(i) as i64).collect();
            let (c, nn, oc) = (p[9], p[10], p[11]);
            ensure!(
                (0..3).all(|i| p[i] > 0 && p[i + 3] >= 0 && p[i + 6] > 0)
                    && c > 0
                    && nn > 0
                    && oc > 0,
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
        }
        ops::CONV_2D_DW => {
            let a = n.s(0)?;
            let b = n.s(1)?;
            n.none_from(2)?;
            ensure!(a.ne(2) == 1 && a.ne(3) == b.ne(2), "CONV_2D_DW shapes");
            let p: Vec<i64> = (0..6).map(|i| d.op_i32(i) as i64).collect();
            ensure!(
                p[0] > 0 && p[1] > 0 && p[2] >= 0 && p[3] >= 0 && p[4] > 0 && p[5] > 0,
                "CONV_2D_DW parameters"
            );
            let w = conv_out(b.ne(0), a.ne(0), p[0], p[2], p[4]);
            let h = conv_out(b.ne(1), a.ne(1), p[1], p[3], p[5]);
            ensure!(w > 0 && h > 0, "CONV_2D_DW: input smaller than the kernel");
            ne_eq(d, [w, h, b.ne(2), b.ne(3)])?;
            ensure!(d.ty() == b.ty() && b.ty() == ty::F32, "CONV_2D_DW types");
            ty_in(a, &[ty::F32, ty::F16], "kernel")?;
            // Both kernels address kernel, input and result as flat arrays (WHCN when the input
            // is contiguous, channels-innermost CWHN when it is contiguous in channels).
            ensure!(
                a.flat_fits() && b.flat_fits() && d.flat_fits(),
                "CONV_2D_DW: tensors must be packed"
            );
            let channels =
                |t: &TensorSpec| t.nb(0) > t.nb(2) && t.nb(1) > t.nb(0) && t.nb(2) == t.ts();
            if b.contiguous() {
                ensure!(a.contiguous() && d.contiguous(), "CONV_2D_DW (WHCN) layout");
            } else {
                ensure!(channels(b), "CONV_2D_DW: input layout not supported");
                ensure!(
                    a.nb(0) >= a.nb(2) && a.nb(1) >= a.nb(0),
                    "CONV_2D_DW (CWHN) kernel layout"
                );
            }
        }
        ops::CONV_TRANSPOSE_2D => {
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
        }
        ops::FLASH_ATTN_BACK => return Err("FLASH_ATTN_BACK is not supported by ggml".into()),
        ops::MAP_CUSTOM1 | ops::MAP_CUSTOM2 | ops::MAP_CUSTOM3 | ops::CUSTOM => {
            return Err("custom ops carry code pointers and are refused".into())
        }
        _ => {
            return Err(format!(
                "op {} is not supported by this server",
                ops::name(op).unwrap_or_default()
            ))
        }
    }
    Ok(checks)
}

/// `ggml_calc_conv_output_size`, in i128 to avoid overflow.
fn conv_out(ins: i64, ks: i64, s: i64, p: i64, d: i64) -> i64 {
    if s <= 0 {
        return 0;
    }
    let v = (ins as i128 + 2 * p as i128 - d as i128 * (ks as i128 - 1) - 1) / s as i128 + 1;
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// The IM2COL kernel reads input planes as `[IH, IW]` rows of contiguous floats.
fn two_d_planes_fit(b: &TensorSpec, is2d: bool) -> bool {
    if is2d {
        b.nb(1) as u128 == b.ne(0) as u128 * b.nb(0) as u128
    } else {
        true
    }
}

/// Rules of the copy kernels (`ggml_compute_forward_dup*`).
fn copy_rules(a: &TensorSpec, d: &TensorSpec, cpu: bool) -> R {
    if !cpu {
        return Ok(());
    }
    if a.ty() == d.ty() {
        // dup_bytes copies whole blocks.
        ensure!(
            !a.quantized() || (a.ne(0) % a.blck() == 0 && d.ne(0) % d.blck() == 0),
            "partial blocks"
        );
        return Ok(());
    }
    match (a.ty(), d.ty()) {
        (ty::F16 | ty::BF16 | ty::F32, ty::F16 | ty::BF16 | ty::F32)
        | (ty::F32, ty::I32)
        | (ty::I32, ty::F32) => Ok(()),
        (ty::F16 | ty::BF16 | ty::F32, q) if type_info(q).is_some_and(|i| i.is_quantized) => {
            // dup_to_q: contiguous destination, one quantized row per source row.
            let qi = type_info(q).ok_or("type")?;
            ensure!(qi.cpu_from_float, "no conversion to type {q}");
            ensure!(
                d.contiguous() && a.nb(0) == a.ts(),
                "copy to a quantized type needs a contiguous destination"
            );
            ensure!(
                a.ne(0) % qi.blck_size as i64 == 0,
                "source rows are not whole blocks"
            );
            Ok(())
        }
        (q, ty::F32) if type_info(q).is_some_and(|i| i.is_quantized && i.has_to_float) => {
            // dup_from_q: addresses the destination with src[1]'s strides (equal to the result's,
            // checked by the CPY rule); DUP/CONT keep the type so never get here.
            ensure!(d.nb(0) == 4, "destination must be contiguous in dim 0");
            ensure!(
                d.ne(0) % a.blck() == 0 || d.contiguous(),
                "destination rows are not whole blocks"
            );
            Ok(())
        }
        (s, t) => Err(format!("no copy from type {s} to type {t}")),
    }
}

/// Rules of `unary-ops.cpp` (SQR, SQRT, LOG, SIN, COS, UNARY).
fn unary_kernel(a: &TensorSpec, d: &TensorSpec, cpu: bool) -> R {
    nb0_is_ts(a, "src[0]")?;
    nb0_is_ts(d, "result")?;
    ensure!(
        a.contiguous_rows() && d.contiguous_rows(),
        "rows must be contiguous"
    );
    if cpu {
        let ok = matches!(
            (a.ty(), d.ty()),
            (ty::F32, ty::F32)
                | (ty::F16, ty::F16)
                | (ty::BF16, ty::BF16)
                | (ty::BF16, ty::F32)
                | (ty::F16, ty::F32)
        );
        ensure!(ok, "unsupported types {} -> {}", a.ty(), d.ty());
    }
    Ok(())
}

/// Type combinations of `binary-ops.cpp`.
fn binary_types(a: u32, b: u32, d: u32) -> R {
    let ok = matches!(
        (a, b, d),
        (ty::F32, ty::F32, ty::F32)
            | (ty::F16, ty::F16, ty::F16)
            | (ty::BF16, ty::BF16, ty::BF16)
            | (ty::BF16, ty::F32, ty::BF16)
            | (ty::BF16, ty::F32, ty::F32)
            | (ty::F16, ty::F32, ty::F16)
            | (ty::F16, ty::F32, ty::F32)
    );
    ensure!(ok, "unsupported types {a}, {b} -> {d}");
    Ok(())
}

/// `src0` needs a CPU dot product; `src1` is f32, bf16 widened, or the dot product's type.
fn mul_mat_types(a: u32, b: u32) -> R {
    let ai = type_info(a).ok_or("type")?;
    ensure!(ai.cpu_vec_dot, "no CPU dot product for type {a}");
    let vdt = ai.vec_dot_type;
    let conv = type_info(vdt).is_some_and(|i| i.cpu_from_float);
    ensure!(
        b == ty::F32 && (vdt == ty::F32 || conv)
            || b == vdt
            || (b == ty::BF16 && vdt == ty::F32)
            || (b == ty::F16 && vdt == ty::F32),
        "src[1] type {b} cannot be multiplied with type {a}"
    );
    Ok(())
}

/// The ids of ADD_ID are read as `ids[i1*nb20 + i2*nb21]`: a 2d tensor with its own strides.
fn rows_of(t: &TensorSpec, _dims: usize) -> R {
    ensure!(t.ne(2) == 1 && t.ne(3) == 1, "ids must be 2d");
    Ok(())
}

#[cfg(test)]
mod tests {
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
}
