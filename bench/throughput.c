/* throughput: g_procs processes doing alloc, seal, open, release and
 * delete as fast as they can. */
#include "bench.h"

#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

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

/* The 16-client echo floor's rate (bench/anchors/echo_floor), or 0 when it
 * fails (said on stderr). */
static double echo_floor_rate(void) {
    char cmd[4200], line[512];
    double rate = 0;
    if (strchr(g_echo_floor, '\'')) {
        fprintf(stderr, "bench: --echo-floor %s: a path with a quote is not run\n", g_echo_floor);
        return 0;
    }
    snprintf(cmd, sizeof(cmd), "'%s' 16 5000 64", g_echo_floor);
    FILE *p = popen(cmd, "r");
    if (!p) {
        fprintf(stderr, "bench: %s: %s\n", g_echo_floor, strerror(errno));
        return 0;
    }
    while (fgets(line, sizeof(line), p)) {
        const char *k = strstr(line, "aggregate_roundtrips_per_s ");
        if (k)
            rate = strtod(k + strlen("aggregate_roundtrips_per_s "), NULL);
    }
    if (pclose(p) != 0 || rate <= 0) {
        fprintf(stderr, "bench: %s gave no rate\n", g_echo_floor);
        return 0;
    }
    return rate;
}

/* With --echo-floor (and not in the journal's slices), the echo floor of
 * 16 clients right before and right after the mixed requests: the machine's
 * speed moves within a run (docs/performance.md, run AB: 328k round trips/s
 * at the run's start, the daemon's own rate 245k here and 290k in its pairs
 * later), and the goal compares the two. */
int throughput_phase(void) {
    bool beside = g_echo_floor && !g_plan;
    double before = beside ? echo_floor_rate() : 0;
    printf("%s_%dproc %.0f\n", MIXED_RATE_KEY, g_procs, workers_ops_per_s(mixed_worker));
    double after = beside ? echo_floor_rate() : 0;
    if (before > 0 && after > 0)
        printf("mixed_echo_floor_16_before_per_s %.0f\nmixed_echo_floor_16_after_per_s %.0f\n"
               "mixed_echo_floor_16_beside_per_s %.0f\n",
               before, after, (before + after) / 2);
    return 0;
}
