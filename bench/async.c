/* async: requests for event loops (issue 23). An asynchronous open
 * (gpubuf_open_start, poll, gpubuf_dispatch) against the synchronous one;
 * 10,000 waiting opens on one connection completed after their seals; and,
 * as phase waitmem, the daemon's memory per waiting open. */
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>

#include "bench.h"

static int g_done;
static gpubuf_buffer *g_last; /* the latency loop releases it outside the timing */
static gpubuf_buffer **g_views; /* the waits keep their views until the timing ends */

static void on_done(gpubuf_client *c, const gpubuf_completion *d) {
    (void)c;
    if (d->result < 0) {
        fprintf(stderr, "async: %s\n", d->message);
        _exit(1);
    }
    if (g_views)
        g_views[g_done] = d->view;
    else if (g_last == (gpubuf_buffer *)1)
        g_last = d->view;
    else
        gpubuf_release(d->view);
    g_done++;
}

/* Dispatch until g_done reaches want. */
static void wait_done(gpubuf_client *c, int want) {
    struct pollfd p = {.fd = gpubuf_client_fd(c), .events = POLLIN};
    while (g_done < want) {
        if (poll(&p, 1, 30000) != 1) {
            fprintf(stderr, "async: no completion for 30 s\n");
            _exit(1);
        }
        CHECK(gpubuf_dispatch(c));
    }
}

/* The sealer of the concurrent round: seals its buffers while the event
 * loop (the main thread) dispatches. */
typedef struct {
    gpubuf_client *p;
    gpubuf_buffer **made;
    int n;
} sealer;

static void *seal_all(void *arg) {
    sealer *s = arg;
    for (int i = 0; i < s->n; i++)
        CHECK(gpubuf_seal(s->made[i]));
    CHECK(gpubuf_flush(s->p));
    return NULL;
}

/* n waiting opens on c (names prefix.i); their buffers allocated by p. */
static gpubuf_buffer **wait_for(gpubuf_client *c, gpubuf_client *p, const char *prefix, int n) {
    gpubuf_lookup o = {.timeout_ms = -1};
    gpubuf_buffer **made = calloc((size_t)n, sizeof(*made));
    char name[64];
    uint64_t h;
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "%s.%d.%d", prefix, (int)getpid(), i);
        CHECK(gpubuf_open_start(c, name, 0, &o, on_done, NULL, &h));
    }
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "%s.%d.%d", prefix, (int)getpid(), i);
        CHECK(gpubuf_alloc(p, g_pool, 256, name, &made[i]));
    }
    return made;
}

static void drop_all(gpubuf_client *p, gpubuf_buffer **made, const char *prefix, int n) {
    char name[64];
    for (int i = 0; i < n; i++) {
        CHECK(gpubuf_release(made[i]));
        snprintf(name, sizeof(name), "%s.%d.%d", prefix, (int)getpid(), i);
        CHECK(gpubuf_delete(p, name));
    }
    free(made);
}

/* 10,000 waiting opens sealed by another thread while this one dispatches:
 * the event loop's usual case, where each woken answer finds the client
 * reading. Timed from the first seal to the last completion. */
static void concurrent_round(gpubuf_client *c, gpubuf_client *p, int n) {
    g_done = 0;
    gpubuf_buffer **made = wait_for(c, p, "bench/cwait", n);
    gpubuf_buffer_info info;
    gpubuf_stat(c, "bench/none", &info); /* a round trip: all of them wait now */
    g_views = calloc((size_t)n, sizeof(*g_views)); /* kept until the timing ends */
    sealer s = {.p = p, .made = made, .n = n};
    pthread_t t;
    double a = now_us();
    if (pthread_create(&t, NULL, seal_all, &s) != 0) {
        fprintf(stderr, "async: pthread_create failed\n");
        _exit(1);
    }
    wait_done(c, n);
    double end = now_us();
    pthread_join(t, NULL);
    printf("async_completions_while_sealing_per_s %.0f\n", n / ((end - a) / 1e6));
    CHECK(gpubuf_release_many(g_views, (size_t)n, NULL));
    free(g_views);
    g_views = NULL;
    drop_all(p, made, "bench/cwait", n);
}

/* The daemon's memory per waiting open (phase waitmem, run by bench/run.sh
 * against a fresh gpubufd): its RSS growth over the second half of
 * MEM_CONNS connections' waiting opens (names never sealed), the first half
 * filling what a fresh daemon's heap keeps resident unused (up to the trim
 * threshold and top pad that gpubufd sets: 12 MiB, docs/performance.md "The
 * heap's top"), so that the growth measured is the waits' own. After phases
 * that freed much (scale, meta), the freed memory stays resident and takes
 * the waits: RSS does not move. The waits end with their connections. */
static void ended(gpubuf_client *c, const gpubuf_completion *d) {
    (void)c, (void)d; /* never sealed: each ends with its connection, in error */
}

