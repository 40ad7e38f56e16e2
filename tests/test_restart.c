/* Restart survival on host pools: gpubufd SIGKILLed and stopped with
 * SIGTERM under a service manager that keeps its fds (tests/fdstore.c), and
 * taken over by a successor (gpubufd --takeover), while a consumer keeps
 * reading a 256 MiB buffer; the buffer keeps its name, contents and
 * references, and nothing leaks. Also: a saved state that does not check
 * out is dropped, not trusted. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "fdstore.h"
#include "harness.h"

#define BIG (256ull << 20)
#define SEED 0x5eed
static const char *const k_pool[] = {"--pool", "host=host,capacity=1G", NULL};

/* Allocate, fill and seal `name` (size bytes) and let it go: it stays,
 * named and sealed, with no reference. */
static void produce(const test_daemon *d, const char *name, uint64_t size, uint32_t seed) {
    gpubuf_client *c = td_connect(d);
    gpubuf_buffer *b = NULL;
    ck_assert_int_eq(gpubuf_alloc(c, "host", size, name, &b), 0);
    td_fill(gpubuf_buffer_host_ptr(b), size, seed);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}

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
    produce(&m.d, "big", BIG, SEED);
    for (int t = 0; t < 100 && fsd_count(&m, "slab-") < 1; t++)
        fsd_wait(&m, NULL, 20);
    /* The store holds the listening socket, the two state memfds, one slab. */
    ck_assert_int_eq(fsd_count(&m, "slab-"), 1);
    ck_assert_int_eq(fsd_count(&m, "state-"), 2);
    ck_assert_int_eq(fsd_count(&m, "listen"), 1);
    int fds_before = td_count_fds(m.d.pid);
    consumer_start(&k, &m.d);
    ck_assert(td_wait_refs(&m.d, "big", 1, 5000));

    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    fsd_start(&m, k_pool);
    check_resumed(&m.d, k.pid, 1);

    ck_assert_int_eq(fsd_kill(&m, SIGTERM), 0);
    fsd_start(&m, k_pool);
    check_resumed(&m.d, k.pid, 2);
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

/* A session whose client does not come back is released after
 * resume_timeout_ms, and with it the buffer's reference. */
START_TEST(sessions_not_resumed_are_released) {
    fake_sd m;
    char conf[256];
    fsd_init(&m);
    snprintf(conf, sizeof(conf), "%s/gpubuf.conf", m.d.dir);
    FILE *f = fopen(conf, "w");
    ck_assert_ptr_nonnull(f);
    fputs("[daemon]\nresume_timeout_ms = 300\n", f);
    fclose(f);
    const char *args[] = {"--pool", "host=host,capacity=1G", "--config", conf, NULL};
    fsd_start(&m, args);
    produce(&m.d, "small", 1 << 20, 7);
    gpubuf_client *c = td_connect(&m.d);
    gpubuf_buffer *b = NULL;
    ck_assert_int_eq(gpubuf_set_reconnect(c, 0), 0);
    ck_assert_int_eq(gpubuf_open(c, "small", 0, &b), 0);
    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    fsd_start(&m, args);
    gpubuf_status *s = td_status(&m.d);
    ck_assert_uint_eq(td_find_buffer(s, "small")->refs, 1);
    ck_assert_ptr_nonnull(s->client_detached);
    gpubuf_status_free(s);
    ck_assert(td_wait_refs(&m.d, "small", 0, 5000));
    s = td_status(&m.d);
    ck_assert_ptr_null(s->client_detached);
    gpubuf_status_free(s);
    /* Reconnecting is off: the call fails and says so; the view stays. */
    gpubuf_buffer_info info;
    ck_assert_int_lt(gpubuf_stat(c, "small", &info), 0);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(b), 1 << 20, 7), 0);
    gpubuf_release(b);
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
    produce(&m.d, "a", 1 << 20, 1);
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
    produce(&m.d, "b", 1 << 20, 2);
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
    produce(&d, "big", BIG, SEED);
    consumer_start(&k, &d);
    ck_assert(td_wait_refs(&d, "big", 1, 5000));
    pid_t old = d.pid;
    pid_t succ = fork();
    ck_assert_int_ge(succ, 0);
    if (succ == 0) {
        execl(GPUBUFD_PATH, GPUBUFD_PATH, "--socket", d.socket, "--log-level", "notice",
              "--pool", "host=host,capacity=1G", "--takeover", (char *)NULL);
        _exit(127);
    }
    int st = -1;
    ck_assert_int_eq(waitpid(old, &st, 0), old);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    d.pid = succ;
    check_resumed(&d, k.pid, 1);
    ck_assert_int_eq(reader_stop(&k), 0);
    ck_assert(td_wait_refs(&d, "big", 0, 5000));
    check_contents(&d);
    /* A second takeover by a process of the same uid works as well; an
     * ordinary client cannot ask for one without a socket to receive. */
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("restart");
    TCase *t = tcase_create("restart");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, sigkill_and_sigterm_keep_the_buffer);
    tcase_add_test(t, sessions_not_resumed_are_released);
    tcase_add_test(t, bad_state_is_dropped);
    suite_add_tcase(s, t);
    t = tcase_create("takeover");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, takeover_keeps_the_buffer);
    suite_add_tcase(s, t);
    return s;
}

int main(void) {
    return run_suite(suite());
}
