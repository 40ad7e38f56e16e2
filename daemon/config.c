#include "config.h"

#include <errno.h>
#include <stdbool.h>
#include <grp.h>
#include <ini.h>
#include <pwd.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>
#include <unistd.h>

#include "backend.h"
#include "log.h"
#include "util.h"
#include "wire.h"

typedef struct key_def key_def;
/* Parse val into dst (which points at the key's destination). */
typedef int (*parse_fn)(const key_def *k, const char *val, void *dst, gd_err *err);

struct key_def {
    const char *name;
    const char *alias; /* a second name, or NULL */
    parse_fn parse;
    uint64_t min, max; /* bounds of numbers */
    uint64_t def;      /* default of numbers */
    size_t offset;     /* of the destination in gd_config or gd_pool_spec */
    const char *label; /* "bad LABEL 'VALUE'" (NULL: the name) */
    const char *hint;  /* appended to that message, or NULL */
    bool show_range;   /* append " (MIN..MAX)" */
};

static int bad_value(const key_def *k, const char *val, gd_err *err) {
    char range[64] = "";
    if (k->show_range)
        snprintf(range, sizeof(range), " (%llu..%llu)", (unsigned long long)k->min,
                 (unsigned long long)k->max);
    return gd_err_set(err, -EINVAL, "bad %s '%s'%s%s", k->label ? k->label : k->name, val,
                      k->hint ? k->hint : "", range);
}

static int parse_u32(const key_def *k, const char *val, void *dst, gd_err *err) {
    uint64_t v;
    if (gpubuf_parse_size(val, &v) < 0 || v < k->min || v > k->max)
        return bad_value(k, val, err);
    *(uint32_t *)dst = (uint32_t)v;
    return 0;
}

static int parse_u64(const key_def *k, const char *val, void *dst, gd_err *err) {
    uint64_t v;
    if (gpubuf_parse_size(val, &v) < 0 || v < k->min || v > k->max)
        return bad_value(k, val, err);
    *(uint64_t *)dst = v;
    return 0;
}

static int parse_int(const key_def *k, const char *val, void *dst, gd_err *err) {
    char *end;
    long v = strtol(val, &end, 10);
    if (!*val || *end || v < (long)k->min || v > (long)k->max)
        return bad_value(k, val, err);
    *(uint32_t *)dst = (uint32_t)v;
    return 0;
}

static int parse_mode(const key_def *k, const char *val, void *dst, gd_err *err) {
    char *end;
    long m = strtol(val, &end, 8);
    if (!*val || *end || m < 0 || m > 0777)
        return bad_value(k, val, err);
    *(uint32_t *)dst = (uint32_t)m;
    return 0;
}

static int parse_level(const key_def *k, const char *val, void *dst, gd_err *err) {
    int l = gd_log_parse_level(val);
    if (l < 0)
        return bad_value(k, val, err);
    *(int *)dst = l;
    return 0;
}

/* state_journal: on (0), off (1), or switchable (2: on, and SIGUSR2 turns
 * it off and on; for measurement only). */
static int parse_off(const key_def *k, const char *val, void *dst, gd_err *err) {
    if (strcmp(val, "on") == 0)
        *(uint32_t *)dst = 0;
    else if (strcmp(val, "off") == 0)
        *(uint32_t *)dst = 1;
    else if (strcmp(val, "switchable") == 0)
        *(uint32_t *)dst = 2;
    else
        return gd_err_set(err, -EINVAL, "bad %s '%s' (on, off or switchable)", k->name, val);
    return 0;
}

static int parse_path(const key_def *k, const char *val, void *dst, gd_err *err) {
    (void)k;
    if (strlen(val) >= PATH_MAX)
        return gd_err_set(err, -ENAMETOOLONG, "socket path longer than %d bytes", PATH_MAX - 1);
    memcpy(dst, val, strlen(val) + 1);
    return 0;
}

static int parse_group(const key_def *k, const char *val, void *dst, gd_err *err) {
    (void)k;
    if (strlen(val) >= sizeof(((gd_config *)0)->socket_group) || !getgrnam(val))
        return gd_err_set(err, -EINVAL, "unknown group '%s'", val);
    memcpy(dst, val, strlen(val) + 1);
    return 0;
}

static int parse_kind(const key_def *k, const char *val, void *dst, gd_err *err) {
    (void)k;
    if (gd_pool_kind_parse(val, dst) < 0)
        return gd_err_set(err, -EINVAL, "unknown pool kind '%s' (host, cuda-ipc, cuda-vmm)", val);
    return 0;
}

/* "1000, alice" -> ids; names through getpwnam/getgrnam. dst is the id
 * array, followed in gd_pool_spec by ... (see ids_count). */
