/* Writes the seed corpora. make_seeds DIR: valid conversations (hello,
 * then every request type) for the target "daemon". make_seeds --state DIR:
 * saved states the daemon's own code wrote, in the input format of the
 * target "state" (fuzz_state.c), and one with ids and counts at their
 * limits. make_seeds --reply DIR: replies as the daemon answers opens
 * (target "reply", fuzz_reply.c). */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "backend.h"
#include "context.h"
#include "core_helpers.h"
#include "gpubuf.pb-c.h"
#include "gpubuf_state.pb-c.h"
#include "log.h"
#include "rawproto.h"
#include "state.h"
#include "wire.h"

static size_t put(uint8_t *out, Gpubuf__Request *req) {
    return rp_frame(out, req);
}

/* Write the request id with body msg (of kind body) framed at out. */
static size_t add(uint8_t *out, uint64_t id, Gpubuf__Request__BodyCase body, void *msg) {
    Gpubuf__Request r = rp_request(id, body, msg);
    return put(out, &r);
}

static size_t hello(uint8_t *out) {
    rp_hello h;
    rp_hello_init(&h, 0, "seed");
    return put(out, &h.req);
}

static void save(const char *dir, const char *name, const uint8_t *b, size_t n) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(b, 1, n, f) != n) {
        perror(path);
        exit(1);
    }
    fclose(f);
}

/* ---- saved states (target "state") ------------------------------------ */

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The active slot of ctx's state as fuzz_state.c reads it: u32 L, then
 * the records as [u16 length][record], the first L bytes those of the
 * snapshot (snap: its end in the slot). raw: the journal framed as in the
 * slot, with a torn record after it. */
static size_t state_input(gd_context *ctx, uint64_t snap, bool raw, uint8_t *out, size_t cap) {
    gd_kept_fd *fds = NULL;
    size_t n = gd_state_fds(ctx->state, &fds), best = 0, len = 4;
    uint64_t gen[2] = {0, 0};
    for (size_t i = 0; i < 2 && i < n; i++) {
        uint8_t hdr[GD_STATE_HEADER];
        if (pread(fds[i].fd, hdr, sizeof(hdr), 0) == (ssize_t)sizeof(hdr))
            memcpy(&gen[i], hdr + 16, 8);
    }
    best = gen[1] > gen[0];
    uint64_t end = gd_state_bytes(ctx->state);
    uint8_t *slot = malloc(end);
    if (!slot || pread(fds[best].fd, slot, end, 0) != (ssize_t)end)
        exit(1);
    uint32_t l = 0;
    for (uint64_t off = GD_STATE_HEADER; off + 8 <= end;) {
        uint32_t rn = rd32(slot + off);
        if (rn == 0 || rn > end - off - 8 || len + 8 + rn > cap)
            break;
        if (raw && off >= snap) {
            /* Framed again for fuzz_state.c's slot (generation 2). */
            len += gd_state_frame_v2(out + len, 2, slot + off + 8, rn);
        } else {
            out[len] = (uint8_t)rn;
            out[len + 1] = (uint8_t)(rn >> 8);
            memcpy(out + len + 2, slot + off + 8, rn);
            len += 2 + rn;
        }
        off += 8 + rn;
        if (off <= snap)
            l = (uint32_t)(len - 4);
    }
    if (raw && len + 12 < cap) { /* a torn record: its length, half its bytes */
        memcpy(out + len, "\x40\0\0\0\x12\x34\x56\x78torn", 12);
        len += 12;
    }
    l |= (raw ? 0x80000000u : 0) | 0x40000000u; /* version 2 */
    for (int i = 0; i < 4; i++)
        out[i] = (uint8_t)(l >> (8 * i));
    free(slot);
    free(fds);
    return len;
}

static gd_pool *seed_pool(gd_context *ctx, const char *name, uint64_t cap, uint64_t slab) {
    gd_pool *pool = ch_host_pool(ctx, name, cap, slab);
    if (!pool)
        exit(1);
    return pool;
}

static gd_buf *seed_alloc(gd_context *ctx, gd_holder *h, gd_pool *p, uint64_t size,
                          const char *name, bool seal) {
    gd_buf *b = NULL;
    gd_err err = {0};
    if (gd_registry_alloc(&ctx->reg, h, p, size, 0, name, &b, &err) < 0 ||
        (seal && gd_registry_seal(&ctx->reg, h, b->id, &b, &err) < 0)) {
        fprintf(stderr, "make_seeds: %s\n", err.msg);
        exit(1);
    }
    return b;
}

