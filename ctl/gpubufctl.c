/* gpubufctl: look at a running gpubufd. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "gpubuf/gpubuf.h"
#include "layout.h"
#include "util.h"

enum { EXIT_USAGE = 2, EXIT_NO_DAEMON = 3, EXIT_REQUEST = 4 };

/* A string from the daemon or from the command line as printable, valid
 * UTF-8 (gpubuf_text_clean: a control character becomes "\x1b"): whatever
 * the daemon sent or the arguments hold, no escape sequence reaches the
 * terminal, no newline forges a row or a metric, and JSON parsers accept
 * the output. Every such string goes through here before it is printed.
 * Eight results are usable at once; longer strings than a path are cut. */
static const char *shown(const char *str) {
    static char ring[8][4 * 4096 + 8];
    static unsigned next;
    char *out = ring[next++ % 8];
    gpubuf_text_clean(out, sizeof(ring[0]), str, strlen(str));
    return out;
}

static json_object *pool_json(const gpubuf_status *s, size_t i) {
    const gpubuf_pool_info *p = &s->pools[i];
    {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "name", json_object_new_string(shown(p->name)));
        json_object_object_add(o, "kind", json_object_new_string(gpubuf_pool_kind_name(p->kind)));
        json_object_object_add(o, "device", json_object_new_int(p->device));
        json_object_object_add(o, "device_uuid", json_object_new_string(shown(p->device_uuid)));
        json_object_object_add(o, "capacity", json_object_new_uint64(p->capacity));
        json_object_object_add(o, "used", json_object_new_uint64(p->used));
        json_object_object_add(o, "reserved", json_object_new_uint64(p->reserved));
        json_object_object_add(o, "free", json_object_new_uint64(p->capacity - p->used));
        json_object_object_add(o, "slabs", json_object_new_int64(p->slabs));
        json_object_object_add(o, "slab_size", json_object_new_uint64(p->slab_size));
        json_object_object_add(o, "buffers", json_object_new_int64(p->buffers));
        json_object_object_add(o, "default",
                               json_object_new_boolean(s->default_pool &&
                                                       !strcmp(s->default_pool, p->name)));
        json_object_object_add(
            o, "publishers",
            json_object_new_string(s->pool_publishers ? shown(s->pool_publishers[i]) : ""));
        return o;
    }
}

/* A JSON string. Buffer and pool names are printable ASCII without quotes
 * or backslashes (the daemon allows A-Z a-z 0-9 . _ : / @ + -), which need no
 * escaping; anything else is made valid UTF-8 and escaped by json-c. */
