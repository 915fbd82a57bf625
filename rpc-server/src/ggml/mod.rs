//! The ggml FFI layer: the only module of the server that calls into C.
//!
//! Everything above this module works with safe types: [`Device`], [`Backend`], [`Buffer`],
//! [`TensorSpec`] and [`Graph`]. Every `unsafe` block states why it is sound in a `// SAFETY:` line.
//! Inputs reaching this layer are already validated by the session (types, shapes, extents inside
//! their buffer), so nothing here can trip one of ggml's `GGML_ASSERT`s from the network.

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
    pub const GET_ROWS: u32 = sys::GGML_OP_GET_ROWS as u32;
    pub const GET_ROWS_BACK: u32 = sys::GGML_OP_GET_ROWS_BACK as u32;
    pub const SET_ROWS: u32 = sys::GGML_OP_SET_ROWS as u32;
    pub const VIEW: u32 = sys::GGML_OP_VIEW as u32;
    pub const RESHAPE: u32 = sys::GGML_OP_RESHAPE as u32;
    pub const PERMUTE: u32 = sys::GGML_OP_PERMUTE as u32;
    pub const TRANSPOSE: u32 = sys::GGML_OP_TRANSPOSE as u32;
    pub const MAP_CUSTOM1: u32 = sys::GGML_OP_MAP_CUSTOM1 as u32;
    pub const MAP_CUSTOM2: u32 = sys::GGML_OP_MAP_CUSTOM2 as u32;
    pub const MAP_CUSTOM3: u32 = sys::GGML_OP_MAP_CUSTOM3 as u32;
    pub const CUSTOM: u32 = sys::GGML_OP_CUSTOM as u32;
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
        Some(unsafe { std::ffi::CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

/// Size in bytes of the bookkeeping ggml needs per tensor inside a context.
pub(crate) fn tensor_overhead() -> usize {
    // SAFETY: pure function without arguments.
    unsafe { sys::ggml_tensor_overhead() }
}
