/* The vertical slice on a cuda-ipc pool (label "gpu"). Exits 77 (skip) when
 * no CUDA driver or device is present. The test process itself never
 * initialises CUDA: every CUDA call happens in a forked child or an exec'ed
 * example program, since a CUDA context does not survive fork(). */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cuda_driver.h"
#include "harness.h"
#include "internal.h"
#include "pattern.h"

#define MiB (1ull << 20)

static test_daemon D;

static void start_gpu(void) {
    static const char *const args[] = {"--pool", "gpu0=cuda-ipc,device=0,capacity=16G,slab=64M",
                                       NULL};
    td_start(&D, args);
}

static void stop_clean(void) {
    ck_assert_int_eq(td_stop(&D), 0);
}

/* Run an example program; returns its exit code. */
static int run_example(const char *const *argv) {
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return td_wait(p);
}

START_TEST(user_story_256mib) {
    const char *prod[] = {EXAMPLES_DIR "/gpubuf-producer", "--socket", D.socket, "--name",
                          "story", "--size", "256M", "--seed", "77", NULL};
    const char *cons[] = {EXAMPLES_DIR "/gpubuf-consumer", "--socket", D.socket, "--name",
                          "story", "--seed", "77", NULL};
    ck_assert_int_eq(run_example(prod), 0);
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
    if (c->n_maps != 0)
        return 12;
    gpubuf_disconnect(c);
    return 0;
}

START_TEST(views_copies_and_mapping_cache) {
    ck_assert_int_eq(td_wait(td_spawn(views_body, &D, NULL)), 0);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 0);
    ck_assert_uint_eq(s->pools[0].used, 0);
    gpubuf_status_free(s);
}
END_TEST

typedef struct job {
    int ready_fd, hold_fd, go_fd;
    uint64_t size;
} job;

static int gpu_produce(const test_daemon *d, void *arg) {
    job *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    if (gpubuf_connect(d->socket, &c) < 0 || gpubuf_alloc(c, "gpu0", j->size, "g", &b) < 0)
        return 1;
    if (gpubuf_pattern_fill_device(gpubuf_buffer_device(b), gpubuf_buffer_device_ptr(b), j->size,
                                   7) < 0)
        return 2;
    return gpubuf_seal_sync(b) < 0 ? 3 : 0;
}

static int gpu_consume(const test_daemon *d, void *arg) {
    job *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    uint64_t bad = 1;
    char x;
    if (j->go_fd >= 0 && read(j->go_fd, &x, 1) != 1)
        return 1;
    if (gpubuf_connect(d->socket, &c) < 0 || gpubuf_open(c, "g", 5000, &b) < 0)
        return 2;
    if (gpubuf_pattern_verify_device(gpubuf_buffer_device(b), gpubuf_buffer_device_ptr(b),
                                     gpubuf_buffer_size(b), 7, &bad) < 0 ||
        bad != 0)
        return 3;
    if (write(j->ready_fd, "r", 1) != 1)
        return 4;
    if (read(j->hold_fd, &x, 1) != 1)
        return 5;
    return gpubuf_release(b) < 0 ? 6 : 0;
}

START_TEST(eight_gpu_consumers_at_once) {
    int ready[2], hold[2], go[2];
    job j = {.size = 32 * MiB};
    pid_t p[8];
    ck_assert_int_eq(pipe(ready), 0);
    ck_assert_int_eq(pipe(hold), 0);
    ck_assert_int_eq(pipe(go), 0);
    j.ready_fd = ready[1];
    j.hold_fd = hold[0];
    j.go_fd = go[0];
    ck_assert_int_eq(td_wait(td_spawn(gpu_produce, &D, &j)), 0);
    for (int i = 0; i < 8; i++)
        p[i] = td_spawn(gpu_consume, &D, &j);
    ck_assert_int_eq(write(go[1], "gggggggg", 8), 8);
    for (int i = 0; i < 8; i++) {
        char x;
        ck_assert_int_eq(read(ready[0], &x, 1), 1);
    }
    ck_assert(td_wait_refs(&D, "g", 8, 1000));
    ck_assert_int_eq(write(hold[1], "hhhhhhhh", 8), 8);
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(td_wait(p[i]), 0);
    ck_assert(td_wait_refs(&D, "g", 0, 2000));
}
END_TEST

START_TEST(sigkill_gpu_consumer) {
    int ready[2], hold[2];
    job j = {.size = 8 * MiB, .go_fd = -1};
    ck_assert_int_eq(pipe(ready), 0);
    ck_assert_int_eq(pipe(hold), 0);
    j.ready_fd = ready[1];
    j.hold_fd = hold[0];
    ck_assert_int_eq(td_wait(td_spawn(gpu_produce, &D, &j)), 0);
    pid_t p = td_spawn(gpu_consume, &D, &j);
    char x;
    ck_assert_int_eq(read(ready[0], &x, 1), 1);
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
    ck_assert_int_eq(run_example(cons), 0);
    s = td_status(&D);
    ck_assert_uint_eq(s->pools[0].reserved, 0);
    ck_assert_uint_eq(s->n_buffers, 0);
    gpubuf_status_free(s);
}
END_TEST

/* Is there a CUDA driver and a device? Asked in a child, so that this
 * process never initialises CUDA. */
static bool have_gpu(void) {
#ifdef GPUBUF_HAVE_CUDA
    pid_t p = fork();
    if (p == 0) {
        const gpubuf_cuda *cu;
        int n = 0;
        if (gpubuf_cuda_load(&cu) < 0 || cu->DeviceGetCount(&n) != CUDA_SUCCESS || n < 1)
            _exit(1);
        _exit(0);
    }
    return td_wait(p) == 0;
#else
    return false;
#endif
}

int main(void) {
    if (!have_gpu()) {
        printf("test_gpu: no CUDA driver or device: skipped\n");
        return 77;
    }
    Suite *s = suite_create("gpu");
    TCase *t = tcase_create("cuda-ipc");
    tcase_add_checked_fixture(t, start_gpu, stop_clean);
    tcase_set_timeout(t, 120);
    tcase_add_test(t, user_story_256mib);
    tcase_add_test(t, views_copies_and_mapping_cache);
    tcase_add_test(t, eight_gpu_consumers_at_once);
    tcase_add_test(t, sigkill_gpu_consumer);
    tcase_add_test(t, dedicated_slab_1gib);
    suite_add_tcase(s, t);
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed ? 1 : 0;
}
