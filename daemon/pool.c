#include "pool.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utlist.h>

#include "util.h"

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
    free(s->free);
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

static int extents_reserve(gd_slab *s, uint32_t n) {
    if (n <= s->cap_free)
        return 0;
    uint32_t cap = s->cap_free ? s->cap_free * 2 : 8;
    while (cap < n)
        cap *= 2;
    gd_extent *e = realloc(s->free, cap * sizeof(*e));
    if (!e)
        return -ENOMEM;
    s->free = e;
    s->cap_free = cap;
    return 0;
}

static bool has_other_spare(const gd_pool *p, const gd_slab *self);
static void take(gd_slab *s, uint32_t i, uint64_t size, uint64_t align, gd_block *ret);

/* Give back an empty regular slab (the spare), if any. */
static bool drop_spare(gd_pool *p) {
    for (gd_slab *s = p->slabs; s; s = s->next)
        if (!s->dedicated && s->blocks == 0 && s->pins == 0) {
            slab_destroy(p, s);
            return true;
        }
    return false;
}

/* A slab not yet backed: room for its free list. NULL when out of memory. */
static gd_slab *slab_new(void) {
    gd_slab *s = calloc(1, sizeof(*s));
    if (s && extents_reserve(s, 8) < 0) {
        free(s);
        s = NULL;
    }
    return s;
}

