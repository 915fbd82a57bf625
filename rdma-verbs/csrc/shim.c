/*
 * rdma-verbs shim (real implementation, compiled when <infiniband/verbs.h> is
 * present at build time).  See shim.h for the conventions.
 *
 * Nothing here links against libibverbs: the exported entry points are
 * resolved with dlsym() into the function-pointer table `F` by rv_load(); the
 * static-inline verbs from the header (ibv_post_send, ibv_post_recv,
 * ibv_poll_cq, ibv_req_notify_cq, and the inline part of ibv_query_port)
 * dispatch through ctx->ops / verbs_context and need no symbol.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "shim.h"

#if defined(__APPLE__)
#include "platform_apple.h"
#else
#include "platform_linux.h"
#endif

_Static_assert(sizeof(struct rv_port_attr) == 32, "rv_port_attr layout");
_Static_assert(sizeof(struct rv_gid_entry) == 28, "rv_gid_entry layout");
_Static_assert(sizeof(struct rv_wc) == 40, "rv_wc layout");
_Static_assert(sizeof(struct rv_qp_init) == 28, "rv_qp_init layout");
_Static_assert(sizeof(struct rv_qp_cap) == 20, "rv_qp_cap layout");
_Static_assert(sizeof(struct rv_qp_attr) == 64, "rv_qp_attr layout");
_Static_assert(sizeof(struct rv_device_attr) == 128, "rv_device_attr layout");

/* Function pointer types use our own names: several ibv_* identifiers are
 * macros in rdma-core's header (ibv_reg_mr, ibv_query_port,
 * ibv_get_device_list), so they are only ever spelled as dlsym strings. */
static struct {
    struct ibv_device **(*get_device_list)(int *);
    void (*free_device_list)(struct ibv_device **);
    const char *(*get_device_name)(struct ibv_device *);
    struct ibv_context *(*open_device)(struct ibv_device *);
    int (*close_device)(struct ibv_context *);
    int (*query_device)(struct ibv_context *, struct ibv_device_attr *);
    int (*query_port_compat)(struct ibv_context *, uint8_t, void *);
    int (*query_gid)(struct ibv_context *, uint8_t, int, union ibv_gid *);
#if RV_HAVE_GID_ENTRY
    int (*query_gid_ex)(struct ibv_context *, uint32_t, uint32_t, struct ibv_gid_entry *,
                        uint32_t, size_t);                        /* optional */
    ssize_t (*query_gid_table)(struct ibv_context *, struct ibv_gid_entry *, size_t,
                               uint32_t, size_t);                 /* optional */
#endif
    struct ibv_pd *(*alloc_pd)(struct ibv_context *);
    int (*dealloc_pd)(struct ibv_pd *);
    struct ibv_comp_channel *(*create_comp_channel)(struct ibv_context *);
    int (*destroy_comp_channel)(struct ibv_comp_channel *);
    struct ibv_cq *(*create_cq)(struct ibv_context *, int, void *, struct ibv_comp_channel *, int);
    int (*destroy_cq)(struct ibv_cq *);
    int (*get_cq_event)(struct ibv_comp_channel *, struct ibv_cq **, void **);
    void (*ack_cq_events)(struct ibv_cq *, unsigned int);
    struct ibv_mr *(*reg_mr)(struct ibv_pd *, void *, size_t, int);
    int (*dereg_mr)(struct ibv_mr *);
    struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
    int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
    int (*query_qp)(struct ibv_qp *, struct ibv_qp_attr *, int, struct ibv_qp_init_attr *);
    int (*destroy_qp)(struct ibv_qp *);
    const char *(*wc_status_str)(enum ibv_wc_status);              /* optional */
} F;

static void *g_lib;
static int g_loaded;

int rv_shim_abi(void) { return RV_SHIM_ABI; }
int rv_built_with_verbs(void) { return 1; }
int rv_is_loaded(void) { return g_loaded; }
long rv_page_size(void) { return sysconf(_SC_PAGESIZE); }

