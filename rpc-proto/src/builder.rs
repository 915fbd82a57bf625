//! The one way to build an [`RpcTensor`]: [`TensorBuilder`], with contiguous strides computed
//! from the type and shape, and the sizes of the ggml types it knows ([`type_traits`]).

use zerocopy::byteorder::little_endian::{I32, U32, U64};

use crate::consts::{GGML_MAX_DIMS, GGML_MAX_OP_PARAMS, GGML_MAX_SRC};
use crate::ggml_type as types;
use crate::tensor::RpcTensor;

/// `(block size in elements, bytes per block)` of the types this crate knows (F32, F16, BF16,
/// the integer types, F64, Q4_0, Q4_1, Q8_0, Q4_K, Q8_K); `None` otherwise.
pub fn type_traits(ty: u32) -> Option<(u64, u64)> {
    Some(match ty {
        types::F32 => (1, 4),
        types::F16 | types::BF16 | types::I16 => (1, 2),
        types::Q4_0 => (32, 18),
        types::Q4_1 => (32, 20),
        types::Q8_0 => (32, 34),
        types::Q4_K => (256, 144),
        types::Q8_K => (256, 292),
        types::I8 => (1, 1),
        types::I32 => (1, 4),
        types::I64 | types::F64 => (1, 8),
        _ => return None,
    })
}

/// Contiguous (row-major, ggml order) strides of a tensor of type `ty` and shape `ne`:
/// `nb[0] = type size`, `nb[1] = nb[0]·ne[0]/block`, `nb[i] = nb[i-1]·ne[i-1]`.
/// `None` for types unknown to [`type_traits`].
pub fn contiguous_nb(ty: u32, ne: [u32; GGML_MAX_DIMS]) -> Option<[u64; GGML_MAX_DIMS]> {
    let (blck, size) = type_traits(ty)?;
    let [ne0, ne1, ne2, _] = ne.map(u64::from);
    let nb1 = size.saturating_mul(ne0) / blck;
    let nb2 = nb1.saturating_mul(ne1);
    Some([size, nb1, nb2, nb2.saturating_mul(ne2)])
}

/// Byte size of a contiguous tensor of type `ty` and shape `ne` (`ggml_nbytes`);
/// `None` for types unknown to [`type_traits`].
pub fn nbytes(ty: u32, ne: [u32; GGML_MAX_DIMS]) -> Option<u64> {
    let [.., nb3] = contiguous_nb(ty, ne)?;
    if ne.contains(&0) {
        return Some(0);
    }
    let [.., ne3] = ne;
    Some(nb3.saturating_mul(u64::from(ne3)))
}

/// Builds an [`RpcTensor`] step by step, computing contiguous strides from the type and shape.
///
/// ```
/// use rpc_proto::{ggml_op, ggml_type, TensorBuilder, TENSOR_FLAG_COMPUTE};
/// let (buffer, base) = (0x1234, 0x10_0000);
/// let a = TensorBuilder::new(1, ggml_type::F32).ne(&[4]).data(buffer, base).build();
/// let b = TensorBuilder::new(2, ggml_type::F32).ne(&[4]).data(buffer, base + 16).build();
/// let c = TensorBuilder::new(3, ggml_type::F32)
///     .ne(&[4])
///     .data(buffer, base + 32)
///     .op(ggml_op::ADD, &[])
///     .srcs(&[1, 2])
///     .flags(TENSOR_FLAG_COMPUTE)
///     .build();
/// assert_eq!(c.nb(), [4, 16, 16, 16]);
/// # let _ = (a, b);
/// ```
#[derive(Debug, Clone, Copy)]
pub struct TensorBuilder {
    t: RpcTensor,
    ne: [u32; GGML_MAX_DIMS],
    nb: Option<[u32; GGML_MAX_DIMS]>,
}

