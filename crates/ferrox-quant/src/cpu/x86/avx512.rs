//! AVX-512 VNNI kernels for the 32-element block kinds and the K kinds.
//!
//! The key decision: width follows the block. The 32-element kinds' one-row
//! kernels stay at 256 bits (`avx512vl`) and use VNNI's `vpdpbusd` for the
//! 8-bit products, one instruction where AVX2 needs `maddubs` + `madd`;
//! their block (32 elements, one scale) maps to one 256-bit register. Their
//! four-row kernels (decode) take two blocks per 512-bit step, against a
//! copy of the activation's quants that puts two blocks side by side (see
//! "four rows at once"). The K kinds (256-element super-blocks) take 64
//! elements per 512-bit step, with `vpdpwssd` applying the sub-block scales
//! (see "256-element K kinds, 512 bits" below). Kinds without a kernel here
//! fall back to AVX2 (see `Isa::fallback`).
//!
//! Every function here is `unsafe` for one reason, stated once: it must only
//! run on a CPU with AVX2, FMA, F16C and AVX-512 F/BW/VL/VNNI, and its slices
//! follow the [`super::super::DotFn`] contract.

use core::arch::x86_64::*;

use super::avx2::{
    bytes_from_bits_32, e8m0_half, f16_to_f32, hsum_ps, hsum_ps128, loadu, lookup_nibbles_32, nibbles_32,
    KVALUES_IQ4NL, E2M1_X2,
};
use crate::blocks::*;
use crate::cpu::{blocks_of, rows_n};

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

/// Q5_1 against Q8_1: the codes are unsigned (0..31), so they go straight
/// into `vpdpbusd`; each block's `m * s` is summed apart.
///
/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q5_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ5_1>(w), blocks_of::<BlockQ8_1>(a));
    let b4 = _mm256_set1_epi8(0x10);
    let mins: f32 = w.iter().zip(a).map(|(x, y)| f16_to_f32(x.m) * f16_to_f32(y.s)).sum();
    mins + sum_blocks(w, a, |x, y| {
        let d = _mm256_set1_ps(f16_to_f32(x.d) * f16_to_f32(y.d));
        let qx = _mm256_or_si256(nibbles_32(&x.qs), _mm256_and_si256(bytes_from_bits_32(x.qh), b4));
        let s = _mm256_dpbusd_epi32(_mm256_setzero_si256(), qx, loadu(y.qs.as_ptr().cast()));
        (d, _mm256_cvtepi32_ps(s))
    })
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_iq4_nl_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockIQ4NL>(w), blocks_of::<BlockQ8_0>(a));
    let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
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
    let table = _mm_loadu_si128(E2M1_X2.as_ptr().cast());
    sum_blocks(w, a, |x, y| {
        let d = _mm256_set1_ps(f16_to_f32(y.d) * e8m0_half(x.e));
        (d, dot_i8_float(lookup_nibbles_32(table, &x.qs), loadu(y.qs.as_ptr().cast())))
    })
}

// ------------------------------------------------------- four rows at once
//
// Decode reads every weight once and Gemma-sized rows are short (20–64
// blocks), so a kernel call per row pays its setup per 700–2200 bytes. These
// kernels take four consecutive rows against one activation row, two
// 32-element blocks per 512-bit step: each activation pair is one 64-byte
// load (`ActPrep::qs`, the quants without their scales) shared by four
// rows, its scales are converted once per matvec (`ActPrep`), weight scales
// go through a table rather than a conversion each, and no kind needs the
// sign trick (which has no 512-bit form): weight codes are made unsigned,
// `q + offset`, they feed `vpdpbusd` directly and the offset comes back as
// `-offset * sum(a)` in the first lane of each block's half. Per pair and
// row that is about 13 instructions where one block at a time in 256 bits
// took about 22 (Q4_0 layers of Gemma 3 270M: ~23 GB/s, instruction-bound).

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

/// The upper eight f32/i32 lanes of a `zmm`: the second block of a pair.
const HI_LANES: __mmask16 = 0xFF00;

/// The four rows' sums of `v` (one row per register), in one reduction:
/// two rounds of 128-bit lane shuffles leave row `r`'s partials in lane `r`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn hsum4_512(v: [__m512; 4]) -> [f32; 4] {
    // Lanes [r0.0+r0.2, r0.1+r0.3, r1.0+r1.2, r1.1+r1.3], and for r2, r3.
    let s01 = _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(v[0], v[1]), _mm512_shuffle_f32x4::<0b11_10_11_10>(v[0], v[1]));
    let s23 = _mm512_add_ps(_mm512_shuffle_f32x4::<0b01_00_01_00>(v[2], v[3]), _mm512_shuffle_f32x4::<0b11_10_11_10>(v[2], v[3]));
    // Lane r: row r's four partials.
    let t = _mm512_add_ps(_mm512_shuffle_f32x4::<0b10_00_10_00>(s01, s23), _mm512_shuffle_f32x4::<0b11_01_11_01>(s01, s23));
    let t = _mm512_add_ps(t, _mm512_permute_ps::<0b01_00_11_10>(t));
    let t = _mm512_add_ps(t, _mm512_permute_ps::<0b10_11_00_01>(t));
    let r = _mm512_castps512_ps128(_mm512_permutexvar_ps(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), t));
    let mut out = [0f32; 4];
    _mm_storeu_ps(out.as_mut_ptr(), r);
    out
}

