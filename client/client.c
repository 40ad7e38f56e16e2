/* libgpubuf-client: connecting, the buffer life cycle, status and views. */
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "internal.h"
#include "trace.h"
#include "util.h"
#include "wire.h"

static int flush_call(gpubuf_client *c) {
    int r;
    pthread_mutex_lock(&c->lock);
    r = gpubuf__drain_locked(c);
#ifdef GPUBUF_HAVE_CUDA
    gpubuf__events_sweep(c, false);
#endif
    if (r == 0) {
        r = c->async_error;
        c->async_error = 0;
        if (r < 0)
            gpubuf__set_error("an earlier seal or release failed: %s", gpubuf_strerror(r));
    }
    pthread_mutex_unlock(&c->lock);
    return r;
}

/* Why connect(2) to path failed, and what to do about it. from says where
 * the path came from. */
static void explain_connect_error(const char *path, const char *from, int err) {
    struct stat st;
    switch (err) {
    case -ENOENT:
        gpubuf__set_error("cannot connect to gpubufd at %s%s: no such socket. Is gpubufd "
                          "running? Start it (systemctl start gpubufd.socket, or gpubufd "
                          "--socket %s), or set GPUBUF_SOCKET to the socket it listens on",
                          path, from, path);
        return;
    case -ECONNREFUSED:
        if (stat(path, &st) == 0 && !S_ISSOCK(st.st_mode)) {
            gpubuf__set_error("cannot connect to gpubufd at %s%s: that file is not a socket; "
                              "set GPUBUF_SOCKET to the socket gpubufd listens on",
                              path, from);
            return;
        }
        gpubuf__set_error("cannot connect to gpubufd at %s%s: the socket exists but no "
                          "gpubufd listens on it (a stale socket left by a gpubufd that "
                          "stopped or crashed); start gpubufd again (systemctl restart "
                          "gpubufd), it replaces the stale socket",
                          path, from);
        return;
    case -EACCES:
    case -EPERM:
        if (stat(path, &st) == 0) {
            struct group *g = getgrgid(st.st_gid);
            char gname[64];
            if (g)
                snprintf(gname, sizeof(gname), "%s", g->gr_name);
            else
                snprintf(gname, sizeof(gname), "%u", (unsigned)st.st_gid);
            if (st.st_gid != 0 && (st.st_mode & 0020)) {
                /* The group decides: joining it is the way in. */
                gpubuf__set_error("cannot connect to gpubufd at %s: permission denied: the "
                                  "socket belongs to group '%s' (mode %04o) and uid %u is not "
                                  "allowed to use it; join group '%s' (usermod -aG %s $USER, "
                                  "then log in again) or run as a member of it",
                                  path, gname, (unsigned)(st.st_mode & 07777), (unsigned)getuid(),
                                  gname, gname);
                return;
            }
            /* Group root (or a mode that gives the group no write): no group
             * to join; the administrator gives the socket one. */
            gpubuf__set_error("cannot connect to gpubufd at %s: permission denied for uid %u: the "
                              "socket belongs to group '%s' (mode %04o), %s; ask the "
                              "administrator to give it a group for its users: socket_group= "
                              "(and socket_mode = 0660) in gpubuf.conf, or SocketGroup= in "
                              "gpubufd.socket when systemd creates the socket (the packaged "
                              "unit uses group 'gpubuf'), then restart; then join that group",
                              path, (unsigned)getuid(), gname, (unsigned)(st.st_mode & 07777),
                              st.st_gid == 0 ? "root's group, not one to join"
                                             : "and its mode gives that group no access");
        } else {
            gpubuf__set_error("cannot connect to gpubufd at %s: permission denied: a directory "
                              "on the way to the socket is not accessible to uid %u; ask the "
                              "administrator for access to it",
                              path, (unsigned)getuid());
        }
        return;
    default:
        gpubuf__set_error("cannot connect to gpubufd at %s%s: %s", path, from, strerror(-err));
        return;
    }
}

