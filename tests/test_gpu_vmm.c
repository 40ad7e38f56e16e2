/* cuda-vmm pools, read-only opens the GPU enforces, stream-ordered hand-over
 * and stream copies (label "gpu"). Exits 77 (skip) without a CUDA device.
 * As in test_gpu, this process never initialises CUDA: every CUDA call runs
 * in a forked child or an exec'ed example program. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cuda_driver.h"
#include "check_main.h"
#include "gpu_helpers.h"
#include "fdstore.h"
#include "gpu_batch.h"
#include "harness.h"
#include "internal.h"
#include "pattern.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

static int g_ngpus;
static char g_uuid[8][41];

static void start_vmm(void) {
    static const char *const args[] = {"--pool", "vmm=cuda-vmm,device=0,capacity=8G,slab=64M",
                                       "--pool", "ipc=cuda-ipc,device=0,capacity=4G,slab=64M",
                                       NULL};
    td_start(&D, args);
}

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static void expect_empty(void) {
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 0);
    for (size_t i = 0; i < s->n_pools; i++)
        ck_assert_uint_eq(s->pools[i].used, 0);
    gpubuf_status_free(s);
}

static void delete_name(const char *name) {
    gpubuf_client *c = td_connect(&D);
    ck_assert_int_eq(gpubuf_delete(c, name), 0);
    gpubuf_disconnect(c);
}

/* A stream of device 0's primary context, made current on this thread. */
typedef struct gstream {
    const gpubuf_cuda *cu;
    CUdevice dev;
    CUcontext ctx;
    CUstream st;
} gstream;

static int stream_open(gstream *g, unsigned flags) {
    if (gpubuf_cuda_load(&g->cu) < 0 || g->cu->DeviceGet(&g->dev, 0) != CUDA_SUCCESS ||
        g->cu->DevicePrimaryCtxRetain(&g->ctx, g->dev) != CUDA_SUCCESS ||
        g->cu->CtxPushCurrent(g->ctx) != CUDA_SUCCESS ||
        g->cu->StreamCreate(&g->st, flags) != CUDA_SUCCESS)
        return -1;
    return 0;
}

static void stream_close(gstream *g) {
    CUcontext ignored;
    g->cu->StreamDestroy(g->st);
    g->cu->CtxPopCurrent(&ignored);
    g->cu->DevicePrimaryCtxRelease(g->dev);
}

/* ---- the user story with the example programs ---------------------------- */

START_TEST(vmm_user_story_256mib) {
    const char *prod[] = {EXAMPLES_DIR "/gpubuf-producer", "--socket", D.socket, "--pool", "vmm",
                          "--name", "story", "--size", "256M", "--seed", "7", NULL};
    const char *cons[] = {EXAMPLES_DIR "/gpubuf-consumer", "--socket", D.socket, "--name",
                          "story", "--seed", "7", NULL};
    ck_assert_int_eq(td_run(prod), 0);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(td_run(cons), 0);
    gpubuf_status *s = td_status(&D);
    const gpubuf_pool_info *p = td_find_pool(s, "vmm");
    ck_assert_int_eq(p->kind, GPUBUF_POOL_CUDA_VMM);
    ck_assert_uint_eq(p->used, 256 * MiB);
    ck_assert_uint_eq(td_find_buffer(s, "story")->refs, 0);
    gpubuf_status_free(s);
    delete_name("story");
    expect_empty();
}
END_TEST

/* ---- stream-ordered seal and wait ---------------------------------------- */

typedef struct story {
    const char *pool;
    const char *name;
    uint64_t size;
    uint32_t seed;
    uint32_t spin_us;  /* the producer's kernel runs at least this long */
    bool expect_event; /* consumers must see the seal event */
    int released_fd;   /* >= 0: the producer releases its view at once and writes a byte here */
} story;

