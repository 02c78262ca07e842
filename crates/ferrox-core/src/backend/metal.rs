//! The Metal backend at the seam: its capability table (compiled on every
//! build, from `ferrox_ops::metal`) and, with the `metal` feature, the
//! [`DeviceBackend`](super::DeviceBackend) over `ferrox-metal`'s device.
//!
//! The decision (`docs/decisions/0037-metal-backend.md`): the Vulkan
//! backend's design on Apple's API — the whole model resident in the file's
//! block formats (the mapped file wrapped without a copy where its pages
//! allow), activations and the f16 KV cache on the device, launches encoded
//! into one command buffer that is committed when the host reads or writes;
//! every op one kernel launch, the blocks the seam's composition of them.
//! No Apple machine has run any of it: the plan says so
//! ([`BackendCaps::unverified`]).

use ferrox_ops::metal as mtl_ops;
use ferrox_quant::QuantKind;

use super::BackendCaps;
use crate::kernel_registry::Backend;

/// The Metal backend (`ferrox-metal`). Without the `metal` feature it is
/// only a capability table.
pub struct Metal {
    #[cfg(feature = "metal")]
    dev: ferrox_metal::Device,
}

impl BackendCaps for Metal {
    const ID: Backend = Backend::Metal;
    const NAME: &'static str = "Metal";
    const GEMM_FALLBACK: &'static str = "none (every claimed kind has its batched product)";

    /// The product kernel of each kind of `ferrox_ops::metal::KINDS`;
    /// `every_kind_a_compiled_backend_claims_can_actually_be_launched` ties
    /// it to the kernels the MSL source instantiates.
    fn matvec_kernel(kind: QuantKind) -> Option<String> {
        mtl_ops::matmul_kernel(kind).map(|s| format!("metal {s} (unverified)"))
    }

    /// The same kernel takes batches ([`mtl_ops::MATMUL_TILE`] tokens per read of a row).
    fn gemm_supported(kind: QuantKind) -> bool {
        mtl_ops::suffix(kind).is_some()
    }

    /// The attention kernel holds a head in 64 threads of 4 values.
    fn max_head_dim() -> Option<usize> {
        Some(mtl_ops::MAX_HEAD_DIM)
    }

    fn unverified() -> Option<&'static str> {
        Some("every kernel is Metal Shading Language compiled at run time that has never run on Apple hardware (the same logic as the Vulkan shaders, checked on Linux only as C++ through a shim)")
    }

    fn prefill_kernel(kind: QuantKind, cols: usize) -> String {
        let _ = cols;
        match mtl_ops::matmul_kernel(kind) {
            Some(s) => format!("metal {s} ({} tokens per read of a weight row; unverified)", mtl_ops::MATMUL_TILE),
            None => "none".into(),
        }
    }
}

#[cfg(feature = "metal")]
mod dispatch {
    use ferrox_ops::metal as mtl_ops;
    use ferrox_quant::QuantKind;
    use ferrox_metal::{Args, Device};

    use super::Metal;
    use crate::arch::{Activation, RopeStyle};
    use crate::backend::{AttnParams, BackendError, BackendLaunch, DeviceBackend, HostTensor, RopeParams, Staged};
    use crate::kernel_registry::Backend;

