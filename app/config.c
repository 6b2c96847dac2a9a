/* config.c - a job configuration's values (keel/config.h): creating one
 * with every key's default, looking keys up in the table (config_keys.c),
 * checking a value against its key's type and limits, the typed getters,
 * the dump of the resolved settings and the generated reference. The INI
 * reader and the overrides are in config_load.c, the cross-key rules in
 * config_validate.c. */
#include <config.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <keel/config.h>
#include <keel/distributed.h>
#include "util.h"
#include "config_int.h"

int
keel__config_set_origin(keel__config_value *v, const char *fmt, ...)
{
    va_list ap;
    char *o;
    int n;
    va_start(ap, fmt);
    n = vasprintf(&o, fmt, ap);
    va_end(ap);
    if (n < 0)
        return 0;
    free(v->origin);
    v->origin = o;
    return 1;
}

const char *
keel__config_origin_of(const keel__config_value *v)
{
    return v->origin != NULL ? v->origin : "default";
}

int
keel__config_find_key(const char *section, const char *name)
{
    for (size_t k = 0; k < keel__config_n_keys; k++)
        if (strcmp(keel__config_keys[k].section, section) == 0 &&
            strcmp(keel__config_keys[k].name, name) == 0)
            return (int)k;
    return -1;
}

int
keel__config_find_dotted(const char *key)
{
    const char *dot = key != NULL ? strchr(key, '.') : NULL;
    char section[64];
    size_t n;
    if (dot == NULL)
        return -1;
    n = (size_t)(dot - key);
    if (n >= sizeof section)
        return -1;
    memcpy(section, key, n);
    section[n] = '\0';
    return keel__config_find_key(section, dot + 1);
}

int
keel__config_section_known(const char *section)
{
    for (size_t k = 0; k < keel__config_n_keys; k++)
        if (strcmp(keel__config_keys[k].section, section) == 0)
            return 1;
    return 0;
}

void
keel__config_list_names(const char *section, char *buf, size_t size)
{
    size_t used = 0;
    buf[0] = '\0';
    for (size_t k = 0; k < keel__config_n_keys && used < size; k++) {
        const keel__config_key *d = &keel__config_keys[k];
        int opens_section =
            k == 0 ||
            strcmp(d->section, keel__config_keys[k - 1].section) != 0;
        if (section == NULL && opens_section)
            used += (size_t)snprintf(buf + used, size - used, "%s[%s]",
                                     used > 0 ? " " : "", d->section);
        else if (section != NULL && strcmp(d->section, section) == 0)
            used += (size_t)snprintf(buf + used, size - used, "%s%s",
                                     used > 0 ? ", " : "", d->name);
    }
}

char *
keel__config_trim(char *s)
{
    char *e;
    while (*s == ' ' || *s == '\t')
        s++;
    e = s + strlen(s);
    while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r' ||
                     e[-1] == '\n'))
        *--e = '\0';
    return s;
}

static int
parse_bool(const char *s, int *out)
{
    static const char *yes[] = { "true", "yes", "on", "1" };
    static const char *no[] = { "false", "no", "off", "0" };
    for (size_t i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            return 1;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            return 1;
        }
    }
    return 0;
}

static int
enum_has(const char *choices, const char *s)
{
    size_t n = strlen(s);
    const char *p = choices;
    while (*p != '\0') {
        const char *bar = strchr(p, '|');
        size_t len = bar != NULL ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, s, n) == 0)
            return 1;
        if (bar == NULL)
            break;
        p = bar + 1;
    }
    return 0;
}

/* Parse a comma-separated numeric list; returns count or -1 (message in
 * why). */
static int
parse_list(const char *s, int is_int, double lo, double hi, int64_t *iout,
           double *dout, int max, char *why, size_t why_size)
{
    size_t len = strlen(s);
    char *buf, *save = NULL, *tok;
    int n = 0;
    if (len > VALUE_MAX) {
        snprintf(why, why_size, "list of %zu bytes (limit %d)", len,
                 VALUE_MAX);
        return -1;
    }
    buf = malloc(len + 1);
    if (buf == NULL) {
        snprintf(why, why_size, "out of memory");
        return -1;
    }
    memcpy(buf, s, len + 1);
    if (keel__config_trim(buf)[0] == '\0') {
        free(buf);
        return 0;
    }
    for (tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        char *t = keel__config_trim(tok);
        int64_t iv;
        double dv;
        if (is_int) {
            if (!keel__parse_i64(t, (int64_t)lo,
                                 hi >= I64MAX ? INT64_MAX : (int64_t)hi,
                                 &iv)) {
                snprintf(why, why_size, "'%.64s' is not an integer in "
                         "[%.0f, %.0f]", t, lo, hi >= I64MAX ? 9.2e18 : hi);
                free(buf);
                return -1;
            }
            dv = (double)iv;
        } else {
            if (!keel__parse_double(t, &dv) || dv < lo || dv > hi) {
                snprintf(why, why_size, "'%.64s' is not a number in [%g, "
                         "%g]", t, lo, hi);
                free(buf);
                return -1;
            }
            iv = 0;
        }
        if (n < max) {
            if (iout != NULL)
                iout[n] = iv;
            if (dout != NULL)
                dout[n] = dv;
        }
        n++;
    }
    free(buf);
    return n;
}

