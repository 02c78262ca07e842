//! aarch64 NEON kernels. Compiled and type-checked by cross `cargo check`
//! only: this project's machines are x86-64, so no test has run them yet
//! (the kernel-vs-twin test runs them on any aarch64 host).

use core::arch::aarch64::*;

use super::{blocks_of, DotFn};
use crate::blocks::*;
use crate::QuantKind;

/// The NEON dispatch table (see [`super::dot_fn`]).
pub(super) fn dot_fn(kind: QuantKind) -> Option<DotFn> {
    match kind {
        QuantKind::Q8_0 => Some(dot_q8_0_q8_0 as DotFn),
        _ => None, // capability table: partial by design
    }
}

/// # Safety
/// NEON present; the [`DotFn`] slice contract.
#[target_feature(enable = "neon")]
unsafe fn dot_q8_0_q8_0(w: &[u8], a: &[u8]) -> f32 {
    let (w, a) = (blocks_of::<BlockQ8_0>(w), blocks_of::<BlockQ8_0>(a));
    let mut acc = vdupq_n_f32(0.0);
    for (x, y) in w.iter().zip(a) {
        let x0 = vld1q_s8(x.qs.as_ptr());
        let x1 = vld1q_s8(x.qs.as_ptr().add(16));
        let y0 = vld1q_s8(y.qs.as_ptr());
        let y1 = vld1q_s8(y.qs.as_ptr().add(16));
        // Widening multiplies: plain NEON, no dotprod extension needed.
        let p0 = vpaddlq_s16(vmull_s8(vget_low_s8(x0), vget_low_s8(y0)));
        let p1 = vpaddlq_s16(vmull_s8(vget_high_s8(x0), vget_high_s8(y0)));
        let p2 = vpaddlq_s16(vmull_s8(vget_low_s8(x1), vget_low_s8(y1)));
        let p3 = vpaddlq_s16(vmull_s8(vget_high_s8(x1), vget_high_s8(y1)));
        let s = vaddq_s32(vaddq_s32(p0, p1), vaddq_s32(p2, p3));
        let d = x.d.to_f32() * y.d.to_f32();
        acc = vmlaq_n_f32(acc, vcvtq_f32_s32(s), d);
    }
    vaddvq_f32(acc)
}
