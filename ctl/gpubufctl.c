/* gpubufctl: look at a running gpubufd. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <json-c/json.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ctl.h"
#include "gpubuf/gpubuf.h"
#include "layout.h"
#include "util.h"

enum { EXIT_USAGE = 2, EXIT_NO_DAEMON = 3, EXIT_REQUEST = 4 };

void print_pools(const gpubuf_status *s) {
    char a[32], b[32], c[32], d[32];
    printf("%-12s %-9s %-6s %11s %11s %11s %6s %8s  %s\n", "POOL", "KIND", "DEVICE", "CAPACITY",
           "USED", "FREE", "SLABS", "BUFFERS", "UUID");
    for (size_t i = 0; i < s->n_pools; i++) {
        const gpubuf_pool_info *p = &s->pools[i];
        char dev[16];
        if (p->device < 0)
            snprintf(dev, sizeof(dev), "-");
        else
            snprintf(dev, sizeof(dev), "%d", p->device);
        printf("%-12s %-9s %-6s %11s %11s %11s %6u %8u  %s\n", shown(p->name),
               gpubuf_pool_kind_name(p->kind), dev, gpubuf_format_size(p->capacity, a, sizeof(a)),
               gpubuf_format_size(p->used, b, sizeof(b)),
               gpubuf_format_size(p->capacity - p->used, c, sizeof(c)), p->slabs, p->buffers,
               p->device_uuid[0] ? shown(p->device_uuid) : "-");
        (void)d;
    }
    /* Names are per pool: say where a name without a pool is looked up,
     * and which pools let only some uids name buffers. */
    if (s->default_pool && s->default_pool[0])
        printf("names without a pool (not /POOL/NAME) are looked up in pool '%s'\n",
               shown(s->default_pool));
    for (size_t i = 0; s->pool_publishers && i < s->n_pools; i++)
        if (s->pool_publishers[i][0])
            printf("pool '%s': only %s (and root) may name buffers\n", shown(s->pools[i].name),
                   shown(s->pool_publishers[i]));
}

/* ", restarted N time(s), M buffer(s) restored" after a restart, else "". */
const char *restarted(const gpubuf_status *s) {
    static char buf[96];
    if (!s->restarts)
        return "";
    snprintf(buf, sizeof(buf), ", restarted %u time(s), %u buffer(s) restored", s->restarts,
             s->restored_buffers);
    return buf;
}

void print_buffers(const gpubuf_status *s) {
    char a[32], lay[48], left[32];
    printf("%-8s %-24s %-10s %11s %-10s %5s %6s %6s %-20s %s\n", "ID", "NAME", "POOL", "SIZE",
           "STATE", "REFS", "SLAB", "OWNER", "LAYOUT", "LEASE");
    for (size_t i = 0; i < s->n_buffers; i++) {
        const gpubuf_status_buffer *b = &s->buffers[i];
        const gpubuf_status_meta *m = s->buffer_meta ? &s->buffer_meta[i] : NULL;
        if (m && m->has_layout)
            gpubuf_layout_format(m->dtype, m->ndim, m->shape, lay, sizeof(lay));
        else
            snprintf(lay, sizeof(lay), "-");
        if (m && m->lease_left_ms)
            format_left(m->lease_left_ms, left, sizeof(left));
        else
            snprintf(left, sizeof(left), "-");
        printf("%-8llu %-24s %-10s %11s %-10s %5u %6llu %6u %-20s %s%s\n",
               (unsigned long long)b->id, b->name[0] ? shown(b->name) : "(anonymous)",
               shown(b->pool), gpubuf_format_size(b->size, a, sizeof(a)),
               gpubuf_state_name(b->state), b->refs, (unsigned long long)b->slab_id, b->owner_uid,
               lay, left, s->buffer_restored && s->buffer_restored[i] ? "  restored" : "");
    }
}

