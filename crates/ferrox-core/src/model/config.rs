//! Hyper-parameters read from a file's metadata through its [`ArchSpec`].

use ferrox_gguf::{GgufFile, Value};

use super::ModelError;
use crate::arch::{Arch, ArchSpec, AttnScale, SlidingWindow};

/// Everything the decoder needs to know about a model's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The architecture.
    pub arch: Arch,
    /// `general.name`, if any.
    pub name: Option<String>,
    /// Context the model was trained for.
    pub n_ctx_train: usize,
    /// Embedding width.
    pub n_embd: usize,
    /// Blocks.
    pub n_layer: usize,
    /// Feed-forward width.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Key (and query) head size.
    pub head_dim: usize,
    /// Value head size.
    pub head_dim_v: usize,
    /// Dimensions RoPE rotates.
    pub n_rot: usize,
    /// RMS norm epsilon.
    pub rms_eps: f32,
    /// RoPE base of global layers.
    pub rope_base: f32,
    /// RoPE base of sliding-window layers.
    pub rope_base_local: f32,
    /// Linear RoPE position scale of global layers (`1 / factor`).
    pub rope_freq_scale: f32,
    /// RoPE cos/sin magnitude factor.
    pub rope_attn_factor: f32,
    /// YaRN (`rope.scaling.type = yarn`): `rope_freq_scale` interpolates
    /// only the low frequencies, ramping to none at the high ones, and the
    /// cos/sin grow by `1 + 0.1 ln(1 / rope_freq_scale)` (see
    /// `model::yarn_factors`).
    pub rope_yarn: bool,
    /// Context the RoPE factors were made for (Phi-3 long/short choice).
    pub n_ctx_orig: usize,
    /// Sliding window size, if the model has local layers.
    pub window: Option<u32>,
    /// Per layer: whether it uses the sliding window.
    pub local_layers: Vec<bool>,
    /// Multiplier of `q·k`.
    pub attn_scale: f32,
    /// Attention logit softcap.
    pub attn_softcap: Option<f32>,
    /// Final logit softcap.
    pub final_softcap: Option<f32>,
    /// How the feed-forward blocks are stored: the row's layout, or experts
    /// where a Llama file declares `expert_count` (Mixtral).
    pub ffn: crate::arch::FfnLayout,
    /// Mixture of experts: the experts per layer, those each token is
    /// routed to, and each expert's hidden width (all 0 for a dense model).
    pub experts: Experts,
    /// A shared expert's hidden width (`expert_shared_feed_forward_length`,
    /// else `feed_forward_length`), where the architecture has one
    /// (Qwen2-MoE); 0: none.
    pub n_ff_shared: usize,
}

struct Meta<'a> {
    file: &'a GgufFile,
    arch: &'static str,
}

impl Meta<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn uint(&self, k: &str) -> Result<Option<usize>, ModelError> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => v
                .as_uint()
                .and_then(|x| usize::try_from(x).ok())
                .map(Some)
                .ok_or_else(|| ModelError::BadMetadata { key, why: format!("expected a non-negative integer, got {:?}", v.value_type()) }),
        }
    }

    fn req_uint(&self, k: &str) -> Result<usize, ModelError> {
        self.uint(k)?.ok_or_else(|| ModelError::MissingMetadata { key: self.key(k) })
    }

    fn float(&self, k: &str) -> Result<Option<f32>, ModelError> {
        let key = self.key(k);
        match self.file.get(&key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(*x)),
            Some(Value::F64(x)) => Ok(Some(*x as f32)),
            Some(v) => Err(ModelError::BadMetadata { key, why: format!("expected a float, got {:?}", v.value_type()) }),
        }
    }

    fn string(&self, k: &str) -> Option<&str> {
        self.file.get_str(&self.key(k)).ok()
    }
}

/// Largest value any shape parameter may take: far above real models, low
/// enough that products of a few of them cannot overflow or allocate wildly.
const MAX_DIM: usize = 1 << 20;

