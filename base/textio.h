/* Strict parsing of the words in fusion's text files (profiles, plans, calibration caches) and
 * in the tools' arguments: a word is accepted only if all of it is a number in range, so a
 * typo is an error naming the line instead of a silently truncated value. */
#ifndef DEAR_FUSION_TEXTIO_H
#define DEAR_FUSION_TEXTIO_H

#include <stddef.h>

/* A finite number in [lo, hi]: 0, or -1 with *v untouched. */
int dear_text_double(const char *s, double lo, double hi, double *v);
/* A decimal integer in [lo, hi]: 0, or -1 with *v untouched. */
int dear_text_long(const char *s, long lo, long hi, long *v);
/* dear_text_long over the whole int range. */
int dear_text_int(const char *s, int *v);
/* A non-negative decimal integer: 0, or -1 with *v untouched. */
int dear_text_size(const char *s, size_t *v);
/* Split s in place at blanks into at most max fields; returns the count, max + 1 if more. */
int dear_text_fields(char *s, char **f, int max);

#endif
