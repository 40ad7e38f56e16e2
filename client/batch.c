/* libgpubuf-client: batches that make views (gpubuf_open_many, _with,
 * gpubuf_alloc_many). Many items per request and one reply with a result
 * per item (docs/protocol.md, "Batches"); items whose slab did not fit in a
 * reply (EAGAIN) are sent again once the slabs that did are mapped. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "trace.h"
#include "util.h"

/* The slabs this connection maps in mode read_only, for the daemon to leave
 * out of a reply (none if the list would take more than a quarter of a
 * request: then every slab comes again, which is correct, only slower). */
static uint64_t *mapped_slabs(gpubuf_client *c, bool read_only, size_t *ret_n) {
    gpubuf_mapping *m, *tmp;
    uint64_t *ids;
    size_t n = 0;
    *ret_n = 0;
    if (c->n_maps == 0 || (size_t)c->n_maps * 11 > c->max_request / 4)
        return NULL;
    if (!(ids = malloc(c->n_maps * sizeof(*ids))))
        return NULL;
    HASH_ITER(hh, c->maps, m, tmp) {
        if (m->read_only == read_only)
            ids[n++] = m->slab_id;
    }
    *ret_n = n;
    return ids;
}

/* Views for the items of an open or alloc reply: item k of the reply is
 * item idx[k] of the call. New slabs are mapped with their fds (which are
 * consumed). An item whose view cannot be made gives its reference back.
 * *ret_retry receives the items that failed with EAGAIN, to send again. */
