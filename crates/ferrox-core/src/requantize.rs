//! Re-quantizing a model file to one kind (`ferrox quantize IN OUT KIND`).
//!
//! The decision of *what* to quantize is llama-quantize's, stated once here
//! as data ([`plan_tensor`]): matrices whose name ends in `weight` are
//! converted, except tensors llama.cpp deliberately keeps in full precision
//! (norms, MoE routers, position embeddings, convolution kernels…); 1-D
//! float tensors become F32 (lossless); integer tensors are copied. A matrix
//! whose row length is not a whole number of the target's blocks falls back
//! exactly as llama-quantize's `tensor_type_fallback` does.

use std::borrow::Cow;

use ferrox_gguf::{GgufError, GgufModel, GgufWriter, Value};
use ferrox_quant::{QuantError, QuantKind};

/// Name fragments llama-quantize never quantizes (from `llama-quant.cpp`,
/// `tensor_allows_quantization`).
const KEEP_FULL_PRECISION: &[&str] = &[
    "_norm.weight",
    "ffn_gate_inp.weight",
    "ffn_gate_tid2eid.weight",
    "altup",
    "laurel",
    "per_layer_model_proj",
    "position_embd",
    "token_types",
    "ssm_conv1d",
    "shortconv.conv.weight",
    "time_mix_first.weight",
    "time_mix_w0.weight",
    "time_mix_w1.weight",
    "time_mix_w2.weight",
    "time_mix_v0.weight",
    "time_mix_v1.weight",
    "time_mix_v2.weight",
    "time_mix_a0.weight",
    "time_mix_a1.weight",
    "time_mix_a2.weight",
    "time_mix_g1.weight",
    "time_mix_g2.weight",
    "time_mix_decay_w1.weight",
    "time_mix_decay_w2.weight",
    "time_mix_lerp_fused.weight",
    "attn_rel_b.weight",
    "sam.pos_embd",
    "sam.neck.",
    "sam.net_",
    ".rel_pos",
    ".patch_embd",
    ".patch_merger",
    "a.rvq.codebook",
    "mm.a.code_embd",
];

/// What happens to one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorPlan {
    /// Bytes copied unchanged.
    Copy,
    /// Converted to this kind (through f32).
    Convert(QuantKind),
    /// Converted to a fallback kind because the row length is not a whole
    /// number of the target's blocks.
    Fallback {
        /// What was asked for.
        wanted: QuantKind,
        /// What the tensor gets.
        got: QuantKind,
    },
}

impl TensorPlan {
    /// The kind the tensor has in the output, given its input kind.
    pub fn output_kind(self, input: QuantKind) -> QuantKind {
        match self {
            TensorPlan::Copy => input,
            TensorPlan::Convert(k) => k,
            TensorPlan::Fallback { got, .. } => got,
        }
    }
}

fn is_float(kind: QuantKind) -> bool {
    matches!(kind, QuantKind::F32 | QuantKind::F16 | QuantKind::BF16 | QuantKind::F64)
}

fn is_integer(kind: QuantKind) -> bool {
    matches!(kind, QuantKind::I8 | QuantKind::I16 | QuantKind::I32 | QuantKind::I64)
}

/// llama-quantize's `tensor_type_fallback`: the kind a matrix with rows of
/// `ncols` gets when `target`'s blocks do not divide it.
pub fn fallback_kind(target: QuantKind, ncols: u64) -> QuantKind {
    use QuantKind::*;
    let fits = |k: QuantKind| ncols.is_multiple_of(k.block_elems() as u64);
    if fits(target) {
        return target;
    }
    let demoted = match target {
        IQ1S | IQ1M | IQ2XXS | IQ2XS | IQ2S | IQ3XXS | IQ3S | IQ4XS => IQ4NL,
        Q2_0 | Q2K | Q3K | TQ1_0 | TQ2_0 => Q4_0,
        Q4K => Q5_0,
        Q5K => Q5_1,
        Q6K => Q8_0,
        // Kinds with blocks of 32 or fewer have nothing smaller to demote to,
        // and the rest (Q8_K, NVFP4, Q1_0) land on F16 like llama-quantize's
        // final check; F16 always fits.
        F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0
        | Q8_1 | Q8K | IQ4NL | MXFP4 | NVFP4 | Q1_0 => F16,
    };
    if fits(demoted) {
        demoted
    } else {
        F16
    }
}

