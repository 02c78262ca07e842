//! Scalar reference for the plain float and integer kinds.
//!
//! The key decision: conversions reproduce ggml's *software* converters bit
//! for bit, including their NaN handling, rather than trusting a library or
//! the hardware: ggml turns every f16 NaN into the canonical `0x7E00` and
//! quiets bf16 NaNs by setting bit 6, and the dots accumulate f32 products in
//! f64 exactly as ggml's scalar `ggml_vec_dot_{f32,f16,bf16}` do.

use crate::blocks::*;
use crate::{Dequantize, Quantize, VecDot};

/// f32 → f16 as ggml's `GGML_FP32_TO_FP16`: round to nearest even, and any
/// NaN becomes the canonical quiet NaN (sign kept). `half` alone would keep
/// the NaN payload, which F16C hardware does but ggml's reference does not.
pub(super) fn f16_from_f32(x: f32) -> F16 {
    if x.is_nan() {
        let sign = ((x.to_bits() >> 16) & 0x8000) as u16;
        F16::from_bits(sign | 0x7E00)
    } else {
        F16::from_f32(x)
    }
}

/// f32 → bf16 as ggml's `GGML_FP32_TO_BF16`: round to nearest even by
/// integer add, NaN forced quiet with its payload's top bits kept.
pub(super) fn bf16_from_f32(x: f32) -> BF16 {
    let u = x.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return BF16::from_bits(((u >> 16) | 64) as u16);
    }
    // Cannot overflow: the largest finite input plus the bias stays below 2^32.
    BF16::from_bits(((u + (0x7fff + ((u >> 16) & 1))) >> 16) as u16)
}

/// The sum ggml's scalar float dots compute: each product rounded to f32,
/// accumulated in f64, the total rounded back to f32.
fn dot_f64<T: Copy>(w: &[T], a: &[T], to_f32: impl Fn(T) -> f32) -> f32 {
    let mut sum = 0.0f64;
    for (&x, &y) in w.iter().zip(a) {
        sum += f64::from(to_f32(x) * to_f32(y));
    }
    sum as f32
}

impl Dequantize for f32 {
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = *self;
    }
}

impl Quantize for f32 {
    fn quantize(src: &[f32]) -> Self {
        src[0]
    }
}

impl VecDot for f32 {
    type Act = f32;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        dot_f64(w, a, |x| x)
    }
}

impl Dequantize for F16 {
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = self.to_f32();
    }
}

impl Quantize for F16 {
    fn quantize(src: &[f32]) -> Self {
        f16_from_f32(src[0])
    }
}

impl VecDot for F16 {
    type Act = F16;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        dot_f64(w, a, F16::to_f32)
    }
}

impl Dequantize for BF16 {
    fn dequantize(&self, out: &mut [f32]) {
        // Exact: bf16 is the top half of an f32.
        out[0] = f32::from_bits(u32::from(self.to_bits()) << 16);
    }
}

impl Quantize for BF16 {
    fn quantize(src: &[f32]) -> Self {
        bf16_from_f32(src[0])
    }
}

impl VecDot for BF16 {
    type Act = BF16;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        dot_f64(w, a, |x: BF16| f32::from_bits(u32::from(x.to_bits()) << 16))
    }
}

impl Dequantize for f64 {
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = *self as f32;
    }
}

impl Quantize for f64 {
    fn quantize(src: &[f32]) -> Self {
        f64::from(src[0])
    }
}

impl Dequantize for i8 {
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = f32::from(*self);
    }
}

impl Dequantize for i16 {
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = f32::from(*self);
    }
}

impl Dequantize for i32 {
    fn dequantize(&self, out: &mut [f32]) {
        // Round to nearest even above 2^24, as C's (float) cast on x86.
        out[0] = *self as f32;
    }
}

