/* gpubuf benchmarks. Talks to a running gpubufd (started by bench/run.sh)
 * and prints one "name value" line per figure, for bench/report.py.
 *
 *   gpubuf_bench --socket PATH [--pool NAME] [--cold-pool NAME] [--procs N]
 *                [--only latency,cold,throughput,bandwidth,peer,crash,scale,
 *                        vmm-cold,vmm-warm,seal-stream,handover,copies,meta] [--quick]
 *                [--vmm-pool NAME] [--vmm-cold-pools NAME,NAME]
 *                [--daemon-pid PID] [--ctl PATH-TO-GPUBUFCTL]
 *
 * --only takes a comma-separated list of phases; "vmm" stands for the five
 * phases of cuda-vmm pools, read-only opens, stream order and copies
 * (vmm-cold,vmm-warm,seal-stream,handover,copies). --pool names the cuda-ipc
 * pool those phases compare against.
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
#ifdef GPUBUF_HAVE_CUDA
#include <dlfcn.h>
#endif

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

/* Names are per pool: the phases on --pool open their buffers by plain
 * names, which the daemon looks up in its default (first) pool; the other
 * pools' phases use /POOL/NAME. 0, or -1 with a message. */
static int check_default_pool(void) {
    gpubuf_client *c = conn();
    gpubuf_status *s;
    CHECK(gpubuf_status_get(c, &s));
    int r = 0;
    if (s->default_pool[0] && strcmp(s->default_pool, g_pool) != 0) {
        fprintf(stderr,
                "bench: --pool %s is not the daemon's default pool '%s': give that pool first "
                "to gpubufd, or --pool %s\n",
                g_pool, s->default_pool, s->default_pool);
        r = -1;
    }
    gpubuf_status_free(s);
    gpubuf_disconnect(c);
    return r;
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

/* Run worker(i, secs, ...) in g_procs processes that start together; the
 * sum of the operation counts they report. */
typedef void (*worker_fn)(int idx, double secs, int fd, int ready_fd, int go_fd);

static long run_workers(worker_fn worker, double secs) {
    int p[2], ready[2], go[2];
    if (pipe(p) < 0 || pipe(ready) < 0 || pipe(go) < 0)
        _exit(1);
    fflush(NULL);
    pid_t *kids = calloc((size_t)g_procs, sizeof(*kids));
    for (int i = 0; i < g_procs; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            worker(i, secs, p[1], ready[1], go[0]);
            _exit(0);
        }
    }
    /* Without our copy of the write end, a read sees EOF if workers die. */
    close(ready[1]);
    for (int i = 0; i < g_procs; i++) {
        char ch;
        if (read(ready[0], &ch, 1) != 1) {
            fprintf(stderr, "bench: a worker died before starting\n");
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
    free(kids);
    close(p[0]);
    close(p[1]);
    close(ready[0]);
    close(go[0]);
    close(go[1]);
    return total;
}

static void throughput(void) {
    double secs = g_quick ? 1.0 : 3.0;
    long total = run_workers(mixed_worker, secs);
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

/* Whether --only names phase: a comma-separated list of phase names, where
 * "vmm" stands for all the phases of vmm_phases(). */
static const char *g_only = "latency,cold,throughput,bandwidth,crash,scale";

static int want(const char *phase) {
    static const char *const vmm[] = {"vmm-cold", "vmm-warm", "seal-stream", "handover", "copies"};
    size_t len = strlen(phase);
    for (const char *p = g_only; *p;) {
        size_t n = strcspn(p, ",");
        if (n == len && strncmp(p, phase, n) == 0)
            return 1;
        if (n == 3 && strncmp(p, "vmm", 3) == 0)
            for (size_t i = 0; i < sizeof(vmm) / sizeof(vmm[0]); i++)
                if (strcmp(vmm[i], phase) == 0)
                    return 1;
        p += n;
        if (*p == ',')
            p++;
    }
    return 0;
}

/* ---- cuda-vmm pools, read-only opens, stream order, copies --------------- */

static const char *g_vmm_pool = "vmm";
static const char *g_vmm_cold_pools = "vmmcold,vmmcold64";
/* The pool the running phase works on, and its label in the output. */
static const char *g_phase_pool;
static const char *g_phase_label;

/* Warm-up and measured counts of one cold-open series, per variant. */
static void cold_counts(uint64_t slab, int *warm, int *measured) {
    int small = slab <= (8ull << 20);
    *warm = small ? 20 : 4;
    *measured = small ? (g_quick ? 50 : 200) : (g_quick ? 10 : 40);
}

/* Open number i of a series is read-only when this is 1: pairs (2k, 2k+1)
 * take turns at going first, so neither kind always follows the other. */
static int ro_turn(int i) {
    return (i & 1) ^ ((i >> 1) & 1);
}

/* Slab size of a pool, from the daemon's status; exits unless the pool
 * exists and is of the expected kind. */
static uint64_t pool_slab(gpubuf_client *c, const char *pool, gpubuf_pool_kind kind) {
    gpubuf_status *s;
    uint64_t slab = 0;
    int found = 0;
    CHECK(gpubuf_status_get(c, &s));
    for (size_t i = 0; i < s->n_pools; i++) {
        if (strcmp(s->pools[i].name, pool) == 0) {
            found = s->pools[i].kind == kind ? 1 : -1;
            slab = s->pools[i].slab_size;
        }
    }
    gpubuf_status_free(s);
    if (found != 1) {
        fprintf(stderr, "bench: pool '%s' %s\n", pool,
                found ? "is not of the kind this phase needs" : "does not exist");
        _exit(1);
    }
    return slab;
}

#ifdef GPUBUF_HAVE_CUDA
#define CU(g, x)                                                                               \
    do {                                                                                       \
        CUresult r_ = (g)->cu->x;                                                              \
        if (r_ != CUDA_SUCCESS) {                                                              \
            char why_[256];                                                                    \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__,                                 \
                    gpubuf_cuda_describe(r_, #x, why_, sizeof(why_)));                         \
            _exit(1);                                                                          \
        }                                                                                      \
    } while (0)

/* Two kernels of one thread: bench_stamp_end spins for p_ns nanoseconds of
 * %globaltimer, then writes %globaltimer to *p_out as its last act (the
 * producer); bench_stamp writes %globaltimer to *p_out at once (the
 * consumer). %globaltimer is one clock for every context of a GPU.
 * bench/anchors/torch_event_bench.py launches the same PTX. */
static const char stamp_ptx[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry bench_stamp_end(.param .u64 p_out, .param .u64 p_ns)\n"
    "{\n"
    "  .reg .pred %p;\n"
    "  .reg .b64 %rd<8>;\n"
    "  ld.param.u64 %rd1, [p_out];\n"
    "  ld.param.u64 %rd2, [p_ns];\n"
    "  cvta.to.global.u64 %rd1, %rd1;\n"
    "  mov.u64 %rd3, %globaltimer;\n"
    "SPIN:\n"
    "  mov.u64 %rd4, %globaltimer;\n"
    "  sub.u64 %rd5, %rd4, %rd3;\n"
    "  setp.lt.u64 %p, %rd5, %rd2;\n"
    "  @%p bra SPIN;\n"
    "  mov.u64 %rd6, %globaltimer;\n"
    "  st.global.u64 [%rd1], %rd6;\n"
    "  ret;\n"
    "}\n"
    "\n"
    ".visible .entry bench_stamp(.param .u64 p_out)\n"
    "{\n"
    "  .reg .b64 %rd<4>;\n"
    "  ld.param.u64 %rd1, [p_out];\n"
    "  cvta.to.global.u64 %rd1, %rd1;\n"
    "  mov.u64 %rd2, %globaltimer;\n"
    "  st.global.u64 [%rd1], %rd2;\n"
    "  ret;\n"
    "}\n";

/* One GPU as a phase uses it: the primary context of device 0 (where
 * bench/run.sh puts every pool), current on this thread for the rest of the
 * process, a non-blocking stream, and the stamp kernels when asked. */
typedef struct bench_gpu {
    const gpubuf_cuda *cu;
    CUdevice dev;
    CUcontext ctx;
    CUstream st;
    CUmodule mod;
    CUfunction stamp_end, stamp;
} bench_gpu;

static void gpu_open(bench_gpu *g, int kernels) {
    memset(g, 0, sizeof(*g));
    if (gpubuf_cuda_load(&g->cu) < 0) {
        fprintf(stderr, "bench: %s\n", gpubuf_cuda_load_error());
        _exit(1);
    }
    CU(g, DeviceGet(&g->dev, 0));
    CU(g, DevicePrimaryCtxRetain(&g->ctx, g->dev));
    CU(g, CtxPushCurrent(g->ctx));
    CU(g, StreamCreate(&g->st, CU_STREAM_NON_BLOCKING));
    if (kernels) {
        CU(g, ModuleLoadData(&g->mod, stamp_ptx));
        CU(g, ModuleGetFunction(&g->stamp_end, g->mod, "bench_stamp_end"));
        CU(g, ModuleGetFunction(&g->stamp, g->mod, "bench_stamp"));
    }
}

/* The phases below map every buffer on device 0: say so if a pool lives
 * elsewhere instead of measuring the wrong thing. */
static void expect_device0(const gpubuf_buffer *b) {
    if (gpubuf_buffer_device(b) != 0) {
        fprintf(stderr, "bench: buffer '%s' is mapped on device %d; these phases need device 0\n",
                gpubuf_buffer_name(b), gpubuf_buffer_device(b));
        _exit(1);
    }
}

/* An entry point the driver table of common/cuda_driver.h does not have,
 * resolved like the table's (cuGetProcAddress, CUDA 12.0 ABI). */
static void *driver_symbol(const char *sym) {
    typedef CUresult (*get_proc_fn)(const char *, void **, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult *);
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    get_proc_fn gp = lib ? (get_proc_fn)dlsym(lib, "cuGetProcAddress_v2") : NULL;
    CUdriverProcAddressQueryResult q = CU_GET_PROC_ADDRESS_SUCCESS;
    void *fn = NULL;
    if (!gp || gp(sym, &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &q) != CUDA_SUCCESS ||
        q != CU_GET_PROC_ADDRESS_SUCCESS || !fn) {
        fprintf(stderr, "bench: cannot resolve %s in libcuda.so.1\n", sym);
        _exit(1);
    }
    return fn;
}
#endif

/* Cold open of cuda-vmm slabs: every buffer fills one slab of its pool, so
 * each open imports, reserves, maps and sets access for a slab this process
 * has not mapped. Opens alternate between read-write and read-only
 * (GPUBUF_OPEN_READONLY) in one process, on distinct slabs. */
static void vmm_cold_setup(void) {
    gpubuf_client *c = conn();
    uint64_t slab = pool_slab(c, g_phase_pool, GPUBUF_POOL_CUDA_VMM);
    int warm, measured;
    char name[128];
    cold_counts(slab, &warm, &measured);
    for (int i = 0; i < 2 * (warm + measured); i++) {
        gpubuf_buffer *b;
        snprintf(name, sizeof(name), "/%s/vcold/%d", g_phase_pool, i);
        CHECK(gpubuf_alloc(c, g_phase_pool, slab, name, &b));
        CHECK(gpubuf_seal(b));
        CHECK(gpubuf_release(b));
    }
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
}

static void vmm_cold_open(void) {
    gpubuf_client *c = conn();
    uint64_t slab = pool_slab(c, g_phase_pool, GPUBUF_POOL_CUDA_VMM);
    int warm, measured, nrw = 0, nro = 0;
    cold_counts(slab, &warm, &measured);
    int n = 2 * (warm + measured);
    gpubuf_buffer **b = calloc((size_t)n, sizeof(*b));
    double *rw = calloc((size_t)measured, sizeof(double));
    double *ro = calloc((size_t)measured, sizeof(double));
    char name[128], key[128];
    if (!b || !rw || !ro)
        _exit(1);
    for (int i = 0; i < n; i++) {
        int r_o = ro_turn(i);
        snprintf(name, sizeof(name), "/%s/vcold/%d", g_phase_pool, i);
        double a = now_us();
        CHECK(gpubuf_open_ex(c, name, 0, 0, r_o ? GPUBUF_OPEN_READONLY : 0, &b[i]));
        volatile uint64_t addr = gpubuf_buffer_device_ptr(b[i]);
        (void)addr;
        double t = now_us() - a;
        if (gpubuf_buffer_read_only(b[i]) != r_o) {
            fprintf(stderr, "bench: %s opened %s\n", name, r_o ? "writable" : "read-only");
            _exit(1);
        }
        if (i < 2 * warm)
            continue;
        if (r_o)
            ro[nro++] = t;
        else
            rw[nrw++] = t;
    }
    unsigned long long mib = (unsigned long long)(slab >> 20);
    snprintf(key, sizeof(key), "vmm_open_cold_%lluMiB_slab", mib);
    report(key, rw, nrw);
    snprintf(key, sizeof(key), "vmm_open_cold_ro_%lluMiB_slab", mib);
    report(key, ro, nro);
    for (int i = 0; i < n; i++) {
        CHECK(gpubuf_release(b[i]));
        snprintf(name, sizeof(name), "/%s/vcold/%d", g_phase_pool, i);
        CHECK(gpubuf_delete(c, name));
    }
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
    free(b);
    free(rw);
    free(ro);
}

/* Warm open, interleaved: a cuda-ipc pool (--pool), a cuda-vmm pool
 * (--vmm-pool) and the same cuda-vmm buffers opened read-only. The measuring
 * connection holds one view of each kind for the whole phase, so every timed
 * open finds its slab mapped (read-only mappings are separate mappings, and
 * never kept after their last view). */
enum { WARM_BUFS = 32 };

static void vmm_warm_setup(void) {
    gpubuf_client *c = conn();
    const char *pools[2] = {g_pool, g_vmm_pool};
    char name[128];
    for (int p = 0; p < 2; p++) {
        for (int i = -1; i < WARM_BUFS; i++) {
            gpubuf_buffer *b;
            if (i < 0)
                snprintf(name, sizeof(name), "/%s/vwarm/keep", pools[p]);
            else
                snprintf(name, sizeof(name), "/%s/vwarm/%d", pools[p], i);
            CHECK(gpubuf_alloc(c, pools[p], 1 << 20, name, &b));
            CHECK(gpubuf_seal(b));
            CHECK(gpubuf_release(b));
        }
    }
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
}

typedef struct warm_variant {
    const char *key, *pool;
    unsigned flags;
    gpubuf_pool_kind kind;
    gpubuf_buffer *keep;
    char names[WARM_BUFS + 1][128];
    int n;
    double *t;
} warm_variant;

/* Open the variant's kept view and list the buffers that share its slab. */
static void warm_prepare(gpubuf_client *c, warm_variant *v, int total) {
    gpubuf_buffer_info ki, bi;
    char name[128];
    snprintf(name, sizeof(name), "/%s/vwarm/keep", v->pool);
    CHECK(gpubuf_open_ex(c, name, 0, 0, v->flags, &v->keep));
    if (gpubuf_buffer_pool_kind(v->keep) != v->kind) {
        fprintf(stderr, "bench: pool '%s' is not of the kind %s needs\n", v->pool, v->key);
        _exit(1);
    }
    CHECK(gpubuf_stat(c, name, &ki));
    v->n = 0;
    for (int i = 0; i < WARM_BUFS; i++) {
        snprintf(name, sizeof(name), "/%s/vwarm/%d", v->pool, i);
        CHECK(gpubuf_stat(c, name, &bi));
        if (bi.slab_id == ki.slab_id)
            snprintf(v->names[v->n++], sizeof(v->names[0]), "%s", name);
    }
    if (v->n == 0) /* none shares it: open the kept buffer itself again */
        snprintf(v->names[v->n++], sizeof(v->names[0]), "/%s/vwarm/keep", v->pool);
    printf("%s_buffers_in_kept_slab %d\n", v->key, v->n);
    v->t = calloc((size_t)total, sizeof(double));
    if (!v->t)
        _exit(1);
}

static void vmm_warm_open(void) {
    enum { N = 3000, WARM = 300 };
    int n = g_quick ? 1000 : N;
    gpubuf_client *c = conn();
    static warm_variant v[3];
    v[0] = (warm_variant){.key = "warm_open_ipc", .pool = g_pool, .kind = GPUBUF_POOL_CUDA_IPC};
    v[1] = (warm_variant){.key = "warm_open_vmm", .pool = g_vmm_pool, .kind = GPUBUF_POOL_CUDA_VMM};
    v[2] = (warm_variant){.key = "warm_open_vmm_ro", .pool = g_vmm_pool,
                          .flags = GPUBUF_OPEN_READONLY, .kind = GPUBUF_POOL_CUDA_VMM};
    for (int k = 0; k < 3; k++)
        warm_prepare(c, &v[k], n + WARM);
    for (int i = 0; i < n + WARM; i++) {
        for (int j = 0; j < 3; j++) {
            warm_variant *w = &v[(i + j) % 3]; /* each kind takes each place in turn */
            gpubuf_buffer *b;
            double a = now_us();
            CHECK(gpubuf_open_ex(c, w->names[i % w->n], 0, 0, w->flags, &b));
            volatile uint64_t addr = gpubuf_buffer_device_ptr(b);
            (void)addr;
            w->t[i] = now_us() - a;
            CHECK(gpubuf_release(b));
        }
    }
    for (int k = 0; k < 3; k++) {
        report(v[k].key, v[k].t + WARM, n);
        CHECK(gpubuf_release(v[k].keep));
        free(v[k].t);
    }
    /* The setup's buffers, both pools. */
    for (int k = 0; k < 2; k++) {
        char name[128];
        for (int i = -1; i < WARM_BUFS; i++) {
            if (i < 0)
                snprintf(name, sizeof(name), "/%s/vwarm/keep", v[k].pool);
            else
                snprintf(name, sizeof(name), "/%s/vwarm/%d", v[k].pool, i);
            CHECK(gpubuf_delete(c, name));
        }
    }
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
}

#ifdef GPUBUF_HAVE_CUDA
/* Seal on a stream against seal after cuStreamSynchronize, for a producer
 * whose kernel (a spin of SPIN_US, then a fill of 1 MiB) is still running:
 * the host time from the end of the launch until the producer has its
 * thread back. Both seal asynchronously (gpubuf_seal_stream, gpubuf_seal);
 * the two ways alternate, each on a fresh anonymous 1 MiB buffer. */
enum { SPIN_US = 2000 };

static void seal_stream_phase(void) {
    enum { N = 50, WARM = 5 };
    const uint64_t size = 1 << 20;
    gpubuf_client *c = conn();
    bench_gpu g;
    double ts[N], tq[N];
    int running = 0;
    char key[128];
    gpu_open(&g, 0);
    for (int i = 0; i < N + WARM; i++) {
        for (int j = 0; j < 2; j++) {
            int on_stream = (i + j) & 1;
            gpubuf_buffer *b;
            CHECK(gpubuf_alloc(c, g_phase_pool, size, NULL, &b));
            expect_device0(b);
            CHECK(gpubuf_pattern_fill_device_async(0, gpubuf_buffer_device_ptr(b), size,
                                                   (uint32_t)i, g.st, SPIN_US));
            double a = now_us(), t;
            if (on_stream) {
                CHECK(gpubuf_seal_stream(b, (gpubuf_stream)g.st));
                t = now_us() - a;
                CUresult q = g.cu->StreamQuery(g.st);
                if (q != CUDA_SUCCESS && q != CUDA_ERROR_NOT_READY)
                    CU(&g, StreamQuery(g.st));
                if (i >= WARM && q == CUDA_ERROR_NOT_READY)
                    running++;
                CU(&g, StreamSynchronize(g.st));
            } else {
                CU(&g, StreamSynchronize(g.st));
                CHECK(gpubuf_seal(b));
                t = now_us() - a;
            }
            if (i >= WARM)
                (on_stream ? ts : tq)[i - WARM] = t;
            CHECK(gpubuf_release(b));
        }
    }
    CHECK(gpubuf_flush(c));
    snprintf(key, sizeof(key), "seal_stream_%s_host", g_phase_label);
    report(key, ts, N);
    snprintf(key, sizeof(key), "seal_after_sync_%s_host", g_phase_label);
    report(key, tq, N);
    printf("seal_stream_%s_kernel_still_running %d\nseal_stream_%s_iterations %d\n"
           "seal_stream_kernel_spin_us %d\n",
           g_phase_label, running, g_phase_label, N, SPIN_US);
    gpubuf_disconnect(c);
}

/* Producer-kernel-end to consumer-kernel-start latency. The producer
 * allocates a 4 KiB buffer, waits until the consumer is about to open it,
 * launches bench_stamp_end (a spin of SPIN_US, then %globaltimer into the
 * buffer's first 8 bytes as its last act) and seals on its stream at once.
 * The consumer, waiting in gpubuf_open, makes its stream wait
 * (gpubuf_buffer_wait) and launches bench_stamp, which writes %globaltimer as
 * its first act. Latency = consumer stamp - producer stamp (one GPU, one
 * clock). The spin keeps the producer's kernel running while the consumer's
 * host side (open, event import, wait, launch) happens, so the figure is the
 * GPU-side hand-over, as in bench/anchors/torch_event_bench.py. */
enum { HANDOVERS = 200, HANDOVER_WARM = 10 };

static void handover_consumer(int n, int ready_fd, int done_fd) {
    gpubuf_client *c = conn();
    bench_gpu g;
    CUdeviceptr stamps;
    double *lat = calloc((size_t)n, sizeof(double)), *host = calloc((size_t)n, sizeof(double));
    int bad = 0;
    uint64_t prev = 0;
    char name[128], key[128];
    if (!lat || !host)
        _exit(1);
    gpu_open(&g, 1);
    CU(&g, MemAlloc(&stamps, (size_t)n * 8));
    for (int i = 0; i < n; i++) {
        gpubuf_buffer *b;
        uint64_t pend = 0, cst = 0;
        CUdeviceptr out = stamps + (CUdeviceptr)i * 8;
        void *args[] = {&out};
        snprintf(name, sizeof(name), "/%s/ho/%s/%d", g_phase_pool, g_phase_label, i);
        if (write(ready_fd, "r", 1) != 1)
            _exit(1);
        CHECK(gpubuf_open(c, name, 10000, &b));
        expect_device0(b);
        double a = now_us();
        CHECK(gpubuf_buffer_wait(b, (gpubuf_stream)g.st));
        CU(&g, LaunchKernel(g.stamp, 1, 1, 1, 1, 1, 1, 0, g.st, args, NULL));
        host[i] = now_us() - a;
        CU(&g, StreamSynchronize(g.st));
        CHECK(gpubuf_buffer_copy_to_host(b, 0, &pend, 8));
        CU(&g, MemcpyDtoH(&cst, out, 8));
        lat[i] = (double)(int64_t)(cst - pend) / 1000.0;
        /* The consumer's kernel started before the producer's ended, or the
         * producer's stamp was not there: the order did not hold. */
        if (lat[i] < 0 || pend <= prev)
            bad++;
        prev = pend;
        CHECK(gpubuf_release(b));
        if (write(done_fd, "d", 1) != 1)
            _exit(1);
    }
    snprintf(key, sizeof(key), "handover_%s", g_phase_label);
    report(key, lat + HANDOVER_WARM, n - HANDOVER_WARM);
    snprintf(key, sizeof(key), "handover_%s_consumer_wait_and_launch", g_phase_label);
    report(key, host + HANDOVER_WARM, n - HANDOVER_WARM);
    printf("handover_%s_count %d\nhandover_%s_order_violations %d\nhandover_spin_us %d\n",
           g_phase_label, n - HANDOVER_WARM, g_phase_label, bad, SPIN_US);
    gpubuf_disconnect(c);
}

static void handover_phase(void) {
    int n = g_quick ? 60 : HANDOVERS + HANDOVER_WARM, ready[2], done[2];
    char name[128], ch;
    if (pipe(ready) < 0 || pipe(done) < 0)
        _exit(1);
    /* The consumer is forked before this process initialises CUDA. */
    fflush(NULL);
    pid_t k = fork();
    if (k < 0)
        _exit(1);
    if (k == 0) {
        close(ready[0]);
        close(done[0]);
        handover_consumer(n, ready[1], done[1]);
        fflush(NULL);
        _exit(0);
    }
    close(ready[1]);
    close(done[1]);
    gpubuf_client *c = conn();
    bench_gpu g;
    uint64_t spin_ns = (uint64_t)SPIN_US * 1000;
    gpu_open(&g, 1);
    for (int i = 0; i < n; i++) {
        gpubuf_buffer *b;
        snprintf(name, sizeof(name), "/%s/ho/%s/%d", g_phase_pool, g_phase_label, i);
        CHECK(gpubuf_alloc(c, g_phase_pool, 4096, name, &b));
        expect_device0(b);
        CUdeviceptr p = (CUdeviceptr)gpubuf_buffer_device_ptr(b);
        void *args[] = {&p, &spin_ns};
        if (read(ready[0], &ch, 1) != 1) {
            fprintf(stderr, "handover: the consumer is gone\n");
            _exit(1);
        }
        CU(&g, LaunchKernel(g.stamp_end, 1, 1, 1, 1, 1, 1, 0, g.st, args, NULL));
        CHECK(gpubuf_seal_stream(b, (gpubuf_stream)g.st));
        if (read(done[0], &ch, 1) != 1) {
            fprintf(stderr, "handover: the consumer is gone\n");
            _exit(1);
        }
        CHECK(gpubuf_release(b));
        CHECK(gpubuf_delete(c, name));
    }
    CU(&g, StreamSynchronize(g.st));
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
    int st;
    waitpid(k, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "handover: the consumer failed (status %d)\n", st);
        _exit(1);
    }
}

/* Copy bandwidth through gpubuf views against the same copy between local
 * cuMemAlloc allocations, on one stream, timed with events: host<->device
 * (pinned host memory from cuMemHostAlloc) and device to device. gpubuf and
 * local copies alternate; 2 warm-ups, then the median of 10 of each.
 * Rates are bytes copied per second. */
enum { COPY_H2D, COPY_D2H, COPY_D2D };

typedef struct copy_case {
    const char *key;
    int kind;
    gpubuf_buffer *dst, *src; /* gpubuf views: dst for H2D and D2D, src for D2H and D2D */
    CUdeviceptr ldst, lsrc;   /* local allocations, the same roles */
    void *host;
    uint64_t n;
} copy_case;

static void copy_enqueue(const bench_gpu *g, const copy_case *k, int local) {
    gpubuf_stream s = (gpubuf_stream)g->st;
    switch (k->kind) {
    case COPY_H2D:
        if (local)
            CU(g, MemcpyHtoDAsync(k->ldst, k->host, (size_t)k->n, g->st));
        else
            CHECK(gpubuf_buffer_copy_from_host_async(k->dst, 0, k->host, k->n, s));
        break;
    case COPY_D2H:
        if (local)
            CU(g, MemcpyDtoHAsync(k->host, k->lsrc, (size_t)k->n, g->st));
        else
            CHECK(gpubuf_buffer_copy_to_host_async(k->src, 0, k->host, k->n, s));
        break;
    default:
        if (local)
            CU(g, MemcpyDtoDAsync(k->ldst, k->lsrc, (size_t)k->n, g->st));
        else
            CHECK(gpubuf_buffer_copy(k->dst, 0, k->src, 0, k->n, s));
        break;
    }
}

static void copy_compare(const bench_gpu *g, const copy_case *k) {
    enum { REPS = 12, WARM = 2 };
    double bw[2][REPS - WARM];
    CUevent e0, e1;
    CU(g, EventCreate(&e0, CU_EVENT_DEFAULT));
    CU(g, EventCreate(&e1, CU_EVENT_DEFAULT));
    for (int rep = 0; rep < REPS; rep++) {
        for (int j = 0; j < 2; j++) {
            int local = (rep + j) & 1;
            float ms = 0;
            CU(g, EventRecord(e0, g->st));
            copy_enqueue(g, k, local);
            CU(g, EventRecord(e1, g->st));
            CU(g, EventSynchronize(e1));
            CU(g, EventElapsedTime(&ms, e0, e1));
            if (rep >= WARM)
                bw[local][rep - WARM] = (double)k->n / (ms / 1e3) / 1e9;
        }
    }
    CU(g, EventDestroy(e0));
    CU(g, EventDestroy(e1));
    qsort(bw[0], REPS - WARM, sizeof(double), cmpd);
    qsort(bw[1], REPS - WARM, sizeof(double), cmpd);
    printf("copy_%s_gpubuf_GBps %.1f\ncopy_%s_local_GBps %.1f\n", k->key,
           bw[0][(REPS - WARM) / 2], k->key, bw[1][(REPS - WARM) / 2]);
}

static void copies_phase(void) {
    typedef CUresult (*host_alloc_fn)(void **, size_t, unsigned int);
    typedef CUresult (*free_host_fn)(void *);
    const uint64_t big = 1ull << 30, hsize = 256ull << 20;
    const uint32_t seed = 71;
    gpubuf_client *c = conn();
    gpubuf_buffer *va, *vb, *ia;
    CUdeviceptr la, lb;
    void *host = NULL;
    uint64_t bad_vmm = 1, bad_ipc = 1;
    bench_gpu g;
    gpu_open(&g, 0);
    host_alloc_fn host_alloc = (host_alloc_fn)driver_symbol("cuMemHostAlloc");
    free_host_fn free_host = (free_host_fn)driver_symbol("cuMemFreeHost");
    CHECK(gpubuf_alloc(c, g_vmm_pool, big, NULL, &va));
    CHECK(gpubuf_alloc(c, g_vmm_pool, big, NULL, &vb));
    CHECK(gpubuf_alloc(c, g_pool, big, NULL, &ia));
    expect_device0(va);
    expect_device0(vb);
    expect_device0(ia);
    if (gpubuf_buffer_pool_kind(va) != GPUBUF_POOL_CUDA_VMM ||
        gpubuf_buffer_pool_kind(ia) != GPUBUF_POOL_CUDA_IPC) {
        fprintf(stderr, "bench: copies need a cuda-vmm --vmm-pool and a cuda-ipc --pool\n");
        _exit(1);
    }
    CU(&g, MemAlloc(&la, (size_t)big));
    CU(&g, MemAlloc(&lb, (size_t)big));
    CU(&g, MemsetD32(la, 7, (size_t)(big / 4)));
    CU(&g, MemsetD32(lb, 0, (size_t)(big / 4)));
    CUresult hr = host_alloc(&host, (size_t)hsize, CU_MEMHOSTALLOC_PORTABLE);
    if (hr != CUDA_SUCCESS) {
        char why[256];
        fprintf(stderr, "bench: %s\n", gpubuf_cuda_describe(hr, "cuMemHostAlloc", why, sizeof(why)));
        _exit(1);
    }
    memset(host, 3, (size_t)hsize);
    const copy_case cases[] = {
        {.key = "h2d_vmm", .kind = COPY_H2D, .dst = va, .ldst = la, .host = host, .n = hsize},
        {.key = "d2h_vmm", .kind = COPY_D2H, .src = va, .lsrc = la, .host = host, .n = hsize},
        {.key = "h2d_ipc", .kind = COPY_H2D, .dst = ia, .ldst = la, .host = host, .n = hsize},
        {.key = "d2h_ipc", .kind = COPY_D2H, .src = ia, .lsrc = la, .host = host, .n = hsize},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        copy_compare(&g, &cases[i]);
    /* Device to device from a patterned source, checked afterwards. */
    CHECK(gpubuf_pattern_fill_device(0, gpubuf_buffer_device_ptr(va), big, seed));
    const copy_case d2d[] = {
        {.key = "d2d_vmm_to_vmm", .kind = COPY_D2D, .dst = vb, .src = va, .ldst = lb, .lsrc = la,
         .n = big},
        {.key = "d2d_vmm_to_ipc", .kind = COPY_D2D, .dst = ia, .src = va, .ldst = lb, .lsrc = la,
         .n = big},
    };
    for (size_t i = 0; i < sizeof(d2d) / sizeof(d2d[0]); i++)
        copy_compare(&g, &d2d[i]);
    CHECK(gpubuf_pattern_verify_device(0, gpubuf_buffer_device_ptr(vb), big, seed, &bad_vmm));
    CHECK(gpubuf_pattern_verify_device(0, gpubuf_buffer_device_ptr(ia), big, seed, &bad_ipc));
    printf("copy_d2d_verify_mismatches %llu\n", (unsigned long long)(bad_vmm + bad_ipc));
    CU(&g, MemFree(la));
    CU(&g, MemFree(lb));
    hr = free_host(host);
    if (hr != CUDA_SUCCESS)
        _exit(1);
    CHECK(gpubuf_release(va));
    CHECK(gpubuf_release(vb));
    CHECK(gpubuf_release(ia));
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
}
#endif

/* Runs `fn` in a child with g_phase_pool/g_phase_label set. */
static int run_on(void (*fn)(void), const char *pool, const char *label) {
    g_phase_pool = pool;
    g_phase_label = label;
    return run_child(fn);
}

/* The five phases of --only vmm, in order. A phase that fails does not stop
 * the others. Returns the number of failed phases. */
static int vmm_phases(void) {
    int failed = 0;
    if (want("vmm-cold")) {
        char *list = strdup(g_vmm_cold_pools), *save = NULL;
        if (!list)
            return 1;
        for (char *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save))
            failed += run_on(vmm_cold_setup, p, p) || run_on(vmm_cold_open, p, p);
        free(list);
    }
    if (want("vmm-warm"))
        failed += run_child(vmm_warm_setup) || run_child(vmm_warm_open);
#ifdef GPUBUF_HAVE_CUDA
    if (want("seal-stream"))
        failed += (run_on(seal_stream_phase, g_vmm_pool, "vmm") != 0) +
                  (run_on(seal_stream_phase, g_pool, "ipc") != 0);
    if (want("handover"))
        failed += (run_on(handover_phase, g_vmm_pool, "vmm") != 0) +
                  (run_on(handover_phase, g_pool, "ipc") != 0);
    if (want("copies"))
        failed += run_child(copies_phase) != 0;
#else
    if (want("seal-stream") || want("handover") || want("copies")) {
        fprintf(stderr, "bench: built without CUDA: no seal-stream, handover or copies phase\n");
        failed++;
    }
#endif
    if (failed)
        fprintf(stderr, "bench: %d of the vmm phases failed\n", failed);
    return failed;
}

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

static int g_daemon_pid;
static const char *g_ctl;

static long daemon_rss_kib(void) {
    return tu_rss_kib(g_daemon_pid);
}

/* ---- meta: array metadata and leases at 100k buffers ---------------------- */

enum { META_N = 100000 };

/* META_N named 1 KiB buffers prefix/i, each (with_meta) a float32 [16,16]
 * layout and a 1-hour lease, no user bytes; sealed and released. */
static void meta_fill(const char *prefix, int with_meta) {
    gpubuf_client *c = conn();
    gpubuf_buffer *b;
    gpubuf_layout l;
    memset(&l, 0, sizeof(l));
    l.dtype = (gpubuf_dtype){.code = 2, .bits = 32, .lanes = 1};
    l.ndim = 2;
    l.shape[0] = l.shape[1] = 16;
    gpubuf_meta m = {.layout = &l, .ttl_ms = 3600 * 1000};
    char name[64];
    for (int i = 0; i < META_N; i++) {
        snprintf(name, sizeof(name), "%s/%d", prefix, i);
        CHECK(gpubuf_alloc_ex(c, g_pool, 1024, name, with_meta ? &m : NULL, &b));
        CHECK(gpubuf_seal(b));
        CHECK(gpubuf_release(b));
    }
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
}

static void meta_fill_with(void) {
    meta_fill("meta/lay", 1);
}

static void meta_fill_plain(void) {
    meta_fill("meta/plain", 0);
}

static void meta_delete(void) {
    gpubuf_client *c = conn();
    char name[64];
    for (int i = 0; i < META_N; i++) {
        snprintf(name, sizeof(name), "meta/lay/%d", i);
        CHECK(gpubuf_delete(c, name));
    }
    gpubuf_disconnect(c);
}

static const char *g_meta_label;

/* gpubuf_status_get() (request, columns, unpack) 11 times; the median, and
 * that the snapshot has the metadata it should. */
static void meta_status(void) {
    gpubuf_client *c = conn();
    double t[11];
    size_t with = 0;
    for (int i = 0; i < 11; i++) {
        gpubuf_status *s;
        double a = now_us();
        CHECK(gpubuf_status_get(c, &s));
        t[i] = now_us() - a;
        with = 0;
        for (size_t k = 0; k < s->n_buffers; k++)
            with += s->buffer_meta[k].has_layout && s->buffer_meta[k].lease_left_ms > 0;
        gpubuf_status_free(s);
    }
    qsort(t, 11, sizeof(double), cmpd);
    printf("meta_status_%s_ms_median %.2f\n", g_meta_label, t[5] / 1000.0);
    printf("meta_status_%s_buffers_with_layout_and_lease %zu\n", g_meta_label, with);
    gpubuf_disconnect(c);
}

/* Wall time of `gpubufctl --json status` (fork, exec, connect, status,
 * JSON out, output discarded): the median of 11 runs, printed under key. */
static void ctl_json_time(const char *key) {
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
    printf("%s %.2f\n", key, t[5] / 1000.0);
}

/* 100k buffers with a layout and a lease: the daemon's RSS growth per buffer
 * and the time of a status; then the same for 100k buffers without
 * metadata (after the first are deleted), the anchor of the status time. */
static int meta_phase(void) {
    long rss0 = daemon_rss_kib();
    if (run_child(meta_fill_with))
        return 1;
    long rss1 = daemon_rss_kib();
    printf("meta_daemon_rss_per_buffer_layout_lease_bytes %.1f\n",
           (double)(rss1 - rss0) * 1024.0 / META_N);
    g_meta_label = "100k_layout_lease";
    if (run_child(meta_status))
        return 1;
    ctl_json_time("meta_status_json_100k_layout_lease_ms_median");
    if (run_child(meta_delete) || run_child(meta_fill_plain))
        return 1;
    g_meta_label = "100k_plain";
    if (run_child(meta_status))
        return 1;
    ctl_json_time("meta_status_json_100k_plain_ms_median");
    return 0;
}

/* ---- batches (--only batch) --------------------------------------------- */

/* One client opens 1,000 sealed buffers of slabs it has mapped in one call,
 * and releases them in one call; the same buffers opened one by one for
 * comparison. Rates in buffers per second, medians of the rounds. */
static void batch_phase(void) {
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
    }
    if (write(fd, &ops, sizeof(ops)) != sizeof(ops))
        _exit(2);
    gpubuf_release(keep);
    gpubuf_disconnect(c);
}

static void batch_mixed(void) {
    double secs = g_quick ? 1.0 : 3.0;
    long total = run_workers(batch_mixed_worker, secs);
    printf("batch_mixed_ops_per_s_%dproc %.0f\n", g_procs, (double)total / secs);
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
                                         {"vmm-pool", required_argument, NULL, 'V'},
                                         {"vmm-cold-pools", required_argument, NULL, 'W'},
                                         {NULL, 0, NULL, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "s:p:c:n:o:q", opts, NULL)) != -1) {
        switch (opt) {
        case 's': g_sock = optarg; break;
        case 'p': g_pool = optarg; break;
        case 'c': g_cold_pool = optarg; break;
        case 'n': g_procs = atoi(optarg); break;
        case 'o': g_only = optarg; break;
        case 'q': g_quick = 1; break;
        case 'P': g_daemon_pid = atoi(optarg); break;
        case 'C': g_ctl = optarg; break;
        case 'V': g_vmm_pool = optarg; break;
        case 'W': g_vmm_cold_pools = optarg; break;
        default: return 2;
        }
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (check_default_pool() < 0)
        return 1;
    if (want("latency") && run_child(latency))
        return 1;
    if (want("cold") && (run_child(cold_setup) || run_child(cold_open)))
        return 1;
    if (want("throughput"))
        throughput();
#ifdef GPUBUF_HAVE_CUDA
    if (want("bandwidth") && run_child(bandwidth))
        return 1;
    if (want("peer") && (run_child(peer_setup) || run_child(peer_copy)))
        return 1;
#endif
    /* Before crash and scale: these compare figures with each other and
     * with anchors, on a daemon without the 100k buffers of scale. */
    int vmm_failed = vmm_phases();
    if (want("crash") && (run_child(crash_setup) || run_child(crash_cleanup)))
        return 1;
    if (want("scale")) {
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
        if (r)
            return 1;
    }
    if (want("batch") && run_child(batch_phase))
        return 1;
    if (want("batchmix"))
        batch_mixed();
    if (want("meta") && meta_phase())
        return 1;
    return vmm_failed ? 1 : 0;
}
