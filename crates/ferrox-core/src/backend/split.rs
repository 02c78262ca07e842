//! Placement per layer: the last `gpu_layers` blocks of a model on a device,
//! the rest on the CPU (llama.cpp's `-ngl N` / `--n-gpu-layers N`), for a
//! user whose GPU cannot hold the whole model.
//!
//! The decision: a split is a [`DeviceBackend`] of its own, `Split<D>`, over
//! the CPU and the device `D`, so the one decoder, the scheduler, the
//! sessions and every command run on it unchanged. Each weight is placed on
//! the side its layer is on ([`side_of`], the same rule the plan reports);
//! an op with a weight runs on that weight's side, an op without one on the
//! side of the last weighted op, so a forward pass walks the CPU's layers,
//! crosses once, and stays on the device to the head. An activation buffer
//! has a copy on each side and knows which is current: it crosses only when
//! an op on the other side reads it (at the boundary: the residual stream
//! and the normed rows going up; the logits coming down). No recording
//! (CUDA graphs) on a split: the CPU's layers bound its speed.

use std::cell::{Cell, Ref, RefCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use super::cpu::{Cpu, CpuKv, CpuWeight};
use super::{AttnBlock, AttnParams, BackendError, DeviceBackend, DeviceOptions, ExpertBiases, FfnBlock, HostTensor, MoeBlock, QkvWeights, RopeParams, Scratch, SharedExpert, Staged};
use crate::arch::Activation;
use crate::kernel_registry::Backend;

/// Where a tensor of a split model lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The CPU.
    Host,
    /// The device.
    Device,
    /// Both: tensors every layer reads (RoPE frequency factors), and a tied
    /// embedding, which the CPU looks rows up in and the device's head reads.
    Both,
}

/// The block index of a tensor named `blk.N.…`.
fn layer_of(name: &str) -> Option<usize> {
    name.strip_prefix("blk.")?.split('.').next()?.parse().ok()
}

/// Whether block `layer` of `n_layer` is on the device: the last
/// `gpu_layers`, as llama.cpp offloads them.
pub fn layer_on_device(layer: usize, n_layer: usize, gpu_layers: usize) -> bool {
    layer >= n_layer.saturating_sub(gpu_layers)
}

/// The side of the tensor `name` in a model of `n_layer` blocks with the last
/// `gpu_layers` on the device (`tied`: the head reads the embedding). The
/// embedding is looked up where the first block runs, the output norm and
/// head run where the last block runs.
pub fn side_of(name: &str, n_layer: usize, gpu_layers: usize, tied: bool) -> Side {
    let on = |l| if layer_on_device(l, n_layer, gpu_layers) { Side::Device } else { Side::Host };
    match layer_of(name) {
        Some(l) => on(l),
        None if name.starts_with("token_embd") => match (on(0), tied && n_layer > 0) {
            (first, true) if first != on(n_layer - 1) => Side::Both,
            (first, _) => first,
        },
        None if name.starts_with("output") => on(n_layer.saturating_sub(1)),
        None => Side::Both,
    }
}

/// A weight of a split model, on its side (or both): `H` as the CPU holds
/// it, `W` as the device does.
pub enum SplitWeight<H, W> {
    /// On the CPU.
    Host(H),
    /// On the device.
    Device(W),
    /// On both.
    Both(H, W),
}

impl<H, W> SplitWeight<H, W> {
    fn host(&self) -> Result<&H, BackendError> {
        match self {
            SplitWeight::Host(c) | SplitWeight::Both(c, _) => Ok(c),
            SplitWeight::Device(_) => Err(BackendError("a device weight read on the CPU side of a split".into())),
        }
    }

    fn dev(&self) -> Result<&W, BackendError> {
        match self {
            SplitWeight::Device(d) | SplitWeight::Both(_, d) => Ok(d),
            SplitWeight::Host(_) => Err(BackendError("a CPU weight read on the device side of a split".into())),
        }
    }

    /// Whether it is on the device only (`None`: on both).
    fn on_device(&self) -> Option<bool> {
        match self {
            SplitWeight::Host(_) => Some(false),
            SplitWeight::Device(_) => Some(true),
            SplitWeight::Both(..) => None,
        }
    }