/// Four rows of `nb` blocks against one activation row prepared as `p`, two
/// blocks per step. `code` turns two weight blocks into their 64 unsigned
/// codes `q + off` (the first block's in the low 256 bits, each block's
/// elements in order); `d` reads a block's f16 scale bits. With `MIN` (the
/// kinds with a per-block min, Q5_1 against Q8_1) each block also adds
/// `m * s`, `m` its min's f16 bits and `s` the activation block's `d *
/// sum` (`p.s`). The rows are `row_bytes` apart, and the rows
/// `PREFETCH_ROWS` further on are prefetched.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot4_pairs<X, const MIN: bool>(
    w: [&[X]; 4],
    p: &crate::cpu::ActPrep,
    off: i32,
    code: impl Fn(&X, &X) -> __m512i,
    d: impl Fn(&X) -> u16,
    m: impl Fn(&X) -> u16,
    row_bytes: usize,
) -> [f32; 4] {
    let nb = w[0].len();
    debug_assert!(p.d.len() == nb && p.qs.len() >= nb.next_multiple_of(2) * 32);
    let prefetch = crate::cpu::PREFETCH_ROWS * row_bytes;
    let table = f16_table();
    let aq = p.qs.as_ptr();
    let mut acc = [_mm512_setzero_ps(); 4];
    let mut mins = [0f32; 4];
    for b in (0..nb).step_by(2) {
        // An odd row's last block pairs with itself: its twin's activation
        // (`qs`'s zero padding), offset sum and scale are zero.
        let (b1, da1, sum1) = if b + 1 < nb { (b + 1, p.d[b + 1], p.sum[b + 1]) } else { (b, 0.0, 0) };
        let a = _mm512_loadu_si512(aq.add(32 * b).cast());
        let da = _mm512_mask_mov_ps(_mm512_set1_ps(p.d[b]), HI_LANES, _mm512_set1_ps(da1));
        let init = _mm512_mask_set1_epi32(_mm512_maskz_set1_epi32(1, -off * p.sum[b]), 0x0100, -off * sum1);
        for r in 0..4 {
            let (x0, x1) = (w[r].get_unchecked(b), w[r].get_unchecked(b1));
            // The next rows' pair: more misses in flight than the hardware
            // prefetcher keeps for one core (a hint; never faults). Into
            // L2, as the one-row path does: an L1 prefetch holds one of the
            // core's few fill buffers for the whole trip to DRAM (measured
            // on the Gemma head: ~25 vs ~23 GB/s, 2 threads). A pair wider
            // than a line (Q8_0) takes a second one.
            let ahead = (x0 as *const X).cast::<i8>().wrapping_add(prefetch);
            _mm_prefetch::<_MM_HINT_T1>(ahead);
            if 2 * core::mem::size_of::<X>() > 64 {
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(2 * core::mem::size_of::<X>() - 1));
            }
            let s = _mm512_dpbusd_epi32(init, code(x0, x1), a);
            let dw0 = _mm512_set1_ps(*table.get_unchecked(usize::from(d(x0))));
            let dw = _mm512_mask_mov_ps(dw0, HI_LANES, _mm512_set1_ps(*table.get_unchecked(usize::from(d(x1)))));
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, da), acc[r]);
            if MIN {
                let s1 = if b + 1 < nb { *p.s.get_unchecked(b + 1) } else { 0.0 };
                mins[r] += *table.get_unchecked(usize::from(m(x0))) * *p.s.get_unchecked(b)
                    + *table.get_unchecked(usize::from(m(x1))) * s1;
            }
        }
    }
    let sums = hsum4_512(acc);
    core::array::from_fn(|r| sums[r] + mins[r])
}

/// Two Q4_0 blocks' 64 codes (unsigned, `q + 8`): each 16-byte nibble array
/// broadcast into two 128-bit lanes, the upper lane of each shifted down
/// four bits, one AND.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn nibbles_64(q0: &[u8; 16], q1: &[u8; 16]) -> __m512i {
    let v = _mm512_broadcast_i32x4(_mm_loadu_si128(q0.as_ptr().cast()));
    let v = _mm512_mask_broadcast_i32x4(v, HI_LANES, _mm_loadu_si128(q1.as_ptr().cast()));
    let v = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    _mm512_and_si512(v, _mm512_set1_epi8(0x0F))
}

/// [`nibbles_64`] in one instruction where the weight pair was two: a GF(2)
/// affine map per byte, its bit matrix picking the low nibble in the first
/// 128-bit lane of each block and the high nibble, moved down, in the
/// second (an affine map is any bit permutation plus zeros; the matrix
/// operand is per 64-bit lane, so it varies across lanes for free).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
unsafe fn nibbles_64_gfni(q0: &[u8; 16], q1: &[u8; 16]) -> __m512i {
    // Byte 7 - i of a matrix: the input bits XOR-ed into output bit i.
    const LO: i64 = 0x0102_0408_0000_0000;
    const HI: i64 = 0x1020_4080_0000_0000;
    let v = _mm512_broadcast_i32x4(_mm_loadu_si128(q0.as_ptr().cast()));
    let v = _mm512_mask_broadcast_i32x4(v, HI_LANES, _mm_loadu_si128(q1.as_ptr().cast()));
    _mm512_gf2p8affine_epi64_epi8::<0>(v, _mm512_set_epi64(HI, HI, LO, LO, HI, HI, LO, LO))
}

