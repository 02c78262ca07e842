// What a kernel boundary costs a chain of decode matvecs, against the same
// matvecs as phases of one persistent kernel with grid barriers between
// them. The question it answers: would a persistent decode kernel (one
// launch a step, grid-wide phases) stream an 8b F16 model's weights faster
// than ferrox's chain of PDL launches? (docs/decisions/0003-persistent-decode-kernel.md;
// results in benchmarks/results/cuda-h200.jsonl, table cuda-boundary.)
//
// The work is the weight streaming of Llama-8b's decode step in F16 (per
// layer: QKV 6144x4096, O 4096x4096, gate+up 28672x4096, down 4096x14336;
// 32 layers, each with its own weights; then the 128256x4096 head): 15.0 GB
// a step, read by the same warp-a-row streaming loop ferrox's
// `matvec_f16_stream` uses (a lane keeps two steps of 8 16-byte loads in
// registers, the next step's loads issued before this step's dots; the
// first two steps of a phase are loaded before its wait). Phase p reads the
// output of phase p - 1 as its input, so every boundary is a real
// dependency. No attention, norms or host work: only the streaming and the
// boundaries.
//
// Variants (same device function for the phase; each a CUDA graph or a
// single launch, timed by events over replays, the median reported):
//   pdl     one kernel a phase, programmatic dependent launch (ferrox's way)
//   plain   one kernel a phase, plain stream order
//   bar     one persistent kernel (cooperative launch, co-resident blocks),
//           a grid barrier between phases (one counter: a release add and an
//           acquire spin by one thread a block), the next phase's first two
//           steps loaded before the barrier
//   bar0    the same, the next phase's loads issued only after the barrier
//   cg      the same as bar through cooperative_groups' grid sync
//   nobar   the same kernel with no barrier at all: the phases race (their
//           output is wrong), timing only: the streaming loop's own speed
//           over 15 GB with no boundary, the ceiling the others approach
// Every other variant's last output must equal pdl's bit for bit (checked).
//
// Build and run (on the GPU machine):
//   nvcc -O3 -arch=sm_90 -o /tmp/bb tools/cuda/boundary_bench.cu && /tmp/bb [layers] [reps]
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define CK(x)                                                                              \
    do {                                                                                   \
        cudaError_t e_ = (x);                                                              \
        if (e_ != cudaSuccess) {                                                           \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(1);                                                                       \
        }                                                                                  \
    } while (0)

#define S 8
#define THREADS 256
#define MAXP 160

struct Phase {
    const uint4* w;
    int rows, cols;
    const float* x;
    float* y;
};
__constant__ Phase phases[MAXP];

__device__ __forceinline__ float h2f(unsigned short h) { return __half2float(__ushort_as_half(h)); }

__device__ __forceinline__ float dot8(uint4 w, const float4* x) {
    float4 a = x[0], b = x[1];
    return h2f((unsigned short)w.x) * a.x + h2f((unsigned short)(w.x >> 16)) * a.y +
           h2f((unsigned short)w.y) * a.z + h2f((unsigned short)(w.y >> 16)) * a.w +
           h2f((unsigned short)w.z) * b.x + h2f((unsigned short)(w.z >> 16)) * b.y +
           h2f((unsigned short)w.w) * b.z + h2f((unsigned short)(w.w >> 16)) * b.w;
}

struct Warp {
    int lane, w0, nw;
};

__device__ __forceinline__ Warp warp_of() {
    Warp r;
    r.lane = threadIdx.x & 31;
    r.nw = gridDim.x * (THREADS / 32);
    r.w0 = blockIdx.x * (THREADS / 32) + (threadIdx.x >> 5);
    return r;
}

// Step s of phase P for this warp: its row's first 16-byte unit (u0) and the
// row's address; rows rotate their first step as ferrox's kernel does.
__device__ __forceinline__ const uint4* step_at(const Phase& P, const Warp& W, int spr, int s, int* u0) {
    int i = s / spr, st = s - i * spr + W.w0 % spr;
    *u0 = W.lane + (st < spr ? st : st - spr) * 32 * S;
    return P.w + (size_t)(W.w0 + i * W.nw) * (P.cols >> 3);
}

__device__ __forceinline__ void ld_step(uint4 (&h)[S], const uint4* row, int n8, int u0) {
#pragma unroll
    for (int j = 0; j < S; j++) h[j] = __ldg(row + min(u0 + 32 * j, n8 - 1));
}