    /// Places a tensor on `side`.
    fn place(side: Side, host: impl FnOnce() -> Result<H, BackendError>, dev: impl FnOnce() -> Result<W, BackendError>) -> Result<Self, BackendError> {
        Ok(match side {
            Side::Host => SplitWeight::Host(host()?),
            Side::Device => SplitWeight::Device(dev()?),
            Side::Both => SplitWeight::Both(host()?, dev()?),
        })
    }
}

/// A matrix of a split model.
pub type SplitMatrix<D> = SplitWeight<CpuWeight, <D as DeviceBackend>::Matrix>;
/// A vector of a split model.
pub type SplitVector<D> = SplitWeight<Vec<f32>, <D as DeviceBackend>::Vector>;

/// Which copies of a [`SplitBuf`] hold its current contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Valid {
    Host,
    Device,
    Both,
}

/// An activation buffer of a split model: a copy on each side.
pub struct SplitBuf<B> {
    host: RefCell<Vec<f32>>,
    dev: RefCell<B>,
    valid: Cell<Valid>,
}

/// The KV cache of a split model: each side holds its own layers (the other
/// side's layers are zero-sized there).
pub struct SplitKv<K> {
    host: CpuKv,
    dev: K,
}

/// The CPU and a device `D`, the last `gpu_layers` blocks on `D`.
pub struct Split<D: DeviceBackend> {
    cpu: Cpu,
    dev: D,
    gpu_layers: usize,
    n_layer: AtomicUsize,
    /// The side of the last op that had a weight (ops without one follow it).
    on_device: AtomicBool,
}

impl<D: DeviceBackend> Split<D> {
    /// The CPU and `dev`, the last `gpu_layers` blocks on `dev`.
    pub fn new(cpu: Cpu, dev: D, gpu_layers: usize) -> Split<D> {
        Split { cpu, dev, gpu_layers, n_layer: AtomicUsize::new(0), on_device: AtomicBool::new(false) }
    }

    fn n_layer(&self) -> usize {
        self.n_layer.load(Ordering::Relaxed)
    }

    fn here(&self) -> bool {
        self.on_device.load(Ordering::Relaxed)
    }

    fn go(&self, device: bool) -> bool {
        self.on_device.store(device, Ordering::Relaxed);
        device
    }

    /// The side an op with weight `w` runs on (and the side from now on).
    fn side<H, W>(&self, w: &SplitWeight<H, W>) -> bool {
        self.go(w.on_device().unwrap_or_else(|| self.here()))
    }

    /// `b`'s contents on the CPU (copied down if only the device has them).
    fn host_in<'a>(&self, b: &'a SplitBuf<D::Buf>) -> Result<Ref<'a, Vec<f32>>, BackendError> {
        if b.valid.get() == Valid::Device {
            let mut h = b.host.borrow_mut();
            self.dev.read(&b.dev.borrow(), &mut h)?;
            b.valid.set(Valid::Both);
        }
        Ok(b.host.borrow())
    }

    /// `b`'s contents on the device (copied up if only the CPU has them).
    fn dev_in<'a>(&self, b: &'a SplitBuf<D::Buf>) -> Result<Ref<'a, D::Buf>, BackendError> {
        if b.valid.get() == Valid::Host {
            let up = self.dev.upload(&b.host.borrow())?;
            *b.dev.borrow_mut() = up;
            b.valid.set(Valid::Both);
        }
        Ok(b.dev.borrow())
    }

    /// `b` read and written on the CPU: current there only afterwards.
    fn host_io<'a>(&self, b: &'a mut SplitBuf<D::Buf>) -> Result<&'a mut Vec<f32>, BackendError> {
        drop(self.host_in(b)?);
        Ok(Self::host_out(b))
    }

    /// `b` read and written on the device.
    fn dev_io<'a>(&self, b: &'a mut SplitBuf<D::Buf>) -> Result<&'a mut D::Buf, BackendError> {
        drop(self.dev_in(b)?);
        Ok(Self::dev_out(b))
    }

    /// `b` written on the CPU (what it held before is not read).
    fn host_out(b: &mut SplitBuf<D::Buf>) -> &mut Vec<f32> {
        b.valid.set(Valid::Host);
        b.host.get_mut()
    }

    /// `b` written on the device.
    fn dev_out(b: &mut SplitBuf<D::Buf>) -> &mut D::Buf {
        b.valid.set(Valid::Device);
        b.dev.get_mut()
    }

    /// Layer dimensions of one side: the other side's layers zero-sized.
    fn dims(&self, dims: &[usize], device: bool) -> Vec<usize> {
        let n = dims.len();
        dims.iter().enumerate().map(|(l, &d)| if layer_on_device(l, n, self.gpu_layers) == device { d } else { 0 }).collect()
    }
}

