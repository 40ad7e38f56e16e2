/* asyncio: Client.open_async, open_id_async, alloc_async, seal_async,
 * open_many_async. Each
 * starts its request (gpubuf_*_start) and returns an asyncio Future of the
 * running loop; the client's fd is watched with loop.add_reader, whose
 * callback (Client._dispatch) calls gpubuf_dispatch(), which resolves the
 * futures; the methods return a coroutine that awaits the future
 * (gpubuf/_aio.py), as TaskGroup.create_task wants. No thread, no polling. A future cancelled (its task cancelled,
 * asyncio.wait_for's timeout) cancels the request: gpubuf_cancel() gives
 * back what it took. docs/python.md, "asyncio". */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "gpubufpy.h"

static PyObject *get_running_loop; /* asyncio.get_running_loop */
static PyObject *await_fn;         /* gpubuf._aio._await: a coroutine awaiting a future */

/* Keep the exception being handled across calls that may clear it. */
#if PY_VERSION_HEX >= 0x030C0000
#define SAVE_EXC(x) PyObject *x = PyErr_GetRaisedException()
#define RESTORE_EXC(x) PyErr_SetRaisedException(x)
#else
#define SAVE_EXC(x)                                                                                \
    PyObject *x##_t, *x##_v, *x##_tb;                                                              \
    PyErr_Fetch(&x##_t, &x##_v, &x##_tb)
#define RESTORE_EXC(x) PyErr_Restore(x##_t, x##_v, x##_tb)
#endif

/* The exception for err with msg, as an object (nothing raised). */
static PyObject *error_object(int err, const char *msg) {
    gpubufpy_raise_msg(err, msg && *msg ? msg : gpubuf_strerror(err));
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    Py_XDECREF(t);
    Py_XDECREF(tb);
    return v;
#endif
}

/* What a request's completion needs: its future and its client. */
typedef struct aio_req {
    PyObject *fut;
    GpubufClient *client;
    bool want_view; /* open, alloc: the result is a Buffer; seal: None */
    bool many;      /* open_many: a list of Buffers and exceptions */
} aio_req;

/* A batch's result list (views taken), or NULL with an exception. */
static PyObject *many_result(GpubufClient *client, const gpubuf_completion *d) {
    gpubuf_buffer **views = PyMem_Calloc(d->n + 1, sizeof(*views));
    if (!views) {
        for (size_t i = 0; i < d->n; i++)
            gpubufpy_view_drop(d->views[i], client->pid);
        return PyErr_NoMemory();
    }
    memcpy(views, d->views, d->n * sizeof(*views));
    PyObject *out = results_list(client, views, d->statuses, d->n);
    PyMem_Free(views);
    return out;
}

/* gpubuf_dispatch() calls this, on the loop's thread (or in close()). */
static void on_done(gpubuf_client *c, const gpubuf_completion *d) {
    aio_req *q = d->user;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *done = PyObject_CallMethod(q->fut, "done", NULL);
    int is_done = done ? PyObject_IsTrue(done) : 1;
    Py_XDECREF(done);
    PyObject *r = NULL;
    (void)c;
    if (is_done != 0) {
        /* Cancelled meanwhile: the views go back. */
        gpubufpy_view_drop(d->view, q->client->pid);
        for (size_t i = 0; i < d->n; i++)
            gpubufpy_view_drop(d->views[i], q->client->pid);
    } else if (d->result < 0) {
        PyObject *e = error_object(d->result, d->message);
        if (e)
            r = PyObject_CallMethod(q->fut, "set_exception", "O", e);
        Py_XDECREF(e);
    } else {
        PyObject *v = q->many        ? many_result(q->client, d)
                      : q->want_view ? gpubufpy_buffer_new(q->client, d->view)
                                     : Py_NewRef(Py_None);
        if (v)
            r = PyObject_CallMethod(q->fut, "set_result", "O", v);
        Py_XDECREF(v);
    }
    if (!r && PyErr_Occurred())
        PyErr_WriteUnraisable(q->fut);
    Py_XDECREF(r);
    Py_DECREF(q->fut);
    Py_DECREF(q->client);
    PyMem_Free(q);
    PyGILState_Release(g);
}

/* Client._dispatch(): the reader callback. */
PyObject *gpubufpy_aio_dispatch(GpubufClient *self, PyObject *unused) {
    (void)unused;
    if (!self->c || self->pid != gpubufpy_pid())
        Py_RETURN_NONE;
    int r = gpubuf_dispatch(self->c);
    if (r < 0)
        return gpubufpy_raise(r);
    Py_RETURN_NONE;
}

/* Watch the client's fd on loop (once per loop). 0, or -1 with an exception. */
static int watch(GpubufClient *self, PyObject *loop) {
    if (self->aio_loop == loop)
        return 0;
    int fd = gpubuf_client_fd(self->c);
    if (fd < 0) {
        gpubufpy_raise(fd);
        return -1;
    }
    if (self->aio_loop) {
        PyObject *r = PyObject_CallMethod(self->aio_loop, "remove_reader", "i", fd);
        Py_XDECREF(r);
        PyErr_Clear(); /* that loop may be closed */
    }
    PyObject *cb = PyObject_GetAttrString((PyObject *)self, "_dispatch");
    PyObject *r = cb ? PyObject_CallMethod(loop, "add_reader", "iO", fd, cb) : NULL;
    Py_XDECREF(cb);
    if (!r)
        return -1;
    Py_DECREF(r);
    Py_INCREF(loop);
    Py_XSETREF(self->aio_loop, loop);
    return 0;
}

void gpubufpy_aio_close(GpubufClient *self) {
    if (!self->aio_loop)
        return;
    if (self->c && self->pid == gpubufpy_pid()) {
        SAVE_EXC(exc);
        int fd = gpubuf_client_fd(self->c);
        PyObject *closed = PyObject_CallMethod(self->aio_loop, "is_closed", NULL);
        if (fd >= 0 && closed == Py_False) {
            PyObject *r = PyObject_CallMethod(self->aio_loop, "remove_reader", "i", fd);
            Py_XDECREF(r);
        }
        Py_XDECREF(closed);
        PyErr_Clear();
        RESTORE_EXC(exc);
    }
    Py_CLEAR(self->aio_loop);
}

/* Future.add_done_callback target: a cancelled future cancels its request.
 * self: (client, handle). */
static PyObject *cancel_cb(PyObject *self, PyObject *fut) {
    GpubufClient *client = (GpubufClient *)PyTuple_GET_ITEM(self, 0);
    uint64_t h = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(self, 1));
    PyObject *c = PyObject_CallMethod(fut, "cancelled", NULL);
    if (!c)
        return NULL;
    if (c == Py_True && client->c && client->pid == gpubufpy_pid())
        gpubuf_cancel(client->c, h); /* -ENOENT: delivered already */
    Py_DECREF(c);
    Py_RETURN_NONE;
}

