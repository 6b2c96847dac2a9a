/* train_bench.c - keel training throughput and accuracy on real
 * Fashion-MNIST, the twin of bench/torch_train.py: same models,
 * optimizers, batch sizes and step counting; prints one JSON object per line
 * with examples/s, GFLOP/s against an sgemm peak measured in the same run,
 * the OpenBLAS core name and the time split. Run by bench/train.sh. */
#include <config.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#include <keel/keel.h>
#include "bench_util.h"
#include "../train/train_int.h"   /* the optimizer on the model's threads,
                                   * as keel train runs it */

static const char *data_dir = "/usr/share/datasets/fashion-mnist";

static void
die(const char *what)
{
    fprintf(stderr, "train_bench: %s: %s\n", what, keel_last_error());
    exit(1);
}

/* sgemm n^3 GFLOP/s, best of reps, with the current thread count. */
static double
sgemm_peak(int n, int reps)
{
    size_t sz = (size_t)n * (size_t)n;
    float *a = malloc(sz * 4), *b = malloc(sz * 4), *c = malloc(sz * 4);
    double best = 0.0;
    for (size_t i = 0; i < sz; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
    }
    for (int r = 0; r < reps + 1; r++) {
        double t0 = bench_now(), g;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f,
                    a, n, b, n, 0.0f, c, n);
        g = 2.0 * n * (double)n * n / (bench_now() - t0) / 1e9;
        if (r > 0 && g > best)
            best = g;
    }
    free(a);
    free(b);
    free(c);
    return best;
}

typedef struct run {
    bench_model net;
    keel_optimizer *o;
    keel_data_iter *it;
    int64_t batch;
    int zeroed;              /* net.g is zero (the last update zeroed it) */
} run;

static void
run_new(run *r, const char *model, int64_t batch, const keel_dataset *train,
        keel_init_kind init, uint64_t seed, double lr, int model_threads)
{
    keel_model_config mc;
    keel_optimizer_config oc;
    keel_data_iter_config ic;
    keel_model_config_init(&mc);
    if (keel_model_kind_from_name(model, &mc.kind) != KEEL_OK)
        die("model");
    mc.max_batch = batch;
    mc.init = init;
    mc.threads = model_threads;
    if (bench_model_new(&r->net, &mc, seed) != KEEL_OK)
        die("model setup");
    /* the PyTorch twin: MLP SGD momentum 0.9 lr 0.01, CNN Adam lr 1e-3 */
    if (mc.kind == KEEL_MODEL_CNN) {
        keel_optimizer_config_init(&oc, KEEL_OPT_ADAM);
        oc.schedule.learning_rate = lr > 0 ? lr : 1e-3;
        oc.epsilon = 1e-8;
    } else {
        keel_optimizer_config_init(&oc, KEEL_OPT_MOMENTUM);
        oc.schedule.learning_rate = lr > 0 ? lr : 0.01;
    }
    if (keel_optimizer_new(&oc, &r->o) != KEEL_OK ||
        keel_optimizer_prepare(r->o, r->net.vs) != KEEL_OK)
        die("optimizer");
    keel_data_iter_config_init(&ic);
    ic.global_batch_size = batch;
    ic.seed = seed;
    if (keel_data_iter_new(train, &ic, &r->it) != KEEL_OK)
        die("iterator");
    r->batch = batch;
    r->zeroed = 0;
}

static void
run_free(run *r)
{
    keel_data_iter_free(r->it);
    keel_optimizer_free(r->o);
    bench_model_free(&r->net);
}

static double data_s;

/* n training steps; returns the last batch's mean loss. */
static double
steps(run *r, int n)
{
    bench_model *net = &r->net;
    keel_step_stats st = { 0 };
    for (int i = 0; i < n; i++) {
        keel_batch b;
        double t0 = bench_now();
        if (keel_data_iter_next(r->it, &b) != KEEL_OK)
            die("next batch");
        data_s += bench_now() - t0;
        /* as keel train does: the update leaves the gradients zero */
        if (!r->zeroed)
            keel_grads_zero(net->g);
        r->zeroed = 0;
        /* the step and the update in one pool run (train_int.h) */
        int64_t gs = keel_vars_global_step(net->vs);
        if (keel__model_step_apply(net->m, net->vs, &b, r->batch, net->g, &st,
                                   r->o, gs, 1) != KEEL_OK)
            die("step");
        r->zeroed = 1;
        keel_vars_set_global_step(net->vs, gs + 1);
    }
    return st.loss_sum / (double)r->batch;
}

