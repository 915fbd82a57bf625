//! Building ggml tensors from checked descriptions: [`TensorSpec`] (a [`TensorDesc`] checked by
//! [`TensorSpec::new`], placed in a buffer by [`TensorSpec::in_buffer`]), made into a ggml tensor
//! in a [`Context`], and [`ScratchTensors`], the few tensors of one command, each of whose calls
//! checks what ggml's function relies on. Above buffers and devices, below the checks and graphs
//! (`lib.rs` lists the order).

use super::buffer::{self, Access, BufferRef};
use super::context::Context;
use super::device::Device;
use super::{ops, sys};

/// Block and element sizes of a ggml type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeInfo {
    /// Elements per block (1 for plain types, 32/256 for quantized ones).
    pub blck_size: u64,
    /// Bytes per block.
    pub type_size: u64,
    pub is_quantized: bool,
    /// ggml can convert rows of this type to f32 (`type_traits.to_float`).
    pub has_to_float: bool,
    /// The CPU backend can convert f32 rows to this type (`type_traits_cpu.from_float`).
    pub cpu_from_float: bool,
    /// The CPU backend has a dot product for this type (`type_traits_cpu.vec_dot`), i.e. it can be
    /// `src0` of a matrix multiplication.
    pub cpu_vec_dot: bool,
    /// The type the CPU backend converts `src1` to for that dot product.
    pub vec_dot_type: u32,
}

/// `None` for types outside the enum or removed from ggml (block size 0).
pub fn type_info(t: u32) -> Option<TypeInfo> {
    if t >= sys::GGML_TYPE_COUNT as u32 {
        return None;
    }
    let ty = t as sys::ggml_type;
    // SAFETY: ty < GGML_TYPE_COUNT; these functions index ggml's static type-traits table.
    let (blck, size, q) = unsafe {
        (
            sys::ggml_blck_size(ty),
            sys::ggml_type_size(ty),
            sys::ggml_is_quantized(ty),
        )
    };
    if blck <= 0 || size == 0 {
        return None;
    }
    // SAFETY: ty < GGML_TYPE_COUNT; both return pointers into static tables (never NULL for a
    // valid type), read only.
    let (has_to_float, cpu_from_float, cpu_vec_dot, vec_dot_type) = unsafe {
        let tr = sys::ggml_get_type_traits(ty);
        let cpu = sys::ggml_get_type_traits_cpu(ty);
        let has_to_float = !tr.is_null() && (*tr).to_float.is_some();
        if cpu.is_null() {
            (has_to_float, false, false, u32::MAX)
        } else {
            (
                has_to_float,
                (*cpu).from_float.is_some(),
                (*cpu).vec_dot.is_some(),
                (*cpu).vec_dot_type as u32,
            )
        }
    };
    Some(TypeInfo {
        blck_size: blck as u64,
        type_size: size as u64,
        is_quantized: q,
        has_to_float,
        cpu_from_float,
        cpu_vec_dot,
        vec_dot_type,
    })
}

/// `ggml_nbytes` with checked arithmetic: the extent in bytes of a tensor with these strides;
/// `None` for an unknown type or an extent over `u64`.
pub fn nbytes(type_: u32, ne: &[u32; 4], nb: &[u64; 4]) -> Option<u64> {
    let info = type_info(type_)?;
    if ne.contains(&0) {
        return Some(0);
    }
    let mut total: u128 = if info.blck_size == 1 {
        info.type_size as u128
    } else {
        (ne[0] as u128) * (nb[0] as u128) / (info.blck_size as u128)
    };
    let start = if info.blck_size == 1 { 0 } else { 1 };
    for i in start..4 {
        total += (ne[i] as u128 - 1) * nb[i] as u128;
    }
    u64::try_from(total).ok()
}

/// A tensor as described on the wire, not yet checked: what [`TensorSpec::new`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorDesc {
    pub type_: u32,
    pub ne: [u32; 4],
    pub nb: [u64; 4],
    pub op: u32,
    pub op_params: [i32; 16],
    pub flags: i32,
    pub view_offs: u64,
    /// NUL-terminated (the last byte is forced to 0).
    pub name: [u8; 64],
}

