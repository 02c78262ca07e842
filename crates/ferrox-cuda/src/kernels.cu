// ferrox's CUDA kernels, compiled at run time by NVRTC (no headers: half
// conversions are inline PTX, so the source compiles with libnvrtc alone).
//
// The decision: every weight kind is one device function, `deq_<kind>`,
// that expands one 32-element unit of a row (a whole block for the 32-wide
// kinds, one sub-block of a 256-wide K-quant block). The matvec, get_rows
// and dequantize-to-f16 kernels are each written once over that function,
// so a kind is added by writing its unit and one line of each table.
//
// Q4_0, Q8_0 and Q6_K rows are stored repacked on the device (`upload_matrix`
// in device.rs): each block without its f16 scale, block after block (so the
// quants of a block start 16-byte aligned and load as uint4), then the
// blocks' scales, then padding to a multiple of 16 bytes. Q4_K rows are
// repacked too (see `deq_q4_k`). The other kinds keep the GGUF block layout.

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef signed char i8;

#define INF_F __int_as_float(0x7f800000)

// FERROX_TRACE (measuring, through FERROX_CUDA_DEFINES): thread 0 of block
// (0, 0, 0) of every kernel records in `ferrox_trace` the global timer (ns)
// when it reaches PDL_ENTER and when the wait there returns (the previous
// kernel has finished), and the source line of that PDL_ENTER, which names
// the kernel (a macro-made kernel's line is its DEFINE_... line). The host
// writes the records out at the end (`FERROX_CUDA_TRACE`, `tools/cuda/trace.py`).
#ifndef FERROX_TRACE
#define FERROX_TRACE 0
#endif
// TRACE_MAX (with FERROX_TRACE): the records kept; the host reads however
// many the array holds.
#ifndef TRACE_MAX
#define TRACE_MAX 32768
#endif
#if FERROX_TRACE
__device__ unsigned long long ferrox_trace[3 * TRACE_MAX];
__device__ unsigned int ferrox_trace_n;
#endif
__device__ __forceinline__ bool trace_first() {
    return (blockIdx.x | blockIdx.y | blockIdx.z | threadIdx.x | threadIdx.y | threadIdx.z) == 0;
}
__device__ __forceinline__ unsigned long long trace_now() {
#if FERROX_TRACE
    if (trace_first()) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        return t;
    }
#endif
    return 0;
}
__device__ __forceinline__ void trace_record(unsigned long long pre, int line) {
#if FERROX_TRACE
    if (trace_first()) {
        unsigned i = atomicAdd(&ferrox_trace_n, 1u);
        if (i < TRACE_MAX) {
            ferrox_trace[3 * i] = pre;
            ferrox_trace[3 * i + 1] = trace_now();
            ferrox_trace[3 * i + 2] = (unsigned long long)line;
        }
    }
#endif
}

// Programmatic dependent launch (Hopper): the host launches each kernel so
// that it may start while the previous one still runs (FERROX_CUDA_PDL).
// Every kernel enters through PDL_ENTER before it touches any activation,
// cache or scratch memory: it waits there until the previous kernel has
// finished and its writes are visible, then lets the next kernel start
// launching. Only immutable memory is read before it (the streaming
// matvecs load their first two steps of weights, the int8 gate/up kernels
// prefetch their rows into L2, the norm reads its weights) and the staged slot and position lists, which only host copies
// write. On older architectures, and when the host launches plainly, the
// wait does nothing.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_ENTER()                                              \
    do {                                                         \
        unsigned long long tr_pre_ = trace_now();                \
        asm volatile("griddepcontrol.wait;" ::: "memory");       \
        trace_record(tr_pre_, __LINE__);                         \
        asm volatile("griddepcontrol.launch_dependents;" :::);   \
    } while (0)
#else
#define PDL_ENTER()                                              \
    do {                                                         \
        unsigned long long tr_pre_ = trace_now();                \
        trace_record(tr_pre_, __LINE__);                         \
    } while (0)
#endif

// Compile-time knobs (the host may set them through FERROX_CUDA_DEFINES to
// measure a variant; the defaults are the measured choices):
// FERROX_PREFETCH: the int8 gate/up kernels' L2 prefetch of their rows
// before PDL_ENTER;
// FERROX_WLOAD: 1 loads the 16-byte weight vectors with
// `ld.global.nc.L1::no_allocate.L2::256B` (streamed past L1, L2 fetching
// 256-byte runs) instead of plain `ld.global.nc`.
#ifndef FERROX_PREFETCH
#define FERROX_PREFETCH 1
#endif
#ifndef FERROX_WLOAD
#define FERROX_WLOAD 0
#endif
// MMVQ_STEP: units of each matrix a lane of the gate/up GLU kernels loads
// together before the first dot, the default of each kind's MMVQ_GSTEP_<kind>.
#ifndef MMVQ_STEP
#define MMVQ_STEP 4
#endif
#if MMVQ_STEP < 1
#error "MMVQ_STEP must be at least 1"
#endif

// FERROX_SMS: the device's multiprocessor count (the host defines it).
// FERROX_PF_WAVE: 1 prefetches only in the launch's first wave of blocks
// (`per_sm` resident an SM): later blocks start after the previous kernel
// has finished, so their prefetch only doubles their requests.
#ifndef FERROX_SMS
#define FERROX_SMS 132
#endif
#ifndef FERROX_PF_WAVE
#define FERROX_PF_WAVE 0
#endif

// Brings `bytes` of immutable weights from `p` towards L2, a 128-byte line
// per lane at `first`, `first + stride`, ... (before PDL_ENTER).
__device__ __forceinline__ void prefetch_l2(const u8* p, long long bytes, int first, int stride, int per_sm) {
#if FERROX_PREFETCH
    if (FERROX_PF_WAVE && blockIdx.x + blockIdx.y * gridDim.x >= FERROX_SMS * per_sm) return;
    for (long long o = (long long)first * 128; o < bytes; o += (long long)stride * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
#endif
}

// 16 bytes of immutable weights (16-byte aligned).
__device__ __forceinline__ uint4 ldw4(const void* p) {
#if FERROX_WLOAD
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
#else
    return __ldg((const uint4*)p);
#endif
}

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
    const u8* b = row + u * 16;  // repacked: quants, then the scales
    float d = h2f(ld16(row + (cols >> 5) * 16 + 2 * u));
#pragma unroll
    for (int j = 0; j < 16; j++) {
        u8 q = b[j];
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
    const u8* b = row + u * 32;  // repacked: quants, then the scales
    float d = h2f(ld16(row + (cols >> 5) * 32 + 2 * u));
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = (float)((i8)b[j]) * d;
}

// Q2_K: 84-byte blocks (scales[16]: low nibble scale, high nibble min;
// qs[64]: 2 bits each; d; dmin). Unit u: half n = u / 4 of the block
// (qs[32n..]), bit pair j = u % 4; its first 16 elements read qs[32n + l],
// the next 16 qs[32n + 16 + l], each with its own scale byte.
__device__ __forceinline__ void deq_q2_k(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 84;
    int s = u & 7, n = s >> 2, j = s & 3;
    float d = h2f(ld16(b + 80)), dmin = h2f(ld16(b + 82));
    const u8* q = b + 16 + 32 * n;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        u8 sc = b[8 * n + 2 * j + h];
        float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
#pragma unroll
        for (int l = 0; l < 16; l++) v[16 * h + l] = dl * (float)((q[16 * h + l] >> (2 * j)) & 3) - ml;
    }
}

// Q3_K: 110-byte blocks (hmask[32], qs[64], scales[12]: sixteen 6-bit
// scales packed as ggml packs them, d). As Q2_K for the low two bits; the
// third is bit 4n + j of hmask[l] (clear: minus 4); scale - 32 signed.
__device__ __forceinline__ void deq_q3_k(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 110;
    int s = u & 7, n = s >> 2, j = s & 3;
    float d = h2f(ld16(b + 108));
    const u8* hm = b;
    const u8* q = b + 32 + 32 * n;
    const u8* sc = b + 96;
    u8 m = (u8)(1u << (4 * n + j));
#pragma unroll
    for (int h = 0; h < 2; h++) {
        // Scale index is = 8n + 2j + h: low 4 bits from byte is % 8 (low or
        // high nibble by is / 8), high 2 bits from byte 8 + is % 4, bit
        // pair is / 4.
        int is = 8 * n + 2 * j + h;
        int lo = is < 8 ? (sc[is] & 0xF) : (sc[is - 8] >> 4);
        int hi = (sc[8 + (is & 3)] >> (2 * (is >> 2))) & 3;
        float dl = d * (float)((lo | (hi << 4)) - 32);
#pragma unroll
        for (int l = 0; l < 16; l++) {
            int e = 16 * h + l;
            int qv = (q[e] >> (2 * j)) & 3;
            v[e] = dl * (float)(qv - ((hm[e] & m) ? 0 : 4));
        }
    }
}

// The non-linear 4-bit tables as four little-endian words of signed bytes,
// looked up in registers (`lut16`): a `__constant__` array serializes a
// warp whose lanes read different entries.
#define KV_IQ4NL_W0 0xBFAD9881u  // -127, -104, -83, -65
#define KV_IQ4NL_W1 0xF6EADDCFu  //  -49,  -35, -22, -10
#define KV_IQ4NL_W2 0x26190D01u  //    1,   13,  25,  38
#define KV_IQ4NL_W3 0x71594535u  //   53,   69,  89, 113

// Four table bytes for the four codes in `q` (one 0..15 code in the low
// nibble of each byte): `__byte_perm` picks from 8 bytes with 3-bit
// selectors, so entries 0-7 and 8-15 are picked apart and bit 3 chooses.
__device__ __forceinline__ u32 lut16(u32 q, u32 w0, u32 w1, u32 w2, u32 w3) {
    u32 sel = (q & 7) | ((q >> 4) & 0x70) | ((q >> 8) & 0x700) | ((q >> 12) & 0x7000);
    u32 lo = __byte_perm(w0, w1, sel), hi = __byte_perm(w2, w3, sel);
    u32 m = ((q >> 3) & 0x01010101u) * 0xFFu;
    return (lo & ~m) | (hi & m);
}

// 32 values from 16 bytes of packed codes (element j in the low nibble of
// byte j, element j + 16 in its high nibble) through a 16-entry table,
// times d.
__device__ __forceinline__ void deq_lut16(const u8* q, float d, u32 w0, u32 w1, u32 w2, u32 w3, float v[32]) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 b = ld32(q + 4 * k);
        u32 lo = lut16(b & 0x0F0F0F0Fu, w0, w1, w2, w3), hi = lut16((b >> 4) & 0x0F0F0F0Fu, w0, w1, w2, w3);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[4 * k + i] = d * (float)(signed char)(lo >> (8 * i));
            v[16 + 4 * k + i] = d * (float)(signed char)(hi >> (8 * i));
        }
    }
}

// IQ4_NL: 18-byte blocks (d, qs[16]), codes through the non-linear table.
__device__ __forceinline__ void deq_iq4_nl(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + u * 18;
    deq_lut16(b + 2, h2f(ld16(b)), KV_IQ4NL_W0, KV_IQ4NL_W1, KV_IQ4NL_W2, KV_IQ4NL_W3, v);
}

// IQ4_XS: 136-byte blocks (d, scales_h u16, scales_l[4], qs[128]); unit u
// of the block has the 6-bit scale (scales_l nibble | 2 bits of scales_h)
// - 32 and qs[16u..16u + 16] as IQ4_NL.
__device__ __forceinline__ void deq_iq4_xs(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 136;
    int ib = u & 7;
    float d = h2f(ld16(b));
    int sh = ld16(b + 2);
    int ls = ((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 0xF) | (((sh >> (2 * ib)) & 3) << 4);
    deq_lut16(b + 8 + 16 * ib, d * (float)(ls - 32), KV_IQ4NL_W0, KV_IQ4NL_W1, KV_IQ4NL_W2, KV_IQ4NL_W3, v);
}

// TQ2_0: 66-byte blocks (qs[64], d): element 128h + 32l + m is bits 2l..
// of qs[32h + m], value (code - 1) * d. Unit u: h = u / 4, l = u % 4.
__device__ __forceinline__ void deq_tq2_0(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 66;
    int s = u & 7, h = s >> 2, l = s & 3;
    float d = h2f(ld16(b + 64));
#pragma unroll
    for (int m = 0; m < 32; m++) v[m] = d * (float)((int)((b[32 * h + m] >> (2 * l)) & 3) - 1);
}

// Trit n (0..4, most significant first) of a TQ1_0 byte, 0..2: the byte is
// a fixed-point fraction, times 3^n (wrapping in 8 bits) shifts n trits out
// and the top bits of 3q are the next one, as ggml decodes it.
__device__ __forceinline__ int tq1_trit(u32 byte, int n) {
    u32 p = (u32)(0x511B090301ull >> (8 * n)) & 0xFF;  // 1, 3, 9, 27, 81
    return (int)((((byte * p) & 0xFF) * 3) >> 8);
}

// TQ1_0: 54-byte blocks (qs[48], qh[4], d), five trits a byte of qs, four
// of qh, value (trit - 1) * d. Element order (ternary.rs): 0..160 is trit
// n of qs[m] at 32n + m; 160..240 trit n of qs[32 + m] at 160 + 16n + m;
// 240..256 trit n of qh[j] at 240 + 4n + j. Unit s = u % 8: s < 5 is trit
// s of qs[0..32]; s = 5, 6 trits 2s - 10 and 2s - 9 of qs[32..48]; s = 7
// trit 4 of qs[32..48], then qh. Selects, not branches: the lanes of a
// warp take different s.
__device__ __forceinline__ void deq_tq1_0(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 54;
    int s = u & 7;
    float d = h2f(ld16(b + 52));
    bool lo = s < 5;
    int n0 = lo ? s : 2 * s - 10;
#pragma unroll
    for (int m = 0; m < 16; m++) v[m] = d * (float)(tq1_trit(b[lo ? m : 32 + m], n0) - 1);
#pragma unroll
    for (int m = 16; m < 32; m++) {
        int off = lo ? m : s < 7 ? 16 + m : 48 + ((m - 16) & 3);
        int n = lo ? s : s < 7 ? 2 * s - 9 : (m - 16) >> 2;
        v[m] = d * (float)(tq1_trit(b[off], n) - 1);
    }
}

// ---- the IQ lattice kinds (iquants.rs). Their grids (iq2xxs_grid, ...)
// are `static __device__ const` arrays that compile.rs prints before this
// file from ferrox-quant's tables, read with `__ldg`. A 32-element unit is
// one 32-group of a 256-block: four 8-groups, each one grid point (IQ2,
// IQ1) or two 4-wide ones (IQ3) with 8 signs.

// The sign byte of a 7-bit field: bit 7 is the parity (an even number of
// minus signs per 8), which is ggml's ksigns_iq2xs table (compile.rs's
// tests pin the identity).
__device__ __forceinline__ u32 iq_signs7(u32 s) { return s | ((__popc(s) & 1) << 7); }

// n magnitudes (byte j of g) times db, negated where bit j of signs is set.
template <int N>
__device__ __forceinline__ void iq_grid(unsigned long long g, u32 signs, float db, float* v) {
#pragma unroll
    for (int j = 0; j < N; j++) {
        float x = db * (float)(u32)((g >> (8 * j)) & 0xFF);
        v[j] = (signs >> j) & 1 ? -x : x;
    }
}

// IQ2_XXS: 66-byte blocks (d, qs u16[32]); 32-group ib is two words at
// 2 + 8 ib: four grid indices, then four 7-bit sign fields and a 4-bit
// scale s (db = d (0.5 + s) / 4).
__device__ __forceinline__ void deq_iq2_xxs(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 66;
    const u8* q = b + 2 + 8 * (u & 7);
    float d = h2f(ld16(b));
    u32 idx = ld32(q), aux = ld32(q + 4);
    float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
#pragma unroll
    for (int l = 0; l < 4; l++)
        iq_grid<8>(__ldg(iq2xxs_grid + ((idx >> (8 * l)) & 0xFF)), iq_signs7((aux >> (7 * l)) & 127), db, v + 8 * l);
}

// IQ2_XS: 74-byte blocks (d, qs u16[32], scales[8]); 8-group l of ib is
// qs[4 ib + l]: a 9-bit grid index and 7 sign bits; scales[ib]'s low
// nibble scales 8-groups 0-1, the high one 2-3.
__device__ __forceinline__ void deq_iq2_xs(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 74;
    int ib = u & 7;
    float d = h2f(ld16(b));
    u32 sc = b[66 + ib];
    float db0 = d * (0.5f + (float)(sc & 0xF)) * 0.25f, db1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
#pragma unroll
    for (int l = 0; l < 4; l++) {
        u32 q = ld16(b + 2 + 8 * ib + 2 * l);
        iq_grid<8>(__ldg(iq2xs_grid + (q & 511)), iq_signs7(q >> 9), l < 2 ? db0 : db1, v + 8 * l);
    }
}

// IQ2_S: 82-byte blocks (d, qs[64], qh[8], scales[8]); 8-group l of ib:
// grid index qs[4 ib + l] | bits 2l.. of qh[ib] as bits 8-9, sign byte
// qs[32 + 4 ib + l]; scales as IQ2_XS.
__device__ __forceinline__ void deq_iq2_s(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 82;
    int ib = u & 7;
    float d = h2f(ld16(b));
    u32 sc = b[74 + ib], qh = b[66 + ib];
    float db0 = d * (0.5f + (float)(sc & 0xF)) * 0.25f, db1 = d * (0.5f + (float)(sc >> 4)) * 0.25f;
#pragma unroll
    for (int l = 0; l < 4; l++) {
        u32 idx = b[2 + 4 * ib + l] | ((qh << (8 - 2 * l)) & 0x300);
        iq_grid<8>(__ldg(iq2s_grid + idx), b[34 + 4 * ib + l], l < 2 ? db0 : db1, v + 8 * l);
    }
}

// IQ3_XXS: 98-byte blocks (d, qs[96]): 32-group ib has grid indices
// qs[8 ib..8 ib + 8] (two 4-wide points per 8-group) and the word at qs[64
// + 4 ib] of four 7-bit sign fields and a 4-bit scale s (db = d (0.5 + s) / 2).
__device__ __forceinline__ void deq_iq3_xxs(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 98;
    int ib = u & 7;
    float d = h2f(ld16(b));
    const u8* q = b + 2 + 8 * ib;
    u32 aux = ld32(b + 66 + 4 * ib);
    float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
#pragma unroll
    for (int l = 0; l < 4; l++) {
        u32 signs = iq_signs7((aux >> (7 * l)) & 127);
        iq_grid<4>(__ldg(iq3xxs_grid + q[2 * l]), signs, db, v + 8 * l);
        iq_grid<4>(__ldg(iq3xxs_grid + q[2 * l + 1]), signs >> 4, db, v + 8 * l + 4);
    }
}

// IQ3_S: 110-byte blocks (d, qs[64], qh[8], signs[32], scales[4]): 8-group
// l of ib has two 9-bit grid indices (qs[8 ib + 2l], qs[8 ib + 2l + 1],
// ninth bits 2l and 2l + 1 of qh[ib]) and sign byte signs[4 ib + l];
// db = d (1 + 2 s), s nibble ib % 2 of scales[ib / 2].
__device__ __forceinline__ void deq_iq3_s(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 110;
    int ib = u & 7;
    float d = h2f(ld16(b));
    const u8* q = b + 2 + 8 * ib;
    u32 qh = b[66 + ib];
    float db = d * (float)(1 + 2 * ((b[106 + (ib >> 1)] >> (4 * (ib & 1))) & 0xF));
#pragma unroll
    for (int l = 0; l < 4; l++) {
        u32 signs = b[74 + 4 * ib + l];
        u32 i1 = q[2 * l] | ((qh << (8 - 2 * l)) & 256), i2 = q[2 * l + 1] | ((qh << (7 - 2 * l)) & 256);
        iq_grid<4>(__ldg(iq3s_grid + i1), signs, db, v + 8 * l);
        iq_grid<4>(__ldg(iq3s_grid + i2), signs >> 4, db, v + 8 * l + 4);
    }
}

// 8 IQ1 grid values (signed bytes -1, 0, 1) plus delta, times dl.
__device__ __forceinline__ void iq1_grid(unsigned long long g, float delta, float dl, float* v) {
#pragma unroll
    for (int j = 0; j < 8; j++) v[j] = dl * ((float)(signed char)(g >> (8 * j)) + delta);
}

// IQ1_S: 50-byte blocks (d, qs[32], qh u16[8]): 32-group ib has qh[ib]
// (3 high index bits per 8-group, a 3-bit scale s at bit 12: dl = d (2s + 1),
// and the sign of the +-1/8 delta at bit 15); 8-group l's 11-bit index is
// qs[4 ib + l] | bits 3l.. of qh[ib].
__device__ __forceinline__ void deq_iq1_s(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 50;
    int ib = u & 7;
    float d = h2f(ld16(b));
    u32 qh = ld16(b + 34 + 2 * ib);
    float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
    float delta = (qh & 0x8000) ? -0.125f : 0.125f;
#pragma unroll
    for (int l = 0; l < 4; l++)
        iq1_grid(__ldg(iq1s_grid + (b[2 + 4 * ib + l] | (((qh >> (3 * l)) & 7) << 8))), delta, dl, v + 8 * l);
}

// IQ1_M: 56-byte blocks (qs[32], qh[16], scales u16[4]); no d field: the
// f16 scale is the four words' top nibbles. 32-group ib's 3-bit
// sub-scales are bits 6(ib % 2) and 6(ib % 2) + 3 of word ib / 2 (8-groups
// 0-1 and 2-3); 8-group l's nibble (l % 2) of qh[2 ib + l / 2] holds 3 high
// index bits and the delta's sign (bit 3).
__device__ __forceinline__ void deq_iq1_m(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 56;
    int ib = u & 7;
    u32 s0 = ld16(b + 48), s1 = ld16(b + 50), s2 = ld16(b + 52), s3 = ld16(b + 54);
    float d = h2f((u16)((s0 >> 12) | ((s1 >> 8) & 0xF0) | ((s2 >> 4) & 0xF00) | (s3 & 0xF000)));
    u32 w = ld16(b + 48 + 2 * (ib >> 1));
    int sh = 6 * (ib & 1);
    float dl0 = d * (float)(2 * ((w >> sh) & 7) + 1), dl1 = d * (float)(2 * ((w >> (sh + 3)) & 7) + 1);
#pragma unroll
    for (int l = 0; l < 4; l++) {
        u32 qh = b[32 + 2 * ib + (l >> 1)];
        u32 idx = b[4 * ib + l] | ((qh << (8 - 4 * (l & 1))) & 0x700);
        float delta = (qh & (0x08u << (4 * (l & 1)))) ? -0.125f : 0.125f;
        iq1_grid(__ldg(iq1s_grid + idx), delta, l < 2 ? dl0 : dl1, v + 8 * l);
    }
}

// Twice each E2M1 value by code (sign in bit 3), as four words of bytes.
#define E2M1_X2_W0 0x03020100u  //  0,  1,  2,   3
#define E2M1_X2_W1 0x0C080604u  //  4,  6,  8,  12
#define E2M1_X2_W2 0xFDFEFF00u  //  0, -1, -2,  -3
#define E2M1_X2_W3 0xF4F8FAFCu  // -4, -6, -8, -12

// MXFP4: 17-byte blocks (E8M0 exponent e, qs[16] of E2M1 codes): twice each
// code's value times 2^(e - 128) (e < 2: f32 subnormals, as ggml decodes).
__device__ __forceinline__ void deq_mxfp4(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + u * 17;
    u32 e = b[0];
    float d = __int_as_float(e < 2 ? (int)(0x00200000u << e) : (int)((e - 1) << 23));
    deq_lut16(b + 1, d, E2M1_X2_W0, E2M1_X2_W1, E2M1_X2_W2, E2M1_X2_W3, v);
}

// Q8_1: 36-byte blocks (d, s = d * sum, qs[32]).
__device__ __forceinline__ void deq_q8_1(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + u * 36;
    float d = h2f(ld16(b));
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = (float)((i8)b[4 + j]) * d;
}

// Q8_K: 292-byte blocks (f32 d, qs[256], bsums[16]).
__device__ __forceinline__ void deq_q8_k(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 3) * 292;
    float d = __int_as_float((int)ld32(b));
    const u8* q = b + 4 + 32 * (u & 7);
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = (float)((i8)q[j]) * d;
}

