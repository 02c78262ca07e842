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

use super::avx2::{bytes_from_bits_32, f16_to_f32, loadu, lookup_nibbles_32, nibbles_32, KVALUES_IQ4NL};
use crate::blocks::{BlockIQ4NL, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ5K, BlockQ5_0, BlockQ6K, BlockQ8_0};
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
        scale_sub(w, a, sb, &iacc, &mut facc);
    }
    for (o, f) in out.iter_mut().zip(&facc) {
        _mm256_storeu_ps(o.as_mut_ptr(), *f);
    }
}

/// Sub-block `sb`'s integer sums of the four tokens (`iacc`, rows in
/// lanes) into their float accumulators: times the rows' scales and the
/// token's, plus the rows' biases times the token's `d * sum`.
///
/// # Safety
/// As [`gemm_8x4`].
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn scale_sub(w: &Rows8, a: &Cols4, sb: usize, iacc: &[__m256i; 4], facc: &mut [__m256; 4]) {
    let (s, bias) = (_mm256_loadu_ps(w.s.add(8 * sb)), _mm256_loadu_ps(w.bias.add(8 * sb)));
    for (j, f) in facc.iter_mut().enumerate() {
        let scale = _mm256_mul_ps(s, _mm256_set1_ps(*a.ds.add(8 * sb + j)));
        *f = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[j]), scale, *f);
        *f = _mm256_fmadd_ps(bias, _mm256_set1_ps(*a.ds.add(8 * sb + 4 + j)), *f);
    }
}

/// [`gemm_8x4`] on a CPU with AVX-512 VNNI (Zen 4, Ice Lake and later
/// without AMX), in 256-bit registers: `vpdpbusd` multiplies four
/// code/activation byte pairs and adds them into a 32-bit lane in one
/// instruction, where AVX2 needs `vpmaddubsw`, a 16-bit add per group and
/// `vpmaddwd` against ones. Nothing saturates on the way (each product
/// quadruple sums in 32 bits), so every group of a sub-block goes straight
/// into its token's accumulator and the sums are the AVX2 kernel's, bit
/// for bit. `SIGN` as there: `|w| x sign(a, w)`, still exact in 32 bits.
///
/// # Safety
/// As [`gemm_8x4`], on a CPU with AVX-512 F, VL and VNNI.
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemm_8x4_vnni<const SUB: usize, const SIGN: bool>(
    w: &Rows8,
    a: &Cols4,
    subs: usize,
    out: &mut [[f32; 8]; 4],
) {
    gemm_groups_x4_vnni::<1, SUB, SIGN>([w], a, subs, core::array::from_mut(out))
}

/// [`gemm_8x4_vnni`] over two eight-row groups at once (`w[0]`, `w[1]`):
/// each token's four activation bytes are broadcast once for sixteen rows.
/// The eight-row tile spends a broadcast load on every `vpdpbusd`, five
/// loads to four products a group; two groups make it six to eight, so
/// the loads no longer bound the products on a core that loads two
/// vectors a cycle (Zen 4). Every row's sums are [`gemm_8x4_vnni`]'s, bit
/// for bit (the same products, in the same order, a row a lane).
///
/// # Safety
/// As [`gemm_8x4_vnni`], for both groups.
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemm_16x4_vnni<const SUB: usize, const SIGN: bool>(
    w: [&Rows8; 2],
    a: &Cols4,
    subs: usize,
    out: &mut [[[f32; 8]; 4]; 2],
) {
    gemm_groups_x4_vnni::<2, SUB, SIGN>(w, a, subs, out)
}