static int make_views(gpubuf_batch_call *bc, const Gpubuf__BatchReply *br, const int *fds,
                      int n_fds, const size_t *idx, size_t n, bool read_only, bool ahead,
                      gpubuf_buffer **ret, size_t *retry, size_t *ret_n_retry) {
    gpubuf_client *c = bc->c;
    int slab_fd[GPUBUF_WIRE_MAX_FDS];
    size_t used = 0, names_pos = 0, ev = 0, n_retry = 0;
    int f = 0, r = 0;
    bool columns = br->n_buffer_id == n && br->n_size == n && br->n_offset == n &&
                   br->n_slab_id == n && br->n_slabs <= GPUBUF_WIRE_MAX_FDS &&
                   br->events.len == br->n_event_items * 64;
    /* The items' metadata (open batches; daemons before it send none): one
     * entry per item, or (sparse_meta) one per item of meta_items, ascending;
     * the other items have none. */
    size_t n_meta = br->n_meta_items ? br->n_meta_items : n, mi = 0;
    bool meta = br->n_layouts == n_meta && br->n_user_data == n_meta;
    columns =
        columns && (meta || (br->n_layouts == 0 && br->n_user_data == 0 && br->n_meta_items == 0));
    for (size_t j = 0; columns && j < br->n_meta_items; j++)
        columns = br->meta_items[j] < n && (j == 0 || br->meta_items[j] > br->meta_items[j - 1]);
    /* Host and cuda-vmm slabs carry an fd, in the order of slabs. */
    for (size_t s = 0; columns && s < br->n_slabs; s++) {
        int kind = br->slabs[s]->kind;
        slab_fd[s] = -1;
        if (kind == GPUBUF_POOL_HOST || kind == GPUBUF_POOL_CUDA_VMM) {
            if (f >= n_fds)
                columns = false;
            else
                slab_fd[s] = fds[f++];
        }
    }
    if (!columns || f != n_fds) {
        for (int i = 0; i < n_fds; i++)
            close(fds[i]);
        c->broken = true;
        return gpubuf__fail(GPUBUF_EPROTOCOL, "gpubufd sent a malformed batch reply");
    }
    for (size_t k = 0; k < n; k++) {
        size_t i = idx[k];
        const char *name = (const char *)br->names.data + names_pos;
        size_t left = br->names.len - names_pos;
        size_t len = left ? strnlen(name, left) : 0;
        if (len < left)
            names_pos += len + 1;
        else
            name = "";
        const uint8_t *event = NULL;
        if (ev < br->n_event_items && br->event_items[ev] == k)
            event = br->events.data + 64 * ev++;
        size_t e = k; /* item k's metadata entry; SIZE_MAX: none */
        if (br->n_meta_items)
            e = mi < br->n_meta_items && br->meta_items[mi] == k ? mi++ : SIZE_MAX;
        if (br->status[k] < 0) {
            if (br->status[k] == -EAGAIN && br->n_slabs > 0)
                retry[n_retry++] = i; /* once the slabs that came are mapped */
            else if (br->status[k] == -EAGAIN) /* no progress: say so rather than loop */
                gpubuf__batch_fail(bc, i, -EAGAIN, "gpubufd had no room for this item's slab");
            else
                gpubuf__batch_fail(bc, i, br->status[k], gpubuf__batch_message(br, k));
            continue;
        }
        bool stale = false; /* its slab was unmapped after the request listed it */
        uint64_t key = br->slab_id[k] * 2 + (read_only ? 1 : 0);
        gpubuf_mapping *m = NULL;
        /* The layout and user bytes first, as a single open's: a malformed
         * one maps nothing. */
        gpubuf_buffer vm = {0};
        if (meta && e != SIZE_MAX && (br->layouts[e]->dtype_bits || br->user_data[e].len)) {
            Gpubuf__Buffer mb = GPUBUF__BUFFER__INIT;
            mb.size = br->size[k];
            mb.layout = br->layouts[e]->dtype_bits ? br->layouts[e] : NULL;
            mb.user_data = br->user_data[e];
            r = gpubuf__view_meta(&vm, &mb);
        }
        if (r == 0)
            HASH_FIND(hh, c->maps, &key, sizeof(key), m);
        if (r < 0) {
            /* the item fails below */
        } else if (m) {
            gpubuf__mapping_hold(c, m);
        } else {
            size_t s = 0;
            while (s < br->n_slabs && br->slabs[s]->slab_id != br->slab_id[k])
                s++;
            if (s == br->n_slabs && ahead) {
                /* Sent ahead, the request listed the slabs mapped before
                 * the reply before it was worked on; a failed item of that
                 * reply may have unmapped this one since. Sent again. */
                stale = true;
                r = -EAGAIN;
            } else if (s == br->n_slabs) {
                r = gpubuf__fail(GPUBUF_EPROTOCOL,
                                 "gpubufd did not describe slab %llu, which this connection "
                                 "does not map",
                                 (unsigned long long)br->slab_id[k]);
            } else {
                r = gpubuf__mapping_get(c, br->slabs[s], slab_fd[s], &m);
                slab_fd[s] = -1; /* consumed */
                used++;
            }
        }
        if (r == 0 && (br->offset[k] > m->size || br->size[k] > m->size - br->offset[k])) {
            gpubuf__mapping_put(c, m);
            r = gpubuf__fail(GPUBUF_EPROTOCOL, "gpubufd described a buffer outside its slab");
        }
        if (r == 0) {
            r = gpubuf__view_new(c, m, br->buffer_id[k], br->offset[k], br->size[k], name,
                                 read_only, event, &ret[i]);
            if (r < 0)
                gpubuf__mapping_put(c, m);
        }
        if (r == 0) {
            ret[i]->layout = vm.layout;
            ret[i]->user = vm.user;
            ret[i]->user_len = vm.user_len;
        } else {
            gpubuf__view_meta_free(&vm);
        }
        if (r < 0) {
            /* Not usable here: the reference the daemon took goes back. */
            if (!c->broken)
                gpubuf__send_release(c, br->buffer_id[k], false, read_only);
            if (stale)
                retry[n_retry++] = i;
            else
                gpubuf__batch_fail(bc, i, r, gpubuf_last_error_message());
            r = 0;
        }
    }
    for (size_t s = 0; s < br->n_slabs; s++)
        if (slab_fd[s] >= 0)
            close(slab_fd[s]);
    *ret_n_retry = n_retry;
    (void)used;
    return 0;
}

