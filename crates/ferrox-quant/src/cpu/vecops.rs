//! Float vector kernels for attention over an f16 KV cache: `q . k` and
//! `y += w * v` with `k`, `v` in f16, converted in registers (F16C) rather
//! than through a buffer.
//!
//! The key decision: independent lane accumulators, so the sums vectorize
//! (a single running f32 sum is a dependency chain the compiler must not
//! reorder); the best level is picked once, like the dot kernels.

use super::Isa;
use crate::F16;

type DotF16 = unsafe fn(&[f32], &[F16]) -> f32;
type AxpyF16 = unsafe fn(&mut [f32], f32, &[F16]);

fn pick() -> (DotF16, AxpyF16) {
    static PICK: std::sync::OnceLock<(DotF16, AxpyF16)> = std::sync::OnceLock::new();
    *PICK.get_or_init(|| {
        let isa = Isa::active();
        #[cfg(target_arch = "x86_64")]
        if isa.includes(Isa::Avx512Vnni) {
            return (x86::dot_f16_avx512, x86::axpy_f16_avx512);
        } else if isa.includes(Isa::Avx2) {
            return (x86::dot_f16_avx2, x86::axpy_f16_avx2);
        }
        let _ = isa;
        (dot_f16_scalar, axpy_f16_scalar)
    })
}

/// `sum q[i] * k[i]` over the common length.
pub fn dot_f32_f16(q: &[f32], k: &[F16]) -> f32 {
    let n = q.len().min(k.len());
    // SAFETY: the kernel was picked for a level this CPU has; lengths equal.
    unsafe { (pick().0)(&q[..n], &k[..n]) }
}

/// `y[i] += w * v[i]` over the common length.
pub fn axpy_f32_f16(y: &mut [f32], w: f32, v: &[F16]) {
    let n = y.len().min(v.len());
    // SAFETY: the kernel was picked for a level this CPU has; lengths equal.
    unsafe { (pick().1)(&mut y[..n], w, &v[..n]) }
}

/// The scalar twin of [`dot_f32_f16`] (eight lane sums, as the SIMD kernels).
///
/// # Safety
/// None needed; `unsafe` only to share the kernel pointer type.
unsafe fn dot_f16_scalar(q: &[f32], k: &[F16]) -> f32 {
    let mut acc = [0f32; 8];
    let (qc, kc) = (q.chunks_exact(8), k.chunks_exact(8));
    let (qr, kr) = (qc.remainder(), kc.remainder());
    for (a, b) in qc.zip(kc) {
        for i in 0..8 {
            acc[i] += a[i] * b[i].to_f32();
        }
    }
    let tail: f32 = qr.iter().zip(kr).map(|(a, b)| a * b.to_f32()).sum();
    acc.iter().sum::<f32>() + tail
}

/// The scalar twin of [`axpy_f32_f16`].
///
/// # Safety
/// None needed; `unsafe` only to share the kernel pointer type.
unsafe fn axpy_f16_scalar(y: &mut [f32], w: f32, v: &[F16]) {
    y.iter_mut().zip(v).for_each(|(y, v)| *y += w * v.to_f32());
}

// ------------------------------------------------------------- attention
//
// One (token, KV head) task of attention: the `g` query heads that share a
// KV head are computed together, so each K and V row is loaded and converted
// once for all of them, and the value sums stay in registers across keys.

/// Checks the strided row operands of the attention kernels.
fn rows_fit(buf: usize, stride: usize, first: usize, len: usize, width: usize) -> bool {
    len == 0 || (first + len - 1).checked_mul(stride).and_then(|o| o.checked_add(width)).is_some_and(|end| end <= buf)
}

