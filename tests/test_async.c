/* Requests for event loops (issue 23): gpubuf_client_fd(), the _start calls,
 * gpubuf_dispatch() and gpubuf_cancel(), on one connection with thousands of
 * waiting opens, driven by poll, epoll and libuv. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "harness.h"
#include "check_main.h"

enum { N_WAIT = 10000, SIZE = 256 };

static void start_default(void) {
    static const char *const args[] = {"--pool", "host=host,capacity=256M,slab=4M", NULL};
    td_start(&D, args);
}

/* What the callbacks saw, by request index (user). */
typedef struct seen {
    int n_done;
    int *count;
    int *result;
    int bad_view; /* a view of the wrong name or contents */
    gpubuf_buffer **views;
} seen;

static seen S;

static void seen_init(int n) {
    S.n_done = 0;
    S.bad_view = 0;
    S.count = calloc((size_t)n, sizeof(int));
    S.result = calloc((size_t)n, sizeof(int));
    S.views = calloc((size_t)n, sizeof(*S.views));
    ck_assert(S.count && S.result && S.views);
}

static void seen_free(int n) {
    for (int i = 0; i < n; i++)
        gpubuf_release(S.views[i]);
    free(S.count);
    free(S.result);
    free(S.views);
}

static void on_done(gpubuf_client *c, const gpubuf_completion *d) {
    int i = (int)(intptr_t)d->user;
    char name[32];
    (void)c;
    S.count[i]++;
    S.result[i] = d->result;
    S.n_done++;
    if (d->result == 0) {
        snprintf(name, sizeof(name), "w.%d", i);
        if (!d->view || strcmp(gpubuf_buffer_name(d->view), name) != 0 ||
            td_mismatches(gpubuf_buffer_host_ptr(d->view), SIZE, (uint32_t)i) != 0)
            S.bad_view++;
        S.views[i] = d->view;
    } else if (d->view || !d->message || !*d->message) {
        S.bad_view++; /* an error has no view and says why */
    }
}

/* Start opens of w.0 .. w.n-1 (timeout_ms each). */
static void start_opens(gpubuf_client *c, int n, int timeout_ms, uint64_t *handles) {
    for (int i = 0; i < n; i++) {
        char name[32];
        snprintf(name, sizeof(name), "w.%d", i);
        gpubuf_lookup o = {.timeout_ms = timeout_ms};
        ck_assert_int_eq(
            gpubuf_open_start(c, name, 0, &o, on_done, (void *)(intptr_t)i, &handles[i]), 0);
    }
}

/* Allocate w.i for each i of order[0..n), filled with pattern i (views kept). */
static gpubuf_buffer **produce(gpubuf_client *p, const int *order, int n) {
    gpubuf_buffer **b = calloc((size_t)n, sizeof(*b));
    ck_assert(b);
    for (int k = 0; k < n; k++) {
        char name[32];
        snprintf(name, sizeof(name), "w.%d", order[k]);
        ck_assert_int_eq(gpubuf_alloc(p, "host", SIZE, name, &b[k]), 0);
        td_fill(gpubuf_buffer_host_ptr(b[k]), SIZE, (uint32_t)order[k]);
    }
    return b;
}