void print_clients(const gpubuf_status *s) {
    printf("%-8s %-8s %-6s %-16s %10s %9s %8s\n", "SESSION", "PID", "UID", "NAME", "REFERENCES",
           "READ-ONLY", "BUFFERS");
    for (size_t i = 0; i < s->n_clients; i++) {
        const gpubuf_client_info *c = &s->clients[i];
        bool det = s->client_detached && s->client_detached[i];
        printf("%-8llu %-8d %-6u %-16s %10u %9u %8u\n", (unsigned long long)c->session_id, c->pid,
               c->uid, det ? "(not resumed)" : shown(c->name), c->references,
               c->read_only_references, c->buffers_held);
    }
}

/* Prometheus text format: one family per figure, HELP and TYPE first;
 * label values made printable UTF-8, then escaped as the format asks
 * (backslash, quote, newline). */
typedef struct filters {
    const char *pool, *name_prefix, *state;
    long pid, uid;
} filters;

/* Keep the entries that match, in place. */
static void apply_filters(gpubuf_status *s, const filters *f) {
    size_t n = 0;
    for (size_t i = 0; i < s->n_pools; i++)
        if (!f->pool || !strcmp(s->pools[i].name, f->pool))
            s->pools[n++] = s->pools[i];
    s->n_pools = n;
    n = 0;
    for (size_t i = 0; i < s->n_buffers; i++) {
        const gpubuf_status_buffer *b = &s->buffers[i];
        if ((f->pool && strcmp(b->pool, f->pool)) ||
            (f->name_prefix && strncmp(b->name, f->name_prefix, strlen(f->name_prefix))) ||
            (f->state && strcmp(gpubuf_state_name(b->state), f->state)))
            continue;
        if (s->buffer_restored) /* the library's array: kept in step */
            ((uint8_t *)s->buffer_restored)[n] = s->buffer_restored[i];
        if (s->buffer_meta)
            s->buffer_meta[n] = s->buffer_meta[i];
        s->buffers[n++] = *b;
    }
    s->n_buffers = n;
    n = 0;
    for (size_t i = 0; i < s->n_clients; i++) {
        const gpubuf_client_info *c = &s->clients[i];
        if ((f->pid >= 0 && c->pid != f->pid) || (f->uid >= 0 && (long)c->uid != f->uid))
            continue;
        if (s->client_detached)
            ((uint8_t *)s->client_detached)[n] = s->client_detached[i];
        s->clients[n++] = *c;
    }
    s->n_clients = n;
}

static void usage(FILE *f) {
    fprintf(f,
            "Usage: gpubufctl [OPTIONS] [COMMAND]\n\n"
            "Commands:\n"
            "  status             pools, buffers and clients (the default)\n"
            "  pools              pools only\n"
            "  buffers            buffers only\n"
            "  clients            connected clients only\n"
            "  metrics            Prometheus text format (for node-exporter's textfile\n"
            "                     collector)\n"
            "  delete NAME...     unpublish buffers by name (NAME in the default pool or\n"
            "                     --pool, /POOL/NAME in POOL; --id: by id); only the owner\n"
            "                     or root may\n\n"
            "Options:\n"
            "  -s, --socket PATH   daemon socket (default $GPUBUF_SOCKET or %s)\n"
            "  -j, --json          one line of JSON\n"
            "      --pretty        indented JSON\n"
            "  -w, --watch[=SEC]   refresh every SEC seconds (default 2) until interrupted,\n"
            "                      with request and allocation rates; redraws in place on\n"
            "                      a terminal, appends snapshots otherwise\n"
            "  -o, --output FILE   write to FILE (replaced atomically) instead of stdout\n"
            "      --pool NAME     only this pool and its buffers\n"
            "      --name PREFIX   only buffers whose name starts with PREFIX\n"
            "      --state STATE   only buffers in STATE (allocated, sealed, deleted)\n"
            "      --pid PID       only this client process\n"
            "      --uid UID       only clients of this user\n"
            "      --id            delete: the arguments are buffer ids\n"
            "  -h, --help          show this help\n\n"
            "Exit status: 0 ok, 2 usage, 3 daemon unreachable, 4 request failed.\n",
            GPUBUF_DEFAULT_SOCKET);
}

