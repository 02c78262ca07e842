// ferrox's CUDA kernels, compiled at run time by NVRTC (no headers: half
// conversions are inline PTX, so the source compiles with libnvrtc alone).
//
// The decision: every weight kind is one device function, `deq_<kind>`,
// that expands one 32-element unit of a row (a whole block for the 32-wide
// kinds, one sub-block of a 256-wide K-quant block). The matvec, get_rows
// and dequantize-to-f16 kernels are each written once over that function,
// so a kind is added by writing its unit and one line of each table.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef signed char i8;

#define INF_F __int_as_float(0x7f800000)

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f));
    return h;
}

__device__ __forceinline__ u16 ld16(const u8* p) { return (u16)p[0] | ((u16)p[1] << 8); }
__device__ __forceinline__ u32 ld32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}

// ---- one 32-element unit per kind: `row` is the row's first byte, `u` the
// unit index, `cols` the row width (only the float kinds need it: their
// rows need not be a multiple of 32).

__device__ __forceinline__ void deq_f32(const u8* row, int u, int cols, float v[32]) {
    const float* r = (const float*)row + u * 32;
#pragma unroll
    for (int i = 0; i < 32; i++) v[i] = (u * 32 + i < cols) ? r[i] : 0.0f;
}

__device__ __forceinline__ void deq_f16(const u8* row, int u, int cols, float v[32]) {
    const u16* r = (const u16*)row + u * 32;
#pragma unroll
    for (int i = 0; i < 32; i++) v[i] = (u * 32 + i < cols) ? h2f(r[i]) : 0.0f;
}

__device__ __forceinline__ void deq_bf16(const u8* row, int u, int cols, float v[32]) {
    const u16* r = (const u16*)row + u * 32;
#pragma unroll
    for (int i = 0; i < 32; i++) v[i] = (u * 32 + i < cols) ? __int_as_float(((u32)r[i]) << 16) : 0.0f;
}

__device__ __forceinline__ void deq_q4_0(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + u * 18;
    float d = h2f(ld16(b));
#pragma unroll
    for (int j = 0; j < 16; j++) {
        u8 q = b[2 + j];
        v[j] = ((int)(q & 0xF) - 8) * d;
        v[j + 16] = ((int)(q >> 4) - 8) * d;
    }
}

__device__ __forceinline__ void deq_q4_1(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + u * 20;
    float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
#pragma unroll
    for (int j = 0; j < 16; j++) {
        u8 q = b[4 + j];
        v[j] = (q & 0xF) * d + m;
        v[j + 16] = (q >> 4) * d + m;
    }
}

__device__ __forceinline__ void deq_q5_0(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + u * 22;
    float d = h2f(ld16(b));
    u32 qh = ld32(b + 2);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        u8 q = b[6 + j];
        int h0 = ((qh >> j) << 4) & 0x10;
        int h1 = (qh >> (j + 12)) & 0x10;
        v[j] = ((int)((q & 0xF) | h0) - 16) * d;
        v[j + 16] = ((int)((q >> 4) | h1) - 16) * d;
    }
}

__device__ __forceinline__ void deq_q5_1(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + u * 24;
    float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
    u32 qh = ld32(b + 4);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        u8 q = b[8 + j];
        int h0 = ((qh >> j) << 4) & 0x10;
        int h1 = (qh >> (j + 12)) & 0x10;
        v[j] = ((q & 0xF) | h0) * d + m;
        v[j + 16] = ((q >> 4) | h1) * d + m;
    }
}

__device__ __forceinline__ void deq_q8_0(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + u * 34;
    float d = h2f(ld16(b));
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = (float)((i8)b[2 + j]) * d;
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K block.
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

__device__ __forceinline__ void deq_q4_k(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 144;
    int s = u & 7;
    float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
    int sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    float d1 = d * sc, m1 = dmin * m;
    const u8* q = b + 16 + (s >> 1) * 32;
    int shift = (s & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; l++) v[l] = d1 * ((q[l] >> shift) & 0xF) - m1;
}

__device__ __forceinline__ void deq_q5_k(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 176;
    int s = u & 7;
    float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
    int sc, m;
    scale_min_k4(s, b + 4, &sc, &m);
    float d1 = d * sc, m1 = dmin * m;
    const u8* qh = b + 16;
    const u8* q = b + 48 + (s >> 1) * 32;
    int shift = (s & 1) * 4;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        int hi = (qh[l] >> s) & 1;
        v[l] = d1 * (((q[l] >> shift) & 0xF) + 16 * hi) - m1;
    }
}

