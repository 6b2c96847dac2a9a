/* layers.c - layer kernels on raw NHWC float buffers: dense, conv2d (im2col +
 * one large sgemm per layer), max-pool with argmax indices, activations and
 * softmax cross-entropy, plus the BLAS glue and profiling. Every
 * kernel is a fixed sequence of operations: same inputs, same bits. */
#include <config.h>

#include <math.h>
#include <string.h>
#include <time.h>

#include <cblas.h>
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#endif

#include "util.h"
#include "train_int.h"

KEEL__VECTORIZE_FILE

keel_train_profile keel__prof;

void
keel_train_profile_enable(int on)
{
    keel__prof_on = on != 0;
}

void
keel_train_get_profile(keel_train_profile *p)
{
    if (p != NULL) {
        *p = keel__prof;
        p->elementwise_ns += keel__prof_core.elementwise_ns;
        p->optimizer_ns += keel__prof_core.optimizer_ns;
    }
}

void
keel_train_profile_reset(void)
{
    memset(&keel__prof, 0, sizeof keel__prof);
    memset(&keel__prof_core, 0, sizeof keel__prof_core);
}

void
keel_train_set_threads(int n)
{
    if (n >= 1)
        openblas_set_num_threads(n);
}

int
keel_train_threads(void)
{
    return openblas_get_num_threads();
}

const char *
keel_train_blas_corename(void)
{
    const char *s = openblas_get_corename();
    return s != NULL ? s : "unknown";
}

/* ---- BLAS --------------------------------------------------------------- */

void
keel__sgemm(int trans_a, int trans_b, size_t m, size_t n, size_t k,
            float alpha, const float *a, size_t lda, const float *b,
            size_t ldb, float beta, float *c, size_t ldc)
{
    KEEL__PROF_BEGIN();
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n,
                (blasint)k, alpha, a, (blasint)lda, b, (blasint)ldb, beta, c,
                (blasint)ldc);
    KEEL__PROF_END(gemm_ns);
}

/* ---- activations -------------------------------------------------------- */

static KEEL__HOT void
relu_inplace(float *restrict y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = y[i] > 0.0f ? y[i] : 0.0f;
}

