//! Scalar reference for the 4-bit float kinds: MXFP4 (E2M1 values sharing
//! one E8M0 exponent per 32) and NVFP4 (E2M1 values, one UE4M3 scale per 16).
//!
//! The key decision: like ggml, the E2M1 values are kept *doubled* as small
//! integers ([`E2M1_X2`]) so the dot is an integer sum, and both scale
//! decoders return half the true scale to compensate. Scales are built from
//! their bit patterns, never with `powf`, so they are exact.

use super::legacy::cvtt_i32;
use crate::blocks::*;
use crate::{Dequantize, Quantize, Unpack, VecDot};

/// Twice each E2M1 value, indexed by the 4-bit code (sign in bit 3).
pub(crate) const E2M1_X2: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// `2^k` for `k` in the normal f32 exponent range, exactly.
fn pow2(k: i32) -> f32 {
    f32::from_bits(((k + 127) as u32) << 23)
}

/// Half of the E8M0 scale `2^(e - 127)`, i.e. `2^(e - 128)`. Exponents 0 and
/// 1 give f32 subnormals; 255 (the E8M0 NaN) is decoded as a number, as ggml
/// does.
#[inline]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    f32::from_bits(bits)
}

/// Half of a UE4M3 scale (4 exponent bits, bias 7, 3 mantissa bits, no
/// sign). `0x7F` is the E4M3 NaN and decodes to 0; bit 7 is ignored.
fn ue4m3_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0xF);
    let man = f32::from(x & 0x7);
    let raw = if exp == 0 { man * pow2(-9) } else { (1.0 + man / 8.0) * pow2(exp - 7) };
    raw * 0.5
}

/// f32 → UE4M3, ggml's way: saturate at 448, round the mantissa by its
/// next bit (ties away from zero, carrying into the exponent), and
/// subnormals by `(int)(x * 512 + 0.5)`.
fn ue4m3_from_f32(x: f32) -> u8 {
    // `x > 0` is false for NaN too.
    if x.partial_cmp(&0.0) != Some(core::cmp::Ordering::Greater) {
        return 0;
    }
    let x = if x > 448.0 { 448.0 } else { x };
    let bits = x.to_bits();
    let mut exp = ((bits >> 23) & 0xFF) as i32 - 127 + 7;
    if exp <= 0 {
        let man = cvtt_i32(x * 512.0 + 0.5);
        return if man < 1 { 0 } else { man.min(7) as u8 };
    }
    if exp >= 15 {
        return 0x7E;
    }
    let mut man = ((bits >> 20) & 0x7) + ((bits >> 19) & 1);
    if man > 7 {
        man = 0;
        exp += 1;
        if exp >= 15 {
            return 0x7E;
        }
    }
    ((exp as u32) << 3 | man) as u8
}

/// The code whose scaled value is nearest `x`; the lowest code wins ties, so
/// +0 (code 0) is preferred to -0 (code 8).
fn nearest_e2m1(x: f32, half_scale: f32) -> u8 {
    let mut best = 0u8;
    let mut best_err = (f32::from(E2M1_X2[0]) * half_scale - x).abs();
    for (i, &k) in E2M1_X2.iter().enumerate().skip(1) {
        let err = (f32::from(k) * half_scale - x).abs();
        if err < best_err {
            best = i as u8;
            best_err = err;
        }
    }
    best
}

fn strict_absmax(src: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    for &v in src {
        if amax < v.abs() {
            amax = v.abs();
        }
    }
    amax
}

impl Dequantize for BlockMXFP4 {
    fn dequantize(&self, out: &mut [f32]) {
        let d = e8m0_half(self.e);
        for (j, &q) in self.qs.iter().enumerate() {
            out[j] = f32::from(E2M1_X2[usize::from(q & 0x0F)]) * d;
            out[j + 16] = f32::from(E2M1_X2[usize::from(q >> 4)]) * d;
        }
    }
}

impl Quantize for BlockMXFP4 {
    fn quantize(src: &[f32]) -> Self {
        let amax = strict_absmax(src);
        // Puts amax in [4, 8) times the scale, i.e. within E2M1's top binade
        // (4 and 6 are the largest codes, 6 being 12 doubled).
        let e = if amax > 0.0 { cvtt_i32(amax.log2().floor() - 2.0 + 127.0) as u8 } else { 0 };
        let d = e8m0_half(e);
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            *q = nearest_e2m1(src[j], d) | (nearest_e2m1(src[j + 16], d) << 4);
        }
        BlockMXFP4 { e, qs }
    }
}

