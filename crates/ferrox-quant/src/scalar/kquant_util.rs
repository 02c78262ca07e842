//! The scale searches shared by ggml's K-quant (and some IQ) quantizers.
//!
//! Key decision: these mirror ggml's helpers operation for operation —
//! same loop order, same association of every float product and sum, same
//! integer truncations — because the quantized bytes must be bit-identical to
//! ggml's, and a search that differs by one ulp can pick another scale.
//! None of them allocate; scratch lives on the stack.

// Index loops mirror ggml's C loops one for one, which keeps the
// bit-exactness reviewable line by line.
#![allow(clippy::needless_range_loop)]

/// Smallest group maximum ggml treats as non-zero.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// Round to nearest, ties to even, for `|x| <= 2^22`: adding `1.5 * 2^23`
/// leaves the rounded integer in the low mantissa bits. Outside that range
/// (and for NaN) the result is meaningless but never a panic, as in ggml.
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    ((v.to_bits() as i32) & 0x007f_ffff) - 0x0040_0000
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K/Q5_K block:
/// sub-blocks 0..4 keep theirs in the low six bits of bytes `j` and `j+4`;
/// 4..8 split theirs into a nibble of byte `j+4` and the top two bits of
/// bytes `j-4` and `j`.
#[inline]
pub(crate) fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// Symmetric quantization of `x` to `[-nmax, nmax)` (stored offset by
/// `nmax` in `l`), returning the scale. `rmse_type` 0 takes the plain
/// max-based scale; otherwise a weighted least-squares scale refined over 18
/// perturbed inverse scales, the weight picked by `rmse_type` (1: x², 2: 1,
/// 3: |x|, else √|x|) unless `qw` gives one; a negative `rmse_type` stops after
/// the first least-squares fit.
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [i8], rmse_type: i32, qw: Option<&[f32]>) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.iter_mut().for_each(|q| *q = 0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    if rmse_type == 0 {
        for (q, &v) in l.iter_mut().zip(x) {
            *q = (nmax + nearest_int(iscale * v).clamp(-nmax, nmax - 1)) as i8;
        }
        return 1.0 / iscale;
    }
    let return_early = rmse_type < 0;
    let rmse_type = rmse_type.abs();
    let weight = |i: usize| -> f32 {
        let xi = x[i];
        match qw {
            Some(w) => w[i],
            None => match rmse_type {
                1 => xi * xi,
                2 => 1.0,
                3 => xi.abs(),
                _ => xi.abs().sqrt(),
            },
        }
    };
    let n = x.len().min(l.len());
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        l[i] = (q + nmax) as i8;
        let w = weight(i);
        sumlx += w * x[i] * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    if return_early {
        return if suml2 > 0.0 { 0.5 * (scale + 1.0 / iscale) } else { 1.0 / iscale };
    }
    let mut best = scale * sumlx;
    for is in -9i32..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for i in 0..n {
            let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            let w = weight(i);
            sumlx += w * x[i] * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for i in 0..n {
                l[i] = (nmax + nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Q3_K's symmetric search: with `do_rmse`, an x²-weighted least-squares fit
/// improved by up to five passes of coordinate descent on each quant.
/// Quants land in `l` offset by `nmax`.
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8], do_rmse: bool) -> f32 {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.iter_mut().for_each(|q| *q = 0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let n = x.len().min(l.len());
    if do_rmse {
        let mut sumlx = 0.0f32;
        let mut suml2 = 0.0f32;
        for i in 0..n {
            let q = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
            l[i] = q as i8;
            let w = x[i] * x[i];
            sumlx += w * x[i] * q as f32;
            suml2 += w * q as f32 * q as f32;
        }
        for _ in 0..5 {
            let mut n_changed = 0;
            for i in 0..n {
                let w = x[i] * x[i];
                let li = l[i] as f32;
                let mut slx = sumlx - w * x[i] * li;
                if slx > 0.0 {
                    let mut sl2 = suml2 - w * li * li;
                    let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                    if new_l != l[i] as i32 {
                        slx += w * x[i] * new_l as f32;
                        sl2 += w * new_l as f32 * new_l as f32;
                        if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                            l[i] = new_l as i8;
                            sumlx = slx;
                            suml2 = sl2;
                            n_changed += 1;
                        }
                    }
                }
            }
            if n_changed == 0 {
                break;
            }
        }
        for q in l.iter_mut() {
            *q += nmax as i8;
        }
        return if suml2 > 0.0 { sumlx / suml2 } else { 0.0 };
    }
    for (q, &v) in l.iter_mut().zip(x) {
        *q = (nearest_int(iscale * v).clamp(-nmax, nmax - 1) + nmax) as i8;
    }
    1.0 / iscale
}

/// Asymmetric quantization of `x` to `[0, nmax]` as `scale * l - min`:
/// weighted least squares over `nstep + 1` candidate inverse scales
/// `(rmin + rdelta * is + nmax) / (max - min)`, judged by weighted squared
/// (or, with `use_mad`, absolute) error. Returns `(scale, min)` with `min`
/// as stored (non-negative: the offset subtracted).
#[allow(clippy::too_many_arguments)]
pub(crate) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    const MAX_N: usize = 32;
    let n = x.len().min(weights.len()).min(l.len()).min(MAX_N);
    if n == 0 {
        return (0.0, 0.0);
    }
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l[..n].iter_mut().for_each(|q| *q = 0);
        return (0.0, -min);
    }
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * l[i] as f32 + min - x[i];
        best_error += weights[i] * err(diff);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; MAX_N];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let w = weights[i];
            let qf = q as f32;
            sum_l += w * qf;
            sum_l2 += w * qf * qf;
            sum_xl += w * qf * x[i];
        }
        let d = sum_w * sum_l2 - sum_l * sum_l;
        if d > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / d;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / d;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * err(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let cases = [(0.5, 0), (1.5, 2), (2.5, 2), (-0.5, 0), (-1.5, -2), (-2.5, -2), (3.49, 3), (-3.51, -4), (127.0, 127)];
        for (x, want) in cases {
            assert_eq!(nearest_int(x), want, "{x}");
        }
    }

    #[test]
    fn get_scale_min_k4_splits_high_bits_across_bytes() {
        // Sub-block 5: scale nibble in byte 9 low, top bits in byte 1; min
        // nibble in byte 9 high, top bits in byte 5.
        let mut q = [0u8; 12];
        q[9] = 0xA7; // scale low 7, min low 10
        q[1] = 0b10 << 6; // scale high 2 -> 32
        q[5] = 0b01 << 6; // min high 1 -> 16
        assert_eq!(get_scale_min_k4(5, &q), (32 + 7, 16 + 10));
        q[2] = 0xFF;
        q[6] = 0x3F;
        assert_eq!(get_scale_min_k4(2, &q), (63, 63));
    }

    #[test]
    fn make_qkx2_quants_reproduces_an_exact_affine_grid() {
        // x = 0.5 * l - 1.0 with l covering 0..=15 is representable exactly.
        let x: Vec<f32> = (0..32).map(|i| 0.5 * (i % 16) as f32 - 1.0).collect();
        let w = vec![1.0f32; 32];
        let mut l = [0u8; 32];
        let (scale, min) = make_qkx2_quants(15, &x, &w, &mut l, -1.0, 0.1, 20, false);
        assert!((scale - 0.5).abs() < 1e-6 && (min - 1.0).abs() < 1e-6, "{scale} {min}");
        for (i, &q) in l.iter().enumerate() {
            assert_eq!(q as usize, i % 16);
        }
    }
}
