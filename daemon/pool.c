#include "pool.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utlist.h>

#include "util.h"

/* Candidates of the right length looked at for an alignment that the
 * smallest does not meet, before taking the smallest extent that surely
 * fits: a bound on the work, not on the fit. */
#define FIT_PROBES 8

static int cmp_off(const gd_extent *a, const gd_extent *b) {
    return a->off < b->off ? -1 : a->off > b->off;
}

static int cmp_len(const gd_extent *a, const gd_extent *b) {
    if (a->len != b->len)
        return a->len < b->len ? -1 : 1;
    return cmp_off(a, b);
}

RB_GENERATE_INTERNAL(gd_extents_off, gd_extent, by_off, cmp_off, static __attribute__((unused)))
RB_GENERATE_INTERNAL(gd_extents_len, gd_extent, by_len, cmp_len, static __attribute__((unused)))

static void ext_insert(gd_slab *s, gd_extent *e) {
    RB_INSERT(gd_extents_off, &s->free_off, e);
    RB_INSERT(gd_extents_len, &s->free_len, e);
    s->n_free++;
}

static void ext_remove(gd_slab *s, gd_extent *e) {
    RB_REMOVE(gd_extents_off, &s->free_off, e);
    RB_REMOVE(gd_extents_len, &s->free_len, e);
    s->n_free--;
    free(e);
}

/* Move or resize e within its place in offset order: only its place by
 * length changes. */
static void ext_set(gd_slab *s, gd_extent *e, uint64_t off, uint64_t len) {
    RB_REMOVE(gd_extents_len, &s->free_len, e);
    e->off = off;
    e->len = len;
    RB_INSERT(gd_extents_len, &s->free_len, e);
}

static gd_extent *ext_new(uint64_t off, uint64_t len) {
    gd_extent *e = calloc(1, sizeof(*e));
    if (e) {
        e->off = off;
        e->len = len;
    }
    return e;
}

int gd_pool_new(const char *name, gd_backend *be, uint64_t capacity, uint64_t slab_size,
                uint64_t *slab_id_counter, gd_pool **ret, gd_err *err) {
    gd_pool *p;
    if (!be || slab_size == 0)
        return gd_err_set(err, -EINVAL, "no backend or a slab size of 0");
    if (capacity < be->granularity) /* not even one slab of the smallest size fits */
        return gd_err_set(err, -EINVAL, "capacity below the backend's allocation granularity");
    p = calloc(1, sizeof(*p));
    if (!p || !(p->name = strdup(name))) {
        free(p);
        return gd_err_set(err, -ENOMEM, "out of memory");
    }
    p->be = be;
    /* A slab never exceeds the capacity: a pool smaller than one slab is
     * one slab of its capacity. */
    uint64_t top = capacity / be->granularity * be->granularity;
    /* Below top, rounding up cannot pass it (nor wrap past 2^64). */
    slab_size = slab_size >= top ? top : gpubuf_align_up(slab_size, be->granularity);
    p->slab_size = slab_size;
    p->capacity = capacity;
    p->next_slab_id = slab_id_counter;
    *ret = p;
    return 0;
}

static void slab_destroy(gd_pool *p, gd_slab *s) {
    if (p->slab_hook)
        p->slab_hook(p->slab_hook_arg, s, false);
    DL_DELETE(p->slabs, s);
    p->be->ops->slab_destroy(p->be, s->priv, &s->exp);
    p->reserved -= s->size;
    p->n_slabs--;
    p->stats.slabs_destroyed++;
    gd_extent *e, *tmp;
    RB_FOREACH_SAFE(e, gd_extents_off, &s->free_off, tmp)
        free(e);
    free(s);
}

gd_pool *gd_pool_free(gd_pool *p) {
    if (!p)
        return NULL;
    while (p->slabs)
        slab_destroy(p, p->slabs);
    gd_backend_free(p->be);
    free(p->name);
    free(p);
    return NULL;
}

static bool has_other_spare(const gd_pool *p, const gd_slab *self);
static void take(gd_slab *s, gd_extent *e, uint64_t size, uint64_t align, gd_extent *spare,
                 gd_block *ret);

