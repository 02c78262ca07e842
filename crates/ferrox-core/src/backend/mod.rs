//! The backend seam: one ordered backend table, capabilities as data, and
//! the data plane a forward pass runs on.
//!
//! The decision (from the seed, `../shared/seed/`): the backends are **one
//! list**, [`gpu_backend_table!`], expanded into the registry's
//! [`Backend`](crate::kernel_registry::Backend) enum, into the ungated
//! capability walk ([`with_gpu_backend_caps!`]) and into the gated dispatch
//! walk ([`with_gpu_backends!`]), so a backend cannot be dispatched to
//! without being reportable. What a backend *would* run per kind
//! ([`BackendCaps`]) is compiled on every build, so `cargo test` on a CPU
//! machine checks it; what it *can* launch is tied to that claim by a test.
//!
//! Where we go further than the seed: its GPU path copied weights and
//! activations per matvec. Here a backend implements [`DeviceBackend`] —
//! weights are placed once at load ([`DeviceBackend::place_matrix`]), activations
//! and the KV cache live in the backend's own buffers for the whole forward
//! pass, and only token ids go in and logits come out. The CPU is the first
//! `DeviceBackend` and the reference every other one is tested against.
//!
//! Only backends that exist are in the table: CUDA, Vulkan, then Metal.

#[cfg(test)]
mod conformance;
pub mod blocks;
pub mod cpu;
pub mod cuda;
pub mod metal;
pub mod split;
pub mod vulkan;
pub use cuda::Cuda;
pub use metal::Metal;
pub use vulkan::Vulkan;

use ferrox_quant::QuantKind;

use crate::kernel_registry::Backend;
pub use ferrox_quant::knob::BadValue;

/// A backend failure, rendered: backend error types live behind features,
/// and callers only report them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BackendError(pub String);

impl BackendError {
    /// Renders any backend error into the one shape the seam carries.
    pub fn new(e: impl std::fmt::Display) -> Self {
        BackendError(e.to_string())
    }
}

/// What an accelerator backend can run, answerable without its crate.
///
/// Ungated on purpose: `ferrox kernels --backend cuda` and the coverage
/// tests ask what CUDA *would* resolve on a build with no CUDA. The answers
/// come from the same table the backend's device crate launches by
/// (`ferrox_ops`), so the plan names the kernel that really runs.
pub trait BackendCaps {
    /// How the kernel registry reports this backend.
    const ID: Backend;
    /// Display name.
    const NAME: &'static str;
    /// What a prefill runs for a kind with a matvec but no GEMM.
    const GEMM_FALLBACK: &'static str;
    /// The kernel every `kind` matrix can take at decode (whatever its
    /// shape), by its name in the backend's source, or `None`: the kind is
    /// not claimed.
    fn matvec_kernel(kind: QuantKind) -> Option<String>;
    /// Whether `kind` has a batched GEMM (the prefill path).
    fn gemm_supported(kind: QuantKind) -> bool;
    /// What a decode step runs for a `kind` matrix of `cols` columns: the
    /// kernel the backend chooses for that shape. The default is
    /// [`BackendCaps::matvec_kernel`].
    fn decode_kernel(kind: QuantKind, cols: usize) -> Option<String> {
        let _ = cols;
        Self::matvec_kernel(kind)
    }
    /// What a decode step runs for the matrix of `role` in a layer shaped
    /// `l`, where the backend fuses it with its neighbours (one launch for
    /// Q, K and V, gate and up with the GLU, a projection added into the
    /// residual); `None`: its own kernel ([`BackendCaps::decode_kernel`]).
    fn fused_decode(role: crate::arch::Role, l: &crate::kernel_registry::LayerMats) -> Option<String> {
        let _ = (role, l);
        None
    }
    /// The largest head size its attention takes (`None`: any); a model
    /// past it is refused at plan time, before a weight is read.
    fn max_head_dim() -> Option<usize> {
        None
    }
    /// What a mixture of experts' `kind` matrices run on (`None`: no expert
    /// kernels; a model with experts is refused at plan time).
    fn experts_kernel(kind: QuantKind) -> Option<String> {
        let _ = kind;
        None
    }
    /// What runs a mixture of experts' shared expert (its sigmoid-gated
    /// output added to the routed experts'; `None`: nothing yet, and a
    /// model with one is refused at plan time).
    fn shared_expert_kernel() -> Option<String> {
        None
    }
    /// What runs attention with sinks (a learned logit per head in the
    /// softmax denominator, gpt-oss; `None`: nothing yet, and a model with
    /// them is refused at plan time).
    fn attention_sinks_kernel() -> Option<String> {
        None
    }
    /// What runs gpt-oss's experts: biased router and expert products, the
    /// clamped SwiGLU (`swiglu_oai`), softmax after the top-k (`None`:
    /// nothing yet, and such a model is refused at plan time).
    fn oai_experts_kernel() -> Option<String> {
        None
    }
    /// What none of this backend's kernels has been checked on (`None`:
    /// its suite runs in CI or on the GPU machine); the plan says it.
    fn unverified() -> Option<&'static str> {
        None
    }
    /// What a prefill runs for a `kind` matrix of `cols` columns.
    fn prefill_kernel(kind: QuantKind, cols: usize) -> String {
        let _ = cols;
        match Self::gemm_supported(kind) {
            true => format!("{} GEMM ({kind})", Self::NAME),
            false => Self::GEMM_FALLBACK.to_string(),
        }
    }
}

/// **The** accelerator table: `(registry variant, cargo feature / name,
/// seam type)`, in dispatch precedence order; the CPU is the fallthrough
/// after it. Expanded once with every row (and `$extra` ahead of them), so
/// a consumer can build one item such as an `enum` from it.
///
/// A row here needs a crate behind it: otherwise it is a backend that
/// claims kernels nothing runs.
macro_rules! gpu_backend_table {
    ($mac:path $(, $extra:tt)*) => {
        $mac! {
            [$($extra),*]
            (Cuda, "cuda", Cuda),
            (Vulkan, "vulkan", Vulkan),
            (Metal, "metal", Metal),
        }
    };
}
pub(crate) use gpu_backend_table;

