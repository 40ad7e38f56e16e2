/* Reconnecting after gpubufd went away (docs/client-api.md, "Restart"): a
 * request that never left is sent after the reconnect; one that was in
 * flight is sent again only when it reads (stat, status); the messages say
 * whether the session was resumed, and views of a session the daemon
 * restarted without fail cleanly. Host pools. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/sockios.h>

#include "check_main.h"
#include "fdstore.h"
#include "harness.h"
#include "internal.h"

#define SIZE (1u << 20)
static const char *const k_pool[] = {"--pool", "host=host,capacity=256M", NULL};

/* c holds a view of the sealed "a" (*va) and of the unsealed "u" (*vu). */
static void hold_two(gpubuf_client *c, gpubuf_buffer **va, gpubuf_buffer **vu) {
    ck_assert_int_eq(gpubuf_open(c, "a", 0, va), 0);
    ck_assert_int_eq(gpubuf_alloc(c, "host", SIZE, "u", vu), 0);
    td_fill(gpubuf_buffer_host_ptr(*vu), SIZE, 2);
}

/* A daemon with a fake systemd fd store (m), the sealed "a" in it, and a
 * client holding "a" and the unsealed "u" (hold_two). */
static gpubuf_client *start_holding_two(fake_sd *m, gpubuf_buffer **va, gpubuf_buffer **vu) {
    fsd_init(m);
    fsd_start(m, k_pool);
    td_produce(&m->d, "a", SIZE, 1);
    gpubuf_client *c = td_connect(&m->d);
    hold_two(c, va, vu);
    return c;
}

/* Sealed buffers "pb0".."pb{n-1}" of 4 KiB that nobody holds; their names
 * in names (freed by the caller, each and the array). */
static char **produce_many(const test_daemon *d, size_t n) {
    gpubuf_client *p = td_connect(d);
    char **names = calloc(n, sizeof(*names));
    uint64_t *sizes = calloc(n, sizeof(*sizes));
    gpubuf_buffer **b = calloc(n, sizeof(*b));
    ck_assert(names && sizes && b);
    for (size_t i = 0; i < n; i++) {
        names[i] = malloc(24);
        snprintf(names[i], 24, "pb%zu", i);
        sizes[i] = 4096;
    }
    ck_assert_int_eq(gpubuf_alloc_many(p, "host", n, sizes, (const char *const *)names,
                                       GPUBUF_ALLOC_SEAL, b, NULL),
                     0);
    ck_assert_int_eq(gpubuf_release_many(b, n, NULL), 0);
    gpubuf_disconnect(p);
    free(sizes);
    free(b);
    return names;
}

/* The state of buffer name in d, -1 when it is not there. */
static int state_of(const test_daemon *d, const char *name) {
    gpubuf_status *s = td_status(d);
    const gpubuf_status_buffer *b = td_find_buffer(s, name);
    int st = b ? (int)b->state : -1;
    gpubuf_status_free(s);
    return st;
}

/* The first call of c after the restart: it succeeds and leaves no message. */
static void stat_ok(gpubuf_client *c, const char *name) {
    gpubuf_buffer_info info;
    int r = gpubuf_stat(c, name, &info);
    ck_assert_msg(r == 0, "stat after the restart: %s (%s)", gpubuf_strerror(r),
                  gpubuf_last_error_message());
    ck_assert_str_eq(gpubuf_last_error_message(), "");
    ck_assert_uint_eq(info.size, SIZE);
}

#ifdef GPUBUF_TEST_SYSTEMD
/* An idle client (views held, nothing sent while the daemon was away):
 * after a SIGKILL and a start over the saved state, its first request
 * (stat) succeeds without an error, its first seal after a second restart
 * as well (it was never sent to the dead daemon), and the views kept their
 * references and contents. */
