/* Integration tests of array metadata and leases on a host pool: a real
 * gpubufd, clients in this and other processes, gpubufctl's output. */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "internal.h"
#include "layout_helpers.h"
#include "check_main.h"

static void start_default(void) {
    static const char *const args[] = {"--pool", "host=host,capacity=64M,slab=4M", NULL};
    td_start(&D, args);
}

static void assert_layout_eq(const gpubuf_layout *a, const gpubuf_layout *b) {
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->dtype.code, b->dtype.code);
    ck_assert_uint_eq(a->dtype.bits, b->dtype.bits);
    ck_assert_uint_eq(a->dtype.lanes, b->dtype.lanes);
    ck_assert_uint_eq(a->ndim, b->ndim);
    ck_assert_uint_eq(a->byte_offset, b->byte_offset);
    ck_assert_int_eq(a->has_strides, b->has_strides);
    for (uint32_t i = 0; i < a->ndim; i++) {
        ck_assert_int_eq(a->shape[i], b->shape[i]);
        if (b->has_strides)
            ck_assert_int_eq(a->strides[i], b->strides[i]);
    }
}

/* A raw request on c (bypassing the library's own checks): the daemon's
 * status, its message in msg. */
static int raw_request(gpubuf_client *c, Gpubuf__Request *req, char *msg, size_t len) {
    Gpubuf__Response *resp;
    int fd;
    pthread_mutex_lock(&c->lock);
    int r = gpubuf__rpc_locked(c, req, &resp, &fd);
    pthread_mutex_unlock(&c->lock);
    snprintf(msg, len, "%s", gpubuf_last_error_message());
    if (r == 0) {
        if (fd >= 0)
            close(fd);
        gpubuf__response__free_unpacked(resp, NULL);
    }
    return r;
}

static uint64_t pool_used(void) {
    gpubuf_status *s = td_status(&D);
    uint64_t used = s->pools[0].used;
    gpubuf_status_free(s);
    return used;
}

/* Alloc with a layout and user bytes, open in another process: both views,
 * stat and status describe the same layout. */
static int consumer_checks_layout(const test_daemon *d, void *arg) {
    const gpubuf_layout *want = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    size_t n;
    if (gpubuf_connect(d->socket, &c) < 0 || gpubuf_open(c, "arr", 1000, &b) < 0)
        return 10;
    const gpubuf_layout *l = gpubuf_buffer_layout(b);
    if (!l || l->ndim != want->ndim || l->shape[0] != want->shape[0] ||
        l->strides[0] != want->strides[0] || l->strides[1] != want->strides[1] ||
        l->dtype.bits != 32 || l->byte_offset != want->byte_offset)
        return 11;
    const char *u = gpubuf_buffer_user_data(b, &n);
    if (!u || n != 5 || memcmp(u, "hello", 5))
        return 12;
    gpubuf_release(b);
    gpubuf_disconnect(c);
    return 0;
}