/// The `vpdpbusd` tile over `N` eight-row groups, group `h` into `out[h]`:
/// each token's broadcast feeds every group's product.
///
/// # Safety
/// As [`gemm_8x4_vnni`], for every group.
#[inline]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl,avx512vnni")]
unsafe fn gemm_groups_x4_vnni<const N: usize, const SUB: usize, const SIGN: bool>(
    w: [&Rows8; N],
    a: &Cols4,
    subs: usize,
    out: &mut [[[f32; 8]; 4]; N],
) {
    let flip = _mm256_set1_epi8(-128);
    let mut facc = [[_mm256_setzero_ps(); 4]; N];
    for sb in 0..subs {
        let mut iacc = [[_mm256_setzero_si256(); 4]; N];
        for g in sb * SUB / 4..(sb + 1) * SUB / 4 {
            let u: [__m256i; N] = core::array::from_fn(|h| _mm256_loadu_si256(w[h].u.add(32 * g).cast()));
            for j in 0..4 {
                let b = _mm256_set1_epi32(a.q.add(16 * g + 4 * j).cast::<i32>().read_unaligned());
                for (acc, &u) in iacc.iter_mut().zip(&u) {
                    acc[j] = if SIGN {
                        let wq = _mm256_xor_si256(u, flip);
                        _mm256_dpbusd_epi32(acc[j], _mm256_abs_epi8(wq), _mm256_sign_epi8(b, wq))
                    } else {
                        _mm256_dpbusd_epi32(acc[j], u, b)
                    };
                }
            }
        }
        for ((w, iacc), facc) in w.iter().zip(&iacc).zip(facc.iter_mut()) {
            scale_sub(w, a, sb, iacc, facc);
        }
    }
    for (out, facc) in out.iter_mut().zip(&facc) {
        for (o, f) in out.iter_mut().zip(facc) {
            _mm256_storeu_ps(o.as_mut_ptr(), *f);
        }
    }
}

/// Eight 8-dword rows transposed: `out[g]` holds dword `g` of every row,
/// row order (what [`gemm_8x4`]'s panel needs of eight rows' 32 codes).
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn transpose8(v: [__m256i; 8]) -> [__m256i; 8] {
    let t: [__m256i; 8] = core::array::from_fn(|i| {
        let (a, b) = (v[i / 2 * 2], v[i / 2 * 2 + 1]);
        if i % 2 == 0 { _mm256_unpacklo_epi32(a, b) } else { _mm256_unpackhi_epi32(a, b) }
    });
    // u[k]: dwords k and k + 4 of rows 0..4 (k < 4) or 4..8 (k >= 4), one per 128-bit lane.
    let u: [__m256i; 8] = core::array::from_fn(|k| {
        let (h, k) = (k / 4 * 4, k % 4);
        let (a, b) = (t[h + k / 2], t[h + k / 2 + 2]);
        if k % 2 == 0 { _mm256_unpacklo_epi64(a, b) } else { _mm256_unpackhi_epi64(a, b) }
    });
    core::array::from_fn(|g| {
        if g < 4 {
            _mm256_permute2x128_si256::<0x20>(u[g], u[g + 4])
        } else {
            _mm256_permute2x128_si256::<0x31>(u[g - 4], u[g])
        }
    })
}

/// Eight rows of a 32-element kind into [`gemm_8x4`]'s panel: `u` the codes
/// (`q + OFFSET`, rows interleaved four at a time: `8 * 32` bytes a block),
/// `s` each block's scale for the eight rows (8 floats a block). `codes`
/// gives a block's 32 codes in element order, `scale` its scale; the kind's
/// own bias is zero.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack8<B>(rows: [&[B]; 8], u: &mut [u8], s: &mut [f32], codes: impl Fn(&B) -> __m256i, scale: impl Fn(&B) -> f32) {
    for b in 0..rows[0].len() {
        let groups = transpose8(core::array::from_fn(|r| codes(rows[r].get_unchecked(b))));
        for (g, v) in groups.iter().enumerate() {
            _mm256_storeu_si256(u.as_mut_ptr().add(256 * b + 32 * g).cast(), *v);
        }
        for (r, row) in rows.iter().enumerate() {
            *s.get_unchecked_mut(8 * b + r) = scale(row.get_unchecked(b));
        }
    }
}

/// Q4_K and Q5_K's eight sub-blocks' scales `d * sc` and own biases
/// `-(dmin * m)`, as their scalar `Unpack` computes them.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_head(d: crate::blocks::F16, dmin: crate::blocks::F16, scales: &[u8; 12]) -> [(f32, f32); 8] {
    let (sc, m) = crate::scalar::k4_scales_mins(scales);
    let (d, dmin) = (f16_to_f32(d), f16_to_f32(dmin));
    core::array::from_fn(|j| (d * f32::from(sc[j]), -(dmin * f32::from(m[j]))))
}

/// Sub-block `j`'s 32 nibbles of Q4_K/Q5_K's `qs`: bytes `32 * (j / 2)..`,
/// the low nibbles for even `j`, the high for odd.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k4_nibbles(qs: &[u8; 128], j: usize) -> __m256i {
    let q = loadu(qs.as_ptr().add(32 * (j / 2)));
    let q = if j.is_multiple_of(2) { q } else { _mm256_srli_epi16::<4>(q) };
    _mm256_and_si256(q, _mm256_set1_epi8(0x0F))
}

