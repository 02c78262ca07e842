// The shim device's launcher: the Metal kernels (msl_source.inc, the
// concatenated kernels/*.metal) compiled as C++ against msl.h, and
// ferrox_msl_launch(), which runs one kernel by name over a grid of
// threadgroups of 64 threads. A threadgroup's threads are fibers on the
// calling thread, run in turn up to each barrier.
#include "msl.h"

#include "msl_source.inc"

#undef kernel
#undef device
#undef constant
#undef thread
#undef threadgroup

#include <functional>
#include <vector>

// A fiber switch: x86-64 saves its callee-saved registers and the SSE and
// x87 control words on the old stack and pops them off the new one (a few
// nanoseconds); elsewhere ucontext's swapcontext (a system call for the
// signal mask each time).
#if defined(__x86_64__)
extern "C" void ferrox_fiber_switch(void** save, void* to);
asm(R"(
    .text
    .p2align 4
    .globl ferrox_fiber_switch
    .hidden ferrox_fiber_switch
    .type ferrox_fiber_switch,@function
ferrox_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size ferrox_fiber_switch, .-ferrox_fiber_switch
)");
#else
#include <ucontext.h>
#endif

namespace ferrox_shim {

constexpr int THREADS = 64;
constexpr size_t STACK = 64 * 1024;

struct Group {
#if defined(__x86_64__)
    void* sched;
    void* ctx[THREADS];
#else
    ucontext_t sched;
    ucontext_t ctx[THREADS];
#endif
    bool done[THREADS];
    int cur = 0;
    unsigned barriers = 0;
    std::function<void(uint)> body;
    std::vector<char> stacks = std::vector<char>(THREADS * STACK);
};

thread_local Group* group = nullptr;

// From thread `i`'s fiber back to the scheduler.
static void to_scheduler(Group* g, int i) {
#if defined(__x86_64__)
    ferrox_fiber_switch(&g->ctx[i], g->sched);
#else
    swapcontext(&g->ctx[i], &g->sched);
#endif
}

static void to_fiber(Group& g, int i) {
    g.cur = i;
#if defined(__x86_64__)
    ferrox_fiber_switch(&g.sched, g.ctx[i]);
#else
    swapcontext(&g.sched, &g.ctx[i]);
#endif
}

static void entry() {
    Group* g = group;
    int i = g->cur;
    g->body(uint(i));
    g->done[i] = true;
#if defined(__x86_64__)
    to_scheduler(g, i);
    __builtin_unreachable();
#endif
}

static void start_fiber(Group& g, int i) {
    char* base = g.stacks.data() + size_t(i) * STACK;
#if defined(__x86_64__)
    // What ferrox_fiber_switch pops: the control words, six registers, and
    // `entry` as the return address, over a 16-byte-aligned top (entry then
    // starts as if called).
    uintptr_t top = uintptr_t(base + STACK) & ~uintptr_t(15);
    uint64_t* sp = reinterpret_cast<uint64_t*>(top);
    *--sp = 0;
    *--sp = uint64_t(reinterpret_cast<uintptr_t>(&entry));
    for (int r = 0; r < 6; r++) *--sp = 0;
    --sp;
    uint32_t words[2] = {0x1F80u, 0x037Fu};
    std::memcpy(sp, words, sizeof words);
    g.ctx[i] = sp;
#else
    getcontext(&g.ctx[i]);
    g.ctx[i].uc_stack.ss_sp = base;
    g.ctx[i].uc_stack.ss_size = STACK;
    g.ctx[i].uc_link = &g.sched;
    makecontext(&g.ctx[i], entry, 0);
#endif
    g.done[i] = false;
}

static void run_group(Group& g) {
    // Thread 0 first: a kernel that reaches no barrier in it reaches none in
    // any thread (barriers are uniform over a threadgroup), and the others
    // then run as plain calls.
    g.barriers = 0;
    start_fiber(g, 0);
    to_fiber(g, 0);
    if (g.done[0] && g.barriers == 0) {
        for (int i = 1; i < THREADS; i++) g.body(uint(i));
        return;
    }
    for (int i = 1; i < THREADS; i++) start_fiber(g, i);
    // Round k runs every live thread to its k-th barrier (or its end);
    // thread 0 is already at its first.
    bool live = true;
    bool first = true;
    while (live) {
        live = false;
        for (int i = 0; i < THREADS; i++) {
            if (g.done[i]) continue;
            if (!(first && i == 0)) to_fiber(g, i);
            live |= !g.done[i];
        }
        first = false;
    }
}

template <class T, size_t I, size_t N, class P>
static T arg(P& p, void* const* bufs, uint3 tg, uint tid) {
    if constexpr (I == 0) return p;
    else if constexpr (I == N - 2) return tg;
    else if constexpr (I == N - 1) return tid;
    else return static_cast<T>(bufs[I - 1]);
}

template <class... A, size_t... I, class P>
static void call(void (*k)(A...), P& p, void* const* bufs, uint3 tg, uint tid, std::index_sequence<I...>) {
    using T = std::tuple<A...>;
    k(arg<std::tuple_element_t<I, T>, I, sizeof...(A)>(p, bufs, tg, tid)...);
}

// Runs kernel `k` (parameters struct, buffers, threadgroup position,
// thread index) over gx * gz threadgroups. -2: wrong buffer count, -3:
// parameter bytes not the struct's size.
template <class... A>
static int launch(void (*k)(A...), const void* params, size_t bytes, void* const* bufs, size_t n_bufs, uint gx, uint gz) {
    constexpr size_t N = sizeof...(A);
    static_assert(N >= 3, "a kernel takes parameters, a threadgroup position and a thread index");
    using P = std::remove_cvref_t<std::tuple_element_t<0, std::tuple<A...>>>;
    if (n_bufs != N - 3) return -2;
    if (bytes != sizeof(P)) return -3;
    P p;
    std::memcpy(&p, params, sizeof p);
    thread_local Group g;
    group = &g;
    for (uint z = 0; z < gz; z++) {
        for (uint x = 0; x < gx; x++) {
            uint3 tg{x, 0, z};
            g.body = [&](uint tid) { call(k, p, bufs, tg, tid, std::make_index_sequence<N>{}); };
            run_group(g);
        }
    }
    return 0;
}

}  // namespace ferrox_shim

void threadgroup_barrier(mem_flags) {
    ferrox_shim::Group* g = ferrox_shim::group;
    g->barriers++;
    ferrox_shim::to_scheduler(g, g->cur);
}

// 0: ran; -1: no kernel of that name; -2, -3: see launch().
extern "C" int ferrox_msl_launch(const char* name, const void* params, size_t bytes, void* const* bufs, size_t n_bufs, uint32_t gx, uint32_t gz) {
#include "msl_kernels.inc"
    return -1;
}
