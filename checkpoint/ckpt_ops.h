/* ckpt_ops.h - the checkpoint call table: the one seam through which the
 * layers above checkpoint/ (the session's saver and restore, the
 * CheckpointSaverHook) save and restore, so tests swap in an in-memory
 * fake that counts and fails saves without HDF5. It belongs to
 * checkpoint/ because it is checkpoint/'s API, indirected; the layers
 * above include it and nothing else of checkpoint/'s internals. */
#ifndef KEEL_CKPT_OPS_H
#define KEEL_CKPT_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <keel/checkpoint.h>

typedef struct keel__ckpt_ops {
    keel_status (*saver_new)(const keel_saver_config *cfg, keel_saver **out);
    keel_status (*saver_save)(keel_saver *s, const keel_vars *vs,
                              const keel_ckpt_meta *meta, char *path,
                              size_t path_size);
    keel_status (*saver_wait)(keel_saver *s);
    void (*saver_free)(keel_saver *s);
    keel_status (*latest)(const char *dir, const char *basename, char *path,
                          size_t path_size, int64_t *step);
    keel_status (*restore)(const char *path, keel_vars *vs,
                           const keel_restore_config *opts,
                           keel_restore_report *report);
    keel_status (*restore_latest)(const char *dir, const char *basename,
                                  keel_vars *vs,
                                  const keel_restore_config *opts,
                                  keel_restore_report *report, char *path,
                                  size_t path_size);
    keel_status (*read_info)(const char *path, keel_ckpt_info **out);
    void (*info_free)(keel_ckpt_info *info);
    int64_t (*saver_last_step)(const keel_saver *s);
} keel__ckpt_ops;

extern const keel__ckpt_ops *keel__ckpt;          /* current table */
extern const keel__ckpt_ops keel__ckpt_default;   /* checkpoint/ */
/* Install ops (NULL restores the default). Test use only. */
void keel__ckpt_set_ops(const keel__ckpt_ops *ops);

#endif
