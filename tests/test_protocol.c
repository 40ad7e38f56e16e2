/* gpubufd facing raw, broken and hostile protocol peers: frames, the
 * handshake, strings and fds it was not asked for, and each request spoken
 * by hand. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <poll.h>
#include <locale.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include "gpubuf.pb-c.h"
#include "harness.h"
#include "wire.h"
#include "check_main.h"
#include "daemon_fixture.h"

/* True when the daemon closed fd (read returns 0) within 5 s. */
static bool closed_by_daemon(int fd) {
    char b[256];
    for (;;) {
        ssize_t n = read(fd, b, sizeof(b));
        if (n == 0)
            return true;
        if (n < 0)
            return errno == ECONNRESET;
    }
}

/* The daemon answers fd with `status` (and, when given, request id `id` and
 * a message containing `words`), then closes the connection. Closes fd. */
static void expect_refusal(int fd, int status, uint64_t id, const char *words) {
    Gpubuf__Response *r = rp_recv(fd, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, status);
    if (id)
        ck_assert_uint_eq(r->id, id);
    if (words)
        ck_assert(strstr(r->message, words) != NULL);
    gpubuf__response__free_unpacked(r, NULL);
    ck_assert(closed_by_daemon(fd));
    close(fd);
}

/* A new connection (after a hello, when hello) gets the n bytes at frame;
 * the daemon refuses them with status and closes the connection. */
static void refuse_frame(bool hello, const void *frame, size_t n, int status) {
    int fd = raw_connect();
    if (hello)
        td_raw_hello(fd);
    ck_assert_int_eq(write(fd, frame, n), (ssize_t)n);
    expect_refusal(fd, status, 0, NULL);
}

