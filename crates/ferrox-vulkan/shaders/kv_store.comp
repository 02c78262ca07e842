// Writes `n` tokens' keys (width kd) and values (width vd) into a layer of
// the f16 cache at [slot * n_ctx + pos]: an invocation per pair of halves.
layout(push_constant, std430) uniform P {
    F32 k;
    F32 v;
    U32 kc;
    U32 vc;
    U32 seq;
    U32 pos;
    uint n;
    uint kd;
    uint vd;
    uint n_ctx;
} p;

void main() {
    uint g = invocation_index();
    uint kh = p.kd / 2u, vh = p.vd / 2u, per = kh + vh;
    if (g >= p.n * per) return;
    uint t = g / per, i = g % per;
    uint at = p.seq.v[t] * p.n_ctx + p.pos.v[t];
    if (i < kh) {
        p.kc.v[at * kh + i] = packHalf2x16(vec2(p.k.v[t * p.kd + 2u * i], p.k.v[t * p.kd + 2u * i + 1u]));
    } else {
        i -= kh;
        p.vc.v[at * vh + i] = packHalf2x16(vec2(p.v.v[t * p.vd + 2u * i], p.v.v[t * p.vd + 2u * i + 1u]));
    }
}
