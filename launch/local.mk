# launch/: `keel launch`, the local cluster launcher (spawn, relay, status,
# restarts, stop order, chaos): launch.c on launch_chaos.c on
# launch_stop.c on launch_task.c (a task's process and output) on
# launch_status.c, sharing launch_int.h.
libkeel_core_la_SOURCES += launch/launch_int.h launch/launch.c \
	launch/launch_chaos.c launch/launch_stop.c launch/launch_task.c \
	launch/launch_status.c
pkginclude_HEADERS += include/keel/launch.h

if HAVE_CHECK
SUITES += tests/it_launch
endif
