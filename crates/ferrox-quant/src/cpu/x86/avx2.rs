//! AVX2 + FMA + F16C kernels: 32 weights per 256-bit register.
//!
//! The key decision: integer products stay integer as long as the format
//! allows (a whole 32-element block, or a whole 256-element super-block for
//! the K kinds, summed in i32 lanes) and only the block scale goes through
//! float, as in ggml. Signed x signed 8-bit products use the sign trick
//! (`|w| * sign(a, w)` through `maddubs`), which is exact because quantized
//! activations never hold -128 (see [`super::super::DotFn`]).
//!
//! Every function here is `unsafe` for one reason, stated once: it must
//! only run on a CPU with AVX2, FMA and F16C, and its slices follow the
//! [`super::super::DotFn`] contract.

use core::arch::x86_64::*;

use crate::blocks::*;
use crate::cpu::{blocks_of, rows_n};

// The code tables and the E8M0 scale, as the twins have them.
pub(super) use crate::scalar::iq_grids::KVALUES_IQ4NL;
pub(super) use crate::scalar::{e8m0_half, E2M1_X2};

// ---------------------------------------------------------------- helpers

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_to_f32(h: F16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h.to_bits()))))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    hsum_ps128(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn loadu(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

/// i16 pair sums of signed x signed bytes (sign trick; neither side -128).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn maddubs_signed(x: __m256i, y: __m256i) -> __m256i {
    _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// Eight i32 sums of signed x signed bytes, as floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sum_i8_pairs_float(x: __m256i, y: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(maddubs_signed(x, y), _mm256_set1_epi16(1)))
}

/// Eight i32 sums of unsigned x signed bytes, as floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn mul_sum_us8_pairs_float(ux: __m256i, y: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(ux, y), _mm256_set1_epi16(1)))
}

/// Sums `d * q` over pairs of blocks with two accumulators: with one FMA
/// chain the loop is bound by FMA latency (measured: Q4_0 3.0 -> 5.0 GB/s on
/// one core), not by the integer work per block. `block` gives a block pair's
/// scale (broadcast) and its eight i32 partial sums as floats.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
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

/// 16 packed nibbles → 32 bytes: low nibbles first (elements 0..16), then
/// high nibbles (16..32), the legacy-block element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles_32(qs: &[u8; 16]) -> __m256i {
    let t = _mm_loadu_si128(qs.as_ptr().cast());
    let b = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    _mm256_and_si256(b, _mm256_set1_epi8(0x0F))
}

/// 32 bits → 32 bytes, 0xFF where the bit is set (byte k from bit k).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bytes_from_bits_32(bits: [u8; 4]) -> __m256i {
    let v = _mm256_set1_epi32(i32::from_le_bytes(bits));
    let shuf = _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0);
    let b = _mm256_shuffle_epi8(v, shuf);
    let all_but_bit = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_or_si256(b, all_but_bit), _mm256_set1_epi64x(-1))
}

/// A 16-entry signed byte table applied to 16 packed nibbles (low nibbles →
/// elements 0..16, high → 16..32).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn lookup_nibbles_32(table: __m128i, qs: &[u8; 16]) -> __m256i {
    let t = _mm_loadu_si128(qs.as_ptr().cast());
    let m4 = _mm_set1_epi8(0x0F);
    let lo = _mm_shuffle_epi8(table, _mm_and_si128(t, m4));
    let hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(t, 4), m4));
    _mm256_set_m128i(hi, lo)
}

/// Two i16 scales, one per 128-bit lane (a 16-element K sub-block each).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lane_scales(lo: i16, hi: i16) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo))
}