static PyMethodDef cancel_def = {"_gpubuf_cancel", cancel_cb, METH_O, NULL};

/* module.attr, a new reference; NULL with an exception set. */
static PyObject *attr_of(const char *module, const char *attr) {
    PyObject *m = PyImport_ImportModule(module);
    PyObject *a = m ? PyObject_GetAttrString(m, attr) : NULL;
    Py_XDECREF(m);
    return a;
}

/* A future on the running loop and its completion record. */
static aio_req *begin(GpubufClient *self, bool want_view) {
    if (client_usable(self) < 0)
        return NULL;
    if (!get_running_loop && !(get_running_loop = attr_of("asyncio", "get_running_loop")))
        return NULL;
    if (!await_fn && !(await_fn = attr_of("gpubuf._aio", "_await")))
        return NULL;
    PyObject *loop = PyObject_CallNoArgs(get_running_loop);
    if (!loop)
        return NULL; /* RuntimeError: no running event loop */
    aio_req *q = NULL;
    if (watch(self, loop) == 0 && (q = PyMem_Calloc(1, sizeof(*q)))) {
        q->fut = PyObject_CallMethod(loop, "create_future", NULL);
        if (!q->fut) {
            PyMem_Free(q);
            q = NULL;
        }
    } else if (!PyErr_Occurred()) {
        PyErr_NoMemory();
    }
    Py_DECREF(loop);
    if (q) {
        q->client = (GpubufClient *)Py_NewRef(self);
        q->want_view = want_view;
    }
    return q;
}

