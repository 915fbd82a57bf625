//! ggml's type and op ids (`enum ggml_type`, `enum ggml_op`), as protocol 7.0.0 fixes them: the one
//! definition the server, its validator, the client and the tests use.
//!
//! They are wire values: a tensor's `type` and `op` fields carry them. The server checks every one
//! against the ggml it links, at compile time (`rpc-ggml/src/ids.rs`), so a ggml whose enums
//! moved does not build.

/// `enum ggml_type` (`ggml.h`). Holes are types ggml removed; they are not valid.
pub mod ggml_type {
    /// `GGML_TYPE_F32`: 32-bit float.
    pub const F32: u32 = 0;
    /// `GGML_TYPE_F16`: IEEE half float.
    pub const F16: u32 = 1;
    /// `GGML_TYPE_Q4_0`: block-quantized, 32 elements in 18 bytes.
    pub const Q4_0: u32 = 2;
    /// `GGML_TYPE_Q4_1`: block-quantized, 32 elements in 20 bytes.
    pub const Q4_1: u32 = 3;
    /// Removed `GGML_TYPE_Q4_2` (a hole in the enum): a server must reject it.
    pub const REMOVED_Q4_2: u32 = 4;
    /// `GGML_TYPE_Q5_0`.
    pub const Q5_0: u32 = 6;
    /// `GGML_TYPE_Q5_1`.
    pub const Q5_1: u32 = 7;
    /// `GGML_TYPE_Q8_0`: block-quantized, 32 elements in 34 bytes.
    pub const Q8_0: u32 = 8;
    /// `GGML_TYPE_Q8_1`.
    pub const Q8_1: u32 = 9;
    /// `GGML_TYPE_Q2_K`.
    pub const Q2_K: u32 = 10;
    /// `GGML_TYPE_Q3_K`.
    pub const Q3_K: u32 = 11;
    /// `GGML_TYPE_Q4_K`.
    pub const Q4_K: u32 = 12;
    /// `GGML_TYPE_Q5_K`.
    pub const Q5_K: u32 = 13;
    /// `GGML_TYPE_Q6_K`.
    pub const Q6_K: u32 = 14;
    /// `GGML_TYPE_Q8_K`.
    pub const Q8_K: u32 = 15;
    /// `GGML_TYPE_IQ2_XXS`.
    pub const IQ2_XXS: u32 = 16;
    /// `GGML_TYPE_IQ2_XS`.
    pub const IQ2_XS: u32 = 17;
    /// `GGML_TYPE_IQ3_XXS`.
    pub const IQ3_XXS: u32 = 18;
    /// `GGML_TYPE_IQ1_S`.
    pub const IQ1_S: u32 = 19;
    /// `GGML_TYPE_IQ4_NL`.
    pub const IQ4_NL: u32 = 20;
    /// `GGML_TYPE_IQ3_S`.
    pub const IQ3_S: u32 = 21;
    /// `GGML_TYPE_IQ2_S`.
    pub const IQ2_S: u32 = 22;
    /// `GGML_TYPE_IQ4_XS`.
    pub const IQ4_XS: u32 = 23;
    /// `GGML_TYPE_I8`: 8-bit integer.
    pub const I8: u32 = 24;
    /// `GGML_TYPE_I16`: 16-bit integer.
    pub const I16: u32 = 25;
    /// `GGML_TYPE_I32`: 32-bit integer (row ids, positions, expert ids).
    pub const I32: u32 = 26;
    /// `GGML_TYPE_I64`: 64-bit integer (SET_ROWS row ids).
    pub const I64: u32 = 27;
    /// `GGML_TYPE_F64`: 64-bit float.
    pub const F64: u32 = 28;
    /// `GGML_TYPE_IQ1_M`.
    pub const IQ1_M: u32 = 29;
    /// `GGML_TYPE_BF16`: bfloat16.
    pub const BF16: u32 = 30;
    /// `GGML_TYPE_TQ1_0`.
    pub const TQ1_0: u32 = 34;
    /// `GGML_TYPE_TQ2_0`.
    pub const TQ2_0: u32 = 35;
    /// `GGML_TYPE_MXFP4`.
    pub const MXFP4: u32 = 39;
    /// `GGML_TYPE_NVFP4`.
    pub const NVFP4: u32 = 40;
    /// `GGML_TYPE_Q1_0`.
    pub const Q1_0: u32 = 41;
    /// `GGML_TYPE_Q2_0`.
    pub const Q2_0: u32 = 42;
    /// `GGML_TYPE_COUNT`: the number of `ggml_type` values; a valid type is below it (4, 5 and 31 to 33, 36 to 38 are holes).
    pub const COUNT: u32 = 43;
}