// Q1_0: 18-byte blocks of 128 (d, one sign bit each: bit j % 8 of
// qs[j / 8] set is +d, clear -d).
__device__ __forceinline__ void deq_q1_0(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 2) * 18;
    float d = h2f(ld16(b));
    u32 bits = ld32(b + 2 + 4 * (u & 3));
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = ((bits >> j) & 1) ? d : -d;
}

// Q2_0: 18-byte blocks of 64 (d, 2-bit codes: element j is bits 2(j % 4)
// of qs[j / 4], value (code - 1) * d).
__device__ __forceinline__ void deq_q2_0(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 1) * 18;
    float d = h2f(ld16(b));
    const u8* q = b + 2 + 8 * (u & 1);
#pragma unroll
    for (int j = 0; j < 32; j++) v[j] = (float)((int)((q[j >> 2] >> (2 * (j & 3))) & 3) - 1) * d;
}

// Half a UE4M3 scale (4 exponent bits, bias 7, 3 mantissa bits, no sign;
// 0x7F, the NaN, and 0 decode to 0; bit 7 ignored), as the CPU does.
__device__ __forceinline__ float ue4m3_half(u32 x) {
    if (x == 0 || x == 0x7F) return 0.0f;
    int e = (x >> 3) & 0xF;
    float m = (float)(x & 7);
    float raw = e == 0 ? m * 0.001953125f : (1.0f + m * 0.125f) * __int_as_float((e - 7 + 127) << 23);
    return raw * 0.5f;
}

// NVFP4: 36-byte blocks of 64 (four UE4M3 scales, one per 16 elements;
// qs[32]: sub-block s's element j in the low nibble of qs[8s + j], j + 8
// in its high nibble), E2M1 codes as MXFP4. Unit u: sub-blocks 2(u % 2)
// and 2(u % 2) + 1.
__device__ __forceinline__ void deq_nvfp4(const u8* row, int u, int cols, float v[32]) {
    const u8* b = row + (u >> 1) * 36;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int sb = 2 * (u & 1) + h;
        float d = ue4m3_half(b[sb]);
        u32 w0 = ld32(b + 4 + 8 * sb), w1 = ld32(b + 8 + 8 * sb);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            u32 w = k ? w1 : w0;
            u32 lo = lut16(w & 0x0F0F0F0Fu, E2M1_X2_W0, E2M1_X2_W1, E2M1_X2_W2, E2M1_X2_W3);
            u32 hi = lut16((w >> 4) & 0x0F0F0F0Fu, E2M1_X2_W0, E2M1_X2_W1, E2M1_X2_W2, E2M1_X2_W3);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                v[16 * h + 4 * k + i] = d * (float)(signed char)(lo >> (8 * i));
                v[16 * h + 8 + 4 * k + i] = d * (float)(signed char)(hi >> (8 * i));
            }
        }
    }
}

// The 6-bit scale and min of sub-block j of a Q4_K/Q5_K block, from the
// three words of its 12 packed scale bytes (bytes 4..15 of the block),
// with shifts (no run-time index into a register array).
__device__ __forceinline__ void scale_min_k4w(int j, u32 w0, u32 w1, u32 w2, int* sc, int* m) {
    int sh = 8 * (j & 3);
    u32 a = w0 >> sh, b = w1 >> sh, c = w2 >> sh;
    if (j < 4) {
        *sc = a & 63;
        *m = b & 63;
    } else {
        *sc = (c & 0xF) | (((a >> 6) & 3) << 4);
        *m = ((c >> 4) & 0xF) | (((b >> 6) & 3) << 4);
    }
}

// The same from the 12 packed bytes at `q`.
__device__ __forceinline__ void scale_min_k4(int j, const u8* q, int* sc, int* m) {
    scale_min_k4w(j, ld32(q), ld32(q + 4), ld32(q + 8), sc, m);
}

// Q4_K repacked (`repack` in device.rs): per row, every 32-element unit's
// 16 quant bytes (byte j: element j in the low nibble, j + 16 in the high,
// as Q4_0), then every block's 16-byte head (d, dmin, the 12 bytes of
// 6-bit scales and mins) — the same 144 bytes a block.
__device__ __forceinline__ void deq_q4_k(const u8* row, int u, int cols, float v[32]) {
    const u8* h = row + (cols >> 8) * 128 + (u >> 3) * 16;
    int s = u & 7;
    float d = h2f(ld16(h)), dmin = h2f(ld16(h + 2));
    int sc, m;
    scale_min_k4(s, h + 4, &sc, &m);
    float d1 = d * sc, m1 = dmin * m;
    const u8* q = row + u * 16;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        v[j] = d1 * (q[j] & 0xF) - m1;
        v[j + 16] = d1 * (q[j] >> 4) - m1;
    }
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
    const u8* b = row + (u >> 3) * 208;  // repacked: ql, qh, scales; then the d's
    int s = u & 7;
    int half = s >> 2, quarter = s & 3;
    const u8* ql = b + half * 64 + (quarter & 1) * 32;
    const u8* qh = b + 128 + half * 32;
    const i8* sc = (const i8*)(b + 192) + half * 8 + quarter * 2;
    float d = h2f(ld16(row + (cols >> 8) * 208 + 2 * (u >> 3)));
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

// Two sums (a GLU's gate and up) over the `lpr` lanes a row spans (a power
// of two up to 32, the row's lanes adjacent in the warp).
__device__ __forceinline__ void lanes_sum2(float& a, float& b, int lpr) {
    for (int o = lpr >> 1; o > 0; o >>= 1) {
        a += __shfl_xor_sync(0xffffffffu, a, o);
        b += __shfl_xor_sync(0xffffffffu, b, o);
    }
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
    __device__ __forceinline__ float row_dot_##NAME(const u8* row, const float* xt, int cols,     \
                                                    int lane) {                                   \
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
        return warp_sum(acc);                                                                     \
    }                                                                                             \
    extern "C" __global__ void matvec_##NAME(const u8* w, const float* x, float* y, int rows,    \
                                             int cols, long long row_bytes) { PDL_ENTER();                    \
        int r = blockIdx.x * MATVEC_ROWS + (threadIdx.x >> 5);                                    \
        int lane = threadIdx.x & 31;                                                              \
        int t = blockIdx.y;                                                                       \
        if (r >= rows) return;                                                                    \
        float acc = row_dot_##NAME(w + (size_t)r * row_bytes, x + (size_t)t * cols, cols, lane);  \
        if (lane == 0) y[(size_t)t * rows + r] = acc;                                             \
    }                                                                                             \
    /* The routed experts' matvec: `w` stacks the experts' `rows`-row        */                   \
    /* matrices; pair p = t * n_used + j reads expert route[t][j]'s rows     */                   \
    /* (the table `moe_route` writes) against x[t] (x[p] with x_per_pair).   */                   \
    extern "C" __global__ void matvec_id_##NAME(const u8* w, const float* x, float* y,             \
                                                const float* route, int rows, int cols,           \
                                                long long row_bytes, int n_used, int x_per_pair) { \
        PDL_ENTER();                                                                              \
        int r = blockIdx.x * MATVEC_ROWS + (threadIdx.x >> 5);                                    \
        int lane = threadIdx.x & 31;                                                              \
        int p = blockIdx.y, t = p / n_used, j = p - t * n_used;                                   \
        if (r >= rows) return;                                                                    \
        size_t e = (size_t)route[(size_t)t * 2 * n_used + j];                                     \
        const float* xt = x + (size_t)(x_per_pair ? p : t) * cols;                                \
        float acc = row_dot_##NAME(w + (e * rows + r) * row_bytes, xt, cols, lane);               \
        if (lane == 0) y[(size_t)p * rows + r] = acc;                                             \
    }                                                                                             \
    extern "C" __global__ void get_rows_##NAME(const u8* w, const u32* ids, float* out, int cols, \
                                               long long row_bytes) { PDL_ENTER();                            \
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
                                                  long long row_bytes) { PDL_ENTER();                         \
        int r = blockIdx.x;                                                                       \
        const u8* row = w + (size_t)r * row_bytes;                                                \
        for (int u = threadIdx.x; u * 32 < cols; u += blockDim.x) {                               \
            float v[32];                                                                          \
            deq_##NAME(row, u, cols, v);                                                          \
            u16* o = out + (size_t)r * cols + u * 32;                                             \
            if (u * 32 + 32 <= cols && (cols & 7) == 0) {                                         \
                _Pragma("unroll") for (int i = 0; i < 32; i += 8) {                               \
                    uint4 pk;                                                                     \
                    pk.x = (u32)f2h(v[i]) | ((u32)f2h(v[i + 1]) << 16);                           \
                    pk.y = (u32)f2h(v[i + 2]) | ((u32)f2h(v[i + 3]) << 16);                       \
                    pk.z = (u32)f2h(v[i + 4]) | ((u32)f2h(v[i + 5]) << 16);                       \
                    pk.w = (u32)f2h(v[i + 6]) | ((u32)f2h(v[i + 7]) << 16);                       \
                    *(uint4*)(o + i) = pk;                                                        \
                }                                                                                 \
            } else {                                                                              \
                _Pragma("unroll") for (int i = 0; i < 32; i++) if (u * 32 + i < cols) o[i] = f2h(v[i]); \
            }                                                                                     \
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
DEFINE_KIND(q2_k)
DEFINE_KIND(q3_k)
DEFINE_KIND(iq4_nl)
DEFINE_KIND(iq4_xs)
DEFINE_KIND(tq2_0)
DEFINE_KIND(mxfp4)
DEFINE_KIND(q8_1)
DEFINE_KIND(q8_k)
DEFINE_KIND(q1_0)
DEFINE_KIND(q2_0)
DEFINE_KIND(nvfp4)
DEFINE_KIND(tq1_0)
DEFINE_KIND(iq2_xxs)
DEFINE_KIND(iq2_xs)
DEFINE_KIND(iq2_s)
DEFINE_KIND(iq3_xxs)
DEFINE_KIND(iq3_s)
DEFINE_KIND(iq1_s)
DEFINE_KIND(iq1_m)

// ---- decode matvec on int8 activations (dp4a), for the kinds decode reads
// most. The activations are quantized once per input to 8 bits per
// 32-element unit (d = max|x| / 127, q = round(x / d)) into a q8 buffer
// (`quant_lane`, below: fused into the norm and the GLU, or its own
// launch); a lane takes one 32-element unit of a row at a time and dots its
// 32 weights against the unit's 32 int8 activations with __dp4a. `dot_<kind>` returns the unit's dot in weight-scale units
// times the activation scale: sum_i w_i * xq_i * dx.

#define MMVQ_WARPS 8

__device__ __forceinline__ u32 ld_a2(const u8* p) {
    const u16* q = (const u16*)p;
    return (u32)q[0] | ((u32)q[1] << 16);
}

// Each kind's unit in two steps: `ld_<kind>` issues the unit's weight
// loads (read-only, `ld.global.nc`) into a small struct, `dot_<kind>` dots
// it with the unit's activations. The kernels load every unit a lane takes
// in a step before the first dot, so a lane has all of them in flight at
// once (written as one function, the compiler issued each unit's loads
// after the previous unit's dot: one DRAM round trip per unit).
// qx: the unit's 32 int8 activations as 8 ints; dx its scale; sx = dx * sum(q).
// The dot returns the unit's dot in weight-scale units times dx.

__device__ __forceinline__ uint4 ldg4(const u8* p) { return ldw4(p); }
__device__ __forceinline__ u16 ldg2(const u8* p) { return __ldg((const unsigned short*)p); }

struct Wq4_0 { uint4 q; u16 d; };
__device__ __forceinline__ Wq4_0 ld_q4_0(const u8* row, int u, int cols) {
    // Repacked: the block's 16 quant bytes, 16-byte aligned; its scale after
    // all the row's quants.
    return Wq4_0{ldg4(row + u * 16), ldg2(row + (cols >> 5) * 16 + 2 * u)};
}
__device__ __forceinline__ float dot_q4_0(const Wq4_0& w, const int* qx, float dx, float sx) {
    u32 q[4] = {w.q.x, w.q.y, w.q.z, w.q.w};
    int acc = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        acc = __dp4a((int)(q[j] & 0x0F0F0F0Fu), qx[j], acc);
        acc = __dp4a((int)((q[j] >> 4) & 0x0F0F0F0Fu), qx[j + 4], acc);
    }
    // (q - 8) * d: the offset is -8 * sum(q) * dx.
    return h2f(w.d) * (dx * (float)acc - 8.0f * sx);
}

struct Wq5_0 { u16 d, h0, h1; u16 v[8]; };
__device__ __forceinline__ Wq5_0 ld_q5_0(const u8* row, int u, int cols) {
    // GGUF layout, 22-byte blocks: 2-byte loads only.
    const u8* b = row + u * 22;
    Wq5_0 w;
    w.d = ldg2(b);
    w.h0 = ldg2(b + 2);
    w.h1 = ldg2(b + 4);
#pragma unroll
    for (int j = 0; j < 8; j++) w.v[j] = ldg2(b + 6 + 2 * j);
    return w;
}
__device__ __forceinline__ float dot_q5_0(const Wq5_0& w, const int* qx, float dx, float sx) {
    u32 qh = (u32)w.h0 | ((u32)w.h1 << 16);
    int acc = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        u32 v = (u32)w.v[2 * j] | ((u32)w.v[2 * j + 1] << 16);
        // The high bits of elements 4j..4j+3 (low nibbles) and 4j+16.. (high).
        u32 h0 = (qh >> (4 * j)) & 0xF, h1 = (qh >> (4 * j + 16)) & 0xF;
        u32 hb0 = ((h0 & 1) << 4) | ((h0 & 2) << 11) | ((h0 & 4) << 18) | ((h0 & 8) << 25);
        u32 hb1 = ((h1 & 1) << 4) | ((h1 & 2) << 11) | ((h1 & 4) << 18) | ((h1 & 8) << 25);
        acc = __dp4a((int)((v & 0x0F0F0F0Fu) | hb0), qx[j], acc);
        acc = __dp4a((int)(((v >> 4) & 0x0F0F0F0Fu) | hb1), qx[j + 4], acc);
    }
    return h2f(w.d) * (dx * (float)acc - 16.0f * sx);
}

struct Wq8_0 { uint4 a, c; u16 d; };
__device__ __forceinline__ Wq8_0 ld_q8_0(const u8* row, int u, int cols) {
    // Repacked: the block's 32 quant bytes, 16-byte aligned; its scale after
    // all the row's quants.
    return Wq8_0{ldg4(row + u * 32), ldg4(row + u * 32 + 16), ldg2(row + (cols >> 5) * 32 + 2 * u)};
}
__device__ __forceinline__ float dot_q8_0(const Wq8_0& w, const int* qx, float dx, float sx) {
    u32 q[8] = {w.a.x, w.a.y, w.a.z, w.a.w, w.c.x, w.c.y, w.c.z, w.c.w};
    int acc = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) acc = __dp4a((int)q[j], qx[j], acc);
    return h2f(w.d) * dx * (float)acc;
}

