/* winograd.c - 3x3 stride-1 convolutions as Winograd F(2x2, 3x3): the
 * forward pass and the input gradient of a convolution with at least
 * KEEL__WINO_MIN_CIN input channels (layers.c picks this path by shape
 * alone). Each 4x4 input tile and each 3x3 kernel is transformed (B^T d B,
 * G g G^T), the 16 transformed positions are 16 sgemms of
 * [tiles, ci] x [ci, co], and each 4x4 result is transformed back to a 2x2
 * output tile (A^T m A). The transforms are adds, subtracts and halvings in
 * a fixed order (no FMA contraction, so every clone gives the same bits);
 * tiles are chunked by a size fixed by the shape, never by the CPU or the
 * thread count. The input gradient is the same computation on dy padded by
 * two minus the forward padding, with the kernel rotated by 180 degrees and
 * its channel axes swapped. */
#include <config.h>

#include <string.h>

#include <cblas.h>

#include "util.h"
#include "train_int.h"

KEEL__VECTORIZE_FILE

int keel__conv_winograd = 1;

/* A valid correlation of an ih x iw x ci input (zero outside, out pixel
 * (y, x) reading input rows y - pt .. y - pt + 2) into oh x ow x co. */
typedef struct wshape {
    size_t ih, iw, ci, oh, ow, co;
    long pt, pl;
} wshape;

static wshape
fwd_shape(const keel__conv_geom *g)
{
    return (wshape){ g->h, g->w, g->cin, g->oh, g->ow, g->cout,
                     (long)g->pad_top, (long)g->pad_left };
}

static wshape
dx_shape(const keel__conv_geom *g)
{
    return (wshape){ g->oh, g->ow, g->cout, g->h, g->w, g->cin,
                     2 - (long)g->pad_top, 2 - (long)g->pad_left };
}

static size_t
tiles_per_example(const wshape *s)
{
    return ((s->oh + 1) / 2) * ((s->ow + 1) / 2);
}

static size_t
round16(size_t n)
{
    return (n + 15) & ~(size_t)15;
}

/* Examples per chunk: their transformed inputs and outputs fit in
 * WINO_CHUNK_BYTES (at least one example), a constant: the chunks depend
 * on the shape alone. */
#define WINO_CHUNK_BYTES (1024 * 1024)
static size_t
wino_chunk(const wshape *s)
{
    size_t per = tiles_per_example(s) * 16 * (s->ci + s->co) * sizeof(float);
    size_t c = WINO_CHUNK_BYTES / per;
    return c > 0 ? c : 1;
}

/* Floats: U, a zero row, a scratch row, then V and M of one chunk. */
static size_t
wino_size(const wshape *s, size_t n)
{
    size_t ne = wino_chunk(s), t;
    ne = n < ne ? n : ne;
    t = ne * tiles_per_example(s);
    return 16 * s->ci * s->co + round16(s->ci) + round16(s->co) +
           16 * t * (s->ci + s->co);
}

int
keel__wino_ok(const keel__conv_geom *g)
{
    return keel__conv_winograd && g->kh == 3 && g->kw == 3 && g->sh == 1 &&
           g->sw == 1 && g->cin >= KEEL__WINO_MIN_CIN && g->pad_top <= 2 &&
           g->pad_left <= 2;
}

size_t
keel__wino_size(const keel__conv_geom *g, size_t n)
{
    wshape f = fwd_shape(g), d = dx_shape(g);
    size_t a = wino_size(&f, n), b = wino_size(&d, n);
    return a > b ? a : b;
}

/* u (16 x 1, stride us) = G g G^T of one 3x3 kernel g (element (ky, kx) at
 * g[(ky * 3 + kx) * gs]). */