/// Runs an op without a weight on the current side: `$host` with the CPU
/// backend and the buffers as the CPU's, or `$dev` with the device's.
macro_rules! on_current_side {
    ($s:ident, |$c:ident| $host:expr, |$d:ident| $dev:expr) => {
        if $s.here() {
            let $d = &$s.dev;
            $dev
        } else {
            let $c = &$s.cpu;
            $host
        }
    };
}

/// An attention block's weights as one side holds them (`m`, `v` pick the side).
fn attn_on<'a, D: DeviceBackend, X: DeviceBackend>(
    w: &AttnBlock<'a, Split<D>>,
    m: impl Fn(&'a SplitMatrix<D>) -> Result<&'a X::Matrix, BackendError>,
    v: impl Fn(&'a SplitVector<D>) -> Result<&'a X::Vector, BackendError>,
) -> Result<AttnBlock<'a, X>, BackendError> {
    let ov = |o: Option<&'a SplitVector<D>>| o.map(&v).transpose();
    Ok(AttnBlock {
        layer: w.layer,
        eps: w.eps,
        norm: v(w.norm)?,
        qkv: match &w.qkv {
            QkvWeights::Fused(wqkv, bias) => QkvWeights::Fused(m(wqkv)?, ov(*bias)?),
            QkvWeights::Separate([q, k, vw], [bq, bk, bv]) => QkvWeights::Separate([m(q)?, m(k)?, m(vw)?], [ov(*bq)?, ov(*bk)?, ov(*bv)?]),
        },
        qk_norm: match w.qk_norm {
            Some((q, k)) => Some((v(q)?, v(k)?)),
            None => None,
        },
        out: m(w.out)?,
        out_bias: ov(w.out_bias)?,
        post_norm: ov(w.post_norm)?,
        rope: w.rope,
        factors: ov(w.factors)?,
        attn: w.attn,
        sinks: ov(w.sinks)?,
    })
}

/// A feed-forward block's weights as one side holds them.
fn ffn_on<'a, D: DeviceBackend, X: DeviceBackend>(
    w: &FfnBlock<'a, Split<D>>,
    m: impl Fn(&'a SplitMatrix<D>) -> Result<&'a X::Matrix, BackendError>,
    v: impl Fn(&'a SplitVector<D>) -> Result<&'a X::Vector, BackendError>,
) -> Result<FfnBlock<'a, X>, BackendError> {
    Ok(FfnBlock {
        eps: w.eps,
        act: w.act,
        norm: v(w.norm)?,
        gate: w.gate.map(&m).transpose()?,
        up: m(w.up)?,
        down: m(w.down)?,
        post_norm: w.post_norm.map(&v).transpose()?,
        n_ff: w.n_ff,
    })
}

/// A mixture-of-experts block's weights as one side holds them.
fn moe_on<'a, D: DeviceBackend, X: DeviceBackend>(
    w: &MoeBlock<'a, Split<D>>,
    m: impl Fn(&'a SplitMatrix<D>) -> Result<&'a X::Matrix, BackendError>,
    v: impl Fn(&'a SplitVector<D>) -> Result<&'a X::Vector, BackendError>,
) -> Result<MoeBlock<'a, X>, BackendError> {
    Ok(MoeBlock {
        eps: w.eps,
        act: w.act,
        norm: v(w.norm)?,
        router: m(w.router)?,
        gate: m(w.gate)?,
        up: m(w.up)?,
        down: m(w.down)?,
        post_norm: w.post_norm.map(&v).transpose()?,
        n_embd: w.n_embd,
        experts: w.experts,
        shared: match &w.shared {
            Some(sh) => Some(SharedExpert { gate_inp: m(sh.gate_inp)?, gate: m(sh.gate)?, up: m(sh.up)?, down: m(sh.down)?, n_ff: sh.n_ff }),
            None => None,
        },
        biases: match &w.biases {
            Some(b) => Some(ExpertBiases { router: b.router, gate: v(b.gate)?, up: v(b.up)?, down: v(b.down)? }),
            None => None,
        },
    })
}

