/* sim_graph.cc: stream capture and CUDA graphs in the simulator, so that code
 * which captures a step with cudaStreamBeginCapture/EndCapture and replays it
 * with cudaGraphLaunch (as torch.cuda.CUDAGraph does) runs in CI, and so that
 * what CUDA refuses during a capture is refused here too.
 *
 * While a stream captures, what is queued on it (launches, async copies and
 * memsets, cuBLAS calls, graph launches) asks nd_sim_route and is recorded as
 * a node instead of running: a launch keeps a heap copy of its converted
 * arguments, a copy keeps its pointers (host memory is read or written at
 * each replay, as on a GPU). cudaGraphInstantiate copies the node list (the
 * nodes share the copied arguments), so the graph may be destroyed after;
 * cudaGraphLaunch runs the nodes in order, synchronously, on the calling
 * thread, and returns the first node's failure (a launch failure, a copy into
 * memory that is no longer a live block). Launching a graph into a capturing
 * stream records it as one child-graph node, as CUDA does.
 *
 * The rules, from CUDA's documentation of cudaStreamBeginCapture and
 * cudaThreadExchangeStreamCaptureMode: the legacy stream cannot be captured;
 * "potentially unsafe" calls (nd_sim_unsafe) are refused by the mode of the
 * calling thread (global: while this thread has a capture not begun relaxed,
 * or any thread one begun global; thread-local: while this thread has one not
 * relaxed; relaxed: never); synchronising or querying a capturing stream, or
 * an event recorded into a capture that goes on, is refused whatever the
 * mode; using the legacy stream while a blocking stream (one made without
 * cudaStreamNonBlocking) captures is cudaErrorStreamCaptureImplicit. A refused
 * call invalidates the captures concerned: work queued on the stream after
 * that fails with cudaErrorStreamCaptureInvalidated and cudaStreamEndCapture
 * returns that error and no graph. A capture not begun relaxed must end on
 * the thread that began it.
 *
 * Not simulated: a capture spanning several streams (cudaStreamWaitEvent on
 * an event recorded into a capture, from a stream outside it, which CUDA
 * answers by joining that stream to the capture) is refused with
 * cudaErrorStreamCaptureUnsupported and invalidates the capture; destroying a
 * capturing stream is refused the same way (CUDA leaves it undefined). Never
 * prints, exits or aborts.
 */
/* The C++ library first: it trips on sim_device.h's __noinline__ macro. */
#include <stdio.h>

#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <vector>

#include "sim_internal.h"

