/* cuda_cublas.cu: cuBLAS for the CUDA backend's matmul: finds and loads the
 * library at run time, keeps one handle per GPU whose workspace comes from
 * needle's caching allocator, and runs its strided and pointer-array
 * batched GEMMs in every dtype (float32: cublasSgemm*, float64:
 * cublasDgemm*, float16 and bfloat16: cublasGemm*Ex with float accumulation,
 * CUBLAS_COMPUTE_32F, on tensor cores where the GPU has them), turning
 * cuBLAS's allocation failures into the engine's out-of-memory status. Each
 * GEMM call is counted in the census (cuda_census.cu).
 *
 * A NEEDLE_CUDA=sim build uses the simulator's cuBLAS stand-in
 * (sim/sim_cublas.h, computed on the CPU) in place of the library, so that
 * CI runs this file's handle, workspace, batching and ladder code as a GPU
 * does; NEEDLE_CUBLAS=0 still selects needle's kernel there.
 *
 * cuBLAS is loaded with dlopen rather than linked, so that the extension
 * imports (and the rest of the backend runs) where cuBLAS is not installed.
 * Where it looks, in order: NEEDLE_CUBLAS=<path> (0 forces needle's kernel),
 * the library setup.py found at build time, the directories the host names
 * (nd_cuda_set_cublas_dirs: needle's Python layer passes the lib directory of
 * a pip-installed nvidia-cublas wheel), then the loader's path.
 *
 * Memory: cublasSetWorkspace gives each handle a workspace taken from the
 * GPU's caching allocator (reserved, so it shows in memory_reserved and
 * counts against a limit; never "allocated", so a test's allocated bytes do
 * not grow by it). The handle, the workspace and each GEMM may fail for want
 * of memory (cuBLAS's own cudaMalloc: CUBLAS_STATUS_ALLOC_FAILED): each is
 * ND_ERR_OOM, retried through the engine's ladder (release the cache,
 * collect, retry). A handle or workspace still out of reach after it only
 * makes the caller use needle's kernel for a while (backing off), never for
 * good; a cuBLAS that cannot run at all (too new for the driver, wrong
 * architecture) does make the kernel permanent for that GPU, as the
 * description says. Never prints, exits or aborts.
 */
#include "../config.h"
#include "cuda_common.cuh"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The few cuBLAS v2 declarations used, with their C ABI types (enums are
 * ints): cublasStatus_t 0 = success, 3 = alloc failed. */
typedef int (*cublas_create_fn)(nd_cublas_handle *handle);
typedef int (*cublas_set_stream_fn)(nd_cublas_handle handle, cudaStream_t stream);
typedef int (*cublas_set_workspace_fn)(nd_cublas_handle handle, void *workspace, size_t bytes);
typedef int (*cublas_sgemm_strided_fn)(nd_cublas_handle handle, int transa, int transb, int m,
                                       int n, int k, const float *alpha, const float *a, int lda,
                                       long long stride_a, const float *b, int ldb,
                                       long long stride_b, const float *beta, float *c, int ldc,
                                       long long stride_c, int batch_count);
typedef int (*cublas_sgemm_batched_fn)(nd_cublas_handle handle, int transa, int transb, int m,
                                       int n, int k, const float *alpha, const float *const a[],
                                       int lda, const float *const b[], int ldb, const float *beta,
                                       float *const c[], int ldc, int batch_count);
typedef int (*cublas_dgemm_strided_fn)(nd_cublas_handle handle, int transa, int transb, int m,
                                       int n, int k, const double *alpha, const double *a, int lda,
                                       long long stride_a, const double *b, int ldb,
                                       long long stride_b, const double *beta, double *c, int ldc,
                                       long long stride_c, int batch_count);
typedef int (*cublas_dgemm_batched_fn)(nd_cublas_handle handle, int transa, int transb, int m,
                                       int n, int k, const double *alpha, const double *const a[],
                                       int lda, const double *const b[], int ldb,
                                       const double *beta, double *const c[], int ldc,
                                       int batch_count);
/* cudaDataType_t, cublasComputeType_t and cublasGemmAlgo_t are ints too. */
typedef int (*cublas_gemm_strided_ex_fn)(nd_cublas_handle handle, int transa, int transb, int m,
                                         int n, int k, const void *alpha, const void *a, int a_type,
                                         int lda, long long stride_a, const void *b, int b_type,
                                         int ldb, long long stride_b, const void *beta, void *c,
                                         int c_type, int ldc, long long stride_c, int batch_count,
                                         int compute_type, int algo);
