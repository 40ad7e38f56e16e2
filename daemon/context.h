/* The daemon context: what every session works on. The registry, the pools,
 * the live limits, and the list of sessions (for status). Handed to each
 * session; it knows neither the server nor the sessions' code. */
#ifndef GPUBUFD_CONTEXT_H
#define GPUBUFD_CONTEXT_H

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "metrics.h"
#include "pool.h"
#include "registry.h"
#include "settings.h"

#define GPUBUF_MAX_POOLS 64

struct gd_session;

typedef struct gd_context {
    uv_loop_t *loop;  /* for the sessions' timers */
    gd_limits limits; /* live: the server reads them through a pointer */
    gd_registry reg;  /* reg.quota: the live quotas */
    gd_pool *pools[GPUBUF_MAX_POOLS];
    int n_pools;
    uint64_t slab_ids; /* slab ids are unique per daemon */
    uint64_t started_ns;
    struct gd_session *sessions; /* utlist DL, kept by session.c */
    uint32_t n_sessions;
    gd_metrics metrics; /* counters since start (status) */
    /* Waiting opens that timed out in the current turn of the loop (the
     * turn known by its uv_now()): at most GD_EXPIRIES_PER_TURN are
     * answered per turn, the others a turn later. */
    uint64_t expiry_turn;
    uint32_t expiries;
    struct gd_state *state;     /* the kept state (state.c); NULL: not kept */
    uint32_t restarts;          /* starts over a kept state, ever */
    uint32_t restored_buffers;  /* buffers this start restored */
    /* A successor asks for everything (gpubufd --takeover), from pid: hand
     * it over to the socket at path and stop. Set by main(); NULL: refused. */
    int (*takeover)(struct gd_context *ctx, pid_t pid, const char *path, gd_err *err);
    /* Holders were queued to leave (gd_registry_holder_leave) outside a
     * connection's close: have the loop drop their references, a bounded
     * part per turn. Set by gd_daemon_init(); NULL: nobody reaps. */
    void (*want_work)(struct gd_context *ctx);
    /* The one lease timer: due at lease_armed_ns (0: not running), the
     * registry's earliest expiry or before. */
    uv_timer_t lease_timer;
    bool lease_timer_init;
    uint64_t lease_armed_ns;
} gd_context;

#define GD_EXPIRIES_PER_TURN 256u

/* No pools, limits and quotas zero: the caller sets them (gd_config_defaults()
 * or a configuration). */
void gd_context_init(gd_context *ctx, uv_loop_t *loop);
/* The context takes pool over on success: -ENOSPC beyond GPUBUF_MAX_POOLS,
 * -EEXIST for a second pool of the same name. */
int gd_context_add_pool(gd_context *ctx, gd_pool *pool);
gd_pool *gd_context_find_pool(const gd_context *ctx, const char *name);
/* The pool named name, or the first pool for NULL or "": GPUBUF_ENOPOOL
 * with a sentence in err when there is none. */
int gd_context_pool(const gd_context *ctx, const char *name, gd_pool **ret, gd_err *err);
/* Run the lease timer for the registry's earliest lease, if it is not set
 * for that time or earlier already (after an alloc, seal or renew). */
void gd_context_leases_arm(gd_context *ctx);
/* Close the lease timer (the daemon stops; the loop runs out). */
void gd_context_stop(gd_context *ctx);
/* Free the registry (every buffer goes back to its pool) and the pools.
 * No session may be left. */
void gd_context_destroy(gd_context *ctx);

#endif
