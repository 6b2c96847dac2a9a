/* job_data.c - what a config names outside the model's training: the
 * training or test set (MNIST-format files or HDF5, streamed or not), the
 * class count, the model's settings for a data set, OpenBLAS threads and
 * the steps per epoch. Shared by the training job, the evaluator and
 * export (app_int.h). */
#include <config.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <keel/config.h>
#include <keel/train.h>
#include "util.h"
#include "app_int.h"

/* "<dir>/<stem>-idx?-ubyte" with or without ".gz", whichever exists. */
static keel_status
find_idx(const char *dir, const char *stem, char *out, size_t size)
{
    static const char *suffix[] = { ".gz", "" };
    struct stat sb;
    for (int i = 0; i < 2; i++) {
        keel_status st = keel__fmt(out, size, "data path", "%s/%s%s", dir,
                                   stem, suffix[i]);
        if (st != KEEL_OK)
            return st;
        if (stat(out, &sb) == 0)
            return KEEL_OK;
    }
    return keel__fail(KEEL_EINVAL, "data file %s/%s[.gz] does not exist "
                      "(data.dir = %s); install Debian's "
                      "dataset-fashion-mnist or point data.dir at MNIST-"
                      "format files", dir, stem, dir);
}

/* The path of the HDF5 training (is_test 0) or test file into path. */
static keel_status
h5_path(const keel_config *cfg, int is_test, char *path, size_t size)
{
    const char *dir = keel_config_str(cfg, "data.dir");
    const char *file = keel_config_str(cfg, is_test ? "data.test_file"
                                                    : "data.train_file");
    if (file[0] == '\0')
        return keel__fail(KEEL_EINVAL, "data.format = hdf5 needs "
                          "data.%s_file", is_test ? "test" : "train");
    if (file[0] == '/')
        return keel__fmt(path, size, "data path", "%s", file);
    return keel__path_join(path, size, dir, file);
}

/* data.stream for the file at path: on, off, or auto (on when the file
 * is larger than data.memory_budget_mb). */
static int
stream_file(const keel_config *cfg, const char *path)
{
    const char *mode = keel_config_str(cfg, "data.stream");
    struct stat sb;
    if (strcmp(mode, "on") == 0 || strcmp(mode, "off") == 0)
        return strcmp(mode, "on") == 0;
    return stat(path, &sb) == 0 &&
           (uint64_t)sb.st_size >
               (uint64_t)keel_config_int(cfg, "data.memory_budget_mb") << 20;
}

keel_status
keel__job_open_dataset(const keel_config *cfg, int is_test, int64_t classes,
                       int labels_only, keel_dataset **out)
{
    const char *dir = keel_config_str(cfg, "data.dir");
    keel_status st;
    if (strcmp(keel_config_str(cfg, "data.format"), "hdf5") == 0) {
        char path[KEEL_PATH_MAX];
        keel_dataset_h5_config hc;
        st = h5_path(cfg, is_test, path, sizeof path);
        if (st != KEEL_OK)
            return st;
        keel_dataset_h5_config_init(&hc);
        if (classes > 0)
            hc.num_classes = classes;
        hc.stream = labels_only || stream_file(cfg, path);
        hc.block_rows = keel_config_int(cfg, "data.shuffle_block");
        st = keel_dataset_open_h5_config(path, &hc, out);
        if (st == KEEL_OK && keel_dataset_is_streamed(*out) && !labels_only)
            keel__log(KEEL_LOG_INFO, "data: %s streamed in blocks of %lld "
                      "rows (data.stream = %s)", path,
                      (long long)hc.block_rows,
                      keel_config_str(cfg, "data.stream"));
        return st;
    }
    {
        char images[KEEL_PATH_MAX], labels[KEEL_PATH_MAX];
        const char *pre = is_test ? "t10k" : "train";
        char stem[64];
        snprintf(stem, sizeof stem, "%s-images-idx3-ubyte", pre);
        st = find_idx(dir, stem, images, sizeof images);
        if (st != KEEL_OK)
            return st;
        snprintf(stem, sizeof stem, "%s-labels-idx1-ubyte", pre);
        st = find_idx(dir, stem, labels, sizeof labels);
        if (st != KEEL_OK)
            return st;
        /* uint8 labels: at most 256 classes */
        return keel_dataset_open_idx(images, labels,
                                     classes > 0 && classes < 256
                                         ? (int)classes : 256, out);
    }
}

