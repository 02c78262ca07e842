//! Loading a model onto a backend, and the one generic decoder.
//!
//! The decision: loading is *total* and happens once. Every tensor the
//! architecture needs is found, shape-checked against the metadata and
//! placed on the backend before the first token; every file tensor the
//! architecture does not use is reported in the plan, not dropped silently.
//! [`Model::forward`] is written once, over [`DeviceBackend`], and reads the
//! architecture's [`ArchSpec`](crate::arch::ArchSpec) for everything that
//! differs between families.

mod config;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub use config::{Experts, ModelConfig};
use ferrox_gguf::{GgufError, GgufModel, ModelTensor};

use crate::arch::{Arch, FfnLayout, Role};
use crate::backend::{AttnBlock, AttnParams, BackendError, Batch, DeviceBackend, ExpertBiases, FfnBlock, HostTensor, MoeBlock, QkvWeights, RopeParams, Scratch, SharedExpert, Staged};
use crate::kernel_registry::{Backend, KernelPlan, Placement};

/// Why a model cannot be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The container is unreadable.
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// `general.architecture` names a family ferrox does not run.
    #[error("unsupported architecture {name:?} (supported: {supported})")]
    UnsupportedArch {
        /// What the file says.
        name: String,
        /// What ferrox runs.
        supported: String,
    },
    /// A feature of this file that ferrox does not implement.
    #[error("unsupported model feature: {what}")]
    Unsupported {
        /// The feature.
        what: String,
    },
    /// A required metadata key is absent.
    #[error("missing metadata key {key:?}")]
    MissingMetadata {
        /// The key.
        key: String,
    },
    /// A metadata value that cannot be right.
    #[error("bad metadata {key:?}: {why}")]
    BadMetadata {
        /// The key.
        key: String,
        /// What is wrong.
        why: String,
    },
    /// A tensor the architecture needs is absent.
    #[error("missing tensor {name:?} (needed by {arch})")]
    MissingTensor {
        /// Its name.
        name: String,
        /// The architecture.
        arch: Arch,
    },
    /// A tensor whose shape disagrees with the metadata.
    #[error("tensor {name:?} has shape {got:?}, expected {expected:?}")]
    TensorShape {
        /// Its name.
        name: String,
        /// Dimensions from the metadata.
        expected: Vec<u64>,
        /// Dimensions in the file.
        got: Vec<u64>,
    },
    /// A batch the model cannot run (bad ids, positions, sizes).
    #[error("invalid batch: {0}")]
    Batch(String),
    /// A backend failure.
    #[error("backend: {0}")]
    Backend(#[from] BackendError),
}

/// One block's weights. `None` for roles this architecture or file lacks.
struct LayerWeights<B: DeviceBackend> {
    attn_norm: B::Vector,
    q: Option<B::Matrix>,
    k: Option<B::Matrix>,
    v: Option<B::Matrix>,
    qkv: Option<B::Matrix>,
    q_bias: Option<B::Vector>,
    k_bias: Option<B::Vector>,
    v_bias: Option<B::Vector>,
    qkv_bias: Option<B::Vector>,
    q_norm: Option<B::Vector>,
    k_norm: Option<B::Vector>,
    out: B::Matrix,
    out_bias: Option<B::Vector>,
    post_attn_norm: Option<B::Vector>,
    ffn_norm: B::Vector,
    gate: Option<B::Matrix>,
    up: Option<B::Matrix>,
    down: Option<B::Matrix>,
    post_ffn_norm: Option<B::Vector>,
    /// A mixture of experts' router and experts (instead of gate/up/down).
    experts: Option<[B::Matrix; 4]>,
    /// Its shared expert: the one-row gate, then gate, up and down.
    shared: Option<[B::Matrix; 4]>,
    /// Attention sinks, one logit per query head (gpt-oss).
    sinks: Option<B::Vector>,
    /// The experts' gate, up and down biases (gpt-oss).
    expert_biases: Option<[B::Vector; 3]>,
    /// The router's bias, on the host where routing happens (gpt-oss).
    router_bias: Option<Vec<f32>>,
}

/// A loaded model: configuration, placed weights, and the placement plan.
pub struct Model<B: DeviceBackend> {
    config: ModelConfig,
    file: Arc<GgufModel>,
    backend: B,
    n_vocab: usize,
    embd: B::Matrix,
    output: Option<B::Matrix>,
    output_norm: B::Vector,
    rope_freqs: Option<B::Vector>,
    rope_long: Option<B::Vector>,
    rope_short: Option<B::Vector>,
    /// YaRN's frequency factors for the global and the local RoPE base.
    yarn: Option<[B::Vector; 2]>,
    layers: Vec<LayerWeights<B>>,
    plan: KernelPlan,
    /// The first rows of the head, when [`Model::trim_head`] narrowed the logits.
    head_prefix: Option<(B::Matrix, usize)>,
}

/// Per-sequence state on the backend: the KV cache and its size, and the
/// activation buffers of recent batch sizes, kept so that a decode step
/// allocates nothing.
pub struct Context<B: DeviceBackend> {
    kv: B::Kv,
    n_ctx: usize,
    n_slots: usize,
    acts: Vec<Acts<B>>,
    heads: Vec<Head<B::Buf>>,
    /// Unique in the process: with the buffers' ids, the key of a recorded
    /// decode step ([`DeviceBackend::run_recorded`]).
    id: u64,
}

/// Ids of contexts and of their activation buffers, never reused, so a
/// recorded step is only ever replayed over the buffers it was recorded on.
fn next_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// Activation buffers kept per context, for this many recent batch sizes
/// (decode's 1 and a prefill chunk's size) and output row counts.
const KEPT_SHAPES: usize = 2;

/// The activations of one forward pass of `n` tokens, and the device's
/// copy of its index lists.
struct Acts<B: DeviceBackend> {
    n: usize,
    id: u64,
    idx: B::Indices,
    x: B::Buf,
    cur: B::Buf,
    q: B::Buf,
    k: B::Buf,
    v: B::Buf,
    attn: B::Buf,
    o: B::Buf,
    gate: B::Buf,
    up: B::Buf,
    h: B::Buf,
    qkv: Option<B::Buf>,
}

