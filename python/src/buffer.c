/* Buffer: a view of a gpubuf buffer (its typed views, ArrayView, are in
 * arrayview.c; the zero-copy exports of both in export.c). */
#include "export.h" /* Python.h comes before the system headers */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "layout.h"
#include "util.h"

/* ---- Buffer ----------------------------------------------------------------------- */

PyObject *gpubufpy_buffer_new(GpubufClient *client, gpubuf_buffer *b) {
    GpubufBuffer *o = PyObject_New(GpubufBuffer, &GpubufBuffer_Type);
    if (!o) {
        gpubufpy_view_drop(b, gpubufpy_pid());
        return NULL;
    }
    o->b = b;
    o->deferred = NULL;
    o->client = (GpubufClient *)Py_NewRef((PyObject *)client);
    o->pid = gpubufpy_pid();
    o->cai_exported = false;
    return (PyObject *)o;
}

static gpubuf_buffer *buf_view(GpubufBuffer *self) {
    if (!self->b)
        PyErr_SetString(PyExc_ValueError, "the gpubuf Buffer was released");
    return self->b;
}

/* The export of a view that is not released: its bytes (uint8, 1-D), with
 * the producer's layout (dtype and shape, when it gave them) where
 * with_layout. False with exc set when it was released (ValueError as
 * buf_view(), or the exception a protocol expects). */
static bool buf_export(GpubufBuffer *self, export_t *e, bool with_layout, PyObject *exc) {
    if (!self->b) {
        PyErr_SetString(exc, "the gpubuf Buffer was released");
        return false;
    }
    e->b = self->b;
    e->client = self->client;
    e->pid = self->pid;
    e->dt = (dtype_t){'u', 1};
    e->ndim = 1;
    e->len = (Py_ssize_t)gpubuf_buffer_size(self->b);
    e->shape = &e->len;
    e->layout = with_layout ? gpubuf_buffer_layout(self->b) : NULL;
    return true;
}

static void buf_dealloc(GpubufBuffer *self) {
    gpubufpy_view_drop(self->b, self->pid);
    gpubufpy_view_drop(self->deferred, self->pid);
    Py_XDECREF(self->client);
    PyObject_Free(self);
}

static PyObject *buf_release(GpubufBuffer *self, PyObject *unused) {
    gpubuf_buffer *b = self->b;
    self->b = NULL;
    if (b && self->cai_exported && !self->deferred)
        self->deferred = b; /* consumers of the interface hold this object */
    else
        gpubufpy_view_drop(b, self->pid);
    Py_RETURN_NONE;
}

static PyObject *buf_enter(GpubufBuffer *self, PyObject *unused) {
    if (!buf_view(self))
        return NULL;
    return Py_NewRef((PyObject *)self);
}

static PyObject *buf_exit(GpubufBuffer *self, PyObject *args) {
    return buf_release(self, NULL);
}

/* Run op(b, arg) without the GIL and raise its error; b holds one more
 * reference for the call, since another thread may release the Buffer
 * meanwhile. Returns 0, or -1 with an exception set. */
typedef int (*view_op)(gpubuf_buffer *b, void *arg);

static int view_run(GpubufBuffer *self, gpubuf_buffer *b, view_op op, void *arg) {
    int r;
    gpubuf_buffer_ref(b);
    Py_BEGIN_ALLOW_THREADS
        r = op(b, arg);
    Py_END_ALLOW_THREADS
    if (r < 0)
        gpubufpy_raise(r); /* before the drop, which may send a request */
    gpubufpy_view_drop(b, self->pid);
    return r < 0 ? -1 : 0;
}

struct seal_args {
    int sync;
    bool on_stream;
    gpubuf_stream stream;
    const gpubuf_meta *meta; /* seal with metadata (synchronous) */
};

static int op_seal(gpubuf_buffer *b, void *arg) {
    struct seal_args *a = arg;
    if (a->meta)
        return gpubuf_seal_sync_with(b, a->meta);
    if (a->on_stream)
        return gpubuf_seal_stream(b, a->stream);
    return a->sync ? gpubuf_seal_sync(b) : gpubuf_seal(b);
}

