#include <config.h>
#include "testutil.h"
static Suite *s(void){ Suite *x = suite_create("cluster"); return x;}
KEEL_TEST_MAIN(s)