START_TEST(metadata_round_trip) {
    gpubuf_client *c = td_connect(&D);
    int64_t shape[2] = {4, 8};
    gpubuf_layout l = f32(2, shape);
    /* A column-major 4x8 array after a 16-byte header. */
    l.has_strides = 1;
    l.strides[0] = 1;
    l.strides[1] = 4;
    l.byte_offset = 16;
    gpubuf_meta m = {.layout = &l, .user_data = "hello", .user_size = 5};
    gpubuf_buffer *b;
    ck_assert_int_eq(gpubuf_alloc_with(c, NULL, 16 + 128, "arr", &m, &b), 0);
    assert_layout_eq(gpubuf_buffer_layout(b), &l);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    pid_t p = td_spawn(consumer_checks_layout, &D, &l);
    ck_assert_int_eq(td_wait(p), 0);
    /* Opened here too, by id; a slice has no layout. */
    gpubuf_buffer *o, *sl;
    ck_assert_int_eq(gpubuf_open_id(c, gpubuf_buffer_id(b), 0, &o), 0);
    assert_layout_eq(gpubuf_buffer_layout(o), &l);
    ck_assert_int_eq(gpubuf_buffer_slice(o, 16, 32, &sl), 0);
    ck_assert_ptr_null(gpubuf_buffer_layout(sl));
    gpubuf_release(sl);
    gpubuf_release(o);
    /* stat_ex, by name and by id. */
    gpubuf_buffer_info info;
    gpubuf_buffer_meta *bm = calloc(1, sizeof(*bm));
    ck_assert_int_eq(gpubuf_stat_meta(c, "arr", 0, NULL, &info, bm), 0);
    ck_assert_uint_eq(info.size, 144);
    ck_assert(bm->has_layout);
    assert_layout_eq(&bm->layout, &l);
    ck_assert_uint_eq(bm->user_size, 5);
    ck_assert_mem_eq(bm->user_data, "hello", 5);
    ck_assert_uint_eq(bm->lease_left_ms, 0);
    ck_assert_int_eq(gpubuf_stat_meta(c, NULL, info.id, NULL, &info, NULL), 0);
    free(bm);
    /* Status: dtype and shape per buffer; none for a plain one. */
    gpubuf_buffer *plain;
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 64, "plain", &plain), 0);
    gpubuf_status *s = td_status(&D);
    ck_assert_ptr_nonnull(s->buffer_meta);
    for (size_t i = 0; i < s->n_buffers; i++) {
        const gpubuf_status_meta *x = &s->buffer_meta[i];
        if (!strcmp(s->buffers[i].name, "arr")) {
            ck_assert(x->has_layout);
            ck_assert_uint_eq(x->dtype.code, 2);
            ck_assert_uint_eq(x->ndim, 2);
            ck_assert_int_eq(x->shape[0], 4);
            ck_assert_int_eq(x->shape[1], 8);
            ck_assert_uint_eq(x->user_size, 5);
        } else {
            ck_assert(!x->has_layout);
            ck_assert_uint_eq(x->user_size, 0);
        }
    }
    gpubuf_status_free(s);
    /* Set at seal instead: the sealing view and an opener see it. */
    int64_t flat[1] = {16};
    gpubuf_layout l2 = f32(1, flat);
    gpubuf_meta m2 = {.layout = &l2};
    ck_assert_ptr_null(gpubuf_buffer_layout(plain));
    ck_assert_int_eq(gpubuf_seal_sync_with(plain, &m2), 0);
    assert_layout_eq(gpubuf_buffer_layout(plain), &l2);
    ck_assert_int_eq(gpubuf_open(c, "plain", 0, &o), 0);
    assert_layout_eq(gpubuf_buffer_layout(o), &l2);
    ck_assert_ptr_null(gpubuf_buffer_user_data(o, NULL));
    gpubuf_release(o);
    gpubuf_release(plain);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(metadata_bounds) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    char msg[300];
    int64_t shape[33];
    for (int i = 0; i < 33; i++)
        shape[i] = 1;
    gpubuf_layout l = f32(33, shape);
    gpubuf_meta m = {.layout = &l};
    /* The library refuses before a round trip... */
    ck_assert_int_eq(gpubuf_alloc_with(c, NULL, 64, "b", &m, &b), -EINVAL);
    ck_assert_ptr_nonnull(strstr(gpubuf_last_error_message(), "at most 32"));
    /* ...and the daemon refuses the same on the wire. */
    int64_t dims[33];
    for (int i = 0; i < 33; i++)
        dims[i] = 1;
    Gpubuf__ArrayLayout wl = GPUBUF__ARRAY_LAYOUT__INIT;
    wl.dtype_code = 2;
    wl.dtype_bits = 32;
    wl.dtype_lanes = 1;
    wl.shape = dims;
    wl.n_shape = 33;
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    a.size = 64;
    a.name = "b";
    a.layout = &wl;
    req.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    req.alloc = &a;
    ck_assert_int_eq(raw_request(c, &req, msg, sizeof(msg)), -EINVAL);
    ck_assert_msg(strstr(msg, "at most 32"), "%s", msg);
    /* A layout that does not fit the size. */
    wl.n_shape = 2;
    dims[0] = 4;
    dims[1] = 5;
    a.size = 79;
    ck_assert_int_eq(raw_request(c, &req, msg, sizeof(msg)), -EINVAL);
    ck_assert_msg(strstr(msg, "needs 80 bytes"), "%s", msg);
    /* An unknown dtype code; bits that are not whole bytes. */
    a.size = 80;
    wl.dtype_code = 99;
    ck_assert_int_eq(raw_request(c, &req, msg, sizeof(msg)), -EINVAL);
    ck_assert_msg(strstr(msg, "dtype code 99"), "%s", msg);
    wl.dtype_code = 2;
    wl.dtype_bits = 12;
    ck_assert_int_eq(raw_request(c, &req, msg, sizeof(msg)), -EINVAL);
    wl.dtype_bits = 32;
    /* User bytes beyond 4 KiB. */
    static uint8_t user[GPUBUF_USER_DATA_MAX + 1];
    a.user_data.data = user;
    a.user_data.len = sizeof(user);
    ck_assert_int_eq(raw_request(c, &req, msg, sizeof(msg)), -EINVAL);
    ck_assert_msg(strstr(msg, "at most 4096"), "%s", msg);
    gpubuf_meta mu = {.user_data = user, .user_size = sizeof(user)};
    ck_assert_int_eq(gpubuf_alloc_with(c, NULL, 64, "b", &mu, &b), -EINVAL);
    /* A lease beyond max_lease_ms (7 days by default). */
    gpubuf_meta ml = {.ttl_ms = 8ull * 86400 * 1000};
    ck_assert_int_eq(gpubuf_alloc_with(c, NULL, 64, "b", &ml, &b), -EINVAL);
    ck_assert_ptr_nonnull(strstr(gpubuf_last_error_message(), "max_lease_ms"));
    /* Nothing was allocated by any of these. */
    ck_assert_uint_eq(pool_used(), 0);
    /* Exactly 4096 user bytes and 32 dimensions are fine. */
    mu.user_size = GPUBUF_USER_DATA_MAX;
    l.ndim = 32;
    mu.layout = &l;
    ck_assert_int_eq(gpubuf_alloc_with(c, NULL, 4, "b", &mu, &b), 0);
    /* Once sealed, the metadata cannot change. */
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    int64_t one[1] = {1};
    gpubuf_layout l1 = f32(1, one);
    gpubuf_meta m1 = {.layout = &l1};
    ck_assert_int_eq(gpubuf_seal_sync_with(b, &m1), GPUBUF_ESTATE);
    Gpubuf__SealRequest sq = GPUBUF__SEAL_REQUEST__INIT;
    Gpubuf__ArrayLayout w1 = GPUBUF__ARRAY_LAYOUT__INIT;
    w1.dtype_code = 1;
    w1.dtype_bits = 8;
    w1.dtype_lanes = 1;
    sq.buffer_id = gpubuf_buffer_id(b);
    sq.layout = &w1;
    req.body_case = GPUBUF__REQUEST__BODY_SEAL;
    req.seal = &sq;
    ck_assert_int_eq(raw_request(c, &req, msg, sizeof(msg)), GPUBUF_ESTATE);
    gpubuf_buffer_info info;
    gpubuf_buffer_meta *bm = calloc(1, sizeof(*bm));
    ck_assert_int_eq(gpubuf_stat_meta(c, "b", 0, NULL, &info, bm), 0);
    ck_assert_uint_eq(bm->layout.ndim, 32);
    ck_assert_uint_eq(bm->user_size, GPUBUF_USER_DATA_MAX);
    free(bm);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

