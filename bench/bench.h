/* What the phases of gpubuf_bench share: the settings main() takes from the
 * command line, timing and reporting, connecting, running a phase in a
 * forked child, and (with CUDA) the GPU a phase uses. Each phase group has
 * one file, named for what it measures, and one entry point declared here;
 * main() (gpubuf_bench.c) runs them in order.
 *
 * An entry point that returns int returns 0, or nonzero when the phase
 * failed (its messages are on stderr). */
#ifndef GPUBUF_BENCH_H
#define GPUBUF_BENCH_H

#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

#include "cuda_driver.h"
#include "gpubuf/gpubuf.h"

/* Settings from the command line, set by main() before the first phase and
 * read by the phases (bench_common.c holds them and their defaults). */
extern const char *g_sock;      /* --socket: the daemon's socket */
extern const char *g_pool;      /* --pool: the default pool, cuda-ipc or host */
extern const char *g_cold_pool; /* --cold-pool: 2 MiB slabs, for cold opens */
extern const char *g_vmm_pool;  /* --vmm-pool: a cuda-vmm pool */
extern int g_quick;             /* --quick: fewer iterations */
extern int g_procs;             /* --procs: processes of throughput and batchmix */
extern int g_daemon_pid;        /* --daemon-pid: whose RSS is measured, 0 if unknown */
extern const char *g_ctl;       /* --ctl: gpubufctl, or NULL for no JSON timings */
extern const char *g_echo_floor; /* --echo-floor: bench/anchors/echo_floor, run beside the mixed
                                  * phase (throughput.c), or NULL */

/* Exits the calling process with a message when x, a gpubuf call, fails. */
#define CHECK(x)                                                                               \
    do {                                                                                       \
        int r_ = (x);                                                                          \
        if (r_ < 0) {                                                                          \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #x,                     \
                    gpubuf_strerror(r_), gpubuf_last_error_message());                          \
            _exit(1);                                                                          \
        }                                                                                      \
    } while (0)

/* CLOCK_MONOTONIC in microseconds. */
double now_us(void);
/* qsort() order of doubles. */
int cmpd(const void *a, const void *b);
/* Sorts v[0..n) and prints name_median_us and name_p99_us. */
void report(const char *name, double *v, int n);
/* A connection to g_sock; exits on failure. */
gpubuf_client *conn(void);
/* Runs fn in a forked child; its exit status (128 + signal if killed). */
int run_child(void (*fn)(void));
/* Deletes the n buffers prefix/0 ... prefix/(n-1), 1,000 a call; exits when
 * one is not deleted: a phase leaves the daemon as it found it. */
void delete_prefix(int n, const char *prefix);
/* Delete name once a phase's figures are out: a failure is reported on
 * stderr, not fatal (bench/run.sh runs some phases again in one daemon). */
void cleanup_delete(gpubuf_client *c, const char *name);

/* A process of run_workers(): waits on ready_fd/go_fd for the common start,
 * works for secs seconds, writes its operation count (a long) to fd. */
typedef void (*worker_fn)(int idx, double secs, int fd, int ready_fd, int go_fd);
/* Runs worker in g_procs processes that start together; the sum of the
 * operation counts they report. */
long run_workers(worker_fn worker, double secs);
/* run_workers() for 3 s (1 s with --quick; g_plan's secs when set):
 * operations per second. */
double workers_ops_per_s(worker_fn worker);
/* A run of workers cut into time bins, set by the journal pairs (pairs.c)
 * around a phase of workers: run_workers() then runs them for secs, each
 * worker counts its operations per bin as they complete (ops_done), and
 * during() runs in the calling process while they work. The plan and its
 * bins live in a shared mapping: the workers see t0, the common start set
 * when they are let go, and the caller sees their counts. */
typedef struct work_plan {
    double secs;   /* how long the workers work */
    double bin_us; /* the width of a bin */
    int n_bins;    /* bins per worker (g_procs rows) */
    double t0;     /* the common start (now_us()), set by run_workers() */
    void (*during)(struct work_plan *plan);
    void *arg;  /* during()'s */
    long *bins; /* g_procs rows of n_bins counts */
} work_plan;
extern work_plan *g_plan;
/* A worker's n more operations, done now: counted in its row of g_plan's
 * bins; nothing outside such a run. */
