/* Requests for event loops, the second round (issue 23): the batch open
 * (gpubuf_open_many_start), woken opens past the connection's fd budget,
 * the daemon's answer to a cancel of an open that is not waiting, and
 * cancels racing seals. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "check_main.h"
#include "rawproto.h"

enum { SIZE = 256 };

static void start_default(void) {
    /* slab=4K: a buffer of 8 KiB fills a slab of its own (each needs an fd);
     * the daemon reserves 2 fds per slab the capacity allows (about 4,700). */
    static const char *const args[] = {"--pool", "host=host,capacity=9M,slab=4K", NULL};
    td_start(&D, args);
}

/* Completions seen, by user index. */
typedef struct seen {
    int n_done, bad;
    int count[4096];
    int result[4096];
    gpubuf_buffer *views[4096];
} seen;

static seen S;

static void on_done(gpubuf_client *c, const gpubuf_completion *d) {
    int i = (int)(intptr_t)d->user;
    (void)c;
    S.count[i]++;
    S.result[i] = d->result;
    S.n_done++;
    S.views[i] = d->view;
    if ((d->result == 0) != (d->view != NULL) || (d->result < 0 && !*d->message))
        S.bad++;
}

static void dispatch_until(gpubuf_client *c, int want) {
    struct pollfd p = {.fd = gpubuf_client_fd(c), .events = POLLIN};
    ck_assert_int_ge(p.fd, 0);
    while (S.n_done < want) {
        ck_assert_msg(poll(&p, 1, 20000) == 1, "no completion for 20 s (%d of %d)", S.n_done,
                      want);
        ck_assert_int_ge(gpubuf_dispatch(c), 0);
    }
}

static void assert_no_refs(gpubuf_client *c) {
    ck_assert_int_eq(gpubuf_flush(c), 0);
    gpubuf_status *s = td_status(&D);
    for (size_t i = 0; i < s->n_buffers; i++)
        ck_assert_msg(s->buffers[i].refs == 0, "%s holds %u references", s->buffers[i].name,
                      s->buffers[i].refs);
    gpubuf_status_free(s);
    ck_assert(td_wait_waiting_opens(&D, 0, 10000));
}

/* The end of a test of c and p: no reference stays, both disconnect. */
static void no_refs_disconnect(gpubuf_client *c, gpubuf_client *p) {
    assert_no_refs(c);
    gpubuf_disconnect(p);
    gpubuf_disconnect(c);
}

/* The name PREFIX.i, in name. */
static const char *item_name(char name[32], const char *prefix, int i) {
    snprintf(name, 32, "%s.%d", prefix, i);
    return name;
}

/* Start an open of PREFIX.i on c that waits without a timeout and
 * completes into S at index i; its handle in *h. */
static void start_waiting_open(gpubuf_client *c, const char *prefix, int i, uint64_t *h) {
    char name[32];
    gpubuf_lookup o = {.timeout_ms = -1};
    ck_assert_int_eq(
        gpubuf_open_start(c, item_name(name, prefix, i), 0, &o, on_done, (void *)(intptr_t)i, h),
        0);
}

static void memset_release(gpubuf_buffer **b, int n) {
    for (int i = 0; i < n; i++) {
        gpubuf_release(b[i]);
        b[i] = NULL;
    }
}

/* ---- gpubuf_open_many_start ------------------------------------------------ */

/* The batch's completion, copied out (the arrays live for the callback). */
typedef struct many_seen {
    int calls, result, n;
    char message[512];
    gpubuf_buffer *views[2048];
    int status[2048];
} many_seen;

static void on_many(gpubuf_client *c, const gpubuf_completion *d) {
    many_seen *m = d->user;
    (void)c;
    m->calls++;
    m->result = d->result;
    m->n = (int)d->n;
    snprintf(m->message, sizeof(m->message), "%s", d->message);
    for (size_t i = 0; i < d->n; i++) {
        m->views[i] = d->views[i];
        m->status[i] = d->statuses[i];
    }
}

/* Dispatch (the batch's replies start its waits) until n opens wait in the
 * daemon. */
