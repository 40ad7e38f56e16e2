#!/usr/bin/env python3
"""Weight sync with gpubuf.torch: a trainer updates a small model every step
and publishes each version of its state dict; N inference processes (each on
its own GPU when there are several) always run the latest version, zero-copy.
The trainer is SIGKILLed once and restarted: it resumes from the latest
published version, and the inference processes never stop.

    GPUBUF_SOCKET=/tmp/g.sock python3 torch_weight_sync.py [--consumers 3]
        [--steps 30] [--restart-at 10] [--pool NAME] [--device cuda|cpu]

Each version carries a checksum of its weights (a tensor of the state dict):
a consumer that sees the weights of one version with the checksum of another
would report it. Prints "weight sync ok" when every consumer ran the last
version with no mismatch.
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.multiprocessing as mp

import gpubuf
import gpubuf.torch as gt

PREFIX = "weight-sync/policy"


def make_model():
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 8))


def checksum(sd):
    return sum(float(t.double().sum()) for k, t in sd.items() if k != "checksum")


def publishable(model):
    sd = dict(model.state_dict())
    sd["checksum"] = torch.tensor(checksum(sd), dtype=torch.float64, device=sd["0.weight"].device)
    return sd


def trainer(device, pool, steps, stop_at):
    """Train; publish a version per step. Resumes from the latest version."""
    c = gpubuf.Client()
    model = make_model().to(device)
    latest = gt.latest_version(c, PREFIX, pool=pool)
    if latest is not None:
        sd = gt.open_state_dict(c, PREFIX, version=latest, pool=pool)
        model.load_state_dict({k: v for k, v in sd.items() if k != "checksum"})  # a copy
        del sd
        print(f"trainer {os.getpid()}: resumed from version {latest}", flush=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    v = -1 if latest is None else latest
    while v + 1 < steps:
        x = torch.randn(32, 64, device=device)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        v = gt.publish_state_dict(c, PREFIX, publishable(model), pool=pool, keep_last=2)
        if v == stop_at:
            print(f"trainer {os.getpid()}: published {v}, waiting to be killed", flush=True)
            time.sleep(3600)
    print(f"trainer {os.getpid()}: published the last version, {v}", flush=True)
    c.close()


def functional(model, sd, x):
    """The model with the opened tensors as its weights, without copying them."""
    try:
        model.load_state_dict(sd, assign=True)  # torch >= 2.1
        return model(x)
    except TypeError:
        from torch.nn.utils.stateless import functional_call
        return functional_call(model, sd, (x,))


def consumer(rank, device, pool, last, results):
    c = gpubuf.Client()
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    model = make_model().to(device)
    x = torch.randn(4, 64, device=device)
    seen, mismatches, v = 0, 0, -1
    while v < last:
        latest = gt.latest_version(c, PREFIX, pool=pool)
        if latest is None or latest <= v:
            try:  # wait for the next version
                sd = gt.open_state_dict(c, PREFIX, version=v + 1, timeout=0.5, pool=pool)
            except (gpubuf.WaitTimeoutError, gpubuf.NotFoundError):
                continue
        else:
            try:
                sd = gt.open_state_dict(c, PREFIX, version=latest, pool=pool)
            except gpubuf.NotFoundError:  # deleted meanwhile: a newer one exists
                continue
        v = sd.version
        weights = {k: t for k, t in sd.items() if k != "checksum"}
        if device == "cuda" and weights["0.weight"].device != x.device:
            weights = {k: t.to(x.device) for k, t in weights.items()}  # another GPU's pool
        if abs(checksum(weights) - float(sd["checksum"])) > 1e-6 * max(1.0, abs(float(sd["checksum"]))):
            mismatches += 1
        y = functional(model, weights, x)
        assert torch.isfinite(y).all()
        seen += 1
        del sd, weights, y
    results.put((rank, seen, mismatches, v))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--consumers", type=int, default=3)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--restart-at", type=int, default=10)
    p.add_argument("--pool", default=None)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args()
    ctx = mp.get_context("spawn")
    c = gpubuf.Client()
    for v in sorted({int(b["name"].split("/v")[1].split("/")[0]) for b in c.status()["buffers"]
                     if b["name"].startswith(PREFIX + "/v")}):
        gt.delete_state_dict(c, PREFIX, v)  # an earlier run's
    results = ctx.Queue()
    consumers = [ctx.Process(target=consumer, args=(r, a.device, a.pool, a.steps - 1, results))
                 for r in range(a.consumers)]
    for q in consumers:
        q.start()
    t = ctx.Process(target=trainer, args=(a.device, a.pool, a.steps, a.restart_at))
    t.start()
    while gt.latest_version(c, PREFIX) != a.restart_at:
        if not t.is_alive():
            sys.exit("the trainer died before the restart point")
        time.sleep(0.05)
    os.kill(t.pid, signal.SIGKILL)
    t.join()
    print(f"killed the trainer at version {a.restart_at}; starting another", flush=True)
    t = ctx.Process(target=trainer, args=(a.device, a.pool, a.steps, -1))
    t.start()
    t.join()
    if t.exitcode != 0:  # the consumers would wait for versions that never come
        for q in consumers:
            q.kill()
        sys.exit(f"the restarted trainer failed (exit status {t.exitcode})")
    ok = True
    for _ in consumers:
        rank, seen, mismatches, v = results.get(timeout=600)
        print(f"consumer {rank}: ran {seen} versions, last {v}, {mismatches} checksum mismatches")
        ok = ok and mismatches == 0 and v == a.steps - 1
    for q in consumers:
        q.join()
    gt.delete_state_dict(c, PREFIX, a.steps - 1)
    gt.delete_state_dict(c, PREFIX, a.steps - 2)
    print("weight sync ok" if ok else "weight sync FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
