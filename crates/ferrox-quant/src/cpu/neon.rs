//! aarch64 NEON kernels (plain ARMv8.0 NEON: no dotprod, no fp16
//! arithmetic, so every aarch64 CPU runs them).
//!
//! The key decision: **bit-exact with the scalar twins** for every quantized
//! kind. The integer part of a dot (the block sums, ggml's eight K-quant
//! lanes) is exact in any order, so NEON computes it sixteen bytes at a time;
//! the float part is written as the twin writes it: the same products in the
//! same order (Rust never contracts `a * b + c` into a fused multiply-add),
//! the K-quants' eight float lanes as two four-lane vectors, multiplied then
//! added, and summed lane by lane at the end. The float kinds (F32, F16,
//! BF16), whose twins sum in f64, are within f32 rounding instead.
//!
//! CI runs the kernel-vs-twin tests under `qemu-aarch64` (`.ci/run`), since
//! this project's machines are x86-64.

use core::arch::aarch64::*;

use super::{blocks_of, DotFn};
use crate::blocks::*;
use crate::scalar::{e8m0_half, k4_scales_mins, mins_dot, q3_scales, E2M1_X2};
use crate::scalar::iq_grids::KVALUES_IQ4NL;
use crate::QuantKind;

/// The NEON dispatch table (see [`super::dot_fn`]).
pub(super) fn dot_fn(kind: QuantKind) -> Option<DotFn> {
    use QuantKind::*;
    Some(match kind {
        F32 => dot_f32,
        F16 => dot_f16,
        BF16 => dot_bf16,
        Q8_0 => dot_q8_0_q8_0,
        Q4_0 => dot_q4_0_q8_0,
        Q4_1 => dot_q4_1_q8_1,
        Q5_0 => dot_q5_0_q8_0,
        Q5_1 => dot_q5_1_q8_1,
        IQ4NL => dot_iq4_nl_q8_0,
        MXFP4 => dot_mxfp4_q8_0,
        Q2K => dot_q2_k_q8_k,
        Q3K => dot_q3_k_q8_k,
        Q4K => dot_q4_k_q8_k,
        Q5K => dot_q5_k_q8_k,
        Q6K => dot_q6_k_q8_k,
        IQ4XS => dot_iq4_xs_q8_k,
        _ => return None, // capability table: partial by design
    } as DotFn)
}

// ---- integer building blocks (exact)

/// `acc` plus the products of `x` and `y`, pairwise summed into four lanes.
/// Every product of two int8 fits an i16 (|-128 * -127| < 2^15).
#[inline(always)]
unsafe fn mul_acc(acc: int32x4_t, x: int8x16_t, y: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(x), vget_low_s8(y));
    let hi = vmull_high_s8(x, y);
    vpadalq_s16(vpadalq_s16(acc, lo), hi)
}

/// The sum of the products of two 32-element halves (`x0`·`y0` + `x1`·`y1`).
#[inline(always)]
unsafe fn dot32(x0: int8x16_t, x1: int8x16_t, y0: int8x16_t, y1: int8x16_t) -> i32 {
    vaddvq_s32(mul_acc(mul_acc(vdupq_n_s32(0), x0, y0), x1, y1))
}

/// Sixteen products folded onto ggml's eight K-quant lanes (element `e` to
/// lane `e % 8`), as i16: callers keep each lane's sum below 2^15.
#[inline(always)]
unsafe fn lanes16(x: int8x16_t, y: int8x16_t) -> int16x8_t {
    vaddq_s16(vmull_s8(vget_low_s8(x), vget_low_s8(y)), vmull_high_s8(x, y))
}

/// Eight i16 lane sums times a sub-block scale, added to the lanes 0..4
/// and 4..8 accumulators.
#[inline(always)]
unsafe fn scale_lanes(acc: &mut [int32x4_t; 2], p: int16x8_t, scale: i16) {
    acc[0] = vmlal_n_s16(acc[0], vget_low_s16(p), scale);
    acc[1] = vmlal_high_n_s16(acc[1], p, scale);
}

