/* The command-line options of the bench programs (gpubuf_bench,
 * gpubuf_restart_bench), read from one table per program: each option's
 * long name, its short letter, and the variable its value goes to. */
#ifndef GPUBUF_BENCH_OPTS_H
#define GPUBUF_BENCH_OPTS_H

#include <stddef.h>

typedef enum {
    BENCH_OPT_STR,  /* value: const char **, set to the argument */
    BENCH_OPT_INT,  /* value: int *, atoi() of the argument */
    BENCH_OPT_LONG, /* value: long *, strtol() (base 10) of the argument */
    BENCH_OPT_FLAG, /* value: int *, set to 1; takes no argument */
} bench_opt_kind;

typedef struct bench_opt {
    const char *name; /* --name */
    char letter;      /* -letter as well, or 0 for the long name only */
    bench_opt_kind kind;
    void *value;
} bench_opt;

/* At most this many options in a table. */
#define BENCH_OPTS_MAX 16

/* Reads argv's options into the variables of opts[0..n): 0, or -1 on an
 * option the table does not have (getopt has said so on stderr). */
int bench_opts_parse(int argc, char **argv, const bench_opt *opts, size_t n);

#endif
