/* Read-only opens, stream-order requests and the copy helpers on host pools:
 * a real gpubufd and real client processes. The CUDA halves of the same
 * features run in test_gpu (label "gpu"). */
#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "harness.h"
#include "internal.h"
#include "pattern.h"

#define MiB (1ull << 20)

static void start_default(void) {
    static const char *const args[] = {"--pool", "host=host,capacity=256M,slab=16M", NULL};
    td_start(&D, args);
}

/* A sealed buffer `name` of size bytes holding the pattern of seed. The view
 * stays with the caller (writable: it was allocated here). */
static gpubuf_buffer *publish(gpubuf_client *c, const char *name, uint64_t size, uint32_t seed) {
    gpubuf_buffer *b;
    ck_assert_int_eq(gpubuf_alloc(c, "host", size, name, &b), 0);
    gpubuf_pattern_fill(gpubuf_buffer_host_ptr(b), size, seed);
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    return b;
}

/* The permissions of the mapping that holds addr, from /proc/self/maps
 * ("r--s", "rw-s"), or "" when none. */
static void map_perms(const void *addr, char out[5]) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    unsigned long lo, hi, a = (unsigned long)addr;
    out[0] = '\0';
    while (f && fgets(line, sizeof(line), f)) {
        char perms[5];
        if (sscanf(line, "%lx-%lx %4s", &lo, &hi, perms) == 3 && a >= lo && a < hi) {
            memcpy(out, perms, 5);
            break;
        }
    }
    if (f)
        fclose(f);
}

START_TEST(read_only_open_maps_read_only) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *w = publish(c, "ro/a", 1 * MiB, 5), *r, *rw;
    char perms[5];

    /* A second connection, as a consumer would have. */
    gpubuf_client *c2 = td_connect(&D);
    ck_assert_int_eq(gpubuf_open_with(c2, "ro/a", 0, &(gpubuf_lookup){.timeout_ms = 0, .flags = GPUBUF_OPEN_READONLY}, &r), 0);
    ck_assert_int_eq(gpubuf_buffer_read_only(r), 1);
    ck_assert_uint_eq(gpubuf_pattern_mismatches(gpubuf_buffer_host_ptr(r), 1 * MiB, 5), 0);
    map_perms(gpubuf_buffer_host_ptr(r), perms);
    ck_assert_str_eq(perms, "r--s");

    /* The file description is read-only: the mapping cannot be upgraded. */
    uintptr_t page = (uintptr_t)gpubuf_buffer_host_ptr(r) & ~(uintptr_t)4095;
    errno = 0;
    ck_assert_int_eq(mprotect((void *)page, 4096, PROT_READ | PROT_WRITE), -1);
    ck_assert_int_eq(errno, EACCES);

    /* The library refuses writes through it. */
    uint32_t word = 7;
    ck_assert_int_eq(gpubuf_buffer_copy_from_host(r, 0, &word, 4), -EPERM);
    ck_assert_str_eq(gpubuf_last_error_message(), "the view was opened read-only");
    ck_assert_int_eq(gpubuf_buffer_copy_from_host_async(r, 0, &word, 4, NULL), -EPERM);

    /* A store through it kills the writer alone. */
    fflush(NULL);
    pid_t p = fork();
    if (p == 0) {
        signal(SIGSEGV, SIG_DFL); /* not a sanitizer's report: the kernel's verdict */
        *(volatile uint32_t *)gpubuf_buffer_host_ptr(r) = 0xdeadbeef;
        _exit(0);
    }
    ck_assert_int_eq(td_wait(p), 128 + SIGSEGV);
    ck_assert_uint_eq(gpubuf_pattern_mismatches(gpubuf_buffer_host_ptr(w), 1 * MiB, 5), 0);

    /* The same slab opened writable on the same connection: a second
     * mapping; the producer's writes show in both. */
    uint32_t maps = c2->n_maps;
    ck_assert_int_eq(gpubuf_open(c2, "ro/a", 0, &rw), 0);
    ck_assert_int_eq(gpubuf_buffer_read_only(rw), 0);
    ck_assert_uint_eq(c2->n_maps, maps + 1);
    map_perms(gpubuf_buffer_host_ptr(rw), perms);
    ck_assert_str_eq(perms, "rw-s");
    ((uint32_t *)gpubuf_buffer_host_ptr(w))[3] = 0x12345678;
    ck_assert_uint_eq(((uint32_t *)gpubuf_buffer_host_ptr(r))[3], 0x12345678);
    ck_assert_uint_eq(((uint32_t *)gpubuf_buffer_host_ptr(rw))[3], 0x12345678);

    /* Status counts the read-only reference of c2. */
    gpubuf_status *s = td_status(&D);
    uint32_t ro = 0, refs = 0;
    for (size_t i = 0; i < s->n_clients; i++) {
        if (s->clients[i].session_id == c2->session_id) {
            ro = s->clients[i].read_only_references;
            refs = s->clients[i].references;
        }
    }
    ck_assert_uint_eq(refs, 2);
    ck_assert_uint_eq(ro, 1);
    gpubuf_status_free(s);

    /* Releasing the read-only view drops the read-only count; a slice keeps
     * the mapping read-only. */
    gpubuf_buffer *sl;
    ck_assert_int_eq(gpubuf_buffer_slice(r, 4096, 4096, &sl), 0);
    ck_assert_int_eq(gpubuf_buffer_read_only(sl), 1);
    gpubuf_release(r);
    ck_assert_int_eq(gpubuf_buffer_copy_from_host(sl, 0, &word, 4), -EPERM);
    gpubuf_release(sl);
    gpubuf_release(rw);
    ck_assert_int_eq(gpubuf_flush(c2), 0);
    s = td_status(&D);
    for (size_t i = 0; i < s->n_clients; i++) {
        if (s->clients[i].session_id == c2->session_id) {
            ck_assert_uint_eq(s->clients[i].references, 0);
            ck_assert_uint_eq(s->clients[i].read_only_references, 0);
        }
    }
    ck_assert_uint_eq(td_find_buffer(s, "ro/a")->refs, 1); /* the producer's */
    gpubuf_status_free(s);
    gpubuf_disconnect(c2);
    gpubuf_release(w);
    ck_assert_int_eq(gpubuf_delete(c, "ro/a"), 0);
    gpubuf_disconnect(c);
}
END_TEST

