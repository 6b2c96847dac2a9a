/* keel/export.h - models that leave keel: a trained model loaded from a
 * checkpoint alone for inference (no strategy, no cluster), and exports
 * of any checkpoint's weights in formats other tools read: safetensors
 * always; Keras's HDF5 weight layout and ONNX from a layer description,
 * keel train's or one a program stores for its own model
 * (keel_model_desc_*; docs/export.md). */
#ifndef KEEL_EXPORT_H
#define KEEL_EXPORT_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>
#include <keel/config.h>
#include <keel/train.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A model and its variables restored from one checkpoint. */
typedef struct keel_inference keel_inference;

/* Restore checkpoint_path's variables into the model it describes: its
 * /meta architecture attribute, or for checkpoints without one the job
 * config cfg (borrowed; may be NULL: the checkpoint's own /meta config),
 * whose data.dir then gives the input shape. Batches of up to max_batch
 * examples (0: 256). Checksums are verified; optimizer slots are not
 * read. KEEL_EINVAL when neither describes a model keel train built (a
 * program's own model exports with keel_export_checkpoint). Caller owns
 * *out: keel_inference_free(). */
keel_status keel_inference_open(const char *checkpoint_path,
                                const keel_config *cfg, int64_t max_batch,
                                keel_inference **out);
void keel_inference_free(keel_inference *inf);
/* The model's config (input shape, classes, ...); borrowed. */
const keel_model_config *keel_inference_model_config(
    const keel_inference *inf);
/* The checkpoint's global step. */
int64_t keel_inference_step(const keel_inference *inf);
/* The model's variables (borrowed), in the model's layer order. */
keel_vars *keel_inference_vars(keel_inference *inf);
/* Class probabilities (n x classes, softmax of the logits) of n examples
 * x (n x H x W x C floats, the model's input shape); any n >= 1, run in
 * batches of max_batch. */
keel_status keel_inference_predict(keel_inference *inf, const float *x,
                                   size_t n, float *probs);

typedef enum keel_export_format {
    KEEL_EXPORT_KERAS_H5 = 0,   /* Keras save_weights HDF5 layout */
    KEEL_EXPORT_SAFETENSORS,    /* safetensors: JSON header + raw LE data */
    KEEL_EXPORT_ONNX            /* ONNX model: graph + initializers */
} keel_export_format;

/* "keras-h5" | "safetensors" | "onnx"; KEEL_EINVAL listing them. */
keel_status keel_export_format_from_name(const char *name,
                                         keel_export_format *out);
/* The usual file extension: ".h5", ".safetensors", ".onnx". */
const char *keel_export_format_extension(keel_export_format f);

/* Write inf's model to out_path in format f, atomically (a temporary file
 * renamed over out_path, fsync'd; on failure nothing is left there). */
keel_status keel_export(keel_inference *inf, keel_export_format f,
                        const char *out_path);

/* Write the checkpoint file checkpoint_path to out_path in format f, as
 * keel_export does. safetensors: every variable of the checkpoint, for
 * any checkpoint. keras-h5 and onnx: the model its /meta architecture
 * describes (keel train's, or a program's keel_model_desc_json text,
 * checked against the variables: KEEL_ECORRUPT naming the layer), or for
 * a checkpoint of keel train without one, the model of its config or of
 * cfg (borrowed; may be NULL). KEEL_EINVAL, saying which formats work,
 * when the checkpoint has no description. */
keel_status keel_export_checkpoint(const char *checkpoint_path,
                                   const keel_config *cfg,
                                   keel_export_format f,
                                   const char *out_path);

/* ---- layer descriptions of a program's own model ------------------------ */

/* A program's model as keel train describes its own (docs/export.md): a
 * Keras Sequential of Dense, Conv2D, MaxPooling2D and Flatten layers over
 * the program's variables. Store its JSON in the checkpoints
 * (keel_ckpt_meta.architecture, e.g. from a session's meta_fn) and keel
 * export writes keras-h5 and onnx for them. */
typedef struct keel_model_desc keel_model_desc;

/* A description of a model over vs (borrowed until keel_model_desc_free)
 * taking inputs of input_shape (copied): ndim 1, [features], or 3,
 * [height, width, channels] (NHWC). Caller owns *out:
 * keel_model_desc_free(). */
keel_status keel_model_desc_new(keel_vars *vs, int ndim,
                                const int64_t *input_shape,
                                keel_model_desc **out);
void keel_model_desc_free(keel_model_desc *d);

/* Append a layer. name: its Keras name (copied; NULL: tf.keras's default,
 * "dense", "dense_1", ...). kernel and bias: names of variables of vs
 * (copied), each used by one layer, whose shapes give the layer's size:
 * Dense kernel [in, units] and bias [units] after a vector (a Flatten
 * first after images); Conv2D kernel [kh, kw, in, filters] and bias
 * [filters], strides >= 1, no padding. activation: "linear" (NULL),
 * "relu", "tanh", "sigmoid" or "softmax" (of a vector). MaxPooling2D:
 * window pool_h x pool_w, strides (0, 0: the window's). Flatten: (h, w, c)
 * order. Each call checks the description so far against vs: KEEL_EINVAL
 * naming the layer and what does not fit, and the layer is not added. */
keel_status keel_model_desc_add_dense(keel_model_desc *d, const char *name,
                                      const char *kernel, const char *bias,
                                      const char *activation);
keel_status keel_model_desc_add_conv2d(keel_model_desc *d, const char *name,
                                       const char *kernel, const char *bias,
                                       int stride_h, int stride_w,
                                       const char *activation);
keel_status keel_model_desc_add_max_pooling2d(keel_model_desc *d,
                                              const char *name, int pool_h,
                                              int pool_w, int stride_h,
                                              int stride_w);
keel_status keel_model_desc_add_flatten(keel_model_desc *d,
                                        const char *name);

/* The description as JSON into *json (borrowed until the next call on d
 * or keel_model_desc_free): what keel_ckpt_meta.architecture takes.
 * KEEL_EINVAL when it has no layers or does not end in a vector. */
keel_status keel_model_desc_json(keel_model_desc *d, const char **json);

#ifdef __cplusplus
}
#endif
#endif
