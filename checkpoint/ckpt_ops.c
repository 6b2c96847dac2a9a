/* ckpt_ops.c - the table through which session/ and hooks/ call the
 * checkpoint module, so tests can count and fail saves without HDF5
 * (ckpt_ops.h). */
#include <config.h>

#include <stddef.h>
#include "util.h"
#include "ckpt_ops.h"

const keel__ckpt_ops keel__ckpt_default = {
    keel_saver_new, keel_saver_save, keel_saver_wait, keel_saver_free,
    keel_ckpt_latest, keel_ckpt_restore, keel_ckpt_restore_latest,
    keel_ckpt_read_info,
    keel_ckpt_info_free, keel_saver_last_step
};

const keel__ckpt_ops *keel__ckpt = &keel__ckpt_default;

void
keel__ckpt_set_ops(const keel__ckpt_ops *ops)
{
    keel__ckpt = ops != NULL ? ops : &keel__ckpt_default;
}
