/* Session room: one item of a request, the steps a single request and each
 * item of a batch take alike. See item.h. */
#include "item.h"

#include <errno.h>
#include <stdint.h>

#include "log.h"
#include "wire.h"

/* Give back the reference an open took (read-only if read_only): its reply
 * could not be made. */
void gd_session_open_undo(gd_session *s, const gd_buf *b, bool read_only) {
    uint64_t bid = b->id;
    if (read_only)
        gd_registry_ref_unmark_ro(s->holder, bid);
    gd_registry_release(&s->ctx->reg, s->holder, bid, NULL);
}

/* Allocate one buffer from pool (alloc and batch alloc); failures the
 * operator should see are logged. */
int gd_session_alloc_one(gd_session *s, gd_pool *pool, uint64_t size, uint32_t alignment,
                         const char *name, const gd_meta_args *meta, gd_buf **ret, gd_err *err) {
    int r = gd_registry_alloc_meta(&s->ctx->reg, s->holder, pool, size, alignment, name, meta, ret,
                                   err);
    if (r < 0 && r != -EEXIST && r != -EACCES && r != -EPERM && r != GPUBUF_ENOPOOL)
        LOG_LIMITED(GPUBUF_LOG_INFO, "pid %d: alloc %llu bytes from '%s': %s", (int)s->pid,
                    (unsigned long long)size, pool->name, gd_err_msg(err, r));
    return r;
}

/* The target of an open, stat or delete: a name or id, the pool the
 * request names (empty: none) and the owner it expects. 0, or an error
 * (GPUBUF_ENOPOOL) with its sentence in err. */
int gd_session_target(gd_session *s, bool by_name, const char *name, uint64_t bid, const char *pool,
                      bool has_owner, uint32_t owner_uid, gd_target *t, gd_err *err) {
    memset(t, 0, sizeof(*t));
    if (by_name)
        t->name = name;
    else
        t->id = bid;
    t->has_owner = has_owner;
    t->owner_uid = owner_uid;
    if (pool && *pool)
        return gd_context_pool(s->ctx, pool, &t->pool, err);
    return 0;
}

/* Release one reference (release and batch release). */
int gd_session_release_one(gd_session *s, uint64_t bid, bool keep, bool read_only, gd_err *err) {
    if (read_only)
        gd_registry_ref_unmark_ro(s->holder, bid);
    if (keep && !(s->caps & GPUBUF_CAP_KEEP_MAPPED)) {
        /* Still release: the reference is not the client's to keep. */
        gd_registry_release(&s->ctx->reg, s->holder, bid, NULL);
        return gd_err_set(err, GPUBUF_EPROTOCOL, "keep_mapped without the KEEP_MAPPED capability");
    }
    return gd_registry_release_keep(&s->ctx->reg, s->holder, bid, keep, err);
}