/// The output head's input (the normed hidden states) and logits for
/// `rows` tokens; no logits when the pass wants the hidden states only.
struct Head<Buf> {
    rows: usize,
    id: u64,
    xo: Buf,
    logits: Option<Buf>,
}

/// Takes the entry of `v` that `matches`, or makes one; [`keep`] puts it back.
fn take<T, E>(v: &mut Vec<T>, matches: impl Fn(&T) -> bool, make: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    match v.iter().position(matches) {
        Some(i) => Ok(v.remove(i)),
        None => make(),
    }
}

/// Returns an entry as the most recent, forgetting the oldest beyond [`KEPT_SHAPES`].
fn keep<T>(v: &mut Vec<T>, t: T) {
    v.push(t);
    if v.len() > KEPT_SHAPES {
        v.remove(0);
    }
}

impl<B: DeviceBackend> Context<B> {
    /// Positions per sequence slot.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Sequence slots.
    pub fn n_slots(&self) -> usize {
        self.n_slots
    }
}

/// The architecture a file declares, or a clear error naming it.
pub fn arch_of(file: &ferrox_gguf::GgufFile) -> Result<Arch, ModelError> {
    let name = file.get_str("general.architecture")?;
    Arch::from_name(name).ok_or_else(|| ModelError::UnsupportedArch {
        name: name.to_string(),
        supported: Arch::ALL.iter().map(|a| a.spec().name).collect::<Vec<_>>().join(", "),
    })
}

/// The RoPE position scale of sliding-window layers: the global one, unless
/// the architecture gives them their own base (then unscaled).
fn local_freq_scale(c: &ModelConfig) -> f32 {
    match c.arch.spec().sliding_window {
        crate::arch::SlidingWindow::Pattern { default_local_base: None, .. } => c.rope_freq_scale,
        _ => 1.0,
    }
}

/// YaRN as per-pair RoPE frequency factors (RoPE divides each pair's angle
/// by its factor), for RoPE base `base` and position scale `scale`. ggml's
/// `rope_yarn` mixes the interpolated angle (`scale * θ`) and the
/// extrapolated one (`θ`) by a ramp over the pairs, 1 (all extrapolated)
/// up to the pair that turns `beta_fast` = 32 times in the original
/// context, 0 (all interpolated) from the one that turns `beta_slow` = 1
/// time (`ggml_rope_yarn_corr_dims`; llama.cpp takes both betas as these
/// defaults): `θ · (scale · (1 − mix) + mix)`, so the factor is
/// `1 / (scale · (1 − mix) + mix)` — exactly 1 and `1 / scale` at the ends.
pub fn yarn_factors(c: &ModelConfig, base: f32, scale: f32) -> Vec<f32> {
    let n_dims = c.n_rot as f32;
    let corr = |beta: f32| n_dims * (c.n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln() / (2.0 * base.ln());
    let low = corr(32.0).floor().max(0.0);
    let high = corr(1.0).ceil().min(n_dims - 1.0);
    (0..c.n_rot / 2)
        .map(|i| {
            let y = (i as f32 - low) / (high - low).max(0.001);
            let mix = 1.0 - y.clamp(0.0, 1.0);
            1.0 / (scale * (1.0 - mix) + mix)
        })
        .collect()
}

/// The dimensions `role` must have (ggml order), from the configuration.
fn expected_dims(c: &ModelConfig, role: Role, n_vocab: usize) -> Vec<u64> {
    let (e, q, kv, kvv) = (c.n_embd, c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.n_head_kv * c.head_dim_v);
    let d = |v: &[usize]| v.iter().map(|&x| x as u64).collect();
    match role {
        Role::TokenEmbd | Role::Output => d(&[e, n_vocab]),
        Role::OutputNorm | Role::AttnNorm | Role::FfnNorm | Role::AttnPostNorm | Role::FfnPostNorm => d(&[e]),
        Role::RopeFreqs | Role::RopeFactorsLong | Role::RopeFactorsShort => d(&[c.n_rot / 2]),
        Role::AttnQ => d(&[e, q]),
        Role::AttnK => d(&[e, kv]),
        Role::AttnV => d(&[e, kvv]),
        Role::AttnQkv => d(&[e, q + kv + kvv]),
        Role::AttnQBias => d(&[q]),
        Role::AttnKBias => d(&[kv]),
        Role::AttnVBias => d(&[kvv]),
        Role::AttnQkvBias => d(&[q + kv + kvv]),
        Role::AttnQNorm | Role::AttnKNorm => d(&[c.head_dim]),
        Role::AttnOut => d(&[c.n_head * c.head_dim_v, e]),
        Role::AttnOutBias => d(&[e]),
        Role::FfnGate | Role::FfnUp if c.ffn == FfnLayout::FusedGateUp => d(&[e, 2 * c.n_ff]),
        Role::FfnGate | Role::FfnUp => d(&[e, c.n_ff]),
        Role::FfnDown => d(&[c.n_ff, e]),
        Role::FfnGateInp => d(&[e, c.experts.n_expert]),
        Role::FfnGateExps | Role::FfnUpExps => d(&[e, c.experts.n_ff, c.experts.n_expert]),
        Role::FfnDownExps => d(&[c.experts.n_ff, e, c.experts.n_expert]),
        Role::FfnGateInpShexp => d(&[e]),
        Role::FfnGateShexp | Role::FfnUpShexp => d(&[e, c.n_ff_shared]),
        Role::FfnDownShexp => d(&[c.n_ff_shared, e]),
        Role::AttnSinks => d(&[c.n_head]),
        Role::FfnGateInpBias => d(&[c.experts.n_expert]),
        Role::FfnGateExpsBias | Role::FfnUpExpsBias => d(&[c.experts.n_ff, c.experts.n_expert]),
        Role::FfnDownExpsBias => d(&[e, c.experts.n_expert]),
    }
}

/// A file's tensors sorted out for its architecture: what the loader
/// places and what the plan reports, each dimension checked.
struct Resolved<'f> {
    arch: Arch,
    config: ModelConfig,
    n_vocab: usize,
    embd: &'f ModelTensor,
    found: BTreeMap<(Role, usize), &'f ModelTensor>,
    unused: Vec<String>,
}

