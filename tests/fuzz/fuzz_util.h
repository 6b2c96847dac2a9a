/* fuzz_util.h - shared by the libFuzzer harnesses: a scratch directory made
 * once per process and whole-file writes into it. Harnesses never print. */
#ifndef KEEL_FUZZ_UTIL_H
#define KEEL_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* LLVMFuzzerTestOneInput is called by libFuzzer's main. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The process's scratch directory (mkdtemp under $TMPDIR or /tmp, removed
 * at exit with everything in it); aborts when it cannot be made, which is a
 * broken machine, not a finding. */
const char *fuzz_dir(void);

/* Write size bytes to fuzz_dir()/name; returns the full path (static
 * buffer, one per slot 0..3). Aborts on a write failure. */
const char *fuzz_write(int slot, const char *name, const void *data,
                       size_t size);

/* A NUL-terminated heap copy of data (caller frees). */
char *fuzz_strndup(const uint8_t *data, size_t size);

#endif