static void dispatch_until_waiting(gpubuf_client *c, long n) {
    struct pollfd p = {.fd = gpubuf_client_fd(c), .events = POLLIN};
    for (int i = 0; i < 2000; i++) {
        if (poll(&p, 1, 10) == 1)
            ck_assert_int_ge(gpubuf_dispatch(c), 0);
        if (td_wait_waiting_opens(&D, n, 0))
            return;
    }
    ck_abort_msg("%ld opens never waited", n);
}

static void dispatch_many(gpubuf_client *c, many_seen *m) {
    struct pollfd p = {.fd = gpubuf_client_fd(c), .events = POLLIN};
    while (m->calls == 0) {
        ck_assert_msg(poll(&p, 1, 20000) == 1, "no batch completion for 20 s");
        ck_assert_int_ge(gpubuf_dispatch(c), 0);
    }
}

/* Allocate and fill name (pattern tag); sealed when seal. */
static gpubuf_buffer *make(gpubuf_client *p, const char *name, uint64_t size, uint32_t tag,
                           bool seal) {
    gpubuf_buffer *b;
    ck_assert_int_eq(gpubuf_alloc(p, "host", size, name, &b), 0);
    td_fill(gpubuf_buffer_host_ptr(b), size, tag);
    if (seal)
        ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    return b;
}

/* 700 names, each in a slab of its own (more slabs than one batch reply
 * carries fds for: the library asks again), half sealed before the start
 * and half after, one name invalid: one completion, every view right. */
START_TEST(open_many_start_waits_for_the_unsealed) {
    enum { N = 700 };
    gpubuf_client *c = td_connect(&D), *p = td_connect(&D);
    static gpubuf_buffer *made[N];
    static char names[N][32];
    static const char *np[N + 1];
    static many_seen m;
    memset(&m, 0, sizeof(m));
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "m.%d", i);
        np[i] = names[i];
    }
    np[N] = "bad name with spaces";
    for (int i = 0; i < N / 2; i++)
        made[i] = make(p, names[i], 8192, (uint32_t)i, true);
    gpubuf_lookup o = {.timeout_ms = -1};
    uint64_t h;
    ck_assert_int_eq(gpubuf_open_many_start(c, N + 1, np, NULL, &o, on_many, &m, &h), 0);
    dispatch_until_waiting(c, N - N / 2);
    ck_assert_int_eq(m.calls, 0);
    for (int i = N / 2; i < N; i++)
        made[i] = make(p, names[i], 8192, (uint32_t)i, true);
    dispatch_many(c, &m);
    ck_assert_int_eq(gpubuf_dispatch(c), 0);
    ck_assert_int_eq(m.calls, 1);
    ck_assert_int_eq(m.n, N + 1);
    ck_assert_int_eq(m.result, 1); /* the bad name */
    ck_assert_int_eq(m.status[N], -EINVAL);
    ck_assert_ptr_null(m.views[N]);
    ck_assert_msg(strstr(m.message, "item 700") != NULL, "%s", m.message);
    for (int i = 0; i < N; i++) {
        ck_assert_msg(m.status[i] == 0, "item %d: %d", i, m.status[i]);
        ck_assert_str_eq(gpubuf_buffer_name(m.views[i]), names[i]);
        ck_assert_int_eq(td_mismatches(gpubuf_buffer_host_ptr(m.views[i]), 8192, (uint32_t)i), 0);
    }
    ck_assert_int_eq(gpubuf_release_many(m.views, N, NULL), 0);
    memset_release(made, N);
    no_refs_disconnect(c, p);
}
END_TEST

/* By id without waiting: an unknown id fails alone (result 1); with a
 * deadline, an item never sealed fails with ETIMEDOUT; a cancelled batch
 * completes with ECANCELED, its views and waits given back. */
