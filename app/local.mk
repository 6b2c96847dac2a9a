# app/: the trainer application on the public API: the INI config schema,
# `keel train` (job*.c), the evaluator task, export and inference.
libkeel_core_la_SOURCES += app/app_int.h app/config_int.h \
	app/config_keys.c app/config.c app/config_load.c app/config_validate.c \
	app/job_int.h app/job.c app/job_cluster.c app/job_hooks.c \
	app/job_step.c app/job_build.c app/job_data.c \
	app/evaluator.c app/export.c app/onnx.c app/describe.c \
	app/kfac_dist.c
pkginclude_HEADERS += include/keel/app.h include/keel/config.h \
	include/keel/job.h include/keel/export.h
