// Read-bandwidth probe: LDG streaming at several loads in flight, TMA bulk
// copies into shared memory, cudaMemcpy copy. Prints GB/s (bytes read / time).
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e) { printf("err %s line %d\n", cudaGetErrorString(e), __LINE__); return 1; } } while (0)

template <int U>
__global__ void ldg_rd(const uint4* __restrict__ p, size_t n, float* out) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    unsigned acc = 0;
    for (; i + (U - 1) * stride < n; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int j = 0; j < U; j++) v[j] = __ldg(p + i + j * stride);
#pragma unroll
        for (int j = 0; j < U; j++) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

// Each block streams its own contiguous slice (as a matvec block would).
template <int U>
__global__ void ldg_slice(const uint4* __restrict__ p, size_t per_block, float* out) {
    const uint4* b = p + blockIdx.x * per_block;
    unsigned acc = 0;
    for (size_t i = threadIdx.x; i + (U - 1) * blockDim.x < per_block; i += U * blockDim.x) {
        uint4 v[U];
#pragma unroll
        for (int j = 0; j < U; j++) v[j] = __ldg(b + i + j * blockDim.x);
#pragma unroll
        for (int j = 0; j < U; j++) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
    }
    if (acc == 0x12345678u) out[0] = acc;
}

__device__ __forceinline__ unsigned sa(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

template <int STAGES, int CH>
__global__ void tma_rd(const char* __restrict__ p, size_t per_block, float* out) {
    extern __shared__ __align__(128) char sm[];
    __shared__ __align__(8) unsigned long long bar[STAGES];
    const char* base = p + blockIdx.x * per_block;
    int nch = (int)(per_block / CH);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&bar[s])));
        asm volatile("fence.mbarrier_init.release.cluster;");
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int s = 0; s < STAGES && s < nch; s++) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(&bar[s])), "r"(CH));
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(sa(sm + s * CH)), "l"(base + (size_t)s * CH), "r"(CH), "r"(sa(&bar[s])) : "memory");
        }
    unsigned acc = 0;
    for (int c = 0; c < nch; c++) {
        int s = c % STAGES;
        unsigned ph = (c / STAGES) & 1;
        unsigned done = 0;
        while (!done)
            asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                         : "=r"(done) : "r"(sa(&bar[s])), "r"(ph) : "memory");
        const uint4* q = (const uint4*)(sm + s * CH);
        for (int i = threadIdx.x; i < CH / 16; i += blockDim.x) { uint4 v = q[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
        __syncthreads();
        if (threadIdx.x == 0 && c + STAGES < nch) {
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(sa(&bar[s])), "r"(CH));
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(sa(sm + s * CH)), "l"(base + (size_t)(c + STAGES) * CH), "r"(CH), "r"(sa(&bar[s])) : "memory");
        }
    }
    if (acc == 0x12345678u) out[0] = acc;
}

int nsm;
template <class F> float timeit(F f, int reps = 20) {
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    for (int i = 0; i < 3; i++) f();
    cudaEventRecord(a);
    for (int i = 0; i < reps; i++) f();
    cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b);
    return ms / reps * 1e-3f;
}

template <int STAGES, int CH>
void tma_case(const char* p, size_t bytes, float* out, int bps) {
    int blocks = nsm * bps;
    size_t per = bytes / blocks / CH * CH;
    size_t smem = (size_t)STAGES * CH;
    cudaFuncSetAttribute(tma_rd<STAGES, CH>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    float t = timeit([&] { tma_rd<STAGES, CH><<<blocks, 128, smem>>>(p, per, out); });
    cudaError_t e = cudaGetLastError();
    printf("tma stages=%d ch=%d blocks/sm=%d: %.0f GB/s %s\n", STAGES, CH, bps, per * blocks / t / 1e9, e ? cudaGetErrorString(e) : "");
}

int main() {
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    size_t bytes = (size_t)1 << 30;  // 1 GiB, far past L2
    char *p, *q; float* out;
    CK(cudaMalloc(&p, bytes)); CK(cudaMalloc(&q, bytes)); CK(cudaMalloc(&out, 64));
    CK(cudaMemset(p, 1, bytes));
    float t = timeit([&] { cudaMemcpyAsync(q, p, bytes, cudaMemcpyDeviceToDevice); });
    printf("memcpy: %.0f GB/s read+write (%.0f read)\n", 2 * bytes / t / 1e9, bytes / t / 1e9);
    size_t n = bytes / 16;
    for (int bps : {2, 4, 8}) {
        int g = nsm * bps;
        printf("ldg grid-stride 256 thr, %d blocks/sm: U1 %.0f U2 %.0f U4 %.0f U8 %.0f GB/s\n", bps,
               bytes / timeit([&] { ldg_rd<1><<<g, 256>>>((uint4*)p, n, out); }) / 1e9,
               bytes / timeit([&] { ldg_rd<2><<<g, 256>>>((uint4*)p, n, out); }) / 1e9,
               bytes / timeit([&] { ldg_rd<4><<<g, 256>>>((uint4*)p, n, out); }) / 1e9,
               bytes / timeit([&] { ldg_rd<8><<<g, 256>>>((uint4*)p, n, out); }) / 1e9);
        size_t per = n / g;
        printf("ldg slice per block, %d blocks/sm: U4 %.0f U8 %.0f GB/s\n", bps,
               per * g * 16 / timeit([&] { ldg_slice<4><<<g, 256>>>((uint4*)p, per, out); }) / 1e9,
               per * g * 16 / timeit([&] { ldg_slice<8><<<g, 256>>>((uint4*)p, per, out); }) / 1e9);
    }
    tma_case<4, 16384>(p, bytes, out, 1);
    tma_case<4, 16384>(p, bytes, out, 2);
    tma_case<8, 8192>(p, bytes, out, 2);
    tma_case<6, 16384>(p, bytes, out, 2);
    tma_case<4, 32768>(p, bytes, out, 1);
    tma_case<3, 32768>(p, bytes, out, 2);
    tma_case<8, 4096>(p, bytes, out, 4);
    // Smaller footprints as in decode (117 MB, 32 MB chained over 8 buffers)
    for (size_t mb : {117, 32, 8}) {
        size_t b = mb << 20;
        int nb = (int)((bytes) / b); if (nb > 8) nb = 8;
        int k = 0, g = nsm * 4;
        float tt = timeit([&] { ldg_rd<4><<<g, 256>>>((uint4*)(p + (k++ % nb) * b), b / 16, out); }, 40);
        printf("ldg U4 4/sm, %zu MB rotating over %d buffers: %.0f GB/s (%.1f us)\n", mb, nb, b / tt / 1e9, tt * 1e6);
    }
    return 0;
}