/// Bytes `0x10` where bit `j` of `bits` is set, for `j` in `0..16` (Q5's
/// fifth bit, one per element).
#[inline(always)]
unsafe fn bit_0x10(bits: u16) -> uint8x16_t {
    const MASKS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let v = vcombine_u8(vdup_n_u8(bits as u8), vdup_n_u8((bits >> 8) as u8));
    vandq_u8(vtstq_u8(v, vld1q_u8(MASKS.as_ptr())), vdupq_n_u8(0x10))
}

/// A 32-element half-byte block's low nibbles (elements 0..16) and high
/// nibbles (16..32).
#[inline(always)]
unsafe fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
    let q = vld1q_u8(qs.as_ptr());
    (vandq_u8(q, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(q))
}

#[inline(always)]
unsafe fn load_i8x32(qs: &[i8; 32]) -> (int8x16_t, int8x16_t) {
    (vld1q_s8(qs.as_ptr()), vld1q_s8(qs.as_ptr().add(16)))
}

// ---- float kinds (within f32 rounding of the f64 twins)

/// Four-lane sums of `w[i] * a[i]` over elements converted by `load` four
/// at a time; the tail element by element.
#[inline(always)]
unsafe fn dot_floats(n: usize, load: impl Fn(usize) -> (float32x4_t, float32x4_t), tail: impl Fn(usize) -> f32) -> f32 {
    let (mut s0, mut s1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let mut i = 0;
    while i + 8 <= n {
        let (w0, a0) = load(i);
        let (w1, a1) = load(i + 4);
        s0 = vfmaq_f32(s0, w0, a0);
        s1 = vfmaq_f32(s1, w1, a1);
        i += 8;
    }
    let mut sum = vaddvq_f32(vaddq_f32(s0, s1));
    for j in i..n {
        sum += tail(j);
    }
    sum
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_f32(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<f32>(w), blocks_of::<f32>(a));
    let (pw, pa) = (w.as_ptr(), a.as_ptr());
    dot_floats(w.len().min(a.len()), |i| (vld1q_f32(pw.add(i)), vld1q_f32(pa.add(i))), |j| w[j] * a[j])
}

/// BF16 is the top half of an f32: widening by 16 bits is the conversion.
#[inline(always)]
unsafe fn bf16x4(p: *const BF16) -> float32x4_t {
    vreinterpretq_f32_u32(vshll_n_u16::<16>(vld1_u16(p.cast())))
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_bf16(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BF16>(w), blocks_of::<BF16>(a));
    let (pw, pa) = (w.as_ptr(), a.as_ptr());
    dot_floats(w.len().min(a.len()), |i| (bf16x4(pw.add(i)), bf16x4(pa.add(i))), |j| w[j].to_f32() * a[j].to_f32())
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_f16(w: &[u8], a: &[u8]) -> f32 {
    use half::slice::HalfFloatSliceExt;
    let (w, a) = (blocks_of::<F16>(w), blocks_of::<F16>(a));
    // Widened a chunk at a time by `half` (the fp16 conversion instructions
    // where the CPU has them), then multiplied in f32 lanes.
    const CHUNK: usize = 256;
    let (mut wf, mut af) = ([0.0f32; CHUNK], [0.0f32; CHUNK]);
    let mut sum = 0.0f32;
    for (wc, ac) in w.chunks(CHUNK).zip(a.chunks(CHUNK)) {
        let n = wc.len().min(ac.len());
        wc[..n].convert_to_f32_slice(&mut wf[..n]);
        ac[..n].convert_to_f32_slice(&mut af[..n]);
        let (pw, pa) = (wf.as_ptr(), af.as_ptr());
        sum += dot_floats(n, |i| (vld1q_f32(pw.add(i)), vld1q_f32(pa.add(i))), |j| wf[j] * af[j]);
    }
    sum
}

// ---- 32-element kinds against Q8_0 / Q8_1 (bit-exact)

/// A row of 32-element weight blocks against Q8_0/Q8_1 blocks: `codes`
/// gives a weight block's 32 signed codes, `term` the block's float term
/// from its exact integer dot, written as the twin writes it (the sum then
/// adds the terms in block order, as the twin does).
#[inline(always)]
unsafe fn dot_blocks32<W: Block, A: Block>(
    w: &[u8],
    a: &[u8],
    codes: impl Fn(&W) -> (int8x16_t, int8x16_t),
    act_qs: impl Fn(&A) -> &[i8; 32],
    term: impl Fn(&W, &A, i32) -> f32,
) -> f32 {
    let (w, a) = (blocks_of::<W>(w), blocks_of::<A>(a));
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let (x0, x1) = codes(x);
        let (y0, y1) = load_i8x32(act_qs(y));
        sumf += term(x, y, dot32(x0, x1, y0, y1));
    }
    sumf
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks32(
        w,
        a,
        |x: &BlockQ8_0| load_i8x32(&x.qs),
        |y: &BlockQ8_0| &y.qs,
        |x, y, s| s as f32 * (x.d.to_f32() * y.d.to_f32()),
    )
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_q4_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let eight = vdupq_n_s8(8);
    dot_blocks32(
        w,
        a,
        |x: &BlockQ4_0| {
            let (lo, hi) = nibbles(&x.qs);
            (vsubq_s8(vreinterpretq_s8_u8(lo), eight), vsubq_s8(vreinterpretq_s8_u8(hi), eight))
        },
        |y: &BlockQ8_0| &y.qs,
        |x, y, s| s as f32 * x.d.to_f32() * y.d.to_f32(),
    )
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_q4_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks32(
        w,
        a,
        |x: &BlockQ4_1| {
            let (lo, hi) = nibbles(&x.qs);
            (vreinterpretq_s8_u8(lo), vreinterpretq_s8_u8(hi))
        },
        |y: &BlockQ8_1| &y.qs,
        |x, y, s| (x.d.to_f32() * y.d.to_f32()) * s as f32 + x.m.to_f32() * y.s.to_f32(),
    )
}

/// Q5's codes `0..32`: the nibbles with bit `j` / `j + 16` of `qh` as 0x10.
#[inline(always)]
unsafe fn q5_codes(qs: &[u8; 16], qh: [u8; 4]) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles(qs);
    let h = u32::from_le_bytes(qh);
    (
        vreinterpretq_s8_u8(vorrq_u8(lo, bit_0x10(h as u16))),
        vreinterpretq_s8_u8(vorrq_u8(hi, bit_0x10((h >> 16) as u16))),
    )
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_q5_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let sixteen = vdupq_n_s8(16);
    dot_blocks32(
        w,
        a,
        |x: &BlockQ5_0| {
            let (c0, c1) = q5_codes(&x.qs, x.qh);
            (vsubq_s8(c0, sixteen), vsubq_s8(c1, sixteen))
        },
        |y: &BlockQ8_0| &y.qs,
        |x, y, s| (x.d.to_f32() * y.d.to_f32()) * s as f32,
    )
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_q5_1_q8_1(w: &[u8], a: &[u8]) -> f32 {
    dot_blocks32(
        w,
        a,
        |x: &BlockQ5_1| q5_codes(&x.qs, x.qh),
        |y: &BlockQ8_1| &y.qs,
        |x, y, s| (x.d.to_f32() * y.d.to_f32()) * s as f32 + x.m.to_f32() * y.s.to_f32(),
    )
}

/// A 16-entry code table applied to a block's nibbles (IQ4_NL, MXFP4).
#[inline(always)]
unsafe fn table_codes(table: int8x16_t, qs: &[u8; 16]) -> (int8x16_t, int8x16_t) {
    let (lo, hi) = nibbles(qs);
    (vqtbl1q_s8(table, lo), vqtbl1q_s8(table, hi))
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_iq4_nl_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
    dot_blocks32(
        w,
        a,
        |x: &BlockIQ4NL| table_codes(table, &x.qs),
        |y: &BlockQ8_0| &y.qs,
        |x, y, s| (y.d.to_f32() * x.d.to_f32()) * s as f32,
    )
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_mxfp4_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let table = vld1q_s8(E2M1_X2.as_ptr());
    dot_blocks32(
        w,
        a,
        |x: &BlockMXFP4| table_codes(table, &x.qs),
        |y: &BlockQ8_0| &y.qs,
        |x, y, s| (y.d.to_f32() * e8m0_half(x.e)) * s as f32,
    )
}

// ---- 256-element kinds against Q8_K (bit-exact)

/// The K-quants' float tail, as the twin's `LaneAcc`: eight lanes of
/// `d * lane` sums across blocks, a separate correction sum, lanes added
/// to it one by one at the end.
struct Lanes {
    sums: [float32x4_t; 2],
    sumf: f32,
}

impl Lanes {
    #[inline(always)]
    unsafe fn new() -> Self {
        Lanes { sums: [vdupq_n_f32(0.0); 2], sumf: 0.0 }
    }

    /// `sums[l] += d * lanes[l]` (a multiply, then an add: not fused).
    #[inline(always)]
    unsafe fn add(&mut self, d: f32, lanes: [int32x4_t; 2]) {
        for (s, l) in self.sums.iter_mut().zip(lanes) {
            *s = vaddq_f32(*s, vmulq_n_f32(vcvtq_f32_s32(l), d));
        }
    }

    #[inline(always)]
    unsafe fn finish(self) -> f32 {
        let mut lanes = [0.0f32; 8];
        vst1q_f32(lanes.as_mut_ptr(), self.sums[0]);
        vst1q_f32(lanes.as_mut_ptr().add(4), self.sums[1]);
        let mut sumf = self.sumf;
        for l in lanes {
            sumf += l;
        }
        sumf
    }
}

/// One 32-element sub-block of codes `x0`/`x1` against `y` (Q8_K codes at
/// the same offset), scaled onto the eight lanes. Codes of at most 5 bits:
/// four products a lane stay below 2^15.
#[inline(always)]
unsafe fn sub32(acc: &mut [int32x4_t; 2], x0: int8x16_t, x1: int8x16_t, y: *const i8, scale: u8) {
    let p = vaddq_s16(lanes16(x0, vld1q_s8(y)), lanes16(x1, vld1q_s8(y.add(16))));
    scale_lanes(acc, p, i16::from(scale));
}

/// Q4_K and Q5_K: `codes(x, c)` gives chunk `c`'s 64 codes as four
/// 16-vectors (32 from the low nibbles, then 32 from the high).
#[inline(always)]
unsafe fn dot_k4<B>(w: &[B], a: &[BlockQ8K], head: impl Fn(&B) -> (f32, f32, &[u8; 12]), codes: impl Fn(&B, usize) -> [int8x16_t; 4]) -> f32 {
    let mut acc = Lanes::new();
    for (x, y) in w.iter().zip(a) {
        let (d, dmin, scales) = head(x);
        let (sc, mn) = k4_scales_mins(scales);
        let mut lanes = [vdupq_n_s32(0); 2];
        for c in 0..4 {
            let q = codes(x, c);
            let ya = y.qs.as_ptr().add(64 * c);
            sub32(&mut lanes, q[0], q[1], ya, sc[2 * c]);
            sub32(&mut lanes, q[2], q[3], ya.add(32), sc[2 * c + 1]);
        }
        acc.add(d * y.d, lanes);
        let dmin = dmin * y.d;
        acc.sumf -= dmin * mins_dot(&y.bsums, &mn) as f32;
    }
    acc.finish()
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_q4_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ4K>(w), blocks_of::<BlockQ8K>(a));
    let m4 = vdupq_n_u8(0x0F);
    dot_k4(
        w,
        a,
        |x: &BlockQ4K| (x.d.to_f32(), x.dmin.to_f32(), &x.scales),
        |x, c| {
            let p = x.qs.as_ptr().add(32 * c);
            let (b0, b1) = (vld1q_u8(p), vld1q_u8(p.add(16)));
            [vandq_u8(b0, m4), vandq_u8(b1, m4), vshrq_n_u8::<4>(b0), vshrq_n_u8::<4>(b1)].map(|v| vreinterpretq_s8_u8(v))
        },
    )
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_q5_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ5K>(w), blocks_of::<BlockQ8K>(a));
    let (m4, m16) = (vdupq_n_u8(0x0F), vdupq_n_u8(0x10));
    dot_k4(
        w,
        a,
        |x: &BlockQ5K| (x.d.to_f32(), x.dmin.to_f32(), &x.scales),
        |x, c| {
            let p = x.qs.as_ptr().add(32 * c);
            let (b0, b1) = (vld1q_u8(p), vld1q_u8(p.add(16)));
            let (h0, h1) = (vld1q_u8(x.qh.as_ptr()), vld1q_u8(x.qh.as_ptr().add(16)));
            // Chunk c's fifth bits: bit 2c of qh[l] for the first 32, 2c+1 for the second.
            let (u1, u2) = (vdupq_n_u8(1 << (2 * c)), vdupq_n_u8(2 << (2 * c)));
            let hb = |h: uint8x16_t, u: uint8x16_t| vandq_u8(vtstq_u8(h, u), m16);
            [
                vorrq_u8(vandq_u8(b0, m4), hb(h0, u1)),
                vorrq_u8(vandq_u8(b1, m4), hb(h1, u1)),
                vorrq_u8(vshrq_n_u8::<4>(b0), hb(h0, u2)),
                vorrq_u8(vshrq_n_u8::<4>(b1), hb(h1, u2)),
            ]
            .map(|v| vreinterpretq_s8_u8(v))
        },
    )
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_q6_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ6K>(w), blocks_of::<BlockQ8K>(a));
    let (m4, m3, m32) = (vdupq_n_u8(0x0F), vdupq_n_u8(3), vdupq_n_s8(32));
    let mut acc = Lanes::new();
    for (x, y) in w.iter().zip(a) {
        let mut lanes = [vdupq_n_s32(0); 2];
        for half in 0..2 {
            let (ql, qh) = (x.ql.as_ptr().add(64 * half), x.qh.as_ptr().add(32 * half));
            let ya = y.qs.as_ptr().add(128 * half);
            // Four 32-element streams of the half, each two 16-element
            // scale groups: stream s's codes are a nibble of ql[l] (s 0, 2)
            // or ql[l + 32] (s 1, 3) with bits 2s..2s+2 of qh[l] above it.
            for g in 0..2 {
                let (l0, l1) = (vld1q_u8(ql.add(16 * g)), vld1q_u8(ql.add(32 + 16 * g)));
                let h = vld1q_u8(qh.add(16 * g));
                let codes = [
                    vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8::<4>(vandq_u8(h, m3))),
                    vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<2>(h), m3))),
                    vorrq_u8(vshrq_n_u8::<4>(l0), vshlq_n_u8::<4>(vandq_u8(vshrq_n_u8::<4>(h), m3))),
                    vorrq_u8(vshrq_n_u8::<4>(l1), vshlq_n_u8::<4>(vshrq_n_u8::<6>(h))),
                ];
                for (s, code) in codes.into_iter().enumerate() {
                    // Elements 128 half + 32 s + 16 g .. + 16: scale group 8 half + 2 s + g.
                    let q = vsubq_s8(vreinterpretq_s8_u8(code), m32);
                    let p = lanes16(q, vld1q_s8(ya.add(32 * s + 16 * g)));
                    scale_lanes(&mut lanes, p, i16::from(x.scales[8 * half + 2 * s + g]));
                }
            }
        }
        acc.add(x.d.to_f32() * y.d, lanes);
    }
    acc.finish()
}

