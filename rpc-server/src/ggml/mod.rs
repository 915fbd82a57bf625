//! The ggml FFI layer: the only module of the server that calls into C.
//!
//! Everything above this module works with safe types: [`Device`], [`Backend`], [`Buffer`],
//! [`TensorSpec`] and [`Graph`]. Every `unsafe` block states why it is sound in a `// SAFETY:` line.
//! Inputs reaching this layer are already validated by the session (types, shapes, extents inside
//! their buffer), so nothing here can trip one of ggml's `GGML_ASSERT`s from the network.

// bindgen types ggml's enum constants by platform (`u32` here, `i32` with MSVC): the `as u32`
// casts below are no-ops on this target and needed on others.
#![allow(clippy::unnecessary_cast)]

pub mod abort;
mod buffer;
mod device;
mod graph;
mod tensor;

pub use buffer::Buffer;
pub use device::{load_backends, Backend, Device, DeviceKind};
pub use graph::{Graph, GraphError, GraphLinks};
pub use tensor::{type_info, ScratchTensors, TensorSpec, TypeInfo};

use llama_cpp_sys_2 as sys;

/// The op and type enums the codec was written for (protocol 7.0.0). A ggml with other enums would
/// silently misinterpret every graph, so the build fails instead.
const _: () = assert!(sys::GGML_OP_COUNT as u32 == rpc_proto::GGML_OP_COUNT);
const _: () = assert!(sys::GGML_TYPE_COUNT as u32 == rpc_proto::GGML_TYPE_COUNT);