int gpubuf__batch_views(gpubuf_client *c, const Gpubuf__BatchReply *br, const int *fds, int n_fds,
                        const size_t *idx, size_t n, size_t n_all, bool read_only,
                        gpubuf_buffer **ret, int *status, size_t *retry, size_t *ret_n_retry) {
    gpubuf_batch_call bc = {.c = c, .n = n_all, .status = status};
    return make_views(&bc, br, fds, n_fds, idx, n, read_only, false, ret, retry, ret_n_retry);
}

/* An open or alloc batch: send the items listed in idx (n of them), make
 * views, send those that got EAGAIN again while replies bring slabs. The
 * request is built by build(req, idx, n, mapped, n_mapped, arg, scratch). */
typedef void (*build_fn)(Gpubuf__Request *req, const size_t *idx, size_t n, uint64_t *mapped,
                         size_t n_mapped, void *arg, void *scratch);

/* Items per request when a call has more: the next request goes out before
 * the client makes the views of the reply before it, so gpubufd works on
 * one while the client works on the other (docs/performance.md, "Batches
 * in a pipeline"). */
#define PIPE_ITEMS 256

/* The batch call's shape: how its requests are built and sized. */
typedef struct views_call {
    bool read_only;
    const char *const *names; /* the items' names, for the request's size */
    size_t extra;             /* request bytes of the call's other fields */
    build_fn build;
    void *arg;
    void *scratch[2]; /* one per request in flight */
} views_call;

/* One request of a pass: the items idx[0..n) of the call. */
typedef struct pipe_req {
    Gpubuf__Request req;
    uint64_t *mapped;
    size_t *idx, n;
    uint32_t conn;
    bool ahead; /* sent by gpubuf__rpc_start_locked: its reply is read by finish */
} pipe_req;

/* Build the request of the next items (left of them at idx) into p, in
 * slot's scratch, and send it when it can go ahead; its length is in p->n. */
static void pipe_send(gpubuf_client *c, const views_call *vc, pipe_req *p, int slot, size_t *idx,
                      size_t left, size_t n_call) {
    size_t n_mapped;
    size_t k = gpubuf__batch_chunk_len(c, idx, left, vc->names, (size_t)c->n_maps * 11 + vc->extra);
    if (n_call > PIPE_ITEMS && k > PIPE_ITEMS)
        k = PIPE_ITEMS;
    gpubuf__request__init(&p->req);
    p->mapped = mapped_slabs(c, vc->read_only, &n_mapped);
    p->idx = idx;
    p->n = k;
    vc->build(&p->req, idx, k, p->mapped, n_mapped, vc->arg, vc->scratch[slot]);
    p->ahead = gpubuf__rpc_start_locked(c, &p->req, &p->conn) == 0;
}

/* Items idx[0..n) fail with r and the thread's error message. */
static void fail_items(gpubuf_batch_call *bc, const size_t *idx, size_t n, int r) {
    char msg[384];
    snprintf(msg, sizeof(msg), "%s", gpubuf_last_error_message());
    for (size_t k = 0; k < n; k++)
        gpubuf__batch_fail(bc, idx[k], r, msg);
}

/* Items idx[0..n), never sent, fail with r: a request of the call before
 * them failed as a whole. */
static void fail_unsent(gpubuf_batch_call *bc, const size_t *idx, size_t n, int r) {
    for (size_t k = 0; k < n; k++)
        gpubuf__batch_fail(bc, idx[k], r,
                           "not sent: an earlier request of this batch call failed as a whole");
}

/* One pass over the items idx[0..n): requests of at most PIPE_ITEMS items
 * (when there are more), each sent before the reply of the one before it
 * is worked on. The items to send again (EAGAIN) go to retry. The replies
 * are read in order, every one of a request sent: a request that fails as
 * a whole (the connection lost) stops the sending, not the reading; its
 * items, and those not sent, get its error as their result, and the call
 * returns it (items of requests answered keep their views). */