static int op_wait(gpubuf_buffer *b, void *arg) {
    return gpubuf_buffer_wait(b, *(gpubuf_stream *)arg);
}

/* A host copy: to_host or from it. */
struct copy_args {
    uint64_t position, len;
    void *host;
};

static int op_copy_to_host(gpubuf_buffer *b, void *arg) {
    struct copy_args *a = arg;
    return gpubuf_buffer_copy_to_host(b, a->position, a->host, a->len);
}

static int op_copy_from_host(gpubuf_buffer *b, void *arg) {
    struct copy_args *a = arg;
    return gpubuf_buffer_copy_from_host(b, a->position, a->host, a->len);
}

/* seal(stream=...) of a host-pool buffer: said in Python's words (the
 * library's message names its C function). */
static PyObject *host_stream_seal(gpubuf_buffer *b) {
    char msg[512], name[256 + 16];
    const char *n = gpubuf_buffer_name(b);
    if (n && *n)
        snprintf(name, sizeof(name), "'%s'", n); /* names are printable ASCII */
    else
        snprintf(name, sizeof(name), "%llu", (unsigned long long)gpubuf_buffer_id(b));
    snprintf(msg, sizeof(msg),
             "a stream-ordered seal needs a CUDA pool; buffer %s is in a host pool, which has "
             "no GPU work to order: call seal() without stream",
             name);
    return gpubufpy_raise_msg(-EINVAL, msg);
}

