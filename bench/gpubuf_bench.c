/* gpubuf benchmarks. Talks to a running gpubufd (started by bench/run.sh)
 * and prints one "name value" line per figure, for bench/report.py.
 *
 *   gpubuf_bench --socket PATH [--pool NAME] [--cold-pool NAME] [--procs N]
 *                [--only latency,cold,throughput,bandwidth,peer,crash,scale] [--quick]
 *                [--daemon-pid PID] [--ctl PATH-TO-GPUBUFCTL]
 *
 * The parent process never initialises CUDA: every measurement runs in a
 * forked child, since a CUDA context does not survive fork(). */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_driver.h"
#include "gpubuf/gpubuf.h"
#include "pattern.h"
#include "testutil.h"
#include "util.h"

static const char *g_sock;
static const char *g_pool = "gpu0";
static const char *g_cold_pool = "cold";
static int g_quick;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *name, double *v, int n) {
    qsort(v, (size_t)n, sizeof(*v), cmpd);
    printf("%s_median_us %.2f\n%s_p99_us %.2f\n", name, v[n / 2], name, v[(int)(0.99 * (n - 1))]);
}

#define CHECK(x)                                                                               \
    do {                                                                                       \
        int r_ = (x);                                                                          \
        if (r_ < 0) {                                                                          \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #x,                     \
                    gpubuf_strerror(r_), gpubuf_last_error_message());                          \
            _exit(1);                                                                          \
        }                                                                                      \
    } while (0)

static gpubuf_client *conn(void) {
    gpubuf_client *c;
    CHECK(gpubuf_connect(g_sock, &c));
    return c;
}

static int run_child(void (*fn)(void)) {
    double t0 = now_us();
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        fn();
        fflush(NULL);
        _exit(0);
    }
    int st;
    waitpid(p, &st, 0);
    fprintf(stderr, "bench: phase took %.1f s\n", (now_us() - t0) / 1e6);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

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
    gpubuf_release(keep);
    gpubuf_disconnect(c);
}

/* cold open: first buffer of a slab this process has not mapped. The cold
 * pool has 2 MiB slabs and every buffer fills one. */
static void cold_setup(void) {
    gpubuf_client *c = conn();
    char name[64];
    for (int i = 0; i < 220; i++) {
        gpubuf_buffer *b;
        snprintf(name, sizeof(name), "cold/%d", i);
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
    char name[64];
    for (int i = 0; i < 220; i++) {
        snprintf(name, sizeof(name), "cold/%d", i);
        double a = now_us();
        CHECK(gpubuf_open(c, name, 0, &b[i]));
        t[i] = now_us() - a;
    }
    report("gpubuf_open_cold_2MiB_slab", t + 20, 200);
    for (int i = 0; i < 220; i++)
        gpubuf_release(b[i]);
    gpubuf_disconnect(c);
}

/* Throughput: nproc processes, each a loop of alloc, seal, open, release,
 * release, delete (6 operations) for `secs` seconds. */
static int g_procs = 16;
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

static void throughput(void) {
    int p[2], ready[2], go[2];
    double secs = g_quick ? 1.0 : 3.0;
    if (pipe(p) < 0 || pipe(ready) < 0 || pipe(go) < 0)
        _exit(1);
    fflush(NULL);
    pid_t *kids = calloc((size_t)g_procs, sizeof(*kids));
    for (int i = 0; i < g_procs; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            mixed_worker(i, secs, p[1], ready[1], go[0]);
            _exit(0);
        }
    }
    /* Without our copy of the write end, a read sees EOF if workers die. */
    close(ready[1]);
    for (int i = 0; i < g_procs; i++) {
        char ch;
        if (read(ready[0], &ch, 1) != 1) {
            fprintf(stderr, "throughput: a worker died before starting\n");
            _exit(1);
        }
    }
    for (int i = 0; i < g_procs; i++)
        if (write(go[1], "g", 1) != 1)
            _exit(1);
    long total = 0;
    for (int i = 0; i < g_procs; i++) {
        long ops;
        if (read(p[0], &ops, sizeof(ops)) == sizeof(ops))
            total += ops;
        waitpid(kids[i], NULL, 0);
    }
    printf("gpubuf_mixed_ops_per_s_%dproc %.0f\n", g_procs, (double)total / secs);
}

