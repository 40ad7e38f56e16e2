#include "harness.h"

#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "cuda_driver.h"
#include "pattern.h"
#include "testutil.h"
#include "util.h"

void td_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

#define sleep_ms td_sleep_ms

static bool can_connect(const char *path) {
    int fd = rp_connect(path, 0);
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

/* Whether process pid has a handler for SIGTERM (SigCgt in /proc). */
static bool catches_sigterm(pid_t pid) {
    char path[64], line[256];
    unsigned long long mask = 0;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "SigCgt: %llx", &mask) == 1)
            break;
    fclose(f);
    return mask & (1ull << (SIGTERM - 1));
}

/* Start gpubufd on d->socket and wait until it accepts connections and
 * handles SIGTERM (it listens before it sets its handlers: a SIGTERM in
 * between would kill it rather than stop it cleanly). */
static void spawn_daemon(test_daemon *d, const char *const *args) {
    const char *argv[64];
    int n = 0;
    argv[n++] = GPUBUFD_PATH;
    argv[n++] = "--socket";
    argv[n++] = d->socket;
    argv[n++] = "--log-level";
    argv[n++] = getenv("GPUBUF_TEST_LOG") ? getenv("GPUBUF_TEST_LOG") : "warning";
    for (int i = 0; args && args[i] && n < 62; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    d->pid = fork();
    ck_assert_int_ge(d->pid, 0);
    if (d->pid == 0) {
        execv(argv[0], (char *const *)argv);
        fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    for (int i = 0; i < 500; i++) {
        if (can_connect(d->socket) && catches_sigterm(d->pid))
            return;
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            d->pid = 0;
            ck_abort_msg("gpubufd exited at start (status %d)", st);
        }
        sleep_ms(10);
    }
    ck_abort_msg("gpubufd did not start listening on %s", d->socket);
}

void td_start(test_daemon *d, const char *const *args) {
    memset(d, 0, sizeof(*d));
    td_mkdtemp(d->dir, "test");
    snprintf(d->socket, sizeof(d->socket), "%s/gpubufd.sock", d->dir);
    spawn_daemon(d, args);
}

/* SIGTERM (SIGKILL after 10 s), wait; the exit status or -1. */
static int terminate(test_daemon *d) {
    int st = -1;
    if (d->pid > 0) {
        kill(d->pid, SIGTERM);
        for (int i = 0; i < 1000; i++) {
            if (waitpid(d->pid, &st, WNOHANG) == d->pid)
                break;
            if (i == 999) {
                kill(d->pid, SIGKILL);
                waitpid(d->pid, &st, 0);
                st = -1;
            }
            sleep_ms(10);
        }
        d->pid = 0;
    }
    if (st >= 0 && WIFEXITED(st))
        return WEXITSTATUS(st);
    return -1;
}

int td_stop(test_daemon *d) {
    int r = terminate(d);
    unlink(d->socket);
    rmdir(d->dir);
    return r;
}

test_daemon D;

void td_stop_clean(void) {
    ck_assert_int_eq(td_stop(&D), 0);
}

int td_restart(test_daemon *d, const char *const *args) {
    int r = terminate(d);
    spawn_daemon(d, args);
    return r;
}

void td_takeover(test_daemon *d, const char *pool) {
    pid_t old = d->pid;
    fflush(NULL);
    pid_t succ = fork();
    ck_assert_int_ge(succ, 0);
    if (succ == 0) {
        execl(GPUBUFD_PATH, GPUBUFD_PATH, "--socket", d->socket, "--log-level", "notice",
              "--pool", pool, "--takeover", (char *)NULL);
        _exit(127);
    }
    int st = -1;
    ck_assert_int_eq(waitpid(old, &st, 0), old);
    ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the old daemon did not hand over");
    d->pid = succ;
}

static void gate(int p[2], int *child_end, int which) {
    p[0] = p[1] = -1;
    if (!child_end)
        return;
    ck_assert_int_eq(pipe(p), 0);
    *child_end = p[which];
}

void td_gates_open(td_gates *g, int *ready_fd, int *hold_fd, int *go_fd) {
    gate(g->ready, ready_fd, 1);
    gate(g->hold, hold_fd, 0);
    gate(g->go, go_fd, 0);
}

void td_gates_pass(int fd, int n) {
    char bytes[64];
    ck_assert(n > 0 && n <= (int)sizeof(bytes));
    memset(bytes, 'g', (size_t)n);
    ck_assert_int_eq(write(fd, bytes, (size_t)n), n);
}

void td_gates_run(const td_gates *g, pid_t *pids, int n, int (*fn)(const test_daemon *d, void *arg),
                  const test_daemon *d, void *arg) {
    for (int i = 0; i < n; i++)
        pids[i] = td_spawn(fn, d, arg);
    td_gates_pass(g->go[1], n);
    td_gates_ready(g, n);
}

void td_gates_ready(const td_gates *g, int n) {
    for (int i = 0; i < n; i++) {
        char x;
        ck_assert_int_eq(read(g->ready[0], &x, 1), 1);
    }
}

gpubuf_client *td_connect(const test_daemon *d) {
    gpubuf_client *c = NULL;
    int r = gpubuf_connect(d->socket, &c);
    ck_assert_msg(r == 0, "connect: %s (%s)", gpubuf_strerror(r), gpubuf_last_error_message());
    return c;
}

gpubuf_client *td_start_connect(test_daemon *d, const char *const *args) {
    td_start(d, args);
    return td_connect(d);
}

void td_disconnect_stop(test_daemon *d, gpubuf_client *c) {
    gpubuf_disconnect(c);
    ck_assert_int_eq(td_stop(d), 0);
}

int td_connect_alloc(const test_daemon *d, const char *pool, uint64_t size, const char *name,
                     gpubuf_client **ret_c, gpubuf_buffer **ret_b) {
    int r = gpubuf_connect(d->socket, ret_c);
    return r < 0 ? r : gpubuf_alloc(*ret_c, pool, size, name, ret_b);
}

int td_connect_open(const test_daemon *d, const char *name, int timeout_ms, gpubuf_client **ret_c,
                    gpubuf_buffer **ret_b) {
    int r = gpubuf_connect(d->socket, ret_c);
    return r < 0 ? r : gpubuf_open(*ret_c, name, timeout_ms, ret_b);
}

int td_open_once(const test_daemon *d, const char *name, uint64_t id, int timeout_ms,
                 int ready_fd) {
    gpubuf_client *c;
    gpubuf_buffer *b;
    int r = gpubuf_connect(d->socket, &c);
    if (r < 0)
        return r;
    if (ready_fd >= 0 && write(ready_fd, "c", 1) != 1)
        r = -EPIPE;
    else if (name)
        r = gpubuf_open(c, name, timeout_ms, &b);
    else
        r = gpubuf_open_id(c, id, timeout_ms, &b);
    if (r == 0)
        gpubuf_release(b);
    gpubuf_disconnect(c);
    return r;
}

gpubuf_buffer *td_alloc(gpubuf_client *c, const char *pool, uint64_t size, const char *name) {
    gpubuf_buffer *b = NULL;
    int r = gpubuf_alloc(c, pool, size, name, &b);
    ck_assert_msg(r == 0, "alloc %s of %llu bytes: %s (%s)", name ? name : "(no name)",
                  (unsigned long long)size, gpubuf_strerror(r), gpubuf_last_error_message());
    return b;
}

void td_produce(const test_daemon *d, const char *name, uint64_t size, uint32_t seed) {
    gpubuf_client *c = td_connect(d);
    gpubuf_buffer *b = NULL;
    ck_assert_int_eq(gpubuf_alloc(c, "host", size, name, &b), 0);
    td_fill(gpubuf_buffer_host_ptr(b), size, seed);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}

gpubuf_status *td_status(const test_daemon *d) {
    gpubuf_client *c = td_connect(d);
    gpubuf_status *s = NULL;
    int r = gpubuf_status_get(c, &s);
    ck_assert_msg(r == 0, "status: %s", gpubuf_strerror(r));
    gpubuf_disconnect(c);
    return s;
}

const gpubuf_status_buffer *td_find_buffer(const gpubuf_status *s, const char *name) {
    /* "/POOL/NAME": NAME in POOL; a plain name: the first of that name. */
    const char *slash = name[0] == '/' ? strchr(name + 1, '/') : NULL;
    size_t pl = slash ? (size_t)(slash - name - 1) : 0;
    for (size_t i = 0; i < s->n_buffers; i++) {
        const gpubuf_status_buffer *b = &s->buffers[i];
        if (slash ? strcmp(b->name, slash + 1) == 0 && strlen(b->pool) == pl &&
                        strncmp(b->pool, name + 1, pl) == 0
                  : strcmp(b->name, name) == 0)
            return b;
    }
    return NULL;
}

const gpubuf_pool_info *td_find_pool(const gpubuf_status *s, const char *name) {
    for (size_t i = 0; i < s->n_pools; i++)
        if (strcmp(s->pools[i].name, name) == 0)
            return &s->pools[i];
    return NULL;
}

/* Every td_wait_* with a bound waits at least 20 s: it returns as soon as
 * what it waits for holds, so a long bound costs a passing test nothing,
 * and a loaded machine (CI runs beside other work) must not fail a test
 * whose daemon is only slow. A bound of 0 stays a single look. A test that
 * measures a duration does not use these. */
static int patient(int timeout_ms) {
    return timeout_ms > 0 && timeout_ms < 20000 ? 20000 : timeout_ms;
}

bool td_wait_clients(const test_daemon *d, size_t n, int timeout_ms) {
    timeout_ms = patient(timeout_ms);
    for (int waited = 0; waited <= timeout_ms; waited += 5) {
        gpubuf_status *s = td_status(d);
        /* The status connection itself is listed too. */
        bool ok = s->n_clients == n + 1;
        gpubuf_status_free(s);
        if (ok)
            return true;
        sleep_ms(5);
    }
    return false;
}

/* Opens waiting for a seal, summed over the daemon's clients, from the
 * status reply on the wire (waiting_opens); -1 when status fails. */
static long waiting_opens(const test_daemon *d) {
    gpubuf_client *c;
    Gpubuf__Request req = GPUBUF__REQUEST__INIT;
    Gpubuf__StatusRequest st = GPUBUF__STATUS_REQUEST__INIT;
    Gpubuf__Response *resp = NULL;
    long n = -1;
    int fd;
    if (gpubuf_connect(d->socket, &c) < 0)
        return -1;
    req.body_case = GPUBUF__REQUEST__BODY_STATUS;
    req.status = &st;
    pthread_mutex_lock(&c->lock);
    if (gpubuf__rpc_locked(c, &req, &resp, &fd) == 0) {
        n = 0;
        if (resp->status_reply)
            for (size_t i = 0; i < resp->status_reply->n_clients; i++)
                n += resp->status_reply->clients[i]->waiting_opens;
        gpubuf__response__free_unpacked(resp, NULL);
        if (fd >= 0)
            close(fd);
    }
    pthread_mutex_unlock(&c->lock);
    gpubuf_disconnect(c);
    return n;
}

bool td_wait_waiting_opens(const test_daemon *d, long n, int timeout_ms) {
    timeout_ms = patient(timeout_ms);
    for (int waited = 0; waited <= timeout_ms; waited += 5) {
        if (waiting_opens(d) == n)
            return true;
        sleep_ms(5);
    }
    return false;
}

uint64_t td_requests(const test_daemon *d, const char *type) {
    gpubuf_status *s = td_status(d);
    uint64_t n = 0;
    for (size_t i = 0; i < s->counters.n_requests; i++)
        if (strcmp(s->counters.requests[i].type, type) == 0)
            n = s->counters.requests[i].requests;
    gpubuf_status_free(s);
    return n;
}

bool td_wait_requests(const test_daemon *d, const char *type, uint64_t since, uint64_t n,
                      int timeout_ms) {
    timeout_ms = patient(timeout_ms);
    /* Each poll (and the one that gave since) is a hello and a status. */
    uint64_t own = strcmp(type, "status") == 0 || strcmp(type, "hello") == 0;
    for (int waited = 0; waited <= timeout_ms; waited += 5) {
        if (td_requests(d, type) >= since + n + own)
            return true;
        own += strcmp(type, "status") == 0 || strcmp(type, "hello") == 0;
        sleep_ms(5);
    }
    return false;
}

bool td_wait_client_pid(const test_daemon *d, pid_t pid, int timeout_ms) {
    timeout_ms = patient(timeout_ms);
    for (int waited = 0; waited <= timeout_ms; waited += 5) {
        gpubuf_status *s = td_status(d);
        bool ok = false;
        for (size_t i = 0; i < s->n_clients; i++)
            ok = ok || s->clients[i].pid == (int)pid;
        gpubuf_status_free(s);
        if (ok)
            return true;
        sleep_ms(5);
    }
    return false;
}

/* The number of clients the daemon lists, asked over the raw connection fd. */
static size_t raw_n_clients(int fd) {
    Gpubuf__StatusRequest st = GPUBUF__STATUS_REQUEST__INIT;
    Gpubuf__Request req = rp_request(2, GPUBUF__REQUEST__BODY_STATUS, &st);
    Gpubuf__Response *r = td_raw_expect(fd, &req, GPUBUF__RESPONSE__BODY_STATUS_REPLY);
    size_t n = r->status_reply->n_clients;
    gpubuf__response__free_unpacked(r, NULL);
    return n;
}

bool td_wait_connect(const char *path, gpubuf_client **ret, int timeout_ms) {
    timeout_ms = patient(timeout_ms);
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        if (gpubuf_connect(path, ret) == 0)
            return true;
        sleep_ms(10);
    }
    *ret = NULL;
    return false;
}

