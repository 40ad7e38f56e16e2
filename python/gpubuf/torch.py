"""gpubuf.torch: PyTorch tensors through gpubuf (docs/torch.md).

    import gpubuf.torch
    gpubuf.torch.install()          # torch.multiprocessing sends CUDA tensors through gpubufd

    gpubuf.torch.publish_state_dict(client, "policy", model.state_dict())   # trainer
    sd = gpubuf.torch.open_state_dict(client, "policy")                      # inference

Tensors sent through torch.multiprocessing queues, pipes, Pool and spawn
arguments travel as a gpubuf buffer id plus their storage offset, dtype, shape
and strides; the receiver opens the buffer (one daemon reference per process,
released when its tensors are freed). The daemon counts references per
process, frees them when a process dies, and a sent buffer carries a lease, so
nothing leaks when a receiver crashes or never receives.
"""
import atexit
import collections
import itertools
import json
import math
import os
import queue
import threading
from multiprocessing.reduction import ForkingPickler

try:
    import torch
    import torch.multiprocessing  # its init_reductions() runs first: install() overrides it
except ImportError as e:  # pragma: no cover - exercised where torch is missing
    raise ImportError(
        "gpubuf.torch needs PyTorch (import torch failed: %s); install it (Debian: "
        "apt-get install python3-torch) or use gpubuf without gpubuf.torch" % e) from e

import gpubuf
from torch.multiprocessing.reductions import StorageWeakRef

__all__ = ["install", "uninstall", "installed", "client", "flush", "empty", "zeros", "as_tensor",
           "publish_state_dict", "open_state_dict", "latest_version", "delete_state_dict",
           "DEFAULT_TTL", "DEFAULT_OPEN_TIMEOUT"]

#: Seconds a tensor sent through a queue stays receivable (its buffer's lease):
#: a buffer nobody received by then is deleted and its memory freed.
DEFAULT_TTL = 60.0
#: Seconds a receiver waits for a sent buffer's seal (the sender seals
#: asynchronously, stream-ordered).
DEFAULT_OPEN_TIMEOUT = 30.0

# DLPack (code, bits, lanes) of each torch dtype gpubuf carries.
_DL = {
    torch.bool: (6, 8, 1), torch.uint8: (1, 8, 1), torch.int8: (0, 8, 1),
    torch.int16: (0, 16, 1), torch.int32: (0, 32, 1), torch.int64: (0, 64, 1),
    torch.float16: (2, 16, 1), torch.bfloat16: (4, 16, 1), torch.float32: (2, 32, 1),
    torch.float64: (2, 64, 1), torch.complex64: (5, 64, 1), torch.complex128: (5, 128, 1),
}
_BY_NAME = {str(d).split(".")[1]: d for d in _DL}
# dtypes every torch takes through DLPack (bool only from 2.x: code 6)
_NATIVE_DLPACK = {n for n in _BY_NAME if n != "bool"}


_NAME_OF = {d: n for n, d in _BY_NAME.items()}


def _dtype_name(dtype):
    n = _NAME_OF.get(dtype)
    return n if n is not None else str(dtype).split(".")[1]


# ---- the per-process client ------------------------------------------------------------

class _State:
    def __init__(self):
        self.lock = threading.RLock()
        self.pid = None
        self.client = None
        self.socket = None      # None: $GPUBUF_SOCKET or the default
        self.given = None       # a Client passed to install(), used in its own process only
        self.pools = None       # status()["pools"], cached per process
        self.counter = itertools.count()
        self.pool_cache = {}    # _pool_for()'s answers, per process
        self.pool_pid = None


_st = _State()


def client():
    """This process's gpubuf Client for gpubuf.torch: connected on first use,
    and again in a forked child (a connection belongs to the process that made it)."""
    with _st.lock:
        pid = os.getpid()
        if _st.given is not None and _st.given_pid == pid and not _st.given.closed:
            return _st.given
        if _st.client is None or _st.pid != pid or _st.client.closed:
            _st.client = gpubuf.Client(_st.socket)
            _st.pid = pid
            _st.pools = None
            _st.pool_cache = {}
        return _st.client


def _pools(c):
    with _st.lock:
        if _st.pools is None or _st.pid != os.getpid():
            _st.pools = c.status()["pools"]
        return _st.pools


def _hex_uuid(u):
    """A GPU UUID as 32 lowercase hex digits ("GPU-8f0c...-..." or a uuid object)."""
    s = str(u).lower()
    if s.startswith("gpu-"):
        s = s[4:]
    s = s.replace("-", "")
    return s if len(s) == 32 else None