static PyObject *buf_seal(GpubufBuffer *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"sync",        "stream",    "dtype", "shape", "strides",
                             "byte_offset", "user_data", "ttl",   NULL};
    struct seal_args a = {0};
    PyObject *stream = Py_None, *dtype = Py_None, *shape = Py_None, *strides = Py_None,
             *user = Py_None, *ttl = Py_None;
    unsigned long long byte_offset = 0;
    gpubuf_layout layout;
    gpubuf_meta meta = {0};
    Py_buffer ub = {0};
    gpubuf_buffer *b;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|p$OOOOKOO:seal", kwlist, &a.sync, &stream, &dtype,
                                     &shape, &strides, &byte_offset, &user, &ttl) ||
        !(b = buf_view(self)))
        return NULL;
    if (dtype != Py_None || shape != Py_None || strides != Py_None || user != Py_None ||
        ttl != Py_None) {
        if (stream != Py_None) {
            PyErr_SetString(PyExc_ValueError, "seal(stream=...) takes no metadata: give it at "
                                              "alloc()");
            return NULL;
        }
        if (gpubufpy_meta_args(dtype, shape, strides, byte_offset, user, ttl, &layout, &ub, &meta) <
            0)
            return NULL;
        a.meta = &meta;
        if (self->pid != gpubufpy_pid()) {
            PyBuffer_Release(&ub);
            return gpubufpy_raise_fork(self->pid);
        }
        int r = view_run(self, b, op_seal, &a);
        PyBuffer_Release(&ub);
        if (r < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    if (stream != Py_None) {
        if (a.sync) {
            PyErr_SetString(PyExc_ValueError, "seal(stream=...) does not wait: drop sync=True");
            return NULL;
        }
        if (gpubufpy_stream_arg(stream, &a.stream) < 0)
            return NULL;
        if (gpubuf_buffer_pool_kind(b) == GPUBUF_POOL_HOST)
            return host_stream_seal(b);
        a.on_stream = true;
    }
    if (self->pid != gpubufpy_pid())
        return gpubufpy_raise_fork(self->pid);
    if (view_run(self, b, op_seal, &a) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *buf_wait(GpubufBuffer *self, PyObject *stream_o) {
    gpubuf_stream stream;
    gpubuf_buffer *b;
    if (!(b = buf_view(self)) || gpubufpy_stream_arg(stream_o, &stream) < 0)
        return NULL;
    if (self->pid != gpubufpy_pid())
        return gpubufpy_raise_fork(self->pid);
    if (view_run(self, b, op_wait, &stream) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int range_arg(gpubuf_buffer *b, long long position, long long nbytes, uint64_t *ret_len) {
    uint64_t size = gpubuf_buffer_size(b);
    char msg[160];
    if (position < 0 || (uint64_t)position > size) {
        snprintf(msg, sizeof(msg), "position %lld outside a view of %llu bytes", position,
                 (unsigned long long)size);
        gpubufpy_raise_msg(GPUBUF_ERANGE, msg);
        return -1;
    }
    if (nbytes < 0) {
        *ret_len = size - (uint64_t)position;
        return 0;
    }
    if ((uint64_t)nbytes > size - (uint64_t)position) {
        snprintf(msg, sizeof(msg), "%lld bytes at %lld outside a view of %llu bytes", nbytes,
                 position, (unsigned long long)size);
        gpubufpy_raise_msg(GPUBUF_ERANGE, msg);
        return -1;
    }
    *ret_len = (uint64_t)nbytes;
    return 0;
}

static PyObject *buf_slice(GpubufBuffer *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"offset", "length", NULL};
    long long offset, length = -1;
    gpubuf_buffer *b, *s;
    uint64_t len;
    int r;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "L|L:slice", kwlist, &offset, &length) ||
        !(b = buf_view(self)) || range_arg(b, offset, length, &len) < 0)
        return NULL;
    r = gpubuf_buffer_slice(b, (uint64_t)offset, len, &s);
    if (r < 0)
        return gpubufpy_raise(r);
    return gpubufpy_buffer_new(self->client, s);
}

static PyObject *buf_copy_to_host(GpubufBuffer *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"position", "nbytes", "buf", NULL};
    long long position = 0, nbytes = -1;
    PyObject *dst = Py_None, *result;
    Py_buffer out;
    gpubuf_buffer *b;
    uint64_t len;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|LLO:copy_to_host", kwlist, &position, &nbytes,
                                     &dst) ||
        !(b = buf_view(self)))
        return NULL;
    if (dst == Py_None) {
        if (range_arg(b, position, nbytes, &len) < 0)
            return NULL;
        if (len > (uint64_t)PY_SSIZE_T_MAX)
            return PyErr_NoMemory();
        result = PyByteArray_FromStringAndSize(NULL, (Py_ssize_t)len);
        if (!result || PyObject_GetBuffer(result, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
            Py_XDECREF(result);
            return NULL;
        }
    } else {
        if (PyObject_GetBuffer(dst, &out, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0)
            return NULL;
        if (range_arg(b, position, nbytes, &len) < 0) {
            PyBuffer_Release(&out);
            return NULL;
        }
        if (nbytes < 0 && len > (uint64_t)out.len)
            len = (uint64_t)out.len; /* until the host buffer is full */
        if (len > (uint64_t)out.len) {
            PyErr_Format(PyExc_ValueError, "buf holds %zd bytes, %lld asked for", out.len, nbytes);
            PyBuffer_Release(&out);
            return NULL;
        }
        result = Py_NewRef(dst);
    }
    struct copy_args a = {(uint64_t)position, len, out.buf};
    int r = view_run(self, b, op_copy_to_host, &a);
    PyBuffer_Release(&out);
    if (r < 0)
        Py_CLEAR(result);
    return result;
}

static PyObject *buf_copy_from_host(GpubufBuffer *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"data", "position", NULL};
    long long position = 0;
    PyObject *data;
    Py_buffer in;
    gpubuf_buffer *b;
    uint64_t len;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|L:copy_from_host", kwlist, &data, &position) ||
        !(b = buf_view(self)))
        return NULL;
    if (PyObject_GetBuffer(data, &in, PyBUF_C_CONTIGUOUS) < 0)
        return NULL;
    if (range_arg(b, position, in.len, &len) < 0) {
        PyBuffer_Release(&in);
        return NULL;
    }
    struct copy_args a = {(uint64_t)position, len, in.buf};
    int r = view_run(self, b, op_copy_from_host, &a);
    PyBuffer_Release(&in);
    return r < 0 ? NULL : PyLong_FromUnsignedLongLong(len);
}