bool td_wait_file_has(const char *path, const char *text, int timeout_ms) {
    timeout_ms = patient(timeout_ms);
    for (int waited = 0; waited <= timeout_ms; waited += 10) {
        FILE *f = fopen(path, "r");
        if (f) {
            char buf[1 << 16];
            size_t n = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
            buf[n] = '\0';
            if (strstr(buf, text))
                return true;
        }
        sleep_ms(10);
    }
    return false;
}

int td_quiet_fds(const test_daemon *d, size_t n, int timeout_ms) {
    int fd = td_raw_connect(d, 5), fds = -1;
    td_raw_hello(fd);
    for (int waited = 0; waited <= timeout_ms; waited += 5) {
        if (raw_n_clients(fd) == n + 1) {
            raw_n_clients(fd);
            fds = td_count_fds(d->pid) - 1;
            break;
        }
        sleep_ms(5);
    }
    close(fd);
    return fds;
}

pid_t td_spawn(int (*fn)(const test_daemon *d, void *arg), const test_daemon *d, void *arg) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0)
        _exit(fn(d, arg));
    return pid;
}

int td_wait(pid_t pid) {
    int st;
    if (waitpid(pid, &st, 0) != pid)
        return -1;
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return -1;
}

void td_fill(void *p, uint64_t len, uint32_t seed) {
    gpubuf_pattern_fill(p, len, seed);
}