typedef int (*cublas_gemm_batched_ex_fn)(nd_cublas_handle handle, int transa, int transb, int m,
                                         int n, int k, const void *alpha, const void *const a[],
                                         int a_type, int lda, const void *const b[], int b_type,
                                         int ldb, const void *beta, void *const c[], int c_type,
                                         int ldc, int batch_count, int compute_type, int algo);
typedef const char *(*cublas_status_string_fn)(int status);

/* The values of library_types.h's cudaDataType_t and cublas_api.h's enums
 * that the Ex calls take. */
#define CUDA_R_16F_ 2
#define CUDA_R_16BF_ 14
#define CUBLAS_COMPUTE_32F_ 68
#define CUBLAS_GEMM_DEFAULT_ (-1)

#ifdef NEEDLE_CUDA_SIM
#include "sim/sim_cublas.h"
#endif

#define CUBLAS_OK 0
#define CUBLAS_ALLOC_FAILED 3

#define KERNEL_NAME "needle's tiled SGEMM kernel"
#define MAX_HINT_DIRS 8
#define HINT_DIR_BYTES 1024

static struct {
    int tried;
    int disabled; /* NEEDLE_CUBLAS=0, or a NEEDLE_CUBLAS path that failed */
    void *library;
    cublas_create_fn create;
    cublas_set_stream_fn set_stream;
    cublas_set_workspace_fn set_workspace; /* optional: older cuBLAS lacks it */
    cublas_sgemm_strided_fn sgemm_strided;
    cublas_sgemm_batched_fn sgemm_batched;
    /* Optional: a cuBLAS without them leaves those dtypes to the kernel. */
    cublas_dgemm_strided_fn dgemm_strided;
    cublas_dgemm_batched_fn dgemm_batched;
    cublas_gemm_strided_ex_fn gemm_strided_ex;
    cublas_gemm_batched_ex_fn gemm_batched_ex;
    cublas_status_string_fn status_string; /* optional */
    char description[4096];
} cublas;

static char hint_dirs[MAX_HINT_DIRS][HINT_DIR_BYTES];
static int hint_count = 0;

/* Per GPU: its handle and workspace, and the back-off after a failure that
 * more memory could fix. Calls are serialised by the host (the GIL); busy
 * marks a setup in progress, during which a collection may run code that
 * multiplies matrices: those nested calls use the kernel. */
typedef struct cublas_gpu {
    nd_cublas_handle handle;
    cudaStream_t stream; /* the handle's, as last set: the thread's current stream */
    void *workspace;
    int64_t workspace_bytes;
    int ready;  /* handle (and workspace, when cuBLAS takes one) in place */
    int failed; /* cuBLAS cannot run on this GPU */
    int busy;
    int64_t calls, retry_at, backoff;
} cublas_gpu;

static cublas_gpu gpus[ND_CUDA_MAX_DEVICES];

/* ---------------------------------------------------------------- loading */

/* cuBLAS's libraryPropertyType MAJOR_VERSION. */
#define CUBLAS_MAJOR_VERSION 0
typedef int (*cublas_get_property_fn)(int type, int *value);

static int try_open(const char *path) {
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL) return 0;
    /* cuBLAS must be of the major version of the runtime needle links (each
     * major's cuBLAS is built for its own runtime and driver): one that says
     * otherwise (an unversioned libcublas.so, a NEEDLE_CUBLAS path) is not
     * used. */
    cublas_get_property_fn get_property = (cublas_get_property_fn)dlsym(lib, "cublasGetProperty");
    int lib_major = 0;
    if (get_property != NULL && get_property(CUBLAS_MAJOR_VERSION, &lib_major) == CUBLAS_OK &&
        lib_major != CUDART_VERSION / 1000) {
        dlclose(lib);
        return 0;
    }
    cublas.create = (cublas_create_fn)dlsym(lib, "cublasCreate_v2");
    cublas.set_stream = (cublas_set_stream_fn)dlsym(lib, "cublasSetStream_v2");
    cublas.set_workspace = (cublas_set_workspace_fn)dlsym(lib, "cublasSetWorkspace_v2");
    cublas.sgemm_strided = (cublas_sgemm_strided_fn)dlsym(lib, "cublasSgemmStridedBatched");
    cublas.sgemm_batched = (cublas_sgemm_batched_fn)dlsym(lib, "cublasSgemmBatched_v2");
    if (cublas.sgemm_batched == NULL)
        cublas.sgemm_batched = (cublas_sgemm_batched_fn)dlsym(lib, "cublasSgemmBatched");
    cublas.dgemm_strided = (cublas_dgemm_strided_fn)dlsym(lib, "cublasDgemmStridedBatched");
    cublas.dgemm_batched = (cublas_dgemm_batched_fn)dlsym(lib, "cublasDgemmBatched_v2");
    if (cublas.dgemm_batched == NULL)
        cublas.dgemm_batched = (cublas_dgemm_batched_fn)dlsym(lib, "cublasDgemmBatched");
    cublas.gemm_strided_ex = (cublas_gemm_strided_ex_fn)dlsym(lib, "cublasGemmStridedBatchedEx");
    cublas.gemm_batched_ex = (cublas_gemm_batched_ex_fn)dlsym(lib, "cublasGemmBatchedEx");
    cublas.status_string = (cublas_status_string_fn)dlsym(lib, "cublasGetStatusString");
    if (cublas.create == NULL || cublas.set_stream == NULL || cublas.sgemm_strided == NULL ||
        cublas.sgemm_batched == NULL) {
        dlclose(lib);
        return 0;
    }
    cublas.library = lib;
    snprintf(cublas.description, sizeof cublas.description, "cublas (%s)", path);
    return 1;
}

