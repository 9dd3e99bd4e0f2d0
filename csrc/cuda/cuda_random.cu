/* cuda_random.cu: the CUDA backend's random fill: one grid-stride kernel in
 * which each thread runs philox.h's generator for one block of four values
 * at a time, the same code the CPU backend runs, so both give the same
 * values (bit for bit where the math library agrees, see philox.h) and no
 * value depends on the grid's size.
 *
 * No host synchronisation, no device memory beyond the output, the default
 * stream like the other kernels.
 */
#include "cuda_common.cuh"

#include "../philox.h"

/* out (n,) contiguous: element i = element i of the draw params describes. */
__global__ void random_kernel(nd_random_params params, int64_t n, float *out) {
    const int64_t blocks = (n + 3) / 4;
    for (int64_t block = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; block < blocks;
         block += (int64_t)gridDim.x * blockDim.x) {
        float values[4];
        nd_random_block(params.kind, params.key, params.stream, (uint64_t)block, params.p, values);
        const int64_t first = 4 * block;
        if (first + 4 <= n) {
            out[first] = values[0];
            out[first + 1] = values[1];
            out[first + 2] = values[2];
            out[first + 3] = values[3];
        } else {
            for (int64_t j = 0; first + j < n; j++) out[first + j] = values[j];
        }
    }
}

nd_status nd_cuda_random(const nd_random_params *params, int64_t n, float *out) {
    ND_TRY(nd_cuda_activate(out, NULL));
    const int64_t blocks = (n + 3) / 4;
    ND_LAUNCH(random_kernel, nd_cuda_blocks(blocks, ND_CUDA_THREADS), ND_CUDA_THREADS, 0,
              nd_cuda_stream(), *params, n, out);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}