uint64_t td_mismatches(const void *p, uint64_t len, uint32_t seed) {
    return gpubuf_pattern_mismatches(p, len, seed);
}

bool td_wait_refs(const test_daemon *d, const char *name, uint32_t refs, int timeout_ms) {
    timeout_ms = patient(timeout_ms);
    for (int t = 0; t <= timeout_ms; t += 5) {
        gpubuf_status *s = td_status(d);
        const gpubuf_status_buffer *b = td_find_buffer(s, name);
        bool ok = b && b->refs == refs;
        gpubuf_status_free(s);
        if (ok)
            return true;
        td_sleep_ms(5);
    }
    return false;
}

int td_count_fds(pid_t pid) {
    char path[64];
    int n = 0;
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    if (!dir)
        return -1;
    while (readdir(dir))
        n++;
    closedir(dir);
    return n;
}

long td_rss_kib(pid_t pid) {
    return tu_rss_kib((int)pid);
}

/* The GPUs this process would see, asked in a child so that this process
 * never initialises CUDA: their number and UUIDs. */
int td_probe_gpus(char uuids[][41], int max) {
#ifdef GPUBUF_HAVE_CUDA
    int p[2];
    if (pipe(p) < 0)
        return 0;
    fflush(NULL);
    pid_t k = fork();
    if (k == 0) {
        const gpubuf_cuda *cu;
        int n = 0;
        close(p[0]);
        if (gpubuf_cuda_load(&cu) < 0 || cu->DeviceGetCount(&n) != CUDA_SUCCESS)
            n = 0;
        if (n > max)
            n = max;
        if (write(p[1], &n, sizeof(n)) != sizeof(n))
            _exit(1);
        for (int i = 0; i < n; i++) {
            CUdevice d;
            CUuuid u;
            char out[41];
            if (cu->DeviceGet(&d, i) != CUDA_SUCCESS || cu->DeviceGetUuid(&u, d) != CUDA_SUCCESS)
                _exit(1);
            gpubuf_format_uuid((const uint8_t *)u.bytes, out);
            if (write(p[1], out, sizeof(out)) != sizeof(out))
                _exit(1);
        }
        _exit(0);
    }
    close(p[1]);
    int n = 0;
    if (read(p[0], &n, sizeof(n)) != sizeof(n))
        n = 0;
    for (int i = 0; i < n; i++)
        if (read(p[0], uuids[i], 41) != 41)
            n = 0;
    close(p[0]);
    if (td_wait(k) != 0)
        n = 0;
    return n;
#else
    return 0;
#endif
}

