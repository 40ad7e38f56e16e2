#include "gpu_batch.h"

#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "pattern.h"

#define N 40
#define SEED 0x5eed00u

typedef struct batch_job {
    const char *pool;
    bool read_only_ok;
} batch_job;

static uint64_t item_size(int i) {
    return (4ull << 20) + (uint64_t)i * 4096; /* 40 of them fill 3 slabs of 64 MiB */
}

static void item_name(char *out, size_t len, int i) {
    snprintf(out, len, "gb/%d", i);
}

static int produce(const test_daemon *d, void *arg) {
    const batch_job *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b[N];
    uint64_t sizes[N];
    char names[N][32];
    const char *pn[N];
    int st[N];
    for (int i = 0; i < N; i++) {
        sizes[i] = item_size(i);
        item_name(names[i], sizeof(names[i]), i);
        pn[i] = names[i];
    }
    if (gpubuf_connect(d->socket, &c) < 0)
        return 1;
    if (gpubuf_alloc_many(c, j->pool, N, sizes, pn, 0, b, st) != 0)
        return 2;
    for (int i = 0; i < N; i++)
        if (gpubuf_buffer_size(b[i]) != sizes[i] ||
            gpubuf_pattern_fill_device(gpubuf_buffer_device(b[i]), gpubuf_buffer_device_ptr(b[i]),
                                       sizes[i], SEED + (uint32_t)i) < 0)
            return 3;
    if (gpubuf_seal_many(b, N, st) != 0 || gpubuf_release_many(b, N, st) != 0)
        return 4;
    gpubuf_disconnect(c);
    return 0;
}

/* Check every view of v (NULL entries skipped) against its pattern. */
static int verify(gpubuf_buffer **v, int n) {
    for (int i = 0; i < n; i++) {
        uint64_t bad = 1;
        if (!v[i])
            continue;
        if (gpubuf_buffer_size(v[i]) != item_size(i) ||
            gpubuf_pattern_verify_device(gpubuf_buffer_device(v[i]),
                                         gpubuf_buffer_device_ptr(v[i]), item_size(i),
                                         SEED + (uint32_t)i, &bad) < 0 ||
            bad != 0)
            return -1;
    }
    return 0;
}

static int consume(const test_daemon *d, void *arg) {
    const batch_job *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *v[N + 1], *w[N], *one, *ro[N];
    char names[N + 1][32];
    const char *pn[N + 1];
    uint64_t ids[N];
    int st[N + 1];
    for (int i = 0; i < N; i++) {
        item_name(names[i], sizeof(names[i]), i);
        pn[i] = names[i];
    }
    snprintf(names[N], sizeof(names[N]), "gb/missing");
    pn[N] = names[N];
    if (gpubuf_connect(d->socket, &c) < 0)
        return 10;
    /* One missing name fails alone; the slabs come once each, with their
     * IPC handles (cuda-ipc) or fds (cuda-vmm). */
    if (gpubuf_open_many(c, N + 1, pn, NULL, 0, v, st) != 1 || st[N] != -ENOENT || v[N])
        return 11;
    if (c->n_maps < 3)
        return 12;
    uint32_t maps = c->n_maps;
    if (verify(v, N) < 0)
        return 13;
    for (int i = 0; i < N; i++) {
        if (st[i] != 0 || gpubuf_buffer_pool_kind(v[i]) == GPUBUF_POOL_HOST)
            return 14;
        ids[i] = gpubuf_buffer_id(v[i]);
    }
    /* Again by id, and a single open: the slabs are mapped, nothing new
     * is imported. */
    if (gpubuf_open_many(c, N, NULL, ids, 0, w, st) != 0 || c->n_maps != maps)
        return 15;
    if (verify(w, N) < 0)
        return 16;
    if (gpubuf_open(c, names[7], 0, &one) < 0 || c->n_maps != maps ||
        gpubuf_buffer_device_ptr(one) != gpubuf_buffer_device_ptr(v[7]))
        return 17;
    gpubuf_release(one);
    /* Read-only: a mapping of its own per slab on cuda-vmm; refused item
     * by item on cuda-ipc. */
    int failed = gpubuf_open_many(c, N, NULL, ids, GPUBUF_OPEN_READONLY, ro, st);
    if (j->read_only_ok) {
        if (failed != 0 || verify(ro, N) < 0 || !gpubuf_buffer_read_only(ro[0]) ||
            gpubuf_release_many(ro, N, st) != 0)
            return 18;
    } else {
        for (int i = 0; i < N; i++)
            if (st[i] != -EOPNOTSUPP || ro[i])
                return 19;
    }
    if (gpubuf_release_many(w, N, st) != 0 || gpubuf_release_many(v, N, st) != 0)
        return 20;
    gpubuf_disconnect(c);
    return 0;
}

void gpu_batch_story(const test_daemon *d, const char *pool, bool read_only_ok) {
    batch_job j = {.pool = pool, .read_only_ok = read_only_ok};
    ck_assert_int_eq(td_wait(td_spawn(produce, d, &j)), 0);
    ck_assert_int_eq(td_wait(td_spawn(consume, d, &j)), 0);
    gpubuf_status *s = td_status(d);
    const gpubuf_pool_info *p = td_find_pool(s, pool);
    ck_assert_ptr_nonnull(p);
    ck_assert_uint_ge(p->slabs, 3);
    gpubuf_status_free(s);
    /* No CUDA here: deleting needs none. */
    gpubuf_client *c = td_connect(d);
    char names[N][32];
    const char *pn[N];
    int st[N];
    for (int i = 0; i < N; i++) {
        item_name(names[i], sizeof(names[i]), i);
        pn[i] = names[i];
    }
    ck_assert_int_eq(gpubuf_delete_many(c, N, pn, NULL, st), 0);
    gpubuf_disconnect(c);
    /* The consumer's last releases may still be on their way: wait for them. */
    uint64_t used = 1;
    for (int k = 0; k < 500 && used; k++) {
        s = td_status(d);
        used = td_find_pool(s, pool)->used;
        gpubuf_status_free(s);
        if (used)
            usleep(10 * 1000);
    }
    ck_assert_uint_eq(used, 0);
}
