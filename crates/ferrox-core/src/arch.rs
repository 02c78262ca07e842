//! Architectures as data: a role table and one spec row per architecture.
//!
//! The decision: a model family is not code. What differs between Llama,
//! Qwen, Phi and Gemma — which tensors exist, the RoPE layout, the
//! activation, the extra norms, softcaps, sliding windows, embedding
//! scaling — is a row of [`arch_table!`]; the one generic decoder
//! (`model::decoder`) reads the row. The tensors a file may hold are
//! [`tensor_roles!`]: each role names its GGUF pattern, whether it repeats
//! per block, and the op it feeds (which is what placement needs). A new
//! dense family is a row here plus whatever genuinely new op it brings.

use std::fmt;

/// Whether a tensor exists once per model or once per block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerClass {
    /// One per model (`token_embd.weight`).
    Global,
    /// One per block (`blk.N.attn_q.weight`).
    Block,
}

/// The operation a tensor feeds, which decides where it must be placed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feeds {
    /// Row lookup by token id.
    Embedding,
    /// A matrix product (the decode matvec and the prefill GEMM).
    Matmul,
    /// An element-wise weight of an RMS norm.
    Norm,
    /// A bias added after a matmul.
    Bias,
    /// Per-dimension RoPE frequency factors.
    RopeFactors,
    /// A mixture of experts' router (the expert logits of each token).
    Router,
    /// Experts' matrices stacked (`[cols, rows, n_expert]`): a product reads
    /// only the experts its tokens are routed to.
    Experts,
}

macro_rules! tensor_roles {
    ($(($role:ident, $suffix:literal, $class:ident, $feeds:ident, $doc:literal)),* $(,)?) => {
        /// A tensor's job in the model, independent of the architecture.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Role { $(#[doc = $doc] $role),* }

        impl Role {
            /// Every role, in table order.
            pub const ALL: &'static [Role] = &[$(Role::$role),*];

            /// The GGUF name without the `blk.N.` prefix.
            pub const fn suffix(self) -> &'static str {
                match self { $(Role::$role => $suffix),* }
            }

            /// Once per model or once per block.
            pub const fn class(self) -> LayerClass {
                match self { $(Role::$role => LayerClass::$class),* }
            }

            /// The op it feeds.
            pub const fn feeds(self) -> Feeds {
                match self { $(Role::$role => Feeds::$feeds),* }
            }
        }
    };
}

