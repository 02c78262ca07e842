//! Multi-threaded quantized matrix-vector products on the CPU.
//!
//! The key decision: the activation is quantized **once** per call (to the
//! weight kind's `vec_dot_type`, as ggml does), then rows are split into
//! chunks claimed dynamically by the persistent [`ThreadPool`]; every check
//! (lengths, alignment, kind) happens once up front so the per-row loop is a
//! bare call of the selected [`cpu::DotFn`].

use crate::cpu::{self, CpuError, Isa, ThreadPool};
use crate::{QuantError, QuantKind};

/// Rows per claimed task at most: large enough to amortize the claim, small
/// enough that a preempted thread (the machine is shared) leaves work to steal.
const ROWS_PER_TASK: usize = 256;

/// Rows per task for a matrix of `rows` on `threads`: at least four tasks per
/// thread, so a small matrix (Gemma's 256-row K and V) is not one thread's
/// alone; a multiple of four (the four-row kernels).
fn rows_per_task(rows: usize, threads: usize) -> usize {
    (rows / (4 * threads.max(1))).next_multiple_of(4).clamp(16, ROWS_PER_TASK)
}

/// An activation row quantized for one weight kind, in an 8-byte-aligned
/// buffer (every block struct needs at most 4).
struct ActBuf {
    words: Vec<u64>,
    len: usize,
}

impl ActBuf {
    fn new(len: usize) -> ActBuf {
        ActBuf { words: vec![0; len.div_ceil(8)], len }
    }
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..self.len]
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..self.len]
    }
}

struct Prepared {
    kernel: cpu::Kernel,
    act: QuantKind,
    row_bytes: usize,
    act_bytes: usize,
}

fn prepare(
    kind: QuantKind,
    isa: Isa,
    weights: &[u8],
    rows: usize,
    cols: usize,
) -> Result<Prepared, CpuError> {
    if !isa.is_available() {
        return Err(CpuError::IsaUnavailable { isa });
    }
    let act = kind.vec_dot_kind().ok_or(QuantError::NoDot { kind })?;
    let row_bytes = crate::row_bytes(kind, cols)?;
    let act_bytes = crate::row_bytes(act, cols)?;
    let expected = rows.checked_mul(row_bytes).ok_or(CpuError::Shape {
        what: "weight bytes (overflow)",
        expected: usize::MAX,
        got: weights.len(),
    })?;
    if weights.len() != expected {
        return Err(CpuError::Shape { what: "weight bytes", expected, got: weights.len() });
    }
    // Row starts stay aligned because a row is whole blocks.
    cpu::check_aligned(kind, weights)?;
    let kernel = cpu::select(kind, isa).ok_or(QuantError::NoDot { kind })?;
    Ok(Prepared { kernel, act, row_bytes, act_bytes })
}

/// `y = W x` for a row-major `rows x cols` weight matrix of `kind`, on
/// `threads` threads, with the best kernels of [`Isa::active`].
pub fn matvec(
    kind: QuantKind,
    weights: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
    threads: usize,
) -> Result<(), CpuError> {
    matmul_with(Isa::active(), kind, weights, rows, cols, x, y, 1, threads)
}

/// `Y = X W^T` for `n` activation rows (`x` is `n x cols`, `y` is
/// `n x rows`, both row-major): each weight row is read once for all `n`
/// activations, which is what makes small batches nearly free.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    kind: QuantKind,
    weights: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
    n: usize,
    threads: usize,
) -> Result<(), CpuError> {
    matmul_with(Isa::active(), kind, weights, rows, cols, x, y, n, threads)
}

/// Bytes above which a matrix is taken not to stay in cache between calls
/// (this machine's caches help up to ~64 MiB).
const CACHE_BYTES: usize = 64 << 20;

static STREAMING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static RESIDENT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Counts `bytes` of weights a backend keeps for matvecs. Once they outgrow
/// the cache, weights stream from DRAM on every call (each matvec's matrix
/// was evicted by the rest of the forward pass), so the one-row path
/// prefetches whatever the matrix size. Before that, only matrices larger
/// than the cache are prefetched: on a cache-resident matrix the prefetch
/// costs ~20%.
pub fn add_resident_weights(bytes: usize) {
    use std::sync::atomic::Ordering::Relaxed;
    if RESIDENT.fetch_add(bytes, Relaxed).saturating_add(bytes) > CACHE_BYTES {
        STREAMING.store(true, Relaxed);
    }
}

/// Hints the cache lines of `len` bytes at `at` into L2 (nothing past the
/// end of `weights`; a prefetch never faults, but stays inside anyway).
/// Measured on the 262144x768 Q4_K head shape, 2 threads: none 8.1 GB/s,
/// into L1 8 rows ahead 15.8, into L2 8 rows ahead 18.3, 16 rows 17.3. On a
/// matrix that stays in cache (4096x4096) it costs ~20% (35 -> 29 GB/s), a
/// case decode of a model larger than the cache never meets.
#[inline]
fn prefetch_row(weights: &[u8], at: usize, len: usize) {
    #[cfg(target_arch = "x86_64")]
    if at + len <= weights.len() {
        let base = weights[at..].as_ptr();
        for off in (0..len).step_by(64) {
            // SAFETY: a prefetch hint reads nothing architecturally; the
            // address is inside `weights`.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T1 }>(base.add(off).cast())
            };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (weights, at, len);
}

/// A raw output pointer shared by tasks that write disjoint rows.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements (each task owns a row range), and
// the pool joins every task before the borrow of `y` ends.
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// [`matmul`] at an explicit instruction-set level (benchmarks, tests).
#[allow(clippy::too_many_arguments)]
pub fn matmul_with(
    isa: Isa,
    kind: QuantKind,
    weights: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
    n: usize,
    threads: usize,
) -> Result<(), CpuError> {
    matmul_on(isa, kind, weights, rows, cols, x, y, n, threads, Products::Exact)
}

/// Which products a batch of several tokens may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Products {
    /// The per-token kernels only: each token's outputs are bit for bit
    /// what it gets alone (the GEMM sums in another order, ≤ 5e-7 relative
    /// apart), at the cost of the GEMM's speed.
    Rows,
    /// The integer GEMM for large batches: the same sums whatever the
    /// batch around a token (a server's seeded requests depend on it).
    Exact,
    /// As `Exact`, and where the CPU has AMX-BF16 the bf16 product for
    /// batches of [`crate::gemm::BF16_PER_CALL_MIN_BATCH`]+ (weights and
    /// activations rounded to bf16, f32 sums).
    Any,
}

/// [`matmul_with`], where `products` says which products large batches
/// may take.
#[allow(clippy::too_many_arguments)]
pub fn matmul_on(
    isa: Isa,
    kind: QuantKind,
    weights: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
    n: usize,
    threads: usize,
    products: Products,
) -> Result<(), CpuError> {
    let p = prepare(kind, isa, weights, rows, cols)?;
    let want_x = n.saturating_mul(cols);
    if x.len() != want_x {
        return Err(CpuError::Shape { what: "activation length", expected: want_x, got: x.len() });
    }
    let want_y = n.saturating_mul(rows);
    if y.len() != want_y {
        return Err(CpuError::Shape { what: "output length", expected: want_y, got: y.len() });
    }
    if rows == 0 || n == 0 {
        return Ok(());
    }
    if products != Products::Rows
        && (n >= crate::gemm::min_batch_unpacked(isa, kind)
            || (n >= crate::gemm::MIN_BATCH && crate::gemm::reads_in_place(kind, isa))
            || (products == Products::Any && crate::gemm::bf16_per_call(kind, isa, cols, n)))
        && crate::gemm::matmul(isa, kind, weights, rows, cols, x, y, n, threads, products == Products::Any)?
    {
        return Ok(());
    }
    let acts = Acts::new(isa, &p, x, cols, n, dot4_of(kind, &p).is_some())?;
    let out = OutPtr(y.as_mut_ptr());
    let prefetch = prefetches(weights);
    let per_task = rows_per_task(rows, threads);
    let n_tasks = rows.div_ceil(per_task);
    let task = |t: usize| {
        let r0 = t * per_task;
        acts.rows(&p, kind, weights, rows, out, r0, (r0 + per_task).min(rows), prefetch);
    };
    ThreadPool::global().run(threads, n_tasks, &task);
    Ok(())
}

/// One matrix of a [`matmul_many_with`] call and its output.
pub struct ManyOut<'a> {
    /// Storage kind.
    pub kind: QuantKind,
    /// The matrix's bytes, row-major.
    pub weights: &'a [u8],
    /// Rows (the output's width).
    pub rows: usize,
    /// `n * rows` outputs.
    pub y: &'a mut [f32],
}

/// `y_i = W_i x` for several matrices of one width over the same `n`
/// activation rows (a layer's Q, K and V; gate and up) in one go: the
/// activations quantized once, the rows of all the matrices split into one
/// set of pool tasks (one dispatch and one join, not one per matrix).
/// Batches that take a GEMM, and matrices whose kinds want different
/// activation kinds, run as separate [`matmul_with`] calls.
pub fn matmul_many_with(isa: Isa, cols: usize, x: &[f32], n: usize, threads: usize, mats: &mut [ManyOut<'_>]) -> Result<(), CpuError> {
    let first_act = mats.first().and_then(|m| m.kind.vec_dot_kind());
    let one_act = mats.iter().all(|m| m.kind.vec_dot_kind() == first_act);
    if n >= crate::gemm::MIN_BATCH || !one_act || mats.len() < 2 {
        for m in mats.iter_mut() {
            matmul_with(isa, m.kind, m.weights, m.rows, cols, x, m.y, n, threads)?;
        }
        return Ok(());
    }
    let want_x = n.saturating_mul(cols);
    if x.len() != want_x {
        return Err(CpuError::Shape { what: "activation length", expected: want_x, got: x.len() });
    }
    let parts = mats
        .iter_mut()
        .map(|m| Part::new(isa, m.kind, m.weights, m.rows, cols, m.y, n, threads))
        .collect::<Result<Vec<_>, _>>()?;
    if n == 0 {
        return Ok(());
    }
    // One preparation serves every matrix with a four-row kernel.
    let preps = parts.iter().any(Part::has_dot4);
    let acts = Acts::new(isa, &parts[0].p, x, cols, n, preps)?;
    let tasks = row_tasks(&parts);
    let task = |t: usize| {
        let (i, r0) = tasks[t];
        parts[i].run(&acts, r0);
    };
    ThreadPool::global().run(threads, tasks.len(), &task);
    Ok(())
}

/// One matrix of a [`matvec_routed`] call: a weight matrix over one chosen
/// activation row, and its output.
pub struct RoutedOut<'a> {
    /// Storage kind.
    pub kind: QuantKind,
    /// The matrix's bytes, row-major (one expert's rows of a stack).
    pub weights: &'a [u8],
    /// Rows (the output's width).
    pub rows: usize,
    /// Which row of the activations it multiplies.
    pub act: usize,
    /// `rows` outputs.
    pub y: &'a mut [f32],
}