int td_run(const char *const *argv) {
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return td_wait(p);
}

int td_write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

void td_mkdtemp(char dir[64], const char *what) {
    snprintf(dir, 64, "/tmp/gpubuf-%s-XXXXXX", what);
    ck_assert_msg(mkdtemp(dir) != NULL, "mkdtemp %s: %s", dir, strerror(errno));
}

void td_rmtree(const char *dir) {
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}

char *td_capture(const char *cmd, int *ret_code) {
    FILE *f = popen(cmd, "r");
    size_t cap = 1 << 16, len = 0, n;
    char *out = malloc(cap);
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(out);
    while ((n = fread(out + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 4096) {
            cap *= 2;
            out = realloc(out, cap);
            ck_assert_ptr_nonnull(out);
        }
    }
    out[len] = '\0';
    int st = pclose(f);
    *ret_code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    return out;
}

char *td_capture_exit(const char *cmd, int want) {
    int code;
    char *out = td_capture(cmd, &code);
    ck_assert_msg(want < 0 || code == want, "%s: exit %d (not %d): %s", cmd, code, want, out);
    return out;
}

char *td_ctl(const test_daemon *d, const char *args, int want) {
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), "%s --socket %s %s", GPUBUFCTL_PATH,
             d ? d->socket : "/nonexistent.sock", args);
    return td_capture_exit(cmd, want);
}

