/* A client for tests/namespaces.sh, run inside namespaces (unshare): reads
 * one command a line on stdin, answers one line on stdout, so the script
 * waits on what it prints, never on time.
 *
 *   hello                    "hello pid P self S uid U gid G"
 *                            (P getpid(), S what /proc/self names)
 *   proc                     "proc own" or "proc foreign: WHY"
 *   alloc POOL NAME SIZE S   allocate, fill with pattern seed S, seal,
 *                            release (the daemon has it before the line):
 *                            "sealed ID"
 *   open NAME S              open and check against seed S, keep the view:
 *                            "opened ID MISMATCHES on host|device"
 *   check S                  check the views kept again: "checked MISMATCHES"
 *   stat NAME                "stat refs R owner U"
 *   release                  release the views kept: "released N"
 *   delete NAME              "deleted" or "error ..."
 * A failure answers "error RC MESSAGE".
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpubuf/gpubuf.h"
#include "pattern.h"
#include "procns.h"

#define MAX_VIEWS 16

static gpubuf_buffer *g_views[MAX_VIEWS];
static int g_n;

static void fail(int r) {
    printf("error %d %s\n", r, gpubuf_last_error_message()[0] ? gpubuf_last_error_message()
                                                              : gpubuf_strerror(r));
}

static int check(gpubuf_buffer *b, uint32_t seed, uint64_t *bad, const char **where) {
    uint64_t size = gpubuf_buffer_size(b);
    if (gpubuf_buffer_pool_kind(b) == GPUBUF_POOL_HOST) {
        *bad = gpubuf_pattern_mismatches(gpubuf_buffer_host_ptr(b), size, seed);
        *where = "host";
        return 0;
    }
    *where = "device";
    return gpubuf_pattern_verify_device(gpubuf_buffer_device(b), gpubuf_buffer_device_ptr(b),
                                        size, seed, bad);
}

int main(int argc, char **argv) {
    gpubuf_client *c = NULL;
    char line[512];
    int r;
    if (argc != 2) {
        fprintf(stderr, "usage: ns_client SOCKET (commands on stdin)\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    while (fgets(line, sizeof(line), stdin)) {
        char cmd[32] = "", a[256] = "", b[256] = "";
        unsigned long long x = 0, y = 0;
        int n = sscanf(line, "%31s %255s %255s %llu %llu", cmd, a, b, &x, &y);
        if (n < 1)
            continue;
        if (strcmp(cmd, "hello") == 0) {
            char self[32] = "none";
            ssize_t k = readlink("/proc/self", self, sizeof(self) - 1);
            if (k >= 0)
                self[k] = '\0';
            printf("hello pid %d self %s uid %u gid %u\n", (int)getpid(), self,
                   (unsigned)getuid(), (unsigned)getgid());
            continue;
        }
        if (strcmp(cmd, "proc") == 0) {
            char why[400];
            if (gpubuf_proc_foreign(why, sizeof(why)))
                printf("proc foreign: %s\n", why);
            else
                printf("proc own\n");
            continue;
        }
        if (!c && (r = gpubuf_connect(argv[1], &c)) < 0) {
            c = NULL;
            fail(r);
            continue;
        }
        if (strcmp(cmd, "alloc") == 0 && n >= 5) {
            gpubuf_buffer *buf;
            if ((r = gpubuf_alloc(c, strcmp(a, "-") ? a : NULL, x, b, &buf)) < 0) {
                fail(r);
                continue;
            }
            if (gpubuf_buffer_pool_kind(buf) == GPUBUF_POOL_HOST)
                gpubuf_pattern_fill(gpubuf_buffer_host_ptr(buf), x, (uint32_t)y);
            else if ((r = gpubuf_pattern_fill_device(gpubuf_buffer_device(buf),
                                                     gpubuf_buffer_device_ptr(buf), x,
                                                     (uint32_t)y)) < 0) {
                fail(r);
                gpubuf_release(buf);
                continue;
            }
            if ((r = gpubuf_seal_sync(buf)) < 0) {
                fail(r);
                gpubuf_release(buf);
                continue;
            }
            /* The reference goes before the line does: a command the script
             * sends next, on another connection, finds it gone (release is
             * asynchronous; on a busy machine the other client's stat came
             * first). */
            uint64_t id = gpubuf_buffer_id(buf);
            gpubuf_release(buf);
            if ((r = gpubuf_flush(c)) < 0) {
                fail(r);
                continue;
            }
            printf("sealed %llu\n", (unsigned long long)id);
        } else if (strcmp(cmd, "open") == 0 && n >= 3) {
            gpubuf_buffer *buf;
            uint64_t bad = 0;
            const char *where;
            if (g_n == MAX_VIEWS) {
                printf("error %d too many views\n", -ENOSPC);
                continue;
            }
            if ((r = gpubuf_open(c, a, 10000, &buf)) < 0) {
                fail(r);
                continue;
            }
            if ((r = check(buf, (uint32_t)strtoul(b, NULL, 0), &bad, &where)) < 0) {
                fail(r);
                gpubuf_release(buf);
                continue;
            }
            g_views[g_n++] = buf;
            printf("opened %llu %llu on %s\n", (unsigned long long)gpubuf_buffer_id(buf),
                   (unsigned long long)bad, where);
        } else if (strcmp(cmd, "check") == 0 && n >= 2) {
            uint64_t total = 0, bad;
            r = 0;
            const char *where;
            for (int i = 0; i < g_n; i++) {
                if ((r = check(g_views[i], (uint32_t)strtoul(a, NULL, 0), &bad, &where)) < 0)
                    break;
                total += bad;
            }
            if (r < 0)
                fail(r);
            else
                printf("checked %llu\n", (unsigned long long)total);
        } else if (strcmp(cmd, "stat") == 0 && n >= 2) {
            gpubuf_buffer_info info;
            if ((r = gpubuf_stat(c, a, &info)) < 0)
                fail(r);
            else
                printf("stat refs %u owner %u\n", info.refs, info.owner_uid);
        } else if (strcmp(cmd, "release") == 0) {
            int k = g_n;
            while (g_n > 0)
                gpubuf_release(g_views[--g_n]);
            printf("released %d\n", k);
        } else if (strcmp(cmd, "delete") == 0 && n >= 2) {
            if ((r = gpubuf_delete(c, a)) < 0)
                fail(r);
            else
                printf("deleted\n");
        } else {
            printf("error %d unknown command '%s'\n", -EINVAL, cmd);
        }
    }
    while (g_n > 0)
        gpubuf_release(g_views[--g_n]);
    if (c)
        gpubuf_disconnect(c);
    return 0;
}