/// `y_j = W_j x[act_j]` for many matrices of one width, each over one
/// chosen row of the activations `x` (`cols` wide): the routed experts of a
/// few tokens, where a loop of matvecs would dispatch and join the pool
/// once per matrix (a decode step of a 128-expert model: 24 per layer) and
/// quantize the same token once per matrix. Here each activation row used
/// is quantized once and the rows of every matrix split into one set of
/// pool tasks. Matrices whose kinds want different activation kinds run as
/// separate [`matmul_with`] calls.
pub fn matvec_routed(isa: Isa, cols: usize, x: &[f32], threads: usize, jobs: &mut [RoutedOut<'_>]) -> Result<(), CpuError> {
    if cols == 0 || !x.len().is_multiple_of(cols) {
        return Err(CpuError::Shape { what: "activation length (whole rows)", expected: x.len().next_multiple_of(cols.max(1)), got: x.len() });
    }
    let n = x.len() / cols;
    if let Some(j) = jobs.iter().find(|j| j.act >= n) {
        return Err(CpuError::Shape { what: "activation row of a routed matrix", expected: n, got: j.act });
    }
    let first_act = jobs.first().and_then(|m| m.kind.vec_dot_kind());
    if jobs.len() < 2 || !jobs.iter().all(|m| m.kind.vec_dot_kind() == first_act) {
        for j in jobs.iter_mut() {
            matmul_with(isa, j.kind, j.weights, j.rows, cols, &x[j.act * cols..(j.act + 1) * cols], j.y, 1, threads)?;
        }
        return Ok(());
    }
    let rows_of: Vec<usize> = jobs.iter().map(|j| j.act).collect();
    let parts = jobs
        .iter_mut()
        .map(|j| Part::new(isa, j.kind, j.weights, j.rows, cols, j.y, 1, threads))
        .collect::<Result<Vec<_>, _>>()?;
    // Each activation row used, quantized once (with its four-row
    // preparation where some matrix has that kernel).
    let preps = parts.iter().any(Part::has_dot4);
    let mut acts: Vec<Option<Acts>> = (0..n).map(|_| None).collect();
    for (part, &a) in parts.iter().zip(&rows_of) {
        if acts[a].is_none() {
            acts[a] = Some(Acts::new(isa, &part.p, &x[a * cols..(a + 1) * cols], cols, 1, preps)?);
        }
    }
    let tasks = row_tasks(&parts);
    let task = |t: usize| {
        let (i, r0) = tasks[t];
        if let Some(acts) = &acts[rows_of[i]] {
            parts[i].run(acts, r0);
        }
    };
    ThreadPool::global().run(threads, tasks.len(), &task);
    Ok(())
}

/// Whether a matrix's rows are prefetched: always once the resident
/// weights outgrew the cache ([`add_resident_weights`]), else when the
/// matrix alone is larger than it.
fn prefetches(weights: &[u8]) -> bool {
    STREAMING.load(std::sync::atomic::Ordering::Relaxed) || weights.len() > CACHE_BYTES
}

/// One matrix of a dispatch over several ([`matmul_many_with`],
/// [`matvec_routed`]): its kernels, bytes, output and rows a pool task.
struct Part<'a> {
    p: Prepared,
    kind: QuantKind,
    weights: &'a [u8],
    rows: usize,
    out: OutPtr,
    per_task: usize,
    prefetch: bool,
}

