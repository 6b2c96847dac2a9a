/* check_cluster.c - the cluster module: TF_CONFIG rules (good and bad,
 * every problem listed), Slurm host lists and rank mapping, explicit lists,
 * wire encode/decode and every malformed-message class, a live ROUTER
 * server that keeps serving one client while another sends garbage, CURVE
 * allow/deny on real sockets, and `keel keygen`. */
#include <config.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <keel/keel.h>
#include "util.h"
#include "../cluster/cluster_int.h"
#include "../cluster/role_int.h"
#include "../numeric/numeric_int.h"
#include "ps_skel.h"
#include <keel/distributed.h>
#include "testutil.h"

static char out[65536], err[65536];

/* ---- helpers ------------------------------------------------------------ */

/* Parse json expecting failure; the message must contain every needle. */
static void
expect_bad(const char *json, const char *const *needles)
{
    keel_cluster_spec *s = (keel_cluster_spec *)1;
    keel_status st = keel_cluster_spec_from_tf_config(json, &s);
    ck_assert_msg(st == KEEL_EINVAL, "accepted %s", json);
    ck_assert_ptr_null(s);
    for (; *needles != NULL; needles++)
        ck_assert_msg(strstr(keel_last_error(), *needles) != NULL,
                      "for %s: '%s' lacks '%s'", json, keel_last_error(),
                      *needles);
}
#define BAD(json, ...)                                                     \
    do {                                                                   \
        const char *const nd_[] = { __VA_ARGS__, NULL };                   \
        expect_bad(json, nd_);                                             \
    } while (0)

static keel_cluster_spec *
good(const char *json)
{
    keel_cluster_spec *s = NULL;
    keel_status st = keel_cluster_spec_from_tf_config(json, &s);
    ck_assert_msg(st == KEEL_OK, "%s rejected: %s", json, keel_last_error());
    return s;
}

/* ---- TF_CONFIG ---------------------------------------------------------- */

START_TEST(test_tf_config_full_cluster_reads_every_job_and_the_task)
{
    keel_cluster_spec *s = good(
        "{\"cluster\": {\"chief\": [\"host0:2222\"],"
        " \"worker\": [\"host1:2222\", \"host2:2222\"],"
        " \"ps\": [\"host3:2222\"], \"evaluator\": [\"host4:2222\"]},"
        " \"task\": {\"type\": \"worker\", \"index\": 1},"
        " \"rpc_layer\": \"grpc\", \"environment\": \"cloud\","
        " \"model_dir\": \"/runs/r1\"}");
    ck_assert_int_eq(keel_cluster_spec_num_tasks(s, KEEL_TASK_CHIEF), 1);
    ck_assert_int_eq(keel_cluster_spec_num_tasks(s, KEEL_TASK_WORKER), 2);
    ck_assert_int_eq(keel_cluster_spec_num_tasks(s, KEEL_TASK_PS), 1);
    ck_assert_int_eq(keel_cluster_spec_num_tasks(s, KEEL_TASK_EVALUATOR), 1);
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 1),
                     "host2:2222");
    ck_assert_ptr_null(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 2));
    ck_assert_int_eq(keel_cluster_spec_task_type(s), KEEL_TASK_WORKER);
    ck_assert_int_eq(keel_cluster_spec_task_index(s), 1);
    ck_assert(!keel_cluster_spec_is_chief(s));
    ck_assert(!keel_cluster_spec_is_local(s));
    ck_assert_int_eq(keel_cluster_spec_num_replicas(s), 3);
    ck_assert_int_eq(keel_cluster_spec_replicas_to_aggregate(s), 3);
    ck_assert_int_eq(keel_cluster_spec_total_num_replicas(s), 3);
    ck_assert_int_eq(keel_cluster_spec_mode(s), KEEL_CLUSTER_SYNC);
    ck_assert_str_eq(keel_cluster_spec_model_dir(s), "/runs/r1");
    keel_cluster_spec_free(s);
}
END_TEST

START_TEST(test_tf_config_master_is_chief_and_keel_keys_are_read)
{
    keel_cluster_spec *s = good(
        "{\"cluster\": {\"master\": [\"m:1\"], \"worker\": [\"w:1\"]},"
        " \"task\": {\"type\": \"master\", \"index\": 0}, \"mode\": \"async\","
        " \"replicas_to_aggregate\": 1, \"total_num_replicas\": 2}");
    ck_assert_int_eq(keel_cluster_spec_num_tasks(s, KEEL_TASK_CHIEF), 1);
    ck_assert_int_eq(keel_cluster_spec_task_type(s), KEEL_TASK_CHIEF);
    ck_assert(keel_cluster_spec_is_chief(s));
    ck_assert_int_eq(keel_cluster_spec_mode(s), KEEL_CLUSTER_ASYNC);
    ck_assert_int_eq(keel_cluster_spec_replicas_to_aggregate(s), 1);
    ck_assert_int_eq(keel_cluster_spec_total_num_replicas(s), 2);
    keel_cluster_spec_free(s);
}
END_TEST

START_TEST(test_tf_config_without_chief_worker_0_is_chief)
{
#define FMT "{\"cluster\": {\"worker\": [\"a:1\", \"b:1\"]," \
            " \"ps\": [\"c:1\"]}, \"task\": {\"type\": \"%s\"," \
            " \"index\": %d}}"
    char json[256];
    keel_cluster_spec *s;
    snprintf(json, sizeof json, FMT, "worker", 0);
    s = good(json);
    ck_assert(keel_cluster_spec_is_chief(s));
    keel_cluster_spec_free(s);
    snprintf(json, sizeof json, FMT, "worker", 1);
    s = good(json);
    ck_assert(!keel_cluster_spec_is_chief(s));
    keel_cluster_spec_free(s);
    snprintf(json, sizeof json, FMT, "ps", 0);
    s = good(json);
    ck_assert(!keel_cluster_spec_is_chief(s));
    keel_cluster_spec_free(s);
#undef FMT
}
END_TEST

START_TEST(test_tf_config_evaluator_is_outside_the_training_cluster)
{
    keel_cluster_spec *s = good(
        "{\"cluster\": {\"chief\": [\"a:1\"], \"worker\": [\"b:1\"]},"
        " \"task\": {\"type\": \"evaluator\", \"index\": 0}}");
    ck_assert_int_eq(keel_cluster_spec_task_type(s), KEEL_TASK_EVALUATOR);
    ck_assert(!keel_cluster_spec_is_chief(s));
    ck_assert_int_eq(keel_cluster_spec_num_replicas(s), 2);
    keel_cluster_spec_free(s);
    BAD("{\"cluster\": {\"chief\": [\"a:1\"]},"
        " \"task\": {\"type\": \"evaluator\", \"index\": 1}}",
        "evaluator index 1 out of range");
    BAD("{\"cluster\": {\"chief\": [\"a:1\"], \"evaluator\": [\"e:1\","
        " \"f:1\"]}, \"task\": {\"type\": \"chief\", \"index\": 0}}",
        "2 evaluator tasks");
}
END_TEST

START_TEST(test_tf_config_local_mode)
{
    keel_cluster_spec *s = good("{}");
    ck_assert(keel_cluster_spec_is_local(s));
    ck_assert(keel_cluster_spec_is_chief(s));
    ck_assert_int_eq(keel_cluster_spec_num_replicas(s), 1);
    keel_cluster_spec_free(s);
    s = good("{\"task\": {\"type\": \"worker\", \"index\": 0}}");
    ck_assert(keel_cluster_spec_is_local(s));
    keel_cluster_spec_free(s);
    BAD("{\"task\": {\"type\": \"ps\", \"index\": 0}}", "local mode");
    BAD("{\"task\": {\"type\": \"worker\", \"index\": 3}}", "local mode");
}
END_TEST

/* The replica index: the chief 0, then the workers in order (worker 0 is
 * replica 0 when there is no chief job); ps and evaluator -1; alone 0. */
START_TEST(test_replica_index_counts_the_chief_first)
{
#define CHIEF_2W "\"chief\": [\"a:1\"], \"worker\": [\"b:1\", \"c:1\"]"
#define ONLY_2W "\"worker\": [\"b:1\", \"c:1\"], \"ps\": [\"p:1\"]"
#define WITH_EVAL "\"chief\": [\"a:1\"], \"evaluator\": [\"e:1\"]"
    static const struct {
        const char *cluster, *type;
        int index, replica;
    } cases[] = {
        { CHIEF_2W, "chief", 0, 0 },
        { CHIEF_2W, "worker", 0, 1 },
        { CHIEF_2W, "worker", 1, 2 },
        { ONLY_2W, "worker", 0, 0 },
        { ONLY_2W, "worker", 1, 1 },
        { ONLY_2W, "ps", 0, -1 },
        { WITH_EVAL, "evaluator", 0, -1 },
    };
#undef CHIEF_2W
#undef ONLY_2W
#undef WITH_EVAL
    char json[256];
    keel_cluster_spec *s;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(json, sizeof json, "{\"cluster\": {%s}, \"task\": "
                 "{\"type\": \"%s\", \"index\": %d}}", cases[i].cluster,
                 cases[i].type, cases[i].index);
        s = good(json);
        ck_assert_msg(keel_cluster_spec_replica_index(s) == cases[i].replica,
                      "%s: replica %d, want %d", json,
                      keel_cluster_spec_replica_index(s), cases[i].replica);
        keel_cluster_spec_free(s);
    }
    s = good("{}");
    ck_assert_int_eq(keel_cluster_spec_replica_index(s), 0);
    keel_cluster_spec_free(s);
    ck_assert_int_eq(keel_cluster_spec_replica_index(NULL), 0);
}
END_TEST

START_TEST(test_tf_config_sparse_jobs_are_ordered_and_must_be_dense)
{
    keel_cluster_spec *s = good(
        "{\"cluster\": {\"worker\": {\"1\": \"w1:1\", \"0\": \"w0:1\"}},"
        " \"task\": {\"type\": \"worker\", \"index\": 1}}");
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 0),
                     "w0:1");
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 1),
                     "w1:1");
    keel_cluster_spec_free(s);
    BAD("{\"cluster\": {\"worker\": {\"0\": \"a:1\", \"5\": \"b:1\"}},"
        " \"task\": {\"type\": \"worker\", \"index\": 0}}",
        "key '5' is not an index");
    BAD("{\"cluster\": {\"worker\": {\"0\": 7}},"
        " \"task\": {\"type\": \"worker\", \"index\": 0}}",
        "is not a string");
}
END_TEST

START_TEST(test_tf_config_each_bad_input_is_named)
{
    const char *task = "\"task\": {\"type\": \"worker\", \"index\": 0}";
    char j[512];
    BAD("[1, 2]", "not a JSON object");
    BAD("\"cluster\"", "not a JSON object");
    BAD("{\"cluster\": ", "not valid JSON");
    BAD("{} trailing", "not valid JSON");
    BAD("", "not valid JSON");
    snprintf(j, sizeof j, "{\"cluster\": [\"a:1\"], %s}", task);
    BAD(j, "'cluster' is not an object");
    snprintf(j, sizeof j, "{\"cluster\": {\"worker\": \"a:1\"}, %s}", task);
    BAD(j, "cluster.worker is not a list");
    snprintf(j, sizeof j, "{\"cluster\": {\"worker\": [\"a:1\", 5]}, %s}",
             task);
    BAD(j, "cluster.worker[1] is not a string");
    snprintf(j, sizeof j, "{\"cluster\": {\"worker\": [\"a:1\"], "
             "\"trainer\": [\"b:1\"]}, %s}", task);
    BAD(j, "unknown task type 'trainer'");
    BAD("{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": "
        "\"boss\", \"index\": 0}}", "unknown task.type 'boss'");
    BAD("{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": 3, "
        "\"index\": 0}}", "task.type is not a string");
    BAD("{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": "
        "\"worker\", \"index\": \"0\"}}", "task.index is not an integer");
    BAD("{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": "
        "\"worker\", \"index\": -1}}", "negative");
    BAD("{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": "
        "\"worker\", \"index\": 1}}", "task index 1 out of range for 'worker'");
    BAD("{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": "
        "\"ps\", \"index\": 0}}", "task type 'ps' has no job");
    BAD("{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"index\": 0}}",
        "task.type is missing");
    BAD("{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": "
        "\"worker\"}}", "task.index is missing");
    BAD("{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": 1}",
        "'task' is not an object");
    BAD("{\"cluster\": {\"worker\": [\"a:1\"]}}", "'task' is missing");
    snprintf(j, sizeof j, "{\"cluster\": {\"worker\": [\"a:1\"], \"ps\": "
             "[\"a:1\"]}, %s}", task);
    BAD(j, "duplicate address 'a:1'");
    /* a key given twice would keep only its last value (json-c's rule):
     * a job, a sparse index (also spelt with an escape), a task member */
    BAD("{\"cluster\": {\"worker\": [\"a:1\"], \"worker\": [\"b:1\"]}, "
        "\"task\": {\"type\": \"worker\", \"index\": 0}}",
        "cluster job 'worker' given twice");
    BAD("{\"cluster\": {\"worker\": {\"0\": \"a:1\", \"\\u0030\": \"b:1\"}}, "
        "\"task\": {\"type\": \"worker\", \"index\": 0}}",
        "cluster.worker index 0 given twice");
    BAD("{\"cluster\": {\"worker\": [\"a:1\", \"b:1\"]}, \"task\": "
        "{\"type\": \"worker\", \"index\": 0, \"index\": 1}}",
        "task.index given twice");
    BAD("{\"cluster\": {\"worker\": [\"a:1\"]}, \"cluster\": {}, "
        "\"task\": {\"type\": \"worker\", \"index\": 0}}",
        "key 'cluster' given twice");
    snprintf(j, sizeof j, "{\"cluster\": {\"chief\": [\"c:1\"], \"master\": "
             "[\"m:1\"]}, \"task\": {\"type\": \"chief\", \"index\": 0}}");
    BAD(j, "both 'chief' and 'master'");
    snprintf(j, sizeof j, "{\"cluster\": {\"chief\": [\"c:1\", \"d:1\"]}, "
             "\"task\": {\"type\": \"chief\", \"index\": 0}}");
    BAD(j, "2 chief tasks");
    snprintf(j, sizeof j, "{\"cluster\": {\"ps\": [\"p:1\"]}, "
             "\"task\": {\"type\": \"ps\", \"index\": 0}}");
    BAD(j, "no chief or worker");
    /* one worker address, then one extra key beside a good cluster */
    static const struct { const char *addr, *why; } addrs[] = {
        { "", "worker[0]: empty address" },
        { "a:0", "port 0 out of 1..65535" },
        { "a:65536", "port 65536 out of 1..65535" },
        { "a:http", "bad port" },
        { "a", "has no ':port'" },
        { ":2222", "empty host" },
        { "a b:1", "bad host character" },
        { "a:", "empty port" },
    };
    static const struct { const char *key, *why; } extras[] = {
        { "\"mode\": \"eventual\"", "mode must be" },
        { "\"replicas_to_aggregate\": 0", "replicas_to_aggregate must be" },
        { "\"total_num_replicas\": \"2\"", "total_num_replicas must be" },
    };
    for (size_t i = 0; i < sizeof addrs / sizeof addrs[0]; i++) {
        snprintf(j, sizeof j, "{\"cluster\": {\"worker\": [\"%s\"]}, %s}",
                 addrs[i].addr, task);
        BAD(j, addrs[i].why);
    }
    for (size_t i = 0; i < sizeof extras / sizeof extras[0]; i++) {
        snprintf(j, sizeof j, "{\"cluster\": {\"worker\": [\"a:1\"]}, %s, "
                 "%s}", task, extras[i].key);
        BAD(j, extras[i].why);
    }
    snprintf(j, sizeof j, "{\"model_dir\": \"\"}");
    BAD(j, "model_dir must be");
}
END_TEST

START_TEST(test_tf_config_lists_every_problem_at_once)
{
    BAD("{\"cluster\": {\"chief\": [\"c:1\"], \"master\": [\"m:1\"],"
        " \"worker\": [\"w:0\", \"c:1\"], \"bogus\": [\"x:1\"]},"
        " \"task\": {\"type\": \"worker\", \"index\": 9}}",
        "6 problems", "unknown task type 'bogus'", "both 'chief' and "
        "'master'", "port 0", "duplicate address 'c:1'", "2 chief tasks",
        "task index 9 out of range");
}
END_TEST

START_TEST(test_tf_config_size_is_bounded)
{
    size_t n = (size_t)KEEL_TF_CONFIG_MAX + 16;
    char *big = malloc(n + 1);
    keel_cluster_spec *s = NULL;
    ck_assert_ptr_nonnull(big);
    memset(big, ' ', n);
    big[0] = '{';
    big[n - 1] = '}';
    big[n] = '\0';
    ck_assert_int_eq(keel_cluster_spec_from_tf_config(big, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "longer than"));
    big[KEEL_TF_CONFIG_MAX - 1] = '}';
    big[KEEL_TF_CONFIG_MAX] = '\0';
    ck_assert_int_eq(keel_cluster_spec_from_tf_config(big, &s), KEEL_OK);
    keel_cluster_spec_free(s);
    free(big);
    /* nesting depth is bounded too */
    {
        char deep[200];
        memset(deep, '[', 100);
        memset(deep + 100, ']', 99);
        deep[199] = '\0';
        ck_assert_int_eq(keel_cluster_spec_from_tf_config(deep, &s),
                         KEEL_EINVAL);
    }
}
END_TEST

START_TEST(test_tf_config_from_env)
{
    keel_cluster_spec *s = NULL;
    unsetenv("TF_CONFIG");
    ck_assert_int_eq(keel_cluster_spec_from_env(&s), KEEL_OK);
    ck_assert(keel_cluster_spec_is_local(s));
    keel_cluster_spec_free(s);
    setenv("TF_CONFIG", "{\"cluster\": {\"worker\": [\"a:1\", \"b:2\"]}, "
           "\"task\": {\"type\": \"worker\", \"index\": 1}}", 1);
    ck_assert_int_eq(keel_cluster_spec_from_env(&s), KEEL_OK);
    ck_assert_int_eq(keel_cluster_spec_task_index(s), 1);
    keel_cluster_spec_free(s);
    setenv("TF_CONFIG", "{oops", 1);
    ck_assert_int_eq(keel_cluster_spec_from_env(&s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "TF_CONFIG"));
    unsetenv("TF_CONFIG");
}
END_TEST

START_TEST(test_tf_config_generator_round_trips)
{
    keel_cluster_spec *s = good(
        "{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"w0:1\", "
        "\"w1:1\"], \"ps\": [\"p:1\"]}, \"task\": {\"type\": \"chief\", "
        "\"index\": 0}, \"mode\": \"async\", \"replicas_to_aggregate\": 2}");
    char buf[1024];
    keel_task_type types[] = { KEEL_TASK_CHIEF, KEEL_TASK_WORKER,
                               KEEL_TASK_WORKER, KEEL_TASK_PS };
    int idx[] = { 0, 0, 1, 0 };
    for (int i = 0; i < 4; i++) {
        keel_cluster_spec *b;
        ck_assert_int_eq(keel_cluster_spec_to_tf_config(s, types[i], idx[i],
                                                         buf, sizeof buf),
                         KEEL_OK);
        b = good(buf);
        ck_assert_int_eq(keel_cluster_spec_task_type(b), types[i]);
        ck_assert_int_eq(keel_cluster_spec_task_index(b), idx[i]);
        ck_assert_int_eq(keel_cluster_spec_mode(b), KEEL_CLUSTER_ASYNC);
        ck_assert_int_eq(keel_cluster_spec_replicas_to_aggregate(b), 2);
        for (int t = KEEL_TASK_CHIEF; t < KEEL_TASK_TYPE_COUNT; t++) {
            size_t n = keel_cluster_spec_num_tasks(s, (keel_task_type)t);
            ck_assert_int_eq(keel_cluster_spec_num_tasks(b, (keel_task_type)t),
                             n);
            for (size_t k = 0; k < n; k++)
                ck_assert_str_eq(
                    keel_cluster_spec_address(b, (keel_task_type)t, (int)k),
                    keel_cluster_spec_address(s, (keel_task_type)t, (int)k));
        }
        keel_cluster_spec_free(b);
    }
    ck_assert_int_eq(keel_cluster_spec_to_tf_config(s, KEEL_TASK_WORKER, 2,
                                                    buf, sizeof buf),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "no task worker 2"));
    ck_assert_int_eq(keel_cluster_spec_to_tf_config(s, KEEL_TASK_PS, 0,
                                                    buf, 20), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "buffer"));
    keel_cluster_spec_free(s);
}
END_TEST

/* SyncReplicas counts are checked against the replicas that exist (chief
 * + workers): too many to aggregate, or a total that is not the cluster's,
 * is named with both numbers; async and local specs carry them unused. */
START_TEST(test_tf_config_replica_counts_must_fit_the_cluster)
{
    const char *two = "{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": "
                      "[\"w:1\"], \"ps\": [\"p:1\"]}, \"task\": {\"type\": "
                      "\"worker\", \"index\": 0}";
    char j[512];
    keel_cluster_spec *s;
    snprintf(j, sizeof j, "%s, \"replicas_to_aggregate\": 3}", two);
    BAD(j, "replicas_to_aggregate 3 is more than the 2 training replicas",
        "(the chief and 1 worker)");
    snprintf(j, sizeof j, "%s, \"total_num_replicas\": 3}", two);
    BAD(j, "total_num_replicas 3 does not match the 2 training replicas");
    snprintf(j, sizeof j, "%s, \"total_num_replicas\": 1}", two);
    BAD(j, "total_num_replicas 1 does not match");
    /* both at once, and rta within but total wrong */
    snprintf(j, sizeof j, "%s, \"replicas_to_aggregate\": 5, "
             "\"total_num_replicas\": 5}", two);
    BAD(j, "2 problems", "replicas_to_aggregate 5", "total_num_replicas 5");
    /* fits: one backup (rta 1 of 2), total given as the cluster's */
    snprintf(j, sizeof j, "%s, \"replicas_to_aggregate\": 1, "
             "\"total_num_replicas\": 2}", two);
    s = good(j);
    ck_assert_int_eq(keel_cluster_spec_replicas_to_aggregate(s), 1);
    ck_assert_int_eq(keel_cluster_spec_total_num_replicas(s), 2);
    keel_cluster_spec_free(s);
    /* async aggregates nothing: the counts are not checked */
    snprintf(j, sizeof j, "%s, \"mode\": \"async\", "
             "\"replicas_to_aggregate\": 3}", two);
    keel_cluster_spec_free(good(j));
    /* set through the API (the INI path) the same */
    s = good("{\"cluster\": {\"worker\": [\"a:1\", \"b:1\", \"c:1\"]}, "
             "\"task\": {\"type\": \"worker\", \"index\": 2}}");
    keel_cluster_spec_set_replicas(s, 4, 0);
    ck_assert_int_eq(keel_cluster_spec_validate(s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "replicas_to_aggregate 4 is more than the 3 "
                                 "training replicas of the cluster (3 "
                                 "workers)"));
    keel_cluster_spec_set_replicas(s, 2, 3);
    ck_assert_int_eq(keel_cluster_spec_validate(s), KEEL_OK);
    keel_cluster_spec_free(s);
}
END_TEST

START_TEST(test_format_summarises_the_cluster)
{
    keel_cluster_spec *s = good(
        "{\"cluster\": {\"worker\": [\"w0:1\", \"w1:1\"], \"ps\": [\"p:1\"],"
        " \"evaluator\": [\"e:1\"]}, \"task\": {\"type\": \"worker\", "
        "\"index\": 1}}");
    char buf[2048], small[16];
    ck_assert_int_eq(keel_cluster_spec_format(s, buf, sizeof buf), KEEL_OK);
    ck_assert_ptr_nonnull(strstr(buf, "0 chief, 2 workers, 1 ps, 1 "
                                      "evaluator"));
    ck_assert_ptr_nonnull(strstr(buf, "w1:1  <- this task"));
    ck_assert_ptr_nonnull(strstr(buf, "chief: worker 0 (no chief job)"));
    ck_assert_ptr_nonnull(strstr(buf, "not in the training cluster"));
    ck_assert_ptr_nonnull(strstr(buf, "mode: sync, replicas_to_aggregate 2"));
    ck_assert_int_eq(keel_cluster_spec_format(s, small, sizeof small),
                     KEEL_EINVAL);
    keel_cluster_spec_free(s);
}
END_TEST

/* ---- explicit lists ----------------------------------------------------- */

START_TEST(test_explicit_lists_from_ini_values)
{
    keel_cluster_spec *s;
    char bind[128];
    s = tu_spec_from_lists("127.0.0.1:2222, 127.0.0.1:2223",
                           "h1:3000,h2:3000", "[::1]:4000", KEEL_TASK_PS, 1);
    ck_assert_int_eq(keel_cluster_spec_validate(s), KEEL_OK);
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_PS, 1),
                     "127.0.0.1:2223");
    ck_assert_int_eq(keel__cluster_bind_endpoints(s, KEEL_TASK_PS, 1, NULL,
                                                  KEEL_LOCAL_TRANSPORT_TCP,
                                                  bind, sizeof bind),
                     KEEL_OK);
    ck_assert_str_eq(bind, "tcp://127.0.0.1:2223");
    ck_assert_int_eq(keel__cluster_bind_endpoints(s, KEEL_TASK_PS, 2, NULL,
                                                  KEEL_LOCAL_TRANSPORT_TCP,
                                                  bind, sizeof bind),
                     KEEL_EINVAL);
    ck_assert_int_eq(keel_cluster_spec_set_task(s, KEEL_TASK_NONE, 0),
                     KEEL_EINVAL);
    keel_cluster_spec_free(s);

    s = tu_spec_from_lists(NULL, "a:1,,b:0,a:1", NULL, KEEL_TASK_WORKER,
                           7);
    keel_cluster_spec_set_replicas(s, -1, 0);
    ck_assert_int_eq(keel_cluster_spec_validate(s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "5 problems"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "worker[1]: empty"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "port 0"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "duplicate address 'a:1'"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "task index 7"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "replicas_to_aggregate"));
    keel_cluster_spec_free(s);

    /* A wildcard is no address: only cluster.bind_address binds one. */
    s = tu_spec_from_lists(NULL, "*:5000", NULL, KEEL_TASK_WORKER, 0);
    ck_assert_int_eq(keel_cluster_spec_validate(s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "wildcard"));
    keel_cluster_spec_free(s);
    s = tu_spec_from_lists("127.0.0.1:5000", "127.0.0.1:5001", NULL,
                           KEEL_TASK_PS, 0);
    ck_assert_int_eq(keel__cluster_bind_endpoints(s, KEEL_TASK_PS, 0, "*",
                                                  KEEL_LOCAL_TRANSPORT_TCP,
                                                  bind, sizeof bind),
                     KEEL_OK);
    ck_assert_str_eq(bind, "tcp://*:5000");
    keel_cluster_spec_free(s);
}
END_TEST