namespace {

struct node {
    cudaGraphNodeType kind;
    const char *call; /* what queued it, for errors */
    nd_sim_work work;
};

/* A captured graph: its nodes have stable addresses, which are the
 * cudaGraphNode_t handles cudaGraphGetNodes hands out. */
struct sim_graph {
    std::vector<std::unique_ptr<node>> nodes;
};

/* An instantiated graph: copies of the nodes (sharing the captured arguments). */
struct sim_exec {
    std::vector<node> nodes;
};

struct capture {
    int64_t id;
    cudaStream_t stream;
    std::thread::id thread; /* that began it */
    cudaStreamCaptureMode mode;
    bool blocking; /* the legacy stream would depend on it */
    bool invalidated;
    char why[160]; /* the call that invalidated it */
    std::vector<std::unique_ptr<node>> nodes;
};

std::mutex graph_mutex;                   /* guards everything below */
std::map<const void *, capture> captures; /* by stream_key */
int64_t next_capture_id = 1;
std::set<sim_graph *> graphs;
std::set<const node *> graph_nodes; /* the nodes of live graphs */
/* shared: a launch runs an exec outside the lock while another thread may destroy it */
std::map<sim_exec *, std::shared_ptr<sim_exec>> execs;

thread_local cudaStreamCaptureMode thread_mode = cudaStreamCaptureModeGlobal;
/* Its address tells apart the threads' cudaStreamPerThread. */
thread_local char per_thread_stream;

bool is_legacy(cudaStream_t stream) { return stream == nullptr || stream == cudaStreamLegacy; }

const void *stream_key(cudaStream_t stream) {
    return stream == cudaStreamPerThread ? (const void *)&per_thread_stream : (const void *)stream;
}

capture *find_locked(cudaStream_t stream) {
    auto it = captures.find(stream_key(stream));
    return it == captures.end() ? nullptr : &it->second;
}

capture *find_id_locked(int64_t id) {
    for (auto &entry : captures)
        if (entry.second.id == id) return &entry.second;
    return nullptr;
}

void invalidate_locked(capture &c, const char *call) {
    if (c.invalidated) return;
    c.invalidated = true;
    snprintf(c.why, sizeof c.why, "%s", call);
    c.nodes.clear(); /* nothing recorded will ever run */
}

const char *mode_name(cudaStreamCaptureMode mode) {
    switch (mode) {
    case cudaStreamCaptureModeGlobal: return "global";
    case cudaStreamCaptureModeThreadLocal: return "thread-local";
    default: return "relaxed";
    }
}

/* The legacy stream used while blocking streams capture: each capture is
 * invalidated and the use refused; cudaSuccess when none captures. */
cudaError_t legacy_use_locked(const char *call, bool invalidate) {
    const capture *blocking = nullptr;
    for (auto &entry : captures) {
        if (!entry.second.blocking) continue;
        if (invalidate) invalidate_locked(entry.second, call);
        blocking = &entry.second;
    }
    if (blocking == nullptr) return cudaSuccess;
    return nd_sim_fail(cudaErrorStreamCaptureImplicit,
                       "%s on the legacy stream while blocking stream %p captures%s", call,
                       (void *)blocking->stream, invalidate ? "; the capture is invalidated" : "");
}

cudaError_t run_nodes(const std::vector<node> &nodes, cudaStream_t stream) {
    for (const node &n : nodes) {
        cudaError_t err = n.work(stream);
        if (err != cudaSuccess) return err; /* recorded, with the node's detail */
    }
    return cudaSuccess;
}

} /* namespace */

/* ============================================================ internals */

int64_t nd_sim_route(cudaStream_t stream, const char *call, cudaError_t *err) {
    std::lock_guard<std::mutex> lock(graph_mutex);
    *err = cudaSuccess;
    if (is_legacy(stream)) {
        *err = legacy_use_locked(call, true);
        return *err == cudaSuccess ? 0 : -1;
    }
    capture *c = find_locked(stream);
    if (c == nullptr) return 0;
    if (c->invalidated) {
        *err = nd_sim_fail(cudaErrorStreamCaptureInvalidated,
                           "%s on stream %p, whose capture %s invalidated; end it with "
                           "cudaStreamEndCapture",
                           call, (void *)stream, c->why);
        return -1;
    }
    return c->id;
}

cudaError_t nd_sim_capture(cudaStream_t stream, int64_t id, enum cudaGraphNodeType kind,
                           const char *call, nd_sim_work work) {
    {
        std::lock_guard<std::mutex> lock(graph_mutex);
        capture *c = find_id_locked(id);
        if (c != nullptr && c->invalidated)
            return nd_sim_fail(cudaErrorStreamCaptureInvalidated,
                               "%s on stream %p, whose capture %s invalidated", call,
                               (void *)stream, c->why);
        if (c != nullptr) {
            try {
                c->nodes.push_back(std::unique_ptr<node>(new node{kind, call, std::move(work)}));
            } catch (const std::bad_alloc &) {
                return nd_sim_fail(cudaErrorMemoryAllocation, "%s: no host memory for a node",
                                   call);
            }
            return cudaSuccess;
        }
    }
    return work(stream); /* the capture ended meanwhile: the stream runs it */
}

