/* seal-stream: gpubuf_seal_stream against a seal after cuStreamSynchronize,
 * while the producer's kernel still runs. Built only with CUDA. */
#include "bench.h"
#include "pattern.h"

/* The pool the running phase works on, and its label in the output. */
static const char *g_phase_pool;
static const char *g_phase_label;

/* Seal on a stream against seal after cuStreamSynchronize, for a producer
 * whose kernel (a spin of SPIN_US, then a fill of 1 MiB) is still running:
 * the host time from the end of the launch until the producer has its
 * thread back. Both seal asynchronously (gpubuf_seal_stream, gpubuf_seal);
 * the two ways alternate, each on a fresh anonymous 1 MiB buffer. */
static void seal_stream(void) {
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

int seal_stream_phase(const char *pool, const char *label) {
    g_phase_pool = pool;
    g_phase_label = label;
    return run_child(seal_stream);
}
