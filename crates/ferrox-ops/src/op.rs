//! The op vocabulary: how the decoder describes RoPE, attention and the
//! gated activation to a backend. The engine builds these from a model's
//! architecture and metadata; every device crate takes them as they are
//! (no device crate keeps a mirror of them to convert into).

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(2i, 2i+1)` (ggml's `NORM`, Llama).
    Interleaved,
    /// Halves `(i, i + n_rot/2)` (ggml's `NEOX`, Qwen, Gemma, Phi-3).
    Halves,
}

/// The feed-forward activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `silu(gate) * up`.
    SiluGated,
    /// `gelu_tanh(gate) * up` (Gemma).
    GeluGated,
}

/// How RoPE is applied to one layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeParams {
    /// Pairing of dimensions.
    pub style: RopeStyle,
    /// Dimensions rotated (the rest pass through).
    pub n_rot: usize,
    /// Frequency base.
    pub base: f32,
    /// Linear position scale (`1 / rope.scaling.factor`).
    pub freq_scale: f32,
    /// Magnitude scale of cos/sin (`rope.scaling.attn_factor`, 1 by default).
    pub attn_factor: f32,
}

/// How one layer attends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnParams {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (GQA: `n_head` is a multiple).
    pub n_head_kv: usize,
    /// Per-head dimension of keys and queries.
    pub head_dim: usize,
    /// Per-head dimension of values.
    pub head_dim_v: usize,
    /// Multiplier of `q·k`.
    pub scale: f32,
    /// `cap * tanh(s / cap)` on the scaled logits (Gemma 2).
    pub softcap: Option<f32>,
    /// Sliding window: a key at position `j` is visible from `i` when
    /// `i - j < window`.
    pub window: Option<u32>,
}

/// One RoPE launch: a layer's [`RopeParams`] over `n_heads` heads of
/// `head_dim`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeShape {
    /// Heads per token.
    pub n_heads: usize,
    /// Head size.
    pub head_dim: usize,
    /// The rotation.
    pub params: RopeParams,
}

impl RopeShape {
    /// `p` over `n_heads` heads of `head_dim`.
    pub fn new(n_heads: usize, head_dim: usize, p: &RopeParams) -> RopeShape {
        RopeShape { n_heads, head_dim, params: *p }
    }

    /// NeoX pairing (`i` with `i + n_rot/2`) rather than adjacent pairs.
    pub fn halves(&self) -> bool {
        self.params.style == RopeStyle::Halves
    }
}

/// One attention launch: a layer's [`AttnParams`], and whether every token
/// of the call is in one cache slot (a tensor-core prefill kernel shares
/// each staged key tile among a block's queries then).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnShape {
    /// The layer's attention.
    pub params: AttnParams,
    /// Every token of the call is in one cache slot.
    pub one_slot: bool,
}

impl AttnShape {
    /// `p` for a call whose tokens are in the cache slots `seq`.
    pub fn new(p: &AttnParams, seq: &[u32]) -> AttnShape {
        AttnShape { params: *p, one_slot: seq.iter().all(|&s| Some(&s) == seq.first()) }
    }
}
