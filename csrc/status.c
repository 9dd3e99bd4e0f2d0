/* status.c: the per-thread message behind the last failed engine call.
 *
 * The engine never prints; the binding reads nd_last_error() when a call
 * returns a status other than ND_OK and turns both into an exception.
 */
#include "internal.h"

#include <stdio.h>

static _Thread_local char last_error[512] = "no error";

const char *nd_last_error(void) { return last_error; }

nd_status nd_fail(nd_status status, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, args);
    va_end(args);
    return status;
}
