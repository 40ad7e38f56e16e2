/* vmm-warm: warm opens of cuda-ipc, cuda-vmm and read-only cuda-vmm
 * buffers, interleaved. */
#include <stdlib.h>

#include "bench.h"

/* Warm open, interleaved: a cuda-ipc pool (--pool), a cuda-vmm pool
 * (--vmm-pool) and the same cuda-vmm buffers opened read-only. The measuring
 * connection holds one view of each kind for the whole phase, so every timed
 * open finds its slab mapped (read-only mappings are separate mappings, and
 * never kept after their last view). */
enum { WARM_BUFS = 32 };

static void vmm_warm_setup(void) {
    gpubuf_client *c = conn();
    const char *pools[2] = {g_pool, g_vmm_pool};
    char name[128];
    for (int p = 0; p < 2; p++) {
        for (int i = -1; i < WARM_BUFS; i++) {
            gpubuf_buffer *b;
            if (i < 0)
                snprintf(name, sizeof(name), "/%s/vwarm/keep", pools[p]);
            else
                snprintf(name, sizeof(name), "/%s/vwarm/%d", pools[p], i);
            CHECK(gpubuf_alloc(c, pools[p], 1 << 20, name, &b));
            CHECK(gpubuf_seal(b));
            CHECK(gpubuf_release(b));
        }
    }
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
}

typedef struct warm_variant {
    const char *key, *pool;
    unsigned flags;
    gpubuf_pool_kind kind;
    gpubuf_buffer *keep;
    char names[WARM_BUFS + 1][128];
    int n;
    double *t;
} warm_variant;

/* Open the variant's kept view and list the buffers that share its slab. */
static void warm_prepare(gpubuf_client *c, warm_variant *v, int total) {
    gpubuf_buffer_info ki, bi;
    char name[128];
    snprintf(name, sizeof(name), "/%s/vwarm/keep", v->pool);
    CHECK(gpubuf_open_with(c, name, 0, &(gpubuf_lookup){.flags = v->flags}, &v->keep));
    if (gpubuf_buffer_pool_kind(v->keep) != v->kind) {
        fprintf(stderr, "bench: pool '%s' is not of the kind %s needs\n", v->pool, v->key);
        _exit(1);
    }
    CHECK(gpubuf_stat(c, name, &ki));
    v->n = 0;
    for (int i = 0; i < WARM_BUFS; i++) {
        snprintf(name, sizeof(name), "/%s/vwarm/%d", v->pool, i);
        CHECK(gpubuf_stat(c, name, &bi));
        if (bi.slab_id == ki.slab_id)
            snprintf(v->names[v->n++], sizeof(v->names[0]), "%s", name);
    }
    if (v->n == 0) /* none shares it: open the kept buffer itself again */
        snprintf(v->names[v->n++], sizeof(v->names[0]), "/%s/vwarm/keep", v->pool);
    printf("%s_buffers_in_kept_slab %d\n", v->key, v->n);
    v->t = calloc((size_t)total, sizeof(double));
    if (!v->t)
        _exit(1);
}

static void vmm_warm_open(void) {
    enum { N = 3000, WARM = 300 };
    int n = g_quick ? 1000 : N;
    gpubuf_client *c = conn();
    static warm_variant v[3];
    v[0] = (warm_variant){.key = "warm_open_ipc", .pool = g_pool, .kind = GPUBUF_POOL_CUDA_IPC};
    v[1] = (warm_variant){.key = "warm_open_vmm", .pool = g_vmm_pool, .kind = GPUBUF_POOL_CUDA_VMM};
    v[2] = (warm_variant){.key = "warm_open_vmm_ro", .pool = g_vmm_pool,
                          .flags = GPUBUF_OPEN_READONLY, .kind = GPUBUF_POOL_CUDA_VMM};
    for (int k = 0; k < 3; k++)
        warm_prepare(c, &v[k], n + WARM);
    for (int i = 0; i < n + WARM; i++) {
        for (int j = 0; j < 3; j++) {
            warm_variant *w = &v[(i + j) % 3]; /* each kind takes each place in turn */
            gpubuf_buffer *b;
            double a = now_us();
            CHECK(gpubuf_open_with(c, w->names[i % w->n], 0, &(gpubuf_lookup){.flags = w->flags},
                                   &b));
            volatile uint64_t addr = gpubuf_buffer_device_ptr(b);
            (void)addr;
            w->t[i] = now_us() - a;
            CHECK(gpubuf_release(b));
        }
    }
    for (int k = 0; k < 3; k++) {
        report(v[k].key, v[k].t + WARM, n);
        CHECK(gpubuf_release(v[k].keep));
        free(v[k].t);
    }
    /* The setup's buffers, both pools. */
    for (int k = 0; k < 2; k++) {
        char name[128];
        for (int i = -1; i < WARM_BUFS; i++) {
            if (i < 0)
                snprintf(name, sizeof(name), "/%s/vwarm/keep", v[k].pool);
            else
                snprintf(name, sizeof(name), "/%s/vwarm/%d", v[k].pool, i);
            CHECK(gpubuf_delete(c, name));
        }
    }
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
}

int vmm_warm_phase(void) {
    return run_child(vmm_warm_setup) || run_child(vmm_warm_open);
}
