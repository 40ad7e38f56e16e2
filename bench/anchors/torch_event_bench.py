"""Anchor: producer-kernel-end to consumer-kernel-start latency of
torch.multiprocessing's CUDA event hand-over, measured like gpubuf_bench's
handover phase.

Per hand-over: the consumer (a spawned process) says it is ready and blocks in
q.get(); the producer launches bench_stamp_end on its current stream (a spin of
SPIN_US of %globaltimer, then %globaltimer into the tensor's first element as
its last act) and puts the tensor on the queue at once. torch records an
interprocess event on the current stream when it shares the storage; the
consumer's unpickling (rebuild_cuda_tensor) opens it and makes the consumer's
current stream wait on it. The consumer then launches bench_stamp (%globaltimer
as its first act) on that stream. Latency = consumer stamp - producer stamp:
one GPU, one clock. The kernels are the PTX of bench/bench_gpu.c, loaded
through the driver API (ctypes, libcuda.so.1) into torch's primary context.

Prints "name value" lines; prints nothing and exits 0 without torch or a GPU.
"""
import ctypes
import statistics
import sys

try:
    import torch
    import torch.multiprocessing as mp
except ImportError:
    sys.exit(0)

N, WARM = 200, 10
SPIN_US = 2000  # as gpubuf_bench's SPIN_US
TIMEOUT_S = 60  # a hand-over that takes longer means the other process is gone

PTX = b"""\
.version 7.0
.target sm_52
.address_size 64

.visible .entry bench_stamp_end(.param .u64 p_out, .param .u64 p_ns)
{
  .reg .pred %p;
  .reg .b64 %rd<8>;
  ld.param.u64 %rd1, [p_out];
  ld.param.u64 %rd2, [p_ns];
  cvta.to.global.u64 %rd1, %rd1;
  mov.u64 %rd3, %globaltimer;
SPIN:
  mov.u64 %rd4, %globaltimer;
  sub.u64 %rd5, %rd4, %rd3;
  setp.lt.u64 %p, %rd5, %rd2;
  @%p bra SPIN;
  mov.u64 %rd6, %globaltimer;
  st.global.u64 [%rd1], %rd6;
  ret;
}

.visible .entry bench_stamp(.param .u64 p_out)
{
  .reg .b64 %rd<4>;
  ld.param.u64 %rd1, [p_out];
  cvta.to.global.u64 %rd1, %rd1;
  mov.u64 %rd2, %globaltimer;
  st.global.u64 [%rd1], %rd2;
  ret;
}
"""


class Kernels:
    """The two stamp kernels in the current device's primary context."""

    def __init__(self):
        torch.zeros(1, device="cuda")  # torch's context exists and is current here
        cu = ctypes.CDLL("libcuda.so.1")
        self.cu = cu
        cu.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        cu.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        cu.cuDevicePrimaryCtxRetain.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int]
        cu.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]
        cu.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p]
        cu.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p,
                                           ctypes.c_char_p]
        cu.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        for f in ("cuGetErrorName", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent",
                  "cuModuleLoadData", "cuModuleGetFunction", "cuLaunchKernel"):
            getattr(cu, f).restype = ctypes.c_int
        dev, ctx, mod = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
        self.check(cu.cuDeviceGet(ctypes.byref(dev), torch.cuda.current_device()), "cuDeviceGet")
        self.check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        self.check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self.check(cu.cuModuleLoadData(ctypes.byref(mod), PTX), "cuModuleLoadData")
        self.mod = mod
        self.stamp_end, self.stamp = ctypes.c_void_p(), ctypes.c_void_p()
        self.check(cu.cuModuleGetFunction(ctypes.byref(self.stamp_end), mod, b"bench_stamp_end"),
                   "cuModuleGetFunction")
        self.check(cu.cuModuleGetFunction(ctypes.byref(self.stamp), mod, b"bench_stamp"),
                   "cuModuleGetFunction")

    def check(self, r, what):
        if r != 0:
            name = ctypes.c_char_p()
            self.cu.cuGetErrorName(r, ctypes.byref(name))
            raise RuntimeError(f"{what}: {name.value.decode() if name.value else r}")

    def launch(self, fn, *args):
        """One thread of fn on torch's current stream; args are 64-bit values."""
        vals = [ctypes.c_uint64(a) for a in args]
        params = (ctypes.c_void_p * len(vals))(*[ctypes.addressof(v) for v in vals])
        stream = torch.cuda.current_stream().cuda_stream
        self.check(self.cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, ctypes.c_void_p(stream),
                                          ctypes.cast(params, ctypes.c_void_p), None),
                   "cuLaunchKernel")


def consumer(q, ready, done, results):
    k = Kernels()
    n = N + WARM
    stamps = torch.zeros(n, dtype=torch.int64, device="cuda")
    lat, bad, prev = [], 0, 0
    for i in range(n):
        ready.put(i)
        t = q.get(timeout=TIMEOUT_S)  # rebuild: the current stream waits on the producer's event
        k.launch(k.stamp, stamps.data_ptr() + 8 * i)
        torch.cuda.current_stream().synchronize()
        pend, cst = int(t[0].item()), int(stamps[i].item())
        del t
        done.put(i)
        us = (cst - pend) / 1000.0
        if us < 0 or pend <= prev:  # the consumer ran first, or no producer stamp
            bad += 1
        prev = pend
        if i >= WARM:
            lat.append(us)
    results.put((lat, bad))


def main():
    if not torch.cuda.is_available():
        return
    ctx = mp.get_context("spawn")
    q, ready, done, results = ctx.Queue(), ctx.Queue(), ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=consumer, args=(q, ready, done, results))
    p.start()
    k = Kernels()
    keep = []  # every tensor a storage of its own: the consumer's cache never skips the event
    for _ in range(N + WARM):
        ready.get(timeout=TIMEOUT_S)
        t = torch.zeros(2, dtype=torch.int64, device="cuda")
        k.launch(k.stamp_end, t.data_ptr(), SPIN_US * 1000)
        q.put(t)
        done.get(timeout=TIMEOUT_S)
        keep.append(t)
    lat, bad = results.get(timeout=TIMEOUT_S)
    p.join()
    lat.sort()
    print(f"torch_event_handover_median_us {statistics.median(lat):.2f}")
    print(f"torch_event_handover_p99_us {lat[int(0.99 * (len(lat) - 1))]:.2f}")
    print(f"torch_event_handover_count {len(lat)}")
    print(f"torch_event_handover_order_violations {bad}")
    print(f"torch_event_handover_spin_us {SPIN_US}")


if __name__ == "__main__":
    print("torch", torch.__version__, file=sys.stderr)
    main()
