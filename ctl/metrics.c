/* gpubufctl's Prometheus metrics (text exposition format) of a status
 * snapshot: the families docs/operations.md lists. */
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctl.h"
#include "layout.h"
#include "util.h"

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
static uint64_t f_capacity(const gpubuf_pool_info *p) {
    return p->capacity;
}
static uint64_t f_used(const gpubuf_pool_info *p) {
    return p->used;
}
static uint64_t f_reserved(const gpubuf_pool_info *p) {
    return p->reserved;
}
static uint64_t f_slabs(const gpubuf_pool_info *p) {
    return p->slabs;
}
static uint64_t f_buffers(const gpubuf_pool_info *p) {
    return p->buffers;
}

uint64_t c_alloc(const gpubuf_pool_counters *p) {
    return p->bytes_allocated;
}
uint64_t c_freed(const gpubuf_pool_counters *p) {
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
            printf("} %llu\n",
                   (unsigned long long)(errors ? k->batches[i].item_errors : k->batches[i].items));
        }
    }
}

/* "batch items: open 1000 (2 failed), release 998, ..." when any came. */
void print_batches(const gpubuf_counters *k) {
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

void print_metrics(const gpubuf_status *s) {
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