static const char *const commands[] = {"status",  "pools",   "buffers",
                                       "clients", "metrics", "delete"};

/* A usage error: name what was wrong and where to read more; exit 2. */
__attribute__((format(printf, 1, 2), noreturn)) static void usage_error(const char *fmt, ...) {
    va_list ap;
    fputs("gpubufctl: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputs(" (see gpubufctl --help)\n", stderr);
    exit(EXIT_USAGE);
}

/* Rates between two snapshots of the counters. */
typedef struct rates {
    bool have; /* a previous snapshot exists */
    uint64_t at_ns, requests, allocated, freed;
} rates;

static uint64_t sum_requests(const gpubuf_counters *k) {
    uint64_t n = 0;
    for (size_t i = 0; i < k->n_requests; i++)
        n += k->requests[i].requests;
    return n;
}

static uint64_t sum_pool(const gpubuf_counters *k, pool_counter get) {
    uint64_t n = 0;
    for (size_t i = 0; i < k->n_pools; i++)
        n += get(&k->pools[i]);
    return n;
}

/* "requests 12.5/s, allocated 1.0 MiB/s, freed 0 B/s" since the last call. */
static void print_rates(rates *rt, const gpubuf_status *s) {
    uint64_t now = gpubuf_now_ns(), req = sum_requests(&s->counters),
             al = sum_pool(&s->counters, c_alloc), fr = sum_pool(&s->counters, c_freed);
    char a[32], f[32];
    if (!s->counters.present) {
        printf("(this gpubufd sends no counters: no rates)\n");
    } else if (!rt->have || now <= rt->at_ns) {
        printf("requests -/s, allocated -/s, freed -/s (rates from the next refresh)\n");
    } else {
        double dt = (double)(now - rt->at_ns) / 1e9;
        printf("requests %.1f/s, allocated %s/s, freed %s/s\n", (double)(req - rt->requests) / dt,
               gpubuf_format_size((uint64_t)((double)(al - rt->allocated) / dt), a, sizeof(a)),
               gpubuf_format_size((uint64_t)((double)(fr - rt->freed) / dt), f, sizeof(f)));
    }
    *rt = (rates){true, now, req, al, fr};
}

static bool pool_exists(const gpubuf_status *s, const char *name) {
    for (size_t i = 0; i < s->n_pools; i++)
        if (!strcmp(s->pools[i].name, name))
            return true;
    return false;
}

static void list_pools(const gpubuf_status *s, char *out, size_t len) {
    size_t n = 0;
    out[0] = '\0';
    for (size_t i = 0; i < s->n_pools && n < len; i++)
        n += (size_t)snprintf(out + n, len - n, "%s%s", i ? ", " : "", shown(s->pools[i].name));
    if (s->n_pools == 0)
        snprintf(out, len, "(none)");
}

typedef struct view {
    const char *cmd;
    bool json, pretty, watch, redraw;
    rates rt;
} view;

static int show(gpubuf_client *c, view *v, const filters *f) {
    gpubuf_status *s;
    int r = gpubuf_status_get(c, &s);
    if (r < 0) {
        fprintf(stderr, "gpubufctl: status: %s\n", shown(gpubuf_last_error_message()));
        return EXIT_REQUEST;
    }
    if (f->pool && !pool_exists(s, f->pool)) {
        char pools[512];
        list_pools(s, pools, sizeof(pools));
        fprintf(stderr, "gpubufctl: no pool named '%s'; pools: %s\n", shown(f->pool), pools);
        gpubuf_status_free(s);
        return EXIT_USAGE;
    }
    apply_filters(s, f);
    const char *cmd = v->cmd;
    bool all = strcmp(cmd, "status") == 0;
    if (v->redraw)
        fputs("\033[H\033[2J", stdout); /* home, clear: the view redraws in place */
    if (!strcmp(cmd, "metrics")) {
        print_metrics(s);
    } else if (v->json) {
        print_json(s, cmd, v->pretty);
    } else {
        if (v->watch) {
            time_t now = time(NULL);
            char when[32];
            strftime(when, sizeof(when), "%H:%M:%S", localtime(&now));
            printf("%s%s  ", v->redraw ? "" : "--- ", when);
            print_rates(&v->rt, s);
        }
        if (all) {
            printf("gpubufd %s, up %llu s%s\n", shown(s->version),
                   (unsigned long long)(s->uptime_ms / 1000), restarted(s));
            print_batches(&s->counters);
            putchar('\n');
        }
        if (all || !strcmp(cmd, "pools"))
            print_pools(s);
        if (all)
            putchar('\n');
        if (all || !strcmp(cmd, "buffers"))
            print_buffers(s);
        if (all)
            putchar('\n');
        if (all || !strcmp(cmd, "clients"))
            print_clients(s);
    }
    fflush(stdout);
    gpubuf_status_free(s);
    return ferror(stdout) ? EXIT_REQUEST : 0;
}

/* delete NAME... or delete --id ID...: every target is tried; exit 4 when
 * one fails. */
static int delete_targets(gpubuf_client *c, char **targets, int n, bool by_id, const char *pool) {
    gpubuf_lookup o = {.pool = pool};
    int rc = 0;
    for (int i = 0; i < n; i++) {
        const char *t = targets[i];
        int r;
        if (by_id) {
            char *end;
            errno = 0;
            unsigned long long id = strtoull(t, &end, 10);
            if (!*t || *end || errno || t[0] == '-')
                usage_error("bad buffer id '%s': give the number from the ID column of "
                            "'gpubufctl buffers'",
                            shown(t));
            r = gpubuf_delete_with(c, NULL, id, &o);
        } else {
            r = gpubuf_delete_with(c, t, 0, &o);
        }
        if (r == 0) {
            printf("deleted %s%s\n", by_id ? "buffer " : "", shown(t));
            continue;
        }
        fprintf(stderr, "gpubufctl: delete %s: %s", shown(t), shown(gpubuf_last_error_message()));
        if (r == -ENOENT && !by_id && t[strspn(t, "0123456789")] == '\0')
            fprintf(stderr, " (to delete buffer id %s, use 'gpubufctl delete --id %s')", t, t);
        fputc('\n', stderr);
        rc = EXIT_REQUEST;
    }
    return rc;
}

static long parse_long(const char *s, const char *opt, const char *what) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*s == '\0' || *end || v < 0 || errno)
        usage_error("bad %s value '%s': give %s", opt, shown(s), what);
    return v;
}

