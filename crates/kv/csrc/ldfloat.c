/* Redis's INCRBYFLOAT / HINCRBYFLOAT arithmetic, in C because Redis computes and prints it in
 * `long double` (x87 80-bit here), which Rust has no type for: a reply that differs from
 * Redis's in the last digits (0.1 + 0.2 prints 0.3 there, 0.30000000000000004 in a double) is
 * not Redis's. Parsing follows Redis 7.0's string2ld (strtold, the whole buffer, no leading
 * space, no overflow to infinity, no NaN); printing its ld2string(LD_STR_HUMAN): "%.17Lf"
 * without trailing zeros (and "-0" as "0"). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LONG_DOUBLE_CHARS (5 * 1024)

static int string2ld(const char *s, size_t slen, long double *dp) {
    char buf[MAX_LONG_DOUBLE_CHARS];
    long double value;
    char *eptr;
    if (slen == 0 || slen >= sizeof(buf)) return 0;
    memcpy(buf, s, slen);
    buf[slen] = '\0';
    errno = 0;
    value = strtold(buf, &eptr);
    if (isspace((unsigned char)buf[0]) || eptr[0] != '\0' ||
        (errno == ERANGE && (value == HUGE_VALL || value == -HUGE_VALL || fpclassify(value) == FP_ZERO)) ||
        errno == EINVAL || isnan(value))
        return 0;
    *dp = value;
    return 1;
}

/* cur + by into out (at least MAX_LONG_DOUBLE_CHARS bytes). Returns the length written, or:
 * -1 cur is not a float, -2 by is not a float, -3 the sum is NaN or infinite, -4 no room. */
int tiermem_kv_ld_add(const char *cur, size_t curlen, const char *by, size_t bylen, char *out,
                      size_t outlen) {
    long double a, b, v;
    int l;
    if (!string2ld(cur, curlen, &a)) return -1;
    if (!string2ld(by, bylen, &b)) return -2;
    v = a + b;
    if (isnan(v) || isinf(v)) return -3;
    l = snprintf(out, outlen, "%.17Lf", v);
    if (l < 0 || (size_t)l + 1 > outlen) return -4;
    if (strchr(out, '.') != NULL) {
        char *p = out + l - 1;
        while (*p == '0') {
            p--;
            l--;
        }
        if (*p == '.') l--;
    }
    if (l == 2 && out[0] == '-' && out[1] == '0') {
        out[0] = '0';
        l = 1;
    }
    return l;
}