/// Every buffer of a block's scratch, the residual stream and a pending
/// output first (the only two a block reads before writing).
fn each_buf<'s, B>(s: &'s mut Scratch<'_, SplitBuf<B>>) -> impl Iterator<Item = &'s mut SplitBuf<B>> {
    let Scratch { x, o, cur, q, k, v, qkv, attn, gate, up, h, .. } = s;
    [&mut **x, &mut **o, &mut **cur, &mut **q, &mut **k, &mut **v, &mut **attn, &mut **gate, &mut **up, &mut **h].into_iter().chain(qkv.as_deref_mut())
}

impl<D: DeviceBackend> Split<D> {
    /// The scratch as the device's buffers: the residual stream (and a
    /// pending output) copied up if the CPU holds them, every buffer current
    /// on the device afterwards (the block writes the rest before reading).
    fn dev_scratch<'s>(&self, s: &'s mut Scratch<'_, SplitBuf<D::Buf>>) -> Result<Scratch<'s, D::Buf>, BackendError> {
        drop(self.dev_in(s.x)?);
        if s.pending {
            drop(self.dev_in(s.o)?);
        }
        each_buf(s).for_each(|b| b.valid.set(Valid::Device));
        let Scratch { x, cur, q, k, v, qkv, attn, o, gate, up, h, pending } = s;
        let d = |b: &'s mut SplitBuf<D::Buf>| b.dev.get_mut();
        Ok(Scratch { x: d(x), cur: d(cur), q: d(q), k: d(k), v: d(v), qkv: qkv.as_deref_mut().map(d), attn: d(attn), o: d(o), gate: d(gate), up: d(up), h: d(h), pending: *pending })
    }

    /// The scratch as the CPU's buffers (the mirror of [`Split::dev_scratch`]).
    fn host_scratch<'s>(&self, s: &'s mut Scratch<'_, SplitBuf<D::Buf>>) -> Result<Scratch<'s, Vec<f32>>, BackendError> {
        drop(self.host_in(s.x)?);
        if s.pending {
            drop(self.host_in(s.o)?);
        }
        each_buf(s).for_each(|b| b.valid.set(Valid::Host));
        let Scratch { x, cur, q, k, v, qkv, attn, o, gate, up, h, pending } = s;
        let c = |b: &'s mut SplitBuf<D::Buf>| b.host.get_mut();
        Ok(Scratch { x: c(x), cur: c(cur), q: c(q), k: c(k), v: c(v), qkv: qkv.as_deref_mut().map(c), attn: c(attn), o: c(o), gate: c(gate), up: c(up), h: c(h), pending: *pending })
    }
}

impl<D: DeviceBackend> DeviceBackend for Split<D> {
    type Matrix = SplitMatrix<D>;
    type Vector = SplitVector<D>;
    type Buf = SplitBuf<D::Buf>;
    type Kv = SplitKv<D::Kv>;
    type Indices = D::Indices;

    fn open(opts: &DeviceOptions) -> Result<Self, BackendError> {
        let cpu = Cpu::open(&DeviceOptions { backend: Backend::Cpu, device: 0, threads: opts.threads, gpu_layers: None })?;
        let gpu_layers = opts.gpu_layers.unwrap_or(usize::MAX);
        Ok(Split::new(cpu, D::open(&DeviceOptions { gpu_layers: None, ..*opts })?, gpu_layers))
    }

    fn id(&self) -> Backend {
        self.dev.id()
    }

    fn threads(&self) -> usize {
        self.cpu.threads()
    }

    fn host_threads(&self) -> usize {
        self.cpu.host_threads()
    }

    fn describe(&self) -> String {
        let n = self.n_layer();
        format!("{} + {}: layers {}..{n} of {n} on {}", self.cpu.describe(), self.dev.describe(), n.saturating_sub(self.gpu_layers), self.dev.id())
    }

    fn prepare(&mut self, config: &crate::model::ModelConfig) -> Result<(), BackendError> {
        self.n_layer.store(config.n_layer, Ordering::Relaxed);
        Ok(())
    }

    fn backend_of(&self, name: &str) -> Backend {
        match side_of(name, self.n_layer(), self.gpu_layers, false) {
            Side::Host => Backend::Cpu,
            Side::Device | Side::Both => self.dev.id(),
        }
    }

