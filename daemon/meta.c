/* Registry room, continued: what a buffer carries besides its bytes (array
 * layout, user bytes) and its lease. Leases live in a binary min-heap by
 * expiry (the heap and freeing metadata are registry.c's, which frees
 * buffers): adding, renewing and removing one cost O(log n), and the
 * daemon's one lease timer (context.c) waits for the heap's top. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "registry.h"
#include "util.h"

#define NS_PER_MS 1000000ull

/* Give b a lease of ttl_ms from now (replacing one it has). */
static int lease_set(gd_registry *r, gd_buf *b, uint64_t ttl_ms) {
    return gd_lease_set_at(r, b, ttl_ms, gpubuf_now_ns() + ttl_ms * NS_PER_MS);
}

uint64_t gd_registry_next_expiry(const gd_registry *r) {
    return r->n_leases ? r->leases[0]->lease_expires_ns : 0;
}

uint64_t gd_registry_lease_left_ms(const gd_buf *b, uint64_t now_ns) {
    if (!b->lease_slot)
        return 0;
    if (b->lease_expires_ns <= now_ns)
        return 1; /* due: the timer runs next */
    return (b->lease_expires_ns - now_ns + NS_PER_MS - 1) / NS_PER_MS;
}

uint32_t gd_registry_expire(gd_registry *r, uint64_t now_ns, uint32_t max) {
    uint32_t n = 0;
    while (n < max && r->n_leases && r->leases[0]->lease_expires_ns <= now_ns) {
        gd_buf *b = r->leases[0];
        gd_lease_remove(r, b);
        r->leases_expired++;
        n++;
        /* Like a delete: the name goes now, the memory with the last
         * reference (b may be freed here). */
        gd_registry_unpublish(r, b);
    }
    return n;
}

static int check_ttl(const gd_registry *r, uint64_t ttl_ms, gd_err *err) {
    uint64_t max = r->quota.max_lease_ms ? r->quota.max_lease_ms : UINT32_MAX;
    if (ttl_ms > max)
        return gd_err_set(err, -EINVAL,
                          "lease of %llu ms exceeds the daemon's max_lease_ms of %llu ms",
                          (unsigned long long)ttl_ms, (unsigned long long)max);
    return 0;
}

/* ---- layout and user bytes ----------------------------------------------- */

/* A new gd_meta of what args give for a buffer of size bytes (*ret NULL when
 * they give nothing); -EINVAL with the reason. */
static int meta_build(const gd_meta_args *a, uint64_t size, gd_meta **ret, gd_err *err) {
    const gpubuf_layout *l = a->layout;
    *ret = NULL;
    if (a->user_len > GPUBUF_USER_DATA_MAX)
        return gd_err_set(err, -EINVAL, "%zu user bytes: a buffer carries at most %d",
                          a->user_len, GPUBUF_USER_DATA_MAX);
    if (l) {
        gd_err e;
        int rc = gpubuf_layout_validate(l, size, e.msg, sizeof(e.msg));
        if (rc < 0)
            return gd_err_set(err, rc, "%s", e.msg);
    }
    if (!l && !a->user_len)
        return 0;
    size_t dims = l ? l->ndim * (l->has_strides ? 2u : 1u) : 0;
    gd_meta *m = malloc(sizeof(*m) + dims * sizeof(int64_t) + a->user_len);
    if (!m)
        return gd_err_set(err, -ENOMEM, "out of memory");
    memset(m, 0, sizeof(*m));
    if (l) {
        m->has_layout = true;
        m->dtype = l->dtype;
        m->ndim = (uint8_t)l->ndim;
        m->has_strides = l->has_strides != 0;
        m->byte_offset = l->byte_offset;
        memcpy(m->dims, l->shape, l->ndim * sizeof(int64_t));
        if (l->has_strides)
            memcpy(m->dims + l->ndim, l->strides, l->ndim * sizeof(int64_t));
    }
    m->user_len = (uint32_t)a->user_len;
    if (a->user_len)
        memcpy((uint8_t *)(m->dims + dims), a->user, a->user_len);
    *ret = m;
    return 0;
}

