// out[r] = x[r] / rms(x[r]) * w: a workgroup per row (out may be x).
layout(push_constant, std430) uniform P {
    F32 x;
    F32 out_;
    F32 w;
    uint rows;
    uint width;
    float eps;
} p;
shared float red[64];

void main() {
    uint r = group_index();
    if (r >= p.rows) return;
    uint tid = gl_LocalInvocationID.x, o = r * p.width;
    float s = 0.0;
    for (uint i = tid; i < p.width; i += 64u) {
        float v = p.x.v[o + i];
        s += v * v;
    }
    red[tid] = s;
    barrier();
    for (uint k = 32u; k > 0u; k >>= 1) {
        if (tid < k) red[tid] += red[tid + k];
        barrier();
    }
    float inv = inversesqrt(red[0] / float(p.width) + p.eps);
    for (uint i = tid; i < p.width; i += 64u) p.out_.v[o + i] = p.x.v[o + i] * inv * p.w.v[i];
}
