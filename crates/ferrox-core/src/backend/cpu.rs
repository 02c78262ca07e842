//! The CPU backend: the reference every accelerator is tested against.
//!
//! The decision: weights are never copied. A matrix stays in the mapped
//! file and is read in place by `ferrox_quant`'s dot kernels (SIMD picked at
//! run time, the scalar twin otherwise); only the small element-wise
//! vectors (norms, biases, RoPE factors) are converted to f32 at load. The
//! KV cache is f16, as llama.cpp's default, which halves its memory and
//! keeps attention numerically where llama.cpp's is. Element-wise math
//! follows ggml's CPU operation order (RMS sums in f64, GELU through ggml's
//! f16 lookup table) so logits stay within rounding of llama.cpp's.

use std::sync::{Arc, Mutex, OnceLock};

use ferrox_quant::cpu::{attn_scores, attn_values, softmax, Isa, ThreadPool};
use ferrox_quant::QuantKind;
use ferrox_quant::matvec::Products;
use half::slice::HalfFloatSliceExt;
use half::f16;

use super::{AttnParams, BackendError, DeviceBackend, HostTensor, RopeParams, Staged};
use crate::arch::{Activation, RopeStyle};
use crate::kernel_registry::Backend;

/// The CPU backend: a thread count and the instruction-set level.
#[derive(Debug, Clone)]
pub struct Cpu {
    threads: usize,
    isa: Isa,
    /// RoPE angles of the last position lists, shared by every layer of a
    /// forward pass (and by its queries and keys).
    rope_cache: Arc<Mutex<RopeCache>>,
    /// No bf16 products for large batches ([`DeviceBackend::prefer_exact_products`]).
    exact: Arc<std::sync::atomic::AtomicBool>,
    /// Every product on the per-token kernels, never the GEMM
    /// ([`DeviceBackend::prefer_row_products`]).
    rows_only: Arc<std::sync::atomic::AtomicBool>,
}

/// Below this many elements an element-wise op runs on the calling thread:
/// waking the pool costs more than the work (a decode step's vectors).
const PAR_MIN_ELEMS: usize = 16 * 1024;

/// Runs `f(first_row, rows)` over `data` cut into rows of `width` (the last
/// one may be short), in contiguous runs of rows on the pool when the work
/// (`cost` per element) reaches `PAR_MIN_ELEMS`, else once over all of it.
fn par_rows<T: Send>(threads: usize, data: &mut [T], width: usize, cost: usize, f: &(dyn Fn(usize, &mut [T]) + Sync)) {
    let rows = data.len().div_ceil(width.max(1));
    if threads <= 1 || rows < 2 || data.len() * cost < PAR_MIN_ELEMS {
        f(0, data);
        return;
    }
    let per = rows.div_ceil(rows.min(threads * 4));
    let len = data.len();
    let base = OutPtr(data.as_mut_ptr());
    ThreadPool::global().run(threads, rows.div_ceil(per), &|i| {
        #[allow(clippy::redundant_locals)]
        let base = base;
        let (lo, hi) = (i * per * width, ((i + 1) * per * width).min(len));
        // SAFETY: task `i` owns rows `i * per..(i + 1) * per`, disjoint from
        // every other task's and inside `data`, whose borrow outlives the
        // pool's join.
        f(i * per, unsafe { std::slice::from_raw_parts_mut(base.0.add(lo), hi - lo) });
    });
}

/// The RoPE (cos, sin) pairs of one position list and parameter set, as
/// `rope` computes them; a small most-recently-used list, since Gemma 3
/// alternates two frequency bases layer by layer.
#[derive(Debug, Default)]
struct RopeCache {
    entries: Vec<(RopeKey, Arc<Vec<(f32, f32)>>)>,
}

#[derive(Debug, Clone, PartialEq)]
struct RopeKey {
    positions: Vec<u32>,
    n_rot: usize,
    base: u32,
    freq_scale: u32,
    attn_factor: u32,
    factors: Option<Vec<u32>>,
}

/// RMS norm of one row in place: `v * g / sqrt(mean(v^2) + eps)`, the sum
/// of squares in f64 as ggml keeps it (eight partial sums; in f64 the order
/// does not reach the f32 result).
fn rms_norm_row(row: &mut [f32], w: &[f32], eps: f32) {
    let mut acc = [0f64; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f64::from(v * v);
        }
    }
    let tail: f64 = chunks.remainder().iter().map(|&v| f64::from(v * v)).sum();
    let sum = acc.iter().sum::<f64>() + tail;
    let mean = (sum / row.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    row.iter_mut().zip(w).for_each(|(v, &g)| *v = (*v * scale) * g);
}

/// An expert's rows of a stack's matrix.
fn expert_rows(m: &CpuWeight, expert: usize, rows: usize) -> Result<&[u8], BackendError> {
    let rb = ferrox_quant::row_bytes(m.kind, m.cols).map_err(BackendError::new)?;
    Ok(&m.bytes()[expert * rows * rb..(expert + 1) * rows * rb])
}