int rv_has_gid_ex(void)
{
#if RV_HAVE_GID_ENTRY
    return g_loaded && F.query_gid_ex != NULL;
#else
    return 0;
#endif
}

/* Not thread-safe by itself: the Rust side calls it exactly once (OnceLock)
 * before any other rv_* function can be reached. */
/* Entry points resolved in the last rv_load(). */
static int g_symbols;

int rv_symbols_loaded(void) { return g_symbols; }

/* apple_only: resolve only the 17 entry points upstream's Apple transport
 * (ggml-rpc transport-apple.cpp) uses, as on a macOS librdma.dylib that may
 * lack the rest; everything else stays NULL and what needs it reports
 * RV_ERR_NOSYM (completion channel, ibv_query_qp, the GID-entry API). */
int rv_load(const char *path, int apple_only, char *err, size_t errlen)
{
    if (g_loaded)
        return 0;
    void *h = NULL;
    const char *last = "no library name";
    if (path && *path) {
        h = dlopen(path, RV_DLOPEN_FLAGS);
        if (!h) last = dlerror();
    } else {
        for (int i = 0; RV_DEFAULT_LIBS[i] && !h; i++) {
            h = dlopen(RV_DEFAULT_LIBS[i], RV_DLOPEN_FLAGS);
            if (!h) last = dlerror();
        }
    }
    if (!h) {
        if (err && errlen) snprintf(err, errlen, "%s", last ? last : "dlopen failed");
        return RV_ERR_NOLIB;
    }

#define REQ(field, name)                                                          \
    do {                                                                          \
        *(void **)(&F.field) = dlsym(h, name);                                    \
        g_symbols++;                                                              \
        if (!F.field) {                                                           \
            if (err && errlen) snprintf(err, errlen, "symbol %s missing", name);  \
            memset(&F, 0, sizeof F);                                              \
            dlclose(h);                                                           \
            return RV_ERR_NOLIB;                                                  \
        }                                                                         \
    } while (0)
#define OPT(field, name)                                                          \
    do {                                                                          \
        if (!apple_only && (*(void **)(&F.field) = dlsym(h, name)) != NULL)       \
            g_symbols++;                                                          \
    } while (0)
    g_symbols = 0;

    REQ(get_device_list, "ibv_get_device_list");
    REQ(free_device_list, "ibv_free_device_list");
    REQ(get_device_name, "ibv_get_device_name");
    REQ(open_device, "ibv_open_device");
    REQ(close_device, "ibv_close_device");
    REQ(query_device, "ibv_query_device");
    REQ(query_port_compat, "ibv_query_port");
    REQ(query_gid, "ibv_query_gid");
#if RV_HAVE_GID_ENTRY
    OPT(query_gid_ex, "_ibv_query_gid_ex");
    OPT(query_gid_table, "_ibv_query_gid_table");
#endif
    REQ(alloc_pd, "ibv_alloc_pd");
    REQ(dealloc_pd, "ibv_dealloc_pd");
    REQ(create_cq, "ibv_create_cq");
    REQ(destroy_cq, "ibv_destroy_cq");
    REQ(reg_mr, "ibv_reg_mr");
    REQ(dereg_mr, "ibv_dereg_mr");
    REQ(create_qp, "ibv_create_qp");
    REQ(modify_qp, "ibv_modify_qp");
    REQ(destroy_qp, "ibv_destroy_qp");
    /* Beyond upstream's Apple set: each optional, its absence disables only
     * what needs it (idle connections then poll instead of sleeping on a
     * completion channel). */
    OPT(create_comp_channel, "ibv_create_comp_channel");
    OPT(destroy_comp_channel, "ibv_destroy_comp_channel");
    OPT(get_cq_event, "ibv_get_cq_event");
    OPT(ack_cq_events, "ibv_ack_cq_events");
    OPT(query_qp, "ibv_query_qp");
    OPT(wc_status_str, "ibv_wc_status_str");
#undef REQ
#undef OPT

    g_lib = h; /* never dlclose()d: providers keep pointers into it */
    g_loaded = 1;
    return 0;
}

