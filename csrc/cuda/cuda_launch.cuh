/* cuda_launch.cuh: ND_LAUNCH, the one way the backend launches a kernel, so
 * that the same source builds with nvcc and with the CUDA simulator:
 *
 *     ND_LAUNCH(kernel, grid, block, shared_bytes, stream, args...);
 *
 * nvcc: kernel<<<grid, block, shared_bytes, stream>>>(args...). NEEDLE_CUDA=sim
 * (g++, -DNEEDLE_CUDA_SIM): a call into the simulator (csrc/cuda/sim), which
 * runs the grid before it returns. Either way the launch's error is read with
 * cudaGetLastError afterwards. A template kernel whose arguments contain a
 * comma goes in parentheses: ND_LAUNCH((reduce_kernel<R, 32>), ...).
 *
 * Every launch is counted in the census of the current GPU (cuda_census.cu),
 * by call site ("kernel file:line", one string literal per ND_LAUNCH), and
 * apart when it goes to the legacy default stream (which no capture records).
 *
 * ND_DYNAMIC_SHARED(type, name) declares a kernel's dynamic shared memory
 * (the launch's shared_bytes), which is `extern __shared__ type name[]` under
 * nvcc; the simulator needs a different spelling.
 */
#ifndef NEEDLE_CUDA_LAUNCH_CUH
#define NEEDLE_CUDA_LAUNCH_CUH

void nd_cuda_count_launch(const char *site, const void *stream);

#define ND_LAUNCH_STR2(x) #x
#define ND_LAUNCH_STR(x) ND_LAUNCH_STR2(x)
#define ND_LAUNCH_SITE(kernel) #kernel " " __FILE__ ":" ND_LAUNCH_STR(__LINE__)

#ifdef NEEDLE_CUDA_SIM
#define ND_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)                        \
    (nd_cuda_count_launch(ND_LAUNCH_SITE(kernel), (const void *)(stream)),               \
     (void)nd_sim_launch(#kernel, __FILE__, __LINE__, kernel, grid, block, shared_bytes, \
                         stream, ##__VA_ARGS__))
#define ND_DYNAMIC_SHARED(type, name) type *const name = (type *)nd_sim_dynamic_shared()
#else
#define ND_LAUNCH(kernel, grid, block, shared_bytes, stream, ...)             \
    do {                                                                      \
        nd_cuda_count_launch(ND_LAUNCH_SITE(kernel), (const void *)(stream)); \
        kernel<<<grid, block, shared_bytes, stream>>>(__VA_ARGS__);           \
    } while (0)
#define ND_DYNAMIC_SHARED(type, name) extern __shared__ type name[]
#endif

#endif /* NEEDLE_CUDA_LAUNCH_CUH */