static KEEL__HOT void
relu_grad(const float *restrict y, float *restrict dy, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static KEEL__HOT void
tanh_grad(const float *restrict y, float *restrict dy, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dy[i] *= 1.0f - y[i] * y[i];
}

void
keel__act_forward(keel_activation a, float *y, size_t count)
{
    KEEL__PROF_BEGIN();
    if (a == KEEL_ACT_RELU) {
        relu_inplace(y, count);
    } else if (a == KEEL_ACT_TANH) {
        for (size_t i = 0; i < count; i++)
            y[i] = tanhf(y[i]);
    }
    KEEL__PROF_END(elementwise_ns);
}

void
keel__act_backward(keel_activation a, const float *y, float *dy,
                   size_t count)
{
    KEEL__PROF_BEGIN();
    if (a == KEEL_ACT_RELU)
        relu_grad(y, dy, count);
    else if (a == KEEL_ACT_TANH)
        tanh_grad(y, dy, count);
    KEEL__PROF_END(elementwise_ns);
}

static KEEL__HOT void
bias_relu_row(float *restrict row, const float *restrict b, size_t cols)
{
    for (size_t c = 0; c < cols; c++) {
        float v = row[c] + b[c];
        row[c] = v > 0.0f ? v : 0.0f;
    }
}

static KEEL__HOT void
bias_row(float *restrict row, const float *restrict b, size_t cols)
{
    for (size_t c = 0; c < cols; c++)
        row[c] += b[c];
}

void
keel__bias_act_forward(keel_activation a, float *y, size_t rows, size_t cols,
                       const float *b)
{
    keel__bias_act_forward_ld(a, y, rows, cols, cols, b);
}

void
keel__bias_act_forward_ld(keel_activation a, float *y, size_t rows,
                          size_t cols, size_t ld, const float *b)
{
    KEEL__PROF_BEGIN();
    for (size_t r = 0; r < rows; r++) {
        float *row = y + r * ld;
        if (a == KEEL_ACT_RELU) {
            bias_relu_row(row, b, cols);
        } else if (a == KEEL_ACT_TANH) {
            for (size_t c = 0; c < cols; c++)
                row[c] = tanhf(row[c] + b[c]);
        } else {
            bias_row(row, b, cols);
        }
    }
    KEEL__PROF_END(elementwise_ns);
}

static KEEL__HOT void
add_row(float *restrict acc, const float *restrict row, size_t cols)
{
    for (size_t c = 0; c < cols; c++)
        acc[c] += row[c];
}

/* db = column sums of dy, rows ld floats apart, each summed in row order. */
static void
col_sums_set(const float *dy, size_t rows, size_t cols, size_t ld, float *db)
{
    KEEL__PROF_BEGIN();
    memset(db, 0, cols * sizeof *db);
    for (size_t r = 0; r < rows; r++)
        add_row(db, dy + r * ld, cols);
    KEEL__PROF_END(elementwise_ns);
}

void
keel__col_sums(const float *dy, size_t rows, size_t cols, float *db)
{
    col_sums_set(dy, rows, cols, cols, db);
}

/* db += column sums of dy, the sums formed first (same bits as col_sums
 * into a zeroed buffer followed by add_into). Rows ld floats apart. */
static void
col_sums_add(const float *dy, size_t rows, size_t cols, size_t ld, float *db)
{
    KEEL__PROF_BEGIN();
    float tmp[256];
    for (size_t c0 = 0; c0 < cols; c0 += 256) {
        size_t cb = cols - c0 < 256 ? cols - c0 : 256;
        memset(tmp, 0, cb * sizeof *tmp);
        for (size_t r = 0; r < rows; r++)
            add_row(tmp, dy + r * ld + c0, cb);
        add_row(db + c0, tmp, cb);
    }
    KEEL__PROF_END(elementwise_ns);
}

/* ---- dense -------------------------------------------------------------- */

void
keel__dense_forward(const float *x, size_t n, size_t in, size_t out,
                    const float *w, const float *b, float *y)
{
    keel__sgemm(0, 0, n, out, in, 1.0f, x, in, w, out, 0.0f, y, out);
    if (b != NULL)
        keel__bias_act_forward(KEEL_ACT_NONE, y, n, out, b);
}

void
keel__dense_backward(const float *x, const float *dy, size_t n, size_t in,
                     size_t out, const float *w, float *dw, float *db,
                     float *dx, int accumulate)
{
    keel__sgemm(1, 0, in, out, n, 1.0f, x, in, dy, out,
                accumulate ? 1.0f : 0.0f, dw, out);
    if (db != NULL && accumulate)
        col_sums_add(dy, n, out, out, db);
    else if (db != NULL)
        keel__col_sums(dy, n, out, db);
    if (dx != NULL)
        keel__sgemm(0, 1, n, in, out, 1.0f, dy, out, w, out, 0.0f, dx, in);
}

void
keel__dense_forward_cols(const float *x, size_t n, size_t in, size_t out,
                         const float *w, float *y, size_t c0, size_t c1)
{
    keel__sgemm(0, 0, n, c1 - c0, in, 1.0f, x, in, w + c0, out, 0.0f,
                y + c0, out);
}

void
keel__dense_backward_cols(const float *x, const float *dy, size_t n,
                          size_t in, size_t out, float *dw, float *db,
                          size_t c0, size_t c1, int accumulate)
{
    keel__sgemm(1, 0, in, c1 - c0, n, 1.0f, x, in, dy + c0, out,
                accumulate ? 1.0f : 0.0f, dw + c0, out);
    if (accumulate)
        col_sums_add(dy + c0, n, c1 - c0, out, db + c0);
    else
        col_sums_set(dy + c0, n, c1 - c0, out, db + c0);
}

void
keel__dense_dx_cols(const float *dy, size_t n, size_t in, size_t out,
                    const float *w, float *dx, size_t k0, size_t k1)
{
    keel__sgemm(0, 1, n, k1 - k0, out, 1.0f, dy, out, w + k0 * out, out,
                0.0f, dx + k0, in);
}

void
keel__act_backward_ld(keel_activation a, const float *y, float *dy,
                      size_t rows, size_t cols, size_t ld)
{
    KEEL__PROF_BEGIN();
    for (size_t r = 0; r < rows; r++) {
        if (a == KEEL_ACT_RELU)
            relu_grad(y + r * ld, dy + r * ld, cols);
        else if (a == KEEL_ACT_TANH)
            tanh_grad(y + r * ld, dy + r * ld, cols);
    }
    KEEL__PROF_END(elementwise_ns);
}

/* ---- conv2d ------------------------------------------------------------- */

keel_status
keel__conv_geom_init(keel__conv_geom *g, int same)
{
    if (g->h == 0 || g->w == 0 || g->cin == 0 || g->kh == 0 || g->kw == 0 ||
        g->cout == 0 || g->sh == 0 || g->sw == 0)
        return keel__fail(KEEL_EINVAL, "conv2d: zero dimension");
    if (same) {
        size_t ph, pw;
        g->oh = (g->h + g->sh - 1) / g->sh;
        g->ow = (g->w + g->sw - 1) / g->sw;
        ph = (g->oh - 1) * g->sh + g->kh;
        pw = (g->ow - 1) * g->sw + g->kw;
        ph = ph > g->h ? ph - g->h : 0;
        pw = pw > g->w ? pw - g->w : 0;
        g->pad_top = ph / 2;         /* TF: the extra row goes bottom/right */
        g->pad_left = pw / 2;
    } else {
        if (g->kh > g->h || g->kw > g->w)
            return keel__fail(KEEL_EINVAL,
                              "conv2d: kernel %zux%zu larger than input "
                              "%zux%zu with valid padding",
                              g->kh, g->kw, g->h, g->w);
        g->oh = (g->h - g->kh) / g->sh + 1;
        g->ow = (g->w - g->kw) / g->sw + 1;
        g->pad_top = g->pad_left = 0;
    }
    return KEEL_OK;
}

/* im2col runs over chunks of examples whose columns fit in a core's L2
 * (sgemm then streams them from cache, not memory). The size is a
 * constant, never read from the CPU: the dW sums run chunk by chunk, and
 * their order depends on the chunking alone, never on the cache sizes. */
size_t keel__conv_chunk_bytes = 1024 * 1024;

static size_t
col_per_example(const keel__conv_geom *g)
{
    return g->oh * g->ow * g->kh * g->kw * g->cin;
}

static size_t
conv_chunk(const keel__conv_geom *g)
{
    size_t c = keel__conv_chunk_bytes / (col_per_example(g) * sizeof(float));
    return c > 0 ? c : 1;
}

size_t
keel__conv_col_size(const keel__conv_geom *g, size_t n)
{
    size_t c = conv_chunk(g);
    return (n < c ? n : c) * col_per_example(g);
}

static KEEL__HOT void
copy_floats(float *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = src[i];
}

static KEEL__HOT void
add_floats(float *restrict dst, const float *restrict src, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] += src[i];
}

