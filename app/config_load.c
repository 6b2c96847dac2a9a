/* config_load.c - setting a configuration's values from outside: the INI
 * file or text (through inih, any line length), `-s section.key=value`
 * overrides, $OUTPUT_DIR and TF_CONFIG's model_dir. Every value goes
 * through keel__config_set_value (config.c), which checks it against the
 * key table. */
#include <config.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ini.h>

#include <keel/config.h>
#include "util.h"
#include "config_int.h"

/* Parsing. inih splits each line into section, key and value, but reads
 * through a fixed line buffer (200 bytes in Debian's build). keel hands it
 * the file one physical line at a time through an ini_reader, so inih's
 * line numbers are the file's, and a line too long for that buffer is
 * handed over shortened: a comment as ";", a section as "[name]", a key
 * line as "key=" with its value kept here (inline comment and blanks
 * stripped the way inih strips them) and used by the handler instead. So
 * lines of any length parse the same as short ones, up to VALUE_MAX bytes
 * of value. Indented lines continue
 * the previous key's value (inih's multi-line values); keel accepts that
 * only for lists, joined with ", ". */
typedef struct load_ctx {
    keel_config *cfg;
    const char *path;
    const char *text;       /* the whole file */
    size_t pos, len;
    int line;               /* the physical line inih is parsing */
    int has_key;            /* a key line came since the last section */
    int cont;               /* this line continues the previous key */
    int last_key;           /* schema index of the previous key, or -1 */
    char *long_value;       /* a long line's value, or NULL */
    int err_line;
    char why[768];          /* the first error only */
} load_ctx;

/* Keep the first error (with its line); then fail the handler (0) or stop
 * the reader (NULL). */
#define KEEP_FIRST(lc, ...)                                              \
    do {                                                                 \
        if ((lc)->why[0] == '\0') {                                      \
            snprintf((lc)->why, sizeof (lc)->why, __VA_ARGS__);          \
            (lc)->err_line = (lc)->line;                                 \
        }                                                                \
    } while (0)
#define FAIL_FIRST(lc, ...) do { KEEP_FIRST(lc, __VA_ARGS__); return 0; } \
    while (0)
#define READER_FAIL(lc, ...)                                             \
    do { KEEP_FIRST(lc, __VA_ARGS__); return NULL; } while (0)

static int
is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f';
}

/* inih's rule: the first of chars, or an inline comment (';' after a
 * blank), or the end. */
static const char *
find_or_comment(const char *s, const char *end, const char *chars)
{
    int was_space = 0;
    while (s < end && (chars == NULL || strchr(chars, *s) == NULL) &&
           !(was_space && *s == ';')) {
        was_space = is_blank(*s);
        s++;
    }
    return s;
}

/* A copy of [s, end) without an inline comment and surrounding blanks. */
static char *
value_copy(const char *s, const char *end)
{
    char *v;
    end = find_or_comment(s, end, NULL);
    while (s < end && is_blank(*s))
        s++;
    while (end > s && is_blank(end[-1]))
        end--;
    v = malloc((size_t)(end - s) + 1);
    if (v != NULL) {
        memcpy(v, s, (size_t)(end - s));
        v[end - s] = '\0';
    }
    return v;
}

static int
put_line(char *str, int num, const char *s, size_t n)
{
    if ((size_t)num < n + 2)
        return 0;
    memcpy(str, s, n);
    str[n] = '\n';
    str[n + 1] = '\0';
    return 1;
}

/* A "[section]" line: the section's name to inih, or an error naming the
 * valid sections. */
static char *
section_line(load_ctx *lc, const char *s, const char *end, char *str,
             int num)
{
    const char *close = find_or_comment(s + 1, end, "]");
    char name[64];
    size_t nl2;
    if (close == end || *close != ']')
        READER_FAIL(lc, "syntax error: '[' without ']'; expected "
                    "'[section]'");
    for (s++; s < close && is_blank(*s); s++)
        ;
    while (close > s && is_blank(close[-1]))
        close--;
    nl2 = (size_t)(close - s);
    if (nl2 >= sizeof name || (memcpy(name, s, nl2), name[nl2] = '\0',
                               !keel__config_section_known(name))) {
        char secs[256];
        keel__config_list_names(NULL, secs, sizeof secs);
        READER_FAIL(lc, "unknown section [%.*s]; valid sections: %s",
                    (int)(nl2 < 64 ? nl2 : 64), s, secs);
    }
    lc->has_key = 0;
    lc->last_key = -1;
    snprintf(str, (size_t)num, "[%s]\n", name);
    return str;
}

