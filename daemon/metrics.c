/* Counters of gpubufd (see metrics.h). */
#include "metrics.h"

const char *const gd_metrics_type_names[GD_REQ_TYPES] = {
    "hello",         "alloc",         "seal",        "open",        "release",
    "unmap",         "delete",        "stat",        "status",      "renew",
    "other",         "batch_open",    "batch_release", "batch_alloc", "batch_seal",
    "batch_delete"};
const char *const gd_metrics_end_names[GD_END_REASONS] = {
    "none", "closed", "protocol", "timeout", "backlog", "shutdown", "other"};
const char *const gd_metrics_refusal_names[GD_REFUSALS] = {"max_clients", "max_clients_per_uid",
                                                           "shutting_down", "out_of_fds"};
const double gd_metrics_bounds[GD_LATENCY_BOUNDS] = {
    1e-6,   2.5e-6, 5e-6, 1e-5,   2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3,
    2.5e-3, 5e-3,   1e-2, 2.5e-2, 5e-2,   0.1,  0.25, 0.5,    1.0};

void gd_metrics_request(gd_metrics *m, gd_req_type t, uint64_t ns) {
    int b = 0;
    /* Compare in nanoseconds: a bound of 2.5 us is 2500 ns. */
    while (b < GD_LATENCY_BOUNDS && (double)ns > gd_metrics_bounds[b] * 1e9)
        b++;
    m->req[t].requests++;
    m->req[t].duration_ns += ns;
    m->req[t].buckets[b]++;
}

void gd_metrics_error(gd_metrics *m, int t, int code) {
    if (t >= 0 && t < GD_REQ_TYPES)
        m->req[t].errors++;
    for (uint32_t i = 0; i < m->n_codes; i++)
        if (m->errors[i].code == code) {
            m->errors[i].count++;
            return;
        }
    if (m->n_codes < GD_METRICS_MAX_CODES) {
        m->errors[m->n_codes].code = code;
        m->errors[m->n_codes++].count = 1;
    }
}

void gd_metrics_handed(gd_metrics *m, gd_holder *h, const gd_buf *b) {
    gd_holder_slab *hs;
    uint64_t id = b->blk.slab->id;
    HASH_FIND(hh, h->slabs, &id, sizeof(id), hs);
    /* The reference just taken is its only one in the slab, and the slab
     * was not kept mapped: the client maps it now. */
    if (hs && hs->buffers == 1 && !hs->kept && gd_registry_holder_count(h, b->id) == 1)
        m->slab_imports++;
}