/* A host is a name, an IPv4 address or a bracketed IPv6 address. */
START_TEST(test_addresses_are_names_ipv4_or_bracketed_ipv6)
{
    const char *good[] = { "[::1]:2222", "[fd00::2]:1", "[::ffff:1.2.3.4]:9",
                           "job-ps-0.ns.svc:2222", "10.0.0.1:65535",
                           "node07:8888", "h_1:1" };
    const char *bad[] = { "::1:2222", "[::1]", "[]:1", "[1:2:3]:1",
                          "[::g]:1", "[::1]2222", "*:1", "host", "h:",
                          "h:0", "h:65536", "h o:1", "[fe80::1%eth0]:1" };
    char why[160];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        ck_assert_msg(keel__cluster_check_address(good[i], why, sizeof why),
                      "refused '%s': %s", good[i], why);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(!keel__cluster_check_address(bad[i], why, sizeof why),
                      "accepted '%s'", bad[i]);
    ck_assert(!keel__cluster_check_address("[1:2:3]:1", why, sizeof why));
    ck_assert_ptr_nonnull(strstr(why, "bad IPv6 address"));
    ck_assert_int_eq(keel__cluster_wants_ipv6("tcp://[::1]:1"), 1);
    ck_assert_int_eq(keel__cluster_wants_ipv6("tcp://127.0.0.1:1"), 0);
    ck_assert_int_eq(keel__cluster_wants_ipv6("tcp://localhost:1"), 0);
}
END_TEST

/* TF_CONFIG as the TFJob operator writes it: lower-case job names, one
 * service name per task, "environment": "cloud", the evaluator in the
 * cluster; "rpc_layer" and other members keel does not read are ignored
 * (keys given twice inside them too); its sparse form is refused by
 * name. */
START_TEST(test_tf_config_as_the_tfjob_operator_writes_it)
{
    keel_cluster_spec *s = NULL;
    const char *job =
        "{\"cluster\":{\"chief\":[\"mnist-chief-0.team.svc:2222\"],"
        "\"evaluator\":[\"mnist-evaluator-0.team.svc:2222\"],"
        "\"ps\":[\"mnist-ps-0.team.svc:2222\",\"mnist-ps-1.team.svc:2222\"],"
        "\"worker\":[\"mnist-worker-0.team.svc.cluster.local:2222\"]},"
        "\"task\":{\"type\":\"ps\",\"index\":1},"
        "\"environment\":\"cloud\",\"rpc_layer\":\"grpc\","
        "\"extra\":{\"a\":1,\"a\":[{\"b\":1,\"b\":2}]}}";
    const char *v6 =
        "{\"cluster\":{\"ps\":[\"[fd00::10]:2222\"],"
        "\"worker\":[\"[fd00::11]:2222\",\"10.1.2.3:2222\"]},"
        "\"task\":{\"type\":\"worker\",\"index\":1},"
        "\"environment\":\"cloud\"}";
    const char *sparse =
        "{\"sparseCluster\":{\"worker\":{\"1\":\"w-1.ns.svc:2222\"},"
        "\"ps\":[\"p-0.ns.svc:2222\"]},"
        "\"task\":{\"type\":\"worker\",\"index\":1}}";
    ck_assert_int_eq(keel_cluster_spec_from_tf_config(job, &s), KEEL_OK);
    ck_assert_int_eq(keel_cluster_spec_num_tasks(s, KEEL_TASK_PS), 2);
    ck_assert_int_eq(keel_cluster_spec_num_tasks(s, KEEL_TASK_CHIEF), 1);
    ck_assert_int_eq(keel_cluster_spec_num_tasks(s, KEEL_TASK_EVALUATOR), 1);
    ck_assert_int_eq(keel_cluster_spec_task_type(s), KEEL_TASK_PS);
    ck_assert_int_eq(keel_cluster_spec_task_index(s), 1);
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_PS, 1),
                     "mnist-ps-1.team.svc:2222");
    ck_assert_int_eq(keel_cluster_spec_num_replicas(s), 2);
    keel_cluster_spec_free(s);
    ck_assert_int_eq(keel_cluster_spec_from_tf_config(v6, &s), KEEL_OK);
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 0),
                     "[fd00::11]:2222");
    keel_cluster_spec_free(s);
    ck_assert_int_eq(keel_cluster_spec_from_tf_config(sparse, &s),
                     KEEL_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "enableDynamicWorker"));
}
END_TEST

/* A spec's hosts on this machine: names resolve, two names of one address
 * are one task too many, a ps listens only where its entry resolves here
 * (or where cluster.bind_address says). */
START_TEST(test_check_hosts_names_unresolvable_foreign_and_shared)
{
    keel_cluster_spec *s;
    char bind[KEEL__BIND_ENDPOINTS_MAX];
    s = tu_spec_from_lists("localhost:4100", "127.0.0.1:4101", NULL,
                           KEEL_TASK_PS, 0);
    ck_assert_int_eq(keel_cluster_spec_check_hosts(s, NULL), KEEL_OK);
    ck_assert_int_eq(keel__cluster_bind_endpoints(s, KEEL_TASK_PS, 0, NULL,
                                                  KEEL_LOCAL_TRANSPORT_TCP,
                                                  bind, sizeof bind),
                     KEEL_OK);
    ck_assert_msg(strstr(bind, "tcp://127.0.0.1:4100") != NULL, "%s", bind);
    ck_assert_ptr_null(strstr(bind, "*"));
    ck_assert_int_eq(keel__cluster_bind_endpoints(s, KEEL_TASK_PS, 0, "lo",
                                                  KEEL_LOCAL_TRANSPORT_TCP,
                                                  bind, sizeof bind),
                     KEEL_OK);
    ck_assert_msg(strstr(bind, "tcp://127.0.0.1:4100") != NULL, "%s", bind);
    ck_assert_int_eq(keel__cluster_bind_endpoints(s, KEEL_TASK_PS, 0,
                                                  "no-such-if0",
                                                  KEEL_LOCAL_TRANSPORT_TCP,
                                                  bind, sizeof bind),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "no-such-if0"));
    keel_cluster_spec_free(s);

    s = tu_spec_from_lists("localhost:4100", "127.0.0.1:4100", NULL,
                           KEEL_TASK_WORKER, 0);
    ck_assert_int_eq(keel_cluster_spec_validate(s), KEEL_OK);
    ck_assert_int_eq(keel_cluster_spec_check_hosts(s, NULL), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "one address"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "ps 0"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "worker 0"));
    keel_cluster_spec_free(s);

    s = tu_spec_from_lists("no-such-host.invalid:4100", "127.0.0.1:4101",
                           NULL, KEEL_TASK_WORKER, 0);
    ck_assert_int_eq(keel_cluster_spec_check_hosts(s, NULL), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "ps 0"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "no-such-host.invalid"));
    keel_cluster_spec_free(s);

    /* A name that does not resolve yet is waited for (up to the deadline,
     * then the same error, saying how long); any other problem is not. */
    s = tu_spec_from_lists("no-such-host.invalid:4100", "127.0.0.1:4101",
                           NULL, KEEL_TASK_WORKER, 0);
    {
        int64_t t0 = keel__now_mono_ns();
        ck_assert_int_eq(keel_cluster_spec_wait_hosts(s, NULL, 1.5),
                         KEEL_EINVAL);
        ck_assert_int_ge(keel__now_mono_ns() - t0, 1000000000LL);
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "still unresolved"));
        ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                     "no-such-host.invalid"));
    }
    keel_cluster_spec_free(s);
    s = tu_spec_from_lists("localhost:4100", "127.0.0.1:4100", NULL,
                           KEEL_TASK_WORKER, 0);
    {
        int64_t t0 = keel__now_mono_ns();
        ck_assert_int_eq(keel_cluster_spec_wait_hosts(s, NULL, 60),
                         KEEL_EINVAL);
        ck_assert_int_lt(keel__now_mono_ns() - t0, 5000000000LL);
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "one address"));
    }
    keel_cluster_spec_free(s);

    s = tu_spec_from_lists("198.51.100.7:4100", "127.0.0.1:4101", NULL,
                           KEEL_TASK_PS, 0);
    ck_assert_int_eq(keel_cluster_spec_check_hosts(s, NULL), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "198.51.100.7"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "no address of this "
                                                    "machine"));
    ck_assert_int_eq(keel_cluster_spec_check_hosts(s, "*"), KEEL_OK);
    keel_cluster_spec_set_task(s, KEEL_TASK_WORKER, 0);  /* binds nothing */
    ck_assert_int_eq(keel_cluster_spec_check_hosts(s, NULL), KEEL_OK);
    keel_cluster_spec_free(s);
}
END_TEST

/* ---- Slurm -------------------------------------------------------------- */

static void
expect_hosts(const char *list, const char *const *want)
{
    char buf[4096];
    size_t n = 0, k = 0;
    const char *h = buf;
    ck_assert_msg(keel_cluster_expand_hostlist(list, buf, sizeof buf, &n) ==
                  KEEL_OK, "%s: %s", list, keel_last_error());
    for (; want[k] != NULL; k++, h += strlen(h) + 1) {
        ck_assert_msg(k < n, "%s: only %zu hosts", list, n);
        ck_assert_str_eq(h, want[k]);
    }
    ck_assert_int_eq(n, k);
}
#define HOSTS(list, ...)                                                   \
    do {                                                                   \
        const char *const w_[] = { __VA_ARGS__, NULL };                    \
        expect_hosts(list, w_);                                            \
    } while (0)

START_TEST(test_slurm_hostlist_expansion)
{
    char buf[256];
    size_t n;
    const char *bad[] = { "", "n[", "n]", "n[3-1]", "n[]", "n[1-2", "a,,b",
                          "n[a-b]", "n[1,]", "a,", "n[1-2]]", "n[[1]]",
                          "n;1", "n[-3]", "n[1-]" };
    HOSTS("node[01-04,07],gpu2", "node01", "node02", "node03", "node04",
          "node07", "gpu2");
    HOSTS("n[1-2],m5,o[3-4,6,7-9]", "n1", "n2", "m5", "o3", "o4", "o6", "o7",
          "o8", "o9");
    HOSTS("host", "host");
    HOSTS("r[1-2]n[08-09]", "r1n08", "r1n09", "r2n08", "r2n09");
    HOSTS("n[9-11]", "n9", "n10", "n11");
    HOSTS("n[009-011]x", "n009x", "n010x", "n011x");
    HOSTS("host-[1-3]", "host-1", "host-2", "host-3");
    HOSTS("gpu-a[1-2].rack-[7,9]", "gpu-a1.rack-7", "gpu-a1.rack-9",
          "gpu-a2.rack-7", "gpu-a2.rack-9");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        ck_assert_msg(keel_cluster_expand_hostlist(bad[i], buf, sizeof buf,
                                                   &n) == KEEL_EINVAL,
                      "accepted '%s'", bad[i]);
    ck_assert_int_eq(keel_cluster_expand_hostlist("n[1-100000]", buf,
                                                  sizeof buf, &n),
                     KEEL_EINVAL);
    ck_assert_int_eq(keel_cluster_expand_hostlist("n[1-200]", buf, 64, &n),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "bytes"));
}
END_TEST

START_TEST(test_slurm_ranks_map_to_ps_then_workers)
{
    char *env[] = { "SLURM_PROCID=3", "SLURM_NTASKS=4",
                    "SLURM_JOB_NODELIST=node[1-2]",
                    "SLURM_TASKS_PER_NODE=2(x2)", NULL };
    keel_cluster_slurm_config o = { .struct_size = sizeof o, .num_ps = 1,
                                     .port_base = 9000, .env = env };
    keel_cluster_spec *s = NULL;
    ck_assert_int_eq(keel_cluster_spec_from_slurm(&o, &s), KEEL_OK);
    ck_assert_int_eq(keel_cluster_spec_num_tasks(s, KEEL_TASK_PS), 1);
    ck_assert_int_eq(keel_cluster_spec_num_tasks(s, KEEL_TASK_WORKER), 3);
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_PS, 0),
                     "node1:9000");
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 0),
                     "node1:9001");
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 1),
                     "node2:9000");
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 2),
                     "node2:9001");
    ck_assert_int_eq(keel_cluster_spec_task_type(s), KEEL_TASK_WORKER);
    ck_assert_int_eq(keel_cluster_spec_task_index(s), 2);
    ck_assert(!keel_cluster_spec_is_chief(s));
    keel_cluster_spec_free(s);

    env[0] = "SLURM_PROCID=1";      /* worker 0: the chief */
    ck_assert_int_eq(keel_cluster_spec_from_slurm(&o, &s), KEEL_OK);
    ck_assert_int_eq(keel_cluster_spec_task_type(s), KEEL_TASK_WORKER);
    ck_assert(keel_cluster_spec_is_chief(s));
    keel_cluster_spec_free(s);

    /* No tasks-per-node: block distribution, default port 8888. */
    {
        char *e2[] = { "SLURM_PROCID=0", "SLURM_STEP_NUM_TASKS=3",
                       "SLURM_STEP_NODELIST=a,b", NULL };
        keel_cluster_slurm_config o2 = { .struct_size = sizeof o2,
                                          .num_ps = 0, .env = e2 };
        ck_assert_int_eq(keel_cluster_spec_from_slurm(&o2, &s), KEEL_OK);
        ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 1),
                         "a:8889");
        ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 2),
                         "b:8888");
        ck_assert(keel_cluster_spec_is_chief(s));
        keel_cluster_spec_free(s);
    }
}
END_TEST

/* Tasks per node in Slurm's compressed form, ports from srun
 * --resv-ports; a node listed twice, a list that does not parse, too few
 * reserved ports and more tasks than the nodes give are errors. */
START_TEST(test_slurm_tasks_per_node_and_reserved_ports)
{
    keel_cluster_spec *s = NULL;
    char *env[] = { "SLURM_PROCID=6", "SLURM_NTASKS=7",
                    "SLURM_JOB_NODELIST=node[01-03,07]",
                    "SLURM_TASKS_PER_NODE=2(x3),1",
                    "SLURM_STEP_RESV_PORTS=12000-12001", NULL };
    keel_cluster_slurm_config o;
    keel_cluster_slurm_config_init(&o);
    o.env = env;
    ck_assert_int_eq(keel_cluster_spec_from_slurm(&o, &s), KEEL_OK);
    ck_assert_int_eq(keel_cluster_spec_num_tasks(s, KEEL_TASK_WORKER), 6);
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_PS, 0),
                     "node01:12000");
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 0),
                     "node01:12001");
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 4),
                     "node03:12001");
    ck_assert_str_eq(keel_cluster_spec_address(s, KEEL_TASK_WORKER, 5),
                     "node07:12000");
    ck_assert_int_eq(keel_cluster_spec_task_index(s), 5);
    keel_cluster_spec_free(s);

    env[4] = "SLURM_STEP_RESV_PORTS=12000";   /* 2 tasks, 1 port */
    ck_assert_int_eq(keel_cluster_spec_from_slurm(&o, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "node01 runs 2"));
    env[4] = "SLURM_STEP_RESV_PORTS=12000-";
    ck_assert_int_eq(keel_cluster_spec_from_slurm(&o, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "SLURM_STEP_RESV_PORTS '12000-'"));
    env[4] = NULL;
    env[3] = "SLURM_TASKS_PER_NODE=2(x4)";    /* 8 slots, 7 tasks */
    ck_assert_int_eq(keel_cluster_spec_from_slurm(&o, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "sum to 8"));
    env[3] = "SLURM_TASKS_PER_NODE=2(x3)";    /* 3 counts, 4 nodes */
    ck_assert_int_eq(keel_cluster_spec_from_slurm(&o, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "node list has 4"));
    env[3] = "SLURM_TASKS_PER_NODE=2(x3),1";
    env[2] = "SLURM_JOB_NODELIST=node[01-03,]";
    ck_assert_int_eq(keel_cluster_spec_from_slurm(&o, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "SLURM_JOB_NODELIST"));
    env[2] = "SLURM_JOB_NODELIST=node01,node01,node[02-03]";
    ck_assert_int_eq(keel_cluster_spec_from_slurm(&o, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "duplicate address "
                                                    "'node01:8888'"));
    ck_assert_ptr_null(s);
}
END_TEST

START_TEST(test_slurm_errors_are_named_and_listed_together)
{
    keel_cluster_spec *s = NULL;
    char *none[] = { NULL };
    char *tpn[] = { "SLURM_PROCID=0", "SLURM_NTASKS=4",
                    "SLURM_JOB_NODELIST=n[1-2]", "SLURM_TASKS_PER_NODE=3,2",
                    NULL };
    char *many_ps[] = { "SLURM_PROCID=0", "SLURM_NTASKS=2",
                        "SLURM_JOB_NODELIST=n1", NULL };
    keel_cluster_slurm_config o = { .struct_size = sizeof o, .num_ps = 0,
                                     .env = none };
    ck_assert_int_eq(keel_cluster_spec_from_slurm(&o, &s), KEEL_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "3 problems"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "SLURM_PROCID not set"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "SLURM_NTASKS not set"));
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "SLURM_JOB_NODELIST"));
    o.env = tpn;
    ck_assert_int_eq(keel_cluster_spec_from_slurm(&o, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "sum to 5"));
    o.env = many_ps;
    o.num_ps = 2;
    ck_assert_int_eq(keel_cluster_spec_from_slurm(&o, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "leave no worker"));
}
END_TEST

/* ---- wire: encode / decode ---------------------------------------------- */

static keel__wire_limits no_limits;

START_TEST(test_header_round_trip_keeps_every_field)
{
    keel__wire_header h = { .type = KEEL_MSG_TOKEN, .flags = KEEL_WIRE_F_REPLY,
                            .request_id = 0x0102030405060708ull,
                            .sender_type = KEEL_TASK_PS, .sender_index = 77,
                            .generation = 0xfedcba9876543210ull,
                            .global_step = -5, .local_step = 1ll << 40,
                            .count = 3, .arg = 0xdeadbeef,
                            .peer_generation = 0x1122334455667788ull }, g;
    unsigned char b[KEEL_WIRE_HEADER_SIZE];
    keel__wire_header_encode(&h, b);
    ck_assert(memcmp(b, "KEEL", 4) == 0);
    ck_assert_int_eq(b[4], KEEL_WIRE_VERSION);  /* little endian */
    ck_assert_int_eq(b[5], 0);
    memset(&g, 0, sizeof g);
    ck_assert_int_eq(keel__wire_header_decode(b, sizeof b, &g), KEEL_OK);
    ck_assert_int_eq(g.type, h.type);
    ck_assert_int_eq(g.flags, h.flags);
    ck_assert(g.request_id == h.request_id);
    ck_assert_int_eq(g.sender_type, h.sender_type);
    ck_assert_int_eq(g.sender_index, h.sender_index);
    ck_assert(g.generation == h.generation);
    ck_assert(g.global_step == h.global_step);
    ck_assert(g.local_step == h.local_step);
    ck_assert_int_eq(g.count, h.count);
    ck_assert_uint_eq(g.arg, h.arg);
    ck_assert(g.peer_generation == h.peer_generation);
}
END_TEST


/* A message of one metrics tensor flagged F_METRICS, as the peer sent it
 * (the tensor's data in place: the decoder's view of a frame). */
static void
metrics_msg(keel__wire_msg *m, keel__wire_tensor *wt, uint8_t type,
            const keel__wire_metrics *w)
{
    keel__wire_msg_init(m);
    memset(wt, 0, sizeof *wt);
    snprintf(wt->name, sizeof wt->name, "%s", KEEL__WIRE_METRICS_NAME);
    wt->t = w->t;
    m->h.type = type;
    m->h.flags = KEEL_WIRE_F_METRICS;
    m->tensors = wt;
    m->n = 1;
}

/* The step's metrics from three replicas: pushed, combined in ascending
 * replica order (the sums' bits), answered, decoded by a replica into the
 * totals and each replica's own; a malformed tensor is KEEL_ECORRUPT. */
START_TEST(test_metrics_push_combine_ack_round_trip)
{
    static const double loss[3] = { 0.1, 0.2, 0.3 }, right[3] = { 7, 5, 9 };
    static const double n[3] = { 10, 10, 12 };
    static keel__wire_metrics w;
    static keel__metrics comb, got;
    keel__wire_push_metrics pm[3];
    keel__wire_tensor wt;
    keel__wire_msg m;
    comb.n = 2;
    keel__metrics_combine_begin(&comb);
    for (int r = 0; r < 3; r++) {
        keel__metrics one = { .n = 2 };
        one.sum[0] = loss[r];
        one.sum[1] = right[r];
        one.count[0] = one.count[1] = n[r];
        keel__wire_metrics_push(&one, &w);
        ck_assert_uint_eq(w.t.count, 2 * (1 + 2 * 2));
        metrics_msg(&m, &wt, KEEL_MSG_PUSH, &w);
        ck_assert_int_eq(keel__wire_take_push_metrics(&m, &pm[r]), KEEL_OK);
        ck_assert_uint_eq(m.n, 0);      /* no gradient left behind */
        ck_assert_int_eq(pm[r].n, 2);
        ck_assert(pm[r].sum[0] == loss[r] && pm[r].count[1] == n[r]);
        keel__metrics_combine_add(&comb, r + 4, pm[r].sum, pm[r].count);
    }
    ck_assert(comb.total_sum[0] == (0.1 + 0.2) + 0.3);
    ck_assert(comb.total_sum[1] == 21 && comb.total_count[0] == 32);
    keel__wire_metrics_ack(&comb, &w);
    metrics_msg(&m, &wt, KEEL_MSG_PUSH_ACK, &w);
    got.n = 2;
    ck_assert_int_eq(keel__wire_take_ack_metrics(&m, &got), KEEL_OK);
    ck_assert_int_eq(got.n_combined, 3);
    ck_assert_int_eq(got.n_kept, 3);
    ck_assert(got.total_sum[0] == comb.total_sum[0]);
    ck_assert(got.total_count[1] == 32);
    ck_assert_int_eq(got.replica[2], 6);
    ck_assert(got.rsum[1][0] == 0.2 && got.rcount[2][1] == 12);
    /* a replica with another metric count takes nothing from it */
    metrics_msg(&m, &wt, KEEL_MSG_PUSH_ACK, &w);
    memset(&got, 0, sizeof got);
    got.n = 1;
    ck_assert_int_eq(keel__wire_take_ack_metrics(&m, &got), KEEL_OK);
    ck_assert_int_eq(got.n_combined, 0);
    ck_assert_uint_eq(m.n, 0);
    /* an unflagged message keeps its tensors */
    metrics_msg(&m, &wt, KEEL_MSG_PUSH, &w);
    m.h.flags = 0;
    ck_assert_int_eq(keel__wire_take_push_metrics(&m, &pm[0]), KEEL_OK);
    ck_assert_int_eq(pm[0].n, 0);
    ck_assert_uint_eq(m.n, 1);
    /* the ack's layout sent as a PUSH: its counts do not match */
    metrics_msg(&m, &wt, KEEL_MSG_PUSH, &w);
    ck_assert_int_eq(keel__wire_take_push_metrics(&m, &pm[0]),
                     KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "PUSH metrics"));
    /* a flagged last tensor of another name */
    metrics_msg(&m, &wt, KEEL_MSG_PUSH, &w);
    snprintf(wt.name, sizeof wt.name, "w");
    ck_assert_int_eq(keel__wire_take_push_metrics(&m, &pm[0]),
                     KEEL_ECORRUPT);
    /* a replica index that is no integer */
    {
        double bad = 0.5;
        keel__wire_metrics_ack(&comb, &w);
        memcpy(&w.words[2 * (3 + 2 * 2)], &bad, sizeof bad);
        metrics_msg(&m, &wt, KEEL_MSG_PUSH_ACK, &w);
        got.n = 2;
        ck_assert_int_eq(keel__wire_take_ack_metrics(&m, &got),
                         KEEL_ECORRUPT);
    }
}
END_TEST

/* Send through an inproc PAIR and decode on the other end. */
START_TEST(test_send_recv_round_trip_tensors_names_and_text)
{
    void *ctx = zmq_ctx_new(), *a = zmq_socket(ctx, ZMQ_PAIR),
         *b = zmq_socket(ctx, ZMQ_PAIR);
    keel_tensor t[5];
    int64_t shapes[5][4] = { { 1 }, { 7 }, { 2, 3 }, { 2, 1, 3 },
                             { 1, 2, 2, 2 } };
    const char *names[5] = { "step_scale", "b", "layer/w", "x/y/z",
                             "conv1/kernel" };
    keel__wire_out outs[5] = { { NULL, NULL, NULL } };
    keel__wire_header h = { .type = KEEL_MSG_PULL_REPLY, .global_step = 9 };
    keel__wire_msg m;
    keel__wire_pin pin;
    keel__wire_pin_init(&pin, 0);
    ck_assert_int_eq(zmq_bind(a, "inproc://rt"), 0);
    ck_assert_int_eq(zmq_connect(b, "inproc://rt"), 0);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(keel_tensor_alloc(&t[i], i, shapes[i]), KEEL_OK);
        for (size_t k = 0; k < t[i].count; k++)
            t[i].data[k] = (float)(i * 100 + (int)k) + 0.5f;
        outs[i].name = names[i];
        outs[i].t = &t[i];
    }
    ck_assert_int_eq(keel__wire_send(a, NULL, &h, outs, 5, "hi there", &pin),
                     KEEL_OK);
    ck_assert_int_eq(keel__wire_recv(b, 0, &no_limits, 2000, &m), KEEL_OK);
    ck_assert_int_eq(m.h.type, KEEL_MSG_PULL_REPLY);
    ck_assert_int_eq(m.h.global_step, 9);
    ck_assert_int_eq(m.n, 5);
    ck_assert_str_eq(m.text, "hi there");
    for (int i = 0; i < 5; i++) {
        ck_assert_str_eq(m.tensors[i].name, names[i]);
        ck_assert(keel_shape_equal(m.tensors[i].t.ndim, m.tensors[i].t.shape,
                                   t[i].ndim, t[i].shape));
        ck_assert_int_eq(m.tensors[i].t.count, t[i].count);
        ck_assert(memcmp(m.tensors[i].t.data, t[i].data,
                         t[i].count * 4) == 0);
        ck_assert_int_eq(m.tensors[i].t.is_owner, 0);
    }
    keel__wire_msg_clear(&m);
    ck_assert_int_eq(keel__wire_pin_wait(&pin, 2000), KEEL_OK);

    /* names only (a PULL) */
    h.type = KEEL_MSG_PULL;
    h.flags = KEEL_WIRE_F_NAMES_ONLY;
    outs[0].t = NULL;
    ck_assert_int_eq(keel__wire_send(a, NULL, &h, outs, 2, NULL, NULL),
                     KEEL_OK);
    ck_assert_int_eq(keel__wire_recv(b, 0, &no_limits, 2000, &m), KEEL_OK);
    ck_assert_int_eq(m.n, 2);
    ck_assert_str_eq(m.tensors[1].name, "b");
    ck_assert_ptr_null(m.tensors[1].t.data);
    ck_assert_ptr_null(m.text);
    keel__wire_msg_clear(&m);
    ck_assert_int_eq(keel__wire_recv(b, 0, &no_limits, 10, &m),
                     KEEL_ETIMEOUT);
    keel__wire_msg_clear(&m);
    for (int i = 0; i < 5; i++)
        keel_tensor_release(&t[i]);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
    keel__wire_pin_destroy(&pin);
}
END_TEST

static atomic_int n_handed_freed;

static void
count_handed_free(void *p)
{
    atomic_fetch_add(&n_handed_freed, 1);
    keel_aligned_free(p);
}

/* A tracking pin: a buffer whose frames are still queued is handed over
 * at once (not waited for); the receiver gets the values as they were
 * sent while the sender writes its copy; the pin frees the buffer when
 * the last frame is released, and a buffer with nothing in flight is not
 * taken. */
