/* Session room: the status request, a snapshot of the pools, the buffers
 * (as messages or as columns), the clients and the counters. */
#include "status.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utlist.h>

#include "util.h"

/* The metadata columns (BufferColumns 10 to 14) for n buffers, each only
 * when some buffer has what it describes: a registry without metadata sends
 * none. false when out of memory. */
static bool meta_columns_alloc(const gd_registry *reg, Gpubuf__BufferColumns *c, size_t n) {
    if (reg->n_layouts) {
        c->dtype = malloc((n + 1) * sizeof(*c->dtype));
        c->ndim = malloc((n + 1) * sizeof(*c->ndim));
        c->shape = malloc((reg->layout_dims + 1) * sizeof(*c->shape));
        if (!c->dtype || !c->ndim || !c->shape)
            return false;
    }
    if (reg->n_user_meta && !(c->user_bytes = malloc((n + 1) * sizeof(*c->user_bytes))))
        return false;
    if (reg->n_leases && !(c->lease_left_ms = malloc((n + 1) * sizeof(*c->lease_left_ms))))
        return false;
    return true;
}

/* Element i of the metadata columns: buffer b's (now: gpubuf_now_ns()). */
static void meta_columns_put(const gd_registry *reg, Gpubuf__BufferColumns *c, size_t i,
                             const gd_buf *b, uint64_t now) {
    const gd_meta *m = b->meta;
    bool lay = m && m->has_layout;
    if (c->dtype) {
        c->dtype[i] = lay ? m->dtype.code | (uint32_t)m->dtype.bits << 8 |
                                (uint32_t)m->dtype.lanes << 16
                          : 0;
        c->ndim[i] = lay ? m->ndim + 1u : 0;
        for (uint32_t k = 0; lay && k < m->ndim && c->n_shape < reg->layout_dims; k++)
            c->shape[c->n_shape++] = m->dims[k];
        c->n_dtype = c->n_ndim = i + 1;
    }
    if (c->user_bytes) {
        c->user_bytes[i] = m ? m->user_len : 0;
        c->n_user_bytes = i + 1;
    }
    if (c->lease_left_ms) {
        c->lease_left_ms[i] = gd_registry_lease_left_ms(b, now);
        c->n_lease_left_ms = i + 1;
    }
}

/* The buffers as columns: n entries in each array, names NUL-separated.
 * Returns false when out of memory. The arrays are freed by columns_free. */
static bool fill_columns(const gd_context *ctx, Gpubuf__BufferColumns *c) {
    const gd_registry *reg = &ctx->reg;
    size_t n = reg->n_buffers, names = 0, i = 0;
    uint64_t now = gpubuf_now_ns();
    for (gd_buf *b = reg->by_id; b; b = b->hh_id.next)
        names += (b->name ? strlen(b->name) : 0) + 1;
    gpubuf__buffer_columns__init(c);
    c->id = malloc((n + 1) * sizeof(*c->id));
    c->size = malloc((n + 1) * sizeof(*c->size));
    c->offset = malloc((n + 1) * sizeof(*c->offset));
    c->slab_id = malloc((n + 1) * sizeof(*c->slab_id));
    c->pool = malloc((n + 1) * sizeof(*c->pool));
    c->state = malloc((n + 1) * sizeof(*c->state));
    c->refs = malloc((n + 1) * sizeof(*c->refs));
    c->owner_uid = malloc((n + 1) * sizeof(*c->owner_uid));
    c->names.data = malloc(names + 1);
    /* Only after a restart: a column of false says nothing. */
    if (ctx->restarts)
        c->restored = malloc((n + 1) * sizeof(*c->restored));
    if (!c->id || !c->size || !c->offset || !c->slab_id || !c->pool || !c->state || !c->refs ||
        !c->owner_uid || !c->names.data || (ctx->restarts && !c->restored) ||
        !meta_columns_alloc(reg, c, n))
        return false;
    uint8_t *np = c->names.data;
    for (gd_buf *b = reg->by_id; b && i < n; b = b->hh_id.next, i++) {
        size_t len = b->name ? strlen(b->name) : 0;
        memcpy(np, b->name ? b->name : "", len + 1);
        np += len + 1;
        c->id[i] = b->id;
        c->size[i] = b->size;
        c->offset[i] = b->blk.offset;
        c->slab_id[i] = b->blk.slab->id;
        c->state[i] = (uint32_t)b->state;
        c->refs[i] = b->refs;
        c->owner_uid[i] = b->owner_uid;
        if (c->restored)
            c->restored[i] = b->restored;
        c->pool[i] = 0;
        for (int p = 0; p < ctx->n_pools; p++)
            if (ctx->pools[p] == b->pool) {
                c->pool[i] = (uint32_t)p;
                break;
            }
        meta_columns_put(reg, c, i, b, now);
    }
    c->names.len = (size_t)(np - c->names.data);
    c->n_id = c->n_size = c->n_offset = c->n_slab_id = c->n_pool = c->n_state = c->n_refs =
        c->n_owner_uid = i;
    c->n_restored = c->restored ? i : 0;
    return true;
}

