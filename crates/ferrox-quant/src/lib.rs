//! GGML's quantized block formats, with a scalar reference for every kind.
//!
//! The key decision: **one row per kind** in [`quant_kinds!`] generates
//! [`QuantKind`] and its sizes, and the `#[repr(C)]` block struct of each row
//! is the only statement of the layout (ggml's `ggml-common.h`, byte for
//! byte). Every operation is a trait on the block type —
//! [`Dequantize`], [`Quantize`], [`VecDot`] — so the row-level entry points
//! below are one generic loop instantiated per kind, and a kind without an
//! implementation is a compile error rather than a runtime surprise.
//!
//! The scalar code in [`scalar`] is the *reference twin* of every faster
//! kernel: SIMD, CUDA, Vulkan and Metal kernels are tested against it, and it
//! is tested bit-exactly against ggml and the `gguf` Python package through
//! the committed vectors in `testdata/`.
#![deny(missing_docs)]

pub mod blocks;
pub mod cpu;
mod error;
pub mod gemm;
mod kind;
pub mod knob;
pub mod matvec;
pub mod scalar;

pub use blocks::{Block, BF16, F16, QK_K};
#[allow(clippy::wildcard_imports)]
use blocks::*;
pub use error::QuantError;
pub use kind::QuantKind;

/// Block → f32.
pub trait Dequantize: Block {
    /// Writes this block's [`Block::ELEMS`] values into `out`
    /// (`out.len() == Self::ELEMS`).
    fn dequantize(&self, out: &mut [f32]);
}

/// f32 → block, by ggml's reference (round-to-nearest, no importance matrix).
pub trait Quantize: Block {
    /// Quantizes exactly [`Block::ELEMS`] values (`src.len() == Self::ELEMS`).
    fn quantize(src: &[f32]) -> Self;
}

/// The scalar reference dot product of a weight row with an activation row
/// already converted to [`VecDot::Act`] (ggml's `vec_dot_type`).
pub trait VecDot: Block {
    /// The activation block type.
    type Act: Quantize;
    /// `sum_i w[i] * a[i]` over whole rows: `w.len() * Self::ELEMS ==
    /// a.len() * Self::Act::ELEMS`.
    fn vec_dot(w: &[Self], a: &[Self::Act]) -> f32;
}

/// Block → small integers with one affine map per sub-block: element `e` is
/// `scale[e / SUB] * q[e] + bias[e / SUB]`, computed in exactly the order
/// [`Dequantize`] computes it (so the two agree bit for bit). This is the form
/// the batched integer GEMM ([`gemm`]) packs weights into: `q + OFFSET` as an
/// unsigned byte, the offset folded into the bias.
pub trait Unpack: Block {
    /// Elements per sub-block (one scale and bias each): 16 or 32.
    const SUB: usize;
    /// Added to every `q` so that `q + OFFSET` lies in `0..=255`.
    const OFFSET: i32;
    /// The largest `q + OFFSET` any block of the kind holds (a 4-bit code's
    /// is 15): where it is at most 129, a `u8 x i8` pair sum of AVX2's
    /// `vpmaddubsw` cannot saturate, so its GEMM multiplies the codes as
    /// they are.
    const CODE_MAX: i32;
    /// Writes [`Block::ELEMS`] quants and `ELEMS / SUB` scales and biases.
    fn unpack(&self, q: &mut [i8], scale: &mut [f32], bias: &mut [f32]);
}

/// Checks that `n_elems` is whole blocks of `kind` and returns the byte size.
pub fn row_bytes(kind: QuantKind, n_elems: usize) -> Result<usize, QuantError> {
    let be = kind.block_elems();
    if !n_elems.is_multiple_of(be) {
        return Err(QuantError::NotWholeBlocks { kind, n_elems, block_elems: be });
    }
    Ok(n_elems / be * kind.block_bytes())
}

fn check_len(kind: QuantKind, n_elems: usize, bytes: usize) -> Result<(), QuantError> {
    let expected = row_bytes(kind, n_elems)?;
    if bytes != expected {
        return Err(QuantError::WrongByteLength { kind, n_elems, expected, got: bytes });
    }
    Ok(())
}

