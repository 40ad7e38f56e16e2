/* libgpubuf-client: connections (connect, reconnect settings, flush,
 * disconnect) and the public entry points of the buffer life cycle: each
 * checks its arguments, clears and sets the thread's error message, and
 * leaves the request to lifecycle.c. */
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
    c->spin_max_ns = GPUBUF_SPIN_US_DEFAULT * 1000u;
    env = getenv("GPUBUF_SPIN_US");
    if (env && *env) {
        char *end;
        long v = strtol(env, &end, 10);
        if (*end == '\0' && v >= 0 && v <= GPUBUF_SPIN_US_MAX)
            c->spin_max_ns = (uint64_t)v * 1000u;
    }
    r = gpubuf__hello_locked(c, false);
    if (r < 0) {
        gpubuf__client_unref(c);
        return r;
    }
    *ret = c;
    return 0;
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
GPUBUF_EXTERN int gpubuf_set_reconnect(gpubuf_client *c, int ms) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c, -EINVAL, "gpubuf_set_reconnect needs a connection");
    GPUBUF_CHECK(ms >= 0, -EINVAL, "reconnect time must be 0 or more ms");
    pthread_mutex_lock(&c->lock);
    c->reconnect_ms = ms;
    pthread_mutex_unlock(&c->lock);
    return gpubuf__result(0);
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
    int r = gpubuf__alloc(c, pool, size, name, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_open(gpubuf_client *c, const char *name, int timeout_ms,
                              gpubuf_buffer **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(name, -EINVAL, "gpubuf_open needs a name (gpubuf_open_id opens by id)");
    GPUBUF_CHECK(c && ret, -EINVAL, "an open needs a connection and a place for the view");
    int r = gpubuf__open(c, name, 0, timeout_ms, 0, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_open_ex(gpubuf_client *c, const char *name, uint64_t id, int timeout_ms,
                                 unsigned flags, gpubuf_buffer **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && ret, -EINVAL, "an open needs a connection and a place for the view");
    int r = gpubuf__open(c, name, id, timeout_ms, flags, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_open_id(gpubuf_client *c, uint64_t id, int timeout_ms,
                                 gpubuf_buffer **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && ret, -EINVAL, "an open needs a connection and a place for the view");
    int r = gpubuf__open(c, NULL, id, timeout_ms, 0, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_delete(gpubuf_client *c, const char *name) {
    gpubuf__clear_error();
    GPUBUF_CHECK(name, -EINVAL, "gpubuf_delete needs a name (gpubuf_delete_id deletes by id)");
    GPUBUF_CHECK(c, -EINVAL, "a delete needs a connection");
    int r = gpubuf__delete(c, name, 0, NULL);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_delete_id(gpubuf_client *c, uint64_t id) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c, -EINVAL, "a delete needs a connection");
    int r = gpubuf__delete(c, NULL, id, NULL);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_open_with(gpubuf_client *c, const char *name, uint64_t id,
                                   const gpubuf_lookup *o, gpubuf_buffer **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && ret, -EINVAL, "an open needs a connection and a place for the view");
    int r = gpubuf__open_with(c, name, id, o, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_delete_with(gpubuf_client *c, const char *name, uint64_t id,
                                     const gpubuf_lookup *o) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c, -EINVAL, "a delete needs a connection");
    int r = gpubuf__delete(c, name, id, o);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_seal_stream(gpubuf_buffer *b, gpubuf_stream stream) {
    gpubuf__clear_error();
    GPUBUF_CHECK(b, -EINVAL, "no buffer given (NULL) to seal");
    int r = gpubuf__seal(b, false, stream, true);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_seal(gpubuf_buffer *b) {
    gpubuf__clear_error();
    GPUBUF_CHECK(b, -EINVAL, "no buffer given (NULL) to seal");
    int r = gpubuf__seal(b, false, NULL, false);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_seal_sync(gpubuf_buffer *b) {
    gpubuf__clear_error();
    GPUBUF_CHECK(b, -EINVAL, "no buffer given (NULL) to seal");
    int r = gpubuf__seal(b, true, NULL, false);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_release(gpubuf_buffer *b) {
    gpubuf__clear_error();
    int r = gpubuf__release(b); /* accepts NULL, as a destructor */
    return gpubuf__result(r);
}