__device__ __forceinline__ void deq_q6_k(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 210;
    int s = u & 7;
    int half = s >> 2, quarter = s & 3;
    const u8* ql = b + half * 64 + (quarter & 1) * 32;
    const u8* qh = b + 128 + half * 32;
    const i8* sc = (const i8*)(b + 192) + half * 8 + quarter * 2;
    float d = h2f(ld16(b + 208));
    int lshift = (quarter >> 1) * 4;
    int hshift = quarter * 2;
#pragma unroll
    for (int l = 0; l < 32; l++) {
        int q = (int)(((ql[l] >> lshift) & 0xF) | (((qh[l] >> hshift) & 3) << 4)) - 32;
        v[l] = d * sc[l >> 4] * q;
    }
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the block; `red` holds 32 floats. Every thread gets the total.
__device__ float block_sum(float v, float* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : 0.0f;
    return warp_sum(t);
}

__device__ float block_max(float v, float* red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float t = lane < nw ? red[lane] : -INF_F;
    return warp_max(t);
}

// ---- per-kind kernels: y[t, r] = W[r] . x[t] (one warp per row, lanes over
// units; 4 rows a block), dequantized rows (get_rows) and f16 tiles (GEMM).

#define MATVEC_ROWS 4

#define DEFINE_KIND(NAME)                                                                          \
    extern "C" __global__ void matvec_##NAME(const u8* w, const float* x, float* y, int rows,    \
                                             int cols, long long row_bytes) {                    \
        int r = blockIdx.x * MATVEC_ROWS + (threadIdx.x >> 5);                                    \
        int lane = threadIdx.x & 31;                                                              \
        int t = blockIdx.y;                                                                       \
        if (r >= rows) return;                                                                    \
        const u8* row = w + (size_t)r * row_bytes;                                                \
        const float* xt = x + (size_t)t * cols;                                                   \
        int n_units = (cols + 31) >> 5;                                                           \
        float acc = 0.0f;                                                                         \
        float v[32];                                                                              \
        for (int u = lane; u < n_units; u += 32) {                                                \
            deq_##NAME(row, u, cols, v);                                                          \
            const float* xu = xt + u * 32;                                                        \
            if (u * 32 + 32 <= cols && (cols & 3) == 0) {                                         \
                _Pragma("unroll") for (int i = 0; i < 32; i += 4) {                               \
                    float4 xv = *(const float4*)(xu + i);                                         \
                    acc += v[i] * xv.x + v[i + 1] * xv.y + v[i + 2] * xv.z + v[i + 3] * xv.w;     \
                }                                                                                 \
            } else {                                                                              \
                _Pragma("unroll") for (int i = 0; i < 32; i++) if (u * 32 + i < cols) acc += v[i] * xu[i]; \
            }                                                                                     \
        }                                                                                         \
        acc = warp_sum(acc);                                                                      \
        if (lane == 0) y[(size_t)t * rows + r] = acc;                                             \
    }                                                                                             \
    extern "C" __global__ void get_rows_##NAME(const u8* w, const u32* ids, float* out, int cols, \
                                               long long row_bytes) {                            \
        int t = blockIdx.x;                                                                       \
        const u8* row = w + (size_t)ids[t] * row_bytes;                                           \
        for (int u = threadIdx.x; u * 32 < cols; u += blockDim.x) {                               \
            float v[32];                                                                          \
            deq_##NAME(row, u, cols, v);                                                          \
            float* o = out + (size_t)t * cols + u * 32;                                           \
            _Pragma("unroll") for (int i = 0; i < 32; i++) if (u * 32 + i < cols) o[i] = v[i];   \
        }                                                                                         \
    }                                                                                             \
    extern "C" __global__ void dequant_f16_##NAME(const u8* w, u16* out, int cols,                \
                                                  long long row_bytes) {                         \
        int r = blockIdx.x;                                                                       \
        const u8* row = w + (size_t)r * row_bytes;                                                \
        for (int u = threadIdx.x; u * 32 < cols; u += blockDim.x) {                               \
            float v[32];                                                                          \
            deq_##NAME(row, u, cols, v);                                                          \
            u16* o = out + (size_t)r * cols + u * 32;                                             \
            _Pragma("unroll") for (int i = 0; i < 32; i++) if (u * 32 + i < cols) o[i] = f2h(v[i]); \
        }                                                                                         \
    }

