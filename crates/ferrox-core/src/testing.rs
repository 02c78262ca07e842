//! Tiny random-weight models of every architecture, written with ferrox's
//! own GGUF writer, for tests that compare the decoder with llama.cpp.
//!
//! The decision: the models are *regenerated* from a seed, never
//! committed. The writer, the quantizers and the PRNG are deterministic, so
//! the same seed gives the same bytes; the reference logits llama.cpp
//! produced from those bytes are committed together with the file's
//! SHA-256 (`testdata/llama_ref/tiny/`), and a test that regenerates a file
//! with another hash fails before comparing anything.
//!
//! Each architecture gets its own weight kind, so that together they run the
//! decoder over several kernels, plus the features that distinguish the
//! family (GQA everywhere, biases for Qwen2 and Qwen2-MoE, QK-norm for Qwen3 and Gemma 3,
//! experts for Qwen3-MoE and Mixtral, a shared expert for Qwen2-MoE,
//! sinks, Q/K/V/O and expert biases, sliding windows and YaRN for gpt-oss
//! (F16, and MXFP4 experts),
//! fused QKV and gate/up for Phi-3, softcaps and sliding windows for
//! Gemma 2/3, a separate output head where the family has one).

use ferrox_gguf::testing::SplitMix64;
use ferrox_gguf::{Array, GgufWriter, Value};
use ferrox_quant::QuantKind;

use crate::arch::{Arch, FfnLayout, Role};

/// The shape and kinds of one tiny model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TinyShape {
    /// Embedding width.
    pub n_embd: usize,
    /// Feed-forward width.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// KV heads.
    pub n_head_kv: usize,
    /// Head size.
    pub head_dim: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Kind of the matrices.
    pub kind: QuantKind,
    /// Kind of the embedding (and separate output head).
    pub embd_kind: QuantKind,
    /// A separate output head (else tied).
    pub own_output: bool,
}

/// The tiny mixtures of experts: experts, used per token, expert width.
pub const TINY_EXPERTS: (usize, usize, usize) = (8, 2, 64);

/// The tiny Qwen2-MoE's shared expert width (twice its file's
/// `feed_forward_length`, so the width is read from its own key).
pub const TINY_SHARED_FF: usize = 512;

/// Vocabulary of every tiny model: 3 specials, 256 byte tokens, 61 words.
pub const TINY_VOCAB: usize = 320;

/// The tiny model of `arch`: a shape that exercises what the family has.
pub fn tiny_shape(arch: Arch) -> TinyShape {
    let base = TinyShape {
        n_embd: 64,
        n_ff: 128,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 16,
        n_layer: 2,
        kind: QuantKind::Q8_0,
        embd_kind: QuantKind::Q8_0,
        own_output: true,
    };
    match arch {
        Arch::Llama => TinyShape { n_embd: 256, n_ff: 256, head_dim: 64, kind: QuantKind::Q4K, embd_kind: QuantKind::Q6K, ..base },
        Arch::Qwen2 => TinyShape { kind: QuantKind::Q8_0, ..base },
        Arch::Qwen3 => TinyShape { kind: QuantKind::F16, embd_kind: QuantKind::F16, head_dim: 32, ..base },
        // 8 experts of 64, 2 per token; `n_ff` is the file's dense width.
        Arch::Qwen3Moe => TinyShape { kind: QuantKind::Q8_0, head_dim: 32, ..base },
        // K-quants (rows of 256): 8 experts of 256, 2 per token, and a
        // shared expert of 512 (`TINY_SHARED_FF`).
        Arch::Qwen2Moe => TinyShape { n_embd: 256, n_ff: 256, head_dim: 64, kind: QuantKind::Q4K, embd_kind: QuantKind::Q6K, ..base },
        // F16 everywhere (a variant has MXFP4 experts); 8 experts of 64.
        Arch::GptOss => TinyShape { kind: QuantKind::F16, embd_kind: QuantKind::F16, ..base },
        Arch::Phi3 => TinyShape { kind: QuantKind::Q5_0, n_head_kv: 4, ..base },
        Arch::Gemma2 => TinyShape { kind: QuantKind::F32, embd_kind: QuantKind::F32, n_layer: 3, own_output: false, ..base },
        Arch::Gemma3 => TinyShape { kind: QuantKind::Q4_0, n_layer: 3, head_dim: 32, own_output: false, ..base },
    }
}