#define NEED_LIB()              \
    do {                        \
        if (!g_loaded)          \
            return RV_ERR_NOLIB; \
    } while (0)

/* errno after a call that signalled failure (NULL or -1). */
static int last_errno(void)
{
    int e = errno;
    return e > 0 ? e : RV_ERR_NULL;
}

/* Normalise an int-returning verb: rdma-core returns a positive errno, some
 * providers a negative one, old versions -1 with errno set. */
static int norm_rc(int rc)
{
    if (rc == 0) return 0;
    if (rc == -1) return last_errno();
    return rc < 0 ? -rc : rc;
}

/* ---------------------------------------------------------------- devices */

int rv_device_list(void **list, int *num)
{
    NEED_LIB();
    int n = 0;
    errno = 0;
    struct ibv_device **l = F.get_device_list(&n);
    if (!l) {
        int e = errno;
        /* No /sys/class/infiniband (kernel without RDMA) yields NULL with
         * ENOSYS; treat "no RDMA subsystem" as an empty list. */
        if (e == 0 || e == ENOSYS || e == ENODEV || e == ENOENT) {
            *list = NULL;
            *num = 0;
            return 0;
        }
        return e;
    }
    *list = l;
    *num = n;
    return 0;
}

const char *rv_device_name(void *list, int i)
{
    if (!g_loaded || !list) return NULL;
    return F.get_device_name(((struct ibv_device **)list)[i]);
}

int rv_open_device(void *list, int i, void **ctx)
{
    NEED_LIB();
    errno = 0;
    struct ibv_context *c = F.open_device(((struct ibv_device **)list)[i]);
    if (!c) return last_errno();
    *ctx = c;
    return 0;
}

void rv_free_device_list(void *list)
{
    if (g_loaded && list) F.free_device_list((struct ibv_device **)list);
}

int rv_close_device(void *ctx)
{
    NEED_LIB();
    return norm_rc(F.close_device((struct ibv_context *)ctx));
}

int rv_query_device(void *ctx, struct rv_device_attr *out)
{
    NEED_LIB();
    struct ibv_device_attr a;
    memset(&a, 0, sizeof a);
    int rc = norm_rc(F.query_device((struct ibv_context *)ctx, &a));
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    memcpy(out->fw_ver, a.fw_ver, sizeof out->fw_ver);
    out->fw_ver[sizeof out->fw_ver - 1] = 0;
    out->node_guid = a.node_guid;
    out->max_mr_size = a.max_mr_size;
    out->vendor_id = a.vendor_id;
    out->vendor_part_id = a.vendor_part_id;
    out->hw_ver = a.hw_ver;
    out->max_qp = a.max_qp;
    out->max_qp_wr = a.max_qp_wr;
    out->max_sge = a.max_sge;
    out->max_cq = a.max_cq;
    out->max_cqe = a.max_cqe;
    out->max_mr = a.max_mr;
    out->max_pd = a.max_pd;
    out->max_qp_rd_atom = a.max_qp_rd_atom;
    out->phys_port_cnt = a.phys_port_cnt;
    return 0;
}

int rv_query_port(void *ctx_, uint8_t port, struct rv_port_attr *out)
{
    NEED_LIB();
    struct ibv_context *ctx = (struct ibv_context *)ctx_;
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof pa);
    int rc;
#ifdef verbs_get_ctx_op
    /* What rdma-core's ___ibv_query_port() inline does: use the extended
     * entry point with the full struct, else the compat symbol. */
    struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);
    if (vctx)
        rc = norm_rc(vctx->query_port(ctx, port, &pa, sizeof pa));
    else
