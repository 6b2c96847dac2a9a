/* check_events.c - unit tests for hooks/ event files and traces: CRC32C on
 * both code paths, TensorBoard event files read back by an independent
 * Python reader (tests/read_tfevents.py), scalars.csv, Chrome traces. */
#include <config.h>

#include <errno.h>
#include <libgen.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <keel/keel.h>
#include <keel/events.h>
#include "util.h"
#include "events_int.h"
#include "testutil.h"

#define PY_TIMEOUT_MS 20000

/* ---- helpers ------------------------------------------------------------ */

static const char *
python3(void)
{
    const char *p = getenv("PYTHON3");
    return (p != NULL && p[0] != '\0') ? p : "/usr/bin/python3";
}

/* Run tests/<script> on file; returns the exit status. */
static int
run_py(const char *script, const char *file, char *out, size_t out_size,
       char *err, size_t err_size)
{
    char py[4096], sc[4096], arg[4096];
    snprintf(py, sizeof py, "%s", python3());
    snprintf(sc, sizeof sc, "%s", tu_src_path(script));
    snprintf(arg, sizeof arg, "%s", file);
    ck_assert_msg(access(py, X_OK) == 0, "python3 not found at %s (set "
                  "PYTHON3): the independent readers need it", py);
    ck_assert_msg(access(sc, R_OK) == 0, "%s not found (set KEEL_SRCDIR)",
                  sc);
    char *argv[] = { py, sc, arg, NULL };
    return tu_run(argv, NULL, PY_TIMEOUT_MS, out, out_size, err, err_size);
}

static int
count_substr(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(hay, needle); p != NULL;
         p = strstr(p + 1, needle))
        n++;
    return n;
}

/* A deterministic byte pattern (LCG) for the CRC comparisons. */
static void
fill_pattern(uint8_t *b, size_t n, uint32_t seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        b[i] = (uint8_t)(seed >> 24);
    }
}

/* ---- CRC32C ------------------------------------------------------------- */

typedef uint32_t (*crc_fn)(uint32_t, const void *, size_t);

static void
check_vectors(crc_fn f, const char *which)
{
    uint8_t buf[48];
    /* RFC 3720 B.4: a SCSI read command PDU. */
    static const uint8_t pdu[48] = {
        0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00,
        0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18, 0x28, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    };
    ck_assert_msg(f(0, "123456789", 9) == 0xE3069283u, "%s: 123456789",
                  which);
    memset(buf, 0, 32);
    ck_assert_msg(f(0, buf, 32) == 0x8A9136AAu, "%s: 32 zeros", which);
    memset(buf, 0xff, 32);
    ck_assert_msg(f(0, buf, 32) == 0x62A8AB43u, "%s: 32 x 0xff", which);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)i;
    ck_assert_msg(f(0, buf, 32) == 0x46DD794Eu, "%s: 0..31", which);
    for (int i = 0; i < 32; i++)
        buf[i] = (uint8_t)(31 - i);
    ck_assert_msg(f(0, buf, 32) == 0x113FDB5Cu, "%s: 31..0", which);
    ck_assert_msg(f(0, pdu, sizeof pdu) == 0xD9963A56u, "%s: iSCSI read PDU",
                  which);
    ck_assert_msg(f(0, "", 0) == 0, "%s: empty", which);
}

START_TEST(test_crc32c_vectors)
{
    check_vectors(keel__crc32c_extend, "isa-l");
    check_vectors(keel__crc32c_bitwise, "bitwise");
}
END_TEST

START_TEST(test_crc32c_agrees_with_bitwise_at_every_length_and_alignment)
{
    uint8_t buf[600];
    fill_pattern(buf, sizeof buf, 7);
    for (size_t off = 0; off < 8; off++) {
        for (size_t n = 0; n <= 300; n++) {
            uint32_t want = keel__crc32c_bitwise(0, buf + off, n);
            ck_assert_msg(keel__crc32c_extend(0, buf + off, n) == want,
                          "isa-l off %zu len %zu", off, n);
        }
    }
}
END_TEST

