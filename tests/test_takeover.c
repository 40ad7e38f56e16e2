/* Takeover hardening on host pools (gpubufd --takeover, daemon/takeover.c):
 * a successor that cannot start, one killed at each phase of the hand
 * over, and two successors at once. In each case a buffer and its bytes
 * survive, the old daemon's client keeps its view, and exactly one daemon
 * serves afterwards. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "fdstore.h"
#include "harness.h"

#define BIG (16ull << 20)
#define SEED 0x7a1e
#define POOL "host=host,capacity=256M"
#define WAIT_MS 30000
static const char *const k_pool[] = {"--pool", POOL, NULL};

/* A new client opens `name` and finds its bytes. */
static void check_contents(const test_daemon *d, const char *name, uint32_t seed) {
    gpubuf_client *c = td_connect(d);
    gpubuf_buffer *b = NULL;
    ck_assert_int_eq(gpubuf_open(c, name, 0, &b), 0);
    ck_assert_uint_eq(td_mismatches(gpubuf_buffer_host_ptr(b), BIG, seed), 0);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}

static int verify_big(const gpubuf_buffer *b, void *arg) {
    (void)arg;
    return td_mismatches(gpubuf_buffer_host_ptr(b), BIG, SEED) != 0;
}

/* Start d with a buffer "big" and reader k (of "big") holding a view of
 * it. */
static void start_with_a_reader(test_daemon *d, reader *k) {
    td_start(d, k_pool);
    td_produce(d, "big", BIG, SEED);
    reader_start(k, d);
    ck_assert(td_wait_refs(d, "big", 1, WAIT_MS));
}

static bool alive(pid_t pid) {
    int st;
    return waitpid(pid, &st, WNOHANG) == 0;
}

/* gpubufd --takeover on d's socket, its log in d->dir/NAME.log; hook is
 * GPUBUFD_TEST_TAKEOVER (NULL: none); nofile > 0 caps RLIMIT_NOFILE; the
 * extra arguments end with NULL. */
