/* sim_grid.cc: kernel launches in the CUDA simulator. A grid runs on the
 * launching thread, block after block; within a block every CUDA thread runs
 * until it returns or waits at __syncthreads or a warp operation
 * (sim_device.h), which suspend it until every thread that must take part has
 * arrived: a barrier lets its threads go when the whole block has arrived, a
 * warp operation computes every lane's result when the last lane of its mask
 * arrives. There is no preemption, so an atomic is a plain read-modify-write.
 *
 * Threads are fibers that get a stack of their own only when they block: a
 * scheduling loop runs on a pool stack and calls each new thread directly;
 * when one blocks, its stack stays with it and the loop goes on on a fresh
 * stack; when a blocked thread is resumed, the loop's stack goes back to the
 * pool and the thread, once it returns, continues the loop it was started by
 * (all of the loop's state is here, in grid_run). So a kernel without
 * barriers costs a function call per thread and one stack, and one with
 * barriers a stack per waiting thread. Stacks are 64 KiB, mmap'd once with a
 * PROT_NONE guard page below each, and reused by every launch; the context
 * switch is a few instructions of x86-64 assembly (callee-saved registers and
 * the stack pointer), ucontext elsewhere.
 *
 * A launch fails with cudaErrorLaunchFailure (never a hang or a crash) when a
 * thread returns while others wait for it at a barrier or shuffle, when
 * threads wait at different barriers or warp operations, or when nothing can
 * run and some threads are still waiting; the error's string says which
 * kernel, block, barrier and threads. Launches are serialised by one mutex
 * (a GPU's default stream runs them in order too). A launch into a capturing
 * stream (sim_graph.cc) is checked as any other, then recorded with a heap
 * copy of its arguments and run at each replay of the graph. Never prints,
 * exits or aborts.
 */
/* <memory> before sim_internal.h: it trips on sim_device.h's __noinline__ macro. */
#include <memory>

#include "sim_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <mutex>
#include <new>

/* The x86-64 switch below, or ucontext (other machines, or forced with
 * -DND_SIM_UCONTEXT so that the self-test covers it here too). */
#if defined(__x86_64__) && !defined(ND_SIM_UCONTEXT)
#define ND_SIM_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif

/* The built-in values of sim_device.h. */
const uint3 *nd_sim_thread_idx = nullptr;
uint3 nd_sim_block_idx = {0, 0, 0};
dim3 nd_sim_block_dim;
dim3 nd_sim_grid_dim;