/// Expands `$mac!(Type)` once per **compiled-in** accelerator, in table
/// order (gated by the row's feature name). May expand zero times.
#[allow(unused_macros)]
macro_rules! with_gpu_backends {
    ($mac:ident) => {
        $crate::backend::gpu_backend_table!($crate::backend::gpu_backend_dispatch_rows, $mac);
    };
}
#[allow(unused_imports)]
pub(crate) use with_gpu_backends;

/// Row expander of [`with_gpu_backends!`].
#[allow(unused_macros)]
macro_rules! gpu_backend_dispatch_rows {
    ([$mac:ident] $(($variant:ident, $feature:literal, $ty:ident)),* $(,)?) => {
        $(
            #[cfg(feature = $feature)]
            $mac!($crate::backend::$ty);
        )*
    };
}
#[allow(unused_imports)]
pub(crate) use gpu_backend_dispatch_rows;

/// Expands `$mac!(Type)` once per accelerator **whether or not it is
/// compiled in** (ungated: stays inside [`BackendCaps`]).
#[allow(unused_macros)]
macro_rules! with_gpu_backend_caps {
    ($mac:ident) => {
        $crate::backend::gpu_backend_table!($crate::backend::gpu_backend_caps_rows, $mac);
    };
}
#[allow(unused_imports)]
pub(crate) use with_gpu_backend_caps;

/// Row expander of [`with_gpu_backend_caps!`].
#[allow(unused_macros)]
macro_rules! gpu_backend_caps_rows {
    ([$mac:ident] $(($variant:ident, $feature:literal, $ty:ident)),* $(,)?) => {
        $( $mac!($crate::backend::$ty); )*
    };
}
#[allow(unused_imports)]
pub(crate) use gpu_backend_caps_rows;

/// What a **compiled-in** accelerator can actually launch, asked without a
/// device. It must agree with its [`BackendCaps`] claim for every kind;
/// `every_kind_a_compiled_backend_claims_can_actually_be_launched` checks
/// that over all kinds for every backend [`with_gpu_backends!`] expands.
pub trait BackendLaunch: BackendCaps {
    /// Whether every kernel a `kind` matrix's decode and embedding lookup
    /// launch exists in the backend's compiled source.
    fn has_launch(kind: QuantKind) -> bool;
    /// Whether the kernels of `kind`'s batched GEMM exist there.
    fn has_gemm(kind: QuantKind) -> bool;
}

/// The `FERROX_<BACKEND>` grammar every accelerator's enable probe shares:
/// `0|false|off|cpu` forces the CPU, `1|true|on|<alias>` forces the
/// backend, `auto` (or unset) asks `probe` — which is never called when the
/// environment decided, so a forced-off run never opens a device. Anything
/// else is an error naming the variable (`name`), not a probe.
pub fn env_or_probe(
    name: &'static str,
    value: Option<&str>,
    alias: &str,
    probe: impl FnOnce() -> bool,
) -> Result<bool, BadValue> {
    let Some(v) = value.map(str::trim) else {
        return Ok(probe());
    };
    match v.to_ascii_lowercase().as_str() {
        "0" | "false" | "off" | "cpu" => Ok(false),
        "1" | "true" | "on" => Ok(true),
        "auto" => Ok(probe()),
        v if v == alias => Ok(true),
        _ => Err(BadValue {
            name,
            value: v.to_string(),
            expected: format!("0, false, off or cpu (keep the device out); 1, true, on or {alias}; auto (use a device if one is found)"),
        }),
    }
}

/// Checks every `FERROX_*` variable this build reads, opening nothing: a
/// value that does not parse is an error naming the variable and what it
/// takes. Every backend's open calls it, and the `ferrox` binary before any
/// command, so no kernel deep in a forward pass meets a bad value (the list
/// is `docs/dev/configuration.md`; a `measure` build checks its measuring
/// knobs here too, except the CUDA device's, which `Device::open` checks).
pub fn check_env() -> Result<(), BadValue> {
    ferrox_quant::knob::check()?;
    cpu::prepack_setting()?;
    cpu::interleave_setting()?;
    #[cfg(feature = "cuda")]
    cuda::Cuda::env_setting()?;
    #[cfg(feature = "cuda")]
    cuda::Cuda::graphs_setting()?;
    #[cfg(feature = "cuda")]
    cuda::Cuda::top_k_setting()?;
    #[cfg(feature = "vulkan")]
    vulkan::Vulkan::env_setting()?;
    #[cfg(feature = "metal")]
    metal::Metal::env_setting()?;
    Ok(())
}

/// Which backend a command runs on and how it is opened: `--backend`,
/// `--device`, `--threads`, `--n-gpu-layers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceOptions {
    /// The backend.
    pub backend: Backend,
    /// The device ordinal (`--device N`; the CPU is device 0 only).
    pub device: usize,
    /// CPU threads (0: every core).
    pub threads: usize,
    /// For an accelerator: `Some(n)` puts only the last `n` blocks on it and
    /// the rest on the CPU ([`split::Split`]); `None`, the whole model.
    pub gpu_layers: Option<usize>,
}

/// What a command does with a backend once it is open, generic over the
/// backend so the decoder is compiled once per backend and the choice is
/// one generated `match` ([`with_backend`]).
pub trait WithBackend {
    /// What the command returns.
    type Output;
    /// Runs the command on `backend`.
    fn run<B: DeviceBackend + 'static>(self, backend: B) -> Self::Output;
}

