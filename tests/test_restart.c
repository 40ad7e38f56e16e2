/* Restart survival on host pools: gpubufd SIGKILLed and stopped with
 * SIGTERM under a service manager that keeps its fds (tests/fdstore.c), and
 * taken over by a successor (gpubufd --takeover), while a consumer keeps
 * reading a 256 MiB buffer; the buffer keeps its name, contents and
 * references, and nothing leaks. Also: a saved state that does not check
 * out is dropped, not trusted. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "fdstore.h"
#include "harness.h"
#include "internal.h"
#include "layout_helpers.h"

#define BIG (256ull << 20)
#define SEED 0x5eed
static const char *const k_pool[] = {"--pool", "host=host,capacity=1G", NULL};

static int verify_big(const gpubuf_buffer *b, void *arg) {
    (void)arg;
    return td_mismatches(gpubuf_buffer_host_ptr(b), BIG, SEED) != 0;
}

static void consumer_start(reader *k, const test_daemon *d) {
    memset(k, 0, sizeof(*k));
    k->name = "big";
    k->verify = verify_big;
    reader_start(k, d);
}

/* The client with this pid in a status, or NULL. */
static const gpubuf_client_info *client_of(const gpubuf_status *s, pid_t pid, bool *detached) {
    for (size_t i = 0; i < s->n_clients; i++)
        if (s->clients[i].pid == pid) {
            *detached = s->client_detached && s->client_detached[i];
            return &s->clients[i];
        }
    return NULL;
}

/* Wait until the consumer's session is back (resumed, one reference) and
 * check the daemon's books: one buffer, its bytes, no other reference. */
static void check_resumed(const test_daemon *d, pid_t consumer_pid, uint32_t restarts) {
    bool ok = false;
    for (int t = 0; t < 15000 && !ok; t += 20) {
        gpubuf_status *s = td_status(d);
        bool det = true;
        const gpubuf_client_info *ci = client_of(s, consumer_pid, &det);
        const gpubuf_status_buffer *b = td_find_buffer(s, "big");
        ok = ci && !det && ci->references == 1 && b && b->refs == 1;
        if (ok) {
            const gpubuf_pool_info *p = td_find_pool(s, "host");
            ck_assert_uint_eq(s->restarts, restarts);
            ck_assert_uint_eq(s->restored_buffers, 1);
            ck_assert_uint_eq(s->n_buffers, 1);
            ck_assert_ptr_nonnull(s->buffer_restored);
            ck_assert_int_eq(s->buffer_restored[0], 1);
            ck_assert_int_eq(b->state, GPUBUF_STATE_SEALED);
            ck_assert_uint_eq(b->size, BIG);
            ck_assert_uint_eq(p->used, BIG);
            ck_assert_uint_eq(p->reserved, BIG);
            ck_assert_uint_eq(p->slabs, 1);
            for (size_t i = 0; s->client_detached && i < s->n_clients; i++)
                ck_assert_msg(!s->client_detached[i], "a session was not resumed");
        }
        gpubuf_status_free(s);
        if (!ok)
            td_sleep_ms(20);
    }
    ck_assert_msg(ok, "the consumer's session did not come back with its reference");
}

/* A new consumer opens it by name and finds the contents. */
static void check_contents(const test_daemon *d) {
    gpubuf_client *c = td_connect(d);
    gpubuf_buffer *b = NULL;
    ck_assert_int_eq(gpubuf_open(c, "big", 0, &b), 0);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(b), BIG, SEED), 0);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}

START_TEST(sigkill_and_sigterm_keep_the_buffer) {
    fake_sd m;
    reader k;
    fsd_init(&m);
    fsd_start(&m, k_pool);
    td_produce(&m.d, "big", BIG, SEED);
    for (int t = 0; t < 100 && fsd_count(&m, "slab-") < 1; t++)
        fsd_wait(&m, NULL, 20);
    /* The store holds the listening socket, the two state memfds, one slab. */
    ck_assert_int_eq(fsd_count(&m, "slab-"), 1);
    ck_assert_int_eq(fsd_count(&m, "state-"), 2);
    ck_assert_int_eq(fsd_count(&m, "listen"), 1);
    int fds_before = td_count_fds(m.d.pid);
    consumer_start(&k, &m.d);
    ck_assert(td_wait_refs(&m.d, "big", 1, 5000));

    fsd_restart_twice(&m, k_pool, check_resumed, k.pid);
    ck_assert_int_eq(fsd_count(&m, "slab-"), 1);

    ck_assert_int_eq(reader_stop(&k), 0);
    ck_assert(td_wait_refs(&m.d, "big", 0, 5000));
    /* No fd more than before the restarts (the consumer's connection gone,
     * a status connection may still be closing): every kept fd has one
     * owner. */
    ck_assert_int_le(td_count_fds(m.d.pid), fds_before + 1);
    check_contents(&m.d);
    /* Deleted, its memory goes, and the store lets the slab go too. */
    fsd_delete_last(&m, "big", "host");
    fsd_cleanup(&m);
}
END_TEST

/* Start gpubufd under the service manager with args (which name conf, a
 * configuration written here with resume_timeout_ms = 300). */
/* fsd_init, then a configuration file of text in m's directory (its path in
 * conf), then fsd_start with args (which name conf). */