/// ggml op numbers the server needs by name (checked against the bindings at compile time).
pub mod ops {
    use super::sys;
    pub const NONE: u32 = sys::GGML_OP_NONE as u32;
    pub const DUP: u32 = sys::GGML_OP_DUP as u32;
    pub const ADD: u32 = sys::GGML_OP_ADD as u32;
    pub const ADD_ID: u32 = sys::GGML_OP_ADD_ID as u32;
    pub const ADD1: u32 = sys::GGML_OP_ADD1 as u32;
    pub const ACC: u32 = sys::GGML_OP_ACC as u32;
    pub const SUB: u32 = sys::GGML_OP_SUB as u32;
    pub const MUL: u32 = sys::GGML_OP_MUL as u32;
    pub const DIV: u32 = sys::GGML_OP_DIV as u32;
    pub const SQR: u32 = sys::GGML_OP_SQR as u32;
    pub const SQRT: u32 = sys::GGML_OP_SQRT as u32;
    pub const LOG: u32 = sys::GGML_OP_LOG as u32;
    pub const SIN: u32 = sys::GGML_OP_SIN as u32;
    pub const COS: u32 = sys::GGML_OP_COS as u32;
    pub const SUM: u32 = sys::GGML_OP_SUM as u32;
    pub const SUM_ROWS: u32 = sys::GGML_OP_SUM_ROWS as u32;
    pub const CUMSUM: u32 = sys::GGML_OP_CUMSUM as u32;
    pub const MEAN: u32 = sys::GGML_OP_MEAN as u32;
    pub const ARGMAX: u32 = sys::GGML_OP_ARGMAX as u32;
    pub const COUNT_EQUAL: u32 = sys::GGML_OP_COUNT_EQUAL as u32;
    pub const REPEAT: u32 = sys::GGML_OP_REPEAT as u32;
    pub const REPEAT_BACK: u32 = sys::GGML_OP_REPEAT_BACK as u32;
    pub const CONCAT: u32 = sys::GGML_OP_CONCAT as u32;
    pub const SILU_BACK: u32 = sys::GGML_OP_SILU_BACK as u32;
    pub const NORM: u32 = sys::GGML_OP_NORM as u32;
    pub const RMS_NORM: u32 = sys::GGML_OP_RMS_NORM as u32;
    pub const RMS_NORM_BACK: u32 = sys::GGML_OP_RMS_NORM_BACK as u32;
    pub const GROUP_NORM: u32 = sys::GGML_OP_GROUP_NORM as u32;
    pub const L2_NORM: u32 = sys::GGML_OP_L2_NORM as u32;
    pub const MUL_MAT: u32 = sys::GGML_OP_MUL_MAT as u32;
    pub const MUL_MAT_ID: u32 = sys::GGML_OP_MUL_MAT_ID as u32;
    pub const OUT_PROD: u32 = sys::GGML_OP_OUT_PROD as u32;
    pub const SCALE: u32 = sys::GGML_OP_SCALE as u32;
    pub const SET: u32 = sys::GGML_OP_SET as u32;
    pub const CPY: u32 = sys::GGML_OP_CPY as u32;
    pub const CONT: u32 = sys::GGML_OP_CONT as u32;
    pub const RESHAPE: u32 = sys::GGML_OP_RESHAPE as u32;
    pub const VIEW: u32 = sys::GGML_OP_VIEW as u32;
    pub const PERMUTE: u32 = sys::GGML_OP_PERMUTE as u32;
    pub const TRANSPOSE: u32 = sys::GGML_OP_TRANSPOSE as u32;
    pub const GET_ROWS: u32 = sys::GGML_OP_GET_ROWS as u32;
    pub const GET_ROWS_BACK: u32 = sys::GGML_OP_GET_ROWS_BACK as u32;
    pub const SET_ROWS: u32 = sys::GGML_OP_SET_ROWS as u32;
    pub const DIAG: u32 = sys::GGML_OP_DIAG as u32;
    pub const DIAG_MASK_INF: u32 = sys::GGML_OP_DIAG_MASK_INF as u32;
    pub const DIAG_MASK_ZERO: u32 = sys::GGML_OP_DIAG_MASK_ZERO as u32;
    pub const SOFT_MAX: u32 = sys::GGML_OP_SOFT_MAX as u32;
    pub const SOFT_MAX_BACK: u32 = sys::GGML_OP_SOFT_MAX_BACK as u32;
    pub const ROPE: u32 = sys::GGML_OP_ROPE as u32;
    pub const ROPE_BACK: u32 = sys::GGML_OP_ROPE_BACK as u32;
    pub const CLAMP: u32 = sys::GGML_OP_CLAMP as u32;
    pub const CONV_TRANSPOSE_1D: u32 = sys::GGML_OP_CONV_TRANSPOSE_1D as u32;
    pub const IM2COL: u32 = sys::GGML_OP_IM2COL as u32;
    pub const IM2COL_BACK: u32 = sys::GGML_OP_IM2COL_BACK as u32;
    pub const IM2COL_3D: u32 = sys::GGML_OP_IM2COL_3D as u32;
    pub const COL2IM_1D: u32 = sys::GGML_OP_COL2IM_1D as u32;
    pub const CONV_2D: u32 = sys::GGML_OP_CONV_2D as u32;
    pub const CONV_3D: u32 = sys::GGML_OP_CONV_3D as u32;
    pub const CONV_2D_DW: u32 = sys::GGML_OP_CONV_2D_DW as u32;
    pub const CONV_TRANSPOSE_2D: u32 = sys::GGML_OP_CONV_TRANSPOSE_2D as u32;
    pub const POOL_1D: u32 = sys::GGML_OP_POOL_1D as u32;
    pub const POOL_2D: u32 = sys::GGML_OP_POOL_2D as u32;
    pub const POOL_2D_BACK: u32 = sys::GGML_OP_POOL_2D_BACK as u32;
    pub const UPSCALE: u32 = sys::GGML_OP_UPSCALE as u32;
    pub const PAD: u32 = sys::GGML_OP_PAD as u32;
    pub const PAD_REFLECT_1D: u32 = sys::GGML_OP_PAD_REFLECT_1D as u32;
    pub const ROLL: u32 = sys::GGML_OP_ROLL as u32;
    pub const ARANGE: u32 = sys::GGML_OP_ARANGE as u32;
    pub const TIMESTEP_EMBEDDING: u32 = sys::GGML_OP_TIMESTEP_EMBEDDING as u32;
    pub const ARGSORT: u32 = sys::GGML_OP_ARGSORT as u32;
    pub const TOP_K: u32 = sys::GGML_OP_TOP_K as u32;
    pub const LEAKY_RELU: u32 = sys::GGML_OP_LEAKY_RELU as u32;
    pub const TRI: u32 = sys::GGML_OP_TRI as u32;
    pub const FILL: u32 = sys::GGML_OP_FILL as u32;
    pub const FLASH_ATTN_EXT: u32 = sys::GGML_OP_FLASH_ATTN_EXT as u32;
    pub const FLASH_ATTN_BACK: u32 = sys::GGML_OP_FLASH_ATTN_BACK as u32;
    pub const SSM_CONV: u32 = sys::GGML_OP_SSM_CONV as u32;
    pub const SSM_SCAN: u32 = sys::GGML_OP_SSM_SCAN as u32;
    pub const WIN_PART: u32 = sys::GGML_OP_WIN_PART as u32;
    pub const WIN_UNPART: u32 = sys::GGML_OP_WIN_UNPART as u32;
    pub const GET_REL_POS: u32 = sys::GGML_OP_GET_REL_POS as u32;
    pub const ADD_REL_POS: u32 = sys::GGML_OP_ADD_REL_POS as u32;
    pub const RWKV_WKV6: u32 = sys::GGML_OP_RWKV_WKV6 as u32;
    pub const GATED_LINEAR_ATTN: u32 = sys::GGML_OP_GATED_LINEAR_ATTN as u32;
    pub const RWKV_WKV7: u32 = sys::GGML_OP_RWKV_WKV7 as u32;
    pub const SOLVE_TRI: u32 = sys::GGML_OP_SOLVE_TRI as u32;
    pub const GATED_DELTA_NET: u32 = sys::GGML_OP_GATED_DELTA_NET as u32;
    pub const LIGHTNING_INDEXER: u32 = sys::GGML_OP_LIGHTNING_INDEXER as u32;
    pub const DSV4_HC_COMB: u32 = sys::GGML_OP_DSV4_HC_COMB as u32;
    pub const DSV4_HC_PRE: u32 = sys::GGML_OP_DSV4_HC_PRE as u32;
    pub const DSV4_HC_POST: u32 = sys::GGML_OP_DSV4_HC_POST as u32;
    pub const UNARY: u32 = sys::GGML_OP_UNARY as u32;
    pub const MAP_CUSTOM1: u32 = sys::GGML_OP_MAP_CUSTOM1 as u32;
    pub const MAP_CUSTOM2: u32 = sys::GGML_OP_MAP_CUSTOM2 as u32;
    pub const MAP_CUSTOM3: u32 = sys::GGML_OP_MAP_CUSTOM3 as u32;
    pub const CUSTOM: u32 = sys::GGML_OP_CUSTOM as u32;
    pub const CROSS_ENTROPY_LOSS: u32 = sys::GGML_OP_CROSS_ENTROPY_LOSS as u32;
    pub const CROSS_ENTROPY_LOSS_BACK: u32 = sys::GGML_OP_CROSS_ENTROPY_LOSS_BACK as u32;
    pub const OPT_STEP_ADAMW: u32 = sys::GGML_OP_OPT_STEP_ADAMW as u32;
    pub const OPT_STEP_SGD: u32 = sys::GGML_OP_OPT_STEP_SGD as u32;
    pub const GLU: u32 = sys::GGML_OP_GLU as u32;
    pub const COUNT: u32 = sys::GGML_OP_COUNT as u32;

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

/// Tunes glibc's allocator for a long-running server, unless `MALLOC_ARENA_MAX` /
/// `MALLOC_MMAP_THRESHOLD_` are set:
///
/// - at most `arenas` malloc arenas (default: 8 per core): every thread that allocates (tokio
///   workers, one blocking thread per compute burst, ggml's threads) may get its own arena, and
///   each keeps its high-water mark of small allocations;
/// - a fixed 1 MiB mmap threshold: by default glibc raises the threshold to the size of every
///   mmapped block that is freed (up to 32 MiB), so after the first model is unloaded, compute
///   buffers and graph contexts of later sessions come from the heap and stay resident there.
///
/// With the defaults a server under many short connections during generation grew round after
/// round to ~37 MB resident before levelling off. Called once at start-up, before any thread.
/// `RPC_MALLOC_TUNING=0` leaves glibc's defaults.
pub fn tune_malloc(arenas: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("RPC_MALLOC_TUNING").is_none_or(|v| v != "0") {
        const M_MMAP_THRESHOLD: std::os::raw::c_int = -3;
        const M_ARENA_MAX: std::os::raw::c_int = -8;
        extern "C" {
            fn mallopt(
                param: std::os::raw::c_int,
                value: std::os::raw::c_int,
            ) -> std::os::raw::c_int;
        }
        if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
            let n = std::os::raw::c_int::try_from(arenas.max(1)).unwrap_or(8);
            // SAFETY: mallopt only changes an allocator tunable; M_ARENA_MAX is valid at any time.
            unsafe { mallopt(M_ARENA_MAX, n) };
        }
        if std::env::var_os("MALLOC_MMAP_THRESHOLD_").is_none() {
            // SAFETY: as above; 1 MiB is within the allowed range (at most 32 MiB on 64-bit).
            unsafe { mallopt(M_MMAP_THRESHOLD, 1 << 20) };
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

/// Size in bytes of the bookkeeping ggml needs per tensor inside a context.
pub(crate) fn tensor_overhead() -> usize {
    // SAFETY: pure function without arguments.
    unsafe { sys::ggml_tensor_overhead() }
}
