/* keel/export.h - models that leave keel: a trained model loaded from a
 * checkpoint alone for inference (no strategy, no cluster), and exports
 * of its weights in formats other tools read: Keras's HDF5 weight layout,
 * safetensors and ONNX (docs/export.md). */
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
 * read. KEEL_EINVAL when neither describes the model. Caller owns *out:
 * keel_inference_free(). */
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

#ifdef __cplusplus
}
#endif
#endif
