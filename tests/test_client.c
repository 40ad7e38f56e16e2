/* Integration tests on a host pool: a real gpubufd on a temporary socket and
 * real client processes using libgpubuf-client. */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "internal.h"
#include "pattern.h"
#include "check_main.h"

#define MiB (1ull << 20)

static void start_default(void) {
    static const char *const args[] = {"--pool", "host=host,capacity=1G,slab=16M",
                                       "--pool", "tiny=host,capacity=4M,slab=1M", NULL};
    td_start(&D, args);
}

/* Poll status until buffer `name` has `refs` references. */
/* ---- child process bodies ------------------------------------------------ */

typedef struct job {
    const char *name;
    uint64_t size;
    uint32_t seed;
    int ready_fd; /* write one byte when the buffer is open, or -1 */
    int go_fd;    /* wait for one byte before opening, or -1 */
    int hold_fd;  /* wait for one byte (or EOF) before releasing, or -1 */
    int timeout_ms;
} job;

static int produce(const test_daemon *d, void *arg) {
    job *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    if (td_connect_alloc(d, "host", j->size, j->name, &c, &b) < 0)
        return 11;
    gpubuf_pattern_fill(gpubuf_buffer_host_ptr(b), j->size, j->seed);
    if (gpubuf_seal_sync(b) < 0)
        return 12;
    /* Exit without releasing: the daemon drops the reference. */
    return 0;
}

static int consume(const test_daemon *d, void *arg) {
    job *j = arg;
    gpubuf_client *c;
    gpubuf_buffer *b;
    char x;
    if (j->go_fd >= 0 && read(j->go_fd, &x, 1) < 0)
        return 9;
    if (td_connect_open(d, j->name, j->timeout_ms, &c, &b) < 0)
        return 11;
    if (gpubuf_buffer_size(b) != j->size)
        return 12;
    if (gpubuf_pattern_mismatches(gpubuf_buffer_host_ptr(b), j->size, j->seed) != 0)
        return 13;
    if (j->ready_fd >= 0 && write(j->ready_fd, "r", 1) != 1)
        return 14;
    if (j->hold_fd >= 0 && read(j->hold_fd, &x, 1) < 0)
        return 15;
    if (gpubuf_release(b) < 0)
        return 16;
    gpubuf_disconnect(c);
    return 0;
}

/* ---- tests ----------------------------------------------------------------- */