/* The request started as h (r < 0: it did not start): the future, with
 * its cancel hook, or NULL with the exception. */
static PyObject *finish(GpubufClient *self, aio_req *q, int r, uint64_t h) {
    if (r < 0) {
        gpubufpy_raise(r);
        Py_DECREF(q->fut);
        Py_DECREF(q->client);
        PyMem_Free(q);
        return NULL;
    }
    PyObject *fut = Py_NewRef(q->fut); /* q may be completed from here on */
    PyObject *arg = Py_BuildValue("(OK)", self, (unsigned long long)h);
    PyObject *cb = arg ? PyCFunction_New(&cancel_def, arg) : NULL;
    PyObject *x = cb ? PyObject_CallMethod(fut, "add_done_callback", "O", cb) : NULL;
    Py_XDECREF(arg);
    Py_XDECREF(cb);
    if (!x) {
        gpubuf_cancel(self->c, h);
        Py_DECREF(fut);
        return NULL;
    }
    Py_DECREF(x);
    PyObject *coro = PyObject_CallOneArg(await_fn, fut);
    Py_DECREF(fut);
    return coro;
}

/* A request of the asyncio methods: one of the library's *_start calls
 * with its arguments. */
typedef struct aio_call {
    enum { CALL_OPEN, CALL_OPEN_MANY, CALL_ALLOC, CALL_SEAL } kind;
    const char *name;     /* open: by name, or NULL for by id; alloc: its name */
    uint64_t id;          /* open by id */
    gpubuf_lookup lookup; /* open, open_many */
    size_t n;             /* open_many: n names, or ids where names is NULL */
    const char **names;
    const uint64_t *ids;
    const char *pool; /* alloc */
    uint64_t size;    /* alloc */
    gpubuf_buffer *b; /* seal */
} aio_call;

static int start_call(GpubufClient *self, const aio_call *a, aio_req *q, uint64_t *h) {
    switch (a->kind) {
    case CALL_OPEN: return gpubuf_open_start(self->c, a->name, a->id, &a->lookup, on_done, q, h);
    case CALL_OPEN_MANY:
        return gpubuf_open_many_start(self->c, a->n, a->names, a->ids, &a->lookup, on_done, q, h);
    case CALL_ALLOC: return gpubuf_alloc_start(self->c, a->pool, a->size, a->name, on_done, q, h);
    case CALL_SEAL: return gpubuf_seal_start(a->b, on_done, q, h);
    }
    return -EINVAL;
}

/* Starts a (outside the GIL): the awaitable of its future, or NULL with the
 * exception. */
static PyObject *submit(GpubufClient *self, const aio_call *a) {
    aio_req *q = begin(self, a->kind != CALL_SEAL);
    if (!q)
        return NULL;
    q->many = a->kind == CALL_OPEN_MANY;
    uint64_t h = 0;
    int r;
    Py_BEGIN_ALLOW_THREADS
        r = start_call(self, a, q, &h);
    Py_END_ALLOW_THREADS
    return finish(self, q, r, h);
}

/* Seconds (None: wait until sealed, math.inf too) as a timeout in ms; -2
 * with an exception. */