/// A mixture of experts' sizes and routing (`Experts::default()`: a dense model).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Experts {
    /// Experts per layer (`expert_count`).
    pub n_expert: usize,
    /// Experts each token is routed to (`expert_used_count`).
    pub n_used: usize,
    /// Each expert's hidden width (`expert_feed_forward_length`).
    pub n_ff: usize,
    /// Whether a token's routing weights are normalized to sum to one.
    pub norm_weights: bool,
    /// A factor on the routing weights (`expert_weights_scale`; 1: none).
    pub scale: f32,
    /// Softmax before the top-k (over every expert) or after it (over
    /// the chosen ones).
    pub gating: crate::arch::MoeGating,
    /// gpt-oss's clamped SwiGLU in the experts (instead of the row's
    /// activation).
    pub swiglu_oai: Option<crate::arch::SwigluOai>,
}

impl ModelConfig {
    /// Reads the configuration of `arch` from `file`'s metadata.
    pub fn from_gguf(file: &GgufFile, arch: Arch) -> Result<ModelConfig, ModelError> {
        let spec: &ArchSpec = arch.spec();
        let m = Meta { file, arch: spec.name };
        if matches!(file.get(&m.key("attention.head_count")), Some(Value::Array(_))) {
            return Err(ModelError::Unsupported { what: "per-layer head counts".into() });
        }
        let n_embd = m.req_uint("embedding_length")?;
        let n_layer = m.req_uint("block_count")?;
        let n_ff = m.req_uint("feed_forward_length")?;
        let n_head = m.req_uint("attention.head_count")?;
        let n_head_kv = m.uint("attention.head_count_kv")?.unwrap_or(n_head);
        for (key, v) in [
            ("embedding_length", n_embd),
            ("block_count", n_layer),
            ("feed_forward_length", n_ff),
            ("attention.head_count", n_head),
            ("attention.head_count_kv", n_head_kv),
        ] {
            if v == 0 || v > MAX_DIM {
                return Err(ModelError::BadMetadata { key: m.key(key), why: format!("{v} is out of range 1..={MAX_DIM}") });
            }
        }
        if n_head % n_head_kv != 0 {
            return Err(ModelError::BadMetadata {
                key: m.key("attention.head_count_kv"),
                why: format!("{n_head} query heads cannot be grouped over {n_head_kv} KV heads"),
            });
        }
        let head_dim = m.uint("attention.key_length")?.unwrap_or(n_embd / n_head);
        let head_dim_v = m.uint("attention.value_length")?.unwrap_or(n_embd / n_head);
        let n_rot = m.uint("rope.dimension_count")?.unwrap_or(head_dim);
        if head_dim == 0 || head_dim > MAX_DIM || head_dim_v == 0 || head_dim_v > MAX_DIM || n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::BadMetadata {
                key: m.key("attention.key_length"),
                why: format!("head sizes {head_dim}/{head_dim_v} with {n_rot} rotated dimensions"),
            });
        }
        let rms_eps = m
            .float("attention.layer_norm_rms_epsilon")?
            .ok_or_else(|| ModelError::MissingMetadata { key: m.key("attention.layer_norm_rms_epsilon") })?;
        let rope_base = m.float("rope.freq_base")?.unwrap_or(10_000.0);
        let rope_yarn = match m.string("rope.scaling.type") {
            None | Some("none" | "linear") => false,
            Some("yarn") => true,
            Some(other) => return Err(ModelError::Unsupported { what: format!("RoPE scaling {other:?}") }),
        };
        let factor = match m.float("rope.scaling.factor")? {
            Some(f) => Some(f),
            None => m.float("rope.scale_linear")?,
        };
        let rope_freq_scale = match factor {
            Some(f) if f != 0.0 => 1.0 / f,
            _ => 1.0,
        };
        let rope_attn_factor = m.float("rope.scaling.attn_factor")?.unwrap_or(1.0);
        let n_ctx_train = m.uint("context_length")?.unwrap_or(2048);
        let n_ctx_orig = m.uint("rope.scaling.original_context_length")?.unwrap_or(n_ctx_train);

        let (window, local_layers, rope_base_local) = match spec.sliding_window {
            SlidingWindow::None => (None, vec![false; n_layer], rope_base),
            SlidingWindow::Pattern { pattern, default_window, default_local_base } => {
                let window = m.uint("attention.sliding_window")?.map(|w| w as u32).or(default_window).filter(|&w| w > 0);
                let local_base = m.float("rope.freq_base_swa")?.or(default_local_base).unwrap_or(rope_base);
                match window {
                    None => (None, vec![false; n_layer], rope_base),
                    Some(w) => {
                        let local = match file.get(&m.key("attention.sliding_window_pattern")) {
                            Some(Value::Array(ferrox_gguf::Array::Bool(v))) => {
                                if v.len() != n_layer {
                                    return Err(ModelError::BadMetadata {
                                        key: m.key("attention.sliding_window_pattern"),
                                        why: format!("{} entries for {n_layer} layers", v.len()),
                                    });
                                }
                                v.clone()
                            }
                            Some(Value::Array(_)) => {
                                return Err(ModelError::BadMetadata {
                                    key: m.key("attention.sliding_window_pattern"),
                                    why: "expected an integer or an array of bools".into(),
                                })
                            }
                            _ => {
                                let pat = m.uint("attention.sliding_window_pattern")?.unwrap_or(pattern as usize);
                                (0..n_layer).map(|l| pat == 0 || l % pat < pat - 1).collect()
                            }
                        };
                        (Some(w), local, local_base)
                    }
                }
            }
        };
        let attn_scale = match spec.attn_scale {
            AttnScale::HeadDim => 1.0 / (head_dim as f32).sqrt(),
            AttnScale::GemmaQueryPreAttn { embd_based_layers } if n_layer == embd_based_layers as usize => {
                1.0 / ((n_embd / n_head) as f32).sqrt()
            }
            AttnScale::GemmaQueryPreAttn { .. } => 1.0 / (head_dim as f32).sqrt(),
        };
        let declares_experts = spec.optional_roles.contains(&crate::arch::Role::FfnGateInp) && m.uint("expert_count")?.is_some_and(|n| n > 0);
        let ffn = if declares_experts { crate::arch::FfnLayout::Experts } else { spec.ffn };
        let experts = match ffn {
            crate::arch::FfnLayout::Experts => {
                let n_used = m.req_uint("expert_used_count")?;
                // Without the key, as llama.cpp reads it: a family of experts
                // (Qwen3-MoE, Qwen2-MoE) splits `feed_forward_length` over the
                // experts a token uses; Mixtral's experts are that wide.
                let n_ff_default = match spec.ffn {
                    crate::arch::FfnLayout::Experts => n_ff / n_used.max(1),
                    _ => n_ff,
                };
                let e = Experts {
                    n_expert: m.req_uint("expert_count")?,
                    n_used,
                    n_ff: m.uint("expert_feed_forward_length")?.unwrap_or(n_ff_default),
                    norm_weights: spec.moe_norm_weights,
                    scale: m.float("expert_weights_scale")?.filter(|&s| s != 0.0).unwrap_or(1.0),
                    gating: spec.moe_gating,
                    swiglu_oai: spec.experts_swiglu_oai,
                };
                for (key, v, max) in [("expert_count", e.n_expert, 4096), ("expert_feed_forward_length", e.n_ff, MAX_DIM)] {
                    if v == 0 || v > max {
                        return Err(ModelError::BadMetadata { key: m.key(key), why: format!("{v} is out of range 1..={max}") });
                    }
                }
                if e.n_used == 0 || e.n_used > e.n_expert {
                    return Err(ModelError::BadMetadata {
                        key: m.key("expert_used_count"),
                        why: format!("{} experts used of {}", e.n_used, e.n_expert),
                    });
                }
                e
            }
            _ => Experts::default(),
        };
        let n_ff_shared = match spec.block_roles.contains(&crate::arch::Role::FfnGateShexp) {
            true => {
                let v = m.uint("expert_shared_feed_forward_length")?.unwrap_or(n_ff);
                if v == 0 || v > MAX_DIM {
                    return Err(ModelError::BadMetadata {
                        key: m.key("expert_shared_feed_forward_length"),
                        why: format!("{v} is out of range 1..={MAX_DIM}"),
                    });
                }
                v
            }
            false => 0,
        };
        let attn_softcap = m.float("attn_logit_softcapping")?.or(spec.default_attn_softcap).filter(|&c| c != 0.0);
        let final_softcap = m.float("final_logit_softcapping")?.or(spec.default_final_softcap).filter(|&c| c != 0.0);
        Ok(ModelConfig {
            arch,
            name: file.get_str("general.name").ok().map(str::to_string),
            n_ctx_train,
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_rot,
            rms_eps,
            rope_base,
            rope_base_local,
            rope_freq_scale,
            rope_attn_factor,
            rope_yarn,
            n_ctx_orig,
            window,
            local_layers,
            attn_scale,
            attn_softcap,
            final_softcap,
            ffn,
            experts,
            n_ff_shared,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrox_gguf::GgufWriter;

    /// A Qwen2-MoE file's metadata with `extra` keys (no tensors).
    fn qwen2moe(extra: &[(&str, u32)]) -> Result<ModelConfig, ModelError> {
        let mut w = GgufWriter::new();
        w.set("general.architecture", Value::from("qwen2moe")).unwrap();
        for (k, v) in [("embedding_length", 64u32), ("block_count", 2), ("feed_forward_length", 96), ("attention.head_count", 4), ("expert_count", 8), ("expert_used_count", 3)]
            .iter()
            .chain(extra)
        {
            w.set(format!("qwen2moe.{k}"), Value::U32(*v)).unwrap();
        }
        w.set("qwen2moe.attention.layer_norm_rms_epsilon", Value::F32(1e-6)).unwrap();
        let file = GgufFile::from_bytes(&w.to_bytes()).unwrap();
        ModelConfig::from_gguf(&file, Arch::Qwen2Moe)
    }

    /// Qwen2-MoE's widths as llama.cpp reads them: without their keys the
    /// experts split `feed_forward_length` over the experts a token uses
    /// (96 / 3) and the shared expert is that whole width; with them, the
    /// keys; a shared width of 0 is refused by its key.
    #[test]
    fn qwen2moe_expert_and_shared_widths_follow_their_keys_or_llama_cpp_defaults() {
        let c = qwen2moe(&[]).unwrap();
        assert_eq!((c.experts.n_ff, c.n_ff_shared, c.experts.norm_weights), (32, 96, false));
        let c = qwen2moe(&[("expert_feed_forward_length", 16), ("expert_shared_feed_forward_length", 128)]).unwrap();
        assert_eq!((c.experts.n_ff, c.n_ff_shared), (16, 128));
        match qwen2moe(&[("expert_shared_feed_forward_length", 0)]) {
            Err(ModelError::BadMetadata { key, .. }) => assert_eq!(key, "qwen2moe.expert_shared_feed_forward_length"),
            other => panic!("{other:?}"),
        }
    }

    /// `rope.scaling.type`: `yarn` is taken (gpt-oss's files say it), with
    /// its factor as the position scale; a type ferrox does not run is a
    /// named refusal, not a silently unscaled RoPE.
    #[test]
    fn yarn_rope_scaling_is_read_and_unknown_types_are_refused() {
        let file = |ty: &str| {
            let mut w = GgufWriter::new();
            w.set("general.architecture", Value::from("gpt-oss")).unwrap();
            for (k, v) in [("embedding_length", 64u32), ("block_count", 2), ("feed_forward_length", 64), ("attention.head_count", 4), ("expert_count", 8), ("expert_used_count", 2)] {
                w.set(format!("gpt-oss.{k}"), Value::U32(v)).unwrap();
            }
            w.set("gpt-oss.attention.layer_norm_rms_epsilon", Value::F32(1e-5)).unwrap();
            w.set("gpt-oss.rope.scaling.type", Value::from(ty)).unwrap();
            w.set("gpt-oss.rope.scaling.factor", Value::F32(32.0)).unwrap();
            GgufFile::from_bytes(&w.to_bytes()).unwrap()
        };
        let c = ModelConfig::from_gguf(&file("yarn"), Arch::GptOss).unwrap();
        assert!(c.rope_yarn && c.rope_freq_scale == 1.0 / 32.0, "{c:?}");
        assert_eq!((c.experts.gating, c.experts.swiglu_oai), (crate::arch::MoeGating::SoftmaxAfterTopK, Some(crate::arch::SwigluOai::GPT_OSS)));
        let c = ModelConfig::from_gguf(&file("linear"), Arch::GptOss).unwrap();
        assert!(!c.rope_yarn);
        match ModelConfig::from_gguf(&file("longrope"), Arch::GptOss) {
            Err(ModelError::Unsupported { what }) => assert!(what.contains("longrope"), "{what}"),
            other => panic!("{other:?}"),
        }
    }
}
