/* Unit tests for the registry room (daemon/registry.c) over a real pool on
 * the host backend: buffer states, names, references per holder, deletion,
 * dropped clients and waiters. Run under the address sanitizer build, the
 * tests also check that nothing leaks (each test frees its registry and
 * pool) and that no freed buffer or waiter is touched. */
#include <check.h>
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "pool.h"
#include "registry.h"
#include "check_main.h"
#include "layout_helpers.h"
#include "util.h"

/* Where the calls under test write their error (one per test process). */
static gd_err tr_err;

#define MIB (1024ull * 1024ull)

#define UID_A 1000
#define UID_B 1001

/* ---- helpers ------------------------------------------------------------- */

/* A registry over one pool: 1 MiB slabs, 8 MiB capacity unless told. */
typedef struct env {
    uint64_t slab_ids;
    gd_pool *pool;
    gd_registry reg;
} env;

static void env_init_cap(env *e, uint64_t capacity) {
    gd_backend *be = NULL;
    memset(e, 0, sizeof(*e));
    ck_assert_int_eq(gd_backend_host_new(&be, NULL), 0);
    ck_assert_int_eq(gd_pool_new("host", be, capacity, MIB, &e->slab_ids, &e->pool, &tr_err), 0);
    gd_registry_init(&e->reg);
    e->reg.default_pool = e->pool;
}

static void env_init(env *e) {
    env_init_cap(e, 8 * MIB);
}

/* Destroy the registry: every block must be back in the pool. */
static void env_fini(env *e) {
    gd_registry_destroy(&e->reg);
    ck_assert_uint_eq(e->pool->used, 0);
    ck_assert_uint_eq(e->pool->n_blocks, 0);
    gd_pool_free(e->pool);
}

static gd_holder *holder(env *e, uid_t uid) {
    gd_holder *h = gd_registry_holder_new(&e->reg, 100 + (pid_t)uid, uid, uid);
    ck_assert_ptr_nonnull(h);
    ck_assert_uint_eq(h->uid, uid);
    ck_assert_uint_eq(h->n_refs, 0);
    return h;
}

static gd_buf *alloc_ok(env *e, gd_holder *h, uint64_t size, const char *name) {
    gd_buf *b = NULL;
    int r = gd_registry_alloc(&e->reg, h, e->pool, size, 0, name, &b, &tr_err);
    ck_assert_msg(r == 0, "alloc(%llu, %s) = %d: %s", (unsigned long long)size,
                  name ? name : "(anonymous)", r, tr_err.msg);
    ck_assert_ptr_nonnull(b);
    return b;
}

static void seal_ok(env *e, gd_holder *h, gd_buf *b) {
    gd_buf *ret = NULL;
    int r = gd_registry_seal(&e->reg, h, b->id, &ret, &tr_err);
    ck_assert_msg(r == 0, "seal(%llu) = %d: %s", (unsigned long long)b->id, r, tr_err.msg);
    ck_assert_ptr_eq(ret, b);
    ck_assert_int_eq(b->state, GPUBUF_STATE_SEALED);
}

/* A sealed buffer in one call. */
static gd_buf *publish(env *e, gd_holder *h, uint64_t size, const char *name) {
    gd_buf *b = alloc_ok(e, h, size, name);
    seal_ok(e, h, b);
    return b;
}

static unsigned holder_total(const gd_registry *r) {
    return HASH_CNT(hh, r->holders);
}

/* A waiter embedded the way a session embeds it, recording its callbacks. */
typedef struct test_waiter {
    gd_waiter w; /* first member: the callbacks cast back */
    char name[64];
    int woken, cancelled;
    gd_buf *buf;
    uint64_t buf_id;
    uint32_t count_at_wake; /* the holder's references to buf during wake() */
    bool unlinked_at_wake;
} test_waiter;

static bool waiter_unlinked(const gd_waiter *w) {
    return !w->next && !w->prev && !w->hnext && !w->hprev;
}

static void tw_wake(gd_waiter *w, gd_buf *b) {
    test_waiter *t = (test_waiter *)w;
    t->woken++;
    t->buf = b;
    t->buf_id = b->id;
    t->count_at_wake = gd_registry_holder_count(w->holder, b->id);
    t->unlinked_at_wake = waiter_unlinked(w);
}

static void tw_cancel(gd_waiter *w) {
    test_waiter *t = (test_waiter *)w;
    t->cancelled++;
}

/* Wait for a name (name != NULL) or an id. */
static void tw_wait(env *e, test_waiter *t, gd_holder *h, const char *name, uint64_t id) {
    memset(t, 0, sizeof(*t));
    t->w.holder = h;
    if (name) {
        snprintf(t->name, sizeof(t->name), "%s", name);
        t->w.name = t->name;
    }
    t->w.buffer_id = id;
    t->w.wake = tw_wake;
    t->w.cancel = tw_cancel;
    gd_registry_wait(&e->reg, &t->w);
}

/* ---- alloc ------------------------------------------------------------- */

/* A holder's allocations go first to the slabs of the buffers it references
 * (its process has them mapped), even when another slab fits better; once
 * it references nothing there, plain best fit again. */
START_TEST(test_placement_prefers_held_slabs) {
    env e;
    env_init(&e);
    gd_holder *a = holder(&e, UID_A), *b = holder(&e, UID_B);
    gd_buf *a1 = alloc_ok(&e, a, 768 * 1024, "a1");
    gd_buf *b1 = alloc_ok(&e, b, 900 * 1024, "b1");
    ck_assert_ptr_ne(a1->blk.slab, b1->blk.slab); /* no room for b1 next to a1 */
    ck_assert_uint_eq(HASH_COUNT(a->slabs), 1);
    /* 64 KiB fits best in b1's slab (124 KiB free) but goes next to a1. */
    gd_buf *a2 = alloc_ok(&e, a, 64 * 1024, "a2");
    ck_assert_ptr_eq(a2->blk.slab, a1->blk.slab);
    ck_assert_uint_eq(HASH_COUNT(a->slabs), 1);
    ck_assert_uint_eq(a->slabs->buffers, 2);
    gd_buf *b2 = alloc_ok(&e, b, 64 * 1024, "b2");
    ck_assert_ptr_eq(b2->blk.slab, b1->blk.slab);
    /* a's slab is full for this size: the pool's best fit elsewhere. */
    gd_buf *a3 = alloc_ok(&e, a, 200 * 1024, "a3");
    ck_assert_ptr_ne(a3->blk.slab, a1->blk.slab);
    ck_assert_uint_eq(HASH_COUNT(a->slabs), 2);
    ck_assert_int_eq(gd_registry_release(&e.reg, a, a1->id, &tr_err), 0);
    ck_assert_int_eq(gd_registry_release(&e.reg, a, a2->id, &tr_err), 0);
    ck_assert_int_eq(gd_registry_release(&e.reg, a, a3->id, &tr_err), 0);
    ck_assert_ptr_null(a->slabs);
    /* Nothing held: best fit, which is b1's slab (60 KiB free after b2). */
    gd_buf *a4 = alloc_ok(&e, a, 32 * 1024, "a4");
    ck_assert_ptr_eq(a4->blk.slab, b1->blk.slab);
    /* Opening counts too: a opens b1 and its buffers follow b's slab. */
    seal_ok(&e, b, b1);
    gd_buf *o = NULL;
    ck_assert_int_eq(gd_registry_open(&e.reg, a, "b1", 0, &o, NULL, &tr_err), 0);
    ck_assert_uint_eq(HASH_COUNT(a->slabs), 1);
    ck_assert_uint_eq(a->slabs->buffers, 2);
    gd_registry_holder_drop(&e.reg, a);
    gd_registry_holder_drop(&e.reg, b);
    env_fini(&e);
}
END_TEST

/* Kept slabs: pinned past their last block, up to the holder's cap, until
 * unmapped or the holder goes. */
START_TEST(test_kept_slabs) {
    env e;
    env_init(&e);
    gd_holder *a = holder(&e, UID_A), *b = holder(&e, UID_B);
    a->kept_cap = 1; /* b keeps the default of 0: no slab */
    gd_buf *a1 = alloc_ok(&e, a, 768 * 1024, "a1");
    gd_slab *s1 = a1->blk.slab;
    gd_buf *b1 = alloc_ok(&e, b, 768 * 1024, "b1");
    gd_slab *s2 = b1->blk.slab;
    ck_assert_ptr_ne(s1, s2);
    ck_assert_int_eq(gd_registry_release_keep(&e.reg, a, a1->id, true, &tr_err), 0);
    ck_assert_uint_eq(s1->pins, 1);
    ck_assert_uint_eq(s1->blocks, 0); /* a1 (never sealed) is gone, the slab stays */
    ck_assert_uint_eq(a->n_kept, 1);
    ck_assert_int_eq(gd_registry_release_keep(&e.reg, b, b1->id, true, &tr_err), -EDQUOT);
    ck_assert_uint_eq(b->n_refs, 0); /* released all the same */
    /* s2 went (empty, and s1 is another empty slab); s1 stayed, pinned. */
    ck_assert_uint_eq(e.pool->n_slabs, 1);
    /* a's next buffer lands in its kept slab; keeping it again is a no-op,
     * and a second slab is over a's cap. */
    gd_buf *a2 = alloc_ok(&e, a, 200 * 1024, "a2");
    ck_assert_ptr_eq(a2->blk.slab, s1);
    gd_buf *a3 = alloc_ok(&e, a, 900 * 1024, "a3");
    ck_assert_ptr_ne(a3->blk.slab, s1);
    ck_assert_int_eq(gd_registry_release_keep(&e.reg, a, a2->id, true, &tr_err), 0);
    ck_assert_int_eq(gd_registry_release_keep(&e.reg, a, a3->id, true, &tr_err), -EDQUOT);
    ck_assert_uint_eq(s1->pins, 1);
    ck_assert_uint_eq(a->n_kept, 1);
    ck_assert_int_eq(gd_registry_unmap(&e.reg, a, s1->id + 1000, &tr_err), GPUBUF_ENOTHELD);
    ck_assert_int_eq(gd_registry_unmap(&e.reg, a, s1->id, &tr_err), 0);
    ck_assert_uint_eq(a->n_kept, 0);
    ck_assert_ptr_null(a->slabs);
    ck_assert_int_eq(gd_registry_unmap(&e.reg, a, s1->id, &tr_err), GPUBUF_ENOTHELD);
    ck_assert_uint_le(e.pool->n_slabs, 1); /* the spare at most */
    /* A holder that goes unpins what it kept. */
    gd_buf *a4 = alloc_ok(&e, a, 768 * 1024, "a4");
    gd_slab *s4 = a4->blk.slab;
    gd_buf *a5 = alloc_ok(&e, a, 768 * 1024, "a5"); /* another slab: s4 cannot be the spare */
    ck_assert_int_eq(gd_registry_release_keep(&e.reg, a, a4->id, true, &tr_err), 0);
    ck_assert_uint_eq(s4->pins, 1);
    gd_registry_holder_drop(&e.reg, a);
    (void)a5;
    ck_assert_uint_eq(e.pool->used, 0);
    ck_assert_uint_eq(e.pool->n_slabs, 1); /* one spare; the unpinned s4 or the other */
    gd_registry_holder_drop(&e.reg, b);
    env_fini(&e);
}
END_TEST