static PyObject *buf_to_pybytes(GpubufBuffer *self, PyObject *unused) {
    gpubuf_buffer *b = buf_view(self);
    PyObject *bytes;
    uint64_t len;
    if (!b)
        return NULL;
    len = gpubuf_buffer_size(b);
    if (len > (uint64_t)PY_SSIZE_T_MAX)
        return PyErr_NoMemory();
    /* Filled before anyone sees it. */
    if (!(bytes = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)len)))
        return NULL;
    struct copy_args a = {0, len, PyBytes_AS_STRING(bytes)};
    if (view_run(self, b, op_copy_to_host, &a) < 0)
        Py_CLEAR(bytes);
    return bytes;
}


/* shape: None (the whole view, 1-D), an int, or a sequence of ints. */
static int shape_arg(PyObject *o, uint64_t nbytes, dtype_t dt, int *ret_ndim, Py_ssize_t *shape) {
    uint64_t total = (uint64_t)dt.itemsize;
    int ndim;
    if (o == Py_None) {
        if (nbytes % (uint64_t)dt.itemsize) {
            PyErr_Format(PyExc_ValueError, "%llu bytes are not a whole number of %d-byte items",
                         (unsigned long long)nbytes, dt.itemsize);
            return -1;
        }
        shape[0] = (Py_ssize_t)(nbytes / (uint64_t)dt.itemsize);
        *ret_ndim = 1;
        return 0;
    }
    int64_t dims[MAX_NDIM];
    ndim = gpubufpy_ints_arg(o, "shape", "shape must be None, an int or a sequence of ints",
                             MAX_NDIM, true, dims);
    if (ndim < 0)
        return -1;
    for (int i = 0; i < ndim; i++) {
        shape[i] = (Py_ssize_t)dims[i];
        if (shape[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "shape entries must be >= 0");
            return -1;
        }
        if (shape[i] && total > UINT64_MAX / (uint64_t)shape[i]) {
            total = UINT64_MAX;
            break;
        }
        total *= (uint64_t)shape[i];
    }
    if (total > nbytes) {
        char msg[160];
        snprintf(msg, sizeof(msg), "shape needs %llu bytes, the view has %llu",
                 (unsigned long long)total, (unsigned long long)nbytes);
        gpubufpy_raise_msg(GPUBUF_ERANGE, msg);
        return -1;
    }
    *ret_ndim = ndim;
    return 0;
}

static PyObject *buf_as_array(GpubufBuffer *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"dtype", "shape", NULL};
    PyObject *dtype_o = NULL, *shape_o = Py_None;
    Py_ssize_t shape[MAX_NDIM];
    dtype_t dt = {'u', 1};
    gpubuf_buffer *b;
    int ndim;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OO:as_array", kwlist, &dtype_o, &shape_o) ||
        !(b = buf_view(self)))
        return NULL;
    if (dtype_o && dtype_o != Py_None && gpubufpy_dtype_arg(dtype_o, &dt) < 0)
        return NULL;
    if (shape_arg(shape_o, gpubuf_buffer_size(b), dt, &ndim, shape) < 0)
        return NULL;
    return gpubufpy_arrayview_new(self, dt, ndim, shape);
}

static PyObject *buf_dlpack(GpubufBuffer *self, PyObject *const *args, Py_ssize_t nargs,
                            PyObject *kwnames) {
    export_t e;
    if (!buf_export(self, &e, true, PyExc_ValueError))
        return NULL;
    return gpubufpy_export_dlpack(&e, args, nargs, kwnames);
}

static PyObject *buf_dlpack_device(GpubufBuffer *self, PyObject *unused) {
    export_t e;
    return buf_export(self, &e, false, PyExc_ValueError) ? gpubufpy_export_dlpack_device(&e) : NULL;
}