static char *put_json_string(char *out, const char *str) {
    const char *p = str;
    while (*p && *p != '"' && *p != '\\' && (unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f)
        p++;
    if (*p) {
        json_object *o = json_object_new_string(shown(str));
        const char *e = json_object_to_json_string_ext(
            o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
        size_t n = strlen(e);
        memcpy(out, e, n);
        json_object_put(o);
        return out + n;
    }
    *out++ = '"';
    memcpy(out, str, (size_t)(p - str));
    out += p - str;
    *out++ = '"';
    return out;
}

static char *put_text(char *out, const char *s) {
    size_t n = strlen(s);
    memcpy(out, s, n);
    return out + n;
}

static char *put_u64(char *out, uint64_t v) {
    char tmp[20];
    int n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    while (n)
        *out++ = tmp[--n];
    return out;
}

/* Buffers can number 100k: each is formatted by hand into one line buffer
 * (printf took a third of gpubufctl's time at 100k buffers). Names are at
 * most 255 bytes and escaping at most sextuples them. */
/* "12.3s", "4m05s", "2h03m", "3d04h": what is left of a lease. */
static const char *format_left(uint64_t ms, char *out, size_t len) {
    uint64_t s = ms / 1000;
    if (ms < 60000)
        snprintf(out, len, "%.1fs", (double)ms / 1000.0);
    else if (s < 3600)
        snprintf(out, len, "%llum%02llus", (unsigned long long)(s / 60),
                 (unsigned long long)(s % 60));
    else if (s < 86400)
        snprintf(out, len, "%lluh%02llum", (unsigned long long)(s / 3600),
                 (unsigned long long)(s / 60 % 60));
    else
        snprintf(out, len, "%llud%02lluh", (unsigned long long)(s / 86400),
                 (unsigned long long)(s / 3600 % 24));
    return out;
}

/* The metadata keys of a buffer in JSON, present only when it has them:
 * "dtype" (its name), "dtype_code", "dtype_bits", "dtype_lanes", "shape",
 * "user_bytes", "lease_left_ms". */
static char *put_meta_json(char *o, const gpubuf_status_meta *m) {
    if (!m)
        return o;
    if (m->has_layout) {
        /* One name per dtype: the buffers of a snapshot mostly share a few. */
        static char name[32];
        static gpubuf_dtype last = {0, 0, 0};
        if (!name[0] || memcmp(&last, &m->dtype, sizeof(last))) {
            gpubuf_dtype_name(m->dtype, name, sizeof(name));
            last = m->dtype;
        }
        o = put_text(put_text(put_text(o, ",\"dtype\":\""), name), "\"");
        o = put_u64(put_text(o, ",\"dtype_code\":"), m->dtype.code);
        o = put_u64(put_text(o, ",\"dtype_bits\":"), m->dtype.bits);
        o = put_u64(put_text(o, ",\"dtype_lanes\":"), m->dtype.lanes);
        o = put_text(o, ",\"shape\":[");
        for (uint32_t k = 0; k < m->ndim; k++) {
            if (k)
                *o++ = ',';
            if (m->shape[k] < 0) /* the daemon never sends one; print it as it is */
                *o++ = '-';
            o = put_u64(o, m->shape[k] < 0 ? (uint64_t)0 - (uint64_t)m->shape[k]
                                           : (uint64_t)m->shape[k]);
        }
        *o++ = ']';
    }
    if (m->user_size)
        o = put_u64(put_text(o, ",\"user_bytes\":"), m->user_size);
    if (m->lease_left_ms)
        o = put_u64(put_text(o, ",\"lease_left_ms\":"), m->lease_left_ms);
    return o;
}

static void put_buffer_json(const gpubuf_status_buffer *b, const gpubuf_status_meta *m,
                            bool restored) {
    char line[4096 + 32 * 21 + 256], *o = line;
    o = put_u64(put_text(o, "{\"id\":"), b->id);
    o = put_json_string(put_text(o, ",\"name\":"), b->name);
    o = put_json_string(put_text(o, ",\"pool\":"), b->pool);
    o = put_u64(put_text(o, ",\"size\":"), b->size);
    o = put_text(put_text(put_text(o, ",\"state\":\""), gpubuf_state_name(b->state)), "\"");
    o = put_u64(put_text(o, ",\"refs\":"), b->refs);
    o = put_u64(put_text(o, ",\"owner_uid\":"), b->owner_uid);
    o = put_u64(put_text(o, ",\"slab\":"), b->slab_id);
    o = put_u64(put_text(o, ",\"offset\":"), b->offset);
    if (restored)
        o = put_text(o, ",\"restored\":true");
    o = put_meta_json(o, m);
    *o++ = '}';
    fwrite(line, 1, (size_t)(o - line), stdout);
}

static json_object *buffer_json(const gpubuf_status_buffer *b, const gpubuf_status_meta *m,
                                bool restored) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_uint64(b->id));
    json_object_object_add(o, "name", json_object_new_string(shown(b->name)));
    json_object_object_add(o, "pool", json_object_new_string(shown(b->pool)));
    json_object_object_add(o, "size", json_object_new_uint64(b->size));
    json_object_object_add(o, "state", json_object_new_string(gpubuf_state_name(b->state)));
    json_object_object_add(o, "refs", json_object_new_int64(b->refs));
    json_object_object_add(o, "owner_uid", json_object_new_int64(b->owner_uid));
    json_object_object_add(o, "slab", json_object_new_uint64(b->slab_id));
    json_object_object_add(o, "offset", json_object_new_uint64(b->offset));
    if (restored)
        json_object_object_add(o, "restored", json_object_new_boolean(1));
    if (m && m->has_layout) { /* the keys of put_meta_json() */
        char name[32];
        json_object *shape = json_object_new_array();
        gpubuf_dtype_name(m->dtype, name, sizeof(name));
        json_object_object_add(o, "dtype", json_object_new_string(name));
        json_object_object_add(o, "dtype_code", json_object_new_int(m->dtype.code));
        json_object_object_add(o, "dtype_bits", json_object_new_int(m->dtype.bits));
        json_object_object_add(o, "dtype_lanes", json_object_new_int(m->dtype.lanes));
        for (uint32_t k = 0; k < m->ndim; k++)
            json_object_array_add(shape, json_object_new_int64(m->shape[k]));
        json_object_object_add(o, "shape", shape);
    }
    if (m && m->user_size)
        json_object_object_add(o, "user_bytes", json_object_new_int64(m->user_size));
    if (m && m->lease_left_ms)
        json_object_object_add(o, "lease_left_ms", json_object_new_uint64(m->lease_left_ms));
    return o;
}

static json_object *batch_json(const gpubuf_batch_counters *b) {
    json_object *o = json_object_new_object();
    json_object_object_add(o, "type", json_object_new_string(shown(b->type)));
    json_object_object_add(o, "items", json_object_new_uint64(b->items));
    json_object_object_add(o, "item_errors", json_object_new_uint64(b->item_errors));
    return o;
}

static json_object *client_json(const gpubuf_client_info *c, bool detached) {
    {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "session", json_object_new_uint64(c->session_id));
        json_object_object_add(o, "pid", json_object_new_int(c->pid));
        json_object_object_add(o, "uid", json_object_new_int64(c->uid));
        json_object_object_add(o, "gid", json_object_new_int64(c->gid));
        json_object_object_add(o, "name", json_object_new_string(shown(c->name)));
        json_object_object_add(o, "references", json_object_new_int64(c->references));
        json_object_object_add(o, "buffers_held", json_object_new_int64(c->buffers_held));
        json_object_object_add(o, "kept_slabs", json_object_new_int64(c->kept_slabs));
        json_object_object_add(o, "read_only_references",
                               json_object_new_int64(c->read_only_references));
        if (detached)
            json_object_object_add(o, "detached", json_object_new_boolean(1));
        return o;
    }
}

/* JSON goes out one element at a time, each serialised by json-c: a
 * snapshot of 100k buffers never becomes one tree in memory. */
static void emit(json_object *o, int flags) {
    fputs(json_object_to_json_string_ext(o, flags), stdout);
    json_object_put(o);
}

#define EMIT_ARRAY(key, n, make)                                                               \
    do {                                                                                       \
        printf("%s\"" key "\":[", first ? "" : ",");                                          \
        first = false;                                                                         \
        for (size_t i_ = 0; i_ < (n); i_++) {                                                  \
            if (i_)                                                                            \
                putchar(',');                                                                  \
            emit(make, flags);                                                                 \
        }                                                                                      \
        putchar(']');                                                                          \
    } while (0)

