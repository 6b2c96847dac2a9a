/* util.h - private helpers shared by every keel module: failure reporting,
 * logging, crash-safe file writes, clocks and small string helpers.
 * Never installed; nothing here is exported from libkeel. */
#ifndef KEEL_UTIL_H
#define KEEL_UTIL_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <keel/status.h>
#include <keel/log.h>

#define KEEL_PATH_MAX 4096
#define KEEL_ERR_MAX 512

/* Set this thread's message and return code. */
keel_status keel__fail(keel_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Like keel__fail, but keeps the current message as the cause:
 * "<new text>: <previous message>". */
keel_status keel__wrap(keel_status code, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Check the struct_size of a config struct a caller filled: type names the
 * struct ("keel_session_config"), min_size is the size of its first
 * version, size this library's. 0 (not filled by its init function, e.g.
 * memset or "= { 0 }"), smaller than min_size or larger than size (built
 * against newer headers) fails with KEEL_EINVAL naming the struct and its
 * init function. A struct_size between min_size and size is valid: the
 * consumer reads only the first struct_size bytes and takes the defaults
 * for the rest. */
keel_status keel__struct_size_check(uint32_t struct_size, size_t min_size,
                                    size_t size, const char *type);
/* The usual call: p points to a struct of type T whose first version is
 * the present one. */
#define KEEL__STRUCT_CHECK(p, T) \
    keel__struct_size_check((p)->struct_size, sizeof(T), sizeof(T), #T)
/* What every *_init() of such a struct does first: zero *p and set its
 * struct_size to this library's size, the value KEEL__STRUCT_CHECK takes. */
#define KEEL__STRUCT_INIT(p)                                                \
    do {                                                                    \
        memset((p), 0, sizeof *(p));                                        \
        (p)->struct_size = sizeof *(p);                                     \
    } while (0)

/* The start of a constructor taking a config struct T whose first member is
 * uint32_t struct_size: cfg and out non-NULL (else KEEL_EINVAL "who: cfg or
 * out is NULL"), then KEEL__STRUCT_CHECK, its message prefixed with who. */
keel_status keel__config_check(const void *cfg, const void *out,
                               size_t min_size, size_t size, const char *type,
                               const char *who);
#define KEEL__CONFIG_CHECK(cfg, out, T, who) \
    keel__config_check((cfg), (out), sizeof(T), sizeof(T), #T, (who))

/* Little-endian byte order, the order of every integer keel writes to a
 * file or a message: the n (1..8) low bytes of v into p, and the n bytes at
 * p back as a number. */
static inline void
keel__le_put(void *p, uint64_t v, int n)
{
    unsigned char *b = p;
    for (int i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
}

static inline uint64_t
keel__le_get(const void *p, int n)
{
    const unsigned char *b = p;
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)b[i] << (8 * i);
    return v;
}

/* Log a line through the installed handler (no-op without one). */
void keel__log(keel_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Text another process chose (a peer's user name, address, identity)
 * made safe for one log line: printable ASCII is kept, a backslash becomes
 * two, a newline, carriage return and tab become \n \r \t, every other
 * byte (control characters, ESC, non-ASCII) \xHH; cut with "..." to fit
 * size (>= 4). Returns out. */
const char *keel__log_escape(char *out, size_t size, const char *in);
/* The same for n bytes that need not end in a NUL. */
const char *keel__log_escape_n(char *out, size_t size, const char *in,
                               size_t n);

/* A rate limit for one kind of log line that peers can cause (a refused
 * request, a refused connection): the first occurrence is logged at once,
 * later ones within interval_ns are only counted, and the next occurrence
 * after the interval is logged with that count. One caller thread per
 * limit. Zero-initialized: an interval of KEEL__LOG_LIMIT_NS. */
#define KEEL__LOG_LIMIT_NS ((int64_t)10 * 1000000000)
typedef struct keel__log_limit {
    int64_t interval_ns;
    int64_t logged_ns;      /* when the last line was logged; 0: never */
    long held;              /* occurrences counted since that line */
    long total;             /* occurrences ever */
} keel__log_limit;
/* One occurrence at now_ns: 1 when it is to be logged, with *held the
 * occurrences not logged since the previous line; 0 when only counted. */
int keel__log_limit_take(keel__log_limit *l, int64_t now_ns, long *held);
/* The occurrences counted and not yet logged (for a last summary line);
 * resets that count. */
long keel__log_limit_flush(keel__log_limit *l);

/* Debian's HDF5 is built without thread safety: every HDF5 call in keel
 * (checkpoint writer thread, readers, the HDF5 data reader) runs under this
 * one recursive process-wide lock. */
void keel__h5_lock(void);
void keel__h5_unlock(void);

/* The signal SIGTERM/SIGINT delivered since the handlers were installed
 * (keel_session_install_signal_handlers), 0 if none; util/signal.c. The
 * step path reads the variable itself. */
extern volatile sig_atomic_t keel__signal_flag;
int keel__signal_pending(void);
/* Install (once) / restore the handlers; clear the flag. */
keel_status keel__signal_install(void);
void keel__signal_uninstall(void);
void keel__signal_clear(void);

/* Subnormal floats flushed to zero (FTZ and DAZ) in the calling thread
 * between begin and end, which restores the caller's mode (util/fpmode.c).
 * Every entry point of keel's arithmetic (a session step, a model or
 * optimizer call, a ps) runs inside such a scope; scopes nest. */
typedef struct keel__fp_mode {
    uint64_t bits;
} keel__fp_mode;
void keel__fp_flush_begin(keel__fp_mode *saved);
void keel__fp_flush_end(const keel__fp_mode *saved);
/* The value of expression e (a keel_status) evaluated in such a scope. */
#define KEEL__FLUSHED(e)                                                   \
    __extension__({                                                        \
        keel__fp_mode fp_;                                                 \
        keel_status st_;                                                   \
        keel__fp_flush_begin(&fp_);                                        \
        st_ = (e);                                                         \
        keel__fp_flush_end(&fp_);                                          \
        st_;                                                               \
    })

/* Clocks. */
int64_t keel__now_mono_ns(void);   /* CLOCK_MONOTONIC */
/* keel_aligned_alloc, zeroed (lazily, for large blocks); keel_aligned_free. */
void *keel__aligned_zalloc(size_t bytes);
/* Blocks of KEEL__PAGE_ALIGN_BYTES or more start on a KEEL__PAGE_ALIGN
 * boundary (tensors, the saver's staging buffer), so checkpoint/ can move
 * them to and from disk with O_DIRECT; smaller ones on KEEL_TENSOR_ALIGN. */
#define KEEL__PAGE_ALIGN ((size_t)4096)
#define KEEL__PAGE_ALIGN_BYTES ((size_t)64 << 10)
#define KEEL__ALIGN_FOR(bytes) \
    ((bytes) >= KEEL__PAGE_ALIGN_BYTES ? KEEL__PAGE_ALIGN \
                                       : (size_t)KEEL_TENSOR_ALIGN)
double keel__now_wall(void);       /* seconds since the epoch */

/* snprintf that fails (KEEL_EINVAL naming what) when the result would be
 * truncated. */
keel_status keel__fmt(char *buf, size_t size, const char *what,
                      const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* dir + "/" + name into buf (size KEEL_PATH_MAX at least advisable). */
keel_status keel__path_join(char *buf, size_t size, const char *dir,
                            const char *name);

/* Parse helpers: whole string must be a number within [lo, hi]. */
int keel__parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out);
int keel__parse_double(const char *s, double *out);

/* ---- files that must survive a crash ------------------------------------ */

/* The I/O calls keel's durable writers go through; tests swap the table to
 * inject failures at the N-th write, fsync or rename. */
typedef struct keel__fs_ops {
    ssize_t (*write)(int fd, const void *buf, size_t n);
    int (*fsync)(int fd);
    int (*rename)(const char *from, const char *to);
} keel__fs_ops;

extern const keel__fs_ops *keel__fs;          /* current table */
extern const keel__fs_ops keel__fs_default;   /* the real calls */
/* Install ops (NULL restores the default). Test use only. */
void keel__fs_set_ops(const keel__fs_ops *ops);

/* Write all n bytes to fd through keel__fs (retries short writes, EINTR). */
keel_status keel__fs_write_all(int fd, const void *buf, size_t n,
                               const char *path);
/* fsync a path (file or directory). */
keel_status keel__fs_fsync_path(const char *path);
/* fsync the directory that holds path. */
keel_status keel__fs_fsync_parent(const char *path);
/* The temp name used for path: "<dir>/.<base>.tmp.<pid>". */
keel_status keel__fs_tmp_name(char *buf, size_t size, const char *path);
/* Atomically replace path with data: temp file in the same directory,
 * fsync, rename, fsync the directory. On failure the temp file is removed
 * and path is untouched. */
keel_status keel__fs_write_atomic(const char *path, const void *data,
                                  size_t n);
/* Rename tmp onto path through keel__fs, then fsync the directory; on
 * failure unlinks tmp. */
keel_status keel__fs_commit(const char *tmp, const char *path);
/* Read a whole file (at most max_bytes; larger is KEEL_ECORRUPT). Caller
 * frees *data; a NUL is appended (not counted in *n). */
keel_status keel__fs_read_all(const char *path, size_t max_bytes,
                              char **data, size_t *n);
/* mkdir -p. */
keel_status keel__fs_mkdirs(const char *path);

/* ---- enum names (names.c) ------------------------------------------------ */

/* The index of name among n names into *out, or KEEL_EINVAL naming what
 * and listing the valid choices (*out untouched). */
keel_status keel__name_lookup(const char *what, const char *name,
                              const char *const *names, int n, int *out);

/* The two string functions of an enum T whose values index the static
 * array names. KEEL__FROM_NAME defines keel_status F(const char *name,
 * T *out): KEEL_OK and *out, or KEEL_EINVAL naming what and listing the
 * names (*out untouched). KEEL__NAME defines const char *F(T k): names[k],
 * or "unknown" for a value outside the array. */
#define KEEL__NAMES_N(names) ((int)(sizeof(names) / sizeof((names)[0])))
#define KEEL__FROM_NAME(F, T, what, names)                                  \
    keel_status F(const char *name, T *out)                                 \
    {                                                                       \
        int i = 0;                                                          \
        keel_status st = keel__name_lookup(what, name, names,               \
                                           KEEL__NAMES_N(names), &i);       \
        if (st == KEEL_OK)                                                  \
            *out = (T)i;                                                    \
        return st;                                                          \
    }
#define KEEL__NAME(F, T, names)                                             \
    const char *F(T k)                                                      \
    {                                                                       \
        return (unsigned)k < (unsigned)KEEL__NAMES_N(names)                 \
               ? names[k] : "unknown";                                      \
    }

/* ---- PRNG (rng.c): splitmix64 seeding xoshiro256** (never libc) ---------- */

typedef struct keel__rng {
    uint64_t s[4];
} keel__rng;
uint64_t keel__splitmix64(uint64_t *x);
void keel__rng_seed(keel__rng *r, uint64_t seed);
uint64_t keel__rng_next(keel__rng *r);
/* Uniform in [0, n) without modulo bias (n >= 1). */
uint64_t keel__rng_below(keel__rng *r, uint64_t n);
/* Uniform float in [lo, hi). */
float keel__rng_uniform(keel__rng *r, float lo, float hi);

#endif
