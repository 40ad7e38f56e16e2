"""gpubuf: share GPU (and host) memory between processes through gpubufd.

    import gpubuf, cupy
    with gpubuf.Client() as client:              # $GPUBUF_SOCKET or /run/gpubuf/gpubufd.sock
        with client.open("frame", timeout=5) as buf:
            frame = cupy.from_dlpack(buf)        # zero-copy, keeps the buffer alive

A C extension over libgpubuf-client; see docs/python.md.
"""
from . import _gpubuf
from ._gpubuf import ArrayView, Buffer, Client, Error, __version__, strerror

DEFAULT_SOCKET = _gpubuf.DEFAULT_SOCKET
PROTOCOL_VERSION = _gpubuf.PROTOCOL_VERSION

# Every exception class of the extension: gpubuf.Error and its subclasses.
_errors = sorted(n for n, v in vars(_gpubuf).items()
                 if isinstance(v, type) and issubclass(v, Error))
globals().update({n: getattr(_gpubuf, n) for n in _errors})



def publish(client, name, array, *, pool=None, ttl=None, user_data=None):
    """Copy an array (NumPy, PyTorch, CuPy, or anything with the buffer
    protocol) into a new buffer `name` that carries its dtype and shape, seal
    it and return its Buffer (release it when done; the name stays published).
    Openers get the same dtype and shape from torch/cupy/numpy.from_dlpack.
    CUDA arrays need a CUDA pool, host arrays any pool."""
    lib = type(array).__module__.split(".")[0]
    if lib == "torch":
        dtype = _gpubuf._dlpack_dtype(array)
    else:
        dtype = getattr(array, "dtype", None)
        if dtype is None:  # a plain buffer-protocol object: its bytes
            array = memoryview(array).cast("B")
            dtype = "uint8"
    shape = tuple(array.shape)
    buf = client.alloc(None, name, pool, dtype=dtype, shape=shape, user_data=user_data, ttl=ttl)
    try:
        if lib == "torch":
            import torch
            torch.from_dlpack(buf).copy_(array)
            if array.is_cuda or buf.is_cuda:
                torch.cuda.synchronize()
        elif lib == "cupy":
            import cupy
            dst = cupy.from_dlpack(buf)
            dst[...] = array
            cupy.cuda.get_current_stream().synchronize()
        else:
            if lib == "numpy":
                import numpy
                array = numpy.ascontiguousarray(array)
            buf.copy_from_host(array)
        buf.seal(sync=True)
    except BaseException:
        buf.release()
        client.delete(name, pool=pool)
        raise
    return buf


__all__ = ["ArrayView", "Buffer", "Client", "DEFAULT_SOCKET", "PROTOCOL_VERSION", "publish",
           "strerror", "__version__"] + _errors
