/* Session room: the batches, many items in one request and one reply with a
 * result per item (docs/protocol.md, "Batches"). Each item runs the single
 * request's code path; a failed item changes nothing and the others go on. */
#include "batch.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "item.h"
#include "trace.h"
#include "util.h"

/* One batch reply being built: element i of each array is item i. */
typedef struct batch {
    gd_session *s;
    gd_req_type type;
    size_t n;               /* items */
    bool buffers;           /* open, alloc: the items' buffers are described */
    bool read_only;         /* open: read-only references and mappings */
    int32_t *status;
    uint64_t *ids, *sizes, *offsets, *slab_ids;
    uint32_t *states;
    uint8_t *names;         /* NUL-terminated names, back to back */
    size_t names_len, names_cap;
    Gpubuf__BatchItemError *errs;
    Gpubuf__BatchItemError **perrs;
    size_t n_errs;
    uint32_t *ev_items;
    uint8_t *events;        /* GD_EVENT_HANDLE_SIZE per entry of ev_items */
    size_t n_ev;
    uint64_t *mapped;       /* the client's mapped slabs, sorted */
    size_t n_mapped;
    Gpubuf__Slab slabs[GD_BATCH_REPLY_FDS];
    Gpubuf__Slab *pslabs[GD_BATCH_REPLY_FDS];
    int fds[GD_BATCH_REPLY_FDS];
    unsigned n_slabs, n_fds, max_slabs;
    /* open with with_meta: each item's layout, user bytes and lease (they
     * point into the buffers, which the items' references keep); with
     * sparse_meta only those of the items that have any, listed in
     * meta_items (the block is made for the first of them) */
    bool with_meta, sparse_meta;
    Gpubuf__ArrayLayout *layouts;
    Gpubuf__ArrayLayout **playouts;
    ProtobufCBinaryData *users;
    uint64_t *lease_left;
    uint32_t *meta_items;
    size_t n_meta;
    uint64_t now_ns;
} batch;

static int u64_cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void batch_free(batch *bt) {
    for (size_t i = 0; i < bt->n_errs; i++)
        free(bt->errs[i].message);
    free(bt->errs); /* the block of the per-item arrays */
    free(bt->names);
    free(bt->events);
    free(bt->mapped);
    free(bt->layouts); /* the block of the per-item metadata */
}

/* The block of the items' metadata: layout, its pointer, user bytes, lease,
 * item number (each array's element size a multiple of the next one's, so
 * every array is aligned). Every item's layout made empty, unless sparse.
 * False without memory. */
static bool batch_meta_block(batch *bt) {
    size_t n = bt->n;
    size_t per = sizeof(*bt->layouts) + sizeof(*bt->playouts) + sizeof(*bt->users) +
                 sizeof(*bt->lease_left) + sizeof(*bt->meta_items);
    uint8_t *p = bt->sparse_meta ? malloc((n + 1) * per) : calloc(n + 1, per);
    if (!p)
        return false;
    bt->layouts = (Gpubuf__ArrayLayout *)(void *)p;
    bt->playouts = (Gpubuf__ArrayLayout **)(void *)(bt->layouts + (n + 1));
    bt->users = (ProtobufCBinaryData *)(void *)(bt->playouts + (n + 1));
    bt->lease_left = (uint64_t *)(void *)(bt->users + (n + 1));
    bt->meta_items = (uint32_t *)(void *)(bt->lease_left + (n + 1));
    for (size_t i = 0; !bt->sparse_meta && i < n; i++) {
        gpubuf__array_layout__init(&bt->layouts[i]);
        bt->playouts[i] = &bt->layouts[i];
    }
    return true;
}

/* The items' metadata goes with the reply (open with with_meta); false (and
 * an error reply) without memory. */
static bool batch_meta_init(batch *bt, uint64_t id, bool sparse) {
    bt->with_meta = true;
    bt->sparse_meta = sparse;
    bt->now_ns = gpubuf_now_ns();
    if (!sparse && !batch_meta_block(bt)) {
        batch_free(bt);
        gd_session_reply_error(bt->s, id, -ENOMEM, "out of memory");
        return false;
    }
    return true;
}

