//! The `#[repr(C)]` block layouts, byte-identical to ggml's `ggml-common.h`.
//!
//! Each struct's `size_of` is the kind's block size, asserted at compile time
//! against the number ggml states, and [`crate::QuantKind::block_bytes`] is
//! computed from `size_of` — so the table and the layout cannot drift apart.
//! Scales are stored as [`F16`]/[`BF16`] bit patterns (little-endian in the
//! file, as on every platform we target); blocks are `Pod`, so a row of bytes
//! is reinterpreted in place, never copied.

use bytemuck::{Pod, Zeroable};

/// IEEE half, as ggml's `ggml_half`.
pub type F16 = half::f16;
/// bfloat16, as ggml's `ggml_bf16_t`.
pub type BF16 = half::bf16;

/// Elements per K-quant super-block (ggml's `QK_K`).
pub const QK_K: usize = 256;

/// A block layout: plain old data with a fixed element count.
pub trait Block: Pod {
    /// The kind this is the block of.
    const KIND: crate::QuantKind;
    /// Elements per block.
    const ELEMS: usize;
}

macro_rules! prim_block {
    ($($t:ty => $k:ident),*) => {$(
        impl Block for $t {
            const KIND: crate::QuantKind = crate::QuantKind::$k;
            const ELEMS: usize = 1;
        }
    )*};
}
prim_block!(f32 => F32, F16 => F16, BF16 => BF16, f64 => F64, i8 => I8, i16 => I16, i32 => I32, i64 => I64);

/// 4-bit, scale only: `x = d * (q - 8)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_0 {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub qs: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<BlockQ4_0>() == 18);
impl Block for BlockQ4_0 {
    const KIND: crate::QuantKind = crate::QuantKind::Q4_0;
    const ELEMS: usize = 32;
}

/// 4-bit with min: `x = d * q + m`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4_1 {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub m: F16,
    #[allow(missing_docs)]
    pub qs: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<BlockQ4_1>() == 20);
impl Block for BlockQ4_1 {
    const KIND: crate::QuantKind = crate::QuantKind::Q4_1;
    const ELEMS: usize = 32;
}

/// 5-bit, scale only; `qh` holds the fifth bits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_0 {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub qh: [u8; 4],
    #[allow(missing_docs)]
    pub qs: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<BlockQ5_0>() == 22);
impl Block for BlockQ5_0 {
    const KIND: crate::QuantKind = crate::QuantKind::Q5_0;
    const ELEMS: usize = 32;
}

/// 5-bit with min.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5_1 {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub m: F16,
    #[allow(missing_docs)]
    pub qh: [u8; 4],
    #[allow(missing_docs)]
    pub qs: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<BlockQ5_1>() == 24);
impl Block for BlockQ5_1 {
    const KIND: crate::QuantKind = crate::QuantKind::Q5_1;
    const ELEMS: usize = 32;
}

/// 8-bit, scale only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_0 {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub qs: [i8; 32],
}
const _: () = assert!(core::mem::size_of::<BlockQ8_0>() == 34);
impl Block for BlockQ8_0 {
    const KIND: crate::QuantKind = crate::QuantKind::Q8_0;
    const ELEMS: usize = 32;
}

/// 8-bit with `s = d * sum(qs)` (an activation format).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8_1 {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub s: F16,
    #[allow(missing_docs)]
    pub qs: [i8; 32],
}
const _: () = assert!(core::mem::size_of::<BlockQ8_1>() == 36);
impl Block for BlockQ8_1 {
    const KIND: crate::QuantKind = crate::QuantKind::Q8_1;
    const ELEMS: usize = 32;
}

/// 2-bit super-block: 16 sub-blocks with 4-bit scales and mins.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2K {
    #[allow(missing_docs)]
    pub scales: [u8; 16],
    #[allow(missing_docs)]
    pub qs: [u8; 64],
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub dmin: F16,
}
const _: () = assert!(core::mem::size_of::<BlockQ2K>() == 84);
impl Block for BlockQ2K {
    const KIND: crate::QuantKind = crate::QuantKind::Q2K;
    const ELEMS: usize = 256;
}

/// 3-bit super-block: 16 sub-blocks with 6-bit scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ3K {
    #[allow(missing_docs)]
    pub hmask: [u8; 32],
    #[allow(missing_docs)]
    pub qs: [u8; 64],
    #[allow(missing_docs)]
    pub scales: [u8; 12],
    #[allow(missing_docs)]
    pub d: F16,
}
const _: () = assert!(core::mem::size_of::<BlockQ3K>() == 110);
impl Block for BlockQ3K {
    const KIND: crate::QuantKind = crate::QuantKind::Q3K;
    const ELEMS: usize = 256;
}