/// ggml's 6-bit scale/min unpacking of Q4_K and Q5_K, on words: the eight
/// scales as i16 in the low 128 bits and the eight mins in the high 128 bits.
/// A dozen integer ops per super-block where unpacking byte by byte and
/// broadcasting each scale from a general register cost about twice the
/// block's integer work (measured on Q4_K).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scales_mins_k4(s: &[u8; 12]) -> __m256i {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let u = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let sc_lo = u0 & KMASK1;
    let sc_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let mn_lo = u1 & KMASK1;
    let mn_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let bytes = _mm_set_epi32(mn_hi as i32, mn_lo as i32, sc_hi as i32, sc_lo as i32);
    _mm256_cvtepu8_epi16(bytes)
}

/// `shuffle_epi8` masks broadcasting i16 word `j` of each 128-bit lane to the
/// whole lane (`K4_WORD[j]`), for the per-sub-block scales of Q4_K/Q5_K.
static K4_WORD: [[u8; 32]; 8] = {
    let mut m = [[0u8; 32]; 8];
    let mut j = 0;
    while j < 8 {
        let mut b = 0;
        while b < 32 {
            m[j][b] = (2 * j + b % 2) as u8;
            b += 1;
        }
        j += 1;
    }
    m
};

/// `shuffle_epi8` masks putting i16 word `2k` of a lane in the low lane and
/// word `2k + 1` in the high lane (`K6_PAIR[k]`): two 16-element Q6_K
/// sub-blocks' scales for one 32-byte product.
static K6_PAIR: [[u8; 32]; 4] = {
    let mut m = [[0u8; 32]; 4];
    let mut k = 0;
    while k < 4 {
        let mut b = 0;
        while b < 32 {
            let word = if b < 16 { 2 * k } else { 2 * k + 1 };
            m[k][b] = (2 * word + b % 2) as u8;
            b += 1;
        }
        k += 1;
    }
    m
};

/// The Q4_K/Q5_K super-block prologue: adds `dmin * min * bsum` over the
/// eight 32-element sub-blocks to `acc_m`, and returns the eight scales as
/// i16 words in both 128-bit lanes (for [`K4_WORD`] shuffles).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_scales(scales: &[u8; 12], dmin: f32, bsums: &[i16; 16], acc_m: &mut __m128) -> __m256i {
    let sm = scales_mins_k4(scales);
    let b = _mm256_loadu_si256(bsums.as_ptr().cast());
    let pair_sums = _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
    let mins = _mm_madd_epi16(_mm256_extracti128_si256(sm, 1), pair_sums);
    *acc_m = _mm_fmadd_ps(_mm_set1_ps(dmin), _mm_cvtepi32_ps(mins), *acc_m);
    _mm256_permute2x128_si256(sm, sm, 0x00)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps128(v: __m128) -> f32 {
    let s = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

// ------------------------------------------------------------ float kinds

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<f32>(w), blocks_of::<f32>(a));
    let n = w.len();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            let x = _mm256_loadu_ps(w.as_ptr().add(i + 8 * k));
            let y = _mm256_loadu_ps(a.as_ptr().add(i + 8 * k));
            *acc = _mm256_fmadd_ps(x, y, *acc);
        }
        i += 32;
    }
    let mut s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for j in i..n {
        s += w[j] * a[j];
    }
    s
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<F16>(w), blocks_of::<F16>(a));
    let n = w.len();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(i + 8 * k).cast()));
            let y = _mm256_cvtph_ps(_mm_loadu_si128(a.as_ptr().add(i + 8 * k).cast()));
            *acc = _mm256_fmadd_ps(x, y, *acc);
        }
        i += 32;
    }
    let mut s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for j in i..n {
        s += f16_to_f32(w[j]) * f16_to_f32(a[j]);
    }
    s
}

