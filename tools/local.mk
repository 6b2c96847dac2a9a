# tools/: the keel CLI. Verbs live in tools/cmd_<verb>.c.
keel_SOURCES += tools/cmd_config.c tools/cmd_train.c
if HAVE_CHECK
check_PROGRAMS += tests/check_cli
TESTS += tests/check_cli
tests_check_cli_SOURCES = tests/check_cli.c
tests_check_cli_CFLAGS = $(TEST_CFLAGS)
tests_check_cli_LDADD = $(TEST_LIBS)
endif
keel_SOURCES += tools/cmd_ckpt.c
keel_SOURCES += tools/cmd_keygen.c