/* Allocate, enqueue a long fill on a stream, seal on that stream at once. */
static int stream_producer(const test_daemon *d, void *arg) {
    story *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    gstream g;
    if (gpubuf_connect(d->socket, &c) < 0 || gpubuf_alloc(c, j->pool, j->size, j->name, &b) < 0)
        return 1;
    if (gpubuf_buffer_pool_kind(b) != (strcmp(j->pool, "vmm") == 0 ? GPUBUF_POOL_CUDA_VMM
                                                                     : GPUBUF_POOL_CUDA_IPC) ||
        gpubuf_buffer_device(b) != 0)
        return 2;
    if (stream_open(&g, CU_STREAM_NON_BLOCKING) < 0)
        return 3;
    CUstream st = g.st;
    double t0 = now_us();
    if (gpubuf_pattern_fill_device_async(0, gpubuf_buffer_device_ptr(b), j->size, j->seed, st,
                                         j->spin_us) < 0)
        return 4;
    double t1 = now_us();
    if (gpubuf_seal_stream(b, (gpubuf_stream)st) < 0)
        return 5;
    double t2 = now_us();
    /* Returned before the kernel ended. */
    if (g.cu->StreamQuery(st) != CUDA_ERROR_NOT_READY)
        return 6;
    if (j->released_fd >= 0) {
        /* Let the view go while the kernel runs: the reference (and the
         * event the daemon hands out) must stay until the kernel ends. */
        gpubuf_release(b);
        b = NULL;
        if (gpubuf_flush(c) < 0 || write(j->released_fd, "r", 1) != 1)
            return 9;
    }
    if (gpubuf_flush(c) < 0)
        return 7;
    if (g.cu->StreamSynchronize(st) != CUDA_SUCCESS)
        return 8;
    double t3 = now_us();
    printf("stream seal: launch %.1f us, gpubuf_seal_stream %.1f us; the kernel ended %.1f ms "
           "after the seal returned\n",
           t1 - t0, t2 - t1, (t3 - t2) / 1000);
    fflush(stdout);
    stream_close(&g);
    gpubuf_release(b);
    if (gpubuf_flush(c) < 0) /* the deferred release goes now */
        return 10;
    gpubuf_disconnect(c);
    return 0;
}

/* Open (waiting), order a stream after the producer's work, verify on it. */
static int stream_consumer(const test_daemon *d, void *arg) {
    story *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    gstream g;
    uint64_t bad = 1;
    /* CUDA first: the event is imported as the open's reply comes, and a
     * consumer still starting its context then could find the producer's
     * kernel (and event) gone already under load. */
    if (stream_open(&g, CU_STREAM_NON_BLOCKING) < 0)
        return 3;
    if (gpubuf_connect(d->socket, &c) < 0 || gpubuf_open(c, j->name, 30000, &b) < 0)
        return 1;
    if (b->has_event != j->expect_event) {
        fprintf(stderr, "consumer: %s seal event\n", b->has_event ? "an unexpected" : "no");
        return 2;
    }
    /* On cuda-ipc, the caller asks for its thread's default stream. */
    CUstream use = strcmp(j->pool, "ipc") == 0 ? CU_STREAM_PER_THREAD : g.st;
    double t0 = now_us();
    if (gpubuf_buffer_wait(b, (gpubuf_stream)use) < 0)
        return 4;
    double t1 = now_us();
    if (gpubuf_pattern_verify_device_stream(0, gpubuf_buffer_device_ptr(b), j->size, j->seed, use,
                                            &bad) < 0)
        return 5;
    printf("consumer: wait enqueued in %.1f us; %llu mismatches in %llu MiB\n", t1 - t0,
           (unsigned long long)bad, (unsigned long long)(j->size / MiB));
    fflush(stdout);
    stream_close(&g);
    gpubuf_release(b);
    gpubuf_disconnect(c);
    return bad ? 6 : 0;
}

/* A producer fills 1 GiB with a kernel that runs for 0.3 s and seals on its
 * stream at once; three consumers, already waiting for the name, make their
 * streams wait on the event and verify every word. After the producer is
 * gone, a fourth consumer still reads the memory, with no event to wait on. */
START_TEST(vmm_stream_ordered_1gib) {
    story j = {.pool = "vmm", .name = "frame", .size = 1 * GiB, .seed = 31, .spin_us = 300000,
               .expect_event = true, .released_fd = -1};
    pid_t cons[3];
    for (int i = 0; i < 3; i++)
        cons[i] = td_spawn(stream_consumer, &D, &j);
    ck_assert(td_wait_waiting_opens(&D, 3, 30000));
    pid_t prod = td_spawn(stream_producer, &D, &j);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(td_wait(cons[i]), 0);
    ck_assert_int_eq(td_wait(prod), 0);
    story late = j;
    late.expect_event = false; /* the sealer disconnected: its event is gone */
    ck_assert_int_eq(td_wait(td_spawn(stream_consumer, &D, &late)), 0);
    delete_name("frame");
    expect_empty();
}
END_TEST