/// Why a [`TensorDesc`] cannot be a [`TensorSpec`] (the texts are the session's log messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorError {
    #[error("invalid type {0}")]
    Type(u32),
    #[error("ne[0]={ne0} is not a multiple of the block size {blck}")]
    Blocks { ne0: u32, blck: u64 },
    #[error("element count of {0:?} overflows int64")]
    Elements([u32; 4]),
    #[error("invalid op {0}")]
    Op(u32),
    #[error("custom ops carry code pointers and are refused")]
    CustomOp,
    #[error("size overflows")]
    Size,
    /// The extent `[offset, offset + size)` is not inside the buffer.
    #[error("data at offset {offset}+{size} outside its buffer of {buffer} bytes")]
    OutsideBuffer { offset: u64, size: u64, buffer: u64 },
}

/// A checked tensor: a known type, `ne[0]` whole blocks, an element count ggml's `int64` holds,
/// an op ggml has and that carries no code pointer, an extent that fits `u64`, and, when it is in
/// a buffer, its whole extent inside that buffer. Made only by [`TensorSpec::new`] (and placed by
/// [`TensorSpec::in_buffer`]), so every tensor rpc-ggml builds in ggml passes
/// `ggml_new_tensor_impl`'s assertions and stays inside its memory.
#[derive(Clone)]
pub struct TensorSpec {
    pub(crate) type_: u32,
    pub(crate) ne: [u32; 4],
    pub(crate) nb: [u64; 4],
    pub(crate) op: u32,
    pub(crate) op_params: [i32; 16],
    pub(crate) flags: i32,
    /// The buffer the tensor's data lives in, with the data's offset inside it.
    pub(crate) buffer: Option<(BufferRef, u64)>,
    pub(crate) view_offs: u64,
    pub(crate) name: [u8; 64],
}

impl TensorSpec {
    /// Checks a description; the tensor is in no buffer (see [`TensorSpec::in_buffer`]).
    pub fn new(d: TensorDesc) -> Result<TensorSpec, TensorError> {
        let info = type_info(d.type_).ok_or(TensorError::Type(d.type_))?;
        if !(d.ne[0] as u64).is_multiple_of(info.blck_size) {
            return Err(TensorError::Blocks {
                ne0: d.ne[0],
                blck: info.blck_size,
            });
        }
        // ggml_new_tensor_impl's GGML_ASSERT(INT64_MAX / ne[i] > current_nelements), exactly.
        let mut nel = d.ne[0] as i64;
        for &n in &d.ne[1..] {
            if n > 1 {
                if i64::MAX / n as i64 <= nel {
                    return Err(TensorError::Elements(d.ne));
                }
                nel *= n as i64;
            }
        }
        if d.op >= ops::COUNT {
            return Err(TensorError::Op(d.op));
        }
        if matches!(
            d.op,
            ops::CUSTOM | ops::MAP_CUSTOM1 | ops::MAP_CUSTOM2 | ops::MAP_CUSTOM3
        ) {
            return Err(TensorError::CustomOp);
        }
        nbytes(d.type_, &d.ne, &d.nb).ok_or(TensorError::Size)?;
        let mut name = d.name;
        name[63] = 0;
        Ok(TensorSpec {
            type_: d.type_,
            ne: d.ne,
            nb: d.nb,
            op: d.op,
            op_params: d.op_params,
            flags: d.flags,
            buffer: None,
            view_offs: d.view_offs,
            name,
        })
    }

    /// The tensor with its data at `offset` in `buffer`: refused unless its whole extent
    /// `[offset, offset + nbytes)` lies inside the buffer.
    pub fn in_buffer(mut self, buffer: BufferRef, offset: u64) -> Result<TensorSpec, TensorError> {
        let size = self.size();
        if offset
            .checked_add(size)
            .is_none_or(|end| end > buffer.size())
        {
            return Err(TensorError::OutsideBuffer {
                offset,
                size,
                buffer: buffer.size(),
            });
        }
        self.buffer = Some((buffer, offset));
        Ok(self)
    }

    /// Its extent in bytes (`ggml_nbytes`).
    pub fn size(&self) -> u64 {
        // Checked by `new`.
        nbytes(self.type_, &self.ne, &self.nb).unwrap_or(u64::MAX)
    }

    pub fn type_(&self) -> u32 {
        self.type_
    }

    /// Elements per dimension (`ne`).
    pub fn dims(&self) -> [u32; 4] {
        self.ne
    }

    /// Bytes between elements of each dimension (`nb`).
    pub fn strides(&self) -> [u64; 4] {
        self.nb
    }

    pub fn op(&self) -> u32 {
        self.op
    }

    pub fn op_params(&self) -> &[i32; 16] {
        &self.op_params
    }

    pub fn flags(&self) -> i32 {
        self.flags
    }