START_TEST(garbage_disconnects_only_that_client) {
    gpubuf_client *good = td_connect(&D);
    int fd = raw_connect();
    uint8_t junk[512];
    srand(11);
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (uint8_t)rand();
    ck_assert_int_eq(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
    ck_assert(closed_by_daemon(fd));
    close(fd);
    gpubuf_buffer *b;
    ck_assert_int_eq(gpubuf_alloc(good, NULL, 100, "still", &b), 0);
    gpubuf_release(b);
    gpubuf_disconnect(good);
}
END_TEST

START_TEST(bad_magic_gets_error_then_close) {
    uint8_t h[GPUBUF_WIRE_HEADER_SIZE];
    gpubuf_wire_header_encode(h, 0);
    h[3] = 'X';
    refuse_frame(false, h, sizeof(h), GPUBUF_EPROTOCOL);
    assert_serving();
}
END_TEST

START_TEST(bad_version_header) {
    uint8_t h[GPUBUF_WIRE_HEADER_SIZE];
    gpubuf_wire_header_encode(h, 0);
    h[4] = 9;
    refuse_frame(false, h, sizeof(h), GPUBUF_EVERSION);
}
END_TEST

START_TEST(oversized_frame_rejected) {
    uint8_t h[GPUBUF_WIRE_HEADER_SIZE];
    gpubuf_wire_header_encode(h, 1u << 30);
    refuse_frame(true, h, sizeof(h), -EMSGSIZE);
    assert_serving();
}
END_TEST

START_TEST(truncated_frame_then_hangup) {
    for (int i = 0; i < 20; i++) {
        int fd = raw_connect();
        uint8_t h[GPUBUF_WIRE_HEADER_SIZE + 3];
        gpubuf_wire_header_encode(h, 100);
        ck_assert_int_eq(write(fd, h, sizeof(h)), (ssize_t)sizeof(h));
        close(fd);
    }
    assert_serving();
    ck_assert(td_wait_clients(&D, 0, 2000));
}
END_TEST

START_TEST(undecodable_payload) {
    uint8_t f[GPUBUF_WIRE_HEADER_SIZE + 6] = {0};
    gpubuf_wire_header_encode(f, 6);
    memcpy(f + GPUBUF_WIRE_HEADER_SIZE, "\xff\xff\xff\xff\xff\xff", 6);
    refuse_frame(false, f, sizeof(f), GPUBUF_EPROTOCOL);
    assert_serving();
}
END_TEST

START_TEST(request_before_hello) {
    int fd = raw_connect();
    Gpubuf__StatusRequest st = GPUBUF__STATUS_REQUEST__INIT;
    Gpubuf__Request req = rp_request(5, GPUBUF__REQUEST__BODY_STATUS, &st);
    td_raw_send(fd, &req);
    expect_refusal(fd, GPUBUF_EPROTOCOL, 5, NULL);
}
END_TEST

START_TEST(version_negotiation_fails) {
    int fd = raw_connect();
    rp_hello h;
    rp_hello_init(&h, 0, NULL);
    h.hello.min_version = 2;
    h.hello.max_version = 7;
    td_raw_send(fd, &h.req);
    expect_refusal(fd, GPUBUF_EVERSION, 0, "2..7");
}
END_TEST

START_TEST(empty_request_and_double_hello) {
    int fd = raw_connect();
    td_raw_hello(fd);
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    req.id = 2;
    td_raw_status(fd, &req, -ENOTSUP);
    rp_hello h;
    rp_hello_init(&h, 0, NULL);
    h.req.id = 3;
    td_raw_status(fd, &h.req, GPUBUF_EPROTOCOL);
    /* Still connected and served. */
    Gpubuf__StatusRequest st = GPUBUF__STATUS_REQUEST__INIT;
    req = rp_request(4, GPUBUF__REQUEST__BODY_STATUS, &st);
    td_raw_status(fd, &req, 0);
    close(fd);
}
END_TEST

/* A client asks to resume the session whose id this very connection was
 * given (a fresh gpubufd gives ids from 1 again, so the ids a restarted
 * client asks for come round): it is told that gpubufd started without
 * saved state, not that another connection holds the session. */
START_TEST(resume_of_its_own_id) {
    int a = raw_connect();
    Gpubuf__Response *r = td_raw_hello_caps(a, 0);
    uint64_t mine = r->hello->session_id;
    gpubuf__response__free_unpacked(r, NULL);
    close(a);
    /* Ids count up: the next connection is the next id. */
    int b = raw_connect();
    rp_hello h;
    rp_hello_init(&h, 0, NULL);
    h.hello.resume_session = mine + 1;
    td_raw_send(b, &h.req);
    r = rp_recv(b, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->hello->session_id, mine + 1);
    ck_assert(!r->hello->resumed);
    ck_assert_msg(strstr(r->hello->resume_refused, "started without saved state") != NULL,
                  "refused: %s", r->hello->resume_refused);
    gpubuf__response__free_unpacked(r, NULL);
    close(b);
}
END_TEST

START_TEST(unsolicited_fds_are_closed) {
    int before = td_quiet_fds(&D, 0, 20000);
    ck_assert_int_ge(before, 0);
    for (int i = 0; i < 50; i++) {
        int fd = raw_connect();
        int mfd = memfd_create("x", MFD_CLOEXEC);
        rp_hello h;
        rp_hello_init(&h, 0, NULL);
        ck_assert_int_eq(rp_send(fd, &h.req, mfd), 0);
        close(mfd);
        Gpubuf__Response *r = rp_recv(fd, NULL);
        ck_assert_ptr_nonnull(r);
        ck_assert_int_eq(r->status, 0);
        gpubuf__response__free_unpacked(r, NULL);
        close(fd);
    }
    /* Counted as before was: once every connection that left is closed. */
    int now = td_quiet_fds(&D, 0, 20000);
    ck_assert_int_ge(now, 0);
    ck_assert_int_le(now, before);
}
END_TEST

static int raw_alloc(int fd, uint64_t size, uint64_t *ret_buf, uint64_t *ret_slab,
                     bool *ret_keepable) {
    return raw_alloc_named(fd, size, NULL, ret_buf, ret_slab, ret_keepable);
}

static int raw_release(int fd, uint64_t buffer_id, bool keep) {
    Gpubuf__ReleaseRequest rel = GPUBUF__RELEASE_REQUEST__INIT;
    rel.buffer_id = buffer_id;
    rel.keep_mapped = keep;
    Gpubuf__Request req = rp_request(11, GPUBUF__REQUEST__BODY_RELEASE, &rel);
    return raw_call(fd, &req, NULL, NULL, NULL);
}

static int raw_unmap(int fd, uint64_t slab_id) {
    Gpubuf__UnmapRequest u = GPUBUF__UNMAP_REQUEST__INIT;
    u.slab_id = slab_id;
    Gpubuf__Request req = rp_request(12, GPUBUF__REQUEST__BODY_UNMAP, &u);
    return raw_call(fd, &req, NULL, NULL, NULL);
}

/* The KEEP_MAPPED requests: refused without the capability, checked with. */
START_TEST(keep_mapped_protocol) {
    uint64_t buf, slab;
    bool keepable = true;
    int fd = raw_connect();
    td_raw_hello(fd); /* no capabilities */
    ck_assert_int_eq(raw_alloc(fd, 1000, &buf, &slab, &keepable), 0);
    ck_assert(!keepable);
    ck_assert_int_eq(raw_release(fd, buf, true), GPUBUF_EPROTOCOL);
    ck_assert_int_eq(raw_release(fd, buf, false), GPUBUF_ENOTHELD); /* it was released */
    ck_assert_int_eq(raw_unmap(fd, slab), GPUBUF_ENOTHELD);
    close(fd);

    fd = raw_connect();
    /* Unknown capability bits are ignored. */
    Gpubuf__Response *r = td_raw_hello_caps(fd, GPUBUF_CAP_KEEP_MAPPED | (1ull << 40));
    ck_assert_uint_eq(r->hello->capabilities, GPUBUF_CAP_KEEP_MAPPED);
    ck_assert_uint_eq(r->hello->max_kept_slabs, 8);
    uint64_t session = r->hello->session_id;
    gpubuf__response__free_unpacked(r, NULL);
    ck_assert_int_eq(raw_alloc(fd, 1000, &buf, &slab, &keepable), 0);
    ck_assert(keepable);
    ck_assert_int_eq(raw_release(fd, buf, true), 0);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->pools[0].used, 0);
    ck_assert_uint_eq(s->pools[0].slabs, 1);
    for (size_t i = 0; i < s->n_clients; i++)
        if (s->clients[i].session_id == session)
            ck_assert_uint_eq(s->clients[i].kept_slabs, 1);
    gpubuf_status_free(s);
    ck_assert_int_eq(raw_unmap(fd, slab), 0);
    ck_assert_int_eq(raw_unmap(fd, slab), GPUBUF_ENOTHELD);
    /* A dedicated slab (above the 4 MiB slab size) cannot be kept. */
    ck_assert_int_eq(raw_alloc(fd, 5 << 20, &buf, &slab, &keepable), 0);
    ck_assert(!keepable);
    ck_assert_int_eq(raw_release(fd, buf, true), -EINVAL);
    ck_assert_int_eq(raw_unmap(fd, slab), GPUBUF_ENOTHELD);
    close(fd);
    ck_assert(td_wait_clients(&D, 0, 2000));
    s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 0);
    ck_assert_uint_eq(s->pools[0].used, 0);
    ck_assert_uint_le(s->pools[0].slabs, 1);
    gpubuf_status_free(s);
}
END_TEST

