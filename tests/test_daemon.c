/* gpubufd as a server facing raw, broken and hostile protocol peers, its
 * shutdown, its configuration, and gpubufctl's output. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <poll.h>
#include <json-c/json.h>
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

static test_daemon D;

static void start_default(void) {
    static const char *const args[] = {"--pool", "host=host,capacity=256M,slab=4M", NULL};
    td_start(&D, args);
}

static void stop_clean(void) {
    ck_assert_int_eq(td_stop(&D), 0);
}

static int raw_connect(void) {
    return td_raw_connect(&D, 5);
}

/* Write one framed stat-by-id request at out; returns its length. */
static size_t pack_stat(uint8_t *out, uint64_t request_id, uint64_t buffer_id) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__StatRequest st = GPUBUF__STAT_REQUEST__INIT;
    st.target_case = GPUBUF__STAT_REQUEST__TARGET_BUFFER_ID;
    st.buffer_id = buffer_id;
    req.id = request_id;
    req.body_case = GPUBUF__REQUEST__BODY_STAT;
    req.stat = &st;
    return rp_frame(out, &req);
}

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

/* The daemon still serves a well-behaved client. */
static void assert_serving(void) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, NULL, &b), 0);
    gpubuf_release(b);
    gpubuf_disconnect(c);
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
    int fd = raw_connect();
    uint8_t h[GPUBUF_WIRE_HEADER_SIZE];
    gpubuf_wire_header_encode(h, 0);
    h[3] = 'X';
    ck_assert_int_eq(write(fd, h, sizeof(h)), (ssize_t)sizeof(h));
    expect_refusal(fd, GPUBUF_EPROTOCOL, 0, NULL);
    assert_serving();
}
END_TEST

START_TEST(bad_version_header) {
    int fd = raw_connect();
    uint8_t h[GPUBUF_WIRE_HEADER_SIZE];
    gpubuf_wire_header_encode(h, 0);
    h[4] = 9;
    ck_assert_int_eq(write(fd, h, sizeof(h)), (ssize_t)sizeof(h));
    expect_refusal(fd, GPUBUF_EVERSION, 0, NULL);
}
END_TEST

START_TEST(oversized_frame_rejected) {
    int fd = raw_connect();
    uint8_t h[GPUBUF_WIRE_HEADER_SIZE];
    td_raw_hello(fd);
    gpubuf_wire_header_encode(h, 1u << 30);
    ck_assert_int_eq(write(fd, h, sizeof(h)), (ssize_t)sizeof(h));
    expect_refusal(fd, -EMSGSIZE, 0, NULL);
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
    int fd = raw_connect();
    uint8_t f[GPUBUF_WIRE_HEADER_SIZE + 6] = {0};
    gpubuf_wire_header_encode(f, 6);
    memcpy(f + GPUBUF_WIRE_HEADER_SIZE, "\xff\xff\xff\xff\xff\xff", 6);
    ck_assert_int_eq(write(fd, f, sizeof(f)), (ssize_t)sizeof(f));
    expect_refusal(fd, GPUBUF_EPROTOCOL, 0, NULL);
    assert_serving();
}
END_TEST

START_TEST(request_before_hello) {
    int fd = raw_connect();
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__StatusRequest st = GPUBUF__STATUS_REQUEST__INIT;
    req.id = 5;
    req.body_case = GPUBUF__REQUEST__BODY_STATUS;
    req.status = &st;
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
    td_raw_send(fd, &req);
    Gpubuf__Response *r = rp_recv(fd, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, -ENOTSUP);
    gpubuf__response__free_unpacked(r, NULL);
    rp_hello h;
    rp_hello_init(&h, 0, NULL);
    h.req.id = 3;
    td_raw_send(fd, &h.req);
    r = rp_recv(fd, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, GPUBUF_EPROTOCOL);
    gpubuf__response__free_unpacked(r, NULL);
    /* Still connected and served. */
    Gpubuf__StatusRequest st = GPUBUF__STATUS_REQUEST__INIT;
    req.id = 4;
    req.body_case = GPUBUF__REQUEST__BODY_STATUS;
    req.status = &st;
    td_raw_send(fd, &req);
    r = rp_recv(fd, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->id, 4);
    gpubuf__response__free_unpacked(r, NULL);
    close(fd);
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
    ck_assert(td_wait_clients(&D, 0, 2000));
    /* A connection's fd is closed one loop turn after it leaves the
     * client list: allow for that. */
    int now = -1;
    for (int i = 0; i < 200 && (now = td_count_fds(D.pid)) > before; i++)
        usleep(5000);
    ck_assert_int_le(now, before);
}
END_TEST

/* One raw request/response; the response's status. *ret_buf/ret_slab get a
 * buffer reply's ids (attached fds are closed). */
static int raw_call(int fd, Gpubuf__Request *req, uint64_t *ret_buf, uint64_t *ret_slab,
                    bool *ret_keepable) {
    td_raw_send(fd, req);
    Gpubuf__Response *r = rp_recv(fd, NULL);
    ck_assert_ptr_nonnull(r);
    int st = r->status;
    if (r->body_case == GPUBUF__RESPONSE__BODY_BUFFER) {
        if (ret_buf)
            *ret_buf = r->buffer->buffer_id;
        if (ret_slab)
            *ret_slab = r->buffer->slab_id;
        if (ret_keepable)
            *ret_keepable = r->buffer->slab && r->buffer->slab->keepable;
    }
    gpubuf__response__free_unpacked(r, NULL);
    return st;
}

static int raw_alloc_named(int fd, uint64_t size, const char *name, uint64_t *ret_buf,
                           uint64_t *ret_slab, bool *ret_keepable) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    a.size = size;
    if (name)
        a.name = (char *)name;
    req.id = 10;
    req.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    req.alloc = &a;
    return raw_call(fd, &req, ret_buf, ret_slab, ret_keepable);
}

static int raw_alloc(int fd, uint64_t size, uint64_t *ret_buf, uint64_t *ret_slab,
                     bool *ret_keepable) {
    return raw_alloc_named(fd, size, NULL, ret_buf, ret_slab, ret_keepable);
}

static int raw_release(int fd, uint64_t buffer_id, bool keep) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__ReleaseRequest rel = GPUBUF__RELEASE_REQUEST__INIT;
    rel.buffer_id = buffer_id;
    rel.keep_mapped = keep;
    req.id = 11;
    req.body_case = GPUBUF__REQUEST__BODY_RELEASE;
    req.release = &rel;
    return raw_call(fd, &req, NULL, NULL, NULL);
}

static int raw_unmap(int fd, uint64_t slab_id) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__UnmapRequest u = GPUBUF__UNMAP_REQUEST__INIT;
    u.slab_id = slab_id;
    req.id = 12;
    req.body_case = GPUBUF__REQUEST__BODY_UNMAP;
    req.unmap = &u;
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

