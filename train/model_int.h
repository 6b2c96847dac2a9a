/* model_int.h - private to the model's files (model.c, model_run.c,
 * model_desc.c): the model's layers, per-thread buffers and gradient
 * slots, how batches are cut into pieces, and what one of those files
 * defines for the others. model_desc.c uses model.c's names and config
 * check; model.c and model_run.c use no other model file. */
#ifndef KEEL_TRAIN_MODEL_INT_H
#define KEEL_TRAIN_MODEL_INT_H

#include <stddef.h>
#include <stdint.h>
#include <keel/train.h>
#include "train_int.h"

typedef enum lkind { L_DENSE, L_CONV, L_POOL } lkind;

typedef struct layer {
    lkind kind;
    keel_activation act;
    size_t in_size, out_size;     /* floats per example */
    size_t din, dout;             /* dense */
    keel__conv_geom cg;
    keel__pool_geom pg;
    keel_var *w, *b;
    int fused;                    /* conv followed by max-pool: bias and
                                   * activation are applied after the pool
                                   * (max commutes with both), 4x less work */
} layer;

/* One thread's buffers for one layer, sized for one piece. */
typedef struct lbuf {
    float *y, *dy;                /* outputs and their gradients */
    int32_t *arg;                 /* pool argmax */
    float *col;                   /* conv im2col workspace */
} lbuf;

/* One layer's parameter gradients (a slot's, or a thread's scratch). */
typedef struct lgrad {
    float *dw, *db;
} lgrad;

#define MAX_THREADS KEEL__POOL_MAX
/* Every batch is cut into pieces whose size depends on the model and its
 * configured max_batch only, never on the thread count: CNN_PIECE examples
 * for the CNN; for dense-only models as few pieces as keep each at most
 * DIRECT_MAX_BATCH rows, of equal size (ceil(max_batch / pieces)): one
 * sgemm per layer over up to 256 rows packs the weights once, where 32-row
 * pieces packed them 8 times at a batch of 256 (1.3x slower on one
 * thread, and the slot reduction made model threads slower still). The
 * batch's gradient is, by definition, the pieces' gradients (each rounded
 * on its own) added elementwise along the reduction tree over the pieces
 * (numeric_int.h, keel__tree_sum), piece 0 added onto grads first. Threads
 * compute up to MAX_SLOTS pieces at a time into slots, which are then
 * added along that tree; past MAX_SLOTS pieces the next round's tree
 * starts from the sum so far in piece 0's place. So the bits never depend on
 * which thread ran a piece, and a batch cut into runs of pieces that are
 * nodes of that tree, whose sums are added along it, gives the same bits. */
#define CNN_PIECE 16
#define MAX_SLOTS KEEL__MODEL_TREE_PIECES
/* Piece 0's dense gradients go straight into the caller's grads (sgemm
 * beta 1: one pass over the parameters less, and no slot); every other
 * piece's go through a slot and are added in piece order. That holds on
 * every thread count, so it is part of the definition of the batch's
 * gradient, not an optimization that must round like one. (Onto zero
 * grads, as in every training step, beta 1 gives the bits of a separate
 * gradient added afterwards on every kernel; onto non-zero grads only while
 * K stays inside one OpenBLAS K block, which Prescott's kernel breaks
 * above 128 rows.) Pieces are at most DIRECT_MAX_BATCH rows. */
#define DIRECT_MAX_BATCH 256

struct keel_model {
    keel_model_config cfg;
    layer *l;
    int nl;
    size_t nvars;
    double flops;
    int nthreads;                 /* cfg.threads */
    keel__pool *pool;
    size_t piece;                 /* examples per piece */
    size_t max_pieces;            /* ceil(max_batch / piece) */
    int nslots;                   /* min(max_pieces, MAX_SLOTS) */
    int is_dense_only;            /* softmax or MLP */
    int reuse_vars;               /* a replica or keel_model_new_shared:
                                   * another model's variables */
    lbuf *buf[MAX_THREADS];       /* [thread][layer] activations */
    lgrad *slot[MAX_SLOTS];       /* [slot][layer] */
    double *row_loss;             /* [max_pieces * piece]: each example's
                                   * loss, summed piece by piece in row
                                   * order, whichever thread computed it */
    unsigned char *row_ok;        /* [max_pieces * piece]: 1 if correct */
    /* the last call, when it was a step of one piece in buf[0]
     * (keel__model_step_io): its batch and gradients */
    int last_io;
    const float *last_x;
    size_t last_n;
    const keel_grads *last_grads;
};

/* The names of keel_model_kind, keel_activation and keel_init_kind values,
 * by value (model.c): the config's names and the architecture record's. */
extern const char *const keel__model_kind_names[3];
extern const char *const keel__activation_names[3];
extern const char *const keel__init_kind_names[2];

/* KEEL_OK when c's members are within their ranges, else KEEL_EINVAL
 * naming the first one outside. */
keel_status keel__model_check_config(const keel_model_config *c);

#endif
