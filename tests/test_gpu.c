/* The vertical slice on a cuda-ipc pool (label "gpu"). Exits 77 (skip) when
 * no CUDA driver or device is present. The test process itself never
 * initialises CUDA: every CUDA call happens in a forked child or an exec'ed
 * example program, since a CUDA context does not survive fork(). */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_driver.h"
#include "gpu_batch.h"
#include "gpu_helpers.h"
#include "harness.h"
#include "internal.h"
#include "pattern.h"
#include "util.h"
#include "check_main.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

static int g_ngpus;        /* GPUs visible here (probe_gpus) */
static char g_uuid[8][41]; /* their UUIDs, "GPU-..." */

static void start_gpu(void) {
    static const char *const args[] = {"--pool", "gpu0=cuda-ipc,device=0,capacity=16G,slab=64M",
                                       NULL};
    td_start(&D, args);
}

START_TEST(user_story_256mib) {
    const char *prod[] = {EXAMPLES_DIR "/gpubuf-producer", "--socket", D.socket, "--name",
                          "story", "--size", "256M", "--seed", "77", NULL};
    const char *cons[] = {EXAMPLES_DIR "/gpubuf-consumer", "--socket", D.socket, "--name",
                          "story", "--seed", "77", NULL};
    ck_assert_int_eq(td_run(prod), 0);
    ck_assert(td_wait_refs(&D, "story", 0, 2000));
    pid_t p[3];
    for (int i = 0; i < 3; i++) {
        fflush(NULL);
        p[i] = fork();
        if (p[i] == 0) {
            execv(cons[0], (char *const *)cons);
            _exit(127);
        }
    }
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(td_wait(p[i]), 0);
    gpubuf_status *s = td_status(&D);
    const gpubuf_status_buffer *b = td_find_buffer(s, "story");
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(b->refs, 0);
    ck_assert_uint_eq(b->size, 256 * MiB);
    ck_assert_uint_eq(s->pools[0].used, 256 * MiB);
    ck_assert_int_eq(s->pools[0].kind, GPUBUF_POOL_CUDA_IPC);
    ck_assert(strncmp(s->pools[0].device_uuid, "GPU-", 4) == 0);
    gpubuf_status_free(s);
    gpubuf_client *c = td_connect(&D);
    ck_assert_int_eq(gpubuf_delete(c, "story"), 0);
    gpubuf_disconnect(c);
    s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 0);
    ck_assert_uint_eq(s->pools[0].used, 0);
    ck_assert_uint_eq(s->pools[0].reserved, 0); /* the dedicated slab went back */
    gpubuf_status_free(s);
}
END_TEST

/* In a child: alloc, copy in, slice, copy out, all through the library. */
static int views_body(const test_daemon *d, void *arg) {
    gpubuf_client *c;
    gpubuf_buffer *a, *b, *sl;
    uint32_t in[4096], out[1024];
    (void)arg;
    if (gpubuf_connect(d->socket, &c) < 0)
        return 1;
    if (gpubuf_alloc(c, "gpu0", sizeof(in), "va", &a) < 0 ||
        gpubuf_alloc(c, "gpu0", 1 * MiB, "vb", &b) < 0)
        return 2;
    if (gpubuf_buffer_pool_kind(a) != GPUBUF_POOL_CUDA_IPC || gpubuf_buffer_host_ptr(a) ||
        gpubuf_buffer_device(a) != 0 || gpubuf_buffer_device_ptr(a) == 0 ||
        gpubuf_buffer_device_ptr(a) % 512)
        return 3;
    /* Same slab: one mapping, addresses consistent with the daemon's offsets. */
    if (c->n_maps != 1)
        return 4;
    gpubuf_buffer_info ia, ib;
    if (gpubuf_stat(c, "va", &ia) < 0 || gpubuf_stat(c, "vb", &ib) < 0 ||
        ia.slab_id != ib.slab_id ||
        gpubuf_buffer_device_ptr(b) - gpubuf_buffer_device_ptr(a) != ib.offset - ia.offset)
        return 5;
    gpubuf_pattern_fill(in, sizeof(in), 99);
    if (gpubuf_buffer_copy_from_host(a, 0, in, sizeof(in)) < 0)
        return 6;
    if (gpubuf_buffer_slice(a, 4096, 4096, &sl) < 0 ||
        gpubuf_buffer_device_ptr(sl) != gpubuf_buffer_device_ptr(a) + 4096)
        return 7;
    if (gpubuf_buffer_copy_to_host(sl, 0, out, sizeof(out)) < 0 ||
        memcmp(out, in + 1024, sizeof(out)) != 0)
        return 8;
    uint64_t bad = 1;
    if (gpubuf_pattern_verify_device(0, gpubuf_buffer_device_ptr(a), sizeof(in), 99, &bad) < 0 ||
        bad != 0)
        return 9;
    if (gpubuf_buffer_copy_to_host(sl, 1, out, 4096) != GPUBUF_ERANGE)
        return 10;
    gpubuf_release(a);
    gpubuf_release(b);
    if (c->n_maps != 1) /* the slice keeps the slab mapped */
        return 11;
    gpubuf_release(sl);
    if (c->n_maps != 1 || c->n_idle != 1) /* kept mapped, idle */
        return 12;
    gpubuf_disconnect(c);
    return 0;
}