/// # Safety
/// See the module doc; `w` is four rows of `row_bytes`, `a` one activation
/// row of the same length, `p` prepared from `a` (the kernels read `p`'s
/// copy of the quants).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_q8_0(w: &[u8], row_bytes: usize, _a: &[u8], p: &crate::cpu::ActPrep) -> [f32; 4] {
    let rows = rows_n::<BlockQ8_0, 4>(w, row_bytes);
    let flip = _mm512_set1_epi8(0x80_u8 as i8);
    // `q ^ 0x80` is `q + 128` for every byte, -128 included.
    let code = |x0: &BlockQ8_0, x1: &BlockQ8_0| {
        let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(loadu(x0.qs.as_ptr().cast())), loadu(x1.qs.as_ptr().cast()));
        _mm512_xor_si512(v, flip)
    };
    dot4_pairs::<_, false>(rows, p, 128, code, |x| x.d.to_bits(), |_| 0, row_bytes)
}

/// # Safety
/// As [`dot4_q8_0`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_q4_0(w: &[u8], row_bytes: usize, _a: &[u8], p: &crate::cpu::ActPrep) -> [f32; 4] {
    let rows = rows_n::<BlockQ4_0, 4>(w, row_bytes);
    dot4_pairs::<_, false>(rows, p, 8, |x0, x1| nibbles_64(&x0.qs, &x1.qs), |x| x.d.to_bits(), |_| 0, row_bytes)
}

/// # Safety
/// As [`dot4_q8_0`], on a CPU with GFNI too.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,gfni")]
pub(crate) unsafe fn dot4_q4_0_gfni(w: &[u8], row_bytes: usize, _a: &[u8], p: &crate::cpu::ActPrep) -> [f32; 4] {
    let rows = rows_n::<BlockQ4_0, 4>(w, row_bytes);
    dot4_pairs::<_, false>(rows, p, 8, |x0, x1| nibbles_64_gfni(&x0.qs, &x1.qs), |x| x.d.to_bits(), |_| 0, row_bytes)
}

/// # Safety
/// As [`dot4_q8_0`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_q5_0(w: &[u8], row_bytes: usize, _a: &[u8], p: &crate::cpu::ActPrep) -> [f32; 4] {
    let rows = rows_n::<BlockQ5_0, 4>(w, row_bytes);
    let bit4 = _mm512_set1_epi8(0x10);
    dot4_pairs::<_, false>(
        rows,
        p,
        16,
        |x0, x1| q5_codes(&x0.qs, &x1.qs, x0.qh, x1.qh, bit4),
        |x| x.d.to_bits(),
        |_| 0,
        row_bytes,
    )
}

/// The 5-bit codes (0..31) of two Q5_0/Q5_1 blocks: their nibbles, and the
/// fifth bit of element k (bit k of `qh`) added as 16 through a byte mask.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q5_codes(qs0: &[u8; 16], qs1: &[u8; 16], qh0: [u8; 4], qh1: [u8; 4], bit4: __m512i) -> __m512i {
    let nib = nibbles_64(qs0, qs1);
    let hi = u64::from(u32::from_le_bytes(qh0)) | u64::from(u32::from_le_bytes(qh1)) << 32;
    _mm512_mask_add_epi8(nib, hi, nib, bit4)
}

/// IQ4_NL: Q4_0's nibbles looked up in the codebook shifted to unsigned
/// (`v + 128`, 1..241: one byte shuffle per pair of blocks), offset 128.
///
/// # Safety
/// As [`dot4_q8_0`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_iq4_nl(w: &[u8], row_bytes: usize, _a: &[u8], p: &crate::cpu::ActPrep) -> [f32; 4] {
    let rows = rows_n::<BlockIQ4NL, 4>(w, row_bytes);
    let shifted: [u8; 16] = core::array::from_fn(|i| (KVALUES_IQ4NL[i] as u8) ^ 0x80);
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(shifted.as_ptr().cast()));
    dot4_pairs::<_, false>(
        rows,
        p,
        128,
        |x0, x1| _mm512_shuffle_epi8(table, nibbles_64(&x0.qs, &x1.qs)),
        |x| x.d.to_bits(),
        |_| 0,
        row_bytes,
    )
}

/// Q5_1 against Q8_1: Q5_0's codes with no offset (`q` is already 0..31),
/// and each block's `m * s` added ([`dot4_pairs`]'s `MIN`).
///
/// # Safety
/// As [`dot4_q8_0`], `p` prepared from a Q8_1 row.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_q5_1(w: &[u8], row_bytes: usize, _a: &[u8], p: &crate::cpu::ActPrep) -> [f32; 4] {
    let rows = rows_n::<BlockQ5_1, 4>(w, row_bytes);
    let bit4 = _mm512_set1_epi8(0x10);
    dot4_pairs::<_, true>(
        rows,
        p,
        0,
        |x0, x1| q5_codes(&x0.qs, &x1.qs, x0.qh, x1.qh, bit4),
        |x| x.d.to_bits(),
        |x| x.m.to_bits(),
        row_bytes,
    )
}

