/* Batches through the library on host pools: a real gpubufd, many items per
 * request, partial failures, more slabs than one reply carries, and the
 * references and fds they leave (none). */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "harness.h"
#include "pattern.h"
#include "check_main.h"

#define KiB 1024ull
#define N 1000
/* A call of more items than this goes in requests of this many, each sent
 * before the reply of the one before it is worked on (docs/client-api.md,
 * "Batches"). */
#define PIPE 256
#define REQUESTS(n) (((n) + PIPE - 1) / PIPE)

static void start(void) {
    static const char *const args[] = {"--pool", "host=host,capacity=1G,slab=16M",
                                       "--pool", "small=host,capacity=64M,slab=1M", NULL};
    td_start(&D, args);
}

static char **make_names(const char *prefix, size_t n) {
    char **names = calloc(n, sizeof(*names));
    ck_assert_ptr_nonnull(names);
    for (size_t i = 0; i < n; i++) {
        names[i] = malloc(64);
        snprintf(names[i], 64, "%s%zu", prefix, i);
    }
    return names;
}

static void free_names(char **names, size_t n) {
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* p allocates m buffers of size bytes in pool, fills buffer i with pattern
 * i + seed and seals them all: their views in mine, their ids in ids. */
static void produce_filled(gpubuf_client *p, const char *pool, int m, uint64_t size,
                           uint32_t seed, gpubuf_buffer **mine, uint64_t *ids) {
    uint64_t *sizes = malloc((size_t)m * sizeof(*sizes));
    ck_assert_ptr_nonnull(sizes);
    for (int i = 0; i < m; i++)
        sizes[i] = size;
    ck_assert_int_eq(gpubuf_alloc_many(p, pool, (size_t)m, sizes, NULL, 0, mine, NULL), 0);
    for (int i = 0; i < m; i++) {
        gpubuf_pattern_fill(gpubuf_buffer_host_ptr(mine[i]), size, (uint32_t)i + seed);
        ids[i] = gpubuf_buffer_id(mine[i]);
    }
    ck_assert_int_eq(gpubuf_seal_many(mine, (size_t)m, NULL), 0);
    free(sizes);
}

/* The end of a test of pool "small": p deletes its m anonymous buffers
 * (ids) and releases its views (mine), both connections go, and neither
 * an fd nor a buffer is left (fds0: this process's fds at the start). */
static void finish_small(gpubuf_client *p, gpubuf_client *c, int m, const uint64_t *ids,
                         gpubuf_buffer **mine, int fds0) {
    /* Anonymous: deleted while held, freed with the last reference. */
    ck_assert_int_eq(gpubuf_delete_many(p, (size_t)m, NULL, ids, NULL), 0);
    ck_assert_int_eq(gpubuf_release_many(mine, (size_t)m, NULL), 0);
    gpubuf_disconnect(c);
    gpubuf_disconnect(p);
    /* Every fd that came with a reply was closed or mapped and unmapped. */
    ck_assert_int_eq(td_count_fds(getpid()), fds0);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(td_find_pool(s, "small")->buffers, 0);
    gpubuf_status_free(s);
}

/* The request counter of type, from a status snapshot. */
static uint64_t requests_of(const gpubuf_status *s, const char *type) {
    for (size_t i = 0; i < s->counters.n_requests; i++)
        if (strcmp(s->counters.requests[i].type, type) == 0)
            return s->counters.requests[i].requests;
    return 0;
}

START_TEST(open_and_release_a_thousand_in_one_call) {
    gpubuf_client *p = td_connect(&D), *c = td_connect(&D);
    char **names = make_names("kv", N);
    uint64_t *sizes = malloc(N * sizeof(*sizes));
    gpubuf_buffer **mine = calloc(N, sizeof(*mine)), **got = calloc(N, sizeof(*got));
    int *st = calloc(N, sizeof(*st));
    for (size_t i = 0; i < N; i++)
        sizes[i] = 4 * KiB + i;
    ck_assert_int_eq(gpubuf_alloc_many(p, "host", N, sizes, (const char *const *)names, 0, mine,
                                       st),
                     0);
    for (size_t i = 0; i < N; i++) {
        ck_assert_int_eq(st[i], 0);
        ck_assert_uint_eq(gpubuf_buffer_size(mine[i]), sizes[i]);
        ck_assert_str_eq(gpubuf_buffer_name(mine[i]), names[i]);
        gpubuf_pattern_fill(gpubuf_buffer_host_ptr(mine[i]), sizes[i], (uint32_t)i);
    }
    ck_assert_int_eq(gpubuf_seal_many(mine, N, st), 0);
    int fds_before = td_count_fds(getpid());
    ck_assert_int_eq(gpubuf_open_many(c, N, (const char *const *)names, NULL, 0, got, st), 0);
    for (size_t i = 0; i < N; i++) {
        ck_assert_int_eq(st[i], 0);
        ck_assert_uint_eq(gpubuf_buffer_id(got[i]), gpubuf_buffer_id(mine[i]));
        ck_assert_str_eq(gpubuf_buffer_name(got[i]), names[i]);
        ck_assert_int_eq(gpubuf_pattern_mismatches(gpubuf_buffer_host_ptr(got[i]), sizes[i],
                                              (uint32_t)i),
                         0);
    }
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(td_find_buffer(s, "kv0")->refs, 2);
    ck_assert_uint_eq(td_find_buffer(s, "kv999")->refs, 2);
    ck_assert_uint_eq(requests_of(s, "batch_open"), REQUESTS(N));
    ck_assert_uint_eq(requests_of(s, "batch_alloc"), REQUESTS(N));
    gpubuf_status_free(s);
    ck_assert_int_eq(gpubuf_release_many(got, N, st), 0);
    ck_assert_int_eq(gpubuf_release_many(mine, N, NULL), 0);
    /* Answered before the call returned: another connection sees it. */
    s = td_status(&D);
    for (size_t i = 0; i < N; i++)
        ck_assert_uint_eq(td_find_buffer(s, names[i])->refs, 0);
    ck_assert_uint_eq(requests_of(s, "batch_release"), 2);
    gpubuf_status_free(s);
    ck_assert_int_eq(gpubuf_delete_many(p, N, (const char *const *)names, NULL, st), 0);
    s = td_status(&D);
    ck_assert_uint_eq(td_find_pool(s, "host")->buffers, 0);
    gpubuf_status_free(s);
    /* The slab c mapped is unmapped or kept, never leaked twice. */
    ck_assert_int_le(td_count_fds(getpid()), fds_before);
    gpubuf_disconnect(c);
    gpubuf_disconnect(p);
    free_names(names, N);
    free(sizes);
    free(mine);
    free(got);
    free(st);
}
END_TEST

START_TEST(partial_failures_inside_a_batch) {
    gpubuf_client *p = td_connect(&D);
    gpubuf_buffer *a, *b, *got[5] = {0};
    int st[5];
    ck_assert_int_eq(gpubuf_alloc(p, "host", 4096, "pa", &a), 0);
    ck_assert_int_eq(gpubuf_seal_sync(a), 0);
    ck_assert_int_eq(gpubuf_alloc(p, "host", 4096, "pb", &b), 0); /* not sealed */
    const char *names[] = {"pa", "nothere", "pb", "bad name", "pa"};
    ck_assert_int_eq(gpubuf_open_many(p, 5, names, NULL, 0, got, st), 3);
    ck_assert_int_eq(st[0], 0);
    ck_assert_int_eq(st[1], -ENOENT);
    ck_assert_int_eq(st[2], -ENOENT);
    ck_assert_int_eq(st[3], -EINVAL);
    ck_assert_int_eq(st[4], 0);
    ck_assert_ptr_null(got[1]);
    ck_assert_ptr_nonnull(strstr(gpubuf_last_error_message(), "3 of 5 items failed"));
    /* Sealing twice, a sealed buffer and a view of an open: wrong state or
     * not the allocating connection's. */
    gpubuf_buffer *seal[] = {b, b, a, got[0]};
    ck_assert_int_eq(gpubuf_seal_many(seal, 4, st), 3);
    ck_assert_int_eq(st[0], 0);
    ck_assert_int_eq(st[1], GPUBUF_ESTATE);
    ck_assert_int_eq(st[2], GPUBUF_ESTATE);
    ck_assert_int_eq(st[3], -EPERM);
    /* Alloc: size 0 and a taken name fail, the rest goes. */
    uint64_t sizes[] = {100, 0, 100};
    const char *an[] = {"pc", "pd", "pa"};
    gpubuf_buffer *al[3];
    ck_assert_int_eq(gpubuf_alloc_many(p, "host", 3, sizes, an, GPUBUF_ALLOC_SEAL, al, st), 2);
    ck_assert_int_eq(st[0], 0);
    ck_assert_int_eq(st[1], -EINVAL);
    ck_assert_int_eq(st[2], -EEXIST);
    ck_assert_int_eq(gpubuf_seal(al[0]), GPUBUF_ESTATE); /* sealed in the same request */
    /* No such pool: the whole batch is refused. */
    gpubuf_buffer *none[3];
    ck_assert_int_eq(gpubuf_alloc_many(p, "nopool", 3, sizes, an, 0, none, st), GPUBUF_ENOPOOL);
    /* Delete: one missing. */
    const char *dn[] = {"pc", "gone"};
    ck_assert_int_eq(gpubuf_delete_many(p, 2, dn, NULL, st), 1);
    ck_assert_int_eq(st[1], -ENOENT);
    gpubuf_buffer *rel[] = {got[0], got[4], NULL, a, b, al[0]};
    ck_assert_int_eq(gpubuf_release_many(rel, 6, NULL), 0);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(td_find_buffer(s, "pa")->refs, 0);
    ck_assert_uint_eq(td_find_buffer(s, "pb")->refs, 0);
    gpubuf_status_free(s);
    gpubuf_disconnect(p);
}
END_TEST

/* Read-only opens by id (no access to a pool: tests/test_session.c, which
 * picks its uids; root here may use any pool). */
START_TEST(read_only_opens_by_id) {
    const char *const args[] = {"--pool", "open=host,capacity=16M,slab=1M", NULL};
    test_daemon d2;
    td_start(&d2, args);
    gpubuf_client *c = td_connect(&d2);
    gpubuf_buffer *b[2];
    int st[2];
    uint64_t sizes[] = {64, 64};
    ck_assert_int_eq(gpubuf_alloc_many(c, "open", 2, sizes, NULL, GPUBUF_ALLOC_SEAL, b, st), 0);
    uint64_t ids[] = {gpubuf_buffer_id(b[0]), gpubuf_buffer_id(b[1])};
    gpubuf_buffer *o[2];
    ck_assert_int_eq(gpubuf_open_many(c, 2, NULL, ids, GPUBUF_OPEN_READONLY, o, st), 0);
    ck_assert_int_eq(gpubuf_buffer_read_only(o[0]), 1);
    ck_assert_int_eq(gpubuf_release_many(o, 2, NULL), 0);
    ck_assert_int_eq(gpubuf_release_many(b, 2, NULL), 0);
    gpubuf_disconnect(c);
    ck_assert_int_eq(td_stop(&d2), 0);
}
END_TEST

/* 40 buffers of 700 KiB in a pool of 1 MiB slabs: 40 slabs, more than one
 * reply carries (16). The library sends the items that did not fit again. */
START_TEST(more_slabs_than_one_reply_carries) {
    int fds0 = td_count_fds(getpid());
    gpubuf_client *p = td_connect(&D), *c = td_connect(&D);
    enum { M = 40 };
    uint64_t sizes[M];
    gpubuf_buffer *mine[M], *got[M];
    uint64_t ids[M];
    int st[M];
    for (int i = 0; i < M; i++)
        sizes[i] = 700 * KiB;
    produce_filled(p, "small", M, 700 * KiB, 7, mine, ids);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(td_find_pool(s, "small")->slabs, M);
    gpubuf_status_free(s);
    ck_assert_int_eq(gpubuf_open_many(c, M, NULL, ids, 0, got, st), 0);
    for (int i = 0; i < M; i++)
        ck_assert_int_eq(gpubuf_pattern_mismatches(gpubuf_buffer_host_ptr(got[i]), sizes[i],
                                              (uint32_t)i + 7),
                         0);
    int rr = gpubuf_release_many(got, M, st);
    ck_assert_msg(rr == 0, "%d: %s (%d)", rr, gpubuf_last_error_message(), st[0]);
    finish_small(p, c, M, ids, mine, fds0);
}
END_TEST

/* 600 buffers of 100 KiB in 60 slabs of 1 MiB, opened in one call: three
 * requests in a pipeline, each reply describing at most 16 new slabs, the
 * second and third sent before the first reply's slabs were mapped (so a
 * slab may come twice: the second fd is closed). Every item opens, with
 * its bytes, and every fd goes. A call whose requests all fail as a whole
 * fails as a whole. */
START_TEST(pipelined_requests_bring_slabs_again_and_retry) {
    int fds0 = td_count_fds(getpid());
    gpubuf_client *p = td_connect(&D), *c = td_connect(&D);
    enum { M = 600 };
    uint64_t *sizes = malloc(M * sizeof(*sizes)), *ids = malloc(M * sizeof(*ids));
    gpubuf_buffer **mine = calloc(M, sizeof(*mine)), **got = calloc(M, sizeof(*got));
    int *st = calloc(M, sizeof(*st));
    for (int i = 0; i < M; i++)
        sizes[i] = 100 * KiB;
    produce_filled(p, "small", M, 100 * KiB, 3, mine, ids);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_ge(td_find_pool(s, "small")->slabs, 50);
    uint64_t before = requests_of(s, "batch_open");
    gpubuf_status_free(s);
    int rr = gpubuf_open_many(c, M, NULL, ids, 0, got, st);
    ck_assert_msg(rr == 0, "%d: %s", rr, gpubuf_last_error_message());
    for (int i = 0; i < M; i++) {
        ck_assert_int_eq(st[i], 0);
        ck_assert_uint_eq(gpubuf_buffer_id(got[i]), ids[i]);
        ck_assert_int_eq(gpubuf_pattern_mismatches(gpubuf_buffer_host_ptr(got[i]), sizes[i],
                                                   (uint32_t)i + 3),
                         0);
    }
    s = td_status(&D);
    /* Three requests, then the items whose slabs did not fit, again. */
    ck_assert_uint_gt(requests_of(s, "batch_open") - before, REQUESTS(M));
    gpubuf_status_free(s);
    ck_assert_int_eq(gpubuf_release_many(got, M, NULL), 0);
    /* No such pool: every request fails as a whole, and so does the call. */
    ck_assert_int_eq(gpubuf_alloc_many(p, "nopool", M, sizes, NULL, 0, got, st), GPUBUF_ENOPOOL);
    for (int i = 0; i < M; i++)
        ck_assert_ptr_null(got[i]);
    finish_small(p, c, M, ids, mine, fds0);
    free(sizes);
    free(ids);
    free(mine);
    free(got);
    free(st);
}
END_TEST

/* Sanitizer builds reserve terabytes of address space: no address-space
 * limit there. */
#if defined(__SANITIZE_ADDRESS__)
#define NO_AS_LIMIT 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define NO_AS_LIMIT 1
#endif
#endif

/* Views that cannot be made while a request is ahead: with the address
 * space capped, the slabs of a pipelined open (600 buffers in 60 slabs of
 * 1 MiB) cannot be mapped, so each of their items gives its reference back
 * with an asynchronous release while the next request is in flight. The
 * releases must not read that request's reply as one of theirs (it did:
 * the call failed with EPROTOCOL and the connection broke): the items fail
 * alone, the connection works, and no reference is left. */
#ifndef NO_AS_LIMIT
START_TEST(failed_views_while_a_request_is_ahead) {
    int fds0 = td_count_fds(getpid());
    gpubuf_client *p = td_connect(&D), *c = td_connect(&D);
    enum { M = 600 };
    uint64_t ids[M];
    gpubuf_buffer *mine[M], *got[M];
    int st[M];
    produce_filled(p, "small", M, 100 * KiB, 5, mine, ids);
    /* c's first view goes through (its slab stays mapped, kept), then the
     * address space is capped 768 KiB above what the process uses: room
     * for the call's own memory, none for a slab of 1 MiB. */
    ck_assert_int_eq(gpubuf_open_many(c, 1, NULL, ids, 0, got, st), 0);
    ck_assert_int_eq(gpubuf_release_many(got, 1, NULL), 0);
    struct rlimit rl;
    ck_assert_int_eq(getrlimit(RLIMIT_AS, &rl), 0);
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fscanf(f, "%lu", &pages), 1);
    fclose(f);
    rl.rlim_cur = (rlim_t)pages * (rlim_t)sysconf(_SC_PAGESIZE) + (768u << 10);
    ck_assert_int_eq(setrlimit(RLIMIT_AS, &rl), 0);
    int r = gpubuf_open_many(c, M, NULL, ids, 0, got, st);
    rl.rlim_cur = rl.rlim_max;
    ck_assert_int_eq(setrlimit(RLIMIT_AS, &rl), 0);
    ck_assert_msg(r > 0, "%d: %s", r, gpubuf_last_error_message());
    int failed = 0;
    for (int i = 0; i < M; i++) {
        ck_assert_int_eq(st[i] < 0, got[i] == NULL);
        failed += st[i] < 0;
    }
    ck_assert_int_eq(failed, r);
    /* The stream is in step: the connection answers, every view works. */
    gpubuf_buffer_info info;
    ck_assert_int_eq(gpubuf_stat_with(c, NULL, ids[0], NULL, &info), 0);
    for (int i = 0; i < M; i++)
        if (got[i])
            ck_assert_int_eq(gpubuf_pattern_mismatches(gpubuf_buffer_host_ptr(got[i]),
                                                       100 * KiB, (uint32_t)i + 5),
                             0);
    ck_assert_int_eq(gpubuf_release_many(got, M, NULL), 0);
    gpubuf_flush(c);
    gpubuf_status *s = td_status(&D);
    for (int i = 0; i < M; i++) {
        const gpubuf_status_buffer *b = NULL;
        for (size_t k = 0; k < s->n_buffers && !b; k++)
            if (s->buffers[k].id == ids[i])
                b = &s->buffers[k];
        ck_assert_ptr_nonnull(b);
        ck_assert_uint_eq(b->refs, 1); /* p's view alone */
    }
    gpubuf_status_free(s);
    finish_small(p, c, M, ids, mine, fds0);
}
END_TEST
#define AS_LIMIT_TESTS failed_views_while_a_request_is_ahead,
#else
#define AS_LIMIT_TESTS /* (none in sanitizer builds) */
#endif

