/* The _gpubuf module and the Client type. */
#include "gpubufpy.h" /* Python.h comes before the system headers */
#include <dlpack/dlpack.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

#include "layout.h"
#include "util.h"


/* ---- Client ----------------------------------------------------------------------- */

static int client_init(GpubufClient *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"socket", NULL};
    PyObject *sock = Py_None, *bytes = NULL;
    const char *path = NULL;
    gpubuf_client *c;
    int r;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|O:Client", kwlist, &sock))
        return -1;
    if (self->c) {
        PyErr_SetString(PyExc_RuntimeError, "Client.__init__ called twice");
        return -1;
    }
    if (sock != Py_None) {
        if (!PyUnicode_FSConverter(sock, &bytes))
            return -1;
        path = PyBytes_AS_STRING(bytes);
    }
    Py_BEGIN_ALLOW_THREADS
        r = gpubuf_connect(path, &c);
    Py_END_ALLOW_THREADS
    Py_XDECREF(bytes);
    if (r < 0) {
        gpubufpy_raise(r);
        return -1;
    }
    self->c = c;
    self->pid = gpubufpy_pid();
    self->on_disconnect = gpubufpy_aio_close; /* forgets the asyncio loop's reader */
    Py_INCREF(sock);
    Py_XSETREF(self->socket, sock);
    return 0;
}