// ------------------------------------------- 256-element K kinds, 512 bits
//
// A K super-block is 256 elements, so a 64-byte activation load covers two
// 32-element sub-blocks (Q4_K/Q5_K) or four 16-element ones (Q6_K, Q3_K,
// Q2_K) and a whole block is four `zmm` products. Weight codes are
// unsigned, so they go straight into `maddubs` (u8 x s8 → i16 pairs, no
// saturation at these ranges), and `vpdpwssd` multiplies the pairs by the
// sub-block scales and accumulates in one instruction (AVX2 needs `madd` +
// `add` and a shuffle per 16 elements). Offsets and mins come back through
// the activation's `bsums`. The same code serves one row (tails) and four
// rows (the activation block loaded once for four weight rows) through `R`.

/// Word masks of a `zmm`: its low and high 256 bits.
const LO_WORDS: __mmask32 = 0x0000_FFFF;
const HI_WORDS: __mmask32 = 0xFFFF_0000;

/// `vpermw` indices putting word `4t + i` of a scale vector in 128-bit lane
/// `i` (`K6_QUAD_IDX[t]`): the scales of the four 16-element Q6_K
/// sub-blocks of elements `64t..64t + 64`.
static K6_QUAD_IDX: [[u16; 32]; 4] = {
    let mut m = [[0u16; 32]; 4];
    let mut t = 0;
    while t < 4 {
        let mut w = 0;
        while w < 32 {
            m[t][w] = (4 * t + w / 8) as u16;
            w += 1;
        }
        t += 1;
    }
    m
};

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn load_idx(idx: &[u16; 32]) -> __m512i {
    _mm512_loadu_si512(idx.as_ptr().cast())
}

/// Every cache line of block `x`'s copy `ahead` bytes further on (the rows
/// `PREFETCH_ROWS` down; a hint, never faults). Only the four-row kernels
/// prefetch: the one-row kernels serve tails, and the matvec's one-row path
/// prefetches itself. Into L2, as `dot4_pairs` and the one-row path do: an
/// L1 prefetch holds one of the core's few fill buffers for the whole trip
/// to DRAM. On the AVX-512 EPYC (Zen 4) the L1 hint streamed a
/// 262144x768 Q6_K matrix at 9–10 GB/s on one thread and the L2 hint at
/// 18–20, and a qwen3moe decode (half its bytes Q6_K) went from 32–38 to
/// 42–50 t/s (decision 0050).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn prefetch_block<X>(x: &X, ahead: usize) {
    let p = (x as *const X).cast::<i8>().wrapping_add(ahead);
    let mut off = 0;
    while off < core::mem::size_of::<X>() {
        _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(off));
        off += 64;
    }
}

/// `[d * ya, dmin * ya, 0, 0]` from a block's f16 scales (kinds without
/// `dmin` pass `d` twice).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn d_dmin(d: F16, dmin: F16, ya: __m128) -> __m128 {
    let bits = u32::from(d.to_bits()) | (u32::from(dmin.to_bits()) << 16);
    _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)), ya)
}

/// The Q8_K block's eight 32-element sums (i16 words; |sum| <= 32 * 127).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn bsums32(y: &BlockQ8K) -> __m128i {
    let b = _mm256_loadu_si256(y.bsums.as_ptr().cast());
    _mm_hadd_epi16(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1))
}

/// `vpermw` indices for row pair member `h` (words `16h..16h + 16` of a
/// [`k4_header`] word vector) and step `j`: scale `2j` in the low 256 bits,
/// `2j + 1` in the high (`K4_ROW_IDX[h][j]`).
static K4_ROW_IDX: [[[u16; 32]; 4]; 2] = {
    let mut m = [[[0u16; 32]; 4]; 2];
    let mut h = 0;
    while h < 2 {
        let mut j = 0;
        while j < 4 {
            let mut w = 0;
            while w < 32 {
                m[h][j][w] = (16 * h + 2 * j + w / 16) as u16;
                w += 1;
            }
            j += 1;
        }
        h += 1;
    }
    m
};

