//! Scalar reference for ggml's first-generation formats (Q4_0, Q4_1, Q5_0,
//! Q5_1, Q8_0, Q8_1) and the sign/2-bit Q1_0 and Q2_0.
//!
//! The key decision: every float expression keeps ggml's operation order and
//! its C conversion semantics (`(int8_t)` truncation, `roundf` rounding half
//! away from zero, `MAX` that lets a later operand replace a NaN), because
//! Q8_0 and Q8_1 are the *activation* formats: a one-ulp difference in a
//! scale here moves every dot product of every kernel tested against this.
//! ggml quantizes a row two ways, and so do we: a weight through the
//! reference (`quantize_row_q8_0_ref`: `1 / d`, `roundf`; [`Quantize`],
//! llama-quantize's bytes), an activation before a dot product through the
//! CPU backend's x86 SIMD quantizer (`127 / amax`, ties to even;
//! `quantize_activation`). The two part on ties, which real activations hit
//! often enough to move a Gemma 3 embedding (decision 0048).

use super::float::f16_from_f32;
use crate::blocks::*;
use crate::{Dequantize, Quantize, Unpack, VecDot};

/// ggml's `MAX(a, b)`: `a > b ? a : b`, so a NaN `b` wins but a NaN `a` is
/// replaced by the next `b` — unlike `f32::max`.
fn c_max(a: f32, b: f32) -> f32 {
    if a > b {
        a
    } else {
        b
    }
}

/// ggml's `d ? 1.0f/d : 0.0f` (a NaN `d` is truthy in C, and in `!=`).
fn inverse_or_zero(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// The value of largest magnitude, signed: the first one wins a tie, so the
/// scale's sign follows ggml's (Q4_0/Q5_0 map it to the most negative code).
fn signed_absmax(src: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in src {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

/// ggml's min/max scan for the `d * q + m` kinds, starting at ±`FLT_MAX`.
fn min_max(src: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in src {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// C's float → int conversion as x86 executes it (`cvttss2si`): truncate
/// toward zero, and NaN or out-of-range gives `i32::MIN` — not Rust's
/// saturating `as`, which would turn a NaN input's code into a different byte.
pub(super) fn cvtt_i32(v: f32) -> i32 {
    if !(-2_147_483_648.0..2_147_483_648.0).contains(&v) {
        i32::MIN
    } else {
        v as i32
    }
}

/// `(int8_t)(v)`: truncate to int32, keep the low byte.
fn trunc_i8(v: f32) -> i8 {
    cvtt_i32(v) as i8
}

/// `roundf(v)` stored into an `int8_t` (half away from zero).
fn round_i8(v: f32) -> i8 {
    cvtt_i32(v.round()) as i8
}

fn q8_absmax_scale(src: &[f32]) -> f32 {
    let amax = src.iter().fold(0.0f32, |m, v| c_max(m, v.abs()));
    amax / 127.0
}

/// The fifth bits of a Q5 block: element `j` of the low half at bit `j`,
/// element `j + 16` at bit `j + 16`, returned in place (0 or 0x10).
fn q5_high_bits(qh: [u8; 4], j: usize) -> (u8, u8) {
    let qh = u32::from_le_bytes(qh);
    let h0 = (((qh >> j) << 4) & 0x10) as u8;
    let h1 = ((qh >> (j + 12)) & 0x10) as u8;
    (h0, h1)
}

impl Dequantize for BlockQ4_0 {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (j, &q) in self.qs.iter().enumerate() {
            out[j] = (i32::from(q & 0x0F) - 8) as f32 * d;
            out[j + 16] = (i32::from(q >> 4) - 8) as f32 * d;
        }
    }
}

impl Quantize for BlockQ4_0 {
    fn quantize(src: &[f32]) -> Self {
        let d = signed_absmax(src) / -8.0;
        let id = inverse_or_zero(d);
        let code = |v: f32| i32::from(trunc_i8(v * id + 8.5)).min(15) as u8;
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            *q = code(src[j]) | (code(src[j + 16]) << 4);
        }
        BlockQ4_0 { d: f16_from_f32(d), qs }
    }
}

impl VecDot for BlockQ4_0 {
    type Act = BlockQ8_0;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let (mut s0, mut s1) = (0i32, 0i32);
            for (j, &q) in x.qs.iter().enumerate() {
                s0 += (i32::from(q & 0x0F) - 8) * i32::from(y.qs[j]);
                s1 += (i32::from(q >> 4) - 8) * i32::from(y.qs[j + 16]);
            }
            sumf += (s0 + s1) as f32 * x.d.to_f32() * y.d.to_f32();
        }
        sumf
    }
}

impl Dequantize for BlockQ4_1 {
    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (j, &q) in self.qs.iter().enumerate() {
            out[j] = f32::from(q & 0x0F) * d + m;
            out[j + 16] = f32::from(q >> 4) * d + m;
        }
    }
}