/* Give back an empty regular slab (the spare), if any. */
static bool drop_spare(gd_pool *p) {
    for (gd_slab *s = p->slabs; s; s = s->next)
        if (!s->dedicated && s->blocks == 0 && s->pins == 0) {
            slab_destroy(p, s);
            return true;
        }
    return false;
}

/* A slab of size bytes not yet backed, wholly free. NULL when out of memory. */
static gd_slab *slab_new(uint64_t size) {
    gd_slab *s = calloc(1, sizeof(*s));
    gd_extent *whole = ext_new(0, size);
    if (!s || !whole) {
        free(s);
        free(whole);
        return NULL;
    }
    RB_INIT(&s->free_off);
    RB_INIT(&s->free_len);
    ext_insert(s, whole);
    return s;
}

/* A slab whose backend refused it. */
static void slab_unbacked_free(gd_slab *s) {
    gd_extent *e, *tmp;
    RB_FOREACH_SAFE(e, gd_extents_off, &s->free_off, tmp)
        free(e);
    free(s);
}

/* The backed slab s joins p: counted, told to the hook. */
static gd_slab *slab_link(gd_pool *p, gd_slab *s, uint64_t id, uint64_t size, bool dedicated) {
    s->id = id;
    s->size = size;
    s->dedicated = dedicated;
    s->pool = p;
    DL_PREPEND(p->slabs, s);
    p->reserved += size;
    p->n_slabs++;
    if (p->slab_hook)
        p->slab_hook(p->slab_hook_arg, s, true);
    return s;
}

static int slab_create(gd_pool *p, uint64_t size, bool dedicated, gd_slab **ret, gd_err *err) {
    gd_slab *s;
    int r;
    /* The spare slab counts against the capacity: give it back when a slab
     * of another size needs the room. */
    if (size <= p->capacity && p->reserved > p->capacity - size)
        drop_spare(p);
    char want[32], cap[32], used[32];
    if (size > p->capacity)
        /* Not full: no slab of this size ever fits (a slab size above the
         * capacity after rounding, see gpubuf.conf(5)). */
        return gd_err_set(err, GPUBUF_EPOOLFULL,
                          "pool '%s' cannot hold a slab of %s (capacity %s): raise its capacity "
                          "or lower its slab size",
                          p->name, gpubuf_format_size(size, want, sizeof(want)),
                          gpubuf_format_size(p->capacity, cap, sizeof(cap)));
    if (p->reserved > p->capacity - size)
        return gd_err_set(err, GPUBUF_EPOOLFULL,
                          "pool '%s' is full: %s of %s in slabs and %s more needed; release or "
                          "delete buffers in it, or raise its capacity",
                          p->name, gpubuf_format_size(p->reserved, used, sizeof(used)),
                          gpubuf_format_size(p->capacity, cap, sizeof(cap)),
                          gpubuf_format_size(size, want, sizeof(want)));
    if (*p->next_slab_id >= GD_ID_MAX)
        return gd_err_set(err, -EOVERFLOW,
                          "gpubufd has given out every slab id (up to %llu) and ids never go "
                          "back: new slabs need gpubufd started afresh, without its saved state",
                          (unsigned long long)GD_ID_MAX);
    if (!(s = slab_new(size)))
        return gd_err_set(err, -ENOMEM, "out of memory");
    r = p->be->ops->slab_create(p->be, size, &s->priv, &s->exp, err);
    if (r < 0) {
        slab_unbacked_free(s);
        return r;
    }
    p->stats.slabs_created++;
    *ret = slab_link(p, s, ++*p->next_slab_id, size, dedicated);
    return 0;
}