/// # Safety
/// AVX2, FMA, F16C; `rows` are eight rows of whole aligned Q4_K blocks of
/// one length; `u` holds 2048 bytes and `s` and `bias` 64 floats a block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack8_q4_k(rows: &[&[u8]; 8], u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    pack8_k(rows8_of::<BlockQ4K>(rows), u, s, bias, |x, j| k4_nibbles(&x.qs, j), |x| k4_head(x.d, x.dmin, &x.scales))
}

/// # Safety
/// As [`pack8_q4_k`], for Q5_K: sub-block `j`'s fifth bits are bit `j` of
/// `qh`'s 32 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack8_q5_k(rows: &[&[u8]; 8], u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    let codes = |x: &BlockQ5K, j: usize| _mm256_or_si256(k4_nibbles(&x.qs, j), where_bit(&x.qh, j, 0x10));
    pack8_k(rows8_of::<BlockQ5K>(rows), u, s, bias, codes, |x| k4_head(x.d, x.dmin, &x.scales))
}

/// Eight rows of a K-quant (256-element blocks of `SUBS` sub-blocks)
/// into [`gemm_8x4`]'s panel, as the scalar `pack_row` makes it:
/// `codes(x, m)` gives a block's 32-element run `m` in element order, laid
/// out as [`pack8`] lays a 32-element block; `head(x)` each sub-block's
/// scale and own bias (the code offset not folded in).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack8_k<B, const SUBS: usize>(
    rows: [&[B]; 8],
    u: &mut [u8],
    s: &mut [f32],
    bias: &mut [f32],
    codes: impl Fn(&B, usize) -> __m256i,
    head: impl Fn(&B) -> [(f32, f32); SUBS],
) {
    for b in 0..rows[0].len() {
        for m in 0..8 {
            let groups = transpose8(core::array::from_fn(|r| codes(rows[r].get_unchecked(b), m)));
            for (g, v) in groups.iter().enumerate() {
                _mm256_storeu_si256(u.as_mut_ptr().add(256 * (8 * b + m) + 32 * g).cast(), *v);
            }
        }
        for (r, row) in rows.iter().enumerate() {
            for (j, (sc, bi)) in head(row.get_unchecked(b)).into_iter().enumerate() {
                *s.get_unchecked_mut(8 * (SUBS * b + j) + r) = sc;
                *bias.get_unchecked_mut(8 * (SUBS * b + j) + r) = bi;
            }
        }
    }
}

/// `value` in each of 32 bytes whose bit `bit` is set in `bytes`, else 0
/// (Q5_K's fifth bits, Q3_K's high bits).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn where_bit(bytes: &[u8; 32], bit: usize, value: i8) -> __m256i {
    let b = _mm256_set1_epi8((1u8 << bit) as i8);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(loadu(bytes.as_ptr()), b), b);
    _mm256_and_si256(set, _mm256_set1_epi8(value))
}

/// Run `m`'s low two bits of Q2_K/Q3_K's `qs`: bits `2(m % 4)..` of bytes
/// `32 * (m / 4)..`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn two_bits(qs: &[u8; 64], m: usize) -> __m256i {
    let q = _mm256_srl_epi16(loadu(qs.as_ptr().add(32 * (m / 4))), _mm_cvtsi32_si128(2 * (m % 4) as i32));
    _mm256_and_si256(q, _mm256_set1_epi8(0x03))
}

/// # Safety
/// As [`pack8_q4_k`], for Q6_K (16 floats a block in `s` and `bias` a
/// row: sixteen sub-blocks of 16). Its 32-element runs `m = 4h + i` (half
/// `h` of the block) are `ql[64h + 32(i % 2)..]`'s low nibbles for `i < 2`,
/// else the high ones, with bits `2i..2i + 2` of `qh[32h..]` on top; the
/// code is the stored six bits (`q + 32`). The kind has no bias.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack8_q6_k(rows: &[&[u8]; 8], u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    let codes = |x: &BlockQ6K, m: usize| {
        let (h, i) = (m / 4, m % 4);
        let ql = loadu(x.ql.as_ptr().add(64 * h + 32 * (i % 2)));
        let ql = if i < 2 { ql } else { _mm256_srli_epi16::<4>(ql) };
        let qh = _mm256_srl_epi16(loadu(x.qh.as_ptr().add(32 * h)), _mm_cvtsi32_si128(2 * i as i32));
        let top = _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(0x03)));
        _mm256_or_si256(_mm256_and_si256(ql, _mm256_set1_epi8(0x0F)), top)
    };
    let head = |x: &BlockQ6K| -> [(f32, f32); 16] {
        let d = f16_to_f32(x.d);
        core::array::from_fn(|j| (d * f32::from(x.scales[j]), 0.0))
    };
    pack8_k(rows8_of::<BlockQ6K>(rows), u, s, bias, codes, head)
}