/* More items than one request takes: the library splits them. */
START_TEST(long_batches_are_split) {
    gpubuf_client *c = td_connect(&D);
    enum { M = 5000 };
    uint64_t *sizes = malloc(M * sizeof(*sizes));
    gpubuf_buffer **b = calloc(M, sizeof(*b));
    for (int i = 0; i < M; i++)
        sizes[i] = 256;
    ck_assert_int_eq(gpubuf_alloc_many(c, "host", M, sizes, NULL, GPUBUF_ALLOC_SEAL, b, NULL), 0);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(td_find_pool(s, "host")->buffers, M);
    ck_assert_uint_eq(requests_of(s, "batch_alloc"), REQUESTS(M));
    gpubuf_status_free(s);
    ck_assert_int_eq(gpubuf_release_many(b, M, NULL), 0);
    gpubuf_disconnect(c);
    free(sizes);
    free(b);
}
END_TEST

/* Batch names are looked up as single ones (names are per pool): a plain
 * name in the default pool ("host"), /POOL/NAME in POOL; a plain name of
 * another pool is not found, and a malformed qualified name fails alone. */
START_TEST(batch_names_are_per_pool) {
    gpubuf_client *p = td_connect(&D), *c = td_connect(&D);
    uint64_t sizes[2] = {4096, 4096};
    const char *const made[2] = {"same", "only-small"};
    gpubuf_buffer *in_host[2], *in_small[2], *got[5];
    int st[5];
    ck_assert_int_eq(gpubuf_alloc_many(p, "host", 1, sizes, made, GPUBUF_ALLOC_SEAL, in_host, st),
                     0);
    ck_assert_int_eq(gpubuf_alloc_many(p, "small", 2, sizes, made, GPUBUF_ALLOC_SEAL, in_small, st),
                     0);
    const char *const names[5] = {"same", "/small/same", "only-small", "/small/only-small",
                                  "/small"};
    ck_assert_int_eq(gpubuf_open_many(c, 5, names, NULL, 0, got, st), 2);
    ck_assert_uint_eq(gpubuf_buffer_id(got[0]), gpubuf_buffer_id(in_host[0]));
    ck_assert_uint_eq(gpubuf_buffer_id(got[1]), gpubuf_buffer_id(in_small[0]));
    ck_assert_int_eq(st[2], -ENOENT);
    ck_assert_ptr_null(got[2]);
    ck_assert_uint_eq(gpubuf_buffer_id(got[3]), gpubuf_buffer_id(in_small[1]));
    ck_assert_int_eq(st[4], -EINVAL);
    gpubuf_buffer *held[3] = {got[0], got[1], got[3]};
    ck_assert_int_eq(gpubuf_release_many(held, 3, NULL), 0);
    /* Deletes the same way: "same" of the default pool goes, small's stays. */
    const char *const del[2] = {"same", "/small/only-small"};
    ck_assert_int_eq(gpubuf_delete_many(p, 2, del, NULL, st), 0);
    gpubuf_buffer_info info;
    ck_assert_int_eq(gpubuf_stat(c, "/small/same", &info), 0);
    ck_assert_int_eq(gpubuf_stat(c, "same", &info), -ENOENT);
    ck_assert_int_eq(gpubuf_release_many(in_host, 1, NULL), 0);
    ck_assert_int_eq(gpubuf_release_many(in_small, 2, NULL), 0);
    gpubuf_disconnect(c);
    gpubuf_disconnect(p);
}
END_TEST

