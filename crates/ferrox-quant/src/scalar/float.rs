//! Scalar reference: float. (Skeleton: every body is still `todo!()`.)

use crate::blocks::*;
use crate::{Dequantize, Quantize, VecDot};

impl Dequantize for f32 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for f32 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for f32 {
    type Act = f32;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for F16 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for F16 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for F16 {
    type Act = F16;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BF16 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BF16 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BF16 {
    type Act = BF16;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for f64 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for f64 {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl Dequantize for i8 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Dequantize for i16 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Dequantize for i32 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Dequantize for i64 {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}