START_TEST(test_alloc_reference) {
    env e;
    env_init(&e);
    gd_holder *h = holder(&e, UID_A);
    ck_assert_uint_eq(e.reg.n_buffers, 0);

    gd_buf *b = alloc_ok(&e, h, 1000, "frame");
    ck_assert_int_eq(b->state, GPUBUF_STATE_ALLOCATED);
    ck_assert_uint_eq(b->refs, 1);
    ck_assert_uint_eq(gd_registry_holder_count(h, b->id), 1);
    ck_assert_uint_eq(h->n_refs, 1);
    ck_assert_uint_gt(b->id, 0);
    ck_assert_str_eq(b->name, "frame");
    ck_assert_uint_eq(b->size, 1000);
    ck_assert_ptr_eq(b->pool, e.pool);
    ck_assert_uint_eq(b->owner_uid, UID_A);
    ck_assert_uint_eq(b->owner_holder, h->id);
    ck_assert_uint_ge(b->blk.size, 1000);
    ck_assert_uint_eq(b->blk.offset % e.pool->be->alignment, 0);
    ck_assert_uint_eq(e.pool->used, b->blk.size);
    ck_assert_uint_eq(e.pool->n_blocks, 1);
    ck_assert_uint_eq(e.reg.n_buffers, 1);
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, b->id), b);
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "frame"), b);

    /* An explicit alignment reaches the pool. */
    gd_buf *a = NULL;
    uint64_t align = e.pool->be->granularity;
    ck_assert_int_eq(gd_registry_alloc(&e.reg, h, e.pool, 10, align, NULL, &a, &tr_err), 0);
    ck_assert_uint_eq(a->blk.offset % align, 0);
    ck_assert_uint_gt(a->id, b->id);
    ck_assert_uint_eq(h->n_refs, 2);
    ck_assert_uint_eq(gd_registry_holder_count(h, a->id), 1);
    ck_assert_uint_eq(gd_registry_holder_count(h, b->id), 1);

    /* Bad sizes and alignments: nothing is created. */
    gd_buf *x = NULL;
    ck_assert_int_eq(gd_registry_alloc(&e.reg, h, e.pool, 0, 0, "zero", &x, &tr_err), -EINVAL);
    ck_assert_str_ne(tr_err.msg, "");
    tr_err.msg[0] = '\0';
    ck_assert_int_eq(gd_registry_alloc(&e.reg, h, e.pool, 10, 3, "three", &x, &tr_err), -EINVAL);
    ck_assert_str_ne(tr_err.msg, "");
    ck_assert_ptr_null(x);
    ck_assert_ptr_null(gd_registry_find_name(&e.reg, "zero"));
    ck_assert_ptr_null(gd_registry_find_name(&e.reg, "three"));
    ck_assert_uint_eq(e.reg.n_buffers, 2);
    ck_assert_uint_eq(h->n_refs, 2);
    env_fini(&e);
}
END_TEST

START_TEST(test_alloc_pool_full) {
    env e;
    env_init_cap(&e, 2 * MIB);
    gd_holder *h = holder(&e, UID_A);
    gd_buf *x = NULL;

    int r = gd_registry_alloc(&e.reg, h, e.pool, 3 * MIB, 0, "huge", &x, &tr_err);
    ck_assert_int_eq(r, GPUBUF_EPOOLFULL);
    ck_assert_ptr_null(x);
    /* Not "full": the request alone exceeds the pool. */
    ck_assert_ptr_nonnull(strstr(tr_err.msg, "larger than pool"));
    /* A failed allocation takes neither a name, nor an id, nor a reference. */
    ck_assert_ptr_null(gd_registry_find_name(&e.reg, "huge"));
    ck_assert_uint_eq(e.reg.n_buffers, 0);
    ck_assert_uint_eq(h->n_refs, 0);
    gd_buf *b = alloc_ok(&e, h, MIB, "huge");
    ck_assert_uint_eq(b->id, 1);
    gd_buf *c = alloc_ok(&e, h, MIB, "second");
    ck_assert_int_eq(gd_registry_alloc(&e.reg, h, e.pool, 1, 0, "third", &x, &tr_err), GPUBUF_EPOOLFULL);
    ck_assert_uint_eq(e.reg.n_buffers, 2);
    /* Releasing makes room again. */
    ck_assert_int_eq(gd_registry_release(&e.reg, h, c->id, &tr_err), 0);
    alloc_ok(&e, h, 1, "third");
    (void)b;
    env_fini(&e);
}
END_TEST

/* ---- names --------------------------------------------------------------- */

START_TEST(test_name_duplicate) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B);
    gd_buf *b = alloc_ok(&e, h1, 100, "dup");
    gd_buf *x = NULL;
    uint64_t used = e.pool->used;

    /* Taken while allocated, by the same or another client. */
    ck_assert_int_eq(gd_registry_alloc(&e.reg, h1, e.pool, 100, 0, "dup", &x, &tr_err), -EEXIST);
    ck_assert_str_ne(tr_err.msg, "");
    ck_assert_int_eq(gd_registry_alloc(&e.reg, h2, e.pool, 100, 0, "dup", &x, &tr_err), -EEXIST);
    /* And while sealed. */
    seal_ok(&e, h1, b);
    ck_assert_int_eq(gd_registry_alloc(&e.reg, h2, e.pool, 100, 0, "dup", &x, &tr_err), -EEXIST);
    ck_assert_ptr_null(x);
    ck_assert_uint_eq(e.pool->used, used);
    ck_assert_uint_eq(e.reg.n_buffers, 1);
    ck_assert_uint_eq(h2->n_refs, 0);
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "dup"), b);
    /* Names are case sensitive and compared whole. */
    gd_buf *c = alloc_ok(&e, h2, 100, "DUP");
    gd_buf *d = alloc_ok(&e, h2, 100, "dup2");
    gd_buf *f = alloc_ok(&e, h2, 100, "du");
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "DUP"), c);
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "dup2"), d);
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "du"), f);
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "dup"), b);
    env_fini(&e);
}
END_TEST

START_TEST(test_name_invalid) {
    static const char *const bad[] = {
        "has space", "/leading-slash", "star*",       "semi;colon", "new\nline", "tab\t",
        "quote\"",   "caf\xc3\xa9",    "back\\slash", "percent%s",  "q?",
    };
    static const char *const good[] = {
        "a", "Z9", "cam0/frame.42", "user@host:buf", "a+b-c_d", "trailing/", "-dash", ".dot",
    };
    env e;
    env_init(&e);
    gd_holder *h = holder(&e, UID_A);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        gd_buf *x = NULL;
        tr_err.msg[0] = '\0';
        int r = gd_registry_alloc(&e.reg, h, e.pool, 64, 0, bad[i], &x, &tr_err);
        ck_assert_msg(r == -EINVAL, "name '%s': %d", bad[i], r);
        ck_assert_str_ne(tr_err.msg, "");
        ck_assert_ptr_null(x);
        ck_assert_ptr_null(gd_registry_find_name(&e.reg, bad[i]));
    }
    ck_assert_uint_eq(e.reg.n_buffers, 0);
    ck_assert_uint_eq(e.pool->used, 0);
    ck_assert_uint_eq(h->n_refs, 0);
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        gd_buf *b = alloc_ok(&e, h, 64, good[i]);
        ck_assert_str_eq(b->name, good[i]);
        ck_assert_ptr_eq(gd_registry_find_name(&e.reg, good[i]), b);
    }
    ck_assert_uint_eq(e.reg.n_buffers, sizeof(good) / sizeof(good[0]));
    env_fini(&e);
}
END_TEST

START_TEST(test_name_too_long) {
    char name[GPUBUF_NAME_MAX + 2];
    env e;
    env_init(&e);
    gd_holder *h = holder(&e, UID_A);
    gd_buf *x = NULL;

    /* 256 bytes: one too many. */
    memset(name, 'n', GPUBUF_NAME_MAX + 1);
    name[GPUBUF_NAME_MAX + 1] = '\0';
    ck_assert_uint_eq(strlen(name), 256);
    ck_assert_int_eq(gd_registry_alloc(&e.reg, h, e.pool, 64, 0, name, &x, &tr_err), -ENAMETOOLONG);
    ck_assert_str_ne(tr_err.msg, "");
    ck_assert_ptr_null(x);
    ck_assert_uint_eq(e.reg.n_buffers, 0);
    /* Too long and invalid: the length is what is reported. */
    name[10] = ' ';
    ck_assert_int_eq(gd_registry_alloc(&e.reg, h, e.pool, 64, 0, name, &x, &tr_err), -ENAMETOOLONG);
    /* 255 bytes is the longest accepted name. */
    memset(name, 'n', GPUBUF_NAME_MAX);
    name[GPUBUF_NAME_MAX] = '\0';
    gd_buf *b = alloc_ok(&e, h, 64, name);
    ck_assert_uint_eq(strlen(b->name), GPUBUF_NAME_MAX);
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, name), b);
    env_fini(&e);
}
END_TEST

START_TEST(test_anonymous) {
    env e;
    env_init(&e);
    gd_holder *h = holder(&e, UID_A);
    gd_buf *a = alloc_ok(&e, h, 64, NULL);
    gd_buf *b = alloc_ok(&e, h, 64, NULL);
    gd_buf *c = alloc_ok(&e, h, 64, ""); /* an empty name means anonymous */

    ck_assert_ptr_null(a->name);
    ck_assert_ptr_null(b->name);
    ck_assert_ptr_null(c->name);
    ck_assert(!a->in_name_index && !b->in_name_index && !c->in_name_index);
    ck_assert_uint_ne(a->id, b->id);
    ck_assert_uint_ne(b->id, c->id);
    ck_assert_uint_eq(e.reg.n_buffers, 3);
    ck_assert_uint_eq(HASH_CNT(hh_name, e.reg.by_name), 0);
    ck_assert_uint_eq(HASH_CNT(hh_id, e.reg.by_id), 3);
    ck_assert_ptr_null(gd_registry_find_name(&e.reg, ""));
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, c->id), c);
    ck_assert_uint_eq(h->n_refs, 3);

    /* Sealed, an anonymous buffer is opened by id only. */
    gd_holder *h2 = holder(&e, UID_B);
    gd_buf *o = NULL;
    seal_ok(&e, h, a);
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, NULL, a->id, &o, NULL, &tr_err), 0);
    ck_assert_ptr_eq(o, a);
    /* "" is no name: the registry's name rules refuse it. */
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "", 0, &o, NULL, &tr_err), -EINVAL);
    ck_assert_uint_eq(a->refs, 2);
    env_fini(&e);
}
END_TEST

/* ---- seal and open ------------------------------------------------------- */