    fn free_memory(&self) -> Option<u64> {
        self.dev.free_memory()
    }

    fn device_memory(&self) -> Option<(u64, u64)> {
        self.dev.device_memory()
    }

    fn prefer_exact_products(&self) {
        self.cpu.prefer_exact_products();
        self.dev.prefer_exact_products();
    }

    fn place_matrix(&self, t: &HostTensor<'_>) -> Result<Self::Matrix, BackendError> {
        let tied = t.owner.tensor("output.weight").is_none();
        SplitWeight::place(side_of(t.name, self.n_layer(), self.gpu_layers, tied), || self.cpu.place_matrix(t), || self.dev.place_matrix(t))
    }

    fn place_vector(&self, t: &HostTensor<'_>) -> Result<Self::Vector, BackendError> {
        SplitWeight::place(side_of(t.name, self.n_layer(), self.gpu_layers, false), || self.cpu.place_vector(t), || self.dev.place_vector(t))
    }

    fn alloc(&self, len: usize) -> Result<Self::Buf, BackendError> {
        Ok(SplitBuf { host: RefCell::new(vec![0.0; len]), dev: RefCell::new(self.dev.alloc(len)?), valid: Cell::new(Valid::Both) })
    }

    fn upload(&self, src: &[f32]) -> Result<Self::Buf, BackendError> {
        Ok(SplitBuf { host: RefCell::new(src.to_vec()), dev: RefCell::new(self.dev.upload(src)?), valid: Cell::new(Valid::Both) })
    }

    fn read(&self, src: &Self::Buf, dst: &mut [f32]) -> Result<(), BackendError> {
        match src.valid.get() {
            Valid::Device => self.dev.read(&src.dev.borrow(), dst),
            Valid::Host | Valid::Both => self.cpu.read(&src.host.borrow(), dst),
        }
    }

    fn kv_cache(&self, n_slots: usize, n_ctx: usize, k_dims: &[usize], v_dims: &[usize]) -> Result<Self::Kv, BackendError> {
        Ok(SplitKv {
            host: self.cpu.kv_cache(n_slots, n_ctx, &self.dims(k_dims, false), &self.dims(v_dims, false))?,
            dev: self.dev.kv_cache(n_slots, n_ctx, &self.dims(k_dims, true), &self.dims(v_dims, true))?,
        })
    }

    fn indices(&self, n: usize) -> Result<D::Indices, BackendError> {
        self.dev.indices(n)
    }

    fn stage(&self, dev: &mut D::Indices, lists: Staged<'_, ()>) -> Result<(), BackendError> {
        self.dev.stage(dev, lists)
    }

    fn get_rows(&self, table: &Self::Matrix, b: Staged<'_, D::Indices>, out: &mut Self::Buf) -> Result<(), BackendError> {
        match self.side(table) {
            true => self.dev.get_rows(table.dev()?, b, Self::dev_out(out)),
            false => self.cpu.get_rows(table.host()?, b.with(&()), Self::host_out(out)),
        }
    }

    fn matmul(&self, w: &Self::Matrix, x: &Self::Buf, y: &mut Self::Buf, n: usize) -> Result<(), BackendError> {
        match self.side(w) {
            true => self.dev.matmul(w.dev()?, &*self.dev_in(x)?, Self::dev_out(y), n),
            false => self.cpu.matmul(w.host()?, &*self.host_in(x)?, Self::host_out(y), n),
        }
    }

    fn add_bias(&self, y: &mut Self::Buf, b: &Self::Vector, n: usize) -> Result<(), BackendError> {
        match self.side(b) {
            true => self.dev.add_bias(self.dev_io(y)?, b.dev()?, n),
            false => self.cpu.add_bias(self.host_io(y)?, b.host()?, n),
        }
    }

    fn rms_norm(&self, x: &mut Self::Buf, w: &Self::Vector, eps: f32) -> Result<(), BackendError> {
        match self.side(w) {
            true => self.dev.rms_norm(self.dev_io(x)?, w.dev()?, eps),
            false => self.cpu.rms_norm(self.host_io(x)?, w.host()?, eps),
        }
    }

