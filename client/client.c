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
    if (!c)
        return -EINVAL;
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
    if (!ret)
        return gpubuf__fail(-EINVAL, "gpubuf_connect needs a place for the connection");
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
    /* Now the daemon drops every reference and pin of this connection. */
    shutdown(c->fd, SHUT_RDWR);
    gpubuf__client_unref(c);
    return NULL;
}

/* Build a root view from a Buffer reply. Lock held. Consumes fd. */
static int make_view(gpubuf_client *c, const Gpubuf__Buffer *m, int fd, gpubuf_buffer **ret) {
    gpubuf_mapping *map;
    gpubuf_buffer *b;
    int r;
    if (!m || !m->slab || m->offset > m->slab->size || m->size > m->slab->size - m->offset) {
        if (fd >= 0)
            close(fd);
        gpubuf__set_error("gpubufd described a buffer outside its slab");
        return GPUBUF_EPROTOCOL;
    }
    /* The layout and user bytes first: a malformed one maps nothing. */
    gpubuf_buffer meta = {0};
    if ((m->layout || m->user_data.len) && (r = gpubuf__view_meta(&meta, m)) < 0) {
        if (fd >= 0)
            close(fd);
        gpubuf__view_meta_free(&meta);
        return r;
    }
    r = gpubuf__mapping_get(c, m->slab, fd, &map);
    if (r == 0) {
        r = gpubuf__view_new(c, map, m->buffer_id, m->offset, m->size, m->name, m->read_only,
                             m->event_handle.len == sizeof(b->event_handle) ? m->event_handle.data
                                                                            : NULL,
                             ret);
        if (r < 0)
            gpubuf__mapping_put(c, map);
    }
    if (r < 0) {
        gpubuf__view_meta_free(&meta);
        return r;
    }
    (*ret)->layout = meta.layout;
    (*ret)->user = meta.user;
    (*ret)->user_len = meta.user_len;
    return 0;
}

int gpubuf__view_new(gpubuf_client *c, gpubuf_mapping *map, uint64_t id, uint64_t offset,
                     uint64_t size, const char *name, bool read_only, const uint8_t *event,
                     gpubuf_buffer **ret) {
    gpubuf_buffer *b = calloc(1, sizeof(*b));
    if (!b)
        return -ENOMEM;
    atomic_init(&b->refs, 1);
    b->c = c;
    b->map = map;
    b->id = id;
    b->offset = offset;
    b->size = size;
    b->owns_ref = true;
    b->read_only = read_only && map->read_only;
    if (event) {
        memcpy(b->event_handle, event, sizeof(b->event_handle));
        b->has_event = true;
#ifdef GPUBUF_HAVE_CUDA
        gpubuf__event_import(b);
#endif
    }
    snprintf(b->name, sizeof(b->name), "%s", name ? name : "");
    b->gen = c->gen;
    gpubuf__held(c, b->id, b->read_only, true);
    atomic_fetch_add(&c->refs, 1);
    *ret = b;
    return 0;
}

static int buffer_request(gpubuf_client *c, Gpubuf__Request *req, gpubuf_buffer **ret) {
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
            r = make_view(c, resp->buffer, fd, ret);
            if (r < 0) /* mapping failed: give the reference back */
                gpubuf__send_release(c, resp->buffer->buffer_id, false, resp->buffer->read_only);
            else
                gpubuf_trace(c->session_id, req->id, -1, GPUBUF_TRACE_C_MAPPED, 0);
        }
        gpubuf__response__free_unpacked(resp, NULL);
    }
    pthread_mutex_unlock(&c->lock);
    return r;
}

/* 0, or -EINVAL / -ENAMETOOLONG with the rule the name breaks. */
static int name_check(const char *name) {
    char msg[256];
    int r = gpubuf_name_check(name, strlen(name), msg, sizeof(msg));
    if (r < 0)
        gpubuf__set_error("%s", msg);
    return r;
}

/* Split a name ("NAME" or "/POOL/NAME") and merge o's pool and owner into l;
 * allowed: the flags the call takes. 0, or -EINVAL / -ENAMETOOLONG with the
 * reason set. */
