"""The gpubuf package on host pools: API, zero-copy exports, lifetimes."""
import gc
import os
import sys
import time

import numpy as np
import pytest

import gpubuf
from conftest import buffer_refs


def test_alloc_seal_open_stat_delete(client, daemon):
    b = client.alloc(4096, name="t/a")
    assert (b.size, b.name, b.pool_kind, b.device, b.memory_device) == (4096, "t/a", "host", -1, -1)
    assert not b.is_cuda and not b.released and b.client is client
    assert isinstance(b.address, int) and b.address != 0
    assert client.stat("t/a")["state"] == "allocated"
    b.copy_from_host(b"hello")
    b.seal(sync=True)
    st = client.stat("t/a")
    assert (st["state"], st["size"], st["pool"], st["refs"], st["id"]) == ("sealed", 4096, "host", 1, b.id)
    with gpubuf.Client(daemon.socket) as other:
        o = other.open("t/a")
        assert o.id == b.id and o.to_pybytes()[:5] == b"hello"
        assert buffer_refs(client, "t/a") == 2
        p = other.open_id(b.id)
        assert p.name == "t/a"
        o.release()
        p.release()
        other.flush()
    b.release()
    assert b.released
    client.delete("t/a")
    with pytest.raises(FileNotFoundError):
        client.stat("t/a")


def test_delete_by_id_and_anonymous_buffers(client):
    b = client.alloc(100)
    assert b.name == ""
    b.seal(sync=True)
    with client.open_id(b.id) as o:
        assert o.size == 100
    named = client.alloc(10, "t/byid")
    named.seal(sync=True)
    client.delete(named.id)
    with pytest.raises(FileNotFoundError):
        client.open("t/byid")
    named.release()
    b.release()


def test_status_is_plain_data(client, daemon):
    b = client.alloc(1 << 20, "t/status")
    st = client.status()
    assert set(st) == {"pools", "buffers", "clients", "uptime_ms", "version", "leases"}
    pools = {p["name"]: p for p in st["pools"]}
    assert pools["host"]["kind"] == "host" and pools["host"]["device"] == -1
    assert pools["host"]["used"] >= 1 << 20
    (mine,) = [x for x in st["buffers"] if x["name"] == "t/status"]
    assert mine["state"] == "allocated" and mine["refs"] == 1 and mine["size"] == 1 << 20
    import os
    assert any(c["pid"] == os.getpid() and c["references"] == 1 for c in st["clients"])
    b.release()


def test_buffer_protocol_is_zero_copy(client, daemon):
    b = client.alloc(1024, "t/bp")
    a = np.frombuffer(b, dtype=np.uint32)
    assert a.ctypes.data == b.address and a.size == 256
    a[:] = np.arange(256, dtype=np.uint32)
    m = memoryview(b)
    assert m.nbytes == 1024 and not m.readonly and m.format == "B"
    m[0] = 0xFF
    b.seal()
    with gpubuf.Client(daemon.socket) as other, other.open("t/bp", timeout=5) as o:
        seen = np.frombuffer(o, dtype=np.uint32)
        assert seen[0] == 0xFF and (seen[1:] == np.arange(1, 256)).all()
        seen[5] = 12345  # the same memory: the producer sees it
        assert a[5] == 12345
        del seen
    del m, a
    b.release()


def test_dlpack_numpy_is_zero_copy(client):
    b = client.alloc(64, "t/dl")
    assert b.__dlpack_device__() == (1, 0)
    x = np.from_dlpack(b)
    assert x.dtype == np.uint8 and x.shape == (64,) and x.ctypes.data == b.address
    # NumPy marks a DLPack import read-only; write through the buffer protocol
    np.frombuffer(b, dtype=np.uint8)[:] = 3
    assert (x == 3).all()
    with pytest.raises(BufferError):
        b.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        b.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError):
        b.__dlpack__(stream=1)
    cap = b.__dlpack__(max_version=(1, 0), dl_device=(1, 0), copy=False)
    assert "dltensor" in repr(cap)
    # keyword-only, as the DLPack protocol has it
    with pytest.raises(TypeError, match=r"takes at most 0 positional arguments \(1 given\)"):
        b.__dlpack__(None)
    with pytest.raises(TypeError, match="'streams' is an invalid keyword argument for __dlpack__"):
        b.__dlpack__(streams=None)
    key = "".join(["dl_", "device"])  # a keyword made at run time, not interned
    assert key is not sys.intern("dl_device")
    assert "dltensor" in repr(b.__dlpack__(**{key: (1, 0)}))
    with pytest.raises(BufferError):
        b.__dlpack__(**{key: (2, 0)})
    with pytest.raises(BufferError):
        b.as_array("uint8").__dlpack__(copy=True)
    assert not hasattr(b, "__cuda_array_interface__")  # host memory
    del x, cap
    b.release()


