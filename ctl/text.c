/* gpubufctl's text helpers, below its printers: the printable form of a
 * string and a lease's time left. */
#include <stdio.h>
#include <string.h>

#include "ctl.h"
#include "util.h"

/* A string from the daemon or from the command line as printable, valid
 * UTF-8 (gpubuf_text_clean: a control character becomes "\x1b"): whatever
 * the daemon sent or the arguments hold, no escape sequence reaches the
 * terminal, no newline forges a row or a metric, and JSON parsers accept
 * the output. Every such string goes through here before it is printed.
 * Eight results are usable at once; longer strings than a path are cut. */
const char *shown(const char *str) {
    static char ring[8][4 * 4096 + 8];
    static unsigned next;
    char *out = ring[next++ % 8];
    gpubuf_text_clean(out, sizeof(ring[0]), str, strlen(str));
    return out;
}

/* "12.3s", "4m05s", "2h03m", "3d04h": what is left of a lease. */
const char *format_left(uint64_t ms, char *out, size_t len) {
    uint64_t s = ms / 1000;
    if (ms < 60000)
        snprintf(out, len, "%.1fs", (double)ms / 1000.0);
    else if (s < 3600)
        snprintf(out, len, "%llum%02llus", (unsigned long long)(s / 60),
                 (unsigned long long)(s % 60));
    else if (s < 86400)
        snprintf(out, len, "%lluh%02llum", (unsigned long long)(s / 3600),
                 (unsigned long long)(s / 60 % 60));
    else
        snprintf(out, len, "%llud%02lluh", (unsigned long long)(s / 86400),
                 (unsigned long long)(s / 3600 % 24));
    return out;
}
