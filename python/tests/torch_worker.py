"""Scenarios of gpubuf.torch, each run as a fresh process by test_torch.py (CPU
tensors, host pools) and test_torch_gpu.py (CUDA tensors, cuda-ipc and
cuda-vmm pools):

    torch_worker.py SCENARIO DEVICE POOL

DEVICE is "cpu" or "cuda"; POOL the pool tensors are copied into. The socket
comes from $GPUBUF_SOCKET. Prints "ok SCENARIO" and exits 0 when the checks
passed; exits 3 with a SKIP line when the scenario does not apply here. Every
wait is on observable state (a queue, a reference count), bounded only by a
generous deadline that fails the scenario."""
import os
import pickle
import signal
import sys
import time

import torch
import torch.multiprocessing as mp

import gpubuf
import gpubuf.torch as gt

DEADLINE = float(os.environ.get("GT_DEADLINE", 120))  # seconds: only a hung scenario reaches it

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.bool,
          torch.complex64, torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64,
          torch.uint8]


def skip(why):
    print("SKIP " + why)
    sys.exit(3)


def wait_for(what, cond):
    end = time.monotonic() + DEADLINE
    while not cond():
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(0.02)


def sample(dtype, device, n=24):
    x = torch.arange(n, dtype=torch.float64) - 5
    if dtype == torch.bool:
        return (x.to(device) % 3 == 0)
    if dtype.is_complex:
        return torch.complex(x, -x).to(dtype).to(device)
    if dtype == torch.uint8:
        x = x + 5
    return x.to(dtype).to(device)


def tensors(device):
    """name -> tensor: every dtype, and views, slices, non-contiguous ones."""
    out = {str(d): sample(d, device) for d in DTYPES}
    m = torch.arange(60, dtype=torch.float32, device=device).reshape(6, 10)
    out.update({"transposed": m.t(), "slice": m[1:5, 2:9:3], "row": m[4],
                "expanded": m[0:1].expand(3, 10), "empty": m[:0], "scalar": m[2, 3],
                "conj": sample(torch.complex64, device).conj(),
                "3d": torch.arange(120, device=device).reshape(2, 3, 20).permute(2, 0, 1)})
    return out


# ---- child processes (spawn: module-level functions) --------------------------------------

def child_install(device, pool):
    gt.install(cpu=(device == "cpu"), pool=pool)


def echo(device, pool, q, r):
    """Receive tensors, send back (key, clone on the host) pairs; a None ends it."""
    child_install(device, pool)
    while True:
        item = q.get()
        if item is None:
            break
        key, t = item
        info = (key, t.dtype, tuple(t.shape), t.detach().cpu().clone(), type(t).__name__,
                t.requires_grad)
        r.put(pickle.dumps(info))  # plain pickle: these go back by value
        del t, item


def writer(device, pool, q, r):
    """Receive a tensor, fill it with 7, say so; then wait for the end."""
    child_install(device, pool)
    t = q.get()
    t.fill_(7)
    if t.is_cuda:
        torch.cuda.synchronize()
    r.put("written")
    q.get()


def holder(device, pool, q, r):
    """Receive tensors and hold them until killed."""
    child_install(device, pool)
    held = [q.get() for _ in range(q.get())]
    gt.flush()  # the deletes of the received names are done: only references remain
    r.put(len(held))
    time.sleep(DEADLINE * 10)


def sender(device, pool, q):
    """Send one fresh tensor and exit at once."""
    child_install(device, pool)
    q.put(sample(torch.float32, device) * 3)


def pool_square(t):
    return (t * t).sum().item(), t * 2