static const gpubuf_status_buffer *find(gpubuf_status *s, const char *name, size_t *ret_i) {
    for (size_t i = 0; i < s->n_buffers; i++)
        if (!strcmp(s->buffers[i].name, name)) {
            *ret_i = i;
            return &s->buffers[i];
        }
    return NULL;
}

/* Poll until buffer name is gone from status (true) or timeout_ms passed. */
static bool wait_gone(const char *name, int timeout_ms) {
    for (int t = 0; t < timeout_ms; t += 10) {
        gpubuf_status *s = td_status(&D);
        size_t i;
        bool gone = find(s, name, &i) == NULL;
        gpubuf_status_free(s);
        if (gone)
            return true;
        td_sleep_ms(10);
    }
    return false;
}

START_TEST(lease_expires_unreferenced) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    gpubuf_meta m = {.ttl_ms = 200};
    ck_assert_int_eq(gpubuf_alloc_with(c, NULL, 1 << 20, "short", &m, &b), 0);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    gpubuf_release(b);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    gpubuf_status *s = td_status(&D);
    size_t i;
    ck_assert_ptr_nonnull(find(s, "short", &i));
    ck_assert_uint_gt(s->buffer_meta[i].lease_left_ms, 0);
    ck_assert_uint_le(s->buffer_meta[i].lease_left_ms, 200);
    ck_assert_uint_eq(s->leases_active, 1);
    ck_assert_uint_eq(s->pools[0].used, 1 << 20);
    gpubuf_status_free(s);
    ck_assert(wait_gone("short", 3000));
    ck_assert_uint_eq(pool_used(), 0);
    s = td_status(&D);
    ck_assert_uint_eq(s->leases_expired, 1);
    ck_assert_uint_eq(s->leases_active, 0);
    gpubuf_status_free(s);
    ck_assert_int_eq(gpubuf_open(c, "short", 0, &b), -ENOENT);
    /* The name is free for a new buffer. */
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 64, "short", &b), 0);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