/* The backed slab s joins p: wholly free, counted, told to the hook. */
static gd_slab *slab_link(gd_pool *p, gd_slab *s, uint64_t id, uint64_t size, bool dedicated) {
    s->id = id;
    s->size = size;
    s->dedicated = dedicated;
    s->pool = p;
    s->free[0] = (gd_extent){0, size};
    s->n_free = 1;
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
    if (!(s = slab_new()))
        return gd_err_set(err, -ENOMEM, "out of memory");
    r = p->be->ops->slab_create(p->be, size, &s->priv, &s->exp, err);
    if (r < 0) {
        free(s->free);
        free(s);
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
    if (size == 0 || size % p->be->granularity || size > p->capacity ||
        p->reserved > p->capacity - size)
        return gd_err_set(err, GPUBUF_EPOOLFULL, "a slab of %llu bytes does not fit the pool",
                          (unsigned long long)size);
    for (s = p->slabs; s; s = s->next)
        if (s->id == id)
            return gd_err_set(err, -EEXIST, "slab %llu twice", (unsigned long long)id);
    if (!(s = slab_new()))
        return gd_err_set(err, -ENOMEM, "out of memory");
    r = p->be->ops->slab_adopt(p->be, fd, size, &s->priv, &s->exp, err);
    if (r < 0) {
        free(s->free);
        free(s);
        return r;
    }
    if (id > *p->next_slab_id)
        *p->next_slab_id = id;
    *ret = slab_link(p, s, id, size, dedicated);
    return 0;
}

int gd_pool_claim(gd_pool *p, gd_slab *s, uint64_t offset, uint64_t size, gd_block *ret,
                  gd_err *err) {
    if (size == 0 || offset > s->size || size > s->size - offset)
        return gd_err_set(err, -EINVAL, "block [%llu, +%llu) outside slab %llu",
                          (unsigned long long)offset, (unsigned long long)size,
                          (unsigned long long)s->id);
    for (uint32_t i = 0; i < s->n_free; i++) {
        gd_extent e = s->free[i];
        if (e.off > offset)
            break;
        if (offset - e.off <= e.len && size <= e.len - (offset - e.off)) {
            if (extents_reserve(s, s->n_free + 1) < 0)
                return gd_err_set(err, -ENOMEM, "out of memory");
            /* take() carves [align_up(e.off), +size): give it the exact start. */
            uint64_t pad = offset - e.off;
            if (pad) {
                memmove(&s->free[i + 1], &s->free[i], (s->n_free - i) * sizeof(*s->free));
                s->free[i] = (gd_extent){e.off, pad};
                s->free[i + 1] = (gd_extent){offset, e.len - pad};
                s->n_free++;
                i++;
            }
            take(s, i, size, 1, ret);
            p->used += size;
            p->n_blocks++;
            return 0;
        }
    }
    return gd_err_set(err, -EINVAL, "block [%llu, +%llu) of slab %llu overlaps another",
                      (unsigned long long)offset, (unsigned long long)size,
                      (unsigned long long)s->id);
}

void gd_pool_trim(gd_pool *p) {
    gd_slab *s, *tmp;
    DL_FOREACH_SAFE(p->slabs, s, tmp) {
        if (s->blocks == 0 && s->pins == 0 && (s->dedicated || has_other_spare(p, s)))
            slab_destroy(p, s);
    }
}

/* Cost of placing (size, align) in extent e; UINT64_MAX when it does not fit. */
static uint64_t fit_waste(const gd_extent *e, uint64_t size, uint64_t align) {
    uint64_t start = gpubuf_align_up(e->off, align);
    uint64_t pad = start - e->off;
    if (pad > e->len || e->len - pad < size)
        return UINT64_MAX;
    return e->len - size;
}

static void take(gd_slab *s, uint32_t i, uint64_t size, uint64_t align, gd_block *ret) {
    gd_extent e = s->free[i];
    uint64_t start = gpubuf_align_up(e.off, align);
    uint64_t pad = start - e.off;
    uint64_t tail = e.len - pad - size;
    /* Padding before the block stays free, and so does the tail. */
    if (pad && tail) {
        /* Room was reserved by the caller. */
        memmove(&s->free[i + 2], &s->free[i + 1], (s->n_free - i - 1) * sizeof(*s->free));
        s->free[i] = (gd_extent){e.off, pad};
        s->free[i + 1] = (gd_extent){start + size, tail};
        s->n_free++;
    } else if (pad) {
        s->free[i] = (gd_extent){e.off, pad};
    } else if (tail) {
        s->free[i] = (gd_extent){start + size, tail};
    } else {
        memmove(&s->free[i], &s->free[i + 1], (s->n_free - i - 1) * sizeof(*s->free));
        s->n_free--;
    }
    s->used += size;
    s->blocks++;
    ret->slab = s;
    ret->offset = start;
    ret->size = size;
}

/* Best fit of (size, align) in slab s, improving on *best_waste; true on an
 * exact fit. */
static bool fit_in(gd_slab *s, uint64_t size, uint64_t align, gd_slab **best,
                   uint32_t *best_i, uint64_t *best_waste) {
    for (uint32_t i = 0; i < s->n_free; i++) {
        uint64_t w = fit_waste(&s->free[i], size, align);
        if (w < *best_waste) {
            *best_waste = w;
            *best = s;
            *best_i = i;
            if (w == 0)
                return true;
        }
    }
    return false;
}

int gd_pool_alloc(gd_pool *p, uint64_t size, uint64_t align, gd_block *ret, gd_err *err) {
    return gd_pool_alloc_prefer(p, size, align, NULL, 0, ret, err);
}

static int alloc_prefer(gd_pool *p, uint64_t size, uint64_t align, gd_slab *const *prefer,
                        uint32_t n_prefer, gd_block *ret, gd_err *err) {
    gd_slab *best = NULL, *s;
    uint32_t best_i = 0;
    uint64_t best_waste = UINT64_MAX;
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
        best_i = 0;
    } else {
        /* The caller's slabs first: best fit among them, if any has room. */
        for (uint32_t k = 0; k < n_prefer; k++) {
            if (prefer[k]->pool == p && !prefer[k]->dedicated &&
                fit_in(prefer[k], size, align, &best, &best_i, &best_waste))
                break;
        }
        for (s = best ? NULL : p->slabs; s; s = s->next) {
            if (!s->dedicated && fit_in(s, size, align, &best, &best_i, &best_waste))
                break;
        }
        if (!best) {
            r = slab_create(p, p->slab_size, false, &s, err);
            if (r < 0)
                return r;
            best = s;
            best_i = 0;
        }
    }
    if (extents_reserve(best, best->n_free + 1) < 0) {
        if (best->blocks == 0 && best->pins == 0 &&
            (best->dedicated || has_other_spare(p, best)))
            slab_destroy(p, best);
        return gd_err_set(err, -ENOMEM, "out of memory");
    }
    take(best, best_i, size, align, ret);
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
    uint32_t lo = 0, hi = s->n_free;
    /* Find the first extent after the block. */
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (s->free[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    bool merge_prev = lo > 0 && s->free[lo - 1].off + s->free[lo - 1].len == off;
    bool merge_next = lo < s->n_free && off + len == s->free[lo].off;
    if (merge_prev && merge_next) {
        s->free[lo - 1].len += len + s->free[lo].len;
        memmove(&s->free[lo], &s->free[lo + 1], (s->n_free - lo - 1) * sizeof(*s->free));
        s->n_free--;
    } else if (merge_prev) {
        s->free[lo - 1].len += len;
    } else if (merge_next) {
        s->free[lo].off = off;
        s->free[lo].len += len;
    } else {
        /* Growing a small array only fails when the process is out of
         * memory; the free list cannot stay consistent without it. */
        if (extents_reserve(s, s->n_free + 1) < 0)
            abort();
        memmove(&s->free[lo + 1], &s->free[lo], (s->n_free - lo) * sizeof(*s->free));
        s->free[lo] = (gd_extent){off, len};
        s->n_free++;
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
    for (const gd_slab *s = p->slabs; s; s = s->next)
        for (uint32_t i = 0; i < s->n_free; i++)
            if (s->free[i].len > m)
                m = s->free[i].len;
    return m;
}

bool gd_pool_allows(const gd_pool *p, uint32_t uid, uint32_t gid) {
    if (uid == 0 || (p->n_allow_uids == 0 && p->n_allow_gids == 0))
        return true;
    for (int i = 0; i < p->n_allow_uids; i++)
        if (p->allow_uids[i] == uid)
            return true;
    for (int i = 0; i < p->n_allow_gids; i++)
        if (p->allow_gids[i] == gid)
            return true;
    return false;
}

int gd_pool_alloc_prefer(gd_pool *p, uint64_t size, uint64_t align, gd_slab *const *prefer,
                         uint32_t n_prefer, gd_block *ret, gd_err *err) {
    int r = alloc_prefer(p, size, align, prefer, n_prefer, ret, err);
    if (r < 0)
        p->stats.alloc_failures++;
    return r;
}
