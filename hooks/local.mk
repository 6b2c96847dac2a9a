# hooks/: the standard session-run hooks, TensorBoard event files, traces.
libkeel_core_la_SOURCES += hooks/hooks_int.h hooks/chain.c hooks/basic.c \
	hooks/ckpt_hook.c hooks/summary.c hooks/ckpt_ops.c hooks/events_api.h \
	hooks/events_stub.c
pkginclude_HEADERS += include/keel/hooks.h
