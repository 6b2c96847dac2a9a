/* fpmode.c - the floating-point mode of keel's arithmetic.
 *
 * keel computes with subnormal floats flushed to zero: results that would
 * be subnormal are written as zero (FTZ) and subnormal inputs read as zero
 * (DAZ). x86 cores take a microcode assist of a hundred cycles or more per
 * subnormal operand; Adam's moments of a weight whose gradient is always
 * zero (a pixel that is black in every image) decay through the subnormal
 * range over hundreds of steps, and an update that meets them runs several
 * times slower. TensorFlow's compute threads flush the same way.
 *
 * The mode is per thread. A scope saves the caller's mode and restores it,
 * so a program calling libkeel keeps its own; keel's worker threads set
 * the mode once at their start. Every thread of keel's arithmetic uses the
 * same mode, so results do not depend on which thread or process computed
 * them. Elsewhere than x86-64 and AArch64 the scope does nothing. */
#include <config.h>

#include "util.h"

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
/* MXCSR bit 15 is FTZ, bit 6 is DAZ. */
#define FP_FLUSH_BITS 0x8040u

void
keel__fp_flush_begin(keel__fp_mode *saved)
{
    unsigned int csr = _mm_getcsr();
    saved->bits = csr;
    if ((csr & FP_FLUSH_BITS) != FP_FLUSH_BITS)
        _mm_setcsr(csr | FP_FLUSH_BITS);
}

void
keel__fp_flush_end(const keel__fp_mode *saved)
{
    if (_mm_getcsr() != saved->bits)
        _mm_setcsr(saved->bits);
}

#elif defined(__aarch64__)
/* FPCR bit 24 is FZ (flush inputs and outputs). */
#define FP_FLUSH_BITS ((uint64_t)1 << 24)

void
keel__fp_flush_begin(keel__fp_mode *saved)
{
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    saved->bits = fpcr;
    if ((fpcr & FP_FLUSH_BITS) == 0)
        __asm__ volatile("msr fpcr, %0" : : "r"(fpcr | FP_FLUSH_BITS));
}

void
keel__fp_flush_end(const keel__fp_mode *saved)
{
    uint64_t fpcr;
    __asm__ volatile("mrs %0, fpcr" : "=r"(fpcr));
    if (fpcr != saved->bits)
        __asm__ volatile("msr fpcr, %0" : : "r"(saved->bits));
}

#else

void
keel__fp_flush_begin(keel__fp_mode *saved)
{
    saved->bits = 0;
}

void
keel__fp_flush_end(const keel__fp_mode *saved)
{
    (void)saved;
}

#endif
