/* cuda_sim_capture.cc: the CUDA simulator's self-test of stream capture and
 * graphs (csrc/cuda/sim/sim_graph.cc), linked into cuda_sim_selftest: work
 * captured on a stream does not run; the instantiated graph replays it with
 * the captured arguments, reading host buffers afresh, after the graph is
 * destroyed; the calls CUDA refuses during a capture are refused with CUDA's
 * errors and invalidate it, by the rules of the capture modes and threads;
 * events, the legacy stream, graphs launched into captures, failures at
 * replay, and cuBLAS calls captured through their handle's stream.
 */
#include "cuda_sim_selftest.h"

#include <string.h>

/* x[i] += 1, grid-stride (so a capped grid gives the same result). */
__global__ void add_one_kernel(float *x, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] += 1.0f;
}

__global__ void scale_kernel(const float *in, float *out, float factor, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        out[i] = in[i] * factor;
}

static cudaStreamCaptureStatus capture_status(cudaStream_t s) {
    cudaStreamCaptureStatus status = (cudaStreamCaptureStatus)-1;
    CHECK(cudaStreamIsCapturing(s, &status) == cudaSuccess);
    return status;
}

static size_t node_count(cudaGraph_t graph) {
    size_t n = 12345;
    CHECK(cudaGraphGetNodes(graph, nullptr, &n) == cudaSuccess);
    return n;
}

/* Instantiates graph, destroys it, launches the exec `times` on s, destroys it. */
static void replay(cudaGraph_t graph, cudaStream_t s, int times) {
    cudaGraphExec_t exec = nullptr;
    CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess && exec != nullptr);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);
    for (int r = 0; r < times; r++) CHECK(cudaGraphLaunch(exec, s) == cudaSuccess);
    CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
}