impl<'a> Part<'a> {
    /// `weights` (`rows x cols` of `kind`) prepared for `n` activation rows
    /// into `y` (`n * rows` outputs, checked).
    #[allow(clippy::too_many_arguments)]
    fn new(isa: Isa, kind: QuantKind, weights: &'a [u8], rows: usize, cols: usize, y: &mut [f32], n: usize, threads: usize) -> Result<Part<'a>, CpuError> {
        let p = prepare(kind, isa, weights, rows, cols)?;
        let want_y = n.saturating_mul(rows);
        if y.len() != want_y {
            return Err(CpuError::Shape { what: "output length", expected: want_y, got: y.len() });
        }
        let (out, per_task, prefetch) = (OutPtr(y.as_mut_ptr()), rows_per_task(rows, threads), prefetches(weights));
        Ok(Part { p, kind, weights, rows, out, per_task, prefetch })
    }

    /// Whether the level has a four-row kernel for this matrix.
    fn has_dot4(&self) -> bool {
        dot4_of(self.kind, &self.p).is_some()
    }

    /// The task at row `r0`: its rows against `acts`.
    fn run(&self, acts: &Acts, r0: usize) {
        acts.rows(&self.p, self.kind, self.weights, self.rows, self.out, r0, (r0 + self.per_task).min(self.rows), self.prefetch);
    }
}

/// The pool tasks over several matrices' rows, in matrix order: their
/// `(matrix, first row)` pairs.
fn row_tasks(parts: &[Part<'_>]) -> Vec<(usize, usize)> {
    parts
        .iter()
        .enumerate()
        .flat_map(|(i, part)| (0..part.rows).step_by(part.per_task).map(move |r0| (i, r0)))
        .collect()
}

/// The four-row kernel `kind` has at the level `p` runs, if any.
fn dot4_of(kind: QuantKind, p: &Prepared) -> Option<cpu::Dot4Fn> {
    cpu::dot4_kernel(kind, p.kernel.isa).and(cpu::dot4_fn(kind, p.kernel.isa))
}

/// The `n` activation rows of a decode matvec, quantized once for a
/// weight kind's dot (and, where the level has a four-row kernel, their
/// [`cpu::ActPrep`]s), shared by every matrix that dots the same kind.
struct Acts {
    act: ActBuf,
    act_bytes: usize,
    preps: Vec<cpu::ActPrep>,
    n: usize,
    /// F16 activations of several tokens, widened to f32 once, for the
    /// several-token F16 row kernel (which reads each weight once per up to
    /// eight tokens instead of once per token; same bits per token).
    wide: Option<(cpu::F16RowsFn, Vec<f32>)>,
}

impl Acts {
    /// `preps`: prepare them too (some matrix dotted with these activations
    /// has a four-row kernel).
    fn new(isa: Isa, p: &Prepared, x: &[f32], cols: usize, n: usize, preps: bool) -> Result<Acts, CpuError> {
        let mut act = ActBuf::new(p.act_bytes * n);
        if cols > 0 {
            for (xr, ar) in x.chunks_exact(cols).zip(act.bytes_mut().chunks_exact_mut(p.act_bytes)) {
                cpu::quantize_act(p.act, isa, xr, ar)?;
            }
        }
        // Four rows per call where the level has it (Q8_0 and Q8_K
        // activations): the preparation depends on the activation only.
        let preps = if preps {
            act.bytes()
                .chunks_exact(p.act_bytes.max(1))
                .map(|a| {
                    let mut prep = cpu::ActPrep::default();
                    prep.prepare(p.act, a).map(|()| prep)
                })
                .collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        // F16 batches read each weight row once (`dot_f16_rows`), on f32 copies of the activations.
        let wide = cpu::f16_rows_fn(isa).filter(|_| p.act == QuantKind::F16 && n > 1 && cols > 0).map(|f| {
            let halves: &[half::f16] = bytemuck::cast_slice(act.bytes());
            (f, halves.iter().map(|h| h.to_f32()).collect())
        });
        Ok(Acts { act, act_bytes: p.act_bytes, preps, n, wide })
    }

    /// Rows `r0..r1` of a `rows`-row matrix (`p`, `kind`, `weights`) for
    /// every activation row, into `out` (`n * rows`, token-major).
    #[allow(clippy::too_many_arguments)]
    fn rows(&self, p: &Prepared, kind: QuantKind, weights: &[u8], rows: usize, out: OutPtr, r0: usize, r1: usize, prefetch: bool) {
        // Capture the whole wrapper: edition-2021 closures would otherwise
        // capture the bare (non-Sync) pointer field.
        #[allow(clippy::redundant_locals)]
        let out = out;
        let act = self.act.bytes();
        let ab = self.act_bytes;
        let dot4 = dot4_of(kind, p).filter(|_| !self.preps.is_empty());
        if let Some((f, wide)) = self.wide.as_ref().filter(|_| kind == QuantKind::F16) {
            let cols = wide.len() / self.n;
            for r in r0..r1 {
                let w = &weights[r * p.row_bytes..(r + 1) * p.row_bytes];
                if prefetch {
                    prefetch_row(weights, (r + cpu::PREFETCH_ROWS) * p.row_bytes, p.row_bytes);
                }
                for b in (0..self.n).step_by(8) {
                    let m = (self.n - b).min(8);
                    let mut v = [0.0f32; 8];
                    // SAFETY: `f` came from `f16_rows_fn` for an available
                    // level; `w` is one row of `cols` F16 elements and rows
                    // b..b+m of `wide` hold `cols` floats each.
                    unsafe { f(w, wide.as_ptr().add(b * cols), cols, m, &mut v) };
                    for (k, &v) in v[..m].iter().enumerate() {
                        // SAFETY: `(b + k) * rows + r < n * rows`; row `r`
                        // belongs to this task alone.
                        unsafe { *out.0.add((b + k) * rows + r) = v };
                    }
                }
            }
            return;
        }
        let mut r_single = r0;
        if let Some(f) = dot4 {
            let r4 = r0 + (r1 - r0) / 4 * 4;
            for r in (r0..r4).step_by(4) {
                let w = &weights[r * p.row_bytes..(r + 4) * p.row_bytes];
                for (b, prep) in self.preps.iter().enumerate() {
                    let a = &act[b * ab..(b + 1) * ab];
                    // SAFETY: as for the one-row kernel below, for four
                    // consecutive rows; `prep` was made from `a`.
                    let v = unsafe { f(w, p.row_bytes, a, prep) };
                    for (k, &v) in v.iter().enumerate() {
                        // SAFETY: `b * rows + r + k < n * rows`; rows r..r+4
                        // belong to this task alone.
                        unsafe { *out.0.add(b * rows + r + k) = v };
                    }
                }
            }
            r_single = r4;
        }
        for r in r_single..r1 {
            let w = &weights[r * p.row_bytes..(r + 1) * p.row_bytes];
            if prefetch {
                prefetch_row(weights, (r + cpu::PREFETCH_ROWS) * p.row_bytes, p.row_bytes);
            }
            for b in 0..self.n {
                let a = &act[b * ab..(b + 1) * ab];
                // SAFETY: `isa` (and so its fallback `p.kernel.isa`) is
                // available, checked in `prepare`; `w` is one aligned row of
                // whole blocks and `a` one activation row of the same element
                // count in an 8-aligned buffer (`act_bytes` is a multiple of
                // the act block size, itself a multiple of its alignment); the
                // activation came from the ggml quantizer.
                let v = unsafe { (p.kernel.f)(w, a) };
                // SAFETY: `b * rows + r < n * rows == y.len()`, and row `r`
                // belongs to this task alone.
                unsafe { *out.0.add(b * rows + r) = v };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    fn aligned_quantized(kind: QuantKind, w: &[f32]) -> Vec<u64> {
        let bytes = crate::quantize_to_vec(kind, w).unwrap();
        let mut v = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(&bytes);
        v
    }

    /// Kinds with an AVX2 kernel, and two without (Q8_K, TQ2_0), which must
    /// go through the scalar fallback.
    const KINDS: &[QuantKind] = &[
        QuantKind::Q8_0,
        QuantKind::Q4_0,
        QuantKind::Q5_0,
        QuantKind::Q4_1,
        QuantKind::Q4K,
        QuantKind::Q6K,
        QuantKind::F32,
        QuantKind::F16,
        QuantKind::Q8K,
        QuantKind::TQ2_0,
    ];

    /// Rows `from..` of the Q8_0 matrix in `wq` overwritten with random
    /// quant bytes (every value, -128 too; small finite scales), then the
    /// matrix and its interleaved copy; `None` (saying so) without VNNI.
    fn random_interleaved<'a>(
        isa: Isa,
        rng: &mut SmallRng,
        wq: &'a mut [u64],
        rows: usize,
        rb: usize,
        from: usize,
    ) -> Option<(&'a [u8], InterleavedQ8_0)> {
        let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(wq)[..rows * rb];
        for blk in bytes[rb * from..].chunks_exact_mut(34) {
            blk[2..].iter_mut().for_each(|q| *q = rng.gen());
            blk[..2].copy_from_slice(&half::f16::from_f32(rng.gen_range(-0.02..0.02)).to_le_bytes());
        }
        let wb: &'a [u8] = &bytemuck::cast_slice::<u64, u8>(wq)[..rows * rb];
        let m = InterleavedQ8_0::new(isa, wb, rows, rb / 34 * 32).unwrap();
        if m.is_none() {
            eprintln!("NOT CHECKED: the interleaved Q8_0 matvec at {isa} (this CPU lacks AVX2)");
        }
        m.map(|m| (wb, m))
    }

    /// Every token of an F16 batch gets, bit for bit, what a one-token
    /// product gives (the several-token F16 row kernel sums as the one-row
    /// kernel does): batches of 2..=17 (one to three groups of eight, with a
    /// tail), rows of a 32-multiple and of a ragged length (scalar tail),
    /// and matrices past the prefetch threshold's row counts too.
    #[test]
    fn f16_batches_give_each_token_the_bits_of_a_one_token_product() {
        // AVX2's kernel by name, and the best level's (AVX-512's where the CPU has it).
        let mut levels = vec![Isa::Avx2, Isa::detect()];
        levels.dedup();
        for isa in levels {
            if !isa.is_available() || cpu::f16_rows_fn(isa).is_none() {
                eprintln!("NOT CHECKED: the several-token F16 kernel at {isa} (this CPU lacks the level, or the level has none)");
                continue;
            }
            f16_batches_at(isa);
        }
    }

    fn f16_batches_at(isa: Isa) {
        let mut rng = SmallRng::seed_from_u64(34);
        for (rows, cols) in [(37, 640), (20, 100), (8, 33)] {
            let w: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let wq = aligned_quantized(QuantKind::F16, &w);
            let wb = &bytemuck::cast_slice::<u64, u8>(&wq)[..rows * cols * 2];
            for n in 2..=17 {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
                let mut y = vec![0.0f32; n * rows];
                matmul_with(isa, QuantKind::F16, wb, rows, cols, &x, &mut y, n, 2).unwrap();
                for t in 0..n {
                    let mut y1 = vec![0.0f32; rows];
                    matmul_with(isa, QuantKind::F16, wb, rows, cols, &x[t * cols..(t + 1) * cols], &mut y1, 1, 2).unwrap();
                    let (a, b): (Vec<u32>, Vec<u32>) = (y[t * rows..(t + 1) * rows].iter().map(|v| v.to_bits()).collect(), y1.iter().map(|v| v.to_bits()).collect());
                    assert_eq!(a, b, "{isa}: {rows}x{cols}, token {t} of {n}");
                }
            }
        }
    }

    /// Several matrices over one input in one dispatch give, bit for bit,
    /// what one `matmul_with` per matrix gives: kinds sharing the Q8_0
    /// activation, kinds sharing Q8_K, and a mix of the two (which runs
    /// apart); odd row counts (four-row kernels with a one-row tail); one
    /// and three tokens; two threads.
    #[test]
    fn matmul_many_matches_one_matmul_per_matrix() {
        let isa = Isa::detect();
        let mut rng = SmallRng::seed_from_u64(23);
        let cols = 512;
        let sets: [&[(QuantKind, usize)]; 3] = [
            &[(QuantKind::Q4_0, 37), (QuantKind::Q8_0, 64), (QuantKind::Q5_0, 19)],
            &[(QuantKind::Q4K, 21), (QuantKind::Q6K, 40)],
            &[(QuantKind::Q4_0, 16), (QuantKind::Q4K, 9)],
        ];
        for set in sets {
            let ws: Vec<Vec<u64>> = set
                .iter()
                .map(|&(k, rows)| aligned_quantized(k, &(0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect::<Vec<f32>>()))
                .collect();
            let bytes: Vec<&[u8]> = set
                .iter()
                .zip(&ws)
                .map(|(&(k, rows), w)| &bytemuck::cast_slice::<u64, u8>(w)[..rows * crate::row_bytes(k, cols).unwrap()])
                .collect();
            for n in [1usize, 3] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
                let mut got: Vec<Vec<f32>> = set.iter().map(|&(_, rows)| vec![f32::NAN; n * rows]).collect();
                let mut mats: Vec<ManyOut<'_>> = set
                    .iter()
                    .zip(&bytes)
                    .zip(got.iter_mut())
                    .map(|((&(kind, rows), &weights), y)| ManyOut { kind, weights, rows, y })
                    .collect();
                matmul_many_with(isa, cols, &x, n, 2, &mut mats).unwrap();
                for (i, &(kind, rows)) in set.iter().enumerate() {
                    let mut want = vec![f32::NAN; n * rows];
                    matmul_with(isa, kind, bytes[i], rows, cols, &x, &mut want, n, 2).unwrap();
                    assert!(
                        want.iter().zip(&got[i]).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{kind} ({rows} rows) of {set:?}, n={n}: differs from its own matmul"
                    );
                }
            }
        }
    }

    /// Matrices over chosen activation rows in one dispatch give, bit for
    /// bit, one `matmul_with` each over its own row: a stack's experts over
    /// three tokens (repeated and unused rows), kinds sharing Q8_K, a mix of
    /// activation kinds (which runs apart), odd row counts; and a row past
    /// the activations is a typed error.
    #[test]
    fn matvec_routed_matches_one_matvec_per_matrix() {
        let isa = Isa::detect();
        let mut rng = SmallRng::seed_from_u64(29);
        let cols = 512;
        let x: Vec<f32> = (0..4 * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let sets: [&[(QuantKind, usize, usize)]; 3] = [
            &[(QuantKind::Q4K, 36, 0), (QuantKind::Q4K, 36, 2), (QuantKind::Q6K, 21, 2), (QuantKind::Q4K, 36, 0), (QuantKind::Q6K, 64, 3)],
            &[(QuantKind::Q8_0, 17, 1), (QuantKind::Q4_0, 40, 1), (QuantKind::Q5_0, 8, 3)],
            &[(QuantKind::Q4_0, 16, 0), (QuantKind::Q4K, 9, 3)],
        ];
        for set in sets {
            let ws: Vec<Vec<u64>> = set
                .iter()
                .map(|&(k, rows, _)| aligned_quantized(k, &(0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect::<Vec<f32>>()))
                .collect();
            let bytes: Vec<&[u8]> = set
                .iter()
                .zip(&ws)
                .map(|(&(k, rows, _), w)| &bytemuck::cast_slice::<u64, u8>(w)[..rows * crate::row_bytes(k, cols).unwrap()])
                .collect();
            let mut got: Vec<Vec<f32>> = set.iter().map(|&(_, rows, _)| vec![f32::NAN; rows]).collect();
            let mut jobs: Vec<RoutedOut<'_>> = set
                .iter()
                .zip(&bytes)
                .zip(got.iter_mut())
                .map(|((&(kind, rows, act), &weights), y)| RoutedOut { kind, weights, rows, act, y })
                .collect();
            matvec_routed(isa, cols, &x, 2, &mut jobs).unwrap();
            for (i, &(kind, rows, act)) in set.iter().enumerate() {
                let mut want = vec![f32::NAN; rows];
                matmul_with(isa, kind, bytes[i], rows, cols, &x[act * cols..(act + 1) * cols], &mut want, 1, 2).unwrap();
                assert!(
                    want.iter().zip(&got[i]).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{kind} ({rows} rows, token {act}) of {set:?}: differs from its own matvec"
                );
            }
        }
        let w = aligned_quantized(QuantKind::Q8_0, &vec![0.5; 4 * cols]);
        let w = &bytemuck::cast_slice::<u64, u8>(&w)[..4 * crate::row_bytes(QuantKind::Q8_0, cols).unwrap()];
        let (mut y0, mut y1) = (vec![0.0; 4], vec![0.0; 4]);
        let mut jobs = [
            RoutedOut { kind: QuantKind::Q8_0, weights: w, rows: 4, act: 0, y: &mut y0 },
            RoutedOut { kind: QuantKind::Q8_0, weights: w, rows: 4, act: 4, y: &mut y1 },
        ];
        let e = matvec_routed(isa, cols, &x, 2, &mut jobs);
        assert!(matches!(e, Err(CpuError::Shape { what: "activation row of a routed matrix", expected: 4, got: 4 })), "{e:?}");
    }

    /// The interleaved Q8_0 decode matvec against the scalar twin (the same
    /// quantized activation, `scalar::vec_dot` per row), and its rows
    /// against `dequantize` bit for bit: rows of quantized floats and rows of
    /// random bytes (every quant value, -128 included; scales kept finite).
    #[test]
    fn interleaved_q8_0_matches_the_scalar_twin_and_dequantize() {
        // AVX2's kernel by name, and the best level's (AVX-512's where the CPU has it).
        let mut levels = vec![Isa::Avx2, Isa::detect()];
        levels.dedup();
        for isa in levels {
            if isa.is_available() {
                interleaved_q8_0_at(isa);
            } else {
                eprintln!("NOT CHECKED: the interleaved Q8_0 matvec at {isa} (this CPU lacks it)");
            }
        }
    }

    fn interleaved_q8_0_at(isa: Isa) {
        let mut rng = SmallRng::seed_from_u64(16);
        for (rows, cols) in [(16, 32), (48, 96), (32, 640)] {
            let rb = crate::row_bytes(QuantKind::Q8_0, cols).unwrap();
            let w: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let mut wq = aligned_quantized(QuantKind::Q8_0, &w);
            let Some((wb, m)) = random_interleaved(isa, &mut rng, &mut wq, rows, rb, rows / 2) else {
                return;
            };
            let mut want = vec![0f32; cols];
            let mut got = vec![0f32; cols];
            for r in 0..rows {
                crate::dequantize(QuantKind::Q8_0, &wb[r * rb..(r + 1) * rb], &mut want).unwrap();
                m.row(r, &mut got).unwrap();
                assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{rows}x{cols}: row {r} differs from dequantize");
            }
            for (n, threads) in [(1, 1), (3, 2)] {
                let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
                let mut y = vec![f32::NAN; n * rows];
                m.matmul(&x, &mut y, n, threads, false).unwrap();
                for t in 0..n {
                    let xq = aligned_quantized(QuantKind::Q8_0, &x[t * cols..(t + 1) * cols]);
                    let xb = &bytemuck::cast_slice::<u64, u8>(&xq)[..rb];
                    for r in 0..rows {
                        let want = crate::scalar::vec_dot(QuantKind::Q8_0, &wb[r * rb..(r + 1) * rb], xb).unwrap();
                        let got = y[t * rows + r];
                        assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "{isa}: {rows}x{cols} n={n}: row {r} token {t}: {got} vs scalar {want}");
                    }
                }
            }
        }
        // Rows not in whole sixteens: no interleaved form (the caller keeps
        // the four-row kernel).
        let wq = aligned_quantized(QuantKind::Q8_0, &vec![0.5; 17 * 32]);
        assert!(InterleavedQ8_0::new(isa, &bytemuck::cast_slice::<u64, u8>(&wq)[..17 * 34], 17, 32).unwrap().is_none());
    }

    /// The kinds re-laid eight rows a group on AVX2 ([`Interleaved8`]).
    const ROWS8_KINDS: [QuantKind; 11] = [
        QuantKind::Q4_0,
        QuantKind::Q5_0,
        QuantKind::Q5_1,
        QuantKind::IQ4NL,
        QuantKind::Q8_0,
        QuantKind::IQ4XS,
        QuantKind::Q4K,
        QuantKind::Q5K,
        QuantKind::Q6K,
        QuantKind::Q3K,
        QuantKind::Q2K,
    ];

    /// The eight-row copy of every kind it takes gives back the stored
    /// blocks bit for bit: random bytes everywhere (every code and fifth
    /// bit, any scale and min), compared as `dequantize` gives each row.
    #[test]
    fn interleaved8_rows_are_the_stored_rows_bit_for_bit() {
        if !Isa::Avx2.is_available() {
            eprintln!("NOT CHECKED: the eight-row re-laid copy (this CPU lacks AVX2)");
            return;
        }
        let mut rng = SmallRng::seed_from_u64(88);
        for kind in ROWS8_KINDS {
            let unit = kind.block_elems();
            for (rows, cols) in [(8, unit), (24, 5 * unit)] {
                let rb = crate::row_bytes(kind, cols).unwrap();
                let mut wq = vec![0u64; (rows * rb).div_ceil(8)];
                let wb = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut wq)[..rows * rb];
                wb.iter_mut().for_each(|b| *b = rng.gen());
                let wb = &*wb;
                let m = Interleaved8::new(Isa::Avx2, kind, wb, rows, cols).unwrap().expect("AVX2, rows in eights");
                let (mut want, mut got) = (vec![0f32; cols], vec![0f32; cols]);
                for r in 0..rows {
                    crate::dequantize(kind, &wb[r * rb..(r + 1) * rb], &mut want).unwrap();
                    m.row(r, &mut got).unwrap();
                    assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "{kind} {rows}x{cols}: row {r} differs from the stored row");
                }
            }
            // Rows not in whole eights: no copy (the stored rows are read).
            let rb = crate::row_bytes(kind, unit).unwrap();
            let wq = vec![0u64; (12 * rb).div_ceil(8)];
            assert!(Interleaved8::new(Isa::Avx2, kind, &bytemuck::cast_slice::<u64, u8>(&wq)[..12 * rb], 12, unit).unwrap().is_none());
        }
    }

    /// Products over the eight-row copy: one token and small batches within
    /// the dot kernels' bound of the scalar twin, each token of a batch
    /// (any size, rows-only) bit for bit what it gets alone, and the GEMM's
    /// batches (16+) bit for bit what the GEMM gives from the stored rows.
    #[test]
    fn interleaved8_products_match_the_stored_rows() {
        let levels: Vec<Isa> = [Isa::Avx2, Isa::Avx512Vnni].into_iter().filter(|i| i.is_available()).collect();
        if levels.is_empty() {
            eprintln!("NOT CHECKED: products over the eight-row re-laid copy (this CPU lacks AVX2)");
            return;
        }
        let mut rng = SmallRng::seed_from_u64(89);
        for isa in levels {
            for kind in ROWS8_KINDS {
                let act = kind.vec_dot_kind().unwrap();
                let unit = kind.block_elems();
                for (rows, cols) in [(8, unit), (40, 640usize.next_multiple_of(unit))] {
                    let rb = crate::row_bytes(kind, cols).unwrap();
                    let w: Vec<f32> = (0..rows * cols).map(|i| rng.gen_range(-1.0..1.0) * if i % 7 == 0 { 3.0 } else { 1.0 }).collect();
                    let wq = aligned_quantized(kind, &w);
                    let wb = &bytemuck::cast_slice::<u64, u8>(&wq)[..rows * rb];
                    let Some(m) = Interleaved8::new(isa, kind, wb, rows, cols).unwrap() else {
                        assert!(isa != Isa::Avx2 && !Interleaved8::applies(kind, isa, rows), "{isa} {kind}: AVX2 takes every kind, rows in eights");
                        continue;
                    };
                    // A batch past the level's GEMM crossover.
                    let n = crate::gemm::min_batch_unpacked(isa, kind).max(19) + 3;
                    let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
                    let mut alone = vec![0f32; n * rows];
                    for t in 0..n {
                        let (xt, yt) = (&x[t * cols..(t + 1) * cols], &mut alone[t * rows..(t + 1) * rows]);
                        m.matmul(xt, yt, 1, 2, Products::Exact).unwrap();
                        let xq = aligned_quantized(act, xt);
                        let xb = &bytemuck::cast_slice::<u64, u8>(&xq)[..crate::row_bytes(act, cols).unwrap()];
                        for r in 0..rows {
                            let want = crate::scalar::vec_dot(kind, &wb[r * rb..(r + 1) * rb], xb).unwrap();
                            let got = yt[r];
                            assert!((got - want).abs() <= 1e-4 * want.abs().max(1.0), "{isa} {kind} {rows}x{cols}: row {r} token {t}: {got} vs scalar {want}");
                        }
                    }
                    for (n, products) in [(3, Products::Exact), (n, Products::Rows)] {
                        let mut y = vec![f32::NAN; n * rows];
                        m.matmul(&x[..n * cols], &mut y, n, 2, products).unwrap();
                        let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&y), bits(&alone[..n * rows]), "{isa} {kind} {rows}x{cols}: a batch of {n} ({products:?}) differs from its tokens alone");
                    }
                    let (mut y, mut want) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * rows]);
                    m.matmul(&x, &mut y, n, 2, Products::Exact).unwrap();
                    matmul_on(isa, kind, wb, rows, cols, &x, &mut want, n, 2, Products::Exact).unwrap();
                    assert_eq!(
                        y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                        "{isa} {kind} {rows}x{cols}: the GEMM over the copy differs from the GEMM over the stored rows"
                    );
                }
            }
        }
    }