namespace {

constexpr int kMaxThreads = 1024;
constexpr int kWarp = 32;
/* Every thread blocked at once, plus the loop that runs. */
constexpr int kStacks = kMaxThreads + 1;
constexpr size_t kStackBytes = 64 * 1024;
constexpr size_t kMaxDynamicShared = 48 * 1024; /* without an opt-in, as on a GPU */

/* A suspended execution: a stack pointer (x86-64) or a ucontext. */
#if defined(ND_SIM_ASM_SWITCH)
typedef void *context;
#else
typedef ucontext_t context;
#endif

enum thread_state { T_READY, T_BARRIER, T_WARP, T_DONE };

struct fiber {
    context saved; /* while blocked */
    int stack;     /* the pool stack it runs on, once started */
    int started;
    uint3 idx;
    int linear, warp, lane;
    int state;
};

/* The pending operation of one warp, while its lanes arrive. */
struct warp_state {
    int kind; /* nd_sim_warp_kind; -1: none */
    unsigned mask, arrived;
    unsigned lanes;  /* lanes that exist (the last warp may be partial) */
    unsigned exited; /* lanes that returned */
    int width;
    const char *file;
    int line;
    uint64_t value[kWarp];
    int arg[kWarp];
    uint64_t result[kWarp];
};

/* A FIFO of thread indices; each thread is queued at most once. */
struct ring {
    int items[kMaxThreads];
    int head = 0, count = 0;
    void clear() { head = count = 0; }
    void push(int t) { items[(head + count++) % kMaxThreads] = t; }
    int pop(int *t) {
        if (count == 0) return 0;
        *t = items[head];
        head = (head + 1) % kMaxThreads;
        count--;
        return 1;
    }
};

/* The one launch that runs (launches hold launch_mutex). */
struct grid_run {
    const nd_sim_kernel *kernel;
    fiber threads[kMaxThreads];
    int nthreads;
    warp_state warps[kMaxThreads / kWarp];
    int nwarps;
    int barrier_arrived;
    const char *barrier_file;
    int barrier_line;
    int done;
    ring ready, held;
    int perturb;    /* NEEDLE_SIM_PERTURB */
    int held_warp;  /* -1: none */
    int reverse;    /* queue released threads last to first */
    uint64_t phase; /* barriers passed in this launch: the perturbation's draw */
    fiber *current;
    context launcher; /* run_block, on the launching thread's stack */
    context discard;  /* where an execution left for good saves itself */
    char *stack_base[kStacks];
    int free_stacks[kStacks];
    int nfree;
    int loop_stack; /* the pool stack the running code is on */
#if !defined(ND_SIM_ASM_SWITCH)
    context loop_start[kStacks];
#endif
    int failed;
    char message[768];
    unsigned char *dynamic_shared;
    size_t dynamic_bytes; /* this launch's */
    size_t dynamic_capacity;
    uint64_t launches;
};

std::mutex launch_mutex;
grid_run *run_state = nullptr; /* allocated at the first launch, kept */

/* --------------------------------------------------------- context switch */

#if defined(ND_SIM_ASM_SWITCH)
extern "C" void nd_sim_switch_context(void **save_sp, void *load_sp);
/* Saves the callee-saved registers on the current stack, stores the stack
 * pointer in *save_sp, loads load_sp and restores the registers saved there;
 * `ret` continues where that stack was switched out (or at the loop's entry
 * on a fresh stack, see start_loop). */
__asm__(".text\n"
        ".p2align 4\n"
        ".globl nd_sim_switch_context\n"
        ".hidden nd_sim_switch_context\n"
        ".type nd_sim_switch_context,@function\n"
        "nd_sim_switch_context:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size nd_sim_switch_context, .-nd_sim_switch_context\n");
#endif

/* Saves the running execution in *save and continues `to`. */
void switch_to(context *save, context *to) {
#if defined(ND_SIM_ASM_SWITCH)
    nd_sim_switch_context(save, *to);
#else
    swapcontext(save, to);
#endif
}

[[noreturn]] void scheduling_loop();
void thread_exit(fiber *self);

/* Continues the scheduling loop on a fresh pool stack; the running execution
 * is saved in *save (a blocked thread, or run_block at a block's start). */
void start_loop(context *save) {
    grid_run &g = *run_state;
    const int s = g.free_stacks[--g.nfree]; /* never empty: see kStacks */
    g.loop_stack = s;
#if defined(ND_SIM_ASM_SWITCH)
    /* Six zeroed registers for the pops, then the loop as the `ret` target;
     * it is entered with rsp = top - 8, as after a call. */
    void **sp = (void **)(g.stack_base[s] + kStackBytes);
    *--sp = nullptr; /* the loop's return address: it never returns */
    *--sp = (void *)scheduling_loop;
    for (int i = 0; i < 6; i++) *--sp = nullptr;
    nd_sim_switch_context(save, sp);
#else
    context *c = &g.loop_start[s];
    getcontext(c);
    c->uc_stack.ss_sp = g.stack_base[s];
    c->uc_stack.ss_size = kStackBytes;
    c->uc_link = nullptr;
    makecontext(c, scheduling_loop, 0);
    swapcontext(save, c);
#endif
}

/* Suspends the running thread (its stack stays with it) until a loop
 * resumes it. */
void block(fiber *self) { start_loop(&self->saved); }

/* Back to run_block for good: the block is over, stuck or failed. */
[[noreturn]] void leave_to_launcher() {
    grid_run &g = *run_state;
    for (;;) switch_to(&g.discard, &g.launcher);
}

/* Runs the block's threads until none is ready. Entered on a fresh stack;
 * when it resumes a blocked thread it leaves its own stack for good, and the
 * thread, when its kernel returns, carries on here on the thread's stack. */
void scheduling_loop() {
    grid_run &g = *run_state;
    for (;;) {
        int t;
        if (!g.ready.pop(&t) && !g.held.pop(&t)) leave_to_launcher();
        fiber *f = &g.threads[t];
        g.current = f;
        nd_sim_thread_idx = &f->idx;
        if (f->started) {
            g.free_stacks[g.nfree++] = g.loop_stack; /* free once we are off it */
            g.loop_stack = f->stack;
            switch_to(&g.discard, &f->saved);
            continue; /* not reached: nothing switches to g.discard */
        }
        f->started = 1;
        f->stack = g.loop_stack;
        g.kernel->body(g.kernel->ctx);
        thread_exit(f);
    }
}

/* --------------------------------------------------------------- helpers */

int allocate_state() {
    if (run_state != nullptr) return 1;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t slot = kStackBytes + page;
    void *region = mmap(nullptr, slot * kStacks, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) return 0;
    /* Each slot: a guard page (stays PROT_NONE), then the stack above it. */
    for (int s = 0; s < kStacks; s++)
        if (mprotect((char *)region + s * slot + page, kStackBytes, PROT_READ | PROT_WRITE) != 0) {
            munmap(region, slot * kStacks);
            return 0;
        }
    grid_run *g = new (std::nothrow) grid_run();
    if (g == nullptr) {
        munmap(region, slot * kStacks);
        return 0;
    }
    for (int s = 0; s < kStacks; s++) {
        g->stack_base[s] = (char *)region + s * slot + page;
        g->free_stacks[s] = kStacks - 1 - s; /* stack 0 is taken first */
    }
    g->nfree = kStacks;
    run_state = g;
    return 1;
}

/* Records the failure and leaves for good: run_block abandons the block
 * (threads own nothing that needs releasing). */
[[noreturn]] void fail_here(const char *format, ...) __attribute__((format(printf, 1, 2)));
void fail_here(const char *format, ...) {
    grid_run &g = *run_state;
    g.failed = 1;
    va_list args;
    va_start(args, format);
    vsnprintf(g.message, sizeof g.message, format, args);
    va_end(args);
    leave_to_launcher();
}

const char *warp_op_name(int kind) {
    switch (kind) {
    case ND_SIM_SHFL: return "__shfl_sync";
    case ND_SIM_SHFL_UP: return "__shfl_up_sync";
    case ND_SIM_SHFL_DOWN: return "__shfl_down_sync";
    case ND_SIM_SHFL_XOR: return "__shfl_xor_sync";
    case ND_SIM_BALLOT: return "__ballot_sync";
    case ND_SIM_ANY: return "__any_sync";
    case ND_SIM_ALL: return "__all_sync";
    default: return "__syncwarp";
    }
}

/* The last path component, for shorter messages. */
const char *base_name(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash != nullptr ? slash + 1 : path;
}

void queue(int t) {
    grid_run &g = *run_state;
    if (g.threads[t].warp == g.held_warp) g.held.push(t);
    else g.ready.push(t);
}

/* Makes every thread in state `from` ready, queued in the current order. */
void release(int from) {
    grid_run &g = *run_state;
    for (int i = 0; i < g.nthreads; i++) {
        int t = g.reverse ? g.nthreads - 1 - i : i;
        if (g.threads[t].state == from) {
            g.threads[t].state = T_READY;
            queue(t);
        }
    }
}

/* NEEDLE_SIM_PERTURB: at a block's start and after every barrier, draws which
 * warp is held back until every other thread has blocked or returned, and
 * whether the others run first to last or last to first; a different draw
 * for every phase of every block of every launch. */
void draw_order() {
    grid_run &g = *run_state;
    uint64_t h = g.launches * 0x9E3779B97F4A7C15ull + g.phase++;
    h ^= ((uint64_t)nd_sim_block_idx.x + ((uint64_t)nd_sim_block_idx.y << 21) +
          ((uint64_t)nd_sim_block_idx.z << 42)) *
         0xBF58476D1CE4E5B9ull;
    h ^= h >> 31; /* splitmix64's finaliser */
    h *= 0x94D049BB133111EBull;
    h ^= h >> 29;
    g.held_warp = g.nwarps > 1 ? (int)(h % (uint64_t)g.nwarps) : -1;
    g.reverse = (int)(h >> 40 & 1u);
}

/* The lanes of warp w with state s, as a mask. */
unsigned lanes_in_state(int w, int s) {
    grid_run &g = *run_state;
    unsigned m = 0;
    for (int lane = 0; lane < kWarp; lane++) {
        int t = w * kWarp + lane;
        if (t < g.nthreads && g.threads[t].state == s) m |= 1u << lane;
    }
    return m;
}

/* Called when a thread's kernel body has returned. */
void thread_exit(fiber *self) {
    grid_run &g = *run_state;
    self->state = T_DONE;
    g.done++;
    warp_state &w = g.warps[self->warp];
    w.exited |= 1u << self->lane;
    if (g.barrier_arrived > 0)
        fail_here("thread (%u,%u,%u) returned while %d thread(s) wait for it at __syncthreads "
                  "at %s:%d",
                  self->idx.x, self->idx.y, self->idx.z, g.barrier_arrived,
                  base_name(g.barrier_file), g.barrier_line);
    if (w.kind >= 0 && (w.mask & (1u << self->lane)))
        fail_here("lane %d of warp %d returned while lanes 0x%08x wait for it at %s at %s:%d",
                  self->lane, self->warp, w.arrived, warp_op_name(w.kind), base_name(w.file),
                  w.line);
}

/* Why nothing can run although not every thread has returned. */
void describe_deadlock() {
    grid_run &g = *run_state;
    int at_barrier = 0;
    for (int t = 0; t < g.nthreads; t++) at_barrier += g.threads[t].state == T_BARRIER;
    int n = snprintf(g.message, sizeof g.message,
                     "no thread can run: %d of %d returned, %d wait at __syncthreads", g.done,
                     g.nthreads, at_barrier);
    if (at_barrier > 0 && n > 0 && (size_t)n < sizeof g.message)
        n += snprintf(g.message + n, sizeof g.message - (size_t)n, " (%s:%d)",
                      base_name(g.barrier_file), g.barrier_line);
    for (int w = 0; w < g.nwarps && n > 0 && (size_t)n < sizeof g.message; w++) {
        const warp_state &ws = g.warps[w];
        if (ws.kind < 0) continue;
        n += snprintf(g.message + n, sizeof g.message - (size_t)n,
                      "; warp %d: lanes 0x%08x at %s (%s:%d, mask 0x%08x)", w,
                      lanes_in_state(w, T_WARP), warp_op_name(ws.kind), base_name(ws.file), ws.line,
                      ws.mask);
    }
    g.failed = 1;
}

/* Runs one block to the end; 0 when it failed (g.message says why). */
int run_block(uint3 block_idx) {
    grid_run &g = *run_state;
    nd_sim_block_idx = block_idx;
    g.barrier_arrived = 0;
    g.done = 0;
    g.ready.clear();
    g.held.clear();
    for (int w = 0; w < g.nwarps; w++) {
        warp_state &ws = g.warps[w];
        ws.kind = -1;
        ws.arrived = ws.exited = 0;
        int lanes = g.nthreads - w * kWarp < kWarp ? g.nthreads - w * kWarp : kWarp;
        ws.lanes = lanes == kWarp ? 0xffffffffu : (1u << lanes) - 1u;
    }
    g.held_warp = -1;
    g.reverse = 0;
    if (g.perturb) draw_order();
    if (g.dynamic_bytes > 0) memset(g.dynamic_shared, 0xFF, g.dynamic_bytes);
    for (int t = 0; t < g.nthreads; t++) {
        g.threads[t].state = T_BARRIER; /* a barrier before the first instruction */
        g.threads[t].started = 0;
    }
    release(T_BARRIER);
    start_loop(&g.launcher); /* returns when no thread can run */
    /* The last loop's stack is free again; after a failure, so are those of
     * the threads left blocked. */
    g.free_stacks[g.nfree++] = g.loop_stack;
    if (g.failed || g.nfree != kStacks) {
        for (int s = 0; s < kStacks; s++) g.free_stacks[s] = kStacks - 1 - s;
        g.nfree = kStacks;
    }
    g.current = nullptr;
    nd_sim_thread_idx = nullptr;
    if (!g.failed && g.done != g.nthreads) describe_deadlock();
    return !g.failed;
}

/* The grid the kernel sees: at most max_blocks blocks, x first. */
dim3 capped(dim3 grid, int64_t max_blocks) {
    if (max_blocks <= 0) return grid;
    dim3 c = grid;
    if (c.x > max_blocks) c.x = (unsigned)max_blocks;
    int64_t left = max_blocks / c.x;
    if (c.y > left) c.y = (unsigned)left;
    left /= c.y;
    if (c.z > left) c.z = (unsigned)left;
    return c;
}

} /* namespace */

