/* libgpubuf-client: gpubuf_open_many_start(), the batch open for event loops.
 * The items go in batch open requests (as gpubuf_open_many() sends them, at
 * most the daemon's items and bytes per request); an item whose slab did
 * not fit in a reply is asked again once the slabs that did are mapped; an
 * item not sealed yet (ENOENT), when the call waits, becomes a waiting open
 * of its own with the time left. Each request is a part (OP_PART) of the
 * batch; the batch's completion is delivered once its last part is
 * answered (docs/client-api.md, "Event loops"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "async_internal.h"
#include "util.h"

/* Request bytes kept free for the fixed fields of a batch request. */
#define MANY_OVERHEAD 256u

struct gpubuf_many {
    gpubuf_op *op;          /* the batch's own op: handle, callback, user, cancelled */
    size_t n;
    char **names;           /* copies, or NULL (by id) */
    uint64_t *ids;          /* copies, or NULL (by name) */
    gpubuf_buffer **views;  /* views[i]: item i's view until delivered */
    int *status;            /* 0 or item i's error */
    bool read_only;
    int timeout_ms;         /* as gpubuf_open_with(): 0 no waiting, < 0 forever */
    uint64_t deadline_ms;   /* monotonic, when timeout_ms > 0 */
    uint32_t parts;         /* requests sent and not yet answered */
    gpubuf_many *next, *prev; /* c->manys (utlist DL) */
};

static uint64_t mono_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void many_fail(gpubuf_many *m, size_t i, int r) {
    if (m->status[i] == 0 && !m->views[i])
        m->status[i] = r;
}

/* Every part is answered (lock held): the batch's completion is ready. */
static void part_done(gpubuf_client *c, gpubuf_many *m) {
    if (--m->parts > 0)
        return;
    DL_DELETE(c->manys, m);
    gpubuf__async_ready(c, m->op);
}

/* How many of items[0..n) fit one batch request from the start (at least 1). */
static size_t chunk_len(const gpubuf_client *c, const gpubuf_many *m, const size_t *items,
                        size_t n) {
    size_t k = 0, bytes = MANY_OVERHEAD;
    while (k < n && k < c->max_batch_items) {
        size_t b = (m->names ? strlen(m->names[items[k]]) + 3 : 0) + 12;
        if (k > 0 && bytes + b > c->max_request)
            break;
        bytes += b;
        k++;
    }
    return k ? k : 1;
}

/* Send items[0..n) in batch requests (lock held). Those that cannot be sent
 * fail with the error. items stays the caller's. */
static void send_batches(gpubuf_client *c, gpubuf_many *m, const size_t *items, size_t n) {
    for (size_t from = 0, k; from < n; from += k) {
        k = chunk_len(c, m, items + from, n - from);
        Gpubuf__Request req = GPUBUF__REQUEST__INIT;
        Gpubuf__BatchOpenRequest q = GPUBUF__BATCH_OPEN_REQUEST__INIT;
        size_t *mine = malloc(k * sizeof(*mine));
        char **names = m->names ? malloc(k * sizeof(*names)) : NULL;
        uint64_t *ids = m->ids ? malloc(k * sizeof(*ids)) : NULL;
        int r = mine && (names || ids) ? 0 : -ENOMEM;
        for (size_t j = 0; r == 0 && j < k; j++) {
            mine[j] = items[from + j];
            if (names)
                names[j] = m->names[mine[j]];
            else
                ids[j] = m->ids[mine[j]];
        }
        if (names) {
            q.n_names = k;
            q.names = names;
        } else {
            q.n_buffer_ids = k;
            q.buffer_ids = ids;
        }
        /* No list of mapped slabs: a slab this connection unmaps before the
         * reply comes would be missing from it. Each slab comes described. */
        q.read_only = m->read_only;
        req.body_case = GPUBUF__REQUEST__BODY_BATCH_OPEN;
        req.batch_open = &q;
        if (r == 0) {
            r = gpubuf__async_part(c, &req, m, false, mine, k); /* mine is the part's */
            mine = NULL;
        }
        if (r == 0)
            m->parts++;
        for (size_t j = 0; r < 0 && j < k; j++)
            many_fail(m, items[from + j], r);
        free(mine);
        free(names);
        free(ids);
    }
}

