#pragma once
#include <stddef.h>

/* Whether the /proc this process sees belongs to its own PID namespace.
 * A process in a new PID namespace that still sees its parent's /proc
 * (unshare -p -f without --mount-proc, a runtime that forgot to mount one)
 * reads the wrong /proc/self; the CUDA driver then fails in cuInit with
 * CUDA_ERROR_OPERATING_SYSTEM. Returns 1 and a sentence saying what is wrong
 * and what to do in buf when /proc is another namespace's; 0 when /proc is
 * this process's own or when that cannot be told (no /proc at all). */
int gpubuf_proc_foreign(char *buf, size_t len);
