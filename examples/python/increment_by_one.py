#!/usr/bin/env python3
"""Arrow's Numba example (pyarrow.cuda docs: increment_by_one) on a buffer that
another process wrote and published through gpubuf.

    python3 increment_by_one.py [--socket PATH] [--pool NAME]

A producer process (this script with --produce) writes [0, 1, 2, 3] as int32
into a new buffer of a cuda-ipc pool, seals it and exits. This process opens
the buffer by name, runs the kernel on it in place, and copies it back:
[1 2 3 4]. The kernel runs with Numba; where Numba cannot be imported (for
example against a NumPy it does not support) the same kernel runs through
CuPy, and the script says so.
"""
import argparse
import subprocess
import sys

import numpy as np

import gpubuf

KERNEL_SOURCE = r"""
extern "C" __global__ void increment_by_one(int *an_array, int size) {
    int pos = blockIdx.x * blockDim.x + threadIdx.x;
    if (pos < size)
        an_array[pos] += 1;
}
"""


def produce(args):
    with gpubuf.Client(args.socket) as client:
        buf = client.alloc(4 * 4, name=args.name, pool=args.pool)
        if not buf.is_cuda:
            raise SystemExit("increment_by_one needs a cuda-ipc pool")
        buf.copy_from_host(np.arange(4, dtype=np.int32))
        buf.seal(sync=True)
        buf.release()


def run_numba(buf):
    from numba import cuda

    @cuda.jit
    def increment_by_one(an_array):
        pos = cuda.grid(1)
        if pos < an_array.size:
            an_array[pos] += 1

    cuda.select_device(buf.device)
    device_arr = cuda.as_cuda_array(buf.as_array("int32"))  # zero-copy, CUDA Array Interface
    threadsperblock = 32
    blockspergrid = (device_arr.size + (threadsperblock - 1)) // threadsperblock
    increment_by_one[blockspergrid, threadsperblock](device_arr)
    cuda.synchronize()
    return "numba"


def run_cupy(buf):
    import cupy

    with cupy.cuda.Device(buf.device):
        arr = cupy.from_dlpack(buf.as_array("int32"))  # zero-copy, DLPack
        kernel = cupy.RawKernel(KERNEL_SOURCE, "increment_by_one")
        kernel((1,), (32,), (arr, np.int32(arr.size)))
        cupy.cuda.runtime.deviceSynchronize()
    return "cupy"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--socket", default=None)
    p.add_argument("--pool", default=None)
    p.add_argument("--name", default="arrow/increment_by_one")
    p.add_argument("--produce", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", choices=("auto", "numba", "cupy"), default="auto")
    args = p.parse_args()
    if args.produce:
        return produce(args)

    cmd = [sys.executable, __file__, "--produce", "--name", args.name]
    cmd += ["--socket", args.socket] if args.socket else []
    cmd += ["--pool", args.pool] if args.pool else []
    if subprocess.run(cmd).returncode != 0:  # the producer has exited when this returns
        raise SystemExit("increment_by_one: the producer failed")

    with gpubuf.Client(args.socket) as client:
        with client.open(args.name, timeout=10) as buf:
            engine = args.engine
            if engine in ("auto", "numba"):
                try:
                    engine = run_numba(buf)
                except Exception as e:  # noqa: BLE001 - reported, then CuPy
                    if args.engine == "numba":
                        raise
                    print(f"Numba unavailable ({type(e).__name__}: {e}); running the same "
                          "kernel through CuPy", file=sys.stderr)
                    engine = run_cupy(buf)
            else:
                engine = run_cupy(buf)
            result = np.frombuffer(buf.copy_to_host(), dtype=np.int32)
        client.delete(args.name)
    print(f"increment_by_one ({engine}) on a buffer written by another process: {result}")
    raise SystemExit(0 if result.tolist() == [1, 2, 3, 4] else 1)


if __name__ == "__main__":
    main()