// Q4_K repacked (see `deq_q4_k`): the unit's 16 quant bytes and its
// block's 16-byte head (shared by the block's 8 units, so mostly an L1 hit).
struct Wq4_k { uint4 q, h; int s; };
__device__ __forceinline__ Wq4_k ld_q4_k(const u8* row, int u, int cols) {
    return Wq4_k{ldg4(row + u * 16), ldg4(row + (cols >> 8) * 128 + (u >> 3) * 16), u & 7};
}
__device__ __forceinline__ float dot_q4_k(const Wq4_k& w, const int* qx, float dx, float sx) {
    float d = h2f((u16)w.h.x), dmin = h2f((u16)(w.h.x >> 16));
    int sc, m;
    scale_min_k4w(w.s, w.h.y, w.h.z, w.h.w, &sc, &m);
    u32 q[4] = {w.q.x, w.q.y, w.q.z, w.q.w};
    int acc = 0;
#pragma unroll
    for (int j = 0; j < 4; j++) {
        acc = __dp4a((int)(q[j] & 0x0F0F0F0Fu), qx[j], acc);
        acc = __dp4a((int)((q[j] >> 4) & 0x0F0F0F0Fu), qx[j + 4], acc);
    }
    return d * sc * dx * (float)acc - dmin * m * sx;
}

// Q6_K repacked: 208-byte blocks (ql, qh, scales), 16-byte aligned; the d's
// after all the row's blocks.
struct Wq6_k { uint4 l0, l1, h0, h1; u16 sc, d; int quarter; };
__device__ __forceinline__ Wq6_k ld_q6_k(const u8* row, int u, int cols) {
    const u8* b = row + (u >> 3) * 208;
    int s = u & 7;
    int half = s >> 2, quarter = s & 3;
    const u8* ql = b + half * 64 + (quarter & 1) * 32;
    const u8* qh = b + 128 + half * 32;
    return Wq6_k{ldg4(ql), ldg4(ql + 16), ldg4(qh), ldg4(qh + 16),
                 ldg2(b + 192 + half * 8 + quarter * 2), ldg2(row + (cols >> 8) * 208 + 2 * (u >> 3)), quarter};
}
__device__ __forceinline__ float dot_q6_k(const Wq6_k& w, const int* qx, float dx, float sx) {
    u32 lw[8] = {w.l0.x, w.l0.y, w.l0.z, w.l0.w, w.l1.x, w.l1.y, w.l1.z, w.l1.w};
    u32 hw[8] = {w.h0.x, w.h0.y, w.h0.z, w.h0.w, w.h1.x, w.h1.y, w.h1.z, w.h1.w};
    int lshift = (w.quarter >> 1) * 4;
    int hshift = w.quarter * 2;
    int acc0 = 0, acc1 = 0;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        u32 lo = (lw[j] >> lshift) & 0x0F0F0F0Fu;
        u32 hi = ((hw[j] >> hshift) & 0x03030303u) << 4;
        int q = (int)__vsub4(lo | hi, 0x20202020u);
        if (j < 4) acc0 = __dp4a(q, qx[j], acc0);
        else acc1 = __dp4a(q, qx[j], acc1);
    }
    int sc0 = (int)(signed char)(w.sc & 0xFF), sc1 = (int)(signed char)(w.sc >> 8);
    return h2f(w.d) * dx * (float)(sc0 * acc0 + sc1 * acc1);
}

// The activations of a decode matvec, quantized once per input (not in
// every block) into a q8 buffer that every matvec over that input reads:
// `qs` the int8 values, 32 per 32-element unit (so a unit is two int4),
// `ds` per unit (d, d * sum(q)) with d = max|x| / 127 and q = round(x / d).
// A warp quantizes one unit, a lane one element: `v` is the lane's value,
// `i` its index in the flattened [tokens, cols] input (cols % 32 == 0).
// Every lane of the warp must call it (shuffles).
__device__ __forceinline__ void quant_lane(float v, long long i, i8* qs, float2* ds) {
    float amax = warp_max(fabsf(v));
    float d = amax / 127.0f;
    int q = d > 0.0f ? (int)roundf(v / d) : 0;
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    qs[i] = (i8)q;
    if ((threadIdx.x & 31) == 0) ds[i >> 5] = make_float2(d, d * (float)sum);
}

// x [n] (n % 32 == 0) into the q8 buffer. One thread per element.
extern "C" __global__ void quantize_q8(const float* __restrict__ x, i8* __restrict__ qs,
                                       float2* __restrict__ ds, long long n) { PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i - (threadIdx.x & 31) >= n) return;  // whole warps only (n % 32 == 0)
    quant_lane(x[i], i, qs, ds);
}

// Up to three matrices of one kind over the same activations in one launch
// (a layer's Q, K and V, or gate and up): `MmvqMats` lists them; the blocks
// cover their rows in order. One matrix is the case m[1].rows == 0.
// `acc` 1 adds each row's result to what y holds (y += W x: the residual
// stream takes a projection without a separate add). `rope` 1: the three
// matrices are a layer's Q, K and V, and the epilogue applies RoPE
// (`rope_epilogue`) and stores the keys and values into the f16 cache.
struct MmvqMats {
    const u8* w[3];
    float* y[3];
    int rows[3];
    int acc;
    long long row_bytes[3];
    const u32* seq;
    const u32* pos;
    const float* factors;
    u16* kc;
    u16* vc;
    int rope, hd, n_rot, n_ctx;
    float base, freq_scale, attn_factor;
};

// The rotation of pair `i` (of n_rot / 2) at position `p`: cos and sin,
// scaled by attn_factor.
__device__ __forceinline__ void rope_cs(u32 p, int i, int n_rot, float base, float freq_scale,
                                        float attn_factor, const float* factors, float* c, float* s) {
    float theta_scale = powf(base, -2.0f / n_rot);
    float theta = (float)p * powf(theta_scale, (float)i);
    if (factors) theta = theta / factors[i];
    theta *= freq_scale;
    *c = cosf(theta) * attn_factor;
    *s = sinf(theta) * attn_factor;
}

// Matrix `k` of `m` without indexing the parameter's arrays at run time
// (that copies the struct to local memory).
__device__ __forceinline__ const u8* mats_w(const MmvqMats& m, int k) { return k == 0 ? m.w[0] : k == 1 ? m.w[1] : m.w[2]; }
__device__ __forceinline__ float* mats_y(const MmvqMats& m, int k) { return k == 0 ? m.y[0] : k == 1 ? m.y[1] : m.y[2]; }
__device__ __forceinline__ int mats_rows(const MmvqMats& m, int k) { return k == 0 ? m.rows[0] : k == 1 ? m.rows[1] : m.rows[2]; }
__device__ __forceinline__ long long mats_rb(const MmvqMats& m, int k) {
    return k == 0 ? m.row_bytes[0] : k == 1 ? m.row_bytes[1] : m.row_bytes[2];
}
// Row `r` of the launch's concatenated rows as (matrix, row); false past the end.
__device__ __forceinline__ bool mats_row(const MmvqMats& m, int* r, int* k) {
    *k = 0;
    if (*r >= m.rows[0]) {
        *r -= m.rows[0];
        *k = 1;
        if (*r >= m.rows[1]) {
            *r -= m.rows[1];
            *k = 2;
            if (*r >= m.rows[2]) return false;
        }
    }
    return true;
}

// The QKV launch's epilogue (`m.rope`) for row `r` of matrix `k` (0 q,
// 1 k, 2 v), the warp's `i`-th row, with dot `v` (every lane holds it);
// returns the value to store. RoPE pairs rows 2j and 2j+1 of a head
// (adjacent pairs, not NeoX's halves): a warp and its neighbour (warp ^ 1)
// take such a pair at the same step, since the grid's warps are even in
// number and every matrix's rows are; they swap their dots through shared
// memory under a barrier of the two warps (ids 1 to 4), the rows' slot
// alternating so a warp a row ahead cannot overwrite what its neighbour
// has yet to read. Lane 0 stores the keys and values into the cache at
// the token's (slot, position), as `rope_kv` does.
__device__ __forceinline__ float rope_epilogue(const MmvqMats& m, int k, int r, int i, float v) {
    __shared__ float pair_dot[2][8];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, t = blockIdx.y;
    int j = r % m.hd;
    if (k < 2 && j < m.n_rot) {
        if (lane == 0) pair_dot[i & 1][warp] = v;
        asm volatile("bar.sync %0, 64;" ::"r"(1 + (warp >> 1)) : "memory");
        float o = pair_dot[i & 1][warp ^ 1], c, sn;
        rope_cs(m.pos[t], j >> 1, m.n_rot, m.base, m.freq_scale, m.attn_factor, m.factors, &c, &sn);
        v = (j & 1) ? o * sn + v * c : v * c - o * sn;
    }
    if (k > 0 && lane == 0) {
        size_t at = (size_t)m.seq[t] * m.n_ctx + m.pos[t];
        (k == 1 ? m.kc : m.vc)[at * mats_rows(m, k) + r] = f2h(v);
    }
    return v;
}

// One unit's activations from the q8 buffer: 8 ints and (d, d * sum).
#define LOAD_ACTS(QT, DT, U, Q8, DD)                                                             \
    float2 DD = (DT)[U];                                                                          \
    int Q8[8];                                                                                    \
    {                                                                                             \
        int4 qa_ = (QT)[2 * (U)], qb_ = (QT)[2 * (U) + 1];                                        \
        Q8[0] = qa_.x; Q8[1] = qa_.y; Q8[2] = qa_.z; Q8[3] = qa_.w;                               \
        Q8[4] = qb_.x; Q8[5] = qb_.y; Q8[6] = qb_.z; Q8[7] = qb_.w;                               \
    }


// The int8 matvecs, streamed as the F16 ones (`matvec_f16_stream`, below:
// a warp a row, the grid's warps striding over the rows, two steps of
// MMVQS_STEP units a lane in registers, the next issued before the
// current one's dots), for every int8 kind through its unit loader and dot.
// A lane takes units lane, lane + 32, ... of its row: the unit's weights
// (consecutive lanes, consecutive units) and its 32 int8 activations and
// scale from the q8 buffer (L1/L2-resident).
#ifndef MMVQS_STEP
#define MMVQS_STEP 2
#endif
#ifndef FERROX_MMVQS_MINB
#define FERROX_MMVQS_MINB 2
#endif
// FERROX_MMVQS_ROT: 1 rotates the step order as the F16 stream does; off
// by default: on the H200 it cost the int8 kinds 1-2% of decode (1b Q8_0
// 1312 vs 1330 t/s, Q4_K 1520 vs 1545, 8b Q8_0 332 vs 335; decision 0007),
// where it gave F16 7% (8b 229 vs 214).
#ifndef FERROX_MMVQS_ROT
#define FERROX_MMVQS_ROT 0
#endif
// The streaming loop of the decode matvecs over `MmvqMats` (int8 kinds and
// F16): a warp a row, the grid's warps striding over the rows, two steps
// of S units a lane (`units` a row) in registers, the next step's loads
// (the next row's, across a row's end) issued before the current step's
// dots; the first two steps are loaded before `enter` (the kernel's
// PDL_ENTER, a lambda at the kernel's line so the trace names it; it
// returns the factor every row's dot is scaled by: 1, or the fused norm's
// 1 / rms). ROT
// starts each warp's row at a rotated step. `load(W (&)[S], row, u0)`
// loads a step (units u0 + 32 j of the row's bytes, clamped to the row);
// `dots(const W (&)[S], u0)` its dots against token blockIdx.y's input
// (read only after `enter`), units past the row's end dropped.
template <int S, bool ROT, class W, class Load, class Dots, class Enter>
__device__ __forceinline__ void mats_stream(const MmvqMats& m, int units, Load load, Dots dots, Enter enter) {
    int lane = threadIdx.x & 31;
    int nw = gridDim.x * (blockDim.x >> 5);
    int w0 = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int t = blockIdx.y;
    int rows = m.rows[0] + m.rows[1] + m.rows[2];
    int spr = (units + 32 * S - 1) / (32 * S);
    int ns = w0 < rows ? ((rows - 1 - w0) / nw + 1) * spr : 0;
    int rot = ROT ? w0 % spr : 0;
    // Step s: row w0 + (s / spr) * nw, units u0 + 32 j.
    auto at = [&](int s, int* u0) {
        int i = s / spr, r = w0 + i * nw, k, st = s - i * spr + rot;
        *u0 = lane + (st < spr ? st : st - spr) * 32 * S;
        mats_row(m, &r, &k);
        return mats_w(m, k) + (size_t)r * mats_rb(m, k);
    };
    float sc = 1.0f;
    auto yat = [&](int s) {
        int r = w0 + (s / spr) * nw, k;
        mats_row(m, &r, &k);
        return mats_y(m, k) + (size_t)t * mats_rows(m, k) + r;
    };
    // What step s's row adds its result to (acc; 0 otherwise), read by
    // lane 0 together with the step's weights: a read at the row's end
    // stalled the warp a round trip before its next loads (on the H200 8b
    // F16's down matvec took 31 us instead of 28).
    auto old = [&](int s) { return m.acc && lane == 0 ? *yat(s) : 0.0f; };
    auto finish = [&](int s, float acc, float y0) {
        float tot = warp_sum(acc) * sc;
        int r = w0 + (s / spr) * nw, k;
        mats_row(m, &r, &k);
        if (m.rope) tot = rope_epilogue(m, k, r, s / spr, tot);
        if (lane == 0) mats_y(m, k)[(size_t)t * mats_rows(m, k) + r] = y0 + tot;
    };
    W a[S], b[S];
    int ua = 0, ub = 0;
    if (ns > 0) load(a, at(0, &ua), ua);
    if (ns > 1) load(b, at(1, &ub), ub);
    sc = enter();
    float ya = ns > 0 ? old(0) : 0.0f, yb = ns > 1 ? old(1) : 0.0f;
    float acc = 0.0f;
    for (int s = 0; s < ns; s += 2) {
        acc += dots(a, ua);
        if (s % spr == spr - 1) {
            finish(s, acc, ya);
            acc = 0.0f;
        }
        if (s + 2 < ns) {
            load(a, at(s + 2, &ua), ua);
            ya = old(s + 2);
        }
        if (s + 1 < ns) {
            acc += dots(b, ub);
            if ((s + 1) % spr == spr - 1) {
                finish(s + 1, acc, yb);
                acc = 0.0f;
            }
            if (s + 3 < ns) {
                load(b, at(s + 3, &ub), ub);
                yb = old(s + 3);
            }
        }
    }
}

// An int8 kind's step (`K::ld`, `K::dot`) in `mats_stream`, against token
// blockIdx.y's q8 activations.
template <class K, int S, class Enter>
__device__ __forceinline__ void mmvq_stream_body(const MmvqMats& m, const int4* __restrict__ qx,
                                                 const float2* __restrict__ dsx, int cols, Enter enter) {
    typedef typename K::W W;
    int nu = cols >> 5;
    auto load = [&](W (&w)[S], const u8* row, int u0) {
#pragma unroll
        for (int j = 0; j < S; j++) w[j] = K::ld(row, min(u0 + 32 * j, nu - 1), cols);
    };
    int t = blockIdx.y;
    const int4* qt = qx + (size_t)t * nu * 2;
    const float2* dt = dsx + (size_t)t * nu;
    // (units past the row's end were loaded clamped; their dots are dropped)
    auto dots = [&](const W (&w)[S], int u0) {
        float a = 0.0f;
#pragma unroll
        for (int j = 0; j < S; j++) {
            int u = u0 + 32 * j, uc = min(u, nu - 1);
            LOAD_ACTS(qt, dt, uc, q8, dd);
            float d = K::dot(w[j], q8, dd.x, dd.y);
            a += u < nu ? d : 0.0f;
        }
        return a;
    };
    mats_stream<S, FERROX_MMVQS_ROT != 0, W>(m, nu, load, dots, enter);
}

#define DEFINE_MMVQ_STREAM(NAME)                                                                   \
    struct K_##NAME {                                                                             \
        typedef W##NAME W;                                                                        \
        static __device__ __forceinline__ W ld(const u8* r, int u, int c) { return ld_##NAME(r, u, c); } \
        static __device__ __forceinline__ float dot(const W& w, const int* q, float d, float s) { \
            return dot_##NAME(w, q, d, s);                                                        \
        }                                                                                         \
    };                                                                                            \
    extern "C" __global__ void __launch_bounds__(256, FERROX_MMVQS_MINB) mmvq_stream_##NAME(      \
        MmvqMats m, const int4* __restrict__ qx, const float2* __restrict__ dsx, int cols) {      \
        mmvq_stream_body<K_##NAME, MMVQS_STEP_##NAME>(m, qx, dsx, cols, [] { PDL_ENTER(); return 1.0f; }); \
    }

// Units a lane loads a step, per kind (MMVQS_STEP_<kind>, default
// MMVQS_STEP). Q4_0: 4 (18-byte units: at 2 a lane kept too few bytes in
// flight; on the H200 its 14336x4096 matvec went from 2.2 to 3.0 TB/s
// and 8b Q4_0 decode from 400 to 444 t/s; Q4_K gained nothing in decode,
// Q8_0 at 3 or 4 lost: docs/decisions/0009-per-kind-int8-steps.md).
#ifndef MMVQS_STEP_q4_0
#define MMVQS_STEP_q4_0 4
#endif
#ifndef MMVQS_STEP_q5_0
#define MMVQS_STEP_q5_0 MMVQS_STEP
#endif
#ifndef MMVQS_STEP_q8_0
#define MMVQS_STEP_q8_0 MMVQS_STEP
#endif
#ifndef MMVQS_STEP_q4_k
#define MMVQS_STEP_q4_k MMVQS_STEP
#endif
#ifndef MMVQS_STEP_q6_k
#define MMVQS_STEP_q6_k MMVQS_STEP
#endif
DEFINE_MMVQ_STREAM(q4_0)
DEFINE_MMVQ_STREAM(q5_0)
DEFINE_MMVQ_STREAM(q8_0)
DEFINE_MMVQ_STREAM(q4_k)
DEFINE_MMVQ_STREAM(q6_k)


__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

__device__ __forceinline__ float gelu_tanh(float x) {
    const float k = 0.7978845608f;
    return 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x)));
}

// The q8 copy of the GLU output's 32-row unit holding rows r0 .. r0 + rpb
// (rpb <= 32 divides 32) of token t, once all its 32 / rpb blocks wrote
// their rows of h: each block fences its writes and counts itself in; the
// last one reads the unit back from L2 and quantizes it, then resets the
// counter for the next launch. Every thread of the block calls it.
__device__ __forceinline__ void glu_unit_q8(const float* h, i8* hq, float2* hds, unsigned* cnt, int t,
                                            int rows, int r0, int rpb, bool* last) {
    long long unit = ((long long)t * rows + r0) >> 5;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned need = 32 / rpb;
        *last = need == 1 || atomicAdd(cnt + unit, 1u) == need - 1;
    }
    __syncthreads();
    if (*last && threadIdx.x < 32) {
        __threadfence();
        long long i = unit * 32 + threadIdx.x;
        quant_lane(__ldcg(h + i), i, hq, hds);
        if (threadIdx.x == 0 && rpb < 32) cnt[unit] = 0;
    }
}