impl Quantize for BlockQ4_1 {
    fn quantize(src: &[f32]) -> Self {
        let (min, max) = min_max(src);
        let d = (max - min) / 15.0;
        let id = inverse_or_zero(d);
        let code = |v: f32| i32::from(trunc_i8((v - min) * id + 0.5)).min(15) as u8;
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            *q = code(src[j]) | (code(src[j + 16]) << 4);
        }
        BlockQ4_1 { d: f16_from_f32(d), m: f16_from_f32(min), qs }
    }
}

impl VecDot for BlockQ4_1 {
    type Act = BlockQ8_1;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let (mut s0, mut s1) = (0i32, 0i32);
            for (j, &q) in x.qs.iter().enumerate() {
                s0 += i32::from(q & 0x0F) * i32::from(y.qs[j]);
                s1 += i32::from(q >> 4) * i32::from(y.qs[j + 16]);
            }
            sumf += (x.d.to_f32() * y.d.to_f32()) * (s0 + s1) as f32 + x.m.to_f32() * y.s.to_f32();
        }
        sumf
    }
}

impl Dequantize for BlockQ5_0 {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (j, &q) in self.qs.iter().enumerate() {
            let (h0, h1) = q5_high_bits(self.qh, j);
            out[j] = (i32::from((q & 0x0F) | h0) - 16) as f32 * d;
            out[j + 16] = (i32::from((q >> 4) | h1) - 16) as f32 * d;
        }
    }
}

impl Quantize for BlockQ5_0 {
    fn quantize(src: &[f32]) -> Self {
        let d = signed_absmax(src) / -16.0;
        let id = inverse_or_zero(d);
        let code = |v: f32| i32::from(trunc_i8(v * id + 16.5)).min(31) as u8;
        let mut qs = [0u8; 16];
        let mut qh = 0u32;
        for (j, q) in qs.iter_mut().enumerate() {
            let (x0, x1) = (code(src[j]), code(src[j + 16]));
            *q = (x0 & 0x0F) | ((x1 & 0x0F) << 4);
            qh |= u32::from((x0 & 0x10) >> 4) << j;
            qh |= u32::from((x1 & 0x10) >> 4) << (j + 16);
        }
        BlockQ5_0 { d: f16_from_f32(d), qh: qh.to_le_bytes(), qs }
    }
}

impl VecDot for BlockQ5_0 {
    type Act = BlockQ8_0;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let (mut s0, mut s1) = (0i32, 0i32);
            for (j, &q) in x.qs.iter().enumerate() {
                let (h0, h1) = q5_high_bits(x.qh, j);
                s0 += (i32::from((q & 0x0F) | h0) - 16) * i32::from(y.qs[j]);
                s1 += (i32::from((q >> 4) | h1) - 16) * i32::from(y.qs[j + 16]);
            }
            sumf += (x.d.to_f32() * y.d.to_f32()) * (s0 + s1) as f32;
        }
        sumf
    }
}

impl Dequantize for BlockQ5_1 {
    fn dequantize(&self, out: &mut [f32]) {
        let (d, m) = (self.d.to_f32(), self.m.to_f32());
        for (j, &q) in self.qs.iter().enumerate() {
            let (h0, h1) = q5_high_bits(self.qh, j);
            out[j] = f32::from((q & 0x0F) | h0) * d + m;
            out[j + 16] = f32::from((q >> 4) | h1) * d + m;
        }
    }
}

