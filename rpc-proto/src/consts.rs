//! Protocol constants (spec §2, §3, §6).

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
/// The same in 8.0.0, which adds `u64 uid` after the device.
pub const GRAPH_HEADER_SIZE_V8: usize = GRAPH_HEADER_SIZE + 8;
/// The fixed part of SET_TENSOR_2D (and all of GET_TENSOR_2D): `rpc_tensor` + `u64 offset` +
/// `u64 size` + `u64 n_copies` + `u64 stride`.
pub const SET_TENSOR_2D_HEADER_SIZE: usize = RPC_TENSOR_SIZE + 4 * 8;
/// The largest data head ([`Command::data_head`](crate::Command::data_head)): what a server
/// sets aside to read one before the data it announces.
pub const DATA_HEAD_MAX: usize = if SET_TENSOR_2D_HEADER_SIZE > SET_TENSOR_HEADER_SIZE {
    SET_TENSOR_2D_HEADER_SIZE
} else {
    SET_TENSOR_HEADER_SIZE
};
/// Length of COMM_INIT's NUL-padded host field.
pub const COMM_HOST_SIZE: usize = 64;
/// COMM_INIT: `u32 device`, `u32 rank`, `u32 world`, `u32 port`, `char host[64]`.
pub const COMM_INIT_SIZE: usize = 4 * 4 + COMM_HOST_SIZE;
/// Graphs a stock 8.0 server keeps per device and connection; GRAPH_COMPUTE of a new uid when
/// this many are stored clears them all first (the client mirrors the rule).
pub const GRAPH_CACHE_MAX: usize = 1024;
/// Stock 8.0 allreduce: F32 tensors of at least this many elements cross the server-to-server
/// link as bf16.
pub const COMM_BF16_MIN_ELEMENTS: u64 = 32768;
/// The comm port is the client's rank-0 endpoint port plus this.
pub const COMM_PORT_OFFSET: u16 = 1000;
/// Our extension commands' version, answered to LINK_PROBE (`Command::EXTENSIONS`).
pub const LINK_VERSION: u32 = 1;
/// Worker-to-worker link slots a connection may hold (LINK_OPEN's `slot` is below this), besides
/// one COMM_INIT link per device.
pub const LINK_SLOTS: u32 = 8;
/// The header of every LINK_SEND's message on a link: `u32` [`LINK_MAGIC`], `u32` status (1 =
/// the bytes follow, 0 = the sender failed and none follow), `u64` byte count.
pub const LINK_HEADER_SIZE: usize = 16;
/// First word of a LINK_SEND's message ("LNK1" little-endian).
pub const LINK_MAGIC: u32 = u32::from_le_bytes(*b"LNK1");