/* ============================================================ kernel side */

void nd_sim_syncthreads(const char *file, int line) {
    grid_run *gp = run_state;
    fiber *self = gp != nullptr ? gp->current : nullptr;
    if (self == nullptr) return; /* host code: nothing to wait for */
    grid_run &g = *gp;
    if (g.done > 0)
        fail_here("thread (%u,%u,%u) reached __syncthreads at %s:%d after %d thread(s) of the "
                  "block returned without reaching it",
                  self->idx.x, self->idx.y, self->idx.z, base_name(file), line, g.done);
    if (g.barrier_arrived == 0) {
        g.barrier_file = file;
        g.barrier_line = line;
    } else if (line != g.barrier_line || strcmp(file, g.barrier_file) != 0) {
        fail_here("divergent barriers: thread (%u,%u,%u) reached __syncthreads at %s:%d while %d "
                  "thread(s) wait at %s:%d",
                  self->idx.x, self->idx.y, self->idx.z, base_name(file), line, g.barrier_arrived,
                  base_name(g.barrier_file), g.barrier_line);
    }
    self->state = T_BARRIER;
    if (++g.barrier_arrived < g.nthreads) {
        block(self);
        return;
    }
    /* The last to arrive releases the block. Plainly it goes on first and the
     * others follow in thread order; perturbed, it queues with the others in
     * a newly drawn order. */
    g.barrier_arrived = 0;
    if (!g.perturb) self->state = T_READY;
    else draw_order();
    release(T_BARRIER);
    if (g.perturb) block(self);
}

