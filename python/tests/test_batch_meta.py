"""Batch opens that carry each buffer's metadata and wait for seals, and the
buffer protocol with the producer's layout (host pools, NumPy)."""
import threading

import numpy as np
import pytest

import gpubuf
from conftest import buffer_refs


def test_open_many_returns_layout_and_user_data(client):
    a = client.alloc(name="bm/a", dtype="float32", shape=(2, 3), user_data=b"first")
    a.copy_from_host(np.arange(6, dtype=np.float32))
    a.seal(sync=True)
    b = client.alloc(8 + 24, "bm/b", dtype=np.int16, shape=(3, 4), strides=(1, 3),
                     byte_offset=8)
    b.seal(sync=True)
    c = client.alloc(16, "bm/plain")
    c.seal(sync=True)
    for x in (a, b, c):
        x.release()
    got = client.open_many(["bm/a", "bm/b", "bm/plain", "bm/missing"])
    assert isinstance(got[3], gpubuf.NotFoundError)
    single = client.open("bm/b")
    assert got[0].layout == {"dtype": "float32", "dtype_code": 2, "dtype_bits": 32,
                             "dtype_lanes": 1, "shape": (2, 3), "strides": None,
                             "byte_offset": 0}
    assert got[0].user_data == b"first"
    assert got[1].layout == single.layout and got[1].layout["strides"] == (1, 3)
    assert got[1].layout["byte_offset"] == 8
    assert got[2].layout is None and got[2].user_data is None
    x = np.from_dlpack(got[0])
    assert x.shape == (2, 3) and x.dtype == np.float32 and x[1, 2] == 5
    del x
    # By id, the same.
    ids = [g.id for g in got[:3]]
    again = client.open_many(ids, readonly=True)
    assert [g.layout for g in again] == [g.layout for g in got[:3]]
    client.release_many(again + got[:3] + [single])


def test_open_many_waits_for_seals(client, daemon):
    early = client.alloc(4, "bm/early")
    early.seal(sync=True)
    early.release()
    result = {}

    def opener():
        with gpubuf.Client(daemon.socket) as c2:
            got = c2.open_many(["bm/early", "bm/late"], timeout=60)
            result["layouts"] = [g.layout if isinstance(g, gpubuf.Buffer) else g for g in got]
            for g in got:
                if isinstance(g, gpubuf.Buffer):
                    g.release()

    t = threading.Thread(target=opener)
    t.start()
    # The batch opened bm/early (a reference) and found bm/late unsealed: it
    # waits for it now.
    while buffer_refs(client, "bm/early") == 0:
        assert t.is_alive(), result
        threading.Event().wait(0.01)
    late = client.alloc(name="bm/late", dtype="uint8", shape=(4,))
    late.seal(sync=True)
    late.release()
    t.join()
    assert result["layouts"][0] is None
    assert result["layouts"][1]["shape"] == (4,)


def test_open_many_timeout_and_no_wait(client):
    ok = client.alloc(4, "bm/ok")
    ok.seal(sync=True)
    got = client.open_many(["bm/ok", "bm/never"], timeout=0.2)
    assert isinstance(got[0], gpubuf.Buffer)
    assert isinstance(got[1], gpubuf.WaitTimeoutError)
    got[0].release()
    got = client.open_many(["bm/ok", "bm/never"])  # None: no waiting
    assert isinstance(got[1], gpubuf.NotFoundError)
    got[0].release()
    with pytest.raises(ValueError):
        client.open_many(["bm/ok"], timeout=-1)
    ok.release()


def test_buffer_protocol_carries_the_layout(client):
    b = client.alloc(name="bm/grid", dtype="float64", shape=(3, 4))
    data = np.arange(12, dtype=np.float64).reshape(3, 4)
    b.copy_from_host(data.tobytes())
    b.seal(sync=True)
    with client.open("bm/grid") as o:
        m = memoryview(o)
        assert m.format == "d" and m.shape == (3, 4) and m.strides == (32, 8)
        assert (np.asarray(o) == data).all()
        m.release()
        # Without a layout: the bytes, as before.
        s = o.slice(0, 8)
        assert memoryview(s).shape == (8,)
        s.release()
    # Column-major after a header: strides in bytes, element 0 after the offset.
    f = client.alloc(8 + 24, "bm/fortran", dtype=np.int16, shape=(3, 4), strides=(1, 3),
                     byte_offset=8)
    f.copy_from_host(np.asfortranarray(data.astype(np.int16)).tobytes(order="A"), 8)
    f.seal(sync=True)
    with client.open("bm/fortran") as o:
        x = np.asarray(o)
        assert x.shape == (3, 4) and x.strides == (2, 6) and (x == data).all()
        with pytest.raises(BufferError):
            # not C-contiguous: a consumer that wants contiguous bytes is told
            np.frombuffer(o, dtype=np.int16)
        del x
    # bfloat16 has no buffer-protocol format: the bytes.
    h = client.alloc(name="bm/bf16", dtype=(4, 16, 1), shape=(4,))
    h.seal(sync=True)
    assert memoryview(h).format == "B" and memoryview(h).shape == (8,)
    for x in (b, f, h):
        x.release()
    assert not hasattr(client.open("bm/grid"), "__cuda_array_interface__")