START_TEST(test_pin_hand_over_keeps_queued_frames_and_frees_them)
{
    void *ctx = zmq_ctx_new(), *a = zmq_socket(ctx, ZMQ_PAIR),
         *b = zmq_socket(ctx, ZMQ_PAIR);
    keel_tensor t;
    keel__wire_out o = { "v", NULL, NULL };
    keel__wire_header h = { .type = KEEL_MSG_PULL_REPLY, .global_step = 3 };
    keel__wire_msg m;
    keel__wire_pin pin;
    float *old, *copy;
    size_t bytes;
    keel__wire_pin_init(&pin, 1);
    atomic_store(&n_handed_freed, 0);
    ck_assert_int_eq(zmq_bind(a, "inproc://handover"), 0);
    ck_assert_int_eq(zmq_connect(b, "inproc://handover"), 0);
    ck_assert_int_eq(keel_tensor_alloc(&t, 1, (int64_t[]){ 1000 }), KEEL_OK);
    bytes = t.count * sizeof(float);
    for (size_t i = 0; i < t.count; i++)
        t.data[i] = (float)i;
    o.t = &t;
    ck_assert_int_eq(keel__wire_send(a, NULL, &h, &o, 1, NULL, &pin),
                     KEEL_OK);
    ck_assert(keel__wire_pin_holds(&pin, t.data, bytes));
    ck_assert(!keel__wire_pin_holds(&pin, t.data + t.count, bytes));
    /* the sender goes on with a copy, which it changes */
    old = t.data;
    copy = keel_aligned_alloc(bytes);
    ck_assert_ptr_nonnull(copy);
    memcpy(copy, old, bytes);
    ck_assert_int_eq(keel__wire_pin_hand_over(&pin, old, bytes,
                                              count_handed_free), 1);
    t.data = copy;
    for (size_t i = 0; i < t.count; i++)
        t.data[i] = -1.0f;
    ck_assert_int_eq(keel__wire_pin_wait(&pin, 0), KEEL_OK);
    ck_assert(!keel__wire_pin_holds(&pin, old, bytes));
    ck_assert_int_eq(atomic_load(&n_handed_freed), 0);
    /* the queued message still has the values it was sent with */
    ck_assert_int_eq(keel__wire_recv(b, 0, &no_limits, 2000, &m), KEEL_OK);
    ck_assert_int_eq(m.n, 1);
    for (size_t i = 0; i < t.count; i++)
        ck_assert_float_eq(m.tensors[0].t.data[i], (float)i);
    keel__wire_msg_clear(&m);
    ck_assert_int_eq(atomic_load(&n_handed_freed), 1);
    /* nothing in flight: the caller keeps its buffer */
    ck_assert_int_eq(keel__wire_pin_hand_over(&pin, t.data, bytes,
                                              count_handed_free), 0);
    keel_tensor_release(&t);
    keel__wire_pin_destroy(&pin);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
}
END_TEST

/* A hand-built one-tensor message "w" [2,3] (or as mutated). */
typedef struct raw {
    unsigned char hdr[64];
    size_t hdr_len;
    unsigned char desc[400];
    size_t desc_len;
    unsigned char data[64];
    size_t data_len;
    size_t data_offset;       /* to misalign */
    int n_frames;             /* 3 normally */
    const char *extra;        /* a fourth frame (text) */
} raw;

static void
raw_init(raw *r)
{
    keel__wire_header h = { .type = KEEL_MSG_PUSH, .count = 1,
                            .sender_type = KEEL_TASK_WORKER };
    int64_t shape[2] = { 2, 3 };
    memset(r, 0, sizeof *r);
    keel__wire_header_encode(&h, r->hdr);
    r->hdr_len = KEEL_WIRE_HEADER_SIZE;
    r->desc_len = keel__wire_desc_encode("w", 2, shape, r->desc,
                                         sizeof r->desc);
    for (int i = 0; i < 6; i++) {
        float f = (float)i + 0.25f;
        memcpy(r->data + 4 * i, &f, 4);
    }
    r->data_len = 24;
    r->n_frames = 3;
}

static void
frame_set(zmq_msg_t *f, const void *p, size_t n)
{
    ck_assert_int_eq(zmq_msg_init_size(f, n), 0);
    if (n)
        memcpy(zmq_msg_data(f), p, n);
}

static void
noop_free(void *d, void *h)
{
    (void)d;
    (void)h;
}

static keel_status
raw_decode(const raw *r, const keel__wire_limits *lim, keel__wire_msg *m)
{
    zmq_msg_t *f = calloc(5, sizeof *f);
    int n = 0;
    static unsigned char buf[128] __attribute__((aligned(64)));
    if (r->n_frames >= 1)
        frame_set(&f[n++], r->hdr, r->hdr_len);
    if (r->n_frames >= 2)
        frame_set(&f[n++], r->desc, r->desc_len);
    if (r->n_frames >= 3) {
        memcpy(buf + r->data_offset, r->data, r->data_len);
        zmq_msg_init_data(&f[n++], buf + r->data_offset, r->data_len,
                          noop_free, NULL);
    }
    if (r->extra)
        frame_set(&f[n++], r->extra, strlen(r->extra));
    keel__wire_msg_init(m);
    return keel__wire_decode(f, (size_t)n, lim, m);
}

static void
expect_corrupt(const raw *r, const keel__wire_limits *lim, const char *needle)
{
    keel__wire_msg m;
    keel_status st = raw_decode(r, lim, &m);
    keel__wire_msg_clear(&m);
    ck_assert_msg(st == KEEL_ECORRUPT, "accepted (want '%s')", needle);
    ck_assert_msg(strstr(keel_last_error(), needle) != NULL,
                  "'%s' lacks '%s'", keel_last_error(), needle);
}

START_TEST(test_decode_rejects_every_malformed_class)
{
    raw r;
    keel__wire_msg m;
    keel__wire_limits lim = { 0 };
    int64_t d2[2] = { 2, 3 };

    raw_init(&r);                           /* the valid baseline */
    ck_assert_int_eq(raw_decode(&r, &lim, &m), KEEL_OK);
    ck_assert_str_eq(m.tensors[0].name, "w");
    ck_assert(m.tensors[0].t.data[5] == 5.25f);
    keel__wire_msg_clear(&m);

    raw_init(&r); r.n_frames = 0;
    expect_corrupt(&r, &lim, "empty message");
    raw_init(&r); r.hdr_len = 63;
    expect_corrupt(&r, &lim, "header frame is 63 bytes");
    raw_init(&r); r.hdr[0] = 'X';
    expect_corrupt(&r, &lim, "bad magic");
    raw_init(&r); r.hdr[4] = 1;         /* the 56-byte header's */
    expect_corrupt(&r, &lim, "wire version 1");
    raw_init(&r); r.hdr[6] = 0;
    expect_corrupt(&r, &lim, "unknown message type 0");
    raw_init(&r); r.hdr[6] = 200;
    expect_corrupt(&r, &lim, "unknown message type 200");
    /* every bit of the flags byte is known; ROWS is a PUSH's only */
    raw_init(&r); r.hdr[6] = KEEL_MSG_PULL_REPLY; r.hdr[7] = 0x80;
    expect_corrupt(&r, &lim, "flag ROWS in a message that is not a PUSH");
    raw_init(&r); r.hdr[4] = 2;         /* before the example count */
    expect_corrupt(&r, &lim, "wire version 2");
    raw_init(&r); r.hdr[4] = 3;         /* before the metrics tensor */
    expect_corrupt(&r, &lim, "wire version 3");
    raw_init(&r); r.hdr[4] = 4;         /* before INIT from a checkpoint */
    expect_corrupt(&r, &lim, "wire version 4");
    raw_init(&r); r.hdr[17] = 1; r.hdr[19] = 0x80;   /* a PUSH's count */
    ck_assert_int_eq(raw_decode(&r, &lim, &m), KEEL_OK);
    ck_assert_uint_eq(m.h.examples, 0x800001u);
    keel__wire_msg_clear(&m);
    raw_init(&r); r.hdr[6] = KEEL_MSG_PULL; r.hdr[18] = 1;
    expect_corrupt(&r, &lim, "example count 256 in a message that is not "
                   "a PUSH");
    raw_init(&r); r.hdr[16] = 9;
    expect_corrupt(&r, &lim, "sender task type 9");
    raw_init(&r); r.hdr[48] = 0; r.hdr[50] = 2;      /* count 131072 */
    expect_corrupt(&r, &lim, "131072 tensors (limit 65536)");
    raw_init(&r); r.n_frames = 2;                   /* truncated */
    expect_corrupt(&r, &lim, "2 frames for 1 tensor (expected 3)");
    raw_init(&r); r.extra = "surplus";               /* extra frame */
    expect_corrupt(&r, &lim, "4 frames for 1 tensor (expected 3)");
    raw_init(&r); r.desc_len = 3;
    expect_corrupt(&r, &lim, "descriptor of 3 bytes is truncated");
    raw_init(&r); r.desc[2] = 2;
    expect_corrupt(&r, &lim, "dtype 2");
    raw_init(&r); r.desc[3] = 5;
    expect_corrupt(&r, &lim, "ndim 5 > 4");
    raw_init(&r); r.desc[0] = 0;
    expect_corrupt(&r, &lim, "name length 0");
    raw_init(&r); r.desc[0] = 44; r.desc[1] = 1;     /* 300 */
    expect_corrupt(&r, &lim, "name length 300");
    raw_init(&r); r.desc_len += 1;
    expect_corrupt(&r, &lim, "descriptor is 22 bytes, expected 21");
    raw_init(&r);
    r.desc_len = keel__wire_desc_encode("../x", 2, d2, r.desc, sizeof r.desc);
    expect_corrupt(&r, &lim, "invalid name");
    raw_init(&r);
    r.desc_len = keel__wire_desc_encode("ab", 2, d2, r.desc, sizeof r.desc);
    r.desc[r.desc_len - 1] = '\0';                    /* "a\0" */
    expect_corrupt(&r, &lim, "invalid name");
    raw_init(&r);
    {
        int64_t z[2] = { 0, 3 }, neg[2] = { 2, -3 },
                big[3] = { 1ll << 40, 1ll << 40, 1ll << 40 };
        r.desc_len = keel__wire_desc_encode("w", 2, z, r.desc, sizeof r.desc);
        expect_corrupt(&r, &lim, "dimension 0 is 0");
        r.desc_len = keel__wire_desc_encode("w", 2, neg, r.desc,
                                            sizeof r.desc);
        expect_corrupt(&r, &lim, "dimension 1 is -3");
        r.desc_len = keel__wire_desc_encode("w", 3, big, r.desc,
                                            sizeof r.desc);
        expect_corrupt(&r, &lim, "element count overflows");
    }
    raw_init(&r); r.data_len = 20;
    expect_corrupt(&r, &lim, "data frame is 20 bytes, shape needs 6 x 4");
    raw_init(&r);
    lim.max_total_bytes = 16;
    expect_corrupt(&r, &lim, "tensor data exceeds 16 bytes");
    lim.max_total_bytes = 0;
    raw_init(&r); r.hdr[7] = KEEL_WIRE_F_TEXT; r.extra = "x";
    lim.max_text = 0;
    ck_assert_int_eq(raw_decode(&r, &lim, &m), KEEL_OK);
    ck_assert_str_eq(m.text, "x");
    keel__wire_msg_clear(&m);
    lim.max_text = 0;
    {
        keel__wire_limits small = { .max_text = 3 };
        r.extra = "longer";
        expect_corrupt(&r, &small, "text of 6 bytes (limit 3)");
    }
    raw_init(&r); r.hdr[7] = KEEL_WIRE_F_NAMES_ONLY;  /* names-only: 2 frames */
    expect_corrupt(&r, &lim, "3 frames for 1 tensor (expected 2)");
}
END_TEST

START_TEST(test_decode_copies_misaligned_data_only)
{
    raw r;
    keel__wire_msg m;
    keel__wire_limits lim = { 0 };
    raw_init(&r);
    r.data_offset = 1;
    ck_assert_int_eq(raw_decode(&r, &lim, &m), KEEL_OK);
    ck_assert_int_eq(m.n_copies, 1);
    ck_assert_int_eq((uintptr_t)m.tensors[0].t.data % KEEL_TENSOR_ALIGN, 0);
    ck_assert(m.tensors[0].t.data[2] == 2.25f);
    keel__wire_msg_clear(&m);
    r.data_offset = 0;
    ck_assert_int_eq(raw_decode(&r, &lim, &m), KEEL_OK);
    ck_assert_int_eq(m.n_copies, 0);
    keel__wire_msg_clear(&m);
}
END_TEST

/* Every keel socket gets the fixed send buffer (docs/protocol.md "Send
 * buffer"), and the other common options. */
START_TEST(test_sockopts_set_the_send_buffer)
{
    void *zctx = zmq_ctx_new();
    void *s = zmq_socket(zctx, ZMQ_DEALER);
    keel__wire_limits lim;
    int v = -1;
    size_t len = sizeof v;
    memset(&lim, 0, sizeof lim);
    ck_assert_ptr_nonnull(s);
    ck_assert_int_eq(keel__wire_sockopts(s, &lim), KEEL_OK);
    ck_assert_int_eq(zmq_getsockopt(s, ZMQ_SNDBUF, &v, &len), 0);
    ck_assert_int_eq(v, KEEL__WIRE_SNDBUF);
    ck_assert_int_eq(v, 512 << 10);
    len = sizeof v;
    ck_assert_int_eq(zmq_getsockopt(s, ZMQ_LINGER, &v, &len), 0);
    ck_assert_int_eq(v, 0);
    zmq_close(s);
    /* cluster.send_buffer_kib: another size, then the kernel's (-1) */
    keel__wire_set_send_buffer(64 << 10);
    s = zmq_socket(zctx, ZMQ_DEALER);
    ck_assert_int_eq(keel__wire_sockopts(s, &lim), KEEL_OK);
    len = sizeof v;
    ck_assert_int_eq(zmq_getsockopt(s, ZMQ_SNDBUF, &v, &len), 0);
    ck_assert_int_eq(v, 64 << 10);
    zmq_close(s);
    keel__wire_set_send_buffer(0);
    s = zmq_socket(zctx, ZMQ_DEALER);
    ck_assert_int_eq(keel__wire_sockopts(s, &lim), KEEL_OK);
    len = sizeof v;
    ck_assert_int_eq(zmq_getsockopt(s, ZMQ_SNDBUF, &v, &len), 0);
    ck_assert_int_eq(v, -1);
    zmq_close(s);
    keel__wire_set_send_buffer(KEEL__WIRE_SNDBUF);
    zmq_ctx_term(zctx);
}
END_TEST

START_TEST(test_recv_drains_and_rejects_too_many_frames)
{
    void *ctx = zmq_ctx_new(), *a = zmq_socket(ctx, ZMQ_PAIR),
         *b = zmq_socket(ctx, ZMQ_PAIR);
    keel__wire_limits lim = { .max_tensors = 2 };
    keel__wire_msg m;
    keel__wire_header h = { .type = KEEL_MSG_HEARTBEAT };
    ck_assert_int_eq(zmq_bind(a, "inproc://many"), 0);
    ck_assert_int_eq(zmq_connect(b, "inproc://many"), 0);
    for (int i = 0; i < 50; i++)
        zmq_send(a, "x", 1, i < 49 ? ZMQ_SNDMORE : 0);
    ck_assert_int_eq(keel__wire_recv(b, 0, &lim, 2000, &m), KEEL_ECORRUPT);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "more than 7 frames"));
    keel__wire_msg_clear(&m);
    /* the stream is still in sync: the next message decodes */
    ck_assert_int_eq(keel__wire_send(a, NULL, &h, NULL, 0, NULL, NULL),
                     KEEL_OK);
    ck_assert_int_eq(keel__wire_recv(b, 0, &lim, 2000, &m), KEEL_OK);
    ck_assert_int_eq(m.h.type, KEEL_MSG_HEARTBEAT);
    keel__wire_msg_clear(&m);
    zmq_close(a);
    zmq_close(b);
    zmq_ctx_term(ctx);
}
END_TEST

/* ---- a live server ------------------------------------------------------ */

/* Counts warning lines that mention a rejection or refusal (any thread). */
static atomic_int n_warned;
static char last_warning[512];
static pthread_mutex_t warn_mu = PTHREAD_MUTEX_INITIALIZER;

static void
count_warnings(void *ctx, keel_log_level level, const char *msg)
{
    (void)ctx;
    if (level < KEEL_LOG_WARN)
        return;
    if (strstr(msg, "rejected") || strstr(msg, "refused")) {
        atomic_fetch_add(&n_warned, 1);
        pthread_mutex_lock(&warn_mu);
        snprintf(last_warning, sizeof last_warning, "%s", msg);
        pthread_mutex_unlock(&warn_mu);
    }
}

typedef struct server {
    keel_vars *vars;
    keel__ps *ps;
    pthread_t th;
    atomic_int stop;
    keel_status result;
} server;

/* A client of sv's ps as worker index, authenticated by curve (NULL:
 * none). */
static keel__wire_client *
worker_client(server *sv, const keel__curve *curve, int index)
{
    keel__wire_client *c;
    ck_assert_int_eq(keel__wire_client_new(keel__ps_endpoint(sv->ps), curve,
                                           KEEL_TASK_WORKER, index, &c),
                     KEEL_OK);
    return c;
}

static void *
server_main(void *arg)
{
    server *sv = arg;
    sv->result = keel__ps_run(sv->ps, &sv->stop);
    return NULL;
}

/* A ps over the test's two variables listening on bind, serving in a
 * thread. */
static void
server_start_at(server *sv, const keel__curve *curve,
                const keel__wire_limits *lim, const char *bind)
{
    int64_t ws[2] = { 2, 3 }, bs[1] = { 3 };
    keel_var *w, *b;
    keel__ps_config cfg = { .bind = bind, .curve = curve,
                            .serve = ps_skel_serve };
    memset(sv, 0, sizeof *sv);
    ck_assert_int_eq(keel_vars_new(&sv->vars), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(sv->vars, "layer/w", 2, ws,
                                      KEEL_VAR_TRAINABLE, &w), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(sv->vars, "layer/b", 1, bs,
                                      KEEL_VAR_TRAINABLE, &b), KEEL_OK);
    for (int i = 0; i < 6; i++)
        keel_var_tensor(w)->data[i] = (float)i;
    for (int i = 0; i < 3; i++)
        keel_var_tensor(b)->data[i] = 10.0f + (float)i;
    cfg.vars = sv->vars;
    if (lim)
        cfg.limits = *lim;
    ck_assert_msg(keel__ps_new(&cfg, &sv->ps) == KEEL_OK, "%s",
                  keel_last_error());
    /* the endpoint bound last: the Unix socket after the tcp ones */
    ck_assert_int_eq(strncmp(keel__ps_endpoint(sv->ps),
                             strstr(bind, "ipc://") ? "ipc://" : "tcp://",
                             6), 0);
    atomic_store(&sv->stop, 0);
    ck_assert_int_eq(pthread_create(&sv->th, NULL, server_main, sv), 0);
}

static void
server_start(server *sv, const keel__curve *curve,
             const keel__wire_limits *lim)
{
    server_start_at(sv, curve, lim, "tcp://127.0.0.1:*");
}

static void
server_join(server *sv)
{
    atomic_store(&sv->stop, 1);
    pthread_join(sv->th, NULL);
}

static void
server_free(server *sv)
{
    keel__ps_free(sv->ps);
    keel_vars_free(sv->vars);
}

static void
server_stop(server *sv)
{
    server_join(sv);
    server_free(sv);
}

/* PULL everything through c and check w[i] = w0 + i, b[i] = b0 + i. */
static void
check_pull(keel__wire_client *c, float w0, float b0)
{
    keel__wire_header h = { .type = KEEL_MSG_PULL,
                            .flags = KEEL_WIRE_F_NAMES_ONLY };
    keel__wire_msg r;
    ck_assert_msg(keel__wire_client_call(c, &h, NULL, 0, 0, 3000, &r) ==
                  KEEL_OK, "%s", keel_last_error());
    ck_assert_int_eq(r.h.type, KEEL_MSG_PULL_REPLY);
    ck_assert_int_eq(r.n, 2);
    ck_assert_str_eq(r.tensors[0].name, "layer/w");
    ck_assert_int_eq(r.tensors[0].t.count, 6);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(r.tensors[0].t.data[i], w0 + (float)i);
    ck_assert_str_eq(r.tensors[1].name, "layer/b");
    for (int i = 0; i < 3; i++)
        ck_assert_float_eq(r.tensors[1].t.data[i], b0 + (float)i);
    keel__wire_msg_clear(&r);
}

/* Raw DEALER: send frames, return the reply (ERROR expected) or timeout. */
static keel_status
raw_call(void *sock, zmq_msg_t *frames, int n, keel__wire_msg *reply,
         int timeout_ms)
{
    keel__wire_limits lim = { 0 };
    for (int i = 0; i < n; i++)
        ck_assert_int_ge(zmq_msg_send(&frames[i], sock,
                                      i + 1 < n ? ZMQ_SNDMORE : 0), 0);
    return keel__wire_recv(sock, 0, &lim, timeout_ms, reply);
}

/* *h: a request of type, every other field 0 */
static void
header_of(keel__wire_header *h, unsigned type)
{
    memset(h, 0, sizeof *h);
    h->type = type;
}

static void
expect_error_reply(void *sock, const raw *r, keel_status code,
                   const char *needle)
{
    zmq_msg_t f[4];
    int n = 0;
    keel__wire_msg m;
    if (r->n_frames >= 1)
        frame_set(&f[n++], r->hdr, r->hdr_len);
    if (r->n_frames >= 2)
        frame_set(&f[n++], r->desc, r->desc_len);
    if (r->n_frames >= 3)
        frame_set(&f[n++], r->data, r->data_len);
    if (r->extra)
        frame_set(&f[n++], r->extra, strlen(r->extra));
    ck_assert_int_eq(raw_call(sock, f, n, &m, 3000), KEEL_OK);
    ck_assert_int_eq(m.h.type, KEEL_MSG_ERROR);
    ck_assert_int_eq(m.h.arg, code);
    ck_assert_ptr_nonnull(m.text);
    ck_assert_msg(strstr(m.text, needle) != NULL, "'%s' lacks '%s'", m.text,
                  needle);
    keel__wire_msg_clear(&m);
}

