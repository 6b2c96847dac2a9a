/* keel/train.h - the model library: models (softmax regression, MLP, a
 * small CNN) with forward and backward passes on OpenBLAS, K-FAC, Hogwild,
 * and data readers (IDX, HDF5) with a deterministic, resumable,
 * worker-sliced batch iterator, on the numeric layer's tensors, variable store
 * (keel/tensor.h) and optimizers (keel/optimizer.h), both included.
 * Everything is configured by plain structs filled with defaults by the
 * matching _config_init(). Handles are not thread-safe. */
#ifndef KEEL_TRAIN_H
#define KEEL_TRAIN_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/tensor.h>
#include <keel/optimizer.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- batches and models ------------------------------------------------- */

/* n examples: x is n x H x W x C floats (NHWC, [0,1] for images), y is n
 * labels in [0, classes). Borrowed by every call that takes it. */
typedef struct keel_batch {
    const float *x;
    const int32_t *y;
    size_t n;
} keel_batch;

typedef enum keel_model_kind {
    KEEL_MODEL_SOFTMAX = 0,   /* softmax regression: Dense(classes) */
    KEEL_MODEL_MLP,           /* Dense(h) act ... -> Dense(classes) */
    KEEL_MODEL_CNN            /* Conv32 3x3 ReLU, Pool2, Conv64 3x3
                               * ReLU, Pool2, Flatten, Dense64 ReLU, Dense */
} keel_model_kind;

typedef enum keel_activation {
    KEEL_ACT_RELU = 0,
    KEEL_ACT_TANH,
    KEEL_ACT_NONE
} keel_activation;

typedef enum keel_init_kind {
    KEEL_INIT_GLOROT = 0,  /* Keras: kernels Glorot-uniform, biases zero */
    KEEL_INIT_TORCH        /* PyTorch default: kernel and bias
                            * U(-1/sqrt(fan_in), 1/sqrt(fan_in)) */
} keel_init_kind;

#define KEEL_MODEL_MAX_HIDDEN 8

typedef struct keel_model_config {
    uint32_t struct_size;          /* set by keel_model_config_init() */
    keel_model_kind kind;          /* default KEEL_MODEL_MLP */
    int n_hidden;                  /* MLP hidden layers; default 2 */
    int64_t hidden[KEEL_MODEL_MAX_HIDDEN];   /* default 256, 256 */
    keel_activation activation;    /* MLP hidden activation; default ReLU */
    int64_t height, width, channels;         /* default 28 x 28 x 1 */
    int64_t classes;               /* default 10 */
    int64_t max_batch;             /* workspaces are sized for this many
                                    * examples per call; default 256 */
    keel_init_kind init;           /* default KEEL_INIT_GLOROT */
    int threads;                   /* 1..8 persistent threads (created by
                                    * keel_model_new) sharing the fixed
                                    * pieces of every batch (set OpenBLAS
                                    * to 1 thread when > 1); the result
                                    * has the same bits for every count.
                                    * Default 1. */
} keel_model_config;

typedef struct keel_model keel_model;

/* Per-call statistics: the summed (not averaged) cross-entropy of the batch
 * in double, the number of correct argmax predictions and the examples. */
typedef struct keel_step_stats {
    double loss_sum;
    int64_t correct;
    int64_t count;
} keel_step_stats;

/* Defaults above. Cannot fail. */
void keel_model_config_init(keel_model_config *cfg);
/* "softmax" | "mlp" | "cnn". Unknown names are KEEL_EINVAL listing the
 * valid choices. Same for activations ("relu" | "tanh" | "none") and init
 * schemes ("glorot" | "torch"). */
keel_status keel_model_kind_from_name(const char *name, keel_model_kind *out);
const char *keel_model_kind_name(keel_model_kind k);
keel_status keel_activation_from_name(const char *name, keel_activation *out);
keel_status keel_init_kind_from_name(const char *name, keel_init_kind *out);
/* Parse "256,256" into cfg->hidden / cfg->n_hidden ("" = no hidden layer). */
keel_status keel_model_parse_hidden(const char *s, keel_model_config *cfg);

/* Build a model and create its trainable variables in vs ("dense_1/kernel"
 * [in,out], "dense_1/bias" [out], "conv2d_1/kernel" [kh,kw,cin,cout],
 * "conv2d_1/bias" [cout]; Keras layouts and names). Variables are zero and
 * NOT initialized: call keel_model_init_vars or restore a checkpoint. All
 * workspaces are allocated here. vs is borrowed and must outlive the model.
 * Caller owns *out: keel_model_free(). */