START_TEST(test_crc32c_extend_equals_one_pass)
{
    uint8_t buf[257];
    fill_pattern(buf, sizeof buf, 99);
    uint32_t whole = keel__crc32c_bitwise(0, buf, sizeof buf);
    for (size_t cut = 0; cut <= sizeof buf; cut += 13) {
        uint32_t a = keel__crc32c_extend(0, buf, cut);
        ck_assert(keel__crc32c_extend(a, buf + cut, sizeof buf - cut) ==
                  whole);
    }
}
END_TEST

START_TEST(test_utf8_check_rejects_controls_and_malformed_bytes)
{
    ck_assert(keel__utf8_is_clean("loss/train", 10));
    ck_assert(keel__utf8_is_clean("\xc3\xbc\xe2\x82\xac\xf0\x9f\x98\x80", 9));
    ck_assert(!keel__utf8_is_clean("a\nb", 3));
    ck_assert(!keel__utf8_is_clean("a\x7f", 2));
    ck_assert(!keel__utf8_is_clean("\xff", 1));
    ck_assert(!keel__utf8_is_clean("\xc0\xaf", 2));          // overlong '/'
    ck_assert(!keel__utf8_is_clean("\xed\xa0\x80", 3));      // surrogate
    ck_assert(!keel__utf8_is_clean("\xf4\x90\x80\x80", 4));  // > U+10FFFF
    ck_assert(!keel__utf8_is_clean("\xc3", 1));              // truncated
    ck_assert(!keel__utf8_is_clean("\xc2\x85", 2));          // C1 NEL
}
END_TEST

/* ---- event files -------------------------------------------------------- */

typedef struct sample {
    int64_t step;
    const char *tag;
    double value;
} sample;

static const sample samples[] = {
    { 0, "loss", 0.5 },
    { 1, "loss", 0.1 },
    { 2, "acc/top1", 1e-7 },
    { -5, "neg-step", -3.25 },
    { 1000000000000LL, "big step", 123456.789 },
    { 7, "a,b\"c", 2.0 },
    { 8, "\xc3\xbc" "ber", 1e30 },
    { 9, "inf", INFINITY },
    { 10, "nan", NAN },
    { 11, "overflow", 1e300 },                      // float: inf
};
#define N_SAMPLES (sizeof samples / sizeof samples[0])

static void
write_samples(keel_events *w)
{
    for (size_t i = 0; i < N_SAMPLES; i++)
        ck_assert_msg(keel_events_scalar(w, samples[i].step, samples[i].tag,
                                         samples[i].value) == KEEL_OK,
                      "scalar %zu: %s", i, keel_last_error());
}

START_TEST(test_events_roundtrip_through_independent_python_reader)
{
    keel_events *w = NULL;
    char expect[8192], out[8192], err[2048], host[256], path[4096];
    size_t n = 0;
    const char *dir = tu_path("logs/run1");         // parent is missing too

    ck_assert_int_eq(keel_events_open(dir, ".v2", &w), KEEL_OK);
    write_samples(w);
    snprintf(path, sizeof path, "%s", keel_events_path(w));
    keel_events_close(w);

    {
        char copy[4096], want_prefix[4096];
        snprintf(copy, sizeof copy, "%s", path);
        const char *base = basename(copy);
        ck_assert_int_eq(gethostname(host, sizeof host), 0);
        host[sizeof host - 1] = '\0';
        ck_assert_msg(strncmp(base, "events.out.tfevents.", 20) == 0, "%s",
                      base);
        ck_assert_uint_eq(strspn(base + 20, "0123456789"), 10);
        snprintf(want_prefix, sizeof want_prefix, ".%s.v2", host);
        ck_assert_str_eq(base + 30, want_prefix);
        ck_assert_int_eq(strncmp(path, dir, strlen(dir)), 0);
    }

    n += (size_t)snprintf(expect + n, sizeof expect - n,
                          "version brain.Event:2\n");
    for (size_t i = 0; i < N_SAMPLES; i++)
        n += (size_t)snprintf(expect + n, sizeof expect - n,
                              "scalar %lld %s %.9g\n",
                              (long long)samples[i].step, samples[i].tag,
                              (double)(float)samples[i].value);
    ck_assert_msg(run_py("tests/read_tfevents.py", path, out, sizeof out,
                         err, sizeof err) == 0, "reader: %s", err);
    ck_assert_str_eq(err, "");
    ck_assert_str_eq(out, expect);
}
END_TEST

