//! Scalar reference: the IQ ("importance") kinds — lattice codebooks (IQ1,
//! IQ2, IQ3) and the non-linear 4-bit codebook (IQ4_NL, IQ4_XS).
//!
//! Key decision: dequantize and dot are written separately, each following
//! its own ggml routine (`dequantize_row_iq*` multiplies floats per element,
//! `ggml_vec_dot_iq*_q8_K_generic` sums integers per sub-block and scales
//! once), because the two round differently and both must be bit-exact; the
//! only shared pieces are table lookups. The codebooks live in the generated
//! [`super::iq_grids`], never typed by hand.
//!
//! Only IQ4_NL/IQ4_XS quantize: ggml's reference for them is a plain search
//! over one codebook. The lattice kinds need ggml's importance-matrix search
//! and are refused by [`crate::quantize_support`].

use super::iq_grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KMASK_IQ2XS,
    KSIGNS_IQ2XS, KVALUES_IQ4NL,
};
use crate::blocks::*;
use crate::{Dequantize, Quantize, Unpack, VecDot};

/// IQ1_S / IQ1_M shift every grid value by ±1/8 (ggml's `IQ1S_DELTA`).
const IQ1_DELTA: f32 = 0.125;

/// The 8 magnitudes of a packed 8-wide grid point (byte `j` is element `j`).
fn grid8(point: u64) -> [u8; 8] {
    point.to_le_bytes()
}

/// The 4 magnitudes of a packed 4-wide grid point.
fn grid4(point: u32) -> [u8; 4] {
    point.to_le_bytes()
}

/// The 8 signed values of an IQ1 grid point (each -1, 0 or 1).
fn grid_iq1(index: usize) -> [i8; 8] {
    IQ1S_GRID[index].to_le_bytes().map(|b| b as i8)
}

/// ±1 as ggml's dequantizers apply it: a float factor, so `0 * -1` is `-0.0`.
fn sign_f(signs: u8, j: usize) -> f32 {
    if signs & KMASK_IQ2XS[j] != 0 {
        -1.0
    } else {
        1.0
    }
}

/// ±1 as ggml's integer dots apply it.
fn sign_i(signs: u8, j: usize) -> i32 {
    if signs & KMASK_IQ2XS[j] != 0 {
        -1
    } else {
        1
    }
}

fn u32_le(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

/// IQ2_XXS stores each 32-group as two words: four grid indices, then four
/// 7-bit sign fields and a 4-bit scale.
fn iq2xxs_group(qs: &[u16; 32], ib32: usize) -> ([u8; 4], u32) {
    let q = &qs[4 * ib32..4 * ib32 + 4];
    let idx = (u32::from(q[0]) | u32::from(q[1]) << 16).to_le_bytes();
    (idx, u32::from(q[2]) | u32::from(q[3]) << 16)
}

impl Dequantize for BlockIQ1S {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (ib, y32) in out.chunks_exact_mut(32).enumerate().take(8) {
            let qh = self.qh[ib];
            let dl = d * (2 * ((qh >> 12) & 7) + 1) as f32;
            let delta = if qh & 0x8000 != 0 {
                -IQ1_DELTA
            } else {
                IQ1_DELTA
            };
            for (l, y) in y32.chunks_exact_mut(8).enumerate() {
                let idx = usize::from(self.qs[4 * ib + l]) | usize::from((qh >> (3 * l)) & 7) << 8;
                for (yj, g) in y.iter_mut().zip(grid_iq1(idx)) {
                    *yj = dl * (f32::from(g) + delta);
                }
            }
        }
    }
}

impl VecDot for BlockIQ1S {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let (mut sumi, mut sumi1) = (0i32, 0i32);
            for ib in 0..8 {
                let qh = x.qh[ib];
                let ls = 2 * i32::from((qh >> 12) & 7) + 1;
                let delta = if qh & 0x8000 != 0 { -1 } else { 1 };
                let mut lsum = 0i32;
                for l in 0..4 {
                    let idx = usize::from(x.qs[4 * ib + l]) | usize::from((qh >> (3 * l)) & 7) << 8;
                    let q8 = &y.qs[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                    for (g, &q) in grid_iq1(idx).into_iter().zip(q8) {
                        lsum += i32::from(q) * i32::from(g);
                    }
                }
                sumi += ls * lsum;
                sumi1 += ls * delta * (i32::from(y.bsums[2 * ib]) + i32::from(y.bsums[2 * ib + 1]));
            }
            sumf += x.d.to_f32() * y.d * (sumi as f32 + IQ1_DELTA * sumi1 as f32);
        }
        sumf
    }
}

impl BlockIQ1M {
    /// The four scale words; the f16 super-scale is their four top nibbles.
    fn scale_words(&self) -> ([u16; 4], f32) {
        let s = &self.scales;
        let sc = [0, 1, 2, 3].map(|i| u16::from_le_bytes([s[2 * i], s[2 * i + 1]]));
        let bits =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00f0) | ((sc[2] >> 4) & 0x0f00) | (sc[3] & 0xf000);
        (sc, F16::from_bits(bits).to_f32())
    }

    /// The grid index of 8-group `l` (0..4) of 32-group `ib`, and whether its
    /// delta is negative.
    fn group(&self, ib: usize, l: usize) -> (usize, bool) {
        let qh = u16::from(self.qh[2 * ib + l / 2]);
        let idx = usize::from(self.qs[4 * ib + l]) | usize::from((qh << (8 - 4 * (l % 2))) & 0x700);
        (idx, qh & (0x08 << (4 * (l % 2))) != 0)
    }
}