static double
evaluate(run *r, const keel_dataset *test)
{
    size_t n = keel_dataset_count(test), es = keel_dataset_example_size(test);
    size_t bs = (size_t)r->batch;
    float *x = malloc(bs * es * sizeof *x);
    int32_t *y = malloc(bs * sizeof *y);
    int64_t correct = 0;
    for (size_t i = 0; i < n; i += bs) {
        size_t k = n - i < bs ? n - i : bs;
        keel_step_stats st;
        keel_batch b = { x, y, k };
        for (size_t j = 0; j < k; j++)
            keel_dataset_get(test, i + j, x + j * es, y + j);
        if (keel_model_eval(r->net.m, r->net.vs, &b, &st) != KEEL_OK)
            die("eval");
        correct += st.correct;
    }
    free(x);
    free(y);
    return (double)correct / (double)n;
}

static keel_dataset *
load(const char *split)
{
    char img[512], lab[512];
    keel_dataset *ds;
    snprintf(img, sizeof img, "%s/%s-images-idx3-ubyte.gz", data_dir, split);
    snprintf(lab, sizeof lab, "%s/%s-labels-idx1-ubyte.gz", data_dir, split);
    if (keel_dataset_open_idx(img, lab, 10, &ds) != KEEL_OK)
        die("open data");
    return ds;
}

/* A thread setting: "2" = OpenBLAS 2 threads; "m2" = 2 model threads
 * splitting each batch, OpenBLAS 1 thread. */
typedef struct setting {
    char name[8];
    int blas, model;
} setting;

/* Where the first setting's timed steps spent their time: the profile's
 * parts (gemm, im2col, elementwise, optimizer, direct convolution), the
 * data iterator's, and the total. */
typedef struct time_split {
    double part[5], data, total;
} time_split;

/* How many steps of r take about seg_s seconds (at least 10), after 5
 * warm-up steps. */
static int
steps_per_segment(run *r, double seg_s)
{
    double t0;
    int nsteps;
    steps(r, 5);
    t0 = bench_now();
    steps(r, 10);
    nsteps = (int)(seg_s / ((bench_now() - t0) / 10));
    return nsteps < 10 ? 10 : nsteps;
}

/* nsteps timed steps of r under set (after 2 untimed ones): examples/s.
 * The profile runs only with one model thread; with split != NULL its
 * times and the data time are added there. */
static double
time_setting(run *r, const setting *set, int nsteps, time_split *split)
{
    keel_train_profile p;
    double t0, eps;
    keel_train_set_threads(set->blas);
    steps(r, 2);
    keel_train_profile_reset();
    keel_train_profile_enable(set->model == 1);
    data_s = 0;
    t0 = bench_now();
    steps(r, nsteps);
    eps = (double)nsteps * (double)r->batch / (bench_now() - t0);
    keel_train_profile_enable(0);
    if (split != NULL) {
        keel_train_get_profile(&p);
        split->part[0] += (double)p.gemm_ns * 1e-9;
        split->part[1] += (double)p.im2col_ns * 1e-9;
        split->part[2] += (double)p.elementwise_ns * 1e-9;
        split->part[3] += (double)p.optimizer_ns * 1e-9;
        split->part[4] += (double)p.conv_direct_ns * 1e-9;
        split->data += data_s;
        split->total += (double)nsteps * (double)r->batch / eps;
    }
    return eps;
}

static void
print_tput(const char *model, int64_t batch, const setting *set,
           int nsteps, double *res, int reps, double flops,
           const double *peak)
{
    double lo = res[0], hi = res[0], med;
    int cores = set->blas * set->model;
    for (int i = 1; i < reps; i++) {
        lo = res[i] < lo ? res[i] : lo;
        hi = res[i] > hi ? res[i] : hi;
    }
    med = bench_median(res, reps);
    printf("{\"bench\": \"keel_train_tput\", \"model\": \"%s\", "
           "\"batch\": %lld, \"threads\": \"%s\", \"blas_threads\": %d, "
           "\"model_threads\": %d, \"corename\": \"%s\", "
           "\"steps_per_rep\": %d, \"unit\": \"examples/s\", "
           "\"median\": %.1f, \"min\": %.1f, \"max\": %.1f, \"reps\": %d, "
           "\"gflops\": %.1f, \"sgemm_peak_gflops\": %.1f, "
           "\"pct_of_peak\": %.1f}\n",
           model, (long long)batch, set->name, set->blas,
           set->model, keel_train_blas_corename(), nsteps, med, lo, hi,
           reps, med * flops / 1e9, peak[cores > 1],
           100.0 * med * flops / 1e9 / peak[cores > 1]);
}

