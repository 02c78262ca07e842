//! Scalar reference for the K-quants (Q2_K … Q6_K) and their activation
//! format Q8_K.
//!
//! Key decision: every quantizer, dequantizer and dot follows ggml's
//! reference C (`quantize_row_q*_K_ref`, `dequantize_row_q*_K`,
//! `ggml_vec_dot_q*_K_q8_K_generic`) float operation for float operation, so
//! the bytes and the f32 results are bit-identical. The dots keep ggml's
//! eight-lane float accumulators: integer partial sums are exact in any order,
//! but the float sums across blocks are not, and the lane structure is part of
//! the result.
//!
//! Inputs shorter than a block are read as zero-padded and outputs shorter
//! than a block are filled as far as they go: the row-level entry points
//! check lengths, and a block-level call never panics.

// Index loops mirror ggml's C loops one for one, which keeps the
// bit-exactness reviewable line by line.
#![allow(clippy::needless_range_loop)]

use super::kquant_util::{get_scale_min_k4, make_q3_quants, make_qkx2_quants, make_qx_quants, nearest_int, GROUP_MAX_EPS};
use crate::blocks::*;
use crate::{Dequantize, Quantize, Unpack, VecDot};
use bytemuck::Zeroable;

/// One block's input, zero-padded, so the quantizers can index freely.
fn load(src: &[f32]) -> [f32; QK_K] {
    let mut x = [0.0f32; QK_K];
    for (d, &s) in x.iter_mut().zip(src) {
        *d = s;
    }
    x
}

/// Writes `vals` into `out` as far as both go.
fn store(out: &mut [f32], vals: &[f32; QK_K]) {
    for (o, &v) in out.iter_mut().zip(vals) {
        *o = v;
    }
}

/// Packs 2-bit quants (Q2_K, and Q3_K's low bits): in each 128-value half,
/// byte `l` holds values `l`, `l+32`, `l+64`, `l+96` from the low bits up.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for half in 0..2 {
        let j = half * 128;
        for i in 0..32 {
            qs[j / 4 + i] = l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

/// The inverse of [`pack_2bit`]: the 2-bit value at element position `e`.
#[inline]
fn unpack_2bit(qs: &[u8; QK_K / 4], e: usize) -> u8 {
    let (half, r) = (e / 128, e % 128);
    (qs[half * 32 + r % 32] >> (2 * (r / 32))) & 3
}

/// Q3_K's sixteen 6-bit scales, minus their bias of 32: low nibbles in bytes
/// 0..8 (sub-blocks 0..8 low, 8..16 high), top two bits in bytes 8..12.
pub(crate) fn q3_scales(s: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 { s[j] & 0xF } else { s[j - 8] >> 4 };
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// Q4_K/Q5_K's eight 6-bit scales and mins.
pub(crate) fn k4_scales_mins(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..8 {
        (sc[j], mn[j]) = get_scale_min_k4(j, s);
    }
    (sc, mn)
}

/// ggml's eight integer lanes: element `e` contributes
/// `scale[e / per_scale] * w[e] * a[e]` to lane `e % 8`.
fn lane_sums(w: &[i8; QK_K], a: &[i8; QK_K], scales: &[i32], per_scale: usize) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (e, (&wq, &aq)) in w.iter().zip(a).enumerate() {
        let prod = i32::from(wq) * i32::from(aq);
        lanes[e % 8] += scales[e / per_scale] * prod;
    }
    lanes
}

/// The float tail shared by the Q3_K…Q6_K dots: per-lane sums across
/// blocks, the `mins` correction accumulated separately, lanes added last.
struct LaneAcc {
    sums: [f32; 8],
    sumf: f32,
}

impl LaneAcc {
    fn new() -> Self {
        Self { sums: [0.0; 8], sumf: 0.0 }
    }
    fn add_lanes(&mut self, d: f32, lanes: &[i32; 8]) {
        for (s, &l) in self.sums.iter_mut().zip(lanes) {
            *s += d * l as f32;
        }
    }
    fn finish(mut self) -> f32 {
        for s in self.sums {
            self.sumf += s;
        }
        self.sumf
    }
}

/// Q4_K/Q5_K's mins term: `sum_j bsums[j] * min[j / 2]`.
pub(crate) fn mins_dot(bsums: &[i16; 16], mins: &[u8; 8]) -> i32 {
    bsums.iter().enumerate().map(|(j, &b)| i32::from(b) * i32::from(mins[j / 2])).sum()
}

// ---------------------------------------------------------------- Q8_K

impl Dequantize for BlockQ8K {
    fn dequantize(&self, out: &mut [f32]) {
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = self.d * q as f32;
        }
    }
}

