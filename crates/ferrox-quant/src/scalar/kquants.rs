//! Scalar reference: kquants. (Skeleton: every body is still `todo!()`.)

use crate::blocks::*;
use crate::{Dequantize, Quantize, VecDot};

impl Dequantize for BlockQ2K {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ2K {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ2K {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockQ3K {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ3K {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ3K {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockQ4K {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ4K {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ4K {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockQ5K {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ5K {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ5K {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockQ6K {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ6K {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ6K {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}

impl Dequantize for BlockQ8K {
    fn dequantize(&self, _out: &mut [f32]) {
        todo!()
    }
}

impl Quantize for BlockQ8K {
    fn quantize(_src: &[f32]) -> Self {
        todo!()
    }
}

impl VecDot for BlockQ8K {
    type Act = BlockQ8K;
    fn vec_dot(_w: &[Self], _a: &[Self::Act]) -> f32 {
        todo!()
    }
}