static void print_json(const gpubuf_status *s, const char *cmd, bool pretty) {
    int flags = JSON_C_TO_STRING_NOSLASHESCAPE |
                (pretty ? JSON_C_TO_STRING_PRETTY : JSON_C_TO_STRING_PLAIN);
    bool all = strcmp(cmd, "status") == 0, first = true;
    putchar('{');
    if (all) {
        printf("\"version\":");
        emit(json_object_new_string(shown(s->version)), flags);
        printf(",\"uptime_ms\":%llu", (unsigned long long)s->uptime_ms);
        printf(",\"restarts\":%u,\"restored_buffers\":%u", s->restarts, s->restored_buffers);
        first = false;
    }
    if (all || !strcmp(cmd, "pools"))
        EMIT_ARRAY("pools", s->n_pools, pool_json(s, i_));
    if (all || !strcmp(cmd, "buffers")) {
        if (pretty) {
            EMIT_ARRAY("buffers", s->n_buffers,
                       buffer_json(&s->buffers[i_], s->buffer_meta ? &s->buffer_meta[i_] : NULL,
                                   s->buffer_restored && s->buffer_restored[i_]));
        } else {
            printf("%s\"buffers\":[", first ? "" : ",");
            first = false;
            for (size_t i = 0; i < s->n_buffers; i++) {
                if (i)
                    putchar(',');
                put_buffer_json(&s->buffers[i], s->buffer_meta ? &s->buffer_meta[i] : NULL,
                                s->buffer_restored && s->buffer_restored[i]);
            }
            putchar(']');
        }
    }
    if (all || !strcmp(cmd, "clients"))
        EMIT_ARRAY("clients", s->n_clients,
                   client_json(&s->clients[i_], s->client_detached && s->client_detached[i_]));
    if (all)
        EMIT_ARRAY("batches", s->counters.n_batches, batch_json(&s->counters.batches[i_]));
    puts("}");
}

static void print_pools(const gpubuf_status *s) {
    char a[32], b[32], c[32], d[32];
    printf("%-12s %-9s %-6s %11s %11s %11s %6s %8s  %s\n", "POOL", "KIND", "DEVICE", "CAPACITY",
           "USED", "FREE", "SLABS", "BUFFERS", "UUID");
    for (size_t i = 0; i < s->n_pools; i++) {
        const gpubuf_pool_info *p = &s->pools[i];
        char dev[16];
        if (p->device < 0)
            snprintf(dev, sizeof(dev), "-");
        else
            snprintf(dev, sizeof(dev), "%d", p->device);
        printf("%-12s %-9s %-6s %11s %11s %11s %6u %8u  %s\n", shown(p->name), gpubuf_pool_kind_name(p->kind), dev,
               gpubuf_format_size(p->capacity, a, sizeof(a)),
               gpubuf_format_size(p->used, b, sizeof(b)),
               gpubuf_format_size(p->capacity - p->used, c, sizeof(c)), p->slabs, p->buffers,
               p->device_uuid[0] ? shown(p->device_uuid) : "-");
        (void)d;
    }
    /* Names are per pool: say where a name without a pool is looked up,
     * and which pools let only some uids name buffers. */
    if (s->default_pool && s->default_pool[0])
        printf("names without a pool (not /POOL/NAME) are looked up in pool '%s'\n",
               shown(s->default_pool));
    for (size_t i = 0; s->pool_publishers && i < s->n_pools; i++)
        if (s->pool_publishers[i][0])
            printf("pool '%s': only %s (and root) may name buffers\n", shown(s->pools[i].name),
                   shown(s->pool_publishers[i]));
}

/* ", restarted N time(s), M buffer(s) restored" after a restart, else "". */
static const char *restarted(const gpubuf_status *s) {
    static char buf[96];
    if (!s->restarts)
        return "";
    snprintf(buf, sizeof(buf), ", restarted %u time(s), %u buffer(s) restored", s->restarts,
             s->restored_buffers);
    return buf;
}

static void print_buffers(const gpubuf_status *s) {
    char a[32], lay[48], left[32];
    printf("%-8s %-24s %-10s %11s %-10s %5s %6s %6s %-20s %s\n", "ID", "NAME", "POOL", "SIZE",
           "STATE", "REFS", "SLAB", "OWNER", "LAYOUT", "LEASE");
    for (size_t i = 0; i < s->n_buffers; i++) {
        const gpubuf_status_buffer *b = &s->buffers[i];
        const gpubuf_status_meta *m = s->buffer_meta ? &s->buffer_meta[i] : NULL;
        if (m && m->has_layout)
            gpubuf_layout_format(m->dtype, m->ndim, m->shape, lay, sizeof(lay));
        else
            snprintf(lay, sizeof(lay), "-");
        if (m && m->lease_left_ms)
            format_left(m->lease_left_ms, left, sizeof(left));
        else
            snprintf(left, sizeof(left), "-");
        printf("%-8llu %-24s %-10s %11s %-10s %5u %6llu %6u %-20s %s%s\n",
               (unsigned long long)b->id, b->name[0] ? shown(b->name) : "(anonymous)",
               shown(b->pool), gpubuf_format_size(b->size, a, sizeof(a)),
               gpubuf_state_name(b->state), b->refs, (unsigned long long)b->slab_id, b->owner_uid,
               lay, left, s->buffer_restored && s->buffer_restored[i] ? "  restored" : "");
    }
}

static void print_clients(const gpubuf_status *s) {
    printf("%-8s %-8s %-6s %-16s %10s %9s %8s\n", "SESSION", "PID", "UID", "NAME", "REFERENCES",
           "READ-ONLY", "BUFFERS");
    for (size_t i = 0; i < s->n_clients; i++) {
        const gpubuf_client_info *c = &s->clients[i];
        bool det = s->client_detached && s->client_detached[i];
        printf("%-8llu %-8d %-6u %-16s %10u %9u %8u\n", (unsigned long long)c->session_id, c->pid,
               c->uid, det ? "(not resumed)" : shown(c->name), c->references,
               c->read_only_references, c->buffers_held);
    }
}

/* Prometheus text format: one family per figure, HELP and TYPE first;
 * label values made printable UTF-8, then escaped as the format asks
 * (backslash, quote, newline). */
