/* libFuzzer target: a saved state from a hostile (or broken) previous run,
 * through the daemon's own restore (gd_state_open() on memfds, two host
 * pools), then the registry's invariants (fuzz/state_check.h): ids unique
 * and never wrapping, buffers inside their slabs and slabs inside their
 * pools, reference counts that add up, names unique, next ids above every
 * id in use, new holders, buffers and slabs with fresh ids; then a
 * restored session resumes, and the invariants hold again.
 *
 * Input: u32 (little-endian) L, then L bytes of snapshot, then the journal.
 * Both are records as [u16 length][packed StateRecord]; this target frames
 * them with their lengths and checksums (a mutated checksum would stop
 * almost every input at the first record) behind a valid header in
 * state-0. With bit 30 of L set, the state has a version 2 header: a
 * record whose first byte is 0 is a group of fixed entries of any version
 * from 2 to 4 (daemon/state_record.h: the decoder takes every kind it
 * knows whatever the header says, so the entries of versions 3 and 4 are
 * fed this way too); else of version 1, as a predecessor wrote it.
 * With bit 31 of L set, the journal bytes go in as they are, after the
 * framed snapshot: torn and bad frames. Every slab record of a
 * size that fits gets a sealed memfd named slab-ID (at most 8), as kept
 * fds would be; one more slab fd no record names is kept too. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "context.h"
#include "core_helpers.h"
#include "gpubuf_state.pb-c.h"
#include "log.h"
#include "state.h"
#include "state_check.h"
#include "state_record.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_KEPT 12
#define MAX_SLABS 8
#define POOL_CAP (64ull << 20)

typedef struct input {
    gd_kept_fd kept[MAX_KEPT];
    size_t n_kept, n_slabs;
    uint8_t *state;
    size_t len;
    bool v2;
} input;

#define GEN 2 /* the generation of the slot this target writes */

static void die(const char *what) {
    fprintf(stderr, "fuzz_state: %s\n", what);
    abort();
}

static void keep(input *in, const char *name, int fd) {
    if (fd < 0 || in->n_kept == MAX_KEPT)
        die("cannot keep an fd");
    snprintf(in->kept[in->n_kept].name, sizeof(in->kept[0].name), "%s", name);
    in->kept[in->n_kept++].fd = fd;
}

/* A slab record's memory as the host backend kept it. */
static void slab_fd(input *in, const Gpubuf__StateSlab *s) {
    char name[64];
    snprintf(name, sizeof(name), "slab-%llu", (unsigned long long)s->id);
    if (in->n_slabs == MAX_SLABS || s->size == 0 || s->size > POOL_CAP || s->size % 4096)
        return;
    for (size_t i = 0; i < in->n_kept; i++)
        if (strcmp(in->kept[i].name, name) == 0)
            return;
    int fd = memfd_create("fuzz-slab", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, (off_t)s->size) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0)
        die("memfd");
    keep(in, name, fd);
    in->n_slabs++;
}

/* Frame the [u16 length][record] sequence p[0..n) into in->state. */
static void frame(input *in, const uint8_t *p, size_t n) {
    while (n >= 2) {
        size_t len = (size_t)p[0] | (size_t)p[1] << 8;
        p += 2;
        n -= 2;
        if (len > n)
            len = n;
        Gpubuf__StateRecord **recs = NULL;
        size_t k = 0;
        if (in->v2 && len && p[0] == GD_SE_GROUP) {
            if (gd_se_decode(p + 1, len - 1, &recs, &k) < 0)
                k = 0;
        } else {
            Gpubuf__StateRecord *rec = gpubuf__state_record__unpack(NULL, len, p);
            if (rec && (recs = malloc(sizeof(*recs))))
                recs[k++] = rec;
            else if (rec)
                gpubuf__state_record__free_unpacked(rec, NULL);
        }
        for (size_t i = 0; i < k; i++) {
            if (recs[i]->rec_case == GPUBUF__STATE_RECORD__REC_SLAB)
                slab_fd(in, recs[i]->slab);
            gpubuf__state_record__free_unpacked(recs[i], NULL);
        }
        free(recs);
        in->len += in->v2 ? gd_state_frame_v2(in->state + in->len, GEN, p, (uint32_t)len)
                          : gd_state_frame(in->state + in->len, p, (uint32_t)len);
        p += len;
        n -= len;
    }
}

