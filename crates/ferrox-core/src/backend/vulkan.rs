//! The Vulkan backend at the seam: its capability table (compiled on every
//! build, from `ferrox_ops::vulkan`) and, with the `vulkan` feature, the
//! [`DeviceBackend`](super::DeviceBackend) over `ferrox-vulkan`'s device.
//!
//! The decision (`docs/decisions/0033-vulkan-backend.md`): the whole model
//! is resident in the file's block formats, activations and the f16 KV
//! cache stay on the device, launches are recorded into one command buffer
//! and submitted when the host reads (logits) or writes (a pass's index
//! lists). Every op is one shader launch; the blocks are the seam's
//! composition of them ([`super::blocks`]): no fusions yet.

use ferrox_ops::vulkan as vk_ops;
use ferrox_quant::QuantKind;

use super::BackendCaps;
use crate::kernel_registry::Backend;

/// The Vulkan backend (`ferrox-vulkan`). Without the `vulkan` feature it is
/// only a capability table.
pub struct Vulkan {
    #[cfg(feature = "vulkan")]
    dev: ferrox_vulkan::Device,
    /// Decode steps recorded once and replayed, newest last (`None`:
    /// replay is off, or a recording failed and it was turned off).
    #[cfg(feature = "vulkan")]
    recorded: std::sync::Mutex<Option<Vec<(super::RecordKey, ferrox_vulkan::Recorded)>>>,
    /// The integer-dot products' activations, the newest (largest) last.
    /// A grown buffer never frees the ones before it: a kept recording may
    /// still read them by address.
    #[cfg(feature = "vulkan")]
    xq: std::sync::Mutex<Vec<ferrox_vulkan::Buf>>,
}

impl BackendCaps for Vulkan {
    const ID: Backend = Backend::Vulkan;
    const NAME: &'static str = "Vulkan";
    const GEMM_FALLBACK: &'static str = "none (every claimed kind has its batched product)";

    /// The product shader of each kind of `ferrox_ops::vulkan::KINDS`;
    /// `every_kind_a_compiled_backend_claims_can_actually_be_launched` ties
    /// it to the shaders the build compiled.
    fn matvec_kernel(kind: QuantKind) -> Option<String> {
        vk_ops::matmul_shader(kind).map(|s| format!("vulkan {s}"))
    }

    /// The same shader takes batches ([`vk_ops::MATMUL_TILE`] tokens per read of a row).
    fn gemm_supported(kind: QuantKind) -> bool {
        vk_ops::suffix(kind).is_some()
    }

    /// The attention shader holds a head in 64 threads of 4 values.
    fn max_head_dim() -> Option<usize> {
        Some(vk_ops::MAX_HEAD_DIM)
    }

    /// A mixture's experts: the float product over each routed pair's
    /// rows (found by address in the stack), routes chosen on the host.
    fn experts_kernel(kind: QuantKind) -> Option<String> {
        vk_ops::suffix(kind).map(|s| format!("vulkan matmul_{s} (a routed pair's rows a launch, the routes chosen on the host)"))
    }

    /// A shared expert is one more route of every token, weighted by the
    /// sigmoid of its gate's product (on the host).
    fn shared_expert_kernel() -> Option<String> {
        Some("vulkan matmul (the shared expert as one more route a token, weighted on the host by the sigmoid of its gate)".into())
    }

    /// Attention with sinks: the attention shader's sink logit a head.
    fn attention_sinks_kernel() -> Option<String> {
        Some("vulkan attention (a sink logit a head in its softmax)".into())
    }

    /// gpt-oss's experts: the routed pairs' float products with each
    /// expert's bias rows added, the clamped SwiGLU (`glu.comp`'s act 2);
    /// the router's bias and the softmax after the top-k on the host.
    fn oai_experts_kernel() -> Option<String> {
        Some("vulkan matmul (a routed pair's rows, its expert's bias rows added; glu act 2, the clamped SwiGLU; routed on the host)".into())
    }

    fn prefill_kernel(kind: QuantKind, cols: usize) -> String {
        let _ = cols;
        match vk_ops::matmul_shader(kind) {
            Some(s) => format!("vulkan {s} ({} tokens per read of a weight row)", vk_ops::MATMUL_TILE),
            None => "none".into(),
        }
    }
}

#[cfg(feature = "vulkan")]
mod dispatch {
    use ferrox_ops::vulkan as vk_ops;
    use ferrox_quant::QuantKind;
    use ferrox_vulkan::{Device, Push};

    use super::Vulkan;
    use crate::arch::{Activation, RopeStyle};
    use crate::backend::{AttnParams, BackendError, BackendLaunch, DeviceBackend, HostTensor, RopeParams, Staged};
    use crate::kernel_registry::Backend;

    fn be(e: ferrox_vulkan::VulkanError) -> BackendError {
        BackendError::new(e)
    }