START_TEST(test_open_unsealed) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B);
    gd_buf *b = alloc_ok(&e, h1, 64, "pending");
    gd_buf *o = NULL;

    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "pending", 0, &o, NULL, &tr_err), -ENOENT);
    ck_assert_str_ne(tr_err.msg, "");
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, NULL, b->id, &o, NULL, &tr_err), -ENOENT);
    /* Not even the creator can open it before the seal. */
    ck_assert_int_eq(gd_registry_open(&e.reg, h1, "pending", 0, &o, NULL, &tr_err), -ENOENT);
    /* Unknown names and ids. */
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "nothing", 0, &o, NULL, &tr_err), -ENOENT);
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, NULL, b->id + 100, &o, NULL, &tr_err), -ENOENT);
    ck_assert_ptr_null(o);
    ck_assert_uint_eq(b->refs, 1);
    ck_assert_uint_eq(h1->n_refs, 1);
    ck_assert_uint_eq(h2->n_refs, 0);
    ck_assert_uint_eq(gd_registry_holder_count(h2, b->id), 0);

    seal_ok(&e, h1, b);
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "pending", 0, &o, NULL, &tr_err), 0);
    ck_assert_ptr_eq(o, b);
    env_fini(&e);
}
END_TEST

START_TEST(test_seal_permissions_state) {
    env e;
    env_init(&e);
    gd_holder *owner = holder(&e, UID_A);
    gd_holder *same_uid = holder(&e, UID_A);
    gd_holder *other = holder(&e, UID_B);
    gd_holder *root = holder(&e, 0);
    gd_buf *b = alloc_ok(&e, owner, 64, "s");
    gd_buf *ret = NULL;

    /* Only the holder that allocated it may seal, whatever its uid. */
    ck_assert_int_eq(gd_registry_seal(&e.reg, other, b->id, &ret, &tr_err), -EPERM);
    ck_assert_str_ne(tr_err.msg, "");
    ck_assert_int_eq(gd_registry_seal(&e.reg, same_uid, b->id, &ret, &tr_err), -EPERM);
    ck_assert_int_eq(gd_registry_seal(&e.reg, root, b->id, &ret, &tr_err), -EPERM);
    ck_assert_ptr_null(ret);
    ck_assert_int_eq(b->state, GPUBUF_STATE_ALLOCATED);

    ck_assert_int_eq(gd_registry_seal(&e.reg, owner, b->id, &ret, &tr_err), 0);
    ck_assert_ptr_eq(ret, b);
    ck_assert_int_eq(b->state, GPUBUF_STATE_SEALED);
    /* Sealing takes no reference. */
    ck_assert_uint_eq(b->refs, 1);
    ck_assert_uint_eq(owner->n_refs, 1);

    ret = NULL;
    tr_err.msg[0] = '\0';
    ck_assert_int_eq(gd_registry_seal(&e.reg, owner, b->id, &ret, &tr_err), GPUBUF_ESTATE);
    ck_assert_str_ne(tr_err.msg, "");
    ck_assert_ptr_null(ret);
    ck_assert_int_eq(b->state, GPUBUF_STATE_SEALED);
    /* Unknown id. */
    ck_assert_int_eq(gd_registry_seal(&e.reg, owner, b->id + 1, &ret, &tr_err), -ENOENT);

    /* A deleted (never sealed) buffer cannot be sealed any more. */
    gd_buf *d = alloc_ok(&e, owner, 64, "d");
    ck_assert_int_eq(gd_registry_delete(&e.reg, owner, "d", 0, &tr_err), 0);
    ck_assert_int_eq(d->state, GPUBUF_STATE_DELETED);
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, d->id), d);
    ck_assert_int_eq(gd_registry_seal(&e.reg, owner, d->id, &ret, &tr_err), GPUBUF_ESTATE);
    ck_assert_int_eq(d->state, GPUBUF_STATE_DELETED);
    ck_assert_ptr_null(gd_registry_find_name(&e.reg, "d"));
    env_fini(&e);
}
END_TEST

START_TEST(test_open_refcounts) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B), *h3 = holder(&e, UID_B);
    gd_buf *b = publish(&e, h1, 4096, "shared");
    gd_buf *c = publish(&e, h1, 4096, "other");
    gd_buf *o = NULL;

    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "shared", 0, &o, NULL, &tr_err), 0);
    ck_assert_ptr_eq(o, b);
    o = NULL;
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "shared", 0, &o, NULL, &tr_err), 0);
    ck_assert_ptr_eq(o, b);
    o = NULL;
    ck_assert_int_eq(gd_registry_open(&e.reg, h3, NULL, b->id, &o, NULL, &tr_err), 0);
    ck_assert_ptr_eq(o, b);
    ck_assert_int_eq(gd_registry_open(&e.reg, h3, "other", 0, &o, NULL, &tr_err), 0);
    ck_assert_ptr_eq(o, c);
    /* The creator may open its own sealed buffer too. */
    ck_assert_int_eq(gd_registry_open(&e.reg, h1, NULL, b->id, &o, NULL, &tr_err), 0);

    ck_assert_uint_eq(gd_registry_holder_count(h1, b->id), 2);
    ck_assert_uint_eq(gd_registry_holder_count(h2, b->id), 2);
    ck_assert_uint_eq(gd_registry_holder_count(h3, b->id), 1);
    ck_assert_uint_eq(gd_registry_holder_count(h2, c->id), 0);
    ck_assert_uint_eq(gd_registry_holder_count(h3, c->id), 1);
    ck_assert_uint_eq(b->refs, 5);
    ck_assert_uint_eq(c->refs, 2);
    ck_assert_uint_eq(h1->n_refs, 3);
    ck_assert_uint_eq(h2->n_refs, 2);
    ck_assert_uint_eq(h3->n_refs, 2);
    ck_assert_uint_eq(HASH_CNT(hh, h3->refs), 2);
    ck_assert_uint_eq(HASH_CNT(hh, h2->refs), 1);

    /* Releases undo exactly one reference each. */
    ck_assert_int_eq(gd_registry_release(&e.reg, h2, b->id, &tr_err), 0);
    ck_assert_uint_eq(gd_registry_holder_count(h2, b->id), 1);
    ck_assert_uint_eq(b->refs, 4);
    ck_assert_uint_eq(h2->n_refs, 1);
    ck_assert_int_eq(gd_registry_release(&e.reg, h3, b->id, &tr_err), 0);
    ck_assert_uint_eq(gd_registry_holder_count(h3, b->id), 0);
    ck_assert_uint_eq(gd_registry_holder_count(h3, c->id), 1);
    ck_assert_uint_eq(HASH_CNT(hh, h3->refs), 1);
    ck_assert_uint_eq(b->refs, 3);
    env_fini(&e);
}
END_TEST

/* ---- release -------------------------------------------------------------- */

START_TEST(test_release_not_held) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B);
    gd_buf *b = publish(&e, h1, 64, "r");
    gd_buf *o = NULL;

    /* h2 holds nothing yet. */
    ck_assert_int_eq(gd_registry_release(&e.reg, h2, b->id, &tr_err), GPUBUF_ENOTHELD);
    ck_assert_str_ne(tr_err.msg, "");
    ck_assert_int_eq(gd_registry_release(&e.reg, h2, 12345, &tr_err), GPUBUF_ENOTHELD);
    ck_assert_uint_eq(b->refs, 1);
    ck_assert_uint_eq(h1->n_refs, 1);

    /* Open once, release twice: the second one is refused. */
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "r", 0, &o, NULL, &tr_err), 0);
    ck_assert_uint_eq(b->refs, 2);
    ck_assert_int_eq(gd_registry_release(&e.reg, h2, b->id, &tr_err), 0);
    ck_assert_uint_eq(b->refs, 1);
    ck_assert_uint_eq(h2->n_refs, 0);
    ck_assert_ptr_null(h2->refs);
    tr_err.msg[0] = '\0';
    ck_assert_int_eq(gd_registry_release(&e.reg, h2, b->id, &tr_err), GPUBUF_ENOTHELD);
    ck_assert_str_ne(tr_err.msg, "");
    ck_assert_uint_eq(b->refs, 1);
    ck_assert_uint_eq(h2->n_refs, 0);
    /* h1's reference was never touched. */
    ck_assert_uint_eq(gd_registry_holder_count(h1, b->id), 1);

    /* The same for the creator: double release of a sealed named buffer. */
    ck_assert_int_eq(gd_registry_release(&e.reg, h1, b->id, &tr_err), 0);
    ck_assert_int_eq(gd_registry_release(&e.reg, h1, b->id, &tr_err), GPUBUF_ENOTHELD);
    ck_assert_uint_eq(b->refs, 0);
    ck_assert_uint_eq(h1->n_refs, 0);
    env_fini(&e);
}
END_TEST

START_TEST(test_named_sealed_persists) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_A);
    gd_buf *b = publish(&e, h1, 5000, "keep");
    uint64_t id = b->id, blk = b->blk.size;
    gd_buf *o = NULL;

    ck_assert_int_eq(gd_registry_release(&e.reg, h1, id, &tr_err), 0);
    /* No references left, but still published. */
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "keep"), b);
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, id), b);
    ck_assert_uint_eq(b->refs, 0);
    ck_assert_int_eq(b->state, GPUBUF_STATE_SEALED);
    ck_assert_uint_eq(e.pool->used, blk);
    ck_assert_uint_eq(e.reg.n_buffers, 1);
    ck_assert_uint_eq(e.reg.freed_buffers, 0);

    /* Another client opens and releases it: it still stays. */
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "keep", 0, &o, NULL, &tr_err), 0);
    ck_assert_ptr_eq(o, b);
    ck_assert_uint_eq(b->refs, 1);
    ck_assert_int_eq(gd_registry_release(&e.reg, h2, id, &tr_err), 0);
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "keep"), b);
    ck_assert_uint_eq(e.pool->used, blk);

    /* Deleted with no references: the memory goes back at once. */
    ck_assert_int_eq(gd_registry_delete(&e.reg, h2, "keep", 0, &tr_err), 0);
    ck_assert_ptr_null(gd_registry_find_name(&e.reg, "keep"));
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, id));
    ck_assert_uint_eq(e.pool->used, 0);
    ck_assert_uint_eq(e.pool->n_blocks, 0);
    ck_assert_uint_eq(e.reg.n_buffers, 0);
    ck_assert_uint_eq(e.reg.freed_buffers, 1);
    ck_assert_int_eq(gd_registry_delete(&e.reg, h2, "keep", 0, &tr_err), -ENOENT);
    ck_assert_int_eq(gd_registry_delete(&e.reg, h2, NULL, id, &tr_err), -ENOENT);
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, NULL, id, &o, NULL, &tr_err), -ENOENT);
    /* The same again, deleting by id. */
    b = publish(&e, h1, 10, "keep");
    ck_assert_int_eq(gd_registry_release(&e.reg, h1, b->id, &tr_err), 0);
    ck_assert_uint_eq(e.pool->n_blocks, 1);
    ck_assert_int_eq(gd_registry_delete(&e.reg, h1, NULL, b->id, &tr_err), 0);
    ck_assert_uint_eq(e.pool->used, 0);
    ck_assert_uint_eq(e.reg.freed_buffers, 2);
    env_fini(&e);
}
END_TEST