int gd_pool_adopt_slab(gd_pool *p, uint64_t id, uint64_t size, bool dedicated, int fd,
                       gd_slab **ret, gd_err *err) {
    gd_slab *s;
    int r;
    if (!p->be->ops->slab_adopt)
        return gd_err_set(err, -EOPNOTSUPP, "%s memory does not outlive the daemon",
                          gpubuf_pool_kind_name(p->be->kind));
    if (id == 0 || id > GD_ID_MAX)
        return gd_err_set(err, -ERANGE, "slab id %llu is outside 1..%llu, the ids gpubufd gives",
                          (unsigned long long)id, (unsigned long long)GD_ID_MAX);
    if (size == 0 || size % p->be->granularity || size > p->capacity ||
        p->reserved > p->capacity - size)
        return gd_err_set(err, GPUBUF_EPOOLFULL, "a slab of %llu bytes does not fit the pool",
                          (unsigned long long)size);
    for (s = p->slabs; s; s = s->next)
        if (s->id == id)
            return gd_err_set(err, -EEXIST, "slab %llu twice", (unsigned long long)id);
    if (!(s = slab_new(size)))
        return gd_err_set(err, -ENOMEM, "out of memory");
    r = p->be->ops->slab_adopt(p->be, fd, size, &s->priv, &s->exp, err);
    if (r < 0) {
        slab_unbacked_free(s);
        return r;
    }
    if (id > *p->next_slab_id)
        *p->next_slab_id = id;
    *ret = slab_link(p, s, id, size, dedicated);
    return 0;
}

int gd_pool_claim(gd_pool *p, gd_slab *s, uint64_t offset, uint64_t size, gd_block *ret,
                  gd_err *err) {
    if (size == 0 || offset >= s->size || size > s->size - offset)
        return gd_err_set(err, -EINVAL, "block [%llu, +%llu) outside slab %llu",
                          (unsigned long long)offset, (unsigned long long)size,
                          (unsigned long long)s->id);
    /* The last free extent that starts at or before offset. */
    gd_extent key = {.off = offset + 1};
    gd_extent *e = RB_NFIND(gd_extents_off, &s->free_off, &key);
    e = e ? RB_PREV(gd_extents_off, &s->free_off, e) : RB_MAX(gd_extents_off, &s->free_off);
    if (!e || offset - e->off >= e->len || size > e->len - (offset - e->off))
        return gd_err_set(err, -EINVAL, "block [%llu, +%llu) of slab %llu overlaps another",
                          (unsigned long long)offset, (unsigned long long)size,
                          (unsigned long long)s->id);
    uint64_t pad = offset - e->off;
    if (pad) {
        /* Split before the block: take() then carves from the block's start. */
        gd_extent *rest = ext_new(offset, e->len - pad);
        if (!rest)
            return gd_err_set(err, -ENOMEM, "out of memory");
        ext_set(s, e, e->off, pad);
        ext_insert(s, rest);
        e = rest;
    }
    take(s, e, size, 1, NULL, ret);
    p->used += size;
    p->n_blocks++;
    return 0;
}

void gd_pool_trim(gd_pool *p) {
    gd_slab *s, *tmp;
    DL_FOREACH_SAFE(p->slabs, s, tmp) {
        if (s->blocks == 0 && s->pins == 0 && (s->dedicated || has_other_spare(p, s)))
            slab_destroy(p, s);
    }
}

static bool fits(const gd_extent *e, uint64_t size, uint64_t align) {
    uint64_t pad = gpubuf_align_up(e->off, align) - e->off;
    return pad <= e->len && e->len - pad >= size;
}

/* The smallest free extent of s that takes (size, align), or NULL. Offsets
 * are multiples of the backend's alignment base, so an extent of size +
 * align - base bytes or more always fits; smaller ones may not, and at most
 * FIT_PROBES of them are tried: O(log n) in the slab's free extents. */
static gd_extent *slab_fit(gd_slab *s, uint64_t size, uint64_t align, uint64_t base) {
    gd_extent key = {.off = 0, .len = size};
    gd_extent *e = RB_NFIND(gd_extents_len, &s->free_len, &key);
    for (int k = 0; e && k < FIT_PROBES; k++, e = RB_NEXT(gd_extents_len, &s->free_len, e))
        if (fits(e, size, align))
            return e;
    if (!e)
        return NULL;
    key.len = size + (align - base);
    if (e->len < key.len)
        e = RB_NFIND(gd_extents_len, &s->free_len, &key);
    assert(!e || fits(e, size, align));
    return e;
}

/* Place (size, align) at the start of e (after padding); the padding and the
 * tail stay free, the tail in spare when both remain (spare, then not NULL,
 * is consumed). */
