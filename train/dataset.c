/* dataset.c - the keel_dataset handle every reader fills: free, its
 * shape, count and label accessors, and what the readers share (pixels to
 * floats, the error of a failed open). The readers are data_idx.c,
 * data_hdf5.c and data_inputs.c; reading examples and batches is data.c. */
#include <config.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <keel/train.h>
#include "util.h"
#include "h5util.h"
#include "data_int.h"

KEEL__VECTORIZE_FILE

void
keel_dataset_free(keel_dataset *ds)
{
    if (ds == NULL)
        return;
    if (ds->streamed || ds->st.path != NULL) {
        keel__h5_lock();
        keel__h5_close(ds->st.dx);
        keel__h5_close(ds->st.f);
        keel__h5_unlock();
    }
    for (int k = 0; k < STREAM_SLOTS; k++)
        free(ds->st.buf[k]);
    free(ds->st.u8);
    free(ds->st.path);
    free(ds->x8);
    free(ds->xf);
    free(ds->y);
    free(ds);
}

int
keel_dataset_rank(const keel_dataset *ds)
{
    return ds != NULL ? ds->rank : 0;
}

int64_t
keel_dataset_max_label(const keel_dataset *ds)
{
    return ds != NULL ? ds->max_label : -1;
}

int
keel_dataset_is_streamed(const keel_dataset *ds)
{
    return ds != NULL && ds->streamed;
}

uint64_t
keel_dataset_blocks_read(const keel_dataset *ds)
{
    return ds != NULL ? ds->st.reads : 0;
}

size_t
keel_dataset_count(const keel_dataset *ds)
{
    return ds != NULL ? ds->n : 0;
}

void
keel_dataset_shape(const keel_dataset *ds, int64_t *h, int64_t *w,
                   int64_t *c)
{
    if (h != NULL)
        *h = ds->h;
    if (w != NULL)
        *w = ds->w;
    if (c != NULL)
        *c = ds->c;
}

size_t
keel_dataset_example_size(const keel_dataset *ds)
{
    return ds != NULL ? ds->esize : 0;
}

KEEL__HOT void
keel__data_u8_to_float(const uint8_t *restrict p, float *restrict x, size_t n)
{
    for (size_t j = 0; j < n; j++)
        x[j] = (float)p[j] / 255.0f;     /* like numpy's x/np.float32(255) */
}

keel_status
keel__data_open_fail(const char *path, const char *what)
{
    int e = errno;
    return keel__fail(e == ENOENT ? KEEL_ENOTFOUND : KEEL_EIO,
                      "%s file %s: %s", what, path, strerror(e));
}