START_TEST(test_anonymous_freed_with_last_ref) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B);
    gd_buf *b = publish(&e, h1, 3000, NULL);
    gd_buf *keep = publish(&e, h1, 100, "other");
    uint64_t id = b->id, keep_used = keep->blk.size;
    gd_buf *o = NULL;

    ck_assert_int_eq(gd_registry_open(&e.reg, h2, NULL, id, &o, NULL, &tr_err), 0);
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, NULL, id, &o, NULL, &tr_err), 0);
    ck_assert_int_eq(gd_registry_release(&e.reg, h1, id, &tr_err), 0);
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, id), b);
    ck_assert_uint_eq(b->refs, 2);
    ck_assert_int_eq(gd_registry_release(&e.reg, h2, id, &tr_err), 0);
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, id), b);
    ck_assert_uint_eq(e.reg.freed_buffers, 0);
    ck_assert_int_eq(gd_registry_release(&e.reg, h2, id, &tr_err), 0);
    /* The last reference took the buffer with it. */
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, id));
    ck_assert_uint_eq(e.pool->used, keep_used);
    ck_assert_uint_eq(e.pool->n_blocks, 1);
    ck_assert_uint_eq(e.reg.n_buffers, 1);
    ck_assert_uint_eq(e.reg.freed_buffers, 1);
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, NULL, id, &o, NULL, &tr_err), -ENOENT);
    ck_assert_int_eq(gd_registry_release(&e.reg, h2, id, &tr_err), GPUBUF_ENOTHELD);
    env_fini(&e);
}
END_TEST

/* A uid's usage counts its buffers across holders, and a uid whose last
 * buffer went starts again from none: the record looked up last
 * (gd_registry.uid_last) is forgotten with it, and one uid's lookups never
 * charge another's record. */
START_TEST(test_uid_usage_counted_and_dropped) {
    env e;
    env_init(&e);
    e.reg.quota.buffers_per_uid = 2;
    gd_holder *a1 = holder(&e, UID_A), *a2 = holder(&e, UID_A), *b1 = holder(&e, UID_B);
    gd_buf *x = NULL;
    for (int round = 0; round < 3; round++) {
        gd_buf *p = alloc_ok(&e, a1, 100, NULL);
        gd_buf *q = alloc_ok(&e, b1, 100, NULL); /* the other uid between */
        gd_buf *r = alloc_ok(&e, a2, 100, NULL); /* uid A's second, by another holder */
        ck_assert_int_eq(gd_registry_alloc(&e.reg, a1, e.pool, 100, 0, NULL, &x, &tr_err), -EDQUOT);
        ck_assert_msg(strstr(tr_err.msg, "uid 1000 owns 2 buffers"), "%s", tr_err.msg);
        ck_assert_uint_eq(HASH_CNT(hh, e.reg.uids), 2);
        /* uid A's last buffers go: its record with them; uid B keeps one. */
        ck_assert_int_eq(gd_registry_release(&e.reg, a1, p->id, &tr_err), 0);
        ck_assert_int_eq(gd_registry_release(&e.reg, a2, r->id, &tr_err), 0);
        ck_assert_uint_eq(HASH_CNT(hh, e.reg.uids), 1);
        ck_assert_ptr_null(e.reg.uid_last);
        gd_buf *s = alloc_ok(&e, b1, 100, NULL);
        ck_assert_int_eq(gd_registry_alloc(&e.reg, b1, e.pool, 100, 0, NULL, &x, &tr_err), -EDQUOT);
        ck_assert_msg(strstr(tr_err.msg, "uid 1001 owns 2 buffers"), "%s", tr_err.msg);
        ck_assert_int_eq(gd_registry_release(&e.reg, b1, q->id, &tr_err), 0);
        ck_assert_int_eq(gd_registry_release(&e.reg, b1, s->id, &tr_err), 0);
        ck_assert_uint_eq(HASH_CNT(hh, e.reg.uids), 0);
        ck_assert_ptr_null(e.reg.uid_last);
    }
    env_fini(&e);
}
END_TEST

START_TEST(test_unsealed_freed_with_last_ref) {
    env e;
    env_init(&e);
    gd_holder *h = holder(&e, UID_A);
    gd_buf *a = alloc_ok(&e, h, 64, NULL);
    gd_buf *n = alloc_ok(&e, h, 64, "draft");
    uint64_t aid = a->id, nid = n->id;

    /* A buffer never sealed cannot be reached by anyone else: its creator's
     * release frees it, named or not. */
    ck_assert_int_eq(gd_registry_release(&e.reg, h, aid, &tr_err), 0);
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, aid));
    ck_assert_int_eq(gd_registry_release(&e.reg, h, nid, &tr_err), 0);
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, nid));
    ck_assert_ptr_null(gd_registry_find_name(&e.reg, "draft"));
    ck_assert_uint_eq(e.pool->used, 0);
    ck_assert_uint_eq(e.reg.n_buffers, 0);
    ck_assert_uint_eq(e.reg.freed_buffers, 2);
    ck_assert_uint_eq(h->n_refs, 0);
    /* The name is free again. */
    gd_buf *again = alloc_ok(&e, h, 64, "draft");
    ck_assert_uint_gt(again->id, nid);
    env_fini(&e);
}
END_TEST

/* ---- delete -------------------------------------------------------------- */

START_TEST(test_delete_while_referenced) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B), *h3 = holder(&e, UID_B);
    gd_buf *b = publish(&e, h1, 8192, "d");
    uint64_t id = b->id, blk = b->blk.size;
    gd_buf *o = NULL;

    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "d", 0, &o, NULL, &tr_err), 0);
    ck_assert_int_eq(gd_registry_delete(&e.reg, h1, "d", 0, &tr_err), 0);
    ck_assert_int_eq(b->state, GPUBUF_STATE_DELETED);
    ck_assert(!b->in_name_index);
    ck_assert_ptr_null(gd_registry_find_name(&e.reg, "d"));
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, id), b);
    ck_assert_uint_eq(b->refs, 2);
    ck_assert_uint_eq(e.pool->used, blk);
    /* Nobody can take a new reference, by name or by id. */
    ck_assert_int_eq(gd_registry_open(&e.reg, h3, "d", 0, &o, NULL, &tr_err), -ENOENT);
    ck_assert_int_eq(gd_registry_open(&e.reg, h3, NULL, id, &o, NULL, &tr_err), -ENOENT);
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, NULL, id, &o, NULL, &tr_err), -ENOENT);
    ck_assert_uint_eq(b->refs, 2);
    /* A second delete finds nothing. */
    ck_assert_int_eq(gd_registry_delete(&e.reg, h1, "d", 0, &tr_err), -ENOENT);
    ck_assert_int_eq(gd_registry_delete(&e.reg, h1, NULL, id, &tr_err), -ENOENT);

    /* The name can be reused at once. */
    gd_buf *n = publish(&e, h3, 100, "d");
    ck_assert_ptr_ne(n, b);
    ck_assert_uint_ne(n->id, id);
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "d"), n);
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "d", 0, &o, NULL, &tr_err), 0);
    ck_assert_ptr_eq(o, n);
    ck_assert_uint_eq(e.pool->used, blk + n->blk.size);

    /* The old buffer goes with its last reference, the new one stays. */
    ck_assert_int_eq(gd_registry_release(&e.reg, h1, id, &tr_err), 0);
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, id), b);
    ck_assert_uint_eq(e.pool->used, blk + n->blk.size);
    ck_assert_int_eq(gd_registry_release(&e.reg, h2, id, &tr_err), 0);
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, id));
    ck_assert_uint_eq(e.pool->used, n->blk.size);
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "d"), n);
    ck_assert_int_eq(n->state, GPUBUF_STATE_SEALED);
    ck_assert_uint_eq(n->refs, 2);
    ck_assert_uint_eq(gd_registry_holder_count(h2, n->id), 1);

    /* An anonymous buffer deleted by id while referenced behaves alike. */
    gd_buf *a = publish(&e, h1, 64, NULL);
    uint64_t aid = a->id;
    ck_assert_int_eq(gd_registry_delete(&e.reg, h1, NULL, aid, &tr_err), 0);
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, aid), a);
    ck_assert_int_eq(gd_registry_release(&e.reg, h1, aid, &tr_err), 0);
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, aid));
    ck_assert_uint_eq(e.pool->used, n->blk.size);
    env_fini(&e);
}
END_TEST

START_TEST(test_delete_permissions) {
    env e;
    env_init(&e);
    gd_holder *owner = holder(&e, UID_A), *other = holder(&e, UID_B);
    gd_holder *same_uid = holder(&e, UID_A), *root = holder(&e, 0);
    gd_buf *b = publish(&e, owner, 64, "p");
    gd_buf *c = publish(&e, owner, 64, "q");

    ck_assert_int_eq(gd_registry_delete(&e.reg, other, "p", 0, &tr_err), -EPERM);
    ck_assert_str_ne(tr_err.msg, "");
    ck_assert_int_eq(gd_registry_delete(&e.reg, other, NULL, b->id, &tr_err), -EPERM);
    ck_assert_int_eq(b->state, GPUBUF_STATE_SEALED);
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "p"), b);
    /* Root may delete anything. */
    ck_assert_int_eq(gd_registry_delete(&e.reg, root, "p", 0, &tr_err), 0);
    ck_assert_int_eq(b->state, GPUBUF_STATE_DELETED);
    ck_assert_ptr_null(gd_registry_find_name(&e.reg, "p"));
    /* Ownership is by uid: another client of the same user may delete. */
    ck_assert_int_eq(gd_registry_delete(&e.reg, same_uid, NULL, c->id, &tr_err), 0);
    ck_assert_ptr_null(gd_registry_find_name(&e.reg, "q"));
    /* Unknown names. */
    ck_assert_int_eq(gd_registry_delete(&e.reg, root, "nope", 0, &tr_err), -ENOENT);
    ck_assert_int_eq(gd_registry_delete(&e.reg, root, NULL, 999, &tr_err), -ENOENT);
    ck_assert_uint_eq(e.reg.n_buffers, 2); /* still referenced by owner */
    ck_assert_int_eq(gd_registry_release(&e.reg, owner, b->id, &tr_err), 0);
    ck_assert_int_eq(gd_registry_release(&e.reg, owner, c->id, &tr_err), 0);
    ck_assert_uint_eq(e.reg.n_buffers, 0);
    ck_assert_uint_eq(e.pool->used, 0);
    env_fini(&e);
}
END_TEST

/* ---- dropped holders ----------------------------------------------------- */