static void copy_file(const char *from, const char *to) {
    int in = open(from, O_RDONLY | O_CLOEXEC);
    ck_assert_msg(in >= 0, "open %s: %s", from, strerror(errno));
    int out = open(to, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    ck_assert_msg(out >= 0, "create %s: %s", to, strerror(errno));
    char buf[1 << 16];
    ssize_t n;
    while ((n = read(in, buf, sizeof(buf))) > 0)
        ck_assert_int_eq(write(out, buf, (size_t)n), n);
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(fchmod(out, 0755), 0); /* whatever the umask */
    close(in);
    close(out);
}

char *td_stage_public(const char *exe, char dir[64]) {
    td_mkdtemp(dir, "stage");
    ck_assert_int_eq(chmod(dir, 0755), 0);
    char *from = strdup(exe), *slash = strrchr(from, '/');
    ck_assert_ptr_nonnull(slash);
    char to[4096];
    snprintf(to, sizeof(to), "%s/%s", dir, slash + 1);
    copy_file(exe, to);
    *slash = '\0';
    DIR *d = opendir(from);
    ck_assert_ptr_nonnull(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        char src[4096], dst[4096];
        struct stat st;
        if (strncmp(e->d_name, "lib", 3) != 0 || !strstr(e->d_name, ".so"))
            continue;
        snprintf(src, sizeof(src), "%s/%s", from, e->d_name);
        snprintf(dst, sizeof(dst), "%s/%s", dir, e->d_name);
        if (stat(src, &st) == 0 && S_ISREG(st.st_mode))
            copy_file(src, dst);
    }
    closedir(d);
    free(from);
    return strdup(to);
}

void td_unstage(const char *dir) {
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        char p[4096];
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

int td_count(const char *haystack, const char *needle) {
    int n = 0;
    for (const char *p = haystack; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

int td_raw_connect(const test_daemon *d, int timeout_s) {
    int fd = rp_connect(d->socket, timeout_s);
    ck_assert_msg(fd >= 0, "connect %s: %s", d->socket, strerror(-fd));
    return fd;
}

void td_raw_send(int fd, const Gpubuf__Request *req) {
    ck_assert_int_eq(rp_send(fd, req, -1), 0);
}

Gpubuf__Response *td_raw_expect(int fd, const Gpubuf__Request *req, int body_case) {
    td_raw_send(fd, req);
    Gpubuf__Response *r = rp_recv(fd, NULL);
    ck_assert_ptr_nonnull(r);
    ck_assert_int_eq(r->status, 0);
    ck_assert_int_eq(r->body_case, body_case);
    return r;
}

Gpubuf__Response *td_raw_hello_caps(int fd, uint64_t caps) {
    rp_hello h;
    rp_hello_init(&h, caps, NULL);
    Gpubuf__Response *r = td_raw_expect(fd, &h.req, GPUBUF__RESPONSE__BODY_HELLO);
    ck_assert_uint_eq(r->hello->version, 1);
    return r;
}

void td_raw_status(int fd, const Gpubuf__Request *req, int status) {
    td_raw_send(fd, req);
    Gpubuf__Response *r = rp_recv(fd, NULL);
    ck_assert_msg(r != NULL, "no response to request %llu", (unsigned long long)req->id);
    ck_assert_uint_eq(r->id, req->id);
    ck_assert_int_eq(r->status, status);
    gpubuf__response__free_unpacked(r, NULL);
}

void td_raw_hello(int fd) {
    gpubuf__response__free_unpacked(td_raw_hello_caps(fd, 0), NULL);
}

void td_figure(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if ((size_t)n > sizeof(line) - 2)
        n = (int)sizeof(line) - 2;
    line[n++] = '\n';
    line[n] = '\0';
    fputs(line, stdout);
    fflush(stdout);
    const char *path = getenv("GPUBUF_FIGURES");
    if (!path || !*path)
        return;
    /* One write per line: tests running side by side do not mix lines. */
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0) {
        (void)!write(fd, line, (size_t)n);
        close(fd);
    }
}