/* A consumer holds the buffer when its lease expires: the name goes, the
 * memory stays (and keeps its contents) until the consumer releases it. */
START_TEST(lease_expires_while_referenced) {
    gpubuf_client *p = td_connect(&D), *c = td_connect(&D);
    gpubuf_buffer *b, *o;
    gpubuf_meta m = {.ttl_ms = 150};
    ck_assert_int_eq(gpubuf_alloc_with(p, NULL, 1 << 20, "held", &m, &b), 0);
    td_fill(gpubuf_buffer_host_ptr(b), 1 << 20, 42);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    ck_assert_int_eq(gpubuf_open(c, "held", 0, &o), 0);
    uint64_t id = gpubuf_buffer_id(o);
    gpubuf_release(b);
    gpubuf_disconnect(p);
    /* Expired: unpublished (deleted), still listed while referenced. */
    gpubuf_status *s = NULL;
    size_t i = 0;
    for (int t = 0; t < 3000; t += 10) {
        gpubuf_status_free(s);
        s = td_status(&D);
        if (s->leases_expired == 1)
            break;
        td_sleep_ms(10);
    }
    ck_assert_uint_eq(s->leases_expired, 1);
    bool listed = false;
    for (i = 0; i < s->n_buffers; i++)
        if (s->buffers[i].id == id) {
            listed = true;
            ck_assert_int_eq(s->buffers[i].state, GPUBUF_STATE_DELETED);
            ck_assert_uint_eq(s->buffers[i].refs, 1);
            ck_assert_uint_eq(s->buffer_meta[i].lease_left_ms, 0);
        }
    ck_assert(listed);
    ck_assert_uint_eq(s->pools[0].used, 1 << 20);
    gpubuf_status_free(s);
    gpubuf_buffer *x;
    ck_assert_int_eq(gpubuf_open(c, "held", 0, &x), -ENOENT);
    ck_assert_int_eq(gpubuf_open_id(c, id, 0, &x), -ENOENT);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(o), 1 << 20, 42), 0);
    gpubuf_release(o);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    ck_assert_uint_eq(pool_used(), 0);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(lease_renewed_by_owner) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    gpubuf_meta m = {.ttl_ms = 1500};
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 64, "keep", &b), 0);
    ck_assert_int_eq(gpubuf_seal_sync_with(b, &m), 0); /* the lease starts at the seal */
    gpubuf_release(b);
    /* Renewed every 400 ms (with its own ttl, then a longer one): it
     * outlives its first 1.5 s by far; a loaded machine may stretch a pause
     * by up to 1.1 s before the lease runs out between two renewals. */
    for (int i = 0; i < 8; i++) {
        td_sleep_ms(400); /* renewed over 3.2 s: measures a duration */
        ck_assert_int_eq(gpubuf_renew(c, "keep", 0, 0), 0);
    }
    ck_assert_int_eq(gpubuf_renew(c, "/host/keep", 0, 60000), 0); /* a qualified name */
    gpubuf_buffer_info info;
    gpubuf_buffer_meta *bm = calloc(1, sizeof(*bm));
    ck_assert_int_eq(gpubuf_stat_meta(c, "keep", 0, NULL, &info, bm), 0);
    ck_assert_uint_gt(bm->lease_left_ms, 59000);
    ck_assert_uint_eq(bm->lease_ttl_ms, 60000);
    free(bm);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->leases_renewed, 9);
    ck_assert_int_eq(gpubuf_renew(c, "/nopool/keep", 0, 1000), GPUBUF_ENOPOOL);
    ck_assert_uint_eq(s->leases_expired, 0);
    gpubuf_status_free(s);
    /* Renewing with a short lease makes it expire soon after. */
    ck_assert_int_eq(gpubuf_renew(c, NULL, info.id, 50), 0);
    ck_assert(wait_gone("keep", 30000));
    ck_assert_int_eq(gpubuf_renew(c, "keep", 0, 50), -ENOENT);
    /* Renewal errors: no lease and no ttl; unknown names. */
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 64, "nolease", &b), 0);
    ck_assert_int_eq(gpubuf_renew(c, "nolease", 0, 0), -EINVAL);
    ck_assert_ptr_nonnull(strstr(gpubuf_last_error_message(), "no lease"));
    ck_assert_int_eq(gpubuf_renew(c, "missing", 0, 100), -ENOENT);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

