/* events_int.h - private to hooks/events.c, hooks/trace.c and their tests:
 * CRC32C (ISA-L, and a bit-at-a-time reference for tests), TFRecord framing and
 * the UTF-8 / tag checks shared by the event and trace writers. */
#ifndef KEEL_HOOKS_EVENTS_INT_H
#define KEEL_HOOKS_EVENTS_INT_H

#include <stddef.h>
#include <stdint.h>
#include <keel/status.h>

/* CRC32C (Castagnoli, reflected poly 0x82F63B78, init and final xor ~0).
 * crc is a previous result (0 to start), so crc32c(a+b) ==
 * keel__crc32c_extend(keel__crc32c_extend(0, a), b). Cannot fail. */
uint32_t keel__crc32c_extend(uint32_t crc, const void *data, size_t n);
/* The same, one bit at a time: the reference tests compare against. */
uint32_t keel__crc32c_bitwise(uint32_t crc, const void *data, size_t n);
/* TensorFlow's masking: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t keel__crc32c_mask(uint32_t crc);

/* Bytes of TFRecord framing around a payload: 8 + 4 before, 4 after. */
#define KEEL__TFRECORD_HEAD 12
#define KEEL__TFRECORD_TAIL 4
/* Fill head[12] and tail[4] for a payload of n bytes. Cannot fail. */
void keel__tfrecord_frame(const void *data, size_t n, uint8_t head[12],
                          uint8_t tail[4]);

/* Nonzero when s[0..n) is well-formed UTF-8 (no overlongs, surrogates or
 * code points above U+10FFFF) without C0 control characters or DEL. */
int keel__utf8_is_clean(const char *s, size_t n);

/* A buffered append-only output file shared by the event, CSV and trace
 * writers. Writes go through keel__fs (tests inject failures there); after
 * a failed write the file is marked broken and every later call fails. */
typedef struct keel__ev_out {
    int fd;                 /* -1 when closed */
    char *path;             /* owned; named in every error */
    uint8_t *buf;
    size_t len, cap;
    int is_broken;
} keel__ev_out;

/* Open path with open(2) flags (O_CLOEXEC added), mode 0644. */
keel_status keel__ev_out_open(keel__ev_out *o, const char *path, int flags);
keel_status keel__ev_out_write(keel__ev_out *o, const void *data, size_t n);
/* Write the buffer out; with do_fsync also fsync the file. */
keel_status keel__ev_out_flush(keel__ev_out *o, int do_fsync);
/* Flush + fsync + close + free; always releases. o may be zeroed memory. */
keel_status keel__ev_out_close(keel__ev_out *o);

#endif