static void put_label(const char *key, const char *val, bool first) {
    printf("%s%s=\"", first ? "" : ",", key);
    for (const char *p = shown(val); *p; p++) {
        if (*p == '\\' || *p == '"')
            printf("\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", stdout);
        else
            putchar(*p);
    }
    putchar('"');
}

static void family(const char *name, const char *type, const char *help) {
    printf("# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

typedef uint64_t (*pool_field)(const gpubuf_pool_info *p);
static uint64_t f_capacity(const gpubuf_pool_info *p) { return p->capacity; }
static uint64_t f_used(const gpubuf_pool_info *p) { return p->used; }
static uint64_t f_reserved(const gpubuf_pool_info *p) { return p->reserved; }
static uint64_t f_slabs(const gpubuf_pool_info *p) { return p->slabs; }
static uint64_t f_buffers(const gpubuf_pool_info *p) { return p->buffers; }

typedef uint64_t (*pool_counter)(const gpubuf_pool_counters *p);
static uint64_t c_alloc(const gpubuf_pool_counters *p) {
    return p->bytes_allocated;
}
static uint64_t c_freed(const gpubuf_pool_counters *p) {
    return p->bytes_freed;
}
static uint64_t c_created(const gpubuf_pool_counters *p) {
    return p->slabs_created;
}
static uint64_t c_destroyed(const gpubuf_pool_counters *p) {
    return p->slabs_destroyed;
}
static uint64_t c_failures(const gpubuf_pool_counters *p) {
    return p->alloc_failures;
}

static void print_named(const char *name, const char *label, const char *help,
                        const gpubuf_named_counter *v, size_t n) {
    family(name, "counter", help);
    for (size_t i = 0; i < n; i++) {
        printf("%s{", name);
        put_label(label, v[i].name, true);
        printf("} %llu\n", (unsigned long long)v[i].count);
    }
}

static void print_one(const char *name, const char *help, uint64_t v) {
    family(name, "counter", help);
    printf("%s %llu\n", name, (unsigned long long)v);
}

/* Counters (_total, base units) and one latency histogram per request type. */
static void print_counters(const gpubuf_counters *k) {
    static const struct {
        const char *name, *help;
        pool_counter get;
    } pc[] = {
        {"gpubuf_pool_allocated_bytes_total", "Bytes of buffers carved from the pool.", c_alloc},
        {"gpubuf_pool_freed_bytes_total", "Bytes of buffers given back to the pool.", c_freed},
        {"gpubuf_pool_slabs_created_total", "Slabs allocated from the backend.", c_created},
        {"gpubuf_pool_slabs_destroyed_total", "Empty slabs given back to the backend.",
         c_destroyed},
        {"gpubuf_pool_alloc_failures_total",
         "Allocations the pool refused (full, too large, backend error).", c_failures},
    };
    for (size_t f = 0; f < sizeof(pc) / sizeof(pc[0]); f++) {
        family(pc[f].name, "counter", pc[f].help);
        for (size_t i = 0; i < k->n_pools; i++) {
            printf("%s{", pc[f].name);
            put_label("pool", k->pools[i].pool, true);
            printf("} %llu\n", (unsigned long long)pc[f].get(&k->pools[i]));
        }
    }
    for (int errors = 0; errors <= 1; errors++) {
        const char *name = errors ? "gpubuf_request_errors_total" : "gpubuf_requests_total";
        family(name, "counter",
               errors ? "Requests answered with an error, by type." : "Requests handled, by type.");
        for (size_t i = 0; i < k->n_requests; i++) {
            printf("%s{", name);
            put_label("type", k->requests[i].type, true);
            printf("} %llu\n",
                   (unsigned long long)(errors ? k->requests[i].errors : k->requests[i].requests));
        }
    }
    family("gpubuf_errors_total", "counter", "Error replies, by error code.");
    for (size_t i = 0; i < k->n_errors; i++) {
        printf("gpubuf_errors_total{");
        put_label("code", gpubuf_err_name(k->errors[i].code), true);
        printf("} %llu\n", (unsigned long long)k->errors[i].count);
    }
    family("gpubuf_request_duration_seconds", "histogram",
           "Time from decoding a request to queuing its reply, by type.");
    for (size_t i = 0; i < k->n_requests; i++) {
        const gpubuf_request_counters *r = &k->requests[i];
        uint64_t cum = 0;
        for (size_t b = 0; b < r->n_buckets; b++) {
            char le[32];
            cum += r->buckets[b];
            if (b < k->n_bounds)
                snprintf(le, sizeof(le), "%g", k->bucket_bounds[b]);
            else
                snprintf(le, sizeof(le), "+Inf");
            printf("gpubuf_request_duration_seconds_bucket{");
            put_label("type", r->type, true);
            put_label("le", le, false);
            printf("} %llu\n", (unsigned long long)cum);
        }
        printf("gpubuf_request_duration_seconds_sum{");
        put_label("type", r->type, true);
        printf("} %.9f\n", (double)r->duration_ns / 1e9);
        printf("gpubuf_request_duration_seconds_count{");
        put_label("type", r->type, true);
        printf("} %llu\n", (unsigned long long)r->requests);
    }
    print_one("gpubuf_slab_imports_total",
              "Slabs handed to a client that did not have them mapped.", k->slab_imports);
    print_one("gpubuf_connections_total", "Connections accepted.", k->connections);
    print_named("gpubuf_connections_refused_total", "reason", "Connections refused, by reason.",
                k->refused, k->n_refused);
    print_named("gpubuf_disconnects_total", "reason", "Sessions ended, by reason.", k->disconnects,
                k->n_disconnects);
    print_one("gpubuf_open_timeouts_total", "Waiting opens that expired.", k->open_timeouts);
    for (int errors = 0; errors <= 1 && k->n_batches; errors++) {
        const char *name = errors ? "gpubuf_batch_item_errors_total" : "gpubuf_batch_items_total";
        family(name, "counter",
               errors ? "Items of batch requests that failed, by batch type."
                      : "Items of batch requests handled, by batch type.");
        for (size_t i = 0; i < k->n_batches; i++) {
            printf("%s{", name);
            put_label("type", k->batches[i].type, true);
            printf("} %llu\n", (unsigned long long)(errors ? k->batches[i].item_errors
                                                           : k->batches[i].items));
        }
    }
}

/* "batch items: open 1000 (2 failed), release 998, ..." when any came. */
static void print_batches(const gpubuf_counters *k) {
    uint64_t any = 0;
    for (size_t i = 0; i < k->n_batches; i++)
        any += k->batches[i].items;
    if (!any)
        return;
    printf("batch items:");
    for (size_t i = 0; i < k->n_batches; i++) {
        const gpubuf_batch_counters *b = &k->batches[i];
        const char *t = shown(b->type);
        if (!strncmp(t, "batch_", 6))
            t += 6;
        printf("%s %s %llu", i ? "," : "", t, (unsigned long long)b->items);
        if (b->item_errors)
            printf(" (%llu failed)", (unsigned long long)b->item_errors);
    }
    putchar('\n');
}

/* Leases: how many, the soonest expiry, and the counters. */
static void print_leases(const gpubuf_status *s) {
    uint64_t soonest = 0;
    if (!s->max_lease_ms) /* an older daemon: no leases */
        return;
    for (size_t i = 0; s->buffer_meta && i < s->n_buffers; i++) {
        uint64_t left = s->buffer_meta[i].lease_left_ms;
        if (left && (!soonest || left < soonest))
            soonest = left;
    }
    family("gpubuf_leases", "gauge", "Buffers with a lease.");
    printf("gpubuf_leases %u\n", s->leases_active);
    family("gpubuf_lease_soonest_expiry_seconds", "gauge",
           "Seconds until the next lease expires (0: no lease).");
    printf("gpubuf_lease_soonest_expiry_seconds %.3f\n", (double)soonest / 1000.0);
    print_one("gpubuf_leases_expired_total", "Leases that expired (their buffers were deleted).",
              s->leases_expired);
    print_one("gpubuf_leases_renewed_total", "Lease renewals.", s->leases_renewed);
}

static void print_metrics(const gpubuf_status *s) {
    static const struct {
        const char *name, *help;
        pool_field get;
    } pf[] = {
        {"gpubuf_pool_capacity_bytes", "Most bytes the pool may hold in slabs.", f_capacity},
        {"gpubuf_pool_used_bytes", "Bytes in live buffers.", f_used},
        {"gpubuf_pool_reserved_bytes", "Bytes held in slabs.", f_reserved},
        {"gpubuf_pool_slabs", "Slabs allocated from the backend.", f_slabs},
        {"gpubuf_pool_buffers", "Live buffers in the pool.", f_buffers},
    };
    for (size_t k = 0; k < sizeof(pf) / sizeof(pf[0]); k++) {
        family(pf[k].name, "gauge", pf[k].help);
        for (size_t i = 0; i < s->n_pools; i++) {
            const gpubuf_pool_info *p = &s->pools[i];
            char dev[16];
            snprintf(dev, sizeof(dev), "%d", p->device);
            printf("%s{", pf[k].name);
            put_label("pool", p->name, true);
            put_label("kind", gpubuf_pool_kind_name(p->kind), false);
            put_label("device", dev, false);
            put_label("uuid", p->device_uuid, false);
            printf("} %llu\n", (unsigned long long)pf[k].get(p));
        }
    }
    uint64_t by_state[4] = {0}, refs = 0, ro_refs = 0;
    for (size_t i = 0; i < s->n_clients; i++)
        ro_refs += s->clients[i].read_only_references;
    for (size_t i = 0; i < s->n_buffers; i++) {
        if (s->buffers[i].state >= 1 && s->buffers[i].state <= 3)
            by_state[s->buffers[i].state]++;
        refs += s->buffers[i].refs;
    }
    family("gpubuf_buffers", "gauge", "Buffers by state.");
    for (int st = 1; st <= 3; st++)
        printf("gpubuf_buffers{state=\"%s\"} %llu\n", gpubuf_state_name((gpubuf_state)st),
               (unsigned long long)by_state[st]);
    family("gpubuf_references", "gauge", "References held by all clients.");
    printf("gpubuf_references %llu\n", (unsigned long long)refs);
    family("gpubuf_read_only_references", "gauge", "References opened read-only.");
    printf("gpubuf_read_only_references %llu\n", (unsigned long long)ro_refs);
    family("gpubuf_clients", "gauge", "Connected clients (this query included).");
    printf("gpubuf_clients %zu\n", s->n_clients);
    family("gpubuf_uptime_seconds", "gauge", "Seconds since gpubufd started.");
    printf("gpubuf_uptime_seconds %.3f\n", (double)s->uptime_ms / 1000.0);
    family("gpubuf_restarts_total", "counter",
           "Times gpubufd restarted over the state it kept (buffers survived).");
    printf("gpubuf_restarts_total %u\n", s->restarts);
    family("gpubuf_restored_buffers", "gauge", "Buffers the last start of gpubufd restored.");
    printf("gpubuf_restored_buffers %u\n", s->restored_buffers);
    if (s->counters.present)
        print_counters(&s->counters);
    print_leases(s);
}

typedef struct filters {
    const char *pool, *name_prefix, *state;
    long pid, uid;
} filters;

/* Keep the entries that match, in place. */
static void apply_filters(gpubuf_status *s, const filters *f) {
    size_t n = 0;
    for (size_t i = 0; i < s->n_pools; i++)
        if (!f->pool || !strcmp(s->pools[i].name, f->pool))
            s->pools[n++] = s->pools[i];
    s->n_pools = n;
    n = 0;
    for (size_t i = 0; i < s->n_buffers; i++) {
        const gpubuf_status_buffer *b = &s->buffers[i];
        if ((f->pool && strcmp(b->pool, f->pool)) ||
            (f->name_prefix && strncmp(b->name, f->name_prefix, strlen(f->name_prefix))) ||
            (f->state && strcmp(gpubuf_state_name(b->state), f->state)))
            continue;
        if (s->buffer_restored) /* the library's array: kept in step */
            ((uint8_t *)s->buffer_restored)[n] = s->buffer_restored[i];
        if (s->buffer_meta)
            s->buffer_meta[n] = s->buffer_meta[i];
        s->buffers[n++] = *b;
    }
    s->n_buffers = n;
    n = 0;
    for (size_t i = 0; i < s->n_clients; i++) {
        const gpubuf_client_info *c = &s->clients[i];
        if ((f->pid >= 0 && c->pid != f->pid) || (f->uid >= 0 && (long)c->uid != f->uid))
            continue;
        if (s->client_detached)
            ((uint8_t *)s->client_detached)[n] = s->client_detached[i];
        s->clients[n++] = *c;
    }
    s->n_clients = n;
}

static void usage(FILE *f) {
    fprintf(f,
            "Usage: gpubufctl [OPTIONS] [COMMAND]\n\n"
            "Commands:\n"
            "  status             pools, buffers and clients (the default)\n"
            "  pools              pools only\n"
            "  buffers            buffers only\n"
            "  clients            connected clients only\n"
            "  metrics            Prometheus text format (for node-exporter's textfile\n"
            "                     collector)\n"
            "  delete NAME...     unpublish buffers by name (NAME in the default pool or\n"
            "                     --pool, /POOL/NAME in POOL; --id: by id); only the owner\n"
            "                     or root may\n\n"
            "Options:\n"
            "  -s, --socket PATH   daemon socket (default $GPUBUF_SOCKET or %s)\n"
            "  -j, --json          one line of JSON\n"
            "      --pretty        indented JSON\n"
            "  -w, --watch[=SEC]   refresh every SEC seconds (default 2) until interrupted,\n"
            "                      with request and allocation rates; redraws in place on\n"
            "                      a terminal, appends snapshots otherwise\n"
            "  -o, --output FILE   write to FILE (replaced atomically) instead of stdout\n"
            "      --pool NAME     only this pool and its buffers\n"
            "      --name PREFIX   only buffers whose name starts with PREFIX\n"
            "      --state STATE   only buffers in STATE (allocated, sealed, deleted)\n"
            "      --pid PID       only this client process\n"
            "      --uid UID       only clients of this user\n"
            "      --id            delete: the arguments are buffer ids\n"
            "  -h, --help          show this help\n\n"
            "Exit status: 0 ok, 2 usage, 3 daemon unreachable, 4 request failed.\n",
            GPUBUF_DEFAULT_SOCKET);
}

static const char *const commands[] = {"status",  "pools",   "buffers",
                                       "clients", "metrics", "delete"};

/* A usage error: name what was wrong and where to read more; exit 2. */
__attribute__((format(printf, 1, 2), noreturn)) static void usage_error(const char *fmt, ...) {
    va_list ap;
    fputs("gpubufctl: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (see gpubufctl --help)\n", stderr);
    exit(EXIT_USAGE);
}

/* Rates between two snapshots of the counters. */
typedef struct rates {
    bool have; /* a previous snapshot exists */
    uint64_t at_ns, requests, allocated, freed;
} rates;

static uint64_t sum_requests(const gpubuf_counters *k) {
    uint64_t n = 0;
    for (size_t i = 0; i < k->n_requests; i++)
        n += k->requests[i].requests;
    return n;
}

static uint64_t sum_pool(const gpubuf_counters *k, pool_counter get) {
    uint64_t n = 0;
    for (size_t i = 0; i < k->n_pools; i++)
        n += get(&k->pools[i]);
    return n;
}

/* "requests 12.5/s, allocated 1.0 MiB/s, freed 0 B/s" since the last call. */
static void print_rates(rates *rt, const gpubuf_status *s) {
    uint64_t now = gpubuf_now_ns(), req = sum_requests(&s->counters),
             al = sum_pool(&s->counters, c_alloc), fr = sum_pool(&s->counters, c_freed);
    char a[32], f[32];
    if (!s->counters.present) {
        printf("(this gpubufd sends no counters: no rates)\n");
    } else if (!rt->have || now <= rt->at_ns) {
        printf("requests -/s, allocated -/s, freed -/s (rates from the next refresh)\n");
    } else {
        double dt = (double)(now - rt->at_ns) / 1e9;
        printf("requests %.1f/s, allocated %s/s, freed %s/s\n", (double)(req - rt->requests) / dt,
               gpubuf_format_size((uint64_t)((double)(al - rt->allocated) / dt), a, sizeof(a)),
               gpubuf_format_size((uint64_t)((double)(fr - rt->freed) / dt), f, sizeof(f)));
    }
    *rt = (rates){true, now, req, al, fr};
}

static bool pool_exists(const gpubuf_status *s, const char *name) {
    for (size_t i = 0; i < s->n_pools; i++)
        if (!strcmp(s->pools[i].name, name))
            return true;
    return false;
}

static void list_pools(const gpubuf_status *s, char *out, size_t len) {
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < s->n_pools && n < len; i++)
        n += (size_t)snprintf(out + n, len - n, "%s%s", i ? ", " : "", shown(s->pools[i].name));
    if (s->n_pools == 0)
        snprintf(out, len, "(none)");
}

typedef struct view {
    const char *cmd;
    bool json, pretty, watch, redraw;
    rates rt;
} view;

static int show(gpubuf_client *c, view *v, const filters *f) {
    gpubuf_status *s;
    int r = gpubuf_status_get(c, &s);
    if (r < 0) {
        fprintf(stderr, "gpubufctl: status: %s\n", shown(gpubuf_last_error_message()));
        return EXIT_REQUEST;
    }
    if (f->pool && !pool_exists(s, f->pool)) {
        char pools[512];
        list_pools(s, pools, sizeof(pools));
        fprintf(stderr, "gpubufctl: no pool named '%s'; pools: %s\n", shown(f->pool), pools);
        gpubuf_status_free(s);
        return EXIT_USAGE;
    }
    apply_filters(s, f);
    const char *cmd = v->cmd;
    bool all = strcmp(cmd, "status") == 0;
    if (v->redraw)
        fputs("\033[H\033[2J", stdout); /* home, clear: the view redraws in place */
    if (!strcmp(cmd, "metrics")) {
        print_metrics(s);
    } else if (v->json) {
        print_json(s, cmd, v->pretty);
    } else {
        if (v->watch) {
            time_t now = time(NULL);
            char when[32];
            strftime(when, sizeof(when), "%H:%M:%S", localtime(&now));
            printf("%s%s  ", v->redraw ? "" : "--- ", when);
            print_rates(&v->rt, s);
        }
        if (all) {
            printf("gpubufd %s, up %llu s%s\n", shown(s->version),
                   (unsigned long long)(s->uptime_ms / 1000), restarted(s));
            print_batches(&s->counters);
            putchar('\n');
        }
        if (all || !strcmp(cmd, "pools"))
            print_pools(s);
        if (all)
            putchar('\n');
        if (all || !strcmp(cmd, "buffers"))
            print_buffers(s);
        if (all)
            putchar('\n');
        if (all || !strcmp(cmd, "clients"))
            print_clients(s);
    }
    fflush(stdout);
    gpubuf_status_free(s);
    return ferror(stdout) ? EXIT_REQUEST : 0;
}

/* delete NAME... or delete --id ID...: every target is tried; exit 4 when
 * one fails. */
static int delete_targets(gpubuf_client *c, char **targets, int n, bool by_id,
                          const char *pool) {
    gpubuf_lookup o = {.pool = pool};
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const char *t = targets[i];
        int r;
        if (by_id) {
            char *end;
            errno = 0;
            unsigned long long id = strtoull(t, &end, 10);
            if (!*t || *end || errno || t[0] == '-')
                usage_error("bad buffer id '%s': give the number from the ID column of "
                            "'gpubufctl buffers'",
                            shown(t));
            r = gpubuf_delete_with(c, NULL, id, &o);
        } else {
            r = gpubuf_delete_with(c, t, 0, &o);
        }
        if (r == 0) {
            printf("deleted %s%s\n", by_id ? "buffer " : "", shown(t));
            continue;
        }
        fprintf(stderr, "gpubufctl: delete %s: %s", shown(t), shown(gpubuf_last_error_message()));
        if (r == -ENOENT && !by_id && t[strspn(t, "0123456789")] == '\0')
            fprintf(stderr, " (to delete buffer id %s, use 'gpubufctl delete --id %s')", t, t);
        fputc('\n', stderr);
        rc = EXIT_REQUEST;
    }
    return rc;
}

