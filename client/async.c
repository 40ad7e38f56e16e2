/* libgpubuf-client: requests for event loops. A _start call sends its
 * request and returns; its reply, read by whichever thread reads the stream
 * next (gpubuf_dispatch() or a synchronous call of another thread), becomes
 * a completion on the ready list, and gpubuf_dispatch() hands it to the
 * request's callback. gpubuf_client_fd() is an epoll fd over the socket and an
 * eventfd that says "completions are ready" (docs/client-api.md, "Event
 * loops"). */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "internal.h"

/* Frames one gpubuf_dispatch() reads at most before it delivers: the fd
 * stays readable for the rest (fairness to the other fds of the loop). */
#define DISPATCH_MAX_FRAMES 16384

#include "async_internal.h"
#include "util.h"

static void async_watch(gpubuf_client *c);
static const struct gpubuf__async_hooks async_hooks;

/* ---- the ready list and the eventfd (c->qlock) ---------------------------- */

static void kick(gpubuf_client *c) {
    if (c->efd >= 0 && !c->kicked) {
        uint64_t one = 1;
        ssize_t n = write(c->efd, &one, sizeof(one));
        (void)n; /* EAGAIN: the counter is far from zero already */
        c->kicked = true;
    }
}

/* op is answered (lock held): onto the ready list. */
static void op_ready(gpubuf_client *c, gpubuf_op *op) {
    pthread_mutex_lock(&c->qlock);
    LL_PREPEND(c->ready, op); /* newest first: dispatch reverses it */
    /* The first, unless gpubuf_dispatch() settles it: it takes the list
     * right after. */
    if (!op->next && !c->dispatching)
        kick(c);
    pthread_mutex_unlock(&c->qlock);
}

static void op_set_error(gpubuf_op *op, int r, const char *msg) {
    op->result = r;
    free(op->message);
    op->message = msg && *msg ? strdup(msg) : NULL;
}

/* Every request still unanswered ends with r (lock held): the connection
 * went. Each is on the ready list once. */
static void async_fail_all(gpubuf_client *c, int r) {
    gpubuf_op *op, *tmp;
    const char *msg = gpubuf_last_error_message();
    char why[256];
    snprintf(why, sizeof(why), "the connection to gpubufd was lost before the answer came%s%s",
             msg && *msg ? ": " : "", msg ? msg : "");
    HASH_ITER(hh, c->ops, op, tmp) {
        HASH_DEL(c->ops, op);
        if (op->kind == OP_PART) {
            c->many_hooks->part_fail(c, op, r, why); /* the batch completes with its last part */
            continue;
        }
        op_set_error(op, r, why);
        op_ready(c, op);
    }
}

void gpubuf__async_ready(gpubuf_client *c, gpubuf_op *op) {
    op_ready(c, op);
}

/* The stream holds bytes read ahead that nobody reads now (lock held): let
 * the loop's next gpubuf_dispatch() cut them. */
static void async_kick(gpubuf_client *c) {
    if (c->ops && c->rpos < c->rlen) {
        pthread_mutex_lock(&c->qlock);
        kick(c);
        pthread_mutex_unlock(&c->qlock);
    }
}

/* resp answers a started request? Then it is consumed (fds included) and
 * true returned (lock held). */
static bool async_reply(gpubuf_client *c, Gpubuf__Response *resp, int *fds, int n_fds) {
    gpubuf_op *op;
    uint64_t id = resp->id;
    int fd = -1;
    if (!c->ops)
        return false;
    HASH_FIND(hh, c->ops, &id, sizeof(id), op);
    if (!op)
        return false;
    HASH_DEL(c->ops, op);
    if (op->kind == OP_PART) {
        c->many_hooks->part_reply(c, op, resp, fds, n_fds);
        return true;
    }
    if (n_fds > 0)
        fd = fds[0];
    for (int i = 1; i < n_fds; i++)
        close(fds[i]);
    op->result = resp->status;
    if (resp->status < 0) {
        op_set_error(op, resp->status, resp->message);
    } else if (op->kind == OP_OPEN || op->kind == OP_ALLOC || op->kind == OP_STAT) {
        if (resp->body_case != GPUBUF__RESPONSE__BODY_BUFFER) {
            op_set_error(op, GPUBUF_EPROTOCOL, "gpubufd answered without a buffer");
        } else if (op->kind == OP_STAT) {
            gpubuf__copy_info(&op->info, resp->buffer);
        } else {
            int r = gpubuf__view_from_reply(c, resp->buffer, fd, &op->view);
            fd = -1; /* consumed */
            if (r < 0) {
                op_set_error(op, r, gpubuf_last_error_message());
            } else if (op->kind == OP_ALLOC) {
                op->view->allocated = true;
                op->view->sealable = true;
            }
        }
    }
    if (fd >= 0)
        close(fd);
    gpubuf__resp_free(c, resp);
    op_ready(c, op);
    return true;
}

