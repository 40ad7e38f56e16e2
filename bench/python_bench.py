#!/usr/bin/env python3
"""gpubuf's Python package against its anchors (bench/run.sh runs it in the same
run as the C benchmarks and the torch.multiprocessing anchor). Prints one
"name value" line per figure, for bench/report.py.

    python3 bench/python_bench.py --socket PATH [--pool gpu0] [--host] [--n 2000]

- py_open_warm: Client.open(name) and .address, slab mapped: the C benchmark's
  gpubuf_open_warm, through the extension.
- py_open_from_dlpack_<fw>: open + <fw>.from_dlpack(buffer), for torch and cupy
  (CUDA pools) or numpy (host pools): the figure whose goal is the C warm open
  + <fw>.from_dlpack alone + 3 µs. py_from_dlpack_only_<fw> times
  <fw>.from_dlpack alone on a buffer already open: the framework's own share.
  py_from_dlpack_fresh_<fw> times it on a Buffer just opened (the open
  untimed), py_from_dlpack_after_trip_<fw> on the buffer already open right
  after an untimed open and release of another: which of a new object or a
  round trip through gpubufd makes the excess over the two alone.
- py_handover_1MiB_fresh_tensor: a producer process allocates a 1 MiB gpubuf
  buffer, fills it as a fresh torch tensor and seals it; a consumer process,
  waiting in open(), takes it with torch.from_dlpack, reads t[0] and acks
  through a pipe. Timed from seal to ack, the same span as the
  torch.multiprocessing anchor's put -> get + touch -> ack (whose fresh tensor
  is made before its timer too). py_handover_1MiB_incl_alloc also times
  alloc + fill. The consumer makes its tensor with torch.from_dlpack, then
  (the figures with _gpubuf_torch) with gpubuf.torch.as_tensor, the
  package's PyTorch import. py_handover[_gpubuf_torch]_step_* split the span
  at the consumer's timestamps (CLOCK_MONOTONIC, one clock for both
  processes): seal (the producer's seal call), to_open (seal called -> the
  consumer's open returned), tensor (the consumer's tensor made), touch
  (t[0].item()), release, ack (the consumer's send -> the producer's recv
  returned).
- py_handover_floor_1MiB: the same two processes and pipe with gpubuf out of
  the span: the consumer opened the producer's buffer once, before; each
  time the producer fills it, synchronizes and sends a byte through the
  pipe, and the consumer, woken by it, makes the tensor with
  torch.from_dlpack, reads t[0] and acks. What is left is what any
  hand-over of this shape pays (two wake-ups, the tensor, the read):
  torch.multiprocessing's span over this one says how far a hand-over can be
  faster than torch.multiprocessing on this machine (measured after the
  hand-overs, it moves with the machine as they do: not a strict bound).
  py_handover_floor_step_* split it as above (wake: the producer's send ->
  the consumer's recv returned).
"""
import argparse
import math
import multiprocessing as mp
import statistics
import sys
import time

import gpubuf

WARM = 200


def report(name, times):
    times = sorted(times)
    print(f"{name}_median_us {statistics.median(times):.2f}")
    print(f"{name}_p99_us {times[int(0.99 * (len(times) - 1))]:.2f}")
    sys.stdout.flush()


def time_call(n, call, get, put=None):
    """call(get(i)) timed, n after WARM, get and put (given what get gave)
    untimed; what call returns is let go untimed too."""
    now = time.perf_counter_ns
    t = []
    for i in range(n + WARM):
        arg = get(i)
        a = now()
        x = call(arg)
        t.append((now() - a) / 1e3)
        del x
        if put:
            put(arg)
    return t[WARM:]


def frameworks(host):
    fws = []
    if host:
        import numpy
        fws.append(("numpy", numpy.from_dlpack))
        return fws
    try:
        import torch
        if torch.cuda.is_available():
            fws.append(("torch", torch.from_dlpack))
    except ImportError:
        pass
    try:
        import cupy
        fws.append(("cupy", cupy.from_dlpack))
    except ImportError:
        pass
    return fws


