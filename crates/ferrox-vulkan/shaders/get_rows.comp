// out[t] = W[ids[t]], dequantized: an invocation per 32-element chunk.
layout(push_constant, std430) uniform P {
    U8 w;
    F32 out_;
    U32 ids;
    uint cols;
    uint n;
    uint row_bytes;
} p;

void main() {
    uint g = invocation_index();
    uint chunks = (p.cols + 31u) / 32u;
    if (g >= p.n * chunks) return;
    uint t = g / chunks, c = g % chunks;
    uint lim = min(32u, p.cols - c * 32u);
    float v[32];
    deq32(p.w, p.ids.v[t] * p.row_bytes, c, lim, v);
    for (uint l = 0u; l < lim; l++) p.out_.v[t * p.cols + c * 32u + l] = v[l];
}
