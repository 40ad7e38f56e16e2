/* Restart survival under load: 16 client processes stream batches (alloc +
 * seal, open, delete, release, release) at gpubufd on a host pool while it
 * is SIGKILLed, twice, under a service manager that keeps its fds
 * (tests/fdstore.c). After each restart, for every round of every client:
 * each batch the client saw answered is there, and the batch in flight is
 * there whole or not at all (the K buffers of a round always agree). The
 * daemon holds FILL more buffers throughout, so that the journal's
 * snapshots take many turns of the loop (state_write.c) and the SIGKILL
 * can fall in one; they all come back. Half the clients name their
 * buffers, half do not (their batches are the journal's runs of buffers,
 * opened and deleted by id): a batch of anonymous buffers whose alloc was
 * in flight is found by what is left over, K buffers of consecutive ids
 * or none. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "fdstore.h"
#include "harness.h"

#define PROCS 16
#define K 64          /* buffers per batch */
#define MAX_ROUNDS 4096
#define SIZE 4096u
#define FILL 40000 /* buffers kept throughout */
#define FILL_BATCH 1000

/* What a client logs after each answer: round r reached step (1..5). */
typedef struct logrec {
    uint32_t round, step;
    uint64_t ids[K]; /* the round's buffers (step 1 on) */
} logrec;

enum { ALLOCATED = 1, OPENED, DELETED, RELEASED_OPEN, RELEASED_ALL };

static void name_of(char *buf, size_t n, int cycle, int proc, uint32_t round, int k) {
    snprintf(buf, n, "c%dp%dr%uk%d", cycle, proc, round, k);
}

static void log_step(int fd, logrec *l, uint32_t step) {
    l->step = step;
    if (write(fd, l, sizeof(*l)) != (ssize_t)sizeof(*l))
        _exit(3);
}

/* Odd clients allocate anonymous buffers and open and delete them by id. */
static bool anonymous(int proc) {
    return proc % 2 == 1;
}

/* One client process: rounds of five batches on two connections (a
 * producer and an opener) until the daemon goes; each step logged once
 * answered. Exits 0 when the daemon went, else what failed. */
static void client(const test_daemon *d, int cycle, int proc, int logfd, int ready_fd) {
    gpubuf_client *p = td_connect(d), *o = td_connect(d);
    char names[K][48];
    const char *pn[K];
    uint64_t sizes[K];
    gpubuf_buffer *mine[K], *opened[K];
    int st[K];
    logrec l;
    if (!p || !o || gpubuf_set_reconnect(p, 0) < 0 || gpubuf_set_reconnect(o, 0) < 0)
        _exit(4);
    if (write(ready_fd, "r", 1) != 1)
        _exit(4);
    close(ready_fd);
    for (int k = 0; k < K; k++) {
        pn[k] = names[k];
        sizes[k] = SIZE;
    }
    for (uint32_t r = 0; r < MAX_ROUNDS; r++) {
        memset(&l, 0, sizeof(l));
        l.round = r;
        for (int k = 0; k < K; k++)
            name_of(names[k], sizeof(names[k]), cycle, proc, r, k);
        bool anon = anonymous(proc);
        int e =
            gpubuf_alloc_many(p, "host", K, sizes, anon ? NULL : pn, GPUBUF_ALLOC_SEAL, mine, st);
        if (e != 0)
            _exit(e == GPUBUF_EDISCONNECTED ? 0 : 5);
        for (int k = 0; k < K; k++)
            l.ids[k] = gpubuf_buffer_id(mine[k]);
        log_step(logfd, &l, ALLOCATED);
        if ((e = gpubuf_open_many(o, K, anon ? NULL : pn, l.ids, 0, opened, st)) != 0)
            _exit(e == GPUBUF_EDISCONNECTED ? 0 : 6);
        log_step(logfd, &l, OPENED);
        if ((e = gpubuf_delete_many(p, K, anon ? NULL : pn, l.ids, st)) != 0)
            _exit(e == GPUBUF_EDISCONNECTED ? 0 : 7);
        log_step(logfd, &l, DELETED);
        if ((e = gpubuf_release_many(opened, K, st)) != 0)
            _exit(e == GPUBUF_EDISCONNECTED ? 0 : 8);
        log_step(logfd, &l, RELEASED_OPEN);
        if ((e = gpubuf_release_many(mine, K, st)) != 0)
            _exit(e == GPUBUF_EDISCONNECTED ? 0 : 9);
        log_step(logfd, &l, RELEASED_ALL);
    }
    _exit(0); /* never killed: the parent checks the rounds anyway */
}