    /// Several eight-row copies over one input in one dispatch give, bit for
    /// bit, what one `matmul` per copy gives: kinds wanting Q8_0 and Q8_1
    /// activations mixed, one and three tokens, and a GEMM-sized batch.
    #[test]
    fn interleaved8_many_matches_one_matmul_per_matrix() {
        if !Isa::Avx2.is_available() {
            eprintln!("NOT CHECKED: several eight-row copies in one dispatch (this CPU lacks AVX2)");
            return;
        }
        let mut rng = SmallRng::seed_from_u64(90);
        let cols = 256;
        let set = [(QuantKind::Q5_1, 64), (QuantKind::Q8_0, 24), (QuantKind::Q4_0, 40), (QuantKind::IQ4XS, 16), (QuantKind::Q4K, 8), (QuantKind::Q6K, 16), (QuantKind::Q3K, 8), (QuantKind::Q2K, 24)];
        let ws: Vec<Vec<u64>> = set.iter().map(|&(k, rows)| aligned_quantized(k, &(0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect::<Vec<f32>>())).collect();
        let ms: Vec<Interleaved8> = set
            .iter()
            .zip(&ws)
            .map(|(&(k, rows), w)| {
                let wb = &bytemuck::cast_slice::<u64, u8>(w)[..rows * crate::row_bytes(k, cols).unwrap()];
                Interleaved8::new(Isa::Avx2, k, wb, rows, cols).unwrap().expect("AVX2, rows in eights")
            })
            .collect();
        for (n, products) in [(1, Products::Exact), (3, Products::Exact), (17, Products::Rows), (17, Products::Exact)] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let mut ys: Vec<Vec<f32>> = set.iter().map(|&(_, rows)| vec![f32::NAN; n * rows]).collect();
            let mut mats: Vec<(&Interleaved8, &mut [f32])> = ms.iter().zip(ys.iter_mut()).map(|(m, y)| (m, y.as_mut_slice())).collect();
            Interleaved8::matmul_many(&x, n, 2, products, &mut mats).unwrap();
            for ((m, y), &(k, rows)) in ms.iter().zip(&ys).zip(&set) {
                let mut want = vec![f32::NAN; n * rows];
                m.matmul(&x, &mut want, n, 1, products).unwrap();
                assert_eq!(
                    y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                    "{k} n={n} {products:?}: one dispatch differs from its own matmul"
                );
            }
        }
    }