tensor_roles! {
    (TokenEmbd, "token_embd.weight", Global, Embedding, "Token embedding table (vocab x embd)."),
    (OutputNorm, "output_norm.weight", Global, Norm, "Final norm before the output head."),
    (Output, "output.weight", Global, Matmul, "Output head; absent when tied to the embedding."),
    (RopeFreqs, "rope_freqs.weight", Global, RopeFactors, "Llama 3.1+ RoPE frequency factors."),
    (RopeFactorsLong, "rope_factors_long.weight", Global, RopeFactors, "Phi-3 long-context RoPE factors."),
    (RopeFactorsShort, "rope_factors_short.weight", Global, RopeFactors, "Phi-3 short-context RoPE factors."),
    (AttnNorm, "attn_norm.weight", Block, Norm, "Norm before attention."),
    (AttnQ, "attn_q.weight", Block, Matmul, "Query projection."),
    (AttnK, "attn_k.weight", Block, Matmul, "Key projection."),
    (AttnV, "attn_v.weight", Block, Matmul, "Value projection."),
    (AttnQkv, "attn_qkv.weight", Block, Matmul, "Fused query/key/value projection (Phi-3)."),
    (AttnQBias, "attn_q.bias", Block, Bias, "Query bias (Qwen2)."),
    (AttnKBias, "attn_k.bias", Block, Bias, "Key bias (Qwen2)."),
    (AttnVBias, "attn_v.bias", Block, Bias, "Value bias (Qwen2)."),
    (AttnQkvBias, "attn_qkv.bias", Block, Bias, "Fused QKV bias."),
    (AttnQNorm, "attn_q_norm.weight", Block, Norm, "Per-head query norm (Gemma 3, Qwen3)."),
    (AttnKNorm, "attn_k_norm.weight", Block, Norm, "Per-head key norm (Gemma 3, Qwen3)."),
    (AttnOut, "attn_output.weight", Block, Matmul, "Attention output projection."),
    (AttnOutBias, "attn_output.bias", Block, Bias, "Attention output bias."),
    (AttnPostNorm, "post_attention_norm.weight", Block, Norm, "Norm after attention (Gemma 2/3)."),
    (FfnNorm, "ffn_norm.weight", Block, Norm, "Norm before the feed-forward block."),
    (FfnGate, "ffn_gate.weight", Block, Matmul, "Feed-forward gate projection."),
    (FfnUp, "ffn_up.weight", Block, Matmul, "Feed-forward up projection (gate and up fused on Phi-3)."),
    (FfnDown, "ffn_down.weight", Block, Matmul, "Feed-forward down projection."),
    (FfnPostNorm, "post_ffw_norm.weight", Block, Norm, "Norm after the feed-forward block (Gemma 2/3)."),
    (FfnGateInp, "ffn_gate_inp.weight", Block, Router, "Mixture of experts: the router (n_expert x embd)."),
    (FfnGateExps, "ffn_gate_exps.weight", Block, Experts, "Mixture of experts: the experts' gate projections."),
    (FfnUpExps, "ffn_up_exps.weight", Block, Experts, "Mixture of experts: the experts' up projections."),
    (FfnDownExps, "ffn_down_exps.weight", Block, Experts, "Mixture of experts: the experts' down projections."),
    (FfnGateInpShexp, "ffn_gate_inp_shexp.weight", Block, Router, "Mixture of experts: the shared expert's gate (one row: sigmoid of it scales the shared expert, Qwen2-MoE)."),
    (FfnGateShexp, "ffn_gate_shexp.weight", Block, Matmul, "Mixture of experts: the shared expert's gate projection (every token runs it)."),
    (FfnUpShexp, "ffn_up_shexp.weight", Block, Matmul, "Mixture of experts: the shared expert's up projection."),
    (FfnDownShexp, "ffn_down_shexp.weight", Block, Matmul, "Mixture of experts: the shared expert's down projection."),
    (AttnSinks, "attn_sinks.weight", Block, Bias, "Attention sinks: one learned logit per query head, added to its softmax's denominator (gpt-oss)."),
    (FfnGateInpBias, "ffn_gate_inp.bias", Block, Bias, "Mixture of experts: the router's bias (gpt-oss)."),
    (FfnGateExpsBias, "ffn_gate_exps.bias", Block, Bias, "Mixture of experts: each expert's gate bias (`[n_ff, n_expert]`, gpt-oss)."),
    (FfnUpExpsBias, "ffn_up_exps.bias", Block, Bias, "Mixture of experts: each expert's up bias (`[n_ff, n_expert]`, gpt-oss)."),
    (FfnDownExpsBias, "ffn_down_exps.bias", Block, Bias, "Mixture of experts: each expert's down bias (`[n_embd, n_expert]`, gpt-oss)."),
}

impl Role {
    /// The GGUF tensor name of this role (`layer` is ignored for globals).
    pub fn gguf_name(self, layer: usize) -> String {
        match self.class() {
            LayerClass::Global => self.suffix().to_string(),
            LayerClass::Block => format!("blk.{layer}.{}", self.suffix()),
        }
    }

    /// The role and layer a GGUF tensor name denotes, if any.
    pub fn parse(name: &str) -> Option<(Role, Option<usize>)> {
        if let Some(rest) = name.strip_prefix("blk.") {
            let (n, suffix) = rest.split_once('.')?;
            let layer = n.parse().ok()?;
            let role = Role::ALL
                .iter()
                .find(|r| r.class() == LayerClass::Block && r.suffix() == suffix)?;
            return Some((*role, Some(layer)));
        }
        let role = Role::ALL
            .iter()
            .find(|r| r.class() == LayerClass::Global && r.suffix() == name)?;
        Some((*role, None))
    }
}

impl Role {
    /// Whether this role is a stack of per-expert biases (one row per
    /// expert): a token reads only its experts' rows, as of the stacks.
    pub const fn expert_bias(self) -> bool {
        matches!(self, Role::FfnGateExpsBias | Role::FfnUpExpsBias | Role::FfnDownExpsBias)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.suffix())
    }
}