static int parse_ids(const char *val, bool groups, uint32_t *out, int *n, gd_err *err) {
    char buf[1024], *save = NULL;
    snprintf(buf, sizeof(buf), "%s", val);
    *n = 0;
    for (char *tok = strtok_r(buf, ", ", &save); tok; tok = strtok_r(NULL, ", ", &save)) {
        unsigned long v = 0;
        if (tok[strspn(tok, "0123456789")] == '\0') {
            errno = 0;
            v = strtoul(tok, NULL, 10);
            /* (uid_t)-1 means "no id" to chown() and friends, and anything
             * above it would wrap (4294967296 would become root). */
            if (errno || v >= UINT32_MAX)
                return gd_err_set(err, -EINVAL, "bad %s id '%s' (0..%u)",
                                  groups ? "group" : "user", tok, UINT32_MAX - 1);
        } else {
            struct group *g = groups ? getgrnam(tok) : NULL;
            struct passwd *pw = groups ? NULL : getpwnam(tok);
            if (!g && !pw)
                return gd_err_set(err, -EINVAL, "unknown %s '%s'", groups ? "group" : "user",
                                  tok);
            v = g ? g->gr_gid : pw->pw_uid;
        }
        if (*n >= GD_ALLOW_MAX)
            return gd_err_set(err, -EINVAL, "more than %d entries in an allow list",
                              GD_ALLOW_MAX);
        out[(*n)++] = (uint32_t)v;
    }
    return 0;
}

/* The parser of a pool's id list key: the list field (its count n_list),
 * of group ids (groups) or user ids. */
