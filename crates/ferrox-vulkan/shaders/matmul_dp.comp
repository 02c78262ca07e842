// y[t][row] = sum_i W[row][i] x[t][i] with integer dot products: the
// weights' int8 (or nibble) values against the activations quantized to
// int8 per 32 (`quantize_q8.comp`), four products an instruction, each
// block's sum scaled by both scales. Laid out as matmul.comp: ROWS rows a
// workgroup, 64 / ROWS threads a row, TILE tokens a pass.
#extension GL_EXT_integer_dot_product : require
layout(push_constant, std430) uniform P {
    U32 xq;
    F32 y;
    U8 w;
    uint rows;
    uint cols;
    uint n;
    uint row_bytes;
} p;
const uint LANES = 64u / ROWS;
shared float red[TILE][64];

uint pack4(int a, int b, int c, int d) {
    return (uint(a) & 255u) | ((uint(b) & 255u) << 8) | ((uint(c) & 255u) << 16) | ((uint(d) & 255u) << 24);
}

// Block `c` of the row at `base`: its 32 values as int8, 4 to a uint, and its scale.
float wq32(U8 w, uint base, uint c, out uint q[8]) {
#if defined(KIND_Q8_0)
    uint o = base + c * 34u;
    for (uint i = 0u; i < 8u; i++) {
        uint b = o + 2u + 4u * i;
        q[i] = b8(w, b) | (b8(w, b + 1u) << 8) | (b8(w, b + 2u) << 16) | (b8(w, b + 3u) << 24);
    }
    return f16at(w, o);
#elif defined(KIND_Q4_0)
    // Element l < 16 is byte l's low nibble, element l + 16 its high one.
    uint o = base + c * 18u;
    for (uint i = 0u; i < 4u; i++) {
        uint b = o + 2u + 4u * i;
        uint x0 = b8(w, b), x1 = b8(w, b + 1u), x2 = b8(w, b + 2u), x3 = b8(w, b + 3u);
        q[i] = pack4(int(x0 & 15u) - 8, int(x1 & 15u) - 8, int(x2 & 15u) - 8, int(x3 & 15u) - 8);
        q[i + 4u] = pack4(int(x0 >> 4) - 8, int(x1 >> 4) - 8, int(x2 >> 4) - 8, int(x3 >> 4) - 8);
    }
    return f16at(w, o);
#else
#error "no integer-dot product for this kind"
#endif
}

void main() {
    uint tid = gl_LocalInvocationID.x, lane = tid % LANES;
    uint row = group_index() * ROWS + tid / LANES;
    bool live = row < p.rows;
    uint t0 = gl_WorkGroupID.z * TILE;
    uint nt = min(uint(TILE), p.n - t0);
    float acc[TILE];
    for (uint t = 0u; t < TILE; t++) acc[t] = 0.0;
    uint chunks = p.cols / 32u;
    uint mine = live ? chunks : 0u;
    uint base = row * p.row_bytes;
    for (uint c = lane; c < mine; c += LANES) {
        uint q[8];
        float dw = wq32(p.w, base, c, q);
        for (uint t = 0u; t < nt; t++) {
            uint xo = ((t0 + t) * chunks + c) * 9u;
            int s = 0;
            for (uint i = 0u; i < 8u; i++) s += dotPacked4x8EXT(int(q[i]), int(p.xq.v[xo + i]));
            acc[t] += dw * uintBitsToFloat(p.xq.v[xo + 8u]) * float(s);
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