static double parse_interval(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (*s == '\0' || *end || !(v > 0) || v > 86400)
        usage_error("bad --watch value '%s': give seconds, a number above 0 and at most 86400 "
                    "(e.g. --watch=0.5)",
                    shown(s));
    return v;
}

/* --output FILE: each snapshot goes into a new file made next to FILE, by
 * exclusive creation under a random name (mkostemp: O_CREAT|O_EXCL, so
 * nothing planted there, a symbolic link included, is opened or followed),
 * and is renamed over FILE when complete: a reader (node-exporter) never
 * sees half a file, and whatever was at FILE, a symbolic link too, is
 * replaced, not written through. The file gets mode 0644 less the umask. */
static char out_tmp[4096 + 32]; /* the file being written; "" when none */
static mode_t out_mode;

/* SIGINT (the end of --watch), SIGTERM, SIGHUP: remove the file being
 * written, then die of the signal as before. */
static void output_signal(int sig) {
    if (out_tmp[0])
        unlink(out_tmp);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Block those signals (old: the mask to restore) while out_tmp and the
 * file it names change together: the handler never sees half a name. */
static void block_signals(sigset_t *old) {
    sigset_t block;
    sigemptyset(&block);
    sigaddset(&block, SIGINT);
    sigaddset(&block, SIGTERM);
    sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, old);
}

