/* gpubufd as a service: socket activation (LISTEN_FDS), readiness, watchdog
 * and stopping notifications (NOTIFY_SOCKET), SIGHUP reload, and gpubufctl's
 * metrics and filters. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <regex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "harness.h"
#include "util.h"

static char dir[64];

static void mkdir_tmp(void) {
    td_mkdtemp(dir, "svc");
}

static void rm_tmp(void) {
    td_rmtree(dir);
}

#ifdef GPUBUF_TEST_SYSTEMD
static int unix_socket(int type, const char *path) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int fd = socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

/* Wait up to ms for a datagram containing `what` on fd. */
static bool expect_notify(int fd, const char *what, int ms) {
    char buf[512];
    uint64_t end = gpubuf_now_ns() + (uint64_t)ms * 1000000u;
    for (uint64_t now; (now = gpubuf_now_ns()) < end;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, (int)((end - now) / 1000000u) + 1) < 0 && errno != EINTR)
            return false;
        ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
        if (n > 0) {
            buf[n] = '\0';
            if (strstr(buf, what))
                return true;
        }
    }
    return false;
}
#endif

/* Start gpubufd with args; listen_fd (>= 0) is handed over as a socket
 * activation would, notify and watchdog_usec (non-NULL) set as systemd
 * does; its standard error goes to the file log (NULL: this one's). */