/* As nobody: renewing root's "mine" is refused with -EPERM (0; 1: it was
 * not; 2, 3: becoming nobody or connecting failed). */
static int renew_as_nobody(const test_daemon *d, void *arg) {
    gpubuf_client *o;
    (void)arg;
    if (setgid(65534) < 0 || setuid(65534) < 0)
        return 2;
    if (gpubuf_connect(d->socket, &o) < 0)
        return 3;
    return gpubuf_renew(o, "mine", 0, 1000) == -EPERM ? 0 : 1;
}

/* Renewing another uid's buffer needs root: run as nobody when we are root
 * (the registry's unit test covers it for every user). */
START_TEST(lease_renew_by_other_uid_refused) {
    if (geteuid() != 0)
        return;
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    gpubuf_meta m = {.ttl_ms = 60000};
    ck_assert_int_eq(gpubuf_alloc_with(c, NULL, 64, "mine", &m, &b), 0);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    ck_assert_int_eq(chmod(D.socket, 0666), 0);
    ck_assert_int_eq(chmod(D.dir, 0755), 0);
    ck_assert_int_eq(td_wait(td_spawn(renew_as_nobody, &D, NULL)), 0);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(gpubufctl_shows_layout_and_lease) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b, *plain;
    int64_t shape[2] = {16, 16};
    gpubuf_layout l = f32(2, shape);
    gpubuf_meta m = {.layout = &l, .user_data = "xyz", .user_size = 3, .ttl_ms = 600000};
    ck_assert_int_eq(gpubuf_alloc_with(c, NULL, 1024, "tensor", &m, &b), 0);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 64, "bytes", &plain), 0);
    char cmd[512];
    int code;
    snprintf(cmd, sizeof(cmd), "%s --socket %s buffers", GPUBUFCTL_PATH, D.socket);
    char *out = td_capture(cmd, &code);
    ck_assert_int_eq(code, 0);
    ck_assert_msg(strstr(out, "LAYOUT") && strstr(out, "LEASE"), "%s", out);
    ck_assert_msg(strstr(out, "float32[16,16]"), "%s", out);
    ck_assert_msg(strstr(out, " 9m5") || strstr(out, "10m00s"), "%s", out); /* ~10 minutes */
    free(out);
    snprintf(cmd, sizeof(cmd), "%s --socket %s --json buffers", GPUBUFCTL_PATH, D.socket);
    out = td_capture(cmd, &code);
    ck_assert_int_eq(code, 0);
    ck_assert_msg(strstr(out, "\"dtype\":\"float32\",\"dtype_code\":2,\"dtype_bits\":32,"
                              "\"dtype_lanes\":1,\"shape\":[16,16],\"user_bytes\":3,"
                              "\"lease_left_ms\":"),
                  "%s", out);
    ck_assert_int_eq(td_count(out, "\"dtype\""), 1); /* the plain buffer has none */
    free(out);
    snprintf(cmd, sizeof(cmd), "%s --socket %s --pretty buffers", GPUBUFCTL_PATH,
             D.socket);
    out = td_capture(cmd, &code);
    ck_assert_int_eq(code, 0);
    ck_assert_msg(strstr(out, "\"lease_left_ms\"") && strstr(out, "\"float32\""), "%s", out);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s --socket %s metrics", GPUBUFCTL_PATH, D.socket);
    out = td_capture(cmd, &code);
    ck_assert_int_eq(code, 0);
    ck_assert_msg(strstr(out, "\ngpubuf_leases 1\n"), "%s", out);
    ck_assert_msg(strstr(out, "\ngpubuf_leases_expired_total 0\n"), "%s", out);
    ck_assert_msg(strstr(out, "\ngpubuf_lease_soonest_expiry_seconds 5") ||
                      strstr(out, "\ngpubuf_lease_soonest_expiry_seconds 6"),
                  "%s", out);
    ck_assert_msg(strstr(out, "gpubuf_requests_total{type=\"renew\"}"), "%s", out);
    free(out);
    gpubuf_release(plain);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