DEFINE_KIND(f32)
DEFINE_KIND(f16)
DEFINE_KIND(bf16)
DEFINE_KIND(q4_0)
DEFINE_KIND(q4_1)
DEFINE_KIND(q5_0)
DEFINE_KIND(q5_1)
DEFINE_KIND(q8_0)
DEFINE_KIND(q4_k)
DEFINE_KIND(q5_k)
DEFINE_KIND(q6_k)

// ---- element-wise and row operations on f32 activations.

extern "C" __global__ void f32_to_f16(const float* x, u16* y, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f2h(x[i]);
}

// One block per row, in place: x = x / rms(x) * w.
extern "C" __global__ void rms_norm(float* x, const float* w, int width, float eps) {
    __shared__ float red[32];
    float* r = x + (size_t)blockIdx.x * width;
    float s = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) s += r[i] * r[i];
    s = block_sum(s, red);
    float scale = rsqrtf(s / width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) r[i] = r[i] * scale * w[i];
}

// One thread per (token, head, rotated pair). `halves` pairs i with
// i + n_rot/2 (NeoX); otherwise 2i with 2i+1. `factors` may be null.
extern "C" __global__ void rope(float* x, const u32* pos, int n_tok, int n_heads, int head_dim,
                                int n_rot, int halves, float base, float freq_scale,
                                float attn_factor, const float* factors) {
    int half_rot = n_rot / 2;
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)n_tok * n_heads * half_rot;
    if (idx >= total) return;
    int i = idx % half_rot;
    int h = (idx / half_rot) % n_heads;
    int t = idx / ((long long)half_rot * n_heads);
    float theta_scale = powf(base, -2.0f / n_rot);
    float theta = (float)pos[t] * powf(theta_scale, (float)i);
    if (factors) theta = theta / factors[i];
    theta *= freq_scale;
    float c = cosf(theta) * attn_factor, s = sinf(theta) * attn_factor;
    float* hp = x + ((size_t)t * n_heads + h) * head_dim;
    int a = halves ? i : 2 * i;
    int b = halves ? i + half_rot : 2 * i + 1;
    float x0 = hp[a], x1 = hp[b];
    hp[a] = x0 * c - x1 * s;
    hp[b] = x0 * s + x1 * c;
}

// Writes each token's k/v rows into its (slot, position) of the f16 cache.
extern "C" __global__ void kv_store(const float* src, u16* cache, const u32* seq, const u32* pos,
                                    int dim, int n_ctx) {
    int t = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= dim) return;
    size_t at = (size_t)seq[t] * n_ctx + pos[t];
    cache[at * dim + i] = f2h(src[(size_t)t * dim + i]);
}

#define ATTN_CHUNK 256
#define ATTN_THREADS 128