START_TEST(open_many_start_ids_timeouts_and_cancel) {
    gpubuf_client *c = td_connect(&D), *p = td_connect(&D);
    gpubuf_buffer *a = make(p, "a", SIZE, 1, true), *b = make(p, "b", SIZE, 2, true);
    uint64_t ids[3] = {gpubuf_buffer_id(a), 999999, gpubuf_buffer_id(b)}, h;
    static many_seen m;
    memset(&m, 0, sizeof(m));
    ck_assert_int_eq(gpubuf_open_many_start(c, 3, NULL, ids, NULL, on_many, &m, &h), 0);
    dispatch_many(c, &m);
    ck_assert_int_eq(m.result, 1);
    ck_assert_int_eq(m.status[0], 0);
    ck_assert_int_lt(m.status[1], 0);
    ck_assert_int_eq(m.status[2], 0);
    ck_assert_int_eq(td_mismatches(gpubuf_buffer_host_ptr(m.views[2]), SIZE, 2), 0);
    gpubuf_release(m.views[0]);
    gpubuf_release(m.views[2]);

    /* A deadline: "never" times out, "a" opens. */
    static const char *const two[] = {"a", "never"};
    memset(&m, 0, sizeof(m));
    gpubuf_lookup o = {.timeout_ms = 200, .flags = GPUBUF_OPEN_READONLY};
    ck_assert_int_eq(gpubuf_open_many_start(c, 2, two, NULL, &o, on_many, &m, &h), 0);
    dispatch_many(c, &m);
    ck_assert_int_eq(m.result, 1);
    ck_assert_int_eq(m.status[0], 0);
    ck_assert_int_eq(gpubuf_buffer_read_only(m.views[0]), 1);
    ck_assert_int_eq(m.status[1], -ETIMEDOUT);
    gpubuf_release(m.views[0]);

    /* Cancelled while "never" waits: one completion, ECANCELED, nothing held. */
    memset(&m, 0, sizeof(m));
    o.timeout_ms = -1;
    ck_assert_int_eq(gpubuf_open_many_start(c, 2, two, NULL, &o, on_many, &m, &h), 0);
    dispatch_until_waiting(c, 1);
    ck_assert_int_eq(gpubuf_cancel(c, h), 0);
    dispatch_many(c, &m);
    ck_assert_int_eq(m.calls, 1);
    ck_assert_int_eq(m.result, -ECANCELED);
    ck_assert_ptr_null(m.views[0]);
    ck_assert_int_eq(m.status[0], -ECANCELED);
    ck_assert_int_eq(gpubuf_cancel(c, h), -ENOENT);

    /* No items: a completion all the same; bad arguments: refused. */
    memset(&m, 0, sizeof(m));
    ck_assert_int_eq(gpubuf_open_many_start(c, 0, NULL, NULL, NULL, on_many, &m, &h), 0);
    dispatch_many(c, &m);
    ck_assert_int_eq(m.result, 0);
    gpubuf_lookup bad = {.pool = "host"};
    ck_assert_int_eq(gpubuf_open_many_start(c, 2, two, NULL, &bad, on_many, &m, &h), -EINVAL);
    ck_assert_int_eq(gpubuf_open_many_start(c, 2, two, NULL, NULL, NULL, &m, &h), -EINVAL);
    gpubuf_release(a);
    gpubuf_release(b);
    no_refs_disconnect(c, p);
}
END_TEST

/* ---- the fd budget of woken opens ------------------------------------------ */

/* 1,000 opens wait on a connection that reads nothing while their buffers,
 * each in a slab of its own, are sealed: the answers that would hold more
 * fds than the daemon keeps for the connection fail with EAGAIN (saying
 * what to do), their reference given back; each completes once; opened
 * again, they succeed. */
START_TEST(woken_opens_past_the_fd_budget_fail_with_eagain) {
    enum { N = 1000 };
    gpubuf_client *c = td_connect(&D), *p = td_connect(&D);
    static gpubuf_buffer *made[N];
    uint64_t h;
    memset(&S, 0, sizeof(S));
    for (int i = 0; i < N; i++)
        start_waiting_open(c, "f", i, &h);
    ck_assert(td_wait_waiting_opens(&D, N, 30000));
    for (int i = 0; i < N; i++) {
        char name[32];
        made[i] = make(p, item_name(name, "f", i), 8192, (uint32_t)i, false);
        ck_assert_int_eq(gpubuf_seal(made[i]), 0);
    }
    ck_assert_int_eq(gpubuf_flush(p), 0); /* every open was woken */
    dispatch_until(c, N);
    int eagain = 0;
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(S.count[i], 1);
        ck_assert_msg(S.result[i] == 0 || S.result[i] == -EAGAIN, "open %d: %d", i, S.result[i]);
        if (S.result[i] == 0) {
            ck_assert_int_eq(td_mismatches(gpubuf_buffer_host_ptr(S.views[i]), 8192, (uint32_t)i),
                             0);
            continue;
        }
        eagain++;
        char name[32];
        /* As the message says. */
        ck_assert_int_eq(gpubuf_open(c, item_name(name, "f", i), 0, &S.views[i]), 0);
    }
    ck_assert_int_eq(S.bad, 0);
    /* The socket buffer takes a few hundred answers (net.core.wmem_default
     * 212992 bytes here); past it and the 64 + 64 fds the daemon keeps,
     * answers fail. */
    ck_assert_msg(eagain > 0, "all %d answers fitted: is net.core.wmem_default above 1 MiB?", N);
    td_figure("async: %d of %d woken opens past the fd budget answered EAGAIN", eagain, N);
    memset_release(S.views, N);
    memset_release(made, N);
    no_refs_disconnect(c, p);
}
END_TEST