static void
print_split(const char *model, int64_t batch, const setting *set,
            const time_split *sp)
{
    const double *part = sp->part;
    double total_s = sp->total;
    printf("{\"bench\": \"keel_train_split\", \"model\": \"%s\", \"batch\": "
           "%lld, \"threads\": \"%s\", \"gemm_pct\": %.1f, "
           "\"im2col_pct\": %.1f, "
           "\"elementwise_pct\": %.1f, \"optimizer_pct\": %.1f, "
           "\"conv_direct_pct\": %.1f, "
           "\"data_pct\": %.1f, \"other_pct\": %.1f}\n",
           model, (long long)batch, set->name,
           100 * part[0] / total_s, 100 * part[1] / total_s,
           100 * part[2] / total_s, 100 * part[3] / total_s,
           100 * part[4] / total_s, 100 * sp->data / total_s,
           100 * (total_s - part[0] - part[1] - part[2] - part[3] -
                  part[4] - sp->data) / total_s);
}

/* Examples/s of model at batch under each of the nt thread settings,
 * interleaved rep by rep, and the first setting's time split. */
static void
throughput(const char *model, int64_t batch, const setting *set, int nt,
           int reps, double seg_s, const keel_dataset *train, double *peak)
{
    run r[4];
    double res[4][64];
    time_split split = { { 0 }, 0, 0 };
    int nsteps;
    double flops;
    for (int t = 0; t < nt; t++)
        run_new(&r[t], model, batch, train, KEEL_INIT_GLOROT, 0, 0,
                set[t].model);
    flops = keel_model_flops_per_example(r[0].net.m);
    keel_train_set_threads(set[nt - 1].blas);
    nsteps = steps_per_segment(&r[nt - 1], seg_s);
    for (int rep = 0; rep < reps; rep++)
        for (int t = 0; t < nt; t++)
            res[t][rep] = time_setting(&r[t], &set[t], nsteps,
                                       t == 0 ? &split : NULL);
    for (int t = 0; t < nt; t++) {
        print_tput(model, batch, &set[t], nsteps, res[t], reps, flops, peak);
        run_free(&r[t]);
    }
    print_split(model, batch, &set[0], &split);
    fflush(stdout);
}

static void
accuracy(const char *model, int64_t batch, int epochs, uint64_t seed,
         keel_init_kind init, int model_threads, const keel_dataset *train,
         const keel_dataset *test)
{
    run r;
    int64_t spe;
    run_new(&r, model, batch, train, init, seed, 0, model_threads);
    spe = keel_data_iter_steps_per_epoch(r.it);
    for (int ep = 1; ep <= epochs; ep++) {
        double t0 = bench_now(), loss, dt, acc;
        loss = steps(&r, (int)spe);
        dt = bench_now() - t0;
        acc = evaluate(&r, test);
        printf("{\"bench\": \"keel_train_epoch\", \"model\": \"%s\", "
               "\"batch\": %lld, \"threads\": %d, \"model_threads\": %d, "
               "\"corename\": \"%s\", \"seed\": %llu, \"init\": \"%s\", "
               "\"epoch\": %d, "
               "\"epoch_s\": %.2f, \"examples_per_s\": %.1f, "
               "\"last_batch_loss\": %.4f, \"test_acc\": %.4f}\n",
               model, (long long)batch, keel_train_threads(),
               model_threads, keel_train_blas_corename(),
               (unsigned long long)seed,
               init == KEEL_INIT_TORCH ? "torch" : "glorot", ep, dt,
               (double)(spe * batch) / dt, loss, acc);
        fflush(stdout);
    }
    run_free(&r);
}

static void
usage(void)
{
    fprintf(stderr,
            "usage: train_bench --mode throughput|accuracy [--models mlp,cnn]"
            " [--batches 64,256]\n"
            "       [--threads-list 1,2,m2] [--model-threads 1] [--reps 5]"
            " [--seg-seconds 1.5]\n"
            "       [--epochs 5] [--threads 2]"
            "       [--seed 0] [--init glorot|torch] [--data DIR]\n");
    exit(2);
}

/* The command line: see usage(). */
typedef struct train_opts {
    const char *mode, *models, *batches, *tlist;
    int model_threads, reps, epochs, threads;
    double seg;
    uint64_t seed;
    keel_init_kind init;
} train_opts;