/* 1 if every window lies inside the input (no padding anywhere). */
static int
inside(const keel__conv_geom *g)
{
    return g->pad_top == 0 && g->pad_left == 0 &&
           (g->oh - 1) * g->sh + g->kh <= g->h &&
           (g->ow - 1) * g->sw + g->kw <= g->w;
}

static void
im2col(const keel__conv_geom *g, const float *x, size_t n, float *col)
{
    KEEL__PROF_BEGIN();
    size_t krow = g->kw * g->cin;
    if (inside(g)) {
        /* valid padding: every window row is krow contiguous floats */
        for (size_t e = 0; e < n; e++) {
            const float *xe = x + e * g->h * g->w * g->cin;
            for (size_t oy = 0; oy < g->oh; oy++)
                for (size_t ox = 0; ox < g->ow; ox++) {
                    const float *src =
                        xe + (oy * g->sh * g->w + ox * g->sw) * g->cin;
                    for (size_t ky = 0; ky < g->kh; ky++)
                        copy_floats(col + ky * krow,
                                    src + ky * g->w * g->cin, krow);
                    col += g->kh * krow;
                }
        }
        KEEL__PROF_END(im2col_ns);
        return;
    }
    for (size_t e = 0; e < n; e++) {
        const float *xe = x + e * g->h * g->w * g->cin;
        for (size_t oy = 0; oy < g->oh; oy++) {
            for (size_t ox = 0; ox < g->ow; ox++) {
                long iy0 = (long)(oy * g->sh) - (long)g->pad_top;
                long ix0 = (long)(ox * g->sw) - (long)g->pad_left;
                for (size_t ky = 0; ky < g->kh; ky++) {
                    long iy = iy0 + (long)ky;
                    float *dst = col + ky * krow;
                    if (iy < 0 || iy >= (long)g->h) {
                        memset(dst, 0, krow * sizeof *dst);
                        continue;
                    }
                    if (ix0 >= 0 && ix0 + (long)g->kw <= (long)g->w) {
                        memcpy(dst, xe + ((size_t)iy * g->w + (size_t)ix0) *
                                             g->cin,
                               krow * sizeof *dst);
                        continue;
                    }
                    for (size_t kx = 0; kx < g->kw; kx++) {
                        long ix = ix0 + (long)kx;
                        if (ix < 0 || ix >= (long)g->w)
                            memset(dst + kx * g->cin, 0,
                                   g->cin * sizeof *dst);
                        else
                            memcpy(dst + kx * g->cin,
                                   xe + ((size_t)iy * g->w + (size_t)ix) *
                                            g->cin,
                                   g->cin * sizeof *dst);
                    }
                }
                col += g->kh * krow;
            }
        }
    }
    KEEL__PROF_END(im2col_ns);
}

static void
col2im(const keel__conv_geom *g, const float *col, size_t n, float *dx)
{
    KEEL__PROF_BEGIN();
    size_t krow = g->kw * g->cin;
    memset(dx, 0, n * g->h * g->w * g->cin * sizeof *dx);
    if (inside(g)) {
        for (size_t e = 0; e < n; e++) {
            float *xe = dx + e * g->h * g->w * g->cin;
            for (size_t oy = 0; oy < g->oh; oy++)
                for (size_t ox = 0; ox < g->ow; ox++) {
                    float *dst =
                        xe + (oy * g->sh * g->w + ox * g->sw) * g->cin;
                    for (size_t ky = 0; ky < g->kh; ky++)
                        add_floats(dst + ky * g->w * g->cin,
                                   col + ky * krow, krow);
                    col += g->kh * krow;
                }
        }
        KEEL__PROF_END(im2col_ns);
        return;
    }
    for (size_t e = 0; e < n; e++) {
        float *xe = dx + e * g->h * g->w * g->cin;
        for (size_t oy = 0; oy < g->oh; oy++) {
            for (size_t ox = 0; ox < g->ow; ox++) {
                long iy0 = (long)(oy * g->sh) - (long)g->pad_top;
                long ix0 = (long)(ox * g->sw) - (long)g->pad_left;
                for (size_t ky = 0; ky < g->kh; ky++) {
                    long iy = iy0 + (long)ky;
                    for (size_t kx = 0; kx < g->kw; kx++) {
                        long ix = ix0 + (long)kx;
                        const float *src = col + (ky * g->kw + kx) * g->cin;
                        float *d;
                        if (iy < 0 || iy >= (long)g->h || ix < 0 ||
                            ix >= (long)g->w)
                            continue;
                        d = xe + ((size_t)iy * g->w + (size_t)ix) * g->cin;
                        for (size_t c = 0; c < g->cin; c++)
                            d[c] += src[c];
                    }
                }
                col += g->kh * g->kw * g->cin;
            }
        }
    }
    KEEL__PROF_END(im2col_ns);
}

