/* fuzz_idx.c - IDX image and label files, plain or gzip-compressed, then
 * every example read back. Input: a 16-bit little-endian length of the
 * images file, the images file, the labels file (the rest). */
#include <config.h>

#include <stdlib.h>

#include <keel/train.h>
#include "fuzz_util.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    keel_dataset *ds = NULL;
    size_t split;
    const char *img, *lab;
    if (size < 2)
        return 0;
    split = (size_t)data[0] | (size_t)data[1] << 8;
    data += 2;
    size -= 2;
    if (split > size)
        split = size;
    img = fuzz_write(0, "images", data, split);
    lab = fuzz_write(1, "labels", data + split, size - split);
    if (keel_dataset_open_idx(img, lab, 10, &ds) == KEEL_OK) {
        size_t n = keel_dataset_count(ds), each = keel_dataset_example_size(ds);
        float *x = malloc(each * sizeof *x);
        int32_t y;
        if (x == NULL)
            abort();
        for (size_t i = 0; i < n && i < 64; i++)
            (void)keel_dataset_get(ds, i, x, &y);
        free(x);
        keel_dataset_free(ds);
    }
    return 0;
}
