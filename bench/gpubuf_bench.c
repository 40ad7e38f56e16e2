/* gpubuf benchmarks. Talks to a running gpubufd (started by bench/run.sh)
 * and prints one "name value" line per figure, for bench/report.py.
 *
 *   gpubuf_bench --socket PATH [--pool NAME] [--cold-pool NAME] [--procs N]
 *                [--only latency,cold,throughput,bandwidth,peer,crash,scale,
 *                        vmm-cold,vmm-warm,seal-stream,handover,copies,batch,
 *                        batchmix,meta,async,waitmem] [--quick]
 *                [--vmm-pool NAME] [--vmm-cold-pools NAME,NAME]
 *                [--daemon-pid PID] [--ctl PATH-TO-GPUBUFCTL]
 *                [--pairs DIR --daemon-log PATH] [--echo-floor PATH]
 *
 * --only takes a comma-separated list of phases; "vmm" stands for the five
 * phases of cuda-vmm pools, read-only opens, stream order and copies
 * (vmm-cold,vmm-warm,seal-stream,handover,copies). --pool names the cuda-ipc
 * pool those phases compare against.
 *
 * --pairs DIR runs each phase of --only (not the vmm ones) 8 times, with
 * the journal of gpubufd (--daemon-pid, state_journal = switchable, its
 * messages in --daemon-log) off and on in turn, into DIR; throughput and
 * batchmix once each, the journal switched every 0.5 s (pairs.c).
 *
 * --echo-floor PATH (bench/anchors/echo_floor, built): the throughput phase
 * runs it with 16 clients right before and right after its mixed requests
 * and prints the mean as mixed_echo_floor_16_beside_per_s (throughput.c).
 *
 * The parent process never initialises CUDA: every measurement runs in a
 * forked child, since a CUDA context does not survive fork().
 *
 * This file parses the options and runs the phases in order; each group of
 * phases has a file of its own, named for what it measures, and bench.h
 * holds what they share. */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "bench_opts.h"

/* Names are per pool: the phases on --pool open their buffers by plain
 * names, which the daemon looks up in its default (first) pool; the other
 * pools' phases use /POOL/NAME. 0, or -1 with a message. */
static int check_default_pool(void) {
    gpubuf_client *c = conn();
    gpubuf_status *s;
    CHECK(gpubuf_status_get(c, &s));
    int r = 0;
    if (s->default_pool[0] && strcmp(s->default_pool, g_pool) != 0) {
        fprintf(stderr,
                "bench: --pool %s is not the daemon's default pool '%s': give that pool first "
                "to gpubufd, or --pool %s\n",
                g_pool, s->default_pool, s->default_pool);
        r = -1;
    }
    gpubuf_status_free(s);
    gpubuf_disconnect(c);
    return r;
}

/* Whether --only names phase: a comma-separated list of phase names, where
 * "vmm" stands for all the phases of vmm_phases(). */
static const char *g_only = "latency,cold,throughput,bandwidth,crash,scale";

static int want(const char *phase) {
    static const char *const vmm[] = {"vmm-cold", "vmm-warm", "seal-stream", "handover", "copies"};
    size_t len = strlen(phase);
    for (const char *p = g_only; *p;) {
        size_t n = strcspn(p, ",");
        if (n == len && strncmp(p, phase, n) == 0)
            return 1;
        if (n == 3 && strncmp(p, "vmm", 3) == 0)
            for (size_t i = 0; i < sizeof(vmm) / sizeof(vmm[0]); i++)
                if (strcmp(vmm[i], phase) == 0)
                    return 1;
        p += n;
        if (*p == ',')
            p++;
    }
    return 0;
}

static const char *g_vmm_cold_pools = "vmmcold,vmmcold64";
static const char *g_pairs, *g_daemon_log; /* --pairs, --daemon-log */

/* The five phases of --only vmm, in order. A phase that fails does not stop
 * the others. Returns the number of failed phases. */
