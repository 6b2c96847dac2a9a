/* check_core.c - unit tests for the foundation: status and messages,
 * tensors, the variable store, and the crash-safe file helpers. */
#include <config.h>

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <keel/keel.h>
#include "util.h"
#include "grow.h"
#include "testutil.h"

START_TEST(test_status_names_are_distinct_and_never_null)
{
    for (int a = KEEL_OK; a <= KEEL_ECANCELLED; a++) {
        ck_assert_ptr_nonnull(keel_status_name((keel_status)a));
        for (int b = a + 1; b <= KEEL_ECANCELLED; b++)
            ck_assert_str_ne(keel_status_name((keel_status)a),
                             keel_status_name((keel_status)b));
    }
    ck_assert_str_eq(keel_status_name((keel_status)999), "unknown status");
}
END_TEST

START_TEST(test_fail_sets_message_and_wrap_keeps_cause)
{
    ck_assert_int_eq(keel__fail(KEEL_EIO, "open %s: %s", "a.h5", "denied"),
                     KEEL_EIO);
    ck_assert_str_eq(keel_last_error(), "open a.h5: denied");
    ck_assert_int_eq(keel__wrap(KEEL_ECORRUPT, "restore step %d", 7),
                     KEEL_ECORRUPT);
    ck_assert_str_eq(keel_last_error(), "restore step 7: open a.h5: denied");
    ck_assert(keel_status_is_recoverable(KEEL_EABORTED));
    ck_assert(keel_status_is_recoverable(KEEL_EUNAVAILABLE));
    ck_assert(!keel_status_is_recoverable(KEEL_EIO));
}
END_TEST

START_TEST(test_fail_truncates_long_messages_safely)
{
    char big[2000];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    keel__fail(KEEL_EINVAL, "%s", big);
    ck_assert_uint_eq(strlen(keel_last_error()), KEEL_ERR_MAX - 1);
}
END_TEST

START_TEST(test_version_macros_agree_with_the_library)
{
    int major = -1, minor = -1, patch = -1;
    char tail = 0;
    /* PACKAGE_VERSION is AC_INIT's string, "MAJOR.MINOR.PATCH" */
    ck_assert_int_eq(sscanf(PACKAGE_VERSION, "%d.%d.%d%c", &major, &minor,
                            &patch, &tail), 3);
    ck_assert_int_eq(KEEL_VERSION_MAJOR, major);
    ck_assert_int_eq(KEEL_VERSION_MINOR, minor);
    ck_assert_int_eq(KEEL_VERSION_PATCH, patch);
    ck_assert_str_eq(KEEL_VERSION_STRING, PACKAGE_VERSION);
    ck_assert_str_eq(keel_version(), PACKAGE_VERSION);
    ck_assert_int_eq(keel_version_number(),
                     major * 10000 + minor * 100 + patch);
    ck_assert_int_eq(KEEL_VERSION, keel_version_number());
    ck_assert(KEEL_MAKE_VERSION(1, 0, 0) > KEEL_MAKE_VERSION(0, 99, 99));
    ck_assert(KEEL_MAKE_VERSION(0, 2, 0) > KEEL_MAKE_VERSION(0, 1, 9));
}
END_TEST

START_TEST(test_version_check_follows_the_compatibility_rule)
{
    int major = KEEL_VERSION_MAJOR, minor = KEEL_VERSION_MINOR;
    ck_assert_int_eq(KEEL_VERSION_CHECK(), KEEL_OK);
    ck_assert_int_eq(keel_version_check(major, minor), KEEL_OK);
    /* another MAJOR never matches */
    ck_assert_int_eq(keel_version_check(major + 1, minor), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "runs with libkeel "
                                 PACKAGE_VERSION));
    /* a newer MINOR than the library's never matches */
    ck_assert_int_eq(keel_version_check(major, minor + 1), KEEL_EINVAL);
    /* an older MINOR matches only once MAJOR is past 0 */
    if (minor > 0)
        ck_assert_int_eq(keel_version_check(major, minor - 1),
                         major == 0 ? KEEL_EINVAL : KEEL_OK);
}
END_TEST