/// 4-bit super-block: 8 sub-blocks with 6-bit scales and mins.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ4K {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub dmin: F16,
    #[allow(missing_docs)]
    pub scales: [u8; 12],
    #[allow(missing_docs)]
    pub qs: [u8; 128],
}
const _: () = assert!(core::mem::size_of::<BlockQ4K>() == 144);
impl Block for BlockQ4K {
    const KIND: crate::QuantKind = crate::QuantKind::Q4K;
    const ELEMS: usize = 256;
}

/// 5-bit super-block: 8 sub-blocks with 6-bit scales and mins.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ5K {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub dmin: F16,
    #[allow(missing_docs)]
    pub scales: [u8; 12],
    #[allow(missing_docs)]
    pub qh: [u8; 32],
    #[allow(missing_docs)]
    pub qs: [u8; 128],
}
const _: () = assert!(core::mem::size_of::<BlockQ5K>() == 176);
impl Block for BlockQ5K {
    const KIND: crate::QuantKind = crate::QuantKind::Q5K;
    const ELEMS: usize = 256;
}

/// 6-bit super-block: 16 sub-blocks with 8-bit scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ6K {
    #[allow(missing_docs)]
    pub ql: [u8; 128],
    #[allow(missing_docs)]
    pub qh: [u8; 64],
    #[allow(missing_docs)]
    pub scales: [i8; 16],
    #[allow(missing_docs)]
    pub d: F16,
}
const _: () = assert!(core::mem::size_of::<BlockQ6K>() == 210);
impl Block for BlockQ6K {
    const KIND: crate::QuantKind = crate::QuantKind::Q6K;
    const ELEMS: usize = 256;
}

/// 8-bit super-block with per-16 sums (the K-quant activation format).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ8K {
    #[allow(missing_docs)]
    pub d: f32,
    #[allow(missing_docs)]
    pub qs: [i8; 256],
    #[allow(missing_docs)]
    pub bsums: [i16; 16],
}
const _: () = assert!(core::mem::size_of::<BlockQ8K>() == 292);
impl Block for BlockQ8K {
    const KIND: crate::QuantKind = crate::QuantKind::Q8K;
    const ELEMS: usize = 256;
}

/// 2.06 bpw, E8 lattice grid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ2XXS {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub qs: [u16; 32],
}
const _: () = assert!(core::mem::size_of::<BlockIQ2XXS>() == 66);
impl Block for BlockIQ2XXS {
    const KIND: crate::QuantKind = crate::QuantKind::IQ2XXS;
    const ELEMS: usize = 256;
}

/// 2.31 bpw.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ2XS {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub qs: [u16; 32],
    #[allow(missing_docs)]
    pub scales: [u8; 8],
}
const _: () = assert!(core::mem::size_of::<BlockIQ2XS>() == 74);
impl Block for BlockIQ2XS {
    const KIND: crate::QuantKind = crate::QuantKind::IQ2XS;
    const ELEMS: usize = 256;
}

/// 2.5 bpw.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ2S {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub qs: [u8; 64],
    #[allow(missing_docs)]
    pub qh: [u8; 8],
    #[allow(missing_docs)]
    pub scales: [u8; 8],
}
const _: () = assert!(core::mem::size_of::<BlockIQ2S>() == 82);
impl Block for BlockIQ2S {
    const KIND: crate::QuantKind = crate::QuantKind::IQ2S;
    const ELEMS: usize = 256;
}

/// 3.06 bpw.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ3XXS {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub qs: [u8; 96],
}
const _: () = assert!(core::mem::size_of::<BlockIQ3XXS>() == 98);
impl Block for BlockIQ3XXS {
    const KIND: crate::QuantKind = crate::QuantKind::IQ3XXS;
    const ELEMS: usize = 256;
}

/// 3.44 bpw.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ3S {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub qs: [u8; 64],
    #[allow(missing_docs)]
    pub qh: [u8; 8],
    #[allow(missing_docs)]
    pub signs: [u8; 32],
    #[allow(missing_docs)]
    pub scales: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<BlockIQ3S>() == 110);
impl Block for BlockIQ3S {
    const KIND: crate::QuantKind = crate::QuantKind::IQ3S;
    const ELEMS: usize = 256;
}

