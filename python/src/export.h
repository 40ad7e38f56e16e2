/* The exports of a view (export.c), shared by Buffer and ArrayView
 * (buffer.c). */
#ifndef GPUBUFPY_EXPORT_H
#define GPUBUFPY_EXPORT_H

#include "gpubufpy.h" /* Python.h comes before the system headers */
#include <stdbool.h>
#include <sys/types.h>

/* Most dimensions of an ArrayView. */
#define MAX_NDIM 32

/* An element type: kind 'b' (bool), 'i', 'u', 'f' or 'c', and its size. */
typedef struct {
    char kind;
    int itemsize;
} dtype_t;

/* What an export describes: a view, an element type and a C-contiguous shape. */
typedef struct {
    gpubuf_buffer *b;
    GpubufClient *client;
    pid_t pid;
    dtype_t dt;
    int ndim;
    const Py_ssize_t *shape;
    Py_ssize_t len; /* a Buffer's export: its size in bytes, the one dimension shape points to */
    const gpubuf_layout *layout; /* DLPack: the buffer's stored layout, instead of dt and shape */
} export_t;

/* The element type o names (a string such as "float32", or an object with a
 * NumPy-style dtype); 0, or -1 with a Python exception set. */
int gpubufpy_dtype_arg(PyObject *o, dtype_t *ret);
/* The array interface's typestr of d ("<f4"). */
void gpubufpy_dtype_typestr(dtype_t d, char out[8]);
/* An int, or a sequence of at most max ints (what: its name in the error
 * of a longer one; not_seq: the TypeError of anything else), into out: how
 * many, or -1 with an exception set. as_ssize: int objects only, converted
 * as Py_ssize_t (else anything with __index__, as long long). */
int gpubufpy_ints_arg(PyObject *o, const char *what, const char *not_seq, int max, bool as_ssize,
                      int64_t *out);
bool gpubufpy_is_host(gpubuf_buffer *b);
PyObject *gpubufpy_shape_tuple(const export_t *e);
PyObject *gpubufpy_export_cai(const export_t *e);
PyObject *gpubufpy_export_dlpack_device(const export_t *e);
PyObject *gpubufpy_export_dlpack(const export_t *e, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames);
/* The buffer protocol, for host pools; strides: room for MAX_NDIM. */
int gpubufpy_export_getbuffer(const export_t *e, PyObject *exporter, Py_buffer *view, int flags,
                              Py_ssize_t *strides);
PyObject *gpubufpy_export_array(const export_t *e, PyObject *exporter);

/* arrayview.c: a new ArrayView of self's whole buffer as ndim dimensions of
 * shape (C order) of element type dt; it holds its own buffer reference. */
PyObject *gpubufpy_arrayview_new(GpubufBuffer *self, dtype_t dt, int ndim,
                                 const Py_ssize_t *shape);

#endif
