/* keel/kfac.h - K-FAC for a program's own model (docs/kfac.md): a layer
 * collection, in the manner of tensorflow/kfac's LayerCollection, where
 * the program registers its dense and conv2d layers by their variables,
 * and the optimizer (keel_kfac, keel/train.h) made from it. Each step the
 * program gives every registered layer's input activations and the
 * gradients at its pre-activation outputs (keel_kfac_observe_layer); the
 * optimizer keeps the Kronecker factors as zero-debiased moving averages,
 * damps and inverts them every invert_every steps and preconditions the
 * gradients of the registered variables (keel_kfac_apply). Trainable
 * variables of the store that no layer registers take momentum SGD with
 * the same learning rate and momentum. keel_kfac_new registers a
 * keel_model's layers through this same collection. */
#ifndef KEEL_KFAC_H
#define KEEL_KFAC_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/tensor.h>
#include <keel/train.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_kfac_layers keel_kfac_layers;

/* A convolution's geometry besides what its kernel's shape
 * [kh, kw, cin, cout] says. Inputs are NHWC, height x width x cin per
 * example; outputs oh x ow x cout. */
typedef struct keel_kfac_conv2d_config {
    uint32_t struct_size;        /* set by keel_kfac_conv2d_config_init() */
    int64_t height, width;       /* of the input; required (default 0) */
    int64_t stride_h, stride_w;  /* default 1 */
    int same_padding;            /* 1: TF's "SAME"; 0: "VALID" (default) */
} keel_kfac_conv2d_config;

/* Defaults above. Cannot fail. */
void keel_kfac_conv2d_config_init(keel_kfac_conv2d_config *cfg);

/* An empty collection. Caller owns *out: keel_kfac_layers_free(). */
keel_status keel_kfac_layers_new(keel_kfac_layers **out);
void keel_kfac_layers_free(keel_kfac_layers *lc);
/* Layers registered so far. */
int keel_kfac_layers_count(const keel_kfac_layers *lc);
/* A fully connected layer s = x kernel + bias: kernel a trainable
 * [d_in, d_out] variable, bias a trainable [d_out] one or NULL (no bias).
 * Both borrowed: they outlive the collection and every optimizer made
 * from it. The layer's K-FAC state is named after the kernel's scope (its
 * name up to the last '/'), so two layers need kernels of different
 * scopes. *index (may be NULL): the layer's number, in registration order,
 * for keel_kfac_observe_layer. */
keel_status keel_kfac_layers_add_dense(keel_kfac_layers *lc,
                                       keel_var *kernel, keel_var *bias,
                                       int *index);
/* A 2-D convolution s = conv(x, kernel) + bias: kernel a trainable
 * [kh, kw, cin, cout] variable, bias [cout] or NULL; cfg caller owns.
 * Ownership and *index as for keel_kfac_layers_add_dense. */
keel_status keel_kfac_layers_add_conv2d(keel_kfac_layers *lc,
                                        const keel_kfac_conv2d_config *cfg,
                                        keel_var *kernel, keel_var *bias,
                                        int *index);

/* The K-FAC optimizer of lc's layers on vs: validates cfg (model_grads
 * must be 0: it describes a keel_model's step), creates the state
 * variables and slots in vs as keel_kfac_new does (keel/train.h) and a
 * "velocity" slot on every other trainable variable. lc is read during the
 * call only; vs and the registered variables are borrowed for the
 * optimizer's life. Caller owns *out: keel_kfac_free(). */
keel_status keel_kfac_new_from_layers(const keel_kfac_config *cfg,
                                      const keel_kfac_layers *lc,
                                      keel_vars *vs, keel_kfac **out);

/* Layer `layer`'s statistics of n examples at global_step, ADDED to this
 * step's pending sums (call it for every registered layer before
 * keel_kfac_apply of the step; a layer may be given several pieces of the
 * step's batch). inputs: the layer's input activations, n x d_in (dense) or
 * n x height x width x cin (conv2d, NHWC); output_grads: the gradients of
 * each example's own loss at the layer's pre-activation outputs, n x d_out
 * or n x oh x ow x cout: the gradient of the SUM over the batch of the
 * losses, not of their mean. For the true Fisher the losses are those of
 * targets drawn from the model's predictive distribution
 * (keel_kfac_sample_targets), for the empirical Fisher of the labels. Both
 * caller owns. Does nothing (KEEL_OK) at a step that updates no factors.
 * Only for an optimizer made by keel_kfac_new_from_layers. */
keel_status keel_kfac_observe_layer(keel_kfac *k, int layer,
                                    const float *inputs,
                                    const float *output_grads, size_t n,
                                    int64_t global_step);

/* The targets of the step's statistics, n of them into targets (caller
 * owns): with estimation = gradients one draw per example from the
 * softmax of logits (n x classes), from the stream of cfg.seed and
 * global_step (a resumed run draws the same); with empirical, labels
 * copied. logits and labels caller owns; labels may be NULL with
 * gradients. */
keel_status keel_kfac_sample_targets(keel_kfac *k, const float *logits,
                                     size_t n, size_t classes,
                                     const int32_t *labels,
                                     int64_t global_step, int32_t *targets);

#ifdef __cplusplus
}
#endif

#endif /* KEEL_KFAC_H */