/* Runs `steps` on s: the copies, kernels and memset a captured step replays. */
static void step(cudaStream_t s, const float *host_in, float *host_out, float *a, float *b,
                 float *zeros, float *acc, float *c, int n) {
    const size_t bytes = (size_t)n * sizeof(float);
    float factor = 2.0f;
    CHECK(cudaMemcpyAsync(a, host_in, bytes, cudaMemcpyHostToDevice, s) == cudaSuccess);
    ND_LAUNCH(scale_kernel, 4, 128, 0, s, a, b, factor, n);
    factor = 100.0f; /* the launch converted and kept its value: 2 */
    (void)factor;
    CHECK(cudaMemsetAsync(zeros, 0, bytes, s) == cudaSuccess);
    ND_LAUNCH(add_one_kernel, 3, 64, 0, s, acc, n);
    CHECK(cudaMemcpyAsync(c, b, bytes, cudaMemcpyDeviceToDevice, s) == cudaSuccess);
    CHECK(cudaMemcpyAsync(host_out, c, bytes, cudaMemcpyDeviceToHost, s) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
}

static void test_capture_and_replay() {
    const int n = 1000;
    cudaStream_t s = nullptr;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    float *a = device_array(n, 0.0f), *b = device_array(n, -1.0f), *c = device_array(n, -1.0f);
    float *zeros = device_array(n, 9.0f), *acc = device_array(n, 5.0f);
    static float host_in[n], host_out[n], eager_out[n];
    for (int i = 0; i < n; i++) host_in[i] = (float)i, host_out[i] = -7.0f;

    CHECK(capture_status(s) == cudaStreamCaptureStatusNone);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
    step(s, host_in, host_out, a, b, zeros, acc, c, n);
    int ran = 0; /* nothing ran: every buffer as it was */
    for (int i = 0; i < n; i++)
        ran += a[i] != 0.0f || b[i] != -1.0f || c[i] != -1.0f || zeros[i] != 9.0f ||
               acc[i] != 5.0f || host_out[i] != -7.0f;
    CHECK(ran == 0);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess && graph != nullptr);
    CHECK(capture_status(s) == cudaStreamCaptureStatusNone);

    CHECK(node_count(graph) == 6);
    cudaGraphNode_t nodes[8];
    size_t count = 8;
    CHECK(cudaGraphGetNodes(graph, nodes, &count) == cudaSuccess && count == 6);
    CHECK(nodes[6] == nullptr && nodes[7] == nullptr);
    const cudaGraphNodeType kinds[6] = {cudaGraphNodeTypeMemcpy, cudaGraphNodeTypeKernel,
                                        cudaGraphNodeTypeMemset, cudaGraphNodeTypeKernel,
                                        cudaGraphNodeTypeMemcpy, cudaGraphNodeTypeMemcpy};
    for (int i = 0; i < 6; i++) {
        cudaGraphNodeType kind = (cudaGraphNodeType)-1;
        CHECK(cudaGraphNodeGetType(nodes[i], &kind) == cudaSuccess && kind == kinds[i]);
    }
    count = 2; /* fewer slots than nodes: the first two */
    CHECK(cudaGraphGetNodes(graph, nodes, &count) == cudaSuccess && count == 2);

    cudaGraphExec_t exec = nullptr;
    CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);    /* the exec owns its copies */
    cudaGraphNodeType gone = cudaGraphNodeTypeKernel; /* the graph's nodes went with it */
    CHECK(cudaGraphNodeGetType(nodes[0], &gone) == cudaErrorInvalidValue);
    for (int r = 0; r < 3; r++) {
        for (int i = 0; i < n; i++) host_in[i] = (float)(i + 1000 * r); /* read at replay */
        CHECK(cudaGraphLaunch(exec, s) == cudaSuccess);
        int wrong = 0;
        for (int i = 0; i < n; i++)
            wrong += host_out[i] != 2.0f * (float)(i + 1000 * r) || c[i] != host_out[i] ||
                     zeros[i] != 0.0f || acc[i] != 6.0f + (float)r;
        CHECK(wrong == 0);
    }
    CHECK(cudaGraphExecDestroy(exec) == cudaSuccess);
    CHECK(cudaGraphExecDestroy(exec) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGraphDestroy(graph) == cudaErrorInvalidResourceHandle);
    (void)cudaGetLastError();

    /* The same step run eagerly gives what the last replay gave. */
    step(s, host_in, eager_out, a, b, zeros, acc, c, n);
    CHECK(memcmp(eager_out, host_out, sizeof host_out) == 0 && acc[n - 1] == 9.0f);
    (void)cudaGetLastError();
    for (float *p : {a, b, c, zeros, acc}) CHECK(cudaFree(p) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

/* Begin, End and the handles' checks. */
static void test_capture_misuse() {
    cudaStream_t s = nullptr;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal) ==
          cudaErrorStreamCaptureUnsupported);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeRelaxed) ==
          cudaErrorStreamCaptureUnsupported);
    CHECK(strstr(cudaGetErrorString(cudaErrorStreamCaptureUnsupported), "legacy stream") !=
          nullptr);
    CHECK(cudaStreamBeginCapture((cudaStream_t)0x1234, cudaStreamCaptureModeGlobal) ==
          cudaErrorInvalidResourceHandle);
    CHECK(cudaStreamBeginCapture(s, (cudaStreamCaptureMode)7) == cudaErrorInvalidValue);
    cudaGraph_t graph = (cudaGraph_t)0x99;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorIllegalState && graph == nullptr);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaErrorIllegalState);
    CHECK(cudaStreamEndCapture(s, nullptr) == cudaErrorInvalidValue); /* and goes on */
    CHECK(cudaStreamDestroy(s) == cudaErrorStreamCaptureUnsupported);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess && node_count(graph) == 0);
    replay(graph, s, 1); /* an empty graph runs */

    cudaGraphExec_t exec = nullptr;
    CHECK(cudaGraphInstantiate(&exec, (cudaGraph_t)0x1234, 0) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGraphInstantiate(nullptr, graph, 0) == cudaErrorInvalidValue);
    CHECK(cudaGraphLaunch((cudaGraphExec_t)0x1234, s) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGraphExecDestroy(nullptr) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGraphDestroy((cudaGraph_t)0x1234) == cudaErrorInvalidResourceHandle);
    size_t count = 0;
    CHECK(cudaGraphGetNodes((cudaGraph_t)0x1234, nullptr, &count) ==
          cudaErrorInvalidResourceHandle);
    CHECK(cudaStreamIsCapturing((cudaStream_t)0x1234, nullptr) == cudaErrorInvalidValue);
    CHECK(strcmp(cudaGetErrorName(cudaErrorStreamCaptureWrongThread),
                 "cudaErrorStreamCaptureWrongThread") == 0);
    CHECK(strcmp(cudaGetErrorString(cudaErrorStreamCaptureUnmatched),
                 "capture was not ended in the same stream as it began") == 0);
    CHECK(strcmp(cudaGetErrorName(cudaErrorIllegalState), "cudaErrorIllegalState") == 0);

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess);
    CHECK(cudaGraphInstantiate(&exec, graph, 99) == cudaErrorInvalidValue);
    CHECK(cudaGraphInstantiate(&exec, graph, cudaGraphInstantiateFlagAutoFreeOnLaunch) ==
          cudaSuccess);
    CHECK(cudaGraphLaunch(exec, (cudaStream_t)0x1234) == cudaErrorInvalidResourceHandle);
    CHECK(cudaGraphExecDestroy(exec) == cudaSuccess && cudaGraphDestroy(graph) == cudaSuccess);
    (void)cudaGetLastError();
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