/// One F16 weight row against `M` activation rows (already widened to f32,
/// `stride` floats apart): each 8-element weight chunk is widened once and
/// used `M` times. Each token's sum is formed exactly as [`dot_f16`] forms
/// it (four 8-lane accumulators over 32-element steps, the same fused
/// multiply-adds, reduction and scalar tail; the widening of an f16
/// activation to f32 is exact), so it is bit-identical to the one-row
/// kernel's whatever `M`: a batch's rows equal a decode step's, which
/// speculative verification relies on. Four accumulators a token fit three
/// tokens in sixteen registers.
///
/// # Safety
/// See the module doc; `w` is whole F16 elements, and every `a + t * stride
/// .. + w.len() / 2` for `t < M` is readable.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_f16_rows<const M: usize>(w: &[u8], a: *const f32, stride: usize, out: &mut [f32; M]) {
    let w = blocks_of::<F16>(w);
    let n = w.len();
    let mut acc = [[_mm256_setzero_ps(); 4]; M];
    let mut i = 0;
    while i + 32 <= n {
        for k in 0..4 {
            let x = _mm256_cvtph_ps(_mm_loadu_si128(w.as_ptr().add(i + 8 * k).cast()));
            for (t, acc) in acc.iter_mut().enumerate() {
                acc[k] = _mm256_fmadd_ps(x, _mm256_loadu_ps(a.add(t * stride + i + 8 * k)), acc[k]);
            }
        }
        i += 32;
    }
    for (t, acc) in acc.iter().enumerate() {
        let mut s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
        for (j, &wj) in w.iter().enumerate().skip(i) {
            s += f16_to_f32(wj) * *a.add(t * stride + j);
        }
        out[t] = s;
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_bf16x8(p: *const BF16) -> __m256 {
    let h = _mm_loadu_si128(p.cast());
    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BF16>(w), blocks_of::<BF16>(a));
    let n = w.len();
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        for (k, acc) in acc.iter_mut().enumerate() {
            let x = load_bf16x8(w.as_ptr().add(i + 8 * k));
            let y = load_bf16x8(a.as_ptr().add(i + 8 * k));
            *acc = _mm256_fmadd_ps(x, y, *acc);
        }
        i += 32;
    }
    let mut s = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for j in i..n {
        s += w[j].to_f32() * a[j].to_f32();
    }
    s
}