/* No buffer left in D, and its first pool's bytes all back. */
static void assert_nothing_left(void) {
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 0);
    ck_assert_uint_eq(s->pools[0].used, 0);
    gpubuf_status_free(s);
}

START_TEST(views_copies_and_mapping_cache) {
    ck_assert_int_eq(td_wait(td_spawn(views_body, &D, NULL)), 0);
    assert_nothing_left();
}
END_TEST

typedef struct job {
    int ready_fd, hold_fd, go_fd;
    uint64_t size;
} job;

static int gpu_produce(const test_daemon *d, void *arg) {
    const job *j = arg;
    return gpu_produce_sealed(d, "gpu0", j->size, "g", -1, -1, 7);
}

static int gpu_consume(const test_daemon *d, void *arg) {
    job *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    char x;
    if (j->go_fd >= 0 && read(j->go_fd, &x, 1) != 1)
        return 1;
    int r = gpu_open_verified(d->socket, "g", 5000, 7, &c, &b); /* 1, 2: 2, 3 */
    if (r)
        return 1 + r;
    if (write(j->ready_fd, "r", 1) != 1)
        return 4;
    if (read(j->hold_fd, &x, 1) != 1)
        return 5;
    return gpubuf_release(b) < 0 ? 6 : 0;
}

START_TEST(eight_gpu_consumers_at_once) {
    td_gates g;
    job j = {.size = 32 * MiB};
    pid_t p[8];
    td_gates_open(&g, &j.ready_fd, &j.hold_fd, &j.go_fd);
    ck_assert_int_eq(td_wait(td_spawn(gpu_produce, &D, &j)), 0);
    for (int i = 0; i < 8; i++)
        p[i] = td_spawn(gpu_consume, &D, &j);
    td_gates_pass(g.go[1], 8);
    td_gates_ready(&g, 8);
    ck_assert(td_wait_refs(&D, "g", 8, 1000));
    td_gates_pass(g.hold[1], 8);
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(td_wait(p[i]), 0);
    ck_assert(td_wait_refs(&D, "g", 0, 2000));
}
END_TEST

START_TEST(sigkill_gpu_consumer) {
    td_gates g;
    job j = {.size = 8 * MiB, .go_fd = -1};
    td_gates_open(&g, &j.ready_fd, &j.hold_fd, NULL);
    ck_assert_int_eq(td_wait(td_spawn(gpu_produce, &D, &j)), 0);
    pid_t p = td_spawn(gpu_consume, &D, &j);
    td_gates_ready(&g, 1);
    ck_assert(td_wait_refs(&D, "g", 1, 1000));
    kill(p, SIGKILL);
    ck_assert_int_eq(td_wait(p), 128 + SIGKILL);
    ck_assert(td_wait_refs(&D, "g", 0, 2000));
    gpubuf_client *c = td_connect(&D);
    ck_assert_int_eq(gpubuf_delete(c, "g"), 0);
    gpubuf_disconnect(c);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->pools[0].used, 0);
    gpubuf_status_free(s);
}
END_TEST