/* A read-only open that waits is woken by the seal with a read-only view. */
static int wait_ro(const test_daemon *d, void *arg) {
    gpubuf_client *c;
    gpubuf_buffer *b;
    char perms[5];
    (void)arg;
    if (gpubuf_connect(d->socket, &c) < 0)
        return 1;
    if (gpubuf_open_with(c, "ro/later", 0, &(gpubuf_lookup){.timeout_ms = 10000, .flags = GPUBUF_OPEN_READONLY}, &b) < 0)
        return 2;
    map_perms(gpubuf_buffer_host_ptr(b), perms);
    if (strcmp(perms, "r--s") != 0 || !gpubuf_buffer_read_only(b))
        return 3;
    if (gpubuf_pattern_mismatches(gpubuf_buffer_host_ptr(b), 64 * 1024, 9) != 0)
        return 4;
    gpubuf_release(b);
    gpubuf_disconnect(c);
    return 0;
}

START_TEST(read_only_waiting_open) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b;
    ck_assert_int_eq(gpubuf_alloc(c, "host", 64 * 1024, "ro/later", &b), 0);
    gpubuf_pattern_fill(gpubuf_buffer_host_ptr(b), 64 * 1024, 9);
    pid_t p = td_spawn(wait_ro, &D, NULL);
    ck_assert(td_wait_waiting_opens(&D, 1, 5000)); /* the child's open waits */
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    ck_assert_int_eq(td_wait(p), 0);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(stream_requests_on_host_pools) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *b, *o, *x;
    ck_assert_int_eq(gpubuf_alloc(c, "host", 4096, "st/a", &b), 0);
    /* No GPU work to order on a host pool: refused here, and the buffer can
     * still be sealed the plain way. */
    ck_assert_int_eq(gpubuf_seal_stream(b, NULL), -EINVAL);
    ck_assert_ptr_nonnull(strstr(gpubuf_last_error_message(), "use gpubuf_seal()"));
    ck_assert_int_eq(gpubuf_seal_sync(b), 0);
    ck_assert_int_eq(gpubuf_seal_stream(b, NULL), GPUBUF_ESTATE);
    /* Without an event, waiting is free and needs no GPU. */
    ck_assert_int_eq(gpubuf_open(c, "st/a", 0, &o), 0);
    ck_assert_int_eq(gpubuf_buffer_wait(o, GPUBUF_STREAM_PER_THREAD), 0);
    ck_assert_int_eq(gpubuf_buffer_wait(NULL, NULL), -EINVAL);
    ck_assert_int_eq(gpubuf_open_with(c, "st/a", 0, &(gpubuf_lookup){.timeout_ms = 0, .flags = 0x80}, &x), -EINVAL);
    ck_assert_ptr_nonnull(strstr(gpubuf_last_error_message(), "unknown flags 0x80"));
    /* By id, read-only. */
    ck_assert_int_eq(gpubuf_open_with(c, NULL, gpubuf_buffer_id(b), &(gpubuf_lookup){.timeout_ms = 0, .flags = GPUBUF_OPEN_READONLY}, &x),
                     0);
    ck_assert_int_eq(gpubuf_buffer_read_only(x), 1);
    gpubuf_release(x);
    gpubuf_release(o);
    gpubuf_release(b);
    ck_assert_int_eq(gpubuf_delete(c, "st/a"), 0);
    gpubuf_disconnect(c);
}
END_TEST