#endif
        rc = norm_rc(F.query_port_compat(ctx, port, &pa));
    if (rc) return rc;
    memset(out, 0, sizeof *out);
    out->state = (uint32_t)pa.state;
    out->max_mtu = (uint32_t)pa.max_mtu;
    out->active_mtu = (uint32_t)pa.active_mtu;
    out->gid_tbl_len = pa.gid_tbl_len;
    out->port_cap_flags = pa.port_cap_flags;
    out->lid = pa.lid;
    out->sm_lid = pa.sm_lid;
    out->link_layer = pa.link_layer;
    out->active_width = pa.active_width;
    out->active_speed = pa.active_speed;
    out->phys_state = pa.phys_state;
    return 0;
}

int rv_query_gid(void *ctx, uint8_t port, int index, uint8_t gid[16])
{
    NEED_LIB();
    union ibv_gid g;
    memset(&g, 0, sizeof g);
    int rc = norm_rc(F.query_gid((struct ibv_context *)ctx, port, index, &g));
    if (rc) return rc;
    memcpy(gid, g.raw, 16);
    return 0;
}

#if RV_HAVE_GID_ENTRY
static uint32_t map_gid_type(uint32_t t)
{
    switch (t) {
    case IBV_GID_TYPE_IB: return RV_GID_TYPE_IB;
    case IBV_GID_TYPE_ROCE_V1: return RV_GID_TYPE_ROCE_V1;
    case IBV_GID_TYPE_ROCE_V2: return RV_GID_TYPE_ROCE_V2;
    default: return RV_GID_TYPE_UNKNOWN;
    }
}

static void copy_entry(struct rv_gid_entry *o, const struct ibv_gid_entry *e)
{
    memcpy(o->gid, e->gid.raw, 16);
    o->gid_index = e->gid_index;
    o->port_num = e->port_num;
    o->gid_type = map_gid_type(e->gid_type);
}
#endif

int rv_query_gid_ex(void *ctx, uint8_t port, int index, struct rv_gid_entry *out)
{
    NEED_LIB();
#if RV_HAVE_GID_ENTRY
    if (!F.query_gid_ex) return RV_ERR_NOSYM;
    struct ibv_gid_entry e;
    memset(&e, 0, sizeof e);
    int rc = norm_rc(F.query_gid_ex((struct ibv_context *)ctx, port, (uint32_t)index, &e, 0,
                                    sizeof e));
    if (rc) return rc;
    copy_entry(out, &e);
    return 0;
#else
    (void)ctx; (void)port; (void)index; (void)out;
    return RV_ERR_NOSYM;
#endif
}

int rv_query_gid_table(void *ctx, struct rv_gid_entry *out, size_t max, size_t *count)
{
    NEED_LIB();
#if RV_HAVE_GID_ENTRY
    if (!F.query_gid_table) return RV_ERR_NOSYM;
    if (max == 0) { *count = 0; return 0; }
    struct ibv_gid_entry buf[64];
    size_t cap = max < 64 ? max : 64;
    struct ibv_gid_entry *e = buf;
    /* Large tables (rxe: 1024 slots, but only valid entries are returned)
     * need a heap buffer. */
    int heap = 0;
    if (max > 64) {
        e = calloc(max, sizeof *e);
        if (!e) return ENOMEM;
        cap = max;
        heap = 1;
    }
    errno = 0;
    ssize_t n = F.query_gid_table((struct ibv_context *)ctx, e, cap, 0, sizeof *e);
    if (n < 0) {
        int rc = n == -1 ? last_errno() : (int)-n;
        if (heap) free(e);
        return rc;
    }
    for (ssize_t i = 0; i < n; i++) copy_entry(&out[i], &e[i]);
    *count = (size_t)n;
    if (heap) free(e);
    return 0;
#else
    (void)ctx; (void)out; (void)max; (void)count;
    return RV_ERR_NOSYM;
#endif
}