START_TEST(test_holder_drop) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B);
    gd_buf *u = alloc_ok(&e, h1, 4096, "unsealed");
    gd_buf *ua = alloc_ok(&e, h1, 4096, NULL);
    gd_buf *s = publish(&e, h1, 4096, "sealed");
    gd_buf *x = publish(&e, h1, 4096, NULL);
    gd_buf *o = NULL;
    uint64_t uid = u->id, uaid = ua->id, sid = s->id, xid = x->id;
    test_waiter w1a, w1b, w2;

    ck_assert_int_eq(gd_registry_open(&e.reg, h1, "sealed", 0, &o, NULL, &tr_err), 0);
    ck_assert_int_eq(gd_registry_open(&e.reg, h1, "sealed", 0, &o, NULL, &tr_err), 0);
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "sealed", 0, &o, NULL, &tr_err), 0);
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, NULL, xid, &o, NULL, &tr_err), 0);
    tw_wait(&e, &w1a, h1, "later", 0);
    tw_wait(&e, &w1b, h1, NULL, 777);
    tw_wait(&e, &w2, h2, "unsealed", 0);
    ck_assert_uint_eq(s->refs, 4);
    ck_assert_uint_eq(h1->n_refs, 6);
    ck_assert_uint_eq(e.reg.n_waiters, 3);
    ck_assert_uint_eq(holder_total(&e.reg), 2);

    gd_registry_holder_drop(&e.reg, h1);
    /* Its waits were cancelled, each once, without a wake. */
    ck_assert_int_eq(w1a.cancelled, 1);
    ck_assert_int_eq(w1b.cancelled, 1);
    ck_assert_int_eq(w1a.woken + w1b.woken, 0);
    ck_assert_int_eq(w2.cancelled + w2.woken, 0);
    ck_assert_uint_eq(e.reg.n_waiters, 1);
    ck_assert_ptr_eq(e.reg.waiters, &w2.w);
    ck_assert_uint_eq(holder_total(&e.reg), 1);
    /* Never-sealed buffers went with their creator. */
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, uid));
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, uaid));
    ck_assert_ptr_null(gd_registry_find_name(&e.reg, "unsealed"));
    /* Sealed ones keep the other client's references. */
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, sid), s);
    ck_assert_uint_eq(s->refs, 1);
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, xid), x);
    ck_assert_uint_eq(x->refs, 1);
    ck_assert_uint_eq(e.reg.n_buffers, 2);
    ck_assert_uint_eq(e.pool->used, s->blk.size + x->blk.size);
    ck_assert_uint_eq(e.pool->n_blocks, 2);

    gd_registry_holder_drop(&e.reg, h2);
    ck_assert_int_eq(w2.cancelled, 1);
    ck_assert_int_eq(w2.woken, 0);
    ck_assert_uint_eq(e.reg.n_waiters, 0);
    ck_assert_ptr_null(e.reg.waiters);
    ck_assert_uint_eq(holder_total(&e.reg), 0);
    /* The anonymous one had no references left; the named sealed one stays. */
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, xid));
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "sealed"), s);
    ck_assert_uint_eq(s->refs, 0);
    ck_assert_uint_eq(e.pool->used, s->blk.size);

    gd_holder *root = holder(&e, 0);
    ck_assert_int_eq(gd_registry_delete(&e.reg, root, "sealed", 0, &tr_err), 0);
    ck_assert_uint_eq(e.pool->used, 0);
    ck_assert_uint_eq(e.reg.n_buffers, 0);
    env_fini(&e);
}
END_TEST

/* A dropped holder's never-sealed buffer is freed even when it was deleted
 * first, and the drop does not touch buffers of other holders. */
START_TEST(test_holder_drop_other_buffers) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_A);
    gd_buf *mine = alloc_ok(&e, h1, 64, "mine");
    gd_buf *theirs = alloc_ok(&e, h2, 64, "theirs");
    gd_buf *gone = alloc_ok(&e, h1, 64, "gone");
    uint64_t mine_id = mine->id, gone_id = gone->id;
    ck_assert_int_eq(gd_registry_delete(&e.reg, h1, "gone", 0, &tr_err), 0);
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, gone_id), gone);

    gd_registry_holder_drop(&e.reg, h1);
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, mine_id));
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, gone_id));
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "theirs"), theirs);
    ck_assert_int_eq(theirs->state, GPUBUF_STATE_ALLOCATED);
    ck_assert_uint_eq(theirs->refs, 1);
    ck_assert_uint_eq(e.pool->used, theirs->blk.size);
    /* h2 can still seal its own buffer. */
    seal_ok(&e, h2, theirs);
    env_fini(&e);
}
END_TEST

/* ---- waiters ------------------------------------------------------------- */

START_TEST(test_wait_name) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B), *h3 = holder(&e, UID_B);
    test_waiter a, a2, other, byid, longer;
    gd_buf *b = alloc_ok(&e, h1, 256, "w");

    tw_wait(&e, &a, h2, "w", 0);
    tw_wait(&e, &a2, h2, "w", 0);
    tw_wait(&e, &other, h3, "other", 0);
    tw_wait(&e, &byid, h3, NULL, b->id);
    tw_wait(&e, &longer, h3, "ww", 0);
    ck_assert_uint_eq(e.reg.n_waiters, 5);

    /* Sealing an anonymous buffer or another name wakes none of them. */
    gd_buf *anon = publish(&e, h1, 64, NULL);
    gd_buf *wrong = publish(&e, h1, 64, "w2");
    ck_assert_int_eq(a.woken + a2.woken + other.woken + byid.woken + longer.woken, 0);
    ck_assert_uint_eq(e.reg.n_waiters, 5);
    ck_assert_uint_eq(anon->refs, 1);
    ck_assert_uint_eq(wrong->refs, 1);

    seal_ok(&e, h1, b);
    /* Both of h2's waits and the wait by id were woken, each with its own
     * reference taken before the callback. */
    ck_assert_int_eq(a.woken, 1);
    ck_assert_int_eq(a2.woken, 1);
    ck_assert_int_eq(byid.woken, 1);
    ck_assert_ptr_eq(a.buf, b);
    ck_assert_ptr_eq(a2.buf, b);
    ck_assert_ptr_eq(byid.buf, b);
    ck_assert_uint_ge(a.count_at_wake, 1);
    ck_assert_uint_ge(byid.count_at_wake, 1);
    ck_assert(a.unlinked_at_wake && a2.unlinked_at_wake && byid.unlinked_at_wake);
    ck_assert_int_eq(a.cancelled + a2.cancelled + byid.cancelled, 0);
    ck_assert_uint_eq(gd_registry_holder_count(h2, b->id), 2);
    ck_assert_uint_eq(gd_registry_holder_count(h3, b->id), 1);
    ck_assert_uint_eq(b->refs, 4);
    ck_assert_uint_eq(h2->n_refs, 2);
    ck_assert_ptr_null(h2->waiters);
    /* The others still wait. */
    ck_assert_int_eq(other.woken + other.cancelled, 0);
    ck_assert_int_eq(longer.woken + longer.cancelled, 0);
    ck_assert_uint_eq(e.reg.n_waiters, 2);
    ck_assert_uint_eq(gd_registry_holder_count(h3, wrong->id), 0);

    /* The woken references are real: released like opened ones. */
    ck_assert_int_eq(gd_registry_release(&e.reg, h3, b->id, &tr_err), 0);
    ck_assert_int_eq(gd_registry_release(&e.reg, h3, b->id, &tr_err), GPUBUF_ENOTHELD);
    ck_assert_uint_eq(b->refs, 3);

    /* Destroying the registry cancels the waits still pending. */
    gd_registry_destroy(&e.reg);
    ck_assert_int_eq(other.cancelled, 1);
    ck_assert_int_eq(longer.cancelled, 1);
    ck_assert_int_eq(a.cancelled + a2.cancelled + byid.cancelled, 0);
    ck_assert_uint_eq(e.pool->used, 0);
    gd_pool_free(e.pool);
}
END_TEST

START_TEST(test_wait_id) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B);
    gd_buf *x = alloc_ok(&e, h1, 64, NULL);
    gd_buf *y = alloc_ok(&e, h1, 64, NULL);
    gd_buf *named = alloc_ok(&e, h1, 64, "named");
    test_waiter wy, wn;

    tw_wait(&e, &wy, h2, NULL, y->id);
    tw_wait(&e, &wn, h2, NULL, named->id);
    seal_ok(&e, h1, x);
    ck_assert_int_eq(wy.woken, 0);
    ck_assert_uint_eq(x->refs, 1);
    seal_ok(&e, h1, y);
    ck_assert_int_eq(wy.woken, 1);
    ck_assert_uint_eq(wy.buf_id, y->id);
    ck_assert_uint_eq(wy.count_at_wake, 1);
    ck_assert_uint_eq(gd_registry_holder_count(h2, y->id), 1);
    ck_assert_uint_eq(y->refs, 2);
    ck_assert_int_eq(wn.woken, 0);
    /* A named buffer can be waited for by id too. */
    seal_ok(&e, h1, named);
    ck_assert_int_eq(wn.woken, 1);
    ck_assert_ptr_eq(wn.buf, named);
    ck_assert_uint_eq(named->refs, 2);
    ck_assert_uint_eq(e.reg.n_waiters, 0);
    ck_assert_uint_eq(h2->n_refs, 2);

    /* The creator lets go: the waiter's reference keeps y alive. */
    ck_assert_int_eq(gd_registry_release(&e.reg, h1, y->id, &tr_err), 0);
    ck_assert_ptr_eq(gd_registry_find_id(&e.reg, wy.buf_id), y);
    ck_assert_int_eq(gd_registry_release(&e.reg, h2, wy.buf_id, &tr_err), 0);
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, wy.buf_id));
    env_fini(&e);
}
END_TEST

/* A name deleted and reused: the waiter gets the new buffer. */
START_TEST(test_wait_reused_name) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B);
    gd_buf *old = publish(&e, h1, 64, "cam");
    test_waiter w;

    ck_assert_int_eq(gd_registry_delete(&e.reg, h1, "cam", 0, &tr_err), 0);
    tw_wait(&e, &w, h2, "cam", 0);
    gd_buf *n = alloc_ok(&e, h1, 64, "cam");
    ck_assert_int_eq(w.woken, 0);
    seal_ok(&e, h1, n);
    ck_assert_int_eq(w.woken, 1);
    ck_assert_ptr_eq(w.buf, n);
    ck_assert_ptr_ne(w.buf, old);
    ck_assert_uint_eq(gd_registry_holder_count(h2, n->id), 1);
    ck_assert_uint_eq(gd_registry_holder_count(h2, old->id), 0);
    ck_assert_uint_eq(old->refs, 1);
    env_fini(&e);
}
END_TEST