static int lookup_make(const char *what, const char *name, uint64_t id, const gpubuf_lookup *o,
                       unsigned allowed, lookup *l) {
    static const gpubuf_lookup none;
    char msg[512];
    int r;
    if (!o)
        o = &none;
    memset(l, 0, sizeof(*l));
    gpubuf__expected_owner__init(&l->owner);
    if (o->flags & ~allowed)
        return gpubuf__fail(-EINVAL, "%s: unknown flags 0x%x", what, o->flags & ~allowed);
    if (name) {
        if ((r = gpubuf_name_split(name, l->pool, &l->name, msg, sizeof(msg))) < 0)
            return gpubuf__fail(r, "%s", msg);
        if ((r = name_check(l->name)) < 0)
            return r;
    }
    l->id = id;
    if (o->pool && *o->pool) {
        if (l->pool[0] && strcmp(l->pool, o->pool) != 0)
            return gpubuf__fail(-EINVAL,
                                "%s: '%s' names pool '%s' but pool '%s' was given: name one pool",
                                what, name, l->pool, o->pool);
        if (strlen(o->pool) > GPUBUF_NAME_MAX)
            return gpubuf__fail(-ENAMETOOLONG, "%s: a pool name is at most %d bytes", what,
                                GPUBUF_NAME_MAX);
        snprintf(l->pool, sizeof(l->pool), "%s", o->pool);
    }
    if (o->flags & GPUBUF_OPEN_OWNER) {
        l->has_owner = true;
        l->owner.uid = o->owner_uid;
    }
    return 0;
}

static int alloc_call(gpubuf_client *c, const char *pool, uint64_t size, const char *name,
                      gpubuf_buffer **ret) {
    int r;
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    if (!c || !ret)
        return gpubuf__fail(-EINVAL, "gpubuf_alloc needs a connection and a place for the view");
    if (size == 0)
        return gpubuf__fail(-EINVAL, "size 0: a buffer holds at least 1 byte");
    lookup l = {0};
    if (name && *name) {
        gpubuf_lookup o = {.pool = pool};
        if ((r = lookup_make("alloc", name, 0, &o, 0, &l)) < 0)
            return r;
        pool = l.pool;
        name = l.name;
    }
    a.pool = (char *)(pool ? pool : "");
    a.size = size;
    a.name = (char *)(name ? name : "");
    req.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    req.alloc = &a;
    r = buffer_request(c, &req, ret);
    if (r == 0) {
        (*ret)->allocated = true;
        (*ret)->sealable = true;
    }
    return r;
}

/* The target, pool and owner of an open, stat or delete request from l
 * (name and id are one protobuf oneof: only one is written). Returns true
 * for a target by name. */
static bool lookup_fill(lookup *l, char **name, uint64_t *id, char **pool,
                        Gpubuf__ExpectedOwner **owner) {
    if (l->name)
        *name = (char *)l->name;
    else
        *id = l->id;
    *pool = l->pool;
    *owner = l->has_owner ? &l->owner : NULL;
    return l->name != NULL;
}

static int open_with_call(gpubuf_client *c, const char *name, uint64_t id,
                          const gpubuf_lookup *opts, gpubuf_buffer **ret) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
    lookup l;
    int r;
    if (!c || !ret)
        return gpubuf__fail(-EINVAL, "an open needs a connection and a place for the view");
    r = lookup_make("open", name, id, opts, GPUBUF_OPEN_READONLY | GPUBUF_OPEN_OWNER, &l);
    if (r < 0)
        return r;
    o.target_case = lookup_fill(&l, &o.name, &o.buffer_id, &o.pool, &o.owner)
                        ? GPUBUF__OPEN_REQUEST__TARGET_NAME
                        : GPUBUF__OPEN_REQUEST__TARGET_BUFFER_ID;
    o.timeout_ms = opts ? opts->timeout_ms : 0;
    o.read_only = opts && (opts->flags & GPUBUF_OPEN_READONLY);
    req.body_case = GPUBUF__REQUEST__BODY_OPEN;
    req.open = &o;
    return buffer_request(c, &req, ret);
}