impl Dequantize for i64 {
    fn dequantize(&self, out: &mut [f32]) {
        out[0] = *self as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_ties_to_even_and_up_past_the_half() {
        // 1.0 + 2^-8 is exactly halfway between bf16 1.0 (even) and 1.0078125.
        assert_eq!(bf16_from_f32(f32::from_bits(0x3f80_8000)).to_bits(), 0x3f80);
        // 1.0078125 + 2^-8 is halfway with an odd lower neighbour: rounds up.
        assert_eq!(bf16_from_f32(f32::from_bits(0x3f81_8000)).to_bits(), 0x3f82);
        // Just above halfway rounds up.
        assert_eq!(bf16_from_f32(f32::from_bits(0x3f80_8001)).to_bits(), 0x3f81);
        // The largest finite f32 rounds to infinity.
        assert_eq!(bf16_from_f32(f32::MAX).to_bits(), 0x7f80);
        assert_eq!(bf16_from_f32(-2.5).to_bits(), 0xc020);
    }

    #[test]
    fn bf16_quiets_a_signalling_nan_and_keeps_its_top_payload() {
        // Signalling NaN with payload in the top mantissa bits 0x7f81_0000.
        assert_eq!(bf16_from_f32(f32::from_bits(0x7f81_0000)).to_bits(), 0x7fc1);
        // A NaN whose payload lives only in the low bits must stay a NaN.
        assert_eq!(bf16_from_f32(f32::from_bits(0xff80_0001)).to_bits(), 0xffc0);
    }

    #[test]
    fn f16_turns_every_nan_into_the_canonical_quiet_nan() {
        assert_eq!(f16_from_f32(f32::from_bits(0x7f81_2345)).to_bits(), 0x7e00);
        assert_eq!(f16_from_f32(f32::from_bits(0xffc0_0001)).to_bits(), 0xfe00);
        // Round to nearest even at the f16 precision: 1 + 2^-11 is a tie.
        assert_eq!(f16_from_f32(1.0 + 1.0 / 2048.0).to_bits(), 0x3c00);
        assert_eq!(f16_from_f32(1.0 + 3.0 / 2048.0).to_bits(), 0x3c02);
        assert_eq!(f16_from_f32(65520.0).to_bits(), 0x7c00);
    }

    #[test]
    fn float_dots_accumulate_in_f64() {
        // In f32, 1e8 + 1 == 1e8, so an f32 accumulator returns 0 here.
        let w = [1.0e8f32, 1.0, -1.0e8];
        let a = [1.0f32, 1.0, 1.0];
        assert_eq!(f32::vec_dot(&w, &a), 1.0);
        let w16: Vec<F16> = [2048.0f32, 1.0, -2048.0].iter().map(|&x| F16::from_f32(x)).collect();
        // 2048 * 8192 = 2^24, and 2^24 + 1 is not an f32.
        let a16: Vec<F16> = [8192.0f32, 1.0, 8192.0].iter().map(|&x| F16::from_f32(x)).collect();
        assert_eq!(F16::vec_dot(&w16, &a16), 1.0);
        let wb: Vec<BF16> = [1.0e8f32, 1.0, -1.0e8].iter().map(|&x| bf16_from_f32(x)).collect();
        let ab: Vec<BF16> = [1.0f32, 1.0, 1.0].iter().map(|&x| bf16_from_f32(x)).collect();
        assert_eq!(BF16::vec_dot(&wb, &ab), 1.0);
    }

    #[test]
    fn integer_and_f64_kinds_dequantize_by_cast() {
        let mut o = [0.0f32];
        (-7i8).dequantize(&mut o);
        assert_eq!(o[0], -7.0);
        (-30000i16).dequantize(&mut o);
        assert_eq!(o[0], -30000.0);
        // 2^24 + 1 is not an f32: ties to even gives 2^24.
        16_777_217i32.dequantize(&mut o);
        assert_eq!(o[0], 16_777_216.0);
        (-5i32).dequantize(&mut o);
        assert_eq!(o[0], -5.0);
        (1i64 << 40).dequantize(&mut o);
        assert_eq!(o[0], 1_099_511_627_776.0);
        0.1f64.dequantize(&mut o);
        assert_eq!(o[0], 0.1f32);
        assert_eq!(f64::quantize(&[0.1f32]), f64::from(0.1f32));
    }
}
