#include "registry.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

__attribute__((format(printf, 3, 4))) static int fail(gpubuf_registry *r, int code,
                                                  const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->last_error, sizeof(r->last_error), fmt, ap);
    va_end(ap);
    return code;
}

void gpubuf_registry_init(gpubuf_registry *r) {
    memset(r, 0, sizeof(*r));
}

static void waiter_unlink(gpubuf_registry *r, gpubuf_waiter *w);

/* Answer the waiters for buffer id with err: it can never be sealed now. */
static void fail_id_waiters(gpubuf_registry *r, uint64_t id, int err) {
    gpubuf_waiter *w = r->waiters, *next;
    for (; w; w = next) {
        next = w->next;
        if (w->name || w->buffer_id != id)
            continue;
        waiter_unlink(r, w);
        if (w->fail)
            w->fail(w, err);
        else
            w->cancel(w);
    }
}

static gpubuf_uid_usage *uid_usage(gpubuf_registry *r, uid_t uid, bool create) {
    gpubuf_uid_usage *u;
    HASH_FIND(hh, r->uids, &uid, sizeof(uid), u);
    if (!u && create && (u = calloc(1, sizeof(*u)))) {
        u->uid = uid;
        HASH_ADD(hh, r->uids, uid, sizeof(u->uid), u);
    }
    return u;
}

/* Give back what b counted against its creator and its owner's uid. */
static void uncharge(gpubuf_registry *r, gpubuf_buf *b) {
    gpubuf_holder *h;
    uid_t uid = (uid_t)b->owner_uid;
    gpubuf_uid_usage *u = uid_usage(r, uid, false);
    HASH_FIND(hh, r->holders, &b->owner_holder, sizeof(b->owner_holder), h);
    if (h) {
        h->n_owned--;
        h->owned_bytes -= b->charged;
    }
    if (u) {
        u->buffers--;
        u->bytes -= b->charged;
        if (u->buffers == 0) {
            HASH_DEL(r->uids, u);
            free(u);
        }
    }
}

static void buf_free(gpubuf_registry *r, gpubuf_buf *b) {
    uncharge(r, b);
    if (b->state != GPUBUF_STATE_SEALED)
        fail_id_waiters(r, b->id, -ENOENT);
    HASH_DELETE(hh_id, r->by_id, b);
    if (b->in_name_index)
        HASH_DELETE(hh_name, r->by_name, b);
    gpubuf_pool_release(b->pool, &b->blk);
    r->n_buffers--;
    r->freed_buffers++;
    free(b->name);
    free(b);
}

/* Free b when nothing can reach it any more. Named sealed buffers persist
 * without references until deleted; everything else goes with its last one. */
static void buf_maybe_free(gpubuf_registry *r, gpubuf_buf *b) {
    if (b->refs == 0 && (b->state != GPUBUF_STATE_SEALED || !b->name))
        buf_free(r, b);
}

static void waiter_unlink(gpubuf_registry *r, gpubuf_waiter *w) {
    if (w->prev)
        w->prev->next = w->next;
    else
        r->waiters = w->next;
    if (w->next)
        w->next->prev = w->prev;
    if (w->hprev)
        w->hprev->hnext = w->hnext;
    else
        w->holder->waiters = w->hnext;
    if (w->hnext)
        w->hnext->hprev = w->hprev;
    w->next = w->prev = w->hnext = w->hprev = NULL;
    r->n_waiters--;
}

static int holder_slab_get(gpubuf_holder *h, gpubuf_slab *slab) {
    gpubuf_holder_slab *hs;
    HASH_FIND(hh, h->slabs, &slab->id, sizeof(slab->id), hs);
    if (!hs) {
        if (!(hs = calloc(1, sizeof(*hs))))
            return -ENOMEM;
        hs->slab_id = slab->id;
        hs->slab = slab;
        HASH_ADD(hh, h->slabs, slab_id, sizeof(hs->slab_id), hs);
    }
    hs->buffers++;
    return 0;
}

static void holder_slab_put(gpubuf_holder *h, uint64_t slab_id) {
    gpubuf_holder_slab *hs;
    HASH_FIND(hh, h->slabs, &slab_id, sizeof(slab_id), hs);
    if (hs && --hs->buffers == 0 && !hs->kept) {
        HASH_DEL(h->slabs, hs);
        free(hs);
    }
}

/* The holder goes: unpin what it kept (after its references are dropped,
 * so that an emptied slab can go). */