/// IQ1_M's two 3-bit sub-scales of 32-group `ib`.
fn iq1m_ls(sc: &[u16; 4], ib: usize) -> [u16; 2] {
    let w = sc[ib / 2];
    [
        2 * ((w >> (6 * (ib % 2))) & 7) + 1,
        2 * ((w >> (6 * (ib % 2) + 3)) & 7) + 1,
    ]
}

impl Dequantize for BlockIQ1M {
    fn dequantize(&self, out: &mut [f32]) {
        let (sc, d) = self.scale_words();
        for (ib, y32) in out.chunks_exact_mut(32).enumerate().take(8) {
            let ls = iq1m_ls(&sc, ib);
            let dl = [d * f32::from(ls[0]), d * f32::from(ls[1])];
            for (l, y) in y32.chunks_exact_mut(8).enumerate() {
                let (idx, neg) = self.group(ib, l);
                let delta = if neg { -IQ1_DELTA } else { IQ1_DELTA };
                for (yj, g) in y.iter_mut().zip(grid_iq1(idx)) {
                    *yj = dl[l / 2] * (f32::from(g) + delta);
                }
            }
        }
    }
}

impl VecDot for BlockIQ1M {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let (sc, d) = x.scale_words();
            let (mut sumi1, mut sumi2) = (0i32, 0i32);
            for ib in 0..8 {
                let (mut sum1, mut sum2) = ([0i32; 2], [0i32; 2]);
                for l in 0..4 {
                    let (idx, neg) = x.group(ib, l);
                    let q8 = &y.qs[32 * ib + 8 * l..32 * ib + 8 * l + 8];
                    let (mut lsum1, mut lsum2) = (0i32, 0i32);
                    for (g, &q) in grid_iq1(idx).into_iter().zip(q8) {
                        lsum1 += i32::from(q) * i32::from(g);
                        lsum2 += i32::from(q);
                    }
                    sum1[l / 2] += lsum1;
                    sum2[l / 2] += lsum2 * if neg { -1 } else { 1 };
                }
                let ls = iq1m_ls(&sc, ib).map(i32::from);
                sumi1 += sum1[0] * ls[0] + sum1[1] * ls[1];
                sumi2 += sum2[0] * ls[0] + sum2[1] * ls[1];
            }
            sumf += d * y.d * (sumi1 as f32 + IQ1_DELTA * sumi2 as f32);
        }
        sumf
    }
}

impl Dequantize for BlockIQ2XXS {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (ib32, y32) in out.chunks_exact_mut(32).enumerate().take(8) {
            let (idx, aux) = iq2xxs_group(&self.qs, ib32);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.25;
            for (l, y) in y32.chunks_exact_mut(8).enumerate() {
                let grid = grid8(IQ2XXS_GRID[usize::from(idx[l])]);
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                for (j, yj) in y.iter_mut().enumerate() {
                    *yj = db * f32::from(grid[j]) * sign_f(signs, j);
                }
            }
        }
    }
}

impl VecDot for BlockIQ2XXS {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = x.d.to_f32() * y.d;
            let mut bsum = 0i32;
            for ib32 in 0..8 {
                let (idx, aux) = iq2xxs_group(&x.qs, ib32);
                let ls = 2 * (aux >> 28) as i32 + 1;
                let mut sumi = 0i32;
                for l in 0..4 {
                    let grid = grid8(IQ2XXS_GRID[usize::from(idx[l])]);
                    let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                    let q8 = &y.qs[32 * ib32 + 8 * l..];
                    for j in 0..8 {
                        sumi += i32::from(grid[j]) * i32::from(q8[j]) * sign_i(signs, j);
                    }
                }
                bsum += sumi * ls;
            }
            sumf += d * bsum as f32;
        }
        0.125 * sumf
    }
}

impl Dequantize for BlockIQ2XS {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (ib32, y32) in out.chunks_exact_mut(32).enumerate().take(8) {
            let sc = self.scales[ib32];
            let db = [
                d * (0.5 + f32::from(sc & 0xf)) * 0.25,
                d * (0.5 + f32::from(sc >> 4)) * 0.25,
            ];
            for (l, y) in y32.chunks_exact_mut(8).enumerate() {
                let q = self.qs[4 * ib32 + l];
                let grid = grid8(IQ2XS_GRID[usize::from(q & 511)]);
                let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
                for (j, yj) in y.iter_mut().enumerate() {
                    *yj = db[l / 2] * f32::from(grid[j]) * sign_f(signs, j);
                }
            }
        }
    }
}

impl VecDot for BlockIQ2XS {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = x.d.to_f32() * y.d;
            let mut bsum = 0i32;
            for ib32 in 0..8 {
                let sc = x.scales[ib32];
                let ls = [2 * i32::from(sc & 0xf) + 1, 2 * i32::from(sc >> 4) + 1];
                for (half, ls_half) in ls.into_iter().enumerate() {
                    let mut sumi = 0i32;
                    for l in 2 * half..2 * half + 2 {
                        let q = x.qs[4 * ib32 + l];
                        let grid = grid8(IQ2XS_GRID[usize::from(q & 511)]);
                        let signs = KSIGNS_IQ2XS[usize::from(q >> 9)];
                        let q8 = &y.qs[32 * ib32 + 8 * l..];
                        for j in 0..8 {
                            sumi += i32::from(grid[j]) * i32::from(q8[j]) * sign_i(signs, j);
                        }
                    }
                    bsum += sumi * ls_half;
                }
            }
            sumf += d * bsum as f32;
        }
        0.125 * sumf
    }
}

