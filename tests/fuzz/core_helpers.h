/* Small helpers over the daemon's own structures (gpubufd_core) for the
 * programs that drive them without a daemon: the unit suites, the fuzz
 * targets and the seed writer. Nothing here asserts: each returns what it
 * found, and the caller decides how to fail. */
#ifndef GPUBUF_TEST_CORE_HELPERS_H
#define GPUBUF_TEST_CORE_HELPERS_H

#include <stdbool.h>
#include <stdint.h>

#include "backend.h"
#include "context.h"
#include "pool.h"

/* A pool on the host backend with capacity cap and slabs of slab bytes,
 * added to ctx; NULL on failure. */
static inline gd_pool *ch_host_pool(gd_context *ctx, const char *name, uint64_t cap,
                                    uint64_t slab) {
    gd_backend *be;
    gd_pool *pool;
    if (gd_backend_host_new(&be, NULL) < 0 ||
        gd_pool_new(name, be, cap, slab, &ctx->slab_ids, &pool, NULL) < 0 ||
        gd_context_add_pool(ctx, pool) < 0)
        return NULL;
    return pool;
}

/* True when slab is one of p's slabs. */
static inline bool ch_slab_in_pool(const gd_pool *p, const gd_slab *slab) {
    for (const gd_slab *s = p->slabs; s; s = s->next)
        if (s == slab)
            return true;
    return false;
}

#endif