def test_as_array_typed_views(client):
    b = client.alloc(16 * 16 * 4, "t/typed")
    b.copy_from_host(np.arange(256, dtype=np.float32))
    v = b.as_array("float32", (16, 16))
    assert (v.dtype, v.shape, v.strides, v.nbytes, v.itemsize) == ("<f4", (16, 16), (64, 4), 1024, 4)
    a = np.asarray(v)
    assert a.dtype == np.float32 and a.shape == (16, 16) and a[3, 2] == 50.0
    assert a.ctypes.data == b.address
    d = np.from_dlpack(b.as_array(np.dtype("int32")))
    assert d.shape == (256,) and d.dtype == np.int32
    for dt, np_dt in (("<i8", np.int64), ("u2", np.uint16), (np.float64, np.float64),
                      ("complex64", np.complex64), ("bool", np.bool_), ("float16", np.float16)):
        assert np.asarray(b.as_array(dt)).dtype == np_dt
    assert np.asarray(b.as_array("f4", 3)).shape == (3,)
    direct = b.as_array("f4", (4, 64)).__array__()  # NumPy's fallback, zero-copy too
    assert direct.shape == (4, 64) and direct.ctypes.data == b.address
    assert np.asarray(b.as_array("u1", ())).shape == ()
    with pytest.raises(ValueError):
        b.as_array(">f4")  # big-endian
    with pytest.raises(ValueError):
        b.as_array("f3")
    with pytest.raises(IndexError):  # gpubuf.RangeError: more bytes than the view
        b.as_array("f8", (16, 16))
    with pytest.raises(ValueError):
        b.slice(0, 6).as_array("f4")  # not a whole number of items
    with pytest.raises(ValueError):
        b.as_array("f4", (-1,))
    with pytest.raises(ValueError):
        b.as_array("u1", (1,) * 33)
    del a, d, v
    b.release()


def test_slice_keeps_parent_alive(client, daemon):
    b = client.alloc(1000, "t/slice")
    b.copy_from_host(bytes(range(200)) * 5)
    b.seal()  # a sealed buffer stays listed when its references go
    s = b.slice(100, 50)
    assert (s.size, s.id, s.name) == (50, b.id, "t/slice")
    assert s.address == b.address + 100
    assert s.to_pybytes() == bytes(range(100, 150))
    ss = s.slice(10)
    assert ss.size == 40 and ss.to_pybytes() == bytes(range(110, 150))
    assert b.slice(1000).size == 0
    b.release()  # the slices keep the view and the daemon reference
    assert buffer_refs(client, "t/slice") == 1
    assert s.to_pybytes() == bytes(range(100, 150))
    s.release()
    assert buffer_refs(client, "t/slice") == 1
    ss.release()
    client.flush()
    assert buffer_refs(client, "t/slice") == 0


def test_copies(client):
    b = client.alloc(100, "t/copy")
    assert b.copy_from_host(b"abcdef") == 6
    assert b.copy_from_host(bytearray(b"XY"), position=98) == 2
    assert b.copy_from_host(np.array([1, 2], dtype=np.uint8), position=10) == 2
    assert b.copy_to_host(0, 6) == bytearray(b"abcdef")
    assert bytes(b.copy_to_host(position=98)) == b"XY"
    assert len(b.copy_to_host()) == 100
    out = bytearray(4)
    assert b.copy_to_host(buf=out) is out and out == b"abcd"  # until buf is full
    arr = np.zeros(2, dtype=np.uint8)
    b.copy_to_host(10, 2, arr)
    assert list(arr) == [1, 2]
    assert b.to_pybytes()[98:] == b"XY"
    with pytest.raises(gpubuf.RangeError):
        b.copy_from_host(b"123", position=98)
    with pytest.raises(gpubuf.RangeError):
        b.copy_to_host(101)
    with pytest.raises(gpubuf.RangeError):
        b.copy_to_host(-1)
    with pytest.raises(ValueError):
        b.copy_to_host(0, 10, bytearray(5))
    with pytest.raises(BufferError):
        b.copy_to_host(buf=b"immutable")
    with pytest.raises((BufferError, ValueError)):
        b.copy_from_host(np.zeros((4, 4), dtype=np.uint8)[:, 1])  # not contiguous
    b.release()