// ------------------------------------------------------ 32-element kinds

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ8_0>(w), blocks_of::<BlockQ8_0>(a));
    // Two accumulators hide the FMA latency on short rows.
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 2 <= w.len() {
        let (x0, y0, x1, y1) = (&w[i], &a[i], &w[i + 1], &a[i + 1]);
        let d0 = _mm256_set1_ps(f16_to_f32(x0.d) * f16_to_f32(y0.d));
        let d1 = _mm256_set1_ps(f16_to_f32(x1.d) * f16_to_f32(y1.d));
        let q0 = mul_sum_i8_pairs_float(loadu(x0.qs.as_ptr().cast()), loadu(y0.qs.as_ptr().cast()));
        let q1 = mul_sum_i8_pairs_float(loadu(x1.qs.as_ptr().cast()), loadu(y1.qs.as_ptr().cast()));
        acc0 = _mm256_fmadd_ps(d0, q0, acc0);
        acc1 = _mm256_fmadd_ps(d1, q1, acc1);
        i += 2;
    }
    if i < w.len() {
        let (x, y) = (&w[i], &a[i]);
        let d = _mm256_set1_ps(f16_to_f32(x.d) * f16_to_f32(y.d));
        let q = mul_sum_i8_pairs_float(loadu(x.qs.as_ptr().cast()), loadu(y.qs.as_ptr().cast()));
        acc0 = _mm256_fmadd_ps(d, q, acc0);
    }
    hsum_ps(_mm256_add_ps(acc0, acc1))
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ4_0>(w), blocks_of::<BlockQ8_0>(a));
    let off = _mm256_set1_epi8(8);
    sum_blocks(w, a, |x, y| {
        let d = _mm256_set1_ps(f16_to_f32(x.d) * f16_to_f32(y.d));
        let qx = _mm256_sub_epi8(nibbles_32(&x.qs), off);
        (d, mul_sum_i8_pairs_float(qx, loadu(y.qs.as_ptr().cast())))
    })
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ5_0>(w), blocks_of::<BlockQ8_0>(a));
    let f0 = _mm256_set1_epi8(0xF0_u8 as i8);
    sum_blocks(w, a, |x, y| {
        let d = _mm256_set1_ps(f16_to_f32(x.d) * f16_to_f32(y.d));
        // q - 16: a clear fifth bit sets the byte's top nibble (negative).
        let hi = _mm256_andnot_si256(bytes_from_bits_32(x.qh), f0);
        let qx = _mm256_or_si256(nibbles_32(&x.qs), hi);
        (d, mul_sum_i8_pairs_float(qx, loadu(y.qs.as_ptr().cast())))
    })
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ4_1>(w), blocks_of::<BlockQ8_1>(a));
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        summs += f16_to_f32(x.m) * f16_to_f32(y.s);
        let d = _mm256_set1_ps(f16_to_f32(x.d) * f16_to_f32(y.d));
        let q = mul_sum_us8_pairs_float(nibbles_32(&x.qs), loadu(y.qs.as_ptr().cast()));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum_ps(acc) + summs
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ5_1>(w), blocks_of::<BlockQ8_1>(a));
    let mut acc = _mm256_setzero_ps();
    let mut summs = 0.0f32;
    let b4 = _mm256_set1_epi8(0x10);
    for (x, y) in w.iter().zip(a) {
        summs += f16_to_f32(x.m) * f16_to_f32(y.s);
        let d = _mm256_set1_ps(f16_to_f32(x.d) * f16_to_f32(y.d));
        let hi = _mm256_and_si256(bytes_from_bits_32(x.qh), b4);
        let qx = _mm256_or_si256(nibbles_32(&x.qs), hi);
        let q = mul_sum_us8_pairs_float(qx, loadu(y.qs.as_ptr().cast()));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    hsum_ps(acc) + summs
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_iq4_nl_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockIQ4NL>(w), blocks_of::<BlockQ8_0>(a));
    let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
    sum_blocks(w, a, |x, y| {
        let d = _mm256_set1_ps(f16_to_f32(y.d) * f16_to_f32(x.d));
        (d, mul_sum_i8_pairs_float(lookup_nibbles_32(table, &x.qs), loadu(y.qs.as_ptr().cast())))
    })
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_mxfp4_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockMXFP4>(w), blocks_of::<BlockQ8_0>(a));
    let table = _mm_loadu_si128(E2M1_X2.as_ptr().cast());
    sum_blocks(w, a, |x, y| {
        let d = _mm256_set1_ps(f16_to_f32(y.d) * e8m0_half(x.e));
        (d, mul_sum_i8_pairs_float(lookup_nibbles_32(table, &x.qs), loadu(y.qs.as_ptr().cast())))
    })
}

// --------------------------------------- four rows of 32-element kinds

/// The four rows' sums of `v` (one row per register), in one reduction.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum4(v: [__m256; 4]) -> [f32; 4] {
    let s = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), s);
    out
}

/// Four rows of 32-element blocks against one activation row prepared as
/// `p` (its quants without scales in `p.qs`, its scales as f32 in `p.d`):
/// each activation block is loaded and its scale converted once for the
/// four rows, and the four sums reduce together. `dot` gives a weight
/// block's eight i32 partial sums against the activation quants; `d` its
/// f16 scale. The rows `PREFETCH_ROWS` further on are prefetched into L2
/// as the one-row path does.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot4_blocks32<X>(
    w: [&[X]; 4],
    p: &crate::cpu::ActPrep,
    dot: impl Fn(&X, __m256i, usize) -> __m256i,
    d: impl Fn(&X) -> F16,
    row_bytes: usize,
) -> [f32; 4] {
    let nb = w[0].len();
    debug_assert!(p.d.len() == nb && p.qs.len() >= nb * 32);
    let prefetch = crate::cpu::PREFETCH_ROWS * row_bytes;
    let mut acc = [_mm256_setzero_ps(); 4];
    for b in 0..nb {
        let a = loadu(p.qs.as_ptr().add(32 * b).cast());
        let da = *p.d.get_unchecked(b);
        for (r, acc) in acc.iter_mut().enumerate() {
            let x = w[r].get_unchecked(b);
            let ahead = (x as *const X).cast::<i8>().wrapping_add(prefetch);
            _mm_prefetch::<_MM_HINT_T1>(ahead);
            let dw = _mm256_set1_ps(f16_to_f32(d(x)) * da);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot(x, a, b)), dw, *acc);
        }
    }
    hsum4(acc)
}