impl BlockIQ2S {
    /// Grid point and sign byte of 8-group `l` (0..4) of 32-group `ib32`: a
    /// 10-bit index (8 low bits in `qs`, 2 high in `qh`), signs stored
    /// verbatim in the second half of `qs`.
    fn group(&self, ib32: usize, l: usize) -> ([u8; 8], u8) {
        let hi = (usize::from(self.qh[ib32]) << (8 - 2 * l)) & 0x300;
        let idx = usize::from(self.qs[4 * ib32 + l]) | hi;
        (grid8(IQ2S_GRID[idx]), self.qs[QK_K / 8 + 4 * ib32 + l])
    }
}

impl Dequantize for BlockIQ2S {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (ib32, y32) in out.chunks_exact_mut(32).enumerate().take(8) {
            let sc = self.scales[ib32];
            let db = [
                d * (0.5 + f32::from(sc & 0xf)) * 0.25,
                d * (0.5 + f32::from(sc >> 4)) * 0.25,
            ];
            for (l, y) in y32.chunks_exact_mut(8).enumerate() {
                let (grid, signs) = self.group(ib32, l);
                for (j, yj) in y.iter_mut().enumerate() {
                    *yj = db[l / 2] * f32::from(grid[j]) * sign_f(signs, j);
                }
            }
        }
    }
}

impl VecDot for BlockIQ2S {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = x.d.to_f32() * y.d;
            let mut bsum = 0i32;
            for ib32 in 0..8 {
                let sc = x.scales[ib32];
                let ls = [1 + 2 * i32::from(sc & 0xf), 1 + 2 * i32::from(sc >> 4)];
                let mut sumi = [0i32; 2];
                for l in 0..4 {
                    let (grid, signs) = x.group(ib32, l);
                    let q8 = &y.qs[32 * ib32 + 8 * l..];
                    for j in 0..8 {
                        sumi[l / 2] += i32::from(q8[j]) * i32::from(grid[j]) * sign_i(signs, j);
                    }
                }
                bsum += ls[0] * sumi[0] + ls[1] * sumi[1];
            }
            sumf += d * bsum as f32;
        }
        0.125 * sumf
    }
}

impl BlockIQ3XXS {
    /// 32-group `ib32`'s word of four 7-bit sign fields and a 4-bit scale
    /// (stored after the 64 grid-index bytes).
    fn aux(&self, ib32: usize) -> u32 {
        u32_le(&self.qs[QK_K / 4 + 4 * ib32..])
    }
}

impl Dequantize for BlockIQ3XXS {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (ib32, y32) in out.chunks_exact_mut(32).enumerate().take(8) {
            let aux = self.aux(ib32);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for (l, y) in y32.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                let g1 = grid4(IQ3XXS_GRID[usize::from(self.qs[8 * ib32 + 2 * l])]);
                let g2 = grid4(IQ3XXS_GRID[usize::from(self.qs[8 * ib32 + 2 * l + 1])]);
                for j in 0..4 {
                    y[j] = db * f32::from(g1[j]) * sign_f(signs, j);
                    y[j + 4] = db * f32::from(g2[j]) * sign_f(signs, j + 4);
                }
            }
        }
    }
}

impl VecDot for BlockIQ3XXS {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = x.d.to_f32() * y.d;
            let mut bsum = 0i32;
            for ib32 in 0..8 {
                let aux = x.aux(ib32);
                let ls = 2 * (aux >> 28) as i32 + 1;
                let mut sumi = 0i32;
                for l in 0..4 {
                    let g1 = grid4(IQ3XXS_GRID[usize::from(x.qs[8 * ib32 + 2 * l])]);
                    let g2 = grid4(IQ3XXS_GRID[usize::from(x.qs[8 * ib32 + 2 * l + 1])]);
                    let signs = KSIGNS_IQ2XS[((aux >> (7 * l)) & 127) as usize];
                    let q8 = &y.qs[32 * ib32 + 8 * l..];
                    for j in 0..4 {
                        sumi += i32::from(g1[j]) * i32::from(q8[j]) * sign_i(signs, j);
                        sumi += i32::from(g2[j]) * i32::from(q8[j + 4]) * sign_i(signs, j + 4);
                    }
                }
                bsum += sumi * ls;
            }
            sumf += d * bsum as f32;
        }
        0.25 * sumf
    }
}

impl BlockIQ3S {
    /// The two 4-wide grid points and the sign byte of 8-group `l` (0..4) of
    /// 32-group `ib32`: 9-bit indices, the 9th bit from `qh[ib32]`.
    fn group(&self, ib32: usize, l: usize) -> ([u8; 4], [u8; 4], u8) {
        let qh = usize::from(self.qh[ib32]);
        let q = &self.qs[8 * ib32 + 2 * l..];
        let i1 = usize::from(q[0]) | ((qh << (8 - 2 * l)) & 256);
        let i2 = usize::from(q[1]) | ((qh << (7 - 2 * l)) & 256);
        (
            grid4(IQ3S_GRID[i1]),
            grid4(IQ3S_GRID[i2]),
            self.signs[4 * ib32 + l],
        )
    }

    /// The odd sub-scale `1 + 2*s` of 32-group `ib32`.
    fn ls(&self, ib32: usize) -> u8 {
        let s = self.scales[ib32 / 2] >> (4 * (ib32 % 2));
        1 + 2 * (s & 0xf)
    }
}

impl Dequantize for BlockIQ3S {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (ib32, y32) in out.chunks_exact_mut(32).enumerate().take(8) {
            let db = d * f32::from(self.ls(ib32));
            for (l, y) in y32.chunks_exact_mut(8).enumerate() {
                let (g1, g2, signs) = self.group(ib32, l);
                for j in 0..4 {
                    y[j] = db * f32::from(g1[j]) * sign_f(signs, j);
                    y[j + 4] = db * f32::from(g2[j]) * sign_f(signs, j + 4);
                }
            }
        }
    }
}