/// Decides what happens to the tensor `name` of kind `input` with shape
/// `dims` (ggml order: `dims[0]` is the row length) when a model is
/// re-quantized to `target`.
pub fn plan_tensor(name: &str, input: QuantKind, dims: &[u64], target: QuantKind) -> TensorPlan {
    if is_integer(input) {
        return TensorPlan::Copy;
    }
    let n_dims = dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    let is_matrix = n_dims >= 2
        && name.ends_with("weight")
        && !KEEP_FULL_PRECISION.iter().any(|frag| name.contains(frag));
    if !is_matrix {
        return if is_float(input) && input != QuantKind::F32 {
            TensorPlan::Convert(QuantKind::F32)
        } else {
            TensorPlan::Copy
        };
    }
    let ncols = dims.first().copied().unwrap_or(0);
    let got = fallback_kind(target, ncols);
    match (got == target, got == input) {
        (true, true) => TensorPlan::Copy,
        (true, false) => TensorPlan::Convert(target),
        (false, _) => TensorPlan::Fallback { wanted: target, got },
    }
}

/// Why a model could not be re-quantized.
#[derive(Debug, thiserror::Error)]
pub enum RequantizeError {
    /// Reading the input or assembling the output failed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// The target kind cannot be produced, or a tensor could not be converted.
    #[error("tensor {tensor}: {source}")]
    Quant {
        /// The tensor being converted (empty for a refused target).
        tensor: String,
        /// What the block-format layer said.
        source: QuantError,
    },
}

/// One step of progress, reported after each tensor.
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    /// 1-based index of the tensor just done.
    pub index: usize,
    /// Number of tensors.
    pub count: usize,
    /// Its name.
    pub name: &'a str,
    /// Its kind in the input.
    pub from: QuantKind,
    /// What was done to it.
    pub plan: TensorPlan,
    /// Its shape.
    pub dims: &'a [u64],
}

/// Converts `src` (whole rows of `from`, each `ncols` long) to `to`, splitting
/// rows over `threads` scoped threads.
fn convert(src: &[u8], from: QuantKind, to: QuantKind, ncols: usize, threads: usize) -> Result<Vec<u8>, QuantError> {
    let in_row = ferrox_quant::row_bytes(from, ncols)?;
    let out_row = ferrox_quant::row_bytes(to, ncols)?;
    let rows = if in_row == 0 { 0 } else { src.len() / in_row };
    let mut out = vec![0u8; rows * out_row];
    let per = rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let jobs: Vec<_> = src
            .chunks(per * in_row.max(1))
            .zip(out.chunks_mut(per * out_row.max(1)))
            .map(|(i, o)| {
                s.spawn(move || -> Result<(), QuantError> {
                    let mut row = vec![0f32; ncols];
                    for (ir, or) in i.chunks_exact(in_row).zip(o.chunks_exact_mut(out_row)) {
                        ferrox_quant::dequantize(from, ir, &mut row)?;
                        ferrox_quant::quantize(to, &row, or)?;
                    }
                    Ok(())
                })
            })
            .collect();
        jobs.into_iter().try_for_each(|j| j.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })?;
    Ok(out)
}