/* Item i was not sealed yet: a waiting open of its own, with the time left
 * (lock held). */
static void send_wait(gpubuf_client *c, gpubuf_many *m, size_t i) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__OpenRequest q = GPUBUF__OPEN_REQUEST__INIT;
    int timeout = m->timeout_ms;
    if (timeout > 0) {
        uint64_t now = mono_ms();
        if (now >= m->deadline_ms) {
            m->status[i] = -ETIMEDOUT;
            return;
        }
        timeout = (int)(m->deadline_ms - now);
    }
    char pool[GPUBUF_NAME_MAX + 1] = "";
    const char *plain = NULL;
    if (m->names) {
        char msg[8];
        if (gpubuf_name_split(m->names[i], pool, &plain, msg, sizeof(msg)) < 0) {
            m->status[i] = -EINVAL; /* checked at the start already */
            return;
        }
        q.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
        q.name = (char *)plain;
        q.pool = pool;
    } else {
        q.target_case = GPUBUF__OPEN_REQUEST__TARGET_BUFFER_ID;
        q.buffer_id = m->ids[i];
    }
    q.timeout_ms = timeout;
    q.read_only = m->read_only;
    req.body_case = GPUBUF__REQUEST__BODY_OPEN;
    req.open = &q;
    size_t *mine = malloc(sizeof(*mine));
    int r = mine ? 0 : -ENOMEM;
    if (mine) {
        *mine = i;
        r = gpubuf__async_part(c, &req, m, true, mine, 1);
    }
    if (r < 0) {
        m->status[i] = r;
        return;
    }
    m->status[i] = 0;
    m->parts++;
}

static void batch_reply(gpubuf_client *c, gpubuf_op *op, Gpubuf__Response *resp, int *fds,
                        int n_fds) {
    gpubuf_many *m = op->many;
    const Gpubuf__BatchReply *br = resp->batch;
    size_t n = op->n_items, n_retry = 0;
    size_t *retry = malloc((n + 1) * sizeof(*retry));
    int r = resp->status;
    if (r == 0 && (resp->body_case != GPUBUF__RESPONSE__BODY_BATCH || br->n_status != n))
        r = GPUBUF_EPROTOCOL;
    else if (r == 0 && !retry)
        r = -ENOMEM;
    if (r == 0) {
        r = gpubuf__batch_views(c, br, fds, n_fds, op->items, n, m->n, m->read_only, m->views,
                                m->status, retry, &n_retry);
        n_fds = 0; /* consumed */
    }
    for (int i = 0; i < n_fds; i++)
        close(fds[i]);
    for (size_t k = 0; k < n; k++)
        if (r < 0)
            many_fail(m, op->items[k], r);
    if (r == 0 && n_retry > 0 && br->n_slabs == 0) {
        for (size_t k = 0; k < n_retry; k++)
            m->status[retry[k]] = -EAGAIN; /* no progress: say so rather than loop */
        n_retry = 0;
    }
    if (r == 0 && !m->op->cancelled) {
        send_batches(c, m, retry, n_retry);
        for (size_t k = 0; m->timeout_ms != 0 && k < n; k++)
            if (m->status[op->items[k]] == -ENOENT)
                send_wait(c, m, op->items[k]);
    } else {
        for (size_t k = 0; r == 0 && k < n_retry; k++)
            m->status[retry[k]] = -ECANCELED;
    }
    free(retry);
}

static void many_part_reply(gpubuf_client *c, gpubuf_op *op, Gpubuf__Response *resp, int *fds,
                             int n_fds) {
    gpubuf_many *m = op->many;
    if (!op->waits) {
        batch_reply(c, op, resp, fds, n_fds);
    } else {
        size_t i = op->items[0];
        int fd = n_fds > 0 ? fds[0] : -1;
        for (int k = 1; k < n_fds; k++)
            close(fds[k]);
        if (resp->status < 0) {
            m->status[i] = resp->status;
        } else if (resp->body_case != GPUBUF__RESPONSE__BODY_BUFFER) {
            m->status[i] = GPUBUF_EPROTOCOL;
        } else {
            m->status[i] = gpubuf__view_from_reply(c, resp->buffer, fd, &m->views[i]);
            fd = -1; /* consumed */
            if (m->status[i] > 0)
                m->status[i] = 0;
        }
        if (fd >= 0)
            close(fd);
    }
    gpubuf__resp_free(c, resp);
    free(op->items);
    free(op->message);
    free(op);
    part_done(c, m);
}