START_TEST(test_events_flush_makes_live_file_readable_while_open)
{
    keel_events *w = NULL;
    char out[4096], err[2048];
    ck_assert_int_eq(keel_events_open(tu_dir, NULL, &w), KEEL_OK);
    ck_assert_int_eq(keel_events_scalar(w, 1, "loss", 4.0), KEEL_OK);
    ck_assert_int_eq(keel_events_flush(w), KEEL_OK);
    ck_assert_msg(run_py("tests/read_tfevents.py", keel_events_path(w), out,
                         sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(out, "version brain.Event:2\nscalar 1 loss 4\n");
    ck_assert_int_eq(keel_events_scalar(w, 2, "loss", 2.0), KEEL_OK);
    ck_assert_int_eq(keel_events_flush(w), KEEL_OK);
    ck_assert_msg(run_py("tests/read_tfevents.py", keel_events_path(w), out,
                         sizeof out, err, sizeof err) == 0, "%s", err);
    ck_assert_str_eq(out, "version brain.Event:2\nscalar 1 loss 4\n"
                          "scalar 2 loss 2\n");
    keel_events_close(w);
}
END_TEST

START_TEST(test_events_corrupt_byte_is_a_crc_error_for_python_reader)
{
    keel_events *w = NULL;
    char path[4096], out[4096], err[2048];
    off_t size;
    ck_assert_int_eq(keel_events_open(tu_dir, NULL, &w), KEEL_OK);
    write_samples(w);
    snprintf(path, sizeof path, "%s", keel_events_path(w));
    keel_events_close(w);
    ck_assert_int_eq(run_py("tests/read_tfevents.py", path, out, sizeof out,
                            err, sizeof err), 0);
    size = tu_file_size(path);

    tu_flip_byte(path, size - 8, 0x01);     // inside the last record's data
    ck_assert_int_eq(run_py("tests/read_tfevents.py", path, out, sizeof out,
                            err, sizeof err), 1);
    ck_assert_msg(strstr(err, "data CRC error") != NULL, "%s", err);
    ck_assert_msg(strstr(err, path) != NULL, "%s", err);
    tu_flip_byte(path, size - 8, 0x01);     // restored: reads again
    ck_assert_int_eq(run_py("tests/read_tfevents.py", path, out, sizeof out,
                            err, sizeof err), 0);

    tu_flip_byte(path, 0, 0x80);            // first record's length
    ck_assert_int_eq(run_py("tests/read_tfevents.py", path, out, sizeof out,
                            err, sizeof err), 1);
    ck_assert_msg(strstr(err, "record 0 at offset 0: length CRC error")
                  != NULL, "%s", err);
}
END_TEST

START_TEST(test_events_csv_has_one_header_full_precision_and_quoting)
{
    keel_events *a = NULL, *b = NULL;
    char *csv;
    ck_assert_int_eq(keel_events_open(tu_dir, "", &a), KEEL_OK);
    ck_assert_int_eq(keel_events_scalar(a, 1, "loss", 0.1), KEEL_OK);
    ck_assert_int_eq(keel_events_scalar(a, 2, "a,b\"c", -2.5), KEEL_OK);
    ck_assert_int_eq(keel_events_flush(a), KEEL_OK);
    keel_events_close(a);
    ck_assert_int_eq(keel_events_open(tu_dir, "", &b), KEEL_OK);
    ck_assert_str_eq(keel_events_csv_path(b), tu_path("scalars.csv"));
    ck_assert_int_eq(keel_events_scalar(b, 3, "loss", 1.0 / 3.0), KEEL_OK);
    keel_events_close(b);

    csv = tu_read_file(tu_path("scalars.csv"), NULL);
    ck_assert_int_eq(strncmp(csv, "wall_time,step,tag,value\n", 25), 0);
    ck_assert_int_eq(count_substr(csv, "wall_time"), 1);
    ck_assert_int_eq(count_substr(csv, "\n"), 4);
    ck_assert_msg(strstr(csv, ",1,loss,0.1\n") != NULL, "%s", csv);
    ck_assert_msg(strstr(csv, ",2,\"a,b\"\"c\",-2.5\n") != NULL, "%s", csv);
    ck_assert_msg(strstr(csv, ",3,loss,0.333333333\n") != NULL, "%s", csv);
    free(csv);
}
END_TEST

START_TEST(test_events_csv_torn_last_row_is_ended_before_appending)
{
    keel_events *w = NULL;
    char *csv;
    const char torn[] = "wall_time,step,tag,value\n1.0,5,loss,0.2";
    tu_write_file(tu_path("scalars.csv"), torn, sizeof torn - 1);
    ck_assert_int_eq(keel_events_open(tu_dir, NULL, &w), KEEL_OK);
    ck_assert_int_eq(keel_events_scalar(w, 6, "loss", 0.25), KEEL_OK);
    keel_events_close(w);
    csv = tu_read_file(tu_path("scalars.csv"), NULL);
    ck_assert_msg(strstr(csv, "1.0,5,loss,0.2\n") != NULL, "%s", csv);
    ck_assert_msg(strstr(csv, ",6,loss,0.25\n") != NULL, "%s", csv);
    ck_assert_int_eq(count_substr(csv, "\n"), 3);
    free(csv);
}
END_TEST

START_TEST(test_events_same_second_opens_get_distinct_files)
{
    keel_events *a = NULL, *b = NULL;
    ck_assert_int_eq(keel_events_open(tu_dir, ".x", &a), KEEL_OK);
    ck_assert_int_eq(keel_events_open(tu_dir, ".x", &b), KEEL_OK);
    ck_assert_str_ne(keel_events_path(a), keel_events_path(b));
    ck_assert_int_eq(access(keel_events_path(a), F_OK), 0);
    ck_assert_int_eq(access(keel_events_path(b), F_OK), 0);
    keel_events_close(a);
    keel_events_close(b);
}
END_TEST

START_TEST(test_events_rejects_bad_tags_naming_the_file)
{
    keel_events *w = NULL;
    char longest[KEEL_EVENTS_TAG_MAX + 2];
    ck_assert_int_eq(keel_events_open(tu_dir, NULL, &w), KEEL_OK);
    ck_assert_int_eq(keel_events_scalar(w, 1, "", 1.0), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), keel_events_path(w)));
    ck_assert_int_eq(keel_events_scalar(w, 1, NULL, 1.0), KEEL_EINVAL);
    ck_assert_int_eq(keel_events_scalar(w, 1, "a\nb", 1.0), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), keel_events_path(w)));
    ck_assert_int_eq(keel_events_scalar(w, 1, "\xff\xfe", 1.0), KEEL_EINVAL);
    memset(longest, 'x', sizeof longest);
    longest[KEEL_EVENTS_TAG_MAX] = '\0';
    ck_assert_int_eq(keel_events_scalar(w, 1, longest, 1.0), KEEL_OK);
    longest[KEEL_EVENTS_TAG_MAX] = 'x';
    longest[KEEL_EVENTS_TAG_MAX + 1] = '\0';
    ck_assert_int_eq(keel_events_scalar(w, 1, longest, 1.0), KEEL_EINVAL);
    ck_assert_int_eq(keel_events_scalar(NULL, 1, "x", 1.0), KEEL_EINVAL);
    keel_events_close(w);
    keel_events_close(NULL);                        // no-op
}
END_TEST

