/* Strict number parsing and field splitting for fusion's text formats and the tools. */
#include "base/textio.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Decimal notation only: strtod alone would also take hex floats ("0x1p3"), "inf", "nan" and
 * leading blanks, none of which a person means in a setting or a measured file. */
int dear_text_double(const char *s, double lo, double hi, double *v)
{
    char *end;
    if (s[0] == '\0' || s[strspn(s, "0123456789+-.eE")] != '\0')
        return -1;
    errno = 0;
    double x = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(x) || x < lo || x > hi)
        return -1;
    *v = x;
    return 0;
}

int dear_text_long(const char *s, long lo, long hi, long *v)
{
    char *end;
    errno = 0;
    long x = strtol(s, &end, 10);
    if (errno || end == s || *end || x < lo || x > hi)
        return -1;
    *v = x;
    return 0;
}

int dear_text_int(const char *s, int *v)
{
    long x;
    if (dear_text_long(s, INT_MIN, INT_MAX, &x) != 0)
        return -1;
    *v = (int)x;
    return 0;
}

int dear_text_size(const char *s, size_t *v)
{
    char *end;
    errno = 0;
    if (*s == '-')
        return -1;
    unsigned long long x = strtoull(s, &end, 10);
    if (errno || end == s || *end || x > SIZE_MAX)
        return -1;
    *v = (size_t)x;
    return 0;
}

int dear_text_fields(char *s, char **f, int max)
{
    int n = 0;
    char *save = NULL;
    for (char *tok = strtok_r(s, " \t\r\n", &save); tok; tok = strtok_r(NULL, " \t\r\n", &save)) {
        if (n == max)
            return max + 1;
        f[n++] = tok;
    }
    return n;
}
