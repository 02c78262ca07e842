// out[t][i] = act(gate) * up over `n` rows of `width`; gate row t at
// gate[t * gstride + i], up at up[t * ustride + i] (a fused row is
// [gate | up], strides 2 * width). ACT 0: SiLU, 1: GELU (tanh form), 2:
// gpt-oss's clamped SwiGLU (gate clamped above at `limit`, up to
// [-limit, limit], out = g * sigmoid(alpha * g) * (u + 1)).
layout(push_constant, std430) uniform P {
    F32 gate;
    F32 up;
    F32 out_;
    uint n;
    uint width;
    uint gstride;
    uint ustride;
    uint act;
    float alpha;
    float limit;
} p;

void main() {
    uint i = invocation_index();
    if (i >= p.n * p.width) return;
    uint t = i / p.width, c = i % p.width;
    float g = p.gate.v[t * p.gstride + c];
    float u = p.up.v[t * p.ustride + c];
    float a;
    if (p.act == 0u) a = g / (1.0 + exp(-g));
    else if (p.act == 1u) a = 0.5 * g * (1.0 + safe_tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
    else {
        g = min(g, p.limit);
        u = clamp(u, -p.limit, p.limit) + 1.0;
        a = g / (1.0 + exp(p.alpha * -g));
    }
    p.out_.v[i] = a * u;
}