// The gate and up matvecs and the GLU after them in one launch (decode):
// `lpr` lanes a row (8, 16 or 32: a row within a warp), 256 / lpr rows a
// block, so a block is short and a launch has many (the last wave of a
// launch of few long blocks left most SMs idle: commit cb8ded2,
// docs/decisions/0021-rope-store-and-gate-up-glu-fusions.md). A lane takes
// units sub, sub + lpr, ... of the row of both
// matrices, MMVQ_GSTEP_<kind> of each a step (all their loads issued before the
// first dot); the row's lane 0 writes h = act(g) * u. `act`: 0 SiLU, 1
// GELU (tanh form), as `glu`. h's q8 copy for the down matvec (32-row
// units; rows % 32 == 0): the last of the unit's blocks to finish
// quantizes it (`cnt`, one counter a unit and token, zero between launches:
// the last block resets it). The output q8 buffer is not the input's (two
// scratch slots).
// Occupancy: two blocks an SM keep every kind's loads together (ptxas
// otherwise spreads them between the dots to save registers).
#ifndef FERROX_GLU_MINB
#define FERROX_GLU_MINB 2
#endif
#if FERROX_GLU_MINB < 1
#error "FERROX_GLU_MINB must be at least 1"
#endif
// MMVQ_GSTEP_<kind>: the GLU's units of each matrix a lane loads together
// (default MMVQ_STEP). Q4_0: 8 (its units are 18 bytes: with 4 a lane had
// too few bytes in flight; on the H200 8b Q4_0 decode 444 -> 459 t/s with
// the host's 8 units a lane, docs/decisions/0009-per-kind-int8-steps.md).
#ifndef MMVQ_GSTEP_q4_0
#define MMVQ_GSTEP_q4_0 8
#endif
#ifndef MMVQ_GSTEP_q5_0
#define MMVQ_GSTEP_q5_0 MMVQ_STEP
#endif
#ifndef MMVQ_GSTEP_q8_0
#define MMVQ_GSTEP_q8_0 MMVQ_STEP
#endif
#ifndef MMVQ_GSTEP_q4_k
#define MMVQ_GSTEP_q4_k MMVQ_STEP
#endif
#ifndef MMVQ_GSTEP_q6_k
#define MMVQ_GSTEP_q6_k MMVQ_STEP
#endif
#define DEFINE_MMVQ_GLU(NAME)                                                                     \
    extern "C" __global__ void __launch_bounds__(256, FERROX_GLU_MINB) mmvq_glu_##NAME(          \
        const u8* __restrict__ wg, const u8* __restrict__ wu, long long row_bytes, int rows,      \
        const int4* __restrict__ qx, const float2* __restrict__ dsx, int cols, int act,           \
        float* __restrict__ h, i8* __restrict__ hq, float2* __restrict__ hds, int lpr,            \
        unsigned* __restrict__ cnt) {                                                             \
        __shared__ bool last;                                                                     \
        constexpr int GS_ = MMVQ_GSTEP_##NAME;                                                    \
        int n_units = cols >> 5;                                                                  \
        int sub = threadIdx.x & (lpr - 1);                                                        \
        int t = blockIdx.y;                                                                       \
        int rpb = blockDim.x / lpr;                                                               \
        int r = blockIdx.x * rpb + threadIdx.x / lpr;                                             \
        const u8* rg = wg + (size_t)r * row_bytes;                                                \
        const u8* ru = wu + (size_t)r * row_bytes;                                                \
        prefetch_l2(rg, row_bytes, sub, lpr, FERROX_GLU_MINB);                                    \
        prefetch_l2(ru, row_bytes, sub, lpr, FERROX_GLU_MINB);                                    \
        PDL_ENTER();                                                                              \
        float ag = 0.0f, au = 0.0f;                                                               \
        const int4* qt = qx + (size_t)t * n_units * 2;                                            \
        const float2* dt = dsx + (size_t)t * n_units;                                             \
        int u = sub;                                                                              \
        for (; u + (GS_ - 1) * lpr < n_units; u += GS_ * lpr) {                                   \
            W##NAME g[GS_], v[GS_];                                                               \
            _Pragma("unroll") for (int j = 0; j < GS_; j++) {                                     \
                g[j] = ld_##NAME(rg, u + j * lpr, cols);                                          \
                v[j] = ld_##NAME(ru, u + j * lpr, cols);                                          \
            }                                                                                     \
            _Pragma("unroll") for (int j = 0; j < GS_; j++) {                                     \
                LOAD_ACTS(qt, dt, u + j * lpr, q8, dd);                                           \
                ag += dot_##NAME(g[j], q8, dd.x, dd.y);                                           \
                au += dot_##NAME(v[j], q8, dd.x, dd.y);                                           \
            }                                                                                     \
        }                                                                                         \
        if (u < n_units) { /* the rest: one clamped step, as in mmvq */                           \
            W##NAME g[GS_], v[GS_];                                                               \
            _Pragma("unroll") for (int j = 0; j < GS_; j++) {                                     \
                int uj = min(u + j * lpr, n_units - 1);                                           \
                g[j] = ld_##NAME(rg, uj, cols);                                                   \
                v[j] = ld_##NAME(ru, uj, cols);                                                   \
            }                                                                                     \
            _Pragma("unroll") for (int j = 0; j < GS_; j++) {                                     \
                int uj = min(u + j * lpr, n_units - 1);                                           \
                LOAD_ACTS(qt, dt, uj, q8, dd);                                                    \
                float dg_ = dot_##NAME(g[j], q8, dd.x, dd.y), du_ = dot_##NAME(v[j], q8, dd.x, dd.y); \
                bool in_ = u + j * lpr < n_units;                                                 \
                ag += in_ ? dg_ : 0.0f;                                                           \
                au += in_ ? du_ : 0.0f;                                                           \
            }                                                                                     \
        }                                                                                         \
        lanes_sum2(ag, au, lpr);                                                                  \
        if (sub == 0) h[(size_t)t * rows + r] = (act == 0 ? silu(ag) : gelu_tanh(ag)) * au;       \
        glu_unit_q8(h, hq, hds, cnt, t, rows, blockIdx.x * rpb, rpb, &last);                     \
    }

DEFINE_MMVQ_GLU(q4_0)
DEFINE_MMVQ_GLU(q5_0)
DEFINE_MMVQ_GLU(q8_0)
DEFINE_MMVQ_GLU(q4_k)
DEFINE_MMVQ_GLU(q6_k)

