/* The gpubuf Python extension (_gpubuf): declarations shared by its files.
 *
 * module.c  the module and the Client type
 * buffer.c  the Buffer type; arrayview.c its typed views (ArrayView); export.c their exports
 * errors.c  the exceptions, error translation, helpers of both
 *           (__cuda_array_interface__, DLPack, the buffer protocol)
 *
 * Lifetimes rest on libgpubuf-client's own reference counts: every export
 * (a DLPack capsule, a memoryview, an ArrayView) holds one gpubuf_buffer_ref()
 * of the view and a strong reference to the Client object, so the daemon
 * reference and the connection live while any export does, whatever happens
 * to the Buffer object. */
#ifndef GPUBUF_PY_H
#define GPUBUF_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdbool.h>
#include <sys/types.h>

#include "gpubuf/gpubuf.h"

/* A connection. `active` counts calls of any thread that run without the GIL
 * on it; close() while some run only marks it `closing` and the last of them
 * disconnects, so the connection is never freed under a running call. */
typedef struct GpubufClient {
    PyObject_HEAD gpubuf_client *c;
    pid_t pid; /* the process that connected: a forked child may not use it */
    int active;
    bool closing;
    PyObject *socket; /* the path given, or None */
    PyObject *aio_loop; /* the asyncio loop that watches the client's fd (aio.c), or NULL */
    void (*on_disconnect)(struct GpubufClient *self); /* before the connection goes (aio.c's) */
} GpubufClient;

/* A view of a buffer (gpubuf_buffer). `b` is NULL once released. A view whose
 * __cuda_array_interface__ was read keeps its reference in `deferred` after
 * release(): consumers of that interface hold the Buffer object, not a
 * reference of their own, so it goes only when the object does. */
typedef struct {
    PyObject_HEAD gpubuf_buffer *b;
    gpubuf_buffer *deferred;
    GpubufClient *client;
    pid_t pid;
    bool cai_exported;
    /* the buffer protocol's byte strides of the producer's layout (all its
     * exports describe the same layout) */
    Py_ssize_t layout_strides[32];
} GpubufBuffer;

extern PyTypeObject GpubufClient_Type;
extern PyTypeObject GpubufBuffer_Type;
extern PyTypeObject GpubufArrayView_Type;

/* The slots every type of the module sets, from its name, its struct and
 * the prefix of its functions and tables: prefix_dealloc, prefix_repr,
 * prefix_methods and prefix_getset. */
#define GPUBUFPY_TYPE_SLOTS(name, type, prefix)                                                    \
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = name,                                                 \
    .tp_basicsize = sizeof(type),                                                                  \
    .tp_dealloc = (destructor)prefix##_dealloc,                                                    \
    .tp_repr = (reprfunc)prefix##_repr,                                                            \
    .tp_flags = Py_TPFLAGS_DEFAULT,                                                                \
    .tp_methods = prefix##_methods,                                                                \
    .tp_getset = prefix##_getset

/* A row of a methods table: a method taking (args, kwargs). */
#define GPUBUFPY_KW_METHOD(name, fn, doc)                                                          \
    { name, (PyCFunction)(void (*)(void))fn, METH_VARARGS | METH_KEYWORDS, doc }

/* Raise the exception for a libgpubuf-client error code, right after the
 * call that returned it on this thread: with that call's message (the
 * library clears the message when a call starts and sets it when the call
 * fails, so it is this call's even when it repeats the one before), or the
 * code's own sentence when it has none. Returns NULL. */
PyObject *gpubufpy_raise(int err);

/* Raise the exception for err with this message. Returns NULL. */
PyObject *gpubufpy_raise_msg(int err, const char *detail);

/* DisconnectedError: an object of process `owner` used in a forked child. */
PyObject *gpubufpy_raise_fork(pid_t owner);
/* This process's id without a system call (getpid() is one, about 1 us in a
 * virtual machine, and the module asks for it on every open, release and
 * export): read once, and again in a forked child (pthread_atfork). */
