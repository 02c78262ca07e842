//! The blocks a model is made of, composed from the seam's primitive ops:
//! the defaults of [`DeviceBackend::attention_block`] and
//! [`DeviceBackend::ffn_block`], and the steps they are made of, which a
//! backend that fuses part of a block calls for the rest.
//!
//! The decision: one composition, written once. The model hands a backend
//! whole blocks; what a backend fuses is its own business (CUDA rotates
//! and stores the cache in the Q/K/V projection's epilogue, adds the output
//! projection into the residual stream in the matvec), and every backend
//! that fuses nothing gets these. Residual bookkeeping is [`Scratch`]'s
//! `pending`: a block output that is biased or normed before the residual
//! add waits in `o` for the next block's norm to add it.

use super::{AttnBlock, BackendError, DeviceBackend, FfnBlock, QkvWeights, Scratch, Staged};

/// The attention block: [`qkv`], then [`rope_attention`], then [`project`].
pub fn attention<B: DeviceBackend>(
    be: &B,
    cache: &mut B::Kv,
    b: Staged<'_, B::Indices>,
    w: &AttnBlock<'_, B>,
    s: &mut Scratch<'_, B::Buf>,
) -> Result<(), BackendError> {
    qkv(be, b.len(), w, s)?;
    rope_attention(be, cache, b, w, s)?;
    project(be, &w.projection(), b.len(), s, Input::Attn)
}

/// The residual add (of a pending output) and the block's norm into
/// `s.cur`, then the Q/K/V projections with their biases into `s.q`,
/// `s.k`, `s.v`.
pub fn qkv<B: DeviceBackend>(be: &B, n: usize, w: &AttnBlock<'_, B>, s: &mut Scratch<'_, B::Buf>) -> Result<(), BackendError> {
    let add = s.pending.then_some(&*s.o);
    be.add_rms_norm(s.x, add, w.norm, w.eps, s.cur)?;
    s.pending = false;
    match &w.qkv {
        QkvWeights::Fused(wqkv, bias) => {
            let buf = s.qkv.as_deref_mut().ok_or_else(|| BackendError("a fused Q/K/V projection without its buffer".into()))?;
            be.matmul(wqkv, s.cur, buf, n)?;
            if let Some(bias) = bias {
                be.add_bias(buf, bias, n)?;
            }
            let p = &w.attn;
            let (qd, kd, vd) = (p.n_head * p.head_dim, p.n_head_kv * p.head_dim, p.n_head_kv * p.head_dim_v);
            let width = qd + kd + vd;
            be.split_cols(buf, width, 0, s.q, qd)?;
            be.split_cols(buf, width, qd, s.k, kd)?;
            be.split_cols(buf, width, qd + kd, s.v, vd)?;
        }
        QkvWeights::Separate([wq, wk, wv], biases) => {
            be.matmul_many(s.cur, n, &mut [(*wq, &mut *s.q), (*wk, &mut *s.k), (*wv, &mut *s.v)])?;
            for (buf, bias) in [(&mut *s.q, biases[0]), (&mut *s.k, biases[1]), (&mut *s.v, biases[2])] {
                if let Some(bias) = bias {
                    be.add_bias(buf, bias, n)?;
                }
            }
        }
    }
    Ok(())
}

/// The per-head query and key norms (where the block has them), RoPE on
/// both, then attention over the cache into `s.attn`.
pub fn rope_attention<B: DeviceBackend>(
    be: &B,
    cache: &mut B::Kv,
    b: Staged<'_, B::Indices>,
    w: &AttnBlock<'_, B>,
    s: &mut Scratch<'_, B::Buf>,
) -> Result<(), BackendError> {
    let p = &w.attn;
    if let Some((qn, kn)) = w.qk_norm {
        be.rms_norm(s.q, qn, w.eps)?;
        be.rms_norm(s.k, kn, w.eps)?;
    }
    be.rope(s.q, b, p.n_head, p.head_dim, &w.rope, w.factors)?;
    be.rope(s.k, b, p.n_head_kv, p.head_dim, &w.rope, w.factors)?;
    be.attention(cache, w.layer, b, [&*s.q, &*s.k, &*s.v], s.attn, p)
}

/// Which scratch buffer a projection reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Attention's output.
    Attn,
    /// The gated activation.
    Hidden,
}

/// A block's output projection: the matrix, its bias and post-norm.
pub struct Projection<'a, B: DeviceBackend + ?Sized> {
    /// The matrix.
    pub w: &'a B::Matrix,
    /// Its bias.
    pub bias: Option<&'a B::Vector>,
    /// A norm of the output before the residual add.
    pub post_norm: Option<&'a B::Vector>,
    /// The norm's epsilon.
    pub eps: f32,
}

impl<'a, B: DeviceBackend> AttnBlock<'a, B> {
    /// The output projection.
    pub fn projection(&self) -> Projection<'a, B> {
        Projection { w: self.out, bias: self.out_bias, post_norm: self.post_norm, eps: self.eps }
    }
}

impl<'a, B: DeviceBackend> FfnBlock<'a, B> {
    /// The down projection.
    pub fn projection(&self) -> Projection<'a, B> {
        Projection { w: self.down, bias: None, post_norm: self.post_norm, eps: self.eps }
    }
}

impl<B: DeviceBackend> Projection<'_, B> {
    /// Whether the product goes straight into the residual stream (nothing
    /// to apply to it first).
    pub fn direct(&self) -> bool {
        self.bias.is_none() && self.post_norm.is_none()
    }
}

/// A block's output projection of `input`: added straight into the
/// residual stream `s.x`, or, with a bias or a post-norm to apply first,
/// left in `s.o` with `s.pending` set.
pub fn project<B: DeviceBackend>(be: &B, p: &Projection<'_, B>, n: usize, s: &mut Scratch<'_, B::Buf>, input: Input) -> Result<(), BackendError> {
    let x = match input {
        Input::Attn => &*s.attn,
        Input::Hidden => &*s.h,
    };
    be.matmul(p.w, x, s.o, n)?;
    if p.direct() {
        be.add(s.x, s.o)?;
        s.pending = false;
        return Ok(());
    }
    if let Some(bias) = p.bias {
        be.add_bias(s.o, bias, n)?;
    }
    if let Some(pn) = p.post_norm {
        be.rms_norm(s.o, pn, p.eps)?;
    }
    s.pending = true;
    Ok(())
}

/// The feed-forward block: [`ffn_hidden`], then [`project`] of `s.h`.
pub fn ffn<B: DeviceBackend>(be: &B, n: usize, w: &FfnBlock<'_, B>, s: &mut Scratch<'_, B::Buf>) -> Result<(), BackendError> {
    ffn_hidden(be, n, w, s)?;
    project(be, &w.projection(), n, s, Input::Hidden)
}

/// The residual add and norm, the gate and up projections and the gated
/// activation into `s.h`.
pub fn ffn_hidden<B: DeviceBackend>(be: &B, n: usize, w: &FfnBlock<'_, B>, s: &mut Scratch<'_, B::Buf>) -> Result<(), BackendError> {
    let add = s.pending.then_some(&*s.o);
    be.add_rms_norm(s.x, add, w.norm, w.eps, s.cur)?;
    s.pending = false;
    match w.gate {
        Some(wg) => {
            be.matmul_many(s.cur, n, &mut [(wg, &mut *s.gate), (w.up, &mut *s.up)])?;
            be.glu(w.act, s.gate, s.up, s.h)
        }
        None => {
            be.matmul(w.up, s.cur, s.up, n)?;
            be.glu_fused(w.act, s.up, s.h, w.n_ff)
        }
    }
}
