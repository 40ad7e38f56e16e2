/* Buffer and ArrayView: views of gpubuf buffers and their zero-copy exports. */
#include "gpubufpy.h" /* Python.h comes before the system headers */
#include <dlpack/dlpack.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "layout.h"
#include "util.h"

/* Most dimensions of an ArrayView. */
#define MAX_NDIM 32

/* ---- element types ---------------------------------------------------------------- */

/* An element type: kind 'b' (bool), 'i', 'u', 'f' or 'c', and its size. */
typedef struct {
    char kind;
    int itemsize;
} dtype_t;

static const struct {
    const char *name;
    dtype_t dt;
} dtype_names[] = {
    {"bool", {'b', 1}},      {"int8", {'i', 1}},        {"int16", {'i', 2}},
    {"int32", {'i', 4}},     {"int64", {'i', 8}},       {"uint8", {'u', 1}},
    {"uint16", {'u', 2}},    {"uint32", {'u', 4}},      {"uint64", {'u', 8}},
    {"float16", {'f', 2}},   {"float32", {'f', 4}},     {"float64", {'f', 8}},
    {"complex64", {'c', 8}}, {"complex128", {'c', 16}},
};

static bool dtype_valid(dtype_t d) {
    switch (d.kind) {
    case 'b': return d.itemsize == 1;
    case 'i':
    case 'u': return d.itemsize == 1 || d.itemsize == 2 || d.itemsize == 4 || d.itemsize == 8;
    case 'f': return d.itemsize == 2 || d.itemsize == 4 || d.itemsize == 8;
    case 'c': return d.itemsize == 8 || d.itemsize == 16;
    }
    return false;
}

/* "float32", "<f4", "f4", "|u1", "=i8" (little-endian or native only). */
static int dtype_from_string(const char *s, dtype_t *ret) {
    for (size_t i = 0; i < sizeof(dtype_names) / sizeof(dtype_names[0]); i++) {
        if (strcmp(s, dtype_names[i].name) == 0) {
            *ret = dtype_names[i].dt;
            return 0;
        }
    }
    const char *p = s;
    if (*p == '<' || *p == '|' || *p == '=')
        p++;
    if (!*p || !strchr("biufc", *p) || !p[1])
        return -1;
    char *end;
    long n = strtol(p + 1, &end, 10);
    if (*end || n <= 0 || n > 16)
        return -1;
    dtype_t d = {*p, (int)n};
    if (!dtype_valid(d))
        return -1;
    *ret = d;
    return 0;
}

/* dtype: a string as above, an object with a .str typestr (numpy.dtype), or
 * anything numpy.dtype() accepts (numpy.float32) when NumPy is installed. */
static int dtype_arg(PyObject *o, dtype_t *ret) {
    PyObject *s = NULL;
    int r = -1;
    if (PyUnicode_Check(o)) {
        s = Py_NewRef(o);
    } else if (PyObject_HasAttrString(o, "str") && PyObject_HasAttrString(o, "itemsize")) {
        s = PyObject_GetAttrString(o, "str");
    } else {
        PyObject *np = PyImport_ImportModule("numpy");
        if (!np) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "dtype must be a string like 'float32' or '<f4' "
                         "(NumPy is not installed to convert %R)",
                         o);
            return -1;
        }
        PyObject *dt = PyObject_CallMethod(np, "dtype", "O", o);
        Py_DECREF(np);
        if (!dt)
            return -1;
        s = PyObject_GetAttrString(dt, "str");
        Py_DECREF(dt);
    }
    if (!s)
        return -1;
    const char *c = PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : NULL;
    if (c && dtype_from_string(c, ret) == 0)
        r = 0;
    else if (!PyErr_Occurred())
        PyErr_Format(PyExc_ValueError,
                     "unsupported dtype %R: bool, int8..int64, uint8..uint64, float16..float64, "
                     "complex64, complex128, little-endian",
                     o);
    Py_DECREF(s);
    return r;
}

static void dtype_typestr(dtype_t d, char out[8]) {
    snprintf(out, 8, "%c%c%d", d.itemsize == 1 ? '|' : '<', d.kind, d.itemsize);
}

/* The struct module's format for the buffer protocol. */
static const char *dtype_format(dtype_t d) {
    switch (d.kind) {
    case 'b': return "?";
    case 'i': return d.itemsize == 1 ? "b" : d.itemsize == 2 ? "h" : d.itemsize == 4 ? "i" : "q";
    case 'u': return d.itemsize == 1 ? "B" : d.itemsize == 2 ? "H" : d.itemsize == 4 ? "I" : "Q";
    case 'f': return d.itemsize == 2 ? "e" : d.itemsize == 4 ? "f" : "d";
    case 'c': return d.itemsize == 8 ? "Zf" : "Zd";
    }
    return "B";
}