#ifdef GPUBUF_HAVE_CUDA
/* Median rate of 10 timed 1-copy runs (after 2 warm-ups) of n bytes from src
 * to dst in the current context, in GB/s of n * factor bytes. */
static double copy_gbps(const gpubuf_cuda *cu, CUdeviceptr dst, CUdeviceptr src, uint64_t n,
                        double factor) {
    CUevent e0, e1;
    double bw[10];
    if (cu->EventCreate(&e0, 0) || cu->EventCreate(&e1, 0))
        _exit(3);
    for (int rep = 0; rep < 12; rep++) {
        float ms;
        cu->EventRecord(e0, NULL);
        cu->MemcpyDtoDAsync(dst, src, n, NULL);
        cu->EventRecord(e1, NULL);
        if (cu->EventSynchronize(e1) != CUDA_SUCCESS)
            _exit(4);
        cu->EventElapsedTime(&ms, e0, e1);
        if (rep >= 2)
            bw[rep - 2] = factor * (double)n / (ms / 1e3) / 1e9;
    }
    cu->EventDestroy(e0);
    cu->EventDestroy(e1);
    qsort(bw, 10, sizeof(double), cmpd);
    return bw[5];
}

static CUcontext use_device(const gpubuf_cuda *cu, int ordinal) {
    CUdevice dev;
    CUcontext ctx;
    if (cu->DeviceGet(&dev, ordinal) || cu->DevicePrimaryCtxRetain(&ctx, dev) ||
        cu->CtxSetCurrent(ctx))
        _exit(3);
    return ctx;
}

/* On `device`: copy b's n bytes into a local buffer, then a local source of
 * the same size, and print both median rates (n * factor bytes per second)
 * as view_key and local_key. */
static void view_vs_local(const gpubuf_buffer *b, int device, uint64_t n, double factor,
                          const char *view_key, const char *local_key) {
    const gpubuf_cuda *cu;
    CUdeviceptr dst, src_local;
    CHECK(gpubuf_cuda_load(&cu));
    use_device(cu, device);
    if (cu->MemAlloc(&dst, n) || cu->MemAlloc(&src_local, n))
        _exit(3);
    cu->MemsetD32(src_local, 7, n / 4);
    printf("%s %.1f\n", view_key,
           copy_gbps(cu, dst, (CUdeviceptr)gpubuf_buffer_device_ptr(b), n, factor));
    printf("%s %.1f\n", local_key, copy_gbps(cu, dst, src_local, n, factor));
    cu->MemFree(dst);
    cu->MemFree(src_local);
}

/* Device-to-device copy bandwidth: source a gpubuf view vs a local cuMemAlloc
 * (bytes read + written per second, like the anchor). */
static void bandwidth(void) {
    const uint64_t big = 1ull << 30;
    gpubuf_client *c = conn();
    gpubuf_buffer *b;
    CHECK(gpubuf_alloc(c, g_pool, big, "bench/bw", &b));
    CHECK(gpubuf_pattern_fill_device(gpubuf_buffer_device(b), gpubuf_buffer_device_ptr(b), big, 1));
    view_vs_local(b, gpubuf_buffer_device(b), big, 2.0, "dtod_GBps_gpubuf_view_median",
                  "dtod_GBps_local_median");
    gpubuf_release(b);
    gpubuf_delete(c, "bench/bw");
    gpubuf_disconnect(c);
}

/* Peer access: a 1 GiB buffer written on GPU 0 (in a process of its own),
 * read by GPU 1 through a view mapped there with gpubuf_set_device(1), next
 * to a copy local to GPU 1. Rates are bytes copied per second. */