/// `enum ggml_op` (`ggml.h`): consecutive from `NONE = 0` to `COUNT`.
pub mod ggml_op {
    /// `GGML_OP_NONE`: a leaf (weights, inputs), or a view described by `view_src`.
    pub const NONE: u32 = 0;
    /// `GGML_OP_DUP`.
    pub const DUP: u32 = 1;
    /// `GGML_OP_ADD`: `dst = src0 + src1` (src1 broadcast over src0).
    pub const ADD: u32 = 2;
    /// `GGML_OP_ADD_ID`.
    pub const ADD_ID: u32 = 3;
    /// `GGML_OP_ADD1`.
    pub const ADD1: u32 = 4;
    /// `GGML_OP_ACC`.
    pub const ACC: u32 = 5;
    /// `GGML_OP_SUB`.
    pub const SUB: u32 = 6;
    /// `GGML_OP_MUL`: element-wise product.
    pub const MUL: u32 = 7;
    /// `GGML_OP_DIV`.
    pub const DIV: u32 = 8;
    /// `GGML_OP_SQR`.
    pub const SQR: u32 = 9;
    /// `GGML_OP_SQRT`.
    pub const SQRT: u32 = 10;
    /// `GGML_OP_LOG`.
    pub const LOG: u32 = 11;
    /// `GGML_OP_SIN`.
    pub const SIN: u32 = 12;
    /// `GGML_OP_COS`.
    pub const COS: u32 = 13;
    /// `GGML_OP_SUM`.
    pub const SUM: u32 = 14;
    /// `GGML_OP_SUM_ROWS`.
    pub const SUM_ROWS: u32 = 15;
    /// `GGML_OP_CUMSUM`.
    pub const CUMSUM: u32 = 16;
    /// `GGML_OP_MEAN`.
    pub const MEAN: u32 = 17;
    /// `GGML_OP_ARGMAX`.
    pub const ARGMAX: u32 = 18;
    /// `GGML_OP_COUNT_EQUAL`.
    pub const COUNT_EQUAL: u32 = 19;
    /// `GGML_OP_REPEAT`.
    pub const REPEAT: u32 = 20;
    /// `GGML_OP_REPEAT_BACK`.
    pub const REPEAT_BACK: u32 = 21;
    /// `GGML_OP_CONCAT`.
    pub const CONCAT: u32 = 22;
    /// `GGML_OP_SILU_BACK`.
    pub const SILU_BACK: u32 = 23;
    /// `GGML_OP_NORM`.
    pub const NORM: u32 = 24;
    /// `GGML_OP_RMS_NORM`.
    pub const RMS_NORM: u32 = 25;
    /// `GGML_OP_RMS_NORM_BACK`.
    pub const RMS_NORM_BACK: u32 = 26;
    /// `GGML_OP_GROUP_NORM`.
    pub const GROUP_NORM: u32 = 27;
    /// `GGML_OP_L2_NORM`.
    pub const L2_NORM: u32 = 28;
    /// `GGML_OP_MUL_MAT`: `dst[n][m] = Σ_k src0[m][k] · src1[n][k]`;
    /// `src0.ne = [K, M]`, `src1.ne = [K, N]`, `dst.ne = [M, N]`.
    pub const MUL_MAT: u32 = 29;
    /// `GGML_OP_MUL_MAT_ID`.
    pub const MUL_MAT_ID: u32 = 30;
    /// `GGML_OP_OUT_PROD`.
    pub const OUT_PROD: u32 = 31;
    /// `GGML_OP_SCALE`.
    pub const SCALE: u32 = 32;
    /// `GGML_OP_SET`.
    pub const SET: u32 = 33;
    /// `GGML_OP_CPY`.
    pub const CPY: u32 = 34;
    /// `GGML_OP_CONT`.
    pub const CONT: u32 = 35;
    /// `GGML_OP_RESHAPE`.
    pub const RESHAPE: u32 = 36;
    /// `GGML_OP_VIEW`.
    pub const VIEW: u32 = 37;
    /// `GGML_OP_PERMUTE`.
    pub const PERMUTE: u32 = 38;
    /// `GGML_OP_TRANSPOSE`.
    pub const TRANSPOSE: u32 = 39;
    /// `GGML_OP_GET_ROWS`.
    pub const GET_ROWS: u32 = 40;
    /// `GGML_OP_GET_ROWS_BACK`.
    pub const GET_ROWS_BACK: u32 = 41;
    /// `GGML_OP_SET_ROWS`.
    pub const SET_ROWS: u32 = 42;
    /// `GGML_OP_DIAG`.
    pub const DIAG: u32 = 43;
    /// `GGML_OP_DIAG_MASK_INF`.
    pub const DIAG_MASK_INF: u32 = 44;
    /// `GGML_OP_DIAG_MASK_ZERO`.
    pub const DIAG_MASK_ZERO: u32 = 45;
    /// `GGML_OP_SOFT_MAX`.
    pub const SOFT_MAX: u32 = 46;
    /// `GGML_OP_SOFT_MAX_BACK`.
    pub const SOFT_MAX_BACK: u32 = 47;
    /// `GGML_OP_ROPE`.
    pub const ROPE: u32 = 48;
    /// `GGML_OP_ROPE_BACK`.
    pub const ROPE_BACK: u32 = 49;
    /// `GGML_OP_CLAMP`.
    pub const CLAMP: u32 = 50;
    /// `GGML_OP_CONV_TRANSPOSE_1D`.
    pub const CONV_TRANSPOSE_1D: u32 = 51;
    /// `GGML_OP_IM2COL`.
    pub const IM2COL: u32 = 52;
    /// `GGML_OP_IM2COL_BACK`.
    pub const IM2COL_BACK: u32 = 53;
    /// `GGML_OP_IM2COL_3D`.
    pub const IM2COL_3D: u32 = 54;
    /// `GGML_OP_COL2IM_1D`.
    pub const COL2IM_1D: u32 = 55;
    /// `GGML_OP_CONV_2D`.
    pub const CONV_2D: u32 = 56;
    /// `GGML_OP_CONV_3D`.
    pub const CONV_3D: u32 = 57;
    /// `GGML_OP_CONV_2D_DW`.
    pub const CONV_2D_DW: u32 = 58;
    /// `GGML_OP_CONV_TRANSPOSE_2D`.
    pub const CONV_TRANSPOSE_2D: u32 = 59;
    /// `GGML_OP_POOL_1D`.
    pub const POOL_1D: u32 = 60;
    /// `GGML_OP_POOL_2D`.
    pub const POOL_2D: u32 = 61;
    /// `GGML_OP_POOL_2D_BACK`.
    pub const POOL_2D_BACK: u32 = 62;
    /// `GGML_OP_UPSCALE`.
    pub const UPSCALE: u32 = 63;
    /// `GGML_OP_PAD`.
    pub const PAD: u32 = 64;
    /// `GGML_OP_PAD_REFLECT_1D`.
    pub const PAD_REFLECT_1D: u32 = 65;
    /// `GGML_OP_ROLL`.
    pub const ROLL: u32 = 66;
    /// `GGML_OP_ARANGE`.
    pub const ARANGE: u32 = 67;
    /// `GGML_OP_TIMESTEP_EMBEDDING`.
    pub const TIMESTEP_EMBEDDING: u32 = 68;
    /// `GGML_OP_ARGSORT`.
    pub const ARGSORT: u32 = 69;
    /// `GGML_OP_TOP_K`.
    pub const TOP_K: u32 = 70;
    /// `GGML_OP_LEAKY_RELU`.
    pub const LEAKY_RELU: u32 = 71;
    /// `GGML_OP_TRI`.
    pub const TRI: u32 = 72;
    /// `GGML_OP_FILL`.
    pub const FILL: u32 = 73;
    /// `GGML_OP_FLASH_ATTN_EXT`.
    pub const FLASH_ATTN_EXT: u32 = 74;
    /// `GGML_OP_FLASH_ATTN_BACK`.
    pub const FLASH_ATTN_BACK: u32 = 75;
    /// `GGML_OP_SSM_CONV`.
    pub const SSM_CONV: u32 = 76;
    /// `GGML_OP_SSM_SCAN`.
    pub const SSM_SCAN: u32 = 77;
    /// `GGML_OP_WIN_PART`.
    pub const WIN_PART: u32 = 78;
    /// `GGML_OP_WIN_UNPART`.
    pub const WIN_UNPART: u32 = 79;
    /// `GGML_OP_GET_REL_POS`.
    pub const GET_REL_POS: u32 = 80;
    /// `GGML_OP_ADD_REL_POS`.
    pub const ADD_REL_POS: u32 = 81;
    /// `GGML_OP_RWKV_WKV6`.
    pub const RWKV_WKV6: u32 = 82;
    /// `GGML_OP_GATED_LINEAR_ATTN`.
    pub const GATED_LINEAR_ATTN: u32 = 83;
    /// `GGML_OP_RWKV_WKV7`.
    pub const RWKV_WKV7: u32 = 84;
    /// `GGML_OP_SOLVE_TRI`.
    pub const SOLVE_TRI: u32 = 85;
    /// `GGML_OP_GATED_DELTA_NET`.
    pub const GATED_DELTA_NET: u32 = 86;
    /// `GGML_OP_LIGHTNING_INDEXER`.
    pub const LIGHTNING_INDEXER: u32 = 87;
    /// `GGML_OP_DSV4_HC_COMB`.
    pub const DSV4_HC_COMB: u32 = 88;
    /// `GGML_OP_DSV4_HC_PRE`.
    pub const DSV4_HC_PRE: u32 = 89;
    /// `GGML_OP_DSV4_HC_POST`.
    pub const DSV4_HC_POST: u32 = 90;
    /// `GGML_OP_UNARY`.
    pub const UNARY: u32 = 91;
    /// `GGML_OP_MAP_CUSTOM1`: carries a function pointer: servers must refuse it.
    pub const MAP_CUSTOM1: u32 = 92;
    /// `GGML_OP_MAP_CUSTOM2`: carries a function pointer: servers must refuse it.
    pub const MAP_CUSTOM2: u32 = 93;
    /// `GGML_OP_MAP_CUSTOM3`: carries a function pointer: servers must refuse it.
    pub const MAP_CUSTOM3: u32 = 94;
    /// `GGML_OP_CUSTOM`: carries a function pointer: servers must refuse it.
    pub const CUSTOM: u32 = 95;
    /// `GGML_OP_CROSS_ENTROPY_LOSS`.
    pub const CROSS_ENTROPY_LOSS: u32 = 96;
    /// `GGML_OP_CROSS_ENTROPY_LOSS_BACK`.
    pub const CROSS_ENTROPY_LOSS_BACK: u32 = 97;
    /// `GGML_OP_OPT_STEP_ADAMW`.
    pub const OPT_STEP_ADAMW: u32 = 98;
    /// `GGML_OP_OPT_STEP_SGD`.
    pub const OPT_STEP_SGD: u32 = 99;
    /// `GGML_OP_GLU`: the last op of 7.0.0.
    pub const GLU: u32 = 100;
    /// `GGML_OP_COUNT`: the first invalid op number.
    pub const COUNT: u32 = 101;
}
