/* Registry room, continued: what a request names (gd_target) found and
 * then opened (a reference taken), described (stat) or deleted, with the
 * sentence that says why not, and the pools worth a hint. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry_internal.h"
#include "util.h"

int gd_registry_open(gd_registry *r, gd_holder *h, const char *name, uint64_t id, gd_buf **ret,
                     bool *ret_waitable, gd_err *err) {
    return gd_registry_open_mode(r, h, name, id, false, ret, ret_waitable, err);
}

int gd_registry_open_mode(gd_registry *r, gd_holder *h, const char *name, uint64_t id,
                          bool read_only, gd_buf **ret, bool *ret_waitable, gd_err *err) {
    gd_target t = {.name = name, .id = id};
    return gd_registry_open_target(r, h, &t, read_only, ret, ret_waitable, err);
}

/* Find what t names: 0 with *ret the buffer, or NULL when none is there
 * (a name unknown in its pool, an unknown id, an id of another pool).
 * Refuses a bad name, a missing default pool, a pool h may not use (when
 * h is given: open), and another owner. */
static int resolve(gd_registry *r, const gd_holder *h, const gd_target *t, gd_buf **ret,
                   gd_err *err) {
    gd_pool *pool = t->pool;
    gd_buf *b = NULL;
    int rc;
    if (t->name) {
        /* A bad name is refused before anything else, but the registry
         * holds good names only (checked when given and when restored), so
         * the name is checked only where it is not found. A pool this
         * client may not use is not searched: the refusal does not depend
         * on whether the name exists there. */
        if (!pool)
            pool = r->default_pool;
        rc = pool && h ? gd_registry_check_pool(h, pool, err) : 0;
        if (pool && rc == 0)
            b = gd_registry_find_pool_name(r, pool, t->name);
        if (!b) {
            int rn = gd_registry_check_name(t->name, err);
            if (rn < 0)
                return rn;
            if (!pool)
                return gd_err_set(err, GPUBUF_ENOPOOL, "the daemon has no pools");
            if (rc < 0)
                return rc;
        }
    } else {
        if (h && pool && (rc = gd_registry_check_pool(h, pool, err)) < 0)
            return rc;
        b = gd_registry_find_id(r, t->id);
        if (b && pool && b->pool != pool)
            b = NULL;
        /* Refused before anything else: a buffer of a pool this client
         * may not use is not opened (nor waited for), whatever its state. */
        if (b && h && (rc = gd_registry_check_pool(h, b->pool, err)) < 0)
            return rc;
    }
    if (b && (rc = gd_registry_check_owner(t->has_owner, t->owner_uid, b, err)) < 0)
        return rc;
    *ret = b;
    return 0;
}

/* -ENOENT for a target that names nothing (live) in its pool. */
static int not_found(gd_registry *r, const gd_target *t, gd_err *err) {
    const gd_pool *pool = t->pool ? t->pool : r->default_pool;
    if (t->name)
        return gd_err_set(err, -ENOENT, "no buffer named '%s' in pool '%s'%s", t->name,
                          pool ? pool->name : "", t->pool ? "" : " (the default pool)");
    if (t->pool)
        return gd_err_set(err, -ENOENT, "no buffer with id %llu in pool '%s'",
                          (unsigned long long)t->id, t->pool->name);
    return gd_err_set(err, -ENOENT, "no buffer with id %llu", (unsigned long long)t->id);
}

int gd_registry_open_target(gd_registry *r, gd_holder *h, const gd_target *t, bool read_only,
                            gd_buf **ret, bool *ret_waitable, gd_err *err) {
    gd_buf *b = NULL;
    int rc;
    bool waitable = false;
    if ((rc = resolve(r, h, t, &b, err)) < 0)
        return rc;
    if (b && read_only && (rc = gd_registry_check_read_only(b->pool, err)) < 0)
        return rc;
    if (!b) {
        /* Any name may still come; an unknown id never will. */
        waitable = t->name != NULL;
        rc = not_found(r, t, err);
    } else if (b->state == GPUBUF_STATE_DELETED) {
        rc = gd_err_set(err, -ENOENT, "buffer %llu was deleted", (unsigned long long)b->id);
    } else if (b->state != GPUBUF_STATE_SEALED) {
        waitable = true;
        rc = gd_err_set(err, -ENOENT, "buffer %llu is not sealed yet", (unsigned long long)b->id);
    }
    if (!b || b->state != GPUBUF_STATE_SEALED) {
        if (ret_waitable)
            *ret_waitable = waitable;
        return rc;
    }
    if (r->quota.refs_per_client && h->n_refs >= r->quota.refs_per_client)
        return gd_err_set(err, -EDQUOT, "quota: this client holds %u references (limit %u)", h->n_refs,
                    r->quota.refs_per_client);
    /* Read-only with its count, in one entry of the journal (marked after
     * it, the mark was never saved: a resume took it from the client). */
    rc = gd_registry_ref_add_n(r, h, b, 1, read_only ? 1 : 0);
    if (rc < 0)
        return gd_err_set(err, rc, rc == -EOVERFLOW ? "reference count limit" : "out of memory");
    *ret = b;
    return 0;
}

