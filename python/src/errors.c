/* The extension's exceptions, the translation of library errors into them,
 * and the helpers both the module and the Buffer type use. */
#include "gpubufpy.h" /* Python.h comes before the system headers */
#include <errno.h>
#include <string.h>
#include <unistd.h>


/* ---- exceptions -------------------------------------------------------------- */

/* One exception class per error the library returns; those with a fitting
 * built-in exception derive from it too (FileNotFoundError, ...). */
static const struct err_class {
    const char *name;   /* attribute of the module */
    int code;           /* 0: the base class */
    PyObject **builtin; /* a built-in exception it also derives from, or NULL */
    const char *doc;
} err_classes[] = {
    {"NotFoundError", -ENOENT, &PyExc_FileNotFoundError, "No buffer (or socket) of that name."},
    {"PermissionDeniedError", -EPERM, &PyExc_PermissionError,
     "Not allowed: another owner's buffer, a pool's access list, or a view that cannot seal."},
    {"WaitTimeoutError", -ETIMEDOUT, &PyExc_TimeoutError, "A waiting open ran out of time."},
    {"ExistsError", -EEXIST, &PyExc_FileExistsError, "The name is published already."},
    {"OutOfMemoryError", -ENOMEM, &PyExc_MemoryError, "Out of memory."},
    {"PoolFullError", GPUBUF_EPOOLFULL, &PyExc_MemoryError,
     "The pool has no room for the request (or the request is larger than the pool)."},
    {"NoDaemonError", -ECONNREFUSED, &PyExc_ConnectionRefusedError, "No gpubufd listens."},
    {"DisconnectedError", GPUBUF_EDISCONNECTED, &PyExc_ConnectionError,
     "The connection to gpubufd is closed."},
    {"InvalidArgumentError", -EINVAL, &PyExc_ValueError, "An argument the library refused."},
    {"RangeError", GPUBUF_ERANGE, &PyExc_IndexError, "Offset or length outside the buffer."},
    {"BusyError", -EBUSY, NULL, "Views are alive that the call would invalidate."},
    {"ProtocolError", GPUBUF_EPROTOCOL, NULL, "Malformed or unexpected message."},
    {"VersionError", GPUBUF_EVERSION, NULL, "No common protocol version."},
    {"CudaError", GPUBUF_ECUDA, NULL, "A CUDA driver call failed."},
    {"NoDriverError", GPUBUF_ENODRIVER, NULL, "The CUDA driver could not be loaded."},
    {"NoDeviceError", GPUBUF_ENODEVICE, NULL, "The buffer's GPU is not visible here."},
    {"StateError", GPUBUF_ESTATE, NULL, "Not allowed in the buffer's state (sealed already)."},
    {"NoPoolError", GPUBUF_ENOPOOL, NULL, "No pool of that name."},
    {"NotHeldError", GPUBUF_ENOTHELD, NULL, "This connection holds no reference to it."},
    {"NoPeerError", GPUBUF_ENOPEER, NULL, "The chosen GPU cannot access the buffer's GPU."},
    {"NotSupportedError", -EOPNOTSUPP, NULL,
     "Not possible for this kind of memory (a read-only open of a cuda-ipc buffer)."},
};
#define N_ERR_CLASSES (sizeof(err_classes) / sizeof(err_classes[0]))

static PyObject *error_base;
static PyObject *error_types[N_ERR_CLASSES];

static PyObject *error_class(int err) {
    if (err == -EACCES)
        err = -EPERM;
    if (err == -ENAMETOOLONG || err == -EMSGSIZE)
        err = -EINVAL;
    /* Refused by the daemon (too many connections, shutting down), or cut. */
    if (err == -ECONNRESET || err == -EPIPE || err == -EUSERS || err == -ESHUTDOWN)
        err = GPUBUF_EDISCONNECTED;
    for (size_t i = 0; i < N_ERR_CLASSES; i++)
        if (err_classes[i].code == err)
            return error_types[i];
    return error_base;
}

/* The errno of a library code: -code for a -errno code, else None. */
static PyObject *errno_of(int err) {
    return err < 0 && err > -1000 ? PyLong_FromLong(-err) : Py_NewRef(Py_None);
}

/* code, errname and, where OSError does not keep it already, errno: set on
 * a class (its own code) and on every instance raised (the code raised). */
static int set_code_attrs(PyObject *o, int err, bool with_errno) {
    PyObject *code = PyLong_FromLong(err), *name = PyUnicode_FromString(gpubuf_err_name(err));
    PyObject *eno = with_errno ? errno_of(err) : NULL;
    int r = -1;
    if (code && name && (!with_errno || eno) && PyObject_SetAttrString(o, "code", code) == 0 &&
        PyObject_SetAttrString(o, "errname", name) == 0 &&
        (!with_errno || PyObject_SetAttrString(o, "errno", eno) == 0))
        r = 0;
    Py_XDECREF(code);
    Py_XDECREF(name);
    Py_XDECREF(eno);
    return r;
}

