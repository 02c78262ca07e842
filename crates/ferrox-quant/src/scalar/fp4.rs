//! Scalar reference: fp4. (Skeleton: every body is still `todo!()`.)

use crate::blocks::*;
use crate::{Dequantize, Quantize, VecDot};

impl Dequantize for BlockMXFP4 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockMXFP4 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockMXFP4 {
    type Act = BlockQ8_0;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockNVFP4 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockNVFP4 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockNVFP4 {
    type Act = BlockQ8_0;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