/// i32 pair sums of signed x signed bytes, neither -128 on the activation
/// side (the sign trick; a weight of -128 is exact: |-128| is 128 unsigned).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i8(x: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(maddubs_signed(x, a), _mm256_set1_epi16(1))
}

/// i32 pair sums of unsigned codes (at most 129) x signed bytes, less
/// `off * sum(a)` in lane 0 (`sum` from the prepared row): `(u - off) . a`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u_off(u: __m256i, a: __m256i, off_sum: i32) -> __m256i {
    let s = _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), _mm256_set1_epi16(1));
    _mm256_sub_epi32(s, _mm256_castsi128_si256(_mm_cvtsi32_si128(off_sum)))
}

/// # Safety
/// See the module doc; `w` is four rows of `row_bytes`, `a` one activation
/// row of the same length, `p` prepared from `a` (the kernels read `p`'s
/// copy of the quants).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot4_q4_0(w: &[u8], row_bytes: usize, _a: &[u8], p: &crate::cpu::ActPrep) -> [f32; 4] {
    let rows = rows_n::<BlockQ4_0, 4>(w, row_bytes);
    dot4_blocks32(rows, p, |x, a, b| dot_u_off(nibbles_32(&x.qs), a, 8 * *p.sum.get_unchecked(b)), |x| x.d, row_bytes)
}

/// # Safety
/// As [`dot4_q4_0`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot4_q5_0(w: &[u8], row_bytes: usize, _a: &[u8], p: &crate::cpu::ActPrep) -> [f32; 4] {
    let rows = rows_n::<BlockQ5_0, 4>(w, row_bytes);
    let b4 = _mm256_set1_epi8(0x10);
    let code = |x: &BlockQ5_0| _mm256_or_si256(nibbles_32(&x.qs), _mm256_and_si256(bytes_from_bits_32(x.qh), b4));
    dot4_blocks32(rows, p, |x, a, b| dot_u_off(code(x), a, 16 * *p.sum.get_unchecked(b)), |x| x.d, row_bytes)
}

/// # Safety
/// As [`dot4_q4_0`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot4_iq4_nl(w: &[u8], row_bytes: usize, _a: &[u8], p: &crate::cpu::ActPrep) -> [f32; 4] {
    let rows = rows_n::<BlockIQ4NL, 4>(w, row_bytes);
    let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
    dot4_blocks32(rows, p, |x, a, _| dot_i8(lookup_nibbles_32(table, &x.qs), a), |x| x.d, row_bytes)
}