static void output_init(void) {
    mode_t mask = umask(0);
    umask(mask);
    out_mode = 0644 & ~mask;
    signal(SIGINT, output_signal);
    signal(SIGTERM, output_signal);
    signal(SIGHUP, output_signal);
    /* Into a file: fully buffered from the first snapshot on. */
    setvbuf(stdout, NULL, _IOFBF, 1 << 16);
}

/* Complete the file: with r == 0 rename it over path, else (or when that
 * fails) remove it. Returns r, or EXIT_REQUEST with the reason said. */
static int output_end(const char *path, int r) {
    int err = 0;
    sigset_t old;
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout))
        err = errno ? errno : EIO;
    block_signals(&old);
    if (r == 0 && err == 0 && rename(out_tmp, path) < 0)
        err = errno;
    if (r != 0 || err != 0)
        unlink(out_tmp);
    out_tmp[0] = '\0';
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (r == 0 && err) {
        fprintf(stderr, "gpubufctl: cannot write %s: %s\n", shown(path), strerror(err));
        return EXIT_REQUEST;
    }
    return r;
}

/* Point stdout at a new file next to path. 0, or -1 with the reason said. */
static int output_begin(const char *path) {
    char tmpl[sizeof(out_tmp)], dir[sizeof(out_tmp)];
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    int dir_len = slash ? (int)(slash - path) : 0, n, fd, err;
    sigset_t old;
    snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : dir_len, slash ? path : ".");
    n = snprintf(tmpl, sizeof(tmpl), "%.*s.%s.XXXXXX", slash ? dir_len + 1 : 0, path, base);
    if (n < 0 || (size_t)n >= sizeof(tmpl)) {
        fprintf(stderr, "gpubufctl: cannot write %s: the path is longer than %zu bytes\n",
                shown(path), sizeof(tmpl) - 16);
        return -1;
    }
    block_signals(&old);
    fd = mkostemp(tmpl, O_CLOEXEC);
    err = errno;
    if (fd >= 0)
        memcpy(out_tmp, tmpl, (size_t)n + 1);
    sigprocmask(SIG_SETMASK, &old, NULL);
    if (fd < 0) {
        fprintf(stderr,
                "gpubufctl: cannot write %s: cannot create a file in directory %s: %s (the "
                "directory must exist and be writable by this user)\n",
                shown(path), shown(dir), strerror(err));
        return -1;
    }
    if (fchmod(fd, out_mode) < 0 || fflush(stdout) != 0 ||
        (fd != STDOUT_FILENO && dup2(fd, STDOUT_FILENO) < 0)) {
        fprintf(stderr, "gpubufctl: cannot write %s: %s\n", shown(out_tmp), strerror(errno));
        close(fd);
        output_end(path, EXIT_REQUEST);
        return -1;
    }
    if (fd != STDOUT_FILENO)
        close(fd);
    clearerr(stdout);
    return 0;
}

