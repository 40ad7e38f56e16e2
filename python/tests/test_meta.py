"""Array metadata and leases from Python, on host pools with NumPy: a layout
given at alloc or seal comes back from open, stat, status and __dlpack__;
bounds are enforced; leases expire (with and without references) and are
renewed."""
import subprocess
import sys
import time

import numpy as np
import pytest

import gpubuf
from conftest import env_for


def test_layout_round_trip_through_dlpack(client):
    b = client.alloc(name="m/arr", dtype="float32", shape=(4, 8), user_data=b"hdr")
    assert b.size == 4 * 8 * 4  # the size the layout spans
    assert b.layout == {"dtype": "float32", "dtype_code": 2, "dtype_bits": 32, "dtype_lanes": 1,
                        "shape": (4, 8), "strides": None, "byte_offset": 0}
    b.copy_from_host(np.arange(32, dtype=np.float32))
    b.seal(sync=True)
    with client.open("m/arr") as o:
        assert o.user_data == b"hdr"
        x = np.from_dlpack(o)
        assert x.dtype == np.float32 and x.shape == (4, 8)
        assert x[3, 7] == 31 and x.ctypes.data == o.address
        # Slices carry no layout: bytes, as before.
        s = o.slice(0, 16)
        assert s.layout is None and np.from_dlpack(s).dtype == np.uint8
        s.release()
        del x
    st = client.stat("m/arr")
    assert st["layout"]["shape"] == (4, 8) and st["user_data"] == b"hdr"
    assert st["lease_left"] is None
    assert client.stat(st["id"])["layout"]["dtype"] == "float32"
    row = [r for r in client.status()["buffers"] if r["name"] == "m/arr"][0]
    assert row["layout"]["shape"] == (4, 8) and row["layout"]["dtype"] == "float32"
    assert row["user_bytes"] == 3 and row["lease_left"] is None
    b.release()


def test_strided_layout_and_byte_offset(client):
    # A 3x4 int16 array stored column-major after an 8-byte header.
    b = client.alloc(8 + 24, "m/fortran", dtype=np.int16, shape=(3, 4), strides=(1, 3),
                     byte_offset=8)
    data = np.arange(12, dtype=np.int16).reshape(3, 4)
    b.copy_from_host(np.asfortranarray(data).tobytes(order="A"), 8)
    b.seal(sync=True)
    with client.open("m/fortran") as o:
        x = np.from_dlpack(o)
        assert x.shape == (3, 4) and x.strides == (2, 6)
        assert (x == data).all()
        del x


def test_layout_set_at_seal(client):
    b = client.alloc(64, "m/late")
    assert b.layout is None
    b.seal(dtype="uint16", shape=32, ttl=60)
    assert b.layout["shape"] == (32,)
    with client.open("m/late") as o:
        assert np.from_dlpack(o).dtype == np.uint16
    # Once sealed, metadata cannot change.
    with pytest.raises(gpubuf.StateError):
        b.seal(dtype="uint8", shape=64)
    b.release()


def test_publish_numpy_array(client):
    a = np.linspace(0, 1, 60, dtype=np.float64).reshape(3, 4, 5)[:, ::2]  # not contiguous
    b = gpubuf.publish(client, "m/pub", a, user_data=b"v1")
    with client.open("m/pub") as o:
        x = np.from_dlpack(o)
        assert x.dtype == np.float64 and x.shape == (3, 2, 5)
        assert (x == a).all()
        del x
    b.release()
    assert client.stat("m/pub")["user_data"] == b"v1"