static void
record_log(void *ctx, keel_log_level level, const char *msg)
{
    char *buf = ctx;
    snprintf(buf, 256, "%s:%s", keel_log_level_name(level), msg);
}

START_TEST(test_log_goes_to_handler_above_level_only)
{
    char got[256] = "";
    keel__log(KEEL_LOG_INFO, "dropped without handler");
    ck_assert_str_eq(got, "");
    keel_log_set_handler(record_log, got, KEEL_LOG_INFO);
    keel__log(KEEL_LOG_DEBUG, "too low");
    ck_assert_str_eq(got, "");
    keel__log(KEEL_LOG_WARN, "step %d", 3);
    ck_assert_str_eq(got, "warning:step 3");
    keel_log_set_handler(NULL, NULL, KEEL_LOG_DEBUG);
    got[0] = '\0';
    keel__log(KEEL_LOG_ERROR, "gone");
    ck_assert_str_eq(got, "");
}
END_TEST

START_TEST(test_tensor_alloc_is_aligned_and_zeroed)
{
    int64_t shape[4] = { 3, 5, 7, 2 };
    keel_tensor t;
    ck_assert_int_eq(keel_tensor_alloc(&t, 4, shape), KEEL_OK);
    ck_assert_uint_eq(t.count, 210);
    ck_assert_uint_eq((uintptr_t)t.data % KEEL_TENSOR_ALIGN, 0);
    for (size_t i = 0; i < t.count; i++)
        ck_assert(t.data[i] == 0.0f);
    ck_assert_uint_eq(keel_tensor_bytes(&t), 840);
    keel_tensor_release(&t);
    ck_assert_ptr_null(t.data);
    keel_tensor_release(NULL);
}
END_TEST

/* Blocks of 2 MiB and more are their own mapping (huge-page advised):
 * 2 MiB-aligned, zeroed when asked, every byte usable, freed by
 * keel_aligned_free alongside malloc'd small ones. */
START_TEST(test_aligned_alloc_large_blocks)
{
    size_t sizes[] = { ((size_t)2 << 20) - 4, (size_t)2 << 20,
                       ((size_t)5 << 20) + 12, (size_t)64 << 10, 100 };
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        size_t n = sizes[i];
        unsigned char *a = keel_aligned_alloc(n);
        unsigned char *z = keel__aligned_zalloc(n);
        ck_assert_ptr_nonnull(a);
        ck_assert_ptr_nonnull(z);
        if (n >= ((size_t)2 << 20))
            ck_assert_uint_eq((uintptr_t)a % ((size_t)2 << 20), 0);
        else if (n >= ((size_t)64 << 10))
            ck_assert_uint_eq((uintptr_t)a % 4096, 0);
        ck_assert_uint_eq((uintptr_t)z % KEEL_TENSOR_ALIGN, 0);
        {
            size_t nz = 0;
            for (size_t k = 0; k < n; k++)
                nz += z[k] != 0;
            ck_assert_uint_eq(nz, 0);
        }
        memset(a, 0xab, n);
        ck_assert_uint_eq(a[0], 0xab);
        ck_assert_uint_eq(a[n - 1], 0xab);
        keel_aligned_free(a);
        keel_aligned_free(z);
    }
    keel_aligned_free(NULL);
}
END_TEST

START_TEST(test_tensor_scalar_has_one_element)
{
    keel_tensor t;
    ck_assert_int_eq(keel_tensor_alloc(&t, 0, NULL), KEEL_OK);
    ck_assert_uint_eq(t.count, 1);
    keel_tensor_release(&t);
}
END_TEST

START_TEST(test_shape_rejects_bad_dims_and_overflow)
{
    int64_t zero[2] = { 4, 0 };
    int64_t neg[1] = { -3 };
    int64_t huge[4] = { INT64_MAX, INT64_MAX, 2, 2 };
    int64_t big[2] = { (int64_t)1 << 30, (int64_t)1 << 30 };
    size_t n;
    keel_tensor t;
    ck_assert_int_eq(keel_shape_count(2, zero, &n), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "dimension 1 is 0"));
    ck_assert_int_eq(keel_shape_count(1, neg, &n), KEEL_EINVAL);
    ck_assert_int_eq(keel_shape_count(4, huge, &n), KEEL_EINVAL);
    ck_assert_int_eq(keel_shape_count(2, big, &n), KEEL_EINVAL);
    ck_assert_int_eq(keel_shape_count(5, big, &n), KEEL_EINVAL);
    ck_assert_int_eq(keel_tensor_alloc(&t, 4, huge), KEEL_EINVAL);
    ck_assert_ptr_null(t.data);
}
END_TEST

