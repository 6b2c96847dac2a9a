/* config_int.h - private to app/'s configuration files: the key table
 * (config_keys.c), a configuration's values and the look-ups in the table
 * (config.c), through which the INI reader and the overrides
 * (config_load.c) set values. The cross-key rules (config_validate.c) read
 * values through the public getters only. */
#ifndef KEEL_CONFIG_INT_H
#define KEEL_CONFIG_INT_H

#include <stddef.h>
#include <stdint.h>

#include <keel/config.h>

/* Lists (T_*_LIST, T_ADDR_LIST) are comma-separated and may continue on
 * indented lines. */
typedef enum { T_INT, T_DOUBLE, T_BOOL, T_STRING, T_ENUM, T_INT_LIST,
               T_DOUBLE_LIST, T_ADDR_LIST } keel__config_type;

/* One key of the table. */
typedef struct keel__config_key {
    const char *section;
    const char *name;
    keel__config_type type;
    const char *def;        /* default as text */
    double lo, hi;          /* numeric bounds (inclusive) */
    const char *choices;    /* T_ENUM: "a|b|c" */
    const char *doc;
} keel__config_key;

#define VALUE_MAX 65536     /* bytes of one value, continuation lines joined */
#define I64MAX 9.2e18       /* a bound meaning "up to INT64_MAX" */

/* The schema (config_keys.c): every key, in the order of `keel config
 * check`, `keel config dump` and docs/config.md. */
extern const keel__config_key keel__config_keys[];
extern const size_t keel__config_n_keys;

/* A key's value in one configuration. */
typedef struct keel__config_value {
    char *text;
    char *origin;        /* where the value came from; NULL: "default" */
    int is_set;          /* by file, override or env */
    int is_cli;          /* by an override */
    int seen_in_file;    /* duplicate detection within one load */
    int64_t i;
    double d;
} keel__config_value;

struct keel_config {
    char *source;                /* the loaded file's text */
    keel__config_value v[];      /* v[k]: keel__config_keys[k]'s value */
};

/* The index of key section.name (find_key) or "section.name"
 * (find_dotted) in keel__config_keys; -1: no such key. */
int keel__config_find_key(const char *section, const char *name);
int keel__config_find_dotted(const char *key);
/* 1 if the table has a key in section. */
int keel__config_section_known(const char *section);
/* What an error about an unknown name offers instead, into buf: section
 * NULL, every section ("[model] [data] ..."); else the keys of section
 * ("type, init, ..."). */
void keel__config_list_names(const char *section, char *buf, size_t size);
/* s without leading blanks; trailing blanks and line ends cut in place. */
char *keel__config_trim(char *s);
/* Validate raw for key k and store it in cfg->v[k] (neither is_set nor
 * the origin changes). 0: why gets the reason. */
int keel__config_set_value(keel_config *cfg, int k, const char *raw,
                           char *why, size_t why_size);
/* Record where v's value came from. 0: out of memory (v unchanged). */
int keel__config_set_origin(keel__config_value *v, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* v's origin: where it was set, or "default". */
const char *keel__config_origin_of(const keel__config_value *v);

#endif
