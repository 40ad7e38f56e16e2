/* The saved state is input: restoring crafted states through the daemon's
 * own restore (gd_state_open() on memfds, host pool). Ids near 2^64 are
 * refused, so the ids given next never wrap onto ones in use; a saved
 * reference count near 2^32 is restored (and cut at a resume) in one step,
 * not one per reference; counts that would overflow are dropped; buffers
 * outside their slab, twice the same name, unknown slabs and sessions are
 * dropped; and the registry's invariants hold after (fuzz/state_check.h). */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "check_main.h"
#include "context.h"
#include "fuzz/state_check.h"
#include "gpubuf_state.pb-c.h"
#include "state.h"

#define SLAB (1u << 20)
#define KB4 4096u
#define U64MAX UINT64_MAX

typedef struct fx {
    uv_loop_t loop;
    gd_context ctx;
    gd_pool *pool;
    gd_kept_fd kept[8];
    size_t n_kept;
    uint8_t *recs;
    size_t len, cap;
} fx;

static void fx_init(fx *f) {
    gd_backend *be;
    memset(f, 0, sizeof(*f));
    ck_assert_int_eq(uv_loop_init(&f->loop), 0);
    gd_context_init(&f->ctx, &f->loop);
    f->ctx.limits.resume_timeout_ms = 60000;
    ck_assert_int_eq(gd_backend_host_new(&be, NULL), 0);
    ck_assert_int_eq(gd_pool_new("host", be, 64u << 20, SLAB, &f->ctx.slab_ids, &f->pool, NULL), 0);
    ck_assert_int_eq(gd_context_add_pool(&f->ctx, f->pool), 0);
}

/* Declare the fixture f and start it (fx_init). */
#define FX(f)                                                                                      \
    fx f;                                                                                          \
    fx_init(&f)

static void fx_free(fx *f) {
    gd_state_freeze(f->ctx.state);
    gd_state_free(f->ctx.state);
    gd_context_destroy(&f->ctx);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&f->loop), 0);
    for (size_t i = 0; i < f->n_kept; i++)
        if (f->kept[i].fd >= 0)
            close(f->kept[i].fd);
    free(f->recs);
}

static void put(fx *f, Gpubuf__StateRecord *rec) {
    size_t n = gpubuf__state_record__get_packed_size(rec);
    if (f->cap - f->len < n + 8) {
        f->cap = (f->cap + n + 8) * 2;
        f->recs = realloc(f->recs, f->cap);
        ck_assert_ptr_nonnull(f->recs);
    }
    gpubuf__state_record__pack(rec, f->recs + f->len + 8);
    f->len += gd_state_frame(f->recs + f->len, f->recs + f->len + 8, (uint32_t)n);
}

/* Append a record whose body is msg, of kind c. Every member of the
 * record's union is a pointer to a message (or an id, which these tests
 * do not write): msg is stored in whichever c names. */
static void put_msg(fx *f, Gpubuf__StateRecord__RecCase c, void *msg) {
    Gpubuf__StateRecord rec = GPUBUF__STATE_RECORD__INIT;
    rec.rec_case = c;
    memcpy(&rec.slab, &msg, sizeof(msg));
    put(f, &rec);
}

static void keep(fx *f, const char *name, int fd) {
    ck_assert_uint_lt(f->n_kept, 8);
    snprintf(f->kept[f->n_kept].name, sizeof(f->kept[0].name), "%s", name);
    f->kept[f->n_kept++].fd = fd;
}

/* A slab record, and its memory kept as a host slab's: a sealed memfd. */
static void slab(fx *f, uint64_t id) {
    Gpubuf__StateSlab m = GPUBUF__STATE_SLAB__INIT;
    char name[64];
    m.id = id;
    m.pool = (char *)"host";
    m.size = SLAB;
    put_msg(f, GPUBUF__STATE_RECORD__REC_SLAB, &m);
    int fd = memfd_create("slab", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, SLAB), 0);
    ck_assert_int_eq(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL), 0);
    snprintf(name, sizeof(name), "slab-%llu", (unsigned long long)id);
    keep(f, name, fd);
}