/* An enum's choices "a|b|c" as "a, b, c", cut to fit out. */
static void
format_choices(const char *choices, char *out, size_t size)
{
    size_t used = 0;
    for (const char *p = choices; *p != '\0' && used + 3 < size; p++) {
        if (*p == '|') {
            out[used++] = ',';
            out[used++] = ' ';
        } else {
            out[used++] = *p;
        }
    }
    out[used] = '\0';
}

/* Whether text is a valid value of key d: its integer (ints, bools) in *i
 * and number (ints, doubles) in *dv; why gets the reason when not. */
static int
parse_typed(const keel__config_key *d, const char *text, int64_t *i, double *dv,
            char *why, size_t why_size)
{
    int b;
    switch (d->type) {
    case T_INT: {
        int64_t hi = d->hi >= I64MAX ? INT64_MAX : (int64_t)d->hi;
        if (!keel__parse_i64(text, (int64_t)d->lo, hi, i)) {
            snprintf(why, why_size, "%s.%s = '%s' is not an integer from "
                     "%lld to %lld", d->section, d->name, text,
                     (long long)d->lo, (long long)hi);
            return 0;
        }
        *dv = (double)*i;
        break;
    }
    case T_DOUBLE:
        if (!keel__parse_double(text, dv) || *dv < d->lo || *dv > d->hi) {
            snprintf(why, why_size, "%s.%s = '%s' is not a number from %g "
                     "to %g", d->section, d->name, text, d->lo, d->hi);
            return 0;
        }
        break;
    case T_BOOL:
        if (!parse_bool(text, &b)) {
            snprintf(why, why_size, "%s.%s = '%s' is not a boolean; use "
                     "true or false", d->section, d->name, text);
            return 0;
        }
        *i = b;
        break;
    case T_ENUM:
        if (!enum_has(d->choices, text)) {
            char choices[256];
            format_choices(d->choices, choices, sizeof choices);
            snprintf(why, why_size, "%s.%s = '%s' is not one of: %s",
                     d->section, d->name, text, choices);
            return 0;
        }
        break;
    case T_INT_LIST:
    case T_DOUBLE_LIST: {
        char inner[256];
        if (parse_list(text, d->type == T_INT_LIST, d->lo, d->hi, NULL,
                       NULL, 0, inner, sizeof inner) < 0) {
            snprintf(why, why_size, "%s.%s: %s", d->section, d->name,
                     inner);
            return 0;
        }
        break;
    }
    case T_STRING:
    case T_ADDR_LIST:
        break;
    }
    return 1;
}

/* Validate text (trimmed, writable) for key k and store it. why gets the
 * reason on failure. */
static int
set_trimmed(keel_config *cfg, int k, char *text, char *why, size_t why_size)
{
    keel__config_value *v = &cfg->v[k];
    char *copy;
    int64_t i = 0;
    double dv = 0;
    if (!parse_typed(&keel__config_keys[k], text, &i, &dv, why, why_size))
        return 0;
    copy = strdup(text);
    if (copy == NULL) {
        snprintf(why, why_size, "out of memory");
        return 0;
    }
    free(v->text);
    v->text = copy;
    v->i = i;
    v->d = dv;
    return 1;
}

int
keel__config_set_value(keel_config *cfg, int k, const char *raw, char *why,
          size_t why_size)
{
    size_t n = strlen(raw);
    char *buf;
    int ok;
    if (n > VALUE_MAX) {
        snprintf(why, why_size, "value of %s.%s is %zu bytes (limit %d)",
                 keel__config_keys[k].section, keel__config_keys[k].name, n,
                 VALUE_MAX);
        return 0;
    }
    buf = malloc(n + 1);
    if (buf == NULL) {
        snprintf(why, why_size, "out of memory");
        return 0;
    }
    memcpy(buf, raw, n + 1);
    ok = set_trimmed(cfg, k, keel__config_trim(buf), why, why_size);
    free(buf);
    return ok;
}

