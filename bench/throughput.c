/* throughput: g_procs processes doing alloc, seal, open, release and
 * delete as fast as they can. */
#include "bench.h"

/* Throughput: nproc processes, each a loop of alloc, seal, open, release,
 * release, delete (6 operations) for `secs` seconds. */
static void mixed_worker(int idx, double secs, int fd, int ready_fd, int go_fd) {
    gpubuf_client *c = conn();
    gpubuf_buffer *keep;
    char name[64], ch;
    long ops = 0;
    /* Warm up outside the timed part: CUDA initialisation and the first
     * import of the slab; `keep` keeps the slab mapped in this process. */
    snprintf(name, sizeof(name), "mix/%d/keep", idx);
    CHECK(gpubuf_alloc(c, g_pool, 64 << 10, name, &keep));
    if (write(ready_fd, "r", 1) != 1 || read(go_fd, &ch, 1) != 1)
        _exit(2);
    double end = now_us() + secs * 1e6, t[7] = {0};
    while ((t[0] = now_us()) < end) {
        gpubuf_buffer *b, *o;
        snprintf(name, sizeof(name), "mix/%d/%ld", idx, ops);
        CHECK(gpubuf_alloc(c, g_pool, 64 << 10, name, &b));
        t[1] += now_us() - t[0];
        CHECK(gpubuf_seal(b));
        double a = now_us();
        CHECK(gpubuf_open(c, name, 0, &o));
        t[2] += now_us() - a;
        a = now_us();
        CHECK(gpubuf_release(o));
        CHECK(gpubuf_release(b));
        t[3] += now_us() - a;
        a = now_us();
        CHECK(gpubuf_delete(c, name));
        t[4] += now_us() - a;
        ops += 6;
        ops_done(6);
    }
    if (write(fd, &ops, sizeof(ops)) != sizeof(ops))
        _exit(2);
    if (idx == 0 && ops) {
        /* Where this worker's time went, and whether its buffers share the
         * slab of its kept one (no slab import per allocation). */
        gpubuf_buffer *b;
        gpubuf_buffer_info ik, ib;
        double it = (double)ops / 6;
        snprintf(name, sizeof(name), "mix/%d/last", idx);
        CHECK(gpubuf_alloc(c, g_pool, 64 << 10, name, &b));
        snprintf(name, sizeof(name), "mix/%d/keep", idx);
        CHECK(gpubuf_stat(c, name, &ik));
        snprintf(name, sizeof(name), "mix/%d/last", idx);
        CHECK(gpubuf_stat(c, name, &ib));
        printf("throughput_worker0_alloc_us %.1f\nthroughput_worker0_open_us %.1f\n"
               "throughput_worker0_release2_us %.1f\nthroughput_worker0_delete_us %.1f\n"
               "throughput_worker0_same_slab_as_kept %d\n",
               t[1] / it, t[2] / it, t[3] / it, t[4] / it, ik.slab_id == ib.slab_id);
        gpubuf_release(b);
    }
    gpubuf_release(keep);
    gpubuf_disconnect(c);
}

int throughput_phase(void) {
    printf("%s_%dproc %.0f\n", MIXED_RATE_KEY, g_procs, workers_ops_per_s(mixed_worker));
    return 0;
}