    fn shape(what: &str, expected: usize, got: usize) -> BackendError {
        BackendError(format!("{what}: expected {expected} values, got {got}"))
    }

    fn exact(what: &str, b: &Buf, expected: usize) -> Result<(), BackendError> {
        if b.len != expected {
            return Err(shape(what, expected, b.len));
        }
        Ok(())
    }

    /// Workgroups of 64 invocations for `n` invocations.
    fn groups(n: usize) -> usize {
        n.div_ceil(64)
    }

    /// A shader index must fit its 32-bit `uint`.
    fn fits(what: &str, n: usize) -> Result<u32, BackendError> {
        u32::try_from(n).map_err(|_| BackendError(format!("{what} {n} is past a shader's 32-bit index")))
    }

    /// An f32 buffer of `len` values.
    pub struct Buf {
        b: ferrox_vulkan::Buf,
        len: usize,
    }

    impl Buf {
        fn at(&self) -> u64 {
            self.b.addr(0)
        }
    }

    /// A weight matrix in its file's block format.
    pub struct Matrix {
        b: ferrox_vulkan::Buf,
        kind: QuantKind,
        suffix: &'static str,
        rows: usize,
        cols: usize,
        row_bytes: usize,
    }

    /// The f16 KV cache: per layer, `n_slots * n_ctx` positions of keys and values.
    pub struct Kv {
        k: Vec<ferrox_vulkan::Buf>,
        v: Vec<ferrox_vulkan::Buf>,
        k_dims: Vec<usize>,
        v_dims: Vec<usize>,
        n_slots: usize,
        n_ctx: usize,
    }

    /// A pass's index lists (token ids, slots, positions, output rows) at
    /// fixed offsets of one buffer, for passes of up to `cap` tokens.
    pub struct VulkanIndices {
        b: ferrox_vulkan::Buf,
        cap: usize,
    }

    impl VulkanIndices {
        /// The address of list `slot` (0 tokens, 1 slots, 2 positions, 3 rows) of a pass of `len`.
        fn list(&self, slot: usize, len: usize) -> Result<u64, BackendError> {
            if len > self.cap {
                return Err(BackendError(format!("{len} indices staged into room for {}", self.cap)));
            }
            Ok(self.b.addr(slot * self.cap * 4))
        }
    }

    impl Vulkan {
        /// `FERROX_VULKAN` read and checked, `probe` asked when it is `auto` or unset.
        fn env_value(probe: impl FnOnce() -> bool) -> Result<bool, crate::backend::BadValue> {
            let v = ferrox_quant::knob::raw("FERROX_VULKAN")?;
            crate::backend::env_or_probe("FERROX_VULKAN", v.as_deref(), "vulkan", probe)
        }

        /// Checks `FERROX_VULKAN` without probing for a device.
        pub(crate) fn env_setting() -> Result<(), crate::backend::BadValue> {
            Vulkan::env_value(|| false).map(drop)
        }

        /// Opens Vulkan device `ordinal` (or the one `FERROX_VULKAN_DEVICE`
        /// names), unless `FERROX_VULKAN` turned Vulkan off.
        pub fn open_device(ordinal: usize) -> Result<Vulkan, BackendError> {
            crate::backend::check_env().map_err(BackendError::new)?;
            if !Vulkan::env_value(|| true).map_err(BackendError::new)? {
                return Err(BackendError("cannot open Vulkan: it is off (FERROX_VULKAN=0)".into()));
            }
            let replay = Vulkan::replay_setting().map_err(BackendError::new)?;
            let int_dot = Vulkan::int_dot_setting().map_err(BackendError::new)?;
            let opts = ferrox_vulkan::Options { int_dot, ..Default::default() };
            let dev = Device::open_with(ordinal, &opts).map_err(|e| BackendError(format!("cannot open a Vulkan device: {e}")))?;
            Ok(Vulkan::on(dev, replay))
        }

        /// The backend over an opened device.
        pub fn on(dev: Device, replay: bool) -> Vulkan {
            Vulkan { dev, recorded: std::sync::Mutex::new(replay.then(Vec::new)), xq: std::sync::Mutex::new(Vec::new()) }
        }

        /// Whether the integer-dot products run where the device has them:
        /// always, except in a `measure` build with `FERROX_VULKAN_INT_DOT=0`
        /// (the float products everywhere).
        #[cfg(feature = "measure")]
        pub(crate) fn int_dot_setting() -> Result<bool, crate::backend::BadValue> {
            ferrox_quant::knob::switch("FERROX_VULKAN_INT_DOT", true)
        }

        /// Without the `measure` feature the integer-dot products always run where offered.
        #[cfg(not(feature = "measure"))]
        pub(crate) fn int_dot_setting() -> Result<bool, crate::backend::BadValue> {
            Ok(true)
        }