static void columns_free(Gpubuf__BufferColumns *c) {
    free(c->id);
    free(c->size);
    free(c->offset);
    free(c->slab_id);
    free(c->pool);
    free(c->state);
    free(c->refs);
    free(c->owner_uid);
    free(c->restored);
    free(c->names.data);
    free(c->dtype);
    free(c->ndim);
    free(c->shape);
    free(c->user_bytes);
    free(c->lease_left_ms);
}

/* A Counters message and everything it points to, in one block: no
 * allocation per element. */
typedef struct counters_msg {
    Gpubuf__Counters c;
    Gpubuf__RequestCounters rq[GD_REQ_TYPES];
    Gpubuf__RequestCounters *prq[GD_REQ_TYPES];
    Gpubuf__ErrorCounter er[GD_METRICS_MAX_CODES];
    Gpubuf__ErrorCounter *per[GD_METRICS_MAX_CODES];
    Gpubuf__PoolCounters pc[GPUBUF_MAX_POOLS];
    Gpubuf__PoolCounters *ppc[GPUBUF_MAX_POOLS];
    Gpubuf__NamedCounter refused[GD_REFUSALS], *prefused[GD_REFUSALS];
    Gpubuf__NamedCounter ended[GD_END_REASONS], *pended[GD_END_REASONS];
} counters_msg;

/* The context's counters and its pools' as a Counters message; strings
 * point at static names and pool names, arrays into ctx and o. */
static void fill_counters(gd_context *ctx, counters_msg *o) {
    const gd_metrics *m = &ctx->metrics;
    Gpubuf__Counters *c = &o->c;
    size_t n = 0;
    gpubuf__counters__init(c);
    for (int t = 0; t < GD_REQ_TYPES; t++) {
        /* "other" and the batches are left out while nothing of that type came. */
        if (t >= GD_REQ_OTHER && m->req[t].requests == 0)
            continue;
        Gpubuf__RequestCounters *r = &o->rq[n];
        gpubuf__request_counters__init(r);
        r->type = (char *)gd_metrics_type_names[t];
        r->requests = m->req[t].requests;
        r->errors = m->req[t].errors;
        r->duration_ns = m->req[t].duration_ns;
        r->n_duration_buckets = GD_LATENCY_BOUNDS + 1;
        r->duration_buckets = (uint64_t *)m->req[t].buckets;
        o->prq[n++] = r;
    }
    c->n_requests = n;
    c->requests = o->prq;
    c->n_bucket_bounds = GD_LATENCY_BOUNDS;
    c->bucket_bounds = (double *)gd_metrics_bounds;
    for (uint32_t i = 0; i < m->n_codes; i++) {
        gpubuf__error_counter__init(&o->er[i]);
        o->er[i].code = m->errors[i].code;
        o->er[i].count = m->errors[i].count;
        o->per[i] = &o->er[i];
    }
    c->n_errors = m->n_codes;
    c->errors = o->per;
    for (int i = 0; i < ctx->n_pools; i++) {
        const gd_pool *p = ctx->pools[i];
        Gpubuf__PoolCounters *x = &o->pc[i];
        gpubuf__pool_counters__init(x);
        x->pool = p->name;
        x->bytes_allocated = p->stats.bytes_allocated;
        x->bytes_freed = p->stats.bytes_freed;
        x->slabs_created = p->stats.slabs_created;
        x->slabs_destroyed = p->stats.slabs_destroyed;
        x->alloc_failures = p->stats.alloc_failures;
        o->ppc[i] = x;
    }
    c->n_pools = (size_t)ctx->n_pools;
    c->pools = o->ppc;
    for (int i = 0; i < GD_REFUSALS; i++) {
        gpubuf__named_counter__init(&o->refused[i]);
        o->refused[i].name = (char *)gd_metrics_refusal_names[i];
        o->refused[i].count = m->refused[i];
        o->prefused[i] = &o->refused[i];
    }
    c->n_refused = GD_REFUSALS;
    c->refused = o->prefused;
    n = 0;
    for (int i = GD_END_NONE + 1; i < GD_END_REASONS; i++) {
        gpubuf__named_counter__init(&o->ended[n]);
        o->ended[n].name = (char *)gd_metrics_end_names[i];
        o->ended[n].count = m->ended[i];
        o->pended[n] = &o->ended[n];
        n++;
    }
    c->n_disconnects = n;
    c->disconnects = o->pended;
    c->slab_imports = m->slab_imports;
    c->connections = m->connections;
    c->open_timeouts = m->open_timeouts;
}

