/* scale: operation latency at 10 live buffers and at 100k with 1000 idle
 * clients connected, the daemon's memory per buffer, the time of a status. */
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include "bench.h"

/* Op latency with 10 live buffers vs 100k, with 1000 clients connected;
 * scale_phase() adds the time of `gpubufctl --json status` (--ctl). */
static void op_latency(const char *label) {
    enum { N = 2000 };
    gpubuf_client *c = conn();
    gpubuf_buffer *keep, *b;
    double t[N];
    char name[64];
    CHECK(gpubuf_alloc(c, g_pool, 4096, "scale/keep", &keep));
    CHECK(gpubuf_seal(keep));
    for (int i = 0; i < N; i++) {
        snprintf(name, sizeof(name), "scale/op/%d", i);
        double a = now_us();
        CHECK(gpubuf_alloc(c, g_pool, 4096, name, &b));
        CHECK(gpubuf_seal(b));
        gpubuf_buffer *o;
        CHECK(gpubuf_open(c, name, 0, &o));
        CHECK(gpubuf_release(o));
        CHECK(gpubuf_release(b));
        CHECK(gpubuf_delete(c, name));
        t[i] = (now_us() - a) / 6.0;
    }
    char n2[96];
    snprintf(n2, sizeof(n2), "scale_op_%s", label);
    report(n2, t + 200, N - 200);
    gpubuf_release(keep);
    CHECK(gpubuf_delete(c, "scale/keep"));
    gpubuf_disconnect(c);
}

static void op_latency_10(void) {
    op_latency("at_10_buffers");
}

static void op_latency_100k(void) {
    op_latency("at_100k_buffers");
}

/* n named 4 KiB buffers, prefix/0 ... prefix/(n-1), sealed and released.
 * Views are kept until the end so that each slab is imported once. */
static void fill(int n, const char *prefix) {
    gpubuf_client *c = conn();
    gpubuf_buffer **b = calloc((size_t)n, sizeof(*b));
    char name[64];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "%s/%d", prefix, i);
        CHECK(gpubuf_alloc(c, g_pool, 4096, name, &b[i]));
        CHECK(gpubuf_seal(b[i]));
    }
    for (int i = 0; i < n; i++)
        CHECK(gpubuf_release(b[i]));
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
    free(b);
}

static void fill_100k(void) {
    fill(100000, "scale");
}

static void fill_10(void) {
    fill(10, "small");
}

/* The phases after this one (meta's status "at 100k buffers", the
 * batches) measure a daemon without this phase's buffers. */
static void drop_all(void) {
    delete_prefix(100000, "scale");
    delete_prefix(10, "small");
}

/* A child that holds up to n idle connections; *ret_held gets how many the
 * daemon took (it refuses those beyond its max_clients, which it lowers to
 * what its fd limit carries). */
static pid_t hold_clients(int n, int *ret_held) {
    int p[2];
    if (pipe(p) < 0)
        return -1;
    fflush(NULL);
    pid_t k = fork();
    if (k == 0) {
        struct rlimit rl = {(rlim_t)n + 64, (rlim_t)n + 64};
        gpubuf_client **cs = calloc((size_t)n, sizeof(*cs));
        int held = 0;
        close(p[0]);
        setrlimit(RLIMIT_NOFILE, &rl);
        for (; cs && held < n; held++) {
            if (gpubuf_connect(g_sock, &cs[held]) < 0) {
                /* At the daemon's limit: leave room for the phase's own. */
                fprintf(stderr, "bench: the daemon takes %d connections: %s\n", held,
                        gpubuf_last_error_message());
                for (int j = 0; j < 8 && held > 0; j++)
                    gpubuf_disconnect(cs[--held]);
                break;
            }
        }
        if (write(p[1], &held, sizeof(held)) != sizeof(held))
            _exit(1);
        pause();
        _exit(0);
    }
    close(p[1]);
    int held = -1;
    if (read(p[0], &held, sizeof(held)) != sizeof(held))
        held = -1;
    close(p[0]);
    if (held < 0) {
        kill(k, SIGKILL);
        waitpid(k, NULL, 0);
        return -1;
    }
    *ret_held = held;
    return k;
}

int scale_phase(void) {
    if (run_child(fill_10) || run_child(op_latency_10))
        return 1;
    long rss0 = daemon_rss_kib();
    if (run_child(fill_100k))
        return 1;
    long rss1 = daemon_rss_kib();
    printf("scale_daemon_rss_per_live_buffer_bytes %.1f\n",
           (double)(rss1 - rss0) * 1024.0 / 100000.0);
    int held = 0;
    pid_t holder = hold_clients(1000, &held);
    if (holder < 0)
        return 1;
    printf("scale_clients_connected %d\n", held);
    int r = run_child(op_latency_100k);
    ctl_json_time("scale_status_json_ms_median");
    printf("scale_daemon_rss_total_kib %ld\n", daemon_rss_kib());
    kill(holder, SIGKILL);
    waitpid(holder, NULL, 0);
    if (!r)
        r = run_child(drop_all);
    return r ? 1 : 0;
}
