/* Linux (rdma-core) specifics of the shim. */
#ifndef RDMA_VERBS_PLATFORM_LINUX_H
#define RDMA_VERBS_PLATFORM_LINUX_H

/* Tried in order when rv_load() gets no explicit path. */
static const char *const RV_DEFAULT_LIBS[] = { "libibverbs.so.1", "libibverbs.so", NULL };
#define RV_DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL)

/* rdma-core >= v32 declares ibv_gid_entry, _ibv_query_gid_ex and
 * _ibv_query_gid_table (IBVERBS_1.11); whether the loaded library exports
 * them is checked at run time. */
#define RV_HAVE_GID_ENTRY 1

#endif