/* ---------------------------------------------------------- pd / cq / ch */

int rv_alloc_pd(void *ctx, void **pd)
{
    NEED_LIB();
    errno = 0;
    struct ibv_pd *p = F.alloc_pd((struct ibv_context *)ctx);
    if (!p) return last_errno();
    *pd = p;
    return 0;
}

int rv_dealloc_pd(void *pd)
{
    NEED_LIB();
    return norm_rc(F.dealloc_pd((struct ibv_pd *)pd));
}

int rv_create_comp_channel(void *ctx, void **ch, int *fd)
{
    NEED_LIB();
    /* A channel is only usable with all four of its entry points. */
    if (!F.create_comp_channel || !F.destroy_comp_channel || !F.get_cq_event || !F.ack_cq_events)
        return RV_ERR_NOSYM;
    errno = 0;
    struct ibv_comp_channel *c = F.create_comp_channel((struct ibv_context *)ctx);
    if (!c) return last_errno();
    /* Non-blocking, so rv_get_cq_event() can never hang the caller. */
    int fl = fcntl(c->fd, F_GETFL);
    if (fl < 0 || fcntl(c->fd, F_SETFL, fl | O_NONBLOCK) < 0) {
        int e = last_errno();
        F.destroy_comp_channel(c);
        return e;
    }
    *ch = c;
    *fd = c->fd;
    return 0;
}

int rv_destroy_comp_channel(void *ch)
{
    NEED_LIB();
    if (!F.destroy_comp_channel) return RV_ERR_NOSYM;
    return norm_rc(F.destroy_comp_channel((struct ibv_comp_channel *)ch));
}

int rv_get_cq_event(void *ch, void **cq, void **cq_context)
{
    NEED_LIB();
    struct ibv_cq *c = NULL;
    void *cctx = NULL;
    if (!F.get_cq_event) return RV_ERR_NOSYM;
    errno = 0;
    if (F.get_cq_event((struct ibv_comp_channel *)ch, &c, &cctx) != 0) return last_errno();
    *cq = c;
    *cq_context = cctx;
    return 0;
}

void rv_ack_cq_events(void *cq, unsigned int n)
{
    if (g_loaded && F.ack_cq_events && cq && n) F.ack_cq_events((struct ibv_cq *)cq, n);
}

int rv_poll_fd(int fd, int timeout_ms, int *ready)
{
    struct pollfd p = { .fd = fd, .events = POLLIN, .revents = 0 };
    int rc = poll(&p, 1, timeout_ms);
    if (rc < 0) {
        if (errno == EINTR) { *ready = 0; return 0; }
        return last_errno();
    }
    *ready = rc > 0 && (p.revents & (POLLIN | POLLERR | POLLHUP)) ? 1 : 0;
    return 0;
}

int rv_create_cq(void *ctx, int cqe, void *cq_context, void *ch, int comp_vector, void **cq,
                 int *actual_cqe)
{
    NEED_LIB();
    errno = 0;
    struct ibv_cq *c = F.create_cq((struct ibv_context *)ctx, cqe, cq_context,
                                   (struct ibv_comp_channel *)ch, comp_vector);
    if (!c) return last_errno();
    *cq = c;
    *actual_cqe = c->cqe;
    return 0;
}

int rv_destroy_cq(void *cq)
{
    NEED_LIB();
    return norm_rc(F.destroy_cq((struct ibv_cq *)cq));
}