START_TEST(dedicated_slab_1gib) {
    job j = {.size = 1024 * MiB, .go_fd = -1, .ready_fd = -1, .hold_fd = -1};
    ck_assert_int_eq(td_wait(td_spawn(gpu_produce, &D, &j)), 0);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->pools[0].reserved, 1024 * MiB);
    ck_assert_uint_eq(s->pools[0].slabs, 1);
    gpubuf_status_free(s);
    const char *cons[] = {EXAMPLES_DIR "/gpubuf-consumer", "--socket", D.socket, "--name", "g",
                          "--seed", "7", "--delete", NULL};
    ck_assert_int_eq(td_run(cons), 0);
    s = td_status(&D);
    ck_assert_uint_eq(s->pools[0].reserved, 0);
    ck_assert_uint_eq(s->n_buffers, 0);
    gpubuf_status_free(s);
}
END_TEST

/* ---- faults on a cuda-ipc pool ---------------------------------------- */

/* A process that takes all but j->size bytes of device 0's free memory and
 * holds them until told to go. */
static int hog_body(const test_daemon *d, void *arg) {
    job *j = arg;
    const gpubuf_cuda *cu;
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    size_t free_b = 0, total = 0, chunk = 4 * GiB;
    char x;
    (void)d;
    if (gpubuf_cuda_load(&cu) < 0 || cu->DeviceGet(&dev, 0) != CUDA_SUCCESS ||
        cu->DevicePrimaryCtxRetain(&ctx, dev) != CUDA_SUCCESS ||
        cu->CtxSetCurrent(ctx) != CUDA_SUCCESS)
        return 1;
    for (int i = 0; i < 4096 && chunk >= 2 * MiB; i++) {
        if (cu->MemGetInfo(&free_b, &total) != CUDA_SUCCESS)
            return 2;
        if (free_b <= j->size + 2 * MiB)
            break;
        size_t want = free_b - j->size < chunk ? (free_b - j->size) & ~(2 * MiB - 1) : chunk;
        if (want < 2 * MiB || cu->MemAlloc(&p, want) != CUDA_SUCCESS)
            chunk /= 2;
    }
    cu->MemGetInfo(&free_b, &total);
    printf("hog: %.1f GiB of %.1f GiB taken, %.2f GiB free\n",
           (double)(total - free_b) / (double)GiB, (double)total / (double)GiB,
           (double)free_b / (double)GiB);
    fflush(stdout);
    if (write(j->ready_fd, "r", 1) != 1 || read(j->hold_fd, &x, 1) != 1)
        return 3;
    return 0; /* exiting frees everything */
}

/* With the device nearly full: a 4 GiB buffer (a dedicated slab) fails with
 * ENOMEM and the driver's words; a small one still works. */
static int oom_client(const test_daemon *d, void *arg) {
    gpubuf_client *c;
    gpubuf_buffer *b = NULL, *small;
    uint64_t bad = 1;
    (void)arg;
    if (gpubuf_connect(d->socket, &c) < 0)
        return 1;
    int r = gpubuf_alloc(c, "gpu0", 4 * GiB, "oom-big", &b);
    printf("oom: alloc 4 GiB: %s: %s\n", gpubuf_err_name(r), gpubuf_last_error_message());
    fflush(stdout);
    if (r != -ENOMEM || b || !strstr(gpubuf_last_error_message(), "CUDA_ERROR_OUT_OF_MEMORY") ||
        !strstr(gpubuf_last_error_message(), "cuMemAlloc"))
        return 2;
    if (gpubuf_alloc(c, "gpu0", 8 * MiB, "oom-small", &small) < 0)
        return 3;
    if (gpubuf_pattern_fill_device(gpubuf_buffer_device(small), gpubuf_buffer_device_ptr(small),
                                   8 * MiB, 5) < 0 ||
        gpubuf_pattern_verify_device(gpubuf_buffer_device(small),
                                     gpubuf_buffer_device_ptr(small), 8 * MiB, 5, &bad) < 0 ||
        bad)
        return 4;
    gpubuf_release(small);
    gpubuf_disconnect(c);
    return 0;
}