static void take(gd_slab *s, gd_extent *e, uint64_t size, uint64_t align, gd_extent *spare,
                 gd_block *ret) {
    uint64_t off = e->off, start = gpubuf_align_up(off, align);
    uint64_t pad = start - off;
    uint64_t tail = e->len - pad - size;
    if (pad && tail) {
        assert(spare);
        ext_set(s, e, off, pad);
        spare->off = start + size;
        spare->len = tail;
        ext_insert(s, spare);
    } else if (pad) {
        ext_set(s, e, off, pad);
    } else if (tail) {
        ext_set(s, e, start + size, tail);
    } else {
        ext_remove(s, e);
    }
    s->used += size;
    s->blocks++;
    ret->slab = s;
    ret->offset = start;
    ret->size = size;
}

/* Best fit of (size, align) in slab s, improving on *best; true on an exact
 * fit. */
static bool fit_in(gd_slab *s, uint64_t size, uint64_t align, uint64_t base, gd_slab **best,
                   gd_extent **best_e) {
    gd_extent *e = slab_fit(s, size, align, base);
    if (!e || (*best_e && e->len >= (*best_e)->len))
        return false;
    *best = s;
    *best_e = e;
    return e->len == size;
}

int gd_pool_alloc(gd_pool *p, uint64_t size, uint64_t align, gd_block *ret, gd_err *err) {
    return gd_pool_alloc_prefer(p, size, align, NULL, 0, ret, err);
}

static int alloc_prefer(gd_pool *p, uint64_t size, uint64_t align, gd_slab *const *prefer,
                        uint32_t n_prefer, gd_block *ret, gd_err *err) {
    gd_slab *best = NULL, *s;
    gd_extent *best_e = NULL;
    uint64_t base = p->be->alignment;
    int r;
    if (align == 0)
        align = p->be->alignment;
    if (size == 0 || (align & (align - 1)) || align > p->be->granularity ||
        size > UINT64_MAX / 2) {
        return gd_err_set(err, -EINVAL, "invalid size %llu or alignment %llu (power of two <= %llu)",
                          (unsigned long long)size, (unsigned long long)align,
                          (unsigned long long)p->be->granularity);
    }
    if (align < p->be->alignment)
        align = p->be->alignment;
    if (size > p->capacity) {
        /* Not full: this request could never fit, whatever is freed. */
        char want[32], cap[32];
        return gd_err_set(err, GPUBUF_EPOOLFULL,
                          "a request of %s is larger than pool '%s' (capacity %s): ask for at "
                          "most %s, or raise the pool's capacity",
                          gpubuf_format_size(size, want, sizeof(want)), p->name,
                          gpubuf_format_size(p->capacity, cap, sizeof(cap)), cap);
    }
    size = gpubuf_align_up(size, p->be->alignment);

    if (size > p->slab_size) {
        r = slab_create(p, gpubuf_align_up(size, p->be->granularity), true, &s, err);
        if (r < 0)
            return r;
        best = s;
    } else {
        /* The caller's slabs first: best fit among them, if any has room. */
        for (uint32_t k = 0; k < n_prefer; k++) {
            if (prefer[k]->pool == p && !prefer[k]->dedicated &&
                fit_in(prefer[k], size, align, base, &best, &best_e))
                break;
        }
        for (s = best ? NULL : p->slabs; s; s = s->next) {
            if (!s->dedicated && fit_in(s, size, align, base, &best, &best_e))
                break;
        }
        if (!best) {
            r = slab_create(p, p->slab_size, false, &s, err);
            if (r < 0)
                return r;
            best = s;
        }
    }
    if (!best_e)
        best_e = RB_MIN(gd_extents_off, &best->free_off); /* a new slab: all free */
    /* A block inside an extent (padding before it, a tail after it) leaves
     * two: the node for the second is had before anything changes. */
    uint64_t pad = gpubuf_align_up(best_e->off, align) - best_e->off;
    gd_extent *spare = NULL;
    if (pad && best_e->len - pad > size && !(spare = ext_new(0, 0))) {
        if (best->blocks == 0 && best->pins == 0 &&
            (best->dedicated || has_other_spare(p, best)))
            slab_destroy(p, best);
        return gd_err_set(err, -ENOMEM, "out of memory");
    }
    take(best, best_e, size, align, spare, ret);
    p->used += size;
    p->stats.bytes_allocated += size;
    p->n_blocks++;
    return 0;
}

