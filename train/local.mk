# train/: core types (tensors, variables), layers, optimizers, data.
if HAVE_CHECK
check_PROGRAMS += tests/check_core
TESTS += tests/check_core
tests_check_core_SOURCES = tests/check_core.c
tests_check_core_CFLAGS = $(TEST_CFLAGS)
tests_check_core_LDADD = $(TEST_LIBS)
endif
