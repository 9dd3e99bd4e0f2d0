/* cuda_graph.cu: CUDA graph capture and replay (PyTorch's torch.cuda.graphs
 * underneath ndl.cuda.CUDAGraph): the graph pools' references, the capture's
 * begin and end with the allocator and the collector kept out of it, and
 * replay.
 *
 * A capture records the calling thread's current stream in CUDA's global
 * mode, so that anything that cannot be replayed (a host synchronisation, a
 * cudaMalloc outside the allocator's relaxed window, work on the legacy
 * stream) fails at once instead of being silently left out of the graph.
 * While it runs the allocator serves it from the graph's pool and holds back
 * frees of other blocks, and the engine defers collections and the cache's
 * release (nd_memory_begin_capture): a finalizer freeing memory, or a
 * cudaFree, inside a capture would invalidate it or hand the graph's memory
 * to other work.
 *
 * The host serialises calls (the GIL). Never prints, exits or aborts.
 */
#include "cuda_common.cuh"

#include <stdlib.h>

struct nd_cuda_graph {
    int ordinal;
    int pool;
    uint64_t *replay_counter; /* device memory: how many replays ran (random draws read it) */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    int64_t nodes;
    struct nd_cuda_graph *next_doomed; /* destroyed during a capture: waits for its end */
};

/* A pool's references: graphs captured into it and the handles that name it. */
typedef struct pool_ref {
    int id;
    int64_t refs;
} pool_ref;

#define MAX_POOLS 256

static struct {
    pool_ref pools[MAX_POOLS];
    int npools;
    /* The capture under way: its pool and stream (NULL stream: none). */
    int capture_pool;
    cudaStream_t capture_stream;
    uint64_t *capture_counter; /* the capture's replay counter (the graph's once it ends) */
    int capture_draws;         /* random draws captured: the graph must advance the counter */
    nd_cuda_graph *doomed;     /* graphs destroyed during the capture */
} gpus[ND_CUDA_MAX_DEVICES];

static int next_pool_id = 1;

/* The last node of a graph with random draws: the next replay draws anew. */
__global__ void advance_replay_counter_kernel(uint64_t *counter) { *counter += 1; }

/* The replay counter's memory: one allocation (a small block) per graph. */
#define COUNTER_BYTES ((int64_t)sizeof(uint64_t))

static void free_counter(int ordinal, uint64_t *counter) {
    if (counter != NULL) nd_memory_free(nd_cuda_device(ordinal), counter, COUNTER_BYTES);
}

static pool_ref *find_pool(int ordinal, int id) {
    for (int i = 0; i < gpus[ordinal].npools; i++)
        if (gpus[ordinal].pools[i].id == id) return &gpus[ordinal].pools[i];
    return NULL;
}

static nd_status check_gpu(int ordinal) {
    if (!nd_cuda_registered(ordinal))
        return nd_fail(ND_ERR_DEVICE, "there is no CUDA device %d", ordinal);
    return ND_OK;
}

extern "C" nd_status nd_cuda_graph_pool_create(int ordinal, int *out) {
    *out = 0;
    ND_TRY(check_gpu(ordinal));
    if (gpus[ordinal].npools >= MAX_POOLS)
        return nd_fail(ND_ERR_VALUE, "cuda:%d has %d CUDA graph pools alive, the most it keeps",
                       ordinal, MAX_POOLS);
    pool_ref *p = &gpus[ordinal].pools[gpus[ordinal].npools++];
    p->id = next_pool_id++;
    p->refs = 1;
    *out = p->id;
    return ND_OK;
}

extern "C" nd_status nd_cuda_graph_pool_retain(int ordinal, int pool) {
    ND_TRY(check_gpu(ordinal));
    pool_ref *p = find_pool(ordinal, pool);
    if (p == NULL)
        return nd_fail(ND_ERR_VALUE, "there is no CUDA graph pool %d on cuda:%d", pool, ordinal);
    p->refs++;
    return ND_OK;
}

extern "C" void nd_cuda_graph_pool_release(int ordinal, int pool) {
    if (!nd_cuda_registered(ordinal)) return;
    pool_ref *p = find_pool(ordinal, pool);
    if (p == NULL || --p->refs > 0) return;
    /* A capture into it keeps it (its graph takes a reference at the end). */
    if (gpus[ordinal].capture_stream != NULL && gpus[ordinal].capture_pool == pool) {
        p->refs = 0;
        return;
    }
    nd_cuda_allocator_dissolve_pool(nd_cuda_device(ordinal), pool);
    *p = gpus[ordinal].pools[--gpus[ordinal].npools];
}