keel_status
keel_config_new(keel_config **out)
{
    keel_config *cfg;
    char why[512];
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "config: out is NULL");
    *out = NULL;
    cfg = calloc(1, sizeof *cfg +
                    keel__config_n_keys * sizeof cfg->v[0]);
    if (cfg == NULL)
        return keel__fail(KEEL_ENOMEM, "config");
    for (size_t k = 0; k < keel__config_n_keys; k++) {
        if (!keel__config_set_value(cfg, (int)k, keel__config_keys[k].def,
                                    why, sizeof why)) {
            keel_config_free(cfg);
            return keel__fail(KEEL_EINTERNAL, "config default: %s", why);
        }
    }
    *out = cfg;
    return KEEL_OK;
}

void
keel_config_free(keel_config *cfg)
{
    if (cfg == NULL)
        return;
    for (size_t k = 0; k < keel__config_n_keys; k++) {
        free(cfg->v[k].text);
        free(cfg->v[k].origin);
    }
    free(cfg->source);
    free(cfg);
}

static const keel__config_value *
get(const keel_config *cfg, const char *key, keel__config_type want, int alt)
{
    int k = keel__config_find_dotted(key);
    if (cfg == NULL || k < 0)
        return NULL;
    if (keel__config_keys[k].type != want &&
        (alt < 0 || keel__config_keys[k].type != (keel__config_type)alt))
        return NULL;
    return &cfg->v[k];
}

int64_t
keel_config_int(const keel_config *cfg, const char *key)
{
    const keel__config_value *v = get(cfg, key, T_INT, T_BOOL);
    return v != NULL ? v->i : 0;
}

double
keel_config_double(const keel_config *cfg, const char *key)
{
    const keel__config_value *v = get(cfg, key, T_DOUBLE, T_INT);
    return v != NULL ? v->d : 0.0;
}

int
keel_config_bool(const keel_config *cfg, const char *key)
{
    const keel__config_value *v = get(cfg, key, T_BOOL, -1);
    return v != NULL ? (int)v->i : 0;
}

const char *
keel_config_str(const keel_config *cfg, const char *key)
{
    int k = keel__config_find_dotted(key);
    if (cfg == NULL || k < 0 || cfg->v[k].text == NULL)
        return "";
    return cfg->v[k].text;
}

int
keel_config_is_set(const keel_config *cfg, const char *key)
{
    int k = keel__config_find_dotted(key);
    return cfg != NULL && k >= 0 && cfg->v[k].is_set;
}

const char *
keel_config_origin(const keel_config *cfg, const char *key)
{
    int k = keel__config_find_dotted(key);
    if (cfg == NULL || k < 0)
        return "";
    return keel__config_origin_of(&cfg->v[k]);
}

/* A list key's entries into iout (is_int: T_INT_LIST) or dout
 * (T_DOUBLE_LIST). */
static int
get_list(const keel_config *cfg, const char *key, int is_int, int64_t *iout,
         double *dout, int max)
{
    const keel__config_value *v =
        get(cfg, key, is_int ? T_INT_LIST : T_DOUBLE_LIST, -1);
    int k = keel__config_find_dotted(key);
    char why[256];
    if (v == NULL)
        return -1;
    return parse_list(v->text, is_int, keel__config_keys[k].lo,
                      keel__config_keys[k].hi, iout, dout, max, why,
                      sizeof why);
}

int
keel_config_int_list(const keel_config *cfg, const char *key, int64_t *out,
                     int max)
{
    return get_list(cfg, key, 1, out, NULL, max);
}

int
keel_config_double_list(const keel_config *cfg, const char *key, double *out,
                        int max)
{
    return get_list(cfg, key, 0, NULL, out, max);
}

typedef struct strbuf {
    char *p;
    size_t n, cap;
    int failed;
} strbuf;

static void __attribute__((format(printf, 2, 3)))
sb_add(strbuf *sb, const char *fmt, ...)
{
    va_list ap;
    int need;
    if (sb->failed)
        return;
    for (;;) {
        va_start(ap, fmt);
        need = vsnprintf(sb->p != NULL ? sb->p + sb->n : NULL,
                         sb->p != NULL ? sb->cap - sb->n : 0, fmt, ap);
        va_end(ap);
        if (need < 0) {
            sb->failed = 1;
            return;
        }
        if (sb->p != NULL && sb->n + (size_t)need < sb->cap) {
            sb->n += (size_t)need;
            return;
        }
        {
            size_t cap = (sb->cap + (size_t)need + 1) * 2;
            char *p = realloc(sb->p, cap);
            if (p == NULL) {
                sb->failed = 1;
                return;
            }
            sb->p = p;
            sb->cap = cap;
        }
    }
}