// ---------------------------------------------------- 256-element K kinds

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ4K>(w), blocks_of::<BlockQ8K>(a));
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = y.d * f16_to_f32(x.d);
        let dmin = y.d * f16_to_f32(x.dmin);
        let sc = k4_scales(&x.scales, dmin, &y.bsums, &mut acc_m);
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let q = loadu(x.qs.as_ptr().add(32 * j));
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let plo = _mm256_maddubs_epi16(lo, loadu(y.qs.as_ptr().add(64 * j).cast()));
            let phi = _mm256_maddubs_epi16(hi, loadu(y.qs.as_ptr().add(64 * j + 32).cast()));
            let plo = _mm256_madd_epi16(plo, _mm256_shuffle_epi8(sc, loadu(K4_WORD[2 * j].as_ptr())));
            let phi = _mm256_madd_epi16(phi, _mm256_shuffle_epi8(sc, loadu(K4_WORD[2 * j + 1].as_ptr())));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) - hsum_ps128(acc_m)
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ5K>(w), blocks_of::<BlockQ8K>(a));
    let m4 = _mm256_set1_epi8(0x0F);
    let b4 = _mm256_set1_epi8(0x10);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = y.d * f16_to_f32(x.d);
        let dmin = y.d * f16_to_f32(x.dmin);
        let sc = k4_scales(&x.scales, dmin, &y.bsums, &mut acc_m);
        let qh = loadu(x.qh.as_ptr());
        let mut sumi = _mm256_setzero_si256();
        for j in 0..4 {
            let q = loadu(x.qs.as_ptr().add(32 * j));
            let mlo = _mm256_set1_epi8((1u8 << (2 * j)) as i8);
            let mhi = _mm256_set1_epi8((2u8 << (2 * j)) as i8);
            let hlo = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, mlo), mlo), b4);
            let hhi = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, mhi), mhi), b4);
            let lo = _mm256_or_si256(_mm256_and_si256(q, m4), hlo);
            let hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hhi);
            let plo = _mm256_maddubs_epi16(lo, loadu(y.qs.as_ptr().add(64 * j).cast()));
            let phi = _mm256_maddubs_epi16(hi, loadu(y.qs.as_ptr().add(64 * j + 32).cast()));
            let plo = _mm256_madd_epi16(plo, _mm256_shuffle_epi8(sc, loadu(K4_WORD[2 * j].as_ptr())));
            let phi = _mm256_madd_epi16(phi, _mm256_shuffle_epi8(sc, loadu(K4_WORD[2 * j + 1].as_ptr())));
            sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(plo, phi));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) - hsum_ps128(acc_m)
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ6K>(w), blocks_of::<BlockQ8K>(a));
    let m4 = _mm256_set1_epi8(0x0F);
    let m2 = _mm256_set1_epi8(0x03);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(x.d) * y.d;
        // The -32 offset, taken out through the activation's 16-sums.
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.scales.as_ptr().cast()));
        let offs = _mm256_madd_epi16(sc16, _mm256_loadu_si256(y.bsums.as_ptr().cast()));
        acc_m = _mm256_fmadd_ps(_mm256_set1_ps(32.0 * d), _mm256_cvtepi32_ps(offs), acc_m);
        let halves = [_mm256_permute2x128_si256(sc16, sc16, 0x00), _mm256_permute2x128_si256(sc16, sc16, 0x11)];
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let ql0 = loadu(x.ql.as_ptr().add(64 * n));
            let ql1 = loadu(x.ql.as_ptr().add(64 * n + 32));
            let qh = loadu(x.qh.as_ptr().add(32 * n));
            let q = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4)),
                _mm256_or_si256(
                    _mm256_and_si256(ql1, m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4),
                ),
                _mm256_or_si256(
                    _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                    _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4),
                ),
            ];
            for (k, q) in q.into_iter().enumerate() {
                let p = _mm256_maddubs_epi16(q, loadu(y.qs.as_ptr().add(128 * n + 32 * k).cast()));
                let p = _mm256_madd_epi16(p, _mm256_shuffle_epi8(halves[n], loadu(K6_PAIR[k].as_ptr())));
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(_mm256_sub_ps(acc, acc_m))
}

