//! Protocol constants (spec §2, §3, §6).

/// Protocol major version announced in the HELLO reply.
pub const PROTO_MAJOR: u8 = 7;
/// Protocol minor version announced in the HELLO reply.
pub const PROTO_MINOR: u8 = 0;
/// Protocol patch version announced in the HELLO reply.
pub const PROTO_PATCH: u8 = 0;

/// Number of `ggml_op` values; a valid `op` is `< GGML_OP_COUNT`.
pub const GGML_OP_COUNT: u32 = crate::ggml_op::COUNT;
/// Number of `ggml_type` values; a valid `type` is `< GGML_TYPE_COUNT`.
pub const GGML_TYPE_COUNT: u32 = crate::ggml_type::COUNT;
/// Length of `ne[]` and `nb[]` in a tensor.
pub const GGML_MAX_DIMS: usize = 4;
/// Length of `src[]` in a tensor (also the number of `srcs` in GET_ALLOC_SIZE).
pub const GGML_MAX_SRC: usize = 10;
/// Size of `op_params` in bytes (16 × `i32`).
pub const GGML_MAX_OP_PARAMS: usize = 64;
/// Size of the NUL-padded `name` field in bytes.
pub const GGML_MAX_NAME: usize = 64;

/// Size of the transport-capability blob carried by HELLO (`RPC_CONN_CAPS_SIZE`).
pub const CONN_CAPS_SIZE: usize = 24;
/// Size of a serialized `rpc_tensor`.
pub const RPC_TENSOR_SIZE: usize = 296;
/// Size of the fixed part of a SET_TENSOR payload: `rpc_tensor` + `u8 cache_flag` + `u64 offset`.
pub const SET_TENSOR_HEADER_SIZE: usize = RPC_TENSOR_SIZE + 1 + 8;
/// Size of a request frame header: `u8 cmd` + `u64` LE payload size.
pub const FRAME_HEADER_SIZE: usize = 9;
/// Size of a response's `u64` LE payload-size prefix.
pub const RESPONSE_HEADER_SIZE: usize = 8;
/// Size of the fixed part of a GRAPH_COMPUTE payload: `u32 device` + `u32 n_nodes` + `u32 n_tensors`.
pub const GRAPH_HEADER_SIZE: usize = 12;