static Gpubuf__Response *raw_status(int fd, bool columnar) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__StatusRequest sr = GPUBUF__STATUS_REQUEST__INIT;
    sr.columnar = columnar;
    req.id = 20;
    req.body_case = GPUBUF__REQUEST__BODY_STATUS;
    req.status = &sr;
    return td_raw_expect(fd, &req, GPUBUF__RESPONSE__BODY_STATUS_REPLY);
}

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
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    Gpubuf__ReleaseRequest rel = GPUBUF__RELEASE_REQUEST__INIT;
    int mfd;
    a.size = 1000;
    req.id = 2;
    req.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    req.alloc = &a;
    td_raw_send(fd, &req);
    Gpubuf__Response *r = rp_recv(fd, &mfd);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_ge(mfd, 0); /* host slabs come with their memfd */
    close(mfd);
    uint64_t id = r->buffer->buffer_id;
    gpubuf__response__free_unpacked(r, NULL);
    rel.buffer_id = id + 1000;
    req.id = 3;
    req.body_case = GPUBUF__REQUEST__BODY_RELEASE;
    req.release = &rel;
    td_raw_send(fd, &req);
    r = rp_recv(fd, NULL);
    ck_assert_int_eq(r->status, GPUBUF_ENOTHELD);
    gpubuf__response__free_unpacked(r, NULL);
    rel.buffer_id = id;
    for (int i = 0; i < 2; i++) {
        req.id = 4 + (uint64_t)i;
        td_raw_send(fd, &req);
        r = rp_recv(fd, NULL);
        ck_assert_int_eq(r->status, i == 0 ? 0 : GPUBUF_ENOTHELD);
        gpubuf__response__free_unpacked(r, NULL);
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

static double stat_ms(void) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer_info info;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    gpubuf_stat(c, "nothing", &info);
    clock_gettime(CLOCK_MONOTONIC, &b);
    gpubuf_disconnect(c);
    return (double)(b.tv_sec - a.tv_sec) * 1e3 + (double)(b.tv_nsec - a.tv_nsec) / 1e6;
}

/* A client that published n sealed buffers with 240-byte names (each adds
 * about 300 bytes to a status reply). */
static gpubuf_client *publish_long_names_on(const test_daemon *d, int n) {
    gpubuf_client *c = td_connect(d);
    char name[300];
    for (int i = 0; i < n; i++) {
        gpubuf_buffer *b;
        snprintf(name, sizeof(name), "%0240d", i);
        ck_assert_int_eq(gpubuf_alloc(c, NULL, 1, name, &b), 0);
        ck_assert_int_eq(gpubuf_seal(b), 0);
        ck_assert_int_eq(gpubuf_release(b), 0); /* sealed and named: it stays */
    }
    ck_assert_int_eq(gpubuf_flush(c), 0);
    return c;
}

static gpubuf_client *publish_long_names(int n) {
    return publish_long_names_on(&D, n);
}

/* One status request frame (rows) in frame; returns its length. */
static size_t status_frame(uint8_t frame[64]) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__StatusRequest st = GPUBUF__STATUS_REQUEST__INIT;
    req.id = 9;
    req.body_case = GPUBUF__REQUEST__BODY_STATUS;
    req.status = &st;
    size_t n = gpubuf__request__pack(&req, frame + GPUBUF_WIRE_HEADER_SIZE);
    gpubuf_wire_header_encode(frame, (uint32_t)n);
    return n + GPUBUF_WIRE_HEADER_SIZE;
}

START_TEST(big_replies_unread_stay_bounded) {
    /* 2000 buffers with long names make each status reply ~0.6 MB. */
    gpubuf_client *c = publish_long_names(2000);
    long before = td_rss_kib(D.pid);
    int fd = raw_connect();
    td_raw_hello(fd);
    uint8_t frame[64];
    size_t n = status_frame(frame);
    fcntl(fd, F_SETFL, O_NONBLOCK);
    /* 400 status requests, never a read: the daemon stops taking them once
     * about a megabyte of replies waits, instead of building them all. */
    for (int i = 0; i < 400; i++)
        if (send(fd, frame, n, MSG_NOSIGNAL) < 0)
            break;
    usleep(300000); /* time to take more if it would: measures a duration */
    long after = td_rss_kib(D.pid);
    ck_assert_msg(after - before < 64 * 1024, "daemon RSS %ld -> %ld KiB", before, after);
    ck_assert_msg(stat_ms() < 1000, "others are not served");
    close(fd);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(departed_writer_cannot_hold_the_loop) {
    pid_t p = fork();
    if (p == 0) {
        /* Refuses to read, so the daemon's first reply fails, then writes
         * requests for 3 s. */
        int fd = raw_connect();
        shutdown(fd, SHUT_RD);
        uint8_t f[64];
        rp_hello h;
        rp_hello_init(&h, 0, NULL);
        if (rp_send(fd, &h.req, -1) < 0)
            _exit(0);
        size_t n = pack_stat(f, 2, 1);
        struct timespec t0, now;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        do {
            if (gpubuf_wire_send_all(fd, f, n, -1) < 0)
                break;
            clock_gettime(CLOCK_MONOTONIC, &now);
        } while (now.tv_sec - t0.tv_sec < 3);
        _exit(0);
    }
    usleep(300000); /* the writer is under way: measures a duration */
    double worst = 0;
    for (int i = 0; i < 10; i++) {
        double ms = stat_ms();
        worst = ms > worst ? ms : worst;
        usleep(100000); /* samples over a second: measures a duration */
    }
    ck_assert_msg(worst < 1000, "another client waited %.0f ms", worst);
    kill(p, SIGKILL);
    td_wait(p);
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

START_TEST(sigterm_with_live_clients) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "live", &b), 0);
    /* A second client blocked in a waiting open. */
    int sync[2];
    ck_assert_int_eq(pipe(sync), 0);
    pid_t p = fork();
    if (p == 0) {
        gpubuf_client *w;
        gpubuf_buffer *x;
        if (gpubuf_connect(D.socket, &w) < 0)
            _exit(1);
        if (write(sync[1], "c", 1) != 1)
            _exit(3);
        int r = gpubuf_open(w, "never-sealed", -1, &x);
        _exit(r == -ESHUTDOWN || r == GPUBUF_EDISCONNECTED ? 0 : 2);
    }
    char ch;
    ck_assert_int_eq(read(sync[0], &ch, 1), 1);
    ck_assert(td_wait_waiting_opens(&D, 1, 10000)); /* the open reaches the daemon and waits */
    ck_assert_int_eq(td_stop(&D), 0);
    ck_assert_int_eq(td_wait(p), 0);
    /* Our own next request fails cleanly. */
    gpubuf_buffer *y = NULL;
    int r = gpubuf_alloc(c, NULL, 4096, NULL, &y);
    ck_assert(r == -ESHUTDOWN || r == GPUBUF_EDISCONNECTED || r == -ECONNRESET || r == -EPIPE);
    ck_assert_ptr_null(y);
    ck_assert_int_eq(access(D.socket, F_OK), -1);
    gpubuf_release(b);
    gpubuf_disconnect(c);
    /* Restart on the same socket: clients reconnect. */
    start_default();
    assert_serving();
}
END_TEST

START_TEST(second_daemon_refuses_live_socket) {
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "%s --socket %s --pool h=host 2>/dev/null", GPUBUFD_PATH,
             D.socket);
    int st = system(cmd);
    ck_assert(WIFEXITED(st));
    ck_assert_int_eq(WEXITSTATUS(st), 1);
    assert_serving();
}
END_TEST

/* Run gpubufd with the arguments printf formats, stderr into the output;
 * returns the output and stores the exit status. */
__attribute__((format(printf, 2, 3))) static char *run_gpubufd(int *ret_exit, const char *fmt,
                                                              ...) {
    char args[512], cmd[700];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof(args), fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof(cmd), "%s %s 2>&1", GPUBUFD_PATH, args);
    return td_capture(cmd, ret_exit);
}

