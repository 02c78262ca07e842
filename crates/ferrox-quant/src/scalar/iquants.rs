//! Scalar reference: iquants. (Skeleton: every body is still `todo!()`.)

use crate::blocks::*;
use crate::{Dequantize, Quantize, VecDot};

impl Dequantize for BlockIQ1S {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockIQ1S {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockIQ1M {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockIQ1M {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockIQ2XXS {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockIQ2XXS {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockIQ2XS {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockIQ2XS {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockIQ2S {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockIQ2S {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockIQ3XXS {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockIQ3XXS {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockIQ3S {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl VecDot for BlockIQ3S {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockIQ4NL {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockIQ4NL {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockIQ4NL {
    type Act = BlockQ8_0;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockIQ4XS {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockIQ4XS {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockIQ4XS {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
