//! The CUDA backend at the seam: its capability table (compiled on every
//! build) and, with the `cuda` feature, the [`DeviceBackend`] over
//! `ferrox-cuda`'s device.
//!
//! The decision: the whole model is resident. Weights are uploaded once in
//! their file's block format, activations and the f16 KV cache never leave
//! the device, and a forward pass's index lists (token ids, slots,
//! positions, output rows) are staged in one copy into a buffer kept per
//! batch shape ([`DeviceBackend::stage`]), so a decode step crosses the bus
//! for the token id, its position and the logits only, and a recorded step
//! reads each step's lists in place. The blocks are this backend's own
//! (`attention_block`, `ffn_block`): the fused launches where the shapes
//! allow, the seam's composition of plain ops where they do not.

use ferrox_ops::cuda as cuda_ops;
use ferrox_quant::QuantKind;

use super::BackendCaps;
use crate::arch::Role;
use crate::kernel_registry::{Backend, LayerMats};

/// The CUDA backend (`ferrox-cuda`). Without the `cuda` feature it is only a
/// capability table.
pub struct Cuda {
    #[cfg(feature = "cuda")]
    dev: std::sync::Arc<ferrox_cuda::Device>,
    /// Recorded decode steps by key, most recent last; `None` when
    /// recording is off (a `measure` build's `FERROX_CUDA_GRAPHS=0`) or failed once.
    #[cfg(feature = "cuda")]
    graphs: std::sync::Mutex<Option<Vec<Recorded>>>,
    /// Whether sampled steps read back top-k selections made on the device
    /// (off only in a `measure` build with `FERROX_CUDA_TOP_K=0`: whole rows).
    #[cfg(feature = "cuda")]
    select_top: bool,
}

/// A recorded decode step and the key it was recorded under.
#[cfg(feature = "cuda")]
type Recorded = (super::RecordKey, ferrox_cuda::Graph);

impl BackendCaps for Cuda {
    const ID: Backend = Backend::Cuda;
    const NAME: &'static str = "CUDA";
    const GEMM_FALLBACK: &'static str = "CUDA matvec per token (cuBLAS not found)";

    /// Each kind of `ferrox_ops::cuda`'s table: the unit decoder every
    /// shape can take. `every_kind_a_compiled_backend_claims_can_actually_be_launched`
    /// ties the table to the kernels `kernels.cu` defines.
    fn matvec_kernel(kind: QuantKind) -> Option<String> {
        cuda_ops::matvec(kind, 1).map(|m| m.kernel(kind))
    }

    /// Dequantize-to-f16 + cuBLAS GEMM for every kind of the table.
    fn gemm_supported(kind: QuantKind) -> bool {
        cuda_ops::kind_kernels(kind).is_some()
    }

    /// The streaming kernels where the shape fits them (the choice
    /// `ferrox_cuda::Device` makes, from the same function).
    fn decode_kernel(kind: QuantKind, cols: usize) -> Option<String> {
        let m = cuda_ops::matvec(kind, cols)?;
        Some(match m {
            cuda_ops::Matvec::Int8Stream => format!("cuda {} (activations quantized to int8 once per input)", m.kernel(kind)),
            cuda_ops::Matvec::F16Stream => format!("cuda {} (16-byte loads)", m.kernel(kind)),
            cuda_ops::Matvec::Unit => format!("cuda {} (32-element unit decoder)", m.kernel(kind)),
        })
    }

    /// The routed experts' kernels of a kind (routing, the experts and
    /// their weighted sum stay on the device: `moe_route`, the experts,
    /// `moe_sum`). The int8 kinds: one int8 matvec a (token, expert) pair
    /// at decode (`mmvq_id_<kind>`, gate and up with the GLU in one launch),
    /// and from [`cuda_ops::MOE_GROUPED_PAIRS`] pairs an expert on
    /// average the batch sorted by expert through the grouped tensor-core
    /// GEMM (`moe_sort`, `mmq_id_<kind>_n<t>`); every other kind the unit
    /// decoder's `matvec_id_<kind>` a pair.
    fn experts_kernel(kind: QuantKind) -> Option<String> {
        let k = cuda_ops::kind_kernels(kind)?;
        Some(match &k.experts_int8 {
            Some((mv, _)) => format!(
                "cuda {mv} (int8, a routed expert's rows a pair; batches of {}+ pairs an expert: mmq_id grouped by expert)",
                cuda_ops::MOE_GROUPED_PAIRS
            ),
            None => format!("cuda {} (the routed experts' rows, routed on the device)", k.matvec_id),
        })
    }

    /// The fused launches `ferrox_cuda::Device` takes at decode, by the same
    /// rules (`ferrox_ops::cuda`): Q, K and V in one launch (with RoPE and
    /// the cache store in its epilogue, and for F16 the norm, where those
    /// apply), gate and up with the GLU, projections added into the residual.
    fn fused_decode(role: Role, l: &LayerMats) -> Option<String> {
        // A norm fuses into the F16 launches only with no residual add
        // pending before it (`add` is `None`).
        let attn_clean = l.first || l.down_direct;
        match role {
            Role::AttnQ | Role::AttnK | Role::AttnV => {
                let qkv = l.qkv?;
                let m = cuda_ops::one_launch(&qkv)?;
                let (kernel, f16) = (m.kernel(qkv[0].kind), m == cuda_ops::Matvec::F16Stream);
                let norm = f16 && attn_clean && cuda_ops::norm_fuses(qkv[0].cols);
                let rope = l.qkv_direct && cuda_ops::qkv_rope_epilogue(qkv, l.halves, l.n_rot, l.head_dim);
                Some(match (norm, rope) {
                    (true, true) => "cuda matvec_f16_norm_stream (the norm, Q, K and V in one launch; RoPE and the KV-cache store in its epilogue)".into(),
                    (true, false) => "cuda matvec_f16_norm_stream (the norm, Q, K and V in one launch)".into(),
                    (false, true) => format!("cuda {kernel} (Q, K and V in one launch; RoPE and the KV-cache store in its epilogue)"),
                    (false, false) => format!("cuda {kernel} (Q, K and V in one launch)"),
                })
            }
            Role::FfnGate | Role::FfnUp => {
                let [g, u] = l.gate_up?;
                let glu = cuda_ops::glu_launch(g, u)?;
                Some(match glu.as_str() {
                    "matvec_f16_glu_stream" if l.out_direct && cuda_ops::norm_fuses(g.cols) => {
                        "cuda matvec_f16_glu_norm_stream (the norm, gate, up and the GLU in one launch)".into()
                    }
                    _ => format!("cuda {glu} (gate, up and the GLU in one launch)"),
                })
            }
            Role::AttnOut | Role::FfnDown => {
                let (m, direct) = if role == Role::AttnOut { (l.out, l.out_direct) } else { (l.down?, l.down_direct) };
                let kernel = cuda_ops::matvec(m.kind, m.cols)?.kernel(m.kind);
                (direct && cuda_ops::adds_into_residual(m)).then(|| format!("cuda {kernel} (adds into the residual stream)"))
            }
            _ => None,
        }
    }

    /// `kernels.cu`'s attention kernels (`attention`, `attention_dec`,
    /// `attention_mma`) keep a head in registers and shared memory sized for 256.
    fn max_head_dim() -> Option<usize> {
        Some(256)
    }

    fn prefill_kernel(kind: QuantKind, cols: usize) -> String {
        let (Some(k), Some(m)) = (cuda_ops::kind_kernels(kind), cuda_ops::matvec(kind, cols)) else {
            return "none".into();
        };
        let small = cuda_ops::GEMM_MIN_TOKENS + 1;
        let (gemm_from, mma) = if cuda_ops::mma_fits(kind, cols, small) {
            // The tiles batches of `small..=MMA_MAX_TOKENS` take.
            let mut tiles: Vec<String> = (small..=cuda_ops::MMA_MAX_TOKENS).filter_map(|n| cuda_ops::mma_kernel(kind, n)).collect();
            tiles.dedup();
            let range = format!("{small}-{}", cuda_ops::MMA_MAX_TOKENS);
            (cuda_ops::MMA_MAX_TOKENS + 1, format!("; {range}: cuda {} on the tensor cores, sm_80+", tiles.join("/")))
        } else {
            (small, String::new())
        };
        format!(
            "cuda {} + cuBLAS f16 GEMM (batches of {gemm_from}+{mma}; smaller ones {}; without cuBLAS: {})",
            k.dequant_f16,
            m.kernel(kind),
            Self::GEMM_FALLBACK
        )
    }
}

#[cfg(feature = "cuda")]
mod dispatch {
    use std::sync::Arc;

    use ferrox_cuda::{Buf, Device, IndexView, Indices, Kv, Matrix};
    use ferrox_ops::{AttnShape, RopeShape};
    use ferrox_quant::QuantKind;

    use super::Cuda;
    use crate::arch::Activation;
    use crate::backend::blocks::{self, Input, Projection};
    use crate::backend::{
        AttnBlock, AttnParams, BackendError, BackendLaunch, DeviceBackend, FfnBlock, HostTensor, MoeBlock, QkvWeights, RopeParams, Scratch, Staged,
    };
    use crate::kernel_registry::Backend;

    fn be(e: ferrox_cuda::CudaError) -> BackendError {
        BackendError::new(e)
    }

    /// Recorded decode steps kept per backend (one per live context, in
    /// practice), most recent last.
    const GRAPH_CACHE: usize = 8;

    /// A forward pass's index lists on the device, for passes of up to `cap`
    /// tokens: token ids, slots, positions and output rows, written in one
    /// copy at fixed offsets (a recorded decode step reads them there).
    pub struct CudaIndices {
        on: Indices,
        cap: usize,
    }