static int dtype_dlpack(dtype_t d, DLDataType *ret) {
    ret->bits = (uint8_t)(8 * d.itemsize);
    ret->lanes = 1;
    switch (d.kind) {
    case 'i': ret->code = kDLInt; return 0;
    case 'u': ret->code = kDLUInt; return 0;
    case 'f': ret->code = kDLFloat; return 0;
    case 'c': ret->code = kDLComplex; return 0;
    }
#if DLPACK_VERSION >= 80
    ret->code = kDLBool;
    return 0;
#else
    PyErr_SetString(PyExc_BufferError, "bool arrays need DLPack 0.8; this build has an older "
                                       "dlpack.h: export as uint8");
    return -1;
#endif
}

/* ---- layouts ----------------------------------------------------------------------- */

/* A sequence of at most MAX_NDIM ints into out; its length, or -1 (exception set). */
static int int_tuple_arg(PyObject *o, const char *what, int64_t *out) {
    PyObject *seq;
    if (PyLong_Check(o)) {
        out[0] = PyLong_AsLongLong(o);
        return out[0] == -1 && PyErr_Occurred() ? -1 : 1;
    }
    seq = PySequence_Fast(o, "shape and strides must be an int or a sequence of ints");
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > GPUBUF_LAYOUT_MAX_NDIM) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s has %zd dimensions, at most %d", what, n,
                     GPUBUF_LAYOUT_MAX_NDIM);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, i));
        if (out[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return (int)n;
}

int gpubufpy_layout_arg(PyObject *dtype, PyObject *shape, PyObject *strides,
                        unsigned long long byte_offset, gpubuf_layout *ret) {
    memset(ret, 0, sizeof(*ret));
    if (PyTuple_Check(dtype)) {
        unsigned int code, bits, lanes = 1;
        if (!PyArg_ParseTuple(dtype, "II|I;dtype as a tuple is (code, bits[, lanes]) of DLPack",
                              &code, &bits, &lanes))
            return -1;
        if (code > 255 || bits > 255 || lanes > 65535) {
            PyErr_SetString(PyExc_ValueError, "DLPack dtype: code and bits at most 255, lanes at "
                                              "most 65535");
            return -1;
        }
        ret->dtype = (gpubuf_dtype){(uint8_t)code, (uint8_t)bits, (uint16_t)lanes};
    } else {
        dtype_t d;
        DLDataType dl;
        if (dtype_arg(dtype, &d) < 0 || dtype_dlpack(d, &dl) < 0)
            return -1;
        ret->dtype = (gpubuf_dtype){dl.code, dl.bits, dl.lanes};
    }
    int n = shape == Py_None ? 0 : int_tuple_arg(shape, "shape", ret->shape);
    if (n < 0)
        return -1;
    ret->ndim = (uint32_t)n;
    if (strides != Py_None) {
        int k = int_tuple_arg(strides, "strides", ret->strides);
        if (k < 0)
            return -1;
        if (k != n) {
            PyErr_Format(PyExc_ValueError, "%d strides for %d dimensions", k, n);
            return -1;
        }
        ret->has_strides = 1;
    } else {
        gpubuf_layout_compact_strides(ret, ret->strides);
    }
    ret->byte_offset = byte_offset;
    return 0;
}

/* The layout as a dict: dtype (its name), dtype_code, dtype_bits, dtype_lanes, shape,
 * strides (None for C order), byte_offset. */
PyObject *gpubufpy_layout_dict(const gpubuf_layout *l) {
    char name[32];
    PyObject *shape = PyTuple_New(l->ndim), *strides = NULL, *d = NULL;
    for (uint32_t i = 0; shape && i < l->ndim; i++)
        PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(l->shape[i]));
    if (l->has_strides) {
        strides = PyTuple_New(l->ndim);
        for (uint32_t i = 0; strides && i < l->ndim; i++)
            PyTuple_SET_ITEM(strides, i, PyLong_FromLongLong(l->strides[i]));
    } else {
        strides = Py_NewRef(Py_None);
    }
    gpubuf_dtype_name(l->dtype, name, sizeof(name));
    if (shape && strides && !PyErr_Occurred())
        d = Py_BuildValue("{sssIsIsIsOsOsK}", "dtype", name, "dtype_code", l->dtype.code,
                          "dtype_bits", l->dtype.bits, "dtype_lanes", l->dtype.lanes, "shape",
                          shape, "strides", strides, "byte_offset",
                          (unsigned long long)l->byte_offset);
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    return d;
}

