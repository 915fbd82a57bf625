/*
 * rdma-verbs shim: the only C interface the Rust side sees.
 *
 * Everything here is plain C with fixed-width scalars and structs defined by
 * this file (never by <infiniband/verbs.h>), so the Rust FFI needs no bindgen
 * and is independent of rdma-core's / Apple's struct layouts.  Objects are
 * opaque pointers.  Return convention for `int` functions: 0 = success,
 * > 0 = errno value, < 0 = one of the RV_ERR_* codes below.
 *
 * The shim never links against libibverbs: rv_load() dlopen()s the library
 * and resolves the exported entry points with dlsym(); the verbs that are
 * static inline in the header (post_send, post_recv, poll_cq, req_notify_cq)
 * dispatch through ctx->ops and therefore need no symbol at all.
 */
#ifndef RDMA_VERBS_SHIM_H
#define RDMA_VERBS_SHIM_H

#include <stddef.h>
#include <stdint.h>

#define RV_SHIM_ABI 2

#define RV_ERR_NOLIB       (-1000) /* library not loaded / not loadable */
#define RV_ERR_NOSYM       (-1001) /* optional entry point absent in this library */
#define RV_ERR_UNSUPPORTED (-1002) /* crate built without verbs headers */
#define RV_ERR_NULL        (-1003) /* verbs call returned NULL without errno */

/* Access flags (translated to IBV_ACCESS_* inside the shim). */
#define RV_ACCESS_LOCAL_WRITE   (1u << 0)
#define RV_ACCESS_REMOTE_WRITE  (1u << 1)
#define RV_ACCESS_REMOTE_READ   (1u << 2)
#define RV_ACCESS_REMOTE_ATOMIC (1u << 3)

/* QP types / states (translated). */
#define RV_QPT_RC 2
#define RV_QPT_UC 3
#define RV_QPT_UD 4

#define RV_QPS_RESET 0
#define RV_QPS_INIT  1
#define RV_QPS_RTR   2
#define RV_QPS_RTS   3
#define RV_QPS_SQD   4
#define RV_QPS_SQE   5
#define RV_QPS_ERR   6
#define RV_QPS_UNKNOWN 7

/* modify_qp attribute mask (translated to IBV_QP_*). */
#define RV_QP_STATE              (1u << 0)
#define RV_QP_ACCESS_FLAGS       (1u << 1)
#define RV_QP_PKEY_INDEX         (1u << 2)
#define RV_QP_PORT               (1u << 3)
#define RV_QP_AV                 (1u << 4)
#define RV_QP_PATH_MTU           (1u << 5)
#define RV_QP_TIMEOUT            (1u << 6)
#define RV_QP_RETRY_CNT          (1u << 7)
#define RV_QP_RNR_RETRY          (1u << 8)
#define RV_QP_RQ_PSN             (1u << 9)
#define RV_QP_MAX_QP_RD_ATOMIC   (1u << 10)
#define RV_QP_MIN_RNR_TIMER      (1u << 11)
#define RV_QP_SQ_PSN             (1u << 12)
#define RV_QP_MAX_DEST_RD_ATOMIC (1u << 13)
#define RV_QP_DEST_QPN           (1u << 14)

/* send flags (translated to IBV_SEND_*). */
#define RV_SEND_SIGNALED  (1u << 0)
#define RV_SEND_INLINE    (1u << 1)
#define RV_SEND_SOLICITED (1u << 2)

/* GID types. */
#define RV_GID_TYPE_IB      0
#define RV_GID_TYPE_ROCE_V1 1
#define RV_GID_TYPE_ROCE_V2 2
#define RV_GID_TYPE_UNKNOWN 255

struct rv_device_attr {
    char     fw_ver[64];
    uint64_t node_guid;          /* as stored by the library (network order) */
    uint64_t max_mr_size;
    uint32_t vendor_id;
    uint32_t vendor_part_id;
    uint32_t hw_ver;
    int32_t  max_qp;
    int32_t  max_qp_wr;
    int32_t  max_sge;
    int32_t  max_cq;
    int32_t  max_cqe;
    int32_t  max_mr;
    int32_t  max_pd;
    int32_t  max_qp_rd_atom;
    uint8_t  phys_port_cnt;
    uint8_t  pad[3];
};

struct rv_port_attr {
    uint32_t state;              /* enum ibv_port_state value */
    uint32_t max_mtu;            /* enum ibv_mtu value (1..5) */
    uint32_t active_mtu;         /* enum ibv_mtu value (1..5) */
    int32_t  gid_tbl_len;
    uint32_t port_cap_flags;
    uint16_t lid;
    uint16_t sm_lid;
    uint8_t  link_layer;         /* IBV_LINK_LAYER_* (Apple: 100 = Thunderbolt) */
    uint8_t  active_width;
    uint8_t  active_speed;
    uint8_t  phys_state;
    uint32_t pad;
};