impl Quantize for BlockQ8K {
    fn quantize(src: &[f32]) -> Self {
        let x = load(src);
        let mut y = Self::zeroed();
        let mut max = 0.0f32;
        let mut amax = 0.0f32;
        for &v in &x {
            let ax = v.abs();
            if ax > amax {
                amax = ax;
                max = v;
            }
        }
        // ggml leaves `bsums` untouched for an all-zero block; zero is the
        // only value consistent with the (zero) quants.
        if amax == 0.0 {
            return y;
        }
        // -127 rather than -128 so no quant is -128 (IQ2 SIMD relies on it).
        let iscale = -127.0f32 / max;
        for (q, &v) in y.qs.iter_mut().zip(&x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (b, chunk) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
            *b = chunk.iter().map(|&q| i32::from(q)).sum::<i32>() as i16;
        }
        y.d = 1.0 / iscale;
        y
    }
}

/// ggml has no Q8_K × Q8_K dot; this one exists so that Q8_K rows can be
/// checked like any other kind: `sum_blocks (dw * da) * sum(qw * qa)`.
impl VecDot for BlockQ8K {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let sumi: i32 = x.qs.iter().zip(&y.qs).map(|(&p, &q)| i32::from(p) * i32::from(q)).sum();
            sumf += x.d * y.d * sumi as f32;
        }
        sumf
    }
}

// ---------------------------------------------------------------- Q4_K

/// Q4_K and Q5_K share everything up to the final rounding: per 32-value
/// sub-block an asymmetric fit, then 6-bit scales and mins relative to the
/// largest of each. Returns the block header and the quants in `0..=nmax`.
fn quantize_k4_header(x: &[f32; QK_K], nmax: i32, rmin: f32, nstep: i32) -> (F16, F16, [u8; 12], [u8; QK_K]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; 8];
    let mut mins = [0.0f32; 8];
    let mut max_scale = 0.0f32;
    let mut max_min = 0.0f32;
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0.0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0.0f32; 32];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let (s, m) = make_qkx2_quants(nmax, xs, &weights, &mut l[32 * j..32 * j + 32], rmin, 0.1, nstep, false);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; 12];
    for j in 0..8 {
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let d = F16::from_f32(max_scale / 63.0);
    let dmin = F16::from_f32(max_min / 63.0);
    let (df, dminf) = (d.to_f32(), dmin.to_f32());
    for j in 0..8 {
        let (sc, m) = get_scale_min_k4(j, &packed);
        let dj = df * sc as f32;
        if dj == 0.0 {
            continue;
        }
        let dm = dminf * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / dj).clamp(0, nmax) as u8;
        }
    }
    (d, dmin, packed, l)
}

impl Dequantize for BlockQ4K {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let min = self.dmin.to_f32();
        let (sc, mn) = k4_scales_mins(&self.scales);
        let mut y = [0.0f32; QK_K];
        for (c, q) in self.qs.chunks_exact(32).enumerate() {
            let (d1, m1) = (d * sc[2 * c] as f32, min * mn[2 * c] as f32);
            let (d2, m2) = (d * sc[2 * c + 1] as f32, min * mn[2 * c + 1] as f32);
            for (l, &b) in q.iter().enumerate() {
                y[64 * c + l] = d1 * (b & 0xF) as f32 - m1;
                y[64 * c + 32 + l] = d2 * (b >> 4) as f32 - m2;
            }
        }
        store(out, &y);
    }
}

impl Quantize for BlockQ4K {
    fn quantize(src: &[f32]) -> Self {
        let x = load(src);
        let (d, dmin, scales, l) = quantize_k4_header(&x, 15, -1.0, 20);
        let mut y = Self { d, dmin, scales, qs: [0; 128] };
        for (c, q) in y.qs.chunks_exact_mut(32).enumerate() {
            for (i, b) in q.iter_mut().enumerate() {
                *b = l[64 * c + i] | (l[64 * c + i + 32] << 4);
            }
        }
        y
    }
}

impl BlockQ4K {
    fn quants(&self) -> [i8; QK_K] {
        let mut a = [0i8; QK_K];
        for (c, q) in self.qs.chunks_exact(32).enumerate() {
            for (l, &b) in q.iter().enumerate() {
                a[64 * c + l] = (b & 0xF) as i8;
                a[64 * c + 32 + l] = (b >> 4) as i8;
            }
        }
        a
    }
}

impl VecDot for BlockQ4K {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut acc = LaneAcc::new();
        for (x, y) in w.iter().zip(a) {
            let (sc, mn) = k4_scales_mins(&x.scales);
            let scales = sc.map(i32::from);
            let lanes = lane_sums(&x.quants(), &y.qs, &scales, 32);
            acc.add_lanes(x.d.to_f32() * y.d, &lanes);
            let dmin = x.dmin.to_f32() * y.d;
            acc.sumf -= dmin * mins_dot(&y.bsums, &mn) as f32;
        }
        acc.finish()
    }
}

// ---------------------------------------------------------------- Q5_K

impl Dequantize for BlockQ5K {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let min = self.dmin.to_f32();
        let a = self.quants();
        let (sc, mn) = k4_scales_mins(&self.scales);
        let mut y = [0.0f32; QK_K];
        for (e, v) in y.iter_mut().enumerate() {
            let s = e / 32;
            *v = d * sc[s] as f32 * a[e] as f32 - min * mn[s] as f32;
        }
        store(out, &y);
    }
}