int rv_poll_cq(void *cq_, struct rv_wc *out, int max, int *n)
{
    NEED_LIB();
    struct ibv_cq *cq = (struct ibv_cq *)cq_;
    struct ibv_wc wc[16];
    int got = 0;
    while (got < max) {
        int want = max - got < 16 ? max - got : 16;
        int r = ibv_poll_cq(cq, want, wc); /* inline: cq->context->ops.poll_cq */
        if (r < 0) {
            *n = got;
            return got ? 0 : (r == -1 ? last_errno() : -r);
        }
        for (int i = 0; i < r; i++) {
            struct rv_wc *o = &out[got + i];
            o->wr_id = wc[i].wr_id;
            o->status = (uint32_t)wc[i].status;
            o->opcode = (uint32_t)wc[i].opcode;
            o->vendor_err = wc[i].vendor_err;
            o->byte_len = wc[i].byte_len;
            o->qp_num = wc[i].qp_num;
            o->src_qp = wc[i].src_qp;
            o->wc_flags = wc[i].wc_flags;
            o->imm_data = wc[i].imm_data;
        }
        got += r;
        if (r < want) break;
    }
    *n = got;
    return 0;
}

int rv_req_notify_cq(void *cq, int solicited_only)
{
    NEED_LIB();
    return norm_rc(ibv_req_notify_cq((struct ibv_cq *)cq, solicited_only));
}

/* ---------------------------------------------------------------------- mr */

static int map_access(uint32_t a)
{
    int r = 0;
    if (a & RV_ACCESS_LOCAL_WRITE) r |= IBV_ACCESS_LOCAL_WRITE;
    if (a & RV_ACCESS_REMOTE_WRITE) r |= IBV_ACCESS_REMOTE_WRITE;
    if (a & RV_ACCESS_REMOTE_READ) r |= IBV_ACCESS_REMOTE_READ;
    if (a & RV_ACCESS_REMOTE_ATOMIC) r |= IBV_ACCESS_REMOTE_ATOMIC;
    return r;
}

int rv_reg_mr(void *pd, void *addr, size_t len, uint32_t access, void **mr, uint32_t *lkey,
              uint32_t *rkey)
{
    NEED_LIB();
    errno = 0;
    struct ibv_mr *m = F.reg_mr((struct ibv_pd *)pd, addr, len, map_access(access));
    if (!m) return last_errno();
    *mr = m;
    *lkey = m->lkey;
    *rkey = m->rkey;
    return 0;
}

int rv_dereg_mr(void *mr)
{
    NEED_LIB();
    return norm_rc(F.dereg_mr((struct ibv_mr *)mr));
}

/* ---------------------------------------------------------------------- qp */

static int map_qp_type(uint32_t t, enum ibv_qp_type *out)
{
    switch (t) {
    case RV_QPT_RC: *out = IBV_QPT_RC; return 0;
    case RV_QPT_UC: *out = IBV_QPT_UC; return 0;
    case RV_QPT_UD: *out = IBV_QPT_UD; return 0;
    default: return EINVAL;
    }
}

static int map_state(uint32_t s, enum ibv_qp_state *out)
{
    switch (s) {
    case RV_QPS_RESET: *out = IBV_QPS_RESET; return 0;
    case RV_QPS_INIT: *out = IBV_QPS_INIT; return 0;
    case RV_QPS_RTR: *out = IBV_QPS_RTR; return 0;
    case RV_QPS_RTS: *out = IBV_QPS_RTS; return 0;
    case RV_QPS_SQD: *out = IBV_QPS_SQD; return 0;
    case RV_QPS_SQE: *out = IBV_QPS_SQE; return 0;
    case RV_QPS_ERR: *out = IBV_QPS_ERR; return 0;
    default: return EINVAL;
    }
}

static uint32_t unmap_state(enum ibv_qp_state s)
{
    switch (s) {
    case IBV_QPS_RESET: return RV_QPS_RESET;
    case IBV_QPS_INIT: return RV_QPS_INIT;
    case IBV_QPS_RTR: return RV_QPS_RTR;
    case IBV_QPS_RTS: return RV_QPS_RTS;
    case IBV_QPS_SQD: return RV_QPS_SQD;
    case IBV_QPS_SQE: return RV_QPS_SQE;
    case IBV_QPS_ERR: return RV_QPS_ERR;
    default: return RV_QPS_UNKNOWN;
    }
}