/// Generates [`with_backend`] from the backend table's rows.
macro_rules! open_backend_rows {
    ([] $(($variant:ident, $feature:literal, $ty:ident)),* $(,)?) => {
        /// Opens the backend `opts` names and runs `f` on it. Generated from
        /// [`gpu_backend_table!`]: a backend not compiled into this build is a
        /// typed error naming the feature to build with, never a missing arm.
        pub fn with_backend<F: WithBackend>(opts: &DeviceOptions, f: F) -> Result<F::Output, BackendError> {
            match opts.backend {
                Backend::Cpu => Ok(f.run(<cpu::Cpu as DeviceBackend>::open(opts)?)),
                $(
                    #[cfg(feature = $feature)]
                    Backend::$variant => match opts.gpu_layers {
                        Some(_) => Ok(f.run(<split::Split<$ty> as DeviceBackend>::open(opts)?)),
                        None => Ok(f.run(<$ty as DeviceBackend>::open(opts)?)),
                    },
                    #[cfg(not(feature = $feature))]
                    Backend::$variant => Err(BackendError(format!(
                        "the {} backend is not compiled into this build (build with `--features {}`)",
                        <$ty as BackendCaps>::NAME,
                        $feature
                    ))),
                )*
            }
        }
    };
}
gpu_backend_table!(open_backend_rows);

/// How RoPE is applied to a layer and how it attends: the op vocabulary
/// every backend crate imports (`ferrox_ops`), not mirrored per device.
pub use ferrox_ops::{Activation, AttnParams, RopeParams};

/// What a recorded forward pass is keyed by ([`DeviceBackend::run_recorded`]):
/// the context and the activation and head buffers it ran over, each id
/// unique in the process and never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RecordKey {
    /// The context (its KV cache).
    pub context: u64,
    /// The activation buffers of the batch shape.
    pub acts: u64,
    /// The head's input and logits buffers.
    pub head: u64,
    /// Every token of the pass is in one cache slot (a prompt chunk, a
    /// speculative verification): attention may take another kernel than
    /// for a batch of the same size over several slots.
    pub one_slot: bool,
}

/// The tokens of one forward pass: per token its sequence slot and position.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Token ids.
    pub tokens: Vec<u32>,
    /// Position of each token in its sequence.
    pub pos: Vec<u32>,
    /// Sequence slot of each token (an index into the KV cache's slots).
    pub seq: Vec<u32>,
    /// Whether the logits of each token are wanted.
    pub logits: Vec<bool>,
}

impl Batch {
    /// Appends one token.
    pub fn push(&mut self, token: u32, pos: u32, seq: u32, logits: bool) {
        self.tokens.push(token);
        self.pos.push(pos);
        self.seq.push(seq);
        self.logits.push(logits);
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }
}

/// A weight as the file holds it, handed to [`DeviceBackend::place_matrix`]
/// or [`DeviceBackend::place_vector`].
pub struct HostTensor<'a> {
    /// GGUF name (for errors and the registry).
    pub name: &'a str,
    /// Storage kind.
    pub kind: QuantKind,
    /// Rows (ggml `ne1`; 1 for vectors).
    pub rows: usize,
    /// Columns (ggml `ne0`, the contiguous dimension).
    pub cols: usize,
    /// The bytes, borrowed from the mapped file.
    pub bytes: &'a [u8],
    /// Keeps the mapping alive for backends that borrow it instead of copying.
    pub owner: &'a std::sync::Arc<ferrox_gguf::GgufModel>,
}

/// A forward pass's index lists as every op reads them: the host copies, and
/// `dev`, the backend's own copy ([`DeviceBackend::Indices`]), written once
/// per pass by [`DeviceBackend::stage`]. Cheap to copy; a split hands each
/// side the same lists with that side's `dev`.
#[derive(Debug)]
pub struct Staged<'a, I: ?Sized> {
    /// Token ids.
    pub tokens: &'a [u32],
    /// Each token's position in its sequence.
    pub pos: &'a [u32],
    /// Each token's sequence slot.
    pub seq: &'a [u32],
    /// The rows whose logits are wanted, in order.
    pub rows: &'a [u32],
    /// The backend's copy of the lists.
    pub dev: &'a I,
}

impl<I: ?Sized> Clone for Staged<'_, I> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<I: ?Sized> Copy for Staged<'_, I> {}

impl<'a, I: ?Sized> Staged<'a, I> {
    /// `batch`'s lists and `rows`, with the backend's copy `dev`.
    pub fn of(batch: &'a Batch, rows: &'a [u32], dev: &'a I) -> Staged<'a, I> {
        Staged { tokens: &batch.tokens, pos: &batch.pos, seq: &batch.seq, rows, dev }
    }

    /// Tokens in the pass.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the pass is empty.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The same lists with another backend's copy (a split's sides).
    pub fn with<'b, J: ?Sized>(&self, dev: &'b J) -> Staged<'b, J>
    where
        'a: 'b,
    {
        Staged { tokens: self.tokens, pos: self.pos, seq: self.seq, rows: self.rows, dev }
    }
}

/// How a block's queries, keys and values are projected.
pub enum QkvWeights<'a, B: DeviceBackend + ?Sized> {
    /// One matrix whose rows are Q, then K, then V (Phi-3), and its bias.
    Fused(&'a B::Matrix, Option<&'a B::Vector>),
    /// Three matrices and their biases.
    Separate([&'a B::Matrix; 3], [Option<&'a B::Vector>; 3]),
}

/// One attention block: the residual's norm, the Q/K/V projections (with
/// their biases and norms), RoPE, attention over the cache, and the output
/// projection (with its bias and post-norm).
pub struct AttnBlock<'a, B: DeviceBackend + ?Sized> {
    /// The block index (the KV cache layer).
    pub layer: usize,
    /// RMS norm epsilon.
    pub eps: f32,
    /// The input norm.
    pub norm: &'a B::Vector,
    /// The projections.
    pub qkv: QkvWeights<'a, B>,
    /// Per-head RMS norms of the queries and keys (Qwen 3, Gemma 3).
    pub qk_norm: Option<(&'a B::Vector, &'a B::Vector)>,
    /// The output projection.
    pub out: &'a B::Matrix,
    /// Its bias.
    pub out_bias: Option<&'a B::Vector>,
    /// A norm of the block's output before the residual add (Gemma 2/3).
    pub post_norm: Option<&'a B::Vector>,
    /// RoPE.
    pub rope: RopeParams,
    /// RoPE frequency factors.
    pub factors: Option<&'a B::Vector>,
    /// Attention.
    pub attn: AttnParams,
    /// Attention sinks (gpt-oss): one logit per query head that joins
    /// the head's softmax denominator (and attends to nothing).
    pub sinks: Option<&'a B::Vector>,
}