        /// The scratch the integer-dot products' activations go to, at
        /// least `bytes` (grown by doubling; older ones kept, see `xq`).
        fn xq(&self, bytes: usize) -> Result<u64, BackendError> {
            let mut xq = self.xq.lock().map_err(|_| BackendError("scratch lock poisoned".into()))?;
            if xq.last().is_none_or(|b| b.bytes() < bytes) {
                let size = bytes.max(xq.last().map_or(0, |b| 2 * b.bytes())).max(1 << 16);
                xq.push(self.dev.alloc_scratch(size).map_err(be)?);
            }
            Ok(xq.last().unwrap().addr(0))
        }

        /// Whether decode steps are recorded once and replayed: always,
        /// except in a `measure` build with `FERROX_VULKAN_REPLAY=0` (each
        /// step's launches recorded anew, to measure what replay saves and
        /// to run that path on purpose).
        #[cfg(feature = "measure")]
        pub(crate) fn replay_setting() -> Result<bool, crate::backend::BadValue> {
            ferrox_quant::knob::switch("FERROX_VULKAN_REPLAY", true)
        }

        /// Without the `measure` feature decode steps are always replayed.
        #[cfg(not(feature = "measure"))]
        pub(crate) fn replay_setting() -> Result<bool, crate::backend::BadValue> {
            Ok(true)
        }

        /// Whether decode steps are recorded once and replayed.
        pub fn replay_enabled(&self) -> bool {
            self.recorded.lock().is_ok_and(|r| r.is_some())
        }

        /// The opened device.
        pub fn device(&self) -> &Device {
            &self.dev
        }

        fn buf(&self, len: usize) -> Result<Buf, BackendError> {
            let bytes = len.checked_mul(4).ok_or_else(|| BackendError(format!("a buffer of {len} floats")))?;
            Ok(Buf { b: self.dev.alloc(bytes).map_err(be)?, len })
        }

        /// The cache store, then attention (`attention.comp`), with a sink
        /// logit a head in each softmax where `sinks` is given (gpt-oss).
        #[allow(clippy::too_many_arguments)]
        fn attend(&self, kv: &mut Kv, layer: usize, b: Staged<'_, VulkanIndices>, [q, k, v]: [&Buf; 3], out: &mut Buf, p: &AttnParams, sinks: Option<&Buf>) -> Result<(), BackendError> {
            let n = b.len();
            let cache = (kv.k_dims.get(layer), kv.v_dims.get(layer));
            let heads = (vk_ops::MAX_HEAD_DIM, true, "shader");
            let (kd, vd) = crate::backend::check_attention(p, heads, cache, [q.len, k.len, v.len, out.len], b, kv.n_slots, kv.n_ctx, layer)?;
            let (seq, pos) = (b.dev.list(1, n)?, b.dev.list(2, n)?);
            let (kc, vc) = (&kv.k[layer], &kv.v[layer]);
            let store = Push::default()
                .ptr(k.at())
                .ptr(v.at())
                .ptr(kc.addr(0))
                .ptr(vc.addr(0))
                .ptr(seq)
                .ptr(pos)
                .u32(n as u32)
                .u32(kd as u32)
                .u32(vd as u32)
                .u32(kv.n_ctx as u32);
            self.dev.launch("kv_store", &store, groups(n * (kd + vd) / 2), 1).map_err(be)?;
            let attend = Push::default()
                .ptr(q.at())
                .ptr(kc.addr(0))
                .ptr(vc.addr(0))
                .ptr(out.at())
                .ptr(seq)
                .ptr(pos)
                .ptr(sinks.unwrap_or(q).at())
                .u32(n as u32)
                .u32(p.n_head as u32)
                .u32(p.n_head_kv as u32)
                .u32(p.head_dim as u32)
                .u32(p.head_dim_v as u32)
                .u32(kv.n_ctx as u32)
                .u32(p.window.unwrap_or(0))
                .f32(p.scale)
                .f32(p.softcap.unwrap_or(0.0))
                .u32(u32::from(sinks.is_some()));
            self.dev.launch("attention", &attend, n * p.n_head, 1).map_err(be)
        }

        /// One launch of the element-wise shader (`unary.comp`'s `op`).
        fn unary(&self, dst: &Buf, a: Option<&Buf>, op: u32, width: usize, s: f32) -> Result<(), BackendError> {
            self.unary_at(dst.at(), a.unwrap_or(dst).at(), dst.len, op, width, s)
        }

        /// [`Vulkan::unary`] over `len` floats at device addresses.
        fn unary_at(&self, dst: u64, a: u64, len: usize, op: u32, width: usize, s: f32) -> Result<(), BackendError> {
            let push = Push::default().ptr(dst).ptr(a).u32(fits("length", len)?).u32(op).u32(width as u32).f32(s);
            self.dev.launch("unary", &push, groups(len), 1).map_err(be)
        }