/* ---- exports ----------------------------------------------------------------------- */

/* What an export describes: a view, an element type and a C-contiguous shape. */
typedef struct {
    gpubuf_buffer *b;
    GpubufClient *client;
    pid_t pid;
    dtype_t dt;
    int ndim;
    const Py_ssize_t *shape;
    const gpubuf_layout *layout; /* DLPack: the buffer's stored layout, instead of dt and shape */
} export_t;

static bool is_host(gpubuf_buffer *b) {
    return gpubuf_buffer_pool_kind(b) == GPUBUF_POOL_HOST;
}

static PyObject *shape_tuple(const export_t *e) {
    PyObject *t = PyTuple_New(e->ndim);
    for (int i = 0; t && i < e->ndim; i++) {
        PyObject *n = PyLong_FromSsize_t(e->shape[i]);
        if (!n) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, n);
    }
    return t;
}

static PyObject *export_cai(const export_t *e) {
    char typestr[8];
    PyObject *shape, *d;
    if (is_host(e->b)) {
        PyErr_SetString(PyExc_AttributeError,
                        "a host-pool buffer has no __cuda_array_interface__: use the buffer "
                        "protocol (memoryview, numpy.frombuffer) or __dlpack__");
        return NULL;
    }
    if (!(shape = shape_tuple(e)))
        return NULL;
    dtype_typestr(e->dt, typestr);
    /* stream None: nothing to wait for, a producer seals after its work is done. */
    d = Py_BuildValue("{sOsss(KO)sisOsO}", "shape", shape, "typestr", typestr, "data",
                      (unsigned long long)gpubuf_buffer_device_ptr(e->b),
                      gpubuf_buffer_read_only(e->b) ? Py_True : Py_False, "version", 3,
                      "strides", Py_None, "stream", Py_None);
    Py_DECREF(shape);
    return d;
}

static PyObject *export_dlpack_device(const export_t *e) {
    if (is_host(e->b))
        return Py_BuildValue("(ii)", kDLCPU, 0);
    return Py_BuildValue("(ii)", kDLCUDA, gpubuf_buffer_device(e->b));
}

/* A DLPack export: the tensor, its shape and strides, and what keeps the
 * memory alive (one view reference and the Client object). */
typedef struct {
    DLManagedTensor t;
    gpubuf_buffer *b;
    PyObject *client;
    pid_t pid;
    int64_t dims[2 * MAX_NDIM];
} dl_ctx;

/* Called by whoever consumed the capsule, maybe without the GIL. */
static void dl_deleter(DLManagedTensor *t) {
    dl_ctx *ctx = t->manager_ctx;
    gpubufpy_view_drop(ctx->b, ctx->pid);
    if (Py_IsInitialized()) {
        PyGILState_STATE g = PyGILState_Ensure();
        Py_XDECREF(ctx->client);
        PyGILState_Release(g);
    }
    free(ctx);
}

/* A capsule nobody consumed (still named "dltensor") frees its tensor. */
static void dl_capsule_destructor(PyObject *cap) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (PyCapsule_IsValid(cap, "dltensor")) {
        DLManagedTensor *t = PyCapsule_GetPointer(cap, "dltensor");
        if (t && t->deleter)
            t->deleter(t);
    }
    PyErr_Restore(type, value, tb);
}