/* With sparse_meta, the items that carry metadata: a layout, user bytes or a
 * lease. */
static bool has_meta(const gd_buf *b) {
    return b->meta || b->lease_slot;
}

/* Item i's metadata: b's layout (none: an empty ArrayLayout, dtype_bits 0),
 * user bytes and lease. */
static void batch_meta(batch *bt, size_t i, const gd_buf *b) {
    size_t k = i, len;
    if (bt->sparse_meta) {
        if (!has_meta(b))
            return;
        k = bt->n_meta++;
        bt->meta_items[k] = (uint32_t)i;
        gpubuf__array_layout__init(&bt->layouts[k]);
        bt->playouts[k] = &bt->layouts[k];
    }
    gd_session_fill_layout(&bt->layouts[k], b);
    const uint8_t *user = gd_meta_user(b, &len);
    bt->users[k].data = (uint8_t *)user;
    bt->users[k].len = user ? len : 0;
    bt->lease_left[k] = gd_registry_lease_left_ms(b, bt->now_ns);
}

/* Start a batch of n items; false (and an error reply) when it is refused
 * whole: too many items, or out of memory. */
static bool batch_init(batch *bt, gd_session *s, uint64_t id, gd_req_type type, size_t n,
                       bool buffers, const uint64_t *mapped, size_t n_mapped) {
    memset(bt, 0, sizeof(*bt));
    bt->s = s;
    bt->type = type;
    bt->n = n;
    bt->buffers = buffers;
    if (n > GD_BATCH_MAX_ITEMS) {
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "a batch holds at most %u items (HelloReply.max_batch_items); this one has %zu: "
                 "split it",
                 (unsigned)GD_BATCH_MAX_ITEMS, n);
        gd_session_reply_error(s, id, -E2BIG, msg);
        return false;
    }
    if (n_mapped > GD_BATCH_MAX_ITEMS * 4u) {
        gd_session_reply_error(s, id, -E2BIG, "a batch lists at most 16384 mapped slabs");
        return false;
    }
    /* One block for the per-item arrays: error, its pointer, 4 x u64,
     * status, state, event item (the 8-byte ones first, so every array is
     * aligned). Not zeroed: every item is written by batch_ok() or
     * batch_fail(), the errors and event items as they are appended. */
    size_t per = sizeof(*bt->errs) + sizeof(*bt->perrs) + 4 * sizeof(uint64_t) +
                 sizeof(int32_t) + 2 * sizeof(uint32_t);
    uint8_t *p = malloc((n + 1) * per);
    bt->names_cap = buffers ? (n + 1) * (GPUBUF_NAME_MAX + 1) : 1;
    bt->names = malloc(bt->names_cap);
    bt->mapped = n_mapped ? malloc(n_mapped * sizeof(uint64_t)) : NULL;
    if (!p || !bt->names || (n_mapped && !bt->mapped)) {
        free(p);
        batch_free(bt);
        gd_session_reply_error(s, id, -ENOMEM, "out of memory");
        return false;
    }
    bt->errs = (Gpubuf__BatchItemError *)(void *)p;
    bt->perrs = (Gpubuf__BatchItemError **)(void *)(bt->errs + (n + 1));
    bt->ids = (uint64_t *)(void *)(bt->perrs + (n + 1));
    bt->sizes = bt->ids + (n + 1);
    bt->offsets = bt->sizes + (n + 1);
    bt->slab_ids = bt->offsets + (n + 1);
    bt->status = (int32_t *)(void *)(bt->slab_ids + (n + 1));
    bt->states = (uint32_t *)(void *)(bt->status + (n + 1));
    bt->ev_items = bt->states + (n + 1);
    if (n_mapped) {
        memcpy(bt->mapped, mapped, n_mapped * sizeof(uint64_t));
        qsort(bt->mapped, n_mapped, sizeof(uint64_t), u64_cmp);
    }
    bt->n_mapped = n_mapped;
    /* Never more fds than the connection's budget has room for. */
    unsigned room = s->io->fd_room ? s->io->fd_room(s->conn) : 1;
    bt->max_slabs = room < GD_BATCH_REPLY_FDS ? (room ? room : 1) : GD_BATCH_REPLY_FDS;
    return true;
}