/// `out[h * len + j] = q[h] . k_row(first + j)` for `h < g` query heads of
/// `hd` values (`q` is `g x hd`); K rows are `stride` apart. Returns `false`
/// (and writes nothing) if an operand is too short.
#[allow(clippy::too_many_arguments)]
pub fn attn_scores(q: &[f32], k: &[F16], stride: usize, first: usize, len: usize, hd: usize, g: usize, out: &mut [f32]) -> bool {
    if q.len() < g * hd || out.len() < g * len || !rows_fit(k.len(), stride, first, len, hd) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(16) && Isa::active().includes(Isa::Avx512Vnni) {
        // SAFETY: AVX-512 available; operand sizes checked above.
        unsafe { x86::attn_scores_avx512(q, k, stride, first, len, hd, g, out) };
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if hd.is_multiple_of(16) && Isa::active().includes(Isa::Avx2) {
        // SAFETY: AVX2 available; operand sizes checked above.
        unsafe { x86::attn_scores_avx2(q, k, stride, first, len, hd, g, out) };
        return true;
    }
    attn_scores_scalar(q, k, stride, first, len, hd, g, out);
    true
}

/// `out[h] = sum_j w[h * len + j] * v_row(first + j)` for `h < g` (`out` is
/// `g x hdv`, overwritten). Returns `false` (and writes nothing) if an
/// operand is too short.
#[allow(clippy::too_many_arguments)]
pub fn attn_values(w: &[f32], v: &[F16], stride: usize, first: usize, len: usize, hdv: usize, g: usize, out: &mut [f32]) -> bool {
    if w.len() < g * len || out.len() < g * hdv || !rows_fit(v.len(), stride, first, len, hdv) {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    if hdv.is_multiple_of(16) && Isa::active().includes(Isa::Avx512Vnni) {
        // SAFETY: AVX-512 available; operand sizes checked above.
        unsafe { x86::attn_values_avx512(w, v, stride, first, len, hdv, g, out) };
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if hdv.is_multiple_of(16) && Isa::active().includes(Isa::Avx2) {
        // SAFETY: AVX2 available; operand sizes checked above.
        unsafe { x86::attn_values_avx2(w, v, stride, first, len, hdv, g, out) };
        return true;
    }
    attn_values_scalar(w, v, stride, first, len, hdv, g, out);
    true
}

/// Softmax of `row` in place (max subtracted first, as ggml does).
pub fn softmax(row: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if Isa::active().includes(Isa::Avx512Vnni) {
        // SAFETY: AVX-512 available.
        unsafe { x86::softmax_avx512(row) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::active().includes(Isa::Avx2) {
        // SAFETY: AVX2 and FMA available.
        unsafe { x86::softmax_avx2(row) };
        return;
    }
    softmax_scalar(row);
}

#[allow(clippy::too_many_arguments)]
fn attn_scores_scalar(q: &[f32], k: &[F16], stride: usize, first: usize, len: usize, hd: usize, g: usize, out: &mut [f32]) {
    for j in 0..len {
        let krow = &k[(first + j) * stride..][..hd];
        for h in 0..g {
            out[h * len + j] = dot_f32_f16(&q[h * hd..(h + 1) * hd], krow);
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn attn_values_scalar(w: &[f32], v: &[F16], stride: usize, first: usize, len: usize, hdv: usize, g: usize, out: &mut [f32]) {
    out[..g * hdv].fill(0.0);
    for j in 0..len {
        let vrow = &v[(first + j) * stride..][..hdv];
        for h in 0..g {
            axpy_f32_f16(&mut out[h * hdv..(h + 1) * hdv], w[h * len + j], vrow);
        }
    }
}

fn softmax_scalar(row: &mut [f32]) {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    row.iter_mut().for_each(|v| *v *= inv);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    //! Every function here is `unsafe` for one reason: it must only run on a
    //! CPU with the features its `target_feature` names, and its slices have
    //! equal lengths.
    use crate::F16;
    use core::arch::x86_64::*;

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load8(k: *const F16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(k.cast()))
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_f16_avx2(q: &[f32], k: &[F16]) -> f32 {
        let n = q.len();
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= n {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i)), load8(k.as_ptr().add(i)), a0);
            a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q.as_ptr().add(i + 8)), load8(k.as_ptr().add(i + 8)), a1);
            i += 16;
        }
        let s = _mm256_add_ps(a0, a1);
        let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_movehdup_ps(s));
        let mut sum = _mm_cvtss_f32(s);
        for j in i..n {
            sum += q[j] * k[j].to_f32();
        }
        sum
    }

    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpy_f16_avx2(y: &mut [f32], w: f32, v: &[F16]) {
        let n = y.len();
        let wv = _mm256_set1_ps(w);
        let mut i = 0;
        while i + 8 <= n {
            let p = y.as_mut_ptr().add(i);
            _mm256_storeu_ps(p, _mm256_fmadd_ps(wv, load8(v.as_ptr().add(i)), _mm256_loadu_ps(p)));
            i += 8;
        }
        for j in i..n {
            y[j] += w * v[j].to_f32();
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(k: *const F16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(k.cast()))
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(super) unsafe fn dot_f16_avx512(q: &[f32], k: &[F16]) -> f32 {
        let n = q.len();
        let (mut a0, mut a1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut i = 0;
        while i + 32 <= n {
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(q.as_ptr().add(i)), load16(k.as_ptr().add(i)), a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(q.as_ptr().add(i + 16)), load16(k.as_ptr().add(i + 16)), a1);
            i += 32;
        }
        let mut sum = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
        for j in i..n {
            sum += q[j] * k[j].to_f32();
        }
        sum
    }

    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(super) unsafe fn axpy_f16_avx512(y: &mut [f32], w: f32, v: &[F16]) {
        let n = y.len();
        let wv = _mm512_set1_ps(w);
        let mut i = 0;
        while i + 16 <= n {
            let p = y.as_mut_ptr().add(i);
            _mm512_storeu_ps(p, _mm512_fmadd_ps(wv, load16(v.as_ptr().add(i)), _mm512_loadu_ps(p)));
            i += 16;
        }
        for j in i..n {
            y[j] += w * v[j].to_f32();
        }
    }
    /// Up to four heads at a time: `G` accumulators per key.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn scores_block<const G: usize>(q: *const f32, k: *const F16, stride: usize, len: usize, hd: usize, out: *mut f32, out_len: usize) {
        for j in 0..len {
            let krow = k.add(j * stride);
            let mut acc = [_mm512_setzero_ps(); G];
            let mut c = 0;
            while c < hd {
                let kv = load16(krow.add(c));
                for (h, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_loadu_ps(q.add(h * hd + c)), kv, *a);
                }
                c += 16;
            }
            for (h, a) in acc.iter().enumerate() {
                *out.add(h * out_len + j) = _mm512_reduce_add_ps(*a);
            }
        }
    }

    /// # Safety
    /// AVX-512F; operands checked by [`super::attn_scores`]; `hd % 16 == 0`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attn_scores_avx512(q: &[f32], k: &[F16], stride: usize, first: usize, len: usize, hd: usize, g: usize, out: &mut [f32]) {
        scores_by_blocks([scores_block::<1>, scores_block::<2>, scores_block::<4>], q, k, stride, first, len, hd, g, out)
    }

    /// A scores kernel for a block of 1, 2 or 4 heads ([`scores_block`],
    /// [`scores_block_avx2`]): `q`, K rows, stride, keys, head size, out,
    /// out row length.
    type ScoresBlock = unsafe fn(*const f32, *const F16, usize, usize, usize, *mut f32, usize);

    /// A values kernel for a block of 1, 2 or 4 heads ([`values_block`],
    /// [`values_block_avx2`]): weights, V rows, stride, keys, head size, out.
    type ValuesBlock = unsafe fn(*const f32, *const F16, usize, usize, usize, *mut f32);

    /// Scores over [`head_blocks`] of `g`, each block by the kernel of its
    /// width (`kernels[0]` for 1 head, `[1]` for 2, `[2]` for 4).
    ///
    /// # Safety
    /// The kernels' level is available; operands checked by
    /// [`super::attn_scores`] for the kernels' head-size multiple.
    #[allow(clippy::too_many_arguments)]
    unsafe fn scores_by_blocks(kernels: [ScoresBlock; 3], q: &[f32], k: &[F16], stride: usize, first: usize, len: usize, hd: usize, g: usize, out: &mut [f32]) {
        let kp = k.as_ptr().add(first * stride);
        for (h, width) in head_blocks(g) {
            let (qp, op) = (q.as_ptr().add(h * hd), out.as_mut_ptr().add(h * len));
            kernels[width.trailing_zeros() as usize](qp, kp, stride, len, hd, op, len);
        }
    }

    /// Values over [`head_blocks`] of `g`, as [`scores_by_blocks`].
    ///
    /// # Safety
    /// As [`scores_by_blocks`], operands checked by [`super::attn_values`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn values_by_blocks(kernels: [ValuesBlock; 3], w: &[f32], v: &[F16], stride: usize, first: usize, len: usize, hdv: usize, g: usize, out: &mut [f32]) {
        let vp = v.as_ptr().add(first * stride);
        for (h, width) in head_blocks(g) {
            // Rows of `w` for heads h.. are `len` apart, as the block expects.
            let (wp, op) = (w.as_ptr().add(h * len), out.as_mut_ptr().add(h * hdv));
            kernels[width.trailing_zeros() as usize](wp, vp, stride, len, hdv, op);
        }
    }

    /// Splits `g` query heads into blocks of 4, then 2, then 1 (the widths the
    /// register-blocked kernels are instantiated for): `(first head, width)`.
    fn head_blocks(g: usize) -> impl Iterator<Item = (usize, usize)> {
        let mut h = 0;
        core::iter::from_fn(move || {
            let width = match g.checked_sub(h)? {
                0 => return None,
                1 => 1,
                2 | 3 => 2,
                _ => 4,
            };
            h += width;
            Some((h - width, width))
        })
    }

    /// `G` heads x 64 output values in registers across all keys.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn values_block<const G: usize>(w: *const f32, v: *const F16, stride: usize, len: usize, hdv: usize, out: *mut f32) {
        let mut c = 0;
        while c + 64 <= hdv {
            let mut acc = [[_mm512_setzero_ps(); 4]; G];
            for j in 0..len {
                let vrow = v.add(j * stride + c);
                let vv = [load16(vrow), load16(vrow.add(16)), load16(vrow.add(32)), load16(vrow.add(48))];
                for (h, a) in acc.iter_mut().enumerate() {
                    let wj = _mm512_set1_ps(*w.add(h * len + j));
                    for (x, y) in a.iter_mut().zip(&vv) {
                        *x = _mm512_fmadd_ps(wj, *y, *x);
                    }
                }
            }
            for (h, a) in acc.iter().enumerate() {
                for (i, x) in a.iter().enumerate() {
                    _mm512_storeu_ps(out.add(h * hdv + c + 16 * i), *x);
                }
            }
            c += 64;
        }
        while c < hdv {
            let mut acc = [_mm512_setzero_ps(); G];
            for j in 0..len {
                let vv = load16(v.add(j * stride + c));
                for (h, a) in acc.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(*w.add(h * len + j)), vv, *a);
                }
            }
            for (h, a) in acc.iter().enumerate() {
                _mm512_storeu_ps(out.add(h * hdv + c), *a);
            }
            c += 16;
        }
    }

    /// # Safety
    /// AVX-512F; operands checked by [`super::attn_values`]; `hdv % 16 == 0`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attn_values_avx512(w: &[f32], v: &[F16], stride: usize, first: usize, len: usize, hdv: usize, g: usize, out: &mut [f32]) {
        values_by_blocks([values_block::<1>, values_block::<2>, values_block::<4>], w, v, stride, first, len, hdv, g, out)
    }

    /// [`scores_block`] in 256-bit registers: two accumulators a head (eight
    /// FMA chains for four heads) over 16 values a step.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_block_avx2<const G: usize>(q: *const f32, k: *const F16, stride: usize, len: usize, hd: usize, out: *mut f32, out_len: usize) {
        for j in 0..len {
            let krow = k.add(j * stride);
            let mut acc = [[_mm256_setzero_ps(); 2]; G];
            for c in (0..hd).step_by(16) {
                let kv = [load8(krow.add(c)), load8(krow.add(c + 8))];
                for (h, a) in acc.iter_mut().enumerate() {
                    for (i, (a, kv)) in a.iter_mut().zip(&kv).enumerate() {
                        *a = _mm256_fmadd_ps(_mm256_loadu_ps(q.add(h * hd + c + 8 * i)), *kv, *a);
                    }
                }
            }
            for (h, a) in acc.iter().enumerate() {
                let s = _mm256_add_ps(a[0], a[1]);
                let s = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
                let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
                *out.add(h * out_len + j) = _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
            }
        }
    }

    /// # Safety
    /// AVX2, FMA, F16C; operands checked by [`super::attn_scores`]; `hd % 16 == 0`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attn_scores_avx2(q: &[f32], k: &[F16], stride: usize, first: usize, len: usize, hd: usize, g: usize, out: &mut [f32]) {
        scores_by_blocks([scores_block_avx2::<1>, scores_block_avx2::<2>, scores_block_avx2::<4>], q, k, stride, first, len, hd, g, out)
    }

    /// [`values_block`] in 256-bit registers: `G` heads x 16 output values
    /// in registers across all keys (eight accumulators for four heads).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn values_block_avx2<const G: usize>(w: *const f32, v: *const F16, stride: usize, len: usize, hdv: usize, out: *mut f32) {
        for c in (0..hdv).step_by(16) {
            let mut acc = [[_mm256_setzero_ps(); 2]; G];
            for j in 0..len {
                let vrow = v.add(j * stride + c);
                let vv = [load8(vrow), load8(vrow.add(8))];
                for (h, a) in acc.iter_mut().enumerate() {
                    let wj = _mm256_set1_ps(*w.add(h * len + j));
                    for (x, y) in a.iter_mut().zip(&vv) {
                        *x = _mm256_fmadd_ps(wj, *y, *x);
                    }
                }
            }
            for (h, a) in acc.iter().enumerate() {
                for (i, x) in a.iter().enumerate() {
                    _mm256_storeu_ps(out.add(h * hdv + c + 8 * i), *x);
                }
            }
        }
    }

    /// # Safety
    /// AVX2, FMA, F16C; operands checked by [`super::attn_values`]; `hdv % 16 == 0`.
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn attn_values_avx2(w: &[f32], v: &[F16], stride: usize, first: usize, len: usize, hdv: usize, g: usize, out: &mut [f32]) {
        values_by_blocks([values_block_avx2::<1>, values_block_avx2::<2>, values_block_avx2::<4>], w, v, stride, first, len, hdv, g, out)
    }

    /// e^x for x <= 0 (softmax inputs after the max is subtracted): 2^n
    /// times a degree-6 polynomial on |r| <= ln2/2, scaled by `vscalefps`
    /// (which also flushes large negative inputs to zero). Relative error
    /// about 2e-7.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    unsafe fn exp16(x: __m512) -> __m512 {
        let x = _mm512_max_ps(x, _mm512_set1_ps(-104.0));
        let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm512_mul_ps(x, _mm512_set1_ps(core::f32::consts::LOG2_E)),
        );
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_145_75), x);
        let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm512_set1_ps(1.0 / 720.0);
        for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        _mm512_scalef_ps(p, n)
    }

    /// [`exp16`] in 256 bits: 2^n times the same degree-6 polynomial, 2^n
    /// built in the exponent field (inputs below -87 flush to zero, where
    /// `vscalefps` would give a denormal or zero: both round away in a
    /// softmax sum). Relative error about 2e-7.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn exp8(x: __m256) -> __m256 {
        let tiny = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.0));
        let x = _mm256_max_ps(x, _mm256_set1_ps(-87.0));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(core::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm256_set1_ps(1.0 / 720.0);
        for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let pow2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127))));
        _mm256_andnot_ps(tiny, _mm256_mul_ps(p, pow2))
    }

    /// The horizontal max and sum of eight lanes.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn hmax8(v: __m256) -> f32 {
        let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
    }

    /// # Safety
    /// AVX2 and FMA.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn softmax_avx2(row: &mut [f32]) {
        let n = row.len();
        let p = row.as_mut_ptr();
        let full = n / 8 * 8;
        let mut m = _mm256_set1_ps(f32::NEG_INFINITY);
        for i in (0..full).step_by(8) {
            m = _mm256_max_ps(m, _mm256_loadu_ps(p.add(i)));
        }
        let mx = row[full..].iter().fold(hmax8(m), |a, &b| a.max(b));
        let mxv = _mm256_set1_ps(mx);
        let mut s = _mm256_setzero_ps();
        for i in (0..full).step_by(8) {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mxv));
            _mm256_storeu_ps(p.add(i), e);
            s = _mm256_add_ps(s, e);
        }
        let sv = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
        let sv = _mm_add_ps(sv, _mm_movehl_ps(sv, sv));
        let mut sum = _mm_cvtss_f32(_mm_add_ss(sv, _mm_movehdup_ps(sv)));
        for v in row[full..].iter_mut() {
            *v = (*v - mx).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        let invv = _mm256_set1_ps(inv);
        for i in (0..full).step_by(8) {
            _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), invv));
        }
        row[full..].iter_mut().for_each(|v| *v *= inv);
    }

    /// # Safety
    /// AVX-512F.
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(super) unsafe fn softmax_avx512(row: &mut [f32]) {
        let n = row.len();
        let p = row.as_mut_ptr();
        let tail = (1u32 << (n % 16)) as u16 - 1;
        let full = n / 16 * 16;
        let mut m = _mm512_set1_ps(f32::NEG_INFINITY);
        for i in (0..full).step_by(16) {
            m = _mm512_max_ps(m, _mm512_loadu_ps(p.add(i)));
        }
        m = _mm512_mask_max_ps(m, tail, m, _mm512_maskz_loadu_ps(tail, p.add(full)));
        let mx = _mm512_set1_ps(_mm512_reduce_max_ps(m));
        let mut s = _mm512_setzero_ps();
        for i in (0..full).step_by(16) {
            let e = exp16(_mm512_sub_ps(_mm512_loadu_ps(p.add(i)), mx));
            _mm512_storeu_ps(p.add(i), e);
            s = _mm512_add_ps(s, e);
        }
        let e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, p.add(full)), mx));
        _mm512_mask_storeu_ps(p.add(full), tail, e);
        s = _mm512_mask_add_ps(s, tail, s, e);
        let inv = _mm512_set1_ps(1.0 / _mm512_reduce_add_ps(s));
        for i in (0..full).step_by(16) {
            _mm512_storeu_ps(p.add(i), _mm512_mul_ps(_mm512_loadu_ps(p.add(i)), inv));
        }
        _mm512_mask_storeu_ps(p.add(full), tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, p.add(full)), inv));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn every_level_agrees_with_the_scalar_twin_at_odd_lengths() {
        let mut rng = SmallRng::seed_from_u64(5);
        #[allow(unused_mut)]
        let mut levels: Vec<(Isa, DotF16, AxpyF16)> = vec![];
        #[cfg(target_arch = "x86_64")]
        {
            levels.push((Isa::Avx2, x86::dot_f16_avx2, x86::axpy_f16_avx2));
            levels.push((Isa::Avx512Vnni, x86::dot_f16_avx512, x86::axpy_f16_avx512));
        }
        for (isa, dot, axpy) in levels {
            if !isa.is_available() {
                eprintln!("NOT CHECKED: f16 vector kernels at {isa} (this CPU lacks it)");
                continue;
            }
            for n in [0, 1, 7, 8, 15, 16, 33, 64, 100, 256, 257] {
                let q: Vec<f32> = (0..n).map(|_| rng.gen_range(-2.0..2.0)).collect();
                let k: Vec<F16> = (0..n).map(|_| F16::from_f32(rng.gen_range(-2.0..2.0))).collect();
                // SAFETY: level checked above; equal lengths.
                let (got, want) = unsafe { (dot(&q, &k), dot_f16_scalar(&q, &k)) };
                assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "{isa} dot n={n}: {got} vs {want}");
                let (mut y1, mut y2) = (q.clone(), q.clone());
                // SAFETY: as above.
                unsafe {
                    axpy(&mut y1, 0.37, &k);
                    axpy_f16_scalar(&mut y2, 0.37, &k);
                }
                for (a, b) in y1.iter().zip(&y2) {
                    assert!((a - b).abs() <= 1e-6 * (1.0 + b.abs()), "{isa} axpy n={n}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn attention_kernels_agree_with_their_scalar_twins() {
        let mut rng = SmallRng::seed_from_u64(6);
        for (hd, g, len, stride_extra) in [(16, 1, 1, 0), (48, 3, 7, 16), (64, 4, 37, 0), (256, 4, 130, 256), (80, 5, 9, 0), (256, 8, 20, 0), (24, 2, 5, 0)] {
            let stride = hd + stride_extra;
            let first = 3;
            let q: Vec<f32> = (0..g * hd).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let k: Vec<F16> = (0..(first + len) * stride).map(|_| F16::from_f32(rng.gen_range(-1.0..1.0))).collect();
            let (mut got, mut want) = (vec![0f32; g * len], vec![0f32; g * len]);
            assert!(attn_scores(&q, &k, stride, first, len, hd, g, &mut got));
            attn_scores_scalar(&q, &k, stride, first, len, hd, g, &mut want);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "scores hd={hd} g={g} len={len}: {a} vs {b}");
            }
            let w: Vec<f32> = (0..g * len).map(|_| rng.gen_range(0.0..1.0)).collect();
            let (mut got, mut want) = (vec![f32::NAN; g * hd], vec![f32::NAN; g * hd]);
            assert!(attn_values(&w, &k, stride, first, len, hd, g, &mut got));
            attn_values_scalar(&w, &k, stride, first, len, hd, g, &mut want);
            for (a, b) in got.iter().zip(&want) {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "values hd={hd} g={g} len={len}: {a} vs {b}");
            }
            // The AVX2 kernels by name too (the dispatch above runs AVX-512's where the CPU has it).
            #[cfg(target_arch = "x86_64")]
            if hd % 16 == 0 && Isa::Avx2.is_available() {
                let (mut s2, mut v2) = (vec![0f32; g * len], vec![f32::NAN; g * hd]);
                // SAFETY: AVX2 available; the operands passed the checked calls above.
                unsafe {
                    x86::attn_scores_avx2(&q, &k, stride, first, len, hd, g, &mut s2);
                    x86::attn_values_avx2(&w, &k, stride, first, len, hd, g, &mut v2);
                }
                let mut ws = vec![0f32; g * len];
                attn_scores_scalar(&q, &k, stride, first, len, hd, g, &mut ws);
                for (a, b) in s2.iter().zip(&ws) {
                    assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "avx2 scores hd={hd} g={g} len={len}: {a} vs {b}");
                }
                for (a, b) in v2.iter().zip(&want) {
                    assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "avx2 values hd={hd} g={g} len={len}: {a} vs {b}");
                }
            } else {
                eprintln!("NOT CHECKED: the AVX2 attention kernels at hd={hd} (this CPU lacks AVX2, or hd is no multiple of 16)");
            }
            // Too-short operands are refused, not read past.
            let short = (first + len - 1) * stride + hd - 1;
            assert!(!attn_scores(&q, &k[..short], stride, first, len, hd, g, &mut got));
            assert!(!attn_values(&w[..w.len() - 1], &k, stride, first, len, hd, g, &mut got));
        }
        for n in [1, 5, 16, 17, 100, 513] {
            let mut a: Vec<f32> = (0..n).map(|_| rng.gen_range(-30.0..30.0)).collect();
            a[0] = -200.0; // far below the max: exp underflows to zero
            let mut b = a.clone();
            let mut c = a.clone();
            softmax(&mut a);
            softmax_scalar(&mut b);
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-6 + 1e-5 * y, "softmax n={n}: {x} vs {y}");
            }
            assert!((a.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            // AVX2's by name (the dispatch above runs AVX-512's where the CPU has it).
            #[cfg(target_arch = "x86_64")]
            if Isa::Avx2.is_available() {
                // SAFETY: AVX2 and FMA available.
                unsafe { x86::softmax_avx2(&mut c) };
                for (x, y) in c.iter().zip(&b) {
                    assert!((x - y).abs() <= 1e-6 + 1e-5 * y, "avx2 softmax n={n}: {x} vs {y}");
                }
            }
        }
    }
}