def bench_open(sock, pool, n, host):
    now = time.perf_counter_ns
    with gpubuf.Client(sock) as c:
        keep = c.alloc(1 << 20, "pybench/keep", pool=pool)  # keeps the slab mapped
        keep.seal()
        live = 64
        names = [f"pybench/{i}" for i in range(live)]
        for name in names:
            b = c.alloc(1 << 20, name, pool=pool)
            b.seal()
            b.release()
        c.flush()
        t = []
        for i in range(n + WARM):
            a = now()
            b = c.open(names[i % live], pool=pool)  # names are per pool
            b.address
            t.append((now() - a) / 1e3)
            b.release()
        report("py_open_warm", t[WARM:])
        for fw, from_dlpack in frameworks(host):
            t = []
            for i in range(n + WARM):
                a = now()
                b = c.open(names[i % live], pool=pool)  # names are per pool
                x = from_dlpack(b)
                t.append((now() - a) / 1e3)
                del x
                b.release()
            report(f"py_open_from_dlpack_{fw}", t[WARM:])
            # The framework's own share: from_dlpack of a buffer already open.
            b = c.open(names[0], pool=pool)
            report(f"py_from_dlpack_only_{fw}", time_call(n, from_dlpack, lambda i: b))
            # Where the open + from_dlpack figure's excess over the two
            # alone comes from: from_dlpack of a Buffer just opened (the
            # open untimed), and from_dlpack of the same old Buffer b right
            # after an untimed open and release of another one (a round
            # trip through gpubufd, no new object to export).
            other = [names[1 + i % (live - 1)] for i in range(n + WARM)]
            report(f"py_from_dlpack_fresh_{fw}",
                   time_call(n, from_dlpack, lambda i: c.open(other[i], pool=pool),
                             lambda f: f.release()))

            def after_trip(i):
                c.open(other[i], pool=pool).release()
                return b
            report(f"py_from_dlpack_after_trip_{fw}", time_call(n, from_dlpack, after_trip))
            b.release()
        for name in names:
            c.delete(name, pool=pool)
        keep.release()
        c.delete("pybench/keep", pool=pool)
        c.flush()


def consumer(sock, pool, n, conn, via):
    import torch
    if via == "gpubuf.torch":
        from gpubuf.torch import as_tensor

        def tensor(b):
            return as_tensor(b, torch.float32)
    else:
        def tensor(b):
            return torch.from_dlpack(b).view(torch.float32)
    with gpubuf.Client(sock) as c:
        now = time.perf_counter_ns
        conn.send_bytes(b"ready")
        for i in range(n):
            b = c.open(f"pyhand/{i}", timeout=math.inf, pool=pool)
            t1 = now()
            t = tensor(b)
            t2 = now()
            s = float(t[0].item())  # touch the data, as the anchor does
            t3 = now()
            del t
            b.release()
            t4 = now()
            conn.send_bytes(b"%d %d %d %d %d" % (int(s), t1, t2, t3, t4))


def bench_handover(sock, pool, n, via):
    import torch
    now = time.perf_counter_ns
    ctx = mp.get_context("spawn")  # CUDA does not survive fork
    here, there = ctx.Pipe()
    p = ctx.Process(target=consumer, args=(sock, pool, n + 20, there, via))
    p.start()
    there.close()  # a consumer that dies ends recv_bytes() with EOFError, not a hang
    assert here.recv_bytes() == b"ready"
    seal_to_ack, incl_alloc = [], []
    steps = {k: [] for k in ("seal", "to_open", "tensor", "touch", "release", "ack")}
    with gpubuf.Client(sock) as c:
        for i in range(n + 20):
            name = f"pyhand/{i}"
            a0 = now()
            b = c.alloc(1 << 20, name, pool=pool)
            t = torch.from_dlpack(b).view(torch.float32)  # a fresh tensor, in gpubuf memory
            t.fill_(float(i))
            torch.cuda.synchronize()
            a = now()
            b.seal()
            sealed = now()
            got = here.recv_bytes().split()
            end = now()
            assert got[0] == b"%d" % i, (got, i)
            t1, t2, t3, t4 = (int(x) for x in got[1:])
            for k, d in (("seal", sealed - a), ("to_open", t1 - a), ("tensor", t2 - t1),
                         ("touch", t3 - t2), ("release", t4 - t3), ("ack", end - t4)):
                steps[k].append(d / 1e3)
            seal_to_ack.append((end - a) / 1e3)
            incl_alloc.append((end - a0) / 1e3)
            del t
            b.release()
            c.delete(name, pool=pool)
        c.flush()
    p.join(30)
    tag = "_gpubuf_torch" if via == "gpubuf.torch" else ""
    report(f"py_handover_1MiB_fresh_tensor{tag}", seal_to_ack[20:])
    report(f"py_handover_1MiB_incl_alloc{tag}", incl_alloc[20:])
    for k, v in steps.items():
        report(f"py_handover{tag}_step_{k}", v[20:])