extern "C" int nd_cuda_graph_capturing(int ordinal) {
    return nd_cuda_registered(ordinal) && gpus[ordinal].capture_stream != NULL;
}

extern "C" nd_status nd_cuda_graph_capture_begin(int ordinal, int pool) {
    ND_TRY(check_gpu(ordinal));
    if (gpus[ordinal].capture_stream != NULL)
        return nd_fail(ND_ERR_VALUE,
                       "a CUDA graph is already being captured on cuda:%d: captures do not nest",
                       ordinal);
    ND_TRY(nd_cuda_set_device(ordinal));
    if (pool == 0) {
        ND_TRY(nd_cuda_graph_pool_create(ordinal, &pool));
    } else {
        ND_TRY(nd_cuda_graph_pool_retain(ordinal, pool));
    }
    cudaStream_t stream = nd_cuda_stream();
    nd_device *dev = nd_cuda_device(ordinal);
    /* The replay counter, zeroed before the capture so the zeroing is not
     * part of the graph (the first replay reads 0). */
    void *counter = NULL;
    nd_status status = nd_memory_alloc(dev, COUNTER_BYTES, &counter);
    if (status == ND_OK &&
        nd_cuda_memset(counter, 0, (size_t)COUNTER_BYTES, stream) != cudaSuccess) {
        (void)cudaGetLastError();
        status = nd_fail(ND_ERR_BACKEND, "could not zero a CUDA graph's replay counter on cuda:%d",
                         ordinal);
    }
    if (status != ND_OK) {
        free_counter(ordinal, (uint64_t *)counter);
        nd_cuda_graph_pool_release(ordinal, pool);
        return status;
    }
    /* The pool's reference is the capture's until the graph takes it. */
    gpus[ordinal].capture_pool = pool;
    gpus[ordinal].capture_stream = stream;
    gpus[ordinal].capture_counter = (uint64_t *)counter;
    gpus[ordinal].capture_draws = 0;
    nd_cuda_allocator_begin_capture(dev, pool);
    nd_memory_begin_capture(dev);
    cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal);
    if (err != cudaSuccess) {
        (void)cudaGetLastError();
        nd_cuda_graph_capture_abandon(ordinal);
        return nd_fail(ND_ERR_BACKEND, "CUDA error %s (%s): cudaStreamBeginCapture on cuda:%d",
                       cudaGetErrorName(err), cudaGetErrorString(err), ordinal);
    }
    return ND_OK;
}

/* The GPU leaves capture mode: the allocator gives back the frees it held,
 * the engine runs the collection asked for meanwhile. */
static void leave_capture(int ordinal) {
    nd_device *dev = nd_cuda_device(ordinal);
    gpus[ordinal].capture_stream = NULL;
    gpus[ordinal].capture_counter = NULL; /* the caller keeps it: the graph's, or freed */
    nd_cuda_allocator_end_capture(dev);
    while (gpus[ordinal].doomed != NULL) {
        nd_cuda_graph *g = gpus[ordinal].doomed;
        gpus[ordinal].doomed = g->next_doomed;
        nd_cuda_graph_destroy(g);
    }
    nd_memory_end_capture(dev);
}

extern "C" void nd_cuda_graph_capture_abandon(int ordinal) {
    if (!nd_cuda_graph_capturing(ordinal)) return;
    (void)nd_cuda_set_device(ordinal);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    cudaStream_t stream = gpus[ordinal].capture_stream;
    if (cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
        cudaGraph_t graph = NULL;
        (void)cudaStreamEndCapture(stream, &graph);
        if (graph != NULL) (void)cudaGraphDestroy(graph);
    }
    (void)cudaGetLastError();
    const int pool = gpus[ordinal].capture_pool;
    uint64_t *counter = gpus[ordinal].capture_counter;
    leave_capture(ordinal);
    free_counter(ordinal, counter);
    nd_cuda_graph_pool_release(ordinal, pool);
}

nd_status nd_cuda_graph_replay_counter(int ordinal, const uint64_t **out) {
    *out = NULL;
    if (!nd_cuda_graph_capturing(ordinal))
        return nd_fail(ND_ERR_INTERNAL, "no CUDA graph is being captured on cuda:%d", ordinal);
    gpus[ordinal].capture_draws++;
    *out = gpus[ordinal].capture_counter;
    return ND_OK;
}