fn vocab() -> (Vec<String>, Vec<f32>, Vec<i32>) {
    let mut tokens = vec!["<unk>".to_string(), "<s>".to_string(), "</s>".to_string()];
    let mut types = vec![2, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let words = "the of and to in is was he for it with as his on be at by had are but from or she an which \
                 you one we all were her would there their will when who him been has more if no out do so can \
                 what up said about other into than its time only could new them man some these then two first";
    for w in words.split_whitespace().take(TINY_VOCAB - tokens.len()) {
        tokens.push(format!("\u{2581}{w}"));
        types.push(1);
    }
    while tokens.len() < TINY_VOCAB {
        tokens.push(format!("\u{2581}w{}", tokens.len()));
        types.push(1);
    }
    let scores = (0..tokens.len()).map(|i| -(i as f32)).collect();
    (tokens, scores, types)
}

/// A tiny model the conformance suite runs: every architecture as its row
/// has it, plus the variants a row allows (a Llama file with experts:
/// Mixtral's layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TinyCase {
    /// Its name (`tiny-<label>.gguf`, `testdata/llama_ref/tiny/tiny-<label>.json`).
    pub label: &'static str,
    /// The architecture.
    pub arch: Arch,
    /// Whether its FFN is a mixture of experts.
    pub experts: bool,
    /// The expert stacks' kind, where it is not the shape's (gpt-oss's
    /// MXFP4 experts, as llama-quantize's `MXFP4_MOE` mix leaves them).
    pub experts_kind: Option<QuantKind>,
}

/// Every tiny case, in table order, then the variants.
pub fn tiny_cases() -> Vec<TinyCase> {
    let mut v: Vec<TinyCase> =
        Arch::ALL.iter().map(|&a| TinyCase { label: a.spec().name, arch: a, experts: a.spec().ffn == FfnLayout::Experts, experts_kind: None }).collect();
    v.push(TinyCase { label: "llama-moe", arch: Arch::Llama, experts: true, experts_kind: None });
    v.push(TinyCase { label: "gpt-oss-mxfp4", arch: Arch::GptOss, experts: true, experts_kind: Some(QuantKind::MXFP4) });
    v
}

/// Tiny models llama.cpp's own `llama-quantize` made from a tiny case's
/// file (seed 42): committed next to their logits
/// (`testdata/llama_ref/tiny/tiny-<label>.gguf`), since ferrox does not
/// write them. `gpt-oss-mxfp4_moe`: `tiny-gpt-oss.gguf` through
/// `llama-quantize … MXFP4_MOE` (MXFP4 experts, Q8_0 elsewhere).
pub fn llama_quantized_tiny_cases() -> Vec<TinyCase> {
    vec![TinyCase { label: "gpt-oss-mxfp4_moe", arch: Arch::GptOss, experts: true, experts_kind: Some(QuantKind::MXFP4) }]
}

/// Writes the tiny model of `arch` from `seed`.
pub fn tiny_arch_model(arch: Arch, seed: u64) -> Result<GgufWriter<'static>, Box<dyn std::error::Error + Send + Sync>> {
    tiny_model(TinyCase { label: arch.spec().name, arch, experts: arch.spec().ffn == FfnLayout::Experts, experts_kind: None }, seed)
}

/// Writes the tiny model of `case` from `seed`.
pub fn tiny_model(case: TinyCase, seed: u64) -> Result<GgufWriter<'static>, Box<dyn std::error::Error + Send + Sync>> {
    // gpt-oss's blocks drawn wider and its head's gains larger, so that a
    // missing sink, bias or YaRN piece moves its logits (std ~0.85) well
    // past the comparison's tolerance.
    let (block_scale, head_gain) = if case.arch == Arch::GptOss { (2.0, 1.5) } else { (1.0, 1.0) };
    arch_model(case, tiny_shape(case.arch), seed, block_scale, head_gain)
}