/* A status request without columnar gets a Buffer message per buffer, with
 * it the same facts as columns. */
START_TEST(status_rows_and_columns_agree) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b[3];
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 1000, "rows/a", &b[0]), 0);
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 5000, NULL, &b[1]), 0);
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 300, "rows/c", &b[2]), 0);
    ck_assert_int_eq(gpubuf_seal_sync(b[2]), 0);
    int fd = raw_connect();
    td_raw_hello(fd);
    Gpubuf__Response *rows = raw_status(fd, false), *cols = raw_status(fd, true);
    const Gpubuf__StatusReply *R = rows->status_reply, *C = cols->status_reply;
    ck_assert_ptr_null(R->buffer_columns);
    ck_assert_uint_eq(C->n_buffers, 0);
    ck_assert_ptr_nonnull(C->buffer_columns);
    const Gpubuf__BufferColumns *k = C->buffer_columns;
    ck_assert_uint_eq(R->n_buffers, 3);
    ck_assert_uint_eq(k->n_id, 3);
    const char *name = (const char *)k->names.data;
    for (size_t i = 0; i < 3; i++) {
        const Gpubuf__Buffer *x = R->buffers[i];
        ck_assert_uint_eq(k->id[i], x->buffer_id);
        ck_assert_str_eq(name, x->name);
        name += strlen(name) + 1;
        ck_assert_str_eq(C->pools[k->pool[i]]->name, x->pool);
        ck_assert_uint_eq(k->size[i], x->size);
        ck_assert_uint_eq(k->offset[i], x->offset);
        ck_assert_uint_eq(k->state[i], (uint32_t)x->state);
        ck_assert_uint_eq(k->refs[i], x->refs);
        ck_assert_uint_eq(k->owner_uid[i], x->owner_uid);
        ck_assert_uint_eq(k->slab_id[i], x->slab_id);
    }
    ck_assert_ptr_eq(name, (const char *)k->names.data + k->names.len);
    gpubuf__response__free_unpacked(rows, NULL);
    gpubuf__response__free_unpacked(cols, NULL);
    close(fd);
    for (int i = 0; i < 3; i++)
        gpubuf_release(b[i]);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(release_not_held_and_double_release) {
    int fd = raw_connect();
    td_raw_hello(fd);
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    Gpubuf__ReleaseRequest rel = GPUBUF__RELEASE_REQUEST__INIT;
    int mfd;
    a.size = 1000;
    Gpubuf__Request req = rp_request(2, GPUBUF__REQUEST__BODY_ALLOC, &a);
    td_raw_send(fd, &req);
    Gpubuf__Response *r = rp_recv(fd, &mfd);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_ge(mfd, 0); /* host slabs come with their memfd */
    close(mfd);
    uint64_t id = r->buffer->buffer_id;
    gpubuf__response__free_unpacked(r, NULL);
    rel.buffer_id = id + 1000;
    req = rp_request(3, GPUBUF__REQUEST__BODY_RELEASE, &rel);
    td_raw_status(fd, &req, GPUBUF_ENOTHELD);
    rel.buffer_id = id;
    for (int i = 0; i < 2; i++) {
        req.id = 4 + (uint64_t)i;
        td_raw_status(fd, &req, i == 0 ? 0 : GPUBUF_ENOTHELD);
    }
    close(fd);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 0);
    ck_assert_uint_eq(s->pools[0].used, 0);
    gpubuf_status_free(s);
}
END_TEST

