//! AVX-512 VNNI kernels for the 32-element block kinds.
//!
//! The key decision: stay at 256-bit width (`avx512vl`) and use VNNI's
//! `vpdpbusd` for the 8-bit products, one instruction where AVX2 needs
//! `maddubs` + `madd`; the block layout (32 elements, one scale) maps to one
//! 256-bit register, and 512-bit registers would only add shuffles. Kinds
//! without a kernel here fall back to AVX2 (see `Isa::fallback`).
//!
//! Every function here is `unsafe` for one reason, stated once: it must only
//! run on a CPU with AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI, and its slices
//! follow the [`super::super::DotFn`] contract.

use core::arch::x86_64::*;

use super::avx2::{
    bytes_from_bits_32, e8m0_to_f32_half, f16_to_f32, hsum_ps, loadu, lookup_nibbles_32, nibbles_32,
    IQ4NL_VALUES, MXFP4_VALUES,
};
use crate::blocks::*;
use crate::cpu::blocks_of;

/// Eight i32 sums of signed x signed bytes, as floats (sign trick: neither
/// side holds -128).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_i8_float(x: __m256i, y: __m256i) -> __m256 {
    let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    _mm256_cvtepi32_ps(s)
}

/// Sums `d * q` over pairs of blocks with two accumulators, as the AVX2
/// kernels do: one FMA chain per block bounds the loop by FMA latency.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn sum_blocks<X, Y>(w: &[X], a: &[Y], block: impl Fn(&X, &Y) -> (__m256, __m256)) -> f32 {
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    for (x, y) in w.chunks_exact(2).zip(a.chunks_exact(2)) {
        let (d0, q0) = block(&x[0], &y[0]);
        let (d1, q1) = block(&x[1], &y[1]);
        acc0 = _mm256_fmadd_ps(d0, q0, acc0);
        acc1 = _mm256_fmadd_ps(d1, q1, acc1);
    }
    if w.len() % 2 == 1 {
        let (d, q) = block(&w[w.len() - 1], &a[w.len() - 1]);
        acc0 = _mm256_fmadd_ps(d, q, acc0);
    }
    hsum_ps(_mm256_add_ps(acc0, acc1))
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ8_0>(w), blocks_of::<BlockQ8_0>(a));
    sum_blocks(w, a, |x, y| {
        let d = _mm256_set1_ps(f16_to_f32(x.d) * f16_to_f32(y.d));
        (d, dot_i8_float(loadu(x.qs.as_ptr().cast()), loadu(y.qs.as_ptr().cast())))
    })
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q4_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ4_0>(w), blocks_of::<BlockQ8_0>(a));
    let off = _mm256_set1_epi8(8);
    sum_blocks(w, a, |x, y| {
        let d = _mm256_set1_ps(f16_to_f32(x.d) * f16_to_f32(y.d));
        let qx = _mm256_sub_epi8(nibbles_32(&x.qs), off);
        (d, dot_i8_float(qx, loadu(y.qs.as_ptr().cast())))
    })
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q5_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ5_0>(w), blocks_of::<BlockQ8_0>(a));
    let f0 = _mm256_set1_epi8(0xF0_u8 as i8);
    sum_blocks(w, a, |x, y| {
        let d = _mm256_set1_ps(f16_to_f32(x.d) * f16_to_f32(y.d));
        let hi = _mm256_andnot_si256(bytes_from_bits_32(x.qh), f0);
        let qx = _mm256_or_si256(nibbles_32(&x.qs), hi);
        (d, dot_i8_float(qx, loadu(y.qs.as_ptr().cast())))
    })
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_iq4_nl_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockIQ4NL>(w), blocks_of::<BlockQ8_0>(a));
    let table = _mm_loadu_si128(IQ4NL_VALUES.as_ptr().cast());
    sum_blocks(w, a, |x, y| {
        let d = _mm256_set1_ps(f16_to_f32(y.d) * f16_to_f32(x.d));
        (d, dot_i8_float(lookup_nibbles_32(table, &x.qs), loadu(y.qs.as_ptr().cast())))
    })
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_mxfp4_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockMXFP4>(w), blocks_of::<BlockQ8_0>(a));
    let table = _mm_loadu_si128(MXFP4_VALUES.as_ptr().cast());
    sum_blocks(w, a, |x, y| {
        let d = _mm256_set1_ps(f16_to_f32(y.d) * e8m0_to_f32_half(x.e));
        (d, dot_i8_float(lookup_nibbles_32(table, &x.qs), loadu(y.qs.as_ptr().cast())))
    })
}
