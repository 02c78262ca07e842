//! Re-quantizing a model file (`ferrox quantize IN OUT MIX`), tensor for
//! tensor as llama-quantize does.
//!
//! The decision of *what* each tensor becomes is llama-quantize's
//! (`src/llama-quant.cpp`), stated once here: [`allows_quantization`] (only
//! matrices whose name ends in `weight`, never norms, MoE routers, position
//! embeddings, convolution kernels…), the mix rules of
//! `llama_tensor_get_type` ([`plan_model`]: the output / tied token
//! embedding at Q6_K, `attn_v` and `ffn_down` bumped by layer index,
//! `use_more_bits`, the GQA and expert-count cases) and the fallback when a
//! row is not a whole number of blocks ([`fallback_kind`]). Tensors are
//! visited in llama.cpp's order (by layer, then by name), because the layer
//! counters of the rules count in that order, and written in it too.
//! Converting goes through f32 (dequantize, then ggml's reference
//! quantizer), so from the same input the tensor data is byte for byte
//! llama-quantize's (`crates/ferrox/tests/quantize.rs` holds it to that).

use std::borrow::Cow;

use ferrox_gguf::{Array, GgufError, GgufFile, GgufModel, GgufWriter, Value};
use ferrox_quant::{QuantError, QuantKind};

use crate::ftype::Mix;

/// llama-quantize's `tensor_allows_quantization`: may the matrix `name`
/// (of `n_dims` dimensions, in a model of architecture `arch`) change kind?
pub fn allows_quantization(name: &str, n_dims: usize, arch: &str, quantize_output: bool) -> bool {
    if n_dims < 2 || !name.ends_with("weight") {
        return false;
    }
    if !quantize_output && name == "output.weight" {
        return false;
    }
    if name == "position_embd.weight" || name == "token_types.weight" {
        return false;
    }
    const NEVER: &[&str] = &[
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
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
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ];
    const NEVER_GLM5_NEXT: &[&str] = &[
        "hc_",
        "indexer.attn_q_b",
        "indexer.attn_k",
        "indexer.proj",
        "indexer_compressor_gate",
        "indexer_compressor_ape",
        "ssm_f_a.weight",
        "ssm_f_b.weight",
        "ssm_g_a.weight",
        "ssm_g_b.weight",
        "ssm_beta.weight",
        "attn_kv_a_mqa.weight",
        "attn_k_b.weight",
        "attn_v_b.weight",
    ];
    if NEVER.iter().any(|f| name.contains(f)) {
        return false;
    }
    !(arch == "glm5-next" && NEVER_GLM5_NEXT.iter().any(|f| name.contains(f)))
}

/// What happens to one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorPlan {
    /// Bytes copied unchanged.
    Copy,
    /// Converted to this kind (through f32).
    Convert(QuantKind),
    /// Converted to a fallback kind because the row length is not a whole
    /// number of the blocks of the kind the rules chose.
    Fallback {
        /// What the rules chose.
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

    fn of(input: QuantKind, wanted: QuantKind, got: QuantKind) -> TensorPlan {
        if got != wanted {
            TensorPlan::Fallback { wanted, got }
        } else if got == input {
            TensorPlan::Copy
        } else {
            TensorPlan::Convert(got)
        }
    }
}

/// ggml's `ggml_is_quantized`: a block format (not a float or integer kind).
fn is_quantized(kind: QuantKind) -> bool {
    use QuantKind::*;
    !matches!(kind, F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64)
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

/// What the mix rules need to know about a model (llama.cpp's hparams).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelShape {
    /// `general.architecture`.
    pub arch: String,
    /// `{arch}.block_count` (else one more than the highest `blk.N.`).
    pub n_layer: u32,
    /// Query heads of layer 0.
    pub n_head: u32,
    /// Key/value heads of layer 0 (defaults to `n_head`).
    pub n_head_kv: u32,
    /// `{arch}.expert_count` (0 for a dense model).
    pub n_expert: u32,
}

