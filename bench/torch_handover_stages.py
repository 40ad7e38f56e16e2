#!/usr/bin/env python3
"""Where a gpubuf.torch hand-over of a fresh tensor spends its time: the median
(and p99) of each step the sender's reducer and the receiver's rebuild take,
one at a time, in this process (the receiver's steps on a second connection),
plus the anchor of a torch.multiprocessing queue round trip of a small object
(what any hand-over through a queue pays on top). Figures of one run, no goals.

    bench/torch_handover_stages.py [--pool gpu0] [--host] [--n 300] [--mib 1]

Needs a running gpubufd ($GPUBUF_SOCKET). --host: CPU tensors through a host pool.
"""
import argparse
import os
import time

import torch
import torch.multiprocessing as mp
from multiprocessing.reduction import ForkingPickler

import gpubuf
import gpubuf.torch as gt


def echo(q, r):
    while True:
        x = q.get()
        if x is None:
            break
        r.put(x)


def stat(name, times):
    times = sorted(times)
    print("%-34s median %8.1f us  p99 %8.1f us" %
          (name, times[len(times) // 2], times[int(0.99 * (len(times) - 1))]), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pool")
    ap.add_argument("--host", action="store_true")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--mib", type=float, default=1)
    a = ap.parse_args()
    device = "cpu" if a.host else "cuda"
    gt.install(cpu=a.host, pool=a.pool)
    c, rc = gt.client(), gpubuf.Client()
    pool = gt._pool_for(c, torch.device(device), a.pool)
    nel = int(a.mib * 2**20) // 4
    steps = {k: [] for k in ("alloc (ttl)", "from_dlpack (sender)", "copy_ (launch)",
                             "seal (stream / plain)", "torch Event + record",
                             "helper release (sync+release)", "dumps (whole reducer)",
                             "open_id (receiver)", "from_dlpack (receiver)",
                             "delete (receiver)", "release (receiver)")}

    def timed(key, fn):
        t0 = time.perf_counter()
        r = fn()
        steps[key].append((time.perf_counter() - t0) * 1e6)
        return r

    for i in range(a.n + 20):
        t = torch.full((nel,), float(i), device=device)
        if t.is_cuda:
            torch.cuda.synchronize()
        name = "stages/%d-%d" % (os.getpid(), i)
        buf = timed("alloc (ttl)", lambda: c.alloc(nel * 4, name, pool, ttl=60))
        bid = buf.id
        dst = timed("from_dlpack (sender)", lambda: torch.from_dlpack(buf))
        timed("copy_ (launch)", lambda: dst.view(torch.float32).copy_(t, non_blocking=True))
        del dst
        if t.is_cuda:
            s = torch.cuda.current_stream()
            timed("seal (stream / plain)", lambda: buf.seal(stream=s))
            ev = torch.cuda.Event()
            timed("torch Event + record", lambda: ev.record(s))
            timed("helper release (sync+release)", lambda: (ev.synchronize(), buf.release()))
        else:
            timed("seal (stream / plain)", lambda: buf.seal())
            buf.release()
        b2 = timed("open_id (receiver)", lambda: rc.open_id(bid, 30))
        x = timed("from_dlpack (receiver)", lambda: torch.from_dlpack(b2))
        timed("delete (receiver)", lambda: rc.delete(name, pool=pool))
        b2.release()
        del x
        timed("release (receiver)", lambda: rc.flush() if hasattr(rc, "flush") else None)
        timed("dumps (whole reducer)", lambda: ForkingPickler.dumps(t))
        gt.flush()
        if i < 20:
            for v in steps.values():
                v.clear()
    for k, v in steps.items():
        if v:
            stat(k, v)
    # the receiver of the dumps above: their names go with their leases
    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=echo, args=(q, r))
    p.start()
    rt = []
    for i in range(a.n + 20):
        t0 = time.perf_counter()
        q.put(i)
        r.get()
        if i >= 20:
            rt.append((time.perf_counter() - t0) * 1e6)
    q.put(None)
    p.join()
    stat("anchor: queue round trip (an int)", rt)
    for b in c.status()["buffers"]:
        if b["name"].startswith(".gpubuf-torch/"):
            try:
                c.delete(b["id"])
            except gpubuf.Error:
                pass


if __name__ == "__main__":
    main()
