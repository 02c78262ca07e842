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
//! weights are placed once at load ([`DeviceBackend::place`]), activations
//! and the KV cache live in the backend's own buffers for the whole forward
//! pass, and only token ids go in and logits come out. The CPU is the first
//! `DeviceBackend` and the reference every other one is tested against.
//!
//! Only backends that exist are in the table; CUDA is the first accelerator,
//! Vulkan and Metal join it with their crates.

#[cfg(test)]
mod conformance;
pub mod cpu;
pub mod cuda;
pub mod split;
pub use cuda::Cuda;

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
pub use ferrox_ops::{AttnParams, RopeParams};

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

/// A weight as the file holds it, handed to [`DeviceBackend::place`].
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

/// The data plane: everything a forward pass does, on the backend's own
/// buffers. Implemented by the CPU (the reference) and by each accelerator.
///
/// Shapes are explicit and checked: a mismatch is a [`BackendError`], never
/// a panic. Activations are row-major `[n_tokens, width]`.
pub trait DeviceBackend: Send + Sync {
    /// A placed weight (device memory, or a borrow of the mapped file).
    type Weight: Send + Sync;
    /// An f32 activation buffer in device memory.
    type Buf: Send;
    /// The KV cache: `n_slots` sequences of `n_ctx` positions per layer.
    type Kv: Send;

    /// Opens the backend as `opts` says (the device ordinal, CPU threads);
    /// [`with_backend`] calls this for the backend a user named.
    fn open(opts: &DeviceOptions) -> Result<Self, BackendError>
    where
        Self: Sized;
    /// The registry identity of this backend.
    fn id(&self) -> Backend;
    /// Threads (CPU) or streams the backend uses; reported, not tuned here.
    fn threads(&self) -> usize;
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
    /// Places one weight for its whole lifetime (upload, repack, or borrow).
    fn place(&self, t: &HostTensor<'_>) -> Result<Self::Weight, BackendError>;
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

    /// `out[i] = table[ids[i]]` (dequantized), `out` is `[ids.len(), cols]`.
    fn get_rows(&self, table: &Self::Weight, ids: &[u32], out: &mut Self::Buf) -> Result<(), BackendError>;
    /// `y = x W^T` for `n` rows of `x`.
    fn matmul(&self, w: &Self::Weight, x: &Self::Buf, y: &mut Self::Buf, n: usize) -> Result<(), BackendError>;
    /// `y[t] += b` for each of `n` rows.
    fn add_bias(&self, y: &mut Self::Buf, b: &Self::Weight, n: usize) -> Result<(), BackendError>;
    /// RMS norm of each `w.len()`-wide row of `x` in place, times `w`.
    fn rms_norm(&self, x: &mut Self::Buf, w: &Self::Weight, eps: f32) -> Result<(), BackendError>;
    /// RoPE on `x` (`[positions.len(), n_heads * head_dim]`) in place.
    fn rope(
        &self,
        x: &mut Self::Buf,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        p: &RopeParams,
        factors: Option<&Self::Weight>,
    ) -> Result<(), BackendError>;
    /// Stores `k`/`v` of the batch in layer `layer` of the cache, then writes
    /// causal attention of `q` over each token's own sequence into `out`.
    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        batch: &Batch,
        q: &Self::Buf,
        k: &Self::Buf,
        v: &Self::Buf,
        out: &mut Self::Buf,
        p: &AttnParams,
    ) -> Result<(), BackendError>;
    /// `out = act(gate) * up`, element-wise over `[n, width]`.
    fn glu(&self, act: crate::arch::Activation, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf) -> Result<(), BackendError>;
    /// Splits each `2 * width` row of `fused` into gate then up: `out = act(gate) * up`.
    fn glu_fused(&self, act: crate::arch::Activation, fused: &Self::Buf, out: &mut Self::Buf, width: usize) -> Result<(), BackendError>;
    /// `dst = src` (same length).
    fn copy(&self, src: &Self::Buf, dst: &mut Self::Buf) -> Result<(), BackendError>;
    /// `a += b`.
    fn add(&self, a: &mut Self::Buf, b: &Self::Buf) -> Result<(), BackendError>;
    /// `x *= s`.
    fn scale(&self, x: &mut Self::Buf, s: f32) -> Result<(), BackendError>;
    /// `x = cap * tanh(x / cap)`.
    fn softcap(&self, x: &mut Self::Buf, cap: f32) -> Result<(), BackendError>;
    /// Copies rows `rows` of `src` (`[_, width]`) into `dst` in order.
    fn gather_rows(&self, src: &Self::Buf, rows: &[usize], width: usize, dst: &mut Self::Buf) -> Result<(), BackendError>;
    /// Copies a column range `[c0, c0 + dst_width)` of each row of `src`
    /// (`[n, src_width]`) into `dst` (`[n, dst_width]`) — splits a fused QKV.
    fn split_cols(&self, src: &Self::Buf, src_width: usize, c0: usize, dst: &mut Self::Buf, dst_width: usize) -> Result<(), BackendError>;

