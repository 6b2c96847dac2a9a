/* kfac_bench.c - per-step cost of K-FAC against Adam in one process on
 * Fashion-MNIST: the same model, batches and thread settings, steps timed
 * as keel train runs them (model step, then the update; K-FAC adds its
 * statistics pass). Rounds alternate Adam and K-FAC; prints one JSON line
 * per round with the median step time of each (wall clock, and the
 * process's CPU time, which other jobs on a loaded machine disturb less)
 * and K-FAC's split (factor statistics and EMA, inversions, preconditioned
 * update), plus the OpenBLAS core name. Run by bench/kfac.sh.
 *
 * usage: kfac_bench [--model mlp|cnn] [--batch 64] [--steps 300]
 *                   [--rounds 3] [--invert-every 10]
 *                   [--cov-update-every 1] [--data DIR] */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <keel/keel.h>
#include "bench_util.h"

static void
check(keel_status st, const char *what)
{
    if (st != KEEL_OK) {
        fprintf(stderr, "kfac_bench: %s: %s\n", what, keel_last_error());
        exit(1);
    }
}

typedef struct run {
    bench_model net;
    keel_optimizer *opt;
    keel_kfac *kfac;
} run;

static void
run_new(run *r, keel_model_kind kind, int64_t batch, int use_kfac,
        int64_t invert_every, int64_t cov_every, const keel_dataset *ds)
{
    keel_model_config mc;
    memset(r, 0, sizeof *r);
    keel_model_config_init(&mc);
    mc.kind = kind;
    keel_dataset_shape(ds, &mc.height, &mc.width, &mc.channels);
    mc.max_batch = batch;
    check(bench_model_new(&r->net, &mc, 1), "model");
    if (use_kfac) {
        keel_kfac_config kc;
        keel_kfac_config_init(&kc);
        kc.invert_every = invert_every;
        kc.cov_update_every = cov_every;
        kc.model_grads = 1;          /* as keel train in one process */
        check(keel_kfac_new(&kc, r->net.m, r->net.vs, &r->kfac), "kfac");
    } else {
        keel_optimizer_config oc;
        keel_optimizer_config_init(&oc, KEEL_OPT_ADAM);
        check(keel_optimizer_new(&oc, &r->opt), "adam");
        check(keel_optimizer_prepare(r->opt, r->net.vs), "prepare");
    }
}

static void
run_free(run *r)
{
    keel_kfac_free(r->kfac);
    keel_optimizer_free(r->opt);
    bench_model_free(&r->net);
}

/* steps steps from step0; returns seconds per step (median of blocks of
 * 10 steps, so a whole invert_every period is inside each block), and in
 * *cpu the median CPU seconds per step. */
static double
timed(run *r, keel_data_iter *it, int64_t batch, int steps, int64_t *step,
      double *cpu)
{
    bench_model *net = &r->net;
    double blk[1024], cblk[1024];
    int nb = 0;
    for (int s = 0; s < steps; s += 10) {
        double t0 = bench_now(), c0 = bench_cpu_now();
        for (int i = 0; i < 10; i++) {
            keel_batch b;
            keel_status st = keel_data_iter_next(it, &b);
            if (st == KEEL_EOUTOFRANGE)
                st = keel_data_iter_next(it, &b);
            check(st, "data");
            keel_grads_zero(net->g);
            check(keel_model_step(net->m, net->vs, &b, batch, net->g, NULL),
                  "step");
            if (r->kfac != NULL) {
                check(keel_kfac_observe(r->kfac, net->vs, &b, *step),
                      "observe");
                check(keel_kfac_apply(r->kfac, net->vs, net->g, *step),
                      "apply");
            } else {
                check(keel_optimizer_apply(r->opt, net->vs, net->g, *step),
                      "apply");
            }
            (*step)++;
        }
        if (nb < 1024) {
            cblk[nb] = (bench_cpu_now() - c0) / 10.0;
            blk[nb++] = (bench_now() - t0) / 10.0;
        }
    }
    *cpu = bench_median(cblk, nb);
    return bench_median(blk, nb);
}

/* The command line: see the usage at the top of this file. */
typedef struct kfac_opts {
    const char *model, *dir;
    int64_t batch, ie, ce;
    int steps, rounds;
} kfac_opts;

