# train/: the model library on numeric/: layers, models, K-FAC, Hogwild, data.
# The model: model.c (building it), model_run.c (running it) and
# model_desc.c (its architecture record, on model.c), sharing model_int.h.
# Data: dataset.c (the handle) under the readers data_idx.c, data_hdf5.c
# and data_inputs.c (any format, on those two), and data.c (examples and
# batches) on top, sharing data_int.h.
# K-FAC: kfac.c (the optimizer and its update) on kfac_inverse.c (damping,
# inverses) on kfac_factors.c (the factors' statistics), sharing
# kfac_int.h; kfac_layers.c holds the layer collection.
libkeel_core_la_SOURCES += train/train_int.h \
	train/layers.c train/embedding.c \
	train/model_int.h train/model.c train/model_run.c train/model_desc.c \
	train/hogwild.c train/kfac_int.h train/kfac.c train/kfac_inverse.c \
	train/kfac_factors.c train/kfac_layers.c \
	train/data_int.h train/dataset.c train/data_idx.c train/data_hdf5.c \
	train/data_inputs.c train/data.c
pkginclude_HEADERS += include/keel/train.h include/keel/kfac.h

# Throughput / accuracy benchmark (bench/train.sh runs it); not installed.
EXTRA_PROGRAMS += bench/train_bench
bench_train_bench_SOURCES = bench/train_bench.c $(BENCH_UTIL)
bench_train_bench_CPPFLAGS = $(AM_CPPFLAGS) $(OPENBLAS_CFLAGS)
bench_train_bench_LDADD = libkeel_core.la

# OpenBLAS sgemm on the MLP step's shapes (by hand: make bench/sgemm_shapes).
EXTRA_PROGRAMS += bench/sgemm_shapes
bench_sgemm_shapes_SOURCES = bench/sgemm_shapes.c $(BENCH_UTIL)
bench_sgemm_shapes_CPPFLAGS = $(AM_CPPFLAGS) $(OPENBLAS_CFLAGS)
bench_sgemm_shapes_LDADD = libkeel_core.la $(OPENBLAS_LIBS)

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
