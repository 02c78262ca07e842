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

// ------------------------------------------------------- four rows at once
//
// Decode reads every weight once and Gemma-sized rows are short (20–64
// blocks), so a kernel call per row pays its setup per 700–2200 bytes. These
// kernels take four consecutive rows against one activation row: each
// activation block is loaded once for four rows, its scale is converted
// once per matvec (`ActPrep`), weight scales go through a table rather
// than a conversion each, and the 4-bit and 5-bit kinds skip the sign trick:
// their unsigned codes `q + offset` feed `vpdpbusd` directly and the offset
// comes back as `-offset * sum(a)` in the accumulator's first lane.

/// f16 bits → f32, all 65536 of them (256 KiB), as ggml keeps it: one load
/// per block scale instead of a conversion.
fn f16_table() -> &'static [f32; 65536] {
    static T: std::sync::OnceLock<Box<[f32; 65536]>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = Box::new([0f32; 65536]);
        for (i, v) in t.iter_mut().enumerate() {
            *v = F16::from_bits(i as u16).to_f32();
        }
        t
    })
}

/// Four rows of `nb` blocks against one activation row. `code` turns a
/// weight block into its 32 bytes (unsigned when `off > 0`, signed for the
/// sign trick when `off == 0`); `d` reads its f16 scale bits. The rows are
/// `row_bytes` apart, and the rows `PREFETCH_ROWS` further on are prefetched.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot4_blocks<X>(
    w: [&[X]; 4],
    a: &[BlockQ8_0],
    p: &crate::cpu::ActPrep,
    off: i32,
    code: impl Fn(&X) -> __m256i,
    d: impl Fn(&X) -> u16,
    row_bytes: usize,
) -> [f32; 4] {
    let prefetch = crate::cpu::PREFETCH_ROWS * row_bytes;
    let table = f16_table();
    let mut acc = [_mm256_setzero_ps(); 4];
    for (b, y) in a.iter().enumerate() {
        let aq = loadu(y.qs.as_ptr().cast());
        let da = _mm256_set1_ps(p.d[b]);
        let init = _mm256_castsi128_si256(_mm_cvtsi32_si128(-off * p.sum[b]));
        for r in 0..4 {
            let x = &w[r][b];
            // The next four rows' block: more misses in flight than the
            // hardware prefetcher keeps for one core (a hint; never faults).
            // Into L2, as the one-row path does: an L1 prefetch holds one of
            // the core's few fill buffers for the whole trip to DRAM
            // (measured on the Gemma head: ~25 vs ~23 GB/s, 2 threads).
            _mm_prefetch::<_MM_HINT_T1>((x as *const X).cast::<i8>().wrapping_add(prefetch));
            let q = code(x);
            let s = if off == 0 {
                _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(q, q), _mm256_sign_epi8(aq, q))
            } else {
                _mm256_dpbusd_epi32(init, q, aq)
            };
            let dw = _mm256_set1_ps(*table.get_unchecked(usize::from(d(x))));
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dw, da), acc[r]);
        }
    }
    acc.map(|v| hsum_ps(v))
}

/// The four rows of `w` (4 x `row_bytes`) as blocks of `B`.
#[inline]
unsafe fn rows4<B: Block>(w: &[u8], row_bytes: usize) -> [&[B]; 4] {
    core::array::from_fn(|r| blocks_of::<B>(&w[r * row_bytes..(r + 1) * row_bytes]))
}

/// # Safety
/// See the module doc; `w` is four rows of `row_bytes`, `a` one activation
/// row of the same length, `p` prepared from `a`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_q8_0(w: &[u8], row_bytes: usize, a: &[u8], p: &crate::cpu::ActPrep) -> [f32; 4] {
    let rows = rows4::<BlockQ8_0>(w, row_bytes);
    dot4_blocks(rows, blocks_of(a), p, 0, |x| loadu(x.qs.as_ptr().cast()), |x| x.d.to_bits(), row_bytes)
}

/// # Safety
/// As [`dot4_q8_0`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_q4_0(w: &[u8], row_bytes: usize, a: &[u8], p: &crate::cpu::ActPrep) -> [f32; 4] {
    let rows = rows4::<BlockQ4_0>(w, row_bytes);
    dot4_blocks(rows, blocks_of(a), p, 8, |x| nibbles_32(&x.qs), |x| x.d.to_bits(), row_bytes)
}

/// # Safety
/// As [`dot4_q8_0`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_q5_0(w: &[u8], row_bytes: usize, a: &[u8], p: &crate::cpu::ActPrep) -> [f32; 4] {
    let rows = rows4::<BlockQ5_0>(w, row_bytes);
    let bit4 = _mm256_set1_epi8(0x10);
    dot4_blocks(
        rows,
        blocks_of(a),
        p,
        16,
        // The fifth bit of element k is bit k of qh: a byte mask, OR-ed in.
        |x| {
            let nib = nibbles_32(&x.qs);
            _mm256_mask_add_epi8(nib, u32::from_le_bytes(x.qh), nib, bit4)
        },
        |x| x.d.to_bits(),
        row_bytes,
    )
}
