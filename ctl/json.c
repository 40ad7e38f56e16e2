/* gpubufctl's JSON: pools, buffers (with their metadata) and clients of a
 * status snapshot. */
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "layout.h"
#include "util.h"

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
        json_object_object_add(
            o, "default",
            json_object_new_boolean(s->default_pool && !strcmp(s->default_pool, p->name)));
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
        const char *e = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN |
                                                              JSON_C_TO_STRING_NOSLASHESCAPE);
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

#define EMIT_ARRAY(key, n, make)                                                                   \
    do {                                                                                           \
        printf("%s\"" key "\":[", first ? "" : ",");                                               \
        first = false;                                                                             \
        for (size_t i_ = 0; i_ < (n); i_++) {                                                      \
            if (i_)                                                                                \
                putchar(',');                                                                      \
            emit(make, flags);                                                                     \
        }                                                                                          \
        putchar(']');                                                                              \
    } while (0)

void print_json(const gpubuf_status *s, const char *cmd, bool pretty) {
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
