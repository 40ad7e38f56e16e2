/* No pass of gpubufd's event loop is unbounded (issue 11, item 5).
 *
 * A pool is fragmented to about 131,072 free extents (262,144 smallest
 * buffers, every other one released; a quarter of that under the
 * sanitizers). Then, while a bystander asks for a
 * stat over and over and times each answer:
 *   A. eight clients each pipeline 1,000 allocations and close at once,
 *      without reading a reply. The pool is one slab, full: each allocation
 *      looks for room among the free extents and is refused. All of them
 *      are applied (the pool counts 8,000 failures);
 *   B. the client that holds the remaining buffers closes: all of them go
 *      back to the pool.
 * Allocation cost that grows with the free extents, or a departure handled
 * in one pass, stall the loop for seconds; the bystander's worst latency
 * stays far below that. The figures are printed (td_figure); the bound
 * asserted is generous, for a loaded 2-core machine and the sanitizers. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "gpubuf.pb-c.h"
#include "harness.h"
#include "wire.h"
#include "check_main.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_UNDEFINED__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

/* Smallest buffers that fill the fragmented slab (host pools align to 256
 * bytes): 64 MiB / 256, a quarter of that under the sanitizers (whose
 * build takes ten times as long to set it up). */
enum { UNIT = 256, N_UNITS = SANITIZED ? 65536 : 262144, ATTACKERS = 16, PIPELINED = 3000 };
/* The most CPU time gpubufd may spend while one bystander's stat waits:
 * the goal for the stat's latency is 100 ms; a loop that works the whole
 * flood in one turn spends seconds. CPU time, not wall-clock time, so that
 * a loaded machine (the daemon or the bystander not scheduled) cannot fail
 * it. */
#define BOUND_MS (SANITIZED ? 1500.0 : 500.0)

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Append one framed request to *buf (grown as needed). */
static void put_req(uint8_t **buf, size_t *len, size_t *cap, Gpubuf__Request *req) {
    ck_assert_int_eq(rp_append(buf, len, cap, req), 0);
}

static void put_alloc(uint8_t **buf, size_t *len, size_t *cap, uint64_t id, uint64_t size) {
    Gpubuf__AllocRequest a = GPUBUF__ALLOC_REQUEST__INIT;
    a.pool = "frag";
    a.size = size;
    Gpubuf__Request req = rp_request(id, GPUBUF__REQUEST__BODY_ALLOC, &a);
    put_req(buf, len, cap, &req);
}

static void put_release(uint8_t **buf, size_t *len, size_t *cap, uint64_t id, uint64_t bid) {
    Gpubuf__ReleaseRequest r = GPUBUF__RELEASE_REQUEST__INIT;
    r.buffer_id = bid;
    Gpubuf__Request req = rp_request(id, GPUBUF__REQUEST__BODY_RELEASE, &r);
    put_req(buf, len, cap, &req);
}

/* A raw connection that said hello. */
static int raw_open(const test_daemon *d) {
    int fd = td_raw_connect(d, 60);
    td_raw_hello(fd);
    return fd;
}

/* Write buf to fd from a child process (the parent reads the replies
 * meanwhile); returns the child's pid. */
static pid_t write_behind(int fd, const uint8_t *buf, size_t len) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(gpubuf_wire_send_all(fd, buf, len, -1) < 0);
    return pid;
}

/* Read n replies, each a success; the buffer ids of alloc replies go to
 * ids (when not NULL), their fds are closed. */
static void read_ok(int fd, int n, uint64_t *ids) {
    for (int i = 0; i < n; i++) {
        uint8_t *p;
        int afd;
        ssize_t len = gpubuf_wire_read_frame(fd, GPUBUF_WIRE_MAX_RESPONSE, &p, &afd);
        if (len < 0)
            ck_abort_msg("reply %d of %d: %s", i, n, gpubuf_strerror((int)len));
        if (afd >= 0)
            close(afd);
        Gpubuf__Response *r = gpubuf__response__unpack(NULL, (size_t)len, p);
        free(p);
        if (!r || r->status != 0)
            ck_abort_msg("reply %d of %d: status %d %s", i, n, r ? r->status : -1,
                         r && r->message ? r->message : "");
        if (ids)
            ids[i] = r->buffer ? r->buffer->buffer_id : 0;
        gpubuf__response__free_unpacked(r, NULL);
    }
}

