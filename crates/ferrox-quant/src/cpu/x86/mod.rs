//! x86-64 kernels. AVX2 is the baseline SIMD level; the AVX-512 level has
//! VNNI kernels for the 32-element kinds and Q2_K..Q6_K (one and four rows)
//! and reuses AVX2 for the rest through [`super::Isa::fallback`].

pub(crate) mod amx;
mod avx2;
mod avx2_gemm;
mod avx512;
pub(crate) mod rows8;
pub(crate) mod vnni16;

use super::DotFn;
use crate::QuantKind;

/// The AVX2 dispatch table (see [`super::dot_fn`]).
pub(super) fn avx2_dot_fn(kind: QuantKind) -> Option<DotFn> {
    use QuantKind::*;
    let f: DotFn = match kind {
        F32 => avx2::dot_f32,
        F16 => avx2::dot_f16,
        BF16 => avx2::dot_bf16,
        Q8_0 => avx2::dot_q8_0_q8_0,
        Q4_0 => avx2::dot_q4_0_q8_0,
        Q5_0 => avx2::dot_q5_0_q8_0,
        Q4_1 => avx2::dot_q4_1_q8_1,
        Q5_1 => avx2::dot_q5_1_q8_1,
        IQ4NL => avx2::dot_iq4_nl_q8_0,
        MXFP4 => avx2::dot_mxfp4_q8_0,
        Q2K => avx2::dot_q2_k_q8_k,
        Q3K => avx2::dot_q3_k_q8_k,
        Q4K => avx2::dot_q4_k_q8_k,
        Q5K => avx2::dot_q5_k_q8_k,
        Q6K => avx2::dot_q6_k_q8_k,
        IQ4XS => avx2::dot_iq4_xs_q8_k,
        _ => return None, // capability table: partial by design
    };
    Some(f)
}

/// The AVX2 four-row kernels (see [`super::dot4_fn`]): the 32-element kinds
/// whose layer matrices are instruction-bound. Q8_0 has none: on Gemma 3
/// 270M's 178 MB Q8_0 head (2 threads, bandwidth-bound) a four-row kernel
/// streamed less than the one-row path.
pub(super) fn avx2_dot4_fn(kind: QuantKind) -> Option<super::Dot4Fn> {
    use QuantKind::*;
    let f: super::Dot4Fn = match kind {
        Q4_0 => avx2::dot4_q4_0,
        Q5_0 => avx2::dot4_q5_0,
        IQ4NL => avx2::dot4_iq4_nl,
        _ => return None, // capability table: partial by design
    };
    Some(f)
}

/// The AVX-512 VNNI four-row kernels (see [`super::dot4_fn`]).
pub(super) fn avx512_dot4_fn(kind: QuantKind) -> Option<super::Dot4Fn> {
    use QuantKind::*;
    let f: super::Dot4Fn = match kind {
        Q8_0 => avx512::dot4_q8_0,
        // GFNI (Ice Lake, Zen 4 on; not Cascade Lake) unpacks nibbles in
        // one instruction instead of two.
        Q4_0 if std::arch::is_x86_feature_detected!("gfni") => avx512::dot4_q4_0_gfni,
        Q4_0 => avx512::dot4_q4_0,
        Q5_0 => avx512::dot4_q5_0,
        Q5_1 => avx512::dot4_q5_1,
        IQ4NL => avx512::dot4_iq4_nl,
        Q4K => avx512::dot4_q4_k,
        Q5K => avx512::dot4_q5_k,
        Q6K => avx512::dot4_q6_k,
        Q3K => avx512::dot4_q3_k,
        Q2K => avx512::dot4_q2_k,
        _ => return None, // capability table: partial by design
    };
    Some(f)
}