    /// The buffer the data lives in and the data's offset there; `None` when in no buffer.
    pub fn buffer(&self) -> Option<(&BufferRef, u64)> {
        self.buffer.as_ref().map(|(b, o)| (b, *o))
    }

    pub fn view_offs(&self) -> u64 {
        self.view_offs
    }

    /// The name, NUL-terminated.
    pub fn name(&self) -> &[u8; 64] {
        &self.name
    }
    /// Creates the tensor this describes inside `ctx`.
    ///
    /// The context must have room for one more tensor (guaranteed by the sizing in
    /// `Context::new`, which callers respect by creating at most `n_tensors` tensors).
    pub(crate) fn build(&self, ctx: &mut Context) -> *mut sys::ggml_tensor {
        // SAFETY: self.type_ is a valid type with ne[0] a multiple of its block size and an
        // element count int64 holds (checked by `TensorSpec::new`), so ggml_new_tensor_4d's
        // asserts hold; no_alloc means no data allocation; the context has room (sizing above).
        let t = unsafe {
            sys::ggml_new_tensor_4d(
                ctx.raw(),
                self.type_ as sys::ggml_type,
                self.ne[0] as i64,
                self.ne[1] as i64,
                self.ne[2] as i64,
                self.ne[3] as i64,
            )
        };
        // SAFETY: t is a fresh tensor in our context; we only write plain fields.
        unsafe {
            let r = &mut *t;
            for i in 0..4 {
                r.nb[i] = self.nb[i] as usize;
            }
            r.op = self.op as sys::ggml_op;
            r.op_params = self.op_params;
            r.flags = self.flags;
            r.view_offs = self.view_offs as usize;
            if let Some((buf, off)) = &self.buffer {
                let (raw, base) = buf.raw_parts();
                r.buffer = raw;
                r.data = (base + *off as usize) as *mut std::ffi::c_void;
            }
            let mut name = [0 as std::os::raw::c_char; 64];
            for (d, s) in name.iter_mut().zip(self.name.iter().take(63)) {
                *d = *s as std::os::raw::c_char;
            }
            r.name = name;
        }
        t
    }
}

/// A few tensors built for one command (INIT_TENSOR, GET_ALLOC_SIZE, COPY_TENSOR). Each tensor
/// is a checked [`TensorSpec`]; each call checks the relations ggml's function relies on.
pub struct ScratchTensors {
    ctx: Context,
    tensors: Vec<*mut sys::ggml_tensor>,
    /// The spec of each tensor (its buffer and extent, for the checks of each call).
    specs: Vec<TensorSpec>,
    /// Every buffer a tensor points into, once: kept alive, and locked for the calls that may
    /// touch their bytes.
    buffers: Vec<BufferRef>,
}

extern "C" {
    // Exported by ggml-base (ggml-backend-impl.h) but not part of the public headers the
    // bindings are generated from.
    fn ggml_backend_buffer_copy_tensor(
        src: *const sys::ggml_tensor,
        dst: *mut sys::ggml_tensor,
    ) -> bool;
}

impl ScratchTensors {
    pub fn new(specs: &[TensorSpec]) -> Option<ScratchTensors> {
        let mut ctx = Context::new(specs.len(), None)?;
        let tensors = specs.iter().map(|s| s.build(&mut ctx)).collect();
        let buffers = buffer::dedup(
            specs
                .iter()
                .filter_map(|s| s.buffer.as_ref().map(|(b, _)| b.clone())),
        );
        Some(ScratchTensors {
            ctx,
            tensors,
            specs: specs.to_vec(),
            buffers,
        })
    }

    /// Makes tensor `src` the `slot`-th source of tensor `of` (ignored when out of range).
    pub fn set_src(&mut self, of: usize, slot: usize, src: usize) {
        if let (Some(&t), Some(&s)) = (self.tensors.get(of), self.tensors.get(src)) {
            if slot < 10 {
                // SAFETY: both tensors live in self.ctx.
                unsafe { (*t).src[slot] = s };
            }
        }
    }