static int vmm_phases(void) {
    int failed = 0;
    if (want("vmm-cold")) {
        char *list = strdup(g_vmm_cold_pools), *save = NULL;
        if (!list)
            return 1;
        for (char *p = strtok_r(list, ",", &save); p; p = strtok_r(NULL, ",", &save))
            failed += vmm_cold_phase(p) != 0;
        free(list);
    }
    if (want("vmm-warm"))
        failed += vmm_warm_phase() != 0;
#ifdef GPUBUF_HAVE_CUDA
    if (want("seal-stream"))
        failed +=
            (seal_stream_phase(g_vmm_pool, "vmm") != 0) + (seal_stream_phase(g_pool, "ipc") != 0);
    if (want("handover"))
        failed += (handover_phase(g_vmm_pool, "vmm") != 0) + (handover_phase(g_pool, "ipc") != 0);
    if (want("copies"))
        failed += copies_phase() != 0;
#else
    if (want("seal-stream") || want("handover") || want("copies")) {
        fprintf(stderr, "bench: built without CUDA: no seal-stream, handover or copies phase\n");
        failed++;
    }
#endif
    if (failed)
        fprintf(stderr, "bench: %d of the vmm phases failed\n", failed);
    return failed;
}

/* The options of the usage at the top of this file. */
static const bench_opt opts[] = {
    {"socket", 's', BENCH_OPT_STR, &g_sock},
    {"pool", 'p', BENCH_OPT_STR, &g_pool},
    {"cold-pool", 'c', BENCH_OPT_STR, &g_cold_pool},
    {"procs", 'n', BENCH_OPT_INT, &g_procs},
    {"only", 'o', BENCH_OPT_STR, &g_only},
    {"quick", 'q', BENCH_OPT_FLAG, &g_quick},
    {"daemon-pid", 0, BENCH_OPT_INT, &g_daemon_pid},
    {"ctl", 0, BENCH_OPT_STR, &g_ctl},
    {"vmm-pool", 0, BENCH_OPT_STR, &g_vmm_pool},
    {"vmm-cold-pools", 0, BENCH_OPT_STR, &g_vmm_cold_pools},
    {"pairs", 0, BENCH_OPT_STR, &g_pairs},
    {"daemon-log", 0, BENCH_OPT_STR, &g_daemon_log},
    {"echo-floor", 0, BENCH_OPT_STR, &g_echo_floor},
};

/* The phases main() runs before and after vmm_phases(), in order: the
 * first that fails ends the run. */
typedef bench_phase phase;

static const phase before_vmm[] = {
    {"latency", latency_phase, NULL},
    {"cold", cold_phase, NULL},
    {"throughput", throughput_phase, MIXED_RATE_KEY},
#ifdef GPUBUF_HAVE_CUDA
    {"bandwidth", bandwidth_phase, NULL},
    {"peer", peer_phase, NULL},
#endif
};

/* After the vmm phases: these compare figures with each other and with
 * anchors, on a daemon without the 100k buffers of scale. */
static const phase after_vmm[] = {
    {"crash", crash_phase, NULL},     {"scale", scale_phase, NULL},
    {"batch", batch_phase, NULL},     {"batchmix", batch_mixed_phase, BATCH_MIXED_RATE_KEY},
    {"meta", meta_phase, NULL},       {"async", async_phase, NULL},
    {"waitmem", waitmem_phase, NULL},
};

static int run_phases(const phase *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (want(p[i].name) && p[i].run())
            return -1;
    return 0;
}

enum {
    N_BEFORE = sizeof(before_vmm) / sizeof(before_vmm[0]),
    N_AFTER = sizeof(after_vmm) / sizeof(after_vmm[0]),
};

/* --pairs: the phases of --only, in main()'s order, 8 times each. */
static int pairs(void) {
    const phase *p[N_BEFORE + N_AFTER];
    size_t n = 0;
    if (want("vmm-cold") || want("vmm-warm") || want("seal-stream") || want("handover") ||
        want("copies")) {
        fprintf(stderr, "bench: --pairs runs no vmm phase\n");
        return -1;
    }
    for (size_t i = 0; i < N_BEFORE; i++)
        if (want(before_vmm[i].name))
            p[n++] = &before_vmm[i];
    for (size_t i = 0; i < N_AFTER; i++)
        if (want(after_vmm[i].name))
            p[n++] = &after_vmm[i];
    return run_pairs(g_pairs, g_daemon_log, p, n);
}

int main(int argc, char **argv) {
    if (bench_opts_parse(argc, argv, opts, sizeof(opts) / sizeof(opts[0])) < 0)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (check_default_pool() < 0)
        return 1;
    if (g_pairs)
        return pairs() < 0 ? 1 : 0;
    if (run_phases(before_vmm, N_BEFORE) < 0)
        return 1;
    int vmm_failed = vmm_phases();
    if (run_phases(after_vmm, N_AFTER) < 0)
        return 1;
    return vmm_failed ? 1 : 0;
}
