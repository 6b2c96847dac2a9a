/* fuzz_ckpt_h5.c - a checkpoint file of arbitrary bytes through the HDF5
 * layout's readers alone, with no store to fit: verified, listed (and each
 * of the first datasets read back), its metadata read. What the bounded
 * reads and the own-files rule of checkpoint/h5bounds.c guard. The bytes
 * go through a real file because HDF5 opens files. */
#include <config.h>

#include <keel/checkpoint.h>
#include <keel/tensor.h>
#include "fuzz_util.h"

/* The datasets read back per input: enough to reach the slab and the
 * contiguous readers, few enough to keep an input fast. */
#define READ_BACK 4

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *path = fuzz_write(0, "model.ckpt-1.h5", data, size);
    keel_ckpt_entry *entries = NULL;
    keel_ckpt_info *info = NULL;
    size_t n = 0;

    (void)keel_ckpt_verify(path);
    if (keel_ckpt_list(path, &entries, &n) == KEEL_OK) {
        for (size_t i = 0; i < n && i < READ_BACK; i++) {
            keel_tensor t;
            if (keel_ckpt_read_tensor(path, entries[i].name, entries[i].slot,
                                      &t) == KEEL_OK)
                keel_tensor_release(&t);
        }
        keel_ckpt_list_free(entries);
    }
    if (keel_ckpt_read_info(path, &info) == KEEL_OK)
        keel_ckpt_info_free(info);
    return 0;
}