/* ---- the fd ---------------------------------------------------------------- */

/* Make the epoll fd and the eventfd (lock held). */
static int async_init(gpubuf_client *c) {
    struct epoll_event ev = {.events = EPOLLIN};
    c->async_hooks = &async_hooks; /* from now on conn.c tells this layer */
    if (c->ep >= 0)
        return 0;
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0)
        return gpubuf__fail(-errno, "epoll_create1: %s", strerror(errno));
    int efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd < 0) {
        int r = -errno;
        close(ep);
        return gpubuf__fail(r, "eventfd: %s", strerror(-r));
    }
    ev.data.fd = efd;
    if (epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev) < 0) {
        int r = -errno;
        close(ep);
        close(efd);
        return gpubuf__fail(r, "epoll_ctl: %s", strerror(-r));
    }
    pthread_mutex_lock(&c->qlock);
    c->ep = ep;
    c->efd = efd;
    pthread_mutex_unlock(&c->qlock);
    async_watch(c);
    return 0;
}

int gpubuf__async_init(gpubuf_client *c) {
    return async_init(c);
}

/* The socket changed (connect, reconnect; lock held): watch the new one. */
static void async_watch(gpubuf_client *c) {
    struct epoll_event ev = {.events = EPOLLIN};
    if (c->ep < 0 || c->fd < 0)
        return;
    ev.data.fd = c->fd;
    if (epoll_ctl(c->ep, EPOLL_CTL_ADD, c->fd, &ev) < 0 && errno != EEXIST) {
        pthread_mutex_lock(&c->qlock);
        kick(c); /* not watched: the loop polls through the eventfd instead */
        pthread_mutex_unlock(&c->qlock);
    }
}

static void async_free(gpubuf_client *c) {
    if (c->ep >= 0)
        close(c->ep);
    if (c->efd >= 0)
        close(c->efd);
    c->ep = c->efd = -1;
}

GPUBUF_EXTERN int gpubuf_client_fd(gpubuf_client *c) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c, -EINVAL, "gpubuf_client_fd needs a connection");
    pthread_mutex_lock(&c->lock);
    int r = async_init(c);
    if (r == 0)
        r = c->ep;
    pthread_mutex_unlock(&c->lock);
    return gpubuf__result(r);
}

/* ---- dispatch -------------------------------------------------------------- */

/* Read what the socket holds without blocking and settle it (lock held). */
static void read_available(gpubuf_client *c) {
    c->rshort = false;
    for (int n = 0; n < DISPATCH_MAX_FRAMES && !c->broken; n++) {
        Gpubuf__Response *resp;
        int fds[GPUBUF_WIRE_MAX_FDS], n_fds;
        int r = gpubuf__read_reply_nb(c, &resp, fds, &n_fds);
        if (r == -EAGAIN)
            return;
        if (r < 0)
            return; /* broken: the requests were failed */
        gpubuf__settle_reply(c, resp, fds, n_fds);
    }
    pthread_mutex_lock(&c->qlock);
    kick(c); /* more may wait: the next call reads on */
    pthread_mutex_unlock(&c->qlock);
}