/// The 16-byte headers (`d`, `dmin`, 12 scale bytes) of block `b` of up to
/// four Q4_K/Q5_K rows, unpacked together: ggml's 6-bit scale/min
/// unpacking (as `avx2::scales_mins_k4`) on the four rows' words at once.
/// Returns the words (rows 0 and 1, rows 2 and 3: per row 8 scales then 8
/// mins) and `[d, dmin]` per row times `ya`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn k4_header<X: K4Block, const R: usize>(w: &[&[X]; R], b: usize, ya: __m256) -> ([__m512i; 2], __m256) {
    const { assert!(R == 1 || R == 4) };
    let h = |r: usize| _mm_loadu_si128((&w[r][b] as *const X).cast());
    let mut s = _mm512_zextsi128_si512(h(0));
    if R == 4 {
        s = _mm512_inserti32x4::<1>(s, h(1));
        s = _mm512_inserti32x4::<2>(s, h(2));
        s = _mm512_inserti32x4::<3>(s, h(3));
    }
    // Per row the dwords [d|dmin, u0, u1, u2] become [sc_lo, sc_hi, mn_lo, mn_hi]:
    // sc_lo = u0 & 3f, sc_hi = (u2 & 0f) | (u0 >> 6 & 3) << 4,
    // mn_lo = u1 & 3f, mn_hi = (u2 >> 4 & 0f) | (u1 >> 6 & 3) << 4 (bytewise).
    let p = _mm512_srlv_epi32(_mm512_shuffle_epi32::<0b11_10_11_01>(s), _mm512_set4_epi32(4, 0, 0, 0));
    let q = _mm512_shuffle_epi32::<0b10_10_01_01>(s);
    let lo = _mm512_and_si512(p, _mm512_set4_epi32(0x0f0f_0f0f, 0x3f3f_3f3f, 0x0f0f_0f0f, 0x3f3f_3f3f));
    let hi = _mm512_and_si512(_mm512_srli_epi32::<2>(q), _mm512_set4_epi32(0x3030_3030, 0, 0x3030_3030, 0));
    let sm = _mm512_or_si512(lo, hi);
    let w01 = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(sm));
    let w23 = if R == 4 { _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64::<1>(sm)) } else { _mm512_setzero_si512() };
    let dd = _mm512_castsi512_si128(_mm512_permutexvar_epi32(_mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0), s));
    ([w01, w23], _mm256_mul_ps(_mm256_cvtph_ps(dd), ya))
}

/// Q4_K and Q5_K rows: `hi5` adds the fifth bits (Q5_K) to step `j`'s 64
/// codes, or is the identity (Q4_K). `R` is 1 or 4.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn k4_rows<X: K4Block, const R: usize>(
    w: [&[X]; R],
    a: &[BlockQ8K],
    row_bytes: usize,
    hi5: impl Fn(&X, __m512i, usize) -> __m512i,
) -> [f32; R] {
    let m4 = _mm512_set1_epi8(0x0F);
    let idx: [[__m512i; 4]; 2] = core::array::from_fn(|h| core::array::from_fn(|j| load_idx(&K4_ROW_IDX[h][j])));
    // The mins' partial sums land in 128-bit lanes (row 2, 0, 3, 1): their
    // dmin per lane, and where each row's sum ends up.
    let dmin_idx = _mm512_set_epi32(3, 3, 3, 3, 7, 7, 7, 7, 1, 1, 1, 1, 5, 5, 5, 5);
    let ahead = crate::cpu::PREFETCH_ROWS * row_bytes;
    let mut acc = [_mm512_setzero_ps(); R];
    let mut acc_m = _mm512_setzero_ps();
    for (b, y) in a.iter().enumerate() {
        let aq: [__m512i; 4] = core::array::from_fn(|j| _mm512_loadu_si512(y.qs.as_ptr().add(64 * j).cast()));
        // The eight 32-sums in words 8..16 of each 256-bit half (against the mins).
        let pair = _mm512_broadcast_i64x4(_mm256_set_m128i(bsums32(y), _mm_setzero_si128()));
        let (words, dv) = k4_header(&w, b, _mm256_set1_ps(y.d));
        let dv = _mm512_castps256_ps512(dv);
        // Mins: rows 0/1 in lanes 1/3 of the first madd, rows 2/3 in lanes
        // 1/3 of the second, moved to lanes 0/2.
        let m01 = _mm512_madd_epi16(words[0], pair);
        let m23 = _mm512_madd_epi16(words[1], pair);
        let mall = _mm512_mask_shuffle_i32x4::<0xF5>(m01, 0x0F0F, m23, m23);
        acc_m = _mm512_fmadd_ps(_mm512_permutexvar_ps(dmin_idx, dv), _mm512_cvtepi32_ps(mall), acc_m);
        for r in 0..R {
            let x = &w[r][b];
            if R > 1 {
                prefetch_block(x, ahead);
            }
            let mut sumi = _mm512_setzero_si512();
            for (j, &aj) in aq.iter().enumerate() {
                // Low nibbles (sub-block 2j) in the low half, high (2j + 1) in the high.
                let q = _mm512_broadcast_i64x4(_mm256_loadu_si256(x.qs().as_ptr().add(32 * j).cast()));
                let q = _mm512_and_si512(_mm512_mask_srli_epi16::<4>(q, HI_WORDS, q), m4);
                let q = hi5(x, q, j);
                let p = _mm512_maddubs_epi16(q, aj);
                sumi = _mm512_dpwssd_epi32(sumi, p, _mm512_permutexvar_epi16(idx[r % 2][j], words[r / 2]));
            }
            let d = _mm512_permutexvar_ps(_mm512_set1_epi32(2 * r as i32), dv);
            acc[r] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(sumi), acc[r]);
        }
    }
    // Row r's mins are in 128-bit lane [1, 3, 0, 2][r].
    let lane = |l: usize| -> __m128 {
        match l {
            0 => _mm512_castps512_ps128(acc_m),
            1 => _mm512_extractf32x4_ps::<1>(acc_m),
            2 => _mm512_extractf32x4_ps::<2>(acc_m),
            _ => _mm512_extractf32x4_ps::<3>(acc_m),
        }
    };
    core::array::from_fn(|r| _mm512_reduce_add_ps(acc[r]) - hsum_ps128(lane([1, 3, 0, 2][r])))
}