/* Append rec to out (at *len) as [u16 length][record]. */
static void cooked(uint8_t *out, size_t *len, Gpubuf__StateRecord *rec) {
    size_t n = gpubuf__state_record__pack(rec, out + *len + 2);
    out[*len] = (uint8_t)n;
    out[*len + 1] = (uint8_t)(n >> 8);
    *len += 2 + n;
}

/* Ids and counts at the edges (issue 22): a buffer, a session and a slab
 * of id 2^64 - 1, counters of 2^64 - 1, a reference count of 2^32 - 1 and
 * one more that would overflow, the last valid ids. */
static size_t limits_input(uint8_t *out) {
    Gpubuf__StateRecord rec = GPUBUF__STATE_RECORD__INIT;
    Gpubuf__StateCounters k = GPUBUF__STATE_COUNTERS__INIT;
    Gpubuf__StateSlab sl = GPUBUF__STATE_SLAB__INIT;
    Gpubuf__StateBuffer b = GPUBUF__STATE_BUFFER__INIT;
    Gpubuf__StateSession se = GPUBUF__STATE_SESSION__INIT;
    Gpubuf__StateRef r = GPUBUF__STATE_REF__INIT;
    size_t len = 4;
    k.next_buffer_id = k.next_session_id = k.next_slab_id = UINT64_MAX;
    k.restarts = UINT32_MAX;
    rec.rec_case = GPUBUF__STATE_RECORD__REC_COUNTERS;
    rec.counters = &k;
    cooked(out, &len, &rec);
    uint32_t l = (uint32_t)(len - 4);
    sl.pool = (char *)"host";
    sl.size = 1u << 20;
    rec.rec_case = GPUBUF__STATE_RECORD__REC_SLAB;
    rec.slab = &sl;
    const uint64_t slabs[] = {1, UINT64_MAX, GD_ID_MAX};
    for (int i = 0; i < 3; i++) {
        sl.id = slabs[i];
        cooked(out, &len, &rec);
    }
    b.state = GPUBUF_STATE_SEALED;
    b.block_size = b.size = b.charged = 4096;
    rec.rec_case = GPUBUF__STATE_RECORD__REC_BUFFER;
    rec.buffer = &b;
    const uint64_t bufs[] = {1, 2, UINT64_MAX, GD_ID_MAX};
    const char *names[] = {"one", "two", "huge", "last"};
    for (int i = 0; i < 4; i++) {
        b.id = bufs[i];
        b.name = (char *)names[i];
        b.slab_id = i == 2 ? UINT64_MAX : 1;
        b.offset = 4096u * (uint64_t)i;
        cooked(out, &len, &rec);
    }
    rec.rec_case = GPUBUF__STATE_RECORD__REC_SESSION;
    rec.session = &se;
    se.id = UINT64_MAX;
    cooked(out, &len, &rec);
    se.id = 5;
    cooked(out, &len, &rec);
    rec.rec_case = GPUBUF__STATE_RECORD__REC_REF;
    rec.ref = &r;
    r.session = 5;
    r.buffer = 1;
    r.count = r.read_only = UINT32_MAX;
    cooked(out, &len, &rec);
    r.buffer = 2;
    r.count = 3;
    cooked(out, &len, &rec);
    r.session = UINT64_MAX;
    cooked(out, &len, &rec);
    for (int i = 0; i < 4; i++)
        out[i] = (uint8_t)(l >> (8 * i));
    return len;
}