static int connect_call(const char *path, gpubuf_client **ret) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    const char *from = ""; /* the caller named the path */
    gpubuf_client *c;
    int fd, r;
    if (!path) {
        path = getenv("GPUBUF_SOCKET");
        from = " (from $GPUBUF_SOCKET)";
    }
    if (!path || !*path) {
        path = GPUBUF_DEFAULT_SOCKET;
        from = " (the default socket)";
    }
    if (strlen(path) >= sizeof(sa.sun_path))
        return gpubuf__fail(-ENAMETOOLONG,
                            "socket path of %zu bytes is too long (at most %zu): %.200s; "
                            "choose a shorter path",
                            strlen(path), sizeof(sa.sun_path) - 1, path);
    strcpy(sa.sun_path, path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return gpubuf__fail(-errno, "socket(AF_UNIX): %s", strerror(errno));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        r = -errno;
        explain_connect_error(path, from, r);
        close(fd);
        return r;
    }
    c = calloc(1, sizeof(*c));
    if (!c) {
        close(fd);
        return -ENOMEM;
    }
    c->fd = fd;
    c->device = -1;
    atomic_init(&c->refs, 1);
    pthread_mutex_init(&c->lock, NULL);
    pthread_mutex_init(&c->qlock, NULL);
    c->ep = c->efd = -1;
    c->max_request = GPUBUF_WIRE_MAX_REQUEST;

    snprintf(c->path, sizeof(c->path), "%s", path);
    c->reconnect_ms = GPUBUF_RECONNECT_MS_DEFAULT;
    c->on_reconnect = gpubuf__mapping_forget_kept;
    c->on_session_lost = gpubuf__mapping_orphan_all;
    const char *env = getenv("GPUBUF_RECONNECT_MS");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 0 && v <= 3600000)
            c->reconnect_ms = (int)v;
    }
    r = gpubuf__hello_locked(c, false);
    if (r < 0) {
        gpubuf__client_unref(c);
        return r;
    }
    *ret = c;
    return 0;
}

void gpubuf__client_unref(gpubuf_client *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1)
        return;
#ifdef GPUBUF_HAVE_CUDA
    /* Wait for the seal events (their deferred releases unmap), then free. */
    gpubuf__events_sweep(c, true);
    free(c->events);
    c->events = NULL;
    c->cap_events = 0;