        /// The float product (`matmul_<kind>`) of rows `row0..row0 + rows`
        /// of `w` against `n` rows of `w.cols` floats at `x`, into `n` rows
        /// of `rows` floats at `y`.
        #[allow(clippy::too_many_arguments)]
        fn matmul_rows(&self, w: &Matrix, row0: usize, rows: usize, x: u64, y: u64, n: usize) -> Result<(), BackendError> {
            let push = Push::default()
                .ptr(x)
                .ptr(y)
                .ptr(w.b.addr(row0 * w.row_bytes))
                .u32(fits("rows", rows)?)
                .u32(w.cols as u32)
                .u32(fits("tokens", n)?)
                .u32(w.row_bytes as u32);
            let z = n.div_ceil(vk_ops::MATMUL_TILE);
            self.dev.launch(&format!("matmul_{}", w.suffix), &push, rows.div_ceil(vk_ops::MATMUL_ROWS), z).map_err(be)
        }

        #[allow(clippy::too_many_arguments)]
        /// `glu.comp` over `n` rows of `width`: `act`, or gpt-oss's clamped
        /// SwiGLU where `oai` is given.
        #[allow(clippy::too_many_arguments)]
        fn glu_launch(&self, act: Activation, oai: Option<crate::arch::SwigluOai>, gate: u64, up: u64, out: u64, n: usize, width: usize, stride: usize) -> Result<(), BackendError> {
            let code = match (oai, act) {
                (Some(_), _) => 2,
                (None, Activation::SiluGated) => 0,
                (None, Activation::GeluGated) => 1,
            };
            let (alpha, limit) = oai.map_or((0.0, 0.0), |o| (o.alpha, o.limit));
            let push = Push::default()
                .ptr(gate)
                .ptr(up)
                .ptr(out)
                .u32(fits("rows", n)?)
                .u32(fits("width", width)?)
                .u32(stride as u32)
                .u32(stride as u32)
                .u32(code)
                .f32(alpha)
                .f32(limit);
            self.dev.launch("glu", &push, groups(n * width), 1).map_err(be)
        }
    }

    impl BackendLaunch for Vulkan {
        fn has_launch(kind: QuantKind) -> bool {
            let s = kind.name().to_ascii_lowercase();
            ferrox_vulkan::has_shader(&format!("matmul_{s}")) && ferrox_vulkan::has_shader(&format!("get_rows_{s}"))
        }

        fn has_gemm(kind: QuantKind) -> bool {
            // The product shader takes any batch: GEMM and matvec are one launch.
            Vulkan::has_launch(kind)
        }
    }

    /// Decode recordings kept per device (a context's slot of each batch
    /// shape and head; the oldest dropped past this).
    const RECORDED_CACHE: usize = 8;

    impl DeviceBackend for Vulkan {
        type Matrix = Matrix;
        type Vector = Buf;
        type Buf = Buf;
        type Kv = Kv;
        type Indices = VulkanIndices;

        fn id(&self) -> Backend {
            Backend::Vulkan
        }

        fn open(opts: &crate::backend::DeviceOptions) -> Result<Vulkan, BackendError> {
            Vulkan::open_device(opts.device)
        }

        fn threads(&self) -> usize {
            1
        }

        /// A decode step's launches recorded once into a command buffer and
        /// submitted again on later steps over the same buffers (`key`); the
        /// token and position are staged into the index buffer before each
        /// step, outside the recording.
        fn run_recorded<E: From<BackendError>>(&self, key: crate::backend::RecordKey, may_record: bool, mut f: impl FnMut() -> Result<(), E>) -> Result<(), E> {
            let mut recorded = self.recorded.lock().map_err(|_| BackendError("replay cache lock poisoned".into()))?;
            let Some(cache) = recorded.as_mut() else {
                drop(recorded);
                return f();
            };
            if let Some((_, r)) = cache.iter().find(|(k, _)| *k == key) {
                return self.dev.replay(r).map_err(|e| E::from(be(e)));
            }
            if !may_record {
                drop(recorded);
                return f();
            }
            self.dev.begin_capture().map_err(|e| E::from(be(e)))?;
            let ran = f();
            let captured = self.dev.end_capture();
            match (ran, captured) {
                (Ok(()), Ok(r)) => {
                    self.dev.replay(&r).map_err(|e| E::from(be(e)))?;
                    if cache.len() >= RECORDED_CACHE {
                        cache.remove(0);
                    }
                    cache.push((key, r));
                    Ok(())
                }
                _ => {
                    // Off for good; nothing recorded ran, so run it directly
                    // (an error that was not the recording's comes back again).
                    *recorded = None;
                    drop(recorded);
                    f()
                }
            }
        }

        fn describe(&self) -> String {
            format!("vulkan ({})", self.dev.name())
        }