/// ggml's 6-bit signed scale unpacking of Q3_K (before the -32).
#[inline(always)]
fn q3_k_scales(s: &[u8; 12]) -> [i8; 16] {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, t) = (w(0), w(1), w(2));
    let (k1, k2) = (0x0303_0303_u32, 0x0f0f_0f0f_u32);
    let aux = [
        (a0 & k2) | ((t & k1) << 4),
        (a1 & k2) | (((t >> 2) & k1) << 4),
        ((a0 >> 4) & k2) | (((t >> 4) & k1) << 4),
        ((a1 >> 4) & k2) | (((t >> 6) & k1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, v) in aux.iter().enumerate() {
        for (j, b) in v.to_le_bytes().iter().enumerate() {
            out[4 * i + j] = (*b as i8) - 32;
        }
    }
    out
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q3_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ3K>(w), blocks_of::<BlockQ8K>(a));
    let m2 = _mm256_set1_epi8(0x03);
    let four = _mm256_set1_epi8(4);
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(x.d) * y.d;
        let sc = q3_k_scales(&x.scales);
        let hbits = loadu(x.hmask.as_ptr());
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let q = loadu(x.qs.as_ptr().add(32 * n));
            for j in 0..4 {
                let ql = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j as i32)), m2);
                let m = _mm256_set1_epi8((1u8 << (4 * n + j)) as i8);
                // 4 where the high bit is clear: the value is ql - 4.
                let sub = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hbits, m), _mm256_setzero_si256()), four);
                let yv = loadu(y.qs.as_ptr().add(128 * n + 32 * j).cast());
                let p = _mm256_sub_epi16(_mm256_maddubs_epi16(ql, yv), _mm256_maddubs_epi16(sub, yv));
                let s = 8 * n + 2 * j;
                let p = _mm256_madd_epi16(p, lane_scales(i16::from(sc[s]), i16::from(sc[s + 1])));
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q2_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ2K>(w), blocks_of::<BlockQ8K>(a));
    let m2 = _mm256_set1_epi8(0x03);
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let d = y.d * f16_to_f32(x.d);
        let dmin = y.d * f16_to_f32(x.dmin);
        let mut summs = 0i32;
        for i in 0..16 {
            summs += i32::from(x.scales[i] >> 4) * i32::from(y.bsums[i]);
        }
        acc_m += dmin * summs as f32;
        let mut sumi = _mm256_setzero_si256();
        for n in 0..2 {
            let q = loadu(x.qs.as_ptr().add(32 * n));
            for j in 0..4 {
                let qv = _mm256_and_si256(_mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j as i32)), m2);
                let p = _mm256_maddubs_epi16(qv, loadu(y.qs.as_ptr().add(128 * n + 32 * j).cast()));
                let s = 8 * n + 2 * j;
                let p = _mm256_madd_epi16(
                    p,
                    lane_scales(i16::from(x.scales[s] & 0x0F), i16::from(x.scales[s + 1] & 0x0F)),
                );
                sumi = _mm256_add_epi32(sumi, p);
            }
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc) - acc_m
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_iq4_xs_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockIQ4XS>(w), blocks_of::<BlockQ8K>(a));
    let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
    let mut acc = _mm256_setzero_ps();
    for (x, y) in w.iter().zip(a) {
        let d = f16_to_f32(x.d) * y.d;
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let ls = ((x.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F) | ((((x.scales_h >> (2 * ib)) & 3) as u8) << 4);
            let qs: &[u8; 16] = &*x.qs.as_ptr().add(16 * ib).cast();
            let p = maddubs_signed(lookup_nibbles_32(table, qs), loadu(y.qs.as_ptr().add(32 * ib).cast()));
            let p = _mm256_madd_epi16(p, _mm256_set1_epi16(i16::from(ls) - 32));
            sumi = _mm256_add_epi32(sumi, p);
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    hsum_ps(acc)
}

// ------------------------------------------------- activation quantizers

/// Four vectors of eight i32 → 32 saturated bytes, in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_i32x32(i: [__m256i; 4]) -> __m256i {
    let p01 = _mm256_packs_epi32(i[0], i[1]);
    let p23 = _mm256_packs_epi32(i[2], i[3]);
    let p = _mm256_packs_epi16(p01, p23);
    _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn amax_32(x: &[f32]) -> f32 {
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut m = _mm256_setzero_ps();
    for k in 0..4 {
        m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(x.as_ptr().add(8 * k)), abs_mask));
    }
    let s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)))
}

