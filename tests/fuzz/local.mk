# tests/fuzz/: libFuzzer harnesses for every parser of outside input.
# Build in a separate directory configured with
#   ../configure CC=clang --enable-fuzzers
# then `make fuzz` replays every seed corpus once, and
#   make fuzz FUZZ_TIME=600
# runs each harness that many seconds, growing a corpus in fuzz-corpus/NAME
# of the build directory (the seeds in tests/fuzz/corpus/ are read only).
# See docs/fuzzing.md.
FUZZ_NAMES = wire tfconfig config slurm ckpt_state idx ckpt_restore ckpt_h5
FUZZ_BINS = tests/fuzz/fuzz_wire tests/fuzz/fuzz_tfconfig \
	tests/fuzz/fuzz_config tests/fuzz/fuzz_slurm tests/fuzz/fuzz_ckpt_state \
	tests/fuzz/fuzz_idx tests/fuzz/fuzz_ckpt_restore tests/fuzz/fuzz_ckpt_h5
EXTRA_PROGRAMS += $(FUZZ_BINS) tests/fuzz/make_seeds
FUZZ_TIME = 0
FUZZ_FLAGS = -rss_limit_mb=3072 -timeout=30
# HDF5 leaks a few hundred bytes inside the library on some damaged files
# (keel frees all it owns): the same suppressions as the sanitizer suite.
FUZZ_ENV = ASAN_OPTIONS=detect_leaks=1 \
	LSAN_OPTIONS=suppressions=$(abs_top_srcdir)/tests/lsan-hdf5.supp:print_suppressions=0

FUZZ_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/cluster -I$(srcdir)/checkpoint \
	$(ZMQ_CFLAGS)
FUZZ_LDADD = libkeel_core.la $(ZMQ_LIBS) $(ZLIB_LIBS)
FUZZ_UTIL = tests/fuzz/fuzz_util.c tests/fuzz/fuzz_util.h

tests_fuzz_fuzz_wire_SOURCES = tests/fuzz/fuzz_wire.c $(FUZZ_UTIL)
tests_fuzz_fuzz_wire_CPPFLAGS = $(FUZZ_CPPFLAGS)
tests_fuzz_fuzz_wire_LDFLAGS = $(KEEL_FUZZ_LDFLAGS)
tests_fuzz_fuzz_wire_LDADD = $(FUZZ_LDADD)
tests_fuzz_fuzz_tfconfig_SOURCES = tests/fuzz/fuzz_tfconfig.c $(FUZZ_UTIL)
tests_fuzz_fuzz_tfconfig_CPPFLAGS = $(FUZZ_CPPFLAGS)
tests_fuzz_fuzz_tfconfig_LDFLAGS = $(KEEL_FUZZ_LDFLAGS)
tests_fuzz_fuzz_tfconfig_LDADD = $(FUZZ_LDADD)
tests_fuzz_fuzz_config_SOURCES = tests/fuzz/fuzz_config.c $(FUZZ_UTIL)
tests_fuzz_fuzz_config_CPPFLAGS = $(FUZZ_CPPFLAGS)
tests_fuzz_fuzz_config_LDFLAGS = $(KEEL_FUZZ_LDFLAGS)
tests_fuzz_fuzz_config_LDADD = $(FUZZ_LDADD)
tests_fuzz_fuzz_slurm_SOURCES = tests/fuzz/fuzz_slurm.c $(FUZZ_UTIL)
tests_fuzz_fuzz_slurm_CPPFLAGS = $(FUZZ_CPPFLAGS)
tests_fuzz_fuzz_slurm_LDFLAGS = $(KEEL_FUZZ_LDFLAGS)
tests_fuzz_fuzz_slurm_LDADD = $(FUZZ_LDADD)
tests_fuzz_fuzz_ckpt_state_SOURCES = tests/fuzz/fuzz_ckpt_state.c $(FUZZ_UTIL)
tests_fuzz_fuzz_ckpt_state_CPPFLAGS = $(FUZZ_CPPFLAGS)
tests_fuzz_fuzz_ckpt_state_LDFLAGS = $(KEEL_FUZZ_LDFLAGS)
tests_fuzz_fuzz_ckpt_state_LDADD = $(FUZZ_LDADD)
tests_fuzz_fuzz_idx_SOURCES = tests/fuzz/fuzz_idx.c $(FUZZ_UTIL)
tests_fuzz_fuzz_idx_CPPFLAGS = $(FUZZ_CPPFLAGS)
tests_fuzz_fuzz_idx_LDFLAGS = $(KEEL_FUZZ_LDFLAGS)
tests_fuzz_fuzz_idx_LDADD = $(FUZZ_LDADD)
tests_fuzz_fuzz_ckpt_restore_SOURCES = tests/fuzz/fuzz_ckpt_restore.c \
	$(FUZZ_UTIL)