/* The same hand-over on a cuda-ipc pool, with the per-thread default stream
 * on the consumer side. */
START_TEST(ipc_stream_ordered_256mib) {
    /* Names are per pool: "ipc" is not the default pool ("vmm"). */
    story j = {.pool = "ipc", .name = "/ipc/iframe", .size = 256 * MiB, .seed = 33, .spin_us = 200000,
               .expect_event = true, .released_fd = -1};
    pid_t cons = td_spawn(stream_consumer, &D, &j);
    ck_assert(td_wait_waiting_opens(&D, 1, 30000));
    pid_t prod = td_spawn(stream_producer, &D, &j);
    ck_assert_int_eq(td_wait(cons), 0);
    ck_assert_int_eq(td_wait(prod), 0);
    delete_name("/ipc/iframe");
    expect_empty();
}
END_TEST

/* The producer lets its view go while its kernel (1 s) still runs; a
 * consumer that opens only then still gets the event, waits and reads every
 * word right; the producer's reference goes once the kernel ended. */
START_TEST(vmm_release_while_kernel_runs) {
    int p[2];
    char byte;
    ck_assert_int_eq(pipe(p), 0);
    story j = {.pool = "vmm", .name = "late", .size = 64 * MiB, .seed = 35, .spin_us = 1000000,
               .expect_event = true, .released_fd = p[1]};
    pid_t prod = td_spawn(stream_producer, &D, &j);
    ck_assert_int_eq(read(p[0], &byte, 1), 1);
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer_info info;
    ck_assert_int_eq(gpubuf_stat(c, "late", &info), 0);
    ck_assert_uint_eq(info.refs, 1); /* the producer's, held for its running kernel */
    gpubuf_disconnect(c);
    ck_assert_int_eq(td_wait(td_spawn(stream_consumer, &D, &j)), 0);
    ck_assert_int_eq(td_wait(prod), 0);
    close(p[0]);
    close(p[1]);
    ck_assert(td_wait_refs(&D, "late", 0, 5000));
    delete_name("late");
    expect_empty();
}
END_TEST

/* ---- read-only opens ----------------------------------------------------- */

static int fill_and_seal(const test_daemon *d, void *arg) {
    const story *j = arg;
    return gpu_produce_sealed(d, j->pool, j->size, j->name, 0, -1, j->seed);
}

/* Read through a read-only view, then write through it: the kernel faults. */
static int read_only_writer(const test_daemon *d, void *arg) {
    story *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    uint64_t bad = 1;
    if (gpubuf_connect(d->socket, &c) < 0 ||
        gpubuf_open_with(c, j->name, 0, &(gpubuf_lookup){.timeout_ms = 0, .flags = GPUBUF_OPEN_READONLY}, &b) < 0)
        return 1;
    if (!gpubuf_buffer_read_only(b))
        return 2;
    if (gpubuf_pattern_verify_device(0, gpubuf_buffer_device_ptr(b), j->size, j->seed, &bad) < 0 ||
        bad)
        return 3;
    uint32_t w = 1;
    if (gpubuf_buffer_copy_from_host(b, 0, &w, 4) != -EPERM)
        return 4;
    int r = gpubuf_pattern_fill_device(0, gpubuf_buffer_device_ptr(b), j->size, j->seed + 1);
    printf("write through a read-only cuda-vmm view: %s\n", r == GPUBUF_ECUDA ? "faulted" : "ran");
    fflush(stdout);
    return r == GPUBUF_ECUDA ? 0 : 5; /* this process's context is lost now */
}

static int verify_rw(const test_daemon *d, void *arg) {
    story *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    uint64_t bad = 1;
    if (gpubuf_connect(d->socket, &c) < 0 || gpubuf_open(c, j->name, 0, &b) < 0)
        return 1;
    if (gpubuf_buffer_read_only(b) ||
        gpubuf_pattern_verify_device(0, gpubuf_buffer_device_ptr(b), j->size, j->seed, &bad) < 0)
        return 2;
    gpubuf_release(b);
    gpubuf_disconnect(c);
    return bad ? 3 : 0;
}