/* Released root views are kept for the next ones (GPUBUF_SPARE_VIEWS,
 * none in sanitizer builds): a view made from a spare shows only its own
 * buffer, never the layout, user bytes, name or id of the view before. */
START_TEST(spare_views_come_back_clean) {
    enum { N = 64 };
    gpubuf_client *c = td_connect(&D);
    gpubuf_layout l = {.dtype = {.code = 2, .bits = 32, .lanes = 1}, .ndim = 1, .shape = {16}};
    gpubuf_meta m = {.layout = &l, .user_data = "spare", .user_size = 5};
    gpubuf_buffer *v[N], *w[N];
    char names[2 * N][32];
    const char *lay[N], *plain[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "spare/lay/%d", i);
        snprintf(names[N + i], sizeof(names[N + i]), "spare/plain/%d", i);
        lay[i] = names[i];
        plain[i] = names[N + i];
        ck_assert_int_eq(gpubuf_alloc_with(c, NULL, 64, lay[i], &m, &v[i]), 0);
        ck_assert_int_eq(gpubuf_seal_sync(v[i]), 0);
        ck_assert_int_eq(gpubuf_alloc(c, NULL, 32, plain[i], &w[i]), 0);
        ck_assert_int_eq(gpubuf_seal_sync(w[i]), 0);
    }
    ck_assert_int_eq(gpubuf_release_many(v, N, NULL), 0);
    ck_assert_int_eq(gpubuf_release_many(w, N, NULL), 0);
    ck_assert_int_eq(gpubuf_open_many(c, N, lay, NULL, 0, v, NULL), 0);
    for (int i = 0; i < N; i++)
        ck_assert_ptr_nonnull(gpubuf_buffer_layout(v[i]));
    unsigned before = c->n_spare;
    ck_assert_int_eq(gpubuf_release_many(v, N, NULL), 0);
    ck_assert_uint_eq(c->n_spare, GPUBUF_SPARE_VIEWS ? before + N : 0);
    ck_assert_int_eq(gpubuf_open_many(c, N, plain, NULL, 0, w, NULL), 0);
    ck_assert_uint_eq(c->n_spare, GPUBUF_SPARE_VIEWS ? before : 0);
    for (int i = 0; i < N; i++) {
        size_t n = 1;
        ck_assert_ptr_null(gpubuf_buffer_layout(w[i]));
        ck_assert_ptr_null(gpubuf_buffer_user_data(w[i], &n));
        ck_assert_uint_eq(n, 0);
        ck_assert_str_eq(gpubuf_buffer_name(w[i]), plain[i]);
        ck_assert_uint_eq(gpubuf_buffer_size(w[i]), 32);
        ck_assert_int_eq(gpubuf_buffer_read_only(w[i]), 0);
    }
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(gpubuf_release(w[i]), 0);
    ck_assert_uint_eq(c->n_spare, GPUBUF_SPARE_VIEWS ? before + N : 0);
    gpubuf_disconnect(c); /* frees the spares (the leak check of sanitizer builds) */
}
END_TEST