static int views_pass(gpubuf_batch_call *bc, const views_call *vc, size_t *idx, size_t n,
                      gpubuf_buffer **ret, size_t *retry, size_t *ret_n_retry) {
    gpubuf_client *c = bc->c;
    pipe_req p[2];
    size_t from = 0, n_retry = 0;
    int r = 0, cur = 0;
    p[1].n = 0;
    pipe_send(c, vc, &p[0], 0, idx, n, n);
    from = p[0].n;
    while (p[cur].n > 0) {
        pipe_req *q = &p[cur], *next = &p[cur ^ 1];
        Gpubuf__Response *resp;
        int fds[GPUBUF_WIRE_MAX_FDS], n_fds;
        if (q->ahead && from < n && r == 0) {
            pipe_send(c, vc, next, cur ^ 1, idx + from, n - from, n);
            from += next->n;
        }
        if (!q->ahead && r < 0) {
            /* Built, not sent, and the call failed: it is not sent. */
            fail_unsent(bc, q->idx, q->n, r);
            free(q->mapped);
            q->n = 0;
            cur ^= 1;
            continue;
        }
        int rq = q->ahead ? gpubuf__batch_finish(c, &q->req, q->conn, &resp, fds, &n_fds, q->n)
                          : gpubuf__batch_rpc(c, &q->req, &resp, fds, &n_fds, q->n);
        free(q->mapped);
        if (rq < 0) {
            fail_items(bc, q->idx, q->n, rq);
        } else {
            size_t k = 0;
            rq = make_views(bc, resp->batch, fds, n_fds, q->idx, q->n, vc->read_only, q->ahead,
                            ret, retry + n_retry, &k);
            gpubuf__resp_free(c, resp);
            gpubuf_trace(c->session_id, q->req.id, -1, GPUBUF_TRACE_C_MAPPED, 0);
            if (rq < 0)
                fail_items(bc, q->idx, q->n, rq); /* a malformed reply: no view made */
            else
                n_retry += k;
        }
        if (rq < 0 && r == 0)
            r = rq;
        q->n = 0;
        cur ^= 1;
        if (p[cur].n == 0 && from < n && r == 0) {
            /* q went the plain way (or was the last sent ahead): the next
             * is built now. */
            pipe_send(c, vc, &p[cur], cur, idx + from, n - from, n);
            from += p[cur].n;
        }
    }
    if (r < 0)
        fail_unsent(bc, idx + from, n - from, r);
    *ret_n_retry = n_retry;
    return r;
}

static int views_batch(gpubuf_batch_call *bc, const views_call *vc, size_t *idx, size_t n,
                       gpubuf_buffer **ret) {
    size_t *retry = malloc((n + 1) * sizeof(*retry));
    int r = 0;
    if (!retry)
        return -ENOMEM;
    while (n > 0 && r == 0) {
        size_t n_retry = 0;
        r = views_pass(bc, vc, idx, n, ret, retry, &n_retry);
        if (r < 0)
            fail_items(bc, retry, n_retry, r);
        memcpy(idx, retry, n_retry * sizeof(*idx));
        n = n_retry;
    }
    free(retry);
    return r;
}

/* The arrays of one request slot of a call of n items: a name and a u64 (id
 * or size) per item. -ENOMEM when either is missing (the caller frees both). */
static int slot_arrays(char ***names, uint64_t **u64, size_t n) {
    *names = malloc((n + 1) * sizeof(**names));
    *u64 = malloc((n + 1) * sizeof(**u64));
    return *names && *u64 ? 0 : -ENOMEM;
}

/* ---- open ---------------------------------------------------------------- */

typedef struct open_args {
    const char *const *names;
    const uint64_t *ids;
    bool read_only;
} open_args;

typedef struct open_scratch {
    Gpubuf__BatchOpenRequest o;
    char **names;
    uint64_t *ids;
} open_scratch;