/// An expert's matrices (gate, up, down), its index in them and its width:
/// routed experts index the first stack, the shared expert (`expert` past
/// them) is the second stack's one.
fn expert_of<'a>(stacks: &[([&'a CpuWeight; 3], usize, usize)], expert: usize) -> ([&'a CpuWeight; 3], usize, usize) {
    match expert < stacks[0].1 {
        true => (stacks[0].0, expert, stacks[0].2),
        false => (stacks[1].0, 0, stacks[1].2),
    }
}

/// The experts' gated activation, `h = act(gate) * up` (gpt-oss: its
/// clamped SwiGLU).
fn glu_experts(w: &super::MoeBlock<'_, Cpu>, g: &[f32], u: &[f32], h: &mut [f32]) {
    match w.experts.swiglu_oai {
        Some(oai) => h.iter_mut().zip(g.iter().zip(u)).for_each(|(h, (&g, &u))| *h = oai.apply(g, u)),
        None => glu_span(w.act, g, u, h),
    }
}

impl Cpu {
    /// A CPU backend on `threads` threads (0: all cores) at the best level
    /// this CPU has (lowered by `FERROX_CPU_ISA`).
    pub fn new(threads: usize) -> Cpu {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
        } else {
            threads
        };
        Cpu { threads, isa: Isa::active(), rope_cache: Arc::default(), exact: Arc::default(), rows_only: Arc::default() }
    }

    /// The down products (`pairs.len() x n_embd`, in `pairs`' order) of
    /// routed (token, expert) pairs: every pair's gate and up rows in one
    /// [`ferrox_quant::matvec::matvec_routed`] dispatch, the GLU, then every
    /// down row in one more (one per expert width: the shared expert's may
    /// differ), biases added where the block has them.
    fn expert_pairs(&self, w: &super::MoeBlock<'_, Cpu>, stacks: &[([&CpuWeight; 3], usize, usize)], x: &[f32], pairs: &[&super::Route]) -> Result<Vec<f32>, BackendError> {
        use ferrox_quant::matvec::{matvec_routed, RoutedOut};
        let e = w.n_embd;
        let mut downs = vec![0.0f32; pairs.len() * e];
        if pairs.is_empty() {
            return Ok(downs);
        }
        let experts: Vec<_> = pairs.iter().map(|r| expert_of(stacks, r.expert)).collect();
        let total: usize = experts.iter().map(|x| x.2).sum();
        let (mut g, mut u, mut h) = (vec![0.0f32; total], vec![0.0f32; total], vec![0.0f32; total]);
        {
            let mut jobs = Vec::with_capacity(2 * pairs.len());
            let (mut gs, mut us) = (g.as_mut_slice(), u.as_mut_slice());
            for (r, &([gate, up, _], index, ff)) in pairs.iter().zip(&experts) {
                let (gy, gr) = std::mem::take(&mut gs).split_at_mut(ff);
                let (uy, ur) = std::mem::take(&mut us).split_at_mut(ff);
                (gs, us) = (gr, ur);
                jobs.push(RoutedOut { kind: gate.kind, weights: expert_rows(gate, index, ff)?, rows: ff, act: r.token, y: gy });
                jobs.push(RoutedOut { kind: up.kind, weights: expert_rows(up, index, ff)?, rows: ff, act: r.token, y: uy });
            }
            matvec_routed(self.isa, e, x, self.threads, &mut jobs).map_err(BackendError::new)?;
        }
        let mut at = 0;
        for (r, &(_, index, ff)) in pairs.iter().zip(&experts) {
            let span = at..at + ff;
            if let Some(b) = w.biases.as_ref().filter(|_| r.expert < w.experts.n_expert) {
                g[span.clone()].iter_mut().zip(&b.gate[index * ff..(index + 1) * ff]).for_each(|(y, b)| *y += b);
                u[span.clone()].iter_mut().zip(&b.up[index * ff..(index + 1) * ff]).for_each(|(y, b)| *y += b);
            }
            glu_experts(w, &g[span.clone()], &u[span.clone()], &mut h[span]);
            at += ff;
        }
        // The downs, one dispatch per expert width, each pair over its own
        // row of `h` (gathered per width).
        let starts: Vec<usize> = experts.iter().scan(0, |at, x| Some(std::mem::replace(at, *at + x.2))).collect();
        let mut widths: Vec<usize> = experts.iter().map(|x| x.2).collect();
        widths.sort_unstable();
        widths.dedup();
        for ff in widths {
            let mine: Vec<usize> = (0..pairs.len()).filter(|&p| experts[p].2 == ff).collect();
            let hs: Vec<f32> = mine.iter().flat_map(|&p| h[starts[p]..starts[p] + ff].iter().copied()).collect();
            let mut rows: Vec<Option<&mut [f32]>> = downs.chunks_exact_mut(e).map(Some).collect();
            let mut jobs = Vec::with_capacity(mine.len());
            for (i, &p) in mine.iter().enumerate() {
                let ([_, _, down], index, _) = experts[p];
                let y = rows[p].take().ok_or_else(|| BackendError("a routed pair's down row taken twice".into()))?;
                jobs.push(RoutedOut { kind: down.kind, weights: expert_rows(down, index, e)?, rows: e, act: i, y });
            }
            matvec_routed(self.isa, ff, &hs, self.threads, &mut jobs).map_err(BackendError::new)?;
        }
        if let Some(b) = &w.biases {
            for (r, dr) in pairs.iter().zip(downs.chunks_exact_mut(e)) {
                if r.expert < w.experts.n_expert {
                    dr.iter_mut().zip(&b.down[r.expert * e..(r.expert + 1) * e]).for_each(|(y, b)| *y += b);
                }
            }
        }
        Ok(downs)
    }

    /// Whether every product takes the per-token kernels
    /// ([`DeviceBackend::prefer_row_products`]).
    fn rows_only(&self) -> bool {
        self.rows_only.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Which products batches may take now.
    fn products(&self) -> Products {
        if self.rows_only() {
            Products::Rows
        } else if self.exact.load(std::sync::atomic::Ordering::Relaxed) {
            Products::Exact
        } else {
            Products::Any
        }
    }

    /// `y = x W^T` over `n` rows from a matrix's stored bytes: the GEMM for
    /// large batches, unless every product must take the per-token kernels.
    #[allow(clippy::too_many_arguments)]
    fn product(&self, kind: QuantKind, bytes: &[u8], rows: usize, cols: usize, x: &[f32], y: &mut [f32], n: usize) -> Result<(), BackendError> {
        let products = self.products();
        ferrox_quant::matvec::matmul_on(self.isa, kind, bytes, rows, cols, x, y, n, self.threads, products).map_err(BackendError::new)
    }

    /// The instruction-set level kernels are chosen for.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The (cos, sin) pairs, `n_rot / 2` per position, for `positions`
    /// under `p`: from the cache when a layer before this one asked for
    /// the same, else computed (on the pool for long lists) and kept.
    fn rope_angles(&self, positions: &[u32], p: &RopeParams, factors: Option<&[f32]>) -> Arc<Vec<(f32, f32)>> {
        let key = RopeKey {
            positions: positions.to_vec(),
            n_rot: p.n_rot,
            base: p.base.to_bits(),
            freq_scale: p.freq_scale.to_bits(),
            attn_factor: p.attn_factor.to_bits(),
            factors: factors.map(|f| f.iter().map(|v| v.to_bits()).collect()),
        };
        let mut cache = self.rope_cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = cache.entries.iter().position(|(k, _)| *k == key) {
            let hit = cache.entries.remove(i);
            let cs = Arc::clone(&hit.1);
            cache.entries.insert(0, hit);
            return cs;
        }
        let half = p.n_rot / 2;
        let theta_scale = p.base.powf(-2.0 / p.n_rot as f32);
        let mut cs = vec![(0.0f32, 0.0f32); positions.len() * half];
        // A sine and a cosine per element: worth the pool 8x sooner.
        par_rows(self.threads, &mut cs, half.max(1), 8, &|first, out| {
            for (&pos, c) in positions[first..].iter().zip(out.chunks_exact_mut(half.max(1))) {
                // ggml builds theta by repeated multiplication; doing the same
                // keeps the angles bit-identical to llama.cpp's.
                let mut theta_base = pos as f32;
                for (i, c) in c.iter_mut().enumerate() {
                    let ff = factors.map_or(1.0, |f| f[i]);
                    let theta = p.freq_scale * (theta_base / ff);
                    *c = (theta.cos() * p.attn_factor, theta.sin() * p.attn_factor);
                    theta_base *= theta_scale;
                }
            }
        });
        let cs = Arc::new(cs);
        cache.entries.insert(0, (key, Arc::clone(&cs)));
        cache.entries.truncate(4);
        cs
    }
}

/// The kernels the CPU runs for a matrix of `kind`, as the registry
/// reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuKernel {
    /// Kernel name from `ferrox_quant::cpu::simd_kernel`.
    pub name: &'static str,
    /// The four-rows-per-call decode kernel, where the level has one.
    pub four_rows: Option<&'static str>,
    /// The batched GEMM (level, name), for batches of at least
    /// `ferrox_quant::gemm::MIN_BATCH` tokens (packed at load) or
    /// `MIN_BATCH_UNPACKED` (packed per call); `None`: one dot per (row, token).
    pub gemm: Option<(Isa, &'static str)>,
    /// Activation kind (`vec_dot_kind`).
    pub act: &'static str,
    /// Set when the best level of this CPU has no kernel for the kind.
    pub fallback: Option<String>,
}

/// Whether a matrix named `name` is unpacked at load for the AMX GEMM:
/// the layers' matrices (about 1.2 bytes per weight more), not the output
/// head or embedding, whose batched use is a few rows per step. (Q8_0
/// layer matrices are read in place by AMX; `place` keeps only their scales
/// as f32, 4 bytes per 34. An interleaved head ([`interleaves`]) keeps no
/// GEMM form at all.)
/// `FERROX_CPU_PREPACK=0` turns packing off (less memory, slower batches);
/// a bad value panics with [`prepack_setting`]'s error here, which the
/// backend's open and the binary check first.
pub fn prepacks(name: &str) -> bool {
    prepack_setting().unwrap_or_else(|e| panic!("{e}")) && name.starts_with("blk.") && !experts(name)
}

/// Whether `name` is a stack of experts (`ffn_*_exps`) or a shared
/// expert's matrix (`ffn_*_shexp`, which the experts' product reads too):
/// read in place, a token's experts' rows at a time, never packed or copied
/// whole.
pub fn experts(name: &str) -> bool {
    name.contains("_exps.") || name.contains("_shexp.")
}

/// `FERROX_CPU_PREPACK` (a switch, default on), read and checked once.
pub fn prepack_setting() -> Result<bool, super::BadValue> {
    static ON: OnceLock<Result<bool, super::BadValue>> = OnceLock::new();
    ON.get_or_init(|| ferrox_quant::knob::switch("FERROX_CPU_PREPACK", true)).clone()
}

/// `FERROX_CPU_INTERLEAVE` (a switch, default on), read only in a `measure`
/// build: turning it off measures what the interleaved head gives
/// (docs/decisions/0022-cpu-interleaved-q8_0-head.md).
#[cfg(feature = "measure")]
pub fn interleave_setting() -> Result<bool, super::BadValue> {
    static ON: OnceLock<Result<bool, super::BadValue>> = OnceLock::new();
    ON.get_or_init(|| ferrox_quant::knob::switch("FERROX_CPU_INTERLEAVE", true)).clone()
}

/// Without the `measure` feature the Q8_0 head is always interleaved
/// (where [`interleaves`]' other conditions hold).
#[cfg(not(feature = "measure"))]
pub fn interleave_setting() -> Result<bool, super::BadValue> {
    Ok(true)
}

/// Whether the Q8_0 matrix `name` is interleaved 16 rows at a time at load
/// (`ferrox_quant::matvec::InterleavedQ8_0`), its mapped pages then
/// released so that only the copy stays resident: the output head and
/// embedding (the largest matrix of small models, read whole every token;
/// the layers' Q8_0 matrices stay in place, since the prefill GEMM reads
/// them there). Every product over it then reads the copy: decode with
/// VNNI (or AVX2's eight rows a register), batches (the server's steps,
/// perplexity) with AMX tiles straight from the copy, else token by token,
/// with no GEMM form kept beside it. Needs AVX2 and rows in whole sixteens. In a `measure` build `FERROX_CPU_INTERLEAVE=0`
/// turns it off ([`interleave_setting`]).
pub fn interleaves(name: &str, kind: QuantKind, rows: usize) -> bool {
    kind == QuantKind::Q8_0
        && !name.starts_with("blk.")
        && rows.is_multiple_of(16)
        && Isa::active().includes(Isa::Avx2)
        && interleave_setting().unwrap_or_else(|e| panic!("{e}"))
}

/// Whether the matrix `name` is re-laid at load eight rows a group
/// (`ferrox_quant::matvec::Interleaved8`), its mapped pages then released:
/// on AVX2 CPUs without AVX-512, the matrices of the 32-element kinds, IQ4_XS and the K kinds (Q2_K to Q6_K),
/// on AVX-512 CPUs without AMX all those but Q8_0, Q5_K and Q6_K
/// ([`ferrox_quant::matvec::Interleaved8::applies`]), that the
/// 16-row Q8_0 form ([`interleaves`]) does not take, experts aside (read a
/// token's experts' rows at a time). Every product over it then reads the
/// copy: decode by the eight-row group kernel, batches by the rows-in-lanes
/// GEMM with its panel unpacked from the groups. In a `measure` build
/// `FERROX_CPU_INTERLEAVE=0` turns it off too.
pub fn relays_rows8(name: &str, kind: QuantKind, rows: usize) -> bool {
    !interleaves(name, kind, rows)
        && !experts(name)
        && ferrox_quant::matvec::Interleaved8::applies(kind, Isa::active(), rows)
        && interleave_setting().unwrap_or_else(|e| panic!("{e}"))
}

/// A matrix's copy re-laid at load, which takes every product over it.
enum Relaid {
    /// The Q8_0 head, 16 rows a group ([`interleaves`]).
    Q8_0x16(ferrox_quant::matvec::InterleavedQ8_0),
    /// Any other kind the layout takes, eight rows a group ([`relays_rows8`]).
    Rows8(ferrox_quant::matvec::Interleaved8),
}

impl Relaid {
    fn row(&self, r: usize, out: &mut [f32]) -> Result<(), ferrox_quant::cpu::CpuError> {
        match self {
            Relaid::Q8_0x16(m) => m.row(r, out),
            Relaid::Rows8(m) => m.row(r, out),
        }
    }
}

/// What the CPU runs for a `kind` matrix on this machine, or `None` for a
/// kind without a dot product.
pub fn kernel_for(kind: QuantKind) -> Option<CpuKernel> {
    let isa = Isa::active();
    let k = ferrox_quant::cpu::select(kind, isa)?;
    let act = kind.vec_dot_kind()?.name();
    let level = isa.dot_level();
    let fallback = (k.isa != level).then(|| format!("no {level} kernel for {kind}: {} ({})", k.name, k.isa));
    let four_rows = ferrox_quant::cpu::dot4_kernel(kind, k.isa);
    let gemm = ferrox_quant::gemm::select_gemm(kind, isa);
    Some(CpuKernel { name: k.name, four_rows, gemm, act, fallback })
}

/// A matrix placed on the CPU: read in place from the mapped file, or
/// from a copy re-laid at load.
pub struct CpuWeight {
    /// Storage kind.
    kind: QuantKind,
    /// Rows.
    rows: usize,
    /// Columns.
    cols: usize,
    /// Start of its bytes inside `owner`'s mapping.
    ptr: *const u8,
    /// Byte length.
    len: usize,
    /// Keeps the mapping (and so `ptr`) alive.
    _owner: Arc<ferrox_gguf::GgufModel>,
    /// The same matrix unpacked for the AMX GEMM ([`prepacks`]); never
    /// beside `inter`.
    packed: Option<Box<ferrox_quant::gemm::PackedMatrix>>,
    /// The same matrix re-laid, for every product ([`interleaves`],
    /// [`relays_rows8`]).
    inter: Option<Box<Relaid>>,
}

// SAFETY: `ptr` points into an immutable mapping owned by the `Arc` beside
// it; nothing ever writes through it, so sharing it across threads is as
// safe as sharing `&[u8]`.
unsafe impl Send for CpuWeight {}
// SAFETY: as above.
unsafe impl Sync for CpuWeight {}

impl CpuWeight {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` was a live slice of `owner`'s mapping
        // when placed, and `owner` keeps that mapping alive and unchanged.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// The CPU KV cache: per layer, `n_slots * n_ctx` positions of f16 keys and
/// values, slot-major.
pub struct CpuKv {
    n_slots: usize,
    n_ctx: usize,
    k_dims: Vec<usize>,
    v_dims: Vec<usize>,
    k: Vec<Vec<f16>>,
    v: Vec<Vec<f16>>,
}

impl CpuKv {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        (self.k.iter().map(Vec::len).sum::<usize>() + self.v.iter().map(Vec::len).sum::<usize>()) * 2
    }
}

fn shape(what: &str, expected: usize, got: usize) -> BackendError {
    BackendError(format!("shape mismatch: {what}: expected {expected}, got {got}"))
}

fn check_len(what: &str, buf: &[f32], expected: usize) -> Result<(), BackendError> {
    if buf.len() != expected {
        return Err(shape(what, expected, buf.len()));
    }
    Ok(())
}

/// ggml's `gelu` (tanh form) as its CPU backend evaluates it: the input
/// rounded to f16 and looked up in a table of f16 results.
fn gelu_table() -> &'static [f16] {
    static TABLE: OnceLock<Vec<f16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        const COEF_A: f32 = 0.044715;
        (0..=u16::MAX)
            .map(|bits| {
                let x = f16::from_bits(bits).to_f32();
                let g = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * (1.0 + COEF_A * x * x)).tanh());
                f16::from_f32(g)
            })
            .collect()
    })
}

#[inline]
fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `out = act(gate) * up`, element by element.
fn glu_span(act: Activation, gate: &[f32], up: &[f32], out: &mut [f32]) {
    match act {
        Activation::SiluGated => out.iter_mut().zip(gate.iter().zip(up)).for_each(|(o, (&g, &u))| *o = silu(g) * u),
        Activation::GeluGated => {
            // `gelu` 64 at a time: the f16 conversions both ways in bulk
            // (F16C where the CPU has it), the table lookups in between.
            let table = gelu_table();
            let (mut h, mut r) = ([f16::ZERO; 64], [0f32; 64]);
            for ((g, u), o) in gate.chunks(64).zip(up.chunks(64)).zip(out.chunks_mut(64)) {
                let n = g.len();
                h[..n].convert_from_f32_slice(g);
                h[..n].iter_mut().for_each(|v| *v = table[usize::from(v.to_bits())]);
                h[..n].convert_to_f32_slice(&mut r[..n]);
                for i in 0..n {
                    let x = g[i];
                    let y = if x <= -10.0 {
                        0.0
                    } else if x >= 10.0 {
                        x
                    } else {
                        r[i]
                    };
                    o[i] = y * u[i];
                }
            }
        }
    }
}

/// A raw pointer to disjoint output rows written by pool tasks.
struct OutPtr<T = f32>(*mut T);
impl<T> Clone for OutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OutPtr<T> {}
// SAFETY: every task writes a disjoint range (rows of its own, or one
// (token, head) pair), and the pool joins all tasks before the borrow of
// the buffer ends.
unsafe impl<T: Send> Send for OutPtr<T> {}
// SAFETY: as above.
unsafe impl<T: Send> Sync for OutPtr<T> {}

impl Cpu {
    /// Attention as [`DeviceBackend::attention`] describes it, with a sink
    /// logit per query head in each softmax's denominator where `sinks`
    /// is given (gpt-oss).
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        batch: Staged<'_, ()>,
        [q, k, v]: [&Vec<f32>; 3],
        out: &mut Vec<f32>,
        p: &AttnParams,
        sinks: Option<&[f32]>,
    ) -> Result<(), BackendError> {
        let n = batch.len();

        if batch.seq.len() != n || batch.pos.len() != n {
            return Err(BackendError("batch columns of different lengths".into()));
        }
        let (hd, hdv) = (p.head_dim, p.head_dim_v);
        let (kd, vd) = (p.n_head_kv * hd, p.n_head_kv * hdv);
        if p.n_head_kv == 0 || p.n_head % p.n_head_kv != 0 {
            return Err(BackendError(format!("{} heads cannot share {} KV heads", p.n_head, p.n_head_kv)));
        }
        if kv.k_dims.get(layer) != Some(&kd) || kv.v_dims.get(layer) != Some(&vd) {
            return Err(BackendError(format!("layer {layer}: KV cache not shaped for {kd}/{vd}")));
        }
        check_len("attention q", q, n * p.n_head * hd)?;
        check_len("attention k", k, n * kd)?;
        check_len("attention v", v, n * vd)?;
        check_len("attention out", out, n * p.n_head * hdv)?;
        let (n_ctx, n_slots) = (kv.n_ctx, kv.n_slots);
        for t in 0..n {
            let (s, pos) = (batch.seq[t] as usize, batch.pos[t] as usize);
            if s >= n_slots || pos >= n_ctx {
                return Err(BackendError(format!(
                    "token {t}: slot {s} position {pos} outside the KV cache ({n_slots} slots x {n_ctx})"
                )));
            }
            let at = s * n_ctx + pos;
            let kc = &mut kv.k[layer][at * kd..(at + 1) * kd];
            kc.convert_from_f32_slice(&k[t * kd..(t + 1) * kd]);
            kv.v[layer][at * vd..(at + 1) * vd].convert_from_f32_slice(&v[t * vd..(t + 1) * vd]);
        }
        let (kc, vc) = (&kv.k[layer], &kv.v[layer]);
        let group = p.n_head / p.n_head_kv;
        let outp = OutPtr(out.as_mut_ptr());
        // One task per (token, KV head): each K and V row is converted and
        // read once for all the query heads that share it.
        let task = |i: usize| {
            #[allow(clippy::redundant_locals)]
            let outp = outp;
            let (t, kvh) = (i / p.n_head_kv, i % p.n_head_kv);
            let (s, pos) = (batch.seq[t] as usize, batch.pos[t] as usize);
            let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w as usize));
            let len = pos + 1 - lo;
            let h0 = kvh * group;
            let mut scores = vec![0.0f32; group * len];
            let qg = &q[(t * p.n_head + h0) * hd..][..group * hd];
            let (kbase, vbase) = (&kc[kvh * hd..], &vc[kvh * hdv..]);
            // The operands were sized above (cache rows, q, out), so the
            // kernels' own bounds checks cannot fail here.
            let ok = attn_scores(qg, kbase, kd, s * n_ctx + lo, len, hd, group, &mut scores);
            debug_assert!(ok);
            for (g, row) in scores.chunks_exact_mut(len).enumerate() {
                row.iter_mut().for_each(|sc| *sc *= p.scale);
                if let Some(cap) = p.softcap {
                    row.iter_mut().for_each(|sc| *sc = cap * (*sc * (1.0 / cap)).tanh());
                }
                match sinks {
                    Some(sinks) => softmax_with_sink(row, sinks[h0 + g]),
                    None => softmax(row),
                }
            }
            // SAFETY: heads h0..h0+group of token t are this task's alone; the
            // range is inside `out` (its length was checked to be n * n_head * hdv).
            let o = unsafe { std::slice::from_raw_parts_mut(outp.0.add((t * p.n_head + h0) * hdv), group * hdv) };
            let ok = attn_values(&scores, vbase, vd, s * n_ctx + lo, len, hdv, group, o);
            debug_assert!(ok);
        };
        ThreadPool::global().run(self.threads, n * p.n_head_kv, &task);
        Ok(())
    }
}

/// Softmax of `row` with one more logit, `sink`, in the denominator (it
/// takes part in the maximum too, as ggml's flash attention folds it in):
/// the row then sums to less than one, the rest being the sink's share.
fn softmax_with_sink(row: &mut [f32], sink: f32) {
    let m = row.iter().copied().fold(sink, f32::max);
    let mut z = (sink - m).exp();
    for v in row.iter_mut() {
        *v = (*v - m).exp();
        z += *v;
    }
    let inv = 1.0 / z;
    row.iter_mut().for_each(|v| *v *= inv);
}

impl DeviceBackend for Cpu {
    type Matrix = CpuWeight;
    type Vector = Vec<f32>;
    type Buf = Vec<f32>;
    type Kv = CpuKv;
    type Indices = ();

    fn id(&self) -> Backend {
        Backend::Cpu
    }

    fn open(opts: &super::DeviceOptions) -> Result<Cpu, BackendError> {
        if opts.device != 0 {
            return Err(BackendError(format!("the CPU backend has one device, 0 (asked for device {})", opts.device)));
        }
        super::check_env().map_err(BackendError::new)?;
        Ok(Cpu::new(opts.threads))
    }

    fn threads(&self) -> usize {
        self.threads
    }

    fn host_threads(&self) -> usize {
        self.threads
    }

    fn describe(&self) -> String {
        format!("cpu ({}, {} threads)", self.isa, self.threads)
    }

    fn prefer_exact_products(&self) {
        self.exact.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn prefer_row_products(&self) -> bool {
        self.exact.store(true, std::sync::atomic::Ordering::Relaxed);
        self.rows_only.store(true, std::sync::atomic::Ordering::Relaxed);
        true
    }

    fn place_vector(&self, t: &HostTensor<'_>) -> Result<Vec<f32>, BackendError> {
        super::vector_values(t)
    }

    fn place_matrix(&self, t: &HostTensor<'_>) -> Result<CpuWeight, BackendError> {
        let want = ferrox_quant::row_bytes(t.kind, t.cols)
            .map_err(|e| BackendError(format!("{}: {e}", t.name)))?
            .checked_mul(t.rows)
            .ok_or_else(|| BackendError(format!("{}: size overflows", t.name)))?;
        if t.bytes.len() != want {
            return Err(BackendError(format!("{}: {} bytes, expected {want}", t.name, t.bytes.len())));
        }
        ferrox_quant::matvec::add_resident_weights(t.bytes.len());
        let inter = if interleaves(t.name, t.kind, t.rows) {
            // Only the copy is read from now on, by every product: the
            // mapped pages are dropped as they are copied (peak memory near
            // one copy) and come back from the file only for a get_rows
            // that could not use it.
            ferrox_quant::matvec::InterleavedQ8_0::new_releasing(self.isa, t.bytes, t.rows, t.cols, |done| {
                t.owner.release_pages(done);
            })
            .map_err(|e| BackendError(format!("{}: {e}", t.name)))?
            .map(|m| Box::new(Relaid::Q8_0x16(m)))
        } else if relays_rows8(t.name, t.kind, t.rows) {
            // As above: the copy alone stays resident.
            ferrox_quant::matvec::Interleaved8::new_releasing(self.isa, t.kind, t.bytes, t.rows, t.cols, |done| {
                t.owner.release_pages(done);
            })
            .map_err(|e| BackendError(format!("{}: {e}", t.name)))?
            .map(|m| Box::new(Relaid::Rows8(m)))
        } else {
            None
        };
        // An interleaved matrix needs no GEMM form: its batches take the copy.
        let packed = if inter.is_none() && !experts(t.name) && (prepacks(t.name) || ferrox_quant::gemm::reads_in_place(t.kind, self.isa)) {
            ferrox_quant::gemm::PackedMatrix::new(self.isa, t.kind, t.bytes, t.rows, t.cols, self.threads)
                .map_err(|e| BackendError(format!("{}: {e}", t.name)))?
                .map(Box::new)
        } else {
            None
        };
        Ok(CpuWeight {
            kind: t.kind,
            rows: t.rows,
            cols: t.cols,
            ptr: t.bytes.as_ptr(),
            len: t.bytes.len(),
            _owner: Arc::clone(t.owner),
            packed,
            inter,
        })
    }

    fn alloc(&self, len: usize) -> Result<Vec<f32>, BackendError> {
        Ok(vec![0.0; len])
    }

    fn upload(&self, src: &[f32]) -> Result<Vec<f32>, BackendError> {
        Ok(src.to_vec())
    }

    fn read(&self, src: &Vec<f32>, dst: &mut [f32]) -> Result<(), BackendError> {
        let s = src.get(..dst.len()).ok_or_else(|| shape("read", dst.len(), src.len()))?;
        dst.copy_from_slice(s);
        Ok(())
    }

    fn kv_cache(&self, n_slots: usize, n_ctx: usize, k_dims: &[usize], v_dims: &[usize]) -> Result<CpuKv, BackendError> {
        if k_dims.len() != v_dims.len() {
            return Err(shape("kv layers", k_dims.len(), v_dims.len()));
        }
        let alloc = |d: usize| -> Result<Vec<f16>, BackendError> {
            let n = n_slots
                .checked_mul(n_ctx)
                .and_then(|x| x.checked_mul(d))
                .ok_or_else(|| BackendError("KV cache size overflows".into()))?;
            let mut v = Vec::new();
            v.try_reserve_exact(n)
                .map_err(|_| BackendError(format!("cannot allocate a KV cache of {} MiB", n * 2 >> 20)))?;
            v.resize(n, f16::ZERO);
            Ok(v)
        };
        Ok(CpuKv {
            n_slots,
            n_ctx,
            k_dims: k_dims.to_vec(),
            v_dims: v_dims.to_vec(),
            k: k_dims.iter().map(|&d| alloc(d)).collect::<Result<_, _>>()?,
            v: v_dims.iter().map(|&d| alloc(d)).collect::<Result<_, _>>()?,
        })
    }

    fn indices(&self, _n: usize) -> Result<(), BackendError> {
        Ok(())
    }

    fn stage(&self, _dev: &mut (), _lists: Staged<'_, ()>) -> Result<(), BackendError> {
        Ok(())
    }

    fn get_rows(&self, table: &CpuWeight, b: Staged<'_, ()>, out: &mut Vec<f32>) -> Result<(), BackendError> {
        let CpuWeight { kind, rows, cols, inter, .. } = table;
        let ids = b.tokens;
        check_len("get_rows output", out, ids.len() * cols)?;
        let rb = ferrox_quant::row_bytes(*kind, *cols).map_err(BackendError::new)?;
        let bytes = table.bytes();
        for (i, &id) in ids.iter().enumerate() {
            if id as usize >= *rows {
                return Err(BackendError(format!("token id {id} outside the embedding table ({rows} rows)")));
            }
            if let Some(m) = inter {
                // From the copy: the mapped pages were released at load and
                // stay out of memory (a lookup there maps whole folios).
                m.row(id as usize, &mut out[i * cols..(i + 1) * cols]).map_err(BackendError::new)?;
                continue;
            }
            let row = &bytes[id as usize * rb..(id as usize + 1) * rb];
            ferrox_quant::dequantize(*kind, row, &mut out[i * cols..(i + 1) * cols]).map_err(BackendError::new)?;
        }
        Ok(())
    }

    fn matmul(&self, w: &CpuWeight, x: &Vec<f32>, y: &mut Vec<f32>, n: usize) -> Result<(), BackendError> {
        let CpuWeight { kind, rows, cols, packed, inter, .. } = w;
        let (x, y) = (x.get(..n * cols).ok_or_else(|| shape("matmul input", n * cols, x.len()))?, y.get_mut(..n * rows).ok_or_else(|| shape("matmul output", n * rows, 0))?);
        // The interleaved copy takes every product over its matrix (its
        // mapped pages were released: reading them would fault them back).
        let bf16 = !self.exact.load(std::sync::atomic::Ordering::Relaxed);
        match inter.as_deref() {
            // Its integer batches are each token's bits already (one VNNI
            // group kernel or AMX tiles summing in the same order).
            Some(Relaid::Q8_0x16(m)) => return m.matmul(x, y, n, self.threads, bf16).map_err(BackendError::new),
            Some(Relaid::Rows8(m)) => return m.matmul(x, y, n, self.threads, self.products()).map_err(BackendError::new),
            None => {}
        }
        if let Some(p) = packed.as_ref().filter(|_| n >= ferrox_quant::gemm::MIN_BATCH && !self.rows_only()) {
            return p.matmul(w.bytes(), x, y, n, self.threads, bf16).map_err(BackendError::new);
        }
        self.product(*kind, w.bytes(), *rows, *cols, x, y, n)
    }

    /// Q, K and V (or gate and up) read in place at decode batches: one
    /// activation quantization and one pool dispatch for all of them
    /// (`ferrox_quant::matvec::matmul_many_with`); anything else, one
    /// [`DeviceBackend::matmul`] each.
    fn matmul_many(&self, x: &Vec<f32>, n: usize, outs: &mut [(&CpuWeight, &mut Vec<f32>)]) -> Result<(), BackendError> {
        let cols = outs.first().map_or(0, |(w, _)| w.cols);
        // Re-laid eight rows a group, all of them: their own one dispatch.
        if outs.len() > 1 && outs.iter().all(|(w, _)| w.cols == cols && matches!(w.inter.as_deref(), Some(Relaid::Rows8(_)))) {
            let x = x.get(..n * cols).ok_or_else(|| shape("matmul input", n * cols, x.len()))?;
            let mut mats = Vec::with_capacity(outs.len());
            for (w, y) in outs.iter_mut() {
                let (Some(Relaid::Rows8(m)), rows) = (w.inter.as_deref(), w.rows) else {
                    return Err(BackendError("matmul_many: a matrix lost its eight-row copy".into()));
                };
                let len = y.len();
                mats.push((m, y.get_mut(..n * rows).ok_or_else(|| shape("matmul output", n * rows, len))?));
            }
            return ferrox_quant::matvec::Interleaved8::matmul_many(x, n, self.threads, self.products(), &mut mats).map_err(BackendError::new);
        }
        let together = n < ferrox_quant::gemm::MIN_BATCH
            && outs.len() > 1
            && outs.iter().all(|(w, _)| w.cols == cols && w.inter.is_none());
        if !together {
            for (w, y) in outs.iter_mut() {
                self.matmul(w, x, y, n)?;
            }
            return Ok(());
        }
        let x = x.get(..n * cols).ok_or_else(|| shape("matmul input", n * cols, x.len()))?;
        let mut mats = Vec::with_capacity(outs.len());
        for (w, y) in outs.iter_mut() {
            let CpuWeight { kind, rows, .. } = w;
            let len = y.len();
            let y = y.get_mut(..n * rows).ok_or_else(|| shape("matmul output", n * rows, len))?;
            mats.push(ferrox_quant::matvec::ManyOut { kind: *kind, weights: w.bytes(), rows: *rows, y });
        }
        ferrox_quant::matvec::matmul_many_with(self.isa, cols, x, n, self.threads, &mut mats).map_err(BackendError::new)
    }

    fn add_bias(&self, y: &mut Vec<f32>, b: &Vec<f32>, n: usize) -> Result<(), BackendError> {
        check_len("bias input", y, n * b.len())?;
        for row in y.chunks_exact_mut(b.len().max(1)) {
            row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
        }
        Ok(())
    }

    fn rms_norm(&self, x: &mut Vec<f32>, w: &Vec<f32>, eps: f32) -> Result<(), BackendError> {
        if w.is_empty() || x.len() % w.len() != 0 {
            return Err(shape("rms_norm width", w.len(), x.len()));
        }
        par_rows(self.threads, x, w.len(), 1, &|_, rows| rows.chunks_exact_mut(w.len()).for_each(|row| rms_norm_row(row, w, eps)));
        Ok(())
    }

    fn add_rms_norm(&self, x: &mut Vec<f32>, add: Option<&Vec<f32>>, w: &Vec<f32>, eps: f32, out: &mut Vec<f32>) -> Result<(), BackendError> {
        let width = w.len();
        if width == 0 || x.len() % width != 0 {
            return Err(shape("rms_norm width", width, x.len()));
        }
        if let Some(a) = add {
            check_len("add", a, x.len())?;
        }
        check_len("rms_norm output", out, x.len())?;
        // Split `out`; the same rows of `x` go with them.
        let xp = OutPtr(x.as_mut_ptr());
        par_rows(self.threads, out, width, 1, &|first, os| {
            #[allow(clippy::redundant_locals)]
            let xp = xp;
            let at = first * width;
            // SAFETY: `x` has `out`'s length (checked), and these rows of it
            // go with this task's rows of `out`: its alone.
            let xs = unsafe { std::slice::from_raw_parts_mut(xp.0.add(at), os.len()) };
            let len = os.len();
            if let Some(a) = add {
                xs.iter_mut().zip(&a[at..at + len]).for_each(|(x, a)| *x += a);
            }
            os.copy_from_slice(xs);
            os.chunks_exact_mut(width).for_each(|row| rms_norm_row(row, w, eps));
        });
        Ok(())
    }

    fn rope(
        &self,
        x: &mut Vec<f32>,
        b: Staged<'_, ()>,
        n_heads: usize,
        head_dim: usize,
        p: &RopeParams,
        factors: Option<&Vec<f32>>,
    ) -> Result<(), BackendError> {
        let positions = b.pos;
        check_len("rope input", x, positions.len() * n_heads * head_dim)?;
        if p.n_rot > head_dim || p.n_rot % 2 != 0 {
            return Err(BackendError(format!("n_rot {} does not fit head size {head_dim}", p.n_rot)));
        }
        let factors = factors.map(Vec::as_slice);
        if let Some(f) = factors {
            if f.len() < p.n_rot / 2 {
                return Err(shape("rope factors", p.n_rot / 2, f.len()));
            }
        }
        let cs = self.rope_angles(positions, p, factors);
        let half = p.n_rot / 2;
        let row = n_heads * head_dim;
        par_rows(self.threads, x, row.max(1), 1, &|first, rows| {
            for (t, xr) in (first..).zip(rows.chunks_exact_mut(row.max(1))) {
                let cs = &cs[t * half..(t + 1) * half];
                for h in xr.chunks_exact_mut(head_dim) {
                    for (i, &(cos, sin)) in cs.iter().enumerate() {
                        let (a, b) = match p.style {
                            RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                            RopeStyle::Halves => (i, i + half),
                        };
                        let (x0, x1) = (h[a], h[b]);
                        h[a] = x0 * cos - x1 * sin;
                        h[b] = x0 * sin + x1 * cos;
                    }
                }
            }
        });
        Ok(())
    }

    fn attention(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        batch: Staged<'_, ()>,
        qkv: [&Vec<f32>; 3],
        out: &mut Vec<f32>,
        p: &AttnParams,
    ) -> Result<(), BackendError> {
        self.attend(kv, layer, batch, qkv, out, p, None)
    }

    fn attention_sinks(
        &self,
        kv: &mut CpuKv,
        layer: usize,
        batch: Staged<'_, ()>,
        qkv: [&Vec<f32>; 3],
        out: &mut Vec<f32>,
        p: &AttnParams,
        sinks: &Vec<f32>,
    ) -> Result<(), BackendError> {
        check_len("attention sinks", sinks, p.n_head)?;
        self.attend(kv, layer, batch, qkv, out, p, Some(sinks))
    }

    fn glu(&self, act: Activation, gate: &Vec<f32>, up: &Vec<f32>, out: &mut Vec<f32>) -> Result<(), BackendError> {
        check_len("glu up", up, gate.len())?;
        check_len("glu out", out, gate.len())?;
        // One "row" per 1024 elements: the op has no row structure of its own.
        const W: usize = 1024;
        par_rows(self.threads, out, W, 1, &|first, o| {
            let lo = first * W;
            glu_span(act, &gate[lo..lo + o.len()], &up[lo..lo + o.len()], o);
        });
        Ok(())
    }

    fn glu_fused(&self, act: Activation, fused: &Vec<f32>, out: &mut Vec<f32>, width: usize) -> Result<(), BackendError> {
        if width == 0 || fused.len() % (2 * width) != 0 {
            return Err(shape("fused glu width", 2 * width, fused.len()));
        }
        let n = fused.len() / (2 * width);
        check_len("fused glu out", out, n * width)?;
        par_rows(self.threads, out, width, 1, &|first, o| {
            for (row, o) in fused[first * 2 * width..].chunks_exact(2 * width).zip(o.chunks_exact_mut(width)) {
                let (g, u) = row.split_at(width);
                glu_span(act, g, u, o);
            }
        });
        Ok(())
    }

    fn copy(&self, src: &Vec<f32>, dst: &mut Vec<f32>) -> Result<(), BackendError> {
        check_len("copy", src, dst.len())?;
        dst.copy_from_slice(src);
        Ok(())
    }

    fn add(&self, a: &mut Vec<f32>, b: &Vec<f32>) -> Result<(), BackendError> {
        check_len("add", b, a.len())?;
        a.iter_mut().zip(b).for_each(|(a, b)| *a += b);
        Ok(())
    }

    fn scale(&self, x: &mut Vec<f32>, s: f32) -> Result<(), BackendError> {
        x.iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn softcap(&self, x: &mut Vec<f32>, cap: f32) -> Result<(), BackendError> {
        let inv = 1.0 / cap;
        x.iter_mut().for_each(|v| *v = (*v * inv).tanh() * cap);
        Ok(())
    }

    fn gather_rows(&self, src: &Vec<f32>, b: Staged<'_, ()>, width: usize, dst: &mut Vec<f32>) -> Result<(), BackendError> {
        check_len("gather output", dst, b.rows.len() * width)?;
        for (i, &r) in b.rows.iter().enumerate() {
            let r = r as usize;
            let s = src.get(r * width..(r + 1) * width).ok_or_else(|| shape("gather row", r, src.len() / width.max(1)))?;
            dst[i * width..(i + 1) * width].copy_from_slice(s);
        }
        Ok(())
    }

    /// The experts a few tokens share (fewer than a GEMM batch each: every
    /// expert of a decode step) take all their (token, expert) pairs in two
    /// pool dispatches — every gate and up row, then every down row — with
    /// each token quantized once; the rest expert by expert: the tokens
    /// routed to it gathered, its gate and up rows multiplied in place from
    /// the mapping (the GEMM when enough tokens share it), the GLU, its down
    /// rows. Products are added into each token's output with their weights
    /// in expert order either way.
    fn moe_experts(&self, w: &super::MoeBlock<'_, Self>, x: &Vec<f32>, routes: &[super::Route], out: &mut Vec<f32>) -> Result<(), BackendError> {
        let (e, ne) = (w.n_embd, w.experts.n_expert);
        let n = out.len() / e.max(1);
        check_len("experts input", x, n * e)?;
        check_len("experts output", out, n * e)?;
        // Each expert's matrices, its index in them and its width; the
        // shared expert (where the block has one) is expert `ne`, a stack of one.
        let mut stacks = vec![([w.gate, w.up, w.down], ne, w.experts.n_ff)];
        if let Some(sh) = &w.shared {
            stacks.push(([sh.gate, sh.up, sh.down], 1, sh.n_ff));
        }
        for &([g, u, d], count, ff) in &stacks {
            for (m, rows, cols) in [(g, ff, e), (u, ff, e), (d, e, ff)] {
                if m.rows != rows * count || m.cols != cols {
                    return Err(BackendError(format!("an expert stack of {}x{} where {count} experts of {rows}x{cols} are expected", m.rows, m.cols)));
                }
            }
        }
        let n_experts = ne + usize::from(w.shared.is_some());
        if let Some(r) = routes.iter().find(|r| r.expert >= n_experts) {
            return Err(BackendError(format!("a route to expert {} of {ne}", r.expert)));
        }
        if let Some(r) = routes.iter().find(|r| r.token >= n) {
            return Err(BackendError(format!("a route for token {} of {n}", r.token)));
        }
        let ff = w.experts.n_ff;
        if let Some(b) = &w.biases {
            for (what, v, len) in [("gate", b.gate, ne * ff), ("up", b.up, ne * ff), ("down", b.down, ne * e)] {
                check_len(&format!("experts' {what} bias"), v, len)?;
            }
        }
        out.iter_mut().for_each(|v| *v = 0.0);
        let mut tokens = vec![0usize; n_experts];
        routes.iter().for_each(|r| tokens[r.expert] += 1);
        let few = |expert: usize| tokens[expert] < ferrox_quant::gemm::MIN_BATCH;
        // The pairs of the experts few tokens share, in expert order, and
        // their down products (one row each).
        let mut pairs: Vec<&super::Route> = routes.iter().filter(|r| few(r.expert)).collect();
        pairs.sort_by_key(|r| r.expert);
        let downs = self.expert_pairs(w, &stacks, x, &pairs)?;
        let mut done = 0;
        let (mut xs, mut g, mut u, mut h, mut d) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for expert in 0..n_experts {
            if few(expert) {
                let k = tokens[expert];
                for (r, dr) in pairs[done..done + k].iter().zip(downs[done * e..].chunks_exact(e)) {
                    out[r.token * e..(r.token + 1) * e].iter_mut().zip(dr).for_each(|(o, &v)| *o += r.weight * v);
                }
                done += k;
                continue;
            }
            let ([gate, up, down], index, ff) = expert_of(&stacks, expert);
            let mine: Vec<&super::Route> = routes.iter().filter(|r| r.expert == expert).collect();
            let k = mine.len();
            xs.clear();
            mine.iter().for_each(|r| xs.extend_from_slice(&x[r.token * e..(r.token + 1) * e]));
            for v in [&mut g, &mut u, &mut h] {
                v.resize(k * ff, 0.0);
            }
            d.resize(k * e, 0.0);
            let mm = |m: &CpuWeight, rows: usize, cols: usize, x: &[f32], y: &mut [f32]| {
                self.product(m.kind, expert_rows(m, index, rows)?, rows, cols, x, y, k)
            };
            mm(gate, ff, e, &xs, &mut g)?;
            mm(up, ff, e, &xs, &mut u)?;
            // A routed expert's biases (gpt-oss): its rows of each stack.
            let bias = w.biases.as_ref().filter(|_| expert < ne);
            if let Some(b) = bias {
                for (y, b) in [(&mut g, &b.gate[index * ff..(index + 1) * ff]), (&mut u, &b.up[index * ff..(index + 1) * ff])] {
                    y.chunks_exact_mut(ff).for_each(|row| row.iter_mut().zip(b).for_each(|(y, b)| *y += b));
                }
            }
            glu_experts(w, &g, &u, &mut h);
            mm(down, e, ff, &h, &mut d)?;
            if let Some(b) = bias {
                let b = &b.down[index * e..(index + 1) * e];
                d.chunks_exact_mut(e).for_each(|row| row.iter_mut().zip(b).for_each(|(y, b)| *y += b));
            }
            for (r, dr) in mine.iter().zip(d.chunks_exact(e)) {
                out[r.token * e..(r.token + 1) * e].iter_mut().zip(dr).for_each(|(o, &v)| *o += r.weight * v);
            }
        }
        Ok(())
    }

    fn split_cols(&self, src: &Vec<f32>, src_width: usize, c0: usize, dst: &mut Vec<f32>, dst_width: usize) -> Result<(), BackendError> {
        if c0 + dst_width > src_width || src_width == 0 || src.len() % src_width != 0 {
            return Err(shape("split columns", src_width, c0 + dst_width));
        }
        let n = src.len() / src_width;
        check_len("split output", dst, n * dst_width)?;
        for (s, d) in src.chunks_exact(src_width).zip(dst.chunks_exact_mut(dst_width)) {
            d.copy_from_slice(&s[c0..c0 + dst_width]);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Batch;

    /// A sink joins the softmax's denominator only: scores [0, ln 2] with a
    /// sink of 0 are e^0, 2 and the sink's e^0 over 4 — [1/4, 1/2] (a
    /// quarter to the sink). A sink above every score also sets the
    /// maximum: scores [0, 0] with a sink of ln 2 give [1/4, 1/4].
    #[test]
    fn a_sink_takes_its_share_of_the_softmax() {
        let mut row = [0.0f32, 2f32.ln()];
        softmax_with_sink(&mut row, 0.0);
        assert!((row[0] - 0.25).abs() < 1e-6 && (row[1] - 0.5).abs() < 1e-6, "{row:?}");
        let mut row = [0.0f32, 0.0];
        softmax_with_sink(&mut row, 2f32.ln());
        assert!((row[0] - 0.25).abs() < 1e-6 && (row[1] - 0.25).abs() < 1e-6, "{row:?}");
        // A very large sink leaves the scores almost nothing, never NaN.
        let mut row = [1.0f32, -1.0];
        softmax_with_sink(&mut row, 200.0);
        assert!(row.iter().all(|v| v.is_finite() && *v < 1e-40), "{row:?}");
    }

    /// A batch of one slot at `pos`.
    fn at(pos: &[u32]) -> Batch {
        let mut b = Batch::default();
        pos.iter().for_each(|&p| b.push(0, p, 0, false));
        b
    }

    #[test]
    fn gelu_follows_ggml_tanh_form_through_f16() {
        // Hand values of 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))),
        // then the clamps, through the bulk path (70 values: a whole chunk of
        // 64 and a tail), against `up` = 2.
        let pairs = [(1.0f32, 0.841_192), (-1.0, -0.158_808), (0.5, 0.345_714), (3.0, 2.996_363), (-11.0, 0.0), (12.5, 12.5)];
        let gate: Vec<f32> = (0..70).map(|i| pairs[i % pairs.len()].0).collect();
        let up = vec![2.0f32; 70];
        let mut out = vec![0.0f32; 70];
        glu_span(Activation::GeluGated, &gate, &up, &mut out);
        for (i, &o) in out.iter().enumerate() {
            let (x, want) = pairs[i % pairs.len()];
            let g = o / 2.0;
            assert!((g - want).abs() < 2e-3 * want.abs().max(1.0), "gelu({x}) = {g}, want {want} (element {i})");
        }
    }

    #[test]
    fn rope_rotates_pairs_by_position_times_frequency() {
        let cpu = Cpu::new(1);
        // One head of 4 dims, position 2, base 100: frequencies 1 and 1/10.
        for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
            let p = RopeParams { style, n_rot: 4, base: 100.0, freq_scale: 1.0, attn_factor: 1.0 };
            let mut x = vec![1.0, 2.0, 3.0, 4.0];
            cpu.rope(&mut x, Staged::of(&at(&[2]), &[], &()), 1, 4, &p, None).unwrap();
            let pairs = match style {
                RopeStyle::Interleaved => [(0, 1, 2.0f32), (2, 3, 0.2)],
                RopeStyle::Halves => [(0, 2, 2.0), (1, 3, 0.2)],
            };
            let x0 = [1.0f32, 2.0, 3.0, 4.0];
            for (a, b, th) in pairs {
                let want_a = x0[a] * th.cos() - x0[b] * th.sin();
                let want_b = x0[a] * th.sin() + x0[b] * th.cos();
                assert!((x[a] - want_a).abs() < 1e-5 && (x[b] - want_b).abs() < 1e-5, "{style:?} {x:?}");
            }
        }
    }

    #[test]
    fn element_wise_ops_on_the_pool_match_one_thread_bit_for_bit() {
        // 67 rows of 640: over the parallel threshold, an odd split.
        let (rows, width) = (67usize, 640usize);
        let data = |seed: u32| -> Vec<f32> {
            (0..rows * width).map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0).collect()
        };
        let norm = data(7)[..width].to_vec();
        let (one, two) = (Cpu::new(1), Cpu::new(2));
        let run = |cpu: &Cpu| {
            let mut x = data(1);
            cpu.rms_norm(&mut x, &norm, 1e-6).unwrap();
            let (mut r, mut o) = (data(2), vec![0.0; rows * width]);
            cpu.add_rms_norm(&mut r, Some(&data(3)), &norm, 1e-6, &mut o).unwrap();
            let mut g = vec![0.0; rows * width];
            cpu.glu(Activation::GeluGated, &data(4), &data(5), &mut g).unwrap();
            let mut f = vec![0.0; rows * width / 2];
            cpu.glu_fused(Activation::SiluGated, &data(6), &mut f, width / 2).unwrap();
            // RoPE twice, the same positions under two bases (Gemma 3's
            // local and global layers): both sets of angles end up cached.
            let mut q = data(8);
            let pos: Vec<u32> = (0..rows as u32).map(|i| i * 3 + 1).collect();
            let p1 = RopeParams { style: RopeStyle::Halves, n_rot: 64, base: 10_000.0, freq_scale: 1.0, attn_factor: 1.0 };
            cpu.rope(&mut q, Staged::of(&at(&pos), &[], &()), width / 64, 64, &p1, None).unwrap();
            let p2 = RopeParams { base: 1_000_000.0, ..p1 };
            cpu.rope(&mut q, Staged::of(&at(&pos), &[], &()), width / 64, 64, &p2, None).unwrap();
            [x, r, o, g, f, q]
        };
        let (a, b) = (run(&one), run(&two));
        for (i, (a, b)) in a.iter().zip(&b).enumerate() {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "op {i}: 2 threads differ from 1");
        }
        // And the second base's angles, cached beside the first's for the
        // same positions, equal freshly computed ones (a new backend).
        let mut q = data(8);
        let pos: Vec<u32> = (0..rows as u32).map(|i| i * 3 + 1).collect();
        let p2 = RopeParams { style: RopeStyle::Halves, n_rot: 64, base: 1_000_000.0, freq_scale: 1.0, attn_factor: 1.0 };
        let fresh = Cpu::new(2);
        let mut q1 = q.clone();
        fresh.rope(&mut q1, Staged::of(&at(&pos), &[], &()), width / 64, 64, &p2, None).unwrap();
        two.rope(&mut q, Staged::of(&at(&pos), &[], &()), width / 64, 64, &p2, None).unwrap();
        assert_eq!(q, q1);
    }

    #[test]
    fn attention_is_causal_windowed_and_grouped() {
        let cpu = Cpu::new(2);
        // 2 query heads sharing 1 KV head of dim 2; three tokens of one sequence.
        let mut kv = cpu.kv_cache(1, 8, &[2], &[2]).unwrap();
        let mut b = Batch::default();
        for i in 0..3 {
            b.push(0, i, 0, true);
        }
        let q = vec![1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0];
        let k = vec![1.0, 0.0, 0.0, 1.0, 1.0, 1.0];
        let v = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let p = AttnParams { n_head: 2, n_head_kv: 1, head_dim: 2, head_dim_v: 2, scale: 1.0, softcap: None, window: None };
        let mut out = vec![0.0; 12];
        cpu.attention(&mut kv, 0, Staged::of(&b, &[], &()), [&q, &k, &v], &mut out, &p).unwrap();
        // Token 0 sees only itself.
        assert_eq!(&out[0..4], &[1.0, 2.0, 1.0, 2.0]);
        // Token 1, head 0 (q = [1,0]): scores [1, 0] -> weights e/(e+1), 1/(e+1).
        let e = std::f32::consts::E;
        let w0 = e / (e + 1.0);
        let want = [w0 * 1.0 + (1.0 - w0) * 3.0, w0 * 2.0 + (1.0 - w0) * 4.0];
        assert!((out[4] - want[0]).abs() < 1e-3 && (out[5] - want[1]).abs() < 1e-3, "{:?}", &out[4..6]);
        // A window of 1: every token sees only itself.
        let p1 = AttnParams { window: Some(1), ..p };
        let mut kv = cpu.kv_cache(1, 8, &[2], &[2]).unwrap();
        cpu.attention(&mut kv, 0, Staged::of(&b, &[], &()), [&q, &k, &v], &mut out, &p1).unwrap();
        assert_eq!(&out[8..12], &[5.0, 6.0, 5.0, 6.0]);
        // Positions outside the cache are an error, not a panic.
        let mut far = Batch::default();
        far.push(0, 8, 0, true);
        assert!(cpu.attention(&mut kv, 0, Staged::of(&far, &[], &()), [&q[..4].to_vec(), &k[..2].to_vec(), &v[..2].to_vec()], &mut out[..4].to_vec(), &p).is_err());
    }
}