static PyObject *buf_array(GpubufBuffer *self, PyObject *args, PyObject *kw) {
    export_t e;
    return buf_export(self, &e, false, PyExc_ValueError)
               ? gpubufpy_export_array(&e, (PyObject *)self)
               : NULL;
}

/* The array interface and the buffer protocol describe the producer's
 * layout, as __dlpack__ does. */
static PyObject *buf_get_cai(GpubufBuffer *self, void *unused) {
    export_t e;
    PyObject *d = buf_export(self, &e, true, PyExc_AttributeError) ? gpubufpy_export_cai(&e) : NULL;
    if (d)
        self->cai_exported = true;
    return d;
}

static int buf_getbuffer(GpubufBuffer *self, Py_buffer *view, int flags) {
    export_t e;
    if (!buf_export(self, &e, true, PyExc_BufferError))
        return -1;
    return gpubufpy_export_getbuffer(&e, (PyObject *)self, view, flags, self->layout_strides);
}

static void buf_releasebuffer(GpubufBuffer *self, Py_buffer *view) {
    gpubufpy_view_drop(view->internal, self->pid);
}

static PyBufferProcs buf_as_buffer = {
    .bf_getbuffer = (getbufferproc)buf_getbuffer,
    .bf_releasebuffer = (releasebufferproc)buf_releasebuffer,
};

#define BUF_GETTER(fn, expr)                                                                       \
    static PyObject *fn(GpubufBuffer *self, void *unused) {                                        \
        gpubuf_buffer *b = buf_view(self);                                                         \
        if (!b)                                                                                    \
            return NULL;                                                                           \
        return expr;                                                                               \
    }
BUF_GETTER(buf_get_size, PyLong_FromUnsignedLongLong(gpubuf_buffer_size(b)))
BUF_GETTER(buf_get_address, PyLong_FromUnsignedLongLong(gpubuf_buffer_device_ptr(b)))
BUF_GETTER(buf_get_device, PyLong_FromLong(gpubuf_buffer_device(b)))
BUF_GETTER(buf_get_memory_device, PyLong_FromLong(gpubuf_buffer_memory_device(b)))
BUF_GETTER(buf_get_name, PyUnicode_FromString(gpubuf_buffer_name(b)))
BUF_GETTER(buf_get_id, PyLong_FromUnsignedLongLong(gpubuf_buffer_id(b)))
BUF_GETTER(buf_get_pool_kind,
           PyUnicode_FromString(gpubuf_pool_kind_name(gpubuf_buffer_pool_kind(b))))
BUF_GETTER(buf_get_is_cuda, PyBool_FromLong(!gpubufpy_is_host(b)))
BUF_GETTER(buf_get_read_only, PyBool_FromLong(gpubuf_buffer_read_only(b)))

static PyObject *buf_get_layout(GpubufBuffer *self, void *unused) {
    gpubuf_buffer *b = buf_view(self);
    const gpubuf_layout *l;
    if (!b)
        return NULL;
    if (!(l = gpubuf_buffer_layout(b)))
        Py_RETURN_NONE;
    return gpubufpy_layout_dict(l);
}

static PyObject *buf_get_user_data(GpubufBuffer *self, void *unused) {
    gpubuf_buffer *b = buf_view(self);
    size_t n;
    const void *p;
    if (!b)
        return NULL;
    if (!(p = gpubuf_buffer_user_data(b, &n)))
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(p, (Py_ssize_t)n);
}

static PyObject *buf_get_released(GpubufBuffer *self, void *unused) {
    return PyBool_FromLong(self->b == NULL);
}

static PyObject *buf_get_client(GpubufBuffer *self, void *unused) {
    return Py_NewRef((PyObject *)self->client);
}

static PyObject *buf_repr(GpubufBuffer *self) {
    gpubuf_buffer *b = self->b;
    if (!b)
        return PyUnicode_FromString("<gpubuf.Buffer released>");
    return PyUnicode_FromFormat("<gpubuf.Buffer id=%llu name='%s' size=%llu %s device=%d>",
                                (unsigned long long)gpubuf_buffer_id(b), gpubuf_buffer_name(b),
                                (unsigned long long)gpubuf_buffer_size(b),
                                gpubuf_pool_kind_name(gpubuf_buffer_pool_kind(b)),
                                gpubuf_buffer_device(b));
}