START_TEST(test_unwait) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B);
    test_waiter w1, w2, w3, w4;
    gd_buf *b = alloc_ok(&e, h1, 64, "u");

    tw_wait(&e, &w1, h2, "u", 0);
    tw_wait(&e, &w2, h2, "u", 0);
    tw_wait(&e, &w3, h2, "u", 0);
    tw_wait(&e, &w4, h2, NULL, b->id);
    ck_assert_uint_eq(e.reg.n_waiters, 4);

    /* Remove one from the middle, the head and the tail of the lists. */
    gd_registry_unwait(&e.reg, &w2.w);
    ck_assert_uint_eq(e.reg.n_waiters, 3);
    ck_assert(waiter_unlinked(&w2.w));
    gd_registry_unwait(&e.reg, &w4.w); /* the most recent: list head */
    gd_registry_unwait(&e.reg, &w1.w); /* the oldest: list tail */
    ck_assert_uint_eq(e.reg.n_waiters, 1);
    ck_assert_ptr_eq(e.reg.waiters, &w3.w);
    ck_assert_ptr_eq(h2->waiters, &w3.w);
    /* The only one left: nothing after it in either list. */
    ck_assert_ptr_null(w3.w.next);
    ck_assert_ptr_null(w3.w.hnext);
    /* No callback for removed waiters. */
    ck_assert_int_eq(w1.woken + w1.cancelled + w2.woken + w2.cancelled, 0);
    ck_assert_int_eq(w4.woken + w4.cancelled, 0);

    seal_ok(&e, h1, b);
    ck_assert_int_eq(w3.woken, 1);
    ck_assert_int_eq(w1.woken + w2.woken + w4.woken, 0);
    ck_assert_uint_eq(gd_registry_holder_count(h2, b->id), 1);
    ck_assert_uint_eq(b->refs, 2);
    ck_assert_uint_eq(e.reg.n_waiters, 0);
    ck_assert_ptr_null(e.reg.waiters);
    ck_assert_ptr_null(h2->waiters);

    /* Unwaiting the last waiter leaves nothing to cancel on drop. */
    test_waiter w5;
    tw_wait(&e, &w5, h2, "never", 0);
    gd_registry_unwait(&e.reg, &w5.w);
    gd_registry_holder_drop(&e.reg, h2);
    ck_assert_int_eq(w5.cancelled + w5.woken, 0);
    ck_assert_uint_eq(b->refs, 1);
    env_fini(&e);
}
END_TEST

/* Waiters on the heap, freed by their own wake() as a session would. */
typedef struct heap_waiter {
    gd_waiter w;
    int *wakes;
    uint64_t *ids;
} heap_waiter;

static void hw_wake(gd_waiter *w, gd_buf *b) {
    heap_waiter *hw = (heap_waiter *)w;
    hw->ids[(*hw->wakes)++] = b->id;
    free(hw);
}

static void hw_cancel(gd_waiter *w) {
    free(w);
}

START_TEST(test_wake_frees_waiter) {
    enum { N = 6 };
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B);
    gd_buf *b = alloc_ok(&e, h1, 64, "freed");
    int wakes = 0;
    uint64_t ids[N + 1];
    char name[] = "freed";

    for (int i = 0; i < N + 1; i++) {
        heap_waiter *hw = calloc(1, sizeof(*hw));
        ck_assert_ptr_nonnull(hw);
        hw->w.holder = h2;
        hw->w.name = i < N ? name : NULL;
        hw->w.buffer_id = i < N ? 0 : 424242;
        hw->w.wake = hw_wake;
        hw->w.cancel = hw_cancel;
        hw->wakes = &wakes;
        hw->ids = ids;
        gd_registry_wait(&e.reg, &hw->w);
    }
    seal_ok(&e, h1, b);
    ck_assert_int_eq(wakes, N);
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(ids[i], b->id);
    ck_assert_uint_eq(gd_registry_holder_count(h2, b->id), N);
    ck_assert_uint_eq(b->refs, N + 1);
    ck_assert_uint_eq(e.reg.n_waiters, 1);
    /* The one left (by id, never sealed) is freed by its cancel on drop. */
    gd_registry_holder_drop(&e.reg, h2);
    ck_assert_uint_eq(e.reg.n_waiters, 0);
    ck_assert_uint_eq(b->refs, 1);
    env_fini(&e);
}
END_TEST

/* ---- destroy ------------------------------------------------------------- */

START_TEST(test_destroy_frees_everything) {
    env e;
    env_init(&e);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B);
    gd_holder *idle = holder(&e, UID_B);
    test_waiter w1, w2, w3;
    gd_buf *o = NULL;

    gd_buf *s = publish(&e, h1, 100000, "sealed");
    publish(&e, h1, 3 * MIB / 2, "big"); /* a dedicated slab */
    alloc_ok(&e, h1, 2000, "unsealed");
    alloc_ok(&e, h2, 3000, NULL);
    gd_buf *x = publish(&e, h2, 4000, NULL);
    gd_buf *orphan = publish(&e, h1, 500, "orphan");
    gd_buf *del = publish(&e, h1, 700, "deleted");
    ck_assert_int_eq(gd_registry_release(&e.reg, h1, orphan->id, &tr_err), 0);
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, NULL, del->id, &o, NULL, &tr_err), 0);
    ck_assert_int_eq(gd_registry_delete(&e.reg, h1, "deleted", 0, &tr_err), 0);
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "sealed", 0, &o, NULL, &tr_err), 0);
    ck_assert_int_eq(gd_registry_open(&e.reg, h1, NULL, x->id, &o, NULL, &tr_err), 0);
    tw_wait(&e, &w1, h2, "later", 0);
    tw_wait(&e, &w2, h2, NULL, 999);
    tw_wait(&e, &w3, h1, "later", 0);
    ck_assert_uint_eq(e.reg.n_buffers, 7);
    ck_assert_uint_eq(e.pool->n_blocks, 7);
    ck_assert_uint_gt(e.pool->n_slabs, 1);
    ck_assert_uint_eq(s->refs, 2);
    (void)idle;

    gd_registry_destroy(&e.reg);
    ck_assert_int_eq(w1.cancelled, 1);
    ck_assert_int_eq(w2.cancelled, 1);
    ck_assert_int_eq(w3.cancelled, 1);
    ck_assert_int_eq(w1.woken + w2.woken + w3.woken, 0);
    ck_assert_uint_eq(e.reg.n_buffers, 0);
    ck_assert_uint_eq(e.reg.n_waiters, 0);
    ck_assert_ptr_null(e.reg.by_id);
    ck_assert_ptr_null(e.reg.by_name);
    ck_assert_ptr_null(e.reg.holders);
    ck_assert_ptr_null(e.reg.waiters);
    ck_assert_uint_eq(e.pool->used, 0);
    ck_assert_uint_eq(e.pool->n_blocks, 0);
    /* Only the spare slab is left; the dedicated one went back. */
    ck_assert_uint_le(e.pool->n_slabs, 1);
    gd_pool_free(e.pool);
}
END_TEST

/* Destroying an empty registry is fine, and so is reusing it afterwards. */
START_TEST(test_destroy_empty_and_reinit) {
    env e;
    env_init(&e);
    gd_registry_destroy(&e.reg);
    gd_registry_init(&e.reg);
    gd_holder *h = holder(&e, UID_A);
    ck_assert_uint_eq(h->id, 1);
    gd_buf *b = publish(&e, h, 64, "again");
    ck_assert_uint_eq(b->id, 1);
    env_fini(&e);
}
END_TEST

/* ---- names per pool ---------------------------------------------------- */

/* The same name in two pools: each pool's buffer is found in its own pool
 * only, an unqualified lookup searches the default pool, and a waiter for a
 * name in one pool is not woken by a seal in the other. */
START_TEST(test_names_per_pool) {
    env e;
    gd_backend *be = NULL;
    gd_pool *other;
    env_init(&e);
    ck_assert_int_eq(gd_backend_host_new(&be, NULL), 0);
    ck_assert_int_eq(gd_pool_new("other", be, 8 * MIB, MIB, &e.slab_ids, &other, &tr_err), 0);
    gd_holder *a = holder(&e, UID_A), *b = holder(&e, UID_B);
    gd_buf *x = NULL, *o = NULL;
    ck_assert_int_eq(gd_registry_alloc(&e.reg, b, other, 64, 0, "frames", &x, &tr_err), 0);
    gd_buf *mine = publish(&e, a, 64, "frames"); /* the default pool: no EEXIST */
    ck_assert_ptr_ne(mine, x);
    ck_assert_ptr_eq(gd_registry_find_name(&e.reg, "frames"), mine);
    ck_assert_ptr_eq(gd_registry_find_pool_name(&e.reg, other, "frames"), x);
    ck_assert_int_eq(gd_registry_alloc(&e.reg, b, other, 64, 0, "frames", &o, &tr_err), -EEXIST);
    test_waiter t;
    tw_wait(&e, &t, a, "late", 0);
    ck_assert_ptr_eq(t.w.pool, e.pool); /* no pool named: the default */
    gd_buf *l = NULL;
    ck_assert_int_eq(gd_registry_alloc(&e.reg, b, other, 64, 0, "late", &l, &tr_err), 0);
    seal_ok(&e, b, l);
    ck_assert_int_eq(t.woken, 0);
    gd_buf *real = publish(&e, a, 64, "late");
    ck_assert_int_eq(t.woken, 1);
    ck_assert_ptr_eq(t.buf, real);
    /* A target names its pool and owner. */
    gd_target tg = {.pool = other, .name = "frames", .has_owner = true, .owner_uid = UID_A};
    ck_assert_int_eq(gd_registry_open_target(&e.reg, a, &tg, false, &o, NULL, &tr_err), -EPERM);
    tg.owner_uid = UID_B;
    seal_ok(&e, b, x);
    ck_assert_int_eq(gd_registry_open_target(&e.reg, a, &tg, false, &o, NULL, &tr_err), 0);
    ck_assert_ptr_eq(o, x);
    ck_assert_int_eq(gd_registry_release(&e.reg, a, x->id, &tr_err), 0);
    ck_assert_int_eq(gd_registry_release(&e.reg, a, real->id, &tr_err), 0);
    env_fini(&e); /* frees every buffer, those of "other" too */
    ck_assert_uint_eq(other->used, 0);
    gd_pool_free(other);
}
END_TEST

/* ---- bounded work ---------------------------------------------------------- */

/* Waiters are indexed by name and id: a seal or a delete reaches exactly
 * the waiters of its name or id among many others, in the order they came,
 * and the index follows every unlink (the first waiter of a name going
 * first, or one in the middle). */
START_TEST(test_waiters_indexed) {
    enum { N = 300 };
    env e;
    env_init_cap(&e, 64 * MIB);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B);
    test_waiter *tw = calloc(4 * N, sizeof(*tw));
    gd_buf **bufs = calloc(N, sizeof(*bufs));
    ck_assert_ptr_nonnull(tw);
    ck_assert_ptr_nonnull(bufs);
    char name[32];
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "n%d", i);
        bufs[i] = alloc_ok(&e, h1, 64, name);
        tw_wait(&e, &tw[i], h2, name, 0);             /* by name */
        tw_wait(&e, &tw[N + i], h2, name, 0);         /* the same name again */
        tw_wait(&e, &tw[2 * N + i], h2, NULL, bufs[i]->id); /* by id */
        snprintf(name, sizeof(name), "never%d", i);
        tw_wait(&e, &tw[3 * N + i], h2, name, 0);     /* a name nobody seals */
    }
    ck_assert_uint_eq(e.reg.n_waiters, 4 * N);
    /* The first waiter of n1 goes: the second is still reached. */
    gd_registry_unwait(&e.reg, &tw[1].w);
    /* The second waiter of n2 goes: the first still is. */
    gd_registry_unwait(&e.reg, &tw[N + 2].w);
    for (int i = 0; i < N; i++) {
        if (i % 2 == 0) {
            seal_ok(&e, h1, bufs[i]);
            ck_assert_int_eq(tw[i].woken, i == 1 ? 0 : 1);
            ck_assert_int_eq(tw[N + i].woken, i == 2 ? 0 : 1);
            ck_assert_int_eq(tw[2 * N + i].woken, 1);
            ck_assert_ptr_eq(tw[2 * N + i].buf, bufs[i]);
        } else {
            /* Deleted before it was sealed: its id waiter is told, its name
             * waiters wait on (a buffer of that name may come). */
            ck_assert_int_eq(gd_registry_delete(&e.reg, h1, NULL, bufs[i]->id, &tr_err), 0);
            ck_assert_int_eq(tw[2 * N + i].cancelled, 1);
            ck_assert_int_eq(tw[i].woken + tw[N + i].woken, 0);
        }
        for (int j = i + 1; j < N; j++)
            if (tw[j].woken || tw[N + j].woken || tw[2 * N + j].woken || tw[2 * N + j].cancelled)
                ck_abort_msg("waiters of buffer %d reached when buffer %d changed", j, i);
    }
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(tw[3 * N + i].woken + tw[3 * N + i].cancelled, 0);
    /* Left: the names of the deleted buffers (two each, one for n1) and the
     * names never sealed. */
    ck_assert_uint_eq(e.reg.n_waiters, N / 2 * 2 - 1 + N);
    /* A new buffer of an odd name wakes both its waiters. */
    gd_buf *again = alloc_ok(&e, h1, 64, "n3");
    seal_ok(&e, h1, again);
    ck_assert_int_eq(tw[3].woken, 1);
    ck_assert_int_eq(tw[N + 3].woken, 1);
    gd_registry_holder_drop(&e.reg, h2);
    ck_assert_uint_eq(e.reg.n_waiters, 0);
    ck_assert_ptr_null(e.reg.name_waiters);
    free(tw);
    free(bufs);
    env_fini(&e);
}
END_TEST

