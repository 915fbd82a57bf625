//! Raw FFI to the C shim (`csrc/shim.h`).  Hand-written, no bindgen: every
//! struct here is defined by the shim itself, never by `<infiniband/verbs.h>`,
//! so nothing depends on rdma-core's or Apple's struct layouts.  The sizes are
//! asserted on both sides (`_Static_assert` in shim.c, `const` asserts below).
//!
//! Conventions: `c_int` results are 0 (ok), > 0 (errno) or one of `RV_ERR_*`.
#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_long, c_uint, c_void};

pub const RV_SHIM_ABI: c_int = 2;

pub const RV_ERR_NOLIB: c_int = -1000;
pub const RV_ERR_NOSYM: c_int = -1001;
pub const RV_ERR_UNSUPPORTED: c_int = -1002;
pub const RV_ERR_NULL: c_int = -1003;

pub const RV_ACCESS_LOCAL_WRITE: u32 = 1 << 0;
pub const RV_ACCESS_REMOTE_WRITE: u32 = 1 << 1;
pub const RV_ACCESS_REMOTE_READ: u32 = 1 << 2;
pub const RV_ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;

pub const RV_QPT_RC: u32 = 2;
pub const RV_QPT_UC: u32 = 3;
pub const RV_QPT_UD: u32 = 4;

pub const RV_QPS_RESET: u32 = 0;
pub const RV_QPS_INIT: u32 = 1;
pub const RV_QPS_RTR: u32 = 2;
pub const RV_QPS_RTS: u32 = 3;
pub const RV_QPS_SQD: u32 = 4;
pub const RV_QPS_SQE: u32 = 5;
pub const RV_QPS_ERR: u32 = 6;
pub const RV_QPS_UNKNOWN: u32 = 7;

pub const RV_QP_STATE: u32 = 1 << 0;
pub const RV_QP_ACCESS_FLAGS: u32 = 1 << 1;
pub const RV_QP_PKEY_INDEX: u32 = 1 << 2;
pub const RV_QP_PORT: u32 = 1 << 3;
pub const RV_QP_AV: u32 = 1 << 4;
pub const RV_QP_PATH_MTU: u32 = 1 << 5;
pub const RV_QP_TIMEOUT: u32 = 1 << 6;
pub const RV_QP_RETRY_CNT: u32 = 1 << 7;
pub const RV_QP_RNR_RETRY: u32 = 1 << 8;
pub const RV_QP_RQ_PSN: u32 = 1 << 9;
pub const RV_QP_MAX_QP_RD_ATOMIC: u32 = 1 << 10;
pub const RV_QP_MIN_RNR_TIMER: u32 = 1 << 11;
pub const RV_QP_SQ_PSN: u32 = 1 << 12;
pub const RV_QP_MAX_DEST_RD_ATOMIC: u32 = 1 << 13;
pub const RV_QP_DEST_QPN: u32 = 1 << 14;

pub const RV_SEND_SIGNALED: u32 = 1 << 0;
pub const RV_SEND_INLINE: u32 = 1 << 1;
pub const RV_SEND_SOLICITED: u32 = 1 << 2;