#endif
    gpubuf__mapping_clear(c);
    while (c->spare) {
        gpubuf_buffer *b = c->spare;
        c->spare = b->parent;
        free(b);
    }
    gpubuf_held *hd, *htmp;
    HASH_ITER(hh, c->held, hd, htmp) {
        HASH_DEL(c->held, hd);
        free(hd);
    }
    gpubuf_trace_dump(); /* GPUBUF_TRACE_TIMING: this process's records so far */
    for (int i = 0; i < c->n_rfds; i++)
        close(c->rfds[i]);
    free(c->rbuf);
    if (c->fd >= 0)
        close(c->fd);
    if (c->async_hooks)
        c->async_hooks->free(c);
    pthread_mutex_destroy(&c->qlock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

GPUBUF_EXTERN gpubuf_client *gpubuf_disconnect(gpubuf_client *c) {
    if (!c)
        return NULL;
    /* Shut the reading side down first: a thread blocked in a waiting open
     * on this connection then reads end of stream, returns
     * GPUBUF_EDISCONNECTED and frees the lock. The daemon sees nothing yet. */
    c->closing = true;
    shutdown(c->fd, SHUT_RD);
    pthread_mutex_lock(&c->lock);
    c->broken = true;
#ifdef GPUBUF_HAVE_CUDA
    /* The daemon forgets this connection's seal events when it goes: the
     * work they stand for must be done by then. */
    gpubuf__events_sweep(c, true);
#endif
    /* Idle slabs are unmapped before the daemon learns that the connection
     * is gone and frees what nobody references (an exporter must not free
     * memory another process maps). */
    gpubuf__mapping_drop_idle(c, false, false);
    pthread_mutex_unlock(&c->lock);
    /* Started requests end now, each delivered once (GPUBUF_EDISCONNECTED). */
    if (c->async_hooks)
        c->async_hooks->close(c);
    /* Now the daemon drops every reference and pin of this connection. */
    shutdown(c->fd, SHUT_RDWR);
    gpubuf__client_unref(c);
    return NULL;
}

/* ---- requests ---------------------------------------------------------- */

int gpubuf__buffer_request(gpubuf_client *c, Gpubuf__Request *req, gpubuf_buffer **ret) {
    Gpubuf__Response *resp;
    int fd, r;
    pthread_mutex_lock(&c->lock);
    r = gpubuf__rpc_locked(c, req, &resp, &fd);
    if (r == 0) {
        if (resp->body_case != GPUBUF__RESPONSE__BODY_BUFFER) {
            if (fd >= 0)
                close(fd);
            r = GPUBUF_EPROTOCOL;
        } else {
            r = gpubuf__view_from_reply(c, resp->buffer, fd, ret);
            if (r == 0)
                gpubuf_trace(c->session_id, req->id, -1, GPUBUF_TRACE_C_MAPPED, 0);
        }
        gpubuf__response__free_unpacked(resp, NULL);
    }
    pthread_mutex_unlock(&c->lock);
    return r;
}

int gpubuf__alloc_request(gpubuf_client *c, Gpubuf__AllocRequest *a, gpubuf_buffer **ret) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    req.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    req.alloc = a;
    int r = gpubuf__buffer_request(c, &req, ret);
    if (r == 0) {
        (*ret)->allocated = true;
        (*ret)->sealable = true;
    }
    return r;
}

static int alloc_call(gpubuf_client *c, const char *pool, uint64_t size, const char *name,
                      gpubuf_buffer **ret) {
    int r;
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    lookup l = {0};
    if ((r = gpubuf__alloc_fill(&a, pool, size, name, &l)) < 0)
        return r;
    return gpubuf__alloc_request(c, &a, ret);
}

static int open_with_call(gpubuf_client *c, const char *name, uint64_t id,
                          const gpubuf_lookup *opts, gpubuf_buffer **ret) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
    lookup l;
    int r = gpubuf__open_fill(&o, &l, name, id, opts);
    if (r < 0)
        return r;
    req.body_case = GPUBUF__REQUEST__BODY_OPEN;
    req.open = &o;
    return gpubuf__buffer_request(c, &req, ret);
}

static int open_call(gpubuf_client *c, const char *name, uint64_t id, int timeout_ms,
                     unsigned flags, gpubuf_buffer **ret) {
    gpubuf_lookup o = {.flags = flags, .timeout_ms = timeout_ms};
    if (flags & ~(unsigned)GPUBUF_OPEN_READONLY) /* the owner goes with gpubuf_open_with */
        return gpubuf__fail(-EINVAL, "unknown open flags 0x%x",
                            flags & ~(unsigned)GPUBUF_OPEN_READONLY);
    return open_with_call(c, name, id, &o, ret);
}

/* A request whose reply carries no body we need. */
static int simple_request(gpubuf_client *c, Gpubuf__Request *req) {
    Gpubuf__Response *resp;
    pthread_mutex_lock(&c->lock);
    int r = gpubuf__rpc_reply_locked(c, req, GPUBUF__RESPONSE__BODY__NOT_SET, &resp);
    pthread_mutex_unlock(&c->lock);
    if (r == 0)
        gpubuf__response__free_unpacked(resp, NULL);
    return r;
}