START_TEST(idle_client_with_saved_state) {
    fake_sd m;
    gpubuf_buffer *va = NULL, *vu = NULL;
    gpubuf_client *c = start_holding_two(&m, &va, &vu);

    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    fsd_start(&m, k_pool);
    stat_ok(c, "a");
    ck_assert(td_wait_refs(&m.d, "a", 1, 30000));

    ck_assert_int_eq(fsd_kill(&m, SIGKILL), 128 + SIGKILL);
    fsd_start(&m, k_pool);
    int r = gpubuf_seal_sync(vu);
    ck_assert_msg(r == 0, "seal after the restart: %s (%s)", gpubuf_strerror(r),
                  gpubuf_last_error_message());
    ck_assert_str_eq(gpubuf_last_error_message(), "");
    ck_assert_int_eq(state_of(&m.d, "u"), GPUBUF_STATE_SEALED);
    ck_assert(td_wait_refs(&m.d, "u", 1, 30000));
    ck_assert(td_wait_refs(&m.d, "a", 1, 30000));
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(va), SIZE, 1), 0);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(vu), SIZE, 2), 0);

    ck_assert_int_eq(gpubuf_release(va), 0);
    ck_assert_int_eq(gpubuf_release(vu), 0);
    gpubuf_disconnect(c);
    ck_assert(td_wait_refs(&m.d, "a", 0, 30000));
    fsd_cleanup(&m);
}
END_TEST

/* A request of c runs on another thread. */
typedef struct call {
    gpubuf_client *c;
    gpubuf_buffer *b; /* seal: the view */
    int r;
    char msg[512];
} call;

static void *stat_thread(void *arg) {
    call *k = arg;
    gpubuf_buffer_info info;
    k->r = gpubuf_stat(k->c, "a", &info);
    snprintf(k->msg, sizeof(k->msg), "%s", gpubuf_last_error_message());
    return NULL;
}

static void *seal_thread(void *arg) {
    call *k = arg;
    k->r = gpubuf_seal_sync(k->b);
    snprintf(k->msg, sizeof(k->msg), "%s", gpubuf_last_error_message());
    return NULL;
}

/* Bytes c has sent that its peer has not read yet (SIOCOUTQ). */
static int unread(gpubuf_client *c) {
    int n = 0;
    ck_assert_int_eq(ioctl(c->fd, SIOCOUTQ, &n), 0);
    return n;
}

#define MANY 600 /* items of a batch call: three requests in a pipeline */

typedef struct many_call {
    call k;
    char **names;
    gpubuf_buffer *got[MANY];
    int st[MANY];
} many_call;

static void *open_many_thread(void *arg) {
    many_call *m = arg;
    m->k.r = gpubuf_open_many(m->k.c, MANY, (const char *const *)m->names, NULL, 0, m->got, m->st);
    snprintf(m->k.msg, sizeof(m->k.msg), "%s", gpubuf_last_error_message());
    return NULL;
}

/* Run fn on another thread while the daemon is stopped; once its request
 * lies in the daemon's socket, unread, SIGKILL the daemon and start it
 * again over the saved state. */
static void in_flight(fake_sd *m, void *(*fn)(void *), call *k) {
    pthread_t t;
    ck_assert_int_eq(unread(k->c), 0);
    ck_assert_int_eq(kill(m->d.pid, SIGSTOP), 0);
    ck_assert_int_eq(pthread_create(&t, NULL, fn, k), 0);
    bool sent = false;
    for (int ms = 0; ms < 30000 && !sent; ms += 5) {
        sent = unread(k->c) > 0;
        if (!sent)
            td_sleep_ms(5);
    }
    ck_assert_msg(sent, "the request did not reach the daemon's socket");
    ck_assert_int_eq(fsd_kill(m, SIGKILL), 128 + SIGKILL);
    fsd_start(m, k_pool);
    ck_assert_int_eq(pthread_join(t, NULL), 0);
}

/* The daemon dies with a request in flight (sent, no reply): a stat is
 * sent again once and succeeds; a seal is not (the old daemon may have
 * applied it): it fails and says the session was resumed, with how many
 * references; sent again by the caller it works. */
START_TEST(in_flight_requests) {
    fake_sd m;
    gpubuf_buffer *va = NULL, *vu = NULL;
    gpubuf_client *c = start_holding_two(&m, &va, &vu);

    call k = {.c = c};
    in_flight(&m, stat_thread, &k);
    ck_assert_msg(k.r == 0, "stat in flight: %s (%s)", gpubuf_strerror(k.r), k.msg);
    ck_assert_str_eq(k.msg, "");

    call s = {.c = c, .b = vu};
    in_flight(&m, seal_thread, &s);
    ck_assert_int_eq(s.r, -ECONNRESET);
    ck_assert_msg(strstr(s.msg, "was lost while this request was in flight, so whether gpubufd "
                                "applied it is unknown") &&
                      strstr(s.msg, "reconnected to gpubufd and resumed the session: 2 "
                                    "references kept"),
                  "message: %s", s.msg);
    ck_assert_int_eq(state_of(&m.d, "u"), GPUBUF_STATE_ALLOCATED);
    ck_assert_int_eq(gpubuf_seal_sync(vu), 0);
    ck_assert_int_eq(state_of(&m.d, "u"), GPUBUF_STATE_SEALED);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(va), SIZE, 1), 0);

    ck_assert_int_eq(gpubuf_release(va), 0);
    ck_assert_int_eq(gpubuf_release(vu), 0);
    gpubuf_disconnect(c);
    fsd_cleanup(&m);
}
END_TEST