/// The first element of an integer array, or the integer itself.
fn first_uint(v: &Value) -> Option<u64> {
    match v {
        Value::Array(a) => match a {
            Array::U8(x) => x.first().map(|&v| v.into()),
            Array::U16(x) => x.first().map(|&v| v.into()),
            Array::U32(x) => x.first().map(|&v| v.into()),
            Array::U64(x) => x.first().copied(),
            Array::I8(x) => x.first().and_then(|&v| u64::try_from(v).ok()),
            Array::I16(x) => x.first().and_then(|&v| u64::try_from(v).ok()),
            Array::I32(x) => x.first().and_then(|&v| u64::try_from(v).ok()),
            Array::I64(x) => x.first().and_then(|&v| u64::try_from(v).ok()),
            _ => None,
        },
        v => v.as_uint(),
    }
}

/// The layer index of a `blk.N.` name, as llama.cpp's `sscanf("blk.%d.")`.
fn layer_of(name: &str) -> Option<i64> {
    let rest = name.strip_prefix("blk.")?;
    let end = rest.find('.')?;
    rest[..end].parse().ok()
}

impl ModelShape {
    /// Reads the shape from a model's metadata and tensor names.
    pub fn of(file: &GgufFile, names: &[&str]) -> ModelShape {
        let arch = file.get_str("general.architecture").unwrap_or("").to_string();
        let get = |k: &str| file.get(&format!("{arch}.{k}")).and_then(first_uint);
        let from_names = names.iter().filter_map(|n| layer_of(n)).max().map_or(0, |l| l + 1);
        let n_layer = get("block_count").unwrap_or(from_names.max(0) as u64) as u32;
        let n_head = get("attention.head_count").unwrap_or(0) as u32;
        let n_head_kv = get("attention.head_count_kv").map_or(n_head, |v| v as u32);
        let n_expert = get("expert_count").unwrap_or(0) as u32;
        ModelShape { arch, n_layer, n_head, n_head_kv, n_expert }
    }

    fn n_gqa(&self) -> u32 {
        self.n_head.checked_div(self.n_head_kv).unwrap_or(0)
    }

    /// llama.cpp's `LLM_TYPE_70B` (the only model type the rules ask about).
    fn is_70b(&self) -> bool {
        self.arch == "llama" && self.n_layer == 80 && self.n_head != self.n_head_kv
    }
}

/// How to re-quantize (llama-quantize's parameters that ferrox has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// The mix (llama-quantize's file type).
    pub mix: Mix,
    /// Every matrix at the mix's default kind: no per-tensor rules, only the
    /// fallback (`--pure`).
    pub pure: bool,
    /// Leave `output.weight` as it is (`--leave-output-tensor`).
    pub leave_output: bool,
    /// Convert tensors that are already quantized (`--allow-requantize`).
    pub allow_requantize: bool,
}

impl Options {
    /// The mix with llama-quantize's defaults.
    pub fn new(mix: Mix) -> Options {
        Options { mix, pure: false, leave_output: false, allow_requantize: false }
    }
}

/// llama-quantize's broad tensor categories (`tensor_get_category`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cat {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnQkv,
    AttnKvB,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

impl Cat {
    fn of(name: &str) -> Cat {
        if name == "output.weight" {
            return Cat::Output;
        }
        if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            return Cat::TokenEmbd;
        }
        for (frag, cat) in [
            ("attn_qkv.weight", Cat::AttnQkv),
            ("attn_kv_b.weight", Cat::AttnKvB),
            ("attn_v.weight", Cat::AttnV),
            ("attn_k.weight", Cat::AttnK),
            ("attn_q.weight", Cat::AttnQ),
            ("attn_output.weight", Cat::AttnOutput),
            ("ffn_up", Cat::FfnUp),
            ("ffn_gate", Cat::FfnGate),
            ("ffn_down", Cat::FfnDown),
        ] {
            if name.contains(frag) {
                return cat;
            }
        }
        Cat::Other
    }

    fn is_attn_v(self) -> bool {
        matches!(self, Cat::AttnV | Cat::AttnQkv | Cat::AttnKvB)
    }
}

/// llama-quantize's `quantize_state_impl`: the layer counters the rules
/// read and advance.
struct Counters {
    n_attention_wv: i64,
    i_attention_wv: i64,
    n_layer: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
    has_tied_embeddings: bool,
}

fn use_more_bits(i_layer: i64, n_layers: i64) -> bool {
    i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2
}