/* A sealed buffer of 4 KiB at offset in slab slab_id, with a lease of
 * ttl_ms (0: none). */
static void buf_ttl(fx *f, uint64_t id, const char *name, uint64_t slab_id, uint64_t offset,
                    uint64_t ttl_ms) {
    Gpubuf__StateBuffer m = GPUBUF__STATE_BUFFER__INIT;
    m.id = id;
    m.name = (char *)name;
    m.slab_id = slab_id;
    m.offset = offset;
    m.block_size = m.size = m.charged = KB4;
    m.state = GPUBUF_STATE_SEALED;
    m.owner_uid = 1000;
    m.lease_ttl_ms = ttl_ms;
    m.lease_expires_ns = ttl_ms ? UINT64_MAX / 2 : 0;
    put_msg(f, GPUBUF__STATE_RECORD__REC_BUFFER, &m);
}

static void buf(fx *f, uint64_t id, const char *name, uint64_t slab_id, uint64_t offset) {
    buf_ttl(f, id, name, slab_id, offset, 0);
}

static void session(fx *f, uint64_t id) {
    Gpubuf__StateSession m = GPUBUF__STATE_SESSION__INIT;
    m.id = id;
    m.pid = 4242;
    m.uid = m.gid = 1000;
    put_msg(f, GPUBUF__STATE_RECORD__REC_SESSION, &m);
}

static void ref(fx *f, uint64_t session_id, uint64_t buffer_id, uint32_t count, uint32_t ro) {
    Gpubuf__StateRef m = GPUBUF__STATE_REF__INIT;
    m.session = session_id;
    m.buffer = buffer_id;
    m.count = count;
    m.read_only = ro;
    put_msg(f, GPUBUF__STATE_RECORD__REC_REF, &m);
}