def _device_uuid(index):
    try:
        return _hex_uuid(torch.cuda.get_device_properties(index).uuid)
    except Exception:  # a torch without .uuid
        return None


def _pool_for(c, device, pool):
    """_resolve_pool(), remembered per process by device and pool argument
    (the pools are status()'s, cached per process too): a send resolves its
    pool once, not by a device-property look-up and a scan of the pools."""
    try:
        key = (device.type, device.index, pool if not isinstance(pool, dict)
               else tuple(sorted(pool.items(), key=str)))
        hash(key)
    except TypeError:
        return _resolve_pool(c, device, pool)
    with _st.lock:
        if _st.pool_pid != os.getpid():
            _st.pool_cache, _st.pool_pid = {}, os.getpid()
        found = _st.pool_cache.get(key)
    if found is None:
        found = _st.pool_cache[key] = (_resolve_pool(c, device, pool),)
    return found[0]


def _resolve_pool(c, device, pool):
    """The pool a tensor of `device` is copied into: pool (a name, or a dict
    by "cpu" / CUDA index), else the pool of that GPU (by UUID, else by
    ordinal) or the first host pool for CPU tensors, else the default pool.
    A pool of the other kind (host for a CUDA tensor, CUDA for a CPU one)
    raises NoPoolError: the receiver would get its tensor on another device."""
    if isinstance(pool, dict):
        key = "cpu" if device.type == "cpu" else (device.index or 0)
        pool = pool.get(key, pool.get(str(key)))
    pools = _pools(c)
    if pool is None and device.type == "cpu":
        pool = next((p["name"] for p in pools if p["kind"] == "host"), None)
        if pool is None:
            raise gpubuf.NoPoolError("gpubufd has no host pool for CPU tensors: start it with "
                                     "--pool NAME=host,capacity=... or pass pool=")
    elif pool is None:
        pool = _cuda_pool(pools, device)  # None: the default pool
    for p in pools:
        if (p["name"] == pool) if pool is not None else p.get("default"):
            if (p["kind"] == "host") != (device.type == "cpu"):
                raise gpubuf.NoPoolError(
                    "pool %r is a %s pool: a %s tensor needs a %s pool (pass pool=, or start "
                    "gpubufd with one)" % (p["name"], p["kind"], device.type,
                                           "host" if device.type == "cpu" else
                                           "cuda-ipc or cuda-vmm"))
    return pool


