/* keel/tensor.h - core types: float32 tensors of up to 4 dimensions, the
 * variable store (named, ordered variables with optimizer slots) and the
 * int64 global step. Variable names are path-like ("conv1/kernel") and are
 * also their names in checkpoints. Not thread-safe: one thread at a time. */
#ifndef KEEL_TENSOR_H
#define KEEL_TENSOR_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KEEL_MAX_DIMS 4
#define KEEL_NAME_MAX 256           /* bytes, including the NUL */
#define KEEL_TENSOR_ALIGN 64        /* data is aligned to this many bytes */
#define KEEL_TENSOR_MAX_BYTES ((size_t)1 << 40)   /* 1 TiB: larger is EINVAL */

/* A dense row-major float32 tensor. A value type: copy the struct to share a
 * view; only the tensor that allocated the data (is_owner) frees it. */
typedef struct keel_tensor {
    int ndim;                        /* 0 (scalar) .. KEEL_MAX_DIMS */
    int64_t shape[KEEL_MAX_DIMS];    /* unused dimensions are 1 */
    size_t count;                    /* number of elements */
    float *data;                     /* KEEL_TENSOR_ALIGN-aligned */
    int is_owner;
} keel_tensor;

/* Element count of a shape, overflow- and limit-checked. A dimension must be
 * >= 1. ndim 0 is a scalar (count 1). */
keel_status keel_shape_count(int ndim, const int64_t *shape, size_t *count);

/* Allocate a zero-filled tensor of the given shape into *t. On failure *t is
 * left empty (data NULL). The caller owns it: keel_tensor_release(). */
keel_status keel_tensor_alloc(keel_tensor *t, int ndim, const int64_t *shape);

/* Free the data if t owns it and reset t to empty. NULL is a no-op. */
void keel_tensor_release(keel_tensor *t);

/* Bytes of data: count * sizeof(float). Cannot fail. */
size_t keel_tensor_bytes(const keel_tensor *t);

/* 1 if both shapes are equal (same ndim and dimensions), else 0. */
int keel_shape_equal(int ndim_a, const int64_t *a, int ndim_b,
                     const int64_t *b);

/* Write "[3,3,1,32]" (or "[]" for a scalar) into buf; always terminated.
 * Returns buf. */
char *keel_shape_format(char *buf, size_t size, int ndim,
                        const int64_t *shape);

/* 64-byte aligned allocation for float buffers (4096-byte aligned from
 * 64 KiB up, for O_DIRECT; from 2 MiB up 2 MiB-aligned, its own mapping,
 * advised as transparent huge pages); free with keel_aligned_free.
 * Returns NULL on failure or when bytes is 0. */
void *keel_aligned_alloc(size_t bytes);
void keel_aligned_free(void *p);

/* ---- variables ---------------------------------------------------------- */

typedef struct keel_vars keel_vars;   /* the store (opaque) */
typedef struct keel_var keel_var;     /* one variable, owned by its store */

enum {
    KEEL_VAR_TRAINABLE = 1u << 0,  /* the optimizer updates it */
    KEEL_VAR_LOCAL = 1u << 1,      /* per-process state: never checkpointed */
    KEEL_VAR_ROWS = 1u << 2        /* a row variable (an embedding table):
                                    * read by rows (keel_var_gather_rows),
                                    * its gradient is rows only; a cluster's
                                    * worker holds none of its values, it
                                    * pulls the rows a step reads
                                    * (docs/cluster.md, "Sparse rows") */
};

/* 1 if name is a valid variable name: 1..KEEL_NAME_MAX-1 bytes of
 * [A-Za-z0-9_.-] segments joined by '/', no empty segment, no "." or ".."
 * segment. Slot names are single segments. */
int keel_name_is_valid(const char *name);

/* Create an empty store. Caller owns *out: keel_vars_free(). */
keel_status keel_vars_new(keel_vars **out);

/* Release a store, its variables and slots. NULL is a no-op. */
void keel_vars_free(keel_vars *vs);

/* Create a zero-filled variable. The name is copied. Fails with KEEL_EINVAL
 * for a duplicate or invalid name or a bad shape (the message names it).
 * *out (may be NULL) is borrowed until the store is freed. */
keel_status keel_vars_create(keel_vars *vs, const char *name, int ndim,
                             const int64_t *shape, unsigned flags,
                             keel_var **out);

/* The variable with this name, or NULL. Constant time. */
keel_var *keel_vars_find(const keel_vars *vs, const char *name);

/* Number of variables; the i-th in creation order (NULL when out of range). */
size_t keel_vars_count(const keel_vars *vs);
keel_var *keel_vars_at(const keel_vars *vs, size_t i);

/* Total bytes of variable data (and, with with_slots, slot data). */
size_t keel_vars_bytes(const keel_vars *vs, int with_slots);

/* The global step: an int64 owned by the store, 0 when created. */
int64_t keel_vars_global_step(const keel_vars *vs);
void keel_vars_set_global_step(keel_vars *vs, int64_t step);

/* Mark every variable initialized (or not). */
void keel_vars_set_all_initialized(keel_vars *vs, int is_initialized);

/* Names of variables that are not initialized, comma-separated into buf
 * (truncated with "..." if needed). Returns how many there are. */
size_t keel_vars_uninitialized(const keel_vars *vs, char *buf, size_t size);

/* Accessors. The tensor is borrowed; its data may be written freely but its
 * shape must not change. */