    /// `y_i = x W_i^T` for several weights over the same `n` rows of `x` (a
    /// layer's Q, K and V; gate and up). The default is one
    /// [`DeviceBackend::matmul`] each; a device backend may do them in one launch.
    fn matmul_many(&self, x: &Self::Buf, n: usize, outs: &mut [(&Self::Weight, &mut Self::Buf)]) -> Result<(), BackendError> {
        for (w, y) in outs.iter_mut() {
            self.matmul(w, x, y, n)?;
        }
        Ok(())
    }

    /// RoPE on the queries `q` (`n_head` heads) and keys `k` (`n_head_kv`
    /// heads) of one layer at the same positions. The default is two
    /// [`DeviceBackend::rope`] calls; a device backend does both in one launch.
    #[allow(clippy::too_many_arguments)]
    fn rope_qk(
        &self,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        positions: &[u32],
        n_head: usize,
        n_head_kv: usize,
        head_dim: usize,
        p: &RopeParams,
        factors: Option<&Self::Weight>,
    ) -> Result<(), BackendError> {
        self.rope(q, positions, n_head, head_dim, p, factors)?;
        self.rope(k, positions, n_head_kv, head_dim, p, factors)
    }

    /// `h = act(x Wg^T) * (x Wu^T)` over `n` tokens: the gate and up
    /// projections and the gated activation. `gate` and `up` are scratch
    /// (a backend that fuses the three may leave them unwritten). The
    /// default is [`DeviceBackend::matmul_many`] then [`DeviceBackend::glu`].
    #[allow(clippy::too_many_arguments)]
    fn gate_up_glu(
        &self,
        act: crate::arch::Activation,
        x: &Self::Buf,
        n: usize,
        wg: &Self::Weight,
        wu: &Self::Weight,
        gate: &mut Self::Buf,
        up: &mut Self::Buf,
        h: &mut Self::Buf,
    ) -> Result<(), BackendError> {
        self.matmul_many(x, n, &mut [(wg, &mut *gate), (wu, &mut *up)])?;
        self.glu(act, gate, up, h)
    }

    /// `x += add` (when given), then `y_i = (rms_norm(x) * norm) W_i^T`: a
    /// block's residual add and norm, then its projections. `cur` is
    /// scratch for the normed rows (a backend that fuses the norm into the
    /// matvecs may leave it unwritten). The default is
    /// [`DeviceBackend::add_rms_norm`] then [`DeviceBackend::matmul_many`].
    #[allow(clippy::too_many_arguments)]
    fn norm_matmul_many(
        &self,
        x: &mut Self::Buf,
        add: Option<&Self::Buf>,
        norm: &Self::Weight,
        eps: f32,
        cur: &mut Self::Buf,
        n: usize,
        outs: &mut [(&Self::Weight, &mut Self::Buf)],
    ) -> Result<(), BackendError> {
        self.add_rms_norm(x, add, norm, eps, cur)?;
        self.matmul_many(cur, n, outs)
    }

    /// The input side of a layer's attention, for layers whose Q, K and V
    /// take no bias and no norm of their own: [`DeviceBackend::norm_matmul_many`]
    /// into `qkv` (weights `wqkv`), then [`DeviceBackend::rope_attention`]
    /// over the batch (the default). A device backend may rotate the
    /// queries and keys and store the cache in the projection's epilogue.
    #[allow(clippy::too_many_arguments)]
    fn norm_qkv_attention(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        batch: &Batch,
        x: &mut Self::Buf,
        add: Option<&Self::Buf>,
        norm: &Self::Weight,
        eps: f32,
        cur: &mut Self::Buf,
        wqkv: [&Self::Weight; 3],
        qkv: [&mut Self::Buf; 3],
        out: &mut Self::Buf,
        rope: &RopeParams,
        factors: Option<&Self::Weight>,
        p: &AttnParams,
    ) -> Result<(), BackendError> {
        let ([wq, wk, wv], [q, k, v]) = (wqkv, qkv);
        self.norm_matmul_many(x, add, norm, eps, cur, batch.len(), &mut [(wq, &mut *q), (wk, &mut *k), (wv, &mut *v)])?;
        self.rope_attention(kv, layer, batch, q, k, v, out, rope, factors, p)
    }