impl VecDot for BlockIQ3S {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = x.d.to_f32() * y.d;
            let mut bsum = 0i32;
            for ib32 in 0..8 {
                let mut sumi = 0i32;
                for l in 0..4 {
                    let (g1, g2, signs) = x.group(ib32, l);
                    let q8 = &y.qs[32 * ib32 + 8 * l..];
                    for j in 0..4 {
                        sumi += i32::from(g1[j]) * i32::from(q8[j]) * sign_i(signs, j);
                        sumi += i32::from(g2[j]) * i32::from(q8[j + 4]) * sign_i(signs, j + 4);
                    }
                }
                bsum += sumi * i32::from(x.ls(ib32));
            }
            sumf += d * bsum as f32;
        }
        sumf
    }
}

/// The 16-entry codebook value of a nibble.
fn kv(nibble: u8) -> i8 {
    KVALUES_IQ4NL[usize::from(nibble & 0xf)]
}

/// Dequantizes 32 values packed as IQ4's nibbles (low nibbles are the first
/// 16 elements, high nibbles the second 16) with one scale.
fn dequantize_iq4_32(d: f32, qs: &[u8], y: &mut [f32]) {
    for j in 0..16 {
        y[j] = d * f32::from(kv(qs[j]));
        y[j + 16] = d * f32::from(kv(qs[j] >> 4));
    }
}

/// The integer dot of 32 IQ4 nibbles with 32 int8 activations, as ggml
/// forms it: low and high halves summed separately, then added.
fn dot_iq4_32(qs: &[u8], q8: &[i8]) -> i32 {
    let (mut sumi1, mut sumi2) = (0i32, 0i32);
    for j in 0..16 {
        sumi1 += i32::from(q8[j]) * i32::from(kv(qs[j]));
        sumi2 += i32::from(q8[j + 16]) * i32::from(kv(qs[j] >> 4));
    }
    sumi1 + sumi2
}

impl Dequantize for BlockIQ4NL {
    fn dequantize(&self, out: &mut [f32]) {
        dequantize_iq4_32(self.d.to_f32(), &self.qs, out);
    }
}

impl VecDot for BlockIQ4NL {
    type Act = BlockQ8_0;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d = y.d.to_f32() * x.d.to_f32();
            sumf += d * dot_iq4_32(&x.qs, &y.qs) as f32;
        }
        sumf
    }
}