START_TEST(test_shape_format)
{
    int64_t s[3] = { 3, 3, 32 };
    char buf[32];
    ck_assert_str_eq(keel_shape_format(buf, sizeof buf, 3, s), "[3,3,32]");
    ck_assert_str_eq(keel_shape_format(buf, sizeof buf, 0, s), "[]");
    ck_assert_str_eq(keel_shape_format(buf, 4, 3, s), "[3,");
    ck_assert(keel_shape_equal(3, s, 3, s));
    ck_assert(!keel_shape_equal(2, s, 3, s));
}
END_TEST

START_TEST(test_names_validity)
{
    char long_name[KEEL_NAME_MAX + 1];
    ck_assert(keel_name_is_valid("conv1/kernel"));
    ck_assert(keel_name_is_valid("a.b-c_d/e2"));
    ck_assert(!keel_name_is_valid(""));
    ck_assert(!keel_name_is_valid("/abs"));
    ck_assert(!keel_name_is_valid("trailing/"));
    ck_assert(!keel_name_is_valid("a//b"));
    ck_assert(!keel_name_is_valid("a/../b"));
    ck_assert(!keel_name_is_valid("a/./b"));
    ck_assert(!keel_name_is_valid("sp ace"));
    ck_assert(!keel_name_is_valid(NULL));
    memset(long_name, 'a', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    ck_assert(!keel_name_is_valid(long_name));
    long_name[KEEL_NAME_MAX - 1] = '\0';
    ck_assert(keel_name_is_valid(long_name));
}
END_TEST

START_TEST(test_vars_create_find_iterate_in_order)
{
    keel_vars *vs;
    keel_var *v;
    int64_t k[4] = { 3, 3, 1, 32 }, b[1] = { 32 };
    char name[64];
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "conv1/kernel", 4, k,
                                      KEEL_VAR_TRAINABLE, &v), KEEL_OK);
    ck_assert_str_eq(keel_var_name(v), "conv1/kernel");
    ck_assert_uint_eq(keel_var_tensor(v)->count, 288);
    ck_assert(keel_var_is_trainable(v));
    ck_assert_int_eq(keel_vars_create(vs, "conv1/bias", 1, b,
                                      KEEL_VAR_TRAINABLE, NULL), KEEL_OK);
    /* enough variables to force the index to grow several times */
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "layer%d/w", i);
        ck_assert_int_eq(keel_vars_create(vs, name, 1, b, KEEL_VAR_LOCAL,
                                          NULL), KEEL_OK);
    }
    ck_assert_uint_eq(keel_vars_count(vs), 102);
    ck_assert_str_eq(keel_var_name(keel_vars_at(vs, 0)), "conv1/kernel");
    ck_assert_str_eq(keel_var_name(keel_vars_at(vs, 1)), "conv1/bias");
    for (int i = 0; i < 100; i++) {
        snprintf(name, sizeof name, "layer%d/w", i);
        v = keel_vars_find(vs, name);
        ck_assert_ptr_nonnull(v);
        ck_assert_uint_eq(keel_var_index(v), (size_t)i + 2);
        ck_assert(!keel_var_is_trainable(v));
    }
    ck_assert_ptr_null(keel_vars_find(vs, "conv1"));
    ck_assert_ptr_null(keel_vars_at(vs, 102));
    ck_assert_uint_eq(keel_vars_bytes(vs, 0), (288 + 32 + 3200) * 4);
    keel_vars_free(vs);
    keel_vars_free(NULL);
}
END_TEST

