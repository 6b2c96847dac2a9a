/* sgemm_shapes.c - OpenBLAS sgemm on one thread for the shapes one model
 * thread computes in an MLP step (784-256-256-10 by default), in every
 * orientation that computes the same numbers: C or C^T (the row-major call
 * with its operands swapped, which is also the column-major view), each
 * operand stored plain or transposed, beta 0 or beta 1 onto a zeroed C;
 * and the two ways of sharing a step between two threads: column halves
 * of the full batch (what train/model_run.c does) or row halves of the
 * batch with full columns. Prints GFLOP/s (median of REPS, each the best
 * of a few timed blocks) and the fraction of the 2048^3 sgemm's rate.
 *
 *   bench/sgemm_shapes [batch] [reps]
 *
 * Built on demand (make bench/sgemm_shapes), not by make check. */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "bench_util.h"

extern void openblas_set_num_threads(int);
extern char *openblas_get_corename(void);

static float *
fbuf(size_t n)
{
    float *p = malloc(n * sizeof *p);
    if (p == NULL) {
        fprintf(stderr, "sgemm_shapes: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++)
        p[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    return p;
}

static int
cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* GFLOP/s of C[m x n] = op(A) op(B) (+ C when beta), K = k, row-major with
 * tight leading dimensions, or ldb_cols as B's row length when B is a
 * column range of a wider plain matrix. */
static double
rate(int ta, int tb, size_t m, size_t n, size_t k, float beta,
     size_t ldb_wide, int reps)
{
    float *a = fbuf(m * k), *b = fbuf(k * (ldb_wide ? ldb_wide : n) +
                                      n * k), *c = fbuf(m * n);
    size_t lda = ta ? m : k;
    size_t ldb = ldb_wide ? ldb_wide : tb ? k : n;
    double flops = 2.0 * (double)m * (double)n * (double)k, res[64];
    int inner = (int)(2e7 / flops) + 1;
    if (reps > 64)
        reps = 64;
    for (int r = 0; r < reps; r++) {
        double best = 1e30;
        for (int blk = 0; blk < 3; blk++) {
            double t0 = bench_now(), t;
            for (int i = 0; i < inner; i++) {
                if (beta != 0.0f)
                    memset(c, 0, m * n * sizeof *c);
                cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                            tb ? CblasTrans : CblasNoTrans, (blasint)m,
                            (blasint)n, (blasint)k, 1.0f, a, (blasint)lda, b,
                            (blasint)ldb, beta, c, (blasint)n);
            }
            t = (bench_now() - t0) / inner;
            best = t < best ? t : best;
        }
        res[r] = flops / best * 1e-9;
    }
    qsort(res, (size_t)reps, sizeof *res, cmp_d);
    free(a);
    free(b);
    free(c);
    return res[reps / 2];
}

typedef struct shape {
    const char *what;
    size_t m, n, k;
    int ta, tb;             /* the layout keel's buffers have */
    size_t ldb_wide;        /* B is a column range of this wide a matrix */
} shape;

static void
report(const shape *s, double peak, int reps)
{
    double r[2][2][2], rt;
    double best = 0.0;
    const char *bestname = "";
    static const char *nm[2][2] = { { "NN", "NT" }, { "TN", "TT" } };
    char name[16];
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int bt = 0; bt < 2; bt++) {
                r[ta][tb][bt] = rate(ta, tb, s->m, s->n, s->k,
                                     bt ? 1.0f : 0.0f, 0, reps);
                if (r[ta][tb][bt] > best) {
                    best = r[ta][tb][bt];
                    bestname = nm[ta][tb];
                }
            }
    /* C^T = op(B)^T op(A)^T: the m x n roles swapped */
    rt = 0.0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            double x = rate(ta, tb, s->n, s->m, s->k, 0.0f, 0, reps);
            if (x > rt) {
                rt = x;
                snprintf(name, sizeof name, "C^T %s", nm[ta][tb]);
            }
        }
    printf("%-26s %4zux%4zux%4zu  keel(%s, b0) %5.1f GF %3.0f%%  "
           "keel b1 %3.0f%%  best C %s %3.0f%%  best %s %3.0f%%",
           s->what, s->m, s->n, s->k, nm[s->ta][s->tb],
           r[s->ta][s->tb][0], 100 * r[s->ta][s->tb][0] / peak,
           100 * r[s->ta][s->tb][1] / peak, bestname, 100 * best / peak,
           name, 100 * rt / peak);
    if (s->ldb_wide) {
        double w = rate(s->ta, s->tb, s->m, s->n, s->k, 0.0f, s->ldb_wide,
                        reps);
        printf("  (B strided ld %zu: %3.0f%%)", s->ldb_wide, 100 * w / peak);
    }
    printf("\n");
}

int
main(int argc, char **argv)
{
    size_t bs = argc > 1 ? (size_t)atoi(argv[1]) : 64;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    size_t h = 128, hb = bs / 2;
    double peak;
    openblas_set_num_threads(1);
    peak = rate(0, 0, 2048, 2048, 2048, 0.0f, 0, reps < 3 ? reps : 3);
    printf("core %s, batch %zu, one thread: 2048^3 sgemm %.1f GFLOP/s "
           "(median of %d); %% below are of it\n",
           openblas_get_corename(), bs, peak, reps < 3 ? reps : 3);
    {
        /* keel today: every dense layer in two column halves of the
         * full batch (dout 10 is one half: one thread) */
        shape cols[] = {
            { "cols fwd L1 x.W", bs, h, 784, 0, 0, 256 },
            { "cols fwd L2", bs, h, 256, 0, 0, 256 },
            { "cols fwd L3 (one thread)", bs, 10, 256, 0, 0, 0 },
            { "cols dW L1 x^T.dy", 784, h, bs, 1, 0, 256 },
            { "cols dW L2", 256, h, bs, 1, 0, 256 },
            { "cols dW L3 (one thread)", 256, 10, bs, 1, 0, 0 },
            { "cols dx L3 dy.W^T", bs, h, 10, 0, 1, 0 },
            { "cols dx L2", bs, h, 256, 0, 1, 0 },
        };
        /* the alternative: row halves of the batch, full columns (the
         * dW of the halves then added) */
        shape rows[] = {
            { "rows fwd L1", hb, 256, 784, 0, 0, 0 },
            { "rows fwd L2", hb, 256, 256, 0, 0, 0 },
            { "rows fwd L3", hb, 10, 256, 0, 0, 0 },
            { "rows dW L1", 784, 256, hb, 1, 0, 0 },
            { "rows dW L2", 256, 256, hb, 1, 0, 0 },
            { "rows dW L3", 256, 10, hb, 1, 0, 0 },
            { "rows dx L3", hb, 256, 10, 0, 1, 0 },
            { "rows dx L2", hb, 256, 256, 0, 1, 0 },
        };
        for (size_t i = 0; i < sizeof cols / sizeof *cols; i++)
            report(&cols[i], peak, reps);
        for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
            report(&rows[i], peak, reps);
    }
    return 0;
}