START_TEST(connect_and_handshake) {
    gpubuf_client *c = td_connect(&D);
    ck_assert_uint_gt(c->session_id, 0);
    ck_assert_uint_eq(c->max_request, 64 * 1024);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(connect_no_daemon) {
    gpubuf_client *c = NULL;
    char path[160];
    snprintf(path, sizeof(path), "%s/nothing.sock", D.dir);
    ck_assert_int_eq(gpubuf_connect(path, &c), -ENOENT);
    ck_assert_ptr_null(c);
    ck_assert(strstr(gpubuf_last_error_message(), "nothing.sock") != NULL);
}
END_TEST

START_TEST(connect_env_socket) {
    gpubuf_client *c = NULL;
    setenv("GPUBUF_SOCKET", D.socket, 1);
    ck_assert_int_eq(gpubuf_connect(NULL, &c), 0);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(alloc_view_attributes) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b = td_alloc(c, "host", 1000, "attrs");
    ck_assert_uint_eq(gpubuf_buffer_size(b), 1000);
    ck_assert_int_eq(gpubuf_buffer_pool_kind(b), GPUBUF_POOL_HOST);
    ck_assert_int_eq(gpubuf_buffer_device(b), -1);
    ck_assert_ptr_nonnull(gpubuf_buffer_host_ptr(b));
    ck_assert_uint_eq(gpubuf_buffer_device_ptr(b), (uint64_t)(uintptr_t)gpubuf_buffer_host_ptr(b));
    ck_assert_str_eq(gpubuf_buffer_name(b), "attrs");
    ck_assert_uint_gt(gpubuf_buffer_id(b), 0);
    ck_assert_int_eq(gpubuf_buffer_device_ptr(b) % 256, 0);
    gpubuf_buffer_info info;
    ck_assert_int_eq(gpubuf_stat(c, "attrs", &info), 0);
    ck_assert_int_eq(info.state, GPUBUF_STATE_ALLOCATED);
    ck_assert_uint_eq(info.refs, 1);
    ck_assert_int_eq(gpubuf_seal(b), 0);
    ck_assert_int_eq(gpubuf_stat(c, "attrs", &info), 0);
    ck_assert_int_eq(info.state, GPUBUF_STATE_SEALED);
    ck_assert_int_eq(gpubuf_seal(b), GPUBUF_ESTATE);
    ck_assert_int_eq(gpubuf_release(b), 0);
    gpubuf_disconnect(c);
}
END_TEST

/* In a child: the CUDA driver may be loaded there, never in the test process. */
static int set_device_body(const test_daemon *d, void *arg) {
    gpubuf_client *c;
    gpubuf_buffer *b;
    (void)arg;
    if (gpubuf_connect(d->socket, &c) < 0)
        return 1;
    if (gpubuf_set_device(c, -2) != -EINVAL || gpubuf_set_device(c, 64) != -EINVAL ||
        gpubuf_set_device(NULL, 0) != -EINVAL)
        return 2;
    /* Host views do not pin the choice. */
    if (gpubuf_alloc(c, "host", 4096, NULL, &b) < 0 || gpubuf_set_device(c, -1) != 0 ||
        gpubuf_buffer_memory_device(b) != -1 || gpubuf_buffer_device(b) != -1)
        return 3;
    /* Device 63 exists nowhere this runs; without a driver: ENODRIVER. */
    int r = gpubuf_set_device(c, 63);
    if (r != GPUBUF_ENODEVICE && r != GPUBUF_ENODRIVER && r != GPUBUF_ECUDA)
        return 4;
    if (!*gpubuf_last_error_message())
        return 5;
    gpubuf_release(b);
    gpubuf_disconnect(c);
    return 0;
}

START_TEST(set_device_checks) {
    ck_assert_int_eq(td_wait(td_spawn(set_device_body, &D, NULL)), 0);
}
END_TEST

START_TEST(default_pool_is_first) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    gpubuf_buffer_info info;
    ck_assert_int_eq(gpubuf_alloc(c, NULL, 4096, "dflt", &b), 0);
    ck_assert_int_eq(gpubuf_stat(c, "dflt", &info), 0);
    ck_assert_str_eq(info.pool, "host");
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(producer_exits_before_consumers) {
    job j = {.name = "story", .size = 32 * MiB, .seed = 1234, .ready_fd = -1, .go_fd = -1,
             .hold_fd = -1, .timeout_ms = 0};
    ck_assert_int_eq(td_wait(td_spawn(produce, &D, &j)), 0);
    /* Producer gone: the sealed buffer stays, with no references. */
    ck_assert(td_wait_refs(&D, "story", 0, 2000));
    pid_t p[3];
    for (int i = 0; i < 3; i++)
        p[i] = td_spawn(consume, &D, &j);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(td_wait(p[i]), 0);
    ck_assert(td_wait_refs(&D, "story", 0, 2000));
    gpubuf_client *c = td_connect(&D);
    ck_assert_int_eq(gpubuf_delete(c, "story"), 0);
    gpubuf_disconnect(c);
    gpubuf_status *s = td_status(&D);
    ck_assert_ptr_null(td_find_buffer(s, "story"));
    ck_assert_uint_eq(td_find_pool(s, "host")->used, 0);
    ck_assert_uint_eq(td_find_pool(s, "host")->buffers, 0);
    gpubuf_status_free(s);
}
END_TEST

START_TEST(sigkill_consumer_loses_references) {
    job j = {.name = "victim", .size = MiB, .seed = 9, .go_fd = -1, .timeout_ms = 0};
    td_gates g;
    ck_assert_int_eq(td_wait(td_spawn(produce, &D, &j)), 0);
    td_gates_open(&g, &j.ready_fd, &j.hold_fd, NULL);
    pid_t p = td_spawn(consume, &D, &j);
    td_gates_ready(&g, 1);
    ck_assert(td_wait_refs(&D, "victim", 1, 1000));
    kill(p, SIGKILL);
    ck_assert_int_eq(td_wait(p), 128 + SIGKILL);
    ck_assert(td_wait_refs(&D, "victim", 0, 2000));
    ck_assert(td_wait_clients(&D, 0, 2000));
    close(g.hold[1]);
}
END_TEST

START_TEST(eight_processes_open_at_once) {
    job j = {.name = "shared8", .size = 8 * MiB, .seed = 88, .timeout_ms = 5000};
    td_gates g;
    pid_t p[8];
    td_gates_open(&g, &j.ready_fd, &j.hold_fd, &j.go_fd);
    ck_assert_int_eq(td_wait(td_spawn(produce, &D, &j)), 0);
    /* Release all eight at once. */
    td_gates_run(&g, p, 8, consume, &D, &j);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(td_find_buffer(s, "shared8")->refs, 8);
    size_t with_refs = 0;
    for (size_t i = 0; i < s->n_clients; i++)
        if (s->clients[i].references == 1 && s->clients[i].buffers_held == 1)
            with_refs++;
    ck_assert_uint_eq(with_refs, 8);
    gpubuf_status_free(s);
    /* Children inherited the write end too: send one byte each, not EOF. */
    td_gates_pass(g.hold[1], 8);
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(td_wait(p[i]), 0);
    ck_assert(td_wait_refs(&D, "shared8", 0, 2000));
}
END_TEST

static int write_then_exit(const test_daemon *d, void *arg) {
    uint64_t id = 0;
    gpubuf_client *c;
    gpubuf_buffer *b;
    (void)arg;
    if (td_connect_alloc(d, "host", 3 * MiB, NULL, &c, &b) < 0)
        return 1;
    memset(gpubuf_buffer_host_ptr(b), 0x5a, 3 * MiB);
    if (gpubuf_seal_sync(b) < 0)
        return 2;
    id = gpubuf_buffer_id(b);
    /* Hand the id to the parent and wait until it has opened the buffer. */
    int *fds = arg;
    if (write(fds[1], &id, sizeof(id)) != sizeof(id))
        return 3;
    char x;
    if (read(fds[2], &x, 1) != 1)
        return 4;
    gpubuf_release(b);
    gpubuf_disconnect(c);
    return 0;
}

START_TEST(anonymous_buffer_by_id_across_processes) {
    int idp[2], gop[2];
    uint64_t id;
    ck_assert_int_eq(pipe(idp), 0);
    ck_assert_int_eq(pipe(gop), 0);
    int fds[3] = {idp[0], idp[1], gop[0]};
    pid_t p = td_spawn(write_then_exit, &D, fds);
    ck_assert_int_eq(read(idp[0], &id, sizeof(id)), sizeof(id));
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    ck_assert_int_eq(gpubuf_open_id(c, id, 0, &b), 0);
    ck_assert_str_eq(gpubuf_buffer_name(b), "");
    const uint8_t *h = gpubuf_buffer_host_ptr(b);
    for (uint64_t i = 0; i < 3 * MiB; i += 4093)
        ck_assert_int_eq(h[i], 0x5a);
    ck_assert_int_eq(write(gop[1], "x", 1), 1);
    ck_assert_int_eq(td_wait(p), 0);
    /* The writer is gone; our reference keeps the anonymous buffer. */
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 1);
    ck_assert_uint_eq(s->buffers[0].refs, 1);
    gpubuf_status_free(s);
    ck_assert_int_eq(gpubuf_release(b), 0);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 0);
    ck_assert_uint_eq(td_find_pool(s, "host")->used, 0);
    gpubuf_status_free(s);
    gpubuf_disconnect(c);
}
END_TEST

