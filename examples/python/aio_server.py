#!/usr/bin/env python3
"""Serve frames over TCP as they are sealed, from one asyncio loop.

    python3 aio_server.py [--port 8765] [--socket PATH] [--demo N [--pool NAME] [--cuda]]

A TCP client sends a frame name per line; the server answers with the frame's
length (8 bytes, little-endian) and its bytes as soon as a producer seals it
(await client.open_async(name)). Thousands of requests wait at once on one
gpubuf connection: no thread per wait (docs/python.md, "asyncio").

--demo N runs the whole thing in one process and exits: N TCP requests for
demo.PID.0 .. demo.PID.N-1, and a producer that allocates and seals those frames in
random order; every answer is checked. With --cuda the producer writes each
frame on a CUDA stream with CuPy and seals it in stream order (seal(stream=)),
without waiting for the GPU: the pool (--pool) must be a CUDA pool; openers
wait on the seal event before reading.
"""
import argparse
import asyncio
import os
import random
import struct
import sys

import numpy as np

import gpubuf

FRAME = 64 << 10
PREFIX = f"demo.{os.getpid()}"  # the frames stay in the daemon: a new name per run


def pattern(i, n=FRAME):
    return bytes((i * 31 + k) % 251 for k in range(256)) * (n // 256)


async def handle(client, reader, writer):
    while line := await reader.readline():
        name = line.decode().strip()
        try:
            buf = await client.open_async(name)
        except gpubuf.Error as e:
            writer.write(struct.pack("<q", -1) + f"{e}\n".encode())
            continue
        with buf:
            if buf.is_cuda:  # __dlpack__ orders the copy after the producer's seal event
                import cupy as cp

                data = cp.asnumpy(cp.from_dlpack(buf)).tobytes()
            else:
                data = buf.to_pybytes()
        writer.write(struct.pack("<q", len(data)) + data)
        await writer.drain()
    writer.close()


async def produce(client, n, pool, cuda):
    order = list(range(n))
    random.shuffle(order)
    if cuda:
        import cupy as cp

        stream = cp.cuda.Stream(non_blocking=True)
    for i in order:
        b = await client.alloc_async(FRAME, f"{PREFIX}.{i}", pool)
        if cuda:
            with stream:
                cp.from_dlpack(b)[:] = cp.asarray(np.frombuffer(pattern(i), dtype=np.uint8))
            b.seal(stream=stream)  # in stream order: the GPU work need not be done
        else:
            b.copy_from_host(pattern(i))
            await client.seal_async(b)
        b.release()
        await asyncio.sleep(0)
    client.flush()


async def demo(args):
    with gpubuf.Client(args.socket) as server_client, gpubuf.Client(args.socket) as producer:
        server = await asyncio.start_server(lambda r, w: handle(server_client, r, w),
                                            "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write("".join(f"{PREFIX}.{i}\n" for i in range(args.demo)).encode())
        await writer.drain()

        async def check_answers():
            for i in range(args.demo):
                (n,) = struct.unpack("<q", await reader.readexactly(8))
                if n < 0:
                    sys.exit(f"demo.{i}: {await reader.readline()}")
                if await reader.readexactly(n) != pattern(i):
                    sys.exit(f"demo.{i}: wrong contents")

        # Together: a producer that fails ends the demo with its error instead
        # of leaving the reader waiting for frames that never come.
        async with asyncio.TaskGroup() as tg:
            tg.create_task(produce(producer, args.demo, args.pool, args.cuda))
            tg.create_task(check_answers())
        writer.close()
        server.close()
        await server.wait_closed()
        print(f"{args.demo} frames served as they were sealed"
              f"{' (CUDA, stream-ordered seals)' if args.cuda else ''}")


async def serve(args):
    with gpubuf.Client(args.socket) as client:
        server = await asyncio.start_server(lambda r, w: handle(client, r, w), "127.0.0.1",
                                            args.port)
        async with server:
            await server.serve_forever()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--socket")
    p.add_argument("--demo", type=int, default=0)
    p.add_argument("--pool")
    p.add_argument("--cuda", action="store_true")
    args = p.parse_args()
    asyncio.run(demo(args) if args.demo else serve(args))


if __name__ == "__main__":
    main()