/// The GEMM with rows in lanes ([`crate::gemm::Rows8Fn`]) for a kind of
/// `sub`-element sub-blocks whose codes reach `code_max`
/// ([`crate::Unpack::CODE_MAX`]), and the base it subtracts from every
/// code: codes past 129 take the sign trick around a base of 128. With
/// `vnni` the `vpdpbusd` kernel ([`avx2_gemm::gemm_8x4_vnni`]), which sums
/// in 32 bits; without it the AVX2 instance whose 16-bit sums cannot
/// saturate (`G` groups a sum, `G * 2 * code_max * 127 < 2^15`; one group
/// with the sign trick).
pub(crate) fn rows8_gemm(vnni: bool, sub: usize, code_max: i32) -> Option<(crate::gemm::Rows8Fn, i32)> {
    use avx2_gemm::{gemm_8x4 as k, gemm_8x4_vnni as v};
    let sign = code_max > 129;
    let fits = |g: i32| g * 2 * code_max * 127 < 1 << 15;
    let f: crate::gemm::Rows8Fn = match (sub, vnni) {
        (32, true) if sign => v::<32, true>,
        (32, true) => v::<32, false>,
        (16, true) if sign => v::<16, true>,
        (16, true) => v::<16, false>,
        (32, false) if sign => k::<32, 1, true>,
        (32, false) if fits(8) => k::<32, 8, false>,
        (32, false) if fits(4) => k::<32, 4, false>,
        (32, false) if fits(2) => k::<32, 2, false>,
        (32, false) => k::<32, 1, false>,
        (16, false) if sign => k::<16, 1, true>,
        (16, false) if fits(4) => k::<16, 4, false>,
        (16, false) if fits(2) => k::<16, 2, false>,
        (16, false) => k::<16, 1, false>,
        _ => return None,
    };
    Some((f, if sign { 128 } else { 0 }))
}

/// [`rows8_gemm`]'s sixteen-row tile, where the level has one: the
/// `vpdpbusd` kernel over two eight-row groups
/// ([`avx2_gemm::gemm_16x4_vnni`]), the same instance by sub-block and sign
/// (decision 0053). The AVX2 level keeps eight rows.
pub(crate) fn rows16_gemm(vnni: bool, sub: usize, code_max: i32) -> Option<crate::gemm::Rows16Fn> {
    use avx2_gemm::gemm_16x4_vnni as v;
    if !vnni {
        return None;
    }
    let sign = code_max > 129;
    Some(match (sub, sign) {
        (32, true) => v::<32, true>,
        (32, false) => v::<32, false>,
        (16, true) => v::<16, true>,
        (16, false) => v::<16, false>,
        _ => return None,
    })
}

/// The AVX2 panel packer of eight rows for `kind`, where it has one (the
/// 32-element kinds whose blocks have a scale and no bias): see
/// [`crate::gemm::Pack8Fn`].
pub(crate) fn avx2_pack8(kind: QuantKind) -> Option<crate::gemm::Pack8Fn> {
    use QuantKind::*;
    let f: crate::gemm::Pack8Fn = match kind {
        Q4_0 => avx2_gemm::pack8_q4_0,
        Q5_0 => avx2_gemm::pack8_q5_0,
        Q8_0 => avx2_gemm::pack8_q8_0,
        IQ4NL => avx2_gemm::pack8_iq4_nl,
        _ => return None, // capability table: partial by design
    };
    Some(f)
}

/// The one-pass packers of eight rows for the kinds with a bias of their
/// own ([`crate::gemm::Pack8KFn`]).
pub(crate) fn avx2_pack8k(kind: QuantKind) -> Option<crate::gemm::Pack8KFn> {
    use QuantKind::*;
    let f: crate::gemm::Pack8KFn = match kind {
        Q4K => avx2_gemm::pack8_q4_k,
        Q5K => avx2_gemm::pack8_q5_k,
        Q6K => avx2_gemm::pack8_q6_k,
        Q3K => avx2_gemm::pack8_q3_k,
        Q2K => avx2_gemm::pack8_q2_k,
        _ => return None, // capability table: partial by design
    };
    Some(f)
}