static int open_call(gpubuf_client *c, const char *name, uint64_t id, int timeout_ms,
                     unsigned flags, gpubuf_buffer **ret) {
    gpubuf_lookup o = {.flags = flags, .timeout_ms = timeout_ms};
    if (flags & ~(unsigned)GPUBUF_OPEN_READONLY) /* the owner goes with gpubuf_open_with */
        return gpubuf__fail(-EINVAL, "unknown open flags 0x%x",
                            flags & ~(unsigned)GPUBUF_OPEN_READONLY);
    return open_with_call(c, name, id, &o, ret);
}

GPUBUF_EXTERN int gpubuf_buffer_read_only(const gpubuf_buffer *b) {
    return b && b->map->read_only ? 1 : 0;
}

/* A request whose reply carries no body we need. */
static int simple_request(gpubuf_client *c, Gpubuf__Request *req) {
    Gpubuf__Response *resp;
    int fd, r;
    pthread_mutex_lock(&c->lock);
    r = gpubuf__rpc_locked(c, req, &resp, &fd);
    pthread_mutex_unlock(&c->lock);
    if (r == 0) {
        if (fd >= 0)
            close(fd);
        gpubuf__response__free_unpacked(resp, NULL);
    }
    return r;
}

int gpubuf__seal_check(gpubuf_buffer **pb) {
    gpubuf_buffer *b = *pb;
    while (b->parent) /* a slice seals the buffer it belongs to */
        b = b->parent;
    *pb = b;
    int r = gpubuf__view_check(b);
    if (r < 0)
        return r;
    if (b->sealable)
        return 0;
    if (b->allocated) {
        gpubuf__set_error("the buffer is already sealed");
        return GPUBUF_ESTATE;
    }
    gpubuf__set_error("this view comes from gpubuf_open: the buffer is sealed already, and only "
                      "the connection that allocated a buffer seals it");
    return -EPERM;
}

static int seal(gpubuf_buffer *b, bool wait, gpubuf_stream stream, bool on_stream) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__SealRequest s = GPUBUF__SEAL_REQUEST__INIT;
    uint8_t ev[64];
    gpubuf_client *c;
    int r;
    if (!b)
        return gpubuf__fail(-EINVAL, "no buffer given (NULL) to seal");
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
            int fd;
            r = gpubuf__rpc_locked(c, &req, &resp, &fd);
            if (r == 0) {
                if (fd >= 0)
                    close(fd);
                gpubuf__response__free_unpacked(resp, NULL);
            }
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
    return gpubuf__result(seal(b, false, stream, true));
}

GPUBUF_EXTERN int gpubuf_seal(gpubuf_buffer *b) {
    gpubuf__clear_error();
    return gpubuf__result(seal(b, false, NULL, false));
}

GPUBUF_EXTERN int gpubuf_seal_sync(gpubuf_buffer *b) {
    gpubuf__clear_error();
    return gpubuf__result(seal(b, true, NULL, false));
}

static int delete_with_call(gpubuf_client *c, const char *name, uint64_t id,
                            const gpubuf_lookup *opts) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__DeleteRequest d = GPUBUF__DELETE_REQUEST__INIT;
    lookup l;
    int r;
    if (!c)
        return gpubuf__fail(-EINVAL, "a delete needs a connection");
    if ((r = lookup_make("delete", name, id, opts, GPUBUF_OPEN_OWNER, &l)) < 0)
        return r;
    d.target_case = lookup_fill(&l, &d.name, &d.buffer_id, &d.pool, &d.owner)
                        ? GPUBUF__DELETE_REQUEST__TARGET_NAME
                        : GPUBUF__DELETE_REQUEST__TARGET_BUFFER_ID;
    req.body_case = GPUBUF__REQUEST__BODY_DELETE;
    req.delete_ = &d;
    return simple_request(c, &req);
}

static void copy_info(gpubuf_buffer_info *o, const Gpubuf__Buffer *m) {
    memset(o, 0, sizeof(*o));
    o->id = m->buffer_id;
    snprintf(o->name, sizeof(o->name), "%s", m->name ? m->name : "");
    snprintf(o->pool, sizeof(o->pool), "%s", m->pool ? m->pool : "");
    o->size = m->size;
    o->state = (gpubuf_state)m->state;
    o->refs = m->refs;
    o->owner_uid = m->owner_uid;
    o->offset = m->offset;
    o->slab_id = m->slab_id;
}

