/* cuda_arch.c: whether a GPU can run what a CUDA build embeds (see
 * cuda_arch.h), and the advice when it cannot. Never prints, exits or aborts.
 */
#include "cuda_arch.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* CUDA 13 removed code generation for Maxwell, Pascal and Volta (sm_50 to
 * sm_72); CUDA 12 builds from sm_50, and needle's CUDA 12 default starts at
 * the V100 (sm_70). */
#define CUDA13_OLDEST_ARCH 75
#define CUDA12_OLDEST_ARCH 50
#define CUDA12_DEFAULT_OLDEST_ARCH 70
#define MAX_ARCHS 32

typedef struct arch {
    int number;   /* 10 * major + minor: 75, 90, 100, 121 */
    char variant; /* '\0', 'a' (this GPU only) or 'f' (this family) */
} arch;

/* Reads one "75" / "90a" / "100f" at *text; 1 on success (text advanced). */
static int read_arch(const char **text, arch *out) {
    const char *p = *text;
    int digits = 0, number = 0;
    while (isdigit((unsigned char)*p) && digits < 4) number = number * 10 + (*p++ - '0'), digits++;
    if (digits < 2 || digits > 3) return 0;
    out->number = number;
    out->variant = '\0';
    if (*p == 'a' || *p == 'f') out->variant = *p++;
    if (*p != '\0' && *p != ' ') return 0;
    *text = p;
    return 1;
}

/* Parses a space-separated list into out (at most MAX_ARCHS); the count, or
 * -1 when malformed. */
static int read_archs(const char *text, arch *out) {
    int n = 0;
    while (*text != '\0') {
        if (*text == ' ') {
            text++;
            continue;
        }
        if (n == MAX_ARCHS || !read_arch(&text, &out[n])) return -1;
        n++;
    }
    return n;
}

/* May code compiled for `built` run on a GPU of capability `gpu` (10 * major
 * + minor)? SASS needs the same major; PTX may be compiled for newer ones. */
static int runs_on(arch built, int gpu, int is_ptx) {
    int same_major = built.number / 10 == gpu / 10;
    if (built.variant == 'a') return built.number == gpu;
    if (built.variant == 'f' || !is_ptx) return same_major && gpu >= built.number;
    return gpu >= built.number;
}

/* "sm_75..sm_90" when the list spans every major between its ends, else each
 * one ("sm_75, sm_90a"). */
static void describe(char *buf, size_t size, const arch *list, int n) {
    int lo = 0, hi = 0;
    for (int i = 1; i < n; i++) {
        if (list[i].number < list[lo].number) lo = i;
        if (list[i].number > list[hi].number) hi = i;
    }
    int contiguous = n > 2;
    for (int m = list[lo].number / 10; contiguous && m <= list[hi].number / 10; m++) {
        int seen = 0;
        for (int i = 0; i < n; i++) seen |= list[i].number / 10 == m;
        contiguous = seen;
    }
    size_t used = 0;
    buf[0] = '\0';
    if (contiguous) {
        snprintf(buf, size, "sm_%d..sm_%d", list[lo].number, list[hi].number);
        return;
    }
    for (int i = 0; i < n && used < size; i++) {
        int w = snprintf(buf + used, size - used, "%ssm_%d%.1s", i ? ", " : "", list[i].number,
                         list[i].variant ? &list[i].variant : "");
        if (w < 0) return;
        used += (size_t)w;
    }
}

int nd_cuda_arch_check(const char *sass, const char *ptx, int toolkit_major, int major, int minor,
                       char *why, size_t why_size) {
    arch built[MAX_ARCHS], ptx_arch[1];
    if (why_size > 0) why[0] = '\0';
    int n = sass ? read_archs(sass, built) : -1;
    int n_ptx = ptx ? read_archs(ptx, ptx_arch) : -1;
    if (n <= 0 || n_ptx < 0 || n_ptx > 1) {
        snprintf(why, why_size,
                 "the build's architecture lists are malformed (SASS '%.100s', PTX '%.20s'): "
                 "expected numbers such as '75 80 90a' and one or none",
                 sass ? sass : "(null)", ptx ? ptx : "(null)");
        return -1;
    }
    if (major < 1 || minor < 0 || minor > 9 || major > 99) {
        snprintf(why, why_size, "compute capability %d.%d is not one a GPU reports", major, minor);
        return -1;
    }
    int gpu = major * 10 + minor;
    for (int i = 0; i < n; i++)
        if (runs_on(built[i], gpu, 0)) return 1;
    if (n_ptx == 1 && runs_on(ptx_arch[0], gpu, 1)) return 1;

    char have[200];
    describe(have, sizeof have, built, n);
    int oldest = built[0].number;
    for (int i = 1; i < n; i++)
        if (built[i].number < oldest) oldest = built[i].number;
    char advice[200];
    if (gpu < CUDA12_OLDEST_ARCH)
        snprintf(advice, sizeof advice,
                 "no CUDA toolkit needle builds with compiles for it (CUDA 12 starts at sm_%d)",
                 CUDA12_OLDEST_ARCH);
    else if (toolkit_major >= 13 && gpu < CUDA13_OLDEST_ARCH)
        snprintf(advice, sizeof advice, "rebuild with CUDA 12%s (CUDA %d cannot compile for sm_%d)",
                 gpu < CUDA12_DEFAULT_OLDEST_ARCH ? " and NEEDLE_CUDA_ARCH naming it" : "",
                 toolkit_major, gpu);
    else if (gpu > oldest && n_ptx == 0)
        snprintf(advice, sizeof advice,
                 "the build embeds no PTX the driver could compile for it: rebuild with sm_%d in "
                 "NEEDLE_CUDA_ARCH",
                 gpu);
    else snprintf(advice, sizeof advice, "rebuild with sm_%d in NEEDLE_CUDA_ARCH", gpu);
    snprintf(why, why_size, "needle was built for %s; this GPU is sm_%d: %s", have, gpu, advice);
    return 0;
}