/* b's metadata becomes m (it had none), counted for the status columns. */
static void meta_attach(gd_registry *r, gd_buf *b, gd_meta *m) {
    b->meta = m;
    if (!m)
        return;
    r->n_layouts += m->has_layout;
    r->layout_dims += m->has_layout ? m->ndim : 0;
    r->n_user_meta += m->user_len != 0;
}


/* b's metadata becomes what args give, keeping what they leave out. */
static int meta_merge(gd_registry *r, gd_buf *b, const gd_meta_args *a, gd_err *err) {
    gd_meta_args full = *a;
    gpubuf_layout old;
    size_t old_len = 0;
    const uint8_t *old_user = gd_meta_user(b, &old_len);
    if (!full.layout && gd_meta_layout(b, &old))
        full.layout = &old;
    if (!full.user_len) {
        full.user = old_user;
        full.user_len = old_len;
    }
    gd_meta *m;
    int rc = meta_build(&full, b->size, &m, err);
    if (rc < 0)
        return rc;
    uint64_t now = gd_meta_bytes(b->meta), next = gd_meta_bytes(m);
    if (next > now) {
        gd_holder *h;
        HASH_FIND(hh, r->holders, &b->owner_holder, sizeof(b->owner_holder), h);
        if (h && (rc = gd_registry_check_meta(r, h, next - now, err)) < 0) {
            free(m);
            return rc;
        }
    }
    gd_meta_free(r, b);
    meta_attach(r, b, m);
    gd_registry_charge_meta(r, b, b->meta_charged - now + next);
    return 0;
}

bool gd_meta_layout(const gd_buf *b, gpubuf_layout *ret) {
    const gd_meta *m = b->meta;
    if (!m || !m->has_layout)
        return false;
    memset(ret, 0, sizeof(*ret));
    ret->dtype = m->dtype;
    ret->ndim = m->ndim;
    ret->byte_offset = m->byte_offset;
    memcpy(ret->shape, m->dims, m->ndim * sizeof(int64_t));
    ret->has_strides = m->has_strides;
    if (m->has_strides)
        memcpy(ret->strides, m->dims + m->ndim, m->ndim * sizeof(int64_t));
    else
        gpubuf_layout_compact_strides(ret, ret->strides);
    return true;
}

const uint8_t *gd_meta_user(const gd_buf *b, size_t *ret_len) {
    const gd_meta *m = b->meta;
    *ret_len = m ? m->user_len : 0;
    if (!m || !m->user_len)
        return NULL;
    size_t dims = m->has_layout ? m->ndim * (m->has_strides ? 2u : 1u) : 0;
    return (const uint8_t *)(m->dims + dims);
}

/* ---- requests ------------------------------------------------------------- */

int gd_registry_alloc_meta(gd_registry *r, gd_holder *h, gd_pool *pool, uint64_t size,
                           uint64_t align, const char *name, const gd_meta_args *meta,
                           gd_buf **ret, gd_err *err) {
    gd_meta *m = NULL;
    gd_buf *b;
    int rc;
    if (meta && size > 0) {
        if ((rc = check_ttl(r, meta->ttl_ms, err)) < 0 ||
            (rc = meta_build(meta, size, &m, err)) < 0)
            return rc;
    }
    rc = gd_registry_alloc_charged(r, h, pool, size, align, name, gd_meta_bytes(m), &b, err);
    if (rc < 0) {
        free(m);
        return rc;
    }
    meta_attach(r, b, m);
    if (meta && meta->ttl_ms && lease_set(r, b, meta->ttl_ms) < 0) {
        gd_registry_unpublish(r, b); /* unsealed: nobody else can hold it */
        gd_registry_release(r, h, b->id, NULL);
        return gd_err_set(err, -ENOMEM, "out of memory");
    }
    if (m || (meta && meta->ttl_ms))
        gd_registry_changed(r, b); /* the alloc's record had neither */
    *ret = b;
    return 0;
}

