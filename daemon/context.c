#include "context.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "util.h"

void gd_context_init(gd_context *ctx, uv_loop_t *loop) {
    memset(ctx, 0, sizeof(*ctx));
    ctx->loop = loop;
    gd_registry_init(&ctx->reg);
    ctx->started_ns = gpubuf_now_ns();
}

int gd_context_add_pool(gd_context *ctx, gd_pool *pool) {
    if (ctx->n_pools >= GPUBUF_MAX_POOLS)
        return -ENOSPC;
    if (gd_context_find_pool(ctx, pool->name))
        return -EEXIST;
    pool->next_slab_id = &ctx->slab_ids;
    ctx->pools[ctx->n_pools++] = pool;
    /* The first pool is the default one: of allocations, and of names
     * given without a pool. */
    if (!ctx->reg.default_pool)
        ctx->reg.default_pool = pool;
    return 0;
}

gd_pool *gd_context_find_pool(const gd_context *ctx, const char *name) {
    for (int i = 0; i < ctx->n_pools; i++)
        if (strcmp(ctx->pools[i]->name, name) == 0)
            return ctx->pools[i];
    return NULL;
}

/* "no pool named 'x'; pools: a, b (leave the pool out for the default pool
 * 'a')": the names the client can use instead. */
static int no_pool(const gd_context *ctx, const char *name, gd_err *err) {
    char list[128], asked[40];
    size_t n = 0;
    /* The client's name, shown printable: never raw bytes into its terminal. */
    gpubuf_text_clean(asked, sizeof(asked), name, strnlen(name, 32));
    list[0] = '\0';
    for (int i = 0; i < ctx->n_pools && n < sizeof(list); i++)
        n += (size_t)snprintf(list + n, sizeof(list) - n, "%s%s", i ? ", " : "",
                              ctx->pools[i]->name);
    if (n >= sizeof(list)) /* cut: end with an ellipsis */
        memcpy(list + sizeof(list) - 4, "...", 4);
    if (ctx->n_pools == 0)
        return gd_err_set(err, GPUBUF_ENOPOOL, "no pool named '%s'; the daemon has no pools",
                          asked);
    return gd_err_set(err, GPUBUF_ENOPOOL,
                      "no pool named '%s'; pools: %s (leave the pool out for the default "
                      "pool '%.16s')",
                      asked, list, ctx->pools[0]->name);
}

int gd_context_pool(const gd_context *ctx, const char *name, gd_pool **ret, gd_err *err) {
    gd_pool *p;
    if (name && *name) {
        if (!(p = gd_context_find_pool(ctx, name)))
            return no_pool(ctx, name, err);
    } else if (ctx->n_pools > 0) {
        p = ctx->pools[0];
    } else {
        return gd_err_set(err, GPUBUF_ENOPOOL, "the daemon has no pools");
    }
    *ret = p;
    return 0;
}

static void lease_timer_fire(uv_timer_t *t) {
    gd_context *ctx = t->data;
    ctx->lease_armed_ns = 0;
    /* A bounded pass, like every pass of the loop: leases still due after
     * GD_EXPIRIES_PER_TURN wait for the next turn (the timer re-arms at 0). */
    uint32_t n = gd_registry_expire(&ctx->reg, gpubuf_now_ns(), GD_EXPIRIES_PER_TURN);
    if (n)
        LOG_INFO("%u lease(s) expired: their buffers were deleted", n);
    gd_context_leases_arm(ctx);
}

void gd_context_leases_arm(gd_context *ctx) {
    uint64_t next = gd_registry_next_expiry(&ctx->reg), now;
    if (!next || !ctx->loop || (ctx->lease_armed_ns && ctx->lease_armed_ns <= next))
        return;
    if (!ctx->lease_timer_init) {
        if (uv_timer_init(ctx->loop, &ctx->lease_timer) < 0)
            return;
        ctx->lease_timer.data = ctx;
        ctx->lease_timer_init = true;
    }
    if (uv_is_closing((uv_handle_t *)&ctx->lease_timer))
        return;
    now = gpubuf_now_ns();
    /* Rounded up: a timer that fires early finds nothing due and re-arms. */
    uint64_t ms = next > now ? (next - now + 999999) / 1000000 : 0;
    uv_update_time(ctx->loop);
    if (uv_timer_start(&ctx->lease_timer, lease_timer_fire, ms, 0) == 0)
        ctx->lease_armed_ns = next;
}

void gd_context_stop(gd_context *ctx) {
    if (ctx->lease_timer_init && !uv_is_closing((uv_handle_t *)&ctx->lease_timer))
        uv_close((uv_handle_t *)&ctx->lease_timer, NULL);
    ctx->lease_armed_ns = 0;
}

void gd_context_destroy(gd_context *ctx) {
    assert(!ctx->sessions && ctx->n_sessions == 0);
    gd_context_stop(ctx);
    gd_registry_destroy(&ctx->reg);
    for (int i = 0; i < ctx->n_pools; i++)
        ctx->pools[i] = gd_pool_free(ctx->pools[i]);
    ctx->n_pools = 0;
}
