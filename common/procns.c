#include "procns.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int gpubuf_proc_foreign(char *buf, size_t len) {
    char link[32];
    pid_t me = getpid();
    ssize_t n = readlink("/proc/self", link, sizeof(link) - 1);
    if (n < 0) {
        /* No /proc mounted: nothing to say about it. ENOENT with a /proc
         * there means this process has no pid in that /proc's namespace:
         * a /proc of an unrelated PID namespace. */
        if (errno != ENOENT || access("/proc/1", F_OK) != 0)
            return 0;
        snprintf(buf, len,
                 "/proc is not this process's: it belongs to a PID namespace this process "
                 "(pid %d) is not in, and the CUDA driver reads /proc/self; mount a /proc of "
                 "the process's own PID namespace (unshare --pid --fork --mount-proc, or "
                 "mount -t proc proc /proc in a new mount namespace)",
                 (int)me);
        return 1;
    }
    link[n] = '\0';
    char *end;
    long seen = strtol(link, &end, 10);
    if (*end != '\0' || seen <= 0 || seen > INT_MAX || (pid_t)seen == me)
        return 0;
    snprintf(buf, len,
             "/proc is another PID namespace's: /proc/self is pid %ld there but this process "
             "is pid %d in its own PID namespace, and the CUDA driver reads /proc/self; give "
             "the process a /proc of its own PID namespace (unshare --pid --fork --mount-proc, "
             "or mount -t proc proc /proc in a new mount namespace)",
             seen, (int)me);
    return 1;
}
