// RoPE in place over `n` tokens of `n_heads` heads: an invocation per
// rotated pair, ggml's angle freq_scale * pos * base^(-2i/n_rot) / factor_i.
layout(push_constant, std430) uniform P {
    F32 x;
    U32 pos;
    F32 factors;
    uint n;
    uint n_heads;
    uint head_dim;
    uint n_rot;
    uint halves;
    uint has_factors;
    float base;
    float freq_scale;
    float attn_factor;
} p;

void main() {
    uint g = invocation_index();
    uint half_rot = p.n_rot / 2u;
    if (g >= p.n * p.n_heads * half_rot) return;
    uint i = g % half_rot, th = g / half_rot;
    uint t = th / p.n_heads;
    float ff = p.has_factors != 0u ? p.factors.v[i] : 1.0;
    float theta = p.freq_scale * float(p.pos.v[t]) * pow(p.base, -2.0 * float(i) / float(p.n_rot)) / ff;
    float c = cos(theta) * p.attn_factor, s = sin(theta) * p.attn_factor;
    uint o = th * p.head_dim;
    uint a = p.halves != 0u ? o + i : o + 2u * i;
    uint b = p.halves != 0u ? o + i + half_rot : o + 2u * i + 1u;
    float x0 = p.x.v[a], x1 = p.x.v[b];
    p.x.v[a] = x0 * c - x1 * s;
    p.x.v[b] = x0 * s + x1 * c;
}