/// `layer_info`: the layer a counter stands for, read from the name where
/// experts make the counter meaningless.
fn layer_info(i: i64, n: i64, name: &str, n_expert: u32) -> Result<(i64, i64), RequantizeError> {
    if n_expert <= 1 {
        return Ok((i, n));
    }
    match layer_of(name) {
        Some(l) if (0..n).contains(&l) => Ok((l, n)),
        Some(l) => Err(RequantizeError::Plan(format!("bad layer {l} for tensor {name}: must be in [0, {n})"))),
        None => Err(RequantizeError::Plan(format!("cannot determine the layer of tensor {name}"))),
    }
}

/// `llama_tensor_get_type_impl`: the mix's choice for one matrix before the
/// fallback.
fn mix_kind(
    c: &mut Counters,
    m: &ModelShape,
    mut new: QuantKind,
    name: &str,
    dims: &[u64],
    ftype: Mix,
    cat: Cat,
) -> Result<QuantKind, RequantizeError> {
    use Mix as F;
    use QuantKind as K;
    let falcon = m.arch == "falcon";
    let nx = dims.first().copied().unwrap_or(0);
    let ne2 = dims.get(2).copied().unwrap_or(1);
    let n_expert = m.n_expert;
    let gqa4 = m.n_gqa() >= 4;
    let iq2_family = matches!(ftype, F::IQ2_XXS | F::IQ2_XS | F::IQ1_S | F::IQ2_S | F::IQ2_M | F::IQ1_M);
    let iq2s_or_m = matches!(ftype, F::IQ2_S | F::IQ2_M);

    if m.arch == "glm5-next"
        && (name.contains("attn_q_a") || name.contains("attn_q_b") || name.contains("nextn.eh_proj"))
        && !matches!(new, K::F32 | K::BF16 | K::F16)
    {
        return Ok(K::Q8_0);
    }

    if cat == Cat::Output || (c.has_tied_embeddings && cat == Cat::TokenEmbd) {
        let qk = new.block_elems() as u64;
        if ftype == F::MXFP4_MOE || falcon || !nx.is_multiple_of(qk) {
            new = K::Q8_0;
        } else if matches!(ftype, F::IQ2_XXS | F::IQ2_XS | F::IQ3_XXS | F::IQ1_S | F::IQ2_S | F::IQ2_M | F::IQ1_M) {
            new = K::Q5K;
        } else if new != K::Q8_0 {
            new = K::Q6K;
        }
    } else if ftype == F::MXFP4_MOE {
        let bailing_expert = m.arch == "bailingmoe3" && matches!(cat, Cat::FfnUp | Cat::FfnGate | Cat::FfnDown);
        new = if ne2 > 1 && (m.arch != "bailingmoe3" || bailing_expert) { K::MXFP4 } else { K::Q8_0 };
    } else if cat == Cat::TokenEmbd {
        if matches!(ftype, F::IQ2_XXS | F::IQ2_XS | F::IQ1_S | F::IQ1_M) {
            new = K::Q2K;
        } else if matches!(ftype, F::IQ2_S | F::IQ2_M | F::IQ3_XXS) {
            new = K::IQ3S;
        } else if matches!(ftype, F::TQ1_0 | F::TQ2_0 | F::Q2_0) {
            new = K::Q4K;
        }
    } else if iq2_family {
        if cat.is_attn_v() {
            new = if gqa4 || n_expert >= 4 {
                K::Q4K
            } else if iq2s_or_m {
                K::IQ3S
            } else {
                K::Q2K
            };
            c.i_attention_wv += 1;
        } else if n_expert == 8 && cat == Cat::AttnK {
            new = K::Q4K;
        } else if cat == Cat::FfnDown {
            if c.i_ffn_down < c.n_layer / 8 {
                new = if iq2s_or_m { K::IQ3S } else { K::Q2K };
            }
            c.i_ffn_down += 1;
        } else if cat == Cat::AttnOutput {
            if n_expert == 8 {
                new = K::Q5K;
            } else if matches!(ftype, F::IQ1_S | F::IQ1_M) {
                new = K::IQ2XXS;
            } else if iq2s_or_m {
                new = K::IQ3S;
            }
        }
    } else if cat.is_attn_v() {
        let (i, n) = (c.i_attention_wv, c.n_attention_wv);
        match ftype {
            F::Q2_K => new = if gqa4 { K::Q4K } else { K::Q3K },
            F::Q2_K_S if gqa4 => new = K::Q4K,
            // llama-quantize without an importance matrix: IQ3_S.
            F::IQ3_XXS => new = if gqa4 { K::Q4K } else { K::IQ3S },
            F::IQ3_XS | F::IQ3_S if gqa4 => new = K::Q4K,
            F::IQ3_M => new = K::Q4K,
            F::Q3_K_M => new = if i < 2 { K::Q5K } else { K::Q4K },
            F::Q3_K_L => new = K::Q5K,
            F::IQ4_NL | F::IQ4_XS if gqa4 => new = K::Q5K,
            F::Q4_K_M | F::Q5_K_M if use_more_bits(i, n) => new = K::Q6K,
            F::Q4_K_S if i < 4 => new = K::Q5K,
            _ => {}
        }
        if m.is_70b() && matches!(new, K::Q3K | K::Q4K) {
            new = K::Q5K;
        }
        if n_expert == 8 {
            new = K::Q8_0;
        }
        c.i_attention_wv += 1;
    } else if cat == Cat::AttnK {
        if n_expert == 8 {
            new = K::Q8_0;
        } else if ftype == F::IQ3_XS {
            new = K::IQ3XXS;
        } else if ftype == F::IQ3_XXS {
            new = K::IQ2S;
        }
    } else if cat == Cat::AttnQ {
        if ftype == F::IQ3_XS {
            new = K::IQ3XXS;
        } else if ftype == F::IQ3_XXS {
            new = K::IQ2S;
        }
    } else if cat == Cat::FfnDown {
        let (i, n) = layer_info(c.i_ffn_down, c.n_layer, name, n_expert)?;
        match ftype {
            F::Q2_K => new = K::Q3K,
            F::Q2_K_S if i < n / 8 => new = K::Q4K,
            // Without an importance matrix.
            F::IQ3_XXS => new = if i < n / 8 { K::Q4K } else { K::Q3K },
            F::Q3_K_M => {
                new = if i < n / 16 {
                    K::Q5K
                } else if !falcon || use_more_bits(i, n) {
                    K::Q4K
                } else {
                    K::Q3K
                }
            }
            F::IQ3_M if i < n / 8 || (n_expert == 8 && use_more_bits(i, n)) => new = K::Q4K,
            F::Q3_K_L => new = if falcon { K::Q4K } else { K::Q5K },
            F::Q4_K_M => {
                if falcon {
                    new = if i < n / 16 {
                        K::Q6K
                    } else if use_more_bits(i, n) {
                        K::Q5K
                    } else {
                        K::Q4K
                    };
                } else if use_more_bits(i, n) {
                    new = K::Q6K;
                }
            }
            F::IQ4_NL | F::IQ4_XS if i < n / 8 => new = K::Q5K,
            F::Q5_K_M if use_more_bits(i, n) => new = K::Q6K,
            F::Q4_K_S if !falcon && i < n / 8 => new = K::Q5K,
            _ => {}
        }
        c.i_ffn_down += 1;
    } else if cat == Cat::AttnOutput {
        if !falcon {
            if n_expert == 8 {
                if matches!(
                    ftype,
                    F::Q2_K
                        | F::IQ3_XS
                        | F::IQ3_XXS
                        | F::Q3_K_S
                        | F::Q3_K_M
                        | F::IQ4_NL
                        | F::Q4_K_S
                        | F::Q4_K_M
                        | F::IQ3_S
                        | F::IQ3_M
                        | F::IQ4_XS
                ) {
                    new = K::Q5K;
                }
            } else {
                match ftype {
                    F::Q2_K => new = K::Q3K,
                    F::IQ3_XXS => new = K::IQ3S,
                    F::Q3_K_M | F::IQ3_M => new = K::Q4K,
                    F::Q3_K_L => new = K::Q5K,
                    _ => {}
                }
            }
        } else if ftype == F::Q3_K_L {
            new = K::Q4K;
        }
    } else if cat == Cat::AttnQkv {
        // Unreachable in llama.cpp too (attn_qkv is attn_v-like above);
        // kept so the two read alike.
        match ftype {
            F::Q3_K_M | F::Q3_K_L | F::IQ3_M => new = K::Q4K,
            F::Q4_K_M => new = K::Q5K,
            F::Q5_K_M => new = K::Q6K,
            _ => {}
        }
    } else if cat == Cat::FfnGate {
        let (i, n) = layer_info(c.i_ffn_gate, c.n_layer, name, n_expert)?;
        if ftype == F::IQ3_XS && i >= n / 8 && i < 7 * n / 8 {
            new = K::IQ3XXS;
        }
        c.i_ffn_gate += 1;
    } else if cat == Cat::FfnUp {
        let (i, n) = layer_info(c.i_ffn_up, c.n_layer, name, n_expert)?;
        if ftype == F::IQ3_XS && i >= n / 8 && i < 7 * n / 8 {
            new = K::IQ3XXS;
        }
        c.i_ffn_up += 1;
    }
    Ok(new)
}

