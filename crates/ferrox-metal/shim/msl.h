// The Metal Shading Language the kernels use, as C++20, so that the same
// source (kernels/*.metal) compiles and runs on a host without Metal: the
// address spaces are erased, `threadgroup` memory is one static per kernel
// and host thread (a threadgroup's 64 threads run as fibers on one host
// thread, one threadgroup at a time), and threadgroup_barrier() switches
// to the next fiber. What this cannot show: anything of Apple's compiler
// or GPU (fast-math choices, the real memory model, SIMD-group width).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

typedef uint32_t uint;
typedef uint16_t ushort;
typedef uint8_t uchar;
typedef _Float16 half;

struct uint3 {
    uint x, y, z;
};

#define kernel
#define device
#define constant
#define thread
#define threadgroup static thread_local

enum class mem_flags { mem_none, mem_device, mem_threadgroup };
void threadgroup_barrier(mem_flags);

template <class T, class U>
static inline T as_type(U u) {
    static_assert(sizeof(T) == sizeof(U), "as_type between types of one size");
    T t;
    std::memcpy(&t, &u, sizeof t);
    return t;
}

using std::cos;
using std::exp;
using std::max;
using std::min;
using std::pow;
using std::sin;
using std::tanh;

static inline float clamp(float x, float lo, float hi) {
    return std::min(std::max(x, lo), hi);
}

static inline float rsqrt(float x) {
    return 1.0f / std::sqrt(x);
}