GPUBUF_EXTERN gpubuf_status *gpubuf_status_free(gpubuf_status *s) {
    if (s) {
        free(s->pools);
        free(s->buffers);
        free(s->clients);
        free((void *)s->pool_publishers);
        free((void *)s->buffer_restored);
        free((void *)s->client_detached);
        free(s->buffer_meta);
        free((void *)s->counters.requests);
        free((void *)s->counters.errors);
        free((void *)s->counters.pools);
        free((void *)s->counters.refused);
        free((void *)s->counters.disconnects);
        free((void *)s->counters.batches);
        if (s->reserved_)
            gpubuf__response__free_unpacked(s->reserved_, NULL);
        free(s);
    }
    return NULL;
}

/* Every column has one entry per buffer, pool indexes are in range, and the
 * names blob holds exactly one NUL-terminated name per buffer. */
static bool columns_ok(const Gpubuf__BufferColumns *c, size_t n_pools) {
    size_t n = c->n_id, nuls = 0, run = 0;
    if (c->n_size != n || c->n_offset != n || c->n_slab_id != n || c->n_pool != n ||
        c->n_state != n || c->n_refs != n || c->n_owner_uid != n)
        return false;
    for (size_t i = 0; i < n; i++)
        if (c->pool[i] >= n_pools)
            return false;
    for (size_t i = 0; i < c->names.len; i++) {
        if (c->names.data[i] == 0) {
            nuls++;
            run = 0;
        } else if (++run > GPUBUF_NAME_MAX) {
            return false;
        }
    }
    return nuls == n && (n == 0 || c->names.data[c->names.len - 1] == 0);
}

static bool short_name(const char *s) {
    return !s || strnlen(s, GPUBUF_NAME_MAX + 1) <= GPUBUF_NAME_MAX;
}

/* Names no longer than the daemon ever makes them: the snapshot hands them
 * out, and callers (gpubufctl) size buffers by GPUBUF_NAME_MAX. */
static bool names_ok(const Gpubuf__StatusReply *st) {
    for (size_t i = 0; i < st->n_pools; i++)
        if (!short_name(st->pools[i]->name))
            return false;
    for (size_t i = 0; i < st->n_buffers; i++)
        if (!short_name(st->buffers[i]->name) || !short_name(st->buffers[i]->pool))
            return false;
    return true;
}

static gpubuf_named_counter *copy_named(Gpubuf__NamedCounter **in, size_t n) {
    gpubuf_named_counter *o = calloc(n + 1, sizeof(*o));
    for (size_t i = 0; o && i < n; i++) {
        o[i].name = in[i]->name ? in[i]->name : "";
        o[i].count = in[i]->count;
    }
    return o;
}

/* The counters of a status reply; strings and arrays point into it. */
static int copy_counters(gpubuf_counters *o, const Gpubuf__Counters *m) {
    gpubuf_request_counters *rq = calloc(m->n_requests + 1, sizeof(*rq));
    gpubuf_error_counter *er = calloc(m->n_errors + 1, sizeof(*er));
    gpubuf_pool_counters *pc = calloc(m->n_pools + 1, sizeof(*pc));
    o->requests = rq;
    o->errors = er;
    o->pools = pc;
    o->refused = copy_named(m->refused, m->n_refused);
    o->disconnects = copy_named(m->disconnects, m->n_disconnects);
    if (!rq || !er || !pc || !o->refused || !o->disconnects)
        return -ENOMEM;
    for (size_t i = 0; i < m->n_requests; i++) {
        const Gpubuf__RequestCounters *x = m->requests[i];
        rq[i].type = x->type ? x->type : "";
        rq[i].requests = x->requests;
        rq[i].errors = x->errors;
        rq[i].duration_ns = x->duration_ns;
        /* A bucket array that does not match the bounds is left out. */
        if (x->n_duration_buckets == m->n_bucket_bounds + 1) {
            rq[i].n_buckets = x->n_duration_buckets;
            rq[i].buckets = x->duration_buckets;
        }
    }
    for (size_t i = 0; i < m->n_errors; i++) {
        er[i].code = m->errors[i]->code;
        er[i].count = m->errors[i]->count;
    }
    for (size_t i = 0; i < m->n_pools; i++) {
        const Gpubuf__PoolCounters *x = m->pools[i];
        pc[i].pool = x->pool ? x->pool : "";
        pc[i].bytes_allocated = x->bytes_allocated;
        pc[i].bytes_freed = x->bytes_freed;
        pc[i].slabs_created = x->slabs_created;
        pc[i].slabs_destroyed = x->slabs_destroyed;
        pc[i].alloc_failures = x->alloc_failures;
    }
    o->present = 1;
    o->n_requests = m->n_requests;
    o->n_bounds = m->n_bucket_bounds;
    o->bucket_bounds = m->bucket_bounds;
    o->n_errors = m->n_errors;
    o->n_pools = m->n_pools;
    o->n_refused = m->n_refused;
    o->n_disconnects = m->n_disconnects;
    o->slab_imports = m->slab_imports;
    o->connections = m->connections;
    o->open_timeouts = m->open_timeouts;
    return 0;
}