static void counters(fx *f, uint64_t buffers, uint64_t sessions, uint64_t slabs) {
    Gpubuf__StateCounters m = GPUBUF__STATE_COUNTERS__INIT;
    m.next_buffer_id = buffers;
    m.next_session_id = sessions;
    m.next_slab_id = slabs;
    m.restarts = 1;
    put_msg(f, GPUBUF__STATE_RECORD__REC_COUNTERS, &m);
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Restore what was put, as the next start would (state-0, generation 1),
 * check the invariants, and return the CPU seconds the restore took. */
static double restore(fx *f) {
    uint8_t hdr[GD_STATE_HEADER];
    gd_err err = {0};
    char msg[256];
    int fd = memfd_create("state", MFD_CLOEXEC);
    ck_assert_int_ge(fd, 0);
    gd_state_header(hdr, 1);
    ck_assert_int_eq(pwrite(fd, hdr, sizeof(hdr), 0), (ssize_t)sizeof(hdr));
    ck_assert_int_eq(pwrite(fd, f->recs, f->len, sizeof(hdr)), (ssize_t)f->len);
    keep(f, "state-0", fd);
    double t0 = cpu_s();
    int r = gd_state_open(&f->ctx, f->kept, f->n_kept, false, &err);
    double t = cpu_s() - t0;
    ck_assert_msg(r == 0, "restore: %s", err.msg);
    const char *bad = state_check(&f->ctx, msg, sizeof(msg));
    ck_assert_msg(!bad, "after the restore: %s", bad);
    return t;
}

/* Buffer "one" (id 1) and "two" (id 2) in slab 1: what the crafted states
 * below add to. */
static void base(fx *f) {
    slab(f, 1);
    buf(f, 1, "one", 1, 0);
    buf(f, 2, "two", 1, KB4);
}

/* How each test whose ids must continue ends: allocate n anonymous
 * buffers; each gets an id nobody has, and ids 1 and 2 still find "one"
 * and "two" (stat by id answers the right buffer); then free f. */
static void fresh_then_free(fx *f, int n) {
    char msg[256];
    const char *bad = state_check_fresh(&f->ctx, f->pool, n, msg, sizeof(msg));
    ck_assert_msg(!bad, "after new allocations: %s", bad);
    gd_holder *h = gd_registry_holder_new(&f->ctx.reg, 1, 1000, 1000);
    ck_assert_ptr_nonnull(h);
    for (int i = 0; i < n; i++) {
        gd_buf *b = NULL;
        gd_err err = {0};
        ck_assert_int_eq(gd_registry_alloc(&f->ctx.reg, h, f->pool, KB4, 0, NULL, &b, &err), 0);
        ck_assert_uint_gt(b->id, 2);
        ck_assert_uint_le(b->id, GD_ID_MAX);
    }
    gd_buf *one = gd_registry_find_id(&f->ctx.reg, 1), *two = gd_registry_find_id(&f->ctx.reg, 2);
    ck_assert_ptr_nonnull(one);
    ck_assert_ptr_nonnull(two);
    ck_assert_str_eq(one->name, "one");
    ck_assert_str_eq(two->name, "two");
    gd_registry_holder_drop(&f->ctx.reg, h);
    fx_free(f);
}

/* Finding 3: a buffer of id 2^64 - 1 made the next ids 0, 1, 2. It is
 * dropped; so is one beyond GD_ID_MAX; GD_ID_MAX itself is an id and
 * restored, and then buffer ids are used up: an alloc is refused, never
 * wrapped. */
START_TEST(buffer_id_near_2_64_is_refused) {
    FX(f);
    base(&f);
    buf(&f, U64MAX, "huge", 1, 2 * KB4);
    buf(&f, GD_ID_MAX + 1, "beyond", 1, 3 * KB4);
    restore(&f);
    ck_assert_ptr_null(gd_registry_find_id(&f.ctx.reg, U64MAX));
    ck_assert_ptr_null(gd_registry_find_id(&f.ctx.reg, GD_ID_MAX + 1));
    ck_assert_ptr_null(gd_registry_find_name(&f.ctx.reg, "huge"));
    ck_assert_uint_eq(f.ctx.reg.n_buffers, 2);
    ck_assert_uint_eq(f.ctx.reg.next_buffer_id, 2);
    fresh_then_free(&f, 3);

    fx_init(&f);
    base(&f);
    buf(&f, GD_ID_MAX, "last", 1, 2 * KB4);
    restore(&f);
    ck_assert_ptr_nonnull(gd_registry_find_id(&f.ctx.reg, GD_ID_MAX));
    ck_assert_uint_eq(f.ctx.reg.next_buffer_id, GD_ID_MAX);
    gd_holder *h = gd_registry_holder_new(&f.ctx.reg, 1, 1000, 1000);
    gd_buf *b = NULL;
    gd_err err = {0};
    ck_assert_int_eq(gd_registry_alloc(&f.ctx.reg, h, f.pool, KB4, 0, NULL, &b, &err), -EOVERFLOW);
    ck_assert_ptr_nonnull(strstr(err.msg, "every buffer id"));
    ck_assert_str_eq(gd_registry_find_id(&f.ctx.reg, 1)->name, "one");
    gd_registry_holder_drop(&f.ctx.reg, h);
    fx_free(&f);
}
END_TEST

/* The same for a saved next_buffer_id of 2^64 - 1 (and 2^63): ignored, the
 * ids continue after the highest restored. */
START_TEST(next_buffer_id_near_2_64_is_ignored) {
    const uint64_t bad[] = {U64MAX, 1ull << 63, GD_ID_MAX + 1};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        FX(f);
        counters(&f, bad[i], 0, 0);
        base(&f);
        restore(&f);
        ck_assert_uint_eq(f.ctx.reg.next_buffer_id, 2);
        fresh_then_free(&f, 3);
    }
}
END_TEST

/* Sessions: one of id 2^64 - 1 (with a reference) and a next_session_id of
 * 2^64 - 1 made new sessions get ids 0, 1, ...: dropped and ignored; the
 * holder made next gets a fresh id. */
