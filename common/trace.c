#include "trace.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

#define TRACE_MAX (1u << 20)

typedef struct trace_rec {
    uint64_t session, request, ns;
    int32_t type;
    uint32_t step;
} trace_rec;

_Atomic int gpubuf_trace_state_ = -1; /* -1: not read yet, 0: off, 1: on */
static trace_rec *recs;
static atomic_size_t n_recs;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_mutex_t dump_lock = PTHREAD_MUTEX_INITIALIZER;

static void trace_init(void) {
    const char *v = getenv("GPUBUF_TRACE_TIMING");
    bool on = v && strcmp(v, "1") == 0 && (recs = calloc(TRACE_MAX, sizeof(*recs)));
    atomic_store_explicit(&gpubuf_trace_state_, on ? 1 : 0, memory_order_release);
}

bool gpubuf_trace_on_first(void) {
    pthread_once(&once, trace_init);
    return atomic_load_explicit(&gpubuf_trace_state_, memory_order_acquire) == 1;
}

void gpubuf_trace(uint64_t session, uint64_t request, int type, gpubuf_trace_step step,
                  uint64_t ns) {
    if (!gpubuf_trace_on())
        return;
    size_t i = atomic_fetch_add(&n_recs, 1);
    if (i >= TRACE_MAX)
        return;
    recs[i] = (trace_rec){session, request, ns ? ns : gpubuf_now_ns(), type, (uint32_t)step};
}

void gpubuf_trace_dump(void) {
    if (!gpubuf_trace_on())
        return;
    pthread_mutex_lock(&dump_lock);
    size_t n = atomic_exchange(&n_recs, 0);
    if (n > TRACE_MAX)
        n = TRACE_MAX;
    const char *dir = getenv("GPUBUF_TRACE_DIR");
    char path[4096];
    snprintf(path, sizeof(path), "%s/gpubuf-trace-%d.txt", dir && *dir ? dir : "/tmp",
             (int)getpid());
    FILE *f = n ? fopen(path, "a") : NULL;
    for (size_t i = 0; f && i < n; i++)
        fprintf(f, "%llu %llu %d %u %llu\n", (unsigned long long)recs[i].session,
                (unsigned long long)recs[i].request, (int)recs[i].type, recs[i].step,
                (unsigned long long)recs[i].ns);
    if (f)
        fclose(f);
    pthread_mutex_unlock(&dump_lock);
}

static uint64_t tag_session, tag_request;
static int tag_type;

void gpubuf_trace_set_tag(uint64_t session, uint64_t request, int type) {
    tag_session = session;
    tag_request = request;
    tag_type = type;
}

bool gpubuf_trace_tag(uint64_t *ret_session, uint64_t *ret_request, int *ret_type) {
    if (!tag_request)
        return false;
    *ret_session = tag_session;
    *ret_request = tag_request;
    *ret_type = tag_type;
    return true;
}
