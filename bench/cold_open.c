/* cold: the open of a buffer whose slab this process has not mapped yet. */
#include "bench.h"

/* cold open: first buffer of a slab this process has not mapped. The cold
 * pool has 2 MiB slabs and every buffer fills one. */
static void cold_setup(void) {
    gpubuf_client *c = conn();
    char name[GPUBUF_NAME_MAX + 1];
    for (int i = 0; i < 220; i++) {
        gpubuf_buffer *b;
        snprintf(name, sizeof(name), "/%s/cold/%d", g_cold_pool, i);
        CHECK(gpubuf_alloc(c, g_cold_pool, 2 << 20, name, &b));
        CHECK(gpubuf_seal(b));
        gpubuf_release(b);
    }
    gpubuf_disconnect(c);
}

static void cold_open(void) {
    gpubuf_client *c = conn();
    gpubuf_buffer *b[220];
    double t[220];
    char name[GPUBUF_NAME_MAX + 1];
    for (int i = 0; i < 220; i++) {
        snprintf(name, sizeof(name), "/%s/cold/%d", g_cold_pool, i);
        double a = now_us();
        CHECK(gpubuf_open(c, name, 0, &b[i]));
        t[i] = now_us() - a;
    }
    report("gpubuf_open_cold_2MiB_slab", t + 20, 200);
    /* Nothing left behind: bench/run.sh runs the phase again in the same
     * daemon (the journal pairs). The figures are out: a failed delete is
     * reported, it does not stop the benchmark. */
    for (int i = 0; i < 220; i++) {
        gpubuf_release(b[i]);
        snprintf(name, sizeof(name), "/%s/cold/%d", g_cold_pool, i);
        cleanup_delete(c, name);
    }
    gpubuf_disconnect(c);
}

int cold_phase(void) {
    return run_child(cold_setup) || run_child(cold_open);
}