/* Append an item's name (or "") to the names column (room for the longest
 * name of every item was made at the start). */
static void batch_name(batch *bt, const char *name) {
    size_t len = name ? strlen(name) : 0;
    assert(bt->names_len + len + 1 <= bt->names_cap);
    memcpy(bt->names + bt->names_len, name ? name : "", len);
    bt->names[bt->names_len + len] = 0;
    bt->names_len += len + 1;
}

/* Item i failed with r and err's sentence. */
static void batch_fail(batch *bt, size_t i, int r, const gd_err *err) {
    Gpubuf__BatchItemError *e = &bt->errs[bt->n_errs];
    bt->status[i] = r;
    if (bt->buffers) {
        bt->ids[i] = bt->sizes[i] = bt->offsets[i] = bt->slab_ids[i] = 0;
        bt->states[i] = 0;
        batch_name(bt, "");
    }
    gpubuf__batch_item_error__init(e);
    e->item = (uint32_t)i;
    /* Without memory for the sentence, the code alone says it. */
    if ((e->message = strdup(gd_err_msg(err, r)))) {
        bt->perrs[bt->n_errs] = e;
        bt->n_errs++;
    }
    gd_metrics_error(&bt->s->ctx->metrics, -1, r);
    bt->s->ctx->metrics.batch[bt->type - GD_REQ_BATCH_OPEN].item_errors++;
}

/* Describe b's slab in the reply unless the client maps it already or the
 * reply does: 0, -EAGAIN when the reply has no room for another slab, or
 * the error of making a read-only fd. */
static int batch_slab(batch *bt, gd_buf *b, gd_err *err) {
    gd_slab *sl = b->blk.slab;
    uint64_t sid = sl->id;
    int fd = -1, r;
    if (bt->n_mapped && bsearch(&sid, bt->mapped, bt->n_mapped, sizeof(sid), u64_cmp))
        return 0;
    for (unsigned k = 0; k < bt->n_slabs; k++)
        if (bt->slabs[k].slab_id == sid)
            return 0;
    if (bt->n_slabs >= bt->max_slabs)
        return gd_err_set(err, -EAGAIN,
                          "this reply describes its limit of %u new slabs; send the item again "
                          "(after mapping those)",
                          bt->max_slabs);
    if (bt->read_only) {
        if ((r = gd_backend_export_ro(b->pool->be, &sl->exp, &fd, err)) < 0)
            return r;
    } else {
        fd = sl->exp.fd;
    }
    Gpubuf__Slab *m = &bt->slabs[bt->n_slabs];
    gd_session_fill_slab(m, b);
    m->keepable = gd_session_slab_keepable(bt->s, b, bt->read_only);
    m->read_only = bt->read_only;
    bt->pslabs[bt->n_slabs++] = m;
    if (fd >= 0)
        bt->fds[bt->n_fds++] = fd;
    bt->s->ctx->metrics.slab_imports++;
    return 0;
}

/* Item i succeeded; b (NULL for release, seal, delete) is its buffer. */
static void batch_ok(batch *bt, size_t i, const gd_buf *b) {
    bt->status[i] = 0;
    if (!bt->buffers || !b)
        return;
    bt->ids[i] = b->id;
    bt->sizes[i] = b->size;
    bt->offsets[i] = b->blk.offset;
    bt->slab_ids[i] = b->blk.slab->id;
    bt->states[i] = (uint32_t)b->state;
    batch_name(bt, b->name);
    if (bt->with_meta)
        batch_meta(bt, i, b);
}

/* Item i took a reference to b (open, alloc): describe its slab and its seal
 * event. False when the slab does not fit (the caller undoes the item). */