// One block per (token, query head): causal (and optionally windowed)
// attention over the token's own slot of the f16 cache, with an online
// softmax over chunks of keys so any context length fits fixed shared
// memory. Head sizes up to 256.
extern "C" __global__ void attention(const float* q, const u16* kc, const u16* vc, float* out,
                                     const u32* seq, const u32* pos, int n_head, int n_head_kv,
                                     int hd, int hdv, int n_ctx, float scale, float softcap,
                                     int window) {
    __shared__ float sq[256];
    __shared__ float sp[ATTN_CHUNK];
    __shared__ float red[32];
    int t = blockIdx.x / n_head, h = blockIdx.x % n_head;
    int kvh = h / (n_head / n_head_kv);
    int s = seq[t], p = pos[t];
    int lo = window > 0 ? max(0, p + 1 - window) : 0;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const float* qh = q + ((size_t)t * n_head + h) * hd;
    for (int i = tid; i < hd; i += blockDim.x) sq[i] = qh[i];
    __syncthreads();
    size_t kd = (size_t)n_head_kv * hd, vd = (size_t)n_head_kv * hdv;
    const u16* kb = kc + (size_t)s * n_ctx * kd + (size_t)kvh * hd;
    const u16* vb = vc + (size_t)s * n_ctx * vd + (size_t)kvh * hdv;
    float m = -INF_F, l = 0.0f, acc0 = 0.0f, acc1 = 0.0f;
    for (int c0 = lo; c0 <= p; c0 += ATTN_CHUNK) {
        int nc = min(ATTN_CHUNK, p + 1 - c0);
        for (int j = warp; j < nc; j += nw) {
            const u16* kr = kb + (size_t)(c0 + j) * kd;
            float d = 0.0f;
            for (int i = lane; i < hd; i += 32) d += sq[i] * h2f(kr[i]);
            d = warp_sum(d);
            if (lane == 0) {
                float sc = d * scale;
                if (softcap > 0.0f) sc = softcap * tanhf(sc / softcap);
                sp[j] = sc;
            }
        }
        __syncthreads();
        float cm = -INF_F;
        for (int j = tid; j < nc; j += blockDim.x) cm = fmaxf(cm, sp[j]);
        cm = block_max(cm, red);
        float mn = fmaxf(m, cm);
        float corr = expf(m - mn);
        for (int j = tid; j < nc; j += blockDim.x) sp[j] = expf(sp[j] - mn);
        __syncthreads();
        float cs = 0.0f;
        for (int j = tid; j < nc; j += blockDim.x) cs += sp[j];
        cs = block_sum(cs, red);
        l = l * corr + cs;
        acc0 *= corr;
        acc1 *= corr;
        for (int j = 0; j < nc; j++) {
            const u16* vr = vb + (size_t)(c0 + j) * vd;
            float w = sp[j];
            if (tid < hdv) acc0 += w * h2f(vr[tid]);
            if (tid + ATTN_THREADS < hdv) acc1 += w * h2f(vr[tid + ATTN_THREADS]);
        }
        m = mn;
        __syncthreads();
    }
    float* o = out + ((size_t)t * n_head + h) * hdv;
    if (tid < hdv) o[tid] = acc0 / l;
    if (tid + ATTN_THREADS < hdv) o[tid + ATTN_THREADS] = acc1 / l;
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608f;
    return 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x)));
}

// act: 0 = SiLU, 1 = GELU (tanh form). `stride`/`up_off` let one kernel
// serve separate gate/up buffers (stride = width, up_off unused) and a fused
// [gate | up] row (stride = 2 * width, up_off = width).
extern "C" __global__ void glu(const float* gate, const float* up, float* out, long long n,
                               int width, int stride, int act) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long r = i / width, c = i % width;
    float g = gate[r * stride + c], u = up[r * stride + c];
    out[i] = (act == 0 ? silu(g) : gelu_tanh(g)) * u;
}

extern "C" __global__ void add(float* a, const float* b, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i];
}

extern "C" __global__ void add_bias(float* y, const float* b, long long n, int width) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += b[i % width];
}

extern "C" __global__ void scale(float* x, float s, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

extern "C" __global__ void softcap(float* x, float cap, long long n) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = tanhf(x[i] / cap) * cap;
}

// dst[r, c] = src[rows[r] * src_width + c0 + c] for c < width: gathers rows
// (c0 = 0, width = src_width) and splits columns (rows = identity).
extern "C" __global__ void copy_cols(const float* src, const u32* rows, float* dst, int n_rows,
                                     int src_width, int c0, int width) {
    int r = blockIdx.y;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rows || c >= width) return;
    size_t sr = rows ? rows[r] : (u32)r;
    dst[(size_t)r * width + c] = src[sr * src_width + c0 + c];
}