/// llama.cpp's tensor order (`weight_name_comparer`): by layer (`blk.N.`,
/// tensors outside a block first), then by name.
pub fn llama_order(names: &[&str]) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..names.len()).collect();
    idx.sort_by(|&a, &b| {
        let la = layer_of(names[a]).unwrap_or(-1);
        let lb = layer_of(names[b]).unwrap_or(-1);
        la.cmp(&lb).then_with(|| names[a].cmp(names[b]))
    });
    idx
}

/// Whether ferrox can build `mix` at all: its base kind can be produced,
/// and it is not a mix llama-quantize only builds with an importance matrix.
pub fn mix_support(mix: Mix) -> Result<(), RequantizeError> {
    if mix == Mix::Q2_K_S {
        return Err(RequantizeError::Plan(
            "Q2_K_S needs an importance matrix (as in llama-quantize), which ferrox does not take yet".into(),
        ));
    }
    ferrox_quant::quantize_support(mix.default_kind())
        .map_err(|source| RequantizeError::Unsupported { tensor: "most matrices".into(), source })
}

/// One tensor of the input: what the plan needs of it.
#[derive(Debug, Clone, Copy)]
pub struct TensorDesc<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its kind in the input.
    pub kind: QuantKind,
    /// Its shape (ggml order).
    pub dims: &'a [u64],
}