/// Finds every tensor's role, checks each used one's dimensions against the
/// configuration, and lists the rest.
fn resolve(file: &GgufModel) -> Result<Resolved<'_>, ModelError> {
    let meta = file.metadata_file();
    let arch = arch_of(meta)?;
    let config = ModelConfig::from_gguf(meta, arch)?;
    let mut found: BTreeMap<(Role, usize), &ModelTensor> = BTreeMap::new();
    let mut unused = Vec::new();
    for t in file.tensors() {
        match Role::parse(&t.info.name) {
            Some((role, layer)) if arch.accepts(role) && layer.is_none_or(|l| l < config.n_layer) => {
                found.insert((role, layer.unwrap_or(0)), t);
            }
            _ => unused.push(t.info.name.clone()),
        }
    }
    let embd = *found
        .get(&(Role::TokenEmbd, 0))
        .ok_or_else(|| ModelError::MissingTensor { name: Role::TokenEmbd.gguf_name(0), arch })?;
    let n_vocab = embd.info.dims.get(1).copied().unwrap_or(0) as usize;
    if n_vocab == 0 {
        return Err(ModelError::TensorShape {
            name: embd.info.name.clone(),
            expected: vec![config.n_embd as u64, 0],
            got: embd.info.dims.clone(),
        });
    }
    for (&(role, _), t) in &found {
        let want = expected_dims(&config, role, n_vocab);
        if t.info.dims != want {
            return Err(ModelError::TensorShape { name: t.info.name.clone(), expected: want, got: t.info.dims.clone() });
        }
    }
    Ok(Resolved { arch, config, n_vocab, embd, found, unused })
}

/// The placement plan of the model in `file` on `backend`, without opening
/// the backend or reading a weight: what `ferrox kernels` prints for a
/// backend this machine has no device for, or this build no code for. A
/// loaded model's plan ([`Model::plan`]) is the same function's answer.
///
/// `gpu_layers`: on an accelerator, only the last that many blocks on it and
/// the rest on the CPU (as [`crate::backend::split::Split`] places them).
pub fn plan(file: &GgufModel, backend: Backend, gpu_layers: Option<usize>, device: String) -> Result<KernelPlan, ModelError> {
    use crate::backend::split::{side_of, Side};
    let r = resolve(file)?;
    let n_layer = r.config.n_layer;
    let of = |name: &str| match gpu_layers.filter(|_| backend.is_accelerator()) {
        Some(g) if side_of(name, n_layer, g, false) == Side::Host => Backend::Cpu,
        _ => backend,
    };
    Ok(plan_of(file, &r, backend, &of, device))
}

fn plan_of(file: &GgufModel, r: &Resolved<'_>, backend: Backend, of: &dyn Fn(&str) -> Backend, device: String) -> KernelPlan {
    let info = |t: &ModelTensor, role: Option<Role>| {
        crate::kernel_registry::placement(of(&t.info.name), &t.info.name, role, t.info.kind, &t.info.dims, t.info.n_bytes)
    };
    let mut placements: Vec<Placement> = r.found.iter().map(|(&(role, _), t)| info(t, Some(role))).collect();
    placements.extend(r.unused.iter().filter_map(|name| file.tensor(name)).map(|t| info(t, None)));
    // The tied head reads the embedding matrix as a matmul: report that too.
    if !r.found.contains_key(&(Role::Output, 0)) {
        let name = format!("output (tied: {})", r.embd.info.name);
        let mut p = crate::kernel_registry::placement(of(&name), &name, Some(Role::Output), r.embd.info.kind, &r.embd.info.dims, r.embd.info.n_bytes);
        p.bytes = 0;
        placements.push(p);
    }
    // Each layer's decode fusions, as its backend will take them.
    for l in 0..r.config.n_layer {
        let Some(lm) = layer_mats(r, l) else { continue };
        for p in placements.iter_mut().filter(|p| p.name.starts_with(&format!("blk.{l}."))) {
            if let Some((role, _)) = Role::parse(&p.name) {
                crate::kernel_registry::fuse_decode(p, role, &lm);
            }
        }
    }
    // A token reads only its experts' rows of a stack of experts; a backend
    // without expert kernels (or without a shared expert's, where the model
    // has one) cannot load the model.
    let ex = r.config.experts;
    let mut refused = crate::kernel_registry::refusals(backend, r.config.head_dim, r.config.head_dim_v);
    for p in placements.iter_mut() {
        let role = Role::parse(&p.name).map(|(role, _)| role);
        let stack = role.is_some_and(|role| role.feeds() == crate::arch::Feeds::Experts);
        if stack || role.is_some_and(Role::expert_bias) {
            p.bytes_per_token = p.bytes * ex.n_used as u64 / ex.n_expert.max(1) as u64;
        }
        if stack || matches!(role, Some(Role::FfnGateInpShexp | Role::AttnSinks | Role::FfnGateInpBias)) {
            if let (Some(why), true) = (&p.fallback, p.backend.is_accelerator()) {
                if !refused.iter().any(|r| r.contains(why.as_str())) {
                    let which = if stack { "and the other expert stacks" } else { "in every layer" };
                    refused.push(format!("{why} ({} {which}; run it with --backend cpu)", p.name));
                }
            }
        }
    }
    let order: BTreeMap<&str, usize> =
        file.tensors().iter().enumerate().map(|(i, t)| (t.info.name.as_str(), i)).collect();
    placements.sort_by_key(|p: &Placement| order.get(p.name.as_str()).copied().unwrap_or(usize::MAX));
    KernelPlan {
        backend,
        device,
        bytes_per_token: placements.iter().map(|p| p.bytes_per_token).sum(),
        crossings_per_token: crate::kernel_registry::crossings_per_token(&placements),
        unverified: Backend::ALL
            .iter()
            .filter(|&&b| placements.iter().any(|p| p.backend == b))
            .filter_map(|&b| crate::kernel_registry::unverified(b))
            .collect(),
        tensors: placements,
        unused: r.unused.clone(),
        refused,
    }
}