START_TEST(session_id_near_2_64_is_refused) {
    FX(f);
    counters(&f, 0, U64MAX, 0);
    base(&f);
    session(&f, 3);
    ref(&f, 3, 1, 1, 0);
    session(&f, U64MAX);
    ref(&f, U64MAX, 2, 1, 0);
    restore(&f);
    ck_assert_uint_eq(f.ctx.reg.n_detached, 1);
    ck_assert_uint_eq(f.ctx.reg.next_holder_id, 3);
    ck_assert_uint_eq(gd_registry_find_id(&f.ctx.reg, 1)->refs, 1);
    ck_assert_uint_eq(gd_registry_find_id(&f.ctx.reg, 2)->refs, 0);
    gd_holder *h = gd_registry_holder_new(&f.ctx.reg, 1, 1000, 1000);
    ck_assert_ptr_nonnull(h);
    ck_assert_uint_eq(h->id, 4);
    gd_registry_holder_drop(&f.ctx.reg, h);
    fresh_then_free(&f, 2);

    /* The last session id: restored, and then no new session (refused with
     * EOVERFLOW, not given id 0). */
    fx_init(&f);
    base(&f);
    session(&f, GD_ID_MAX);
    ref(&f, GD_ID_MAX, 1, 1, 0);
    restore(&f);
    errno = 0;
    ck_assert_ptr_null(gd_registry_holder_new(&f.ctx.reg, 1, 1000, 1000));
    ck_assert_int_eq(errno, EOVERFLOW);
    fx_free(&f);
}
END_TEST

/* Slabs: one of id 2^64 - 1 made the next slab's id 0. Dropped (its fd
 * closed); a saved next_slab_id of 2^64 - 1 is ignored; a new slab gets a
 * fresh id. */
START_TEST(slab_id_near_2_64_is_refused) {
    FX(f);
    counters(&f, 0, 0, U64MAX);
    base(&f);
    slab(&f, U64MAX);
    buf(&f, 3, "in-huge-slab", U64MAX, 0);
    restore(&f);
    ck_assert_uint_eq(f.pool->n_slabs, 1);
    ck_assert_uint_eq(f.ctx.slab_ids, 1);
    ck_assert_ptr_null(gd_registry_find_id(&f.ctx.reg, 3));
    /* Fill slab 1 so that the next buffer needs a new slab. */
    gd_holder *h = gd_registry_holder_new(&f.ctx.reg, 1, 1000, 1000);
    gd_buf *b = NULL;
    gd_err err = {0};
    ck_assert_int_eq(gd_registry_alloc(&f.ctx.reg, h, f.pool, SLAB - 2 * KB4, 0, NULL, &b, &err), 0);
    ck_assert_uint_eq(b->blk.slab->id, 1);
    ck_assert_int_eq(gd_registry_alloc(&f.ctx.reg, h, f.pool, KB4, 0, NULL, &b, &err), 0);
    ck_assert_uint_eq(b->blk.slab->id, 2);
    ck_assert_uint_eq(f.pool->n_slabs, 2);
    char msg[256];
    const char *bad = state_check(&f.ctx, msg, sizeof(msg));
    ck_assert_msg(!bad, "%s", bad);
    gd_registry_holder_drop(&f.ctx.reg, h);
    fx_free(&f);
}
END_TEST

/* Finding 4: a saved reference count of 2^32 - 1 took one loop iteration
 * per reference (over 10 s before READY=1, at every start). Restored in
 * one step now, and cut at the resume in one step too; the CPU time bound
 * is thousands of times what the work takes, and the old loop took tens of
 * seconds. A second count that would take the session past 2^32 - 1 is
 * dropped. */
START_TEST(huge_reference_count_is_one_step) {
    FX(f);
    base(&f);
    session(&f, 5);
    ref(&f, 5, 1, UINT32_MAX, UINT32_MAX);
    ref(&f, 5, 2, 7, 0);
    double t = restore(&f);
    gd_holder *h;
    uint64_t id = 5;
    HASH_FIND(hh, f.ctx.reg.holders, &id, sizeof(id), h);
    ck_assert_ptr_nonnull(h);
    gd_buf *one = gd_registry_find_id(&f.ctx.reg, 1);
    ck_assert_uint_eq(one->refs, UINT32_MAX);
    ck_assert_uint_eq(h->n_refs, UINT32_MAX);
    ck_assert_uint_eq(h->n_ro_refs, UINT32_MAX);
    ck_assert_uint_eq(gd_registry_holder_count(h, 2), 0); /* would overflow: dropped */
    ck_assert_msg(t < 5.0, "restoring one reference count took %.2f s of CPU", t);
    /* The client comes back holding one reference. */
    gd_held held[] = {{1, 1, 1}};
    uint64_t lost[1];
    double t0 = cpu_s();
    ck_assert_uint_eq(gd_registry_resume(&f.ctx.reg, h, held, 1, lost), 0);
    t = cpu_s() - t0;
    ck_assert_msg(t < 5.0, "cutting one reference count took %.2f s of CPU", t);
    ck_assert_uint_eq(one->refs, 1);
    ck_assert_uint_eq(h->n_refs, 1);
    ck_assert_uint_eq(h->n_ro_refs, 1);
    char msg[256];
    const char *bad = state_check(&f.ctx, msg, sizeof(msg));
    ck_assert_msg(!bad, "after the resume: %s", bad);
    ck_assert_int_eq(gd_registry_release(&f.ctx.reg, h, 1, NULL), 0);
    ck_assert_uint_eq(one->refs, 0);
    fx_free(&f);
}
END_TEST

