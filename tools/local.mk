# tools/: the keel CLI. Verbs live in tools/cmd_<verb>.c.
# What several verbs share is in tools/cli.c (cli.h), which Makefile.am lists
# with tools/keel.c.
keel_SOURCES += tools/cmd_config.c tools/cmd_train.c tools/cmd_eval.c \
	tools/cmd_ckpt.c tools/cmd_keygen.c tools/cmd_launch.c \
	tools/cmd_export.c tools/cmd_predict.c tools/cmd_version.c \
	tools/mpirun.c tools/mpirun.h

if HAVE_CHECK
SUITES += tests/it_train
tests_it_train_CFLAGS = $(TEST_CFLAGS) $(HDF5_CFLAGS)
tests_it_train_LDADD = $(TEST_LIBS) $(HDF5_LIBS)

# it_mpi: multi_worker_mirrored under mpirun and keel launch (skipped
# without MPI).
SUITES += tests/it_mpi
tests_it_mpi_SOURCES = tests/it_mpi.c tools/mpirun.c tools/mpirun.h

# it_eval: the evaluator task, read leases, TF_CONFIG model_dir and
# `keel launch --evaluator` with real processes.
SUITES += tests/it_eval

SUITES += tests/check_cli
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
TESTS += tests/it_custom_step.sh tests/it_sync_supervisor.sh \
	tests/docs_commands.sh
EXTRA_DIST += tests/it_custom_step.sh tests/it_sync_supervisor.sh \
	tests/docs_commands.sh

# it_export: keel export (keras-h5, safetensors, onnx), keel predict, keel
# eval CKPT.h5 and the per-epoch workflow, read by independent Python.
TESTS += tests/it_export.sh
EXTRA_DIST += tests/it_export.sh tests/it_export.py

# it_export_any: keel export of checkpoints keel train did not write:
# examples/custom_step's (safetensors; the error for keras-h5 and onnx) and
# tests/export_desc's, a program that describes its own model.
check_PROGRAMS += tests/export_desc
tests_export_desc_SOURCES = tests/export_desc.c
tests_export_desc_LDADD = libkeel.la
TESTS += tests/it_export_any.sh
EXTRA_DIST += tests/it_export_any.sh tests/it_export_any.py

# it_launch_program: the examples built against an installed keel with
# pkg-config, run as clusters by `keel launch -- PROGRAM` (kills, restore).
TESTS += tests/it_launch_program.sh
EXTRA_DIST += tests/it_launch_program.sh
# examples/embedding: a click model on hashed features in an embedding
# table (gradient rows, lazy Adagrad), alone and on 4 ps.
check_PROGRAMS += examples/embedding
examples_embedding_SOURCES = examples/embedding.c
examples_embedding_LDADD = libkeel.la -lm
TESTS += tests/it_embedding.sh
EXTRA_DIST += tests/it_embedding.sh examples/make_clicks.py