impl Quantize for BlockQ5K {
    fn quantize(src: &[f32]) -> Self {
        let x = load(src);
        let (d, dmin, scales, l) = quantize_k4_header(&x, 31, -0.5, 15);
        let mut y = Self { d, dmin, scales, qh: [0; 32], qs: [0; 128] };
        for c in 0..4 {
            let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
            for j in 0..32 {
                let mut l1 = l[64 * c + j];
                if l1 > 15 {
                    l1 -= 16;
                    y.qh[j] |= m1;
                }
                let mut l2 = l[64 * c + j + 32];
                if l2 > 15 {
                    l2 -= 16;
                    y.qh[j] |= m2;
                }
                y.qs[32 * c + j] = l1 | (l2 << 4);
            }
        }
        y
    }
}

impl BlockQ5K {
    /// Quants in `0..32`: nibble plus the high bit, which for 64-value
    /// chunk `c` lives in bits `2c` (first 32) and `2c+1` (second 32) of `qh`.
    fn quants(&self) -> [i8; QK_K] {
        let mut a = [0i8; QK_K];
        for (c, q) in self.qs.chunks_exact(32).enumerate() {
            let (u1, u2) = (1u8 << (2 * c), 2u8 << (2 * c));
            for (l, &b) in q.iter().enumerate() {
                let h = self.qh[l];
                a[64 * c + l] = ((b & 0xF) + if h & u1 != 0 { 16 } else { 0 }) as i8;
                a[64 * c + 32 + l] = ((b >> 4) + if h & u2 != 0 { 16 } else { 0 }) as i8;
            }
        }
        a
    }
}

impl VecDot for BlockQ5K {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut acc = LaneAcc::new();
        for (x, y) in w.iter().zip(a) {
            let (sc, mn) = k4_scales_mins(&x.scales);
            let scales = sc.map(i32::from);
            let lanes = lane_sums(&x.quants(), &y.qs, &scales, 32);
            acc.add_lanes(x.d.to_f32() * y.d, &lanes);
            let dmin = x.dmin.to_f32() * y.d;
            acc.sumf -= dmin * mins_dot(&y.bsums, &mn) as f32;
        }
        acc.finish()
    }
}

// ---------------------------------------------------------------- Q6_K

impl BlockQ6K {
    /// Quants in `-32..32`: per 128-value half, `ql` holds four nibble
    /// streams (bytes 0..32 low/high, 32..64 low/high) and `qh` their top
    /// two bits, 2 bits per stream.
    fn quants(&self) -> [i8; QK_K] {
        let mut a = [0i8; QK_K];
        for half in 0..2 {
            let ql = &self.ql[64 * half..64 * half + 64];
            let qh = &self.qh[32 * half..32 * half + 32];
            let base = 128 * half;
            for l in 0..32 {
                a[base + l] = ((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8 - 32;
                a[base + l + 32] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                a[base + l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                a[base + l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
            }
        }
        a
    }
}

impl Dequantize for BlockQ6K {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let a = self.quants();
        let mut y = [0.0f32; QK_K];
        for (e, v) in y.iter_mut().enumerate() {
            *v = d * self.scales[e / 16] as f32 * a[e] as f32;
        }
        store(out, &y);
    }
}

impl Quantize for BlockQ6K {
    fn quantize(src: &[f32]) -> Self {
        let x = load(src);
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_abs_scale = 0.0f32;
        for ib in 0..16 {
            let s = make_qx_quants(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16], 1, None);
            scales[ib] = s;
            if s.abs() > max_abs_scale {
                max_abs_scale = s.abs();
                max_scale = s;
            }
        }
        let mut y = Self::zeroed();
        if max_abs_scale < GROUP_MAX_EPS {
            return y;
        }
        let iscale = -128.0f32 / max_scale;
        y.d = F16::from_f32(1.0 / iscale);
        for (s, &f) in y.scales.iter_mut().zip(&scales) {
            *s = nearest_int(iscale * f).min(127) as i8;
        }
        let df = y.d.to_f32();
        for j in 0..16 {
            let d = df * y.scales[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
            }
        }
        let l = l.map(|v| v as u8);
        for half in 0..2 {
            let j = 128 * half;
            for i in 0..32 {
                let q1 = l[j + i] & 0xF;
                let q2 = l[j + i + 32] & 0xF;
                let q3 = l[j + i + 64] & 0xF;
                let q4 = l[j + i + 96] & 0xF;
                y.ql[64 * half + i] = q1 | (q3 << 4);
                y.ql[64 * half + i + 32] = q2 | (q4 << 4);
                y.qh[32 * half + i] =
                    (l[j + i] >> 4) | ((l[j + i + 32] >> 4) << 2) | ((l[j + i + 64] >> 4) << 4) | ((l[j + i + 96] >> 4) << 6);
            }
        }
        y
    }
}

impl VecDot for BlockQ6K {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut acc = LaneAcc::new();
        for (x, y) in w.iter().zip(a) {
            let scales = x.scales.map(i32::from);
            let lanes = lane_sums(&x.quants(), &y.qs, &scales, 16);
            acc.add_lanes(x.d.to_f32() * y.d, &lanes);
        }
        acc.finish()
    }
}

// ---------------------------------------------------------------- Q3_K

impl BlockQ3K {
    /// Quants in `-4..4`: two low bits from `qs`, and 4 subtracted unless
    /// the high bit is set; `hmask` byte `e % 32`, bit `e / 32`.
    fn quants(&self) -> [i8; QK_K] {
        let mut a = [0i8; QK_K];
        for (e, v) in a.iter_mut().enumerate() {
            let hi = self.hmask[e % 32] & (1 << (e / 32)) != 0;
            *v = unpack_2bit(&self.qs, e) as i8 - if hi { 0 } else { 4 };
        }
        a
    }
}

impl Dequantize for BlockQ3K {
    fn dequantize(&self, out: &mut [f32]) {
        let d_all = self.d.to_f32();
        let scales = q3_scales(&self.scales);
        let a = self.quants();
        let mut y = [0.0f32; QK_K];
        for (e, v) in y.iter_mut().enumerate() {
            let dl = d_all * scales[e / 16] as f32;
            *v = dl * a[e] as f32;
        }
        store(out, &y);
    }
}

impl Quantize for BlockQ3K {
    fn quantize(src: &[f32]) -> Self {
        let x = load(src);
        let mut l = [0i8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut amax = 0.0f32;
        for j in 0..16 {
            let s = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16], true);
            scales[j] = s;
            if s.abs() > amax {
                amax = s.abs();
                max_scale = s;
            }
        }
        let mut y = Self::zeroed();
        if max_scale != 0.0 {
            let iscale = -32.0f32 / max_scale;
            for (j, &s) in scales.iter().enumerate() {
                let q = ((nearest_int(iscale * s) as i8).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    y.scales[j] = q & 0xF;
                } else {
                    y.scales[j - 8] |= (q & 0xF) << 4;
                }
                y.scales[j % 4 + 8] |= (q >> 4) << (2 * (j / 4));
            }
            y.d = F16::from_f32(1.0 / iscale);
        }
        let df = y.d.to_f32();
        let sc = q3_scales(&y.scales);
        for j in 0..16 {
            let d = df * sc[j] as f32;
            if d == 0.0 {
                continue;
            }
            for ii in 0..16 {
                l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
            }
        }
        let mut lu = l.map(|v| v as u8);
        for (e, v) in lu.iter_mut().enumerate() {
            if *v > 3 {
                y.hmask[e % 32] |= 1 << (e / 32);
                *v -= 4;
            }
        }
        pack_2bit(&lu, &mut y.qs);
        y
    }
}

