//! Q8_0 matrices interleaved 16 rows at a time for the decode matvec.
//!
//! The key decision: per 16-row group and block, the 16 rows' f16 scales
//! (32 bytes), then the quants as `vpdpbusd` wants them — for each 4
//! elements, the 16 rows' 4 bytes side by side (one 64-byte load), made
//! unsigned by flipping the sign bit (`q + 128`, exact for every byte).
//! One load and one `vpdpbusd` then cover 16 rows x 4 elements against a
//! broadcast of 4 activation bytes, the sums land one row per lane (no
//! horizontal sums), and the `128 * sum(a)` the flip adds is one subtraction
//! per block. About a seventh of the instructions per byte of the
//! row-major four-row kernel: decode streams the weights, and fewer
//! instructions per byte keep more loads in flight. The same size as the
//! stored matrix (544 bytes per 16 rows x 32 elements).
//!
//! AVX2 CPUs read the same layout eight rows per register
//! ([`group_dot_avx2`]): `vpmaddubsw` saturates, so the codes go back to
//! signed and take the sign trick, still one row per lane and no
//! horizontal sums (about 6 vector ops per 32 bytes where the one-row Q8_0
//! kernel needs about 16 per block).
//!
//! Every function here is `unsafe` for one reason, stated once: it must only
//! run on a CPU with the features its `target_feature` names.

use core::arch::x86_64::*;

/// Bytes per 16-row group and block: 16 f16 scales, then 16 x 32 quants.
pub(crate) const GROUP_BLOCK: usize = 32 + 512;

/// Interleaves `rows` (a multiple of 16) rows of Q8_0 blocks (`row_bytes`
/// each) into `out` (the same length).
pub(crate) fn interleave(src: &[u8], rows: usize, row_bytes: usize, out: &mut [u8]) {
    let nb = row_bytes / 34;
    for g in 0..rows / 16 {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * GROUP_BLOCK..][..GROUP_BLOCK];
            for r in 0..16 {
                let blk = &src[(g * 16 + r) * row_bytes + b * 34..][..34];
                dst[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
                for k4 in 0..8 {
                    for e in 0..4 {
                        dst[32 + k4 * 64 + r * 4 + e] = blk[2 + k4 * 4 + e] ^ 0x80;
                    }
                }
            }
        }
    }
}

/// Row `lane` of group `w` (`nb` blocks, interleaved) dequantized into
/// `out` (`nb * 32` values), `d * q` as the stored blocks give it.
pub(crate) fn dequantize_row(w: &[u8], nb: usize, lane: usize, out: &mut [f32]) {
    for (blk, o) in w.chunks_exact(GROUP_BLOCK).take(nb).zip(out.chunks_exact_mut(32)) {
        let d = half::f16::from_le_bytes([blk[2 * lane], blk[2 * lane + 1]]).to_f32();
        for (e, v) in o.iter_mut().enumerate() {
            let q = (blk[32 + (e / 4) * 64 + lane * 4 + e % 4] ^ 0x80) as i8;
            *v = d * f32::from(q);
        }
    }
}

/// The 16 rows of group `w` (`nb` blocks, interleaved) against one Q8_0
/// activation row `a` (its blocks' scales `d` and quant sums `sum`).
///
/// # Safety
/// See the module doc; `w` holds `nb * GROUP_BLOCK` bytes, `a` `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn group_dot(w: &[u8], nb: usize, a: &[u8], d: &[f32], sum: &[i32], prefetch: usize) -> [f32; 16] {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let mut acc = _mm512_setzero_ps();
    for b in 0..nb {
        let blk = wp.add(b * GROUP_BLOCK);
        for l in (0..GROUP_BLOCK).step_by(64) {
            _mm_prefetch::<_MM_HINT_T1>(blk.cast::<i8>().wrapping_add(prefetch + l));
        }
        let aq = ap.add(b * 34 + 2);
        // Two chains of four products (the second starts at zero): half the
        // dependent latency of one chain of eight.
        let (mut s, mut s2) = (_mm512_set1_epi32(-128 * sum[b]), _mm512_setzero_si512());
        let word = |k4: usize| _mm512_set1_epi32(aq.add(4 * k4).cast::<i32>().read_unaligned());
        for k4 in (0..8).step_by(2) {
            s = _mm512_dpbusd_epi32(s, _mm512_loadu_si512(blk.add(32 + 64 * k4).cast()), word(k4));
            s2 = _mm512_dpbusd_epi32(s2, _mm512_loadu_si512(blk.add(96 + 64 * k4).cast()), word(k4 + 1));
        }
        let s = _mm512_add_epi32(s, s2);
        let scale = _mm512_cvtph_ps(_mm256_loadu_si256(blk.cast()));
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(scale, _mm512_set1_ps(d[b])), acc);
    }
    let mut out = [0f32; 16];
    _mm512_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// [`group_dot`] for AVX2: each 64-byte group is two halves of eight rows;
/// the codes go back to signed (`^ 0x80`) and are multiplied as
/// `|w| x sign(a, w)` (`vpmaddubsw` saturates unsigned codes; a weight of
/// -128 is exact, an activation never is -128). A block's sums stay in 32
/// bits until its scales, as in [`group_dot`].
///
/// # Safety
/// See the module doc; `w` holds `nb * GROUP_BLOCK` bytes, `a` `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn group_dot_avx2(w: &[u8], nb: usize, a: &[u8], d: &[f32], prefetch: usize) -> [f32; 16] {
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    let (flip, ones) = (_mm256_set1_epi8(-128), _mm256_set1_epi16(1));
    let mut acc = [_mm256_setzero_ps(); 2];
    for b in 0..nb {
        let blk = wp.add(b * GROUP_BLOCK);
        for l in (0..GROUP_BLOCK).step_by(64) {
            _mm_prefetch::<_MM_HINT_T1>(blk.cast::<i8>().wrapping_add(prefetch + l));
        }
        let aq = ap.add(b * 34 + 2);
        let mut s = [_mm256_setzero_si256(); 2];
        for k4 in 0..8 {
            let word = _mm256_set1_epi32(aq.add(4 * k4).cast::<i32>().read_unaligned());
            for (h, s) in s.iter_mut().enumerate() {
                let q = _mm256_xor_si256(_mm256_loadu_si256(blk.add(32 + 64 * k4 + 32 * h).cast()), flip);
                let p = _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(word, q));
                *s = _mm256_add_epi32(*s, _mm256_madd_epi16(p, ones));
            }
        }
        let da = _mm256_set1_ps(*d.get_unchecked(b));
        for (h, acc) in acc.iter_mut().enumerate() {
            let scale = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16 * h).cast()));
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[h]), _mm256_mul_ps(scale, da), *acc);
        }
    }
    let mut out = [0f32; 16];
    _mm256_storeu_ps(out.as_mut_ptr(), acc[0]);
    _mm256_storeu_ps(out.as_mut_ptr().add(8), acc[1]);
    out
}
