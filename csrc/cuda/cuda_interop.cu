/* cuda_interop.cu: stream order for zero-copy exchange with other CUDA
 * libraries (DLPack, the CUDA Array Interface), for needle_c/array/interop.c.
 *
 * needle runs its work on its own non-blocking stream (cuda_stream.cu; the
 * thread's current one). The protocols name streams by the runtime's values:
 * 1 the legacy default stream (cudaStreamLegacy), 2 the per-thread default
 * stream (cudaStreamPerThread), others cudaStream_t handles. A consumer on
 * any stream but needle's current one must wait for needle's work on the
 * data so far (export), and needle's later work (a kernel reusing the block
 * after the export is released) must wait for the consumer's work on it
 * (release). Both are an event recorded on one stream and waited on by the
 * other, so nothing blocks the host. The legacy stream needs it too: it does
 * not order itself with non-blocking streams.
 *
 * The stream handle is the consumer's; the engine cannot check it. Never
 * prints, exits or aborts; the caller's current GPU is restored.
 */
#include "cuda_common.cuh"

/* Records an event on `from` and makes `to` wait for it, on GPU ordinal. */
static nd_status order_streams(int ordinal, cudaStream_t from, cudaStream_t to) {
    int previous = -1;
    ND_CUDA_CHECK(cudaGetDevice(&previous));
    nd_status status = nd_cuda_set_device(ordinal);
    if (status != ND_OK) return status;
    cudaEvent_t event = NULL;
    cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventRecord(event, from);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(to, event, 0);
    /* Destroying it now is fine: the wait already holds what it needs. */
    if (event != NULL) (void)cudaEventDestroy(event);
    (void)cudaSetDevice(previous);
    ND_CUDA_CHECK(err);
    return ND_OK;
}

/* needle's current stream on GPU ordinal, where its work on the data is. */
static nd_status needle_stream(int ordinal, cudaStream_t *out) {
    intptr_t handle = 0;
    ND_TRY(nd_cuda_stream_current(ordinal, &handle));
    *out = (cudaStream_t)handle;
    return ND_OK;
}

extern "C" nd_status nd_cuda_export_to_stream(int ordinal, intptr_t stream) {
    if (stream == -1) return ND_OK;
    if (stream == 0 || stream < -1)
        return nd_fail(ND_ERR_VALUE, "stream %lld is not a CUDA stream value", (long long)stream);
    cudaStream_t mine = NULL;
    ND_TRY(needle_stream(ordinal, &mine));
    if ((cudaStream_t)stream == mine) return ND_OK;
    return order_streams(ordinal, mine, (cudaStream_t)stream);
}

extern "C" nd_status nd_cuda_release_from_stream(int ordinal, intptr_t stream) {
    if (stream == -1) return ND_OK;
    if (stream == 0 || stream < -1)
        return nd_fail(ND_ERR_VALUE, "stream %lld is not a CUDA stream value", (long long)stream);
    cudaStream_t mine = NULL;
    nd_status status = needle_stream(ordinal, &mine);
    if (status == ND_OK && (cudaStream_t)stream == mine) return ND_OK;
    if (status == ND_OK) status = order_streams(ordinal, (cudaStream_t)stream, mine);
    if (status != ND_OK) {
        /* The consumer's stream is gone (or never was one): wait for all the
         * GPU's work instead, so that the block is still safe to reuse. */
        int previous = -1;
        if (cudaGetDevice(&previous) == cudaSuccess && cudaSetDevice(ordinal) == cudaSuccess) {
            nd_cuda_census_set_current(ordinal);
            (void)nd_cuda_synchronize();
            nd_cuda_census_set_current(previous);
            (void)cudaSetDevice(previous);
        }
        (void)cudaGetLastError();
    }
    return status;
}
