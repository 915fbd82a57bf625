//! Building ggml tensors from validated descriptions: [`TensorSpec`] (what the session checked),
//! made into a ggml tensor in a [`Context`], and [`ScratchTensors`], the few tensors of one
//! command. Above buffers and devices, below graphs (`mod.rs` lists the order).

use super::buffer::{self, Access, BufferRef};
use super::context::Context;
use super::device::Device;
use super::sys;

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

/// A tensor the session has validated: known type, `ne[0]` a multiple of the block size, and,
/// when it has a buffer, its whole extent inside that buffer.
#[derive(Clone)]
pub struct TensorSpec {
    pub type_: u32,
    pub ne: [u32; 4],
    pub nb: [u64; 4],
    pub op: u32,
    pub op_params: [i32; 16],
    pub flags: i32,
    /// The buffer the tensor's data lives in, with the data's offset inside it.
    pub buffer: Option<(BufferRef, u64)>,
    pub view_offs: u64,
    pub name: [u8; 64],
}

impl TensorSpec {
    /// Creates the tensor this describes inside `ctx`.
    ///
    /// The context must have room for one more tensor (guaranteed by the sizing in
    /// `Context::new`, which callers respect by creating at most `n_tensors` tensors).
    pub(crate) fn build(&self, ctx: &mut Context) -> *mut sys::ggml_tensor {
        // SAFETY: self.type_ is a valid type with ne[0] a multiple of its block size (validated
        // by the session), so ggml_new_tensor_4d's asserts hold; no_alloc means no data
        // allocation; the context has room (sizing above).
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

/// A few tensors built for one command (INIT_TENSOR, GET_ALLOC_SIZE, COPY_TENSOR).
pub struct ScratchTensors {
    ctx: Context,
    tensors: Vec<*mut sys::ggml_tensor>,
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
            buffers,
        })
    }

    /// Makes tensor `src` the `slot`-th source of tensor `of`.
    pub fn set_src(&mut self, of: usize, slot: usize, src: usize) {
        if let (Some(&t), Some(&s)) = (self.tensors.get(of), self.tensors.get(src)) {
            if slot < 10 {
                // SAFETY: both tensors live in self.ctx.
                unsafe { (*t).src[slot] = s };
            }
        }
    }

    /// The buffer backend's `init_tensor` hook (e.g. CUDA pads quantized rows). Fails when the
    /// backend attaches `extra` data, which cannot be carried over RPC.
    pub fn init_tensor(&mut self, i: usize) -> Result<(), &'static str> {
        let t = *self.tensors.get(i).ok_or("no such tensor")?;
        // SAFETY: t lives in self.ctx.
        let buf = unsafe { (*t).buffer };
        if buf.is_null() {
            return Err("tensor has no buffer");
        }
        let _locked = buffer::lock(&self.buffers).map_err(|_| "buffer in use")?;
        // SAFETY: buf is a live buffer (kept alive by self.buffers, whose flags we hold
        // exclusively, so the hook may write it); t's extent is inside it.
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
    pub fn alloc_size(&self, i: usize, device: &Device) -> Option<u64> {
        let t = *self.tensors.get(i)?;
        // SAFETY: t lives in self.ctx; its buffer, if any, is alive (self.buffers). Only the
        // tensor's description is read, not the buffer's bytes.
        let buft = unsafe {
            if (*t).buffer.is_null() {
                device.default_buft_raw()
            } else {
                sys::ggml_backend_buffer_get_type((*t).buffer)
            }
        };
        // SAFETY: valid buffer type and tensor (validated type and shape).
        Some(unsafe { sys::ggml_backend_buft_get_alloc_size(buft, t) } as u64)
    }

    /// Copies tensor `src` into tensor `dst` through the destination buffer's copy hook.
    /// Both extents were checked against their buffers by the caller.
    pub fn copy(&self, src: usize, dst: usize) -> Result<bool, Access> {
        let (Some(&s), Some(&d)) = (self.tensors.get(src), self.tensors.get(dst)) else {
            return Ok(false);
        };
        let _locked = buffer::lock(&self.buffers)?;
        // SAFETY: both tensors live in self.ctx with live buffers (self.buffers, whose flags we
        // hold exclusively: nothing else reads or writes them) and checked extents.
        Ok(unsafe { ggml_backend_buffer_copy_tensor(s, d) })
    }

    #[allow(dead_code)]
    pub(crate) fn ctx(&self) -> &Context {
        &self.ctx
    }
}

// SAFETY: the raw tensor pointers point into self.ctx, which moves with the struct.
unsafe impl Send for ScratchTensors {}