def test_exports_outlive_the_buffer_object(client):
    b = client.alloc(4096, "t/life")
    b.copy_from_host(b"\x07" * 4096)
    b.seal(sync=True)
    arr = np.from_dlpack(b)
    mv = memoryview(b)
    av = b.as_array("u4")
    b.release()  # safe: each export holds its own reference
    del b
    gc.collect()
    assert buffer_refs(client, "t/life") == 1
    assert arr[100] == 7 and mv[5] == 7 and np.asarray(av)[0] == 0x07070707
    del arr
    gc.collect()
    assert buffer_refs(client, "t/life") == 1
    mv.release()
    del mv
    client.flush()
    assert buffer_refs(client, "t/life") == 1
    del av
    client.flush()
    assert buffer_refs(client, "t/life") == 0


def test_exports_keep_the_connection(daemon):
    c = gpubuf.Client(daemon.socket)
    b = c.alloc(64, "t/conn")
    arr = np.from_dlpack(b)
    del b, c  # the Client object goes too: the export keeps the connection
    gc.collect()
    with gpubuf.Client(daemon.socket) as watcher:
        assert buffer_refs(watcher, "t/conn") == 1
        assert arr[0] == 0
        del arr
        gc.collect()
        # The last export released the view and closed the connection: the
        # daemon freed the buffer, which was never sealed.
        for _ in range(500):
            if not any(x["name"] == "t/conn" for x in watcher.status()["buffers"]):
                break
            time.sleep(0.01)
        else:
            pytest.fail("the buffer was not freed after its last export went")


def test_unconsumed_capsule_releases(client):
    b = client.alloc(64, "t/cap")
    b.seal()
    caps = [b.__dlpack__() for _ in range(3)]
    b.release()
    assert buffer_refs(client, "t/cap") == 1
    del caps
    client.flush()
    assert buffer_refs(client, "t/cap") == 0


def test_references_back_to_zero(client, daemon):
    import os
    src = client.alloc(1 << 16, "t/zero")
    src.seal(sync=True)
    src.release()
    with gpubuf.Client(daemon.socket) as other:
        keep = []
        for i in range(20):
            o = other.open("t/zero")
            keep += [o, o.slice(i, 10), np.from_dlpack(o), memoryview(o), o.as_array("u2")]
            if i % 2:
                o.release()
        assert buffer_refs(client, "t/zero") == 20
        del keep, o
        gc.collect()
        other.flush()
        assert buffer_refs(client, "t/zero") == 0
        mine = [c for c in client.status()["clients"] if c["pid"] == os.getpid()]
        assert all(c["references"] == 0 for c in mine)


def test_released_buffer_and_closed_client(daemon):
    c = gpubuf.Client(daemon.socket)
    assert not c.closed and c.socket == daemon.socket
    with c.alloc(8) as b:
        assert repr(b).startswith("<gpubuf.Buffer id=")
    assert b.released and repr(b) == "<gpubuf.Buffer released>"
    b.release()  # idempotent
    for call in (lambda: b.size, lambda: b.to_pybytes(), lambda: b.slice(0), lambda: b.seal(),
                 lambda: b.__dlpack__(), lambda: b.as_array()):
        with pytest.raises(ValueError):
            call()
    with pytest.raises(BufferError):
        memoryview(b)
    c.close()
    c.close()
    assert c.closed
    with pytest.raises(ValueError):
        c.status()
    with pytest.raises(ValueError):
        c.alloc(8)
    with gpubuf.Client(daemon.socket) as d:
        pass
    assert d.closed