/// llama-quantize's plan for every tensor (`llama_tensor_get_type` over the
/// tensors in [`llama_order`]): returns, in that order, each tensor's index
/// in `tensors` and what happens to it.
pub fn plan_model(
    tensors: &[TensorDesc<'_>],
    shape: &ModelShape,
    opts: &Options,
) -> Result<Vec<(usize, TensorPlan)>, RequantizeError> {
    let names: Vec<&str> = tensors.iter().map(|t| t.name).collect();
    let order = llama_order(&names);
    let cats: Vec<Cat> = names.iter().map(|n| Cat::of(n)).collect();
    let mut c = Counters {
        n_attention_wv: cats.iter().filter(|c| c.is_attn_v()).count() as i64,
        i_attention_wv: 0,
        n_layer: i64::from(shape.n_layer),
        i_ffn_down: 0,
        i_ffn_gate: 0,
        i_ffn_up: 0,
        has_tied_embeddings: !cats.contains(&Cat::Output),
    };
    let default = opts.mix.default_kind();
    let mut plan = Vec::with_capacity(tensors.len());
    for i in order {
        let t = &tensors[i];
        let n_dims = t.dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
        if !allows_quantization(t.name, n_dims, &shape.arch, !opts.leave_output) {
            plan.push((i, TensorPlan::Copy));
            continue;
        }
        if !is_quantized(default) {
            plan.push((i, TensorPlan::of(t.kind, default, default)));
            continue;
        }
        let wanted = if opts.pure {
            default
        } else {
            mix_kind(&mut c, shape, default, t.name, t.dims, opts.mix, cats[i])?
        };
        let got = fallback_kind(wanted, t.dims.first().copied().unwrap_or(0));
        plan.push((i, TensorPlan::of(t.kind, wanted, got)));
    }
    Ok(plan)
}

/// Decides what happens to one tensor `name` of kind `input` with shape
/// `dims` at `target` with no per-tensor rules (llama-quantize `--pure`):
/// matrices llama-quantize may quantize become `target` (or its fallback),
/// everything else is copied.
pub fn plan_tensor(name: &str, input: QuantKind, dims: &[u64], target: QuantKind) -> TensorPlan {
    let n_dims = dims.iter().rposition(|&d| d != 1).map_or(1, |i| i + 1);
    if !allows_quantization(name, n_dims, "", true) {
        return TensorPlan::Copy;
    }
    let got = if is_quantized(target) { fallback_kind(target, dims.first().copied().unwrap_or(0)) } else { target };
    TensorPlan::of(input, target, got)
}

/// Why a model could not be re-quantized.
#[derive(Debug, thiserror::Error)]
pub enum RequantizeError {
    /// Reading the input or assembling the output failed.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// A tensor could not be converted.
    #[error("tensor {tensor}: {source}")]
    Quant {
        /// The tensor being converted.
        tensor: String,
        /// What the block-format layer said.
        source: QuantError,
    },
    /// The plan needs a kind ferrox cannot produce.
    #[error("{source} (the mix puts {tensor} at it)")]
    Unsupported {
        /// The first tensor planned at that kind.
        tensor: String,
        /// What the block-format layer said.
        source: QuantError,
    },
    /// A tensor is already quantized and re-quantizing was not allowed.
    #[error(
        "{tensor} is already quantized ({from}); re-quantizing loses quality, so it needs --allow-requantize (as llama-quantize does)"
    )]
    Requantize {
        /// The first such tensor.
        tensor: String,
        /// Its kind.
        from: QuantKind,
    },
    /// The mix's rules could not be applied to this model.
    #[error("{0}")]
    Plan(String),
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
    let rows = src.len().checked_div(in_row).unwrap_or(0);
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
                        ferrox_quant::quantize_chunk(to, &row, or)?;
                    }
                    Ok(())
                })
            })
            .collect();
        jobs.into_iter().try_for_each(|j| j.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    })?;
    Ok(out)
}

