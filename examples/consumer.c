/* gpubuf-consumer: open a published buffer by name, check its contents where
 * they live (on the GPU for CUDA pools), release it. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpubuf/gpubuf.h"
#include "pattern.h"
#include "util.h"

static int die(const char *what, int r) {
    const char *m = gpubuf_last_error_message();
    /* The message says what happened and what to do; the code's sentence
     * only when there is none. */
    fprintf(stderr, "gpubuf-consumer: %s: %s\n", what, *m ? m : gpubuf_strerror(r));
    return 1;
}

/* Open name, waiting up to timeout_ms for it (< 0: forever). Says on
 * stderr what it waits for before it blocks, and after a timeout that the
 * name was not found and where the names are listed. */
static int open_waiting(gpubuf_client *c, const char *name, int timeout_ms, gpubuf_buffer **ret) {
    char shown[256]; /* the name, printable */
    int r = gpubuf_open(c, name, 0, ret);
    if (r != -ENOENT || timeout_ms == 0)
        return r == 0 ? 0 : die("open", r);
    gpubuf_text_clean(shown, sizeof(shown), name, strlen(name));
    if (timeout_ms > 0)
        fprintf(stderr,
                "gpubuf-consumer: waiting up to %.1f s for '%s' to be published and "
                "sealed (--timeout MS to change)\n",
                timeout_ms / 1000.0, shown);
    else
        fprintf(stderr,
                "gpubuf-consumer: waiting for '%s' to be published and sealed, without "
                "a time limit\n",
                shown);
    r = gpubuf_open(c, name, timeout_ms, ret);
    if (r == -ETIMEDOUT) {
        die("open", r);
        fprintf(stderr,
                "gpubuf-consumer: no sealed buffer '%s' was found within %.1f s: check "
                "the name ('gpubufctl buffers' lists them; /POOL/NAME for a pool other "
                "than the default) and that the producer ran\n",
                shown, timeout_ms / 1000.0);
        return 1;
    }
    return r == 0 ? 0 : die("open", r);
}

int main(int argc, char **argv) {
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'},  {"name", required_argument, NULL, 'n'},
        {"timeout", required_argument, NULL, 't'}, {"seed", required_argument, NULL, 'e'},
        {"hold", required_argument, NULL, 'H'},    {"delete", no_argument, NULL, 'd'},
        {"device", required_argument, NULL, 'D'},  {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    const char *sock = NULL, *name = "demo";
    uint32_t seed = 42;
    int timeout = 10000, hold = 0, del = 0, device = -1, opt, r;
    while ((opt = getopt_long(argc, argv, "s:n:t:e:H:dD:h", opts, NULL)) != -1) {
        switch (opt) {
        case 's': sock = optarg; break;
        case 'n': name = optarg; break;
        case 't': timeout = atoi(optarg); break;
        case 'e': seed = (uint32_t)strtoul(optarg, NULL, 0); break;
        case 'H': hold = atoi(optarg); break;
        case 'd': del = 1; break;
        case 'D': device = atoi(optarg); break;
        default:
            fprintf(stderr, "Usage: gpubuf-consumer [--socket P] [--name N] [--timeout MS] "
                            "[--seed S] [--hold SECONDS] [--delete] [--device GPU]\n"
                            "N: a name in the daemon's default pool, or /POOL/NAME\n");
            return opt == 'h' ? 0 : 2;
        }
    }
    gpubuf_client *c;
    gpubuf_buffer *b;
    uint64_t bad = 0, size;
    char sz[32];
    const char *where;
    if ((r = gpubuf_connect(sock, &c)) < 0)
        return die("connect", r);
    /* --device: map the buffer into that GPU's context, wherever it lives
     * (peer access), and check it with a kernel running there. */
    if (device >= 0 && (r = gpubuf_set_device(c, device)) < 0)
        return die("set_device", r);
    if (open_waiting(c, name, timeout, &b) != 0) {
        gpubuf_disconnect(c);
        return 1;
    }
    size = gpubuf_buffer_size(b);
    if (gpubuf_buffer_pool_kind(b) == GPUBUF_POOL_HOST) {
        bad = gpubuf_pattern_mismatches(gpubuf_buffer_host_ptr(b), size, seed);
        where = "host";
    } else {
        r = gpubuf_pattern_verify_device(gpubuf_buffer_device(b), gpubuf_buffer_device_ptr(b),
                                         size, seed, &bad);
        if (r < 0)
            return die("verify on the device", r);
        where = "device";
    }
    /* Also read the first words back through the copy helper. */
    uint32_t head[64];
    uint64_t n = size < sizeof(head) ? size : sizeof(head);
    if ((r = gpubuf_buffer_copy_to_host(b, 0, head, n)) < 0)
        return die("copy_to_host", r);
    bad += gpubuf_pattern_mismatches(head, n, seed);
    char peer[64] = "";
    if (gpubuf_buffer_memory_device(b) != gpubuf_buffer_device(b))
        snprintf(peer, sizeof(peer), " (memory on device %d)", gpubuf_buffer_memory_device(b));
    printf("consumer pid %d: opened '%s' (id %llu, %s) at 0x%llx on device %d%s: "
           "%llu mismatches (checked on the %s)\n",
           (int)getpid(), name, (unsigned long long)gpubuf_buffer_id(b),
           gpubuf_format_size(size, sz, sizeof(sz)),
           (unsigned long long)gpubuf_buffer_device_ptr(b), gpubuf_buffer_device(b), peer,
           (unsigned long long)bad, where);
    fflush(stdout);
    if (hold > 0)
        sleep((unsigned)hold);
    if ((r = gpubuf_release(b)) < 0)
        return die("release", r);
    if (del && (r = gpubuf_delete(c, name)) < 0)
        return die("delete", r);
    gpubuf_disconnect(c);
    return bad ? 1 : 0;
}