/* A prohibited call during a capture on s: `call` makes it and returns its
 * error, which must be `expected`; the capture is then invalidated (work on s
 * fails, End returns no graph), s runs work again, and a fresh capture works. */
template <class Call>
static void check_refused(const char *what, cudaStream_t s, cudaStreamCaptureMode mode,
                          cudaError_t expected, Call call) {
    const int before = failures;
    float *x = device_array(64, 0.0f);
    cudaEvent_t event = nullptr;
    CHECK(cudaEventCreate(&event) == cudaSuccess);
    CHECK(cudaStreamBeginCapture(s, mode) == cudaSuccess);
    ND_LAUNCH(add_one_kernel, 1, 64, 0, s, x, 64);
    CHECK(cudaEventRecord(event, s) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(call(event) == expected);
    (void)cudaGetLastError();
    CHECK(capture_status(s) == cudaStreamCaptureStatusInvalidated);
    ND_LAUNCH(add_one_kernel, 1, 64, 0, s, x, 64);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
    CHECK(cudaMemsetAsync(x, 0, 4, s) == cudaErrorStreamCaptureInvalidated);
    CHECK(cudaStreamSynchronize(s) == cudaErrorStreamCaptureInvalidated);
    cudaGraph_t graph = (cudaGraph_t)0x99;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureInvalidated);
    CHECK(graph == nullptr && capture_status(s) == cudaStreamCaptureStatusNone);
    CHECK(cudaGetLastError() == cudaErrorStreamCaptureInvalidated);
    CHECK(x[0] == 0.0f);                           /* nothing captured ran */
    ND_LAUNCH(add_one_kernel, 1, 64, 0, s, x, 64); /* usable again, eagerly */
    CHECK(cudaGetLastError() == cudaSuccess && x[63] == 1.0f);
    CHECK(cudaStreamBeginCapture(s, mode) == cudaSuccess);
    ND_LAUNCH(add_one_kernel, 1, 64, 0, s, x, 64);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess && node_count(graph) == 1);
    replay(graph, s, 2);
    CHECK(x[0] == 3.0f && cudaEventQuery(event) == cudaSuccess);
    CHECK(cudaEventDestroy(event) == cudaSuccess && cudaFree(x) == cudaSuccess);
    if (failures != before) printf("  (in the capture refusing %s)\n", what);
}