static void shuffle(int *a, int n, unsigned seed) {
    srand(seed);
    for (int i = 0; i < n; i++)
        a[i] = i;
    for (int i = n - 1; i > 0; i--) {
        int j = rand() % (i + 1), t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

/* poll() on the client fd until `want` completions came. */
static void poll_until(gpubuf_client *c, int want) {
    struct pollfd p = {.fd = gpubuf_client_fd(c), .events = POLLIN};
    ck_assert_int_ge(p.fd, 0);
    while (S.n_done < want) {
        int r = poll(&p, 1, 20000);
        ck_assert_msg(r == 1, "no completion for 20 s (%d of %d)", S.n_done, want);
        ck_assert_int_ge(gpubuf_dispatch(c), 0);
    }
}

/* A thread making synchronous calls on the same connection meanwhile. */
typedef struct sync_job {
    gpubuf_client *c;
    volatile int stop;
    int calls, errors;
} sync_job;

static void *sync_calls(void *arg) {
    sync_job *j = arg;
    while (!j->stop) {
        gpubuf_buffer_info info;
        if (gpubuf_stat(j->c, "w.0", &info) < 0 && gpubuf_last_error_message()[0] == '\0')
            j->errors++;
        j->calls++;
    }
    return NULL;
}

/* 10,000 waiting opens on one connection, sealed in random order while a
 * thread makes synchronous calls on the same connection: each completes
 * once, with the view of its name and contents; releasing them leaves no
 * reference in the daemon. */
START_TEST(ten_thousand_waits_sealed_in_random_order) {
    gpubuf_client *c = td_connect(&D), *p = td_connect(&D);
    uint64_t *h = calloc(N_WAIT, sizeof(*h));
    int *order = calloc(N_WAIT, sizeof(int));
    seen_init(N_WAIT);
    start_opens(c, N_WAIT, -1, h);
    ck_assert(td_wait_waiting_opens(&D, N_WAIT, 60000));
    sync_job job = {.c = c};
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, sync_calls, &job), 0);
    shuffle(order, N_WAIT, 23);
    gpubuf_buffer **b = produce(p, order, N_WAIT);
    for (int k = 0; k < N_WAIT; k++)
        ck_assert_int_eq(gpubuf_seal(b[k]), 0);
    ck_assert_int_eq(gpubuf_flush(p), 0);
    poll_until(c, N_WAIT);
    job.stop = 1;
    pthread_join(t, NULL);
    ck_assert_int_eq(gpubuf_dispatch(c), 0); /* nothing more */
    for (int i = 0; i < N_WAIT; i++) {
        ck_assert_int_eq(S.count[i], 1);
        ck_assert_int_eq(S.result[i], 0);
    }
    ck_assert_int_eq(S.bad_view, 0);
    ck_assert_int_eq(job.errors, 0);
    ck_assert_int_gt(job.calls, 0);
    ck_assert_int_eq(gpubuf_cancel(c, h[0]), -ENOENT); /* delivered already */
    seen_free(N_WAIT);
    for (int k = 0; k < N_WAIT; k++)
        gpubuf_release(b[k]);
    free(b);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    gpubuf_status *s = td_status(&D);
    for (size_t i = 0; i < s->n_buffers; i++)
        ck_assert_uint_eq(s->buffers[i].refs, 0);
    gpubuf_status_free(s);
    td_figure("async: %d waiting opens on one connection, %d synchronous stats meanwhile", N_WAIT,
              job.calls);
    free(h);
    free(order);
    gpubuf_disconnect(p);
    gpubuf_disconnect(c);
}
END_TEST

/* Timeouts, cancellations (of waiting opens, and of one already answered
 * but not dispatched) and seals among one connection's waits, on epoll:
 * each completes once with its own result, and nothing is left held or
 * waiting in the daemon. */