/// RoPE's pairing and the gated activation are the op vocabulary every
/// backend takes (`ferrox_ops`); a spec row names them.
pub use ferrox_ops::{Activation, RopeStyle};

/// How the gate and up projections are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnLayout {
    /// `ffn_gate` and `ffn_up` as two matrices.
    Separate,
    /// One `ffn_up` of `2 * n_ff` rows: gate first, then up (Phi-3).
    FusedGateUp,
    /// A mixture of experts: a router picks `expert_used_count` of
    /// `expert_count` experts per token by softmax and top-k (their weights
    /// normalized where the row says), each a gated FFN of
    /// `expert_feed_forward_length` (else `feed_forward_length`).
    Experts,
}

/// How a mixture of experts turns a token's router logits into its
/// experts' weights.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum MoeGating {
    /// Softmax over every expert, then the top `n_used` probabilities
    /// (Mixtral, Qwen-MoE; llama.cpp's `SOFTMAX`).
    #[default]
    Softmax,
    /// The top `n_used` logits, then softmax over those alone (gpt-oss;
    /// llama.cpp's `SOFTMAX_WEIGHT`).
    SoftmaxAfterTopK,
}

/// gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): with `g = min(gate,
/// limit)` and `u = clamp(up, -limit, limit)`, `g * sigmoid(alpha * g) *
/// (u + 1)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SwigluOai {
    /// The sigmoid's slope (1.702).
    pub alpha: f32,
    /// The clamp (7.0).
    pub limit: f32,
}

impl SwigluOai {
    /// gpt-oss's constants, as llama.cpp hard-codes them.
    pub const GPT_OSS: SwigluOai = SwigluOai { alpha: 1.702, limit: 7.0 };

    /// One element.
    #[inline]
    pub fn apply(self, gate: f32, up: f32) -> f32 {
        let x = gate.min(self.limit);
        let y = up.clamp(-self.limit, self.limit);
        x / (1.0 + (self.alpha * -x).exp()) * (y + 1.0)
    }
}

/// Which layers use a sliding attention window, and their RoPE base.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SlidingWindow {
    /// Every layer attends to the whole context.
    None,
    /// When the file has `attention.sliding_window`, every layer except each
    /// `pattern`-th (`layer % pattern == pattern - 1`) is local, unless the
    /// file gives its own `attention.sliding_window_pattern`.
    Pattern {
        /// Default period of global layers.
        pattern: u32,
        /// Window when the file has none (`None`: no window without the key).
        default_window: Option<u32>,
        /// RoPE base of local layers when the file has no `rope.freq_base_swa`:
        /// `None` means the global base.
        default_local_base: Option<f32>,
    },
}

/// How the attention logits are scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnScale {
    /// `1 / sqrt(head_dim)`.
    HeadDim,
    /// Gemma: `1 / sqrt(head_dim)`, except the 27B models (`n_layer` listed
    /// here) which use `1 / sqrt(n_embd / n_head)`.
    GemmaQueryPreAttn {
        /// Block counts of the models that use the embedding-based scale.
        embd_based_layers: u32,
    },
}

/// One architecture, as data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ArchSpec {
    /// `general.architecture`.
    pub name: &'static str,
    /// RoPE pairing.
    pub rope: RopeStyle,
    /// Feed-forward activation.
    pub activation: Activation,
    /// Gate/up storage.
    pub ffn: FfnLayout,
    /// Multiply the embeddings by `sqrt(n_embd)`.
    pub scale_embeddings: bool,
    /// Per-head RMS norms on Q and K before RoPE.
    pub qk_norm: bool,
    /// RMS norms after attention and after the feed-forward block.
    pub post_norms: bool,
    /// Sliding-window layers.
    pub sliding_window: SlidingWindow,
    /// Attention logit scaling.
    pub attn_scale: AttnScale,
    /// Attention logit softcap when the file does not say.
    pub default_attn_softcap: Option<f32>,
    /// Final logit softcap when the file does not say.
    pub default_final_softcap: Option<f32>,
    /// A mixture of experts (where the FFN is one): whether each token's
    /// routing weights are normalized to sum to one (Mixtral, Qwen3-MoE) or
    /// kept as the softmax gave them (Qwen2-MoE).
    pub moe_norm_weights: bool,
    /// A mixture of experts: softmax before or after the top-k.
    pub moe_gating: MoeGating,
    /// A mixture of experts whose experts use gpt-oss's clamped SwiGLU
    /// instead of `activation` (and add their biases).
    pub experts_swiglu_oai: Option<SwigluOai>,
    /// The norm before the feed-forward block: `ffn_norm` (most), or
    /// `post_attention_norm` (gpt-oss names it so; it has no post-norms).
    pub ffn_norm: Role,
    /// Roles that must be present in every block (beyond the universal ones).
    pub block_roles: &'static [Role],
    /// Roles that may be present (biases, optional factors).
    pub optional_roles: &'static [Role],
}

