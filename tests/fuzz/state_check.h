/* The registry's invariants after a restore, shared by the fuzz target
 * "state" and tests/test_restore.c: every id unique and one gpubufd gives,
 * every buffer inside its slab and every slab inside its pool, reference
 * counts that add up, names unique, the next ids above every id in use;
 * and new holders, buffers and slabs get fresh ids. Each returns NULL, or
 * a sentence saying what does not hold (into msg). */
#ifndef GPUBUF_TEST_STATE_CHECK_H
#define GPUBUF_TEST_STATE_CHECK_H

#include <stdarg.h>
#include <stdio.h>

#include "context.h"
#include "core_helpers.h"

static const char *sc_fail(char *msg, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static const char *sc_fail(char *msg, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, len, fmt, ap);
    va_end(ap);
    return msg;
}

#define SC_FAIL(...) return sc_fail(msg, len, __VA_ARGS__)

static bool sc_id_ok(uint64_t id, uint64_t next) {
    return id != 0 && id <= GD_ID_MAX && id <= next && next <= GD_ID_MAX;
}

static const char *sc_slabs(const gd_context *ctx, char *msg, size_t len) {
    for (int i = 0; i < ctx->n_pools; i++) {
        const gd_pool *p = ctx->pools[i];
        uint64_t reserved = 0, used = 0;
        uint32_t n = 0, blocks = 0;
        for (const gd_slab *s = p->slabs; s; s = s->next) {
            uint64_t free_bytes = 0;
            if (!sc_id_ok(s->id, ctx->slab_ids))
                SC_FAIL("slab id %llu (last given %llu)", (unsigned long long)s->id,
                        (unsigned long long)ctx->slab_ids);
            if (s->pool != p)
                SC_FAIL("slab %llu is not of its pool's list", (unsigned long long)s->id);
            for (int j = 0; j <= i; j++)
                for (const gd_slab *t = ctx->pools[j]->slabs; t && t != s; t = t->next)
                    if (t->id == s->id)
                        SC_FAIL("slab id %llu twice", (unsigned long long)s->id);
            for (const gd_extent *e = gd_slab_free_first(s); e; e = gd_slab_free_next(e)) {
                if (e->off >= s->size || e->len > s->size - e->off)
                    SC_FAIL("a free extent outside slab %llu", (unsigned long long)s->id);
                free_bytes += e->len;
            }
            if (s->used > s->size || free_bytes != s->size - s->used)
                SC_FAIL("slab %llu: %llu used + %llu free != %llu", (unsigned long long)s->id,
                        (unsigned long long)s->used, (unsigned long long)free_bytes,
                        (unsigned long long)s->size);
            reserved += s->size;
            used += s->used;
            blocks += s->blocks;
            n++;
        }
        if (reserved != p->reserved || reserved > p->capacity || used != p->used ||
            n != p->n_slabs || blocks != p->n_blocks)
            SC_FAIL("pool '%s': its slabs do not add up to its counts", p->name);
    }
    return NULL;
}

static const char *sc_buffers(gd_context *ctx, char *msg, size_t len) {
    gd_registry *r = &ctx->reg;
    uint32_t n = 0, named = 0;
    for (gd_buf *b = r->by_id; b; b = b->hh_id.next) {
        uint64_t refs = 0;
        n++;
        if (!sc_id_ok(b->id, r->next_buffer_id))
            SC_FAIL("buffer id %llu (last given %llu)", (unsigned long long)b->id,
                    (unsigned long long)r->next_buffer_id);
        if (gd_registry_find_id(r, b->id) != b)
            SC_FAIL("buffer id %llu finds another buffer", (unsigned long long)b->id);
        const gd_slab *s = b->blk.slab;
        if (!s || s->pool != b->pool || !ch_slab_in_pool(b->pool, s))
            SC_FAIL("buffer %llu: its slab is not in its pool", (unsigned long long)b->id);
        if (b->blk.size == 0 || b->blk.offset >= s->size || b->blk.size > s->size - b->blk.offset ||
            b->size == 0 || b->size > b->blk.size)
            SC_FAIL("buffer %llu outside its slab", (unsigned long long)b->id);
        if (b->in_name_index) {
            named++;
            if (!b->name || gd_registry_find_pool_name(r, b->pool, b->name) != b)
                SC_FAIL("buffer %llu: its name finds another", (unsigned long long)b->id);
        }
        for (gd_holder *h = r->holders; h; h = h->hh.next)
            refs += gd_registry_holder_count(h, b->id);
        if (refs != b->refs)
            SC_FAIL("buffer %llu counts %u references, its holders %llu",
                    (unsigned long long)b->id, b->refs, (unsigned long long)refs);
    }
    if (n != r->n_buffers || HASH_CNT(hh_name, r->by_name) != named)
        SC_FAIL("%u buffers listed, %u counted; %u named, %u in the name index", n,
                r->n_buffers, named, (unsigned)HASH_CNT(hh_name, r->by_name));
    return NULL;
}