// The routed experts' matvecs on int8 activations (a mixture of experts'
// decode and small batches): `lpr` lanes a row as `mmvq_glu`,
// MMVQ_GSTEP_<kind> units a lane a step. Two forms, by `sum`:
// - 0, a pair a block row: pair p = t * n_used + j (blockIdx.y) takes expert
//   route[t][j]'s rows of `w` against token t's q8 activations (pair p's
//   with `x_per_pair`). With `w2` (the up stack beside the gate's)
//   y[p] = act(W x) * (W2 x), `act` as `glu`, and with `yq` also y[p]'s q8
//   copy for the down matvec (`glu_unit_q8`: rows % 32 == 0, lpr >= 8,
//   `cnt` one zeroed counter a 32-row unit); without `w2` y[p] = W x.
// - 1, a token a block row (the down stack, `moe_sum` in the same launch):
//   token t (blockIdx.y) takes its n_used experts' rows against its pairs'
//   q8 activations (x_per_pair), y[t] = sum over j of weight_j W_j x_(t,j).
//   The lanes of a row share the n_used * units of the row's experts, each
//   dot scaled by its expert's routing weight before the lanes' sum.
// Every lane of a row group stays to the shuffles (a row past `rows`
// computes its last row and stores nothing).
#define DEFINE_MMVQ_ID(NAME)                                                                      \
    extern "C" __global__ void __launch_bounds__(256) mmvq_id_##NAME(                             \
        const u8* __restrict__ w, const u8* __restrict__ w2, long long row_bytes, int rows,       \
        const int4* __restrict__ qx, const float2* __restrict__ dsx, int cols,                    \
        const float* __restrict__ route, int n_used, int x_per_pair, int act,                     \
        float* __restrict__ y, int lpr, i8* __restrict__ yq, float2* __restrict__ yds,            \
        unsigned* __restrict__ cnt, int sum) {                                                    \
        __shared__ bool last;                                                                     \
        PDL_ENTER();                                                                              \
        constexpr int GS_ = MMVQ_GSTEP_##NAME;                                                    \
        int n_units = cols >> 5;                                                                  \
        int sub = threadIdx.x & (lpr - 1);                                                        \
        int rpb = blockDim.x / lpr;                                                               \
        int r = blockIdx.x * rpb + threadIdx.x / lpr;                                             \
        size_t rr = (size_t)min(r, rows - 1);                                                     \
        int t = sum ? (int)blockIdx.y : (int)blockIdx.y / n_used;                                 \
        int j0 = sum ? 0 : (int)blockIdx.y - t * n_used;                                          \
        int span = (sum ? n_used : 1) * n_units; /* the units this row sums */                    \
        const float* rt = route + (size_t)t * 2 * n_used;                                         \
        float ag = 0.0f, au = 0.0f;                                                               \
        for (int v = sub; v < span; v += GS_ * lpr) {                                             \
            W##NAME g[GS_], h[GS_];                                                               \
            int jx[GS_], ux[GS_];                                                                 \
            _Pragma("unroll") for (int i = 0; i < GS_; i++) {                                     \
                int vi = min(v + i * lpr, span - 1);                                              \
                int jj = vi / n_units;                                                            \
                jx[i] = j0 + jj;                                                                  \
                ux[i] = vi - jj * n_units;                                                        \
                size_t at = ((size_t)rt[jx[i]] * rows + rr) * row_bytes;                          \
                g[i] = ld_##NAME(w + at, ux[i], cols);                                            \
                if (w2) h[i] = ld_##NAME(w2 + at, ux[i], cols);                                   \
            }                                                                                     \
            _Pragma("unroll") for (int i = 0; i < GS_; i++) {                                     \
                bool in_ = v + i * lpr < span;                                                    \
                size_t xt = x_per_pair ? (size_t)t * n_used + jx[i] : (size_t)t;                  \
                LOAD_ACTS(qx + xt * n_units * 2, dsx + xt * n_units, ux[i], q8, dd);              \
                float wt_ = sum ? rt[n_used + jx[i]] : 1.0f;                                      \
                float dg_ = dot_##NAME(g[i], q8, dd.x, dd.y);                                     \
                ag += in_ ? wt_ * dg_ : 0.0f;                                                     \
                if (w2) {                                                                         \
                    float du_ = dot_##NAME(h[i], q8, dd.x, dd.y);                                 \
                    au += in_ ? du_ : 0.0f;                                                       \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        lanes_sum2(ag, au, lpr);                                                                  \
        if (sub == 0 && r < rows)                                                                 \
            y[(size_t)blockIdx.y * rows + r] = w2 ? (act == 0 ? silu(ag) : gelu_tanh(ag)) * au : ag; \
        if (yq) glu_unit_q8(y, yq, yds, cnt, blockIdx.y, rows, blockIdx.x * rpb, rpb, &last);      \
    }

DEFINE_MMVQ_ID(q4_0)
DEFINE_MMVQ_ID(q5_0)
DEFINE_MMVQ_ID(q8_0)
DEFINE_MMVQ_ID(q4_k)
DEFINE_MMVQ_ID(q6_k)


__device__ __forceinline__ float dot8_f16(uint4 h, const float4* x) {
    float4 a = x[0], b = x[1];
    return h2f((u16)h.x) * a.x + h2f((u16)(h.x >> 16)) * a.y + h2f((u16)h.y) * a.z +
           h2f((u16)(h.y >> 16)) * a.w + h2f((u16)h.z) * b.x + h2f((u16)(h.z >> 16)) * b.y +
           h2f((u16)h.w) * b.z + h2f((u16)(h.w >> 16)) * b.w;
}

// Streaming F16 matvecs (decode and small batches). The kernels before
// them (to commit 9faa9a8) gave a lane one step of four loads of one row and
// ended: a launch was a wave or more of blocks that each made one round
// trip to memory, and between waves an SM held few loads in flight (the
// ramp and tail of every block). Here a warp takes a whole row and the grid's warps stride over the rows (warp w: rows w,
// w + W, ...), and a lane keeps two steps of loads in registers: the next
// step's loads (the next row's, across a row's end) are issued before the
// current step's dots, so the loads keep flowing until the warp's last row.
// A warp takes its row's steps starting at step w0 % spr (its first row's
// index, modulo the steps a row), wrapping round: were every warp at the
// same step of its row, the warps' loads would sit a row's bytes apart
// (16 KiB at 8192 wide), and on the H200 that stride ran ~10% slower than
// the same bytes read contiguously (docs/decisions/0007-streaming-decode-matvecs.md).
// The first two steps (immutable weights) are loaded before PDL_ENTER,
// while the previous kernel finishes. FERROX_F16S_MINB: the blocks an SM
// the host sizes the grid for (the launch bound); F16S_STEP / F16S_GSTEP:
// 16-byte loads a step of a matrix in the matvec / the gate-up GLU.
#ifndef FERROX_F16S_MINB
#define FERROX_F16S_MINB 2
#endif
#ifndef F16S_STEP
#define F16S_STEP 8
#endif
#ifndef F16S_GSTEP
#define F16S_GSTEP 4
#endif
// FERROX_F16S_ROT: 0 takes every row's steps in order (for measuring).
#ifndef FERROX_F16S_ROT
#define FERROX_F16S_ROT 1
#endif

template <int S>
__device__ __forceinline__ void f16s_load(uint4 (&h)[S], const uint4* row, int n8, int u0) {
#pragma unroll
    for (int j = 0; j < S; j++) h[j] = ldw4(row + min(u0 + 32 * j, n8 - 1));
}

// The step's dots; loads past the row's end were clamped to its last unit,
// and their dots are dropped here.
template <int S>
__device__ __forceinline__ float f16s_dot(const uint4 (&h)[S], const float4* xt, int n8, int u0) {
    float a = 0.0f;
#pragma unroll
    for (int j = 0; j < S; j++) {
        int u = u0 + 32 * j;
        float d = dot8_f16(h[j], xt + 2 * min(u, n8 - 1));
        a += u < n8 ? d : 0.0f;
    }
    return a;
}

// The RMS norm before a projection, fused into its streaming matvec
// (`_norm` kernels: the norm's own launch and its round trip through
// memory gone). Each block writes x * w (the token's row, the norm's
// weights) into shared memory and takes 1 / rms(x) as the factor of every
// row's dot: rms(x)^-1 (x * w) . W_r = (x / rms(x) * w) . W_r. The weights
// are copied in before PDL_ENTER (immutable), the row after it.
__device__ __forceinline__ void norm_weights_in(const float* __restrict__ w, int cols, float4* xs) {
    const float4* w4 = (const float4*)w;
    for (int i = threadIdx.x; i < cols >> 2; i += blockDim.x) xs[i] = __ldg(w4 + i);
}
// xs *= x; returns 1 / rms(x). (block_sum's first barrier orders every
// thread's writes before any dot reads them.)
__device__ __forceinline__ float norm_row_in(const float* __restrict__ x, int cols, float eps, float4* xs) {
    __shared__ float red[32];
    const float4* x4 = (const float4*)x;
    float s = 0.0f;
#pragma unroll 4
    for (int i = threadIdx.x; i < cols >> 2; i += blockDim.x) {
        float4 v = x4[i], w = xs[i];
        s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        xs[i] = make_float4(v.x * w.x, v.y * w.y, v.z * w.z, v.w * w.w);
    }
    return rsqrtf(block_sum(s, red) / cols + eps);
}

// Up to three F16 matrices of one width over one input (`MmvqMats`, in
// one launch), blockIdx.y the token. NORM: the input is rms_norm(x) * nw
// (`norm_weights_in`; cols * 4 bytes of dynamic shared memory).
template <bool NORM, class Enter>
__device__ __forceinline__ void f16_stream_body(const MmvqMats& m, const float* __restrict__ x, int cols,
                                                const float* __restrict__ nw, float eps, Enter enter) {
    constexpr int S = F16S_STEP;
    extern __shared__ float4 xs[];
    int n8 = cols >> 3;
    const float* xr = x + (size_t)blockIdx.y * cols;
    const float4* xt = NORM ? xs : (const float4*)xr;
    mats_stream<S, FERROX_F16S_ROT != 0, uint4>(
        m, n8, [&](uint4(&w)[S], const u8* row, int u0) { f16s_load(w, (const uint4*)row, n8, u0); },
        [&](const uint4(&w)[S], int u0) { return f16s_dot(w, xt, n8, u0); },
        [&] {
            if (NORM) norm_weights_in(nw, cols, xs);
            enter();
            return NORM ? norm_row_in(xr, cols, eps, xs) : 1.0f;
        });
}

extern "C" __global__ void __launch_bounds__(256, FERROX_F16S_MINB) matvec_f16_stream(
    MmvqMats m, const float* __restrict__ x, int cols) {
    f16_stream_body<false>(m, x, cols, 0, 0.0f, [] { PDL_ENTER(); });
}

extern "C" __global__ void __launch_bounds__(256, FERROX_F16S_MINB) matvec_f16_norm_stream(
    MmvqMats m, const float* __restrict__ x, int cols, const float* __restrict__ nw, float eps) {
    f16_stream_body<true>(m, x, cols, nw, eps, [] { PDL_ENTER(); });
}

// The gate and up matvecs and the GLU after them (`matvec_f16_glu`'s
// arguments less `lpr`), streamed as `matvec_f16_stream`: a step is
// F16S_GSTEP loads of each matrix. NORM as there.
template <bool NORM, class Enter>
__device__ __forceinline__ void f16_glu_body(const u8* __restrict__ wg, const u8* __restrict__ wu,
                                             long long row_bytes, int rows, const float* __restrict__ x,
                                             int cols, int act, float* __restrict__ h,
                                             const float* __restrict__ nw, float eps, Enter enter) {
    constexpr int S = F16S_GSTEP;
    extern __shared__ float4 xs[];
    int lane = threadIdx.x & 31;
    int nw_ = gridDim.x * (blockDim.x >> 5);
    int w0 = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int t = blockIdx.y;
    int n8 = cols >> 3, spr = (n8 + 32 * S - 1) / (32 * S);
    int ns = w0 < rows ? ((rows - 1 - w0) / nw_ + 1) * spr : 0;
    int rot = FERROX_F16S_ROT ? w0 % spr : 0;
    auto off = [&](int s, int* u0) {
        int i = s / spr, st = s - i * spr + rot;
        *u0 = lane + (st < spr ? st : st - spr) * 32 * S;
        return (size_t)(w0 + i * nw_) * row_bytes;
    };
    float sc = 1.0f;
    auto finish = [&](int s, float ag, float au) {
        ag = warp_sum(ag) * sc;
        au = warp_sum(au) * sc;
        if (lane == 0) h[(size_t)t * rows + w0 + (s / spr) * nw_] = (act == 0 ? silu(ag) : gelu_tanh(ag)) * au;
    };
    uint4 ga[S], ua_[S], gb[S], ub_[S];
    int ua = 0, ub = 0;
    size_t o;
    if (ns > 0) {
        o = off(0, &ua);
        f16s_load(ga, (const uint4*)(wg + o), n8, ua);
        f16s_load(ua_, (const uint4*)(wu + o), n8, ua);
    }
    if (ns > 1) {
        o = off(1, &ub);
        f16s_load(gb, (const uint4*)(wg + o), n8, ub);
        f16s_load(ub_, (const uint4*)(wu + o), n8, ub);
    }
    const float* xr = x + (size_t)t * cols;
    if (NORM) norm_weights_in(nw, cols, xs);
    enter();
    if (NORM) sc = norm_row_in(xr, cols, eps, xs);
    const float4* xt = NORM ? xs : (const float4*)xr;
    float ag = 0.0f, au = 0.0f;
    for (int s = 0; s < ns; s += 2) {
        ag += f16s_dot(ga, xt, n8, ua);
        au += f16s_dot(ua_, xt, n8, ua);
        if (s % spr == spr - 1) {
            finish(s, ag, au);
            ag = au = 0.0f;
        }
        if (s + 2 < ns) {
            o = off(s + 2, &ua);
            f16s_load(ga, (const uint4*)(wg + o), n8, ua);
            f16s_load(ua_, (const uint4*)(wu + o), n8, ua);
        }
        if (s + 1 < ns) {
            ag += f16s_dot(gb, xt, n8, ub);
            au += f16s_dot(ub_, xt, n8, ub);
            if ((s + 1) % spr == spr - 1) {
                finish(s + 1, ag, au);
                ag = au = 0.0f;
            }
            if (s + 3 < ns) {
                o = off(s + 3, &ub);
                f16s_load(gb, (const uint4*)(wg + o), n8, ub);
                f16s_load(ub_, (const uint4*)(wu + o), n8, ub);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(256, FERROX_F16S_MINB) matvec_f16_glu_stream(
    const u8* __restrict__ wg, const u8* __restrict__ wu, long long row_bytes, int rows,
    const float* __restrict__ x, int cols, int act, float* __restrict__ h) {
    f16_glu_body<false>(wg, wu, row_bytes, rows, x, cols, act, h, 0, 0.0f, [] { PDL_ENTER(); });
}

extern "C" __global__ void __launch_bounds__(256, FERROX_F16S_MINB) matvec_f16_glu_norm_stream(
    const u8* __restrict__ wg, const u8* __restrict__ wu, long long row_bytes, int rows,
    const float* __restrict__ x, int cols, int act, float* __restrict__ h, const float* __restrict__ nw,
    float eps) {
    f16_glu_body<true>(wg, wu, row_bytes, rows, x, cols, act, h, nw, eps, [] { PDL_ENTER(); });
}

// Index of the largest value of each row (ties: the lowest index; NaN and
// minus infinity never win; 0 when nothing beats minus infinity: the host
// twin `backend::argmax`). A vocabulary-wide row is one block's 500 KB of
// serial round trips, so blocks (blockIdx.x) take ARGMAX_SPAN-wide slices of
// a row (blockIdx.y): each leaves its best as one u64 key (argmax_key: the
// largest key is the largest value, then the lowest index), and the last of
// a row's blocks to finish (`cnt`, zero between launches: it resets it)
// reduces the row's keys.
#define ARGMAX_SPAN 2048
__device__ __forceinline__ unsigned long long argmax_key(float v, int i) {
    if (!(v > -INF_F)) return 0ull;
    unsigned u = v == 0.0f ? 0u : __float_as_uint(v);  // -0 ties +0, as on the host
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)u << 32) | (unsigned)~i;
}

__device__ __forceinline__ unsigned long long block_max_u64(unsigned long long k, unsigned long long* red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) k = max(k, __shfl_xor_sync(0xffffffffu, k, o));
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) red[warp] = k;
    __syncthreads();
    k = 0ull;
    for (int w = 0; w < (int)(blockDim.x >> 5); w++) k = max(k, red[w]);
    return k;
}

extern "C" __global__ void __launch_bounds__(256) argmax_rows(const float* x, int width, u32* out,
                                                               unsigned long long* keys, u32* cnt) {
    PDL_ENTER();
    __shared__ unsigned long long red[8];
    __shared__ bool last;
    const float* r = x + (size_t)blockIdx.y * width;
    int i0 = blockIdx.x * ARGMAX_SPAN + threadIdx.x;
    constexpr int U = ARGMAX_SPAN / 256;
    float v[U];
#pragma unroll
    for (int j = 0; j < U; j++) v[j] = i0 + 256 * j < width ? __ldcg(r + i0 + 256 * j) : -INF_F;
    unsigned long long k = 0ull;
#pragma unroll
    for (int j = 0; j < U; j++) k = max(k, argmax_key(v[j], i0 + 256 * j));
    k = block_max_u64(k, red);
    unsigned long long* row_keys = keys + (size_t)blockIdx.y * gridDim.x;
    if (threadIdx.x == 0) {
        row_keys[blockIdx.x] = k;
        __threadfence();
        last = atomicAdd(cnt + blockIdx.y, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    k = 0ull;
    for (int b = threadIdx.x; b < (int)gridDim.x; b += blockDim.x) k = max(k, __ldcg(row_keys + b));
    __syncthreads();  // red is reused
    k = block_max_u64(k, red);
    if (threadIdx.x == 0) {
        out[blockIdx.y] = k == 0ull ? 0u : ~(u32)k;
        cnt[blockIdx.y] = 0u;
    }
}

// ---- a top-k sampler's share of a logits row, on the device: the row's
// largest canonical logit (NaN as -inf, +inf as FLT_MAX, -0 as +0), its
// log-sum-exp, and its best k finite logits (by logit, then lower id), so
// k values a row cross the bus instead of the vocabulary. The host twin is
// ferrox-core's `TopRows::select`. A block a row; the k-th best key by a
// radix select (four passes of 8 bits over an order-preserving u32 key of
// the float), then one ordered pass that keeps every key above it and the
// lowest ids of those equal to it.

#define TOPK_THREADS 512

__device__ __forceinline__ float topk_canon(float v) {
    if (v != v) return -INF_F;
    if (v == INF_F) return 3.402823466e38f;
    return v + 0.0f;
}

// Larger float, larger key (-inf is never keyed: it is never a candidate).
__device__ __forceinline__ u32 topk_key(float v) {
    u32 u = __float_as_uint(v);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// x: rows x width; ids, vals: rows x k; stats: rows x 4 words (the
// candidates kept, max and log-sum-exp as float bits, unused).
extern "C" __global__ void __launch_bounds__(TOPK_THREADS) top_k_rows(const float* x, int width, int k, u32* ids,
                                                                      float* vals, u32* stats) {
    PDL_ENTER();
    __shared__ u32 hist[256];
    __shared__ float redf[32];
    __shared__ u32 redu[TOPK_THREADS / 32];
    __shared__ u32 s_pick[2];
    __shared__ u32 s_gt, s_eq;
    const float* r = x + (size_t)blockIdx.x * width;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float m = -INF_F, fin_f = 0.0f;
    for (int i = tid; i < width; i += TOPK_THREADS) {
        float v = topk_canon(__ldcg(r + i));
        m = fmaxf(m, v);
        fin_f += v != -INF_F;
    }
    m = block_max(m, redf);
    // (a count in floats: exact, the host keeps width below 2^24)
    u32 fin = (u32)block_sum(fin_f, redf);
    float sum = 0.0f;
    if (m != -INF_F)
        for (int i = tid; i < width; i += TOPK_THREADS) sum += expf(topk_canon(__ldcg(r + i)) - m);
    sum = block_sum(sum, redf);
    float lse = m == -INF_F ? -INF_F : m + logf(sum);
    u32 kk = min((u32)k, fin);
    // The kk-th best key, a byte at a time from the top: `prefix` the bytes
    // found, `rem` how many keys equal to it so far are still to be taken.
    u32 prefix = 0u, mask = 0u, rem = kk;
    for (int shift = 24; shift >= 0 && kk > 0; shift -= 8) {
        for (int b = tid; b < 256; b += TOPK_THREADS) hist[b] = 0u;
        __syncthreads();
        for (int base = 0; base < width; base += TOPK_THREADS) {
            int i = base + tid;
            float v = i < width ? topk_canon(__ldcg(r + i)) : -INF_F;
            u32 key = topk_key(v);
            bool in = v != -INF_F && (key & mask) == prefix;
            u32 bin = in ? (key >> shift) & 255u : 256u;
            // One shared atomic per distinct byte a warp holds: the top
            // bytes of a row's keys are nearly all the same.
            u32 peers = __match_any_sync(0xffffffffu, bin);
            if (in && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
        }
        __syncthreads();
        if (tid == 0) {
            int b = 255;
            for (; b > 0 && hist[b] < rem; b--) rem -= hist[b];
            s_pick[0] = prefix | ((u32)b << shift);
            s_pick[1] = rem;
        }
        __syncthreads();
        prefix = s_pick[0];
        rem = s_pick[1];
        mask |= 255u << shift;
    }
    // Keys above the kk-th: all kept, in any order, first; keys equal to it:
    // the `rem` lowest ids after them.
    u32 gt_total = kk - rem;
    if (tid == 0) s_gt = s_eq = 0u;
    __syncthreads();
    u32* out_ids = ids + (size_t)blockIdx.x * k;
    float* out_vals = vals + (size_t)blockIdx.x * k;
    for (int base = 0; base < width && kk > 0; base += TOPK_THREADS) {
        int i = base + tid;
        float v = i < width ? topk_canon(__ldcg(r + i)) : -INF_F;
        u32 key = topk_key(v);
        bool fin_v = v != -INF_F;
        if (fin_v && key > prefix) {
            u32 at = atomicAdd(&s_gt, 1u);
            out_ids[at] = (u32)i;
            out_vals[at] = v;
        }
        bool eq = fin_v && key == prefix;
        u32 ballot = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) redu[warp] = __popc(ballot);
        __syncthreads();
        u32 before = s_eq;
        for (int w = 0; w < warp; w++) before += redu[w];
        before += __popc(ballot & ((1u << lane) - 1u));
        if (eq && before < rem) {
            out_ids[gt_total + before] = (u32)i;
            out_vals[gt_total + before] = v;
        }
        __syncthreads();
        if (tid == 0) {
            u32 t = 0u;
            for (int w = 0; w < TOPK_THREADS / 32; w++) t += redu[w];
            s_eq += t;
        }
        __syncthreads();
    }
    if (tid == 0) {
        u32* st = stats + (size_t)blockIdx.x * 4;
        st[0] = kk;
        st[1] = __float_as_uint(m);
        st[2] = __float_as_uint(lse);
        st[3] = 0u;
    }
}

// ---- element-wise and row operations on f32 activations.

extern "C" __global__ void f32_to_f16(const float* x, u16* y, long long n) { PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = f2h(x[i]);
}

// One block per row, in place: x = x / rms(x) * w.
extern "C" __global__ void rms_norm(float* x, const float* w, int width, float eps) { PDL_ENTER();
    __shared__ float red[32];
    float* r = x + (size_t)blockIdx.x * width;
    float s = 0.0f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) s += r[i] * r[i];
    s = block_sum(s, red);
    float scale = rsqrtf(s / width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) r[i] = r[i] * scale * w[i];
}

// One block per row: x += b (when b is given, written back), then
// out = x / rms(x) * w. Out of place, so the residual stream stays intact.
// When `qs` is given (width % 32 == 0), `out` is also quantized into the
// q8 buffer the decode matvecs read (`quant_lane`). Every load of a row is
// issued before the first store (the pointers are restrict: the 8 values a
// thread keeps are read in one round trip, not eight).
#define NORM_KEEP 8
extern "C" __global__ void add_rms_norm(float* __restrict__ x, const float* __restrict__ b,
                                        const float* __restrict__ w, float* __restrict__ out,
                                        int width, float eps, i8* __restrict__ qs,
                                        float2* __restrict__ ds) {
    __shared__ float red[32];
    float* r = x + (size_t)blockIdx.x * width;
    const float* br = b ? b + (size_t)blockIdx.x * width : 0;
    float* o = out + (size_t)blockIdx.x * width;
    // The first NORM_KEEP values of each thread stay in registers between
    // the two passes; wider rows re-read the rest. The norm's weights are
    // read before PDL_ENTER (immutable): their DRAM round trip overlaps
    // the previous kernel.
    float keep[NORM_KEEP], add[NORM_KEEP], wk[NORM_KEEP];
#pragma unroll
    for (int k = 0; k < NORM_KEEP; k++) {
        int i = threadIdx.x + k * blockDim.x;
        wk[k] = i < width ? __ldg(w + i) : 0.0f;
    }
    PDL_ENTER();
#pragma unroll
    for (int k = 0; k < NORM_KEEP; k++) {
        int i = threadIdx.x + k * blockDim.x;
        keep[k] = i < width ? r[i] : 0.0f;
        add[k] = (br && i < width) ? br[i] : 0.0f;
    }
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < NORM_KEEP; k++) {
        keep[k] += add[k];
        s += keep[k] * keep[k];
    }
    if (br) {
#pragma unroll
        for (int k = 0; k < NORM_KEEP; k++) {
            int i = threadIdx.x + k * blockDim.x;
            if (i < width) r[i] = keep[k];
        }
    }
    for (int i = threadIdx.x + NORM_KEEP * blockDim.x; i < width; i += blockDim.x) {
        float v = r[i];
        if (br) {
            v += br[i];
            r[i] = v;
        }
        s += v * v;
    }
    s = block_sum(s, red);
    float scale = rsqrtf(s / width + eps);
    i8* qr = qs ? qs + (size_t)blockIdx.x * width : 0;
    float2* dr = qs ? ds + (size_t)blockIdx.x * (width >> 5) : 0;
#pragma unroll
    for (int k = 0; k < NORM_KEEP; k++) {
        int i = threadIdx.x + k * blockDim.x;
        // Whole warps are in or out of the row (width % 32 == 0 when qs).
        if (i - (threadIdx.x & 31) < width) {
            float v = i < width ? keep[k] * scale * wk[k] : 0.0f;
            if (i < width) o[i] = v;
            if (qr) quant_lane(v, i, qr, dr);
        }
    }
    for (int i = threadIdx.x + NORM_KEEP * blockDim.x; i - (int)(threadIdx.x & 31) < width; i += blockDim.x) {
        float v = i < width ? r[i] * scale * w[i] : 0.0f;
        if (i < width) o[i] = v;
        if (qr) quant_lane(v, i, qr, dr);
    }
}

// One thread per (token, head, rotated pair). `halves` pairs i with
// i + n_rot/2 (NeoX); otherwise 2i with 2i+1. `factors` may be null.
// blockIdx.y == 1 rotates a second buffer (`x2`, `n_heads2` heads) with the
// same positions: queries and keys in one launch.
extern "C" __global__ void rope(float* x, const u32* pos, int n_tok, int n_heads, int head_dim,
                                int n_rot, int halves, float base, float freq_scale,
                                float attn_factor, const float* factors, float* x2, int n_heads2) { PDL_ENTER();
    if (blockIdx.y == 1) {
        x = x2;
        n_heads = n_heads2;
    }
    int half_rot = n_rot / 2;
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long total = (long long)n_tok * n_heads * half_rot;
    if (idx >= total) return;
    int i = idx % half_rot;
    int h = (idx / half_rot) % n_heads;
    int t = idx / ((long long)half_rot * n_heads);
    float c, s;
    rope_cs(pos[t], i, n_rot, base, freq_scale, attn_factor, factors, &c, &s);
    float* hp = x + ((size_t)t * n_heads + h) * head_dim;
    int a = halves ? i : 2 * i;
    int b = halves ? i + half_rot : 2 * i + 1;
    float x0 = hp[a], x1 = hp[b];
    hp[a] = x0 * c - x1 * s;
    hp[b] = x0 * s + x1 * c;
}

// RoPE of a layer's queries and keys and the store of its keys and values
// into the f16 cache, in one launch (the attention kernel then reads the
// cache): blockIdx.y 0 rotates q; 1 rotates k a pair of elements a thread
// (pairs past n_rot / 2 are the unrotated tail, copied) and stores the
// head into the cache; 2 stores v. head_dim is even.
extern "C" __global__ void rope_kv(float* q, float* k, const float* v, const u32* seq, const u32* pos,
                                   int n_tok, int n_heads, int n_heads_k, int head_dim, int n_rot,
                                   int halves, float base, float freq_scale, float attn_factor,
                                   const float* factors, u16* kcache, u16* vcache, int vdim,
                                   int n_ctx) { PDL_ENTER();
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    int half_rot = n_rot / 2;
    if (blockIdx.y == 2) {
        if (idx >= (long long)n_tok * vdim) return;
        int t = idx / vdim, i = idx % vdim;
        size_t at = (size_t)seq[t] * n_ctx + pos[t];
        vcache[at * vdim + i] = f2h(v[idx]);
        return;
    }
    bool keys = blockIdx.y == 1;
    int heads = keys ? n_heads_k : n_heads;
    int pairs = keys ? head_dim / 2 : half_rot;
    if (idx >= (long long)n_tok * heads * pairs) return;
    int i = idx % pairs;
    int h = (idx / pairs) % heads;
    int t = idx / ((long long)pairs * heads);
    float* hp = (keys ? k : q) + ((size_t)t * heads + h) * head_dim;
    int a, b;
    float y0, y1;
    if (i < half_rot) {
        float c, s;
        rope_cs(pos[t], i, n_rot, base, freq_scale, attn_factor, factors, &c, &s);
        a = halves ? i : 2 * i;
        b = halves ? i + half_rot : 2 * i + 1;
        float x0 = hp[a], x1 = hp[b];
        y0 = x0 * c - x1 * s;
        y1 = x0 * s + x1 * c;
        hp[a] = y0;
        hp[b] = y1;
    } else {
        a = n_rot + 2 * (i - half_rot);
        b = a + 1;
        y0 = hp[a];
        y1 = hp[b];
    }
    if (keys) {
        int kdim = n_heads_k * head_dim;
        u16* kc = kcache + ((size_t)seq[t] * n_ctx + pos[t]) * kdim + (size_t)h * head_dim;
        kc[a] = f2h(y0);
        kc[b] = f2h(y1);
    }
}

// Writes each token's k/v rows into its (slot, position) of the f16 cache.
// Keys (blockIdx.z == 0) and values (1) in one launch.
extern "C" __global__ void kv_store(const float* ksrc, u16* kcache, int kdim, const float* vsrc,
                                    u16* vcache, int vdim, const u32* seq, const u32* pos,
                                    int n_ctx) { PDL_ENTER();
    int t = blockIdx.y;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    const float* src = blockIdx.z ? vsrc : ksrc;
    u16* cache = blockIdx.z ? vcache : kcache;
    int dim = blockIdx.z ? vdim : kdim;
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
                                     int window, i8* qs, float2* ds) { PDL_ENTER();
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

// Attention with the query heads of one KV head together: one block per
// (token, KV head), 256 threads. Scores: a thread per key of a 256-key chunk,
// all the group's heads at once (16-byte key loads, queries broadcast from
// shared memory, no shuffles). Softmax: a warp per head (one barrier a
// chunk, not two per head). Values, when group * head_dim_v <= 512 and
// head_dim_v % 32 == 0 (`GA_FAST`): a warp per key (warp w takes keys w,
// w + 8, ...), a lane per value dim for every head of the group, partial
// sums kept in registers across chunks and added across warps once at the
// end; otherwise a thread per (head, value dim) looping over the chunk's
// keys. Online softmax across chunks. Needs head_dim % 8 == 0, group <= 8,
// group * head_dim <= 2048 and group * head_dim_v <= 2048 (the host falls
// back to `attention` otherwise).
#define GA_THREADS 256
#define GA_MAXG 8
#define GA_ACC 8
#define GA_FAST 512
// Most runs a split decode-attention token has (a warp's lanes merge them).
#define DEC_MAXSPLIT 32
// The grouped kernels' phases (`attention_gqa`, `attention_dec`), each
// over a chunk of keys whose rows are at generic addresses (the cache in
// global memory, or a copy staged in shared memory).
//
// Scores of one key (`kr`: its row, 16-byte aligned) against the group's G
// queries (`sq`: [G][hd] in shared memory): spc[g * stride] = the scaled,
// softcapped q_g . k.
__device__ __forceinline__ void ga_scores(const uint4* kr, const float* sq, int G, int hd, float scale,
                                          float softcap, float* spc, int stride) {
    float d[GA_MAXG];
#pragma unroll
    for (int g = 0; g < GA_MAXG; g++) d[g] = 0.0f;
#pragma unroll 4
    for (int i = 0; i < hd; i += 8) {
        uint4 kk = kr[i >> 3];
        float k8[8] = {h2f((u16)kk.x), h2f((u16)(kk.x >> 16)), h2f((u16)kk.y), h2f((u16)(kk.y >> 16)),
                       h2f((u16)kk.z), h2f((u16)(kk.z >> 16)), h2f((u16)kk.w), h2f((u16)(kk.w >> 16))};
#pragma unroll
        for (int g = 0; g < GA_MAXG; g++) {
            if (g < G) {
                const float* qg = sq + g * hd + i;
#pragma unroll
                for (int e = 0; e < 8; e++) d[g] += qg[e] * k8[e];
            }
        }
    }
#pragma unroll
    for (int g = 0; g < GA_MAXG; g++) {
        if (g < G) {
            float sc = d[g] * scale;
            if (softcap > 0.0f) sc = softcap * tanhf(sc / softcap);
            spc[g * stride] = sc;
        }
    }
}

// A warp per head: the chunk's max, the exponentials (in place in `sp`,
// [G][stride]), their sum; the online-softmax state (max, sum, this chunk's
// correction) per head in shared memory. Warps >= G do nothing.
__device__ __forceinline__ void ga_softmax(float* sp, int stride, int nc, int G, float* sm_m, float* sm_l,
                                           float* sm_corr) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (warp >= G) return;
    float* pg = sp + warp * stride;
    float cm = -INF_F;
    for (int j = lane; j < nc; j += 32) cm = fmaxf(cm, pg[j]);
    cm = warp_max(cm);
    float mo = sm_m[warp];
    float mn = fmaxf(mo, cm);
    float cs = 0.0f;
    for (int j = lane; j < nc; j += 32) {
        float e = expf(pg[j] - mn);
        pg[j] = e;
        cs += e;
    }
    cs = warp_sum(cs);
    if (lane == 0) {
        float corr = expf(mo - mn);
        sm_corr[warp] = corr;
        sm_l[warp] = sm_l[warp] * corr + cs;
        sm_m[warp] = mn;
    }
}

// The fast value path: acc[g * 4 + i] (head g, value dim i * 32 + lane)
// rescaled by the chunk's corrections, then a warp per key (keys warp,
// warp + 8, ...) adds p_gj * v_j; `v0` is key 0's row plus the lane,
// `vstride` halves between keys.
__device__ __forceinline__ void ga_values(const u16* v0, size_t vstride, const float* sp, int stride, int nc,
                                          int G, int nd, const float* sm_corr, float* acc) {
    int warp = threadIdx.x >> 5;
#pragma unroll
    for (int g = 0; g < GA_MAXG; g++) {
        if (g < G) {
            float corr = sm_corr[g];
#pragma unroll
            for (int i = 0; i < 4; i++) acc[g * 4 + i] *= corr;
        }
    }
#pragma unroll 2
    for (int j = warp; j < nc; j += GA_THREADS / 32) {
        const u16* vr = v0 + (size_t)j * vstride;
        float vv[4];
#pragma unroll
        for (int i = 0; i < 4; i++) vv[i] = i < nd ? h2f(vr[i * 32]) : 0.0f;
#pragma unroll
        for (int g = 0; g < GA_MAXG; g++) {
            if (g < G) {
                float pj = sp[g * stride + j];
#pragma unroll
                for (int i = 0; i < 4; i++) acc[g * 4 + i] += pj * vv[i];
            }
        }
    }
}

// The fast path's end: each warp's partial sums through shared memory
// (`part`, 8 warps x G x hdv), a thread per output adds the 8, divides by
// the head's sum and writes it (token t, KV head kvh), with its q8 copy when
// `qs` is given (G * hdv % 32 == 0: whole warps stay in the loop, a warp's
// 32 outputs one q8 unit). Every thread of the block must call it.
__device__ __forceinline__ void ga_finish(const float* acc, float* part, int G, int hdv, int nd,
                                          const float* sm_l, float* out, int t, int n_head, int kvh,
                                          i8* qs, float2* ds) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int g = 0; g < GA_MAXG; g++) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (g < G && i < nd) part[(warp * G + g) * hdv + i * 32 + lane] = acc[g * 4 + i];
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * hdv; idx += GA_THREADS) {
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < GA_THREADS / 32; w++) a += part[w * G * hdv + idx];
        int g = idx / hdv;
        long long o = ((long long)t * n_head + (long long)kvh * G) * hdv + idx;
        float v = a / sm_l[g];
        out[o] = v;
        if (qs) quant_lane(v, o, qs, ds);
    }
}

