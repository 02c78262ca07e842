//! Scalar reference for the ternary kinds TQ1_0 and TQ2_0 (values in
//! `{-1, 0, 1} * d`, one f16 scale per 256), dotted with Q8_K activations.
//!
//! The key decision: TQ1_0's base-3 packing is decoded as ggml does, by
//! multiplying the byte by a power of three in *wrapping* u8 arithmetic and
//! taking the top bits of `q * 3` — the byte stores `ceil(v * 256 / 243)`, a
//! fixed-point fraction whose leading trit is shifted out by each multiply.
//! The element order this yields (trit `n` of byte `m` is element
//! `n * 32 + m` within each 160-element group) is the format, so it is
//! reproduced loop for loop rather than restated as a formula.

use super::float::f16_from_f32;
use crate::blocks::*;
use crate::{Dequantize, Quantize, VecDot};

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Trit `n` (most significant first) of a TQ1_0 byte, as 0, 1 or 2.
fn trit(byte: u8, n: usize) -> i32 {
    let q = byte.wrapping_mul(POW3[n]);
    i32::from((u16::from(q) * 3) >> 8)
}

/// `lroundf(v) + 1`: round half away from zero, then shift -1..1 to 0..2.
/// A NaN gives code 1, as ggml's `long` → `int` truncation of glibc's
/// `LONG_MIN` does on x86-64.
fn ternary_code(v: f32) -> i32 {
    (v.round() as i32).wrapping_add(1)
}

/// Packs five codes (0..2, first most significant) into a fixed-point byte.
/// Arithmetic wraps at each step as ggml's `uint8_t` does.
fn pack_trits(codes: impl Iterator<Item = i32>) -> u8 {
    let mut q = 0u8;
    for c in codes {
        q = (i32::from(q) * 3) as u8;
        q = (i32::from(q) + c) as u8;
    }
    (u32::from(q) * 256).div_ceil(243) as u8
}

/// ggml's `MAX`-based absmax for the ternary kinds (a NaN is replaced by the
/// next value rather than kept).
fn absmax(src: &[f32]) -> f32 {
    src.iter().fold(0.0f32, |m, v| if m > v.abs() { m } else { v.abs() })
}

fn inverse_or_zero(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Calls `f(element, byte_index_in_qs_or_qh, trit)` in TQ1_0's element order.
/// `byte` is an index into `qs` (0..48) or, offset by 48, into `qh`.
fn tq1_order(mut f: impl FnMut(usize, usize, usize)) {
    let mut e = 0;
    // 32 bytes of five trits, then 16 bytes of five trits.
    for (start, width) in [(0usize, 32usize), (32, 16)] {
        for n in 0..5 {
            for m in 0..width {
                f(e, start + m, n);
                e += 1;
            }
        }
    }
    // 4 bytes of four trits each.
    for n in 0..4 {
        for j in 0..4 {
            f(e, 48 + j, n);
            e += 1;
        }
    }
}

impl BlockTQ1_0 {
    fn byte(&self, i: usize) -> u8 {
        if i < 48 {
            self.qs[i]
        } else {
            self.qh[i - 48]
        }
    }
}

impl Dequantize for BlockTQ1_0 {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        tq1_order(|e, byte, n| out[e] = (trit(self.byte(byte), n) - 1) as f32 * d);
    }
}

impl Quantize for BlockTQ1_0 {
    fn quantize(src: &[f32]) -> Self {
        let d = absmax(src);
        let id = inverse_or_zero(d);
        let code = |i: usize| ternary_code(src[i] * id);
        let mut b = BlockTQ1_0 { qs: [0; 48], qh: [0; 4], d: f16_from_f32(d) };
        for m in 0..32 {
            b.qs[m] = pack_trits((0..5).map(|n| code(m + n * 32)));
        }
        for m in 0..16 {
            b.qs[32 + m] = pack_trits((0..5).map(|n| code(160 + m + n * 16)));
        }
        for j in 0..4 {
            // Four trits plus a trailing zero trit, so the first is the most
            // significant of five like everywhere else.
            b.qh[j] = pack_trits((0..4).map(|n| code(240 + j + n * 4)).chain([0]));
        }
        b
    }
}

impl VecDot for BlockTQ1_0 {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let mut sum = 0i32;
            tq1_order(|e, byte, n| sum += (trit(x.byte(byte), n) - 1) * i32::from(y.qs[e]));
            sumf += sum as f32 * (x.d.to_f32() * y.d);
        }
        sumf
    }
}

/// Element `j * 4 + l * 32 + m` lives in bits `2l..2l+2` of byte `j + m`
/// (`j` stepping by 32): four 32-wide planes per 32 bytes.
fn tq2_code(b: &BlockTQ2_0, e: usize) -> i32 {
    let (half, rest) = (e / 128, e % 128);
    let (l, m) = (rest / 32, rest % 32);
    i32::from((b.qs[half * 32 + m] >> (l * 2)) & 3)
}

impl Dequantize for BlockTQ2_0 {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (e, o) in out.iter_mut().enumerate().take(256) {
            *o = (tq2_code(self, e) - 1) as f32 * d;
        }
    }
}