/* ---- cancels ------------------------------------------------------------------ */

/* The daemon answers a cancel of an id that is not waiting (never sent,
 * answered already) with success, and the connection goes on. */
START_TEST(daemon_answers_a_cancel_of_nothing_with_success) {
    int fd = td_raw_connect(&D, 10);
    td_raw_hello(fd);
    Gpubuf__CancelRequest q = GPUBUF__CANCEL_REQUEST__INIT;
    q.request_id = 77777;
    Gpubuf__Request req = rp_request(2, GPUBUF__REQUEST__BODY_CANCEL, &q);
    td_raw_status(fd, &req, 0);
    /* An open answered at once (timeout 0, not there), then cancelled. */
    Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
    o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
    o.name = "absent";
    req = rp_request(3, GPUBUF__REQUEST__BODY_OPEN, &o);
    td_raw_status(fd, &req, -ENOENT);
    q.request_id = 3;
    req = rp_request(4, GPUBUF__REQUEST__BODY_CANCEL, &q);
    td_raw_status(fd, &req, 0);
    close(fd);
}
END_TEST

/* A cancel sent as the seal lands: whichever the daemon sees first (the
 * wake or the cancel), the open completes exactly once, with ECANCELED, and
 * no reference stays. */
START_TEST(cancel_racing_a_seal_completes_once) {
    enum { N = 400 };
    gpubuf_client *c = td_connect(&D), *p = td_connect(&D);
    static gpubuf_buffer *made[N];
    uint64_t h[N];
    memset(&S, 0, sizeof(S));
    for (int i = 0; i < N; i++) {
        char name[32];
        start_waiting_open(c, "r", i, &h[i]);
        made[i] = make(p, item_name(name, "r", i), SIZE, (uint32_t)i, false);
    }
    ck_assert(td_wait_waiting_opens(&D, N, 30000));
    for (int i = 0; i < N; i++) {
        /* Even: the seal goes first; odd: the cancel goes first. */
        if (i % 2 == 0)
            ck_assert_int_eq(gpubuf_seal(made[i]), 0);
        ck_assert_int_eq(gpubuf_cancel(c, h[i]), 0);
        if (i % 2 == 1)
            ck_assert_int_eq(gpubuf_seal(made[i]), 0);
        if (i % 7 == 0)
            ck_assert_int_ge(gpubuf_dispatch(c), 0); /* some read meanwhile */
    }
    ck_assert_int_eq(gpubuf_flush(p), 0);
    dispatch_until(c, N);
    ck_assert_int_eq(gpubuf_dispatch(c), 0);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(S.count[i], 1);
        ck_assert_int_eq(S.result[i], -ECANCELED);
    }
    ck_assert_int_eq(S.bad, 0);
    memset_release(made, N);
    no_refs_disconnect(c, p);
}
END_TEST

int main(void) {
    Suite *s = suite_create("async_more");
    TCase *t = add_case(s, "host", start_default, td_stop_clean, 0);
    add_tests(t, open_many_start_waits_for_the_unsealed, open_many_start_ids_timeouts_and_cancel,
              woken_opens_past_the_fd_budget_fail_with_eagain,
              daemon_answers_a_cancel_of_nothing_with_success, cancel_racing_a_seal_completes_once);
    return run_suite(s);
}