static void
kernel_transform(const float *g, size_t gs, float *u, size_t us)
{
    float t[4][3];
    for (int kx = 0; kx < 3; kx++) {
        float g0 = g[(0 * 3 + kx) * gs], g1 = g[(1 * 3 + kx) * gs];
        float g2 = g[(2 * 3 + kx) * gs];
        t[0][kx] = g0;
        t[1][kx] = ((g0 + g1) + g2) * 0.5f;
        t[2][kx] = ((g0 - g1) + g2) * 0.5f;
        t[3][kx] = g2;
    }
    for (int r = 0; r < 4; r++) {
        u[(r * 4 + 0) * us] = t[r][0];
        u[(r * 4 + 1) * us] = ((t[r][0] + t[r][1]) + t[r][2]) * 0.5f;
        u[(r * 4 + 2) * us] = ((t[r][0] - t[r][1]) + t[r][2]) * 0.5f;
        u[(r * 4 + 3) * us] = t[r][2];
    }
}

/* U[xi][a][b] for a in [0, ci), b in [0, co): the forward kernel w
 * [3,3,cin,cout] (a = input channel, b = output channel) or, with dx, the
 * rotated, swapped one (a = output channel, b = input channel). */
static void
weights_transform(const keel__conv_geom *g, const float *w, int dx,
                  float *U)
{
    size_t cin = g->cin, cout = g->cout;
    size_t ci = dx ? cout : cin, co = dx ? cin : cout;
    size_t us = ci * co;
    for (size_t a = 0; a < ci; a++)
        for (size_t b = 0; b < co; b++) {
            float *u = U + a * co + b;
            if (!dx) {
                kernel_transform(w + a * cout + b, cin * cout, u, us);
            } else {
                /* element (ky, kx) is w[2-ky][2-kx][b][a]: read from the
                 * far end backwards */
                float r[9];
                for (int k = 0; k < 9; k++)
                    r[k] = w[(size_t)(8 - k) * cin * cout + b * cout + a];
                kernel_transform(r, 1, u, us);
            }
        }
}

/* V[xi][t][c] = (B^T d B)[xi] for the 4x4 tile whose 16 rows of c floats
 * start at p[0..15]. */
static KEEL__HOT void
input_tile(const float *const *p, size_t c, float *v, size_t vs)
{
    for (size_t k = 0; k < c; k++) {
        float d[16], t[16];
        for (int i = 0; i < 16; i++)
            d[i] = p[i][k];
        for (int q = 0; q < 4; q++) {      /* B^T d: along rows */
            t[0 * 4 + q] = d[0 * 4 + q] - d[2 * 4 + q];
            t[1 * 4 + q] = d[1 * 4 + q] + d[2 * 4 + q];
            t[2 * 4 + q] = d[2 * 4 + q] - d[1 * 4 + q];
            t[3 * 4 + q] = d[1 * 4 + q] - d[3 * 4 + q];
        }
        for (int r = 0; r < 4; r++) {      /* (B^T d) B: along columns */
            v[(r * 4 + 0) * vs + k] = t[r * 4 + 0] - t[r * 4 + 2];
            v[(r * 4 + 1) * vs + k] = t[r * 4 + 1] + t[r * 4 + 2];
            v[(r * 4 + 2) * vs + k] = t[r * 4 + 2] - t[r * 4 + 1];
            v[(r * 4 + 3) * vs + k] = t[r * 4 + 1] - t[r * 4 + 3];
        }
    }
}

/* The 2x2 output tile A^T m A into o[0..3] (c floats each) from the 16
 * rows m + xi * ms. */
static KEEL__HOT void
output_tile(const float *m, size_t ms, size_t c, float *const *o)
{
    for (size_t k = 0; k < c; k++) {
        float d[16], t[8];
        for (int i = 0; i < 16; i++)
            d[i] = m[i * ms + k];
        for (int q = 0; q < 4; q++) {      /* A^T m */
            t[0 * 4 + q] = (d[0 * 4 + q] + d[1 * 4 + q]) + d[2 * 4 + q];
            t[1 * 4 + q] = (d[1 * 4 + q] - d[2 * 4 + q]) - d[3 * 4 + q];
        }
        for (int r = 0; r < 2; r++) {      /* (A^T m) A */
            o[r * 2 + 0][k] = (t[r * 4 + 0] + t[r * 4 + 1]) + t[r * 4 + 2];
            o[r * 2 + 1][k] = (t[r * 4 + 1] - t[r * 4 + 2]) - t[r * 4 + 3];
        }
    }
}

