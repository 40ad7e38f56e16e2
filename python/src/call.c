/* Calls on a Client's connection: entering and leaving a call that runs
 * without the GIL, disconnecting, and the arguments every method parses (a
 * name, a timeout). Below module.c, many.c and aio.c, which all use it. */
#include "gpubufpy.h" /* Python.h comes before the system headers */
#include <limits.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

/* Start a call that will run without the GIL; NULL with an exception set when
 * the client is closed or belongs to another process. */
gpubuf_client *client_enter(GpubufClient *self) {
    if (client_usable(self) < 0)
        return NULL;
    self->active++;
    return self->c;
}

int client_usable(GpubufClient *self) {
    if (!self->c || self->closing) {
        PyErr_SetString(PyExc_ValueError, "the gpubuf client is closed");
        return -1;
    }
    if (self->pid != gpubufpy_pid()) {
        gpubufpy_raise_fork(self->pid);
        return -1;
    }
    return 0;
}

void client_disconnect(GpubufClient *self) {
    if (self->on_disconnect)
        self->on_disconnect(self);
    gpubuf_client *c = self->c;
    self->c = NULL;
    if (!c)
        return;
    if (self->pid != gpubufpy_pid())
        return; /* the parent's socket: leave it alone */
    Py_BEGIN_ALLOW_THREADS
        gpubuf_disconnect(c);
    Py_END_ALLOW_THREADS
}

void client_leave(GpubufClient *self) {
    if (--self->active == 0 && self->closing)
        client_disconnect(self);
}

/* Run op(c, arg) on the connection without the GIL and raise its error.
 * Returns 0, or -1 with an exception set. */
int client_run(GpubufClient *self, client_op op, void *arg) {
    gpubuf_client *c = client_enter(self);
    int r;
    if (!c)
        return -1;
    Py_BEGIN_ALLOW_THREADS
        r = op(c, arg);
    Py_END_ALLOW_THREADS
    if (r < 0)
        gpubufpy_raise(r);
    client_leave(self);
    return r < 0 ? -1 : 0;
}

int fast_args(fast_spec *spec, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
              PyObject **out) {
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    int n = 0;
    while (spec->names[n])
        n++;
    if (!spec->interned[n - 1]) /* the last one set: all were (a failure leaves it NULL) */
        for (int i = 0; i < n; i++)
            if (!spec->interned[i] &&
                !(spec->interned[i] = PyUnicode_InternFromString(spec->names[i])))
                return -1;
    if (nargs > spec->max_pos) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d positional argument%s (%zd given)",
                     spec->fname, spec->max_pos, spec->max_pos == 1 ? "" : "s", nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int j = 0;
        while (j < n && spec->interned[j] != key) /* interned: the common case */
            j++;
        if (j == n) /* a keyword made at run time (**kwargs) */
            for (j = 0; j < n && PyUnicode_Compare(spec->interned[j], key) != 0; j++)
                ;
        if (j == n) {
            PyErr_Format(PyExc_TypeError, "'%U' is an invalid keyword argument for %s()", key,
                         spec->fname);
            return -1;
        }
        if (j < nargs) {
            PyErr_Format(PyExc_TypeError,
                         "argument for %s() given by name ('%s') and position (%d)", spec->fname,
                         spec->names[j], j + 1);
            return -1;
        }
        out[j] = args[nargs + k];
    }
    for (int i = 0; i < spec->min; i++)
        if (!out[i]) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s' (pos %d)",
                         spec->fname, spec->names[i], i + 1);
            return -1;
        }
    return 0;
}

/* A name argument: str, 1..GPUBUF_NAME_MAX bytes of UTF-8 (the library
 * checks the characters). */
const char *name_arg(PyObject *o, const char *what) {
    Py_ssize_t n;
    const char *s;
    if (!PyUnicode_Check(o)) {
        PyErr_Format(PyExc_TypeError, "%s must be str, not %.100s", what, Py_TYPE(o)->tp_name);
        return NULL;
    }
    s = PyUnicode_AsUTF8AndSize(o, &n);
    if (s && (size_t)n != strlen(s)) {
        PyErr_Format(PyExc_ValueError, "%s contains a NUL character", what);
        return NULL;
    }
    return s;
}

/* timeout in seconds (None: do not wait; math.inf: wait forever) to the
 * library's milliseconds; -2 with an exception set on error. */
int timeout_ms_arg(PyObject *o) {
    double t;
    if (o == Py_None)
        return 0;
    t = PyFloat_AsDouble(o);
    if (t == -1.0 && PyErr_Occurred())
        return -2;
    if (isnan(t) || t < 0) {
        PyErr_SetString(PyExc_ValueError, "timeout must be None, a number of seconds >= 0, or "
                                          "math.inf to wait forever");
        return -2;
    }
    if (t * 1000.0 >= (double)INT_MAX)
        return -1;
    return (int)ceil(t * 1000.0);
}