/* A batch call of three requests, the first two sent before any reply
 * (docs/client-api.md, "Batches"), in flight when the daemon dies: the
 * call fails as a whole and says so, every item with it, no reference is
 * left behind, and the stream is in step: the same call then opens every
 * item. */
START_TEST(in_flight_pipelined_batch) {
    fake_sd m;
    gpubuf_buffer *va = NULL, *vu = NULL;
    gpubuf_client *c = start_holding_two(&m, &va, &vu);
    static many_call k;
    memset(&k, 0, sizeof(k));
    k.k.c = c;
    k.names = produce_many(&m.d, MANY);
    in_flight(&m, open_many_thread, &k.k);
    ck_assert_int_eq(k.k.r, -ECONNRESET);
    ck_assert_msg(strstr(k.k.msg, "was lost while this request was in flight"), "message: %s",
                  k.k.msg);
    for (int i = 0; i < MANY; i++) {
        ck_assert_ptr_null(k.got[i]);
        ck_assert_int_eq(k.st[i], -ECONNRESET);
    }
    ck_assert(td_wait_refs(&m.d, "pb0", 0, 30000));
    ck_assert(td_wait_refs(&m.d, "pb599", 0, 30000));
    int r = gpubuf_open_many(c, MANY, (const char *const *)k.names, NULL, 0, k.got, k.st);
    ck_assert_msg(r == 0, "open_many after the restart: %s", gpubuf_last_error_message());
    ck_assert(td_wait_refs(&m.d, "pb599", 1, 30000));
    ck_assert_int_eq(gpubuf_release_many(k.got, MANY, NULL), 0);
    ck_assert(td_wait_refs(&m.d, "pb0", 0, 30000));
    ck_assert(td_wait_refs(&m.d, "a", 1, 30000));
    for (int i = 0; i < MANY; i++)
        free(k.names[i]);
    free(k.names);
    ck_assert_int_eq(gpubuf_release(va), 0);
    ck_assert_int_eq(gpubuf_release(vu), 0);
    gpubuf_disconnect(c);
    fsd_cleanup(&m);
}
END_TEST
#endif

/* The same over gpubufd --takeover (no service manager): the idle client's
 * first request succeeds. */