/* ---- direct convolution for one input channel ----
 * With cin == 1 the im2col matrix has K = kh*kw (9 for 3x3) columns: sgemm
 * then spends its time packing, not multiplying. These kernels read the
 * input in place and keep a 16-channel block of outputs (forward) or of
 * kernel gradients (dW) in registers, in a fixed summation order. */
#define DC_CB 16              /* output channels per register block */
#define DC_KMAX 64            /* largest kh*kw handled directly */

int keel__conv_direct = KEEL__DC_AUTO;

static int
direct_ok(const keel__conv_geom *g)
{
    return keel__conv_direct != KEEL__DC_OFF && g->cin == 1 && inside(g) &&
           g->kh * g->kw <= DC_KMAX;
}

/* y[p, c0..c0+cb) for every output pixel p of one example. */
static KEEL__HOT void
dconv_fwd_block(const keel__conv_geom *g, const float *restrict xe,
                const float *restrict w, size_t c0, size_t cb,
                float *restrict ye)
{
    size_t K = g->kh * g->kw, cout = g->cout;
    size_t off[DC_KMAX];
    float wk[DC_KMAX][DC_CB];
    for (size_t ky = 0; ky < g->kh; ky++)
        for (size_t kx = 0; kx < g->kw; kx++)
            off[ky * g->kw + kx] = ky * g->w + kx;
    for (size_t k = 0; k < K; k++)
        for (size_t c = 0; c < DC_CB; c++)
            wk[k][c] = c < cb ? w[k * cout + c0 + c] : 0.0f;
    for (size_t oy = 0; oy < g->oh; oy++) {
        for (size_t ox = 0; ox < g->ow; ox++) {
            const float *src = xe + oy * g->sh * g->w + ox * g->sw;
            float *dst = ye + (oy * g->ow + ox) * cout + c0;
            float acc[DC_CB];
            for (size_t c = 0; c < DC_CB; c++)
                acc[c] = 0.0f;
            for (size_t k = 0; k < K; k++) {
                float v = src[off[k]];
                for (size_t c = 0; c < DC_CB; c++)
                    acc[c] += v * wk[k][c];
            }
            if (cb == DC_CB)
                for (size_t c = 0; c < DC_CB; c++)
                    dst[c] = acc[c];
            else
                for (size_t c = 0; c < cb; c++)
                    dst[c] = acc[c];
        }
    }
}

/* acc[k, 0..cb) += sum over one example's pixels p of x(p, k) dy[p, c0+c],
 * pixels in row-major order. */
static KEEL__HOT void
dconv_dw_block(const keel__conv_geom *g, const float *restrict xe,
               const float *restrict dye, size_t c0, size_t cb,
               float (*restrict acc)[DC_CB])
{
    size_t K = g->kh * g->kw, cout = g->cout;
    size_t off[DC_KMAX];
    for (size_t ky = 0; ky < g->kh; ky++)
        for (size_t kx = 0; kx < g->kw; kx++)
            off[ky * g->kw + kx] = ky * g->w + kx;
    for (size_t oy = 0; oy < g->oh; oy++) {
        for (size_t ox = 0; ox < g->ow; ox++) {
            const float *src = xe + oy * g->sh * g->w + ox * g->sw;
            const float *d = dye + (oy * g->ow + ox) * cout + c0;
            float dv[DC_CB];
            if (cb == DC_CB)
                for (size_t c = 0; c < DC_CB; c++)
                    dv[c] = d[c];
            else
                for (size_t c = 0; c < DC_CB; c++)
                    dv[c] = c < cb ? d[c] : 0.0f;
            for (size_t k = 0; k < K; k++) {
                float v = src[off[k]];
                for (size_t c = 0; c < DC_CB; c++)
                    acc[k][c] += v * dv[c];
            }
        }
    }
}

/* The 3x3 kernels with full 16-channel blocks, in AVX-512 and AVX2
 * intrinsics: the 9x16 weights (forward) or gradient sums (dW) stay in
 * registers. Multiply then add (no FMA), in the generic blocks' order, so
 * every path computes the same bits (the tests force each one). */
#if defined(__GNUC__) && defined(__x86_64__) && !defined(KEEL_NO_CLONES)
#define DC_X86 1

__attribute__((target("avx512f"))) static void
dconv_fwd_33_avx512(const keel__conv_geom *g, const float *xe,
                    const float *w, size_t c0, float *ye)
{
    size_t cout = g->cout, W = g->w;
    __m512 wk[9];
    for (size_t k = 0; k < 9; k++)
        wk[k] = _mm512_loadu_ps(w + k * cout + c0);
    for (size_t oy = 0; oy < g->oh; oy++) {
        const float *row = xe + oy * g->sh * W;
        float *dst = ye + oy * g->ow * cout + c0;
        for (size_t ox = 0; ox < g->ow; ox++) {
            const float *src = row + ox * g->sw;
            __m512 acc = _mm512_setzero_ps();
            for (size_t ky = 0; ky < 3; ky++)
                for (size_t kx = 0; kx < 3; kx++)
                    acc = _mm512_add_ps(acc, _mm512_mul_ps(
                        _mm512_set1_ps(src[ky * W + kx]), wk[ky * 3 + kx]));
            _mm512_storeu_ps(dst + ox * cout, acc);
        }
    }
}