/* A leaving holder's references go a bounded number per gd_registry_reap()
 * call; when done, the buffers it alone held and those it never sealed are
 * freed, and the others keep their other references. */
START_TEST(test_holder_leave_spread) {
    enum { N = 1000, BUDGET = 64 };
    env e;
    env_init_cap(&e, 64 * MIB);
    gd_holder *h1 = holder(&e, UID_A), *h2 = holder(&e, UID_B);
    gd_buf *shared = alloc_ok(&e, h2, 64, "shared");
    seal_ok(&e, h2, shared);
    gd_buf *open = NULL;
    ck_assert_int_eq(gd_registry_open(&e.reg, h1, "shared", 0, &open, NULL, &tr_err), 0);
    for (int i = 0; i < N; i++)
        alloc_ok(&e, h1, 64, NULL); /* never sealed */
    test_waiter w;
    tw_wait(&e, &w, h1, "later", 0);
    ck_assert_uint_eq(e.reg.n_buffers, N + 1);
    uint64_t id1 = h1->id;
    gd_registry_holder_leave(&e.reg, h1);
    /* At once: its waits are cancelled, and it is no holder any more. */
    ck_assert_int_eq(w.cancelled, 1);
    ck_assert_uint_eq(e.reg.n_waiters, 0);
    gd_holder *found;
    HASH_FIND(hh, e.reg.holders, &id1, sizeof(id1), found);
    ck_assert_ptr_null(found);
    int calls = 1;
    uint32_t before = e.reg.n_buffers;
    while (gd_registry_reap(&e.reg, BUDGET)) {
        /* Each call drops at most BUDGET references. */
        ck_assert_uint_le(before - e.reg.n_buffers, BUDGET);
        before = e.reg.n_buffers;
        calls++;
    }
    ck_assert_int_ge(calls, (N + 1) / BUDGET);
    ck_assert_ptr_null(e.reg.leaving);
    ck_assert_uint_eq(e.reg.n_buffers, 1);
    ck_assert_uint_eq(shared->refs, 1);
    ck_assert_uint_eq(e.pool->n_blocks, 1);
    ck_assert(!gd_registry_reap(&e.reg, BUDGET));
    gd_registry_holder_drop(&e.reg, h2);
    env_fini(&e);
}
END_TEST

/* ---- restart: restore, resume ------------------------------------------ */

/* What a restore rebuilds: a detached holder with its id, a named sealed
 * buffer charged to its owner, references; a duplicate id or name is
 * refused; unreachable buffers go at the end. Then the holder's client
 * resumes it claiming fewer references than it had, and one buffer it no
 * longer holds is reported lost. */
/* A restored buffer's template: sealed, 4000 bytes in blk of e's pool, owned by UID_A. */
static void restore_tmpl(gd_buf *t, env *e, uint64_t id, const char *name, gd_block blk,
                         uint64_t owner_holder) {
    memset(t, 0, sizeof(*t));
    t->id = id;
    t->name = (char *)name;
    t->pool = e->pool;
    t->blk = blk;
    t->size = 4000;
    t->state = GPUBUF_STATE_SEALED;
    t->owner_uid = UID_A;
    t->owner_holder = owner_holder;
    t->charged = blk.size;
}

START_TEST(test_restore_and_resume) {
    env e;
    gd_buf t, *b = NULL, *anon = NULL, *x = NULL;
    gd_block blk, blk2, blk3;
    env_init(&e);
    gd_holder *h = gd_registry_restore_holder(&e.reg, 7, 4242, UID_A, UID_A);
    ck_assert_ptr_nonnull(h);
    ck_assert(h->detached);
    ck_assert_uint_eq(e.reg.n_detached, 1);
    ck_assert_ptr_null(gd_registry_restore_holder(&e.reg, 7, 1, UID_A, UID_A));
    ck_assert_int_eq(gd_pool_alloc(e.pool, 4096, 0, &blk, &tr_err), 0);
    restore_tmpl(&t, &e, 40, "kept", blk, 7);
    ck_assert_int_eq(gd_registry_restore_buf(&e.reg, &t, &b, &tr_err), 0);
    ck_assert_uint_eq(h->n_owned, 1);
    /* Same id, or same name: refused. */
    ck_assert_int_eq(gd_pool_alloc(e.pool, 4096, 0, &blk2, &tr_err), 0);
    t.blk = blk2;
    ck_assert_int_eq(gd_registry_restore_buf(&e.reg, &t, &x, &tr_err), -EEXIST);
    t.id = 41;
    ck_assert_int_eq(gd_registry_restore_buf(&e.reg, &t, &x, &tr_err), -EEXIST);
    /* An anonymous sealed buffer nobody references: freed at the end. */
    t.name = NULL;
    ck_assert_int_eq(gd_registry_restore_buf(&e.reg, &t, &anon, &tr_err), 0);
    ck_assert_int_eq(gd_pool_alloc(e.pool, 4096, 0, &blk3, &tr_err), 0);
    t.id = 42;
    t.blk = blk3;
    ck_assert_int_eq(gd_registry_restore_buf(&e.reg, &t, &x, &tr_err), 0);
    ck_assert_int_eq(gd_registry_restore_ref(&e.reg, h, b, 3, 1, &tr_err), 0);
    ck_assert_int_eq(gd_registry_restore_ref(&e.reg, h, x, 1, 0, &tr_err), 0);
    gd_registry_restore_done(&e.reg);
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, 41));
    ck_assert_uint_eq(e.reg.n_buffers, 2);
    ck_assert_uint_eq(b->refs, 3);
    ck_assert_uint_eq(h->n_ro_refs, 1);
    ck_assert(gd_registry_slab_mapped(h, b, false)); /* restored through ref_add */
    /* New ids continue after the restored ones. */
    ck_assert_uint_ge(e.reg.next_buffer_id, 42);
    ck_assert_uint_ge(e.reg.next_holder_id, 7);
    /* The client claims 2 of "kept" (none read-only), nothing of 42, and
     * buffer 99 it does not hold. */
    gd_held held[] = {{40, 2, 0}, {99, 1, 0}};
    uint64_t lost[2];
    ck_assert_uint_eq(gd_registry_resume(&e.reg, h, held, 2, lost), 1);
    ck_assert_uint_eq(lost[0], 99);
    ck_assert(!h->detached);
    ck_assert_uint_eq(e.reg.n_detached, 0);
    ck_assert_uint_eq(gd_registry_holder_count(h, 40), 2);
    ck_assert_uint_eq(h->n_ro_refs, 0);
    ck_assert_uint_eq(b->refs, 2);
    /* 42 was anonymous: its last reference went with the resume. */
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, 42));
    ck_assert_uint_eq(h->n_refs, 2);
    /* The per-slab counts that SLAB_ONCE reads follow the restored
     * references and the resume: two read-write references left in b's
     * slab, none read-only; one released, the other is the only one. */
    ck_assert(gd_registry_slab_mapped(h, b, false));
    ck_assert(!gd_registry_slab_mapped(h, b, true));
    ck_assert_int_eq(gd_registry_release(&e.reg, h, 40, &tr_err), 0);
    ck_assert(!gd_registry_slab_mapped(h, b, false));
    gd_registry_holder_drop(&e.reg, h);
    ck_assert_uint_eq(b->refs, 0);
    ck_assert_ptr_nonnull(gd_registry_find_name(&e.reg, "kept")); /* named, sealed: stays */
    env_fini(&e);
}
END_TEST

/* Every change reaches the hooks, in an order a replay can follow: the
 * buffer before references to it, the holder's end first; a last reference
 * that frees its buffer goes with the buffer's removal. */
static int hook_log[64], hook_n;
static void hk_buf(void *a, const gd_buf *b) {
    (void)a;
    (void)b;
    hook_log[hook_n++ % 64] = 1;
}
static uint64_t hook_last_ref;
static void hk_gone(void *a, uint64_t id, uint64_t last_ref) {
    (void)a;
    (void)id;
    hook_last_ref = last_ref;
    hook_log[hook_n++ % 64] = last_ref ? 7 : 2;
}
static uint32_t hook_ref_count, hook_ref_ro;
static void hk_ref(void *a, const gd_holder *h, uint64_t id, uint32_t count, uint32_t ro) {
    (void)a;
    (void)h;
    (void)id;
    hook_ref_count = count;
    hook_ref_ro = ro;
    hook_log[hook_n++ % 64] = count ? 3 : 4;
}
static void hk_holder(void *a, const gd_holder *h) {
    (void)a;
    (void)h;
    hook_log[hook_n++ % 64] = 5;
}
static void hk_holder_gone(void *a, uint64_t id) {
    (void)a;
    (void)id;
    hook_log[hook_n++ % 64] = 6;
}

