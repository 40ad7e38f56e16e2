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

__all__ = ["ArrayView", "Buffer", "Client", "DEFAULT_SOCKET", "PROTOCOL_VERSION", "strerror",
           "__version__"] + _errors
