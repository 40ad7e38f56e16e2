/* gpubufd's configuration: one table of keys (name, parser, bounds, where the
 * value goes) for [daemon] and one for [pool:NAME]. The file parser, the
 * command line, --check-config and SIGHUP all go through them, so a value is
 * accepted or refused the same way wherever it comes from. */
#ifndef GPUBUFD_CONFIG_H
#define GPUBUFD_CONFIG_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "error.h"
#include "gpubuf/gpubuf.h"
#include "registry.h"
#include "settings.h"

#define GD_CONFIG_MAX_POOLS 64
#define GD_ALLOW_MAX 32
/* The largest capacity or slab size a pool may be given (1 PiB): far above any
 * device or host, and far enough below 2^64 that rounding to a granularity
 * cannot wrap. */
#define GD_POOL_SIZE_MAX (1ull << 50)

typedef struct gd_pool_spec {
    char name[GPUBUF_NAME_MAX + 1];
    gpubuf_pool_kind kind; /* 0 until given */
    uint32_t device;
    uint64_t capacity; /* 0: the backend's default */
    uint64_t slab_size; /* 0: the default */
    uint32_t allow_uids[GD_ALLOW_MAX], allow_gids[GD_ALLOW_MAX];
    int n_allow_uids, n_allow_gids;
    /* Who may name buffers in the pool (empty: everyone allowed in it). */
    uint32_t publish_uids[GD_ALLOW_MAX], publish_gids[GD_ALLOW_MAX];
    int n_publish_uids, n_publish_gids;
} gd_pool_spec;

typedef struct gd_config {
    char socket_path[PATH_MAX]; /* "" until given */
    char socket_group[64];
    uint32_t socket_mode;
    int log_level; /* -1 until given */
    unsigned set;  /* GD_SET_*: limits the file or the flags gave */
    gd_limits limits;
    gd_quota quota;
    gd_pool_spec pools[GD_CONFIG_MAX_POOLS];
    int n_pools;
} gd_config;

/* Every key at its default, no pools. */
void gd_config_init(gd_config *c);
/* The defaults of the limits and quotas alone. */
void gd_config_defaults(gd_limits *l, gd_quota *q);

/* Set one [daemon] key (also what a command-line option names). */
int gd_config_set(gd_config *c, const char *key, const char *val, gd_err *err);
/* The pool spec named name, created (kind unset) when new. */
gd_pool_spec *gd_config_pool(gd_config *c, const char *name, gd_err *err);
/* Set one [pool:NAME] key. */
int gd_config_pool_set(gd_pool_spec *p, const char *key, const char *val, gd_err *err);
/* --pool NAME=KIND[,key=value...]: replaces all settings of pool NAME. */
int gd_config_pool_flag(gd_config *c, const char *arg, gd_err *err);
/* Read an INI file into c; the first error names the file and line. */
int gd_config_load(gd_config *c, const char *path, gd_err *err);
/* What start-up refuses before it touches a backend or the socket: pools
 * without a kind, capacities below the backend's granularity, a socket path
 * too long for a Unix socket. --check-config and SIGHUP run it too. */
int gd_config_check(const gd_config *c, gd_err *err);

/* The fd budget. One client can make the daemon hold GD_FDS_PER_CLIENT fds
 * (settings.h: its socket, the fds of its queued replies and of its answered
 * waiting opens); the daemon itself holds a reserve: stdio, the listening
 * socket, the event loop's fds, each pool's slab fds (host: a memfd and its
 * read-only twin per slab; cuda-vmm: one per slab) and the CUDA driver's
 * device fds. */
#define GD_FD_RESERVE_BASE 32     /* stdio, listening socket, event loop, slack */
#define GD_FD_RESERVE_PER_CUDA 32 /* the driver's fds per CUDA pool */

/* Which of the keys the fd budget lowers the user set (gd_config.set). */
#define GD_SET_MAX_CLIENTS 1u
#define GD_SET_MAX_CLIENTS_PER_UID 2u

/* What fitting the limits to the fds did. */
enum {
    GD_FIT_OK = 0,               /* they fit as they were */
    GD_FIT_LOWERED_DEFAULTS = 1, /* lowered, but the user set neither key: worth an info line */
    GD_FIT_LOWERED_SET = 2,      /* a key the user set was lowered: worth a warning */
};

/* Fit max_clients into nofile fds of which reserved are the daemon's own.
 * When max_clients is lowered, max_clients_per_uid goes to at most half of
 * it (at least 1), so that one uid cannot take every slot. set: the
 * GD_SET_* keys the user set. Returns a GD_FIT_* (msg filled, one sentence
 * naming what was set, when lowered), or -EMFILE (err filled) when not even
 * one client fits. */
int gd_limits_fit_fds(gd_limits *l, uint64_t nofile, uint64_t reserved, unsigned set, char *msg,
                      size_t n, gd_err *err);

#endif