static void start_with_conf(fake_sd *m, char *conf, size_t len, const char *text,
                            const char *const *args) {
    fsd_init(m);
    snprintf(conf, len, "%s/gpubuf.conf", m->d.dir);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    fsd_start(m, args);
}

static void start_short_resume(fake_sd *m, char *conf, size_t len, const char *const *args) {
    start_with_conf(m, conf, len, "[daemon]\nresume_timeout_ms = 300\n", args);
}

/* The status on q's connection, which stays open. */
static gpubuf_status *status_on(gpubuf_client *q) {
    gpubuf_status *s = NULL;
    int r = gpubuf_status_get(q, &s);
    ck_assert_msg(r == 0, "status: %s", gpubuf_strerror(r));
    return s;
}

#define NOT_RESUMED_BUFS 1500

/* A session whose client does not come back is released after
 * resume_timeout_ms, and with it its references: more than the loop drops
 * in one turn, dropped by its reaper although no client leaves meanwhile
 * (the status is read on one connection that stays open). */
START_TEST(sessions_not_resumed_are_released) {
    fake_sd m;
    char conf[256];
    uint64_t sizes[NOT_RESUMED_BUFS];
    gpubuf_buffer *many[NOT_RESUMED_BUFS] = {0};
    const char *args[] = {"--pool", "host=host,capacity=1G", "--config", conf, NULL};
    start_short_resume(&m, conf, sizeof(conf), args);
    td_produce(&m.d, "small", 1 << 20, 7);
    gpubuf_client *c = td_connect(&m.d);
    gpubuf_buffer *b = NULL;
    ck_assert_int_eq(gpubuf_set_reconnect(c, 0), 0);
    ck_assert_int_eq(gpubuf_open(c, "small", 0, &b), 0);
    for (int i = 0; i < NOT_RESUMED_BUFS; i++)
        sizes[i] = 4096;
    /* Allocated, never sealed: they go with the session. */
    ck_assert_int_eq(gpubuf_alloc_many(c, "host", NOT_RESUMED_BUFS, sizes, NULL, 0, many, NULL),
                     0);
    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    fsd_start(&m, args);
    gpubuf_client *q = td_connect(&m.d);
    gpubuf_status *s = status_on(q);
    ck_assert_uint_eq(td_find_buffer(s, "small")->refs, 1);
    ck_assert_uint_eq(s->n_buffers, 1 + NOT_RESUMED_BUFS);
    ck_assert_ptr_nonnull(s->client_detached);
    gpubuf_status_free(s);
    bool gone = false;
    for (int t = 0; t < 10000 && !gone; t += 20) {
        s = status_on(q);
        gone = s->n_buffers == 1 && td_find_buffer(s, "small")->refs == 0 && !s->client_detached;
        gpubuf_status_free(s);
        if (!gone)
            td_sleep_ms(20);
    }
    ck_assert_msg(gone, "the session not resumed kept its references");
    gpubuf_disconnect(q);
    /* Reconnecting is off: the call fails and says so; the view stays. */
    gpubuf_buffer_info info;
    ck_assert_int_lt(gpubuf_stat(c, "small", &info), 0);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(b), 1 << 20, 7), 0);
    gpubuf_release(b);
    gpubuf_release_many(many, NOT_RESUMED_BUFS, NULL); /* the connection is gone */
    gpubuf_disconnect(c);
    fsd_cleanup(&m);
}
END_TEST

static void scribble(int fd, off_t off, const char *what) {
    ck_assert_int_eq(pwrite(fd, what, strlen(what), off), (ssize_t)strlen(what));
}

/* The saved state is input: a torn journal tail is cut off, a state
 * without a valid header is not used, and a slab fd no record names is
 * dropped (and removed from the store). The daemon serves either way. */
START_TEST(bad_state_is_dropped) {
    fake_sd m;
    fsd_init(&m);
    fsd_start(&m, k_pool);
    td_produce(&m.d, "a", 1 << 20, 1);
    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    /* Garbage after the records of both slots: a torn append. */
    for (int i = 0; i < 2; i++) {
        int fd = fsd_fd(&m, i ? "state-1" : "state-0");
        off_t end = lseek(fd, 0, SEEK_END);
        scribble(fd, end, "\x10\0\0\0garbage garbage garbage");
    }
    fsd_start(&m, k_pool);
    gpubuf_status *s = td_status(&m.d);
    ck_assert_ptr_nonnull(td_find_buffer(s, "a"));
    ck_assert_uint_eq(s->restarts, 1);
    gpubuf_status_free(s);
    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    /* Headers overwritten: nothing to restore from. */
    scribble(fsd_fd(&m, "state-0"), 0, "not a state");
    scribble(fsd_fd(&m, "state-1"), 0, "not a state");
    fsd_start(&m, k_pool);
    fsd_wait(&m, "FDSTOREREMOVE=1", 2000);
    s = td_status(&m.d);
    ck_assert_uint_eq(s->n_buffers, 0);
    ck_assert_uint_eq(s->restarts, 0);
    ck_assert_uint_eq(td_find_pool(s, "host")->reserved, 0);
    gpubuf_status_free(s);
    ck_assert_int_eq(fsd_count(&m, "slab-"), 0);
    td_produce(&m.d, "b", 1 << 20, 2);
    fsd_cleanup(&m);
}
END_TEST