impl TensorBuilder {
    /// A tensor with id `id` and `ggml_type` `ty`, shape `[1, 1, 1, 1]`, no buffer, op NONE.
    pub fn new(id: u64, ty: u32) -> Self {
        TensorBuilder {
            t: RpcTensor::new(id, ty),
            ne: [1; GGML_MAX_DIMS],
            nb: None,
        }
    }

    /// Shorthand for an F32 tensor.
    pub fn f32(id: u64) -> Self {
        Self::new(id, types::F32)
    }

    /// Shorthand for an F16 tensor.
    pub fn f16(id: u64) -> Self {
        Self::new(id, types::F16)
    }

    /// Shorthand for an I32 tensor.
    pub fn i32(id: u64) -> Self {
        Self::new(id, types::I32)
    }

    /// Element counts: up to 4 dimensions, missing ones are 1 (extra ones are ignored).
    #[must_use]
    pub fn ne(mut self, ne: &[u32]) -> Self {
        self.ne = [1; GGML_MAX_DIMS];
        for (d, &n) in self.ne.iter_mut().zip(ne) {
            *d = n;
        }
        self
    }

    /// Explicit byte strides instead of the contiguous ones (any values, e.g. deliberately
    /// inconsistent ones).
    #[must_use]
    pub fn nb(mut self, nb: [u32; GGML_MAX_DIMS]) -> Self {
        self.nb = Some(nb);
        self
    }

    /// Buffer handle and absolute data address (`base + offset`).
    #[must_use]
    pub fn data(mut self, buffer: u64, addr: u64) -> Self {
        self.t.buffer.set(buffer);
        self.t.data.set(addr);
        self
    }

    /// `op` and its leading `op_params` (extra params beyond 16 are ignored; the rest are 0).
    #[must_use]
    pub fn op(mut self, op: u32, params: &[i32]) -> Self {
        self.t.op.set(op);
        self.t.op_params = [I32::ZERO; GGML_MAX_OP_PARAMS / 4];
        for (dst, &src) in self.t.op_params.iter_mut().zip(params) {
            dst.set(src);
        }
        self
    }

    /// Source tensor ids (`src[0..]`; extra ids beyond 10 are ignored, the rest are 0).
    #[must_use]
    pub fn srcs(mut self, srcs: &[u64]) -> Self {
        self.t.src = [U64::ZERO; GGML_MAX_SRC];
        for (dst, &src) in self.t.src.iter_mut().zip(srcs) {
            dst.set(src);
        }
        self
    }

    /// `TENSOR_FLAG_*` bits.
    #[must_use]
    pub fn flags(mut self, flags: i32) -> Self {
        self.t.flags.set(flags);
        self
    }

    /// `view_src` id and `view_offs`.
    #[must_use]
    pub fn view(mut self, view_src: u64, view_offs: u64) -> Self {
        self.t.view_src.set(view_src);
        self.t.view_offs.set(view_offs);
        self
    }

    /// Tensor name (truncated to 63 bytes, see [`RpcTensor::set_name`]).
    #[must_use]
    pub fn name(mut self, name: &str) -> Self {
        self.t.set_name(name);
        self
    }

    /// `use_count` (graph tensors only).
    #[must_use]
    pub fn use_count(mut self, n: i32) -> Self {
        self.t.use_count.set(n);
        self
    }

    /// The contiguous strides, or the explicit ones. For types unknown to [`type_traits`]
    /// (e.g. deliberately invalid ones) a 1-byte element is assumed. Strides are truncated
    /// to 32 bits, as the stock client does.
    pub fn strides(&self) -> [u32; GGML_MAX_DIMS] {
        self.nb.unwrap_or_else(|| {
            let ty = self.t.r#type.get();
            let nb = contiguous_nb(ty, self.ne)
                .or_else(|| contiguous_nb(types::I8, self.ne))
                .unwrap_or([1; GGML_MAX_DIMS]);
            nb.map(|x| x as u32)
        })
    }

