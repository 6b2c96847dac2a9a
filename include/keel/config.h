/* keel/config.h - the job configuration: an INI file (sections [model]
 * [data] [optimizer] [train] [checkpoint] [hooks] [cluster] [security]),
 * `-s section.key=value` overrides and $OUTPUT_DIR, validated against one
 * schema that also documents every key and its default (docs/config.md is
 * generated from it). Values are looked up as "section.key". */
#ifndef KEEL_CONFIG_H
#define KEEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <keel/status.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct keel_config keel_config;

/* A config holding every key's default. Caller owns *out. */
keel_status keel_config_new(keel_config **out);
void keel_config_free(keel_config *cfg);

/* Read an INI file over the current values. Unknown sections or keys, bad
 * values and duplicate keys are KEEL_EINVAL with "file:line: ..." and the
 * valid choices. The file's text is kept for checkpoints. */
keel_status keel_config_load(keel_config *cfg, const char *path);

/* The same for INI text (copied) held in memory, e.g. the config saved in
 * a checkpoint; name stands for the file in messages. */
keel_status keel_config_load_text(keel_config *cfg, const char *text,
                                  const char *name);

/* Apply "section.key=value" (from -s); origin names it in errors
 * ("command line"). */
keel_status keel_config_override(keel_config *cfg, const char *assignment,
                                 const char *origin);

/* Apply the environment: $OUTPUT_DIR, when set and non-empty, becomes
 * checkpoint.dir unless -s set that key. Call after load and overrides. */
keel_status keel_config_apply_env(keel_config *cfg);

/* TF_CONFIG's "model_dir" (NULL or "": nothing to do) becomes
 * checkpoint.dir. If checkpoint.dir was set (config file, -s or
 * $OUTPUT_DIR) to a different directory, KEEL_EINVAL naming both paths and
 * where the other came from; the same directory (after resolving symlinks
 * and trailing slashes) is fine. Call after keel_config_apply_env. */
keel_status keel_config_apply_model_dir(keel_config *cfg,
                                        const char *model_dir);

/* Cross-key checks (conflicting options). Call once everything is set. */
keel_status keel_config_validate(const keel_config *cfg);

/* Typed getters; key is "section.key". Asking for an unknown key or the
 * wrong type is a bug in the caller and returns the zero value. */
int64_t keel_config_int(const keel_config *cfg, const char *key);
double keel_config_double(const keel_config *cfg, const char *key);
int keel_config_bool(const keel_config *cfg, const char *key);
/* Borrowed until the config changes or is freed; "" when empty. */
const char *keel_config_str(const keel_config *cfg, const char *key);
/* 1 if the key was set by the file, an override or the environment. */
int keel_config_is_set(const keel_config *cfg, const char *key);
/* Where the value came from: "default", "file.ini:12", "command line",
 * "$OUTPUT_DIR". */
const char *keel_config_origin(const keel_config *cfg, const char *key);
/* 1 when the cluster is to run asynchronously: algorithm.name, when set,
 * names a rule that keel_algorithm_is_sync() calls asynchronous (async,
 * hogwild, downpour, ...), else cluster.mode async. *is_set (may be NULL):
 * 1 when either key was set (the config overrides the cluster spec's
 * mode). */
int keel_config_is_async(const keel_config *cfg, int *is_set);

/* A comma-separated list of integers ("256,256") into out (at most max
 * entries); returns the count, or -1 if malformed (validation rejects that
 * earlier, so callers may treat -1 as a bug). */
int keel_config_int_list(const keel_config *cfg, const char *key,
                         int64_t *out, int max);
int keel_config_double_list(const keel_config *cfg, const char *key,
                            double *out, int max);

/* The resolved settings as INI text (every key, with origins as comments
 * when with_origin). Caller frees *text with free(). */
keel_status keel_config_dump(const keel_config *cfg, int with_origin,
                             char **text);

/* The loaded file's text, or "" (borrowed). */
const char *keel_config_source_text(const keel_config *cfg);

/* Write the schema (every section, key, type, default, description) as a
 * Markdown document. */
keel_status keel_config_write_reference(FILE *out);

#ifdef __cplusplus
}
#endif
#endif