static PyObject *export_dlpack(const export_t *e, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"stream", "max_version", "dl_device", "copy", NULL};
    PyObject *stream = Py_None, *max_version = Py_None, *dl_device = Py_None, *copy = Py_None;
    DLDataType dtype;
    dl_ctx *ctx;
    PyObject *cap;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$OOOO:__dlpack__", kwlist, &stream, &max_version,
                                     &dl_device, &copy))
        return NULL;
    if (copy != Py_None && PyObject_IsTrue(copy) == 1) {
        PyErr_SetString(PyExc_BufferError,
                        "gpubuf exports zero-copy views only (copy=True): copy the result");
        return NULL;
    }
    if (dl_device != Py_None) {
        PyObject *mine = export_dlpack_device(e);
        int same = mine ? PyObject_RichCompareBool(mine, dl_device, Py_EQ) : -1;
        Py_XDECREF(mine);
        if (same < 0)
            return NULL;
        if (!same) {
            PyErr_Format(PyExc_BufferError, "the buffer lives on another device than %R",
                         dl_device);
            return NULL;
        }
    }
    if (is_host(e->b) && stream != Py_None) {
        PyErr_SetString(PyExc_BufferError, "stream must be None for a host-pool buffer");
        return NULL;
    }
    /* The consumer's stream (DLPack: 1 legacy default, 2 per-thread default,
     * else a cudaStream_t; -1 no ordering) waits for the producer's seal event,
     * if it sealed on a stream (gpubuf_buffer_wait: nothing to do otherwise). */
    if (!is_host(e->b) && stream != Py_None) {
        long long sv = PyLong_AsLongLong(stream);
        if (sv == -1 && PyErr_Occurred())
            return NULL;
        if (sv == 0) {
            PyErr_SetString(PyExc_ValueError, "stream 0 is ambiguous in DLPack: pass 1 (legacy "
                                              "default stream) or 2 (per-thread default stream)");
            return NULL;
        }
        if (sv != -1 && gpubufpy_wait(e->b, (gpubuf_stream)(uintptr_t)sv) < 0)
            return NULL;
    }
    if (e->layout) {
        dtype.code = e->layout->dtype.code;
        dtype.bits = e->layout->dtype.bits;
        dtype.lanes = e->layout->dtype.lanes;
    } else if (dtype_dlpack(e->dt, &dtype) < 0) {
        return NULL;
    }
    ctx = calloc(1, sizeof(*ctx));
    if (!ctx)
        return PyErr_NoMemory();
    DLTensor *t = &ctx->t.dl_tensor;
    if (is_host(e->b)) {
        t->data = gpubuf_buffer_host_ptr(e->b);
        t->device.device_type = kDLCPU;
        t->device.device_id = 0;
    } else {
        t->data = (void *)(uintptr_t)gpubuf_buffer_device_ptr(e->b);
        t->device.device_type = kDLCUDA;
        t->device.device_id = gpubuf_buffer_device(e->b);
    }
    t->ndim = e->ndim;
    t->dtype = dtype;
    t->shape = ctx->dims;
    t->strides = ctx->dims + MAX_NDIM;
    int64_t stride = 1;
    for (int i = e->ndim - 1; !e->layout && i >= 0; i--) {
        ctx->dims[i] = e->shape[i];
        ctx->dims[MAX_NDIM + i] = stride;
        stride *= e->shape[i] > 0 ? e->shape[i] : 1;
    }
    t->byte_offset = 0;
    if (e->layout) { /* checked against the size by the daemon and the library */
        t->ndim = (int)e->layout->ndim;
        memcpy(ctx->dims, e->layout->shape, e->layout->ndim * sizeof(int64_t));
        memcpy(ctx->dims + MAX_NDIM, e->layout->strides, e->layout->ndim * sizeof(int64_t));
        t->byte_offset = e->layout->byte_offset;
    }
    ctx->t.manager_ctx = ctx;
    ctx->t.deleter = dl_deleter;
    ctx->b = gpubuf_buffer_ref(e->b);
    ctx->client = Py_NewRef((PyObject *)e->client);
    ctx->pid = e->pid;
    cap = PyCapsule_New(&ctx->t, "dltensor", dl_capsule_destructor);
    if (!cap)
        dl_deleter(&ctx->t);
    return cap;
}

/* The buffer protocol, for host pools. */
static int export_getbuffer(const export_t *e, PyObject *exporter, Py_buffer *view, int flags,
                            Py_ssize_t *strides) {
    Py_ssize_t len = e->dt.itemsize;
    if (is_host(e->b) == false) {
        PyErr_SetString(PyExc_BufferError,
                        "a CUDA buffer has no host memory to export through the buffer "
                        "protocol: use __dlpack__ or __cuda_array_interface__ (cupy, torch, "
                        "numba), or copy_to_host()");
        return -1;
    }
    for (int i = 0; i < e->ndim; i++)
        len *= e->shape[i];
    int ro = gpubuf_buffer_read_only(e->b);
    if (e->ndim == 1 && e->dt.kind == 'u' && e->dt.itemsize == 1) {
        if (PyBuffer_FillInfo(view, exporter, gpubuf_buffer_host_ptr(e->b), len, ro, flags) < 0)
            return -1;
    } else {
        if (ro && (flags & PyBUF_WRITABLE) == PyBUF_WRITABLE) {
            PyErr_SetString(PyExc_BufferError, "the buffer was opened read-only");
            return -1;
        }
        if ((flags & PyBUF_ND) != PyBUF_ND && e->ndim != 1) {
            PyErr_SetString(PyExc_BufferError, "an ArrayView of several dimensions needs "
                                               "PyBUF_ND");
            return -1;
        }
        view->obj = Py_NewRef(exporter);
        view->buf = gpubuf_buffer_host_ptr(e->b);
        view->len = len;
        view->readonly = ro;
        view->itemsize = e->dt.itemsize;
        view->format = (flags & PyBUF_FORMAT) ? (char *)dtype_format(e->dt) : NULL;
        view->ndim = e->ndim;
        view->shape = (flags & PyBUF_ND) ? (Py_ssize_t *)e->shape : NULL;
        view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? strides : NULL;
        view->suboffsets = NULL;
    }
    view->internal = gpubuf_buffer_ref(e->b);
    return 0;
}