/* A buffer as the status shows it, found by id. */
static const gpubuf_status_buffer *by_id(const gpubuf_status *s, uint64_t id) {
    for (size_t i = 0; i < s->n_buffers; i++)
        if (s->buffers[i].id == id)
            return &s->buffers[i];
    return NULL;
}

/* How many steps of a round a buffer shows applied (0 and 5: none left). */
static int applied(const gpubuf_status_buffer *b) {
    if (!b)
        return -1; /* absent: 0 or 5 */
    if (b->state == GPUBUF_STATE_SEALED)
        return b->refs == 1 ? ALLOCATED : b->refs == 2 ? OPENED : 100 + (int)b->refs;
    if (b->state == GPUBUF_STATE_DELETED)
        return b->refs == 2 ? DELETED : b->refs == 1 ? RELEASED_OPEN : 200 + (int)b->refs;
    return 300 + (int)b->state;
}

/* The anonymous buffers of a cycle's status: those not yet matched to a
 * client's log (id 0 once matched). */
typedef struct leftover {
    uint64_t *ids;
    size_t n;
} leftover;

static void leftover_take(leftover *lo, uint64_t id) {
    for (size_t i = 0; i < lo->n; i++)
        if (lo->ids[i] == id)
            lo->ids[i] = 0;
}

/* Check one client's rounds against its log; the number of rounds it
 * logged. An anonymous client's round whose alloc was in flight is left
 * to check_leftover (*unanswered counts them); the buffers of its other
 * rounds are taken from lo. */
static uint32_t check_client(const gpubuf_status *s, int cycle, int proc, const char *logpath,
                             int *mid_batch, leftover *lo, int *unanswered) {
    int fd = open(logpath, O_RDONLY);
    ck_assert_int_ge(fd, 0);
    struct stat sb;
    ck_assert_int_eq(fstat(fd, &sb), 0);
    size_t n = (size_t)sb.st_size / sizeof(logrec);
    logrec *l = calloc(n + 1, sizeof(*l));
    ck_assert_ptr_nonnull(l);
    ck_assert_int_eq(read(fd, l, n * sizeof(*l)), (ssize_t)(n * sizeof(*l)));
    close(fd);
    uint32_t last_round = n ? l[n - 1].round : 0, last_step = n ? l[n - 1].step : 0;
    /* Rounds before the last one logged went through: nothing of them is left. */
    for (size_t i = 0; i < n; i++)
        if (l[i].round < last_round)
            for (int k = 0; k < K; k++)
                ck_assert_msg(!by_id(s, l[i].ids[k]),
                              "cycle %d client %d round %u: buffer %llu is back after it was "
                              "released",
                              cycle, proc, l[i].round, (unsigned long long)l[i].ids[k]);
    /* The round in flight: the steps answered, perhaps the one after it
     * (the daemon died after saving it, before the client read the reply),
     * and the same for every buffer of the batch. */
    uint32_t round = last_step == RELEASED_ALL ? last_round + 1 : last_round;
    int answered = last_step == RELEASED_ALL ? 0 : (int)last_step;
    int seen = -2;
    if (anonymous(proc) && answered == 0) {
        (*unanswered)++;
        free(l);
        return n ? last_round : 0;
    }
    if (anonymous(proc))
        for (int k = 0; k < K; k++)
            leftover_take(lo, l[n - 1].ids[k]);
    for (int k = 0; k < K; k++) {
        const gpubuf_status_buffer *b;
        if (answered >= ALLOCATED) {
            b = by_id(s, l[n - 1].ids[k]);
        } else {
            char name[48];
            name_of(name, sizeof(name), cycle, proc, round, k);
            b = td_find_buffer(s, name);
        }
        int a = applied(b);
        if (k == 0)
            seen = a;
        ck_assert_msg(a == seen,
                      "cycle %d client %d round %u: the batch after step %d is half applied: "
                      "buffer %d shows %d, buffer 0 shows %d",
                      cycle, proc, round, answered, k, a, seen);
    }
    /* Absent is right before the alloc (0) and after the last release (5). */
    bool ok = seen == answered || seen == answered + 1 ||
              (seen == -1 && (answered == 0 || answered >= RELEASED_OPEN));
    ck_assert_msg(ok, "cycle %d client %d round %u: step %d was answered, the saved state shows %d",
                  cycle, proc, round, answered, seen);
    if (seen != answered && !(seen == -1 && answered == 0))
        (*mid_batch)++;
    free(l);
    return n ? last_round : 0;
}