keel_status keel_model_new(const keel_model_config *cfg, keel_vars *vs,
                           keel_model **out);
/* A second model with its own workspaces on the variables an identical
 * model (same cfg but threads and max_batch) already created in vs: found
 * by name, shapes checked (KEEL_EINVAL naming the first missing one).
 * For threads that each run a model on one shared store (Hogwild below).
 * vs is borrowed and must outlive the model. Caller owns *out. */
keel_status keel_model_new_shared(const keel_model_config *cfg,
                                  keel_vars *vs, keel_model **out);
void keel_model_free(keel_model *m);
/* Deterministic initialization from seed (cfg->init scheme); the same seed
 * gives the same bits on every machine. Marks the variables initialized. */
keel_status keel_model_init_vars(keel_model *m, keel_vars *vs, uint64_t seed);
/* Forward + backward on batch (1 <= n <= max_batch). ADDS this batch's
 * gradient of (sum of per-example losses) / global_batch_size into grads
 * (made by keel_grads_new for vs); the batch's own gradient is computed
 * alone and then added elementwise, so accumulating fixed micro-batches in a
 * fixed order gives the same bits wherever each micro-batch was computed.
 * stats (may be NULL) is overwritten with this batch's figures. */
keel_status keel_model_step(keel_model *m, keel_vars *vs,
                            const keel_batch *batch, int64_t global_batch_size,
                            keel_grads *grads, keel_step_stats *stats);
/* Forward only; stats overwritten (loss_sum, correct, count). */
keel_status keel_model_eval(keel_model *m, keel_vars *vs,
                            const keel_batch *batch, keel_step_stats *stats);
/* Forward only: class probabilities (n x classes) into probs. */
keel_status keel_model_predict(keel_model *m, keel_vars *vs,
                               const keel_batch *batch, float *probs);
/* Floating-point operations of one training example (forward + backward,
 * multiply-add = 2), for GFLOP/s reports. */
double keel_model_flops_per_example(const keel_model *m);
/* Number of variables the model created, and its config. */
size_t keel_model_num_vars(const keel_model *m);
const keel_model_config *keel_model_get_config(const keel_model *m);

/* ---- embedding layer (docs/train.md, "Embeddings") ----------------------
 * A table variable "<name>/embeddings" [vocab, dim]: forward, the rows of
 * integer ids (a gather); backward, the table's gradient as rows
 * (keel_grads_add_rows: the output gradient's row k for id k, duplicates
 * summed in the order given), so an optimizer updates only the rows the
 * step read and a worker pushes only those (docs/cluster.md, "Sparse
 * rows"). The table is an ordinary variable: checkpoints hold it whole. */

typedef struct keel_embedding_config {
    uint32_t struct_size;          /* set by keel_embedding_config_init() */
    const char *name;              /* scope; default "embedding"; copied
                                    * into the variable's name */
    int64_t vocab;                 /* rows; required (>= 1) */
    int64_t dim;                   /* floats per row; default 16 */
} keel_embedding_config;

typedef struct keel_embedding keel_embedding;

/* Defaults above (vocab 0: must be set). Cannot fail. */
void keel_embedding_config_init(keel_embedding_config *cfg);
/* Create the trainable table in vs (zero, not initialized), or use the one
 * of that name and shape already there (a second layer on a shared
 * table). vs is borrowed and must outlive the layer. Caller owns *out:
 * keel_embedding_free(). */
keel_status keel_embedding_new(const keel_embedding_config *cfg,
                               keel_vars *vs, keel_embedding **out);
void keel_embedding_free(keel_embedding *e);
/* The table (borrowed while its store lives). */
keel_var *keel_embedding_var(const keel_embedding *e);
/* Keras' default: every entry uniform in [-0.05, 0.05) from seed (the same
 * bits on every machine); marks the table initialized. */
keel_status keel_embedding_init_vars(keel_embedding *e, uint64_t seed);
/* out (n x dim floats, caller's) = the table's rows ids[0..n). KEEL_EINVAL
 * naming the table for an id outside [0, vocab). */
keel_status keel_embedding_lookup(const keel_embedding *e, size_t n,
                                  const int64_t *ids, float *out);