int main(int argc, char **argv) {
    enum { OPT_PRETTY = 256, OPT_POOL, OPT_NAME, OPT_STATE, OPT_PID, OPT_UID, OPT_ID };
    static const struct option opts[] = {{"socket", required_argument, NULL, 's'},
                                         {"json", no_argument, NULL, 'j'},
                                         {"pretty", no_argument, NULL, OPT_PRETTY},
                                         {"watch", optional_argument, NULL, 'w'},
                                         {"output", required_argument, NULL, 'o'},
                                         {"pool", required_argument, NULL, OPT_POOL},
                                         {"name", required_argument, NULL, OPT_NAME},
                                         {"state", required_argument, NULL, OPT_STATE},
                                         {"pid", required_argument, NULL, OPT_PID},
                                         {"uid", required_argument, NULL, OPT_UID},
                                         {"id", no_argument, NULL, OPT_ID},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    const char *sock = NULL, *cmd = "status", *output = NULL;
    bool by_id = false;
    double watch = 0;
    view v = {0};
    filters f = {NULL, NULL, NULL, -1, -1};
    int opt, r;
    gpubuf_client *c;
    opterr = 0; /* errors are reported here, naming the option */
    while ((opt = getopt_long(argc, argv, ":s:jw::o:h", opts, NULL)) != -1) {
        switch (opt) {
        case 's': sock = optarg; break;
        case 'j': v.json = true; break;
        case OPT_PRETTY: v.json = v.pretty = true; break;
        case 'w':
            if (optarg) {
                watch = parse_interval(optarg);
            } else if (optind < argc && argv[optind][0] &&
                       strspn(argv[optind], "0123456789.") == strlen(argv[optind])) {
                /* "-w 1": the interval as its own word. */
                watch = parse_interval(argv[optind++]);
            } else {
                watch = 2.0;
            }
            break;
        case 'o': output = optarg; break;
        case OPT_POOL: f.pool = optarg; break;
        case OPT_NAME: f.name_prefix = optarg; break;
        case OPT_STATE:
            if (strcmp(optarg, "allocated") && strcmp(optarg, "sealed") &&
                strcmp(optarg, "deleted"))
                usage_error("bad --state value '%s': give allocated, sealed or deleted",
                            shown(optarg));
            f.state = optarg;
            break;
        case OPT_PID: f.pid = parse_long(optarg, "--pid", "a process id"); break;
        case OPT_UID: f.uid = parse_long(optarg, "--uid", "a numeric user id"); break;
        case OPT_ID: by_id = true; break;
        case 'h': usage(stdout); return 0;
        case ':': usage_error("option '%s' needs a value", shown(argv[optind - 1]));
        default:
            if (optopt) {
                char o[3] = {'-', (char)optopt, '\0'};
                usage_error("unknown option '%s'", shown(o));
            }
            usage_error("unknown option '%s'", shown(argv[optind - 1]));
        }
    }
    if (optind < argc)
        cmd = argv[optind++];
    bool known = false;
    for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        known |= !strcmp(cmd, commands[i]);
    if (!known)
        usage_error("unknown command '%s'; commands: status, pools, buffers, clients, metrics, "
                    "delete",
                    shown(cmd));
    bool del = !strcmp(cmd, "delete");
    if (del && optind == argc)
        usage_error("delete needs the name of a buffer (or --id and its id)");
    if (!del && optind < argc)
        usage_error("'%s' takes no arguments, got '%s'", cmd, shown(argv[optind]));
    if (by_id && !del)
        usage_error("--id goes with delete only");
    if (del && (watch > 0 || output || v.json))
        usage_error("delete takes no --watch, --output or --json");
    if ((r = gpubuf_connect(sock, &c)) < 0) {
        fprintf(stderr, "gpubufctl: %s\n", shown(gpubuf_last_error_message()));
        return EXIT_NO_DAEMON;
    }
    if (del) {
        r = delete_targets(c, argv + optind, argc - optind, by_id, f.pool);
        gpubuf_disconnect(c);
        return r;
    }
    v.cmd = cmd;
    v.watch = watch > 0;
    /* A terminal shows one live view; a pipe or a file gets one snapshot
     * after the other. */
    v.redraw = v.watch && !output && !v.json && strcmp(cmd, "metrics") && isatty(STDOUT_FILENO);
    if (output)
        output_init();
    for (;;) {
        if (output && output_begin(output) < 0) {
            r = EXIT_REQUEST;
            break;
        }
        r = show(c, &v, &f);
        if (output)
            r = output_end(output, r);
        if (r != 0 || !v.watch)
            break;
        struct timespec ts = {(time_t)watch, (long)((watch - (double)(time_t)watch) * 1e9)};
        nanosleep(&ts, NULL);
    }
    gpubuf_disconnect(c);
    return r;
}