        fn place_matrix(&self, t: &HostTensor<'_>) -> Result<Matrix, BackendError> {
            let Some(suffix) = vk_ops::suffix(t.kind) else {
                return Err(BackendError(format!("{}: no Vulkan shader for {} matrices", t.name, t.kind)));
            };
            let row_bytes = ferrox_quant::row_bytes(t.kind, t.cols).map_err(|e| BackendError(format!("{}: {e}", t.name)))?;
            let want = row_bytes.checked_mul(t.rows).ok_or_else(|| BackendError(format!("{}: size overflows", t.name)))?;
            if t.bytes.len() != want {
                return Err(BackendError(format!("{}: {} bytes for a {}x{} {} matrix of {want}", t.name, t.bytes.len(), t.rows, t.cols, t.kind)));
            }
            fits(&format!("{}: bytes", t.name), want)?;
            let b = self.dev.upload(t.bytes).map_err(|e| BackendError(format!("{}: {e}", t.name)))?;
            Ok(Matrix { b, kind: t.kind, suffix, rows: t.rows, cols: t.cols, row_bytes })
        }

        fn place_vector(&self, t: &HostTensor<'_>) -> Result<Buf, BackendError> {
            self.upload(&crate::backend::vector_values(t)?)
        }

        fn alloc(&self, len: usize) -> Result<Buf, BackendError> {
            self.buf(len)
        }

        fn upload(&self, src: &[f32]) -> Result<Buf, BackendError> {
            let bytes: &[u8] = bytemuck::cast_slice(src);
            Ok(Buf { b: self.dev.upload(bytes).map_err(be)?, len: src.len() })
        }

        fn read(&self, src: &Buf, dst: &mut [f32]) -> Result<(), BackendError> {
            if dst.len() > src.len {
                return Err(shape("read", src.len, dst.len()));
            }
            self.dev.read(&src.b, 0, bytemuck::cast_slice_mut(dst)).map_err(be)
        }

        fn kv_cache(&self, n_slots: usize, n_ctx: usize, k_dims: &[usize], v_dims: &[usize]) -> Result<Kv, BackendError> {
            if k_dims.len() != v_dims.len() {
                return Err(BackendError("key and value widths for different layer counts".into()));
            }
            let mut kv = Kv { k: Vec::new(), v: Vec::new(), k_dims: k_dims.to_vec(), v_dims: v_dims.to_vec(), n_slots, n_ctx };
            for (&kd, &vd) in k_dims.iter().zip(v_dims) {
                if kd % 2 != 0 || vd % 2 != 0 {
                    return Err(BackendError(format!("KV widths {kd}/{vd}: the f16 cache stores pairs")));
                }
                let bytes = |d: usize| n_slots.checked_mul(n_ctx).and_then(|p| p.checked_mul(d * 2));
                let (kb, vb) = (bytes(kd), bytes(vd));
                let (Some(kb), Some(vb)) = (kb, vb) else {
                    return Err(BackendError(format!("a KV cache of {n_slots} x {n_ctx} x {kd}")));
                };
                fits("KV cache bytes", kb)?;
                fits("KV cache bytes", vb)?;
                kv.k.push(self.dev.alloc(kb).map_err(be)?);
                kv.v.push(self.dev.alloc(vb).map_err(be)?);
            }
            Ok(kv)
        }

        fn indices(&self, n: usize) -> Result<VulkanIndices, BackendError> {
            let cap = n.max(1);
            Ok(VulkanIndices { b: self.dev.alloc(4 * cap * 4).map_err(be)?, cap })
        }

        fn stage(&self, dev: &mut VulkanIndices, lists: Staged<'_, ()>) -> Result<(), BackendError> {
            let cap = dev.cap;
            let mut all = vec![0u32; 4 * cap];
            for (i, l) in [lists.tokens, lists.seq, lists.pos, lists.rows].into_iter().enumerate() {
                if l.len() > cap {
                    return Err(BackendError(format!("{} indices staged into room for {cap}", l.len())));
                }
                all[i * cap..i * cap + l.len()].copy_from_slice(l);
            }
            self.dev.write(&dev.b, 0, bytemuck::cast_slice(&all)).map_err(be)
        }

        fn get_rows(&self, m: &Matrix, b: Staged<'_, VulkanIndices>, out: &mut Buf) -> Result<(), BackendError> {
            if let Some(&id) = b.tokens.iter().find(|&&id| id as usize >= m.rows) {
                return Err(BackendError(format!("token id {id} outside the embedding table ({} rows)", m.rows)));
            }
            let n = b.len();
            if out.len < n * m.cols {
                return Err(shape("get_rows output", n * m.cols, out.len));
            }
            let push = Push::default()
                .ptr(m.b.addr(0))
                .ptr(out.at())
                .ptr(b.dev.list(0, n)?)
                .u32(m.cols as u32)
                .u32(fits("tokens", n)?)
                .u32(m.row_bytes as u32);
            let chunks = m.cols.div_ceil(32);
            self.dev.launch(&format!("get_rows_{}", m.suffix), &push, groups(n * chunks), 1).map_err(be)
        }

