/* train_int.h - private interface of train/: the layer kernels (forward and
 * backward on raw NHWC float buffers) shared by the models and the tests
 * and the model's profiling counters, on the numeric layer's kernels, pool and
 * reduction tree (numeric/numeric_int.h, included). */
#ifndef KEEL_TRAIN_INT_H
#define KEEL_TRAIN_INT_H

#include <stddef.h>
#include <stdint.h>
#include <keel/train.h>
#include <keel/kfac.h>
#include "util.h"
#include "../numeric/numeric_int.h"

/* ---- profiling: the model's counters (the numeric layer's are in numeric_int.h;
 * keel_train_get_profile adds them) ---- */
extern keel_train_profile keel__prof;
#define KEEL__PROF_END(field) \
    do { if (keel__prof_on) keel__prof.field += keel__prof_now() - prof_t0_; } \
    while (0)

/* ---- dense: y[n,out] = x[n,in] W[in,out] + b ---- */
void keel__dense_forward(const float *x, size_t n, size_t in, size_t out,
                         const float *w, const float *b, float *y);
/* dw = x^T dy, db = sum dy (both OVERWRITTEN, or with accumulate ADDED:
 * sgemm beta 1, the column sums formed before they are added); dx = dy W^T
 * (if dx, overwritten). */
void keel__dense_backward(const float *x, const float *dy, size_t n,
                          size_t in, size_t out, const float *w, float *dw,
                          float *db, float *dx, int accumulate);

/* ---- activations (in place on y; backward scales dy in place) ---- */
void keel__act_forward(keel_activation a, float *y, size_t count);
void keel__act_backward(keel_activation a, const float *y, float *dy,
                        size_t count);
/* Fused y[r,c] = act(y[r,c] + b[c]). */
void keel__bias_act_forward(keel_activation a, float *y, size_t rows,
                            size_t cols, const float *b);
/* The same on a block of columns: rows ld floats apart. */
void keel__bias_act_forward_ld(keel_activation a, float *y, size_t rows,
                               size_t cols, size_t ld, const float *b);
void keel__act_backward_ld(keel_activation a, const float *y, float *dy,
                           size_t rows, size_t cols, size_t ld);
/* Dense layers by column block, for the dense-only models' fixed halves
 * (train/model_run.c): outputs [c0, c1) of y = x w; of dw = x^T dy (beta 1 with
 * accumulate) and db (column sums, added when accumulate); inputs [k0, k1)
 * of dx = dy w^T. Each column's bits equal the full-width call's only when
 * the call shapes match, so callers fix the blocks. */
void keel__dense_forward_cols(const float *x, size_t n, size_t in,
                              size_t out, const float *w, float *y,
                              size_t c0, size_t c1);
void keel__dense_backward_cols(const float *x, const float *dy, size_t n,
                               size_t in, size_t out, float *dw, float *db,
                               size_t c0, size_t c1, int accumulate);
void keel__dense_dx_cols(const float *dy, size_t n, size_t in, size_t out,
                         const float *w, float *dx, size_t k0, size_t k1);

/* ---- conv2d, NHWC, kernel [kh,kw,cin,cout] ---- */
typedef struct keel__conv_geom {
    size_t h, w, cin;          /* input */
    size_t kh, kw, cout;
    size_t sh, sw;             /* strides */
    size_t pad_top, pad_left;  /* 0 for valid */
    size_t oh, ow;             /* output */
} keel__conv_geom;
/* Fill oh/ow/pads from h,w,kh,kw,sh,sw and same (TF/Keras rules). Fails if
 * the output would be empty. */
keel_status keel__conv_geom_init(keel__conv_geom *g, int same);
/* Floats of the im2col workspace for n examples: im2col and its sgemm run
 * over chunks of examples of about keel__conv_chunk_bytes of columns (at
 * least one example), so the workspace is one chunk's. */
extern size_t keel__conv_chunk_bytes;
size_t keel__conv_col_size(const keel__conv_geom *g, size_t n);
void keel__conv_forward(const keel__conv_geom *g, const float *x, size_t n,
                        const float *w, const float *b, float *col,
                        float *y);
/* Single-input-channel convolutions with every window inside the input run
 * as direct kernels (no im2col, no sgemm). keel__conv_direct selects: AUTO
 * (default: the best path this CPU has), OFF (im2col + sgemm), or forces
 * the portable, AVX2 or AVX-512 3x3 kernels (all give the same bits; for
 * tests, which also check keel__conv_direct_path_supported first). */
enum { KEEL__DC_OFF, KEEL__DC_AUTO, KEEL__DC_GENERIC, KEEL__DC_AVX2,
       KEEL__DC_AVX512 };
