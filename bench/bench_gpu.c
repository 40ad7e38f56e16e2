/* The GPU of the CUDA phases (bench.h): the primary context of device 0, a
 * stream, and two stamp kernels. Built only with CUDA. */
#include <string.h>

#include "bench.h"

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

void gpu_open(bench_gpu *g, int kernels) {
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

/* The CUDA phases map every buffer on device 0: say so if a pool lives
 * elsewhere instead of measuring the wrong thing. */
void expect_device0(const gpubuf_buffer *b) {
    if (gpubuf_buffer_device(b) != 0) {
        fprintf(stderr, "bench: buffer '%s' is mapped on device %d; these phases need device 0\n",
                gpubuf_buffer_name(b), gpubuf_buffer_device(b));
        _exit(1);
    }
}