static void build_open(Gpubuf__Request *req, const size_t *idx, size_t n, uint64_t *mapped,
                       size_t n_mapped, void *arg, void *scratch) {
    const open_args *a = arg;
    open_scratch *sc = scratch;
    gpubuf__batch_open_request__init(&sc->o);
    for (size_t k = 0; k < n; k++) {
        if (a->names)
            sc->names[k] = (char *)a->names[idx[k]];
        else
            sc->ids[k] = a->ids[idx[k]];
    }
    if (a->names) {
        sc->o.n_names = n;
        sc->o.names = sc->names;
    } else {
        sc->o.n_buffer_ids = n;
        sc->o.buffer_ids = sc->ids;
    }
    sc->o.read_only = a->read_only;
    sc->o.with_meta = true;
    sc->o.sparse_meta = true; /* items without metadata cost nothing */
    sc->o.n_mapped_slabs = n_mapped;
    sc->o.mapped_slabs = mapped;
    req->body_case = GPUBUF__REQUEST__BODY_BATCH_OPEN;
    req->batch_open = &sc->o;
}

/* An item's name: plain (the default pool) or qualified (/POOL/NAME); the
 * daemon splits it as it splits a single request's. */
static int item_name_check(const char *name, char *msg, size_t msg_len) {
    char pool[GPUBUF_NAME_MAX + 1];
    const char *plain;
    int r = gpubuf_name_split(name, pool, &plain, msg, msg_len);
    return r < 0 ? r : gpubuf_name_check(plain, strlen(plain), msg, msg_len);
}

static int open_many_call(gpubuf_client *c, size_t n, const char *const *names, const uint64_t *ids,
                          unsigned flags, gpubuf_buffer **ret, int *ret_status) {
    gpubuf_batch_call bc;
    open_args a = {names, ids, (flags & GPUBUF_OPEN_READONLY) != 0};
    open_scratch sc[2] = {0};
    views_call vc = {a.read_only, names, 0, build_open, &a, {&sc[0], &sc[1]}};
    size_t *idx;
    int r = gpubuf__batch_start(&bc, c, n, ret_status);
    if (r < 0)
        return r;
    memset(ret, 0, n * sizeof(*ret));
    idx = malloc((n + 1) * sizeof(*idx));
    for (int s = 0; s < 2; s++)
        if (slot_arrays(&sc[s].names, &sc[s].ids, n) < 0)
            r = -ENOMEM;
    if (!idx)
        r = -ENOMEM;
    for (size_t i = 0; r == 0 && i < n; i++) {
        idx[i] = i;
        char msg[256];
        int e;
        if (names && (!names[i] || (e = item_name_check(names[i], msg, sizeof(msg))) < 0)) {
            gpubuf__batch_fail(&bc, i, names[i] ? e : -EINVAL, names[i] ? msg : "no name (NULL)");
            idx[i] = SIZE_MAX;
        }
    }
    size_t n_valid = 0;
    for (size_t i = 0; r == 0 && i < n; i++)
        if (idx[i] != SIZE_MAX)
            idx[n_valid++] = idx[i];
    pthread_mutex_lock(&c->lock);
    if (r == 0)
        r = views_batch(&bc, &vc, idx, n_valid, ret);
    pthread_mutex_unlock(&c->lock);
    free(idx);
    for (int s = 0; s < 2; s++) {
        free(sc[s].names);
        free(sc[s].ids);
    }
    return gpubuf__batch_end(&bc, ret_status, r);
}

/* ---- alloc --------------------------------------------------------------- */

typedef struct alloc_args {
    const char *pool;
    const uint64_t *sizes;
    const char *const *names;
    bool seal;
} alloc_args;

typedef struct alloc_scratch {
    Gpubuf__BatchAllocRequest a;
    char **names;
    uint64_t *sizes;
} alloc_scratch;

