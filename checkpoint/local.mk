# checkpoint/: HDF5 checkpoints, the state file, retention, async save.
libkeel_core_la_SOURCES += checkpoint/ckpt_int.h \
	checkpoint/h5_int.h checkpoint/h5layout.c checkpoint/h5bounds.c \
	checkpoint/h5read.c \
	checkpoint/ckpt_io.h checkpoint/ckpt_io.c \
	checkpoint/saver_int.h checkpoint/saver.c \
	checkpoint/state.c checkpoint/retention.c checkpoint/restore.c \
	checkpoint/lease.c checkpoint/shard.c \
	checkpoint/ckpt_ops.h checkpoint/ckpt_ops.c

if HAVE_CHECK
check_PROGRAMS += tests/check_checkpoint tests/ckpt_child
TESTS += tests/check_checkpoint
LONG_TESTS += tests/check_checkpoint
tests_check_checkpoint_CFLAGS = $(TEST_CFLAGS) $(HDF5_CFLAGS)
tests_check_checkpoint_LDADD = $(TEST_LIBS) $(HDF5_LIBS)
tests_ckpt_child_LDADD = libkeel.la
endif

# Benchmark (not built by default): make bench/ckpt_bench
EXTRA_PROGRAMS += bench/ckpt_bench
bench_ckpt_bench_SOURCES = bench/ckpt_bench.c $(BENCH_UTIL)
bench_ckpt_bench_LDADD = libkeel.la
EXTRA_DIST += tests/lsan-hdf5.supp bench/ckpt.sh
