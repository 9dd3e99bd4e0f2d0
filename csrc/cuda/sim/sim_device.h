/* sim_device.h: what a kernel sees in the CUDA simulator (included by the
 * stand-in cuda_runtime.h): CUDA's function and variable qualifiers as plain
 * C++, the built-in variables, __syncthreads, the warp operations, atomics,
 * the device intrinsics the kernels use, and nd_sim_launch, which
 * ND_LAUNCH (csrc/cuda/cuda_launch.cuh) expands to.
 *
 * Kernels run in sim_grid.cc, one block at a time on the launching thread,
 * every CUDA thread a fiber. Nothing preempts a fiber: it runs until it
 * returns or calls __syncthreads or a warp operation, which suspend it until
 * every thread that must take part has arrived. So barriers and shuffles
 * behave as on a GPU, atomics are plain read-modify-writes, and a barrier or
 * full-mask shuffle that some threads never reach fails the launch
 * (cudaErrorLaunchFailure) instead of hanging.
 *
 * __shared__ variables are function statics: one copy, shared by the threads
 * of the block that is running (blocks run one after another). Their values
 * are not reset between blocks, as on a GPU they are undefined at a block's
 * start; dynamic shared memory (ND_DYNAMIC_SHARED) is refilled with 0xFF
 * (float NaN) before each block.
 */
#ifndef NEEDLE_SIM_DEVICE_H
#define NEEDLE_SIM_DEVICE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <new>
#include <tuple>
#include <type_traits>
#include <utility>

/* ------------------------------------------------------------ qualifiers */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__
#define __align__(n) __attribute__((aligned(n)))

static constexpr int warpSize = 32;

/* ------------------------------------------------------ built-in values */

/* Set by sim_grid.cc before it resumes a fiber; read-only to kernels. */
extern const uint3 *nd_sim_thread_idx;
extern uint3 nd_sim_block_idx;
extern dim3 nd_sim_block_dim;
extern dim3 nd_sim_grid_dim;

#define threadIdx (*nd_sim_thread_idx)
#define blockIdx (static_cast<const uint3 &>(nd_sim_block_idx))
#define blockDim (static_cast<const dim3 &>(nd_sim_block_dim))
#define gridDim (static_cast<const dim3 &>(nd_sim_grid_dim))

/* ------------------------------------------- barriers and warp operations */

/* The warp operations sim_grid.cc implements (the kind of nd_sim_warp). */
enum nd_sim_warp_kind {
    ND_SIM_SHFL,
    ND_SIM_SHFL_UP,
    ND_SIM_SHFL_DOWN,
    ND_SIM_SHFL_XOR,
    ND_SIM_BALLOT,
    ND_SIM_ANY,
    ND_SIM_ALL,
    ND_SIM_SYNCWARP
};

/* file and line name the call site: threads that wait at different barriers
 * (or warp operations) are a divergence, reported as a launch failure. */
void nd_sim_syncthreads(const char *file, int line);
/* Waits until every lane of mask has made the same call, then returns this
 * lane's result (for a shuffle, the bits of the source lane's value). */
uint64_t nd_sim_warp(int kind, unsigned mask, uint64_t value, int arg, int width, const char *file,
                     int line);
unsigned nd_sim_active_mask(void);
void *nd_sim_dynamic_shared(void);

/* The switch to another fiber is an opaque call; the empty asm statements
 * also stop the compiler from keeping shared values in registers across it. */
static inline void __syncthreads(const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    __asm__ __volatile__("" ::: "memory");
    nd_sim_syncthreads(file, line);
    __asm__ __volatile__("" ::: "memory");
}

static inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE()) {
    __asm__ __volatile__("" ::: "memory");
    (void)nd_sim_warp(ND_SIM_SYNCWARP, mask, 0, 0, warpSize, file, line);
    __asm__ __volatile__("" ::: "memory");
}

template <class T>
static inline T nd_sim_warp_value(int kind, unsigned mask, T var, int arg, int width,
                                  const char *file, int line) {
    static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable<T>::value,
                  "warp shuffles move values of at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &var, sizeof var);
    bits = nd_sim_warp(kind, mask, bits, arg, width, file, line);
    T out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

template <class T>
static inline T __shfl_sync(unsigned mask, T var, int src_lane, int width = warpSize,
                            const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return nd_sim_warp_value(ND_SIM_SHFL, mask, var, src_lane, width, file, line);
}

template <class T>
static inline T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                               const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return nd_sim_warp_value(ND_SIM_SHFL_UP, mask, var, (int)delta, width, file, line);
}

template <class T>
static inline T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize,
                                 const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return nd_sim_warp_value(ND_SIM_SHFL_DOWN, mask, var, (int)delta, width, file, line);
}

template <class T>
static inline T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize,
                                const char *file = __builtin_FILE(), int line = __builtin_LINE()) {
    return nd_sim_warp_value(ND_SIM_SHFL_XOR, mask, var, lane_mask, width, file, line);
}

static inline unsigned __ballot_sync(unsigned mask, int predicate,
                                     const char *file = __builtin_FILE(),
                                     int line = __builtin_LINE()) {
    return (unsigned)nd_sim_warp(ND_SIM_BALLOT, mask, predicate != 0, 0, warpSize, file, line);
}

static inline int __any_sync(unsigned mask, int predicate, const char *file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
    return (int)nd_sim_warp(ND_SIM_ANY, mask, predicate != 0, 0, warpSize, file, line);
}