/* The batch item counters of a status reply; type strings point into it. */
static int copy_batches(gpubuf_counters *o, const Gpubuf__StatusReply *st) {
    gpubuf_batch_counters *b = calloc(st->n_batches + 1, sizeof(*b));
    if (!b)
        return -ENOMEM;
    for (size_t i = 0; i < st->n_batches; i++) {
        b[i].type = st->batches[i]->type ? st->batches[i]->type : "";
        b[i].items = st->batches[i]->items;
        b[i].item_errors = st->batches[i]->item_errors;
    }
    o->batches = b;
    o->n_batches = st->n_batches;
    return 0;
}

static int status_get_call(gpubuf_client *c, gpubuf_status **ret) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__StatusRequest sr = GPUBUF__STATUS_REQUEST__INIT;
    Gpubuf__Response *resp;
    gpubuf_status *s;
    int fd, r;
    if (!c || !ret)
        return -EINVAL;
    sr.columnar = true; /* a daemon without columns answers with buffers */
    req.body_case = GPUBUF__REQUEST__BODY_STATUS;
    req.status = &sr;
    pthread_mutex_lock(&c->lock);
    r = gpubuf__rpc_locked(c, &req, &resp, &fd);
    pthread_mutex_unlock(&c->lock);
    if (r < 0)
        return r;
    if (fd >= 0)
        close(fd);
    if (resp->body_case != GPUBUF__RESPONSE__BODY_STATUS_REPLY) {
        gpubuf__response__free_unpacked(resp, NULL);
        return GPUBUF_EPROTOCOL;
    }
    Gpubuf__StatusReply *st = resp->status_reply;
    const Gpubuf__BufferColumns *col = st->buffer_columns;
    size_t n_buffers = col ? col->n_id : st->n_buffers;
    if ((col && (!columns_ok(col, st->n_pools) || !gpubuf__meta_columns_ok(col, col->n_id))) ||
        !names_ok(st)) {
        gpubuf__set_error("gpubufd sent inconsistent status columns or overlong names");
        gpubuf__response__free_unpacked(resp, NULL);
        return GPUBUF_EPROTOCOL;
    }
    s = calloc(1, sizeof(*s));
    if (s) {
        s->pools = calloc(st->n_pools + 1, sizeof(*s->pools));
        s->buffers = calloc(n_buffers + 1, sizeof(*s->buffers));
        s->clients = calloc(st->n_clients + 1, sizeof(*s->clients));
        s->pool_publishers = calloc(st->n_pools + 1, sizeof(*s->pool_publishers));
    }
    if (!s || !s->pools || !s->buffers || !s->clients || !s->pool_publishers) {
        gpubuf_status_free(s); /* resp is not attached yet */
        gpubuf__response__free_unpacked(resp, NULL);
        return -ENOMEM;
    }
    for (size_t i = 0; i < st->n_pools; i++) {
        const Gpubuf__PoolStatus *p = st->pools[i];
        gpubuf_pool_info *o = &s->pools[i];
        snprintf(o->name, sizeof(o->name), "%s", p->name);
        o->kind = (gpubuf_pool_kind)p->kind;
        o->device = p->device;
        if (p->device_uuid.len == 16)
            gpubuf_format_uuid(p->device_uuid.data, o->device_uuid);
        o->capacity = p->capacity;
        o->used = p->used;
        o->reserved = p->reserved;
        o->slab_size = p->slab_size;
        o->slabs = p->slabs;
        o->buffers = p->buffers;
        /* Strings in the reply, which the snapshot keeps. */
        ((const char **)s->pool_publishers)[i] = p->publishers ? p->publishers : "";
        if (p->default_pool)
            s->default_pool = p->name;
    }
    if (!s->default_pool)
        s->default_pool = "";
    s->n_pools = st->n_pools;
    /* Buffer strings point into the reply, which the snapshot keeps. */
    const char *name = col ? (const char *)col->names.data : NULL;
    for (size_t i = 0; col && i < n_buffers; i++) {
        gpubuf_status_buffer *o = &s->buffers[i];
        o->id = col->id[i];
        o->name = name;
        name += strlen(name) + 1;
        o->pool = st->pools[col->pool[i]]->name; /* in the reply, like the name */
        o->size = col->size[i];
        o->state = (gpubuf_state)col->state[i];
        o->refs = col->refs[i];
        o->owner_uid = col->owner_uid[i];
        o->offset = col->offset[i];
        o->slab_id = col->slab_id[i];
    }
    for (size_t i = 0; !col && i < st->n_buffers; i++) {
        const Gpubuf__Buffer *m = st->buffers[i];
        gpubuf_status_buffer *o = &s->buffers[i];
        o->id = m->buffer_id;
        o->name = m->name ? m->name : "";
        o->pool = m->pool ? m->pool : "";
        o->size = m->size;
        o->state = (gpubuf_state)m->state;
        o->refs = m->refs;
        o->owner_uid = m->owner_uid;
        o->offset = m->offset;
        o->slab_id = m->slab_id;
    }
    s->n_buffers = n_buffers;
    for (size_t i = 0; i < st->n_clients; i++) {
        const Gpubuf__ClientStatus *x = st->clients[i];
        gpubuf_client_info *o = &s->clients[i];
        o->session_id = x->session_id;
        o->pid = x->pid;
        o->uid = x->uid;
        o->gid = x->gid;
        o->references = x->references;
        o->buffers_held = x->buffers_held;
        o->kept_slabs = x->kept_slabs;
        o->read_only_references = x->read_only_references;
        snprintf(o->name, sizeof(o->name), "%s", x->name ? x->name : "");
    }
    s->n_clients = st->n_clients;
    s->restarts = st->restarts;
    s->restored_buffers = st->restored_buffers;
    bool any_restored = false, any_detached = false;
    for (size_t i = 0; i < n_buffers && !any_restored; i++)
        any_restored = col ? i < col->n_restored && col->restored[i] : st->buffers[i]->restored;
    for (size_t i = 0; i < st->n_clients && !any_detached; i++)
        any_detached = st->clients[i]->detached;
    uint8_t *restored = any_restored ? calloc(n_buffers + 1, 1) : NULL;
    uint8_t *detached = any_detached ? calloc(st->n_clients + 1, 1) : NULL;
    for (size_t i = 0; restored && i < n_buffers; i++)
        restored[i] = col ? i < col->n_restored && col->restored[i] : st->buffers[i]->restored;
    for (size_t i = 0; detached && i < st->n_clients; i++)
        detached[i] = st->clients[i]->detached;
    s->buffer_restored = restored;
    s->client_detached = detached;
    if ((any_restored && !restored) || (any_detached && !detached)) {
        gpubuf_status_free(s);
        gpubuf__response__free_unpacked(resp, NULL);
        return -ENOMEM;
    }
    if ((st->counters && copy_counters(&s->counters, st->counters) < 0) ||
        copy_batches(&s->counters, st) < 0) {        gpubuf_status_free(s); /* resp is not attached yet */
        gpubuf__response__free_unpacked(resp, NULL);
        return -ENOMEM;
    }
    if (gpubuf__status_meta(s, st, col) < 0) {
        gpubuf_status_free(s); /* resp is not attached yet */
        gpubuf__response__free_unpacked(resp, NULL);
        return -ENOMEM;
    }
    s->uptime_ms = st->uptime_ms;
    snprintf(s->version, sizeof(s->version), "%s", st->version ? st->version : "");
    s->reserved_ = resp;
    *ret = s;
    return 0;
}

