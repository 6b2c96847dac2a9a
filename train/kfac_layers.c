/* kfac_layers.c - K-FAC's layer collection (keel/kfac.h): the dense and
 * conv2d layers a program registers by their variables, with the factor
 * sizes K-FAC derives from their shapes. keel_kfac_new registers a
 * keel_model's layers here too (keel__kfac_layers_add). */
#include <config.h>

#include <stdlib.h>
#include <string.h>

#include <keel/kfac.h>
#include "util.h"
#include "train_int.h"

void
keel_kfac_conv2d_config_init(keel_kfac_conv2d_config *cfg)
{
    KEEL__STRUCT_INIT(cfg);
    cfg->height = 0;
    cfg->width = 0;
    cfg->stride_h = 1;
    cfg->stride_w = 1;
    cfg->same_padding = 0;
}

keel_status
keel_kfac_layers_new(keel_kfac_layers **out)
{
    if (out == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC layers: out is NULL");
    *out = calloc(1, sizeof **out);
    if (*out == NULL)
        return keel__fail(KEEL_ENOMEM, "K-FAC layers");
    return KEEL_OK;
}

void
keel_kfac_layers_free(keel_kfac_layers *lc)
{
    if (lc == NULL)
        return;
    free(lc->l);
    free(lc);
}

int
keel_kfac_layers_count(const keel_kfac_layers *lc)
{
    return lc != NULL ? lc->n : 0;
}

keel_status
keel__kfac_layers_add(keel_kfac_layers *lc, const keel__kfac_layer *info,
                      int *index)
{
    for (int i = 0; i < lc->n; i++)
        if (lc->l[i].w == info->w || (info->b != NULL &&
                                      lc->l[i].b == info->b))
            return keel__fail(KEEL_EINVAL, "K-FAC layers: '%s' is already "
                              "registered (layer %d)",
                              keel_var_name(info->w), i);
    if (lc->n == lc->cap) {
        int cap = lc->cap > 0 ? 2 * lc->cap : 8;
        keel__kfac_layer *l = realloc(lc->l, (size_t)cap * sizeof *l);
        if (l == NULL)
            return keel__fail(KEEL_ENOMEM, "K-FAC layers: %d layers", cap);
        lc->l = l;
        lc->cap = cap;
    }
    lc->l[lc->n] = *info;
    if (index != NULL)
        *index = lc->n;
    lc->n++;
    return KEEL_OK;
}

/* kernel (rank dims, trainable) and bias (NULL, or trainable [cout]). */
static keel_status
check_vars(const char *what, keel_var *kernel, keel_var *bias, int rank)
{
    keel_tensor *w, *b;
    if (kernel == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC layers: %s: kernel is NULL",
                          what);
    w = keel_var_tensor(kernel);
    if (w->ndim != rank || !keel_var_is_trainable(kernel))
        return keel__fail(KEEL_EINVAL, "K-FAC layers: %s kernel '%s' must "
                          "be a trainable variable of rank %d (it has rank "
                          "%d)", what, keel_var_name(kernel), rank, w->ndim);
    for (int d = 0; d < rank; d++)
        if (w->shape[d] < 1)
            return keel__fail(KEEL_EINVAL, "K-FAC layers: %s kernel '%s' "
                              "has an empty dimension", what,
                              keel_var_name(kernel));
    if (bias == NULL)
        return KEEL_OK;
    b = keel_var_tensor(bias);
    if (b->ndim != 1 || b->shape[0] != w->shape[rank - 1] ||
        !keel_var_is_trainable(bias))
        return keel__fail(KEEL_EINVAL, "K-FAC layers: %s bias '%s' must be "
                          "a trainable variable of shape [%lld] (the "
                          "kernel '%s''s outputs)", what,
                          keel_var_name(bias),
                          (long long)w->shape[rank - 1],
                          keel_var_name(kernel));
    return KEEL_OK;
}

keel_status
keel_kfac_layers_add_dense(keel_kfac_layers *lc, keel_var *kernel,
                           keel_var *bias, int *index)
{
    keel__kfac_layer info;
    keel_tensor *w;
    keel_status st;
    if (lc == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC layers: NULL collection");
    if ((st = check_vars("dense", kernel, bias, 2)) != KEEL_OK)
        return st;
    w = keel_var_tensor(kernel);
    memset(&info, 0, sizeof info);
    info.w = kernel;
    info.b = bias;
    info.a_dim = (size_t)w->shape[0] + (bias != NULL);
    info.g_dim = (size_t)w->shape[1];
    info.locations = 1;
    return keel__kfac_layers_add(lc, &info, index);
}

keel_status
keel_kfac_layers_add_conv2d(keel_kfac_layers *lc,
                            const keel_kfac_conv2d_config *cfg,
                            keel_var *kernel, keel_var *bias, int *index)
{
    keel__kfac_layer info;
    keel_tensor *w;
    keel_status st;
    if (lc == NULL || cfg == NULL)
        return keel__fail(KEEL_EINVAL, "K-FAC layers: NULL argument");
    if ((st = KEEL__STRUCT_CHECK(cfg, keel_kfac_conv2d_config)) != KEEL_OK)
        return keel__wrap(st, "K-FAC layers");
    if ((st = check_vars("conv2d", kernel, bias, 4)) != KEEL_OK)
        return st;
    if (cfg->height < 1 || cfg->width < 1 || cfg->stride_h < 1 ||
        cfg->stride_w < 1)
        return keel__fail(KEEL_EINVAL, "K-FAC layers: conv2d '%s': height "
                          "%lld, width %lld and strides %lld, %lld must be "
                          ">= 1", keel_var_name(kernel),
                          (long long)cfg->height, (long long)cfg->width,
                          (long long)cfg->stride_h, (long long)cfg->stride_w);
    w = keel_var_tensor(kernel);
    memset(&info, 0, sizeof info);
    info.is_conv = 1;
    info.w = kernel;
    info.b = bias;
    info.cg.h = (size_t)cfg->height;
    info.cg.w = (size_t)cfg->width;
    info.cg.kh = (size_t)w->shape[0];
    info.cg.kw = (size_t)w->shape[1];
    info.cg.cin = (size_t)w->shape[2];
    info.cg.cout = (size_t)w->shape[3];
    info.cg.sh = (size_t)cfg->stride_h;
    info.cg.sw = (size_t)cfg->stride_w;
    if ((st = keel__conv_geom_init(&info.cg, cfg->same_padding != 0)) !=
        KEEL_OK)
        return keel__wrap(st, "K-FAC layers: conv2d '%s'",
                          keel_var_name(kernel));
    info.a_dim = info.cg.kh * info.cg.kw * info.cg.cin + (bias != NULL);
    info.g_dim = info.cg.cout;
    info.locations = info.cg.oh * info.cg.ow;
    return keel__kfac_layers_add(lc, &info, index);
}