static void test_capture_refusals() {
    cudaStream_t s = nullptr, blocking = nullptr;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreate(&blocking) == cudaSuccess);
    void *block = nullptr;
    CHECK(cudaMalloc(&block, 1024) == cudaSuccess);
    static char host[1024];
    const cudaStreamCaptureMode global = cudaStreamCaptureModeGlobal;
    const cudaError_t unsupported = cudaErrorStreamCaptureUnsupported;
    check_refused("cudaMalloc", s, global, unsupported, [](cudaEvent_t) {
        void *p = &p;
        const cudaError_t err = cudaMalloc(&p, 256);
        CHECK(p == nullptr);
        return err;
    });
    check_refused("cudaFree", s, global, unsupported, [&](cudaEvent_t) { return cudaFree(block); });
    check_refused("cudaFree(NULL)", s, global, unsupported,
                  [](cudaEvent_t) { return cudaFree(nullptr); });
    check_refused("cudaMallocHost", s, cudaStreamCaptureModeThreadLocal, unsupported,
                  [](cudaEvent_t) {
                      void *p = nullptr;
                      return cudaMallocHost(&p, 64);
                  });
    check_refused("cudaFreeHost", s, global, unsupported,
                  [](cudaEvent_t) { return cudaFreeHost(nullptr); });
    check_refused("cudaMemcpy", s, global, unsupported,
                  [&](cudaEvent_t) { return cudaMemcpy(block, host, 16, cudaMemcpyHostToDevice); });
    check_refused("cudaMemset", s, global, unsupported,
                  [&](cudaEvent_t) { return cudaMemset(block, 0, 16); });
    check_refused("cudaDeviceSynchronize", s, global, unsupported,
                  [](cudaEvent_t) { return cudaDeviceSynchronize(); });
    /* whatever the mode: */
    const cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
    check_refused("cudaStreamSynchronize", s, relaxed, unsupported,
                  [&](cudaEvent_t) { return cudaStreamSynchronize(s); });
    check_refused("cudaStreamQuery", s, relaxed, unsupported,
                  [&](cudaEvent_t) { return cudaStreamQuery(s); });
    check_refused("cudaEventQuery", s, relaxed, cudaErrorCapturedEvent,
                  [](cudaEvent_t e) { return cudaEventQuery(e); });
    check_refused("cudaEventSynchronize", s, relaxed, cudaErrorCapturedEvent,
                  [](cudaEvent_t e) { return cudaEventSynchronize(e); });
    check_refused("a wait from outside the capture", s, relaxed, unsupported,
                  [&](cudaEvent_t e) { return cudaStreamWaitEvent(blocking, e, 0); });
    check_refused("cuMemCreate", s, global, unsupported, [](cudaEvent_t) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        CUmemGenericAllocationHandle handle = 0;
        const CUresult r = cuMemCreate(&handle, (size_t)2 << 20, &prop, 0);
        CHECK(r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        CHECK(cudaGetLastError() == cudaSuccess); /* the driver API sets no last error */
        return r == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ? cudaErrorStreamCaptureUnsupported
                                                          : cudaErrorUnknown;
    });
    /* The legacy stream, while a blocking stream captures (any mode). */
    const cudaError_t implicit = cudaErrorStreamCaptureImplicit;
    check_refused("a legacy-stream launch", blocking, relaxed, implicit, [&](cudaEvent_t) {
        ND_LAUNCH(nothing_kernel, 1, 32, 0, 0, (int *)block);
        const cudaError_t err = cudaPeekAtLastError();
        CHECK(((int *)block)[0] != 7); /* it did not run */
        return err;
    });
    check_refused("a legacy-stream copy", blocking, relaxed, implicit, [&](cudaEvent_t) {
        return cudaMemcpyAsync(block, host, 16, cudaMemcpyHostToDevice, cudaStreamLegacy);
    });
    CHECK(cudaFree(block) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess && cudaStreamDestroy(blocking) == cudaSuccess);
}

