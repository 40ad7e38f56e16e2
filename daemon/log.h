/* Logging to stderr. Under systemd (JOURNAL_STREAM set) lines carry the
 * "<N>" priority prefix that journald understands; otherwise a level word. */
#ifndef GPUBUFD_LOG_H
#define GPUBUFD_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum { GPUBUF_LOG_ERR = 3, GPUBUF_LOG_WARNING = 4, GPUBUF_LOG_NOTICE = 5, GPUBUF_LOG_INFO = 6,
       GPUBUF_LOG_DEBUG = 7 };

extern int gd_log_level;
void gd_log_init(void);
int gd_log_parse_level(const char *s);
void gd_log(int prio, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG_AT(p, ...)                                                                         \
    do {                                                                                       \
        if ((p) <= gd_log_level)                                                           \
            gd_log((p), __VA_ARGS__);                                                      \
    } while (0)
#define LOG_ERR(...) LOG_AT(GPUBUF_LOG_ERR, __VA_ARGS__)
#define LOG_WARN(...) LOG_AT(GPUBUF_LOG_WARNING, __VA_ARGS__)
#define LOG_NOTICE(...) LOG_AT(GPUBUF_LOG_NOTICE, __VA_ARGS__)
#define LOG_INFO(...) LOG_AT(GPUBUF_LOG_INFO, __VA_ARGS__)
#define LOG_DEBUG(...) LOG_AT(GPUBUF_LOG_DEBUG, __VA_ARGS__)

/* Rate limit of one call site, for every line a client can trigger: at most
 * GD_LOG_BURST lines per GD_LOG_WINDOW_MS; the first line let through after
 * lines were dropped is followed by how many were. A client that triggers
 * a line in a loop (a flood of connections while the daemon is out of fds)
 * so costs a few kilobytes of log, not megabytes. */
#define GD_LOG_BURST 10u
#define GD_LOG_WINDOW_MS 5000u
typedef struct gd_log_limit {
    uint64_t window_start_ms;
    uint32_t lines;      /* let through in the current window */
    uint32_t suppressed; /* dropped since the last line let through */
} gd_log_limit;
/* True when a line may be logged now; *suppressed then says how many were
 * dropped before it (and is reset). */
bool gd_log_allow(gd_log_limit *l, uint32_t *suppressed);

#define LOG_LIMITED(p, ...)                                                                    \
    do {                                                                                       \
        static gd_log_limit lim_;                                                              \
        uint32_t sup_;                                                                         \
        if ((p) <= gd_log_level && gd_log_allow(&lim_, &sup_)) {                               \
            if (sup_)                                                                          \
                gd_log((p), "%u lines like the next one were suppressed", sup_);               \
            gd_log((p), __VA_ARGS__);                                                          \
        }                                                                                      \
    } while (0)
#define LOG_ERR_LIMITED(...) LOG_LIMITED(GPUBUF_LOG_ERR, __VA_ARGS__)
#define LOG_WARN_LIMITED(...) LOG_LIMITED(GPUBUF_LOG_WARNING, __VA_ARGS__)

#endif
