#include "registry_internal.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utlist.h>

#include "group.h" /* gd_se_ref: reference counts straight into a request's group */
#include "util.h"

/* Spare references and buffer records kept for reuse, at most (each list);
 * sanitizer builds keep none, so a use after the drop or free is caught. */
#if defined(__SANITIZE_ADDRESS__)
#define GD_SPARES 0u
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GD_SPARES 0u
#endif
#endif
#ifndef GD_SPARES
#define GD_SPARES 4096u
#endif

int gd_registry_check_name(const char *name, gd_err *err) {
    gd_err e;
    /* The rule and its sentence are shared with the client library. */
    int r = gpubuf_name_check(name, strlen(name), e.msg, sizeof(e.msg));
    if (r < 0)
        return gd_err_set(err, r, "%s", e.msg);
    return 0;
}

int gd_registry_check_pool(const gd_holder *h, const gd_pool *pool, gd_err *err) {
    if (!gd_pool_allows(pool, h->uid, h->gid))
        return gd_err_set(err, -EACCES, "uid %u may not use pool '%s'", (unsigned)h->uid,
                          pool->name);
    return 0;
}

/* A waiter that will never be woken: tell it why (or cancel it when it
 * takes no failures). It is unlinked already. */
static void waiter_fail(gd_waiter *w, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void waiter_fail(gd_waiter *w, int code, const char *fmt, ...) {
    gd_err e = {.code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof(e.msg), fmt, ap);
    va_end(ap);
    if (w->fail)
        w->fail(w, &e);
    else
        w->cancel(w);
}

void gd_registry_init(gd_registry *r) {
    memset(r, 0, sizeof(*r));
}

static void waiter_unlink(gd_registry *r, gd_waiter *w);
static void holder_cancel_waits(gd_registry *r, gd_holder *h);

/* Answer the waiters for b's id: it can never be sealed now. */
static void fail_id_waiters(gd_registry *r, gd_buf *b) {
    while (b->id_waiters) {
        gd_waiter *w = b->id_waiters;
        waiter_unlink(r, w);
        waiter_fail(w, -ENOENT, "buffer %llu was deleted before it was sealed",
                    (unsigned long long)b->id);
    }
}

static void waiter_index(gd_registry *r, gd_waiter *w) {
    w->knext = NULL;
    w->kprev = w;
    if (w->name) {
        gd_waiter *head;
        HASH_FIND(hh, r->name_waiters, w->name, strlen(w->name), head);
        if (head)
            DL_APPEND2(head, w, kprev, knext);
        else
            HASH_ADD_KEYPTR(hh, r->name_waiters, w->name, strlen(w->name), w);
        w->indexed = true;
        return;
    }
    /* A wait by id is for a buffer that exists (open only waits for an id
     * in state ALLOCATED); one for no buffer can only time out. */
    gd_buf *b = gd_registry_find_id(r, w->buffer_id);
    if (b) {
        DL_APPEND2(b->id_waiters, w, kprev, knext);
        w->indexed = true;
    }
}

static void waiter_unindex(gd_registry *r, gd_waiter *w) {
    if (!w->indexed)
        return;
    w->indexed = false;
    if (w->name) {
        gd_waiter *head;
        HASH_FIND(hh, r->name_waiters, w->name, strlen(w->name), head);
        assert(head);
        if (head == w) {
            /* The next waiter of the name becomes the hash entry. */
            HASH_DEL(r->name_waiters, w);
            gd_waiter *rest = w->knext;
            if (rest) {
                rest->kprev = w->kprev;
                HASH_ADD_KEYPTR(hh, r->name_waiters, rest->name, strlen(rest->name), rest);
            }
        } else {
            DL_DELETE2(head, w, kprev, knext);
        }
    } else {
        gd_buf *b = gd_registry_find_id(r, w->buffer_id);
        assert(b);
        DL_DELETE2(b->id_waiters, w, kprev, knext);
    }
    w->knext = w->kprev = NULL;
}

gd_uid_usage *gd_registry_uid_usage(gd_registry *r, uid_t uid, bool create) {
    gd_uid_usage *u = gd_registry_uid_find(r, uid);
    if (!u && create) /* a uid's first buffer */
        GPUBUF_HASH_GET(r->uids, uid, uid, u);
    if (u)
        r->uid_last = u;
    return u;
}

void gd_registry_uid_drop(gd_registry *r, gd_uid_usage *u) {
    if (r->uid_last == u)
        r->uid_last = NULL;
    HASH_DEL(r->uids, u);
    free(u);
}

/* Give back what b counted against its creator and its owner's uid. */
static void uncharge(gd_registry *r, gd_buf *b) {
    gd_holder *h;
    uid_t uid = (uid_t)b->owner_uid;
    gd_uid_usage *u = gd_registry_uid_usage(r, uid, false);
    HASH_FIND(hh, r->holders, &b->owner_holder, sizeof(b->owner_holder), h);
    if (h) {
        assert(h->n_owned > 0 && h->owned_bytes >= b->charged &&
               h->owned_meta >= b->meta_charged);
        h->n_owned--;
        h->owned_bytes -= b->charged;
        h->owned_meta -= b->meta_charged;
    }
    assert(r->meta_bytes >= b->meta_charged);
    r->meta_bytes -= b->meta_charged;
    if (u) {
        assert(u->buffers > 0 && u->bytes >= b->charged && u->meta >= b->meta_charged);
        u->buffers--;
        u->bytes -= b->charged;
        u->meta -= b->meta_charged;
        if (u->buffers == 0)
            gd_registry_uid_drop(r, u);
    }
}

/* Nothing can reach b any more: no reference, and no name to open it by
 * (unsealed, deleted, or anonymous). */
static bool unreachable(const gd_buf *b) {
    return b->refs == 0 && (b->state != GPUBUF_STATE_SEALED || !b->name);
}

/* The removal of buffer id (last_ref: the holder whose last reference went
 * with it, or 0): into the request's group directly where the state lets it
 * (gd_obuf.direct), as reference counts go (ref_changed); else through the
 * buf_gone hook (outside a request, a snapshot under way, or the buffer's
 * own entry pending: the state drops that entry). */
static inline void buf_gone(gd_registry *r, uint64_t id, uint64_t last_ref) {
    gd_obuf *o = r->ref_sink;
    if (o && o->direct && o->pend_buffer != id && o->len < GD_OBUF_DIRECT_MAX) {
        if (last_ref)
            gd_se_ref_gone(o, last_ref, id);
        else
            gd_se_id(o, GD_SE_BUFFER_GONE, id);
        r->ref_sink_n++;
        return;
    }
    HOOK(r, buf_gone, id, last_ref);
}

/* b's state changed alone: directly as buf_gone, a buffer whose own entry
 * is pending needs none (that entry says its state then); else through the
 * buf_state hook. */
static inline void state_changed(gd_registry *r, const gd_buf *b) {
    gd_obuf *o = r->ref_sink;
    if (o && o->direct && o->len < GD_OBUF_DIRECT_MAX) {
        if (o->pend_buffer != b->id) {
            gd_se_buffer_state(o, b->id, (uint32_t)b->state);
            r->ref_sink_n++;
        }
        return;
    }
    HOOK_STATE(r, b);
}

void gd_registry_buf_free(gd_registry *r, gd_buf *b) {
    uint64_t last_ref = r->freeing_ref; /* this buffer's only: what follows may free others */
    r->freeing_ref = 0;
    uncharge(r, b);
    gd_lease_remove(r, b);
    gd_meta_free(r, b);
    if (b->state != GPUBUF_STATE_SEALED) {
        fail_id_waiters(r, b);
    } else {
        /* Waiters a seal could not serve (out of memory) time out. */
        while (b->id_waiters) {
            gd_waiter *w = b->id_waiters;
            DL_DELETE2(b->id_waiters, w, kprev, knext);
            w->indexed = false;
        }
    }
    HASH_DELETE(hh_id, r->by_id, b);
    if (b->in_name_index)
        HASH_DELETE(hh_name, r->by_name, b);
    buf_gone(r, b->id, last_ref);
    gd_pool_release(b->pool, &b->blk);
    assert(r->n_buffers > 0 && b->refs == 0);
    r->n_buffers--;
    r->freed_buffers++;
    free(b->key);
    if (r->n_spare_bufs + 1 > GD_SPARES) { /* (>= warns where it is 0) */
        free(b);
        return;
    }
    b->hh_id.next = r->spare_bufs;
    r->spare_bufs = b;
    r->n_spare_bufs++;
}

gd_buf *gd_registry_buf_new(gd_registry *r) {
    gd_buf *b = r->spare_bufs;
    if (b) {
        r->spare_bufs = b->hh_id.next;
        r->n_spare_bufs--;
    } else if (!(b = malloc(sizeof(*b)))) {
        return NULL;
    }
    memset(b, 0, sizeof(*b));
    return b;
}

/* Free b when nothing can reach it any more. Named sealed buffers persist
 * without references until deleted; everything else goes with its last one. */
void gd_registry_buf_maybe_free(gd_registry *r, gd_buf *b) {
    if (unreachable(b))
        gd_registry_buf_free(r, b);
}

static void waiter_unlink(gd_registry *r, gd_waiter *w) {
    assert(r->n_waiters > 0);
    waiter_unindex(r, w);
    DL_DELETE2(r->waiters, w, prev, next);
    DL_DELETE2(w->holder->waiters, w, hprev, hnext);
    w->next = w->prev = w->hnext = w->hprev = NULL;
    r->n_waiters--;
}

static gd_holder_slab *holder_slab_get(gd_holder *h, gd_slab *slab) {
    gd_holder_slab *hs;
    GPUBUF_HASH_GET(h->slabs, slab_id, slab->id, hs);
    if (!hs)
        return NULL;
    if (!hs->slab) /* new */
        hs->slab = slab;
    hs->buffers++;
    return hs;
}

static void holder_slab_put(gd_holder *h, uint64_t slab_id) {
    gd_holder_slab *hs;
    HASH_FIND(hh, h->slabs, &slab_id, sizeof(slab_id), hs);
    if (hs && --hs->buffers == 0 && !hs->kept) {
        HASH_DEL(h->slabs, hs);
        free(hs);
    }
}

/* The holder goes: unpin what it kept (after its references are dropped,
 * so that an emptied slab can go), at most budget slabs; returns how many
 * went. */
static uint32_t holder_slabs_clear(gd_holder *h, uint32_t budget) {
    gd_holder_slab *hs, *tmp;
    uint32_t done = 0;
    HASH_ITER(hh, h->slabs, hs, tmp) {
        if (done == budget)
            break;
        done++;
        HASH_DEL(h->slabs, hs);
        if (hs->kept) {
            gd_pool_unpin(hs->slab->pool, hs->slab);
            h->n_kept--;
        }
        free(hs);
    }
    return done;
}

void gd_registry_destroy(gd_registry *r) {
    gd_holder *h, *htmp;
    gd_buf *b, *btmp;
    while (gd_registry_reap(r, UINT32_MAX))
        ;
    HASH_ITER(hh, r->holders, h, htmp) {
        holder_cancel_waits(r, h);
        gd_ref *ref, *rtmp;
        HASH_ITER(hh, h->refs, ref, rtmp) {
            HASH_DEL(h->refs, ref);
            free(ref);
        }
        holder_slabs_clear(h, UINT32_MAX);
        HASH_DEL(r->holders, h);
        free(h);
    }
    HASH_ITER(hh_id, r->by_id, b, btmp) {
        b->refs = 0;
        gd_registry_buf_free(r, b);
    }
    HASH_CLEAR(hh_name, r->by_name);
    while (r->spare_bufs) {
        b = r->spare_bufs;
        r->spare_bufs = b->hh_id.next;
        free(b);
    }
    r->n_spare_bufs = 0;
    while (r->spare_refs) {
        gd_ref *ref = r->spare_refs;
        r->spare_refs = ref->hh.next;
        free(ref);
    }
    r->n_spare_refs = 0;
    free(r->leases);
    r->leases = NULL;
    gd_uid_usage *u, *utmp;
    HASH_ITER(hh, r->uids, u, utmp)
        gd_registry_uid_drop(r, u);
}

gd_holder *gd_registry_holder_add(gd_registry *r, uint64_t id, pid_t pid, uid_t uid, gid_t gid) {
    gd_holder *h = calloc(1, sizeof(*h));
    if (!h)
        return NULL;
    h->id = id;
    h->pid = pid;
    h->uid = uid;
    h->gid = gid;
    HASH_ADD(hh, r->holders, id, sizeof(h->id), h);
    return h;
}

gd_holder *gd_registry_holder_new(gd_registry *r, pid_t pid, uid_t uid, gid_t gid) {
    if (r->next_holder_id >= GD_ID_MAX) {
        errno = EOVERFLOW;
        return NULL;
    }
    gd_holder *h = gd_registry_holder_add(r, r->next_holder_id + 1, pid, uid, gid);
    if (h) {
        r->next_holder_id++;
        HOOK(r, holder, h);
    }
    return h;
}

gd_buf *gd_registry_find_id(gd_registry *r, uint64_t id) {
    gd_buf *b;
    HASH_FIND(hh_id, r->by_id, &id, sizeof(id), b);
    return b;
}

/* The by-name index key of name in pool: "POOL\0NAME" into key (at least
 * 2 * GPUBUF_NAME_MAX + 2 bytes); returns its length. */
static size_t name_key(char *key, const gd_pool *pool, const char *name) {
    size_t pl = strlen(pool->name), nl = strlen(name);
    if (pl > GPUBUF_NAME_MAX)
        pl = GPUBUF_NAME_MAX;
    if (nl > GPUBUF_NAME_MAX)
        nl = GPUBUF_NAME_MAX;
    memcpy(key, pool->name, pl);
    key[pl] = '\0';
    memcpy(key + pl + 1, name, nl);
    return pl + 1 + nl;
}

/* b's name in pool: its index key "POOL\0NAME", name pointing into it. */
int gd_registry_buf_name(gd_buf *b, const gd_pool *pool, const char *name) {
    char key[2 * GPUBUF_NAME_MAX + 2];
    b->key_len = name_key(key, pool, name);
    if (!(b->key = malloc(b->key_len + 1)))
        return -ENOMEM;
    memcpy(b->key, key, b->key_len);
    b->key[b->key_len] = '\0';
    b->name = b->key + strlen(b->key) + 1;
    return 0;
}

gd_buf *gd_registry_find_pool_name(gd_registry *r, const gd_pool *pool, const char *name) {
    char key[2 * GPUBUF_NAME_MAX + 2];
    gd_buf *b;
    if (!pool && !(pool = r->default_pool))
        return NULL;
    if (strlen(name) > GPUBUF_NAME_MAX)
        return NULL;
    size_t len = name_key(key, pool, name);
    HASH_FIND(hh_name, r->by_name, key, len, b);
    return b;
}

gd_buf *gd_registry_find_name(gd_registry *r, const char *name) {
    return gd_registry_find_pool_name(r, NULL, name);
}

/* A reference record for buffer id in hs, its counts 0: a spare or new
 * (NULL without memory). The hash handle is set by HASH_ADD. */
static gd_ref *ref_new(gd_registry *r, uint64_t id, gd_holder_slab *hs) {
    gd_ref *ref = r->spare_refs;
    if (ref) {
        r->spare_refs = ref->hh.next;
        r->n_spare_refs--;
    } else if (!(ref = malloc(sizeof(*ref)))) {
        return NULL;
    }
    ref->buffer_id = id;
    ref->count = ref->ro = 0;
    ref->hs = hs;
    return ref;
}

/* A reference record out of every table: kept as a spare or freed. */
static void ref_recycle(gd_registry *r, gd_ref *ref) {
    if (r->n_spare_refs + 1 > GD_SPARES) { /* (>= warns where it is 0) */
        free(ref);
        return;
    }
    ref->hh.next = r->spare_refs;
    r->spare_refs = ref;
    r->n_spare_refs++;
}

/* h's count of references to buffer id is now count, ro of them
 * read-only: into the request's group directly, or through the ref hook. */
static inline void ref_changed(gd_registry *r, const gd_holder *h, uint64_t id, uint32_t count,
                               uint32_t ro) {
    if (r->ref_sink) {
        gd_se_ref(r->ref_sink, h->id, id, count, ro);
        r->ref_sink_n++;
    } else {
        HOOK(r, ref, h, id, count, ro);
    }
}

void gd_registry_ref_saved(gd_registry *r, const gd_holder *h, const gd_ref *ref) {
    ref_changed(r, h, ref->buffer_id, ref->count, ref->ro);
}

gd_ref *gd_registry_ref_find(gd_holder *h, uint64_t id) {
    gd_ref *ref;
    HASH_FIND(hh, h->refs, &id, sizeof(id), ref);
    return ref;
}

uint32_t gd_registry_holder_count(gd_holder *h, uint64_t buffer_id) {
    gd_ref *ref = gd_registry_ref_find(h, buffer_id);
    return ref ? ref->count : 0;
}

/* Add n references of h to b, ro of them read-only (ro <= n), in one step
 * whatever n: -EOVERFLOW when the holder's or the buffer's count would pass
 * UINT32_MAX. */
int gd_registry_ref_add_n(gd_registry *r, gd_holder *h, gd_buf *b, uint32_t n, uint32_t ro) {
    gd_ref *ref;
    unsigned hv; /* the id hashed once, for the find and the add */
    HASH_VALUE(&b->id, sizeof(b->id), hv);
    HASH_FIND_BYHASHVALUE(hh, h->refs, &b->id, sizeof(b->id), hv, ref);
    assert(n > 0 && ro <= n);
    if (n > UINT32_MAX - h->n_refs || n > UINT32_MAX - b->refs)
        return -EOVERFLOW;
    if (!ref) {
        gd_holder_slab *hs = holder_slab_get(h, b->blk.slab);
        if (!hs)
            return -ENOMEM;
        ref = ref_new(r, b->id, hs);
        if (!ref) {
            holder_slab_put(h, b->blk.slab->id);
            return -ENOMEM;
        }
        HASH_ADD_BYHASHVALUE(hh, h->refs, buffer_id, sizeof(ref->buffer_id), hv, ref);
        GPUBUF_HASH_KEEP_LOAD(hh, h->refs);
    }
    /* Each count below is at most h->n_refs: none can overflow. */
    ref->count += n;
    ref->ro += ro;
    ref->hs->refs += n;
    ref->hs->ro += ro;
    h->n_refs += n;
    h->n_ro_refs += ro;
    b->refs += n;
    ref_changed(r, h, b->id, ref->count, ref->ro);
    return 0;
}

int gd_registry_ref_add(gd_registry *r, gd_holder *h, gd_buf *b) {
    return gd_registry_ref_add_n(r, h, b, 1, 0);
}

/* Set the read-only part of ref to ro (at most its count). */
void gd_registry_ref_ro_set(gd_holder *h, gd_ref *ref, uint32_t ro) {
    if (ro > ref->count)
        ro = ref->count;
    ref->hs->ro = ref->hs->ro - ref->ro + ro;
    h->n_ro_refs = h->n_ro_refs - ref->ro + ro;
    ref->ro = ro;
}

/* Drop n (1..count) of h's references ref to b (NULL: gone already), in one
 * step whatever n; read-only marks go first when they would outnumber what
 * is left. ref is freed when none is left, b when nothing reaches it. */
void gd_registry_ref_drop_n(gd_registry *r, gd_holder *h, gd_ref *ref, gd_buf *b, uint32_t n) {
    uint64_t id = ref->buffer_id;
    assert(n > 0 && ref->count >= n && h->n_refs >= n);
    if (ref->ro > ref->count - n)
        gd_registry_ref_ro_set(h, ref, ref->count - n);
    ref->hs->refs -= n;
    uint32_t left = ref->count -= n, left_ro = ref->ro;
    if (left == 0) {
        HASH_DEL(h->refs, ref);
        ref_recycle(r, ref);
        /* The sealer's last view went: its library may destroy the event
         * once it has completed and this release is answered. The saved
         * state hears it too: restored with its event, the buffer would
         * hand a destroyed event to openers once the sealer resumed. */
        if (b && b->has_event && b->event_holder == h->id) {
            b->has_event = false;
            HOOK(r, buf, b);
        }
        if (b)
            holder_slab_put(h, b->blk.slab->id);
    }
    h->n_refs -= n;
    if (!b) {
        ref_changed(r, h, id, left, left_ro);
        return;
    }
    assert(b->refs >= n);
    b->refs -= n;
    if (left == 0 && unreachable(b)) {
        /* The last reference frees it: its removal says both. */
        r->freeing_ref = h->id;
        gd_registry_buf_free(r, b);
        return;
    }
    ref_changed(r, h, id, left, left_ro);
    gd_registry_buf_maybe_free(r, b);
}

static bool waiter_matches(const gd_waiter *w, const gd_buf *b) {
    if (w->name)
        return b->name && w->pool == b->pool && strcmp(w->name, b->name) == 0;
    return w->buffer_id == b->id && (!w->pool || w->pool == b->pool);
}

/* The target names an owner and b has another: -EPERM, why in err. */
int gd_registry_check_owner(bool has_owner, uint32_t owner_uid, const gd_buf *b, gd_err *err) {
    if (!has_owner || b->owner_uid == owner_uid)
        return 0;
    return gd_err_set(err, -EPERM,
                      "buffer %llu ('%s' in pool '%s') belongs to uid %u, not to uid %u as "
                      "asked: it is not the publisher's buffer",
                      (unsigned long long)b->id, b->name ? b->name : "", b->pool->name,
                      b->owner_uid, owner_uid);
}

int gd_registry_seal(gd_registry *r, gd_holder *h, uint64_t id, gd_buf **ret, gd_err *err) {
    return gd_registry_seal_event(r, h, id, NULL, ret, err);
}

/* A read-only open of memory that cannot be mapped read-only is refused. */
int gd_registry_check_read_only(const gd_pool *pool, gd_err *err) {
    if (pool->be->kind != GPUBUF_POOL_CUDA_IPC)
        return 0;
    return gd_err_set(err, -EOPNOTSUPP,
                      "pool '%s' is cuda-ipc: its memory cannot be mapped read-only (CUDA IPC "
                      "handles are always writable): open without the read-only flag, or use a "
                      "cuda-vmm or host pool",
                      pool->name);
}

bool gd_registry_slab_mapped(gd_holder *h, const gd_buf *b, bool ro) {
    gd_holder_slab *hs;
    uint64_t sid = b->blk.slab->id;
    HASH_FIND(hh, h->slabs, &sid, sizeof(sid), hs);
    if (!hs)
        return false;
    assert(hs->ro <= hs->refs);
    if (ro)
        return hs->ro > 1;
    return hs->refs - hs->ro > 1 || hs->kept;
}

const uint8_t *gd_registry_event(gd_registry *r, const gd_buf *b) {
    gd_holder *h;
    if (!b->has_event)
        return NULL;
    HASH_FIND(hh, r->holders, &b->event_holder, sizeof(b->event_holder), h);
    return h ? b->event : NULL;
}

void gd_registry_opened(gd_registry *r, gd_holder *h, gd_buf *b, bool read_only, gd_opened *ret) {
    ret->buf = b;
    ret->read_only = read_only;
    ret->slab_mapped = gd_registry_slab_mapped(h, b, read_only);
    ret->event = gd_registry_event(r, b);
}

void gd_registry_ref_unmark_ro(gd_holder *h, uint64_t id) {
    gd_ref *ref = gd_registry_ref_find(h, id);
    if (ref && ref->ro > 0)
        gd_registry_ref_ro_set(h, ref, ref->ro - 1);
}

/* b was sealed: give waiter w its reference, or tell it why not. */
static void wake(gd_registry *r, gd_waiter *w, gd_buf *b) {
    /* The index is by name or id alone: a name in another pool, or an id
     * asked for in another pool, is not this buffer. */
    if (!waiter_matches(w, b))
        return;
    /* Refused before a reference is taken: a waiter of a pool it may not
     * use, or one holding too many references, gets none. */
    if (!gd_pool_allows(b->pool, w->holder->uid, w->holder->gid)) {
        waiter_unlink(r, w);
        waiter_fail(w, -EACCES, "uid %u may not use pool '%s'", (unsigned)w->holder->uid,
                    b->pool->name);
        return;
    }
    gd_err own = {0};
    if (gd_registry_check_owner(w->has_owner, w->owner_uid, b, &own) < 0) {
        waiter_unlink(r, w);
        waiter_fail(w, own.code, "%s", own.msg);
        return;
    }
    if (r->quota.refs_per_client && w->holder->n_refs >= r->quota.refs_per_client) {
        waiter_unlink(r, w);
        waiter_fail(w, -EDQUOT, "quota: this client holds too many references");
        return;
    }
    gd_err ro = {0};
    if (w->read_only && gd_registry_check_read_only(b->pool, &ro) < 0) {
        waiter_unlink(r, w);
        waiter_fail(w, ro.code, "%s", ro.msg);
        return;
    }
    if (gd_registry_ref_add_n(r, w->holder, b, 1, w->read_only ? 1 : 0) < 0)
        return; /* out of memory: the waiter times out */
    waiter_unlink(r, w);
    gd_registry_opened(r, w->holder, b, w->read_only, &w->opened);
    /* The callback may free w (but not other waiters). */
    w->wake(w, b);
}

int gd_registry_seal_event(gd_registry *r, gd_holder *h, uint64_t id, const uint8_t *event,
                           gd_buf **ret, gd_err *err) {
    gd_buf *b = gd_registry_find_id(r, id);
    if (!b)
        return gd_err_set(err, -ENOENT, "no buffer with id %llu", (unsigned long long)id);
    if (b->owner_holder != h->id)
        return gd_err_set(err, -EPERM, "buffer %llu was allocated by another client",
                    (unsigned long long)id);
    if (b->state != GPUBUF_STATE_ALLOCATED)
        return gd_err_set(err, GPUBUF_ESTATE, "buffer %llu is already %s", (unsigned long long)id,
                    b->state == GPUBUF_STATE_SEALED ? "sealed" : "deleted");
    if (event && b->pool->be->kind == GPUBUF_POOL_HOST)
        return gd_err_set(err, -EINVAL,
                          "buffer %llu is in host pool '%s': a stream-ordered seal needs a CUDA "
                          "pool (seal without an event)",
                          (unsigned long long)id, b->pool->name);
    if (event) {
        memcpy(b->event, event, GD_EVENT_HANDLE_SIZE);
        b->has_event = true;
        b->event_holder = h->id;
    }
    b->state = GPUBUF_STATE_SEALED;
    HOOK(r, buf, b);
    /* Wake waiters for this name or id. Each gets its own reference. */
    gd_waiter *w = NULL, *next;
    if (b->name)
        HASH_FIND(hh, r->name_waiters, b->name, strlen(b->name), w);
    for (; w; w = next) {
        next = w->knext;
        wake(r, w, b);
    }
    for (w = b->id_waiters; w; w = next) {
        next = w->knext;
        wake(r, w, b);
    }
    *ret = b;
    return 0;
}

int gd_registry_release(gd_registry *r, gd_holder *h, uint64_t id, gd_err *err) {
    return gd_registry_release_keep(r, h, id, false, err);
}

int gd_registry_release_keep(gd_registry *r, gd_holder *h, uint64_t id, bool keep,
                             gd_err *err) {
    gd_ref *ref = gd_registry_ref_find(h, id);
    gd_buf *b;
    int rc = 0;
    if (!ref)
        return gd_err_set(err, GPUBUF_ENOTHELD, "this client holds no reference to buffer %llu",
                    (unsigned long long)id);
    b = gd_registry_find_id(r, id);
    if (keep && b) {
        /* Pin before the block may go: the slab must outlive it. */
        gd_holder_slab *hs;
        gd_slab *sl = b->blk.slab;
        HASH_FIND(hh, h->slabs, &sl->id, sizeof(sl->id), hs);
        if (sl->dedicated)
            rc = gd_err_set(err, -EINVAL, "slab %llu is dedicated to one buffer: it cannot be kept",
                      (unsigned long long)sl->id);
        else if (hs && !hs->kept && h->n_kept >= h->kept_cap)
            rc = gd_err_set(err, -EDQUOT, "quota: this client keeps %u slabs mapped (limit %u)",
                      h->n_kept, h->kept_cap);
        else if (hs && !hs->kept) {
            hs->kept = true;
            h->n_kept++;
            gd_pool_pin(sl);
        }
    }
    gd_registry_ref_drop_n(r, h, ref, b, 1);
    return rc;
}

int gd_registry_unmap(gd_registry *r, gd_holder *h, uint64_t slab_id, gd_err *err) {
    gd_holder_slab *hs;
    HASH_FIND(hh, h->slabs, &slab_id, sizeof(slab_id), hs);
    if (!hs || !hs->kept)
        return gd_err_set(err, GPUBUF_ENOTHELD, "this client keeps no slab %llu mapped",
                    (unsigned long long)slab_id);
    gd_slab *sl = hs->slab;
    hs->kept = false;
    h->n_kept--;
    if (hs->buffers == 0) {
        HASH_DEL(h->slabs, hs);
        free(hs);
    }
    gd_pool_unpin(sl->pool, sl);
    return 0;
}

void gd_registry_unpublish(gd_registry *r, gd_buf *b) {
    if (b->state == GPUBUF_STATE_ALLOCATED)
        fail_id_waiters(r, b);
    b->state = GPUBUF_STATE_DELETED;
    gd_lease_remove(r, b);
    if (b->in_name_index) {
        HASH_DELETE(hh_name, r->by_name, b);
        b->in_name_index = false;
    }
    state_changed(r, b);
    gd_registry_buf_maybe_free(r, b);
}

void gd_registry_wait(gd_registry *r, gd_waiter *w) {
    assert(w->holder && w->wake && w->cancel);
    if (w->name && !w->pool)
        w->pool = r->default_pool;
    DL_PREPEND2(r->waiters, w, prev, next);
    DL_PREPEND2(w->holder->waiters, w, hprev, hnext);
    r->n_waiters++;
    waiter_index(r, w);
}

void gd_registry_unwait(gd_registry *r, gd_waiter *w) {
    waiter_unlink(r, w);
}

static void holder_cancel_waits(gd_registry *r, gd_holder *h) {
    while (h->waiters) {
        gd_waiter *w = h->waiters;
        waiter_unlink(r, w);
        w->cancel(w);
    }
}

/* Drop at most budget of h's references; returns how many went. */
static uint32_t holder_drop_refs(gd_registry *r, gd_holder *h, uint32_t budget) {
    gd_ref *ref, *rtmp;
    uint32_t done = 0;
    HASH_ITER(hh, h->refs, ref, rtmp) {
        if (done == budget)
            break;
        done++;
        gd_buf *b = gd_registry_find_id(r, ref->buffer_id);
        HASH_DEL(h->refs, ref);
        if (b) {
            assert(b->refs >= ref->count);
            b->refs -= ref->count;
            /* Allocated by this client and never sealed: nobody else can
             * ever reach it. */
            if (b->state == GPUBUF_STATE_ALLOCATED && b->owner_holder == h->id) {
                b->state = GPUBUF_STATE_DELETED;
                if (b->in_name_index) {
                    HASH_DELETE(hh_name, r->by_name, b);
                    b->in_name_index = false;
                }
                state_changed(r, b);
            }
            gd_registry_buf_maybe_free(r, b);
        }
        free(ref);
    }
    return done;
}

/* h goes: first of all, a saved state replayed to here has no reference of
 * h left (its references are dropped after, maybe over several turns). */
static void holder_gone(gd_registry *r, gd_holder *h) {
    HOOK(r, holder_gone, h->id);
    if (h->detached) {
        assert(r->n_detached > 0);
        r->n_detached--;
        h->detached = false;
    }
}

void gd_registry_holder_drop(gd_registry *r, gd_holder *h) {
    holder_gone(r, h);
    holder_cancel_waits(r, h);
    holder_drop_refs(r, h, UINT32_MAX);
    holder_slabs_clear(h, UINT32_MAX);
    HASH_DEL(r->holders, h);
    free(h);
}

void gd_registry_holder_leave(gd_registry *r, gd_holder *h) {
    holder_gone(r, h);
    holder_cancel_waits(r, h);
    HASH_DEL(r->holders, h);
    DL_APPEND2(r->leaving, h, leave_prev, leave_next);
}

bool gd_registry_reap(gd_registry *r, uint32_t budget) {
    while (r->leaving && budget > 0) {
        gd_holder *h = r->leaving;
        budget -= holder_drop_refs(r, h, budget);
        /* Kept slabs are unpinned once the references are gone, so that an
         * emptied slab can go. */
        if (!h->refs)
            budget -= holder_slabs_clear(h, budget);
        if (h->refs || h->slabs)
            break; /* the budget ran out */
        DL_DELETE2(r->leaving, h, leave_prev, leave_next);
        free(h);
    }
    return r->leaving != NULL;
}

void gd_registry_changed(gd_registry *r, const gd_buf *b) {
    HOOK(r, buf, b);
}

/* A buffer's layout and user bytes go (it is freed, or they are replaced). */
void gd_meta_free(gd_registry *r, gd_buf *b) {
    gd_meta *m = b->meta;
    if (!m)
        return;
    r->n_layouts -= m->has_layout;
    r->layout_dims -= m->has_layout ? m->ndim : 0;
    r->n_user_meta -= m->user_len != 0;
    free(m);
    b->meta = NULL;
}
