//! Tiny random-weight models for tests of everything above the container.
//!
//! Deterministic from a seed (a SplitMix64 stream, not `rand`, so the bytes
//! never change with a dependency bump). Float kinds are written directly;
//! quantized kinds go through `ferrox_quant::quantize` when asked to and
//! when the kind supports it, and are otherwise random bytes — the container
//! does not care, but a caller that dequantizes random bytes may meet
//! non-finite scales.

use ferrox_quant::QuantKind;

use crate::error::{ErrorKind, GgufError};
use crate::value::Value;
use crate::writer::GgufWriter;

/// One tensor of a tiny model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TinyTensor {
    /// The tensor's name.
    pub name: String,
    /// Its kind.
    pub kind: QuantKind,
    /// Dimensions in ggml order (ne0 first).
    pub dims: Vec<u64>,
}

impl TinyTensor {
    /// Shorthand constructor.
    pub fn new(name: impl Into<String>, kind: QuantKind, dims: &[u64]) -> Self {
        TinyTensor { name: name.into(), kind, dims: dims.to_vec() }
    }
}

/// How quantized kinds get their bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Random values in [-1, 1) quantized with `ferrox_quant::quantize`
    /// (random bytes for kinds it cannot produce).
    Quantize,
    /// Random bytes for every quantized kind (no dependence on the
    /// quantizers; fine for container-level tests).
    RawBytes,
}

/// A deterministic pseudo-random stream (SplitMix64).
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value uniform in [-1, 1).
    pub fn next_f32(&mut self) -> f32 {
        // 24 random bits: exactly representable, so no rounding bias.
        ((self.next_u64() >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }

    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.next_u64() >> 56) as u8).collect()
    }
}

/// A writer holding `metadata` and `tensors` with random contents from
/// `seed`. Call `to_bytes` / `write_to` on the result.
pub fn tiny_model(
    seed: u64,
    metadata: Vec<(String, Value)>,
    tensors: &[TinyTensor],
    fill: Fill,
) -> Result<GgufWriter<'static>, GgufError> {
    let mut w = GgufWriter::new();
    for (k, v) in metadata {
        w.set(k, v)?;
    }
    let mut rng = SplitMix64(seed);
    for t in tensors {
        let n = t.dims.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
        let Some(n) = n.and_then(|n| usize::try_from(n).ok()) else {
            return Err(GgufError::bare(ErrorKind::ShapeOverflow { tensor: t.name.clone(), dims: t.dims.clone() }));
        };
        let data = random_data(t, n, &mut rng, fill)?;
        w.add_tensor(t.name.clone(), t.kind, &t.dims, data)?;
    }
    Ok(w)
}

fn random_data(t: &TinyTensor, n: usize, rng: &mut SplitMix64, fill: Fill) -> Result<Vec<u8>, GgufError> {
    use QuantKind::*;
    let floats = |rng: &mut SplitMix64| (0..n).map(|_| rng.next_f32()).collect::<Vec<f32>>();
    let raw = |rng: &mut SplitMix64| -> Result<Vec<u8>, GgufError> {
        let bytes = ferrox_quant::row_bytes(t.kind, n).map_err(|e| quant_error(t, e))?;
        Ok(rng.bytes(bytes))
    };
    Ok(match t.kind {
        F32 => floats(rng).iter().flat_map(|x| x.to_le_bytes()).collect(),
        F16 => floats(rng).iter().flat_map(|&x| ferrox_quant::F16::from_f32(x).to_le_bytes()).collect(),
        BF16 => floats(rng).iter().flat_map(|&x| ferrox_quant::BF16::from_f32(x).to_le_bytes()).collect(),
        F64 => floats(rng).iter().flat_map(|&x| f64::from(x).to_le_bytes()).collect(),
        I8 | I16 | I32 | I64 => raw(rng)?,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | Q2K | Q3K | Q4K | Q5K | Q6K | Q8K | IQ2XXS
        | IQ2XS | IQ3XXS | IQ1S | IQ4NL | IQ3S | IQ2S | IQ4XS | IQ1M | TQ1_0 | TQ2_0 | MXFP4
        | NVFP4 | Q1_0 | Q2_0 => {
            if fill == Fill::Quantize && ferrox_quant::quantize_support(t.kind).is_ok() {
                let src = floats(rng);
                ferrox_quant::quantize_to_vec(t.kind, &src).map_err(|e| quant_error(t, e))?
            } else {
                raw(rng)?
            }
        }
    })
}

fn quant_error(t: &TinyTensor, e: ferrox_quant::QuantError) -> GgufError {
    GgufError::bare(ErrorKind::Quant { tensor: t.name.clone(), source: e })
}