cudaError_t nd_sim_unsafe(const char *call) {
    const cudaStreamCaptureMode mode = thread_mode;
    if (mode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
    const std::thread::id me = std::this_thread::get_id();
    std::lock_guard<std::mutex> lock(graph_mutex);
    const capture *forbids = nullptr;
    for (auto &entry : captures) {
        capture &c = entry.second;
        const bool own = c.thread == me;
        if ((own && c.mode != cudaStreamCaptureModeRelaxed) ||
            (!own && c.mode == cudaStreamCaptureModeGlobal &&
             mode == cudaStreamCaptureModeGlobal)) {
            invalidate_locked(c, call);
            forbids = &c;
        }
    }
    if (forbids == nullptr) return cudaSuccess;
    return nd_sim_fail(cudaErrorStreamCaptureUnsupported,
                       "%s (a potentially unsafe call) in %s mode while stream %p captures in %s "
                       "mode on %s thread; the capture is invalidated",
                       call, mode_name(mode), (void *)forbids->stream, mode_name(forbids->mode),
                       forbids->thread == me ? "this" : "another");
}

cudaError_t nd_sim_sync_check(cudaStream_t stream, const char *call) {
    std::lock_guard<std::mutex> lock(graph_mutex);
    if (is_legacy(stream)) return legacy_use_locked(call, true);
    capture *c = find_locked(stream);
    if (c == nullptr) return cudaSuccess;
    if (c->invalidated)
        return nd_sim_fail(cudaErrorStreamCaptureInvalidated,
                           "%s of stream %p, whose capture %s invalidated", call, (void *)stream,
                           c->why);
    invalidate_locked(*c, call);
    return nd_sim_fail(cudaErrorStreamCaptureUnsupported,
                       "%s of stream %p while it captures; the capture is invalidated", call,
                       (void *)stream);
}

cudaError_t nd_sim_event_check(int64_t event_capture, const char *call) {
    if (event_capture == 0) return cudaSuccess;
    std::lock_guard<std::mutex> lock(graph_mutex);
    capture *c = find_id_locked(event_capture);
    if (c == nullptr) return cudaSuccess; /* that capture has ended */
    invalidate_locked(*c, call);
    return nd_sim_fail(cudaErrorCapturedEvent,
                       "%s of an event recorded into the capture of stream %p, which goes on; "
                       "the capture is invalidated",
                       call, (void *)c->stream);
}

cudaError_t nd_sim_event_wait_check(int64_t event_capture, int64_t stream_capture,
                                    const char *call) {
    if (event_capture == 0 || event_capture == stream_capture) return cudaSuccess;
    std::lock_guard<std::mutex> lock(graph_mutex);
    capture *c = find_id_locked(event_capture);
    if (c == nullptr) return cudaSuccess;
    invalidate_locked(*c, call);
    return nd_sim_fail(cudaErrorStreamCaptureUnsupported,
                       "%s on an event recorded into the capture of stream %p from a stream "
                       "outside it: CUDA would join that stream to the capture, which the "
                       "simulator does not model (one stream per capture); the capture is "
                       "invalidated",
                       call, (void *)c->stream);
}

int nd_sim_stream_capturing(cudaStream_t stream) {
    std::lock_guard<std::mutex> lock(graph_mutex);
    return find_locked(stream) != nullptr;
}

/* ============================================================ the CUDA API */

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    if (is_legacy(stream))
        return nd_sim_fail(cudaErrorStreamCaptureUnsupported,
                           "cudaStreamBeginCapture: the legacy stream cannot be captured");
    if (!nd_sim_stream_valid(stream))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture(%p)",
                           (void *)stream);
    if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
        mode != cudaStreamCaptureModeRelaxed)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: mode %d", (int)mode);
    const bool blocking = nd_sim_stream_blocking(stream) != 0;
    std::lock_guard<std::mutex> lock(graph_mutex);
    if (find_locked(stream) != nullptr)
        return nd_sim_fail(cudaErrorIllegalState,
                           "cudaStreamBeginCapture: stream %p is already capturing",
                           (void *)stream);
    try {
        capture &c = captures[stream_key(stream)];
        c.id = next_capture_id++;
        c.stream = stream;
        c.thread = std::this_thread::get_id();
        c.mode = mode;
        c.blocking = blocking;
        c.invalidated = false;
        c.why[0] = '\0';
    } catch (const std::bad_alloc &) {
        return nd_sim_fail(cudaErrorMemoryAllocation, "cudaStreamBeginCapture");
    }
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
    if (!nd_sim_stream_valid(stream))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaStreamEndCapture(%p)",
                           (void *)stream);
    if (pGraph == nullptr)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaStreamEndCapture: NULL graph pointer");
    *pGraph = nullptr;
    std::unique_ptr<sim_graph> g(new (std::nothrow) sim_graph);
    if (g == nullptr) return nd_sim_fail(cudaErrorMemoryAllocation, "cudaStreamEndCapture");
    std::lock_guard<std::mutex> lock(graph_mutex);
    auto it = captures.find(stream_key(stream));
    if (it == captures.end())
        return nd_sim_fail(cudaErrorIllegalState,
                           "cudaStreamEndCapture: stream %p is not capturing", (void *)stream);
    capture &c = it->second;
    if (c.mode != cudaStreamCaptureModeRelaxed && c.thread != std::this_thread::get_id())
        return nd_sim_fail(cudaErrorStreamCaptureWrongThread,
                           "cudaStreamEndCapture: stream %p's %s-mode capture was begun on "
                           "another thread",
                           (void *)stream, mode_name(c.mode));
    if (c.invalidated) {
        char why[sizeof c.why];
        snprintf(why, sizeof why, "%s", c.why);
        captures.erase(it);
        return nd_sim_fail(cudaErrorStreamCaptureInvalidated,
                           "cudaStreamEndCapture: %s invalidated the capture of stream %p", why,
                           (void *)stream);
    }
    try {
        for (const auto &n : c.nodes) graph_nodes.insert(n.get());
        graphs.insert(g.get());
    } catch (const std::bad_alloc &) {
        for (const auto &n : c.nodes) graph_nodes.erase(n.get());
        return nd_sim_fail(cudaErrorMemoryAllocation, "cudaStreamEndCapture");
    }
    g->nodes = std::move(c.nodes);
    captures.erase(it);
    *pGraph = (cudaGraph_t)g.release();
    return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus *status) {
    if (status == nullptr)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaStreamIsCapturing: NULL status");
    if (!nd_sim_stream_valid(stream))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaStreamIsCapturing(%p)",
                           (void *)stream);
    std::lock_guard<std::mutex> lock(graph_mutex);
    *status = cudaStreamCaptureStatusNone;
    if (is_legacy(stream)) return legacy_use_locked("cudaStreamIsCapturing", false);
    const capture *c = find_locked(stream);
    if (c != nullptr)
        *status =
            c->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
    if (mode == nullptr)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaThreadExchangeStreamCaptureMode: NULL");
    if (*mode != cudaStreamCaptureModeGlobal && *mode != cudaStreamCaptureModeThreadLocal &&
        *mode != cudaStreamCaptureModeRelaxed)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaThreadExchangeStreamCaptureMode: mode %d",
                           (int)*mode);
    const cudaStreamCaptureMode previous = thread_mode;
    thread_mode = *mode;
    *mode = previous;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags) {
    if (pGraphExec == nullptr)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaGraphInstantiate: NULL exec pointer");
    *pGraphExec = nullptr;
    /* A graph here has no memory nodes, so freeing them on launch changes nothing. */
    if ((flags & ~(unsigned long long)cudaGraphInstantiateFlagAutoFreeOnLaunch) != 0)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaGraphInstantiate: flags %llu", flags);
    std::lock_guard<std::mutex> lock(graph_mutex);
    sim_graph *g = (sim_graph *)graph;
    if (graphs.count(g) == 0)
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaGraphInstantiate(graph %p)",
                           (void *)graph);
    try {
        std::shared_ptr<sim_exec> exec = std::make_shared<sim_exec>();
        exec->nodes.reserve(g->nodes.size());
        for (const auto &n : g->nodes) exec->nodes.push_back(*n);
        execs[exec.get()] = exec;
        *pGraphExec = (cudaGraphExec_t)exec.get();
    } catch (const std::bad_alloc &) {
        return nd_sim_fail(cudaErrorMemoryAllocation, "cudaGraphInstantiate");
    }
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    std::shared_ptr<sim_exec> exec;
    {
        std::lock_guard<std::mutex> lock(graph_mutex);
        auto it = execs.find((sim_exec *)graphExec);
        if (it != execs.end()) exec = it->second;
    }
    if (exec == nullptr)
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch(exec %p)",
                           (void *)graphExec);
    if (!nd_sim_stream_valid(stream))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: stream %p",
                           (void *)stream);
    cudaError_t err = cudaSuccess;
    const int64_t id = nd_sim_route(stream, "cudaGraphLaunch", &err);
    if (id < 0) return err;
    if (id > 0) /* a child-graph node that keeps the exec's nodes */
        return nd_sim_capture(stream, id, cudaGraphNodeTypeGraph, "cudaGraphLaunch",
                              [exec](cudaStream_t s) { return run_nodes(exec->nodes, s); });
    return run_nodes(exec->nodes, stream);
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t graphExec) {
    std::shared_ptr<sim_exec> exec; /* released after the lock, with its nodes */
    std::lock_guard<std::mutex> lock(graph_mutex);
    auto it = execs.find((sim_exec *)graphExec);
    if (it == execs.end())
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaGraphExecDestroy(%p)",
                           (void *)graphExec);
    exec = std::move(it->second);
    execs.erase(it);
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    sim_graph *g = (sim_graph *)graph;
    {
        std::lock_guard<std::mutex> lock(graph_mutex);
        if (graphs.erase(g) == 0)
            return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaGraphDestroy(%p)",
                               (void *)graph);
        for (const auto &n : g->nodes) graph_nodes.erase(n.get());
    }
    delete g;
    return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t *nodes, size_t *numNodes) {
    if (numNodes == nullptr)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaGraphGetNodes: NULL count");
    std::lock_guard<std::mutex> lock(graph_mutex);
    const sim_graph *g = (const sim_graph *)graph;
    if (graphs.count((sim_graph *)g) == 0)
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "cudaGraphGetNodes(%p)", (void *)graph);
    const size_t count = g->nodes.size();
    if (nodes == nullptr) {
        *numNodes = count;
        return cudaSuccess;
    }
    /* As CUDA: up to *numNodes handles, NULL past the last, and the count obtained. */
    for (size_t i = 0; i < *numNodes; i++)
        nodes[i] = i < count ? (cudaGraphNode_t)g->nodes[i].get() : nullptr;
    if (*numNodes > count) *numNodes = count;
    return cudaSuccess;
}

cudaError_t cudaGraphNodeGetType(cudaGraphNode_t node_handle, enum cudaGraphNodeType *pType) {
    if (pType == nullptr)
        return nd_sim_fail(cudaErrorInvalidValue, "cudaGraphNodeGetType: NULL type");
    std::lock_guard<std::mutex> lock(graph_mutex);
    const node *n = (const node *)node_handle;
    if (graph_nodes.count(n) == 0)
        return nd_sim_fail(cudaErrorInvalidValue,
                           "cudaGraphNodeGetType(%p): not a node of a live graph",
                           (void *)node_handle);
    *pType = n->kind;
    return cudaSuccess;
}

} /* extern "C" */
