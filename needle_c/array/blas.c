/* blas.c: finds a BLAS sgemm for the CPU backend at import time.
 *
 * NumPy wheels ship OpenBLAS (symbols prefixed scipy_, 64-bit ints); using
 * it gives NumPy's matmul speed with no extra dependency. Elsewhere a system
 * OpenBLAS/CBLAS is tried, and without any the engine keeps its own GEMM.
 * NEEDLE_BLAS=0 forces the engine's GEMM; any value but 0, 1 or empty is a ValueError at
 * import (config.h's choice parser).
 */
#include "runtime.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"

enum { CBLAS_ROW_MAJOR = 101, CBLAS_NO_TRANS = 111, CBLAS_TRANS = 112 };

/* What was found lives in the runtime (needle_rt.blas): the engine calls the
 * adapters below with no module at hand. */

static void call_sgemm64(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc) {
    needle_rt.blas.sgemm64(CBLAS_ROW_MAJOR, ta ? CBLAS_TRANS : CBLAS_NO_TRANS,
                           tb ? CBLAS_TRANS : CBLAS_NO_TRANS, m, n, k, alpha, a, lda, b, ldb, beta,
                           c, ldc);
}

static void call_sgemm32(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                         float *c, int64_t ldc) {
    needle_rt.blas.sgemm32(CBLAS_ROW_MAJOR, ta ? CBLAS_TRANS : CBLAS_NO_TRANS,
                           tb ? CBLAS_TRANS : CBLAS_NO_TRANS, (int)m, (int)n, (int)k, alpha, a,
                           (int)lda, b, (int)ldb, beta, c, (int)ldc);
}

/* 32-bit CBLAS cannot take dims past INT_MAX; those go to needle's GEMM. */
static void call_sgemm32_checked(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                                 const float *a, int64_t lda, const float *b, int64_t ldb,
                                 float beta, float *c, int64_t ldc) {
    const int64_t big = 0x7fffffff;
    if (m > big || n > big || k > big || lda > big || ldb > big || ldc > big)
        nd_cpu_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    else call_sgemm32(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

static int try_library(const char *path) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) return 0;
    void *sym = dlsym(lib, "scipy_cblas_sgemm64_");
    if (sym == NULL) sym = dlsym(lib, "cblas_sgemm64_");
    if (sym != NULL) {
        needle_rt.blas.sgemm64 = (needle_cblas_sgemm64)sym;
        nd_cpu_set_sgemm(call_sgemm64);
        snprintf(needle_rt.blas.description, sizeof needle_rt.blas.description,
                 "OpenBLAS (ILP64) from %s", path);
        return 1;
    }
    sym = dlsym(lib, "cblas_sgemm");
    if (sym != NULL) {
        needle_rt.blas.sgemm32 = (needle_cblas_sgemm32)sym;
        nd_cpu_set_sgemm(call_sgemm32_checked);
        snprintf(needle_rt.blas.description, sizeof needle_rt.blas.description, "CBLAS from %s",
                 path);
        return 1;
    }
    dlclose(lib);
    return 0;
}

/* The numpy.libs folder beside the installed numpy package. */
static int try_numpy_libs(void) {
    PyObject *numpy = PyImport_ImportModule("numpy");
    if (numpy == NULL) {
        PyErr_Clear();
        return 0;
    }
    PyObject *file = PyObject_GetAttrString(numpy, "__file__");
    Py_DECREF(numpy);
    const char *path = file ? PyUnicode_AsUTF8(file) : NULL;
    if (path == NULL) {
        PyErr_Clear();
        Py_XDECREF(file);
        return 0;
    }
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    Py_DECREF(file);
    /* .../site-packages/numpy/__init__.py -> .../site-packages/numpy.libs */
    char *slash = strrchr(dir, '/');
    if (slash == NULL) return 0;
    *slash = '\0';
    size_t len = strlen(dir);
    if (len + 6 >= sizeof dir) return 0;
    strcat(dir, ".libs");
    DIR *d = opendir(dir);
    if (d == NULL) return 0;
    int found = 0;
    struct dirent *entry;
    while (!found && (entry = readdir(d)) != NULL) {
        if (strstr(entry->d_name, "openblas") == NULL || strstr(entry->d_name, ".so") == NULL)
            continue;
        char full[4608];
        snprintf(full, sizeof full, "%s/%s", dir, entry->d_name);
        found = try_library(full);
    }
    closedir(d);
    return found;
}

int install_blas(void) {
    int choice = 1; /* the table's "0|1": 0 is needle's own GEMM */
    if (nd_config_choice(ND_CFG_BLAS, &choice) < 0) {
        PyErr_SetString(PyExc_ValueError, nd_last_error());
        return -1;
    }
    if (choice == 0) {
        nd_cpu_set_sgemm(NULL);
        snprintf(needle_rt.blas.description, sizeof needle_rt.blas.description,
                 "needle's built-in GEMM (NEEDLE_BLAS=0)");
        return 0;
    }
    if (try_numpy_libs()) return 0;
    static const char *candidates[] = {"libopenblas.so.0", "libopenblas.so", "libcblas.so.3",
                                       "libblas.so.3"};
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++)
        if (try_library(candidates[i])) return 0;
    return 0;
}


static PyObject *module_blas(PyObject *module, PyObject *Py_UNUSED(ignored)) {
    (void)module;
    return PyUnicode_FromString(needle_rt.blas.description);
}

PyMethodDef blas_module_functions[] = {
    {"_blas", module_blas, METH_NOARGS, "_blas()\n--\n\nWhich GEMM the CPU backend uses."},
    {NULL, NULL, 0, NULL},
};
