//! The checks a [`Graph`](crate::Graph) passes before ggml sees it, beyond what the stock server
//! checks: every view inside what it views, every node's op rule, and the checks on the contents
//! of index tensors that run before every computation (`Graph::build` runs the first two and
//! schedules the last, `Backend::compute` runs them).
//!
//! Every tensor that reaches here already has a valid type, whole blocks per row and, when it has
//! a buffer, an extent inside that buffer ([`TensorSpec`], `tensor.rs`). That alone does not make a graph
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
//!
//! One file per op family; [`rule`] says which function checks which op. Shared shape and type
//! helpers (with ggml's exact semantics) are here; views and aliasing in `views.rs`; the rules
//! applied to a graph's tensors and nodes in `rules.rs`; where the index checks run, and the
//! checks themselves, in `schedule.rs`.

use crate::ops;
use crate::tensor::{type_info, TensorSpec};

/// ggml type ids (`enum ggml_type`, fixed by the protocol; defined once in `rpc-proto`).
pub(crate) use rpc_proto::ggml_type as ty;

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

type R = Result<(), Refusal>;

/// A [`Refusal`]: `refuse!("template", args..)` by an op's own check ([`Rule::Check`] of the
/// template), `refuse!(Rule::Type; "template", args..)` by a named rule.
macro_rules! refuse {
    ($fmt:literal $($args:tt)*) => {
        Refusal::new(Rule::Check($fmt), format!($fmt $($args)*))
    };
    ($rule:expr; $fmt:literal $($args:tt)*) => {
        Refusal::new($rule, format!($fmt $($args)*))
    };
}

/// Refuses (see [`refuse!`]) unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($refusal:tt)+) => {{
        // Negated on purpose: a float condition fails on NaN too.
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if !$cond {
            return Err(refuse!($($refusal)+));
        }
    }};
}

mod attention;
mod binary;
mod conv;
mod copy;
mod hyper;
mod matmul;
mod norm;
mod optimizer;
mod pool;
mod reduce;
mod refusal;
mod rope;
mod rows;
pub(crate) mod rules;
pub(crate) mod schedule;
mod ssm;
#[cfg(test)]
mod tests;
mod unary;
mod views;

pub use refusal::{Refusal, Rule};
pub use rules::GraphLinks;
pub use schedule::IndexError;
use views::check_no_partial_overlap;
pub(crate) use views::check_view;

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
        crate::tensor::nbytes(s.type_, &s.ne, &s.nb)
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
        self.rows_fit_at(self.nb(1))
    }
    /// Rows addressed as `i*nb1` for `i < nrows`, with `nb1` another tensor's row stride (kernels
    /// that walk a source with the result's strides), stay inside the tensor's extent.
    fn rows_fit_at(&self, nb1: u64) -> bool {
        let nr = self.nrows();
        nr == 0 || (nr - 1) as u128 * nb1 as u128 + self.row_size() as u128 <= self.nbytes()
    }
    /// Planes addressed as `k*nb[2]` for `k < ne2*ne3` (dims 2..3 flattened), each with its rows at
    /// `j*nb[1]`, stay inside the tensor's extent (a contiguous tensor with `ne[2] = 1` leaves
    /// `nb[2]` free).
    fn flat_planes_fit(&self) -> bool {
        let planes = self.ne(2) as i128 * self.ne(3) as i128;
        let rows = self.ne(1) as i128;
        planes == 0
            || rows == 0
            || (planes - 1) as u128 * self.nb(2) as u128
                + (rows - 1) as u128 * self.nb(1) as u128
                + self.row_size() as u128
                <= self.nbytes()
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
    ensure!(
        got == want,
        Rule::ResultShape; "result shape {got:?}, expected {want:?}"
    );
    Ok(())
}

/// A fresh result tensor (`ggml_new_tensor`) is contiguous; an in-place result (`ggml_view_tensor`
/// of `src0`) has `src0`'s shape and strides.
fn fresh_or_inplace(d: &TensorSpec, a: &TensorSpec) -> R {
    ensure!(
        d.contiguous() || (same_shape(d, a) && same_stride(d, a)),
        Rule::FreshResult; "result must be contiguous or an in-place view of its first source"
    );
    Ok(())
}