/* __array__: reached only when the buffer protocol failed (NumPy tries it
 * first), that is for device memory: say so instead of letting NumPy wrap the
 * object in an object array. */
static PyObject *export_array(const export_t *e, PyObject *exporter) {
    PyObject *np, *mv, *r;
    if (!is_host(e->b)) {
        PyErr_SetString(PyExc_TypeError,
                        "a CUDA buffer cannot become a NumPy array without a copy: use "
                        "copy_to_host() or to_pybytes(), or a GPU array library "
                        "(cupy.from_dlpack, torch.from_dlpack)");
        return NULL;
    }
    if (!(np = PyImport_ImportModule("numpy")))
        return NULL;
    mv = PyMemoryView_FromObject(exporter);
    r = mv ? PyObject_CallMethod(np, "asarray", "O", mv) : NULL;
    Py_XDECREF(mv);
    Py_DECREF(np);
    return r;
}

/* ---- Buffer ----------------------------------------------------------------------- */

PyObject *gpubufpy_buffer_new(GpubufClient *client, gpubuf_buffer *b) {
    GpubufBuffer *o = PyObject_New(GpubufBuffer, &GpubufBuffer_Type);
    if (!o) {
        gpubufpy_view_drop(b, getpid());
        return NULL;
    }
    o->b = b;
    o->deferred = NULL;
    o->client = (GpubufClient *)Py_NewRef((PyObject *)client);
    o->pid = getpid();
    o->cai_exported = false;
    return (PyObject *)o;
}

static gpubuf_buffer *buf_view(GpubufBuffer *self) {
    if (!self->b)
        PyErr_SetString(PyExc_ValueError, "the gpubuf Buffer was released");
    return self->b;
}

static void buf_export(GpubufBuffer *self, export_t *e, Py_ssize_t *size) {
    *size = (Py_ssize_t)gpubuf_buffer_size(self->b);
    e->b = self->b;
    e->client = self->client;
    e->pid = self->pid;
    e->dt = (dtype_t){'u', 1};
    e->ndim = 1;
    e->shape = size;
    e->layout = NULL;
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
        if (gpubufpy_meta_args(dtype, shape, strides, byte_offset, user, ttl, &layout, &ub,
                               &meta) < 0)
            return NULL;
        a.meta = &meta;
        if (self->pid != getpid()) {
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
    if (self->pid != getpid())
        return gpubufpy_raise_fork(self->pid);
    if (view_run(self, b, op_seal, &a) < 0)
        return NULL;
    Py_RETURN_NONE;
}

int gpubufpy_wait(gpubuf_buffer *b, gpubuf_stream stream) {
    int r;
    /* With the GIL: one cuStreamWaitEvent (the event was imported at open),
     * and no other thread can release b meanwhile. */
    r = gpubuf_buffer_wait(b, stream);
    if (r < 0) {
        gpubufpy_raise(r);
        return -1;
    }
    return 0;
}

static PyObject *buf_wait(GpubufBuffer *self, PyObject *stream_o) {
    gpubuf_stream stream;
    gpubuf_buffer *b;
    if (!(b = buf_view(self)) || gpubufpy_stream_arg(stream_o, &stream) < 0)
        return NULL;
    if (self->pid != getpid())
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

static PyObject *arrayview_new(GpubufBuffer *self, dtype_t dt, int ndim, const Py_ssize_t *shape);

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
    if (PyLong_Check(o)) {
        ndim = 1;
        shape[0] = PyLong_AsSsize_t(o);
        if (shape[0] == -1 && PyErr_Occurred())
            return -1;
    } else {
        PyObject *seq = PySequence_Fast(o, "shape must be None, an int or a sequence of ints");
        if (!seq)
            return -1;
        Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
        if (n > MAX_NDIM) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "shape has %zd dimensions, at most %d", n, MAX_NDIM);
            return -1;
        }
        ndim = (int)n;
        for (int i = 0; i < ndim; i++) {
            shape[i] = PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(seq, i));
            if (shape[i] == -1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return -1;
            }
        }
        Py_DECREF(seq);
    }
    for (int i = 0; i < ndim; i++) {
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
    if (dtype_o && dtype_o != Py_None && dtype_arg(dtype_o, &dt) < 0)
        return NULL;
    if (shape_arg(shape_o, gpubuf_buffer_size(b), dt, &ndim, shape) < 0)
        return NULL;
    return arrayview_new(self, dt, ndim, shape);
}