static bool batch_buffer(batch *bt, size_t i, gd_buf *b, gd_err *err, int *ret) {
    int r = batch_slab(bt, b, err);
    if (r < 0) {
        *ret = r;
        return false;
    }
    if (bt->sparse_meta && !bt->layouts && has_meta(b) && !batch_meta_block(bt)) {
        *ret = gd_err_set(err, -ENOMEM, "out of memory");
        return false;
    }
    const uint8_t *ev = gd_registry_event(&bt->s->ctx->reg, b);
    if (ev) {
        if (!bt->events && !(bt->events = malloc((bt->n + 1) * GD_EVENT_HANDLE_SIZE))) {
            *ret = gd_err_set(err, -ENOMEM, "out of memory");
            return false;
        }
        bt->ev_items[bt->n_ev] = (uint32_t)i;
        memcpy(bt->events + bt->n_ev * GD_EVENT_HANDLE_SIZE, ev, GD_EVENT_HANDLE_SIZE);
        bt->n_ev++;
    }
    batch_ok(bt, i, b);
    return true;
}

/* Send the reply and free the batch. */
static void batch_reply_send(batch *bt, uint64_t id) {
    gd_session *s = bt->s;
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    Gpubuf__BatchReply br = GPUBUF__BATCH_REPLY__INIT;
    size_t n = bt->n;
    br.n_status = n;
    br.status = bt->status;
    br.n_errors = bt->n_errs;
    br.errors = bt->perrs;
    if (bt->buffers) {
        br.n_buffer_id = br.n_size = br.n_offset = br.n_slab_id = br.n_state = n;
        br.buffer_id = bt->ids;
        br.size = bt->sizes;
        br.offset = bt->offsets;
        br.slab_id = bt->slab_ids;
        br.state = bt->states;
        br.names.data = bt->names;
        br.names.len = bt->names_len;
        br.n_slabs = bt->n_slabs;
        br.slabs = bt->pslabs;
        br.n_event_items = bt->n_ev;
        br.event_items = bt->ev_items;
        br.events.data = bt->events;
        br.events.len = bt->n_ev * GD_EVENT_HANDLE_SIZE;
    }
    if (bt->with_meta) {
        br.n_layouts = br.n_user_data = br.n_lease_left_ms = bt->sparse_meta ? bt->n_meta : n;
        br.layouts = bt->playouts;
        br.user_data = bt->users;
        br.lease_left_ms = bt->lease_left;
        if (bt->sparse_meta) {
            br.n_meta_items = bt->n_meta;
            br.meta_items = bt->meta_items;
        }
    }
    s->ctx->metrics.batch[bt->type - GD_REQ_BATCH_OPEN].items += n;
    resp.id = id;
    resp.fds = bt->n_fds;
    resp.body_case = GPUBUF__RESPONSE__BODY_BATCH;
    resp.batch = &br;
    /* At most gd_session_batch_reply_bound(n) bytes, for which the reply
     * memory had room before the batch was handled (gd_session_frame): it
     * is queued whatever the budget says now, so the references its items
     * took always reach the client. */
    gd_reply_plan plan;
    size_t len = gd_reply_size(&resp, &plan);
    assert(len <= gd_session_batch_reply_bound(n, bt->with_meta));
    bool trace = gpubuf_trace_on();
    if (trace) {
        gpubuf_trace(s->holder->id, id, bt->type, GPUBUF_TRACE_D_HANDLED, 0);
        gpubuf_trace_set_tag(s->holder->id, id, bt->type);
    }
    s->io->send_fds(s->conn, len, plan.pack, plan.msg, bt->fds, (int)bt->n_fds, true);
    if (trace)
        gpubuf_trace_set_tag(0, 0, -1);
    batch_free(bt);
}

/* A batch item's target: a name, plain (the default pool) or qualified
 * (/POOL/NAME), or an id (any pool); the same lookup as a single request's. */
static int batch_target(gd_session *s, const char *name, uint64_t bid, gd_target *t,
                        gd_err *err) {
    char pool[GPUBUF_NAME_MAX + 1];
    const char *plain = name;
    if (name) {
        int r = gpubuf_name_split(name, pool, &plain, err->msg, sizeof(err->msg));
        if (r < 0)
            return r;
    }
    return gd_session_target(s, name != NULL, plain, bid, name ? pool : NULL, false, 0, t, err);
}