tests_fuzz_fuzz_ckpt_restore_CPPFLAGS = $(FUZZ_CPPFLAGS)
tests_fuzz_fuzz_ckpt_restore_LDFLAGS = $(KEEL_FUZZ_LDFLAGS)
tests_fuzz_fuzz_ckpt_restore_LDADD = $(FUZZ_LDADD)
tests_fuzz_fuzz_ckpt_h5_SOURCES = tests/fuzz/fuzz_ckpt_h5.c $(FUZZ_UTIL)
tests_fuzz_fuzz_ckpt_h5_CPPFLAGS = $(FUZZ_CPPFLAGS)
tests_fuzz_fuzz_ckpt_h5_LDFLAGS = $(KEEL_FUZZ_LDFLAGS)
tests_fuzz_fuzz_ckpt_h5_LDADD = $(FUZZ_LDADD)
tests_fuzz_make_seeds_SOURCES = tests/fuzz/make_seeds.c
tests_fuzz_make_seeds_CPPFLAGS = $(FUZZ_CPPFLAGS)
tests_fuzz_make_seeds_LDADD = $(FUZZ_LDADD)

EXTRA_DIST += tests/fuzz/fuzz_util.h \
	tests/fuzz/corpus/ckpt_h5/two-vars \
	tests/fuzz/corpus/ckpt_restore/two-vars \
	tests/fuzz/corpus/ckpt_state/saver-written \
	tests/fuzz/corpus/ckpt_state/tf-style \
	tests/fuzz/corpus/config/full \
	tests/fuzz/corpus/config/long-lines \
	tests/fuzz/corpus/config/minimal \
	tests/fuzz/corpus/idx/gzip-images \
	tests/fuzz/corpus/idx/plain \
	tests/fuzz/corpus/slurm/nodes \
	tests/fuzz/corpus/slurm/simple \
	tests/fuzz/corpus/slurm/sixteen \
	tests/fuzz/corpus/tfconfig/evaluator \
	tests/fuzz/corpus/tfconfig/ipv6 \
	tests/fuzz/corpus/tfconfig/worker \
	tests/fuzz/corpus/wire/error-text \
	tests/fuzz/corpus/wire/hello \
	tests/fuzz/corpus/wire/pull-names \
	tests/fuzz/corpus/wire/push

if FUZZERS
fuzz: $(FUZZ_BINS)
	@for n in $(FUZZ_NAMES); do \
	  seeds=$(abs_top_srcdir)/tests/fuzz/corpus/$$n; \
	  if test "$(FUZZ_TIME)" = 0; then \
	    echo "== fuzz_$$n: replaying $$seeds"; \
	    $(FUZZ_ENV) ./tests/fuzz/fuzz_$$n $(FUZZ_FLAGS) \
	      -runs=0 $$seeds || exit 1; \
	  else \
	    mkdir -p fuzz-corpus/$$n; \
	    echo "== fuzz_$$n: $(FUZZ_TIME) s, corpus fuzz-corpus/$$n"; \
	    $(FUZZ_ENV) ./tests/fuzz/fuzz_$$n $(FUZZ_FLAGS) \
	      -max_total_time=$(FUZZ_TIME) -print_final_stats=1 \
	      -artifact_prefix=fuzz-corpus/$$n- fuzz-corpus/$$n $$seeds \
	      || exit 1; \
	  fi; \
	done
else
fuzz:
	@echo "keel: make fuzz needs a build configured with" \
	  "'../configure CC=clang --enable-fuzzers'" >&2; exit 2
endif
.PHONY: fuzz