def _cuda_pool(pools, device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = _device_uuid(index)
    cuda = [p for p in pools if p["kind"] != "host"]
    for p in cuda:
        if uuid and p.get("device_uuid") and _hex_uuid(p["device_uuid"]) == uuid:
            return p["name"]
    for p in cuda:
        if p["device"] == index:
            return p["name"]
    return None


# ---- tensors that live in gpubuf buffers ----------------------------------------------

# Storage address -> (buffer id, weak reference to the storage). An entry
# counts only while that storage lives (torch's own StorageWeakRef), so an
# address freed and reused by another storage never matches.
_owned = {}
_owned_lock = threading.Lock()
_opened = {}  # buffer id -> StorageWeakRef of its storage in this process
_opened_lock = threading.Lock()
_Untyped = getattr(torch, "UntypedStorage", None) or getattr(torch, "_UntypedStorage")


if hasattr(torch.Tensor, "untyped_storage"):
    def _storage(t):
        return t.untyped_storage()
else:  # torch < 2.0
    def _storage(t):
        return t.storage()


_sweep = {"owned": 64, "opened": 64}  # sweep expired entries when a table passes this


def _swept(table, which, expired):
    if len(table) > _sweep[which]:
        for k in [k for k, e in table.items() if expired(e)]:
            del table[k]
        _sweep[which] = max(64, 2 * len(table))


def _remember(base, buf_id):
    """Remember a 1-D base tensor as the storage of buffer buf_id: sent, it
    travels by id (_owned); received here later, the same storage serves it,
    without a second reference (_opened). A hand-over's receiver pays this
    once per tensor: no lists, no lambdas."""
    ptr, ref = base.data_ptr(), StorageWeakRef(_storage(base))
    with _owned_lock:
        if len(_owned) > _sweep["owned"]:
            _swept(_owned, "owned", _owned_expired)
        _owned[ptr] = (buf_id, ref)
    with _opened_lock:
        if len(_opened) > _sweep["opened"]:
            _swept(_opened, "opened", _opened_expired)
        _opened[buf_id] = ref


def _owned_expired(e):
    return e[1].expired()


def _opened_expired(e):
    return e.expired()


def _remember_all(pairs):
    """_remember() of many (1-D base tensor, buffer id) pairs."""
    for base, buf_id in pairs:
        _remember(base, buf_id)


def _lookup(t):
    """(buffer id, storage offset in bytes) when t's storage is a gpubuf buffer."""
    try:
        ptr = _storage(t).data_ptr()
    except Exception:
        return None
    with _owned_lock:
        e = _owned.get(ptr)
    if e is None or e[1].expired():
        return None
    return e[0], t.storage_offset() * t.element_size()


def _revive(ref):
    """A 1-D uint8 tensor over the storage ref points to, or None if it went."""
    if ref.expired():
        return None
    st = _Untyped._new_with_weak_ptr(ref.cdata)
    if st is None:
        return None
    t = torch.empty(0, dtype=torch.uint8, device=st.device)
    try:
        t.set_(st)
    except (TypeError, RuntimeError):
        ts = getattr(torch.storage, "TypedStorage", None) or torch.storage._TypedStorage
        t.set_(ts(wrap_storage=st, dtype=torch.uint8))
    return t


# torch.from_dlpack() spends most of its ~10 us in torch.cuda.current_stream()
# (a device-name parse and a Stream object); the raw pointer of the current
# stream and torch's capsule import take ~3 us. Both are torch internals, so
# each is looked up once and torch.from_dlpack() stays the fallback.
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_import_capsule = getattr(torch._C, "_from_dlpack", None)


_cuda_ready = False


def _cuda_init():
    global _cuda_ready
    torch.cuda.init()
    _cuda_ready = True


def _from_dlpack(x):
    """torch.from_dlpack(x) for a gpubuf Buffer or ArrayView, with the
    consumer's stream (torch's current stream on x's GPU) passed as DLPack
    asks (1 for the legacy default stream), so a stream-ordered seal orders it."""
    if _import_capsule is None:
        return torch.from_dlpack(x)
    kind, index = x.__dlpack_device__()
    if kind == 2:  # kDLCUDA
        if _raw_stream is None:
            return torch.from_dlpack(x)
        if not _cuda_ready:  # torch's own checks first (a bad fork, no driver)
            _cuda_init()
        s = _raw_stream(index)
        return _import_capsule(x.__dlpack__(stream=s or 1))
    return _import_capsule(x.__dlpack__())


_ITEMSIZE = {d: torch.empty((), dtype=d).element_size() for d in _DL}


def _itemsize(dtype):
    n = _ITEMSIZE.get(dtype)
    return n if n is not None else torch.empty((), dtype=dtype).element_size()


_UNREAD = object()


def _base_tensor(buf, layout=_UNREAD):
    """The whole buffer as a 1-D uint8 tensor (zero-copy), remembered as
    gpubuf storage. layout: buf.layout, when the caller has read it already."""
    if layout is _UNREAD:
        layout = buf.layout
    # The buffer's bytes, whatever layout it carries.
    base = _from_dlpack(buf.as_array("uint8") if layout is not None else buf)
    _remember(base, buf.id)
    return base


def _view(base, dtype, shape, strides, offset_bytes):
    itemsize = _itemsize(dtype)
    if offset_bytes % itemsize:
        raise ValueError("storage offset %d is not a multiple of the item size" % offset_bytes)
    shape, strides, n = tuple(shape), tuple(strides), base.numel()
    if offset_bytes == 0 and n and math.prod(shape) * itemsize == n and \
            strides == ((1,) if len(shape) == 1 else _contiguous(shape)):
        # The whole buffer in C order (the common case): plain views, not
        # as_strided (a hand-over's receiver makes one per tensor).
        flat = base if dtype == torch.uint8 else base.view(dtype)
        return flat if len(shape) == 1 else flat.view(shape)
    if dtype == torch.uint8:
        flat = base
    else:
        flat = (base if n % itemsize == 0 else base[: n - n % itemsize]).view(dtype)
    return torch.as_strided(flat, shape, strides, offset_bytes // itemsize)


def as_tensor(buf, dtype=None, shape=None):
    """A tensor over a gpubuf Buffer (zero-copy) that gpubuf.torch knows lives
    in gpubuf: sent through a queue, it travels by id, not as a copy. dtype
    and shape default to the buffer's layout (else uint8, one dimension).
    The tensor keeps the buffer's daemon reference; release `buf` when you like."""
    layout = buf.layout
    base = _base_tensor(buf, layout)
    if dtype is None and layout is not None and layout["dtype"] in _BY_NAME:
        dtype = _BY_NAME[layout["dtype"]]
        if shape is None:
            shape = tuple(layout["shape"])
            strides = layout["strides"] or _contiguous(shape)
            return _view(base, dtype, shape, strides, layout["byte_offset"])
    dtype = dtype or torch.uint8
    if shape is None:
        shape = (base.numel() // _itemsize(dtype),)
    return _view(base, dtype, tuple(shape), _contiguous(tuple(shape)), 0)


def _contiguous(shape):
    strides, s = [], 1
    for n in reversed(shape):
        strides.append(s)
        s *= max(n, 1)
    return tuple(reversed(strides))


def empty(shape, *, dtype=torch.float32, device=None, pool=None, name=None, client=None):
    """A tensor that lives in a new gpubuf buffer (sealed), so sending it
    through a torch.multiprocessing queue copies nothing. device: "cpu" (a
    host pool), a CUDA device, or None (the current CUDA device, or "cpu"
    without CUDA). name: publish it under this name (it then outlives this
    process until deleted); anonymous buffers are freed with their last
    reference, so keep the tensor until receivers have opened it."""
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(int(n) for n in shape)
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    c = client or globals()["client"]()
    itemsize = _itemsize(dtype)
    numel = math.prod(shape)
    p = _pool_for(c, device, pool)
    buf = c.alloc(max(numel * itemsize, 1), name, p, dtype=_DL[dtype], shape=shape)
    try:
        buf.seal(sync=True)
        base = _base_tensor(buf)
    finally:
        buf.release()
    return _view(base, dtype, shape, _contiguous(shape), 0)


def zeros(shape, *, dtype=torch.float32, device=None, pool=None, name=None, client=None):
    """empty(), filled with zeros."""
    t = empty(shape, dtype=dtype, device=device, pool=pool, name=name, client=client)
    t.zero_()
    if t.is_cuda:
        torch.cuda.current_stream(t.device).synchronize()
    return t


# ---- copies in flight ------------------------------------------------------------------

# Work a helper thread does so that senders and receivers do not wait for it:
# releasing the sender's view of a buffer a stream-ordered copy still writes
# (once the copy's event completed: the mapping stays while the GPU writes
# it, and the sending thread never waits for the GPU), and the receiver's
# delete of a hand-over buffer's name (a round trip).
_helper = {"pid": None, "queue": None}
_helper_lock = threading.Lock()


def _helper_run(q):
    while True:
        fn = q.get()
        try:
            fn()
        except Exception:  # a delete that lost a race with the lease: nothing to do
            pass
        finally:
            q.task_done()


def _later(fn):
    with _helper_lock:
        if _helper["pid"] != os.getpid():  # first use, or a forked child
            _helper["queue"] = queue.Queue()
            _helper["pid"] = os.getpid()
            threading.Thread(target=_helper_run, args=(_helper["queue"],), daemon=True,
                             name="gpubuf.torch helper").start()
        _helper["queue"].put(fn)


def _release_after(ev, bufs, keep=None):
    """Release bufs (and drop keep) once event ev completed, on the helper."""
    def release(ev=ev, bufs=bufs, keep=keep):
        try:
            ev.synchronize()
        finally:
            for b in bufs:
                b.release()
    _later(release)


def flush():
    """Wait for this process's background work: the release of buffers its
    stream-ordered copies wrote (after those copies ran) and the deletes of
    hand-over names it received. Runs at exit too."""
    q = _helper["queue"]
    if q is not None and _helper["pid"] == os.getpid():
        q.join()


_release_all_at_exit = flush


atexit.register(_release_all_at_exit)


def _unique_name():
    return ".gpubuf-torch/%d-%x-%d" % (os.getpid(), id(_st), next(_st.counter))


def _copy_out(c, t, pool, ttl):
    """Copy t's elements (C order) into a new named buffer with a lease,
    stream-ordered; returns its name, id and pool."""
    nbytes = t.numel() * t.element_size()
    name = _unique_name()
    pool = _pool_for(c, t.device, pool)
    buf = c.alloc(max(nbytes, 1), name, pool, ttl=ttl)
    buf_id = buf.id
    try:
        dst = _from_dlpack(buf)  # 1-D uint8, exactly nbytes (or 1 when empty)
        if dst.is_cuda:
            index = dst.device.index
            if t.is_cuda and t.device != dst.device:
                torch.cuda.current_stream(index).wait_stream(torch.cuda.current_stream(t.device))
        if nbytes:
            (dst if t.dtype == torch.uint8 else dst.view(t.dtype)).view(t.shape).copy_(
                t, non_blocking=True)
        if dst.is_cuda:
            # The copy runs on the current stream of dst's GPU: sealed in its
            # order (the raw stream handle: no Stream object needed), and an
            # event after it tells the helper when the copy ran. Until then
            # the helper holds t (what record_stream would protect: its block
            # cannot go back to the caching allocator) and the view.
            raw = _raw_stream(index) if _raw_stream is not None else \
                torch.cuda.current_stream(index).cuda_stream
            buf.seal(stream=raw)
            ev = torch.cuda.Event()
            if index == torch.cuda.current_device():
                ev.record()
            else:
                ev.record(torch.cuda.current_stream(index))
            del dst
            _release_after(ev, [buf], keep=t)
            buf = None
        else:
            if t.is_cuda:
                torch.cuda.current_stream(t.device).synchronize()
            del dst
            buf.seal()
        return name, buf_id, pool
    except BaseException:
        if buf is not None:
            buf.release()
            buf = None
            try:
                c.delete(name, pool=pool)
            except gpubuf.Error:
                pass
        raise
    finally:
        if buf is not None:
            buf.release()


# ---- the reducers ----------------------------------------------------------------------

class _Config:
    installed = False
    pool = None
    cpu = False
    ttl = DEFAULT_TTL
    open_timeout = DEFAULT_OPEN_TIMEOUT
    saved = {}


_cfg = _Config()
_TYPES = (torch.Tensor, torch.nn.Parameter)


def _rebuild(ticket):
    """Receiver: open the sent buffer by id (once per process while its
    tensors live) and rebuild the tensor over it."""
    (version, buf_id, name, pool, one_shot, offset, dtype, shape, strides, requires_grad,
     is_param, socket) = ticket
    if version != 1:
        raise RuntimeError("a gpubuf.torch ticket of version %r: the sender runs another "
                           "gpubuf version" % (version,))
    if socket and _st.socket is None and not os.environ.get("GPUBUF_SOCKET"):
        _st.socket = socket  # configured nowhere here: the sender's daemon
    c = client()
    base = _opened_base(c, buf_id, name, pool, one_shot)
    t = _view(base, _BY_NAME[dtype], shape, strides, offset)
    if is_param:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    if requires_grad:
        t.requires_grad_(True)
    return t




def _opened_base(c, buf_id, name, pool, one_shot):
    with _opened_lock:
        r = _opened.get(buf_id)
        base = _revive(r) if r is not None else None
        if base is not None:
            return base
    buf = c.open_id(buf_id, _cfg.open_timeout)
    try:
        base = _base_tensor(buf)
    finally:
        buf.release()
    if one_shot and name:
        # A copy made for this hand-over: received now, its name goes (its
        # memory with this process's last tensor over it). Another uid's, or
        # one whose lease ran out meanwhile, goes with its lease anyway.
        _later(lambda: c.delete(name, pool=pool))
    return base


def _reduce(t):
    fallback = _cfg.saved.get(type(t))
    if t.is_cuda:
        pass
    elif t.device.type == "cpu" and _cfg.cpu:
        pass
    else:
        return fallback(t) if fallback else t.__reduce_ex__(2)
    if t.layout != torch.strided or t.dtype not in _DL or t.is_quantized:
        if fallback:
            return fallback(t)
        raise TypeError("gpubuf.torch sends strided tensors of %s, not %s %s" %
                        (", ".join(sorted(_BY_NAME)), t.layout, t.dtype))
    if t.requires_grad and not t.is_leaf:
        raise RuntimeError("Cowardly refusing to serialize non-leaf tensor which requires_grad, "
                           "since autograd does not support crossing process boundaries.  If "
                           "you just want to transfer the data, call detach() on the tensor "
                           "before serializing (e.g., putting it on the queue).")
    c = client()
    # a conjugate or negative view is materialised by the copy: its bit does not travel
    found = None if (t.is_conj() or t.is_neg()) else _lookup(t)
    one_shot = found is None
    if found is not None:
        buf_id, offset = found
        name, pool = "", None
        strides = tuple(t.stride())
    else:
        name, buf_id, pool = _copy_out(c, t.detach(), _cfg.pool, _cfg.ttl)
        offset = 0
        strides = _contiguous(tuple(t.shape))
    ticket = (1, buf_id, name, pool, one_shot, offset, _dtype_name(t.dtype), tuple(t.shape),
              strides, bool(t.requires_grad), isinstance(t, torch.nn.Parameter),
              None if _st.socket is None else str(_st.socket))
    return (_rebuild, (ticket,))


def install(client=None, *, pool=None, cpu=False, ttl=DEFAULT_TTL,
            open_timeout=DEFAULT_OPEN_TIMEOUT, socket=None):
    """Send tensors through gpubuf in torch.multiprocessing queues, pipes,
    Pool and spawn arguments (ForkingPickler reducers for torch.Tensor and
    torch.nn.Parameter). client: the Client to use in this process (others
    connect on first use, to `socket` or $GPUBUF_SOCKET); pool: where tensors
    are copied (a name, or a dict by "cpu" / CUDA index; None: the GPU's own
    pool); cpu: CPU tensors too (through a host pool), else torch's
    shared-memory path; ttl: seconds a sent tensor stays receivable (its
    buffer's lease); open_timeout: seconds a receiver waits for the seal.
    Receivers need install() too only to send; unpickling needs gpubuf.torch
    importable (it is imported by the pickle)."""
    if ttl is None or ttl <= 0:
        raise ValueError("ttl must be a number of seconds > 0: a sent buffer needs a lease, "
                         "or an unreceived one would stay forever")
    with _st.lock:
        _st.given = client
        _st.given_pid = os.getpid()
        if socket is not None:
            _st.socket = socket
        elif client is not None:
            _st.socket = client.socket
        _cfg.pool, _cfg.cpu, _cfg.ttl, _cfg.open_timeout = pool, cpu, ttl, open_timeout
        if not _cfg.installed:
            _cfg.saved = {tp: ForkingPickler._extra_reducers.get(tp) for tp in _TYPES}
            for tp in _TYPES:
                ForkingPickler.register(tp, _reduce)
            _cfg.installed = True
        if socket is not None or client is not None:
            os.environ["GPUBUF_SOCKET"] = str(_st.socket)  # spawned children connect there too


def uninstall():
    """Give torch its own reducers back."""
    with _st.lock:
        if not _cfg.installed:
            return
        for tp, red in _cfg.saved.items():
            if red is None:
                ForkingPickler._extra_reducers.pop(tp, None)
            else:
                ForkingPickler.register(tp, red)
        _cfg.installed = False
        _st.given = None


def installed():
    return _cfg.installed


_st.given_pid = None


# ---- state dicts -----------------------------------------------------------------------

def _vname(prefix, version, what):
    return "%s/v%d/%s" % (prefix, version, what)


def _find_index(client, prefix, version, pool):
    """(version, [pool names]) of the sealed index of `prefix`'s version (an
    int, or "latest": the newest) in pool `pool` (None: in any pool; the list
    names every pool that has that version), from one status; None where
    there is none."""
    head = prefix + "/v"
    found = {}
    for b in client.status()["buffers"]:
        n = b["name"]
        if (not n.startswith(head) or not n.endswith("/index") or b["state"] != "sealed" or
                (pool is not None and b["pool"] != pool)):
            continue
        v = n[len(head):-len("/index")]
        if v.isdigit() and (version == "latest" or int(v) == version):
            found.setdefault(int(v), []).append(b["pool"])
    if not found:
        return None
    v = max(found)
    return v, found[v]


def latest_version(client, prefix, *, pool=None):
    """The newest published version of state dict `prefix` (an int), or None."""
    found = _find_index(client, prefix, "latest", pool)
    return None if found is None else found[0]


def _versions(client, prefix, pool):
    head = prefix + "/v"
    out = {}
    for b in client.status()["buffers"]:
        n = b["name"]
        if n.startswith(head) and (pool is None or b["pool"] == pool):
            v = n[len(head):].split("/", 1)[0]
            if v.isdigit():
                out.setdefault(int(v), []).append(b["id"])
    return out


def delete_state_dict(client, prefix, version, *, pool=None):
    """Unpublish one version: its memory goes when its last consumer releases it."""
    ids = _versions(client, prefix, pool).get(version, [])
    for r in client.delete_many(ids):
        if isinstance(r, gpubuf.Error) and not isinstance(r, gpubuf.NotFoundError):
            raise r
    return len(ids)


def publish_state_dict(client, prefix, state_dict, *, pool=None, version=None, stream=None,
                       keep_last=1, ttl=None):
    """Publish every tensor of state_dict under `prefix` as version `version`
    (None: the latest + 1, or 0) in one batch allocation: copied on `stream`
    (None: the current stream), sealed stream-ordered, plus an index buffer
    (key order, names, version, each tensor's dtype and shape). On host pools
    each buffer also carries its tensor's dtype, shape and key as metadata; a
    seal on a CUDA stream carries none, so open_state_dict takes them from the
    index. Older versions beyond the last `keep_last` are deleted (None:
    keep all); each goes when its last consumer releases it. Returns the version."""
    items = list(state_dict.items())
    for k, t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError("state_dict[%r] is a %s, not a tensor" % (k, type(t).__name__))
        if t.dtype not in _DL or t.layout != torch.strided:
            raise TypeError("state_dict[%r]: gpubuf carries strided tensors of %s, not %s" %
                            (k, ", ".join(sorted(_BY_NAME)), t.dtype))
    if version is None:
        latest = latest_version(client, prefix, pool=pool)
        version = 0 if latest is None else latest + 1
    sizes = [max(t.numel() * t.element_size(), 1) for _, t in items]
    names = [_vname(prefix, version, i) for i in range(len(items))]
    iname = _vname(prefix, version, "index")
    index = json.dumps({"format": "gpubuf.torch.state_dict/1", "prefix": prefix,
                        "version": version, "keys": [str(k) for k, _ in items], "names": names,
                        "dtypes": [_dtype_name(t.dtype) for _, t in items],
                        "shapes": [list(t.shape) for _, t in items]}).encode()
    bufs = client.alloc_many(sizes + [len(index)], names + [iname], pool)
    failed = [b for b in bufs if isinstance(b, gpubuf.Error)]
    if failed:
        ok = [b for b in bufs if not isinstance(b, gpubuf.Error)]
        client.release_many(ok)
        client.delete_many([n for n, b in zip(names + [iname], bufs)
                            if not isinstance(b, gpubuf.Error)])
        raise failed[0]
    ib = bufs.pop()
    try:
        if bufs and bufs[0].is_cuda:
            dev = torch.device("cuda", bufs[0].device)
            cur = torch.cuda.current_stream(dev)
            s = stream if stream is not None else cur
            s.wait_stream(cur)  # after the producer's pending work on the tensors
            # A seal on a stream carries no metadata (Buffer.seal): each
            # tensor's dtype and shape travel in the index, which
            # open_state_dict reads (its key is the index's). The lease
            # cannot wait for the seal: each buffer gets it now (renew
            # starts one on a buffer that has none), one round trip each,
            # only when a ttl is asked for; else the tensors would outlive
            # the index's lease forever.
            if ttl is not None:
                for b in bufs:
                    client.renew(b.id, ttl)
            # Every copy launched first (one fused call where torch has one),
            # then the seals in stream order behind them: the GPU copies
            # while the seals are sent. (Copy and seal in turn per tensor was
            # slower on the H200: 13.7 against 8.7 ms for 300 tensors.)
            raw = s.cuda_stream
            with torch.cuda.stream(s):
                dsts, srcs = [], []
                for (k, t), b in zip(items, bufs):
                    if t.numel():
                        dsts.append(_typed(_from_dlpack(b), t))
                        srcs.append(t.detach())
                _copy_all(dsts, srcs)
                del dsts, srcs
            for b in bufs:
                b.seal(stream=raw)
            ev = torch.cuda.Event()
            ev.record(s)
            cur.wait_stream(s)  # the producer's next writes come after the copies
            _release_after(ev, bufs)
        else:
            meta = [dict(dtype=_DL[t.dtype], shape=tuple(t.shape), user_data=_key(k), ttl=ttl)
                    for k, t in items]
            for (k, t), b, m in zip(items, bufs, meta):
                if t.numel():
                    _typed(_from_dlpack(b), t).copy_(t.detach().cpu())
                b.seal(**m)
            client.release_many(bufs)
        # The index last: a consumer that sees it finds every tensor sealed.
        ib.copy_from_host(index)
        ib.seal(sync=True, ttl=ttl)
        ib.release()
    except BaseException:
        for b in bufs + [ib]:
            if not b.released:
                b.release()
        client.delete_many(names + [iname])
        raise
    if keep_last is not None:
        for v in sorted(_versions(client, prefix, pool)):
            if v <= version - keep_last:
                delete_state_dict(client, prefix, v, pool=pool)
    return version


def _typed(raw, t):
    """The bytes `raw` (1-D uint8) as a tensor of t's dtype and shape."""
    n = t.numel() * t.element_size()
    return (raw if raw.numel() == n else raw[:n]).view(t.dtype).view(t.shape)


def _copy_all(dsts, srcs):
    """dst.copy_(src) for each pair, on the current stream: in one fused call
    where torch has one (torch._foreach_copy_), else one copy each."""
    fused = getattr(torch, "_foreach_copy_", None)
    if fused is not None and dsts:
        try:
            fused(dsts, srcs, non_blocking=True)
            return
        except (RuntimeError, TypeError):
            pass  # mixed devices or an older signature: one copy each below
    for d, s in zip(dsts, srcs):
        d.copy_(s, non_blocking=True)


def _key(k):
    b = str(k).encode()
    return b if len(b) <= 4096 else b[:4096]


def open_state_dict(client, prefix, *, version="latest", readonly=True, device=None,
                    timeout=None, pool=None):
    """The state dict published under `prefix` as an ordered dict of
    zero-copy tensors (one batch open). version: an int, or "latest".
    readonly: read-only mappings where the pool kind has them (host,
    cuda-vmm; cuda-ipc buffers open read-write). device: None keeps each
    tensor where it lives; another device gets a copy. timeout: seconds to
    wait for that version (None: fail at once with NotFoundError). pool: the
    pool it was published in; None opens an explicit version in the daemon's
    default pool when it is there (no status), else finds a published
    version in whichever pool holds it (one status; "latest" always), and
    waits for one not published yet in the default pool, so name the pool to
    wait in another one. Each
    tensor holds one daemon reference until it is freed. The dict's
    `version` attribute is the version."""
    ib, where = None, pool
    if version != "latest" and pool is None:
        try:  # an explicit version: the default pool first, one open and no status
            ib = client.open(_vname(prefix, version, "index"))
        except gpubuf.NotFoundError:
            pass
    if ib is None and (version == "latest" or pool is None):
        found = _find_index(client, prefix, version, pool)
        if found is None and version == "latest":
            if not timeout:
                raise gpubuf.NotFoundError("no state dict is published under %r%s" %
                                           (prefix, "" if pool is None else " in pool %r" % pool))
            version = 0
        elif found is not None:
            if len(found[1]) > 1:
                raise gpubuf.InvalidArgumentError(
                    "version %d of state dict %r is published in pools %s: name the one to "
                    "open (pool=...)" % (found[0], prefix,
                                         ", ".join(repr(p) for p in sorted(found[1]))))
            version, where = found[0], found[1][0]

    def qualified(n):  # names are per pool: "/POOL/NAME" outside the default pool
        return n if where is None or n.startswith("/") else "/%s/%s" % (where, n)

    if ib is None:
        ib = client.open(qualified(_vname(prefix, version, "index")), timeout)
    try:
        index = json.loads(ib.to_pybytes())
    finally:
        ib.release()
    names = [qualified(n) for n in index["names"]]
    bufs = client.open_many(names, readonly=bool(readonly), timeout=timeout)
    if readonly and any(isinstance(b, gpubuf.NotSupportedError) for b in bufs):
        # cuda-ipc pools map read-write only (docs/security.md)
        again = [n for n, b in zip(names, bufs) if isinstance(b, gpubuf.NotSupportedError)]
        more = iter(client.open_many(again, timeout=timeout))
        bufs = [next(more) if isinstance(b, gpubuf.NotSupportedError) else b for b in bufs]
    out = _StateDict()
    out.version = version
    err = None
    dtypes = index.get("dtypes") or [None] * len(bufs)
    shapes = index.get("shapes") or [None] * len(bufs)
    opened = [b for b in bufs if not isinstance(b, gpubuf.Error)]
    # One DLPack import per tensor: each buffer's bytes (1-D uint8,
    # remembered as gpubuf storage, all in one step) viewed with the index's
    # dtype and shape (a seal on a CUDA stream carries no layout), else with
    # the layout the buffer carries.
    bases = []
    try:
        for k, b, dt, shape in zip(index["keys"], bufs, dtypes, shapes):
            if isinstance(b, gpubuf.Error):
                err = err or b
                continue
            if b.layout is None and dt in _BY_NAME and shape is not None:
                base = _from_dlpack(b)
                dtype, shape = _BY_NAME[dt], tuple(shape)
                n = math.prod(shape) * _itemsize(dtype)
                if n and base.numel() == n:  # the whole buffer, C order
                    t = (base if dtype == torch.uint8 else base.view(dtype)).view(shape)
                else:  # an empty tensor has a 1-byte buffer
                    t = _view(base, dtype, shape, _contiguous(shape), 0)
            elif dt in _NATIVE_DLPACK:  # one torch call: the buffer's own layout
                t = base = _from_dlpack(b)
            else:
                t = as_tensor(b)
                base = None
            if base is not None:
                bases.append((base, b.id))
            if device is not None and t.device != torch.device(device):
                t = t.to(device)
            out[k] = t
    finally:
        _remember_all(bases)
        client.release_many(opened)  # the tensors hold their own references
    if err is not None:
        raise err
    return out


class _StateDict(collections.OrderedDict):
    version = None
