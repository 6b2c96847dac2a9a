# examples/kfac_user: a user's own MLP trained with K-FAC through the layer
# collection (keel/kfac.h), alone and on a cluster; run by `make check`.
check_PROGRAMS += examples/kfac_user
examples_kfac_user_SOURCES = examples/kfac_user.c
examples_kfac_user_CPPFLAGS = $(AM_CPPFLAGS) $(OPENBLAS_CFLAGS)
examples_kfac_user_LDADD = libkeel.la $(OPENBLAS_LIBS) -lm
TESTS += tests/it_kfac_user.sh
EXTRA_DIST += tests/it_kfac_user.sh