/// What [`k4_rows`] reads of a Q4_K or Q5_K block: its `qs`, and (by
/// [`k4_header`]) its first 16 bytes, `d`, `dmin` and the 12 scale bytes
/// (both layouts start so, asserted below).
trait K4Block {
    fn qs(&self) -> &[u8; 128];
}

impl K4Block for BlockQ4K {
    fn qs(&self) -> &[u8; 128] { &self.qs }
}

impl K4Block for BlockQ5K {
    fn qs(&self) -> &[u8; 128] { &self.qs }
}

const _: () = {
    assert!(core::mem::offset_of!(BlockQ4K, d) == 0 && core::mem::offset_of!(BlockQ5K, d) == 0);
    assert!(core::mem::offset_of!(BlockQ4K, dmin) == 2 && core::mem::offset_of!(BlockQ5K, dmin) == 2);
    assert!(core::mem::offset_of!(BlockQ4K, scales) == 4 && core::mem::offset_of!(BlockQ5K, scales) == 4);
};

/// Q5_K's fifth bits for step `j`: element `64j + i` has it at bit `2j` of
/// `qh[i]`, element `64j + 32 + i` at bit `2j + 1`; one byte-mask test, and
/// 16 added where it is set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q5k_hi5(x: &BlockQ5K, q: __m512i, j: usize) -> __m512i {
    let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(x.qh.as_ptr().cast()));
    let bits = _mm512_inserti64x4::<1>(
        _mm512_set1_epi8((1u8 << (2 * j)) as i8),
        _mm256_set1_epi8((2u8 << (2 * j)) as i8),
    );
    _mm512_mask_add_epi8(q, _mm512_test_epi8_mask(qh, bits), q, _mm512_set1_epi8(0x10))
}

/// Rows of the kinds with one scale per 16 elements (Q6_K, Q3_K, Q2_K).
/// `codes(x, n)` gives elements `128n..128n + 128` of a block as two
/// `zmm` of unsigned codes (`q + off`); `scales` the 16 scales as i16
/// words; `mins` Q2_K's 16 mins (subtracted as `dmin * min * bsum16`);
/// `dd` the block's `[d, dmin] * ya`. The offset `off` comes back as
/// `-off * sum(scale * bsum16)`, the block's integer sum's starting value.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn k16_rows<X, const R: usize>(
    w: [&[X]; R],
    a: &[BlockQ8K],
    row_bytes: usize,
    off: i32,
    dd: impl Fn(&X, __m128) -> __m128,
    scales: impl Fn(&X) -> __m256i,
    mins: impl Fn(&X) -> Option<__m256i>,
    codes: impl Fn(&X, usize) -> [__m512i; 2],
) -> [f32; R] {
    let idx: [__m512i; 4] = core::array::from_fn(|t| load_idx(&K6_QUAD_IDX[t]));
    let ahead = crate::cpu::PREFETCH_ROWS * row_bytes;
    let mut acc = [_mm512_setzero_ps(); R];
    let mut acc_m = [_mm256_setzero_ps(); R];
    for (b, y) in a.iter().enumerate() {
        let aq: [__m512i; 4] = core::array::from_fn(|t| _mm512_loadu_si512(y.qs.as_ptr().add(64 * t).cast()));
        let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
        let neg_bs = _mm256_sub_epi16(_mm256_setzero_si256(), bs);
        let ya = _mm_set1_ps(y.d);
        for r in 0..R {
            let x = &w[r][b];
            if R > 1 {
                prefetch_block(x, ahead);
            }
            let d = dd(x, ya);
            let sc16 = scales(x);
            if let Some(m16) = mins(x) {
                let m = _mm256_cvtepi32_ps(_mm256_madd_epi16(m16, bs));
                acc_m[r] = _mm256_fmadd_ps(_mm256_set1_ps(_mm_cvtss_f32(_mm_shuffle_ps(d, d, 0x55))), m, acc_m[r]);
            }
            // |scale * bsum16| pairs <= 2 * 128 * 2032: times 32 fits i32.
            let init = _mm256_mullo_epi32(_mm256_madd_epi16(sc16, neg_bs), _mm256_set1_epi32(off));
            let mut sumi = _mm512_zextsi256_si512(init);
            let scz = _mm512_castsi256_si512(sc16); // only words 0..16 are read
            for n in 0..2 {
                for (m, q) in codes(x, n).into_iter().enumerate() {
                    let t = 2 * n + m;
                    let p = _mm512_maddubs_epi16(q, aq[t]);
                    sumi = _mm512_dpwssd_epi32(sumi, p, _mm512_permutexvar_epi16(idx[t], scz));
                }
            }
            acc[r] = _mm512_fmadd_ps(_mm512_broadcastss_ps(d), _mm512_cvtepi32_ps(sumi), acc[r]);
        }
    }
    core::array::from_fn(|r| _mm512_reduce_add_ps(acc[r]) - hsum_ps(acc_m[r]))
}