/* A "key = value" line [start, end), s its first non-blank: as it is when
 * it fits str, else "key=x" with the value kept in lc->long_value. */
static char *
key_line(load_ctx *lc, const char *start, const char *s, const char *end,
         char *str, int num)
{
    const char *eq = find_or_comment(s, end, "=:");
    if (eq == end || (*eq != '=' && *eq != ':'))
        READER_FAIL(lc, "syntax error; expected '[section]' or "
                    "'key = value'");
    lc->has_key = 1;
    if (put_line(str, num, start, (size_t)(end - start)))
        return str;
    if ((size_t)(eq - s) + 4 > (size_t)num)
        READER_FAIL(lc, "key '%.40s...' is too long", s);
    lc->long_value = value_copy(eq + 1, end);
    if (lc->long_value == NULL)
        READER_FAIL(lc, "out of memory");
    memcpy(str, s, (size_t)(eq - s) + 1);
    strcpy(str + (eq - s) + 1, "x\n");
    return str;
}

/* The ini_reader: the next physical line to inih, shortened as the comment
 * above load_ctx says when it does not fit str. */
static char *
read_line(char *str, int num, void *stream)
{
    load_ctx *lc = stream;
    const char *start, *end, *s, *nl;
    size_t n;
    free(lc->long_value);
    lc->long_value = NULL;
    lc->cont = 0;
    if (lc->why[0] != '\0' || lc->pos >= lc->len || num < 16)
        return NULL;
    start = lc->text + lc->pos;
    nl = memchr(start, '\n', lc->len - lc->pos);
    end = nl != NULL ? nl : lc->text + lc->len;
    lc->pos = (size_t)(end - lc->text) + (nl != NULL ? 1 : 0);
    lc->line++;
    n = (size_t)(end - start);
    for (s = start; s < end && is_blank(*s); s++)
        ;
    if (lc->line == 1 && end - s >= 3 && memcmp(s, "\xEF\xBB\xBF", 3) == 0)
        s += 3;
    if (s == end || *s == ';' || *s == '#')
        return put_line(str, num, start, n) ? str : strcpy(str, ";\n");
    if (s > start && lc->has_key) {
        /* inih strips no inline comment from a continuation: keep the
         * value here for every continuation line. */
        lc->cont = 1;
        lc->long_value = value_copy(s, end);
        if (lc->long_value == NULL)
            READER_FAIL(lc, "out of memory");
        return put_line(str, num, start, n) ? str : strcpy(str, " x\n");
    }
    if (*s == '[')
        return section_line(lc, s, end, str, num);
    return key_line(lc, start, s, end, str, num);
}

/* Append a continuation line to the list value of key k (a trailing comma
 * dropped). */
static int
continue_list(load_ctx *lc, int k, const char *more)
{
    const char *have = lc->cfg->v[k].text != NULL ? lc->cfg->v[k].text : "";
    size_t hl = strlen(have), ml = strlen(more);
    char *joined, why[768];
    int ok;
    joined = malloc(hl + ml + 3);
    if (joined == NULL)
        FAIL_FIRST(lc, "out of memory");
    /* No separator after a trailing comma or before a leading one. */
    snprintf(joined, hl + ml + 3, "%s%s%s", have,
             hl == 0 || have[hl - 1] == ',' || more[0] == ',' ? "" : ", ",
             more);
    /* A list continued line by line may end each line with a comma: the
     * last one ends nothing. */
    {
        size_t jl = strlen(joined);
        while (jl > 0 && (joined[jl - 1] == ',' || is_blank(joined[jl - 1])))
            joined[--jl] = '\0';
    }
    ok = keel__config_set_value(lc->cfg, k, joined, why, sizeof why);
    free(joined);
    if (!ok)
        FAIL_FIRST(lc, "%s", why);
    return 1;
}