START_TEST(timeouts_and_cancels_release_everything) {
    enum { N = 600 };
    gpubuf_client *c = td_connect(&D), *p = td_connect(&D);
    uint64_t h[N];
    seen_init(N);
    /* 0..199 wait 100 ms; 200..399 are cancelled; 400..599 are sealed.
     * The 400 without a deadline go first and are waiting in the daemon
     * before the 200 with one are sent (on a loaded machine some of those
     * could time out before the last of 600 arrived). */
    for (int k = 0; k < N; k++) {
        int i = (k + 200) % N;
        char name[32];
        snprintf(name, sizeof(name), "w.%d", i);
        gpubuf_lookup o = {.timeout_ms = i < 200 ? 100 : -1};
        ck_assert_int_eq(gpubuf_open_start(c, name, 0, &o, on_done, (void *)(intptr_t)i, &h[i]),
                         0);
        if (k == N - 200 - 1)
            ck_assert(td_wait_waiting_opens(&D, N - 200, 30000));
    }
    for (int i = 200; i < 400; i++)
        ck_assert_int_eq(gpubuf_cancel(c, h[i]), 0);
    ck_assert_int_eq(gpubuf_cancel(c, h[200]), 0); /* twice: still one completion */
    int order[200];
    for (int k = 0; k < 200; k++)
        order[k] = 400 + k;
    gpubuf_buffer **b = produce(p, order, 200);
    for (int k = 0; k < 200; k++)
        ck_assert_int_eq(gpubuf_seal_sync(b[k]), 0);
    /* The daemon has answered 599 (seal_sync of another connection is
     * after the wake); cancel it before it is dispatched: its reference
     * goes back. */
    ck_assert(td_wait_waiting_opens(&D, 0, 30000));
    ck_assert_int_eq(gpubuf_cancel(c, h[599]), 0);
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN}, out;
    ck_assert_int_eq(epoll_ctl(ep, EPOLL_CTL_ADD, gpubuf_client_fd(c), &ev), 0);
    while (S.n_done < N) {
        ck_assert_int_eq(epoll_wait(ep, &out, 1, 20000), 1);
        ck_assert_int_ge(gpubuf_dispatch(c), 0);
    }
    close(ep);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(S.count[i], 1);
        int want = i < 200 ? -ETIMEDOUT : i < 400 || i == 599 ? -ECANCELED : 0;
        ck_assert_msg(S.result[i] == want, "request %d: %d, not %d", i, S.result[i], want);
    }
    ck_assert_int_eq(S.bad_view, 0);
    seen_free(N);
    for (int k = 0; k < 200; k++)
        gpubuf_release(b[k]);
    free(b);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    ck_assert(td_wait_refs(&D, "w.599", 0, 10000));
    gpubuf_status *s = td_status(&D);
    for (size_t i = 0; i < s->n_buffers; i++)
        ck_assert_uint_eq(s->buffers[i].refs, 0);
    gpubuf_status_free(s);
    ck_assert(td_wait_waiting_opens(&D, 0, 30000));
    gpubuf_disconnect(p);
    gpubuf_disconnect(c);
}
END_TEST

/* The daemon is SIGKILLed while 2,000 opens wait: every one completes once,
 * with an error; alloc, stat, seal and delete in flight complete too. */
START_TEST(daemon_killed_mid_wait_completes_everything_once) {
    enum { N = 2000 };
    static const char *const args[] = {"--pool", "host=host,capacity=64M,slab=4M", NULL};
    test_daemon d;
    td_start(&d, args);
    gpubuf_client *c = td_connect(&d);
    ck_assert_int_eq(gpubuf_set_reconnect(c, 0), 0);
    uint64_t h[N];
    seen_init(N);
    start_opens(c, N, -1, h);
    ck_assert(td_wait_waiting_opens(&d, N, 30000));
    kill(d.pid, SIGKILL);
    int st;
    waitpid(d.pid, &st, 0);
    poll_until(c, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(S.count[i], 1);
        ck_assert_int_lt(S.result[i], 0);
    }
    ck_assert_int_eq(S.bad_view, 0);
    /* Started on the broken connection: refused at once, nothing pending. */
    uint64_t x;
    ck_assert_int_eq(gpubuf_alloc_start(c, "host", 64, NULL, on_done, (void *)0, &x),
                     GPUBUF_EDISCONNECTED);
    ck_assert_int_eq(gpubuf_dispatch(c), 0);
    seen_free(N);
    gpubuf_disconnect(c);
    td_rmtree(d.dir);
}
END_TEST

/* libuv: uv_poll_t on the client fd; open (waiting), alloc, seal, stat and
 * delete started from the loop's callbacks. */
typedef struct uvjob {
    uv_poll_t poll;
    gpubuf_client *c;
    int errors, sealed, done;
    gpubuf_buffer *mine, *opened;
} uvjob;