    /// The batched products over the interleaved copy (AMX tiles, and
    /// `matmul`'s choice per n) give every token bit for bit what the VNNI
    /// kernel gives it alone — the server's batches must not change a
    /// request's tokens — and stay within the dot kernels' bound of the
    /// scalar twin; tails of the 16-token tiles (3, 17, 100) included.
    #[test]
    fn interleaved_q8_0_batches_equal_the_per_token_product_bit_for_bit() {
        let isa = Isa::detect();
        let mut rng = SmallRng::seed_from_u64(17);
        let (rows, cols) = (48usize, 640usize);
        let rb = crate::row_bytes(QuantKind::Q8_0, cols).unwrap();
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let mut wq = aligned_quantized(QuantKind::Q8_0, &w);
        // A third of the rows random bytes: every quant value, -128 too.
        let Some((wb, m)) = random_interleaved(isa, &mut rng, &mut wq, rows, rb, 2 * rows / 3) else {
            return;
        };
        if !m.has_tiles() {
            eprintln!("NOT CHECKED: the interleaved Q8_0 tile product needs AMX, which this CPU (or OS) lacks");
        }
        for (n, threads) in [(1, 1), (3, 2), (16, 2), (17, 3), (64, 2), (100, 3)] {
            let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let mut want = vec![f32::NAN; n * rows];
            m.matmul_per_token(&x, &mut want, n, threads).unwrap();
            let mut got = vec![f32::NAN; n * rows];
            m.matmul(&x, &mut got, n, threads, false).unwrap();
            assert!(want.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()), "n={n}: matmul differs from the per-token product");
            let mut tiles = vec![f32::NAN; n * rows];
            if m.matmul_tiles(&x, &mut tiles, n, threads).unwrap() {
                for (i, (a, b)) in want.iter().zip(&tiles).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "n={n}: token {} row {}: tiles {b} vs per token {a}", i / rows, i % rows);
                }
            }
            for t in 0..n {
                let xq = aligned_quantized(QuantKind::Q8_0, &x[t * cols..(t + 1) * cols]);
                let xb = &bytemuck::cast_slice::<u64, u8>(&xq)[..rb];
                for r in 0..rows {
                    let s = crate::scalar::vec_dot(QuantKind::Q8_0, &wb[r * rb..(r + 1) * rb], xb).unwrap();
                    let g = got[t * rows + r];
                    assert!((g - s).abs() <= 1e-4 * s.abs().max(1.0), "n={n}: row {r} token {t}: {g} vs scalar {s}");
                }
            }
        }
    }

    #[test]
    fn matvec_matches_the_scalar_twin_row_by_row_on_any_thread_count() {
        let mut rng = SmallRng::seed_from_u64(7);
        let (rows, cols) = (517, 512);
        for &kind in KINDS {
            let w: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let wq = aligned_quantized(kind, &w);
            let wb = &bytemuck::cast_slice::<u64, u8>(&wq)[..crate::row_bytes(kind, cols).unwrap() * rows];
            let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let act = kind.vec_dot_kind().unwrap();
            let xq = aligned_quantized(act, &x);
            let xb = &bytemuck::cast_slice::<u64, u8>(&xq)[..crate::row_bytes(act, cols).unwrap()];
            let rb = wb.len() / rows;
            let want: Vec<f32> =
                (0..rows).map(|r| crate::scalar::vec_dot(kind, &wb[r * rb..(r + 1) * rb], xb).unwrap()).collect();
            // At the scalar level the matvec must be the twin, bit for bit.
            let mut y = vec![f32::NAN; rows];
            matmul_with(Isa::Scalar, kind, wb, rows, cols, &x, &mut y, 1, 2).unwrap();
            assert_eq!(y, want, "{kind} scalar matvec");
            let isa = Isa::active();
            let mut y1 = vec![f32::NAN; rows];
            matmul_with(isa, kind, wb, rows, cols, &x, &mut y1, 1, 1).unwrap();
            for (r, (&g, &s)) in y1.iter().zip(&want).enumerate() {
                let tol = 1e-4 * s.abs().max(1.0);
                assert!((g - s).abs() <= tol, "{kind} at {isa}, row {r}: {g} vs scalar {s}");
            }
            for threads in [2, 3] {
                let mut yt = vec![f32::NAN; rows];
                matmul_with(isa, kind, wb, rows, cols, &x, &mut yt, 1, threads).unwrap();
                assert_eq!(yt, y1, "{kind} at {isa}: {threads} threads differ from 1");
            }
        }
    }

    #[test]
    fn a_batched_matmul_equals_one_matvec_per_activation_row() {
        let mut rng = SmallRng::seed_from_u64(8);
        let (rows, cols, n) = (301, 256, 3);
        for kind in [QuantKind::Q8_0, QuantKind::Q4K] {
            let w: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let wq = aligned_quantized(kind, &w);
            let wb = &bytemuck::cast_slice::<u64, u8>(&wq)[..crate::row_bytes(kind, cols).unwrap() * rows];
            let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
            let mut y = vec![0.0; n * rows];
            matmul(kind, wb, rows, cols, &x, &mut y, n, 2).unwrap();
            for b in 0..n {
                let mut yb = vec![0.0; rows];
                matvec(kind, wb, rows, cols, &x[b * cols..(b + 1) * cols], &mut yb, 1).unwrap();
                assert_eq!(&y[b * rows..(b + 1) * rows], &yb[..], "{kind} batch row {b}");
            }
        }
    }

    #[test]
    fn mismatched_shapes_are_errors_not_panics() {
        let k = QuantKind::Q8_0;
        let w = vec![0u64; 34 * 4 * 3 / 8 + 1];
        let wb = &bytemuck::cast_slice::<u64, u8>(&w)[..34 * 4 * 3]; // 3 rows x 128
        let x = vec![0.0f32; 128];
        let mut y = vec![0.0f32; 3];
        assert!(matvec(k, wb, 3, 128, &x, &mut y, 2).is_ok());
        let shape = |r: Result<(), CpuError>| matches!(r, Err(CpuError::Shape { .. }));
        assert!(shape(matvec(k, &wb[..wb.len() - 34], 3, 128, &x, &mut y, 1)), "short weights");
        assert!(shape(matvec(k, wb, 3, 128, &x[..96], &mut y, 1)), "short x");
        assert!(shape(matvec(k, wb, 3, 128, &x, &mut y[..2], 1)), "short y");
        assert!(shape(matvec(k, wb, 4, 128, &x, &mut [0.0; 4], 1)), "rows off");
        assert!(matches!(
            matvec(k, wb, 3, 100, &x[..100], &mut y, 1),
            Err(CpuError::Quant(QuantError::NotWholeBlocks { .. }))
        ));
        assert!(matches!(
            matvec(QuantKind::I32, &[0; 12], 3, 1, &[0.0], &mut y, 1),
            Err(CpuError::Quant(QuantError::NoDot { .. }))
        ));
        let odd = &bytemuck::cast_slice::<u64, u8>(&w)[1..34 * 4 * 3 + 1];
        assert!(matches!(
            matvec(k, odd, 3, 128, &x, &mut y, 1),
            Err(CpuError::Quant(QuantError::Misaligned { .. }))
        ));
        assert!(matches!(
            matmul_with(Isa::Neon, k, wb, 3, 128, &x, &mut y, 1, 1),
            Err(CpuError::IsaUnavailable { .. })
        ) || Isa::Neon.is_available());
    }
}