/// The 32 rounded `x * id` of one legacy block, in element order, ties to
/// even (`_mm256_round_ps` to nearest, then `_mm256_cvtps_epi32`), as ggml's
/// x86 activation quantizers round (`crate::quantize_activation`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn round_block_32(x: &[f32], id: f32) -> [__m256i; 4] {
    let idv = _mm256_set1_ps(id);
    let mut r = [_mm256_setzero_si256(); 4];
    for (k, r) in r.iter_mut().enumerate() {
        let v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(8 * k)), idv), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        *r = _mm256_cvtps_epi32(v);
    }
    r
}

/// # Safety
/// AVX2/FMA/F16C; `out` is aligned and exactly `x.len() / 32` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_0(x: &[f32], out: &mut [u8]) {
    let out: &mut [BlockQ8_0] = core::slice::from_raw_parts_mut(out.as_mut_ptr().cast(), out.len() / 34);
    for (src, b) in x.chunks_exact(32).zip(out) {
        let amax = amax_32(src);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        b.d = F16::from_f32(d);
        _mm256_storeu_si256(b.qs.as_mut_ptr().cast(), pack_i32x32(round_block_32(src, id)));
    }
}

/// # Safety
/// AVX2/FMA/F16C; `out` is aligned and exactly `x.len() / 32` Q8_1 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_1(x: &[f32], out: &mut [u8]) {
    let out: &mut [BlockQ8_1] = core::slice::from_raw_parts_mut(out.as_mut_ptr().cast(), out.len() / 36);
    for (src, b) in x.chunks_exact(32).zip(out) {
        let amax = amax_32(src);
        let d = amax / 127.0;
        let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
        b.d = F16::from_f32(d);
        let r = round_block_32(src, id);
        let sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3])));
        _mm256_storeu_si256(b.qs.as_mut_ptr().cast(), pack_i32x32(r));
        b.s = F16::from_f32(sum as f32 * d);
    }
}

/// # Safety
/// AVX2/FMA/F16C; `out` is aligned and exactly `x.len() / 256` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn quantize_q8_k(x: &[f32], out: &mut [u8]) {
    let out: &mut [BlockQ8K] = core::slice::from_raw_parts_mut(out.as_mut_ptr().cast(), out.len() / 292);
    for (src, b) in x.chunks_exact(256).zip(out) {
        let mut amax = 0.0f32;
        for c in src.chunks_exact(32) {
            amax = amax.max(amax_32(c));
        }
        // ggml keeps the sign of the first element reaching the maximum.
        let max = match src.iter().find(|v| v.abs() == amax) {
            Some(&m) if amax != 0.0 => m,
            _ => {
                *b = bytemuck::Zeroable::zeroed();
                continue;
            }
        };
        let iscale = -127.0f32 / max;
        let iv = _mm256_set1_ps(iscale);
        let magic = _mm256_set1_ps(12_582_912.0);
        let mant = _mm256_set1_epi32(0x007f_ffff);
        let bias = _mm256_set1_epi32(0x0040_0000);
        let cap = _mm256_set1_epi32(127);
        for (c, dst) in src.chunks_exact(32).zip(b.qs.chunks_exact_mut(32)) {
            let mut r = [_mm256_setzero_si256(); 4];
            for (k, r) in r.iter_mut().enumerate() {
                // nearest_int: mul and add stay two roundings, as in the C.
                let v = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(c.as_ptr().add(8 * k)), iv), magic);
                let i = _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(v), mant), bias);
                *r = _mm256_min_epi32(i, cap);
            }
            _mm256_storeu_si256(dst.as_mut_ptr().cast(), pack_i32x32(r));
        }
        for (s, q) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
            *s = q.iter().map(|&v| i16::from(v)).sum();
        }
        b.d = 1.0 / iscale;
    }
}