/* A thread that runs what it is given, one call at a time, for the rules that
 * depend on which thread began a capture. */
struct worker {
    std::mutex m;
    std::condition_variable cv;
    std::function<void()> job;
    bool quit = false;
    std::thread thread{[this] {
        std::unique_lock<std::mutex> lock(m);
        for (;;) {
            cv.wait(lock, [this] { return job || quit; });
            if (!job) return;
            job();
            job = nullptr;
            cv.notify_all();
        }
    }};
    void run(std::function<void()> f) {
        std::unique_lock<std::mutex> lock(m);
        job = std::move(f);
        cv.notify_all();
        cv.wait(lock, [this] { return !job; });
    }
    ~worker() {
        {
            std::lock_guard<std::mutex> lock(m);
            quit = true;
        }
        cv.notify_all();
        thread.join();
    }
};

static cudaStreamCaptureMode set_thread_mode(cudaStreamCaptureMode mode) {
    CHECK(cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess);
    return mode; /* the previous one */
}

/* Which calls a capture forbids depends on the modes and the threads. */
static void test_capture_modes() {
    cudaStream_t s = nullptr;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    cudaGraph_t graph = nullptr;
    void *p = nullptr;
    CHECK(set_thread_mode(cudaStreamCaptureModeThreadLocal) == cudaStreamCaptureModeGlobal);
    CHECK(set_thread_mode(cudaStreamCaptureModeGlobal) == cudaStreamCaptureModeThreadLocal);
    CHECK(cudaThreadExchangeStreamCaptureMode(nullptr) == cudaErrorInvalidValue);

    /* A relaxed capture forbids nothing; a relaxed thread may do anything. */
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed) == cudaSuccess);
    CHECK(cudaMalloc(&p, 256) == cudaSuccess && cudaFree(p) == cudaSuccess);
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess && cudaGraphDestroy(graph) == 0);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    set_thread_mode(cudaStreamCaptureModeRelaxed);
    CHECK(cudaMalloc(&p, 256) == cudaSuccess && cudaFree(p) == cudaSuccess);
    set_thread_mode(cudaStreamCaptureModeGlobal);
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess && cudaGraphDestroy(graph) == 0);

    /* Another thread's capture: a global one forbids this thread's unsafe calls
     * in global mode, not in thread-local mode; a thread-local one neither. */
    worker other;
    cudaError_t err = cudaSuccess;
    for (cudaStreamCaptureMode theirs :
         {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal}) {
        for (cudaStreamCaptureMode mine :
             {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal}) {
            other.run([&] { err = cudaStreamBeginCapture(s, theirs); });
            CHECK(err == cudaSuccess);
            CHECK(cudaStreamEndCapture(s, &graph) == cudaErrorStreamCaptureWrongThread);
            CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
            set_thread_mode(mine);
            const bool forbidden =
                theirs == cudaStreamCaptureModeGlobal && mine == cudaStreamCaptureModeGlobal;
            CHECK(cudaMalloc(&p, 256) == (forbidden ? cudaErrorStreamCaptureUnsupported : 0));
            CHECK(cudaFree(p) == (forbidden ? cudaErrorStreamCaptureUnsupported : 0));
            set_thread_mode(cudaStreamCaptureModeGlobal);
            CHECK(capture_status(s) ==
                  (forbidden ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive));
            other.run([&] { err = cudaStreamEndCapture(s, &graph); });
            CHECK(err == (forbidden ? cudaErrorStreamCaptureInvalidated : cudaSuccess));
            if (err == cudaSuccess) CHECK(cudaGraphDestroy(graph) == cudaSuccess);
        }
    }
    /* A relaxed capture may end on any thread. */
    other.run([&] { err = cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed); });
    CHECK(err == cudaSuccess && cudaStreamEndCapture(s, &graph) == cudaSuccess);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);
    (void)cudaGetLastError();
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