        fn matmul(&self, w: &Matrix, x: &Buf, y: &mut Buf, n: usize) -> Result<(), BackendError> {
            if x.len < n * w.cols {
                return Err(shape("matmul input", n * w.cols, x.len));
            }
            if y.len < n * w.rows {
                return Err(shape("matmul output", n * w.rows, y.len));
            }
            fits("matmul input", n * w.cols)?;
            fits("matmul output", n * w.rows)?;
            if self.dev.int_dot() && w.cols.is_multiple_of(32) {
                if let Some(shader) = vk_ops::dp_shader(w.kind) {
                    let blocks = n * w.cols / 32;
                    let xq = self.xq(blocks * 36)?;
                    let quant = Push::default().ptr(x.at()).ptr(xq).u32(fits("blocks", blocks)?);
                    self.dev.launch("quantize_q8", &quant, groups(blocks), 1).map_err(be)?;
                    let push = Push::default()
                        .ptr(xq)
                        .ptr(y.at())
                        .ptr(w.b.addr(0))
                        .u32(w.rows as u32)
                        .u32(w.cols as u32)
                        .u32(n as u32)
                        .u32(w.row_bytes as u32);
                    let z = n.div_ceil(vk_ops::MATMUL_TILE);
                    return self.dev.launch(&shader, &push, w.rows.div_ceil(vk_ops::MATMUL_ROWS), z).map_err(be);
                }
            }
            self.matmul_rows(w, 0, w.rows, x.at(), y.at(), n)
        }

        fn add_bias(&self, y: &mut Buf, b: &Buf, n: usize) -> Result<(), BackendError> {
            exact("bias input", y, n * b.len)?;
            self.unary(y, Some(b), 4, b.len.max(1), 0.0)
        }

        fn rms_norm(&self, x: &mut Buf, w: &Buf, eps: f32) -> Result<(), BackendError> {
            if w.len == 0 || !x.len.is_multiple_of(w.len) {
                return Err(shape("rms_norm width", w.len, x.len));
            }
            let rows = x.len / w.len;
            let push = Push::default().ptr(x.at()).ptr(x.at()).ptr(w.at()).u32(fits("rows", rows)?).u32(w.len as u32).f32(eps);
            self.dev.launch("rms_norm", &push, rows, 1).map_err(be)
        }

        fn rope(&self, x: &mut Buf, b: Staged<'_, VulkanIndices>, n_heads: usize, head_dim: usize, p: &RopeParams, factors: Option<&Buf>) -> Result<(), BackendError> {
            let n = b.len();
            exact("rope input", x, n * n_heads * head_dim)?;
            if p.n_rot > head_dim || !p.n_rot.is_multiple_of(2) {
                return Err(BackendError(format!("n_rot {} does not fit head size {head_dim}", p.n_rot)));
            }
            if let Some(f) = factors {
                if f.len < p.n_rot / 2 {
                    return Err(shape("rope factors", p.n_rot / 2, f.len));
                }
            }
            let push = Push::default()
                .ptr(x.at())
                .ptr(b.dev.list(2, n)?)
                .ptr(factors.unwrap_or(x).at())
                .u32(fits("tokens", n)?)
                .u32(n_heads as u32)
                .u32(head_dim as u32)
                .u32(p.n_rot as u32)
                .u32(u32::from(p.style == RopeStyle::Halves))
                .u32(u32::from(factors.is_some()))
                .f32(p.base)
                .f32(p.freq_scale)
                .f32(p.attn_factor);
            self.dev.launch("rope", &push, groups(n * n_heads * (p.n_rot / 2)), 1).map_err(be)
        }

        fn attention(&self, kv: &mut Kv, layer: usize, b: Staged<'_, VulkanIndices>, qkv: [&Buf; 3], out: &mut Buf, p: &AttnParams) -> Result<(), BackendError> {
            self.attend(kv, layer, b, qkv, out, p, None)
        }

        fn attention_sinks(&self, kv: &mut Kv, layer: usize, b: Staged<'_, VulkanIndices>, qkv: [&Buf; 3], out: &mut Buf, p: &AttnParams, sinks: &Buf) -> Result<(), BackendError> {
            exact("attention sinks", sinks, p.n_head)?;
            self.attend(kv, layer, b, qkv, out, p, Some(sinks))
        }

        fn glu(&self, act: Activation, gate: &Buf, up: &Buf, out: &mut Buf) -> Result<(), BackendError> {
            exact("glu up", up, gate.len)?;
            exact("glu out", out, gate.len)?;
            fits("glu length", gate.len)?;
            self.glu_launch(act, None, gate.at(), up.at(), out.at(), 1, gate.len, 0)
        }

        fn glu_fused(&self, act: Activation, fused: &Buf, out: &mut Buf, width: usize) -> Result<(), BackendError> {
            if width == 0 || !fused.len.is_multiple_of(2 * width) {
                return Err(shape("fused glu width", 2 * width, fused.len));
            }
            let n = fused.len / (2 * width);
            exact("fused glu out", out, n * width)?;
            self.glu_launch(act, None, fused.at(), fused.b.addr(width * 4), out.at(), n, width, 2 * width)
        }