const BASE_BLOCK: &[Role] = &[Role::AttnNorm, Role::AttnOut];
const QKV: &[Role] = &[Role::AttnQ, Role::AttnK, Role::AttnV];

macro_rules! arch_table {
    ($(($variant:ident, $name:literal, $spec:expr)),* $(,)?) => {
        /// A supported architecture.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Arch { $(#[doc = $name] $variant),* }

        impl Arch {
            /// Every supported architecture, in table order.
            pub const ALL: &'static [Arch] = &[$(Arch::$variant),*];

            /// Its row.
            pub fn spec(self) -> &'static ArchSpec {
                match self { $(Arch::$variant => { const S: ArchSpec = $spec; &S }),* }
            }

            /// The architecture `general.architecture` names, if supported.
            pub fn from_name(name: &str) -> Option<Arch> {
                match name { $($name => Some(Arch::$variant),)* _ => None }
            }
        }
    };
}

const LLAMA_LIKE: ArchSpec = ArchSpec {
    name: "llama",
    rope: RopeStyle::Interleaved,
    activation: Activation::SiluGated,
    ffn: FfnLayout::Separate,
    scale_embeddings: false,
    qk_norm: false,
    post_norms: false,
    sliding_window: SlidingWindow::None,
    attn_scale: AttnScale::HeadDim,
    default_attn_softcap: None,
    default_final_softcap: None,
    moe_norm_weights: true,
    moe_gating: MoeGating::Softmax,
    experts_swiglu_oai: None,
    ffn_norm: Role::FfnNorm,
    block_roles: &[Role::AttnQ, Role::AttnK, Role::AttnV, Role::FfnGate, Role::FfnUp, Role::FfnDown],
    // A Llama file with `expert_count` is a mixture of experts (Mixtral):
    // the expert stacks instead of the dense FFN (see `ModelConfig::ffn`).
    optional_roles: &[
        Role::AttnQBias,
        Role::AttnKBias,
        Role::AttnVBias,
        Role::AttnOutBias,
        Role::Output,
        Role::RopeFreqs,
        Role::FfnGateInp,
        Role::FfnGateExps,
        Role::FfnUpExps,
        Role::FfnDownExps,
    ],
};

