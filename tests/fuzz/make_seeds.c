/* make_seeds.c - writes the binary seed inputs of tests/fuzz/corpus/ (wire
 * messages, IDX files, a checkpoint and its state file) with keel's own
 * encoders, so the seeds follow the formats. Usage: make_seeds CORPUS_DIR
 * (the text seeds - TF_CONFIG, INI, Slurm - are kept by hand). */
#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include <keel/checkpoint.h>
#include "cluster_int.h"

static const char *root;

static void
put(const char *sub, const char *name, const void *d, size_t n)
{
    char p[1024];
    FILE *f;
    snprintf(p, sizeof p, "%s/%s", root, sub);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s/%s", root, sub, name);
    f = fopen(p, "wb");
    if (f == NULL || fwrite(d, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "make_seeds: cannot write %s\n", p);
        exit(1);
    }
}

/* Wire seed framing (see fuzz_wire.c): frame count - 1, then 16-bit
 * lengths before every frame but the last. */
static size_t
frame(unsigned char *out, size_t at, const void *d, size_t n, int last)
{
    if (!last) {
        out[at++] = (unsigned char)n;
        out[at++] = (unsigned char)(n >> 8);
    }
    memcpy(out + at, d, n);
    return at + n;
}

/* A wire seed's start: the frame count - 1 (more: the frames after the
 * header), then h encoded as the first frame; the length so far. */
static size_t
header_frame(unsigned char *buf, const keel__wire_header *h, int more)
{
    unsigned char hdr[KEEL_WIRE_HEADER_SIZE];
    keel__wire_header_encode(h, hdr);
    buf[0] = (unsigned char)more;
    return frame(buf, 1, hdr, sizeof hdr, more == 0);
}

static void
wire_seeds(void)
{
    unsigned char buf[4096], desc[256];
    keel__wire_header h;
    int64_t shape[2] = { 3, 2 };
    float vals[6] = { 1, 2, 3, 4, 5, 6 };
    size_t n, dl;
    /* PUSH of one [3,2] tensor. */
    memset(&h, 0, sizeof h);
    h.type = KEEL_MSG_PUSH;
    h.request_id = 7;
    h.sender_type = KEEL_TASK_WORKER;
    h.sender_index = 1;
    h.generation = 42;
    h.global_step = 10;
    h.local_step = 3;
    h.count = 1;
    dl = keel__wire_desc_encode("dense/kernel", 2, shape, desc, sizeof desc);
    n = header_frame(buf, &h, 2);
    n = frame(buf, n, desc, dl, 0);
    n = frame(buf, n, vals, sizeof vals, 1);
    put("wire", "push", buf, n);
    /* PULL by names only, two tensors. */
    h.type = KEEL_MSG_PULL;
    h.flags = KEEL_WIRE_F_NAMES_ONLY;
    h.count = 2;
    n = header_frame(buf, &h, 2);
    n = frame(buf, n, desc, dl, 0);
    dl = keel__wire_desc_encode("dense/bias", 1, shape + 1, desc,
                                sizeof desc);
    n = frame(buf, n, desc, dl, 1);
    put("wire", "pull-names", buf, n);
    /* ERROR with text. */
    h.type = KEEL_MSG_ERROR;
    h.flags = KEEL_WIRE_F_TEXT;
    h.count = 0;
    h.arg = 3;
    n = header_frame(buf, &h, 1);
    n = frame(buf, n, "no such variable 'x'", 20, 1);
    put("wire", "error-text", buf, n);
    /* HELLO, header only. */
    h.type = KEEL_MSG_HELLO;
    h.flags = 0;
    h.arg = 0;
    n = header_frame(buf, &h, 0);
    put("wire", "hello", buf, n);
}