impl VecDot for BlockMXFP4 {
    type Act = BlockQ8_0;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = y.d.to_f32() * e8m0_half(x.e);
            let (mut s1, mut s2) = (0i32, 0i32);
            for (j, &q) in x.qs.iter().enumerate() {
                s1 += i32::from(y.qs[j]) * i32::from(E2M1_X2[usize::from(q & 0x0F)]);
                s2 += i32::from(y.qs[j + 16]) * i32::from(E2M1_X2[usize::from(q >> 4)]);
            }
            sumf += d * (s1 + s2) as f32;
        }
        sumf
    }
}

impl Dequantize for BlockNVFP4 {
    fn dequantize(&self, out: &mut [f32]) {
        for (s, &scale) in self.d.iter().enumerate() {
            let d = ue4m3_half(scale);
            for j in 0..8 {
                let q = self.qs[s * 8 + j];
                out[s * 16 + j] = f32::from(E2M1_X2[usize::from(q & 0x0F)]) * d;
                out[s * 16 + j + 8] = f32::from(E2M1_X2[usize::from(q >> 4)]) * d;
            }
        }
    }
}

impl Quantize for BlockNVFP4 {
    fn quantize(src: &[f32]) -> Self {
        let mut b = BlockNVFP4 { d: [0; 4], qs: [0; 32] };
        for (s, xb) in src.chunks_exact(16).enumerate().take(4) {
            // 6 is E2M1's largest value: the scale maps it onto amax.
            let ue = ue4m3_from_f32(strict_absmax(xb) / 6.0);
            b.d[s] = ue;
            let d = ue4m3_half(ue);
            for j in 0..8 {
                b.qs[s * 8 + j] = nearest_e2m1(xb[j], d) | (nearest_e2m1(xb[j + 8], d) << 4);
            }
        }
        b
    }
}

impl VecDot for BlockNVFP4 {
    type Act = BlockQ8_0;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, ys) in w.iter().zip(a.chunks_exact(2)) {
            for (s, &scale) in x.d.iter().enumerate() {
                let d = ue4m3_half(scale);
                let y = &ys[s / 2];
                let off = (s % 2) * 16;
                let (mut lo, mut hi) = (0i32, 0i32);
                for j in 0..8 {
                    let q = x.qs[s * 8 + j];
                    lo += i32::from(y.qs[off + j]) * i32::from(E2M1_X2[usize::from(q & 0x0F)]);
                    hi += i32::from(y.qs[off + j + 8]) * i32::from(E2M1_X2[usize::from(q >> 4)]);
                }
                sumf += y.d.to_f32() * d * (lo + hi) as f32;
            }
        }
        sumf
    }
}