impl BlockIQ4XS {
    /// The signed 6-bit scale of 32-group `ib` (4 low bits in `scales_l`,
    /// 2 high in `scales_h`, biased by 32).
    pub(crate) fn ls(&self, ib: usize) -> i32 {
        let lo = (self.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
        let hi = (self.scales_h >> (2 * ib)) & 3;
        (i32::from(lo) | i32::from(hi) << 4) - 32
    }
}

impl Dequantize for BlockIQ4XS {
    fn dequantize(&self, out: &mut [f32]) {
        let d = self.d.to_f32();
        for (ib, y) in out.chunks_exact_mut(32).enumerate().take(8) {
            dequantize_iq4_32(d * self.ls(ib) as f32, &self.qs[16 * ib..16 * ib + 16], y);
        }
    }
}

impl VecDot for BlockIQ4XS {
    type Act = BlockQ8K;
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32 {
        let mut sumf = 0.0f32;
        for (x, y) in w.iter().zip(a) {
            let d4d8 = x.d.to_f32() * y.d;
            for ib in 0..8 {
                let dl = d4d8 * x.ls(ib) as f32;
                let sumi = dot_iq4_32(&x.qs[16 * ib..16 * ib + 16], &y.qs[32 * ib..32 * ib + 32]);
                sumf += dl * sumi as f32;
            }
        }
        sumf
    }
}

// ---- IQ4 quantization (ggml's `quantize_row_iq4_nl_impl`, no importance matrix)

/// A sub-block whose largest magnitude is below this quantizes to scale 0.
const GROUP_MAX_EPS: f32 = 1e-15;

/// The codebook index nearest to `x`; an exact midpoint goes to the upper
/// entry. Written as ggml's bisection, so NaN lands where ggml's does.
fn best_index_int8(values: &[i8; 16], x: f32) -> usize {
    let v = |i: usize| f32::from(values[i]);
    if x <= v(0) {
        return 0;
    }
    if x >= v(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < v(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - v(mu - 1) < v(mu) - x {
        mu - 1
    } else {
        mu
    }
}

/// Round to nearest, ties to even, by ggml's float-add trick (valid for
/// `|x| <= 4194303`; callers stay far inside that).
fn nearest_int(x: f32) -> i32 {
    let bits = (x + 12_582_912.0).to_bits() as i32;
    (bits & 0x007f_ffff) - 0x0040_0000
}

/// Best scale for one 32-element sub-block, writing its codebook indices into
/// `lb`. `ntry < 0` keeps the first guess's indices (IQ4_NL's reference);
/// `ntry > 0` also tries `2*ntry+1` scales around the extreme element.
/// Returns 0 (and leaves `lb` alone) for an all-but-zero sub-block.
fn iq4_sub_block_scale(xb: &[f32], ntry: i32, lb: &mut [u8]) -> f32 {
    let values = &KVALUES_IQ4NL;
    let v0 = f32::from(values[0]);
    let mut weight = [0.0f32; 32];
    for (w, &x) in weight.iter_mut().zip(xb) {
        *w = x * x;
    }
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &x in xb {
        let ax = x.abs();
        if ax > amax {
            amax = ax;
            max = x;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let mut d = if ntry > 0 { -max / v0 } else { max / v0 };
    let mut id = 1.0 / d;
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for j in 0..32 {
        let l = best_index_int8(values, id * xb[j]);
        lb[j] = l as u8;
        let q = f32::from(values[l]);
        sumqx += weight[j] * q * xb[j];
        sumq2 += weight[j] * q * q;
    }
    d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -ntry..=ntry {
        id = (itry + i32::from(values[0])) as f32 / max;
        sumqx = 0.0;
        sumq2 = 0.0;
        for j in 0..32 {
            let q = f32::from(values[best_index_int8(values, id * xb[j])]);
            sumqx += weight[j] * q * xb[j];
            sumq2 += weight[j] * q * q;
        }
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Packs 32 indices as IQ4 nibbles: element `j` low, element `j + 16` high.
fn pack_iq4_32(l: &[u8], qs: &mut [u8]) {
    for j in 0..16 {
        qs[j] = l[j] | (l[j + 16] << 4);
    }
}

impl Quantize for BlockIQ4NL {
    /// ggml's `quantize_row_iq4_nl_ref`. One divergence: for an all-but-zero
    /// block (`max |x| < 1e-15`) ggml leaves the indices it computed for the
    /// *previous* block (or uninitialised memory), which a per-block
    /// quantizer cannot reproduce; ferrox writes index 0. The scale is 0
    /// either way, so the dequantized values agree.
    fn quantize(src: &[f32]) -> Self {
        let mut l = [0u8; 32];
        let scale = iq4_sub_block_scale(&src[..32], -1, &mut l);
        let mut qs = [0u8; 16];
        pack_iq4_32(&l, &mut qs);
        BlockIQ4NL {
            d: F16::from_f32(scale),
            qs,
        }
    }
}

impl BlockIQ4NL {
    /// ggml's `quantize_iq4_nl` without an importance matrix — what
    /// `ggml_quantize_chunk`, and so llama-quantize, writes. Unlike the
    /// reference row quantizer it tries 15 scales around the extreme
    /// element (`ntry = 7`) and then recomputes every index for the f32
    /// scale it kept (index of 0 for an all-but-zero block, whose scale is 0).
    pub fn quantize_chunk(src: &[f32]) -> Self {
        let x = &src[..32];
        let mut l = [0u8; 32];
        let scale = iq4_sub_block_scale(x, 7, &mut l);
        let id = if scale != 0.0 { 1.0 / scale } else { 0.0 };
        for (lj, &xj) in l.iter_mut().zip(x) {
            *lj = best_index_int8(&KVALUES_IQ4NL, id * xj) as u8;
        }
        let mut qs = [0u8; 16];
        pack_iq4_32(&l, &mut qs);
        BlockIQ4NL { d: F16::from_f32(scale), qs }
    }
}

impl Quantize for BlockIQ4XS {
    /// ggml's `quantize_row_iq4_xs_ref`: a free scale per 32-group, then the
    /// group scales requantized to 6 bits against the largest, then the
    /// indices recomputed for the 6-bit scales.
    fn quantize(src: &[f32]) -> Self {
        let x = &src[..QK_K];
        let mut l = [0u8; QK_K];
        let mut scales = [0.0f32; 8];
        let (mut max_scale, mut amax_scale) = (0.0f32, 0.0f32);
        for ib in 0..8 {
            let s =
                iq4_sub_block_scale(&x[32 * ib..32 * ib + 32], 7, &mut l[32 * ib..32 * ib + 32]);
            scales[ib] = s;
            if s.abs() > amax_scale {
                amax_scale = s.abs();
                max_scale = s;
            }
        }
        let d = -max_scale / 32.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let (mut scales_h, mut scales_l) = (0u16, [0u8; 4]);
        for ib in 0..8 {
            let ls = nearest_int(id * scales[ib]).clamp(-32, 31);
            let dl = d * ls as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            for j in 32 * ib..32 * ib + 32 {
                l[j] = best_index_int8(&KVALUES_IQ4NL, idl * x[j]) as u8;
            }
            let biased = (ls + 32) as u8;
            scales_l[ib / 2] |= (biased & 0xf) << (4 * (ib % 2));
            scales_h |= u16::from(biased >> 4) << (2 * ib);
        }
        let mut qs = [0u8; 128];
        for ib in 0..8 {
            pack_iq4_32(&l[32 * ib..32 * ib + 32], &mut qs[16 * ib..16 * ib + 16]);
        }
        BlockIQ4XS {
            d: F16::from_f32(d),
            scales_h,
            scales_l,
            qs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// ggml's IQ4 codebook, typed from the paper/header independently of the
    /// generated table so a generator bug cannot hide.
    const CODEBOOK: [i8; 16] = [
        -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
    ];

    #[test]
    fn the_generated_tables_hold_ggmls_sizes_and_end_points() {
        assert_eq!(KVALUES_IQ4NL, CODEBOOK);
        assert_eq!(KMASK_IQ2XS, [1, 2, 4, 8, 16, 32, 64, 128]);
        assert_eq!(
            (IQ2XXS_GRID[0], IQ2XXS_GRID[255]),
            (0x0808080808080808, 0x2b2b2b1908081908)
        );
        assert_eq!(
            (IQ2XS_GRID.len(), IQ2XS_GRID[511]),
            (512, 0x2b2b2b2b2b2b2b2b)
        );
        assert_eq!(
            (IQ2S_GRID.len(), IQ2S_GRID[1023]),
            (1024, 0x2b2b2b2b2b2b2b2b)
        );
        assert_eq!((IQ3XXS_GRID[0], IQ3XXS_GRID[255]), (0x04040404, 0x3e341c04));
        assert_eq!(
            (IQ3S_GRID.len(), IQ3S_GRID[0], IQ3S_GRID[511]),
            (512, 0x01010101, 0x0f0f0101)
        );
        assert_eq!(
            (IQ1S_GRID.len(), IQ1S_GRID[0], IQ1S_GRID[2047]),
            (2048, u64::MAX, 0x0101010101010101)
        );
    }

    #[test]
    fn every_grid_point_uses_only_its_kinds_magnitude_levels() {
        let check = |name: &str, bytes: Vec<u8>, levels: &[u8]| {
            assert!(
                bytes.iter().all(|b| levels.contains(b)),
                "{name} has a byte outside {levels:?}"
            );
        };
        let flat64 = |g: &[u64]| g.iter().flat_map(|p| p.to_le_bytes()).collect::<Vec<u8>>();
        let flat32 = |g: &[u32]| g.iter().flat_map(|p| p.to_le_bytes()).collect::<Vec<u8>>();
        check("iq2xxs", flat64(&IQ2XXS_GRID), &[8, 25, 43]);
        check("iq2xs", flat64(&IQ2XS_GRID), &[8, 25, 43]);
        check("iq2s", flat64(&IQ2S_GRID), &[8, 25, 43]);
        check(
            "iq3xxs",
            flat32(&IQ3XXS_GRID),
            &[4, 12, 20, 28, 36, 44, 52, 62],
        );
        check("iq3s", flat32(&IQ3S_GRID), &[1, 3, 5, 7, 9, 11, 13, 15]);
        check("iq1s", flat64(&IQ1S_GRID), &[0xff, 0, 1]);
    }

    #[test]
    fn every_sign_pattern_keeps_its_seven_stored_bits_and_has_even_parity() {
        for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(usize::from(s & 127), i);
            assert_eq!(s.count_ones() % 2, 0, "entry {i}");
        }
    }

    #[test]
    fn best_index_picks_the_nearest_codebook_entry_and_breaks_ties_upward() {
        let cb = &KVALUES_IQ4NL;
        assert_eq!(best_index_int8(cb, -1000.0), 0);
        assert_eq!(best_index_int8(cb, 1000.0), 15);
        assert_eq!(best_index_int8(cb, 0.0), 8); // 1 is nearer than -10
        assert_eq!(best_index_int8(cb, -4.5), 8); // midpoint of -10 and 1
        assert_eq!(best_index_int8(cb, -4.6), 7);
        assert_eq!(best_index_int8(cb, 100.0), 14); // 89 (11 away) beats 113 (13 away)
        assert_eq!(best_index_int8(cb, 102.0), 15);
        for (i, &v) in cb.iter().enumerate() {
            assert_eq!(best_index_int8(cb, f32::from(v)), i);
        }
    }

    #[test]
    fn nearest_int_rounds_halves_to_even() {
        let cases = [
            (2.5, 2),
            (3.5, 4),
            (-2.5, -2),
            (-3.5, -4),
            (0.49, 0),
            (-31.6, -32),
            (7.0, 7),
        ];
        for (x, want) in cases {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }

    #[test]
    fn iq4_nl_dequantize_puts_low_nibbles_first_and_high_nibbles_second() {
        let mut qs = [0u8; 16];
        for (j, q) in qs.iter_mut().enumerate() {
            *q = j as u8 | ((15 - j as u8) << 4);
        }
        let b = BlockIQ4NL {
            d: F16::from_f32(0.5),
            qs,
        };
        let mut y = [0.0f32; 32];
        b.dequantize(&mut y);
        for j in 0..16 {
            assert_eq!(y[j], 0.5 * f32::from(CODEBOOK[j]), "low {j}");
            assert_eq!(y[j + 16], 0.5 * f32::from(CODEBOOK[15 - j]), "high {j}");
        }
    }

    #[test]
    fn iq4_xs_dequantize_joins_each_six_bit_scale_from_its_low_and_high_parts() {
        // Biased 6-bit scales 0, 63, 32, 33, 17, 48, 1, 62 → ls - 32.
        let biased = [0u8, 63, 32, 33, 17, 48, 1, 62];
        let mut b = BlockIQ4XS {
            d: F16::from_f32(0.25),
            scales_h: 0,
            scales_l: [0; 4],
            qs: [0xff; 128],
        };
        for (ib, &s) in biased.iter().enumerate() {
            b.scales_l[ib / 2] |= (s & 0xf) << (4 * (ib % 2));
            b.scales_h |= u16::from(s >> 4) << (2 * ib);
        }
        let mut y = [0.0f32; 256];
        b.dequantize(&mut y);
        for (ib, &s) in biased.iter().enumerate() {
            let want = 0.25 * (i32::from(s) - 32) as f32 * 113.0;
            assert!(
                y[32 * ib..32 * ib + 32].iter().all(|&v| v == want),
                "group {ib}: {}",
                y[32 * ib]
            );
        }
    }

    #[test]
    fn iq2_xxs_dequantize_decodes_index_signs_and_scale_of_a_hand_built_group() {
        // Group 0: grid indices 1, 0, 0, 0; sign fields 1, 0, 0, 0; scale nibble 3.
        let mut qs = [0u16; 32];
        qs[0] = 1;
        qs[2] = 1; // first 7-bit sign field = 1 -> ksigns 129: elements 0 and 7 negative
        qs[3] = 3 << 12; // bits 28..31 of the second word
        let b = BlockIQ2XXS {
            d: F16::from_f32(1.0),
            qs,
        };
        let mut y = [0.0f32; 256];
        b.dequantize(&mut y);
        let db = 3.5 * 0.25; // (0.5 + 3) / 4
        assert_eq!(y[0], -db * 43.0); // grid 1 is 0x08..082b: byte 0 is 0x2b
        assert_eq!(&y[1..7], &[db * 8.0; 6]);
        assert_eq!(y[7], -db * 8.0);
        assert_eq!(&y[8..32], &[db * 8.0; 24]);
        assert_eq!(y[32], 0.5 * 0.25 * 8.0); // group 1: scale nibble 0
    }

    #[test]
    fn iq1_m_dequantize_assembles_the_super_scale_from_four_top_nibbles() {
        // Super-scale bits 0x3d53: nibbles (low to high) 3, 5, d, 3 go to the
        // top of scale words 0..3; word 3's low bits give group 6 ls1 = 2*7+1.
        let words: [u16; 4] = [0x3000, 0x5000, 0xd000, 0x3000 | 0o07];
        let d = F16::from_bits(0x3d53).to_f32();
        let mut scales = [0u8; 8];
        for (i, w) in words.iter().enumerate() {
            scales[2 * i..2 * i + 2].copy_from_slice(&w.to_le_bytes());
        }
        // All qs/qh zero: grid point 0 = all -1, delta +1/8.
        let b = BlockIQ1M {
            qs: [0; 32],
            qh: [0; 16],
            scales,
        };
        let mut y = [0.0f32; 256];
        b.dequantize(&mut y);
        assert_eq!(y[0], d * (-1.0 + 0.125)); // ls 1
        assert_eq!(y[6 * 32], d * 15.0 * (-1.0 + 0.125)); // group 6, first half: ls 15
        assert_eq!(y[6 * 32 + 16], d * (-1.0 + 0.125)); // group 6, second half: ls 1
    }

    fn random_block<B: Block>(rng: &mut SmallRng) -> B {
        let mut bytes = vec![0u8; core::mem::size_of::<B>()];
        rng.fill(&mut bytes[..]);
        bytemuck::pod_read_unaligned(&bytes)
    }

    fn random_q8k(rng: &mut SmallRng) -> (BlockQ8K, Vec<f32>) {
        let mut a = BlockQ8K {
            d: rng.gen_range(0.001f32..0.1),
            qs: [0; 256],
            bsums: [0; 16],
        };
        for q in &mut a.qs {
            *q = rng.gen_range(-127i8..=127);
        }
        for (s, chunk) in a.bsums.iter_mut().zip(a.qs.chunks_exact(16)) {
            *s = chunk.iter().map(|&q| i16::from(q)).sum();
        }
        let vals = a.qs.iter().map(|&q| a.d * f32::from(q)).collect();
        (a, vals)
    }

    /// `vec_dot` (integer sums, one scale per block) against the plain sum of
    /// `dequantize(w) * a` in f64, over 4 random blocks.
    fn dot_matches_dequantized_sum<B: VecDot<Act = BlockQ8K> + Dequantize>(
        rng: &mut SmallRng,
        fix: impl Fn(&mut B),
    ) {
        for _ in 0..20 {
            let mut w = Vec::new();
            let mut acts = Vec::new();
            let (mut exact, mut scale) = (0.0f64, 0.0f64);
            for _ in 0..4 {
                let mut b: B = random_block(rng);
                fix(&mut b);
                let mut y = vec![0.0f32; 256];
                b.dequantize(&mut y);
                let (a, av) = random_q8k(rng);
                for (&yi, &ai) in y.iter().zip(&av) {
                    exact += f64::from(yi) * f64::from(ai);
                    scale += (f64::from(yi) * f64::from(ai)).abs();
                }
                w.push(b);
                acts.push(a);
            }
            let got = f64::from(B::vec_dot(&w, &acts));
            assert!(
                (got - exact).abs() <= 1e-5 * scale + 1e-6,
                "{:?}: dot {got}, dequantized {exact}",
                B::KIND
            );
        }
    }

    fn small_d() -> F16 {
        F16::from_f32(0.0371)
    }

    #[test]
    fn every_lattice_kinds_dot_agrees_with_its_dequantization() {
        let rng = &mut SmallRng::seed_from_u64(7);
        dot_matches_dequantized_sum::<BlockIQ2XXS>(rng, |b| b.d = small_d());
        dot_matches_dequantized_sum::<BlockIQ2XS>(rng, |b| b.d = small_d());
        dot_matches_dequantized_sum::<BlockIQ2S>(rng, |b| b.d = small_d());
        dot_matches_dequantized_sum::<BlockIQ3XXS>(rng, |b| b.d = small_d());
        dot_matches_dequantized_sum::<BlockIQ3S>(rng, |b| b.d = small_d());
        dot_matches_dequantized_sum::<BlockIQ1S>(rng, |b| b.d = small_d());
        dot_matches_dequantized_sum::<BlockIQ1M>(rng, |b| {
            // The super-scale is the top nibble of each scale word: force 0.0371.
            let bits = small_d().to_bits();
            for i in 0..4 {
                let nib = ((bits >> (4 * i)) & 0xf) as u8;
                b.scales[2 * i + 1] = (b.scales[2 * i + 1] & 0x0f) | (nib << 4);
            }
        });
        dot_matches_dequantized_sum::<BlockIQ4XS>(rng, |b| b.d = small_d());
    }

    #[test]
    fn iq4_nl_dot_agrees_with_its_dequantization() {
        let rng = &mut SmallRng::seed_from_u64(9);
        for _ in 0..50 {
            let (mut exact, mut scale) = (0.0f64, 0.0f64);
            let mut w = Vec::new();
            let mut acts = Vec::new();
            for _ in 0..8 {
                let mut b: BlockIQ4NL = random_block(rng);
                b.d = small_d();
                let mut a = BlockQ8_0 {
                    d: F16::from_f32(rng.gen_range(0.001f32..0.1)),
                    qs: [0; 32],
                };
                for q in &mut a.qs {
                    *q = rng.gen_range(-127i8..=127);
                }
                let mut y = [0.0f32; 32];
                b.dequantize(&mut y);
                for (&yi, &q) in y.iter().zip(&a.qs) {
                    let p = f64::from(yi) * f64::from(a.d.to_f32()) * f64::from(q);
                    exact += p;
                    scale += p.abs();
                }
                w.push(b);
                acts.push(a);
            }
            let got = f64::from(BlockIQ4NL::vec_dot(&w, &acts));
            assert!(
                (got - exact).abs() <= 1e-5 * scale + 1e-6,
                "dot {got}, dequantized {exact}"
            );
        }
    }

    fn gaussian(rng: &mut SmallRng, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let (u1, u2): (f32, f32) = (rng.gen_range(1e-7..1.0), rng.gen());
                (-2.0 * u1.ln()).sqrt() * (2.0 * core::f32::consts::PI * u2).cos()
            })
            .collect()
    }

    #[test]
    fn iq4_nl_reproduces_a_block_that_lies_on_the_codebook() {
        let rng = &mut SmallRng::seed_from_u64(3);
        for _ in 0..100 {
            let s = 2f32.powi(rng.gen_range(-12..4));
            let mut x: Vec<f32> = (0..32)
                .map(|_| s * f32::from(CODEBOOK[rng.gen_range(0..16)]))
                .collect();
            x[rng.gen_range(0..32)] = s * -127.0; // the extreme element fixes the scale
            let mut y = [0.0f32; 32];
            BlockIQ4NL::quantize(&x).dequantize(&mut y);
            assert_eq!(&y[..], &x[..]);
        }
    }

    #[test]
    fn iq4_xs_reproduces_a_super_block_whose_group_scales_lie_on_its_six_bit_grid() {
        let rng = &mut SmallRng::seed_from_u64(4);
        for _ in 0..50 {
            let big = 2f32.powi(rng.gen_range(-10..2));
            let mut x = Vec::new();
            for ib in 0..8 {
                // Group scales big * k/32 with k in 1..=32; group 0 holds the largest.
                let k = if ib == 0 { 32 } else { rng.gen_range(1..=32) };
                let s = big * k as f32 / 32.0;
                let mut g: Vec<f32> = (0..32)
                    .map(|_| s * f32::from(CODEBOOK[rng.gen_range(0..16)]))
                    .collect();
                g[rng.gen_range(0..32)] = s * -127.0;
                x.extend(g);
            }
            let mut y = [0.0f32; 256];
            BlockIQ4XS::quantize(&x).dequantize(&mut y);
            assert_eq!(&y[..], &x[..]);
        }
    }

    #[test]
    fn iq4_quantizers_keep_gaussian_round_trip_error_below_a_tenth_of_the_signal() {
        let rng = &mut SmallRng::seed_from_u64(5);
        let x = gaussian(rng, 256 * 64);
        let rel = |y: &[f32]| {
            let err: f64 = x
                .iter()
                .zip(y)
                .map(|(&a, &b)| f64::from(a - b).powi(2))
                .sum();
            let sig: f64 = x.iter().map(|&a| f64::from(a).powi(2)).sum();
            (err / sig).sqrt()
        };
        let mut y = vec![0.0f32; x.len()];
        for (xs, ys) in x.chunks_exact(32).zip(y.chunks_exact_mut(32)) {
            BlockIQ4NL::quantize(xs).dequantize(ys);
        }
        let nl = rel(&y);
        for (xs, ys) in x.chunks_exact(256).zip(y.chunks_exact_mut(256)) {
            BlockIQ4XS::quantize(xs).dequantize(ys);
        }
        let xs = rel(&y);
        assert!(
            nl < 0.1 && xs < 0.1,
            "relative RMS error: IQ4_NL {nl}, IQ4_XS {xs}"
        );
    }

    #[test]
    fn an_all_zero_input_quantizes_to_zero_scales() {
        let z = [0.0f32; 256];
        assert_eq!(BlockIQ4NL::quantize(&z[..32]).d.to_bits(), 0);
        let b = BlockIQ4XS::quantize(&z);
        // ggml's super-scale is -max/32 with max 0: negative zero.
        assert_eq!(b.d.to_bits(), 0x8000);
        assert_eq!((b.scales_h, b.scales_l), (0xaaaa, [0x00; 4]));
        assert!(
            b.qs.iter().all(|&q| q == 0x88),
            "indices of 0 are codebook entry 8 (value 1)"
        );
    }
}

// ---------------------------------------------------------------- Unpack

/// 32 IQ4 nibbles as their table values (low nibbles first).
fn unpack_iq4_32(qs: &[u8], q: &mut [i8]) {
    for j in 0..16 {
        q[j] = kv(qs[j]);
        q[j + 16] = kv(qs[j] >> 4);
    }
}

impl Unpack for BlockIQ4NL {
    const SUB: usize = 32;
    const OFFSET: i32 = 128;
    const CODE_MAX: i32 = 241;
    fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]) {
        unpack_iq4_32(&self.qs, q);
        (scale[0], bias[0]) = (self.d.to_f32(), 0.0);
    }
}

impl Unpack for BlockIQ4XS {
    const SUB: usize = 32;
    const OFFSET: i32 = 128;
    const CODE_MAX: i32 = 241;
    fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]) {
        let d = self.d.to_f32();
        for ib in 0..8 {
            unpack_iq4_32(&self.qs[16 * ib..16 * ib + 16], &mut q[32 * ib..32 * ib + 32]);
            (scale[ib], bias[ib]) = (d * self.ls(ib) as f32, 0.0);
        }
    }
}