__attribute__((target("avx512f"))) static void
dconv_dw_33_avx512(const keel__conv_geom *g, const float *xe,
                   const float *dye, size_t c0, float (*sum)[DC_CB])
{
    size_t cout = g->cout, W = g->w;
    __m512 acc[9];
    for (size_t k = 0; k < 9; k++)
        acc[k] = _mm512_loadu_ps(sum[k]);
    for (size_t oy = 0; oy < g->oh; oy++) {
        const float *row = xe + oy * g->sh * W;
        const float *d = dye + oy * g->ow * cout + c0;
        for (size_t ox = 0; ox < g->ow; ox++) {
            const float *src = row + ox * g->sw;
            __m512 dv = _mm512_loadu_ps(d + ox * cout);
            for (size_t ky = 0; ky < 3; ky++)
                for (size_t kx = 0; kx < 3; kx++)
                    acc[ky * 3 + kx] = _mm512_add_ps(acc[ky * 3 + kx],
                        _mm512_mul_ps(_mm512_set1_ps(src[ky * W + kx]), dv));
        }
    }
    for (size_t k = 0; k < 9; k++)
        _mm512_storeu_ps(sum[k], acc[k]);
}

/* AVX2: one 8-channel half of the block at a time (9 + 1 registers). */
__attribute__((target("avx2"))) static void
dconv_fwd_33_avx2(const keel__conv_geom *g, const float *xe,
                  const float *w, size_t c0, float *ye)
{
    size_t cout = g->cout, W = g->w;
    for (size_t h = 0; h < DC_CB; h += 8) {
        __m256 wk[9];
        for (size_t k = 0; k < 9; k++)
            wk[k] = _mm256_loadu_ps(w + k * cout + c0 + h);
        for (size_t oy = 0; oy < g->oh; oy++) {
            const float *row = xe + oy * g->sh * W;
            float *dst = ye + oy * g->ow * cout + c0 + h;
            for (size_t ox = 0; ox < g->ow; ox++) {
                const float *src = row + ox * g->sw;
                __m256 acc = _mm256_setzero_ps();
                for (size_t ky = 0; ky < 3; ky++)
                    for (size_t kx = 0; kx < 3; kx++)
                        acc = _mm256_add_ps(acc, _mm256_mul_ps(
                            _mm256_set1_ps(src[ky * W + kx]),
                            wk[ky * 3 + kx]));
                _mm256_storeu_ps(dst + ox * cout, acc);
            }
        }
    }
}

__attribute__((target("avx2"))) static void
dconv_dw_33_avx2(const keel__conv_geom *g, const float *xe,
                 const float *dye, size_t c0, float (*sum)[DC_CB])
{
    size_t cout = g->cout, W = g->w;
    for (size_t h = 0; h < DC_CB; h += 8) {
        __m256 acc[9];
        for (size_t k = 0; k < 9; k++)
            acc[k] = _mm256_loadu_ps(sum[k] + h);
        for (size_t oy = 0; oy < g->oh; oy++) {
            const float *row = xe + oy * g->sh * W;
            const float *d = dye + oy * g->ow * cout + c0 + h;
            for (size_t ox = 0; ox < g->ow; ox++) {
                const float *src = row + ox * g->sw;
                __m256 dv = _mm256_loadu_ps(d + ox * cout);
                for (size_t ky = 0; ky < 3; ky++)
                    for (size_t kx = 0; kx < 3; kx++)
                        acc[ky * 3 + kx] = _mm256_add_ps(acc[ky * 3 + kx],
                            _mm256_mul_ps(_mm256_set1_ps(src[ky * W + kx]),
                                          dv));
            }
        }
        for (size_t k = 0; k < 9; k++)
            _mm256_storeu_ps(sum[k] + h, acc[k]);
    }
}
#endif

/* The path the 3x3 kernels take: KEEL__DC_* (forced) or the best one this
 * CPU supports. */
static int
dc_path(void)
{
    int p = keel__conv_direct;
    if (p != KEEL__DC_AUTO)
        return p;
#ifdef DC_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f"))
        return KEEL__DC_AVX512;
    if (__builtin_cpu_supports("avx2"))
        return KEEL__DC_AVX2;
#endif
    return KEEL__DC_GENERIC;
}

int
keel__conv_direct_path_supported(int path)
{
    switch (path) {
    case KEEL__DC_OFF:
    case KEEL__DC_AUTO:
    case KEEL__DC_GENERIC:
        return 1;
#ifdef DC_X86
    case KEEL__DC_AVX2:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2");
    case KEEL__DC_AVX512:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f");
#endif
    default:
        return 0;
    }
}

static void
dconv_fwd_33_generic(const keel__conv_geom *g, const float *xe,
                     const float *w, size_t c0, float *ye)
{
    dconv_fwd_block(g, xe, w, c0, DC_CB, ye);
}

static void
dconv_dw_33_generic(const keel__conv_geom *g, const float *xe,
                    const float *dye, size_t c0, float (*sum)[DC_CB])
{
    dconv_dw_block(g, xe, dye, c0, DC_CB, sum);
}