def sd_consumer(prefix, device, cmd, r, pool=None):
    """Open versions of a state dict on command; hold or drop them. Opens
    name `pool` (a waiting open of a version not published yet waits in the
    pool it names); "write" finds the pool itself."""
    c = gpubuf.Client()
    held = {}
    while True:
        op, arg = cmd.get()
        if op == "open":
            sd = gt.open_state_dict(c, prefix, version=arg, timeout=DEADLINE, pool=pool)
            held[sd.version] = sd
            r.put((sd.version, {k: v.cpu().clone() for k, v in sd.items()}))
        elif op == "drop":
            del held[arg]
            r.put("dropped")
        elif op == "write":
            sd = gt.open_state_dict(c, prefix, version=arg, readonly=True)
            t = next(iter(sd.values()))
            print("opened read-only; writing", flush=True)
            if not t.is_cuda:
                t.fill_(1)  # host pools: SIGSEGV here
                os._exit(0)
            try:
                t.fill_(1)  # cuda-vmm: the GPU faults this process's context
                torch.cuda.synchronize()
            except RuntimeError as e:
                print("CUDA error:", e, flush=True)
                os._exit(42)
            os._exit(0)
        else:
            break


# ---- scenarios -------------------------------------------------------------------------------

EARLIER = set()  # ids of hand-over buffers in the daemon before this scenario began


def gt_buffers(c):
    """This scenario's hand-over buffers (those of an earlier scenario on the
    same daemon are that scenario's to check)."""
    return [b for b in c.status()["buffers"]
            if b["name"].startswith(".gpubuf-torch/") and b["id"] not in EARLIER]


def scenario_queue(device, pool, ctx):
    gt.install(cpu=(device == "cpu"), pool=pool)
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=echo, args=(device, pool, q, r))
    p.start()
    sent = tensors(device)
    param = torch.nn.Parameter(torch.randn(4, 5, device=device))
    sent["param"] = param
    for k, t in sent.items():
        q.put((k, t))
    for _ in sent:
        key, dtype, shape, value, tname, grad = pickle.loads(r.get())
        want = sent[key]
        assert dtype == want.dtype and shape == tuple(want.shape), (key, dtype, shape)
        assert torch.equal(value, want.detach().cpu()), key
        if key == "param":
            assert tname == "Parameter" and grad, (tname, grad)
    q.put(None)
    p.join(DEADLINE)
    assert p.exitcode == 0, p.exitcode
    # Every hand-over buffer went: received, deleted, released with the child.
    c = gt.client()
    wait_for("hand-over buffers to go", lambda: not gt_buffers(c))
    # Non-leaf tensors that require grad are refused, as torch does.
    from multiprocessing.reduction import ForkingPickler
    x = torch.randn(3, device=device, requires_grad=True) * 2
    try:
        ForkingPickler.dumps(x)
    except RuntimeError as e:
        assert "non-leaf" in str(e)
    else:
        raise AssertionError("a non-leaf tensor that requires grad was sent")


def scenario_zero_copy(device, pool, ctx):
    """A tensor that lives in a gpubuf buffer travels by id: the receiver's
    writes are the sender's memory."""
    gt.install(cpu=(device == "cpu"), pool=pool)
    c = gt.client()
    t = gt.zeros((4, 8), dtype=torch.float32, device=device, pool=pool, name="zc/shared")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=writer, args=(device, pool, q, r))
    p.start()
    view = t[1:3, ::2]  # a view: storage offset and strides travel too
    q.put(view)
    assert r.get(timeout=DEADLINE) == "written"
    if t.is_cuda:
        torch.cuda.synchronize()
    want = torch.zeros(4, 8)
    want[1:3, ::2] = 7
    assert torch.equal(t.cpu(), want), t
    assert c.stat("zc/shared", pool=pool)["refs"] == 2  # this process and the receiver, one each
    assert not gt_buffers(c)  # nothing was copied
    q.put(None)
    p.join(DEADLINE)
    wait_for("the receiver's reference to go", lambda: c.stat("zc/shared", pool=pool)["refs"] == 1)


def scenario_pool(device, pool, ctx):
    gt.install(cpu=(device == "cpu"), pool=pool)
    xs = [sample(torch.float32, device) + i for i in range(6)]
    with ctx.Pool(2, initializer=child_install, initargs=(device, pool)) as workers:
        got = workers.map(pool_square, xs)
    for x, (s, doubled) in zip(xs, got):
        assert abs(s - (x * x).sum().item()) < 1e-3
        assert torch.equal(doubled.cpu(), (x * 2).cpu())
    del got, doubled
    c = gt.client()
    wait_for("hand-over buffers to go", lambda: not gt_buffers(c))


