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

use super::{AttnBlock, BackendError, DeviceBackend, FfnBlock, MoeBlock, QkvWeights, Route, Scratch, Staged};

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
    match w.sinks {
        Some(sinks) => be.attention_sinks(cache, w.layer, b, [&*s.q, &*s.k, &*s.v], s.attn, p, sinks),
        None => be.attention(cache, w.layer, b, [&*s.q, &*s.k, &*s.v], s.attn, p),
    }
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

/// The mixture-of-experts block: the residual add and norm, the router's
/// logits read back, [`route`] on the host (and, with a shared expert, its
/// gate's products read back: one more route per token), the routed
/// experts ([`DeviceBackend::moe_experts`]) into `s.o`, then the residual
/// add (or, with a post-norm, `s.o` left pending).
pub fn moe<B: DeviceBackend>(be: &B, n: usize, w: &MoeBlock<'_, B>, s: &mut Scratch<'_, B::Buf>) -> Result<(), BackendError> {
    let add = s.pending.then_some(&*s.o);
    be.add_rms_norm(s.x, add, w.norm, w.eps, s.cur)?;
    s.pending = false;
    let ne = w.experts.n_expert;
    be.matmul(w.router, s.cur, s.gate, n)?;
    let mut logits = vec![0.0f32; n * ne];
    be.read(s.gate, &mut logits)?;
    if let Some(b) = &w.biases {
        if b.router.len() != ne {
            return Err(BackendError(format!("a router bias of {} for {ne} experts", b.router.len())));
        }
        logits.chunks_exact_mut(ne).for_each(|row| row.iter_mut().zip(b.router).for_each(|(l, b)| *l += b));
    }
    let mut routes = route(&logits, &w.experts);
    if let Some(sh) = &w.shared {
        // The shared expert is one more route of every token: expert
        // `n_expert`, weighted by the sigmoid of its gate's product.
        be.matmul(sh.gate_inp, s.cur, s.gate, n)?;
        let mut g = vec![0.0f32; n];
        be.read(s.gate, &mut g)?;
        routes.extend(g.iter().enumerate().map(|(token, &v)| Route { token, expert: ne, weight: sigmoid(v) }));
    }
    be.moe_experts(w, s.cur, &routes, s.o)?;
    moe_out(be, w, s)
}

/// A mixture-of-experts block's output (in `s.o`) into the residual
/// stream: post-normed and left pending, or added into `x`.
pub fn moe_out<B: DeviceBackend>(be: &B, w: &MoeBlock<'_, B>, s: &mut Scratch<'_, B::Buf>) -> Result<(), BackendError> {
    match w.post_norm {
        Some(pn) => {
            be.rms_norm(s.o, pn, w.eps)?;
            s.pending = true;
        }
        None => be.add(s.x, s.o)?,
    }
    Ok(())
}

/// The logistic function, `1 / (1 + e^-x)` (llama.cpp's shared-expert
/// gate writes it `silu(x) / x`: the same value, except at 0).
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// Each token's experts, as llama.cpp's softmax gating picks them: the
/// softmax of the router's logits over all experts, the `n_used` most
/// probable (ties: the lower index), their probabilities — divided by their
/// sum where `x.norm_weights` (the sum clamped at f16's smallest normal, as
/// llama.cpp does), times `x.scale`. With [`MoeGating::SoftmaxAfterTopK`]
/// (gpt-oss) the softmax is over the chosen experts' logits alone (the
/// same choice: softmax keeps the order). `logits` is `[n_tokens, n_expert]`.
///
/// [`MoeGating::SoftmaxAfterTopK`]: crate::arch::MoeGating::SoftmaxAfterTopK
pub fn route(logits: &[f32], x: &crate::model::Experts) -> Vec<Route> {
    let (n_expert, n_used) = (x.n_expert, x.n_used);
    let mut routes = Vec::with_capacity(logits.len() / n_expert.max(1) * n_used);
    let mut order: Vec<usize> = Vec::with_capacity(n_expert);
    for (token, row) in logits.chunks_exact(n_expert.max(1)).enumerate() {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let e: Vec<f32> = row.iter().map(|&v| (v - max).exp()).collect();
        let z: f32 = e.iter().sum();
        order.clear();
        order.extend(0..n_expert);
        // Descending probability (after top-k softmax: logit, as llama.cpp
        // sorts each); NaN last; ties to the lower index.
        let key: &[f32] = match x.gating {
            crate::arch::MoeGating::Softmax => &e,
            crate::arch::MoeGating::SoftmaxAfterTopK => row,
        };
        order.sort_by(|&a, &b| key[b].partial_cmp(&key[a]).unwrap_or(std::cmp::Ordering::Equal).then(a.cmp(&b)));
        let chosen = &order[..n_used.min(n_expert)];
        #[cfg(test)]
        if let (Some(&last), Some(&next)) = (chosen.last(), order.get(n_used)) {
            margins::note(token, row[last] - row[next]);
        }
        if x.gating == crate::arch::MoeGating::SoftmaxAfterTopK {
            let top = chosen.iter().map(|&i| row[i]).fold(f32::NEG_INFINITY, f32::max);
            let w: Vec<f32> = chosen.iter().map(|&i| (row[i] - top).exp()).collect();
            let z: f32 = w.iter().sum();
            routes.extend(chosen.iter().zip(&w).map(|(&expert, &w)| Route { token, expert, weight: w / z * x.scale }));
            continue;
        }
        let sum = match x.norm_weights {
            true => chosen.iter().map(|&i| e[i] / z).sum::<f32>().max(6.103_515_6e-5),
            false => 1.0,
        };
        routes.extend(chosen.iter().map(|&expert| Route { token, expert, weight: e[expert] / z / sum * x.scale }));
    }
    routes
}

