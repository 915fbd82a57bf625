//! `rpc-ggml`: the ggml FFI layer of `rpc-server`, the only code of the server that calls into
//! ggml's C API.
//!
//! Everything above this crate works with safe types: [`Device`], [`Backend`], [`Buffer`] (a
//! buffer's one owner, the only way to write its bytes) and [`BufferRef`] (what tensors and
//! graphs hold: keeps the memory alive, cannot write it), [`TensorSpec`], [`ScratchTensors`] and
//! [`Graph`]. Their API is sound by construction: no safe code can make two overlapping views of
//! a buffer's bytes one of which writes, nor compute a graph while a view of one of its buffers
//! is alive (see `buffer.rs`); and no input given to a safe function, however it was made, can
//! trip one of ggml's `GGML_ASSERT`s this layer calls into or make a kernel leave its tensors:
//!
//! - a [`TensorSpec`] exists only checked ([`TensorSpec::new`] from a [`TensorDesc`]: a known
//!   type, `ne[0]` whole blocks, an element count `int64` holds, a real op that carries no code
//!   pointer, an extent that fits `u64`; [`TensorSpec::in_buffer`]: its whole extent inside its
//!   buffer);
//! - [`Graph::build`] refuses a graph unless its links name its tensors, every computing node and
//!   its sources are in buffers, every view stays inside what it views, every computing node
//!   passes its op's rule (the relations ggml's constructors establish and its kernels assume,
//!   `check/`; the CPU's kernels have rules of their own), the device supports it and can compute
//!   with the buffers it touches; it schedules the checks on index tensors' contents (row ids,
//!   expert ids) that [`Backend::compute`] runs before each segment, under the same buffer flags
//!   as the computation; that is the only way to compute a graph, and only on a backend of the
//!   device it was built for;
//! - each call of [`ScratchTensors`] checks the relation its ggml function relies on (a copy's
//!   size against its destination's buffer, `init_tensor`'s padding inside the buffer).
//!
//! Every `unsafe` block states why it is sound in a `// SAFETY:` line; no raw pointer or ggml
//! handle is part of the public API. Should an assertion of ggml fire anyway (a bug of these
//! checks), [`abort`] decides what happens.
//!
//! It depends on `llama-cpp-sys-2` (ggml itself), `rpc-proto` (the op and type ids, checked
//! against the linked ggml at compile time) and nothing of the server.

// The FFI layer: `unsafe` is its job; every block states why it is sound.
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(unsafe_op_in_unsafe_fn)]
// bindgen types ggml's enum constants by platform (`u32` here, `i32` with MSVC): the `as u32`
// casts below are no-ops on this target and needed on others.
#![allow(clippy::unnecessary_cast)]

// The crate's modules, bottom up; each imports only those before it (and `sys`, `ops`, `abort`):
// `context` (ggml contexts, the byte tensor) < `buffer` < `device` (makes buffers) < `tensor`
// (checked descriptions made into tensors; allocation sizes on a device) < `check` (the rules a
// graph passes, the index checks) < `graph` < `backend` (runs a graph on a device; adds
// `Device::init_backend`). `abort`, `ids` and `ops` import none of them; `tests` (test-only)
// imports them all.
pub mod abort;
mod backend;
mod buffer;
mod check;
mod context;
mod device;
mod graph;
mod tensor;
#[cfg(test)]
mod tests;

pub use backend::Backend;
pub use buffer::{use_huge_pages, Access, Buffer, BufferRef, HostMut, HostRef};
pub use check::{GraphLinks, IndexError, Refusal, Rule};
pub use device::{load_backends, load_backends_from, Device, DeviceKind};
pub use graph::{Graph, GraphError};
pub use tensor::{
    nbytes, type_info, ScratchTensors, TensorDesc, TensorError, TensorSpec, TypeInfo,
};

use llama_cpp_sys_2 as sys;