/// 1.56 bpw.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ1S {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub qs: [u8; 32],
    #[allow(missing_docs)]
    pub qh: [u16; 8],
}
const _: () = assert!(core::mem::size_of::<BlockIQ1S>() == 50);
impl Block for BlockIQ1S {
    const KIND: crate::QuantKind = crate::QuantKind::IQ1S;
    const ELEMS: usize = 256;
}

/// 1.75 bpw; the f16 super-scale is spread over the top nibbles of `scales`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ1M {
    #[allow(missing_docs)]
    pub qs: [u8; 32],
    #[allow(missing_docs)]
    pub qh: [u8; 16],
    #[allow(missing_docs)]
    pub scales: [u8; 8],
}
const _: () = assert!(core::mem::size_of::<BlockIQ1M>() == 56);
impl Block for BlockIQ1M {
    const KIND: crate::QuantKind = crate::QuantKind::IQ1M;
    const ELEMS: usize = 256;
}

/// 4-bit non-linear (a fixed 16-entry codebook).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ4NL {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub qs: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<BlockIQ4NL>() == 18);
impl Block for BlockIQ4NL {
    const KIND: crate::QuantKind = crate::QuantKind::IQ4NL;
    const ELEMS: usize = 32;
}

/// 4-bit non-linear super-block with 6-bit sub-block scales.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockIQ4XS {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub scales_h: u16,
    #[allow(missing_docs)]
    pub scales_l: [u8; 4],
    #[allow(missing_docs)]
    pub qs: [u8; 128],
}
const _: () = assert!(core::mem::size_of::<BlockIQ4XS>() == 136);
impl Block for BlockIQ4XS {
    const KIND: crate::QuantKind = crate::QuantKind::IQ4XS;
    const ELEMS: usize = 256;
}

/// Ternary, 1.69 bpw (base-3 packing).
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockTQ1_0 {
    #[allow(missing_docs)]
    pub qs: [u8; 48],
    #[allow(missing_docs)]
    pub qh: [u8; 4],
    #[allow(missing_docs)]
    pub d: F16,
}
const _: () = assert!(core::mem::size_of::<BlockTQ1_0>() == 54);
impl Block for BlockTQ1_0 {
    const KIND: crate::QuantKind = crate::QuantKind::TQ1_0;
    const ELEMS: usize = 256;
}

/// Ternary, 2 bits per element.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockTQ2_0 {
    #[allow(missing_docs)]
    pub qs: [u8; 64],
    #[allow(missing_docs)]
    pub d: F16,
}
const _: () = assert!(core::mem::size_of::<BlockTQ2_0>() == 66);
impl Block for BlockTQ2_0 {
    const KIND: crate::QuantKind = crate::QuantKind::TQ2_0;
    const ELEMS: usize = 256;
}

/// OCP MX FP4: E2M1 values with a shared E8M0 exponent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockMXFP4 {
    #[allow(missing_docs)]
    pub e: u8,
    #[allow(missing_docs)]
    pub qs: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<BlockMXFP4>() == 17);
impl Block for BlockMXFP4 {
    const KIND: crate::QuantKind = crate::QuantKind::MXFP4;
    const ELEMS: usize = 32;
}

/// NVIDIA FP4: E2M1 values, one UE4M3 scale per 16 elements.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockNVFP4 {
    #[allow(missing_docs)]
    pub d: [u8; 4],
    #[allow(missing_docs)]
    pub qs: [u8; 32],
}
const _: () = assert!(core::mem::size_of::<BlockNVFP4>() == 36);
impl Block for BlockNVFP4 {
    const KIND: crate::QuantKind = crate::QuantKind::NVFP4;
    const ELEMS: usize = 64;
}

/// 1-bit, scale only: `x = d * (2b - 1)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ1_0 {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub qs: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<BlockQ1_0>() == 18);
impl Block for BlockQ1_0 {
    const KIND: crate::QuantKind = crate::QuantKind::Q1_0;
    const ELEMS: usize = 128;
}

/// 2-bit, scale only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct BlockQ2_0 {
    #[allow(missing_docs)]
    pub d: F16,
    #[allow(missing_docs)]
    pub qs: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<BlockQ2_0>() == 18);
impl Block for BlockQ2_0 {
    const KIND: crate::QuantKind = crate::QuantKind::Q2_0;
    const ELEMS: usize = 64;
}