static long parse_long(const char *s, const char *opt, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end || v < 0 || errno)
        usage_error("bad %s value '%s': give %s", opt, shown(s), what);
    return v;
}

static double parse_interval(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*s == '\0' || *end || !(v > 0) || v > 86400)
        usage_error("bad --watch value '%s': give seconds, a number above 0 and at most 86400 "
                    "(e.g. --watch=0.5)",
                    shown(s));
    return v;
}

/* --output FILE: each snapshot goes into a new file made next to FILE, by
 * exclusive creation under a random name (mkostemp: O_CREAT|O_EXCL, so
 * nothing planted there, a symbolic link included, is opened or followed),
 * and is renamed over FILE when complete: a reader (node-exporter) never
 * sees half a file, and whatever was at FILE, a symbolic link too, is
 * replaced, not written through. The file gets mode 0644 less the umask. */
static char out_tmp[4096 + 32]; /* the file being written; "" when none */
static mode_t out_mode;

/* SIGINT (the end of --watch), SIGTERM, SIGHUP: remove the file being
 * written, then die of the signal as before. */
static void output_signal(int sig) {
    if (out_tmp[0])
        unlink(out_tmp);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Block those signals (old: the mask to restore) while out_tmp and the
 * file it names change together: the handler never sees half a name. */
static void block_signals(sigset_t *old) {
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, old);
}