void ops_done(long n);
/* The rate figures of the phases of workers, printed as KEY_<g_procs>proc. */
#define MIXED_RATE_KEY "gpubuf_mixed_ops_per_s"
#define BATCH_MIXED_RATE_KEY "batch_mixed_ops_per_s"

/* The resident set of g_daemon_pid in KiB. */
long daemon_rss_kib(void);
/* Prints under key the median wall time in ms of 11 runs of
 * `gpubufctl --json status`; nothing without --ctl. */
void ctl_json_time(const char *key);

#ifdef GPUBUF_HAVE_CUDA
/* Exits the calling process with a message when g->cu->x fails. */
#define CU(g, x)                                                                               \
    do {                                                                                       \
        CUresult r_ = (g)->cu->x;                                                              \
        if (r_ != CUDA_SUCCESS) {                                                              \
            char why_[256];                                                                    \
            fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__,                                 \
                    gpubuf_cuda_describe(r_, #x, why_, sizeof(why_)));                         \
            _exit(1);                                                                          \
        }                                                                                      \
    } while (0)

/* How long the producer kernels of seal-stream and handover spin. */
enum { SPIN_US = 2000 };

/* One GPU as a phase uses it: the primary context of device 0 (where
 * bench/run.sh puts every pool), current on this thread for the rest of the
 * process, a non-blocking stream, and the stamp kernels when asked. */
typedef struct bench_gpu {
    const gpubuf_cuda *cu;
    CUdevice dev;
    CUcontext ctx;
    CUstream st;
    CUmodule mod;
    CUfunction stamp_end, stamp;
} bench_gpu;

/* Fills g: the primary context of device 0 made current, a non-blocking
 * stream, and with kernels the stamp kernels (bench_gpu.c); exits on
 * failure. */
void gpu_open(bench_gpu *g, int kernels);
/* Exits with a message unless b is mapped on device 0. */
void expect_device0(const gpubuf_buffer *b);
#endif

/* A phase as main() runs it: its name in --only, and its entry point. */
typedef struct bench_phase {
    const char *name;
    int (*run)(void);
    /* A phase of workers: its rate figure (printed as <rate_key>_<g_procs>proc),
     * which the journal pairs measure in slices of one run (pairs.c); else
     * NULL. */
    const char *rate_key;
} bench_phase;

/* --pairs DIR (pairs.c): runs each of phases[0..n) 8 times, gpubufd's
 * journal off, on, on, off, off, on, on, off (SIGUSR2 to g_daemon_pid,
 * then log, its messages, says it switched), its figures appended to
 * DIR/off-K.txt or DIR/on-K.txt; a phase with a rate_key runs once instead,
 * its time cut into 32 slices in that order four times over, round K's
 * rate from the slices K, K + 8, K + 16 and K + 24. Leaves the journal on.
 * 0, or -1 when a switch or a phase failed (a message on stderr). */
int run_pairs(const char *dir, const char *log, const bench_phase *const *phases, size_t n);

/* The phase groups, in the order main() runs them. */
int latency_phase(void);     /* latency.c */
int async_phase(void);       /* async.c: event loops */
int waitmem_phase(void);     /* async.c: daemon memory per waiting open (a fresh daemon) */
int cold_phase(void);        /* cold_open.c */
int throughput_phase(void);  /* throughput.c: runs in the calling process; 0 */
#ifdef GPUBUF_HAVE_CUDA
int bandwidth_phase(void); /* bandwidth.c */
int peer_phase(void);      /* bandwidth.c */
#endif
int vmm_cold_phase(const char *pool); /* vmm_cold.c */
int vmm_warm_phase(void);             /* vmm_warm.c */
#ifdef GPUBUF_HAVE_CUDA
/* pool, and label: the name the output gives it ("vmm", "ipc"). */
int seal_stream_phase(const char *pool, const char *label); /* seal_stream.c */
int handover_phase(const char *pool, const char *label);    /* handover.c */
int copies_phase(void);                                     /* copies.c */
#endif
int crash_phase(void);        /* crash.c */
int scale_phase(void);        /* scale.c */
int batch_phase(void);        /* batch.c */
int batch_mixed_phase(void);  /* batch.c: runs in the calling process; 0 */
int meta_phase(void);         /* meta.c */

#endif