/// Reinterprets bytes as blocks in place, or reports misalignment.
pub fn cast_blocks<B: Block>(bytes: &[u8]) -> Result<&[B], QuantError> {
    if !bytes.len().is_multiple_of(core::mem::size_of::<B>()) {
        let n = bytes.len() / core::mem::size_of::<B>() * B::ELEMS;
        return Err(QuantError::WrongByteLength {
            kind: B::KIND,
            n_elems: n,
            expected: n / B::ELEMS * core::mem::size_of::<B>(),
            got: bytes.len(),
        });
    }
    bytemuck::try_cast_slice(bytes).map_err(|_| QuantError::Misaligned {
        kind: B::KIND,
        addr: bytes.as_ptr() as usize,
        align: core::mem::align_of::<B>(),
    })
}

fn dequantize_blocks<B: Dequantize>(bytes: &[u8], out: &mut [f32]) {
    let bs = core::mem::size_of::<B>();
    match bytemuck::try_cast_slice::<u8, B>(bytes) {
        Ok(blocks) => {
            for (b, o) in blocks.iter().zip(out.chunks_exact_mut(B::ELEMS)) {
                b.dequantize(o);
            }
        }
        // Unaligned bytes (a tensor in an odd place of a buffer): read each
        // block by value; correctness over speed for a path no loader takes.
        Err(_) => {
            for (chunk, o) in bytes.chunks_exact(bs).zip(out.chunks_exact_mut(B::ELEMS)) {
                bytemuck::pod_read_unaligned::<B>(chunk).dequantize(o);
            }
        }
    }
}

fn quantize_blocks<B: Quantize>(src: &[f32], out: &mut [u8]) {
    let bs = core::mem::size_of::<B>();
    for (s, o) in src.chunks_exact(B::ELEMS).zip(out.chunks_exact_mut(bs)) {
        o.copy_from_slice(bytemuck::bytes_of(&B::quantize(s)));
    }
}

macro_rules! dequantize_dispatch {
    ($(($v:ident, $name:literal, $id:literal, $elems:literal, $block:ty, $dot:expr)),* $(,)?) => {
        /// Dequantizes `bytes` (whole blocks of `kind`) into `out`, whose
        /// length is the element count.
        pub fn dequantize(kind: QuantKind, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            check_len(kind, out.len(), bytes.len())?;
            match kind {
                $(QuantKind::$v => dequantize_blocks::<$block>(bytes, out),)*
            }
            Ok(())
        }
    };
}
quant_kinds!(dequantize_dispatch);

/// Dequantizes `bytes` into a new vector of `n_elems` values.
pub fn dequantize_to_vec(kind: QuantKind, bytes: &[u8], n_elems: usize) -> Result<Vec<f32>, QuantError> {
    check_len(kind, n_elems, bytes.len())?;
    let mut out = vec![0.0; n_elems];
    dequantize(kind, bytes, &mut out)?;
    Ok(out)
}

/// Whether [`quantize`] can produce `kind`, and if not, why.
///
/// The IQ1/IQ2/IQ3 kinds need an importance matrix or a lattice search that
/// ggml has no plain round-to-nearest reference for (`quantize_row_*_ref` for
/// IQ2_S/IQ3_S/IQ3_XXS needs grid tables initialized with ggml's search
/// state); they get dequantize and dot, and this documented error.
pub fn quantize_support(kind: QuantKind) -> Result<(), QuantError> {
    use QuantKind::*;
    let reason = match kind {
        F32 | F16 | BF16 | F64 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Q2K | Q3K | Q4K
        | Q5K | Q6K | Q8K | IQ4NL | IQ4XS | TQ1_0 | TQ2_0 | MXFP4 | NVFP4 | Q1_0 | Q2_0 => {
            return Ok(())
        }
        IQ1S | IQ1M | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S => {
            "this kind needs an importance matrix and a grid search; ferrox does not implement it yet"
        }
        I8 | I16 | I32 | I64 => "integer kinds are not a quantization target",
    };
    Err(QuantError::CannotQuantize { kind, reason })
}