static int seal_later(const test_daemon *d, void *arg) {
    gpubuf_client *c;
    gpubuf_buffer *b;
    (void)arg;
    if (td_connect_alloc(d, "host", 4096, "later", &c, &b) < 0)
        return 1;
    gpubuf_pattern_fill(gpubuf_buffer_host_ptr(b), 4096, 5);
    /* Seal once the other client's open waits for it. */
    if (!td_wait_waiting_opens(d, 1, 10000))
        return 3;
    return gpubuf_seal(b) < 0 ? 2 : 0;
}

START_TEST(open_waits_for_seal) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    pid_t p = td_spawn(seal_later, &D, NULL);
    ck_assert_int_eq(gpubuf_open(c, "later", 5000, &b), 0);
    ck_assert_uint_eq(gpubuf_pattern_mismatches(gpubuf_buffer_host_ptr(b), 4096, 5), 0);
    ck_assert_int_eq(td_wait(p), 0);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(open_wait_forever_then_seal) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    pid_t p = td_spawn(seal_later, &D, NULL);
    ck_assert_int_eq(gpubuf_open(c, "later", -1, &b), 0);
    ck_assert_int_eq(td_wait(p), 0);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(open_timeout_and_missing) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b = NULL;
    struct timespec t0, t1;
    ck_assert_int_eq(gpubuf_open(c, "never", 0, &b), -ENOENT);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(gpubuf_open(c, "never", 150, &b), -ETIMEDOUT);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    ck_assert(ms >= 140);
    ck_assert(strstr(gpubuf_last_error_message(), "never") != NULL);
    ck_assert_ptr_null(b);
    ck_assert_int_eq(gpubuf_open_id(c, 999999, 100, &b), -ENOENT);
    /* The connection still works. */
    gpubuf_buffer *x = td_alloc(c, "host", 10, NULL);
    gpubuf_release(x);
    gpubuf_disconnect(c);
}
END_TEST

/* A thread waiting for a reply polls the socket for GPUBUF_SPIN_US at most
 * (here the most it takes, 1 ms), then sleeps: a 300 ms wait costs it far
 * less than 300 ms of CPU. */