static int ipc_read_only_refused(const test_daemon *d, void *arg) {
    gpubuf_client *c;
    gpubuf_buffer *b, *o;
    (void)arg;
    if (gpubuf_connect(d->socket, &c) < 0 || gpubuf_alloc(c, "ipc", 1 * MiB, "ipc1", &b) < 0 ||
        gpubuf_seal_sync(b) < 0)
        return 1;
    int r = gpubuf_open_with(c, "/ipc/ipc1", 0, &(gpubuf_lookup){.timeout_ms = 0, .flags = GPUBUF_OPEN_READONLY}, &o);
    printf("read-only open on cuda-ipc: %s: %s\n", gpubuf_err_name(r),
           gpubuf_last_error_message());
    fflush(stdout);
    if (r != -EOPNOTSUPP || !strstr(gpubuf_last_error_message(), "cuda-vmm"))
        return 2;
    gpubuf_release(b);
    return gpubuf_delete(c, "/ipc/ipc1") < 0 ? 3 : 0;
}

START_TEST(vmm_read_only_faults_alone) {
    story j = {.pool = "vmm", .name = "ro", .size = 64 * MiB, .seed = 41, .released_fd = -1};
    ck_assert_int_eq(td_wait(td_spawn(fill_and_seal, &D, &j)), 0);
    ck_assert_int_eq(td_wait(td_spawn(read_only_writer, &D, &j)), 0);
    /* The daemon serves on; the data is unchanged for everyone else. */
    ck_assert(td_wait_refs(&D, "ro", 0, 5000));
    ck_assert_int_eq(td_wait(td_spawn(verify_rw, &D, &j)), 0);
    ck_assert_int_eq(td_wait(td_spawn(ipc_read_only_refused, &D, NULL)), 0);
    delete_name("ro");
    expect_empty();
}
END_TEST

/* ---- copies on a stream --------------------------------------------------- */

static int stream_copies(const test_daemon *d, void *arg) {
    gpubuf_client *c;
    gpubuf_buffer *a, *b, *x;
    const uint64_t n = 16 * MiB;
    uint64_t bad = 1;
    gstream g;
    (void)arg;
    uint32_t *in = malloc(n), *out = malloc(n);
    if (!in || !out || gpubuf_connect(d->socket, &c) < 0 ||
        gpubuf_alloc(c, "vmm", n, NULL, &a) < 0 || gpubuf_alloc(c, "ipc", n, NULL, &b) < 0 ||
        gpubuf_alloc(c, "vmm", n, NULL, &x) < 0)
        return 1;
    if (stream_open(&g, 0) < 0)
        return 2;
    CUstream st = g.st;
    gpubuf_pattern_fill(in, n, 51);
    /* host -> vmm -> ipc -> vmm -> host, all on one stream. */
    if (gpubuf_buffer_copy_from_host_async(a, 0, in, n, (gpubuf_stream)st) < 0 ||
        gpubuf_buffer_copy(b, 0, a, 0, n, (gpubuf_stream)st) < 0 ||
        gpubuf_buffer_copy(x, 0, b, 0, n, (gpubuf_stream)st) < 0 ||
        gpubuf_buffer_copy_to_host_async(x, 0, out, n, (gpubuf_stream)st) < 0)
        return 3;
    if (g.cu->StreamSynchronize(st) != CUDA_SUCCESS || memcmp(in, out, n) != 0)
        return 4;
    if (gpubuf_pattern_verify_device_stream(0, gpubuf_buffer_device_ptr(b), n, 51, st, &bad) < 0 ||
        bad)
        return 5;
    if (gpubuf_buffer_copy(x, 1, a, 0, n, (gpubuf_stream)st) != GPUBUF_ERANGE)
        return 6;
    stream_close(&g);
    gpubuf_release(a);
    gpubuf_release(b);
    gpubuf_release(x);
    gpubuf_disconnect(c);
    free(in);
    free(out);
    return 0;
}

START_TEST(vmm_stream_copies) {
    ck_assert_int_eq(td_wait(td_spawn(stream_copies, &D, NULL)), 0);
    expect_empty();
}
END_TEST