/* ---- views ------------------------------------------------------------- */

GPUBUF_EXTERN int gpubuf_set_reconnect(gpubuf_client *c, int ms) {
    gpubuf__clear_error();
    if (!c || ms < 0)
        return gpubuf__result(gpubuf__fail(-EINVAL, "reconnect time must be 0 or more ms"));
    pthread_mutex_lock(&c->lock);
    c->reconnect_ms = ms;
    pthread_mutex_unlock(&c->lock);
    return 0;
}

GPUBUF_EXTERN gpubuf_buffer *gpubuf_buffer_ref(gpubuf_buffer *b) {
    if (b)
        atomic_fetch_add(&b->refs, 1);
    return b;
}

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
            pthread_mutex_unlock(&c->lock);
            gpubuf__client_unref(c);
        }
        gpubuf__view_meta_free(b);
        free(b);
        b = parent; /* a slice held one reference to its parent */
    }
    return r;
}

GPUBUF_EXTERN uint64_t gpubuf_buffer_device_ptr(const gpubuf_buffer *b) {
    return b ? b->map->base + b->offset : 0;
}

GPUBUF_EXTERN void *gpubuf_buffer_host_ptr(const gpubuf_buffer *b) {
    if (!b || !b->map->host)
        return NULL;
    return (char *)b->map->host + b->offset;
}