static void holder_slabs_clear(gpubuf_holder *h) {
    gpubuf_holder_slab *hs, *tmp;
    HASH_ITER(hh, h->slabs, hs, tmp) {
        HASH_DEL(h->slabs, hs);
        if (hs->kept)
            gpubuf_pool_unpin(hs->slab->pool, hs->slab);
        free(hs);
    }
    h->n_kept = 0;
}

void gpubuf_registry_destroy(gpubuf_registry *r) {
    gpubuf_holder *h, *htmp;
    gpubuf_buf *b, *btmp;
    HASH_ITER(hh, r->holders, h, htmp) {
        while (h->waiters) {
            gpubuf_waiter *w = h->waiters;
            waiter_unlink(r, w);
            w->cancel(w);
        }
        gpubuf_ref *ref, *rtmp;
        HASH_ITER(hh, h->refs, ref, rtmp) {
            HASH_DEL(h->refs, ref);
            free(ref);
        }
        holder_slabs_clear(h);
        HASH_DEL(r->holders, h);
        free(h);
    }
    HASH_ITER(hh_id, r->by_id, b, btmp) {
        b->refs = 0;
        buf_free(r, b);
    }
    HASH_CLEAR(hh_name, r->by_name);
    gpubuf_uid_usage *u, *utmp;
    HASH_ITER(hh, r->uids, u, utmp) {
        HASH_DEL(r->uids, u);
        free(u);
    }
}

gpubuf_holder *gpubuf_registry_holder_new(gpubuf_registry *r, pid_t pid, uid_t uid, gid_t gid) {
    gpubuf_holder *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->id = ++r->next_holder_id;
    h->pid = pid;
    h->uid = uid;
    h->gid = gid;
    HASH_ADD(hh, r->holders, id, sizeof(h->id), h);
    return h;
}

gpubuf_buf *gpubuf_registry_find_id(gpubuf_registry *r, uint64_t id) {
    gpubuf_buf *b;
    HASH_FIND(hh_id, r->by_id, &id, sizeof(id), b);
    return b;
}

gpubuf_buf *gpubuf_registry_find_name(gpubuf_registry *r, const char *name) {
    gpubuf_buf *b;
    HASH_FIND(hh_name, r->by_name, name, strlen(name), b);
    return b;
}

static gpubuf_ref *ref_find(gpubuf_holder *h, uint64_t id) {
    gpubuf_ref *ref;
    HASH_FIND(hh, h->refs, &id, sizeof(id), ref);
    return ref;
}

uint32_t gpubuf_registry_holder_count(gpubuf_holder *h, uint64_t buffer_id) {
    gpubuf_ref *ref = ref_find(h, buffer_id);
    return ref ? ref->count : 0;
}

static int ref_add(gpubuf_holder *h, gpubuf_buf *b) {
    gpubuf_ref *ref = ref_find(h, b->id);
    if (h->n_refs == UINT32_MAX || b->refs == UINT32_MAX)
        return -EOVERFLOW;
    if (!ref) {
        if (holder_slab_get(h, b->blk.slab) < 0)
            return -ENOMEM;
        ref = calloc(1, sizeof(*ref));
        if (!ref) {
            holder_slab_put(h, b->blk.slab->id);
            return -ENOMEM;
        }
        ref->buffer_id = b->id;
        HASH_ADD(hh, h->refs, buffer_id, sizeof(ref->buffer_id), ref);
    }
    ref->count++;
    h->n_refs++;
    b->refs++;
    return 0;
}