    fn be(e: ferrox_metal::MetalError) -> BackendError {
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

    /// Threadgroups of 64 threads for `n` threads.
    fn groups(n: usize) -> usize {
        n.div_ceil(mtl_ops::THREADS)
    }

    /// A kernel index must fit its 32-bit `uint`.
    fn fits(what: &str, n: usize) -> Result<u32, BackendError> {
        u32::try_from(n).map_err(|_| BackendError(format!("{what} {n} is past a kernel's 32-bit index")))
    }

    /// An f32 buffer of `len` values.
    pub struct Buf {
        b: ferrox_metal::Buf,
        len: usize,
    }

    /// A weight matrix in its file's block format: a buffer (the mapped
    /// file's pages where they could be wrapped, else a copy) and where the
    /// matrix starts in it.
    pub struct Matrix {
        b: ferrox_metal::Buf,
        at: usize,
        suffix: &'static str,
        rows: usize,
        cols: usize,
        row_bytes: usize,
    }

    /// The f16 KV cache: per layer, `n_slots * n_ctx` positions of keys and values.
    pub struct Kv {
        k: Vec<ferrox_metal::Buf>,
        v: Vec<ferrox_metal::Buf>,
        k_dims: Vec<usize>,
        v_dims: Vec<usize>,
        n_slots: usize,
        n_ctx: usize,
    }

    /// A pass's index lists (token ids, slots, positions, output rows) at
    /// fixed offsets of one buffer, for passes of up to `cap` tokens.
    pub struct MetalIndices {
        b: ferrox_metal::Buf,
        cap: usize,
    }

    impl MetalIndices {
        /// The byte offset of list `slot` (0 tokens, 1 slots, 2 positions, 3 rows) of a pass of `len`.
        fn list(&self, slot: usize, len: usize) -> Result<usize, BackendError> {
            if len > self.cap {
                return Err(BackendError(format!("{len} indices staged into room for {}", self.cap)));
            }
            Ok(slot * self.cap * 4)
        }
    }

    impl Metal {
        /// `FERROX_METAL` read and checked (`shim` is one more way to say
        /// on), `probe` asked when it is `auto` or unset.
        fn env_value(probe: impl FnOnce() -> bool) -> Result<bool, crate::backend::BadValue> {
            let v = ferrox_quant::knob::raw("FERROX_METAL")?;
            if v.as_deref().is_some_and(|v| v.trim().eq_ignore_ascii_case("shim")) {
                return Ok(true);
            }
            crate::backend::env_or_probe("FERROX_METAL", v.as_deref(), "metal", probe)
        }

        /// Checks `FERROX_METAL` without probing for a device.
        pub(crate) fn env_setting() -> Result<(), crate::backend::BadValue> {
            Metal::env_value(|| false).map(drop)
        }

        /// Opens Metal device `ordinal` (the shim off Apple targets, when
        /// `FERROX_METAL=shim`), unless `FERROX_METAL` turned Metal off.
        pub fn open_device(ordinal: usize) -> Result<Metal, BackendError> {
            crate::backend::check_env().map_err(BackendError::new)?;
            if !Metal::env_value(|| true).map_err(BackendError::new)? {
                return Err(BackendError("cannot open Metal: it is off (FERROX_METAL=0)".into()));
            }
            let dev = Device::open(ordinal).map_err(|e| BackendError(format!("cannot open a Metal device: {e}")))?;
            Ok(Metal { dev })
        }

        /// The opened device.
        pub fn device(&self) -> &Device {
            &self.dev
        }

        fn buf(&self, len: usize) -> Result<Buf, BackendError> {
            let bytes = len.checked_mul(4).ok_or_else(|| BackendError(format!("a buffer of {len} floats")))?;
            Ok(Buf { b: self.dev.alloc(bytes).map_err(be)?, len })
        }

        /// One launch of the element-wise kernel (`unary`'s `op`).
        fn unary(&self, dst: &Buf, a: Option<&Buf>, op: u32, width: usize, s: f32) -> Result<(), BackendError> {
            let len = fits("length", dst.len)?;
            let args = Args::default().buf(&dst.b, 0).buf(&a.unwrap_or(dst).b, 0).u32(len).u32(op).u32(fits("width", width)?).f32(s);
            self.dev.launch("unary", &args, groups(dst.len), 1).map_err(be)
        }

        #[allow(clippy::too_many_arguments)]
        fn glu_launch(&self, act: Activation, gate: (&Buf, usize), up: (&Buf, usize), out: &Buf, n: usize, width: usize, stride: usize) -> Result<(), BackendError> {
            let act = match act {
                Activation::SiluGated => 0,
                Activation::GeluGated => 1,
            };
            let args = Args::default()
                .buf(&gate.0.b, gate.1)
                .buf(&up.0.b, up.1)
                .buf(&out.b, 0)
                .u32(fits("rows", n)?)
                .u32(fits("width", width)?)
                .u32(fits("stride", stride)?)
                .u32(fits("stride", stride)?)
                .u32(act);
            self.dev.launch("glu", &args, groups(n * width), 1).map_err(be)
        }
    }

    impl BackendLaunch for Metal {
        fn has_launch(kind: QuantKind) -> bool {
            let s = kind.name().to_ascii_lowercase();
            ferrox_metal::has_kernel(&format!("matmul_{s}")) && ferrox_metal::has_kernel(&format!("get_rows_{s}"))
        }

        fn has_gemm(kind: QuantKind) -> bool {
            // The product kernel takes any batch: GEMM and matvec are one launch.
            Metal::has_launch(kind)
        }
    }

    impl DeviceBackend for Metal {
        type Matrix = Matrix;
        type Vector = Buf;
        type Buf = Buf;
        type Kv = Kv;
        type Indices = MetalIndices;

        fn id(&self) -> Backend {
            Backend::Metal
        }

        fn open(opts: &crate::backend::DeviceOptions) -> Result<Metal, BackendError> {
            Metal::open_device(opts.device)
        }

        fn threads(&self) -> usize {
            1
        }

        fn describe(&self) -> String {
            format!("metal ({})", self.dev.name())
        }

        fn place_matrix(&self, t: &HostTensor<'_>) -> Result<Matrix, BackendError> {
            let Some(suffix) = mtl_ops::suffix(t.kind) else {
                return Err(BackendError(format!("{}: no Metal kernel for {} matrices", t.name, t.kind)));
            };
            let row_bytes = ferrox_quant::row_bytes(t.kind, t.cols).map_err(|e| BackendError(format!("{}: {e}", t.name)))?;
            let want = row_bytes.checked_mul(t.rows).ok_or_else(|| BackendError(format!("{}: size overflows", t.name)))?;
            if t.bytes.len() != want {
                return Err(BackendError(format!("{}: {} bytes for a {}x{} {} matrix of {want}", t.name, t.bytes.len(), t.rows, t.cols, t.kind)));
            }
            fits(&format!("{}: bytes", t.name), want)?;
            // The mapped file's own pages where they can be wrapped (no
            // copy: unified memory), else a copy.
            let keep: std::sync::Arc<dyn std::any::Any + Send + Sync> = t.owner.clone();
            let borrowed = t.owner.parts().iter().find_map(|p| self.dev.borrow(p.as_bytes(), t.bytes, keep.clone()));
            let (b, at) = match borrowed {
                Some(found) => found,
                None => (self.dev.upload(t.bytes).map_err(|e| BackendError(format!("{}: {e}", t.name)))?, 0),
            };
            fits(&format!("{}: bytes", t.name), at + want)?;
            Ok(Matrix { b, at, suffix, rows: t.rows, cols: t.cols, row_bytes })
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
                let halves = |d: usize| n_slots.checked_mul(n_ctx).and_then(|p| p.checked_mul(d));
                let (Some(kh), Some(vh)) = (halves(kd), halves(vd)) else {
                    return Err(BackendError(format!("a KV cache of {n_slots} x {n_ctx} x {kd}")));
                };
                fits("KV cache values", kh)?;
                fits("KV cache values", vh)?;
                kv.k.push(self.dev.alloc(kh * 2).map_err(be)?);
                kv.v.push(self.dev.alloc(vh * 2).map_err(be)?);
            }
            Ok(kv)
        }

        fn indices(&self, n: usize) -> Result<MetalIndices, BackendError> {
            let cap = n.max(1);
            Ok(MetalIndices { b: self.dev.alloc(4 * cap * 4).map_err(be)?, cap })
        }

        fn stage(&self, dev: &mut MetalIndices, lists: Staged<'_, ()>) -> Result<(), BackendError> {
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

        fn get_rows(&self, m: &Matrix, b: Staged<'_, MetalIndices>, out: &mut Buf) -> Result<(), BackendError> {
            if let Some(&id) = b.tokens.iter().find(|&&id| id as usize >= m.rows) {
                return Err(BackendError(format!("token id {id} outside the embedding table ({} rows)", m.rows)));
            }
            let n = b.len();
            if out.len < n * m.cols {
                return Err(shape("get_rows output", n * m.cols, out.len));
            }
            let chunks = m.cols.div_ceil(32);
            fits("get_rows threads", n * chunks)?;
            let args = Args::default()
                .buf(&m.b, m.at)
                .buf(&out.b, 0)
                .buf(&b.dev.b, b.dev.list(0, n)?)
                .u32(fits("columns", m.cols)?)
                .u32(fits("tokens", n)?)
                .u32(fits("row bytes", m.row_bytes)?);
            self.dev.launch(&format!("get_rows_{}", m.suffix), &args, groups(n * chunks), 1).map_err(be)
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
            let args = Args::default()
                .buf(&x.b, 0)
                .buf(&y.b, 0)
                .buf(&w.b, w.at)
                .u32(w.rows as u32)
                .u32(w.cols as u32)
                .u32(n as u32)
                .u32(w.row_bytes as u32);
            self.dev.launch(&format!("matmul_{}", w.suffix), &args, w.rows.div_ceil(mtl_ops::MATMUL_ROWS), n.div_ceil(mtl_ops::MATMUL_TILE)).map_err(be)
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
            let args = Args::default().buf(&x.b, 0).buf(&x.b, 0).buf(&w.b, 0).u32(fits("rows", rows)?).u32(fits("width", w.len)?).f32(eps);
            self.dev.launch("rms_norm", &args, rows, 1).map_err(be)
        }

        fn rope(&self, x: &mut Buf, b: Staged<'_, MetalIndices>, n_heads: usize, head_dim: usize, p: &RopeParams, factors: Option<&Buf>) -> Result<(), BackendError> {
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
            let args = Args::default()
                .buf(&x.b, 0)
                .buf(&b.dev.b, b.dev.list(2, n)?)
                .buf(&factors.unwrap_or(x).b, 0)
                .u32(fits("tokens", n)?)
                .u32(n_heads as u32)
                .u32(head_dim as u32)
                .u32(p.n_rot as u32)
                .u32(u32::from(p.style == RopeStyle::Halves))
                .u32(u32::from(factors.is_some()))
                .f32(p.base)
                .f32(p.freq_scale)
                .f32(p.attn_factor);
            self.dev.launch("rope", &args, groups(n * n_heads * (p.n_rot / 2)), 1).map_err(be)
        }

        fn attention(&self, kv: &mut Kv, layer: usize, b: Staged<'_, MetalIndices>, [q, k, v]: [&Buf; 3], out: &mut Buf, p: &AttnParams) -> Result<(), BackendError> {
            let n = b.len();
            let cache = (kv.k_dims.get(layer), kv.v_dims.get(layer));
            let heads = (mtl_ops::MAX_HEAD_DIM, false, "kernel");
            let (kd, vd) = crate::backend::check_attention(p, heads, cache, [q.len, k.len, v.len, out.len], b, kv.n_slots, kv.n_ctx, layer)?;
            let (seq, pos) = (b.dev.list(1, n)?, b.dev.list(2, n)?);
            let (kc, vc) = (&kv.k[layer], &kv.v[layer]);
            let store = Args::default()
                .buf(&k.b, 0)
                .buf(&v.b, 0)
                .buf(kc, 0)
                .buf(vc, 0)
                .buf(&b.dev.b, seq)
                .buf(&b.dev.b, pos)
                .u32(n as u32)
                .u32(kd as u32)
                .u32(vd as u32)
                .u32(kv.n_ctx as u32);
            self.dev.launch("kv_store", &store, groups(n * (kd + vd)), 1).map_err(be)?;
            let attend = Args::default()
                .buf(&q.b, 0)
                .buf(kc, 0)
                .buf(vc, 0)
                .buf(&out.b, 0)
                .buf(&b.dev.b, seq)
                .buf(&b.dev.b, pos)
                .u32(n as u32)
                .u32(p.n_head as u32)
                .u32(p.n_head_kv as u32)
                .u32(p.head_dim as u32)
                .u32(p.head_dim_v as u32)
                .u32(kv.n_ctx as u32)
                .u32(p.window.unwrap_or(0))
                .f32(p.scale)
                .f32(p.softcap.unwrap_or(0.0));
            self.dev.launch("attention", &attend, n * p.n_head, 1).map_err(be)
        }

        fn glu(&self, act: Activation, gate: &Buf, up: &Buf, out: &mut Buf) -> Result<(), BackendError> {
            exact("glu up", up, gate.len)?;
            exact("glu out", out, gate.len)?;
            fits("glu length", gate.len)?;
            self.glu_launch(act, (gate, 0), (up, 0), out, 1, gate.len, 0)
        }

        fn glu_fused(&self, act: Activation, fused: &Buf, out: &mut Buf, width: usize) -> Result<(), BackendError> {
            if width == 0 || !fused.len.is_multiple_of(2 * width) {
                return Err(shape("fused glu width", 2 * width, fused.len));
            }
            let n = fused.len / (2 * width);
            exact("fused glu out", out, n * width)?;
            fits("glu length", fused.len)?;
            self.glu_launch(act, (fused, 0), (fused, width * 4), out, n, width, 2 * width)
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

        fn gather_rows(&self, src: &Buf, b: Staged<'_, MetalIndices>, width: usize, dst: &mut Buf) -> Result<(), BackendError> {
            let n = b.rows.len();
            exact("gather output", dst, n * width)?;
            if let Some(&r) = b.rows.iter().find(|&&r| (r as usize + 1) * width > src.len) {
                return Err(shape("gather row", r as usize, src.len / width.max(1)));
            }
            let args = Args::default()
                .buf(&src.b, 0)
                .buf(&dst.b, 0)
                .buf(&b.dev.b, b.dev.list(3, n)?)
                .u32(fits("rows", n)?)
                .u32(fits("width", width)?)
                .u32(width as u32)
                .u32(0)
                .u32(1);
            self.dev.launch("select_rows", &args, groups(n * width), 1).map_err(be)
        }

        fn split_cols(&self, src: &Buf, src_width: usize, c0: usize, dst: &mut Buf, dst_width: usize) -> Result<(), BackendError> {
            if c0 + dst_width > src_width || src_width == 0 || !src.len.is_multiple_of(src_width) {
                return Err(shape("split columns", src_width, c0 + dst_width));
            }
            let n = src.len / src_width;
            exact("split output", dst, n * dst_width)?;
            let args = Args::default()
                .buf(&src.b, 0)
                .buf(&dst.b, 0)
                .buf(&src.b, 0)
                .u32(fits("rows", n)?)
                .u32(fits("width", dst_width)?)
                .u32(fits("width", src_width)?)
                .u32(c0 as u32)
                .u32(0);
            self.dev.launch("select_rows", &args, groups(n * dst_width), 1).map_err(be)
        }
    }
}