START_TEST(gpubufctl_table_and_json) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b, *o;
    char cmd[512];
    int st;
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 3 << 20, "ctl-demo", &b), 0);
    ck_assert_int_eq(gpubuf_seal(b), 0);
    ck_assert_int_eq(gpubuf_open(c, "ctl-demo", 0, &o), 0);
    snprintf(cmd, sizeof(cmd), "%s --socket %s status", GPUBUFCTL_PATH, D.socket);
    char *out = td_capture(cmd, &st);
    ck_assert_int_eq(st, 0);
    ck_assert(strstr(out, "ctl-demo") != NULL);
    ck_assert(strstr(out, "sealed") != NULL);
    ck_assert(strstr(out, "3.0 MiB") != NULL);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s --socket %s --json status", GPUBUFCTL_PATH, D.socket);
    out = td_capture(cmd, &st);
    ck_assert_int_eq(st, 0);
    json_object *j = json_tokener_parse(out);
    ck_assert_ptr_nonnull(j);
    json_object *pools, *bufs, *clients, *x;
    ck_assert(json_object_object_get_ex(j, "pools", &pools));
    ck_assert(json_object_object_get_ex(j, "buffers", &bufs));
    ck_assert(json_object_object_get_ex(j, "clients", &clients));
    ck_assert_int_eq(json_object_array_length(pools), 1);
    ck_assert_int_eq(json_object_array_length(bufs), 1);
    x = json_object_array_get_idx(bufs, 0);
    ck_assert_str_eq(json_object_get_string(json_object_object_get(x, "name")), "ctl-demo");
    ck_assert_int_eq(json_object_get_int(json_object_object_get(x, "refs")), 2);
    ck_assert_str_eq(json_object_get_string(json_object_object_get(x, "state")), "sealed");
    x = json_object_array_get_idx(pools, 0);
    ck_assert_int_eq(json_object_get_int64(json_object_object_get(x, "used")), 3 << 20);
    ck_assert_str_eq(json_object_get_string(json_object_object_get(x, "kind")), "host");
    /* Our client (2 refs) and gpubufctl itself. */
    ck_assert_int_eq(json_object_array_length(clients), 2);
    json_object_put(j);
    free(out);
    gpubuf_release(o);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

/* Pack req, turn each '#' inside the string mark of its payload into a NUL
 * (protobuf-c packs C strings, so a NUL cannot be written otherwise), send. */