int gpubuf_registry_alloc(gpubuf_registry *r, gpubuf_holder *h, gpubuf_pool *pool, uint64_t size,
                          uint64_t align, const char *name, gpubuf_buf **ret) {
    gpubuf_buf *b;
    int rc;
    if (name && *name) {
        size_t len = strlen(name);
        if (len > GPUBUF_NAME_MAX)
            return fail(r, -ENAMETOOLONG, "name longer than %d bytes", GPUBUF_NAME_MAX);
        if (!gpubuf_name_valid(name, len))
            return fail(r, -EINVAL, "invalid name '%s' (allowed: A-Z a-z 0-9 . _ : / @ + -)",
                        name);
        if (gpubuf_registry_find_name(r, name))
            return fail(r, -EEXIST, "a buffer named '%s' exists", name);
    } else {
        name = NULL;
    }
    if (size == 0)
        return fail(r, -EINVAL, "size must be at least 1 byte");
    const gpubuf_quota *q = &r->quota;
    gpubuf_uid_usage *u = uid_usage(r, h->uid, false);
    /* What the pool will take: the size rounded to the pool's alignment. */
    uint64_t charge = size > UINT64_MAX / 2 ? size : gpubuf_align_up(size, pool->be->alignment);
    if (q->buffers_per_client && h->n_owned >= q->buffers_per_client)
        return fail(r, -EDQUOT, "quota: this client owns %u buffers (limit %u)", h->n_owned,
                    q->buffers_per_client);
    if (q->bytes_per_client && (charge > q->bytes_per_client ||
                                h->owned_bytes > q->bytes_per_client - charge))
        return fail(r, -EDQUOT, "quota: %llu more bytes exceed this client's limit of %llu",
                    (unsigned long long)charge, (unsigned long long)q->bytes_per_client);
    if (u && q->buffers_per_uid && u->buffers >= q->buffers_per_uid)
        return fail(r, -EDQUOT, "quota: uid %u owns %u buffers (limit %u)", (unsigned)h->uid,
                    u->buffers, q->buffers_per_uid);
    if (q->bytes_per_uid &&
        (charge > q->bytes_per_uid || (u && u->bytes > q->bytes_per_uid - charge)))
        return fail(r, -EDQUOT, "quota: %llu more bytes exceed uid %u's limit of %llu",
                    (unsigned long long)charge, (unsigned)h->uid,
                    (unsigned long long)q->bytes_per_uid);
    if (q->refs_per_client && h->n_refs >= q->refs_per_client)
        return fail(r, -EDQUOT, "quota: this client holds %u references (limit %u)", h->n_refs,
                    q->refs_per_client);
    if (!(u = uid_usage(r, h->uid, true)))
        return fail(r, -ENOMEM, "out of memory");
    b = calloc(1, sizeof(*b));
    if (!b)
        return fail(r, -ENOMEM, "out of memory");
    if (name && !(b->name = strdup(name))) {
        free(b);
        return fail(r, -ENOMEM, "out of memory");
    }
    gpubuf_slab *prefer[GPUBUF_PREFER_SLABS];
    uint32_t n_prefer = 0;
    gpubuf_holder_slab *hs, *hstmp;
    HASH_ITER(hh, h->slabs, hs, hstmp) {
        if (n_prefer == GPUBUF_PREFER_SLABS)
            break;
        if (hs->slab->pool == pool && !hs->slab->dedicated)
            prefer[n_prefer++] = hs->slab;
    }
    rc = gpubuf_pool_alloc_prefer(pool, size, align, prefer, n_prefer, &b->blk);
    if (rc < 0) {
        fail(r, rc, "%s", pool->last_error[0] ? pool->last_error : "allocation failed");
        free(b->name);
        free(b);
        if (u->buffers == 0) {
            HASH_DEL(r->uids, u);
            free(u);
        }
        return rc;
    }
    b->id = ++r->next_buffer_id;
    b->pool = pool;
    b->size = size;
    b->state = GPUBUF_STATE_ALLOCATED;
    b->owner_uid = (uint32_t)h->uid;
    b->owner_holder = h->id;
    HASH_ADD(hh_id, r->by_id, id, sizeof(b->id), b);
    if (b->name) {
        HASH_ADD_KEYPTR(hh_name, r->by_name, b->name, strlen(b->name), b);
        b->in_name_index = true;
    }
    r->n_buffers++;
    /* Charge what the pool took (alignment included), not what was asked. */
    b->charged = b->blk.size;
    h->n_owned++;
    h->owned_bytes += b->charged;
    u->buffers++;
    u->bytes += b->charged;
    if (ref_add(h, b) < 0) {
        buf_free(r, b);
        return fail(r, -ENOMEM, "out of memory");
    }
    *ret = b;
    return 0;
}

static bool waiter_matches(const gpubuf_waiter *w, const gpubuf_buf *b) {
    if (w->name)
        return b->name && strcmp(w->name, b->name) == 0;
    return w->buffer_id == b->id;
}

int gpubuf_registry_seal(gpubuf_registry *r, gpubuf_holder *h, uint64_t id, gpubuf_buf **ret) {
    return gpubuf_registry_seal_event(r, h, id, NULL, ret);
}

const uint8_t *gpubuf_registry_event(gpubuf_registry *r, const gpubuf_buf *b) {
    gpubuf_holder *h;
    if (!b->has_event)
        return NULL;
    HASH_FIND(hh, r->holders, &b->event_holder, sizeof(b->event_holder), h);
    return h ? b->event : NULL;
}