START_TEST(test_hooks_follow_changes) {
    static const gd_registry_hooks hk = {hk_buf, hk_gone, hk_ref, hk_holder, hk_holder_gone, NULL};
    env e;
    gd_buf *b;
    env_init(&e);
    e.reg.hooks = &hk;
    hook_n = 0;
    gd_holder *h = holder(&e, UID_A);
    ck_assert_int_eq(gd_registry_alloc(&e.reg, h, e.pool, 100, 0, "h", &b, &tr_err), 0);
    ck_assert_int_eq(gd_registry_seal(&e.reg, h, b->id, &b, &tr_err), 0);
    ck_assert_int_eq(gd_registry_release(&e.reg, h, b->id, &tr_err), 0);
    ck_assert_int_eq(gd_registry_delete(&e.reg, h, "h", 0, &tr_err), 0);
    gd_registry_holder_drop(&e.reg, h);
    /* holder, alloc (buffer, ref), seal, release (ref 0), delete (buffer, gone), holder gone */
    int want[] = {5, 1, 3, 1, 4, 1, 2, 6};
    ck_assert_int_eq(hook_n, 8);
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(hook_log[i], want[i]);
    /* Deleted while referenced, then released: the last reference goes
     * with the buffer, in its removal's hook (no ref hook to count 0). */
    hook_n = 0;
    h = holder(&e, UID_A);
    ck_assert_int_eq(gd_registry_alloc(&e.reg, h, e.pool, 100, 0, "h2", &b, &tr_err), 0);
    ck_assert_int_eq(gd_registry_delete(&e.reg, h, "h2", 0, &tr_err), 0);
    ck_assert_int_eq(gd_registry_release(&e.reg, h, b->id, &tr_err), 0);
    /* holder, alloc (buffer, ref), delete (buffer), release (gone with h's last reference) */
    int want2[] = {5, 1, 3, 1, 7};
    ck_assert_int_eq(hook_n, 5);
    for (int i = 0; i < 5; i++)
        ck_assert_int_eq(hook_log[i], want2[i]);
    ck_assert_uint_eq(hook_last_ref, h->id);
    gd_registry_holder_drop(&e.reg, h);
    e.reg.hooks = NULL;
    env_fini(&e);
}
END_TEST

/* The sealer's last view of a buffer sealed on a stream goes while another
 * holder keeps it: the event goes from the buffer (its library may destroy
 * it), and the saved state hears it (the buffer's hook, then the count of
 * 0): restored with its event, the buffer would hand a destroyed event to
 * openers once the sealer resumed. (White-box: the event as a seal on a CUDA
 * pool's stream leaves it; a host pool refuses such a seal.) */
START_TEST(test_event_loss_is_saved) {
    static const gd_registry_hooks hk = {hk_buf, hk_gone, hk_ref, hk_holder, hk_holder_gone, NULL};
    env e;
    gd_buf *b, *o;
    env_init(&e);
    gd_holder *h = holder(&e, UID_A), *h2 = holder(&e, UID_A);
    b = publish(&e, h, 100, "ev");
    b->has_event = true;
    b->event_holder = h->id;
    ck_assert_int_eq(gd_registry_open(&e.reg, h2, "ev", 0, &o, NULL, &tr_err), 0);
    e.reg.hooks = &hk;
    hook_n = 0;
    ck_assert_int_eq(gd_registry_release(&e.reg, h, b->id, &tr_err), 0);
    ck_assert(!b->has_event);
    /* the buffer (without its event), then h's count of 0 */
    ck_assert_int_eq(hook_n, 2);
    ck_assert_int_eq(hook_log[0], 1);
    ck_assert_int_eq(hook_log[1], 4);
    e.reg.hooks = NULL;
    gd_registry_holder_drop(&e.reg, h2);
    gd_registry_holder_drop(&e.reg, h);
    env_fini(&e);
}
END_TEST

/* A read-only open tells the saved state its read-only count with its
 * count, in one entry: the mark came after the count's entry and was never
 * saved (a SIGKILL then restored the reference as read-write until the
 * client resumed). */
START_TEST(test_read_only_open_is_saved) {
    static const gd_registry_hooks hk = {hk_buf, hk_gone, hk_ref, hk_holder, hk_holder_gone, NULL};
    env e;
    gd_buf *o;
    env_init(&e);
    gd_holder *h = holder(&e, UID_A), *h2 = holder(&e, UID_A);
    publish(&e, h, 100, "ro");
    e.reg.hooks = &hk;
    hook_n = 0;
    ck_assert_int_eq(gd_registry_open_mode(&e.reg, h2, "ro", 0, true, &o, NULL, &tr_err), 0);
    ck_assert_int_eq(hook_n, 1);
    ck_assert_int_eq(hook_log[0], 3);
    ck_assert_uint_eq(hook_ref_count, 1);
    ck_assert_uint_eq(hook_ref_ro, 1);
    ck_assert_int_eq(gd_registry_open_mode(&e.reg, h2, "ro", 0, false, &o, NULL, &tr_err), 0);
    ck_assert_uint_eq(hook_ref_count, 2);
    ck_assert_uint_eq(hook_ref_ro, 1);
    e.reg.hooks = NULL;
    gd_registry_holder_drop(&e.reg, h2);
    gd_registry_holder_drop(&e.reg, h);
    env_fini(&e);
}
END_TEST

/* A resume that only lowers a reference's read-only count (the client's
 * views hold as many references, fewer of them read-only) tells the saved
 * state: a SIGKILL after it must not bring the old read-only count back. */
START_TEST(test_resume_saves_a_lowered_read_only_count) {
    static const gd_registry_hooks hk = {hk_buf, hk_gone, hk_ref, hk_holder, hk_holder_gone, NULL};
    env e;
    gd_buf t, *b = NULL;
    gd_block blk;
    env_init(&e);
    gd_holder *h = gd_registry_restore_holder(&e.reg, 7, 4242, UID_A, UID_A);
    ck_assert_ptr_nonnull(h);
    ck_assert_int_eq(gd_pool_alloc(e.pool, 4096, 0, &blk, &tr_err), 0);
    restore_tmpl(&t, &e, 40, "kept", blk, 7);
    ck_assert_int_eq(gd_registry_restore_buf(&e.reg, &t, &b, &tr_err), 0);
    ck_assert_int_eq(gd_registry_restore_ref(&e.reg, h, b, 2, 2, &tr_err), 0);
    gd_registry_restore_done(&e.reg);
    e.reg.hooks = &hk;
    hook_n = 0;
    gd_held held[] = {{40, 2, 0}};
    uint64_t lost[1];
    ck_assert_uint_eq(gd_registry_resume(&e.reg, h, held, 1, lost), 0);
    ck_assert_uint_eq(h->n_ro_refs, 0);
    ck_assert_int_eq(hook_n, 1);
    ck_assert_int_eq(hook_log[0], 3);
    ck_assert_uint_eq(hook_ref_count, 2);
    ck_assert_uint_eq(hook_ref_ro, 0);
    e.reg.hooks = NULL;
    gd_registry_holder_drop(&e.reg, h);
    env_fini(&e);
}
END_TEST

/* Restored metadata is checked as an alloc's; a restored lease keeps its
 * deadline (one past is due at once, one beyond its ttl is cut to it). */
START_TEST(test_restore_meta) {
    env e;
    gd_buf t, *b = NULL, *c = NULL;
    gd_block blk, blk2;
    const int64_t big[1] = {1001}, fits[2] = {10, 100};
    gpubuf_layout too_big = f32(1, big), ok = f32(2, fits);
    static const uint8_t user[4097];
    env_init(&e);
    ck_assert_int_eq(gd_pool_alloc(e.pool, 4096, 0, &blk, &tr_err), 0);
    restore_tmpl(&t, &e, 50, "m", blk, 0);
    ck_assert_int_eq(gd_registry_restore_buf(&e.reg, &t, &b, &tr_err), 0);
    gd_meta_args a = {.layout = &too_big};
    ck_assert_int_eq(gd_registry_restore_meta(&e.reg, b, &a, 0, &tr_err), -EINVAL);
    ck_assert_ptr_nonnull(strstr(tr_err.msg, "4004 bytes"));
    a = (gd_meta_args){.user = user, .user_len = sizeof(user)};
    ck_assert_int_eq(gd_registry_restore_meta(&e.reg, b, &a, 0, &tr_err), -EINVAL);
    a = (gd_meta_args){.ttl_ms = (uint64_t)UINT32_MAX + 1};
    ck_assert_int_eq(gd_registry_restore_meta(&e.reg, b, &a, 0, &tr_err), -EINVAL);
    ck_assert_ptr_null(b->meta);
    ck_assert_uint_eq(e.reg.n_leases, 0);
    /* Expired while the daemon was down. */
    uint64_t now = gpubuf_now_ns();
    a = (gd_meta_args){.layout = &ok, .user = user, .user_len = 5, .ttl_ms = 1000};
    ck_assert_int_eq(gd_registry_restore_meta(&e.reg, b, &a, now - 1, &tr_err), 0);
    ck_assert_uint_eq(e.reg.n_layouts, 1);
    ck_assert_uint_eq(e.reg.n_leases, 1);
    gpubuf_layout got;
    ck_assert(gd_meta_layout(b, &got));
    ck_assert_int_eq(got.shape[1], 100);
    /* A deadline far beyond its ttl: cut to the ttl from now. */
    ck_assert_int_eq(gd_pool_alloc(e.pool, 4096, 0, &blk2, &tr_err), 0);
    restore_tmpl(&t, &e, 51, "n", blk2, 0);
    ck_assert_int_eq(gd_registry_restore_buf(&e.reg, &t, &c, &tr_err), 0);
    a = (gd_meta_args){.ttl_ms = 1000};
    ck_assert_int_eq(gd_registry_restore_meta(&e.reg, c, &a, now + 86400000000000ull, &tr_err), 0);
    ck_assert_uint_le(c->lease_expires_ns, gpubuf_now_ns() + 1000000000ull);
    ck_assert_uint_eq(gd_registry_next_expiry(&e.reg), now - 1);
    gd_registry_restore_done(&e.reg);
    ck_assert_uint_eq(gd_registry_expire(&e.reg, gpubuf_now_ns(), 16), 1);
    ck_assert_ptr_null(gd_registry_find_id(&e.reg, 50));
    ck_assert_uint_eq(e.reg.n_layouts, 0);
    ck_assert_uint_eq(e.reg.n_leases, 1);
    env_fini(&e);
}
END_TEST

/* ---- main -------------------------------------------------------------- */

static Suite *registry_suite(void) {
    Suite *s = suite_create("registry");
    TCase *tc = add_case(s, "buffers", NULL, NULL, 0);
    add_tests(tc, test_alloc_reference, test_alloc_pool_full, test_name_duplicate,
              test_name_invalid, test_name_too_long, test_anonymous, test_open_unsealed,
              test_seal_permissions_state, test_open_refcounts);

    tc = add_case(s, "lifetime", NULL, NULL, 0);
    add_tests(tc, test_release_not_held, test_named_sealed_persists,
              test_anonymous_freed_with_last_ref, test_uid_usage_counted_and_dropped,
              test_unsealed_freed_with_last_ref,
              test_delete_while_referenced, test_delete_permissions, test_holder_drop,
              test_holder_drop_other_buffers, test_destroy_frees_everything,
              test_destroy_empty_and_reinit);

    tc = add_case(s, "waiters", NULL, NULL, 0);
    add_tests(tc, test_wait_name, test_wait_id, test_wait_reused_name, test_unwait,
              test_wake_frees_waiter, test_placement_prefers_held_slabs, test_kept_slabs,
              test_names_per_pool);

    tc = add_case(s, "bounded", NULL, NULL, 0);
    add_tests(tc, test_waiters_indexed, test_holder_leave_spread, test_restore_and_resume,
              test_resume_saves_a_lowered_read_only_count, test_event_loss_is_saved,
              test_read_only_open_is_saved,
              test_hooks_follow_changes, test_restore_meta);
    return s;
}

int main(void) {
    return run_suite(registry_suite());
}
