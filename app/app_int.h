/* app_int.h - private to app/, the trainer application (`keel train`,
 * `keel eval`, the evaluator task) built on the public session, cluster,
 * train and checkpoint APIs: what the training job (job*.c, job_int.h)
 * shares with the evaluator, export and K-FAC's roles. */
#ifndef KEEL_APP_INT_H
#define KEEL_APP_INT_H

#include <keel/config.h>
#include <keel/train.h>
#include <keel/kfac_dist.h>

/* Open the training (is_test 0) or test set the config names, labels in
 * [0, classes) (0: up to the format's limit); HDF5 sets streamed as
 * data.stream says, or always with labels_only (only the labels are read
 * then). */
keel_status keel__job_open_dataset(const struct keel_config *cfg, int is_test,
                                   int64_t classes, int labels_only,
                                   keel_dataset **out);
/* The model's class count: model.classes, or (0) the largest label of
 * the training set train (NULL: opened here, labels only) plus one. */
keel_status keel__job_classes(const struct keel_config *cfg,
                              const keel_dataset *train, int64_t *out);
/* The model the config describes over ds's examples, with classes
 * classes, for batches up to max_batch; a cnn refuses tabular data. */
keel_status keel__job_model_config_from(const struct keel_config *cfg,
                                        const keel_dataset *ds,
                                        int64_t classes, int64_t max_batch,
                                        keel_model_config *mc);
/* OpenBLAS threads as train.threads / train.model_threads say. */
void keel__job_set_blas_threads(const struct keel_config *cfg);
/* Training steps per epoch for the config's data and global batch. */
keel_status keel__job_steps_per_epoch(const struct keel_config *cfg,
                                      int64_t *out);

/* Validation during training (evaluator.c): the config's test set and a
 * model of its own, built once; each run copies the training store's
 * variables (src, borrowed) and evaluates the whole test set. result's
 * step is src's global step, checkpoint empty. Caller owns *out. */
typedef struct keel__validator keel__validator;
struct keel_eval_result;
keel_status keel__validator_new(const struct keel_config *cfg,
                                keel__validator **out);
keel_status keel__validator_run(keel__validator *v, const keel_vars *src,
                                struct keel_eval_result *result);
void keel__validator_free(keel__validator *v);

/* A model being exported (export.c, onnx.c): its variables and, when it
 * has one, its layer description (docs/export.md) as keel__desc_check
 * (describe.c) checked and completed it against them. */
struct json_object;
typedef struct keel__xmodel {
    keel_vars *vs;                  /* borrowed */
    struct json_object *arch;       /* borrowed; NULL: no description */
    int keras_names;                /* keel train's scopes: renamed as
                                     * tf.keras names its layers */
    int softmax;                    /* "output": "logits": a Softmax gives
                                     * "probabilities" */
    int in_rank;                    /* 1: [features]; 3: [h, w, c] */
    int64_t in_shape[3];
    int64_t out_dim;                /* the last layer's width */
    int64_t step;                   /* the checkpoint's global step */
    const char *path;               /* the checkpoint, for messages */
} keel__xmodel;
/* Check arch (a description read from a file or built by a program)
 * against vs: classes, names, activations, every variable's shape along
 * the layers; missing settings (strides, units, ...) are written in.
 * Fills xm's vs, arch, softmax and shapes. KEEL_ECORRUPT naming the
 * layer. */
keel_status keel__desc_check(struct json_object *arch, keel_vars *vs,
                             keel__xmodel *xm);
/* The checked description's layers, layer i, its kernel (w 0) or bias
 * (w 1) variable (NULL: none), and an integer setting or the i-th of a
 * pair. */
size_t keel__desc_layers(const keel__xmodel *xm);
struct json_object *keel__desc_layer(const keel__xmodel *xm, size_t i);
keel_var *keel__desc_layer_var(const keel__xmodel *xm, size_t i, int w);
int64_t keel__desc_int(struct json_object *L, const char *key, size_t i);
/* The ONNX ModelProto of xm (onnx.c); caller frees *out. */
keel_status keel__onnx_bytes(const keel__xmodel *xm, unsigned char **out,
                             size_t *len);

/* ---- K-FAC on a cluster (kfac_dist.c): the [kfac] keys into the
 * library's distributed K-FAC (keel/kfac_dist.h) ---- */
typedef keel_kfac_dist keel__kfac_dist;
/* 1 if cfg asks for optimizer.name = kfac with kfac.distributed = roles. */
int keel__kfac_dist_roles(const keel_config *cfg);
/* Role of replica (0 the chief) of replicas: 0 gradient, 1 covariance,
 * 2 inverse; *index its number in the role; counts (may be NULL) the
 * tasks per role. KEEL_EINVAL naming the keys when a role stays empty. */
keel_status keel__kfac_dist_role(const keel_config *cfg, int replica,
                                 int replicas, int *role, int *index,
                                 int counts[3]);
const char *keel__kfac_role_name(int role);
/* The roles' extra state in vs: "<layer>/kfac_inv_step" (every task of
 * the cluster, before placement). */
keel_status keel__kfac_dist_add_state(keel_kfac *k, keel_vars *vs);
/* Distributed K-FAC as cfg's [kfac] keys say for replica of replicas; k
 * and vs borrowed; caller owns *out: keel__kfac_dist_free(). */
keel_status keel__kfac_dist_new(const keel_config *cfg, keel_kfac *k,
                                keel_vars *vs, int replica, int replicas,
                                keel__kfac_dist **out);
void keel__kfac_dist_free(keel__kfac_dist *d);
void keel__kfac_dist_set_backend(keel__kfac_dist *d,
                                 keel_cluster_backend *b);

#endif