__device__ __forceinline__ float dot_step(const uint4 (&h)[S], const float4* x, int n8, int u0) {
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < S; j++) {
        int u = u0 + 32 * j;
        float d = dot8(h[j], x + 2 * min(u, n8 - 1));
        a += u < n8 ? d : 0.0f;
    }
    return a;
}

__device__ __forceinline__ int steps_of(const Phase& P, const Warp& W, int* spr) {
    int n8 = P.cols >> 3;
    *spr = (n8 + 32 * S - 1) / (32 * S);
    return W.w0 < P.rows ? ((P.rows - 1 - W.w0) / W.nw + 1) * *spr : 0;
}

// The phase's first two steps (immutable weights: before any wait).
__device__ __forceinline__ void preload(const Phase& P, const Warp& W, uint4 (&a)[S], uint4 (&b)[S]) {
    int spr, ns = steps_of(P, W, &spr), u0;
    if (ns > 0) ld_step(a, step_at(P, W, spr, 0, &u0), P.cols >> 3, u0);
    if (ns > 1) ld_step(b, step_at(P, W, spr, 1, &u0), P.cols >> 3, u0);
}

// The phase with its first two steps already in a and b.
__device__ __forceinline__ void run_phase(const Phase& P, const Warp& W, uint4 (&a)[S], uint4 (&b)[S]) {
    int spr, ns = steps_of(P, W, &spr), n8 = P.cols >> 3;
    const float4* x = (const float4*)P.x;
    int ua = 0, ub = 0;
    if (ns > 0) step_at(P, W, spr, 0, &ua);
    if (ns > 1) step_at(P, W, spr, 1, &ub);
    float acc = 0.0f;
    auto finish = [&](int s) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (W.lane == 0) P.y[W.w0 + (s / spr) * W.nw] = tanhf(acc);
        acc = 0.0f;
    };
    for (int s = 0; s < ns; s += 2) {
        acc += dot_step(a, x, n8, ua);
        if (s % spr == spr - 1) finish(s);
        if (s + 2 < ns) ld_step(a, step_at(P, W, spr, s + 2, &ua), n8, ua);
        if (s + 1 < ns) {
            acc += dot_step(b, x, n8, ub);
            if ((s + 1) % spr == spr - 1) finish(s + 1);
            if (s + 3 < ns) ld_step(b, step_at(P, W, spr, s + 3, &ub), n8, ub);
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 2) phase_kernel(int p) {
    Warp W = warp_of();
    uint4 a[S], b[S];
    preload(phases[p], W, a, b);
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" :::);
    run_phase(phases[p], W, a, b);
}

// One counter for the whole launch (zero before it): barrier k is passed
// once every block has added its k-th one.
__device__ __forceinline__ void grid_barrier(unsigned* bar, unsigned target) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(bar) : "memory");
        } while (v < target);
    }
    __syncthreads();
}

// mode 0: barrier, then the next phase's loads; 1: its first two steps
// loaded before the barrier; 2: as 1 through cooperative_groups' grid sync;
// 3: no barrier (timing only).
extern "C" __global__ void __launch_bounds__(THREADS, 2) persistent(int np, unsigned* bar, int mode) {
    Warp W = warp_of();
    uint4 a[S], b[S];
    preload(phases[0], W, a, b);
    for (int p = 0; p < np; p++) {
        run_phase(phases[p], W, a, b);
        if (p + 1 == np) break;
        if (mode >= 1) preload(phases[p + 1], W, a, b);
        if (mode == 2) cooperative_groups::this_grid().sync();
        else if (mode != 3) grid_barrier(bar, (unsigned)(p + 1) * gridDim.x);
        if (mode == 0) preload(phases[p + 1], W, a, b);
    }
}

__global__ void fill(unsigned short* w, size_t n, unsigned seed) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        float v = ((h & 0xffff) / 65536.0f - 0.5f) * 0.05f;
        w[i] = __half_as_ushort(__float2half(v));
    }
}