    impl CudaIndices {
        /// The list at `slot` (0 tokens, 1 slots, 2 positions, 3 rows) of a
        /// pass of `len` entries.
        fn list(&self, slot: usize, len: usize) -> Result<IndexView<'_>, BackendError> {
            if len > self.cap {
                return Err(BackendError(format!("{len} indices staged into room for {}", self.cap)));
            }
            self.on.part(slot * self.cap, len).ok_or_else(|| BackendError("staged indices shorter than asked".into()))
        }
    }

    impl Cuda {
        /// Whether this process should use CUDA: `FERROX_CUDA` decides
        /// (`0|off|cpu` no, `1|on|cuda` yes), else (`auto`, unset) a device
        /// must be present; a value it does not take is an error.
        pub fn enabled() -> Result<bool, BackendError> {
            Cuda::env_value(Device::probe).map_err(BackendError::new)
        }

        /// `FERROX_CUDA` read and checked, `probe` asked when it is `auto` or
        /// unset.
        fn env_value(probe: impl FnOnce() -> bool) -> Result<bool, crate::backend::BadValue> {
            let v = ferrox_quant::knob::raw("FERROX_CUDA")?;
            crate::backend::env_or_probe("FERROX_CUDA", v.as_deref(), "cuda", probe)
        }

        /// Checks `FERROX_CUDA` without probing for a device.
        pub(crate) fn env_setting() -> Result<(), crate::backend::BadValue> {
            Cuda::env_value(|| false).map(drop)
        }

        /// Whether decode steps are recorded as CUDA graphs: always, except
        /// in a `measure` build with `FERROX_CUDA_GRAPHS=0` (the launches
        /// one by one, to measure what the graph saves).
        #[cfg(feature = "measure")]
        pub(crate) fn graphs_setting() -> Result<bool, crate::backend::BadValue> {
            ferrox_quant::knob::switch("FERROX_CUDA_GRAPHS", true)
        }

        /// Without the `measure` feature decode steps are always recorded.
        #[cfg(not(feature = "measure"))]
        pub(crate) fn graphs_setting() -> Result<bool, crate::backend::BadValue> {
            Ok(true)
        }

        /// Whether sampled steps read back top-k selections: always, except
        /// in a `measure` build with `FERROX_CUDA_TOP_K=0` (whole rows, to
        /// measure what the selection saves).
        #[cfg(feature = "measure")]
        pub(crate) fn top_k_setting() -> Result<bool, crate::backend::BadValue> {
            ferrox_quant::knob::switch("FERROX_CUDA_TOP_K", true)
        }

        /// Without the `measure` feature sampled steps always read selections.
        #[cfg(not(feature = "measure"))]
        pub(crate) fn top_k_setting() -> Result<bool, crate::backend::BadValue> {
            Ok(true)
        }

        /// Opens GPU `ordinal`, unless `FERROX_CUDA` turned CUDA off.
        pub fn open_device(ordinal: usize) -> Result<Cuda, BackendError> {
            crate::backend::check_env().map_err(BackendError::new)?;
            if !Cuda::enabled()? {
                return Err(BackendError(
                    "cannot open CUDA: it is off (FERROX_CUDA=0), or no CUDA device with a loadable driver was found".into(),
                ));
            }
            let dev = Device::open(ordinal).map_err(|e| BackendError(format!("cannot open CUDA device {ordinal}: {e}")))?;
            Cuda::on(std::sync::Arc::new(dev))
        }

        fn on(dev: Arc<Device>) -> Result<Cuda, BackendError> {
            let graphs = Cuda::graphs_setting().map_err(BackendError::new)?;
            let select_top = Cuda::top_k_setting().map_err(BackendError::new)?;
            Ok(Cuda { dev, graphs: std::sync::Mutex::new(graphs.then(Vec::new)), select_top })
        }

        /// Whether decode steps are recorded and replayed as CUDA graphs.
        pub fn graphs_enabled(&self) -> bool {
            self.graphs.lock().is_ok_and(|g| g.is_some())
        }

        /// The opened device.
        pub fn device(&self) -> &Device {
            &self.dev
        }

        /// Runs `f` with the batch's slots and positions on the device,
        /// after checking that every token's slot and position lies inside
        /// the cache.
        fn with_slots<R>(
            &self,
            kv: &mut Kv,
            b: Staged<'_, CudaIndices>,
            f: impl FnOnce(&mut Kv, IndexView<'_>, IndexView<'_>) -> Result<R, BackendError>,
        ) -> Result<R, BackendError> {
            let n = b.len();
            if b.seq.len() != n || b.pos.len() != n {
                return Err(BackendError("batch columns of different lengths".into()));
            }
            for t in 0..n {
                let (s, pos) = (b.seq[t] as usize, b.pos[t] as usize);
                if s >= kv.n_slots() || pos >= kv.n_ctx() {
                    return Err(BackendError(format!(
                        "token {t}: slot {s} position {pos} outside the KV cache ({} slots x {})",
                        kv.n_slots(),
                        kv.n_ctx()
                    )));
                }
            }
            f(kv, b.dev.list(1, n)?, b.dev.list(2, n)?)
        }

        /// The Q/K/V projections, RoPE, the cache store and attention of a
        /// block whose projections take no bias and no norm: the norm and
        /// the RoPE epilogue in the projection's launch where they fuse, else
        /// the norm apart, else the projections apart too.
        fn norm_qkv_attention(
            &self,
            cache: &mut Kv,
            b: Staged<'_, CudaIndices>,
            w: &AttnBlock<'_, Cuda>,
            ms: [&Matrix; 3],
            s: &mut Scratch<'_, Buf>,
        ) -> Result<(), BackendError> {
            let p = &w.attn;
            let (r, a) = (RopeShape::new(p.n_head, p.head_dim, &w.rope), AttnShape::new(p, b.seq));
            let n = b.len();
            let pending = std::mem::take(&mut s.pending);
            let Scratch { x, cur, q, k, v, attn, o, .. } = s;
            let mut fused = |x: &Buf, norm: Option<(&Buf, f32)>, q: &mut Buf, k: &mut Buf, v: &mut Buf, out: &mut Buf| {
                self.with_slots(cache, b, |kv, seq, pos| {
                    self.dev
                        .qkv_rope_attention(kv, w.layer, seq, pos, x, norm, ms, [q, k, v], out, &a, &r, w.factors)
                        .map_err(be)
                })
            };
            if !pending && fused(x, Some((w.norm, w.eps)), q, k, v, attn)? {
                return Ok(());
            }
            if !pending && ms.iter().all(|m| m.kind == QuantKind::F16) {
                // F16 without the RoPE epilogue: the norm may still fuse.
                self.norm_matmul_many(x, None, w.norm, w.eps, cur, n, &mut [(ms[0], &mut **q), (ms[1], &mut **k), (ms[2], &mut **v)])?;
            } else {
                // The norm apart (the int8 kinds read its q8 copy).
                self.add_rms_norm(x, pending.then_some(&**o), w.norm, w.eps, cur)?;
                if fused(cur, None, q, k, v, attn)? {
                    return Ok(());
                }
                self.matmul_many(cur, n, &mut [(ms[0], &mut **q), (ms[1], &mut **k), (ms[2], &mut **v)])?;
            }
            self.rope_attention(cache, b, w, s)
        }

        /// `x += add` (when given), then the projections of the normed rows:
        /// the norm fused into the matvecs where it can be, else apart into `cur`.
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn norm_matmul_many(
            &self,
            x: &mut Buf,
            add: Option<&Buf>,
            norm: &Buf,
            eps: f32,
            cur: &mut Buf,
            n: usize,
            outs: &mut [(&Matrix, &mut Buf)],
        ) -> Result<(), BackendError> {
            if add.is_none() && self.dev.norm_matmul_many(x, norm, eps, n, outs).map_err(be)? {
                return Ok(());
            }
            self.add_rms_norm(x, add, norm, eps, cur)?;
            self.dev.matmul_many(cur, n, outs).map_err(be)
        }

        /// The query and key norms, then RoPE, the cache store and attention
        /// in one launch where it fuses (else [`blocks::rope_attention`]).
        fn rope_attention(&self, cache: &mut Kv, b: Staged<'_, CudaIndices>, w: &AttnBlock<'_, Cuda>, s: &mut Scratch<'_, Buf>) -> Result<(), BackendError> {
            let p = &w.attn;
            if !self.dev.fuses() || !p.head_dim.is_multiple_of(2) {
                return blocks::rope_attention(self, cache, b, w, s);
            }
            if let Some((qn, kn)) = w.qk_norm {
                self.rms_norm(s.q, qn, w.eps)?;
                self.rms_norm(s.k, kn, w.eps)?;
            }
            let (r, a) = (RopeShape::new(p.n_head, p.head_dim, &w.rope), AttnShape::new(p, b.seq));
            let Scratch { q, k, v, attn, .. } = s;
            self.with_slots(cache, b, |kv, seq, pos| {
                self.dev.rope_attention(kv, w.layer, seq, pos, q, k, v, attn, &a, &r, w.factors).map_err(be)
            })
        }

        /// An output projection: added into the residual stream inside the
        /// matvec where nothing comes between (else [`blocks::project`]).
        fn project(&self, p: &Projection<'_, Cuda>, n: usize, s: &mut Scratch<'_, Buf>, input: Input) -> Result<(), BackendError> {
            if p.direct() {
                let x = match input {
                    Input::Attn => &*s.attn,
                    Input::Hidden => &*s.h,
                };
                if self.dev.matmul_acc(p.w, x, s.x, n).map_err(be)? {
                    s.pending = false;
                    return Ok(());
                }
            }
            blocks::project(self, p, n, s, input)
        }
    }

    /// The kernels `kernels.cu` defines (what `Device::open` can load).
    fn defined() -> &'static std::collections::BTreeSet<String> {
        static DEFINED: std::sync::OnceLock<std::collections::BTreeSet<String>> = std::sync::OnceLock::new();
        DEFINED.get_or_init(|| ferrox_cuda::defined_kernels(ferrox_cuda::kernel_source()))
    }

    impl BackendLaunch for Cuda {
        fn has_launch(kind: QuantKind) -> bool {
            let Some(k) = ferrox_ops::cuda::kind_kernels(kind) else {
                // An unclaimed kind is launchable if its unit decoder exists anyway.
                return defined().contains(&format!("matvec_{}", kind.name().to_ascii_lowercase()));
            };
            let int8 = k.int8.iter().flat_map(|(a, b)| [a, b]);
            let experts = k.experts_int8.iter().flat_map(|(a, b)| std::iter::once(a).chain(b));
            let all = [&k.matvec, &k.get_rows, &k.matvec_id].into_iter().chain(int8).chain(experts).all(|n| defined().contains(n));
            all
        }

        fn has_gemm(kind: QuantKind) -> bool {
            let name = format!("dequant_f16_{}", kind.name().to_ascii_lowercase());
            defined().contains(&name)
        }
    }

    impl DeviceBackend for Cuda {
        type Matrix = Matrix;
        type Vector = Buf;
        type Buf = Buf;
        type Kv = Kv;
        type Indices = CudaIndices;

        fn id(&self) -> Backend {
            Backend::Cuda
        }

        fn open(opts: &crate::backend::DeviceOptions) -> Result<Cuda, BackendError> {
            Cuda::open_device(opts.device)
        }

        fn threads(&self) -> usize {
            1
        }

        fn describe(&self) -> String {
            format!("cuda ({}, {})", self.dev.name(), self.dev.arch())
        }

        fn free_memory(&self) -> Option<u64> {
            self.dev.free_memory().ok()
        }

        fn device_memory(&self) -> Option<(u64, u64)> {
            self.dev.memory().ok().map(|(free, total)| (total.saturating_sub(free), total))
        }

        fn place_matrix(&self, t: &HostTensor<'_>) -> Result<Matrix, BackendError> {
            if ferrox_cuda::kernel_suffix(t.kind).is_none() {
                return Err(BackendError(format!("{}: no CUDA kernel for {} matrices", t.name, t.kind)));
            }
            self.dev.upload_matrix(t.kind, t.bytes, t.rows, t.cols).map_err(|e| BackendError(format!("{}: {e}", t.name)))
        }

        fn place_vector(&self, t: &HostTensor<'_>) -> Result<Buf, BackendError> {
            self.dev.upload_f32(&crate::backend::vector_values(t)?).map_err(be)
        }

        fn alloc(&self, len: usize) -> Result<Buf, BackendError> {
            self.dev.alloc(len).map_err(be)
        }

        fn upload(&self, src: &[f32]) -> Result<Buf, BackendError> {
            self.dev.upload_f32(src).map_err(be)
        }

        fn read(&self, src: &Buf, dst: &mut [f32]) -> Result<(), BackendError> {
            self.dev.read(src, dst).map_err(be)
        }

        fn kv_cache(&self, n_slots: usize, n_ctx: usize, k_dims: &[usize], v_dims: &[usize]) -> Result<Kv, BackendError> {
            self.dev.kv_cache(n_slots, n_ctx, k_dims, v_dims).map_err(be)
        }

        fn indices(&self, n: usize) -> Result<CudaIndices, BackendError> {
            let cap = n.max(1);
            Ok(CudaIndices { on: self.dev.upload_u32(&vec![0; 4 * cap]).map_err(be)?, cap })
        }

        fn stage(&self, dev: &mut CudaIndices, lists: Staged<'_, ()>) -> Result<(), BackendError> {
            let cap = dev.cap;
            let mut all = vec![0u32; 4 * cap];
            for (i, l) in [lists.tokens, lists.seq, lists.pos, lists.rows].into_iter().enumerate() {
                if l.len() > cap {
                    return Err(BackendError(format!("{} indices staged into room for {cap}", l.len())));
                }
                all[i * cap..i * cap + l.len()].copy_from_slice(l);
            }
            self.dev.write_u32(&dev.on, 0, &all).map_err(be)
        }

        fn get_rows(&self, m: &Matrix, b: Staged<'_, CudaIndices>, out: &mut Buf) -> Result<(), BackendError> {
            if let Some(&id) = b.tokens.iter().find(|&&id| id as usize >= m.rows) {
                return Err(BackendError(format!("token id {id} outside the embedding table ({} rows)", m.rows)));
            }
            self.dev.get_rows(m, b.dev.list(0, b.len())?, out).map_err(be)
        }

        fn matmul(&self, w: &Matrix, x: &Buf, y: &mut Buf, n: usize) -> Result<(), BackendError> {
            self.dev.matmul(w, x, y, n).map_err(be)
        }

        fn matmul_many(&self, x: &Buf, n: usize, outs: &mut [(&Matrix, &mut Buf)]) -> Result<(), BackendError> {
            self.dev.matmul_many(x, n, outs).map_err(be)
        }

        fn add_bias(&self, y: &mut Buf, b: &Buf, n: usize) -> Result<(), BackendError> {
            self.dev.add_bias(y, b, n).map_err(be)
        }

        fn rms_norm(&self, x: &mut Buf, w: &Buf, eps: f32) -> Result<(), BackendError> {
            self.dev.rms_norm(x, w, eps).map_err(be)
        }

        fn add_rms_norm(&self, x: &mut Buf, add: Option<&Buf>, w: &Buf, eps: f32, out: &mut Buf) -> Result<(), BackendError> {
            self.dev.add_rms_norm(x, add, w, eps, out).map_err(be)
        }

        fn rope(&self, x: &mut Buf, b: Staged<'_, CudaIndices>, n_heads: usize, head_dim: usize, p: &RopeParams, factors: Option<&Buf>) -> Result<(), BackendError> {
            let r = RopeShape::new(n_heads, head_dim, p);
            self.dev.rope(x, b.dev.list(2, b.pos.len())?, &r, factors).map_err(be)
        }

        fn attention(&self, cache: &mut Kv, layer: usize, b: Staged<'_, CudaIndices>, [q, k, v]: [&Buf; 3], out: &mut Buf, p: &AttnParams) -> Result<(), BackendError> {
            let a = AttnShape::new(p, b.seq);
            self.with_slots(cache, b, |kv, seq, pos| self.dev.attention(kv, layer, seq, pos, q, k, v, out, &a).map_err(be))
        }

        fn glu(&self, a: Activation, gate: &Buf, up: &Buf, out: &mut Buf) -> Result<(), BackendError> {
            self.dev.glu(a, gate, up, out).map_err(be)
        }

        fn glu_fused(&self, a: Activation, fused: &Buf, out: &mut Buf, width: usize) -> Result<(), BackendError> {
            self.dev.glu_fused(a, fused, out, width).map_err(be)
        }

        fn copy(&self, src: &Buf, dst: &mut Buf) -> Result<(), BackendError> {
            self.dev.copy(src, dst).map_err(be)
        }

        fn add(&self, a: &mut Buf, b: &Buf) -> Result<(), BackendError> {
            self.dev.add(a, b).map_err(be)
        }

        fn scale(&self, x: &mut Buf, s: f32) -> Result<(), BackendError> {
            self.dev.scale(x, s).map_err(be)
        }

        fn softcap(&self, x: &mut Buf, cap: f32) -> Result<(), BackendError> {
            self.dev.softcap(x, cap).map_err(be)
        }

        fn gather_rows(&self, src: &Buf, b: Staged<'_, CudaIndices>, width: usize, dst: &mut Buf) -> Result<(), BackendError> {
            let n_src = src.len().checked_div(width).unwrap_or(0);
            if let Some(&r) = b.rows.iter().find(|&&r| r as usize >= n_src) {
                return Err(BackendError(format!("gather row {r} outside a buffer of {n_src} rows")));
            }
            self.dev.gather_rows(src, b.dev.list(3, b.rows.len())?, width, dst).map_err(be)
        }

        fn split_cols(&self, src: &Buf, src_width: usize, c0: usize, dst: &mut Buf, dst_width: usize) -> Result<(), BackendError> {
            self.dev.split_cols(src, src_width, c0, dst, dst_width).map_err(be)
        }

        /// A block whose projections take no bias and no norm: one launch
        /// for the norm, the projections, RoPE and the cache store where the
        /// shapes allow ([`Cuda::norm_qkv_attention`]); otherwise the norm
        /// fused into the projections, and RoPE into attention.
        fn attention_block(&self, cache: &mut Kv, b: Staged<'_, CudaIndices>, w: &AttnBlock<'_, Cuda>, s: &mut Scratch<'_, Buf>) -> Result<(), BackendError> {
            if w.sinks.is_some() {
                // The plan refuses such models first (`BackendCaps::attention_sinks_kernel`).
                return Err(BackendError("no cuda kernel for attention sinks".into()));
            }
            let n = b.len();
            match &w.qkv {
                QkvWeights::Separate(ms, [None, None, None]) if w.qk_norm.is_none() => self.norm_qkv_attention(cache, b, w, *ms, s)?,
                QkvWeights::Separate([wq, wk, wv], biases) => {
                    let add = std::mem::take(&mut s.pending).then_some(&*s.o);
                    self.norm_matmul_many(s.x, add, w.norm, w.eps, s.cur, n, &mut [(*wq, &mut *s.q), (*wk, &mut *s.k), (*wv, &mut *s.v)])?;
                    for (buf, bias) in [(&mut *s.q, biases[0]), (&mut *s.k, biases[1]), (&mut *s.v, biases[2])] {
                        if let Some(bias) = bias {
                            self.add_bias(buf, bias, n)?;
                        }
                    }
                    self.rope_attention(cache, b, w, s)?
                }
                QkvWeights::Fused(..) => {
                    blocks::qkv(self, n, w, s)?;
                    self.rope_attention(cache, b, w, s)?
                }
            }
            self.project(&w.projection(), n, s, Input::Attn)
        }

        /// Separate gate and up: the norm, both projections and the gated
        /// activation in one launch where they fuse, the projections and
        /// the activation in one where only the norm does not.
        fn ffn_block(&self, n: usize, w: &FfnBlock<'_, Cuda>, s: &mut Scratch<'_, Buf>) -> Result<(), BackendError> {
            match w.gate {
                Some(wg) => {
                    let pending = std::mem::take(&mut s.pending);
                    let fused = !pending && self.dev.norm_gate_up_glu(w.act, s.x, w.norm, w.eps, n, wg, w.up, s.h).map_err(be)?;
                    if !fused {
                        self.add_rms_norm(s.x, pending.then_some(&*s.o), w.norm, w.eps, s.cur)?;
                        if !self.dev.gate_up_glu(w.act, s.cur, n, wg, w.up, s.h).map_err(be)? {
                            self.dev.matmul_many(s.cur, n, &mut [(wg, &mut *s.gate), (w.up, &mut *s.up)]).map_err(be)?;
                            self.glu(w.act, s.gate, s.up, s.h)?;
                        }
                    }
                }
                None => blocks::ffn_hidden(self, n, w, s)?,
            }
            self.project(&w.projection(), n, s, Input::Hidden)
        }

        /// The router, routing, the routed experts and their weighted sum
        /// on the device ([`ferrox_cuda::Device::moe`]), so the
        /// block never waits on the host. The route table borrows `q`
        /// (attention's, free between attention blocks).
        fn moe_block(&self, n: usize, w: &MoeBlock<'_, Cuda>, s: &mut Scratch<'_, Buf>) -> Result<(), BackendError> {
            if w.shared.is_some() {
                // The plan refuses such models first (`BackendCaps::shared_expert_kernel`).
                return Err(BackendError("no cuda kernel for a mixture-of-experts shared expert".into()));
            }
            if w.biases.is_some() || w.experts.swiglu_oai.is_some() || w.experts.gating != crate::arch::MoeGating::Softmax {
                // The plan refuses such models first (`BackendCaps::oai_experts_kernel`).
                return Err(BackendError("no cuda kernel for gpt-oss's mixture-of-experts blocks".into()));
            }
            let add = s.pending.then_some(&*s.o);
            self.add_rms_norm(s.x, add, w.norm, w.eps, s.cur)?;
            s.pending = false;
            let x = &w.experts;
            let shape = ferrox_cuda::MoeShape {
                n,
                n_embd: w.n_embd,
                ff: x.n_ff,
                n_expert: x.n_expert,
                n_used: x.n_used,
                norm_weights: x.norm_weights,
                scale: x.scale,
                act: w.act,
            };
            let bufs = ferrox_cuda::MoeBufs { route: s.q, gate: s.gate, up: s.up, h: s.h };
            self.dev.moe(&shape, [w.router, w.gate, w.up, w.down], s.cur, bufs, s.o).map_err(be)?;
            blocks::moe_out(self, w, s)
        }

        fn argmax_rows(&self, x: &Buf, width: usize, out: &mut [u32]) -> Result<(), BackendError> {
            self.dev.argmax_rows(x, width, out).map_err(be)
        }

        fn top_k_rows(
            &self,
            x: &Buf,
            width: usize,
            rows: usize,
            k: usize,
            out: &mut crate::sampling::TopRows,
        ) -> Result<(), BackendError> {
            let mut words = vec![0u32; rows * (2 * k + 4)];
            self.dev.top_k_rows(x, width, k, &mut words).map_err(be)?;
            out.reset(rows, k);
            let (ids, rest) = words.split_at(rows * k);
            let (vals, stats) = rest.split_at(rows * k);
            out.ids.copy_from_slice(ids);
            for (o, &v) in out.logits.iter_mut().zip(vals) {
                *o = f32::from_bits(v);
            }
            for (r, st) in stats.chunks_exact(4).enumerate() {
                out.counts[r] = st[0].min(k as u32);
                out.max[r] = f32::from_bits(st[1]);
                out.lse[r] = f32::from_bits(st[2]);
            }
            Ok(())
        }

        fn read_rows(&self, x: &Buf, width: usize, rows: &[usize], out: &mut [f32]) -> Result<(), BackendError> {
            self.dev.read_rows(x, width, rows, out).map_err(be)
        }

        fn selects_top_k(&self) -> bool {
            self.select_top
        }

        /// Records `f` as a CUDA graph the first time `key` comes with
        /// `may_record`, and replays it after. A capture that fails turns
        /// recording off for this backend and runs `f` directly.
        fn run_recorded<E: From<BackendError>>(
            &self,
            key: crate::backend::RecordKey,
            may_record: bool,
            mut f: impl FnMut() -> Result<(), E>,
        ) -> Result<(), E> {
            let mut graphs = self
                .graphs
                .lock()
                .map_err(|_| BackendError("graph cache lock poisoned".into()))?;
            let Some(cache) = graphs.as_mut() else {
                drop(graphs);
                return f();
            };
            if let Some((_, g)) = cache.iter().find(|(k, _)| *k == key) {
                return self.dev.replay(g).map_err(|e| E::from(be(e)));
            }
            if !may_record {
                drop(graphs);
                return f();
            }
            self.dev.begin_capture().map_err(|e| E::from(be(e)))?;
            let ran = f();
            let captured = self.dev.end_capture();
            match (ran, captured) {
                (Ok(()), Ok(g)) => {
                    self.dev.replay(&g).map_err(|e| E::from(be(e)))?;
                    if cache.len() >= GRAPH_CACHE {
                        cache.remove(0);
                    }
                    cache.push((key, g));
                    Ok(())
                }
                _ => {
                    // Off for good; nothing captured ran, so run it directly
                    // (an error that was not the capture's comes back again).
                    *graphs = None;
                    drop(graphs);
                    f()
                }
            }
        }
    }
}

