# supervise/: MonitoredTrainingSession and the Supervisor, over the session,
# the standard hooks and the cluster's worker backend.
libkeel_core_la_SOURCES += supervise/supervise_int.h supervise/training.c \
	supervise/supervisor.c supervise/kfac_dist.c
pkginclude_HEADERS += include/keel/supervise.h include/keel/kfac_dist.h