def test_default_socket_from_environment(daemon, monkeypatch):
    monkeypatch.setenv("GPUBUF_SOCKET", daemon.socket)
    with gpubuf.Client() as c:
        assert c.socket is None and c.status()["pools"]


def test_views_survive_client_close(daemon):
    c = gpubuf.Client(daemon.socket)
    b = c.alloc(16, "t/after-close")
    b.copy_from_host(b"x" * 16)
    c.close()  # the daemon drops the reference; the local mapping stays valid
    assert b.to_pybytes() == b"x" * 16
    with pytest.raises(gpubuf.DisconnectedError):
        b.seal(sync=True)
    b.release()


def test_type_stubs_match_the_module():
    import ast
    from conftest import SRC

    tree = ast.parse((SRC / "python" / "gpubuf" / "__init__.pyi").read_text())
    stubbed = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            stubbed[node.name] = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
        elif isinstance(node, ast.FunctionDef):
            stubbed[node.name] = set()
        elif isinstance(node, ast.AnnAssign):
            stubbed[node.target.id] = set()
    public = {n for n in gpubuf.__all__}
    assert set(stubbed) == public
    for name, members in stubbed.items():
        obj = getattr(gpubuf, name)
        for m in members - {"__init__", "__buffer__"}:
            assert hasattr(obj, m), f"{name}.{m}"
        if isinstance(obj, type) and not issubclass(obj, BaseException):
            real = {m for m in vars(obj) if not m.startswith("_") or m.startswith("__") and m in (
                "__dlpack__", "__dlpack_device__", "__array__", "__cuda_array_interface__",
                "__enter__", "__exit__")}
            assert real <= members, f"{name}: {real - members} not in the stubs"


def test_read_only_open(client, daemon):
    b = client.alloc(4096, name="t/ro")
    b.copy_from_host(b"abcd")
    b.seal(sync=True)
    with gpubuf.Client(daemon.socket) as other:
        r = other.open("t/ro", readonly=True)
        assert r.read_only and not b.read_only
        m = memoryview(r)
        assert m.readonly and bytes(m[:4]) == b"abcd"
        with pytest.raises(TypeError):
            m[0] = 1
        a = np.from_dlpack(r)
        assert a[:4].tobytes() == b"abcd"
        with pytest.raises(gpubuf.PermissionDeniedError):
            r.copy_from_host(b"x")
        (me,) = [c for c in other.status()["clients"] if c["read_only_references"] > 0]
        assert (me["references"], me["read_only_references"]) == (1, 1)
        p = other.open_id(b.id, readonly=True)
        assert p.read_only
        p.release()
        del a, m
        r.release()
        other.flush()
        (me,) = [c for c in other.status()["clients"] if c["session_id"] == me["session_id"]]
        assert (me["references"], me["read_only_references"]) == (0, 0)
    # A host pool has no GPU work to order: a stream seal is refused.
    c = client.alloc(64, name="t/ro2")
    with pytest.raises(gpubuf.InvalidArgumentError, match="call seal\\(\\) without stream"):
        c.seal(stream=0)
    with pytest.raises(ValueError, match="does not wait"):
        c.seal(sync=True, stream=0)
    with pytest.raises(TypeError, match="CUDA stream"):
        c.seal(stream="s")
    c.seal(sync=True)
    c.wait(0)  # sealed without an event: nothing to wait for
    c.release()
    b.release()
    client.delete("t/ro")
    client.delete("t/ro2")


