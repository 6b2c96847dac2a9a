# train/: the model library on numeric/: layers, models, K-FAC, Hogwild, data.
libkeel_core_la_SOURCES += train/train_int.h \
	train/layers.c train/model.c train/hogwild.c \
	train/kfac.c train/kfac_layers.c train/data.c
pkginclude_HEADERS += include/keel/train.h include/keel/kfac.h

# Throughput / accuracy benchmark (bench/train.sh runs it); not installed.
EXTRA_PROGRAMS += bench/train_bench
bench_train_bench_SOURCES = bench/train_bench.c $(BENCH_UTIL)
bench_train_bench_CPPFLAGS = $(AM_CPPFLAGS) $(OPENBLAS_CFLAGS)
bench_train_bench_LDADD = libkeel_core.la

# K-FAC's per-step cost against Adam (bench/kfac.sh runs it); not installed.
EXTRA_PROGRAMS += bench/kfac_bench
bench_kfac_bench_SOURCES = bench/kfac_bench.c $(BENCH_UTIL)
bench_kfac_bench_LDADD = libkeel_core.la

if HAVE_CHECK
SUITES += tests/check_train
tests_check_train_CPPFLAGS = $(AM_CPPFLAGS) -I$(srcdir)/train
tests_check_train_CFLAGS = $(TEST_CFLAGS) $(HDF5_CFLAGS) $(ZLIB_CFLAGS)
tests_check_train_LDADD = $(TEST_LIBS) $(HDF5_LIBS) $(ZLIB_LIBS)
endif
EXTRA_DIST += tests/kfac_ref.py
