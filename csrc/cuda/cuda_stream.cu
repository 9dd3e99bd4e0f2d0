/* cuda_stream.cu: the streams needle queues its GPU work on.
 *
 * Each GPU gets needle's own stream, created non-blocking on the first
 * allocation there: the legacy default stream (stream 0) cannot be captured
 * into a CUDA graph, and a non-blocking stream does not wait for, or make
 * wait, other libraries' work on the legacy stream. Every launch, copy,
 * memset and cuBLAS call goes to the calling thread's current stream of the
 * current GPU (nd_cuda_stream), which is needle's own unless the thread made
 * another current (ndl.cuda.stream(s), as torch.cuda.stream): a thread-local
 * choice per GPU, as CUDA's and PyTorch's current stream is.
 *
 * The caching allocator reuses a freed block for the next allocation at once,
 * which is safe because the next user's work queues behind the last user's
 * on the same stream. Switching streams keeps that so: the binding makes the
 * new stream wait for the old one on entry and the old one wait for the new
 * one on exit (nd_cuda_stream_wait).
 *
 * Never prints, exits or aborts; a stream handle crossing the engine's API is
 * an intptr_t (0 means needle's own stream of that GPU).
 */
#include "cuda_common.cuh"

static cudaStream_t needle_streams[ND_CUDA_MAX_DEVICES];
/* The calling thread's choice per GPU; NULL: needle's own. */
static thread_local cudaStream_t chosen[ND_CUDA_MAX_DEVICES];

/* Creates needle's stream of GPU ordinal (that GPU current) if it has none. */
static nd_status ensure_stream(int ordinal) {
    if (needle_streams[ordinal] != NULL) return ND_OK;
    cudaStream_t s = NULL;
    ND_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    needle_streams[ordinal] = s;
    return ND_OK;
}

nd_status nd_cuda_stream_prepare(int ordinal) {
    if (ordinal < 0 || ordinal >= ND_CUDA_MAX_DEVICES)
        return nd_fail(ND_ERR_DEVICE, "there is no CUDA device %d", ordinal);
    return ensure_stream(ordinal);
}

cudaStream_t nd_cuda_stream(void) {
    const int current_ordinal = nd_cuda_current_ordinal();
    cudaStream_t s = chosen[current_ordinal];
    if (s != NULL) return s;
    /* Made on the GPU's first allocation, before any work can reach it. A
     * GPU whose stream could not be made has no memory, so no work to order
     * against; its memoryless work (none today) would go to the legacy stream. */
    if (needle_streams[current_ordinal] == NULL && ensure_stream(current_ordinal) != ND_OK)
        return cudaStreamLegacy;
    return needle_streams[current_ordinal];
}

/* The stream a handle names on GPU ordinal: 0 is needle's own. */
static nd_status resolve(int ordinal, intptr_t handle, cudaStream_t *out) {
    if (!nd_cuda_registered(ordinal))
        return nd_fail(ND_ERR_DEVICE, "there is no CUDA device %d", ordinal);
    ND_TRY(nd_cuda_set_device(ordinal));
    if (handle == 0) {
        ND_TRY(ensure_stream(ordinal));
        *out = needle_streams[ordinal];
    } else {
        *out = (cudaStream_t)handle;
    }
    return ND_OK;
}

extern "C" nd_status nd_cuda_stream_default(int ordinal, intptr_t *out) {
    cudaStream_t s = NULL;
    ND_TRY(resolve(ordinal, 0, &s));
    *out = (intptr_t)s;
    return ND_OK;
}

extern "C" nd_status nd_cuda_stream_current(int ordinal, intptr_t *out) {
    cudaStream_t s = NULL;
    ND_TRY(resolve(ordinal, 0, &s));
    *out = (intptr_t)(chosen[ordinal] != NULL ? chosen[ordinal] : s);
    return ND_OK;
}

extern "C" nd_status nd_cuda_stream_set(int ordinal, intptr_t handle) {
    cudaStream_t s = NULL;
    ND_TRY(resolve(ordinal, handle, &s));
    chosen[ordinal] = s == needle_streams[ordinal] ? NULL : s;
    return ND_OK;
}

extern "C" nd_status nd_cuda_stream_create(int ordinal, intptr_t *out) {
    cudaStream_t s = NULL;
    ND_TRY(resolve(ordinal, 0, &s));
    ND_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    *out = (intptr_t)s;
    return ND_OK;
}

extern "C" nd_status nd_cuda_stream_destroy(int ordinal, intptr_t handle) {
    if (handle == 0) return nd_fail(ND_ERR_VALUE, "needle's own stream cannot be destroyed");
    cudaStream_t s = NULL;
    ND_TRY(resolve(ordinal, handle, &s));
    /* A thread that still has it current goes back to needle's stream. */
    if (chosen[ordinal] == s) chosen[ordinal] = NULL;
    /* cudaStreamDestroy lets queued work finish; the handle is gone at once. */
    ND_CUDA_CHECK(cudaStreamDestroy(s));
    return ND_OK;
}

extern "C" nd_status nd_cuda_stream_synchronize(int ordinal, intptr_t handle) {
    cudaStream_t s = NULL;
    ND_TRY(resolve(ordinal, handle, &s));
    ND_CUDA_CHECK(nd_cuda_stream_sync(s));
    return ND_OK;
}

extern "C" nd_status nd_cuda_stream_query(int ordinal, intptr_t handle, int *done) {
    cudaStream_t s = NULL;
    ND_TRY(resolve(ordinal, handle, &s));
    cudaError_t err = cudaStreamQuery(s);
    if (err == cudaErrorNotReady) {
        (void)cudaGetLastError();
        *done = 0;
        return ND_OK;
    }
    ND_CUDA_CHECK(err);
    *done = 1;
    return ND_OK;
}

extern "C" nd_status nd_cuda_stream_wait(int ordinal, intptr_t waiter, intptr_t waited) {
    cudaStream_t a = NULL, b = NULL;
    ND_TRY(resolve(ordinal, waiter, &a));
    ND_TRY(resolve(ordinal, waited, &b));
    if (a == b) return ND_OK;
    cudaEvent_t event = NULL;
    cudaError_t err = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (err == cudaSuccess) err = cudaEventRecord(event, b);
    if (err == cudaSuccess) err = cudaStreamWaitEvent(a, event, 0);
    /* Destroying it now is fine: the wait already holds what it needs. */
    if (event != NULL) (void)cudaEventDestroy(event);
    ND_CUDA_CHECK(err);
    return ND_OK;
}