static int
on_ini(void *user, const char *section, const char *name, const char *val)
{
    load_ctx *lc = user;
    char why[768];
    int k;
    if (lc->long_value != NULL)
        val = lc->long_value;
    if (lc->cont) {
        k = lc->last_key;
        if (k < 0)
            return 0;      /* the key line already failed */
        keel__config_type t = keel__config_keys[k].type;
        if (t != T_INT_LIST && t != T_DOUBLE_LIST && t != T_ADDR_LIST)
            FAIL_FIRST(lc, "indented line continues %s.%s, which is not a "
                       "list (only lists may continue on indented lines); "
                       "remove the indentation", keel__config_keys[k].section,
                       keel__config_keys[k].name);
        return continue_list(lc, k, val);
    }
    lc->last_key = -1;
    if (section[0] == '\0')
        FAIL_FIRST(lc, "key '%s' is outside any section; put it under one "
                   "such as [train]", name);
    k = keel__config_find_key(section, name);
    if (k < 0) {
        char keys[600];
        keel__config_list_names(section, keys, sizeof keys);
        FAIL_FIRST(lc, "unknown key '%s' in [%s]; valid keys: %s", name,
                   section, keys);
    }
    if (lc->cfg->v[k].seen_in_file)
        FAIL_FIRST(lc, "%s.%s is set twice", section, name);
    if (!keel__config_set_value(lc->cfg, k, val, why, sizeof why))
        FAIL_FIRST(lc, "%s", why);
    lc->last_key = k;
    lc->cfg->v[k].seen_in_file = 1;
    lc->cfg->v[k].is_set = 1;
    if (!keel__config_set_origin(&lc->cfg->v[k], "%s:%d", lc->path, lc->line))
        FAIL_FIRST(lc, "out of memory");
    return 1;
}

/* Parse text (takes ownership) as if read from the file named name. */
static keel_status
load_text(keel_config *cfg, const char *name, char *text)
{
    load_ctx lc;
    int rc;
    memset(&lc, 0, sizeof lc);
    lc.cfg = cfg;
    lc.path = name;
    lc.text = text;
    lc.len = strlen(text);
    lc.last_key = -1;
    for (size_t k = 0; k < keel__config_n_keys; k++)
        cfg->v[k].seen_in_file = 0;
    rc = ini_parse_stream(read_line, &lc, on_ini, &lc);
    free(lc.long_value);
    if (lc.why[0] != '\0') {
        free(text);
        return keel__fail(KEEL_EINVAL, "%s:%d: %s", name, lc.err_line,
                          lc.why);
    }
    if (rc != 0) {
        free(text);
        if (rc < 0)
            return keel__fail(KEEL_ENOMEM, "%s: out of memory parsing it",
                              name);
        return keel__fail(KEEL_EINVAL, "%s:%d: syntax error; expected "
                          "'[section]' or 'key = value'", name, rc);
    }
    free(cfg->source);
    cfg->source = text;
    return KEEL_OK;
}

