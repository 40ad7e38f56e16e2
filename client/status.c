/* libgpubuf-client: the status snapshot (gpubuf_status_get), decoded from the
 * daemon's status reply: pools, buffers (columns or one message each),
 * clients, counters; its strings point into the reply, which it keeps. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "util.h"

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
    int r;
    sr.columnar = true; /* a daemon without columns answers with buffers */
    req.body_case = GPUBUF__REQUEST__BODY_STATUS;
    req.status = &sr;
    pthread_mutex_lock(&c->lock);
    r = gpubuf__rpc_reply_locked(c, &req, GPUBUF__RESPONSE__BODY_STATUS_REPLY, &resp);
    pthread_mutex_unlock(&c->lock);
    if (r < 0)
        return r;
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
        GPUBUF_COPY_BUFFER_FIELDS(o, m);
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
        copy_batches(&s->counters, st) < 0) {
        gpubuf_status_free(s); /* resp is not attached yet */
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

GPUBUF_EXTERN int gpubuf_status_get(gpubuf_client *c, gpubuf_status **ret) {
    gpubuf__clear_error();
    GPUBUF_CHECK(c && ret, -EINVAL,
                 "gpubuf_status_get needs a connection and a place for the snapshot");
    int r = status_get_call(c, ret);
    return gpubuf__result(r);
}

/* ---- one entry of a snapshot, gathered from its parallel arrays ------------- */

/* The check every _at accessor starts with: s and ret given, i below n. */
#define STATUS_AT_CHECK(what, n)                                                                   \
    do {                                                                                           \
        GPUBUF_CHECK(s != NULL && ret != NULL, -EINVAL,                                            \
                     "gpubuf_status_%s_at needs a snapshot and a place for the entry", what);      \
        GPUBUF_CHECK(i < (n), GPUBUF_ERANGE, "no %s %zu in a snapshot of %zu", what, i, (n));      \
    } while (0)

GPUBUF_EXTERN int gpubuf_status_pool_at(const gpubuf_status *s, size_t i,
                                        gpubuf_status_pool_item *ret) {
    gpubuf__clear_error();
    STATUS_AT_CHECK("pool", s->n_pools);
    *ret = (gpubuf_status_pool_item){.pool = s->pools[i],
                                     .publishers = s->pool_publishers[i],
                                     .is_default = strcmp(s->pools[i].name, s->default_pool) == 0};
    return gpubuf__result(0);
}

GPUBUF_EXTERN int gpubuf_status_buffer_at(const gpubuf_status *s, size_t i,
                                          gpubuf_status_buffer_item *ret) {
    gpubuf__clear_error();
    STATUS_AT_CHECK("buffer", s->n_buffers);
    *ret = (gpubuf_status_buffer_item){.buffer = s->buffers[i]};
    if (s->buffer_restored)
        ret->restored = s->buffer_restored[i];
    if (s->buffer_meta)
        ret->meta = s->buffer_meta[i];
    return gpubuf__result(0);
}

GPUBUF_EXTERN int gpubuf_status_client_at(const gpubuf_status *s, size_t i,
                                          gpubuf_status_client_item *ret) {
    gpubuf__clear_error();
    STATUS_AT_CHECK("client", s->n_clients);
    *ret = (gpubuf_status_client_item){.client = s->clients[i],
                                       .detached = s->client_detached ? s->client_detached[i] : 0};
    return gpubuf__result(0);
}