/// The op and type enums the codec was written for (protocol 7.0.0, `rpc_proto::{ggml_op,
/// ggml_type}`). A ggml with other enums would silently misinterpret every graph, so the build
/// fails instead: `ids.rs` asserts every id against the bindings.
mod ids;

/// ggml op numbers (`rpc_proto::ggml_op`, checked against the bindings at compile time in
/// `ids.rs`), with the two questions the server asks ggml about an op.
pub mod ops {
    use super::sys;
    pub use rpc_proto::ggml_op::*;

    /// Ops that compute nothing (`ggml_op_is_empty`): their node only describes a view.
    pub fn is_empty(op: u32) -> bool {
        matches!(op, NONE | RESHAPE | VIEW | PERMUTE | TRANSPOSE)
    }

    /// Name of an op, for logs ("MUL_MAT"); `None` for out-of-range values.
    pub fn name(op: u32) -> Option<String> {
        if op >= COUNT {
            return None;
        }
        // SAFETY: op < GGML_OP_COUNT, so ggml_op_name indexes its static table in bounds and
        // returns a pointer to a static NUL-terminated string.
        let p = unsafe { sys::ggml_op_name(op as sys::ggml_op) };
        if p.is_null() {
            return None;
        }
        // SAFETY: p is non-null and points to a static C string (see above).
        Some(
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// Returns freed heap memory to the operating system (glibc `malloc_trim`).
///
/// Tensor buffers and compute work buffers are large allocations made from whichever malloc arena
/// the connection's current thread uses; glibc keeps freed arena memory mapped, so without this
/// a server's resident size grows by a model's compute buffers for every arena its connections
/// touched. Called when a session that allocated memory ends.
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> std::os::raw::c_int;
        }
        // SAFETY: malloc_trim has no preconditions; it only releases free pages.
        unsafe { malloc_trim(0) };
    }
}

/// Tunes glibc's allocator for a long-running server (the program's options say what:
/// `options::MallocTuning`, from `RPC_MALLOC_TUNING`, `MALLOC_ARENA_MAX` and
/// `MALLOC_MMAP_THRESHOLD_` read at start-up):
///
/// - `arena_max`: at most that many malloc arenas (the program: 2 to 8, one per core): every
///   thread that allocates (tokio workers, one blocking thread per compute burst, ggml's threads)
///   may get its own arena, and each keeps its high-water mark of small allocations;
/// - `fixed_mmap_threshold`: a fixed 1 MiB mmap threshold: by default glibc raises the threshold
///   to the size of every mmapped block that is freed (up to 32 MiB), so after the first model is
///   unloaded, compute buffers and graph contexts of later sessions come from the heap and stay
///   resident there.
///
/// With glibc's defaults a server under many short connections during generation grew round after
/// round to ~37 MB resident before levelling off. Called once at start-up, before any thread.
/// `None` and `false` leave glibc's settings; a no-op on other systems.
pub fn tune_malloc(arena_max: Option<usize>, fixed_mmap_threshold: bool) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        const M_MMAP_THRESHOLD: std::os::raw::c_int = -3;
        const M_ARENA_MAX: std::os::raw::c_int = -8;
        extern "C" {
            fn mallopt(
                param: std::os::raw::c_int,
                value: std::os::raw::c_int,
            ) -> std::os::raw::c_int;
        }
        if let Some(arenas) = arena_max {
            let n = std::os::raw::c_int::try_from(arenas.max(1)).unwrap_or(8);
            // SAFETY: mallopt only changes an allocator tunable; M_ARENA_MAX is valid at any time.
            unsafe { mallopt(M_ARENA_MAX, n) };
        }
        if fixed_mmap_threshold {
            // SAFETY: as above; 1 MiB is within the allowed range (at most 32 MiB on 64-bit).
            unsafe { mallopt(M_MMAP_THRESHOLD, 1 << 20) };
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = (arena_max, fixed_mmap_threshold);
}
