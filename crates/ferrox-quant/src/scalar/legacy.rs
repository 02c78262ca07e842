//! Scalar reference: legacy. (Skeleton: every body is still `todo!()`.)

use crate::blocks::*;
use crate::{Dequantize, Quantize, VecDot};

impl Dequantize for BlockQ4_0 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ4_0 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ4_0 {
    type Act = BlockQ8_0;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockQ4_1 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ4_1 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ4_1 {
    type Act = BlockQ8_1;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockQ5_0 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ5_0 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ5_0 {
    type Act = BlockQ8_0;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockQ5_1 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ5_1 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ5_1 {
    type Act = BlockQ8_1;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockQ8_0 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ8_0 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ8_0 {
    type Act = BlockQ8_0;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockQ8_1 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ8_1 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ8_1 {
    type Act = BlockQ8_1;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockQ1_0 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ1_0 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ1_0 {
    type Act = BlockQ8_0;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockQ2_0 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ2_0 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ2_0 {
    type Act = BlockQ8_0;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
