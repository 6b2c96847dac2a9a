# session/: Scaffold, SessionManager, MonitoredSession, Coordinator.
# MonitoredSession: monitored.c (construction, the step, close) over
# recover.c (creation and recovery), hook_calls.c (calling the hooks),
# step.c (the step and replicas) and stop.c (stops), sharing
# monitored_int.h.
libkeel_core_la_SOURCES += session/session_int.h session/step_pool.h \
	session/chain.c \
	session/coord.c session/manager.c \
	session/monitored_int.h session/monitored.c session/recover.c \
	session/hook_calls.c session/step.c session/stop.c \
	session/signal.c
pkginclude_HEADERS += include/keel/session.h

check_PROGRAMS += tests/session_child
tests_session_child_SOURCES = tests/session_child.c tests/linefit.h
tests_session_child_LDADD = libkeel_core.la

check_PROGRAMS += bench/hooks_bench
bench_hooks_bench_SOURCES = bench/hooks_bench.c $(BENCH_UTIL)
bench_hooks_bench_LDADD = libkeel_core.la

if HAVE_CHECK
SUITES += tests/check_session
tests_check_session_SOURCES = tests/check_session.c tests/fake_ckpt.c \
	tests/fake_ckpt.h

SUITES += tests/it_sigterm
endif
