"""Every error of the library as a Python exception, with its code and message."""
import errno
import socket

import pytest

import gpubuf
from conftest import Daemon, HOST_POOLS

# class, built-in base it must also be, library code, errname
TABLE = [
    (gpubuf.NotFoundError, FileNotFoundError, -errno.ENOENT, "ENOENT"),
    (gpubuf.PermissionDeniedError, PermissionError, -errno.EPERM, "EPERM"),
    (gpubuf.WaitTimeoutError, TimeoutError, -errno.ETIMEDOUT, "ETIMEDOUT"),
    (gpubuf.ExistsError, FileExistsError, -errno.EEXIST, "EEXIST"),
    (gpubuf.OutOfMemoryError, MemoryError, -errno.ENOMEM, "ENOMEM"),
    (gpubuf.PoolFullError, MemoryError, -1008, "GPUBUF_EPOOLFULL"),
    (gpubuf.NoDaemonError, ConnectionRefusedError, -errno.ECONNREFUSED, "ECONNREFUSED"),
    (gpubuf.DisconnectedError, ConnectionError, -1010, "GPUBUF_EDISCONNECTED"),
    (gpubuf.InvalidArgumentError, ValueError, -errno.EINVAL, "EINVAL"),
    (gpubuf.RangeError, IndexError, -1011, "GPUBUF_ERANGE"),
    (gpubuf.BusyError, None, -errno.EBUSY, "EBUSY"),
    (gpubuf.ProtocolError, None, -1001, "GPUBUF_EPROTOCOL"),
    (gpubuf.VersionError, None, -1002, "GPUBUF_EVERSION"),
    (gpubuf.CudaError, None, -1003, "GPUBUF_ECUDA"),
    (gpubuf.NoDriverError, None, -1004, "GPUBUF_ENODRIVER"),
    (gpubuf.NoDeviceError, None, -1005, "GPUBUF_ENODEVICE"),
    (gpubuf.StateError, None, -1006, "GPUBUF_ESTATE"),
    (gpubuf.NoPoolError, None, -1007, "GPUBUF_ENOPOOL"),
    (gpubuf.NotHeldError, None, -1009, "GPUBUF_ENOTHELD"),
    (gpubuf.NoPeerError, None, -1012, "GPUBUF_ENOPEER"),
]


@pytest.mark.parametrize("cls,builtin,code,name", TABLE, ids=[t[0].__name__ for t in TABLE])
def test_every_code_has_its_class(cls, builtin, code, name):
    with pytest.raises(cls) as ei:
        gpubuf._gpubuf._raise_for_code(code, "what happened")
    e = ei.value
    assert type(e) is cls and isinstance(e, gpubuf.Error)
    if builtin:
        assert isinstance(e, builtin)
    assert (e.code, e.errname, e.message) == (code, name, "what happened")
    assert "what happened" in str(e)
    if isinstance(e, OSError) and code > -1000:
        assert e.errno == -code


def test_other_codes_are_plain_errors():
    with pytest.raises(gpubuf.Error) as ei:
        gpubuf._gpubuf._raise_for_code(-errno.EIO, "disk")
    assert type(ei.value) is gpubuf.Error and ei.value.code == -errno.EIO
    assert gpubuf.strerror(-errno.ENOENT)


def check(e, cls, code, text=None):
    assert type(e) is cls, type(e)
    assert e.code == code and e.errname and e.message
    if text:
        assert text in e.message, e.message


def test_not_found(client):
    with pytest.raises(FileNotFoundError) as ei:
        client.open("t/none")
    check(ei.value, gpubuf.NotFoundError, -errno.ENOENT, "t/none")
    with pytest.raises(FileNotFoundError):
        client.stat("t/none")
    with pytest.raises(FileNotFoundError):
        client.delete("t/none")
    with pytest.raises(FileNotFoundError):
        client.open_id(123456)


def test_no_daemon(tmp_path):
    with pytest.raises(FileNotFoundError) as ei:
        gpubuf.Client(str(tmp_path / "missing.sock"))
    check(ei.value, gpubuf.NotFoundError, -errno.ENOENT, "missing.sock")
    path = str(tmp_path / "deaf.sock")
    s = socket.socket(socket.AF_UNIX)
    s.bind(path)  # bound, never listening
    with pytest.raises(ConnectionRefusedError) as ei:
        gpubuf.Client(path)
    check(ei.value, gpubuf.NoDaemonError, -errno.ECONNREFUSED)
    s.close()