void gpubuf_registry_ref_ro(gpubuf_holder *h, uint64_t id, bool add) {
    gpubuf_ref *ref = ref_find(h, id);
    if (!ref)
        return;
    if (add && ref->ro < ref->count) {
        ref->ro++;
        h->n_ro_refs++;
    } else if (!add && ref->ro > 0) {
        ref->ro--;
        h->n_ro_refs--;
    }
}

int gpubuf_registry_seal_event(gpubuf_registry *r, gpubuf_holder *h, uint64_t id,
                               const uint8_t *event, gpubuf_buf **ret) {
    gpubuf_buf *b = gpubuf_registry_find_id(r, id);
    if (!b)
        return fail(r, -ENOENT, "no buffer with id %llu", (unsigned long long)id);
    if (b->owner_holder != h->id)
        return fail(r, -EPERM, "buffer %llu was allocated by another client",
                    (unsigned long long)id);
    if (b->state != GPUBUF_STATE_ALLOCATED)
        return fail(r, GPUBUF_ESTATE, "buffer %llu is already %s", (unsigned long long)id,
                    b->state == GPUBUF_STATE_SEALED ? "sealed" : "deleted");
    if (event && b->pool->be->kind == GPUBUF_POOL_HOST)
        return fail(r, -EINVAL, "buffer %llu is in host pool '%s': a stream-ordered seal needs "
                    "a CUDA pool (seal without an event)", (unsigned long long)id, b->pool->name);
    if (event) {
        memcpy(b->event, event, GPUBUF_EVENT_HANDLE_SIZE);
        b->has_event = true;
        b->event_holder = h->id;
    }
    b->state = GPUBUF_STATE_SEALED;
    /* Wake waiters for this name or id. Each gets its own reference. */
    gpubuf_waiter *w = r->waiters, *next;
    for (; w; w = next) {
        next = w->next;
        if (!waiter_matches(w, b))
            continue;
        if (r->quota.refs_per_client && w->holder->n_refs >= r->quota.refs_per_client) {
            waiter_unlink(r, w);
            if (w->fail)
                w->fail(w, -EDQUOT);
            else
                w->cancel(w);
            continue;
        }
        if (ref_add(w->holder, b) < 0)
            continue; /* out of memory: the waiter times out */
        waiter_unlink(r, w);
        /* The callback may free w (but not other waiters). */
        w->wake(w, b);
    }
    *ret = b;
    return 0;
}

int gpubuf_registry_open(gpubuf_registry *r, gpubuf_holder *h, const char *name, uint64_t id,
                         gpubuf_buf **ret) {
    gpubuf_buf *b;
    if (name) {
        b = gpubuf_registry_find_name(r, name);
        if (!b)
            return fail(r, -ENOENT, "no buffer named '%s'", name);
    } else {
        b = gpubuf_registry_find_id(r, id);
        if (!b)
            return fail(r, -ENOENT, "no buffer with id %llu", (unsigned long long)id);
    }
    if (b->state == GPUBUF_STATE_DELETED)
        return fail(r, -ENOENT, "buffer %llu was deleted", (unsigned long long)b->id);
    if (b->state != GPUBUF_STATE_SEALED)
        return fail(r, -ENOENT, "buffer %llu is not sealed yet", (unsigned long long)b->id);
    if (r->quota.refs_per_client && h->n_refs >= r->quota.refs_per_client)
        return fail(r, -EDQUOT, "quota: this client holds %u references (limit %u)", h->n_refs,
                    r->quota.refs_per_client);
    int rc = ref_add(h, b);
    if (rc < 0)
        return fail(r, rc, rc == -EOVERFLOW ? "reference count limit" : "out of memory");
    *ret = b;
    return 0;
}

int gpubuf_registry_release(gpubuf_registry *r, gpubuf_holder *h, uint64_t id) {
    return gpubuf_registry_release_keep(r, h, id, false);
}

