/* --pairs DIR: the journal pairs, measured in one bench process.
 *
 * gpubufd runs with state_journal = switchable (a key for measurement only:
 * SIGUSR2 turns its journal off, and on again after a whole snapshot). For
 * each phase asked for, in turn, this runs the phase 8 times, the journal
 * off, on, on, off, off, on, on, off, switching it between runs, and
 * appends each run's figures to DIR/off-K.txt or DIR/on-K.txt (K = 1..8),
 * the files bench/report.py reads.
 *
 * Why here and not one bench process per round (as bench/run.sh did until
 * 2026-12-03): the rounds of one side spread by up to a third on the H200,
 * a stat round trip, which the journal does not touch, as much as a batch
 * (docs/performance.md, "Journal pairs run back to back"). The spread
 * followed the round, not the journal: a round started new processes and
 * came seconds after the one before. Here the runs of one phase follow
 * each other within a second or two, from one process.
 *
 * The phases of 16 processes (a rate_key) still spread by a fifth to a
 * third between such runs of 3 s, and slow spells of a few seconds fell on
 * two neighbouring runs of one side (off 7.77, on 7.16, on 8.74, off 9.98,
 * off 10.27, on 5.53, on 5.40, off 9.43 M ops/s in one run on the H200).
 * They run once for 16 s instead, their time cut into 32 slices of 0.5 s
 * in the order above four times over; the workers count their operations
 * in bins of 10 ms (ops_done), and a slice's rate counts only the bins
 * after gpubufd said it switched, plus one, and before the next switch. A
 * spell of a few seconds then falls on both sides alike. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "bench.h"

static const char *const order[] = {"off", "on", "on", "off", "off", "on", "on", "off"};

/* What gpubufd's journal did while on, from its SIGUSR2 messages that
 * turned it off (daemon/main.c, journal_went_off): summed over the windows
 * that this process opened (its own switch on) for the phase under way. */
typedef struct journal_work {
    double secs;
    unsigned long long groups, bytes, big, big_bytes, big_ns, snaps, snap_ns;
    int windows;
} journal_work;
static journal_work g_work;
/* With GPUBUF_TRACE_TIMING=1: DIR/switches.txt, a line "ns on|off" each
 * time a run's side is in place (CLOCK_MONOTONIC, the trace's clock), and
 * "ns end" when the pairs are done, for bench/trace_timing.py --windows to
 * split a traced run's requests by side. */
static char g_switches[4096];
static int g_switched_on; /* this process turned the journal on, and it is on */
static char g_last_said[1024];

/* The daemon's messages about SIGUSR2 in log: how many, and whether the last
 * says the journal is on (1), off (0), or something else (-1: the switch
 * failed; no message: on, as state_journal = switchable starts). The last
 * one's text is kept in g_last_said. */
static int journal_said(const char *log, int *count) {
    FILE *f = fopen(log, "r");
    if (!f) {
        fprintf(stderr, "bench: --daemon-log %s: %s\n", log, strerror(errno));
        return -2;
    }
    char line[512];
    int state = 1;
    *count = 0;
    while (fgets(line, sizeof(line), f)) {
        const char *p = strstr(line, "SIGUSR2");
        if (!p)
            continue;
        (*count)++;
        snprintf(g_last_said, sizeof(g_last_said), "%s", p);
        if (strstr(p, "SIGUSR2: the journal is on"))
            state = 1;
        else if (strstr(p, "SIGUSR2: the journal is off"))
            state = 0;
        else
            state = -1;
    }
    fclose(f);
    return state;
}

/* Turns gpubufd's journal on (1) or off (0): SIGUSR2 when it is not so, then
 * waits (30 s at most) until its log says it switched. 0, or -1 with a
 * message. */
static int switch_journal_now(const char *log, int on);

/* Appends "ns what" to DIR/switches.txt when the pairs are traced. */
static void mark_side(const char *what) {
    FILE *f = g_switches[0] ? fopen(g_switches, "a") : NULL;
    if (f) {
        fprintf(f, "%.0f %s\n", now_us() * 1e3, what);
        fclose(f);
    }
}

static int switch_journal(const char *log, int on) {
    int r = switch_journal_now(log, on);
    if (r == 0)
        mark_side(on ? "on" : "off");
    return r;
}