    /// `ggml_nbytes` of the tensor being built (with its actual strides); 0 if any `ne` is 0.
    pub fn nbytes(&self) -> u64 {
        if self.ne.contains(&0) {
            return 0;
        }
        let nb = self.strides().map(u64::from);
        let (blck, size) = type_traits(self.t.r#type.get()).unwrap_or((1, 1));
        let [ne0, ..] = self.ne;
        let [nb0, ..] = nb;
        let mut total = if blck == 1 {
            size
        } else {
            u64::from(ne0).saturating_mul(nb0) / blck
        };
        let first = if blck == 1 { 0 } else { 1 };
        for (&ne, &nb) in self.ne.iter().zip(&nb).skip(first) {
            total = total.saturating_add(u64::from(ne.saturating_sub(1)).saturating_mul(nb));
        }
        total
    }

    /// The finished wire tensor.
    pub fn build(&self) -> RpcTensor {
        let mut t = self.t;
        t.ne = self.ne.map(U32::new);
        t.nb = self.strides().map(U32::new);
        t
    }
}

impl From<TensorBuilder> for RpcTensor {
    fn from(b: TensorBuilder) -> RpcTensor {
        b.build()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ggml_op as ops;

    #[test]
    fn contiguous_strides() {
        let t = TensorBuilder::f32(1).ne(&[3, 2]).build();
        assert_eq!(t.ne(), [3, 2, 1, 1]);
        assert_eq!(t.nb(), [4, 12, 24, 24]);
        let q = TensorBuilder::new(2, types::Q4_0).ne(&[64, 2]);
        assert_eq!(q.build().nb(), [18, 36, 72, 72]);
        assert_eq!(q.nbytes(), 72);
        let k = TensorBuilder::new(3, types::Q4_K).ne(&[256, 16]);
        assert_eq!(k.build().nb(), [144, 144, 2304, 2304]);
        assert_eq!(TensorBuilder::f16(3).ne(&[5, 1, 2]).nbytes(), 20);
        assert_eq!(nbytes(types::I32, [7, 1, 1, 1]), Some(28));
        assert_eq!(nbytes(types::Q8_K, [512, 1, 1, 1]), Some(584));
        assert_eq!(TensorBuilder::f32(4).ne(&[0]).nbytes(), 0);
        assert_eq!(contiguous_nb(types::REMOVED_Q4_2, [1; 4]), None);
    }

    #[test]
    fn builder_sets_every_field() {
        let t = TensorBuilder::i32(9)
            .ne(&[2])
            .data(7, 0x1000)
            .op(ops::ADD, &[5])
            .srcs(&[1, 2])
            .flags(16)
            .view(3, 8)
            .name("x")
            .use_count(2)
            .build();
        assert_eq!(t.id.get(), 9);
        assert_eq!(t.r#type.get(), types::I32);
        assert_eq!(t.buffer.get(), 7);
        assert_eq!(t.data.get(), 0x1000);
        assert_eq!(t.op.get(), ops::ADD);
        assert_eq!(t.op_params()[0], 5);
        assert_eq!(&t.src_ids()[..3], &[1, 2, 0]);
        assert_eq!(t.flags.get(), 16);
        assert_eq!(t.view_src.get(), 3);
        assert_eq!(t.view_offs.get(), 8);
        assert_eq!(t.name_str(), "x");
        assert_eq!(t.use_count.get(), 2);
    }

    #[test]
    fn explicit_strides_are_kept_whatever_they_are() {
        let t = TensorBuilder::f32(1)
            .ne(&[u32::MAX; 4])
            .nb([u32::MAX; 4])
            .build();
        assert_eq!((t.ne(), t.nb()), ([u32::MAX; 4], [u32::MAX; 4]));
        // A type it does not know: 1-byte elements, strides saturated then truncated, no panic.
        let b = TensorBuilder::new(2, 1000).ne(&[u32::MAX; 4]);
        assert_eq!(b.build().nb()[0], 1);
        let _ = b.nbytes();
    }
}