static void raw_send_nul(int fd, Gpubuf__Request *req, const char *mark) {
    uint8_t buf[4096];
    size_t n = gpubuf__request__pack(req, buf + GPUBUF_WIRE_HEADER_SIZE);
    uint8_t *at = memmem(buf + GPUBUF_WIRE_HEADER_SIZE, n, mark, strlen(mark));
    ck_assert_ptr_nonnull(at);
    for (size_t i = 0; i < strlen(mark); i++)
        if (at[i] == '#')
            at[i] = '\0';
    gpubuf_wire_header_encode(buf, (uint32_t)n);
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
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    req.id = 2;
    req.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    req.alloc = &a;
    expect_nul_refused(fd, &req, "frames#evil", "name");
    a.name = "fine";
    a.pool = "host#x";
    expect_nul_refused(fd, &req, "host#x", "pool");
    /* The same request, now an open by name. */
    Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
    o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
    o.name = "frames#";
    req.body_case = GPUBUF__REQUEST__BODY_OPEN, req.open = &o;
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

/* True when s is valid UTF-8 without control characters but '\n' (checked
 * with the C library's decoder, not with gpubuf's). */
static bool printable_utf8(const char *s) {
    mbstate_t ps;
    memset(&ps, 0, sizeof(ps));
    size_t n = strlen(s);
    while (n) {
        wchar_t wc;
        size_t k = mbrtowc(&wc, s, n, &ps);
        if (k == (size_t)-1 || k == (size_t)-2 || k == 0)
            return false;
        if ((wc < 0x20 && wc != '\n') || (wc >= 0x7f && wc <= 0x9f) || wc == 0x202e)
            return false;
        s += k;
        n -= k;
    }
    return true;
}

/* Client names with terminal escapes, newlines, invalid UTF-8, bidi marks or
 * a character across the 63-byte cut reach gpubufctl's table, JSON and
 * metrics as printable, valid UTF-8; the JSON parses with UTF-8 checks on. */
START_TEST(client_names_clean_in_gpubufctl) {
    static const struct {
        const char *sent, *shown;
    } names[] = {
        {"\x1b]0;pwned\x07\x1b[2J", "\\x1b]0;pwned\\x07\\x1b[2J"},
        {"evil\n99 1 0 forged-row", "evil\\x0a99 1 0 forged-row"},
        {"bad\xff\xfe\xc3", "bad\\xff\\xfe\\xc3"},
        {"rtl\xe2\x80\xaegnp.exe", "rtl\\xe2\\x80\\xaegnp.exe"},
        {"caf\xc3\xa9", "caf\xc3\xa9"},
        /* 62 bytes, then a 2-byte character across the cut at 63 bytes */
        {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\xc3\xa9",
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"},
    };
    enum { N = sizeof(names) / sizeof(names[0]) };
    int fds[N];
    ck_assert_ptr_nonnull(setlocale(LC_CTYPE, "C.UTF-8"));
    for (int i = 0; i < N; i++) {
        rp_hello h;
        rp_hello_init(&h, 0, names[i].sent);
        fds[i] = raw_connect();
        gpubuf__response__free_unpacked(
            td_raw_expect(fds[i], &h.req, GPUBUF__RESPONSE__BODY_HELLO), NULL);
    }
    char cmd[512];
    int st;
    snprintf(cmd, sizeof(cmd), "%s --socket %s --json clients", GPUBUFCTL_PATH, D.socket);
    char *out = td_capture(cmd, &st);
    ck_assert_int_eq(st, 0);
    json_tokener *tok = json_tokener_new();
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *j = json_tokener_parse_ex(tok, out, (int)strlen(out));
    ck_assert_msg(j != NULL, "gpubufctl --json is not valid JSON (%s): %s",
                  json_tokener_error_desc(json_tokener_get_error(tok)), out);
    json_tokener_free(tok);
    json_object *clients;
    ck_assert(json_object_object_get_ex(j, "clients", &clients));
    for (int i = 0; i < N; i++) {
        bool found = false;
        for (size_t k = 0; k < json_object_array_length(clients); k++) {
            const char *got = json_object_get_string(
                json_object_object_get(json_object_array_get_idx(clients, k), "name"));
            found |= strcmp(got, names[i].shown) == 0;
        }
        ck_assert_msg(found, "client %d not shown as '%s' in %s", i, names[i].shown, out);
    }
    json_object_put(j);
    free(out);
    /* The table: one row per client (this query's included), nothing a
     * terminal would act on. */
    snprintf(cmd, sizeof(cmd), "%s --socket %s clients", GPUBUFCTL_PATH, D.socket);
    out = td_capture(cmd, &st);
    ck_assert_int_eq(st, 0);
    ck_assert_msg(printable_utf8(out), "table: %s", out);
    int rows = 0;
    for (const char *p = out; *p; p++)
        rows += *p == '\n';
    ck_assert_int_eq(rows, 1 + N + 1);
    ck_assert_msg(strstr(out, "\\x1b]0;pwned") != NULL, "table: %s", out);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s --socket %s status", GPUBUFCTL_PATH, D.socket);
    out = td_capture(cmd, &st);
    ck_assert_int_eq(st, 0);
    ck_assert_msg(printable_utf8(out), "status: %s", out);
    free(out);
    snprintf(cmd, sizeof(cmd), "%s --socket %s metrics", GPUBUFCTL_PATH, D.socket);
    out = td_capture(cmd, &st);
    ck_assert_int_eq(st, 0);
    ck_assert_msg(printable_utf8(out), "metrics: %s", out);
    free(out);
    for (int i = 0; i < N; i++)
        close(fds[i]);
}
END_TEST

START_TEST(gpubufctl_exit_codes) {
    char cmd[512];
    int st;
    snprintf(cmd, sizeof(cmd), "%s --socket %s/none.sock status 2>/dev/null", GPUBUFCTL_PATH,
             D.dir);
    free(td_capture(cmd, &st));
    ck_assert_int_eq(st, 3);
    snprintf(cmd, sizeof(cmd), "%s --socket %s frobnicate 2>/dev/null", GPUBUFCTL_PATH,
             D.socket);
    free(td_capture(cmd, &st));
    ck_assert_int_eq(st, 2);
    snprintf(cmd, sizeof(cmd), "%s --socket %s --json pools", GPUBUFCTL_PATH, D.socket);
    char *out = td_capture(cmd, &st);
    ck_assert_int_eq(st, 0);
    ck_assert(strstr(out, "\"buffers\":[") == NULL);
    ck_assert(strstr(out, "\"pools\"") != NULL);
    free(out);
}
END_TEST

static int write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

START_TEST(config_file_errors_name_file_and_line) {
    char conf[160], cmd[512];
    int st;
    snprintf(conf, sizeof(conf), "%s/bad.conf", D.dir);
    ck_assert_int_eq(write_file(conf, "[daemon]\nlog_level = info\n\n[pool:a]\nkind = floppy\n"),
                     0);
    snprintf(cmd, sizeof(cmd), "%s --config %s --check-config 2>&1", GPUBUFD_PATH, conf);
    char *out = td_capture(cmd, &st);
    ck_assert_int_eq(st, 2);
    ck_assert_msg(strstr(out, "bad.conf:5") != NULL, "got: %s", out);
    ck_assert(strstr(out, "floppy") != NULL);
    free(out);
    ck_assert_int_eq(write_file(conf, "[daemon]\nsocket_mode = 0600\n[pool:a]\nkind = host\n"
                                      "capacity = 1G\nslab_size = 8M\n[pool:b]\nkind=host\n"),
                     0);
    out = td_capture(cmd, &st);
    ck_assert_int_eq(st, 0);
    ck_assert(strstr(out, "2 pool(s)") != NULL);
    free(out);
    unlink(conf);
}
END_TEST

/* --check-config refuses what start-up refuses, with the same message and
 * exit status (both go through the same table of keys and the same check). */
START_TEST(check_config_refuses_what_startup_refuses) {
    char conf[160];
    int check_exit, start_exit;
    snprintf(conf, sizeof(conf), "%s/small.conf", D.dir);
    ck_assert_int_eq(write_file(conf, "[pool:a]\nkind = host\ncapacity = 1K\n"), 0);
    char *checked = run_gpubufd(&check_exit, "--config %s --check-config", conf);
    char *started = run_gpubufd(&start_exit, "--config %s --socket %s/small.sock", conf, D.dir);
    ck_assert_int_eq(check_exit, 2);
    ck_assert_int_eq(start_exit, 2);
    ck_assert_msg(strstr(checked, "granularity") != NULL, "got: %s", checked);
    ck_assert_str_eq(started, checked);
    free(checked);
    free(started);
    unlink(conf);
}
END_TEST

/* Sizes and ids that do not fit are refused, not wrapped, whether they come
 * from the file, from --pool, with --check-config or at start-up. */
START_TEST(config_values_cannot_overflow) {
    static const struct {
        const char *key, *val, *expect;
    } cases[] = {
        {"slab", "18446744073709551615", "bad slab size '18446744073709551615'"},
        {"slab_size", "16777216T", "bad slab size '16777216T'"},
        {"slab", "2048T", "at most 1024T"},
        {"capacity", "18446744073709551615", "bad capacity '18446744073709551615'"},
        {"capacity", "99999999999999999999", "bad capacity"},
        {"allow_uids", "4294967296", "bad user id '4294967296'"},
        {"allow_uids", "4294967295", "bad user id"},
        {"allow_gids", "18446744073709551616", "bad group id"},
    };
    char conf[160], flag[200];
    int ex;
    snprintf(conf, sizeof(conf), "%s/overflow.conf", D.dir);
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char text[200];
        snprintf(text, sizeof(text), "[pool:a]\nkind = host\n%s = %s\n", cases[i].key,
                 cases[i].val);
        ck_assert_int_eq(write_file(conf, text), 0);
        char *checked = run_gpubufd(&ex, "--config %s --check-config", conf);
        ck_assert_msg(ex == 2 && strstr(checked, cases[i].expect) &&
                          strstr(checked, "overflow.conf:3"),
                      "%s = %s: exit %d: %s", cases[i].key, cases[i].val, ex, checked);
        free(checked);
        char *started = run_gpubufd(&ex, "--config %s --socket %s/of.sock", conf, D.dir);
        ck_assert_msg(ex == 2 && strstr(started, cases[i].expect), "start: exit %d: %s", ex,
                      started);
        free(started);
        snprintf(flag, sizeof(flag), "a=host,%s=%s", cases[i].key, cases[i].val);
        char *flagged = run_gpubufd(&ex, "--pool %s --check-config", flag);
        ck_assert_msg(ex == 2 && strstr(flagged, cases[i].expect), "--pool %s: exit %d: %s", flag,
                      ex, flagged);
        free(flagged);
    }
    /* The largest accepted values still give a working pool description. */
    ck_assert_int_eq(write_file(conf, "[pool:a]\nkind = host\ncapacity = 1024T\nslab = 1024T\n"
                                      "allow_uids = 0, 4294967294\n"),
                     0);
    char *out = run_gpubufd(&ex, "--config %s --check-config", conf);
    ck_assert_msg(ex == 0, "exit %d: %s", ex, out);
    free(out);
    unlink(conf);
}
END_TEST

START_TEST(config_file_pools_used) {
    char conf[160];
    test_daemon d2;
    snprintf(conf, sizeof(conf), "/tmp/gpubuf-conf-%d.conf", (int)getpid());
    ck_assert_int_eq(write_file(conf, "[daemon]\nsocket_mode = 0600\n\n[pool:alpha]\nkind = host\n"
                                      "capacity = 32M\nslab_size = 2M\n"),
                     0);
    const char *args[] = {"--config", conf, NULL};
    td_start(&d2, args);
    struct stat sb;
    ck_assert_int_eq(stat(d2.socket, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0600);
    gpubuf_status *s = td_status(&d2);
    ck_assert_uint_eq(s->n_pools, 1);
    ck_assert_str_eq(s->pools[0].name, "alpha");
    ck_assert_uint_eq(s->pools[0].capacity, 32u << 20);
    ck_assert_uint_eq(s->pools[0].slab_size, 2u << 20);
    gpubuf_status_free(s);
    ck_assert_int_eq(td_stop(&d2), 0);
    unlink(conf);
}
END_TEST

START_TEST(default_configuration_without_gpu) {
    test_daemon d2;
    /* No pools given: a host pool when no GPU is visible. */
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    td_start(&d2, NULL);
    gpubuf_status *s = td_status(&d2);
    ck_assert_uint_ge(s->n_pools, 1);
    ck_assert_str_eq(s->pools[0].name, "host");
    ck_assert_int_eq(s->pools[0].kind, GPUBUF_POOL_HOST);
    ck_assert_uint_eq(s->pools[0].capacity, 4ull << 30);
    gpubuf_status_free(s);
    ck_assert_int_eq(td_stop(&d2), 0);
}
END_TEST

START_TEST(bad_flags_exit_2) {
    char cmd[512];
    int st;
    const char *bad[] = {"--pool nocomma", "--pool x=tape", "--pool x=host,capacity=lots",
                         "--log-level loud", "extra-arg"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(cmd, sizeof(cmd), "%s --socket %s/x.sock %s 2>/dev/null", GPUBUFD_PATH, D.dir,
                 bad[i]);
        free(td_capture(cmd, &st));
        ck_assert_msg(st == 2, "%s exited %d", bad[i], st);
    }
}
END_TEST

START_TEST(reader_that_never_reads_is_held_back) {
    int fd = raw_connect();
    td_raw_hello(fd);
    /* Requests until the socket takes no more, never reading a reply: the
     * daemon stops taking them (backpressure) instead of queuing replies
     * without bound, and does not cut the client off. */
    uint8_t frame[64];
    fcntl(fd, F_SETFL, O_NONBLOCK);
    int sent = 0, idle_ms = 0;
    while (sent < 1000000 && idle_ms < 300) {
        size_t n = pack_stat(frame, 1000 + (uint64_t)sent, 1);
        ssize_t w = send(fd, frame, n, MSG_NOSIGNAL);
        if (w == (ssize_t)n) {
            sent++;
            idle_ms = 0;
            continue;
        }
        ck_assert_msg(w < 0 && errno == EAGAIN, "send: %zd (%s)", w, strerror(errno));
        usleep(10000); /* 300 ms without progress: measures a duration */
        idle_ms += 10;
    }
    ck_assert_int_lt(sent, 1000000); /* the daemon stopped reading */
    assert_serving();
    fcntl(fd, F_SETFL, 0);
    for (int i = 0; i < sent; i++) {
        Gpubuf__Response *r = rp_recv(fd, NULL);
        ck_assert_msg(r != NULL, "reply %d of %d missing", i, sent);
        ck_assert_uint_eq(r->id, 1000 + (uint64_t)i);
        gpubuf__response__free_unpacked(r, NULL);
    }
    close(fd);
    ck_assert(td_wait_clients(&D, 0, 2000));
}
END_TEST

/* The fds gpubufd may hold for one connection (docs/security.md): its
 * socket, the fd-carrying replies that stop the handling of its requests
 * (64), and one per waiting open (64). */
#define FDS_PER_CLIENT (1 + 64 + 64)

/* n framed open-by-name requests (ids 10, 11, ...) in one block; *ret_len
 * gets its length. */
static uint8_t *pack_opens(int n, const char *name, size_t *ret_len) {
    uint8_t *buf = malloc((size_t)n * (GPUBUF_WIRE_HEADER_SIZE + 32 + strlen(name)));
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        Gpubuf__Request req = GPUBUF__REQUEST__INIT;
        Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
        o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
        o.name = (char *)name;
        req.id = 10 + (uint64_t)i;
        req.body_case = GPUBUF__REQUEST__BODY_OPEN;
        req.open = &o;
        size_t k = gpubuf__request__pack(&req, buf + len + GPUBUF_WIRE_HEADER_SIZE);
        gpubuf_wire_header_encode(buf + len, (uint32_t)k);
        len += GPUBUF_WIRE_HEADER_SIZE + k;
    }
    *ret_len = len;
    return buf;
}

/* Send n open-by-name requests on fd in one write. */
static void send_opens(int fd, int n, const char *name) {
    size_t len;
    uint8_t *buf = pack_opens(n, name, &len);
    ck_assert_int_eq(gpubuf_wire_send_all(fd, buf, len, -1), 0);
    free(buf);
}

/* Start a daemon whose RSS a test measures. Under AddressSanitizer freed
 * memory waits in a quarantine (256 MiB) that RSS would count: the daemon
 * runs without one (no effect on a build without the sanitizer). */
static void td_start_for_rss(test_daemon *d, const char *const *args);

/* n connections to d that each send the frame per_hog times (as far as the
 * socket takes it) and never read: hogs[0..n). */
static void start_hogs(const test_daemon *d, int *hogs, int n, int per_hog, const uint8_t *frame,
                       size_t len) {
    for (int i = 0; i < n; i++) {
        hogs[i] = td_raw_connect(d, 5);
        td_raw_hello(hogs[i]);
        fcntl(hogs[i], F_SETFL, O_NONBLOCK);
        for (int k = 0; k < per_hog; k++)
            if (send(hogs[i], frame, len, MSG_NOSIGNAL) < 0)
                break;
    }
}

/* A daemon with max_reply_memory = 16M and a host pool of 4 MiB slabs,
 * started for RSS measurements. */
static void start_reply_budget(test_daemon *d) {
    char conf[160];
    snprintf(conf, sizeof(conf), "%s/replies.conf", D.dir);
    ck_assert_int_eq(write_file(conf, "[daemon]\nmax_reply_memory = 16M\n\n[pool:host]\n"
                                      "kind = host\ncapacity = 256M\nslab_size = 4M\n"),
                     0);
    const char *args[] = {"--config", conf, NULL};
    td_start_for_rss(d, args);
}

static void td_start_for_rss(test_daemon *d, const char *const *args) {
    const char *asan = getenv("ASAN_OPTIONS");
    char *saved = asan ? strdup(asan) : NULL, opts[512];
    snprintf(opts, sizeof(opts), "%s%squarantine_size_mb=0:thread_local_quarantine_size_kb=0",
             asan ? asan : "", asan && *asan ? ":" : "");
    setenv("ASAN_OPTIONS", opts, 1);
    td_start(d, args);
    if (saved)
        setenv("ASAN_OPTIONS", saved, 1);
    else
        unsetenv("ASAN_OPTIONS");
    free(saved);
}

/* A connection to d of uid 65534 when we are root (the peer credentials are
 * the effective ids at connect()), else of our own uid; *ret_other says
 * which. */
static int raw_connect_as_other_uid(test_daemon *d, bool *ret_other) {
    *ret_other = geteuid() == 0;
    if (!*ret_other)
        return td_raw_connect(d, 5);
    /* Let uid 65534 reach the socket. */
    ck_assert_int_eq(chmod(d->dir, 0755), 0);
    ck_assert_int_eq(chmod(d->socket, 0666), 0);
    ck_assert_int_eq(setegid(65534), 0);
    ck_assert_int_eq(seteuid(65534), 0);
    int fd = td_raw_connect(d, 5);
    ck_assert_int_eq(seteuid(0), 0);
    ck_assert_int_eq(setegid(0), 0);
    return fd;
}

/* Many connections of one uid that each ask for a large status and never
 * read: the replies queued for all of them together stay within
 * max_reply_memory, those of the uid within half of it (docs/security.md,
 * "Reply memory"); a status that does not fit is refused with EAGAIN, and
 * answered in full again once the memory is freed. A bystander of another
 * uid gets its status in full meanwhile (it was refused with EAGAIN when
 * one uid could fill the whole budget). */
START_TEST(reply_memory_is_bounded_across_connections) {
    enum { BUDGET_MIB = 16, SLACK_MIB = 12, HOGS = 60, PER_HOG = 4, BUFFERS = 4000 };
    test_daemon d2;
    start_reply_budget(&d2);
    /* 4000 buffers with 240-byte names: one status reply is about 1.2 MiB. */
    gpubuf_client *c = publish_long_names_on(&d2, BUFFERS);
    bool other_uid;
    int probe = raw_connect_as_other_uid(&d2, &other_uid);
    td_raw_hello(probe);
    Gpubuf__Response *full = raw_status(probe, false);
    size_t reply = gpubuf__response__get_packed_size(full);
    gpubuf__response__free_unpacked(full, NULL);
    long before = td_rss_kib(d2.pid);
    uint8_t frame[64];
    size_t n = status_frame(frame);
    int hogs[HOGS];
    start_hogs(&d2, hogs, HOGS, PER_HOG, frame, n);
    /* The hogs' uid fills its share of the reply memory: a status of its
     * own is refused with EAGAIN. */
    int own = td_raw_connect(&d2, 5);
    td_raw_hello(own);
    Gpubuf__Response *r = NULL;
    for (int i = 0; i < 2000; i++) {
        ck_assert_int_eq(gpubuf_wire_send_all(own, frame, n, -1), 0);
        r = rp_recv(own, NULL);
        ck_assert_ptr_nonnull(r);
        if (r->status == -EAGAIN)
            break;
        gpubuf__response__free_unpacked(r, NULL);
        r = NULL;
        td_sleep_ms(10); /* the hogs' statuses are still being queued */
    }
    ck_assert_msg(r && r->message && strstr(r->message, "reply memory"),
                  "the hogs' uid never filled its share of the reply memory");
    gpubuf__response__free_unpacked(r, NULL);
    close(own);
    /* The bystander of another uid asks after them all: it is answered in
     * full (with our own uid, EAGAIN is a fair answer). A small request is
     * served at once. */
    ck_assert_int_eq(gpubuf_wire_send_all(probe, frame, n, -1), 0);
    r = rp_recv(probe, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_uint_eq(r->id, 9);
    int bystander = r->status;
    if (other_uid)
        ck_assert_msg(r->status == 0 && r->status_reply && r->status_reply->n_buffers == BUFFERS,
                      "a bystander of another uid: status %d: %s", r->status,
                      r->message ? r->message : "");
    else if (r->status < 0)
        ck_assert_msg(r->status == -EAGAIN && r->message && strstr(r->message, "reply memory"),
                      "status %d: %s", r->status, r->message ? r->message : "");
    gpubuf__response__free_unpacked(r, NULL);
    long after = td_rss_kib(d2.pid);
    long bound = (BUDGET_MIB + SLACK_MIB) * 1024L;
    td_figure("reply_memory_is_bounded_across_connections: %d connections x %d unread statuses of "
              "%zu bytes: daemon RSS %ld -> %ld KiB (+%ld KiB, bound +%ld KiB = max_reply_memory "
              "%d MiB + %d MiB); bystander's status (%s uid): %d",
              HOGS, PER_HOG, reply, before, after, after - before, bound, BUDGET_MIB, SLACK_MIB,
              other_uid ? "another" : "the same", bystander);
    ck_assert_msg(after - before < bound, "daemon RSS %ld -> %ld KiB", before, after);
    gpubuf_buffer_info info;
    ck_assert_int_eq(gpubuf_stat(c, "nothing", &info), -ENOENT);
    /* The memory freed, a status is answered in full again. */
    for (int i = 0; i < HOGS; i++)
        close(hogs[i]);
    ck_assert(td_wait_clients(&d2, 2, 30000));
    full = raw_status(probe, false);
    ck_assert_uint_eq(full->status_reply->n_buffers, BUFFERS);
    gpubuf__response__free_unpacked(full, NULL);
    close(probe);
    gpubuf_disconnect(c);
    ck_assert_int_eq(td_stop(&d2), 0);
}
END_TEST

/* One framed batch open of n buffer ids (ids[i % n_ids]) at out (malloc'ed);
 * returns its length. */
static uint8_t *batch_open_frame(uint64_t request_id, const uint64_t *ids, int n_ids, int n,
                                 size_t *ret_len) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__BatchOpenRequest q = GPUBUF__BATCH_OPEN_REQUEST__INIT;
    uint64_t *all = malloc((size_t)n * sizeof(*all));
    ck_assert_ptr_nonnull(all);
    for (int i = 0; i < n; i++)
        all[i] = ids[i % n_ids];
    q.n_buffer_ids = (size_t)n;
    q.buffer_ids = all;
    req.id = request_id;
    req.body_case = GPUBUF__REQUEST__BODY_BATCH_OPEN;
    req.batch_open = &q;
    size_t len = gpubuf__request__get_packed_size(&req);
    uint8_t *buf = malloc(GPUBUF_WIRE_HEADER_SIZE + len);
    ck_assert_ptr_nonnull(buf);
    gpubuf__request__pack(&req, buf + GPUBUF_WIRE_HEADER_SIZE);
    gpubuf_wire_header_encode(buf, (uint32_t)len);
    free(all);
    *ret_len = GPUBUF_WIRE_HEADER_SIZE + len;
    return buf;
}

/* Many connections that send batches and never read their replies: a batch
 * is handled only when the daemon's reply memory has room for its largest
 * reply (the connection waits meanwhile), so the replies queued for all of
 * them stay within max_reply_memory (docs/security.md, "Reply memory"),
 * and every batch handled reaches its client with its references. */
START_TEST(batch_reply_memory_is_bounded_across_connections) {
    enum { BUDGET_MIB = 16, SLACK_MIB = 12, HOGS = 60, PER_HOG = 4, ITEMS = 4096, BUFFERS = 64 };
    test_daemon d2;
    start_reply_budget(&d2);
    /* 64 buffers with 240-byte names: a batch opening 4096 of them has a
     * reply of about 1 MiB. */
    gpubuf_client *c = publish_long_names_on(&d2, BUFFERS);
    uint64_t ids[BUFFERS];
    char name[300];
    for (int i = 0; i < BUFFERS; i++) {
        gpubuf_buffer_info info;
        snprintf(name, sizeof(name), "%0240d", i);
        ck_assert_int_eq(gpubuf_stat(c, name, &info), 0);
        ids[i] = info.id;
    }
    size_t n;
    uint8_t *frame = batch_open_frame(40, ids, BUFFERS, ITEMS, &n);
    int probe = td_raw_connect(&d2, 5);
    td_raw_hello(probe);
    long before = td_rss_kib(d2.pid);
    int hogs[HOGS];
    start_hogs(&d2, hogs, HOGS, PER_HOG, frame, n);
    /* A single request of a bystander is served meanwhile. */
    gpubuf_buffer_info info;
    ck_assert_int_eq(gpubuf_stat(c, "nothing", &info), -ENOENT);
    usleep(300 * 1000); /* time to grow if it would: measures a duration */
    long after = td_rss_kib(d2.pid);
    /* The bystander's batch waits for room: no answer while the memory is
     * full of unread replies. */
    ck_assert_int_eq(gpubuf_wire_send_all(probe, frame, n, -1), 0);
    struct pollfd p = {.fd = probe, .events = POLLIN};
    int early = poll(&p, 1, 300);
    long bound = (BUDGET_MIB + SLACK_MIB) * 1024L;
    printf("batch_reply_memory_is_bounded_across_connections: %d connections x %d unread "
           "batches of %d opens: daemon RSS %ld -> %ld KiB (+%ld KiB, bound +%ld KiB = "
           "max_reply_memory %d MiB + %d MiB); bystander's batch answered at once: %s\n",
           HOGS, PER_HOG, ITEMS, before, after, after - before, bound, BUDGET_MIB, SLACK_MIB,
           early > 0 ? "yes" : "no");
    fflush(stdout);
    ck_assert_msg(after - before < bound, "daemon RSS %ld -> %ld KiB", before, after);
    ck_assert_int_eq(early, 0);
    /* The other hogs go; the first reads: each of its batches was handled
     * whole, every item with its reference. */
    for (int i = 1; i < HOGS; i++)
        close(hogs[i]);
    fcntl(hogs[0], F_SETFL, 0);
    for (int k = 0; k < PER_HOG; k++) {
        Gpubuf__Response *r = rp_recv(hogs[0], NULL);
        ck_assert_ptr_nonnull(r);
        ck_assert_int_eq(r->status, 0);
        ck_assert_int_eq(r->body_case, GPUBUF__RESPONSE__BODY_BATCH);
        ck_assert_uint_eq(r->batch->n_status, ITEMS);
        for (int i = 0; i < ITEMS; i++)
            ck_assert_int_eq(r->batch->status[i], 0);
        gpubuf__response__free_unpacked(r, NULL);
    }
    /* ... and the bystander's batch is answered. */
    Gpubuf__Response *r = rp_recv(probe, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, 0);
    ck_assert_uint_eq(r->batch->n_status, ITEMS);
    gpubuf__response__free_unpacked(r, NULL);
    ck_assert(td_wait_clients(&d2, 3, 10000)); /* c, probe and hogs[0] */
    ck_assert_int_eq(gpubuf_stat(c, name, &info), 0);
    ck_assert_uint_eq(info.refs, (PER_HOG + 1) * ITEMS / BUFFERS);
    close(hogs[0]);
    close(probe);
    free(frame);
    gpubuf_disconnect(c);
    ck_assert_int_eq(td_stop(&d2), 0);
}
END_TEST

/* Read n open replies (ids from 10 + first, each with an fd, which is
 * closed); returns how many arrived, in order and successful. */
static int read_open_replies(int fd, int first, int n) {
    for (int i = first; i < first + n; i++) {
        int afd = -1;
        Gpubuf__Response *r = rp_recv(fd, &afd);
        bool ok = r && r->id == 10 + (uint64_t)i && r->status == 0 && afd >= 0;
        if (!ok)
            fprintf(stderr, "open reply %d: %s, id %llu, status %d, fd %d\n", i,
                    r ? "decoded" : "none", r ? (unsigned long long)r->id : 0ull,
                    r ? r->status : 0, afd);
        if (afd >= 0)
            close(afd);
        if (r)
            gpubuf__response__free_unpacked(r, NULL);
        if (!ok)
            return i - first;
    }
    return n;
}

/* A library client with a sealed 4 KiB host buffer `name` (*ret_b); returns
 * the daemon's fd count once only that client is connected. */
static int sealed_host_buffer(const char *name, gpubuf_client **ret_c, gpubuf_buffer **ret_b) {
    *ret_c = td_connect(&D);
    ck_assert_int_eq(gpubuf_alloc(*ret_c, NULL, 4096, name, ret_b), 0);
    ck_assert_int_eq(gpubuf_seal(*ret_b), 0);
    int fds = td_quiet_fds(&D, 1, 20000);
    ck_assert_int_ge(fds, 0);
    return fds;
}

START_TEST(fds_held_per_client_are_bounded) {
    gpubuf_client *c;
    gpubuf_buffer *b;
    int before = sealed_host_buffer("fd-budget", &c, &b);
    int fd = raw_connect();
    td_raw_hello(fd);
    /* 3000 opens of one host buffer, none of the replies read yet: each
     * reply carries an fd. */
    enum { N = 3000 };
    send_opens(fd, N, "fd-budget");
    int held = 0;
    for (int i = 0; i < 30; i++) {
        usleep(10000); /* samples the fds held over 300 ms: measures a duration */
        int now = td_count_fds(D.pid) - before;
        held = now > held ? now : held;
    }
    td_figure("fds_held_per_client_are_bounded: the daemon holds %d fds for a client with %d "
              "unread fd-carrying replies (bound %d)",
              held, N, FDS_PER_CLIENT);
    ck_assert_msg(held <= FDS_PER_CLIENT, "%d fds held for one client", held);
    /* Held back, not cut off: every open is answered once it reads. */
    ck_assert_int_eq(read_open_replies(fd, 0, N), N);
    close(fd);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(held_back_reader_outlives_the_frame_deadline) {
    /* Whole requests the daemon holds back while the client reads late are
     * not half a frame: the frame deadline does not cut the client off. */
    char conf[160];
    snprintf(conf, sizeof(conf), "%s/t.conf", D.dir);
    ck_assert_int_eq(write_file(conf, "[daemon]\nframe_timeout_ms = 200\n"
                                      "[pool:host]\nkind = host\ncapacity = 64M\n"),
                     0);
    test_daemon d2;
    const char *args[] = {"--config", conf, NULL};
    td_start(&d2, args);
    gpubuf_client *c = td_connect(&d2);
    gpubuf_buffer *b;
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "late", &b), 0);
    ck_assert_int_eq(gpubuf_seal(b), 0);
    int fd = td_raw_connect(&d2, 5);
    td_raw_hello(fd);
    enum { N = 2000 };
    send_opens(fd, N, "late");
    usleep(600000); /* three frame deadlines: measures a duration */
    ck_assert_int_eq(read_open_replies(fd, 0, N), N);
    close(fd);
    gpubuf_release(b);
    gpubuf_disconnect(c);
    ck_assert_int_eq(td_stop(&d2), 0);
}
END_TEST