/* Without a service manager: gpubufd --takeover gets the socket, the slabs
 * and the state from the running daemon, which exits; the consumer's
 * session carries on in the successor. */
START_TEST(takeover_keeps_the_buffer) {
    test_daemon d;
    reader k;
    td_start(&d, k_pool);
    td_produce(&d, "big", BIG, SEED);
    consumer_start(&k, &d);
    ck_assert(td_wait_refs(&d, "big", 1, 5000));
    td_takeover(&d, "host=host,capacity=1G");
    check_resumed(&d, k.pid, 1);
    ck_assert_int_eq(reader_stop(&k), 0);
    ck_assert(td_wait_refs(&d, "big", 0, 5000));
    check_contents(&d);
    /* A second takeover by a process of the same uid works as well; an
     * ordinary client cannot ask for one without a socket to receive. */
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Open `name` on c's connection the way the library does, without making a
 * view: true when the reply carried the slab's fd (SLAB_ONCE leaves it out
 * when the connection maps the slab in that mode already). The reference
 * the open took is given back. */
static bool open_brings_fd(gpubuf_client *c, const char *name, bool read_only) {
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
    Gpubuf__Response *resp = NULL;
    int fd = -1, r;
    o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
    o.name = (char *)name;
    o.read_only = read_only;
    req.body_case = GPUBUF__REQUEST__BODY_OPEN;
    req.open = &o;
    pthread_mutex_lock(&c->lock);
    r = gpubuf__rpc_locked(c, &req, &resp, &fd);
    if (r == 0) {
        ck_assert_ptr_nonnull(resp->buffer);
        gpubuf__send_release(c, resp->buffer->buffer_id, false, read_only);
        gpubuf__drain_locked(c);
        gpubuf__resp_free(c, resp); /* it may live in the connection's arena */
    }
    pthread_mutex_unlock(&c->lock);
    ck_assert_msg(r == 0, "open '%s': %d", name, r);
    if (fd >= 0)
        close(fd);
    return fd >= 0;
}

/* The first call after the daemon came back reconnects and resumes: it
 * answers -ECONNRESET (it was sent to the old daemon) or succeeds. */
static void resume(gpubuf_client *c, const char *name) {
    gpubuf_buffer_info info;
    int r = gpubuf_stat(c, name, &info);
    if (r == -ECONNRESET)
        r = gpubuf_stat(c, name, &info);
    ck_assert_msg(r == 0, "stat after the restart: %d (%s)", r, gpubuf_last_error_message());
}

/* SLAB_ONCE over a restart: the references restored from the saved state
 * and cut down at the resume count per slab and mode like any other. A
 * client that still maps the slab opens another buffer of it without an
 * fd and its view reads right; one whose view went while the daemon was
 * down (so it no longer maps the slab) gets the fd again; read-only is
 * counted apart. */
START_TEST(slab_once_after_resume) {
    fake_sd m;
    fsd_init(&m);
    fsd_start(&m, k_pool);
    td_produce(&m.d, "a", 1 << 20, 1);
    td_produce(&m.d, "b", 1 << 20, 2);
    td_produce(&m.d, "c", 1 << 20, 3);
    gpubuf_status *s = td_status(&m.d);
    uint64_t slab = td_find_buffer(s, "a")->slab_id;
    ck_assert_uint_eq(td_find_buffer(s, "b")->slab_id, slab);
    ck_assert_uint_eq(td_find_buffer(s, "c")->slab_id, slab);
    gpubuf_status_free(s);
    gpubuf_client *c1 = td_connect(&m.d), *c2 = td_connect(&m.d);
    gpubuf_buffer *va = NULL, *va2 = NULL, *vb = NULL, *vc = NULL;
    ck_assert_int_eq(gpubuf_open(c1, "a", 0, &va), 0);
    ck_assert_int_eq(gpubuf_open(c2, "a", 0, &va2), 0);
    ck_assert(!open_brings_fd(c1, "b", false)); /* before the restart too */

    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    /* c2's view goes while no daemon runs: it unmaps the slab, and its
     * resume will not claim the reference. (Reconnecting is off for that
     * call: the kept listening socket would take the connection, and the
     * hello would wait for a daemon this thread starts only afterwards.) */
    ck_assert_int_eq(gpubuf_set_reconnect(c2, 0), 0);
    gpubuf_release(va2);
    ck_assert_int_eq(gpubuf_set_reconnect(c2, 10000), 0);
    fsd_start(&m, k_pool);
    resume(c1, "a");
    resume(c2, "a");
    ck_assert(td_wait_refs(&m.d, "a", 1, 5000));

    /* c1 maps the slab read-write (its view of a, restored and resumed). */
    ck_assert(!open_brings_fd(c1, "b", false));
    ck_assert(open_brings_fd(c1, "b", true)); /* not read-only */
    ck_assert_int_eq(gpubuf_open(c1, "b", 0, &vb), 0);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(vb), 1 << 20, 2), 0);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(va), 1 << 20, 1), 0);
    /* c2 no longer maps it: the fd comes, and its view reads right. */
    ck_assert(open_brings_fd(c2, "c", false));
    ck_assert_int_eq(gpubuf_open(c2, "c", 0, &vc), 0);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(vc), 1 << 20, 3), 0);
    ck_assert(!open_brings_fd(c2, "b", false));

    gpubuf_release(va);
    gpubuf_release(vb);
    gpubuf_release(vc);
    gpubuf_disconnect(c1);
    gpubuf_disconnect(c2);
    ck_assert(td_wait_refs(&m.d, "a", 0, 5000));
    ck_assert(td_wait_refs(&m.d, "b", 0, 5000));
    ck_assert(td_wait_refs(&m.d, "c", 0, 5000));
    fsd_cleanup(&m);
}
END_TEST