uint64_t nd_sim_warp(int kind, unsigned mask, uint64_t value, int arg, int width, const char *file,
                     int line) {
    grid_run *gp = run_state;
    fiber *self = gp != nullptr ? gp->current : nullptr;
    if (self == nullptr) return kind == ND_SIM_BALLOT ? (value != 0) : value; /* host code */
    grid_run &g = *gp;
    const int lane = self->lane;
    const unsigned bit = 1u << lane;
    warp_state &w = g.warps[self->warp];
    if (width < 1 || width > kWarp || (width & (width - 1)) != 0)
        fail_here("%s at %s:%d: width %d is not a power of two up to 32", warp_op_name(kind),
                  base_name(file), line, width);
    if ((mask & bit) == 0)
        fail_here("%s at %s:%d: lane %d of warp %d is not in its mask 0x%08x", warp_op_name(kind),
                  base_name(file), line, lane, self->warp, mask);
    const unsigned need = mask & w.lanes;
    if ((need & w.exited) != 0)
        fail_here("%s at %s:%d (mask 0x%08x): lanes 0x%08x of warp %d returned without reaching "
                  "it",
                  warp_op_name(kind), base_name(file), line, mask, need & w.exited, self->warp);
    if (w.kind < 0) {
        w.kind = kind;
        w.mask = mask;
        w.width = width;
        w.file = file;
        w.line = line;
        w.arrived = 0;
    } else if (w.kind != kind || w.mask != mask || w.width != width || w.line != line ||
               strcmp(w.file, file) != 0) {
        fail_here("divergent warp operations: lane %d of warp %d reached %s at %s:%d (mask "
                  "0x%08x) while lanes 0x%08x wait at %s at %s:%d (mask 0x%08x)",
                  lane, self->warp, warp_op_name(kind), base_name(file), line, mask, w.arrived,
                  warp_op_name(w.kind), base_name(w.file), w.line, w.mask);
    }
    w.value[lane] = value;
    w.arg[lane] = arg;
    w.arrived |= bit;
    if (w.arrived != need) {
        self->state = T_WARP;
        block(self);
        return w.result[lane];
    }
    /* The last lane computes every lane's result and lets the others go. */
    unsigned ballot = 0;
    for (int l = 0; l < kWarp; l++)
        if ((need >> l & 1u) && w.value[l] != 0) ballot |= 1u << l;
    for (int l = 0; l < kWarp; l++) {
        if ((need >> l & 1u) == 0) continue;
        const int sub = l % w.width, base = l - sub;
        int src = l;
        switch (w.kind) {
        case ND_SIM_SHFL: src = base + (w.arg[l] & (w.width - 1)); break;
        case ND_SIM_SHFL_UP: src = sub >= w.arg[l] ? l - w.arg[l] : l; break;
        case ND_SIM_SHFL_DOWN: src = sub + w.arg[l] < w.width ? l + w.arg[l] : l; break;
        case ND_SIM_SHFL_XOR:
            src = l ^ w.arg[l];
            if (src < 0 || src >= base + w.width) src = l; /* a later group: own value */
            break;
        default: break;
        }
        switch (w.kind) {
        case ND_SIM_BALLOT: w.result[l] = ballot; break;
        case ND_SIM_ANY: w.result[l] = ballot != 0; break;
        case ND_SIM_ALL: w.result[l] = ballot == need; break;
        case ND_SIM_SYNCWARP: w.result[l] = 0; break;
        default:
            /* A source lane outside the mask is undefined on a GPU: own value. */
            w.result[l] =
                (src >= 0 && src < kWarp && (need >> src & 1u)) ? w.value[src] : w.value[l];
        }
    }
    w.kind = -1;
    for (int l = 0; l < kWarp; l++) {
        int t = self->warp * kWarp + l;
        if (l != lane && (need >> l & 1u) && g.threads[t].state == T_WARP) {
            g.threads[t].state = T_READY;
            queue(t);
        }
    }
    return w.result[lane];
}

