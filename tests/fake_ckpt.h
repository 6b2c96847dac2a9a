/* fake_ckpt.h - an in-memory stand-in for checkpoint/ behind keel__ckpt, so
 * session tests count saves and restore state without HDF5. */
#ifndef KEEL_FAKE_CKPT_H
#define KEEL_FAKE_CKPT_H

#include <stdint.h>
#include <keel/keel.h>

#define FAKE_MAX_SAVES 64

typedef struct fake_ckpt {
    int64_t steps[FAKE_MAX_SAVES];   /* every save, in order */
    int n_saves;
    int n_restores;
    float data[64];                  /* newest save: variable values */
    int64_t gs;
    unsigned char blob[64];
    size_t blob_size;
    char blob_name[64];
    int fail_saves;                  /* saves fail with KEEL_EIO */
    int fail_after_saves;            /* > 0: once this many saves are
                                      * recorded, new ones fail (EIO) */
    int fail_wait;                   /* saver_wait fails with KEEL_EIO */
} fake_ckpt;

extern fake_ckpt fake;
/* Reset the fake and install it (fake_uninstall restores the real one). */
void fake_install(void);
void fake_uninstall(void);
/* Save vs into the fake as a checkpoint would. */
keel_status fake_save_vars(const keel_vars *vs);
/* Hook for a shared event log: called on every save with the step. */
extern void (*fake_on_save)(int64_t step);

#endif
