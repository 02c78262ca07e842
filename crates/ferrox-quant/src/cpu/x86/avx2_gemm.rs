//! The AVX2 micro-kernel of the packed GEMM ([`crate::gemm`]), for CPUs
//! without AVX-512 (Zen 1–3, Haswell to Alder Lake).
//!
//! The key decision: **the same exact integer lanes as VNNI's `vpdpbusd`**
//! (four u8 x s8 products a 32-bit lane) from AVX2's `vpmaddubsw`, which
//! saturates its 16-bit pair sums. The weight bytes are `u = q + OFFSET` in
//! 0..=255. Where a kind's codes stay at most 129 (every kind but Q8_0 and
//! the IQ4 pair) no pair sum can saturate and they are multiplied as they
//! are ([`gemm_u7s8_4x4`]). Otherwise they are taken as `w = u - 128` (a
//! sign flip of the top bit) and multiplied as `|w| x sign(a, w)`: each pair
//! sum is at most `2 * 128 * 127 < 2^15`, exact; the caller folds the 128
//! into the sub-block bias (`base`, [`super::avx2_gemm_tile`]), so the tile
//! adds no `128 * sum(a)` term. Sixteen registers hold a 4 x 2 tile of
//! accumulators, so the 4 x 4 tile is two passes over the rows' bytes (read
//! from L1 the second time).
//!
//! Every function here is `unsafe` for one reason, stated once: it must only
//! run on a CPU with AVX2 and FMA, with pointers as
//! [`crate::gemm::TileFn`] requires.

use core::arch::x86_64::*;

use crate::gemm::{TileCols, TileRows, CHUNK, RM, RN};

/// The sum of a vector's eight lanes.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gemm_u8s8_4x4(w: &TileRows, a: &TileCols, chunks: usize, sub_chunks: usize, out: &mut [[f32; RN]; RM]) {
    tile::<false>(w, a, chunks, sub_chunks, out)
}

/// [`gemm_u8s8_4x4`] for kinds whose codes are at most 129
/// ([`crate::Unpack::CODE_MAX`]: every kind but Q8_0 and the IQ4 pair): a
/// pair sum `u0 * a0 + u1 * a1` then stays under 2^15, so `vpmaddubsw`
/// takes the codes as they are, with no sign flip and no `abs`/`sign`
/// (five vector ops per 32 bytes and token where the general tile needs six).
///
/// # Safety
/// See the module doc; every weight byte is at most 129.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gemm_u7s8_4x4(w: &TileRows, a: &TileCols, chunks: usize, sub_chunks: usize, out: &mut [[f32; RN]; RM]) {
    tile::<true>(w, a, chunks, sub_chunks, out)
}

/// The tile; `SMALL`: the codes are at most 129 (taken unsigned as they are).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const SMALL: bool>(w: &TileRows, a: &TileCols, chunks: usize, sub_chunks: usize, out: &mut [[f32; RN]; RM]) {
    let (ones16, flip) = (_mm256_set1_epi16(1), _mm256_set1_epi8(-128));
    for pass in 0..RN / 2 {
        let cols = [2 * pass, 2 * pass + 1];
        let mut acc = [[_mm256_setzero_ps(); 2]; RM];
        for ch in 0..chunks {
            for half in 0..2 {
                let (ob, of) = (ch * CHUNK + 32 * half, ch * CHUNK / 4 + 8 * half);
                let aq: [__m256i; 2] = core::array::from_fn(|j| _mm256_loadu_si256(a.q[cols[j]].add(ob).cast()));
                let ad: [__m256; 2] = core::array::from_fn(|j| _mm256_loadu_ps(a.d[cols[j]].add(of)));
                if SMALL {
                    for (r, accr) in acc.iter_mut().enumerate() {
                        let u = _mm256_loadu_si256(w.u[r].add(ob).cast());
                        let ws = _mm256_loadu_ps(w.s[r].add(of));
                        for j in 0..2 {
                            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, aq[j]), ones16);
                            accr[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(ws, ad[j]), accr[j]);
                        }
                    }
                    continue;
                }
                for (r, accr) in acc.iter_mut().enumerate() {
                    let wq = _mm256_xor_si256(_mm256_loadu_si256(w.u[r].add(ob).cast()), flip);
                    let wabs = _mm256_abs_epi8(wq);
                    let ws = _mm256_loadu_ps(w.s[r].add(of));
                    for j in 0..2 {
                        let pairs = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(aq[j], wq));
                        let p = _mm256_madd_epi16(pairs, ones16);
                        accr[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_mul_ps(ws, ad[j]), accr[j]);
                    }
                }
            }
        }
        // The bias term: a dot over sub-blocks, into the same lanes.
        for ch in 0..sub_chunks {
            for half in 0..2 {
                let o = ch * 16 + 8 * half;
                let s: [__m256; 2] = core::array::from_fn(|j| _mm256_loadu_ps(a.sums[cols[j]].add(o)));
                for (r, accr) in acc.iter_mut().enumerate() {
                    let wb = _mm256_loadu_ps(w.bias[r].add(o));
                    for j in 0..2 {
                        accr[j] = _mm256_fmadd_ps(wb, s[j], accr[j]);
                    }
                }
            }
        }
        for (r, accr) in acc.iter().enumerate() {
            for j in 0..2 {
                out[r][cols[j]] = hsum(accr[j]);
            }
        }
    }
}