keel_status
keel_config_dump(const keel_config *cfg, int with_origin, char **text)
{
    strbuf sb = { 0 };
    if (cfg == NULL || text == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    *text = NULL;
    for (size_t k = 0; k < keel__config_n_keys; k++) {
        const keel__config_key *d = &keel__config_keys[k];
        if (k == 0 || strcmp(d->section, keel__config_keys[k - 1].section) != 0)
            sb_add(&sb, "%s[%s]\n", k > 0 ? "\n" : "", d->section);
        if (with_origin)
            sb_add(&sb, "%-28s = %-36s ; %s\n", keel__config_keys[k].name,
                   cfg->v[k].text, keel__config_origin_of(&cfg->v[k]));
        else
            sb_add(&sb, "%s = %s\n", keel__config_keys[k].name, cfg->v[k].text);
    }
    if (sb.failed) {
        free(sb.p);
        return keel__fail(KEEL_ENOMEM, "config dump");
    }
    *text = sb.p;
    return KEEL_OK;
}

const char *
keel_config_source_text(const keel_config *cfg)
{
    return cfg != NULL && cfg->source != NULL ? cfg->source : "";
}

static const char *
type_name(const keel__config_key *d)
{
    switch (d->type) {
    case T_INT: return "integer";
    case T_DOUBLE: return "number";
    case T_BOOL: return "boolean";
    case T_STRING: return "string";
    case T_ADDR_LIST: return "address list";
    case T_ENUM: return "choice";
    case T_INT_LIST: return "integer list";
    case T_DOUBLE_LIST: return "number list";
    }
    return "?";
}

keel_status
keel_config_write_reference(FILE *out)
{
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "config reference: NULL stream");
    fprintf(out, "<!-- Generated by `keel config keys`; do not edit. -->\n"
            "# keel configuration reference\n\n"
            "A job is configured by an INI file. Every key is optional; "
            "unknown sections or keys, bad values and conflicting options "
            "are errors that name the file and line. `-s section.key=value` "
            "overrides a key, and `$OUTPUT_DIR`, when set, replaces "
            "`checkpoint.dir` (unless `-s` sets it). `keel config check "
            "FILE` prints the resolved settings and where each came "
            "from, and exits 2 on any error.\n\n"
            "Lines may be of any length (a value up to 64 KiB). A list "
            "(integer, number or address list) may continue on the "
            "following indented lines, joined with commas; comments "
            "(`;` or `#` at the start of a line, `;` after a blank inside "
            "one) may sit between and after them:\n\n"
            "```ini\n[cluster]\nworkers = node01:2222, node02:2222,\n"
            "    node03:2222   ; rack 2\n    node04:2222\n```\n\n"
            "An indented line under a key that is not a list is an "
            "error.\n");
    for (size_t k = 0; k < keel__config_n_keys; k++) {
        const keel__config_key *d = &keel__config_keys[k];
        if (k == 0 || strcmp(d->section, keel__config_keys[k - 1].section) != 0)
            fprintf(out, "\n## [%s]\n\n| key | type | default | meaning |\n"
                    "|---|---|---|---|\n", d->section);
        fprintf(out, "| `%s` | %s", d->name, type_name(d));
        if (d->type == T_ENUM)
            fprintf(out, " (`%s`)", d->choices);
        fprintf(out, " | `%s` | %s |\n", d->def[0] != '\0' ? d->def : "\"\"",
                d->doc);
    }
    if (ferror(out))
        return keel__fail(KEEL_EIO, "config reference: write failed");
    return KEEL_OK;
}

int
keel_config_is_async(const keel_config *cfg, int *is_set)
{
    int by_alg = keel_config_is_set(cfg, "algorithm.name");
    if (is_set != NULL)
        *is_set = by_alg || keel_config_is_set(cfg, "cluster.mode");
    if (by_alg) {
        keel_algorithm a;
        /* validation accepts only known names (the enum lists them) */
        if (keel_algorithm_from_name(keel_config_str(cfg, "algorithm.name"),
                                     &a) == KEEL_OK)
            return !keel_algorithm_is_sync(a);
    }
    return strcmp(keel_config_str(cfg, "cluster.mode"), "async") == 0;
}
