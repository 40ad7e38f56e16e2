/* ArrayView: a typed, C-contiguous view of a Buffer (Buffer.as_array), with
 * the exports of export.c. */
#include "export.h" /* Python.h comes before the system headers */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

typedef struct {
    PyObject_HEAD gpubuf_buffer *b; /* one reference, for the object's whole life */
    GpubufClient *client;
    pid_t pid;
    dtype_t dt;
    int ndim;
    Py_ssize_t shape[MAX_NDIM];
    Py_ssize_t strides[MAX_NDIM];
} GpubufArrayView;

PyObject *gpubufpy_arrayview_new(GpubufBuffer *self, dtype_t dt, int ndim,
                                 const Py_ssize_t *shape) {
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

static PyObject *av_dlpack(GpubufArrayView *v, PyObject *const *args, Py_ssize_t nargs,
                           PyObject *kwnames) {
    export_t e;
    av_export(v, &e);
    return gpubufpy_export_dlpack(&e, args, nargs, kwnames);
}

static PyObject *av_dlpack_device(GpubufArrayView *v, PyObject *unused) {
    export_t e;
    av_export(v, &e);
    return gpubufpy_export_dlpack_device(&e);
}

static PyObject *av_array(GpubufArrayView *v, PyObject *args, PyObject *kw) {
    export_t e;
    av_export(v, &e);
    return gpubufpy_export_array(&e, (PyObject *)v);
}

static PyObject *av_get_cai(GpubufArrayView *v, void *unused) {
    export_t e;
    av_export(v, &e);
    return gpubufpy_export_cai(&e);
}

static int av_getbuffer(GpubufArrayView *v, Py_buffer *view, int flags) {
    export_t e;
    av_export(v, &e);
    return gpubufpy_export_getbuffer(&e, (PyObject *)v, view, flags, v->strides);
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
    return gpubufpy_shape_tuple(&e);
}

static PyObject *av_get_strides(GpubufArrayView *v, void *unused) {
    export_t e;
    av_export(v, &e);
    e.shape = v->strides;
    return gpubufpy_shape_tuple(&e);
}

static PyObject *av_get_dtype(GpubufArrayView *v, void *unused) {
    char typestr[8];
    gpubufpy_dtype_typestr(v->dt, typestr);
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
    gpubufpy_dtype_typestr(v->dt, typestr);
    r = PyUnicode_FromFormat("<gpubuf.ArrayView dtype='%s' shape=%R %s device=%d>", typestr, shape,
                             gpubuf_pool_kind_name(gpubuf_buffer_pool_kind(v->b)),
                             gpubuf_buffer_device(v->b));
    Py_DECREF(shape);
    return r;
}

static PyMethodDef av_methods[] = {
    GPUBUFPY_FAST_METHOD("__dlpack__", av_dlpack,
                       "__dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None)"),
    {"__dlpack_device__", (PyCFunction)av_dlpack_device, METH_NOARGS, NULL},
    GPUBUFPY_KW_METHOD(
        "__array__", av_array,
        "__array__(dtype=None, copy=None): NumPy's fallback; TypeError for CUDA buffers."),
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
    GPUBUFPY_TYPE_SLOTS("gpubuf.ArrayView", GpubufArrayView, av),
    .tp_as_buffer = &av_as_buffer,
    .tp_doc = "A typed view of a Buffer (Buffer.as_array). Keeps the buffer's memory and "
              "daemon reference alive for its whole life.",
};