PyObject *gpubufpy_raise_msg(int err, const char *detail) {
    PyObject *cls = error_class(err), *exc, *args, *msg;
    bool os_error = PyObject_IsSubclass(cls, PyExc_OSError) == 1;
    msg = PyUnicode_DecodeUTF8(detail, (Py_ssize_t)strlen(detail), "replace");
    if (!msg)
        return NULL;
    if (os_error && err < 0 && err > -1000)
        args = Py_BuildValue("(iO)", -err, msg); /* .errno and .strerror */
    else
        args = PyTuple_Pack(1, msg);
    exc = args ? PyObject_Call(cls, args, NULL) : NULL;
    Py_XDECREF(args);
    if (exc && (set_code_attrs(exc, err, !os_error) < 0 ||
                PyObject_SetAttrString(exc, "message", msg) < 0))
        Py_CLEAR(exc);
    Py_DECREF(msg);
    if (exc) {
        PyErr_SetObject(cls, exc);
        Py_DECREF(exc);
    }
    return NULL;
}

PyObject *gpubufpy_raise(int err) {
    const char *detail = gpubuf_last_error_message();
    if (!*detail)
        detail = gpubuf_strerror(err);
    return gpubufpy_raise_msg(err, detail);
}

int gpubufpy_add_exceptions(PyObject *m) {
    error_base = PyErr_NewExceptionWithDoc(
        "gpubuf.Error",
        "Base of every error from gpubuf. Attributes: code (the library's negative code: "
        "-errno or GPUBUF_E*), errname ('ENOENT', 'GPUBUF_EPOOLFULL', ...) and message (the "
        "daemon's or the library's sentence).",
        NULL, NULL);
    if (!error_base || PyModule_AddObjectRef(m, "Error", error_base) < 0)
        return -1;
    for (size_t i = 0; i < N_ERR_CLASSES; i++) {
        const struct err_class *e = &err_classes[i];
        char qual[64];
        PyObject *bases;
        snprintf(qual, sizeof(qual), "gpubuf.%s", e->name);
        if (e->builtin) {
            bases = PyTuple_Pack(2, error_base, *e->builtin);
        } else {
            bases = PyTuple_Pack(1, error_base);
        }
        if (!bases)
            return -1;
        error_types[i] = PyErr_NewExceptionWithDoc(qual, e->doc, bases, NULL);
        Py_DECREF(bases);
        /* An instance made anywhere (gpubuf.StateError("...")) has its
         * class's code and errname too. No errno on OSError's subclasses:
         * a class attribute would hide the instance's. */
        if (!error_types[i] ||
            set_code_attrs(error_types[i], e->code,
                           !e->builtin || !PyObject_IsSubclass(*e->builtin, PyExc_OSError)) < 0 ||
            PyModule_AddObjectRef(m, e->name, error_types[i]) < 0)
            return -1;
    }
    return 0;
}

/* ---- helpers -------------------------------------------------------------------- */

PyObject *gpubufpy_raise_fork(pid_t owner) {
    char msg[200];
    snprintf(msg, sizeof(msg),
             "this gpubuf connection belongs to process %ld (inherited through fork): connect "
             "again in this process",
             (long)owner);
    return gpubufpy_raise_msg(GPUBUF_EDISCONNECTED, msg);
}

void gpubufpy_view_drop(gpubuf_buffer *b, pid_t pid) {
    if (!b || pid != gpubufpy_pid())
        return;
    if (Py_IsInitialized() && PyGILState_Check()) {
        Py_BEGIN_ALLOW_THREADS
            gpubuf_release(b);
        Py_END_ALLOW_THREADS
    } else {
        gpubuf_release(b);
    }
}

int gpubufpy_stream_arg(PyObject *o, gpubuf_stream *ret) {
    PyObject *h = NULL;
    if (PyLong_Check(o)) {
        h = Py_NewRef(o);
    } else if (PyObject_HasAttrString(o, "cuda_stream")) { /* torch.cuda.Stream */
        h = PyObject_GetAttrString(o, "cuda_stream");
    } else if (PyObject_HasAttrString(o, "ptr")) { /* cupy.cuda.Stream */
        h = PyObject_GetAttrString(o, "ptr");
    } else {
        PyErr_Format(PyExc_TypeError, "a CUDA stream is an int handle, a torch.cuda.Stream or a "
                                      "cupy.cuda.Stream, not %.100s", Py_TYPE(o)->tp_name);
        return -1;
    }
    if (!h)
        return -1;
    unsigned long long v = PyLong_AsUnsignedLongLong(h);
    Py_DECREF(h);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *ret = (gpubuf_stream)(uintptr_t)v;
    return 0;
}