static int switch_journal_now(const char *log, int on) {
    int n, state = journal_said(log, &n);
    if (state == on)
        return 0;
    if (state < -1)
        return -1;
    if (kill(g_daemon_pid, SIGUSR2) < 0) {
        fprintf(stderr, "bench: SIGUSR2 to gpubufd (pid %d): %s\n", g_daemon_pid, strerror(errno));
        return -1;
    }
    /* Every millisecond, 30 s at most: a slice (below) counts from when
     * the message is seen. */
    for (int i = 0; i < 30000; i++) {
        int m;
        state = journal_said(log, &m);
        if (m > n)
            break;
        nanosleep(&(struct timespec){.tv_nsec = 1000 * 1000}, NULL);
    }
    if (state != on) {
        fprintf(stderr, "bench: gpubufd did not switch its journal %s (see %s)\n",
                on ? "on" : "off", log);
        return -1;
    }
    const char *w = strstr(g_last_said, "while it was on (");
    journal_work d = {0};
    if (!on && g_switched_on && w &&
        sscanf(w,
               "while it was on (%lf s): %llu groups, %llu bytes; %llu of %*u bytes or more, "
               "%llu bytes, in %llu ns; %llu snapshot(s) in %llu ns",
               &d.secs, &d.groups, &d.bytes, &d.big, &d.big_bytes, &d.big_ns, &d.snaps,
               &d.snap_ns) == 8) {
        g_work.secs += d.secs;
        g_work.groups += d.groups;
        g_work.bytes += d.bytes;
        g_work.big += d.big;
        g_work.big_bytes += d.big_bytes;
        g_work.big_ns += d.big_ns;
        g_work.snaps += d.snaps;
        g_work.snap_ns += d.snap_ns;
        g_work.windows++;
    }
    g_switched_on = on;
    return 0;
}

/* Appends the phase's journal work (g_work, then cleared) to DIR/journal-work.txt,
 * one line that bench/report.py reads, and says it on stderr. */
static void put_work(const char *dir, const char *phase) {
    journal_work *w = &g_work;
    char path[4096];
    snprintf(path, sizeof(path), "%s/journal-work.txt", dir);
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "%s %d %.3f %llu %llu %llu %llu %llu %llu %llu\n", phase, w->windows, w->secs,
                w->groups, w->bytes, w->big, w->big_bytes, w->big_ns, w->snaps, w->snap_ns);
        fclose(f);
    }
    fprintf(stderr,
            "bench: %s: with the journal on (%.1f s, %d windows), gpubufd wrote %llu groups, "
            "%.1f MiB; %llu of 4 KiB or more, %.1f us each (framing, checksum, copy); "
            "%llu snapshot(s), %.1f ms\n",
            phase, w->secs, w->windows, w->groups, (double)w->bytes / 1048576.0, w->big,
            w->big ? (double)w->big_ns / 1e3 / (double)w->big : 0.0, w->snaps,
            (double)w->snap_ns / 1e6);
    *w = (journal_work){0};
}

/* Runs fn with stdout appended to path. */
static int run_into(const char *path, int (*fn)(void)) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "bench: %s: %s\n", path, strerror(errno));
        return -1;
    }
    fflush(stdout);
    int saved = dup(1);
    if (saved < 0 || dup2(fd, 1) < 0) {
        fprintf(stderr, "bench: stdout to %s: %s\n", path, strerror(errno));
        close(fd);
        if (saved >= 0)
            close(saved);
        return -1;
    }
    close(fd);
    int r = fn();
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    return r;
}

enum { ROUNDS = sizeof(order) / sizeof(order[0]), SLICES = 4 * ROUNDS };
static const double SLICE_US = 500e3, BIN_US = 10e3;

/* A sliced run: the log to watch, and when each slice's switch was seen. */
typedef struct slicing {
    const char *log;
    double seen[SLICES]; /* INFINITY: the switch failed, the slice counts nothing */
    int failed;
} slicing;

static void sleep_until_us(double t) {
    long long ns = (long long)(t * 1e3);
    struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000), .tv_nsec = (long)(ns % 1000000000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
        ;
}

/* work_plan.during: at each slice's start, the journal as order[] says. */
static void switch_slices(work_plan *w) {
    slicing *s = w->arg;
    s->seen[0] = w->t0; /* switched before the workers started */
    for (int j = 1; j < SLICES; j++) {
        sleep_until_us(w->t0 + j * SLICE_US);
        if (s->failed || switch_journal(s->log, strcmp(order[j % ROUNDS], "on") == 0) < 0) {
            s->failed = 1;
            s->seen[j] = INFINITY;
            continue;
        }
        s->seen[j] = now_us();
    }
}

/* Appends "key rate" to path. */
static int put_rate(const char *path, const char *key, double rate) {
    FILE *f = fopen(path, "a");
    if (!f) {
        fprintf(stderr, "bench: %s: %s\n", path, strerror(errno));
        return -1;
    }
    fprintf(f, "%s_%dproc %.0f\n", key, g_procs, rate);
    return fclose(f) == 0 ? 0 : -1;
}

