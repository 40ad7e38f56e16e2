/* latency: single operations from one client (stat round trip, alloc,
 * alloc + seal, warm open, release). */
#include <stdlib.h>

#include "bench.h"

/* Latency of single operations from one client. */
static void latency(void) {
    enum { N = 5000, WARM = 500 };
    int n = g_quick ? 1000 : N;
    gpubuf_client *c = conn();
    gpubuf_buffer *keep, **bufs = calloc((size_t)n + WARM, sizeof(*bufs));
    double *t = calloc((size_t)n + WARM, sizeof(*t));
    double *t2 = calloc((size_t)n + WARM, sizeof(*t2));
    char name[64];
    gpubuf_buffer_info info;

    /* A no-op round trip through the daemon: stat of a missing name. */
    for (int i = 0; i < n + WARM; i++) {
        double a = now_us();
        gpubuf_stat(c, "nope", &info);
        t[i] = now_us() - a;
    }
    report("gpubuf_roundtrip_stat", t + WARM, n);

    /* alloc and seal of 1 MiB buffers from a pool with free space. One
     * buffer stays open so the slab stays mapped (and the pool warm). */
    CHECK(gpubuf_alloc(c, g_pool, 1 << 20, "bench/keep", &keep));
    CHECK(gpubuf_seal(keep));
    for (int i = 0; i < n + WARM; i++) {
        snprintf(name, sizeof(name), "bench/%d", i);
        double a = now_us();
        CHECK(gpubuf_alloc(c, g_pool, 1 << 20, name, &bufs[i]));
        double b = now_us();
        CHECK(gpubuf_seal(bufs[i]));
        t[i] = b - a;
        t2[i] = now_us() - a;
        /* Keep the pool from growing without bound: delete as we go once
         * the warm-up is over, reusing the same few slabs. */
        CHECK(gpubuf_release(bufs[i]));
        if (i >= 64) {
            snprintf(name, sizeof(name), "bench/%d", i - 64);
            CHECK(gpubuf_delete(c, name));
        }
    }
    report("gpubuf_alloc_1MiB", t + WARM, n);
    report("gpubuf_alloc_seal_1MiB", t2 + WARM, n);
    /* warm open: name -> device address, slab already mapped here. */
    int live = 64;
    for (int i = 0; i < n + WARM; i++) {
        snprintf(name, sizeof(name), "bench/%d", n + WARM - live + (i % live));
        double a = now_us();
        CHECK(gpubuf_open(c, name, 0, &bufs[i]));
        volatile uint64_t addr = gpubuf_buffer_device_ptr(bufs[i]);
        (void)addr;
        t[i] = now_us() - a;
        a = now_us();
        CHECK(gpubuf_release(bufs[i]));
        t2[i] = now_us() - a;
    }
    report("gpubuf_open_warm", t + WARM, n);
    report("gpubuf_release", t2 + WARM, n);
    /* Nothing left behind: bench/run.sh runs the phase again in the same
     * daemon (the journal pairs). The figures are out: a failed delete is
     * reported, it does not stop the benchmark. */
    for (int i = n + WARM - live; i < n + WARM; i++) {
        snprintf(name, sizeof(name), "bench/%d", i);
        cleanup_delete(c, name);
    }
    gpubuf_release(keep);
    cleanup_delete(c, "bench/keep");
    gpubuf_disconnect(c);
}

int latency_phase(void) {
    return run_child(latency);
}
