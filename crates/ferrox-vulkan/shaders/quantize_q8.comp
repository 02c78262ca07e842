// The activations of the integer-dot products: each 32-value block of x as
// int8 (round(x / d), d = max |x| / 127), 4 to a uint, then d's bits: 9
// uints a block. An invocation per block.
layout(push_constant, std430) uniform P {
    F32 x;
    U32 xq;
    uint blocks;
} p;

void main() {
    uint b = invocation_index();
    if (b >= p.blocks) return;
    float amax = 0.0;
    for (uint l = 0u; l < 32u; l++) amax = max(amax, abs(p.x.v[b * 32u + l]));
    float d = amax / 127.0, id = d > 0.0 ? 1.0 / d : 0.0;
    for (uint i = 0u; i < 8u; i++) {
        uint packed = 0u;
        for (uint k = 0u; k < 4u; k++) {
            int q = int(round(p.x.v[b * 32u + 4u * i + k] * id));
            packed |= (uint(q) & 255u) << (8u * k);
        }
        p.xq.v[b * 9u + i] = packed;
    }
    p.xq.v[b * 9u + 8u] = floatBitsToUint(d);
}