pid_t gpubufpy_pid(void);
/* Set up gpubufpy_pid(); 0, or -1 with an exception set. */
int gpubufpy_pid_init(void);

/* Drop one reference of a view (NULL accepted), without the GIL when the
 * caller holds it: the last reference of a root view takes the connection's
 * lock, which a waiting open of another thread may hold. In a forked child
 * the reference is left alone: the connection belongs to the parent. */
void gpubufpy_view_drop(gpubuf_buffer *b, pid_t pid);

/* Add gpubuf.Error and its subclasses to module m. 0 or -1 (exception set). */
int gpubufpy_add_exceptions(PyObject *m);

/* A CUDA stream from Python: an int handle (0 or 1 the legacy default, 2 the per-thread
 * default, else a CUstream), a torch.cuda.Stream (.cuda_stream) or a
 * cupy.cuda.Stream (.ptr). 0, or -1 with TypeError/OverflowError set. */
int gpubufpy_stream_arg(PyObject *o, gpubuf_stream *ret);

/* gpubuf_buffer_wait() (with the GIL held: it only enqueues a wait); 0, or -1
 * with the exception set. */
int gpubufpy_wait(gpubuf_buffer *b, gpubuf_stream stream);

/* A layout from Python arguments: dtype (a name, a NumPy dtype, or a DLPack
 * (code, bits[, lanes]) tuple), shape and strides (None, an int or a
 * sequence of ints; strides in elements). 0, or -1 with an exception set. */
int gpubufpy_layout_arg(PyObject *dtype, PyObject *shape, PyObject *strides,
                        unsigned long long byte_offset, gpubuf_layout *ret);
/* A layout as a dict (Buffer.layout, stat). */
PyObject *gpubufpy_layout_dict(const gpubuf_layout *l);
/* alloc()/seal() metadata arguments as a gpubuf_meta; layout and user_buf
 * are its storage (release user_buf with PyBuffer_Release, also on error
 * when it was filled). ttl in seconds. 0, or -1 with an exception set. */
int gpubufpy_meta_args(PyObject *dtype, PyObject *shape, PyObject *strides,
                       unsigned long long byte_offset, PyObject *user, PyObject *ttl,
                       gpubuf_layout *layout, Py_buffer *user_buf, gpubuf_meta *ret);

/* call.c: start a call on self's connection that runs without the GIL (NULL
 * with an exception set when the client is closed or another process's),
 * end it (the last call of a closing client disconnects), disconnect; run
 * op(c, arg) without the GIL, raising its error (0, or -1 with an exception
 * set); a name argument (str) as UTF-8 (NULL with an exception set); a
 * timeout in seconds as ms (None: 0; -1 for forever, -2 with an exception
 * set). */
gpubuf_client *client_enter(GpubufClient *self);
/* 0 when self is connected, not closing and this process's; else -1 with an
 * exception set. */
int client_usable(GpubufClient *self);
void client_leave(GpubufClient *self);
void client_disconnect(GpubufClient *self);
typedef int (*client_op)(gpubuf_client *c, void *arg);
int client_run(GpubufClient *self, client_op op, void *arg);
const char *name_arg(PyObject *o, const char *what);
int timeout_ms_arg(PyObject *o);
/* The arguments of a METH_FASTCALL | METH_KEYWORDS method: the max_pos
 * first of names may come by position, the min first must come; each
 * argument given goes to out[] at its name's index (the others stay as the
 * caller set them: its defaults). 0, or -1 with the TypeError that
 * PyArg_ParseTupleAndKeywords raises for the same mistake. The names are
 * interned at the first call, so a keyword is matched by its pointer.
 * PyArg_ParseTupleAndKeywords took 2,600 instructions for open(name,
 * pool=...) (callgrind), a fifth of the whole call; the hot methods
 * (open, open_id, __dlpack__) parse with this instead. */
