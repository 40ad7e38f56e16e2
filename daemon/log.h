/* Logging to stderr. Under systemd (JOURNAL_STREAM set) lines carry the
 * "<N>" priority prefix that journald understands; otherwise a level word. */
#ifndef GPUBUFD_LOG_H
#define GPUBUFD_LOG_H

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

#endif