static void many_part_fail(gpubuf_client *c, gpubuf_op *op, int r, const char *why) {
    gpubuf_many *m = op->many;
    (void)why;
    for (size_t k = 0; k < op->n_items; k++)
        many_fail(m, op->items[k], r);
    free(op->items);
    free(op->message);
    free(op);
    part_done(c, m);
}

static int many_cancel(gpubuf_client *c, uint64_t handle) {
    gpubuf_many *m;
    gpubuf_op *op, *tmp;
    DL_FOREACH(c->manys, m) {
        if (m->op->id == handle)
            break;
    }
    if (!m)
        return -ENOENT;
    if (m->op->cancelled)
        return 0;
    m->op->cancelled = true;
    /* The ids first: sending may read replies (which end parts) or meet the
     * connection's end (which ends them all), changing c->ops. */
    size_t n = 0, k = 0;
    HASH_ITER(hh, c->ops, op, tmp) {
        n += op->many == m && op->waits;
    }
    uint64_t *ids = malloc((n + 1) * sizeof(*ids));
    if (!ids)
        return 0; /* the waits run to their end; the batch is delivered cancelled */
    HASH_ITER(hh, c->ops, op, tmp) {
        if (op->many == m && op->waits)
            ids[k++] = op->id;
    }
    for (k = 0; k < n && !c->broken; k++) {
        HASH_FIND(hh, c->ops, &ids[k], sizeof(ids[k]), op);
        if (op)
            gpubuf__async_send_cancel(c, ids[k]);
    }
    free(ids);
    return 0;
}

static void many_complete(gpubuf_client *c, gpubuf_op *op, gpubuf_completion *done) {
    gpubuf_many *m = op->many;
    size_t failed = 0, first = 0;
    (void)c;
    if (op->cancelled) {
        gpubuf_release_many(m->views, m->n, NULL); /* what it took goes back */
        for (size_t i = 0; i < m->n; i++) {
            m->views[i] = NULL;
            m->status[i] = -ECANCELED;
        }
    }
    for (size_t i = m->n; i-- > 0;) {
        if (m->status[i] < 0) {
            failed++;
            first = i;
        }
    }
    free(op->message);
    op->message = NULL;
    done->result = op->cancelled ? -ECANCELED : (int)failed;
    if (op->cancelled) {
        op->message = strdup("the request was cancelled");
    } else if (failed) {
        char msg[384];
        snprintf(msg, sizeof(msg), "%zu of %zu items failed; the first: item %zu: %s", failed,
                 m->n, first, gpubuf_strerror(m->status[first]));
        op->message = strdup(msg);
    }
    done->n = m->n;
    done->views = m->views;
    done->statuses = m->status;
}

static void many_free(gpubuf_op *op) {
    gpubuf_many *m = op->many;
    if (!m)
        return;
    if (m->names)
        for (size_t i = 0; i < m->n; i++)
            free(m->names[i]);
    free(m->names);
    free(m->ids);
    free(m->views);
    free(m->status);
    free(m);
    op->many = NULL;
}

/* ---- the call ----------------------------------------------------------------- */

/* The batch and its op, items copied and checked; NULL: out of memory. */
/* What async.c calls for a batch and its parts (c->many_hooks). */
static const struct gpubuf__many_hooks many_hooks = {
    .part_reply = many_part_reply,
    .part_fail = many_part_fail,
    .complete = many_complete,
    .free = many_free,
    .cancel = many_cancel,
};