/* ADD the gradient of the lookup of ids, given its output's gradient dout
 * (n x dim), to grads as rows of the table. ids, dout: caller owns. */
keel_status keel_embedding_backward(const keel_embedding *e, size_t n,
                                    const int64_t *ids, const float *dout,
                                    keel_grads *grads);

/* ---- K-FAC (docs/kfac.md) ------------------------------------------------
 * Kronecker-factored natural-gradient updates for every layer with
 * parameters of a keel_model (dense: A of the inputs with a 1 appended for
 * the bias, G of the pre-activation output gradients; convolutions: KFC
 * factors of the im2col patches and the per-location output gradients).
 * Its state is variables of the store, so checkpoints carry it: per layer
 * "<layer>/kfac_A", "<layer>/kfac_G" (zero-debiased EMA accumulators),
 * "<layer>/kfac_A_inv", "<layer>/kfac_G_inv" (damped inverses), the scalar
 * "kfac/ema_weight", and a "velocity" slot on every kernel and bias. */

typedef enum keel_kfac_momentum_type {
    KEEL_KFAC_MOMENTUM_REGULAR = 0,  /* v = mu v + F^-1 g; x -= lr v */
    KEEL_KFAC_MOMENTUM_ADAM          /* v = mu v + g; x -= lr F^-1 v */
} keel_kfac_momentum_type;

typedef enum keel_kfac_estimation {
    KEEL_KFAC_GRADIENTS = 0,  /* G from targets sampled from the model's
                               * softmax: the true Fisher */
    KEEL_KFAC_EMPIRICAL       /* G from the labels: the empirical Fisher */
} keel_kfac_estimation;

typedef struct keel_kfac_config {
    uint32_t struct_size;          /* set by keel_kfac_config_init() */
    keel_lr_schedule schedule;     /* learning rate per step; 0.0001 */
    double damping;                /* Tikhonov lambda; default 0.001 */
    double cov_ema_decay;          /* default 0.95 */
    double momentum;               /* default 0.9 */
    keel_kfac_momentum_type momentum_type;   /* default adam */
    keel_kfac_estimation estimation;         /* default gradients */
    double norm_constraint;        /* KL clipping C; 0 = off (default) */
    int64_t invert_every;          /* steps between inversions; 10 */
    uint64_t seed;                 /* target sampling; default 0 */
    int64_t cov_update_every;      /* steps between factor updates; 1. The
                                    * EMA decay per update is then
                                    * cov_ema_decay^cov_update_every */
    int model_grads;               /* 1: each step is keel_model_step of a
                                    * batch onto zeroed gradients, then
                                    * keel_kfac_observe of that batch once
                                    * with the variables unchanged, then
                                    * keel_kfac_apply of those gradients
                                    * unchanged (no added term, no
                                    * aggregation: keel train in one
                                    * process). The statistics then reuse
                                    * the step's forward pass, and a dense
                                    * layer's update may be formed from
                                    * the batch's activations (fewer flops
                                    * for a batch smaller than the layer;
                                    * docs/kfac.md); with adam momentum it
                                    * adds the "precond" slots. 0 (default):
                                    * none of that is assumed. */
} keel_kfac_config;

typedef struct keel_kfac keel_kfac;

/* Defaults above. Cannot fail. */
void keel_kfac_config_init(keel_kfac_config *cfg);
/* "regular" | "adam"; "gradients" | "empirical". */
keel_status keel_kfac_momentum_type_from_name(const char *name,
                                              keel_kfac_momentum_type *out);
keel_status keel_kfac_estimation_from_name(const char *name,
                                           keel_kfac_estimation *out);
/* Validate cfg, create the state variables and slots in vs (zero, marked
 * initialized; existing ones keep their values, as after a restore) and
 * the workspaces. m and vs are borrowed and must outlive the optimizer.
 * Caller owns *out: keel_kfac_free(). */
keel_status keel_kfac_new(const keel_kfac_config *cfg, keel_model *m,
                          keel_vars *vs, keel_kfac **out);
void keel_kfac_free(keel_kfac *k);
const keel_kfac_config *keel_kfac_get_config(const keel_kfac *k);
/* The factor statistics of batch (the examples of this step, or one of its
 * micro-batches) with the current variables, the targets drawn from the
 * seed and global_step: ADDED to this step's pending sums. Call before
 * keel_kfac_apply of the same step. Uses the model's workspaces. Does
 * nothing (KEEL_OK) at a step that updates no factors: global_step %
 * cov_update_every != 0 once the factors have statistics. */
