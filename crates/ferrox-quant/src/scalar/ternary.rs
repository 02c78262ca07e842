//! Scalar reference: ternary. (Skeleton: every body is still `todo!()`.)

use crate::blocks::*;
use crate::{Dequantize, Quantize, VecDot};

impl Dequantize for BlockTQ1_0 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockTQ1_0 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockTQ1_0 {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockTQ2_0 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockTQ2_0 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockTQ2_0 {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
