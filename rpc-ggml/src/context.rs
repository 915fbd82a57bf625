//! ggml contexts: the pool that tensor and graph descriptions live in (their data lives in
//! buffers), and the one-off byte tensor through which a buffer's bytes are read and written when
//! the CPU cannot address them. The bottom of the layer: it knows no buffer, tensor description,
//! device or graph (`lib.rs` lists the order).

use super::sys;

/// Size in bytes of the bookkeeping ggml needs per tensor inside a context.
fn tensor_overhead() -> usize {
    // SAFETY: pure function without arguments.
    unsafe { sys::ggml_tensor_overhead() }
}

/// An owned, no-alloc ggml context (tensor metadata only; data lives in buffers).
pub(crate) struct Context {
    raw: *mut sys::ggml_context,
    /// Bytes of the context's memory pool.
    size: usize,
}

// SAFETY: a context is plain memory owned by one session at a time.
unsafe impl Send for Context {}

impl Context {
    /// A context with room for `n_tensors` tensors and, optionally, a graph of `graph_size` nodes.
    pub(crate) fn new(n_tensors: usize, graph_size: Option<usize>) -> Option<Context> {
        Context::new_for_graphs(n_tensors, graph_size.as_slice())
    }

    /// A context with room for `n_tensors` tensors and one graph of each size in `graph_sizes`.
    pub(crate) fn new_for_graphs(n_tensors: usize, graph_sizes: &[usize]) -> Option<Context> {
        let mut graph_mem = 0usize;
        for &n in graph_sizes {
            // SAFETY: pure size computation.
            let m = unsafe { sys::ggml_graph_overhead_custom(n, false) };
            graph_mem = graph_mem.checked_add(m)?;
        }
        let mem = tensor_overhead()
            .checked_mul(n_tensors.checked_add(1)?)?
            .checked_add(graph_mem)?
            .checked_add(1024)?;
        let params = sys::ggml_init_params {
            mem_size: mem,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // SAFETY: valid params; ggml allocates the pool itself; NULL handled below.
        let raw = unsafe { sys::ggml_init(params) };
        (!raw.is_null()).then_some(Context { raw, size: mem })
    }

    pub(crate) fn raw(&self) -> *mut sys::ggml_context {
        self.raw
    }

    /// Bytes of the context's memory pool.
    pub(crate) fn size(&self) -> usize {
        self.size
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: raw came from ggml_init and is freed exactly once.
        unsafe { sys::ggml_free(self.raw) };
    }
}

/// Runs `f` with a one-dimensional I8 tensor covering `[off, off+len)` of the buffer `raw`
/// whose memory starts at `base` (already bounds-checked by the caller, who holds the buffer's
/// flag). Used for reads and writes on non-host buffers.
pub(super) fn with_byte_tensor<R>(
    raw: sys::ggml_backend_buffer_t,
    base: usize,
    off: usize,
    len: usize,
    f: impl FnOnce(*mut sys::ggml_tensor) -> R,
) -> Option<R> {
    // A tensor's extents are `u32` on the wire; a region the session hands here is one too.
    let ne = i64::from(u32::try_from(len).ok()?);
    let ctx = Context::new(1, None)?;
    // SAFETY: I8 is a valid type of block size 1, so any `ne` is a multiple of it; no_alloc
    // means no data allocation; the context has room for one tensor (sized above). The tensor
    // is contiguous (`nb` = 1, len, len, len), op NONE, no flags, parameters or name.
    let t = unsafe { sys::ggml_new_tensor_1d(ctx.raw(), sys::GGML_TYPE_I8, ne) };
    // SAFETY: t is live in ctx; the region [off, off+len) is inside the buffer (caller checked).
    unsafe {
        (*t).buffer = raw;
        (*t).data = (base + off) as *mut std::ffi::c_void;
    }
    Some(f(t))
}