fn fresh(d: &TensorSpec) -> R {
    ensure!(d.contiguous(), Rule::FreshResult; "result must be contiguous");
    Ok(())
}

fn nb0_is_ts(t: &TensorSpec, what: &str) -> R {
    ensure!(
        t.nb(0) == t.ts(),
        Rule::ElementStride; "{what}: nb[0]={} must be the element size {}",
        t.nb(0),
        t.ts()
    );
    Ok(())
}

fn ty_is(t: &TensorSpec, want: u32, what: &str) -> R {
    ensure!(
        t.ty() == want,
        Rule::Type; "{what}: type {} where {} is required",
        t.ty(),
        want
    );
    Ok(())
}

fn ty_in(t: &TensorSpec, want: &[u32], what: &str) -> R {
    ensure!(
        want.contains(&t.ty()),
        Rule::Type; "{what}: type {} not in {:?}",
        t.ty(),
        want
    );
    Ok(())
}

/// The result's strides grow with the dimension (kernels that address rows from their indices).
fn strides_increase(d: &TensorSpec) -> R {
    ensure!(
        d.nb(0) <= d.nb(1) && d.nb(1) <= d.nb(2) && d.nb(2) <= d.nb(3),
        Rule::StridesIncrease; "result strides must increase (ne {:?}, nb {:?})",
        d.ne,
        d.nb
    );
    Ok(())
}

/// The result has src[0]'s shape and type.
fn like_src0(a: &TensorSpec, d: &TensorSpec) -> R {
    ensure!(
        same_shape(a, d) && d.ty() == a.ty(),
        "result shape differs from src[0]"
    );
    Ok(())
}

/// f32 tensors whose rows are packed floats (`nb[0]` = 4), each named for the error message.
fn f32_rows(ts: &[(&TensorSpec, &str)]) -> R {
    for &(t, w) in ts {
        ty_is(t, ty::F32, w)?;
        nb0_is_ts(t, w)?;
    }
    Ok(())
}

/// The optional mask and sinks SOFT_MAX and FLASH_ATTN_EXT share (`ggml_soft_max_ext`,
/// `ggml_flash_attn_ext`), for scores with `x`'s heads (dim 2) and batch (dim 3): a contiguous
/// mask of one of `mask_types`, broadcast over heads and batch, that `covers` the scores (each
/// op's own rule); no mask, no ALiBi (`max_bias`, op_params[1], scales the mask's values); sinks:
/// at least one f32 per head.
fn mask_and_sinks(
    what: &str,
    d: &TensorSpec,
    x: &TensorSpec,
    mask: Option<&TensorSpec>,
    mask_types: &[u32],
    covers: impl FnOnce(&TensorSpec) -> R,
    sinks: Option<&TensorSpec>,
) -> R {
    if let Some(m) = mask {
        ty_in(m, mask_types, "mask")?;
        ensure!(m.contiguous(), "{what}: mask must be contiguous");
        ensure!(
            divides(m.ne(2), x.ne(2)) && divides(m.ne(3), x.ne(3)),
            "{what}: mask cannot be broadcast"
        );
        covers(m)?;
    } else {
        ensure!(
            d.op_f32(1) <= 0.0 || d.op_f32(1).is_nan(),
            "{what}: max_bias without a mask"
        );
    }
    if let Some(s) = sinks {
        ty_is(s, ty::F32, "sinks")?;
        // Read as a flat array, one per head (`sinks[h]`): an empty tensor has no extent.
        ensure!(
            s.ne(0) >= x.ne(2) && !s.is_empty() && s.flat_fits(),
            "{what}: sinks"
        );
    }
    Ok(())
}