/// Layer `l`'s matrices and the facts the decoder's seam calls for it turn
/// on (see `enqueue`): what a backend's decode fusions depend on.
fn layer_mats(r: &Resolved<'_>, l: usize) -> Option<crate::kernel_registry::LayerMats> {
    let has = |role| r.found.contains_key(&(role, l));
    let mat = |role| {
        r.found.get(&(role, l)).map(|t| ferrox_ops::Mat {
            kind: t.info.kind,
            rows: t.info.dims.get(1).copied().unwrap_or(1) as usize,
            cols: t.info.dims[0] as usize,
        })
    };
    let qkv = match (mat(Role::AttnQ), mat(Role::AttnK), mat(Role::AttnV)) {
        (Some(q), Some(k), Some(v)) => Some([q, k, v]),
        _ => None,
    };
    let biased = has(Role::AttnQBias) || has(Role::AttnKBias) || has(Role::AttnVBias);
    let qk_norm = has(Role::AttnQNorm) && has(Role::AttnKNorm);
    Some(crate::kernel_registry::LayerMats {
        qkv,
        gate_up: mat(Role::FfnGate).zip(mat(Role::FfnUp)).map(|(g, u)| [g, u]),
        out: mat(Role::AttnOut)?,
        down: mat(Role::FfnDown),
        qkv_direct: qkv.is_some() && !biased && !qk_norm,
        out_direct: !has(Role::AttnOutBias) && !has(Role::AttnPostNorm),
        down_direct: !has(Role::FfnPostNorm),
        first: l == 0,
        halves: r.config.arch.spec().rope == crate::arch::RopeStyle::Halves,
        n_rot: r.config.n_rot,
        head_dim: r.config.head_dim,
    })
}

impl<B: DeviceBackend> Model<B> {
    /// Opens `path` (a file or any part of a split) and loads it onto `backend`.
    pub fn open(path: impl AsRef<Path>, backend: B) -> Result<Model<B>, ModelError> {
        Model::load(Arc::new(GgufModel::open(path)?), backend)
    }

    /// Loads an opened model onto `backend`: every needed tensor checked and
    /// placed, every unused one reported in [`Model::plan`].
    pub fn load(file: Arc<GgufModel>, backend: B) -> Result<Model<B>, ModelError> {
        Model::load_with_progress(file, backend, &|_, _| {})
    }