static void state_seeds(const char *dir) {
    static uint8_t out[1 << 16];
    uv_loop_t loop;
    gd_context ctx;
    gd_err err = {0};
    gd_log_level = -1;
    uv_loop_init(&loop);
    gd_context_init(&ctx, &loop);
    ctx.limits.resume_timeout_ms = 60000;
    gd_pool *host = seed_pool(&ctx, "host", 64u << 20, 1u << 20);
    gd_pool *small = seed_pool(&ctx, "small", 4u << 20, 64u << 10);
    if (gd_state_open(&ctx, NULL, 0, false, &err) < 0)
        exit(1);
    uint64_t snap = gd_state_bytes(ctx.state);
    /* Two clients: a producer's named, anonymous, unsealed, dedicated and
     * deleted buffers; a consumer's references, one read-only. */
    gd_holder *a = gd_registry_holder_new(&ctx.reg, 100, 1000, 1000);
    gd_holder *c = gd_registry_holder_new(&ctx.reg, 101, 1000, 1000);
    gd_buf *x = seed_alloc(&ctx, a, host, 4096, "seed/a", true);
    seed_alloc(&ctx, a, host, 8192, NULL, true);
    seed_alloc(&ctx, a, host, 100, "seed/unsealed", false);
    gd_buf *big = seed_alloc(&ctx, a, host, 2u << 20, "seed/big", true);
    gd_buf *y = seed_alloc(&ctx, a, small, 1000, "seed/small", true);
    gd_buf *o = NULL;
    gd_state_begin(ctx.state); /* one group of three entries, as a batch makes */
    gd_registry_open_mode(&ctx.reg, c, NULL, x->id, false, &o, NULL, &err);
    gd_registry_open_mode(&ctx.reg, c, NULL, x->id, true, &o, NULL, &err);
    gd_registry_open_mode(&ctx.reg, c, NULL, y->id, false, &o, NULL, &err);
    gd_state_end(ctx.state);
    gd_registry_release(&ctx.reg, a, big->id, &err);
    gd_registry_delete(&ctx.reg, a, NULL, big->id, &err);
    /* A batch's anonymous buffers (one group: a run of buffers, version
     * 4), then their deletes, then two of their last releases. */
    gd_buf *run[3];
    gd_state_begin(ctx.state);
    for (int i = 0; i < 3; i++)
        run[i] = seed_alloc(&ctx, a, host, 4096, NULL, true);
    gd_state_end(ctx.state);
    uint64_t run_id[3] = {run[0]->id, run[1]->id, run[2]->id};
    gd_state_begin(ctx.state);
    for (int i = 0; i < 3; i++)
        gd_registry_delete(&ctx.reg, a, NULL, run_id[i], &err);
    gd_state_end(ctx.state);
    gd_state_begin(ctx.state);
    for (int i = 0; i < 2; i++)
        gd_registry_release(&ctx.reg, a, run_id[i], &err);
    gd_state_end(ctx.state);
    save(dir, "limits", out, limits_input(out));
    save(dir, "fresh", out, state_input(&ctx, snap, false, out, sizeof(out)));
    save(dir, "fresh-raw", out, state_input(&ctx, snap, true, out, sizeof(out)));

    /* The next start: restored from those fds, a fresh snapshot, then a
     * journal again (the consumer resumes with one reference of x). */
    gd_kept_fd *fds = NULL;
    uint64_t cid = c->id;
    size_t n = gd_state_fds(ctx.state, &fds);
    for (size_t i = 0; i < n; i++)
        fds[i].fd = dup(fds[i].fd);
    gd_state_freeze(ctx.state);
    gd_state_free(ctx.state);
    gd_context_destroy(&ctx);
    gd_context_init(&ctx, &loop);
    ctx.limits.resume_timeout_ms = 60000;
    host = seed_pool(&ctx, "host", 64u << 20, 1u << 20);
    seed_pool(&ctx, "small", 4u << 20, 64u << 10);
    if (gd_state_open(&ctx, fds, n, false, &err) < 0)
        exit(1);
    snap = gd_state_bytes(ctx.state);
    HASH_FIND(hh, ctx.reg.holders, &cid, sizeof(cid), c);
    if (c) {
        gd_held held = {.buffer_id = 1, .count = 1, .ro = 1};
        uint64_t lost[1];
        gd_registry_resume(&ctx.reg, c, &held, 1, lost);
    }
    a = gd_registry_holder_new(&ctx.reg, 102, 1000, 1000);
    seed_alloc(&ctx, a, host, 4096, "seed/after", true);
    save(dir, "restarted", out, state_input(&ctx, snap, false, out, sizeof(out)));
    for (size_t i = 0; i < n; i++)
        if (fds[i].fd >= 0)
            close(fds[i].fd);
    free(fds);
    gd_state_freeze(ctx.state);
    gd_state_free(ctx.state);
    gd_context_destroy(&ctx);
    uv_run(&loop, UV_RUN_DEFAULT);
    uv_loop_close(&loop);
}

/* ---- replies (target "reply") ------------------------------------------ */

/* Errors, and buffers as opens, allocs and stats get them: with and
 * without a slab, CUDA handles, a seal event, user bytes and a lease, a
 * layout (which the fast decoder leaves to protobuf-c). */