static int seal_call(gpubuf_buffer *b, bool wait, gpubuf_stream stream, bool on_stream) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__SealRequest s = GPUBUF__SEAL_REQUEST__INIT;
    uint8_t ev[64];
    gpubuf_client *c;
    int r;
    c = b->c;
    pthread_mutex_lock(&c->lock);
    r = gpubuf__seal_check(&b);
    if (r == 0 && on_stream) {
        r = gpubuf__record_event(c, b, stream, ev);
        if (r == 0) {
            s.event_handle.data = ev;
            s.event_handle.len = sizeof(ev);
        }
    }
    if (r == 0) {
        s.buffer_id = b->id;
        req.body_case = GPUBUF__REQUEST__BODY_SEAL;
        req.seal = &s;
        if (wait) {
            /* Its own reply, not an earlier asynchronous request's error. */
            Gpubuf__Response *resp;
            r = gpubuf__rpc_reply_locked(c, &req, GPUBUF__RESPONSE__BODY__NOT_SET, &resp);
            if (r == 0)
                gpubuf__response__free_unpacked(resp, NULL);
        } else {
            /* Nothing left for the daemon to refuse: send without waiting. */
            r = gpubuf__send_async_locked(c, &req);
        }
        if (r == 0)
            b->sealable = false;
    }
    pthread_mutex_unlock(&c->lock);
    return r;
}

GPUBUF_EXTERN int gpubuf_seal_stream(gpubuf_buffer *b, gpubuf_stream stream) {
    gpubuf__clear_error();
    GPUBUF_CHECK(b, -EINVAL, "no buffer given (NULL) to seal");
    int r = seal_call(b, false, stream, true);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_seal(gpubuf_buffer *b) {
    gpubuf__clear_error();
    GPUBUF_CHECK(b, -EINVAL, "no buffer given (NULL) to seal");
    int r = seal_call(b, false, NULL, false);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_seal_sync(gpubuf_buffer *b) {
    gpubuf__clear_error();
    GPUBUF_CHECK(b, -EINVAL, "no buffer given (NULL) to seal");
    int r = seal_call(b, true, NULL, false);
    return gpubuf__result(r);
}

static int delete_with_call(gpubuf_client *c, const char *name, uint64_t id,
                            const gpubuf_lookup *opts) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__DeleteRequest d = GPUBUF__DELETE_REQUEST__INIT;
    lookup l;
    int r;
    if ((r = gpubuf__lookup_make("delete", name, id, opts, GPUBUF_OPEN_OWNER, &l)) < 0)
        return r;
    d.target_case = gpubuf__lookup_fill(&l, &d.name, &d.buffer_id, &d.pool, &d.owner)
                        ? GPUBUF__DELETE_REQUEST__TARGET_NAME
                        : GPUBUF__DELETE_REQUEST__TARGET_BUFFER_ID;
    req.body_case = GPUBUF__REQUEST__BODY_DELETE;
    req.delete_ = &d;
    return simple_request(c, &req);
}

GPUBUF_EXTERN int gpubuf_set_reconnect(gpubuf_client *c, int ms) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c, -EINVAL, "gpubuf_set_reconnect needs a connection");
    GPUBUF_CHECK(ms >= 0, -EINVAL, "reconnect time must be 0 or more ms");
    pthread_mutex_lock(&c->lock);
    c->reconnect_ms = ms;
    pthread_mutex_unlock(&c->lock);
    return gpubuf__result(0);
}

/* ---- views ------------------------------------------------------------- */

