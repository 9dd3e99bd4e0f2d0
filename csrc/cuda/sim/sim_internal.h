/* sim_internal.h: what the CUDA simulator's sources share (sim_runtime.cc,
 * sim_grid.cc, sim_vm.cc, sim_graph.cc, sim_cublas.cc) and its self-test
 * reads: the switches read from the environment, the recording of an error
 * with the simulator's detail, the check of a stream handle, and the hooks of
 * stream capture (sim_graph.cc) that every queued operation and every call
 * that capture restricts goes through. Not seen by the backend's .cu files.
 *
 * Switches (read once, at the first CUDA call; a malformed value makes device
 * discovery fail with cudaErrorInvalidValue, naming the variable). Each is a
 * row of csrc/config.h's table (and README.md's); the simulator, a stand-in
 * for the driver, keeps its own parsers of them:
 *   NEEDLE_SIM_MEMORY=<bytes>  the simulated GPU's memory (default 4GiB; a
 *       number with an optional KiB/MiB/GiB suffix): cudaMalloc fails with
 *       cudaErrorMemoryAllocation past it, and cudaMemGetInfo and
 *       cudaDeviceProp.totalGlobalMem report it
 *   NEEDLE_SIM_MAX_BLOCKS=<n>  runs every grid with at most n blocks (gridDim
 *       shrinks; valid because every kernel loops grid-stride); 0: no cap
 *   NEEDLE_SIM_PERTURB=1       at the start of every block and after every
 *       barrier, holds back one warp (drawn afresh each time) until every
 *       other thread has blocked or returned, and runs the others first to
 *       last or last to first (drawn too), so that a missing __syncthreads
 *       shows as a wrong result; plainly, threads run in thread order
 *   NEEDLE_SIM_COMPUTE_CAPABILITY=<major>.<minor>  the capability the
 *       simulated GPU reports (default 9.0, an H100's), so that device
 *       discovery's check of the build's architectures (cuda_arch.h) meets a
 *       V100 (7.0) or a GPU newer than the build (10.0) without one
 *   NEEDLE_SIM_VMM=0           the GPU has no virtual memory management: the
 *       driver's cuMem* calls (sim_vm.cc) fail with CUDA_ERROR_NOT_SUPPORTED,
 *       so that expandable_segments' refusal is tested; 1 (the default): they work
 */
#ifndef NEEDLE_SIM_INTERNAL_H
#define NEEDLE_SIM_INTERNAL_H

/* Before cuda_runtime.h, whose __noinline__ macro libstdc++'s headers trip on. */
#include <functional>

#include "cuda_runtime.h"

typedef struct nd_sim_options {
    int valid; /* 0: a switch is malformed; error says which */
    char error[256];
    int64_t memory;     /* bytes of simulated device memory */
    int64_t max_blocks; /* 0: no cap */
    int perturb;
    int vmm;                /* the driver's virtual memory calls work (NEEDLE_SIM_VMM) */
    int cc_major, cc_minor; /* the compute capability reported */
} nd_sim_options;

/* The switches, parsed once (thread-safe). */
const nd_sim_options *nd_sim_get_options(void);

/* Records code as the calling thread's last error, with a detail that
 * cudaGetErrorString(code) appends to CUDA's text until the next failure;
 * returns code. */
cudaError_t nd_sim_fail(cudaError_t code, const char *format, ...)
    __attribute__((format(printf, 2, 3)));

/* The simulated GPU's memory, which cudaMalloc and cuMemCreate draw on:
 * charges bytes and returns 1 when they fit under the capacity, else 0
 * (nothing charged); uncharge gives them back. */
int nd_sim_charge(int64_t bytes);
void nd_sim_uncharge(int64_t bytes);

/* 1 when [p, p + n) lies in accessible chunks mapped by cuMemMap (sim_vm.cc). */
int nd_sim_vm_mapped(const void *p, size_t n);

/* 1 for the default streams and streams made by cudaStreamCreate*. */
int nd_sim_stream_valid(cudaStream_t stream);

/* 1 for a stream that synchronises with the legacy stream: made without
 * cudaStreamNonBlocking, or cudaStreamPerThread. */
int nd_sim_stream_blocking(cudaStream_t stream);

/* ------------------------------------------------ stream capture (sim_graph.cc)
 *
 * An operation queued on a stream (a launch, an async copy or memset, a cuBLAS
 * call, a graph launch) asks nd_sim_route where it goes: run now, recorded
 * into the stream's capture, or refused. What it does is an nd_sim_work, run
 * now or at every replay of the graph, on the stream the replay is launched
 * into; it returns cudaSuccess or the error it recorded with nd_sim_fail. */
typedef std::function<cudaError_t(cudaStream_t)> nd_sim_work;

/* 0: run the operation now; > 0: the id of the capture to record it into
 * (nd_sim_capture); -1: refused, *err recorded: the stream's capture was
 * invalidated (cudaErrorStreamCaptureInvalidated), or it is the legacy stream
 * while a blocking stream captures (cudaErrorStreamCaptureImplicit, which
 * invalidates that capture). The stream must be valid. */
int64_t nd_sim_route(cudaStream_t stream, const char *call, cudaError_t *err);

/* Records work as a node of capture id; runs it now if that capture has ended
 * since nd_sim_route. call names the node in errors (a string literal). */
cudaError_t nd_sim_capture(cudaStream_t stream, int64_t id, enum cudaGraphNodeType kind,
                           const char *call, nd_sim_work work);

/* The capture-mode rule for a "potentially unsafe" call (cudaMalloc, cudaFree,
 * cudaMallocHost, cudaFreeHost, synchronous copies and memsets,
 * cudaDeviceSynchronize, the driver's cuMemCreate/Map/Unmap/Release): refused
 * with cudaErrorStreamCaptureUnsupported, invalidating the captures that
 * forbid it, as cudaThreadExchangeStreamCaptureMode describes; else cudaSuccess. */
cudaError_t nd_sim_unsafe(const char *call);

/* cudaStreamSynchronize / cudaStreamQuery of stream during a capture: refused
 * for a capturing stream (cudaErrorStreamCaptureUnsupported, invalidating; or
 * cudaErrorStreamCaptureInvalidated when it was already) and for the legacy
 * stream while a blocking stream captures (cudaErrorStreamCaptureImplicit). */
cudaError_t nd_sim_sync_check(cudaStream_t stream, const char *call);

/* An event last recorded into capture `event_capture` (0: none) is queried,
 * synchronised or timed: while that capture goes on, cudaErrorCapturedEvent,
 * invalidating it. */
cudaError_t nd_sim_event_check(int64_t event_capture, const char *call);

/* A stream in capture `stream_capture` (0: none) waits on such an event: fine
 * within the same capture; from outside it CUDA would join the stream to the
 * capture, which the simulator does not model: cudaErrorStreamCaptureUnsupported,
 * invalidating the event's capture. */
cudaError_t nd_sim_event_wait_check(int64_t event_capture, int64_t stream_capture,
                                    const char *call);

/* 1 while stream captures (active or invalidated, not yet ended). */
int nd_sim_stream_capturing(cudaStream_t stream);

#endif /* NEEDLE_SIM_INTERNAL_H */
