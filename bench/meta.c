/* meta: array metadata and leases at 100k buffers: the daemon's memory per
 * buffer and the time of a status, against buffers without metadata. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

enum { META_N = 100000 };

/* META_N named 1 KiB buffers prefix/i, each (with_meta) a float32 [16,16]
 * layout and a 1-hour lease, no user bytes; sealed and released. */
static void meta_fill(const char *prefix, int with_meta) {
    gpubuf_client *c = conn();
    gpubuf_buffer *b;
    gpubuf_layout l;
    memset(&l, 0, sizeof(l));
    l.dtype = (gpubuf_dtype){.code = 2, .bits = 32, .lanes = 1};
    l.ndim = 2;
    l.shape[0] = l.shape[1] = 16;
    gpubuf_meta m = {.layout = &l, .ttl_ms = 3600 * 1000};
    char name[64];
    for (int i = 0; i < META_N; i++) {
        snprintf(name, sizeof(name), "%s/%d", prefix, i);
        CHECK(gpubuf_alloc_with(c, g_pool, 1024, name, with_meta ? &m : NULL, &b));
        CHECK(gpubuf_seal(b));
        CHECK(gpubuf_release(b));
    }
    CHECK(gpubuf_flush(c));
    gpubuf_disconnect(c);
}

static void meta_fill_with(void) {
    meta_fill("meta/lay", 1);
}

static void meta_fill_plain(void) {
    meta_fill("meta/plain", 0);
}

static void meta_delete(void) {
    delete_prefix(META_N, "meta/lay");
}

/* The phase leaves the daemon as it found it. */
static void meta_delete_plain(void) {
    delete_prefix(META_N, "meta/plain");
}

static const char *g_meta_label;

/* gpubuf_status_get() (request, columns, unpack) 11 times; the median, and
 * that the snapshot has the metadata it should. */
static void meta_status(void) {
    gpubuf_client *c = conn();
    double t[11];
    size_t with = 0;
    for (int i = 0; i < 11; i++) {
        gpubuf_status *s;
        double a = now_us();
        CHECK(gpubuf_status_get(c, &s));
        t[i] = now_us() - a;
        with = 0;
        for (size_t k = 0; k < s->n_buffers; k++)
            with += s->buffer_meta[k].has_layout && s->buffer_meta[k].lease_left_ms > 0;
        gpubuf_status_free(s);
    }
    qsort(t, 11, sizeof(double), cmpd);
    printf("meta_status_%s_ms_median %.2f\n", g_meta_label, t[5] / 1000.0);
    printf("meta_status_%s_buffers_with_layout_and_lease %zu\n", g_meta_label, with);
    gpubuf_disconnect(c);
}

/* 100k buffers with a layout and a lease: the daemon's RSS growth per buffer
 * and the time of a status; then the same for 100k buffers without
 * metadata (after the first are deleted), the anchor of the status time. */
int meta_phase(void) {
    long rss0 = daemon_rss_kib();
    if (run_child(meta_fill_with))
        return 1;
    long rss1 = daemon_rss_kib();
    printf("meta_daemon_rss_per_buffer_layout_lease_bytes %.1f\n",
           (double)(rss1 - rss0) * 1024.0 / META_N);
    g_meta_label = "100k_layout_lease";
    if (run_child(meta_status))
        return 1;
    ctl_json_time("meta_status_json_100k_layout_lease_ms_median");
    if (run_child(meta_delete) || run_child(meta_fill_plain))
        return 1;
    g_meta_label = "100k_plain";
    if (run_child(meta_status))
        return 1;
    ctl_json_time("meta_status_json_100k_plain_ms_median");
    return run_child(meta_delete_plain) ? 1 : 0;
}
