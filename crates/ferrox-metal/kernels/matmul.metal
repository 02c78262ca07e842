// y[t][row] = sum_i W[row][i] x[t][i]: ROWS output rows per threadgroup,
// 64 / ROWS threads on each, up to TILE tokens per pass over the rows
// (threadgroup z: the tile); each thread takes a 32-element chunk of its
// row at a time, dequantized once for every token of the tile.
struct MatmulP {
    uint rows;
    uint cols;
    uint n;
    uint row_bytes;
};

template <typename K>
kernel void matmul(constant MatmulP& p [[buffer(0)]],
                   device const float* x [[buffer(1)]],
                   device float* y [[buffer(2)]],
                   device const uchar* w [[buffer(3)]],
                   uint3 tg [[threadgroup_position_in_grid]],
                   uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float red[TILE][64];
    const uint lanes = 64u / ROWS;
    uint lane = tid % lanes;
    uint row = tg.x * ROWS + tid / lanes;
    bool live = row < p.rows;
    uint t0 = tg.z * TILE;
    uint nt = min(TILE, p.n - t0);
    float acc[TILE];
    for (uint t = 0u; t < TILE; t++) acc[t] = 0.0f;
    uint chunks = live ? (p.cols + 31u) / 32u : 0u;
    uint base = row * p.row_bytes;
    for (uint c = lane; c < chunks; c += lanes) {
        float v[32];
        uint lim = min(32u, p.cols - c * 32u);
        K::deq32(w, base, c, lim, v);
        for (uint t = 0u; t < nt; t++) {
            uint xo = (t0 + t) * p.cols + c * 32u;
            float s = 0.0f;
            for (uint l = 0u; l < lim; l++) s += v[l] * x[xo + l];
            acc[t] += s;
        }
    }
    for (uint t = 0u; t < nt; t++) red[t][tid] = acc[t];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint s = lanes / 2u; s > 0u; s >>= 1) {
        if (lane < s) {
            for (uint t = 0u; t < nt; t++) red[t][tid] += red[t][tid + s];
        }
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    if (live && lane == 0u) {
        for (uint t = 0u; t < nt; t++) y[(t0 + t) * p.rows + row] = red[t][tid];
    }
}

// dst[t] = W[ids[t]], dequantized: a thread per 32-element chunk.
struct GetRowsP {
    uint cols;
    uint n;
    uint row_bytes;
};

template <typename K>
kernel void get_rows(constant GetRowsP& p [[buffer(0)]],
                     device const uchar* w [[buffer(1)]],
                     device float* dst [[buffer(2)]],
                     device const uint* ids [[buffer(3)]],
                     uint3 tg [[threadgroup_position_in_grid]],
                     uint tid [[thread_index_in_threadgroup]]) {
    uint g = tg.x * 64u + tid;
    uint chunks = (p.cols + 31u) / 32u;
    if (g >= p.n * chunks) return;
    uint t = g / chunks, c = g % chunks;
    uint lim = min(32u, p.cols - c * 32u);
    float v[32];
    K::deq32(w, ids[t] * p.row_bytes, c, lim, v);
    for (uint l = 0u; l < lim; l++) dst[t * p.cols + c * 32u + l] = v[l];
}

// The kernels by name, one of each per kind of ferrox_ops::metal::KINDS
// (a test holds the two lists together).
typedef decltype(matmul<KF32>) matmul_t;
typedef decltype(get_rows<KF32>) get_rows_t;
template [[host_name("matmul_f32")]] kernel matmul_t matmul<KF32>;
template [[host_name("matmul_f16")]] kernel matmul_t matmul<KF16>;
template [[host_name("matmul_bf16")]] kernel matmul_t matmul<KBF16>;
template [[host_name("matmul_q4_0")]] kernel matmul_t matmul<KQ4_0>;
template [[host_name("matmul_q4_1")]] kernel matmul_t matmul<KQ4_1>;
template [[host_name("matmul_q5_0")]] kernel matmul_t matmul<KQ5_0>;
template [[host_name("matmul_q5_1")]] kernel matmul_t matmul<KQ5_1>;
template [[host_name("matmul_q8_0")]] kernel matmul_t matmul<KQ8_0>;
template [[host_name("matmul_q2_k")]] kernel matmul_t matmul<KQ2_K>;
template [[host_name("matmul_q4_k")]] kernel matmul_t matmul<KQ4_K>;
template [[host_name("matmul_q5_k")]] kernel matmul_t matmul<KQ5_K>;
template [[host_name("matmul_q6_k")]] kernel matmul_t matmul<KQ6_K>;
template [[host_name("get_rows_f32")]] kernel get_rows_t get_rows<KF32>;
template [[host_name("get_rows_f16")]] kernel get_rows_t get_rows<KF16>;
template [[host_name("get_rows_bf16")]] kernel get_rows_t get_rows<KBF16>;
template [[host_name("get_rows_q4_0")]] kernel get_rows_t get_rows<KQ4_0>;
template [[host_name("get_rows_q4_1")]] kernel get_rows_t get_rows<KQ4_1>;
template [[host_name("get_rows_q5_0")]] kernel get_rows_t get_rows<KQ5_0>;
template [[host_name("get_rows_q5_1")]] kernel get_rows_t get_rows<KQ5_1>;
template [[host_name("get_rows_q8_0")]] kernel get_rows_t get_rows<KQ8_0>;
template [[host_name("get_rows_q2_k")]] kernel get_rows_t get_rows<KQ2_K>;
template [[host_name("get_rows_q4_k")]] kernel get_rows_t get_rows<KQ4_K>;
template [[host_name("get_rows_q5_k")]] kernel get_rows_t get_rows<KQ5_K>;
template [[host_name("get_rows_q6_k")]] kernel get_rows_t get_rows<KQ6_K>;