/* Records that do not check out are dropped, each alone: a buffer outside
 * its slab, one overlapping another, a second buffer of a name, one in a
 * slab that does not exist, a name too long, a reference to a buffer or
 * from a session that does not exist; the rest is restored. A buffer
 * dropped for its metadata (a lease beyond 2^32 ms) was the only one of its
 * slab so far, and another slab was empty: the slab used to go with it,
 * and the next buffer of that slab was lost ("its slab was not restored");
 * slabs stay until the restore is done now. */
START_TEST(bad_records_are_dropped) {
    fx f;
    char longname[300];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    fx_init(&f);
    base(&f);
    buf(&f, 3, "outside", 1, SLAB - KB4 / 2);
    buf(&f, 4, "far-outside", 1, U64MAX - 10);
    buf(&f, 5, "overlap", 1, KB4 / 2);
    buf(&f, 6, "one", 1, 4 * KB4);
    buf(&f, 7, "no-slab", 99, 0);
    buf(&f, 8, longname, 1, 5 * KB4);
    session(&f, 9);
    ref(&f, 9, 1, 2, 0);
    ref(&f, 9, 77, 1, 0);
    ref(&f, 10, 2, 1, 0);
    slab(&f, 3);
    slab(&f, 4);
    buf_ttl(&f, 11, "bad-lease", 3, 0, 1ull << 40);
    buf(&f, 12, "after-bad-lease", 3, KB4);
    restore(&f);
    ck_assert_ptr_null(gd_registry_find_id(&f.ctx.reg, 11));
    gd_buf *after = gd_registry_find_id(&f.ctx.reg, 12);
    ck_assert_msg(after != NULL, "a good buffer went with its slab");
    ck_assert_uint_eq(after->blk.slab->id, 3);
    ck_assert_uint_eq(f.ctx.reg.n_buffers, 3);
    for (uint64_t id = 3; id <= 8; id++)
        ck_assert_ptr_null(gd_registry_find_id(&f.ctx.reg, id));
    ck_assert_uint_eq(gd_registry_find_id(&f.ctx.reg, 1)->refs, 2);
    ck_assert_uint_eq(gd_registry_find_id(&f.ctx.reg, 2)->refs, 0);
    /* Ids that were in the records stay used: new ones come after. */
    ck_assert_uint_ge(f.ctx.reg.next_buffer_id, 12);
    fresh_then_free(&f, 2);
}
END_TEST

static void buf_state(fx *f, uint64_t id, uint32_t state) {
    Gpubuf__StateBufferState m = GPUBUF__STATE_BUFFER_STATE__INIT;
    m.id = id;
    m.state = state;
    put_msg(f, GPUBUF__STATE_RECORD__REC_BUFFER_STATE, &m);
}

static void buf_gone(fx *f, uint64_t id) {
    Gpubuf__StateRecord rec = GPUBUF__STATE_RECORD__INIT;
    rec.rec_case = GPUBUF__STATE_RECORD__REC_BUFFER_GONE;
    rec.buffer_gone = id;
    put(f, &rec);
}