/* The soname of the cuBLAS of needle's runtime's major version
 * (libcublas.so.13 for a CUDA 13 build, .12 for CUDA 12), tried in each
 * directory and on the loader's path, then the unversioned name on the
 * loader's path (kept only when it reports that major: try_open). */
static void cublas_soname(char *buf, size_t size) {
    snprintf(buf, size, "libcublas.so.%d", CUDART_VERSION / 1000);
}

/* Loads cuBLAS once (again after new hint directories); 1 when usable. */
static int load_cublas(void) {
    if (cublas.tried) return cublas.library != NULL;
    cublas.tried = 1;
    char env[4096]; /* NEEDLE_CUBLAS, blanks removed (config.h) */
    if (nd_config_text(ND_CFG_CUBLAS, env, sizeof env) < 0) {
        cublas.disabled = 1;
        snprintf(cublas.description, sizeof cublas.description,
                 "%s (NEEDLE_CUBLAS is too long to name a library)", KERNEL_NAME);
        return 0;
    }
    if (strcmp(env, "0") == 0) {
        cublas.disabled = 1;
        snprintf(cublas.description, sizeof cublas.description, "%s (NEEDLE_CUBLAS=0)",
                 KERNEL_NAME);
        return 0;
    }
#ifdef NEEDLE_CUDA_SIM
    cublas.create = nd_sim_cublas_create;
    cublas.set_stream = nd_sim_cublas_set_stream;
    cublas.set_workspace = nd_sim_cublas_set_workspace;
    cublas.sgemm_strided = nd_sim_cublas_sgemm_strided;
    cublas.sgemm_batched = nd_sim_cublas_sgemm_batched;
    cublas.dgemm_strided = nd_sim_cublas_dgemm_strided;
    cublas.dgemm_batched = nd_sim_cublas_dgemm_batched;
    cublas.gemm_strided_ex = nd_sim_cublas_gemm_strided_ex;
    cublas.gemm_batched_ex = nd_sim_cublas_gemm_batched_ex;
    cublas.status_string = nd_sim_cublas_status_string;
    cublas.library = (void *)&cublas; /* loaded: nothing to dlclose */
    snprintf(cublas.description, sizeof cublas.description,
             "cublas (the CUDA simulator's stand-in, computed on the CPU)");
    return 1;
#endif
    if (env[0] != '\0' && strcmp(env, "1") != 0) {
        if (try_open(env)) return 1;
        cublas.disabled = 1;
        snprintf(cublas.description, sizeof cublas.description,
                 "%s (NEEDLE_CUBLAS=%.300s could not be loaded)", KERNEL_NAME, env);
        return 0;
    }
#ifdef NEEDLE_CUBLAS_HINT
    if (try_open(NEEDLE_CUBLAS_HINT)) return 1; /* the library setup.py found */
#endif
    char soname[32], path[HINT_DIR_BYTES + 32];
    cublas_soname(soname, sizeof soname);
    for (int d = 0; d < hint_count; d++) {
        snprintf(path, sizeof path, "%.1023s/%s", hint_dirs[d], soname);
        if (try_open(path)) return 1;
    }
    if (try_open(soname) || try_open("libcublas.so")) return 1;
    /* Say where it looked, so that a missing wheel or a wrong path shows. */
    size_t size = sizeof cublas.description;
    int n = snprintf(cublas.description, size, "%s (cuBLAS not found in", KERNEL_NAME);
#ifdef NEEDLE_CUBLAS_HINT
    n += snprintf(cublas.description + n, size - (size_t)n, " %s,", NEEDLE_CUBLAS_HINT);
#endif
    for (int d = 0; d < hint_count && n > 0 && (size_t)n < size; d++)
        n += snprintf(cublas.description + n, size - (size_t)n, " %.1023s,", hint_dirs[d]);
    if (n > 0 && (size_t)n < size)
        snprintf(cublas.description + n, size - (size_t)n, " the loader's path)");
    return 0;
}