typedef struct alloc_job {
    uint64_t size;
    const char *name;
    uint32_t seed;
} alloc_job;

/* A new client of d allocates j->size bytes named j->name in "gpu0", fills
 * and checks them on the GPU (gpu_fill_verify), releases them and
 * disconnects: 0; 1: the connect or alloc failed; 2: the check did. */
static int alloc_check_free(const test_daemon *d, void *arg) {
    const alloc_job *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    if (gpubuf_connect(d->socket, &c) < 0 || gpubuf_alloc(c, "gpu0", j->size, j->name, &b) < 0)
        return 1;
    if (gpu_fill_verify(b, j->size, j->seed) < 0)
        return 2;
    gpubuf_release(b);
    gpubuf_disconnect(c);
    return 0;
}

/* What pid's fds are, on stderr (a failed fd count says what is left). */
static void fds_list(pid_t pid) {
    char path[32], link[64], target[256];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    if (!dir)
        return;
    for (struct dirent *e; (e = readdir(dir));) {
        snprintf(link, sizeof(link), "%s/%.20s", path, e->d_name);
        ssize_t n = readlink(link, target, sizeof(target) - 1);
        target[n > 0 ? n : 0] = '\0';
        fprintf(stderr, "gpubufd fd %s -> %s\n", e->d_name, target);
    }
    closedir(dir);
}

START_TEST(cuda_out_of_memory) {
    td_gates g;
    job j = {.size = 2 * GiB, .go_fd = -1};
    td_gates_open(&g, &j.ready_fd, &j.hold_fd, NULL);
    int fds0 = td_count_fds(D.pid);
    ck_assert_int_gt(fds0, 0);
    pid_t hog = td_spawn(hog_body, &D, &j);
    td_gates_ready(&g, 1);
    ck_assert_int_eq(td_wait(td_spawn(oom_client, &D, NULL)), 0);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 0); /* the failed alloc left nothing behind */
    ck_assert_uint_eq(s->pools[0].used, 0);
    ck_assert_uint_le(s->pools[0].reserved, 64 * MiB); /* at most the small one's slab */
    gpubuf_status_free(s);
    td_gates_pass(g.hold[1], 1);
    ck_assert_int_eq(td_wait(hog), 0);
    /* Once memory is back: the same 4 GiB request works and holds the data. */
    alloc_job big = {.size = 4 * GiB, .name = "oom-big", .seed = 6};
    ck_assert_int_eq(td_wait(td_spawn(alloc_check_free, &D, &big)), 0);
    s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 0);
    ck_assert_uint_eq(s->pools[0].used, 0);
    ck_assert_uint_le(s->pools[0].reserved, 64 * MiB);
    ck_assert_uint_eq(s->n_clients, 1); /* the asker */
    gpubuf_status_free(s);
    /* No fd leaked (a connection still being reaped at the first count may
     * have gone since; one closed just now may still be being reaped: the
     * count gets 5 s to come down). */
    int fds = td_count_fds(D.pid);
    for (int i = 0; i < 500 && fds > fds0; i++) {
        usleep(10 * 1000);
        fds = td_count_fds(D.pid);
    }
    if (fds > fds0)
        fds_list(D.pid);
    ck_assert_int_le(fds, fds0);
}
END_TEST

typedef struct term_job {
    int ready_fd, go_fd;
    const char *socket;
} term_job;

/* Holds a verified view while the daemon is stopped; then sees a clean error,
 * reconnects to the restarted daemon and works on. */