static pid_t successor(const test_daemon *d, const char *name, const char *hook, rlim_t nofile,
                       const char *extra1, const char *extra2) {
    char log[256];
    snprintf(log, sizeof(log), "%s/%s.log", d->dir, name);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd >= 0)
            dup2(fd, 2);
        if (hook)
            setenv("GPUBUFD_TEST_TAKEOVER", hook, 1);
        if (nofile) {
            struct rlimit rl = {nofile, nofile};
            setrlimit(RLIMIT_NOFILE, &rl);
        }
        execl(GPUBUFD_PATH, GPUBUFD_PATH, "--socket", d->socket, "--log-level", "info", "--pool",
              POOL, "--takeover", extra1, extra2, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static char *read_log(const test_daemon *d, const char *name) {
    char path[256], *buf = calloc(1, 1 << 16);
    snprintf(path, sizeof(path), "%s/%s.log", d->dir, name);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(buf);
    if (f) {
        size_t n = fread(buf, 1, (1 << 16) - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

/* Waits (60 s at most: a loaded machine may be slow to schedule it) for a
 * line that a live process writes when it gets to it. */
static void assert_log_has(const test_daemon *d, const char *name, const char *what) {
    char path[256];
    snprintf(path, sizeof(path), "%s/%s.log", d->dir, name);
    if (td_wait_file_has(path, what, 60000))
        return;
    char *log = read_log(d, name);
    ck_abort_msg("%s.log lacks \"%s\":\n%s", name, what, log);
    free(log);
}

/* A successor takes over for real: the old daemon exits 0, the successor
 * serves d's socket from now on. */
static void take_over_for_real(test_daemon *d) {
    pid_t old = d->pid, succ = successor(d, "final", NULL, 0, NULL, NULL);
    ck_assert_int_eq(td_wait(old), 0);
    d->pid = succ;
    ck_assert(alive(succ));
    assert_log_has(d, "final", "takeover: serving");
}

/* td_stop, and what the successors left in the directory. */
static void cleanup(test_daemon *d) {
    char dir[64];
    snprintf(dir, sizeof(dir), "%s", d->dir);
    td_stop(d);
    td_rmtree(dir);
}

/* A successor that fails at start-up (too few fds for one client; a pool
 * it cannot create) does so before it asks for the fds: the old daemon,
 * its client and its buffer are untouched. */
START_TEST(failed_successor_leaves_the_daemon_serving) {
    test_daemon d;
    reader k = {.name = "big", .verify = verify_big};
    start_with_a_reader(&d, &k);

    pid_t s = successor(&d, "nofile", NULL, 64, NULL, NULL);
    ck_assert_int_ne(td_wait(s), 0);
    ck_assert_msg(alive(d.pid), "the old daemon is gone");
    check_contents(&d, "big", SEED);
    assert_log_has(&d, "nofile", "leaves no room");
    assert_log_has(&d, "nofile", "takeover: giving up before asking for the fds; the running "
                                 "gpubufd serves on");

    s = successor(&d, "pool", NULL, 0, "--pool", "gpu=cuda-ipc,device=99");
    ck_assert_int_ne(td_wait(s), 0);
    ck_assert_msg(alive(d.pid), "the old daemon is gone");
    check_contents(&d, "big", SEED);
    assert_log_has(&d, "pool", "takeover: giving up before asking for the fds");
    ck_assert(td_wait_refs(&d, "big", 1, WAIT_MS)); /* the reader's view */

    take_over_for_real(&d);
    check_contents(&d, "big", SEED);
    ck_assert_int_eq(reader_stop(&k), 0);
    cleanup(&d);
}
END_TEST

/* A successor killed after it asked, after it received the fds, and after
 * it restored (and wrote its snapshot into the shared state): the old
 * daemon serves on each time, and what changes after that survives the
 * next, real, takeover. */
START_TEST(killed_successor_loses_nothing) {
    static const char *const phases[] = {"asked", "received", "restored"};
    test_daemon d;
    reader k = {.name = "big", .verify = verify_big};
    start_with_a_reader(&d, &k);
    for (int i = 0; i < 3; i++) {
        pid_t s = successor(&d, phases[i], phases[i], 0, NULL, NULL);
        ck_assert_int_eq(td_wait(s), 128 + SIGKILL);
        ck_assert_msg(alive(d.pid), "the old daemon is gone");
        check_contents(&d, "big", SEED);
        assert_log_has(&d, phases[i], "takeover: test hook at");
    }
    /* A change after the last one wrote its snapshot. */
    td_produce(&d, "after", BIG, SEED + 1);
    ck_assert(td_wait_refs(&d, "big", 1, WAIT_MS));

    take_over_for_real(&d);
    check_contents(&d, "big", SEED);
    check_contents(&d, "after", SEED + 1);
    ck_assert_int_eq(reader_stop(&k), 0);
    cleanup(&d);
}
END_TEST

static bool stopped(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] == 'T';
}

/* Two successors: one holds the hand over (stopped in the middle of it),
 * the other is refused at once, naming it; the first then serves. */
START_TEST(second_successor_is_refused) {
    test_daemon d;
    char want[128];
    td_start(&d, k_pool);
    td_produce(&d, "big", BIG, SEED);
    pid_t old = d.pid, a = successor(&d, "a", "received:stop", 0, NULL, NULL);
    bool ok = false;
    for (int t = 0; t < WAIT_MS && !(ok = stopped(a)); t += 10)
        td_sleep_ms(10);
    ck_assert_msg(ok, "the first successor never reached the hook");
    pid_t b = successor(&d, "b", NULL, 0, NULL, NULL);
    ck_assert_int_eq(td_wait(b), 1);
    snprintf(want, sizeof(want), "another gpubufd --takeover (pid %d) is taking over", (int)a);
    assert_log_has(&d, "b", want);
    ck_assert(alive(old));
    kill(a, SIGCONT);
    ck_assert_int_eq(td_wait(old), 0);
    d.pid = a;
    ck_assert(alive(a));
    assert_log_has(&d, "a", "takeover: serving");
    check_contents(&d, "big", SEED);
    cleanup(&d);
}
END_TEST

/* Two successors started at the same moment, a few times: whatever the
 * order, exactly one daemon serves, the buffer is there, and a successor
 * that lost says so. */
START_TEST(simultaneous_successors) {
    for (int round = 0; round < 3; round++) {
        test_daemon d;
        td_start(&d, k_pool);
        td_produce(&d, "big", BIG, SEED);
        pid_t old = d.pid;
        pid_t a = successor(&d, "a", NULL, 0, NULL, NULL);
        pid_t b = successor(&d, "b", NULL, 0, NULL, NULL);
        /* The old daemon goes once one took over. */
        ck_assert_int_eq(td_wait(old), 0);
        /* One of them serves for good; the other exits (lost the lock, or
         * handed over to the other one after it took over: a chain). */
        pid_t pids[2] = {a, b}, server = 0;
        const char *names[2] = {"a", "b"};
        int exited = -1, code = -1;
        for (int t = 0; t < WAIT_MS && exited < 0; t += 10) {
            for (int i = 0; i < 2 && exited < 0; i++) {
                int st;
                if (waitpid(pids[i], &st, WNOHANG) == pids[i]) {
                    exited = i;
                    code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
                }
            }
            if (exited < 0)
                td_sleep_ms(10);
        }
        ck_assert_msg(exited >= 0, "both successors still run");
        server = pids[!exited];
        ck_assert(alive(server));
        if (code != 0)
            assert_log_has(&d, names[exited], "is taking over the gpubufd on");
        d.pid = server;
        check_contents(&d, "big", SEED);
        ck_assert(alive(server));
        cleanup(&d);
    }
}
END_TEST

SUITE_MAIN("takeover", "takeover", NULL, NULL, 150,
          failed_successor_leaves_the_daemon_serving, killed_successor_loses_nothing,
          second_successor_is_refused, simultaneous_successors)