int gpubuf_registry_release_keep(gpubuf_registry *r, gpubuf_holder *h, uint64_t id, bool keep) {
    gpubuf_ref *ref = ref_find(h, id);
    gpubuf_buf *b;
    int rc = 0;
    if (!ref)
        return fail(r, GPUBUF_ENOTHELD, "this client holds no reference to buffer %llu",
                    (unsigned long long)id);
    b = gpubuf_registry_find_id(r, id);
    if (keep && b) {
        /* Pin before the block may go: the slab must outlive it. */
        gpubuf_holder_slab *hs;
        gpubuf_slab *sl = b->blk.slab;
        HASH_FIND(hh, h->slabs, &sl->id, sizeof(sl->id), hs);
        if (sl->dedicated)
            rc = fail(r, -EINVAL, "slab %llu is dedicated to one buffer: it cannot be kept",
                      (unsigned long long)sl->id);
        else if (hs && !hs->kept && h->n_kept >= h->kept_cap)
            rc = fail(r, -EDQUOT, "quota: this client keeps %u slabs mapped (limit %u)",
                      h->n_kept, h->kept_cap);
        else if (hs && !hs->kept) {
            hs->kept = true;
            h->n_kept++;
            gpubuf_pool_pin(sl);
        }
    }
    if (ref->ro > ref->count - 1) { /* the last one goes: so do its marks */
        ref->ro--;
        h->n_ro_refs--;
    }
    if (--ref->count == 0) {
        HASH_DEL(h->refs, ref);
        free(ref);
        if (b)
            holder_slab_put(h, b->blk.slab->id);
    }
    h->n_refs--;
    if (b) {
        b->refs--;
        buf_maybe_free(r, b);
    }
    return rc;
}

int gpubuf_registry_unmap(gpubuf_registry *r, gpubuf_holder *h, uint64_t slab_id) {
    gpubuf_holder_slab *hs;
    HASH_FIND(hh, h->slabs, &slab_id, sizeof(slab_id), hs);
    if (!hs || !hs->kept)
        return fail(r, GPUBUF_ENOTHELD, "this client keeps no slab %llu mapped",
                    (unsigned long long)slab_id);
    gpubuf_slab *sl = hs->slab;
    hs->kept = false;
    h->n_kept--;
    if (hs->buffers == 0) {
        HASH_DEL(h->slabs, hs);
        free(hs);
    }
    gpubuf_pool_unpin(sl->pool, sl);
    return 0;
}

int gpubuf_registry_delete(gpubuf_registry *r, gpubuf_holder *h, const char *name, uint64_t id) {
    gpubuf_buf *b = name ? gpubuf_registry_find_name(r, name) : gpubuf_registry_find_id(r, id);
    if (!b || b->state == GPUBUF_STATE_DELETED) {
        if (name)
            return fail(r, -ENOENT, "no buffer named '%s'", name);
        return fail(r, -ENOENT, "no buffer with id %llu", (unsigned long long)id);
    }
    if (h->uid != 0 && h->uid != b->owner_uid)
        return fail(r, -EPERM, "buffer %llu belongs to uid %u", (unsigned long long)b->id,
                    b->owner_uid);
    if (b->state == GPUBUF_STATE_ALLOCATED)
        fail_id_waiters(r, b->id, -ENOENT);
    b->state = GPUBUF_STATE_DELETED;
    if (b->in_name_index) {
        HASH_DELETE(hh_name, r->by_name, b);
        b->in_name_index = false;
    }
    buf_maybe_free(r, b);
    return 0;
}

void gpubuf_registry_wait(gpubuf_registry *r, gpubuf_waiter *w) {
    gpubuf_holder *h = w->holder;
    w->prev = NULL;
    w->next = r->waiters;
    if (r->waiters)
        r->waiters->prev = w;
    r->waiters = w;
    w->hprev = NULL;
    w->hnext = h->waiters;
    if (h->waiters)
        h->waiters->hprev = w;
    h->waiters = w;
    r->n_waiters++;
}

void gpubuf_registry_unwait(gpubuf_registry *r, gpubuf_waiter *w) {
    waiter_unlink(r, w);
}

void gpubuf_registry_holder_drop(gpubuf_registry *r, gpubuf_holder *h) {
    gpubuf_ref *ref, *rtmp;
    while (h->waiters) {
        gpubuf_waiter *w = h->waiters;
        waiter_unlink(r, w);
        w->cancel(w);
    }
    HASH_ITER(hh, h->refs, ref, rtmp) {
        gpubuf_buf *b = gpubuf_registry_find_id(r, ref->buffer_id);
        HASH_DEL(h->refs, ref);
        if (b) {
            b->refs -= ref->count;
            /* Allocated by this client and never sealed: nobody else can
             * ever reach it. */
            if (b->state == GPUBUF_STATE_ALLOCATED && b->owner_holder == h->id) {
                b->state = GPUBUF_STATE_DELETED;
                if (b->in_name_index) {
                    HASH_DELETE(hh_name, r->by_name, b);
                    b->in_name_index = false;
                }
            }
            buf_maybe_free(r, b);
        }
        free(ref);
    }
    holder_slabs_clear(h);
    HASH_DEL(r->holders, h);
    free(h);
}