/// `n_blocks` random but valid blocks of a kind [`quantize`] refuses (the
/// IQ1/IQ2/IQ3 lattice kinds), for kernel tests and benchmarks: every
/// packed field random (any grid index, sign and sub-scale is valid), the
/// f16 super-scale finite, 0.001 to 0.01 in magnitude (a NaN or infinite
/// scale would make a comparison vacuous). `None` for any other kind.
pub fn random_lattice_blocks(kind: QuantKind, n_blocks: usize, seed: u64) -> Option<Vec<u8>> {
    use QuantKind::*;
    if !matches!(kind, IQ1S | IQ1M | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S) {
        return None;
    }
    let mut s = seed;
    let mut next = move || {
        // SplitMix64.
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let bs = kind.block_bytes();
    let mut bytes: Vec<u8> = (0..n_blocks * bs).map(|_| next() as u8).collect();
    for b in bytes.chunks_exact_mut(bs) {
        let r = next();
        let m = 0.001 + 0.009 * (r >> 40) as f32 / (1u64 << 24) as f32;
        let d = crate::F16::from_f32(if r & 1 == 1 { -m } else { m }).to_bits();
        if kind == IQ1M {
            // The scale is the top nibbles of the four scale words
            // (`scales`, bytes 48..56), lowest nibble first.
            for k in 0..4 {
                let hi = &mut b[48 + 2 * k + 1];
                *hi = (*hi & 0x0F) | (((d >> (4 * k)) & 0xF) as u8) << 4;
            }
        } else {
            b[0..2].copy_from_slice(&d.to_le_bytes());
        }
    }
    Some(bytes)
}

/// Quantizes `src` (whole blocks of `kind`) into `out` (exactly the bytes
/// that many blocks take).
pub fn quantize(kind: QuantKind, src: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    use blocks::*;
    quantize_support(kind)?;
    check_len(kind, src.len(), out.len())?;
    // Exhaustive on purpose: a new kind must be placed on one side or the other.
    match kind {
        QuantKind::F32 => quantize_blocks::<f32>(src, out),
        QuantKind::F16 => quantize_blocks::<F16>(src, out),
        QuantKind::BF16 => quantize_blocks::<BF16>(src, out),
        QuantKind::F64 => quantize_blocks::<f64>(src, out),
        QuantKind::Q4_0 => quantize_blocks::<BlockQ4_0>(src, out),
        QuantKind::Q4_1 => quantize_blocks::<BlockQ4_1>(src, out),
        QuantKind::Q5_0 => quantize_blocks::<BlockQ5_0>(src, out),
        QuantKind::Q5_1 => quantize_blocks::<BlockQ5_1>(src, out),
        QuantKind::Q8_0 => quantize_blocks::<BlockQ8_0>(src, out),
        QuantKind::Q8_1 => quantize_blocks::<BlockQ8_1>(src, out),
        QuantKind::Q2K => quantize_blocks::<BlockQ2K>(src, out),
        QuantKind::Q3K => quantize_blocks::<BlockQ3K>(src, out),
        QuantKind::Q4K => quantize_blocks::<BlockQ4K>(src, out),
        QuantKind::Q5K => quantize_blocks::<BlockQ5K>(src, out),
        QuantKind::Q6K => quantize_blocks::<BlockQ6K>(src, out),
        QuantKind::Q8K => quantize_blocks::<BlockQ8K>(src, out),
        QuantKind::IQ4NL => quantize_blocks::<BlockIQ4NL>(src, out),
        QuantKind::IQ4XS => quantize_blocks::<BlockIQ4XS>(src, out),
        QuantKind::TQ1_0 => quantize_blocks::<BlockTQ1_0>(src, out),
        QuantKind::TQ2_0 => quantize_blocks::<BlockTQ2_0>(src, out),
        QuantKind::MXFP4 => quantize_blocks::<BlockMXFP4>(src, out),
        QuantKind::NVFP4 => quantize_blocks::<BlockNVFP4>(src, out),
        QuantKind::Q1_0 => quantize_blocks::<BlockQ1_0>(src, out),
        QuantKind::Q2_0 => quantize_blocks::<BlockQ2_0>(src, out),
        QuantKind::IQ1S | QuantKind::IQ1M | QuantKind::IQ2XXS | QuantKind::IQ2XS
        | QuantKind::IQ2S | QuantKind::IQ3XXS | QuantKind::IQ3S | QuantKind::I8
        | QuantKind::I16 | QuantKind::I32 | QuantKind::I64 => return quantize_support(kind),
    }
    Ok(())
}

/// Quantizes `src` as ggml's `ggml_quantize_chunk` does without an
/// importance matrix — the bytes llama-quantize writes. The same as
/// [`quantize`] (ggml's reference row quantizers) for every kind but IQ4_NL,
/// where ggml's chunk quantizer searches the scale further than its
/// reference one.
pub fn quantize_chunk(kind: QuantKind, src: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    if kind != QuantKind::IQ4NL {
        return quantize(kind, src, out);
    }
    check_len(kind, src.len(), out.len())?;
    let bs = core::mem::size_of::<blocks::BlockIQ4NL>();
    for (s, o) in src.chunks_exact(32).zip(out.chunks_exact_mut(bs)) {
        o.copy_from_slice(bytemuck::bytes_of(&blocks::BlockIQ4NL::quantize_chunk(s)));
    }
    Ok(())
}

/// Quantizes an activation row `src` (whole blocks of `act`, a
/// `vec_dot_kind`) into `out` as ggml's CPU backend does before a dot
/// product (its `from_float`): Q8_0 and Q8_1 as its x86 SIMD quantizers
/// round (`BlockQ8_0::quantize_activation`: `127 / amax`, ties to even),
/// which is not [`quantize`]'s `roundf` (the reference llama-quantize
/// writes weights with); every other kind as [`quantize`]. The scalar
/// reference of [`cpu::quantize_act`].
pub fn quantize_activation(act: QuantKind, src: &[f32], out: &mut [u8]) -> Result<(), QuantError> {
    // Only the two 32-element 8-bit kinds are quantized otherwise as
    // activations (Q8_K's activation quantizer is its reference in ggml too).
    if act == QuantKind::Q8_0 {
        return activation_blocks(act, src, out, blocks::BlockQ8_0::quantize_activation);
    }
    if act == QuantKind::Q8_1 {
        return activation_blocks(act, src, out, blocks::BlockQ8_1::quantize_activation);
    }
    quantize(act, src, out)
}

/// `src` as whole 32-element blocks of `act`, each quantized by `block`.
fn activation_blocks<B: bytemuck::Pod>(act: QuantKind, src: &[f32], out: &mut [u8], block: fn(&[f32]) -> B) -> Result<(), QuantError> {
    check_len(act, src.len(), out.len())?;
    for (s, o) in src.chunks_exact(32).zip(out.chunks_exact_mut(act.block_bytes())) {
        o.copy_from_slice(bytemuck::bytes_of(&block(s)));
    }
    Ok(())
}

/// Quantizes `src` into a new byte vector.
pub fn quantize_to_vec(kind: QuantKind, src: &[f32]) -> Result<Vec<u8>, QuantError> {
    let mut out = vec![0u8; row_bytes(kind, src.len())?];
    quantize(kind, src, &mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exactly the kinds `quantize` refuses get random blocks, and those
    /// dequantize to finite, not all-zero values (IQ1_M's scale is spread
    /// over four nibbles).
    #[test]
    fn random_lattice_blocks_cover_the_kinds_quantize_refuses_and_are_finite() {
        for &k in QuantKind::ALL {
            let blocks = random_lattice_blocks(k, 3, 7);
            let refused = quantize_support(k).is_err() && k.vec_dot_kind().is_some();
            assert_eq!(blocks.is_some(), refused, "{k}");
            if let Some(b) = blocks {
                let v = dequantize_to_vec(k, &b, 3 * k.block_elems()).unwrap();
                assert!(v.iter().all(|x| x.is_finite()), "{k}");
                assert!(v.iter().any(|&x| x != 0.0), "{k}");
            }
        }
    }
}