        fn copy(&self, src: &Buf, dst: &mut Buf) -> Result<(), BackendError> {
            exact("copy", src, dst.len)?;
            self.unary(dst, Some(src), 0, 1, 0.0)
        }

        fn add(&self, a: &mut Buf, b: &Buf) -> Result<(), BackendError> {
            exact("add", b, a.len)?;
            self.unary(a, Some(b), 1, 1, 0.0)
        }

        fn scale(&self, x: &mut Buf, s: f32) -> Result<(), BackendError> {
            self.unary(x, None, 2, 1, s)
        }

        fn softcap(&self, x: &mut Buf, cap: f32) -> Result<(), BackendError> {
            if cap.is_nan() || cap <= 0.0 {
                return Err(BackendError(format!("softcap {cap}")));
            }
            self.unary(x, None, 3, 1, cap)
        }

        fn gather_rows(&self, src: &Buf, b: Staged<'_, VulkanIndices>, width: usize, dst: &mut Buf) -> Result<(), BackendError> {
            let n = b.rows.len();
            exact("gather output", dst, n * width)?;
            if let Some(&r) = b.rows.iter().find(|&&r| (r as usize + 1) * width > src.len) {
                return Err(shape("gather row", r as usize, src.len / width.max(1)));
            }
            let push = Push::default()
                .ptr(src.at())
                .ptr(dst.at())
                .ptr(b.dev.list(3, n)?)
                .u32(fits("rows", n)?)
                .u32(width as u32)
                .u32(width as u32)
                .u32(0)
                .u32(1);
            self.dev.launch("select", &push, groups(n * width), 1).map_err(be)
        }

        /// The routed experts as the seam's default block routes them (on the
        /// host): each pair's gate and up rows by the float product (one
        /// launch a matrix and pair, the expert's rows found by address),
        /// the GLU over all pairs of a width at once, each pair's down rows,
        /// then each pair's output added into its token's row scaled by its
        /// weight. gpt-oss's experts add their bias rows to each product
        /// (one more launch a product) and take its clamped SwiGLU.
        fn moe_experts(&self, w: &crate::backend::MoeBlock<'_, Vulkan>, x: &Buf, routes: &[crate::backend::Route], out: &mut Buf) -> Result<(), BackendError> {
            let (e, ne) = (w.n_embd, w.experts.n_expert);
            if let Some(b) = &w.biases {
                let ff = w.experts.n_ff;
                exact("gate biases", b.gate, ne * ff)?;
                exact("up biases", b.up, ne * ff)?;
                exact("down biases", b.down, ne * e)?;
            }
            // An expert's bias row of `which` (0 gate, 1 up, 2 down; routed experts only).
            let bias = |which: usize, r: &crate::backend::Route, width: usize| -> Option<u64> {
                let b = w.biases.as_ref().filter(|_| r.expert < ne)?;
                Some([b.gate, b.up, b.down][which].b.addr(r.expert * width * 4))
            };
            if e == 0 || !out.len.is_multiple_of(e) || x.len != out.len {
                return Err(shape("experts input and output", out.len, x.len));
            }
            let n = out.len / e;
            // (matrices, expert index in them, hidden width) of a route.
            let of = |r: &crate::backend::Route| -> Result<([&Matrix; 3], usize, usize), BackendError> {
                if r.token >= n {
                    return Err(BackendError(format!("a route to token {} of {n}", r.token)));
                }
                match (r.expert < ne, &w.shared) {
                    (true, _) => Ok(([w.gate, w.up, w.down], r.expert, w.experts.n_ff)),
                    (false, Some(sh)) if r.expert == ne => Ok(([sh.gate, sh.up, sh.down], 0, sh.n_ff)),
                    _ => Err(BackendError(format!("a route to expert {} of {ne}", r.expert))),
                }
            };
            for (m, rows, cols) in [(w.gate, w.experts.n_ff, e), (w.up, w.experts.n_ff, e), (w.down, e, w.experts.n_ff)] {
                if m.rows != ne * rows || m.cols != cols {
                    return Err(BackendError(format!("an expert stack of {}x{} where {ne} experts of {rows}x{cols} are expected", m.rows, m.cols)));
                }
            }
            self.unary_at(out.at(), out.at(), out.len, 6, 1, 0.0)?;
            if routes.is_empty() {
                return Ok(());
            }
            // The pairs of each hidden width side by side (the routed, then
            // the shared expert's), so one GLU launch takes each width.
            let mut order: Vec<(usize, [&Matrix; 3], usize, usize)> = Vec::with_capacity(routes.len());
            for (p, r) in routes.iter().enumerate() {
                let (m, index, ff) = of(r)?;
                order.push((p, m, index, ff));
            }
            order.sort_by_key(|o| o.3);
            let hidden: usize = order.iter().map(|o| o.3).sum();
            let (g, u, h, d) = (self.buf(hidden)?, self.buf(hidden)?, self.buf(hidden)?, self.buf(routes.len() * e)?);
            let mut at = 0;
            for &(p, [gate, up, _], index, ff) in &order {
                let xt = x.b.addr(routes[p].token * e * 4);
                self.matmul_rows(gate, index * ff, ff, xt, g.b.addr(at * 4), 1)?;
                self.matmul_rows(up, index * ff, ff, xt, u.b.addr(at * 4), 1)?;
                for (which, y) in [(0, &g), (1, &u)] {
                    if let Some(row) = bias(which, &routes[p], ff) {
                        self.unary_at(y.b.addr(at * 4), row, ff, 1, 1, 0.0)?;
                    }
                }
                at += ff;
            }
            let mut at = 0;
            for width in order.iter().map(|o| o.3).collect::<std::collections::BTreeSet<usize>>() {
                let count = order.iter().filter(|o| o.3 == width).count();
                let (ga, ua, ha) = (g.b.addr(at * 4), u.b.addr(at * 4), h.b.addr(at * 4));
                self.glu_launch(w.act, w.experts.swiglu_oai, ga, ua, ha, count, width, width)?;
                at += count * width;
            }
            let mut at = 0;
            for &(p, [_, _, down], index, ff) in &order {
                self.matmul_rows(down, index * e, e, h.b.addr(at * 4), d.b.addr(p * e * 4), 1)?;
                if let Some(row) = bias(2, &routes[p], e) {
                    self.unary_at(d.b.addr(p * e * 4), row, e, 1, 1, 0.0)?;
                }
                at += ff;
            }
            for (p, r) in routes.iter().enumerate() {
                self.unary_at(out.b.addr(r.token * e * 4), d.b.addr(p * e * 4), e, 5, 1, r.weight)?;
            }
            Ok(())
        }