START_TEST(pipelined_requests_answered_in_order) {
    int fd = raw_connect();
    td_raw_hello(fd);
    /* 200 requests in one write: more than one wake-up's worth. */
    size_t cap = 200 * 32, len = 0;
    uint8_t *buf = malloc(cap);
    for (int i = 0; i < 200; i++)
        len += pack_stat(buf + len, 100 + (uint64_t)i, 77);
    ck_assert_int_eq(gpubuf_wire_send_all(fd, buf, len, -1), 0);
    free(buf);
    for (int i = 0; i < 200; i++) {
        Gpubuf__Response *r = rp_recv(fd, NULL);
        ck_assert_ptr_nonnull(r);
        ck_assert_uint_eq(r->id, 100 + (uint64_t)i);
        ck_assert_int_eq(r->status, -ENOENT);
        gpubuf__response__free_unpacked(r, NULL);
    }
    close(fd);
}
END_TEST

START_TEST(requests_before_hangup_are_answered) {
    int fd = raw_connect();
    td_raw_hello(fd);
    /* 300 requests, then the write side closes: all are answered anyway,
     * beyond the per-wake-up cap. */
    uint8_t *buf = malloc(300 * 32);
    size_t len = 0;
    for (int i = 0; i < 300; i++)
        len += pack_stat(buf + len, 1000 + (uint64_t)i, 5);
    ck_assert_int_eq(gpubuf_wire_send_all(fd, buf, len, -1), 0);
    free(buf);
    shutdown(fd, SHUT_WR);
    for (int i = 0; i < 300; i++) {
        Gpubuf__Response *r = rp_recv(fd, NULL);
        ck_assert_msg(r != NULL, "reply %d missing", i);
        ck_assert_uint_eq(r->id, 1000 + (uint64_t)i);
        gpubuf__response__free_unpacked(r, NULL);
    }
    close(fd);
}
END_TEST

/* Pack req, turn each '#' inside the string mark of its payload into a NUL
 * (protobuf-c packs C strings, so a NUL cannot be written otherwise), send. */