START_TEST(test_live_server_survives_garbage_and_serves_others)
{
    server sv;
    keel__wire_limits lim = { .max_total_bytes = 1 << 20 };
    keel__wire_client *good_c;
    void *zctx = zmq_ctx_new(), *bad = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    keel_tensor gw, gb;
    int64_t ws[2] = { 2, 3 }, bs[1] = { 3 }, wrong[2] = { 3, 2 };
    keel__wire_out push[2];
    keel__wire_header h;
    keel__wire_msg r;
    raw rw;
    long rejected;

    atomic_store(&n_warned, 0);
    keel_log_set_handler(count_warnings, NULL, KEEL_LOG_WARN);
    server_start(&sv, NULL, &lim);
    zmq_setsockopt(bad, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert_int_eq(zmq_connect(bad, keel__ps_endpoint(sv.ps)), 0);
    good_c = worker_client(&sv, NULL, 0);

    /* garbage: one frame of junk */
    {
        zmq_msg_t f;
        frame_set(&f, "GET / HTTP/1.0\r\n", 16);
        ck_assert_int_eq(raw_call(bad, &f, 1, &r, 3000), KEEL_OK);
        ck_assert_int_eq(r.h.type, KEEL_MSG_ERROR);
        ck_assert_int_eq(r.h.arg, KEEL_ECORRUPT);
        ck_assert_ptr_nonnull(strstr(r.text, "header frame is 16 bytes"));
        keel__wire_msg_clear(&r);
    }
    check_pull(good_c, 0.0f, 10.0f);
    /* truncated: header says one tensor, no tensor frames */
    raw_init(&rw);
    rw.n_frames = 1;
    expect_error_reply(bad, &rw, KEEL_ECORRUPT, "1 frames for 1 tensor");
    /* wrong shape */
    raw_init(&rw);
    rw.desc_len = keel__wire_desc_encode("layer/w", 2, wrong, rw.desc,
                                         sizeof rw.desc);
    expect_error_reply(bad, &rw, KEEL_EINVAL, "shape [2,3] on ps 0, message "
                       "has [3,2]");
    /* unknown variable */
    raw_init(&rw);
    expect_error_reply(bad, &rw, KEEL_ENOTFOUND, "no variable 'w'");
    /* size mismatch between shape and data */
    raw_init(&rw);
    rw.desc_len = keel__wire_desc_encode("layer/w", 2, ws, rw.desc,
                                         sizeof rw.desc);
    rw.data_len = 8;
    expect_error_reply(bad, &rw, KEEL_ECORRUPT, "data frame is 8 bytes");
    /* a reply type sent as a request */
    raw_init(&rw);
    rw.hdr[6] = KEEL_MSG_STEP;
    rw.hdr[7] = KEEL_WIRE_F_REPLY;
    rw.hdr[48] = 0;
    rw.n_frames = 1;
    expect_error_reply(bad, &rw, KEEL_EINVAL, "a reply");

    /* the good client pushes; values are summed, the step advances */
    ck_assert_int_eq(keel_tensor_alloc(&gw, 2, ws), KEEL_OK);
    ck_assert_int_eq(keel_tensor_alloc(&gb, 1, bs), KEEL_OK);
    for (int i = 0; i < 6; i++)
        gw.data[i] = 100.0f;
    for (int i = 0; i < 3; i++)
        gb.data[i] = -10.0f;
    push[0] = (keel__wire_out){ "layer/w", &gw, NULL };
    push[1] = (keel__wire_out){ "layer/b", &gb, NULL };
    header_of(&h, KEEL_MSG_PUSH);
    ck_assert_int_eq(keel__wire_client_call(good_c, &h, push, 2, 1, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
    ck_assert_int_eq(r.h.global_step, 1);
    ck_assert_int_eq(r.h.sender_type, KEEL_TASK_PS);
    keel__wire_msg_clear(&r);
    check_pull(good_c, 100.0f, 0.0f);

    /* oversized: one 2 MiB frame exceeds ZMQ_MAXMSGSIZE (1 MiB): the
     * connection is dropped, no reply; then a 2-tensor message under the
     * per-frame cap but over the total cap gets an ERROR. */
    {
        size_t big = 2u << 20;
        char *junk = calloc(1, big);
        zmq_msg_t f[3];
        raw_init(&rw);
        frame_set(&f[0], rw.hdr, rw.hdr_len);
        frame_set(&f[1], rw.desc, rw.desc_len);
        frame_set(&f[2], junk, big);
        ck_assert_int_eq(raw_call(bad, f, 3, &r, 300), KEEL_ETIMEOUT);
        keel__wire_msg_clear(&r);
        free(junk);
    }
    check_pull(good_c, 100.0f, 0.0f);
    {
        void *bad2 = zmq_socket(zctx, ZMQ_DEALER);
        keel__wire_header hh = { .type = KEEL_MSG_PUSH };
        int64_t s1[1] = { 150000 };            /* 600 kB each */
        keel_tensor a1, a2;
        keel__wire_out o2[2];
        zmq_setsockopt(bad2, ZMQ_LINGER, &zero, sizeof zero);
        ck_assert_int_eq(zmq_connect(bad2, keel__ps_endpoint(sv.ps)), 0);
        ck_assert_int_eq(keel_tensor_alloc(&a1, 1, s1), KEEL_OK);
        ck_assert_int_eq(keel_tensor_alloc(&a2, 1, s1), KEEL_OK);
        o2[0] = (keel__wire_out){ "layer/w", &a1, NULL };
        o2[1] = (keel__wire_out){ "layer/b", &a2, NULL };
        ck_assert_int_eq(keel__wire_send(bad2, NULL, &hh, o2, 2, NULL, NULL),
                         KEEL_OK);
        ck_assert_int_eq(keel__wire_recv(bad2, 0, &no_limits, 3000, &r),
                         KEEL_OK);
        ck_assert_int_eq(r.h.type, KEEL_MSG_ERROR);
        ck_assert_ptr_nonnull(strstr(r.text, "exceeds 1048576 bytes"));
        keel__wire_msg_clear(&r);
        keel_tensor_release(&a1);
        keel_tensor_release(&a2);
        zmq_close(bad2);
    }

    /* STEP, HELLO, HEARTBEAT, INIT answer as they should */
    header_of(&h, KEEL_MSG_STEP);
    ck_assert_int_eq(keel__wire_client_call(good_c, &h, NULL, 0, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.type, KEEL_MSG_STEP);
    ck_assert_int_eq(r.h.flags & KEEL_WIRE_F_REPLY, KEEL_WIRE_F_REPLY);
    ck_assert_int_eq(r.h.global_step, 1);
    keel__wire_msg_clear(&r);
    h.type = KEEL_MSG_HELLO;
    ck_assert_int_eq(keel__wire_client_call(good_c, &h, NULL, 0, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.type, KEEL_MSG_READY);
    keel__wire_msg_clear(&r);
    h.type = KEEL_MSG_INIT;
    h.global_step = 42;
    for (int i = 0; i < 6; i++)
        gw.data[i] = 7.0f + (float)i;
    ck_assert_int_eq(keel__wire_client_call(good_c, &h, push, 1, 1, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.global_step, 42);
    keel__wire_msg_clear(&r);
    check_pull(good_c, 7.0f, 0.0f);

    /* SHUTDOWN ends the serving loop */
    header_of(&h, KEEL_MSG_SHUTDOWN);
    ck_assert_int_eq(keel__wire_client_call(good_c, &h, NULL, 0, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.type, KEEL_MSG_SHUTDOWN);
    keel__wire_msg_clear(&r);
    pthread_join(sv.th, NULL);
    ck_assert_int_eq(sv.result, KEEL_OK);
    rejected = keel__ps_rejected(sv.ps);
    ck_assert_int_eq(rejected, 7);
    /* rate-limited: the first at once, the rest counted and summed up in
     * one line when the server ends */
    ck_assert_int_eq(atomic_load(&n_warned), 1);
    server_free(&sv);
    keel_log_set_handler(NULL, NULL, KEEL_LOG_WARN);
    ck_assert_int_eq(atomic_load(&n_warned), 2);
    ck_assert_msg(strstr(last_warning, "6 more refused or dropped") != NULL,
                  "%s", last_warning);

    keel_tensor_release(&gw);
    keel_tensor_release(&gb);
    keel__wire_client_free(good_c);
    zmq_close(bad);
    zmq_ctx_term(zctx);
}
END_TEST

static int pp_seen;

/* Record which variables came back (bit 0: layer/w = 1 + i, bit 1:
 * layer/b = 11.5 + i after the earlier pushes). */
static void
pp_reply(void *ctx, const keel__wire_msg *m)
{
    (void)ctx;
    for (size_t i = 0; i < m->n; i++) {
        const keel__wire_tensor *t = &m->tensors[i];
        if (strcmp(t->name, "layer/w") == 0 && t->t.data[5] == 6.0f)
            pp_seen |= 1;
        if (strcmp(t->name, "layer/b") == 0 && t->t.data[2] == 13.5f)
            pp_seen |= 2;
    }
}

START_TEST(test_pull_of_named_and_unknown_variables)
{
    server sv;
    keel__wire_client *c;
    keel__wire_out names[2] = { { "layer/b", NULL, NULL }, { "nope", NULL, NULL } };
    keel__wire_header h = { .type = KEEL_MSG_PULL,
                            .flags = KEEL_WIRE_F_NAMES_ONLY };
    keel__wire_msg r;
    server_start(&sv, NULL, NULL);
    c = worker_client(&sv, NULL, 1);
    ck_assert_int_eq(keel__wire_client_call(c, &h, names, 1, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.n, 1);
    ck_assert_str_eq(r.tensors[0].name, "layer/b");
    ck_assert_float_eq(r.tensors[0].t.data[2], 12.0f);
    keel__wire_msg_clear(&r);
    ck_assert_int_eq(keel__wire_client_call(c, &h, names, 2, 0, 3000, &r),
                     KEEL_EPEER);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "no variable 'nope'"));
    keel__wire_msg_clear(&r);
    /* PUSH with F_WANT_VALUES: the ack carries the updated variable */
    {
        keel_tensor g;
        int64_t bs[1] = { 3 };
        keel__wire_out o = { "layer/b", &g, NULL };
        keel__wire_header ph = { .type = KEEL_MSG_PUSH,
                                 .flags = KEEL_WIRE_F_WANT_VALUES };
        ck_assert_int_eq(keel_tensor_alloc(&g, 1, bs), KEEL_OK);
        for (int i = 0; i < 3; i++)
            g.data[i] = 0.5f;
        ck_assert_int_eq(keel__wire_client_call(c, &ph, &o, 1, 1, 3000, &r),
                         KEEL_OK);
        ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
        ck_assert_int_eq(r.n, 1);
        ck_assert_str_eq(r.tensors[0].name, "layer/b");
        for (int i = 0; i < 3; i++)
            ck_assert_float_eq(r.tensors[0].t.data[i], 10.5f + (float)i);
        keel__wire_msg_clear(&r);
        keel_tensor_release(&g);
    }
    /* pipelined parts: one step, values of both variables come back */
    {
        keel_tensor g[2];
        int64_t ws[2] = { 2, 3 }, bs[1] = { 3 };
        keel__wire_out o[2] = { { "layer/w", &g[0], NULL }, { "layer/b", &g[1], NULL } };
        keel__wire_header sh = { .type = KEEL_MSG_STEP };
        pp_seen = 0;
        ck_assert_int_eq(keel_tensor_alloc(&g[0], 2, ws), KEEL_OK);
        ck_assert_int_eq(keel_tensor_alloc(&g[1], 1, bs), KEEL_OK);
        for (int i = 0; i < 6; i++)
            g[0].data[i] = 1.0f;
        for (int i = 0; i < 3; i++)
            g[1].data[i] = 1.0f;
        ck_assert_int_eq(keel__wire_client_push_parts(
                             c, o, 2, 1, KEEL_WIRE_F_WANT_VALUES, 3000,
                             pp_reply, NULL), KEEL_OK);
        ck_assert_int_eq(pp_seen, 3);          /* both parts' values */
        ck_assert_int_eq(keel__wire_client_call(c, &sh, NULL, 0, 0, 3000,
                                                &r), KEEL_OK);
        ck_assert_int_eq(r.h.global_step, 2);  /* 1 + one pipelined step */
        keel__wire_msg_clear(&r);
        o[1].name = "nope";                    /* an error in one part */
        ck_assert_int_eq(keel__wire_client_push_parts(
                             c, o, 2, 1, 0, 3000, NULL, NULL), KEEL_EPEER);
        ck_assert_ptr_nonnull(strstr(keel_last_error(), "no variable 'nope'"));
        keel_tensor_release(&g[0]);
        keel_tensor_release(&g[1]);
    }
    names[1].name = "layer/b";              /* duplicate */
    ck_assert_int_eq(keel__wire_client_call(c, &h, names, 2, 0, 3000, &r),
                     KEEL_EPEER);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "given twice"));
    keel__wire_msg_clear(&r);
    keel__wire_client_free(c);
    server_stop(&sv);
}
END_TEST

/* The skeleton's sum runs numeric/'s vectorized kernel: every element,
 * the vector body's and the tail's (1003 = 62 x 16 + 11), has the bits of
 * the scalar v + g. */
START_TEST(test_push_sum_has_the_scalar_bits)
{
    enum { N = 1003 };
    int64_t shape[1] = { N };
    keel_vars *vars;
    keel_var *v;
    keel__ps *ps;
    keel__ps_config cfg = { .bind = "tcp://127.0.0.1:*",
                            .serve = ps_skel_serve };
    server sv;
    keel__wire_client *c;
    keel_tensor g;
    keel__wire_out o = { "big/w", &g, NULL };
    keel__wire_header h = { .type = KEEL_MSG_PUSH,
                            .flags = KEEL_WIRE_F_WANT_VALUES };
    keel__wire_msg r;
    float want[N];
    ck_assert_int_eq(keel_vars_new(&vars), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vars, "big/w", 1, shape,
                                      KEEL_VAR_TRAINABLE, &v), KEEL_OK);
    ck_assert_int_eq(keel_tensor_alloc(&g, 1, shape), KEEL_OK);
    for (int i = 0; i < N; i++) {
        volatile float a = 1.0f / (float)(i + 3), b = -0.3f * (float)i / 7.0f;
        keel_var_tensor(v)->data[i] = a;
        g.data[i] = b;
        want[i] = a + b;
    }
    cfg.vars = vars;
    ck_assert_int_eq(keel__ps_new(&cfg, &ps), KEEL_OK);
    memset(&sv, 0, sizeof sv);
    sv.ps = ps;
    sv.vars = vars;
    atomic_store(&sv.stop, 0);
    ck_assert_int_eq(pthread_create(&sv.th, NULL, server_main, &sv), 0);
    ck_assert_int_eq(keel__wire_client_new(keel__ps_endpoint(ps), NULL,
                                           KEEL_TASK_WORKER, 0, &c), KEEL_OK);
    ck_assert_int_eq(keel__wire_client_call(c, &h, &o, 1, 1, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
    ck_assert_int_eq(r.n, 1);
    ck_assert_uint_eq(r.tensors[0].t.count, N);
    ck_assert_int_eq(memcmp(r.tensors[0].t.data, want, sizeof want), 0);
    keel__wire_msg_clear(&r);
    keel__wire_client_free(c);
    server_join(&sv);
    ck_assert_int_eq(memcmp(keel_var_tensor(v)->data, want, sizeof want), 0);
    server_free(&sv);
    keel_tensor_release(&g);
}
END_TEST

/* ---- CURVE -------------------------------------------------------------- */

START_TEST(test_keygen_writes_pair_with_modes_and_never_overwrites)
{
    char dir[4200], pub[41], path[4300], loaded[41];
    struct stat sb;
    keel__curve c;
    snprintf(dir, sizeof dir, "%s/keys/sub", tu_dir);
    ck_assert_int_eq(keel_cluster_keygen(dir, "ps0", pub), KEEL_OK);
    ck_assert_int_eq(strlen(pub), 40);
    snprintf(path, sizeof path, "%s/ps0.key_secret", dir);
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0600);
    snprintf(path, sizeof path, "%s/ps0.key", dir);
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0644);
    ck_assert_int_eq(keel__curve_read_public(path, loaded), KEEL_OK);
    ck_assert_str_eq(loaded, pub);
    memset(&c, 0, sizeof c);
    ck_assert_int_eq(keel__curve_load(&c, dir, "ps0"), KEEL_OK);
    ck_assert_str_eq(c.public_key, pub);
    ck_assert(c.enabled);
    keel__curve_clear(&c);
    ck_assert_int_eq(keel_cluster_keygen(dir, "ps0", NULL), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "already exists"));
    ck_assert_int_eq(keel_cluster_keygen(dir, "../evil", NULL), KEEL_EINVAL);
    ck_assert_int_eq(keel_cluster_keygen(dir, "", NULL), KEEL_EINVAL);
    /* a secret readable by others is refused */
    snprintf(path, sizeof path, "%s/ps0.key_secret", dir);
    ck_assert_int_eq(chmod(path, 0644), 0);
    ck_assert_int_eq(keel__curve_load(&c, dir, "ps0"), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "chmod 600"));
    ck_assert_ptr_null(strstr(keel_last_error(), c.secret_key[0] ?
                              c.secret_key : "\x01"));
    keel__curve_clear(&c);
    /* a corrupt public key file */
    snprintf(path, sizeof path, "%s/junk.key", dir);
    tu_write_file(path, "short\n", 6);
    ck_assert_int_eq(keel__curve_read_public(path, loaded), KEEL_EINVAL);
}
END_TEST

/* A call refused by the ps's role check: an ERROR naming why. */
static void
expect_refused(keel__wire_client *c, uint8_t type, const char *needle)
{
    keel__wire_header h = { .type = type };
    keel__wire_msg r;
    ck_assert_int_eq(keel__wire_client_call(c, &h, NULL, 0, 0, 3000, &r),
                     KEEL_EPEER);
    ck_assert_int_eq(r.h.type, KEEL_MSG_ERROR);
    ck_assert_msg(r.text != NULL && strstr(r.text, needle) != NULL,
                  "'%s' lacks '%s'", r.text ? r.text : "", needle);
    keel__wire_msg_clear(&r);
}

START_TEST(test_curve_allowed_key_in_a_role_it_does_not_hold)
{
    char keys[4200];
    keel__curve srv, w1c;
    server sv;
    keel__wire_client *as_w1, *as_w0;
    int warned;

    snprintf(keys, sizeof keys, "%s/keys", tu_dir);
    ck_assert_int_eq(keel_cluster_keygen(keys, "ps0", NULL), KEEL_OK);
    ck_assert_int_eq(keel_cluster_keygen(keys, "worker1", NULL), KEEL_OK);
    memset(&srv, 0, sizeof srv);
    memset(&w1c, 0, sizeof w1c);
    ck_assert_int_eq(keel__curve_load(&srv, keys, "ps0"), KEEL_OK);
    ck_assert_int_eq(keel__curve_allow_dir(&srv, keys), KEEL_OK);
    ck_assert_int_eq(keel__curve_load(&w1c, keys, "worker1"), KEEL_OK);
    memcpy(w1c.server_key, srv.public_key, KEEL_Z85_KEY);
    atomic_store(&n_warned, 0);
    keel_log_set_handler(count_warnings, NULL, KEEL_LOG_WARN);
    server_start(&sv, &srv, NULL);      /* no chief: worker 0 is it */
    as_w1 = worker_client(&sv, &w1c, 1);
    as_w0 = worker_client(&sv, &w1c, 0);
    /* worker 1's own key: reads, but neither SHUTDOWN nor INIT */
    check_pull(as_w1, 0.0f, 10.0f);
    expect_refused(as_w1, KEEL_MSG_SHUTDOWN, "worker1 may not send "
                   "SHUTDOWN");
    warned = atomic_load(&n_warned);
    ck_assert_int_eq(warned, 1);
    ck_assert_ptr_nonnull(strstr(last_warning, "127.0.0.1"));
    expect_refused(as_w1, KEEL_MSG_SHUTDOWN, "may not send SHUTDOWN");
    expect_refused(as_w1, KEEL_MSG_SHUTDOWN, "may not send SHUTDOWN");
    ck_assert_int_eq(atomic_load(&n_warned), warned);   /* logged once */
    /* the same key claiming to be worker 0 (the chief here) */
    expect_refused(as_w0, KEEL_MSG_SHUTDOWN, "authenticated as worker1 but "
                   "its header claims worker0");
    expect_refused(as_w0, KEEL_MSG_PULL, "authenticated as worker1");
    /* still serving, nothing changed */
    check_pull(as_w1, 0.0f, 10.0f);
    keel__wire_client_free(as_w1);
    keel__wire_client_free(as_w0);
    server_join(&sv);
    ck_assert_int_eq(keel__ps_served(sv.ps), 2);
    ck_assert_int_eq(keel__ps_rejected(sv.ps), 5);
    keel_log_set_handler(NULL, NULL, KEEL_LOG_WARN);
    server_free(&sv);
    keel__curve_clear(&srv);
    keel__curve_clear(&w1c);
}
END_TEST

START_TEST(test_token_admits_the_job_tasks_only)
{
    const char *token = "0123456789abcdef-the-job";
    keel__curve srv, w0c, w1c, wrong, forged;
    server sv;
    keel__wire_client *w0, *w1, *bad, *fake, *none;
    keel__wire_header h = { .type = KEEL_MSG_PULL,
                            .flags = KEEL_WIRE_F_NAMES_ONLY };
    keel__wire_msg r;

    memset(&srv, 0, sizeof srv);
    memset(&w0c, 0, sizeof w0c);
    memset(&w1c, 0, sizeof w1c);
    memset(&wrong, 0, sizeof wrong);
    ck_assert_int_eq(keel__auth_token(&srv, "short", KEEL_TASK_PS, 0),
                     KEEL_EINVAL);
    ck_assert_int_eq(keel__auth_token(&srv, token, KEEL_TASK_PS, 0),
                     KEEL_OK);
    ck_assert_int_eq(keel__auth_token(&w0c, token, KEEL_TASK_WORKER, 0),
                     KEEL_OK);
    ck_assert_int_eq(keel__auth_token(&w1c, token, KEEL_TASK_WORKER, 1),
                     KEEL_OK);
    ck_assert_str_eq(w1c.user, "worker1");
    ck_assert_int_eq(strlen(w1c.password), 64);
    ck_assert_ptr_null(strstr(w1c.password, token));
    ck_assert_str_ne(w0c.password, w1c.password);
    ck_assert_int_eq(keel__auth_token(&wrong, "another-job-token-0000",
                                      KEEL_TASK_WORKER, 0), KEEL_OK);
    /* worker 1's password presented as worker 0 (the chief here) */
    forged = w1c;
    snprintf(forged.user, sizeof forged.user, "worker0");

    atomic_store(&n_warned, 0);
    keel_log_set_handler(count_warnings, NULL, KEEL_LOG_WARN);
    server_start(&sv, &srv, NULL);
    w0 = worker_client(&sv, &w0c, 0);
    w1 = worker_client(&sv, &w1c, 1);
    bad = worker_client(&sv, &wrong, 0);
    fake = worker_client(&sv, &forged, 0);
    none = worker_client(&sv, NULL, 0);
    check_pull(w0, 0.0f, 10.0f);
    check_pull(w1, 0.0f, 10.0f);
    expect_refused(w1, KEEL_MSG_SHUTDOWN, "worker1 may not send SHUTDOWN");
    ck_assert_int_eq(keel__wire_client_call(bad, &h, NULL, 0, 0, 400, &r),
                     KEEL_ETIMEOUT);
    keel__wire_msg_clear(&r);
    h.type = KEEL_MSG_SHUTDOWN;
    h.flags = 0;
    ck_assert_int_eq(keel__wire_client_call(fake, &h, NULL, 0, 0, 400, &r),
                     KEEL_ETIMEOUT);
    keel__wire_msg_clear(&r);
    ck_assert_int_eq(keel__wire_client_call(none, &h, NULL, 0, 0, 400, &r),
                     KEEL_ETIMEOUT);
    keel__wire_msg_clear(&r);
    check_pull(w0, 0.0f, 10.0f);         /* not shut down */
    keel__wire_client_free(w0);
    keel__wire_client_free(w1);
    keel__wire_client_free(bad);
    keel__wire_client_free(fake);
    keel__wire_client_free(none);
    server_join(&sv);
    ck_assert_int_eq(keel__ps_served(sv.ps), 3);
    keel_log_set_handler(NULL, NULL, KEEL_LOG_WARN);
    /* refusals are logged, passwords and the token never */
    ck_assert_int_ge(atomic_load(&n_warned), 2);
    ck_assert_ptr_null(strstr(last_warning, w1c.password));
    ck_assert_ptr_null(strstr(last_warning, token));
    server_free(&sv);
    keel__curve_clear(&srv);
    keel__curve_clear(&w0c);
    keel__curve_clear(&w1c);
    keel__curve_clear(&wrong);
}
END_TEST

/* The ps of a loopback spec at bind: its socket file exists within 10 s. */
static void
wait_socket(const char *path)
{
    int64_t deadline = tu_now_ms() + 10000;
    struct stat st;
    while ((stat(path, &st) != 0 || !S_ISSOCK(st.st_mode)) &&
           tu_now_ms() < deadline)
        usleep(5000);
    ck_assert_msg(stat(path, &st) == 0 && S_ISSOCK(st.st_mode),
                  "no socket %s", path);
}

/* cluster.local_transport auto: a ps on this host also listens on its
 * Unix socket, a peer of this host computes the same path and connects
 * there once it exists; the token is checked over it as over tcp; a socket
 * file left by a killed ps does not stop its successor from binding; a ps
 * that exits removes its socket from the directory, which only this user
 * may enter. */
START_TEST(test_local_ps_over_ipc_checks_the_token_and_rebinds)
{
    const char *token = "0123456789abcdef-the-job";
    int ps_port = tu_held_port(), w_port = tu_held_port();
    char ps_addr[64], w_addr[64], ps_bind[KEEL__BIND_ENDPOINTS_MAX];
    char tcp_bind[256], path[256], ep[300], want[600];
    keel_cluster_spec *s;
    keel__curve srv, w0c, wrong;
    keel__wire_client *w0, *bad, *none;
    keel__wire_header h = { .type = KEEL_MSG_PULL,
                            .flags = KEEL_WIRE_F_NAMES_ONLY };
    keel__wire_msg r;
    server sv;
    pid_t child;
    int status;

    snprintf(ps_addr, sizeof ps_addr, "127.0.0.1:%d", ps_port);
    snprintf(w_addr, sizeof w_addr, "127.0.0.1:%d", w_port);
    s = tu_spec_from_lists(ps_addr, w_addr, NULL, KEEL_TASK_PS, 0);
    ck_assert_int_eq(keel_cluster_spec_validate(s), KEEL_OK);
    ck_assert_int_eq(keel__cluster_bind_endpoints(s, KEEL_TASK_PS, 0, NULL,
                                                  KEEL_LOCAL_TRANSPORT_TCP,
                                                  tcp_bind, sizeof tcp_bind),
                     KEEL_OK);
    ck_assert_ptr_null(strstr(tcp_bind, "ipc://"));
    ck_assert_int_eq(keel__cluster_bind_endpoints(s, KEEL_TASK_PS, 0, NULL,
                                                  KEEL_LOCAL_TRANSPORT_AUTO,
                                                  ps_bind, sizeof ps_bind),
                     KEEL_OK);
    ck_assert_int_eq(keel__cluster_ipc_path(ps_addr, 0, path, sizeof path),
                     1);
    snprintf(want, sizeof want, "%s ipc://%s", tcp_bind, path);
    ck_assert_str_eq(ps_bind, want);
    /* a host of another machine has none */
    ck_assert_int_eq(keel__cluster_ipc_path("192.0.2.1:2222", 0, path,
                                            sizeof path), 0);
    ck_assert_int_eq(keel__cluster_ipc_path(ps_addr, 0, path, sizeof path),
                     1);
    unlink(path);               /* a file of an earlier run on this port */
    /* no socket yet, or tcp asked for: tcp */
    ck_assert_int_eq(keel__cluster_peer_endpoint(ps_addr,
                                                 KEEL_LOCAL_TRANSPORT_AUTO,
                                                 ep, sizeof ep), KEEL_OK);
    snprintf(want, sizeof want, "tcp://%s", ps_addr);
    ck_assert_str_eq(ep, want);

    memset(&srv, 0, sizeof srv);
    memset(&w0c, 0, sizeof w0c);
    memset(&wrong, 0, sizeof wrong);
    ck_assert_int_eq(keel__auth_token(&srv, token, KEEL_TASK_PS, 0),
                     KEEL_OK);
    ck_assert_int_eq(keel__auth_token(&w0c, token, KEEL_TASK_WORKER, 0),
                     KEEL_OK);
    ck_assert_int_eq(keel__auth_token(&wrong, "another-job-token-0000",
                                      KEEL_TASK_WORKER, 0), KEEL_OK);

    /* a ps killed while listening leaves its socket file behind */
    child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        keel__ps *ps = NULL;
        keel_vars *vs = NULL;
        keel__ps_config cfg = { .bind = ps_bind, .curve = &srv,
                                .serve = ps_skel_serve };
        if (keel_vars_new(&vs) != KEEL_OK)
            _exit(3);
        cfg.vars = vs;
        if (keel__ps_new(&cfg, &ps) != KEEL_OK)
            _exit(4);
        for (;;)
            pause();
    }
    wait_socket(path);
    ck_assert_int_eq(kill(child, SIGKILL), 0);
    ck_assert_int_eq(waitpid(child, &status, 0), child);
    ck_assert(WIFSIGNALED(status));
    ck_assert_int_eq(access(path, F_OK), 0);
    ck_assert_int_eq(keel__cluster_peer_endpoint(ps_addr,
                                                 KEEL_LOCAL_TRANSPORT_TCP,
                                                 ep, sizeof ep), KEEL_OK);
    ck_assert_str_eq(ep, want);

    /* its successor binds the same endpoints */
    atomic_store(&n_warned, 0);
    keel_log_set_handler(count_warnings, NULL, KEEL_LOG_WARN);
    server_start_at(&sv, &srv, NULL, ps_bind);
    wait_socket(path);
    ck_assert_int_eq(keel__cluster_peer_endpoint(ps_addr,
                                                 KEEL_LOCAL_TRANSPORT_AUTO,
                                                 ep, sizeof ep), KEEL_OK);
    snprintf(want, sizeof want, "ipc://%s", path);
    ck_assert_str_eq(ep, want);
    ck_assert_int_eq(keel__wire_client_new(ep, &w0c, KEEL_TASK_WORKER, 0,
                                           &w0), KEEL_OK);
    ck_assert_int_eq(keel__wire_client_new(ep, &wrong, KEEL_TASK_WORKER, 0,
                                           &bad), KEEL_OK);
    ck_assert_int_eq(keel__wire_client_new(ep, NULL, KEEL_TASK_WORKER, 0,
                                           &none), KEEL_OK);
    check_pull(w0, 0.0f, 10.0f);
    /* without the job's token: refused by the ZAP handler, no answer */
    ck_assert_int_eq(keel__wire_client_call(bad, &h, NULL, 0, 0, 400, &r),
                     KEEL_ETIMEOUT);
    keel__wire_msg_clear(&r);
    ck_assert_int_eq(keel__wire_client_call(none, &h, NULL, 0, 0, 400, &r),
                     KEEL_ETIMEOUT);
    keel__wire_msg_clear(&r);
    check_pull(w0, 0.0f, 10.0f);
    /* a tcp-only task of this address leaves a live socket alone */
    ck_assert_int_eq(keel__cluster_bind_endpoints(s, KEEL_TASK_PS, 0, NULL,
                                                  KEEL_LOCAL_TRANSPORT_TCP,
                                                  tcp_bind, sizeof tcp_bind),
                     KEEL_OK);
    ck_assert_int_eq(access(path, F_OK), 0);
    keel__wire_client_free(w0);
    keel__wire_client_free(bad);
    keel__wire_client_free(none);
    server_join(&sv);
    keel_log_set_handler(NULL, NULL, KEEL_LOG_WARN);
    ck_assert_int_eq(keel__ps_served(sv.ps), 2);
    ck_assert_int_ge(atomic_load(&n_warned), 1);
    server_free(&sv);
    /* a ps that exits removes its socket; the directory stays private */
    ck_assert_int_ne(access(path, F_OK), 0);
    {
        char d[256];
        struct stat ds;
        snprintf(d, sizeof d, "%s", path);
        *strrchr(d, '/') = '\0';
        ck_assert_int_eq(lstat(d, &ds), 0);
        ck_assert(S_ISDIR(ds.st_mode));
        ck_assert_int_eq(ds.st_uid, geteuid());
        ck_assert_int_eq(ds.st_mode & 0777, 0700);
    }
    /* and removes a stale one */
    {
        struct sockaddr_un a;
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        memset(&a, 0, sizeof a);
        a.sun_family = AF_UNIX;
        ck_assert_uint_lt(strlen(path), sizeof a.sun_path);
        memcpy(a.sun_path, path, strlen(path));
        unlink(path);
        ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
        close(fd);
    }
    ck_assert_int_eq(access(path, F_OK), 0);
    ck_assert_int_eq(keel__cluster_bind_endpoints(s, KEEL_TASK_PS, 0, NULL,
                                                  KEEL_LOCAL_TRANSPORT_TCP,
                                                  tcp_bind, sizeof tcp_bind),
                     KEEL_OK);
    ck_assert_int_ne(access(path, F_OK), 0);
    keel__curve_clear(&srv);
    keel__curve_clear(&w0c);
    keel__curve_clear(&wrong);
    keel_cluster_spec_free(s);
}
END_TEST

