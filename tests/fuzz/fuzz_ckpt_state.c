/* fuzz_ckpt_state.c - the checkpoint directory's state file: parsed alone,
 * then through keel_ckpt_latest (which falls back to a directory scan when
 * the file is unusable; the names it lists do not exist here). */
#include <config.h>

#include <keel/checkpoint.h>
#include "ckpt_int.h"
#include "fuzz_util.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ck_state st;
    char path[512];
    int64_t step;
    fuzz_write(0, "checkpoint", data, size);
    if (keel__ckpt_state_read(fuzz_dir(), &st) == KEEL_OK)
        keel__ckpt_state_free(&st);
    (void)keel_ckpt_latest(fuzz_dir(), NULL, path, sizeof path, &step);
    return 0;
}