/// One feed-forward block: the residual's norm, gate and up projections
/// (separate, or one fused matrix), the gated activation, the down
/// projection (with its post-norm).
pub struct FfnBlock<'a, B: DeviceBackend + ?Sized> {
    /// RMS norm epsilon.
    pub eps: f32,
    /// The gated activation.
    pub act: Activation,
    /// The input norm.
    pub norm: &'a B::Vector,
    /// The gate projection; `None`: `up` holds gate then up (Phi-3).
    pub gate: Option<&'a B::Matrix>,
    /// The up projection.
    pub up: &'a B::Matrix,
    /// The down projection.
    pub down: &'a B::Matrix,
    /// A norm of the block's output before the residual add.
    pub post_norm: Option<&'a B::Vector>,
    /// The hidden width.
    pub n_ff: usize,
}

/// A mixture-of-experts block: the residual's norm, the router, the
/// routed experts' gated FFNs weighted by their routing weights, and the
/// sum's post-norm. Each expert matrix holds all experts' rows, expert after
/// expert (`gate`/`up`: `n_expert * experts.n_ff` rows of `n_embd`; `down`:
/// `n_expert * n_embd` rows of `experts.n_ff`).
pub struct MoeBlock<'a, B: DeviceBackend + ?Sized> {
    /// RMS norm epsilon.
    pub eps: f32,
    /// The experts' gated activation.
    pub act: Activation,
    /// The input norm.
    pub norm: &'a B::Vector,
    /// The router (`n_expert` rows).
    pub router: &'a B::Matrix,
    /// The experts' gate projections.
    pub gate: &'a B::Matrix,
    /// The experts' up projections.
    pub up: &'a B::Matrix,
    /// The experts' down projections.
    pub down: &'a B::Matrix,
    /// A norm of the block's output before the residual add.
    pub post_norm: Option<&'a B::Vector>,
    /// The model width.
    pub n_embd: usize,
    /// The experts' sizes.
    pub experts: crate::model::Experts,
    /// A shared expert every token runs besides its routed ones (Qwen2-MoE).
    pub shared: Option<SharedExpert<'a, B>>,
    /// The router's and experts' biases (gpt-oss).
    pub biases: Option<ExpertBiases<'a, B>>,
}

/// A mixture of experts' biases (gpt-oss): the router's, added to its
/// logits before the choice, and each expert's gate, up and down biases,
/// one row per expert (`n_ff`, `n_ff` and `n_embd` wide), added to its
/// products before the activation (gate, up) and before the routing
/// weight (down).
pub struct ExpertBiases<'a, B: DeviceBackend + ?Sized> {
    /// The router's (`n_expert`), on the host: routing happens there.
    pub router: &'a [f32],
    /// The gate projections' (`n_expert * n_ff`).
    pub gate: &'a B::Vector,
    /// The up projections' (`n_expert * n_ff`).
    pub up: &'a B::Vector,
    /// The down projections' (`n_expert * n_embd`).
    pub down: &'a B::Vector,
}

/// A mixture of experts' shared expert: a gated FFN of `n_ff` every token
/// runs, its output scaled by the sigmoid of the token's product with
/// `gate_inp` (one row of `n_embd`) and added to the routed experts'.
pub struct SharedExpert<'a, B: DeviceBackend + ?Sized> {
    /// The gate of its output (one row).
    pub gate_inp: &'a B::Matrix,
    /// Its gate projection (`n_ff` rows).
    pub gate: &'a B::Matrix,
    /// Its up projection (`n_ff` rows).
    pub up: &'a B::Matrix,
    /// Its down projection (`n_embd` rows of `n_ff`).
    pub down: &'a B::Matrix,
    /// Its hidden width.
    pub n_ff: usize,
}

/// One token's route to one expert, with its weight in the token's output.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Route {
    /// The token's row in the batch.
    pub token: usize,
    /// The expert.
    pub expert: usize,
    /// Its weight.
    pub weight: f32,
}

/// The activation buffers blocks read and write, for one batch shape.
/// `x` is the residual stream. A block's output is added into `x` by its
/// projection, or, when it is biased or normed first, left in `o` with
/// `pending` set, for the next block's norm to add in. The others are
/// scratch: a block writes them before it reads them.
pub struct Scratch<'a, Buf> {
    /// The residual stream.
    pub x: &'a mut Buf,
    /// The normed rows.
    pub cur: &'a mut Buf,
    /// Queries.
    pub q: &'a mut Buf,
    /// Keys.
    pub k: &'a mut Buf,
    /// Values.
    pub v: &'a mut Buf,
    /// A fused Q/K/V projection's output, where the model has one.
    pub qkv: Option<&'a mut Buf>,
    /// Attention's output.
    pub attn: &'a mut Buf,
    /// A block's output not yet added to `x`.
    pub o: &'a mut Buf,
    /// The gate projection.
    pub gate: &'a mut Buf,
    /// The up projection (both halves where fused).
    pub up: &'a mut Buf,
    /// The gated activation.
    pub h: &'a mut Buf,
    /// Whether `o` holds a block output still to be added to `x`.
    pub pending: bool,
}

/// The data plane: everything a forward pass does, on the backend's own
/// buffers. Implemented by the CPU (the reference) and by each accelerator.
///
/// Shapes are explicit and checked: a mismatch is a [`BackendError`], never
/// a panic. Activations are row-major `[n_tokens, width]`. Weights are
/// typed: a matrix (`Matrix`) feeds products and row lookups, a vector
/// (`Vector`: norms, biases, RoPE factors) element-wise ops. A forward
/// pass's index lists are staged once ([`DeviceBackend::stage`]) and every
/// op reads them from the one [`Staged`]. The model runs blocks through
/// two hooks, [`DeviceBackend::attention_block`] and
/// [`DeviceBackend::ffn_block`], whose defaults ([`blocks`]) are composed
/// from the primitive ops; a backend overrides a hook to fuse what it can,
/// without the trait growing an op per fusion.
pub trait DeviceBackend: Send + Sync {
    /// A placed matrix (device memory, or a borrow of the mapped file).
    type Matrix: Send + Sync;
    /// A placed vector: norms, biases, RoPE factors.
    type Vector: Send + Sync;
    /// An f32 activation buffer in device memory.
    type Buf: Send;
    /// The KV cache: `n_slots` sequences of `n_ctx` positions per layer.
    type Kv: Send;
    /// A batch's index lists on the device (`()` where ops read the host's).
    type Indices: Send;

