/* Status strings and the library version: the only text a caller needs to explain a code. */
#include "include/dear_types.h"

const char *dear_status_string(int status)
{
    switch (status) {
#define DEAR_STATUS_TEXT_(NAME, CODE, TEXT)                                                    \
    case DEAR_##NAME: return TEXT;
        DEAR_STATUS_MAP(DEAR_STATUS_TEXT_)
#undef DEAR_STATUS_TEXT_
    default: return "unknown status code";
    }
}

#define DEAR_STR2(x) #x
#define DEAR_STR(x) DEAR_STR2(x)

const char *dear_version(void)
{
    return DEAR_STR(DEAR_VERSION_MAJOR) "." DEAR_STR(DEAR_VERSION_MINOR) "." DEAR_STR(DEAR_VERSION_PATCH);
}