START_TEST(test_curve_admits_allowed_keys_only)
{
    char keys[4200], allowed[4200], path[4300];
    keel__curve srv, ok_c, bad_c;
    server sv;
    keel__wire_client *c1, *c2, *c3;
    keel__wire_header h = { .type = KEEL_MSG_PULL,
                            .flags = KEEL_WIRE_F_NAMES_ONLY };
    keel__wire_msg r;
    char pub[41];

    snprintf(keys, sizeof keys, "%s/keys", tu_dir);
    snprintf(allowed, sizeof allowed, "%s/allowed", tu_dir);
    ck_assert_int_eq(keel_cluster_keygen(keys, "server", NULL), KEEL_OK);
    ck_assert_int_eq(keel_cluster_keygen(keys, "worker0", NULL), KEEL_OK);
    ck_assert_int_eq(keel_cluster_keygen(keys, "stranger", NULL), KEEL_OK);
    ck_assert_int_eq(keel_cluster_keygen(allowed, "worker0", pub), KEEL_OK);
    memset(&srv, 0, sizeof srv);
    memset(&ok_c, 0, sizeof ok_c);
    memset(&bad_c, 0, sizeof bad_c);
    ck_assert_int_eq(keel__curve_load(&srv, keys, "server"), KEEL_OK);
    /* the allowed dir holds good's public key (and its own secret, which
     * the server ignores): use the key pair written there. */
    ck_assert_int_eq(keel__curve_allow_dir(&srv, allowed), KEEL_OK);
    ck_assert_int_eq(srv.n_allowed, 1);
    ck_assert_int_eq(keel__curve_load(&ok_c, allowed, "worker0"), KEEL_OK);
    ck_assert_int_eq(keel__curve_load(&bad_c, keys, "stranger"), KEEL_OK);
    memcpy(ok_c.server_key, srv.public_key, KEEL_Z85_KEY);
    memcpy(bad_c.server_key, srv.public_key, KEEL_Z85_KEY);

    atomic_store(&n_warned, 0);
    keel_log_set_handler(count_warnings, NULL, KEEL_LOG_WARN);
    server_start(&sv, &srv, NULL);
    c1 = worker_client(&sv, &ok_c, 0);
    c2 = worker_client(&sv, &bad_c, 1);
    c3 = worker_client(&sv, NULL, 2);
    check_pull(c1, 0.0f, 10.0f);
    ck_assert_int_eq(keel__wire_client_call(c2, &h, NULL, 0, 0, 400, &r),
                     KEEL_ETIMEOUT);
    keel__wire_msg_clear(&r);
    ck_assert_int_eq(keel__wire_client_call(c3, &h, NULL, 0, 0, 400, &r),
                     KEEL_ETIMEOUT);
    keel__wire_msg_clear(&r);
    /* the stranger cannot push either, and nothing changed */
    {
        keel_tensor g;
        int64_t bs[1] = { 3 };
        keel__wire_out o = { "layer/b", &g, NULL };
        keel__wire_header ph = { .type = KEEL_MSG_PUSH };
        ck_assert_int_eq(keel_tensor_alloc(&g, 1, bs), KEEL_OK);
        g.data[0] = 1000.0f;
        ck_assert_int_eq(keel__wire_client_call(c2, &ph, &o, 1, 0, 400, &r),
                         KEEL_ETIMEOUT);
        keel__wire_msg_clear(&r);
        keel_tensor_release(&g);
    }
    check_pull(c1, 0.0f, 10.0f);
    keel__wire_client_free(c1);
    keel__wire_client_free(c2);
    keel__wire_client_free(c3);
    server_join(&sv);
    ck_assert_int_eq(keel__ps_served(sv.ps), 2);    /* only c1's pulls */
    ck_assert_int_eq(keel__ps_rejected(sv.ps), 0);
    keel_log_set_handler(NULL, NULL, KEEL_LOG_WARN);
    /* the stranger was refused by the ZAP handler (logged with its public
     * key, never a secret) */
    ck_assert_int_ge(atomic_load(&n_warned), 1);
    ck_assert_ptr_nonnull(strstr(last_warning, bad_c.public_key));
    ck_assert_ptr_null(strstr(last_warning, bad_c.secret_key));
    server_free(&sv);
    keel__curve_clear(&srv);
    keel__curve_clear(&ok_c);
    keel__curve_clear(&bad_c);
    (void)path;
}
END_TEST

/* ---- CLI ---------------------------------------------------------------- */

START_TEST(test_cli_keygen)
{
    const char *dir = tu_path("clikeys");
    char path[4300];
    struct stat sb;
    ck_assert_int_eq(TU_KEEL(10000, "keygen", "--help"), 0);
    ck_assert_ptr_nonnull(strstr(out, "usage: keel keygen"));
    ck_assert_int_eq(TU_KEEL(10000, "keygen"), 2);
    ck_assert_ptr_nonnull(strstr(err, "keel: keygen: missing DIR"));
    ck_assert_int_eq(TU_KEEL(10000, "keygen", dir, "--name", "w3"), 0);
    ck_assert_ptr_nonnull(strstr(out, "public key: "));
    snprintf(path, sizeof path, "%s/w3.key_secret", dir);
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0600);
    {
        char *secret = tu_read_file(path, NULL);
        secret[40] = '\0';
        ck_assert_ptr_null(strstr(out, secret));   /* never printed */
        ck_assert_ptr_null(strstr(err, secret));
        free(secret);
    }
    ck_assert_int_eq(TU_KEEL(10000, "keygen", dir, "--name", "w3"), 2);
    ck_assert_ptr_nonnull(strstr(err, "already exists"));
    ck_assert_int_eq(TU_KEEL(10000, "keygen", dir, "--bogus"), 2);
}
END_TEST

/* ---- the real ps (roles): optimizer apply, readiness, sync tokens ------- */

static keel_status
sgd_apply(void *ctx, keel_var *v, const keel_tensor *g, int64_t step)
{
    keel_tensor *t = keel_var_tensor(v);
    (void)ctx;
    (void)step;
    for (size_t i = 0; i < t->count; i++)
        t->data[i] -= g->data[i];
    return KEEL_OK;
}

static keel_status
make_tensor(keel_tensor *t, const float *v, int ndim, const int64_t *shape)
{
    keel_status st = keel_tensor_alloc(t, ndim, shape);
    if (st == KEEL_OK)
        memcpy(t->data, v, t->count * sizeof(float));
    return st;
}

/* layer/w [2,3] from w and layer/b [3] from b (b NULL: layer/w alone),
 * as the wire outs of an INIT or a PUSH (out borrows t). */
typedef struct wb {
    keel_tensor t[2];
    keel__wire_out out[2];
} wb;

static void
wb_make(wb *p, const float *w, const float *b)
{
    static const int64_t ws[2] = { 2, 3 }, bs[1] = { 3 };
    memset(p, 0, sizeof *p);
    ck_assert_int_eq(make_tensor(&p->t[0], w, 2, ws), KEEL_OK);
    p->out[0] = (keel__wire_out){ "layer/w", &p->t[0], NULL };
    if (b == NULL)
        return;
    ck_assert_int_eq(make_tensor(&p->t[1], b, 1, bs), KEEL_OK);
    p->out[1] = (keel__wire_out){ "layer/b", &p->t[1], NULL };
}

/* A new store of layer/w [2,3] and layer/b [3], trainable. */
static keel_vars *
wb_vars(void)
{
    static const int64_t ws[2] = { 2, 3 }, bs[1] = { 3 };
    keel_vars *vs;
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "layer/w", 2, ws,
                                      KEEL_VAR_TRAINABLE, NULL), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "layer/b", 1, bs,
                                      KEEL_VAR_TRAINABLE, NULL), KEEL_OK);
    return vs;
}

static void
wb_release(wb *p)
{
    keel_tensor_release(&p->t[0]);
    keel_tensor_release(&p->t[1]);
}

/* A real sync ps (SGD at rate 1, no chief job) over a new store of
 * layer/w [2,3] and layer/b [3], aggregating rta of total replicas, served
 * by a thread. On a refusal the store is left for the caller to free. */
static keel_status
sync_ps_start(server *sv, int rta, int total)
{
    keel__ps_config cfg = { .bind = "tcp://127.0.0.1:*" };
    keel_status st;
    memset(sv, 0, sizeof *sv);
    sv->vars = wb_vars();
    cfg.vars = sv->vars;
    cfg.apply = sgd_apply;
    cfg.sync = 1;
    cfg.replicas_to_aggregate = rta;
    cfg.total_replicas = total;
    if ((st = keel__ps_new(&cfg, &sv->ps)) != KEEL_OK)
        return st;
    atomic_store(&sv->stop, 0);
    ck_assert_int_eq(pthread_create(&sv->th, NULL, server_main, sv), 0);
    return KEEL_OK;
}

static void
real_start(server *sv)
{
    ck_assert_int_eq(sync_ps_start(sv, 2, 2), KEEL_OK);
}

/* One call that must fail with an ERROR of code naming needle. */
static void
expect_call_error(keel__wire_client *c, keel__wire_header *h,
                  const keel__wire_out *ts, size_t n, keel_status code,
                  const char *needle)
{
    keel__wire_msg r;
    ck_assert_int_eq(keel__wire_client_call(c, h, ts, n, 0, 3000, &r),
                     KEEL_EPEER);
    ck_assert_int_eq(r.h.type, KEEL_MSG_ERROR);
    ck_assert_int_eq(r.h.arg, code);
    ck_assert_msg(strstr(r.text, needle) != NULL, "'%s' lacks '%s'", r.text,
                  needle);
    keel__wire_msg_clear(&r);
}