def scenario_fork(device, pool, ctx):
    if device != "cpu":
        skip("fork after CUDA initialisation is not possible; CUDA uses spawn")
    gt.install(cpu=True, pool=pool)
    parent = gt.client()
    parent.status()  # connected in the parent
    fctx = mp.get_context("fork")
    q, r = fctx.Queue(), fctx.Queue()
    p = fctx.Process(target=echo, args=(device, pool, q, r))
    p.start()
    q.put(("x", sample(torch.float32, device)))
    key, _, _, value, _, _ = pickle.loads(r.get(timeout=DEADLINE))
    assert torch.equal(value, sample(torch.float32, "cpu"))
    q.put(None)
    p.join(DEADLINE)
    assert p.exitcode == 0
    assert gt.client() is parent


def scenario_killed(device, pool, ctx):
    """A receiver SIGKILLed with tensors held leaves no reference behind."""
    gt.install(cpu=(device == "cpu"), pool=pool)
    c = gt.client()
    shared = gt.zeros(1024, device=device, pool=pool, name="kill/shared")
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=holder, args=(device, pool, q, r))
    p.start()
    q.put(3)
    q.put(shared)
    q.put(shared[10:20])  # the same buffer: still one reference in that process
    q.put(sample(torch.float32, device))  # a copy
    assert r.get(timeout=DEADLINE) == 3
    assert c.stat("kill/shared", pool=pool)["refs"] == 2
    # the copy: the receiver's reference (the sender's goes once its copy ran)
    wait_for("the sender's reference to the copy to go",
             lambda: [b["refs"] for b in gt_buffers(c)] == [1])
    os.kill(p.pid, signal.SIGKILL)
    p.join(DEADLINE)
    wait_for("the killed receiver's references to go",
             lambda: c.stat("kill/shared", pool=pool)["refs"] == 1 and not gt_buffers(c))


def scenario_sender_exits(device, pool, ctx):
    gt.install(cpu=(device == "cpu"), pool=pool)
    q = ctx.Queue()
    p = ctx.Process(target=sender, args=(device, pool, q))
    p.start()
    p.join(DEADLINE)
    assert p.exitcode == 0
    t = q.get(timeout=DEADLINE)  # opened after the sender exited
    assert torch.equal(t.cpu(), sample(torch.float32, "cpu") * 3)
    c = gt.client()
    del t
    wait_for("hand-over buffers to go", lambda: not gt_buffers(c))


def scenario_lease(device, pool, ctx):
    """A tensor sent and never received goes when its lease runs out."""
    from multiprocessing.reduction import ForkingPickler
    # ttl: long enough that a loaded machine still sees the lease before it ends
    gt.install(cpu=(device == "cpu"), pool=pool, ttl=6, open_timeout=1)
    c = gt.client()
    before = c.status()["pools"]
    data = bytes(ForkingPickler.dumps(sample(torch.float32, device)))
    assert len(gt_buffers(c)) == 1 and gt_buffers(c)[0]["lease_left"] is not None
    wait_for("the lease to run out", lambda: not gt_buffers(c))
    used = {p["name"]: p["used"] for p in c.status()["pools"]}
    assert used == {p["name"]: p["used"] for p in before}, (used, before)
    try:
        pickle.loads(data)
    except (gpubuf.NotFoundError, gpubuf.WaitTimeoutError) as e:
        print("late receiver:", type(e).__name__, e)
    else:
        raise AssertionError("a ticket whose lease ran out opened")