    /// A quantized tensor whose `nb[0]` is not its block size: CUDA's `get_alloc_size` (also
    /// run by its `init_tensor`) asserts against it.
    fn padding_assert(&self, i: usize) -> Result<(), &'static str> {
        let s = &self.specs[i];
        match type_info(s.type_) {
            Some(info) if info.is_quantized && s.nb[0] != info.type_size => {
                Err("quantized tensor whose nb[0] is not its block size")
            }
            _ => Ok(()),
        }
    }

    /// The buffer backend's `init_tensor` hook (e.g. CUDA pads quantized rows: it zeroes the
    /// bytes from the tensor's end up to its allocation size, which must therefore lie inside
    /// the buffer too). Fails when the backend attaches `extra` data, which cannot be carried
    /// over RPC.
    pub fn init_tensor(&mut self, i: usize) -> Result<(), &'static str> {
        let t = *self.tensors.get(i).ok_or("no such tensor")?;
        let Some((bref, off)) = self.specs[i].buffer() else {
            return Err("tensor has no buffer");
        };
        self.padding_assert(i)?;
        let (buf, _) = bref.raw_parts();
        // SAFETY: buf is a live buffer (kept alive by self.buffers); t lives in self.ctx with a
        // checked type and shape, and no quantized nb[0] CUDA's get_alloc_size asserts against.
        // Only descriptions are read.
        let padded = unsafe {
            sys::ggml_backend_buft_get_alloc_size(sys::ggml_backend_buffer_get_type(buf), t)
        } as u64;
        if off.checked_add(padded).is_none_or(|end| end > bref.size()) {
            return Err("the tensor's allocation size leaves its buffer");
        }
        let _locked = buffer::lock(&self.buffers).map_err(|_| "buffer in use")?;
        // SAFETY: buf is a live buffer (kept alive by self.buffers, whose flags we hold
        // exclusively, so the hook may write it); t's data is inside it with its whole
        // allocation size (checked above), all the hook may touch.
        let status = unsafe { sys::ggml_backend_buffer_init_tensor(buf, t) };
        if status != sys::GGML_STATUS_SUCCESS {
            return Err("backend init_tensor failed");
        }
        // SAFETY: t lives in self.ctx.
        if unsafe { !(*t).extra.is_null() } {
            return Err("backend attached extra data to the tensor (unsupported over RPC)");
        }
        Ok(())
    }

    /// Allocation size of tensor `i` in its buffer's type, or in `device`'s default type.
    pub fn alloc_size(&self, i: usize, device: &Device) -> Result<u64, &'static str> {
        let t = *self.tensors.get(i).ok_or("no such tensor")?;
        self.padding_assert(i)?;
        let buft = match self.specs[i].buffer() {
            // SAFETY: the buffer is alive (self.buffers); only its type is read.
            Some((b, _)) => unsafe { sys::ggml_backend_buffer_get_type(b.raw_parts().0) },
            None => device.default_buft_raw(),
        };
        // SAFETY: valid buffer type; t lives in self.ctx with a checked type and shape (and its
        // sources, if any, too). Only the tensors' descriptions are read, not the buffer's bytes.
        Ok(unsafe { sys::ggml_backend_buft_get_alloc_size(buft, t) } as u64)
    }

    /// Copies tensor `src` into tensor `dst` through the destination buffer's copy hook, which
    /// writes `nbytes(src)` bytes at `dst`'s data. `Ok(false)` (not copied: the client copies
    /// through GET/SET) when a tensor is in no buffer, or when the two ranges overlap (`memcpy`
    /// between overlapping ranges is undefined); `Err(OutOfBounds)` when `nbytes(src)` bytes
    /// from `dst`'s data leave its buffer.
    pub fn copy(&self, src: usize, dst: usize) -> Result<bool, Access> {
        let (Some(&s), Some(&d)) = (self.tensors.get(src), self.tensors.get(dst)) else {
            return Ok(false);
        };
        let (ss, ds) = (&self.specs[src], &self.specs[dst]);
        let (Some((sbuf, soff)), Some((dbuf, doff))) = (ss.buffer(), ds.buffer()) else {
            return Ok(false);
        };
        let len = ss.size();
        if doff.checked_add(len).is_none_or(|end| end > dbuf.size()) {
            return Err(Access::OutOfBounds);
        }
        if len != 0 && sbuf == dbuf && soff < doff + len && doff < soff + len {
            return Ok(false);
        }
        let _locked = buffer::lock(&self.buffers)?;
        // SAFETY: both tensors live in self.ctx with live buffers (self.buffers, whose flags we
        // hold exclusively: nothing else reads or writes them); src's extent is inside its
        // buffer (TensorSpec), the nbytes(src) bytes written at dst's data inside dst's buffer
        // and not overlapping src's (checked above).
        Ok(unsafe { ggml_backend_buffer_copy_tensor(s, d) })
    }

    #[allow(dead_code)]
    pub(crate) fn ctx(&self) -> &Context {
        &self.ctx
    }
}

// SAFETY: the raw tensor pointers point into self.ctx, which moves with the struct.
unsafe impl Send for ScratchTensors {}