#define NB 100
#define NB_SIZE 4096u

/* Batches and a SIGKILL: every change a batch made (allocs, seals,
 * releases, deletes, opens) is in the saved state; a batch that finds the
 * daemon gone is sent after the reconnect; a session
 * that does not come back loses its references after resume_timeout_ms
 * (dropped by the loop's reaper). */
START_TEST(batch_changes_survive_sigkill) {
    fake_sd m;
    char conf[256], names[NB][16];
    const char *pn[NB];
    uint64_t sizes[NB];
    gpubuf_buffer *v[NB] = {0}, *w[NB] = {0}, *y[10] = {0};
    int st[NB];
    const char *args[] = {"--pool", "host=host,capacity=1G", "--config", conf, NULL};
    start_short_resume(&m, conf, sizeof(conf), args);
    for (int i = 0; i < NB; i++) {
        snprintf(names[i], sizeof(names[i]), "n%d", i);
        pn[i] = names[i];
        sizes[i] = NB_SIZE;
    }
    gpubuf_client *c = td_connect(&m.d), *d = td_connect(&m.d), *e = td_connect(&m.d);
    ck_assert_int_eq(gpubuf_set_reconnect(d, 0), 0);
    ck_assert_int_eq(gpubuf_alloc_many(c, "host", NB, sizes, pn, 0, v, st), 0);
    for (int i = 0; i < NB; i++)
        td_fill(gpubuf_buffer_host_ptr(v[i]), NB_SIZE, 100u + (uint32_t)i);
    ck_assert_int_eq(gpubuf_seal_many(v, NB, st), 0);
    /* c keeps n0..n49; d opens n0..n19; n90..n99 are deleted. */
    ck_assert_int_eq(gpubuf_release_many(v + 50, NB - 50, st), 0);
    ck_assert_int_eq(gpubuf_delete_many(c, 10, pn + 90, NULL, st), 0);
    ck_assert_int_eq(gpubuf_open_many(d, 20, pn, NULL, 0, w, st), 0);
    ck_assert_int_eq(gpubuf_open_many(e, 10, pn + 60, NULL, 0, y, st), 0);
    ck_assert(td_wait_refs(&m.d, "n0", 2, 5000));

    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    fsd_start(&m, args);
    gpubuf_status *s = td_status(&m.d);
    ck_assert_uint_eq(s->n_buffers, 90);
    ck_assert_uint_eq(s->restored_buffers, 90);
    for (int i = 0; i < 90; i++) {
        const gpubuf_status_buffer *b = td_find_buffer(s, names[i]);
        ck_assert_msg(b != NULL, "%s not restored", names[i]);
        ck_assert_int_eq(b->state, GPUBUF_STATE_SEALED);
        ck_assert_uint_eq(b->refs, i < 20 ? 2 : i < 50 || (i >= 60 && i < 70) ? 1 : 0);
    }
    ck_assert_ptr_null(td_find_buffer(s, "n90"));
    gpubuf_status_free(s);

    /* A batch that found the daemon gone was not sent: it is sent after
     * the reconnect and works, and the resumed views kept their contents. */
    gpubuf_buffer *x[10] = {0};
    int r = gpubuf_open_many(c, 10, pn + 50, NULL, 0, x, st);
    ck_assert_msg(r == 0, "open_many after the restart: %s (%s)", gpubuf_strerror(r),
                  gpubuf_last_error_message());
    for (int i = 0; i < 10; i++)
        ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(x[i]), NB_SIZE, 150u + (uint32_t)i),
                          0);
    for (int i = 0; i < 50; i++)
        ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(v[i]), NB_SIZE, 100u + (uint32_t)i),
                          0);
    /* A batch release that finds the daemon gone is done by the resume. */
    ck_assert_int_eq(gpubuf_release_many(y, 10, st), 0);
    ck_assert(td_wait_refs(&m.d, "n60", 0, 5000));
    ck_assert(td_wait_refs(&m.d, "n69", 0, 5000));
    gpubuf_disconnect(e);
    /* d did not come back: its references go after resume_timeout_ms. */
    ck_assert(td_wait_refs(&m.d, "n19", 1, 5000));
    ck_assert(td_wait_refs(&m.d, "n0", 1, 5000));
    s = td_status(&m.d);
    ck_assert_ptr_null(s->client_detached);
    ck_assert_uint_eq(td_find_buffer(s, "n50")->refs, 1);
    gpubuf_status_free(s);

    ck_assert_int_eq(gpubuf_release_many(x, 10, st), 0);
    ck_assert_int_eq(gpubuf_release_many(v, 50, st), 0);
    ck_assert_int_eq(gpubuf_release_many(w, 20, st), GPUBUF_EDISCONNECTED);
    gpubuf_disconnect(c);
    gpubuf_disconnect(d);
    ck_assert(td_wait_refs(&m.d, "n0", 0, 5000));
    fsd_cleanup(&m);
}
END_TEST