unsigned nd_sim_active_mask(void) {
    grid_run *gp = run_state;
    fiber *self = gp != nullptr ? gp->current : nullptr;
    if (self == nullptr) return 1u;
    const warp_state &w = gp->warps[self->warp];
    return w.lanes & ~w.exited;
}

void *nd_sim_dynamic_shared(void) {
    return run_state != nullptr ? run_state->dynamic_shared : nullptr;
}

/* ============================================================= host side */

static cudaError_t run_grid(const nd_sim_kernel *kernel, dim3 grid, dim3 block,
                            size_t shared_bytes);

cudaError_t nd_sim_run(const nd_sim_kernel *kernel, dim3 grid, dim3 block, size_t shared_bytes,
                       cudaStream_t stream) {
    const nd_sim_options *o = nd_sim_get_options();
    if (!o->valid) return nd_sim_fail(cudaErrorInvalidValue, "kernel launch: %s", o->error);
    if (kernel == nullptr || kernel->body == nullptr)
        return nd_sim_fail(cudaErrorInvalidDeviceFunction, "a launch without a kernel");
    const char *name = kernel->name, *site = base_name(kernel->file);
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 ||
        block.z > 64 || threads > (uint64_t)kMaxThreads || grid.x == 0 || grid.y == 0 ||
        grid.z == 0 || grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535)
        return nd_sim_fail(cudaErrorInvalidConfiguration,
                           "%s at %s:%d: grid (%u,%u,%u), block (%u,%u,%u)", name, site,
                           kernel->line, grid.x, grid.y, grid.z, block.x, block.y, block.z);
    if (shared_bytes > kMaxDynamicShared)
        return nd_sim_fail(cudaErrorInvalidValue,
                           "%s at %s:%d: %zu bytes of dynamic shared memory (at most %zu)", name,
                           site, kernel->line, shared_bytes, kMaxDynamicShared);
    if (!nd_sim_stream_valid(stream))
        return nd_sim_fail(cudaErrorInvalidResourceHandle, "%s at %s:%d: stream %p", name, site,
                           kernel->line, (void *)stream);
    cudaError_t err = cudaSuccess;
    const int64_t capture = nd_sim_route(stream, name, &err);
    if (capture < 0) return err;
    if (capture == 0) return run_grid(kernel, grid, block, shared_bytes);

    /* Captured: the graph keeps a heap copy of the arguments, shared by the
     * instantiated graphs, and replays the grid with it. */
    if (kernel->clone == nullptr || kernel->destroy == nullptr)
        return nd_sim_fail(cudaErrorInvalidDeviceFunction,
                           "%s at %s:%d: a launch without clone/destroy cannot be captured", name,
                           site, kernel->line);
    try {
        std::shared_ptr<void> ctx(kernel->clone(kernel->ctx), kernel->destroy);
        if (ctx != nullptr) {
            const nd_sim_kernel k = *kernel; /* name and file are string literals */
            return nd_sim_capture(stream, capture, cudaGraphNodeTypeKernel, name,
                                  [k, ctx, grid, block, shared_bytes](cudaStream_t) {
                                      nd_sim_kernel replay = k;
                                      replay.ctx = ctx.get();
                                      return run_grid(&replay, grid, block, shared_bytes);
                                  });
        }
    } catch (const std::bad_alloc &) { /* out of memory: reported below */
    }
    return nd_sim_fail(cudaErrorMemoryAllocation,
                       "%s at %s:%d: no host memory to capture the launch's arguments", name, site,
                       kernel->line);
}

