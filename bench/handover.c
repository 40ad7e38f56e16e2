/* handover: producer kernel end to consumer kernel start, through
 * gpubuf_seal_stream and gpubuf_buffer_wait. Built only with CUDA. */
#include <stdlib.h>
#include <sys/wait.h>

#include "bench.h"

/* The pool the running phase works on, and its label in the output. */
static const char *g_phase_pool;
static const char *g_phase_label;

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

static void handover_producer(void) {
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

int handover_phase(const char *pool, const char *label) {
    g_phase_pool = pool;
    g_phase_label = label;
    return run_child(handover_producer);
}