extern "C" __global__ void attention_gqa(const float* q, const u16* kc, const u16* vc, float* out,
                                         const u32* seq, const u32* pos, int n_head, int n_head_kv,
                                         int hd, int hdv, int n_ctx, float scale, float softcap,
                                         int window, i8* qs, float2* ds) { PDL_ENTER();
    extern __shared__ float gsm[];
    __shared__ float sm_m[GA_MAXG], sm_l[GA_MAXG], sm_corr[GA_MAXG];
    int G = n_head / n_head_kv;
    float* sq = gsm;                // G * hd
    float* sp = gsm + G * hd;       // G * GA_THREADS
    float* part = sp + G * GA_THREADS;  // 8 warps * G * hdv (fast path)
    int t = blockIdx.x / n_head_kv, kvh = blockIdx.x % n_head_kv;
    int s = seq[t], p = pos[t];
    int lo = window > 0 ? max(0, p + 1 - window) : 0;
    int tid = threadIdx.x, lane = tid & 31;
    bool fast = G * hdv <= GA_FAST && (hdv & 31) == 0 && hdv <= 128;
    int nd = hdv >> 5;  // value dims a lane takes per head (fast path), <= 4
    const float* qh = q + ((size_t)t * n_head + (size_t)kvh * G) * hd;
    for (int i = tid; i < G * hd; i += blockDim.x) sq[i] = qh[i];
    if (tid < G) {
        sm_m[tid] = -INF_F;
        sm_l[tid] = 0.0f;
    }
    __syncthreads();
    size_t kd = (size_t)n_head_kv * hd, vd = (size_t)n_head_kv * hdv;
    const u16* kb = kc + (size_t)s * n_ctx * kd + (size_t)kvh * hd;
    const u16* vb = vc + (size_t)s * n_ctx * vd + (size_t)kvh * hdv;
    // Fast path: acc[g * 4 + i] is head g, value dim i * 32 + lane.
    // Slow path: acc[k] is element tid + k * GA_THREADS of [G, hdv].
    float acc[GA_MAXG * 4];
#pragma unroll
    for (int k = 0; k < GA_MAXG * 4; k++) acc[k] = 0.0f;
    for (int c0 = lo; c0 <= p; c0 += GA_THREADS) {
        int nc = min(GA_THREADS, p + 1 - c0);
        if (tid < nc)
            ga_scores((const uint4*)(kb + (size_t)(c0 + tid) * kd), sq, G, hd, scale, softcap, sp + tid, GA_THREADS);
        __syncthreads();
        ga_softmax(sp, GA_THREADS, nc, G, sm_m, sm_l, sm_corr);
        __syncthreads();
        if (fast) {
            ga_values(vb + (size_t)c0 * vd + lane, vd, sp, GA_THREADS, nc, G, nd, sm_corr, acc);
        } else {
#pragma unroll
            for (int k = 0; k < GA_ACC; k++) {
                int idx = tid + k * GA_THREADS;
                if (idx < G * hdv) {
                    int g = idx / hdv, dd = idx - g * hdv;
                    const float* pg = sp + g * GA_THREADS;
                    const u16* vcol = vb + dd + (size_t)c0 * vd;
                    float a = acc[k] * sm_corr[g];
#pragma unroll 8
                    for (int j = 0; j < nc; j++) a += pg[j] * h2f(vcol[(size_t)j * vd]);
                    acc[k] = a;
                }
            }
        }
        __syncthreads();
    }
    if (fast) {
        ga_finish(acc, part, G, hdv, nd, sm_l, out, t, n_head, kvh, qs, ds);
        return;
    }
#pragma unroll
    for (int k = 0; k < GA_ACC; k++) {
        int idx = tid + k * GA_THREADS;
        if (idx < G * hdv) {
            int g = idx / hdv, dd = idx - g * hdv;
            out[((size_t)t * n_head + (size_t)kvh * G + g) * hdv + dd] = acc[k] / sm_l[g];
        }
    }
}

// 16 bytes global -> shared without passing through registers (cp.async,
// sm_80+), in flight until `cp_async_wait`.
// (Before sm_80: a plain copy through registers, complete at once.)
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    u32 s;
    asm volatile("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(smem));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(gmem) : "memory");
#else
    *(uint4*)smem = *(const uint4*)gmem;
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
// Waits until at most one committed group is still in flight.
__device__ __forceinline__ void cp_async_wait1() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 1;" ::: "memory");
#endif
}

// Attention for decode batches (a few tokens, each its own block per KV
// head): the work is tiny, so the cost is the chain of memory round trips
// and barriers, not bandwidth. A chunk of `chunk` keys is staged in shared
// memory with every K and V load of the chunk issued at once (cp.async),
// the next chunk's loads issued before this chunk is computed (two stages).
// Then, all from shared memory: scores a thread per key (rows padded by 16
// bytes so the threads' 16-byte reads do not collide in banks), softmax a
// warp per head, values a warp per key with a lane per value dim (as
// `attention_gqa`'s fast path), and the q8 copy of the output for the
// output projection. A block takes `gs` query heads of one KV head (the
// whole group, or a divisor of it: each block then stages the keys itself).
// Same limits as that fast path, for the heads a block takes: group <= 8,
// head_dim % 8 == 0, head_dim_v % 32 == 0, head_dim_v <= 128,
// (heads a block) * head_dim_v <= 512 (a wider group is taken by blocks of
// a divisor of it); chunk <= 256. The host sizes the dynamic
// shared memory: 2 * chunk * (head_dim + 8 + head_dim_v) halves, then
// G * head_dim + G * chunk + 8 * G * head_dim_v floats.
// Long caches are split (flash-decoding): the grid holds `nsplit` runs per
// (token, head block), split index outermost. A token whose window holds
// ns >= 2 spans of `span` keys (ns <= nsplit, <= its chunks) has its
// chunks dealt out over ns runs, each writing its softmax max, sum and
// unnormalized values to `runs` ([token][head][nsplit][head_dim_v + 2]
// floats); the last run to finish (the u32 counter `cnt[token * head
// blocks + block]`, zero between launches) merges them. Runs past a
// token's ns return at once; so one graph serves every position. A split
// token's block takes `gss` heads (the whole group by default: the keys
// are then read once, and the splits give the parallelism that a block
// per head gives an unsplit token); nsplit <= DEC_MAXSPLIT.
// Blocks an SM the compiler must fit attention_dec's registers for
// (measuring knob; its shared memory allows two at the default chunk).
#ifndef FERROX_DEC_MINB
#define FERROX_DEC_MINB 1
#endif
extern "C" __global__ void __launch_bounds__(GA_THREADS, FERROX_DEC_MINB) attention_dec(
    const float* q, const u16* kc, const u16* vc, float* out, const u32* seq, const u32* pos,
    int n_head, int n_head_kv, int hd, int hdv, int n_ctx, float scale, float softcap, int window,
    int chunk, i8* qs, float2* ds, int gs, int nsplit, int span, float* runs, u32* cnt, int gss) {
    extern __shared__ uint4 dsm4[];
    __shared__ float sm_m[GA_MAXG], sm_l[GA_MAXG], sm_corr[GA_MAXG];
    __shared__ float sm_w[GA_MAXG][DEC_MAXSPLIT];
    __shared__ int sm_last;
    // A block takes G query heads: gs for an unsplit token (the KV head's
    // group, or a divisor of it: FERROX_CUDA_DEC_HEADS), gss for a split
    // one (a multiple of gs: FERROX_CUDA_DEC_SPLIT_HEADS). Block b serves
    // token t = b % n as its r-th block, r = spl * (n_head / G) + head
    // block: a token's working blocks come first, the rest (up to the
    // grid's n * max(n_head / gss * nsplit, n_head / gs)) return at once.
    int kst = hd + 8;                       // halves per staged key row
    u16* ks = (u16*)dsm4;                   // [2][chunk][kst]
    u16* vs = ks + 2 * chunk * kst;         // [2][chunk][hdv]
    int n = gridDim.x / max(n_head / gss * nsplit, n_head / gs);
    int t = blockIdx.x % n, r = blockIdx.x / n;
    int tid = threadIdx.x, lane = tid & 31;
    // The slot and position lists are written by a copy before the pass's
    // first kernel, never by a kernel, and a kernel starts only once the
    // one before its predecessor has finished (PDL_ENTER waits, then lets
    // the next start): they may be read before the wait.
    int s = seq[t], p = pos[t];
    int lo = window > 0 ? max(0, p + 1 - window) : 0;
    // The token's runs: one per `span` keys, at most `nsplit`, at most one
    // per chunk; its chunks dealt out evenly, run spl taking keys [lo, e).
    int keys = p + 1 - lo, nch = (keys + chunk - 1) / chunk;
    int ns = max(1, min(min(nsplit, keys / span), nch));
    int G = ns > 1 ? gss : gs, hbs = n_head / G;
    if (r >= hbs * ns) return;
    int spl = r / hbs, hb = r - spl * hbs, h0 = hb * G;
    int kvh = h0 / (n_head / n_head_kv);
    int bi = t * hbs + hb;  // (split tokens: their counter)
    PDL_ENTER();
    float* sq = (float*)(vs + 2 * chunk * hdv);  // [G][hd]
    float* sp = sq + G * hd;                // [G][chunk]
    float* part = sp + G * chunk;           // [8 warps][G][hdv]
    int e = min(p + 1, lo + (spl + 1) * nch / ns * chunk);
    lo += spl * nch / ns * chunk;
    size_t kd = (size_t)n_head_kv * hd, vd = (size_t)n_head_kv * hdv;
    const u16* kb = kc + (size_t)s * n_ctx * kd + (size_t)kvh * hd;
    const u16* vb = vc + (size_t)s * n_ctx * vd + (size_t)kvh * hdv;
    int k16 = hd >> 3, v16 = hdv >> 3;  // 16-byte pieces a key / value row
    // Issue the loads of the chunk starting at key c0 into stage st (a
    // committed group, empty past the last key).
    auto stage = [&](int c0, int st) {
        int nc = min(chunk, e - c0);
        u16* kd_ = ks + st * chunk * kst;
        u16* vd_ = vs + st * chunk * hdv;
        for (int i = tid; i < nc * k16; i += GA_THREADS) {
            int j = i / k16, x = i - j * k16;
            cp_async16(kd_ + j * kst + x * 8, kb + (size_t)(c0 + j) * kd + x * 8);
        }
        for (int i = tid; i < nc * v16; i += GA_THREADS) {
            int j = i / v16, x = i - j * v16;
            cp_async16(vd_ + j * hdv + x * 8, vb + (size_t)(c0 + j) * vd + x * 8);
        }
        cp_async_commit();
    };
    stage(lo, 0);
    if (lo + chunk < e) stage(lo + chunk, 1);
    else cp_async_commit();
    const float* qh = q + ((size_t)t * n_head + (size_t)h0) * hd;
    for (int i = tid; i < G * hd; i += GA_THREADS) sq[i] = qh[i];
    if (tid < G) {
        sm_m[tid] = -INF_F;
        sm_l[tid] = 0.0f;
    }
    int nd = hdv >> 5;  // value dims a lane takes per head, <= 4
    float acc[GA_MAXG * 4];  // acc[g * 4 + i]: head g, value dim i * 32 + lane
#pragma unroll
    for (int k = 0; k < GA_MAXG * 4; k++) acc[k] = 0.0f;
    for (int c0 = lo, st = 0; c0 < e; c0 += chunk, st ^= 1) {
        int nc = min(chunk, e - c0);
        cp_async_wait1();
        __syncthreads();
        if (tid < nc)
            ga_scores((const uint4*)(ks + (st * chunk + tid) * kst), sq, G, hd, scale, softcap, sp + tid, chunk);
        __syncthreads();
        ga_softmax(sp, chunk, nc, G, sm_m, sm_l, sm_corr);
        __syncthreads();
        ga_values(vs + st * chunk * hdv + lane, hdv, sp, chunk, nc, G, nd, sm_corr, acc);
        __syncthreads();  // stage st and the scores are free again
        if (c0 + 2 * chunk < e) stage(c0 + 2 * chunk, st);
        else cp_async_commit();
    }
    if (ns == 1) {
        // (ga_finish writes heads kvh' * G ..: with kvh' = h0 / gs, h0 on.)
        ga_finish(acc, part, G, hdv, nd, sm_l, out, t, n_head, h0 / gs, qs, ds);
        return;
    }
    // Split: this run's max, sum and unnormalized values per head, to
    // runs[t][head][spl] = [m, l, v_0 .. v_hdv-1].
    int rs = hdv + 2;
#pragma unroll
    for (int g = 0; g < GA_MAXG; g++) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (g < G && i < nd) part[((tid >> 5) * G + g) * hdv + i * 32 + lane] = acc[g * 4 + i];
    }
    __syncthreads();
    for (int idx = tid; idx < G * hdv; idx += GA_THREADS) {
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < GA_THREADS / 32; w++) a += part[w * G * hdv + idx];
        int g = idx / hdv;
        runs[(((size_t)t * n_head + h0 + g) * nsplit + spl) * rs + 2 + idx - g * hdv] = a;
    }
    if (tid < G) {
        float* r = runs + (((size_t)t * n_head + h0 + tid) * nsplit + spl) * rs;
        r[0] = sm_m[tid];
        r[1] = sm_l[tid];
    }
    // The last run to finish merges them (the counter, zero between
    // launches, is reset by it).
    __threadfence();
    __syncthreads();
    if (tid == 0) sm_last = atomicAdd(cnt + bi, 1u) == (u32)(ns - 1);
    __syncthreads();
    if (!sm_last) return;
    __threadfence();
    // Each run's weight, a warp per head (a lane per run): exp(m_k - m) / l
    // with m the runs' max and l their sums so weighted.
    if ((tid >> 5) < G) {
        int g = tid >> 5;
        const float* r = runs + ((size_t)t * n_head + h0 + g) * nsplit * rs;
        float mk = lane < ns ? __ldcg(r + lane * rs) : -INF_F;
        float lk = lane < ns ? __ldcg(r + lane * rs + 1) : 0.0f;
        float m = warp_max(mk);
        float w = lane < ns ? expf(mk - m) : 0.0f;
        float l = warp_sum(lk * w);
        sm_w[g][lane] = w / l;
    }
    __syncthreads();
    // (G * hdv % 32 == 0: whole warps stay in the loop, as quant_lane needs.)
    for (int idx = tid; idx < G * hdv; idx += GA_THREADS) {
        int g = idx / hdv, d = idx - g * hdv;
        const float* r = runs + ((size_t)t * n_head + h0 + g) * nsplit * rs + 2 + d;
        float v = 0.0f;
#pragma unroll 8
        for (int k = 0; k < ns; k++) v += sm_w[g][k] * __ldcg(r + k * rs);
        long long o = ((long long)t * n_head + h0 + g) * hdv + d;
        out[o] = v;
        if (qs) quant_lane(v, o, qs, ds);
    }
    if (tid == 0) cnt[bi] = 0;
}

// ---- prefill attention on the tensor cores (mma.sync, sm_80+).

// Two floats as an f16x2 register (`lo` in the low half).
__device__ __forceinline__ u32 pack_h2(float lo, float hi) {
    u32 r;
    asm("{ .reg .f16 a, b; cvt.rn.f16.f32 a, %1; cvt.rn.f16.f32 b, %2; mov.b32 %0, {a, b}; }"
        : "=r"(r) : "f"(lo), "f"(hi));
    return r;
}

// Two floats as two f16x2 registers whose sum is them to ~2^-22: the
// rounded halves (`*hi`) and what rounding left (`*lo`). The tensor-core
// attention multiplies both, so its queries and probabilities keep f32
// precision (the keys and values are f16 in the cache already).
__device__ __forceinline__ void split_h2(float a, float b, u32* hi, u32* lo) {
    *hi = pack_h2(a, b);
    float ha, hb;
    asm("{ .reg .f16 x, y; mov.b32 {x, y}, %2; cvt.f32.f16 %0, x; cvt.f32.f16 %1, y; }"
        : "=f"(ha), "=f"(hb) : "r"(*hi));
    *lo = pack_h2(a - ha, b - hb);
}

// c += a * b for one 16x8x16 tile: a the row-major 16x16 f16 fragment
// (a[0]: row g, cols 2t..2t+1; a[1]: row g+8; a[2]/a[3]: cols + 8), b the
// 16x8 f16 fragment (b0: rows 2t..2t+1 of col g; b1: rows + 8), c the f32
// 16x8 (c[0..1]: row g, cols 2t..2t+1; c[2..3]: row g+8), with g = lane / 4
// and t = lane % 4.
__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ u32 lds32(const u16* p) { return *(const u32*)p; }