/* A batch open of items with and without metadata, a missing one among
 * them: each view gets its own item's layout and user bytes (the reply
 * carries them only for the items that have some, sparse_meta), and an
 * item after a failed one is not given its neighbour's. */
START_TEST(batch_open_sparse_metadata) {
    enum { N = 30 };
    gpubuf_client *c = td_connect(&D);
    gpubuf_layout l = {.dtype = {.code = 2, .bits = 32, .lanes = 1}, .ndim = 1, .shape = {4}};
    char names[N][32], user[N][16];
    const char *list[N];
    gpubuf_buffer *v[N] = {0}, *got[N] = {0};
    int st[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "sparse/%d", i);
        snprintf(user[i], sizeof(user[i]), "user-%d", i);
        list[i] = names[i];
        gpubuf_meta m = {.layout = i % 3 == 0 ? &l : NULL,
                         .user_data = i % 3 == 0 || i % 5 == 0 ? user[i] : NULL,
                         .user_size = i % 3 == 0 || i % 5 == 0 ? strlen(user[i]) : 0};
        if (i % 7 == 3)
            continue; /* never made: the open fails for it */
        ck_assert_int_eq(gpubuf_alloc_with(c, NULL, 16, names[i], &m, &v[i]), 0);
        ck_assert_int_eq(gpubuf_seal_sync(v[i]), 0);
    }
    ck_assert_int_eq(gpubuf_open_many(c, N, list, NULL, 0, got, st), 4); /* 3, 10, 17, 24 */
    for (int i = 0; i < N; i++) {
        if (i % 7 == 3) {
            ck_assert_int_eq(st[i], -ENOENT);
            ck_assert_ptr_null(got[i]);
            continue;
        }
        ck_assert_int_eq(st[i], 0);
        const gpubuf_layout *gl = gpubuf_buffer_layout(got[i]);
        size_t n = 0;
        const void *u = gpubuf_buffer_user_data(got[i], &n);
        if (i % 3 == 0) {
            ck_assert_ptr_nonnull(gl);
            ck_assert_int_eq(gl->shape[0], 4);
        } else {
            ck_assert_ptr_null(gl);
        }
        if (i % 3 == 0 || i % 5 == 0) {
            ck_assert_uint_eq(n, strlen(user[i]));
            ck_assert_mem_eq(u, user[i], n);
        } else {
            ck_assert_ptr_null(u);
            ck_assert_uint_eq(n, 0);
        }
    }
    ck_assert_int_eq(gpubuf_release_many(got, N, NULL), 0);
    ck_assert_int_eq(gpubuf_release_many(v, N, NULL), 0);
    gpubuf_disconnect(c);
}
END_TEST

SUITE_MAIN("meta", "meta", start_default, td_stop_clean, 60,
          metadata_round_trip, metadata_bounds, lease_expires_unreferenced,
          lease_expires_while_referenced, lease_renewed_by_owner,
          lease_renew_by_other_uid_refused, gpubufctl_shows_layout_and_lease,
          spare_views_come_back_clean, batch_open_sparse_metadata)