static void uv_check_result(uvjob *j, const gpubuf_completion *d, const char *what) {
    if (d->result != 0) {
        j->errors++;
        fprintf(stderr, "%s: %s\n", what, d->message);
    }
}

static void uv_on_delete(gpubuf_client *c, const gpubuf_completion *d) {
    uvjob *j = d->user;
    (void)c;
    uv_check_result(j, d, "delete");
    j->done = 1;
}

static void uv_on_stat(gpubuf_client *c, const gpubuf_completion *d) {
    uvjob *j = d->user;
    uint64_t h;
    uv_check_result(j, d, "stat");
    if (d->info.state != GPUBUF_STATE_SEALED || d->info.size != SIZE)
        j->errors++;
    if (gpubuf_delete_start(c, "uv.1", 0, NULL, uv_on_delete, j, &h) < 0)
        j->errors++;
}

static void uv_maybe_stat(uvjob *j) {
    uint64_t h;
    if (j->sealed && j->opened && gpubuf_stat_start(j->c, "uv.1", 0, NULL, uv_on_stat, j, &h) < 0)
        j->errors++;
}

static void uv_on_open(gpubuf_client *c, const gpubuf_completion *d) {
    uvjob *j = d->user;
    (void)c;
    uv_check_result(j, d, "open");
    j->opened = d->view;
    uv_maybe_stat(j);
}

static void uv_on_seal(gpubuf_client *c, const gpubuf_completion *d) {
    uvjob *j = d->user;
    (void)c;
    uv_check_result(j, d, "seal");
    j->sealed = 1;
    uv_maybe_stat(j);
}

static void uv_on_alloc(gpubuf_client *c, const gpubuf_completion *d) {
    uvjob *j = d->user;
    uint64_t h;
    uv_check_result(j, d, "alloc");
    j->mine = d->view;
    if (!j->mine)
        return;
    td_fill(gpubuf_buffer_host_ptr(j->mine), SIZE, 7);
    if (gpubuf_seal_start(j->mine, uv_on_seal, j, &h) < 0)
        j->errors++;
}

static void on_uv_readable(uv_poll_t *p, int status, int events) {
    uvjob *j = p->data;
    (void)events;
    if (status < 0 || gpubuf_dispatch(j->c) < 0)
        j->errors++;
    if (j->done || j->errors)
        uv_close((uv_handle_t *)p, NULL);
}

START_TEST(libuv_drives_every_request_kind) {
    uv_loop_t loop;
    uvjob j = {0};
    uint64_t h;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    j.c = td_connect(&D);
    gpubuf_lookup o = {.timeout_ms = 20000};
    ck_assert_int_eq(gpubuf_open_start(j.c, "uv.1", 0, &o, uv_on_open, &j, &h), 0);
    ck_assert_int_eq(gpubuf_alloc_start(j.c, "host", SIZE, "uv.1", uv_on_alloc, &j, &h), 0);
    ck_assert_int_eq(uv_poll_init(&loop, &j.poll, gpubuf_client_fd(j.c)), 0);
    j.poll.data = &j;
    ck_assert_int_eq(uv_poll_start(&j.poll, UV_READABLE, on_uv_readable), 0);
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(j.errors, 0);
    ck_assert_int_eq(j.done, 1);
    ck_assert_ptr_nonnull(j.opened);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(j.opened), SIZE, 7), 0);
    gpubuf_release(j.opened);
    gpubuf_release(j.mine);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    gpubuf_disconnect(j.c);
}
END_TEST

/* own_batch_alloc_wakes_own_wait's completion. */
static gpubuf_buffer *g_own_view;
static int g_own_result = 1;

static void on_own(gpubuf_client *c, const gpubuf_completion *d) {
    (void)c;
    g_own_result = d->result;
    g_own_view = d->view;
    ck_assert_msg(d->result == 0, "the waiting open: %s", d->message);
}

/* A waiting open woken by the seal of the same connection's batch alloc, in
 * a slab the client has not mapped: its reply comes before the batch's,
 * which describes the slab, so it carries the slab itself (it once came
 * without, and the open failed: "gpubufd sent a host slab without its file
 * descriptor"). Both views are the same memory. */
