//! `rpc_tensor`: the 296-byte packed tensor description (spec §6).

use core::fmt;

use zerocopy::byteorder::little_endian::{I32, U32, U64};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::consts::{
    GGML_MAX_DIMS, GGML_MAX_NAME, GGML_MAX_OP_PARAMS, GGML_MAX_SRC, RPC_TENSOR_SIZE,
};

/// `GGML_TENSOR_FLAG_INPUT`: the tensor is a graph input.
pub const TENSOR_FLAG_INPUT: i32 = 1;
/// `GGML_TENSOR_FLAG_OUTPUT`: the tensor is a graph output.
pub const TENSOR_FLAG_OUTPUT: i32 = 2;
/// `GGML_TENSOR_FLAG_PARAM`: the tensor holds trainable parameters.
pub const TENSOR_FLAG_PARAM: i32 = 4;
/// `GGML_TENSOR_FLAG_LOSS`: the tensor is a loss.
pub const TENSOR_FLAG_LOSS: i32 = 8;
/// `GGML_TENSOR_FLAG_COMPUTE`: the node must be computed (the CPU backend skips nodes without it).
pub const TENSOR_FLAG_COMPUTE: i32 = 16;

const N_OP_PARAMS: usize = GGML_MAX_OP_PARAMS / 4;

/// A serialized tensor exactly as on the wire: 296 bytes, packed, little-endian.
///
/// All fields are byte-aligned (`zerocopy` little-endian wrappers), so a
/// `&[RpcTensor]` can be borrowed straight from an unaligned wire slice.
/// Nothing here is validated: `type`, `op`, `buffer`, `data`, shapes and ids are
/// untrusted client data that the server must check itself.
///
/// | offset | field |
/// |---|---|
/// | 0 | `id` |
/// | 8 | `type` |
/// | 12 | `buffer` |
/// | 20 | `ne[4]` |
/// | 36 | `nb[4]` |
/// | 52 | `op` |
/// | 56 | `op_params[16]` |
/// | 120 | `flags` |
/// | 124 | `src[10]` |
/// | 204 | `view_src` |
/// | 212 | `view_offs` |
/// | 220 | `data` |
/// | 228 | `name[64]` |
/// | 292 | `use_count` |
#[derive(
    Clone, Copy, PartialEq, Eq, Hash, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
#[repr(C)]
pub struct RpcTensor {
    /// Client-side tensor id (its `ggml_tensor*`); 0 means "no tensor".
    pub id: U64,
    /// `ggml_type`; valid values are `< GGML_TYPE_COUNT` with a non-zero block size.
    pub r#type: U32,
    /// Remote buffer handle from ALLOC_BUFFER, or 0.
    pub buffer: U64,
    /// Element counts per dimension (truncated from `int64` by the client).
    pub ne: [U32; GGML_MAX_DIMS],
    /// Byte strides per dimension (truncated from `size_t` by the client).
    pub nb: [U32; GGML_MAX_DIMS],
    /// `ggml_op`; not validated by the stock server.
    pub op: U32,
    /// Raw operation parameters (16 × `i32`).
    pub op_params: [I32; N_OP_PARAMS],
    /// `TENSOR_FLAG_*` bits.
    pub flags: I32,
    /// Ids of the source tensors, 0 = none.
    pub src: [U64; GGML_MAX_SRC],
    /// Id of the view source, or 0.
    pub view_src: U64,
    /// Offset inside the view source.
    pub view_offs: U64,
    /// Absolute remote address (`base_ptr + offset` inside `buffer`), or 0.
    pub data: U64,
    /// NUL-padded name.
    pub name: [u8; GGML_MAX_NAME],
    /// Number of uses inside a graph; 0 outside GRAPH_COMPUTE.
    pub use_count: I32,
}