static void raw_send_nul(int fd, Gpubuf__Request *req, const char *mark) {
    uint8_t buf[4096];
    ck_assert_uint_le(rp_frame_size(req), sizeof(buf));
    size_t n = rp_frame(buf, req) - GPUBUF_WIRE_HEADER_SIZE;
    uint8_t *at = memmem(buf + GPUBUF_WIRE_HEADER_SIZE, n, mark, strlen(mark));
    ck_assert_ptr_nonnull(at);
    for (size_t i = 0; i < strlen(mark); i++)
        if (at[i] == '#')
            at[i] = '\0';
    ck_assert_int_eq(gpubuf_wire_send_all(fd, buf, n + GPUBUF_WIRE_HEADER_SIZE, -1), 0);
}

/* Send req with a NUL in mark (raw_send_nul); the reply must refuse it
 * with -EINVAL, naming the string field. */
static void expect_nul_refused(int fd, Gpubuf__Request *req, const char *mark,
                               const char *field) {
    char want[64];
    raw_send_nul(fd, req, mark);
    Gpubuf__Response *r = rp_recv(fd, NULL);
    ck_assert_ptr_nonnull(r);
    snprintf(want, sizeof(want), "string field '%s'", field);
    ck_assert_msg(r->status == -EINVAL && r->message && strstr(r->message, want) &&
                      strstr(r->message, "NUL"),
                  "%s: status %d, message %s", mark, r->status, r->message ? r->message : "");
    gpubuf__response__free_unpacked(r, NULL);
}

/* A string with a NUL byte is refused in every request, never cut at the
 * NUL: "frames\0evil" must not publish "frames", "host\0x" must not name
 * pool "host". The connection keeps being served. */
START_TEST(wire_strings_with_nul_refused) {
    rp_hello h;
    rp_hello_init(&h, 0, "nul#name");
    int fd = raw_connect();
    expect_nul_refused(fd, &h.req, "nul#name", "client_name");
    ck_assert_ptr_null(rp_recv(fd, NULL)); /* no session without a clean hello */
    close(fd);

    fd = raw_connect();
    td_raw_hello(fd);
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    a.size = 4096;
    a.name = "frames#evil";
    Gpubuf__Request req = rp_request(2, GPUBUF__REQUEST__BODY_ALLOC, &a);
    expect_nul_refused(fd, &req, "frames#evil", "name");
    a.name = "fine";
    a.pool = "host#x";
    expect_nul_refused(fd, &req, "host#x", "pool");
    /* The same request, now an open by name. */
    Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
    o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
    o.name = "frames#";
    req = rp_request(req.id, GPUBUF__REQUEST__BODY_OPEN, &o);
    expect_nul_refused(fd, &req, "frames#", "name");
    /* Nothing was published under the part before the NUL, and the same
     * connection goes on: a clean alloc works. */
    gpubuf_status *st = td_status(&D);
    ck_assert_uint_eq(st->n_buffers, 0);
    gpubuf_status_free(st);
    uint64_t id;
    ck_assert_int_eq(raw_alloc(fd, 4096, &id, NULL, NULL), 0);
    close(fd);
    assert_serving();
}
END_TEST

/* Wait for buffer id *arg; 0 when the open fails as the buffer goes. */
static int open_id_until_gone(const test_daemon *d, void *arg) {
    return td_open_once(d, NULL, *(uint64_t *)arg, -1, -1) == -ENOENT ? 0 : 2;
}

START_TEST(waiting_open_fails_when_buffer_goes) {
    gpubuf_client *a = td_connect(&D);
    gpubuf_buffer *x;
    ck_assert_int_eq(gpubuf_alloc(a, NULL, 4096, "pending", &x), 0);
    uint64_t id = gpubuf_buffer_id(x);
    pid_t p = td_spawn(open_id_until_gone, &D, &id);
    ck_assert(td_wait_clients(&D, 2, 2000));
    ck_assert_int_eq(gpubuf_delete(a, "pending"), 0);
    ck_assert_int_eq(td_wait(p), 0);
    gpubuf_release(x);
    gpubuf_disconnect(a);
}
END_TEST

/* Read-only opens hand out a read-only file description, which a receiver of
 * another uid cannot reopen for writing through /proc; seal events are
 * checked. */