// Causal attention for a prefill batch whose tokens are all in one slot
// (the host checks), flash-attention style on the tensor cores: a block
// takes 64 queries of one head (a warp 16), walks the keys from the
// block's lowest window start to its highest position in tiles of 64,
// staged in shared memory as f16 (keys row-major, values transposed, rows
// padded by 16 bytes so the fragment reads do not collide in banks). Per
// tile a warp computes S = Q K^T (queries as f16 fragments kept in
// registers, each split in two so the product keeps f32 precision:
// `split_h2`), scales, softcaps and masks it, keeps the online softmax
// (row max over the quad, lane-partial sums added at the end) and adds
// P V with P taken straight from S's accumulators. head_dim % 16 == 0,
// head_dim_v % 8 == 0, both <= 128 (the host checks).
#define FA_Q 64
#define FA_KT 64
#define FA_MAXD 128
extern "C" __global__ void __launch_bounds__(128) attention_mma(
    const float* q, const u16* kc, const u16* vc, float* out, const u32* seq, const u32* pos,
    int n_tok, int n_head, int n_head_kv, int hd, int hdv, int n_ctx, float scale, float softcap,
    int window) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    extern __shared__ uint4 fsm4[];
    __shared__ int s_lo, s_hi;
    int kst = hd + 8, vst = FA_KT + 8;  // halves per staged key row / value dim
    u16* ks = (u16*)fsm4;               // [FA_KT][kst]
    u16* vt = ks + FA_KT * kst;         // [hdv][vst]
    int h = blockIdx.y, kvh = h / (n_head / n_head_kv);
    int q0 = blockIdx.x * FA_Q;
    int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int g = lane >> 2, tq = lane & 3;
    if (tid == 0) {
        s_lo = 0x7fffffff;
        s_hi = -1;
    }
    PDL_ENTER();
    int s = seq[q0];
    __syncthreads();
    if (tid < FA_Q && q0 + tid < n_tok) {
        int p = pos[q0 + tid];
        atomicMin(&s_lo, window > 0 ? max(0, p + 1 - window) : 0);
        atomicMax(&s_hi, p);
    }
    // This lane's two query rows (-1: a row past the batch, no keys).
    int ra = q0 + warp * 16 + g, rb = ra + 8;
    int pa = ra < n_tok ? (int)pos[ra] : -1, pb = rb < n_tok ? (int)pos[rb] : -1;
    int la = window > 0 ? pa + 1 - window : 0, lb = window > 0 ? pb + 1 - window : 0;
    int whi = max(pa, pb), wlo = min(pa >= 0 ? la : 0x7fffffff, pb >= 0 ? lb : 0x7fffffff);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        whi = max(whi, __shfl_xor_sync(0xffffffffu, whi, o));
        wlo = min(wlo, __shfl_xor_sync(0xffffffffu, wlo, o));
    }
    int nkk = hd >> 4, ndt = hdv >> 3;
    u32 qa[FA_MAXD / 16][4], ql[FA_MAXD / 16][4];  // the queries, split (`split_h2`)
    const float* qra = q + ((size_t)ra * n_head + h) * hd;
    const float* qrb = q + ((size_t)rb * n_head + h) * hd;
#pragma unroll
    for (int kk = 0; kk < FA_MAXD / 16; kk++) {
        if (kk < nkk) {
            int c = kk * 16 + 2 * tq;
            float2 x0 = pa >= 0 ? *(const float2*)(qra + c) : make_float2(0.f, 0.f);
            float2 x1 = pb >= 0 ? *(const float2*)(qrb + c) : make_float2(0.f, 0.f);
            float2 x2 = pa >= 0 ? *(const float2*)(qra + c + 8) : make_float2(0.f, 0.f);
            float2 x3 = pb >= 0 ? *(const float2*)(qrb + c + 8) : make_float2(0.f, 0.f);
            split_h2(x0.x, x0.y, &qa[kk][0], &ql[kk][0]);
            split_h2(x1.x, x1.y, &qa[kk][1], &ql[kk][1]);
            split_h2(x2.x, x2.y, &qa[kk][2], &ql[kk][2]);
            split_h2(x3.x, x3.y, &qa[kk][3], &ql[kk][3]);
        }
    }
    float oacc[FA_MAXD / 8][4];
#pragma unroll
    for (int d = 0; d < FA_MAXD / 8; d++) oacc[d][0] = oacc[d][1] = oacc[d][2] = oacc[d][3] = 0.0f;
    float ma = -INF_F, mb = -INF_F, lsa = 0.0f, lsb = 0.0f;
    __syncthreads();
    int klo = s_lo, khi = s_hi;
    size_t kd = (size_t)n_head_kv * hd, vd = (size_t)n_head_kv * hdv;
    const u16* kb = kc + (size_t)s * n_ctx * kd + (size_t)kvh * hd;
    const u16* vb = vc + (size_t)s * n_ctx * vd + (size_t)kvh * hdv;
    for (int kt = klo; kt <= khi; kt += FA_KT) {
        int nk = min(FA_KT, khi + 1 - kt);
        __syncthreads();  // the previous tile is consumed
        // Stage the tile: a thread per (key, 16-byte piece), keys fastest;
        // keys past the range are zeros (so 0 * value stays 0).
        for (int i = tid; i < FA_KT * (hd >> 3); i += 128) {
            int j = i & (FA_KT - 1), e = i / FA_KT;
            uint4 v = j < nk ? *(const uint4*)(kb + (size_t)(kt + j) * kd + e * 8) : make_uint4(0, 0, 0, 0);
            *(uint4*)(ks + j * kst + e * 8) = v;
        }
        for (int i = tid; i < FA_KT * (hdv >> 3); i += 128) {
            int j = i & (FA_KT - 1), e = i / FA_KT;
            uint4 v = j < nk ? *(const uint4*)(vb + (size_t)(kt + j) * vd + e * 8) : make_uint4(0, 0, 0, 0);
            u16* col = vt + (e * 8) * vst + j;
            col[0] = (u16)v.x; col[vst] = (u16)(v.x >> 16);
            col[2 * vst] = (u16)v.y; col[3 * vst] = (u16)(v.y >> 16);
            col[4 * vst] = (u16)v.z; col[5 * vst] = (u16)(v.z >> 16);
            col[6 * vst] = (u16)v.w; col[7 * vst] = (u16)(v.w >> 16);
        }
        __syncthreads();
        if (kt > whi || kt + nk - 1 < wlo) continue;  // no key of this tile for this warp
        float sc[FA_KT / 8][4];
#pragma unroll
        for (int nt = 0; nt < FA_KT / 8; nt++) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            const u16* kr = ks + (nt * 8 + g) * kst + 2 * tq;
#pragma unroll
            for (int kk = 0; kk < FA_MAXD / 16; kk++) {
                if (kk < nkk) {
                    u32 b0 = lds32(kr + kk * 16), b1 = lds32(kr + kk * 16 + 8);
                    mma16816(sc[nt], qa[kk], b0, b1);
                    mma16816(sc[nt], ql[kk], b0, b1);
                }
            }
        }
        // Scale, softcap, mask; the rows' new maxima.
        float mxa = -INF_F, mxb = -INF_F;
#pragma unroll
        for (int nt = 0; nt < FA_KT / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int j = kt + nt * 8 + 2 * tq + (e & 1);
                int p = e < 2 ? pa : pb, lo = e < 2 ? la : lb;
                float v = sc[nt][e] * scale;
                if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
                if (j > p || j < lo) v = -INF_F;
                sc[nt][e] = v;
                if (e < 2) mxa = fmaxf(mxa, v);
                else mxb = fmaxf(mxb, v);
            }
        }
#pragma unroll
        for (int o = 1; o <= 2; o <<= 1) {
            mxa = fmaxf(mxa, __shfl_xor_sync(0xffffffffu, mxa, o));
            mxb = fmaxf(mxb, __shfl_xor_sync(0xffffffffu, mxb, o));
        }
        float mna = fmaxf(ma, mxa), mnb = fmaxf(mb, mxb);
        // (A row with no key yet keeps -inf: nothing to rescale, p = 0.)
        float ca = mna == -INF_F ? 1.0f : expf(ma - mna), cb = mnb == -INF_F ? 1.0f : expf(mb - mnb);
        ma = mna;
        mb = mnb;
        lsa *= ca;
        lsb *= cb;
#pragma unroll
        for (int d = 0; d < FA_MAXD / 8; d++) {
            oacc[d][0] *= ca;
            oacc[d][1] *= ca;
            oacc[d][2] *= cb;
            oacc[d][3] *= cb;
        }
#pragma unroll
        for (int nt = 0; nt < FA_KT / 8; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                float m = e < 2 ? mna : mnb;
                float pe = sc[nt][e] == -INF_F ? 0.0f : expf(sc[nt][e] - m);
                sc[nt][e] = pe;
                if (e < 2) lsa += pe;
                else lsb += pe;
            }
        }
        // O += P V, 16 keys a step.
#pragma unroll
        for (int k2 = 0; k2 < FA_KT / 16; k2++) {
            u32 pf[4], pl[4];
            split_h2(sc[2 * k2][0], sc[2 * k2][1], &pf[0], &pl[0]);
            split_h2(sc[2 * k2][2], sc[2 * k2][3], &pf[1], &pl[1]);
            split_h2(sc[2 * k2 + 1][0], sc[2 * k2 + 1][1], &pf[2], &pl[2]);
            split_h2(sc[2 * k2 + 1][2], sc[2 * k2 + 1][3], &pf[3], &pl[3]);
#pragma unroll
            for (int d = 0; d < FA_MAXD / 8; d++) {
                if (d < ndt) {
                    const u16* vr = vt + (d * 8 + g) * vst + k2 * 16 + 2 * tq;
                    u32 b0 = lds32(vr), b1 = lds32(vr + 8);
                    mma16816(oacc[d], pf, b0, b1);
                    mma16816(oacc[d], pl, b0, b1);
                }
            }
        }
    }
#pragma unroll
    for (int o = 1; o <= 2; o <<= 1) {
        lsa += __shfl_xor_sync(0xffffffffu, lsa, o);
        lsb += __shfl_xor_sync(0xffffffffu, lsb, o);
    }
    float ia = lsa > 0.0f ? 1.0f / lsa : 0.0f, ib = lsb > 0.0f ? 1.0f / lsb : 0.0f;
    float* oa = out + ((size_t)ra * n_head + h) * hdv;
    float* ob = out + ((size_t)rb * n_head + h) * hdv;
#pragma unroll
    for (int d = 0; d < FA_MAXD / 8; d++) {
        if (d < ndt) {
            int c = d * 8 + 2 * tq;
            if (pa >= 0) *(float2*)(oa + c) = make_float2(oacc[d][0] * ia, oacc[d][1] * ia);
            if (pb >= 0) *(float2*)(ob + c) = make_float2(oacc[d][2] * ib, oacc[d][3] * ib);
        }
    }
#endif
}

// ---- mixture of experts. The route table of a batch holds, per token t,
// 2 * n_used floats: the chosen experts' ids (exact as floats) then their
// weights.

#define MOE_MAX_EXPERTS 1024

// The larger of two (value, index) pairs: ties go to the lower index, as
// the host's routing sorts them.
__device__ __forceinline__ void arg_better(float& v, int& i, float v2, int i2) {
    if (v2 > v || (v2 == v && i2 < i)) {
        v = v2;
        i = i2;
    }
}

// One token a block (256 threads): the softmax of its router logits over the
// n_expert experts, the n_used most probable (ties: the lower index), their
// probabilities divided by their sum where `norm` (the sum clamped at f16's
// smallest normal) and times `scale`.
extern "C" __global__ void __launch_bounds__(256) moe_route(const float* logits, float* route,
                                                            int n_expert, int n_used, int norm,
                                                            float scale) { PDL_ENTER();
    __shared__ float p[MOE_MAX_EXPERTS];
    __shared__ float red[32];
    __shared__ float bv[32];
    __shared__ int bi[32];
    __shared__ float chosen_sum;
    int t = blockIdx.x;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    const float* l = logits + (size_t)t * n_expert;
    float m = -INF_F;
    for (int i = threadIdx.x; i < n_expert; i += blockDim.x) m = fmaxf(m, l[i]);
    m = block_max(m, red);
    float s = 0.0f;
    for (int i = threadIdx.x; i < n_expert; i += blockDim.x) {
        float e = expf(l[i] - m);
        p[i] = e;
        s += e;
    }
    float z = block_sum(s, red);
    float* out = route + (size_t)t * 2 * n_used;
    if (threadIdx.x == 0) chosen_sum = 0.0f;
    for (int j = 0; j < n_used; j++) {
        __syncthreads();
        float v = -INF_F;
        int idx = 0x7fffffff;
        for (int i = threadIdx.x; i < n_expert; i += blockDim.x) arg_better(v, idx, p[i], i);
        for (int o = 16; o > 0; o >>= 1) {
            float v2 = __shfl_xor_sync(0xffffffffu, v, o);
            int i2 = __shfl_xor_sync(0xffffffffu, idx, o);
            arg_better(v, idx, v2, i2);
        }
        if (lane == 0) {
            bv[warp] = v;
            bi[warp] = idx;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float bestv = bv[0];
            int best = bi[0];
            for (int w = 1; w < nw; w++) arg_better(bestv, best, bv[w], bi[w]);
            float prob = bestv / z;
            out[j] = (float)best;
            out[n_used + j] = prob;
            chosen_sum += prob;
            p[best] = -INF_F;
        }
    }
    __syncthreads();
    if (threadIdx.x < n_used) {
        float div = norm ? fmaxf(chosen_sum, 6.1035156e-5f) : 1.0f;
        out[n_used + threadIdx.x] = out[n_used + threadIdx.x] / div * scale;
    }
}

// A batch's (token, expert) pairs grouped by expert for the grouped GEMM
// (`mmq_id_<kind>_n<t>`), in one block: `order` lists the pair indices
// expert by expert (within an expert in no set order: a pair's sums do not
// depend on the pairs it shares a tile with), `tiles` one (expert, first
// index into `order`, pairs) a tile of up to `tile` pairs of one expert,
// `n_tiles[0]` how many. `tiles` holds at least pairs / tile + n_expert.
extern "C" __global__ void __launch_bounds__(1024) moe_sort(const float* route, int pairs, int n_used,
                                                            int n_expert, int tile, int* order,
                                                            int4* tiles, int* n_tiles) { PDL_ENTER();
    __shared__ int cnt[MOE_MAX_EXPERTS];
    __shared__ int cur[MOE_MAX_EXPERTS];
    for (int i = threadIdx.x; i < n_expert; i += blockDim.x) cnt[i] = 0;
    __syncthreads();
    auto expert = [&](int p) {
        int t = p / n_used, j = p - t * n_used;
        return (int)route[(size_t)t * 2 * n_used + j];
    };
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) atomicAdd(&cnt[expert(p)], 1);
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0, nt = 0;
        for (int e = 0; e < n_expert; e++) {
            cur[e] = off;
            for (int s = 0; s < cnt[e]; s += tile) tiles[nt++] = make_int4(e, off + s, min(tile, cnt[e] - s), 0);
            off += cnt[e];
        }
        n_tiles[0] = nt;
    }
    __syncthreads();
    for (int p = threadIdx.x; p < pairs; p += blockDim.x) order[atomicAdd(&cur[expert(p)], 1)] = p;
}

// out[t] = sum over j of weight[t][j] * d[t * n_used + j]: each token's
// routed experts' outputs (`width` wide) by their routing weights.
extern "C" __global__ void moe_sum(const float* d, const float* route, float* out, int n_used,
                                   int width, long long n) { PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    long long t = i / width, c = i - t * width;
    const float* wt = route + t * 2 * n_used + n_used;
    float acc = 0.0f;
    for (int j = 0; j < n_used; j++) acc += wt[j] * d[(t * n_used + j) * width + c];
    out[i] = acc;
}

// act: 0 = SiLU, 1 = GELU (tanh form). `stride`/`up_off` let one kernel
// serve separate gate/up buffers (stride = width, up_off unused) and a fused
// [gate | up] row (stride = 2 * width, up_off = width).
extern "C" __global__ void glu(const float* gate, const float* up, float* out, long long n,
                               int width, int stride, int act, i8* qs, float2* ds) { PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    // With `qs` (n % 32 == 0) the output is also quantized into the q8
    // buffer (a warp per 32-element unit), so whole warps stay in.
    if (i - (threadIdx.x & 31) >= n) return;
    float v = 0.0f;
    if (i < n) {
        long long r = i / width, c = i % width;
        float g = gate[r * stride + c], u = up[r * stride + c];
        v = (act == 0 ? silu(g) : gelu_tanh(g)) * u;
        out[i] = v;
    }
    if (qs) quant_lane(v, i, qs, ds);
}

extern "C" __global__ void add(float* a, const float* b, long long n) { PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) a[i] += b[i];
}

extern "C" __global__ void add_bias(float* y, const float* b, long long n, int width) { PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += b[i % width];
}

extern "C" __global__ void scale(float* x, float s, long long n) { PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

extern "C" __global__ void softcap(float* x, float cap, long long n) { PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = tanhf(x[i] / cap) * cap;
}

// dst[r, c] = src[rows[r] * src_width + c0 + c] for c < width: gathers rows
// (c0 = 0, width = src_width) and splits columns (rows = identity).
extern "C" __global__ void copy_cols(const float* src, const u32* rows, float* dst, int n_rows,
                                     int src_width, int c0, int width) { PDL_ENTER();
    int r = blockIdx.y;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n_rows || c >= width) return;
    size_t sr = rows ? rows[r] : (u32)r;
    dst[(size_t)r * width + c] = src[sr * src_width + c0 + c];
}

// ---- small batches on the tensor cores: y = x W^T for up to 64 tokens a launch
// (mma.sync m16n8k16, sm_80+), the weights dequantized to f16 in registers.
//
// A warp takes 16 rows and every token (NT tiles of 8). The k dimension
// goes in groups of four 32-element units: lane (g, t) (g = lane / 4,
// t = lane % 4) decodes unit 4q + t of rows g and g + 8 into 16 f16x2
// pairs each, in element order, and k-step j of the unit gives the mma
// fragment's columns 2t, 2t + 1 its elements 4j, 4j + 1 and columns
// 2t + 8, 2t + 9 its elements 4j + 2, 4j + 3. The sum over k does not care
// which column holds which element, so the activations' fragment is the
// same four elements of the same unit: 8 contiguous bytes of the f16 copy
// of x (row-major, `cols` halves a token). The warps of a block (up to
// MMQ_MAX_WARPS, as the host launches it) share those activations: with
// MMQ_SMEM (the default) the block stages each group's 128 columns of every
// token in shared memory (2 x 16 KB at 64 tokens), the next group's copy in
// flight (cp.async) while this one's is multiplied; without, every warp
// reads them from global memory through L1.
// Blocks split k (`blockIdx.y`) where the rows alone are too few to fill
// the device; each split writes its partial sums to `part` and
// `mmq_reduce` adds them in split order (the same sum every run).

#define MMQ_MAX_WARPS 8
// MMQ_UNROLL (FERROX_CUDA_DEFINES, measuring): groups of k a warp's loop
// takes at once (their weight loads issued together).
#ifndef MMQ_UNROLL
#define MMQ_UNROLL 1
#endif
#define MMQ_PRAGMA_(x) _Pragma(#x)
#define MMQ_PRAGMA(n) MMQ_PRAGMA_(unroll n)

__device__ __forceinline__ u32 hsub2(u32 a, u32 b) {
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}

// Bytes 0, 1 (`hi` false) or 2, 3 of `v`, each 0..255, as the f16x2
// (1024 + b0, 1024 + b1): 0x64 is the high byte of 1024.0 in f16, whose
// mantissa's unit is 1.
__device__ __forceinline__ u32 bytes_h2(u32 v, bool hi) {
    return __byte_perm(v, 0x64646464u, hi ? 0x7362 : 0x5140);
}

// Unit `u` of a row as 16 f16x2 pairs (a[i]: elements 2i, 2i + 1), per
// kind, in two steps so a warp can load the next group's weights before it
// computes on this one's: `load` brings the unit's bytes into registers
// (`Raw`), `dec` turns them into the pairs. The generic form's `load` only
// keeps the address (the unit decoder reads as it expands); the hot kinds
// load with the decode matvecs' `ld_<kind>` (16-byte loads of their device
// layouts) and convert with byte permutes.
#define DEFINE_MMQ_UNIT_GENERIC(NAME)                                                              \
    struct Mmq_##NAME {                                                                           \
        struct Raw { const u8* row; int u, cols; };                                               \
        static __device__ __forceinline__ void load(const u8* row, int u, int cols, Raw& r) {      \
            r.row = row; r.u = u; r.cols = cols;                                                  \
        }                                                                                         \
        static __device__ __forceinline__ void dec(const Raw& r, u32 a[16]) {                      \
            float v[32];                                                                          \
            deq_##NAME(r.row, r.u, r.cols, v);                                                    \
            _Pragma("unroll") for (int i = 0; i < 16; i++) a[i] = pack_h2(v[2 * i], v[2 * i + 1]); \
        }                                                                                         \
    };