START_TEST(waiting_thread_sleeps_after_spin) {
    setenv("GPUBUF_SPIN_US", "1000", 1);
    gpubuf_client *c = td_connect(&D);
    unsetenv("GPUBUF_SPIN_US");
    gpubuf_buffer *b = NULL;
    gpubuf_buffer_info info;
    struct timespec t0, t1, w0, w1;
    for (int i = 0; i < 20; i++) /* quick replies: the thread polls for the next */
        ck_assert_int_eq(gpubuf_stat(c, "never", &info), -ENOENT);
    clock_gettime(CLOCK_MONOTONIC, &w0);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    ck_assert_int_eq(gpubuf_open(c, "never", 300, &b), -ETIMEDOUT);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
    clock_gettime(CLOCK_MONOTONIC, &w1);
    double cpu = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    double wall = (double)(w1.tv_sec - w0.tv_sec) * 1e3 + (double)(w1.tv_nsec - w0.tv_nsec) / 1e6;
    ck_assert_msg(wall >= 290, "the open waited %.1f ms", wall);
    ck_assert_msg(cpu < 100, "waiting 300 ms took %.1f ms of CPU", cpu);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(names_and_errors) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *a, *b = NULL;
    char longname[300];
    ck_assert_int_eq(gpubuf_alloc(c, "host", 10, "dup", &a), 0);
    ck_assert_int_eq(gpubuf_alloc(c, "host", 10, "dup", &b), -EEXIST);
    ck_assert_int_eq(gpubuf_alloc(c, "nope", 10, "x", &b), GPUBUF_ENOPOOL);
    ck_assert(strstr(gpubuf_last_error_message(), "nope") != NULL);
    ck_assert_int_eq(gpubuf_alloc(c, "host", 10, "bad name", &b), -EINVAL);
    memset(longname, 'n', sizeof(longname));
    longname[299] = '\0';
    ck_assert_int_eq(gpubuf_alloc(c, "host", 10, longname, &b), -ENAMETOOLONG);
    ck_assert_int_eq(gpubuf_alloc(c, "host", 0, "zero", &b), -EINVAL);
    ck_assert_int_eq(gpubuf_delete(c, "missing"), -ENOENT);
    ck_assert_ptr_null(b);
    gpubuf_release(a);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(pool_full_then_recovers) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b[4], *x = NULL;
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(gpubuf_alloc(c, "tiny", MiB, NULL, &b[i]), 0);
    ck_assert_int_eq(gpubuf_alloc(c, "tiny", MiB, NULL, &x), GPUBUF_EPOOLFULL);
    ck_assert(strstr(gpubuf_last_error_message(), "tiny") != NULL);
    ck_assert_int_eq(gpubuf_alloc(c, "tiny", 64 * MiB, NULL, &x), GPUBUF_EPOOLFULL);
    gpubuf_release(b[2]);
    ck_assert_int_eq(gpubuf_alloc(c, "tiny", MiB, NULL, &x), 0);
    gpubuf_release(x);
    for (int i = 0; i < 4; i++)
        if (i != 2)
            gpubuf_release(b[i]);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(td_find_pool(s, "tiny")->used, 0);
    gpubuf_status_free(s);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(delete_while_referenced) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *a, *o, *n;
    ck_assert_int_eq(gpubuf_alloc(c, "host", MiB, "reuse", &a), 0);
    ck_assert_int_eq(gpubuf_seal(a), 0);
    ck_assert_int_eq(gpubuf_open(c, "reuse", 0, &o), 0);
    ck_assert_int_eq(gpubuf_delete(c, "reuse"), 0);
    ck_assert_int_eq(gpubuf_open(c, "reuse", 0, &n), -ENOENT);
    /* The deleted buffer still holds its memory while referenced. */
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 1);
    ck_assert_int_eq(s->buffers[0].state, GPUBUF_STATE_DELETED);
    ck_assert_uint_eq(s->buffers[0].refs, 2);
    ck_assert_uint_ge(td_find_pool(s, "host")->used, MiB);
    gpubuf_status_free(s);
    /* The name is free again at once. */
    ck_assert_int_eq(gpubuf_alloc(c, "host", MiB, "reuse", &n), 0);
    ck_assert_uint_ne(gpubuf_buffer_id(n), gpubuf_buffer_id(a));
    ck_assert_int_eq(gpubuf_release(a), 0);
    ck_assert_int_eq(gpubuf_release(o), 0);
    ck_assert_int_eq(gpubuf_flush(c), 0);
    s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 1);
    ck_assert_uint_eq(s->buffers[0].id, gpubuf_buffer_id(n));
    gpubuf_status_free(s);
    gpubuf_release(n);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(slices_keep_parent_alive) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b, *s1, *s2, *bad = NULL;
    ck_assert_int_eq(gpubuf_alloc(c, "host", 4096, "sliced", &b), 0);
    gpubuf_pattern_fill(gpubuf_buffer_host_ptr(b), 4096, 3);
    ck_assert_int_eq(gpubuf_seal(b), 0);
    ck_assert_int_eq(gpubuf_buffer_slice(b, 1024, 2048, &s1), 0);
    ck_assert_int_eq(gpubuf_buffer_slice(s1, 512, 512, &s2), 0);
    ck_assert_uint_eq(gpubuf_buffer_device_ptr(s1), gpubuf_buffer_device_ptr(b) + 1024);
    ck_assert_uint_eq(gpubuf_buffer_device_ptr(s2), gpubuf_buffer_device_ptr(b) + 1536);
    ck_assert_uint_eq(gpubuf_buffer_size(s2), 512);
    ck_assert_uint_eq(gpubuf_buffer_id(s2), gpubuf_buffer_id(b));
    ck_assert_int_eq(gpubuf_buffer_slice(b, 4000, 97, &bad), GPUBUF_ERANGE);
    ck_assert_int_eq(gpubuf_buffer_slice(b, 4097, 0, &bad), GPUBUF_ERANGE);
    ck_assert_int_eq(gpubuf_buffer_slice(b, 1, UINT64_MAX, &bad), GPUBUF_ERANGE);
    ck_assert_ptr_null(bad);
    /* Drop the parent and the middle slice: s2 keeps everything alive. */
    ck_assert_int_eq(gpubuf_release(b), 0);
    ck_assert_int_eq(gpubuf_release(s1), 0);
    ck_assert_uint_eq(c->n_maps, 1);
    ck_assert(td_wait_refs(&D, "sliced", 1, 1000));
    uint32_t w[128];
    ck_assert_int_eq(gpubuf_buffer_copy_to_host(s2, 0, w, sizeof(w)), 0);
    for (int i = 0; i < 128; i++)
        ck_assert_uint_eq(w[i], gpubuf_pattern_word(384 + (uint64_t)i, 3));
    ck_assert_int_eq(gpubuf_release(s2), 0);
    ck_assert_uint_eq(c->n_maps, 1); /* no view left: kept mapped, idle */
    ck_assert_uint_eq(c->n_idle, 1);
    ck_assert(td_wait_refs(&D, "sliced", 0, 1000));
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(copy_helpers) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    uint8_t in[1000], out[1000];
    ck_assert_int_eq(gpubuf_alloc(c, "host", 1000, NULL, &b), 0);
    for (int i = 0; i < 1000; i++)
        in[i] = (uint8_t)(i * 7);
    ck_assert_int_eq(gpubuf_buffer_copy_from_host(b, 0, in, 1000), 0);
    memset(out, 0, sizeof(out));
    ck_assert_int_eq(gpubuf_buffer_copy_to_host(b, 100, out, 900), 0);
    ck_assert_mem_eq(out, in + 100, 900);
    ck_assert_int_eq(gpubuf_buffer_copy_to_host(b, 900, out, 101), GPUBUF_ERANGE);
    ck_assert_int_eq(gpubuf_buffer_copy_from_host(b, 1001, in, 0), GPUBUF_ERANGE);
    ck_assert_int_eq(gpubuf_buffer_copy_from_host(b, 1000, in, 0), 0);
    ck_assert_int_eq(gpubuf_buffer_copy_to_host(b, 0, NULL, 10), -EINVAL);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(mapping_cache_one_map_per_slab) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b[10];
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(gpubuf_alloc(c, "host", 100 * 1024, NULL, &b[i]), 0);
    /* Ten buffers carved from one 16 MiB slab: one mapping. */
    ck_assert_uint_eq(c->n_maps, 1);
    ck_assert_uint_eq(c->maps->views, 10);
    gpubuf_status *s = td_status(&D);
    for (int i = 1; i < 10; i++) {
        ck_assert_uint_eq(s->buffers[0].slab_id, s->buffers[i].slab_id);
    }
    gpubuf_status_free(s);
    /* Addresses are consistent with slab offsets. */
    gpubuf_buffer_info i0, i1;
    (void)i0, (void)i1;
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(gpubuf_release(b[i]), 0);
    ck_assert_uint_eq(c->n_maps, 1);
    ck_assert_uint_eq(c->n_idle, 1);
    ck_assert_uint_eq(c->maps->views, 0);
    gpubuf_disconnect(c);
}
END_TEST