impl Unpack for BlockMXFP4 {
    const SUB: usize = 32;
    const OFFSET: i32 = 12;
    const CODE_MAX: i32 = 24;
    fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]) {
        for (j, &b) in self.qs.iter().enumerate() {
            q[j] = E2M1_X2[usize::from(b & 0x0F)];
            q[j + 16] = E2M1_X2[usize::from(b >> 4)];
        }
        (scale[0], bias[0]) = (e8m0_half(self.e), 0.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e8m0_half_is_two_to_the_e_minus_128() {
        assert_eq!(e8m0_half(128), 1.0);
        assert_eq!(e8m0_half(127), 0.5);
        assert_eq!(e8m0_half(130), 4.0);
        assert_eq!(e8m0_half(2), 2.0f32.powi(-126));
        // Below that, f32 subnormals.
        assert_eq!(e8m0_half(1), 2.0f32.powi(-127));
        assert_eq!(e8m0_half(0), 2.0f32.powi(-128));
    }

    #[test]
    fn ue4m3_decodes_normals_subnormals_and_nan_as_half_values() {
        // exp 7, man 0 → 1.0, halved.
        assert_eq!(ue4m3_half(0x38), 0.5);
        // exp 8, man 4 → 1.5 * 2 = 3.
        assert_eq!(ue4m3_half(0x44), 1.5);
        // Largest: exp 15, man 6 → 1.75 * 256 = 448.
        assert_eq!(ue4m3_half(0x7E), 224.0);
        // Subnormal: man 3 → 3 * 2^-9.
        assert_eq!(ue4m3_half(0x03), 3.0 / 1024.0);
        assert_eq!(ue4m3_half(0x7F), 0.0);
        assert_eq!(ue4m3_half(0x00), 0.0);
    }

    #[test]
    fn ue4m3_encoding_inverts_decoding_below_the_top_binade() {
        for code in 1u8..0x78 {
            let v = ue4m3_half(code) * 2.0;
            assert_eq!(ue4m3_from_f32(v), code, "{code:#x} = {v}");
        }
        // ggml sends the whole top binade (exponent 15, 256..448) to 448.
        for code in 0x78u8..0x7F {
            assert_eq!(ue4m3_from_f32(ue4m3_half(code) * 2.0), 0x7E, "{code:#x}");
        }
    }

    #[test]
    fn ue4m3_encoding_rounds_saturates_and_drops_nonpositive() {
        // 1.0625 is halfway between 1.0 and 1.125: ggml rounds up (0x39).
        assert_eq!(ue4m3_from_f32(1.0625), 0x39);
        assert_eq!(ue4m3_from_f32(1.06), 0x38);
        // 1.9375 rounds past 1.875 up to 2.0, carrying into the exponent.
        assert_eq!(ue4m3_from_f32(1.9375), 0x40);
        assert_eq!(ue4m3_from_f32(1.0e6), 0x7E);
        assert_eq!(ue4m3_from_f32(0.0), 0);
        assert_eq!(ue4m3_from_f32(-1.0), 0);
        assert_eq!(ue4m3_from_f32(f32::NAN), 0);
        // Below half the smallest subnormal (2^-10): zero.
        assert_eq!(ue4m3_from_f32(0.0009), 0);
    }

    #[test]
    fn mxfp4_quantize_of_exact_e2m1_values_is_lossless() {
        // amax 6 → floor(log2 6) = 2 → e = 127, scale 1: codes are E2M1 itself.
        let vals = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let x: Vec<f32> = (0..32).map(|j| if j % 2 == 0 { vals[j % 8] } else { -vals[j % 8] }).collect();
        let b = BlockMXFP4::quantize(&x);
        assert_eq!(b.e, 127);
        let mut out = [0.0f32; 32];
        b.dequantize(&mut out);
        assert_eq!(out.to_vec(), x);
        // 0.5 at index 1 negated is code 9; +0 at index 0 is code 0.
        assert_eq!(b.qs[0], 0);
        assert_eq!(b.qs[1] & 0x0F, 9);
    }

    #[test]
    fn mxfp4_quantize_picks_the_nearest_value_lowest_code_on_ties() {
        let mut x = [0.0f32; 32];
        x[0] = 6.0; // sets the scale to 1
        x[1] = 5.0; // halfway between 4 (code 6) and 6 (code 7): first wins
        x[2] = 2.4; // nearest 2 (code 4)
        x[3] = -0.2; // nearest 0: +0 (code 0) before -0 (code 8)
        let b = BlockMXFP4::quantize(&x);
        assert_eq!(b.qs[0] & 0x0F, 7);
        assert_eq!(b.qs[1] & 0x0F, 6);
        assert_eq!(b.qs[2] & 0x0F, 4);
        assert_eq!(b.qs[3] & 0x0F, 0);
    }

    #[test]
    fn nvfp4_keeps_one_scale_per_sixteen_elements() {
        // Sub-block s has amax 6 * 2^s: scale codes for 1, 2, 4, 8.
        let x: Vec<f32> = (0..64).map(|i| {
            let s = i / 16;
            let v = [0.5f32, 1.0, 6.0, -3.0][i % 4];
            v * (1 << s) as f32
        }).collect();
        let b = BlockNVFP4::quantize(&x);
        assert_eq!(b.d, [0x38, 0x40, 0x48, 0x50]);
        let mut out = [0.0f32; 64];
        b.dequantize(&mut out);
        assert_eq!(out.to_vec(), x);
    }

    fn q8_0_row(src: &[f32]) -> Vec<BlockQ8_0> {
        src.chunks_exact(32).map(BlockQ8_0::quantize).collect()
    }

    fn check_dot<W: VecDot<Act = BlockQ8_0> + Dequantize + Quantize>(seed: u32) {
        let n = 256;
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state as f32 / u32::MAX as f32) * 2.0 - 1.0
        };
        let xw: Vec<f32> = (0..n).map(|_| next() * 3.0).collect();
        let xa: Vec<f32> = (0..n).map(|_| next()).collect();
        let w: Vec<W> = xw.chunks_exact(W::ELEMS).map(W::quantize).collect();
        let a = q8_0_row(&xa);
        let mut dw = vec![0.0f32; n];
        for (b, o) in w.iter().zip(dw.chunks_exact_mut(W::ELEMS)) {
            b.dequantize(o);
        }
        let mut da = vec![0.0f32; n];
        for (b, o) in a.iter().zip(da.chunks_exact_mut(32)) {
            b.dequantize(o);
        }
        let exact: f64 = dw.iter().zip(&da).map(|(&p, &q)| f64::from(p) * f64::from(q)).sum();
        let mag: f64 = dw.iter().zip(&da).map(|(&p, &q)| f64::from((p * q).abs())).sum();
        let got = f64::from(W::vec_dot(&w, &a));
        assert!((got - exact).abs() <= mag * 1e-5, "{:?}: {got} vs {exact}", W::KIND);
    }

    #[test]
    fn fp4_dots_equal_the_dot_of_the_dequantized_rows() {
        for seed in 0..10 {
            check_dot::<BlockMXFP4>(seed);
            check_dot::<BlockNVFP4>(seed);
        }
    }
}