/* CPU time gpubufd (pid) has used so far, in ms (utime + stime of
 * /proc/PID/stat, in clock ticks); -1 if it cannot be read. */
static double daemon_cpu_ms(pid_t pid) {
    char path[64], line[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(line, 1, sizeof(line) - 1, f);
    fclose(f);
    line[n] = 0;
    const char *p = strrchr(line, ')');
    unsigned long ut, st;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

/* The bystander: a client of the library that stats a buffer of another
 * pool every 2 ms until a byte arrives on stop, then writes its worst and
 * mean latency (ms), its count and the most CPU time gpubufd spent while
 * one stat waited (ms) to result. The wall-clock latency is a figure; what
 * is asserted is the daemon's CPU time inside one wait: a loop that works
 * a whole flood in one turn spends seconds of it there, a loop that takes
 * turns a few ms, however slow or loaded the machine is. */
typedef struct bystander {
    int stop[2], result[2];
    pid_t pid;
    double worst_ms, mean_ms, worst_cpu_ms;
    long count;
} bystander;

static int bystander_main(const test_daemon *d, void *arg) {
    bystander *b = arg;
    gpubuf_client *c;
    gpubuf_buffer_info info;
    double worst = 0, sum = 0, worst_cpu = 0;
    long n = 0;
    /* Connections of the parent's stay the parent's: the client it closes
     * must go when it closes it. */
    for (int fd = 3; fd < 1024; fd++)
        if (fd != b->stop[0] && fd != b->result[1])
            close(fd);
    if (gpubuf_connect(d->socket, &c) < 0)
        return 1;
    struct pollfd pfd = {.fd = b->stop[0], .events = POLLIN};
    while (poll(&pfd, 1, 2) == 0) {
        double t0 = now_ms(), cpu0 = daemon_cpu_ms(d->pid);
        if (gpubuf_stat(c, "/other/bystander", &info) < 0)
            return 2;
        double dt = now_ms() - t0, cpu = daemon_cpu_ms(d->pid) - cpu0;
        if (cpu0 < 0)
            return 4;
        worst = dt > worst ? dt : worst;
        worst_cpu = cpu > worst_cpu ? cpu : worst_cpu;
        sum += dt;
        n++;
    }
    char line[128];
    int len = snprintf(line, sizeof(line), "%.3f %.3f %ld %.3f\n", worst,
                       n ? sum / (double)n : 0.0, n, worst_cpu);
    gpubuf_disconnect(c);
    return write(b->result[1], line, (size_t)len) == len ? 0 : 3;
}

static void bystander_start(bystander *b, const test_daemon *d) {
    ck_assert_int_eq(pipe(b->stop), 0);
    ck_assert_int_eq(pipe(b->result), 0);
    b->pid = td_spawn(bystander_main, d, b);
    close(b->stop[0]);
    close(b->result[1]);
    /* Connected (and so measuring). */
    ck_assert(td_wait_client_pid(d, b->pid, 60000));
}

static void bystander_stop(bystander *b) {
    char line[128] = "";
    (void)!write(b->stop[1], "x", 1); /* fails only if it is gone already */
    ssize_t n = read(b->result[0], line, sizeof(line) - 1);
    int rc = td_wait(b->pid);
    ck_assert_msg(rc == 0, "the bystander failed (%d: 1 connect, 2 stat, 3 result, 4 /proc)", rc);
    ck_assert_int_gt(n, 0);
    line[n] = '\0';
    ck_assert_int_eq(
        sscanf(line, "%lf %lf %ld %lf", &b->worst_ms, &b->mean_ms, &b->count, &b->worst_cpu_ms), 4);
    close(b->stop[1]);
    close(b->result[0]);
}

/* The pool frag's used bytes, buffers and refused allocations, from a
 * status. */
static void frag_usage(const test_daemon *d, uint64_t *used, uint32_t *buffers,
                       uint64_t *failures) {
    gpubuf_status *st = td_status(d);
    const gpubuf_pool_info *p = td_find_pool(st, "frag");
    ck_assert_ptr_nonnull(p);
    *used = p->used;
    *buffers = p->buffers;
    *failures = UINT64_MAX;
    for (size_t i = 0; i < st->counters.n_pools; i++)
        if (strcmp(st->counters.pools[i].pool, "frag") == 0)
            *failures = st->counters.pools[i].alloc_failures;
    ck_assert_uint_ne(*failures, UINT64_MAX);
    gpubuf_status_free(st);
}

START_TEST(bystander_is_served_while_a_fragmented_pool_is_worked) {
    test_daemon d;
    /* One slab, filled by the buffers: no room for a second. */
    char frag_pool[96];
    snprintf(frag_pool, sizeof(frag_pool), "frag=host,capacity=%d,slab=%d", UNIT * N_UNITS,
             UNIT * N_UNITS);
    const char *args[] = {"--pool", frag_pool, "--pool", "other=host,capacity=16M", NULL};
    td_start(&d, args);
    gpubuf_client *owner = td_connect(&d);
    gpubuf_buffer *mark;
    ck_assert_int_eq(gpubuf_alloc(owner, "other", 4096, "bystander", &mark), 0);
    ck_assert_int_eq(gpubuf_seal(mark), 0);

    /* Fragment: fill a 64 MiB slab with 256-byte buffers, release every
     * other one. */
    double t0 = now_ms();
    int frag = raw_open(&d);
    uint64_t *ids = calloc(N_UNITS, sizeof(*ids));
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    ck_assert_ptr_nonnull(ids);
    for (int i = 0; i < N_UNITS; i++)
        put_alloc(&buf, &len, &cap, 10 + (uint64_t)i, UNIT);
    pid_t w = write_behind(frag, buf, len);
    read_ok(frag, N_UNITS, ids);
    ck_assert_int_eq(td_wait(w), 0);
    len = 0;
    for (int i = 1; i < N_UNITS; i += 2)
        put_release(&buf, &len, &cap, 10 + (uint64_t)i, ids[i]);
    w = write_behind(frag, buf, len);
    read_ok(frag, N_UNITS / 2, NULL);
    ck_assert_int_eq(td_wait(w), 0);
    uint64_t used, failures;
    uint32_t buffers;
    frag_usage(&d, &used, &buffers, &failures);
    ck_assert_uint_eq(buffers, N_UNITS / 2);
    ck_assert_uint_eq(used, (uint64_t)UNIT * N_UNITS / 2);
    ck_assert_uint_eq(failures, 0);
    double setup_ms = now_ms() - t0;

    /* A: eight clients pipeline 1,000 allocations that fit no hole (and the
     * pool has no room for another slab), and close without reading. */
    bystander b;
    bystander_start(&b, &d);
    len = 0;
    for (int i = 0; i < PIPELINED; i++)
        put_alloc(&buf, &len, &cap, 10 + (uint64_t)i, 2 * UNIT);
    int att[ATTACKERS];
    for (int k = 0; k < ATTACKERS; k++)
        att[k] = raw_open(&d);
    for (int k = 0; k < ATTACKERS; k++) {
        /* The socket takes it all: 1,000 requests are about 20 KB. */
        ck_assert_int_eq(gpubuf_wire_send_all(att[k], buf, len, -1), 0);
    }
    for (int k = 0; k < ATTACKERS; k++)
        close(att[k]);
    td_sleep_ms(SANITIZED ? 3000 : 1500); /* the bystander measures: a duration */
    bystander_stop(&b);
    bystander a = b;
    for (int i = 0; i < 200; i++) {
        frag_usage(&d, &used, &buffers, &failures);
        if (failures == ATTACKERS * PIPELINED)
            break;
        td_sleep_ms(50);
    }
    ck_assert_uint_eq(failures, ATTACKERS * PIPELINED);

    /* B: the client holding the buffers left closes. */
    bystander_start(&b, &d);
    double t1 = now_ms();
    close(frag);
    td_sleep_ms(SANITIZED ? 3000 : 1500); /* the bystander measures: a duration */
    bystander_stop(&b);

    /* Done in the end: every buffer of frag went back to the pool. */
    for (int i = 0; i < 200; i++) {
        frag_usage(&d, &used, &buffers, &failures);
        if (used == 0 && buffers == 0)
            break;
        td_sleep_ms(50);
    }
    double drop_ms = now_ms() - t1;
    ck_assert_uint_eq(buffers, 0);
    ck_assert_uint_eq(used, 0);
    ck_assert(td_wait_clients(&d, 1, 5000));

    td_figure("loop bounds: fragmented pool of %d free extents made in %.0f ms", N_UNITS / 2,
              setup_ms);
    td_figure("loop bounds: %d clients pipeline %d allocations each (refused) and close: "
              "bystander's stat worst %.1f ms, mean %.2f ms over %ld (goal 100 ms); gpubufd's CPU "
              "inside one stat at most %.0f ms (bound %.0f ms)",
              ATTACKERS, PIPELINED, a.worst_ms, a.mean_ms, a.count, a.worst_cpu_ms, BOUND_MS);
    td_figure("loop bounds: a client holding %d buffers closes: bystander's stat worst %.1f ms, "
              "mean %.2f ms over %ld (goal 100 ms); gpubufd's CPU inside one stat at most %.0f ms "
              "(bound %.0f ms); all freed within %.0f ms",
              N_UNITS / 2, b.worst_ms, b.mean_ms, b.count, b.worst_cpu_ms, BOUND_MS, drop_ms);
    ck_assert_msg(a.worst_cpu_ms < BOUND_MS,
                  "gpubufd spent %.0f ms of CPU while one bystander's stat waited, as allocations "
                  "drained", a.worst_cpu_ms);
    ck_assert_msg(b.worst_cpu_ms < BOUND_MS,
                  "gpubufd spent %.0f ms of CPU while one bystander's stat waited, as a client's "
                  "%d buffers were released", b.worst_cpu_ms, N_UNITS / 2);
    ck_assert_int_gt(a.count, 10);
    ck_assert_int_gt(b.count, 10);

    free(buf);
    free(ids);
    gpubuf_release(mark);
    gpubuf_disconnect(owner);
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

/* Waiting opens that end at the same moment are answered over a few turns
 * (GD_EXPIRIES_PER_TURN per turn), every one of them: 24 clients with 64
 * waits each, all timing out together. */
START_TEST(simultaneous_expiries_are_all_answered) {
    enum { CLIENTS = 24, WAITS = 64 };
    test_daemon d;
    const char *args[] = {"--pool", "host=host,capacity=16M", NULL};
    td_start(&d, args);
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (int i = 0; i < WAITS; i++) {
        Gpubuf__OpenRequest o = GPUBUF__OPEN_REQUEST__INIT;
        o.target_case = GPUBUF__OPEN_REQUEST__TARGET_NAME;
        o.name = "never";
        o.timeout_ms = 500;
        Gpubuf__Request req = rp_request(100 + (uint64_t)i, GPUBUF__REQUEST__BODY_OPEN, &o);
        put_req(&buf, &len, &cap, &req);
    }
    int fds[CLIENTS];
    for (int k = 0; k < CLIENTS; k++) {
        fds[k] = raw_open(&d);
        ck_assert_int_eq(gpubuf_wire_send_all(fds[k], buf, len, -1), 0);
    }
    ck_assert(td_wait_waiting_opens(&d, CLIENTS * WAITS, 10000));
    double t0 = 0;
    for (int k = 0; k < CLIENTS; k++) {
        for (int i = 0; i < WAITS; i++) {
            uint8_t *p;
            int afd;
            ssize_t n = gpubuf_wire_read_frame(fds[k], GPUBUF_WIRE_MAX_RESPONSE, &p, &afd);
            if (t0 == 0)
                t0 = now_ms();
            ck_assert_msg(n > 0, "client %d: reply %d missing", k, i);
            Gpubuf__Response *r = gpubuf__response__unpack(NULL, (size_t)n, p);
            free(p);
            ck_assert_ptr_nonnull(r);
            ck_assert_int_eq(r->status, -ETIMEDOUT);
            gpubuf__response__free_unpacked(r, NULL);
        }
        close(fds[k]);
    }
    td_figure("loop bounds: %d waiting opens timing out together: all answered, the last %.0f ms "
              "after the first was read (at most %d per turn)",
              CLIENTS * WAITS, now_ms() - t0, 256);
    ck_assert(td_wait_waiting_opens(&d, 0, 5000));
    free(buf);
    ck_assert_int_eq(td_stop(&d), 0);
}
END_TEST

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("loop");
    add_tests(add_case(s, "bounded passes", NULL, NULL, 110),
              bystander_is_served_while_a_fragmented_pool_is_worked,
              simultaneous_expiries_are_all_answered);
    return run_suite(s);
}