START_TEST(test_events_open_rejects_bad_arguments)
{
    keel_events *w = (keel_events *)&w;
    ck_assert_int_eq(keel_events_open(tu_dir, "a/b", &w), KEEL_EINVAL);
    ck_assert_ptr_null(w);
    ck_assert_int_eq(keel_events_open(NULL, NULL, &w), KEEL_EINVAL);
    ck_assert_int_eq(keel_events_open(tu_dir, NULL, NULL), KEEL_EINVAL);
    tu_write_file(tu_path("plain"), "x", 1);
    ck_assert_int_eq(keel_events_open(tu_path("plain"), NULL, &w), KEEL_EIO);
    ck_assert_ptr_null(w);
    ck_assert_msg(strstr(keel_last_error(), tu_path("plain")) != NULL, "%s",
                  keel_last_error());
}
END_TEST

START_TEST(test_events_failed_open_leaves_no_event_file)
{
    keel_events *w = NULL;
    // scalars.csv is a directory: the CSV open fails after the event file
    // was created.
    ck_assert_int_eq(mkdir(tu_path("scalars.csv"), 0755), 0);
    ck_assert_int_eq(keel_events_open(tu_dir, NULL, &w), KEEL_EIO);
    ck_assert_ptr_null(w);
    ck_assert_msg(strstr(keel_last_error(), "scalars.csv") != NULL, "%s",
                  keel_last_error());
    ck_assert_int_eq(tu_count_names(tu_dir, "tfevents"), 0);
}
END_TEST