#[cfg(feature = "cuda")]
pub use dispatch::CudaIndices;

/// Every CUDA kernel against the CPU: the weight kernels against the scalar
/// twin (`ferrox_quant::dequantize`, summed in f64), the other operations
/// against the CPU backend, the whole forward pass against `Model<Cpu>`.
/// On a machine without a GPU each test says what it did not check.
/// The plan's fusions, answered on any build (the capability side).
#[cfg(test)]
mod caps_tests {
    use super::*;

    fn layer(kind: QuantKind, first: bool, direct: bool) -> LayerMats {
        let m = |rows, cols| ferrox_ops::Mat { kind, rows, cols };
        LayerMats {
            qkv: Some([m(2048, 2048), m(512, 2048), m(512, 2048)]),
            gate_up: Some([m(8192, 2048); 2]),
            out: m(2048, 2048),
            down: Some(m(2048, 8192)),
            qkv_direct: true,
            out_direct: direct,
            down_direct: direct,
            first,
            halves: false,
            n_rot: 64,
            head_dim: 64,
        }
    }

    /// Llama's shapes: one QKV launch with the RoPE epilogue, the GLU kernel,
    /// projections into the residual; for F16 the norm in the launch too,
    /// except where a residual add is pending before it.
    #[test]
    fn the_plan_names_the_fused_decode_launches() {
        let d = |role, l: &LayerMats| Cuda::fused_decode(role, l).unwrap_or_default();
        let q8 = layer(QuantKind::Q8_0, false, true);
        assert!(d(Role::AttnK, &q8).starts_with("cuda mmvq_stream_q8_0 (Q, K and V in one launch; RoPE"), "{}", d(Role::AttnK, &q8));
        assert!(d(Role::FfnUp, &q8).starts_with("cuda mmvq_glu_q8_0"));
        assert!(d(Role::FfnDown, &q8).contains("adds into the residual"));
        let f16 = layer(QuantKind::F16, false, true);
        assert!(d(Role::AttnQ, &f16).starts_with("cuda matvec_f16_norm_stream (the norm, Q, K and V"));
        assert!(d(Role::FfnGate, &f16).starts_with("cuda matvec_f16_glu_norm_stream"));
        // Gemma-style post-norms: nothing added directly, so a pending add
        // keeps the norm apart and the projections on their own kernels.
        let post = layer(QuantKind::F16, false, false);
        assert!(d(Role::AttnQ, &post).starts_with("cuda matvec_f16_stream (Q, K and V in one launch; RoPE"));
        assert!(d(Role::FfnGate, &post).starts_with("cuda matvec_f16_glu_stream"));
        assert_eq!(Cuda::fused_decode(Role::AttnOut, &post), None);
        let mut mixed = q8;
        mixed.qkv.as_mut().unwrap()[2].kind = QuantKind::Q6K;
        assert_eq!(Cuda::fused_decode(Role::AttnV, &mixed), None, "mixed kinds: a launch each");
    }
}