static inline int __all_sync(unsigned mask, int predicate, const char *file = __builtin_FILE(),
                             int line = __builtin_LINE()) {
    return (int)nd_sim_warp(ND_SIM_ALL, mask, predicate != 0, 0, warpSize, file, line);
}

static inline unsigned __activemask(void) { return nd_sim_active_mask(); }

/* ---------------------------------------------------------------- atomics */

/* A fiber is never interrupted, so a read-modify-write is atomic. The value
 * parameter is not deduced, so atomicAdd(float *, 1) converts as on a GPU. */
template <class T> struct nd_sim_same {
    typedef T type;
};

template <class T> static inline T atomicAdd(T *address, typename nd_sim_same<T>::type value) {
    T old = *address;
    *address = (T)(old + value);
    return old;
}
template <class T> static inline T atomicSub(T *address, typename nd_sim_same<T>::type value) {
    T old = *address;
    *address = (T)(old - value);
    return old;
}
template <class T> static inline T atomicMin(T *address, typename nd_sim_same<T>::type value) {
    T old = *address;
    if (value < old) *address = value;
    return old;
}
template <class T> static inline T atomicMax(T *address, typename nd_sim_same<T>::type value) {
    T old = *address;
    if (value > old) *address = value;
    return old;
}
template <class T> static inline T atomicExch(T *address, typename nd_sim_same<T>::type value) {
    T old = *address;
    *address = value;
    return old;
}
template <class T>
static inline T atomicCAS(T *address, typename nd_sim_same<T>::type compare,
                          typename nd_sim_same<T>::type value) {
    T old = *address;
    if (old == compare) *address = value;
    return old;
}
template <class T> static inline T atomicAnd(T *address, typename nd_sim_same<T>::type value) {
    T old = *address;
    *address = old & value;
    return old;
}
template <class T> static inline T atomicOr(T *address, typename nd_sim_same<T>::type value) {
    T old = *address;
    *address = old | value;
    return old;
}

/* -------------------------------------------------------------- intrinsics */

/* The C math library covers expf, logf, tanhf, powf, sqrtf, fabsf, fmaxf...;
 * these are the CUDA-only names. The fast approximations are exact here. */
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __fdividef(float x, float y) { return x / y; }
static inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
static inline int __float_as_int(float x) {
    int i;
    memcpy(&i, &x, sizeof i);
    return i;
}
static inline float __int_as_float(int i) {
    float x;
    memcpy(&x, &i, sizeof x);
    return x;
}
static inline unsigned __float_as_uint(float x) {
    unsigned i;
    memcpy(&i, &x, sizeof i);
    return i;
}
static inline float __uint_as_float(unsigned i) {
    float x;
    memcpy(&x, &i, sizeof x);
    return x;
}
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned)x); }
static inline int __ffs(int x) { return __builtin_ffs(x); }
template <class T> static inline T __ldg(const T *p) { return *p; }
/* CUDA's min and max overloads for device code. */
template <class T> static inline T min(T a, T b) { return b < a ? b : a; }
template <class T> static inline T max(T a, T b) { return a < b ? b : a; }

/* ------------------------------------------------------------------ launch */

/* A launch as sim_grid.cc receives it: body(ctx) runs the kernel for the
 * calling thread with the launch's arguments. ctx lives on the launching
 * caller's stack, so a launch into a capturing stream keeps clone(ctx), a
 * heap copy (NULL when out of memory) that destroy frees. */
typedef struct nd_sim_kernel {
    const char *name; /* as written at the launch */
    const char *file; /* the launch site */
    int line;
    void (*body)(void *ctx);
    void *ctx;
    void *(*clone)(const void *ctx);
    void (*destroy)(void *ctx);
} nd_sim_kernel;

/* Runs a grid to completion, or records it when stream captures; returns
 * (and records as the last error) a launch-configuration error,
 * cudaErrorLaunchFailure, or a capture's refusal. name and file must live as
 * long as the graphs that capture the launch (ND_LAUNCH passes literals). */
cudaError_t nd_sim_run(const nd_sim_kernel *kernel, dim3 grid, dim3 block, size_t shared_bytes,
                       cudaStream_t stream);

/* The arguments are converted to the kernel's parameter types once, as a
 * real launch copies them to the GPU; every thread then gets its own copy
 * (by-value parameters on its fiber's stack). A captured launch keeps a copy
 * of those converted values, which every replay of the graph runs with. */
template <class... P, class... A>
static inline cudaError_t nd_sim_launch(const char *name, const char *file, int line,
                                        void (*kernel)(P...), dim3 grid, dim3 block,
                                        size_t shared_bytes, cudaStream_t stream, A &&...args) {
    static_assert(sizeof...(P) == sizeof...(A), "a launch passes one argument per parameter");
    struct closure {
        void (*kernel)(P...);
        std::tuple<typename std::decay<P>::type...> params;
    } c{kernel, std::tuple<typename std::decay<P>::type...>(std::forward<A>(args)...)};
    nd_sim_kernel k = {name,
                       file,
                       line,
                       [](void *ctx) {
                           closure *cl = static_cast<closure *>(ctx);
                           std::apply(cl->kernel, cl->params);
                       },
                       &c,
                       [](const void *ctx) -> void * {
                           return new (std::nothrow) closure(*static_cast<const closure *>(ctx));
                       },
                       [](void *ctx) { delete static_cast<closure *>(ctx); }};
    return nd_sim_run(&k, grid, block, shared_bytes, stream);
}

#endif /* NEEDLE_SIM_DEVICE_H */