extern "C" nd_status nd_cuda_set_cublas_dirs(int count, const char *const *dirs) {
    if (count < 0 || count > MAX_HINT_DIRS)
        return nd_fail(ND_ERR_VALUE, "at most %d cuBLAS directories, got %d", MAX_HINT_DIRS, count);
    for (int d = 0; d < count; d++)
        if (dirs[d] == NULL || strlen(dirs[d]) >= HINT_DIR_BYTES)
            return nd_fail(ND_ERR_VALUE, "a cuBLAS directory is missing or longer than %d bytes",
                           HINT_DIR_BYTES - 1);
    for (int d = 0; d < count; d++) snprintf(hint_dirs[d], HINT_DIR_BYTES, "%s", dirs[d]);
    hint_count = count;
    /* Not found before: look again, now also in these. */
    if (cublas.tried && cublas.library == NULL && !cublas.disabled) cublas.tried = 0;
    return ND_OK;
}

extern "C" int nd_cuda_cublas_dirs(const char **out, int max) {
    int n = hint_count < max ? hint_count : max;
    for (int d = 0; d < n; d++) out[d] = hint_dirs[d];
    return n;
}

extern "C" const char *nd_cuda_gemm_description(void) {
    load_cublas();
    return cublas.description;
}

static const char *status_text(int status) {
    return cublas.status_string != NULL ? cublas.status_string(status) : "cuBLAS error";
}

/* ------------------------------------------------------- handle, workspace */

/* What cuBLAS's documentation recommends: 32 MiB on Hopper and newer, 4 MiB
 * before; MIN_WORKSPACE (it asks for at least 16 KiB) when that cannot be had. */
#define MIN_WORKSPACE ((int64_t)1 << 20)

static int64_t recommended_workspace(int ordinal) {
    int major = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, ordinal) != cudaSuccess)
        (void)cudaGetLastError();
    return major >= 9 ? (int64_t)32 << 20 : (int64_t)4 << 20;
}

int64_t nd_cublas_workspace_bytes(nd_device *dev) {
    cublas_gpu *g = &gpus[dev->ordinal];
    return g->workspace_bytes > 0 ? g->workspace_bytes : MIN_WORKSPACE;
}

static nd_status try_create(void *ctx) {
    cublas_gpu *g = (cublas_gpu *)ctx;
    int status = cublas.create(&g->handle);
    if (status == CUBLAS_OK) return ND_OK;
    g->handle = NULL;
    if (status == CUBLAS_ALLOC_FAILED)
        return nd_fail(ND_ERR_OOM, "cublasCreate could not allocate GPU memory");
    return nd_fail(ND_ERR_BACKEND, "cublasCreate failed: %s", status_text(status));
}

typedef struct workspace_attempt {
    nd_device *dev;
    int64_t bytes;
    void *ptr;
} workspace_attempt;

static nd_status try_workspace(void *ctx) {
    workspace_attempt *w = (workspace_attempt *)ctx;
    return nd_cuda_raw_alloc(w->dev, w->bytes, &w->ptr);
}

/* A failure that more memory could fix: the kernel serves the next calls,
 * then cuBLAS is tried again (after 1, 2, 4, ... 1024 calls). */
static void back_off(cublas_gpu *g) {
    g->retry_at = g->calls + g->backoff;
    g->backoff = g->backoff < 1024 ? g->backoff * 2 : 1024;
}

/* cuBLAS cannot run on this GPU (too new for the driver, say): the kernel
 * serves it from now on, and the description says why. */
static void give_up(cublas_gpu *g, const char *why) {
    g->failed = 1;
    snprintf(cublas.description, sizeof cublas.description, "%s (GPU %d: %.900s)", KERNEL_NAME,
             (int)(g - gpus), why);
}