const char *keel_var_name(const keel_var *v);
keel_tensor *keel_var_tensor(keel_var *v);
unsigned keel_var_flags(const keel_var *v);
int keel_var_is_trainable(const keel_var *v);
int keel_var_is_initialized(const keel_var *v);
void keel_var_set_initialized(keel_var *v, int is_initialized);
/* Position in creation order. */
size_t keel_var_index(const keel_var *v);

/* out (n rows of v's row size, caller's) = v's rows ids[0..n) (ids in
 * [0, shape[0]), may repeat). On a cluster's worker, a row variable's rows
 * come from the ps that holds it (one request for the distinct ids; the
 * values are those the ps holds when it answers); elsewhere from v's
 * tensor. KEEL_EINVAL naming v for an id out of range or a scalar;
 * a ps's error otherwise. */
keel_status keel_var_gather_rows(keel_var *v, size_t n, const int64_t *ids,
                                 float *out);

/* Optimizer slots: zero-filled tensors of the variable's shape, named by a
 * single segment ("m", "v", "momentum"). Adding an existing slot returns the
 * existing one. *out is borrowed until the store is freed. */
keel_status keel_var_add_slot(keel_var *v, const char *slot,
                              keel_tensor **out);
keel_tensor *keel_var_slot(keel_var *v, const char *slot);
size_t keel_var_slot_count(const keel_var *v);
/* The i-th slot in creation order and its name (NULL when out of range). */
keel_tensor *keel_var_slot_at(keel_var *v, size_t i, const char **name);

/* ---- gradients ------------------------------------------------------------
 * One gradient tensor per trainable variable, indexed like the store
 * (keel_var_index); what a train step produces and an optimizer consumes. */

typedef struct keel_grads keel_grads;

/* Zero-filled gradients for every trainable variable of vs, same shapes.
 * vs is borrowed: it must outlive the gradients and not gain variables
 * they need to cover (create the gradients after the model's variables).
 * Caller owns *out: keel_grads_free(). */
keel_status keel_grads_new(const keel_vars *vs, keel_grads **out);
void keel_grads_free(keel_grads *g);
/* The store they were made for. */
const keel_vars *keel_grads_vars(const keel_grads *g);
/* Number of entries (the store's variable count when created). */
size_t keel_grads_count(const keel_grads *g);
/* Gradient of the variable at store index i; NULL if it is not trainable
 * or i is out of range. */
keel_tensor *keel_grads_at(keel_grads *g, size_t i);
/* Gradient of the named variable; NULL if none. */
keel_tensor *keel_grads_find(keel_grads *g, const char *name);
/* Set every gradient to zero and drop every row (the example count
 * stays). A row variable's (KEEL_VAR_ROWS) dense gradient is written
 * only by keel_grads_densify, and zeroed only after it was: never
 * touched, it takes no memory. */
void keel_grads_zero(keel_grads *g);

/* Gradient rows (sparse gradients, TF's IndexedSlices): a step whose
 * gradient of a variable touches a few rows of its first dimension (an
 * embedding table) gives those rows instead of writing the dense tensor.
 * Row r of a variable of shape [R, d1, ...] is its d1*... floats at
 * r * d1*...; the gradient is the sum of the rows given for each id. In
 * one step a variable's gradient is either its dense tensor or its rows:
 * while it has rows, the optimizers apply those rows only (lazily: the
 * other rows and their slots stay as they are, as TF's sparse applies,
 * docs/train.md) and ignore the dense tensor, which stays zero.
 *
 * Add n rows (n x d1*... floats; ids in [0, R)) to the gradient of the
 * variable at store index i; ids may repeat. ids and rows: caller owns
 * (copied). KEEL_EINVAL naming the variable for an id out of range (then
 * nothing is added) or a scalar or untrainable variable. */
keel_status keel_grads_add_rows(keel_grads *g, size_t i, size_t n,
                                const int64_t *ids, const float *rows);
/* The rows of variable i, coalesced: ids strictly increasing, each with
 * the sum of the rows added for it, added in the order they were added
 * (so the bits depend only on the calls' order). Returns their count (0:
 * none, *ids and *rows NULL). *ids and *rows (either may be NULL) are
 * borrowed until the next change of g. */
size_t keel_grads_rows(keel_grads *g, size_t i, const int64_t **ids,
                       const float **rows);
/* 1 if any variable's gradient has rows. */
int keel_grads_has_rows(const keel_grads *g);
/* Add every variable's coalesced rows into its dense gradient and drop
 * them: for an update rule that reads dense gradients only (a custom
 * updater, K-FAC, the all-reduce). The dense update then changes every
 * row, as a dense gradient does (Adam's moments decay on all rows). */
void keel_grads_densify(keel_grads *g);

/* The gradients are the mean over this many examples: a train step
 * declares how many examples its gradient averages (its batch, or its
 * slice of one). A backend that combines replicas (the parameter servers
 * in sync mode, the all-reduce) forms the example-weighted mean of the
 * replicas' gradients, so a step written for one process trains the same
 * on any number of replicas (docs/cluster.md). 1 until set: replicas that
 * declare nothing weigh the same. KEEL_EINVAL outside
 * 1..KEEL_GRADS_MAX_EXAMPLES; the count is kept until set again (a step
 * whose batch size varies sets it every step). */
#define KEEL_GRADS_MAX_EXAMPLES 16777215   /* 2^24 - 1 */
keel_status keel_grads_set_examples(keel_grads *g, int64_t n);
/* The declared count (1 until set; 1 for NULL). */
int64_t keel_grads_examples(const keel_grads *g);

#ifdef __cplusplus
}
#endif
#endif