impl Quantize for BlockTQ2_0 {
    fn quantize(src: &[f32]) -> Self {
        let d = absmax(src);
        let id = inverse_or_zero(d);
        let mut qs = [0u8; 64];
        for (i, q) in qs.iter_mut().enumerate() {
            let (half, m) = (i / 32, i % 32);
            for n in 0..4 {
                let c = ternary_code(src[half * 128 + n * 32 + m] * id);
                *q = q.wrapping_add(((c & 3) << (2 * n)) as u8);
            }
        }
        BlockTQ2_0 { qs, d: f16_from_f32(d) }
    }
}

impl VecDot for BlockTQ2_0 {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let mut sumi = 0i32;
            for (e, &q) in y.qs.iter().enumerate() {
                sumi += i32::from(q) * (tq2_code(x, e) - 1);
            }
            sumf += sumi as f32 * (y.d * x.d.to_f32());
        }
        sumf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic ternary pattern with an irregular period.
    fn ternary(e: usize) -> f32 {
        [1.0f32, -1.0, 0.0, 0.0, 1.0, 1.0, -1.0][(e * 5 + e / 7) % 7]
    }

    fn check_ternary_round_trip<B: Quantize + Dequantize>() {
        let x: Vec<f32> = (0..256).map(|e| ternary(e) * 0.75).collect();
        let b = B::quantize(&x);
        let mut out = vec![0.0f32; 256];
        b.dequantize(&mut out);
        assert_eq!(out, x, "{:?}", B::KIND);
    }

    #[test]
    fn ternary_values_round_trip_exactly() {
        check_ternary_round_trip::<BlockTQ1_0>();
        check_ternary_round_trip::<BlockTQ2_0>();
    }

    #[test]
    fn tq1_0_byte_holds_five_trits_as_a_ceiling_fraction() {
        // Codes 2,1,0,2,1 = 2*81 + 27 + 0 + 2*3 + 1 = 196; ceil(196*256/243) = 207.
        assert_eq!(pack_trits([2, 1, 0, 2, 1].into_iter()), 207);
        let t: Vec<i32> = (0..5).map(|n| trit(207, n)).collect();
        assert_eq!(t, [2, 1, 0, 2, 1]);
        // All twos: 242 → ceil(242*256/243) = 255.
        assert_eq!(pack_trits([2; 5].into_iter()), 255);
    }

    #[test]
    fn tq1_0_element_order_interleaves_bytes_within_each_group() {
        // Element 1 is trit 0 of byte 1; element 32 is trit 1 of byte 0;
        // element 160 is trit 0 of byte 32; element 241 is trit 0 of qh[1].
        let mut x = [0.0f32; 256];
        x[1] = 1.0;
        x[32] = -1.0;
        x[160] = 1.0;
        x[241] = -1.0;
        let b = BlockTQ1_0::quantize(&x);
        assert_eq!(trit(b.qs[1], 0), 2);
        assert_eq!(trit(b.qs[0], 1), 0);
        assert_eq!(trit(b.qs[0], 0), 1);
        assert_eq!(trit(b.qs[32], 0), 2);
        assert_eq!(trit(b.qh[1], 0), 0);
        assert_eq!(trit(b.qh[1], 1), 1);
    }

    #[test]
    fn tq2_0_element_order_is_four_planes_of_32() {
        // Element 32 is bits 2..4 of byte 0; element 128 is bits 0..2 of byte 32.
        let mut x = [0.0f32; 256];
        x[32] = 1.0;
        x[128] = -1.0;
        let b = BlockTQ2_0::quantize(&x);
        // Byte 0: element 0 (0 → 1), 32 (1 → 2), 64 and 96 (0 → 1).
        assert_eq!(b.qs[0], 0b01_01_10_01);
        assert_eq!(b.qs[32], 0b01_01_01_00);
    }

    fn q8k(e0: usize, d: f32) -> BlockQ8K {
        let mut qs = [0i8; 256];
        for (e, q) in qs.iter_mut().enumerate() {
            *q = (((e + e0) * 37) % 255) as i8;
        }
        let mut bsums = [0i16; 16];
        for (g, s) in bsums.iter_mut().enumerate() {
            *s = qs[g * 16..g * 16 + 16].iter().map(|&q| i16::from(q)).sum();
        }
        BlockQ8K { d, qs, bsums }
    }

    fn check_dot<B: VecDot<Act = BlockQ8K> + Quantize>() {
        let x: Vec<f32> = (0..512).map(|e| ternary(e) * 0.5).collect();
        let w: Vec<B> = x.chunks_exact(256).map(B::quantize).collect();
        let a = [q8k(3, 0.25), q8k(11, 0.125)];
        // Integer sums times power-of-two scales: the expected value is exact.
        let mut expect = 0.0f64;
        for (blk, y) in a.iter().enumerate() {
            let s: i64 = (0..256).map(|e| ternary(blk * 256 + e) as i64 * i64::from(y.qs[e])).sum();
            expect += s as f64 * 0.5 * f64::from(y.d);
        }
        assert_eq!(f64::from(B::vec_dot(&w, &a)), expect, "{:?}", B::KIND);
    }

    #[test]
    fn ternary_dots_equal_the_integer_sum_times_both_scales() {
        check_dot::<BlockTQ1_0>();
        check_dot::<BlockTQ2_0>();
    }
}