def test_timeout(client):
    with pytest.raises(TimeoutError) as ei:
        client.open("t/late", timeout=0.05)
    check(ei.value, gpubuf.WaitTimeoutError, -errno.ETIMEDOUT, "t/late")
    with pytest.raises(TimeoutError):
        client.open("t/late", timeout=0.25)  # more than one wait slice
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError):
            client.open("t/late", timeout=bad)


def test_exists(client):
    b = client.alloc(8, "t/dup")
    with pytest.raises(FileExistsError) as ei:
        client.alloc(8, "t/dup")
    check(ei.value, gpubuf.ExistsError, -errno.EEXIST, "t/dup")
    b.release()


def test_pool_full_and_no_pool(client):
    with pytest.raises(MemoryError) as ei:
        client.alloc(2 << 20, pool="tiny")
    check(ei.value, gpubuf.PoolFullError, -1008)
    with pytest.raises(gpubuf.NoPoolError) as ei:
        client.alloc(8, pool="nosuch")
    check(ei.value, gpubuf.NoPoolError, -1007, "nosuch")


def test_permission_and_state(client, daemon):
    b = client.alloc(8, "t/seal")
    b.seal(sync=True)
    with pytest.raises(gpubuf.StateError) as ei:
        b.seal()
    check(ei.value, gpubuf.StateError, -1006)
    with gpubuf.Client(daemon.socket) as other:
        o = other.open("t/seal")
        with pytest.raises(PermissionError) as ei:
            o.seal()  # only the allocating connection seals
        check(ei.value, gpubuf.PermissionDeniedError, -errno.EPERM)
        o.release()
    b.release()


def test_invalid_arguments(client):
    for bad in ("bad name!", "", "x" * 256):
        with pytest.raises(ValueError) as ei:
            client.alloc(8, bad)
        assert isinstance(ei.value, gpubuf.InvalidArgumentError)
        assert ei.value.code in (-errno.EINVAL, -errno.ENAMETOOLONG)
    with pytest.raises(ValueError):
        client.open("a\0b")
    with pytest.raises(ValueError):
        client.alloc(0)
    with pytest.raises(ValueError):
        client.alloc(-5)
    with pytest.raises(TypeError):
        client.alloc("8")
    with pytest.raises(TypeError):
        client.open(b"bytes")
    with pytest.raises(ValueError):
        client.set_device(-2)
    with pytest.raises(OverflowError):
        client.open_id(-1)



def test_open_arguments_as_python_parses_them(client):
    """open() and open_id() parse their arguments without
    PyArg_ParseTupleAndKeywords (call.c, fast_args): the same arguments are
    taken, the same mistakes refused with the same TypeErrors."""
    b = client.alloc(64, "t/args")
    b.seal()
    for o in (client.open("t/args"), client.open("t/args", None),
              client.open(name="t/args", timeout=0.5, readonly=False, pool=None, owner=None),
              client.open("t/args", **{"po" + "ol": None}),  # a keyword that is not interned
              client.open_id(b.id), client.open_id(id=b.id, timeout=None)):
        assert o.id == b.id
        o.release()
    cases = [
        (lambda: client.open(), "open() missing required argument 'name' (pos 1)"),
        (lambda: client.open_id(timeout=1), "open_id() missing required argument 'id' (pos 1)"),
        (lambda: client.open("t/args", None, True),
         "open() takes at most 2 positional arguments (3 given)"),
        (lambda: client.open("t/args", bogus=1), "'bogus' is an invalid keyword argument for open()"),
        (lambda: client.open("t/args", name="t/args"),
         "argument for open() given by name ('name') and position (1)"),
        (lambda: client.open_id("1"), "open_id() argument 1 must be int, not str"),
    ]
    for call, text in cases:
        with pytest.raises(TypeError) as ei:
            call()
        assert str(ei.value) == text
    with pytest.raises(ZeroDivisionError):  # readonly= takes any object's truth, as "p" did

        class Bad:
            def __bool__(self):
                raise ZeroDivisionError

        client.open("t/args", readonly=Bad())
    b.release()
    client.delete("t/args")

