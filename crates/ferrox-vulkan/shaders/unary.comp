// Element-wise ops over `len` floats, one per invocation: OP 0 copy
// (dst = a), 1 add (dst += a), 2 scale (dst *= s), 3 softcap
// (dst = s * tanh(dst / s)), 4 bias (dst += a[i % width]), 5 scaled add
// (dst += s * a), 6 fill (dst = s).
layout(push_constant, std430) uniform P {
    F32 dst;
    F32 a;
    uint len;
    uint op;
    uint width;
    float s;
} p;

void main() {
    uint i = invocation_index();
    if (i >= p.len) return;
    if (p.op == 0u) p.dst.v[i] = p.a.v[i];
    else if (p.op == 1u) p.dst.v[i] += p.a.v[i];
    else if (p.op == 2u) p.dst.v[i] *= p.s;
    else if (p.op == 3u) p.dst.v[i] = p.s * safe_tanh(p.dst.v[i] / p.s);
    else if (p.op == 4u) p.dst.v[i] += p.a.v[i % p.width];
    else if (p.op == 5u) p.dst.v[i] += p.s * p.a.v[i];
    else p.dst.v[i] = p.s;
}