DEFINE_MMQ_UNIT_GENERIC(q5_0)

// Four quant words holding nibbles (byte b: element b low, b + 16 high),
// each element v = (q - off) * d + m, as ((1024 + q) - (1024 + off)) * d + m.
__device__ __forceinline__ void nibbles_h2(const uint4 q, u32 off, u32 d, u32 m, u32 a[16]) {
    u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        u32 lo = w[k] & 0x0F0F0F0Fu, hi = (w[k] >> 4) & 0x0F0F0F0Fu;
        a[2 * k] = hfma2(hsub2(bytes_h2(lo, false), off), d, m);
        a[2 * k + 1] = hfma2(hsub2(bytes_h2(lo, true), off), d, m);
        a[8 + 2 * k] = hfma2(hsub2(bytes_h2(hi, false), off), d, m);
        a[8 + 2 * k + 1] = hfma2(hsub2(bytes_h2(hi, true), off), d, m);
    }
}

struct Mmq_q4_k {
    typedef Wq4_k Raw;
    static __device__ __forceinline__ void load(const u8* row, int u, int cols, Raw& r) { r = ld_q4_k(row, u, cols); }
    static __device__ __forceinline__ void dec(const Raw& r, u32 a[16]) {
        int sc, m;
        scale_min_k4w(r.s, r.h.y, r.h.z, r.h.w, &sc, &m);
        float d = h2f((u16)r.h.x), dmin = h2f((u16)(r.h.x >> 16));
        float d1 = d * sc, m1 = -dmin * m;
        nibbles_h2(r.q, 0x64006400u, pack_h2(d1, d1), pack_h2(m1, m1), a);
    }
};

struct Mmq_q4_0 {
    typedef Wq4_0 Raw;
    static __device__ __forceinline__ void load(const u8* row, int u, int cols, Raw& r) { r = ld_q4_0(row, u, cols); }
    static __device__ __forceinline__ void dec(const Raw& r, u32 a[16]) {
        float d = h2f(r.d);
        // (1024 + q) - 1032 = q - 8, exact.
        nibbles_h2(r.q, 0x64086408u, pack_h2(d, d), 0u, a);
    }
};

struct Mmq_q8_0 {
    typedef Wq8_0 Raw;
    static __device__ __forceinline__ void load(const u8* row, int u, int cols, Raw& r) { r = ld_q8_0(row, u, cols); }
    static __device__ __forceinline__ void dec(const Raw& r, u32 a[16]) {
        float d = h2f(r.d);
        u32 dd = pack_h2(d, d);
        u32 w[8] = {r.a.x, r.a.y, r.a.z, r.a.w, r.c.x, r.c.y, r.c.z, r.c.w};
#pragma unroll
        for (int k = 0; k < 8; k++) {
            u32 b = w[k] ^ 0x80808080u;  // q + 128
            // (1024 + q + 128) - 1152 = q, exact.
            a[2 * k] = hmul2(hsub2(bytes_h2(b, false), 0x64806480u), dd);
            a[2 * k + 1] = hmul2(hsub2(bytes_h2(b, true), 0x64806480u), dd);
        }
    }
};

struct Mmq_q6_k {
    typedef Wq6_k Raw;
    static __device__ __forceinline__ void load(const u8* row, int u, int cols, Raw& r) { r = ld_q6_k(row, u, cols); }
    static __device__ __forceinline__ void dec(const Raw& r, u32 a[16]) {
        int lshift = (r.quarter >> 1) * 4, hshift = r.quarter * 2;
        u32 lw[8] = {r.l0.x, r.l0.y, r.l0.z, r.l0.w, r.l1.x, r.l1.y, r.l1.z, r.l1.w};
        u32 hw[8] = {r.h0.x, r.h0.y, r.h0.z, r.h0.w, r.h1.x, r.h1.y, r.h1.z, r.h1.w};
        float d = h2f(r.d);
        float s0 = d * (float)(i8)(r.sc & 0xFF), s1 = d * (float)(i8)(r.sc >> 8);
        u32 d0 = pack_h2(s0, s0), d1 = pack_h2(s1, s1);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            u32 q = ((lw[k] >> lshift) & 0x0F0F0F0Fu) | (((hw[k] >> hshift) & 0x03030303u) << 4);
            u32 dk = k < 4 ? d0 : d1;
            // (1024 + q) - 1056 = q - 32, exact.
            a[2 * k] = hmul2(hsub2(bytes_h2(q, false), 0x64206420u), dk);
            a[2 * k + 1] = hmul2(hsub2(bytes_h2(q, true), 0x64206420u), dk);
        }
    }
};

// MMQ_PREFETCH (FERROX_CUDA_DEFINES, measuring): 1 loads the next group's
// weights before computing on this one's, 0 loads each group as it comes.
#ifndef MMQ_PREFETCH
#define MMQ_PREFETCH 1
#endif

// One group's products into `acc`: the two 16-row halves' units `ca`, `cb`
// decoded (zeros where `ok` is false: a unit past the last), against each
// token tile's 16 activation words, which `xrow(m, xw)` fetches.
template <int NT, class K, class XRow>
__device__ __forceinline__ void mmq_group(float (&acc)[NT][4], const typename K::Raw& ca,
                                          const typename K::Raw& cb, bool ok, XRow xrow) {
    u32 aa[16], ab[16];
    K::dec(ca, aa);
    K::dec(cb, ab);
    if (!ok) {
#pragma unroll
        for (int k = 0; k < 16; k++) aa[k] = ab[k] = 0u;
    }
#pragma unroll
    for (int m = 0; m < NT; m++) {
        u32 xw[16];
        xrow(m, xw);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            u32 af[4] = {aa[2 * j], ab[2 * j], aa[2 * j + 1], ab[2 * j + 1]};
            mma16816(acc[m], af, xw[2 * j], xw[2 * j + 1]);
        }
    }
}

// A warp's sums (rows [r0, r0 + 16), tokens [0, 8 NT)) stored to `out`
// (token-major, `rows` a token), within `rows` and `n`; tile token `i`'s
// sums go to output row `dst(i)` (the identity, or a routed pair).
template <int NT, class Dst>
__device__ __forceinline__ void mmq_store_rows(const float (&acc)[NT][4], float* out, int rows, int n, int r0, Dst dst) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int m = 0; m < NT; m++) {
        int ta = 8 * m + 2 * t, ra = r0 + g, rb = ra + 8;
        if (ta < n && ra < rows) out[dst(ta) * rows + ra] = acc[m][0];
        if (ta + 1 < n && ra < rows) out[dst(ta + 1) * rows + ra] = acc[m][1];
        if (ta < n && rb < rows) out[dst(ta) * rows + rb] = acc[m][2];
        if (ta + 1 < n && rb < rows) out[dst(ta + 1) * rows + rb] = acc[m][3];
    }
}

template <int NT>
__device__ __forceinline__ void mmq_store(const float (&acc)[NT][4], float* out, int rows, int n, int r0) {
    mmq_store_rows<NT>(acc, out, rows, n, r0, [](int i) { return (size_t)i; });
}

// One warp's share of `mmq_<kind>_n<NT>`: rows [r0, r0 + 16), groups
// [q0, q1) of k, tokens [0, n) (n <= 8 NT), sums stored to `out`. A lane
// past the last unit (a partial last group) loads the last unit again and
// zeroes what it decodes.
template <int NT, class K>
__device__ __forceinline__ void mmq_tile(const u8* w, const u16* x, float* out, int rows, int cols,
                                         long long row_bytes, int n, int q0, int q1, int r0) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const u8* wa = w + (size_t)min(r0 + g, rows - 1) * row_bytes;
    const u8* wb = w + (size_t)min(r0 + g + 8, rows - 1) * row_bytes;
    int n_units = cols >> 5;
    float acc[NT][4];
#pragma unroll
    for (int m = 0; m < NT; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
    typename K::Raw ca, cb, na, nb;
    if (MMQ_PREFETCH && q0 < q1) {
        int uc = min(4 * q0 + t, n_units - 1);
        K::load(wa, uc, cols, ca);
        K::load(wb, uc, cols, cb);
    }
    MMQ_PRAGMA(MMQ_UNROLL) for (int q = q0; q < q1; q++) {
        int u = 4 * q + t;
        bool ok = u < n_units;
        if (!MMQ_PREFETCH) {
            int uc = min(u, n_units - 1);
            K::load(wa, uc, cols, ca);
            K::load(wb, uc, cols, cb);
        } else if (q + 1 < q1) {
            int un = min(u + 4, n_units - 1);
            K::load(wa, un, cols, na);
            K::load(wb, un, cols, nb);
        }
        mmq_group<NT, K>(acc, ca, cb, ok, [&](int m, u32 (&xw)[16]) {
            int tok = min(8 * m + g, n - 1);
            const uint4* xp = (const uint4*)(x + (size_t)tok * cols + (size_t)(ok ? u : 0) * 32);
#pragma unroll
            for (int k = 0; k < 4; k++) {
                uint4 v = ok ? __ldg(xp + k) : make_uint4(0, 0, 0, 0);
                xw[4 * k] = v.x;
                xw[4 * k + 1] = v.y;
                xw[4 * k + 2] = v.z;
                xw[4 * k + 3] = v.w;
            }
        });
        if (MMQ_PREFETCH) {
            ca = na;
            cb = nb;
        }
    }
    mmq_store<NT>(acc, out, rows, n, r0);
}

// MMQ_SMEM (FERROX_CUDA_DEFINES, measuring): 1 (default) stages the
// activations in shared memory, 0 reads them from global memory in every
// warp.
#ifndef MMQ_SMEM
#define MMQ_SMEM 1
#endif

// Where 16-byte chunk `c` (0..15) of staged token row `r` lies in its
// 256-byte row: the low two bits flipped by bit 3 of c and bit 0 of r, so
// the eight lanes of a quarter warp (two tokens x four units, one chunk
// each) read eight different bank groups.
__device__ __forceinline__ int mmq_swz(int r, int c) { return c ^ ((c >> 3) & 1) ^ ((r & 1) << 1); }

// Group q's 128 columns of tokens [0, 8 NT) into `sx` (8 NT rows of 128
// halves), zeros past the n tokens and the cols columns; one cp.async
// group committed. Tile token `r`'s activations start at `src(r)`.
template <int NT, class Src>
__device__ __forceinline__ void mmq_stage(Src src, u16* sx, int cols, int n, int q) {
    for (int c = threadIdx.x; c < 8 * NT * 16; c += blockDim.x) {
        int r = c >> 4, ch = c & 15, k0 = q * 128 + ch * 8;
        u16* dst = sx + r * 128 + mmq_swz(r, ch) * 8;
        if (r < n && k0 < cols) cp_async16(dst, src(r) + k0);
        else *(uint4*)dst = make_uint4(0u, 0u, 0u, 0u);
    }
    cp_async_commit();
}

// `mmq_tile` with the activations staged in shared memory (`sx`: two
// stages of 8 NT x 128 halves), every warp of the block taking part in the
// staging and the barriers; a warp past the last row (`r0 >= rows`) only
// stages. Tile token `i` reads the activations at `src(i)` and stores to
// output row `dst(i)` (`mmq_stage`, `mmq_store_rows`).
template <int NT, class K, class Src, class Dst>
__device__ __forceinline__ void mmq_tile_s(const u8* w, Src src, Dst dst, float* out, int rows, int cols,
                                           long long row_bytes, int n, int q0, int q1, int r0, u16* sx) {
    int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    bool active = r0 < rows;
    const u8* wa = w + (size_t)min(r0 + g, rows - 1) * row_bytes;
    const u8* wb = w + (size_t)min(r0 + g + 8, rows - 1) * row_bytes;
    int n_units = cols >> 5;
    float acc[NT][4];
#pragma unroll
    for (int m = 0; m < NT; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = 0.0f;
    typename K::Raw ca, cb, na, nb;
    if (q0 < q1) {
        mmq_stage<NT>(src, sx, cols, n, q0);
        if (active) {
            int uc = min(4 * q0 + t, n_units - 1);
            K::load(wa, uc, cols, ca);
            K::load(wb, uc, cols, cb);
        }
    }
    for (int q = q0; q < q1; q++) {
        const u16* cur = sx + ((q - q0) & 1) * (8 * NT * 128);
        // The next group's copy goes out before this one's is waited for
        // (an empty cp.async group past the last, so one wait fits both).
        if (q + 1 < q1) mmq_stage<NT>(src, sx + (((q - q0) & 1) ^ 1) * (8 * NT * 128), cols, n, q + 1);
        else cp_async_commit();
        cp_async_wait1();
        __syncthreads();
        if (active) {
            int u = 4 * q + t;
            bool ok = u < n_units;
            if (q + 1 < q1) {
                int un = min(u + 4, n_units - 1);
                K::load(wa, un, cols, na);
                K::load(wb, un, cols, nb);
            }
            mmq_group<NT, K>(acc, ca, cb, ok, [&](int m, u32 (&xw)[16]) {
                int r = 8 * m + g;
                const uint4* row = (const uint4*)(cur + r * 128);
#pragma unroll
                for (int k = 0; k < 4; k++) {
                    uint4 v = row[mmq_swz(r, 4 * t + k)];
                    xw[4 * k] = v.x;
                    xw[4 * k + 1] = v.y;
                    xw[4 * k + 2] = v.z;
                    xw[4 * k + 3] = v.w;
                }
            });
            ca = na;
            cb = nb;
        }
        // Every warp is done reading this stage before the next loop
        // copies group q + 2 into it.
        __syncthreads();
    }
    if (!active) return;
    mmq_store_rows<NT>(acc, out, rows, n, r0, dst);
}

// `mmq_<kind>_n<NT>`: a warp takes 16 rows, the warps of block x
// consecutive ones; groups [y * gps, (y + 1) * gps) of k; tokens [0, n)
// (n <= 8 NT).
#define DEFINE_MMQ(NAME, NT)                                                                       \
    extern "C" __global__ void __launch_bounds__(32 * MMQ_MAX_WARPS) mmq_##NAME##_n##NT(          \
        const u8* w, const u16* x, float* y, float* part, int rows, int cols, long long row_bytes, \
        int n, int gps) {                                                                         \
        int r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * 16;                      \
        __shared__ __align__(16) u16 sx[MMQ_SMEM ? 2 * 8 * NT * 128 : 8];                        \
        PDL_ENTER();                                                                              \
        int n_groups = ((cols >> 5) + 3) >> 2;                                                    \
        int q0 = blockIdx.y * gps, q1 = min(q0 + gps, n_groups);                                  \
        float* out = gridDim.y > 1 ? part + (size_t)blockIdx.y * n * rows : y;                    \
        if (MMQ_SMEM) {                                                                           \
            mmq_tile_s<NT, Mmq_##NAME>(                                                           \
                w, [&](int r) { return x + (size_t)r * cols; }, [](int i) { return (size_t)i; }, out, \
                rows, cols, row_bytes, n, q0, q1, r0, sx);                                        \
        } else if (r0 < rows) {                                                                   \
            mmq_tile<NT, Mmq_##NAME>(w, x, out, rows, cols, row_bytes, n, q0, q1, r0);            \
        }                                                                                         \
    }

// Every int8 kind at every token tile (`MMA_TILES` in ferrox-ops).
DEFINE_MMQ(q4_0, 1)
DEFINE_MMQ(q4_0, 2)
DEFINE_MMQ(q4_0, 4)
DEFINE_MMQ(q4_0, 8)
DEFINE_MMQ(q5_0, 1)
DEFINE_MMQ(q5_0, 2)
DEFINE_MMQ(q5_0, 4)
DEFINE_MMQ(q5_0, 8)
DEFINE_MMQ(q8_0, 1)
DEFINE_MMQ(q8_0, 2)
DEFINE_MMQ(q8_0, 4)
DEFINE_MMQ(q8_0, 8)
DEFINE_MMQ(q4_k, 1)
DEFINE_MMQ(q4_k, 2)
DEFINE_MMQ(q4_k, 4)
DEFINE_MMQ(q4_k, 8)
DEFINE_MMQ(q6_k, 1)
DEFINE_MMQ(q6_k, 2)
DEFINE_MMQ(q6_k, 4)
DEFINE_MMQ(q6_k, 8)

// `mmq_id_<kind>_n<NT>`: the grouped GEMM of a mixture of experts'
// batches. Block y takes tile y of `moe_sort`'s table (blocks past
// `n_tiles[0]` leave at once): up to 8 NT pairs routed to one expert, the
// expert's rows of the stack `w` (`rows` each) against the pairs' f16
// activations (token p / n_used's row of `x`, pair p's with `x_per_pair`),
// the sums stored to row p of `y`; a warp 16 rows, the warps of block x
// consecutive ones, the whole of k.
#define DEFINE_MMQ_ID(NAME, NT)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * MMQ_MAX_WARPS) mmq_id_##NAME##_n##NT(       \
        const u8* w, const u16* x, float* y, const int* order, const int4* tiles,                 \
        const int* n_tiles, int rows, int cols, long long row_bytes, int n_used, int x_per_pair) { \
        __shared__ __align__(16) u16 sx[2 * 8 * NT * 128];                                        \
        __shared__ int src_row[8 * NT], dst_row[8 * NT];                                          \
        PDL_ENTER();                                                                              \
        if ((int)blockIdx.y >= n_tiles[0]) return;                                                \
        int4 tl = tiles[blockIdx.y];                                                              \
        for (int i = threadIdx.x; i < 8 * NT; i += blockDim.x) {                                  \
            int p = i < tl.z ? order[tl.y + i] : 0;                                               \
            dst_row[i] = p;                                                                       \
            src_row[i] = x_per_pair ? p : p / n_used;                                             \
        }                                                                                         \
        __syncthreads();                                                                          \
        int r0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * 16;                      \
        int n_groups = ((cols >> 5) + 3) >> 2;                                                    \
        mmq_tile_s<NT, Mmq_##NAME>(                                                               \
            w + (size_t)tl.x * rows * row_bytes, [&](int r) { return x + (size_t)src_row[r] * cols; }, \
            [&](int i) { return (size_t)dst_row[i]; }, y, rows, cols, row_bytes, tl.z, 0, n_groups, r0, sx); \
    }

DEFINE_MMQ_ID(q4_0, 1)
DEFINE_MMQ_ID(q4_0, 2)
DEFINE_MMQ_ID(q4_0, 4)
DEFINE_MMQ_ID(q4_0, 8)
DEFINE_MMQ_ID(q5_0, 1)
DEFINE_MMQ_ID(q5_0, 2)
DEFINE_MMQ_ID(q5_0, 4)
DEFINE_MMQ_ID(q5_0, 8)
DEFINE_MMQ_ID(q8_0, 1)
DEFINE_MMQ_ID(q8_0, 2)
DEFINE_MMQ_ID(q8_0, 4)
DEFINE_MMQ_ID(q8_0, 8)
DEFINE_MMQ_ID(q4_k, 1)
DEFINE_MMQ_ID(q4_k, 2)
DEFINE_MMQ_ID(q4_k, 4)
DEFINE_MMQ_ID(q4_k, 8)
DEFINE_MMQ_ID(q6_k, 1)
DEFINE_MMQ_ID(q6_k, 2)
DEFINE_MMQ_ID(q6_k, 4)
DEFINE_MMQ_ID(q6_k, 8)

// y[i] = the sum of the `splits` partial sums of element i, in split order.
extern "C" __global__ void mmq_reduce(const float* part, float* y, long long count, int splits) {
    PDL_ENTER();
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    float s = 0.0f;
    for (int k = 0; k < splits; k++) s += part[(size_t)k * count + i];
    y[i] = s;
}
