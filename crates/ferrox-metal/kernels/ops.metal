// Element-wise ops over `len` floats, a thread each: op 0 copy (dst = a),
// 1 add (dst += a), 2 scale (dst *= s), 3 softcap (dst = s * tanh(dst / s)),
// 4 bias (dst += a[i % width]).
struct UnaryP {
    uint len;
    uint op;
    uint width;
    float s;
};

kernel void unary(constant UnaryP& p [[buffer(0)]],
                  device float* dst [[buffer(1)]],
                  device const float* a [[buffer(2)]],
                  uint3 tg [[threadgroup_position_in_grid]],
                  uint tid [[thread_index_in_threadgroup]]) {
    uint i = tg.x * 64u + tid;
    if (i >= p.len) return;
    if (p.op == 0u) dst[i] = a[i];
    else if (p.op == 1u) dst[i] += a[i];
    else if (p.op == 2u) dst[i] *= p.s;
    else if (p.op == 3u) dst[i] = p.s * safe_tanh(dst[i] / p.s);
    else dst[i] += a[i % p.width];
}

// dst[t][i] = act(gate) * up over `n` rows of `width`; gate row t at
// gate[t * gstride + i], up at up[t * ustride + i] (a fused row is
// [gate | up]: strides 2 * width, up bound at an offset). act 0: SiLU,
// 1: GELU (tanh form).
struct GluP {
    uint n;
    uint width;
    uint gstride;
    uint ustride;
    uint act;
};

kernel void glu(constant GluP& p [[buffer(0)]],
                device const float* gate [[buffer(1)]],
                device const float* up [[buffer(2)]],
                device float* dst [[buffer(3)]],
                uint3 tg [[threadgroup_position_in_grid]],
                uint tid [[thread_index_in_threadgroup]]) {
    uint i = tg.x * 64u + tid;
    if (i >= p.n * p.width) return;
    uint t = i / p.width, c = i % p.width;
    float g = gate[t * p.gstride + c];
    float a;
    if (p.act == 0u) a = g / (1.0f + exp(-g));
    else a = 0.5f * g * (1.0f + safe_tanh(0.7978845608028654f * (g + 0.044715f * g * g * g)));
    dst[i] = a * up[t * p.ustride + c];
}

// dst[r][i] = src[row(r)][c0 + i] for `n` rows of `width`: row(r) is
// rows[r] when `gather` is set (gather_rows), else r (split_cols).
struct SelectP {
    uint n;
    uint width;
    uint src_width;
    uint c0;
    uint gather;
};

kernel void select_rows(constant SelectP& p [[buffer(0)]],
                        device const float* src [[buffer(1)]],
                        device float* dst [[buffer(2)]],
                        device const uint* rows [[buffer(3)]],
                        uint3 tg [[threadgroup_position_in_grid]],
                        uint tid [[thread_index_in_threadgroup]]) {
    uint i = tg.x * 64u + tid;
    if (i >= p.n * p.width) return;
    uint r = i / p.width, c = i % p.width;
    uint sr = p.gather != 0u ? rows[r] : r;
    dst[i] = src[sr * p.src_width + p.c0 + c];
}

// dst[r] = x[r] / rms(x[r]) * w: a threadgroup per row (dst may be x).
struct RmsNormP {
    uint rows;
    uint width;
    float eps;
};

kernel void rms_norm(constant RmsNormP& p [[buffer(0)]],
                     device const float* x [[buffer(1)]],
                     device float* dst [[buffer(2)]],
                     device const float* w [[buffer(3)]],
                     uint3 tg [[threadgroup_position_in_grid]],
                     uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float red[64];
    uint r = tg.x;
    if (r >= p.rows) return;
    uint o = r * p.width;
    float s = 0.0f;
    for (uint i = tid; i < p.width; i += 64u) {
        float v = x[o + i];
        s += v * v;
    }
    red[tid] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint k = 32u; k > 0u; k >>= 1) {
        if (tid < k) red[tid] += red[tid + k];
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    float inv = rsqrt(red[0] / float(p.width) + p.eps);
    for (uint i = tid; i < p.width; i += 64u) dst[o + i] = x[o + i] * inv * w[i];
}

// RoPE in place over `n` tokens of `n_heads` heads: a thread per rotated
// pair, ggml's angle freq_scale * pos * base^(-2i/n_rot) / factor_i.
struct RopeP {
    uint n;
    uint n_heads;
    uint head_dim;
    uint n_rot;
    uint halves;
    uint has_factors;
    float base;
    float freq_scale;
    float attn_factor;
};

kernel void rope(constant RopeP& p [[buffer(0)]],
                 device float* x [[buffer(1)]],
                 device const uint* pos [[buffer(2)]],
                 device const float* factors [[buffer(3)]],
                 uint3 tg [[threadgroup_position_in_grid]],
                 uint tid [[thread_index_in_threadgroup]]) {
    uint g = tg.x * 64u + tid;
    uint half_rot = p.n_rot / 2u;
    if (g >= p.n * p.n_heads * half_rot) return;
    uint i = g % half_rot, th = g / half_rot;
    uint t = th / p.n_heads;
    float ff = p.has_factors != 0u ? factors[i] : 1.0f;
    float theta = p.freq_scale * float(pos[t]) * pow(p.base, -2.0f * float(i) / float(p.n_rot)) / ff;
    float c = cos(theta) * p.attn_factor, s = sin(theta) * p.attn_factor;
    uint o = th * p.head_dim;
    uint a = p.halves != 0u ? o + i : o + 2u * i;
    uint b = p.halves != 0u ? o + i + half_rot : o + 2u * i + 1u;
    float x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
}