/// # Safety
/// As [`pack8_q6_k`], for Q3_K: run `m`'s codes (`q + 4`) are its two low
/// bits plus 4 where bit `m` of `hmask`'s byte is set.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack8_q3_k(rows: &[&[u8]; 8], u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    let codes = |x: &BlockQ3K, m: usize| _mm256_or_si256(two_bits(&x.qs, m), where_bit(&x.hmask, m, 0x04));
    let head = |x: &BlockQ3K| -> [(f32, f32); 16] {
        let (d, sc) = (f16_to_f32(x.d), crate::scalar::q3_scales(&x.scales));
        core::array::from_fn(|j| (d * f32::from(sc[j]), 0.0))
    };
    pack8_k(rows8_of::<BlockQ3K>(rows), u, s, bias, codes, head)
}

/// # Safety
/// As [`pack8_q6_k`], for Q2_K: the codes are the two bits; each
/// sub-block's scale is `d` times its low nibble, its bias `-dmin` times
/// its high one.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack8_q2_k(rows: &[&[u8]; 8], u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    let head = |x: &BlockQ2K| -> [(f32, f32); 16] {
        let (d, min) = (f16_to_f32(x.d), f16_to_f32(x.dmin));
        core::array::from_fn(|j| (d * f32::from(x.scales[j] & 0xF), -(min * f32::from(x.scales[j] >> 4))))
    };
    pack8_k(rows8_of::<BlockQ2K>(rows), u, s, bias, |x, m| two_bits(&x.qs, m), head)
}

/// The eight rows `rows` (whole blocks of `B`, aligned) as slices of `B`.
#[inline]
unsafe fn rows8_of<'a, B: crate::blocks::Block>(rows: &[&'a [u8]; 8]) -> [&'a [B]; 8] {
    core::array::from_fn(|r| crate::cpu::blocks_of::<B>(rows[r]))
}

/// # Safety
/// AVX2, FMA, F16C; `rows` are eight rows of whole aligned Q4_0 blocks of
/// one length; `u` holds `256` bytes and `s` 8 floats per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack8_q4_0(rows: &[&[u8]; 8], u: &mut [u8], s: &mut [f32]) {
    pack8(rows8_of::<BlockQ4_0>(rows), u, s, |x| nibbles_32(&x.qs), |x| f16_to_f32(x.d))
}

/// # Safety
/// As [`pack8_q4_0`], for Q5_0.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack8_q5_0(rows: &[&[u8]; 8], u: &mut [u8], s: &mut [f32]) {
    let b4 = _mm256_set1_epi8(0x10);
    let codes = |x: &BlockQ5_0| _mm256_or_si256(nibbles_32(&x.qs), _mm256_and_si256(bytes_from_bits_32(x.qh), b4));
    pack8(rows8_of::<BlockQ5_0>(rows), u, s, codes, |x| f16_to_f32(x.d))
}

/// # Safety
/// As [`pack8_q4_0`], for Q8_0.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack8_q8_0(rows: &[&[u8]; 8], u: &mut [u8], s: &mut [f32]) {
    let flip = _mm256_set1_epi8(-128);
    // `q + 128` is `q ^ 0x80` for every byte.
    pack8(rows8_of::<BlockQ8_0>(rows), u, s, |x| _mm256_xor_si256(loadu(x.qs.as_ptr().cast()), flip), |x| f16_to_f32(x.d))
}

/// # Safety
/// As [`pack8_q4_0`], for IQ4_NL.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn pack8_iq4_nl(rows: &[&[u8]; 8], u: &mut [u8], s: &mut [f32]) {
    let (table, flip) = (_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()), _mm256_set1_epi8(-128));
    pack8(rows8_of::<BlockIQ4NL>(rows), u, s, |x| _mm256_xor_si256(lookup_nibbles_32(table, &x.qs), flip), |x| f16_to_f32(x.d))
}