def scenario_sd_lease(device, pool, ctx):
    """publish_state_dict(ttl=...): every buffer of the version has the lease
    (the tensors too, where they are sealed on a CUDA stream, which carries no
    metadata), and the whole version goes when it runs out."""
    c = gt.client()
    prefix = "sdlease/%d" % os.getpid()
    sd = {"w": torch.ones(8, 4, device=device), "b": torch.arange(4, device=device)}
    before = {p["name"]: p["used"] for p in c.status()["pools"]}
    v = gt.publish_state_dict(c, prefix, sd, pool=pool, ttl=6)  # see scenario_lease
    gt.flush()  # CUDA: this process's views go once the copies ran
    mine = [b for b in c.status()["buffers"] if b["name"].startswith(prefix + "/")]
    assert len(mine) == 3 and all(b["lease_left"] is not None for b in mine), mine
    wait_for("the version's leases to run out",
             lambda: not [b for b in c.status()["buffers"] if b["id"] in
                          {m["id"] for m in mine}])
    assert gt.latest_version(c, prefix) is None, v
    assert {p["name"]: p["used"] for p in c.status()["pools"]} == before


def scenario_versions(device, pool, ctx):
    c = gt.client()
    prefix = "sd/policy"
    sd0 = {"w": torch.full((64, 32), 1.0, device=device),
           "b": torch.arange(32, device=device, dtype=torch.float16),
           "mask": sample(torch.bool, device), "bf": sample(torch.bfloat16, device),
           "z": sample(torch.complex64, device), "steps": torch.tensor(5, device=device)}
    assert gt.publish_state_dict(c, prefix, sd0, pool=pool) == 0
    assert gt.latest_version(c, prefix) == 0
    cmd, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=sd_consumer, args=(prefix, device, cmd, r, pool))
    p.start()
    cmd.put(("open", "latest"))
    v, got = r.get(timeout=DEADLINE)
    assert v == 0 and list(got) == list(sd0)
    for k in sd0:
        assert got[k].dtype == sd0[k].dtype and torch.equal(got[k], sd0[k].cpu()), k
    # N+1 while the consumer holds N: both alive; N is deleted (keep_last=1)
    sd1 = {k: (t + 1 if t.dtype != torch.bool else ~t) for k, t in sd0.items()}
    assert gt.publish_state_dict(c, prefix, sd1, pool=pool) == 1
    assert gt.latest_version(c, prefix) == 1
    gt.flush()  # CUDA: this process's views of its copies go once the copies ran
    v0 = [b for b in c.status()["buffers"] if b["name"].startswith(prefix + "/v0/")]
    assert v0 and all(b["state"] == "deleted" and b["refs"] == 1 for b in v0
                      if not b["name"].endswith("/index")), v0
    cmd.put(("open", 1))
    v, got1 = r.get(timeout=DEADLINE)
    assert v == 1 and torch.equal(got1["w"], sd1["w"].cpu())
    # a waiting open of the next version
    cmd.put(("open", 2))
    sd2 = {k: t * 0 if t.dtype != torch.bool else t for k, t in sd1.items()}
    gt.publish_state_dict(c, prefix, sd2, pool=pool, keep_last=2)
    v, got2 = r.get(timeout=DEADLINE)
    assert v == 2 and float(got2["w"].abs().sum()) == 0
    # N goes with its last consumer
    cmd.put(("drop", 0))
    assert r.get(timeout=DEADLINE) == "dropped"
    wait_for("version 0 to be freed", lambda: not any(
        b["name"].startswith(prefix + "/v0/") for b in c.status()["buffers"]))
    cmd.put(("stop", None))
    p.join(DEADLINE)
    names = [b["name"] for b in c.status()["buffers"]]
    assert any(n.startswith(prefix + "/v1/") for n in names)  # keep_last=2: v1 and v2 stay
    assert gt.delete_state_dict(c, prefix, 1) > 0 and gt.delete_state_dict(c, prefix, 2) > 0
    wait_for("every version to go", lambda: not any(
        b["name"].startswith(prefix) for b in c.status()["buffers"]))