def test_names_are_per_pool(client, daemon):
    """Names are per pool: "host" (the default pool) and "tiny" each hold a
    buffer named t/same. A lookup searches one pool: pool=, or POOL of
    "/POOL/NAME", else the default; owner= refuses another uid's buffer."""
    me = os.getuid()
    a = client.alloc(64, name="t/same")
    a.copy_from_host(b"dflt")
    a.seal(sync=True)
    b = client.alloc(64, name="t/same", pool="tiny")
    b.copy_from_host(b"tiny")
    b.seal(sync=True)
    assert a.id != b.id
    with gpubuf.Client(daemon.socket) as other:
        for kw, want, text in (({}, a, b"dflt"), ({"pool": "tiny"}, b, b"tiny"),
                               ({"pool": "host", "owner": me}, a, b"dflt")):
            with other.open("t/same", **kw) as o:
                assert o.id == want.id
                with memoryview(o) as m:
                    assert bytes(m[:4]) == text
        with other.open("/tiny/t/same", owner=me) as o:
            assert o.id == b.id
        assert other.stat("t/same")["pool"] == "host"
        assert other.stat("t/same", pool="tiny")["id"] == b.id
        assert other.stat("/tiny/t/same", owner=me)["owner_uid"] == me
        assert other.stat(b.id, pool="tiny")["name"] == "t/same"
        with pytest.raises(gpubuf.NotFoundError):
            other.stat(b.id, pool="host")  # an id of another pool
        with pytest.raises(gpubuf.PermissionDeniedError, match=f"belongs to uid {me}, not to uid"):
            other.open("t/same", owner=me + 1)
        with pytest.raises(gpubuf.PermissionDeniedError):
            other.open_id(b.id, owner=me + 1)
        with pytest.raises(gpubuf.PermissionDeniedError):
            other.stat("/tiny/t/same", owner=me + 1)
        with pytest.raises(gpubuf.PermissionDeniedError):
            other.delete("t/same", pool="tiny", owner=me + 1)
        with pytest.raises(gpubuf.InvalidArgumentError, match="but pool 'host' was given"):
            other.open("/tiny/t/same", pool="host")
        with pytest.raises(gpubuf.NoPoolError):
            other.open("t/same", pool="nosuch")
        with pytest.raises(TypeError, match="owner must be a uid"):
            other.open("t/same", owner="root")
        with pytest.raises(ValueError, match="owner must be a uid"):
            other.open("t/same", owner=1 << 32)
    c = client.alloc(64, name="t/only-tiny", pool="tiny")
    c.seal(sync=True)
    # Not in the default pool: the error says which pool has it.
    with pytest.raises(gpubuf.NotFoundError, match="'/tiny/t/only-tiny'"):
        client.open("t/only-tiny")
    pools = {p["name"]: p for p in client.status()["pools"]}
    assert pools["host"]["default"] and not pools["tiny"]["default"]
    assert pools["host"]["publishers"] == "" and pools["tiny"]["publishers"] == ""
    for v in (a, b, c):
        v.release()
    client.delete("t/same")
    client.delete("t/same", pool="tiny", owner=me)
    client.delete("/tiny/t/only-tiny")
    assert not [x for x in client.status()["buffers"] if x["name"].startswith("t/")]


def test_batches_partial_failures_and_refs(client, daemon):
    names = [f"bt/{i}" for i in range(300)]
    made = client.alloc_many([64 + i for i in range(300)], names=names, seal=True)
    assert all(isinstance(b, gpubuf.Buffer) for b in made)
    assert [b.size for b in made[:3]] == [64, 65, 66]
    made[7].copy_from_host(b"seven")
    with gpubuf.Client(daemon.socket) as other:
        got = other.open_many(names + ["bt/missing", "bad name"])
        assert all(isinstance(b, gpubuf.Buffer) for b in got[:300])
        assert isinstance(got[300], FileNotFoundError) and isinstance(got[300], gpubuf.Error)
        assert isinstance(got[301], gpubuf.Error)
        assert got[7].to_pybytes()[:5] == b"seven" and got[7].name == "bt/7"
        by_id = other.open_many([made[0].id, made[1].id], readonly=True)
        assert [b.id for b in by_id] == [made[0].id, made[1].id]
        assert buffer_refs(client, "bt/0") == 3
        other.release_many(got[:300] + by_id)
        assert all(b.released for b in got[:300])
        assert buffer_refs(client, "bt/0") == 1
    # A taken name fails alone.
    again = client.alloc_many([10, 10], names=["bt/0", "bt/new"])
    assert isinstance(again[0], FileExistsError) and isinstance(again[1], gpubuf.Buffer)
    client.release_many(made + [again[1]])
    assert buffer_refs(client, "bt/0") == 0
    # bt/new was never sealed: its last reference freed it.
    res = client.delete_many(names + ["bt/new", "bt/never"])
    assert res[:300] == [None] * 300
    assert all(isinstance(e, FileNotFoundError) for e in res[300:])
    with pytest.raises(TypeError):
        client.release_many([1, 2])