static gpubuf_many *many_new(size_t n, const char *const *names, const uint64_t *ids,
                             const gpubuf_lookup *o, gpubuf_done_fn cb, void *user) {
    gpubuf_many *m = calloc(1, sizeof(*m));
    gpubuf_op *op = calloc(1, sizeof(*op));
    if (!m || !op) {
        free(m);
        free(op);
        return NULL;
    }
    m->op = op;
    op->many = m;
    op->kind = OP_MANY;
    op->cb = cb;
    op->user = user;
    m->n = n;
    m->read_only = o && (o->flags & GPUBUF_OPEN_READONLY);
    m->timeout_ms = o ? o->timeout_ms : 0;
    if (m->timeout_ms > 0)
        m->deadline_ms = mono_ms() + (uint64_t)m->timeout_ms;
    m->views = calloc(n + 1, sizeof(*m->views));
    m->status = calloc(n + 1, sizeof(*m->status));
    if (names)
        m->names = calloc(n + 1, sizeof(*m->names));
    else
        m->ids = malloc((n + 1) * sizeof(*m->ids));
    bool ok = m->views && m->status && (m->names || m->ids);
    for (size_t i = 0; ok && i < n; i++) {
        char msg[256], pool[GPUBUF_NAME_MAX + 1];
        const char *plain;
        if (!names) {
            m->ids[i] = ids[i];
        } else if (!names[i] || gpubuf_name_split(names[i], pool, &plain, msg, sizeof(msg)) < 0 ||
                   gpubuf_name_check(plain, strlen(plain), msg, sizeof(msg)) < 0) {
            m->status[i] = -EINVAL; /* checked as a single open checks a name */
            ok = (m->names[i] = strdup("")) != NULL;
        } else {
            ok = (m->names[i] = strdup(names[i])) != NULL;
        }
    }
    if (!ok) {
        many_free(op);
        free(op);
        return NULL;
    }
    return m;
}

static int open_many_start(gpubuf_client *c, size_t n, const char *const *names,
                           const uint64_t *ids, const gpubuf_lookup *o, gpubuf_done_fn cb,
                           void *user, uint64_t *ret) {
    gpubuf_many *m = many_new(n, names, ids, o, cb, user);
    size_t *items = malloc((n + 1) * sizeof(*items));
    size_t n_items = 0;
    if (!m || !items) {
        if (m) {
            gpubuf_op *op = m->op;
            many_free(op);
            free(op);
        }
        free(items);
        return -ENOMEM;
    }
    for (size_t i = 0; i < n; i++)
        if (m->status[i] == 0)
            items[n_items++] = i;
    pthread_mutex_lock(&c->lock);
    c->many_hooks = &many_hooks; /* from now on async.c hands a batch's requests here */
    int r = gpubuf__async_init(c);
    if (r == 0 && c->broken && c->reconnect_ms <= 0)
        r = gpubuf__fail(GPUBUF_EDISCONNECTED, "the connection to gpubufd is closed");
    if (r < 0) {
        pthread_mutex_unlock(&c->lock);
        many_free(m->op);
        free(m->op);
        free(items);
        return r;
    }
    m->op->id = ++c->next_id; /* the handle: an id no request of this connection has */
    DL_APPEND(c->manys, m);
    m->parts = 1; /* held while the first requests go */
    if (c->max_batch_items == 0) {
        /* An older daemon takes no batches: a single open per item. */
        for (size_t k = 0; k < n_items; k++)
            send_wait(c, m, items[k]);
    } else {
        send_batches(c, m, items, n_items);
    }
    *ret = m->op->id;
    part_done(c, m); /* the batch is complete already if nothing went */
    pthread_mutex_unlock(&c->lock);
    free(items);
    return 0;
}

GPUBUF_EXTERN int gpubuf_open_many_start(gpubuf_client *c, size_t n, const char *const *names,
                                         const uint64_t *ids, const gpubuf_lookup *o,
                                         gpubuf_done_fn cb, void *user, uint64_t *ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && ret, -EINVAL,
                 "gpubuf_open_many_start needs a connection and a place for the handle");
    GPUBUF_CHECK(cb, -EINVAL, "gpubuf_open_many_start needs a callback (gpubuf_done_fn)");
    GPUBUF_CHECK(n == 0 || names || ids, -EINVAL,
                 "gpubuf_open_many_start needs names or ids for its items");
    GPUBUF_CHECK(!o || !o->pool, -EINVAL,
                 "gpubuf_open_many_start: items name their pool (\"/POOL/NAME\"); o->pool must "
                 "be NULL");
    GPUBUF_CHECK(!o || !(o->flags & ~(unsigned)GPUBUF_OPEN_READONLY), -EINVAL,
                 "gpubuf_open_many_start takes the flag GPUBUF_OPEN_READONLY only");
    int r = open_many_start(c, n, names, ids, o, cb, user, ret);
    return gpubuf__result(r);
}