static const gpubuf_client_info *find_client(const gpubuf_status *s, uint64_t session) {
    for (size_t i = 0; i < s->n_clients; i++)
        if (s->clients[i].session_id == session)
            return &s->clients[i];
    return NULL;
}

/* KEEP_MAPPED: a slab stays mapped after its last view and the daemon keeps
 * it (pinned) until the client unmaps it or goes; later buffers of the
 * client land in it without a new mapping; at most GPUBUF_KEEP_SLABS. */
START_TEST(kept_slabs_pinned_reused_evicted) {
    gpubuf_client *a = td_connect(&D), *b = td_connect(&D), *x;
    gpubuf_buffer *ba, *bb, *v[6];
    gpubuf_buffer_info ia, ib;
    ck_assert_uint_eq(a->keep_cap, GPUBUF_KEEP_SLABS);
    /* 768 KiB each in the 1 MiB slabs of "tiny": two slabs. */
    ck_assert_int_eq(gpubuf_alloc(a, "tiny", 768 << 10, "ka", &ba), 0);
    ck_assert_int_eq(gpubuf_alloc(b, "tiny", 768 << 10, "kb", &bb), 0);
    ck_assert_int_eq(gpubuf_seal(ba), 0);
    ck_assert_int_eq(gpubuf_seal(bb), 0);
    ck_assert_int_eq(gpubuf_stat(a, "/tiny/ka", &ia), 0);
    ck_assert_int_eq(gpubuf_stat(a, "/tiny/kb", &ib), 0);
    ck_assert_uint_ne(ia.slab_id, ib.slab_id);
    ck_assert_int_eq(gpubuf_release(ba), 0);
    ck_assert_int_eq(gpubuf_release(bb), 0);
    ck_assert_int_eq(gpubuf_delete(a, "/tiny/ka"), 0);
    ck_assert_int_eq(gpubuf_delete(b, "/tiny/kb"), 0);
    ck_assert_int_eq(gpubuf_flush(a), 0);
    ck_assert_int_eq(gpubuf_flush(b), 0);
    /* Both slabs are empty; an empty slab beyond the spare would go, but
     * each is kept by a client. */
    gpubuf_status *s = td_status(&D);
    const gpubuf_pool_info *tiny = td_find_pool(s, "tiny");
    ck_assert_uint_eq(tiny->used, 0);
    ck_assert_uint_eq(tiny->slabs, 2);
    ck_assert_uint_eq(find_client(s, a->session_id)->kept_slabs, 1);
    ck_assert_uint_eq(find_client(s, b->session_id)->kept_slabs, 1);
    gpubuf_status_free(s);
    ck_assert_uint_eq(a->n_maps, 1);
    ck_assert_uint_eq(a->n_idle, 1);
    /* a's next buffer goes to the slab it keeps: no new mapping. */
    void *old_base = (void *)(uintptr_t)a->idle->base;
    ck_assert_int_eq(gpubuf_alloc(a, "tiny", 4096, "ka2", &ba), 0);
    ck_assert_int_eq(gpubuf_stat(a, "/tiny/ka2", &ia), 0);
    ck_assert_uint_eq(ia.slab_id, a->maps->slab_id);
    ck_assert_ptr_eq((void *)(uintptr_t)ba->map->base, old_base);
    ck_assert_uint_eq(a->n_idle, 0);
    ck_assert_uint_eq(a->n_maps, 1);
    ck_assert_int_eq(gpubuf_release(ba), 0);
    /* b goes: its slab is unpinned and, empty beyond the spare, freed. */
    gpubuf_disconnect(b);
    ck_assert(td_wait_clients(&D, 1, 2000));
    s = td_status(&D);
    ck_assert_uint_eq(td_find_pool(s, "tiny")->slabs, 1);
    gpubuf_status_free(s);
    /* Eviction: buffers in six slabs of "host" (16 MiB slabs, 12 MiB each). */
    x = td_connect(&D);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(gpubuf_alloc(x, "host", 12 * MiB, NULL, &v[i]), 0);
    ck_assert_uint_eq(x->n_maps, 6);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(gpubuf_release(v[i]), 0);
    ck_assert_uint_eq(x->n_maps, GPUBUF_KEEP_SLABS);
    ck_assert_uint_eq(x->n_idle, GPUBUF_KEEP_SLABS);
    ck_assert_int_eq(gpubuf_flush(x), 0);
    s = td_status(&D);
    ck_assert_uint_eq(find_client(s, x->session_id)->kept_slabs, GPUBUF_KEEP_SLABS);
    /* The anonymous buffers are gone; only the kept slabs (and a spare) stay. */
    ck_assert_uint_eq(td_find_pool(s, "host")->used, 0);
    ck_assert_uint_le(td_find_pool(s, "host")->slabs, GPUBUF_KEEP_SLABS + 1);
    gpubuf_status_free(s);
    gpubuf_disconnect(x);
    gpubuf_delete(a, "/tiny/ka2");
    gpubuf_disconnect(a);
    ck_assert(td_wait_clients(&D, 0, 2000));
    s = td_status(&D);
    for (size_t i = 0; i < s->n_pools; i++) {
        ck_assert_uint_eq(s->pools[i].used, 0);
        ck_assert_uint_le(s->pools[i].slabs, 1); /* at most the spare */
    }
    gpubuf_status_free(s);
}
END_TEST