START_TEST(test_vars_reject_duplicate_and_bad_shape_naming_them)
{
    keel_vars *vs;
    int64_t s[2] = { 2, 2 }, bad[2] = { 2, 0 };
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "dense/w", 2, s, 0, NULL), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "dense/w", 2, s, 0, NULL),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "'dense/w' already"));
    ck_assert_int_eq(keel_vars_create(vs, "dense/b", 2, bad, 0, NULL),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "dense/b"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "[2,0]"));
    ck_assert_int_eq(keel_vars_create(vs, "bad name", 2, s, 0, NULL),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "bad name"));
    ck_assert_uint_eq(keel_vars_count(vs), 1);
    keel_vars_free(vs);
}
END_TEST

START_TEST(test_slots_keep_pointers_and_shape)
{
    keel_vars *vs;
    keel_var *v;
    keel_tensor *m, *vv, *again;
    const char *name;
    int64_t s[2] = { 4, 5 };
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "w", 2, s, KEEL_VAR_TRAINABLE, &v),
                     KEEL_OK);
    ck_assert_int_eq(keel_var_add_slot(v, "m", &m), KEEL_OK);
    m->data[3] = 1.5f;
    ck_assert_int_eq(keel_var_add_slot(v, "v", &vv), KEEL_OK);
    for (int i = 0; i < 8; i++) {
        char sn[8];
        snprintf(sn, sizeof sn, "s%d", i);
        ck_assert_int_eq(keel_var_add_slot(v, sn, NULL), KEEL_OK);
    }
    ck_assert_int_eq(keel_var_add_slot(v, "m", &again), KEEL_OK);
    ck_assert_ptr_eq(again, m);                 /* same slot, still valid */
    ck_assert(m->data[3] == 1.5f);
    ck_assert_ptr_eq(keel_var_slot(v, "v"), vv);
    ck_assert_int_eq(vv->ndim, 2);
    ck_assert_int_eq(vv->shape[1], 5);
    ck_assert_uint_eq(keel_var_slot_count(v), 10);
    ck_assert_ptr_eq(keel_var_slot_at(v, 1, &name), vv);
    ck_assert_str_eq(name, "v");
    ck_assert_ptr_null(keel_var_slot_at(v, 10, &name));
    ck_assert_int_eq(keel_var_add_slot(v, "a/b", NULL), KEEL_EINVAL);
    ck_assert_uint_eq(keel_vars_bytes(vs, 1), 11 * 20 * 4);
    keel_vars_free(vs);
}
END_TEST

START_TEST(test_global_step_and_readiness)
{
    keel_vars *vs;
    int64_t s[1] = { 2 };
    char buf[64];
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_global_step(vs), 0);
    keel_vars_set_global_step(vs, INT64_C(1) << 40);
    ck_assert_int_eq(keel_vars_global_step(vs), INT64_C(1) << 40);
    keel_vars_create(vs, "a", 1, s, 0, NULL);
    keel_vars_create(vs, "b", 1, s, 0, NULL);
    ck_assert_uint_eq(keel_vars_uninitialized(vs, buf, sizeof buf), 2);
    ck_assert_str_eq(buf, "a, b");
    keel_var_set_initialized(keel_vars_find(vs, "a"), 1);
    ck_assert_uint_eq(keel_vars_uninitialized(vs, buf, sizeof buf), 1);
    ck_assert_str_eq(buf, "b");
    keel_vars_set_all_initialized(vs, 1);
    ck_assert_uint_eq(keel_vars_uninitialized(vs, buf, sizeof buf), 0);
    ck_assert_str_eq(buf, "");
    keel_vars_free(vs);
}
END_TEST