START_TEST(own_batch_alloc_wakes_own_wait) {
    gpubuf_client *c = td_connect(&D);
    const char *pn[2] = {"own.1", "own.2"};
    uint64_t sizes[2] = {SIZE, SIZE}, h;
    gpubuf_buffer *v[2] = {0};
    int st[2];
    gpubuf_lookup o = {.timeout_ms = 20000};
    g_own_view = NULL;
    g_own_result = 1;
    ck_assert_int_eq(gpubuf_open_start(c, "own.2", 0, &o, on_own, NULL, &h), 0);
    ck_assert_int_eq(gpubuf_alloc_many(c, "host", 2, sizes, pn, GPUBUF_ALLOC_SEAL, v, st), 0);
    struct pollfd p = {.fd = gpubuf_client_fd(c), .events = POLLIN};
    while (g_own_result == 1) {
        ck_assert_msg(poll(&p, 1, 20000) == 1, "no completion for 20 s");
        ck_assert_int_ge(gpubuf_dispatch(c), 0);
    }
    ck_assert_ptr_nonnull(g_own_view);
    ck_assert_ptr_eq(gpubuf_buffer_host_ptr(g_own_view), gpubuf_buffer_host_ptr(v[1]));
    memset(gpubuf_buffer_host_ptr(v[1]), 0x5a, SIZE);
    ck_assert_uint_eq(((const uint8_t *)gpubuf_buffer_host_ptr(g_own_view))[SIZE - 1], 0x5a);
    gpubuf_release(g_own_view);
    gpubuf_release(v[0]);
    gpubuf_release(v[1]);
    gpubuf_disconnect(c);
}
END_TEST

/* Arguments are checked; an older daemon's limit of waits is a clear
 * EAGAIN; disconnecting delivers what is pending once. */
START_TEST(arguments_limits_and_disconnect) {
    gpubuf_client *c = td_connect(&D);
    uint64_t h;
    ck_assert_int_eq(gpubuf_open_start(NULL, "x", 0, NULL, on_done, NULL, &h), -EINVAL);
    ck_assert_str_eq(gpubuf_last_error_message(),
                     "gpubuf_open_start needs a connection and a place for the handle");
    ck_assert_int_eq(gpubuf_open_start(c, "x", 0, NULL, NULL, NULL, &h), -EINVAL);
    ck_assert_int_eq(gpubuf_alloc_start(c, "host", 0, NULL, on_done, NULL, &h), -EINVAL);
    ck_assert_int_eq(gpubuf_open_start(c, "bad name!", 0, NULL, on_done, NULL, &h), -EINVAL);
    ck_assert_int_eq(gpubuf_cancel(c, 12345), -ENOENT);
    ck_assert_int_eq(gpubuf_dispatch(NULL), -EINVAL);
    ck_assert_int_eq(gpubuf_client_fd(NULL), -EINVAL);
    seen_init(3);
    gpubuf_lookup o = {.timeout_ms = -1};
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(gpubuf_open_start(c, "never", 0, &o, on_done, (void *)(intptr_t)i, &h),
                         0);
    gpubuf_disconnect(c); /* delivers the three */
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(S.count[i], 1);
        ck_assert_int_eq(S.result[i], GPUBUF_EDISCONNECTED);
    }
    seen_free(3);
}
END_TEST

int main(void) {
    Suite *s = suite_create("async");
    TCase *t = add_case(s, "host", start_default, td_stop_clean, 0);
    add_tests(t, ten_thousand_waits_sealed_in_random_order, timeouts_and_cancels_release_everything,
              libuv_drives_every_request_kind, own_batch_alloc_wakes_own_wait,
              arguments_limits_and_disconnect);
    TCase *k = add_case(s, "kill", NULL, NULL, 0);
    add_tests(k, daemon_killed_mid_wait_completes_everything_once);
    return run_suite(s);
}