def floor_consumer(sock, pool, n, conn):
    import torch
    with gpubuf.Client(sock) as c:
        now = time.perf_counter_ns
        b = c.open("pyhand/floor", pool=pool)
        conn.send_bytes(b"ready")
        for _ in range(n):
            conn.recv_bytes()
            t1 = now()
            t = torch.from_dlpack(b).view(torch.float32)
            t2 = now()
            s = float(t[0].item())
            t3 = now()
            del t
            t4 = now()
            conn.send_bytes(b"%d %d %d %d %d" % (int(s), t1, t2, t3, t4))
        b.release()


def bench_handover_floor(sock, pool, n):
    """py_handover_floor_1MiB (see the top of the file)."""
    import torch
    now = time.perf_counter_ns
    ctx = mp.get_context("spawn")
    span = []
    steps = {k: [] for k in ("wake", "tensor", "touch", "release", "ack")}
    with gpubuf.Client(sock) as c:
        b = c.alloc(1 << 20, "pyhand/floor", pool=pool)
        b.seal()
        t = torch.from_dlpack(b).view(torch.float32)
        here, there = ctx.Pipe()
        p = ctx.Process(target=floor_consumer, args=(sock, pool, n + 20, there))
        p.start()
        there.close()
        assert here.recv_bytes() == b"ready"
        for i in range(n + 20):
            t.fill_(float(i))
            torch.cuda.synchronize()
            a = now()
            here.send_bytes(b"g")
            got = here.recv_bytes().split()
            end = now()
            assert got[0] == b"%d" % i, (got, i)
            t1, t2, t3, t4 = (int(x) for x in got[1:])
            for k, d in (("wake", t1 - a), ("tensor", t2 - t1), ("touch", t3 - t2),
                         ("release", t4 - t3), ("ack", end - t4)):
                steps[k].append(d / 1e3)
            span.append((end - a) / 1e3)
        p.join(30)
        del t
        b.release()
        c.delete("pyhand/floor", pool=pool)
        c.flush()
    report("py_handover_floor_1MiB", span[20:])
    for k, v in steps.items():
        report(f"py_handover_floor_step_{k}", v[20:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--pool", default=None)
    ap.add_argument("--host", action="store_true", help="host pools: no CUDA frameworks")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--handover", default="torch.from_dlpack,gpubuf.torch",
                    help="the hand-overs to measure, in this order (comma-separated: "
                         "torch.from_dlpack, gpubuf.torch; empty: none)")
    ap.add_argument("--no-open", action="store_true", help="skip the open benchmarks")
    args = ap.parse_args()
    vias = [v for v in args.handover.split(",") if v]
    for v in vias:
        if v not in ("torch.from_dlpack", "gpubuf.torch"):
            ap.error(f"--handover: unknown hand-over {v!r}")
    if not args.no_open:
        bench_open(args.socket, args.pool, args.n, args.host)
    if not args.host:
        try:
            import torch
            ok = torch.cuda.is_available()
        except ImportError:
            ok = False
        if ok:
            for v in vias:
                bench_handover(args.socket, args.pool, 200, v)
            if vias:
                bench_handover_floor(args.socket, args.pool, 200)
        else:
            print("python_bench: no torch with CUDA: hand-over not measured", file=sys.stderr)


if __name__ == "__main__":
    main()