static ssize_t
failing_write(int fd, const void *buf, size_t n)
{
    (void)fd;
    (void)buf;
    (void)n;
    errno = ENOSPC;
    return -1;
}

static int
real_fsync(int fd)
{
    return fsync(fd);
}

static int
real_rename(const char *a, const char *b)
{
    return rename(a, b);
}

static const keel__fs_ops failing_ops = { failing_write, real_fsync,
                                          real_rename };

START_TEST(test_events_write_failure_names_file_and_is_sticky)
{
    keel_events *w = NULL;
    ck_assert_int_eq(keel_events_open(tu_dir, NULL, &w), KEEL_OK);
    ck_assert_int_eq(keel_events_scalar(w, 1, "loss", 1.0), KEEL_OK);
    keel__fs_set_ops(&failing_ops);
    ck_assert_int_eq(keel_events_flush(w), KEEL_EIO);
    keel__fs_set_ops(NULL);
    ck_assert_msg(strstr(keel_last_error(), keel_events_path(w)) != NULL,
                  "%s", keel_last_error());
    ck_assert_ptr_nonnull(strstr(keel_last_error(), strerror(ENOSPC)));
    ck_assert_int_eq(keel_events_scalar(w, 2, "loss", 1.0), KEEL_ESTATE);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "earlier write failed"));
    keel_events_close(w);
}
END_TEST

/* ---- traces ------------------------------------------------------------- */

START_TEST(test_trace_json_parses_with_the_events_written)
{
    keel_trace *t = NULL;
    char out[4096], err[2048], expect[4096];
    const char *path = tu_path("trace.json");
    ck_assert_int_eq(keel_trace_open(path, &t), KEEL_OK);
    ck_assert_int_eq(keel_trace_event(t, "step", "train", 1000, 250, 0),
                     KEEL_OK);
    ck_assert_int_eq(keel_trace_event(t, "say \"hi\" \\ ok", NULL, 1250, 0,
                                      3), KEEL_OK);
    ck_assert_int_eq(keel_trace_event(t, "save \xc3\xbc", "ckpt",
                                      4000000000LL, 17, 1), KEEL_OK);
    ck_assert_int_eq(keel_trace_close(t), KEEL_OK);
    snprintf(expect, sizeof expect,
             "step|train|X|1000|250|%ld|0\n"
             "say \"hi\" \\ ok|-|X|1250|0|%ld|3\n"
             "save \xc3\xbc|ckpt|X|4000000000|17|%ld|1\n",
             (long)getpid(), (long)getpid(), (long)getpid());
    ck_assert_int_eq(run_py("tests/read_trace.py", path, out, sizeof out, err,
                            sizeof err), 0);
    ck_assert_str_eq(out, expect);
}
END_TEST