START_TEST(test_grads_cover_trainable_variables_only)
{
    keel_vars *vs;
    keel_grads *g;
    int64_t s[2] = { 2, 3 }, b[1] = { 3 };
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    keel_vars_create(vs, "dense/w", 2, s, KEEL_VAR_TRAINABLE, NULL);
    keel_vars_create(vs, "frozen", 1, b, 0, NULL);
    keel_vars_create(vs, "dense/b", 1, b, KEEL_VAR_TRAINABLE, NULL);
    ck_assert_int_eq(keel_grads_new(vs, &g), KEEL_OK);
    ck_assert_uint_eq(keel_grads_count(g), 3);
    ck_assert_ptr_eq(keel_grads_vars(g), vs);
    ck_assert_ptr_nonnull(keel_grads_at(g, 0));
    ck_assert_uint_eq(keel_grads_at(g, 0)->count, 6);
    ck_assert_ptr_null(keel_grads_at(g, 1));
    ck_assert_ptr_null(keel_grads_at(g, 3));
    ck_assert_ptr_eq(keel_grads_find(g, "dense/b"), keel_grads_at(g, 2));
    ck_assert_ptr_null(keel_grads_find(g, "frozen"));
    keel_grads_at(g, 2)->data[1] = 4.0f;
    keel_grads_zero(g);
    ck_assert(keel_grads_at(g, 2)->data[1] == 0.0f);
    keel_grads_free(g);
    keel_grads_free(NULL);
    keel_vars_free(vs);
}
END_TEST

/* ---- fsutil: failure injection ----------------------------------------- */

static int fail_rename_calls;
static int
failing_rename(const char *a, const char *b)
{
    (void)a; (void)b;
    fail_rename_calls++;
    errno = EIO;
    return -1;
}
static int
failing_fsync(int fd)
{
    (void)fd;
    errno = EIO;
    return -1;
}

START_TEST(test_atomic_write_replaces_whole_file)
{
    const char *p = tu_path("state");
    size_t n;
    char *got;
    ck_assert_int_eq(keel__fs_write_atomic(p, "first", 5), KEEL_OK);
    ck_assert_int_eq(keel__fs_write_atomic(p, "second!", 7), KEEL_OK);
    got = tu_read_file(p, &n);
    ck_assert_str_eq(got, "second!");
    free(got);
}
END_TEST

START_TEST(test_atomic_write_failure_keeps_old_file_and_no_temp)
{
    const char *p = tu_path("state");
    keel__fs_ops ops = keel__fs_default;
    char tmp[KEEL_PATH_MAX];
    char *got;
    ck_assert_int_eq(keel__fs_write_atomic(p, "old", 3), KEEL_OK);
    ops.rename = failing_rename;
    keel__fs_set_ops(&ops);
    ck_assert_int_eq(keel__fs_write_atomic(p, "new", 3), KEEL_EIO);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "rename"));
    ck_assert_int_eq(fail_rename_calls, 1);
    ops = keel__fs_default;
    ops.fsync = failing_fsync;
    keel__fs_set_ops(&ops);
    ck_assert_int_eq(keel__fs_write_atomic(p, "new", 3), KEEL_EIO);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "fsync"));
    keel__fs_set_ops(NULL);
    got = tu_read_file(p, NULL);
    ck_assert_str_eq(got, "old");
    free(got);
    ck_assert_int_eq(keel__fs_tmp_name(tmp, sizeof tmp, p), KEEL_OK);
    ck_assert_int_ne(access(tmp, F_OK), 0);
}
END_TEST

START_TEST(test_read_all_bounds_and_errors)
{
    const char *p = tu_path("f");
    char *data;
    size_t n;
    tu_write_file(p, "0123456789", 10);
    ck_assert_int_eq(keel__fs_read_all(p, 10, &data, &n), KEEL_OK);
    ck_assert_uint_eq(n, 10);
    ck_assert_str_eq(data, "0123456789");
    free(data);
    ck_assert_int_eq(keel__fs_read_all(p, 9, &data, &n), KEEL_ECORRUPT);
    ck_assert_ptr_null(data);
    ck_assert_int_eq(keel__fs_read_all(tu_path("missing"), 9, &data, &n),
                     KEEL_ENOTFOUND);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "missing"));
    ck_assert_int_eq(keel__fs_read_all(tu_dir, 9, &data, &n), KEEL_EINVAL);
}
END_TEST

