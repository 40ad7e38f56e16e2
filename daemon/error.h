/* The daemon's one error path: a function that fails fills a gd_err passed
 * down by its caller (code and sentence, once) and returns the code; the
 * caller that answers the client reads it (once). Every room uses it, from
 * the config parser down to the backends. */
#ifndef GPUBUFD_ERROR_H
#define GPUBUFD_ERROR_H

#include <stddef.h>

typedef struct gd_err {
    int code;      /* 0, a negative errno or a GPUBUF_E* code */
    char msg[256]; /* one sentence, "" when none was written */
} gd_err;

/* err says nothing (as {0} does, without zeroing the whole sentence). */
static inline void gd_err_clear(gd_err *err) {
    err->code = 0;
    err->msg[0] = '\0';
}

/* Write code and the formatted sentence into err (which may be NULL) and
 * return code, so that a failing path reads `return gd_err_set(...)`. */
int gd_err_set(gd_err *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The sentence of err, or the generic text of code when none was written. */
const char *gd_err_msg(const gd_err *err, int code);

#endif
