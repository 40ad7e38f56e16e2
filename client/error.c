/* libgpubuf-client: the per-thread error message. Each public call starts
 * it empty and ends with "" on success or one sentence on failure. */
#include <stdarg.h>
#include <stdio.h>

#include "internal.h"

static _Thread_local char tl_error[512];

void gpubuf__set_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_error, sizeof(tl_error), fmt, ap);
    va_end(ap);
}

int gpubuf__fail(int err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(tl_error, sizeof(tl_error), fmt, ap);
    va_end(ap);
    return err;
}

GPUBUF_EXTERN const char *gpubuf_last_error_message(void) {
    return tl_error;
}

void gpubuf__clear_error(void) {
    tl_error[0] = '\0';
}

int gpubuf__result(int r) {
    if (r >= 0)
        tl_error[0] = '\0';
    else if (!tl_error[0])
        gpubuf__set_error("%s", gpubuf_strerror(r));
    return r;
}