/* A phase of workers once, for SLICES slices (see the top of the file):
 * each round's rate into DIR/<side>-K.txt. */
static int run_sliced(const char *dir, const char *log, const bench_phase *ph) {
    size_t n_bins = (size_t)(SLICES * SLICE_US / BIN_US);
    size_t len = sizeof(work_plan) + (size_t)g_procs * n_bins * sizeof(long);
    work_plan *w = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (w == MAP_FAILED) {
        fprintf(stderr, "bench: the bins of %s: %s\n", ph->name, strerror(errno));
        return -1;
    }
    slicing s = {.log = log};
    *w = (work_plan){.secs = SLICES * SLICE_US / 1e6,
                     .bin_us = BIN_US,
                     .n_bins = (int)n_bins,
                     .during = switch_slices,
                     .arg = &s,
                     .bins = (long *)(w + 1)};
    int r = switch_journal(log, strcmp(order[0], "on") == 0);
    if (r == 0) {
        /* The phase's own line (a rate over both sides) is not a round's. */
        g_plan = w;
        r = run_into("/dev/null", ph->run) != 0 ? -1 : 0;
        g_plan = NULL;
    }
    double ops[ROUNDS] = {0}, us[ROUNDS] = {0};
    int dropped = 0;
    for (int j = 0; r == 0 && j < SLICES; j++) {
        /* Whole bins after the switch was seen and one more, up to the next
         * slice's start, when the next switch is sent. */
        double b0 = ceil((s.seen[j] - w->t0) / BIN_US) + 1, b1 = floor((j + 1) * SLICE_US / BIN_US);
        if (!(b0 < b1)) {
            dropped++;
            continue;
        }
        for (int i = 0; i < g_procs; i++)
            for (size_t b = (size_t)b0; b < (size_t)b1; b++)
                ops[j % ROUNDS] += (double)w->bins[(size_t)i * n_bins + b];
        us[j % ROUNDS] += (b1 - b0) * BIN_US;
    }
    for (int k = 0; r == 0 && k < ROUNDS; k++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s-%d.txt", dir, order[k], k + 1);
        if (us[k] > 0 && put_rate(path, ph->rate_key, ops[k] / us[k] * 1e6) < 0)
            r = -1;
    }
    double counted = 0;
    for (int k = 0; k < ROUNDS; k++)
        counted += us[k] / 1e6;
    if (r == 0)
        fprintf(stderr,
                "bench: %s: %d slices of %.1f s, the journal %s four times over; %.2f of "
                "%.1f s counted (after each switch seen), %d slice(s) not at all\n",
                ph->name, SLICES, SLICE_US / 1e6, "off on on off off on on off", counted, w->secs,
                dropped);
    if (s.failed)
        r = -1;
    else
        put_work(dir, ph->name);
    munmap(w, len);
    return r;
}

int run_pairs(const char *dir, const char *log, const bench_phase *const *phases, size_t n) {
    if (!log || g_daemon_pid <= 0) {
        fprintf(stderr, "bench: --pairs needs --daemon-log and --daemon-pid\n");
        return -1;
    }
    int failed = 0;
    const char *tr = getenv("GPUBUF_TRACE_TIMING");
    if (tr && strcmp(tr, "1") == 0)
        snprintf(g_switches, sizeof(g_switches), "%s/switches.txt", dir);
    for (size_t i = 0; i < n; i++) {
        /* A window open when a phase starts (or left by a phase that
         * failed) is not this phase's. */
        g_work = (journal_work){0};
        g_switched_on = 0;
        if (phases[i]->rate_key) {
            if (run_sliced(dir, log, phases[i]) < 0) {
                fprintf(stderr, "bench: phase %s failed in its journal slices\n", phases[i]->name);
                failed = 1;
            }
            continue;
        }
        for (int k = 0; k < ROUNDS; k++) {
            char path[4096];
            snprintf(path, sizeof(path), "%s/%s-%d.txt", dir, order[k], k + 1);
            if (switch_journal(log, strcmp(order[k], "on") == 0) < 0)
                return -1;
            if (run_into(path, phases[i]->run) != 0) {
                fprintf(stderr, "bench: phase %s failed with the journal %s (round %d)\n",
                        phases[i]->name, order[k], k + 1);
                failed = 1;
            }
        }
        fprintf(stderr, "bench: %s: %d rounds, the journal %s\n", phases[i]->name, ROUNDS,
                "off on on off off on on off");
        put_work(dir, phases[i]->name);
    }
    /* The daemon goes on as it started: with its journal. What follows
     * is no pair's: the traced windows end here. */
    mark_side("end");
    g_switches[0] = '\0';
    if (switch_journal(log, 1) < 0)
        return -1;
    return failed ? -1 : 0;
}