extern int keel__conv_direct;
int keel__conv_direct_path_supported(int path);
/* col_is_valid: col still holds the forward im2col of x (used only when n
 * fits one chunk; otherwise every chunk is recomputed). dw, db
 * OVERWRITTEN; dx (if non-NULL) overwritten. */
void keel__conv_backward(const keel__conv_geom *g, const float *x, size_t n,
                         const float *dy, const float *w, float *col,
                         int col_is_valid, float *dw, float *db, float *dx);

/* ---- K-FAC second moments ----
 * c (ld = d + homog, row-major) gets the upper triangle (i <= j) of
 * x^T x ADDED (accumulate) or written, x being rows x d with row stride
 * ldx; with homog, x is taken with a column of ones appended (the bias's
 * homogeneous coordinate). The strictly lower triangle is not touched,
 * except with homog its last row (row d), which is scratch. */
void keel__cov_add(const float *x, size_t rows, size_t d, size_t ldx,
                   int homog, int accumulate, float *c);
/* The same for a convolution's im2col patches of x (n examples, one row
 * per output location, kh*kw*cin columns, ones appended with homog); col
 * is the keel__conv_col_size(g, n) workspace. */
void keel__conv_patch_cov(const keel__conv_geom *g, const float *x, size_t n,
                          float *col, int homog, int accumulate, float *c);
/* dx (overwritten) = the input gradient of dy alone (no dw, db). */
void keel__conv_backward_dx(const keel__conv_geom *g, size_t n,
                            const float *dy, const float *w, float *col,
                            float *dx);

/* ---- max-pool, NHWC, window k x k, stride s, valid ---- */
typedef struct keel__pool_geom {
    size_t h, w, c, k, s, oh, ow;
} keel__pool_geom;
keel_status keel__pool_geom_init(keel__pool_geom *g);
/* arg (n*oh*ow*c int32) receives the winning input index per output. */
void keel__pool_forward(const keel__pool_geom *g, const float *x, size_t n,
                        float *y, int32_t *arg);
/* dx overwritten (zero + scatter). */
void keel__pool_backward(const keel__pool_geom *g, const float *dy, size_t n,
                         const int32_t *arg, float *dx);

/* ---- softmax cross-entropy on logits[n,k] ----
 * Loss sum (double) and correct count; if dlogits, writes
 * (softmax - onehot) * scale. Labels must be in range (checked by caller). */
void keel__softmax_xent(const float *logits, const int32_t *y, size_t n,
                        size_t k, float scale, float *dlogits,
                        double *loss_sum, int64_t *correct);

/* db[c] = sum over rows of dy[r,c] (overwritten). */
void keel__col_sums(const float *dy, size_t rows, size_t cols, float *db);

/* 1 (default): piece 0's dense gradients go straight into the caller's
 * grads (sgemm beta 1); 0: through a slot, then added (tests). */
extern int keel__grads_direct;

/* sgemm wrapper (row-major, with profiling). */
void keel__sgemm(int trans_a, int trans_b, size_t m, size_t n, size_t k,
                 float alpha, const float *a, size_t lda, const float *b,
                 size_t ldb, float beta, float *c, size_t ldc);

/* Another model of m's configuration (threads model threads) over the
 * variables m created in vs (borrowed; both must outlive it), with its
 * own workspaces: a replica that can step beside m on another thread.
 * Caller owns *out: keel_model_free(). */
keel_status keel__model_new_replica(const keel_model *m, keel_vars *vs,
                                    int threads, keel_model **out);
/* Examples per piece (the last piece of a batch may be shorter); a
 * batch of up to KEEL__MODEL_TREE_PIECES pieces adds their gradients
 * along one reduction tree, so runs of them that are nodes of that tree,
 * computed apart and added along it, give the same bits. */
#define KEEL__MODEL_TREE_PIECES 16
size_t keel__model_piece(const keel_model *m);
/* The model's pool (NULL on one thread), for work beside its steps. */
keel__pool *keel__model_pool(keel_model *m);
/* keel_model_step, then keel__optimizer_apply_pooled(opt, vs, grads,
 * global_step, zero, the model's pool) in the same pool run where the
 * step allows it (one hand-off less): the same bits as the two calls.
 * Nothing changes when a check of either fails. */
keel_status keel__model_step_apply(keel_model *m, keel_vars *vs,
                                   const keel_batch *batch,
                                   int64_t global_batch_size,
                                   keel_grads *grads, keel_step_stats *stats,
                                   keel_optimizer *opt, int64_t global_step,
                                   int zero);

