/* The table-driven option parser of the bench programs (bench_opts.h). */
#include "bench_opts.h"

#include <getopt.h>
#include <stdlib.h>

/* getopt_long's value for opts[i] when given by its long name: above any
 * letter, so that it cannot be taken for one. */
#define LONG_VAL(i) (256 + (int)(i))

static const bench_opt *find(const bench_opt *opts, size_t n, int val) {
    for (size_t i = 0; i < n; i++)
        if (val == LONG_VAL(i) || (opts[i].letter && val == opts[i].letter))
            return &opts[i];
    return NULL;
}

int bench_opts_parse(int argc, char **argv, const bench_opt *opts, size_t n) {
    struct option longs[BENCH_OPTS_MAX + 1] = {{0}};
    char letters[2 * BENCH_OPTS_MAX + 1];
    size_t nl = 0;
    if (n > BENCH_OPTS_MAX)
        abort(); /* a table longer than the bench programs' */
    for (size_t i = 0; i < n; i++) {
        int has_arg = opts[i].kind == BENCH_OPT_FLAG ? no_argument : required_argument;
        longs[i] = (struct option){opts[i].name, has_arg, NULL, LONG_VAL(i)};
        if (opts[i].letter) {
            letters[nl++] = opts[i].letter;
            if (has_arg == required_argument)
                letters[nl++] = ':';
        }
    }
    letters[nl] = '\0';
    int opt;
    while ((opt = getopt_long(argc, argv, letters, longs, NULL)) != -1) {
        const bench_opt *o = find(opts, n, opt);
        if (!o)
            return -1;
        switch (o->kind) {
        case BENCH_OPT_STR: *(const char **)o->value = optarg; break;
        case BENCH_OPT_INT: *(int *)o->value = atoi(optarg); break;
        case BENCH_OPT_LONG: *(long *)o->value = strtol(optarg, NULL, 10); break;
        case BENCH_OPT_FLAG: *(int *)o->value = 1; break;
        }
    }
    return 0;
}