keel_status
keel_config_load(keel_config *cfg, const char *path)
{
    char *text;
    size_t n;
    keel_status st;

    if (cfg == NULL || path == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    st = keel__fs_read_all(path, 1 << 20, &text, &n);
    if (st == KEEL_ENOTFOUND)
        return keel__fail(KEEL_EINVAL, "config file %s does not exist",
                          path);
    if (st != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "config file %s", path);
    if (strlen(text) != n) {
        free(text);
        return keel__fail(KEEL_EINVAL, "%s: config file contains a NUL "
                          "byte; is it a text file?", path);
    }
    return load_text(cfg, path, text);
}

keel_status
keel_config_load_text(keel_config *cfg, const char *text, const char *name)
{
    char *copy;
    if (cfg == NULL || text == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    if (name == NULL)
        name = "(text)";
    if (strlen(text) > (1 << 20))
        return keel__fail(KEEL_EINVAL, "%s: config text over 1 MiB", name);
    copy = strdup(text);
    if (copy == NULL)
        return keel__fail(KEEL_ENOMEM, "config text");
    return load_text(cfg, name, copy);
}

keel_status
keel_config_override(keel_config *cfg, const char *assignment,
                     const char *origin)
{
    char buf[4096], why[768];
    char *eq, *key;
    int k;
    if (cfg == NULL || assignment == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    if (origin == NULL)
        origin = "override";
    if (strlen(assignment) >= sizeof buf)
        return keel__fail(KEEL_EINVAL, "%s: '%.40s...' is too long", origin,
                          assignment);
    snprintf(buf, sizeof buf, "%s", assignment);
    eq = strchr(buf, '=');
    if (eq == NULL)
        return keel__fail(KEEL_EINVAL, "%s: '%s' is not section.key=value "
                          "(e.g. train.max_steps=100)", origin, assignment);
    *eq = '\0';
    key = keel__config_trim(buf);
    k = keel__config_find_dotted(key);
    if (k < 0) {
        char *dot = strchr(key, '.');
        char keys[768], secs[256];
        if (dot != NULL) {
            *dot = '\0';
            if (keel__config_section_known(key)) {
                keel__config_list_names(key, keys, sizeof keys);
                return keel__fail(KEEL_EINVAL, "%s: unknown key '%s' in "
                                  "[%s]; valid keys: %s", origin, dot + 1,
                                  key, keys);
            }
        }
        keel__config_list_names(NULL, secs, sizeof secs);
        return keel__fail(KEEL_EINVAL, "%s: unknown setting '%s'; use "
                          "section.key with a section of %s", origin,
                          assignment, secs);
    }
    if (!keel__config_set_value(cfg, k, eq + 1, why, sizeof why))
        return keel__fail(KEEL_EINVAL, "%s: %s", origin, why);
    cfg->v[k].is_set = 1;
    cfg->v[k].is_cli = 1;
    if (!keel__config_set_origin(&cfg->v[k], "%s", origin))
        return keel__fail(KEEL_ENOMEM, "%s", origin);
    return KEEL_OK;
}

keel_status
keel_config_apply_env(keel_config *cfg)
{
    const char *out = getenv("OUTPUT_DIR");
    int k = keel__config_find_key("checkpoint", "dir");
    char why[768];
    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    if (out == NULL || out[0] == '\0' || cfg->v[k].is_cli)
        return KEEL_OK;
    if (!keel__config_set_value(cfg, k, out, why, sizeof why))
        return keel__fail(KEEL_EINVAL, "$OUTPUT_DIR: %s", why);
    cfg->v[k].is_set = 1;
    if (!keel__config_set_origin(&cfg->v[k], "$OUTPUT_DIR"))
        return keel__fail(KEEL_ENOMEM, "$OUTPUT_DIR");
    return KEEL_OK;
}

/* a and b name the same directory: realpath when both exist, else the
 * strings without trailing slashes. */
static int
same_dir(const char *a, const char *b)
{
    char ra[PATH_MAX], rb[PATH_MAX];
    size_t la = strlen(a), lb = strlen(b);
    if (realpath(a, ra) != NULL && realpath(b, rb) != NULL)
        return strcmp(ra, rb) == 0;
    while (la > 1 && a[la - 1] == '/')
        la--;
    while (lb > 1 && b[lb - 1] == '/')
        lb--;
    return la == lb && strncmp(a, b, la) == 0;
}

keel_status
keel_config_apply_model_dir(keel_config *cfg, const char *model_dir)
{
    int k = keel__config_find_key("checkpoint", "dir");
    char why[768];
    if (cfg == NULL)
        return keel__fail(KEEL_EINVAL, "config: NULL argument");
    if (model_dir == NULL || model_dir[0] == '\0')
        return KEEL_OK;
    if (cfg->v[k].is_set && !same_dir(cfg->v[k].text, model_dir))
        return keel__fail(KEEL_EINVAL, "TF_CONFIG model_dir '%s' and "
                          "checkpoint.dir '%s' (set by %s) are different "
                          "directories; remove one of the two settings or "
                          "give both the same path", model_dir,
                          cfg->v[k].text, keel__config_origin_of(&cfg->v[k]));
    if (!keel__config_set_value(cfg, k, model_dir, why, sizeof why))
        return keel__fail(KEEL_EINVAL, "TF_CONFIG model_dir: %s", why);
    if (!cfg->v[k].is_set &&
        !keel__config_set_origin(&cfg->v[k], "TF_CONFIG model_dir"))
        return keel__fail(KEEL_ENOMEM, "TF_CONFIG model_dir");
    cfg->v[k].is_set = 1;
    return KEEL_OK;
}