#define FAST_ARGS_MAX 8
typedef struct fast_spec {
    const char *fname;
    const char *names[FAST_ARGS_MAX + 1]; /* NULL after the last */
    int max_pos, min;
    PyObject *interned[FAST_ARGS_MAX];
} fast_spec;
int fast_args(fast_spec *spec, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
              PyObject **out);
#define GPUBUFPY_FAST_METHOD(name, fn, doc)                                                        \
    { name, (PyCFunction)(void (*)(void))fn, METH_FASTCALL | METH_KEYWORDS, doc }

/* many.c: Client's batch methods. */
PyObject *client_open_many(GpubufClient *self, PyObject *args, PyObject *kw);
PyObject *client_alloc_many(GpubufClient *self, PyObject *args, PyObject *kw);
PyObject *client_delete_many(GpubufClient *self, PyObject *seq);
PyObject *client_release_many(GpubufClient *self, PyObject *seq);

/* many.c: the items of a batch call (names or ids, malloc'ed; *ret_fast
 * holds them), and its results as a list of Buffers and exceptions (the
 * views are taken: entries become NULL). */
int targets_arg(PyObject *seq, PyObject **ret_fast, const char ***names, uint64_t **ids,
                size_t *n);
PyObject *results_list(GpubufClient *self, gpubuf_buffer **views, const int *st, size_t n);

/* aio.c: the asyncio methods of Client, and forgetting the loop at close. */
PyObject *gpubufpy_aio_open(GpubufClient *self, PyObject *args, PyObject *kw);
PyObject *gpubufpy_aio_open_id(GpubufClient *self, PyObject *args, PyObject *kw);
PyObject *gpubufpy_aio_alloc(GpubufClient *self, PyObject *args, PyObject *kw);
PyObject *gpubufpy_aio_seal(GpubufClient *self, PyObject *args, PyObject *kw);
PyObject *gpubufpy_aio_open_many(GpubufClient *self, PyObject *args, PyObject *kw);
PyObject *gpubufpy_aio_dispatch(GpubufClient *self, PyObject *unused);
void gpubufpy_aio_close(GpubufClient *self);
#define GPUBUFPY_AIO_METHODS                                                                       \
    GPUBUFPY_KW_METHOD("open_async", gpubufpy_aio_open,                                            \
                       "open_async(name, timeout=None, *, readonly=False, pool=None) -> "          \
                       "awaitable Buffer\n\nopen() for asyncio: await it. timeout None waits "     \
                       "until the name is sealed."),                                               \
        GPUBUFPY_KW_METHOD("open_id_async", gpubufpy_aio_open_id,                                  \
                           "open_id_async(id, timeout=None, *, readonly=False, pool=None) -> "     \
                           "awaitable Buffer"),                                                    \
        GPUBUFPY_KW_METHOD("alloc_async", gpubufpy_aio_alloc,                                      \
                           "alloc_async(size, name=None, pool=None) -> awaitable Buffer"),         \
        GPUBUFPY_KW_METHOD("seal_async", gpubufpy_aio_seal,                                        \
                           "seal_async(buffer) -> awaitable None: seal, the daemon's answer "      \
                           "awaited"),                                                             \
        GPUBUFPY_KW_METHOD("open_many_async", gpubufpy_aio_open_many,                              \
                           "open_many_async(targets, *, timeout=None, readonly=False) -> "         \
                           "awaitable list\n\nopen_many() for asyncio: names or ids; items not "   \
                           "sealed yet wait (one deadline)."),                                     \
    {                                                                                              \
        "_dispatch", (PyCFunction)gpubufpy_aio_dispatch, METH_NOARGS,                              \
            "deliver the completions that wait (the asyncio reader callback)"                      \
    }

/* A new Buffer object owning view b (consumes the reference). */
PyObject *gpubufpy_buffer_new(GpubufClient *client, gpubuf_buffer *b);

#endif
