/* ckpt_child.c - helper for the crash test: saves checkpoints in a loop
 * (every element of every variable and slot equals the step) until killed.
 * ROWS (default 256) sizes dense/kernel and its slot: 2048 rows make a
 * 9 MiB checkpoint, written with O_DIRECT.
 * usage: ckpt_child DIR FIRST_STEP N_SAVES ASYNC(0|1) MAX_TO_KEEP [ROWS] */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>

#include <keel/keel.h>

int
main(int argc, char **argv)
{
    keel_saver_config cfg;
    keel_saver *s;
    keel_vars *vs;
    keel_var *v;
    keel_tensor *slot;
    int64_t shapes[3][2] = { { 256, 512 }, { 512, 1 }, { 64, 64 } };
    const char *names[3] = { "dense/kernel", "dense/bias", "out/kernel" };
    long first, n;
    char blobdata[32];
    keel_ckpt_blob blob = { "rng", blobdata, sizeof blobdata };
    keel_ckpt_meta meta = { sizeof meta, "[run]\nsteps=1\n", "single",
                            &blob, 1, NULL, 0 };

    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: ckpt_child DIR FIRST N ASYNC MAX_TO_KEEP "
                "[ROWS]\n");
        return 2;
    }
    if (argc == 7)
        shapes[0][0] = atol(argv[6]);
    first = atol(argv[2]);
    n = atol(argv[3]);
    keel_saver_config_init(&cfg);
    cfg.dir = argv[1];
    cfg.is_async = atoi(argv[4]);
    cfg.max_to_keep = atoi(argv[5]);
    if (keel_vars_new(&vs) != KEEL_OK)
        return 1;
    for (int i = 0; i < 3; i++) {
        if (keel_vars_create(vs, names[i], 2, shapes[i], KEEL_VAR_TRAINABLE,
                             &v) != KEEL_OK ||
            keel_var_add_slot(v, "m", &slot) != KEEL_OK)
            return 1;
    }
    if (keel_saver_new(&cfg, &s) != KEEL_OK) {
        fprintf(stderr, "ckpt_child: %s\n", keel_last_error());
        return 1;
    }
    for (long k = 0; n < 0 || k < n; k++) {
        long step = first + k;
        for (size_t i = 0; i < keel_vars_count(vs); i++) {
            keel_var *x = keel_vars_at(vs, i);
            keel_tensor *t = keel_var_tensor(x), *sl = keel_var_slot(x, "m");
            for (size_t j = 0; j < t->count; j++)
                t->data[j] = sl->data[j] = (float)step;
        }
        for (size_t j = 0; j < sizeof blobdata; j++)
            blobdata[j] = (char)(step + (long)j);
        keel_vars_set_global_step(vs, step);
        if (keel_saver_save(s, vs, &meta, NULL, 0) != KEEL_OK) {
            fprintf(stderr, "ckpt_child: %s\n", keel_last_error());
            return 1;
        }
    }
    if (keel_saver_wait(s) != KEEL_OK) {
        fprintf(stderr, "ckpt_child: %s\n", keel_last_error());
        return 1;
    }
    keel_saver_free(s);
    keel_vars_free(vs);
    return 0;
}
