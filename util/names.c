/* names.c - an enum's value from its name: the lookup behind every
 * keel_<enum>_from_name() built with KEEL__FROM_NAME (util.h). */
#include <config.h>

#include <string.h>

#include "util.h"

keel_status
keel__name_lookup(const char *what, const char *name,
                  const char *const *names, int n, int *out)
{
    char list[128] = "";
    for (int i = 0; i < n; i++)
        if (name != NULL && strcmp(name, names[i]) == 0) {
            *out = i;
            return KEEL_OK;
        }
    for (int i = 0; i < n; i++) {
        strncat(list, names[i], sizeof list - strlen(list) - 1);
        if (i + 1 < n)
            strncat(list, ", ", sizeof list - strlen(list) - 1);
    }
    return keel__fail(KEEL_EINVAL, "unknown %s '%s' (valid: %s)", what,
                      name != NULL ? name : "(null)", list);
}