static void reply_seeds(const char *dir) {
    static uint8_t ev[64], uuid[16], ipc[64], user[40], out[1024];
    memset(ev, 7, sizeof(ev));
    memset(uuid, 9, sizeof(uuid));
    memset(ipc, 3, sizeof(ipc));
    memset(user, 5, sizeof(user));
    for (int i = 0; i < 12; i++) {
        Gpubuf__Response r = GPUBUF__RESPONSE__INIT;
        Gpubuf__Buffer b = GPUBUF__BUFFER__INIT;
        Gpubuf__Slab s = GPUBUF__SLAB__INIT;
        Gpubuf__ArrayLayout l = GPUBUF__ARRAY_LAYOUT__INIT;
        char name[32];
        r.id = 1000 + (uint64_t)i * 77777;
        if (i == 1 || i == 2) {
            r.status = i == 1 ? -2 : -11;
            r.message = (char *)"no such buffer";
        } else if (i >= 3) {
            r.body_case = GPUBUF__RESPONSE__BODY_BUFFER;
            r.buffer = &b;
            b.buffer_id = 42 + (uint64_t)i;
            b.name = (char *)"frame.123";
            b.pool = (char *)"gpu0";
            b.size = 256u << i;
            b.offset = 4096u * (uint64_t)i;
            b.state = GPUBUF__BUFFER_STATE__BUFFER_STATE_SEALED;
            b.refs = 3;
            b.owner_uid = 1000;
            b.slab_id = 7;
            b.read_only = i % 2;
            if (i != 5) {
                b.slab = &s;
                s.slab_id = 7;
                s.kind = (Gpubuf__PoolKind)(1 + i % 3);
                s.device = i % 3 == 0 ? -1 : 0;
                s.size = 64u << 20;
                s.keepable = 1;
            }
            if (i == 6) {
                b.event_handle = (ProtobufCBinaryData){sizeof(ev), ev};
                s.device_uuid = (ProtobufCBinaryData){sizeof(uuid), uuid};
                s.ipc_handle = (ProtobufCBinaryData){sizeof(ipc), ipc};
            }
            if (i == 7) {
                b.user_data = (ProtobufCBinaryData){sizeof(user), user};
                b.lease_left_ms = 5000;
                b.lease_ttl_ms = 60000;
            }
            r.fds = i == 8;
            b.restored = i == 8;
            if (i == 9) {
                b.layout = &l;
                l.dtype_code = 2;
                l.dtype_bits = 32;
                l.dtype_lanes = 1;
            }
        }
        snprintf(name, sizeof(name), "reply_%02d", i);
        save(dir, name, out, gpubuf__response__pack(&r, out));
    }
}

/* ---- conversations (target "daemon") ------------------------------------ */

/* Each writes one request framed at out and returns its length; a field
 * left out stays at its default. */
static size_t alloc_req(uint8_t *out, uint64_t id, uint64_t size, const char *name,
                        uint32_t alignment) {
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    a.size = size;
    a.name = (char *)name;
    a.alignment = alignment;
    return add(out, id, GPUBUF__REQUEST__BODY_ALLOC, &a);
}

static size_t seal_req(uint8_t *out, uint64_t id, uint64_t buffer_id, uint8_t *ev, size_t ev_len) {
    Gpubuf__SealRequest s = GPUBUF__SEAL_REQUEST__INIT;
    s.buffer_id = buffer_id;
    s.event_handle.data = ev;
    s.event_handle.len = ev_len;
    return add(out, id, GPUBUF__REQUEST__BODY_SEAL, &s);
}

/* An open by name (name not NULL) or by buffer_id. */
static size_t open_req(uint8_t *out, uint64_t id, const char *name, uint64_t buffer_id,
                       int32_t timeout_ms, bool read_only) {
    Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
    if (name) {
        o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
        o.name = (char *)name;
    } else {
        o.target_case = GPUBUF__OPEN_REQUEST__TARGET_BUFFER_ID;
        o.buffer_id = buffer_id;
    }
    o.timeout_ms = timeout_ms;
    o.read_only = read_only;
    return add(out, id, GPUBUF__REQUEST__BODY_OPEN, &o);
}

static size_t release_req(uint8_t *out, uint64_t id, uint64_t buffer_id, bool keep_mapped,
                          bool read_only) {
    Gpubuf__ReleaseRequest rel = GPUBUF__RELEASE_REQUEST__INIT;
    rel.buffer_id = buffer_id;
    rel.keep_mapped = keep_mapped;
    rel.read_only = read_only;
    return add(out, id, GPUBUF__REQUEST__BODY_RELEASE, &rel);
}

static size_t status_req(uint8_t *out, uint64_t id, bool columnar) {
    Gpubuf__StatusRequest sr = GPUBUF__STATUS_REQUEST__INIT;
    sr.columnar = columnar;
    return add(out, id, GPUBUF__REQUEST__BODY_STATUS, &sr);
}