impl Quantize for BlockQ5_1 {
    fn quantize(src: &[f32]) -> Self {
        let (min, max) = min_max(src);
        let d = (max - min) / 31.0;
        let id = inverse_or_zero(d);
        // No clamp to 31 here, exactly as ggml: (max - min) * id rounds to at most 31.
        let code = |v: f32| cvtt_i32((v - min) * id + 0.5) as u8;
        let mut qs = [0u8; 16];
        let mut qh = 0u32;
        for (j, q) in qs.iter_mut().enumerate() {
            let (x0, x1) = (code(src[j]), code(src[j + 16]));
            *q = (x0 & 0x0F) | ((x1 & 0x0F) << 4);
            qh |= u32::from((x0 & 0x10) >> 4) << j;
            qh |= u32::from((x1 & 0x10) >> 4) << (j + 16);
        }
        BlockQ5_1 { d: f16_from_f32(d), m: f16_from_f32(min), qh: qh.to_le_bytes(), qs }
    }
}

impl VecDot for BlockQ5_1 {
    type Act = BlockQ8_1;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let (mut s0, mut s1) = (0i32, 0i32);
            for (j, &q) in x.qs.iter().enumerate() {
                let (h0, h1) = q5_high_bits(x.qh, j);
                s0 += i32::from((q & 0x0F) | h0) * i32::from(y.qs[j]);
                s1 += i32::from((q >> 4) | h1) * i32::from(y.qs[j + 16]);
            }
            sumf += (x.d.to_f32() * y.d.to_f32()) * (s0 + s1) as f32 + x.m.to_f32() * y.s.to_f32();
        }
        sumf
    }
}

impl Dequantize for BlockQ8_0 {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = f32::from(q) * d;
        }
    }
}

impl Quantize for BlockQ8_0 {
    fn quantize(src: &[f32]) -> Self {
        let d = q8_absmax_scale(src);
        let id = inverse_or_zero(d);
        let mut qs = [0i8; 32];
        for (q, &v) in qs.iter_mut().zip(src) {
            *q = round_i8(v * id);
        }
        BlockQ8_0 { d: f16_from_f32(d), qs }
    }
}

impl VecDot for BlockQ8_0 {
    type Act = BlockQ8_0;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let sumi: i32 = x.qs.iter().zip(&y.qs).map(|(&p, &q)| i32::from(p) * i32::from(q)).sum();
            sumf += sumi as f32 * (x.d.to_f32() * y.d.to_f32());
        }
        sumf
    }
}

/// The codes and scale of one Q8_0/Q8_1 block as ggml's CPU backend
/// quantizes an *activation* row on x86 (`quantize_row_q8_0` and
/// `quantize_row_q8_1` in `ggml-cpu/arch/x86/quants.c`, the `from_float` of
/// every AVX/AVX2/AVX-512 build): the inverse scale is `127 / amax` and the
/// codes are rounded half to even (`_mm256_round_ps` with
/// `_MM_ROUND_NEAREST`), where the reference quantizer that writes weights
/// (`quantize_row_q8_0_ref`, [`Quantize`] here) takes `1 / d` and `roundf`.
/// The two part on ties, which are common in real activations: a model's
/// norm weights and embedding rows have short mantissas, so `x * id` lands
/// on a half more often than chance would have it.
fn q8_act_codes(src: &[f32]) -> (f32, [i8; 32]) {
    let amax = src.iter().fold(0.0f32, |m, v| c_max(m, v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut qs = [0i8; 32];
    for (q, &v) in qs.iter_mut().zip(src) {
        // `_mm256_cvtps_epi32` then the saturating packs: the code of a
        // rounded product past i8's range is its bound.
        *q = cvtt_i32((v * id).round_ties_even()).clamp(-128, 127) as i8;
    }
    (d, qs)
}

impl BlockQ8_0 {
    /// One block of an activation row as ggml's CPU backend quantizes it
    /// for a dot product on x86: `127 / amax`, ties rounded to even;
    /// [`Quantize::quantize`] is the weight quantizer (llama-quantize's
    /// bytes: `1 / d`, `roundf`).
    pub fn quantize_activation(src: &[f32]) -> Self {
        let (d, qs) = q8_act_codes(src);
        BlockQ8_0 { d: f16_from_f32(d), qs }
    }
}

impl BlockQ8_1 {
    /// One block of an activation row as ggml's CPU backend quantizes it
    /// on x86 (as [`BlockQ8_0::quantize_activation`]), with `s` the code
    /// sum times the f32 scale.
    pub fn quantize_activation(src: &[f32]) -> Self {
        let (d, qs) = q8_act_codes(src);
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        BlockQ8_1 { d: f16_from_f32(d), s: f16_from_f32(sum as f32 * d), qs }
    }
}

/// ggml has no `dequantize_row_q8_1` (Q8_1 is activation-only); this is the
/// obvious `d * q`, with `s` ignored since it is derived data.
impl Dequantize for BlockQ8_1 {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = f32::from(q) * d;
        }
    }
}