/// Re-quantizes every matrix of `model` to `target` (see [`plan_tensor`]),
/// returning a writer for the single-file output. Metadata is kept except
/// the split keys; `general.file_type` and `general.quantization_version`
/// describe the result. Tensors that keep their kind are borrowed, not
/// copied.
pub fn requantize<'m>(
    model: &'m GgufModel,
    target: QuantKind,
    threads: usize,
    mut on_progress: impl FnMut(Progress<'_>),
) -> Result<GgufWriter<'m>, RequantizeError> {
    ferrox_quant::quantize_support(target)
        .map_err(|source| RequantizeError::Quant { tensor: String::new(), source })?;
    let mut w = GgufWriter::new();
    let meta = model.metadata_file();
    w.set_version(meta.version())?;
    let mut saw_file_type = false;
    for (k, v) in meta.metadata() {
        if k.starts_with("split.") || k == "general.quantization_version" {
            continue;
        }
        if k == "general.file_type" {
            saw_file_type = true;
            match crate::ftype::of_kind(target) {
                Some(ft) => w.set(k.clone(), Value::U32(ft))?,
                None => w.set(k.clone(), v.clone())?,
            }
            continue;
        }
        w.set(k.clone(), v.clone())?;
    }
    if !saw_file_type {
        if let Some(ft) = crate::ftype::of_kind(target) {
            w.set("general.file_type", Value::U32(ft))?;
        }
    }
    w.set("general.quantization_version", Value::U32(2))?;

    let count = model.tensors().len();
    for (i, t) in model.tensors().iter().enumerate() {
        let info = &t.info;
        let data = model.tensor_data(t)?;
        let plan = plan_tensor(&info.name, info.kind, &info.dims, target);
        let out_kind = plan.output_kind(info.kind);
        let bytes: Cow<'m, [u8]> = if out_kind == info.kind {
            Cow::Borrowed(data)
        } else {
            let ncols = info.dims.first().copied().unwrap_or(1) as usize;
            let q = convert(data, info.kind, out_kind, ncols, threads)
                .map_err(|source| RequantizeError::Quant { tensor: info.name.clone(), source })?;
            Cow::Owned(q)
        };
        w.add_tensor(info.name.clone(), out_kind, &info.dims, bytes)?;
        on_progress(Progress { index: i + 1, count, name: &info.name, from: info.kind, plan, dims: &info.dims });
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;
    use QuantKind::*;

    #[test]
    fn norms_and_vectors_stay_full_precision() {
        assert_eq!(plan_tensor("blk.0.attn_norm.weight", F32, &[640], Q8_0), TensorPlan::Copy);
        assert_eq!(plan_tensor("blk.0.attn_q_norm.weight", F32, &[256, 1], Q4K), TensorPlan::Copy);
        assert_eq!(plan_tensor("blk.0.ffn_norm.weight", F16, &[640], Q4K), TensorPlan::Convert(F32));
        assert_eq!(plan_tensor("blk.0.attn_q.bias", F32, &[640], Q4K), TensorPlan::Copy);
        assert_eq!(plan_tensor("blk.0.ffn_gate_inp.weight", F32, &[640, 8], Q4K), TensorPlan::Copy);
        assert_eq!(plan_tensor("rope_freqs", I32, &[64], Q4K), TensorPlan::Copy);
    }

    #[test]
    fn matrices_convert_and_fall_back_like_llama_quantize() {
        assert_eq!(plan_tensor("blk.0.attn_q.weight", Q5_0, &[640, 1024], Q8_0), TensorPlan::Convert(Q8_0));
        assert_eq!(plan_tensor("token_embd.weight", Q8_0, &[640, 262144], Q8_0), TensorPlan::Copy);
        // 640 is not a multiple of 256: Q4_K falls back to Q5_0, Q6_K to Q8_0.
        assert_eq!(
            plan_tensor("blk.0.ffn_up.weight", F16, &[640, 2048], Q4K),
            TensorPlan::Fallback { wanted: Q4K, got: Q5_0 }
        );
        assert_eq!(fallback_kind(Q6K, 640), Q8_0);
        assert_eq!(fallback_kind(IQ4XS, 640), IQ4NL);
        assert_eq!(fallback_kind(Q4K, 2048), Q4K);
        // Not even 32 divides 100: F16, as llama-quantize's last resort.
        assert_eq!(fallback_kind(Q4K, 100), F16);
        assert_eq!(fallback_kind(Q8_0, 100), F16);
    }
}