struct rv_gid_entry {
    uint8_t  gid[16];
    uint32_t gid_index;
    uint32_t port_num;
    uint32_t gid_type;           /* RV_GID_TYPE_* */
};

struct rv_wc {
    uint64_t wr_id;
    uint32_t status;             /* enum ibv_wc_status value */
    uint32_t opcode;             /* enum ibv_wc_opcode value */
    uint32_t vendor_err;
    uint32_t byte_len;
    uint32_t qp_num;
    uint32_t src_qp;
    uint32_t wc_flags;
    uint32_t imm_data;
};

struct rv_qp_init {
    uint32_t qp_type;            /* RV_QPT_* */
    uint32_t max_send_wr;
    uint32_t max_recv_wr;
    uint32_t max_send_sge;
    uint32_t max_recv_sge;
    uint32_t max_inline_data;
    uint32_t sq_sig_all;
};

struct rv_qp_cap {
    uint32_t max_send_wr;
    uint32_t max_recv_wr;
    uint32_t max_send_sge;
    uint32_t max_recv_sge;
    uint32_t max_inline_data;
};

struct rv_qp_attr {
    uint32_t qp_state;           /* RV_QPS_* */
    uint32_t path_mtu;           /* enum ibv_mtu value (1..5) */
    uint32_t dest_qp_num;
    uint32_t rq_psn;
    uint32_t sq_psn;
    uint32_t qp_access_flags;    /* RV_ACCESS_* */
    uint32_t grh_flow_label;
    uint16_t pkey_index;
    uint16_t ah_dlid;
    uint8_t  port_num;
    uint8_t  max_rd_atomic;
    uint8_t  max_dest_rd_atomic;
    uint8_t  min_rnr_timer;
    uint8_t  timeout;
    uint8_t  retry_cnt;
    uint8_t  rnr_retry;
    uint8_t  ah_is_global;
    uint8_t  ah_sl;
    uint8_t  ah_src_path_bits;
    uint8_t  ah_port_num;
    uint8_t  grh_hop_limit;
    uint8_t  grh_sgid_index;
    uint8_t  grh_traffic_class;
    uint8_t  pad[2];
    uint8_t  grh_dgid[16];
};

/* library */
int  rv_shim_abi(void);
int  rv_built_with_verbs(void);
int  rv_load(const char *path, int apple_only, char *err, size_t errlen);
int  rv_symbols_loaded(void);
int  rv_is_loaded(void);
int  rv_has_gid_ex(void);
long rv_page_size(void);

/* devices */
int  rv_device_list(void **list, int *num);
const char *rv_device_name(void *list, int i);
int  rv_open_device(void *list, int i, void **ctx);
void rv_free_device_list(void *list);
int  rv_close_device(void *ctx);
int  rv_query_device(void *ctx, struct rv_device_attr *out);
int  rv_query_port(void *ctx, uint8_t port, struct rv_port_attr *out);
int  rv_query_gid(void *ctx, uint8_t port, int index, uint8_t gid[16]);
int  rv_query_gid_ex(void *ctx, uint8_t port, int index, struct rv_gid_entry *out);
int  rv_query_gid_table(void *ctx, struct rv_gid_entry *out, size_t max, size_t *count);

/* pd / channel / cq */
int  rv_alloc_pd(void *ctx, void **pd);
int  rv_dealloc_pd(void *pd);
int  rv_create_comp_channel(void *ctx, void **ch, int *fd);
int  rv_destroy_comp_channel(void *ch);
int  rv_get_cq_event(void *ch, void **cq, void **cq_context);
void rv_ack_cq_events(void *cq, unsigned int n);
int  rv_poll_fd(int fd, int timeout_ms, int *ready);
int  rv_create_cq(void *ctx, int cqe, void *cq_context, void *ch, int comp_vector,
                  void **cq, int *actual_cqe);
int  rv_destroy_cq(void *cq);
int  rv_poll_cq(void *cq, struct rv_wc *out, int max, int *n);
int  rv_req_notify_cq(void *cq, int solicited_only);

/* mr */
int  rv_reg_mr(void *pd, void *addr, size_t len, uint32_t access,
               void **mr, uint32_t *lkey, uint32_t *rkey);
int  rv_dereg_mr(void *mr);

/* qp */
int  rv_create_qp(void *pd, void *send_cq, void *recv_cq, const struct rv_qp_init *init,
                  void **qp, uint32_t *qp_num, struct rv_qp_cap *granted);
int  rv_destroy_qp(void *qp);
int  rv_modify_qp(void *qp, const struct rv_qp_attr *attr, uint32_t mask);
int  rv_query_qp(void *qp, uint32_t *state, struct rv_qp_cap *cap);
int  rv_post_send(void *qp, uint64_t wr_id, uint64_t addr, uint32_t len, uint32_t lkey,
                  uint32_t flags);
int  rv_post_recv(void *qp, uint64_t wr_id, uint64_t addr, uint32_t len, uint32_t lkey);
const char *rv_wc_status_str(uint32_t status);

#endif
