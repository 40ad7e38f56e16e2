#include "fdstore.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void fsd_init(fake_sd *m) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memset(m, 0, sizeof(*m));
    td_mkdtemp(m->d.dir, "fsd");
    snprintf(m->d.socket, sizeof(m->d.socket), "%s/gpubufd.sock", m->d.dir);
    snprintf(m->notify, sizeof(m->notify), "%s/notify.sock", m->d.dir);
    memcpy(sa.sun_path, m->notify, strlen(m->notify) + 1);
    m->nfd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(m->nfd, 0);
    ck_assert_int_eq(bind(m->nfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    /* Room for every slab's message while the test looks elsewhere. */
    int big = 4 << 20;
    setsockopt(m->nfd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
}

static int find(const fake_sd *m, const char *name) {
    for (int i = 0; i < m->n; i++)
        if (strcmp(m->names[i], name) == 0)
            return i;
    return -1;
}

static void drop(fake_sd *m, int i) {
    close(m->fds[i]);
    m->n--;
    m->fds[i] = m->fds[m->n];
    memcpy(m->names[i], m->names[m->n], sizeof(m->names[i]));
}

/* The value of key in a notify message ("" when absent). */
static void value(const char *msg, const char *key, char *out, size_t n) {
    size_t kl = strlen(key);
    out[0] = '\0';
    for (const char *p = msg; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, key, kl) == 0 && p[kl] == '=') {
            const char *v = p + kl + 1, *e = strchr(v, '\n');
            size_t len = e ? (size_t)(e - v) : strlen(v);
            if (len >= n)
                len = n - 1;
            memcpy(out, v, len);
            out[len] = '\0';
            return;
        }
    }
}

/* One message: store or remove fds as systemd does (a name stored again
 * replaces the entry: the daemon re-sends the same fds after a restart). */
static void handle(fake_sd *m, const char *msg, int *fds, int n_fds) {
    char name[64], flag[8];
    value(msg, "FDNAME", name, sizeof(name));
    if (!name[0])
        snprintf(name, sizeof(name), "stored");
    value(msg, "FDSTORE", flag, sizeof(flag));
    if (strcmp(flag, "1") == 0) {
        for (int i = 0; i < n_fds; i++) {
            int k = find(m, name);
            if (k >= 0)
                drop(m, k);
            ck_assert_int_lt(m->n, FSD_MAX);
            snprintf(m->names[m->n], sizeof(m->names[0]), "%s", name);
            m->fds[m->n++] = fds[i];
        }
        return;
    }
    for (int i = 0; i < n_fds; i++)
        close(fds[i]);
    value(msg, "FDSTOREREMOVE", flag, sizeof(flag));
    if (strcmp(flag, "1") == 0) {
        int k;
        while ((k = find(m, name)) >= 0)
            drop(m, k);
    }
}

bool fsd_wait(fake_sd *m, const char *what, int ms) {
    for (;;) {
        struct pollfd p = {.fd = m->nfd, .events = POLLIN};
        if (poll(&p, 1, ms) <= 0)
            return false;
        char buf[4096];
        union {
            char c[CMSG_SPACE(sizeof(int) * 16)];
            struct cmsghdr align;
        } u;
        struct iovec iov = {.iov_base = buf, .iov_len = sizeof(buf) - 1};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.c,
                             .msg_controllen = sizeof(u.c)};
        ssize_t got = recvmsg(m->nfd, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (got < 0)
            continue;
        buf[got] = '\0';
        int fds[16], n_fds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            int k = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < k && n_fds < 16; i++)
                memcpy(&fds[n_fds++], CMSG_DATA(c) + (size_t)i * sizeof(int), sizeof(int));
        }
        handle(m, buf, fds, n_fds);
        size_t keep = strlen(buf) < sizeof(m->last) ? strlen(buf) : sizeof(m->last) - 1;
        memcpy(m->last, buf, keep);
        m->last[keep] = '\0';
        if (what && strstr(buf, what))
            return true;
    }
}