/// Checks that hold for every tensor of a graph that a kernel may read or write.
pub(crate) fn check_layout(t: &TensorSpec) -> R {
    let info = type_info(t.type_).ok_or_else(|| refuse!(Rule::Layout; "invalid type"))?;
    // Elements (or blocks) do not overlap their neighbours in dim 0; with the extent check this
    // bounds every row read or written as `ne[0]` consecutive elements.
    if t.ne.iter().all(|&n| n > 0) && t.ne[0] > 1 {
        ensure!(
            t.nb[0] >= info.type_size,
            Rule::Layout; "nb[0]={} is smaller than the element size {}",
            t.nb[0],
            info.type_size
        );
    }
    // ggml computes element counts in int64.
    ensure!(t.nelements() < (1i128 << 62), Rule::Layout; "too many elements");
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
    fn s(&self, i: usize) -> Result<&'a TensorSpec, Refusal> {
        self.src[i].ok_or_else(|| refuse!(Rule::MissingSource; "src[{i}] is missing"))
    }
    fn none_from(&self, i: usize) -> R {
        for j in i..10 {
            ensure!(self.src[j].is_none(), Rule::ExtraSource; "unexpected src[{j}]");
        }
        Ok(())
    }
    fn idx(&self, i: usize) -> u32 {
        self.src_idx[i].unwrap_or(u32::MAX)
    }
}

/// Validates one computing node. Returns the data-dependent checks it needs.
pub(crate) fn check_node(n: &Node<'_>, cpu: bool) -> Result<Vec<IndexCheck>, Refusal> {
    let d = n.d;
    let mut checks = Vec::new();
    check_no_partial_overlap(n)?;
    // Every tensor a kernel touches has plausible strides.
    check_layout(d).map_err(|e| e.about("result"))?;
    for (i, s) in n.src.iter().enumerate() {
        if let Some(s) = s {
            check_layout(s).map_err(|e| e.about(&format!("src[{i}]")))?;
        }
    }
    rule(d.op)?(n, cpu, &mut checks)?;
    Ok(checks)
}