/// The shape of [`quant_ref_model`]: every matrix row (and the feed-forward
/// width the down projection reads) is 256 wide, so each K-quant applies
/// to every matrix; one block, a tied embedding, 4 query heads over one KV
/// head, F16 weights for llama.cpp's quantizer to start from.
pub const QUANT_REF_SHAPE: TinyShape = TinyShape {
    n_embd: 256,
    n_ff: 256,
    n_head: 4,
    n_head_kv: 1,
    head_dim: 64,
    n_layer: 1,
    kind: QuantKind::F16,
    embd_kind: QuantKind::F16,
    own_output: false,
};

/// The seed of the file llama.cpp quantized for `testdata/llama_ref/quant/`.
pub const QUANT_REF_SEED: u64 = 27;

/// The F16 Llama model `llama-quantize` turns into each kind of the per-kind
/// llama.cpp reference (`tools/refllama/gen.py quant`). Its block's matrices
/// are drawn twice as wide as [`tiny_arch_model`]'s (the block, not the
/// token's own embedding, dominates the residual, so the logits depend on
/// the context) and its output norm's gains are 14x, so the logits spread
/// with a standard deviation near 8 (top logit ~30; top-2 margins: median
/// ~1.5, tenth percentile ~0.2): wide against rounding, which moves a logit
/// by 1e-3..1e-2, and narrow enough that a wrong kernel moves the top token.
pub fn quant_ref_model(seed: u64) -> Result<GgufWriter<'static>, Box<dyn std::error::Error + Send + Sync>> {
    arch_model(TinyCase { label: "llama", arch: Arch::Llama, experts: false, experts_kind: None }, QUANT_REF_SHAPE, seed, 2.0, 14.0)
}