/// Q2_K/Q3_K's two-bit codes of scale group `g` (elements `16 g .. 16 g +
/// 16`): byte `32 (g / 8) + 16 (g % 2) + i`, bits `2 ((g % 8) / 2)`.
#[inline(always)]
unsafe fn two_bits(qs: &[u8; 64], g: usize) -> uint8x16_t {
    let v = vld1q_u8(qs.as_ptr().add(32 * (g / 8) + 16 * (g % 2)));
    let shifted = match (g % 8) / 2 {
        0 => v,
        1 => vshrq_n_u8::<2>(v),
        2 => vshrq_n_u8::<4>(v),
        _ => vshrq_n_u8::<6>(v),
    };
    vandq_u8(shifted, vdupq_n_u8(3))
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_q3_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ3K>(w), blocks_of::<BlockQ8K>(a));
    let four = vdupq_n_u8(4);
    let mut acc = Lanes::new();
    for (x, y) in w.iter().zip(a) {
        let scales = q3_scales(&x.scales);
        let mut lanes = [vdupq_n_s32(0); 2];
        for (g, &scale) in scales.iter().enumerate() {
            // 4 subtracted unless the high bit (hmask byte e % 32, bit e / 32) is set.
            let hm = vld1q_u8(x.hmask.as_ptr().add(16 * (g % 2)));
            let minus = vbicq_u8(four, vtstq_u8(hm, vdupq_n_u8(1 << (g / 2))));
            let q = vsubq_s8(vreinterpretq_s8_u8(two_bits(&x.qs, g)), vreinterpretq_s8_u8(minus));
            let p = lanes16(q, vld1q_s8(y.qs.as_ptr().add(16 * g)));
            scale_lanes(&mut lanes, p, i16::from(scale));
        }
        acc.add(x.d.to_f32() * y.d, lanes);
    }
    acc.finish()
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_q2_k_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ2K>(w), blocks_of::<BlockQ8K>(a));
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let summs: i32 = y.bsums.iter().zip(&x.scales).map(|(&b, &s)| i32::from(b) * i32::from(s >> 4)).sum();
        let dall = y.d * x.d.to_f32();
        let dmin = y.d * x.dmin.to_f32();
        let mut isum = [vdupq_n_s32(0); 2];
        for (g, &sc) in x.scales.iter().enumerate() {
            let q = vreinterpretq_s8_u8(two_bits(&x.qs, g));
            let p = lanes16(q, vld1q_s8(y.qs.as_ptr().add(16 * g)));
            scale_lanes(&mut isum, p, i16::from(sc & 0xF));
        }
        let isum = vaddvq_s32(vaddq_s32(isum[0], isum[1]));
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_iq4_xs_q8_k(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockIQ4XS>(w), blocks_of::<BlockQ8K>(a));
    let table = vld1q_s8(KVALUES_IQ4NL.as_ptr());
    let mut sumf = 0.0f32;
    for (x, y) in w.iter().zip(a) {
        let d4d8 = x.d.to_f32() * y.d;
        for ib in 0..8 {
            let dl = d4d8 * x.ls(ib) as f32;
            let qs: &[u8; 16] = x.qs[16 * ib..16 * ib + 16].try_into().unwrap_or(&[0; 16]);
            let (x0, x1) = table_codes(table, qs);
            let ya = y.qs.as_ptr().add(32 * ib);
            let sumi = dot32(x0, x1, vld1q_s8(ya), vld1q_s8(ya.add(16)));
            sumf += dl * sumi as f32;
        }
    }
    sumf
}