static PyMethodDef buf_methods[] = {
    GPUBUFPY_KW_METHOD(
        "seal", buf_seal,
        "seal(sync=False, *, stream=None, dtype=None, shape=None, strides=None, byte_offset=0, "
        "user_data=None, ttl=None)\n\nPublish the buffer (allocated by this connection): "
        "others can open it. sync=False sends the seal without waiting (a waiting open sees it; "
        "errors surface at Client.flush()); sync=True returns once the daemon applied it. "
        "stream (a CUDA stream: an int handle, a torch.cuda.Stream or a cupy.cuda.Stream): seal "
        "in stream order, after the work queued on it, without waiting for the GPU; openers' "
        "streams wait for it (wait(), or __dlpack__(stream=...)). dtype, shape, strides, "
        "byte_offset, user_data, ttl: set the buffer's metadata at the seal (as Client.alloc; "
        "synchronous, not with stream)."),
    {"wait", (PyCFunction)buf_wait, METH_O,
     "wait(stream)\n\nMake a CUDA stream wait, on the GPU, for the work the producer sealed "
     "with seal(stream=...); returns at once when it sealed without a stream. "
     "torch.from_dlpack and cupy.from_dlpack do this by themselves through __dlpack__."},
    {"release", (PyCFunction)buf_release, METH_NOARGS,
     "release()\n\nDrop this view. The daemon reference goes when no export (DLPack tensor, "
     "memoryview, ArrayView, a consumer of __cuda_array_interface__) still uses it. "
     "Idempotent."},
    GPUBUFPY_KW_METHOD(
        "slice", buf_slice,
        "slice(offset, length=-1) -> Buffer\n\nA zero-copy view of length bytes (-1: to the end) "
        "that keeps this one alive."),
    GPUBUFPY_KW_METHOD(
        "copy_to_host", buf_copy_to_host,
        "copy_to_host(position=0, nbytes=-1, buf=None)\n\nCopy nbytes (-1: to the end, or until "
        "buf is full) from position into buf (any writable buffer), or into a new bytearray. "
        "Returns buf or the bytearray."),
    GPUBUFPY_KW_METHOD(
        "copy_from_host", buf_copy_from_host,
        "copy_from_host(data, position=0) -> int\n\nCopy data (any C-contiguous object with the "
        "buffer protocol) into the buffer at position. Returns the number of bytes copied."),
    {"to_pybytes", (PyCFunction)buf_to_pybytes, METH_NOARGS,
     "to_pybytes() -> bytes\n\nA copy of the whole view."},
    GPUBUFPY_KW_METHOD(
        "as_array", buf_as_array,
        "as_array(dtype='uint8', shape=None) -> ArrayView\n\nA typed, C-contiguous view for "
        "consumers that need a dtype: cupy.asarray, torch.as_tensor, numba.cuda.as_cuda_array, "
        "numpy.asarray (host pools), *.from_dlpack. shape=None: the whole view, 1-D."),
    GPUBUFPY_FAST_METHOD(
        "__dlpack__", buf_dlpack,
        "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n\nA DLPack "
        "capsule with the buffer's layout (dtype, shape, strides, byte offset) when it has one, "
        "else of the bytes (uint8, 1-D); kDLCUDA for CUDA pools, kDLCPU for host pools."),
    {"__dlpack_device__", (PyCFunction)buf_dlpack_device, METH_NOARGS,
     "__dlpack_device__() -> (device_type, device_id)"},
    GPUBUFPY_KW_METHOD(
        "__array__", buf_array,
        "__array__(dtype=None, copy=None): NumPy's fallback; TypeError for CUDA buffers."),
    {"__enter__", (PyCFunction)buf_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)buf_exit, METH_VARARGS, NULL},
    {NULL},
};