/* model_desc.c: the model's architecture as a new JSON object (caller puts it;
 * NULL if out of memory): model, input_shape, classes, hidden, activation,
 * init, output and the Keras-style layer list; and back into a model
 * config (KEEL_ECORRUPT naming the bad key). docs/checkpoint-format.md. */
struct json_object;
struct json_object *keel__model_arch(const keel_model *m);
keel_status keel__model_config_from_arch(struct json_object *o,
                                         keel_model_config *mc);

/* ---- model_run.c: what K-FAC sees of a model ---- */
typedef struct keel__kfac_layer {
    int is_conv;
    size_t a_dim;        /* inputs (a conv's kh*kw*cin), + 1 with a bias */
    size_t g_dim;        /* outputs (a conv's cout) */
    size_t locations;    /* output positions: oh*ow, or 1 for dense */
    keel_var *w, *b;     /* borrowed from the store; b NULL: no bias */
    keel__conv_geom cg;  /* a convolution's geometry */
} keel__kfac_layer;

/* ---- kfac_layers.c: the layer collection (keel/kfac.h) ---- */
struct keel_kfac_layers {
    keel__kfac_layer *l;
    int n, cap;
};
/* Register info (w, b, the sizes and, for a convolution, cg filled): the
 * one registration every layer goes through, the public add functions'
 * and a keel_model's. *index (may be NULL): its number. */
keel_status keel__kfac_layers_add(keel_kfac_layers *lc,
                                  const keel__kfac_layer *info, int *index);
/* The optimizer of lc's layers; m (NULL: a user's layers) gives the
 * statistics pass of keel_kfac_observe and model_grads. kfac.c. */
keel_status keel__kfac_new(const keel_kfac_config *cfg,
                           const keel_kfac_layers *lc, keel_model *m,
                           keel_vars *vs, keel_kfac **out);
/* The layers with parameters, input to output: fills up to max of out
 * and returns how many there are. */
int keel__model_kfac_layers(const keel_model *m, keel__kfac_layer *out,
                            int max);
/* K-FAC statistics of batch on the current variables: a forward pass
 * (none with after_step when the last call of m was keel_model_step of
 * batch in one piece, keel__model_step_io, and the variables are as that
 * step saw them: its activations are reused),
 * targets = the labels (rng NULL) or one draw per example from the model's
 * softmax (rng), written to targets[0..n), and a backward pass of
 * sum_b -log p(target_b | x_b) alone (no parameter gradients). For the k-th
 * layer with parameters, A[k] (a_dim^2) gets the upper triangle of
 * sum a_b a_b^T ADDED (accumulate) or written (inputs with a 1 appended; a conv's im2col patches,
 * one per output location) and G[k] (g_dim^2) that of sum g_b g_b^T
 * (g_b the gradient at the layer's pre-activation outputs, per location).
 * Runs on the calling thread, in the model's fixed pieces. */
keel_status keel__model_kfac_stats(keel_model *m, const keel_batch *b,
                                   keel__rng *rng, int32_t *targets,
                                   int accumulate, int after_step,
                                   float *const *A, float *const *G);
/* What the last call of m computed, when it was keel_model_step of batch
 * (the same x pointer and n) as one piece (a dense-only model and n at
 * most its piece): 1, the gradients it wrote in *grads, and for the f-th
 * layer with parameters (a dense one) its input rows in *in (n x a_dim - 1,
 * the caller's batch for the first layer) and the gradient of the step's
 * loss at its pre-activation outputs in *dy (n x g_dim): the layer's
 * gradient is [in, 1]^T dy. Borrowed, valid until the next call of m.
 * 0 otherwise (nothing set). */
/* K-FAC's targets of n examples: the labels (rng NULL) or one draw per
 * example from the softmax of its logits (n x k). */
void keel__kfac_draw_targets(const float *logits, size_t n, size_t k,
                             const int32_t *labels, keel__rng *rng,
                             int32_t *t);
int keel__model_step_io(const keel_model *m, const keel_batch *batch, int f,
                        const keel_grads **grads, const float **in,
                        const float **dy);

/* kfac.c, for tests: pi of the i-th layer's last inversion (0 if none),
 * its last preconditioned matrix (copied to out, a_dim x g_dim: F^-1 of
 * the gradient, or of the velocity with adam momentum; before clipping and
 * the learning rate; i must be a layer) and the targets of the last
 * observed batch (borrowed). */
double keel__kfac_pi(const keel_kfac *k, int i);
/* kfac.c, for tests: the layers (bit i) whose update of the last
 * keel_kfac_apply was formed from the observed batch (model_grads). */
uint64_t keel__kfac_factored(const keel_kfac *k);
void keel__kfac_precond(const keel_kfac *k, int i, float *out);
const int32_t *keel__kfac_targets(const keel_kfac *k);

#endif
