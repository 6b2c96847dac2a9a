/* fuzz_config.c - the INI job configuration: parse, validate, dump. */
#include <config.h>

#include <stdlib.h>

#include <keel/config.h>
#include "fuzz_util.h"

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = fuzz_strndup(data, size);
    keel_config *cfg = NULL;
    if (keel_config_new(&cfg) != KEEL_OK)
        abort();
    if (keel_config_load_text(cfg, text, "fuzz.ini") == KEEL_OK &&
        keel_config_validate(cfg) == KEEL_OK) {
        char *dump = NULL;
        if (keel_config_dump(cfg, 1, &dump) == KEEL_OK)
            free(dump);
    }
    keel_config_free(cfg);
    free(text);
    return 0;
}