/// Q6_K rows: codes `q + 32` (0..64) from 4 low and 2 high bits.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6k_rows<const R: usize>(w: [&[BlockQ6K]; R], a: &[BlockQ8K], row_bytes: usize) -> [f32; R] {
    let m4 = _mm512_set1_epi8(0x0F);
    let m2 = _mm512_set1_epi8(0x30);
    k16_rows(
        w,
        a,
        row_bytes,
        32,
        |x, ya| d_dmin(x.d, x.d, ya),
        |x| _mm256_cvtepi8_epi16(_mm_loadu_si128(x.scales.as_ptr().cast())),
        |_| None,
        |x, n| {
            let ql = _mm512_loadu_si512(x.ql.as_ptr().add(64 * n).cast());
            let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(x.qh.as_ptr().add(32 * n).cast()));
            // Elements 128n..+64: low nibbles of ql, qh bits 0-1 (low
            // half) and 2-3 (high half) at bits 4-5.
            let h0 = _mm512_and_si512(_mm512_mask_slli_epi16::<4>(_mm512_slli_epi16::<2>(qh), LO_WORDS, qh), m2);
            // Elements 128n+64..+64: high nibbles, qh bits 4-5 and 6-7.
            let h1 = _mm512_and_si512(_mm512_mask_srli_epi16::<2>(qh, HI_WORDS, qh), m2);
            // (a & c) | b: the nibble, then the two high bits.
            [
                _mm512_ternarylogic_epi32::<0xEC>(ql, h0, m4),
                _mm512_ternarylogic_epi32::<0xEC>(_mm512_srli_epi16::<4>(ql), h1, m4),
            ]
        },
    )
}

/// Q3_K and Q2_K's two-bit fields of elements `128n..128n + 128`: element
/// `128n + 32j + i` is bits `2j..2j + 2` of `qs[32n + i]`; step `m` covers
/// `j = 2m` (low half) and `2m + 1` (high half).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn two_bit_codes(qs: &[u8; 64], n: usize) -> [__m512i; 2] {
    let m3 = _mm512_set1_epi8(3);
    let q = _mm512_broadcast_i64x4(_mm256_loadu_si256(qs.as_ptr().add(32 * n).cast()));
    let q4 = _mm512_srli_epi16::<4>(q);
    [
        _mm512_and_si512(_mm512_mask_srli_epi16::<2>(q, HI_WORDS, q), m3),
        _mm512_and_si512(_mm512_mask_srli_epi16::<2>(q4, HI_WORDS, q4), m3),
    ]
}

/// ggml's 6-bit signed scale unpacking of Q3_K (as `avx2::q3_k_scales`),
/// on four words and one vector subtract, widened to i16 words.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q3k_scales16(s: &[u8; 12]) -> __m256i {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, t) = (w(0), w(1), w(2));
    let (k1, k2) = (0x0303_0303_u32, 0x0f0f_0f0f_u32);
    let v = _mm_set_epi32(
        (((a1 >> 4) & k2) | (((t >> 6) & k1) << 4)) as i32,
        (((a0 >> 4) & k2) | (((t >> 4) & k1) << 4)) as i32,
        ((a1 & k2) | (((t >> 2) & k1) << 4)) as i32,
        ((a0 & k2) | ((t & k1) << 4)) as i32,
    );
    _mm256_cvtepi8_epi16(_mm_sub_epi8(v, _mm_set1_epi8(32)))
}

/// Q3_K rows: codes `q + 4` (0..8), the third bit from `hmask` (bit
/// `4n + j` of `hmask[i]` for element `128n + 32j + i`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q3k_rows<const R: usize>(w: [&[BlockQ3K]; R], a: &[BlockQ8K], row_bytes: usize) -> [f32; R] {
    let four = _mm512_set1_epi8(4);
    k16_rows(
        w,
        a,
        row_bytes,
        4,
        |x, ya| d_dmin(x.d, x.d, ya),
        |x| q3k_scales16(&x.scales),
        |_| None,
        |x, n| {
            let hm = _mm512_broadcast_i64x4(_mm256_loadu_si256(x.hmask.as_ptr().cast()));
            let c = two_bit_codes(&x.qs, n);
            core::array::from_fn(|m| {
                let bit = 4 * n + 2 * m;
                let bits = _mm512_inserti64x4::<1>(
                    _mm512_set1_epi8((1u8 << bit) as i8),
                    _mm256_set1_epi8((1u8 << (bit + 1)) as i8),
                );
                _mm512_mask_add_epi8(c[m], _mm512_test_epi8_mask(hm, bits), c[m], four)
            })
        },
    )
}