static const char *sc_holders(gd_context *ctx, char *msg, size_t len) {
    gd_registry *r = &ctx->reg;
    uint32_t detached = 0;
    for (gd_holder *h = r->holders; h; h = h->hh.next) {
        uint64_t refs = 0, ro = 0;
        if (!sc_id_ok(h->id, r->next_holder_id))
            SC_FAIL("holder id %llu (last given %llu)", (unsigned long long)h->id,
                    (unsigned long long)r->next_holder_id);
        for (gd_ref *x = h->refs; x; x = x->hh.next) {
            gd_buf *b = gd_registry_find_id(r, x->buffer_id);
            if (!b || x->count == 0 || x->ro > x->count || !x->hs || x->hs->slab != b->blk.slab)
                SC_FAIL("holder %llu: a bad reference to buffer %llu", (unsigned long long)h->id,
                        (unsigned long long)x->buffer_id);
            refs += x->count;
            ro += x->ro;
        }
        if (refs != h->n_refs || ro != h->n_ro_refs)
            SC_FAIL("holder %llu: %llu references, %u counted", (unsigned long long)h->id,
                    (unsigned long long)refs, h->n_refs);
        detached += h->detached;
    }
    if (detached != r->n_detached)
        SC_FAIL("%u detached holders, %u counted", detached, r->n_detached);
    return NULL;
}

/* The registry and pools of ctx as a restore must leave them. */
static const char *state_check(gd_context *ctx, char *msg, size_t len) {
    const char *e = sc_slabs(ctx, msg, len);
    if (!e)
        e = sc_buffers(ctx, msg, len);
    if (!e)
        e = sc_holders(ctx, msg, len);
    return e;
}

/* A new holder and up to n new buffers (4 KiB, anonymous, in pool) get ids
 * nobody has; so does a slab made for them. Everything made is let go. */
static const char *state_check_fresh(gd_context *ctx, gd_pool *pool, int n, char *msg,
                                     size_t len) {
    gd_registry *r = &ctx->reg;
    uint64_t max_buf = 0, max_holder = 0, max_slab = 0;
    for (gd_buf *b = r->by_id; b; b = b->hh_id.next)
        max_buf = b->id > max_buf ? b->id : max_buf;
    for (gd_holder *h = r->holders; h; h = h->hh.next)
        max_holder = h->id > max_holder ? h->id : max_holder;
    for (int i = 0; i < ctx->n_pools; i++)
        for (gd_slab *s = ctx->pools[i]->slabs; s; s = s->next)
            max_slab = s->id > max_slab ? s->id : max_slab;
    uint32_t n_slabs = pool->n_slabs;
    gd_holder *h = gd_registry_holder_new(r, 1, 0, 0);
    if (!h)
        return r->next_holder_id >= GD_ID_MAX ? NULL : sc_fail(msg, len, "no new holder");
    if (h->id <= max_holder || h->id > GD_ID_MAX)
        SC_FAIL("new holder id %llu, %llu in use", (unsigned long long)h->id,
                (unsigned long long)max_holder);
    for (int i = 0; i < n; i++) {
        gd_buf *b = NULL;
        gd_err err = {0};
        if (gd_registry_alloc(r, h, pool, 4096, 0, NULL, &b, &err) < 0)
            break; /* full, or the ids are used up: refused, not wrapped */
        if (b->id <= max_buf || b->id > GD_ID_MAX)
            SC_FAIL("new buffer id %llu, %llu in use", (unsigned long long)b->id,
                    (unsigned long long)max_buf);
        /* A slab made for it (the pool puts it first): an id above every
         * other. */
        if (pool->n_slabs > n_slabs) {
            if (pool->slabs->id <= max_slab || pool->slabs->id > GD_ID_MAX)
                SC_FAIL("new slab id %llu, %llu in use", (unsigned long long)pool->slabs->id,
                        (unsigned long long)max_slab);
            max_slab = pool->slabs->id;
        }
        n_slabs = pool->n_slabs;
        if (gd_registry_find_id(r, b->id) != b)
            SC_FAIL("new buffer id %llu finds another", (unsigned long long)b->id);
        max_buf = b->id;
    }
    const char *e = state_check(ctx, msg, len);
    gd_registry_holder_drop(r, h);
    return e;
}

#undef SC_FAIL

#endif