static int
parse_args(int argc, char **argv, kfac_opts *o)
{
    *o = (kfac_opts){ .model = "mlp",
                      .dir = "/usr/share/datasets/fashion-mnist",
                      .batch = 64, .ie = 10, .ce = 1,
                      .steps = 300, .rounds = 3 };
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            o->model = argv[i + 1];
        else if (strcmp(argv[i], "--batch") == 0)
            o->batch = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--steps") == 0)
            o->steps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--rounds") == 0)
            o->rounds = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--invert-every") == 0)
            o->ie = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--cov-update-every") == 0)
            o->ce = atoll(argv[i + 1]);
        else if (strcmp(argv[i], "--data") == 0)
            o->dir = argv[i + 1];
        else {
            fprintf(stderr, "kfac_bench: unknown option %s\n", argv[i]);
            return 2;
        }
    }
    return 0;
}

/* One optimizer's turn in a round (use_kfac: K-FAC, else Adam) on a fresh
 * model and iterator: a warm-up, then steps timed with the profile on
 * (read into *p for K-FAC). Seconds per step; CPU seconds in *cpu. */
static double
time_optimizer(const kfac_opts *o, keel_model_kind kind,
               const keel_dataset *ds, int use_kfac, double *cpu,
               keel_train_profile *p)
{
    run ru;
    keel_data_iter *it;
    keel_data_iter_config ic;
    int64_t step = 0;
    double t, cw;
    keel_data_iter_config_init(&ic);
    ic.global_batch_size = o->batch;
    check(keel_data_iter_new(ds, &ic, &it), "iterator");
    run_new(&ru, kind, o->batch, use_kfac, o->ie, o->ce, ds);
    timed(&ru, it, o->batch, 20, &step, &cw);      /* warm-up */
    keel_train_profile_reset();
    keel_train_profile_enable(1);
    t = timed(&ru, it, o->batch, o->steps, &step, cpu);
    keel_train_profile_enable(0);
    if (use_kfac)
        keel_train_get_profile(p);
    run_free(&ru);
    keel_data_iter_free(it);
    return t;
}

static void
print_round(const kfac_opts *o, int r, const double t[2], const double c[2],
            const keel_train_profile *p)
{
    int steps = o->steps;
    printf("{\"round\": %d, \"model\": \"%s\", \"batch\": %lld, "
           "\"invert_every\": %lld, \"cov_update_every\": %lld, "
           "\"corename\": \"%s\", "
           "\"adam_ms\": %.4f, \"kfac_ms\": %.4f, \"ratio\": %.3f, "
           "\"adam_cpu_ms\": %.4f, \"kfac_cpu_ms\": %.4f, "
           "\"cpu_ratio\": %.3f, "
           "\"kfac_stats_ms\": %.4f, \"kfac_invert_ms\": %.4f, "
           "\"kfac_precond_ms\": %.4f}\n",
           r, o->model, (long long)o->batch, (long long)o->ie,
           (long long)o->ce, keel_train_blas_corename(), t[0] * 1e3,
           t[1] * 1e3, t[1] / t[0], c[0] * 1e3, c[1] * 1e3, c[1] / c[0],
           (double)p->kfac_stats_ns / 1e6 / steps,
           (double)p->kfac_invert_ns / 1e6 / steps,
           (double)p->kfac_precond_ns / 1e6 / steps);
    fflush(stdout);
}

int
main(int argc, char **argv)
{
    kfac_opts o;
    keel_model_kind kind;
    keel_dataset *ds;
    char img[1024], lab[1024];
    if (parse_args(argc, argv, &o) != 0)
        return 2;
    check(keel_model_kind_from_name(o.model, &kind), "--model");
    snprintf(img, sizeof img, "%s/train-images-idx3-ubyte.gz", o.dir);
    snprintf(lab, sizeof lab, "%s/train-labels-idx1-ubyte.gz", o.dir);
    check(keel_dataset_open_idx(img, lab, 10, &ds), "dataset");
    for (int r = 0; r < o.rounds; r++) {
        double t[2], c[2];
        keel_train_profile p;
        for (int k = 0; k < 2; k++)     /* Adam, then K-FAC */
            t[k] = time_optimizer(&o, kind, ds, k, &c[k], &p);
        print_round(&o, r, t, c, &p);
    }
    keel_dataset_free(ds);
    return 0;
}