int main(int argc, char** argv) {
    int layers = argc > 1 ? atoi(argv[1]) : 32;
    int reps = argc > 2 ? atoi(argv[2]) : 20;
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent, THREADS, 0));
    int grid = sms * std::min(per_sm, 2);
    struct Shape {
        int rows, cols;
    };
    std::vector<Shape> shapes;
    for (int l = 0; l < layers; l++) {
        shapes.push_back({6144, 4096});
        shapes.push_back({4096, 4096});
        shapes.push_back({28672, 4096});
        shapes.push_back({4096, 14336});
    }
    shapes.push_back({128256, 4096});
    int np = (int)shapes.size();
    if (np > MAXP) {
        fprintf(stderr, "at most %d phases\n", MAXP);
        return 1;
    }
    // Activations: phase p reads buffer p % 2 and writes (p + 1) % 2, each
    // big enough for any phase (zeros past what the previous phase wrote).
    size_t act = 128256;
    float* xb[2];
    for (int i = 0; i < 2; i++) {
        CK(cudaMalloc(&xb[i], act * 4));
        CK(cudaMemset(xb[i], 0, act * 4));
    }
    std::vector<float> x0(act, 0.0f);
    for (size_t i = 0; i < 14336; i++) x0[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    Phase hp[MAXP];
    double bytes = 0;
    for (int p = 0; p < np; p++) {
        size_t n = (size_t)shapes[p].rows * shapes[p].cols;
        unsigned short* w;
        CK(cudaMalloc(&w, n * 2));
        fill<<<1024, 256>>>(w, n, 0x9e3779b9u * (p + 1));
        CK(cudaGetLastError());
        hp[p] = {(const uint4*)w, shapes[p].rows, shapes[p].cols, xb[p % 2], xb[(p + 1) % 2]};
        bytes += n * 2.0;
    }
    CK(cudaMemcpyToSymbol(phases, hp, sizeof(Phase) * np));
    unsigned* bar;
    CK(cudaMalloc(&bar, 4));
    CK(cudaDeviceSynchronize());
    printf("device SMs %d, persistent blocks an SM %d (grid %d), %d phases, %.3f GB a step\n", sms, per_sm, grid,
           np, bytes / 1e9);
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    float* out = xb[np % 2];
    size_t out_n = shapes[np - 1].rows;

    auto reset = [&] {
        CK(cudaMemcpyAsync(xb[0], x0.data(), act * 4, cudaMemcpyHostToDevice, st));
        CK(cudaMemsetAsync(xb[1], 0, act * 4, st));
        CK(cudaMemsetAsync(bar, 0, 4, st));
    };
    auto chain_graph = [&](bool pdl) {
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
        for (int p = 0; p < np; p++) {
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3(grid);
            cfg.blockDim = dim3(THREADS);
            cfg.stream = st;
            cudaLaunchAttribute at[1];
            at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[0].val.programmaticStreamSerializationAllowed = 1;
            cfg.attrs = at;
            cfg.numAttrs = pdl ? 1 : 0;
            CK(cudaLaunchKernelEx(&cfg, phase_kernel, p));
        }
        CK(cudaStreamEndCapture(st, &g));
        CK(cudaGraphInstantiate(&ge, g, 0));
        return ge;
    };
    cudaGraphExec_t g_pdl = chain_graph(true), g_plain = chain_graph(false);
    auto launch = [&](int v) {
        if (v == 0) CK(cudaGraphLaunch(g_pdl, st));
        else if (v == 1) CK(cudaGraphLaunch(g_plain, st));
        else {
            int mode = v == 2 ? 1 : v == 3 ? 0 : v == 4 ? 2 : 3;
            void* args[] = {&np, &bar, &mode};
            CK(cudaLaunchCooperativeKernel((void*)persistent, dim3(grid), dim3(THREADS), args, 0, st));
        }
    };
    const char* names[] = {"pdl", "plain", "bar", "bar0", "cg", "nobar"};
    std::vector<float> ref(out_n), got(out_n);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int round = 0; round < 2; round++) {
        for (int v = 0; v < 6; v++) {
            std::vector<float> ms;
            for (int r = 0; r < reps + 3; r++) {
                reset();
                CK(cudaEventRecord(e0, st));
                launch(v);
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float t;
                CK(cudaEventElapsedTime(&t, e0, e1));
                if (r >= 3) ms.push_back(t);
            }
            CK(cudaMemcpy(got.data(), out, out_n * 4, cudaMemcpyDeviceToHost));
            bool same = true;
            if (round == 0 && v == 0) ref = got;
            else same = memcmp(ref.data(), got.data(), out_n * 4) == 0;
            std::sort(ms.begin(), ms.end());
            float med = ms[ms.size() / 2];
            printf("round %d %-6s step %8.1f us  %.3f TB/s  (min %.1f max %.1f)%s\n", round, names[v], med * 1e3,
                   bytes / (med * 1e-3) / 1e12, ms.front() * 1e3, ms.back() * 1e3,
                   v == 5 ? "  (races: timing only)" : same ? "" : "  OUTPUT DIFFERS FROM pdl");
        }
    }
    return 0;
}