START_TEST(test_mkdirs_and_path_join)
{
    char buf[KEEL_PATH_MAX], small[8];
    ck_assert_int_eq(keel__path_join(buf, sizeof buf, tu_dir, "a/b/c"),
                     KEEL_OK);
    ck_assert_int_eq(keel__fs_mkdirs(buf), KEEL_OK);
    ck_assert_int_eq(keel__fs_mkdirs(buf), KEEL_OK);
    ck_assert_int_eq(access(buf, F_OK), 0);
    ck_assert_int_eq(keel__path_join(small, sizeof small, "dir/", "x"),
                     KEEL_OK);
    ck_assert_str_eq(small, "dir/x");
    ck_assert_int_eq(keel__path_join(small, sizeof small, "dir", "long"),
                     KEEL_EINVAL);
    tu_write_file(tu_path("file"), "x", 1);
    ck_assert_int_eq(keel__fs_mkdirs(tu_path("file")), KEEL_EIO);
}
END_TEST

START_TEST(test_parse_numbers)
{
    int64_t v;
    double d;
    ck_assert(keel__parse_i64("42", 0, 100, &v) && v == 42);
    ck_assert(!keel__parse_i64("42x", 0, 100, &v));
    ck_assert(!keel__parse_i64("101", 0, 100, &v));
    ck_assert(!keel__parse_i64("", 0, 100, &v));
    ck_assert(keel__parse_double("1e-3", &d) && d == 1e-3);
    ck_assert(!keel__parse_double("nan", &d));
    ck_assert(!keel__parse_double("0.1.2", &d));
}
END_TEST

START_TEST(test_grow_doubles_and_keeps_the_array_on_failure)
{
    size_t cap = 0, n;
    int *a = NULL, *p;
    for (n = 0; n < 20; n++) {
        a = keel__grow(a, &cap, n, sizeof *a, 4);
        ck_assert_ptr_nonnull(a);
        ck_assert_uint_gt(cap, n);
        a[n] = (int)n;
    }
    ck_assert_uint_eq(cap, 32);          // 4, 8, 16, 32
    for (n = 0; n < 20; n++)
        ck_assert_int_eq(a[n], (int)n);
    /* room left: the same array, the same capacity */
    ck_assert_ptr_eq(keel__grow(a, &cap, 20, sizeof *a, 4), a);
    ck_assert_uint_eq(cap, 32);
    /* a size past SIZE_MAX: NULL, the array and its capacity untouched */
    p = keel__grow(a, &cap, cap, SIZE_MAX / 32, 4);
    ck_assert_ptr_null(p);
    ck_assert_uint_eq(cap, 32);
    ck_assert_int_eq(a[19], 19);
    free(a);
}
END_TEST

static Suite *
core_suite(void)
{
    Suite *s = suite_create("core");
    tu_tcase(s, "status", 0, NULL, NULL, TU_TESTS(
        test_status_names_are_distinct_and_never_null,
        test_fail_sets_message_and_wrap_keeps_cause,
        test_fail_truncates_long_messages_safely,
        test_version_macros_agree_with_the_library,
        test_version_check_follows_the_compatibility_rule,
        test_log_goes_to_handler_above_level_only));
    tu_tcase(s, "tensor", 0, NULL, NULL, TU_TESTS(
        test_tensor_alloc_is_aligned_and_zeroed,
        test_aligned_alloc_large_blocks,
        test_tensor_scalar_has_one_element,
        test_shape_rejects_bad_dims_and_overflow,
        test_shape_format));
    tu_tcase(s, "vars", 0, NULL, NULL, TU_TESTS(
        test_names_validity,
        test_vars_create_find_iterate_in_order,
        test_vars_reject_duplicate_and_bad_shape_naming_them,
        test_slots_keep_pointers_and_shape,
        test_global_step_and_readiness,
        test_grads_cover_trainable_variables_only));
    tu_tcase(s, "fsutil", 0, tu_setup, tu_teardown, TU_TESTS(
        test_atomic_write_replaces_whole_file,
        test_atomic_write_failure_keeps_old_file_and_no_temp,
        test_read_all_bounds_and_errors,
        test_mkdirs_and_path_join,
        test_parse_numbers));
    tu_tcase(s, "grow", 0, NULL, NULL, TU_TESTS(
        test_grow_doubles_and_keeps_the_array_on_failure));
    return s;
}

KEEL_TEST_MAIN(core_suite)