START_TEST(disconnect_with_live_views) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b = td_alloc(c, "host", 4096, "orphan");
    ck_assert_int_eq(gpubuf_seal(b), 0);
    gpubuf_disconnect(c);
    /* The daemon dropped our reference; the local mapping is still usable. */
    ck_assert(td_wait_refs(&D, "orphan", 0, 2000));
    memset(gpubuf_buffer_host_ptr(b), 1, 4096);
    ck_assert_int_eq(gpubuf_release(b), 0);
}
END_TEST

START_TEST(unsealed_buffer_of_dead_client_is_freed) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b = td_alloc(c, "host", MiB, "draft");
    gpubuf_disconnect(c);
    gpubuf_release(b);
    ck_assert(td_wait_clients(&D, 0, 2000));
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 0);
    ck_assert_uint_eq(td_find_pool(s, "host")->used, 0);
    gpubuf_status_free(s);
}
END_TEST

static void *blocked_open(void *arg) {
    gpubuf_client *c = arg;
    gpubuf_buffer *b;
    return (void *)(intptr_t)gpubuf_open(c, "never", -1, &b);
}

START_TEST(disconnect_wakes_a_blocked_open) {
    gpubuf_client *c = td_connect(&D);
    pthread_t th;
    void *ret;
    pthread_create(&th, NULL, blocked_open, c);
    ck_assert(td_wait_waiting_opens(&D, 1, 10000)); /* the open is blocked in the daemon */
    /* Keep one reference on the client so the other thread's c stays valid. */
    atomic_fetch_add(&c->refs, 1);
    gpubuf_disconnect(c);
    pthread_join(th, &ret);
    ck_assert_int_eq((int)(intptr_t)ret, GPUBUF_EDISCONNECTED);
    gpubuf__client_unref(c);
}
END_TEST