static bool has_other_spare(const gd_pool *p, const gd_slab *self) {
    for (const gd_slab *s = p->slabs; s; s = s->next)
        if (s != self && !s->dedicated && s->blocks == 0)
            return true;
    return false;
}

void gd_pool_release(gd_pool *p, const gd_block *b) {
    gd_slab *s = b->slab;
    uint64_t off = b->offset, len = b->size;
    gd_extent key = {.off = off};
    gd_extent *next = RB_NFIND(gd_extents_off, &s->free_off, &key);
    gd_extent *prev = next ? RB_PREV(gd_extents_off, &s->free_off, next)
                           : RB_MAX(gd_extents_off, &s->free_off);
    bool merge_prev = prev && prev->off + prev->len == off;
    bool merge_next = next && off + len == next->off;
    if (merge_prev && merge_next) {
        uint64_t total = prev->len + len + next->len;
        ext_remove(s, next);
        ext_set(s, prev, prev->off, total);
    } else if (merge_prev) {
        ext_set(s, prev, prev->off, prev->len + len);
    } else if (merge_next) {
        ext_set(s, next, off, next->len + len);
    } else {
        /* A small allocation fails only when the process is out of memory;
         * the free space cannot stay consistent without it. */
        gd_extent *e = ext_new(off, len);
        if (!e)
            abort();
        ext_insert(s, e);
    }
    assert(s->blocks > 0 && s->used >= len && p->used >= len && p->n_blocks > 0);
    s->used -= len;
    s->blocks--;
    p->used -= len;
    p->stats.bytes_freed += len;
    p->n_blocks--;
    if (s->blocks == 0 && s->pins == 0 && (s->dedicated || has_other_spare(p, s)))
        slab_destroy(p, s);
}

void gd_pool_pin(gd_slab *s) {
    s->pins++;
}

void gd_pool_unpin(gd_pool *p, gd_slab *s) {
    assert(s->pins > 0);
    if (--s->pins == 0 && s->blocks == 0 && (s->dedicated || has_other_spare(p, s)))
        slab_destroy(p, s);
}

uint64_t gd_pool_largest_free(const gd_pool *p) {
    uint64_t m = 0;
    for (const gd_slab *s = p->slabs; s; s = s->next) {
        const gd_extent *e = RB_MAX(gd_extents_len, (struct gd_extents_len *)&s->free_len);
        if (e && e->len > m)
            m = e->len;
    }
    return m;
}

const gd_extent *gd_slab_free_first(const gd_slab *s) {
    return RB_MIN(gd_extents_off, (struct gd_extents_off *)&s->free_off);
}

const gd_extent *gd_slab_free_next(const gd_extent *e) {
    return RB_NEXT(gd_extents_off, NULL, (gd_extent *)e);
}

/* uid 0, everyone when both lists are empty, else those listed. */
static bool id_lists_match(const uint32_t *uids, int n_uids, const uint32_t *gids, int n_gids,
                           uint32_t uid, uint32_t gid) {
    if (uid == 0 || (n_uids == 0 && n_gids == 0))
        return true;
    for (int i = 0; i < n_uids; i++)
        if (uids[i] == uid)
            return true;
    for (int i = 0; i < n_gids; i++)
        if (gids[i] == gid)
            return true;
    return false;
}

bool gd_pool_allows(const gd_pool *p, uint32_t uid, uint32_t gid) {
    return id_lists_match(p->allow_uids, p->n_allow_uids, p->allow_gids, p->n_allow_gids, uid,
                          gid);
}

bool gd_pool_may_publish(const gd_pool *p, uint32_t uid, uint32_t gid) {
    return gd_pool_allows(p, uid, gid) &&
           id_lists_match(p->publish_uids, p->n_publish_uids, p->publish_gids,
                          p->n_publish_gids, uid, gid);
}

int gd_pool_alloc_prefer(gd_pool *p, uint64_t size, uint64_t align, gd_slab *const *prefer,
                         uint32_t n_prefer, gd_block *ret, gd_err *err) {
    int r = alloc_prefer(p, size, align, prefer, n_prefer, ret, err);
    if (r < 0)
        p->stats.alloc_failures++;
    return r;
}