/// A copy of `weights` (`rows` of `row_bytes`) re-laid by `relay` (a run of
/// whole `group`-row groups, its row count, the destination: groups are
/// contiguous in both layouts), handing `done` each stretch of the source
/// (about 1 MiB) once it has been copied, so that the caller can drop the
/// mapped pages as it goes and peak memory stays near one copy.
#[cfg(target_arch = "x86_64")]
fn relay_releasing(weights: &[u8], rows: usize, row_bytes: usize, group: usize, relay: impl Fn(&[u8], usize, &mut [u8]) + Sync, done: &mut dyn FnMut(&[u8])) -> Vec<u64> {
    let mut bytes = vec![0u64; weights.len().div_ceil(8)];
    let out = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut bytes)[..weights.len()];
    let stretch = ((1 << 20) / (group * row_bytes.max(1))).max(1) * group;
    // A stretch is handed back four stretches later: the kernel maps
    // pages around each fault (and whole 2 MiB folios), so a stretch
    // dropped right away would come back with its neighbour's reads.
    const LAG: usize = 4;
    let spans: Vec<(usize, usize)> = (0..rows).step_by(stretch).map(|r0| (r0, (r0 + stretch).min(rows))).collect();
    // A stretch's groups split over the machine's threads (the copy runs
    // once, at load).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let dst = OutPtr(out.as_mut_ptr().cast());
    for (i, &(r0, r1)) in spans.iter().enumerate() {
        let per = (r1 - r0).div_ceil(group).div_ceil(threads) * group;
        ThreadPool::global().run(threads, (r1 - r0).div_ceil(per), &|t| {
            let (a, b) = (r0 + t * per, (r0 + (t + 1) * per).min(r1));
            #[allow(clippy::redundant_locals)]
            let dst = &dst;
            // SAFETY: rows a..b of `out` (inside it: b <= rows), this task's alone.
            let o = unsafe { core::slice::from_raw_parts_mut(dst.0.cast::<u8>().add(a * row_bytes), (b - a) * row_bytes) };
            relay(&weights[a * row_bytes..b * row_bytes], b - a, o);
        });
        if let Some(&(a, b)) = i.checked_sub(LAG).and_then(|j| spans.get(j)) {
            done(&weights[a * row_bytes..b * row_bytes]);
        }
    }
    if let Some(&(a, _)) = spans.len().checked_sub(LAG).and_then(|j| spans.get(j)).or(spans.first()) {
        done(&weights[a * row_bytes..]);
    }
    bytes
}

/// The smallest batch that [`InterleavedQ8_0::matmul`] takes to AMX tiles
/// (`benches/interleaved.rs`, 262144x640, 2 threads: 1 token 4.1 ms by VNNI
/// vs 6.8 by tiles, 2 tokens 7.5 vs 6.9, 16 tokens 61 vs 7.7).
pub const AMX_MIN_TOKENS: usize = 2;

/// The smallest batch that [`InterleavedQ8_0::matmul`] takes to the bf16
/// product when allowed: the integer tiles are faster up to 64 tokens (35
/// vs 44 ms on the 262144x640 head), the bf16 product from 128 (69 vs 105;
/// 512: 218 vs 346), as its sums stay in the tiles.
pub const BF16_MIN_TOKENS: usize = 128;

/// A Q8_0 matrix interleaved 16 rows at a time for the AVX-512 VNNI decode
/// matvec (`cpu::x86::vnni16`), made once at load. Same size as the stored
/// matrix. Every product over it reads the copy: one token at a time with
/// VNNI, or, where the CPU has AMX, batches of [`AMX_MIN_TOKENS`]+ as AMX
/// tile products that read each 16-row group once for 16 tokens — with the
/// same integer sums and the same float steps, so a token's results are bit
/// for bit the same whatever the batch.
pub struct InterleavedQ8_0 {
    bytes: Vec<u64>,
    rows: usize,
    cols: usize,
    /// The level it was made for: AMX adds the tile product for batches.
    isa: Isa,
}

impl InterleavedQ8_0 {
    /// Interleaves `weights` (`rows x cols` of Q8_0), or `None` where the
    /// layout does not apply: not x86-64 with AVX2, or `rows` not a
    /// multiple of 16.
    pub fn new(isa: Isa, weights: &[u8], rows: usize, cols: usize) -> Result<Option<InterleavedQ8_0>, CpuError> {
        Self::new_releasing(isa, weights, rows, cols, |_| {})
    }

    /// As [`InterleavedQ8_0::new`], handing `done` each stretch of
    /// `weights` (about 1 MiB) once it has been copied, so that the caller
    /// can drop the source pages as it goes and peak memory stays near one
    /// copy.
    pub fn new_releasing(isa: Isa, weights: &[u8], rows: usize, cols: usize, mut done: impl FnMut(&[u8])) -> Result<Option<InterleavedQ8_0>, CpuError> {
        #[cfg(target_arch = "x86_64")]
        {
            if !isa.includes(Isa::Avx2) || !rows.is_multiple_of(16) || rows == 0 {
                return Ok(None);
            }
            let row_bytes = crate::row_bytes(QuantKind::Q8_0, cols)?;
            if weights.len() != rows.saturating_mul(row_bytes) {
                return Err(CpuError::Shape { what: "weight bytes", expected: rows.saturating_mul(row_bytes), got: weights.len() });
            }
            let bytes = relay_releasing(weights, rows, row_bytes, 16, |src, n, dst| cpu::x86::vnni16::interleave(src, n, row_bytes, dst), &mut done);
            Ok(Some(InterleavedQ8_0 { bytes, rows, cols, isa }))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (isa, weights, rows, cols, &mut done);
            Ok(None)
        }
    }

    /// The decode kernel, by name (`ferrox kernels`).
    pub const KERNEL: &'static str = "avx512::vnni16_q8_0";

