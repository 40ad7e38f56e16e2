/* gpubuf-producer: allocate a buffer, write a pattern into it, publish it
 * under a name and exit. The buffer outlives this process. */
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
    fprintf(stderr, "gpubuf-producer: %s: %s\n", what, *m ? m : gpubuf_strerror(r));
    return 1;
}

int main(int argc, char **argv) {
    static const struct option opts[] = {
        {"socket", required_argument, NULL, 's'}, {"pool", required_argument, NULL, 'p'},
        {"name", required_argument, NULL, 'n'},   {"size", required_argument, NULL, 'z'},
        {"seed", required_argument, NULL, 'e'},   {"hold", required_argument, NULL, 'H'},
        {"help", no_argument, NULL, 'h'},         {NULL, 0, NULL, 0}};
    const char *sock = NULL, *pool = NULL, *name = "demo";
    uint64_t size = 256ull << 20;
    uint32_t seed = 42;
    int hold = 0, opt, r;
    while ((opt = getopt_long(argc, argv, "s:p:n:z:e:H:h", opts, NULL)) != -1) {
        switch (opt) {
        case 's': sock = optarg; break;
        case 'p': pool = optarg; break;
        case 'n': name = optarg; break;
        case 'z': {
            int bad = gpubuf_parse_size(optarg, &size) < 0;
            if (bad || size < 4) {
                char shown[256]; /* the argument, printable */
                gpubuf_text_clean(shown, sizeof(shown), optarg, strlen(optarg));
                if (bad)
                    fprintf(stderr, "gpubuf-producer: bad size '%s': give " GPUBUF_SIZE_FORMS "\n",
                            shown);
                else
                    fprintf(stderr,
                            "gpubuf-producer: size '%s' is below 4 bytes: the pattern is "
                            "written in 4-byte words\n",
                            shown);
                return 2;
            }
            break;
        }
        case 'e': seed = (uint32_t)strtoul(optarg, NULL, 0); break;
        case 'H': hold = atoi(optarg); break;
        default:
            fprintf(stderr, "Usage: gpubuf-producer [--socket P] [--pool P] [--name N] "
                            "[--size 256M] [--seed S] [--hold SECONDS]\n");
            return opt == 'h' ? 0 : 2;
        }
    }
    gpubuf_client *c;
    gpubuf_buffer *b;
    char sz[32];
    if ((r = gpubuf_connect(sock, &c)) < 0)
        return die("connect", r);
    if ((r = gpubuf_alloc(c, pool, size, name, &b)) < 0)
        return die("alloc", r);
    if (gpubuf_buffer_pool_kind(b) == GPUBUF_POOL_HOST)
        gpubuf_pattern_fill(gpubuf_buffer_host_ptr(b), size, seed);
    else if ((r = gpubuf_pattern_fill_device(gpubuf_buffer_device(b), gpubuf_buffer_device_ptr(b),
                                             size, seed)) < 0)
        return die("fill on the device", r);
    /* Wait for the daemon: once this says "sealed", anyone can open it. */
    if ((r = gpubuf_seal_sync(b)) < 0)
        return die("seal", r);
    printf("producer pid %d: sealed '%s' (id %llu, %s, %s pool, device %d, address 0x%llx)\n",
           (int)getpid(), name, (unsigned long long)gpubuf_buffer_id(b),
           gpubuf_format_size(size, sz, sizeof(sz)),
           gpubuf_pool_kind_name(gpubuf_buffer_pool_kind(b)),
           gpubuf_buffer_device(b), (unsigned long long)gpubuf_buffer_device_ptr(b));
    fflush(stdout);
    if (hold > 0)
        sleep((unsigned)hold);
    gpubuf_release(b);
    gpubuf_disconnect(c);
    return 0;
}