void gd_session_batch_open(gd_session *s, uint64_t id, const Gpubuf__BatchOpenRequest *q) {
    gd_registry *reg = &s->ctx->reg;
    batch bt;
    size_t n = q->n_names + q->n_buffer_ids;
    if (!batch_init(&bt, s, id, GD_REQ_BATCH_OPEN, n, true, q->mapped_slabs, q->n_mapped_slabs))
        return;
    bt.read_only = q->read_only;
    if (q->with_meta && !batch_meta_init(&bt, id, q->sparse_meta))
        return;
    for (size_t i = 0; i < n; i++) {
        gd_err err;
        gd_err_clear(&err);
        gd_buf *b;
        bool by_name = i < q->n_names;
        gd_target t;
        int r = batch_target(s, by_name ? q->names[i] : NULL,
                             by_name ? 0 : q->buffer_ids[i - q->n_names], &t, &err);
        if (r == 0)
            r = gd_registry_open_target(reg, s->holder, &t, q->read_only, &b, NULL, &err);
        if (r == 0 && !batch_buffer(&bt, i, b, &err, &r))
            gd_session_open_undo(s, b, q->read_only);
        if (r < 0)
            batch_fail(&bt, i, r, &err);
    }
    batch_reply_send(&bt, id);
}

void gd_session_batch_release(gd_session *s, uint64_t id, const Gpubuf__BatchReleaseRequest *q) {
    batch bt;
    size_t n = q->n_buffer_ids;
    if ((q->n_keep_mapped && q->n_keep_mapped != n) || (q->n_read_only && q->n_read_only != n)) {
        gd_session_reply_error(s, id, -EINVAL,
                    "keep_mapped and read_only have no entry or one per buffer id");
        return;
    }
    if (!batch_init(&bt, s, id, GD_REQ_BATCH_RELEASE, n, false, NULL, 0))
        return;
    for (size_t i = 0; i < n; i++) {
        gd_err err;
        gd_err_clear(&err);
        int r = gd_session_release_one(s, q->buffer_ids[i], q->n_keep_mapped && q->keep_mapped[i],
                            q->n_read_only && q->read_only[i], &err);
        if (r < 0)
            batch_fail(&bt, i, r, &err);
        else
            batch_ok(&bt, i, NULL);
    }
    batch_reply_send(&bt, id);
}

void gd_session_batch_alloc(gd_session *s, uint64_t id, const Gpubuf__BatchAllocRequest *q) {
    gd_registry *reg = &s->ctx->reg;
    gd_err perr = {0};
    gd_pool *pool;
    batch bt;
    size_t n = q->n_sizes;
    if (q->n_names && q->n_names != n) {
        gd_session_reply_error(s, id, -EINVAL, "names has no entry or one per size");
        return;
    }
    int r = gd_context_pool(s->ctx, q->pool, &pool, &perr);
    if (r < 0) {
        gd_session_reply_error(s, id, r, gd_err_msg(&perr, r));
        return;
    }
    if (!batch_init(&bt, s, id, GD_REQ_BATCH_ALLOC, n, true, q->mapped_slabs, q->n_mapped_slabs))
        return;
    s->batch_alloc = true; /* for this session's waiting opens its seals wake */
    for (size_t i = 0; i < n; i++) {
        gd_err err;
        gd_err_clear(&err);
        gd_buf *b;
        r = gd_session_alloc_one(s, pool, q->sizes[i], q->alignment,
                                 q->n_names ? q->names[i] : NULL, NULL, &b, &err);
        if (r == 0 && q->seal)
            r = gd_registry_seal_event(reg, s->holder, b->id, NULL, &b, &err);
        if (r == 0 && !batch_buffer(&bt, i, b, &err, &r)) {
            /* Not handed out: the buffer goes again. */
            uint64_t bid = b->id;
            gd_registry_delete(reg, s->holder, NULL, bid, NULL);
            gd_registry_release(reg, s->holder, bid, NULL);
        }
        if (r < 0)
            batch_fail(&bt, i, r, &err);
    }
    s->batch_alloc = false;
    batch_reply_send(&bt, id);
}