/* restore(f), with what the daemon logs meanwhile into *log (free it). */
static void restore_logged(fx *f, char **log) {
    int fd = memfd_create("log", MFD_CLOEXEC), saved = dup(2);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_ge(saved, 0);
    fflush(stderr);
    ck_assert_int_eq(dup2(fd, 2), 2);
    restore(f);
    fflush(stderr);
    ck_assert_int_eq(dup2(saved, 2), 2);
    close(saved);
    off_t n = lseek(fd, 0, SEEK_END);
    ck_assert_int_ge(n, 0);
    *log = calloc(1, (size_t)n + 1);
    ck_assert_ptr_nonnull(*log);
    ck_assert_int_eq(pread(fd, *log, (size_t)n, 0), n);
    close(fd);
}

/* A slot a snapshot was written into step by step has a request's group
 * whole, also the state entry of a buffer that the snapshot's walk writes
 * after it (with the newer state): that is no bad record, and the walk's
 * record wins. Every restart from such a slot logged "dropped the state
 * of buffer N" and counted it bad. A state entry whose buffer no record
 * comes for, before or after, still is one. */
START_TEST(state_before_its_buffer_is_not_bad) {
    char *log;
    FX(f);
    base(&f);
    buf_state(&f, 3, GPUBUF_STATE_DELETED); /* the walk writes 3 later */
    buf(&f, 3, "three", 1, 2 * KB4);
    buf_state(&f, 4, GPUBUF_STATE_DELETED); /* 4 goes before the walk reaches it */
    buf_gone(&f, 4);
    restore_logged(&f, &log);
    ck_assert_msg(strstr(log, " 0 bad record(s)") && !strstr(log, "dropped the state"),
                  "restore logged: %s", log);
    free(log);
    gd_buf *three = gd_registry_find_id(&f.ctx.reg, 3);
    ck_assert_ptr_nonnull(three);
    ck_assert_int_eq(three->state, GPUBUF_STATE_SEALED);
    ck_assert_ptr_null(gd_registry_find_id(&f.ctx.reg, 4));
    fx_free(&f);

    fx g;
    fx_init(&g);
    base(&g);
    buf_state(&g, 5, GPUBUF_STATE_DELETED); /* no record of 5 at all */
    restore_logged(&g, &log);
    ck_assert_msg(strstr(log, " 1 bad record(s)") &&
                      strstr(log, "dropped the state of buffer 5: no record of that buffer comes "
                                  "before or after it"),
                  "restore logged: %s", log);
    free(log);
    ck_assert_uint_eq(g.ctx.reg.n_buffers, 2);
    fx_free(&g);
}
END_TEST

/* A slab without an fd (a cuda-ipc slab: its memory cannot outlive the
 * daemon) is left out of what a takeover hands over: an fd of -1 in the
 * handover made sendmsg fail (EBADF) and every takeover of a daemon with a
 * cuda-ipc slab give up. */
START_TEST(handover_leaves_out_slabs_without_an_fd) {
    FX(f);
    base(&f);
    restore(&f);
    gd_slab *s = gd_registry_find_id(&f.ctx.reg, 1)->blk.slab;
    int fd = s->exp.fd;
    ck_assert_int_ge(fd, 0);
    gd_kept_fd *fds = NULL;
    size_t n = gd_state_fds(f.ctx.state, &fds);
    ck_assert_uint_eq(n, 3); /* state-0, state-1, slab-1 */
    free(fds);
    s->exp.fd = -1;
    n = gd_state_fds(f.ctx.state, &fds);
    ck_assert_uint_eq(n, 2);
    for (size_t i = 0; i < n; i++) {
        ck_assert_int_ge(fds[i].fd, 0);
        ck_assert_str_eq(fds[i].name, i == 0 ? "state-0" : "state-1");
    }
    free(fds);
    s->exp.fd = fd;
    fx_free(&f);
}
END_TEST

SUITE_MAIN("restore", "restore", NULL, NULL, 60,
          buffer_id_near_2_64_is_refused, next_buffer_id_near_2_64_is_ignored,
          session_id_near_2_64_is_refused, slab_id_near_2_64_is_refused,
          huge_reference_count_is_one_step, bad_records_are_dropped,
          handover_leaves_out_slabs_without_an_fd, state_before_its_buffer_is_not_bad)