def test_range(client):
    b = client.alloc(8)
    with pytest.raises(IndexError) as ei:
        b.slice(4, 5)
    check(ei.value, gpubuf.RangeError, -1011)
    b.release()


def test_disconnected(tmp_path):
    d = Daemon(tmp_path, HOST_POOLS)
    c = gpubuf.Client(d.socket)
    b = c.alloc(8, "t/gone")
    d.stop()
    with pytest.raises(ConnectionError) as ei:
        c.status()
    check(ei.value, gpubuf.DisconnectedError, -1010)
    with pytest.raises(gpubuf.DisconnectedError):
        c.alloc(8)
    b.release()  # the view goes quietly
    c.close()


def test_set_device_without_gpu(client):
    try:
        client.set_device(0)
    except (gpubuf.NoDriverError, gpubuf.NoDeviceError) as e:
        assert e.message
    else:
        pytest.skip("this machine has a GPU 0")


def test_the_same_error_twice_keeps_the_daemons_message(client):
    # Old: the second exception said only "[Errno 2] No such file or
    # directory": a message equal to the one before was taken as stale.
    for call in (lambda: client.open("t/twice"), lambda: client.delete("t/twice"),
                 lambda: client.stat("t/twice")):
        for _ in range(3):
            with pytest.raises(gpubuf.NotFoundError) as ei:
                call()
            assert "no buffer named 't/twice'" in ei.value.message, ei.value.message
            assert "no buffer named 't/twice'" in str(ei.value)
    # Also after a success in between, and for a refusal of the library.
    client.alloc(8, "t/between").release()
    for _ in range(2):
        with pytest.raises(gpubuf.InvalidArgumentError) as ei:
            client.open("bad name")
        assert "invalid name 'bad name'" in ei.value.message, ei.value.message


def test_stream_seal_on_a_host_pool_says_what_to_do(client):
    b = client.alloc(8, "t/hoststream")
    # Old: "a host-pool buffer has no GPU work to order: use gpubuf_seal()".
    with pytest.raises(gpubuf.InvalidArgumentError) as ei:
        b.seal(stream=1)
    m = ei.value.message
    assert "stream-ordered seal needs a CUDA pool" in m, m
    assert "buffer 't/hoststream' is in a host pool" in m, m
    assert "call seal() without stream" in m, m
    assert "gpubuf_" not in m, m
    assert (ei.value.code, ei.value.errname, ei.value.errno) == (-errno.EINVAL, "EINVAL",
                                                                 errno.EINVAL)
    b.seal(sync=True)  # still unsealed: the plain seal works
    b.release()


def test_errors_found_by_the_module_have_errname_and_errno(client):
    # The module's own checks: the attributes of the library's errors.
    # Old: no errno on those not derived from OSError.
    b = client.alloc(8)
    cases = [
        (lambda: client.alloc(8, ""), gpubuf.InvalidArgumentError, "EINVAL", errno.EINVAL),
        (lambda: b.slice(4, 5), gpubuf.RangeError, "GPUBUF_ERANGE", None),
        (lambda: b.copy_to_host(0, 99), gpubuf.RangeError, "GPUBUF_ERANGE", None),
        (lambda: b.seal(stream=1), gpubuf.InvalidArgumentError, "EINVAL", errno.EINVAL),
        (lambda: client.open("t/none"), gpubuf.NotFoundError, "ENOENT", errno.ENOENT),
    ]
    for call, cls, name, eno in cases:
        with pytest.raises(cls) as ei:
            call()
        e = ei.value
        assert (e.errname, e.errno) == (name, eno), (e, e.errname, e.errno)
        assert e.code == -eno if eno else e.code < -1000
        assert e.message
    b.release()
    # Items of a batch too.
    [item] = client.open_many(["t/none"])
    assert (type(item), item.errname, item.errno) == (gpubuf.NotFoundError, "ENOENT",
                                                      errno.ENOENT)
    # An instance made anywhere has its class's code and errname.
    for cls, builtin, code, name in TABLE:
        e = cls("made here")
        assert (e.code, e.errname) == (code, name), cls
        if not isinstance(e, OSError):
            assert e.errno == (-code if code > -1000 else None), cls