static void build_alloc(Gpubuf__Request *req, const size_t *idx, size_t n, uint64_t *mapped,
                        size_t n_mapped, void *arg, void *scratch) {
    const alloc_args *a = arg;
    alloc_scratch *sc = scratch;
    gpubuf__batch_alloc_request__init(&sc->a);
    for (size_t k = 0; k < n; k++) {
        sc->sizes[k] = a->sizes[idx[k]];
        if (a->names)
            sc->names[k] = (char *)(a->names[idx[k]] ? a->names[idx[k]] : "");
    }
    sc->a.pool = (char *)(a->pool ? a->pool : "");
    sc->a.n_sizes = n;
    sc->a.sizes = sc->sizes;
    if (a->names) {
        sc->a.n_names = n;
        sc->a.names = sc->names;
    }
    sc->a.seal = a->seal;
    sc->a.n_mapped_slabs = n_mapped;
    sc->a.mapped_slabs = mapped;
    req->body_case = GPUBUF__REQUEST__BODY_BATCH_ALLOC;
    req->batch_alloc = &sc->a;
}

static int alloc_many_call(gpubuf_client *c, const char *pool, size_t n, const uint64_t *sizes,
                           const char *const *names, unsigned flags, gpubuf_buffer **ret,
                           int *ret_status) {
    gpubuf_batch_call bc;
    alloc_args a = {pool, sizes, names, (flags & GPUBUF_ALLOC_SEAL) != 0};
    alloc_scratch sc[2] = {0};
    views_call vc = {false, names, pool ? strlen(pool) : 0, build_alloc, &a, {&sc[0], &sc[1]}};
    size_t *idx, n_valid = 0;
    int r = gpubuf__batch_start(&bc, c, n, ret_status);
    if (r < 0)
        return r;
    memset(ret, 0, n * sizeof(*ret));
    idx = malloc((n + 1) * sizeof(*idx));
    for (int s = 0; s < 2; s++)
        if (slot_arrays(&sc[s].names, &sc[s].sizes, n) < 0)
            r = -ENOMEM;
    if (!idx)
        r = -ENOMEM;
    for (size_t i = 0; r == 0 && i < n; i++) {
        char msg[256];
        int e = 0;
        if (sizes[i] == 0)
            gpubuf__batch_fail(&bc, i, -EINVAL, "size 0: a buffer holds at least 1 byte");
        else if (names && names[i] && *names[i] &&
                 (e = gpubuf_name_check(names[i], strlen(names[i]), msg, sizeof(msg))) < 0)
            gpubuf__batch_fail(&bc, i, e, msg);
        else
            idx[n_valid++] = i;
    }
    pthread_mutex_lock(&c->lock);
    if (r == 0)
        r = views_batch(&bc, &vc, idx, n_valid, ret);
    pthread_mutex_unlock(&c->lock);
    for (size_t i = 0; i < n; i++)
        if (ret[i]) {
            ret[i]->allocated = true;
            ret[i]->sealable = !a.seal;
        }
    free(idx);
    for (int s = 0; s < 2; s++) {
        free(sc[s].names);
        free(sc[s].sizes);
    }
    return gpubuf__batch_end(&bc, ret_status, r);
}

/* ---- public entry points ------------------------------------------------- */

/* A batch call's result: a count of failed items keeps its message. */

GPUBUF_EXTERN int gpubuf_open_many(gpubuf_client *c, size_t n, const char *const *names,
                                   const uint64_t *ids, unsigned flags, gpubuf_buffer **ret,
                                   int *ret_status) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && (ret || !n), -EINVAL, "gpubuf_open_many needs a connection and its items");
    GPUBUF_CHECK(names || ids || !n, -EINVAL, "gpubuf_open_many needs names or ids");
    GPUBUF_CHECK(!(flags & ~(unsigned)GPUBUF_OPEN_READONLY), -EINVAL, "unknown open flags 0x%x",
                 flags);
    int r = open_many_call(c, n, names, ids, flags, ret, ret_status);
    return r > 0 ? r : gpubuf__result(r);
}

/* The items of a batch open that were not sealed yet (-ENOENT), opened
 * each with a single waiting open until the one deadline; 0 or -ENOMEM. */
