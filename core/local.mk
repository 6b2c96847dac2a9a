# core/: tensors, the variable store, optimizers, the thread pool, the
# reduction tree and the vectorized kernels everything above adds with.
libkeel_core_la_SOURCES += core/core_int.h core/vars_int.h \
	core/tensor.c core/vars.c core/optim.c core/pool.c core/reduce_tree.c \
	core/kernels.c
pkginclude_HEADERS += include/keel/optimizer.h

if HAVE_CHECK
SUITES += tests/check_core
endif