    /// Opens the backend as `opts` says (the device ordinal, CPU threads);
    /// [`with_backend`] calls this for the backend a user named.
    fn open(opts: &DeviceOptions) -> Result<Self, BackendError>
    where
        Self: Sized;
    /// The registry identity of this backend.
    fn id(&self) -> Backend;
    /// Threads (CPU) or streams the backend uses; reported, not tuned here.
    fn threads(&self) -> usize;
    /// Host threads for the host's share of a step (the server samples one
    /// sequence per task on them): the CPU backend's own compute threads,
    /// which the step has just released; every core for a device backend,
    /// whose host is idle while the device computes.
    fn host_threads(&self) -> usize {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
    /// The device as `ferrox kernels` and the load line name it.
    fn describe(&self) -> String {
        self.id().name().to_string()
    }
    /// Learns the model it is about to hold, before any weight is placed
    /// (a split decides its layers' sides from the block count). The
    /// default does nothing.
    fn prepare(&mut self, config: &crate::model::ModelConfig) -> Result<(), BackendError> {
        let _ = config;
        Ok(())
    }
    /// Free memory on the device, in bytes, where the backend has a device
    /// of its own (`None`: the host's, not checked). A model whose weights
    /// on the device exceed it is refused at load, naming `-ngl`.
    fn free_memory(&self) -> Option<u64> {
        None
    }
    /// The device's memory in use and in all, in bytes, as its driver
    /// counts them (every process's), where the backend has a device of its
    /// own: what the server's `/metrics` reports. `None` on the host.
    fn device_memory(&self) -> Option<(u64, u64)> {
        None
    }
    /// The backend the tensor `name` is placed on (a split places by
    /// layer); the default is [`DeviceBackend::id`].
    fn backend_of(&self, name: &str) -> Backend {
        let _ = name;
        self.id()
    }
    /// Keeps one rounding for products at every batch size from now on.
    /// The CPU otherwise takes bf16 products from 64 tokens (faster
    /// prefill) where smaller batches quantize activations to 8 bits; a
    /// server must not, since its batches mix sequences as load comes and
    /// goes and it reuses cached prompt prefixes: the same request with the
    /// same seed would sample differently. The default does nothing.
    fn prefer_exact_products(&self) {}
    /// Every product from now on on the per-token kernels, at every batch
    /// size: a token's outputs are then bit for bit what it gets alone,
    /// so a request's reply does not depend on what it is batched with or
    /// on a reused prompt prefix (`ferrox serve --batch-invariant`), at
    /// the cost of the batched products' speed. Returns whether the
    /// backend can; the default cannot.
    fn prefer_row_products(&self) -> bool {
        false
    }
    /// Places a matrix for its whole lifetime (upload, repack, or borrow).
    fn place_matrix(&self, t: &HostTensor<'_>) -> Result<Self::Matrix, BackendError>;
    /// Places a vector (one row; any kind, read as f32 values).
    fn place_vector(&self, t: &HostTensor<'_>) -> Result<Self::Vector, BackendError>;
    /// A zeroed activation buffer of `len` floats.
    fn alloc(&self, len: usize) -> Result<Self::Buf, BackendError>;
    /// A buffer holding `src`: the conformance suite's way in (a forward
    /// pass never uploads activations; only the batch's ids go in).
    fn upload(&self, src: &[f32]) -> Result<Self::Buf, BackendError>;
    /// Copies `dst.len()` floats out (logits, and tests).
    fn read(&self, src: &Self::Buf, dst: &mut [f32]) -> Result<(), BackendError>;
    /// A KV cache for `n_layer` layers of `kv_dims[l]` (keys) and `v_dims[l]`
    /// (values) per position.
    fn kv_cache(&self, n_slots: usize, n_ctx: usize, k_dims: &[usize], v_dims: &[usize]) -> Result<Self::Kv, BackendError>;
    /// Room on the device for the index lists of passes of up to `n`
    /// tokens. A model keeps one per batch shape, so a recorded pass reads
    /// its lists at the same place every time.
    fn indices(&self, n: usize) -> Result<Self::Indices, BackendError>;
    /// Writes a pass's lists into `dev` (one copy), before any op reads them.
    fn stage(&self, dev: &mut Self::Indices, lists: Staged<'_, ()>) -> Result<(), BackendError>;

    /// `out[i] = table[b.tokens[i]]` (dequantized), `out` is `[b.len(), cols]`.
    fn get_rows(&self, table: &Self::Matrix, b: Staged<'_, Self::Indices>, out: &mut Self::Buf) -> Result<(), BackendError>;
    /// `y = x W^T` for `n` rows of `x`.
    fn matmul(&self, w: &Self::Matrix, x: &Self::Buf, y: &mut Self::Buf, n: usize) -> Result<(), BackendError>;
    /// `y_i = x W_i^T` for several weights over the same `n` rows of `x` (a
    /// layer's Q, K and V; gate and up). The default is one
    /// [`DeviceBackend::matmul`] each; a backend may share the activations'
    /// preparation, or do them in one launch.
    fn matmul_many(&self, x: &Self::Buf, n: usize, outs: &mut [(&Self::Matrix, &mut Self::Buf)]) -> Result<(), BackendError> {
        for (w, y) in outs.iter_mut() {
            self.matmul(w, x, y, n)?;
        }
        Ok(())
    }
    /// `y[t] += b` for each of `n` rows.
    fn add_bias(&self, y: &mut Self::Buf, b: &Self::Vector, n: usize) -> Result<(), BackendError>;
    /// RMS norm of each `w.len()`-wide row of `x` in place, times `w`.
    fn rms_norm(&self, x: &mut Self::Buf, w: &Self::Vector, eps: f32) -> Result<(), BackendError>;
    /// `x += add` (when given), then `out = rms_norm(x) * w`: the residual
    /// add and the next block's norm. The default is the three separate ops.
    fn add_rms_norm(&self, x: &mut Self::Buf, add: Option<&Self::Buf>, w: &Self::Vector, eps: f32, out: &mut Self::Buf) -> Result<(), BackendError> {
        if let Some(a) = add {
            self.add(x, a)?;
        }
        self.copy(x, out)?;
        self.rms_norm(out, w, eps)
    }
    /// RoPE on `x` (`[b.len(), n_heads * head_dim]`) in place, at the
    /// batch's positions.
    fn rope(&self, x: &mut Self::Buf, b: Staged<'_, Self::Indices>, n_heads: usize, head_dim: usize, p: &RopeParams, factors: Option<&Self::Vector>) -> Result<(), BackendError>;
    /// Stores the keys and values (`qkv[1]`, `qkv[2]`) of the batch in layer `layer` of the
    /// cache, then writes causal attention of the queries `qkv[0]` over each token's own
    /// sequence into `out`.
    fn attention(&self, cache: &mut Self::Kv, layer: usize, b: Staged<'_, Self::Indices>, qkv: [&Self::Buf; 3], out: &mut Self::Buf, p: &AttnParams) -> Result<(), BackendError>;
    /// [`DeviceBackend::attention`] with a sink logit per query head
    /// (`sinks`, `n_head` values, in the units of the scaled scores) in
    /// each softmax's denominator. The default refuses: a backend without
    /// it says so in its plan ([`BackendCaps::attention_sinks_kernel`]).
    #[allow(clippy::too_many_arguments)]
    fn attention_sinks(&self, cache: &mut Self::Kv, layer: usize, b: Staged<'_, Self::Indices>, qkv: [&Self::Buf; 3], out: &mut Self::Buf, p: &AttnParams, sinks: &Self::Vector) -> Result<(), BackendError> {
        let _ = (cache, layer, b, qkv, out, p, sinks);
        Err(BackendError(format!("{} has no attention-sinks kernel", self.id())))
    }
    /// `out = act(gate) * up`, element-wise over `[n, width]`.
    fn glu(&self, act: Activation, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf) -> Result<(), BackendError>;
    /// Splits each `2 * width` row of `fused` into gate then up: `out = act(gate) * up`.
    fn glu_fused(&self, act: Activation, fused: &Self::Buf, out: &mut Self::Buf, width: usize) -> Result<(), BackendError>;
    /// `dst = src` (same length).
    fn copy(&self, src: &Self::Buf, dst: &mut Self::Buf) -> Result<(), BackendError>;
    /// `a += b`.
    fn add(&self, a: &mut Self::Buf, b: &Self::Buf) -> Result<(), BackendError>;
    /// `x *= s`.
    fn scale(&self, x: &mut Self::Buf, s: f32) -> Result<(), BackendError>;
    /// `x = cap * tanh(x / cap)`.
    fn softcap(&self, x: &mut Self::Buf, cap: f32) -> Result<(), BackendError>;
    /// Copies the rows `b.rows` of `src` (`[_, width]`) into `dst` in order.
    fn gather_rows(&self, src: &Self::Buf, b: Staged<'_, Self::Indices>, width: usize, dst: &mut Self::Buf) -> Result<(), BackendError>;
    /// Copies a column range `[c0, c0 + dst_width)` of each row of `src`
    /// (`[n, src_width]`) into `dst` (`[n, dst_width]`) — splits a fused QKV.
    fn split_cols(&self, src: &Self::Buf, src_width: usize, c0: usize, dst: &mut Self::Buf, dst_width: usize) -> Result<(), BackendError>;

    /// One attention block over the batch `b` ([`AttnBlock`]); the default
    /// is [`blocks::attention`], composed from the ops above.
    fn attention_block(&self, cache: &mut Self::Kv, b: Staged<'_, Self::Indices>, w: &AttnBlock<'_, Self>, s: &mut Scratch<'_, Self::Buf>) -> Result<(), BackendError>
    where
        Self: Sized,
    {
        blocks::attention(self, cache, b, w, s)
    }

    /// One feed-forward block over `n` tokens ([`FfnBlock`]); the default is
    /// [`blocks::ffn`].
    fn ffn_block(&self, n: usize, w: &FfnBlock<'_, Self>, s: &mut Scratch<'_, Self::Buf>) -> Result<(), BackendError>
    where
        Self: Sized,
    {
        blocks::ffn(self, n, w, s)
    }

    /// One mixture-of-experts block over `n` tokens ([`MoeBlock`]); the
    /// default is [`blocks::moe`] (the router read back, the routes chosen
    /// on the host, then [`DeviceBackend::moe_experts`]).
    fn moe_block(&self, n: usize, w: &MoeBlock<'_, Self>, s: &mut Scratch<'_, Self::Buf>) -> Result<(), BackendError>
    where
        Self: Sized,
    {
        blocks::moe(self, n, w, s)
    }

    /// `out[r.token] = Σ r.weight · down_e(act(gate_e x) · up_e x)` over the
    /// `routes` (`x`: the normed rows, `[n, n_embd]`; every token of `out`
    /// written, zero where no route leads). Only the routed experts' rows
    /// are read. A route to expert `n_expert` is to the block's shared
    /// expert ([`MoeBlock::shared`]). The default refuses: a backend without expert kernels says
    /// so in its plan ([`BackendCaps::experts_kernel`]) before a model loads.
    fn moe_experts(&self, w: &MoeBlock<'_, Self>, x: &Self::Buf, routes: &[Route], out: &mut Self::Buf) -> Result<(), BackendError>
    where
        Self: Sized,
    {
        let _ = (w, x, routes, out);
        Err(BackendError(format!("{} has no mixture-of-experts kernels", self.id())))
    }

    /// The index of the largest value of each `width`-wide row of `x`
    /// (ties: the lowest index; NaN never wins), one per element of `out`.
    /// The default reads the rows back and scans them on the host; a device
    /// backend overrides it so only the ids cross the bus.
    fn argmax_rows(&self, x: &Self::Buf, width: usize, out: &mut [u32]) -> Result<(), BackendError> {
        let mut host = vec![0.0f32; width * out.len()];
        self.read(x, &mut host)?;
        for (o, row) in out.iter_mut().zip(host.chunks(width.max(1))) {
            *o = argmax(row);
        }
        Ok(())
    }

    /// What a top-k sampler needs of each of the `rows` `width`-wide rows
    /// of `x` (logits), `k` candidates a row, into `out`
    /// ([`crate::sampling::TopRows`]). The default reads the rows back and
    /// selects on the host ([`crate::sampling::TopRows::select`], the
    /// reference); a device backend overrides it so only the selection
    /// crosses the bus, and says so in [`DeviceBackend::selects_top_k`].
    fn top_k_rows(
        &self,
        x: &Self::Buf,
        width: usize,
        rows: usize,
        k: usize,
        out: &mut crate::sampling::TopRows,
    ) -> Result<(), BackendError> {
        let mut host = vec![0.0f32; width * rows];
        self.read(x, &mut host)?;
        out.select(&host, width, k);
        Ok(())
    }

    /// Rows `rows` of `x` (rows of `width` floats), in that order, into
    /// `out` (`rows.len() * width`): the rows of a step's sequences that
    /// need them whole, beside the others' top-k selections. The default
    /// reads the buffer up to the last of them.
    fn read_rows(&self, x: &Self::Buf, width: usize, rows: &[usize], out: &mut [f32]) -> Result<(), BackendError> {
        let Some(&last) = rows.iter().max() else {
            return Ok(());
        };
        if out.len() != rows.len() * width {
            return Err(BackendError(format!("{} rows of {width} into {} floats", rows.len(), out.len())));
        }
        let mut host = vec![0.0f32; (last + 1) * width];
        self.read(x, &mut host)?;
        for (o, &r) in out.chunks_exact_mut(width.max(1)).zip(rows) {
            o.copy_from_slice(&host[r * width..(r + 1) * width]);
        }
        Ok(())
    }

    /// Whether [`DeviceBackend::top_k_rows`] runs where the logits are, so a
    /// batch whose samplers can take a selection should ask for one rather
    /// than for the rows (a GPU, whose rows would cross a bus). The default:
    /// no.
    fn selects_top_k(&self) -> bool {
        false
    }

    /// Whether a forward pass of `n` tokens may be recorded
    /// ([`DeviceBackend::run_recorded`]). The default: a decode step of one
    /// token. A backend whose launches for a batch depend on nothing but its
    /// size, its output rows and whether it is one slot's (the rest read from
    /// the staged index lists) says yes to those batches too.
    fn records(&self, n: usize) -> bool {
        n == 1
    }

    /// Enqueues a forward pass's ops by calling `f`, or replays a recording
    /// of them. A backend that records (CUDA graphs) records `f` the first
    /// time it sees `key` with `may_record` set, then replays that recording
    /// for `key` without calling `f`; the rest (the default) just call `f`.
    ///
    /// The caller's contract: `key` changes whenever anything `f` enqueues
    /// would differ — shapes, parameters, the buffers it touches (the
    /// staged [`DeviceBackend::Indices`] among them) — except the contents
    /// of those index lists, which a recording reads from the device at
    /// replay. `may_record` says that `f` allocates nothing. `f` may be
    /// called again (run directly) if recording fails.
    fn run_recorded<E: From<BackendError>>(
        &self,
        key: RecordKey,
        may_record: bool,
        mut f: impl FnMut() -> Result<(), E>,
    ) -> Result<(), E> {
        let _ = (key, may_record);
        f()
    }
}

/// A device backend's attention operands, checked before anything is
/// launched: head sizes its kernel takes (`heads`: the largest, whether it
/// needs them even, and the kernel's name for the error), query heads
/// sharing the KV heads evenly, the layer's cache widths (`cache`: its key
/// and value widths, if the layer has them), the lengths of q, k, v and the
/// output for the batch (`lens`), and every (slot, position) of the batch
/// inside a cache of `n_slots x n_ctx`. Returns the key and value widths.
#[cfg_attr(not(any(feature = "vulkan", feature = "metal")), allow(dead_code))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_attention<I: ?Sized>(
    p: &AttnParams,
    heads: (usize, bool, &str),
    cache: (Option<&usize>, Option<&usize>),
    lens: [usize; 4],
    b: Staged<'_, I>,
    n_slots: usize,
    n_ctx: usize,
    layer: usize,
) -> Result<(usize, usize), BackendError> {
    let (n, (hd, hdv), (max, even, kernel)) = (b.len(), (p.head_dim, p.head_dim_v), heads);
    if hd > max || hdv > max || (even && (hd % 2 != 0 || hdv % 2 != 0)) {
        let sizes = if even { "even sizes" } else { "sizes" };
        return Err(BackendError(format!("head sizes {hd}/{hdv}: the attention {kernel} takes {sizes} up to {max}")));
    }
    if b.seq.len() != n || b.pos.len() != n {
        return Err(BackendError("batch columns of different lengths".into()));
    }
    if p.n_head_kv == 0 || !p.n_head.is_multiple_of(p.n_head_kv) {
        return Err(BackendError(format!("{} heads cannot share {} KV heads", p.n_head, p.n_head_kv)));
    }
    let (kd, vd) = (p.n_head_kv * p.head_dim, p.n_head_kv * p.head_dim_v);
    if cache != (Some(&kd), Some(&vd)) {
        return Err(BackendError(format!("layer {layer}: KV cache not shaped for {kd}/{vd}")));
    }
    let want = [n * p.n_head * p.head_dim, n * kd, n * vd, n * p.n_head * p.head_dim_v];
    for ((what, got), want) in ["attention q", "attention k", "attention v", "attention out"].iter().zip(lens).zip(want) {
        if got != want {
            return Err(BackendError(format!("{what}: expected {want} values, got {got}")));
        }
    }
    for t in 0..n {
        let (s, pos) = (b.seq[t] as usize, b.pos[t] as usize);
        if s >= n_slots || pos >= n_ctx {
            return Err(BackendError(format!("token {t}: slot {s} position {pos} outside the KV cache ({n_slots} slots x {n_ctx})")));
        }
    }
    Ok((kd, vd))
}

/// A vector's values as f32 (any kind, dequantized): what every backend
/// places for [`DeviceBackend::place_vector`]. A tensor of more than one
/// row is not a vector.
pub fn vector_values(t: &HostTensor<'_>) -> Result<Vec<f32>, BackendError> {
    if t.rows > 1 {
        return Err(BackendError(format!("{}: a {}x{} matrix where a vector is expected", t.name, t.rows, t.cols)));
    }
    let mut v = vec![0.0f32; t.cols];
    ferrox_quant::dequantize(t.kind, t.bytes, &mut v).map_err(|e| BackendError(format!("{}: {e}", t.name)))?;
    Ok(v)
}

/// The index of the largest value (ties: the lowest index; NaN never wins;
/// 0 when nothing exceeds minus infinity) — the host twin of
/// [`DeviceBackend::argmax_rows`].
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = f32::NEG_INFINITY;
    let mut at = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > best {
            best = v;
            at = i;
        }
    }
    at as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The environment decides before the probe is consulted: a forced-off
    /// build must never open a device.
    #[test]
    fn env_decides_before_the_probe_is_consulted() {
        for off in ["0", "false", "off", "cpu", "OFF"] {
            assert_eq!(env_or_probe("FERROX_CUDA", Some(off), "cuda", || panic!("probed after {off}")), Ok(false));
        }
        for on in ["1", "true", "on", "cuda", "CUDA"] {
            assert_eq!(env_or_probe("FERROX_CUDA", Some(on), "cuda", || panic!("probed after {on}")), Ok(true));
        }
    }

    /// Another backend's alias is not a value this one takes: it is an
    /// error naming the variable, as is any other value that does not parse
    /// (it used to probe, so a typo ran whatever the probe found).
    #[test]
    fn a_value_that_does_not_parse_is_an_error_naming_the_variable() {
        for bad in ["metal", "banana", "2"] {
            let e = env_or_probe("FERROX_CUDA", Some(bad), "cuda", || panic!("probed after {bad}")).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains("FERROX_CUDA") && msg.contains("auto") && msg.contains("cpu"), "{msg}");
        }
        assert_eq!(env_or_probe("FERROX_METAL", Some("metal"), "metal", || false), Ok(true));
    }

    /// Unset and `auto` defer to the probe.
    #[test]
    fn unset_or_auto_defers_to_the_probe() {
        assert_eq!(env_or_probe("FERROX_CUDA", None, "cuda", || true), Ok(true));
        assert_eq!(env_or_probe("FERROX_CUDA", None, "cuda", || false), Ok(false));
        assert_eq!(env_or_probe("FERROX_CUDA", Some("auto"), "cuda", || true), Ok(true));
    }

    /// Every registry variant but the CPU is claimed by exactly one
    /// accelerator with its own identity (vacuous for the table's
    /// accelerators until one lands, but the count check is not: a registry
    /// variant with no backend behind it fails here).
    #[test]
    fn every_backend_id_is_distinct_and_an_accelerator() {
        #[allow(unused_mut)]
        let mut ids: Vec<(Backend, &str)> = Vec::new();
        #[allow(unused_macros)]
        macro_rules! collect {
            ($b:ty) => {
                assert!(<$b as BackendCaps>::ID.is_accelerator());
                ids.push((<$b as BackendCaps>::ID, <$b as BackendCaps>::NAME));
            };
        }
        with_gpu_backend_caps!(collect);
        for (i, (id, name)) in ids.iter().enumerate() {
            for (other, other_name) in &ids[i + 1..] {
                assert_ne!(id, other, "{name} and {other_name} report as one backend");
            }
        }
        assert_eq!(ids.len() + 1, Backend::ALL.len(), "registry variants without a backend: {:?}", Backend::ALL);
    }

    /// The seed's guard: a kind claimed in a backend's capability table has
    /// a launchable kernel in its crate, and a kernel the crate has is
    /// claimed (else it would never be planned). Over every kind, for every
    /// compiled-in backend; a build without accelerators checks none.
    #[test]
    fn every_kind_a_compiled_backend_claims_can_actually_be_launched() {
        #[allow(unused_mut)]
        let mut checked: Vec<&str> = Vec::new();
        #[allow(unused_macros)]
        macro_rules! check {
            ($b:ty) => {
                for &k in QuantKind::ALL {
                    let claimed = <$b as BackendCaps>::matvec_kernel(k).is_some();
                    let launchable = <$b as BackendLaunch>::has_launch(k);
                    assert_eq!(claimed, launchable, "{}: {k} claimed {claimed}, launchable {launchable}", <$b as BackendCaps>::NAME);
                    let (gemm, has_gemm) = (<$b as BackendCaps>::gemm_supported(k), <$b as BackendLaunch>::has_gemm(k));
                    assert_eq!(gemm, has_gemm, "{}: {k} GEMM claimed {gemm}, launchable {has_gemm}", <$b as BackendCaps>::NAME);
                }
                checked.push(<$b as BackendCaps>::NAME);
            };
        }
        with_gpu_backends!(check);
        if checked.is_empty() {
            eprintln!("NOT CHECKED: no accelerator is compiled into this build (enable a feature such as `cuda`)");
        }
    }

    /// A claimed matvec kernel is named after its kind on every backend.
    #[test]
    fn a_claimed_matvec_kernel_is_named_after_its_kind() {
        #[allow(unused_macros)]
        macro_rules! check {
            ($b:ty) => {
                for &k in QuantKind::ALL {
                    if let Some(name) = <$b as BackendCaps>::matvec_kernel(k) {
                        let (name, kind) = (name.to_ascii_lowercase(), k.name().to_ascii_lowercase());
                        assert!(name.contains(&kind), "{} names {k:?} {name:?}", <$b as BackendCaps>::NAME);
                    }
                }
            };
        }
        with_gpu_backend_caps!(check);
    }
}