static void waiting_memory(void) {
    enum { MEM_CONNS = 8, PER_CONN = 10000 };
    gpubuf_client *cs[MEM_CONNS];
    gpubuf_lookup o = {.timeout_ms = -1};
    gpubuf_buffer_info info;
    char name[64];
    uint64_t h;
    long rss[2] = {0, 0};
    for (int k = 0; k < MEM_CONNS; k++) {
        cs[k] = conn();
        for (int i = 0; i < PER_CONN; i++) {
            snprintf(name, sizeof(name), "bench/mem.%d.%d.%d", (int)getpid(), k, i);
            CHECK(gpubuf_open_start(cs[k], name, 0, &o, ended, NULL, &h));
        }
        gpubuf_stat(cs[k], "bench/none", &info); /* a round trip: all of them wait now */
        if (k == MEM_CONNS / 2 - 1)
            rss[0] = daemon_rss_kib();
    }
    rss[1] = daemon_rss_kib();
    if (rss[0] > 0 && rss[1] > 0)
        printf("async_daemon_bytes_per_waiting_open %.0f\n",
               (double)(rss[1] - rss[0]) * 1024.0 / ((MEM_CONNS - MEM_CONNS / 2) * PER_CONN));
    for (int k = 0; k < MEM_CONNS; k++)
        gpubuf_disconnect(cs[k]);
}

static void async_bench(void) {
    enum { N = 5000, WARM = 500, LIVE = 64, WAITS = 10000 };
    int n = g_quick ? 1000 : N;
    gpubuf_client *c = conn(), *p = conn();
    double *t = calloc((size_t)n + WARM, sizeof(*t));
    gpubuf_buffer *keep[LIVE], *b;
    char name[64];
    uint64_t h;
    for (int i = 0; i < LIVE; i++) {
        snprintf(name, sizeof(name), "bench/async.%d.%d", (int)getpid(), i);
        CHECK(gpubuf_alloc(p, g_pool, 4096, name, &keep[i]));
        CHECK(gpubuf_seal_sync(keep[i]));
    }
    /* Warm open, synchronous then asynchronous, of the same sealed buffers.
     * The synchronous open the goal compares with sleeps until its reply as
     * an event loop's poll() does: on a connection that does not poll for
     * its replies first (GPUBUF_SPIN_US=0). The default connection's, which
     * does, is printed beside it. */
    setenv("GPUBUF_SPIN_US", "0", 1);
    gpubuf_client *sleeper = conn();
    unsetenv("GPUBUF_SPIN_US");
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < n + WARM; i++) {
            snprintf(name, sizeof(name), "bench/async.%d.%d", (int)getpid(), i % LIVE);
            double a = now_us();
            CHECK(gpubuf_open(k ? c : sleeper, name, 0, &b));
            t[i] = now_us() - a;
            CHECK(gpubuf_release(b));
        }
        report(k ? "async_sync_open_polling" : "async_sync_open", t + WARM, n);
    }
    gpubuf_disconnect(sleeper);
    g_done = 0;
    for (int i = 0; i < n + WARM; i++) {
        snprintf(name, sizeof(name), "bench/async.%d.%d", (int)getpid(), i % LIVE);
        g_last = (gpubuf_buffer *)1;
        double a = now_us();
        CHECK(gpubuf_open_start(c, name, 0, NULL, on_done, NULL, &h));
        wait_done(c, i + 1);
        t[i] = now_us() - a;
        CHECK(gpubuf_release(g_last));
    }
    g_last = NULL;
    report("async_open", t + WARM, n);

    /* 10,000 waiting opens, their buffers sealed by another connection;
     * timed from the last seal applied to the last completion delivered. */
    g_done = 0;
    gpubuf_lookup o = {.timeout_ms = -1};
    for (int i = 0; i < WAITS; i++) {
        snprintf(name, sizeof(name), "bench/wait.%d.%d", (int)getpid(), i);
        CHECK(gpubuf_open_start(c, name, 0, &o, on_done, NULL, &h));
    }
    gpubuf_buffer_info info;
    gpubuf_stat(c, "bench/none", &info); /* a round trip: all of them wait now */
    gpubuf_buffer **made = calloc(WAITS, sizeof(*made));
    for (int i = 0; i < WAITS; i++) {
        snprintf(name, sizeof(name), "bench/wait.%d.%d", (int)getpid(), i);
        CHECK(gpubuf_alloc(p, g_pool, 256, name, &made[i]));
    }
    g_views = calloc(WAITS, sizeof(*g_views));
    double a = now_us();
    for (int i = 0; i < WAITS; i++)
        CHECK(gpubuf_seal(made[i]));
    CHECK(gpubuf_flush(p));
    double sealed = now_us();
    wait_done(c, WAITS);
    double end = now_us();
    printf("async_seal_10k_us %.0f\n", sealed - a);
    printf("async_completions_per_s %.0f\n", WAITS / ((end - a) / 1e6));
    printf("async_completions_after_seals_per_s %.0f\n", WAITS / ((end - sealed) / 1e6));
    CHECK(gpubuf_release_many(g_views, WAITS, NULL));
    free(g_views);
    g_views = NULL;
    for (int i = 0; i < WAITS; i++) {
        CHECK(gpubuf_release(made[i]));
        snprintf(name, sizeof(name), "bench/wait.%d.%d", (int)getpid(), i);
        CHECK(gpubuf_delete(p, name));
    }
    for (int i = 0; i < LIVE; i++) {
        CHECK(gpubuf_release(keep[i]));
        snprintf(name, sizeof(name), "bench/async.%d.%d", (int)getpid(), i);
        CHECK(gpubuf_delete(p, name));
    }
    free(made);
    free(t);
    concurrent_round(c, p, WAITS);
    gpubuf_disconnect(p);
    gpubuf_disconnect(c);
}

int async_phase(void) {
    return run_child(async_bench) == 0 ? 0 : 1;
}

int waitmem_phase(void) {
    return run_child(waiting_memory) == 0 ? 0 : 1;
}