int gd_registry_seal_meta(gd_registry *r, gd_holder *h, uint64_t id, const uint8_t *event,
                          const gd_meta_args *meta, gd_buf **ret, gd_err *err) {
    gd_buf *b = gd_registry_find_id(r, id);
    int rc;
    /* What the seal itself refuses is refused before the metadata changes. */
    if (!meta || !b || b->owner_holder != h->id || b->state != GPUBUF_STATE_ALLOCATED ||
        (event && b->pool->be->kind == GPUBUF_POOL_HOST))
        return gd_registry_seal_event(r, h, id, event, ret, err);
    if ((rc = check_ttl(r, meta->ttl_ms, err)) < 0)
        return rc;
    /* The lease's room first: once the metadata is merged, nothing may
     * fail (an error then left the buffer changed, and the change out of
     * the journal). */
    if (meta->ttl_ms && gd_lease_reserve(r) < 0)
        return gd_err_set(err, -ENOMEM, "out of memory");
    if ((meta->layout || meta->user_len) && (rc = meta_merge(r, b, meta, err)) < 0)
        return rc;
    if (meta->ttl_ms)
        (void)lease_set(r, b, meta->ttl_ms); /* its room is reserved: cannot fail */
    return gd_registry_seal_event(r, h, id, event, ret, err);
}

int gd_registry_renew(gd_registry *r, gd_holder *h, const gd_target *t, uint64_t ttl_ms,
                      gd_buf **ret, gd_err *err) {
    gd_buf *b;
    int rc = gd_registry_find_owned(r, h, t, "renew its lease", &b, err);
    if (rc < 0)
        return rc;
    if (ttl_ms == 0 && !b->lease_slot)
        return gd_err_set(err, -EINVAL,
                          "buffer %llu has no lease: renew it with a time to live",
                          (unsigned long long)b->id);
    if ((rc = check_ttl(r, ttl_ms, err)) < 0)
        return rc;
    if (lease_set(r, b, ttl_ms ? ttl_ms : b->lease_ttl_ms) < 0)
        return gd_err_set(err, -ENOMEM, "out of memory");
    r->leases_renewed++;
    gd_registry_changed(r, b);
    *ret = b;
    return 0;
}

int gd_registry_restore_meta(gd_registry *r, gd_buf *b, const gd_meta_args *a,
                             uint64_t expires_ns, gd_err *err) {
    gd_meta *m;
    int rc = meta_build(a, b->size, &m, err);
    if (rc < 0)
        return rc;
    if (a->ttl_ms > UINT32_MAX)
        rc = gd_err_set(err, -EINVAL, "lease of %llu ms", (unsigned long long)a->ttl_ms);
    else if (a->ttl_ms && b->state == GPUBUF_STATE_DELETED)
        rc = gd_err_set(err, -EINVAL, "a lease on a deleted buffer");
    if (rc < 0) {
        free(m);
        return rc;
    }
    meta_attach(r, b, m);
    /* Charged to its owner as an alloc's, never refused: a restart keeps
     * what the daemon accepted before it. */
    gd_registry_charge_meta(r, b, b->meta_charged + gd_meta_bytes(m));
    if (a->ttl_ms) {
        /* A deadline further than its time to live is not one this daemon
         * wrote: it expires within its time to live from now. */
        uint64_t latest = gpubuf_now_ns() + a->ttl_ms * NS_PER_MS;
        if (gd_lease_set_at(r, b, a->ttl_ms, expires_ns < latest ? expires_ns : latest) < 0) {
            gd_meta_free(r, b);
            return gd_err_set(err, -ENOMEM, "out of memory");
        }
    }
    return 0;
}