    /// [`Model::load`], calling `progress(bytes placed, bytes to place)`
    /// after each tensor is placed (a command's progress bar: placing is
    /// where a large model's load spends its time, repacking and copying).
    pub fn load_with_progress(file: Arc<GgufModel>, mut backend: B, progress: &dyn Fn(u64, u64)) -> Result<Model<B>, ModelError> {
        let r = resolve(&file)?;
        backend.prepare(&r.config)?;
        let plan = plan_of(&file, &r, backend.id(), &|name| backend.backend_of(name), backend.describe());
        if !plan.refused.is_empty() {
            return Err(ModelError::Unsupported { what: plan.refused.join("; ") });
        }
        if let Some(why) = backend.free_memory().and_then(|free| crate::kernel_registry::memory_refusal(&plan, free, r.config.n_layer)) {
            return Err(ModelError::Unsupported { what: why });
        }
        let Resolved { arch, config, n_vocab, found, .. } = r;
        let total: u64 = found.values().map(|t| t.info.n_bytes).sum();
        let placed = std::cell::Cell::new(0u64);
        // A role's tensor as the file holds it, checked for presence.
        let host = |role: Role, layer: usize, required: bool| -> Result<Option<HostTensor<'_>>, ModelError> {
            let Some(t) = found.get(&(role, layer)) else {
                return if required {
                    Err(ModelError::MissingTensor { name: role.gguf_name(layer), arch })
                } else {
                    Ok(None)
                };
            };
            // `resolve` checked the dimensions against the configuration.
            let bytes = file.tensor_data(t)?;
            // A stack of experts (`[cols, rows, n_expert]`) is one matrix of
            // all their rows, expert after expert.
            let (cols, rows) = (t.info.dims[0] as usize, t.info.dims[1..].iter().product::<u64>().max(1) as usize);
            // A stack of per-expert biases is one vector of all their rows.
            let (cols, rows) = if role.expert_bias() { (cols * rows, 1) } else { (cols, rows) };
            Ok(Some(HostTensor { name: &t.info.name, kind: t.info.kind, rows, cols, bytes, owner: &file }))
        };
        let placing = |t: &HostTensor<'_>, e: BackendError| ModelError::Backend(BackendError(format!("placing {}: {e}", t.name)));
        let done = |t: &HostTensor<'_>| {
            placed.set(placed.get() + t.bytes.len() as u64);
            progress(placed.get(), total);
        };
        let get = |role: Role, layer: usize, required: bool| -> Result<Option<B::Matrix>, ModelError> {
            let Some(t) = host(role, layer, required)? else { return Ok(None) };
            let w = backend.place_matrix(&t).map_err(|e| placing(&t, e))?;
            done(&t);
            Ok(Some(w))
        };
        let vec = |role: Role, layer: usize, required: bool| -> Result<Option<B::Vector>, ModelError> {
            let Some(t) = host(role, layer, required)? else { return Ok(None) };
            let w = backend.place_vector(&t).map_err(|e| placing(&t, e))?;
            done(&t);
            Ok(Some(w))
        };
        // `get(.., true)` never returns `Ok(None)`; this keeps that a typed
        // error rather than an `expect` should it ever change.
        fn must<W>(w: Option<W>) -> Result<W, ModelError> {
            w.ok_or(ModelError::Unsupported { what: "a required tensor was not placed".into() })
        }

        let embd = must(get(Role::TokenEmbd, 0, true)?)?;
        let output_norm = must(vec(Role::OutputNorm, 0, true)?)?;
        let output = get(Role::Output, 0, false)?;
        let rope_freqs = vec(Role::RopeFreqs, 0, false)?;
        let rope_long = vec(Role::RopeFactorsLong, 0, false)?;
        let rope_short = vec(Role::RopeFactorsShort, 0, false)?;
        let yarn = match config.rope_yarn {
            false => None,
            true if rope_freqs.is_some() || rope_long.is_some() || rope_short.is_some() => {
                return Err(ModelError::Unsupported { what: "YaRN RoPE scaling together with RoPE frequency factors".into() })
            }
            true => {
                let local_scale = local_freq_scale(&config);
                let mut two = Vec::with_capacity(2);
                for (base, scale) in [(config.rope_base, config.rope_freq_scale), (config.rope_base_local, local_scale)] {
                    let bytes: Vec<u8> = yarn_factors(&config, base, scale).iter().flat_map(|f| f.to_le_bytes()).collect();
                    let t = HostTensor { name: "rope yarn factors", kind: ferrox_quant::QuantKind::F32, rows: 1, cols: bytes.len() / 4, bytes: &bytes, owner: &file };
                    two.push(backend.place_vector(&t).map_err(|e| placing(&t, e))?);
                }
                let local = two.pop();
                two.pop().zip(local).map(|(g, l)| [g, l])
            }
        };
        let spec = arch.spec();
        let mut layers = Vec::with_capacity(config.n_layer);
        for l in 0..config.n_layer {
            let req = |r: Role| arch.required_block_roles().any(|x| x == r);
            // Phi-3 stores QKV fused or separate; everyone else as the spec says.
            let fused_qkv = found.contains_key(&(Role::AttnQkv, l));
            let sep = !fused_qkv;
            layers.push(LayerWeights {
                attn_norm: must(vec(Role::AttnNorm, l, true)?)?,
                q: get(Role::AttnQ, l, req(Role::AttnQ) || sep)?,
                k: get(Role::AttnK, l, req(Role::AttnK) || sep)?,
                v: get(Role::AttnV, l, req(Role::AttnV) || sep)?,
                qkv: get(Role::AttnQkv, l, false)?,
                q_bias: vec(Role::AttnQBias, l, req(Role::AttnQBias))?,
                k_bias: vec(Role::AttnKBias, l, req(Role::AttnKBias))?,
                v_bias: vec(Role::AttnVBias, l, req(Role::AttnVBias))?,
                qkv_bias: vec(Role::AttnQkvBias, l, false)?,
                q_norm: vec(Role::AttnQNorm, l, spec.qk_norm)?,
                k_norm: vec(Role::AttnKNorm, l, spec.qk_norm)?,
                out: must(get(Role::AttnOut, l, true)?)?,
                out_bias: vec(Role::AttnOutBias, l, req(Role::AttnOutBias))?,
                post_attn_norm: match spec.ffn_norm {
                    // gpt-oss's `post_attention_norm` is its pre-FFN norm.
                    Role::AttnPostNorm => None,
                    _ => vec(Role::AttnPostNorm, l, spec.post_norms)?,
                },
                ffn_norm: must(vec(spec.ffn_norm, l, true)?)?,
                gate: get(Role::FfnGate, l, config.ffn == FfnLayout::Separate)?,
                up: get(Role::FfnUp, l, config.ffn != FfnLayout::Experts)?,
                down: get(Role::FfnDown, l, config.ffn != FfnLayout::Experts)?,
                post_ffn_norm: vec(Role::FfnPostNorm, l, spec.post_norms)?,
                experts: match config.ffn {
                    FfnLayout::Experts => Some([
                        must(get(Role::FfnGateInp, l, true)?)?,
                        must(get(Role::FfnGateExps, l, true)?)?,
                        must(get(Role::FfnUpExps, l, true)?)?,
                        must(get(Role::FfnDownExps, l, true)?)?,
                    ]),
                    _ => None,
                },
                shared: match config.n_ff_shared {
                    0 => None,
                    _ => Some([
                        must(get(Role::FfnGateInpShexp, l, true)?)?,
                        must(get(Role::FfnGateShexp, l, true)?)?,
                        must(get(Role::FfnUpShexp, l, true)?)?,
                        must(get(Role::FfnDownShexp, l, true)?)?,
                    ]),
                },
                sinks: vec(Role::AttnSinks, l, req(Role::AttnSinks))?,
                router_bias: match host(Role::FfnGateInpBias, l, req(Role::FfnGateInpBias))? {
                    Some(t) => {
                        let v = crate::backend::vector_values(&t)?;
                        done(&t);
                        Some(v)
                    }
                    None => None,
                },
                expert_biases: match req(Role::FfnGateExpsBias) {
                    false => None,
                    true => Some([
                        must(vec(Role::FfnGateExpsBias, l, true)?)?,
                        must(vec(Role::FfnUpExpsBias, l, true)?)?,
                        must(vec(Role::FfnDownExpsBias, l, true)?)?,
                    ]),
                },
            });
        }
        Ok(Model {
            config,
            file,
            backend,
            n_vocab,
            embd,
            output,
            output_norm,
            rope_freqs,
            rope_long,
            rope_short,
            yarn,
            layers,
            plan,
            head_prefix: None,
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Vocabulary size (rows of the embedding and of the logits).
    pub fn n_vocab(&self) -> usize {
        self.n_vocab
    }

    /// Logits per output row: [`Model::n_vocab`], or the rows
    /// [`Model::trim_head`] kept.
    pub fn n_logits(&self) -> usize {
        self.head_prefix.as_ref().map_or(self.n_vocab, |h| h.1)
    }

    /// Computes logits for the first `rows` tokens of the vocabulary only:
    /// a draft model's head, where a vocabulary ranked by frequency (as
    /// SentencePiece and BPE vocabularies are) keeps the tokens text uses
    /// and the head's cost falls with its rows. Input tokens stay the whole
    /// vocabulary; output ids are below `rows`.
    pub fn trim_head(&mut self, rows: usize) -> Result<(), ModelError> {
        if rows == 0 || rows >= self.n_vocab {
            self.head_prefix = None;
            return Ok(());
        }
        let name = match self.output {
            Some(_) => Role::Output.gguf_name(0),
            None => Role::TokenEmbd.gguf_name(0),
        };
        let t = self.file.tensor(&name).ok_or_else(|| ModelError::MissingTensor { name: name.clone(), arch: self.config.arch })?;
        let cols = t.info.dims[0] as usize;
        let row_bytes = ferrox_quant::row_bytes(t.info.kind, cols).map_err(|e| ModelError::Unsupported { what: format!("{name}: {e}") })?;
        let bytes = self.file.tensor_data(t)?;
        let bytes = bytes.get(..rows * row_bytes).ok_or_else(|| ModelError::Batch(format!("{name} has fewer than {rows} rows")))?;
        let w = self
            .backend
            .place_matrix(&HostTensor { name: &name, kind: t.info.kind, rows, cols, bytes, owner: &self.file })
            .map_err(|e| ModelError::Backend(BackendError(format!("placing the first {rows} rows of {name}: {e}"))))?;
        self.head_prefix = Some((w, rows));
        Ok(())
    }

    /// The file it was loaded from.
    pub fn file(&self) -> &Arc<GgufModel> {
        &self.file
    }

    /// The backend it runs on.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Where every tensor lives and which kernel runs for it.
    pub fn plan(&self) -> &KernelPlan {
        &self.plan
    }

    /// A KV cache of `n_slots` sequences of `n_ctx` positions.
    pub fn new_context(&self, n_ctx: usize, n_slots: usize) -> Result<Context<B>, ModelError> {
        if n_ctx == 0 || n_slots == 0 {
            return Err(ModelError::Batch(format!("a context needs positions and slots (got {n_ctx} x {n_slots})")));
        }
        let c = &self.config;
        let k = vec![c.n_head_kv * c.head_dim; c.n_layer];
        let v = vec![c.n_head_kv * c.head_dim_v; c.n_layer];
        let kv = self.backend.kv_cache(n_slots, n_ctx, &k, &v)?;
        Ok(Context { kv, n_ctx, n_slots, acts: Vec::new(), heads: Vec::new(), id: next_id() })
    }

    fn rope_params(&self, layer: usize) -> RopeParams {
        let c = &self.config;
        let local = c.local_layers.get(layer).copied().unwrap_or(false);
        let spec = c.arch.spec();
        let scale = if local { local_freq_scale(c) } else { c.rope_freq_scale };
        RopeParams {
            style: spec.rope,
            n_rot: c.n_rot,
            base: if local { c.rope_base_local } else { c.rope_base },
            // YaRN's scale is in its factors; its magnitude, as ggml's
            // `rope_yarn` grows it (llama.cpp cancels its own attention
            // factor's share of it, leaving the file's).
            freq_scale: if c.rope_yarn { 1.0 } else { scale },
            attn_factor: match c.rope_yarn {
                true => c.rope_attn_factor * (1.0 + 0.1 * (1.0 / scale).ln()),
                false => c.rope_attn_factor,
            },
        }
    }

    fn rope_factors(&self, n_ctx: usize) -> Option<&B::Vector> {
        if self.rope_long.is_some() || self.rope_short.is_some() {
            if n_ctx > self.config.n_ctx_orig {
                self.rope_long.as_ref().or(self.rope_short.as_ref())
            } else {
                self.rope_short.as_ref().or(self.rope_long.as_ref())
            }
        } else {
            self.rope_freqs.as_ref()
        }
    }

    /// Runs `batch` through the model, filling the KV cache of each token's
    /// slot, and returns the logits of the tokens flagged in `batch.logits`,
    /// in batch order (`n_flagged x n_vocab`).
    pub fn forward(&self, ctx: &mut Context<B>, batch: &Batch) -> Result<Vec<f32>, ModelError> {
        let mut out = Vec::new();
        self.forward_into(ctx, batch, &mut out)?;
        Ok(out)
    }

    /// As [`Model::forward`], into `out` (resized to `n_flagged x n_vocab`):
    /// a caller that decodes token after token keeps one buffer instead of
    /// allocating (and faulting in) a fresh vocabulary-wide one each step.
    pub fn forward_into(&self, ctx: &mut Context<B>, batch: &Batch, out: &mut Vec<f32>) -> Result<(), ModelError> {
        let rows = self.forward_with(ctx, batch, true, |be, logits, rows| {
            out.resize(rows * self.n_logits(), 0.0);
            be.read(logits, out)?;
            Ok(rows)
        })?;
        if rows.is_none() {
            out.clear();
        }
        Ok(())
    }

    /// As [`Model::forward`], but returns what a top-k sampler needs of each
    /// flagged token's logits ([`crate::sampling::TopRows`], `k` candidates
    /// a row) instead of the rows: on a device that selects
    /// ([`DeviceBackend::selects_top_k`]), a few hundred bytes a row cross
    /// the bus instead of the vocabulary. The flagged rows listed in
    /// `whole` (ascending or not) also come back whole into `whole_out`, in
    /// that order: the rows of samplers a selection cannot serve.
    pub fn forward_top_k(
        &self,
        ctx: &mut Context<B>,
        batch: &Batch,
        k: usize,
        out: &mut crate::sampling::TopRows,
        whole: &[usize],
        whole_out: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        let n = self.n_logits();
        let rows = self.forward_with(ctx, batch, true, |be, logits, rows| {
            be.top_k_rows(logits, n, rows, k, out)?;
            whole_out.resize(whole.len() * n, 0.0);
            be.read_rows(logits, n, whole, whole_out)?;
            Ok(rows)
        })?;
        if rows.is_none() {
            out.reset(0, k);
            whole_out.clear();
        }
        Ok(())
    }

    /// As [`Model::forward`], but returns only the greedy choice (the argmax
    /// of the logits, ties to the lowest id) of each flagged token: on a
    /// device backend the logits never leave the device.
    pub fn forward_argmax(&self, ctx: &mut Context<B>, batch: &Batch) -> Result<Vec<u32>, ModelError> {
        let out = self.forward_with(ctx, batch, true, |be, logits, rows| {
            let mut ids = vec![0u32; rows];
            be.argmax_rows(logits, self.n_logits(), &mut ids)?;
            Ok(ids)
        })?;
        Ok(out.unwrap_or_default())
    }

    /// As [`Model::forward`], but returns the hidden states of the flagged
    /// tokens after the output norm (`n_flagged x n_embd`), the input the
    /// head would read — what an embedding is made of (llama.cpp's
    /// `t_embd`). The head itself does not run.
    pub fn forward_hidden(&self, ctx: &mut Context<B>, batch: &Batch) -> Result<Vec<f32>, ModelError> {
        let n_embd = self.config.n_embd;
        let out = self.forward_with(ctx, batch, false, |be, xo, rows| {
            let mut out = vec![0f32; rows * n_embd];
            be.read(xo, &mut out)?;
            Ok(out)
        })?;
        Ok(out.unwrap_or_default())
    }

    fn new_acts(&self, n: usize) -> Result<Acts<B>, ModelError> {
        let c = &self.config;
        let be = &self.backend;
        let (qd, kd, vd) = (c.n_head * c.head_dim, c.n_head_kv * c.head_dim, c.n_head_kv * c.head_dim_v);
        let ff_width = if c.ffn == FfnLayout::FusedGateUp { 2 * c.n_ff } else { c.n_ff };
        // A mixture of experts' router logits go in `gate`; a device that
        // runs the routed experts in place holds each token's `n_used`
        // expert rows there too (gate and up products, the GLU, and the
        // down products, `n_embd` wide, back in `gate`).
        let routed = c.experts.n_used * c.experts.n_ff;
        let hidden = c.n_ff.max(c.experts.n_expert).max(routed).max(c.experts.n_used * c.n_embd);
        Ok(Acts {
            n,
            id: next_id(),
            idx: be.indices(n)?,
            x: be.alloc(n * c.n_embd)?,
            cur: be.alloc(n * c.n_embd)?,
            q: be.alloc(n * qd)?,
            k: be.alloc(n * kd)?,
            v: be.alloc(n * vd)?,
            attn: be.alloc(n * c.n_head * c.head_dim_v)?,
            o: be.alloc(n * c.n_embd)?,
            gate: be.alloc(n * hidden)?,
            up: be.alloc(n * ff_width.max(routed))?,
            h: be.alloc(n * c.n_ff.max(routed))?,
            qkv: match self.layers.iter().any(|l| l.qkv.is_some()) {
                true => Some(be.alloc(n * (qd + kd + vd))?),
                false => None,
            },
        })
    }

    /// The forward pass; `head` turns the logits buffer of the flagged rows
    /// (with `logits`; else their normed hidden states) into what the caller
    /// asked for. `None` when no row is flagged.
    fn forward_with<R>(
        &self,
        ctx: &mut Context<B>,
        batch: &Batch,
        logits: bool,
        head: impl FnOnce(&B, &B::Buf, usize) -> Result<R, BackendError>,
    ) -> Result<Option<R>, ModelError> {
        let n = batch.len();
        if n == 0 || batch.pos.len() != n || batch.seq.len() != n || batch.logits.len() != n {
            return Err(ModelError::Batch("empty batch or columns of different lengths".into()));
        }
        if let Some(&t) = batch.tokens.iter().find(|&&t| t as usize >= self.n_vocab) {
            return Err(ModelError::Batch(format!("token id {t} is outside the vocabulary ({})", self.n_vocab)));
        }
        if let Some(i) = (0..n).find(|&i| batch.pos[i] as usize >= ctx.n_ctx || batch.seq[i] as usize >= ctx.n_slots) {
            return Err(ModelError::Batch(format!(
                "token {i} at position {} of slot {} does not fit a context of {} positions x {} slots",
                batch.pos[i], batch.seq[i], ctx.n_ctx, ctx.n_slots
            )));
        }
        let be = &self.backend;
        let rows: Vec<u32> = (0..n as u32).filter(|&i| batch.logits[i as usize]).collect();

        // A decode step (or, where the backend records batches, a batch) over
        // buffers that already exist can be recorded once and replayed (a
        // CUDA graph): its index lists are staged into the same device buffer
        // every step, outside the recording.
        let fits = |h: &Head<B::Buf>| h.rows == rows.len() && h.logits.is_some() == logits;
        let reused = ctx.acts.iter().any(|a| a.n == n) && ctx.heads.iter().any(fits);
        let mut a = take(&mut ctx.acts, |a| a.n == n, || self.new_acts(n))?;
        be.stage(&mut a.idx, Staged::of(batch, &rows, &()))?;
        let mut hd = match rows.len() {
            0 => None,
            r => Some(take(&mut ctx.heads, fits, || -> Result<_, ModelError> {
                let logits = match logits {
                    true => Some(be.alloc(r * self.n_logits())?),
                    false => None,
                };
                Ok(Head { rows: r, id: next_id(), xo: be.alloc(r * self.config.n_embd)?, logits })
            })?),
        };
        let n_ctx = ctx.n_ctx;
        let kv = &mut ctx.kv;
        match &hd {
            Some(h) if logits && be.records(n) => {
                let one_slot = batch.seq.iter().all(|&s| s == batch.seq[0]);
                let key = crate::backend::RecordKey { context: ctx.id, acts: a.id, head: h.id, one_slot };
                be.run_recorded(key, reused, || self.enqueue(kv, n_ctx, batch, &rows, &mut a, hd.as_mut()))?
            }
            _ => self.enqueue(kv, n_ctx, batch, &rows, &mut a, hd.as_mut())?,
        }
        let out = match &hd {
            Some(h) => Some(head(be, h.logits.as_ref().unwrap_or(&h.xo), rows.len())?),
            None => None,
        };
        keep(&mut ctx.acts, a);
        if let Some(h) = hd {
            keep(&mut ctx.heads, h);
        }
        Ok(out)
    }

    /// Enqueues the ops of one forward pass on the backend: the blocks, then
    /// (when `hd` is given) the output norm into `hd.xo` and, when it has
    /// logits, the head into them.
    fn enqueue(
        &self,
        kv: &mut B::Kv,
        n_ctx: usize,
        batch: &Batch,
        rows: &[u32],
        a: &mut Acts<B>,
        hd: Option<&mut Head<B::Buf>>,
    ) -> Result<(), ModelError> {
        let n = batch.len();
        let c = &self.config;
        let be = &self.backend;
        let spec = c.arch.spec();
        let factors = self.rope_factors(n_ctx);
        let Acts { idx, x, cur, q, k, v, attn, o, gate, up, h, qkv, .. } = a;
        let b = Staged::of(batch, rows, &*idx);
        be.get_rows(&self.embd, b, x)?;
        if spec.scale_embeddings {
            be.scale(x, (c.n_embd as f32).sqrt())?;
        }
        let mut s = Scratch { x, cur, q, k, v, qkv: qkv.as_mut(), attn, o, gate, up, h, pending: false };
        for (l, w) in self.layers.iter().enumerate() {
            let local = c.local_layers.get(l).copied().unwrap_or(false);
            let proj = match (&w.qkv, (&w.q, &w.k, &w.v)) {
                (Some(wqkv), _) => QkvWeights::Fused(wqkv, w.qkv_bias.as_ref()),
                (None, (Some(wq), Some(wk), Some(wv))) => {
                    QkvWeights::Separate([wq, wk, wv], [w.q_bias.as_ref(), w.k_bias.as_ref(), w.v_bias.as_ref()])
                }
                _ => return Err(ModelError::Unsupported { what: format!("layer {l} has neither fused nor separate QKV") }),
            };
            let block = AttnBlock {
                layer: l,
                eps: c.rms_eps,
                norm: &w.attn_norm,
                qkv: proj,
                qk_norm: w.q_norm.as_ref().zip(w.k_norm.as_ref()),
                out: &w.out,
                out_bias: w.out_bias.as_ref(),
                post_norm: w.post_attn_norm.as_ref(),
                rope: self.rope_params(l),
                factors: match &self.yarn {
                    Some([global, local_f]) => Some(if local { local_f } else { global }),
                    None => factors,
                },
                attn: AttnParams {
                    n_head: c.n_head,
                    n_head_kv: c.n_head_kv,
                    head_dim: c.head_dim,
                    head_dim_v: c.head_dim_v,
                    scale: c.attn_scale,
                    softcap: c.attn_softcap,
                    window: if local { c.window } else { None },
                },
                sinks: w.sinks.as_ref(),
            };
            be.attention_block(kv, b, &block, &mut s)?;
            match (&w.experts, &w.up, &w.down) {
                (Some([router, gate, up, down]), ..) => {
                    let moe = MoeBlock {
                        eps: c.rms_eps,
                        act: spec.activation,
                        norm: &w.ffn_norm,
                        router,
                        gate,
                        up,
                        down,
                        post_norm: w.post_ffn_norm.as_ref(),
                        n_embd: c.n_embd,
                        experts: c.experts,
                        shared: w.shared.as_ref().map(|[gate_inp, gate, up, down]| SharedExpert { gate_inp, gate, up, down, n_ff: c.n_ff_shared }),
                        biases: match (&w.router_bias, &w.expert_biases) {
                            (Some(router), Some([gate, up, down])) => Some(ExpertBiases { router, gate, up, down }),
                            _ => None,
                        },
                    };
                    be.moe_block(n, &moe, &mut s)?;
                }
                (None, Some(up), Some(down)) => {
                    let ffn = FfnBlock {
                        eps: c.rms_eps,
                        act: spec.activation,
                        norm: &w.ffn_norm,
                        gate: w.gate.as_ref(),
                        up,
                        down,
                        post_norm: w.post_ffn_norm.as_ref(),
                        n_ff: c.n_ff,
                    };
                    be.ffn_block(n, &ffn, &mut s)?;
                }
                _ => return Err(ModelError::Unsupported { what: format!("layer {l} has neither a dense FFN nor experts") }),
            }
        }

        let pending = s.pending.then_some(&*s.o);
        let Some(hd) = hd else {
            if let Some(o) = pending {
                be.add(s.x, o)?;
            }
            return Ok(());
        };
        if rows.len() == n {
            // Every row: the last residual add and the output norm in one.
            be.add_rms_norm(s.x, pending, &self.output_norm, c.rms_eps, &mut hd.xo)?;
        } else {
            if let Some(o) = pending {
                be.add(s.x, o)?;
            }
            be.gather_rows(s.x, b, c.n_embd, &mut hd.xo)?;
            be.rms_norm(&mut hd.xo, &self.output_norm, c.rms_eps)?;
        }
        let Some(logits) = hd.logits.as_mut() else { return Ok(()) };
        let head = match &self.head_prefix {
            Some((w, _)) => w,
            None => self.output.as_ref().unwrap_or(&self.embd),
        };
        be.matmul(head, &hd.xo, logits, rows.len())?;
        if let Some(cap) = c.final_softcap {
            be.softcap(logits, cap)?;
        }
        Ok(())
    }

}

#[cfg(test)]
mod progress_tests {
    use super::*;
    use crate::backend::cpu::Cpu;

    /// The progress a command draws: it only grows, and it ends at the bytes
    /// of every tensor the model placed (the file's tensors less the unused).
    #[test]
    fn loading_reports_growing_progress_ending_at_every_placed_byte() {
        let dir = std::env::temp_dir().join(format!("ferrox-progress-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny.gguf");
        crate::testing::tiny_arch_model(Arch::Gemma3, 7).unwrap().write_to(&path).unwrap();
        let file = Arc::new(GgufModel::open(&path).unwrap());
        std::fs::remove_dir_all(&dir).ok();
        let file_bytes: u64 = file.tensors().iter().map(|t| t.info.n_bytes).sum();
        let seen = std::cell::RefCell::new(Vec::new());
        let model = Model::load_with_progress(Arc::clone(&file), Cpu::new(1), &|done, total| seen.borrow_mut().push((done, total))).unwrap();
        let seen = seen.into_inner();
        let n_weights = 3 + model.config().n_layer * 4;
        assert!(seen.len() >= n_weights, "one report per placed tensor: {}", seen.len());
        assert!(seen.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 == w[1].1), "{seen:?}");
        let (done, total) = *seen.last().unwrap();
        assert_eq!(done, total, "the last report is the whole load");
        assert!(total > 0 && total <= file_bytes, "{total} of the file's {file_bytes}");
    }
}