arch_table! {
    (Llama, "llama", LLAMA_LIKE),
    (Qwen2, "qwen2", ArchSpec {
        name: "qwen2",
        rope: RopeStyle::Halves,
        block_roles: &[Role::AttnQ, Role::AttnK, Role::AttnV, Role::FfnGate, Role::FfnUp, Role::FfnDown,
                       Role::AttnQBias, Role::AttnKBias, Role::AttnVBias],
        optional_roles: &[Role::Output],
        ..LLAMA_LIKE
    }),
    (Qwen3, "qwen3", ArchSpec {
        name: "qwen3",
        rope: RopeStyle::Halves,
        qk_norm: true,
        block_roles: &[Role::AttnQ, Role::AttnK, Role::AttnV, Role::FfnGate, Role::FfnUp, Role::FfnDown,
                       Role::AttnQNorm, Role::AttnKNorm],
        optional_roles: &[Role::Output],
        ..LLAMA_LIKE
    }),
    (Qwen3Moe, "qwen3moe", ArchSpec {
        name: "qwen3moe",
        rope: RopeStyle::Halves,
        qk_norm: true,
        ffn: FfnLayout::Experts,
        block_roles: &[Role::AttnQ, Role::AttnK, Role::AttnV, Role::AttnQNorm, Role::AttnKNorm,
                       Role::FfnGateInp, Role::FfnGateExps, Role::FfnUpExps, Role::FfnDownExps],
        optional_roles: &[Role::Output],
        ..LLAMA_LIKE
    }),
    // Qwen1.5-MoE, Qwen2-57B-A14B: routed experts whose softmax weights
    // are not normalized, plus a shared expert every token runs, scaled by
    // the sigmoid of its own one-row gate; Q/K/V biases as Qwen2.
    (Qwen2Moe, "qwen2moe", ArchSpec {
        name: "qwen2moe",
        rope: RopeStyle::Halves,
        ffn: FfnLayout::Experts,
        moe_norm_weights: false,
        block_roles: &[Role::AttnQ, Role::AttnK, Role::AttnV,
                       Role::FfnGateInp, Role::FfnGateExps, Role::FfnUpExps, Role::FfnDownExps,
                       Role::FfnGateInpShexp, Role::FfnGateShexp, Role::FfnUpShexp, Role::FfnDownShexp],
        optional_roles: &[Role::Output, Role::AttnQBias, Role::AttnKBias, Role::AttnVBias],
        ..LLAMA_LIKE
    }),
    // gpt-oss: experts (top-k on the biased router logits, then softmax
    // over those k) with biases and the clamped SwiGLU; attention with
    // Q/K/V/O biases and a learned sink logit per head; even layers slide
    // over a window, odd ones see everything; NeoX RoPE (YaRN where the
    // file says). Its pre-FFN norm is stored as `post_attention_norm`.
    (GptOss, "gpt-oss", ArchSpec {
        name: "gpt-oss",
        rope: RopeStyle::Halves,
        ffn: FfnLayout::Experts,
        moe_norm_weights: false,
        moe_gating: MoeGating::SoftmaxAfterTopK,
        experts_swiglu_oai: Some(SwigluOai::GPT_OSS),
        ffn_norm: Role::AttnPostNorm,
        sliding_window: SlidingWindow::Pattern {
            pattern: 2, default_window: None, default_local_base: None,
        },
        block_roles: &[Role::AttnQ, Role::AttnK, Role::AttnV, Role::AttnOutBias, Role::AttnSinks,
                       Role::FfnGateInp, Role::FfnGateExps, Role::FfnUpExps, Role::FfnDownExps,
                       Role::FfnGateInpBias, Role::FfnGateExpsBias, Role::FfnUpExpsBias, Role::FfnDownExpsBias],
        optional_roles: &[Role::Output, Role::AttnQBias, Role::AttnKBias, Role::AttnVBias],
        ..LLAMA_LIKE
    }),
    (Phi3, "phi3", ArchSpec {
        name: "phi3",
        rope: RopeStyle::Halves,
        ffn: FfnLayout::FusedGateUp,
        // Fused or separate QKV: the loader accepts either (see `qkv_roles`).
        block_roles: &[Role::FfnUp, Role::FfnDown],
        optional_roles: &[Role::Output, Role::RopeFactorsLong, Role::RopeFactorsShort,
                          Role::AttnQkvBias, Role::AttnOutBias],
        ..LLAMA_LIKE
    }),
    (Gemma2, "gemma2", ArchSpec {
        name: "gemma2",
        rope: RopeStyle::Halves,
        activation: Activation::GeluGated,
        scale_embeddings: true,
        post_norms: true,
        sliding_window: SlidingWindow::Pattern {
            pattern: 2, default_window: Some(4096), default_local_base: None,
        },
        attn_scale: AttnScale::GemmaQueryPreAttn { embd_based_layers: 46 },
        default_attn_softcap: Some(50.0),
        default_final_softcap: Some(30.0),
        block_roles: &[Role::AttnQ, Role::AttnK, Role::AttnV, Role::FfnGate, Role::FfnUp, Role::FfnDown,
                       Role::AttnPostNorm, Role::FfnPostNorm],
        optional_roles: &[],
        ..LLAMA_LIKE
    }),
    (Gemma3, "gemma3", ArchSpec {
        name: "gemma3",
        rope: RopeStyle::Halves,
        activation: Activation::GeluGated,
        scale_embeddings: true,
        qk_norm: true,
        post_norms: true,
        sliding_window: SlidingWindow::Pattern {
            pattern: 6, default_window: None, default_local_base: Some(10_000.0),
        },
        attn_scale: AttnScale::GemmaQueryPreAttn { embd_based_layers: 62 },
        block_roles: &[Role::AttnQ, Role::AttnK, Role::AttnV, Role::FfnGate, Role::FfnUp, Role::FfnDown,
                       Role::AttnQNorm, Role::AttnKNorm, Role::AttnPostNorm, Role::FfnPostNorm],
        optional_roles: &[Role::Output],
        ..LLAMA_LIKE
    }),
}