keel_status
keel__job_classes(const keel_config *cfg, const keel_dataset *train,
                  int64_t *out)
{
    keel_dataset *own = NULL;
    int64_t max;
    keel_status st;
    *out = keel_config_int(cfg, "model.classes");
    if (*out > 0)
        return KEEL_OK;
    if (train == NULL) {
        st = keel__job_open_dataset(cfg, 0, 0, 1, &own);
        if (st != KEEL_OK)
            return keel__wrap(st, "model.classes = 0 takes the class count "
                              "from the training set's labels");
        train = own;
    }
    max = keel_dataset_max_label(train);
    keel_dataset_free(own);
    if (max < 1)
        return keel__fail(KEEL_EINVAL, "model.classes = 0 takes the class "
                          "count from the training set's labels, whose "
                          "largest is %lld: set model.classes",
                          (long long)max);
    *out = max + 1;
    return KEEL_OK;
}

keel_status
keel__job_model_config_from(const keel_config *cfg, const keel_dataset *ds,
                            int64_t classes, int64_t max_batch,
                            keel_model_config *mc)
{
    keel_status st;
    keel_model_config_init(mc);
    st = keel_model_kind_from_name(keel_config_str(cfg, "model.type"),
                                   &mc->kind);
    if (st != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "model.type");
    if (mc->kind == KEEL_MODEL_CNN && keel_dataset_rank(ds) == 2)
        return keel__fail(KEEL_EINVAL, "model.type = cnn needs images "
                          "([N,H,W] or [N,H,W,C]); the data is tabular "
                          "[N,%zu]: use model.type = softmax or mlp",
                          keel_dataset_example_size(ds));
    if (mc->kind == KEEL_MODEL_MLP) {
        st = keel_model_parse_hidden(keel_config_str(cfg, "model.hidden"),
                                     mc);
        if (st != KEEL_OK)
            return keel__wrap(KEEL_EINVAL, "model.hidden");
    }
    st = keel_init_kind_from_name(keel_config_str(cfg, "model.init"),
                                  &mc->init);
    if (st != KEEL_OK)
        return keel__wrap(KEEL_EINVAL, "model.init");
    keel_dataset_shape(ds, &mc->height, &mc->width, &mc->channels);
    mc->classes = classes;
    mc->max_batch = max_batch;
    mc->threads = (int)keel_config_int(cfg, "train.model_threads");
    return KEEL_OK;
}

/* OpenBLAS threads: train.threads, or 1 under model threads (each model
 * thread runs its own single-threaded sgemm). Neither changes the bits. */
void
keel__job_set_blas_threads(const keel_config *cfg)
{
    if (keel_config_int(cfg, "train.model_threads") > 1)
        keel_train_set_threads(1);
    else if (keel_config_int(cfg, "train.threads") > 0)
        keel_train_set_threads((int)keel_config_int(cfg, "train.threads"));
}

keel_status
keel__job_steps_per_epoch(const keel_config *cfg, int64_t *out)
{
    keel_dataset *ds = NULL;
    keel_data_iter *it = NULL;
    keel_data_iter_config ic;
    keel_status st = keel__job_open_dataset(cfg, 0, 0, 1, &ds);
    *out = 0;
    if (st != KEEL_OK)
        return st;
    keel_data_iter_config_init(&ic);          // as job_build.c, replica 0 of 1
    ic.global_batch_size = keel_config_int(cfg, "train.batch_size");
    ic.seed = (uint64_t)keel_config_int(cfg, "train.seed");
    ic.shuffle = keel_config_bool(cfg, "data.shuffle");
    ic.max_epochs = keel_config_int(cfg, "train.epochs");
    st = keel_data_iter_new(ds, &ic, &it);
    if (st == KEEL_OK)
        *out = keel_data_iter_steps_per_epoch(it);
    keel_data_iter_free(it);
    keel_dataset_free(ds);
    return st;
}