static void output_init(void) {
    mode_t mask = umask(0);
    umask(mask);
    out_mode = 0644 & ~mask;
    signal(SIGINT, output_signal);
    signal(SIGTERM, output_signal);
    signal(SIGHUP, output_signal);
    /* Into a file: fully buffered from the first snapshot on. */
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
}

/* Complete the file: with r == 0 rename it over path, else (or when that
 * fails) remove it. Returns r, or EXIT_REQUEST with the reason said. */
static int output_end(const char *path, int r) {
    int err = 0;
    sigset_t old;
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout))
        err = errno ? errno : EIO;
    block_signals(&old);
    if (r == 0 && err == 0 && rename(out_tmp, path) < 0)
        err = errno;
    if (r != 0 || err != 0)
        unlink(out_tmp);
    out_tmp[0] = '\0';
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (r == 0 && err) {
        fprintf(stderr, "gpubufctl: cannot write %s: %s\n", shown(path), strerror(err));
        return EXIT_REQUEST;
    }
    return r;
}

/* Point stdout at a new file next to path. 0, or -1 with the reason said. */
static int output_begin(const char *path) {
    char tmpl[sizeof(out_tmp)], dir[sizeof(out_tmp)];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    int dir_len = slash ? (int)(slash - path) : 0, n, fd, err;
    sigset_t old;
    snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : dir_len, slash ? path : ".");
    n = snprintf(tmpl, sizeof(tmpl), "%.*s.%s.XXXXXX", slash ? dir_len + 1 : 0, path, base);
    if (n < 0 || (size_t)n >= sizeof(tmpl)) {
        fprintf(stderr, "gpubufctl: cannot write %s: the path is longer than %zu bytes\n",
                shown(path), sizeof(tmpl) - 16);
        return -1;
    }
    block_signals(&old);
    fd = mkostemp(tmpl, O_CLOEXEC);
    err = errno;
    if (fd >= 0)
        memcpy(out_tmp, tmpl, (size_t)n + 1);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (fd < 0) {
        fprintf(stderr,
                "gpubufctl: cannot write %s: cannot create a file in directory %s: %s (the "
                "directory must exist and be writable by this user)\n",
                shown(path), shown(dir), strerror(err));
        return -1;
    }
    if (fchmod(fd, out_mode) < 0 || fflush(stdout) != 0 ||
        (fd != STDOUT_FILENO && dup2(fd, STDOUT_FILENO) < 0)) {
        fprintf(stderr, "gpubufctl: cannot write %s: %s\n", shown(out_tmp), strerror(errno));
        close(fd);
        output_end(path, EXIT_REQUEST);
        return -1;
    }
    if (fd != STDOUT_FILENO)
        close(fd);
    clearerr(stdout);
    return 0;
}

