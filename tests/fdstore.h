/* A service manager for tests: speaks systemd's notify and fd-store
 * protocol the way systemd does. gpubufd runs with NOTIFY_SOCKET pointing
 * at a datagram socket of the test; FDSTORE=1 messages (FDNAME=..., the fds
 * by SCM_RIGHTS) fill the store, FDSTOREREMOVE=1 empties entries of it, and
 * a restart passes the stored fds as systemd does (fds 3.., LISTEN_FDS,
 * LISTEN_FDNAMES, LISTEN_PID). */
#ifndef GPUBUF_TEST_FDSTORE_H
#define GPUBUF_TEST_FDSTORE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness.h"

#define FSD_MAX 256

typedef struct fake_sd {
    test_daemon d; /* dir, socket, pid of the running gpubufd */
    char notify[128];
    int nfd; /* the notify socket */
    int n;   /* stored fds */
    char names[FSD_MAX][64];
    int fds[FSD_MAX];
    char last[512]; /* the last message */
} fake_sd;

/* A temporary directory, the socket path and the notify socket. */
void fsd_init(fake_sd *m);
/* Start gpubufd (args after the socket and log level) with the stored fds;
 * wait for READY=1 (aborts the test if it does not come). */
void fsd_start(fake_sd *m, const char *const *args);
/* Receive notify messages until one contains what (NULL: none, just pump)
 * or ms pass. */
bool fsd_wait(fake_sd *m, const char *what, int ms);
/* Send sig to the daemon, wait for its end and read what it sent before;
 * its exit code, or 128 + signal. */
int fsd_kill(fake_sd *m, int sig);
/* Restart the daemon (args as for fsd_start) by SIGKILL, then again by
 * SIGTERM; after each start, check(&m->d, pid, n), n the restarts so far
 * (1, then 2), sees that the client of process pid resumed. */
void fsd_restart_twice(fake_sd *m, const char *const *args,
                       void (*check)(const test_daemon *d, pid_t pid, uint32_t restarts),
                       pid_t pid);
/* Stored fds whose name starts with prefix. */
int fsd_count(const fake_sd *m, const char *prefix);
/* The stored fd named name, or -1. */
int fsd_fd(const fake_sd *m, const char *name);
/* Delete buffer `name` (the last in the daemon): no buffer and no bytes in
 * `pool` are left, and the store lets its slab go. */
void fsd_delete_last(fake_sd *m, const char *name, const char *pool);
/* Stop the daemon if it runs, close the store, remove the directory. */
void fsd_cleanup(fake_sd *m);

/* A reader for restart tests: a child process that opens `name`, checks
 * its contents with verify() over and over and stats it (which reconnects
 * after a restart), until reader_stop(). */
typedef struct reader {
    int ready[2], stop[2];
    pid_t pid;
    const char *name;
    /* 0 when b's contents are right. */
    int (*verify)(const gpubuf_buffer *b, void *arg);
    void *arg;
} reader;

/* Start it and wait until it holds its view (aborts the test on failure). */
void reader_start(reader *k, const test_daemon *d);
/* Stop it: its exit code (0: every pass matched; 1: a mismatch; 2: the
 * open failed; 3: a request failed other than with -ECONNRESET; 4: no pass). */
int reader_stop(reader *k);

#endif
