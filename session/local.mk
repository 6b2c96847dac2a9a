# session/: Scaffold, SessionManager, MonitoredSession, Coordinator.
libkeel_core_la_SOURCES += session/session_int.h session/step_pool.h \
	session/chain.c \
	session/coord.c session/manager.c session/monitored.c \
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