def test_open_in_another_process_gets_layout(client, daemon):
    b = client.alloc(name="m/proc", dtype="int32", shape=(10, 10))
    b.copy_from_host(np.arange(100, dtype=np.int32))
    b.seal(sync=True)
    code = ("import gpubuf, numpy as np\n"
            "with gpubuf.Client() as c, c.open('m/proc') as o:\n"
            "    x = np.from_dlpack(o)\n"
            "    assert x.shape == (10, 10) and x.dtype == np.int32 and x[9, 9] == 99\n"
            "    del x\n")
    r = subprocess.run([sys.executable, "-c", code], env=env_for(daemon),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    assert r.returncode == 0, r.stdout
    b.release()


def test_metadata_bounds(client):
    with pytest.raises(ValueError, match="at most 32"):
        client.alloc(64, "m/b", dtype="uint8", shape=[1] * 33)
    with pytest.raises(gpubuf.InvalidArgumentError, match="needs 80 bytes"):
        client.alloc(79, "m/b", dtype="float32", shape=(4, 5))
    with pytest.raises(gpubuf.InvalidArgumentError, match="at most 4096"):
        client.alloc(64, "m/b", user_data=bytes(4097))
    with pytest.raises(gpubuf.InvalidArgumentError, match="dtype code 99"):
        client.alloc(64, "m/b", dtype=(99, 8, 1), shape=8)
    with pytest.raises(ValueError, match="strides for"):
        client.alloc(64, "m/b", dtype="uint8", shape=(2, 2), strides=(1,))
    with pytest.raises(gpubuf.InvalidArgumentError, match="max_lease_ms"):
        client.alloc(64, "m/b", ttl=8 * 86400)
    with pytest.raises(ValueError, match="needs a dtype"):
        client.alloc(64, "m/b", shape=(2,))
    assert client.status()["pools"][0]["used"] == 0
    # The limits themselves are fine.
    b = client.alloc(4, "m/b", dtype="float32", shape=[1] * 32, user_data=bytes(4096))
    assert len(b.layout["shape"]) == 32
    b.release()


def _wait_for(pred, timeout=60.0):  # a deadline for a loaded machine, not a measure
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


def test_lease_expires_unreferenced(client):
    b = client.alloc(1 << 20, "m/ttl", ttl=0.2)
    b.seal(sync=True)
    b.release()
    client.flush()
    left = client.stat("m/ttl")["lease_left"]
    assert 0 < left <= 0.2
    assert _wait_for(lambda: not any(r["name"] == "m/ttl"
                                     for r in client.status()["buffers"]))
    st = client.status()
    assert st["pools"][0]["used"] == 0
    assert st["leases"]["expired"] == 1 and st["leases"]["active"] == 0
    with pytest.raises(gpubuf.NotFoundError):
        client.open("m/ttl")


def test_lease_expires_while_referenced(client, daemon):
    with gpubuf.Client(daemon.socket) as producer:
        b = producer.alloc(4096, "m/held", ttl=0.15)
        b.copy_from_host(b"x" * 4096)
        b.seal(sync=True)
        o = client.open("m/held")
        b.release()
    assert _wait_for(lambda: client.status()["leases"]["expired"] == 1)
    with pytest.raises(gpubuf.NotFoundError):
        client.open("m/held")
    rows = [r for r in client.status()["buffers"] if r["id"] == o.id]
    assert rows and rows[0]["state"] == "deleted" and rows[0]["refs"] == 1
    assert client.status()["pools"][0]["used"] > 0
    assert o.to_pybytes() == b"x" * 4096  # the memory stays with the reference
    o.release()
    client.flush()
    assert client.status()["pools"][0]["used"] == 0


def test_renew(client):
    b = client.alloc(64, "m/renew", ttl=0.3)
    b.seal(sync=True)
    for _ in range(6):
        time.sleep(0.1)
        client.renew("m/renew")  # its own 0.3 s again
    client.renew(b.id, ttl=60)
    assert client.stat("m/renew")["lease_left"] > 59
    assert client.status()["leases"]["renewed"] == 7
    with pytest.raises(gpubuf.NotFoundError):
        client.renew("m/none", ttl=1)
    b2 = client.alloc(64, "m/nolease")
    with pytest.raises(gpubuf.InvalidArgumentError, match="no lease"):
        client.renew("m/nolease")
    with pytest.raises(ValueError):
        client.renew("m/nolease", ttl=-1)
    b2.release()
    b.release()