static void
parse_args(int argc, char **argv, train_opts *o)
{
    *o = (train_opts){ .models = "mlp,cnn", .batches = "64,256",
                       .tlist = "1,2,m2", .model_threads = 1, .reps = 5,
                       .epochs = 5, .threads = 2, .seg = 1.5,
                       .init = KEEL_INIT_GLOROT };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL)
            usage();
        i++;
        if (!strcmp(a, "--mode"))
            o->mode = v;
        else if (!strcmp(a, "--models"))
            o->models = v;
        else if (!strcmp(a, "--batches"))
            o->batches = v;
        else if (!strcmp(a, "--threads-list"))
            o->tlist = v;
        else if (!strcmp(a, "--reps"))
            o->reps = atoi(v);
        else if (!strcmp(a, "--seg-seconds"))
            o->seg = atof(v);
        else if (!strcmp(a, "--epochs"))
            o->epochs = atoi(v);
        else if (!strcmp(a, "--model-threads"))
            o->model_threads = atoi(v);
        else if (!strcmp(a, "--threads"))
            o->threads = atoi(v);
        else if (!strcmp(a, "--seed"))
            o->seed = strtoull(v, NULL, 10);
        else if (!strcmp(a, "--init")) {
            if (keel_init_kind_from_name(v, &o->init) != KEEL_OK)
                die("--init");
        } else if (!strcmp(a, "--data"))
            data_dir = v;
        else
            usage();
    }
    if (o->mode == NULL || o->reps < 1 || o->reps > 64)
        usage();
}

/* --threads-list into tl (at most 4 settings); returns how many. */
static int
parse_thread_list(const char *tlist, setting tl[4])
{
    char buf[256], *tok, *save;
    int nt = 0;
    snprintf(buf, sizeof buf, "%s", tlist);
    for (tok = strtok_r(buf, ",", &save); tok != NULL && nt < 4;
         tok = strtok_r(NULL, ",", &save)) {
        snprintf(tl[nt].name, sizeof tl[nt].name, "%s", tok);
        tl[nt].model = tok[0] == 'm' ? atoi(tok + 1) : 1;
        tl[nt].blas = tok[0] == 'm' ? 1 : atoi(tok);
        if (tl[nt].model < 1 || tl[nt].blas < 1)
            usage();
        nt++;
    }
    return nt;
}

/* The sgemm peak with 1 and 2 OpenBLAS threads, printed and kept in
 * peak[0] and peak[1]. */
static void
measure_peaks(double peak[2])
{
    for (int t = 0; t < 2; t++) {
        keel_train_set_threads(t + 1);
        peak[t] = sgemm_peak(2048, 3);
        printf("{\"bench\": \"keel_sgemm_peak\", \"n\": 2048, "
               "\"threads\": %d, \"corename\": \"%s\", \"gflops\": "
               "%.1f}\n", t + 1, keel_train_blas_corename(), peak[t]);
    }
}

int
main(int argc, char **argv)
{
    train_opts o;
    double peak[2] = { 0, 0 };
    setting tl[4];
    int nt, is_throughput;
    char buf[256], *tok, *save;
    keel_dataset *train, *test = NULL;
    parse_args(argc, argv, &o);
    nt = parse_thread_list(o.tlist, tl);
    train = load("train");
    is_throughput = !strcmp(o.mode, "throughput");
    if (is_throughput) {
        measure_peaks(peak);
    } else if (!strcmp(o.mode, "accuracy")) {
        test = load("t10k");
        keel_train_set_threads(o.threads);
    } else {
        usage();
    }
    /* every model with every batch size */
    snprintf(buf, sizeof buf, "%s", o.models);
    for (tok = strtok_r(buf, ",", &save); tok != NULL;
         tok = strtok_r(NULL, ",", &save)) {
        char b2[128], *t2, *s2;
        snprintf(b2, sizeof b2, "%s", o.batches);
        for (t2 = strtok_r(b2, ",", &s2); t2 != NULL;
             t2 = strtok_r(NULL, ",", &s2)) {
            if (is_throughput)
                throughput(tok, atoll(t2), tl, nt, o.reps, o.seg, train,
                           peak);
            else
                accuracy(tok, atoll(t2), o.epochs, o.seed, o.init,
                         o.model_threads, train, test);
        }
    }
    keel_dataset_free(test);
    keel_dataset_free(train);
    return 0;
}