fn descs(model: &GgufModel) -> Vec<TensorDesc<'_>> {
    model
        .tensors()
        .iter()
        .map(|t| TensorDesc { name: &t.info.name, kind: t.info.kind, dims: &t.info.dims })
        .collect()
}

/// llama-quantize's plan for `model` under `opts` (see [`plan_model`]),
/// checked before any tensor is converted: every kind it needs can be
/// produced, and nothing already quantized is converted unless
/// `opts.allow_requantize`.
pub fn plan_for(model: &GgufModel, opts: &Options) -> Result<Vec<(usize, TensorPlan)>, RequantizeError> {
    let tensors = descs(model);
    let names: Vec<&str> = tensors.iter().map(|t| t.name).collect();
    let shape = ModelShape::of(model.metadata_file(), &names);
    let plan = plan_model(&tensors, &shape, opts)?;
    check_plan(&tensors, &plan, opts.allow_requantize)?;
    Ok(plan)
}

fn check_plan(tensors: &[TensorDesc<'_>], plan: &[(usize, TensorPlan)], allow_requantize: bool) -> Result<(), RequantizeError> {
    for &(i, p) in plan {
        let t = &tensors[i];
        let out = p.output_kind(t.kind);
        if out == t.kind {
            continue;
        }
        ferrox_quant::quantize_support(out)
            .map_err(|source| RequantizeError::Unsupported { tensor: t.name.to_string(), source })?;
        if is_quantized(t.kind) && !allow_requantize {
            return Err(RequantizeError::Requantize { tensor: t.name.to_string(), from: t.kind });
        }
    }
    Ok(())
}

/// Re-quantizes `model` as llama-quantize does with `opts` (see
/// [`plan_for`]), returning a writer for the single-file output, tensors in
/// llama.cpp's order. Metadata is kept except the split keys;
/// `general.file_type` is the mix's and `general.quantization_version` 2.
/// Tensors that keep their kind are borrowed, not copied.
pub fn requantize_mix<'m>(
    model: &'m GgufModel,
    opts: &Options,
    threads: usize,
    on_progress: impl FnMut(Progress<'_>),
) -> Result<GgufWriter<'m>, RequantizeError> {
    let plan = plan_for(model, opts)?;
    write_plan(model, &plan, Some(opts.mix.file_type()), threads, on_progress)
}

/// Re-quantizes every matrix of `model` to `target` with no per-tensor
/// rules (llama-quantize `--pure --allow-requantize`; see [`plan_tensor`]),
/// tensors in the input's order.
pub fn requantize<'m>(
    model: &'m GgufModel,
    target: QuantKind,
    threads: usize,
    on_progress: impl FnMut(Progress<'_>),
) -> Result<GgufWriter<'m>, RequantizeError> {
    let tensors = descs(model);
    let plan: Vec<(usize, TensorPlan)> =
        tensors.iter().enumerate().map(|(i, t)| (i, plan_tensor(t.name, t.kind, t.dims, target))).collect();
    ferrox_quant::quantize_support(target)
        .map_err(|source| RequantizeError::Unsupported { tensor: "every matrix".into(), source })?;
    check_plan(&tensors, &plan, true)?;
    write_plan(model, &plan, crate::ftype::of_kind(target), threads, on_progress)
}