def scenario_readonly(device, pool, ctx):
    """A read-only consumer that writes faults in its own process only."""
    c = gt.client()
    kind = [p for p in c.status()["pools"] if p["name"] == pool][0]["kind"]
    if kind == "cuda-ipc":
        skip("cuda-ipc pools cannot map read-only (docs/security.md)")
    prefix = "ro/" + pool  # see scenario_assign
    sd = {"w": torch.full((1024,), 3.0, device=device)}
    v = gt.publish_state_dict(c, prefix, sd, pool=pool)
    cmd, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=sd_consumer, args=(prefix, device, cmd, r))
    p.start()
    cmd.put(("write", v))
    p.join(DEADLINE)
    # SIGSEGV (host), a CUDA error (cuda-vmm)
    assert p.exitcode == (42 if device == "cuda" else -signal.SIGSEGV), p.exitcode
    print("read-only writer ended with", p.exitcode)
    mine = gt.open_state_dict(c, prefix, version=v, readonly=False)
    assert float(mine["w"].min()) == 3.0 and float(mine["w"].max()) == 3.0
    del mine
    wait_for("the writer's references to go", lambda: all(
        b["refs"] == 0 for b in c.status()["buffers"] if b["name"].startswith(prefix + "/")))
    assert gt.delete_state_dict(c, prefix, v) == 2


def scenario_assign(device, pool, ctx):
    """Each pool its own prefix, deleted at the end: the GPU tests run every
    scenario against one gpubufd, and open_state_dict without pool= refuses
    a version published in two pools (scenario_two_pools)."""
    c = gt.client()
    prefix = "assign/" + pool
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    model.to(device)
    v = gt.publish_state_dict(c, prefix, model.state_dict(), pool=pool)
    sd = gt.open_state_dict(c, prefix, readonly=False)
    other = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))
    other.to(device)
    other.load_state_dict(sd)  # a copy: works on every torch
    x = torch.randn(3, 8, device=device)
    assert torch.equal(other(x), model(x))
    try:
        other.load_state_dict(sd, assign=True)
        assigned = True
    except TypeError:
        assigned = False
    if assigned:
        assert other[0].weight.data_ptr() == sd["0.weight"].data_ptr()  # zero-copy
        assert torch.equal(other(x), model(x))
    del sd, other
    assert gt.delete_state_dict(c, prefix, v) == 5  # 4 tensors and the index
    if not assigned:
        skip("torch %s has no load_state_dict(assign=True) (torch >= 2.1)" % torch.__version__)


def scenario_two_pools(device, pool, ctx):
    """The same prefix and version in two pools: open_state_dict without
    pool= says so instead of picking one; with pool= each opens its own."""
    c = gt.client()
    other = [p["name"] for p in c.status()["pools"] if p["name"] != pool][0]
    mine = {"w": torch.full((16,), 1.0, device=device)}
    theirs = {"w": torch.full((16,), 2.0, device=device)}
    assert gt.publish_state_dict(c, "two/sd", mine, pool=pool) == 0
    assert gt.publish_state_dict(c, "two/sd", theirs, pool=other) == 0
    try:
        gt.open_state_dict(c, "two/sd")
    except gpubuf.InvalidArgumentError as e:
        assert "name the one to open" in str(e) and repr(pool) in str(e), e
    else:
        raise AssertionError("a version published in two pools was opened without pool=")
    # an explicit version: the default pool's, when it has one
    default = [p["name"] for p in c.status()["pools"] if p["default"]][0]
    got = gt.open_state_dict(c, "two/sd", version=0)
    assert float(got["w"].max()) == (1.0 if default == pool else 2.0), (default, got["w"])
    del got
    for p, want in ((pool, 1.0), (other, 2.0)):
        sd = gt.open_state_dict(c, "two/sd", pool=p)
        assert float(sd["w"].min()) == want == float(sd["w"].max()), (p, sd["w"])
        del sd
        assert gt.delete_state_dict(c, "two/sd", 0, pool=p) == 2
    sd = {"w": torch.full((16,), 3.0, device=device)}
    assert gt.publish_state_dict(c, "two/sd", sd, pool=other, version=4) == 4
    got = gt.open_state_dict(c, "two/sd")  # in one pool only: found there
    assert got.version == 4 and float(got["w"].max()) == 3.0
    del got
    assert gt.delete_state_dict(c, "two/sd", 4) == 2