/* Buffers deleted while held go with their last reference (version 3 of
 * the saved state says the reference and the removal in one entry): after
 * a SIGKILL, those whose last holder let them go are not restored, and
 * those still held are, deleted, until their holder lets them go. */
START_TEST(last_references_survive_sigkill) {
    enum { N = 10 };
    fake_sd m;
    char names[N][16];
    const char *pn[N];
    uint64_t sizes[N];
    gpubuf_buffer *v[N] = {0}, *w[N] = {0};
    int st[N];
    /* The default resume_timeout_ms (30 s): d's session waits for it however
     * slow the machine is. */
    const char *args[] = {"--pool", "host=host,capacity=1G", NULL};
    fsd_init(&m);
    fsd_start(&m, args);
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "g%d", i);
        pn[i] = names[i];
        sizes[i] = NB_SIZE;
    }
    gpubuf_client *c = td_connect(&m.d), *d = td_connect(&m.d);
    ck_assert_int_eq(gpubuf_alloc_many(c, "host", N, sizes, pn, GPUBUF_ALLOC_SEAL, v, st), 0);
    ck_assert_int_eq(gpubuf_open_many(d, 5, pn, NULL, 0, w, st), 0);
    /* All deleted while held; c lets all go (g5..g9 go with it), then d
     * lets g0 and g1 go (they go with d's). */
    ck_assert_int_eq(gpubuf_delete_many(c, N, pn, NULL, st), 0);
    ck_assert_int_eq(gpubuf_release_many(v, N, st), 0);
    ck_assert_int_eq(gpubuf_release_many(w, 2, st), 0);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    ck_assert_int_eq(gpubuf_flush(d), 0);
    gpubuf_status *s = status_on(d);
    ck_assert_uint_eq(s->n_buffers, 3);
    gpubuf_status_free(s);

    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    fsd_start(&m, args);
    /* The status request reconnects d, which resumes with its three views. */
    s = status_on(d);
    ck_assert_uint_eq(s->n_buffers, 3);
    ck_assert_uint_eq(s->restored_buffers, 3);
    gpubuf_status_free(s);
    /* d lets the rest go: nothing is left. */
    ck_assert_int_eq(gpubuf_release_many(w + 2, 3, st), 0);
    ck_assert_int_eq(gpubuf_flush(d), 0);
    s = status_on(d);
    ck_assert_uint_eq(s->n_buffers, 0);
    gpubuf_status_free(s);
    gpubuf_disconnect(c);
    gpubuf_disconnect(d);
    fsd_cleanup(&m);
}
END_TEST

/* The view of own_count_survives_sigkill's waiting open, once delivered. */
static gpubuf_buffer *g_woken;

static void on_woken(gpubuf_client *c, const gpubuf_completion *d) {
    (void)c;
    ck_assert_msg(d->result == 0, "the waiting open: %s", d->message);
    g_woken = d->view;
}

/* A client's waiting open of w, woken by the seal of its own alloc of w in
 * the same request: its count of references to w, 2, survives SIGKILL.
 * The alloc's entry carries the owner's count as it is when the entry is
 * written (the alloc's 1 and the wake's 2 come before it); with the 1 the
 * owner's first release after the restart would free w under its second
 * view. */
START_TEST(own_count_survives_sigkill) {
    fake_sd m;
    const char *args[] = {"--pool", "host=host,capacity=1G", NULL};
    const char *pn[1] = {"w"};
    uint64_t sizes[1] = {NB_SIZE}, h;
    gpubuf_buffer *v[1] = {0};
    int st[1];
    fsd_init(&m);
    fsd_start(&m, args);
    gpubuf_client *c = td_connect(&m.d);
    gpubuf_lookup o = {.timeout_ms = 60000};
    g_woken = NULL;
    ck_assert_int_eq(gpubuf_open_start(c, "w", 0, &o, on_woken, NULL, &h), 0);
    /* Sent after the open: the daemon has the waiter when it allocates. */
    ck_assert_int_eq(gpubuf_alloc_many(c, "host", 1, sizes, pn, GPUBUF_ALLOC_SEAL, v, st), 0);
    for (int t = 0; t < 60000 && !g_woken; t += 10) {
        struct pollfd p = {.fd = gpubuf_client_fd(c), .events = POLLIN};
        ck_assert_int_ge(poll(&p, 1, 10), 0);
        ck_assert_int_ge(gpubuf_dispatch(c), 0);
    }
    ck_assert_ptr_nonnull(g_woken);
    gpubuf_status *s = status_on(c);
    const gpubuf_status_buffer *b = td_find_buffer(s, "w");
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(b->refs, 2);
    gpubuf_status_free(s);

    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    fsd_start(&m, args);
    /* The status request reconnects c, which resumes with its two views. */
    s = status_on(c);
    ck_assert_uint_eq(s->restored_buffers, 1);
    b = td_find_buffer(s, "w");
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(b->refs, 2);
    gpubuf_status_free(s);
    /* Deleted while held: it goes with the second release, not the first. */
    ck_assert_int_eq(gpubuf_delete(c, "w"), 0);
    gpubuf_release(v[0]);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    s = status_on(c);
    ck_assert_uint_eq(s->n_buffers, 1);
    gpubuf_status_free(s);
    gpubuf_release(g_woken);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    s = status_on(c);
    ck_assert_uint_eq(s->n_buffers, 0);
    gpubuf_status_free(s);
    gpubuf_disconnect(c);
    fsd_cleanup(&m);
}
END_TEST