static int release_call(gpubuf_buffer *b) {
    int r = 0;
    while (b) {
        if (atomic_fetch_sub(&b->refs, 1) != 1)
            return r;
        gpubuf_buffer *parent = b->parent;
        if (b->owns_ref) {
            gpubuf_client *c = b->c;
            pthread_mutex_lock(&c->lock);
            /* gpubufd restarted without its reference: nothing to release
             * there (the id may name another buffer now). */
            bool live = !b->map || gpubuf__view_live(b);
#ifdef GPUBUF_HAVE_CUDA
            const gpubuf_cuda *cu;
            if (b->event && gpubuf_cuda_load(&cu) == 0)
                cu->EventDestroy(b->event);
            if (!live && b->own_event)
                gpubuf__event_released(c, b, 1); /* the daemon forgot it */
            /* Sealed on a stream whose work still runs: the reference stays
             * (and the daemon keeps handing the event out) until it ends. */
            if (live && b->own_event && gpubuf__event_defer(c, b))
                b->map = NULL;
#endif
            if (!live) {
                gpubuf__mapping_put(c, b->map);
                b->map = NULL;
            }
            if (b->map)
                r = gpubuf__release_locked(c, b->id, b->map, b->read_only);
#ifdef GPUBUF_HAVE_CUDA
            /* The release just sent is request next_id; on a broken
             * connection the daemon forgot the event with the holder. */
            if (b->map && b->own_event)
                gpubuf__event_released(c, b, c->broken ? 1 : c->next_id);
            gpubuf__events_sweep(c, false);
#endif
            gpubuf__view_meta_free(b);
            gpubuf__view_recycle(c, b);
            pthread_mutex_unlock(&c->lock);
            gpubuf__client_unref(c);
        } else {
            gpubuf__view_meta_free(b);
            free(b);
        }
        b = parent; /* a slice held one reference to its parent */
    }
    return r;
}

/* ---- public entry points ------------------------------------------------
 * Each clears the thread's error message first and leaves one that belongs
 * to its own result: "" on success, a sentence on failure. */

GPUBUF_EXTERN int gpubuf_flush(gpubuf_client *c) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c, -EINVAL, "gpubuf_flush needs a connection");
    int r = flush_call(c);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_connect(const char *path, gpubuf_client **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(ret, -EINVAL, "gpubuf_connect needs a place for the connection");
    int r = connect_call(path, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_alloc(gpubuf_client *c, const char *pool, uint64_t size, const char *name,
                               gpubuf_buffer **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && ret, -EINVAL, "gpubuf_alloc needs a connection and a place for the view");
    GPUBUF_CHECK(size > 0, -EINVAL, "size 0: a buffer holds at least 1 byte");
    int r = alloc_call(c, pool, size, name, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_open(gpubuf_client *c, const char *name, int timeout_ms,
                              gpubuf_buffer **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(name, -EINVAL, "gpubuf_open needs a name (gpubuf_open_id opens by id)");
    GPUBUF_CHECK(c && ret, -EINVAL, "an open needs a connection and a place for the view");
    int r = open_call(c, name, 0, timeout_ms, 0, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_open_ex(gpubuf_client *c, const char *name, uint64_t id, int timeout_ms,
                                 unsigned flags, gpubuf_buffer **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && ret, -EINVAL, "an open needs a connection and a place for the view");
    int r = open_call(c, name, id, timeout_ms, flags, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_open_id(gpubuf_client *c, uint64_t id, int timeout_ms,
                                 gpubuf_buffer **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && ret, -EINVAL, "an open needs a connection and a place for the view");
    int r = open_call(c, NULL, id, timeout_ms, 0, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_delete(gpubuf_client *c, const char *name) {
    gpubuf__clear_error();
    GPUBUF_CHECK(name, -EINVAL, "gpubuf_delete needs a name (gpubuf_delete_id deletes by id)");
    GPUBUF_CHECK(c, -EINVAL, "a delete needs a connection");
    int r = delete_with_call(c, name, 0, NULL);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_delete_id(gpubuf_client *c, uint64_t id) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c, -EINVAL, "a delete needs a connection");
    int r = delete_with_call(c, NULL, id, NULL);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_open_with(gpubuf_client *c, const char *name, uint64_t id,
                                   const gpubuf_lookup *o, gpubuf_buffer **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && ret, -EINVAL, "an open needs a connection and a place for the view");
    int r = open_with_call(c, name, id, o, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_delete_with(gpubuf_client *c, const char *name, uint64_t id,
                                     const gpubuf_lookup *o) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c, -EINVAL, "a delete needs a connection");
    int r = delete_with_call(c, name, id, o);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_release(gpubuf_buffer *b) {
    gpubuf__clear_error();
    int r = release_call(b); /* accepts NULL, as a destructor */
    return gpubuf__result(r);
}