START_TEST(read_only_fd_and_seal_event) {
    int fd = raw_connect(), afd = -1;
    uint64_t buf, slab;
    td_raw_hello(fd);
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    a.size = 4096;
    a.name = "rofd";
    Gpubuf__Request req = rp_request(2, GPUBUF__REQUEST__BODY_ALLOC, &a);
    ck_assert_int_eq(raw_call(fd, &req, &buf, &slab, NULL), 0);

    /* A seal event must be 64 bytes, and needs a CUDA pool. */
    uint8_t ev[64] = {1};
    Gpubuf__SealRequest sq = GPUBUF__SEAL_REQUEST__INIT;
    sq.buffer_id = buf;
    sq.event_handle.data = ev;
    sq.event_handle.len = 10;
    req = rp_request(3, GPUBUF__REQUEST__BODY_SEAL, &sq);
    td_raw_send(fd, &req);
    Gpubuf__Response *r = rp_recv(fd, NULL);
    ck_assert_int_eq(r->status, -EINVAL);
    ck_assert_ptr_nonnull(strstr(r->message, "64 bytes"));
    gpubuf__response__free_unpacked(r, NULL);
    sq.event_handle.len = 64;
    td_raw_send(fd, &req);
    r = rp_recv(fd, NULL);
    ck_assert_int_eq(r->status, -EINVAL);
    ck_assert_ptr_nonnull(strstr(r->message, "needs a CUDA pool"));
    gpubuf__response__free_unpacked(r, NULL);
    sq.event_handle.len = 0;
    ck_assert_int_eq(raw_call(fd, &req, NULL, NULL, NULL), 0);

    /* Open read-only: the fd is O_RDONLY and the slab says read_only. */
    Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
    o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
    o.name = "rofd";
    o.read_only = true;
    req = rp_request(4, GPUBUF__REQUEST__BODY_OPEN, &o);
    td_raw_send(fd, &req);
    r = rp_recv(fd, &afd);
    ck_assert_int_eq(r->status, 0);
    ck_assert(r->buffer->read_only && r->buffer->slab->read_only && !r->buffer->slab->keepable);
    gpubuf__response__free_unpacked(r, NULL);
    ck_assert_int_ge(afd, 0);
    ck_assert_int_eq(fcntl(afd, F_GETFL) & O_ACCMODE, O_RDONLY);
    ck_assert_ptr_eq(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, afd, 0), MAP_FAILED);
    void *m = mmap(NULL, 4096, PROT_READ, MAP_SHARED, afd, 0);
    ck_assert_ptr_ne(m, MAP_FAILED);
    munmap(m, 4096);
    /* Another uid holding the fd cannot reopen it for writing. */
    if (geteuid() == 0) {
        fflush(NULL);
        pid_t p = fork();
        if (p == 0) {
            char path[64];
            if (setgid(65534) < 0 || setuid(65534) < 0)
                _exit(2);
            snprintf(path, sizeof(path), "/proc/self/fd/%d", afd);
            int w = open(path, O_RDWR);
            _exit(w < 0 && errno == EACCES ? 0 : 1);
        }
        ck_assert_int_eq(td_wait(p), 0);
    }
    close(afd);
    /* A writable open of the same buffer gets a read-write fd. */
    o.read_only = false;
    td_raw_send(fd, &req);
    r = rp_recv(fd, &afd);
    ck_assert_int_eq(r->status, 0);
    ck_assert(!r->buffer->read_only && !r->buffer->slab->read_only);
    gpubuf__response__free_unpacked(r, NULL);
    ck_assert_int_eq(fcntl(afd, F_GETFL) & O_ACCMODE, O_RDWR);
    close(afd);
    close(fd);
}
END_TEST

SUITE_MAIN("protocol", "protocol", start_default, td_stop_clean, 60,
          garbage_disconnects_only_that_client, bad_magic_gets_error_then_close,
          bad_version_header, oversized_frame_rejected, truncated_frame_then_hangup,
          undecodable_payload, request_before_hello, version_negotiation_fails,
          empty_request_and_double_hello, resume_of_its_own_id, unsolicited_fds_are_closed,
          release_not_held_and_double_release, read_only_fd_and_seal_event,
          keep_mapped_protocol, status_rows_and_columns_agree,
          pipelined_requests_answered_in_order, requests_before_hangup_are_answered,
          waiting_open_fails_when_buffer_goes, wire_strings_with_nul_refused)