static void deliver(gpubuf_client *c, gpubuf_op *op) {
    gpubuf_completion done = {.handle = op->id, .user = op->user};
    if (op->kind == OP_MANY) {
        c->many_hooks->complete(c, op, &done); /* its result, message and arrays */
        gpubuf__clear_error();
        if (done.result != 0)
            gpubuf__set_error("%s", op->message ? op->message : gpubuf_strerror(done.result));
        done.message = gpubuf_last_error_message();
        op->cb(c, &done);
        c->many_hooks->free(op);
        free(op->message);
        free(op);
        return;
    }
    if (op->cancelled) {
        gpubuf_release(op->view); /* what it took goes back */
        op->view = NULL;
        op_set_error(op, -ECANCELED, "the request was cancelled");
    }
    done.result = op->result;
    done.view = op->result == 0 ? op->view : NULL;
    done.info = op->info;
    gpubuf__clear_error();
    if (op->result < 0) {
        gpubuf__set_error("%s", op->message ? op->message : gpubuf_strerror(op->result));
        done.message = gpubuf_last_error_message();
    } else {
        done.message = "";
    }
    if (op->cb)
        op->cb(c, &done);
    else
        gpubuf_release(done.view);
    free(op->message);
    free(op);
}

static int dispatch_call(gpubuf_client *c) {
    gpubuf_op *list, *op, *tmp;
    int n = 0;
    /* Another thread holding the lock reads the stream itself (a synchronous
     * call): its completions come through the ready list. */
    if (pthread_mutex_trylock(&c->lock) == 0) {
        if (!c->broken && c->fd >= 0) {
            c->dispatching = true;
            read_available(c);
            c->dispatching = false;
        }
        pthread_mutex_unlock(&c->lock);
    }
    pthread_mutex_lock(&c->qlock);
    list = c->ready;
    c->ready = NULL;
    if (c->efd >= 0 && c->kicked) {
        uint64_t v;
        ssize_t k = read(c->efd, &v, sizeof(v));
        (void)k;
        c->kicked = false;
    }
    pthread_mutex_unlock(&c->qlock);
    gpubuf_op *rev = NULL; /* in the order the replies came */
    LL_FOREACH_SAFE(list, op, tmp) {
        op->next = rev;
        rev = op;
    }
    LL_FOREACH_SAFE(rev, op, tmp) {
        deliver(c, op);
        n++;
    }
    return n;
}

GPUBUF_EXTERN int gpubuf_dispatch(gpubuf_client *c) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c, -EINVAL, "gpubuf_dispatch needs a connection");
    int r = dispatch_call(c);
    if (r >= 0) {
        gpubuf__clear_error();
        return r;
    }
    return gpubuf__result(r);
}

/* Complete every started request with GPUBUF_EDISCONNECTED and deliver them
 * (gpubuf_disconnect(), lock not held). */
static void async_close(gpubuf_client *c) {
    pthread_mutex_lock(&c->lock);
    bool any = c->ops != NULL;
    if (any)
        async_fail_all(c, GPUBUF_EDISCONNECTED);
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_lock(&c->qlock);
    any = any || c->ready != NULL;
    pthread_mutex_unlock(&c->qlock);
    if (any)
        dispatch_call(c);
}

/* What the connection layer and gpubuf_disconnect() call (c->async_hooks). */
static const struct gpubuf__async_hooks async_hooks = {
    .reply = async_reply,
    .fail_all = async_fail_all,
    .kick = async_kick,
    .watch = async_watch,
    .close = async_close,
    .free = async_free,
};

/* ---- starting and cancelling ----------------------------------------------- */

/* Send req for a new op (lock held by the caller; released here). */
static int start(gpubuf_client *c, Gpubuf__Request *req, enum op_kind kind, bool waits,
                 gpubuf_done_fn cb, void *user, uint64_t *ret) {
    gpubuf_op *op = calloc(1, sizeof(*op));
    int r = op ? async_init(c) : -ENOMEM;
    if (r == 0)
        r = gpubuf__send_op_locked(c, req);
    if (r < 0) {
        free(op);
        return r;
    }
    op->id = req->id;
    op->kind = kind;
    op->waits = waits;
    op->cb = cb;
    op->user = user;
    HASH_ADD(hh, c->ops, id, sizeof(op->id), op);
    GPUBUF_HASH_KEEP_LOAD(hh, c->ops);
    *ret = op->id;
    return 0;
}