impl VecDot for BlockQ3K {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut acc = LaneAcc::new();
        for (x, y) in w.iter().zip(a) {
            let scales = q3_scales(&x.scales).map(i32::from);
            let lanes = lane_sums(&x.quants(), &y.qs, &scales, 16);
            acc.add_lanes(x.d.to_f32() * y.d, &lanes);
        }
        acc.finish()
    }
}

// ---------------------------------------------------------------- Q2_K

impl Dequantize for BlockQ2K {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        let min = self.dmin.to_f32();
        let mut y = [0.0f32; QK_K];
        for (e, v) in y.iter_mut().enumerate() {
            let sc = self.scales[e / 16];
            let dl = d * (sc & 0xF) as f32;
            let ml = min * (sc >> 4) as f32;
            *v = dl * unpack_2bit(&self.qs, e) as f32 - ml;
        }
        store(out, &y);
    }
}

impl Quantize for BlockQ2K {
    fn quantize(src: &[f32]) -> Self {
        const Q4SCALE: f32 = 15.0;
        let x = load(src);
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 16];
        let mut mins = [0.0f32; 16];
        let mut max_scale = 0.0f32;
        let mut max_min = 0.0f32;
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let mut weights = [0.0f32; 16];
            for (w, &v) in weights.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = make_qkx2_quants(3, xs, &weights, &mut l[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
            scales[j] = s;
            mins[j] = m;
            if s > max_scale {
                max_scale = s;
            }
            if m > max_min {
                max_min = m;
            }
        }
        let mut y = Self::zeroed();
        if max_scale > 0.0 {
            let iscale = Q4SCALE / max_scale;
            for (q, &s) in y.scales.iter_mut().zip(&scales) {
                *q = nearest_int(iscale * s) as u8;
            }
            y.d = F16::from_f32(max_scale / Q4SCALE);
        }
        if max_min > 0.0 {
            let iscale = Q4SCALE / max_min;
            for (q, &m) in y.scales.iter_mut().zip(&mins) {
                *q |= (nearest_int(iscale * m) << 4) as u8;
            }
            y.dmin = F16::from_f32(max_min / Q4SCALE);
        }
        let (df, dminf) = (y.d.to_f32(), y.dmin.to_f32());
        for j in 0..16 {
            let d = df * (y.scales[j] & 0xF) as f32;
            if d == 0.0 {
                continue;
            }
            let dm = dminf * (y.scales[j] >> 4) as f32;
            for ii in 0..16 {
                l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
            }
        }
        pack_2bit(&l, &mut y.qs);
        y
    }
}

