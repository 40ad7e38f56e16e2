"""One process of the GPU tests (test_gpu.py): a producer that writes with
CuPy, or a consumer that opens the buffer zero-copy in one framework.

    gpu_worker.py produce NAME N
    gpu_worker.py consume NAME MODE N

Exit 0 when the check passed, 3 (with a SKIP line) when the framework cannot
be imported, anything else on failure. The socket comes from $GPUBUF_SOCKET."""
import gc
import sys

import numpy as np

import gpubuf


def expected(n):
    return np.arange(n, dtype=np.float32) * 2 + 1


def skip(what, e):
    print(f"SKIP {what}: {type(e).__name__}: {e}")
    sys.exit(3)


def produce(c, name, n):
    import cupy

    buf = c.alloc(4 * n, name=name)
    assert buf.is_cuda and buf.pool_kind == "cuda-ipc", buf
    with cupy.cuda.Device(buf.device):
        a = cupy.from_dlpack(buf.as_array("float32"))
        assert a.data.ptr == buf.address  # zero-copy
        a[:] = cupy.arange(n, dtype=cupy.float32) * 2 + 1
        cupy.cuda.runtime.deviceSynchronize()
    del a
    buf.seal(sync=True)
    buf.release()
    print("produced", name)


def consume(c, name, mode, n):
    buf = c.open(name, timeout=30)
    want = expected(n)
    if mode.startswith("cupy"):
        try:
            import cupy
        except ImportError as e:
            skip("cupy", e)
        with cupy.cuda.Device(buf.device):
            if mode == "cupy_dlpack":
                a = cupy.from_dlpack(buf.as_array("float32"))
            elif mode == "cupy_cai":
                a = cupy.asarray(buf.as_array("float32"))
            elif mode == "cupy_bytes":  # untyped: uint8 through DLPack, then a view
                a = cupy.from_dlpack(buf).view(cupy.float32)
            elif mode == "cupy_buffer_cai":  # the Buffer's own interface, then release
                a = cupy.asarray(buf).view(cupy.float32)
                buf.release()  # deferred: cupy holds the Buffer object
                assert c.stat(name)["refs"] >= 1
            assert mode == "cupy_buffer_cai" or a.data.ptr == buf.address
            assert (a.get() == want).all()
    elif mode.startswith("torch"):
        try:
            import torch
        except ImportError as e:
            skip("torch", e)
        if mode == "torch_dlpack":
            t = torch.from_dlpack(buf.as_array("float32"))
        elif mode == "torch_as_tensor":
            t = torch.as_tensor(buf.as_array("float32"), device=f"cuda:{buf.device}")
        elif mode == "torch_outlives":  # a tensor outliving the Buffer object
            t = torch.from_dlpack(buf).view(torch.float32)
            address = buf.address
            buf.release()
            del buf
            gc.collect()
            assert c.stat(name)["refs"] >= 1
            assert t.data_ptr() == address
            assert (t.cpu().numpy() == want).all()
            del t
            gc.collect()
            c.flush()
            print("ok", mode)
            return
        assert t.is_cuda and t.device.index == buf.device
        assert t.data_ptr() == buf.address  # zero-copy
        assert (t.cpu().numpy() == want).all()
    elif mode == "numba":
        try:
            from numba import cuda
        except Exception as e:  # noqa: BLE001 - e.g. Numba built against another NumPy
            skip("numba", e)
        d = cuda.as_cuda_array(buf.as_array("float32"))
        assert d.__cuda_array_interface__["data"][0] == buf.address
        assert (d.copy_to_host() == want).all()
    elif mode == "copies":  # copy_to_host / copy_from_host on device memory
        assert np.frombuffer(buf.to_pybytes(), dtype=np.float32).tolist() == want.tolist()
        out = np.zeros(4, dtype=np.float32)
        buf.copy_to_host(position=8, buf=out)
        assert out.tolist() == want[2:6].tolist()
        s = buf.slice(4 * (n - 2))
        assert np.frombuffer(s.to_pybytes(), dtype=np.float32).tolist() == want[-2:].tolist()
        try:
            memoryview(buf)
            raise AssertionError("a CUDA buffer exported host memory")
        except BufferError:
            pass
        assert buf.__dlpack_device__() == (2, buf.device)
        for obj in (buf, buf.as_array("float32")):
            try:
                np.asarray(obj)
                raise AssertionError("NumPy wrapped device memory")
            except TypeError as e:
                assert "copy_to_host" in str(e)
        s.release()
    else:
        raise SystemExit(f"unknown mode {mode}")
    if not buf.released:
        buf.release()
    print("ok", mode)


SPIN_FILL = r"""
extern "C" __global__ void spin_fill(float *p, long long n, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        p[i] = 2.0f * i + 1.0f;
}
"""