/* FILL named, sealed buffers nobody references. */
static void fill(const test_daemon *d) {
    gpubuf_client *c = td_connect(d);
    static char names[FILL_BATCH][32];
    const char *pn[FILL_BATCH];
    uint64_t sizes[FILL_BATCH];
    gpubuf_buffer *b[FILL_BATCH];
    for (int i = 0; i < FILL; i += FILL_BATCH) {
        for (int k = 0; k < FILL_BATCH; k++) {
            snprintf(names[k], sizeof(names[k]), "fill/%d", i + k);
            pn[k] = names[k];
            sizes[k] = 256;
        }
        ck_assert_int_eq(gpubuf_alloc_many(c, "host", FILL_BATCH, sizes, pn, GPUBUF_ALLOC_SEAL, b,
                                           NULL),
                         0);
        ck_assert_int_eq(gpubuf_release_many(b, FILL_BATCH, NULL), 0);
    }
    gpubuf_disconnect(c);
}

static int cmp_id(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The anonymous buffers no client's log names are the batches whose alloc
 * was in flight and saved: K buffers of consecutive ids each (one request
 * allocates them in turn), each sealed with its owner's one reference, at
 * most one batch a client that had one in flight. The number of such
 * batches. */
static int check_leftover(const gpubuf_status *s, int cycle, leftover *lo, int unanswered) {
    size_t m = 0;
    for (size_t i = 0; i < lo->n; i++)
        if (lo->ids[i])
            lo->ids[m++] = lo->ids[i];
    qsort(lo->ids, m, sizeof(*lo->ids), cmp_id);
    ck_assert_msg(m % K == 0,
                  "cycle %d: %zu anonymous buffers no client saw answered: not whole batches of %d",
                  cycle, m, K);
    for (size_t i = 0; i < m; i++) {
        const gpubuf_status_buffer *b = by_id(s, lo->ids[i]);
        ck_assert_msg(i % K == 0 || lo->ids[i] == lo->ids[i - 1] + 1,
                      "cycle %d: buffer %llu of a batch in flight is not next to its batch", cycle,
                      (unsigned long long)lo->ids[i]);
        ck_assert_msg(applied(b) == ALLOCATED,
                      "cycle %d: buffer %llu of a batch in flight shows %d, not its alloc", cycle,
                      (unsigned long long)lo->ids[i], applied(b));
    }
    ck_assert_int_le(m / K, unanswered);
    return (int)(m / K);
}

static void check_fill(const gpubuf_status *s) {
    size_t n = 0;
    for (size_t i = 0; i < s->n_buffers; i++)
        if (strncmp(s->buffers[i].name, "fill/", 5) == 0 &&
            s->buffers[i].state == GPUBUF_STATE_SEALED && s->buffers[i].refs == 0)
            n++;
    ck_assert_uint_eq(n, FILL);
}

/* One cycle: 16 clients stream batches; once every one logged some rounds,
 * SIGKILL, restart, check. */
static void cycle_once(fake_sd *m, const char *const *args, int cycle, uint64_t *min_id) {
    char logs[PROCS][300];
    int logfd[PROCS], ready[2];
    pid_t pids[PROCS];
    ck_assert_int_eq(pipe(ready), 0);
    for (int i = 0; i < PROCS; i++) {
        snprintf(logs[i], sizeof(logs[i]), "%s/log-%d-%d", m->d.dir, cycle, i);
        logfd[i] = open(logs[i], O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
        ck_assert_int_ge(logfd[i], 0);
        pids[i] = fork();
        ck_assert_int_ge(pids[i], 0);
        if (pids[i] == 0) {
            close(ready[0]);
            client(&m->d, cycle, i, logfd[i], ready[1]);
        }
        close(logfd[i]);
    }
    close(ready[1]);
    char ch;
    for (int i = 0; i < PROCS; i++)
        ck_assert_int_eq(read(ready[0], &ch, 1), 1);
    close(ready[0]);
    /* Every client has answered rounds behind it: the daemon is busy. */
    for (int i = 0; i < PROCS; i++) {
        struct stat sb;
        while (stat(logs[i], &sb) == 0 && sb.st_size < (off_t)(3 * 5 * sizeof(logrec)))
            td_sleep_ms(5);
    }
    ck_assert_int_eq(fsd_kill(m, SIGKILL), 128 + SIGKILL);
    for (int i = 0; i < PROCS; i++) {
        int ws;
        ck_assert_int_eq(waitpid(pids[i], &ws, 0), pids[i]);
        ck_assert_msg(WIFEXITED(ws) && WEXITSTATUS(ws) == 0, "client %d ended with status %#x", i,
                      ws);
    }
    fsd_start(m, args);
    gpubuf_status *s = td_status(&m->d);
    uint32_t rounds = 0;
    check_fill(s);
    /* This cycle's anonymous buffers: those of an earlier cycle (held by
     * sessions not resumed, until they go) have smaller ids. */
    leftover lo = {calloc(s->n_buffers + 1, sizeof(uint64_t)), 0};
    ck_assert_ptr_nonnull(lo.ids);
    for (size_t i = 0; i < s->n_buffers; i++)
        if (!s->buffers[i].name[0] && s->buffers[i].id > *min_id)
            lo.ids[lo.n++] = s->buffers[i].id;
    int mid = 0, unanswered = 0;
    for (int i = 0; i < PROCS; i++)
        rounds += check_client(s, cycle, i, logs[i], &mid, &lo, &unanswered);
    mid += check_leftover(s, cycle, &lo, unanswered);
    for (size_t i = 0; i < s->n_buffers; i++)
        if (s->buffers[i].id > *min_id)
            *min_id = s->buffers[i].id;
    free(lo.ids);
    gpubuf_status_free(s);
    printf("test_restart_stream: cycle %d: %u rounds of 5 batches of %d before the SIGKILL; %d "
           "client(s) had a batch saved but not seen answered\n",
           cycle, rounds, K, mid);
}

START_TEST(sigkill_amid_batches_of_16_processes) {
    fake_sd m;
    const char *args[] = {"--pool", "host=host,capacity=1G", NULL};
    fsd_init(&m);
    fsd_start(&m, args);
    fill(&m.d);
    uint64_t min_id = 0;
    for (int cycle = 0; cycle < 2; cycle++)
        cycle_once(&m, args, cycle, &min_id);
    fsd_cleanup(&m);
}
END_TEST

static Suite *suite(void) {
    Suite *s = suite_create("restart_stream");
    TCase *t = add_case(s, "stream", NULL, NULL, 300);
    tcase_add_test(t, sigkill_amid_batches_of_16_processes);
    return s;
}

int main(void) {
#ifndef GPUBUF_TEST_SYSTEMD
    printf("test_restart_stream: gpubufd is built without libsystemd (no fd store to keep its "
           "state across a SIGKILL): skipped\n");
    (void)suite;
    return 77;
#else
    return run_suite(suite());
#endif
}
