/* Helpers for the tests and the benchmarks. They live in their own static
 * library (gpubuf_testutil), never in libgpubuf-client. */
#ifndef GPUBUF_TESTUTIL_H
#define GPUBUF_TESTUTIL_H

/* Resident set size of process pid in KiB, from /proc (-1 if unreadable). */
long tu_rss_kib(int pid);

#endif
