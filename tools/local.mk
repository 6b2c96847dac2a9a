# tools/: the keel CLI. Verbs live in tools/cmd_<verb>.c.
keel_SOURCES += tools/cmd_config.c tools/cmd_train.c tools/cmd_ckpt.c \
	tools/cmd_keygen.c tools/cmd_launch.c tools/cmd_export.c

if HAVE_CHECK
check_PROGRAMS += tests/it_train
TESTS += tests/it_train
tests_it_train_SOURCES = tests/it_train.c
tests_it_train_CFLAGS = $(TEST_CFLAGS)
tests_it_train_LDADD = $(TEST_LIBS)

# it_mpi: multi_worker_mirrored under mpirun and keel launch (skipped
# without MPI).
check_PROGRAMS += tests/it_mpi
TESTS += tests/it_mpi
tests_it_mpi_SOURCES = tests/it_mpi.c
tests_it_mpi_CFLAGS = $(TEST_CFLAGS)
tests_it_mpi_LDADD = $(TEST_LIBS)

# it_eval: the evaluator task, read leases, TF_CONFIG model_dir and
# `keel launch --evaluator` with real processes.
check_PROGRAMS += tests/it_eval
TESTS += tests/it_eval
tests_it_eval_SOURCES = tests/it_eval.c
tests_it_eval_CFLAGS = $(TEST_CFLAGS)
tests_it_eval_LDADD = $(TEST_LIBS)

check_PROGRAMS += tests/check_cli
TESTS += tests/check_cli
tests_check_cli_SOURCES = tests/check_cli.c
tests_check_cli_CFLAGS = $(TEST_CFLAGS)
tests_check_cli_LDADD = $(TEST_LIBS)
endif

# examples/custom_step: a user's own model and step on the public API,
# built against libkeel.la and run by `make check`.
check_PROGRAMS += examples/custom_step
examples_custom_step_SOURCES = examples/custom_step.c
examples_custom_step_LDADD = libkeel.la
# examples/sync_supervisor: the Supervisor with SyncReplicas on a cluster.
check_PROGRAMS += examples/sync_supervisor
examples_sync_supervisor_SOURCES = examples/sync_supervisor.c
examples_sync_supervisor_LDADD = libkeel.la -lm
TESTS += tests/it_custom_step.sh
EXTRA_DIST += tests/it_custom_step.sh

# it_export: keel export (keras-h5, safetensors, onnx), keel predict, keel
# eval CKPT.h5 and the per-epoch workflow, read by independent Python.
TESTS += tests/it_export.sh
EXTRA_DIST += tests/it_export.sh tests/it_export.py

# it_launch_program: the examples built against an installed keel with
# pkg-config, run as clusters by `keel launch -- PROGRAM` (kills, restore).
TESTS += tests/it_launch_program.sh
EXTRA_DIST += tests/it_launch_program.sh
