/* Test harness: run a real gpubufd on a temporary socket, and child processes
 * that use the client library. */
#ifndef GPUBUF_TEST_HARNESS_H
#define GPUBUF_TEST_HARNESS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "gpubuf/gpubuf.h"
#include "rawproto.h"

typedef struct test_daemon {
    pid_t pid;
    char dir[64];
    char socket[128];
} test_daemon;

/* The daemon of a suite's checked fixture: the suite's setup starts it
 * (td_start(&D, ...)), td_stop_clean stops it and fails the test unless it
 * exited cleanly. */
extern test_daemon D;
void td_stop_clean(void);

/* Start gpubufd with the given extra arguments (NULL-terminated) on a fresh
 * socket in a temporary directory; waits until it accepts connections.
 * Aborts the test on failure. */
void td_start(test_daemon *d, const char *const *args);
/* SIGTERM, wait, and return the exit status (or -1). Removes the directory. */
int td_stop(test_daemon *d);
/* SIGTERM the daemon, wait for it, and start it again with args on the same
 * socket; returns the old daemon's exit status (or -1). */
int td_restart(test_daemon *d, const char *const *args);
/* Start a successor of d's daemon with `--takeover` and `--pool pool` on the
 * same socket, wait for the old daemon to hand over and exit 0, and make d
 * the successor's. Fails the test otherwise. */
void td_takeover(test_daemon *d, const char *pool);
/* Connect to d, failing the test on error. */
gpubuf_client *td_connect(const test_daemon *d);
/* A NULL-terminated argument list, written in place:
 * td_start(&d, TD_ARGS("--pool", "p=host")). */
#define TD_ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})
/* td_start(d, args), then td_connect(d). */
gpubuf_client *td_start_connect(test_daemon *d, const char *const *args);
/* Disconnect c and stop d (td_stop), failing the test unless it exited
 * cleanly. */
void td_disconnect_stop(test_daemon *d, gpubuf_client *c);

/* For a child process (nothing here fails the test): connect to d and
 * allocate (or open, waiting up to timeout_ms) name, into *ret_c and
 * *ret_b; 0, or the connect's or the call's error. */
int td_connect_alloc(const test_daemon *d, const char *pool, uint64_t size, const char *name,
                     gpubuf_client **ret_c, gpubuf_buffer **ret_b);
int td_connect_open(const test_daemon *d, const char *name, int timeout_ms, gpubuf_client **ret_c,
                    gpubuf_buffer **ret_b);
/* For a child process: connect to d (and write a byte on ready_fd, when
 * >= 0, once connected), open name (name NULL: buffer id) waiting up to
 * timeout_ms, release it and disconnect. Returns the open's result, or the
 * connect's when that failed. */
int td_open_once(const test_daemon *d, const char *name, uint64_t id, int timeout_ms, int ready_fd);

/* Allocate name (NULL: none) of size bytes in pool (NULL: the default) on
 * c; fails the test on error. */
gpubuf_buffer *td_alloc(gpubuf_client *c, const char *pool, uint64_t size, const char *name);

/* Allocate `name` (size bytes) in pool "host" of d, fill it with the
 * pattern of seed (td_fill), seal it and let it go: it stays, sealed, with
 * no reference. */
void td_produce(const test_daemon *d, const char *name, uint64_t size, uint32_t seed);

/* Status helpers (fresh connection each time). A td_wait_* bound of
 * timeout_ms > 0 is at least 20 s (harness.c, patient()): they end as soon
 * as what they wait for holds. */
gpubuf_status *td_status(const test_daemon *d);
/* name: NAME (the first buffer of that name, in any pool) or /POOL/NAME. */
const gpubuf_status_buffer *td_find_buffer(const gpubuf_status *s, const char *name);
const gpubuf_pool_info *td_find_pool(const gpubuf_status *s, const char *name);
/* Wait until the daemon lists exactly n clients (other than the asker). */
bool td_wait_clients(const test_daemon *d, size_t n, int timeout_ms);
/* Poll status until the daemon's clients have n opens waiting for a seal. */
bool td_wait_waiting_opens(const test_daemon *d, long n, int timeout_ms);
/* Requests of type ("status", "open", ...) the daemon handled, from the
 * counters of a status snapshot (which leave out the asking request). */
uint64_t td_requests(const test_daemon *d, const char *type);
/* Poll status until the daemon handled at least n requests of type more
 * than `since` (a td_requests figure), not counting the polls' own. */
bool td_wait_requests(const test_daemon *d, const char *type, uint64_t since, uint64_t n,
                      int timeout_ms);
/* Poll status until the daemon lists a client of process pid. */
bool td_wait_client_pid(const test_daemon *d, pid_t pid, int timeout_ms);
/* Retry gpubuf_connect(path, ret) every 10 ms until it succeeds (true), for
 * up to timeout_ms of waiting (false, *ret NULL). */
bool td_wait_connect(const char *path, gpubuf_client **ret, int timeout_ms);
/* Poll the file at path (every 10 ms, up to timeout_ms of waiting) until
 * its first 64 KiB contain text. */
bool td_wait_file_has(const char *path, const char *text, int timeout_ms);
/* The daemon's open fds once every connection that left is closed: over a
 * connection of its own, waits (up to timeout_ms) until the daemon lists n
 * clients besides that one, asks once more (a turn of the loop later, the
 * fds of the clients that left are closed), counts, and leaves that
 * connection's fd out of the count. -1 when the others never left. */
