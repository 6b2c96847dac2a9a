/* version.c - the version of this libkeel (keel/version.h). */
#include <config.h>

#include <keel/version.h>

#include "util.h"

const char *
keel_version(void)
{
    return KEEL_VERSION_STRING;
}

int
keel_version_number(void)
{
    return KEEL_VERSION;
}

keel_status
keel_version_check(int major, int minor)
{
    int ok = major == KEEL_VERSION_MAJOR &&
             (major == 0 ? minor == KEEL_VERSION_MINOR
                         : minor <= KEEL_VERSION_MINOR);
    if (!ok)
        return keel__fail(KEEL_EINVAL, "the program was built against keel "
                          "%d.%d headers but runs with libkeel %s, which "
                          "does not serve them; rebuild it against libkeel "
                          "%s or install a libkeel %d.%d", major, minor,
                          KEEL_VERSION_STRING, KEEL_VERSION_STRING,
                          major, minor);
    return KEEL_OK;
}