/// `case` in shape `s` from `seed`: matrices uniform in `±1/sqrt(width)`,
/// the blocks' `block_scale` times that; the output norm's gains times
/// `head_gain`.
fn arch_model(case: TinyCase, s: TinyShape, seed: u64, block_scale: f32, head_gain: f32) -> Result<GgufWriter<'static>, Box<dyn std::error::Error + Send + Sync>> {
    let arch = case.arch;
    let ffn = if case.experts { FfnLayout::Experts } else { arch.spec().ffn };
    let spec = arch.spec();
    let name = spec.name;
    let mut w = GgufWriter::new();
    let key = |k: &str| format!("{name}.{k}");
    w.set("general.architecture", Value::from(name))?;
    // Not the family name: llama.cpp keys vocab quirks on `general.name` (a
    // name containing "phi3" makes it look up Phi-3-only tokens).
    w.set("general.name", Value::from("tiny random model"))?;
    w.set(key("context_length"), Value::U32(256))?;
    w.set(key("embedding_length"), Value::U32(s.n_embd as u32))?;
    w.set(key("block_count"), Value::U32(s.n_layer as u32))?;
    w.set(key("feed_forward_length"), Value::U32(s.n_ff as u32))?;
    w.set(key("attention.head_count"), Value::U32(s.n_head as u32))?;
    w.set(key("attention.head_count_kv"), Value::U32(s.n_head_kv as u32))?;
    w.set(key("attention.layer_norm_rms_epsilon"), Value::F32(1e-6))?;
    w.set(key("rope.freq_base"), Value::F32(10_000.0))?;
    if s.head_dim != s.n_embd / s.n_head {
        w.set(key("attention.key_length"), Value::U32(s.head_dim as u32))?;
        w.set(key("attention.value_length"), Value::U32(s.head_dim as u32))?;
    }
    if arch == Arch::Llama {
        w.set(key("rope.dimension_count"), Value::U32(s.head_dim as u32))?;
    }
    if arch == Arch::GptOss {
        // YaRN as gpt-oss's files have it: 32x over an original 4096
        // positions, which puts the ramp between interpolated and
        // extrapolated pairs in the middle of a 16-wide head.
        w.set(key("rope.scaling.type"), Value::from("yarn"))?;
        w.set(key("rope.scaling.factor"), Value::F32(32.0))?;
        w.set(key("rope.scaling.original_context_length"), Value::U32(4096))?;
    }
    // Mixtral's files have no expert width: its experts are `n_ff` wide.
    // Qwen2-MoE's K-quant experts are as wide as a quant block.
    let expert_ff = match arch {
        Arch::Qwen2Moe => s.n_ff,
        _ if spec.ffn == FfnLayout::Experts => TINY_EXPERTS.2,
        _ => s.n_ff,
    };
    let shared_ff = TINY_SHARED_FF as u64;
    if ffn == FfnLayout::Experts {
        w.set(key("expert_count"), Value::U32(TINY_EXPERTS.0 as u32))?;
        w.set(key("expert_used_count"), Value::U32(TINY_EXPERTS.1 as u32))?;
        if spec.ffn == FfnLayout::Experts {
            w.set(key("expert_feed_forward_length"), Value::U32(expert_ff as u32))?;
        }
        if arch == Arch::Qwen2Moe {
            w.set(key("expert_shared_feed_forward_length"), Value::U32(shared_ff as u32))?;
        }
    }
    if matches!(arch, Arch::Gemma2 | Arch::Gemma3 | Arch::GptOss) {
        // A window shorter than the test sequence, and local/global layers
        // alternating, so both masks are exercised (gpt-oss: by its
        // default pattern, even layers local).
        w.set(key("attention.sliding_window"), Value::U32(5))?;
        if arch != Arch::GptOss {
            w.set(key("attention.sliding_window_pattern"), Value::U32(2))?;
        }
    }
    if arch == Arch::Gemma2 {
        w.set(key("attn_logit_softcapping"), Value::F32(0.5))?;
        w.set(key("final_logit_softcapping"), Value::F32(5.0))?;
    }
    let (tokens, scores, types) = vocab();
    w.set("tokenizer.ggml.model", Value::from("llama"))?;
    w.set("tokenizer.ggml.pre", Value::from("default"))?;
    w.set("tokenizer.ggml.tokens", Value::Array(Array::String(tokens.into_iter().map(ferrox_gguf::GgufString::from).collect())))?;
    w.set("tokenizer.ggml.scores", Value::Array(Array::F32(scores)))?;
    w.set("tokenizer.ggml.token_type", Value::Array(Array::I32(types)))?;
    w.set("tokenizer.ggml.unknown_token_id", Value::U32(0))?;
    w.set("tokenizer.ggml.bos_token_id", Value::U32(1))?;
    w.set("tokenizer.ggml.eos_token_id", Value::U32(2))?;
    w.set("tokenizer.ggml.add_bos_token", Value::Bool(true))?;
    w.set("tokenizer.ggml.add_eos_token", Value::Bool(false))?;

    let mut rng = SplitMix64(seed);
    let (e, hd, ff) = (s.n_embd as u64, s.head_dim as u64, s.n_ff as u64);
    let (q, kv) = (s.n_head as u64 * hd, s.n_head_kv as u64 * hd);
    let v = TINY_VOCAB as u64;
    // `norm`: gains near 1; `spread`: values uniform in ±spread (gpt-oss's
    // biases and sinks); else a matrix's ±1/sqrt(width).
    let mut add = |w: &mut GgufWriter<'static>, name: String, kind: QuantKind, dims: &[u64], norm: bool, spread: Option<f32>| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let n: u64 = dims.iter().product();
        let head = name == Role::OutputNorm.gguf_name(0);
        let wide = if name.starts_with("blk.") { block_scale } else { 1.0 };
        let scale = spread.unwrap_or(if norm { 0.2 } else { wide / (dims[0] as f32).sqrt() });
        let gain = if head { head_gain } else { 1.0 };
        let centre = if norm && spread.is_none() { 1.0 } else { 0.0 };
        let vals: Vec<f32> = (0..n).map(|_| (rng.next_f32() * scale + centre) * gain).collect();
        let data = ferrox_quant::quantize_to_vec(kind, &vals)
            .map_err(|err| format!("{name}: {err}"))?;
        Ok(w.add_tensor(name, kind, dims, data)?)
    };
    add(&mut w, Role::TokenEmbd.gguf_name(0), s.embd_kind, &[e, v], false, None)?;
    add(&mut w, Role::OutputNorm.gguf_name(0), QuantKind::F32, &[e], true, None)?;
    if s.own_output {
        add(&mut w, Role::Output.gguf_name(0), s.embd_kind, &[e, v], false, None)?;
    }
    for l in 0..s.n_layer {
        let mut t = |w: &mut GgufWriter<'static>, role: Role, dims: &[u64]| {
            let norm = matches!(role.feeds(), crate::arch::Feeds::Norm | crate::arch::Feeds::Bias);
            // Vectors (and stacks of expert biases), and a router (as
            // converted MoE models keep it), in f32.
            let kind = match role.feeds() {
                _ if dims.len() == 1 || role == Role::FfnGateInp || role.expert_bias() => QuantKind::F32,
                crate::arch::Feeds::Experts => case.experts_kind.unwrap_or(s.kind),
                _ => s.kind,
            };
            // gpt-oss's biases centred on 0, its sinks wide enough that
            // some heads give them most of their attention.
            let spread = match role {
                Role::AttnSinks => Some(3.0),
                _ if arch == Arch::GptOss && role.feeds() == crate::arch::Feeds::Bias => Some(0.5),
                _ => None,
            };
            add(w, role.gguf_name(l), kind, dims, norm, spread)
        };
        t(&mut w, Role::AttnNorm, &[e])?;
        if arch == Arch::Phi3 {
            t(&mut w, Role::AttnQkv, &[e, q + 2 * kv])?;
        } else {
            t(&mut w, Role::AttnQ, &[e, q])?;
            t(&mut w, Role::AttnK, &[e, kv])?;
            t(&mut w, Role::AttnV, &[e, kv])?;
        }
        if matches!(arch, Arch::Qwen2 | Arch::Qwen2Moe | Arch::GptOss) {
            t(&mut w, Role::AttnQBias, &[q])?;
            t(&mut w, Role::AttnKBias, &[kv])?;
            t(&mut w, Role::AttnVBias, &[kv])?;
        }
        if spec.qk_norm {
            t(&mut w, Role::AttnQNorm, &[hd])?;
            t(&mut w, Role::AttnKNorm, &[hd])?;
        }
        t(&mut w, Role::AttnOut, &[q, e])?;
        if arch == Arch::GptOss {
            t(&mut w, Role::AttnOutBias, &[e])?;
            t(&mut w, Role::AttnSinks, &[s.n_head as u64])?;
        }
        if spec.post_norms {
            t(&mut w, Role::AttnPostNorm, &[e])?;
        }
        t(&mut w, spec.ffn_norm, &[e])?;
        match ffn {
            FfnLayout::Separate => {
                t(&mut w, Role::FfnGate, &[e, ff])?;
                t(&mut w, Role::FfnUp, &[e, ff])?;
            }
            FfnLayout::FusedGateUp => t(&mut w, Role::FfnUp, &[e, 2 * ff])?,
            FfnLayout::Experts => {
                let (ne, xf) = (TINY_EXPERTS.0 as u64, expert_ff as u64);
                t(&mut w, Role::FfnGateInp, &[e, ne])?;
                t(&mut w, Role::FfnGateExps, &[e, xf, ne])?;
                t(&mut w, Role::FfnUpExps, &[e, xf, ne])?;
                t(&mut w, Role::FfnDownExps, &[xf, e, ne])?;
                if arch == Arch::GptOss {
                    t(&mut w, Role::FfnGateInpBias, &[ne])?;
                    t(&mut w, Role::FfnGateExpsBias, &[xf, ne])?;
                    t(&mut w, Role::FfnUpExpsBias, &[xf, ne])?;
                    t(&mut w, Role::FfnDownExpsBias, &[e, ne])?;
                }
                if arch == Arch::Qwen2Moe {
                    t(&mut w, Role::FfnGateInpShexp, &[e])?;
                    t(&mut w, Role::FfnGateShexp, &[e, shared_ff])?;
                    t(&mut w, Role::FfnUpShexp, &[e, shared_ff])?;
                    t(&mut w, Role::FfnDownShexp, &[shared_ff, e])?;
                }
            }
        }
        if ffn != FfnLayout::Experts {
            t(&mut w, Role::FfnDown, &[ff, e])?;
        }
        if spec.post_norms {
            t(&mut w, Role::FfnPostNorm, &[e])?;
        }
    }
    Ok(w)
}

/// The token ids every tiny-model reference run feeds (BOS, then a walk
/// over the vocabulary that repeats, so attention has something to find).
pub fn tiny_tokens() -> Vec<u32> {
    let mut v = vec![1u32];
    v.extend([259, 260, 261, 300, 45, 260, 262, 263, 120, 259, 260, 264]);
    v
}
