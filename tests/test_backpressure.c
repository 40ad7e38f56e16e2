/* gpubufd facing peers that do not read: replies, reply memory and fds
 * held back and bounded, per connection and across connections, and what
 * such a peer sent still applied. */
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
    Gpubuf__StatusRequest st = GPUBUF__STATUS_REQUEST__INIT;
    Gpubuf__Request req = rp_request(9, GPUBUF__REQUEST__BODY_STATUS, &st);
    ck_assert_uint_le(rp_frame_size(&req), 64);
    return rp_frame(frame, &req);
}

/* A library client of d (*ret_c) with a sealed 4 KiB host buffer `name`
 * (*ret_b). */
static void sealed_buffer(const test_daemon *d, const char *name, gpubuf_client **ret_c,
                          gpubuf_buffer **ret_b) {
    *ret_c = td_connect(d);
    *ret_b = td_alloc(*ret_c, NULL, 4096, name);
    ck_assert_int_eq(gpubuf_seal(*ret_b), 0);
}

/* A raw connection to d, past its hello. */
static int raw_hello(const test_daemon *d) {
    int fd = td_raw_connect(d, 60);
    td_raw_hello(fd);
    return fd;
}

/* Close the raw connection fd, release b, disconnect c. */
static void close_all(int fd, gpubuf_client *c, gpubuf_buffer *b) {
    close(fd);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}

START_TEST(big_replies_unread_stay_bounded) {
    /* 2000 buffers with long names make each status reply ~0.6 MB. */
    gpubuf_client *c = publish_long_names(2000);
    long before = td_rss_kib(D.pid);
    int fd = raw_hello(&D);
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
    ck_assert_msg(stat_ms() < 5000, "others are not served"); /* loose: a loaded machine */
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

START_TEST(reader_that_never_reads_is_held_back) {
    int fd = raw_hello(&D);
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
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (int i = 0; i < n; i++) {
        Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
        o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
        o.name = (char *)name;
        Gpubuf__Request req = rp_request(10 + (uint64_t)i, GPUBUF__REQUEST__BODY_OPEN, &o);
        ck_assert_int_eq(rp_append(&buf, &len, &cap, &req), 0);
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
        hogs[i] = raw_hello(d);
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
    ck_assert_int_eq(td_write_file(conf, "[daemon]\nmax_reply_memory = 16M\n\n[pool:host]\n"
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
        return td_raw_connect(d, 60);
    /* Let uid 65534 reach the socket. */
    ck_assert_int_eq(chmod(d->dir, 0755), 0);
    ck_assert_int_eq(chmod(d->socket, 0666), 0);
    ck_assert_int_eq(setegid(65534), 0);
    ck_assert_int_eq(seteuid(65534), 0);
    int fd = td_raw_connect(d, 60);
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
    int own = raw_hello(&d2);
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
    Gpubuf__BatchOpenRequest q = GPUBUF__BATCH_OPEN_REQUEST__INIT;
    uint64_t *all = malloc((size_t)n * sizeof(*all));
    ck_assert_ptr_nonnull(all);
    for (int i = 0; i < n; i++)
        all[i] = ids[i % n_ids];
    q.n_buffer_ids = (size_t)n;
    q.buffer_ids = all;
    Gpubuf__Request req = rp_request(request_id, GPUBUF__REQUEST__BODY_BATCH_OPEN, &q);
    uint8_t *buf = malloc(rp_frame_size(&req));
    ck_assert_ptr_nonnull(buf);
    *ret_len = rp_frame(buf, &req);
    free(all);
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
    int probe = raw_hello(&d2);
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

/* sealed_buffer on D; returns the daemon's fd count once only that client
 * is connected. */
static int sealed_host_buffer(const char *name, gpubuf_client **ret_c, gpubuf_buffer **ret_b) {
    sealed_buffer(&D, name, ret_c, ret_b);
    int fds = td_quiet_fds(&D, 1, 20000);
    ck_assert_int_ge(fds, 0);
    return fds;
}

START_TEST(fds_held_per_client_are_bounded) {
    gpubuf_client *c;
    gpubuf_buffer *b;
    int before = sealed_host_buffer("fd-budget", &c, &b);
    int fd = raw_hello(&D);
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
    close_all(fd, c, b);
}
END_TEST

START_TEST(held_back_reader_outlives_the_frame_deadline) {
    /* Whole requests the daemon holds back while the client reads late are
     * not half a frame: the frame deadline does not cut the client off. */
    char conf[160];
    snprintf(conf, sizeof(conf), "%s/t.conf", D.dir);
    ck_assert_int_eq(td_write_file(conf, "[daemon]\nframe_timeout_ms = 200\n"
                                         "[pool:host]\nkind = host\ncapacity = 64M\n"),
                     0);
    test_daemon d2;
    const char *args[] = {"--config", conf, NULL};
    td_start(&d2, args);
    gpubuf_client *c;
    gpubuf_buffer *b;
    sealed_buffer(&d2, "late", &c, &b);
    int fd = raw_hello(&d2);
    enum { N = 2000 };
    send_opens(fd, N, "late");
    usleep(600000); /* three frame deadlines: measures a duration */
    ck_assert_int_eq(read_open_replies(fd, 0, N), N);
    close_all(fd, c, b);
    ck_assert_int_eq(td_stop(&d2), 0);
}
END_TEST

START_TEST(pipelining_reader_is_never_cut_off) {
    gpubuf_client *c;
    gpubuf_buffer *b;
    int before = sealed_host_buffer("pipelined", &c, &b);
    int fd = raw_hello(&D);
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
    close_all(fd, c, b);
}
END_TEST

START_TEST(seal_sent_before_exit_is_applied_with_replies_unread) {
    /* 200 buffers with long names make each status reply about 60 KB. */
    gpubuf_client *c = publish_long_names(200);
    int fd = raw_hello(&D);
    uint64_t id = 0;
    ck_assert_int_eq(raw_alloc_named(fd, 4096, "last-words", &id, NULL, NULL), 0);
    /* 40 status requests never read (about 2.4 MB of replies: the daemon
     * holds back the rest of this client's requests after 1 MiB), then the
     * seal, then the exit. */
    uint8_t buf[4096];
    size_t len = 0;
    Gpubuf__StatusRequest st = GPUBUF__STATUS_REQUEST__INIT;
    Gpubuf__Request sreq = rp_request(0, GPUBUF__REQUEST__BODY_STATUS, &st);
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
    seal.buffer_id = id;
    Gpubuf__Request req = rp_request(3, GPUBUF__REQUEST__BODY_SEAL, &seal);
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

SUITE_MAIN("backpressure", "backpressure", start_default, td_stop_clean, 60,
          big_replies_unread_stay_bounded, reply_memory_is_bounded_across_connections,
          batch_reply_memory_is_bounded_across_connections,
          departed_writer_cannot_hold_the_loop, reader_that_never_reads_is_held_back,
          fds_held_per_client_are_bounded, pipelining_reader_is_never_cut_off,
          held_back_reader_outlives_the_frame_deadline,
          seal_sent_before_exit_is_applied_with_replies_unread)
