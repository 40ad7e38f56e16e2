/* Unit tests for array metadata and leases in the registry (daemon/meta.c)
 * over a real host pool: layout and user-byte bounds, metadata set at alloc
 * or seal and frozen after it, the lease heap's order, expiry with and
 * without references, renewals by owner and others. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "gpubuf.pb-c.h"
#include "layout.h"
#include "pool.h"
#include "registry.h"
#include "util.h"
#include "layout_helpers.h"
#include "check_main.h"

#define MIB (1024ull * 1024ull)
#define MS 1000000ull

static gd_err err;

typedef struct env {
    uint64_t slab_ids;
    gd_pool *pool;
    gd_registry reg;
} env;

static void env_init(env *e) {
    gd_backend *be = NULL;
    memset(e, 0, sizeof(*e));
    ck_assert_int_eq(gd_backend_host_new(&be, NULL), 0);
    ck_assert_int_eq(gd_pool_new("host", be, 64 * MIB, MIB, &e->slab_ids, &e->pool, &err), 0);
    gd_registry_init(&e->reg);
    e->reg.default_pool = e->pool;
}

static void env_fini(env *e) {
    gd_registry_destroy(&e->reg);
    ck_assert_uint_eq(e->pool->used, 0);
    gd_pool_free(e->pool);
}

/* env_init, and two holders of uid 1000 (pids 1 and 2). */
static void env_init_pair(env *e, gd_holder **a, gd_holder **b) {
    env_init(e);
    *a = gd_registry_holder_new(&e->reg, 1, 1000, 1000);
    *b = gd_registry_holder_new(&e->reg, 2, 1000, 1000);
}

static int renew(env *e, gd_holder *h, const char *name, uint64_t id, uint64_t ttl_ms,
                 gd_buf **ret) {
    gd_target t = {.name = name, .id = id};
    memset(&err, 0, sizeof(err));
    return gd_registry_renew(&e->reg, h, &t, ttl_ms, ret, &err);
}

static int alloc_meta(env *e, gd_holder *h, uint64_t size, const char *name,
                      const gd_meta_args *m, gd_buf **ret) {
    memset(&err, 0, sizeof(err));
    return gd_registry_alloc_meta(&e->reg, h, e->pool, size, 0, name, m, ret, &err);
}