static void give_up_status(cublas_gpu *g, const char *what, int status) {
    char why[256];
    snprintf(why, sizeof why, "%s failed: %s", what, status_text(status));
    give_up(g, why);
}

/* Swaps the handle's workspace for a block of `bytes` at ptr. */
static int use_workspace(cublas_gpu *g, nd_device *dev, void *ptr, int64_t bytes) {
    int status = cublas.set_workspace(g->handle, ptr, (size_t)bytes);
    if (status != CUBLAS_OK) {
        nd_cuda_raw_free(dev, ptr, bytes);
        return status;
    }
    if (g->workspace != NULL) nd_cuda_raw_free(dev, g->workspace, g->workspace_bytes);
    g->workspace = ptr;
    g->workspace_bytes = bytes;
    return CUBLAS_OK;
}

/* Creates the handle and its workspace, each through the out-of-memory ladder. */
static void set_up(cublas_gpu *g, nd_device *dev) {
    const int64_t want = recommended_workspace(dev->ordinal);
    if (g->handle == NULL) {
        nd_status status = nd_memory_retry(dev, want, try_create, g);
        if (status == ND_ERR_OOM) {
            back_off(g);
            return;
        }
        if (status != ND_OK) {
            give_up(g, nd_last_error());
            return;
        }
        g->stream = nd_cuda_stream();
        int st = cublas.set_stream(g->handle, g->stream);
        if (st != CUBLAS_OK) {
            give_up_status(g, "cublasSetStream", st);
            return;
        }
    }
    if (cublas.set_workspace != NULL && g->workspace == NULL) {
        workspace_attempt w = {dev, want, NULL};
        nd_status status = nd_memory_retry(dev, want, try_workspace, &w);
        if (status == ND_ERR_OOM) { /* the ladder ran: take a small one if it is there */
            w.bytes = MIN_WORKSPACE;
            status = try_workspace(&w);
        }
        if (status != ND_OK) {
            back_off(g);
            return;
        }
        int st = use_workspace(g, dev, w.ptr, w.bytes);
        if (st != CUBLAS_OK) {
            give_up_status(g, "cublasSetWorkspace", st);
            return;
        }
    }
    g->ready = 1;
    g->backoff = 1;
}

/* A workspace smaller than recommended (memory was short when it was made)
 * is grown now and then, without the ladder: only if memory is there now. */
static void maybe_grow_workspace(cublas_gpu *g, nd_device *dev) {
    if (g->workspace == NULL || g->calls % 4096 != 0) return;
    /* A capture's GEMMs keep the workspace they were captured with. */
    if (nd_cuda_graph_capturing(dev->ordinal)) return;
    const int64_t want = recommended_workspace(dev->ordinal);
    if (g->workspace_bytes >= want) return;
    void *ptr = NULL;
    if (nd_cuda_raw_alloc(dev, want, &ptr) == ND_OK) (void)use_workspace(g, dev, ptr, want);
}

nd_cublas_handle nd_cublas_handle_for(nd_device *dev) {
    if (dev == NULL || !load_cublas()) return NULL;
    cublas_gpu *g = &gpus[dev->ordinal];
    g->calls++;
    if (g->ready) {
        /* The calls go to the calling thread's current stream, as kernels do
         * (one workspace serves them all: calls on two streams at once would
         * need one each, and needle's are ordered by the stream switch). */
        cudaStream_t stream = nd_cuda_stream();
        if (stream != g->stream) {
            if (cublas.set_stream(g->handle, stream) != CUBLAS_OK) return NULL;
            g->stream = stream;
        }
        maybe_grow_workspace(g, dev);
        return g->handle;
    }
    if (g->failed || g->busy || g->calls < g->retry_at) return NULL;
    /* cublasCreate cannot be captured: a capture before the first GEMM on the
     * GPU (PyTorch warms up first for this) runs needle's kernel instead. */
    if (nd_cuda_graph_capturing(dev->ordinal)) return NULL;
    if (g->backoff == 0) g->backoff = 1;
    g->busy = 1;
    set_up(g, dev);
    g->busy = 0;
    return g->ready ? g->handle : NULL;
}

/* ------------------------------------------------------------------- GEMM */