GPUBUF_EXTERN uint64_t gpubuf_buffer_size(const gpubuf_buffer *b) {
    return b ? b->size : 0;
}

GPUBUF_EXTERN int gpubuf_buffer_device(const gpubuf_buffer *b) {
    return b ? b->map->device : -1;
}

GPUBUF_EXTERN int gpubuf_buffer_memory_device(const gpubuf_buffer *b) {
    return b ? b->map->home : -1;
}

GPUBUF_EXTERN gpubuf_pool_kind gpubuf_buffer_pool_kind(const gpubuf_buffer *b) {
    return b ? b->map->kind : (gpubuf_pool_kind)0;
}

GPUBUF_EXTERN uint64_t gpubuf_buffer_id(const gpubuf_buffer *b) {
    return b ? b->id : 0;
}

GPUBUF_EXTERN const char *gpubuf_buffer_name(const gpubuf_buffer *b) {
    return b ? b->name : "";
}

static int buffer_slice_call(gpubuf_buffer *b, uint64_t offset, uint64_t length,
                             gpubuf_buffer **ret) {
    gpubuf_buffer *s;
    if (!b || !ret)
        return -EINVAL;
    if (offset > b->size || length > b->size - offset) {
        gpubuf__set_error("slice [%llu, +%llu) outside a view of %llu bytes",
                          (unsigned long long)offset, (unsigned long long)length,
                          (unsigned long long)b->size);
        return GPUBUF_ERANGE;
    }
    s = calloc(1, sizeof(*s));
    if (!s)
        return -ENOMEM;
    atomic_init(&s->refs, 1);
    s->c = b->c;
    s->parent = gpubuf_buffer_ref(b);
    s->map = b->map;
    s->id = b->id;
    s->offset = b->offset + offset;
    s->size = length;
    s->owns_ref = false;
    memcpy(s->name, b->name, sizeof(s->name));
    *ret = s;
    return 0;
}

/* ---- public entry points ------------------------------------------------
 * Each clears the thread's error message first and leaves one that belongs
 * to its own result: "" on success, a sentence on failure. */

GPUBUF_EXTERN int gpubuf_flush(gpubuf_client *c) {
    gpubuf__clear_error();
    return gpubuf__result(flush_call(c));
}