static void cap_out(struct rv_qp_cap *o, const struct ibv_qp_cap *c)
{
    o->max_send_wr = c->max_send_wr;
    o->max_recv_wr = c->max_recv_wr;
    o->max_send_sge = c->max_send_sge;
    o->max_recv_sge = c->max_recv_sge;
    o->max_inline_data = c->max_inline_data;
}

int rv_create_qp(void *pd, void *send_cq, void *recv_cq, const struct rv_qp_init *init,
                 void **qp, uint32_t *qp_num, struct rv_qp_cap *granted)
{
    NEED_LIB();
    struct ibv_qp_init_attr a;
    memset(&a, 0, sizeof a);
    if (map_qp_type(init->qp_type, &a.qp_type)) return EINVAL;
    a.send_cq = (struct ibv_cq *)send_cq;
    a.recv_cq = (struct ibv_cq *)recv_cq;
    a.cap.max_send_wr = init->max_send_wr;
    a.cap.max_recv_wr = init->max_recv_wr;
    a.cap.max_send_sge = init->max_send_sge;
    a.cap.max_recv_sge = init->max_recv_sge;
    a.cap.max_inline_data = init->max_inline_data;
    a.sq_sig_all = init->sq_sig_all ? 1 : 0;
    errno = 0;
    struct ibv_qp *q = F.create_qp((struct ibv_pd *)pd, &a);
    if (!q) return last_errno();
    *qp = q;
    *qp_num = q->qp_num;
    cap_out(granted, &a.cap); /* ibv_create_qp writes the granted caps back */
    return 0;
}

int rv_destroy_qp(void *qp)
{
    NEED_LIB();
    return norm_rc(F.destroy_qp((struct ibv_qp *)qp));
}

int rv_modify_qp(void *qp, const struct rv_qp_attr *in, uint32_t mask)
{
    NEED_LIB();
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof a);
    int m = 0;
    if (mask & RV_QP_STATE) {
        if (map_state(in->qp_state, &a.qp_state)) return EINVAL;
        m |= IBV_QP_STATE;
    }
    if (mask & RV_QP_ACCESS_FLAGS) {
        a.qp_access_flags = (unsigned int)map_access(in->qp_access_flags);
        m |= IBV_QP_ACCESS_FLAGS;
    }
    if (mask & RV_QP_PKEY_INDEX) { a.pkey_index = in->pkey_index; m |= IBV_QP_PKEY_INDEX; }
    if (mask & RV_QP_PORT) { a.port_num = in->port_num; m |= IBV_QP_PORT; }
    if (mask & RV_QP_AV) {
        a.ah_attr.is_global = in->ah_is_global;
        a.ah_attr.dlid = in->ah_dlid;
        a.ah_attr.sl = in->ah_sl;
        a.ah_attr.src_path_bits = in->ah_src_path_bits;
        a.ah_attr.port_num = in->ah_port_num;
        a.ah_attr.grh.hop_limit = in->grh_hop_limit;
        a.ah_attr.grh.sgid_index = in->grh_sgid_index;
        a.ah_attr.grh.traffic_class = in->grh_traffic_class;
        a.ah_attr.grh.flow_label = in->grh_flow_label;
        memcpy(a.ah_attr.grh.dgid.raw, in->grh_dgid, 16);
        m |= IBV_QP_AV;
    }
    if (mask & RV_QP_PATH_MTU) {
        if (in->path_mtu < 1 || in->path_mtu > 5) return EINVAL;
        a.path_mtu = (enum ibv_mtu)in->path_mtu;
        m |= IBV_QP_PATH_MTU;
    }
    if (mask & RV_QP_TIMEOUT) { a.timeout = in->timeout; m |= IBV_QP_TIMEOUT; }
    if (mask & RV_QP_RETRY_CNT) { a.retry_cnt = in->retry_cnt; m |= IBV_QP_RETRY_CNT; }
    if (mask & RV_QP_RNR_RETRY) { a.rnr_retry = in->rnr_retry; m |= IBV_QP_RNR_RETRY; }
    if (mask & RV_QP_RQ_PSN) { a.rq_psn = in->rq_psn; m |= IBV_QP_RQ_PSN; }
    if (mask & RV_QP_MAX_QP_RD_ATOMIC) { a.max_rd_atomic = in->max_rd_atomic; m |= IBV_QP_MAX_QP_RD_ATOMIC; }
    if (mask & RV_QP_MIN_RNR_TIMER) { a.min_rnr_timer = in->min_rnr_timer; m |= IBV_QP_MIN_RNR_TIMER; }
    if (mask & RV_QP_SQ_PSN) { a.sq_psn = in->sq_psn; m |= IBV_QP_SQ_PSN; }
    if (mask & RV_QP_MAX_DEST_RD_ATOMIC) {
        a.max_dest_rd_atomic = in->max_dest_rd_atomic;
        m |= IBV_QP_MAX_DEST_RD_ATOMIC;
    }
    if (mask & RV_QP_DEST_QPN) { a.dest_qp_num = in->dest_qp_num; m |= IBV_QP_DEST_QPN; }
    errno = 0;
    return norm_rc(F.modify_qp((struct ibv_qp *)qp, &a, m));
}