/* Buffer name's metadata by stat on c: its lease left, in ms. */
static uint64_t stat_meta(gpubuf_client *c, const char *name, gpubuf_buffer_meta *m) {
    gpubuf_buffer_info info;
    ck_assert_int_eq(gpubuf_stat_meta(c, name, 0, NULL, &info, m), 0);
    return m->lease_left_ms;
}

static void check_same_meta(const gpubuf_buffer_meta *a, const gpubuf_buffer_meta *b) {
    ck_assert_int_eq(a->has_layout, b->has_layout);
    ck_assert_int_eq(a->layout.dtype.code, b->layout.dtype.code);
    ck_assert_int_eq(a->layout.dtype.bits, b->layout.dtype.bits);
    ck_assert_int_eq(a->layout.dtype.lanes, b->layout.dtype.lanes);
    ck_assert_uint_eq(a->layout.ndim, b->layout.ndim);
    ck_assert_uint_eq(a->layout.byte_offset, b->layout.byte_offset);
    ck_assert_int_eq(a->layout.has_strides, b->layout.has_strides);
    for (uint32_t k = 0; k < a->layout.ndim; k++) {
        ck_assert_int_eq(a->layout.shape[k], b->layout.shape[k]);
        ck_assert_int_eq(a->layout.strides[k], b->layout.strides[k]);
    }
    ck_assert_uint_eq(a->user_size, b->user_size);
    ck_assert_mem_eq(a->user_data, b->user_data, a->user_size);
}

/* A layout, user bytes and a lease set at alloc and seal, and a renewed
 * lease, survive SIGKILL; a lease that ran out while the daemon was down
 * expires at once after the restart. */
START_TEST(metadata_and_leases_survive_sigkill) {
    fake_sd m;
    static const char user[] = "restart: user bytes";
    const int64_t shape[2] = {8, 16};
    gpubuf_layout lay = f32(2, shape);
    lay.has_strides = 1; /* column-major, after a 64-byte header */
    lay.strides[0] = 1;
    lay.strides[1] = 8;
    lay.byte_offset = 64;
    gpubuf_meta at_alloc = {.layout = &lay, .ttl_ms = 60000};
    gpubuf_meta at_seal = {.user_data = user, .user_size = sizeof(user), .ttl_ms = 120000};
    gpubuf_meta short_lease = {.ttl_ms = 300};
    gpubuf_meta renewed = {.ttl_ms = 1000};
    gpubuf_buffer *b, *r, *s;
    gpubuf_buffer_meta *before = calloc(1, sizeof(*before)), *after = calloc(1, sizeof(*after));
    gpubuf_buffer_meta *rb = calloc(1, sizeof(*rb)), *ra = calloc(1, sizeof(*ra));
    ck_assert(before && after && rb && ra);
    fsd_init(&m);
    fsd_start(&m, k_pool);
    gpubuf_client *c = td_connect(&m.d);
    ck_assert_int_eq(gpubuf_alloc_with(c, "host", 4096, "meta", &at_alloc, &b), 0);
    ck_assert_int_eq(gpubuf_seal_sync_with(b, &at_seal), 0);
    ck_assert_int_eq(gpubuf_alloc_with(c, "host", 4096, "renewed", &renewed, &r), 0);
    ck_assert_int_eq(gpubuf_seal_sync_with(r, NULL), 0);
    ck_assert_int_eq(gpubuf_renew(c, "renewed", 0, 600000), 0);
    ck_assert_int_eq(gpubuf_alloc_with(c, "host", 4096, "short", &short_lease, &s), 0);
    ck_assert_int_eq(gpubuf_seal_sync_with(s, NULL), 0);
    ck_assert_int_eq(gpubuf_release(b), 0);
    ck_assert_int_eq(gpubuf_release(r), 0);
    ck_assert_int_eq(gpubuf_release(s), 0);
    uint64_t left = stat_meta(c, "meta", before);
    ck_assert(left > 100000 && left <= 120000);
    ck_assert(stat_meta(c, "renewed", rb) > 500000);
    gpubuf_disconnect(c);
    for (int t = 0; t < 100 && fsd_count(&m, "slab-") < 1; t++)
        fsd_wait(&m, NULL, 20);

    /* Down for longer than "short"'s lease. */
    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    usleep(500 * 1000); /* down for a while: measures a duration */
    fsd_start(&m, k_pool);
    c = td_connect(&m.d);
    uint64_t left2 = stat_meta(c, "meta", after);
    check_same_meta(before, after);
    ck_assert_uint_eq(after->lease_ttl_ms, 120000);
    /* The time it was down counted; restarting took seconds, not minutes. */
    ck_assert_msg(left2 <= left - 500 && left2 + 30000 > left, "lease left %llu ms, was %llu",
                  (unsigned long long)left2, (unsigned long long)left);
    ck_assert(stat_meta(c, "renewed", ra) > 500000);
    check_same_meta(rb, ra);
    ck_assert_uint_eq(ra->lease_ttl_ms, 600000);
    ck_assert(!ra->has_layout && ra->user_size == 0);

    /* An open gets the same layout and user bytes. */
    ck_assert_int_eq(gpubuf_open(c, "meta", 0, &b), 0);
    const gpubuf_layout *l = gpubuf_buffer_layout(b);
    ck_assert_ptr_nonnull(l);
    ck_assert_uint_eq(l->ndim, 2);
    ck_assert_int_eq(l->strides[1], 8);
    ck_assert_uint_eq(l->byte_offset, 64);
    size_t n;
    const void *u = gpubuf_buffer_user_data(b, &n);
    ck_assert_uint_eq(n, sizeof(user));
    ck_assert_mem_eq(u, user, sizeof(user));
    ck_assert_int_eq(gpubuf_release(b), 0);

    /* "short" ran out while the daemon was down: gone at once. */
    gpubuf_buffer_info info;
    int rc = 0;
    for (int i = 0; i < 100 && (rc = gpubuf_stat(c, "short", &info)) == 0; i++)
        usleep(20 * 1000);
    ck_assert_int_eq(rc, -ENOENT);
    gpubuf_status *st = td_status(&m.d);
    ck_assert_uint_eq(st->leases_active, 2);
    ck_assert_uint_ge(st->leases_expired, 1);
    gpubuf_status_free(st);

    /* The renewal after the restart is journalled as well. */
    ck_assert_int_eq(gpubuf_renew(c, "meta", 0, 900000), 0);
    gpubuf_disconnect(c);
    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    fsd_start(&m, k_pool);
    c = td_connect(&m.d);
    ck_assert(stat_meta(c, "meta", after) > 800000);
    ck_assert_uint_eq(after->lease_ttl_ms, 900000);
    check_same_meta(before, after);
    gpubuf_disconnect(c);
    free(before);
    free(after);
    free(rb);
    free(ra);
    fsd_cleanup(&m);
}
END_TEST