/* Events and the legacy stream around a capture, and graphs within graphs. */
static void test_capture_streams_and_events() {
    cudaStream_t s = nullptr, blocking = nullptr;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    CHECK(cudaStreamCreate(&blocking) == cudaSuccess);
    float *x = device_array(64, 0.0f), *y = device_array(64, 0.0f);
    cudaEvent_t before = nullptr, during = nullptr;
    CHECK(cudaEventCreate(&before) == cudaSuccess && cudaEventCreate(&during) == cudaSuccess);
    CHECK(cudaEventRecord(before, s) == cudaSuccess);

    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(s, before, 0) == cudaSuccess);
    ND_LAUNCH(add_one_kernel, 1, 64, 0, s, x, 64);
    CHECK(cudaEventRecord(during, s) == cudaSuccess);
    CHECK(cudaStreamWaitEvent(s, during, 0) == cudaSuccess); /* within the capture */
    /* The legacy stream does not wait for a non-blocking stream: it runs now. */
    ND_LAUNCH(add_one_kernel, 1, 64, 0, 0, y, 64);
    CHECK(cudaGetLastError() == cudaSuccess && y[0] == 1.0f && x[0] == 0.0f);
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
    CHECK(cudaStreamIsCapturing(0, &status) == cudaSuccess);
    CHECK(status == cudaStreamCaptureStatusNone);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess && node_count(graph) == 1);
    CHECK(cudaEventQuery(during) == cudaSuccess); /* its capture has ended */
    cudaGraphExec_t exec = nullptr;
    CHECK(cudaGraphInstantiate(&exec, graph) == cudaSuccess);
    CHECK(cudaGraphDestroy(graph) == cudaSuccess);

    /* Launching a graph into a capture records it as one child-graph node. */
    CHECK(cudaStreamBeginCapture(blocking, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaGraphLaunch(exec, blocking) == cudaSuccess);
    CHECK(cudaGraphLaunch(exec, blocking) == cudaSuccess);
    CHECK(x[0] == 0.0f);
    /* Asking about the legacy stream while a blocking stream captures is an
     * error that leaves the capture alone. */
    CHECK(cudaStreamIsCapturing(cudaStreamLegacy, &status) == cudaErrorStreamCaptureImplicit);
    CHECK(capture_status(blocking) == cudaStreamCaptureStatusActive);
    CHECK(cudaStreamEndCapture(blocking, &graph) == cudaSuccess && node_count(graph) == 2);
    cudaGraphNode_t child = nullptr;
    size_t one = 1;
    cudaGraphNodeType kind = cudaGraphNodeTypeKernel;
    CHECK(cudaGraphGetNodes(graph, &child, &one) == cudaSuccess && one == 1);
    CHECK(cudaGraphNodeGetType(child, &kind) == cudaSuccess && kind == cudaGraphNodeTypeGraph);
    CHECK(cudaGraphExecDestroy(exec) == cudaSuccess); /* the child nodes keep theirs */
    replay(graph, 0, 2);
    CHECK(x[0] == 4.0f && x[63] == 4.0f);

    CHECK(cudaEventDestroy(before) == cudaSuccess && cudaEventDestroy(during) == cudaSuccess);
    CHECK(cudaFree(x) == cudaSuccess && cudaFree(y) == cudaSuccess);
    (void)cudaGetLastError();
    CHECK(cudaStreamDestroy(s) == cudaSuccess && cudaStreamDestroy(blocking) == cudaSuccess);
}

