#!/usr/bin/env python3
"""Publish a buffer with gpubuf: allocate, write a pattern, seal, exit.

    python3 producer.py --name frame --size 1M [--socket PATH] [--pool NAME]

CUDA pools are written on the GPU with CuPy (zero-copy through DLPack), host
pools with NumPy (zero-copy through the buffer protocol). The buffer outlives
this process: consumer.py opens it by name.
"""
import argparse

import numpy as np

import gpubuf


def size_arg(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def pattern(xp, n):
    """Byte i is (7 i + 3) mod 251: no two neighbouring pages look alike."""
    return ((xp.arange(n, dtype=xp.uint64) * 7 + 3) % 251).astype(xp.uint8)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", required=True)
    p.add_argument("--size", type=size_arg, default=1 << 20)
    p.add_argument("--socket", default=None, help="default: $GPUBUF_SOCKET or " + gpubuf.DEFAULT_SOCKET)
    p.add_argument("--pool", default=None)
    args = p.parse_args()

    with gpubuf.Client(args.socket) as client:
        buf = client.alloc(args.size, name=args.name, pool=args.pool)
        if buf.is_cuda:
            import cupy

            with cupy.cuda.Device(buf.device):
                dev = cupy.from_dlpack(buf)  # the buffer's own memory, no copy
                dev[:] = pattern(cupy, buf.size)
                cupy.cuda.runtime.deviceSynchronize()  # written before it is published
            where = f"GPU {buf.device}"
        else:
            np.frombuffer(buf, dtype=np.uint8)[:] = pattern(np, buf.size)
            where = "host memory"
        buf.seal(sync=True)  # others can open it now
        print(f"published '{buf.name}' (id {buf.id}, {buf.size} bytes, {where})")
        buf.release()


if __name__ == "__main__":
    main()