/* Issue 22, finding 6: a restored buffer's metadata is charged to its
 * owner's uid as an alloc's was. The uid fills max_meta_bytes_per_uid with
 * named buffers of 4 KiB user bytes ("q/NN": 4 + 24 + 4096 B each, 15 in
 * 64 KiB), the daemon is SIGKILLed and comes back over its kept state: one
 * more is still refused, and deleting a restored one gives its charge back. */
START_TEST(metadata_charge_survives_sigkill) {
    static uint8_t user[GPUBUF_USER_DATA_MAX];
    gpubuf_meta m = {.user_data = user, .user_size = sizeof(user)};
    char conf[256], name[16];
    fake_sd sd;
    gpubuf_buffer *b;
    int n = 0, rc = 0;
    const char *const args[] = {"--config", conf, "--pool", "host=host,capacity=64M", NULL};
    start_with_conf(&sd, conf, sizeof(conf), "[daemon]\nmax_meta_bytes_per_uid = 64K\n", args);
    gpubuf_client *c = td_connect(&sd.d);
    for (; n < 200; n++) {
        snprintf(name, sizeof(name), "q/%02d", n);
        if ((rc = gpubuf_alloc_with(c, "host", 256, name, &m, &b)) < 0)
            break;
        ck_assert_int_eq(gpubuf_seal_sync(b), 0);
        ck_assert_int_eq(gpubuf_release(b), 0);
    }
    ck_assert_int_eq(n, 65536 / (4 + 24 + GPUBUF_USER_DATA_MAX));
    ck_assert_int_eq(rc, -EDQUOT);
    gpubuf_disconnect(c);
    for (int t = 0; t < 1000 && fsd_count(&sd, "slab-") < 1; t++)
        fsd_wait(&sd, NULL, 20);

    ck_assert_int_eq(fsd_kill(&sd, SIGKILL), 128 + SIGKILL);
    fsd_start(&sd, args);
    c = td_connect(&sd.d);
    gpubuf_status *s = td_status(&sd.d);
    ck_assert_uint_eq(s->restored_buffers, (uint32_t)n);
    gpubuf_status_free(s);
    rc = gpubuf_alloc_with(c, "host", 256, "q/more", &m, &b);
    ck_assert_msg(rc == -EDQUOT && strstr(gpubuf_last_error_message(),
                                          "max_meta_bytes_per_uid = 65536"),
                  "after the restart: %d, %s", rc, gpubuf_last_error_message());
    ck_assert_int_eq(gpubuf_delete(c, "q/00"), 0);
    gpubuf_buffer *again;
    ck_assert_int_eq(gpubuf_alloc_with(c, "host", 256, "q/00", &m, &again), 0);
    ck_assert_int_eq(gpubuf_alloc_with(c, "host", 256, "q/more", &m, &b), -EDQUOT);
    ck_assert_int_eq(gpubuf_release(again), 0);
    gpubuf_disconnect(c);
    fsd_cleanup(&sd);
}
END_TEST

/* state_journal = switchable (measurement only): SIGUSR2 turns the journal
 * off, and on again after a whole snapshot. What was made while it was off
 * is in that snapshot and survives a SIGKILL after it; what is made while
 * it is off does not survive one; a SIGTERM while it is off keeps the
 * registry as it is. The daemon says each switch to the service manager
 * (STATUS=). */