/* Batch opens carry each buffer's layout and user bytes as single opens do,
 * and gpubuf_open_many_with() waits for items not sealed yet. */
START_TEST(batch_opens_carry_metadata_and_wait) {
    gpubuf_client *p = td_connect(&D), *c = td_connect(&D);
    gpubuf_layout l = {.dtype = {2, 32, 1}, .ndim = 2, .shape = {3, 4}, .byte_offset = 16,
                       .strides = {1, 3}, .has_strides = 1};
    gpubuf_meta m = {.layout = &l, .user_data = "key", .user_size = 3};
    gpubuf_buffer *a, *b, *got[3], *late = NULL;
    int st[3];
    ck_assert_int_eq(gpubuf_alloc_with(p, "host", 16 + 48, "meta/a", &m, &a), 0);
    ck_assert_int_eq(gpubuf_seal_sync(a), 0);
    ck_assert_int_eq(gpubuf_alloc(p, "host", 64, "meta/b", &b), 0);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    const char *const names[3] = {"meta/a", "meta/b", "meta/late"};
    /* No waiting: the missing item fails at once. */
    ck_assert_int_eq(gpubuf_open_many(c, 3, names, NULL, 0, got, st), 1);
    ck_assert_int_eq(st[2], -ENOENT);
    const gpubuf_layout *gl = gpubuf_buffer_layout(got[0]);
    ck_assert_ptr_nonnull(gl);
    ck_assert_int_eq(gl->dtype.code, 2);
    ck_assert_int_eq(gl->ndim, 2);
    ck_assert_int_eq(gl->shape[1], 4);
    ck_assert_int_eq(gl->strides[1], 3);
    ck_assert_int_eq(gl->has_strides, 1);
    ck_assert_uint_eq(gl->byte_offset, 16);
    size_t ulen;
    const void *u = gpubuf_buffer_user_data(got[0], &ulen);
    ck_assert_uint_eq(ulen, 3);
    ck_assert_mem_eq(u, "key", 3);
    ck_assert_ptr_null(gpubuf_buffer_layout(got[1]));
    ck_assert_ptr_null(gpubuf_buffer_user_data(got[1], NULL));
    ck_assert_int_eq(gpubuf_release_many(got, 2, NULL), 0);
    /* A timeout: the unsealed item fails with ETIMEDOUT, the others open. */
    ck_assert_int_eq(gpubuf_alloc(p, "host", 64, "meta/late", &late), 0);
    gpubuf_lookup o = {.timeout_ms = 50};
    ck_assert_int_eq(gpubuf_open_many_with(c, 3, names, NULL, &o, got, st), 1);
    ck_assert_int_eq(st[0], 0);
    ck_assert_int_eq(st[2], -ETIMEDOUT);
    ck_assert_ptr_null(got[2]);
    ck_assert_int_eq(gpubuf_release_many(got, 2, NULL), 0);
    /* Sealed in time: every item opens, with one deadline. */
    ck_assert_int_eq(gpubuf_seal_sync(late), 0);
    o.timeout_ms = 10000;
    ck_assert_int_eq(gpubuf_open_many_with(c, 3, names, NULL, &o, got, st), 0);
    ck_assert_int_eq(gpubuf_release_many(got, 3, NULL), 0);
    /* Options a batch does not take. */
    gpubuf_lookup bad = {.pool = "host"};
    ck_assert_int_eq(gpubuf_open_many_with(c, 3, names, NULL, &bad, got, st), -EINVAL);
    gpubuf_buffer *mine[3] = {a, b, late};
    ck_assert_int_eq(gpubuf_release_many(mine, 3, NULL), 0);
    gpubuf_disconnect(c);
    gpubuf_disconnect(p);
}
END_TEST

SUITE_MAIN("batch", "host-pool", start, td_stop_clean, 60,
          open_and_release_a_thousand_in_one_call, partial_failures_inside_a_batch,
          read_only_opens_by_id, more_slabs_than_one_reply_carries,
          pipelined_requests_bring_slabs_again_and_retry, AS_LIMIT_TESTS long_batches_are_split,
          batch_names_are_per_pool, batch_opens_carry_metadata_and_wait)