/* The 3x3 kernels of one path, each on a full DC_CB-channel block of one
 * example. */
typedef struct dc_kernels {
    void (*fwd)(const keel__conv_geom *g, const float *xe, const float *w,
                size_t c0, float *ye);
    void (*dw)(const keel__conv_geom *g, const float *xe, const float *dye,
               size_t c0, float (*sum)[DC_CB]);
} dc_kernels;

/* The 3x3 kernels of the path dc_path() picks. */
static const dc_kernels *
dc_kernels_33(void)
{
    static const dc_kernels generic = { dconv_fwd_33_generic,
                                        dconv_dw_33_generic };
#ifdef DC_X86
    static const dc_kernels avx2 = { dconv_fwd_33_avx2, dconv_dw_33_avx2 };
    static const dc_kernels avx512 = { dconv_fwd_33_avx512,
                                       dconv_dw_33_avx512 };
    int path = dc_path();
    if (path == KEEL__DC_AVX512)
        return &avx512;
    if (path == KEEL__DC_AVX2)
        return &avx2;
#endif
    return &generic;
}

static int
is33(const keel__conv_geom *g, size_t cb)
{
    return g->kh == 3 && g->kw == 3 && cb == DC_CB;
}

static void
dconv_forward(const keel__conv_geom *g, const float *x, size_t n,
              const float *w, float *y)
{
    KEEL__PROF_BEGIN();
    size_t xs = g->h * g->w, ys = g->oh * g->ow * g->cout;
    const dc_kernels *k33 = dc_kernels_33();
    for (size_t e = 0; e < n; e++)
        for (size_t c0 = 0; c0 < g->cout; c0 += DC_CB) {
            size_t cb = g->cout - c0 < DC_CB ? g->cout - c0 : DC_CB;
            if (is33(g, cb))
                k33->fwd(g, x + e * xs, w, c0, y + e * ys);
            else
                dconv_fwd_block(g, x + e * xs, w, c0, cb, y + e * ys);
        }
    KEEL__PROF_END(conv_direct_ns);
}

static void
dconv_dw(const keel__conv_geom *g, const float *x, size_t n,
         const float *dy, float *dw)
{
    KEEL__PROF_BEGIN();
    size_t K = g->kh * g->kw, xs = g->h * g->w;
    size_t ys = g->oh * g->ow * g->cout;
    float acc[DC_KMAX][DC_CB];
    const dc_kernels *k33 = dc_kernels_33();
    for (size_t c0 = 0; c0 < g->cout; c0 += DC_CB) {
        size_t cb = g->cout - c0 < DC_CB ? g->cout - c0 : DC_CB;
        memset(acc, 0, sizeof acc);
        for (size_t e = 0; e < n; e++) {
            if (is33(g, cb))
                k33->dw(g, x + e * xs, dy + e * ys, c0, acc);
            else
                dconv_dw_block(g, x + e * xs, dy + e * ys, c0, cb, acc);
        }
        for (size_t k = 0; k < K; k++)
            memcpy(dw + k * g->cout + c0, acc[k], cb * sizeof *dw);
    }
    KEEL__PROF_END(conv_direct_ns);
}

void
keel__conv_forward(const keel__conv_geom *g, const float *x, size_t n,
                   const float *w, const float *b, float *col, float *y)
{
    size_t m = n * g->oh * g->ow, k = g->kh * g->kw * g->cin;
    if (direct_ok(g)) {
        dconv_forward(g, x, n, w, y);
        if (b != NULL)
            keel__bias_act_forward(KEEL_ACT_NONE, y, m, g->cout, b);
        return;
    }
    for (size_t e = 0, c = conv_chunk(g); e < n; e += c) {
        size_t ne = n - e < c ? n - e : c, pe = g->oh * g->ow;
        im2col(g, x + e * g->h * g->w * g->cin, ne, col);
        keel__sgemm(0, 0, ne * pe, g->cout, k, 1.0f, col, k, w, g->cout,
                    0.0f, y + e * pe * g->cout, g->cout);
    }
    if (b != NULL)
        keel__bias_act_forward(KEEL_ACT_NONE, y, m, g->cout, b);
}

/* dw NULL: no kernel gradient (x is then not read), only db and dx. */
void
keel__conv_backward(const keel__conv_geom *g, const float *x, size_t n,
                    const float *dy, const float *w, float *col,
                    int col_is_valid, float *dw, float *db, float *dx)
{
    size_t m = n * g->oh * g->ow, k = g->kh * g->kw * g->cin;
    size_t c = conv_chunk(g), pe = g->oh * g->ow;
    size_t xs = g->h * g->w * g->cin;
    if (db != NULL)
        keel__col_sums(dy, m, g->cout, db);
    if (dw != NULL && direct_ok(g)) {
        dconv_dw(g, x, n, dy, dw);     /* col is only dx's workspace */
    }
    /* per chunk: dW += col^T dy (beta 0 on the first), then dcol = dy W^T
     * into the col workspace and its scatter-add into dx */
    for (size_t e = 0; e < n; e += c) {
        size_t ne = n - e < c ? n - e : c;
        const float *dye = dy + e * pe * g->cout;
        if (dw != NULL && !direct_ok(g)) {
            if (!col_is_valid || n > c)
                im2col(g, x + e * xs, ne, col);
            keel__sgemm(1, 0, k, g->cout, ne * pe, 1.0f, col, k, dye,
                        g->cout, e == 0 ? 0.0f : 1.0f, dw, g->cout);
        }
        if (dx != NULL) {
            keel__sgemm(0, 1, ne * pe, k, g->cout, 1.0f, dye, g->cout, w,
                        g->cout, 0.0f, col, k);
            col2im(g, col, ne, dx + e * xs);
        }
    }
}