static int timeout_arg(PyObject *o) {
    if (o == Py_None)
        return -1;
    double s = PyFloat_AsDouble(o);
    if (s == -1.0 && PyErr_Occurred())
        return -2;
    if (isnan(s) || s < 0) {
        PyErr_SetString(PyExc_ValueError, "timeout must be None or 0 or more seconds");
        return -2;
    }
    if (s * 1000.0 >= (double)INT32_MAX)
        return -1;
    int ms = (int)(s * 1000.0);
    return ms == 0 && s > 0 ? 1 : ms;
}

static PyObject *open_common(GpubufClient *self, const char *name, uint64_t id, PyObject *timeout,
                             int ro, const char *pool) {
    aio_call a = {.kind = CALL_OPEN, .name = name, .id = id};
    a.lookup = (gpubuf_lookup){.pool = pool, .flags = ro ? GPUBUF_OPEN_READONLY : 0};
    if ((a.lookup.timeout_ms = timeout_arg(timeout)) == -2)
        return NULL;
    return submit(self, &a);
}

PyObject *gpubufpy_aio_open(GpubufClient *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"name", "timeout", "readonly", "pool", NULL};
    const char *name, *pool = NULL;
    PyObject *timeout = Py_None;
    int ro = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|O$pz:open_async", kwlist, &name, &timeout, &ro,
                                     &pool))
        return NULL;
    return open_common(self, name, 0, timeout, ro, pool);
}

PyObject *gpubufpy_aio_open_id(GpubufClient *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"id", "timeout", "readonly", "pool", NULL};
    unsigned long long id;
    const char *pool = NULL;
    PyObject *timeout = Py_None;
    int ro = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|O$pz:open_id_async", kwlist, &id, &timeout,
                                     &ro, &pool))
        return NULL;
    return open_common(self, NULL, id, timeout, ro, pool);
}

PyObject *gpubufpy_aio_alloc(GpubufClient *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"size", "name", "pool", NULL};
    unsigned long long size;
    const char *name = NULL, *pool = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "K|zz:alloc_async", kwlist, &size, &name, &pool))
        return NULL;
    if (size == 0) {
        PyErr_SetString(PyExc_ValueError, "size 0: a buffer holds at least 1 byte");
        return NULL;
    }
    aio_call a = {.kind = CALL_ALLOC, .pool = pool, .size = size, .name = name};
    return submit(self, &a);
}

PyObject *gpubufpy_aio_seal(GpubufClient *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"buffer", NULL};
    GpubufBuffer *b;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!:seal_async", kwlist, &GpubufBuffer_Type, &b))
        return NULL;
    if (!b->b) {
        PyErr_SetString(PyExc_ValueError, "the buffer was released");
        return NULL;
    }
    if (b->client != self) {
        PyErr_SetString(PyExc_ValueError, "seal_async: the buffer belongs to another Client; "
                                          "seal it with that one");
        return NULL;
    }
    aio_call a = {.kind = CALL_SEAL, .b = b->b};
    return submit(self, &a);
}

PyObject *gpubufpy_aio_open_many(GpubufClient *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"targets", "timeout", "readonly", NULL};
    PyObject *seq, *fast = NULL, *timeout = Py_None;
    const char **names = NULL;
    uint64_t *ids = NULL;
    size_t n = 0;
    int ro = 0;
    aio_call a = {.kind = CALL_OPEN_MANY};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|$Op:open_many_async", kwlist, &seq, &timeout,
                                     &ro))
        return NULL;
    if ((a.lookup.timeout_ms = timeout_arg(timeout)) == -2)
        return NULL;
    a.lookup.flags = ro ? GPUBUF_OPEN_READONLY : 0;
    if (targets_arg(seq, &fast, &names, &ids, &n) < 0)
        return NULL;
    a.n = n;
    a.names = names;
    a.ids = names ? NULL : ids;
    /* The call copies the names: they may go with fast after it. */
    PyObject *out = submit(self, &a);
    free(names);
    free(ids);
    Py_XDECREF(fast);
    return out;
}