static int open_many_wait(gpubuf_client *c, size_t n, const char *const *names, const uint64_t *ids,
                          const gpubuf_lookup *o, gpubuf_buffer **ret, int *st) {
    uint64_t deadline =
        gpubuf_now_ns() + (uint64_t)(o->timeout_ms > 0 ? o->timeout_ms : 0) * 1000000u;
    for (size_t i = 0; i < n; i++) {
        if (st[i] != -ENOENT)
            continue;
        gpubuf_lookup w = {.flags = o->flags & GPUBUF_OPEN_READONLY, .timeout_ms = -1};
        if (o->timeout_ms > 0) {
            uint64_t now = gpubuf_now_ns();
            /* at least 1 ms: a deadline that passed still asks once */
            w.timeout_ms = now >= deadline ? 1 : (int)((deadline - now + 999999u) / 1000000u);
        }
        st[i] = gpubuf_open_with(c, names ? names[i] : NULL, names ? 0 : ids[i], &w, &ret[i]);
        if (st[i] < 0)
            ret[i] = NULL;
    }
    return 0;
}

GPUBUF_EXTERN int gpubuf_open_many_with(gpubuf_client *c, size_t n, const char *const *names,
                                        const uint64_t *ids, const gpubuf_lookup *o,
                                        gpubuf_buffer **ret, int *ret_status) {
    gpubuf_lookup none = {0};
    gpubuf__clear_error();
    if (!o)
        o = &none;
    GPUBUF_CHECK(c && (ret || !n), -EINVAL,
                 "gpubuf_open_many_with needs a connection and its items");
    GPUBUF_CHECK(names || ids || !n, -EINVAL, "gpubuf_open_many_with needs names or ids");
    GPUBUF_CHECK(!(o->flags & ~(unsigned)GPUBUF_OPEN_READONLY), -EINVAL,
                 "unknown open flags 0x%x (a batch takes GPUBUF_OPEN_READONLY; pools and "
                 "owners go in qualified names)",
                 o->flags);
    GPUBUF_CHECK(!o->pool, -EINVAL,
                 "a batch open looks names up per item: write \"/POOL/NAME\" instead of pool");
    int *st = ret_status ? ret_status : calloc(n + 1, sizeof(int));
    if (!st)
        return gpubuf__result(-ENOMEM);
    int r = open_many_call(c, n, names, ids, o->flags, ret, st);
    if (r > 0 && o->timeout_ms != 0) {
        char first[384];
        snprintf(first, sizeof(first), "%s", gpubuf_last_error_message());
        open_many_wait(c, n, names, ids, o, ret, st);
        size_t failed = 0, at = n;
        for (size_t i = 0; i < n; i++)
            if (st[i] < 0 && failed++ == 0)
                at = i;
        r = (int)failed;
        if (failed && st[at] != -ENOENT && st[at] != -ETIMEDOUT)
            gpubuf__set_error("%s", first);
        else if (failed)
            gpubuf__set_error("%zu of %zu items failed; the first: item %zu: %s", failed, n, at,
                              gpubuf_strerror(st[at]));
        else
            gpubuf__clear_error();
    }
    if (st != ret_status)
        free(st);
    return r > 0 ? r : gpubuf__result(r);
}

GPUBUF_EXTERN int gpubuf_alloc_many(gpubuf_client *c, const char *pool, size_t n,
                                    const uint64_t *sizes, const char *const *names, unsigned flags,
                                    gpubuf_buffer **ret, int *ret_status) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && (ret || !n), -EINVAL, "gpubuf_alloc_many needs a connection and its items");
    GPUBUF_CHECK(sizes || !n, -EINVAL, "gpubuf_alloc_many needs sizes");
    GPUBUF_CHECK(!(flags & ~(unsigned)GPUBUF_ALLOC_SEAL), -EINVAL, "unknown alloc flags 0x%x",
                 flags);
    int r = alloc_many_call(c, pool, n, sizes, names, flags, ret, ret_status);
    return r > 0 ? r : gpubuf__result(r);
}
