/* ckpt_stub.c - TEMPORARY: weak stand-ins for the checkpoint API until the
 * ckpt branch (checkpoint/) is merged; the real definitions override them.
 * Every call fails with KEEL_EINTERNAL. Delete when checkpoint/ lands. */
#include <config.h>

#include "util.h"
#include <keel/checkpoint.h>

#define KEEL_WEAK __attribute__((weak))

KEEL_WEAK void
keel_saver_config_init(keel_saver_config *cfg)
{
    cfg->dir = NULL;
    cfg->basename = KEEL_CKPT_DEFAULT_BASENAME;
    cfg->max_to_keep = 5;
    cfg->keep_every_n_hours = 0;
    cfg->is_async = 0;
}

KEEL_WEAK keel_status
keel_saver_new(const keel_saver_config *cfg, keel_saver **out)
{
    (void)cfg;
    *out = NULL;
    return keel__fail(KEEL_EINTERNAL, "checkpoint module not built");
}

KEEL_WEAK keel_status
keel_saver_save(keel_saver *s, const keel_vars *vs, const keel_ckpt_meta *m,
                char *path, size_t n)
{
    (void)s; (void)vs; (void)m; (void)path; (void)n;
    return keel__fail(KEEL_EINTERNAL, "checkpoint module not built");
}

KEEL_WEAK keel_status
keel_saver_wait(keel_saver *s)
{
    (void)s;
    return KEEL_OK;
}

KEEL_WEAK void
keel_saver_free(keel_saver *s)
{
    (void)s;
}

KEEL_WEAK keel_status
keel_ckpt_latest(const char *dir, const char *base, char *path, size_t n,
                 int64_t *step)
{
    (void)dir; (void)base; (void)path; (void)n; (void)step;
    return keel__fail(KEEL_ENOTFOUND, "checkpoint module not built");
}

KEEL_WEAK keel_status
keel_ckpt_restore(const char *path, keel_vars *vs,
                  const keel_restore_opts *o, keel_restore_report *r)
{
    (void)path; (void)vs; (void)o; (void)r;
    return keel__fail(KEEL_EINTERNAL, "checkpoint module not built");
}

KEEL_WEAK keel_status
keel_ckpt_read_info(const char *path, keel_ckpt_info **out)
{
    (void)path;
    *out = NULL;
    return keel__fail(KEEL_EINTERNAL, "checkpoint module not built");
}

KEEL_WEAK void
keel_ckpt_info_free(keel_ckpt_info *info)
{
    (void)info;
}

KEEL_WEAK const void *
keel_ckpt_info_blob(const keel_ckpt_info *info, const char *name,
                    size_t *size)
{
    (void)info; (void)name;
    if (size != NULL)
        *size = 0;
    return NULL;
}