START_TEST(test_trace_empty_and_large_traces_are_valid_json)
{
    keel_trace *t = NULL;
    char *out = malloc(1 << 20), err[2048];
    const char *path = tu_path("empty.json");
    ck_assert_ptr_nonnull(out);
    ck_assert_int_eq(keel_trace_open(path, &t), KEEL_OK);
    ck_assert_int_eq(keel_trace_close(t), KEEL_OK);
    ck_assert_int_eq(run_py("tests/read_trace.py", path, out, 1 << 20, err,
                            sizeof err), 0);
    ck_assert_str_eq(out, "");

    // More than the 64 KiB buffer: exercises the spill path.
    path = tu_path("big.json");
    ck_assert_int_eq(keel_trace_open(path, &t), KEEL_OK);
    for (int i = 0; i < 3000; i++)
        ck_assert_int_eq(keel_trace_event(t, "op", "c", i * 10, 5, i % 4),
                         KEEL_OK);
    ck_assert_int_eq(keel_trace_flush(t), KEEL_OK);
    ck_assert_int_eq(keel_trace_close(t), KEEL_OK);
    ck_assert_int_gt(tu_file_size(path), 64 * 1024);
    ck_assert_int_eq(run_py("tests/read_trace.py", path, out, 1 << 20, err,
                            sizeof err), 0);
    ck_assert_int_eq(count_substr(out, "\n"), 3000);
    ck_assert_ptr_nonnull(strstr(out, "op|c|X|29990|5|"));
    free(out);
}
END_TEST

START_TEST(test_trace_rejects_bad_events_and_reports_close_failure)
{
    keel_trace *t = NULL;
    const char *path = tu_path("bad.json");
    ck_assert_int_eq(keel_trace_open(path, &t), KEEL_OK);
    ck_assert_int_eq(keel_trace_event(t, "x", NULL, 0, -1, 0), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), path));
    ck_assert_int_eq(keel_trace_event(t, "x", NULL, -1, 0, 0), KEEL_EINVAL);
    ck_assert_int_eq(keel_trace_event(t, NULL, NULL, 0, 0, 0), KEEL_EINVAL);
    ck_assert_int_eq(keel_trace_event(t, "", NULL, 0, 0, 0), KEEL_EINVAL);
    ck_assert_int_eq(keel_trace_event(t, "tab\there", NULL, 0, 0, 0),
                     KEEL_EINVAL);
    ck_assert_int_eq(keel_trace_event(t, "ok", "bad\x01", 0, 0, 0),
                     KEEL_EINVAL);
    ck_assert_int_eq(keel_trace_event(t, "ok", NULL, 0, 0, 0), KEEL_OK);
    keel__fs_set_ops(&failing_ops);
    ck_assert_int_eq(keel_trace_close(t), KEEL_EIO);   // t freed anyway
    keel__fs_set_ops(NULL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), path));
    ck_assert_int_eq(keel_trace_close(NULL), KEEL_OK);
    ck_assert_int_eq(keel_trace_open(tu_path("no/such/dir.json"), &t),
                     KEEL_EIO);
    ck_assert_ptr_null(t);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "no/such/dir.json"));
}
END_TEST

static Suite *
events_suite(void)
{
    Suite *s = suite_create("events");
    tu_tcase(s, "crc32c", 0, NULL, NULL, TU_TESTS(
        test_crc32c_vectors,
        test_crc32c_agrees_with_bitwise_at_every_length_and_alignment,
        test_crc32c_extend_equals_one_pass,
        test_utf8_check_rejects_controls_and_malformed_bytes));
    tu_tcase(s, "events", 30, tu_setup, tu_teardown, TU_TESTS(
        test_events_roundtrip_through_independent_python_reader,
        test_events_flush_makes_live_file_readable_while_open,
        test_events_corrupt_byte_is_a_crc_error_for_python_reader,
        test_events_csv_has_one_header_full_precision_and_quoting,
        test_events_csv_torn_last_row_is_ended_before_appending,
        test_events_same_second_opens_get_distinct_files,
        test_events_rejects_bad_tags_naming_the_file,
        test_events_open_rejects_bad_arguments,
        test_events_failed_open_leaves_no_event_file,
        test_events_write_failure_names_file_and_is_sticky));
    tu_tcase(s, "trace", 30, tu_setup, tu_teardown, TU_TESTS(
        test_trace_json_parses_with_the_events_written,
        test_trace_empty_and_large_traces_are_valid_json,
        test_trace_rejects_bad_events_and_reports_close_failure));
    return s;
}

KEEL_TEST_MAIN(events_suite)