static void peer_setup(void) {
    const uint64_t big = 1ull << 30;
    gpubuf_client *c = conn();
    gpubuf_buffer *b;
    CHECK(gpubuf_alloc(c, g_pool, big, "bench/peer", &b));
    CHECK(gpubuf_pattern_fill_device(gpubuf_buffer_device(b), gpubuf_buffer_device_ptr(b), big, 3));
    CHECK(gpubuf_seal_sync(b));
    printf("peer_buffer_device %d\n", gpubuf_buffer_device(b));
    gpubuf_disconnect(c);
}

static void peer_copy(void) {
    const uint64_t big = 1ull << 30;
    gpubuf_client *c = conn();
    gpubuf_buffer *b;
    uint64_t bad = 1;
    CHECK(gpubuf_set_device(c, 1));
    double t0 = now_us();
    CHECK(gpubuf_open(c, "bench/peer", 0, &b));
    printf("peer_open_first_us %.1f\n", now_us() - t0);
    printf("peer_view_device %d\npeer_view_memory_device %d\n", gpubuf_buffer_device(b),
           gpubuf_buffer_memory_device(b));
    CHECK(gpubuf_pattern_verify_device(1, gpubuf_buffer_device_ptr(b), big, 3, &bad));
    printf("peer_verify_mismatches %llu\n", (unsigned long long)bad);
    view_vs_local(b, 1, big, 1.0, "peer_copy_GBps_gpu1_reads_gpubuf_view_on_gpu0_median",
                  "peer_copy_GBps_gpu1_local_median");
    gpubuf_release(b);
    CHECK(gpubuf_delete(c, "bench/peer"));
    gpubuf_disconnect(c);
}
#endif

/* Crash cleanup: a client holding a reference is SIGKILLed; how long until
 * the daemon shows the reference gone, measured from the moment its socket
 * is closed (waitpid returns after the kernel has closed the process' fds). */
static void crash_setup(void) {
    gpubuf_client *c = conn();
    gpubuf_buffer *b;
    CHECK(gpubuf_alloc(c, g_pool, 4096, "bench/crash", &b));
    CHECK(gpubuf_seal_sync(b));
    gpubuf_disconnect(c);
}

static void crash_cleanup(void) {
    enum { N = 30 };
    double t[N];
    /* This process only asks for status: it never maps (or initialises
     * CUDA), so the children it forks can. */
    gpubuf_client *c = conn();
    gpubuf_buffer_info info;
    for (int i = 0; i < N; i++) {
        int p[2];
        if (pipe(p) < 0)
            _exit(1);
        fflush(NULL);
        pid_t k = fork();
        if (k == 0) {
            gpubuf_client *x = conn();
            gpubuf_buffer *o;
            CHECK(gpubuf_open(x, "bench/crash", 0, &o));
            if (write(p[1], "r", 1) != 1)
                _exit(1);
            pause();
            _exit(0);
        }
        char ch;
        if (read(p[0], &ch, 1) != 1)
            _exit(1);
        close(p[0]);
        close(p[1]);
        kill(k, SIGKILL);
        waitpid(k, NULL, 0);
        double a = now_us();
        for (;;) {
            CHECK(gpubuf_stat(c, "bench/crash", &info));
            if (info.refs == 0)
                break;
        }
        t[i] = now_us() - a;
    }
    report("crash_cleanup_after_close", t, N);
    gpubuf_delete(c, "bench/crash");
    gpubuf_disconnect(c);
}

/* Scale: op latency with 10 live buffers vs 100k, with 1000 clients
 * connected; status --json time is measured by run.sh. */
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

/* Hold `n` raw idle connections (with handshake) in one process. */
static pid_t hold_clients(int n) {
    int p[2];
    if (pipe(p) < 0)
        return -1;
    fflush(NULL);
    pid_t k = fork();
    if (k == 0) {
        struct rlimit rl = {(rlim_t)n + 64, (rlim_t)n + 64};
        setrlimit(RLIMIT_NOFILE, &rl);
        for (int i = 0; i < n; i++) {
            gpubuf_client *c;
            if (gpubuf_connect(g_sock, &c) < 0)
                _exit(1);
        }
        if (write(p[1], "r", 1) != 1)
            _exit(1);
        pause();
        _exit(0);
    }
    char ch;
    if (read(p[0], &ch, 1) != 1)
        return -1;
    close(p[0]);
    close(p[1]);
    return k;
}