/* A GEMM call's cuBLAS status as the engine's. */
static nd_status gemm_status(int status, const char *call, int m, int n, int k, int batch_count) {
    if (status == CUBLAS_OK) return ND_OK;
    if (status == CUBLAS_ALLOC_FAILED)
        return nd_fail(ND_ERR_OOM, "%s could not allocate GPU memory (m=%d, n=%d, k=%d, batch %d)",
                       call, m, n, k, batch_count);
    return nd_fail(ND_ERR_BACKEND, "cuBLAS error %d (%s): %s (m=%d, n=%d, k=%d, batch %d)", status,
                   status_text(status), call, m, n, k, batch_count);
}

int nd_cublas_supports(nd_dtype dtype) {
    if (!load_cublas()) return 0;
    switch (dtype) {
    case ND_FLOAT32: return 1;
    case ND_FLOAT64: return cublas.dgemm_strided != NULL && cublas.dgemm_batched != NULL;
    case ND_FLOAT16:
    case ND_BFLOAT16: return cublas.gemm_strided_ex != NULL && cublas.gemm_batched_ex != NULL;
    default: return 0;
    }
}

/* cudaDataType_t of a narrow dtype. */
static int narrow_type(nd_dtype dtype) { return dtype == ND_FLOAT16 ? CUDA_R_16F_ : CUDA_R_16BF_; }

nd_status nd_cublas_gemm_strided(nd_cublas_handle h, nd_dtype dtype, int transa, int transb, int m,
                                 int n, int k, const void *a, int lda, long long stride_a,
                                 const void *b, int ldb, long long stride_b, void *c, int ldc,
                                 long long stride_c, int batch_count, int accumulate) {
    const float one = 1.0f, zero = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    const float *beta = accumulate ? &one : &zero;
    const double *beta_d = accumulate ? &one_d : &zero_d;
    int status;
    const char *call;
    nd_cuda_count_blas();
    if (dtype == ND_FLOAT32) {
        call = "cublasSgemmStridedBatched";
        status = cublas.sgemm_strided(h, transa, transb, m, n, k, &one, (const float *)a, lda,
                                      stride_a, (const float *)b, ldb, stride_b, beta, (float *)c,
                                      ldc, stride_c, batch_count);
    } else if (dtype == ND_FLOAT64) {
        call = "cublasDgemmStridedBatched";
        status = cublas.dgemm_strided(h, transa, transb, m, n, k, &one_d, (const double *)a, lda,
                                      stride_a, (const double *)b, ldb, stride_b, beta_d,
                                      (double *)c, ldc, stride_c, batch_count);
    } else {
        call = "cublasGemmStridedBatchedEx";
        const int type = narrow_type(dtype);
        status = cublas.gemm_strided_ex(h, transa, transb, m, n, k, &one, a, type, lda, stride_a, b,
                                        type, ldb, stride_b, beta, c, type, ldc, stride_c,
                                        batch_count, CUBLAS_COMPUTE_32F_, CUBLAS_GEMM_DEFAULT_);
    }
    return gemm_status(status, call, m, n, k, batch_count);
}

nd_status nd_cublas_gemm_batched(nd_cublas_handle h, nd_dtype dtype, int transa, int transb, int m,
                                 int n, int k, const void *const a[], int lda,
                                 const void *const b[], int ldb, void *const c[], int ldc,
                                 int batch_count, int accumulate) {
    const float one = 1.0f, zero = 0.0f;
    const double one_d = 1.0, zero_d = 0.0;
    const float *beta = accumulate ? &one : &zero;
    const double *beta_d = accumulate ? &one_d : &zero_d;
    int status;
    const char *call;
    nd_cuda_count_blas();
    if (dtype == ND_FLOAT32) {
        call = "cublasSgemmBatched";
        status = cublas.sgemm_batched(h, transa, transb, m, n, k, &one, (const float *const *)a,
                                      lda, (const float *const *)b, ldb, beta, (float *const *)c,
                                      ldc, batch_count);
    } else if (dtype == ND_FLOAT64) {
        call = "cublasDgemmBatched";
        status = cublas.dgemm_batched(h, transa, transb, m, n, k, &one_d, (const double *const *)a,
                                      lda, (const double *const *)b, ldb, beta_d,
                                      (double *const *)c, ldc, batch_count);
    } else {
        call = "cublasGemmBatchedEx";
        const int type = narrow_type(dtype);
        status = cublas.gemm_batched_ex(h, transa, transb, m, n, k, &one, a, type, lda, b, type,
                                        ldb, beta, c, type, ldc, batch_count, CUBLAS_COMPUTE_32F_,
                                        CUBLAS_GEMM_DEFAULT_);
    }
    return gemm_status(status, call, m, n, k, batch_count);
}