typedef struct thr {
    gpubuf_client *c;
    int idx;
    int failures;
} thr;

static void *thread_body(void *arg) {
    thr *t = arg;
    char name[32];
    for (int i = 0; i < 50; i++) {
        gpubuf_buffer *b, *o;
        snprintf(name, sizeof(name), "t%d-%d", t->idx, i);
        if (gpubuf_alloc(t->c, "host", 4096, name, &b) < 0 || gpubuf_seal(b) < 0 ||
            gpubuf_open(t->c, name, 0, &o) < 0) {
            t->failures++;
            continue;
        }
        if (gpubuf_buffer_device_ptr(o) != gpubuf_buffer_device_ptr(b))
            t->failures++;
        /* A stat's reply lives in the connection's arena while it is read:
         * the other threads' replies meanwhile go elsewhere. */
        gpubuf_buffer_info info;
        if (gpubuf_stat(t->c, name, &info) < 0 || info.size != 4096 ||
            info.id != gpubuf_buffer_id(b))
            t->failures++;
        gpubuf_release(o);
        gpubuf_release(b);
        if (gpubuf_delete(t->c, name) < 0)
            t->failures++;
    }
    return NULL;
}

START_TEST(threads_share_one_client) {
    gpubuf_client *c = td_connect(&D);
    pthread_t th[4];
    thr t[4];
    for (int i = 0; i < 4; i++) {
        t[i] = (thr){c, i, 0};
        pthread_create(&th[i], NULL, thread_body, &t[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        ck_assert_int_eq(t[i].failures, 0);
    }
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->n_buffers, 0);
    ck_assert_uint_eq(td_find_pool(s, "host")->used, 0);
    gpubuf_status_free(s);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(async_seal_and_release_semantics) {
    gpubuf_client *a = td_connect(&D), *b = td_connect(&D);
    gpubuf_buffer *x, *o, *sl;
    ck_assert_int_eq(gpubuf_alloc(a, "host", 4096, "async", &x), 0);
    ck_assert_int_eq(gpubuf_buffer_slice(x, 0, 16, &sl), 0);
    /* Sealing through a slice seals its buffer, once. */
    ck_assert_int_eq(gpubuf_seal_sync(sl), 0);
    ck_assert_int_eq(gpubuf_seal(x), GPUBUF_ESTATE);
    /* After seal_sync another connection opens it at once, without waiting. */
    ck_assert_int_eq(gpubuf_open(b, "async", 0, &o), 0);
    /* Only the allocating connection seals. */
    ck_assert_int_eq(gpubuf_seal(o), -EPERM);
    /* Many releases without a reply in between: bounded, all applied. */
    for (int i = 0; i < 300; i++) {
        gpubuf_buffer *v;
        ck_assert_int_eq(gpubuf_open(b, "async", 0, &v), 0);
        ck_assert_int_eq(gpubuf_release(v), 0);
    }
    gpubuf_buffer *many[200];
    for (int i = 0; i < 200; i++)
        ck_assert_int_eq(gpubuf_open(b, "async", 0, &many[i]), 0);
    for (int i = 0; i < 200; i++)
        ck_assert_int_eq(gpubuf_release(many[i]), 0);
    ck_assert_int_eq(gpubuf_flush(b), 0);
    ck_assert(td_wait_refs(&D, "async", 2, 10));
    gpubuf_release(o);
    gpubuf_release(sl);
    gpubuf_release(x);
    ck_assert_int_eq(gpubuf_flush(a), 0);
    ck_assert_int_eq(gpubuf_flush(b), 0);
    ck_assert(td_wait_refs(&D, "async", 0, 10));
    gpubuf_disconnect(a);
    gpubuf_disconnect(b);
}
END_TEST

static int seal_many_then_go(const test_daemon *d, void *arg) {
    int how = (int)(intptr_t)arg, n = 63;
    gpubuf_client *c;
    gpubuf_buffer *b[63];
    char name[32];
    if (gpubuf_connect(d->socket, &c) < 0)
        return 1;
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof(name), "late/%d", i);
        if (gpubuf_alloc(c, "host", 4096, name, &b[i]) < 0)
            return 2;
    }
    /* 63 seals in flight, none answered yet, then away. */
    for (int i = 0; i < n; i++)
        if (gpubuf_seal(b[i]) < 0)
            return 3;
    if (how == 0)
        gpubuf_disconnect(c);
    _exit(0); /* or simply exit with the connection open */
}

