// The shim device's launcher: the Metal kernels (msl_source.inc, the
// concatenated kernels/*.metal) compiled as C++ against msl.h, and
// ferrox_msl_launch(), which runs one kernel by name over a grid of
// threadgroups of 64 threads. A threadgroup's threads are fibers
// (ucontext) on the calling thread, run in turn up to each barrier.
#include "msl.h"

#include "msl_source.inc"

#undef kernel
#undef device
#undef constant
#undef thread
#undef threadgroup

#include <ucontext.h>

#include <functional>
#include <vector>

namespace ferrox_shim {

constexpr int THREADS = 64;
constexpr size_t STACK = 64 * 1024;

struct Group {
    ucontext_t sched;
    ucontext_t ctx[THREADS];
    bool done[THREADS];
    int cur = 0;
    std::function<void(uint)> body;
    std::vector<char> stacks = std::vector<char>(THREADS * STACK);
};

thread_local Group* group = nullptr;

static void entry() {
    Group* g = group;
    int i = g->cur;
    g->body(uint(i));
    g->done[i] = true;
}

static void run_group(Group& g) {
    for (int i = 0; i < THREADS; i++) {
        getcontext(&g.ctx[i]);
        g.ctx[i].uc_stack.ss_sp = g.stacks.data() + size_t(i) * STACK;
        g.ctx[i].uc_stack.ss_size = STACK;
        g.ctx[i].uc_link = &g.sched;
        makecontext(&g.ctx[i], entry, 0);
        g.done[i] = false;
    }
    // Round k runs every live thread to its k-th barrier (or its end).
    bool live = true;
    while (live) {
        live = false;
        for (int i = 0; i < THREADS; i++) {
            if (g.done[i]) continue;
            g.cur = i;
            swapcontext(&g.sched, &g.ctx[i]);
            live |= !g.done[i];
        }
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
    swapcontext(&g->ctx[g->cur], &g->sched);
}

// 0: ran; -1: no kernel of that name; -2, -3: see launch().
extern "C" int ferrox_msl_launch(const char* name, const void* params, size_t bytes, void* const* bufs, size_t n_bufs, uint32_t gx, uint32_t gz) {
#include "msl_kernels.inc"
    return -1;
}