/* Runs a launch whose configuration was checked. */
static cudaError_t run_grid(const nd_sim_kernel *kernel, dim3 grid, dim3 block,
                            size_t shared_bytes) {
    const nd_sim_options *o = nd_sim_get_options();
    const char *name = kernel->name, *site = base_name(kernel->file);
    const uint64_t threads = (uint64_t)block.x * block.y * block.z;
    std::lock_guard<std::mutex> lock(launch_mutex);
    if (!allocate_state())
        return nd_sim_fail(cudaErrorMemoryAllocation,
                           "%s at %s:%d: no host memory for the fiber stacks", name, site,
                           kernel->line);
    grid_run &g = *run_state;
    if (shared_bytes > g.dynamic_capacity) {
        void *p = realloc(g.dynamic_shared, shared_bytes);
        if (p == nullptr)
            return nd_sim_fail(cudaErrorMemoryAllocation,
                               "%s at %s:%d: no host memory for %zu bytes of shared memory", name,
                               site, kernel->line, shared_bytes);
        g.dynamic_shared = (unsigned char *)p;
        g.dynamic_capacity = shared_bytes;
    }
    g.dynamic_bytes = shared_bytes;
    g.kernel = kernel;
    g.nthreads = (int)threads;
    g.nwarps = (g.nthreads + kWarp - 1) / kWarp;
    g.failed = 0;
    g.perturb = o->perturb;
    g.phase = 0;
    g.launches++;
    for (unsigned z = 0, t = 0; z < block.z; z++)
        for (unsigned y = 0; y < block.y; y++)
            for (unsigned x = 0; x < block.x; x++, t++) {
                fiber &f = g.threads[t];
                f.idx = uint3{x, y, z};
                f.linear = (int)t;
                f.warp = (int)t / kWarp;
                f.lane = (int)t % kWarp;
            }
    const dim3 run_grid = capped(grid, o->max_blocks);
    nd_sim_grid_dim = run_grid;
    nd_sim_block_dim = block;
    for (unsigned z = 0; z < run_grid.z && !g.failed; z++)
        for (unsigned y = 0; y < run_grid.y && !g.failed; y++)
            for (unsigned x = 0; x < run_grid.x; x++)
                if (!run_block(uint3{x, y, z})) {
                    char where[64];
                    snprintf(where, sizeof where, "block (%u,%u,%u)", x, y, z);
                    return nd_sim_fail(cudaErrorLaunchFailure, "%s launched at %s:%d, %s: %s", name,
                                       site, kernel->line, where, g.message);
                }
    return cudaSuccess;
}