/// Q2_K rows: codes 0..4, scales in the low nibbles, mins in the high.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q2k_rows<const R: usize>(w: [&[BlockQ2K]; R], a: &[BlockQ8K], row_bytes: usize) -> [f32; R] {
    let m4 = _mm_set1_epi8(0x0F);
    k16_rows(
        w,
        a,
        row_bytes,
        0,
        |x, ya| d_dmin(x.d, x.dmin, ya),
        |x| _mm256_cvtepu8_epi16(_mm_and_si128(_mm_loadu_si128(x.scales.as_ptr().cast()), m4)),
        |x| {
            let s = _mm_loadu_si128(x.scales.as_ptr().cast());
            Some(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(s), m4)))
        },
        |x, n| two_bit_codes(&x.qs, n),
    )
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    k4_rows::<BlockQ4K, 1>([blocks_of(w)], blocks_of(a), w.len(), |_, q, _| q)[0]
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q5_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    k4_rows::<BlockQ5K, 1>([blocks_of(w)], blocks_of(a), w.len(), |x, q, j| q5k_hi5(x, q, j))[0]
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    q6k_rows::<1>([blocks_of(w)], blocks_of(a), w.len())[0]
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q3_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    q3k_rows::<1>([blocks_of(w)], blocks_of(a), w.len())[0]
}

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_q2_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    q2k_rows::<1>([blocks_of(w)], blocks_of(a), w.len())[0]
}

/// # Safety
/// As [`dot4_q8_0`], with a Q8_K activation row (`p` unused: the Q8_K
/// block carries its f32 scale and sums).
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_q4_k(w: &[u8], row_bytes: usize, a: &[u8], _p: &crate::cpu::ActPrep) -> [f32; 4] {
    k4_rows::<BlockQ4K, 4>(rows_n(w, row_bytes), blocks_of(a), row_bytes, |_, q, _| q)
}

/// # Safety
/// As [`dot4_q4_k`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_q5_k(w: &[u8], row_bytes: usize, a: &[u8], _p: &crate::cpu::ActPrep) -> [f32; 4] {
    k4_rows::<BlockQ5K, 4>(rows_n(w, row_bytes), blocks_of(a), row_bytes, |x, q, j| q5k_hi5(x, q, j))
}

/// # Safety
/// As [`dot4_q4_k`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_q6_k(w: &[u8], row_bytes: usize, a: &[u8], _p: &crate::cpu::ActPrep) -> [f32; 4] {
    q6k_rows::<4>(rows_n(w, row_bytes), blocks_of(a), row_bytes)
}

/// # Safety
/// As [`dot4_q4_k`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_q3_k(w: &[u8], row_bytes: usize, a: &[u8], _p: &crate::cpu::ActPrep) -> [f32; 4] {
    q3k_rows::<4>(rows_n(w, row_bytes), blocks_of(a), row_bytes)
}

/// # Safety
/// As [`dot4_q4_k`].
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot4_q2_k(w: &[u8], row_bytes: usize, a: &[u8], _p: &crate::cpu::ActPrep) -> [f32; 4] {
    q2k_rows::<4>(rows_n(w, row_bytes), blocks_of(a), row_bytes)
}

// ------------------------------------------- F16 rows, several tokens at once

/// One F16 weight row against `M` activation rows (already widened to f32,
/// `stride` floats apart): each weight chunk is widened once and used `M`
/// times. Each token's sum is formed exactly as `avx2::dot_f16` forms it —
/// four 8-lane accumulators over 32-element steps, the same fused
/// multiply-adds, the same reduction and scalar tail — so a token's result
/// is bit-identical to the one-row kernel's, whatever `M` (a batch's rows
/// equal a decode step's: speculative verification relies on it). Two of
/// those 8-lane accumulators share one 512-bit register (lanes are
/// independent, so the bits are the same; half the instructions), and the
/// activation widening is exact (every f16 is an f32).
///
/// # Safety
/// See the module doc; `w` is whole F16 elements, and every `a + t * stride
/// .. + w.len()` for `t < M` is readable.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn dot_f16_rows<const M: usize>(w: &[u8], a: *const f32, stride: usize, out: &mut [f32; M]) {
    let w = blocks_of::<F16>(w);
    let n = w.len();
    // acc[t][0] holds dot_f16's accumulators 0 and 1, acc[t][1] 2 and 3.
    let mut acc = [[_mm512_setzero_ps(); 2]; M];
    let mut i = 0;
    while i + 32 <= n {
        for h in 0..2 {
            let x = _mm512_cvtph_ps(_mm256_loadu_si256(w.as_ptr().add(i + 16 * h).cast()));
            for (t, acc) in acc.iter_mut().enumerate() {
                let y = _mm512_loadu_ps(a.add(t * stride + i + 16 * h));
                acc[h] = _mm512_fmadd_ps(x, y, acc[h]);
            }
        }
        i += 32;
    }
    for (t, acc) in acc.iter().enumerate() {
        let lo = _mm256_add_ps(_mm512_castps512_ps256(acc[0]), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[0]))));
        let hi = _mm256_add_ps(_mm512_castps512_ps256(acc[1]), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[1]))));
        let mut s = hsum_ps(_mm256_add_ps(lo, hi));
        for (j, &wj) in w.iter().enumerate().skip(i) {
            s += f16_to_f32(wj) * *a.add(t * stride + j);
        }
        out[t] = s;
    }
}