START_TEST(layout_bounds) {
    char msg[256];
    int64_t shape[33] = {4, 8};
    gpubuf_layout l = f32(2, shape);
    ck_assert_int_eq(gpubuf_layout_validate(&l, 128, msg, sizeof(msg)), 0);
    ck_assert_int_eq(gpubuf_layout_validate(&l, 127, msg, sizeof(msg)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(msg, "needs 128 bytes"));
    l.byte_offset = 1; /* one byte further: 129 needed */
    ck_assert_int_eq(gpubuf_layout_validate(&l, 128, msg, sizeof(msg)), -EINVAL);
    l.byte_offset = 0;
    l.dtype.code = 18;
    ck_assert_int_eq(gpubuf_layout_validate(&l, 128, msg, sizeof(msg)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(msg, "dtype code 18"));
    l.dtype = (gpubuf_dtype){.code = 0, .bits = 4, .lanes = 1};
    ck_assert_int_eq(gpubuf_layout_validate(&l, 128, msg, sizeof(msg)), -EINVAL);
    l.dtype.lanes = 2; /* int4 x 2 lanes: one byte per element */
    ck_assert_int_eq(gpubuf_layout_validate(&l, 32, msg, sizeof(msg)), 0);
    l.dtype.lanes = 0;
    ck_assert_int_eq(gpubuf_layout_validate(&l, 128, msg, sizeof(msg)), -EINVAL);
    /* Strides: a transposed 4x8 view reaches the same 32 elements... */
    l = f32(2, shape);
    l.has_strides = 1;
    l.strides[0] = 1;
    l.strides[1] = 4;
    ck_assert_int_eq(gpubuf_layout_validate(&l, 128, msg, sizeof(msg)), 0);
    /* ...a broadcast (stride 0) fewer, a padded row more. */
    l.strides[0] = 0;
    l.strides[1] = 1;
    ck_assert_int_eq(gpubuf_layout_validate(&l, 32, msg, sizeof(msg)), 0);
    l.strides[0] = 10;
    ck_assert_int_eq(gpubuf_layout_validate(&l, 128, msg, sizeof(msg)), -EINVAL);
    ck_assert_int_eq(gpubuf_layout_validate(&l, 4 * (30 + 7 + 1), msg, sizeof(msg)), 0);
    /* Negative strides need a byte offset that keeps them inside. */
    l.strides[0] = -8;
    ck_assert_int_eq(gpubuf_layout_validate(&l, 128, msg, sizeof(msg)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(msg, "before the buffer"));
    l.byte_offset = 24 * 4;
    ck_assert_int_eq(gpubuf_layout_validate(&l, 128, msg, sizeof(msg)), 0);
    /* Overflowing extents are refused, not wrapped. */
    int64_t huge[3] = {INT64_MAX, INT64_MAX, 2};
    l = f32(3, huge);
    ck_assert_int_eq(gpubuf_layout_validate(&l, UINT64_MAX, msg, sizeof(msg)), -EINVAL);
    /* Empty arrays need only their offset inside; negative sizes never. */
    int64_t empty[2] = {0, 1000000};
    l = f32(2, empty);
    ck_assert_int_eq(gpubuf_layout_validate(&l, 1, msg, sizeof(msg)), 0);
    empty[0] = -1;
    l = f32(2, empty);
    ck_assert_int_eq(gpubuf_layout_validate(&l, 1 << 30, msg, sizeof(msg)), -EINVAL);
    /* Dimensions: 32 at most. */
    for (int i = 0; i < 33; i++)
        shape[i] = 1;
    l = f32(32, shape);
    ck_assert_int_eq(gpubuf_layout_validate(&l, 4, msg, sizeof(msg)), 0);
    l.ndim = 33;
    ck_assert_int_eq(gpubuf_layout_validate(&l, 4, msg, sizeof(msg)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(msg, "at most 32"));
}
END_TEST

START_TEST(wire_layout_bounds) {
    char msg[256];
    int64_t v[33] = {0};
    Gpubuf__ArrayLayout m = GPUBUF__ARRAY_LAYOUT__INIT;
    gpubuf_layout l;
    m.dtype_code = 2;
    m.dtype_bits = 32;
    m.dtype_lanes = 1;
    m.shape = v;
    m.n_shape = 33;
    ck_assert_int_eq(gpubuf_layout_from_wire(&m, &l, msg, sizeof(msg)), -EINVAL);
    m.n_shape = 2;
    m.strides = v;
    m.n_strides = 1;
    ck_assert_int_eq(gpubuf_layout_from_wire(&m, &l, msg, sizeof(msg)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(msg, "1 strides for 2 dimensions"));
    m.n_strides = 0;
    m.dtype_bits = 256;
    ck_assert_int_eq(gpubuf_layout_from_wire(&m, &l, msg, sizeof(msg)), -EINVAL);
    m.dtype_bits = 32;
    v[0] = 3;
    v[1] = 5;
    ck_assert_int_eq(gpubuf_layout_from_wire(&m, &l, msg, sizeof(msg)), 0);
    ck_assert_int_eq(l.has_strides, 0);
    ck_assert_int_eq(l.strides[0], 5); /* compact strides filled in */
    ck_assert_int_eq(l.strides[1], 1);
}
END_TEST

START_TEST(meta_at_alloc_and_seal) {
    env e;
    gd_holder *h, *h2;
    env_init_pair(&e, &h, &h2);
    int64_t shape[2] = {16, 16};
    gpubuf_layout l = f32(2, shape), got;
    uint8_t user[GPUBUF_USER_DATA_MAX + 1];
    memset(user, 7, sizeof(user));
    gd_meta_args m = {.layout = &l, .user = user, .user_len = 3};
    gd_buf *b;
    /* Too small for the layout; too many user bytes: nothing allocated. */
    ck_assert_int_eq(alloc_meta(&e, h, 1023, "a", &m, &b), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "needs 1024 bytes"));
    m.user_len = sizeof(user);
    ck_assert_int_eq(alloc_meta(&e, h, 1024, "a", &m, &b), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "at most 4096"));
    ck_assert_uint_eq(e.reg.n_buffers, 0);
    ck_assert_uint_eq(e.pool->used, 0);
    m.user_len = 3;
    ck_assert_int_eq(alloc_meta(&e, h, 1024, "a", &m, &b), 0);
    ck_assert(gd_meta_layout(b, &got));
    ck_assert_int_eq(got.ndim, 2);
    ck_assert_int_eq(got.shape[1], 16);
    ck_assert_int_eq(got.strides[0], 16);
    size_t len;
    ck_assert_ptr_nonnull(gd_meta_user(b, &len));
    ck_assert_uint_eq(len, 3);
    /* Counted for the status columns. */
    ck_assert_uint_eq(e.reg.n_layouts, 1);
    ck_assert_uint_eq(e.reg.layout_dims, 2);
    ck_assert_uint_eq(e.reg.n_user_meta, 1);
    /* Seal replaces the layout, keeps the user bytes it does not give. */
    int64_t flat[1] = {256};
    gpubuf_layout l2 = f32(1, flat);
    gd_meta_args m2 = {.layout = &l2};
    gd_buf *sb;
    ck_assert_int_eq(gd_registry_seal_meta(&e.reg, h, b->id, NULL, &m2, &sb, &err), 0);
    ck_assert(gd_meta_layout(b, &got));
    ck_assert_int_eq(got.ndim, 1);
    ck_assert_ptr_nonnull(gd_meta_user(b, &len));
    ck_assert_uint_eq(len, 3);
    /* After the seal nothing changes: a second seal is refused as a seal. */
    ck_assert_int_eq(gd_registry_seal_meta(&e.reg, h, b->id, NULL, &m, &sb, &err), GPUBUF_ESTATE);
    ck_assert(gd_meta_layout(b, &got));
    ck_assert_int_eq(got.ndim, 1);
    /* A seal whose layout does not fit leaves the buffer unsealed. */
    gd_buf *c;
    ck_assert_int_eq(alloc_meta(&e, h, 100, "c", NULL, &c), 0);
    ck_assert_ptr_null(c->meta);
    ck_assert_int_eq(gd_registry_seal_meta(&e.reg, h, c->id, NULL, &m2, &sb, &err), -EINVAL);
    ck_assert_int_eq(c->state, GPUBUF_STATE_ALLOCATED);
    ck_assert_ptr_null(c->meta);
    ck_assert_uint_eq(e.reg.layout_dims, 1); /* b's 1-D layout now */
    gd_registry_holder_drop(&e.reg, h);
    ck_assert_uint_eq(e.reg.n_buffers, 1); /* b: named and sealed */
    ck_assert_int_eq(gd_registry_delete(&e.reg, h2, "a", 0, &err), 0);
    ck_assert_uint_eq(e.reg.n_layouts, 0);
    ck_assert_uint_eq(e.reg.layout_dims, 0);
    ck_assert_uint_eq(e.reg.n_user_meta, 0);
    gd_registry_holder_drop(&e.reg, h2);
    env_fini(&e);
}
END_TEST

static uint64_t uid_meta(const gd_registry *r, uid_t uid) {
    gd_uid_usage *u;
    HASH_FIND(hh, r->uids, &uid, sizeof(uid), u);
    return u ? u->meta : 0;
}

/* Issue 22, finding 6: a buffer's name, layout and user bytes are charged
 * to its creator, its uid and the daemon (gd_meta_charge: name + 24-byte
 * header + 8 B per dimension + user bytes), a seal that changes them
 * recharges, each of the three limits refuses with its name and value,
 * and freeing gives everything back. */
START_TEST(meta_charge_figures) {
    env e;
    gd_holder *h, *h2;
    env_init_pair(&e, &h, &h2);
    gd_holder *other = gd_registry_holder_new(&e.reg, 3, 2000, 2000);
    int64_t shape[2] = {16, 16};
    gpubuf_layout l = f32(2, shape);
    uint8_t user[GPUBUF_USER_DATA_MAX];
    memset(user, 7, sizeof(user));
    gd_meta_args m = {.layout = &l, .user = user, .user_len = 100};
    gd_buf *a, *plain, *sb;
    ck_assert_int_eq(alloc_meta(&e, h, 1024, "a", &m, &a), 0);
    ck_assert_uint_eq(a->meta_charged, 1 + 24 + 2 * 8 + 100);
    ck_assert_int_eq(alloc_meta(&e, h, 1024, NULL, NULL, &plain), 0);
    ck_assert_uint_eq(plain->meta_charged, 0);
    /* The seal brings 4096 user bytes: recharged. */
    gd_meta_args big = {.user = user, .user_len = sizeof(user)};
    ck_assert_int_eq(gd_registry_seal_meta(&e.reg, h, a->id, NULL, &big, &sb, &err), 0);
    const uint64_t ca = 1 + 24 + 2 * 8 + 4096;
    ck_assert_uint_eq(a->meta_charged, ca);
    ck_assert_uint_eq(h->owned_meta, ca);
    ck_assert_uint_eq(uid_meta(&e.reg, 1000), ca);
    ck_assert_uint_eq(e.reg.meta_bytes, ca);

    /* Per uid: h2 shares uid 1000's 30 bytes left. */
    e.reg.quota.meta_bytes_per_uid = ca + 30;
    gd_meta_args u10 = {.user = user, .user_len = 10}, u6 = {.user = user, .user_len = 6};
    gd_buf *x;
    ck_assert_int_eq(alloc_meta(&e, h2, 64, NULL, &u10, &x), -EDQUOT);
    ck_assert_msg(strstr(err.msg, "uid 1000's buffers would carry 4171 bytes of metadata") &&
                      strstr(err.msg, "max_meta_bytes_per_uid = 4167"),
                  "%s", err.msg);
    ck_assert_int_eq(alloc_meta(&e, h2, 64, NULL, &u6, &x), 0);
    ck_assert_uint_eq(h2->owned_meta, 30);
    ck_assert_uint_eq(uid_meta(&e.reg, 1000), ca + 30);
    /* Per client, on a name alone. */
    e.reg.quota.meta_bytes_per_uid = 0;
    e.reg.quota.meta_bytes_per_client = ca;
    ck_assert_int_eq(alloc_meta(&e, h, 64, "z", NULL, &x), -EDQUOT);
    ck_assert_ptr_nonnull(strstr(err.msg, "max_meta_bytes_per_client = 4137"));
    /* A seal over the quota leaves the buffer as it was, unsealed. */
    gd_buf *y;
    e.reg.quota.meta_bytes_per_client = 0;
    ck_assert_int_eq(alloc_meta(&e, other, 64, NULL, NULL, &y), 0);
    e.reg.quota.meta_bytes = ca + 30 + 100;
    ck_assert_int_eq(gd_registry_seal_meta(&e.reg, other, y->id, NULL, &big, &sb, &err), -EDQUOT);
    ck_assert_ptr_nonnull(strstr(err.msg, "max_meta_bytes = 4267"));
    ck_assert_int_eq(y->state, GPUBUF_STATE_ALLOCATED);
    ck_assert_ptr_null(y->meta);
    ck_assert_uint_eq(other->owned_meta, 0);
    ck_assert_uint_eq(e.reg.meta_bytes, ca + 30);

    /* The creator goes: "a" (named, sealed) stays charged to its uid. */
    gd_registry_holder_drop(&e.reg, h);
    ck_assert_uint_eq(uid_meta(&e.reg, 1000), ca + 30);
    ck_assert_int_eq(gd_registry_delete(&e.reg, h2, "a", 0, &err), 0);
    ck_assert_uint_eq(uid_meta(&e.reg, 1000), 30);
    ck_assert_uint_eq(e.reg.meta_bytes, 30);
    gd_registry_holder_drop(&e.reg, h2);
    gd_registry_holder_drop(&e.reg, other);
    ck_assert_uint_eq(e.reg.meta_bytes, 0);
    ck_assert_ptr_null(e.reg.uids);
    env_fini(&e);
}
END_TEST

/* Leases expire in order of expiry, whatever the order they were given in,
 * renewals move them, and deletes take them out of the heap. */
START_TEST(lease_heap_order) {
    env e;
    env_init(&e);
    gd_holder *h = gd_registry_holder_new(&e.reg, 1, 1000, 1000);
    enum { N = 200 };
    gd_buf *b[N];
    uint64_t t0 = gpubuf_now_ns();
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof(name), "l%d", i);
        gd_meta_args m = {.ttl_ms = 1000 + (uint64_t)((i * 7919) % N) * 10};
        ck_assert_int_eq(alloc_meta(&e, h, 64, name, &m, &b[i]), 0);
        gd_buf *sb;
        ck_assert_int_eq(gd_registry_seal(&e.reg, h, b[i]->id, &sb, &err), 0);
        ck_assert_int_eq(gd_registry_release(&e.reg, h, b[i]->id, &err), 0);
    }
    ck_assert_uint_eq(e.reg.n_leases, N);
    /* The last lease was given this late: on a loaded machine filling can
     * take longer than the 10 ms between two time to lives. */
    uint64_t fill_ms = (gpubuf_now_ns() - t0) / MS + 1;
    ck_assert_uint_ge(gd_registry_next_expiry(&e.reg), t0 + 1000 * MS);
    ck_assert_uint_le(gd_registry_next_expiry(&e.reg), gpubuf_now_ns() + 1000 * MS);
    /* Delete one, renew another far out. */
    ck_assert_int_eq(gd_registry_delete(&e.reg, h, "l0", 0, &err), 0);
    gd_buf *r;
    ck_assert_int_eq(renew(&e, h, "l1", 0, 100000, &r), 0);
    ck_assert_uint_eq(e.reg.leases_renewed, 1);
    ck_assert_uint_eq(e.reg.n_leases, N - 1);
    /* A bounded pass takes at most its bound, the earliest first. */
    uint64_t first = gd_registry_next_expiry(&e.reg);
    ck_assert_uint_eq(gd_registry_expire(&e.reg, t0 + 1000 * MS, 0), 0);
    ck_assert_uint_eq(gd_registry_next_expiry(&e.reg), first);
    ck_assert_uint_eq(gd_registry_expire(&e.reg, t0 + 3000 * MS, 1), 1);
    ck_assert_uint_ge(gd_registry_next_expiry(&e.reg), first);
    ck_assert_uint_eq(e.reg.n_leases, N - 2);
    /* Expire in steps: each step takes exactly the due ones. */
    uint64_t prev = 0;
    uint32_t total = 1;
    for (uint64_t ms = 1000; ms <= 3000 + fill_ms + 100; ms += 100) {
        uint64_t next = gd_registry_next_expiry(&e.reg);
        ck_assert_uint_ge(next, prev);
        prev = next;
        total += gd_registry_expire(&e.reg, t0 + ms * MS, UINT32_MAX);
        ck_assert(gd_registry_next_expiry(&e.reg) > t0 + ms * MS);
    }
    ck_assert_uint_eq(total, N - 2);
    ck_assert_uint_eq(e.reg.leases_expired, N - 2);
    ck_assert_uint_eq(e.reg.n_buffers, 1); /* l1, renewed */
    ck_assert_ptr_nonnull(gd_registry_find_name(&e.reg, "l1"));
    ck_assert_uint_ge(gd_registry_lease_left_ms(gd_registry_find_name(&e.reg, "l1"),
                                                gpubuf_now_ns()),
                      99000);
    gd_registry_holder_drop(&e.reg, h);
    env_fini(&e);
}
END_TEST

START_TEST(lease_expiry_while_referenced) {
    env e;
    gd_holder *p, *c;
    env_init_pair(&e, &p, &c);
    gd_meta_args m = {.ttl_ms = 10};
    gd_buf *b, *o;
    ck_assert_int_eq(alloc_meta(&e, p, 4096, "x", &m, &b), 0);
    ck_assert_int_eq(gd_registry_seal(&e.reg, p, b->id, &o, &err), 0);
    ck_assert_int_eq(gd_registry_release(&e.reg, p, b->id, &err), 0);
    ck_assert_int_eq(gd_registry_open(&e.reg, c, "x", 0, &o, NULL, &err), 0);
    uint64_t used = e.pool->used;
    ck_assert_uint_eq(gd_registry_expire(&e.reg, gpubuf_now_ns() + 20 * MS, UINT32_MAX), 1);
    /* The name is gone, the memory stays with the reference. */
    ck_assert_ptr_null(gd_registry_find_name(&e.reg, "x"));
    ck_assert_int_eq(b->state, GPUBUF_STATE_DELETED);
    ck_assert_uint_eq(e.pool->used, used);
    ck_assert_int_eq(renew(&e, p, NULL, b->id, 0, &o), -ENOENT);
    ck_assert_int_eq(gd_registry_release(&e.reg, c, b->id, &err), 0);
    ck_assert_uint_eq(e.pool->used, 0);
    ck_assert_uint_eq(e.reg.n_buffers, 0);
    /* An unsealed buffer expires too: its seal is then refused. */
    ck_assert_int_eq(alloc_meta(&e, p, 4096, "y", &m, &b), 0);
    ck_assert_uint_eq(gd_registry_expire(&e.reg, gpubuf_now_ns() + 20 * MS, UINT32_MAX), 1);
    ck_assert_int_eq(gd_registry_seal(&e.reg, p, b->id, &o, &err), GPUBUF_ESTATE);
    gd_registry_holder_drop(&e.reg, p);
    gd_registry_holder_drop(&e.reg, c);
    ck_assert_uint_eq(e.reg.n_buffers, 0);
    ck_assert_uint_eq(e.reg.n_leases, 0);
    env_fini(&e);
}
END_TEST

START_TEST(renew_rules) {
    env e;
    env_init(&e);
    e.reg.quota.max_lease_ms = 60000;
    gd_holder *a = gd_registry_holder_new(&e.reg, 1, 1000, 1000);
    gd_holder *other = gd_registry_holder_new(&e.reg, 2, 1001, 1001);
    gd_holder *root = gd_registry_holder_new(&e.reg, 3, 0, 0);
    gd_buf *b, *o;
    gd_meta_args too_long = {.ttl_ms = 60001};
    ck_assert_int_eq(alloc_meta(&e, a, 64, "r", &too_long, &b), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "max_lease_ms"));
    ck_assert_int_eq(alloc_meta(&e, a, 64, "r", NULL, &b), 0);
    ck_assert_int_eq(gd_registry_seal(&e.reg, a, b->id, &o, &err), 0);
    /* No lease yet: renewing needs a time to live, which gives one. */
    ck_assert_int_eq(renew(&e, a, "r", 0, 0, &o), -EINVAL);
    ck_assert_int_eq(renew(&e, a, "r", 0, 5000, &o), 0);
    ck_assert_uint_eq(b->lease_ttl_ms, 5000);
    ck_assert_int_eq(renew(&e, a, "r", 0, 60001, &o), -EINVAL);
    /* Another uid may not; root may. */
    ck_assert_int_eq(renew(&e, other, "r", 0, 5000, &o), -EPERM);
    ck_assert_ptr_nonnull(strstr(err.msg, "only its owner or root"));
    ck_assert_int_eq(renew(&e, root, NULL, b->id, 0, &o), 0);
    ck_assert_uint_eq(e.reg.leases_renewed, 2);
    ck_assert_int_eq(renew(&e, a, "nope", 0, 5000, &o), -ENOENT);
    gd_registry_holder_drop(&e.reg, a);
    gd_registry_holder_drop(&e.reg, other);
    gd_registry_holder_drop(&e.reg, root);
    env_fini(&e);
}
END_TEST

SUITE_MAIN("meta_registry", "meta", NULL, NULL, 0,
          layout_bounds, wire_layout_bounds, meta_at_alloc_and_seal, meta_charge_figures,
          lease_heap_order, lease_expiry_while_referenced, renew_rules)