static void switch_journal(fake_sd *m, const char *to) {
    char want[64];
    snprintf(want, sizeof(want), "journal %s (state_journal = switchable)", to);
    ck_assert_int_eq(kill(m->d.pid, SIGUSR2), 0);
    ck_assert_msg(fsd_wait(m, want, 30000), "no \"%s\" from gpubufd", want);
}

static void expect_buffer(const test_daemon *d, const char *name, uint32_t seed, bool there) {
    gpubuf_client *c = td_connect(d);
    gpubuf_buffer *b = NULL;
    int r = gpubuf_open(c, name, 0, &b);
    if (!there) {
        ck_assert_msg(r == -ENOENT, "%s: %d, not -ENOENT", name, r);
    } else {
        ck_assert_msg(r == 0, "%s: %s", name, gpubuf_strerror(r));
        ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(b), 1 << 20, seed), 0);
        gpubuf_release(b);
    }
    gpubuf_disconnect(c);
}

/* Turn the journal off, then make `made` (seed) and delete `gone`: changes
 * that a planned stop or a takeover must not lose. */
static void off_then_change(fake_sd *m, const char *made, uint32_t seed, const char *gone) {
    switch_journal(m, "off");
    td_produce(&m->d, made, 1 << 20, seed);
    gpubuf_client *c = td_connect(&m->d);
    ck_assert_int_eq(gpubuf_delete(c, gone), 0);
    gpubuf_disconnect(c);
}

#define SWITCHABLE "[daemon]\nstate_journal = switchable\n"

START_TEST(switchable_journal) {
    fake_sd m;
    char conf[256];
    const char *args[] = {"--pool", "host=host,capacity=1G", "--config", conf, NULL};
    start_with_conf(&m, conf, sizeof(conf), SWITCHABLE, args);
    td_produce(&m.d, "before", 1 << 20, 1);
    switch_journal(&m, "off");
    td_produce(&m.d, "while-off", 1 << 20, 2);
    switch_journal(&m, "on");
    td_produce(&m.d, "after", 1 << 20, 3);
    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    fsd_start(&m, args);
    expect_buffer(&m.d, "before", 1, true);
    expect_buffer(&m.d, "while-off", 2, true);
    expect_buffer(&m.d, "after", 3, true);
    /* The journal is on again after a start; off, a change is not kept. */
    switch_journal(&m, "off");
    td_produce(&m.d, "lost", 1 << 20, 4);
    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    fsd_start(&m, args);
    expect_buffer(&m.d, "lost", 4, false);
    expect_buffer(&m.d, "after", 3, true);
    /* A planned stop while it is off keeps the registry as it is: what was
     * made is there, what was deleted does not come back. */
    off_then_change(&m, "made-off", 5, "before");
    ck_assert_int_eq(fsd_kill(&m, SIGTERM), 0);
    fsd_start(&m, args);
    expect_buffer(&m.d, "made-off", 5, true);
    expect_buffer(&m.d, "before", 1, false);
    expect_buffer(&m.d, "after", 3, true);
    fsd_cleanup(&m);
}
END_TEST

/* A takeover while a switchable journal is off: the old daemon writes a
 * snapshot before it hands its fds over (gd_state_fds), so the successor
 * restores the registry as it is: what was made while the journal was off is
 * there, what was deleted meanwhile does not come back. */
START_TEST(takeover_while_the_journal_is_off) {
    fake_sd m;
    char conf[256];
    const char *args[] = {"--pool", "host=host,capacity=1G", "--config", conf, NULL};
    start_with_conf(&m, conf, sizeof(conf), SWITCHABLE, args);
    td_produce(&m.d, "kept", 1 << 20, 1);
    td_produce(&m.d, "deleted", 1 << 20, 2);
    off_then_change(&m, "made-off", 3, "deleted");
    td_takeover(&m.d, "host=host,capacity=1G");
    expect_buffer(&m.d, "kept", 1, true);
    expect_buffer(&m.d, "made-off", 3, true);
    expect_buffer(&m.d, "deleted", 2, false);
    fsd_cleanup(&m);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("restart");
    TCase *t;
#ifdef GPUBUF_TEST_SYSTEMD
    t = add_case(s, "restart", NULL, NULL, 60);
    add_tests(t, sigkill_and_sigterm_keep_the_buffer, sessions_not_resumed_are_released,
              bad_state_is_dropped, slab_once_after_resume, batch_changes_survive_sigkill,
              last_references_survive_sigkill, own_count_survives_sigkill,
              metadata_and_leases_survive_sigkill, metadata_charge_survives_sigkill,
              switchable_journal, takeover_while_the_journal_is_off);
#else
    (void)sigkill_and_sigterm_keep_the_buffer;
    (void)sessions_not_resumed_are_released;
    (void)bad_state_is_dropped;
    (void)last_references_survive_sigkill;
    (void)own_count_survives_sigkill;
    (void)slab_once_after_resume;
    (void)batch_changes_survive_sigkill;
    (void)metadata_and_leases_survive_sigkill;
    (void)metadata_charge_survives_sigkill;
    (void)switchable_journal;
    (void)takeover_while_the_journal_is_off;
    printf("test_restart: gpubufd is built without libsystemd (no fd store): only the "
           "takeover case runs\n");
#endif
    t = add_case(s, "takeover", NULL, NULL, 60);
    tcase_add_test(t, takeover_keeps_the_buffer);
    return s;
}

int main(void) {
    return run_suite(suite());
}
