#!/usr/bin/env python3
"""Open a published buffer with gpubuf and check producer.py's pattern.

    python3 consumer.py --name frame [--timeout 10] [--socket PATH] [--delete]

CUDA buffers are checked on the GPU (CuPy), host buffers in place (NumPy):
nothing is copied.
"""
import argparse

import numpy as np

import gpubuf
from producer import pattern


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", required=True,
                   help="NAME in the daemon's default pool, or /POOL/NAME (names are per pool)")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the name")
    p.add_argument("--socket", default=None)
    p.add_argument("--delete", action="store_true", help="unpublish the buffer afterwards")
    args = p.parse_args()

    with gpubuf.Client(args.socket) as client:
        with client.open(args.name, timeout=args.timeout) as buf:
            size = buf.size
            if buf.is_cuda:
                import cupy

                with cupy.cuda.Device(buf.device):
                    data = cupy.from_dlpack(buf)  # zero-copy view of the shared memory
                    bad = int((data != pattern(cupy, buf.size)).sum())
                    where = f"on GPU {buf.device}"
            else:
                data = np.frombuffer(buf, dtype=np.uint8)
                bad = int((data != pattern(np, buf.size)).sum())
                where = "in host memory"
            del data  # the view goes before the buffer is released
        print(f"{args.name}: {size} bytes, {bad} mismatches (checked {where})")
        if args.delete:
            client.delete(args.name)
        raise SystemExit(1 if bad else 0)


if __name__ == "__main__":
    main()