keel_status keel_kfac_observe(keel_kfac *k, keel_vars *vs,
                              const keel_batch *batch, int64_t global_step);
/* One K-FAC step with grads (as keel_model_step left them): the factors'
 * EMA takes the pending statistics (at the steps keel_kfac_observe
 * observes; at the others the factors stay), the damped inverses are
 * recomputed when
 * global_step % invert_every == 0 (or none were computed yet), then the
 * preconditioned, momentum and KL-clipped update is applied. Every check
 * and inversion happens before any state changes: a failing apply (no
 * statistics observed, a factor not positive definite) changes nothing.
 * Clears the pending statistics. */
keel_status keel_kfac_apply(keel_kfac *k, keel_vars *vs, keel_grads *grads,
                            int64_t global_step);

/* The pieces of keel_kfac_apply for the distributed modes, where
 * statistics, inverses and the update run on different tasks. */
int keel_kfac_num_layers(const keel_kfac *k);
/* Layer i's scope ("dense_1"; borrowed while k lives) and factor sizes
 * (A is a_dim x a_dim, G g_dim x g_dim). Any out may be NULL. */
keel_status keel_kfac_layer(const keel_kfac *k, int i, const char **scope,
                            size_t *a_dim, size_t *g_dim);
/* This step's factors A_batch, G_batch of every layer (the pending
 * statistics normalised, full symmetric matrices) into A[i], G[i]
 * (caller's, a_dim^2 and g_dim^2 floats); clears the pending statistics.
 * KEEL_ESTATE when none were observed. */
keel_status keel_kfac_take_statistics(keel_kfac *k, float *const *A,
                                      float *const *G);
/* Recompute layer i's damped inverses (pi, damping) from the factors and
 * the EMA weight as the store holds them now, into the store's inverse
 * variables. KEEL_ESTATE without statistics (weight 0) or with statistics
 * pending; a factor that is not positive definite changes nothing. */
keel_status keel_kfac_invert_layer(keel_kfac *k, int i);
/* The update of keel_kfac_apply (preconditioning with the store's
 * inverses, momentum, KL clipping) without the factors' EMA or an
 * inversion (except at step 0, where it inverts the store's factors).
 * KEEL_ESTATE with statistics pending or while the factors have none. */
keel_status keel_kfac_apply_update(keel_kfac *k, keel_vars *vs,
                                   keel_grads *grads, int64_t global_step);

/* ---- Hogwild: lock-free threads on one store (docs/train.md) ----------
 * threads threads each compute a gradient on their own mini-batch, reading
 * the shared variables while the others write them, and apply their update
 * with no lock (Niu, Recht, Re, Wright: Hogwild!). Each thread has its own
 * gradients and its own optimizer object; the slots are shared. Updates
 * are plain racy float stores (use_cas 0: a concurrent update of the same
 * element may be lost, which the method tolerates), or each element is
 * changed by one compare-and-swap loop on its 32-bit pattern (use_cas 1:
 * none is lost; slots stay racy). Results depend on the thread timing. */

#define KEEL_HOGWILD_MAX_THREADS 8

typedef struct keel_hogwild_config {
    uint32_t struct_size;          /* set by keel_hogwild_config_init() */
    int threads;                   /* 1..KEEL_HOGWILD_MAX_THREADS; 1 */
    int use_cas;                   /* default 0: racy stores */
} keel_hogwild_config;

typedef struct keel_hogwild keel_hogwild;

/* Thread t's gradient: ADD the gradient of its mini-batch into grads (zero
 * on entry) from the shared store, as keel_model_step does with t's own
 * model. Called concurrently for different t: it must not touch state
 * another thread uses (one keel_model per thread, keel_model_new_shared).
 * global_step is the step this thread's update counts as. */
typedef keel_status (*keel_hogwild_fn)(void *ctx, int thread,
                                       keel_grads *grads,
                                       int64_t global_step);

void keel_hogwild_config_init(keel_hogwild_config *cfg);
/* Threads (parked between rounds), per-thread gradients and optimizers
 * (opt copied; its slots must exist in vs: keel_optimizer_prepare). vs is
 * borrowed and must outlive the handle. Caller owns *out. */
keel_status keel_hogwild_new(const keel_hogwild_config *cfg,
                             const keel_optimizer_config *opt,
                             keel_vars *vs, keel_hogwild **out);
