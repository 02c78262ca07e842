// ferrox's Metal kernels, one library compiled from this source at run
// time (newLibraryWithSource): common.metal, dequant.metal, matmul.metal,
// ops.metal, in that order. Every kernel runs threadgroups of 64 threads;
// its parameters are a struct at buffer(0) (4-byte scalars, in the order
// the host writes them), its tensors at buffer(1) onwards.
//
// The logic is the Vulkan shaders' (ferrox-vulkan/shaders/). Off Apple
// hardware the same text compiles as C++ against shim/msl.h, which is how
// it is tested on Linux.
#ifdef __METAL_VERSION__
#include <metal_stdlib>
using namespace metal;
#endif

#define TILE 8u
#define ROWS 8u

static inline uint b8(device const uchar* p, uint o) {
    return uint(p[o]);
}

static inline int s8(device const uchar* p, uint o) {
    return int(b8(p, o) << 24) >> 24;
}

static inline float f16at(device const uchar* p, uint o) {
    return float(as_type<half>(ushort(b8(p, o) | (b8(p, o + 1u) << 8))));
}

// tanh without the overflow of its exponential form on large arguments.
static inline float safe_tanh(float x) {
    return tanh(clamp(x, -15.0f, 15.0f));
}