void fsd_start(fake_sd *m, const char *const *args) {
    const char *argv[64];
    char names[FSD_MAX * 64 + 1] = "", nfds[16];
    int n = 0;
    argv[n++] = GPUBUFD_PATH;
    argv[n++] = "--socket";
    argv[n++] = m->d.socket;
    argv[n++] = "--log-level";
    argv[n++] = getenv("GPUBUF_TEST_LOG") ? getenv("GPUBUF_TEST_LOG") : "notice";
    for (int i = 0; args && args[i] && n < 62; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    for (int i = 0; i < m->n; i++) {
        strcat(names, i ? ":" : "");
        strcat(names, m->names[i]);
    }
    snprintf(nfds, sizeof(nfds), "%d", m->n);
    m->d.pid = fork();
    ck_assert_int_ge(m->d.pid, 0);
    if (m->d.pid == 0) {
        /* fds 3.. in store order, as systemd passes them. */
        int high[FSD_MAX];
        for (int i = 0; i < m->n; i++)
            high[i] = fcntl(m->fds[i], F_DUPFD_CLOEXEC, 3 + FSD_MAX);
        for (int i = 0; i < m->n; i++)
            if (high[i] < 0 || dup2(high[i], 3 + i) < 0)
                _exit(126);
        char pid[16];
        snprintf(pid, sizeof(pid), "%d", (int)getpid());
        setenv("NOTIFY_SOCKET", m->notify, 1);
        if (m->n) {
            setenv("LISTEN_FDS", nfds, 1);
            setenv("LISTEN_FDNAMES", names, 1);
            setenv("LISTEN_PID", pid, 1);
        }
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    /* Time, not tries: fd-store messages come before READY=1. A restart
     * with CUDA pools starts a context and imports every slab first. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        if (ms > 30000)
            break;
        if (fsd_wait(m, "READY=1", 50)) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
            if (getenv("GPUBUF_TEST_VERBOSE") || m->n)
                fprintf(stderr, "fake service manager: READY=1 %.1f ms after the start (%d fds "
                                "passed)\n", ms, m->n);
            return;
        }
        int st;
        if (waitpid(m->d.pid, &st, WNOHANG) == m->d.pid) {
            m->d.pid = 0;
            ck_abort_msg("gpubufd exited at start (status %d)", st);
        }
    }
    ck_abort_msg("gpubufd sent no READY=1");
}

int fsd_kill(fake_sd *m, int sig) {
    int st = 0;
    if (m->d.pid <= 0)
        return -1;
    kill(m->d.pid, sig);
    waitpid(m->d.pid, &st, 0);
    m->d.pid = 0;
    /* What it sent before it went is still queued. */
    while (fsd_wait(m, NULL, 0))
        ;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void fsd_restart_twice(fake_sd *m, const char *const *args,
                       void (*check)(const test_daemon *d, pid_t pid, uint32_t restarts),
                       pid_t pid) {
    ck_assert_int_eq(fsd_kill(m, SIGKILL), 128 + SIGKILL);
    fsd_start(m, args);
    check(&m->d, pid, 1);
    ck_assert_int_eq(fsd_kill(m, SIGTERM), 0);
    fsd_start(m, args);
    check(&m->d, pid, 2);
}

int fsd_count(const fake_sd *m, const char *prefix) {
    int k = 0;
    for (int i = 0; i < m->n; i++)
        k += strncmp(m->names[i], prefix, strlen(prefix)) == 0;
    return k;
}

int fsd_fd(const fake_sd *m, const char *name) {
    int i = find(m, name);
    return i >= 0 ? m->fds[i] : -1;
}

void fsd_delete_last(fake_sd *m, const char *name, const char *pool) {
    gpubuf_client *c = td_connect(&m->d);
    ck_assert_int_eq(gpubuf_delete(c, name), 0);
    gpubuf_disconnect(c);
    gpubuf_status *s = td_status(&m->d);
    ck_assert_uint_eq(s->n_buffers, 0);
    ck_assert_uint_eq(td_find_pool(s, pool)->used, 0);
    gpubuf_status_free(s);
    fsd_wait(m, "FDSTOREREMOVE=1", 2000);
    ck_assert_int_eq(fsd_count(m, "slab-"), 0);
}

void fsd_cleanup(fake_sd *m) {
    if (m->d.pid > 0)
        fsd_kill(m, SIGKILL);
    while (m->n)
        drop(m, 0);
    if (m->nfd >= 0)
        close(m->nfd);
    m->nfd = -1;
    unlink(m->notify);
    unlink(m->d.socket);
    rmdir(m->d.dir);
}

static int read_loop(const test_daemon *d, void *arg) {
    reader *k = arg;
    gpubuf_client *c = NULL;
    gpubuf_buffer *b = NULL;
    long passes = 0, resets = 0;
    close(k->ready[0]);
    close(k->stop[1]);
    if (gpubuf_connect(d->socket, &c) < 0 || gpubuf_open(c, k->name, 10000, &b) < 0 ||
        write(k->ready[1], "r", 1) != 1)
        return 2;
    for (;;) {
        struct pollfd pf = {.fd = k->stop[0], .events = POLLIN};
        if (poll(&pf, 1, 0) > 0)
            break;
        if (k->verify(b, k->arg) != 0)
            return 1;
        passes++;
        gpubuf_buffer_info info;
        int r = gpubuf_stat(c, k->name, &info);
        if (r == -ECONNRESET)
            resets++;
        else if (r < 0 || info.refs < 1) {
            fprintf(stderr, "reader: stat: %s (%s)\n", gpubuf_strerror(r),
                    gpubuf_last_error_message());
            return 3;
        }
    }
    fprintf(stderr, "reader: %ld passes, %ld reconnects seen\n", passes, resets);
    gpubuf_release(b);
    gpubuf_disconnect(c);
    return passes > 0 ? 0 : 4;
}

void reader_start(reader *k, const test_daemon *d) {
    char x;
    ck_assert_int_eq(pipe2(k->ready, O_CLOEXEC), 0);
    ck_assert_int_eq(pipe2(k->stop, O_CLOEXEC), 0);
    k->pid = td_spawn(read_loop, d, k);
    close(k->ready[1]);
    close(k->stop[0]);
    ck_assert_int_eq(read(k->ready[0], &x, 1), 1);
    close(k->ready[0]);
}

int reader_stop(reader *k) {
    close(k->stop[1]);
    return td_wait(k->pid);
}