int main(int argc, char **argv) {
    uint8_t b[4096];
    size_t n;
    if (argc == 3 && strcmp(argv[1], "--state") == 0) {
        state_seeds(argv[2]);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "--reply") == 0) {
        reply_seeds(argv[2]);
        return 0;
    }
    if (argc != 2)
        return 2;
    const char *dir = argv[1];
    n = hello(b);
    save(dir, "hello", b, n);

    /* hello, alloc named, seal 1, open by name, stat, release, delete, status */
    n += alloc_req(b + n, 2, 4096, "seed/a", 0);
    n += seal_req(b + n, 3, 1, NULL, 0);
    n += open_req(b + n, 4, "seed/a", 0, 0, false);
    Gpubuf__StatRequest st = GPUBUF__STAT_REQUEST__INIT;
    st.target_case = GPUBUF__STAT_REQUEST__TARGET_BUFFER_ID;
    st.buffer_id = 1;
    n += add(b + n, 5, GPUBUF__REQUEST__BODY_STAT, &st);
    n += release_req(b + n, 6, 1, false, false);
    n += release_req(b + n, 6, 1, false, false); /* double release */
    Gpubuf__DeleteRequest d = GPUBUF__DELETE_REQUEST__INIT;
    d.target_case = GPUBUF__DELETE_REQUEST__TARGET_NAME;
    d.name = (char *)"seed/a";
    n += add(b + n, 7, GPUBUF__REQUEST__BODY_DELETE, &d);
    n += status_req(b + n, 8, false);
    save(dir, "lifecycle", b, n);

    /* hello, anonymous alloc, waiting opens by id and by name */
    n = hello(b);
    n += alloc_req(b + n, 2, 4096, "", 4096);
    n += open_req(b + n, 3, NULL, 2, 50, false);
    n += open_req(b + n, 4, "later", 0, -1, false);
    save(dir, "waits", b, n);

    /* KEEP_MAPPED: hello with the capability, alloc, release keeping the
     * slab, unmap (twice), a dedicated slab released with keep_mapped */
    {
        rp_hello h;
        rp_hello_init(&h, GPUBUF_CAP_KEEP_MAPPED, NULL);
        n = put(b, &h.req);
    }
    n += alloc_req(b + n, 2, 4096, "", 0);
    n += release_req(b + n, 3, 1, true, false);
    Gpubuf__UnmapRequest u = GPUBUF__UNMAP_REQUEST__INIT;
    u.slab_id = 1;
    n += add(b + n, 4, GPUBUF__REQUEST__BODY_UNMAP, &u);
    n += add(b + n, 4, GPUBUF__REQUEST__BODY_UNMAP, &u);
    n += alloc_req(b + n, 5, 64u << 20, "", 0);
    n += release_req(b + n, 6, 2, true, false);
    n += status_req(b + n, 7, true);
    save(dir, "kept", b, n);

    /* Read-only opens and seal events: alloc, a seal with a short event
     * handle, a seal with a full one (refused on host pools), a plain seal,
     * a read-only open, a read-only release, a waiting read-only open, status */
    n = hello(b);
    n += alloc_req(b + n, 2, 8192, "seed/ro", 0);
    uint8_t ev[64] = {0x42};
    n += seal_req(b + n, 3, 1, ev, 10);
    n += seal_req(b + n, 3, 1, ev, 64);
    n += seal_req(b + n, 3, 1, ev, 0);
    n += open_req(b + n, 4, "seed/ro", 0, 0, true);
    n += release_req(b + n, 5, 1, false, true);
    n += open_req(b + n, 6, "seed/ro2", 0, 20, true);
    n += status_req(b + n, 7, false);
    save(dir, "readonly", b, n);

    /* Restart: a hello resuming a session (none is detached here) with
     * held references, one named twice; a takeover request (refused: the
     * target has no takeover); a status. */
    {
        rp_hello h;
        Gpubuf__HeldRef hr[3] = {GPUBUF__HELD_REF__INIT, GPUBUF__HELD_REF__INIT,
                                 GPUBUF__HELD_REF__INIT};
        Gpubuf__HeldRef *ph[3] = {&hr[0], &hr[1], &hr[2]};
        Gpubuf__TakeoverRequest tk = GPUBUF__TAKEOVER_REQUEST__INIT;
        hr[0].buffer_id = 1;
        hr[0].count = 2;
        hr[0].read_only = 1;
        hr[1].buffer_id = 7;
        hr[1].count = 1;
        hr[2].buffer_id = 1;
        hr[2].count = 5;
        rp_hello_init(&h, 0, "seed");
        h.hello.resume_session = 3;
        h.hello.n_held = 3;
        h.hello.held = ph;
        n = put(b, &h.req);
        tk.path = (char *)"/tmp/seed.takeover";
        n += add(b + n, 2, GPUBUF__REQUEST__BODY_TAKEOVER, &tk);
        n += status_req(b + n, 3, false);
        save(dir, "restart", b, n);
    }
    return 0;
}
