/* vmm-cold: cold opens of cuda-vmm slabs, read-write against read-only. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* The pool the running phase works on. */
static const char *g_phase_pool;

/* Warm-up and measured counts of one cold-open series, per variant. */
static void cold_counts(uint64_t slab, int *warm, int *measured) {
    int small = slab <= (8ull << 20);
    *warm = small ? 20 : 4;
    *measured = small ? (g_quick ? 50 : 200) : (g_quick ? 10 : 40);
}

/* Open number i of a series is read-only when this is 1: pairs (2k, 2k+1)
 * take turns at going first, so neither kind always follows the other. */
static int ro_turn(int i) {
    return (i & 1) ^ ((i >> 1) & 1);
}

/* Slab size of a pool, from the daemon's status; exits unless the pool
 * exists and is of the expected kind. */
static uint64_t pool_slab(gpubuf_client *c, const char *pool, gpubuf_pool_kind kind) {
    gpubuf_status *s;
    uint64_t slab = 0;
    int found = 0;
    CHECK(gpubuf_status_get(c, &s));
    for (size_t i = 0; i < s->n_pools; i++) {
        if (strcmp(s->pools[i].name, pool) == 0) {
            found = s->pools[i].kind == kind ? 1 : -1;
            slab = s->pools[i].slab_size;
        }
    }
    gpubuf_status_free(s);
    if (found != 1) {
        fprintf(stderr, "bench: pool '%s' %s\n", pool,
                found ? "is not of the kind this phase needs" : "does not exist");
        _exit(1);
    }
    return slab;
}

/* Cold open of cuda-vmm slabs: every buffer fills one slab of its pool, so
 * each open imports, reserves, maps and sets access for a slab this process
 * has not mapped. Opens alternate between read-write and read-only
 * (GPUBUF_OPEN_READONLY) in one process, on distinct slabs. */
static void vmm_cold_setup(void) {
    gpubuf_client *c = conn();
    uint64_t slab = pool_slab(c, g_phase_pool, GPUBUF_POOL_CUDA_VMM);
    int warm, measured;
    char name[128];
    cold_counts(slab, &warm, &measured);
    for (int i = 0; i < 2 * (warm + measured); i++) {
        gpubuf_buffer *b;
        snprintf(name, sizeof(name), "/%s/vcold/%d", g_phase_pool, i);
        CHECK(gpubuf_alloc(c, g_phase_pool, slab, name, &b));
        CHECK(gpubuf_seal(b));
        CHECK(gpubuf_release(b));
    }
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
}

static void vmm_cold_open(void) {
    gpubuf_client *c = conn();
    uint64_t slab = pool_slab(c, g_phase_pool, GPUBUF_POOL_CUDA_VMM);
    int warm, measured, nrw = 0, nro = 0;
    cold_counts(slab, &warm, &measured);
    int n = 2 * (warm + measured);
    gpubuf_buffer **b = calloc((size_t)n, sizeof(*b));
    double *rw = calloc((size_t)measured, sizeof(double));
    double *ro = calloc((size_t)measured, sizeof(double));
    char name[128], key[128];
    if (!b || !rw || !ro)
        _exit(1);
    for (int i = 0; i < n; i++) {
        int r_o = ro_turn(i);
        snprintf(name, sizeof(name), "/%s/vcold/%d", g_phase_pool, i);
        double a = now_us();
        CHECK(gpubuf_open_with(c, name, 0,
                               &(gpubuf_lookup){.flags = r_o ? GPUBUF_OPEN_READONLY : 0}, &b[i]));
        volatile uint64_t addr = gpubuf_buffer_device_ptr(b[i]);
        (void)addr;
        double t = now_us() - a;
        if (gpubuf_buffer_read_only(b[i]) != r_o) {
            fprintf(stderr, "bench: %s opened %s\n", name, r_o ? "writable" : "read-only");
            _exit(1);
        }
        if (i < 2 * warm)
            continue;
        if (r_o)
            ro[nro++] = t;
        else
            rw[nrw++] = t;
    }
    unsigned long long mib = (unsigned long long)(slab >> 20);
    snprintf(key, sizeof(key), "vmm_open_cold_%lluMiB_slab", mib);
    report(key, rw, nrw);
    snprintf(key, sizeof(key), "vmm_open_cold_ro_%lluMiB_slab", mib);
    report(key, ro, nro);
    for (int i = 0; i < n; i++) {
        CHECK(gpubuf_release(b[i]));
        snprintf(name, sizeof(name), "/%s/vcold/%d", g_phase_pool, i);
        CHECK(gpubuf_delete(c, name));
    }
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
    free(b);
    free(rw);
    free(ro);
}

int vmm_cold_phase(const char *pool) {
    g_phase_pool = pool;
    return run_child(vmm_cold_setup) || run_child(vmm_cold_open);
}
