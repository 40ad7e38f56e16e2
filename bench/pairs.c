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
 * each other within a second or two, from one process. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

static const char *const order[] = {"off", "on", "on", "off", "off", "on", "on", "off"};

/* The daemon's messages about SIGUSR2 in log: how many, and whether the last
 * says the journal is on (1), off (0), or something else (-1: the switch
 * failed; no message: on, as state_journal = switchable starts). */
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
static int switch_journal(const char *log, int on) {
    int n, state = journal_said(log, &n);
    if (state == on)
        return 0;
    if (state < -1)
        return -1;
    if (kill(g_daemon_pid, SIGUSR2) < 0) {
        fprintf(stderr, "bench: SIGUSR2 to gpubufd (pid %d): %s\n", g_daemon_pid, strerror(errno));
        return -1;
    }
    for (int i = 0; i < 3000; i++) {
        int m;
        state = journal_said(log, &m);
        if (m > n)
            break;
        nanosleep(&(struct timespec){.tv_nsec = 10 * 1000 * 1000}, NULL);
    }
    if (state != on) {
        fprintf(stderr, "bench: gpubufd did not switch its journal %s (see %s)\n",
                on ? "on" : "off", log);
        return -1;
    }
    return 0;
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

int run_pairs(const char *dir, const char *log, const bench_phase *const *phases, size_t n) {
    enum { ROUNDS = sizeof(order) / sizeof(order[0]) };
    if (!log || g_daemon_pid <= 0) {
        fprintf(stderr, "bench: --pairs needs --daemon-log and --daemon-pid\n");
        return -1;
    }
    int failed = 0;
    for (size_t i = 0; i < n; i++) {
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
    }
    /* The daemon goes on as it started: with its journal. */
    if (switch_journal(log, 1) < 0)
        return -1;
    return failed ? -1 : 0;
}