/// For tests: the smallest logit margin between the last expert [`route`]
/// chose and the first it passed over, per token of a batch, over all
/// layers. Where it is small another backend's rounding may route the token
/// the other way, and its output then differs by a whole expert's
/// contribution: the conformance tests' near-tie rule for experts.
#[cfg(test)]
pub(crate) mod margins {
    use std::cell::RefCell;

    thread_local! {
        static SEEN: RefCell<Option<Vec<f32>>> = const { RefCell::new(None) };
    }

    pub(crate) fn note(token: usize, margin: f32) {
        SEEN.with(|s| {
            if let Some(v) = s.borrow_mut().as_mut() {
                if v.len() <= token {
                    v.resize(token + 1, f32::INFINITY);
                }
                v[token] = v[token].min(margin);
            }
        })
    }

    /// `f`'s result and the margins of the routes taken on this thread
    /// while it ran (empty: nothing was routed).
    pub(crate) fn watch<R>(f: impl FnOnce() -> R) -> (R, Vec<f32>) {
        SEEN.with(|s| *s.borrow_mut() = Some(Vec::new()));
        let r = f();
        (r, SEEN.with(|s| s.borrow_mut().take().unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::route;
    use crate::model::Experts;

    /// Softmax, top-k and the weights normalized to one, against values
    /// worked by hand: logits [0, ln 3, ln 2, ln 6] give probabilities
    /// [1, 3, 2, 6] / 12; the top two are experts 3 and 1, weights 6/9, 3/9.
    #[test]
    fn routes_take_the_most_probable_experts_with_normalized_weights() {
        let l = [0.0f32, 3f32.ln(), 2f32.ln(), 6f32.ln(), 5.0, 5.0, 1.0, 5.0];
        let x = Experts { n_expert: 4, n_used: 2, n_ff: 1, norm_weights: true, scale: 1.0, ..Experts::default() };
        let r = route(&l, &x);
        assert_eq!(r.len(), 4);
        assert_eq!((r[0].token, r[0].expert, r[1].expert), (0, 3, 1));
        assert!((r[0].weight - 6.0 / 9.0).abs() < 1e-6 && (r[1].weight - 3.0 / 9.0).abs() < 1e-6, "{r:?}");
        // A three-way tie among experts 0, 1 and 3: the two lowest indices.
        assert_eq!((r[2].token, r[2].expert, r[3].expert), (1, 0, 1));
        assert!((r[2].weight - 0.5).abs() < 1e-6);
        // The margins: row 0 chose 3 and 1 over 2 (ln 3 - ln 2); row 1's
        // three-way tie leaves none.
        let (_, m) = super::margins::watch(|| route(&l, &x));
        assert!(m.len() == 2 && (m[0] - (3f32.ln() - 2f32.ln())).abs() < 1e-6 && m[1] == 0.0, "{m:?}");
        // Unnormalized (Qwen2-MoE): the softmax probabilities, times the scale.
        let r = route(&l[..4], &Experts { norm_weights: false, scale: 2.0, ..x });
        assert!((r[0].weight - 2.0 * 6.0 / 12.0).abs() < 1e-6 && (r[1].weight - 2.0 * 3.0 / 12.0).abs() < 1e-6, "{r:?}");
    }

    /// gpt-oss: top-k on the logits, then softmax over the chosen ones
    /// alone — for [0, ln 3, ln 2, ln 6], experts 3 and 1 weighted 6/9 and
    /// 3/9 (not the 6/12 and 3/12 of a softmax over all four), whatever
    /// `norm_weights` says. Logits far apart choose by value:
    /// [-200, -300, -100, -250] picks experts 2 and 0.
    #[test]
    fn softmax_after_top_k_weighs_the_chosen_experts_alone() {
        use crate::arch::MoeGating;
        let x = Experts { n_expert: 4, n_used: 2, n_ff: 1, norm_weights: false, scale: 1.0, gating: MoeGating::SoftmaxAfterTopK, swiglu_oai: None };
        let r = route(&[0.0f32, 3f32.ln(), 2f32.ln(), 6f32.ln()], &x);
        assert_eq!((r[0].expert, r[1].expert), (3, 1));
        assert!((r[0].weight - 6.0 / 9.0).abs() < 1e-6 && (r[1].weight - 3.0 / 9.0).abs() < 1e-6, "{r:?}");
        let r = route(&[-200.0f32, -300.0, -100.0, -250.0], &x);
        assert_eq!((r[0].expert, r[1].expert), (2, 0), "{r:?}");
        assert!((r[0].weight - 1.0).abs() < 1e-6 && r[1].weight < 1e-40, "{r:?}");
    }
}

#[cfg(test)]
mod plan_tests {
    use crate::arch::Arch;
    use crate::kernel_registry::Backend;

    /// A mixture of experts in the plan: a token reads its experts' share
    /// of each expert stack (2 of 8 here), on the CPU and on an accelerator
    /// with expert kernels; one without refuses the model before a weight
    /// is read, once, naming the way to run it.
    #[test]
    fn a_mixture_of_experts_plan_reads_the_routed_share_or_is_refused_without_kernels() {
        let path = std::env::temp_dir().join(format!("ferrox-moe-plan-{}.gguf", std::process::id()));
        crate::testing::tiny_arch_model(Arch::Qwen3Moe, 3).unwrap().write_to(&path).unwrap();
        let file = ferrox_gguf::GgufModel::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let p = crate::model::plan(&file, Backend::Cpu, None, "cpu".into()).unwrap();
        let stacks: Vec<_> = p.tensors.iter().filter(|t| t.name.contains("_exps.")).collect();
        assert_eq!(stacks.len(), 3 * 2, "three stacks a layer, two layers");
        let (ne, used, _) = crate::testing::TINY_EXPERTS;
        for t in &stacks {
            assert_eq!(t.bytes_per_token, t.bytes * used as u64 / ne as u64, "{}", t.name);
        }
        assert!(p.refused.is_empty(), "{:?}", p.refused);
        for &b in Backend::ALL.iter().filter(|b| b.is_accelerator()) {
            let p = crate::model::plan(&file, b, None, b.name().into()).unwrap();
            let stacks: Vec<_> = p.tensors.iter().filter(|t| t.name.contains("_exps.")).collect();
            match stacks.iter().all(|t| t.decode != "none") {
                // Expert kernels: the routed share, on the device.
                true => {
                    assert!(p.refused.is_empty(), "{b}: {:?}", p.refused);
                    for t in &stacks {
                        assert_eq!((t.backend, t.bytes_per_token), (b, t.bytes * used as u64 / ne as u64), "{b} {}", t.name);
                    }
                }
                false => {
                    assert_eq!(p.refused.len(), 1, "{b}: {:?}", p.refused);
                    assert!(p.refused[0].contains("mixture-of-experts") && p.refused[0].contains("--backend cpu"), "{}", p.refused[0]);
                }
            }
        }
        // CUDA runs the tiny model's Q8_0 stacks on its routed-experts int8
        // matvec (the grouped GEMM named for batches), and its router on
        // the f32 matvec at any batch size.
        let p = crate::model::plan(&file, Backend::Cuda, None, "cuda".into()).unwrap();
        for t in p.tensors.iter().filter(|t| t.name.contains("_exps.")) {
            let named = t.decode.contains("mmvq_id_q8_0") && t.decode.contains("mmq_id");
            assert!(named && t.prefill == t.decode, "{}: {} / {}", t.name, t.decode, t.prefill);
        }
        for t in p.tensors.iter().filter(|t| t.name.contains("ffn_gate_inp")) {
            assert!(t.decode.contains("matvec_f32") && t.prefill == t.decode, "{}: {} / {}", t.name, t.decode, t.prefill);
        }
    }

    /// gpt-oss in the plan: a token reads its experts' share of each stack
    /// and of each stack of expert biases; the CPU and Vulkan run it
    /// (Vulkan's plan names its sinks and biased experts' kernels), and
    /// every other accelerator (no sinks or gpt-oss's experts yet) refuses
    /// it before a weight is read, naming both and the way to run it.
    #[test]
    fn gpt_oss_reads_the_routed_share_and_is_refused_where_no_kernel_runs_it() {
        let path = std::env::temp_dir().join(format!("ferrox-gptoss-plan-{}.gguf", std::process::id()));
        crate::testing::tiny_arch_model(Arch::GptOss, 3).unwrap().write_to(&path).unwrap();
        let file = ferrox_gguf::GgufModel::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let p = crate::model::plan(&file, Backend::Cpu, None, "cpu".into()).unwrap();
        assert!(p.refused.is_empty() && p.unused.is_empty(), "{:?} / unused {:?}", p.refused, p.unused);
        let (ne, used, _) = crate::testing::TINY_EXPERTS;
        let routed: Vec<_> = p.tensors.iter().filter(|t| t.name.contains("_exps.")).collect();
        assert_eq!(routed.len(), 6 * 2, "three stacks and their biases a layer, two layers");
        for t in &routed {
            assert!(t.bytes > 0 && t.bytes_per_token == t.bytes * used as u64 / ne as u64, "{}: {} of {}", t.name, t.bytes_per_token, t.bytes);
        }
        for t in p.tensors.iter().filter(|t| t.name.contains("attn_sinks") || t.name.contains("ffn_gate_inp.bias")) {
            assert_eq!(t.bytes_per_token, t.bytes, "{}", t.name);
        }
        for &b in Backend::ALL.iter().filter(|b| b.is_accelerator()) {
            let p = crate::model::plan(&file, b, None, b.name().into()).unwrap();
            let all = p.refused.join("; ");
            if b == Backend::Vulkan {
                assert!(p.refused.is_empty(), "vulkan: {all}");
                for t in p.tensors.iter().filter(|t| t.name.contains("attn_sinks")) {
                    assert!(t.decode.starts_with("vulkan attention ") && t.prefill == t.decode, "{}: {}", t.name, t.decode);
                }
                for t in p.tensors.iter().filter(|t| t.name.contains("ffn_gate_inp.bias") || t.name.contains("_exps.bias")) {
                    assert!(t.decode.contains("bias rows") && t.decode.contains("clamped SwiGLU"), "{}: {}", t.name, t.decode);
                }
                continue;
            }
            assert!(all.contains("attention sinks") && all.contains("gpt-oss's mixture-of-experts") && all.contains("--backend cpu"), "{b}: {all}");
        }
    }

    /// Qwen2-MoE's shared expert in the plan: every token reads its matrices
    /// whole (the stacks beside them, their routed share); the CPU and
    /// Vulkan run it (Vulkan's plan names its kernel on the gate), and
    /// CUDA, with no shared-expert kernel yet, refuses the model before a
    /// weight is read, once, naming the way to run it.
    #[test]
    fn a_shared_expert_is_read_whole_per_token_and_refused_where_no_kernel_runs_it() {
        let path = std::env::temp_dir().join(format!("ferrox-shexp-plan-{}.gguf", std::process::id()));
        crate::testing::tiny_arch_model(Arch::Qwen2Moe, 3).unwrap().write_to(&path).unwrap();
        let file = ferrox_gguf::GgufModel::open(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        let p = crate::model::plan(&file, Backend::Cpu, None, "cpu".into()).unwrap();
        assert!(p.refused.is_empty(), "{:?}", p.refused);
        let shared: Vec<_> = p.tensors.iter().filter(|t| t.name.contains("_shexp.")).collect();
        assert_eq!(shared.len(), 4 * 2, "a gate and three matrices a layer, two layers");
        for t in &shared {
            assert!(t.bytes > 0 && t.bytes_per_token == t.bytes, "{}: {} of {} bytes a token", t.name, t.bytes_per_token, t.bytes);
        }
        let (ne, used, _) = crate::testing::TINY_EXPERTS;
        for t in p.tensors.iter().filter(|t| t.name.contains("_exps.")) {
            assert_eq!(t.bytes_per_token, t.bytes * used as u64 / ne as u64, "{}", t.name);
        }
        let p = crate::model::plan(&file, Backend::Cuda, None, "cuda".into()).unwrap();
        assert_eq!(p.refused.len(), 1, "{:?}", p.refused);
        let why = &p.refused[0];
        assert!(why.contains("mixture-of-experts shared expert") && why.contains("--backend cpu"), "{why}");
        // Vulkan runs it as one more route a token (the default block).
        let p = crate::model::plan(&file, Backend::Vulkan, None, "vulkan".into()).unwrap();
        assert!(p.refused.is_empty(), "{:?}", p.refused);
        for t in p.tensors.iter().filter(|t| t.name.contains("ffn_gate_inp_shexp")) {
            assert!(t.decode.contains("shared expert") && t.fallback.is_none(), "{}: {} ({:?})", t.name, t.decode, t.fallback);
        }
    }
}