static pid_t spawn_daemon(const char *const *args, int listen_fd, const char *notify,
                          const char *watchdog_usec, const char *log) {
    const char *argv[32];
    int n = 0;
    argv[n++] = GPUBUFD_PATH;
    argv[n++] = "--log-level";
    argv[n++] = "warning";
    for (int i = 0; args && args[i]; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    fflush(NULL);
    pid_t p = fork();
    ck_assert_int_ge(p, 0);
    if (p == 0) {
        char pid[32];
        snprintf(pid, sizeof(pid), "%d", (int)getpid());
        if (listen_fd >= 0) {
            /* sd_listen_fds: fds from 3 on, for this very process. */
            if (dup2(listen_fd, 3) < 0)
                _exit(126);
            setenv("LISTEN_FDS", "1", 1);
            setenv("LISTEN_PID", pid, 1);
        }
        if (notify)
            setenv("NOTIFY_SOCKET", notify, 1);
        if (watchdog_usec) {
            setenv("WATCHDOG_USEC", watchdog_usec, 1);
            setenv("WATCHDOG_PID", pid, 1);
        }
        if (log && !freopen(log, "w", stderr))
            _exit(125);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return p;
}

static int stop(pid_t p) {
    int st;
    kill(p, SIGTERM);
    ck_assert_int_eq(waitpid(p, &st, 0), p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Built without libsystemd, these two are not added: there is nothing to
 * activate or notify. */
#ifdef GPUBUF_TEST_SYSTEMD
START_TEST(socket_activation) {
    char path[128];
    snprintf(path, sizeof(path), "%s/activated.sock", dir);
    int lfd = unix_socket(SOCK_STREAM, path);
    ck_assert_int_eq(listen(lfd, 16), 0);
    const char *args[] = {"--pool", "act=host,capacity=64M", NULL};
    pid_t p = spawn_daemon(args, lfd, NULL, NULL, NULL);
    close(lfd);
    gpubuf_client *c;
    /* No --socket: the inherited listening socket is used. */
    ck_assert(td_wait_connect(path, &c, 3000));
    gpubuf_status *s;
    ck_assert_int_eq(gpubuf_status_get(c, &s), 0);
    ck_assert_str_eq(s->pools[0].name, "act");
    gpubuf_status_free(s);
    gpubuf_disconnect(c);
    ck_assert_int_eq(stop(p), 0);
}
END_TEST

START_TEST(notify_ready_watchdog_stopping) {
    char nsock[128], path[128];
    snprintf(nsock, sizeof(nsock), "%s/notify.sock", dir);
    snprintf(path, sizeof(path), "%s/d.sock", dir);
    int nfd = unix_socket(SOCK_DGRAM, nsock);
    const char *args[] = {"--socket", path, "--pool", "n=host,capacity=64M", NULL};
    pid_t p = spawn_daemon(args, -1, nsock, "200000", NULL);
    ck_assert(expect_notify(nfd, "READY=1", 5000));
    /* The watchdog interval is 200 ms: pings every 100 ms. */
    ck_assert(expect_notify(nfd, "WATCHDOG=1", 1000));
    ck_assert(expect_notify(nfd, "WATCHDOG=1", 1000));
    kill(p, SIGTERM);
    ck_assert(expect_notify(nfd, "STOPPING=1", 5000));
    int st;
    ck_assert_int_eq(waitpid(p, &st, 0), p);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(nfd);
}
END_TEST
#endif

static void write_conf(const char *path, const char *text) {
    ck_assert_int_eq(td_write_file(path, text), 0);
}

START_TEST(sighup_reloads_limits) {
    char conf[128], path[128];
    snprintf(conf, sizeof(conf), "%s/gpubuf.conf", dir);
    snprintf(path, sizeof(path), "%s/d.sock", dir);
    write_conf(conf, "[daemon]\nmax_clients = 1\n[pool:h]\nkind = host\ncapacity = 64M\n");
    const char *args[] = {"--socket", path, "--config", conf, NULL};
#ifdef GPUBUF_TEST_SYSTEMD
    /* READY=1 after each reload says it is done. */
    char nsock[128];
    snprintf(nsock, sizeof(nsock), "%s/notify.sock", dir);
    int nfd = unix_socket(SOCK_DGRAM, nsock);
    pid_t p = spawn_daemon(args, -1, nsock, NULL, NULL);
    ck_assert(expect_notify(nfd, "READY=1", 5000));
#else
    /* Its log says when a reload is refused. */
    char log[128];
    snprintf(log, sizeof(log), "%s/gpubufd.log", dir);
    pid_t p = spawn_daemon(args, -1, NULL, NULL, log);
#endif
    gpubuf_client *a, *b = NULL;
    ck_assert(td_wait_connect(path, &a, 3000));
    /* One client allowed: the second is turned away. */
    ck_assert_int_lt(gpubuf_connect(path, &b), 0);
    write_conf(conf, "[daemon]\nmax_clients = 8\n[pool:h]\nkind = host\ncapacity = 64M\n");
    kill(p, SIGHUP);
    ck_assert(td_wait_connect(path, &b, 3000));
#ifdef GPUBUF_TEST_SYSTEMD
    ck_assert(expect_notify(nfd, "READY=1", 5000));
#endif
    /* The first client was not disturbed. */
    gpubuf_buffer *x;
    ck_assert_int_eq(gpubuf_alloc(a, "h", 4096, NULL, &x), 0);
    gpubuf_release(x);
    /* A broken file keeps the running configuration. */
    write_conf(conf, "[daemon]\nmax_clients = zero\n");
    kill(p, SIGHUP);
#ifdef GPUBUF_TEST_SYSTEMD
    ck_assert(expect_notify(nfd, "READY=1", 5000)); /* the reload was refused */
#else
    ck_assert(td_wait_file_has(log, "keeping the running configuration", 5000));
#endif
    gpubuf_client *c3;
    ck_assert_int_eq(gpubuf_connect(path, &c3), 0);
    gpubuf_disconnect(c3);
    gpubuf_disconnect(a);
    gpubuf_disconnect(b);
    ck_assert_int_eq(stop(p), 0);
#ifdef GPUBUF_TEST_SYSTEMD
    close(nfd);
#endif
}
END_TEST

START_TEST(metrics_parse_as_prometheus_text) {
    test_daemon d;
    gpubuf_client *c = td_start_connect(
        &d, TD_ARGS("--pool", "m0=host,capacity=64M", "--pool", "m1=host,capacity=32M"));
    gpubuf_buffer *b;
    ck_assert_int_eq(gpubuf_alloc(c, "m1", 3 << 20, "met", &b), 0);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    char *out = td_ctl(&d, "metrics", 0);
    /* Every sample line: name{labels} value; every family has HELP and TYPE
     * before its first sample. */
    regex_t sample, help, type;
    ck_assert_int_eq(regcomp(&sample,
                             "^([a-zA-Z_:][a-zA-Z0-9_:]*)(\\{([a-zA-Z_][a-zA-Z0-9_]*=\"([^\"\\\\]|"
                             "\\\\.)*\",?)*\\})? -?[0-9.eE+-]+$",
                             REG_EXTENDED),
                     0);
    ck_assert_int_eq(regcomp(&help, "^# HELP ([a-zA-Z_:][a-zA-Z0-9_:]*) .+$", REG_EXTENDED), 0);
    ck_assert_int_eq(regcomp(&type, "^# TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (gauge|counter|histogram)$",
                             REG_EXTENDED),
                     0);
    char declared[64][64];
    int n_declared = 0, samples = 0;
    bool used_ok = false;
    for (char *line = strtok(out, "\n"); line; line = strtok(NULL, "\n")) {
        regmatch_t m[2];
        if (!strncmp(line, "# HELP", 6)) {
            ck_assert_msg(regexec(&help, line, 0, NULL, 0) == 0, "bad HELP: %s", line);
            continue;
        }
        if (!strncmp(line, "# TYPE", 6)) {
            ck_assert_msg(regexec(&type, line, 2, m, 0) == 0, "bad TYPE: %s", line);
            ck_assert_int_lt(n_declared, 64);
            snprintf(declared[n_declared++], 64, "%.*s", (int)(m[1].rm_eo - m[1].rm_so),
                     line + m[1].rm_so);
            continue;
        }
        ck_assert_msg(regexec(&sample, line, 2, m, 0) == 0, "bad sample: %s", line);
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)(m[1].rm_eo - m[1].rm_so), line + m[1].rm_so);
        bool found = false;
        /* A histogram's samples add _bucket, _sum or _count to its name. */
        for (int i = 0; i < n_declared; i++) {
            size_t dl = strlen(declared[i]);
            found |= !strcmp(declared[i], name) ||
                     (!strncmp(declared[i], name, dl) &&
                      (!strcmp(name + dl, "_bucket") || !strcmp(name + dl, "_sum") ||
                       !strcmp(name + dl, "_count")));
        }
        ck_assert_msg(found, "sample before its TYPE: %s", line);
        samples++;
        if (strstr(line, "gpubuf_pool_used_bytes{pool=\"m1\"") && strstr(line, "} 3145728"))
            used_ok = true;
    }
    ck_assert_int_ge(samples, 10);
    ck_assert(used_ok);
    regfree(&sample);
    regfree(&help);
    regfree(&type);
    free(out);
    gpubuf_release(b);
    td_disconnect_stop(&d, c);
}
END_TEST

START_TEST(gpubufctl_filters) {
    test_daemon d;
    gpubuf_client *c = td_start_connect(
        &d, TD_ARGS("--pool", "f0=host,capacity=64M", "--pool", "f1=host,capacity=64M"));
    gpubuf_buffer *a, *b, *x;
    ck_assert_int_eq(gpubuf_alloc(c, "f0", 4096, "job1/a", &a), 0);
    ck_assert_int_eq(gpubuf_alloc(c, "f1", 4096, "job2/b", &b), 0);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    ck_assert_int_eq(gpubuf_alloc(c, "f1", 4096, "job1/c", &x), 0);
    char *out = td_ctl(&d, "--json buffers --pool f1 --name job1/", 0);
    ck_assert(strstr(out, "job1/c") && !strstr(out, "job1/a") && !strstr(out, "job2/b"));
    free(out);
    out = td_ctl(&d, "--json buffers --state sealed", -1);
    ck_assert(strstr(out, "job2/b") && !strstr(out, "job1/"));
    free(out);
    char args_pid[64];
    snprintf(args_pid, sizeof(args_pid), "--json clients --pid %d", (int)getpid());
    out = td_ctl(&d, args_pid, 0);
    ck_assert_msg(strstr(out, "\"references\":3") != NULL, "got %s", out);
    free(out);
    free(td_ctl(&d, "--state bogus buffers 2>/dev/null", 2));
    gpubuf_release(a);
    gpubuf_release(b);
    gpubuf_release(x);
    td_disconnect_stop(&d, c);
}
END_TEST

int main(void) {
    Suite *s = suite_create("service");
    TCase *t = add_case(s, "systemd", mkdir_tmp, rm_tmp, 60);
#ifdef GPUBUF_TEST_SYSTEMD
    add_tests(t, socket_activation, notify_ready_watchdog_stopping);
#endif
    add_tests(t, sighup_reloads_limits, metrics_parse_as_prometheus_text, gpubufctl_filters);
    return run_suite(s);
}
