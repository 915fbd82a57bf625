/*
 * rdma-verbs shim, stub flavour: compiled when <infiniband/verbs.h> was not
 * found at build time (or RDMA_VERBS_FORCE_STUB=1, or an unsupported OS).
 * Every entry point reports RV_ERR_UNSUPPORTED, so the Rust side returns
 * VerbsError::LibraryMissing and callers fall back to TCP.
 */
#include "shim.h"

#define UNSUP return RV_ERR_UNSUPPORTED

int rv_shim_abi(void) { return RV_SHIM_ABI; }
int rv_built_with_verbs(void) { return 0; }
int rv_symbols_loaded(void) { return 0; }
int rv_load(const char *path, int apple_only, char *err, size_t errlen)
{
    (void)path;
    (void)apple_only;
    const char msg[] = "rdma-verbs was built without infiniband/verbs.h";
    if (err && errlen) {
        size_t i = 0;
        for (; i + 1 < errlen && msg[i]; i++) err[i] = msg[i];
        err[i] = 0;
    }
    UNSUP;
}
int rv_is_loaded(void) { return 0; }
int rv_has_gid_ex(void) { return 0; }
long rv_page_size(void) { return 4096; }
int rv_device_list(void **l, int *n) { (void)l; (void)n; UNSUP; }
const char *rv_device_name(void *l, int i) { (void)l; (void)i; return 0; }
int rv_open_device(void *l, int i, void **c) { (void)l; (void)i; (void)c; UNSUP; }
void rv_free_device_list(void *l) { (void)l; }
int rv_close_device(void *c) { (void)c; UNSUP; }
int rv_query_device(void *c, struct rv_device_attr *o) { (void)c; (void)o; UNSUP; }
int rv_query_port(void *c, uint8_t p, struct rv_port_attr *o) { (void)c; (void)p; (void)o; UNSUP; }
int rv_query_gid(void *c, uint8_t p, int i, uint8_t g[16]) { (void)c; (void)p; (void)i; (void)g; UNSUP; }
int rv_query_gid_ex(void *c, uint8_t p, int i, struct rv_gid_entry *o) { (void)c; (void)p; (void)i; (void)o; UNSUP; }
int rv_query_gid_table(void *c, struct rv_gid_entry *o, size_t m, size_t *n) { (void)c; (void)o; (void)m; (void)n; UNSUP; }
int rv_alloc_pd(void *c, void **p) { (void)c; (void)p; UNSUP; }
int rv_dealloc_pd(void *p) { (void)p; UNSUP; }
int rv_create_comp_channel(void *c, void **ch, int *fd) { (void)c; (void)ch; (void)fd; UNSUP; }
int rv_destroy_comp_channel(void *ch) { (void)ch; UNSUP; }
int rv_get_cq_event(void *ch, void **cq, void **x) { (void)ch; (void)cq; (void)x; UNSUP; }
void rv_ack_cq_events(void *cq, unsigned int n) { (void)cq; (void)n; }
int rv_poll_fd(int fd, int t, int *r) { (void)fd; (void)t; (void)r; UNSUP; }
int rv_create_cq(void *c, int e, void *x, void *ch, int v, void **cq, int *a) { (void)c; (void)e; (void)x; (void)ch; (void)v; (void)cq; (void)a; UNSUP; }
int rv_destroy_cq(void *cq) { (void)cq; UNSUP; }
int rv_poll_cq(void *cq, struct rv_wc *o, int m, int *n) { (void)cq; (void)o; (void)m; (void)n; UNSUP; }
int rv_req_notify_cq(void *cq, int s) { (void)cq; (void)s; UNSUP; }
int rv_reg_mr(void *pd, void *a, size_t l, uint32_t ac, void **mr, uint32_t *lk, uint32_t *rk) { (void)pd; (void)a; (void)l; (void)ac; (void)mr; (void)lk; (void)rk; UNSUP; }
int rv_dereg_mr(void *mr) { (void)mr; UNSUP; }
int rv_create_qp(void *pd, void *s, void *r, const struct rv_qp_init *i, void **qp, uint32_t *n, struct rv_qp_cap *g) { (void)pd; (void)s; (void)r; (void)i; (void)qp; (void)n; (void)g; UNSUP; }
int rv_destroy_qp(void *qp) { (void)qp; UNSUP; }
int rv_modify_qp(void *qp, const struct rv_qp_attr *a, uint32_t m) { (void)qp; (void)a; (void)m; UNSUP; }
int rv_query_qp(void *qp, uint32_t *s, struct rv_qp_cap *c) { (void)qp; (void)s; (void)c; UNSUP; }
int rv_post_send(void *qp, uint64_t w, uint64_t a, uint32_t l, uint32_t k, uint32_t f) { (void)qp; (void)w; (void)a; (void)l; (void)k; (void)f; UNSUP; }
int rv_post_recv(void *qp, uint64_t w, uint64_t a, uint32_t l, uint32_t k) { (void)qp; (void)w; (void)a; (void)l; (void)k; UNSUP; }
const char *rv_wc_status_str(uint32_t s) { (void)s; return 0; }
