// dst[r][i] = src[row(r)][c0 + i] for `n` rows of `width`: row(r) is
// rows[r] when `gather` is set (gather_rows), else r (split_cols).
layout(push_constant, std430) uniform P {
    F32 src;
    F32 dst;
    U32 rows;
    uint n;
    uint width;
    uint src_width;
    uint c0;
    uint gather;
} p;

void main() {
    uint i = invocation_index();
    if (i >= p.n * p.width) return;
    uint r = i / p.width, c = i % p.width;
    uint sr = p.gather != 0u ? p.rows.v[r] : r;
    p.dst.v[i] = p.src.v[sr * p.src_width + p.c0 + c];
}