static void setup(input *in, const uint8_t *data, size_t size) {
    uint32_t l = 0;
    memset(in, 0, sizeof(*in));
    if (size >= 4) {
        l = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
            (uint32_t)data[3] << 24;
        data += 4;
        size -= 4;
    }
    bool raw = l >> 31;
    in->v2 = (l >> 30) & 1;
    size_t snap = l & 0x3fffffffu;
    if (snap > size)
        snap = size;
    /* Framing adds 8 bytes per record of at least 2 input bytes. */
    in->state = malloc(GD_STATE_HEADER + 4 * size + 64);
    if (!in->state)
        die("out of memory");
    if (in->v2)
        gd_state_header_v2(in->state, GEN);
    else
        gd_state_header(in->state, GEN);
    in->len = GD_STATE_HEADER;
    frame(in, data, snap);
    if (raw) {
        memcpy(in->state + in->len, data + snap, size - snap);
        in->len += size - snap;
    } else {
        frame(in, data + snap, size - snap);
    }
    int fd = memfd_create("fuzz-state", MFD_CLOEXEC);
    if (fd < 0 || pwrite(fd, in->state, in->len, 0) != (ssize_t)in->len)
        die("state memfd");
    keep(in, "state-0", fd);
    /* A slab fd that no record names: closed by the restore. */
    fd = memfd_create("fuzz-stray", MFD_CLOEXEC);
    keep(in, "slab-424242424242", fd);
}

static gd_pool *add_pool(gd_context *ctx, const char *name, uint64_t cap, uint64_t slab) {
    gd_pool *pool = ch_host_pool(ctx, name, cap, slab);
    if (!pool)
        die("pool");
    return pool;
}

/* A restored session's client comes back holding half of each reference
 * (the first 16), one read-only. */
static void resume_one(gd_context *ctx) {
    gd_held held[16];
    size_t n = 0;
    uint64_t lost[16];
    for (gd_holder *h = ctx->reg.holders; h; h = h->hh.next) {
        if (!h->detached)
            continue;
        for (gd_ref *r = h->refs; r && n < 16; r = r->hh.next) {
            held[n].buffer_id = r->buffer_id;
            held[n].count = r->count / 2;
            held[n].ro = r->ro ? 1 : 0;
            n++;
        }
        qsort(held, n, sizeof(held[0]), gd_held_cmp);
        gd_registry_resume(&ctx->reg, h, held, n, lost);
        return;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uv_loop_t loop;
    gd_context ctx;
    input in;
    gd_err err = {0};
    char msg[256];
    const char *bad;
    gd_log_level = -1; /* quiet */
    setup(&in, data, size);
    uv_loop_init(&loop);
    gd_context_init(&ctx, &loop);
    ctx.limits.resume_timeout_ms = 60000;
    gd_pool *host = add_pool(&ctx, "host", POOL_CAP, 1u << 20);
    add_pool(&ctx, "small", 4u << 20, 64u << 10);
    if (gd_state_open(&ctx, in.kept, in.n_kept, false, &err) < 0)
        die(err.msg);
    if ((bad = state_check(&ctx, msg, sizeof(msg))))
        die(bad);
    if ((bad = state_check_fresh(&ctx, host, 4, msg, sizeof(msg))))
        die(bad);
    resume_one(&ctx);
    if ((bad = state_check(&ctx, msg, sizeof(msg))))
        die(bad);
    gd_state_freeze(ctx.state);
    gd_state_free(ctx.state);
    gd_context_destroy(&ctx);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
    for (size_t i = 0; i < in.n_kept; i++)
        if (in.kept[i].fd >= 0)
            close(in.kept[i].fd);
    free(in.state);
    return 0;
}
