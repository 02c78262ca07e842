// Causal attention of one query head of one token over its sequence's f16
// cache (a workgroup each): positions 64 at a time, an online softmax, each
// thread holding up to 4 of the head's output values. With `has_sinks`
// (gpt-oss), head h's softmax denominator also takes exp(sinks[h]), a logit
// no value belongs to.
layout(push_constant, std430) uniform P {
    F32 q;
    U32 kc;
    U32 vc;
    F32 out_;
    U32 seq;
    U32 pos;
    F32 sinks;
    uint n;
    uint n_head;
    uint n_head_kv;
    uint hd;
    uint hdv;
    uint n_ctx;
    uint window;
    float scale;
    float softcap;
    uint has_sinks;
} p;
shared float qs[256];
shared float pr[64];
shared float red[64];

void main() {
    uint id = group_index();
    if (id >= p.n * p.n_head) return;
    uint tid = gl_LocalInvocationID.x;
    uint t = id / p.n_head, h = id % p.n_head;
    uint kvh = h / (p.n_head / p.n_head_kv);
    for (uint d = tid; d < p.hd; d += 64u) qs[d] = p.q.v[(t * p.n_head + h) * p.hd + d];
    barrier();
    uint pos = p.pos.v[t], slot = p.seq.v[t];
    uint lo = (p.window != 0u && pos + 1u > p.window) ? pos + 1u - p.window : 0u;
    uint kw = p.n_head_kv * p.hd / 2u, vw = p.n_head_kv * p.hdv / 2u;
    float m = -1.0 / 0.0, l = 0.0;
    float acc[4] = float[4](0.0, 0.0, 0.0, 0.0);
    for (uint j0 = lo; j0 <= pos; j0 += 64u) {
        uint j = j0 + tid;
        float sj = -1.0 / 0.0;
        if (j <= pos) {
            uint kb = (slot * p.n_ctx + j) * kw + kvh * p.hd / 2u;
            float s = 0.0;
            for (uint d2 = 0u; d2 < p.hd / 2u; d2++) {
                vec2 kk = unpackHalf2x16(p.kc.v[kb + d2]);
                s += qs[2u * d2] * kk.x + qs[2u * d2 + 1u] * kk.y;
            }
            sj = s * p.scale;
            if (p.softcap > 0.0) sj = p.softcap * safe_tanh(sj / p.softcap);
        }
        red[tid] = sj;
        barrier();
        for (uint k = 32u; k > 0u; k >>= 1) {
            if (tid < k) red[tid] = max(red[tid], red[tid + k]);
            barrier();
        }
        float mnew = max(m, red[0]);
        barrier();
        float corr = exp(m - mnew);
        float pj = j <= pos ? exp(sj - mnew) : 0.0;
        pr[tid] = pj;
        red[tid] = pj;
        barrier();
        for (uint k = 32u; k > 0u; k >>= 1) {
            if (tid < k) red[tid] += red[tid + k];
            barrier();
        }
        l = l * corr + red[0];
        uint cnt = min(64u, pos + 1u - j0);
        for (uint k = 0u; k < 4u; k++) {
            uint d = tid + 64u * k;
            if (d >= p.hdv) break;
            float a = acc[k] * corr;
            for (uint jj = 0u; jj < cnt; jj++) {
                uint vb = (slot * p.n_ctx + j0 + jj) * vw * 2u + kvh * p.hdv + d;
                vec2 vv = unpackHalf2x16(p.vc.v[vb >> 1]);
                a += pr[jj] * ((vb & 1u) != 0u ? vv.y : vv.x);
            }
            acc[k] = a;
        }
        m = mnew;
        barrier();
    }
    if (p.has_sinks != 0u) {
        float sk = p.sinks.v[h], mn = max(m, sk), corr = exp(m - mn);
        l = l * corr + exp(sk - mn);
        for (uint k = 0u; k < 4u; k++) acc[k] *= corr;
    }
    for (uint k = 0u; k < 4u; k++) {
        uint d = tid + 64u * k;
        if (d < p.hdv) p.out_.v[(t * p.n_head + h) * p.hdv + d] = acc[k] / l;
    }
}