START_TEST(copies_between_views) {
    gpubuf_client *c = td_connect(&D);
    gpubuf_buffer *a, *b, *ro;
    uint32_t in[1024], out[1024];
    ck_assert_int_eq(gpubuf_alloc(c, "host", sizeof(in), "cp/a", &a), 0);
    ck_assert_int_eq(gpubuf_alloc(c, "host", sizeof(in), "cp/b", &b), 0);
    gpubuf_pattern_fill(in, sizeof(in), 3);
    ck_assert_int_eq(gpubuf_buffer_copy_from_host_async(a, 0, in, sizeof(in), NULL), 0);
    ck_assert_int_eq(gpubuf_buffer_copy(b, 16, a, 0, sizeof(in) - 16, NULL), 0);
    ck_assert_int_eq(gpubuf_buffer_copy_to_host_async(b, 16, out, sizeof(in) - 16, NULL), 0);
    ck_assert_int_eq(memcmp(out, in, sizeof(in) - 16), 0);
    /* Ranges are checked on both sides; nothing is copied then. */
    ck_assert_int_eq(gpubuf_buffer_copy(b, 17, a, 0, sizeof(in) - 16, NULL), GPUBUF_ERANGE);
    ck_assert_int_eq(gpubuf_buffer_copy(b, 0, a, 1, sizeof(in), NULL), GPUBUF_ERANGE);
    ck_assert_int_eq(gpubuf_buffer_copy_to_host_async(a, 4096, out, 1, NULL), GPUBUF_ERANGE);
    ck_assert_int_eq(gpubuf_buffer_copy(NULL, 0, a, 0, 1, NULL), -EINVAL);
    /* A read-only destination is refused. */
    ck_assert_int_eq(gpubuf_seal_sync(a), 0);
    ck_assert_int_eq(gpubuf_open_with(c, "cp/a", 0, &(gpubuf_lookup){.timeout_ms = 0, .flags = GPUBUF_OPEN_READONLY}, &ro), 0);
    ck_assert_int_eq(gpubuf_buffer_copy(ro, 0, b, 0, 4, NULL), -EPERM);
    ck_assert_int_eq(gpubuf_buffer_copy(b, 0, ro, 0, 4, NULL), 0);
    gpubuf_release(ro);
    gpubuf_release(a);
    gpubuf_release(b);
    gpubuf_disconnect(c);
}
END_TEST

SUITE_MAIN("readonly", "host", start_default, td_stop_clean, 0,
          read_only_open_maps_read_only, read_only_waiting_open, stream_requests_on_host_pools,
          copies_between_views)
