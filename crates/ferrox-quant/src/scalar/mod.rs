//! The scalar reference implementation of every kind: the twin every faster
//! kernel is tested against. Written for clarity and bit-exactness with
//! ggml's reference C, never for speed.
//!
//! One file per family; each implements [`crate::Dequantize`],
//! [`crate::Quantize`] (where ggml has a reference quantizer) and
//! [`crate::VecDot`] for its block types.

mod float;
mod fp4;
pub mod iq_grids;
mod iquants;
mod kquant_util;
mod kquants;
mod legacy;
mod ternary;

/// The exact unpacking steps (scales, code tables) that SIMD kernels share
/// with the twins, so a kernel's float epilogue can follow the twin's.
#[allow(unused_imports)] // the K-quant ones are used by the aarch64 kernels only
pub(crate) use {
    fp4::{e8m0_half, E2M1_X2},
    kquants::{k4_scales_mins, mins_dot, q3_scales},
};

use crate::blocks::*;
use crate::{cast_blocks, QuantError, QuantKind, VecDot};

fn dot_blocks<B: VecDot>(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    let w = cast_blocks::<B>(w)?;
    let a = cast_blocks::<B::Act>(a)?;
    let n = w.len() * B::ELEMS;
    if a.len() * <B::Act as Block>::ELEMS != n {
        return Err(QuantError::WrongByteLength {
            kind: <B::Act as Block>::KIND,
            n_elems: n,
            expected: n / <B::Act as Block>::ELEMS * core::mem::size_of::<B::Act>(),
            got: core::mem::size_of_val(a),
        });
    }
    Ok(B::vec_dot(w, a))
}

/// Expands `$mac!(kind => BlockType)` for every kind that has a dot product.
/// Partial by design (integers and F64 are not weight formats); the test
/// `the_dot_table_matches_vec_dot_kind` ties it to [`QuantKind::vec_dot_kind`].
macro_rules! with_dot_kinds {
    ($mac:ident) => {
        $mac! {
            F32 => f32, F16 => F16, BF16 => BF16,
            Q4_0 => BlockQ4_0, Q4_1 => BlockQ4_1, Q5_0 => BlockQ5_0, Q5_1 => BlockQ5_1,
            Q8_0 => BlockQ8_0, Q8_1 => BlockQ8_1, Q1_0 => BlockQ1_0, Q2_0 => BlockQ2_0,
            Q2K => BlockQ2K, Q3K => BlockQ3K, Q4K => BlockQ4K, Q5K => BlockQ5K,
            Q6K => BlockQ6K, Q8K => BlockQ8K,
            IQ1S => BlockIQ1S, IQ1M => BlockIQ1M, IQ2XXS => BlockIQ2XXS, IQ2XS => BlockIQ2XS,
            IQ2S => BlockIQ2S, IQ3XXS => BlockIQ3XXS, IQ3S => BlockIQ3S,
            IQ4NL => BlockIQ4NL, IQ4XS => BlockIQ4XS,
            TQ1_0 => BlockTQ1_0, TQ2_0 => BlockTQ2_0, MXFP4 => BlockMXFP4, NVFP4 => BlockNVFP4,
        }
    };
}
#[allow(unused_imports)]
pub(crate) use with_dot_kinds;

macro_rules! dot_dispatch {
    ($($k:ident => $b:ty),* $(,)?) => {
        /// The scalar reference dot product of one weight row (`w`, whole
        /// blocks of `kind`) with one activation row already converted to
        /// `kind.vec_dot_kind()`.
        pub fn vec_dot(kind: QuantKind, w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            match kind {
                $(QuantKind::$k => dot_blocks::<$b>(w, a),)*
                #[allow(unreachable_patterns)] // capability table: partial by design
                _ => Err(QuantError::NoDot { kind }),
            }
        }

        /// The activation kind the scalar dot of `kind` takes, read off the
        /// block types' [`VecDot::Act`]; `None` where there is no dot.
        pub fn dot_act_kind(kind: QuantKind) -> Option<QuantKind> {
            match kind {
                $(QuantKind::$k => Some(<<$b as VecDot>::Act as Block>::KIND),)*
                #[allow(unreachable_patterns)] // capability table: partial by design
                _ => None,
            }
        }
    };
}
with_dot_kinds!(dot_dispatch);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dot_table_matches_vec_dot_kind() {
        for &k in QuantKind::ALL {
            assert_eq!(dot_act_kind(k), k.vec_dot_kind(), "{k}");
        }
    }
}