/* A node that fails at replay fails the graph's launch with its error. */
static void test_replay_failures() {
    cudaStream_t s = nullptr;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    float *x = device_array(64, 1.0f), *y = device_array(64, 0.0f);
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(cudaMemcpyAsync(y, x, 256, cudaMemcpyDeviceToDevice, s) == cudaSuccess);
    /* Checked at capture as when run: */
    CHECK(cudaMemcpyAsync(y, x, 512, cudaMemcpyDeviceToDevice, s) == cudaErrorInvalidValue);
    ND_LAUNCH(nothing_kernel, 1, 2048, 0, s, (int *)y);
    CHECK(cudaGetLastError() == cudaErrorInvalidConfiguration);
    CHECK(capture_status(s) == cudaStreamCaptureStatusActive);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess && node_count(graph) == 1);
    CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    CHECK(cudaGraphLaunch(exec, s) == cudaSuccess && y[5] == 1.0f);
    CHECK(cudaFree(x) == cudaSuccess); /* the copy's source is gone */
    CHECK(cudaGraphLaunch(exec, s) == cudaErrorInvalidValue);
    CHECK(strstr(cudaGetErrorString(cudaErrorInvalidValue), "not inside") != nullptr);
    CHECK(cudaGraphExecDestroy(exec) == cudaSuccess && cudaGraphDestroy(graph) == cudaSuccess);
    CHECK(cudaGetLastError() == cudaErrorInvalidValue);

    int *out = device_array(256, 0);
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    ND_LAUNCH(early_return_kernel, 1, 256, 0, s, out); /* fails when it runs */
    CHECK(cudaGetLastError() == cudaSuccess);
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess);
    CHECK(cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess);
    CHECK(cudaGraphLaunch(exec, s) == cudaErrorLaunchFailure);
    CHECK(strstr(cudaGetErrorString(cudaErrorLaunchFailure), "early_return_kernel") != nullptr);
    CHECK(cudaGraphExecDestroy(exec) == cudaSuccess && cudaGraphDestroy(graph) == cudaSuccess);
    (void)cudaGetLastError();
    CHECK(cudaFree(y) == cudaSuccess && cudaFree(out) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

/* cuBLAS on a handle whose stream captures: alpha is read when captured, the
 * operands when replayed. */
static void test_cublas_capture() {
    cudaStream_t s = nullptr;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    struct cublas_context *handle = nullptr;
    CHECK(nd_sim_cublas_create(&handle) == 0 && nd_sim_cublas_set_stream(handle, s) == 0);
    float *a = device_array(4, 0.0f), *b = device_array(4, 0.0f), *c = device_array(4, -1.0f);
    const float eye[4] = {1, 0, 0, 1}, m[4] = {1, 2, 3, 4};
    memcpy(a, eye, sizeof eye);
    memcpy(b, m, sizeof m);
    float alpha = 2.0f, beta = 0.0f;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess);
    CHECK(nd_sim_cublas_sgemm_strided(handle, 0, 0, 2, 2, 2, &alpha, a, 2, 4, b, 2, 4, &beta, c, 2,
                                      4, 1) == 0);
    CHECK(nd_sim_cublas_sgemm_strided(handle, 0, 0, 2, 2, 2, &alpha, a, 1, 4, b, 2, 4, &beta, c, 2,
                                      4, 1) == 7); /* lda < m: checked at capture */
    alpha = 10.0f;
    CHECK(c[0] == -1.0f && c[3] == -1.0f);
    cudaGraph_t graph = nullptr;
    CHECK(cudaStreamEndCapture(s, &graph) == cudaSuccess && node_count(graph) == 1);
    a[0] = 3.0f; /* read at replay: c = 2 * diag(3, 1) * m */
    replay(graph, s, 1);
    CHECK(c[0] == 6.0f && c[1] == 4.0f && c[2] == 18.0f && c[3] == 8.0f);
    CHECK(nd_sim_cublas_destroy(handle) == 0);
    CHECK(cudaFree(a) == cudaSuccess && cudaFree(b) == cudaSuccess && cudaFree(c) == cudaSuccess);
    CHECK(cudaStreamDestroy(s) == cudaSuccess);
}

void test_capture(void) {
    test_capture_and_replay();
    test_capture_misuse();
    test_capture_refusals();
    test_capture_modes();
    test_capture_streams_and_events();
    test_replay_failures();
    test_cublas_capture();
}