    fn rope(&self, x: &mut Self::Buf, b: Staged<'_, D::Indices>, n_heads: usize, head_dim: usize, p: &RopeParams, factors: Option<&Self::Vector>) -> Result<(), BackendError> {
        match self.here() {
            true => self.dev.rope(self.dev_io(x)?, b, n_heads, head_dim, p, factors.map(SplitWeight::dev).transpose()?),
            false => self.cpu.rope(self.host_io(x)?, b.with(&()), n_heads, head_dim, p, factors.map(SplitWeight::host).transpose()?),
        }
    }

    fn attention(&self, cache: &mut Self::Kv, layer: usize, b: Staged<'_, D::Indices>, [q, k, v]: [&Self::Buf; 3], out: &mut Self::Buf, p: &AttnParams) -> Result<(), BackendError> {
        match self.go(layer_on_device(layer, self.n_layer(), self.gpu_layers)) {
            true => self.dev.attention(&mut cache.dev, layer, b, [&*self.dev_in(q)?, &*self.dev_in(k)?, &*self.dev_in(v)?], Self::dev_out(out), p),
            false => self.cpu.attention(&mut cache.host, layer, b.with(&()), [&*self.host_in(q)?, &*self.host_in(k)?, &*self.host_in(v)?], Self::host_out(out), p),
        }
    }

    fn attention_sinks(&self, cache: &mut Self::Kv, layer: usize, b: Staged<'_, D::Indices>, [q, k, v]: [&Self::Buf; 3], out: &mut Self::Buf, p: &AttnParams, sinks: &Self::Vector) -> Result<(), BackendError> {
        match self.go(layer_on_device(layer, self.n_layer(), self.gpu_layers)) {
            true => self.dev.attention_sinks(&mut cache.dev, layer, b, [&*self.dev_in(q)?, &*self.dev_in(k)?, &*self.dev_in(v)?], Self::dev_out(out), p, sinks.dev()?),
            false => self.cpu.attention_sinks(&mut cache.host, layer, b.with(&()), [&*self.host_in(q)?, &*self.host_in(k)?, &*self.host_in(v)?], Self::host_out(out), p, sinks.host()?),
        }
    }

    fn glu(&self, act: Activation, gate: &Self::Buf, up: &Self::Buf, out: &mut Self::Buf) -> Result<(), BackendError> {
        on_current_side!(self,
            |c| c.glu(act, &*self.host_in(gate)?, &*self.host_in(up)?, Self::host_out(out)),
            |d| d.glu(act, &*self.dev_in(gate)?, &*self.dev_in(up)?, Self::dev_out(out)))
    }

    fn glu_fused(&self, act: Activation, fused: &Self::Buf, out: &mut Self::Buf, width: usize) -> Result<(), BackendError> {
        on_current_side!(self,
            |c| c.glu_fused(act, &*self.host_in(fused)?, Self::host_out(out), width),
            |d| d.glu_fused(act, &*self.dev_in(fused)?, Self::dev_out(out), width))
    }

    fn copy(&self, src: &Self::Buf, dst: &mut Self::Buf) -> Result<(), BackendError> {
        on_current_side!(self, |c| c.copy(&*self.host_in(src)?, Self::host_out(dst)), |d| d.copy(&*self.dev_in(src)?, Self::dev_out(dst)))
    }

    fn add(&self, a: &mut Self::Buf, b: &Self::Buf) -> Result<(), BackendError> {
        on_current_side!(self, |c| c.add(self.host_io(a)?, &*self.host_in(b)?), |d| d.add(self.dev_io(a)?, &*self.dev_in(b)?))
    }

    fn scale(&self, x: &mut Self::Buf, s: f32) -> Result<(), BackendError> {
        on_current_side!(self, |c| c.scale(self.host_io(x)?, s), |d| d.scale(self.dev_io(x)?, s))
    }

    fn softcap(&self, x: &mut Self::Buf, cap: f32) -> Result<(), BackendError> {
        on_current_side!(self, |c| c.softcap(self.host_io(x)?, cap), |d| d.softcap(self.dev_io(x)?, cap))
    }

    fn gather_rows(&self, src: &Self::Buf, b: Staged<'_, D::Indices>, width: usize, dst: &mut Self::Buf) -> Result<(), BackendError> {
        on_current_side!(self,
            |c| c.gather_rows(&*self.host_in(src)?, b.with(&()), width, Self::host_out(dst)),
            |d| d.gather_rows(&*self.dev_in(src)?, b, width, Self::dev_out(dst)))
    }