/* ---- K-FAC second moments ------------------------------------------------- */

void
keel__cov_add(const float *x, size_t rows, size_t d, size_t ldx, int homog,
              int accumulate, float *c)
{
    size_t ld = d + (homog ? 1 : 0);
    float *restrict s;
    KEEL__PROF_BEGIN();
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, (blasint)d,
                (blasint)rows, 1.0f, x, (blasint)ldx,
                accumulate ? 1.0f : 0.0f, c, (blasint)ld);
    KEEL__PROF_END(gemm_ns);
    if (!homog)
        return;
    /* the column sums (column d) are formed in row d's part below the
     * diagonal, contiguous and outside the upper triangle, then copied up;
     * each sum is added in row order either way */
    s = c + d * ld;
    for (size_t i = 0; i < d; i++)
        s[i] = accumulate ? c[i * ld + d] : 0.0f;
    if (!accumulate)
        c[d * ld + d] = 0.0f;
    for (size_t r = 0; r < rows; r++) {
        const float *restrict xr = x + r * ldx;
        for (size_t i = 0; i < d; i++)
            s[i] += xr[i];
    }
    for (size_t i = 0; i < d; i++)
        c[i * ld + d] = s[i];
    c[d * ld + d] += (float)rows;
}

void
keel__conv_patch_cov(const keel__conv_geom *g, const float *x, size_t n,
                     float *col, int homog, int accumulate, float *c)
{
    size_t k = g->kh * g->kw * g->cin, ch = conv_chunk(g);
    size_t xs = g->h * g->w * g->cin, pe = g->oh * g->ow;
    for (size_t e = 0; e < n; e += ch) {
        size_t ne = n - e < ch ? n - e : ch;
        im2col(g, x + e * xs, ne, col);
        keel__cov_add(col, ne * pe, k, k, homog, accumulate || e > 0, c);
    }
}

void
keel__conv_backward_dx(const keel__conv_geom *g, size_t n, const float *dy,
                       const float *w, float *col, float *dx)
{
    keel__conv_backward(g, NULL, n, dy, w, col, 0, NULL, NULL, dx);
}

/* ---- max-pool ----------------------------------------------------------- */

keel_status
keel__pool_geom_init(keel__pool_geom *g)
{
    if (g->h == 0 || g->w == 0 || g->c == 0 || g->k == 0 || g->s == 0)
        return keel__fail(KEEL_EINVAL, "max-pool: zero dimension");
    if (g->k > g->h || g->k > g->w)
        return keel__fail(KEEL_EINVAL, "max-pool: window %zu larger than "
                          "input %zux%zu", g->k, g->h, g->w);
    g->oh = (g->h - g->k) / g->s + 1;
    g->ow = (g->w - g->k) / g->s + 1;
    return KEEL_OK;
}

/* 2x2 window, one output pixel, all channels: branch-free max and index
 * (ties keep the earliest position, in row-major window order). */
static KEEL__HOT void
pool2_pixel(const float *restrict p00, size_t c, size_t rowstride,
            int32_t first, float *restrict y, int32_t *restrict arg)
{
    const float *p01 = p00 + c, *p10 = p00 + rowstride;
    const float *p11 = p10 + c;
    int32_t o01 = (int32_t)c, o10 = (int32_t)rowstride;
    int32_t o11 = (int32_t)(rowstride + c);
    for (size_t ch = 0; ch < c; ch++) {
        float m = p00[ch], v;
        int32_t a = 0;
        v = p01[ch];
        a = v > m ? o01 : a;
        m = v > m ? v : m;
        v = p10[ch];
        a = v > m ? o10 : a;
        m = v > m ? v : m;
        v = p11[ch];
        a = v > m ? o11 : a;
        m = v > m ? v : m;
        y[ch] = m;
        arg[ch] = first + (int32_t)ch + a;
    }
}