int gd_registry_open_one(gd_registry *r, gd_holder *h, const gd_target *t, bool read_only,
                         gd_opened *ret, bool *ret_waitable, gd_err *err) {
    gd_buf *b = NULL;
    int rc = gd_registry_open_target(r, h, t, read_only, &b, ret_waitable, err);
    if (rc == 0)
        gd_registry_opened(r, h, b, read_only, ret);
    return rc;
}

int gd_registry_delete(gd_registry *r, gd_holder *h, const char *name, uint64_t id,
                       gd_err *err) {
    gd_target t = {.name = name, .id = id};
    return gd_registry_delete_target(r, h, &t, err);
}

int gd_registry_stat(gd_registry *r, const gd_target *t, gd_buf **ret, gd_err *err) {
    gd_buf *b = NULL;
    int rc = resolve(r, NULL, t, &b, err);
    if (rc < 0)
        return rc;
    if (!b)
        return not_found(r, t, err);
    *ret = b;
    return 0;
}

void gd_registry_hint_pools(gd_registry *r, const gd_holder *h, gd_pool *const *pools, int n,
                            const gd_pool *searched, const char *name, gd_err *err) {
    if (!searched)
        searched = r->default_pool;
    for (int i = 0; i < n && err; i++) {
        gd_buf *b;
        if (pools[i] == searched || !gd_pool_allows(pools[i], h->uid, h->gid) ||
            !(b = gd_registry_find_pool_name(r, pools[i], name)))
            continue;
        size_t len = strlen(err->msg);
        snprintf(err->msg + len, sizeof(err->msg) - len,
                 "; pool '%s' has a buffer of that name (of uid %u): name the pool, as "
                 "'/%s/%s', if that is the one you want",
                 pools[i]->name, b->owner_uid, pools[i]->name, name);
        return;
    }
}

uint32_t gd_overflow_uid(void) {
    static uint32_t uid;
    if (!uid) {
        unsigned v = 65534;
        FILE *f = fopen("/proc/sys/kernel/overflowuid", "r");
        if (f) {
            if (fscanf(f, "%u", &v) != 1 || v == 0)
                v = 65534;
            fclose(f);
        }
        uid = v;
    }
    return uid;
}

int gd_registry_find_owned(gd_registry *r, gd_holder *h, const gd_target *t, const char *what,
                           gd_buf **ret, gd_err *err) {
    gd_buf *b = NULL;
    int rc = resolve(r, NULL, t, &b, err);
    if (rc < 0)
        return rc;
    if (!b || b->state == GPUBUF_STATE_DELETED)
        return not_found(r, t, err);
    /* Peers of user namespaces with no mapping in gpubufd's all show up as
     * the overflow uid: being that uid proves nothing, so a buffer owned by
     * it is its creating session's (docs/security.md, "Namespaces"). */
    if (h->uid != 0 && h->uid == b->owner_uid && b->owner_uid == gd_overflow_uid() &&
        b->owner_holder != h->id)
        return gd_err_set(err, -EPERM,
                          "buffer %llu ('%s') belongs to the overflow uid %u (a peer whose "
                          "user namespace has no mapping in gpubufd's): only the session that "
                          "made it or root may %s",
                          (unsigned long long)b->id, b->name ? b->name : "", b->owner_uid, what);
    if (h->uid != 0 && h->uid != b->owner_uid)
        return gd_err_set(err, -EPERM,
                          "buffer %llu ('%s') belongs to uid %u: only its owner or root may "
                          "%s",
                          (unsigned long long)b->id, b->name ? b->name : "", b->owner_uid, what);
    *ret = b;
    return 0;
}

int gd_registry_delete_target(gd_registry *r, gd_holder *h, const gd_target *t, gd_err *err) {
    gd_buf *b = NULL;
    int rc = gd_registry_find_owned(r, h, t, "delete it", &b, err);
    if (rc < 0)
        return rc;
    gd_registry_unpublish(r, b);
    return 0;
}