impl VecDot for BlockQ2K {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let summs: i32 = y.bsums.iter().zip(&x.scales).map(|(&b, &s)| i32::from(b) * i32::from(s >> 4)).sum();
            let dall = y.d * x.d.to_f32();
            let dmin = y.d * x.dmin.to_f32();
            let mut isum = 0i32;
            for (e, &q8) in y.qs.iter().enumerate() {
                isum += i32::from(x.scales[e / 16] & 0xF) * i32::from(q8) * i32::from(unpack_2bit(&x.qs, e));
            }
            sumf += dall * isum as f32 - dmin * summs as f32;
        }
        sumf
    }
}

#[cfg(test)]
mod tests {
    //! Bit-exactness against ggml lives in `tests/reference.rs`; these tests
    //! pin the layouts with hand-packed blocks and check the arithmetic
    //! against independent float computations.
    use super::*;
    use rand::{rngs::SmallRng, Rng, SeedableRng};

    fn gaussian_row(rng: &mut SmallRng, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let (u, v): (f64, f64) = (rng.gen::<f64>() + 1e-12, rng.gen());
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            })
            .collect()
    }

    fn deq<B: Dequantize>(b: &B) -> Vec<f32> {
        let mut out = vec![0.0; B::ELEMS];
        b.dequantize(&mut out);
        out
    }

    /// 2-bit value `v` of element `e` in ggml's Q2_K/Q3_K `qs` layout: per
    /// 128-value half, 32 bytes; element `r` of a half is byte `r % 32`,
    /// bits `2 * (r / 32)`.
    fn put_2bit(qs: &mut [u8], e: usize, v: u8) {
        let (h, r) = (e / 128, e % 128);
        qs[32 * h + r % 32] |= v << (2 * (r / 32));
    }

    /// ggml's 12-byte Q4_K/Q5_K scale/min packing, written from the format
    /// description rather than from the decoder.
    fn pack_k4(sc: [u8; 8], mn: [u8; 8]) -> [u8; 12] {
        let mut s = [0u8; 12];
        for j in 0..4 {
            s[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
            s[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
            s[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4);
        }
        s
    }

    /// Quant values that mostly differ between elements 16, 32, 64 and 128
    /// apart (for every modulus used), so a wrong stride or nibble cannot match.
    fn pattern(e: usize) -> usize {
        (e * e * 7 + e * 3 + 1) % 251
    }

    const K4_SC: [u8; 8] = [1, 2, 3, 60, 17, 33, 48, 63];
    const K4_MN: [u8; 8] = [0, 5, 63, 7, 20, 40, 1, 31];

    #[test]
    fn q8_k_quantize_maps_the_largest_magnitude_to_minus_127() {
        // Largest |x| is -2.0 (first at index 0), so iscale = 63.5.
        let x: Vec<f32> = (0..256).map(|i| ((i % 16) as f32 - 8.0) * 0.25).collect();
        let b = BlockQ8K::quantize(&x);
        assert_eq!(b.d, 1.0f32 / 63.5);
        for (i, &q) in b.qs.iter().enumerate() {
            let want = (63.5f64 * f64::from(x[i])).round() as i8;
            assert_eq!(q, want, "element {i}");
        }
        let group_sum: i16 = (0..16).map(|k| (63.5f64 * (k as f64 - 8.0) * 0.25).round() as i16).sum();
        assert!(b.bsums.iter().all(|&s| s == group_sum), "{:?} vs {group_sum}", b.bsums);
        assert_eq!(b.qs[0], -127);
    }

    #[test]
    fn q4_k_dequantize_reads_ggml_layout() {
        let mut b = BlockQ4K::zeroed();
        b.d = F16::from_f32(0.5);
        b.dmin = F16::from_f32(0.25);
        b.scales = pack_k4(K4_SC, K4_MN);
        let q = |e: usize| (pattern(e) % 16) as u8;
        for e in 0..256 {
            let (c, r) = (e / 64, e % 64);
            b.qs[32 * c + r % 32] |= if r < 32 { q(e) } else { q(e) << 4 };
        }
        let got = deq(&b);
        for e in 0..256 {
            let want = 0.5 * K4_SC[e / 32] as f32 * q(e) as f32 - 0.25 * K4_MN[e / 32] as f32;
            assert_eq!(got[e], want, "element {e}");
        }
    }

    #[test]
    fn q5_k_dequantize_reads_ggml_layout() {
        let mut b = BlockQ5K::zeroed();
        b.d = F16::from_f32(0.5);
        b.dmin = F16::from_f32(0.25);
        b.scales = pack_k4(K4_SC, K4_MN);
        let q = |e: usize| (pattern(e) % 32) as u8;
        for e in 0..256 {
            let (c, r) = (e / 64, e % 64);
            let low = q(e) & 0xF;
            b.qs[32 * c + r % 32] |= if r < 32 { low } else { low << 4 };
            if q(e) >= 16 {
                b.qh[r % 32] |= 1 << (2 * c + r / 32);
            }
        }
        let got = deq(&b);
        for e in 0..256 {
            let want = 0.5 * K4_SC[e / 32] as f32 * q(e) as f32 - 0.25 * K4_MN[e / 32] as f32;
            assert_eq!(got[e], want, "element {e}");
        }
    }

    #[test]
    fn q6_k_dequantize_reads_ggml_layout() {
        let mut b = BlockQ6K::zeroed();
        b.d = F16::from_f32(0.125);
        let sc: [i8; 16] = [-128, -3, 0, 1, 7, 127, 64, -64, 5, 9, -9, 33, 2, -1, 100, 17];
        b.scales = sc;
        let q = |e: usize| (pattern(e) % 64) as i32 - 32;
        for e in 0..256 {
            let (h, r) = (e / 128, e % 128);
            let (g, l) = (r / 32, r % 32);
            let u = (q(e) + 32) as u8;
            let byte = 64 * h + l + if g % 2 == 1 { 32 } else { 0 };
            b.ql[byte] |= if g < 2 { u & 0xF } else { (u & 0xF) << 4 };
            b.qh[32 * h + l] |= (u >> 4) << (2 * g);
        }
        let got = deq(&b);
        for e in 0..256 {
            let want = 0.125 * sc[e / 16] as f32 * q(e) as f32;
            assert_eq!(got[e], want, "element {e}");
        }
    }

    #[test]
    fn q3_k_dequantize_reads_ggml_layout() {
        let mut b = BlockQ3K::zeroed();
        b.d = F16::from_f32(0.5);
        let sc: [i32; 16] = [-32, -31, -1, 0, 1, 31, 15, -16, 7, -7, 20, -20, 3, 30, 12, -5];
        for (j, &s) in sc.iter().enumerate() {
            let u = (s + 32) as u8;
            if j < 8 {
                b.scales[j] |= u & 0xF;
            } else {
                b.scales[j - 8] |= (u & 0xF) << 4;
            }
            b.scales[8 + j % 4] |= (u >> 4) << (2 * (j / 4));
        }
        let q = |e: usize| (pattern(e) % 8) as i32 - 4;
        for e in 0..256 {
            let u = (q(e) + 4) as u8;
            put_2bit(&mut b.qs, e, u & 3);
            if u >= 4 {
                b.hmask[e % 32] |= 1 << (e / 32);
            }
        }
        let got = deq(&b);
        for e in 0..256 {
            let want = 0.5 * sc[e / 16] as f32 * q(e) as f32;
            assert_eq!(got[e], want, "element {e}");
        }
    }

    #[test]
    fn q2_k_dequantize_reads_ggml_layout() {
        let mut b = BlockQ2K::zeroed();
        b.d = F16::from_f32(0.5);
        b.dmin = F16::from_f32(0.25);
        for j in 0..16 {
            b.scales[j] = ((j as u8 * 3) % 16) | (((15 - j as u8) % 16) << 4);
        }
        let q = |e: usize| (pattern(e) % 4) as u8;
        for e in 0..256 {
            put_2bit(&mut b.qs, e, q(e));
        }
        let got = deq(&b);
        for e in 0..256 {
            let (s, m) = (((e / 16) * 3 % 16) as f32, ((15 - e / 16) % 16) as f32);
            let want = 0.5 * s * q(e) as f32 - 0.25 * m;
            assert_eq!(got[e], want, "element {e}");
        }
    }

    /// Relative RMS error of quantize → dequantize over gaussian blocks.
    fn roundtrip_rel_rmse<B: Quantize + Dequantize>(seed: u64) -> f64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let (mut err, mut sig) = (0.0f64, 0.0f64);
        for _ in 0..64 {
            let x = gaussian_row(&mut rng, 256);
            let y = deq(&B::quantize(&x));
            for (a, b) in x.iter().zip(&y) {
                err += f64::from(a - b).powi(2);
                sig += f64::from(*a).powi(2);
            }
        }
        (err / sig).sqrt()
    }

    #[test]
    fn quantize_then_dequantize_error_shrinks_with_bits() {
        // This (ggml-identical) quantizer measures 0.299, 0.150, 0.071, 0.036, 0.0176,
        // 0.0070 on these rows; the bounds sit ~25% above, far below what a
        // layout or search bug costs.
        let got = [
            ("Q2_K", roundtrip_rel_rmse::<BlockQ2K>(1), 0.37),
            ("Q3_K", roundtrip_rel_rmse::<BlockQ3K>(2), 0.19),
            ("Q4_K", roundtrip_rel_rmse::<BlockQ4K>(3), 0.09),
            ("Q5_K", roundtrip_rel_rmse::<BlockQ5K>(4), 0.045),
            ("Q6_K", roundtrip_rel_rmse::<BlockQ6K>(5), 0.022),
            ("Q8_K", roundtrip_rel_rmse::<BlockQ8K>(6), 0.0088),
        ];
        for (name, e, bound) in got {
            assert!(e < bound, "{name}: relative rmse {e} >= {bound}");
        }
    }

    fn dot_matches_dequantized<B: Quantize + Dequantize + VecDot<Act = BlockQ8K>>(seed: u64) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let nb = 8;
        let x = gaussian_row(&mut rng, 256 * nb);
        let y = gaussian_row(&mut rng, 256 * nb);
        let w: Vec<B> = x.chunks_exact(256).map(B::quantize).collect();
        let a: Vec<BlockQ8K> = y.chunks_exact(256).map(BlockQ8K::quantize).collect();
        let (mut want, mut mag) = (0.0f64, 0.0f64);
        for (wb, ab) in w.iter().zip(&a) {
            for (p, q) in deq(wb).iter().zip(deq(ab)) {
                want += f64::from(*p) * f64::from(q);
                mag += (f64::from(*p) * f64::from(q)).abs();
            }
        }
        let got = f64::from(B::vec_dot(&w, &a));
        assert!((got - want).abs() <= 1e-5 * mag, "{:?}: dot {got} vs dequantized {want}", B::KIND);
    }

    #[test]
    fn every_k_quant_dot_equals_the_dot_of_the_dequantized_rows() {
        dot_matches_dequantized::<BlockQ2K>(10);
        dot_matches_dequantized::<BlockQ3K>(11);
        dot_matches_dequantized::<BlockQ4K>(12);
        dot_matches_dequantized::<BlockQ5K>(13);
        dot_matches_dequantized::<BlockQ6K>(14);
        dot_matches_dequantized::<BlockQ8K>(15);
    }

    fn survives<B: Quantize + Dequantize>(src: &[f32]) {
        let b = B::quantize(src);
        let mut short = [0.0f32; 10];
        b.dequantize(&mut short);
    }

    #[test]
    fn non_finite_or_short_input_never_panics() {
        let mut weird = vec![1.0f32; 256];
        weird[3] = f32::NAN;
        weird[77] = f32::INFINITY;
        weird[200] = -1e30;
        let inputs: [&[f32]; 5] = [&weird, &[f32::NAN; 256], &[f32::INFINITY; 256], &[1.5; 17], &[]];
        for src in inputs {
            survives::<BlockQ2K>(src);
            survives::<BlockQ3K>(src);
            survives::<BlockQ4K>(src);
            survives::<BlockQ5K>(src);
            survives::<BlockQ6K>(src);
            survives::<BlockQ8K>(src);
        }
    }

    fn all_zero_bytes<B: Quantize>() -> bool {
        bytemuck::bytes_of(&B::quantize(&[0.0; 256])).iter().all(|&b| b == 0)
    }

    /// ggml's reference emits an all-zero block (d = 0, zero quants, zero
    /// scales) for an all-zero input in every K-quant.
    #[test]
    fn zero_blocks_quantize_to_all_zero_bytes() {
        assert!(all_zero_bytes::<BlockQ2K>(), "Q2_K");
        assert!(all_zero_bytes::<BlockQ3K>(), "Q3_K");
        assert!(all_zero_bytes::<BlockQ4K>(), "Q4_K");
        assert!(all_zero_bytes::<BlockQ5K>(), "Q5_K");
        assert!(all_zero_bytes::<BlockQ6K>(), "Q6_K");
        assert!(all_zero_bytes::<BlockQ8K>(), "Q8_K");
    }

    /// Pinned against ggml 0c1e570's `quantize_row_q*_K_ref`,
    /// `dequantize_row_q*_K` and `ggml_vec_dot_q*_K_q8_K_generic` (built with
    /// gcc at -O0 and -O2, identical) on 512 generated blocks: FNV-1a hashes
    /// of the block bytes and of the dequantized f32 bits, and the dot's bits.
    /// The generator uses only correctly rounded float operations so C and
    /// Rust produce the same inputs. The 13 cases in `tests/reference.rs`
    /// miss some search paths (e.g. the last step of `make_qkx2_quants`);
    /// these many varied blocks hit them.
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u32 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (self.0 >> 32) as u32
        }
        fn unif(&mut self) -> f32 {
            (self.next() >> 8) as f32 * (1.0 / 16_777_216.0) - 0.5
        }
    }

    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
    }

    const PIN_BLOCKS: usize = 512;

    fn pinned_inputs() -> (Vec<f32>, Vec<f32>) {
        let mut g = Lcg(0x243F_6A88_85A3_08D3);
        let scl = [1.0f32, 1e-3, 37.5, 1e-6, 0.7, 1000.0, 3.0];
        let mut x = vec![0.0f32; PIN_BLOCKS * 256];
        for b in 0..PIN_BLOCKS {
            for i in 0..256 {
                let v = match b % 6 {
                    0 => g.unif(),
                    1 => g.unif() * g.unif() * g.unif() * 8.0,
                    2 => g.unif() * 0.01 + 0.3,
                    3 if i == b % 256 => 20.0 * g.unif() + 30.0,
                    3 => g.unif(),
                    4 => ((g.next() % 16) as i32 - 8) as f32 * 0.125,
                    _ => -g.unif().abs() * 3.0,
                };
                x[b * 256 + i] = v * scl[(b / 6) % 7];
            }
        }
        let a = (0..PIN_BLOCKS * 256).map(|_| g.unif() * 2.0).collect();
        (x, a)
    }

    fn pinned<B: Quantize + Dequantize + VecDot<Act = BlockQ8K>>(x: &[f32], act: &[BlockQ8K]) -> (u64, u64, u32) {
        let w: Vec<B> = x.chunks_exact(256).map(B::quantize).collect();
        let deq_bits: Vec<u8> = w.iter().flat_map(deq).flat_map(f32::to_le_bytes).collect();
        (fnv1a(bytemuck::cast_slice(&w)), fnv1a(&deq_bits), B::vec_dot(&w, act).to_bits())
    }

    #[test]
    fn many_varied_blocks_quantize_dequantize_and_dot_like_ggml() {
        let (x, a) = pinned_inputs();
        let act: Vec<BlockQ8K> = a.chunks_exact(256).map(BlockQ8K::quantize).collect();
        assert_eq!(fnv1a(bytemuck::cast_slice(&act)), 0x1131_1cac_f33d_fa7e, "Q8_K activations");
        let q8: Vec<BlockQ8K> = x.chunks_exact(256).map(BlockQ8K::quantize).collect();
        let q8_deq: Vec<u8> = q8.iter().flat_map(deq).flat_map(f32::to_le_bytes).collect();
        assert_eq!((fnv1a(bytemuck::cast_slice(&q8)), fnv1a(&q8_deq)), (0x6be1_dd43_51d0_2ea8, 0xb9b2_65fc_db6f_0516), "Q8_K");
        let got = [
            ("Q2_K", pinned::<BlockQ2K>(&x, &act), (0x361b_87cd_dbad_357f, 0x3cc8_c559_33c9_d475, 0x479c_d364)),
            ("Q3_K", pinned::<BlockQ3K>(&x, &act), (0x6012_5fe5_7bca_b99f, 0x26b4_0fda_56bd_aa47, 0x476e_77a4)),
            ("Q4_K", pinned::<BlockQ4K>(&x, &act), (0x8881_f692_7dd5_dd8a, 0xdbfe_10d1_64c7_4838, 0x475d_6a6f)),
            ("Q5_K", pinned::<BlockQ5K>(&x, &act), (0xde4b_d9bd_72a3_3f23, 0xcf62_62a9_af08_de19, 0x4749_a331)),
            ("Q6_K", pinned::<BlockQ6K>(&x, &act), (0x2fbb_f108_b214_bcde, 0x7717_f03a_eecb_ef5d, 0x4758_4803)),
        ];
        let bad: Vec<_> = got.iter().filter(|(_, g, w)| g != w).map(|(k, g, w)| format!("{k}: got {g:x?} want {w:x?}")).collect();
        assert!(bad.is_empty(), "{bad:#?}");
    }
}