    /// The decode kernel at level `isa` (AVX-512's [`InterleavedQ8_0::KERNEL`]
    /// or AVX2's), by name.
    pub fn kernel(isa: Isa) -> &'static str {
        if isa.includes(Isa::Avx512Vnni) {
            Self::KERNEL
        } else {
            "avx2::vnni16_q8_0"
        }
    }

    /// The batched product's kernel where the CPU has AMX (`ferrox kernels`).
    pub const TILE_KERNEL: &'static str = "amx::interleaved_16x16";

    /// Row `r` dequantized into `out` (`cols` values), bit for bit as
    /// [`crate::dequantize`] gives it from the stored blocks (`d * q`).
    pub fn row(&self, r: usize, out: &mut [f32]) -> Result<(), CpuError> {
        if r >= self.rows || out.len() != self.cols {
            return Err(CpuError::Shape { what: "interleaved row", expected: self.cols, got: out.len() });
        }
        #[cfg(target_arch = "x86_64")]
        {
            use cpu::x86::vnni16::{dequantize_row, GROUP_BLOCK};
            let nb = self.cols / 32;
            let w: &[u8] = bytemuck::cast_slice(&self.bytes);
            dequantize_row(&w[r / 16 * nb * GROUP_BLOCK..][..nb * GROUP_BLOCK], nb, r % 16, out);
            Ok(())
        }
        #[cfg(not(target_arch = "x86_64"))]
        Err(CpuError::IsaUnavailable { isa: Isa::Avx512Vnni }) // never made there (`new`)
    }

    /// `y = x W^T` for `n` activation rows (`x` is `n x cols`, `y` is
    /// `n x rows`): the activation quantized to Q8_0 as for the dot kernels;
    /// batches of [`AMX_MIN_TOKENS`]+ by AMX tiles where the level has them,
    /// else token by token. Either way one rounding (8-bit activations,
    /// integer block sums) and the same result per token.
    ///
    /// With `bf16`, batches of [`BF16_MIN_TOKENS`]+ take the bf16 product
    /// where the CPU has it, as a prepacked matrix does from its own
    /// threshold (`PackedMatrix::matmul`): the copy widened to bf16 a group
    /// pair at a time (perplexity's 512 logits a chunk).
    pub fn matmul(&self, x: &[f32], y: &mut [f32], n: usize, threads: usize, bf16: bool) -> Result<(), CpuError> {
        if bf16 && n >= BF16_MIN_TOKENS && self.matmul_bf16(x, y, n, threads)? {
            return Ok(());
        }
        if n >= AMX_MIN_TOKENS && self.matmul_tiles(x, y, n, threads)? {
            return Ok(());
        }
        self.matmul_per_token(x, y, n, threads)
    }

    /// [`InterleavedQ8_0::matmul`]'s bf16 product whatever `n`, or
    /// `Ok(false)` where the CPU has none (AMX-BF16 and AVX512-BF16).
    pub fn matmul_bf16(&self, x: &[f32], y: &mut [f32], n: usize, threads: usize) -> Result<bool, CpuError> {
        let (rows, cols) = (self.rows, self.cols);
        if x.len() != n.saturating_mul(cols) || y.len() != n.saturating_mul(rows) {
            return Err(CpuError::Shape { what: "matmul operands", expected: n.saturating_mul(cols), got: x.len() });
        }
        if !self.has_tiles() || n == 0 {
            return Ok(false);
        }
        #[cfg(target_arch = "x86_64")]
        return Ok(crate::gemm::interleaved_q8_0_bf16(bytemuck::cast_slice(&self.bytes), rows, cols, x, y, n, threads));
        #[cfg(not(target_arch = "x86_64"))]
        Ok(false)
    }

    /// Whether [`InterleavedQ8_0::matmul_tiles`] runs here (AMX).
    pub fn has_tiles(&self) -> bool {
        self.isa.includes(Isa::Amx) && Isa::Amx.is_available()
    }

    /// [`InterleavedQ8_0::matmul`] by AMX tiles whatever `n`, or `Ok(false)`
    /// where the level has none ([`InterleavedQ8_0::has_tiles`]). Each task
    /// takes a run of 16-row groups and each group every 16-token tile, so
    /// the copy is read once per call; the tokens' quantized rows are the
    /// tiles' other operand, read where they are.
    pub fn matmul_tiles(&self, x: &[f32], y: &mut [f32], n: usize, threads: usize) -> Result<bool, CpuError> {
        let (rows, cols) = (self.rows, self.cols);
        if x.len() != n.saturating_mul(cols) || y.len() != n.saturating_mul(rows) {
            return Err(CpuError::Shape { what: "matmul operands", expected: n.saturating_mul(cols), got: x.len() });
        }
        if !self.has_tiles() {
            return Ok(false);
        }
        #[cfg(target_arch = "x86_64")]
        {
            use cpu::x86::vnni16::GROUP_BLOCK;
            const T: usize = 16;
            let (nb, rb) = (cols / 32, cols / 32 * 34);
            let tiles = n.div_ceil(T);
            // Per token tile and block, the 16 tokens' quants (the A tile,
            // 512 bytes), scales and quant sums; missing tokens are zeros
            // (scale 0, sum 0: they add nothing and are never stored).
            let (mut q, mut d, mut sum) = (vec![0i8; tiles * nb * 512], vec![0f32; tiles * nb * T], vec![0i32; tiles * nb * T]);
            {
                let mut act = vec![0u64; rb.div_ceil(8)];
                let a = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut act)[..rb];
                let mut prep = cpu::ActPrep::default();
                for t in 0..n {
                    cpu::quantize_act(QuantKind::Q8_0, Isa::Avx512Vnni, &x[t * cols..(t + 1) * cols], a)?;
                    prep.q8_0(a)?;
                    let (tile, j) = (t / T, t % T);
                    for b in 0..nb {
                        let at = (tile * nb + b) * T + j;
                        q[at * 32..(at + 1) * 32].copy_from_slice(bytemuck::cast_slice(&a[b * 34 + 2..(b + 1) * 34]));
                        (d[at], sum[at]) = (prep.d[b], prep.sum[b]);
                    }
                }
            }
            let w: &[u8] = bytemuck::cast_slice(&self.bytes);
            let groups = rows / 16;
            let per_task = groups.div_ceil(threads.max(1) * 8).max(1);
            let out = OutPtr(y.as_mut_ptr());
            let (q, d, sum) = (&q[..], &d[..], &sum[..]);
            ThreadPool::global().run(threads, groups.div_ceil(per_task), &|task| {
                #[allow(clippy::redundant_locals)]
                let out = &out;
                let mut res = [[0f32; T]; T];
                // SAFETY: AMX usable (`has_tiles`); this thread's tile unit.
                unsafe { cpu::amx::configure_interleaved() };
                for g in task * per_task..((task + 1) * per_task).min(groups) {
                    let wg = w[g * nb * GROUP_BLOCK..(g + 1) * nb * GROUP_BLOCK].as_ptr();
                    for tile in 0..tiles {
                        let t0 = tile * T;
                        // SAFETY: configured above; group `g` is `nb` group
                        // blocks of `w`, token tile `tile` `nb` blocks of
                        // 512 quants and 16 scales and sums.
                        unsafe {
                            cpu::amx::interleaved_16x16(wg, nb, q[t0 * nb * 32..].as_ptr(), d[t0 * nb..].as_ptr(), sum[t0 * nb..].as_ptr(), tiles <= 2, &mut res)
                        };
                        for (j, r) in res.iter().enumerate().take(n - t0) {
                            // SAFETY: token `t0 + j < n`, rows 16g..16g + 16
                            // of its output row: inside `y`, this task's alone.
                            unsafe { core::ptr::copy_nonoverlapping(r.as_ptr(), out.0.add((t0 + j) * rows + g * 16), 16) };
                        }
                    }
                }
                // SAFETY: as above.
                unsafe { cpu::amx::release() };
            });
            Ok(true)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Ok(false)
    }

    /// [`InterleavedQ8_0::matmul`] token by token with the group kernel
    /// (AVX-512 VNNI, or AVX2's), whatever `n`: every token's activation is
    /// quantized first, then each 16-row group is taken against every token
    /// while it is in cache, so a batch reads the copy once, and each
    /// token's sums are the ones it gets alone.
    pub fn matmul_per_token(&self, x: &[f32], y: &mut [f32], n: usize, threads: usize) -> Result<(), CpuError> {
        let (rows, cols) = (self.rows, self.cols);
        if x.len() != n.saturating_mul(cols) || y.len() != n.saturating_mul(rows) {
            return Err(CpuError::Shape { what: "matmul operands", expected: n.saturating_mul(cols), got: x.len() });
        }
        #[cfg(target_arch = "x86_64")]
        {
            use cpu::x86::vnni16::{group_dot, group_dot_avx2, GROUP_BLOCK};
            let nb = cols / 32;
            let w: &[u8] = bytemuck::cast_slice(&self.bytes);
            let groups = rows / 16;
            let per_task = groups.div_ceil(threads.max(1) * 8).max(1);
            let ab = nb * 34;
            let mut act = vec![0u64; (n * ab).div_ceil(8)];
            let acts = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut act)[..n * ab];
            let mut preps = Vec::with_capacity(n);
            for (t, a) in acts.chunks_exact_mut(ab.max(1)).enumerate().take(n) {
                cpu::quantize_act(QuantKind::Q8_0, self.isa.dot_level(), &x[t * cols..(t + 1) * cols], a)?;
                let mut prep = cpu::ActPrep::default();
                prep.q8_0(a)?;
                preps.push(prep);
            }
            let acts: &[u8] = acts;
            let vnni = self.isa.includes(Isa::Avx512Vnni);
            let out = OutPtr(y.as_mut_ptr());
            // Blocks of groups ahead, into L2: sixteen (~8.5 KiB) for VNNI,
            // four (~2.2 KiB) for AVX2 (AVX2-only EPYC, Q8_0 file, tg128
            // medians of 5 alternating runs: 91.0 t/s at four against 84.9
            // at sixteen; its read loop too streams more 2 KiB ahead than 8).
            let prefetch = if vnni { 16 } else { 4 } * GROUP_BLOCK;
            ThreadPool::global().run(threads, groups.div_ceil(per_task), &|task| {
                #[allow(clippy::redundant_locals)]
                let out = &out;
                for g in task * per_task..((task + 1) * per_task).min(groups) {
                    let wg = &w[g * nb * GROUP_BLOCK..(g + 1) * nb * GROUP_BLOCK];
                    for (t, prep) in preps.iter().enumerate() {
                        let a = &acts[t * ab..(t + 1) * ab];
                        // SAFETY: the level (AVX-512 VNNI, or else AVX2) was
                        // checked at `new`; group `g` is `nb * GROUP_BLOCK`
                        // bytes of `w`, `a` is `nb` blocks.
                        let r = unsafe {
                            if vnni {
                                group_dot(wg, nb, a, &prep.d, &prep.sum, prefetch)
                            } else {
                                group_dot_avx2(wg, nb, a, &prep.d, prefetch)
                            }
                        };
                        // SAFETY: rows 16g..16g + 16 of token t's output row
                        // are inside `y` (n x rows) and this task's alone.
                        unsafe { core::ptr::copy_nonoverlapping(r.as_ptr(), out.0.add(t * rows + g * 16), 16) };
                    }
                }
            });
            Ok(())
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (x, y, n, threads, rows, cols);
            Err(CpuError::IsaUnavailable { isa: Isa::Avx512Vnni })
        }
    }
}

/// A matrix of Q4_0, Q5_0, Q5_1, IQ4_NL, Q8_0, IQ4_XS or a K kind (Q2_K to Q6_K)
/// re-laid at load eight rows a group for AVX2 CPUs without AVX-512
/// (`cpu::x86::rows8`): the same size as the stored matrix, and every
/// product over it reads the copy. One token (or any batch where each
/// token's sums must not depend on the batch) takes the group kernel, eight
/// rows a register with no horizontal sums; batches of
/// [`crate::gemm::min_batch_unpacked`]+ take the rows-in-lanes GEMM with its
/// panel unpacked from the groups, the same sums it makes from the stored
/// rows.
pub struct Interleaved8 {
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // never made there (`new`)
    bytes: Vec<u64>,
    kind: QuantKind,
    rows: usize,
    cols: usize,
    /// The level it was made for: its batches' GEMM runs there.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // never made there (`new`)
    isa: Isa,
}

