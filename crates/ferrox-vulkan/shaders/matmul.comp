// y[t][row] = sum_i W[row][i] x[t][i]: a workgroup per output row and up to
// TILE tokens, each thread a 32-element chunk of the row at a time,
// dequantized once for every token of the tile.
layout(push_constant, std430) uniform P {
    F32 x;
    F32 y;
    U8 w;
    uint rows;
    uint cols;
    uint n;
    uint row_bytes;
} p;
shared float red[TILE][64];

void main() {
    uint row = group_index();
    if (row >= p.rows) return;
    uint tid = gl_LocalInvocationID.x;
    uint t0 = gl_WorkGroupID.z * TILE;
    uint nt = min(uint(TILE), p.n - t0);
    float acc[TILE];
    for (uint t = 0u; t < TILE; t++) acc[t] = 0.0;
    uint chunks = (p.cols + 31u) / 32u;
    uint base = row * p.row_bytes;
    for (uint c = tid; c < chunks; c += 64u) {
        float v[32];
        uint lim = min(32u, p.cols - c * 32u);
        deq32(p.w, base, c, lim, v);
        for (uint t = 0u; t < nt; t++) {
            uint xo = (t0 + t) * p.cols + c * 32u;
            float s = 0.0;
            for (uint l = 0u; l < lim; l++) s += v[l] * p.x.v[xo + l];
            acc[t] += s;
        }
    }
    for (uint t = 0u; t < TILE; t++) red[t][tid] = acc[t];
    barrier();
    for (uint s = 32u; s > 0u; s >>= 1) {
        if (tid < s) {
            for (uint t = 0u; t < TILE; t++) red[t][tid] += red[t][tid + s];
        }
        barrier();
    }
    if (tid < nt) p.y.v[(t0 + tid) * p.rows + row] = red[tid][0];
}