const _: () = {
    use core::mem::{align_of, offset_of, size_of};
    assert!(size_of::<RpcTensor>() == RPC_TENSOR_SIZE);
    assert!(align_of::<RpcTensor>() == 1);
    assert!(offset_of!(RpcTensor, r#type) == 8);
    assert!(offset_of!(RpcTensor, buffer) == 12);
    assert!(offset_of!(RpcTensor, ne) == 20);
    assert!(offset_of!(RpcTensor, nb) == 36);
    assert!(offset_of!(RpcTensor, op) == 52);
    assert!(offset_of!(RpcTensor, op_params) == 56);
    assert!(offset_of!(RpcTensor, flags) == 120);
    assert!(offset_of!(RpcTensor, src) == 124);
    assert!(offset_of!(RpcTensor, view_src) == 204);
    assert!(offset_of!(RpcTensor, view_offs) == 212);
    assert!(offset_of!(RpcTensor, data) == 220);
    assert!(offset_of!(RpcTensor, name) == 228);
    assert!(offset_of!(RpcTensor, use_count) == 292);
};

impl Default for RpcTensor {
    /// The all-zero tensor (what the client sends for a null tensor).
    fn default() -> Self {
        Self::new_zeroed()
    }
}

impl RpcTensor {
    /// A zeroed tensor with the given id and `ggml_type`.
    pub fn new(id: u64, ty: u32) -> Self {
        let mut t = Self::default();
        t.id.set(id);
        t.r#type.set(ty);
        t
    }

    /// Decode one tensor from exactly [`RPC_TENSOR_SIZE`] bytes (`None` on any other length).
    pub fn from_wire(b: &[u8]) -> Option<Self> {
        Self::read_from_bytes(b).ok()
    }

    /// The 296 wire bytes of this tensor.
    pub fn to_wire(&self) -> [u8; RPC_TENSOR_SIZE] {
        let mut out = [0u8; RPC_TENSOR_SIZE];
        out.copy_from_slice(self.as_bytes());
        out
    }

    /// Whether this is the null tensor (`id == 0`).
    pub fn is_null(&self) -> bool {
        self.id.get() == 0
    }

    /// The name up to the first NUL, decoded lossily as UTF-8.
    pub fn name_str(&self) -> String {
        let len = self
            .name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.name.len());
        String::from_utf8_lossy(self.name.get(..len).unwrap_or(&[])).into_owned()
    }

    /// Set the name like the client's `snprintf`: zero the field, copy at most 63
    /// bytes, keep a terminating NUL.
    pub fn set_name(&mut self, name: &str) {
        self.name = [0; GGML_MAX_NAME];
        for (dst, src) in self
            .name
            .iter_mut()
            .take(GGML_MAX_NAME - 1)
            .zip(name.bytes())
        {
            *dst = src;
        }
    }

    /// `ne[]` as plain integers.
    pub fn ne(&self) -> [u32; GGML_MAX_DIMS] {
        self.ne.map(U32::get)
    }

    /// `nb[]` as plain integers.
    pub fn nb(&self) -> [u32; GGML_MAX_DIMS] {
        self.nb.map(U32::get)
    }

    /// `src[]` as plain integers.
    pub fn src_ids(&self) -> [u64; GGML_MAX_SRC] {
        self.src.map(U64::get)
    }

    /// `op_params` as plain integers.
    pub fn op_params(&self) -> [i32; N_OP_PARAMS] {
        self.op_params.map(I32::get)
    }
}

impl fmt::Debug for RpcTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RpcTensor")
            .field("id", &format_args!("{:#x}", self.id.get()))
            .field("type", &self.r#type.get())
            .field("buffer", &format_args!("{:#x}", self.buffer.get()))
            .field("ne", &self.ne())
            .field("nb", &self.nb())
            .field("op", &self.op.get())
            .field("op_params", &self.op_params())
            .field("flags", &self.flags.get())
            .field("src", &self.src_ids())
            .field("view_src", &format_args!("{:#x}", self.view_src.get()))
            .field("view_offs", &self.view_offs.get())
            .field("data", &format_args!("{:#x}", self.data.get()))
            .field("name", &self.name_str())
            .field("use_count", &self.use_count.get())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_offsets_on_the_wire() {
        let t = crate::TensorBuilder::new(0x0102030405060708, 0x11)
            .data(0xAA, 0xBB)
            .ne(&[1, 2, 3, 4])
            .nb([5, 6, 7, 8])
            .op(9, &[-1])
            .flags(TENSOR_FLAG_COMPUTE)
            .srcs(&[0xCC])
            .view(0xDD, 0xEE)
            .name("abc")
            .use_count(3)
            .build();
        let b = t.to_wire();
        assert_eq!(&b[0..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(b[8], 0x11);
        assert_eq!(b[12], 0xAA);
        assert_eq!(&b[20..24], &[1, 0, 0, 0]);
        assert_eq!(b[32], 4);
        assert_eq!(b[36], 5);
        assert_eq!(b[48], 8);
        assert_eq!(b[52], 9);
        assert_eq!(&b[56..60], &[0xff; 4]);
        assert_eq!(b[120], 16);
        assert_eq!(b[124], 0xCC);
        assert_eq!(b[204], 0xDD);
        assert_eq!(b[212], 0xEE);
        assert_eq!(b[220], 0xBB);
        assert_eq!(&b[228..232], b"abc\0");
        assert_eq!(b[292], 3);
        assert_eq!(RpcTensor::from_wire(&b), Some(t));
        assert_eq!(RpcTensor::from_wire(&b[1..]), None);
    }

    #[test]
    fn names_truncate_like_snprintf() {
        let long = "x".repeat(100);
        let mut t = RpcTensor::default();
        t.set_name(&long);
        assert_eq!(t.name_str(), "x".repeat(63));
        assert_eq!(t.name[63], 0);
        t.name = [b'y'; 64];
        assert_eq!(t.name_str(), "y".repeat(64));
        t.name[0] = 0xff;
        t.name[1] = 0;
        assert_eq!(t.name_str(), "\u{fffd}");
    }

    #[test]
    fn default_is_null() {
        assert!(RpcTensor::default().is_null());
        assert_eq!(RpcTensor::default().to_wire(), [0u8; 296]);
    }
}