START_TEST(test_real_ps_checks_requests_and_aggregates_in_sync)
{
    server sv;
    keel__wire_client *w0, *w1;
    float wv[6] = { 1, 2, 3, 4, 5, 6 }, bv[3] = { 7, 8, 9 };
    float g0[6] = { 1, 1, 1, 1, 1, 1 }, g1[6] = { 2, 2, 2, 2, 2, 2 };
    int64_t wrong[2] = { 3, 2 };
    keel_tensor twrong;
    wb init, p0, p1;
    keel__wire_out bad[1];
    keel__wire_header h;
    keel__wire_msg r;
    void *zctx = zmq_ctx_new(), *raw0 = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;

    wb_make(&init, wv, bv);
    wb_make(&p0, g0, NULL);
    wb_make(&p1, g1, NULL);
    ck_assert_int_eq(make_tensor(&twrong, g0, 2, wrong), KEEL_OK);
    bad[0] = (keel__wire_out){ "layer/w", &twrong, NULL };
    real_start(&sv);
    w0 = worker_client(&sv, NULL, 0);
    w1 = worker_client(&sv, NULL, 1);
    /* before INIT: nothing to pull or push, HELLO says not ready */
    header_of(&h, KEEL_MSG_PULL);
    h.flags = KEEL_WIRE_F_NAMES_ONLY;
    expect_call_error(w1, &h, NULL, 0, KEEL_EUNAVAILABLE, "no state yet");
    header_of(&h, KEEL_MSG_PUSH);
    expect_call_error(w1, &h, p1.out, 1, KEEL_EUNAVAILABLE, "no state yet");
    header_of(&h, KEEL_MSG_HELLO);
    ck_assert_int_eq(keel__wire_client_call(w1, &h, NULL, 0, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.type, KEEL_MSG_READY);
    ck_assert_int_eq(r.h.arg, 0);
    keel__wire_msg_clear(&r);
    /* only the chief (worker 0: no chief job) initializes */
    header_of(&h, KEEL_MSG_INIT);
    expect_call_error(w1, &h, init.out, 2, KEEL_EINVAL, "worker1 may not send "
                      "INIT");
    /* a global step out of range: refused, nothing initialized */
    header_of(&h, KEEL_MSG_INIT);
    h.global_step = -1;
    expect_call_error(w0, &h, init.out, 2, KEEL_EINVAL, "INIT with global step "
                      "-1");
    header_of(&h, KEEL_MSG_INIT);
    h.global_step = INT64_MAX;
    expect_call_error(w0, &h, init.out, 2, KEEL_EINVAL, "must be 0..");
    header_of(&h, KEEL_MSG_INIT);
    h.global_step = 5;
    ck_assert_int_eq(keel__wire_client_call(w0, &h, init.out, 2, 0, 3000, &r),
                     KEEL_OK);
    keel__wire_msg_clear(&r);
    /* wrong shape, slot, ahead of the ps: refused, server goes on */
    header_of(&h, KEEL_MSG_PUSH);
    h.local_step = 5;
    expect_call_error(w1, &h, bad, 1, KEEL_EINVAL, "has shape [2,3]");
    header_of(&h, KEEL_MSG_PUSH);
    h.local_step = 6;
    expect_call_error(w1, &h, p1.out, 1, KEEL_EABORTED, "ps 0 is at step 5");
    /* sync: worker 0's push is held until worker 1's arrives */
    zmq_setsockopt(raw0, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert_int_eq(zmq_connect(raw0, keel__ps_endpoint(sv.ps)), 0);
    header_of(&h, KEEL_MSG_PUSH);
    h.request_id = 77;
    h.sender_type = KEEL_TASK_WORKER;
    h.sender_index = 0;
    h.local_step = 5;
    ck_assert_int_eq(keel__wire_send(raw0, NULL, &h, p0.out, 1, NULL, NULL),
                     KEEL_OK);
    {
        keel__wire_limits lim = { 0 };
        ck_assert_int_eq(keel__wire_recv(raw0, 0, &lim, 200, &r),
                         KEEL_ETIMEOUT);          /* held: no token yet */
        keel__wire_msg_clear(&r);
        header_of(&h, KEEL_MSG_PUSH);
        h.flags = KEEL_WIRE_F_WANT_VALUES;
        h.local_step = 5;
        ck_assert_int_eq(keel__wire_client_call(w1, &h, p1.out, 1, 0, 3000, &r),
                         KEEL_OK);
        ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
        ck_assert_int_eq(r.h.global_step, 6);
        ck_assert_int_eq(r.n, 1);
        for (int i = 0; i < 6; i++)           /* w - (g0 + g1) / 2 */
            ck_assert_float_eq(r.tensors[0].t.data[i], wv[i] - 1.5f);
        keel__wire_msg_clear(&r);
        ck_assert_int_eq(keel__wire_recv(raw0, 0, &lim, 3000, &r), KEEL_OK);
        ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
        ck_assert_int_eq(r.h.request_id, 77);
        ck_assert_int_eq(r.h.global_step, 6);
        keel__wire_msg_clear(&r);
    }
    /* a late gradient for step 5 is stale: dropped, answered at once */
    header_of(&h, KEEL_MSG_PUSH);
    h.local_step = 5;
    ck_assert_int_eq(keel__wire_client_call(w1, &h, p1.out, 1, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.global_step, 6);
    keel__wire_msg_clear(&r);
    header_of(&h, KEEL_MSG_STEP);
    ck_assert_int_eq(keel__wire_client_call(w1, &h, NULL, 0, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_ptr_nonnull(r.text);
    ck_assert_str_eq(r.text, "applied=2 dropped=1 ready=1 step=6");
    keel__wire_msg_clear(&r);
    zmq_close(raw0);
    zmq_ctx_term(zctx);
    keel__wire_client_free(w0);
    keel__wire_client_free(w1);
    server_stop(&sv);
    wb_release(&init);
    wb_release(&p0);
    wb_release(&p1);
    keel_tensor_release(&twrong);
}
END_TEST

/* Replicas that trained on different numbers of examples: the update is
 * the mean over every example, each replica's mean gradient weighted by
 * the example count in its PUSH header. Worker 0 declares 3 examples with
 * mean gradients 1 (w) and 2 (b), worker 1 one example with 5 and 6: the
 * mean is (3 * 1 + 5) / 4 = 2 and (3 * 2 + 6) / 4 = 3 (the unweighted
 * mean of the two would be 3 and 4). Then one step without counts: equal
 * weights. SGD at learning rate 1. */
START_TEST(test_real_ps_weighs_replicas_by_their_examples)
{
    server sv;
    keel__wire_client *w[2];
    float wv[6] = { 10, 20, 30, 40, 50, 60 }, bv[3] = { 1, 2, 3 };
    float g0w[6] = { 1, 1, 1, 1, 1, 1 }, g0b[3] = { 2, 2, 2 };
    float g1w[6] = { 5, 5, 5, 5, 5, 5 }, g1b[3] = { 6, 6, 6 };
    wb init, p0, p1;
    keel__wire_header h;
    keel__wire_msg r;
    uint64_t id0;

    wb_make(&init, wv, bv);
    wb_make(&p0, g0w, g0b);
    wb_make(&p1, g1w, g1b);
    ck_assert_msg(sync_ps_start(&sv, 2, 2) == KEEL_OK, "%s",
                  keel_last_error());
    for (int i = 0; i < 2; i++)
        w[i] = worker_client(&sv, NULL, i);
    header_of(&h, KEEL_MSG_INIT);
    ck_assert_int_eq(keel__wire_client_call(w[0], &h, init.out, 2, 0, 3000, &r),
                     KEEL_OK);
    keel__wire_msg_clear(&r);
    for (int step = 0; step < 2; step++) {
        float dw = step == 0 ? 2.0f : 3.0f, db = step == 0 ? 3.0f : 4.0f;
        header_of(&h, KEEL_MSG_PUSH);
        h.local_step = step;
        h.examples = step == 0 ? 3 : 0;
        ck_assert_int_eq(keel__wire_client_send(w[0], &h, p0.out, 2, 0,
                                                3000), KEEL_OK);
        id0 = h.request_id;
        header_of(&h, KEEL_MSG_PUSH);
        h.flags = KEEL_WIRE_F_WANT_VALUES;
        h.local_step = step;
        h.examples = 1;
        ck_assert_int_eq(keel__wire_client_call(w[1], &h, p1.out, 2, 0, 3000,
                                                &r), KEEL_OK);
        ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
        ck_assert_int_eq(r.h.global_step, step + 1);
        ck_assert_int_eq(r.n, 2);
        for (int i = 0; i < 6; i++) {
            wv[i] -= dw;
            ck_assert_float_eq(r.tensors[0].t.data[i], wv[i]);
        }
        for (int i = 0; i < 3; i++) {
            bv[i] -= db;
            ck_assert_float_eq(r.tensors[1].t.data[i], bv[i]);
        }
        keel__wire_msg_clear(&r);
        ck_assert_int_eq(keel__wire_client_wait(w[0], id0, 0, 3000, &r),
                         KEEL_OK);
        ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
        keel__wire_msg_clear(&r);
    }
    for (int i = 0; i < 2; i++)
        keel__wire_client_free(w[i]);
    server_stop(&sv);
    wb_release(&init);
    wb_release(&p0);
    wb_release(&p1);
}
END_TEST

/* ---- gradient rows (KEEL_WIRE_F_ROWS) ----------------------------------- */

/* The tests' updates of a rows ps: the gradient becomes the value (dense)
 * and each row its variable's row (rows), so the values show the
 * aggregated gradient's bits. */
static keel_status
take_apply(void *ctx, keel_var *v, const keel_tensor *g, int64_t step)
{
    keel_tensor *t = keel_var_tensor(v);
    (void)ctx;
    (void)step;
    memcpy(t->data, g->data, t->count * sizeof(float));
    return KEEL_OK;
}

static keel_status
take_rows(void *ctx, keel_var *v, size_t n, const int64_t *ids,
          const float *rows, int64_t step)
{
    keel_tensor *t = keel_var_tensor(v);
    size_t row = t->count / (size_t)t->shape[0];
    (void)ctx;
    (void)step;
    for (size_t k = 0; k < n; k++)
        memcpy(t->data + (size_t)ids[k] * row, rows + k * row,
               row * sizeof(float));
    return KEEL_OK;
}

enum { EMB_ROWS = 5, EMB_COLS = 3 };

/* A real ps (sync: of 2 replicas, no chief job) over emb [5,3] with the
 * take_* updates, served by a thread, initialized by worker 0 to init. */
static void
rows_ps_start(server *sv, int sync, const float *init)
{
    static const int64_t shape[2] = { EMB_ROWS, EMB_COLS };
    keel__ps_config cfg = { .bind = "tcp://127.0.0.1:*" };
    keel_tensor t;
    keel__wire_out o = { "emb", &t, NULL };
    keel__wire_header h;
    keel__wire_msg r;
    keel__wire_client *c;
    memset(sv, 0, sizeof *sv);
    ck_assert_int_eq(keel_vars_new(&sv->vars), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(sv->vars, "emb", 2, shape,
                                      KEEL_VAR_TRAINABLE, NULL), KEEL_OK);
    cfg.vars = sv->vars;
    cfg.apply = take_apply;
    cfg.apply_rows = take_rows;
    cfg.sync = sync;
    cfg.replicas_to_aggregate = 2;
    cfg.total_replicas = 2;
    ck_assert_int_eq(keel__ps_new(&cfg, &sv->ps), KEEL_OK);
    atomic_store(&sv->stop, 0);
    ck_assert_int_eq(pthread_create(&sv->th, NULL, server_main, sv), 0);
    ck_assert_int_eq(make_tensor(&t, init, 2, shape), KEEL_OK);
    c = worker_client(sv, NULL, 0);
    header_of(&h, KEEL_MSG_INIT);
    ck_assert_int_eq(keel__wire_client_call(c, &h, &o, 1, 0, 3000, &r),
                     KEEL_OK);
    keel__wire_msg_clear(&r);
    keel__wire_client_free(c);
    keel_tensor_release(&t);
}

/* A push's rows of emb as the wire sends them: the ids tensor (2 float32
 * words per int64 id) and the rows [n, 3]. */
typedef struct rows_push {
    int64_t ids[8];
    float rows[8 * EMB_COLS];
    keel_tensor ti, tr;
    keel__wire_out out[2];
} rows_push;

static void
rows_make(rows_push *p, size_t n, const int64_t *ids, const float *rows)
{
    memset(p, 0, sizeof *p);
    memcpy(p->ids, ids, n * sizeof *ids);
    memcpy(p->rows, rows, n * EMB_COLS * sizeof *rows);
    for (int d = 0; d < KEEL_MAX_DIMS; d++)
        p->ti.shape[d] = p->tr.shape[d] = 1;
    p->ti.ndim = 1;
    p->ti.shape[0] = (int64_t)(2 * n);
    p->ti.count = 2 * n;
    p->ti.data = (float *)(void *)p->ids;
    p->tr.ndim = 2;
    p->tr.shape[0] = (int64_t)n;
    p->tr.shape[1] = EMB_COLS;
    p->tr.count = n * EMB_COLS;
    p->tr.data = p->rows;
    p->out[0] = (keel__wire_out){ KEEL__WIRE_IDS_NAME, &p->ti, NULL };
    p->out[1] = (keel__wire_out){ "emb", &p->tr, NULL };
}

/* Bad rows are refused by the ps naming the sender and the variable, and
 * nothing of them is applied: an id past the rows, ids not ascending (or
 * repeated), more ids than the variable has rows. */
START_TEST(test_rows_push_bad_ids_are_refused_by_name)
{
    static const int64_t out_of_range[2] = { 1, 5 }, descending[2] = { 3, 2 },
        repeated[2] = { 2, 2 }, too_many[6] = { 0, 1, 2, 3, 4, 5 };
    float init[EMB_ROWS * EMB_COLS], rows[6 * EMB_COLS];
    server sv;
    keel__wire_client *c;
    keel__wire_header h;
    rows_push p;
    for (int i = 0; i < EMB_ROWS * EMB_COLS; i++)
        init[i] = (float)i;
    for (int i = 0; i < 6 * EMB_COLS; i++)
        rows[i] = 100.0f + (float)i;
    for (int sync = 0; sync <= 1; sync++) {
        rows_ps_start(&sv, sync, init);
        c = worker_client(&sv, NULL, 1);
        rows_make(&p, 2, out_of_range, rows);
        header_of(&h, KEEL_MSG_PUSH);
        h.flags = KEEL_WIRE_F_ROWS;
        expect_call_error(c, &h, p.out, 2, KEEL_EINVAL, "PUSH from worker 1: "
                          "id 5 (entry 1) is outside the 5 rows of 'emb'");
        rows_make(&p, 2, descending, rows);
        header_of(&h, KEEL_MSG_PUSH);
        h.flags = KEEL_WIRE_F_ROWS;
        expect_call_error(c, &h, p.out, 2, KEEL_EINVAL, "PUSH from worker 1: "
                          "the ids of 'emb' are not strictly ascending");
        rows_make(&p, 2, repeated, rows);
        header_of(&h, KEEL_MSG_PUSH);
        h.flags = KEEL_WIRE_F_ROWS;
        expect_call_error(c, &h, p.out, 2, KEEL_EINVAL, "not strictly "
                          "ascending (2 after 2");
        rows_make(&p, 6, too_many, rows);
        header_of(&h, KEEL_MSG_PUSH);
        h.flags = KEEL_WIRE_F_ROWS;
        expect_call_error(c, &h, p.out, 2, KEEL_EINVAL, "PUSH from worker 1: "
                          "6 rows of 'emb', which has 5");
        /* the rows without their ids tensor: refused too */
        header_of(&h, KEEL_MSG_PUSH);
        h.flags = KEEL_WIRE_F_ROWS;
        expect_call_error(c, &h, p.out + 1, 1, KEEL_ECORRUPT, "PUSH from "
                          "worker 1: rows flagged but none sent");
        keel__wire_client_free(c);
        server_join(&sv);
        ck_assert_int_eq(memcmp(keel_var_tensor(keel_vars_find(sv.vars,
                                                               "emb"))->data,
                                init, sizeof init), 0);
        server_free(&sv);
    }
}
END_TEST

/* Async: a push of rows is applied as it comes, to those rows only, and
 * its ack with values carries the variable. */
START_TEST(test_rows_async_push_applies_those_rows)
{
    static const int64_t ids[2] = { 1, 3 };
    float init[EMB_ROWS * EMB_COLS], rows[2 * EMB_COLS];
    float want[EMB_ROWS * EMB_COLS];
    server sv;
    keel__wire_client *c;
    keel__wire_header h;
    keel__wire_msg r;
    rows_push p;
    for (int i = 0; i < EMB_ROWS * EMB_COLS; i++)
        want[i] = init[i] = (float)i;
    for (int i = 0; i < 2 * EMB_COLS; i++)
        rows[i] = 50.0f + (float)i;
    for (int k = 0; k < 2; k++)
        memcpy(want + ids[k] * EMB_COLS, rows + k * EMB_COLS,
               EMB_COLS * sizeof(float));
    rows_ps_start(&sv, 0, init);
    c = worker_client(&sv, NULL, 1);
    rows_make(&p, 2, ids, rows);
    header_of(&h, KEEL_MSG_PUSH);
    h.flags = KEEL_WIRE_F_ROWS | KEEL_WIRE_F_WANT_VALUES;
    ck_assert_msg(keel__wire_client_call(c, &h, p.out, 2, 0, 3000, &r) ==
                  KEEL_OK, "%s", keel_last_error());
    ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
    ck_assert_int_eq(r.h.global_step, 1);
    ck_assert_int_eq(r.n, 1);
    ck_assert_str_eq(r.tensors[0].name, "emb");
    ck_assert_uint_eq(r.tensors[0].t.count, EMB_ROWS * EMB_COLS);
    ck_assert_int_eq(memcmp(r.tensors[0].t.data, want, sizeof want), 0);
    keel__wire_msg_clear(&r);
    keel__wire_client_free(c);
    server_stop(&sv);
}
END_TEST

/* Two replicas' pushes of one sync step (worker 0 over 3 examples, worker
 * 1 over 2): dense, and as rows with overlapping ids. The ps's mean of
 * the rows has the dense mean's bits on every row either touched; the
 * untouched row stays (a lazy update). */
START_TEST(test_rows_sync_mean_has_the_dense_bits)
{
    static const int64_t ids0[3] = { 0, 2, 3 }, ids1[2] = { 2, 4 };
    static const int64_t shape[2] = { EMB_ROWS, EMB_COLS };
    float init[EMB_ROWS * EMB_COLS], r0[3 * EMB_COLS], r1[2 * EMB_COLS];
    float dense[EMB_ROWS * EMB_COLS], sparse[EMB_ROWS * EMB_COLS];
    keel_tensor d0, d1;
    rows_push p0, p1;
    int touched[EMB_ROWS] = { 1, 0, 1, 1, 1 };
    for (int i = 0; i < EMB_ROWS * EMB_COLS; i++)
        init[i] = -7.0f - (float)i;
    for (int i = 0; i < 3 * EMB_COLS; i++) {
        volatile float a = 1.0f / (float)(i + 3);
        r0[i] = a * 0.7f;
    }
    for (int i = 0; i < 2 * EMB_COLS; i++) {
        volatile float a = -0.3f * (float)(i + 1) / 7.0f;
        r1[i] = a;
    }
    ck_assert_int_eq(keel_tensor_alloc(&d0, 2, shape), KEEL_OK);
    ck_assert_int_eq(keel_tensor_alloc(&d1, 2, shape), KEEL_OK);
    for (int k = 0; k < 3; k++)
        memcpy(d0.data + ids0[k] * EMB_COLS, r0 + k * EMB_COLS,
               EMB_COLS * sizeof(float));
    for (int k = 0; k < 2; k++)
        memcpy(d1.data + ids1[k] * EMB_COLS, r1 + k * EMB_COLS,
               EMB_COLS * sizeof(float));
    rows_make(&p0, 3, ids0, r0);
    rows_make(&p1, 2, ids1, r1);
    for (int as_rows = 0; as_rows <= 1; as_rows++) {
        server sv;
        keel__wire_client *w0, *w1;
        keel__wire_header h0, h1;
        keel__wire_msg r;
        keel__wire_out o0 = { "emb", &d0, NULL }, o1 = { "emb", &d1, NULL };
        rows_ps_start(&sv, 1, init);
        w0 = worker_client(&sv, NULL, 0);
        w1 = worker_client(&sv, NULL, 1);
        header_of(&h0, KEEL_MSG_PUSH);
        h0.examples = 3;
        header_of(&h1, KEEL_MSG_PUSH);
        h1.examples = 2;
        if (as_rows) {
            h0.flags = h1.flags = KEEL_WIRE_F_ROWS;
            ck_assert_int_eq(keel__wire_client_send(w0, &h0, p0.out, 2, 0,
                                                    3000), KEEL_OK);
            ck_assert_int_eq(keel__wire_client_call(w1, &h1, p1.out, 2, 0,
                                                    3000, &r), KEEL_OK);
        } else {
            ck_assert_int_eq(keel__wire_client_send(w0, &h0, &o0, 1, 0,
                                                    3000), KEEL_OK);
            ck_assert_int_eq(keel__wire_client_call(w1, &h1, &o1, 1, 0,
                                                    3000, &r), KEEL_OK);
        }
        ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
        keel__wire_msg_clear(&r);
        ck_assert_int_eq(keel__wire_client_wait(w0, h0.request_id, 0, 3000,
                                                &r), KEEL_OK);
        ck_assert_int_eq(r.h.global_step, 1);
        keel__wire_msg_clear(&r);
        keel__wire_client_free(w0);
        keel__wire_client_free(w1);
        server_join(&sv);
        memcpy(as_rows ? sparse : dense,
               keel_var_tensor(keel_vars_find(sv.vars, "emb"))->data,
               sizeof dense);
        server_free(&sv);
    }
    for (int i = 0; i < EMB_ROWS; i++)
        ck_assert_msg(memcmp(sparse + i * EMB_COLS,
                             touched[i] ? dense + i * EMB_COLS
                                        : init + i * EMB_COLS,
                             EMB_COLS * sizeof(float)) == 0,
                      "row %d: %a %a %a, dense %a %a %a", i,
                      (double)sparse[i * EMB_COLS],
                      (double)sparse[i * EMB_COLS + 1],
                      (double)sparse[i * EMB_COLS + 2],
                      (double)dense[i * EMB_COLS],
                      (double)dense[i * EMB_COLS + 1],
                      (double)dense[i * EMB_COLS + 2]);
    /* the mean is not a plain copy: row 2 mixes both replicas */
    ck_assert_msg(sparse[2 * EMB_COLS] != r0[EMB_COLS] &&
                  sparse[2 * EMB_COLS] != r1[0], "row 2 is one replica's");
    keel_tensor_release(&d0);
    keel_tensor_release(&d1);
}
END_TEST

/* The weighted mean's kernel against the defining scalar loop, written
 * out here: (w0 g0 + w1 g1 + ...) / total in double, left to right, then
 * rounded to float. 3 sources of 2 x 1024 + 1003 elements (whole blocks
 * and a tail) of awkward values; equal weights and unequal ones, with a
 * total that is a power of two (the quotient by a multiplication) and one
 * that is not (a division). */
START_TEST(test_weighted_mean_kernel_has_the_scalar_bits)
{
    enum { N = 2 * 1024 + 1003, K = 3 };
    static const double ws[4][K] = {
        { 1, 1, 1 }, { 32, 32, 64 }, { 3, 5, 7 }, { 1, 2, 5 } };
    static float src[K][N], dst[N];
    const float *ps[K] = { src[0], src[1], src[2] };
    uint32_t x = 12345;
    for (int r = 0; r < K; r++)
        for (int i = 0; i < N; i++) {
            x = x * 1664525u + 1013904223u;
            src[r][i] = (float)((int32_t)x) / 3.0e7f;
        }
    for (int c = 0; c < 4; c++) {
        double total = ws[c][0] + ws[c][1] + ws[c][2];
        keel__weighted_mean_into(dst, ps, ws[c], K, total, N);
        for (int i = 0; i < N; i++) {
            double d = ws[c][0] * (double)src[0][i];
            d += ws[c][1] * (double)src[1][i];
            d += ws[c][2] * (double)src[2][i];
            float want = (float)(d / total);
            ck_assert_msg(memcmp(&dst[i], &want, sizeof want) == 0,
                          "case %d, element %d: %a, want %a", c, i,
                          (double)dst[i], (double)want);
        }
    }
}
END_TEST

/* One sync step of R workers (no chief) pushing gw / gb with the example
 * counts ex (0: one); wv and bv are the values the last reply brings. */
static void
sync_round(keel__wire_client **w, int R, int step, float (*gw)[6],
           float (*gb)[3], const uint32_t *ex, float *wv, float *bv)
{
    uint64_t ids[8];
    keel__wire_header h;
    keel__wire_msg r;
    wb p[8];
    for (int i = 0; i < R; i++) {
        wb_make(&p[i], gw[i], gb[i]);
        header_of(&h, KEEL_MSG_PUSH);
        h.local_step = step;
        h.examples = ex[i];
        if (i < R - 1) {
            ck_assert_int_eq(keel__wire_client_send(w[i], &h, p[i].out, 2,
                                                    0, 3000), KEEL_OK);
            ids[i] = h.request_id;
            continue;
        }
        h.flags = KEEL_WIRE_F_WANT_VALUES;
        ck_assert_int_eq(keel__wire_client_call(w[i], &h, p[i].out, 2, 0,
                                                3000, &r), KEEL_OK);
        ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
        ck_assert_int_eq(r.h.global_step, step + 1);
        ck_assert_int_eq(r.n, 2);
        memcpy(wv, r.tensors[0].t.data, 6 * sizeof *wv);
        memcpy(bv, r.tensors[1].t.data, 3 * sizeof *bv);
        keel__wire_msg_clear(&r);
    }
    for (int i = 0; i < R - 1; i++) {
        ck_assert_int_eq(keel__wire_client_wait(w[i], ids[i], 0, 3000, &r),
                         KEEL_OK);
        ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
        keel__wire_msg_clear(&r);
    }
    for (int i = 0; i < R; i++)
        wb_release(&p[i]);
}

/* The sync ps's example-weighted mean on a real server (SGD at rate 1,
 * values 0: the new values are minus the mean). Equal counts: 3 replicas
 * pushing the same awkward gradient apply exactly its bits (summed in
 * float and scaled once, ((g + g) + g) * (1 / 3) misses them for some of
 * these values: checked first, so the test can tell). Unequal counts 3,
 * 5, 7: the mean as (3 g0 + 5 g1 + 7 g2) / 15 in double, then rounded to
 * float. Step 1 starts from the values step 0 left. */
START_TEST(test_real_ps_weighted_mean_with_equal_and_unequal_counts)
{
    enum { R = 3 };
    server sv;
    keel__wire_client *w[R];
    float zw[6] = { 0 }, zb[3] = { 0 }, wv[6], bv[3];
    float g[9] = { 0.1f, 1.0f / 3.0f, 1.0f + 0x1p-23f, 3.3e-5f, -7.77f,
                   0.7f, 1e-3f, 2.2f, -1.0f / 7.0f };
    float gw[R][6], gb[R][3];
    uint32_t eq[R] = { 4, 4, 4 }, uneq[R] = { 3, 5, 7 };
    int misses = 0;
    wb init;
    keel__wire_header h;
    keel__wire_msg r;

    for (int e = 0; e < 9; e++) {
        volatile float s = g[e] + g[e];
        s = s + g[e];
        misses += s * (1.0f / 3.0f) != g[e];
    }
    ck_assert_int_gt(misses, 0);
    wb_make(&init, zw, zb);
    ck_assert_msg(sync_ps_start(&sv, R, R) == KEEL_OK, "%s",
                  keel_last_error());
    for (int i = 0; i < R; i++)
        w[i] = worker_client(&sv, NULL, i);
    header_of(&h, KEEL_MSG_INIT);
    ck_assert_int_eq(keel__wire_client_call(w[0], &h, init.out, 2, 0, 3000,
                                            &r), KEEL_OK);
    keel__wire_msg_clear(&r);
    for (int i = 0; i < R; i++) {
        memcpy(gw[i], g, sizeof gw[i]);
        memcpy(gb[i], g + 6, sizeof gb[i]);
    }
    sync_round(w, R, 0, gw, gb, eq, wv, bv);
    for (int e = 0; e < 9; e++) {
        float got = -(e < 6 ? wv[e] : bv[e - 6]);
        ck_assert_msg(memcmp(&got, &g[e], sizeof got) == 0,
                      "equal counts, element %d: %a, want %a", e,
                      (double)got, (double)g[e]);
    }
    /* unequal: replica i pushes g scaled by i + 1 and shifted */
    for (int i = 0; i < R; i++)
        for (int e = 0; e < 9; e++) {
            float v = g[e] * (float)(i + 1) + 0.25f * (float)i;
            if (e < 6)
                gw[i][e] = v;
            else
                gb[i][e - 6] = v;
        }
    sync_round(w, R, 1, gw, gb, uneq, wv, bv);
    for (int e = 0; e < 9; e++) {
        float before = -g[e];
        double d = 0;
        float want, got;
        for (int i = 0; i < R; i++)
            d += (double)uneq[i] *
                 (double)(e < 6 ? gw[i][e] : gb[i][e - 6]);
        want = (float)(d / 15.0);
        got = (e < 6 ? wv[e] : bv[e - 6]);
        ck_assert_msg(got == before - want, "unequal counts, element %d: "
                      "%a, want %a", e, (double)got,
                      (double)(before - want));
    }
    for (int i = 0; i < R; i++)
        keel__wire_client_free(w[i]);
    server_stop(&sv);
    wb_release(&init);
}
END_TEST

/* A push that names a variable twice (no micro-batch pieces declared):
 * both of its gradients count with the replica's weight, as every other
 * gradient - more gradients of one variable than there are replicas,
 * which the ps sums one gradient at a time. Worker 0 (weight 1) pushes
 * w = 1 and w = 2, worker 1 (weight 2) w = 4: (1 + 2 + 2 * 4) / 3. */
START_TEST(test_real_ps_weighted_mean_of_a_variable_pushed_twice)
{
    server sv;
    keel__wire_client *w[2];
    float zw[6] = { 0 }, zb[3] = { 0 }, a[6], b[6], c[6];
    float gb[3] = { 3, 3, 3 };
    wb init, p0, p0b, p1;
    keel__wire_out two[3];
    keel__wire_header h;
    keel__wire_msg r;
    uint64_t id0;
    for (int i = 0; i < 6; i++) {
        a[i] = 1;
        b[i] = 2;
        c[i] = 4;
    }
    wb_make(&init, zw, zb);
    wb_make(&p0, a, gb);
    wb_make(&p0b, b, NULL);
    wb_make(&p1, c, gb);
    two[0] = p0.out[0];
    two[1] = p0b.out[0];
    two[2] = p0.out[1];
    ck_assert_msg(sync_ps_start(&sv, 2, 2) == KEEL_OK, "%s",
                  keel_last_error());
    for (int i = 0; i < 2; i++)
        w[i] = worker_client(&sv, NULL, i);
    header_of(&h, KEEL_MSG_INIT);
    ck_assert_int_eq(keel__wire_client_call(w[0], &h, init.out, 2, 0, 3000,
                                            &r), KEEL_OK);
    keel__wire_msg_clear(&r);
    header_of(&h, KEEL_MSG_PUSH);
    h.examples = 1;
    ck_assert_int_eq(keel__wire_client_send(w[0], &h, two, 3, 0, 3000),
                     KEEL_OK);
    id0 = h.request_id;
    header_of(&h, KEEL_MSG_PUSH);
    h.flags = KEEL_WIRE_F_WANT_VALUES;
    h.examples = 2;
    ck_assert_int_eq(keel__wire_client_call(w[1], &h, p1.out, 2, 0, 3000,
                                            &r), KEEL_OK);
    ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
    ck_assert_int_eq(r.n, 2);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(r.tensors[0].t.data[i],
                           -(float)((1.0 + 2.0 + 2.0 * 4.0) / 3.0));
    for (int i = 0; i < 3; i++)
        ck_assert_float_eq(r.tensors[1].t.data[i], -3.0f);
    keel__wire_msg_clear(&r);
    ck_assert_int_eq(keel__wire_client_wait(w[0], id0, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
    keel__wire_msg_clear(&r);
    for (int i = 0; i < 2; i++)
        keel__wire_client_free(w[i]);
    server_stop(&sv);
    wb_release(&init);
    wb_release(&p0);
    wb_release(&p0b);
    wb_release(&p1);
}
END_TEST

/* Three replicas (workers 0..2, worker 0 the chief), two aggregated: one
 * backup. Each replica pushes its own mean gradient; the update must be
 * the mean of the two that were aggregated (not their sum, not a third of
 * it). Worked by hand with SGD at learning rate 1: replica means G1 = 3,
 * G2 = 6 (w), 1.5, 3 (b) -> means 4.5 and 2.25. */
START_TEST(test_real_ps_applies_the_mean_with_a_backup_worker)
{
    server sv;
    keel__wire_client *w[3];
    float wv[6] = { 10, 20, 30, 40, 50, 60 }, bv[3] = { 1, 2, 3 };
    float s1w[6] = { 3, 3, 3, 3, 3, 3 }, s2w[6] = { 6, 6, 6, 6, 6, 6 };
    float s1b[3] = { 1.5f, 1.5f, 1.5f }, s2b[3] = { 3, 3, 3 };
    wb init, p1, p2;
    keel__wire_header h;
    keel__wire_msg r;
    uint64_t id1;

    wb_make(&init, wv, bv);
    wb_make(&p1, s1w, s1b);
    wb_make(&p2, s2w, s2b);

    /* more to aggregate than replicas: refused, no server that waits
     * forever */
    ck_assert_int_eq(sync_ps_start(&sv, 4, 3), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(),
                                 "replicas_to_aggregate 4 is more than the "
                                 "3 replicas"));
    keel_vars_free(sv.vars);
    ck_assert_msg(sync_ps_start(&sv, 2, 3) == KEEL_OK, "%s",
                  keel_last_error());
    for (int i = 0; i < 3; i++)
        w[i] = worker_client(&sv, NULL, i);
    header_of(&h, KEEL_MSG_INIT);
    h.global_step = 7;
    ck_assert_int_eq(keel__wire_client_call(w[0], &h, init.out, 2, 0, 3000, &r),
                     KEEL_OK);
    keel__wire_msg_clear(&r);
    /* workers 1 and 2 make step 7; worker 0 (the chief) is the straggler.
     * Worker 1's push is held until worker 2's completes the step. */
    header_of(&h, KEEL_MSG_PUSH);
    h.local_step = 7;
    ck_assert_int_eq(keel__wire_client_send(w[1], &h, p1.out, 2, 0, 3000),
                     KEEL_OK);
    id1 = h.request_id;
    header_of(&h, KEEL_MSG_PUSH);
    h.flags = KEEL_WIRE_F_WANT_VALUES;
    h.local_step = 7;
    ck_assert_int_eq(keel__wire_client_call(w[2], &h, p2.out, 2, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
    ck_assert_int_eq(r.h.global_step, 8);
    ck_assert_int_eq(r.n, 2);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(r.tensors[0].t.data[i], wv[i] - 4.5f);
    for (int i = 0; i < 3; i++)
        ck_assert_float_eq(r.tensors[1].t.data[i], bv[i] - 2.25f);
    keel__wire_msg_clear(&r);
    {
        keel__wire_msg r1;
        ck_assert_int_eq(keel__wire_client_wait(w[1], id1, 0, 3000, &r1),
                         KEEL_OK);
        ck_assert_int_eq(r1.h.type, KEEL_MSG_PUSH_ACK);
        ck_assert_int_eq(r1.h.global_step, 8);
        keel__wire_msg_clear(&r1);
    }
    /* the straggler's gradient for step 7 is stale: dropped, nothing
     * applied */
    header_of(&h, KEEL_MSG_PUSH);
    h.flags = KEEL_WIRE_F_WANT_VALUES;
    h.local_step = 7;
    ck_assert_int_eq(keel__wire_client_call(w[0], &h, p2.out, 2, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.global_step, 8);
    for (int i = 0; i < 6; i++)
        ck_assert_float_eq(r.tensors[0].t.data[i], wv[i] - 4.5f);
    keel__wire_msg_clear(&r);
    header_of(&h, KEEL_MSG_STEP);
    ck_assert_int_eq(keel__wire_client_call(w[0], &h, NULL, 0, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_str_eq(r.text, "applied=2 dropped=1 ready=1 step=8");
    keel__wire_msg_clear(&r);
    for (int i = 0; i < 3; i++)
        keel__wire_client_free(w[i]);
    server_stop(&sv);
    wb_release(&init);
    wb_release(&p1);
    wb_release(&p2);
}
END_TEST

/* ---- a frozen reader over a Unix socket --------------------------------- */

/* Elements of the frozen-reader test's variable: 4 MiB, more than a Unix
 * socket's kernel buffers hold, so its reply stays queued in the ps. */
#define FROZEN_N ((int64_t)1 << 20)

/* A PUSH of FROZEN_N elements of value g as step's gradient from c, with
 * the values back; *id its request id. */
static keel_status
frozen_push(keel__wire_client *c, keel_tensor *g, float v, int64_t step,
            int wait, keel__wire_msg *r, uint64_t *id)
{
    keel__wire_header h;
    keel__wire_out o = { "big", g, NULL };
    keel_status st;
    for (size_t i = 0; i < g->count; i++)
        g->data[i] = v;
    header_of(&h, KEEL_MSG_PUSH);
    h.flags = KEEL_WIRE_F_WANT_VALUES;
    h.local_step = step;
    if (!wait) {
        st = keel__wire_client_send(c, &h, &o, 1, 0, 3000);
        if (id != NULL)
            *id = h.request_id;
        return st;
    }
    return keel__wire_client_call(c, &h, &o, 1, 0, 3000, r);
}

/* 1 when r is a PUSH_ACK of step whose values are all v. */
static int
frozen_ack_is(const keel__wire_msg *r, int64_t step, float v)
{
    if (r->h.type != KEEL_MSG_PUSH_ACK || r->h.global_step != step ||
        r->n != 1 || r->tensors[0].t.count != (size_t)FROZEN_N)
        return 0;
    for (int64_t i = 0; i < FROZEN_N; i++)
        if (r->tensors[0].t.data[i] != v)
            return 0;
    return 1;
}

/* The frozen replica (worker 2, a process of its own): reads the ps's
 * endpoint from listen, pushes step 7's gradient, is stopped by the test
 * before the step's reply comes, and once continued must read that step's values exactly
 * (not a later step's written over them while the reply was queued);
 * then its next push, of a step the others have passed, is dropped as
 * stale with the newest values. Exit status 0 when all of that holds. */
static int
frozen_child(int listen)
{
    char ep[KEEL_ADDR_MAX + 16];
    keel__wire_client *c;
    keel_tensor g;
    keel__wire_msg r;
    uint64_t id;
    ssize_t n = read(listen, ep, sizeof ep - 1);
    int ok;
    if (n <= 0)
        return 2;
    ep[n] = '\0';
    if (keel__wire_client_new(ep, NULL, KEEL_TASK_WORKER, 2, &c) != KEEL_OK ||
        keel_tensor_alloc(&g, 1, (int64_t[]){ FROZEN_N }) != KEEL_OK ||
        frozen_push(c, &g, 1.0f, 7, 0, NULL, &id) != KEEL_OK)
        return 3;
    if (keel__wire_client_wait(c, id, 0, 20000, &r) != KEEL_OK)
        return 5;
    ok = frozen_ack_is(&r, 8, 99.0f);   /* 100 - the mean of 1 and 1 */
    keel__wire_msg_clear(&r);
    if (!ok)
        return 6;
    /* the others made steps 8 and 9 meanwhile: 99 - 2 - 3 */
    if (frozen_push(c, &g, 5.0f, 8, 1, &r, NULL) != KEEL_OK)
        return 7;
    ok = frozen_ack_is(&r, 10, 94.0f);
    keel__wire_msg_clear(&r);
    keel_tensor_release(&g);
    keel__wire_client_free(c);
    return ok ? 0 : 8;
}

/* A sync ps over a Unix socket, three replicas, two aggregated (one a
 * backup): replica 2 pushes and is SIGSTOPped before its reply comes, so
 * the reply (larger than the socket's kernel buffers) stays queued with
 * its frames referencing the variable. The other two replicas must go on
 * making steps at once (the ps neither waits for the frozen reader nor
 * refuses them as busy), and the frozen one, continued, reads the values
 * of its own step and is then dropped as stale, as over tcp. */
START_TEST(test_ipc_frozen_reader_does_not_stall_the_step)
{
    char dir[4096], bind[4200], ep[KEEL_ADDR_MAX + 16];
    int to_child[2];
    keel__ps_config cfg = { .apply = sgd_apply, .sync = 1,
                            .replicas_to_aggregate = 2,
                            .total_replicas = 3 };
    keel__wire_client *w0, *w1;
    keel_tensor g, *t;
    keel_var *v;
    keel__wire_header h;
    keel__wire_out init = { "big", NULL, NULL };
    keel__wire_msg r;
    server sv;
    pid_t child;
    int64_t t0;

    /* the child first, while this process has no threads */
    ck_assert_int_eq(pipe(to_child), 0);
    child = fork();
    ck_assert_int_ge(child, 0);
    if (child == 0) {
        close(to_child[1]);
        _exit(frozen_child(to_child[0]));
    }
    close(to_child[0]);

    tu_mkdtemp(dir, sizeof dir);
    TU_SNPRINTF(bind, sizeof bind, "ipc://%s/ps0", dir);
    memset(&sv, 0, sizeof sv);
    ck_assert_int_eq(keel_vars_new(&sv.vars), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(sv.vars, "big", 1,
                                      (int64_t[]){ FROZEN_N },
                                      KEEL_VAR_TRAINABLE, &v), KEEL_OK);
    cfg.vars = sv.vars;
    cfg.bind = bind;
    ck_assert_msg(keel__ps_new(&cfg, &sv.ps) == KEEL_OK, "%s",
                  keel_last_error());
    atomic_store(&sv.stop, 0);
    ck_assert_int_eq(pthread_create(&sv.th, NULL, server_main, &sv), 0);
    TU_SNPRINTF(ep, sizeof ep, "%s", keel__ps_endpoint(sv.ps));
    ck_assert_int_eq(strncmp(ep, "ipc://", 6), 0);
    w0 = worker_client(&sv, NULL, 0);
    w1 = worker_client(&sv, NULL, 1);
    ck_assert_int_eq(keel_tensor_alloc(&g, 1, (int64_t[]){ FROZEN_N }),
                     KEEL_OK);
    for (int64_t i = 0; i < FROZEN_N; i++)
        g.data[i] = 100.0f;
    init.t = &g;
    header_of(&h, KEEL_MSG_INIT);
    h.global_step = 7;
    ck_assert_int_eq(keel__wire_client_call(w0, &h, &init, 1, 0, 3000, &r),
                     KEEL_OK);
    keel__wire_msg_clear(&r);

    /* step 7: replica 2 pushes and freezes; replica 1 completes the step,
     * which queues replica 2's reply */
    ck_assert_int_eq(write(to_child[1], ep, strlen(ep)),
                     (ssize_t)strlen(ep));
    t0 = tu_now_ms();
    for (;;) {          /* its push held: the step has 1 of 2 */
        int held;
        header_of(&h, KEEL_MSG_STEP);
        ck_assert_int_eq(keel__wire_client_call(w0, &h, NULL, 0, 0, 3000,
                                                &r), KEEL_OK);
        held = r.text != NULL && strstr(r.text, "have=1/2") != NULL;
        keel__wire_msg_clear(&r);
        if (held)
            break;
        ck_assert_msg(tu_now_ms() - t0 < 20000, "worker 2's push never "
                      "came");
        usleep(10000);
    }
    ck_assert_int_eq(kill(child, SIGSTOP), 0);
    ck_assert_int_eq(frozen_push(w1, &g, 1.0f, 7, 1, &r, NULL), KEEL_OK);
    ck_assert(frozen_ack_is(&r, 8, 99.0f));
    keel__wire_msg_clear(&r);
    t = keel_var_tensor(v);

    /* steps 8 and 9 of replicas 0 and 1 update the variable whose reply
     * is still queued: at once, with the right values */
    t0 = tu_now_ms();
    for (int64_t step = 8; step < 10; step++) {
        uint64_t id;
        float gv = (float)(step - 6);       /* 2, then 3 */
        float want = step == 8 ? 97.0f : 94.0f;
        ck_assert_int_eq(frozen_push(w0, &g, gv, step, 0, NULL, &id),
                         KEEL_OK);
        ck_assert_msg(frozen_push(w1, &g, gv, step, 1, &r, NULL) == KEEL_OK,
                      "step %lld: %s", (long long)step, keel_last_error());
        ck_assert_msg(frozen_ack_is(&r, step + 1, want),
                      "step %lld: reply type %d (%s)", (long long)step,
                      (int)r.h.type, r.text ? r.text : "");
        keel__wire_msg_clear(&r);
        ck_assert_int_eq(keel__wire_client_wait(w0, id, 0, 3000, &r),
                         KEEL_OK);
        ck_assert(frozen_ack_is(&r, step + 1, want));
        keel__wire_msg_clear(&r);
    }
    ck_assert_msg(tu_now_ms() - t0 < 4000, "two steps took %lld ms with "
                  "a frozen reader", (long long)(tu_now_ms() - t0));
    ck_assert_float_eq(t->data[0], 94.0f);

    /* continued: it reads step 7's values, then is dropped as stale */
    ck_assert_int_eq(kill(child, SIGCONT), 0);
    ck_assert_int_eq(tu_wait(child, 20000), 0);
    header_of(&h, KEEL_MSG_STEP);
    ck_assert_int_eq(keel__wire_client_call(w0, &h, NULL, 0, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_str_eq(r.text, "applied=6 dropped=1 ready=1 step=10");
    keel__wire_msg_clear(&r);
    keel__wire_client_free(w0);
    keel__wire_client_free(w1);
    keel_tensor_release(&g);
    close(to_child[1]);
    server_stop(&sv);
}
END_TEST

/* ---- GlobalStepWaiterHook on a cluster worker -------------------------- */

typedef struct waiter_run {
    keel_session *s;
    keel_status created, ran;
    float w_seen;                /* layer/w[0] as the worker's step saw it */
    int64_t step_seen;
    atomic_int done;
} waiter_run;

/* The worker's step: records what it computes on, pushes a share of 0.25
 * for every element. */
static keel_status
waiter_step(void *ctx, keel_step *st)
{
    waiter_run *wr = ctx;
    keel_vars *vs = keel_step_vars(st);
    keel_grads *g = keel_step_grads(st);
    wr->w_seen = keel_var_tensor(keel_vars_find(vs, "layer/w"))->data[0];
    wr->step_seen = keel_step_global_step(st);
    for (size_t k = 0; k < keel_vars_count(vs); k++) {
        keel_tensor *t = keel_grads_at(g, k);
        for (size_t i = 0; i < t->count; i++)
            t->data[i] = 0.5f;
    }
    return KEEL_OK;
}

static void *
waiter_main(void *arg)
{
    waiter_run *wr = arg;
    wr->ran = keel_session_run(wr->s, NULL);
    atomic_store(&wr->done, 1);
    return NULL;
}

/* Worker 1 of a 2-replica sync cluster (1 aggregated: a backup) waits in
 * GlobalStepWaiterHook for step 9 while worker 0 (the chief, a raw client
 * here) trains from step 5: it must see the ps's step move (its own copy
 * does not), then start at step 9 on that step's values, so its push is
 * aggregated, not dropped as stale. By hand, SGD rate 1, shares x 2/1:
 * the chief's 4 steps of share 1 take w from 10 to 2; the worker's share
 * 0.25 then takes it to 1.5. */
START_TEST(test_global_step_waiter_hook_sees_the_cluster_step)
{
    server sv;
    keel__wire_client *chief;
    keel_cluster_spec *spec;
    keel_cluster_config o;
    keel_cluster_backend *wk;
    keel_backend be;
    keel_vars *vs;
    keel_hook hook;
    keel_global_step_waiter_hook_config wc;
    keel_session_config sc;
    waiter_run wr;
    pthread_t th;
    int64_t deadline;
    float wv[6] = { 10, 10, 10, 10, 10, 10 }, bv[3] = { 1, 1, 1 };
    float two[6] = { 2, 2, 2, 2, 2, 2 };    /* each push's mean gradient */
    wb init, push;
    keel__wire_header h;
    keel__wire_msg r;

    /* the ps: 2 replicas, 1 aggregated */
    ck_assert_int_eq(sync_ps_start(&sv, 1, 2), KEEL_OK);
    wb_make(&init, wv, bv);
    wb_make(&push, two, two);
    chief = worker_client(&sv, NULL, 0);
    header_of(&h, KEEL_MSG_INIT);
    h.global_step = 5;
    ck_assert_int_eq(keel__wire_client_call(chief, &h, init.out, 2, 0, 3000, &r),
                     KEEL_OK);
    keel__wire_msg_clear(&r);

    /* worker 1: the real backend and a MonitoredSession with the hook */
    spec = tu_spec_from_lists(keel__ps_endpoint(sv.ps) + strlen("tcp://"),
                              "127.0.0.1:1,127.0.0.1:2", NULL,
                              KEEL_TASK_WORKER, 1);
    keel_cluster_spec_set_replicas(spec, 1, 2);
    ck_assert_msg(keel_cluster_spec_validate(spec) == KEEL_OK, "%s",
                  keel_last_error());
    keel_cluster_config_init(&o);
    o.token = NULL;
    o.dead_after_ms = 10000;
    o.heartbeat_ms = 200;
    o.step_timeout_secs = 10;
    o.ready_retry_ms = 20;
    o.max_wait_secs = 10;
    vs = wb_vars();
    ck_assert_msg(keel_cluster_backend_new(spec, vs, &o, &wk) == KEEL_OK,
                  "%s", keel_last_error());
    keel_cluster_backend_session_backend(wk, &be);
    keel_global_step_waiter_hook_config_init(&wc);
    wc.wait_until_step = 9;
    wc.poll_ms = 20;
    ck_assert_int_eq(keel_global_step_waiter_hook_new(&wc, &hook), KEEL_OK);
    memset(&wr, 0, sizeof wr);
    keel_session_config_init(&sc);
    sc.manager.vars = vs;
    sc.step = waiter_step;
    sc.step_ctx = &wr;
    sc.manager.backend = &be;
    sc.hooks = &hook;
    sc.n_hooks = 1;
    sc.is_chief = 0;
    sc.max_wait_secs = 10;
    sc.stop_grace_period_secs = 5;
    wr.created = keel_session_new(&sc, &wr.s);
    ck_assert_msg(wr.created == KEEL_OK, "%s", keel_last_error());
    ck_assert_int_eq(keel_session_global_step(wr.s), 5);
    ck_assert_int_eq(pthread_create(&th, NULL, waiter_main, &wr), 0);

    /* the chief trains steps 5..7 alone (1 aggregated) */
    for (int64_t step = 5; step < 8; step++) {
        header_of(&h, KEEL_MSG_PUSH);
        h.local_step = step;
        ck_assert_int_eq(keel__wire_client_call(chief, &h, push.out, 2, 0, 3000,
                                                &r), KEEL_OK);
        ck_assert_int_eq(r.h.global_step, step + 1);
        keel__wire_msg_clear(&r);
    }
    /* at step 8 < 9 the worker still waits (polling every 20 ms) */
    deadline = tu_now_ms() + 300;
    while (tu_now_ms() < deadline && !atomic_load(&wr.done))
        usleep(10000);
    ck_assert_msg(!atomic_load(&wr.done), "the waiter did not wait: %s",
                  keel_last_error());
    header_of(&h, KEEL_MSG_PUSH);
    h.local_step = 8;
    ck_assert_int_eq(keel__wire_client_call(chief, &h, push.out, 2, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.global_step, 9);
    keel__wire_msg_clear(&r);
    /* step 9 reached: the worker starts there, on step 9's values */
    deadline = tu_now_ms() + 10000;
    while (tu_now_ms() < deadline && !atomic_load(&wr.done))
        usleep(5000);
    ck_assert_msg(atomic_load(&wr.done), "the waiter never saw step 9");
    pthread_join(th, NULL);
    ck_assert_msg(wr.ran == KEEL_OK, "%s", keel_last_error());
    ck_assert_int_eq(wr.step_seen, 9);
    ck_assert_float_eq(wr.w_seen, 2.0f);
    ck_assert_int_eq(keel_session_global_step(wr.s), 10);
    ck_assert_float_eq(keel_var_tensor(keel_vars_find(vs, "layer/w"))->data[5],
                       1.5f);
    header_of(&h, KEEL_MSG_STEP);
    ck_assert_int_eq(keel__wire_client_call(chief, &h, NULL, 0, 0, 3000, &r),
                     KEEL_OK);
    ck_assert_str_eq(r.text, "applied=5 dropped=0 ready=1 step=10");
    keel__wire_msg_clear(&r);

    ck_assert_int_eq(keel_session_close(wr.s), KEEL_OK);
    keel_session_free(wr.s);
    keel_hook_release(&hook);
    keel_cluster_backend_free(wk);
    keel_vars_free(vs);
    keel_cluster_spec_free(spec);
    keel__wire_client_free(chief);
    server_stop(&sv);
    wb_release(&init);
    wb_release(&push);
}
END_TEST

/* The heartbeat thread sees a ps's incarnation, what its sync step lacks
 * (naming the silent replica), and a new incarnation after a restart on
 * the same address. */
/* A new, empty ps (one variable, layer/w) at the address a stopped one
 * served: what a restarted ps task is. sync: 2 replicas aggregated. */
static void
start_new_ps_at(server *sv, const char *ep, int sync)
{
    keel__ps_config cfg = { .bind = ep };
    int64_t ws2[2] = { 2, 3 };
    memset(sv, 0, sizeof *sv);
    ck_assert_int_eq(keel_vars_new(&sv->vars), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(sv->vars, "layer/w", 2, ws2,
                                      KEEL_VAR_TRAINABLE, NULL), KEEL_OK);
    cfg.vars = sv->vars;
    cfg.apply = sgd_apply;
    if (sync) {
        cfg.sync = 1;
        cfg.replicas_to_aggregate = 2;
        cfg.total_replicas = 2;
    }
    ck_assert_msg(keel__ps_new(&cfg, &sv->ps) == KEEL_OK, "%s",
                  keel_last_error());
    atomic_store(&sv->stop, 0);
    ck_assert_int_eq(pthread_create(&sv->th, NULL, server_main, sv), 0);
}

/* Heartbeats of worker `index` (generation gen) to the one ps of sv,
 * every interval_ms; ep and eps (one slot) are the caller's and must
 * outlive *hb. */
static void
hb_start_one(const server *sv, char *ep, size_t ep_size, const char **eps,
             int interval_ms, int index, uint64_t gen, keel__hb **hb)
{
    keel__hb_config hc;
    snprintf(ep, ep_size, "%s", keel__ps_endpoint(sv->ps));
    eps[0] = ep;
    memset(&hc, 0, sizeof hc);
    hc.endpoints = eps;
    hc.n = 1;
    hc.interval_ms = interval_ms;
    hc.type = KEEL_TASK_WORKER;
    hc.index = index;
    hc.generation = gen;
    ck_assert_int_eq(keel__hb_start(&hc, hb), KEEL_OK);
}

START_TEST(test_heartbeats_see_the_step_state_and_a_restarted_ps)
{
    server sv;
    keel__wire_client *w0;
    keel__hb *hb;
    keel__hb_peer peer;
    char ep[KEEL_ADDR_MAX + 16];
    const char *eps[1];
    float wv[6] = { 0 }, bv[3] = { 0 }, g[6] = { 1, 1, 1, 1, 1, 1 };
    wb init, push;
    keel__wire_header h;
    keel__wire_msg r;
    uint64_t gen1;
    long beats;

    real_start(&sv);
    hb_start_one(&sv, ep, sizeof ep, eps, 20, 1, 77, &hb);
    ck_assert(keel__hb_wait(hb, 0, 0, 5000));
    keel__hb_peer_get(hb, 0, &peer);
    ck_assert_uint_ne(peer.generation, 0);
    gen1 = peer.generation;
    ck_assert_msg(strncmp(peer.status, "applied=0 dropped=0 ready=0 step=0",
                          34) == 0, "%s", peer.status);
    ck_assert_ptr_null(strstr(peer.status, "missing="));

    /* worker 0 initializes (no chief) and pushes for step 0: the step now
     * waits for worker 1, which heartbeats but has not pushed */
    ck_assert_int_eq(keel__wire_client_new(ep, NULL, KEEL_TASK_WORKER, 0,
                                           &w0), KEEL_OK);
    wb_make(&init, wv, bv);
    wb_make(&push, g, NULL);
    header_of(&h, KEEL_MSG_INIT);
    ck_assert_int_eq(keel__wire_client_call(w0, &h, init.out, 2, 0, 3000, &r),
                     KEEL_OK);
    keel__wire_msg_clear(&r);
    header_of(&h, KEEL_MSG_PUSH);
    ck_assert_int_eq(keel__wire_client_send(w0, &h, push.out, 1, 0, 3000),
                     KEEL_OK);
    for (int i = 0; i < 100; i++) {       /* each wait is one new answer */
        keel__hb_peer_get(hb, 0, &peer);
        if (strstr(peer.status, "missing=") != NULL)
            break;
        ck_assert(keel__hb_wait(hb, 0, peer.beats, 5000));
    }
    ck_assert_msg(strstr(peer.status, "ready=1") != NULL, "%s", peer.status);
    ck_assert_msg(strstr(peer.status, "have=1/2 missing=worker 1 (silent ")
                  != NULL, "%s", peer.status);
    ck_assert_ptr_null(strstr(peer.status, "worker 0 (silent"));

    /* the ps dies and a new one serves the same address */
    keel__wire_client_free(w0);
    server_stop(&sv);
    start_new_ps_at(&sv, ep, 1);
    keel__hb_peer_get(hb, 0, &peer);
    beats = peer.beats;
    for (int i = 0; i < 200 && peer.generation == gen1; i++) {
        ck_assert(keel__hb_wait(hb, 0, beats, 5000));
        keel__hb_peer_get(hb, 0, &peer);
        beats = peer.beats;
    }
    ck_assert_uint_ne(peer.generation, gen1);
    ck_assert_msg(strstr(peer.status, "ready=0") != NULL, "%s", peer.status);
    keel__hb_stop(hb);
    server_stop(&sv);
    wb_release(&init);
    wb_release(&push);
}
END_TEST

/* A restarted ps is heard (its new incarnation) as soon as the heartbeat
 * socket reconnects to it, not at the next beat: here the interval is a
 * minute, so only the beat sent on reconnection can bring the news within
 * the 10 s deadline. */
START_TEST(test_heartbeat_on_reconnect_hears_a_restarted_ps)
{
    server sv;
    keel__hb *hb;
    keel__hb_peer peer;
    char ep[KEEL_ADDR_MAX + 16];
    const char *eps[1];
    uint64_t gen1;
    int64_t deadline;

    real_start(&sv);
    hb_start_one(&sv, ep, sizeof ep, eps, 60000, 0, 5, &hb);
    ck_assert(keel__hb_wait(hb, 0, 0, 10000));
    keel__hb_peer_get(hb, 0, &peer);
    gen1 = peer.generation;
    ck_assert_uint_ne(gen1, 0);
    server_stop(&sv);
    start_new_ps_at(&sv, ep, 0);
    deadline = tu_now_ms() + 10000;
    keel__hb_peer_get(hb, 0, &peer);
    while (peer.generation == gen1 && tu_now_ms() < deadline) {
        (void)keel__hb_wait(hb, 0, peer.beats, 500);
        keel__hb_peer_get(hb, 0, &peer);
    }
    ck_assert_msg(peer.generation != gen1, "the restarted ps was not heard "
                  "within 10 s (beats %ld)", peer.beats);
    keel__hb_stop(hb);
    server_stop(&sv);
}
END_TEST

/* A ps whose serving thread is busy: every PULL first takes BUSY_MS. */
#define BUSY_MS 1500
static keel_status
busy_serve(void *ctx, keel__ps *ps, keel__wire_msg *req)
{
    if (req->h.type == KEEL_MSG_PULL)
        usleep(BUSY_MS * 1000);
    return ps_skel_serve(ctx, ps, req);
}

/* A ps that is alive but busy for longer than dead_after_ms is not silent:
 * its connection answers the heartbeat socket's ZMTP pings (libzmq's I/O
 * thread) while its serving thread works, also when the busy spell lasts
 * far more beats (150 here) than the ps queues per connection (a
 * connection that reached that limit would stop being read, its pings
 * unanswered, and libzmq 4.3.4 aborts the ps when it drops then). Once it
 * is gone, its connection drops and the silence counts from its last
 * traffic at once. */
START_TEST(test_heartbeat_sees_a_busy_ps_alive_and_a_gone_one_silent)
{
    server sv;
    keel__hb *hb;
    keel__hb_config hc;
    keel__hb_peer peer;
    keel__wire_client *c;
    keel__wire_header h;
    keel__wire_msg r;
    char ep[KEEL_ADDR_MAX + 16];
    const char *eps[1];
    int64_t t0, deadline, worst = 0, quiet = 0;
    const int dead_ms = 600;
    int64_t ws[2] = { 2, 3 };
    keel__ps_config cfg = { .bind = "tcp://127.0.0.1:*",
                            .serve = busy_serve };

    memset(&sv, 0, sizeof sv);
    ck_assert_int_eq(keel_vars_new(&sv.vars), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(sv.vars, "layer/w", 2, ws,
                                      KEEL_VAR_TRAINABLE, NULL), KEEL_OK);
    cfg.vars = sv.vars;
    ck_assert_msg(keel__ps_new(&cfg, &sv.ps) == KEEL_OK, "%s",
                  keel_last_error());
    atomic_store(&sv.stop, 0);
    ck_assert_int_eq(pthread_create(&sv.th, NULL, server_main, &sv), 0);

    snprintf(ep, sizeof ep, "%s", keel__ps_endpoint(sv.ps));
    eps[0] = ep;
    memset(&hc, 0, sizeof hc);
    hc.endpoints = eps;
    hc.n = 1;
    hc.interval_ms = 10;
    hc.type = KEEL_TASK_WORKER;
    hc.generation = 9;
    hc.dead_after_ms = dead_ms;
    ck_assert_int_eq(keel__hb_start(&hc, &hb), KEEL_OK);
    ck_assert(keel__hb_wait(hb, 0, 0, 5000));

    /* the serving thread sleeps in a PULL for 1.5 s: never silent */
    ck_assert_int_eq(keel__wire_client_new(ep, NULL, KEEL_TASK_WORKER, 0, &c),
                     KEEL_OK);
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_PULL;
    h.flags = KEEL_WIRE_F_NAMES_ONLY;
    ck_assert_int_eq(keel__wire_client_send(c, &h, NULL, 0, 0, 3000),
                     KEEL_OK);
    t0 = tu_now_ms();
    while (tu_now_ms() - t0 < BUSY_MS - 200) {
        keel__hb_peer_get(hb, 0, &peer);
        quiet = (keel__now_mono_ns() - peer.since_ns) / 1000000;
        if (quiet > worst)
            worst = quiet;
        usleep(20000);
    }
    ck_assert_msg(worst < dead_ms, "a busy ps looked silent for %lld ms "
                  "(dead after %d ms)", (long long)worst, dead_ms);
    ck_assert_int_eq(keel__wire_client_wait(c, h.request_id, 1, 5000, &r),
                     KEEL_OK);
    keel__wire_msg_clear(&r);
    keel__wire_client_free(c);

    /* the ps goes away: its silence passes dead_after_ms within a second */
    server_stop(&sv);
    deadline = tu_now_ms() + 3000;
    do {
        usleep(20000);
        keel__hb_peer_get(hb, 0, &peer);
        quiet = (keel__now_mono_ns() - peer.since_ns) / 1000000;
    } while (quiet <= dead_ms && tu_now_ms() < deadline);
    ck_assert_msg(quiet > dead_ms, "a stopped ps still looked alive after "
                  "3 s (quiet %lld ms)", (long long)quiet);
    ck_assert_int_eq(peer.link_up, 0);
    keel__hb_stop(hb);
}
END_TEST

/* ---- the public seam (keel/distributed.h) -------------------------------- */

static keel_vars *
seam_vars(void)
{
    keel_vars *vs;
    int64_t two[1] = { 2 };
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "w", 1, two, KEEL_VAR_TRAINABLE,
                                      NULL), KEEL_OK);
    return vs;
}

/* The gradient of w is (1, -2) every step. */
static keel_status
seam_step(void *ctx, keel_step *st)
{
    float *g = keel_grads_find(keel_step_grads(st), "w")->data;
    (void)ctx;
    g[0] = 1.0f;
    g[1] = -2.0f;
    return KEEL_OK;
}

/* A training session over vs with seam_step, stopped by stop, the
 * optimizer opt. */
static void
seam_config(keel_training_config *cfg, keel_vars *vs, keel_hook *stop,
            const keel_optimizer_config *opt)
{
    keel_training_config_init(cfg);
    cfg->session.manager.vars = vs;
    cfg->session.step = seam_step;
    cfg->session.hooks = stop;
    cfg->session.n_hooks = 1;
    cfg->optimizer = opt;
}

/* keel_ps_run in a thread, a MonitoredTrainingSession with cfg.cluster as
 * the chief: momentum (lr 0.5, m 0.9) is applied on the ps; the chief's
 * final checkpoint holds the ps's values and slots (pulled before the
 * save); the chief's clean end stops the ps, whose keel_ps_run returns
 * KEEL_OK. By hand, per element with gradient g: a1 = g, a2 = 1.9 g,
 * a3 = 2.71 g; w3 = -0.5 (1 + 1.9 + 2.71) g = -2.805 g. */
START_TEST(test_seam_ps_run_and_training_session_on_a_cluster)
{
    tu_cluster cl;
    keel_vars *ps_vs = seam_vars(), *vs = seam_vars();
    keel_optimizer_config mom;
    keel_cluster_config co;
    keel_training_config cfg;
    keel_session *s = NULL;
    keel_hook stop;
    keel_stop_at_step_hook_config stop_cfg;
    tu_ps p;
    const keel_tensor *w, *acc;
    char dir[256];
    struct stat sb;

    tu_cluster_new(&cl, 0);
    keel_optimizer_config_init(&mom, KEEL_OPT_MOMENTUM);
    mom.schedule.learning_rate = 0.5;
    mom.momentum = 0.9;
    keel_cluster_config_init(&co);
    co.optimizer = &mom;
    co.orphan_secs = 30;                /* the test's own deadline */
    tu_ps_start(&p, cl.ps, ps_vs, &co);

    tu_mkdtemp(dir, sizeof dir);
    keel_stop_at_step_hook_config_init(&stop_cfg);
    stop_cfg.last_step = 3;
    ck_assert_int_eq(keel_stop_at_step_hook_new(&stop_cfg, &stop), KEEL_OK);
    seam_config(&cfg, vs, &stop, &mom);
    cfg.cluster = cl.chief;
    cfg.cluster_config = &co;
    cfg.session.manager.checkpoint_dir = dir;
    cfg.save_checkpoint_steps = 100;
    cfg.log_step_count_steps = 0;
    cfg.save_summaries_steps = 0;
    ck_assert_int_eq(keel_training_session_new(&cfg, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    ck_assert_int_eq(keel_session_close(s), KEEL_OK);
    ck_assert_int_eq(keel_session_global_step(s), 3);
    keel_session_free(s);
    ck_assert_int_eq(tu_ps_join(&p), KEEL_OK);  /* stopped by the chief */

    w = keel_var_tensor(keel_vars_find(vs, "w"));
    acc = keel_var_slot(keel_vars_find(vs, "w"), "momentum");
    ck_assert_ptr_nonnull(acc);
    ck_assert_float_eq_tol(w->data[0], -2.805f, 1e-5f);
    ck_assert_float_eq_tol(w->data[1], 5.61f, 1e-5f);
    ck_assert_float_eq_tol(acc->data[0], 2.71f, 1e-5f);
    ck_assert_float_eq_tol(acc->data[1], -5.42f, 1e-5f);
    {
        char path[512];
        snprintf(path, sizeof path, "%s/model.ckpt-3.h5", dir);
        ck_assert_int_eq(stat(path, &sb), 0);
    }
    keel_hook_release(&stop);
    keel_vars_free(vs);
    keel_vars_free(ps_vs);
    tu_cluster_free(&cl);
    tu_rmrf(dir);
}
END_TEST

/* A real async ps on its own thread, serving ps_vs with SGD at 0.5 and no
 * authentication, and a chief's client to it: sgd_ps_start fills s (the
 * options it borrows live there until tu_ps_join(&s->p)). */
typedef struct sgd_ps {
    tu_cluster cl;
    keel_optimizer_config sgd;
    keel_cluster_config co;
    tu_ps p;
    char ep[64];
} sgd_ps;

static keel__wire_client *
sgd_ps_start(sgd_ps *s, keel_vars *ps_vs)
{
    keel__wire_client *c;
    keel_optimizer_config_init(&s->sgd, KEEL_OPT_SGD);
    s->sgd.schedule.learning_rate = 0.5;
    keel_cluster_config_init(&s->co);
    s->co.optimizer = &s->sgd;
    s->co.orphan_secs = 30;
    s->co.token = NULL;
    tu_cluster_new(&s->cl, 0);
    tu_ps_start(&s->p, s->cl.ps, ps_vs, &s->co);
    snprintf(s->ep, sizeof s->ep, "tcp://%s",
             keel_cluster_spec_address(s->cl.ps, KEEL_TASK_PS, 0));
    ck_assert_int_eq(keel__wire_client_new(s->ep, NULL, KEEL_TASK_CHIEF, 0,
                                           &c), KEEL_OK);
    return c;
}

/* A real ps (SGD, lr 0.5) initialized to w = (1, 2): a push computed from
 * another generation's values is answered KEEL_EABORTED and not applied;
 * one naming the ps's generation, or none (0), is. After the two applied
 * pushes of g = (1, 1): w = (1, 2) - 2 x 0.5 x (1, 1) = (0, 1), step 2. */
START_TEST(test_ps_refuses_updates_from_an_earlier_generation)
{
    sgd_ps s;
    keel_vars *ps_vs = seam_vars(), *vs = seam_vars();
    keel__wire_client *c = sgd_ps_start(&s, ps_vs);
    keel__wire_header h;
    keel__wire_msg r;
    keel__wire_out o;
    keel_tensor g;
    int64_t two[1] = { 2 };
    uint64_t gen;
    float *w = keel_var_tensor(keel_vars_find(vs, "w"))->data;

    w[0] = 1.0f;
    w[1] = 2.0f;
    o = (keel__wire_out){ "w", keel_var_tensor(keel_vars_find(vs, "w")),
                          NULL };
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_INIT;
    ck_assert_msg(keel__wire_client_call(c, &h, &o, 1, 1, 5000, &r) ==
                  KEEL_OK, "%s", keel_last_error());
    gen = r.h.generation;
    ck_assert(gen != 0);
    keel__wire_msg_clear(&r);

    ck_assert_int_eq(keel_tensor_alloc(&g, 1, two), KEEL_OK);
    g.data[0] = g.data[1] = 1.0f;
    o = (keel__wire_out){ "w", &g, NULL };
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_PUSH;
    h.peer_generation = gen ^ 1;
    ck_assert_int_eq(keel__wire_client_call(c, &h, &o, 1, 1, 5000, &r),
                     KEEL_EPEER);
    ck_assert_int_eq(r.h.type, KEEL_MSG_ERROR);
    ck_assert_int_eq(r.h.arg, KEEL_EABORTED);
    ck_assert_ptr_nonnull(strstr(r.text, "ps 0 restarted"));
    keel__wire_msg_clear(&r);
    for (int i = 0; i < 2; i++) {
        memset(&h, 0, sizeof h);
        h.type = KEEL_MSG_PUSH;
        h.local_step = i;               /* the step it was computed at */
        h.peer_generation = i == 0 ? gen : 0;
        ck_assert_msg(keel__wire_client_call(c, &h, &o, 1, 1, 5000, &r) ==
                      KEEL_OK, "%s", keel_last_error());
        ck_assert_int_eq(r.h.type, KEEL_MSG_PUSH_ACK);
        ck_assert_int_eq(r.h.global_step, i + 1);
        keel__wire_msg_clear(&r);
    }
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_PULL;
    h.flags = KEEL_WIRE_F_NAMES_ONLY;
    ck_assert_int_eq(keel__wire_client_call(c, &h, &o, 1, 0, 5000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.n, 1);
    ck_assert_float_eq(r.tensors[0].t.data[0], 0.0f);
    ck_assert_float_eq(r.tensors[0].t.data[1], 1.0f);
    keel__wire_msg_clear(&r);
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_SHUTDOWN;
    ck_assert_int_eq(keel__wire_client_call(c, &h, NULL, 0, 0, 5000, &r),
                     KEEL_OK);
    keel__wire_msg_clear(&r);
    ck_assert_int_eq(tu_ps_join(&s.p), KEEL_OK);
    keel__wire_client_free(c);
    keel_tensor_release(&g);
    keel_vars_free(vs);
    keel_vars_free(ps_vs);
    tu_cluster_free(&s.cl);
}
END_TEST

/* A PULL of w through c: w = (w0, w1) at global step step. */
static void
check_w(keel__wire_client *c, float w0, float w1, int64_t step)
{
    keel__wire_header h = { .type = KEEL_MSG_PULL,
                            .flags = KEEL_WIRE_F_NAMES_ONLY };
    keel__wire_out name = { "w", NULL, NULL };
    keel__wire_msg r;
    ck_assert_int_eq(keel__wire_client_call(c, &h, &name, 1, 0, 5000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.global_step, step);
    ck_assert_int_eq(r.n, 1);
    ck_assert_float_eq(r.tensors[0].t.data[0], w0);
    ck_assert_float_eq(r.tensors[0].t.data[1], w1);
    keel__wire_msg_clear(&r);
}

/* PUSH with WANT_VALUES on a real async ps (SGD, lr 0.5; w = (1, 2),
 * b = (3, 4, 5)): the ack carries the new values of the pushed variables
 * only, bit for bit what a PULL right after returns, at the same global
 * step. A push from another generation, one whose data frame disagrees
 * with its shape and one with fewer frames than its count are refused
 * with no values and change nothing. By hand: g = (1, 1) -> w = (0.5,
 * 1.5), step 1; then g = (2, -2) -> w = (-0.5, 2.5), step 2. */
START_TEST(test_async_push_with_values_equals_a_pull)
{
    sgd_ps s;
    keel_vars *ps_vs, *vs;
    keel__wire_client *c;
    keel__wire_header h;
    keel__wire_msg ack, r;
    keel__wire_out o[2];
    keel_tensor g;
    int64_t two[1] = { 2 }, three[1] = { 3 };
    float bv[3] = { 3, 4, 5 };
    uint64_t gen;
    void *zctx = zmq_ctx_new(), *bad = zmq_socket(zctx, ZMQ_DEALER);
    int zero = 0;
    raw rw;

    ck_assert_int_eq(keel_vars_new(&ps_vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    for (int k = 0; k < 2; k++) {
        keel_vars *x = k ? vs : ps_vs;
        ck_assert_int_eq(keel_vars_create(x, "w", 1, two, KEEL_VAR_TRAINABLE,
                                          NULL), KEEL_OK);
        ck_assert_int_eq(keel_vars_create(x, "b", 1, three,
                                          KEEL_VAR_TRAINABLE, NULL), KEEL_OK);
    }
    c = sgd_ps_start(&s, ps_vs);
    zmq_setsockopt(bad, ZMQ_LINGER, &zero, sizeof zero);
    ck_assert_int_eq(zmq_connect(bad, s.ep), 0);
    keel_var_tensor(keel_vars_find(vs, "w"))->data[0] = 1.0f;
    keel_var_tensor(keel_vars_find(vs, "w"))->data[1] = 2.0f;
    memcpy(keel_var_tensor(keel_vars_find(vs, "b"))->data, bv, sizeof bv);
    o[0] = (keel__wire_out){ "w", keel_var_tensor(keel_vars_find(vs, "w")),
                             NULL };
    o[1] = (keel__wire_out){ "b", keel_var_tensor(keel_vars_find(vs, "b")),
                             NULL };
    header_of(&h, KEEL_MSG_INIT);
    ck_assert_msg(keel__wire_client_call(c, &h, o, 2, 1, 5000, &r) ==
                  KEEL_OK, "%s", keel_last_error());
    gen = r.h.generation;
    keel__wire_msg_clear(&r);

    /* the ack: w's new values (b was not pushed), step 1 */
    ck_assert_int_eq(keel_tensor_alloc(&g, 1, two), KEEL_OK);
    g.data[0] = g.data[1] = 1.0f;
    o[0] = (keel__wire_out){ "w", &g, NULL };
    header_of(&h, KEEL_MSG_PUSH);
    h.flags = KEEL_WIRE_F_WANT_VALUES;
    h.peer_generation = gen;
    ck_assert_msg(keel__wire_client_call(c, &h, o, 1, 1, 5000, &ack) ==
                  KEEL_OK, "%s", keel_last_error());
    ck_assert_int_eq(ack.h.type, KEEL_MSG_PUSH_ACK);
    ck_assert_int_eq(ack.h.global_step, 1);
    ck_assert_int_eq(ack.n, 1);
    ck_assert_str_eq(ack.tensors[0].name, "w");
    ck_assert_int_eq(ack.tensors[0].t.count, 2);
    ck_assert_float_eq(ack.tensors[0].t.data[0], 0.5f);
    ck_assert_float_eq(ack.tensors[0].t.data[1], 1.5f);
    /* a PULL of everything right after: the same bits, the same step */
    header_of(&h, KEEL_MSG_PULL);
    h.flags = KEEL_WIRE_F_NAMES_ONLY;
    ck_assert_int_eq(keel__wire_client_call(c, &h, NULL, 0, 0, 5000, &r),
                     KEEL_OK);
    ck_assert_int_eq(r.h.global_step, ack.h.global_step);
    ck_assert_int_eq(r.n, 2);
    for (size_t i = 0; i < r.n; i++) {
        const keel__wire_tensor *t = &r.tensors[i];
        if (strcmp(t->name, "w") == 0)
            ck_assert_int_eq(memcmp(t->t.data, ack.tensors[0].t.data,
                                    2 * sizeof(float)), 0);
        else
            ck_assert_int_eq(memcmp(t->t.data, bv, sizeof bv), 0);
    }
    keel__wire_msg_clear(&r);
    keel__wire_msg_clear(&ack);

    /* another generation's push: refused, no values */
    header_of(&h, KEEL_MSG_PUSH);
    h.flags = KEEL_WIRE_F_WANT_VALUES;
    h.peer_generation = gen ^ 1;
    ck_assert_int_eq(keel__wire_client_call(c, &h, o, 1, 1, 5000, &r),
                     KEEL_EPEER);
    ck_assert_int_eq(r.h.type, KEEL_MSG_ERROR);
    ck_assert_int_eq(r.h.arg, KEEL_EABORTED);
    ck_assert_int_eq(r.n, 0);
    keel__wire_msg_clear(&r);
    /* lengths are checked before anything is applied or answered */
    raw_init(&rw);
    rw.hdr[7] = KEEL_WIRE_F_WANT_VALUES;
    rw.desc_len = keel__wire_desc_encode("w", 1, two, rw.desc,
                                         sizeof rw.desc);
    rw.data_len = 4;
    expect_error_reply(bad, &rw, KEEL_ECORRUPT, "data frame is 4 bytes, "
                       "shape needs 2 x 4");
    raw_init(&rw);
    rw.hdr[7] = KEEL_WIRE_F_WANT_VALUES;
    rw.hdr[48] = 2;                         /* count 2, frames for one */
    rw.desc_len = keel__wire_desc_encode("w", 1, two, rw.desc,
                                         sizeof rw.desc);
    rw.data_len = 8;
    expect_error_reply(bad, &rw, KEEL_ECORRUPT, "3 frames for 2 tensors");
    check_w(c, 0.5f, 1.5f, 1);

    /* the next push (no generation named: 0) applies to those values */
    g.data[0] = 2.0f;
    g.data[1] = -2.0f;
    header_of(&h, KEEL_MSG_PUSH);
    h.flags = KEEL_WIRE_F_WANT_VALUES;
    h.local_step = 1;
    ck_assert_msg(keel__wire_client_call(c, &h, o, 1, 1, 5000, &ack) ==
                  KEEL_OK, "%s", keel_last_error());
    ck_assert_int_eq(ack.h.global_step, 2);
    ck_assert_int_eq(ack.n, 1);
    ck_assert_float_eq(ack.tensors[0].t.data[0], -0.5f);
    ck_assert_float_eq(ack.tensors[0].t.data[1], 2.5f);
    keel__wire_msg_clear(&ack);
    check_w(c, -0.5f, 2.5f, 2);

    header_of(&h, KEEL_MSG_SHUTDOWN);
    ck_assert_int_eq(keel__wire_client_call(c, &h, NULL, 0, 0, 5000, &r),
                     KEEL_OK);
    keel__wire_msg_clear(&r);
    ck_assert_int_eq(tu_ps_join(&s.p), KEEL_OK);
    zmq_close(bad);
    zmq_ctx_term(zctx);
    keel__wire_client_free(c);
    keel_tensor_release(&g);
    keel_vars_free(vs);
    keel_vars_free(ps_vs);
    tu_cluster_free(&s.cl);
}
END_TEST

/* Alone, keel_training_config.optimizer is the update rule: momentum
 * applied in the process with its slot in vars; giving an updater too is
 * an error. */
START_TEST(test_seam_training_optimizer_alone)
{
    keel_vars *vs = seam_vars();
    keel_optimizer_config mom;
    keel_training_config cfg;
    keel_session *s = NULL;
    keel_hook stop;
    keel_stop_at_step_hook_config stop_cfg;
    const keel_tensor *w;
    keel_optimizer_config_init(&mom, KEEL_OPT_MOMENTUM);
    mom.schedule.learning_rate = 0.5;
    mom.momentum = 0.9;
    keel_stop_at_step_hook_config_init(&stop_cfg);
    stop_cfg.last_step = 3;
    ck_assert_int_eq(keel_stop_at_step_hook_new(&stop_cfg, &stop), KEEL_OK);
    seam_config(&cfg, vs, &stop, &mom);
    cfg.log_step_count_steps = 0;
    ck_assert_int_eq(keel_training_session_new(&cfg, &s), KEEL_OK);
    ck_assert_int_eq(keel_session_train(s), KEEL_OK);
    keel_session_free(s);
    w = keel_var_tensor(keel_vars_find(vs, "w"));
    ck_assert_float_eq_tol(w->data[0], -2.805f, 1e-5f);
    ck_assert_float_eq_tol(keel_var_slot(keel_vars_find(vs, "w"),
                                         "momentum")->data[1], -5.42f, 1e-5f);
    cfg.session.updater.apply = (keel_status (*)(void *, keel_vars *,
                                                 keel_grads *, int64_t))1;
    ck_assert_int_eq(keel_training_session_new(&cfg, &s), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "session.updater"));
    keel_hook_release(&stop);
    keel_vars_free(vs);
}
END_TEST

/* Wrong roles and options are named errors, nothing is started. */
START_TEST(test_seam_rejects_wrong_roles_and_options)
{
    tu_cluster cl;
    keel_cluster_spec *local;
    keel_vars *vs = seam_vars();
    keel_cluster_config co;
    keel_cluster_backend *b = (keel_cluster_backend *)&co;
    keel_training_config cfg;
    keel_session *s = NULL;

    tu_cluster_new(&cl, 0);
    keel_cluster_config_init(&co);
    ck_assert_int_eq(keel_ps_run(cl.ps, vs, &co), KEEL_EINVAL); /* no rule */
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "optimizer is NULL"));
    ck_assert_int_eq(keel_ps_run(cl.chief, vs, &co), KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "not a ps"));
    ck_assert_int_eq(keel_cluster_backend_new(cl.ps, vs, &co, &b),
                     KEEL_EINVAL);
    ck_assert_ptr_null(b);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "keel_ps_run"));
    co.struct_size = 8;
    ck_assert_int_eq(keel_cluster_backend_new(cl.chief, vs, &co, &b),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "struct_size"));
    keel_cluster_config_init(&co);
    co.heartbeat_ms = co.dead_after_ms;
    ck_assert_int_eq(keel_cluster_backend_new(cl.chief, vs, &co, &b),
                     KEEL_EINVAL);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "heartbeat_ms"));
    ck_assert_int_eq(keel_cluster_spec_is_ps(cl.ps), 1);
    ck_assert_int_eq(keel_cluster_spec_is_ps(cl.chief), 0);
    ck_assert_int_eq(keel_cluster_spec_is_ps(NULL), 0);

    keel_training_config_init(&cfg);
    cfg.session.manager.vars = vs;
    cfg.session.step = seam_step;
    cfg.cluster = cl.ps;
    ck_assert_int_eq(keel_training_session_new(&cfg, &s), KEEL_EINVAL);
    ck_assert_ptr_null(s);
    ck_assert_ptr_nonnull(strstr(keel_last_error(), "keel_ps_run"));

    /* no TF_CONFIG, no Slurm: a local spec, and cluster_from_env trains
     * alone */
    unsetenv("TF_CONFIG");
    unsetenv("SLURM_PROCID");
    ck_assert_int_eq(keel_cluster_spec_detect(NULL, &local), KEEL_OK);
    ck_assert_int_eq(keel_cluster_spec_is_local(local), 1);
    ck_assert_int_eq(keel_cluster_spec_is_ps(local), 0);
    keel_cluster_spec_free(local);
    setenv("TF_CONFIG", "{\"cluster\": {\"chief\": [\"127.0.0.1:1\"]}, "
           "\"task\": {\"type\": \"chief\", \"index\": 0}}", 1);
    ck_assert_int_eq(keel_cluster_spec_detect(NULL, &local), KEEL_OK);
    ck_assert_int_eq(keel_cluster_spec_is_local(local), 1); /* TF: master '' */
    keel_cluster_spec_free(local);
    setenv("TF_CONFIG", "{\"cluster\": {\"ps\": [\"h:0\"]}, \"task\": "
           "{\"type\": \"ps\", \"index\": 0}}", 1);
    ck_assert_int_eq(keel_cluster_spec_detect(NULL, &local), KEEL_EINVAL);
    ck_assert_ptr_null(local);
    unsetenv("TF_CONFIG");

    keel_vars_free(vs);
    tu_cluster_free(&cl);
}
END_TEST

/* ---- partitioned variables ---------------------------------------------- */

/* The split store of vs for 3 ps at 32 bytes a part (max_parts 0: 3). */
static keel__partition *
split_of(const keel_vars *vs, int max_parts)
{
    keel__partition *p = NULL;
    ck_assert_int_eq(keel__partition_new(vs, 3, 32, max_parts, 1, &p),
                     KEEL_OK);
    ck_assert_ptr_nonnull(p);
    return p;
}

START_TEST(test_partition_covers_rows_once_and_spreads_over_ps)
{
    static const int64_t big[2] = { 10, 3 }, small[2] = { 2, 2 },
                         vec[1] = { 7 }, loc[1] = { 100 };
    keel_vars *vs = NULL;
    keel__partition *p, *again, *two;
    keel_grads *g = NULL, *pg = NULL;
    keel_var *bv = NULL;
    keel_tensor *slot;
    int ps_of[16], seen[3] = { 0, 0, 0 };
    /* every row of every split exactly once, in order, the longer first */
    for (int64_t rows = 1; rows <= 40; rows++)
        for (int k = 1; k <= rows && k <= 9; k++) {
            int64_t next = 0, first, n, prev = rows;
            for (int i = 0; i < k; i++) {
                keel__partition_rows(rows, k, i, &first, &n);
                ck_assert_int_eq(first, next);
                ck_assert(n >= 1 && n <= prev && n >= rows / k);
                next = first + n;
                prev = n;
            }
            ck_assert_int_eq(next, rows);
        }
    ck_assert_int_eq(keel_vars_new(&vs), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "big", 2, big, KEEL_VAR_TRAINABLE,
                                      &bv), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "small", 2, small,
                                      KEEL_VAR_TRAINABLE, NULL), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "vec", 1, vec, KEEL_VAR_TRAINABLE,
                                      NULL), KEEL_OK);
    ck_assert_int_eq(keel_vars_create(vs, "loc", 1, loc, KEEL_VAR_LOCAL,
                                      NULL), KEEL_OK);
    ck_assert_int_eq(keel_var_add_slot(bv, "m", &slot), KEEL_OK);
    /* nothing above the size: no split store */
    p = (keel__partition *)1;
    ck_assert_int_eq(keel__partition_new(vs, 3, 0, 0, 1, &p), KEEL_OK);
    ck_assert_ptr_null(p);
    p = split_of(vs, 0);
    /* big (120 bytes) in 3 parts of 4, 3, 3 rows; vec (28) whole; the
     * local variable whole */
    ck_assert_int_eq(keel_vars_count(p->wire), 6);
    ck_assert_int_eq(p->parts[0], 3);
    ck_assert_int_eq(p->parts[1], 1);
    ck_assert_int_eq(p->parts[2], 1);
    ck_assert_int_eq(p->parts[3], 1);
    ck_assert_str_eq(keel_var_name(keel_vars_at(p->wire, 0)), "big/part_0");
    ck_assert_str_eq(keel_var_name(keel_vars_at(p->wire, 2)), "big/part_2");
    ck_assert_str_eq(keel_var_name(keel_vars_at(p->wire, 3)), "small");
    ck_assert_int_eq(keel_var_tensor(keel_vars_at(p->wire, 0))->shape[0], 4);
    ck_assert_int_eq(keel_var_tensor(keel_vars_at(p->wire, 1))->shape[0], 3);
    ck_assert_int_eq(keel_var_tensor(keel_vars_at(p->wire, 2))->shape[1], 3);
    ck_assert_ptr_nonnull(keel_var_slot(keel_vars_at(p->wire, 1), "m"));
    /* each part's rows of its whole variable (what a ps reads from a
     * checkpoint); a variable kept whole is no part */
    for (size_t j = 0; j < 6; j++) {
        const char *whole = NULL;
        int64_t b = -1, e = -1;
        static const int64_t rows[3][2] = { { 0, 4 }, { 4, 7 }, { 7, 10 } };
        int is = keel__partition_part_of(p, vs, j, &whole, &b, &e);
        ck_assert_int_eq(is, j < 3);
        if (!is)
            continue;
        ck_assert_str_eq(whole, "big");
        ck_assert_int_eq(b, rows[j][0]);
        ck_assert_int_eq(e, rows[j][1]);
    }
    /* the same split on every call */
    again = split_of(vs, 0);
    ck_assert_int_eq(keel_vars_count(again->wire), 6);
    for (size_t i = 0; i < 6; i++) {
        keel_tensor *a = keel_var_tensor(keel_vars_at(p->wire, i));
        keel_tensor *b = keel_var_tensor(keel_vars_at(again->wire, i));
        ck_assert_str_eq(keel_var_name(keel_vars_at(p->wire, i)),
                         keel_var_name(keel_vars_at(again->wire, i)));
        ck_assert(keel_shape_equal(a->ndim, a->shape, b->ndim, b->shape));
    }
    keel__partition_free(again);
    /* the parts of big on the 3 ps, one each */
    ck_assert_int_eq(keel__cluster_place(p->wire, 3, 0, ps_of), KEEL_OK);
    for (int i = 0; i < 3; i++)
        seen[ps_of[i]]++;
    ck_assert(seen[0] == 1 && seen[1] == 1 && seen[2] == 1);
    ck_assert_int_eq(ps_of[5], -1);
    /* values and slots to the parts and back; a gradient's rows split */
    for (int i = 0; i < 30; i++) {
        keel_var_tensor(bv)->data[i] = (float)i;
        keel_var_slot(bv, "m")->data[i] = (float)-i;
    }
    keel_vars_set_global_step(vs, 7);
    keel__partition_scatter(p, vs, 1);
    ck_assert_int_eq(keel_vars_global_step(p->wire), 7);
    ck_assert(keel_var_tensor(keel_vars_at(p->wire, 1))->data[0] == 12.0f);
    ck_assert(keel_var_slot(keel_vars_at(p->wire, 2), "m")->data[8] ==
              -29.0f);
    memset(keel_var_tensor(bv)->data, 0, 30 * sizeof(float));
    memset(keel_var_slot(bv, "m")->data, 0, 30 * sizeof(float));
    keel__partition_gather(p, vs, 1, 0);
    for (int i = 0; i < 30; i++) {
        ck_assert(keel_var_tensor(bv)->data[i] == (float)i);
        ck_assert(keel_var_slot(bv, "m")->data[i] == (float)-i);
    }
    ck_assert_int_eq(keel_grads_new(vs, &g), KEEL_OK);
    ck_assert_int_eq(keel_grads_new(p->wire, &pg), KEEL_OK);
    for (int i = 0; i < 30; i++)
        keel_grads_at(g, 0)->data[i] = (float)(100 + i);
    ck_assert_int_eq(keel_grads_set_examples(g, 5), KEEL_OK);
    keel__partition_grads(p, g, pg);
    ck_assert(keel_grads_at(pg, 2)->data[0] == 121.0f);
    ck_assert_int_eq(keel_grads_examples(pg), 5);
    keel_grads_free(g);
    keel_grads_free(pg);
    keel__partition_free(p);
    /* max_partitions 2: 5 and 5 rows */
    two = split_of(vs, 2);
    ck_assert_int_eq(two->parts[0], 2);
    ck_assert_int_eq(keel_var_tensor(keel_vars_at(two->wire, 1))->shape[0],
                     5);
    keel__partition_free(two);
    keel_vars_free(vs);
}
END_TEST

static Suite *
cluster_suite(void)
{
    Suite *s = suite_create("cluster");
    tu_tcase(s, "spec", 0, NULL, NULL, TU_TESTS(
        test_tf_config_full_cluster_reads_every_job_and_the_task,
        test_tf_config_master_is_chief_and_keel_keys_are_read,
        test_tf_config_without_chief_worker_0_is_chief,
        test_tf_config_evaluator_is_outside_the_training_cluster,
        test_tf_config_local_mode,
        test_replica_index_counts_the_chief_first,
        test_tf_config_sparse_jobs_are_ordered_and_must_be_dense,
        test_tf_config_each_bad_input_is_named,
        test_tf_config_lists_every_problem_at_once,
        test_tf_config_size_is_bounded,
        test_tf_config_from_env,
        test_tf_config_generator_round_trips,
        test_tf_config_replica_counts_must_fit_the_cluster,
        test_format_summarises_the_cluster,
        test_explicit_lists_from_ini_values,
        test_addresses_are_names_ipv4_or_bracketed_ipv6,
        test_tf_config_as_the_tfjob_operator_writes_it,
        test_check_hosts_names_unresolvable_foreign_and_shared,
        test_slurm_hostlist_expansion,
        test_slurm_tasks_per_node_and_reserved_ports,
        test_slurm_ranks_map_to_ps_then_workers,
        test_slurm_errors_are_named_and_listed_together));
    tu_tcase(s, "wire", 0, NULL, NULL, TU_TESTS(
        test_header_round_trip_keeps_every_field,
        test_send_recv_round_trip_tensors_names_and_text,
        test_pin_hand_over_keeps_queued_frames_and_frees_them,
        test_decode_rejects_every_malformed_class,
        test_decode_copies_misaligned_data_only,
        test_recv_drains_and_rejects_too_many_frames,
        test_sockopts_set_the_send_buffer,
        test_metrics_push_combine_ack_round_trip));
    tu_tcase(s, "live", 20, NULL, NULL, TU_TESTS(
        test_live_server_survives_garbage_and_serves_others,
        test_pull_of_named_and_unknown_variables,
        test_push_sum_has_the_scalar_bits,
        test_real_ps_checks_requests_and_aggregates_in_sync,
        test_real_ps_weighs_replicas_by_their_examples,
        test_rows_push_bad_ids_are_refused_by_name,
        test_rows_sync_mean_has_the_dense_bits,
        test_rows_async_push_applies_those_rows,
        test_weighted_mean_kernel_has_the_scalar_bits,
        test_real_ps_weighted_mean_with_equal_and_unequal_counts,
        test_real_ps_weighted_mean_of_a_variable_pushed_twice,
        test_real_ps_applies_the_mean_with_a_backup_worker,
        test_ipc_frozen_reader_does_not_stall_the_step,
        test_global_step_waiter_hook_sees_the_cluster_step,
        test_heartbeats_see_the_step_state_and_a_restarted_ps,
        test_heartbeat_on_reconnect_hears_a_restarted_ps,
        test_heartbeat_sees_a_busy_ps_alive_and_a_gone_one_silent));
    tu_tcase(s, "security", 20, tu_setup, tu_teardown, TU_TESTS(
        test_keygen_writes_pair_with_modes_and_never_overwrites,
        test_curve_admits_allowed_keys_only,
        test_curve_allowed_key_in_a_role_it_does_not_hold,
        test_token_admits_the_job_tasks_only,
        test_local_ps_over_ipc_checks_the_token_and_rebinds,
        test_cli_keygen));
    tu_tcase(s, "seam", 30, NULL, NULL, TU_TESTS(
        test_seam_ps_run_and_training_session_on_a_cluster,
        test_ps_refuses_updates_from_an_earlier_generation,
        test_async_push_with_values_equals_a_pull,
        test_seam_training_optimizer_alone,
        test_seam_rejects_wrong_roles_and_options));
    tu_tcase(s, "partition", 0, NULL, NULL, TU_TESTS(
        test_partition_covers_rows_once_and_spreads_over_ps));
    return s;
}

KEEL_TEST_MAIN(cluster_suite)