static int term_consumer(const test_daemon *d, void *arg) {
    term_job *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    char x;
    int r = gpu_open_verified(j->socket, "g", 5000, 7, &c, &b);
    if (r)
        return r;
    if (write(j->ready_fd, "r", 1) != 1 || read(j->go_fd, &x, 1) != 1)
        return 3;
    gpubuf_buffer_info info;
    r = gpubuf_stat(c, "g", &info);
    printf("sigterm: request after the daemon stopped: %s: %s\n", gpubuf_err_name(r),
           gpubuf_last_error_message());
    fflush(stdout);
    if (r != -ESHUTDOWN && r != GPUBUF_EDISCONNECTED && r != -ECONNRESET && r != -EPIPE)
        return 4;
    gpubuf_release(b); /* unmaps locally */
    gpubuf_disconnect(c);
    /* d: the same socket as j->socket, the restarted daemon's. */
    r = alloc_check_free(d, &(alloc_job){.size = 16 * MiB, .name = "after", .seed = 8}); /* 5, 6 */
    return r ? 4 + r : 0;
}

START_TEST(sigterm_with_gpu_clients) {
    static const char *const args[] = {"--pool", "gpu0=cuda-ipc,device=0,capacity=16G,slab=64M",
                                       NULL};
    td_gates g;
    job pj = {.size = 64 * MiB, .go_fd = -1, .ready_fd = -1, .hold_fd = -1};
    term_job tj = {.socket = D.socket};
    td_gates_open(&g, &tj.ready_fd, NULL, &tj.go_fd);
    ck_assert_int_eq(td_wait(td_spawn(gpu_produce, &D, &pj)), 0);
    pid_t p = td_spawn(term_consumer, &D, &tj);
    td_gates_ready(&g, 1);
    ck_assert(td_wait_refs(&D, "g", 1, 1000));
    /* SIGTERM with a GPU view mapped in a live client: the daemon exits 0. */
    ck_assert_int_eq(td_restart(&D, args), 0);
    td_gates_pass(g.go[1], 1);
    ck_assert_int_eq(td_wait(p), 0);
    assert_nothing_left();
}
END_TEST

/* ---- the device a client maps into ------------------------------------ */

typedef struct peer_job {
    int device;        /* gpubuf_set_device() argument */
    int memory_device; /* expected gpubuf_buffer_memory_device() */
    uint64_t size;
    uint32_t seed;
    const char *name;
} peer_job;

static int produce_on(const test_daemon *d, void *arg) {
    const peer_job *j = arg;
    char pool[16];
    snprintf(pool, sizeof(pool), "gpu%d", j->memory_device);
    return gpu_produce_sealed(d, pool, j->size, j->name, -1, j->memory_device, j->seed);
}

/* Open j->name mapped on j->device and check every word with a kernel there. */
static int consume_on(const test_daemon *d, void *arg) {
    peer_job *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    uint64_t bad = 1;
    uint32_t head[256];
    if (gpubuf_connect(d->socket, &c) < 0 || gpubuf_set_device(c, j->device) < 0 ||
        gpubuf_open(c, j->name, 5000, &b) < 0)
        return 1;
    if (gpubuf_buffer_device(b) != j->device || gpubuf_buffer_memory_device(b) != j->memory_device)
        return 2;
    if (gpubuf_pattern_verify_device(j->device, gpubuf_buffer_device_ptr(b), gpubuf_buffer_size(b),
                                     j->seed, &bad) < 0 ||
        bad)
        return 3;
    if (gpubuf_buffer_copy_to_host(b, 0, head, sizeof(head)) < 0 ||
        td_mismatches(head, sizeof(head), j->seed))
        return 4;
    /* The choice is pinned while a CUDA view lives. */
    if (gpubuf_set_device(c, -1) != -EBUSY)
        return 5;
    gpubuf_release(b);
    if (gpubuf_set_device(c, -1) != 0)
        return 6;
    int r = gpubuf_set_device(c, g_ngpus); /* one past the last GPU */
    if (r != GPUBUF_ENODEVICE)
        return 7;
    printf("set_device(%d): %s: %s\n", g_ngpus, gpubuf_err_name(r), gpubuf_last_error_message());
    fflush(stdout);
    gpubuf_disconnect(c);
    return 0;
}