    /// [`DeviceBackend::norm_matmul_many`]'s add and norm, then
    /// [`DeviceBackend::gate_up_glu`] over the normed rows.
    #[allow(clippy::too_many_arguments)]
    fn norm_gate_up_glu(
        &self,
        act: crate::arch::Activation,
        x: &mut Self::Buf,
        add: Option<&Self::Buf>,
        norm: &Self::Weight,
        eps: f32,
        cur: &mut Self::Buf,
        n: usize,
        wg: &Self::Weight,
        wu: &Self::Weight,
        gate: &mut Self::Buf,
        up: &mut Self::Buf,
        h: &mut Self::Buf,
    ) -> Result<(), BackendError> {
        self.add_rms_norm(x, add, norm, eps, cur)?;
        self.gate_up_glu(act, cur, n, wg, wu, gate, up, h)
    }

    /// `acc += x W^T` over `n` rows: a projection into the residual stream.
    /// `scratch` holds the product where the backend does not add it in
    /// the matmul itself. The default is [`DeviceBackend::matmul`] then
    /// [`DeviceBackend::add`].
    fn matmul_acc(&self, w: &Self::Weight, x: &Self::Buf, n: usize, scratch: &mut Self::Buf, acc: &mut Self::Buf) -> Result<(), BackendError> {
        self.matmul(w, x, scratch, n)?;
        self.add(acc, scratch)
    }

    /// RoPE on a layer's queries and keys at the batch's positions, then
    /// [`DeviceBackend::attention`] (which stores the keys and values into
    /// the cache first). The default is [`DeviceBackend::rope_qk`] then
    /// `attention`; a device backend rotates and stores in one launch.
    #[allow(clippy::too_many_arguments)]
    fn rope_attention(
        &self,
        kv: &mut Self::Kv,
        layer: usize,
        batch: &Batch,
        q: &mut Self::Buf,
        k: &mut Self::Buf,
        v: &Self::Buf,
        out: &mut Self::Buf,
        rope: &RopeParams,
        factors: Option<&Self::Weight>,
        p: &AttnParams,
    ) -> Result<(), BackendError> {
        self.rope_qk(q, k, &batch.pos, p.n_head, p.n_head_kv, p.head_dim, rope, factors)?;
        self.attention(kv, layer, batch, q, k, v, out, p)
    }

    /// `x += add` (when given), then `out = rms_norm(x) * w`: the residual
    /// add and the next block's norm. The default is the three separate ops;
    /// a backend where a launch costs overrides it with one kernel.
    fn add_rms_norm(&self, x: &mut Self::Buf, add: Option<&Self::Buf>, w: &Self::Weight, eps: f32, out: &mut Self::Buf) -> Result<(), BackendError> {
        if let Some(a) = add {
            self.add(x, a)?;
        }
        self.copy(x, out)?;
        self.rms_norm(out, w, eps)
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

    /// The index vectors a forward pass is about to hand the ops (token ids,
    /// positions, slots, output rows), so a device backend can upload them
    /// in one copy instead of one per op. A hint: the default does nothing,
    /// and ops given a list that was not staged still work.
    fn stage_indices(&self, lists: &[&[u32]]) -> Result<(), BackendError> {
        let _ = lists;
        Ok(())
    }

    /// Enqueues a forward pass's ops by calling `f`, or replays a recording
    /// of them. A backend that records (CUDA graphs) records `f` the first
    /// time it sees `key` with `may_record` set, then replays that recording
    /// for `key` without calling `f`; the rest (the default) just call `f`.
    ///
    /// The caller's contract: `key` changes whenever anything `f` enqueues
    /// would differ — shapes, parameters, the buffers it touches — except the
    /// contents of the staged index lists ([`DeviceBackend::stage_indices`]),
    /// which a recording reads from the device at replay. `may_record` says
    /// that `f` allocates nothing and that each staged list is distinct, so
    /// every lookup resolves to its own slot. `f` may be called again (run
    /// directly) if recording fails.
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
