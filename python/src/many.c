/* Client's batch methods: open_many, alloc_many, delete_many,
 * release_many (one request for many buffers), and the helpers the asyncio
 * batch shares (targets_arg, results_list). */
#include "gpubufpy.h" /* Python.h comes before the system headers */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* The exception object for item status r (the library's sentence). */
static PyObject *item_exception(int r) {
    PyObject *type, *value, *tb;
    gpubufpy_raise_msg(r, gpubuf_strerror(r));
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

/* The items of seq: names (str) or ids (int), all of one kind. Fills
 * names or ids (n entries, malloc'ed); -1 with an exception set. */
int targets_arg(PyObject *seq, PyObject **ret_fast, const char ***names, uint64_t **ids,
                size_t *n) {
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of names or of ids");
    if (!fast)
        return -1;
    *n = (size_t)PySequence_Fast_GET_SIZE(fast);
    *names = NULL;
    *ids = NULL;
    PyObject **items = PySequence_Fast_ITEMS(fast);
    bool by_id = *n && PyLong_Check(items[0]);
    if (by_id ? !(*ids = calloc(*n + 1, sizeof(**ids))) : !(*names = calloc(*n + 1, sizeof(char *)))) {
        Py_DECREF(fast);
        PyErr_NoMemory();
        return -1;
    }
    for (size_t i = 0; i < *n; i++) {
        if (by_id) {
            if (!PyLong_Check(items[i])) {
                PyErr_SetString(PyExc_TypeError, "items must all be ids (int) or all names (str)");
                goto fail;
            }
            (*ids)[i] = PyLong_AsUnsignedLongLong(items[i]);
            if (PyErr_Occurred())
                goto fail;
        } else if (!((*names)[i] = name_arg(items[i], "name"))) {
            goto fail;
        }
    }
    *ret_fast = fast;
    return 0;
fail:
    free(*names);
    free(*ids);
    Py_DECREF(fast);
    return -1;
}

/* A list of n results: Buffer objects for views, exceptions for failures
 * (views may be NULL: None for successes). */
PyObject *results_list(GpubufClient *self, gpubuf_buffer **views, const int *st, size_t n) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *o;
        if (st[i] < 0)
            o = item_exception(st[i]);
        else if (views)
            o = gpubufpy_buffer_new(self, views[i]);
        else
            o = Py_NewRef(Py_None);
        if (views && st[i] >= 0 && !o)
            views[i] = NULL;
        if (!o) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, o);
        if (views)
            views[i] = NULL; /* the Buffer owns it now */
    }
    /* Views not handed to a Buffer (an error above) are dropped. */
    for (size_t i = 0; views && i < n; i++)
        gpubufpy_view_drop(views[i], gpubufpy_pid());
    return out;
}

struct many_args {
    size_t n;
    const char **names;
    uint64_t *ids;
    uint64_t *sizes;
    const char *pool;
    unsigned flags;
    int timeout_ms; /* open_many: gpubuf_open_many_with() */
    gpubuf_buffer **views;
    int *st;
};

static int op_open_many(gpubuf_client *c, void *arg) {
    struct many_args *a = arg;
    gpubuf_lookup o = {.flags = a->flags, .timeout_ms = a->timeout_ms};
    int r = gpubuf_open_many_with(c, a->n, a->names, a->ids, &o, a->views, a->st);
    return r > 0 ? 0 : r;
}

static int op_alloc_many(gpubuf_client *c, void *arg) {
    struct many_args *a = arg;
    int r = gpubuf_alloc_many(c, a->pool, a->n, a->sizes, a->names, a->flags, a->views, a->st);
    return r > 0 ? 0 : r;
}

static int op_delete_many(gpubuf_client *c, void *arg) {
    struct many_args *a = arg;
    int r = gpubuf_delete_many(c, a->n, a->names, a->ids, a->st);
    return r > 0 ? 0 : r;
}

static PyObject *many_finish(GpubufClient *self, PyObject *fast, struct many_args *a, int r,
                             bool views) {
    PyObject *out = r < 0 ? NULL : results_list(self, views ? a->views : NULL, a->st, a->n);
    Py_XDECREF(fast);
    free(a->names);
    free(a->ids);
    free(a->sizes);
    free(a->views);
    free(a->st);
    return out;
}

PyObject *client_open_many(GpubufClient *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"targets", "readonly", "timeout", NULL};
    PyObject *seq, *fast = NULL, *timeout = Py_None;
    struct many_args a = {0};
    int ro = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$pO:open_many", kwlist, &seq, &ro, &timeout) ||
        (a.timeout_ms = timeout_ms_arg(timeout)) == -2 ||
        targets_arg(seq, &fast, &a.names, &a.ids, &a.n) < 0)
        return NULL;
    a.flags = ro ? GPUBUF_OPEN_READONLY : 0;
    a.views = calloc(a.n + 1, sizeof(*a.views));
    a.st = calloc(a.n + 1, sizeof(*a.st));
    if (!a.views || !a.st)
        return many_finish(self, fast, &a, (PyErr_NoMemory(), -1), true);
    return many_finish(self, fast, &a, client_run(self, op_open_many, &a), true);
}

