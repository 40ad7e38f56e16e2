/* The zero-copy exports of a view (DLPack, CUDA Array Interface, the buffer
 * protocol, NumPy's __array__) and the element types and layouts they
 * describe; Buffer and ArrayView (buffer.c) export through them. */
#include "export.h" /* Python.h comes before the system headers */
#include <dlpack/dlpack.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "layout.h"
#include "util.h"

/* ---- element types ---------------------------------------------------------------- */

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
int gpubufpy_dtype_arg(PyObject *o, dtype_t *ret) {
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

void gpubufpy_dtype_typestr(dtype_t d, char out[8]) {
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

/* An int as int64_t: PyLong_AsSsize_t (int objects only) where as_ssize,
 * else PyLong_AsLongLong (anything with __index__). */
static int64_t int_of(PyObject *o, bool as_ssize) {
    return as_ssize ? (int64_t)PyLong_AsSsize_t(o) : (int64_t)PyLong_AsLongLong(o);
}

int gpubufpy_ints_arg(PyObject *o, const char *what, const char *not_seq, int max, bool as_ssize,
                      int64_t *out) {
    PyObject *seq;
    if (PyLong_Check(o)) {
        out[0] = int_of(o, as_ssize);
        return out[0] == -1 && PyErr_Occurred() ? -1 : 1;
    }
    seq = PySequence_Fast(o, not_seq);
    if (!seq)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > max) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s has %zd dimensions, at most %d", what, n, max);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = int_of(PySequence_Fast_GET_ITEM(seq, i), as_ssize);
        if (out[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
    }
    Py_DECREF(seq);
    return (int)n;
}

/* A layout's shape or strides (what). */
static int ints_arg(PyObject *o, const char *what, int64_t *out) {
    return gpubufpy_ints_arg(o, what, "shape and strides must be an int or a sequence of ints",
                             GPUBUF_LAYOUT_MAX_NDIM, false, out);
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
        if (gpubufpy_dtype_arg(dtype, &d) < 0 || dtype_dlpack(d, &dl) < 0)
            return -1;
        ret->dtype = (gpubuf_dtype){dl.code, dl.bits, dl.lanes};
    }
    int n = shape == Py_None ? 0 : ints_arg(shape, "shape", ret->shape);
    if (n < 0)
        return -1;
    ret->ndim = (uint32_t)n;
    if (strides != Py_None) {
        int k = ints_arg(strides, "strides", ret->strides);
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

bool gpubufpy_is_host(gpubuf_buffer *b) {
    return gpubuf_buffer_pool_kind(b) == GPUBUF_POOL_HOST;
}

PyObject *gpubufpy_shape_tuple(const export_t *e) {
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

/* The element type of a stored layout when the CUDA Array Interface and the
 * buffer protocol can name it (one lane of bool, int, uint, float, complex);
 * false for the others (bfloat16, float8, vectors): those export the bytes. */
static bool layout_dtype(const gpubuf_layout *l, dtype_t *ret) {
    static const char kinds[] = {[0] = 'i', [1] = 'u', [2] = 'f', [5] = 'c', [6] = 'b'};
    if (!l || l->dtype.lanes != 1 || l->dtype.code >= sizeof(kinds) || !kinds[l->dtype.code] ||
        l->dtype.bits % 8)
        return false;
    dtype_t d = {kinds[l->dtype.code], l->dtype.bits / 8};
    if (!dtype_valid(d))
        return false;
    *ret = d;
    return true;
}

_Static_assert(sizeof(Py_ssize_t) == sizeof(int64_t), "shapes are shared with Py_buffer");

/* The producer's layout through the CUDA Array Interface: its dtype, shape,
 * strides (bytes; None when C-contiguous) and element 0's address. */
static PyObject *cai_layout(const export_t *e, dtype_t dt) {
    const gpubuf_layout *l = e->layout;
    char typestr[8];
    PyObject *shape = PyTuple_New(l->ndim), *strides = Py_NewRef(Py_None), *d = NULL;
    if (shape && l->has_strides) {
        Py_SETREF(strides, PyTuple_New(l->ndim));
        for (uint32_t i = 0; strides && i < l->ndim; i++)
            PyTuple_SET_ITEM(strides, i, PyLong_FromLongLong(l->strides[i] * dt.itemsize));
    }
    for (uint32_t i = 0; shape && i < l->ndim; i++)
        PyTuple_SET_ITEM(shape, i, PyLong_FromLongLong(l->shape[i]));
    if (shape && strides && !PyErr_Occurred()) {
        gpubufpy_dtype_typestr(dt, typestr);
        d = Py_BuildValue("{sOsss(KO)sisOsO}", "shape", shape, "typestr", typestr, "data",
                          (unsigned long long)(gpubuf_buffer_device_ptr(e->b) + l->byte_offset),
                          gpubuf_buffer_read_only(e->b) ? Py_True : Py_False, "version", 3,
                          "strides", strides, "stream", Py_None);
    }
    Py_XDECREF(shape);
    Py_XDECREF(strides);
    return d;
}

PyObject *gpubufpy_export_cai(const export_t *e) {
    char typestr[8];
    PyObject *shape, *d;
    dtype_t ldt;
    if (gpubufpy_is_host(e->b)) {
        PyErr_SetString(PyExc_AttributeError,
                        "a host-pool buffer has no __cuda_array_interface__: use the buffer "
                        "protocol (memoryview, numpy.frombuffer) or __dlpack__");
        return NULL;
    }
    if (layout_dtype(e->layout, &ldt))
        return cai_layout(e, ldt);
    if (!(shape = gpubufpy_shape_tuple(e)))
        return NULL;
    gpubufpy_dtype_typestr(e->dt, typestr);
    /* stream None: nothing to wait for, a producer seals after its work is done. */
    d = Py_BuildValue("{sOsss(KO)sisOsO}", "shape", shape, "typestr", typestr, "data",
                      (unsigned long long)gpubuf_buffer_device_ptr(e->b),
                      gpubuf_buffer_read_only(e->b) ? Py_True : Py_False, "version", 3, "strides",
                      Py_None, "stream", Py_None);
    Py_DECREF(shape);
    return d;
}

PyObject *gpubufpy_export_dlpack_device(const export_t *e) {
    if (gpubufpy_is_host(e->b))
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

/* A fast call (fast_args): torch.from_dlpack calls it once per tensor with
 * stream= and max_version= (max_version is accepted and not used: the
 * capsule is the unversioned "dltensor", which every consumer takes). */
PyObject *gpubufpy_export_dlpack(const export_t *e, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
    static fast_spec spec = {
        "__dlpack__", {"stream", "max_version", "dl_device", "copy", NULL}, 0, 0, {NULL}};
    PyObject *a[4] = {Py_None, Py_None, Py_None, Py_None};
    DLDataType dtype;
    dl_ctx *ctx;
    PyObject *cap;
    if (fast_args(&spec, args, nargs, kwnames, a) < 0)
        return NULL;
    PyObject *stream = a[0], *dl_device = a[2], *copy = a[3];
    int copy_true = copy == Py_None ? 0 : PyObject_IsTrue(copy);
    if (copy_true < 0)
        return NULL;
    if (copy_true) {
        PyErr_SetString(PyExc_BufferError,
                        "gpubuf exports zero-copy views only (copy=True): copy the result");
        return NULL;
    }
    if (dl_device != Py_None) {
        PyObject *mine = gpubufpy_export_dlpack_device(e);
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
    if (gpubufpy_is_host(e->b) && stream != Py_None) {
        PyErr_SetString(PyExc_BufferError, "stream must be None for a host-pool buffer");
        return NULL;
    }
    /* The consumer's stream (DLPack: 1 legacy default, 2 per-thread default,
     * else a cudaStream_t; -1 no ordering) waits for the producer's seal event,
     * if it sealed on a stream (gpubuf_buffer_wait: nothing to do otherwise). */
    if (!gpubufpy_is_host(e->b) && stream != Py_None) {
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
    if (gpubufpy_is_host(e->b)) {
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

/* The producer's layout through the buffer protocol (a host pool's buffer;
 * strides: room for MAX_NDIM, filled with byte strides). */
static int getbuffer_layout(const export_t *e, PyObject *exporter, Py_buffer *view, int flags,
                            Py_ssize_t *strides, dtype_t dt) {
    const gpubuf_layout *l = e->layout;
    Py_ssize_t len = dt.itemsize;
    int ro = gpubuf_buffer_read_only(e->b);
    bool contiguous = true;
    int64_t want = dt.itemsize;
    for (int i = (int)l->ndim - 1; i >= 0; i--) {
        strides[i] = (Py_ssize_t)(l->strides[i] * dt.itemsize);
        len *= (Py_ssize_t)l->shape[i];
        if (l->shape[i] != 1 && strides[i] != want)
            contiguous = false;
        want *= l->shape[i];
    }
    if (ro && (flags & PyBUF_WRITABLE) == PyBUF_WRITABLE) {
        PyErr_SetString(PyExc_BufferError, "the buffer was opened read-only");
        return -1;
    }
    if ((flags & PyBUF_STRIDES) != PyBUF_STRIDES && !contiguous) {
        PyErr_SetString(PyExc_BufferError, "the buffer's layout is not C-contiguous: ask for "
                                           "strides (PyBUF_STRIDES), as memoryview and NumPy do");
        return -1;
    }
    if ((flags & PyBUF_ND) != PyBUF_ND && l->ndim != 1) {
        PyErr_SetString(PyExc_BufferError, "a layout of several dimensions needs PyBUF_ND");
        return -1;
    }
    view->obj = Py_NewRef(exporter);
    view->buf = (char *)gpubuf_buffer_host_ptr(e->b) + l->byte_offset;
    view->len = len;
    view->readonly = ro;
    view->itemsize = dt.itemsize;
    view->format = (flags & PyBUF_FORMAT) ? (char *)dtype_format(dt) : NULL;
    view->ndim = (int)l->ndim;
    view->shape = (flags & PyBUF_ND) ? (Py_ssize_t *)l->shape : NULL;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? strides : NULL;
    view->suboffsets = NULL;
    view->internal = gpubuf_buffer_ref(e->b);
    return 0;
}

/* The buffer protocol, for host pools. */
int gpubufpy_export_getbuffer(const export_t *e, PyObject *exporter, Py_buffer *view, int flags,
                              Py_ssize_t *strides) {
    Py_ssize_t len = e->dt.itemsize;
    if (gpubufpy_is_host(e->b) == false) {
        PyErr_SetString(PyExc_BufferError,
                        "a CUDA buffer has no host memory to export through the buffer "
                        "protocol: use __dlpack__ or __cuda_array_interface__ (cupy, torch, "
                        "numba), or copy_to_host()");
        return -1;
    }
    dtype_t ldt;
    if (strides && layout_dtype(e->layout, &ldt))
        return getbuffer_layout(e, exporter, view, flags, strides, ldt);
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
PyObject *gpubufpy_export_array(const export_t *e, PyObject *exporter) {
    PyObject *np, *mv, *r;
    if (!gpubufpy_is_host(e->b)) {
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
