#!/usr/bin/env python3
"""gpubuf.torch against PyTorch's own sharing, in one run (docs/performance.md,
"gpubuf.torch"). Prints one "name value" line per figure and the ratios.

    python3 bench/torch_bench.py [--socket PATH | --gpubufd build/daemon/gpubufd] [--only handover,sd,leak]
        [--host] [--pool NAME] [--n 300] [--sd-bytes 1G] [--sd-tensors 300]
        [--kills 1000]

Without --socket it starts a gpubufd of its own (--gpubufd, default
build/daemon/gpubufd) with one cuda-ipc pool on GPU 0, or a host pool with
--host (CPU tensors; also where there is no GPU). Figures:

- handover_1MiB_{gpubuf,torch}_{median,p99}_us: a fresh 1 MiB tensor through a
  torch.multiprocessing queue, from put() in the producer to the consumer's ack
  (it reads t[0]); gpubuf: with gpubuf.torch.install(), torch: without
  (CUDA IPC; host: torch's shared memory). handover_speedup: torch / gpubuf
  medians (goal on a GPU: >= 10).
- sd_open_{version,latest}_ms: open_state_dict of a SD_BYTES state dict of
  SD_TENSORS tensors in a consumer process (explicit version; "latest");
  sd_torch_queue_ms: the same state dict through a torch.multiprocessing queue
  (put to ack, the consumer holding every tensor); sd_open_speedup
  (goal: >= 50, and sd_open_version_ms <= 1).
- sd_publish_ms against sd_copy_ms (device-to-device copies of the same
  tensors into preallocated ones, synchronised the same way):
  sd_publish_over_copy (goal: <= 1.2).
- leak_{gpubuf,torch}_*: KILLS hand-overs of fresh 1 MiB tensors with the
  consumer SIGKILLed every 100: the producer's device memory (torch.cuda
  mem_get_info, allocator reserved) and, for gpubuf, the daemon's pool bytes
  and references, before and after.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp

import gpubuf
import gpubuf.torch as gt

MiB = 1 << 20


def size_arg(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * units[s[-1].upper()] if s[-1].upper() in units else int(s)


def out(name, value):
    print(f"{name} {value:.3f}" if isinstance(value, float) else f"{name} {value}", flush=True)


def pct(times, q):
    times = sorted(times)
    return times[int(q * (len(times) - 1))]


# ---- hand-over ---------------------------------------------------------------------------------

def ho_consumer(use_gpubuf, device, pool, q, ack):
    if use_gpubuf:
        gt.install(cpu=(device == "cpu"), pool=pool)
    while True:
        t = q.get()
        if t is None:
            break
        t[0].item()  # touch it where it lives
        ack.put(1)
        del t


def handover(ctx, use_gpubuf, device, pool, n, warm=20):
    if use_gpubuf:
        gt.install(cpu=(device == "cpu"), pool=pool)
    else:
        gt.uninstall()
    q, ack = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=ho_consumer, args=(use_gpubuf, device, pool, q, ack))
    p.start()
    times, keep = [], []
    for i in range(n + warm):
        t = torch.full((MiB // 4,), float(i), device=device)  # fresh, made before the timer
        if t.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        q.put(t)
        ack.get()
        if i >= warm:
            times.append((time.perf_counter() - t0) * 1e6)
        keep.append(t)  # torch's IPC: the producer keeps what it sent while consumers use it
        if len(keep) > 8:
            keep.pop(0)
    q.put(None)
    p.join()
    gt.uninstall()
    return times


# ---- state dicts -------------------------------------------------------------------------------

def make_sd(device, total, count):
    per = max(total // count // 4, 1)
    sizes = [per + (i % 7) * 16 for i in range(count)]
    return {f"layer{i}.weight": torch.full((s,), float(i % 100), device=device)
            for i, s in enumerate(sizes)}


def sd_consumer(prefix, device, reps, cmd, res):
    c = gpubuf.Client()
    if device == "cuda":
        torch.cuda.init()
    for op in iter(cmd.get, None):
        if op == "open":
            tv, tl = [], []
            for _ in range(reps):
                t0 = time.perf_counter()
                sd = gt.open_state_dict(c, prefix, version=0)
                tv.append((time.perf_counter() - t0) * 1e3)
                del sd
                t0 = time.perf_counter()
                sd = gt.open_state_dict(c, prefix)
                tl.append((time.perf_counter() - t0) * 1e3)
                del sd
            res.put((tv, tl))
        elif op == "queue":
            while True:
                sd = cmd.get()
                if sd is None:
                    break
                for t in sd.values():  # every tensor usable
                    assert t.numel() > 0
                res.put(len(sd))
                del sd


def state_dicts(ctx, device, pool, total, count, reps):
    c = gt.client()
    sd = make_sd(device, total, count)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    out("sd_bytes", nbytes)
    out("sd_tensors", len(sd))
    prefix = "bench/sd"
    # publish against copies of the same bytes into tensors that already exist
    dst = {k: torch.empty_like(t) for k, t in sd.items()}
    tp, tc = [], []
    for r in range(reps):
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        for k, t in sd.items():
            dst[k].copy_(t, non_blocking=True)
        sync()
        tc.append((time.perf_counter() - t0) * 1e3)
        if r:
            gt.delete_state_dict(c, prefix, 0)
            c.flush()
        t0 = time.perf_counter()
        gt.publish_state_dict(c, prefix, sd, pool=pool, version=0, keep_last=None)
        sync()
        tp.append((time.perf_counter() - t0) * 1e3)
    del dst
    out("sd_copy_ms", statistics.median(tc))
    out("sd_publish_ms", statistics.median(tp))
    out("sd_publish_over_copy", statistics.median(tp) / statistics.median(tc))
    cmd, res = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=sd_consumer, args=(prefix, device, reps, cmd, res))
    p.start()
    cmd.put("open")
    tv, tl = res.get()
    out("sd_open_version_ms", statistics.median(tv))
    out("sd_open_latest_ms", statistics.median(tl))
    # the same state dict through a torch.multiprocessing queue (torch's sharing)
    gt.uninstall()
    cmd.put("queue")
    tq = []
    for _ in range(reps):
        t0 = time.perf_counter()
        cmd.put(sd)
        res.get()
        tq.append((time.perf_counter() - t0) * 1e3)
    cmd.put(None)
    cmd.put(None)
    p.join()
    out("sd_torch_queue_ms", statistics.median(tq))
    out("sd_open_speedup", statistics.median(tq) / statistics.median(tv))
    gt.delete_state_dict(c, prefix, 0)


# ---- memory with killed consumers ------------------------------------------------------------

def leak_consumer(use_gpubuf, device, pool, q, ack):
    if use_gpubuf:
        gt.install(cpu=(device == "cpu"), pool=pool)
    held = []
    while True:
        held.append(q.get())  # held until killed
        ack.put(1)


def device_used(device):
    if device != "cuda":
        return 0, 0
    free, total = torch.cuda.mem_get_info()
    return total - free, torch.cuda.memory_reserved()


def daemon_figures(c):
    st = c.status()
    return (sum(p["used"] for p in st["pools"]),
            sum(cl["references"] for cl in st["clients"]))


def leak(ctx, use_gpubuf, device, pool, kills):
    tag = "gpubuf" if use_gpubuf else "torch"
    if use_gpubuf:
        gt.install(cpu=(device == "cpu"), pool=pool)
    else:
        gt.uninstall()
    c = gt.client()
    if device == "cuda":
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
    dev0, res0 = device_used(device)
    pool0, refs0 = daemon_figures(c)
    p = None
    for i in range(kills):
        if i % 100 == 0:
            if p is not None:
                os.kill(p.pid, signal.SIGKILL)
                p.join()
            q, ack = ctx.Queue(), ctx.Queue()
            p = ctx.Process(target=leak_consumer, args=(use_gpubuf, device, pool, q, ack))
            p.start()
        t = torch.full((MiB // 4,), float(i), device=device)
        q.put(t)
        ack.get()
        del t  # the producer lets go at once (torch's docs say: keep it; we measure that)
    os.kill(p.pid, signal.SIGKILL)
    p.join()
    if device == "cuda":
        torch.cuda.synchronize()
        if not use_gpubuf:
            torch.cuda.ipc_collect()  # what torch users sprinkle around: does it help?
    end = time.monotonic() + 10
    while use_gpubuf and daemon_figures(c) != (pool0, refs0) and time.monotonic() < end:
        time.sleep(0.05)  # the daemon's session cleanup of the last kill
    dev1, res1 = device_used(device)
    pool1, refs1 = daemon_figures(c)
    out(f"leak_{tag}_device_used_delta_MiB", (dev1 - dev0) / MiB)
    out(f"leak_{tag}_allocator_reserved_delta_MiB", (res1 - res0) / MiB)
    if use_gpubuf:
        out(f"leak_{tag}_pool_used_delta_MiB", (pool1 - pool0) / MiB)
        out(f"leak_{tag}_daemon_references_delta", refs1 - refs0)
    gt.uninstall()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket")
    ap.add_argument("--gpubufd", default="build/daemon/gpubufd")
    ap.add_argument("--host", action="store_true", help="CPU tensors through a host pool")
    ap.add_argument("--pool")
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--sd-bytes", type=size_arg)
    ap.add_argument("--sd-tensors", type=int, default=300)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--kills", type=int, default=1000)
    ap.add_argument("--only", default="handover,sd,leak",
                    help="which parts, comma-separated (handover, sd, leak; default: all)")
    a = ap.parse_args()
    parts = set(a.only.split(","))
    if not parts <= {"handover", "sd", "leak"}:
        ap.error("--only takes handover, sd, leak")
    host = a.host or not torch.cuda.is_available()
    device = "cpu" if host else "cuda"
    sd_bytes = a.sd_bytes or ((64 << 20) if host else (1 << 30))
    daemon = None
    if not a.socket:
        tmp = tempfile.mkdtemp(prefix="torch-bench-")
        a.socket = os.path.join(tmp, "gpubufd.sock")
        pools = ["host=host,capacity=%d,slab=64M" % (4 * sd_bytes + (1 << 30))] if host else \
            ["gpu0=cuda-ipc,device=0,capacity=%d,slab=256M" % (4 * sd_bytes + (2 << 30))]
        args = [a.gpubufd, "--socket", a.socket, "--log-level", "warning"]
        for p in pools:
            args += ["--pool", p]
        daemon = subprocess.Popen(args)
        while not os.path.exists(a.socket):
            if daemon.poll() is not None:
                sys.exit("gpubufd did not start")
            time.sleep(0.05)
        time.sleep(0.2)
        a.pool = a.pool or pools[0].split("=")[0]
    os.environ["GPUBUF_SOCKET"] = a.socket
    ctx = mp.get_context("spawn")
    out("device_is_cuda", int(device == "cuda"))
    out("torch_version_major_minor", float(".".join(torch.__version__.split(".")[:2])))
    try:
        if "handover" in parts:
            g = handover(ctx, True, device, a.pool, a.n)
            t = handover(ctx, False, device, a.pool, a.n)
            for tag, ts in (("gpubuf", g), ("torch", t)):
                out(f"handover_1MiB_{tag}_median_us", statistics.median(ts))
                out(f"handover_1MiB_{tag}_p99_us", pct(ts, 0.99))
            out("handover_speedup", statistics.median(t) / statistics.median(g))
        if "sd" in parts:
            state_dicts(ctx, device, a.pool, sd_bytes, a.sd_tensors, a.reps)
        if "leak" in parts:
            leak(ctx, True, device, a.pool, a.kills)
            leak(ctx, False, device, a.pool, a.kills)
    finally:
        if daemon:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(10)


if __name__ == "__main__":
    main()