impl Interleaved8 {
    /// Whether the layout applies: the kind has it, `rows` is a multiple of
    /// 8, and `isa` is AVX2, or AVX-512 without AMX (whose batches take the
    /// tile product over the stored rows) for the kinds whose group kernels
    /// stream more than its VNNI four-row kernels there: the 4- and 5-bit
    /// 32-element kinds, IQ4_XS, Q2_K, Q3_K and Q4_K, not Q8_0, Q5_K or Q6_K
    /// (docs/decisions/0054-eight-row-relayout-on-avx512.md).
    pub fn applies(kind: QuantKind, isa: Isa, rows: usize) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use QuantKind::*;
            let level = match isa {
                Isa::Avx2 => true,
                Isa::Avx512Vnni => matches!(kind, Q4_0 | Q5_0 | Q5_1 | IQ4NL | IQ4XS | Q2K | Q3K | Q4K),
                _ => false,
            };
            level
                && isa.is_available()
                && rows > 0
                && rows.is_multiple_of(8)
                && cpu::x86::rows8::Form::of(kind).is_some()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (kind, isa, rows);
            false
        }
    }

    /// The decode kernel `kind` takes re-laid, by name (`ferrox kernels`).
    pub fn kernel(kind: QuantKind) -> Option<&'static str> {
        #[cfg(target_arch = "x86_64")]
        return cpu::x86::rows8::kernels(kind).map(|k| k.0);
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = kind;
            None
        }
    }

    /// Re-lays `weights` (`rows x cols` of `kind`), or `None` where the
    /// layout does not apply ([`Interleaved8::applies`]), handing `done`
    /// each stretch of `weights` once copied (as [`InterleavedQ8_0::new_releasing`]).
    pub fn new_releasing(isa: Isa, kind: QuantKind, weights: &[u8], rows: usize, cols: usize, mut done: impl FnMut(&[u8])) -> Result<Option<Interleaved8>, CpuError> {
        if !Self::applies(kind, isa, rows) {
            return Ok(None);
        }
        let row_bytes = crate::row_bytes(kind, cols)?;
        if weights.len() != rows.saturating_mul(row_bytes) {
            return Err(CpuError::Shape { what: "weight bytes", expected: rows.saturating_mul(row_bytes), got: weights.len() });
        }
        #[cfg(target_arch = "x86_64")]
        {
            let Some(f) = cpu::x86::rows8::Form::of(kind) else { return Ok(None) };
            let bytes = relay_releasing(weights, rows, row_bytes, 8, |src, n, dst| cpu::x86::rows8::interleave(f, src, n, row_bytes, dst), &mut done);
            Ok(Some(Interleaved8 { bytes, kind, rows, cols, isa }))
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = &mut done;
            Ok(None)
        }
    }

    /// As [`Interleaved8::new_releasing`], keeping the source.
    pub fn new(isa: Isa, kind: QuantKind, weights: &[u8], rows: usize, cols: usize) -> Result<Option<Interleaved8>, CpuError> {
        Self::new_releasing(isa, kind, weights, rows, cols, |_| {})
    }

    /// Row `r` dequantized into `out` (`cols` values), bit for bit as
    /// [`crate::dequantize`] gives it from the stored blocks.
    pub fn row(&self, r: usize, out: &mut [f32]) -> Result<(), CpuError> {
        if r >= self.rows || out.len() != self.cols {
            return Err(CpuError::Shape { what: "interleaved row", expected: self.cols, got: out.len() });
        }
        #[cfg(target_arch = "x86_64")]
        {
            let f = cpu::x86::rows8::Form::of(self.kind).ok_or(QuantError::NoDot { kind: self.kind })?;
            let rb = crate::row_bytes(self.kind, self.cols)?;
            let w: &[u8] = &bytemuck::cast_slice(&self.bytes)[r / 8 * 8 * rb..][..8 * rb];
            let mut blocks = vec![0u8; rb];
            cpu::x86::rows8::deinterleave_row(f, w, rb / f.block_bytes(), r % 8, &mut blocks);
            crate::dequantize(self.kind, &blocks, out).map_err(CpuError::from)
        }
        #[cfg(not(target_arch = "x86_64"))]
        Err(CpuError::IsaUnavailable { isa: Isa::Avx2 }) // never made there (`new`)
    }

    /// `y = x W^T` for `n` activation rows (`x` is `n x cols`, `y` is
    /// `n x rows`): with `products` other than [`Products::Rows`], batches
    /// of [`crate::gemm::min_batch_unpacked`]+ by the GEMM; anything else
    /// token by token with the group kernel, each group taken against every
    /// token while it is in cache (a batch reads the copy once) and each
    /// token's sums the ones it gets alone.
    pub fn matmul(&self, x: &[f32], y: &mut [f32], n: usize, threads: usize, products: Products) -> Result<(), CpuError> {
        let (rows, cols) = (self.rows, self.cols);
        if x.len() != n.saturating_mul(cols) || y.len() != n.saturating_mul(rows) {
            return Err(CpuError::Shape { what: "matmul operands", expected: n.saturating_mul(cols), got: x.len() });
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = products;
        #[cfg(target_arch = "x86_64")]
        if products != Products::Rows && n >= crate::gemm::min_batch_unpacked(self.isa, self.kind) {
            let (_, _, pack) = cpu::x86::rows8::kernels(self.kind).ok_or(QuantError::NoDot { kind: self.kind })?;
            return crate::gemm::matmul_groups(self.isa, self.kind, pack, self.bytes(), rows, cols, x, y, n, threads);
        }
        Self::per_token(x, n, threads, &mut [(self, y)])
    }

    /// [`Interleaved8::matmul`] for several matrices of one width over the
    /// same `n` activation rows (a layer's Q, K and V; gate and up): below
    /// the GEMM's batches (or with [`Products::Rows`]) each activation kind
    /// quantized once and the groups of every matrix split into one set of
    /// pool tasks, else one call each.
    pub fn matmul_many(x: &[f32], n: usize, threads: usize, products: Products, mats: &mut [(&Interleaved8, &mut [f32])]) -> Result<(), CpuError> {
        if products != Products::Rows && mats.first().is_some_and(|(m, _)| n >= crate::gemm::min_batch_unpacked(m.isa, m.kind)) {
            for (m, y) in mats.iter_mut() {
                m.matmul(x, y, n, threads, products)?;
            }
            return Ok(());
        }
        Self::per_token(x, n, threads, mats)
    }

    /// The copy's bytes.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // never made there (`new`)
    fn bytes(&self) -> &[u8] {
        &bytemuck::cast_slice(&self.bytes)[..self.rows * crate::row_bytes(self.kind, self.cols).unwrap_or(0)]
    }

    /// Every matrix of `mats` (one width) token by token with its group
    /// kernel, in one dispatch: each group against every token while it is
    /// in cache, so a batch reads the copy once and each token's sums are
    /// the ones it gets alone.
    fn per_token(x: &[f32], n: usize, threads: usize, mats: &mut [(&Interleaved8, &mut [f32])]) -> Result<(), CpuError> {
        let cols = mats.first().map_or(0, |(m, _)| m.cols);
        if x.len() != n.saturating_mul(cols) {
            return Err(CpuError::Shape { what: "activation length", expected: n.saturating_mul(cols), got: x.len() });
        }
        if let Some((m, y)) = mats.iter().find(|(m, y)| m.cols != cols || y.len() != n * m.rows) {
            return Err(CpuError::Shape { what: "grouped matmul output", expected: n * m.rows, got: y.len() });
        }
        #[cfg(target_arch = "x86_64")]
        {
            // Each activation kind the matrices want, quantized and prepared once per token.
            let mut acts: Vec<(QuantKind, Vec<(ActBuf, cpu::ActPrep)>)> = Vec::new();
            for (m, _) in mats.iter() {
                let act = m.kind.vec_dot_kind().ok_or(QuantError::NoDot { kind: m.kind })?;
                if acts.iter().any(|(k, _)| *k == act) {
                    continue;
                }
                let ab = crate::row_bytes(act, cols)?;
                let mut toks = Vec::with_capacity(n);
                for t in 0..n {
                    let mut buf = ActBuf::new(ab);
                    cpu::quantize_act(act, Isa::Avx2, &x[t * cols..(t + 1) * cols], buf.bytes_mut())?;
                    let mut prep = cpu::ActPrep::default();
                    prep.prepare(act, buf.bytes())?;
                    toks.push((buf, prep));
                }
                acts.push((act, toks));
            }
            struct Job<'a> {
                w: &'a [u8],
                rows: usize,
                gb: usize,
                dot: cpu::x86::rows8::GroupDotFn,
                toks: &'a [(ActBuf, cpu::ActPrep)],
                out: OutPtr,
                per_task: usize,
                prefetch: usize,
            }
            let nb = cols / 32;
            let mut jobs = Vec::with_capacity(mats.len());
            for (m, y) in mats.iter_mut() {
                let (_, dot, _) = cpu::x86::rows8::kernels(m.kind).ok_or(QuantError::NoDot { kind: m.kind })?;
                let act = m.kind.vec_dot_kind().ok_or(QuantError::NoDot { kind: m.kind })?;
                let toks = acts.iter().find(|(k, _)| *k == act).map(|(_, t)| t.as_slice()).unwrap_or(&[]);
                let (w, groups) = (m.bytes(), m.rows / 8);
                let gb = w.len() / groups.max(1);
                // Eight group blocks ahead (1.1–2.2 KiB), into L2: as short as the
                // AVX2 head's distance (Q8_0 file, tg128 medians of 5 alternating
                // runs: 91.0 t/s at eight against 84.9 at sixteen).
                let prefetch = if prefetches(w) { 8 * gb / nb.max(1) } else { 0 };
                let per_task = groups.div_ceil(threads.max(1) * 8).max(1);
                jobs.push(Job { w, rows: m.rows, gb, dot, toks, out: OutPtr(y.as_mut_ptr()), per_task, prefetch });
            }
            let tasks: Vec<(usize, usize)> =
                jobs.iter().enumerate().flat_map(|(i, j)| (0..j.rows / 8).step_by(j.per_task).map(move |g| (i, g))).collect();
            ThreadPool::global().run(threads, tasks.len(), &|t| {
                let (i, g0) = tasks[t];
                let j = &jobs[i];
                #[allow(clippy::redundant_locals)]
                let out = &j.out;
                for g in g0..(g0 + j.per_task).min(j.rows / 8) {
                    let wg = &j.w[g * j.gb..(g + 1) * j.gb];
                    for (tok, (a, prep)) in j.toks.iter().enumerate() {
                        // SAFETY: AVX2 was checked at `new` (`applies`); group `g`
                        // is `nb` 32-element sub-blocks a row of `w`, `a` and `prep`
                        // one activation row of the matrix's activation kind.
                        let r = unsafe { (j.dot)(wg, nb, a.bytes(), prep, j.prefetch) };
                        // SAFETY: rows 8g..8g + 8 of token tok's output row are
                        // inside this matrix's `y` (n x rows) and this task's alone.
                        unsafe { core::ptr::copy_nonoverlapping(r.as_ptr(), out.0.add(tok * j.rows + g * 8), 8) };
                    }
                }
            });
            Ok(())
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = threads;
            Err(CpuError::IsaUnavailable { isa: Isa::Avx2 })
        }
    }
}
