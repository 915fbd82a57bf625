/* macOS (SDK librdma, RDMA over Thunderbolt) specifics of the shim.
 * Untested: written against the documented facts (TN3205, rdma-transports.md §5). */
#ifndef RDMA_VERBS_PLATFORM_APPLE_H
#define RDMA_VERBS_PLATFORM_APPLE_H

/* /usr/lib/librdma.dylib is an umbrella re-exporting libibverbs.dylib (macOS >= 26.2).
 * Absent on older systems: rv_load() then reports RV_ERR_NOLIB. */
static const char *const RV_DEFAULT_LIBS[] = { "/usr/lib/librdma.dylib", NULL };
#define RV_DLOPEN_FLAGS (RTLD_NOW | RTLD_LOCAL)

/* The SDK header is a trimmed rdma-core derivative; do not rely on the
 * GID-entry API (Thunderbolt GIDs carry no RoCE type anyway). */
#define RV_HAVE_GID_ENTRY 0

#endif