fn write_plan<'m>(
    model: &'m GgufModel,
    plan: &[(usize, TensorPlan)],
    file_type: Option<u32>,
    threads: usize,
    mut on_progress: impl FnMut(Progress<'_>),
) -> Result<GgufWriter<'m>, RequantizeError> {
    let mut w = GgufWriter::new();
    let meta = model.metadata_file();
    w.set_version(meta.version())?;
    // llama-quantize's order: every key as it was, then the quantization
    // version, then the file type (gguf_set_val_* removes and appends).
    let mut old_file_type = None;
    for (k, v) in meta.metadata() {
        if k.starts_with("split.") || k == "general.quantization_version" {
            continue;
        }
        if k == "general.file_type" {
            old_file_type = Some(v.clone());
            continue;
        }
        w.set(k.clone(), v.clone())?;
    }
    w.set("general.quantization_version", Value::U32(2))?;
    match (file_type, old_file_type) {
        (Some(ft), _) => w.set("general.file_type", Value::U32(ft))?,
        (None, Some(v)) => w.set("general.file_type", v)?,
        (None, None) => {}
    }

    let count = plan.len();
    for (n, &(i, p)) in plan.iter().enumerate() {
        let t = &model.tensors()[i];
        let info = &t.info;
        let data = model.tensor_data(t)?;
        let out_kind = p.output_kind(info.kind);
        let bytes: Cow<'m, [u8]> = if out_kind == info.kind {
            Cow::Borrowed(data)
        } else {
            let ncols = info.dims.first().copied().unwrap_or(1) as usize;
            let q = convert(data, info.kind, out_kind, ncols, threads)
                .map_err(|source| RequantizeError::Quant { tensor: info.name.clone(), source })?;
            Cow::Owned(q)
        };
        w.add_tensor(info.name.clone(), out_kind, &info.dims, bytes)?;
        on_progress(Progress { index: n + 1, count, name: &info.name, from: info.kind, plan: p, dims: &info.dims });
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
        // llama-quantize copies every tensor it may not quantize, whatever its kind.
        assert_eq!(plan_tensor("blk.0.ffn_norm.weight", F16, &[640], Q4K), TensorPlan::Copy);
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

    /// A Gemma-3-270M-like model: 18 layers, 4 query heads per KV head,
    /// rows of 640 (not whole 256-blocks), tied embeddings.
    fn gemma_like(mix: Mix) -> Vec<(String, QuantKind)> {
        let dims2 = [640u64, 1024];
        let norm = [640u64];
        let mut names = vec!["token_embd.weight".to_string(), "output_norm.weight".to_string()];
        for l in 0..18 {
            for t in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_gate", "ffn_down", "attn_norm"] {
                names.push(format!("blk.{l}.{t}.weight"));
            }
        }
        let dims: Vec<&[u64]> = names.iter().map(|n| if n.contains("norm") { &norm[..] } else { &dims2[..] }).collect();
        let tensors: Vec<TensorDesc<'_>> =
            names.iter().zip(&dims).map(|(n, d)| TensorDesc { name: n, kind: F32, dims: d }).collect();
        let shape = ModelShape { arch: "gemma3".into(), n_layer: 18, n_head: 4, n_head_kv: 1, n_expert: 0 };
        let plan = plan_model(&tensors, &shape, &Options::new(mix)).unwrap();
        plan.into_iter().map(|(i, p)| (names[i].clone(), p.output_kind(F32))).collect()
    }

    fn kind_of(plan: &[(String, QuantKind)], name: &str) -> QuantKind {
        plan.iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("{name} not planned")).1
    }

    /// Expected kinds worked out by hand from llama-quant.cpp's rules.
    #[test]
    fn mixes_bump_tensors_by_layer_like_llama_quantize() {
        // Q4_K_M: attn_v and ffn_down at Q6_K where use_more_bits (18 layers:
        // 0, 1, 4, 7, 10, 13, 15, 16, 17), Q4_K elsewhere; both fall back
        // (640 columns) to Q8_0 and Q5_0.
        let p = gemma_like(Mix::Q4_K_M);
        let bumped = [0, 1, 4, 7, 10, 13, 15, 16, 17];
        for l in 0..18 {
            let want = if bumped.contains(&l) { Q8_0 } else { Q5_0 };
            assert_eq!(kind_of(&p, &format!("blk.{l}.attn_v.weight")), want, "attn_v {l}");
            assert_eq!(kind_of(&p, &format!("blk.{l}.ffn_down.weight")), want, "ffn_down {l}");
            assert_eq!(kind_of(&p, &format!("blk.{l}.attn_q.weight")), Q5_0);
        }
        // Tied embeddings take the output's rule: 640 % 256 != 0 -> Q8_0.
        assert_eq!(kind_of(&p, "token_embd.weight"), Q8_0);
        assert_eq!(kind_of(&p, "output_norm.weight"), F32);

        // Q3_K_M: the first two attn_v at Q5_K (-> Q5_1), the rest Q4_K
        // (-> Q5_0); ffn_down at Q5_K below 18/16 = 1 layer, then Q4_K;
        // attn_output at Q4_K.
        let p = gemma_like(Mix::Q3_K_M);
        assert_eq!(kind_of(&p, "blk.0.attn_v.weight"), Q5_1);
        assert_eq!(kind_of(&p, "blk.1.attn_v.weight"), Q5_1);
        assert_eq!(kind_of(&p, "blk.2.attn_v.weight"), Q5_0);
        assert_eq!(kind_of(&p, "blk.0.ffn_down.weight"), Q5_1);
        assert_eq!(kind_of(&p, "blk.1.ffn_down.weight"), Q5_0);
        assert_eq!(kind_of(&p, "blk.3.attn_output.weight"), Q5_0);
        assert_eq!(kind_of(&p, "blk.3.ffn_up.weight"), Q4_0, "Q3_K falls back to Q4_0");

        // Q2_K with 4 query heads per KV head: attn_v at Q4_K (-> Q5_0).
        let p = gemma_like(Mix::Q2_K);
        assert_eq!(kind_of(&p, "blk.5.attn_v.weight"), Q5_0);
        assert_eq!(kind_of(&p, "blk.5.ffn_down.weight"), Q4_0);
        assert_eq!(kind_of(&p, "blk.5.ffn_gate.weight"), Q4_0);

        // IQ4_XS: attn_v at Q5_K (GQA >= 4) -> Q5_1; ffn_down of the first
        // 18/8 = 2 layers at Q5_K -> Q5_1; the rest IQ4_XS -> IQ4_NL.
        let p = gemma_like(Mix::IQ4_XS);
        assert_eq!(kind_of(&p, "blk.9.attn_v.weight"), Q5_1);
        assert_eq!(kind_of(&p, "blk.1.ffn_down.weight"), Q5_1);
        assert_eq!(kind_of(&p, "blk.2.ffn_down.weight"), IQ4NL);

        // Q4_0: the embedding's Q6_K falls back to Q8_0; matrices stay Q4_0.
        let p = gemma_like(Mix::Q4_0);
        assert_eq!(kind_of(&p, "token_embd.weight"), Q8_0);
        assert_eq!(kind_of(&p, "blk.0.attn_v.weight"), Q4_0);

        // F16: no rules, no fallback; 1-D tensors untouched.
        let p = gemma_like(Mix::F16);
        assert_eq!(kind_of(&p, "token_embd.weight"), F16);
        assert_eq!(kind_of(&p, "blk.0.attn_norm.weight"), F32);
    }

    /// llama.cpp visits tensors by layer number, not by string: blk.10
    /// after blk.9, and counts attn_v in that order.
    #[test]
    fn tensors_are_visited_in_llama_cpps_order() {
        let names = ["blk.10.a", "blk.9.b", "output.weight", "blk.9.a", "token_embd.weight"];
        let order: Vec<&str> = llama_order(&names).into_iter().map(|i| names[i]).collect();
        assert_eq!(order, ["output.weight", "token_embd.weight", "blk.9.a", "blk.9.b", "blk.10.a"]);
    }

    #[test]
    fn use_more_bits_matches_llama_cpp() {
        let on: Vec<i64> = (0..32).filter(|&i| use_more_bits(i, 32)).collect();
        // 32 layers: the first 4, the last 4, and every third from 6.
        assert_eq!(on, [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]);
    }
}
