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
use super::{AttnParams, BackendError, Batch, DeviceBackend, DeviceOptions, HostTensor, RopeParams};
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

/// A weight of a split model, on its side (or both).
pub enum SplitWeight<W> {
    /// On the CPU.
    Host(CpuWeight),
    /// On the device.
    Device(W),
    /// On both.
    Both(CpuWeight, W),
}

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
    fn side(&self, w: &SplitWeight<D::Weight>) -> bool {
        self.go(match w {
            SplitWeight::Host(_) => false,
            SplitWeight::Device(_) => true,
            SplitWeight::Both(..) => self.here(),
        })
    }

    fn host_w<'a>(&self, w: &'a SplitWeight<D::Weight>) -> Result<&'a CpuWeight, BackendError> {
        match w {
            SplitWeight::Host(c) | SplitWeight::Both(c, _) => Ok(c),
            SplitWeight::Device(_) => Err(BackendError("a device weight read on the CPU side of a split".into())),
        }
    }

    fn dev_w<'a>(&self, w: &'a SplitWeight<D::Weight>) -> Result<&'a D::Weight, BackendError> {
        match w {
            SplitWeight::Device(d) | SplitWeight::Both(_, d) => Ok(d),
            SplitWeight::Host(_) => Err(BackendError("a CPU weight read on the device side of a split".into())),
        }
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

impl<D: DeviceBackend> DeviceBackend for Split<D> {
    type Weight = SplitWeight<D::Weight>;
    type Buf = SplitBuf<D::Buf>;
    type Kv = SplitKv<D::Kv>;

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

    fn prefer_exact_products(&self) {
        self.cpu.prefer_exact_products();
        self.dev.prefer_exact_products();
    }

    fn place(&self, t: &HostTensor<'_>) -> Result<Self::Weight, BackendError> {
        let tied = t.owner.tensor("output.weight").is_none();
        Ok(match side_of(t.name, self.n_layer(), self.gpu_layers, tied) {
            Side::Host => SplitWeight::Host(self.cpu.place(t)?),
            Side::Device => SplitWeight::Device(self.dev.place(t)?),
            Side::Both => SplitWeight::Both(self.cpu.place(t)?, self.dev.place(t)?),
        })
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

    fn get_rows(&self, table: &Self::Weight, ids: &[u32], out: &mut Self::Buf) -> Result<(), BackendError> {
        match self.side(table) {
            true => self.dev.get_rows(self.dev_w(table)?, ids, Self::dev_out(out)),
            false => self.cpu.get_rows(self.host_w(table)?, ids, Self::host_out(out)),
        }
    }

    fn matmul(&self, w: &Self::Weight, x: &Self::Buf, y: &mut Self::Buf, n: usize) -> Result<(), BackendError> {
        match self.side(w) {
            true => self.dev.matmul(self.dev_w(w)?, &*self.dev_in(x)?, Self::dev_out(y), n),
            false => self.cpu.matmul(self.host_w(w)?, &*self.host_in(x)?, Self::host_out(y), n),
        }
    }

    fn add_bias(&self, y: &mut Self::Buf, b: &Self::Weight, n: usize) -> Result<(), BackendError> {
        match self.side(b) {
            true => self.dev.add_bias(self.dev_io(y)?, self.dev_w(b)?, n),
            false => self.cpu.add_bias(self.host_io(y)?, self.host_w(b)?, n),
        }
    }

    fn rms_norm(&self, x: &mut Self::Buf, w: &Self::Weight, eps: f32) -> Result<(), BackendError> {
        match self.side(w) {
            true => self.dev.rms_norm(self.dev_io(x)?, self.dev_w(w)?, eps),
            false => self.cpu.rms_norm(self.host_io(x)?, self.host_w(w)?, eps),
        }
    }

    fn rope(
        &self,
        x: &mut Self::Buf,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        p: &RopeParams,
        factors: Option<&Self::Weight>,
    ) -> Result<(), BackendError> {
        match self.here() {
            true => {
                let f = factors.map(|f| self.dev_w(f)).transpose()?;
                self.dev.rope(self.dev_io(x)?, positions, n_heads, head_dim, p, f)
            }
            false => {
                let f = factors.map(|f| self.host_w(f)).transpose()?;
                self.cpu.rope(self.host_io(x)?, positions, n_heads, head_dim, p, f)
            }
        }
    }

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
    ) -> Result<(), BackendError> {
        match self.go(layer_on_device(layer, self.n_layer(), self.gpu_layers)) {
            true => self.dev.attention(&mut kv.dev, layer, batch, &*self.dev_in(q)?, &*self.dev_in(k)?, &*self.dev_in(v)?, Self::dev_out(out), p),
            false => self.cpu.attention(&mut kv.host, layer, batch, &*self.host_in(q)?, &*self.host_in(k)?, &*self.host_in(v)?, Self::host_out(out), p),
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

    fn gather_rows(&self, src: &Self::Buf, rows: &[usize], width: usize, dst: &mut Self::Buf) -> Result<(), BackendError> {
        on_current_side!(self,
            |c| c.gather_rows(&*self.host_in(src)?, rows, width, Self::host_out(dst)),
            |d| d.gather_rows(&*self.dev_in(src)?, rows, width, Self::dev_out(dst)))
    }

    fn split_cols(&self, src: &Self::Buf, src_width: usize, c0: usize, dst: &mut Self::Buf, dst_width: usize) -> Result<(), BackendError> {
        on_current_side!(self,
            |c| c.split_cols(&*self.host_in(src)?, src_width, c0, Self::host_out(dst), dst_width),
            |d| d.split_cols(&*self.dev_in(src)?, src_width, c0, Self::dev_out(dst), dst_width))
    }

    fn stage_indices(&self, lists: &[&[u32]]) -> Result<(), BackendError> {
        self.dev.stage_indices(lists)
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