    fn split_cols(&self, src: &Self::Buf, src_width: usize, c0: usize, dst: &mut Self::Buf, dst_width: usize) -> Result<(), BackendError> {
        on_current_side!(self,
            |c| c.split_cols(&*self.host_in(src)?, src_width, c0, Self::host_out(dst), dst_width),
            |d| d.split_cols(&*self.dev_in(src)?, src_width, c0, Self::dev_out(dst), dst_width))
    }

    /// The whole block on its layer's side, as that side runs blocks (a
    /// device's fusions included): the residual stream crosses at most once.
    fn attention_block(&self, cache: &mut Self::Kv, b: Staged<'_, D::Indices>, w: &AttnBlock<'_, Self>, s: &mut Scratch<'_, Self::Buf>) -> Result<(), BackendError> {
        s.pending = if self.go(layer_on_device(w.layer, self.n_layer(), self.gpu_layers)) {
            let blk = attn_on::<D, D>(w, SplitWeight::dev, SplitWeight::dev)?;
            let mut ds = self.dev_scratch(s)?;
            self.dev.attention_block(&mut cache.dev, b, &blk, &mut ds)?;
            ds.pending
        } else {
            let blk = attn_on::<D, Cpu>(w, SplitWeight::host, SplitWeight::host)?;
            let mut hs = self.host_scratch(s)?;
            self.cpu.attention_block(&mut cache.host, b.with(&()), &blk, &mut hs)?;
            hs.pending
        };
        Ok(())
    }

    /// The whole block on its weights' side.
    fn moe_block(&self, n: usize, w: &MoeBlock<'_, Self>, s: &mut Scratch<'_, Self::Buf>) -> Result<(), BackendError> {
        s.pending = if self.side(w.down) {
            let blk = moe_on::<D, D>(w, SplitWeight::dev, SplitWeight::dev)?;
            let mut ds = self.dev_scratch(s)?;
            self.dev.moe_block(n, &blk, &mut ds)?;
            ds.pending
        } else {
            let blk = moe_on::<D, Cpu>(w, SplitWeight::host, SplitWeight::host)?;
            let mut hs = self.host_scratch(s)?;
            self.cpu.moe_block(n, &blk, &mut hs)?;
            hs.pending
        };
        Ok(())
    }

    /// The whole block on its weights' side.
    fn ffn_block(&self, n: usize, w: &FfnBlock<'_, Self>, s: &mut Scratch<'_, Self::Buf>) -> Result<(), BackendError> {
        s.pending = if self.side(w.down) {
            let blk = ffn_on::<D, D>(w, SplitWeight::dev, SplitWeight::dev)?;
            let mut ds = self.dev_scratch(s)?;
            self.dev.ffn_block(n, &blk, &mut ds)?;
            ds.pending
        } else {
            let blk = ffn_on::<D, Cpu>(w, SplitWeight::host, SplitWeight::host)?;
            let mut hs = self.host_scratch(s)?;
            self.cpu.ffn_block(n, &blk, &mut hs)?;
            hs.pending
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's rule: the last N blocks; the embedding where the first
    /// block is (and on both sides when the head reads it), the head where
    /// the last block is, shared vectors on both.
    #[test]
    fn the_last_gpu_layers_blocks_are_on_the_device() {
        let s = |name, gpu, tied| side_of(name, 4, gpu, tied);
        assert_eq!((s("blk.1.attn_q.weight", 2, false), s("blk.2.attn_q.weight", 2, false)), (Side::Host, Side::Device));
        assert_eq!(s("blk.3.ffn_norm.weight", 0, false), Side::Host);
        assert_eq!(s("blk.0.ffn_norm.weight", 9, false), Side::Device);
        assert_eq!((s("token_embd.weight", 2, false), s("token_embd.weight", 2, true)), (Side::Host, Side::Both));
        assert_eq!(s("token_embd.weight", 4, true), Side::Device, "all blocks on the device: the embedding too");
        assert_eq!((s("output.weight", 2, false), s("output_norm.weight", 0, false)), (Side::Device, Side::Host));
        assert_eq!(s("rope_freqs.weight", 2, false), Side::Both);
    }
}