/// The AVX-512 VNNI dispatch table (see [`super::dot_fn`]).
pub(super) fn avx512_dot_fn(kind: QuantKind) -> Option<DotFn> {
    use QuantKind::*;
    let f: DotFn = match kind {
        Q8_0 => avx512::dot_q8_0_q8_0,
        Q4_0 => avx512::dot_q4_0_q8_0,
        Q5_0 => avx512::dot_q5_0_q8_0,
        Q5_1 => avx512::dot_q5_1_q8_1,
        IQ4NL => avx512::dot_iq4_nl_q8_0,
        MXFP4 => avx512::dot_mxfp4_q8_0,
        Q4K => avx512::dot_q4_k_q8_k,
        Q5K => avx512::dot_q5_k_q8_k,
        Q6K => avx512::dot_q6_k_q8_k,
        Q3K => avx512::dot_q3_k_q8_k,
        Q2K => avx512::dot_q2_k_q8_k,
        _ => return None, // capability table: partial by design
    };
    Some(f)
}

/// Quantizes `x` into `out` as `act` with AVX2 when it has a kernel for
/// `act`; returns `false` (and writes nothing) otherwise.
///
/// The caller has checked that AVX2 is available, that `out` is exactly the
/// bytes of `x.len()` elements of `act` and that it is aligned.
pub(super) fn quantize_act_avx2(act: QuantKind, x: &[f32], out: &mut [u8]) -> bool {
    match act {
        // SAFETY: AVX2/FMA/F16C, `out`'s length and alignment: checked by `quantize_act`.
        QuantKind::Q8_0 => unsafe { avx2::quantize_q8_0(x, out) },
        // SAFETY: AVX2/FMA/F16C, `out`'s length and alignment: checked by `quantize_act`.
        QuantKind::Q8_1 => unsafe { avx2::quantize_q8_1(x, out) },
        // SAFETY: AVX2/FMA/F16C, `out`'s length and alignment: checked by `quantize_act`.
        QuantKind::Q8K => unsafe { avx2::quantize_q8_k(x, out) },
        _ => return false, // capability table: partial by design
    }
    true
}

/// `m` (1..=8) tokens against one F16 row with `avx2::dot_f16_rows`, three
/// tokens at a time, into `out[..m]`.
///
/// # Safety
/// AVX2, FMA and F16C are available; `w` is whole F16 elements and each of
/// the `m` activation rows at `a + t * stride` holds `w.len() / 2` floats.
pub(super) unsafe fn avx2_f16_rows(w: &[u8], a: *const f32, stride: usize, m: usize, out: &mut [f32; 8]) {
    let mut t = 0;
    while t < m.min(8) {
        let at = a.wrapping_add(t * stride);
        // SAFETY: the caller's contract, for rows t.. of the `m`.
        unsafe {
            match m - t {
                1 => avx2::dot_f16_rows::<1>(w, at, stride, (&mut out[t..t + 1]).try_into().unwrap_or_else(|_| unreachable!())),
                2 => avx2::dot_f16_rows::<2>(w, at, stride, (&mut out[t..t + 2]).try_into().unwrap_or_else(|_| unreachable!())),
                _ => avx2::dot_f16_rows::<3>(w, at, stride, (&mut out[t..t + 3]).try_into().unwrap_or_else(|_| unreachable!())),
            }
        }
        t += 3;
    }
}

/// `m` (1..=8) tokens against one F16 row with `avx512::dot_f16_rows`,
/// into `out[..m]`.
///
/// # Safety
/// AVX-512 VL (and AVX2/FMA/F16C) is available; `w` is whole F16 elements
/// and each of the `m` activation rows at `a + t * stride` holds `w.len() / 2` floats.
pub(super) unsafe fn avx512_f16_rows(w: &[u8], a: *const f32, stride: usize, m: usize, out: &mut [f32; 8]) {
    macro_rules! call {
        ($m:literal) => {{
            let mut o = [0.0f32; $m];
            // SAFETY: the caller's contract, for `$m` rows.
            unsafe { avx512::dot_f16_rows::<$m>(w, a, stride, &mut o) };
            out[..$m].copy_from_slice(&o);
        }};
    }
    match m {
        1 => call!(1),
        2 => call!(2),
        3 => call!(3),
        4 => call!(4),
        5 => call!(5),
        6 => call!(6),
        7 => call!(7),
        _ => call!(8),
    }
}