static void client_dealloc(GpubufClient *self) {
    /* No call runs: each holds a reference to self. */
    client_disconnect(self);
    Py_XDECREF(self->socket);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *client_close(GpubufClient *self, PyObject *unused) {
    if (self->active > 0)
        self->closing = true; /* the last running call disconnects */
    else
        client_disconnect(self);
    Py_RETURN_NONE;
}

static PyObject *client_enter_ctx(GpubufClient *self, PyObject *unused) {
    if (!self->c || self->closing) {
        PyErr_SetString(PyExc_ValueError, "the gpubuf client is closed");
        return NULL;
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *client_exit_ctx(GpubufClient *self, PyObject *args) {
    return client_close(self, NULL);
}


/* Waits are cut into slices this long: between them the thread takes the GIL
 * back to notice signals (KeyboardInterrupt) and close() from another thread. */
#define WAIT_SLICE_MS 100

/* What to open: a name, or (name NULL) an id; the pool to look it up in,
 * the expected owner and the flags (gpubuf_lookup). */
typedef struct open_key {
    const char *name;
    uint64_t id;
    gpubuf_lookup o;
} open_key;

/* The keyword arguments pool= (None or str) and owner= (None or a uid) into
 * o. Returns 0, or -1 with an exception set. */
static int lookup_args(PyObject *pool, PyObject *owner, gpubuf_lookup *o) {
    if (pool != Py_None && !(o->pool = name_arg(pool, "pool")))
        return -1;
    if (owner != Py_None) {
        unsigned long long uid;
        if (!PyLong_Check(owner)) {
            PyErr_Format(PyExc_TypeError, "owner must be a uid (int) or None, not %.100s",
                         Py_TYPE(owner)->tp_name);
            return -1;
        }
        uid = PyLong_AsUnsignedLongLong(owner); /* OverflowError when negative */
        if (PyErr_Occurred())
            return -1;
        if (uid >= UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "owner must be a uid from 0 to 4294967294");
            return -1;
        }
        o->flags |= GPUBUF_OPEN_OWNER;
        o->owner_uid = (uint32_t)uid;
    }
    return 0;
}

static PyObject *client_open_common(GpubufClient *self, const open_key *key, int timeout_ms) {
    gpubuf_client *c = client_enter(self);
    gpubuf_buffer *b = NULL;
    int r;
    if (!c)
        return NULL;
    for (;;) {
        int slice = timeout_ms;
        if (timeout_ms < 0 || timeout_ms > WAIT_SLICE_MS)
            slice = WAIT_SLICE_MS;
        gpubuf_lookup o = key->o;
        o.timeout_ms = slice;
        Py_BEGIN_ALLOW_THREADS
            r = gpubuf_open_with(c, key->name, key->id, &o, &b);
        Py_END_ALLOW_THREADS
        if (r != -ETIMEDOUT || slice == timeout_ms)
            break;
        if (timeout_ms > 0)
            timeout_ms -= slice;
        if (PyErr_CheckSignals() < 0) {
            client_leave(self);
            return NULL;
        }
        if (self->closing) {
            client_leave(self);
            gpubufpy_raise_msg(GPUBUF_EDISCONNECTED,
                               "the gpubuf client was closed during the wait");
            return NULL;
        }
    }
    if (r < 0) {
        gpubufpy_raise(r);
        client_leave(self);
        return NULL;
    }
    client_leave(self);
    return gpubufpy_buffer_new(self, b);
}

/* readonly= as PyArg_ParseTuple's "p": any object's truth. */
static int flag_arg(PyObject *o, int *ret) {
    int v = o ? PyObject_IsTrue(o) : 0;
    if (v < 0)
        return -1;
    *ret = v;
    return 0;
}

static PyObject *client_open(GpubufClient *self, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames) {
    static fast_spec spec = {
        "open", {"name", "timeout", "readonly", "pool", "owner", NULL}, 2, 1, {NULL}};
    PyObject *a[5] = {NULL, Py_None, NULL, Py_None, Py_None};
    open_key key = {0};
    int t, ro;
    if (fast_args(&spec, args, nargs, kwnames, a) < 0 || flag_arg(a[2], &ro) < 0)
        return NULL;
    if (!(key.name = name_arg(a[0], "name")) || (t = timeout_ms_arg(a[1])) == -2 ||
        lookup_args(a[3], a[4], &key.o) < 0)
        return NULL;
    key.o.flags |= ro ? GPUBUF_OPEN_READONLY : 0;
    return client_open_common(self, &key, t);
}

static PyObject *client_open_id(GpubufClient *self, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames) {
    static fast_spec spec = {
        "open_id", {"id", "timeout", "readonly", "pool", "owner", NULL}, 2, 1, {NULL}};
    PyObject *a[5] = {NULL, Py_None, NULL, Py_None, Py_None};
    open_key key = {0};
    int t, ro;
    if (fast_args(&spec, args, nargs, kwnames, a) < 0 || flag_arg(a[2], &ro) < 0)
        return NULL;
    if (!PyLong_Check(a[0])) {
        PyErr_Format(PyExc_TypeError, "open_id() argument 1 must be int, not %.100s",
                     Py_TYPE(a[0])->tp_name);
        return NULL;
    }
    key.id = PyLong_AsUnsignedLongLong(a[0]); /* OverflowError when negative */
    if (PyErr_Occurred() || (t = timeout_ms_arg(a[1])) == -2 ||
        lookup_args(a[3], a[4], &key.o) < 0)
        return NULL;
    key.o.flags |= ro ? GPUBUF_OPEN_READONLY : 0;
    return client_open_common(self, &key, t);
}

struct alloc_args {
    const char *pool, *name;
    uint64_t size;
    gpubuf_buffer *ret;
    const gpubuf_meta *meta;
};

static int op_alloc(gpubuf_client *c, void *arg) {
    struct alloc_args *a = arg;
    if (a->meta)
        return gpubuf_alloc_with(c, a->pool, a->size, a->name, a->meta, &a->ret);
    return gpubuf_alloc(c, a->pool, a->size, a->name, &a->ret);
}

/* The bytes a layout reaches: its byte offset and the extent of its elements
 * (the size alloc() takes when none is given); -1 with ValueError when
 * negative strides leave that to the caller. */
static long long layout_nbytes(const gpubuf_layout *l) {
    unsigned long long reach = 0, item = gpubuf_dtype_size(l->dtype);
    for (uint32_t i = 0; i < l->ndim; i++) {
        if (l->shape[i] == 0)
            return (long long)l->byte_offset;
        if (l->strides[i] < 0) {
            PyErr_SetString(PyExc_ValueError, "negative strides: give the size");
            return -1;
        }
        reach += (unsigned long long)(l->shape[i] - 1) * (unsigned long long)l->strides[i];
    }
    return (long long)(l->byte_offset + (reach + 1) * item);
}

static PyObject *client_alloc_meta(GpubufClient *self, PyObject *size_o, PyObject *name,
                                   PyObject *pool, const gpubuf_meta *meta);

static PyObject *client_alloc(GpubufClient *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"size", "name",        "pool",      "dtype", "shape",
                             "strides", "byte_offset", "user_data", "ttl",   NULL};
    PyObject *size_o = Py_None, *name = Py_None, *pool = Py_None, *dtype = Py_None,
             *shape = Py_None, *strides = Py_None, *user = Py_None, *ttl = Py_None, *r;
    unsigned long long byte_offset = 0;
    gpubuf_layout layout;
    gpubuf_meta meta;
    Py_buffer ub;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOO$OOOKOO:alloc", kwlist, &size_o, &name, &pool,
                                     &dtype, &shape, &strides, &byte_offset, &user, &ttl))
        return NULL;
    if (gpubufpy_meta_args(dtype, shape, strides, byte_offset, user, ttl, &layout, &ub, &meta) <
        0)
        return NULL;
    if (size_o == Py_None && meta.layout) {
        long long n = layout_nbytes(&layout);
        size_o = n < 0 ? NULL : PyLong_FromLongLong(n > 0 ? n : 1);
    } else {
        Py_INCREF(size_o);
    }
    bool any = meta.layout || meta.user_data || meta.ttl_ms;
    r = size_o ? client_alloc_meta(self, size_o, name, pool, any ? &meta : NULL) : NULL;
    Py_XDECREF(size_o);
    PyBuffer_Release(&ub);
    return r;
}