#define ID_LIST_PARSER(fn, list, groups)                                                           \
    static int fn(const key_def *k, const char *val, void *dst, gd_err *err) {                     \
        gd_pool_spec *p = (gd_pool_spec *)((char *)dst - k->offset);                               \
        return parse_ids(val, groups, p->list, &p->n_##list, err);                                 \
    }

ID_LIST_PARSER(parse_uids, allow_uids, false)
ID_LIST_PARSER(parse_gids, allow_gids, true)
ID_LIST_PARSER(parse_publish_uids, publish_uids, false)
ID_LIST_PARSER(parse_publish_gids, publish_gids, true)

#define CFG(f) offsetof(gd_config, f)
#define POOL(f) offsetof(gd_pool_spec, f)

/* [daemon] */
static const key_def daemon_keys[] = {
    {"socket", NULL, parse_path, 0, 0, 0, CFG(socket_path), NULL, NULL, false},
    {"socket_mode", NULL, parse_mode, 0, 0777, 0660, CFG(socket_mode), NULL,
     " (octal, e.g. 0660)", false},
    {"socket_group", NULL, parse_group, 0, 0, 0, CFG(socket_group), NULL, NULL, false},
    {"log_level", NULL, parse_level, 0, 0, 0, CFG(log_level), NULL, NULL, false},
    {"max_clients", NULL, parse_u32, 1, 1u << 20, 4096, CFG(limits.max_clients), NULL, NULL, false},
    {"max_clients_per_uid", NULL, parse_u32, 0, 1u << 20, 1024, CFG(limits.max_clients_per_uid),
     NULL, NULL, false},
    {"max_request", NULL, parse_u32, 256, GPUBUF_WIRE_MAX_REQUEST_HARD, GPUBUF_WIRE_MAX_REQUEST,
     CFG(limits.max_request), NULL, NULL, true},
    {"handshake_timeout_ms", NULL, parse_u32, 0, 3600000, 10000,
     CFG(limits.handshake_timeout_ms), NULL, NULL, false},
    {"frame_timeout_ms", NULL, parse_u32, 0, 3600000, 10000, CFG(limits.frame_timeout_ms), NULL, NULL, false},
    {"max_buffers_per_client", NULL, parse_u32, 0, UINT32_MAX, 1u << 20,
     CFG(quota.buffers_per_client), NULL, NULL, false},
    {"max_bytes_per_client", NULL, parse_u64, 0, UINT64_MAX, 0, CFG(quota.bytes_per_client),
     NULL, NULL, false},
    {"max_buffers_per_uid", NULL, parse_u32, 0, UINT32_MAX, 1u << 20,
     CFG(quota.buffers_per_uid), NULL, NULL, false},
    {"max_bytes_per_uid", NULL, parse_u64, 0, UINT64_MAX, 0, CFG(quota.bytes_per_uid), NULL, NULL, false},
    {"max_refs_per_client", NULL, parse_u32, 0, UINT32_MAX, 1u << 20,
     CFG(quota.refs_per_client), NULL, NULL, false},
    {"max_kept_slabs_per_client", NULL, parse_u32, 0, 4096, 8,
     CFG(quota.kept_slabs_per_client), NULL, NULL, false},
    {"max_reply_memory", NULL, parse_u64, 1u << 20, UINT64_MAX, 256u << 20,
     CFG(limits.max_reply_memory), NULL, NULL, false},
    {"resume_timeout_ms", NULL, parse_u32, 0, 86400000, 30000, CFG(limits.resume_timeout_ms),
     NULL, NULL, false},
    /* For measurement only, unsupported: off journals no change after the
     * start's snapshot, so a restart loses what changed since; switchable
     * lets SIGUSR2 turn it off and on (state.c, gd_state_switch). */
    {"state_journal", NULL, parse_off, 0, 2, 0, CFG(limits.journal_off), NULL, NULL, false},
    {"max_lease_ms", NULL, parse_u32, 1, UINT32_MAX, 604800000, CFG(quota.max_lease_ms), NULL,
     NULL, false},
    {"max_meta_bytes_per_client", NULL, parse_u64, 0, UINT64_MAX, 32u << 20,
     CFG(quota.meta_bytes_per_client), NULL, NULL, false},
    {"max_meta_bytes_per_uid", NULL, parse_u64, 0, UINT64_MAX, 32u << 20,
     CFG(quota.meta_bytes_per_uid), NULL, NULL, false},
    {"max_meta_bytes", NULL, parse_u64, 0, UINT64_MAX, 256u << 20, CFG(quota.meta_bytes), NULL,
     NULL, false},
    {"max_waiters_per_client", NULL, parse_u32, 1, GD_MAX_WAITERS_LIMIT,
     GD_MAX_WAITERS_PER_CLIENT, CFG(limits.max_waiters_per_client), NULL, NULL, false},
    {"poll_us", NULL, parse_u32, 0, GD_POLL_US_MAX, GD_POLL_US_DEFAULT, CFG(limits.poll_us), NULL,
     " (microseconds; 0: never poll)", false},
};

/* Limits with no key: fixed defaults. */
#define DEFAULT_FRAMES_PER_WAKEUP 32
#define DEFAULT_MAX_QUEUED_REPLIES 4096

/* [pool:NAME] */
static const key_def pool_keys[] = {
    {"kind", NULL, parse_kind, 0, 0, 0, POOL(kind), NULL, NULL, false},
    {"device", NULL, parse_int, 0, 1024, 0, POOL(device), NULL, NULL, false},
    {"capacity", NULL, parse_u64, 1, GD_POOL_SIZE_MAX, 0, POOL(capacity), NULL,
     " (e.g. 8G; at most 1024T)", false},
    {"slab_size", "slab", parse_u64, 1, GD_POOL_SIZE_MAX, 0, POOL(slab_size), "slab size",
     " (e.g. 64M; at most 1024T)", false},
    {"allow_uids", "allow_users", parse_uids, 0, 0, 0, POOL(allow_uids), NULL, NULL, false},
    {"allow_gids", "allow_groups", parse_gids, 0, 0, 0, POOL(allow_gids), NULL, NULL, false},
    {"publish_uids", "publish_users", parse_publish_uids, 0, 0, 0, POOL(publish_uids), NULL, NULL,
     false},
    {"publish_gids", "publish_groups", parse_publish_gids, 0, 0, 0, POOL(publish_gids), NULL,
     NULL, false},
};

#define N_KEYS(t) (sizeof(t) / sizeof((t)[0]))

static const key_def *find_key(const key_def *t, size_t n, const char *key) {
    for (size_t i = 0; i < n; i++)
        if (strcmp(t[i].name, key) == 0 || (t[i].alias && strcmp(t[i].alias, key) == 0))
            return &t[i];
    return NULL;
}

/* Numbers at their defaults. */
static void set_defaults(const key_def *t, size_t n, void *base) {
    for (size_t i = 0; i < n; i++) {
        void *dst = (char *)base + t[i].offset;
        if (t[i].parse == parse_u32 || t[i].parse == parse_mode || t[i].parse == parse_off)
            *(uint32_t *)dst = (uint32_t)t[i].def;
        else if (t[i].parse == parse_u64)
            *(uint64_t *)dst = t[i].def;
    }
}

void gd_config_init(gd_config *c) {
    memset(c, 0, sizeof(*c));
    set_defaults(daemon_keys, N_KEYS(daemon_keys), c);
    c->log_level = -1;
    c->limits.frames_per_wakeup = DEFAULT_FRAMES_PER_WAKEUP;
    c->limits.max_queued_replies = DEFAULT_MAX_QUEUED_REPLIES;
}

void gd_config_defaults(gd_limits *l, gd_quota *q) {
    static gd_config c;
    gd_config_init(&c);
    *l = c.limits;
    *q = c.quota;
}

int gd_config_set(gd_config *c, const char *key, const char *val, gd_err *err) {
    const key_def *k = find_key(daemon_keys, N_KEYS(daemon_keys), key);
    if (!k)
        return gd_err_set(err, -EINVAL, "unknown key '%s' in [daemon]", key);
    int r = k->parse(k, val, (char *)c + k->offset, err);
    if (r == 0 && k->offset == CFG(limits.max_clients))
        c->set |= GD_SET_MAX_CLIENTS;
    if (r == 0 && k->offset == CFG(limits.max_clients_per_uid))
        c->set |= GD_SET_MAX_CLIENTS_PER_UID;
    return r;
}

gd_pool_spec *gd_config_pool(gd_config *c, const char *name, gd_err *err) {
    if (!gpubuf_name_valid(name, strlen(name))) {
        gd_err_set(err, -EINVAL, "invalid pool name '%s'", name);
        return NULL;
    }
    if (strchr(name, '/')) {
        /* Clients name a buffer of a pool as /POOL/NAME: the pool's name
         * ends at the first '/'. */
        gd_err_set(err, -EINVAL,
                   "invalid pool name '%s': a pool name may not contain '/' (clients write "
                   "/POOL/NAME for a buffer of a pool)",
                   name);
        return NULL;
    }
    for (int i = 0; i < c->n_pools; i++)
        if (strcmp(c->pools[i].name, name) == 0)
            return &c->pools[i];
    if (c->n_pools >= GD_CONFIG_MAX_POOLS) {
        gd_err_set(err, -ENOSPC, "more than %d pools", GD_CONFIG_MAX_POOLS);
        return NULL;
    }
    gd_pool_spec *p = &c->pools[c->n_pools++];
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%s", name);
    return p;
}

int gd_config_pool_set(gd_pool_spec *p, const char *key, const char *val, gd_err *err) {
    const key_def *k = find_key(pool_keys, N_KEYS(pool_keys), key);
    if (!k)
        return gd_err_set(err, -EINVAL, "unknown pool key '%s'", key);
    return k->parse(k, val, (char *)p + k->offset, err);
}

int gd_config_pool_flag(gd_config *c, const char *arg, gd_err *err) {
    char buf[1024], *eq, *save = NULL, *tok;
    gd_err e = {0};
    snprintf(buf, sizeof(buf), "%s", arg);
    eq = strchr(buf, '=');
    if (!eq)
        return gd_err_set(err, -EINVAL, "--pool %s: expected NAME=KIND[,key=value...]", arg);
    *eq = '\0';
    gd_pool_spec *p = gd_config_pool(c, buf, &e);
    if (!p)
        goto bad;
    /* A flag replaces all the settings of its pool. */
    memset(p, 0, sizeof(*p));
    snprintf(p->name, sizeof(p->name), "%.255s", buf);
    tok = strtok_r(eq + 1, ",", &save);
    if (!tok) {
        gd_err_set(&e, -EINVAL, "unknown pool kind '' (host, cuda-ipc, cuda-vmm)");
        goto bad;
    }
    if (gd_config_pool_set(p, "kind", tok, &e) < 0)
        goto bad;
    while ((tok = strtok_r(NULL, ",", &save))) {
        char *kv = strchr(tok, '=');
        if (!kv) {
            gd_err_set(&e, -EINVAL, "expected key=value, got '%s'", tok);
            goto bad;
        }
        *kv = '\0';
        if (gd_config_pool_set(p, tok, kv + 1, &e) < 0)
            goto bad;
    }
    return 0;
bad:
    return gd_err_set(err, e.code, "--pool %s: %s", arg, e.msg);
}

typedef struct ini_state {
    gd_config *c;
    gd_err err; /* the first failing line's */
} ini_state;

static int on_ini_line(void *user, const char *section, const char *key, const char *val) {
    ini_state *st = user;
    gd_err e = {0};
    int r;
    if (strcmp(section, "daemon") == 0) {
        r = gd_config_set(st->c, key, val, &e);
    } else if (strncmp(section, "pool:", 5) == 0) {
        gd_pool_spec *p = gd_config_pool(st->c, section + 5, &e);
        r = p ? gd_config_pool_set(p, key, val, &e) : e.code;
    } else {
        r = gd_err_set(&e, -EINVAL, "unknown section [%s]", section);
    }
    if (r < 0) {
        /* inih goes on parsing and reports the first failing line: keep
         * the message of that line. */
        if (!st->err.code)
            st->err = e;
        return 0;
    }
    return 1;
}

int gd_config_load(gd_config *c, const char *path, gd_err *err) {
    ini_state st = {.c = c};
    int before = c->n_pools;
    int r = ini_parse(path, on_ini_line, &st);
    if (r < 0) {
        int e = errno ? errno : EIO;
        return gd_err_set(err, -e, "%s: cannot open: %s", path, strerror(e));
    }
    if (r > 0)
        return gd_err_set(err, st.err.code ? st.err.code : -EINVAL, "%s:%d: %s", path, r,
                          st.err.code ? st.err.msg : "syntax error");
    for (int i = before; i < c->n_pools; i++)
        if (c->pools[i].kind == 0)
            return gd_err_set(err, -EINVAL, "%s: [pool:%s] has no kind (host, cuda-ipc or cuda-vmm)", path,
                              c->pools[i].name);
    return 0;
}

int gd_config_check(const gd_config *c, gd_err *err) {
    struct sockaddr_un sa;
    if (strlen(c->socket_path) >= sizeof(sa.sun_path))
        return gd_err_set(err, -ENAMETOOLONG, "socket path '%s' is longer than %zu bytes",
                          c->socket_path, sizeof(sa.sun_path) - 1);
    for (int i = 0; i < c->n_pools; i++) {
        const gd_pool_spec *p = &c->pools[i];
        if (p->kind == 0)
            return gd_err_set(err, -EINVAL, "[pool:%s] has no kind (host, cuda-ipc or cuda-vmm)",
                              p->name);
        uint64_t g = gd_backend_granularity(p->kind);
        if (p->capacity && p->capacity < g)
            return gd_err_set(err, -EINVAL,
                              "pool '%s': capacity below the backend's allocation granularity "
                              "(%llu bytes)",
                              p->name, (unsigned long long)g);
    }
    return 0;
}

/* Clamping rather than refusing: the defaults must start under any fd limit
 * a service gets (a daemon that refuses to start serves nobody), and what a
 * client sees at the lowered limit is the refusal it sees at any limit.
 * max_clients_per_uid goes to at most half of the lowered max_clients, so
 * that one uid never holds every slot however few the fds are. */
int gd_limits_fit_fds(gd_limits *l, uint64_t nofile, uint64_t reserved, unsigned set, char *msg,
                      size_t n, gd_err *err) {
    uint64_t room = nofile > reserved ? (nofile - reserved) / GD_FDS_PER_CLIENT : 0;
    if (room == 0)
        return gd_err_set(err, -EMFILE,
                          "the fd limit (RLIMIT_NOFILE %llu) leaves no room for a client: the "
                          "daemon reserves %llu fds and needs %d per client (its socket and up "
                          "to %d queued reply fds); raise LimitNOFILE= or ulimit -n",
                          (unsigned long long)nofile, (unsigned long long)reserved,
                          GD_FDS_PER_CLIENT, GD_FDS_PER_CLIENT - 1);
    if (l->max_clients <= room)
        return GD_FIT_OK;
    uint32_t mc = (uint32_t)room;
    uint32_t share = mc / 2 ? mc / 2 : 1;
    uint32_t pu =
        l->max_clients_per_uid && l->max_clients_per_uid <= share ? l->max_clients_per_uid : share;
    bool warn_mc = set & GD_SET_MAX_CLIENTS;
    bool warn_pu = (set & GD_SET_MAX_CLIENTS_PER_UID) && pu != l->max_clients_per_uid;
    char pu_was[96] = "";
    if (warn_pu)
        snprintf(pu_was, sizeof(pu_was), "; max_clients_per_uid %u as set lowered with it",
                 l->max_clients_per_uid);
    snprintf(msg, n,
             "%s max_clients %u needs more fds than RLIMIT_NOFILE %llu carries (%llu reserved, "
             "%d per client: its socket and up to %d queued reply fds); serving at most "
             "max_clients %u, max_clients_per_uid %u (at most half of max_clients, so that one "
             "uid cannot take every slot%s); raise LimitNOFILE= or ulimit -n to serve more",
             warn_mc ? "the configured" : "the default", l->max_clients, (unsigned long long)nofile,
             (unsigned long long)reserved, GD_FDS_PER_CLIENT, GD_FDS_PER_CLIENT - 1, mc, pu,
             pu_was);
    l->max_clients = mc;
    l->max_clients_per_uid = pu;
    return warn_mc || warn_pu ? GD_FIT_LOWERED_SET : GD_FIT_LOWERED_DEFAULTS;
}