GPUBUF_EXTERN int gpubuf_connect(const char *path, gpubuf_client **ret) {
    gpubuf__clear_error();
    return gpubuf__result(connect_call(path, ret));
}

GPUBUF_EXTERN int gpubuf_alloc(gpubuf_client *c, const char *pool, uint64_t size, const char *name,
                               gpubuf_buffer **ret) {
    gpubuf__clear_error();
    return gpubuf__result(alloc_call(c, pool, size, name, ret));
}

GPUBUF_EXTERN int gpubuf_open(gpubuf_client *c, const char *name, int timeout_ms,
                              gpubuf_buffer **ret) {
    gpubuf__clear_error();
    if (!name) {
        gpubuf__set_error("gpubuf_open needs a name (gpubuf_open_id opens by id)");
        return -EINVAL;
    }
    return gpubuf__result(open_call(c, name, 0, timeout_ms, 0, ret));
}

GPUBUF_EXTERN int gpubuf_open_ex(gpubuf_client *c, const char *name, uint64_t id, int timeout_ms,
                                 unsigned flags, gpubuf_buffer **ret) {
    gpubuf__clear_error();
    return gpubuf__result(open_call(c, name, id, timeout_ms, flags, ret));
}

GPUBUF_EXTERN int gpubuf_open_id(gpubuf_client *c, uint64_t id, int timeout_ms,
                                 gpubuf_buffer **ret) {
    gpubuf__clear_error();
    return gpubuf__result(open_call(c, NULL, id, timeout_ms, 0, ret));
}

GPUBUF_EXTERN int gpubuf_delete(gpubuf_client *c, const char *name) {
    gpubuf__clear_error();
    if (!name) {
        gpubuf__set_error("gpubuf_delete needs a name (gpubuf_delete_id deletes by id)");
        return -EINVAL;
    }
    return gpubuf__result(delete_with_call(c, name, 0, NULL));
}

GPUBUF_EXTERN int gpubuf_delete_id(gpubuf_client *c, uint64_t id) {
    gpubuf__clear_error();
    return gpubuf__result(delete_with_call(c, NULL, id, NULL));
}

GPUBUF_EXTERN int gpubuf_open_with(gpubuf_client *c, const char *name, uint64_t id,
                                   const gpubuf_lookup *o, gpubuf_buffer **ret) {
    gpubuf__clear_error();
    return gpubuf__result(open_with_call(c, name, id, o, ret));
}

GPUBUF_EXTERN int gpubuf_delete_with(gpubuf_client *c, const char *name, uint64_t id,
                                     const gpubuf_lookup *o) {
    gpubuf__clear_error();
    return gpubuf__result(delete_with_call(c, name, id, o));
}

GPUBUF_EXTERN int gpubuf_status_get(gpubuf_client *c, gpubuf_status **ret) {
    gpubuf__clear_error();
    return gpubuf__result(status_get_call(c, ret));
}

GPUBUF_EXTERN int gpubuf_release(gpubuf_buffer *b) {
    gpubuf__clear_error();
    return gpubuf__result(release_call(b));
}

GPUBUF_EXTERN int gpubuf_buffer_slice(gpubuf_buffer *b, uint64_t offset, uint64_t length,
                                      gpubuf_buffer **ret) {
    gpubuf__clear_error();
    return gpubuf__result(buffer_slice_call(b, offset, length, ret));
}

/* ---- steps shared with meta.c ------------------------------------------- */

int gpubuf__buffer_request(gpubuf_client *c, Gpubuf__Request *req, gpubuf_buffer **ret) {
    return buffer_request(c, req, ret);
}

void gpubuf__copy_info(gpubuf_buffer_info *o, const Gpubuf__Buffer *m) {
    copy_info(o, m);
}

int gpubuf__lookup_make(const char *what, const char *name, uint64_t id, const gpubuf_lookup *o,
                        unsigned allowed, lookup *l) {
    return lookup_make(what, name, id, o, allowed, l);
}

bool gpubuf__lookup_fill(lookup *l, char **name, uint64_t *id, char **pool,
                         Gpubuf__ExpectedOwner **owner) {
    return lookup_fill(l, name, id, pool, owner);
}