static PyObject *buf_dlpack(GpubufBuffer *self, PyObject *args, PyObject *kw) {
    export_t e;
    Py_ssize_t size;
    if (!buf_view(self))
        return NULL;
    buf_export(self, &e, &size);
    /* The producer's dtype and shape when it gave them. */
    e.layout = gpubuf_buffer_layout(self->b);
    return export_dlpack(&e, args, kw);
}

static PyObject *buf_dlpack_device(GpubufBuffer *self, PyObject *unused) {
    export_t e;
    Py_ssize_t size;
    if (!buf_view(self))
        return NULL;
    buf_export(self, &e, &size);
    return export_dlpack_device(&e);
}

static PyObject *buf_array(GpubufBuffer *self, PyObject *args, PyObject *kw) {
    export_t e;
    Py_ssize_t size;
    if (!buf_view(self))
        return NULL;
    buf_export(self, &e, &size);
    return export_array(&e, (PyObject *)self);
}

static PyObject *buf_get_cai(GpubufBuffer *self, void *unused) {
    export_t e;
    Py_ssize_t size;
    PyObject *d;
    if (!self->b) {
        PyErr_SetString(PyExc_AttributeError, "the gpubuf Buffer was released");
        return NULL;
    }
    buf_export(self, &e, &size);
    d = export_cai(&e);
    if (d)
        self->cai_exported = true;
    return d;
}

static int buf_getbuffer(GpubufBuffer *self, Py_buffer *view, int flags) {
    export_t e;
    Py_ssize_t size;
    if (!self->b) {
        PyErr_SetString(PyExc_BufferError, "the gpubuf Buffer was released");
        return -1;
    }
    buf_export(self, &e, &size);
    return export_getbuffer(&e, (PyObject *)self, view, flags, NULL);
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
BUF_GETTER(buf_get_is_cuda, PyBool_FromLong(!is_host(b)))
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
    {"seal", (PyCFunction)(void (*)(void))buf_seal, METH_VARARGS | METH_KEYWORDS,
     "seal(sync=False, *, stream=None, dtype=None, shape=None, strides=None, byte_offset=0, "
     "user_data=None, ttl=None)\n\nPublish the buffer (allocated by this connection): "
     "others can open it. sync=False sends the seal without waiting (a waiting open sees it; "
     "errors surface at Client.flush()); sync=True returns once the daemon applied it. "
     "stream (a CUDA stream: an int handle, a torch.cuda.Stream or a cupy.cuda.Stream): seal "
     "in stream order, after the work queued on it, without waiting for the GPU; openers' "
     "streams wait for it (wait(), or __dlpack__(stream=...)). dtype, shape, strides, "
     "byte_offset, user_data, ttl: set the buffer's metadata at the seal (as Client.alloc; "
     "synchronous, not with stream)."},
    {"wait", (PyCFunction)buf_wait, METH_O,
     "wait(stream)\n\nMake a CUDA stream wait, on the GPU, for the work the producer sealed "
     "with seal(stream=...); returns at once when it sealed without a stream. "
     "torch.from_dlpack and cupy.from_dlpack do this by themselves through __dlpack__."},
    {"release", (PyCFunction)buf_release, METH_NOARGS,
     "release()\n\nDrop this view. The daemon reference goes when no export (DLPack tensor, "
     "memoryview, ArrayView, a consumer of __cuda_array_interface__) still uses it. "
     "Idempotent."},
    {"slice", (PyCFunction)(void (*)(void))buf_slice, METH_VARARGS | METH_KEYWORDS,
     "slice(offset, length=-1) -> Buffer\n\nA zero-copy view of length bytes (-1: to the end) "
     "that keeps this one alive."},
    {"copy_to_host", (PyCFunction)(void (*)(void))buf_copy_to_host, METH_VARARGS | METH_KEYWORDS,
     "copy_to_host(position=0, nbytes=-1, buf=None)\n\nCopy nbytes (-1: to the end, or until "
     "buf is full) from position into buf (any writable buffer), or into a new bytearray. "
     "Returns buf or the bytearray."},
    {"copy_from_host", (PyCFunction)(void (*)(void))buf_copy_from_host,
     METH_VARARGS | METH_KEYWORDS,
     "copy_from_host(data, position=0) -> int\n\nCopy data (any C-contiguous object with the "
     "buffer protocol) into the buffer at position. Returns the number of bytes copied."},
    {"to_pybytes", (PyCFunction)buf_to_pybytes, METH_NOARGS,
     "to_pybytes() -> bytes\n\nA copy of the whole view."},
    {"as_array", (PyCFunction)(void (*)(void))buf_as_array, METH_VARARGS | METH_KEYWORDS,
     "as_array(dtype='uint8', shape=None) -> ArrayView\n\nA typed, C-contiguous view for "
     "consumers that need a dtype: cupy.asarray, torch.as_tensor, numba.cuda.as_cuda_array, "
     "numpy.asarray (host pools), *.from_dlpack. shape=None: the whole view, 1-D."},
    {"__dlpack__", (PyCFunction)(void (*)(void))buf_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)\n\nA DLPack "
     "capsule with the buffer's layout (dtype, shape, strides, byte offset) when it has one, "
     "else of the bytes (uint8, 1-D); kDLCUDA for CUDA pools, kDLCPU for host pools."},
    {"__dlpack_device__", (PyCFunction)buf_dlpack_device, METH_NOARGS,
     "__dlpack_device__() -> (device_type, device_id)"},
    {"__array__", (PyCFunction)(void (*)(void))buf_array, METH_VARARGS | METH_KEYWORDS,
     "__array__(dtype=None, copy=None): NumPy's fallback; TypeError for CUDA buffers."},
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
    {"user_data", (getter)buf_get_user_data, NULL,
     "The user bytes the producer gave, or None.", NULL},
    {"client", (getter)buf_get_client, NULL, "The Client the buffer came from.", NULL},
    {"__cuda_array_interface__", (getter)buf_get_cai, NULL,
     "CUDA Array Interface v3 (uint8, 1-D); AttributeError for host pools.", NULL},
    {NULL},
};