// Writes `n` tokens' keys (width kd) and values (width vd) into a layer of
// the f16 cache at [slot * n_ctx + pos]: a thread per value.
struct KvStoreP {
    uint n;
    uint kd;
    uint vd;
    uint n_ctx;
};

kernel void kv_store(constant KvStoreP& p [[buffer(0)]],
                     device const float* k [[buffer(1)]],
                     device const float* v [[buffer(2)]],
                     device half* kc [[buffer(3)]],
                     device half* vc [[buffer(4)]],
                     device const uint* seq [[buffer(5)]],
                     device const uint* pos [[buffer(6)]],
                     uint3 tg [[threadgroup_position_in_grid]],
                     uint tid [[thread_index_in_threadgroup]]) {
    uint g = tg.x * 64u + tid;
    uint per = p.kd + p.vd;
    if (g >= p.n * per) return;
    uint t = g / per, i = g % per;
    uint at = seq[t] * p.n_ctx + pos[t];
    if (i < p.kd) kc[at * p.kd + i] = half(k[t * p.kd + i]);
    else vc[at * p.vd + (i - p.kd)] = half(v[t * p.vd + (i - p.kd)]);
}

// Causal attention of one query head of one token over its sequence's f16
// cache (a threadgroup each): positions 64 at a time, an online softmax,
// each thread holding up to 4 of the head's output values. Masked scores
// are -1e30, not -inf: nothing here depends on infinities.
struct AttentionP {
    uint n;
    uint n_head;
    uint n_head_kv;
    uint hd;
    uint hdv;
    uint n_ctx;
    uint window;
    float scale;
    float softcap;
};

kernel void attention(constant AttentionP& p [[buffer(0)]],
                      device const float* q [[buffer(1)]],
                      device const half* kc [[buffer(2)]],
                      device const half* vc [[buffer(3)]],
                      device float* dst [[buffer(4)]],
                      device const uint* seq [[buffer(5)]],
                      device const uint* posv [[buffer(6)]],
                      uint3 tg [[threadgroup_position_in_grid]],
                      uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float qs[256];
    threadgroup float pr[64];
    threadgroup float red[64];
    uint id = tg.x;
    if (id >= p.n * p.n_head) return;
    uint t = id / p.n_head, h = id % p.n_head;
    uint kvh = h / (p.n_head / p.n_head_kv);
    for (uint d = tid; d < p.hd; d += 64u) qs[d] = q[(t * p.n_head + h) * p.hd + d];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint pos = posv[t], slot = seq[t];
    uint lo = (p.window != 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
    uint kw = p.n_head_kv * p.hd, vw = p.n_head_kv * p.hdv;
    float m = -1e30f, l = 0.0f;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (uint j0 = lo; j0 <= pos; j0 += 64u) {
        uint j = j0 + tid;
        float sj = -1e30f;
        if (j <= pos) {
            uint kb = (slot * p.n_ctx + j) * kw + kvh * p.hd;
            float s = 0.0f;
            for (uint d = 0u; d < p.hd; d++) s += qs[d] * float(kc[kb + d]);
            sj = s * p.scale;
            if (p.softcap > 0.0f) sj = p.softcap * safe_tanh(sj / p.softcap);
        }
        red[tid] = sj;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint k = 32u; k > 0u; k >>= 1) {
            if (tid < k) red[tid] = max(red[tid], red[tid + k]);
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        float mnew = max(m, red[0]);
        threadgroup_barrier(mem_flags::mem_threadgroup);
        float corr = exp(m - mnew);
        float pj = j <= pos ? exp(sj - mnew) : 0.0f;
        pr[tid] = pj;
        red[tid] = pj;
        threadgroup_barrier(mem_flags::mem_threadgroup);
        for (uint k = 32u; k > 0u; k >>= 1) {
            if (tid < k) red[tid] += red[tid + k];
            threadgroup_barrier(mem_flags::mem_threadgroup);
        }
        l = l * corr + red[0];
        uint cnt = min(64u, pos + 1u - j0);
        for (uint k = 0u; k < 4u; k++) {
            uint d = tid + 64u * k;
            if (d >= p.hdv) break;
            float a = acc[k] * corr;
            for (uint jj = 0u; jj < cnt; jj++) {
                a += pr[jj] * float(vc[(slot * p.n_ctx + j0 + jj) * vw + kvh * p.hdv + d]);
            }
            acc[k] = a;
        }
        m = mnew;
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    for (uint k = 0u; k < 4u; k++) {
        uint d = tid + 64u * k;
        if (d < p.hdv) dst[(t * p.n_head + h) * p.hdv + d] = acc[k] / l;
    }
}