static PyGetSetDef buf_getset[] = {
    {"size", (getter)buf_get_size, NULL, "Size of the view in bytes.", NULL},
    {"address", (getter)buf_get_address, NULL,
     "Address of the first byte: a device address for CUDA pools (not a CPU pointer), the host "
     "address for host pools.",
     NULL},
    {"device", (getter)buf_get_device, NULL,
     "CUDA ordinal (in this process) whose context the address belongs to; -1 for host pools.",
     NULL},
    {"memory_device", (getter)buf_get_memory_device, NULL,
     "CUDA ordinal of the GPU holding the memory; -1 for host pools.", NULL},
    {"name", (getter)buf_get_name, NULL, "The buffer's name, '' if anonymous.", NULL},
    {"id", (getter)buf_get_id, NULL, "The daemon's id of the buffer.", NULL},
    {"pool_kind", (getter)buf_get_pool_kind, NULL, "'host', 'cuda-ipc' or 'cuda-vmm'.", NULL},
    {"is_cuda", (getter)buf_get_is_cuda, NULL, "True for device memory.", NULL},
    {"read_only", (getter)buf_get_read_only, NULL,
     "True when opened with readonly=True (the mapping refuses writes).", NULL},
    {"released", (getter)buf_get_released, NULL, "True once release() was called.", NULL},
    {"layout", (getter)buf_get_layout, NULL,
     "The array layout the producer gave (alloc or seal): a dict with dtype, dtype_code, "
     "dtype_bits, dtype_lanes, shape, strides (None: C order) and byte_offset; None without "
     "one, and for slices. __dlpack__ exports it.",
     NULL},
    {"user_data", (getter)buf_get_user_data, NULL, "The user bytes the producer gave, or None.",
     NULL},
    {"client", (getter)buf_get_client, NULL, "The Client the buffer came from.", NULL},
    {"__cuda_array_interface__", (getter)buf_get_cai, NULL,
     "CUDA Array Interface v3 (uint8, 1-D); AttributeError for host pools.", NULL},
    {NULL},
};

PyTypeObject GpubufBuffer_Type = {
    GPUBUFPY_TYPE_SLOTS("gpubuf.Buffer", GpubufBuffer, buf),
    .tp_as_buffer = &buf_as_buffer,
    .tp_doc = "A view of a gpubuf buffer (from Client.alloc, open, open_id or Buffer.slice). "
              "Holds one daemon reference until released; a context manager that releases "
              "it.",
};

/* ---- metadata arguments --------------------------------------------------------------- */

int gpubufpy_meta_args(PyObject *dtype, PyObject *shape, PyObject *strides,
                       unsigned long long byte_offset, PyObject *user, PyObject *ttl,
                       gpubuf_layout *layout, Py_buffer *user_buf, gpubuf_meta *ret) {
    memset(ret, 0, sizeof(*ret));
    memset(user_buf, 0, sizeof(*user_buf));
    if (dtype != Py_None || shape != Py_None || strides != Py_None) {
        if (dtype == Py_None) {
            PyErr_SetString(PyExc_ValueError, "a shape or strides needs a dtype");
            return -1;
        }
        if (gpubufpy_layout_arg(dtype, shape, strides, byte_offset, layout) < 0)
            return -1;
        ret->layout = layout;
    }
    if (ttl != Py_None) {
        double t = PyFloat_AsDouble(ttl);
        if (t == -1.0 && PyErr_Occurred())
            return -1;
        if (!(t > 0) || t * 1000.0 > (double)UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "ttl must be a number of seconds > 0 (at most the "
                                              "daemon's max_lease_ms)");
            return -1;
        }
        ret->ttl_ms = (uint64_t)(t * 1000.0 + 0.999);
    }
    if (user != Py_None) {
        if (PyObject_GetBuffer(user, user_buf, PyBUF_C_CONTIGUOUS) < 0)
            return -1;
        ret->user_data = user_buf->buf;
        ret->user_size = (size_t)user_buf->len;
    }
    return 0;
}