static PyObject *client_alloc_meta(GpubufClient *self, PyObject *size_o, PyObject *name,
                                   PyObject *pool, const gpubuf_meta *meta) {
    const char *sname = NULL, *spool = NULL;
    struct alloc_args a = {0};
    long long size;
    if (size_o == Py_None) {
        PyErr_SetString(PyExc_TypeError, "alloc() needs a size, or a dtype and shape");
        return NULL;
    }
    if (!PyLong_Check(size_o)) {
        PyErr_Format(PyExc_TypeError, "size must be int, not %.100s", Py_TYPE(size_o)->tp_name);
        return NULL;
    }
    size = PyLong_AsLongLong(size_o);
    if (size == -1 && PyErr_Occurred())
        return NULL;
    if (size <= 0) {
        PyErr_SetString(PyExc_ValueError, "size must be at least 1 byte");
        return NULL;
    }
    if (name != Py_None && !(sname = name_arg(name, "name")))
        return NULL;
    if (sname && !*sname)
        return gpubufpy_raise_msg(-EINVAL, "name must not be empty (None makes an anonymous "
                                           "buffer)");
    if (pool != Py_None && !(spool = name_arg(pool, "pool")))
        return NULL;
    a = (struct alloc_args){spool, sname, (uint64_t)size, NULL, meta};
    if (client_run(self, op_alloc, &a) < 0)
        return NULL;
    return gpubufpy_buffer_new(self, a.ret);
}

struct target_args {
    const char *name; /* NULL: by id */
    uint64_t id;
    gpubuf_lookup o;
    gpubuf_buffer_info info;
    gpubuf_buffer_meta *meta; /* stat: its metadata */
    uint64_t ttl_ms;          /* renew */
};

/* delete() and stat(): (name_or_id, *, pool=None, owner=None) into t.
 * Returns 0, or -1 with an exception set. */