int rv_query_qp(void *qp, uint32_t *state, struct rv_qp_cap *cap)
{
    NEED_LIB();
    struct ibv_qp_attr a;
    struct ibv_qp_init_attr ia;
    if (!F.query_qp) return RV_ERR_NOSYM;
    memset(&a, 0, sizeof a);
    memset(&ia, 0, sizeof ia);
    errno = 0;
    int rc = norm_rc(F.query_qp((struct ibv_qp *)qp, &a, IBV_QP_STATE | IBV_QP_CAP, &ia));
    if (rc) return rc;
    *state = unmap_state(a.qp_state);
    cap_out(cap, &a.cap);
    return 0;
}

int rv_post_send(void *qp_, uint64_t wr_id, uint64_t addr, uint32_t len, uint32_t lkey,
                 uint32_t flags)
{
    NEED_LIB();
    struct ibv_qp *qp = (struct ibv_qp *)qp_;
    struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };
    struct ibv_send_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id;
    wr.sg_list = len ? &sge : NULL;
    wr.num_sge = len ? 1 : 0;
    wr.opcode = IBV_WR_SEND;
    if (flags & RV_SEND_SIGNALED) wr.send_flags |= IBV_SEND_SIGNALED;
    if (flags & RV_SEND_INLINE) wr.send_flags |= IBV_SEND_INLINE;
    if (flags & RV_SEND_SOLICITED) wr.send_flags |= IBV_SEND_SOLICITED;
    errno = 0;
    return norm_rc(ibv_post_send(qp, &wr, &bad)); /* inline: qp->context->ops.post_send */
}

int rv_post_recv(void *qp_, uint64_t wr_id, uint64_t addr, uint32_t len, uint32_t lkey)
{
    NEED_LIB();
    struct ibv_qp *qp = (struct ibv_qp *)qp_;
    struct ibv_sge sge = { .addr = addr, .length = len, .lkey = lkey };
    struct ibv_recv_wr wr, *bad = NULL;
    memset(&wr, 0, sizeof wr);
    wr.wr_id = wr_id;
    wr.sg_list = len ? &sge : NULL;
    wr.num_sge = len ? 1 : 0;
    errno = 0;
    return norm_rc(ibv_post_recv(qp, &wr, &bad)); /* inline: qp->context->ops.post_recv */
}

const char *rv_wc_status_str(uint32_t status)
{
    if (!g_loaded || !F.wc_status_str) return NULL;
    return F.wc_status_str((enum ibv_wc_status)status);
}
