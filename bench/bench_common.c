/* Helpers every phase of gpubuf_bench uses (bench.h). */
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

#include "bench.h"
#include "testutil.h"

const char *g_sock;
const char *g_pool = "gpu0";
const char *g_cold_pool = "cold";
const char *g_vmm_pool = "vmm";
int g_quick;
int g_procs = 16;
int g_daemon_pid;
const char *g_ctl;
const char *g_echo_floor;
work_plan *g_plan;
/* This process's row of g_plan's bins: its index in run_workers(), -1 in
 * any other process. */
static int g_worker = -1;

double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void report(const char *name, double *v, int n) {
    qsort(v, (size_t)n, sizeof(*v), cmpd);
    printf("%s_median_us %.2f\n%s_p99_us %.2f\n", name, v[n / 2], name, v[(int)(0.99 * (n - 1))]);
}

gpubuf_client *conn(void) {
    gpubuf_client *c;
    CHECK(gpubuf_connect(g_sock, &c));
    return c;
}

int run_child(void (*fn)(void)) {
    double t0 = now_us();
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        fn();
        fflush(NULL);
        _exit(0);
    }
    int st;
    waitpid(p, &st, 0);
    fprintf(stderr, "bench: phase took %.1f s\n", (now_us() - t0) / 1e6);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

void ops_done(long n) {
    const work_plan *w = g_plan;
    if (!w || g_worker < 0)
        return;
    double b = (now_us() - w->t0) / w->bin_us;
    if (b >= 0 && b < w->n_bins)
        w->bins[(size_t)g_worker * (size_t)w->n_bins + (size_t)b] += n;
}

long run_workers(worker_fn worker, double secs) {
    int p[2], ready[2], go[2];
    if (g_plan)
        secs = g_plan->secs;
    if (pipe(p) < 0 || pipe(ready) < 0 || pipe(go) < 0)
        _exit(1);
    fflush(NULL);
    pid_t *kids = calloc((size_t)g_procs, sizeof(*kids));
    for (int i = 0; i < g_procs; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            g_worker = i;
            worker(i, secs, p[1], ready[1], go[0]);
            _exit(0);
        }
    }
    /* Without our copy of the write end, a read sees EOF if workers die. */
    close(ready[1]);
    for (int i = 0; i < g_procs; i++) {
        char ch;
        if (read(ready[0], &ch, 1) != 1) {
            fprintf(stderr, "bench: a worker died before starting\n");
            _exit(1);
        }
    }
    /* Set before the first worker can read it (after its "g"). */
    if (g_plan)
        g_plan->t0 = now_us();
    for (int i = 0; i < g_procs; i++)
        if (write(go[1], "g", 1) != 1)
            _exit(1);
    if (g_plan && g_plan->during)
        g_plan->during(g_plan);
    long total = 0;
    for (int i = 0; i < g_procs; i++) {
        long ops;
        if (read(p[0], &ops, sizeof(ops)) == sizeof(ops))
            total += ops;
        waitpid(kids[i], NULL, 0);
    }
    free(kids);
    close(p[0]);
    close(p[1]);
    close(ready[0]);
    close(go[0]);
    close(go[1]);
    return total;
}

double workers_ops_per_s(worker_fn worker) {
    double secs = g_plan ? g_plan->secs : g_quick ? 1.0 : 3.0;
    long total = run_workers(worker, secs);
    return (double)total / secs;
}

long daemon_rss_kib(void) {
    return tu_rss_kib(g_daemon_pid);
}

/* Wall time of `gpubufctl --json status` (fork, exec, connect, status,
 * JSON out, output discarded): the median of 11 runs, printed under key. */
void ctl_json_time(const char *key) {
    double t[11];
    if (!g_ctl)
        return;
    for (int i = 0; i < 11; i++) {
        double a = now_us();
        fflush(NULL);
        pid_t k = fork();
        if (k == 0) {
            if (!freopen("/dev/null", "w", stdout))
                _exit(1);
            execl(g_ctl, g_ctl, "--socket", g_sock, "--json", "status", (char *)NULL);
            _exit(127);
        }
        int st;
        waitpid(k, &st, 0);
        t[i] = now_us() - a;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "gpubufctl failed\n");
            return;
        }
    }
    qsort(t, 11, sizeof(double), cmpd);
    printf("%s %.2f\n", key, t[5] / 1000.0);
}

void cleanup_delete(gpubuf_client *c, const char *name) {
    int r = gpubuf_delete(c, name);
    if (r < 0)
        fprintf(stderr, "bench: cleanup: delete %s: %s (%s)\n", name, gpubuf_strerror(r),
                gpubuf_last_error_message());
}

void delete_prefix(int n, const char *prefix) {
    enum { CHUNK = 1000 };
    gpubuf_client *c = conn();
    static char names[CHUNK][64];
    const char *ptr[CHUNK];
    for (int i = 0; i < n; i += CHUNK) {
        int k = n - i < CHUNK ? n - i : CHUNK;
        for (int j = 0; j < k; j++) {
            snprintf(names[j], sizeof(names[j]), "%s/%d", prefix, i + j);
            ptr[j] = names[j];
        }
        int r = gpubuf_delete_many(c, (size_t)k, ptr, NULL, NULL);
        CHECK(r);
        if (r > 0) { /* items that failed: the buffers would stay */
            fprintf(stderr, "bench: %d of %d deletes of %s/... failed\n", r, k, prefix);
            _exit(1);
        }
    }
    gpubuf_disconnect(c);
}