void gd_session_batch_state(gd_session *s, uint64_t id, const Gpubuf__BatchStateRequest *q) {
    gd_registry *reg = &s->ctx->reg;
    bool seal = q->op == GPUBUF__BATCH_STATE_OP__BATCH_STATE_OP_SEAL;
    size_t n = q->n_names + q->n_buffer_ids;
    batch bt;
    if (!seal && q->op != GPUBUF__BATCH_STATE_OP__BATCH_STATE_OP_DELETE) {
        gd_session_reply_error(s, id, -EINVAL, "a batch state request needs op seal or delete");
        return;
    }
    if (seal && q->n_names) {
        gd_session_reply_error(s, id, -EINVAL, "a batch seal takes buffer ids only");
        return;
    }
    if (!batch_init(&bt, s, id, seal ? GD_REQ_BATCH_SEAL : GD_REQ_BATCH_DELETE, n, false, NULL,
                    0))
        return;
    for (size_t i = 0; i < n; i++) {
        gd_err err;
        gd_err_clear(&err);
        gd_buf *b;
        bool by_name = i < q->n_names;
        uint64_t bid = by_name ? 0 : q->buffer_ids[i - q->n_names];
        gd_target t;
        int r;
        if (seal)
            r = gd_registry_seal_event(reg, s->holder, bid, NULL, &b, &err);
        else if ((r = batch_target(s, by_name ? q->names[i] : NULL, bid, &t, &err)) == 0)
            r = gd_registry_delete_target(reg, s->holder, &t, &err);
        if (r < 0)
            batch_fail(&bt, i, r, &err);
        else
            batch_ok(&bt, i, NULL);
    }
    batch_reply_send(&bt, id);
}

/* Bytes of one item in a batch reply at most: its status, buffer id, size,
 * offset, slab id and state (varints), its name, its error (item number and
 * sentence, each with its tag and length) and its seal event. */
#define BATCH_ITEM_REPLY_MAX                                                                    \
    (5u + 4u * 10u + 5u + (GPUBUF_NAME_MAX + 1u) + (3u + 6u + 3u + sizeof(((gd_err *)0)->msg)) + \
     5u + GD_EVENT_HANDLE_SIZE)
/* One Slab message at most (ids and sizes as varints, the 16-byte UUID, the
 * 64-byte IPC handle, flags, tags and lengths), and the rest of a reply:
 * the envelope, the column tags and lengths. */
#define BATCH_SLAB_REPLY_MAX 160u
#define BATCH_REPLY_FIXED 256u
/* An item's metadata at most (with_meta): its ArrayLayout (three varints,
 * shape and strides of GPUBUF_LAYOUT_MAX_NDIM varints each, the byte
 * offset, tags and lengths), its user bytes, its lease and (sparse_meta)
 * its item number. */
#define BATCH_ITEM_META_MAX                                                                   \
    ((5u + 3u * 6u + 2u * (5u + GPUBUF_LAYOUT_MAX_NDIM * 10u) + 11u) + \
     (5u + GPUBUF_USER_DATA_MAX) + 11u + 5u)

size_t gd_session_batch_reply_bound(size_t n, bool with_meta) {
    return BATCH_REPLY_FIXED + GD_BATCH_REPLY_FDS * BATCH_SLAB_REPLY_MAX +
           n * (BATCH_ITEM_REPLY_MAX + (with_meta ? BATCH_ITEM_META_MAX : 0u));
}

bool gd_session_batch_with_meta(const Gpubuf__Request *req) {
    return req->body_case == GPUBUF__REQUEST__BODY_BATCH_OPEN && req->batch_open->with_meta;
}

/* The items of a batch request (0 for any other request). */
size_t gd_session_batch_items(const Gpubuf__Request *req) {
    switch (req->body_case) {
    case GPUBUF__REQUEST__BODY_BATCH_OPEN:
        return req->batch_open->n_names + req->batch_open->n_buffer_ids;
    case GPUBUF__REQUEST__BODY_BATCH_RELEASE: return req->batch_release->n_buffer_ids;
    case GPUBUF__REQUEST__BODY_BATCH_ALLOC: return req->batch_alloc->n_sizes;
    case GPUBUF__REQUEST__BODY_BATCH_STATE:
        return req->batch_state->n_names + req->batch_state->n_buffer_ids;
    default: return 0;
    }
}
