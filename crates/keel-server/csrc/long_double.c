/*
 * INCRBYFLOAT's arithmetic exactly as Redis does it: the platform's C long double, strtold to
 * read the operands and printf's "%.17Lf" with trailing zeros trimmed to write the result
 * (Redis's string2ld and ld2string in LD_STR_HUMAN mode, src/util.c). On x86-64 a long double
 * is the x87 80-bit format, which Rust has no type for; calling the same C library is the only
 * way to give the same digits (10.5 + 0.1 is "10.6", 1000 + 10.7 is "1010.69999999999999996").
 *
 * This file keeps no state and allocates nothing.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Redis's MAX_LONG_DOUBLE_CHARS: the longest operand it reads, and the result buffer. */
#define KEEL_LD_CHARS_MAX (5 * 1024)

/* Redis's string2ld: 1 and the value in *out, or 0 if s is not a float Redis accepts. */
static int keel_ld_parse(const unsigned char *s, size_t len, long double *out) {
    char buf[KEEL_LD_CHARS_MAX];
    char *end;
    long double value;

    if (len == 0 || len >= sizeof(buf)) return 0;
    memcpy(buf, s, len);
    buf[len] = '\0';
    errno = 0;
    value = strtold(buf, &end);
    if (isspace((unsigned char)buf[0]) || end[0] != '\0' || (size_t)(end - buf) != len ||
        (errno == ERANGE &&
         (value == HUGE_VAL || value == -HUGE_VAL || fpclassify(value) == FP_ZERO)) ||
        errno == EINVAL || isnan(value))
        return 0;
    *out = value;
    return 1;
}

/* Whether s is a float Redis accepts: 0 if not, 1 if finite, 2 if infinite. */
int keel_ld_classify(const unsigned char *s, size_t len) {
    long double value;

    if (!keel_ld_parse(s, len, &value)) return 0;
    return isinf(value) ? 2 : 1;
}

/*
 * current (absent when has_current is 0) plus incr, written to out (out_cap bytes, at least
 * KEEL_LD_CHARS_MAX). Returns the text's length; -1 if the sum is not finite, -2 if current
 * is not a float (read first, as Redis does), -3 if incr is not.
 */
long keel_ld_incr(const unsigned char *current, size_t current_len, int has_current,
                  const unsigned char *incr, size_t incr_len, char *out, size_t out_cap) {
    long double value = 0, by;
    int len;

    if (out_cap < KEEL_LD_CHARS_MAX) return -3;
    if (has_current && !keel_ld_parse(current, current_len, &value)) return -2;
    if (!keel_ld_parse(incr, incr_len, &by)) return -3;
    value += by;
    if (isnan(value) || isinf(value)) return -1;
    /* Redis's ld2string in LD_STR_HUMAN mode. */
    len = snprintf(out, out_cap, "%.17Lf", value);
    if (len <= 0 || (size_t)len + 1 > out_cap) return -1;
    if (strchr(out, '.') != NULL) {
        while (out[len - 1] == '0') len--;
        if (out[len - 1] == '.') len--;
    }
    if (len == 2 && out[0] == '-' && out[1] == '0') {
        out[0] = '0';
        len = 1;
    }
    return len;
}
