// y[t][row] = sum_i W[row][i] x[t][i]: ROWS output rows per workgroup,
// 64 / ROWS threads on each, up to TILE tokens per pass over the rows; each
// thread takes a 32-element chunk of its row at a time, dequantized once
// for every token of the tile.
layout(push_constant, std430) uniform P {
    F32 x;
    F32 y;
    U8 w;
    uint rows;
    uint cols;
    uint n;
    uint row_bytes;
} p;
const uint LANES = 64u / ROWS;
shared float red[TILE][64];

void main() {
    uint tid = gl_LocalInvocationID.x, lane = tid % LANES;
    uint row = group_index() * ROWS + tid / LANES;
    bool live = row < p.rows;
    uint t0 = gl_WorkGroupID.z * TILE;
    uint nt = min(uint(TILE), p.n - t0);
    float acc[TILE];
    for (uint t = 0u; t < TILE; t++) acc[t] = 0.0;
    uint chunks = live ? (p.cols + 31u) / 32u : 0u;
    uint base = row * p.row_bytes;
    for (uint c = lane; c < chunks; c += LANES) {
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
    for (uint t = 0u; t < nt; t++) red[t][tid] = acc[t];
    barrier();
    for (uint s = LANES / 2u; s > 0u; s >>= 1) {
        if (lane < s) {
            for (uint t = 0u; t < nt; t++) red[t][tid] += red[t][tid + s];
        }
        barrier();
    }
    if (live && lane == 0u) {
        for (uint t = 0u; t < nt; t++) p.y.v[(t0 + t) * p.rows + row] = red[t][tid];
    }
}