def scenario_errors(device, pool, ctx):
    c = gt.client()
    # pool full: the documented exceptions, nothing left behind
    big = torch.zeros(4 << 20, dtype=torch.uint8, device=device)
    try:
        gt.publish_state_dict(c, "full/sd", {"a": big, "b": big}, pool="tiny")
    except gpubuf.PoolFullError as e:
        print("publish:", type(e).__name__, e)
    else:
        raise AssertionError("a state dict larger than its pool was published")
    assert not [b for b in c.status()["buffers"] if b["name"].startswith("full/")]
    from multiprocessing.reduction import ForkingPickler
    gt.install(cpu=(device == "cpu"), pool="tiny")
    try:
        ForkingPickler.dumps(big)
    except gpubuf.PoolFullError as e:
        print("send:", type(e).__name__, e)
    else:
        raise AssertionError("a tensor larger than its pool was sent")
    assert not gt_buffers(c)
    # a pool of the other kind: the receiver would get the tensor on another device
    other = [p["name"] for p in c.status()["pools"]
             if (p["kind"] == "host") == (device == "cuda")]
    if other:
        gt.install(cpu=(device == "cpu"), pool=other[0])
        try:
            ForkingPickler.dumps(sample(torch.float32, device))
        except gpubuf.NoPoolError as e:
            print("other kind:", type(e).__name__, e)
        else:
            raise AssertionError("a %s tensor was sent through pool %s" % (device, other[0]))
    gt.uninstall()
    # no daemon: a socket nobody listens on
    import socket as so
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), "gt-nodaemon-%d.sock" % os.getpid())
    s = so.socket(so.AF_UNIX, so.SOCK_STREAM)
    s.bind(path)
    try:
        gt._st.client = None
        gt.install(cpu=(device == "cpu"), pool=pool, socket=path)
        try:
            ForkingPickler.dumps(sample(torch.float32, device))
        except gpubuf.NoDaemonError as e:
            print("no daemon:", type(e).__name__, e)
        else:
            raise AssertionError("sent without a daemon")
    finally:
        s.close()
        os.unlink(path)
    # uninstall gives torch its reducers back
    gt.uninstall()
    from torch.multiprocessing import reductions
    assert ForkingPickler._extra_reducers[torch.Tensor] is reductions.reduce_tensor


def scenario_stream(device, pool, ctx):
    """The copy into the hand-over buffer is still queued behind a long
    kernel when the tensor is sent: the receiver still sees the final values."""
    if device != "cuda":
        skip("stream order is a CUDA matter")
    gt.install(pool=pool)
    q, r = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=echo, args=(device, pool, q, r))
    p.start()
    x = torch.zeros(1 << 20, device="cuda")
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time on the current stream
    x.fill_(42)
    q.put(("x", x))  # the copy follows the sleep and the fill on this stream
    key, _, _, value, _, _ = pickle.loads(r.get(timeout=DEADLINE))
    assert float(value.min()) == 42 and float(value.max()) == 42
    q.put(None)
    p.join(DEADLINE)


def scenario_cai(device, pool, ctx):
    """__cuda_array_interface__ carries the producer's layout (dtype, shape,
    strides, byte offset), as __dlpack__ does; bfloat16 exports bytes."""
    if device != "cuda":
        skip("the CUDA Array Interface is for CUDA pools (host: test_batch_meta.py)")
    c = gt.client()
    b = c.alloc(16 + 4 * 32, "cai/colmajor", pool, dtype="float32", shape=(4, 8),
                strides=(1, 4), byte_offset=16)
    src = torch.arange(32, dtype=torch.float32, device="cuda").reshape(8, 4).t()  # (4, 8)
    torch.from_dlpack(b.as_array("uint8"))[16:].view(torch.float32).copy_(
        src.t().reshape(-1))
    torch.cuda.synchronize()
    b.seal(sync=True)
    o = c.open("cai/colmajor", pool=pool)  # names are per pool
    cai = o.__cuda_array_interface__
    assert cai["shape"] == (4, 8) and cai["typestr"] == "<f4" and cai["strides"] == (4, 16), cai
    assert cai["data"][0] == o.address + 16
    t = torch.as_tensor(o, device="cuda")
    assert t.shape == (4, 8) and t.stride() == (1, 4) and torch.equal(t, src), t
    h = c.alloc(name="cai/bf16", pool=pool, dtype=(4, 16, 1), shape=(4,))
    h.seal(sync=True)
    assert h.__cuda_array_interface__["shape"] == (8,)  # bytes: the interface has no bfloat16
    del t
    for x in (o, b, h):
        x.release()