/* ---- two GPUs: peer access to cuda-vmm memory ------------------------------ */

static void start_vmm_two(void) {
    static const char *const args[] = {"--pool", "vmm0=cuda-vmm,device=0,capacity=4G",
                                       "--pool", "vmm1=cuda-vmm,device=1,capacity=4G", NULL};
    td_start(&D, args);
}

typedef struct peer {
    const char *pool, *name;
    int device; /* the consumer maps into this GPU */
    uint32_t seed;
} peer;

static int peer_produce(const test_daemon *d, void *arg) {
    const peer *j = arg;
    return gpu_produce_sealed(d, j->pool, 256 * MiB, j->name, -1, -1, j->seed);
}

static int peer_consume(const test_daemon *d, void *arg) {
    peer *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    uint64_t bad = 1;
    if (gpubuf_connect(d->socket, &c) < 0 || gpubuf_set_device(c, j->device) < 0 ||
        gpubuf_open_with(c, j->name, 0, &(gpubuf_lookup){.timeout_ms = 0, .flags = GPUBUF_OPEN_READONLY}, &b) < 0)
        return 1;
    if (gpubuf_buffer_device(b) != j->device || gpubuf_buffer_memory_device(b) == j->device)
        return 2;
    if (gpubuf_pattern_verify_device(j->device, gpubuf_buffer_device_ptr(b), 256 * MiB, j->seed,
                                     &bad) < 0)
        return 3;
    gpubuf_release(b);
    gpubuf_disconnect(c);
    return bad ? 4 : 0;
}

START_TEST(vmm_peer_access) {
    peer a = {.pool = "vmm0", .name = "p0", .device = 1, .seed = 61};
    peer b = {.pool = "vmm1", .name = "/vmm1/p1", .device = 0, .seed = 62};
    ck_assert_int_eq(td_wait(td_spawn(peer_produce, &D, &a)), 0);
    ck_assert_int_eq(td_wait(td_spawn(peer_consume, &D, &a)), 0);
    ck_assert_int_eq(td_wait(td_spawn(peer_produce, &D, &b)), 0);
    ck_assert_int_eq(td_wait(td_spawn(peer_consume, &D, &b)), 0);
    delete_name("p0");
    delete_name("/vmm1/p1");
    expect_empty();
}
END_TEST

/* ---- restart survival on a cuda-vmm pool --------------------------------- */

#define RESTART_SIZE (256 * MiB)
#define RESTART_SEED 11u

/* The reader's check: every word on the GPU. */
static int verify_on_gpu(const gpubuf_buffer *b, void *arg) {
    uint64_t bad = 1;
    (void)arg;
    if (gpubuf_buffer_pool_kind(b) != GPUBUF_POOL_CUDA_VMM ||
        gpubuf_pattern_verify_device(0, gpubuf_buffer_device_ptr(b), RESTART_SIZE, RESTART_SEED,
                                     &bad) < 0)
        return -1;
    return bad != 0;
}

/* The reader's session back with its reference, the daemon's books right. */
static void vmm_check_resumed(const test_daemon *d, pid_t reader_pid, uint32_t restarts) {
    bool ok = false;
    for (int t = 0; t < 20000 && !ok; t += 20) {
        gpubuf_status *s = td_status(d);
        const gpubuf_status_buffer *b = td_find_buffer(s, "vr");
        bool det = false, found = false;
        for (size_t i = 0; i < s->n_clients; i++)
            if (s->clients[i].pid == reader_pid) {
                found = s->clients[i].references == 1;
                det = s->client_detached && s->client_detached[i];
            }
        ok = found && !det && b && b->refs == 1;
        if (ok) {
            ck_assert_uint_eq(s->restarts, restarts);
            ck_assert_uint_eq(td_find_pool(s, "vmm")->used, RESTART_SIZE);
            ck_assert_uint_eq(td_find_pool(s, "vmm")->slabs, 1);
            /* cuda-ipc memory died with the daemon: its buffer is gone. */
            ck_assert_ptr_null(td_find_buffer(s, "gone"));
            ck_assert_uint_eq(td_find_pool(s, "ipc")->used, 0);
        }
        gpubuf_status_free(s);
        if (!ok)
            td_sleep_ms(20);
    }
    ck_assert_msg(ok, "the reader's session did not come back with its reference");
}