START_TEST(pipelining_reader_is_never_cut_off) {
    gpubuf_client *c;
    gpubuf_buffer *b;
    int before = sealed_host_buffer("pipelined", &c, &b);
    int fd = raw_connect();
    td_raw_hello(fd);
    /* A writer pipelines 6,000 opens (each answered with an fd), then
     * 20,000 stats; the reader starts a little later and reads them all.
     * More than 4,096 replies are due before the first is read. */
    enum { OPENS = 6000, STATS = 20000 };
    uint64_t since = td_requests(&D, "open");
    pid_t p = fork();
    if (p == 0) {
        size_t len;
        uint8_t *buf = pack_opens(OPENS, "pipelined", &len);
        if (gpubuf_wire_send_all(fd, buf, len, -1) < 0)
            _exit(1);
        free(buf);
        buf = malloc((size_t)STATS * 32);
        len = 0;
        for (int i = 0; i < STATS; i++)
            len += pack_stat(buf + len, 100000 + (uint64_t)i, 999999);
        _exit(gpubuf_wire_send_all(fd, buf, len, -1) < 0 ? 2 : 0);
    }
    /* The reader starts once the daemon answered as many opens as it queues
     * replies with fds for (GD_QUEUED_REPLY_FDS). */
    ck_assert(td_wait_requests(&D, "open", since, 64, 60000));
    int held = 0;
    for (int i = 0; i < OPENS; i += 500) {
        int now = td_count_fds(D.pid) - before;
        held = now > held ? now : held;
        ck_assert_int_eq(read_open_replies(fd, i, 500), 500);
    }
    for (int i = 0; i < STATS; i++) {
        Gpubuf__Response *r = rp_recv(fd, NULL);
        ck_assert_msg(r != NULL, "cut off after %d opens and %d stats", OPENS, i);
        ck_assert_uint_eq(r->id, 100000 + (uint64_t)i);
        ck_assert_int_eq(r->status, -ENOENT);
        gpubuf__response__free_unpacked(r, NULL);
    }
    td_figure("pipelining_reader_is_never_cut_off: %d opens and %d stats answered; at most %d fds "
              "held for the client (bound %d)",
              OPENS, STATS, held, FDS_PER_CLIENT);
    ck_assert_int_le(held, FDS_PER_CLIENT);
    ck_assert_int_eq(td_wait(p), 0);
    close(fd);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(seal_sent_before_exit_is_applied_with_replies_unread) {
    /* 200 buffers with long names make each status reply about 60 KB. */
    gpubuf_client *c = publish_long_names(200);
    int fd = raw_connect();
    td_raw_hello(fd);
    uint64_t id = 0;
    ck_assert_int_eq(raw_alloc_named(fd, 4096, "last-words", &id, NULL, NULL), 0);
    /* 40 status requests never read (about 2.4 MB of replies: the daemon
     * holds back the rest of this client's requests after 1 MiB), then the
     * seal, then the exit. */
    uint8_t buf[4096];
    size_t len = 0;
    Gpubuf__StatusRequest st = GPUBUF__STATUS_REQUEST__INIT;
    Gpubuf__Request sreq = GPUBUF__REQUEST__INIT;
    sreq.body_case = GPUBUF__REQUEST__BODY_STATUS;
    sreq.status = &st;
    for (int i = 0; i < 40; i++) {
        sreq.id = 100 + (uint64_t)i;
        len += rp_frame(buf + len, &sreq);
    }
    uint64_t since = td_requests(&D, "status");
    ck_assert_int_eq(gpubuf_wire_send_all(fd, buf, len, -1), 0);
    /* The daemon is backlogged now: it answered a dozen (of the about 17
     * that fill 1 MiB) and holds the rest back, or is about to. */
    ck_assert(td_wait_requests(&D, "status", since, 12, 60000));
    Gpubuf__SealRequest seal = GPUBUF__SEAL_REQUEST__INIT;
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    seal.buffer_id = id;
    req.id = 3;
    req.body_case = GPUBUF__REQUEST__BODY_SEAL;
    req.seal = &seal;
    len = 0;
    len += rp_frame(buf + len, &req);
    ck_assert_int_eq(gpubuf_wire_send_all(fd, buf, len, -1), 0);
    close(fd);
    ck_assert(td_wait_clients(&D, 1, 2000));
    /* Applied: sealed under its name, it outlives its creator. */
    gpubuf_status *s = td_status(&D);
    const gpubuf_status_buffer *x = td_find_buffer(s, "last-words");
    ck_assert_msg(x != NULL, "the seal sent before the exit was lost: buffer freed");
    ck_assert_int_eq(x->state, GPUBUF_STATE_SEALED);
    ck_assert_uint_eq(x->id, id);
    gpubuf_status_free(s);
    assert_serving();
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(waiting_open_fails_when_buffer_goes) {
    gpubuf_client *a = td_connect(&D);
    gpubuf_buffer *x;
    ck_assert_int_eq(gpubuf_alloc(a, NULL, 4096, "pending", &x), 0);
    uint64_t id = gpubuf_buffer_id(x);
    pid_t p = fork();
    if (p == 0) {
        gpubuf_client *b;
        gpubuf_buffer *y;
        if (gpubuf_connect(D.socket, &b) < 0)
            _exit(1);
        int r = gpubuf_open_id(b, id, -1, &y);
        _exit(r == -ENOENT ? 0 : 2);
    }
    ck_assert(td_wait_clients(&D, 2, 2000));
    ck_assert_int_eq(gpubuf_delete(a, "pending"), 0);
    ck_assert_int_eq(td_wait(p), 0);
    gpubuf_release(x);
    gpubuf_disconnect(a);
}
END_TEST

START_TEST(refuses_to_replace_a_regular_file) {
    char path[160], cmd[512];
    int st;
    snprintf(path, sizeof(path), "%s/precious", D.dir);
    ck_assert_int_eq(write_file(path, "data\n"), 0);
    snprintf(cmd, sizeof(cmd), "%s --socket %s --pool h=host 2>&1", GPUBUFD_PATH, path);
    char *out = td_capture(cmd, &st);
    ck_assert_int_eq(st, 1);
    ck_assert(strstr(out, "not a socket") != NULL);
    free(out);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert(S_ISREG(sb.st_mode));
    unlink(path);
}
END_TEST

START_TEST(pool_flags_override_config) {
    char conf[160], cmd[600];
    int st;
    snprintf(conf, sizeof(conf), "%s/p.conf", D.dir);
    ck_assert_int_eq(write_file(conf, "[pool:a]\nkind = host\ncapacity = 2G\n"), 0);
    test_daemon d2;
    const char *args[] = {"--config", conf, "--pool", "a=host,capacity=1G", NULL};
    td_start(&d2, args);
    gpubuf_status *s = td_status(&d2);
    ck_assert_uint_eq(s->n_pools, 1);
    ck_assert_uint_eq(s->pools[0].capacity, 1ull << 30);
    gpubuf_status_free(s);
    ck_assert_int_eq(td_stop(&d2), 0);
    /* A pool section without a kind is an error, not a host pool. */
    ck_assert_int_eq(write_file(conf, "[pool:gpu0]\ndevice = 0\n"), 0);
    snprintf(cmd, sizeof(cmd), "%s --config %s --check-config 2>&1", GPUBUFD_PATH, conf);
    char *out = td_capture(cmd, &st);
    ck_assert_int_eq(st, 2);
    ck_assert(strstr(out, "no kind") != NULL);
    free(out);
    /* The first bad line is the one reported, with its own message. */
    ck_assert_int_eq(write_file(conf, "[pool:a]\nkind = host\nbogus = 1\ncapacity = zz\n"), 0);
    out = td_capture(cmd, &st);
    ck_assert_int_eq(st, 2);
    ck_assert_msg(strstr(out, "p.conf:3: unknown pool key 'bogus'") != NULL, "got %s", out);
    free(out);
    unlink(conf);
}
END_TEST

/* Read-only opens hand out a read-only file description, which a receiver of
 * another uid cannot reopen for writing through /proc; seal events are
 * checked. */
START_TEST(read_only_fd_and_seal_event) {
    int fd = raw_connect(), afd = -1;
    uint64_t buf, slab;
    td_raw_hello(fd);
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    a.size = 4096;
    a.name = "rofd";
    req.id = 2;
    req.body_case = GPUBUF__REQUEST__BODY_ALLOC;
    req.alloc = &a;
    ck_assert_int_eq(raw_call(fd, &req, &buf, &slab, NULL), 0);

    /* A seal event must be 64 bytes, and needs a CUDA pool. */
    uint8_t ev[64] = {1};
    Gpubuf__SealRequest sq = GPUBUF__SEAL_REQUEST__INIT;
    sq.buffer_id = buf;
    sq.event_handle.data = ev;
    sq.event_handle.len = 10;
    req.id = 3;
    req.body_case = GPUBUF__REQUEST__BODY_SEAL;
    req.seal = &sq;
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
    req.id = 4;
    req.body_case = GPUBUF__REQUEST__BODY_OPEN;
    req.open = &o;
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

int main(void) {
    Suite *s = suite_create("daemon");
    TCase *t = tcase_create("protocol");
    tcase_add_checked_fixture(t, start_default, stop_clean);
    tcase_set_timeout(t, 60);
    tcase_add_test(t, garbage_disconnects_only_that_client);
    tcase_add_test(t, bad_magic_gets_error_then_close);
    tcase_add_test(t, bad_version_header);
    tcase_add_test(t, oversized_frame_rejected);
    tcase_add_test(t, truncated_frame_then_hangup);
    tcase_add_test(t, undecodable_payload);
    tcase_add_test(t, request_before_hello);
    tcase_add_test(t, version_negotiation_fails);
    tcase_add_test(t, empty_request_and_double_hello);
    tcase_add_test(t, unsolicited_fds_are_closed);
    tcase_add_test(t, release_not_held_and_double_release);
    tcase_add_test(t, read_only_fd_and_seal_event);
    tcase_add_test(t, keep_mapped_protocol);
    tcase_add_test(t, status_rows_and_columns_agree);
    tcase_add_test(t, pipelined_requests_answered_in_order);
    tcase_add_test(t, sigterm_with_live_clients);
    tcase_add_test(t, requests_before_hangup_are_answered);
    tcase_add_test(t, big_replies_unread_stay_bounded);
    tcase_add_test(t, reply_memory_is_bounded_across_connections);
    tcase_add_test(t, batch_reply_memory_is_bounded_across_connections);
    tcase_add_test(t, departed_writer_cannot_hold_the_loop);
    tcase_add_test(t, second_daemon_refuses_live_socket);
    tcase_add_test(t, reader_that_never_reads_is_held_back);
    tcase_add_test(t, fds_held_per_client_are_bounded);
    tcase_add_test(t, pipelining_reader_is_never_cut_off);
    tcase_add_test(t, held_back_reader_outlives_the_frame_deadline);
    tcase_add_test(t, seal_sent_before_exit_is_applied_with_replies_unread);
    tcase_add_test(t, waiting_open_fails_when_buffer_goes);
    suite_add_tcase(s, t);
    TCase *o = tcase_create("operations");
    tcase_add_checked_fixture(o, start_default, stop_clean);
    tcase_set_timeout(o, 60);
    tcase_add_test(o, gpubufctl_table_and_json);
    tcase_add_test(o, client_names_clean_in_gpubufctl);
    tcase_add_test(o, wire_strings_with_nul_refused);
    tcase_add_test(o, gpubufctl_exit_codes);
    tcase_add_test(o, config_file_errors_name_file_and_line);
    tcase_add_test(o, config_file_pools_used);
    tcase_add_test(o, check_config_refuses_what_startup_refuses);
    tcase_add_test(o, config_values_cannot_overflow);
    tcase_add_test(o, default_configuration_without_gpu);
    tcase_add_test(o, bad_flags_exit_2);
    tcase_add_test(o, refuses_to_replace_a_regular_file);
    tcase_add_test(o, pool_flags_override_config);
    suite_add_tcase(s, o);
    return run_suite(s);
}