def scenario_as_tensor(device, pool, ctx):
    """as_tensor(): the whole buffer in C order (plain views) and every other
    shape (as_strided) are the elements torch.as_strided picks from the same
    bytes, in place: written through the tensor, read through the buffer."""
    c = gt.client()
    # (size, the buffer's layout, as_tensor's dtype and shape, shape, strides,
    # offset in elements) expected
    cases = [
        (4096, {}, torch.float32, None, (1024,), (1,), 0),
        (4096, {}, torch.float32, (32, 32), (32, 32), (32, 1), 0),
        (4096, {}, torch.int64, (2, 4, 8), (2, 4, 8), (32, 8, 1), 0),
        (4096, {}, None, None, (4096,), (1,), 0),
        (4098, {}, torch.float32, None, (1024,), (1,), 0),  # a tail of no whole element
        (4096, {}, torch.float32, (10,), (10,), (1,), 0),  # less than the whole buffer
        (8, {}, torch.float64, (), (), (), 0),  # no dimension
        (96, {"dtype": "float32", "shape": (2, 3, 4)}, None, None, (2, 3, 4), (12, 4, 1), 0),
        (128, {"dtype": "int64", "shape": (16,)}, None, None, (16,), (1,), 0),
        (128, {"dtype": "float32", "shape": (4, 8), "strides": (1, 4)}, None, None, (4, 8), (1, 4), 0),
        (16 + 4 * 32, {"dtype": "float32", "shape": (4, 8), "strides": (1, 4), "byte_offset": 16},
         None, None, (4, 8), (1, 4), 4),
    ]
    for size, layout, dtype, shape, want_shape, want_strides, want_offset in cases:
        b = c.alloc(size, None, pool, **layout)
        raw = torch.from_dlpack(b.as_array("uint8") if layout else b)
        raw.copy_(torch.arange(size, dtype=torch.int64).remainder(251).to(torch.uint8))
        t = gt.as_tensor(b, dtype, shape)
        what = (size, layout, dtype, shape)
        assert t.device.type == device, what
        assert (tuple(t.shape), t.stride()) == (want_shape, want_strides), (what, t.shape, t.stride())
        assert t.data_ptr() == raw.data_ptr() + want_offset * t.element_size(), what
        dt = t.dtype
        n = size // t.element_size()
        flat = raw.cpu()[: n * t.element_size()].view(dt)
        want = torch.as_strided(flat, want_shape, want_strides, want_offset)
        assert torch.equal(t.cpu(), want), what
        t.fill_(1)  # in place: the buffer's own bytes change
        assert torch.equal(torch.as_strided(raw.cpu()[: n * t.element_size()].view(dt), want_shape,
                                             want_strides, want_offset), torch.ones_like(want)), what
        del t, raw
        b.release()


def main():
    scenario, device, pool = sys.argv[1], sys.argv[2], sys.argv[3]
    if device == "cuda" and not torch.cuda.is_available():
        skip("torch %s has no CUDA here" % torch.__version__)
    ctx = mp.get_context("spawn")
    try:
        with gpubuf.Client() as c:
            EARLIER.update(b["id"] for b in gt_buffers(c))
    except gpubuf.Error:
        pass  # no daemon: the scenario says what it expects
    try:
        globals()["scenario_" + scenario](device, pool, ctx)
    finally:
        end_children()
    print("ok " + scenario)


def end_children():
    """SIGKILL the children a scenario left (a failed check leaves a writer
    waiting on its queue, or a holder holding references): else this process
    would wait for them at exit (multiprocessing joins its children), and
    their references would outlive the scenario into the daemon's next one."""
    import multiprocessing
    for p in multiprocessing.active_children():
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.join(DEADLINE)


if __name__ == "__main__":
    main()