void keel_hogwild_free(keel_hogwild *h);
int keel_hogwild_threads(const keel_hogwild *h);
/* One round: thread t (the caller is thread 0) runs fn(ctx, t, grads_t,
 * global_step + t) and then applies grads_t to vs lock-free with the
 * learning rate (and Adam correction) of global_step + t, unless fn
 * failed. Returns when every thread is done: KEEL_OK, or the failing
 * thread with the lowest index's status and message (the others' updates
 * are applied). Does not change the store's global step: a round counts
 * threads steps. */
keel_status keel_hogwild_run(keel_hogwild *h, keel_hogwild_fn fn, void *ctx,
                             int64_t global_step);

/* ---- data --------------------------------------------------------------- */

typedef struct keel_dataset keel_dataset;

/* Read an IDX image file (magic 0x00000803, uint8 [N,rows,cols]) and its
 * label file (0x00000801, uint8 [N]), each gzip'd or plain, fully into
 * memory. Labels must be < num_classes. Any malformed, truncated or
 * mismatched file is KEEL_ECORRUPT naming it. Caller owns *out. */
keel_status keel_dataset_open_idx(const char *images_path,
                                  const char *labels_path, int num_classes,
                                  keel_dataset **out);
/* Read an HDF5 file with datasets "x" and "y" (integer, [N], each label
 * in [0, num_classes)) fully into memory: "x" is tabular rows [N,D]
 * (float32 or float64) or images [N,H,W] or [N,H,W,C] (float32, float64,
 * or uint8, scaled by 1/255); every value finite. Any other shape or
 * type, a label out of range, a length mismatch or a non-finite value is
 * KEEL_ECORRUPT naming the file, the dataset and the row. The examples are
 * shuffled as a whole (keel_data_iter). Caller owns *out. */
keel_status keel_dataset_open_h5(const char *path, int num_classes,
                                 keel_dataset **out);

/* Labels of any dataset are below this (the model's limit too). */
#define KEEL_DATASET_MAX_CLASSES 1000000

typedef struct keel_dataset_h5_config {
    uint32_t struct_size;   /* set by keel_dataset_h5_config_init() */
    int64_t num_classes;    /* labels in [0, num_classes); default
                             * KEEL_DATASET_MAX_CLASSES */
    int stream;             /* 0 (default): "x" read into memory; 1: only
                             * the labels are read, "x" stays in the file
                             * and is read block by block (hyperslabs of
                             * block_rows rows) into a buffer of two
                             * blocks as examples are asked for; its
                             * values are checked as each block is read,
                             * so a bad value fails that read */
    int64_t block_rows;     /* the shuffle block: keel_data_iter orders
                             * the blocks of block_rows consecutive rows
                             * and the rows within each block, a function
                             * of (seed, epoch) alone, the same in memory
                             * and streamed. 0 (default, in memory only):
                             * the whole set is one block */
} keel_dataset_h5_config;

void keel_dataset_h5_config_init(keel_dataset_h5_config *cfg);
/* keel_dataset_open_h5 with cfg's options (copied). Caller owns *out. */
keel_status keel_dataset_open_h5_config(const char *path,
                                        const keel_dataset_h5_config *cfg,
                                        keel_dataset **out);
/* Inputs for inference, format found from the content: an IDX image file
 * (gzip'd or plain), a .npy array (uint8 or little-endian float32,
 * (N, H, W), (N, H, W, C) or (N, D), C order) or an HDF5 file with
 * dataset "x" as keel_dataset_open_h5 reads it ("y" optional). uint8 is
 * scaled by 1/255. Labels are -1 where the file has none (keel_dataset_get
 * returns them). KEEL_ECORRUPT naming the file for anything malformed.
 * Caller owns *out. */
keel_status keel_dataset_open_inputs(const char *path, keel_dataset **out);
void keel_dataset_free(keel_dataset *ds);
size_t keel_dataset_count(const keel_dataset *ds);
/* Example shape (H, W, C) and floats per example (H*W*C). */
void keel_dataset_shape(const keel_dataset *ds, int64_t *h, int64_t *w,
                        int64_t *c);
size_t keel_dataset_example_size(const keel_dataset *ds);
/* The rank of the file's examples with the leading N: 2 for tabular rows
 * [N,D] (shape D x 1 x 1), 3 or 4 for images. */