        fn split_cols(&self, src: &Buf, src_width: usize, c0: usize, dst: &mut Buf, dst_width: usize) -> Result<(), BackendError> {
            if c0 + dst_width > src_width || src_width == 0 || !src.len.is_multiple_of(src_width) {
                return Err(shape("split columns", src_width, c0 + dst_width));
            }
            let n = src.len / src_width;
            exact("split output", dst, n * dst_width)?;
            let push = Push::default()
                .ptr(src.at())
                .ptr(dst.at())
                .ptr(src.at())
                .u32(fits("rows", n)?)
                .u32(dst_width as u32)
                .u32(src_width as u32)
                .u32(c0 as u32)
                .u32(0);
            self.dev.launch("select", &push, groups(n * dst_width), 1).map_err(be)
        }
    }
}

/// Both sides of the integer-dot switch on whatever Vulkan device opens (CI:
/// lavapipe, which has integer dot products): the conformance suite runs the
/// integer-dot products for their kinds, and these run the float products
/// that stand in for them where a device has none.
#[cfg(all(test, feature = "vulkan"))]
mod tests {
    use super::Vulkan;
    use crate::backend::conformance as c;
    use crate::kernel_registry::Backend;
    use ferrox_ops::vulkan as vk_ops;

    fn open(int_dot: bool, what: &str) -> Option<ferrox_vulkan::Device> {
        match ferrox_vulkan::Device::open_with(0, &ferrox_vulkan::Options { int_dot, ..Default::default() }) {
            Ok(d) => Some(d),
            Err(e) => {
                let required = std::env::var_os(c::require_var(Backend::Vulkan)).is_some_and(|v| v == "1");
                assert!(!required, "the Vulkan device did not open: {e}");
                eprintln!("NOT CHECKED on vulkan ({e}): {what}");
                None
            }
        }
    }

    #[test]
    fn the_float_products_stand_in_for_the_integer_dot_ones() {
        let Some(dev) = open(false, "the float products of the integer-dot kinds") else { return };
        assert!(!dev.int_dot(), "integer dot products asked off and still on");
        let be = Vulkan::on(dev, true);
        // Every kind, the integer-dot ones among them, on the float products.
        assert!(vk_ops::DP_KINDS.iter().all(|&k| vk_ops::suffix(k).is_some()));
        c::matmul_matches_the_scalar_twin(&be, |k| vk_ops::suffix(k).is_some());
    }

    #[test]
    fn lavapipe_takes_the_integer_dot_products() {
        let Some(dev) = open(true, "integer dot products on lavapipe") else { return };
        if dev.name().contains("llvmpipe") {
            assert!(dev.int_dot(), "lavapipe offers shaderIntegerDotProduct, so CI runs the integer-dot products");
        } else {
            eprintln!("{}: integer dot products {}", dev.name(), if dev.int_dot() { "on" } else { "not offered" });
        }
    }
}