PyTypeObject GpubufBuffer_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpubuf.Buffer",
    .tp_basicsize = sizeof(GpubufBuffer),
    .tp_dealloc = (destructor)buf_dealloc,
    .tp_repr = (reprfunc)buf_repr,
    .tp_as_buffer = &buf_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A view of a gpubuf buffer (from Client.alloc, open, open_id or Buffer.slice). "
              "Holds one daemon reference until released; a context manager that releases "
              "it.",
    .tp_methods = buf_methods,
    .tp_getset = buf_getset,
};

/* ---- ArrayView ---------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD gpubuf_buffer *b; /* one reference, for the object's whole life */
    GpubufClient *client;
    pid_t pid;
    dtype_t dt;
    int ndim;
    Py_ssize_t shape[MAX_NDIM];
    Py_ssize_t strides[MAX_NDIM];
} GpubufArrayView;

static PyObject *arrayview_new(GpubufBuffer *self, dtype_t dt, int ndim, const Py_ssize_t *shape) {
    GpubufArrayView *v = PyObject_New(GpubufArrayView, &GpubufArrayView_Type);
    Py_ssize_t stride = dt.itemsize;
    if (!v)
        return NULL;
    v->b = gpubuf_buffer_ref(self->b);
    v->client = (GpubufClient *)Py_NewRef((PyObject *)self->client);
    v->pid = self->pid;
    v->dt = dt;
    v->ndim = ndim;
    for (int i = ndim - 1; i >= 0; i--) {
        v->shape[i] = shape[i];
        v->strides[i] = stride;
        stride *= shape[i] > 0 ? shape[i] : 1;
    }
    return (PyObject *)v;
}

static void av_export(GpubufArrayView *v, export_t *e) {
    e->layout = NULL;
    e->b = v->b;
    e->client = v->client;
    e->pid = v->pid;
    e->dt = v->dt;
    e->ndim = v->ndim;
    e->shape = v->shape;
}

static void av_dealloc(GpubufArrayView *v) {
    gpubufpy_view_drop(v->b, v->pid);
    Py_XDECREF(v->client);
    PyObject_Free(v);
}

static PyObject *av_dlpack(GpubufArrayView *v, PyObject *args, PyObject *kw) {
    export_t e;
    av_export(v, &e);
    return export_dlpack(&e, args, kw);
}

static PyObject *av_dlpack_device(GpubufArrayView *v, PyObject *unused) {
    export_t e;
    av_export(v, &e);
    return export_dlpack_device(&e);
}