PyObject *client_alloc_many(GpubufClient *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"sizes", "names", "pool", "seal", NULL};
    PyObject *sizes_o, *names_o = Py_None, *pool = Py_None, *fast = NULL, *nfast = NULL;
    struct many_args a = {0};
    int seal = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|OO$p:alloc_many", kwlist, &sizes_o, &names_o,
                                     &pool, &seal))
        return NULL;
    if (pool != Py_None && !(a.pool = name_arg(pool, "pool")))
        return NULL;
    if (!(fast = PySequence_Fast(sizes_o, "sizes must be a sequence of ints")))
        return NULL;
    a.n = (size_t)PySequence_Fast_GET_SIZE(fast);
    a.sizes = calloc(a.n + 1, sizeof(*a.sizes));
    a.views = calloc(a.n + 1, sizeof(*a.views));
    a.st = calloc(a.n + 1, sizeof(*a.st));
    if (!a.sizes || !a.views || !a.st)
        return many_finish(self, fast, &a, (PyErr_NoMemory(), -1), true);
    for (size_t i = 0; i < a.n; i++) {
        PyObject *o = PySequence_Fast_GET_ITEM(fast, (Py_ssize_t)i);
        long long v = PyLong_Check(o) ? PyLong_AsLongLong(o) : -2;
        if (v == -2 && !PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "sizes must be ints");
        if (PyErr_Occurred())
            return many_finish(self, fast, &a, -1, true);
        if (v <= 0) {
            PyErr_SetString(PyExc_ValueError, "size must be at least 1 byte");
            return many_finish(self, fast, &a, -1, true);
        }
        a.sizes[i] = (uint64_t)v;
    }
    if (names_o != Py_None) {
        if (!(nfast = PySequence_Fast(names_o, "names must be a sequence of str or None")))
            return many_finish(self, fast, &a, -1, true);
        if ((size_t)PySequence_Fast_GET_SIZE(nfast) != a.n) {
            Py_DECREF(nfast);
            PyErr_SetString(PyExc_ValueError, "names must have one entry per size");
            return many_finish(self, fast, &a, -1, true);
        }
        if (!(a.names = calloc(a.n + 1, sizeof(*a.names)))) {
            Py_DECREF(nfast);
            return many_finish(self, fast, &a, (PyErr_NoMemory(), -1), true);
        }
        for (size_t i = 0; i < a.n; i++) {
            PyObject *o = PySequence_Fast_GET_ITEM(nfast, (Py_ssize_t)i);
            if (o != Py_None && !(a.names[i] = name_arg(o, "name"))) {
                Py_DECREF(nfast);
                return many_finish(self, fast, &a, -1, true);
            }
        }
    }
    a.flags = seal ? GPUBUF_ALLOC_SEAL : 0;
    int r = client_run(self, op_alloc_many, &a);
    Py_XDECREF(nfast);
    return many_finish(self, fast, &a, r, true);
}

PyObject *client_delete_many(GpubufClient *self, PyObject *seq) {
    PyObject *fast = NULL;
    struct many_args a = {0};
    if (targets_arg(seq, &fast, &a.names, &a.ids, &a.n) < 0)
        return NULL;
    if (!(a.st = calloc(a.n + 1, sizeof(*a.st))))
        return many_finish(self, fast, &a, (PyErr_NoMemory(), -1), false);
    return many_finish(self, fast, &a, client_run(self, op_delete_many, &a), false);
}

PyObject *client_release_many(GpubufClient *self, PyObject *seq) {
    PyObject *fast = PySequence_Fast(seq, "expected a sequence of gpubuf Buffers");
    size_t n, k = 0;
    gpubuf_buffer **views;
    int r;
    if (!fast)
        return NULL;
    n = (size_t)PySequence_Fast_GET_SIZE(fast);
    for (size_t i = 0; i < n; i++)
        if (!PyObject_TypeCheck(PySequence_Fast_GET_ITEM(fast, (Py_ssize_t)i),
                                &GpubufBuffer_Type)) {
            Py_DECREF(fast);
            PyErr_SetString(PyExc_TypeError, "release_many takes gpubuf Buffers");
            return NULL;
        }
    if (!(views = calloc(n + 1, sizeof(*views)))) {
        Py_DECREF(fast);
        return PyErr_NoMemory();
    }
    for (size_t i = 0; i < n; i++) {
        GpubufBuffer *b = (GpubufBuffer *)PySequence_Fast_GET_ITEM(fast, (Py_ssize_t)i);
        gpubuf_buffer *v = b->b;
        b->b = NULL;
        if (!v)
            continue;
        if (b->cai_exported && !b->deferred)
            b->deferred = v; /* consumers of the interface hold the object */
        else if (b->pid != gpubufpy_pid() || b->client != self)
            gpubufpy_view_drop(v, b->pid);
        else
            views[k++] = v;
    }
    Py_DECREF(fast);
    Py_BEGIN_ALLOW_THREADS
        r = gpubuf_release_many(views, k, NULL);
    Py_END_ALLOW_THREADS
    free(views);
    if (r != 0)
        return gpubufpy_raise_msg(r < 0 ? r : -EIO, gpubuf_last_error_message());
    Py_RETURN_NONE;
}