#[cfg(all(test, feature = "cuda"))]
mod tests {
    use std::sync::OnceLock;

    use ferrox_cuda::MatmulPath;
    use ferrox_gguf::testing::SplitMix64;
    use ferrox_quant::QuantKind;

    use super::Cuda;
    use crate::backend::conformance::{matrix, odd_shape, rand_vec, rel};
    use crate::arch::{Activation, RopeStyle};
    use crate::backend::cpu::Cpu;
    use crate::backend::conformance::{batch, stage};
    use crate::backend::{AttnParams, BackendCaps, Batch, DeviceBackend, RopeParams, Staged};

    /// One device for every test of the process (opening compiles or loads
    /// the kernels); `None`, loudly, without one. With
    /// `FERROX_REQUIRE_GPU=1` (the GPU machine's scripts set it) a device
    /// that does not open fails the test instead: a GPU test must not pass
    /// by skipping where a GPU is meant to be.
    fn gpu(what: &str) -> Option<&'static Cuda> {
        static DEV: OnceLock<Result<Cuda, String>> = OnceLock::new();
        let dev = DEV.get_or_init(|| Cuda::open_device(0).map_err(|e| e.to_string()));
        let dev = match dev {
            Ok(c) => Some(c),
            Err(e) if std::env::var_os("FERROX_REQUIRE_GPU").is_some_and(|v| v == "1") => {
                panic!("no CUDA device (FERROX_REQUIRE_GPU=1): {e}")
            }
            Err(e) => {
                eprintln!("no CUDA device: {e}");
                None
            }
        };
        if dev.is_none() {
            eprintln!("NOT CHECKED (no CUDA device here): {what}");
        }
        dev
    }

    /// A fixed seed, printed (a failure replays exactly).
    fn rng() -> SplitMix64 {
        let seed = 0x5eed_c0da;
        eprintln!("seed {seed:#x}");
        SplitMix64(seed)
    }

    fn read(c: &Cuda, b: &ferrox_cuda::Buf) -> Vec<f32> {
        let mut v = vec![f32::NAN; b.len()];
        c.read(b, &mut v).unwrap();
        v
    }

    fn claimed() -> Vec<QuantKind> {
        QuantKind::ALL
            .iter()
            .copied()
            .filter(|&k| Cuda::matvec_kernel(k).is_some())
            .collect()
    }

    /// `y[t][o] = sum_i w[o][i] * x[t][i]` in f64, for every token of `x`
    /// (rows of `cols`): the reference of the matvec tests.
    fn f64_dot(w: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        x.chunks(cols)
            .flat_map(|xt| {
                (0..rows).map(move |o| {
                    let d: f64 = (0..cols).map(|i| w[o * cols + i] as f64 * xt[i] as f64).sum();
                    d as f32
                })
            })
            .collect()
    }

    /// `x W^T` for `n` tokens on `path`, read back; the output starts NaN,
    /// so an element the kernel skips shows.
    fn matmul_read(c: &Cuda, path: MatmulPath, w: &ferrox_cuda::Matrix, x: &[f32], n: usize) -> Vec<f32> {
        let xb = c.device().upload_f32(x).unwrap();
        let mut y = c.device().upload_f32(&vec![f32::NAN; n * w.rows]).unwrap();
        c.device().matmul_with(path, w, &xb, &mut y, n).unwrap();
        read(c, &y)
    }

    /// The largest error of an element, over the largest wanted magnitude
    /// (a NaN is infinitely wrong).
    fn worst_of_largest(got: &[f32], want: &[f32]) -> f32 {
        let top = want.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        got.iter()
            .zip(want)
            .map(|(g, w)| (g - w).abs() / top)
            .fold(0.0f32, |m, e| if e.is_nan() { f32::INFINITY } else { m.max(e) })
    }

    #[test]
    fn every_claimed_kind_matvec_and_gemm_match_the_scalar_twin() {
        let Some(c) = gpu("CUDA matvec and GEMM vs the scalar twin, every claimed kind") else {
            return;
        };
        let mut r = rng();
        for kind in claimed() {
            let (rows, cols) = odd_shape(kind);
            let (bytes, deq) = matrix(&mut r, kind, rows, cols);
            let w = c.device().upload_matrix(kind, &bytes, rows, cols).unwrap();
            for (path, n, tol) in [(MatmulPath::Matvec, 3, 1e-5), (MatmulPath::Gemm, 11, 4e-3)] {
                let x = rand_vec(&mut r, n * cols, 1.0);
                // The int8-activation (dp4a) kernels compute the dot with the
                // activations quantized per 32: the reference does the same,
                // so the bound stays tight (and the f32 dot is checked loosely).
                let mmvq = path == MatmulPath::Matvec && ferrox_cuda::mmvq_kind(kind);
                let xr = if mmvq {
                    x.chunks(cols)
                        .flat_map(ferrox_cuda::mmvq_quantize_activations)
                        .collect()
                } else {
                    x.clone()
                };
                let dot = |xs: &[f32]| f64_dot(&deq, xs, rows, cols);
                let want = dot(&xr);
                let got = matmul_read(c, path, &w, &x, n);
                let e = rel(&got, &want);
                assert!(
                    e < tol,
                    "{kind} {path:?} {rows}x{cols} n={n} (int8 activations: {mmvq}): relative error {e:e} (bound {tol:e})"
                );
                if mmvq {
                    let e = rel(&got, &dot(&x));
                    assert!(e < 2e-2, "{kind} {path:?}: {e:e} from the f32 dot");
                }
            }
        }
    }

    /// The small-batch tensor-core GEMM (`mmq_<kind>_n<t>`, every kind
    /// that has one) against the f64 dot, every element: each token tile
    /// (1, 9, 16, 17, 40, 64 and 100 tokens) and a batch in two pieces
    /// (130: 128 and 2), rows that are not a multiple of a
    /// warp's 16 or a block's 64, a width whose last group of four units
    /// is partial, and a width whose blocks split k (their partial sums
    /// added by `mmq_reduce`). The server's 9–64-token decode steps must
    /// take it: the path is checked too.
    #[test]
    fn small_batch_gemm_matches_the_f64_dot_at_every_tile() {
        let Some(c) = gpu("CUDA small-batch tensor-core GEMM (mmq_<kind>_n<t>) vs the f64 dot") else {
            return;
        };
        let d = c.device();
        if !d.small_batch_gemm() {
            eprintln!("NOT CHECKED: the small-batch GEMM is off on {} ({}: mma.sync needs sm_80, or FERROX_CUDA_MMA_MAX=0)", d.name(), d.arch());
            return;
        }
        let mut r = rng();
        let kinds: Vec<QuantKind> = claimed()
            .into_iter()
            .filter(|&k| ferrox_ops::cuda::kind_kernels(k).is_some_and(|k| k.mma.is_some()))
            .collect();
        assert!(kinds.len() >= 5, "the small-batch GEMM lost kinds: {kinds:?}");
        for kind in kinds {
            let be = kind.block_elems();
            // 13 units (a partial last group); 128 units, 32 groups in 4 splits.
            let shapes = [(1001, be.max(32 * 13).next_multiple_of(be)), (37, 4096), (200, 4096)];
            for (rows, cols) in shapes {
                let (bytes, deq) = matrix(&mut r, kind, rows, cols);
                let w = d.upload_matrix(kind, &bytes, rows, cols).unwrap();
                for n in [1usize, 9, 16, 17, 40, 64, 100, 130] {
                    if n > ferrox_ops::cuda::GEMM_MIN_TOKENS && n <= ferrox_ops::cuda::MMA_MAX_TOKENS {
                        assert_eq!(d.matmul_path_for(&w, n), MatmulPath::Mma, "{kind} {rows}x{cols} n={n}");
                    }
                    let x = rand_vec(&mut r, n * cols, 1.0);
                    let want = f64_dot(&deq, &x, rows, cols);
                    let got = matmul_read(c, MatmulPath::Mma, &w, &x, n);
                    let worst = worst_of_largest(&got, &want);
                    assert!(worst < 4e-3, "{kind} {rows}x{cols} n={n}: worst element off by {worst:e} of the largest");
                    assert!(rel(&got, &want) < 4e-3, "{kind} {rows}x{cols} n={n}: {:e}", rel(&got, &want));
                }
            }
        }
    }

    /// The streaming decode matvecs (F16 and every int8 kind) against the
    /// f64 dot at shapes where a warp streams several rows (more rows than
    /// one wave of warps, 4 224 on an H200's 132 SMs at two blocks an SM:
    /// the next row's loads issued before the last row's dots), several
    /// steps a row with a partial last one (F16 2056 wide: 257 16-byte
    /// units; int8 97 or 104 units), and rows shorter than a step.
    #[test]
    fn streaming_matvecs_match_the_f64_dot_over_many_rows() {
        let Some(c) = gpu("CUDA streaming decode matvecs (matvec_f16_stream, mmvq_stream_<kind>) vs the f64 dot") else {
            return;
        };
        let mut r = rng();
        let kinds = claimed()
            .into_iter()
            .filter(|&k| k == QuantKind::F16 || ferrox_cuda::mmvq_kind(k));
        for kind in kinds {
            let be = kind.block_elems();
            let shapes: Vec<(usize, usize)> = match (kind, be) {
                (QuantKind::F16, _) => vec![(20011, 24), (9001, 2056), (5, 8)],
                (_, 256) => vec![(20011, 256), (9001, 256 * 13)],
                // (300 units: whole steps of every kind's width, then a partial one)
                _ => vec![(20011, be), (9001, be * 97), (3001, be * 300)],
            };
            for (rows, cols) in shapes {
                let (bytes, deq) = matrix(&mut r, kind, rows, cols);
                let w = c.device().upload_matrix(kind, &bytes, rows, cols).unwrap();
                for n in [1usize, 3] {
                    let x = rand_vec(&mut r, n * cols, 1.0);
                    // The int8 kernels take the activations quantized per 32.
                    let xr: Vec<f32> = if kind == QuantKind::F16 {
                        x.clone()
                    } else {
                        x.chunks(cols).flat_map(ferrox_cuda::mmvq_quantize_activations).collect()
                    };
                    let want = f64_dot(&deq, &xr, rows, cols);
                    let got = matmul_read(c, MatmulPath::Matvec, &w, &x, n);
                    // Every row, against the largest: a row skipped (NaN) or
                    // taken from the wrong place shows even among 20 011.
                    let worst = worst_of_largest(&got, &want);
                    assert!(worst < 1e-5, "{kind} {rows}x{cols} n={n}: worst row off by {worst:e} of the largest");
                    assert!(rel(&got, &want) < 1e-5, "{kind} {rows}x{cols} n={n}: {:e}", rel(&got, &want));
                }
            }
        }
    }

    /// Q, K and V (or gate and up) in one launch give what three separate
    /// matvecs give, for every kind (fused or not), at 1 and 3 tokens; F16
    /// also at 520 and 2056 wide (one and three steps a row, the last
    /// partial).
    #[test]
    fn matmul_many_matches_separate_matmuls() {
        let Some(c) = gpu("CUDA matmul_many (one launch over several matrices) vs one matmul each")
        else {
            return;
        };
        let mut r = rng();
        let widths = |kind: QuantKind| {
            let cols = kind.block_elems().max(32) * 4;
            if kind == QuantKind::F16 {
                vec![cols, 520, 2056]
            } else {
                vec![cols]
            }
        };
        for (kind, cols) in claimed()
            .into_iter()
            .flat_map(|k| widths(k).into_iter().map(move |c| (k, c)))
        {
            let shapes = [37usize, 9, 16];
            let ws: Vec<ferrox_cuda::Matrix> = shapes
                .iter()
                .map(|&rows| {
                    let (bytes, _) = matrix(&mut r, kind, rows, cols);
                    c.device().upload_matrix(kind, &bytes, rows, cols).unwrap()
                })
                .collect();
            for n in [1usize, 3] {
                let x = c
                    .device()
                    .upload_f32(&rand_vec(&mut r, n * cols, 1.0))
                    .unwrap();
                let mut sep: Vec<ferrox_cuda::Buf> = shapes
                    .iter()
                    .map(|&rows| c.alloc(n * rows).unwrap())
                    .collect();
                for (w, y) in ws.iter().zip(sep.iter_mut()) {
                    c.matmul(w, &x, y, n).unwrap();
                }
                let mut many: Vec<ferrox_cuda::Buf> = shapes
                    .iter()
                    .map(|&rows| c.device().upload_f32(&vec![f32::NAN; n * rows]).unwrap())
                    .collect();
                let mut outs: Vec<(&ferrox_cuda::Matrix, &mut ferrox_cuda::Buf)> =
                    ws.iter().zip(many.iter_mut()).collect();
                c.matmul_many(&x, n, &mut outs).unwrap();
                for (i, (a, b)) in sep.iter().zip(&many).enumerate() {
                    let e = rel(&read(c, b), &read(c, a));
                    assert!(
                        e < 1e-6,
                        "{kind} {cols} wide n={n} matrix {i}: matmul_many differs by {e:e}"
                    );
                }
            }
        }
    }

    /// The q8 activations the fused norm and the GLU write for the next
    /// int8 matvec give, bit for bit, what quantizing the same input in its
    /// own launch gives; and a launch that changes the input in between
    /// makes the matvec quantize again (no stale copy is read).
    #[test]
    fn fused_q8_activations_match_a_separate_quantize_and_never_go_stale() {
        let Some(c) = gpu("CUDA q8 activations fused into add_rms_norm and glu vs quantize_q8") else {
            return;
        };
        let d = c.device();
        let mut r = rng();
        let (rows, cols) = (37usize, 512usize);
        for kind in claimed().into_iter().filter(|&k| ferrox_cuda::mmvq_kind(k)) {
            let (bytes, _) = matrix(&mut r, kind, rows, cols);
            let w = d.upload_matrix(kind, &bytes, rows, cols).unwrap();
            for n in [1usize, 3] {
                let g = d.upload_f32(&rand_vec(&mut r, cols, 1.5)).unwrap();
                let mut x = d.upload_f32(&rand_vec(&mut r, n * cols, 3.0)).unwrap();
                let b = d.upload_f32(&rand_vec(&mut r, n * cols, 1.0)).unwrap();
                let mut normed = d.upload_f32(&vec![f32::NAN; n * cols]).unwrap();
                // Separate: the same values in a fresh buffer.
                let matvec = |x: &ferrox_cuda::Buf| {
                    let mut y = d.upload_f32(&vec![f32::NAN; n * rows]).unwrap();
                    c.matmul(&w, x, &mut y, n).unwrap();
                    read(c, &y)
                };
                let fresh = |x: &ferrox_cuda::Buf| {
                    let mut f = c.alloc(x.len()).unwrap();
                    c.copy(x, &mut f).unwrap();
                    f
                };
                c.add_rms_norm(&mut x, Some(&b), &g, 1e-6, &mut normed).unwrap();
                assert!(d.q8_holds(&normed), "{kind}: add_rms_norm left no q8 copy");
                let fused = matvec(&normed);
                let sep = matvec(&fresh(&normed));
                assert!(
                    fused.iter().zip(&sep).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{kind} n={n}: the fused norm's q8 differs from quantize_q8 ({:e})",
                    rel(&fused, &sep)
                );

                let up = d.upload_f32(&rand_vec(&mut r, n * cols, 2.0)).unwrap();
                let mut h = d.upload_f32(&vec![f32::NAN; n * cols]).unwrap();
                for act in [Activation::SiluGated, Activation::GeluGated] {
                    c.glu(act, &normed, &up, &mut h).unwrap();
                    assert!(d.q8_holds(&h), "{kind}: glu left no q8 copy");
                    let fused = matvec(&h);
                    let sep = matvec(&fresh(&h));
                    assert!(
                        fused.iter().zip(&sep).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{kind} n={n} {act:?}: the GLU's q8 differs from quantize_q8 ({:e})",
                        rel(&fused, &sep)
                    );
                }

                // Changed after its q8 copy was written: the matvec must see
                // the change.
                c.add_rms_norm(&mut x, None, &g, 1e-6, &mut normed).unwrap();
                c.scale(&mut normed, -2.5).unwrap();
                assert!(!d.q8_holds(&normed), "{kind}: scale left the q8 tag in place");
                let after = matvec(&normed);
                let want = matvec(&fresh(&normed));
                assert!(
                    after.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{kind} n={n}: a stale q8 copy was read after the input changed ({:e})",
                    rel(&after, &want)
                );
            }
        }
    }

    /// The pair of backends for the tests against the CPU.
    fn pair(c: &Cuda, v: &[f32]) -> (Vec<f32>, ferrox_cuda::Buf) {
        (v.to_vec(), c.device().upload_f32(v).unwrap())
    }

    /// Read-backs go through a page-locked buffer in pipelined pieces
    /// (`Device::read`): a vocabulary-sized read and one of many pieces
    /// come back whole and in order, as does a prefix and a short read.
    #[test]
    fn read_back_in_pieces_returns_what_was_uploaded() {
        let Some(c) = gpu("CUDA read-back through the page-locked buffer (whole, prefix, many pieces)") else {
            return;
        };
        let mut r = rng();
        for n in [7usize, 128_256, 300_001] {
            let x = rand_vec(&mut r, n, 1.0);
            let d = c.device().upload_f32(&x).unwrap();
            let mut got = vec![f32::NAN; n];
            c.read(&d, &mut got).unwrap();
            assert!(got == x, "{n} floats read back differ");
            let mut head = vec![f32::NAN; n / 2 + 1];
            c.read(&d, &mut head).unwrap();
            assert!(head[..] == x[..n / 2 + 1], "the first {} of {n} floats differ", n / 2 + 1);
            assert!(c.read(&d, &mut vec![0.0; n + 1]).is_err(), "a read past the buffer must be an error");
        }
    }

    #[test]
    fn argmax_on_the_device_matches_the_host_twin() {
        let Some(c) =
            gpu("CUDA argmax_rows vs the host argmax (ties, NaN, a vocabulary-sized row)")
        else {
            return;
        };
        let mut r = rng();
        for (rows, width) in [(1usize, 128_256usize), (5, 1000), (3, 7)] {
            let mut x = rand_vec(&mut r, rows * width, 10.0);
            // A tie at the maximum (the lower index wins) and a NaN that must not.
            let row1 = &mut x[..width];
            let m = row1.iter().fold(f32::NEG_INFINITY, |a, &v| a.max(v)) + 1.0;
            row1[width - 1] = m;
            row1[width / 2] = m;
            row1[width / 3] = f32::NAN;
            let want: Vec<u32> = x.chunks(width).map(crate::backend::argmax).collect();
            assert_eq!(want[0] as usize, width / 2);
            let d = c.device().upload_f32(&x).unwrap();
            let mut got = vec![u32::MAX; rows];
            c.argmax_rows(&d, width, &mut got).unwrap();
            assert_eq!(got, want, "{rows} rows of {width}");
            assert!(
                c.argmax_rows(&d, width + 1, &mut got).is_err(),
                "a width that does not divide the buffer must be an error"
            );
        }
        // Across the kernel's 2048-wide slices: a row of minus infinity and
        // NaN (0), and -0 before +0 above negative values (a tie: the -0).
        let width = 5000;
        let mut x = vec![f32::NEG_INFINITY; 2 * width];
        x[3000] = f32::NAN;
        for v in &mut x[width..] {
            *v = -1.0;
        }
        x[width + 2100] = -0.0;
        x[width + 4500] = 0.0;
        let want: Vec<u32> = x.chunks(width).map(crate::backend::argmax).collect();
        assert_eq!(want, [0, 2100]);
        let mut got = vec![u32::MAX; 2];
        c.argmax_rows(&c.device().upload_f32(&x).unwrap(), width, &mut got).unwrap();
        assert_eq!(got, want, "minus infinity, NaN and signed zeros");
    }

    #[test]
    fn top_k_on_the_device_matches_the_host_selection() {
        use crate::sampling::TopRows;
        let Some(c) = gpu("CUDA top_k_rows vs the host's TopRows::select (ties at the cut, NaN, infinities, -0, vocabulary rows)")
        else {
            return;
        };
        let mut r = rng();
        // Logits on a coarse grid, so many tie at the k-th (ids decide),
        // with the values a selection must canonicalize or leave out.
        let awkward = |r: &mut SplitMix64, n: usize| -> Vec<f32> {
            let mut v: Vec<f32> = rand_vec(r, n, 4.0).iter().map(|x| (x * 2.0).round() * 0.5).collect();
            v[n / 3] = f32::NAN;
            v[n / 4] = f32::NEG_INFINITY;
            v[n / 5] = -0.0;
            v[n / 7] = f32::INFINITY;
            v
        };
        let sorted = |t: &TopRows, row: usize| {
            let w = t.row(row);
            let mut e: Vec<(u32, u32)> = w.ids.iter().zip(w.logits).map(|(&i, &l)| (i, l.to_bits())).collect();
            e.sort_unstable();
            e
        };
        for (rows, width, k) in [(3usize, 128_256usize, 40usize), (64, 128_256, 256), (5, 1000, 1), (2, 7, 40), (4, 3000, 64)] {
            let mut x: Vec<f32> = (0..rows).flat_map(|_| awkward(&mut r, width)).collect();
            // A row with nothing finite, and one with fewer finite than k.
            if rows > 2 {
                x[width..2 * width].iter_mut().enumerate().for_each(|(i, v)| *v = if i % 2 == 0 { f32::NAN } else { f32::NEG_INFINITY });
                x[2 * width..3 * width].iter_mut().skip(3).for_each(|v| *v = f32::NEG_INFINITY);
            }
            let mut want = TopRows::default();
            want.select(&x, width, k);
            let d = c.device().upload_f32(&x).unwrap();
            let mut got = TopRows::default();
            c.top_k_rows(&d, width, rows, k, &mut got).unwrap();
            for row in 0..rows {
                let at = format!("{rows} rows of {width}, k {k}, row {row}");
                assert_eq!(got.counts[row], want.counts[row], "{at}: candidates kept");
                assert_eq!(sorted(&got, row), sorted(&want, row), "{at}: the candidates");
                assert_eq!(got.max[row].to_bits(), want.max[row].to_bits(), "{at}: max");
                let (g, w) = (got.lse[row], want.lse[row]);
                assert!(g == w || (g - w).abs() <= 1e-5 * w.abs().max(1.0), "{at}: log-sum-exp {g} vs {w}");
            }
        }
        let d = c.device().upload_f32(&[0.0; 10]).unwrap();
        assert!(c.top_k_rows(&d, 3, 3, 4, &mut TopRows::default()).is_err(), "rows that do not fill the buffer must be an error");
        // The rows a selection cannot serve come back whole, in the order asked.
        let (width, x) = (1000, rand_vec(&mut r, 4000, 1.0));
        let d = c.device().upload_f32(&x).unwrap();
        let mut got = vec![f32::NAN; 3 * width];
        c.read_rows(&d, width, &[3, 0, 2], &mut got).unwrap();
        let want: Vec<f32> = [3, 0, 2].iter().flat_map(|&i| x[i * width..(i + 1) * width].iter().copied()).collect();
        assert!(got == want, "read_rows gave other values");
        assert!(c.read_rows(&d, width, &[4], &mut vec![0.0; width]).is_err(), "a row past the buffer must be an error");
    }

    #[test]
    fn rope_matches_the_cpu_backend_in_both_styles_with_and_without_factors() {
        let Some(c) = gpu("CUDA RoPE vs the CPU (both styles, frequency factors)") else {
            return;
        };
        let cpu = Cpu::new(1);
        let mut r = rng();
        let (heads, hd) = (3, 64);
        let pos = [0u32, 1, 7, 300, 4095];
        let at = batch(&[0; 5], &pos, 0);
        let (hidx, didx) = (stage(&cpu, &at, &[]), stage(c, &at, &[]));
        let pos_d = c.device().upload_u32(&pos).unwrap();
        let x = rand_vec(&mut r, pos.len() * heads * hd, 2.0);
        let ff: Vec<f32> = (0..24).map(|i| 1.0 + i as f32 * 0.5).collect();
        for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
            for (n_rot, factors) in [(64, false), (48, true)] {
                let p = RopeParams {
                    style,
                    n_rot,
                    base: 10000.0,
                    freq_scale: 0.5,
                    attn_factor: 1.2,
                };
                let (mut hc, mut dc) = pair(c, &x);
                let hf = factors.then(|| ff.clone());
                let df = factors.then(|| c.device().upload_f32(&ff).unwrap());
                cpu.rope(&mut hc, Staged::of(&at, &[], &hidx), heads, hd, &p, hf.as_ref()).unwrap();
                c.rope(&mut dc, Staged::of(&at, &[], &didx), heads, hd, &p, df.as_ref()).unwrap();
                // Angles up to ~4000 rad: f32 argument reduction differs by ~1e-4.
                let e = rel(&read(c, &dc), &hc);
                assert!(
                    e < 1e-3,
                    "rope {style:?} n_rot {n_rot} factors {factors}: relative error {e:e}"
                );
                // Queries and keys (fewer heads) in one launch.
                let k = rand_vec(&mut r, pos.len() * hd, 2.0);
                let ((mut hq, mut dq), (mut hk, mut dk)) = (pair(c, &x), pair(c, &k));
                cpu.rope(&mut hq, Staged::of(&at, &[], &hidx), heads, hd, &p, hf.as_ref()).unwrap();
                cpu.rope(&mut hk, Staged::of(&at, &[], &hidx), 1, hd, &p, hf.as_ref()).unwrap();
                let rs = ferrox_ops::RopeShape::new(heads, hd, &p);
                c.device().rope_qk(&mut dq, &mut dk, 1, pos_d.all(), &rs, df.as_ref()).unwrap();
                let (eq, ek) = (rel(&read(c, &dq), &hq), rel(&read(c, &dk), &hk));
                assert!(
                    eq < 1e-3 && ek < 1e-3,
                    "rope_qk {style:?}: relative error q {eq:e} k {ek:e}"
                );
            }
        }
    }

    #[test]
    fn attention_matches_the_cpu_backend_over_slots_windows_and_softcaps() {
        let Some(c) = gpu("CUDA attention over the f16 KV cache vs the CPU (GQA, slots, windows, softcaps, >256 keys)")
        else {
            return;
        };
        let cpu = Cpu::new(2);
        let mut r = rng();
        let mut q8_checked = 0;
        // 36: a head size the grouped kernel does not take (the per-head
        // kernel runs); the others run the grouped one. Decode batches of
        // 64 and 128 take the staged decode kernel (`attention_dec`): the
        // 1001-key steps cross its 128-key chunks and are split into 7 runs
        // (a cache of 1100 allows 8 of 128 keys) beside an unsplit 10-key
        // token, twice, so the runs' counter must be back at zero; the
        // 700-key window is split in 5, the 300-key one (starting
        // mid-chunk) in 2.
        // Two query heads a KV head, and (the last two) eight of 128, whose
        // values pass the grouped kernels' 512 a block: the decode kernel
        // takes them a head a block, four a block for split tokens.
        for (hd, window, softcap, g) in [
            (64, None, None, 2),
            (64, Some(700), None, 2),
            (128, Some(300), Some(30.0), 2),
            (256, Some(5u32), Some(50.0f32), 2),
            (40, Some(300), None, 2),
            (36, Some(300), Some(30.0), 2),
            (128, None, None, 8),
            (128, Some(700), Some(30.0), 8),
        ] {
            let p = AttnParams {
                n_head: 2 * g,
                n_head_kv: 2,
                head_dim: hd,
                head_dim_v: hd,
                scale: 1.0 / (hd as f32).sqrt(),
                softcap,
                window,
            };
            let (kd, qd) = (p.n_head_kv * hd, p.n_head * hd);
            let n_ctx = 1100;
            let mut hkv = cpu.kv_cache(2, n_ctx, &[kd, kd], &[kd, kd]).unwrap();
            let mut dkv = c.kv_cache(2, n_ctx, &[kd, kd], &[kd, kd]).unwrap();
            // A long prefill of slot 1 in chunks (crosses the 256-key chunk of
            // the kernel), a short one of slot 0, then mixed decode steps.
            let mut batches = Vec::new();
            for chunk in 0..5 {
                let mut b = Batch::default();
                for i in 0..200 {
                    b.push(0, chunk * 200 + i, 1, true);
                }
                batches.push(b);
            }
            let mut b = Batch::default();
            for i in 0..9 {
                b.push(0, i, 0, true);
            }
            batches.push(b);
            for step in 0..2 {
                let mut b = Batch::default();
                b.push(0, 9 + step, 0, true);
                b.push(0, 1000 + step, 1, true);
                batches.push(b);
            }
            for b in &batches {
                let n = b.len();
                let q = rand_vec(&mut r, n * qd, 2.0);
                let k = rand_vec(&mut r, n * kd, 2.0);
                let v = rand_vec(&mut r, n * kd, 1.0);
                let ((hq, dq), (hk, dk), (hv, dv)) = (pair(c, &q), pair(c, &k), pair(c, &v));
                let (mut ho, mut dout) = pair(c, &vec![f32::NAN; n * qd]);
                let (hidx, didx) = (stage(&cpu, b, &[]), stage(c, b, &[]));
                cpu.attention(&mut hkv, 1, Staged::of(b, &[], &hidx), [&hq, &hk, &hv], &mut ho, &p).unwrap();
                c.attention(&mut dkv, 1, Staged::of(b, &[], &didx), [&dq, &dk, &dv], &mut dout, &p).unwrap();
                let e = rel(&read(c, &dout), &ho);
                assert!(e < 1e-4, "attention hd {hd} group {g} window {window:?} softcap {softcap:?}, batch of {n}: relative error {e:e}");
                // Decode batches of the grouped kernel's fast path also leave
                // a q8 copy of the output for the next matvec: it must give,
                // bit for bit, what quantizing the same values separately gives.
                if c.device().q8_holds(&dout) {
                    let (bytes, _) = matrix(&mut r, QuantKind::Q8_0, 5, qd);
                    let w = c.device().upload_matrix(QuantKind::Q8_0, &bytes, 5, qd).unwrap();
                    let mut fused = c.alloc(n * 5).unwrap();
                    c.matmul(&w, &dout, &mut fused, n).unwrap();
                    let mut fresh = c.alloc(dout.len()).unwrap();
                    c.copy(&dout, &mut fresh).unwrap();
                    let mut sep = c.alloc(n * 5).unwrap();
                    c.matmul(&w, &fresh, &mut sep, n).unwrap();
                    let (a, b) = (read(c, &fused), read(c, &sep));
                    assert!(
                        a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                        "attention hd {hd}, batch of {n}: its q8 copy differs from quantize_q8 ({:e})",
                        rel(&a, &b)
                    );
                    q8_checked += 1;
                }
            }
            let mut far = Batch::default();
            far.push(0, n_ctx as u32, 0, true);
            let (dq, dk, dv) = (
                pair(c, &vec![0.5; qd]).1,
                pair(c, &vec![0.5; kd]).1,
                pair(c, &vec![0.5; kd]).1,
            );
            let mut dout = pair(c, &vec![0.0; qd]).1;
            let didx = stage(c, &far, &[]);
            assert!(
                c.attention(&mut dkv, 1, Staged::of(&far, &[], &didx), [&dq, &dk, &dv], &mut dout, &p).is_err(),
                "a position outside the cache must be an error"
            );
        }
        assert!(q8_checked > 0, "no decode batch left a q8 copy of the attention output");
    }

    /// RoPE with the cache store in one launch (`rope_kv`), then
    /// attention: what the CPU gives through its separate RoPE and
    /// attention (queries and output), in both styles, partial rotation
    /// with frequency factors, over prefill, two-slot and single-token
    /// decode batches; the cache each step wrote is read back by a later
    /// step (so a wrong store shows).
    #[test]
    fn fused_rope_and_cache_store_match_the_cpu_rope_then_attention() {
        let Some(c) = gpu("CUDA RoPE fused with the KV store (rope_kv) vs the CPU rope then attention") else {
            return;
        };
        if !c.device().fuses() {
            eprintln!("NOT CHECKED: FERROX_CUDA_FUSE=0, the fused RoPE and cache store did not run");
            return;
        }
        let cpu = Cpu::new(2);
        let mut r = rng();
        for (style, n_rot, factors) in [(RopeStyle::Halves, 64, false), (RopeStyle::Interleaved, 32, true), (RopeStyle::Halves, 48, true)] {
            let hd = 64;
            let p = AttnParams { n_head: 4, n_head_kv: 2, head_dim: hd, head_dim_v: hd, scale: 0.125, softcap: None, window: None };
            let rp = RopeParams { style, n_rot, base: 10000.0, freq_scale: 1.0, attn_factor: 1.0 };
            let (kd, qd) = (p.n_head_kv * hd, p.n_head * hd);
            let mut hkv = cpu.kv_cache(2, 64, &[kd], &[kd]).unwrap();
            let mut dkv = c.kv_cache(2, 64, &[kd], &[kd]).unwrap();
            let ff: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + i as f32 * 0.25).collect();
            let hf = factors.then(|| ff.clone());
            let df = factors.then(|| c.device().upload_f32(&ff).unwrap());
            let (rs, a) = (ferrox_ops::RopeShape::new(p.n_head, hd, &rp), ferrox_ops::AttnShape::new(&p, &[0, 1]));
            let mut batches = Vec::new();
            let mut b = Batch::default();
            for i in 0..7 {
                b.push(0, i, 1, true);
            }
            batches.push(b);
            for step in 0..3u32 {
                let mut b = Batch::default();
                b.push(0, 7 + step, 1, true);
                b.push(0, step, 0, true);
                batches.push(b);
            }
            // Single tokens, each read back by the next step of its slot.
            for (pos, slot) in [(10u32, 1u32), (3, 0), (11, 1), (4, 0), (12, 1)] {
                let mut b = Batch::default();
                b.push(0, pos, slot, true);
                batches.push(b);
            }
            for b in &batches {
                let n = b.len();
                let q = rand_vec(&mut r, n * qd, 2.0);
                let k = rand_vec(&mut r, n * kd, 2.0);
                let v = rand_vec(&mut r, n * kd, 1.0);
                let ((mut hq, mut dq), (mut hk, mut dk), (hv, dv)) = (pair(c, &q), pair(c, &k), pair(c, &v));
                let (mut ho, mut dout) = pair(c, &vec![f32::NAN; n * qd]);
                let hb = Staged::of(b, &[], &());
                cpu.rope(&mut hq, hb, p.n_head, hd, &rp, hf.as_ref()).unwrap();
                cpu.rope(&mut hk, hb, p.n_head_kv, hd, &rp, hf.as_ref()).unwrap();
                cpu.attention(&mut hkv, 0, hb, [&hq, &hk, &hv], &mut ho, &p).unwrap();
                let (seq, pos) = (c.device().upload_u32(&b.seq).unwrap(), c.device().upload_u32(&b.pos).unwrap());
                c.device().rope_attention(&mut dkv, 0, seq.all(), pos.all(), &mut dq, &mut dk, &dv, &mut dout, &a, &rs, df.as_ref()).unwrap();
                let (eq, eo) = (rel(&read(c, &dq), &hq), rel(&read(c, &dout), &ho));
                assert!(
                    eq < 1e-4 && eo < 1e-3,
                    "{style:?} n_rot {n_rot} factors {factors}, batch of {n}: relative error q {eq:e}, output {eo:e}"
                );
            }
        }
    }

    /// The QKV matvec whose epilogue rotates the queries and keys and
    /// stores the cache (`qkv_rope_attention`; F16 with the norm fused
    /// too, the int8 kinds after the norm apart) against the projections,
    /// `rope_kv` and the attention apart, each path on its own cache: the
    /// rotated q and k and the attention output over prefill (7 tokens,
    /// still the matvec path), two-slot and single-token batches whose
    /// keys later steps read back (a wrong store shows), frequency factors,
    /// and heads whose rows start mid-block; partial rotation is declined.
    #[test]
    fn qkv_rope_epilogue_matches_the_projections_then_rope_kv() {
        let Some(c) = gpu("CUDA QKV matvec with RoPE and the cache store in its epilogue vs the ops apart") else {
            return;
        };
        let d = c.device();
        if !d.qkv_ropes() {
            eprintln!("NOT CHECKED: FERROX_CUDA_QKV_ROPE=0 or FERROX_CUDA_FUSE=0, the RoPE epilogue did not run");
            return;
        }
        let mut r = rng();
        let eps = 1e-5f32;
        let kinds = claimed().into_iter().filter(|&k| ferrox_cuda::mmvq_kind(k) || k == QuantKind::F16);
        for kind in kinds {
            // 3 query heads (rows 0..192, so a head starts mid-block), 1 KV head.
            for (hd, n_rot, factors) in [(64usize, 64usize, false), (64, 64, true), (64, 32, true)] {
                let (n_head, n_head_kv) = (3usize, 1usize);
                let (qd, kd, cols) = (n_head * hd, n_head_kv * hd, 512usize);
                let a = ferrox_ops::AttnShape { params: ferrox_ops::AttnParams { n_head, n_head_kv, head_dim: hd, head_dim_v: hd, scale: 0.125, softcap: None, window: None }, one_slot: false };
                let rs = ferrox_ops::RopeShape { n_heads: n_head, head_dim: hd, params: ferrox_ops::RopeParams { style: ferrox_ops::RopeStyle::Interleaved, n_rot, base: 10000.0, freq_scale: 0.5, attn_factor: 1.0 } };
                let ws: Vec<ferrox_cuda::Matrix> = [qd, kd, kd]
                    .iter()
                    .map(|&rows| {
                        let (b, _) = matrix(&mut r, kind, rows, cols);
                        d.upload_matrix(kind, &b, rows, cols).unwrap()
                    })
                    .collect();
                let nw = d.upload_f32(&rand_vec(&mut r, cols, 1.0)).unwrap();
                let ff: Vec<f32> = (0..n_rot / 2).map(|i| 1.0 + i as f32 * 0.25).collect();
                let fb = factors.then(|| d.upload_f32(&ff).unwrap());
                let (mut fkv, mut skv) = (d.kv_cache(2, 32, &[kd], &[kd]).unwrap(), d.kv_cache(2, 32, &[kd], &[kd]).unwrap());
                let mut batches: Vec<Vec<(u32, u32)>> = vec![(0..7).map(|p| (1, p)).collect()];
                batches.extend((0..3).map(|s| vec![(1, 7 + s), (0, s)]));
                batches.extend([(1u32, 10u32), (0, 3), (1, 11), (0, 4), (1, 12)].map(|t| vec![t]));
                for b in &batches {
                    let n = b.len();
                    let what = format!("{kind} n_rot {n_rot} factors {factors}, batch of {n}");
                    let seq = d.upload_u32(&b.iter().map(|t| t.0).collect::<Vec<_>>()).unwrap();
                    let pos = d.upload_u32(&b.iter().map(|t| t.1).collect::<Vec<_>>()).unwrap();
                    let mut x = d.upload_f32(&rand_vec(&mut r, n * cols, 2.0)).unwrap();
                    let mut cur = c.alloc(n * cols).unwrap();
                    d.add_rms_norm(&mut x, None, &nw, eps, &mut cur).unwrap();
                    let bufs = |len: usize| (c.alloc(len).unwrap(), c.alloc(len).unwrap());
                    let ((mut fq, mut sq), (mut fk, mut sk), (mut fv, mut sv)) = (bufs(n * qd), bufs(n * kd), bufs(n * kd));
                    let (mut fo, mut so) = bufs(n * qd);
                    // Apart.
                    d.matmul_many(&cur, n, &mut [(&ws[0], &mut sq), (&ws[1], &mut sk), (&ws[2], &mut sv)]).unwrap();
                    d.rope_attention(&mut skv, 0, seq.all(), pos.all(), &mut sq, &mut sk, &sv, &mut so, &a, &rs, fb.as_ref())
                        .unwrap();
                    // In the epilogue (F16: the norm in the launch too).
                    let (input, norm) = if kind == QuantKind::F16 { (&x, Some((&nw, eps))) } else { (&cur, None) };
                    let ran = d
                        .qkv_rope_attention(&mut fkv, 0, seq.all(), pos.all(), input, norm, [&ws[0], &ws[1], &ws[2]], [&mut fq, &mut fk, &mut fv], &mut fo, &a, &rs, fb.as_ref())
                        .unwrap();
                    // Partial rotation is declined (the ops apart serve it).
                    assert_eq!(ran, n_rot == hd, "{what}: the RoPE epilogue applied: {ran}");
                    if !ran {
                        continue;
                    }
                    for (name, f, s) in [("q", &fq, &sq), ("k", &fk, &sk), ("output", &fo, &so)] {
                        let e = rel(&read(c, f), &read(c, s));
                        assert!(e < 1e-5, "{what}: {name} differs by {e:e}");
                    }
                }
            }
        }
    }

    /// The gate and up matvecs with the GLU in one launch give what the two
    /// matvecs and the GLU give apart (the int8 sums in another order: a
    /// tight relative bound), every int8 kind and F16, both activations;
    /// int8 rows in 32s, F16 rows that leave the last block part empty
    /// (37), widths with and without a partial step, and F16 rows wider
    /// than a warp's lanes (2056: the shared-memory sums); `gate` and `up`
    /// stay unwritten (so the fused kernel ran), and the down matvec over
    /// `h` gives, bit for bit, what it gives over a fresh copy of `h` (the
    /// int8 kernels' q8 copy of `h`; F16 leaves none, and must not leave
    /// another input's).
    #[test]
    fn fused_gate_up_glu_matches_the_matvecs_then_the_glu() {
        let Some(c) = gpu("CUDA gate/up matvec fused with the GLU (mmvq_glu, matvec_f16_glu_stream) vs the matvecs then the GLU") else {
            return;
        };
        if !c.device().fuses() {
            eprintln!("NOT CHECKED: FERROX_CUDA_FUSE=0, the fused gate/up/GLU did not run");
            return;
        }
        let d = c.device();
        let mut r = rng();
        let fused_kinds = claimed()
            .into_iter()
            .filter(|&k| ferrox_cuda::mmvq_kind(k) || k == QuantKind::F16);
        for kind in fused_kinds {
            let shapes: &[(usize, usize)] = if kind == QuantKind::F16 {
                // and rows past a wave of warps (a warp streams several).
                &[(37, 520), (37, 2056), (64, 512), (5, 24), (9001, 24), (4500, 2056)]
            } else if kind.block_elems() == 256 {
                // Up to 24 units a row: 8 lanes and 32 rows a block; 2048
                // and 4352 wide: 16 and 32 lanes, so two and four blocks
                // share each 32-row q8 unit of h (the unit counters).
                &[(64, 512), (96, 768), (96, 2048), (64, 4352)]
            } else {
                // 2272 wide (71 units): Q4_0's 8 units a lane, 8 lanes a
                // row, so one whole step of 8 units and a clamped rest.
                &[(64, 512), (96, 544), (96, 2080), (160, 4128), (64, 2272)]
            };
            for &(rows, cols) in shapes {
                let (gb, _) = matrix(&mut r, kind, rows, cols);
                let (ub, _) = matrix(&mut r, kind, rows, cols);
                // The down matrix as a model of the kind has it (an F16 `h`
                // need not be whole 32s).
                let dk = if kind == QuantKind::F16 { kind } else { QuantKind::Q8_0 };
                let (db, _) = matrix(&mut r, dk, 5, rows);
                let wg = d.upload_matrix(kind, &gb, rows, cols).unwrap();
                let wu = d.upload_matrix(kind, &ub, rows, cols).unwrap();
                let wd = d.upload_matrix(dk, &db, 5, rows).unwrap();
                for n in [1usize, 3] {
                    let x = d.upload_f32(&rand_vec(&mut r, n * cols, 2.0)).unwrap();
                    for act in [Activation::SiluGated, Activation::GeluGated] {
                        let mut h = d.upload_f32(&vec![f32::NAN; n * rows]).unwrap();
                        assert!(d.gate_up_glu(act, &x, n, &wg, &wu, &mut h).unwrap(), "{kind}: the fused path did not run");
                        if kind == QuantKind::F16 {
                            assert!(!d.q8_holds(&h), "{kind}: the F16 GLU writes no q8 copy of h");
                        } else {
                            assert!(d.q8_holds(&h), "{kind}: the fused GLU left no q8 copy of h");
                        }
                        let got = read(c, &h);
                        let mut down = c.alloc(n * 5).unwrap();
                        c.matmul(&wd, &h, &mut down, n).unwrap();
                        let fused_down = read(c, &down);

                        let (mut g2, mut u2) = (c.alloc(n * rows).unwrap(), c.alloc(n * rows).unwrap());
                        c.matmul(&wg, &x, &mut g2, n).unwrap();
                        c.matmul(&wu, &x, &mut u2, n).unwrap();
                        let (g2, u2) = (read(c, &g2), read(c, &u2));
                        let want: Vec<f32> = g2
                            .iter()
                            .zip(&u2)
                            .map(|(&g, &u)| {
                                let a = match act {
                                    Activation::SiluGated => g / (1.0 + (-g).exp()),
                                    Activation::GeluGated => {
                                        0.5 * g * (1.0 + (0.797_884_6 * g * (1.0 + 0.044715 * g * g)).tanh())
                                    }
                                };
                                a * u
                            })
                            .collect();
                        let e = rel(&got, &want);
                        assert!(e < 1e-5, "{kind} {rows}x{cols} n={n} {act:?}: relative error {e:e}");
                        let fresh = d.upload_f32(&got).unwrap();
                        let mut sep = c.alloc(n * 5).unwrap();
                        c.matmul(&wd, &fresh, &mut sep, n).unwrap();
                        let sep = read(c, &sep);
                        assert!(
                            fused_down.iter().zip(&sep).all(|(a, b)| a.to_bits() == b.to_bits()),
                            "{kind} n={n} {act:?}: the fused GLU's q8 copy differs from quantize_q8 ({:e})",
                            rel(&fused_down, &sep)
                        );
                    }
                }
            }
        }
    }

    /// The RMS norm fused into the F16 decode matvecs (`norm_matmul_many`,
    /// `norm_gate_up_glu`) and the matvecs that add into the residual
    /// stream (`matmul_acc`: F16 and the int8 kinds) against the same
    /// ops apart. `cur` / `scratch` stay NaN where the fused path ran;
    /// at 16 tokens (the GEMM, where cuBLAS is there) the ops run apart.
    #[test]
    fn fused_norm_and_residual_matvecs_match_the_ops_apart() {
        let Some(c) = gpu("CUDA RMS norm fused into the F16 matvecs, matvecs adding into the residual, vs the ops apart") else {
            return;
        };
        let d = c.device();
        if !d.norm_fuses() {
            eprintln!("NOT CHECKED: FERROX_CUDA_NORM_FUSE=0, only the ops apart ran");
        }
        let mut r = rng();
        let eps = 1e-5f32;
        let nan = |len: usize| d.upload_f32(&vec![f32::NAN; len]).unwrap();
        for (rows, cols) in [(37usize, 520usize), (4500, 2056), (300, 4096)] {
            let ws: Vec<ferrox_cuda::Matrix> = (0..3)
                .map(|_| {
                    let (b, _) = matrix(&mut r, QuantKind::F16, rows, cols);
                    d.upload_matrix(QuantKind::F16, &b, rows, cols).unwrap()
                })
                .collect();
            let nw = d.upload_f32(&rand_vec(&mut r, cols, 1.0)).unwrap();
            for n in [1usize, 3, 16] {
                let fused = d.norm_fuses() && d.takes_matvec(n);
                let what = format!("{rows}x{cols} n={n}");
                let x0 = rand_vec(&mut r, n * cols, 2.0);
                let mut x = d.upload_f32(&x0).unwrap();
                // Apart: the norm, then each product.
                let mut normed = c.alloc(n * cols).unwrap();
                c.add_rms_norm(&mut x, None, &nw, eps, &mut normed).unwrap();
                let want: Vec<Vec<f32>> = ws
                    .iter()
                    .map(|w| {
                        let mut y = c.alloc(n * rows).unwrap();
                        c.matmul(w, &normed, &mut y, n).unwrap();
                        read(c, &y)
                    })
                    .collect();

                let (mut cur, mut y0, mut y1) = (nan(n * cols), nan(n * rows), nan(n * rows));
                c.norm_matmul_many(&mut x, None, &nw, eps, &mut cur, n, &mut [(&ws[0], &mut y0), (&ws[1], &mut y1)])
                    .unwrap();
                assert_eq!(read(c, &cur).iter().all(|v| v.is_nan()), fused, "{what}: fused norm ran: {}", !fused);
                assert_eq!(read(c, &x), x0, "{what}: the norm wrote its input");
                for (i, y) in [y0, y1].iter().enumerate() {
                    let e = rel(&read(c, y), &want[i]);
                    assert!(e < 1e-5, "{what} matrix {i}: norm_matmul_many differs by {e:e}");
                }

                // The gate/up GLU over the normed rows.
                let mut h_want = c.alloc(n * rows).unwrap();
                let (mut g, mut u) = (c.alloc(n * rows).unwrap(), c.alloc(n * rows).unwrap());
                d.matmul_many(&normed, n, &mut [(&ws[1], &mut g), (&ws[2], &mut u)]).unwrap();
                c.glu(Activation::SiluGated, &g, &u, &mut h_want).unwrap();
                let mut h = nan(n * rows);
                let ran = d.norm_gate_up_glu(Activation::SiluGated, &x, &nw, eps, n, &ws[1], &ws[2], &mut h).unwrap();
                let glu_fused = fused && d.fuses();
                assert_eq!(ran, glu_fused, "{what}: fused norm + GLU ran: {ran}");
                if !ran {
                    continue;
                }
                let e = rel(&read(c, &h), &read(c, &h_want));
                assert!(e < 1e-5, "{what}: norm_gate_up_glu differs by {e:e}");
            }
        }

        // Projections into the residual stream: F16 and the int8 kinds.
        let kinds = claimed().into_iter().filter(|&k| ferrox_cuda::mmvq_kind(k) || k == QuantKind::F16);
        for kind in kinds {
            let (rows, cols) = (4500usize, kind.block_elems().max(32) * 9);
            let (b, _) = matrix(&mut r, kind, rows, cols);
            let w = d.upload_matrix(kind, &b, rows, cols).unwrap();
            for n in [1usize, 3, 16] {
                let fused = d.norm_fuses() && d.takes_matvec(n);
                let x = d.upload_f32(&rand_vec(&mut r, n * cols, 1.0)).unwrap();
                let acc0 = rand_vec(&mut r, n * rows, 1.0);
                let mut prod = c.alloc(n * rows).unwrap();
                c.matmul(&w, &x, &mut prod, n).unwrap();
                let want: Vec<f32> = acc0.iter().zip(read(c, &prod)).map(|(a, p)| a + p).collect();
                let mut acc = d.upload_f32(&acc0).unwrap();
                let ran = d.matmul_acc(&w, &x, &mut acc, n).unwrap();
                assert_eq!(ran, fused, "{kind} n={n}: matvec added in place: {ran}");
                if !ran {
                    continue;
                }
                let e = rel(&read(c, &acc), &want);
                assert!(e < 1e-6, "{kind} {rows}x{cols} n={n}: matmul_acc differs by {e:e}");
            }
        }
    }

    /// The plan is what runs: at one decode step of every architecture's
    /// tiny model (kinds Q4_K, Q8_0, F16, Q5_0, F32, Q4_0; fused and split
    /// QKV and gate/up, biases, Q/K norms, post-norms), each kernel the plan
    /// names for a matrix is launched exactly as often as the plan implies
    /// (one launch a matrix, one for a group it runs in one launch).
    #[test]
    fn the_plan_names_the_kernels_a_decode_step_launches() {
        let Some(_) = gpu("the plan's decode kernels vs the kernels a decode step launches, every architecture") else {
            return;
        };
        for case in crate::testing::tiny_cases() {
            let arch = case.label;
            let path = std::env::temp_dir().join(format!("ferrox-plan-{arch}-{}.gguf", std::process::id()));
            crate::testing::tiny_model(case, 7).unwrap().write_to(&path).unwrap();
            let m = crate::backend::conformance::load_or_refused(&path, Cuda::open_device(0).unwrap(), case);
            let _ = std::fs::remove_file(&path);
            let Some(m) = m else { continue };
            let mut ctx = m.new_context(64, 1).unwrap();
            let mut b = Batch::default();
            let prompt = crate::testing::tiny_tokens();
            for (i, &t) in prompt.iter().enumerate() {
                b.push(t, i as u32, 0, i + 1 == prompt.len());
            }
            m.forward(&mut ctx, &b).unwrap();
            m.backend().device().log_launches(true);
            let mut b = Batch::default();
            b.push(1, prompt.len() as u32, 0, true);
            m.forward(&mut ctx, &b).unwrap();
            let launched = m.backend().device().log_launches(false);
            assert!(!launched.is_empty(), "{arch:?}: nothing logged");
            // Launches the plan implies: one per matrix, one per group the
            // plan says runs "in one launch" (a layer's Q/K/V, gate/up).
            let mut want = std::collections::BTreeMap::<&str, usize>::new();
            let mut groups = std::collections::HashSet::new();
            for p in m.plan().tensors.iter().filter(|p| p.dims.len() == 2) {
                let Some(d) = p.decode.strip_prefix("cuda ") else { continue };
                let layer = p.name.split('.').nth(1).unwrap_or("");
                if d.contains("in one launch") && !groups.insert((layer, d)) {
                    continue;
                }
                *want.entry(d.split_whitespace().next().unwrap_or(d)).or_default() += 1;
            }
            assert!(!want.is_empty(), "{arch:?}: the plan names no kernel");
            for (kernel, n) in want {
                let got = launched.iter().filter(|l| *l == kernel).count();
                assert_eq!(got, n, "{arch:?}: the plan implies {n} launches of {kernel}, the step made {got} ({launched:?})");
            }
        }
    }
}