impl Quantize for BlockQ8_1 {
    fn quantize(src: &[f32]) -> Self {
        let d = q8_absmax_scale(src);
        let id = inverse_or_zero(d);
        let mut qs = [0i8; 32];
        for (q, &v) in qs.iter_mut().zip(src) {
            *q = round_i8(v * id);
        }
        // `s` is the sum of the stored codes times the unrounded f32 scale.
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        BlockQ8_1 { d: f16_from_f32(d), s: f16_from_f32(sum as f32 * d), qs }
    }
}

/// Not a ggml weight/activation pair (ggml has no Q8_1·Q8_1 dot); it exists
/// so every kind the table lists has a dot, and follows the Q8_0 dot.
impl VecDot for BlockQ8_1 {
    type Act = BlockQ8_1;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let sumi: i32 = x.qs.iter().zip(&y.qs).map(|(&p, &q)| i32::from(p) * i32::from(q)).sum();
            sumf += sumi as f32 * (x.d.to_f32() * y.d.to_f32());
        }
        sumf
    }
}

impl Dequantize for BlockQ1_0 {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (j, o) in out.iter_mut().enumerate().take(128) {
            *o = if (self.qs[j / 8] >> (j % 8)) & 1 == 1 { d } else { -d };
        }
    }
}

impl Quantize for BlockQ1_0 {
    fn quantize(src: &[f32]) -> Self {
        let sum_abs = src.iter().fold(0.0f32, |s, v| s + v.abs());
        let d = sum_abs / 128.0;
        let mut qs = [0u8; 16];
        for (j, &v) in src.iter().enumerate().take(128) {
            // `>=`: zero and -0.0 are stored as +d, a NaN as -d.
            if v >= 0.0 {
                qs[j / 8] |= 1 << (j % 8);
            }
        }
        BlockQ1_0 { d: f16_from_f32(d), qs }
    }
}

impl VecDot for BlockQ1_0 {
    type Act = BlockQ8_0;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, ys) in w.iter().zip(a.chunks_exact(4)) {
            let mut sumi = 0.0f32;
            for (k, y) in ys.iter().enumerate() {
                let mut block = 0i32;
                for (j, &q) in y.qs.iter().enumerate() {
                    let bit = (x.qs[k * 4 + j / 8] >> (j % 8)) & 1;
                    block += if bit == 1 { i32::from(q) } else { -i32::from(q) };
                }
                sumi += y.d.to_f32() * block as f32;
            }
            sumf += x.d.to_f32() * sumi;
        }
        sumf
    }
}

impl Dequantize for BlockQ2_0 {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (j, o) in out.iter_mut().enumerate().take(64) {
            let q = (self.qs[j / 4] >> ((j % 4) * 2)) & 3;
            *o = (i32::from(q) - 1) as f32 * d;
        }
    }
}

impl Quantize for BlockQ2_0 {
    fn quantize(src: &[f32]) -> Self {
        let mut amax = 0.0f32;
        for &v in src {
            if v.abs() > amax {
                amax = v.abs();
            }
        }
        let d = amax;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut qs = [0u8; 16];
        for (j, &v) in src.iter().enumerate().take(64) {
            let q = cvtt_i32((v * id).round()).saturating_add(1).clamp(0, 3) as u8;
            qs[j / 4] |= q << ((j % 4) * 2);
        }
        BlockQ2_0 { d: f16_from_f32(d), qs }
    }
}