extern "C" nd_status nd_cuda_graph_capture_end(int ordinal, nd_cuda_graph **out) {
    *out = NULL;
    ND_TRY(check_gpu(ordinal));
    if (gpus[ordinal].capture_stream == NULL)
        return nd_fail(ND_ERR_VALUE, "no CUDA graph is being captured on cuda:%d", ordinal);
    ND_TRY(nd_cuda_set_device(ordinal));
    cudaStream_t stream = gpus[ordinal].capture_stream;
    const int pool = gpus[ordinal].capture_pool;
    if (nd_cuda_stream() != stream) {
        nd_cuda_graph_capture_abandon(ordinal);
        return nd_fail(ND_ERR_VALUE,
                       "the CUDA graph capture on cuda:%d ended on another stream than it began "
                       "on; the capture is abandoned",
                       ordinal);
    }
    uint64_t *counter = gpus[ordinal].capture_counter;
    if (gpus[ordinal].capture_draws > 0) {
        ND_LAUNCH(advance_replay_counter_kernel, 1, 1, 0, stream, counter);
        (void)cudaGetLastError(); /* a failure here fails the capture, reported below */
    }
    cudaGraph_t graph = NULL;
    cudaError_t err = cudaStreamEndCapture(stream, &graph);
    if (err != cudaSuccess || graph == NULL) {
        (void)cudaGetLastError();
        if (graph != NULL) (void)cudaGraphDestroy(graph);
        leave_capture(ordinal);
        free_counter(ordinal, counter);
        nd_cuda_graph_pool_release(ordinal, pool);
        return nd_fail(ND_ERR_BACKEND,
                       "the CUDA graph capture on cuda:%d failed (%s: %s): an operation inside "
                       "it could not be captured (a host synchronisation such as .numpy() or "
                       ".item(), or work outside needle's streams); the capture is abandoned",
                       ordinal, cudaGetErrorName(err), cudaGetErrorString(err));
    }
    leave_capture(ordinal);
    nd_cuda_graph *g = (nd_cuda_graph *)calloc(1, sizeof *g);
    size_t nodes = 0;
    cudaGraphExec_t exec = NULL;
    if (g != NULL) err = cudaGraphGetNodes(graph, NULL, &nodes);
    if (g != NULL && err == cudaSuccess) err = cudaGraphInstantiate(&exec, graph, 0);
    if (g == NULL || err != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaGraphDestroy(graph);
        free(g);
        free_counter(ordinal, counter);
        nd_cuda_graph_pool_release(ordinal, pool);
        if (g == NULL) return nd_fail(ND_ERR_BACKEND, "out of host memory for a CUDA graph");
        return nd_fail(ND_ERR_BACKEND, "CUDA error %s (%s): cudaGraphInstantiate on cuda:%d",
                       cudaGetErrorName(err), cudaGetErrorString(err), ordinal);
    }
    g->ordinal = ordinal;
    g->pool = pool; /* the capture's reference is the graph's now */
    g->replay_counter = counter;
    g->graph = graph;
    g->exec = exec;
    g->nodes = (int64_t)nodes;
    *out = g;
    return ND_OK;
}

extern "C" nd_status nd_cuda_graph_replay(nd_cuda_graph *g) {
    ND_TRY(nd_cuda_set_device(g->ordinal));
    if (gpus[g->ordinal].capture_stream != NULL)
        return nd_fail(ND_ERR_VALUE,
                       "a CUDA graph cannot be replayed while another is being captured on cuda:%d",
                       g->ordinal);
    ND_CUDA_CHECK(nd_cuda_graph_launch(g->exec, g->nodes, nd_cuda_stream()));
    return ND_OK;
}

extern "C" void nd_cuda_graph_destroy(nd_cuda_graph *g) {
    if (g == NULL) return;
    if (gpus[g->ordinal].capture_stream != NULL) {
        /* A graph dropped during a capture (a collection's finalizer): the
         * wait and the destroy below would invalidate the capture. */
        g->next_doomed = gpus[g->ordinal].doomed;
        gpus[g->ordinal].doomed = g;
        return;
    }
    if (nd_cuda_set_device(g->ordinal) == ND_OK) {
        /* Its pool's blocks may go to the cache next: the replays queued so
         * far, on any stream, must be done with them. */
        (void)nd_cuda_synchronize();
        (void)cudaGraphExecDestroy(g->exec);
        (void)cudaGraphDestroy(g->graph);
    }
    (void)cudaGetLastError();
    free_counter(g->ordinal, g->replay_counter);
    nd_cuda_graph_pool_release(g->ordinal, g->pool);
    free(g);
}

extern "C" int nd_cuda_graph_pool(const nd_cuda_graph *g) { return g->pool; }
extern "C" int64_t nd_cuda_graph_nodes(const nd_cuda_graph *g) { return g->nodes; }
