/* fuzz_wire.c - the wire decoder (header, descriptors, frame counts and
 * sizes) on arbitrary multipart messages.
 * Input: byte 0 = number of frames - 1 (mod 16); then each frame but the
 * last as a 16-bit little-endian length and that many bytes (clamped to
 * what is left); the last frame is the rest. */
#include <config.h>

#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "cluster_int.h"
#include "fuzz_util.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    keel__wire_limits lim;
    keel__wire_msg m;
    zmq_msg_t *frames;
    size_t n, off = 1;
    if (size < 1)
        return 0;
    n = (size_t)(data[0] % 16) + 1;
    frames = calloc(n, sizeof *frames);
    if (frames == NULL)
        abort();
    for (size_t i = 0; i < n; i++) {
        size_t len = size - off;
        if (i + 1 < n) {
            if (size - off >= 2) {
                len = (size_t)data[off] | (size_t)data[off + 1] << 8;
                off += 2;
            } else {
                len = 0;
                off = size;
            }
            if (len > size - off)
                len = size - off;
        }
        if (zmq_msg_init_size(&frames[i], len) != 0)
            abort();
        if (len > 0)
            memcpy(zmq_msg_data(&frames[i]), data + off, len);
        off += len;
    }
    memset(&lim, 0, sizeof lim);
    lim.max_tensors = 64;
    lim.max_total_bytes = 1 << 20;
    lim.max_text = 4096;
    keel__wire_msg_init(&m);
    /* The message owns the frames from here, decoded or not. */
    if (keel__wire_decode(frames, n, &lim, &m) == KEEL_OK) {
        volatile float sum = 0;
        for (size_t i = 0; i < m.n; i++)
            if (m.tensors[i].t.data != NULL)
                for (size_t j = 0; j < m.tensors[i].t.count; j++)
                    sum += ((const float *)m.tensors[i].t.data)[j];
        (void)sum;
    }
    keel__wire_msg_clear(&m);
    return 0;
}