static void
idx_seeds(void)
{
    /* 2 images of 2x3, labels 1 and 9. */
    unsigned char img[16 + 12] = { 0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 2,
                                   0, 0, 0, 3, 0, 10, 20, 30, 40, 50,
                                   255, 128, 64, 32, 16, 8 };
    unsigned char lab[8 + 2] = { 0, 0, 8, 1, 0, 0, 0, 2, 1, 9 };
    unsigned char buf[512], gz[256];
    uLongf gl;
    size_t n;
    gzFile f;
    char tmp[] = "/tmp/keel-seed-XXXXXX";
    FILE *rf;
    int fd;
    buf[0] = sizeof img;
    buf[1] = 0;
    memcpy(buf + 2, img, sizeof img);
    memcpy(buf + 2 + sizeof img, lab, sizeof lab);
    put("idx", "plain", buf, 2 + sizeof img + sizeof lab);
    /* The images gzip-compressed (a real gzip stream, as the .gz files). */
    fd = mkstemp(tmp);
    if (fd < 0)
        exit(1);
    f = gzdopen(fd, "wb");
    gzwrite(f, img, sizeof img);
    gzclose(f);
    rf = fopen(tmp, "rb");
    gl = (uLongf)fread(gz, 1, sizeof gz, rf);
    fclose(rf);
    remove(tmp);
    buf[0] = (unsigned char)gl;
    buf[1] = 0;
    memcpy(buf + 2, gz, gl);
    memcpy(buf + 2 + gl, lab, sizeof lab);
    n = 2 + gl + sizeof lab;
    put("idx", "gzip-images", buf, n);
}

static void
ckpt_seeds(void)
{
    static const int64_t k[2] = { 3, 2 }, b[1] = { 2 };
    char dir[] = "/tmp/keel-seed-XXXXXX", path[1024], st[1024];
    keel_saver_config sc;
    keel_saver *s = NULL;
    keel_vars *vs = NULL;
    keel_var *v;
    keel_ckpt_meta meta = { .struct_size = sizeof meta,
                            .config_text = "[train]\nmax_steps = 5\n",
                            .topology = "ps=1 workers=1" };
    char *data;
    long len;
    FILE *f;
    if (mkdtemp(dir) == NULL || keel_vars_new(&vs) != KEEL_OK ||
        keel_vars_create(vs, "dense/kernel", 2, k, KEEL_VAR_TRAINABLE,
                         &v) != KEEL_OK)
        exit(1);
    for (int i = 0; i < 6; i++)
        ((float *)keel_var_tensor(v)->data)[i] = (float)i * 0.5f;
    if (keel_vars_create(vs, "dense/bias", 1, b, KEEL_VAR_TRAINABLE, &v) !=
        KEEL_OK)
        exit(1);
    keel_vars_set_all_initialized(vs, 1);
    keel_vars_set_global_step(vs, 1);
    keel_saver_config_init(&sc);
    sc.dir = dir;
    if (keel_saver_new(&sc, &s) != KEEL_OK ||
        keel_saver_save(s, vs, &meta, path, sizeof path) != KEEL_OK)
        exit(1);
    keel_vars_set_global_step(vs, 2);
    if (keel_saver_save(s, vs, &meta, path, sizeof path) != KEEL_OK)
        exit(1);
    keel_saver_free(s);
    keel_vars_free(vs);
    f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    rewind(f);
    data = malloc((size_t)len);
    if (fread(data, 1, (size_t)len, f) != (size_t)len)
        exit(1);
    fclose(f);
    put("ckpt_restore", "two-vars", data, (size_t)len);
    put("ckpt_h5", "two-vars", data, (size_t)len);
    remove(path);
    free(data);
    snprintf(st, sizeof st, "%s/checkpoint", dir);
    f = fopen(st, "rb");
    data = malloc(65536);
    len = (long)fread(data, 1, 65536, f);
    fclose(f);
    put("ckpt_state", "saver-written", data, (size_t)len);
    free(data);
    remove(st);
    snprintf(st, sizeof st, "%s/model.ckpt-1.h5", dir);
    remove(st);
    rmdir(dir);
}

int
main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
        return 2;
    }
    root = argv[1];
    wire_seeds();
    idx_seeds();
    ckpt_seeds();
    return 0;
}
