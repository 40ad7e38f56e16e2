/* Recovery time of gpubufd: from the start of a successor (gpubufd
 * --takeover) to serving a restored buffer, for N buffers in one pool,
 * against the anchor of a fresh start (no state) to serving, measured in
 * the same run. Also the cost of allocating (each change is journalled
 * before it is answered).
 *
 *   gpubuf_restart_bench --gpubufd PATH --socket PATH [--pool NAME=KIND,...]
 *                        [--buffers N] [--size BYTES]
 *
 * Prints "key value" lines (bench/run.sh --only restart). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_opts.h"
#include "gpubuf/gpubuf.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static const char *g_gpubufd, *g_socket, *g_pool = "bench=host,capacity=2G", *g_log;

/* The pool's name: what comes before '=' in --pool. */
static char g_pool_name[64];

static pid_t spawn(bool takeover) {
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(g_log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0)
            dup2(fd, 2);
        execl(g_gpubufd, g_gpubufd, "--socket", g_socket, "--log-level", "info", "--pool",
              g_pool, takeover ? "--takeover" : NULL, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Connect, and with name, stat it: 0 once the daemon serves it. */
static int serves(const char *name) {
    gpubuf_client *c = NULL;
    gpubuf_buffer_info info;
    if (gpubuf_connect(g_socket, &c) < 0)
        return -1;
    int r = name ? gpubuf_stat(c, name, &info) : 0;
    gpubuf_disconnect(c);
    return r;
}

/* Whether the log has a line containing what. */
static bool logged(const char *what) {
    FILE *f = fopen(g_log, "r");
    char line[1024];
    bool found = false;
    while (f && !found && fgets(line, sizeof(line), f))
        found = strstr(line, what) != NULL;
    if (f)
        fclose(f);
    return found;
}

/* The number the log writes after `after` on the first (or the last) line
 * with `key` (e.g. "restart 1: restored", " in "), or -1. */
static double logged_figure(const char *key, const char *after, bool last) {
    FILE *f = fopen(g_log, "r");
    char line[1024];
    double v = -1;
    while (f && (last || v < 0) && fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, key);
        const char *at = p ? strstr(p, after) : NULL;
        if (at)
            v = strtod(at + strlen(after), NULL);
    }
    if (f)
        fclose(f);
    return v;
}

static pid_t g_old, g_succ;

static int fail(const char *why) {
    fprintf(stderr, "restart_bench: %s (see %s)\n", why, g_log);
    if (g_old > 0)
        kill(g_old, SIGKILL);
    if (g_succ > 0)
        kill(g_succ, SIGKILL);
    return 1;
}

int main(int argc, char **argv) {
    long n = 100000, size = 4096;
    const bench_opt opts[] = {
        {"gpubufd", 0, BENCH_OPT_STR, &g_gpubufd}, {"socket", 0, BENCH_OPT_STR, &g_socket},
        {"pool", 0, BENCH_OPT_STR, &g_pool},       {"buffers", 0, BENCH_OPT_LONG, &n},
        {"size", 0, BENCH_OPT_LONG, &size},
    };
    char log[512];
    if (bench_opts_parse(argc, argv, opts, sizeof(opts) / sizeof(opts[0])) < 0)
        return 2;
    if (!g_gpubufd || !g_socket || n <= 0 || size <= 0) {
        fprintf(stderr, "usage: gpubuf_restart_bench --gpubufd PATH --socket PATH "
                        "[--pool NAME=KIND,...] [--buffers N] [--size BYTES]\n");
        return 2;
    }
    snprintf(g_pool_name, sizeof(g_pool_name), "%.*s", (int)strcspn(g_pool, "="), g_pool);
    snprintf(log, sizeof(log), "%s.log", g_socket);
    g_log = log;
    unlink(g_log);
    char kind[32];
    const char *k = strchr(g_pool, '=') ? strchr(g_pool, '=') + 1 : "unknown";
    snprintf(kind, sizeof(kind), "%.*s", (int)strcspn(k, ","), k);
    for (char *x = kind; *x; x++)
        if (*x == '-')
            *x = '_';

    /* Anchor: a fresh start to serving. */
    double t0 = now_ms();
    pid_t old = g_old = spawn(false);
    while (serves(NULL) < 0)
        if (now_ms() - t0 > 30000 || waitpid(old, NULL, WNOHANG) == old)
            return fail("gpubufd did not start");
    double fresh = now_ms() - t0;

    /* N named buffers, sealed, no reference held. */
    gpubuf_client *c = NULL;
    if (gpubuf_connect(g_socket, &c) < 0)
        return fail(gpubuf_last_error_message());
    t0 = now_ms();
    for (long i = 0; i < n; i++) {
        char name[64];
        gpubuf_buffer *b = NULL;
        snprintf(name, sizeof(name), "r/%ld", i);
        if (gpubuf_alloc(c, g_pool_name, (uint64_t)size, name, &b) < 0 || gpubuf_seal(b) < 0)
            return fail(gpubuf_last_error_message());
        gpubuf_release(b);
    }
    gpubuf_flush(c);
    double fill = now_ms() - t0;
    gpubuf_disconnect(c);

    /* The successor: from its start until it listens on the socket it took
     * (it has restored everything by then; the old daemon stopped taking
     * connections when it handed the socket over). */
    char last[64];
    snprintf(last, sizeof(last), "r/%ld", n - 1);
    t0 = now_ms();
    pid_t succ = g_succ = spawn(true);
    while (!logged("listening on the socket passed by the previous gpubufd")) {
        if (now_ms() - t0 > 60000 || waitpid(succ, NULL, WNOHANG) == succ)
            return fail("the takeover did not serve");
        usleep(200);
    }
    double took = now_ms() - t0;
    waitpid(old, NULL, 0);
    g_old = 0;
    if (serves(last) != 0)
        return fail("the last buffer is not served after the takeover");
    gpubuf_status *st = NULL;
    c = NULL;
    long restored = -1;
    if (gpubuf_connect(g_socket, &c) == 0 && gpubuf_status_get(c, &st) == 0)
        restored = (long)st->restored_buffers;
    gpubuf_status_free(st);
    gpubuf_disconnect(c);
    kill(succ, SIGTERM);
    waitpid(succ, NULL, 0);
    g_succ = 0;
    if (restored != n)
        return fail("not every buffer was restored");
    printf("restart_%s_buffers %ld\n", kind, n);
    printf("restart_%s_fresh_start_ms %.1f\n", kind, fresh);
    printf("restart_%s_takeover_to_serving_ms %.1f\n", kind, took);
    printf("restart_%s_restore_logged_ms %.1f\n", kind, logged_figure("restart 1: restored", " in ", false));
    printf("restart_%s_snapshot_write_ms %.1f\n", kind,
           logged_figure("saved state: a snapshot of", " made in ", true));
    printf("restart_%s_snapshot_bytes %.0f\n", kind,
           logged_figure("saved state: a snapshot of", "a snapshot of ", true));
    printf("restart_%s_records_replayed %.0f\n", kind,
           logged_figure("restart 1: restored", "from ", false));
    printf("restart_%s_journal_group_us %.2f\n", kind,
           logged_figure("journal entries in", "group(s), ", false));
    printf("restart_%s_ratio_to_fresh %.1f\n", kind, took / fresh);
    printf("restart_%s_alloc_seal_us %.2f\n", kind, fill * 1e3 / (double)n);
    unlink(g_log);
    return 0;
}