/* V (16 x T x ci) of examples e0 .. e0+ne of in. */
static void
inputs_transform(const wshape *s, const float *in, size_t e0, size_t ne,
                 const float *zero, float *V)
{
    size_t ci = s->ci, tw = (s->ow + 1) / 2, tpe = tiles_per_example(s);
    size_t is = s->ih * s->iw * ci, T = ne * tpe;
    for (size_t e = 0; e < ne; e++) {
        const float *xe = in + (e0 + e) * is;
        for (size_t t = 0; t < tpe; t++) {
            long y0 = (long)(2 * (t / tw)) - s->pt;
            long x0 = (long)(2 * (t % tw)) - s->pl;
            const float *p[16];
            for (int r = 0; r < 4; r++)
                for (int q = 0; q < 4; q++) {
                    long y = y0 + r, x = x0 + q;
                    p[r * 4 + q] =
                        y < 0 || x < 0 || y >= (long)s->ih || x >= (long)s->iw
                            ? zero
                            : xe + ((size_t)y * s->iw + (size_t)x) * ci;
                }
            input_tile(p, ci, V + (e * tpe + t) * ci, T * ci);
        }
    }
}

/* Examples e0 .. e0+ne of out from M (16 x T x co); the tiles' parts
 * outside the output go to scratch. */
static void
outputs_transform(const wshape *s, const float *M, size_t e0, size_t ne,
                  float *scratch, float *out)
{
    size_t co = s->co, tw = (s->ow + 1) / 2, tpe = tiles_per_example(s);
    size_t os = s->oh * s->ow * co, T = ne * tpe;
    for (size_t e = 0; e < ne; e++) {
        float *ye = out + (e0 + e) * os;
        for (size_t t = 0; t < tpe; t++) {
            size_t y0 = 2 * (t / tw), x0 = 2 * (t % tw);
            float *o[4];
            for (int r = 0; r < 2; r++)
                for (int q = 0; q < 2; q++) {
                    size_t y = y0 + (size_t)r, x = x0 + (size_t)q;
                    o[r * 2 + q] = y < s->oh && x < s->ow
                                       ? ye + (y * s->ow + x) * co
                                       : scratch;
                }
            output_tile(M + (e * tpe + t) * co, T * co, co, o);
        }
    }
}

/* M[xi] = V[xi] U[xi] for the 16 positions xi. */
static void
products(size_t T, size_t ci, size_t co, const float *V, const float *U,
         float *M)
{
    for (size_t xi = 0; xi < 16; xi++)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)T,
                    (blasint)co, (blasint)ci, 1.0f, V + xi * T * ci,
                    (blasint)ci, U + xi * ci * co, (blasint)co, 0.0f,
                    M + xi * T * co, (blasint)co);
}

static void
wino_run(const wshape *s, const float *in, size_t n, const float *U,
         float *ws, float *out)
{
    size_t ci = s->ci, co = s->co;
    size_t tpe = tiles_per_example(s), ch = wino_chunk(s);
    float *zero = ws + 16 * ci * co;
    float *scratch = zero + round16(ci);
    float *V = scratch + round16(co);
    memset(zero, 0, ci * sizeof *zero);
    for (size_t e0 = 0; e0 < n; e0 += ch) {
        size_t ne = n - e0 < ch ? n - e0 : ch, T = ne * tpe;
        float *M = V + 16 * T * ci;
        inputs_transform(s, in, e0, ne, zero, V);
        products(T, ci, co, V, U, M);
        outputs_transform(s, M, e0, ne, scratch, out);
    }
}

void
keel__wino_forward(const keel__conv_geom *g, const float *x, size_t n,
                   const float *w, float *ws, float *y)
{
    wshape s = fwd_shape(g);
    weights_transform(g, w, 0, ws);
    wino_run(&s, x, n, ws, ws, y);
}

void
keel__wino_backward_dx(const keel__conv_geom *g, const float *dy, size_t n,
                       const float *w, float *ws, float *dx)
{
    wshape s = dx_shape(g);
    weights_transform(g, w, 1, ws);
    wino_run(&s, dy, n, ws, ws, dx);
}
