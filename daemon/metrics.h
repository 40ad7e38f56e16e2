/* Counters of gpubufd: requests by type with a latency histogram, error
 * replies by code, slab imports, connections accepted, refused and ended by
 * reason, open timeouts. Plain data in the daemon context: the session room
 * counts where it dispatches requests and queues replies, the daemon
 * assembly counts what the server reports; pools count their own bytes and
 * slabs (pool.h). A status reply carries them all. */
#ifndef GPUBUFD_METRICS_H
#define GPUBUFD_METRICS_H

#include <stdint.h>

#include "registry.h"
#include "settings.h"

/* Request types, in the order status reports them. */
typedef enum gd_req_type {
    GD_REQ_HELLO,
    GD_REQ_ALLOC,
    GD_REQ_SEAL,
    GD_REQ_OPEN,
    GD_REQ_RELEASE,
    GD_REQ_UNMAP,
    GD_REQ_DELETE,
    GD_REQ_STAT,
    GD_REQ_STATUS,
    GD_REQ_RENEW,
    GD_REQ_OTHER,
    GD_REQ_BATCH_OPEN, /* batches: one request, many items (batch_items counts them) */
    GD_REQ_BATCH_RELEASE,
    GD_REQ_BATCH_ALLOC,
    GD_REQ_BATCH_SEAL,
    GD_REQ_BATCH_DELETE,
    GD_REQ_TYPES
} gd_req_type;

#define GD_BATCH_TYPES (GD_REQ_TYPES - GD_REQ_BATCH_OPEN)

/* Why a session ended, as status reports it. */
typedef enum gd_end_reason {
    GD_END_NONE, /* not ending (yet) */
    GD_END_CLOSED,
    GD_END_PROTOCOL,
    GD_END_TIMEOUT,
    GD_END_BACKLOG,
    GD_END_SHUTDOWN,
    GD_END_OTHER,
    GD_END_REASONS
} gd_end_reason;

/* Latency buckets: upper bounds 1 us .. 1 s, plus one above the last. */
#define GD_LATENCY_BOUNDS 19
/* Distinct error codes counted: more than the daemon ever sends (a code
 * beyond the table is dropped, not miscounted). */
#define GD_METRICS_MAX_CODES 48

typedef struct gd_metrics {
    struct {
        uint64_t requests, errors, duration_ns;
        uint64_t buckets[GD_LATENCY_BOUNDS + 1];
    } req[GD_REQ_TYPES];
    struct {
        int code;
        uint64_t count;
    } errors[GD_METRICS_MAX_CODES];
    uint32_t n_codes;
    uint64_t slab_imports;
    uint64_t connections;
    uint64_t open_timeouts;
    struct {
        uint64_t items, item_errors;
    } batch[GD_BATCH_TYPES]; /* by type - GD_REQ_BATCH_OPEN */
    uint64_t refused[GD_REFUSALS];
    uint64_t ended[GD_END_REASONS];
} gd_metrics;

/* Names as status reports them. */
extern const char *const gd_metrics_type_names[GD_REQ_TYPES];
extern const char *const gd_metrics_end_names[GD_END_REASONS];
extern const char *const gd_metrics_refusal_names[GD_REFUSALS];
/* Upper bounds of the latency buckets, seconds. */
extern const double gd_metrics_bounds[GD_LATENCY_BOUNDS];

/* One request of type t handled in ns nanoseconds. */
void gd_metrics_request(gd_metrics *m, gd_req_type t, uint64_t ns);
/* A reply with status code < 0, to a request of type t (or -1: none). */
void gd_metrics_error(gd_metrics *m, int t, int code);
/* Holder h was handed a map handle for b's slab (alloc, open): counts an
 * import when h had nothing else in that slab and did not keep it mapped. */
void gd_metrics_handed(gd_metrics *m, gd_holder *h, const gd_buf *b);

#endif