int gpubuf__async_part(gpubuf_client *c, Gpubuf__Request *req, gpubuf_many *m, bool waits,
                       size_t *items, size_t n) {
    uint64_t id;
    int r = start(c, req, OP_PART, waits, NULL, NULL, &id);
    if (r < 0) {
        free(items);
        return r;
    }
    gpubuf_op *op;
    HASH_FIND(hh, c->ops, &id, sizeof(id), op);
    op->many = m;
    op->items = items;
    op->n_items = n;
    return 0;
}

static int locked_start(gpubuf_client *c, Gpubuf__Request *req, enum op_kind kind, bool waits,
                        gpubuf_done_fn cb, void *user, uint64_t *ret) {
    pthread_mutex_lock(&c->lock);
    int r = start(c, req, kind, waits, cb, user, ret);
    pthread_mutex_unlock(&c->lock);
    return r;
}

static int open_start(gpubuf_client *c, const char *name, uint64_t id, const gpubuf_lookup *o,
                      gpubuf_done_fn cb, void *user, uint64_t *ret) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__OpenRequest q = GPUBUF__OPEN_REQUEST__INIT;
    lookup l;
    int r = gpubuf__open_fill(&q, &l, name, id, o);
    if (r < 0)
        return r;
    req.body_case = GPUBUF__REQUEST__BODY_OPEN;
    req.open = &q;
    return locked_start(c, &req, OP_OPEN, q.timeout_ms != 0, cb, user, ret);
}

static int alloc_start(gpubuf_client *c, const char *pool, uint64_t size, const char *name,
                       gpubuf_done_fn cb, void *user, uint64_t *ret) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    lookup l;
    int r = gpubuf__alloc_fill(&a, pool, size, name, &l);
    if (r < 0)
        return r;
    req.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    req.alloc = &a;
    return locked_start(c, &req, OP_ALLOC, false, cb, user, ret);
}

static int seal_start(gpubuf_buffer *b, gpubuf_done_fn cb, void *user, uint64_t *ret) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__SealRequest s = GPUBUF__SEAL_REQUEST__INIT;
    gpubuf_client *c = b->c;
    pthread_mutex_lock(&c->lock);
    int r = gpubuf__seal_check(&b);
    if (r == 0) {
        s.buffer_id = b->id;
        req.body_case = GPUBUF__REQUEST__BODY_SEAL;
        req.seal = &s;
        r = start(c, &req, OP_SEAL, false, cb, user, ret);
        if (r == 0)
            b->sealable = false;
    }
    pthread_mutex_unlock(&c->lock);
    return r;
}

static int target_start(gpubuf_client *c, const char *what, const char *name, uint64_t id,
                        const gpubuf_lookup *o, enum op_kind kind, gpubuf_done_fn cb, void *user,
                        uint64_t *ret) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__DeleteRequest d = GPUBUF__DELETE_REQUEST__INIT;
    Gpubuf__StatRequest q = GPUBUF__STAT_REQUEST__INIT;
    lookup l;
    int r = gpubuf__lookup_make(what, name, id, o, GPUBUF_OPEN_OWNER, &l);
    if (r < 0)
        return r;
    if (kind == OP_DELETE) {
        d.target_case = gpubuf__lookup_fill(&l, &d.name, &d.buffer_id, &d.pool, &d.owner)
                            ? GPUBUF__DELETE_REQUEST__TARGET_NAME
                            : GPUBUF__DELETE_REQUEST__TARGET_BUFFER_ID;
        req.body_case = GPUBUF__REQUEST__BODY_DELETE;
        req.delete_ = &d;
    } else {
        q.target_case = gpubuf__lookup_fill(&l, &q.name, &q.buffer_id, &q.pool, &q.owner)
                            ? GPUBUF__STAT_REQUEST__TARGET_NAME
                            : GPUBUF__STAT_REQUEST__TARGET_BUFFER_ID;
        req.body_case = GPUBUF__REQUEST__BODY_STAT;
        req.stat = &q;
    }
    return locked_start(c, &req, kind, false, cb, user, ret);
}