def produce_stream(c, name, n):
    """Fill a cuda-vmm buffer with a kernel that spins first, on a stream of its
    own, and seal on that stream at once: no host synchronisation."""
    import cupy

    buf = c.alloc(4 * n, name=name, pool="vmm")
    assert buf.pool_kind == "cuda-vmm", buf.pool_kind
    with cupy.cuda.Device(buf.device):
        k = cupy.RawKernel(SPIN_FILL, "spin_fill")
        s = cupy.cuda.Stream(non_blocking=True)
        a = cupy.from_dlpack(buf.as_array("float32"))
        k((256,), (256,), (a, cupy.int64(n), cupy.int64(1_000_000_000)), stream=s)
        buf.seal(stream=s)
        done = s.done
    assert not done, "the kernel ended before the seal returned"
    del a
    buf.release()
    print("sealed on a stream with the kernel running", name)
    # Client.close() (at exit of the with block) waits for the seal event.


def consume_stream(c, name, n):
    """Open (waiting), take the buffer into torch on its current stream: the
    stream waits for the producer's event through __dlpack__(stream=...)."""
    import torch

    torch.cuda.init()
    print("waiting", flush=True)
    buf = c.open(name, timeout=60, readonly=True, pool="vmm")  # names are per pool
    assert buf.read_only and buf.pool_kind == "cuda-vmm"
    with torch.cuda.device(buf.device):
        t = torch.from_dlpack(buf.as_array("float32"))
        got = (t * 1).cpu().numpy()  # queued on torch's stream after the wait
    bad = int((got != expected(n)).sum())
    print(f"{bad} mismatches in {n} floats read through torch on a read-only cuda-vmm view")
    assert bad == 0
    del t
    buf.release()
    print("ok stream")


def produce_typed(c, name, lib):
    """Publish a (64, 32) array with its dtype and shape: float16 from torch
    (gpubuf.publish), float32 from CuPy (alloc with dtype/shape)."""
    if lib == "torch":
        try:
            import torch
        except ImportError as e:
            skip("torch", e)
        t = (torch.arange(64 * 32, device="cuda", dtype=torch.float16) % 1000).reshape(64, 32)
        buf = gpubuf.publish(c, name, t, pool="gpu0", user_data=b"torch")
    else:
        import cupy
        buf = c.alloc(None, name, "gpu0", dtype="float32", shape=(64, 32), user_data=b"cupy")
        with cupy.cuda.Device(buf.device):
            a = cupy.from_dlpack(buf)
            assert a.shape == (64, 32) and a.dtype == cupy.float32
            a[...] = cupy.arange(64 * 32, dtype=cupy.float32).reshape(64, 32) % 1000
            cupy.cuda.runtime.deviceSynchronize()
        del a
        buf.seal(sync=True)
    assert buf.layout["shape"] == (64, 32), buf.layout
    buf.release()
    print("produced typed", name)


def consume_typed(c, name, lib, dtype):
    """from_dlpack of the opened Buffer has the producer's dtype and shape."""
    buf = c.open(name, timeout=30)
    want = (np.arange(64 * 32) % 1000).reshape(64, 32)
    if lib == "torch":
        try:
            import torch
        except ImportError as e:
            skip("torch", e)
        t = torch.from_dlpack(buf)
        assert t.is_cuda and tuple(t.shape) == (64, 32), t.shape
        assert str(t.dtype) == f"torch.{dtype}", t.dtype
        assert (t.cpu().float().numpy() == want).all()
        del t
    else:
        import cupy
        a = cupy.from_dlpack(buf)
        assert a.shape == (64, 32) and a.dtype == np.dtype(dtype), (a.shape, a.dtype)
        assert (cupy.asnumpy(a).astype(np.float32) == want).all()
        del a
    gc.collect()
    buf.release()
    print(f"ok typed {lib} {dtype}")


def main():
    with gpubuf.Client() as c:
        if sys.argv[1] == "produce_typed":
            produce_typed(c, sys.argv[2], sys.argv[3])
        elif sys.argv[1] == "consume_typed":
            consume_typed(c, sys.argv[2], sys.argv[3], sys.argv[4])
        elif sys.argv[1] == "produce":
            produce(c, sys.argv[2], int(sys.argv[3]))
        elif sys.argv[1] == "produce_stream":
            produce_stream(c, sys.argv[2], int(sys.argv[3]))
        elif sys.argv[1] == "consume_stream":
            consume_stream(c, sys.argv[2], int(sys.argv[3]))
        else:
            consume(c, sys.argv[2], sys.argv[3], int(sys.argv[4]))
        c.flush()


if __name__ == "__main__":
    main()