/* The H200 half of issue 14: a consumer keeps reading a 256 MiB cuda-vmm
 * buffer on the GPU while gpubufd is SIGKILLed and restarted with the fds
 * its service manager kept (tests/fdstore.c), then stopped with SIGTERM
 * and restarted; the buffer keeps its name, contents and references; a new
 * consumer opens it by name after; nothing leaks. */
START_TEST(vmm_restart_keeps_buffer) {
    static const char *const args[] = {"--pool", "vmm=cuda-vmm,device=0,capacity=8G,slab=64M",
                                       "--pool", "ipc=cuda-ipc,device=0,capacity=4G,slab=64M",
                                       NULL};
    fake_sd m;
    reader k = {.name = "vr", .verify = verify_on_gpu};
    char seed[16];
    fsd_init(&m);
    fsd_start(&m, args);
    snprintf(seed, sizeof(seed), "%u", RESTART_SEED);
    const char *prod[] = {EXAMPLES_DIR "/gpubuf-producer", "--socket", m.d.socket, "--pool", "vmm",
                          "--name", "vr", "--size", "256M", "--seed", seed, NULL};
    const char *ipc[] = {EXAMPLES_DIR "/gpubuf-producer", "--socket", m.d.socket, "--pool", "ipc",
                         "--name", "gone", "--size", "2M", NULL};
    const char *cons[] = {EXAMPLES_DIR "/gpubuf-consumer", "--socket", m.d.socket, "--name", "vr",
                          "--seed", seed, NULL};
    ck_assert_int_eq(td_run(prod), 0);
    ck_assert_int_eq(td_run(ipc), 0);
    for (int t = 0; t < 100 && fsd_count(&m, "slab-") < 1; t++)
        fsd_wait(&m, NULL, 20);
    ck_assert_int_eq(fsd_count(&m, "slab-"), 1); /* the vmm slab; cuda-ipc has no fd */
    reader_start(&k, &m.d);
    int fds_before = td_count_fds(m.d.pid);

    fsd_restart_twice(&m, args, vmm_check_resumed, k.pid);

    ck_assert_int_eq(reader_stop(&k), 0);
    ck_assert(td_wait_refs(&m.d, "vr", 0, 5000));
    ck_assert_int_eq(td_run(cons), 0);
    ck_assert_int_le(td_count_fds(m.d.pid), fds_before + 1);
    fsd_delete_last(&m, "vr", "vmm");
    ck_assert_int_eq(fsd_kill(&m, SIGTERM), 0);
    fsd_cleanup(&m);
}
END_TEST

/* Batches on a cuda-vmm pool: slabs travel as fds, once each; read-only
 * batches map each slab read-only once more. */
START_TEST(vmm_batches_open_alloc_release) {
    gpu_batch_story(&D, "vmm", true);
}
END_TEST

int main(void) {
    const gpu_case cases[] = {
        {"cuda-vmm", start_vmm, td_stop_clean,
         (const TTest *const[]){vmm_user_story_256mib, vmm_stream_ordered_1gib,
                                ipc_stream_ordered_256mib, vmm_release_while_kernel_runs,
                                vmm_read_only_faults_alone, vmm_stream_copies,
                                vmm_batches_open_alloc_release, NULL},
         1, NULL},
        {"cuda-vmm-peer", start_vmm_two, td_stop_clean,
         (const TTest *const[]){vmm_peer_access, NULL}, 2, "the peer-access case needs two"},
#ifdef GPUBUF_TEST_SYSTEMD
        {"cuda-vmm-restart", NULL, NULL, (const TTest *const[]){vmm_restart_keeps_buffer, NULL},
         1, NULL},
#endif
    };
#ifndef GPUBUF_TEST_SYSTEMD
    (void)vmm_restart_keeps_buffer;
    printf("test_gpu_vmm: gpubufd is built without libsystemd (no fd store): the restart "
           "case does not run\n");
#endif
    return gpu_suite_main("test_gpu_vmm", "gpu-vmm", &g_ngpus, g_uuid, cases,
                          sizeof(cases) / sizeof(cases[0]));
}