pub const RV_GID_TYPE_IB: u32 = 0;
pub const RV_GID_TYPE_ROCE_V1: u32 = 1;
pub const RV_GID_TYPE_ROCE_V2: u32 = 2;
pub const RV_GID_TYPE_UNKNOWN: u32 = 255;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct rv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub max_mr_size: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: i32,
    pub max_qp_wr: i32,
    pub max_sge: i32,
    pub max_cq: i32,
    pub max_cqe: i32,
    pub max_mr: i32,
    pub max_pd: i32,
    pub max_qp_rd_atom: i32,
    pub phys_port_cnt: u8,
    pub pad: [u8; 3],
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rv_port_attr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: i32,
    pub port_cap_flags: u32,
    pub lid: u16,
    pub sm_lid: u16,
    pub link_layer: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rv_gid_entry {
    pub gid: [u8; 16],
    pub gid_index: u32,
    pub port_num: u32,
    pub gid_type: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct rv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub imm_data: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rv_qp_init {
    pub qp_type: u32,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
    pub sq_sig_all: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct rv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct rv_qp_attr {
    pub qp_state: u32,
    pub path_mtu: u32,
    pub dest_qp_num: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub qp_access_flags: u32,
    pub grh_flow_label: u32,
    pub pkey_index: u16,
    pub ah_dlid: u16,
    pub port_num: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub ah_is_global: u8,
    pub ah_sl: u8,
    pub ah_src_path_bits: u8,
    pub ah_port_num: u8,
    pub grh_hop_limit: u8,
    pub grh_sgid_index: u8,
    pub grh_traffic_class: u8,
    pub pad: [u8; 2],
    pub grh_dgid: [u8; 16],
}

const _: () = assert!(std::mem::size_of::<rv_device_attr>() == 128);
const _: () = assert!(std::mem::size_of::<rv_port_attr>() == 32);
const _: () = assert!(std::mem::size_of::<rv_gid_entry>() == 28);
const _: () = assert!(std::mem::size_of::<rv_wc>() == 40);
const _: () = assert!(std::mem::size_of::<rv_qp_init>() == 28);
const _: () = assert!(std::mem::size_of::<rv_qp_cap>() == 20);
const _: () = assert!(std::mem::size_of::<rv_qp_attr>() == 64);

extern "C" {
    pub fn rv_shim_abi() -> c_int;
    pub fn rv_built_with_verbs() -> c_int;
    pub fn rv_load(
        path: *const c_char,
        apple_only: c_int,
        err: *mut c_char,
        errlen: usize,
    ) -> c_int;
    pub fn rv_symbols_loaded() -> c_int;
    pub fn rv_is_loaded() -> c_int;
    pub fn rv_has_gid_ex() -> c_int;
    pub fn rv_page_size() -> c_long;

    pub fn rv_device_list(list: *mut *mut c_void, num: *mut c_int) -> c_int;
    pub fn rv_device_name(list: *mut c_void, i: c_int) -> *const c_char;
    pub fn rv_open_device(list: *mut c_void, i: c_int, ctx: *mut *mut c_void) -> c_int;
    pub fn rv_free_device_list(list: *mut c_void);
    pub fn rv_close_device(ctx: *mut c_void) -> c_int;
    pub fn rv_query_device(ctx: *mut c_void, out: *mut rv_device_attr) -> c_int;
    pub fn rv_query_port(ctx: *mut c_void, port: u8, out: *mut rv_port_attr) -> c_int;
    pub fn rv_query_gid(ctx: *mut c_void, port: u8, index: c_int, gid: *mut u8) -> c_int;
    pub fn rv_query_gid_ex(
        ctx: *mut c_void,
        port: u8,
        index: c_int,
        out: *mut rv_gid_entry,
    ) -> c_int;
    pub fn rv_query_gid_table(
        ctx: *mut c_void,
        out: *mut rv_gid_entry,
        max: usize,
        count: *mut usize,
    ) -> c_int;

    pub fn rv_alloc_pd(ctx: *mut c_void, pd: *mut *mut c_void) -> c_int;
    pub fn rv_dealloc_pd(pd: *mut c_void) -> c_int;
    pub fn rv_create_comp_channel(ctx: *mut c_void, ch: *mut *mut c_void, fd: *mut c_int) -> c_int;
    pub fn rv_destroy_comp_channel(ch: *mut c_void) -> c_int;
    pub fn rv_get_cq_event(
        ch: *mut c_void,
        cq: *mut *mut c_void,
        cq_context: *mut *mut c_void,
    ) -> c_int;
    pub fn rv_ack_cq_events(cq: *mut c_void, n: c_uint);
    pub fn rv_poll_fd(fd: c_int, timeout_ms: c_int, ready: *mut c_int) -> c_int;
    pub fn rv_create_cq(
        ctx: *mut c_void,
        cqe: c_int,
        cq_context: *mut c_void,
        ch: *mut c_void,
        comp_vector: c_int,
        cq: *mut *mut c_void,
        actual_cqe: *mut c_int,
    ) -> c_int;
    pub fn rv_destroy_cq(cq: *mut c_void) -> c_int;
    pub fn rv_poll_cq(cq: *mut c_void, out: *mut rv_wc, max: c_int, n: *mut c_int) -> c_int;
    pub fn rv_req_notify_cq(cq: *mut c_void, solicited_only: c_int) -> c_int;

    pub fn rv_reg_mr(
        pd: *mut c_void,
        addr: *mut c_void,
        len: usize,
        access: u32,
        mr: *mut *mut c_void,
        lkey: *mut u32,
        rkey: *mut u32,
    ) -> c_int;
    pub fn rv_dereg_mr(mr: *mut c_void) -> c_int;

    pub fn rv_create_qp(
        pd: *mut c_void,
        send_cq: *mut c_void,
        recv_cq: *mut c_void,
        init: *const rv_qp_init,
        qp: *mut *mut c_void,
        qp_num: *mut u32,
        granted: *mut rv_qp_cap,
    ) -> c_int;
    pub fn rv_destroy_qp(qp: *mut c_void) -> c_int;
    pub fn rv_modify_qp(qp: *mut c_void, attr: *const rv_qp_attr, mask: u32) -> c_int;
    pub fn rv_query_qp(qp: *mut c_void, state: *mut u32, cap: *mut rv_qp_cap) -> c_int;
    pub fn rv_post_send(
        qp: *mut c_void,
        wr_id: u64,
        addr: u64,
        len: u32,
        lkey: u32,
        flags: u32,
    ) -> c_int;
    pub fn rv_post_recv(qp: *mut c_void, wr_id: u64, addr: u64, len: u32, lkey: u32) -> c_int;
    pub fn rv_wc_status_str(status: u32) -> *const c_char;
}