impl Arch {
    /// The roles every block of this architecture must have.
    pub fn required_block_roles(self) -> impl Iterator<Item = Role> {
        BASE_BLOCK.iter().chain([&self.spec().ffn_norm]).chain(self.spec().block_roles).copied()
    }

    /// Whether a file tensor of `role` belongs to this architecture.
    pub fn accepts(self, role: Role) -> bool {
        let s = self.spec();
        matches!(role, Role::TokenEmbd | Role::OutputNorm)
            || BASE_BLOCK.contains(&role)
            || role == s.ffn_norm
            || s.block_roles.contains(&role)
            || s.optional_roles.contains(&role)
            || (self == Arch::Phi3 && (QKV.contains(&role) || role == Role::AttnQkv))
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.spec().name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_role_name_parses_back_to_its_role() {
        for &r in Role::ALL {
            let name = r.gguf_name(7);
            let want = match r.class() {
                LayerClass::Global => None,
                LayerClass::Block => Some(7),
            };
            assert_eq!(Role::parse(&name), Some((r, want)), "{name}");
        }
        assert_eq!(Role::parse("blk.x.attn_q.weight"), None);
        assert_eq!(Role::parse("blk.3.attn_qq.weight"), None);
        assert_eq!(Role::parse("attn_q.weight"), None);
    }

    /// ggml's `swiglu_oai` by hand (f64): the gate clamped above at 7 only,
    /// the up both ways, then `g * sigmoid(1.702 g) * (u + 1)`.
    #[test]
    fn swiglu_oai_clamps_the_gate_above_and_the_up_both_ways() {
        let want = |g: f64, u: f64| g / (1.0 + (-1.702 * g).exp()) * (u + 1.0);
        let oai = SwigluOai::GPT_OSS;
        for (g, u, wg, wu) in [(0.5, -0.25, 0.5, -0.25), (10.0, 9.0, 7.0, 7.0), (-12.0, -9.0, -12.0, -7.0), (7.5, -30.0, 7.0, -7.0), (-1.0, 3.0, -1.0, 3.0)] {
            let got = oai.apply(g as f32, u as f32) as f64;
            let w = want(wg, wu);
            assert!((got - w).abs() <= 1e-5 * w.abs().max(1.0), "swiglu_oai({g}, {u}) = {got}, want {w}");
        }
    }

    /// gpt-oss's row: its norm before the FFN is `post_attention_norm`
    /// (required, and accepted), never `ffn_norm`; sinks and the expert
    /// biases are required.
    #[test]
    fn gpt_oss_reads_post_attention_norm_as_its_ffn_norm() {
        let a = Arch::from_name("gpt-oss").unwrap();
        let req: Vec<Role> = a.required_block_roles().collect();
        assert!(req.contains(&Role::AttnPostNorm) && !req.contains(&Role::FfnNorm), "{req:?}");
        assert!(!a.accepts(Role::FfnNorm));
        for r in [Role::AttnSinks, Role::AttnOutBias, Role::FfnGateInpBias, Role::FfnGateExpsBias, Role::FfnUpExpsBias, Role::FfnDownExpsBias] {
            assert!(req.contains(&r), "{r}");
        }
        assert!(Arch::Llama.required_block_roles().any(|r| r == Role::FfnNorm));
    }

    #[test]
    fn every_arch_name_round_trips_and_unknown_names_are_refused() {
        for &a in Arch::ALL {
            assert_eq!(Arch::from_name(a.spec().name), Some(a));
        }
        assert_eq!(Arch::from_name("mamba"), None);
    }

    #[test]
    fn every_required_role_is_accepted_and_per_block() {
        for &a in Arch::ALL {
            for r in a.required_block_roles() {
                assert!(a.accepts(r), "{a} requires {r} but does not accept it");
                assert_eq!(r.class(), LayerClass::Block, "{a}: {r}");
            }
        }
    }
}
