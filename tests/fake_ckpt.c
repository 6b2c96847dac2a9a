/* fake_ckpt.c - in-memory checkpoint calls for check_session: the newest
 * save's values, global step and one blob; every saved step recorded. */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include "util.h"
#include "../checkpoint/ckpt_ops.h"
#include "fake_ckpt.h"

fake_ckpt fake;
void (*fake_on_save)(int64_t step);
static int dummy_saver;

static keel_status
f_saver_new(const keel_saver_config *cfg, keel_saver **out)
{
    (void)cfg;
    *out = (keel_saver *)&dummy_saver;
    return KEEL_OK;
}

static keel_status
f_save(keel_saver *s, const keel_vars *vs, const keel_ckpt_meta *meta,
       char *path, size_t n)
{
    size_t i, k = 0;
    int64_t step = keel_vars_global_step(vs);
    (void)s;
    if (fake.fail_saves
        || (fake.fail_after_saves > 0 && fake.n_saves >= fake.fail_after_saves
            && fake.steps[fake.n_saves - 1] != step))
        return keel__fail(KEEL_EIO, "fake save failure at step %lld: "
                          "fake-%lld: No space left on device",
                          (long long)step, (long long)step);
    if (path != NULL)               // named also by a no-op, as the real one
        snprintf(path, n, "fake-%lld", (long long)step);
    if (fake.n_saves > 0 && fake.steps[fake.n_saves - 1] == step)
        return KEEL_OK;             // the real saver's no-op rule
    if (fake.n_saves < FAKE_MAX_SAVES)
        fake.steps[fake.n_saves++] = step;
    for (i = 0; i < keel_vars_count(vs); i++) {
        keel_tensor *t = keel_var_tensor(keel_vars_at(vs, i));
        size_t j;
        for (j = 0; j < t->count && k < 64; j++)
            fake.data[k++] = t->data[j];
    }
    fake.gs = step;
    fake.blob_size = 0;
    if (meta != NULL && meta->n_blobs > 0 && meta->blobs[0].size <= 64) {
        memcpy(fake.blob, meta->blobs[0].data, meta->blobs[0].size);
        fake.blob_size = meta->blobs[0].size;
        snprintf(fake.blob_name, sizeof fake.blob_name, "%s",
                 meta->blobs[0].name);
    }
    if (fake_on_save != NULL)
        fake_on_save(step);
    return KEEL_OK;
}

static keel_status
f_wait(keel_saver *s)
{
    (void)s;
    if (fake.fail_wait)
        return keel__fail(KEEL_EIO, "fake async save failure: fake-%lld: "
                          "No space left on device", (long long)fake.gs);
    return KEEL_OK;
}

static void
f_free(keel_saver *s)
{
    (void)s;
}

static keel_status
f_latest(const char *dir, const char *base, char *path, size_t n,
         int64_t *step)
{
    (void)dir;
    (void)base;
    if (fake.n_saves == 0)
        return keel__fail(KEEL_ENOTFOUND, "fake: no checkpoint");
    snprintf(path, n, "fake-%lld", (long long)fake.gs);
    *step = fake.gs;
    return KEEL_OK;
}

static keel_status
f_restore(const char *path, keel_vars *vs, const keel_restore_config *o,
          keel_restore_report *r)
{
    size_t i, k = 0;
    (void)path;
    (void)o;
    for (i = 0; i < keel_vars_count(vs); i++) {
        keel_var *v = keel_vars_at(vs, i);
        keel_tensor *t = keel_var_tensor(v);
        size_t j;
        for (j = 0; j < t->count && k < 64; j++)
            t->data[j] = fake.data[k++];
        keel_var_set_initialized(v, 1);
    }
    keel_vars_set_global_step(vs, fake.gs);
    fake.n_restores++;
    if (r != NULL) {
        r->global_step = fake.gs;
        r->n_restored = keel_vars_count(vs);
    }
    return KEEL_OK;
}

static keel_status
f_restore_latest(const char *dir, const char *base, keel_vars *vs,
                 const keel_restore_config *o, keel_restore_report *r,
                 char *path, size_t n)
{
    int64_t step;
    char p[64];
    keel_status st = f_latest(dir, base, p, sizeof p, &step);
    if (st == KEEL_OK)
        st = f_restore(p, vs, o, r);
    if (st == KEEL_OK && path != NULL)
        snprintf(path, n, "%s", p);
    return st;
}

static keel_status
f_read_info(const char *path, keel_ckpt_info **out)
{
    keel_ckpt_info *info = calloc(1, sizeof *info);
    (void)path;
    if (info == NULL)
        return KEEL_ENOMEM;
    info->global_step = fake.gs;
    if (fake.blob_size > 0) {
        info->n_blobs = 1;
        snprintf(info->blobs[0].name, sizeof info->blobs[0].name, "%s",
                 fake.blob_name);
        info->blobs[0].data = malloc(fake.blob_size);
        memcpy(info->blobs[0].data, fake.blob, fake.blob_size);
        info->blobs[0].size = fake.blob_size;
    }
    *out = info;
    return KEEL_OK;
}

static void
f_info_free(keel_ckpt_info *info)
{
    if (info == NULL)
        return;
    free(info->blobs[0].data);
    free(info);
}

/* The newest save's step, as the real saver knows its newest checkpoint. */
static int64_t
f_last_step(const keel_saver *s)
{
    (void)s;
    return fake.n_saves > 0 ? fake.steps[fake.n_saves - 1] : -1;
}

static const keel__ckpt_ops fake_ops = {
    f_saver_new, f_save, f_wait, f_free, f_latest, f_restore,
    f_restore_latest, f_read_info,
    f_info_free, f_last_step
};

void
fake_install(void)
{
    memset(&fake, 0, sizeof fake);
    fake_on_save = NULL;
    keel__ckpt_set_ops(&fake_ops);
}

void
fake_uninstall(void)
{
    keel__ckpt_set_ops(NULL);
}

keel_status
fake_save_vars(const keel_vars *vs)
{
    return f_save(NULL, vs, NULL, NULL, 0);
}