void
keel__pool_forward(const keel__pool_geom *g, const float *x, size_t n,
                   float *y, int32_t *arg)
{
    KEEL__PROF_BEGIN();
    size_t c = g->c;
    if (g->k == 2 && g->s == 2) {
        for (size_t e = 0; e < n; e++) {
            size_t xbase = e * g->h * g->w * c;
            for (size_t oy = 0; oy < g->oh; oy++)
                for (size_t ox = 0; ox < g->ow; ox++) {
                    size_t first = xbase + (oy * 2 * g->w + ox * 2) * c;
                    pool2_pixel(x + first, c, g->w * c, (int32_t)first, y,
                                arg);
                    y += c;
                    arg += c;
                }
        }
        KEEL__PROF_END(elementwise_ns);
        return;
    }
    for (size_t e = 0; e < n; e++) {
        size_t xbase = e * g->h * g->w * c;
        for (size_t oy = 0; oy < g->oh; oy++) {
            for (size_t ox = 0; ox < g->ow; ox++) {
                size_t first = xbase + (oy * g->s * g->w + ox * g->s) * c;
                /* first window element, then the others (ties keep the
                 * earliest, like TF and PyTorch) */
                for (size_t ch = 0; ch < c; ch++) {
                    y[ch] = x[first + ch];
                    arg[ch] = (int32_t)(first + ch);
                }
                for (size_t ky = 0; ky < g->k; ky++) {
                    for (size_t kx = 0; kx < g->k; kx++) {
                        size_t base;
                        if (ky == 0 && kx == 0)
                            continue;
                        base = xbase + ((oy * g->s + ky) * g->w +
                                        ox * g->s + kx) * c;
                        for (size_t ch = 0; ch < c; ch++) {
                            float v = x[base + ch];
                            if (v > y[ch]) {
                                y[ch] = v;
                                arg[ch] = (int32_t)(base + ch);
                            }
                        }
                    }
                }
                y += c;
                arg += c;
            }
        }
    }
    KEEL__PROF_END(elementwise_ns);
}

/* 2x2 stride 2: the windows tile the input, so every covered input is
 * written once (its window's gradient or 0) instead of zero + scatter; the
 * uncovered last row / column (odd sizes) is zeroed. */
static KEEL__HOT void
pool2_back_pixel(const float *restrict dy, const int32_t *restrict arg,
                 size_t c, size_t rowstride, int32_t first,
                 float *restrict p00)
{
    float *p01 = p00 + c, *p10 = p00 + rowstride, *p11 = p10 + c;
    int32_t o01 = (int32_t)c, o10 = (int32_t)rowstride;
    int32_t o11 = (int32_t)(rowstride + c);
    for (size_t ch = 0; ch < c; ch++) {
        int32_t a = arg[ch] - first - (int32_t)ch;
        float d = dy[ch];
        p00[ch] = a == 0 ? d : 0.0f;
        p01[ch] = a == o01 ? d : 0.0f;
        p10[ch] = a == o10 ? d : 0.0f;
        p11[ch] = a == o11 ? d : 0.0f;
    }
}

static void
pool2_backward(const keel__pool_geom *g, const float *dy, size_t n,
               const int32_t *arg, float *dx)
{
    size_t c = g->c, rs = g->w * c;
    for (size_t e = 0; e < n; e++) {
        size_t xbase = e * g->h * g->w * c;
        float *xe = dx + xbase;
        for (size_t oy = 0; oy < g->oh; oy++) {
            for (size_t ox = 0; ox < g->ow; ox++) {
                size_t first = xbase + (oy * 2 * g->w + ox * 2) * c;
                pool2_back_pixel(dy, arg, c, rs, (int32_t)first,
                                 dx + first);
                dy += c;
                arg += c;
            }
            if (g->w > 2 * g->ow) {
                memset(xe + (oy * 2) * rs + 2 * g->ow * c, 0,
                       (g->w - 2 * g->ow) * c * sizeof *dx);
                memset(xe + (oy * 2 + 1) * rs + 2 * g->ow * c, 0,
                       (g->w - 2 * g->ow) * c * sizeof *dx);
            }
        }
        if (g->h > 2 * g->oh)
            memset(xe + 2 * g->oh * rs, 0,
                   (g->h - 2 * g->oh) * rs * sizeof *dx);
    }
}

void
keel__pool_backward(const keel__pool_geom *g, const float *dy, size_t n,
                    const int32_t *arg, float *dx)
{
    KEEL__PROF_BEGIN();
    size_t count = n * g->oh * g->ow * g->c;
    if (g->k == 2 && g->s == 2) {
        pool2_backward(g, dy, n, arg, dx);
        KEEL__PROF_END(elementwise_ns);
        return;
    }
    memset(dx, 0, n * g->h * g->w * g->c * sizeof *dx);
    for (size_t i = 0; i < count; i++)
        dx[arg[i]] += dy[i];
    KEEL__PROF_END(elementwise_ns);
}

/* ---- softmax cross-entropy ---------------------------------------------- */

void
keel__softmax_xent(const float *logits, const int32_t *y, size_t n, size_t k,
                   float scale, float *dlogits, double *loss_sum,
                   int64_t *correct)
{
    KEEL__PROF_BEGIN();
    double loss = 0.0;
    int64_t ok = 0;
    for (size_t i = 0; i < n; i++) {
        const float *z = logits + i * k;
        size_t best = 0;
        double sum = 0.0, lse;
        float mx = z[0];
        for (size_t j = 1; j < k; j++)
            if (z[j] > z[best])
                best = j;
        mx = z[best];
        for (size_t j = 0; j < k; j++)
            sum += exp((double)z[j] - (double)mx);
        lse = (double)mx + log(sum);
        loss += lse - (double)z[y[i]];
        if ((int32_t)best == y[i])
            ok++;
        if (dlogits != NULL) {
            float *d = dlogits + i * k;
            for (size_t j = 0; j < k; j++) {
                double p = exp((double)z[j] - lse);
                d[j] = (float)(p - (j == (size_t)y[i] ? 1.0 : 0.0)) * scale;
            }
        }
    }
    *loss_sum = loss;
    *correct = ok;
    KEEL__PROF_END(elementwise_ns);
}