static PyObject *av_array(GpubufArrayView *v, PyObject *args, PyObject *kw) {
    export_t e;
    av_export(v, &e);
    return export_array(&e, (PyObject *)v);
}

static PyObject *av_get_cai(GpubufArrayView *v, void *unused) {
    export_t e;
    av_export(v, &e);
    return export_cai(&e);
}

static int av_getbuffer(GpubufArrayView *v, Py_buffer *view, int flags) {
    export_t e;
    av_export(v, &e);
    return export_getbuffer(&e, (PyObject *)v, view, flags, v->strides);
}

static void av_releasebuffer(GpubufArrayView *v, Py_buffer *view) {
    gpubufpy_view_drop(view->internal, v->pid);
}

static PyBufferProcs av_as_buffer = {
    .bf_getbuffer = (getbufferproc)av_getbuffer,
    .bf_releasebuffer = (releasebufferproc)av_releasebuffer,
};

static PyObject *av_get_shape(GpubufArrayView *v, void *unused) {
    export_t e;
    av_export(v, &e);
    return shape_tuple(&e);
}

static PyObject *av_get_strides(GpubufArrayView *v, void *unused) {
    export_t e;
    av_export(v, &e);
    e.shape = v->strides;
    return shape_tuple(&e);
}

static PyObject *av_get_dtype(GpubufArrayView *v, void *unused) {
    char typestr[8];
    dtype_typestr(v->dt, typestr);
    return PyUnicode_FromString(typestr);
}

static PyObject *av_get_nbytes(GpubufArrayView *v, void *unused) {
    Py_ssize_t n = v->dt.itemsize;
    for (int i = 0; i < v->ndim; i++)
        n *= v->shape[i];
    return PyLong_FromSsize_t(n);
}

static PyObject *av_get_itemsize(GpubufArrayView *v, void *unused) {
    return PyLong_FromLong(v->dt.itemsize);
}

static PyObject *av_get_address(GpubufArrayView *v, void *unused) {
    return PyLong_FromUnsignedLongLong(gpubuf_buffer_device_ptr(v->b));
}

static PyObject *av_get_device(GpubufArrayView *v, void *unused) {
    return PyLong_FromLong(gpubuf_buffer_device(v->b));
}

static PyObject *av_repr(GpubufArrayView *v) {
    char typestr[8];
    PyObject *shape = av_get_shape(v, NULL), *r;
    if (!shape)
        return NULL;
    dtype_typestr(v->dt, typestr);
    r = PyUnicode_FromFormat("<gpubuf.ArrayView dtype='%s' shape=%R %s device=%d>", typestr, shape,
                             gpubuf_pool_kind_name(gpubuf_buffer_pool_kind(v->b)),
                             gpubuf_buffer_device(v->b));
    Py_DECREF(shape);
    return r;
}

static PyMethodDef av_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))av_dlpack, METH_VARARGS | METH_KEYWORDS,
     "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)"},
    {"__dlpack_device__", (PyCFunction)av_dlpack_device, METH_NOARGS, NULL},
    {"__array__", (PyCFunction)(void (*)(void))av_array, METH_VARARGS | METH_KEYWORDS,
     "__array__(dtype=None, copy=None): NumPy's fallback; TypeError for CUDA buffers."},
    {NULL},
};

static PyGetSetDef av_getset[] = {
    {"dtype", (getter)av_get_dtype, NULL, "Array-interface type string ('<f4').", NULL},
    {"shape", (getter)av_get_shape, NULL, "Shape (C order).", NULL},
    {"strides", (getter)av_get_strides, NULL, "Strides in bytes.", NULL},
    {"nbytes", (getter)av_get_nbytes, NULL, "Bytes covered.", NULL},
    {"itemsize", (getter)av_get_itemsize, NULL, "Bytes per element.", NULL},
    {"address", (getter)av_get_address, NULL, "Address of the first element.", NULL},
    {"device", (getter)av_get_device, NULL, "CUDA ordinal, -1 for host pools.", NULL},
    {"__cuda_array_interface__", (getter)av_get_cai, NULL,
     "CUDA Array Interface v3; AttributeError for host pools.", NULL},
    {NULL},
};

PyTypeObject GpubufArrayView_Type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "gpubuf.ArrayView",
    .tp_basicsize = sizeof(GpubufArrayView),
    .tp_dealloc = (destructor)av_dealloc,
    .tp_repr = (reprfunc)av_repr,
    .tp_as_buffer = &av_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A typed view of a Buffer (Buffer.as_array). Keeps the buffer's memory and "
              "daemon reference alive for its whole life.",
    .tp_methods = av_methods,
    .tp_getset = av_getset,
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