impl VecDot for BlockQ2_0 {
    type Act = BlockQ8_0;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, ys) in w.iter().zip(a.chunks_exact(2)) {
            let mut sumi = 0.0f32;
            for (k, y) in ys.iter().enumerate() {
                let mut block = 0i32;
                for (j, &q) in y.qs.iter().enumerate() {
                    let code = (x.qs[k * 8 + j / 4] >> ((j % 4) * 2)) & 3;
                    block += (i32::from(code) - 1) * i32::from(q);
                }
                sumi += y.d.to_f32() * block as f32;
            }
            sumf += x.d.to_f32() * sumi;
        }
        sumf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Block;
    use rand::{Rng, SeedableRng};

    fn random_row(seed: u64, n: usize, scale: f32) -> Vec<f32> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        (0..n).map(|_| (rng.gen::<f32>() * 2.0 - 1.0) * scale).collect()
    }

    fn deq<B: Dequantize>(b: &B) -> Vec<f32> {
        let mut out = vec![0.0; B::ELEMS];
        b.dequantize(&mut out);
        out
    }

    fn quantize_row<B: Quantize>(src: &[f32]) -> Vec<B> {
        src.chunks_exact(B::ELEMS).map(B::quantize).collect()
    }

    fn deq_row<B: Dequantize>(blocks: &[B]) -> Vec<f32> {
        blocks.iter().flat_map(deq).collect()
    }

    /// `sum w*a` in f64 over the dequantized rows: what an exact dot would give.
    fn exact_dot(w: &[f32], a: &[f32]) -> f64 {
        w.iter().zip(a).map(|(&x, &y)| f64::from(x) * f64::from(y)).sum()
    }

    #[test]
    fn q8_0_quantize_rounds_half_away_from_zero_with_scale_from_absmax() {
        // amax 127 gives d = 1 and id = 1, so the codes are roundf(x) itself.
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        for (j, v) in x.iter_mut().enumerate().skip(1) {
            *v = j as f32 - 16.5;
        }
        let b = BlockQ8_0::quantize(&x);
        assert_eq!(b.d.to_f32(), 1.0);
        assert_eq!(b.qs[0], 127);
        // -15.5 → -16, -0.5 → -1, 0.5 → 1, 14.5 → 15 (round-half-even would give -16, 0, 0, 14).
        assert_eq!(b.qs[1], -16);
        assert_eq!(b.qs[16], -1);
        assert_eq!(b.qs[17], 1);
        assert_eq!(b.qs[31], 15);
    }

    /// Weights round ties away from zero (`roundf`, llama-quantize's
    /// bytes), activations to even (ggml's x86 `quantize_row_q8_0`): amax
    /// 127 makes `id` 1, so every `x.5` is a tie.
    #[test]
    fn q8_activations_round_ties_to_even_and_weights_away_from_zero() {
        let mut x = [0.0f32; 32];
        x[0] = 127.0;
        x[1..6].copy_from_slice(&[0.5, 1.5, 2.5, -0.5, -2.5]);
        let w = BlockQ8_0::quantize(&x);
        let a = BlockQ8_0::quantize_activation(&x);
        assert_eq!(w.qs[..6], [127, 1, 2, 3, -1, -3]);
        assert_eq!(a.qs[..6], [127, 0, 2, 2, 0, -2]);
        assert_eq!(a.d.to_bits(), w.d.to_bits());
        let a1 = BlockQ8_1::quantize_activation(&x);
        assert_eq!(a1.qs, a.qs);
        assert_eq!(a1.s.to_f32(), 129.0);
        assert_eq!(BlockQ8_0::quantize_activation(&[0.0; 32]).qs, [0; 32]);
    }

    #[test]
    fn q8_0_quantize_of_zeros_is_a_zero_block() {
        let b = BlockQ8_0::quantize(&[0.0; 32]);
        assert_eq!(b.d.to_bits(), 0);
        assert_eq!(b.qs, [0; 32]);
    }

    #[test]
    fn q8_1_sum_field_is_code_sum_times_the_f32_scale() {
        let x = random_row(1, 32, 3.0);
        let b = BlockQ8_1::quantize(&x);
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let sum: i32 = b.qs.iter().map(|&q| i32::from(q)).sum();
        assert_eq!(b.s.to_bits(), F16::from_f32(sum as f32 * d).to_bits());
        assert_eq!(b.d.to_bits(), F16::from_f32(d).to_bits());
        // The codes are Q8_0's codes.
        assert_eq!(b.qs, BlockQ8_0::quantize(&x).qs);
    }

    #[test]
    fn q4_0_quantize_of_a_hand_built_ramp_gives_its_own_codes() {
        // Largest magnitude -8 → d = 1, and x + 8 is the code.
        let x: Vec<f32> = (0..32).map(|j| (j % 16) as f32 - 8.0).collect();
        let b = BlockQ4_0::quantize(&x);
        assert_eq!(b.d.to_f32(), 1.0);
        for j in 0..16 {
            assert_eq!(b.qs[j], (j as u8) * 0x11, "byte {j}");
        }
        assert_eq!(deq(&b), x);
    }

    #[test]
    fn q4_0_scale_takes_the_sign_of_the_first_largest_magnitude() {
        // +4 at index 3 and -4 at index 5: the first wins, d = 4 / -8 = -0.5.
        let mut x = [0.0f32; 32];
        x[3] = 4.0;
        x[5] = -4.0;
        let b = BlockQ4_0::quantize(&x);
        assert_eq!(b.d.to_f32(), -0.5);
        // +4 → code 0 (the most negative), -4 → 8 + 8 = 16 clamped to 15.
        assert_eq!(b.qs[3] & 0x0F, 0);
        assert_eq!(b.qs[5] & 0x0F, 15);
    }

    #[test]
    fn q5_0_dequantize_reads_fifth_bits_from_qh() {
        let b = BlockQ5_0 {
            d: F16::from_f32(0.25),
            qh: (1u32 | (1 << 16) | (1 << 31)).to_le_bytes(),
            qs: [0x21; 16],
        };
        let out = deq(&b);
        // Element 0: low nibble 1 plus 16 from qh bit 0 → 17 - 16 = 1.
        assert_eq!(out[0], 0.25);
        // Element 1: 1 - 16 = -15.
        assert_eq!(out[1], -15.0 * 0.25);
        // Element 16: high nibble 2 plus qh bit 16 → 18 - 16 = 2.
        assert_eq!(out[16], 0.5);
        assert_eq!(out[17], -14.0 * 0.25);
        // Element 31: qh bit 31 → 2.
        assert_eq!(out[31], 0.5);
    }

    #[test]
    fn q5_1_dequantize_adds_the_min_after_scaling() {
        let b = BlockQ5_1 {
            d: F16::from_f32(0.5),
            m: F16::from_f32(-3.0),
            qh: (1u32 << 20).to_le_bytes(),
            qs: [0xF3; 16],
        };
        let out = deq(&b);
        assert_eq!(out[0], 3.0 * 0.5 - 3.0);
        assert_eq!(out[16], 15.0 * 0.5 - 3.0);
        // Element 20: high nibble 15 plus 16 → 31.
        assert_eq!(out[20], 31.0 * 0.5 - 3.0);
    }

    #[test]
    fn q4_1_quantize_maps_min_to_0_and_max_to_15() {
        let x: Vec<f32> = (0..32).map(|j| 1.0 + (j % 16) as f32 * 0.5).collect();
        let b = BlockQ4_1::quantize(&x);
        assert_eq!(b.m.to_f32(), 1.0);
        assert_eq!(b.d.to_f32(), 0.5);
        for j in 0..16 {
            assert_eq!(b.qs[j], (j as u8) * 0x11);
        }
    }

    /// Every element comes back within `max_err(block)` of the input.
    fn assert_round_trip<B: Quantize + Dequantize>(max_err: impl Fn(&[f32]) -> f32) {
        for seed in 0..20 {
            let x = random_row(seed, B::ELEMS * 4, 2.0 + seed as f32);
            let y = deq_row(&quantize_row::<B>(&x));
            for (xb, yb) in x.chunks(B::ELEMS).zip(y.chunks(B::ELEMS)) {
                // Slack for the f16 rounding of the scale and min.
                let amax = xb.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let tol = max_err(xb) + amax * 2e-3;
                for (a, b) in xb.iter().zip(yb) {
                    assert!((a - b).abs() <= tol, "{:?}: {a} vs {b} (tol {tol})", B::KIND);
                }
            }
        }
    }

    fn amax(x: &[f32]) -> f32 {
        x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
    }

    fn range(x: &[f32]) -> f32 {
        let (min, max) = min_max(x);
        max - min
    }

    #[test]
    fn legacy_kinds_round_trip_within_their_step() {
        // Q4_0/Q5_0 put the largest magnitude on the most negative code, so a
        // value of the opposite sign is clamped: up to one whole step off.
        assert_round_trip::<BlockQ4_0>(|x| amax(x) / 8.0);
        assert_round_trip::<BlockQ5_0>(|x| amax(x) / 16.0);
        // The rest round to nearest: half a step.
        assert_round_trip::<BlockQ4_1>(|x| range(x) / 15.0 * 0.5);
        assert_round_trip::<BlockQ5_1>(|x| range(x) / 31.0 * 0.5);
        assert_round_trip::<BlockQ8_0>(|x| amax(x) / 127.0 * 0.5);
        assert_round_trip::<BlockQ8_1>(|x| amax(x) / 127.0 * 0.5);
        assert_round_trip::<BlockQ2_0>(|x| amax(x) * 0.5);
    }

    #[test]
    fn float_to_int_conversions_follow_x86_for_nan_and_overflow() {
        assert_eq!(cvtt_i32(f32::NAN), i32::MIN);
        assert_eq!(cvtt_i32(3.0e9), i32::MIN);
        assert_eq!(cvtt_i32(-2.7), -2);
        // ggml's one-NaN Q2_0 row: the NaN's code is INT_MIN + 1 clamped to 0
        // (Rust's saturating `as` would give 0 + 1 = code 1).
        let mut x = [0.5f32; 64];
        x[13] = f32::NAN;
        let b = BlockQ2_0::quantize(&x);
        assert_eq!((b.qs[3] >> 2) & 3, 0);
        assert_eq!(b.qs[3] & 3, 2);
    }

    #[test]
    fn q1_0_stores_signs_and_the_mean_magnitude() {
        let mut x: Vec<f32> = (0..128).map(|j| if j % 3 == 0 { -2.0 } else { 1.0 + (j % 2) as f32 }).collect();
        x[8] = 0.0;
        x[9] = -0.0;
        let b = BlockQ1_0::quantize(&x);
        let mean = x.iter().map(|v| v.abs()).sum::<f32>() / 128.0;
        assert_eq!(b.d.to_bits(), F16::from_f32(mean).to_bits());
        let out = deq(&b);
        let d = b.d.to_f32();
        for (j, (&v, &o)) in x.iter().zip(&out).enumerate() {
            assert_eq!(o, if v >= 0.0 { d } else { -d }, "element {j}");
        }
        // Zero of either sign counts as non-negative.
        assert_eq!((out[8], out[9]), (d, d));
        // Bit j of the block is element j, least significant first.
        assert_eq!(b.qs[0], 0b1011_0110);
    }

    #[test]
    fn q2_0_codes_are_rounded_ratio_plus_one_clamped() {
        let mut x = [0.0f32; 64];
        x[0] = -4.0; // -1 → code 0
        x[1] = 4.0; //  1 → code 2
        x[2] = 1.9; //  0.475 → 0 → code 1
        x[3] = 2.0; //  0.5 → 1 (half away) → code 2
        x[4] = -2.0; // -0.5 → -1 → code 0
        let b = BlockQ2_0::quantize(&x);
        assert_eq!(b.d.to_f32(), 4.0);
        assert_eq!(b.qs[0], 0b10_01_10_00);
        assert_eq!(b.qs[1] & 3, 0);
        // The rest are zero → code 1.
        assert_eq!(b.qs[2], 0b01_01_01_01);
        let out = deq(&b);
        assert_eq!(&out[..5], &[-4.0, 4.0, 0.0, 4.0, -4.0]);
    }

    /// Each dot equals the exact dot of the dequantized rows up to f32
    /// accumulation error, and is exactly it for integer-valued scales.
    fn assert_dot_matches_dequantized<W: VecDot + Quantize + Dequantize>(rel: f64)
    where
        W::Act: Dequantize,
    {
        let n = W::ELEMS.max(<W::Act as Block>::ELEMS) * 8;
        for seed in 0..10 {
            let xw = random_row(100 + seed, n, 1.5);
            let xa = random_row(200 + seed, n, 3.0);
            let w = quantize_row::<W>(&xw);
            let a = quantize_row::<W::Act>(&xa);
            let exact = exact_dot(&deq_row(&w), &deq_row(&a));
            let got = f64::from(W::vec_dot(&w, &a));
            let mag: f64 = deq_row(&w).iter().zip(deq_row(&a)).map(|(&x, y)| f64::from((x * y).abs())).sum();
            assert!((got - exact).abs() <= mag * rel + 1e-6, "{:?}: {got} vs {exact}", W::KIND);
        }
    }

    #[test]
    fn legacy_dots_equal_the_dot_of_the_dequantized_rows() {
        assert_dot_matches_dequantized::<BlockQ4_0>(1e-5);
        assert_dot_matches_dequantized::<BlockQ5_0>(1e-5);
        assert_dot_matches_dequantized::<BlockQ8_0>(1e-5);
        assert_dot_matches_dequantized::<BlockQ8_1>(1e-5);
        assert_dot_matches_dequantized::<BlockQ1_0>(1e-5);
        assert_dot_matches_dequantized::<BlockQ2_0>(1e-5);
        // The min term uses the activation's stored f16 `s`, not its codes.
        assert_dot_matches_dequantized::<BlockQ4_1>(2e-3);
        assert_dot_matches_dequantized::<BlockQ5_1>(2e-3);
    }

    #[test]
    fn q4_1_dot_uses_the_activation_sum_for_the_min_term() {
        // With all codes 0 the weight is just m; the dot is m * s.
        let w = BlockQ4_1 { d: F16::from_f32(1.0), m: F16::from_f32(2.0), qs: [0; 16] };
        let a = BlockQ8_1 { d: F16::from_f32(1.0), s: F16::from_f32(-7.0), qs: [1; 32] };
        // s is used as stored, not recomputed from qs (which would give 64).
        assert_eq!(BlockQ4_1::vec_dot(&[w], &[a]), -14.0);
    }
}