START_TEST(set_device_same_gpu) {
    peer_job j = {.device = 0, .memory_device = 0, .size = 32 * MiB, .seed = 11, .name = "p"};
    ck_assert_int_eq(td_wait(td_spawn(produce_on, &D, &j)), 0);
    ck_assert_int_eq(td_wait(td_spawn(consume_on, &D, &j)), 0);
    ck_assert(td_wait_refs(&D, "p", 0, 2000));
}
END_TEST

/* ---- two or more GPUs ------------------------------------------------- */

static void start_default_config(void) {
    td_start(&D, NULL); /* no pools configured: one cuda-ipc pool per GPU */
}

START_TEST(default_config_pool_per_gpu) {
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->n_pools, (size_t)g_ngpus);
    for (int i = 0; i < g_ngpus; i++) {
        char name[16];
        snprintf(name, sizeof(name), "gpu%d", i);
        const gpubuf_pool_info *p = td_find_pool(s, name);
        ck_assert_ptr_nonnull(p);
        ck_assert_int_eq(p->kind, GPUBUF_POOL_CUDA_IPC);
        ck_assert_int_eq(p->device, i);
        ck_assert_str_eq(p->device_uuid, g_uuid[i]);
    }
    gpubuf_status_free(s);
}
END_TEST

/* A producer writes 1 GiB on GPU 0; a consumer whose context is on GPU 1
 * maps it there (peer access) and checks every word with a kernel on GPU 1;
 * and the other way round. */
START_TEST(cross_device_1gib) {
    peer_job a = {.device = 1, .memory_device = 0, .size = 1 * GiB, .seed = 21, .name = "x01"};
    /* Names are per pool: gpu1 is not the default pool (gpu0). */
    peer_job b = {.device = 0, .memory_device = 1, .size = 256 * MiB, .seed = 22,
                  .name = "/gpu1/x10"};
    ck_assert_int_eq(td_wait(td_spawn(produce_on, &D, &a)), 0);
    ck_assert_int_eq(td_wait(td_spawn(consume_on, &D, &a)), 0);
    ck_assert_int_eq(td_wait(td_spawn(produce_on, &D, &b)), 0);
    ck_assert_int_eq(td_wait(td_spawn(consume_on, &D, &b)), 0);
    gpubuf_client *c = td_connect(&D);
    ck_assert_int_eq(gpubuf_delete(c, "x01"), 0);
    ck_assert_int_eq(gpubuf_delete(c, "/gpu1/x10"), 0);
    gpubuf_disconnect(c);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 0);
    for (size_t i = 0; i < s->n_pools; i++)
        ck_assert_uint_eq(s->pools[i].used, 0);
    gpubuf_status_free(s);
}
END_TEST

/* Batches on a cuda-ipc pool: slabs travel as IPC handles, once each. */
START_TEST(ipc_batches_open_alloc_release) {
    gpu_batch_story(&D, "gpu0", false);
}
END_TEST

int main(void) {
    const gpu_case cases[] = {
        {"cuda-ipc", start_gpu, td_stop_clean,
         (const TTest *const[]){user_story_256mib, views_copies_and_mapping_cache,
                                eight_gpu_consumers_at_once, sigkill_gpu_consumer,
                                dedicated_slab_1gib, cuda_out_of_memory, sigterm_with_gpu_clients,
                                set_device_same_gpu, ipc_batches_open_alloc_release, NULL},
         1, NULL},
        {"multi-gpu", start_default_config, td_stop_clean,
         (const TTest *const[]){default_config_pool_per_gpu, cross_device_1gib, NULL}, 2,
         "the multi-gpu cases need two"},
    };
    return gpu_suite_main("test_gpu", "gpu", &g_ngpus, g_uuid, cases,
                          sizeof(cases) / sizeof(cases[0]));
}