/* A pool's publish rule as status shows it: "uid 1000, gid 27" ("" when
 * everyone the pool allows may publish; uid 0 always may). */
static void format_publishers(const gd_pool *p, char *out, size_t n) {
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; i < p->n_publish_uids + p->n_publish_gids && len < n; i++) {
        bool gid = i >= p->n_publish_uids;
        uint32_t v = gid ? p->publish_gids[i - p->n_publish_uids] : p->publish_uids[i];
        len += (size_t)snprintf(out + len, n - len, "%s%s %u", i ? ", " : "", gid ? "gid" : "uid",
                                (unsigned)v);
    }
}

#define PUBLISHERS_TEXT 1024 /* 64 entries of at most 16 bytes */

void gd_session_status(gd_session *s, uint64_t id, const Gpubuf__StatusRequest *q) {
    gd_context *ctx = s->ctx;
    gd_registry *reg = &ctx->reg;
    Gpubuf__Response resp = GPUBUF__RESPONSE__INIT;
    Gpubuf__StatusReply st = GPUBUF__STATUS_REPLY__INIT;
    Gpubuf__PoolStatus *pools = calloc((size_t)ctx->n_pools + 1, sizeof(*pools));
    Gpubuf__PoolStatus **ppools = calloc((size_t)ctx->n_pools + 1, sizeof(*ppools));
    bool columnar = q && q->columnar;
    Gpubuf__BufferColumns cols = GPUBUF__BUFFER_COLUMNS__INIT;
    size_t nrows = columnar ? 0 : (size_t)reg->n_buffers;
    buffer_msg *bufs = calloc(nrows + 1, sizeof(*bufs));
    Gpubuf__Buffer **pbufs = calloc(nrows + 1, sizeof(*pbufs));
    size_t n_cl = (size_t)ctx->n_sessions + reg->n_detached;
    Gpubuf__ClientStatus *cl = calloc(n_cl + 1, sizeof(*cl));
    Gpubuf__ClientStatus **pcl = calloc(n_cl + 1, sizeof(*pcl));
    counters_msg *counters = malloc(sizeof(*counters));
    char(*pubs)[PUBLISHERS_TEXT] = calloc((size_t)ctx->n_pools + 1, sizeof(*pubs));
    Gpubuf__BatchCounters bc[GD_BATCH_TYPES], *pbc[GD_BATCH_TYPES];
    size_t i = 0;
    if (!pools || !ppools || !bufs || !pbufs || !cl || !pcl || !counters || !pubs ||
        (columnar && !fill_columns(ctx, &cols))) {
        gd_session_reply_error(s, id, -ENOMEM, "out of memory");
        goto out;
    }
    for (int p = 0; p < ctx->n_pools; p++) {
        gd_pool *pool = ctx->pools[p];
        gpubuf__pool_status__init(&pools[p]);
        pools[p].name = pool->name;
        pools[p].kind = (Gpubuf__PoolKind)pool->be->kind;
        pools[p].device = pool->be->device;
        if (pool->be->has_uuid) {
            pools[p].device_uuid.data = pool->be->uuid;
            pools[p].device_uuid.len = 16;
        }
        pools[p].capacity = pool->capacity;
        pools[p].used = pool->used;
        pools[p].reserved = pool->reserved;
        pools[p].slabs = pool->n_slabs;
        pools[p].slab_size = pool->slab_size;
        pools[p].buffers = pool->n_blocks;
        pools[p].default_pool = pool == reg->default_pool;
        format_publishers(pool, pubs[p], sizeof(pubs[p]));
        pools[p].publishers = pubs[p];
        ppools[p] = &pools[p];
    }
    st.n_pools = (size_t)ctx->n_pools;
    st.pools = ppools;
    if (columnar)
        st.buffer_columns = &cols;
    for (gd_buf *b = reg->by_id; b && i < nrows; b = b->hh_id.next, i++) {
        gd_session_fill_buffer(&bufs[i], b);
        /* No slab message: status hands out no handles, and 100k nested
         * messages would double the cost of packing and unpacking. */
        bufs[i].buf.slab = NULL;
        pbufs[i] = &bufs[i].buf;
    }
    st.n_buffers = i;
    st.buffers = pbufs;
    i = 0;
    gd_session *x;
    DL_FOREACH(ctx->sessions, x) {
        if (x->io->closing(x->conn) || !x->holder)
            continue;
        gpubuf__client_status__init(&cl[i]);
        cl[i].session_id = x->holder->id;
        cl[i].pid = x->pid;
        cl[i].uid = x->uid;
        cl[i].gid = x->gid;
        cl[i].references = x->holder->n_refs;
        cl[i].buffers_held = HASH_CNT(hh, x->holder->refs);
        cl[i].kept_slabs = x->holder->n_kept;
        cl[i].waiting_opens = x->n_waiters;
        cl[i].read_only_references = x->holder->n_ro_refs;
        cl[i].name = x->name;
        pcl[i] = &cl[i];
        i++;
    }
    /* Restored sessions whose clients have not come back yet. */
    for (gd_holder *h = reg->holders; h && reg->n_detached && i < n_cl; h = h->hh.next) {
        if (!h->detached)
            continue;
        gpubuf__client_status__init(&cl[i]);
        cl[i].session_id = h->id;
        cl[i].pid = h->pid;
        cl[i].uid = h->uid;
        cl[i].gid = h->gid;
        cl[i].references = h->n_refs;
        cl[i].buffers_held = HASH_CNT(hh, h->refs);
        cl[i].read_only_references = h->n_ro_refs;
        cl[i].name = (char *)"";
        cl[i].detached = true;
        pcl[i] = &cl[i];
        i++;
    }
    st.n_clients = i;
    st.restarts = ctx->restarts;
    st.restored_buffers = ctx->restored_buffers;
    st.clients = pcl;
    fill_counters(ctx, counters);
    st.counters = &counters->c;
    Gpubuf__LeaseStatus leases = GPUBUF__LEASE_STATUS__INIT;
    leases.active = reg->n_leases;
    leases.expired = reg->leases_expired;
    leases.renewed = reg->leases_renewed;
    leases.max_ttl_ms = reg->quota.max_lease_ms ? reg->quota.max_lease_ms : UINT32_MAX;
    st.leases = &leases;
    for (int t = 0; t < GD_BATCH_TYPES; t++) {
        gpubuf__batch_counters__init(&bc[t]);
        bc[t].type = (char *)gd_metrics_type_names[GD_REQ_BATCH_OPEN + t];
        bc[t].items = ctx->metrics.batch[t].items;
        bc[t].item_errors = ctx->metrics.batch[t].item_errors;
        pbc[t] = &bc[t];
    }
    st.n_batches = GD_BATCH_TYPES;
    st.batches = pbc;
    st.uptime_ms = (gpubuf_now_ns() - ctx->started_ns) / 1000000u;
    st.version = (char *)GPUBUF_VERSION_STRING;
    resp.id = id;
    resp.body_case = GPUBUF__RESPONSE__BODY_STATUS_REPLY;
    resp.status_reply = &st;
    gd_session_send(s, &resp, -1);
out:
    columns_free(&cols);
    free(pools);
    free(ppools);
    free(bufs);
    free(pbufs);
    free(cl);
    free(pcl);
    free(counters);
    free(pubs);
}