int main(int argc, char **argv) {
    enum { OPT_PRETTY = 256, OPT_POOL, OPT_NAME, OPT_STATE, OPT_PID, OPT_UID, OPT_ID };
    static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"pretty", no_argument, NULL, OPT_PRETTY},
                                         {"watch", optional_argument, NULL, 'w'},
                                         {"output", required_argument, NULL, 'o'},
                                         {"pool", required_argument, NULL, OPT_POOL},
                                         {"name", required_argument, NULL, OPT_NAME},
                                         {"state", required_argument, NULL, OPT_STATE},
                                         {"pid", required_argument, NULL, OPT_PID},
                                         {"uid", required_argument, NULL, OPT_UID},
                                         {"id", no_argument, NULL, OPT_ID},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *sock = NULL, *cmd = "status", *output = NULL;
    bool by_id = false;
    double watch = 0;
    view v = {0};
    filters f = {NULL, NULL, NULL, -1, -1};
    int opt, r;
    gpubuf_client *c;
    opterr = 0; /* errors are reported here, naming the option */
    while ((opt = getopt_long(argc, argv, ":s:jw::o:h", opts, NULL)) != -1) {
        switch (opt) {
        case 's': sock = optarg; break;
        case 'j': v.json = true; break;
        case OPT_PRETTY: v.json = v.pretty = true; break;
        case 'w':
            if (optarg) {
                watch = parse_interval(optarg);
            } else if (optind < argc && argv[optind][0] &&
                       strspn(argv[optind], "0123456789.") == strlen(argv[optind])) {
                /* "-w 1": the interval as its own word. */
                watch = parse_interval(argv[optind++]);
            } else {
                watch = 2.0;
            }
            break;
        case 'o': output = optarg; break;
        case OPT_POOL: f.pool = optarg; break;
        case OPT_NAME: f.name_prefix = optarg; break;
        case OPT_STATE:
            if (strcmp(optarg, "allocated") && strcmp(optarg, "sealed") &&
                strcmp(optarg, "deleted"))
                usage_error("bad --state value '%s': give allocated, sealed or deleted",
                            shown(optarg));
            f.state = optarg;
            break;
        case OPT_PID: f.pid = parse_long(optarg, "--pid", "a process id"); break;
        case OPT_UID: f.uid = parse_long(optarg, "--uid", "a numeric user id"); break;
        case OPT_ID: by_id = true; break;
        case 'h': usage(stdout); return 0;
        case ':': usage_error("option '%s' needs a value", shown(argv[optind - 1]));
        default:
            if (optopt) {
                char o[3] = {'-', (char)optopt, '\0'};
                usage_error("unknown option '%s'", shown(o));
            }
            usage_error("unknown option '%s'", shown(argv[optind - 1]));
        }
    }
    if (optind < argc)
        cmd = argv[optind++];
    bool known = false;
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        known |= !strcmp(cmd, commands[i]);
    if (!known)
        usage_error("unknown command '%s'; commands: status, pools, buffers, clients, metrics, "
                    "delete",
                    shown(cmd));
    bool del = !strcmp(cmd, "delete");
    if (del && optind == argc)
        usage_error("delete needs the name of a buffer (or --id and its id)");
    if (!del && optind < argc)
        usage_error("'%s' takes no arguments, got '%s'", cmd, shown(argv[optind]));
    if (by_id && !del)
        usage_error("--id goes with delete only");
    if (del && (watch > 0 || output || v.json))
        usage_error("delete takes no --watch, --output or --json");
    if ((r = gpubuf_connect(sock, &c)) < 0) {
        fprintf(stderr, "gpubufctl: %s\n", shown(gpubuf_last_error_message()));
        return EXIT_NO_DAEMON;
    }
    if (del) {
        r = delete_targets(c, argv + optind, argc - optind, by_id, f.pool);
        gpubuf_disconnect(c);
        return r;
    }
    v.cmd = cmd;
    v.watch = watch > 0;
    /* A terminal shows one live view; a pipe or a file gets one snapshot
     * after the other. */
    v.redraw = v.watch && !output && !v.json && strcmp(cmd, "metrics") && isatty(STDOUT_FILENO);
    if (output)
        output_init();
    for (;;) {
        if (output && output_begin(output) < 0) {
            r = EXIT_REQUEST;
            break;
        }
        r = show(c, &v, &f);
        if (output)
            r = output_end(output, r);
        if (r != 0 || !v.watch)
            break;
        struct timespec ts = {(time_t)watch, (long)((watch - (double)(time_t)watch) * 1e9)};
        nanosleep(&ts, NULL);
    }
    gpubuf_disconnect(c);
    return r;
}