static int g_daemon_pid;
static const char *g_ctl;

static long daemon_rss_kib(void) {
    return tu_rss_kib(g_daemon_pid);
}

/* Wall time of `gpubufctl --json status` (fork, exec, connect, status,
 * JSON out), output discarded. */
static void status_json_time(void) {
    double t[11];
    if (!g_ctl)
        return;
    for (int i = 0; i < 11; i++) {
        double a = now_us();
        fflush(NULL);
        pid_t k = fork();
        if (k == 0) {
            if (!freopen("/dev/null", "w", stdout))
                _exit(1);
            execl(g_ctl, g_ctl, "--socket", g_sock, "--json", "status", (char *)NULL);
            _exit(127);
        }
        int st;
        waitpid(k, &st, 0);
        t[i] = now_us() - a;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "gpubufctl failed\n");
            return;
        }
    }
    qsort(t, 11, sizeof(double), cmpd);
    printf("scale_status_json_ms_median %.2f\n", t[5] / 1000.0);
}

int main(int argc, char **argv) {
    static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                         {"pool", required_argument, NULL, 'p'},
                                         {"cold-pool", required_argument, NULL, 'c'},
                                         {"procs", required_argument, NULL, 'n'},
                                         {"only", required_argument, NULL, 'o'},
                                         {"quick", no_argument, NULL, 'q'},
                                         {"daemon-pid", required_argument, NULL, 'P'},
                                         {"ctl", required_argument, NULL, 'C'},
                                         {NULL, 0, NULL, 0}};
    const char *only = "latency,cold,throughput,bandwidth,crash,scale";
    int opt;
    while ((opt = getopt_long(argc, argv, "s:p:c:n:o:q", opts, NULL)) != -1) {
        switch (opt) {
        case 's': g_sock = optarg; break;
        case 'p': g_pool = optarg; break;
        case 'c': g_cold_pool = optarg; break;
        case 'n': g_procs = atoi(optarg); break;
        case 'o': only = optarg; break;
        case 'q': g_quick = 1; break;
        case 'P': g_daemon_pid = atoi(optarg); break;
        case 'C': g_ctl = optarg; break;
        default: return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (strstr(only, "latency") && run_child(latency))
        return 1;
    if (strstr(only, "cold") && (run_child(cold_setup) || run_child(cold_open)))
        return 1;
    if (strstr(only, "throughput"))
        throughput();
#ifdef GPUBUF_HAVE_CUDA
    if (strstr(only, "bandwidth") && run_child(bandwidth))
        return 1;
    if (strstr(only, "peer") && (run_child(peer_setup) || run_child(peer_copy)))
        return 1;
#endif
    if (strstr(only, "crash") && (run_child(crash_setup) || run_child(crash_cleanup)))
        return 1;
    if (strstr(only, "scale")) {
        if (run_child(fill_10) || run_child(op_latency_10))
            return 1;
        long rss0 = daemon_rss_kib();
        if (run_child(fill_100k))
            return 1;
        long rss1 = daemon_rss_kib();
        printf("scale_daemon_rss_per_live_buffer_bytes %.1f\n",
               (double)(rss1 - rss0) * 1024.0 / 100000.0);
        pid_t holder = hold_clients(1000);
        if (holder < 0)
            return 1;
        printf("scale_clients_connected 1000\n");
        int r = run_child(op_latency_100k);
        status_json_time();
        printf("scale_daemon_rss_total_kib %ld\n", daemon_rss_kib());
        kill(holder, SIGKILL);
        waitpid(holder, NULL, 0);
        if (r)
            return 1;
    }
    return 0;
}