// ---------------------------------------------------------------- Unpack

/// One 32-element block of nibble-plus-high-bit quants with one affine map.
fn unpack_32(q: &mut [i8], lo_hi: impl Fn(usize) -> (u8, u8), sub: i8) {
    for j in 0..16 {
        let (a, b) = lo_hi(j);
        q[j] = a as i8 - sub;
        q[j + 16] = b as i8 - sub;
    }
}

impl Unpack for BlockQ4_0 {
    const SUB: usize = 32;
    const OFFSET: i32 = 8;
    const CODE_MAX: i32 = 15;
    fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]) {
        unpack_32(q, |j| (self.qs[j] & 0x0F, self.qs[j] >> 4), 8);
        (scale[0], bias[0]) = (self.d.to_f32(), 0.0);
    }
}

impl Unpack for BlockQ4_1 {
    const SUB: usize = 32;
    const OFFSET: i32 = 0;
    const CODE_MAX: i32 = 15;
    fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]) {
        unpack_32(q, |j| (self.qs[j] & 0x0F, self.qs[j] >> 4), 0);
        (scale[0], bias[0]) = (self.d.to_f32(), self.m.to_f32());
    }
}

impl Unpack for BlockQ5_0 {
    const SUB: usize = 32;
    const OFFSET: i32 = 16;
    const CODE_MAX: i32 = 31;
    fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]) {
        unpack_32(
            q,
            |j| {
                let (h0, h1) = q5_high_bits(self.qh, j);
                ((self.qs[j] & 0x0F) | h0, (self.qs[j] >> 4) | h1)
            },
            16,
        );
        (scale[0], bias[0]) = (self.d.to_f32(), 0.0);
    }
}

impl Unpack for BlockQ5_1 {
    const SUB: usize = 32;
    const OFFSET: i32 = 0;
    const CODE_MAX: i32 = 31;
    fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]) {
        unpack_32(
            q,
            |j| {
                let (h0, h1) = q5_high_bits(self.qh, j);
                ((self.qs[j] & 0x0F) | h0, (self.qs[j] >> 4) | h1)
            },
            0,
        );
        (scale[0], bias[0]) = (self.d.to_f32(), self.m.to_f32());
    }
}

impl Unpack for BlockQ8_0 {
    const SUB: usize = 32;
    const OFFSET: i32 = 128;
    const CODE_MAX: i32 = 255;
    fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]) {
        q[..32].copy_from_slice(&self.qs);
        (scale[0], bias[0]) = (self.d.to_f32(), 0.0);
    }
}