static int target_parse(PyObject *args, PyObject *kw, const char *fmt, struct target_args *t) {
    static char *kwlist[] = {"name_or_id", "pool", "owner", NULL};
    PyObject *target, *pool = Py_None, *owner = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, fmt, kwlist, &target, &pool, &owner))
        return -1;
    if (PyLong_Check(target)) {
        t->id = PyLong_AsUnsignedLongLong(target);
        if (PyErr_Occurred())
            return -1;
    } else if (!(t->name = name_arg(target, "name"))) {
        return -1;
    }
    return lookup_args(pool, owner, &t->o);
}

static int op_delete(gpubuf_client *c, void *arg) {
    struct target_args *t = arg;
    return gpubuf_delete_with(c, t->name, t->id, &t->o);
}

static PyObject *client_delete(GpubufClient *self, PyObject *args, PyObject *kw) {
    struct target_args t = {0};
    if (target_parse(args, kw, "O|$OO:delete", &t) < 0 || client_run(self, op_delete, &t) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* A buffer as stat() and status() describe it. */
static PyObject *buffer_dict(uint64_t id, const char *name, const char *pool, uint64_t size,
                             gpubuf_state state, uint32_t refs, uint32_t owner_uid,
                             uint64_t slab_id, uint64_t offset) {
    return Py_BuildValue("{sKsssssKsssIsIsKsK}", "id", (unsigned long long)id, "name", name, "pool",
                         pool, "size", (unsigned long long)size, "state", gpubuf_state_name(state), "refs",
                         refs, "owner_uid", owner_uid, "slab_id", (unsigned long long)slab_id,
                         "offset", (unsigned long long)offset);
}

/* Append o to list and drop the caller's reference; -1 (o dropped) on error. */
static int append_new(PyObject *list, PyObject *o) {
    int r = o ? PyList_Append(list, o) : -1;
    Py_XDECREF(o);
    return r;
}

static int op_stat(gpubuf_client *c, void *arg) {
    struct target_args *t = arg;
    return gpubuf_stat_meta(c, t->name, t->id, &t->o, &t->info, t->meta);
}

/* Add the metadata keys to a buffer dict d (consumed; NULL passes through):
 * layout (a dict, or None), lease_left (seconds, or None), and user_data
 * (stat: bytes or None) or user_bytes (status: their count). */
static PyObject *add_meta(PyObject *d, PyObject *layout, uint64_t lease_left_ms, PyObject *user) {
    PyObject *left = lease_left_ms ? PyFloat_FromDouble((double)lease_left_ms / 1000.0)
                                   : Py_NewRef(Py_None);
    if (!d || !layout || !left || !user || PyDict_SetItemString(d, "layout", layout) < 0 ||
        PyDict_SetItemString(d, "lease_left", left) < 0 ||
        PyDict_SetItemString(d, PyLong_Check(user) ? "user_bytes" : "user_data", user) < 0)
        Py_CLEAR(d);
    Py_XDECREF(layout);
    Py_XDECREF(left);
    Py_XDECREF(user);
    return d;
}

static PyObject *client_stat(GpubufClient *self, PyObject *args, PyObject *kw) {
    struct target_args t = {0};
    const gpubuf_buffer_info *i = &t.info;
    PyObject *d;
    if (target_parse(args, kw, "O|$OO:stat", &t) < 0)
        return NULL;
    if (!(t.meta = PyMem_Malloc(sizeof(*t.meta))))
        return PyErr_NoMemory();
    if (client_run(self, op_stat, &t) < 0) {
        PyMem_Free(t.meta);
        return NULL;
    }
    const gpubuf_buffer_meta *m = t.meta;
    d = add_meta(buffer_dict(i->id, i->name, i->pool, i->size, i->state, i->refs, i->owner_uid,
                             i->slab_id, i->offset),
                 m->has_layout ? gpubufpy_layout_dict(&m->layout) : Py_NewRef(Py_None),
                 m->lease_left_ms,
                 m->user_size ? PyBytes_FromStringAndSize((const char *)m->user_data,
                                                          (Py_ssize_t)m->user_size)
                              : Py_NewRef(Py_None));
    PyMem_Free(t.meta);
    return d;
}

static int op_renew(gpubuf_client *c, void *arg) {
    struct target_args *t = arg;
    return gpubuf_renew(c, t->name, t->id, t->ttl_ms);
}

static PyObject *client_renew(GpubufClient *self, PyObject *args, PyObject *kw) {
    static char *kwlist[] = {"name_or_id", "ttl", NULL};
    struct target_args t = {0};
    PyObject *target, *ttl = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O|O:renew", kwlist, &target, &ttl))
        return NULL;
    if (PyLong_Check(target)) {
        t.id = PyLong_AsUnsignedLongLong(target);
        if (PyErr_Occurred())
            return NULL;
    } else if (!(t.name = name_arg(target, "name"))) {
        return NULL;
    }
    if (ttl != Py_None) {
        double s = PyFloat_AsDouble(ttl);
        if (s == -1.0 && PyErr_Occurred())
            return NULL;
        if (!(s > 0) || s * 1000.0 > (double)UINT32_MAX) {
            PyErr_SetString(PyExc_ValueError, "ttl must be a number of seconds > 0, or None for "
                                              "the lease's own time to live");
            return NULL;
        }
        t.ttl_ms = (uint64_t)(s * 1000.0 + 0.999);
    }
    if (client_run(self, op_renew, &t) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *status_to_dict(const gpubuf_status *s) {
    PyObject *pools = PyList_New(0), *bufs = PyList_New(0), *clients = PyList_New(0), *d = NULL;
    if (!pools || !bufs || !clients)
        goto out;
    for (size_t i = 0; i < s->n_pools; i++) {
        const gpubuf_pool_info *p = &s->pools[i];
        const char *kind = gpubuf_pool_kind_name(p->kind);
        int is_default = s->default_pool && strcmp(s->default_pool, p->name) == 0;
        const char *pubs = s->pool_publishers ? s->pool_publishers[i] : "";
        if (append_new(pools, Py_BuildValue("{sssssisssKsKsKsKsIsIsOss}", "name", p->name, "kind",
                                            kind, "device", p->device, "device_uuid",
                                            p->device_uuid, "capacity",
                                            (unsigned long long)p->capacity, "used",
                                            (unsigned long long)p->used, "reserved",
                                            (unsigned long long)p->reserved, "slab_size",
                                            (unsigned long long)p->slab_size, "slabs", p->slabs,
                                            "buffers", p->buffers, "default",
                                            is_default ? Py_True : Py_False, "publishers",
                                            pubs)) < 0)
            goto out;
    }
    for (size_t i = 0; i < s->n_buffers; i++) {
        const gpubuf_status_buffer *b = &s->buffers[i];
        const gpubuf_status_meta *m = &s->buffer_meta[i];
        PyObject *layout = Py_NewRef(Py_None);
        if (m->has_layout) { /* status has dtype and shape: strides come with open and stat */
            PyObject *shape = PyTuple_New(m->ndim);
            char name[32];
            for (uint32_t k = 0; shape && k < m->ndim; k++)
                PyTuple_SET_ITEM(shape, k, PyLong_FromLongLong(m->shape[k]));
            gpubuf_dtype_name(m->dtype, name, sizeof(name));
            Py_DECREF(layout);
            layout = shape && !PyErr_Occurred()
                         ? Py_BuildValue("{sssIsIsIsO}", "dtype", name, "dtype_code",
                                         m->dtype.code, "dtype_bits", m->dtype.bits,
                                         "dtype_lanes", m->dtype.lanes, "shape", shape)
                         : NULL;
            Py_XDECREF(shape);
        }
        if (append_new(bufs, add_meta(buffer_dict(b->id, b->name, b->pool, b->size, b->state,
                                                  b->refs, b->owner_uid, b->slab_id, b->offset),
                                      layout, m->lease_left_ms,
                                      PyLong_FromUnsignedLong(m->user_size))) < 0)
            goto out;
    }
    for (size_t i = 0; i < s->n_clients; i++) {
        const gpubuf_client_info *ci = &s->clients[i];
        if (append_new(clients,
                       Py_BuildValue("{sKsisIsIsIsIsssIsI}", "session_id",
                                     (unsigned long long)ci->session_id, "pid", ci->pid, "uid",
                                     ci->uid, "gid", ci->gid, "references", ci->references,
                                     "buffers_held", ci->buffers_held, "name", ci->name,
                                     "kept_slabs", ci->kept_slabs, "read_only_references",
                                     ci->read_only_references)) < 0)
            goto out;
    }
    d = Py_BuildValue("{sOsOsOsKsss{sIsKsKsK}}", "pools", pools, "buffers", bufs, "clients",
                      clients, "uptime_ms", (unsigned long long)s->uptime_ms, "version",
                      s->version, "leases", "active", s->leases_active, "expired",
                      (unsigned long long)s->leases_expired, "renewed",
                      (unsigned long long)s->leases_renewed, "max_ttl_ms",
                      (unsigned long long)s->max_lease_ms);
out:
    Py_XDECREF(pools);
    Py_XDECREF(bufs);
    Py_XDECREF(clients);
    return d;
}

static int op_status(gpubuf_client *c, void *arg) {
    return gpubuf_status_get(c, (gpubuf_status **)arg);
}

static PyObject *client_status(GpubufClient *self, PyObject *unused) {
    gpubuf_status *s;
    PyObject *d;
    if (client_run(self, op_status, &s) < 0)
        return NULL;
    d = status_to_dict(s);
    gpubuf_status_free(s);
    return d;
}

static int op_flush(gpubuf_client *c, void *arg) {
    return gpubuf_flush(c);
}

static PyObject *client_flush(GpubufClient *self, PyObject *unused) {
    if (client_run(self, op_flush, NULL) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int op_set_device(gpubuf_client *c, void *arg) {
    return gpubuf_set_device(c, *(int *)arg);
}

static PyObject *client_set_device(GpubufClient *self, PyObject *arg) {
    long d = PyLong_AsLong(arg);
    int device = (int)d;
    if (d == -1 && PyErr_Occurred())
        return NULL;
    if (d < -1 || d >= 64) {
        PyErr_SetString(PyExc_ValueError, "device must be -1 or a CUDA ordinal below 64");
        return NULL;
    }
    if (client_run(self, op_set_device, &device) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *client_get_closed(GpubufClient *self, void *unused) {
    return PyBool_FromLong(!self->c || self->closing);
}

static PyObject *client_get_socket(GpubufClient *self, void *unused) {
    PyObject *s = self->socket ? self->socket : Py_None;
    Py_INCREF(s);
    return s;
}

static PyObject *client_repr(GpubufClient *self) {
    const char *state = !self->c || self->closing ? "closed" : "open";
    if (self->socket && self->socket != Py_None)
        return PyUnicode_FromFormat("<gpubuf.Client %R %s>", self->socket, state);
    return PyUnicode_FromFormat("<gpubuf.Client (default socket) %s>", state);
}

static PyMethodDef client_methods[] = {
    GPUBUFPY_AIO_METHODS,
    GPUBUFPY_KW_METHOD(
        "alloc", client_alloc,
        "alloc(size=None, name=None, pool=None, *, dtype=None, shape=None, strides=None, "
        "byte_offset=0, user_data=None, ttl=None) -> Buffer\n\nAllocate size bytes (the daemon's "
        "default pool unless pool names one). The new buffer is writable; seal() publishes it "
        "under name. name=None makes an anonymous buffer, opened by id. dtype (a name such as "
        "'float32', a NumPy dtype, or a DLPack (code, bits, lanes) tuple), shape and strides (in "
        "elements; None: C order) give the buffer an array layout that openers' __dlpack__ "
        "exports (size defaults to the bytes it spans); user_data (at most 4096 bytes) travels "
        "with it; ttl (seconds) gives it a lease: the daemon deletes it then unless renewed."),
    GPUBUFPY_FAST_METHOD(
        "open", client_open,
        "open(name, timeout=None, *, readonly=False, pool=None, owner=None) -> Buffer\n\nOpen a "
        "sealed buffer by name and take one reference. Names are per pool: the name is looked up "
        "in pool, or in POOL for a name '/POOL/NAME', else in the daemon's default pool. "
        "timeout: None or 0 fails at once (NotFoundError) when the name is not published; "
        "seconds to wait for it (WaitTimeoutError); math.inf waits forever. readonly: map it "
        "read-only (host and cuda-vmm pools; NotSupportedError on cuda-ipc). owner: the uid the "
        "buffer must belong to (PermissionError otherwise)."),
    GPUBUFPY_FAST_METHOD(
        "open_id", client_open_id,
        "open_id(id, timeout=None, *, readonly=False, pool=None, owner=None) -> Buffer\n\nOpen "
        "a sealed buffer by its id (see open; pool: the buffer must be in that pool)."),
    GPUBUFPY_KW_METHOD(
        "delete", client_delete,
        "delete(name_or_id, *, pool=None, owner=None)\n\nUnpublish a buffer (looked up as open "
        "does); its memory returns to the pool when the last reference goes."),
    GPUBUFPY_KW_METHOD(
        "stat", client_stat,
        "stat(name_or_id, *, pool=None, owner=None) -> dict\n\nDescribe a buffer (looked up as "
        "open does) without taking a reference, with its layout (dict or None), user_data "
        "(bytes or None) and lease_left (seconds or None)."),
    GPUBUFPY_KW_METHOD(
        "renew", client_renew,
        "renew(name_or_id, ttl=None)\n\nRenew a buffer's lease: it expires ttl seconds from now "
        "(None: its own time to live again). By name ('NAME' or '/POOL/NAME') or id. Its "
        "owner's uid or root only (PermissionError)."),
    {"status", (PyCFunction)client_status, METH_NOARGS,
     "status() -> dict\n\nA snapshot of the daemon: {'pools': [...], 'buffers': [...], "
     "'clients': [...], 'uptime_ms': int, 'version': str}."},
    {"flush", (PyCFunction)client_flush, METH_NOARGS,
     "flush()\n\nWait until the daemon has answered every asynchronous request (seal, release) "
     "of this connection; raises the first error one of them got."},
    {"set_device", (PyCFunction)client_set_device, METH_O,
     "set_device(device)\n\nMap CUDA buffers opened from now on into this GPU's context "
     "(-1: the GPU holding each buffer)."},
    {"close", (PyCFunction)client_close, METH_NOARGS,
     "close()\n\nDisconnect. The daemon drops every reference of this connection: release "
     "views (and their exports) first."},
    GPUBUFPY_KW_METHOD(
        "open_many", client_open_many,
        "open_many(targets, *, readonly=False, timeout=None) -> list\n\nOpen many sealed buffers "
        "in one round trip: targets are names (str) or ids (int). Each entry of the result is a "
        "Buffer (with its layout and user data), or the gpubuf.Error of that item. timeout as in "
        "open(): None fails an unsealed item at once (NotFoundError), seconds wait for them all "
        "until one deadline (WaitTimeoutError)."),
    GPUBUFPY_KW_METHOD(
        "alloc_many", client_alloc_many,
        "alloc_many(sizes, names=None, pool=None, *, seal=False) -> list\n\nAllocate many "
        "buffers in one round trip (sealed at once with seal=True); Buffers or per-item errors."),
    {"delete_many", (PyCFunction)client_delete_many, METH_O,
     "delete_many(targets) -> list\n\nUnpublish many buffers (names or ids): None or the "
     "item's gpubuf.Error for each."},
    {"release_many", (PyCFunction)client_release_many, METH_O,
     "release_many(buffers)\n\nRelease many Buffers of this client in one round trip."},
    {"__enter__", (PyCFunction)client_enter_ctx, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)client_exit_ctx, METH_VARARGS, NULL},
    {NULL},
};

static PyGetSetDef client_getset[] = {
    {"closed", (getter)client_get_closed, NULL, "True once close() was called.", NULL},
    {"socket", (getter)client_get_socket, NULL, "The socket path given, or None.", NULL},
    {NULL},
};

PyTypeObject GpubufClient_Type = {
    GPUBUFPY_TYPE_SLOTS("gpubuf.Client", GpubufClient, client),
    .tp_doc = "Client(socket=None)\n\nA connection to gpubufd. socket: the daemon's socket "
              "path; None: $GPUBUF_SOCKET, else /run/gpubuf/gpubufd.sock. Safe to share "
              "between threads; a context manager that closes it.",
    .tp_init = (initproc)client_init,
    .tp_new = PyType_GenericNew,
};

/* ---- module ------------------------------------------------------------------------ */

static PyObject *mod_strerror(PyObject *m, PyObject *arg) {
    long e = PyLong_AsLong(arg);
    if (e == -1 && PyErr_Occurred())
        return NULL;
    return PyUnicode_FromString(gpubuf_strerror((int)e));
}

/* The exception a code turns into, for tests of the error classes that no
 * daemon running in CI can be made to return (GPUBUF_ECUDA, ...). */
static PyObject *mod_raise_for_code(PyObject *m, PyObject *args) {
    int code;
    const char *msg;
    if (!PyArg_ParseTuple(args, "is:_raise_for_code", &code, &msg))
        return NULL;
    return gpubufpy_raise_msg(code, msg);
}

/* _dlpack_dtype(obj) -> (code, bits, lanes): the DLPack dtype of obj's
 * __dlpack__() export (for dtypes without a NumPy name, such as
 * torch.bfloat16); the capsule is dropped unconsumed. */
static PyObject *mod_dlpack_dtype(PyObject *m, PyObject *obj) {
    PyObject *cap = PyObject_CallMethod(obj, "__dlpack__", NULL), *r = NULL;
    if (!cap)
        return NULL;
    const DLManagedTensor *t = PyCapsule_GetPointer(cap, "dltensor");
    if (t)
        r = Py_BuildValue("(III)", t->dl_tensor.dtype.code, t->dl_tensor.dtype.bits,
                          t->dl_tensor.dtype.lanes);
    Py_DECREF(cap);
    return r;
}

static PyMethodDef module_methods[] = {
    {"_dlpack_dtype", mod_dlpack_dtype, METH_O,
     "_dlpack_dtype(obj) -> (code, bits, lanes): the DLPack dtype obj exports."},
    {"strerror", mod_strerror, METH_O, "strerror(code) -> str: the library's sentence for code."},
    {"_raise_for_code", mod_raise_for_code, METH_VARARGS,
     "_raise_for_code(code, message): raise the exception of a library error code."},
    {NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_gpubuf",
    .m_doc = "gpubuf: share GPU (and host) memory between processes through gpubufd.",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__gpubuf(void);

PyMODINIT_FUNC PyInit__gpubuf(void) {
    PyObject *m;
    if (gpubufpy_pid_init() < 0 || PyType_Ready(&GpubufClient_Type) < 0 ||
        PyType_Ready(&GpubufBuffer_Type) < 0 ||
        PyType_Ready(&GpubufArrayView_Type) < 0)
        return NULL;
    m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (gpubufpy_add_exceptions(m) < 0 ||
        PyModule_AddObjectRef(m, "Client", (PyObject *)&GpubufClient_Type) < 0 ||
        PyModule_AddObjectRef(m, "Buffer", (PyObject *)&GpubufBuffer_Type) < 0 ||
        PyModule_AddObjectRef(m, "ArrayView", (PyObject *)&GpubufArrayView_Type) < 0 ||
        PyModule_AddIntConstant(m, "PROTOCOL_VERSION", GPUBUF_PROTOCOL_VERSION) < 0 ||
        PyModule_AddStringConstant(m, "DEFAULT_SOCKET", GPUBUF_DEFAULT_SOCKET) < 0 ||
        PyModule_AddStringConstant(m, "__version__", GPUBUF_VERSION_STRING) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
