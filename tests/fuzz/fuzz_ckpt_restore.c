/* fuzz_ckpt_restore.c - a checkpoint file of arbitrary bytes: listed,
 * verified, its metadata read, and restored (strict and partial) into a
 * store shaped like the seed's (dense/kernel [3,2], dense/bias [2]). The
 * bytes go through a real file because HDF5 opens files. */
#include <config.h>

#include <stdlib.h>

#include <keel/checkpoint.h>
#include <keel/log.h>
#include "fuzz_util.h"

static keel_vars *
make_store(void)
{
    static const int64_t k[2] = { 3, 2 }, b[1] = { 2 };
    keel_vars *vs = NULL;
    if (keel_vars_new(&vs) != KEEL_OK ||
        keel_vars_create(vs, "dense/kernel", 2, k, KEEL_VAR_TRAINABLE,
                         NULL) != KEEL_OK ||
        keel_vars_create(vs, "dense/bias", 1, b, KEEL_VAR_TRAINABLE,
                         NULL) != KEEL_OK)
        abort();
    return vs;
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_write(0, "model.ckpt-1.h5", data, size);
    keel_ckpt_entry *entries = NULL;
    keel_ckpt_info *info = NULL;
    keel_restore_config opts;
    keel_vars *vs;
    size_t n;
    if (keel_ckpt_list(path, &entries, &n) == KEEL_OK)
        keel_ckpt_list_free(entries);
    if (keel_ckpt_read_info(path, &info) == KEEL_OK)
        keel_ckpt_info_free(info);
    (void)keel_ckpt_verify(path);
    vs = make_store();
    (void)keel_ckpt_restore(path, vs, NULL, NULL);
    keel_vars_free(vs);
    vs = make_store();
    keel_restore_config_init(&opts);
    opts.mode = KEEL_RESTORE_PARTIAL;
    (void)keel_ckpt_restore(path, vs, &opts, NULL);
    keel_vars_free(vs);
    return 0;
}