int td_quiet_fds(const test_daemon *d, size_t n, int timeout_ms);

/* Pipes that line up child processes (td_spawn): a child waits for a byte
 * on go before it opens, writes a byte on ready once it holds its view, and
 * waits for a byte (or EOF) on hold before it lets go. td_gates_open makes
 * them and stores the child's ends in *ready_fd, *hold_fd, *go_fd (each may
 * be NULL: that gate is not made, its fds are -1). */
typedef struct td_gates {
    int ready[2], hold[2], go[2];
} td_gates;
void td_gates_open(td_gates *g, int *ready_fd, int *hold_fd, int *go_fd);
/* Write n bytes on fd (one per child: a child reading one must not see EOF
 * while another still holds the write end). */
void td_gates_pass(int fd, int n);
/* Wait until n children wrote on the ready gate. */
void td_gates_ready(const td_gates *g, int n);
/* Spawn n children running fn(d, arg) (td_spawn; their pids in pids), let
 * them all go at once (a byte each on the go gate) and wait until all n
 * are ready. */
void td_gates_run(const td_gates *g, pid_t *pids, int n, int (*fn)(const test_daemon *d, void *arg),
                  const test_daemon *d, void *arg);

/* Run fn(arg) in a forked child; returns its pid. The child exits with fn's
 * return value. */
pid_t td_spawn(int (*fn)(const test_daemon *d, void *arg), const test_daemon *d, void *arg);
/* Run a program (argv[0] a path) in a child and wait: its exit code, or
 * 128 + signal, 127 when it cannot be executed. */
int td_run(const char *const *argv);
/* Wait for pid; returns its exit code, or 128 + signal. */
int td_wait(pid_t pid);

/* Sleep for ms milliseconds. */
void td_sleep_ms(int ms);
/* Poll status until buffer `name` has `refs` references. */
bool td_wait_refs(const test_daemon *d, const char *name, uint32_t refs, int timeout_ms);
/* Open file descriptors of a process, from /proc (-1 if unreadable). */
int td_count_fds(pid_t pid);
/* Resident set size of a process in KiB, from /proc (-1 if unreadable). */
long td_rss_kib(pid_t pid);

/* Make a new folder /tmp/gpubuf-WHAT-XXXXXX (mode 0700) and write its path
 * to dir; fails the test when it cannot. */
void td_mkdtemp(char dir[64], const char *what);
/* Remove dir and everything below it (rm -rf); fails the test when that
 * fails. */
void td_rmtree(const char *dir);
/* Write text to a new or truncated file at path; 0, or -1 when it cannot. */
int td_write_file(const char *path, const char *text);
/* Run a shell command; returns its standard output (free it) and stores
 * its exit code (or 128 + signal) in *ret_code. */
char *td_capture(const char *cmd, int *ret_code);
/* td_capture, and the command must exit with code want (-1: any). */
char *td_capture_exit(const char *cmd, int want);
/* Run gpubufctl --socket SOCKET args (shell words; redirections allowed),
 * SOCKET being d's (d NULL: one that is not there); it must exit with code
 * want (-1: any). Returns its output (free it). */
char *td_ctl(const test_daemon *d, const char *args, int want);
/* Copies an executable and the shared libraries beside it (lib*.so*) into a
 * new folder under /tmp that every uid may enter (0755), so that a test that
 * drops privileges can run it wherever the build tree lives (a clone under a
 * 0700 folder included). Writes the folder to dir and returns the path of the
 * copy in it (free it); run it with LD_LIBRARY_PATH=dir. td_unstage removes
 * the folder. */
char *td_stage_public(const char *exe, char dir[64]);
void td_unstage(const char *dir);
/* Occurrences of needle in haystack. */
int td_count(const char *haystack, const char *needle);

/* Fill/verify a deterministic pattern (see examples/pattern.h). */
void td_fill(void *p, uint64_t len, uint32_t seed);
uint64_t td_mismatches(const void *p, uint64_t len, uint32_t seed);

/* The CUDA devices this process would see, asked in a forked child so that
 * the caller never initialises CUDA: their number (0 without driver or
 * device, at most max) and their UUIDs ("GPU-..."). */
int td_probe_gpus(char uuids[][41], int max);

/* A plain socket connected to d (no hello), whose reads give up after
 * timeout_s seconds; for tests that speak the protocol themselves (with
 * the helpers of rawproto.h and these). */
int td_raw_connect(const test_daemon *d, int timeout_s);
/* Send req on fd; fails the test when it cannot be sent. */
void td_raw_send(int fd, const Gpubuf__Request *req);
/* Send req; its response must succeed with the given body. Free it. */
Gpubuf__Response *td_raw_expect(int fd, const Gpubuf__Request *req, int body_case);
/* Send req; its response (of req's id) must come with status `status`. */
void td_raw_status(int fd, const Gpubuf__Request *req, int status);
/* Hello with capability bits caps; the reply (version 1; free it). */
Gpubuf__Response *td_raw_hello_caps(int fd, uint64_t caps);
/* Hello without capabilities; the reply must succeed. */
void td_raw_hello(int fd);

/* A measured figure (a bound and what was seen): printed, and appended as
 * one line to the file $GPUBUF_FIGURES names, if set, which scripts/test.sh
 * prints after the suite. */
void td_figure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
