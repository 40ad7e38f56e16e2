/* batch and batchmix: 1,000 opens and releases in one call each, and
 * g_procs processes doing batched alloc, seal, open, release and delete. */
#include <stdlib.h>

#include "bench.h"

/* One client opens 1,000 sealed buffers of slabs it has mapped in one call,
 * and releases them in one call; the same buffers opened one by one for
 * comparison. Rates in buffers per second, medians of the rounds. */
static void batch_open_release(void) {
    enum { B = 1000, WARM = 3 };
    int rounds = g_quick ? 20 : 100;
    gpubuf_client *p = conn(), *c = conn();
    uint64_t *sizes = calloc(B, sizeof(*sizes));
    char **names = calloc(B, sizeof(*names));
    gpubuf_buffer **mine = calloc(B, sizeof(*mine)), **got = calloc(B, sizeof(*got));
    double *to = calloc((size_t)rounds + WARM, sizeof(*to));
    double *tr = calloc((size_t)rounds + WARM, sizeof(*tr));
    double *ts = calloc(B, sizeof(*ts));
    for (int i = 0; i < B; i++) {
        sizes[i] = 4096;
        names[i] = malloc(32);
        snprintf(names[i], 32, "batch/%d", i);
    }
    if (gpubuf_alloc_many(p, g_pool, B, sizes, (const char *const *)names, GPUBUF_ALLOC_SEAL,
                          mine, NULL) != 0) {
        fprintf(stderr, "batch: alloc_many: %s\n", gpubuf_last_error_message());
        _exit(1);
    }
    /* The opener keeps one view so that the slab stays mapped in it. */
    gpubuf_buffer *hold;
    CHECK(gpubuf_open(c, names[0], 0, &hold));
    for (int r = 0; r < rounds + WARM; r++) {
        double a = now_us();
        if (gpubuf_open_many(c, B, (const char *const *)names, NULL, 0, got, NULL) != 0) {
            fprintf(stderr, "batch: open_many: %s\n", gpubuf_last_error_message());
            _exit(1);
        }
        double b = now_us();
        if (gpubuf_release_many(got, B, NULL) != 0) {
            fprintf(stderr, "batch: release_many: %s\n", gpubuf_last_error_message());
            _exit(1);
        }
        to[r] = b - a;
        tr[r] = now_us() - b;
    }
    qsort(to + WARM, (size_t)rounds, sizeof(double), cmpd);
    qsort(tr + WARM, (size_t)rounds, sizeof(double), cmpd);
    for (int i = 0; i < B; i++) {
        double a = now_us();
        CHECK(gpubuf_open(c, names[i], 0, &got[i]));
        ts[i] = now_us() - a;
    }
    for (int i = 0; i < B; i++)
        CHECK(gpubuf_release(got[i]));
    CHECK(gpubuf_flush(c));
    qsort(ts, B, sizeof(double), cmpd);
    printf("batch_open_1000_median_us %.1f\nbatch_release_1000_median_us %.1f\n",
           to[WARM + rounds / 2], tr[WARM + rounds / 2]);
    printf("batch_open_buffers_per_s %.0f\nbatch_release_buffers_per_s %.0f\n",
           B / to[WARM + rounds / 2] * 1e6, B / tr[WARM + rounds / 2] * 1e6);
    printf("batch_single_open_median_us %.2f\n", ts[B / 2]);
    gpubuf_release(hold);
    gpubuf_release_many(mine, B, NULL);
    gpubuf_delete_many(p, B, (const char *const *)names, NULL, NULL);
    gpubuf_disconnect(c);
    gpubuf_disconnect(p);
}

/* One of g_procs processes: rounds of K anonymous buffers allocated and
 * sealed (one request), opened by id, deleted, and both views released,
 * each step one batch: 6 buffer operations per buffer, as in throughput. */
static void batch_mixed_worker(int idx, double secs, int fd, int ready_fd, int go_fd) {
    enum { K = 256 };
    gpubuf_client *c = conn();
    uint64_t sizes[K], ids[K];
    gpubuf_buffer *b[K], *o[K];
    gpubuf_buffer *keep;
    char ch;
    long ops = 0;
    for (int i = 0; i < K; i++)
        sizes[i] = 4096;
    CHECK(gpubuf_alloc(c, g_pool, 4096, NULL, &keep)); /* keeps the slab mapped */
    if (write(ready_fd, "r", 1) != 1 || read(go_fd, &ch, 1) != 1)
        _exit(2);
    double end = now_us() + secs * 1e6;
    while (now_us() < end) {
        if (gpubuf_alloc_many(c, g_pool, K, sizes, NULL, GPUBUF_ALLOC_SEAL, b, NULL) != 0) {
            fprintf(stderr, "batch mixed: alloc_many: %s\n", gpubuf_last_error_message());
            _exit(1);
        }
        for (int i = 0; i < K; i++)
            ids[i] = gpubuf_buffer_id(b[i]);
        if (gpubuf_open_many(c, K, NULL, ids, 0, o, NULL) != 0 ||
            gpubuf_delete_many(c, K, NULL, ids, NULL) != 0 ||
            gpubuf_release_many(o, K, NULL) != 0 || gpubuf_release_many(b, K, NULL) != 0) {
            fprintf(stderr, "batch mixed: %s\n", gpubuf_last_error_message());
            _exit(1);
        }
        ops += 6 * K;
        ops_done(6 * K);
    }
    if (write(fd, &ops, sizeof(ops)) != sizeof(ops))
        _exit(2);
    gpubuf_release(keep);
    gpubuf_disconnect(c);
}

int batch_mixed_phase(void) {
    printf("%s_%dproc %.0f\n", BATCH_MIXED_RATE_KEY, g_procs,
           workers_ops_per_s(batch_mixed_worker));
    return 0;
}

int batch_phase(void) {
    return run_child(batch_open_release);
}