void gpubuf__async_send_cancel(gpubuf_client *c, uint64_t id) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__CancelRequest q = GPUBUF__CANCEL_REQUEST__INIT;
    if (c->broken)
        return; /* a lost connection completes the open anyway */
    /* The daemon answers the open ECANCELED (or has answered it). */
    q.request_id = id;
    req.body_case = GPUBUF__REQUEST__BODY_CANCEL;
    req.cancel = &q;
    int s = gpubuf__send_async_locked(c, &req);
    (void)s;
}

static int cancel_call(gpubuf_client *c, uint64_t handle) {
    gpubuf_op *op;
    int r = 0;
    pthread_mutex_lock(&c->lock);
    HASH_FIND(hh, c->ops, &handle, sizeof(handle), op);
    if (op) {
        if (op->kind == OP_PART) {
            op = NULL; /* a batch's part is no handle of the caller's */
        } else {
            if (!op->cancelled && op->waits)
                gpubuf__async_send_cancel(c, handle);
            op->cancelled = true;
        }
    }
    if (!op && c->many_hooks && (r = c->many_hooks->cancel(c, handle)) == 0) {
        pthread_mutex_unlock(&c->lock);
        return 0;
    }
    if (!op) {
        r = 0;
        pthread_mutex_lock(&c->qlock);
        LL_FOREACH(c->ready, op) {
            if (op->id == handle)
                break;
        }
        if (op)
            op->cancelled = true;
        pthread_mutex_unlock(&c->qlock);
        if (!op)
            r = gpubuf__fail(-ENOENT,
                             "request %llu is not pending on this connection: it was delivered "
                             "already, or never started",
                             (unsigned long long)handle);
    }
    pthread_mutex_unlock(&c->lock);
    return r;
}

/* ---- public entry points ---------------------------------------------------- */

#define CHECK_START(c, cb, ret, what)                                                              \
    GPUBUF_CHECK((c) && (ret), -EINVAL, what " needs a connection and a place for the handle");   \
    GPUBUF_CHECK(cb, -EINVAL, what " needs a callback (gpubuf_done_fn)")

GPUBUF_EXTERN int gpubuf_open_start(gpubuf_client *c, const char *name, uint64_t id,
                                    const gpubuf_lookup *o, gpubuf_done_fn cb, void *user,
                                    uint64_t *ret) {
    gpubuf__clear_error();
    CHECK_START(c, cb, ret, "gpubuf_open_start");
    int r = open_start(c, name, id, o, cb, user, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_alloc_start(gpubuf_client *c, const char *pool, uint64_t size,
                                     const char *name, gpubuf_done_fn cb, void *user,
                                     uint64_t *ret) {
    gpubuf__clear_error();
    CHECK_START(c, cb, ret, "gpubuf_alloc_start");
    GPUBUF_CHECK(size > 0, -EINVAL, "size 0: a buffer holds at least 1 byte");
    int r = alloc_start(c, pool, size, name, cb, user, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_seal_start(gpubuf_buffer *b, gpubuf_done_fn cb, void *user,
                                    uint64_t *ret) {
    gpubuf__clear_error();
    CHECK_START(b, cb, ret, "gpubuf_seal_start");
    int r = seal_start(b, cb, user, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_delete_start(gpubuf_client *c, const char *name, uint64_t id,
                                      const gpubuf_lookup *o, gpubuf_done_fn cb, void *user,
                                      uint64_t *ret) {
    gpubuf__clear_error();
    CHECK_START(c, cb, ret, "gpubuf_delete_start");
    int r = target_start(c, "delete", name, id, o, OP_DELETE, cb, user, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_stat_start(gpubuf_client *c, const char *name, uint64_t id,
                                    const gpubuf_lookup *o, gpubuf_done_fn cb, void *user,
                                    uint64_t *ret) {
    gpubuf__clear_error();
    CHECK_START(c, cb, ret, "gpubuf_stat_start");
    int r = target_start(c, "stat", name, id, o, OP_STAT, cb, user, ret);
    return gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_cancel(gpubuf_client *c, uint64_t handle) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c, -EINVAL, "gpubuf_cancel needs a connection");
    int r = cancel_call(c, handle);
    return gpubuf__result(r);
}