int keel_dataset_rank(const keel_dataset *ds);
/* The largest label, -1 when the set has none. */
int64_t keel_dataset_max_label(const keel_dataset *ds);
/* 1 when "x" is read from the file block by block
 * (keel_dataset_h5_config.stream), and the blocks read so far. */
int keel_dataset_is_streamed(const keel_dataset *ds);
uint64_t keel_dataset_blocks_read(const keel_dataset *ds);
/* Copy example i as floats (example_size of them) and its label. A
 * streamed set reads the block holding i (KEEL_ECORRUPT naming the file
 * and row on a read failure or a non-finite value). */
keel_status keel_dataset_get(const keel_dataset *ds, size_t i, float *x,
                             int32_t *y);

typedef struct keel_data_iter_config {
    uint32_t struct_size;          /* set by keel_data_iter_config_init() */
    int64_t global_batch_size;   /* examples per step over all workers; 64 */
    int worker_index;            /* 0 .. num_workers-1; default 0 */
    int num_workers;             /* default 1 */
    uint64_t seed;               /* shuffle seed; default 0 */
    int shuffle;                 /* default 1 */
    int64_t max_epochs;          /* 0 = unlimited; default 0 */
    int drop_remainder;          /* default 1: a last partial global batch
                                  * of an epoch is skipped */
} keel_data_iter_config;

typedef struct keel_data_iter keel_data_iter;

#define KEEL_DATA_ITER_STATE_BYTES 40

void keel_data_iter_config_init(keel_data_iter_config *cfg);
/* ds is borrowed and must outlive the iterator. Caller owns *out. */
keel_status keel_data_iter_new(const keel_dataset *ds,
                               const keel_data_iter_config *cfg,
                               keel_data_iter **out);
void keel_data_iter_free(keel_data_iter *it);
/* This worker's slice of the next global batch: worker i of n gets
 * examples [i*B/n, (i+1)*B/n) of it (B = that global batch's size).
 * out->x and out->y are borrowed until the next call. KEEL_EOUTOFRANGE
 * after max_epochs. A worker whose slice is empty gets n == 0. */
keel_status keel_data_iter_next(keel_data_iter *it, keel_batch *out);
/* Current position: epoch (0-based) and offset of the next global batch
 * within it. */
int64_t keel_data_iter_epoch(const keel_data_iter *it);
int64_t keel_data_iter_offset(const keel_data_iter *it);
/* Global batches per epoch. */
int64_t keel_data_iter_steps_per_epoch(const keel_data_iter *it);
/* The position as a versioned little-endian blob of
 * KEEL_DATA_ITER_STATE_BYTES: magic, version, epoch, offset, seed,
 * dataset count (version 2, a block-shuffled set: the block's rows in the
 * count's high 32 bits). Set checks all of them (KEEL_ECORRUPT/EINVAL),
 * the block size too: the same position in a set shuffled otherwise would
 * be other examples. */
keel_status keel_data_iter_state(const keel_data_iter *it, void *buf,
                                     size_t size, size_t *len);
keel_status keel_data_iter_set_state(keel_data_iter *it, const void *buf,
                                     size_t len);

/* ---- BLAS and profiling ------------------------------------------------- */

/* OpenBLAS thread count (n >= 1) and kernel name ("Haswell", "SkylakeX"). */
void keel_train_set_threads(int n);
int keel_train_threads(void);
const char *keel_train_blas_corename(void);

/* Process-wide time split of model steps and optimizer updates, collected
 * only while enabled (not thread-safe; for benchmarks). */
typedef struct keel_train_profile {
    int64_t gemm_ns;        /* sgemm calls */
    int64_t im2col_ns;      /* im2col and col2im */
    int64_t elementwise_ns; /* bias, activations, pooling, softmax, adds */
    int64_t optimizer_ns;   /* keel_optimizer_apply* */
    int64_t conv_direct_ns; /* direct (no im2col) convolution kernels */
    int64_t kfac_stats_ns;  /* keel_kfac_observe and the factors' EMA */
    int64_t kfac_invert_ns; /* pi, damping and the inversions */
    int64_t kfac_precond_ns;/* the preconditioned update */
} keel_train_profile;
void keel_train_profile_enable(int on);
void keel_train_get_profile(keel_train_profile *p);
void keel_train_profile_reset(void);

#ifdef __cplusplus
}
#endif
#endif