START_TEST(requests_in_flight_at_exit_are_applied) {
    for (int round = 0; round < 20; round++) {
        ck_assert_int_eq(td_wait(td_spawn(seal_many_then_go, &D, (void *)(intptr_t)(round % 2))),
                         0);
        ck_assert(td_wait_clients(&D, 0, 2000));
        gpubuf_status *s = td_status(&D);
        size_t sealed = 0;
        for (size_t i = 0; i < s->n_buffers; i++)
            sealed += s->buffers[i].state == GPUBUF_STATE_SEALED && s->buffers[i].refs == 0;
        ck_assert_msg(sealed == 63 && s->n_buffers == 63, "round %d: %zu of %zu sealed", round,
                      sealed, s->n_buffers);
        gpubuf_status_free(s);
        gpubuf_client *c = td_connect(&D);
        for (int i = 0; i < 63; i++) {
            char name[32];
            snprintf(name, sizeof(name), "late/%d", i);
            ck_assert_int_eq(gpubuf_delete(c, name), 0);
        }
        gpubuf_disconnect(c);
    }
}
END_TEST

START_TEST(status_counts) {
    gpubuf_client *a = td_connect(&D), *b = td_connect(&D);
    gpubuf_buffer *x, *y, *y2;
    ck_assert_int_eq(gpubuf_alloc(a, "host", 3 * MiB, "sx", &x), 0);
    /* b opens without waiting: the seal must have been applied. */
    ck_assert_int_eq(gpubuf_seal_sync(x), 0);
    ck_assert_int_eq(gpubuf_open(b, "sx", 0, &y), 0);
    ck_assert_int_eq(gpubuf_open(b, "sx", 0, &y2), 0);
    gpubuf_status *s = td_status(&D);
    ck_assert_uint_eq(s->n_clients, 3);
    ck_assert_uint_eq(s->n_pools, 2);
    const gpubuf_pool_info *p = td_find_pool(s, "host");
    ck_assert_uint_eq(p->used, 3 * MiB);
    ck_assert_uint_eq(p->buffers, 1);
    ck_assert_uint_eq(p->slabs, 1);
    ck_assert_uint_eq(p->capacity, 1ull << 30);
    ck_assert_uint_eq(td_find_buffer(s, "sx")->refs, 3);
    int seen_b = 0;
    for (size_t i = 0; i < s->n_clients; i++)
        if (s->clients[i].session_id == b->session_id) {
            ck_assert_uint_eq(s->clients[i].references, 2);
            ck_assert_uint_eq(s->clients[i].buffers_held, 1);
            ck_assert_int_eq(s->clients[i].pid, getpid());
            ck_assert_uint_eq(s->clients[i].uid, getuid());
            seen_b = 1;
        }
    ck_assert(seen_b);
    gpubuf_status_free(s);
    gpubuf_release(y);
    gpubuf_release(y2);
    gpubuf_release(x);
    /* Releases are asynchronous: b's must have reached the daemon before
     * another connection looks. */
    ck_assert_int_eq(gpubuf_flush(b), 0);
    ck_assert_int_eq(gpubuf_delete(a, "sx"), 0);
    s = td_status(&D);
    ck_assert_uint_eq(td_find_pool(s, "host")->used, 0);
    ck_assert_uint_eq(td_find_pool(s, "host")->buffers, 0);
    gpubuf_status_free(s);
    gpubuf_disconnect(a);
    gpubuf_disconnect(b);
}
END_TEST

SUITE_MAIN("client", "host-pool", start_default, td_stop_clean, 60,
          connect_and_handshake, connect_no_daemon, connect_env_socket, alloc_view_attributes,
          default_pool_is_first, set_device_checks, kept_slabs_pinned_reused_evicted,
          producer_exits_before_consumers, sigkill_consumer_loses_references,
          eight_processes_open_at_once, anonymous_buffer_by_id_across_processes,
          open_waits_for_seal, open_wait_forever_then_seal, open_timeout_and_missing,
          waiting_thread_sleeps_after_spin,
          names_and_errors, pool_full_then_recovers, delete_while_referenced,
          slices_keep_parent_alive, copy_helpers, mapping_cache_one_map_per_slab,
          disconnect_with_live_views, unsealed_buffer_of_dead_client_is_freed,
          threads_share_one_client, status_counts, async_seal_and_release_semantics,
          disconnect_wakes_a_blocked_open, requests_in_flight_at_exit_are_applied)