START_TEST(idle_client_after_takeover) {
    test_daemon d;
    gpubuf_buffer *va = NULL, *vu = NULL;
    td_start(&d, k_pool);
    td_produce(&d, "a", SIZE, 1);
    gpubuf_client *c = td_connect(&d);
    hold_two(c, &va, &vu);
    td_takeover(&d, "host=host,capacity=256M");
    stat_ok(c, "a");
    ck_assert(td_wait_refs(&d, "a", 1, 30000));
    ck_assert(td_wait_refs(&d, "u", 1, 30000));
    ck_assert_int_eq(gpubuf_release(va), 0);
    ck_assert_int_eq(gpubuf_release(vu), 0);
    gpubuf_disconnect(c);
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A fresh gpubufd (no saved state) after the daemon went: the first
 * request says the session is gone, and what to do; the connection works
 * again; requests on the old views fail cleanly, their release touches no
 * buffer of the new daemon (ids start again at 1), and new views map the
 * new daemon's slabs, not the old ones of the same id. */
START_TEST(fresh_daemon_without_the_session) {
    test_daemon d;
    gpubuf_buffer *va = NULL, *vu = NULL, *vn = NULL, *vo = NULL;
    gpubuf_buffer_info info;
    td_start(&d, k_pool);
    td_produce(&d, "a", SIZE, 1);
    gpubuf_client *c = td_connect(&d);
    hold_two(c, &va, &vu);
    uint64_t old_id = gpubuf_buffer_id(va);

    td_restart(&d, k_pool);
    int r = gpubuf_stat(c, "a", &info);
    const char *msg = gpubuf_last_error_message();
    ck_assert_int_eq(r, -ECONNRESET);
    ck_assert_msg(strstr(msg, "the daemon restarted without your session (gpubufd started "
                              "without saved state): your views' buffers are gone") &&
                      strstr(msg, "release those views, then open or allocate the buffers "
                                  "again") &&
                      !strstr(msg, "resumed"),
                  "message: %s", msg);
    /* The connection works; the buffer went with the old daemon. */
    ck_assert_int_eq(gpubuf_stat(c, "a", &info), -ENOENT);

    /* Requests on the old views fail, and say why. */
    ck_assert_int_eq(gpubuf_seal_sync(vu), GPUBUF_ENOTHELD);
    ck_assert_msg(strstr(gpubuf_last_error_message(), "this view's buffer is gone"), "message: %s",
                  gpubuf_last_error_message());
    ck_assert_int_eq(gpubuf_seal(vu), GPUBUF_ENOTHELD);
    int st = 0;
    ck_assert_int_eq(gpubuf_seal_many(&vu, 1, &st), 1);
    ck_assert_int_eq(st, GPUBUF_ENOTHELD);

    /* A new buffer, on the new daemon's first slab: its view is not the
     * old mapping of a slab with the same id. */
    ck_assert_int_eq(gpubuf_alloc(c, "host", SIZE, "n", &vn), 0);
    ck_assert_ptr_ne(gpubuf_buffer_host_ptr(vn), gpubuf_buffer_host_ptr(va));
    td_fill(gpubuf_buffer_host_ptr(vn), SIZE, 3);
    ck_assert_int_eq(gpubuf_seal_sync(vn), 0);
    gpubuf_client *o = td_connect(&d);
    ck_assert_int_eq(gpubuf_open(o, "n", 0, &vo), 0);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(vo), SIZE, 3), 0);
    ck_assert_int_eq(gpubuf_release(vo), 0);
    gpubuf_disconnect(o);

    /* The old views go without releasing anything in the new daemon, even
     * where the id is the same. */
    ck_assert_uint_eq(gpubuf_buffer_id(vn), old_id);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(va), SIZE, 1), 0);
    ck_assert_int_eq(gpubuf_release(va), 0);
    ck_assert_int_eq(gpubuf_release_many(&vu, 1, NULL), 0);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    ck_assert(td_wait_refs(&d, "n", 1, 30000));
    gpubuf_status *s = td_status(&d);
    ck_assert_uint_eq(td_find_buffer(s, "n")->refs, 1);
    gpubuf_status_free(s);
    ck_assert_int_eq(gpubuf_release(vn), 0);
    ck_assert(td_wait_refs(&d, "n", 0, 30000));
    gpubuf_disconnect(c);
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* A client that held no reference loses nothing: its first request after a
 * fresh daemon started is sent there and succeeds. */
START_TEST(fresh_daemon_client_without_views) {
    test_daemon d;
    gpubuf_status *s = NULL;
    td_start(&d, k_pool);
    gpubuf_client *c = td_connect(&d);
    ck_assert_int_eq(gpubuf_status_get(c, &s), 0);
    gpubuf_status_free(s);
    td_restart(&d, k_pool);
    s = NULL;
    int r = gpubuf_status_get(c, &s);
    ck_assert_msg(r == 0, "status after the restart: %s (%s)", gpubuf_strerror(r),
                  gpubuf_last_error_message());
    ck_assert_str_eq(gpubuf_last_error_message(), "");
    gpubuf_status_free(s);
    gpubuf_disconnect(c);
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("reconnect");
    TCase *t = add_case(s, "reconnect", NULL, NULL, 90);
#ifdef GPUBUF_TEST_SYSTEMD
    add_tests(t, idle_client_with_saved_state, in_flight_requests, in_flight_pipelined_batch);
#else
    printf("test_reconnect: gpubufd is built without libsystemd (no fd store): the cases over "
           "the saved state in the fd store do not run\n");
#endif
    add_tests(t, idle_client_after_takeover, fresh_daemon_without_the_session,
              fresh_daemon_client_without_views);
    return s;
}

int main(void) {
    return run_suite(suite());
}
