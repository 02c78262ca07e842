//! The AVX2 micro-kernel of the packed GEMM ([`crate::gemm`]), for CPUs
//! without AVX-512 (Zen 1–3, Haswell to Alder Lake).
//!
//! The key decision: **rows in vector lanes**, as [`gemm_8x4`] explains:
//! AVX2 has no `vpdpbusd`, and its `vpmaddubsw` saturates 16-bit pair
//! sums, so the register tile of the VNNI kernel (k positions in lanes, a
//! convert and two float ops per 32 bytes and token) spent most of its
//! issue slots outside the multiply. Eight rows in the lanes of one register
//! keep every lane's sum one row's, so integer sums run across a whole
//! sub-block before any float work, and the output needs no horizontal sum.
//! Codes up to 129 (every kind but Q8_0 and the IQ4 pair,
//! [`crate::Unpack::CODE_MAX`]) are multiplied as they are; larger ones as
//! `|w| x sign(a, w)` with `w = u - 128`, the 128 folded into the bias by
//! the caller.
//!
//! Every function here is `unsafe` for one reason, stated once: it must only
//! run on a CPU with AVX2 and FMA, with pointers as
//! [`crate::gemm::Rows8Fn`] requires.

use core::arch::x86_64::*;

use crate::gemm::{Cols4, Rows8};

/// Eight rows x four tokens over `subs` sub-blocks of `SUB` elements: row
/// `r`, token `j` into `out[j][r]`, as `sum(s * d * (u - base) . q) + bias *
/// sums` (`base` 128 with `SIGN`, else 0).
///
/// The key decision: **rows in lanes**. One 32-byte load holds four codes of
/// each of eight rows; each token's four activation bytes are broadcast to
/// all lanes, so one `vpmaddubsw` makes two products for each row, and a
/// lane's sums stay one row's. The sums of `G` groups add up in 16 bits
/// (the caller picks `G` so `G * 2 * CODE_MAX * 127 < 2^15`), then in 32
/// bits over the sub-block, and only then meet the float scales: one
/// convert and two FMAs per sub-block and token, no horizontal sum at the
/// end (each token's eight row results are one register). `SIGN`: codes up
/// to 255, taken as `w = u - 128` and multiplied as `|w| x sign(a, w)` (`G`
/// is 1: a pair sum can reach `2 * 128 * 127`).
///
/// # Safety
/// See the module doc; `w.u` covers `subs * SUB / 4` groups of 32 bytes,
/// `w.s` and `w.bias` `subs * 8` floats, `a.q` `subs * SUB / 4` groups of
/// 16 bytes (none -128) and `a.ds` `subs * 8` floats; without `SIGN`
/// every code is at most `32767 / (G * 2 * 127)`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn gemm_8x4<const SUB: usize, const G: usize, const SIGN: bool>(
    w: &Rows8,
    a: &Cols4,
    subs: usize,
    out: &mut [[f32; 8]; 4],
) {
    let (ones16, flip) = (_mm256_set1_epi16(1), _mm256_set1_epi8(-128));
    let mut facc = [_mm256_setzero_ps(); 4];
    // Group `g`'s products for the four tokens, as 16-bit pair sums.
    let products = |g: usize| -> [__m256i; 4] {
        let u = _mm256_loadu_si256(w.u.add(32 * g).cast());
        let bcast = |j: usize| _mm256_set1_epi32(a.q.add(16 * g + 4 * j).cast::<i32>().read_unaligned());
        if SIGN {
            let wq = _mm256_xor_si256(u, flip);
            let wabs = _mm256_abs_epi8(wq);
            core::array::from_fn(|j| _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(bcast(j), wq)))
        } else {
            core::array::from_fn(|j| _mm256_maddubs_epi16(u, bcast(j)))
        }
    };
    for sb in 0..subs {
        let mut iacc = [_mm256_setzero_si256(); 4];
        for gi in 0..SUB / 4 / G {
            let g0 = sb * SUB / 4 + gi * G;
            let mut p16 = products(g0);
            for t in 1..G {
                let p = products(g0 + t);
                for (acc, p) in p16.iter_mut().zip(p) {
                    *acc = _mm256_add_epi16(*acc, p);
                }
            }
            for (i, p) in iacc.iter_mut().zip(&p16) {
                *i = _mm256_add_epi32(*i, _mm256_madd_epi16(*p, ones16));
            }
        }
        let (s, bias) = (_mm256_loadu_ps(w.s.add(8 * sb)), _mm256_loadu_ps(w.bias.add(8 * sb)));
        for (j, f) in facc.iter_mut().enumerate() {
            let scale = _mm256_mul_ps(s, _mm256_set1_ps(*a.ds.add(8 * sb + j)));
            *f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[j]), scale, *f);
            *f = _mm256_fmadd_ps(bias, _mm256_set1_ps(*a.ds.add(8 * sb + 4 + j)), *f);
        }
    }
    for (o, f) in out.iter_mut().zip(&facc) {
        _mm256_storeu_ps(o.as_mut_ptr(), *f);
    }
}