// ---------------------------------------------------------------- Unpack

impl Unpack for BlockQ2K {
    const SUB: usize = 16;
    const OFFSET: i32 = 0;
    const CODE_MAX: i32 = 3;
    fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]) {
        let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
        for (e, v) in q[..QK_K].iter_mut().enumerate() {
            *v = unpack_2bit(&self.qs, e) as i8;
        }
        for (j, &sc) in self.scales.iter().enumerate() {
            (scale[j], bias[j]) = (d * (sc & 0xF) as f32, -(min * (sc >> 4) as f32));
        }
    }
}

impl Unpack for BlockQ3K {
    const SUB: usize = 16;
    const OFFSET: i32 = 4;
    const CODE_MAX: i32 = 7;
    fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]) {
        let d_all = self.d.to_f32();
        q[..QK_K].copy_from_slice(&self.quants());
        for (j, &s) in q3_scales(&self.scales).iter().enumerate() {
            (scale[j], bias[j]) = (d_all * s as f32, 0.0);
        }
    }
}

/// Q4_K and Q5_K share their header: eight 6-bit scales and mins with a
/// super-block `d` and `dmin`; only the quants differ.
macro_rules! unpack_k4 {
    ($($block:ty: $code_max:expr),*) => {$(
        impl Unpack for $block {
            const SUB: usize = 32;
            const OFFSET: i32 = 0;
            const CODE_MAX: i32 = $code_max;
            fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]) {
                let (d, min) = (self.d.to_f32(), self.dmin.to_f32());
                q[..QK_K].copy_from_slice(&self.quants());
                let (sc, mn) = k4_scales_mins(&self.scales);
                for j in 0..8 {
                    (scale[j], bias[j]) = (d * sc[j] as f32, -(min * mn[j] as f32));
                }
            }
        }
    )*};
}
unpack_k4!(BlockQ4K: 15, BlockQ5K: 31);

impl Unpack for BlockQ6K {
    const SUB: usize = 16;
    const OFFSET: i32 = 32;
    const CODE_MAX: i32 = 63;
    fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]) {
        let d = self.d.to_f32();
        q[..QK_K].copy_from_slice(&self.quants());
        for (j, &s) in self.scales.iter().enumerate() {
            (scale[j], bias[j]) = (d * s as f32, 0.0);
        }
    }
}