/// A rule: the node, whether the CPU backend computes it (its kernels' own type and layout
/// rules), and where to put the data-dependent checks the node needs.
type OpRule = fn(&Node<'_>, bool, &mut Vec<IndexCheck>) -> R;

/// The rule of each op, by family. Whatever is not listed is refused.
fn rule(op: u32) -> Result<OpRule, Refusal> {
    Ok(match op {
        // copy.rs: copies, writes into views, repeats, concatenation
        ops::DUP | ops::CONT => copy::dup_cont,
        ops::CPY => copy::cpy,
        ops::ACC | ops::SET => copy::acc_set,
        ops::REPEAT => copy::repeat,
        ops::REPEAT_BACK => copy::repeat_back,
        ops::CONCAT => copy::concat,
        // rows.rs: ops driven by row ids
        ops::GET_ROWS => rows::get_rows,
        ops::GET_ROWS_BACK => rows::get_rows_back,
        ops::SET_ROWS => rows::set_rows,
        // binary.rs: element-wise binary
        ops::ADD | ops::SUB | ops::MUL | ops::DIV => binary::arithmetic,
        ops::ADD_ID => binary::add_id,
        ops::ADD1 => binary::add1,
        // unary.rs: element-wise unary and activations
        ops::SQR | ops::SQRT | ops::LOG | ops::SIN | ops::COS => unary::math,
        ops::SILU_BACK => unary::silu_back,
        ops::SCALE => unary::scale,
        ops::CLAMP => unary::clamp,
        ops::LEAKY_RELU => unary::leaky_relu,
        ops::UNARY => unary::unary,
        ops::GLU => unary::glu,
        ops::FILL => unary::fill,
        // reduce.rs: reductions and sorts along rows
        ops::SUM => reduce::sum,
        ops::SUM_ROWS | ops::MEAN => reduce::sum_rows_mean,
        ops::CUMSUM => reduce::cumsum,
        ops::ARGMAX => reduce::argmax,
        ops::COUNT_EQUAL => reduce::count_equal,
        ops::ARGSORT => reduce::argsort,
        ops::TOP_K => reduce::top_k,
        // matmul.rs: matrix products and matrix-shaped ops
        ops::MUL_MAT => matmul::mul_mat,
        ops::MUL_MAT_ID => matmul::mul_mat_id,
        ops::OUT_PROD => matmul::out_prod,
        ops::DIAG => matmul::diag,
        ops::TRI => matmul::tri,
        ops::SOLVE_TRI => matmul::solve_tri,
        // norm.rs: normalisations, soft_max and its masks
        ops::NORM | ops::RMS_NORM | ops::L2_NORM | ops::GROUP_NORM => norm::norm,
        ops::RMS_NORM_BACK => norm::rms_norm_back,
        ops::DIAG_MASK_INF | ops::DIAG_MASK_ZERO => norm::diag_mask,
        ops::SOFT_MAX => norm::soft_max,
        ops::SOFT_MAX_BACK => norm::soft_max_back,
        // attention.rs: attention
        ops::FLASH_ATTN_EXT => attention::flash_attn_ext,
        ops::GET_REL_POS => attention::get_rel_pos,
        ops::ADD_REL_POS => attention::add_rel_pos,
        ops::LIGHTNING_INDEXER => attention::lightning_indexer,
        // rope.rs: position encodings
        ops::ROPE | ops::ROPE_BACK => rope::rope,
        ops::ARANGE => rope::arange,
        ops::TIMESTEP_EMBEDDING => rope::timestep_embedding,
        // conv.rs: convolutions
        ops::IM2COL => conv::im2col,
        ops::CONV_TRANSPOSE_1D => conv::conv_transpose_1d,
        ops::IM2COL_BACK => conv::im2col_back,
        ops::IM2COL_3D => conv::im2col_3d,
        ops::COL2IM_1D => conv::col2im_1d,
        ops::CONV_2D => conv::conv_2d,
        ops::CONV_3D => conv::conv_3d,
        ops::CONV_2D_DW => conv::conv_2d_dw,
        ops::CONV_TRANSPOSE_2D => conv::conv_transpose_2d,
        // pool.rs: pooling, padding, resampling, windows
        ops::POOL_1D => pool::pool_1d,
        ops::POOL_2D => pool::pool_2d,
        ops::POOL_2D_BACK => pool::pool_2d_back,
        ops::UPSCALE => pool::upscale,
        ops::PAD => pool::pad,
        ops::PAD_REFLECT_1D => pool::pad_reflect_1d,
        ops::ROLL => pool::roll,
        ops::WIN_PART => pool::win_part,
        ops::WIN_UNPART => pool::win_unpart,
        // ssm.rs: state-space and recurrent ops
        ops::SSM_CONV => ssm::ssm_conv,
        ops::SSM_SCAN => ssm::ssm_scan,
        ops::RWKV_WKV6 | ops::GATED_LINEAR_ATTN | ops::RWKV_WKV7 => ssm::wkv,
        ops::GATED_DELTA_NET => ssm::gated_delta_net,
        // hyper.rs: DeepSeek-V4 hyper-connections
        ops::DSV4_HC_COMB => hyper::comb,
        ops::DSV4_HC_PRE => hyper::pre,
        ops::DSV4_HC_POST => hyper::post,
        // optimizer.rs: training
        ops::CROSS_ENTROPY_LOSS => optimizer::cross_entropy_loss,
        ops::CROSS_ENTROPY_LOSS_BACK => optimizer::cross_entropy_loss_back,
        ops::OPT_STEP_ADAMW | ops::OPT_STEP_SGD => optimizer::opt_step,
        ops::FLASH_ATTN_BACK => {
            return Err(refuse!(Rule::UnsupportedOp; "FLASH_ATTN_BACK is not supported by ggml"))
        }
        ops::MAP_CUSTOM1 | ops::MAP_CUSTOM2 | ops::MAP_CUSTOM3 | ops::CUSTOM => {
            return Err(refuse!(
                Rule::UnsupportedOp; "custom ops carry code pointers and are refused"
            ))
        }
        _ => {
            return Err(refuse!(
                Rule::UnsupportedOp; "op {} is not supported by this server",
                ops::name(op).unwrap_or_default()
            ))
        }
    })
}
