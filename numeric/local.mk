# numeric/: tensors, the variable store, optimizers, the thread pool, the
# reduction tree and the vectorized kernels everything above adds with.
libkeel_core_la_SOURCES += numeric/numeric_int.h numeric/vars_int.h \
	numeric/tensor.c numeric/vars.c numeric/optim.c numeric/pool.c numeric/reduce_tree.c \
	numeric/kernels.c
pkginclude_HEADERS += include/keel/optimizer.h

if HAVE_CHECK
SUITES += tests/check_core
endif
