/* cuda_random.cu: the CUDA backend's random fill: one grid-stride kernel in
 * which each thread runs philox.h's generator for one block of four values
 * at a time, the same code the CPU backend runs, so both give the same
 * values (bit for bit where the math library agrees, see philox.h) and no
 * value depends on the grid's size.
 *
 * No host synchronisation, no device memory beyond the output, the current
 * stream like the other kernels. A draw captured into a CUDA graph mixes the
 * graph's replay counter into its Philox stream (nd_philox_replay_stream).
 */
#include "cuda_common.cuh"

#include "../philox.h"

/* out (n,) contiguous: element i = element i of the draw params describes. */
__global__ void random_kernel(nd_random_params params, int64_t n, float *out) {
    const int64_t blocks = (n + 3) / 4;
    const uint64_t stream = params.replay_counter == NULL
                                ? params.stream
                                : nd_philox_replay_stream(params.stream, *params.replay_counter);
    for (int64_t block = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; block < blocks;
         block += (int64_t)gridDim.x * blockDim.x) {
        float values[4];
        nd_random_block(params.kind, params.key, stream, (uint64_t)block, params.p, values);
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
    nd_device *dev = NULL;
    ND_TRY(nd_cuda_activate(out, &dev));
    nd_random_params p = *params;
    /* Captured: each replay reads the graph's counter (the capture's last
     * node advances it), so dropout differs between replays as between steps. */
    if (nd_cuda_graph_capturing(dev->ordinal))
        ND_TRY(nd_cuda_graph_replay_counter(dev->ordinal, &p.replay_counter));
    const int64_t blocks = (n + 3) / 4;
    ND_LAUNCH(random_kernel, nd_cuda_blocks(blocks, ND_CUDA_THREADS), ND_CUDA_THREADS, 0,
              nd_cuda_stream(), p, n, out);
    ND_CUDA_CHECK(cudaGetLastError());
    return ND_OK;
}
