//! Batched quantized matrix products (prefill, batched decode) as a blocked
//! integer GEMM.
//!
//! The key decision: **one packed form for every kind**. A panel of weight
//! rows is unpacked (per call, by the thread that owns it) into unsigned
//! bytes `u = q + OFFSET` with one float scale per 16- or 32-element
//! sub-block and one float bias per sub-block ([`crate::Unpack`], which
//! agrees bit for bit with dequantization); activations are quantized once,
//! exactly as ggml does for the kind (`vec_dot_type`), and expanded into
//! signed bytes with their scales. Then a register-tiled micro-kernel does
//! eight rows x four tokens of dot products at once: with AMX, 16 x 16
//! tiles; on AVX2 and on AVX-512 without AMX, eight rows interleaved in the
//! lanes of `vpmaddubsw` (with AVX-512 VNNI, `vpdpbusd`; [`Rows8Fn`]), so each
//! weight byte loaded feeds four tokens and each activation byte eight rows. (An AVX-512 VNNI 4x4 tile
//! with k positions in lanes ran there until the rows-in-lanes kernel
//! measured 1.06–1.50x it on an AVX-512 EPYC: decision 0049.)
//! For sub-block `s` of row `r` and token `c`:
//!
//! ```text
//! dot = sum_s  scale[r][s] * d[c][s] * sum(u * q_a)  +  bias[r][s] * (d[c][s] * sum(q_a))
//! ```
//!
//! The first term is the micro-kernel's; the second — the kind's minimum or
//! the folded offset — is a dot over sub-blocks only (1/16 or 1/32 of the
//! work), done once per output. The unpack is amortized over every token of
//! the batch, so it is plain scalar code.
//!
//! Only levels with a micro-kernel claim one ([`gemm_kernel`]); the caller
//! ([`crate::matvec::matmul_with`]) keeps its row-by-row path otherwise and for
//! small batches.

use crate::blocks::*;
use crate::cpu::{self, CpuError, Isa, ThreadPool};
use crate::{QuantError, QuantKind, Unpack};

/// Weight rows per task: unpacked once, then run against every token.
const ROWS_PER_TASK: usize = 16;

/// The smallest batch that takes the GEMM on weights packed at load
/// ([`PackedMatrix`]): below it, per-row dot products read the weights once
/// anyway (and read fewer bytes than the packed form).
pub const MIN_BATCH: usize = 8;

/// The smallest batch that takes the GEMM when the weights must be unpacked
/// per call: the unpack costs about as much as 16 tokens of per-row dot
/// products (Gemma 3 270M, AMX: pp16 288 t/s per call vs 427 packed at
/// load), so it pays only for batches well past that. AVX2 has its own
/// ([`min_batch_unpacked`]).
pub const MIN_BATCH_UNPACKED: usize = 32;

/// The smallest batch of `kind` that takes the GEMM when its weights are
/// unpacked per call, at level `isa`: [`MIN_BATCH_UNPACKED`] unless this
/// table knows better. Each number is where the GEMM overtook the per-token
/// row kernels in `benches/gemm.rs` (`FERROX_BENCH_N`, 2 threads, a
/// mixture's expert shapes 768x2048 and 2048x768; `benchmarks/matvec.md`).
/// - AVX2 (AVX2-only EPYC): 16 for Q4_K, Q6_K and Q8_0 (the GEMM 41–52
///   GMAC/s against the rows' 23–49 at 16, about even at 12).
/// - AVX-512 without AMX (Zen 4): 20 for Q4_K, Q5_K, Q6_K (their panels
///   packed in one pass, ahead from 12) and IQ4_XS (even at 16); 32 for
///   Q2_K and Q3_K (packed in one pass too: mixed at 16–20, ahead at 32;
///   with the scalar unpack they were behind up to 64). The 32-element
///   kinds stay at 32
///   although their GEMM doubles the rows from 16: its sums part from
///   llama.cpp's where the row kernels' agree (decision 0051).
pub fn min_batch_unpacked(isa: Isa, kind: QuantKind) -> usize {
    use QuantKind::*;
    match (isa, kind) {
        (Isa::Avx2, _) => 16,
        (Isa::Avx512Vnni, Q4K | Q5K | Q6K | IQ4XS) => 20,
        (Isa::Avx512Vnni, Q2K | Q3K) => 32,
        // capability table: every other (level, kind) keeps the AMX Xeon's
        // crossover (the 32-element kinds without AMX as said above).
        _ => MIN_BATCH_UNPACKED,
    }
}

/// The GEMM micro-kernel `(kind, isa)` claims, by name: the capability
/// table, written by hand; [`gemm_fn`] is what exists, and a test ties them.
pub fn gemm_kernel(kind: QuantKind, isa: Isa) -> Option<&'static str> {
    use QuantKind::*;
    let packed = matches!(
        kind,
        Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4NL | MXFP4 | Q2K | Q3K | Q4K | Q5K | Q6K | IQ4XS
    );
    match isa {
        Isa::Amx if packed => Some("amx::gemm_16x16"),
        Isa::Avx2 if packed => Some("avx2::gemm_8x4"),
        // AVX-512 without AMX runs the rows-in-lanes kernel (decision 0049)
        // with `vpdpbusd` in 256-bit registers (decision 0050), sixteen rows
        // a tile (a last odd group of eight alone; decision 0053).
        Isa::Avx512Vnni if packed => Some("avx512vnni::gemm_16x4"),
        _ => None, // capability table: partial by design
    }
}

/// Eight rows x four tokens with the rows in vector lanes (AVX2): row `r`,
/// token `j` into `out[j][r]`, each `sum(scale * d * ((u - base) . q_a)) +
/// bias * sums` over `subs` sub-blocks.
///
/// # Safety
/// The CPU has the level the pointer was obtained for; the pointers cover
/// `subs` sub-blocks ([`Rows8`], [`Cols4`]).
pub(crate) type Rows8Fn = unsafe fn(w: &Rows8, a: &Cols4, subs: usize, out: &mut [[f32; 8]; 4]);

/// [`Rows8Fn`] over two eight-row groups at once (`out[h]` group `h`'s):
/// with `vpdpbusd`, each token's bytes broadcast once for sixteen rows.
///
/// # Safety
/// As [`Rows8Fn`], for both groups.
pub(crate) type Rows16Fn = unsafe fn(w: [&Rows8; 2], a: &Cols4, subs: usize, out: &mut [[[f32; 8]; 4]; 2]);

/// Packs eight rows of whole blocks (one length, aligned) into a [`Rows8`]
/// panel in one pass: the codes interleaved (`rows[0].len() * 8` bytes into
/// `u`) and each sub-block's scale for the eight rows (`s[8 * k + r]`), for
/// kinds whose blocks carry no bias of their own (the caller folds the
/// offset in). Where a kind has one (AVX2: Q4_0, Q5_0, Q8_0, IQ4_NL) it
/// replaces the scalar unpack and the 4-byte interleave, a tenth of a
/// prefill's time.
///
/// # Safety
/// The CPU has the level it was obtained for; the rows are whole aligned
/// blocks of the kind, and `u` and `s` as large as said.
pub(crate) type Pack8Fn = unsafe fn(rows: &[&[u8]; 8], u: &mut [u8], s: &mut [f32]);

/// [`Pack8Fn`] for a kind with a bias of its own a sub-block (Q4_K,
/// Q5_K's mins): written into `bias` (the code offset not folded in).
///
/// # Safety
/// As [`Pack8Fn`]; `bias` as large as `s`.
pub(crate) type Pack8KFn = unsafe fn(rows: &[&[u8]; 8], u: &mut [u8], s: &mut [f32], bias: &mut [f32]);

/// The weight side of [`Rows8Fn`]: eight rows interleaved four codes at a
/// time (group `g` of four elements is 32 bytes: row 0's four codes, then
/// row 1's, ... row 7's), and per sub-block the eight rows' scales and
/// biases (8 floats each).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // AVX2 only
pub(crate) struct Rows8 {
    pub(crate) u: *const u8,
    pub(crate) s: *const f32,
    pub(crate) bias: *const f32,
}

/// The activation side of [`Rows8Fn`]: four tokens interleaved four codes
/// at a time (group `g` is 16 bytes: token 0's four codes, then token 1's,
/// ...), and per sub-block the four tokens' scales, then their `d * sum(q)`
/// (8 floats).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // AVX2 only
pub(crate) struct Cols4 {
    pub(crate) q: *const i8,
    pub(crate) ds: *const f32,
}

/// How a level runs the GEMM.
#[derive(Clone, Copy)]
enum Engine {
    /// Rows in lanes, eight at a time ([`Rows8Fn`]), with its `base`, and
    /// sixteen at a time where the level has that tile ([`Rows16Fn`]).
    Rows8(Rows8Fn, i32, Option<Rows16Fn>),
    /// AMX tiles.
    #[cfg(target_arch = "x86_64")]
    Amx,
}

/// The engine that exists for `isa`, with no fallback, for a kind packed
/// as `info` says (AVX2 picks its instance by the sub-block and the codes):
/// the dispatch table (must agree with [`gemm_kernel`]).
fn engine(isa: Isa, info: &PackInfo) -> Option<Engine> {
    let _ = info;
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 | Isa::Avx512Vnni => cpu::x86::rows8_gemm(isa == Isa::Avx512Vnni, info.sub, info.code_max)
            .map(|(f, base)| Engine::Rows8(f, base, cpu::x86::rows16_gemm(isa == Isa::Avx512Vnni, info.sub, info.code_max))),
        #[cfg(target_arch = "x86_64")]
        Isa::Amx => Some(Engine::Amx),
        _ => None,
    }
}

/// A kind's one-pass packer of eight rows: without a bias of its own
/// ([`Pack8Fn`]) or with one ([`Pack8KFn`]).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // the packers are x86's
enum Pack8 {
    Plain(Pack8Fn),
    Biased(Pack8KFn),
}

/// The one-pass packer of eight rows `kind` has at `isa`, if any.
fn pack8_fn(kind: QuantKind, isa: Isa) -> Option<Pack8> {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Isa::Avx2 | Isa::Avx512Vnni) {
        return cpu::x86::avx2_pack8(kind).map(Pack8::Plain).or_else(|| cpu::x86::avx2_pack8k(kind).map(Pack8::Biased));
    }
    let _ = (kind, isa);
    None
}

/// Receives one sub-block of a packed row: its index, scale and the kind's
/// own bias (the offset is not folded in).
type SubSink<'a> = &'a mut dyn FnMut(usize, f32, f32);

/// What the GEMM needs of a kind: its sub-block size, code offset and row
/// packer.
#[derive(Clone, Copy)]
struct PackInfo {
    sub: usize,
    offset: i32,
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // AVX2 picks its tile by it
    code_max: i32,
    pack: fn(row: &[u8], u: &mut [u8], sink: SubSink<'_>),
}

fn pack_info(kind: QuantKind) -> Option<PackInfo> {
    fn info<B: Unpack>() -> Option<PackInfo> {
        Some(PackInfo {
            sub: B::SUB,
            offset: B::OFFSET,
            code_max: B::CODE_MAX,
            pack: pack_row::<B>,
        })
    }
    use QuantKind::*;
    match kind {
        Q4_0 => info::<BlockQ4_0>(),
        Q4_1 => info::<BlockQ4_1>(),
        Q5_0 => info::<BlockQ5_0>(),
        Q5_1 => info::<BlockQ5_1>(),
        Q8_0 => info::<BlockQ8_0>(),
        IQ4NL => info::<BlockIQ4NL>(),
        MXFP4 => info::<BlockMXFP4>(),
        Q2K => info::<BlockQ2K>(),
        Q3K => info::<BlockQ3K>(),
        Q4K => info::<BlockQ4K>(),
        Q5K => info::<BlockQ5K>(),
        Q6K => info::<BlockQ6K>(),
        IQ4XS => info::<BlockIQ4XS>(),
        _ => None, // capability table: partial by design
    }
}

/// The name of the GEMM `(kind, isa)` runs with no fallback, if it both is
/// claimed and exists (and, for AMX, the OS granted the tiles).
pub fn gemm_fn(kind: QuantKind, isa: Isa) -> Option<&'static str> {
    let name = gemm_kernel(kind, isa)?;
    (isa.is_compiled() && pack_info(kind).is_some_and(|i| engine(isa, &i).is_some())).then_some(name)
}

/// The GEMM for `kind` at level `isa` or the first fallback that has one.
pub fn select_gemm(kind: QuantKind, isa: Isa) -> Option<(Isa, &'static str)> {
    let mut level = Some(isa);
    while let Some(i) = level {
        if let Some(name) = gemm_fn(kind, i) {
            return Some((i, name));
        }
        level = i.fallback();
    }
    None
}

/// Unpacks one row into bytes `q + OFFSET` (the padding is left as the
/// caller zeroed it) and hands each sub-block's scale and bias to `sink`.
fn pack_row<B: Unpack>(row: &[u8], u: &mut [u8], sink: SubSink<'_>) {
    // SAFETY: `row` is whole blocks of B at B's alignment (checked once per
    // matrix by `prepare` before any task runs).
    let blocks = unsafe { cpu::blocks_of::<B>(row) };
    let subs = B::ELEMS / B::SUB;
    let (mut q, mut s, mut b) = ([0i8; QK_K], [0f32; 16], [0f32; 16]);
    for (i, blk) in blocks.iter().enumerate() {
        blk.unpack(&mut q[..B::ELEMS], &mut s[..subs], &mut b[..subs]);
        let e0 = i * B::ELEMS;
        for (o, &v) in u[e0..e0 + B::ELEMS].iter_mut().zip(&q) {
            *o = (i32::from(v) + B::OFFSET) as u8;
        }
        for j in 0..subs {
            sink(e0 / B::SUB + j, s[j], b[j]);
        }
    }
}

/// Row `row` into lane `ri` of an eight-row panel ([`Rows8`]'s layout:
/// `u` its codes four at a time, `s` and `bias` its sub-blocks' scales and
/// own biases, the code offset not folded in), through `scratch` (`cols`
/// bytes): the scalar path, for kinds or row counts without a one-pass
/// packer.
fn pack_row_into(info: &PackInfo, row: &[u8], ri: usize, scratch: &mut [u8], u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    (info.pack)(row, scratch, &mut |k, sc, b| {
        s[8 * k + ri] = sc;
        bias[8 * k + ri] = b;
    });
    for (dst, four) in u.chunks_exact_mut(32).zip(scratch.chunks_exact(4)) {
        dst[4 * ri..4 * ri + 4].copy_from_slice(four);
    }
}

/// Scale and quants of activation block `i` of a quantized row, and the
/// block's stored sum where the kind keeps one (Q8_1); `None` for a kind
/// that is no activation kind.
fn act_block(act: QuantKind, row: &[u8], i: usize) -> Option<(f32, &[i8], Option<f32>)> {
    fn view(b: &[u8]) -> &[i8] {
        bytemuck::cast_slice(b)
    }
    let f16 = |b: &[u8]| F16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
    Some(match act {
        QuantKind::Q8_0 => {
            let b = &row[i * 34..(i + 1) * 34];
            (f16(b), view(&b[2..]), None)
        }
        QuantKind::Q8_1 => {
            let b = &row[i * 36..(i + 1) * 36];
            (f16(b), view(&b[4..]), Some(f16(&b[2..])))
        }
        QuantKind::Q8K => {
            let b = &row[i * 292..(i + 1) * 292];
            (
                f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                view(&b[4..260]),
                None,
            )
        }
        _ => return None, // capability table: the activation kinds only
    })
}

/// One weight sub-block's worth of a quantized activation row.
struct ActSub<'a> {
    /// The sub-block's quants.
    q: &'a [i8],
    /// Their scale.
    d: f32,
    /// `sum(q)`.
    sum: i32,
    /// `d * sum(q)` as ggml's dot uses it (Q8_1: the stored, f16-rounded sum).
    dsum: f32,
}

/// Quantizes one activation row as the kind's `vec_dot_type` and hands
/// each weight sub-block of it to `f` (index, data).
fn for_each_act_sub(
    act: QuantKind,
    isa: Isa,
    x: &[f32],
    sub: usize,
    buf: &mut Vec<u64>,
    mut f: impl FnMut(usize, ActSub<'_>),
) -> Result<(), CpuError> {
    let act_bytes = crate::row_bytes(act, x.len())?;
    buf.clear();
    buf.resize(act_bytes.div_ceil(8), 0);
    let bytes = &mut bytemuck::cast_slice_mut::<u64, u8>(buf)[..act_bytes];
    cpu::quantize_act(act, isa, x, bytes)?;
    let be = act.block_elems();
    for i in 0..x.len() / be {
        let (d, qa, stored) = act_block(act, bytes, i).ok_or(QuantError::NoDot { kind: act })?;
        for (j, q) in qa.chunks_exact(sub).enumerate() {
            let sum: i32 = q.iter().map(|&v| i32::from(v)).sum();
            // ggml's Q4_1/Q5_1 dots use the block's stored sum, rounded to
            // f16 (one 32-element sub-block per Q8_1 block).
            let dsum = stored.unwrap_or(d * sum as f32);
            f(i * be / sub + j, ActSub { q, d, sum, dsum });
        }
    }
    Ok(())
}

/// A raw pointer shared by tasks that write disjoint parts of one buffer.
#[derive(Clone, Copy)]
struct Shared<T>(*mut T);
// SAFETY: tasks write disjoint elements and the pool joins every task before
// the borrow the pointer came from ends.
unsafe impl<T> Send for Shared<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Shared<T> {}

impl<T> Shared<T> {
    /// The pointer (a method, so closures capture the `Sync` wrapper).
    fn ptr(&self) -> *mut T {
        self.0
    }

    /// `len` elements from `at`.
    ///
    /// # Safety
    /// In bounds of the buffer, and no other task touches them meanwhile.
    #[allow(clippy::mut_from_ref)]
    unsafe fn slice(&self, at: usize, len: usize) -> &mut [T] {
        // SAFETY: the caller's contract.
        unsafe { core::slice::from_raw_parts_mut(self.0.add(at), len) }
    }
}

/// Runs `task` on the pool, keeping the first error.
fn run_fallible(
    threads: usize,
    n: usize,
    task: impl Fn(usize) -> Result<(), CpuError> + Sync,
) -> Result<(), CpuError> {
    let err = std::sync::Mutex::new(None);
    ThreadPool::global().run(threads, n, &|i| {
        if let Err(e) = task(i) {
            err.lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        }
    });
    match err.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `Y = X W^T` by the packed GEMM, or `Ok(false)` when neither `isa` nor a
/// fallback of it has one (the caller then takes the row-by-row path);
/// with `bf16`, batches of [`BF16_PER_CALL_MIN_BATCH`]+ take the bf16
/// product where the CPU has it.
/// Shapes, alignment and lengths are the caller's checked contract
/// ([`crate::matvec::matmul_with`]).
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    isa: Isa,
    kind: QuantKind,
    weights: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
    n: usize,
    threads: usize,
    bf16: bool,
) -> Result<bool, CpuError> {
    let (Some((level, _)), Some(info)) = (select_gemm(kind, isa), pack_info(kind)) else {
        return Ok(false);
    };
    let act = kind.vec_dot_kind().ok_or(QuantError::NoDot { kind })?;
    let row_bytes = crate::row_bytes(kind, cols)?;
    let m = Matmul {
        level,
        kind,
        act,
        info,
        weights,
        row_bytes,
        rows,
        cols,
        x,
        n,
        threads,
        bf16,
        #[cfg(target_arch = "x86_64")]
        groups: None,
    };
    match engine(level, &info) {
        Some(Engine::Rows8(tile, base, tile16)) => m.rows8(tile, tile16, base, y)?,
        #[cfg(target_arch = "x86_64")]
        Some(Engine::Amx) => m.amx(y)?,
        None => return Ok(false),
    }
    Ok(true)
}

/// [`matmul`] over a matrix re-laid eight rows a group
/// (`crate::matvec::Interleaved8`) at `level` (AVX2, or AVX-512 without AMX:
/// its `vpdpbusd` tiles): the rows-in-lanes engine with the panel unpacked
/// from the groups ([`cpu::x86::rows8`]), the same codes, scales and biases
/// as from the stored rows, so the same sums.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_groups(
    level: Isa,
    kind: QuantKind,
    pack: cpu::x86::rows8::GroupPackFn,
    weights: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    y: &mut [f32],
    n: usize,
    threads: usize,
) -> Result<(), CpuError> {
    let (Some(info), Some(act)) = (pack_info(kind), kind.vec_dot_kind()) else {
        return Err(QuantError::NoDot { kind }.into());
    };
    let row_bytes = crate::row_bytes(kind, cols)?;
    let Some(Engine::Rows8(tile, base, tile16)) = engine(level, &info) else {
        return Err(QuantError::NoDot { kind }.into());
    };
    if !rows.is_multiple_of(8) || weights.len() != rows * row_bytes || x.len() != n * cols || y.len() != n * rows {
        return Err(CpuError::Shape { what: "grouped matmul operands", expected: rows * row_bytes, got: weights.len() });
    }
    if !level.is_available() {
        return Err(CpuError::IsaUnavailable { isa: level });
    }
    let m = Matmul { level, kind, act, info, weights, row_bytes, rows, cols, x, n, threads, bf16: false, groups: Some(pack) };
    m.rows8(tile, tile16, base, y)
}

/// One GEMM call's operands.
struct Matmul<'a> {
    level: Isa,
    kind: QuantKind,
    act: QuantKind,
    info: PackInfo,
    weights: &'a [u8],
    row_bytes: usize,
    rows: usize,
    cols: usize,
    x: &'a [f32],
    n: usize,
    threads: usize,
    /// Whether the bf16 product may run ([`matmul`]).
    bf16: bool,
    /// The weights are eight-row groups re-laid at load, unpacked by this
    /// ([`matmul_groups`]); else row-major stored blocks.
    #[cfg(target_arch = "x86_64")]
    groups: Option<cpu::x86::rows8::GroupPackFn>,
}

impl Matmul<'_> {
    fn row(&self, r: usize) -> &[u8] {
        &self.weights[r * self.row_bytes..(r + 1) * self.row_bytes]
    }

    /// The rows-in-lanes path (at the AVX2 level, and with `vpdpbusd` at
    /// AVX-512 without AMX): activations per token (bytes, and per sub-block
    /// their scale and `d * sum`), weight rows unpacked per task and
    /// interleaved eight at a time, four codes per row a group ([`Rows8`]),
    /// with the offset (less `base`) folded into the bias.
    fn rows8(&self, tile: Rows8Fn, tile16: Option<Rows16Fn>, base: i32, y: &mut [f32]) -> Result<(), CpuError> {
        let (sub, cols, n, rows) = (self.info.sub, self.cols, self.n, self.rows);
        let subs = cols / sub;
        let npad = n.next_multiple_of(4);
        // Four tokens a tile, interleaved as `Cols4` has them (padding tokens zero).
        let (mut aq, mut ads) = (vec![0i8; npad * cols], vec![0f32; npad * subs * 2]);
        let (qp, dp) = (Shared(aq.as_mut_ptr()), Shared(ads.as_mut_ptr()));
        run_fallible(self.threads, n, |c| {
            let (tile, j) = (c / 4, c % 4);
            let mut buf = Vec::new();
            for_each_act_sub(self.act, self.level, &self.x[c * cols..(c + 1) * cols], sub, &mut buf, |k, a| {
                for (gi, four) in a.q.chunks_exact(4).enumerate() {
                    let g = k * sub / 4 + gi;
                    // SAFETY: inside `aq` (`g < cols / 4`, `tile < npad / 4`);
                    // token `c` alone writes its lane `j` of each group.
                    unsafe { core::ptr::copy_nonoverlapping(four.as_ptr(), qp.ptr().add(tile * 4 * cols + 16 * g + 4 * j), 4) };
                }
                // SAFETY: inside `ads` (`k < subs`); token `c`'s two floats of sub-block `k`.
                unsafe {
                    *dp.ptr().add(tile * 8 * subs + 8 * k + j) = a.d;
                    *dp.ptr().add(tile * 8 * subs + 8 * k + 4 + j) = a.dsum;
                }
            })
        })?;
        let offset = (self.info.offset - base) as f32;
        let out = Shared(y.as_mut_ptr());
        let pack8 = pack8_fn(self.kind, self.level);
        ThreadPool::global().run(self.threads, rows.div_ceil(ROWS_PER_TASK), &|t| {
            let r0 = t * ROWS_PER_TASK;
            let nr = ROWS_PER_TASK.min(rows - r0);
            let groups = nr.div_ceil(8);
            PANEL.with_borrow_mut(|panel| {
                // The interleaved rows, then one row's codes as unpacked.
                panel.reset(groups * 8 * cols + cols, groups * 8 * subs, groups * 8 * subs);
                let (u, row) = panel.u.split_at_mut(groups * 8 * cols);
                for gi in 0..groups {
                    let live = (nr - 8 * gi).min(8);
                    let (s, bias) = (&mut panel.s[gi * 8 * subs..(gi + 1) * 8 * subs], &mut panel.bias[gi * 8 * subs..(gi + 1) * 8 * subs]);
                    let ug = &mut u[gi * 8 * cols..(gi + 1) * 8 * cols];
                    #[cfg(target_arch = "x86_64")]
                    let relaid = self.groups;
                    #[cfg(not(target_arch = "x86_64"))]
                    let relaid: Option<()> = None; // (no re-laid copies off x86)
                    match (relaid, pack8) {
                        #[cfg(target_arch = "x86_64")]
                        (Some(f), _) => {
                            // Re-laid eight rows a group (rows in whole eights,
                            // checked by `matmul_groups`): group `(r0 + 8gi) / 8`.
                            let gb = self.row_bytes * 8;
                            let w = &self.weights[(r0 / 8 + gi) * gb..][..gb];
                            // SAFETY: AVX2 is available (checked by the caller); `w` is one
                            // group of `subs` sub-blocks (`sub` elements each) a row, `ug`
                            // `8 * cols` bytes, `s` and `bias` `8 * subs` floats.
                            unsafe { f(w, subs, ug, s, bias) };
                        }
                        (None, Some(p)) if live == 8 => {
                            let rows: [&[u8]; 8] = core::array::from_fn(|r| self.row(r0 + 8 * gi + r));
                            // SAFETY: the level is available (checked by the caller); eight
                            // rows of whole aligned blocks (checked by `prepare`); `ug` holds
                            // `8 * cols` bytes and `s` and `bias` `8 * subs` floats each.
                            match p {
                                Pack8::Plain(f) => {
                                    unsafe { f(&rows, ug, s) };
                                    // These kinds have no bias of their own: only the offset's.
                                    bias.iter_mut().zip(s.iter()).for_each(|(b, &sc)| *b = -offset * sc);
                                    continue;
                                }
                                // SAFETY: as for the plain packer.
                                Pack8::Biased(f) => unsafe { f(&rows, ug, s, bias) },
                            }
                        }
                        _ => {
                            for ri in 0..live {
                                pack_row_into(&self.info, self.row(r0 + 8 * gi + ri), ri, row, ug, s, bias);
                            }
                        }
                    }
                    // w = s * q + b = s * ((u - base) - (OFFSET - base)) + b
                    bias.iter_mut().zip(s.iter()).for_each(|(b, &sc)| *b -= offset * sc);
                }
                for c0 in (0..npad).step_by(4) {
                    let a = Cols4 { q: aq[c0 * cols..].as_ptr(), ds: ads[c0 * 2 * subs..].as_ptr() };
                    let rows8 = |gi: usize| Rows8 {
                        u: u[gi * 8 * cols..].as_ptr(),
                        s: panel.s[gi * 8 * subs..].as_ptr(),
                        bias: panel.bias[gi * 8 * subs..].as_ptr(),
                    };
                    // Group `gi`'s tile into `y`.
                    let store = |gi: usize, acc: &[[f32; 8]; 4]| {
                        let live = (nr - 8 * gi).min(8);
                        for (j, accj) in acc.iter().enumerate().take((n - c0).min(4)) {
                            // SAFETY: `c0 + j < n` and rows `r0 + 8 * gi..` + `live` are
                            // inside `y` (n x rows), this task's alone.
                            unsafe { core::ptr::copy_nonoverlapping(accj.as_ptr(), out.ptr().add((c0 + j) * rows + r0 + 8 * gi), live) };
                        }
                    };
                    // Two groups a tile where the level has it, a last odd one alone.
                    let mut gi = 0;
                    while gi < groups {
                        match tile16.filter(|_| gi + 1 < groups) {
                            Some(t16) => {
                                let mut acc = [[[0f32; 8]; 4]; 2];
                                // SAFETY: as for the eight-row tile below, for both groups.
                                unsafe { t16([&rows8(gi), &rows8(gi + 1)], &a, subs, &mut acc) };
                                store(gi, &acc[0]);
                                store(gi + 1, &acc[1]);
                                gi += 2;
                            }
                            None => {
                                let mut acc = [[0f32; 8]; 4];
                                // SAFETY: the level is available (checked by the caller); the
                                // group covers `cols / 4` groups of 32 bytes and `subs` sub-blocks
                                // of scales and biases, each token `cols` bytes and `subs` floats
                                // (tokens past `n` are zeros); the instance fits the kind's codes.
                                unsafe { tile(&rows8(gi), &a, subs, &mut acc) };
                                store(gi, &acc);
                                gi += 1;
                            }
                        }
                    }
                }
            });
        });
        Ok(())
    }

    /// The AMX path, packing each 16-row panel as its task reaches it.
    #[cfg(target_arch = "x86_64")]
    fn amx(&self, y: &mut [f32]) -> Result<(), CpuError> {
        let shape = AmxShape::new(self.info.sub, self.cols);
        if self.bf16 && bf16_per_call(self.kind, self.level, self.cols, self.n) {
            self.amx_bf16(&shape, y);
            return Ok(());
        }
        let acts = AmxActs::new(self, &shape)?;
        let out = Shared(y.as_mut_ptr());
        let in_place = reads_in_place(self.kind, self.level);
        ThreadPool::global().run(self.threads, self.rows.div_ceil(AMX_T), &|p| {
            let r0 = p * AMX_T;
            PANEL.with_borrow_mut(|panel| {
                if in_place && r0 + AMX_T <= self.rows {
                    // Q8_0 in place: gather the 16 rows' block scales, read the
                    // quants where they are.
                    panel.s.clear();
                    panel.s.resize(shape.subs * AMX_T, 0.0);
                    q8_0_panel_scales(self.weights, self.row_bytes, p, &mut panel.s);
                    let w = PanelRef::q8_0_in_place(self.weights, self.row_bytes, p, &panel.s);
                    // SAFETY: the AMX level is available (checked by the caller);
                    // row i's sub-block k is bytes i*stride + 34k .. +32 of `u`,
                    // the last ending exactly at its end.
                    unsafe { amx_panel(&w, &acts, &shape, r0, self.rows, self.n, out) };
                    return;
                }
                panel.reset(AMX_T * shape.stride, AMX_T * shape.subs, AMX_T * shape.subs);
                let biased = pack_panel(
                    self.info,
                    self.weights,
                    self.row_bytes,
                    self.rows,
                    p,
                    &shape,
                    &mut panel.u,
                    &mut panel.s,
                    &mut panel.bias,
                );
                let w = PanelRef::packed(
                    &panel.u,
                    &shape,
                    &panel.s,
                    biased.then_some(&panel.bias[..]),
                );
                // SAFETY: the AMX level is available (checked by the caller).
                unsafe { amx_panel(&w, &acts, &shape, p * AMX_T, self.rows, self.n, out) };
            });
        });
        Ok(())
    }
}

impl Matmul<'_> {
    /// The bf16 product on weights packed per call: each pool task packs
    /// two 16-row panels (as the integer path does), widens them to bf16 and
    /// runs every token tile against them, the sums kept in the tiles for the
    /// whole row.
    #[cfg(target_arch = "x86_64")]
    fn amx_bf16(&self, shape: &AmxShape, y: &mut [f32]) {
        let acts = Bf16Acts::new(self.x, self.n, self.cols, self.threads);
        let out = Shared(y.as_mut_ptr());
        let panels = self.rows.div_ceil(AMX_T);
        ThreadPool::global().run(self.threads, panels.div_ceil(2), &|pp| {
            PANEL.with_borrow_mut(|a| {
                PANEL_B.with_borrow_mut(|b| {
                    let p0 = 2 * pp;
                    let mut biased = [false; 2];
                    for (i, panel) in [&mut *a, &mut *b].into_iter().enumerate().take((panels - p0).min(2)) {
                        panel.reset(AMX_T * shape.stride, AMX_T * shape.subs, AMX_T * shape.subs);
                        biased[i] = pack_panel(
                            self.info,
                            self.weights,
                            self.row_bytes,
                            self.rows,
                            p0 + i,
                            shape,
                            &mut panel.u,
                            &mut panel.s,
                            &mut panel.bias,
                        );
                    }
                    let w = [
                        Some(PanelRef::packed(&a.u, shape, &a.s, biased[0].then_some(&a.bias[..]))),
                        (p0 + 1 < panels).then(|| PanelRef::packed(&b.u, shape, &b.s, biased[1].then_some(&b.bias[..]))),
                    ];
                    // SAFETY: AMX-BF16 available (`amx_bf16`, checked by the
                    // caller); panels p0 and p0 + 1's rows are this task's alone.
                    unsafe { amx_panels_bf16(w, self.info.offset, shape, &acts, p0 * AMX_T, self.rows, self.n, out) };
                })
            })
        });
    }
}

/// Batches from which a matrix packed per call (a mixture's experts) takes
/// the bf16 product where its caller allows it: the per-block scaling of
/// the integer path costs more than widening the panels it packs anyway
/// (synthetic qwen3moe-30b Q4_K_M cut to 8 layers, pp512, 2 threads on the
/// AMX Xeon: 417–436 vs 349–352 t/s, where an expert sees ~32 tokens).
pub const BF16_PER_CALL_MIN_BATCH: usize = 16;

/// Whether `n` tokens against a `kind` matrix of `cols` packed per call at
/// `isa` take the bf16 product when the caller allows it: AMX with
/// AMX-BF16 for the row length, a kind the GEMM packs (Q8_0 read in place
/// keeps its integer path), and [`BF16_PER_CALL_MIN_BATCH`]+ tokens.
pub fn bf16_per_call(kind: QuantKind, isa: Isa, cols: usize, n: usize) -> bool {
    let level = select_gemm(kind, isa).map(|(l, _)| l);
    level == Some(Isa::Amx) && n >= BF16_PER_CALL_MIN_BATCH && amx_bf16(cols) && !reads_in_place(kind, Isa::Amx)
}

/// Tokens per AMX tile, and rows per AMX panel.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const AMX_T: usize = 16;

/// Sizes of the AMX operands for one matrix.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct AmxShape {
    sub: usize,
    subs: usize,
    /// Padded row length: `subs * sub` bytes.
    stride: usize,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl AmxShape {
    fn new(sub: usize, cols: usize) -> AmxShape {
        let subs = cols.div_ceil(sub);
        AmxShape {
            sub,
            subs,
            stride: subs * sub,
        }
    }
}

/// Activations in 16-token tiles laid out as `tdpbusd` wants them (see
/// `cpu::x86::amx`): per tile and sub-block, `sub * 16` bytes, and 16 each of
/// scales, `-OFFSET * sum(q)` and `d * sum(q)`.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct AmxActs {
    q: Vec<i8>,
    d: Vec<f32>,
    init: Vec<i32>,
    sums: Vec<f32>,
    tiles: usize,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
impl AmxActs {
    fn new(m: &Matmul<'_>, shape: &AmxShape) -> Result<AmxActs, CpuError> {
        const T: usize = AMX_T;
        let (sub, subs, cols, n) = (shape.sub, shape.subs, m.cols, m.n);
        let tiles = n.div_ceil(T);
        let mut a = AmxActs {
            q: vec![0; tiles * subs * sub * T],
            d: vec![0.0; tiles * subs * T],
            init: vec![0; tiles * subs * T],
            sums: vec![0.0; tiles * subs * T],
            tiles,
        };
        let ptrs = (
            Shared(a.q.as_mut_ptr()),
            Shared(a.d.as_mut_ptr()),
            Shared(a.init.as_mut_ptr()),
            Shared(a.sums.as_mut_ptr()),
        );
        let offset = m.info.offset;
        run_fallible(m.threads, tiles, |t| {
            let (qp, dp, ip, sp) = ptrs;
            // SAFETY: token tile `t` owns its slices of the four buffers.
            let (q, d, init, sums) = unsafe {
                (
                    qp.slice(t * subs * sub * T, subs * sub * T),
                    dp.slice(t * subs * T, subs * T),
                    ip.slice(t * subs * T, subs * T),
                    sp.slice(t * subs * T, subs * T),
                )
            };
            let mut buf = Vec::new();
            for j in 0..T.min(n - t * T) {
                let c = t * T + j;
                for_each_act_sub(
                    m.act,
                    m.level,
                    &m.x[c * cols..(c + 1) * cols],
                    sub,
                    &mut buf,
                    |k, a| {
                        // Tile row e/4 holds bytes e..e+4 of all 16 tokens.
                        let base = k * sub * T;
                        for (w, c) in a.q.chunks_exact(4).enumerate() {
                            q[base + w * 64 + j * 4..][..4].copy_from_slice(c);
                        }
                        d[k * T + j] = a.d;
                        init[k * T + j] = -offset * a.sum;
                        sums[k * T + j] = a.dsum;
                    },
                )?;
            }
            Ok(())
        })?;
        Ok(a)
    }
}

/// One 16-row panel's codes (16 x stride), scales and biases (subs x 16).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct PanelRef<'a> {
    /// From the panel's first row to the end of its last.
    u: &'a [u8],
    /// Bytes from one row to the next, and from one sub-block to the next.
    stride: usize,
    sub_step: usize,
    /// Signed Q8_0 quants read in place (no offset), not packed codes.
    signed: bool,
    scale: &'a [f32],
    /// `None` when every bias of the panel is zero.
    bias: Option<&'a [f32]>,
}

impl<'a> PanelRef<'a> {
    /// Full Q8_0 panel `p` of `weights` read in place: the signed quants where
    /// they are (rows `row_bytes` apart, sub-blocks 34 bytes apart, past each
    /// block's scale), with the rows' scales gathered as f32 in `scale`.
    fn q8_0_in_place(weights: &'a [u8], row_bytes: usize, p: usize, scale: &'a [f32]) -> PanelRef<'a> {
        PanelRef {
            u: &weights[p * AMX_T * row_bytes + 2..(p + 1) * AMX_T * row_bytes],
            stride: row_bytes,
            sub_step: 34,
            signed: true,
            scale,
            bias: None,
        }
    }

    /// A panel packed as [`pack_panel`] packs it.
    fn packed(
        u: &'a [u8],
        shape: &AmxShape,
        scale: &'a [f32],
        bias: Option<&'a [f32]>,
    ) -> PanelRef<'a> {
        PanelRef {
            u,
            stride: shape.stride,
            sub_step: shape.sub,
            signed: false,
            scale,
            bias,
        }
    }
}

/// Whether `kind` at `isa` runs the GEMM on its weights as stored, with no
/// packing at all: Q8_0 under AMX (`tdpbssd` takes its signed quants in
/// place, 34 bytes apart; only the 16 rows' scales are gathered per panel).
/// Such matrices take the GEMM from [`MIN_BATCH`] tokens and are never
/// packed at load.
pub fn reads_in_place(kind: QuantKind, isa: Isa) -> bool {
    kind == QuantKind::Q8_0 && matches!(select_gemm(kind, isa), Some((Isa::Amx, _)))
}

/// Packs panel `p` (rows `16p..`) of a matrix into `u`, `scale`, `bias`
/// (zeroed by the caller, sized for 16 rows); returns whether any bias is
/// non-zero.
#[allow(clippy::too_many_arguments)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn pack_panel(
    info: PackInfo,
    weights: &[u8],
    row_bytes: usize,
    rows: usize,
    p: usize,
    shape: &AmxShape,
    u: &mut [u8],
    scale: &mut [f32],
    bias: &mut [f32],
) -> bool {
    let r0 = p * AMX_T;
    let mut biased = false;
    for i in 0..AMX_T.min(rows - r0) {
        let row = &weights[(r0 + i) * row_bytes..(r0 + i + 1) * row_bytes];
        (info.pack)(
            row,
            &mut u[i * shape.stride..(i + 1) * shape.stride],
            &mut |k, sc, b| {
                scale[k * AMX_T + i] = sc;
                bias[k * AMX_T + i] = b;
                biased |= b != 0.0;
            },
        );
    }
    biased
}

/// The block scales of Q8_0 panel `p` (16 full rows of `row_bytes`) as f32,
/// sub-block-major (`out[k * 16 + row]`), for AMX reading the quants in place.
fn q8_0_panel_scales(weights: &[u8], row_bytes: usize, p: usize, out: &mut [f32]) {
    for i in 0..AMX_T {
        let row = &weights[(p * AMX_T + i) * row_bytes..][..row_bytes];
        for (k, blk) in row.chunks_exact(34).enumerate() {
            out[k * AMX_T + i] = F16::from_bits(u16::from_le_bytes([blk[0], blk[1]])).to_f32();
        }
    }
}

/// One packed panel (rows `r0..r0 + 16`) against every token tile, into `y`.
///
/// # Safety
/// The AMX level is available; the panel and activations were packed with
/// `shape`; rows `r0..` of `y` (n x rows) are this caller's alone.
#[cfg(target_arch = "x86_64")]
unsafe fn amx_panel(
    w: &PanelRef<'_>,
    a: &AmxActs,
    shape: &AmxShape,
    r0: usize,
    rows: usize,
    n: usize,
    out: Shared<f32>,
) {
    use crate::cpu::amx;
    const T: usize = AMX_T;
    let (sub, subs) = (shape.sub, shape.subs);
    let nr = T.min(rows - r0);
    let mut res = [[0f32; T]; T];
    // SAFETY: AMX usable (the caller's contract); the configuration matches
    // `sub`; every pointer covers `subs` sub-blocks of its buffer.
    unsafe { amx::configure(sub) };
    for t in 0..a.tiles {
        let tile = amx::AmxTile {
            u: w.u.as_ptr(),
            stride: w.stride,
            sub_step: w.sub_step,
            signed: w.signed,
            scale: w.scale.as_ptr(),
            bias: w.bias.map_or(core::ptr::null(), <[f32]>::as_ptr),
            q: a.q[t * subs * sub * T..].as_ptr(),
            d: a.d[t * subs * T..].as_ptr(),
            init: a.init[t * subs * T..].as_ptr(),
            sums: a.sums[t * subs * T..].as_ptr(),
            prefetch: a.tiles <= 2,
        };
        // SAFETY: as above.
        unsafe { amx::gemm_16x16(&tile, sub, subs, &mut res) };
        // SAFETY: as above.
        unsafe { store_tile(&res, t, nr, n, rows, r0, out) };
    }
    // SAFETY: as above.
    unsafe { amx::release() };
}

/// Stores one 16 x 16 result (`res[row][token]`, rows `r0..r0 + nr`,
/// token tile `t`) token-major into `y` (`n x rows`): each token's 16 rows
/// are one contiguous run.
///
/// # Safety
/// AVX-512F is available; rows `r0..r0 + nr` of `y` are the caller's alone.
#[cfg(target_arch = "x86_64")]
unsafe fn store_tile(res: &[[f32; AMX_T]; AMX_T], t: usize, nr: usize, n: usize, rows: usize, r0: usize, out: Shared<f32>) {
    use crate::cpu::amx;
    const T: usize = AMX_T;
    let nt = T.min(n - t * T);
    if nr == T {
        // SAFETY: AVX-512F (the caller's contract).
        let cols = unsafe { amx::transpose_16x16(res) };
        for (j, col) in cols.iter().enumerate().take(nt) {
            // SAFETY: token `t * T + j < n`, rows `r0..r0 + 16 <= rows`:
            // inside `y`; the rows are the caller's alone.
            unsafe { core::ptr::copy_nonoverlapping(col.as_ptr(), out.ptr().add((t * T + j) * rows + r0), T) };
        }
        return;
    }
    for j in 0..nt {
        for (i, row) in res.iter().enumerate().take(nr) {
            // SAFETY: as above, row `r0 + i < rows`.
            unsafe { *out.ptr().add((t * T + j) * rows + r0 + i) = row[j] };
        }
    }
}

/// Batches from which a prepacked matrix takes the bf16 product: below it
/// the per-call widening of the weights to bf16 costs more than the
/// integer path's per-block scaling (a server's decode steps stay there).
pub const BF16_MIN_BATCH: usize = 64;

/// Whether the AMX GEMM takes the bf16 product (weights widened to bf16
/// per panel, activations rounded to bf16, f32 sums kept in the tile)
/// rather than the integer one: where the CPU has AMX-BF16, the row length
/// is whole 32-element chunks, and `FERROX_AMX_GEMM` is not `int8` (the
/// batch size is the caller's test, [`BF16_MIN_BATCH`]). A bad
/// `FERROX_AMX_GEMM` panics with [`amx_gemm_bf16`]'s error here, which
/// backends and the binary check before any product runs.
///
/// Why: the integer product must scale every 16- or 32-element block's
/// sums on the vector units (a tile store and reload per block), which
/// leaves the tile unit idle most of the time; in bf16 the sums stay in the
/// tiles for the whole row. Its rounding (weights and activations to bf16)
/// is of the same size as the integer path's 8-bit activations; perplexity
/// moves by under 0.5% (`benchmarks/e2e.md`).
pub(crate) fn amx_bf16(cols: usize) -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    cols.is_multiple_of(32)
        && *ON.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            let hw = cpu::amx::bf16_usable();
            #[cfg(not(target_arch = "x86_64"))]
            let hw = false;
            hw && amx_gemm_bf16().unwrap_or_else(|e| panic!("{e}"))
        })
}

/// Whether `FERROX_AMX_GEMM` lets batches take the bf16 product: `bf16`
/// (the default) yes, `int8` no — the integer product throughout, for a
/// result closer to ggml's at some speed.
pub fn amx_gemm_bf16() -> Result<bool, crate::knob::BadValue> {
    let v = crate::knob::raw("FERROX_AMX_GEMM")?;
    let bf16 = crate::knob::parse_with("FERROX_AMX_GEMM", v.as_deref(), "int8 or bf16", |v| match v {
        "bf16" => Some(true),
        "int8" => Some(false),
        _ => None,
    })?;
    Ok(bf16.unwrap_or(true))
}

/// The bf16 product's kernel, by name, where a prepacked matrix of rows of
/// `cols` takes it ([`amx_bf16`]) for batches of [`BF16_MIN_BATCH`]+.
pub fn bf16_kernel(cols: usize) -> Option<&'static str> {
    amx_bf16(cols).then_some("amx::gemm_bf16_32x32")
}

/// Activations for the bf16 product: per 16-token tile and 32-element
/// chunk, 16 rows of 64 bytes, row `i` holding each token's elements
/// `2i, 2i + 1` as a bf16 pair (the layout `tdpbf16ps` wants).
#[cfg(target_arch = "x86_64")]
struct Bf16Acts {
    b: Vec<u16>,
    tiles: usize,
}

#[cfg(target_arch = "x86_64")]
impl Bf16Acts {
    fn new(x: &[f32], n: usize, cols: usize, threads: usize) -> Bf16Acts {
        const T: usize = AMX_T;
        let tiles = n.div_ceil(T);
        // An even number of tiles: the kernel takes them in pairs (a
        // missing one is zeros, its sums never stored).
        let mut a = Bf16Acts { b: vec![0; tiles.next_multiple_of(2) * cols * T], tiles };
        let bp = Shared(a.b.as_mut_ptr());
        ThreadPool::global().run(threads, tiles, &|t| {
            #[allow(clippy::redundant_locals)]
            let bp = bp;
            // SAFETY: token tile `t` owns its `cols * 16` values.
            let b = unsafe { bp.slice(t * cols * T, cols * T) };
            let rows: Vec<&[f32]> = (t * T..(t * T + T).min(n)).map(|c| &x[c * cols..][..cols]).collect();
            // SAFETY: AVX-512 F/BF16 (the product is only taken where
            // `amx_bf16` found them); `b` is `cols * 16`, `cols` whole chunks.
            unsafe { bf16_tile_acts(&rows, cols, b) };
        });
        a
    }
}

/// One token tile's activations (`rows`, up to 16 of `cols`) in the bf16
/// product's layout: per 32-element chunk, each token's 16 bf16 pairs are
/// one 16-word row, and a 16 x 16 word transpose makes them the tile's
/// columns. Missing tokens are zeros.
///
/// # Safety
/// AVX-512F and AVX512-BF16 are available; `b` holds `cols * 16` values and
/// `cols` is a multiple of 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn bf16_tile_acts(rows: &[&[f32]], cols: usize, b: &mut [u16]) {
    use core::arch::x86_64::*;
    let mut words = [[0f32; AMX_T]; AMX_T];
    for kc in 0..cols / 32 {
        for (j, w) in words.iter_mut().enumerate() {
            let v = match rows.get(j) {
                Some(r) => {
                    let p = r.as_ptr().add(kc * 32);
                    _mm512_castsi512_ps(core::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p.add(16)), _mm512_loadu_ps(p))))
                }
                None => _mm512_setzero_ps(),
            };
            _mm512_storeu_ps(w.as_mut_ptr(), v);
        }
        let t = cpu::amx::transpose_16x16(&words);
        core::ptr::copy_nonoverlapping(t.as_ptr().cast::<u16>(), b.as_mut_ptr().add(kc * 512), 512);
    }
}

/// Widens panel `w` (16 rows, `subs` sub-blocks of `sub`) to bf16,
/// row-major, `subs * sub` values a row: `scale * (u - offset) + bias` per
/// sub-block (the signed in-place quants: `scale * q`). Rows past `nr` are
/// zero.
///
/// # Safety
/// AVX-512 F/BW and AVX512-BF16 are available; `w` covers `nr` rows of
/// `subs` sub-blocks; `sub` is a multiple of 16.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
unsafe fn widen_panel_bf16(w: &PanelRef<'_>, offset: i32, sub: usize, subs: usize, nr: usize, out: &mut [u16]) {
    use core::arch::x86_64::*;
    let cols = subs * sub;
    for i in 0..AMX_T {
        let dst = &mut out[i * cols..(i + 1) * cols];
        if i >= nr {
            dst.fill(0);
            continue;
        }
        for k in 0..subs {
            let sc = w.scale[k * AMX_T + i];
            let b = w.bias.map_or(0.0, |b| b[k * AMX_T + i]);
            let src = w.u.as_ptr().add(i * w.stride + k * w.sub_step);
            // Packed codes are `q + offset`; signed quants are `q` itself.
            let off = if w.signed { 0.0 } else { offset as f32 };
            let (vs, vb) = (_mm512_set1_ps(sc), _mm512_set1_ps(b - sc * off));
            for c in (0..sub).step_by(16) {
                let bytes = _mm_loadu_si128(src.add(c).cast());
                let q = if w.signed { _mm512_cvtepi8_epi32(bytes) } else { _mm512_cvtepu8_epi32(bytes) };
                let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), vs, vb);
                let h: __m256i = core::mem::transmute(_mm512_cvtneps_pbh(v));
                _mm256_storeu_si256(dst.as_mut_ptr().add(k * sub + c).cast(), h);
            }
        }
    }
}

/// Two panels (rows `r0..r0 + 32`, `w[1]` absent past the last row) against
/// every token tile by the bf16 product, into `y`.
///
/// # Safety
/// As [`amx_panel`], with AMX-BF16 available ([`amx_bf16`]).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn amx_panels_bf16(w: [Option<PanelRef<'_>>; 2], offset: i32, shape: &AmxShape, a: &Bf16Acts, r0: usize, rows: usize, n: usize, out: Shared<f32>) {
    const T: usize = AMX_T;
    let cols = shape.subs * shape.sub;
    PANEL_BF16.with_borrow_mut(|buf| {
        buf.clear();
        buf.resize(2 * T * cols, 0);
        for (p, w) in w.iter().enumerate() {
            let nr = T.min(rows.saturating_sub(r0 + p * T));
            if let Some(w) = w {
                // SAFETY: the caller's contract (`bf16_usable` checked
                // AVX512-BF16 too); `w` covers `nr` rows.
                unsafe { widen_panel_bf16(w, offset, shape.sub, shape.subs, nr, &mut buf[p * T * cols..(p + 1) * T * cols]) };
            }
        }
        // SAFETY: the caller's contract; `buf` holds the two panels.
        unsafe { bf16_panels_product(buf, cols, a, r0, rows, n, out) };
    });
}

/// Two panels already widened to bf16 (`buf`: 32 rows of `cols`, rows
/// `r0..r0 + 32`, zeros past the last row) against every token tile by the
/// bf16 product, into `y`.
///
/// # Safety
/// As [`amx_panels_bf16`].
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn bf16_panels_product(buf: &[u16], cols: usize, a: &Bf16Acts, r0: usize, rows: usize, n: usize, out: Shared<f32>) {
    use crate::cpu::amx;
    const T: usize = AMX_T;
    let mut res = [[[[0f32; T]; T]; 2]; 2];
    // SAFETY: the caller's contract; the panels are 32 rows of `cols`
    // bf16, each token tile (an even number of them) `cols * 16` values.
    unsafe { amx::configure_bf16() };
    for t in (0..a.tiles).step_by(2) {
        let b = [a.b[t * cols * T..].as_ptr(), a.b[(t + 1) * cols * T..].as_ptr()];
        // SAFETY: configured above; `buf` is 32 rows of `cols` bf16 and
        // each token tile `cols * 16` values (tiles t and t + 1 exist:
        // their number is rounded up to even).
        unsafe { amx::gemm_bf16_32x32(buf.as_ptr(), cols * 2, b, cols / 32, &mut res) };
        for (p, res) in res.iter().enumerate() {
            let (rp, nr) = (r0 + p * T, T.min(rows.saturating_sub(r0 + p * T)));
            for (q, res) in res.iter().enumerate().filter(|&(q, _)| t + q < a.tiles && nr > 0) {
                // SAFETY: rows `rp..rp + nr` are inside `y` and this
                // caller's alone; token tile `t + q` exists.
                unsafe { store_tile(res, t + q, nr, n, rows, rp, out) };
            }
        }
    }
    // SAFETY: as above.
    unsafe { amx::release() };
}

/// Widens one 16-row group of the interleaved Q8_0 copy
/// (`crate::matvec::InterleavedQ8_0`, `nb` blocks) to bf16, row-major,
/// `nb * 32` values a row, exactly as [`widen_panel_bf16`] widens the
/// stored blocks (`d * q`, one rounding to f32, one to bf16).
///
/// # Safety
/// AVX2, AVX-512 F/BW and AVX512-BF16 are available; `g` holds `nb` group
/// blocks, `out` `16 * nb * 32` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f,avx512bw,avx512bf16")]
unsafe fn widen_interleaved_bf16(g: &[u8], nb: usize, out: &mut [u16]) {
    use crate::cpu::x86::vnni16::GROUP_BLOCK;
    use core::arch::x86_64::*;
    let cols = nb * 32;
    // Row r's 32 quants are 4 bytes at r * 4 of each of the block's eight
    // 64-byte lines.
    let lines = _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448);
    for b in 0..nb {
        let blk = &g[b * GROUP_BLOCK..(b + 1) * GROUP_BLOCK];
        for r in 0..AMX_T {
            let sc = _mm512_set1_ps(F16::from_bits(u16::from_le_bytes([blk[2 * r], blk[2 * r + 1]])).to_f32());
            let u = _mm256_i32gather_epi32::<1>(blk.as_ptr().add(32 + 4 * r).cast(), lines);
            let q = _mm256_xor_si256(u, _mm256_set1_epi8(0x80u8 as i8));
            let dst = out.as_mut_ptr().add(r * cols + b * 32);
            for (h, q) in [_mm256_castsi256_si128(q), _mm256_extracti128_si256::<1>(q)].into_iter().enumerate() {
                let v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), sc, _mm512_setzero_ps());
                let h16: __m256i = core::mem::transmute(_mm512_cvtneps_pbh(v));
                _mm256_storeu_si256(dst.add(16 * h).cast(), h16);
            }
        }
    }
}

/// `Y = X W^T` by the bf16 product over a Q8_0 matrix in the interleaved
/// layout (`w`: `rows / 16` groups), or `false` where the CPU has no bf16
/// product for rows of `cols` ([`amx_bf16`]); for batches of
/// [`BF16_MIN_BATCH`]+ whose caller allows bf16, as for a prepacked matrix.
/// Shapes are the caller's checked contract.
#[cfg(target_arch = "x86_64")]
pub(crate) fn interleaved_q8_0_bf16(w: &[u8], rows: usize, cols: usize, x: &[f32], y: &mut [f32], n: usize, threads: usize) -> bool {
    use crate::cpu::x86::vnni16::GROUP_BLOCK;
    const T: usize = AMX_T;
    if !amx_bf16(cols) || !rows.is_multiple_of(T) {
        return false;
    }
    let (groups, nb) = (rows / T, cols / 32);
    let acts = Bf16Acts::new(x, n, cols, threads);
    let out = Shared(y.as_mut_ptr());
    ThreadPool::global().run(threads, groups.div_ceil(2), &|pp| {
        PANEL_BF16.with_borrow_mut(|buf| {
            buf.clear();
            buf.resize(2 * T * cols, 0);
            for p in 0..2.min(groups - 2 * pp) {
                let g = 2 * pp + p;
                // SAFETY: AVX-512 BF16 (`amx_bf16`); group `g` is `nb`
                // group blocks of `w`, its panel `16 * cols` values of `buf`.
                unsafe { widen_interleaved_bf16(&w[g * nb * GROUP_BLOCK..(g + 1) * nb * GROUP_BLOCK], nb, &mut buf[p * T * cols..(p + 1) * T * cols]) };
            }
            // SAFETY: AMX-BF16 available (`amx_bf16`); groups 2pp and
            // 2pp + 1's rows are this task's alone.
            unsafe { bf16_panels_product(buf, cols, &acts, 2 * pp * T, rows, n, out) };
        });
    });
    true
}

/// A weight matrix unpacked once, at load, for the AMX GEMM: 16-row panels of
/// codes with their sub-block scales and biases. Batched products then skip
/// the per-call unpack, which at small batches (a server's decode steps)
/// costs more than the products. About 1.1–1.3 bytes per weight.
pub struct PackedMatrix {
    kind: QuantKind,
    rows: usize,
    cols: usize,
    info: PackInfo,
    /// Packed codes per panel; for a matrix read in place, only its last,
    /// partial panel (if any).
    u: Vec<u8>,
    scale: Vec<f32>,
    /// Sub-block biases per panel; for a matrix read in place (Q8_0 has
    /// none), only its partial panel's.
    bias: Vec<f32>,
    biased: Vec<bool>,
    /// Q8_0 under AMX: full panels are read from the stored weights (passed
    /// to [`PackedMatrix::matmul`]); only their scales are kept here.
    in_place: bool,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "PackedMatrix({} {}x{}, {} bytes)",
            self.kind,
            self.rows,
            self.cols,
            self.bytes()
        )
    }
}

impl PackedMatrix {
    /// Packs `weights` (`rows x cols` of `kind`) for `isa`'s GEMM, or `None`
    /// when that level has no packed-weight GEMM for the kind (only AMX does).
    pub fn new(
        isa: Isa,
        kind: QuantKind,
        weights: &[u8],
        rows: usize,
        cols: usize,
        threads: usize,
    ) -> Result<Option<PackedMatrix>, CpuError> {
        let (Some((level, _)), Some(info)) = (select_gemm(kind, isa), pack_info(kind)) else {
            return Ok(None);
        };
        if level != Isa::Amx || !level.is_available() {
            return Ok(None);
        }
        let in_place = reads_in_place(kind, isa);
        let row_bytes = crate::row_bytes(kind, cols)?;
        if weights.len() != rows.saturating_mul(row_bytes) {
            return Err(CpuError::Shape {
                what: "weight bytes",
                expected: rows.saturating_mul(row_bytes),
                got: weights.len(),
            });
        }
        cpu::check_aligned(kind, weights)?;
        let shape = AmxShape::new(info.sub, cols);
        let panels = rows.div_ceil(AMX_T);
        // Read in place, only a partial last panel packs (at offset 0).
        let packing = if in_place { usize::from(!rows.is_multiple_of(AMX_T)) } else { panels };
        let mut m = PackedMatrix {
            kind,
            rows,
            cols,
            info,
            u: vec![0; packing * AMX_T * shape.stride],
            scale: vec![0.0; panels * AMX_T * shape.subs],
            bias: vec![0.0; packing * AMX_T * shape.subs],
            biased: vec![false; panels],
            in_place,
        };
        let (up, sp, bp, fp) = (
            Shared(m.u.as_mut_ptr()),
            Shared(m.scale.as_mut_ptr()),
            Shared(m.bias.as_mut_ptr()),
            Shared(m.biased.as_mut_ptr()),
        );
        let (pu, ps) = (AMX_T * shape.stride, AMX_T * shape.subs);
        ThreadPool::global().run(threads, panels, &|p| {
            // SAFETY: panel `p` owns its slices of the scale and flag
            // buffers; the `u` and bias slices below are its alone (for a
            // matrix read in place, only the one partial panel packs, at
            // offset 0).
            let (s, f) = unsafe { (sp.slice(p * ps, ps), fp.slice(p, 1)) };
            if in_place && (p + 1) * AMX_T <= rows {
                q8_0_panel_scales(weights, row_bytes, p, s);
                return;
            }
            let at = if in_place { 0 } else { p };
            // SAFETY: as above.
            let (u, b) = unsafe { (up.slice(at * pu, pu), bp.slice(at * ps, ps)) };
            f[0] = pack_panel(info, weights, row_bytes, rows, p, &shape, u, s, b);
        });
        Ok(Some(m))
    }

    /// Panel `p` (rows `16p..`): the stored Q8_0 quants in place, or the
    /// packed codes.
    fn panel<'a>(&'a self, weights: &'a [u8], row_bytes: usize, shape: &AmxShape, p: usize) -> PanelRef<'a> {
        let (pu, ps) = (AMX_T * shape.stride, AMX_T * shape.subs);
        let scale = &self.scale[p * ps..(p + 1) * ps];
        if self.in_place && (p + 1) * AMX_T <= self.rows {
            return PanelRef::q8_0_in_place(weights, row_bytes, p, scale);
        }
        let at = if self.in_place { 0 } else { p };
        PanelRef::packed(&self.u[at * pu..(at + 1) * pu], shape, scale, self.biased[p].then(|| &self.bias[at * ps..(at + 1) * ps]))
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.u.len() + 4 * (self.scale.len() + self.bias.len()) + self.biased.len()
    }

    /// `Y = X W^T` for `n` activation rows (`x` is `n x cols`, `y` is
    /// `n x rows`), with AMX. `weights` are the stored bytes the matrix was
    /// made from (read when the kind is read in place).
    ///
    /// With `bf16`, batches of [`BF16_MIN_BATCH`]+ take the bf16 product where
    /// the CPU has it ([`bf16_kernel`]); without, every batch takes the
    /// integer one (8-bit activations, as the per-token dot products).
    pub fn matmul(&self, weights: &[u8], x: &[f32], y: &mut [f32], n: usize, threads: usize, bf16: bool) -> Result<(), CpuError> {
        let row_bytes = crate::row_bytes(self.kind, self.cols)?;
        if self.in_place && weights.len() != self.rows.saturating_mul(row_bytes) {
            return Err(CpuError::Shape {
                what: "weight bytes",
                expected: self.rows.saturating_mul(row_bytes),
                got: weights.len(),
            });
        }
        if x.len() != n.saturating_mul(self.cols) {
            return Err(CpuError::Shape {
                what: "activation length",
                expected: n.saturating_mul(self.cols),
                got: x.len(),
            });
        }
        if y.len() != n.saturating_mul(self.rows) {
            return Err(CpuError::Shape {
                what: "output length",
                expected: n.saturating_mul(self.rows),
                got: y.len(),
            });
        }
        if n == 0 || self.rows == 0 {
            return Ok(());
        }
        let act = self
            .kind
            .vec_dot_kind()
            .ok_or(QuantError::NoDot { kind: self.kind })?;
        let m = Matmul {
            level: Isa::Amx,
            kind: self.kind,
            act,
            info: self.info,
            weights: &[],
            row_bytes: 0,
            rows: self.rows,
            cols: self.cols,
            x,
            n,
            threads,
            // (the prepacked matrix takes its own bf16 product below)
            bf16: false,
            #[cfg(target_arch = "x86_64")]
            groups: None,
        };
        let shape = AmxShape::new(self.info.sub, self.cols);
        #[cfg(not(target_arch = "x86_64"))]
        return Err(CpuError::IsaUnavailable { isa: Isa::Amx });
        let out = Shared(y.as_mut_ptr());
        #[cfg(target_arch = "x86_64")]
        if bf16 && n >= BF16_MIN_BATCH && amx_bf16(self.cols) {
            let acts = Bf16Acts::new(x, n, self.cols, threads);
            let panels = self.rows.div_ceil(AMX_T);
            ThreadPool::global().run(threads, panels.div_ceil(2), &|pp| {
                let w = [Some(self.panel(weights, row_bytes, &shape, 2 * pp)), (2 * pp + 1 < panels).then(|| self.panel(weights, row_bytes, &shape, 2 * pp + 1))];
                // SAFETY: AMX-BF16 available (`amx_bf16`); panels 2pp and
                // 2pp + 1's rows are this task's alone.
                unsafe { amx_panels_bf16(w, self.info.offset, &shape, &acts, 2 * pp * AMX_T, self.rows, n, out) };
            });
            return Ok(());
        }
        let acts = AmxActs::new(&m, &shape)?;
        #[cfg(target_arch = "x86_64")]
        ThreadPool::global().run(threads, self.rows.div_ceil(AMX_T), &|p| {
            let w = self.panel(weights, row_bytes, &shape, p);
            // SAFETY: AMX available (checked at `new`, a level never goes
            // away); panel `p`'s rows are this task's alone.
            unsafe { amx_panel(&w, &acts, &shape, p * AMX_T, self.rows, n, out) };
        });
        Ok(())
    }
}

/// A task's unpacked weight rows, kept per thread across calls.
#[derive(Default)]
struct Panel {
    u: Vec<u8>,
    s: Vec<f32>,
    bias: Vec<f32>,
}

impl Panel {
    fn reset(&mut self, u: usize, s: usize, bias: usize) {
        self.u.clear();
        self.u.resize(u, 0);
        self.s.clear();
        self.s.resize(s, 0.0);
        self.bias.clear();
        self.bias.resize(bias, 0.0);
    }
}

thread_local! {
    static PANEL_BF16: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
    static PANEL: std::cell::RefCell<Panel> = std::cell::RefCell::new(Panel::default());
    static PANEL_B: std::cell::RefCell<Panel> = std::cell::RefCell::new(Panel::default());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dequantize;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    macro_rules! unpack_kinds {
        ($($b:ty),*) => {
            /// `scale * q + bias` is the dequantized value for every element
            /// (the GEMM's packed form loses nothing), and `q + OFFSET` lies in
            /// `0..=CODE_MAX` (a byte at most).
            #[test]
            fn unpack_agrees_with_dequantize_for_every_packed_kind() {
                let mut rng = SmallRng::seed_from_u64(11);
                $({
                    for _ in 0..50 {
                        let src: Vec<f32> = (0..<$b>::ELEMS).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
                        let blk = <$b as crate::Quantize>::quantize(&src);
                        let mut want = vec![0f32; <$b>::ELEMS];
                        blk.dequantize(&mut want);
                        let subs = <$b>::ELEMS / <$b>::SUB;
                        let (mut q, mut s, mut b) = (vec![0i8; <$b>::ELEMS], vec![0f32; subs], vec![0f32; subs]);
                        blk.unpack(&mut q, &mut s, &mut b);
                        for e in 0..<$b>::ELEMS {
                            let u = i32::from(q[e]) + <$b>::OFFSET;
                            assert!((0..=<$b>::CODE_MAX).contains(&u), "{}: q {} + offset past CODE_MAX", stringify!($b), q[e]);
                            let got = s[e / <$b>::SUB] * f32::from(q[e]) + b[e / <$b>::SUB];
                            assert_eq!(got, want[e], "{} element {e}", stringify!($b));
                        }
                    }
                })*
            }
        };
    }
    unpack_kinds!(
        BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockIQ4NL, BlockMXFP4, BlockQ2K,
        BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockIQ4XS
    );

    /// The one-pass eight-row packers make `pack_row`'s panel bit for bit:
    /// the same codes in the same interleave, the same scales, and (the
    /// K-quants) the same biases, over rows of three blocks of random weights.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn one_pass_packers_make_pack_row_s_panel() {
        if !Isa::Avx2.is_available() {
            eprintln!("NOT CHECKED: the AVX2 eight-row packers (this CPU lacks AVX2)");
            return;
        }
        let mut rng = SmallRng::seed_from_u64(0x9ac8);
        for &kind in QuantKind::ALL {
            let Some(packer) = pack8_fn(kind, Isa::Avx2) else {
                continue;
            };
            let info = pack_info(kind).expect("a packer implies a panel");
            let cols = 3 * kind.block_elems();
            let subs = cols / info.sub;
            let src: Vec<f32> = (0..8 * cols).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
            let words = aligned(kind, &src);
            let rb = crate::row_bytes(kind, cols).expect("whole blocks");
            let all = &bytemuck::cast_slice::<u64, u8>(&words)[..8 * rb];
            let rows: [&[u8]; 8] = core::array::from_fn(|r| &all[r * rb..(r + 1) * rb]);
            // pack_row's panel, as `Matmul::rows8` builds it from one row at a time.
            let (mut want_u, mut want_s, mut want_b) = (vec![0u8; 8 * cols], vec![0f32; 8 * subs], vec![0f32; 8 * subs]);
            let mut row = vec![0u8; cols];
            for (ri, r) in rows.iter().enumerate() {
                pack_row_into(&info, r, ri, &mut row, &mut want_u, &mut want_s, &mut want_b);
            }
            let (mut u, mut s, mut b) = (vec![0u8; 8 * cols], vec![0f32; 8 * subs], vec![0f32; 8 * subs]);
            // SAFETY: AVX2 checked above; eight rows of whole aligned blocks
            // of one length; `u`, `s` and `b` as large as the panel.
            unsafe {
                match packer {
                    Pack8::Plain(f) => f(&rows, &mut u, &mut s),
                    Pack8::Biased(f) => f(&rows, &mut u, &mut s, &mut b),
                }
            }
            assert!(u == want_u, "{kind}: the packed codes differ from pack_row's");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&s), bits(&want_s), "{kind}: the scales differ from pack_row's");
            if matches!(packer, Pack8::Biased(_)) {
                assert_eq!(bits(&b), bits(&want_b), "{kind}: the biases differ from pack_row's");
            }
        }
    }

    #[test]
    fn every_claimed_gemm_exists_and_nothing_else() {
        for &kind in QuantKind::ALL {
            for &isa in Isa::ALL {
                let claimed = gemm_kernel(kind, isa).is_some();
                let exists =
                    isa.is_compiled() && pack_info(kind).is_some_and(|i| engine(isa, &i).is_some());
                if isa.is_compiled() {
                    assert_eq!(
                        claimed, exists,
                        "{kind} at {isa}: claimed {claimed}, exists {exists}"
                    );
                }
            }
        }
    }

    fn aligned(kind: QuantKind, w: &[f32]) -> Vec<u64> {
        let bytes = crate::quantize_to_vec(kind, w).unwrap();
        let mut v = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(&bytes);
        v
    }

    /// The GEMM against the scalar twin, dot by dot, at shapes that leave
    /// partial row panels, partial register tiles and a padded last chunk.
    #[test]
    fn gemm_matches_the_scalar_twin_for_every_claimed_kind() {
        for &isa in Isa::ALL {
            let claimed: Vec<QuantKind> = QuantKind::ALL
                .iter()
                .copied()
                .filter(|&k| gemm_fn(k, isa).is_some())
                .collect();
            if claimed.is_empty() {
                continue;
            }
            if !isa.is_available() {
                eprintln!("NOT CHECKED: the {isa} GEMM (this CPU or OS lacks it)");
                continue;
            }
            check_gemm_level(isa, claimed);
        }
    }

    /// The bf16 product against its twin: the stored weights dequantized and
    /// the activations, both rounded to bf16 here, multiplied and summed in
    /// f64. What may differ is the f32 accumulation order and, rarely, one
    /// bf16 rounding of a weight whose f32 value the kernel forms by a fused
    /// multiply-add: both far inside 2^-12 of sum |w x|.
    /// f32 → bf16, round to nearest even (as `vcvtneps2bf16`); NaN stays NaN.
    fn bf16_bits(x: f32) -> u16 {
        let b = x.to_bits();
        if x.is_nan() {
            return ((b >> 16) as u16) | 0x40;
        }
        ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
    }

    fn check_bf16_product(kind: QuantKind, wb: &[u8], rows: usize, cols: usize, x: &[f32], y: &[f32]) {
        let bf = |v: f32| f64::from(f32::from_bits(u32::from(bf16_bits(v)) << 16));
        let mut w = vec![0f32; rows * cols];
        crate::dequantize(kind, wb, &mut w).unwrap();
        let n = x.len() / cols;
        for c in 0..n {
            for r in 0..rows {
                let (wr, xr) = (&w[r * cols..(r + 1) * cols], &x[c * cols..(c + 1) * cols]);
                let twin: f64 = wr.iter().zip(xr).map(|(&a, &b)| bf(a) * bf(b)).sum();
                let mag: f64 = wr.iter().zip(xr).map(|(&a, &b)| (bf(a) * bf(b)).abs()).sum();
                let got = f64::from(y[c * rows + r]);
                let bound = mag / 4096.0 + 1e-6;
                assert!(
                    (got - twin).abs() <= bound,
                    "{kind} bf16 GEMM, {rows}x{cols} n={n}: row {r} token {c}: {got} vs twin {twin} (bound {bound})"
                );
            }
        }
    }

    /// The bf16 product over the interleaved Q8_0 copy is the stored
    /// matrix's (read in place, widened per call) bit for bit, and inside
    /// the bf16 twin's bound; an odd number of 16-row groups and a partial
    /// token tile included.
    #[test]
    fn interleaved_q8_0_bf16_product_equals_the_stored_matrix_s() {
        let mut rng = SmallRng::seed_from_u64(13);
        let isa = Isa::detect();
        let (rows, cols, n) = (48usize, 640usize, 70usize);
        let w: Vec<f32> = (0..rows * cols).map(|_| rng.gen_range(-1.0..1.0)).collect();
        let wq = aligned(QuantKind::Q8_0, &w);
        let wb = &bytemuck::cast_slice::<u64, u8>(&wq)[..crate::row_bytes(QuantKind::Q8_0, cols).unwrap() * rows];
        let x: Vec<f32> = (0..n * cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
        let m = crate::matvec::InterleavedQ8_0::new(isa, wb, rows, cols).unwrap();
        let mut got = vec![f32::NAN; n * rows];
        if !m.map_or(Ok(false), |m| m.matmul_bf16(&x, &mut got, n, 2)).unwrap() {
            eprintln!("NOT CHECKED: the interleaved bf16 product needs AMX-BF16, which this CPU (or OS) lacks");
            return;
        }
        check_bf16_product(QuantKind::Q8_0, wb, rows, cols, &x, &got);
        let pm = PackedMatrix::new(isa, QuantKind::Q8_0, wb, rows, cols, 2).unwrap().unwrap();
        let mut want = vec![f32::NAN; n * rows];
        pm.matmul(wb, &x, &mut want, n, 2, true).unwrap();
        for (i, (a, b)) in want.iter().zip(&got).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "token {} row {}: copy {b} vs stored {a}", i / rows, i % rows);
        }
    }

    fn check_gemm_level(isa: Isa, claimed: Vec<QuantKind>) {
        let mut rng = SmallRng::seed_from_u64(12);
        for kind in claimed {
            let be = kind.block_elems();
            let cols = if be == QK_K {
                2 * QK_K
            } else {
                3 * 32 + 64 * 2
            }; // 224: not a multiple of 64
            // The last shape is extreme: every weight +1 but the first of each
            // 32 (-1, so the kinds with a signed scale put +1 at their top
            // code), every activation +1 (127): the largest pair sums, where a
            // 16-bit sum of too many products would saturate.
            for (rows, n, extreme) in [(37, 9, false), (16, 8, false), (5, 13, false), (19, 35, false), (37, 64, false), (21, 81, false), (11, 6, true)] {
                let w: Vec<f32> = (0..rows * cols)
                    .map(|e| if !extreme { rng.gen_range(-1.0..1.0) } else if e % 32 == 0 { -1.0 } else { 1.0 })
                    .collect();
                let wq = aligned(kind, &w);
                let rb = crate::row_bytes(kind, cols).unwrap();
                let wb = &bytemuck::cast_slice::<u64, u8>(&wq)[..rb * rows];
                let x: Vec<f32> = (0..n * cols).map(|_| if extreme { 1.0 } else { rng.gen_range(-2.0..2.0) }).collect();
                let mut y = vec![f32::NAN; n * rows];
                assert!(
                    matmul(isa, kind, wb, rows, cols, &x, &mut y, n, 2, false).unwrap(),
                    "{kind}: claimed but not run"
                );
                // Packed per call with bf16 allowed: the bf16 product where
                // the batch and the CPU take it, else the integer path's sums.
                let mut yb = vec![f32::NAN; n * rows];
                matmul(isa, kind, wb, rows, cols, &x, &mut yb, n, 2, true).unwrap();
                if bf16_per_call(kind, isa, cols, n) {
                    check_bf16_product(kind, wb, rows, cols, &x, &yb);
                } else {
                    assert_eq!(yb, y, "{kind} at {isa}, n={n}: bf16 allowed but not taken, yet the sums differ");
                }
                if let Some(pm) = PackedMatrix::new(isa, kind, wb, rows, cols, 2).unwrap() {
                    let mut yp = vec![f32::NAN; n * rows];
                    pm.matmul(wb, &x, &mut yp, n, 2, true).unwrap();
                    if n >= BF16_MIN_BATCH && amx_bf16(cols) {
                        check_bf16_product(kind, wb, rows, cols, &x, &yp);
                        // Without bf16 (a server's exact products): the integer path.
                        let mut yi = vec![f32::NAN; n * rows];
                        pm.matmul(wb, &x, &mut yi, n, 2, false).unwrap();
                        assert_eq!(yi, y, "{kind}: prepacked integer GEMM at n={n} differs from per-call packing");
                    } else {
                        // Packed at load or per call: the same arithmetic, bit for bit.
                        assert_eq!(yp, y, "{kind}: prepacked AMX GEMM differs from per-call packing");
                    }
                } else {
                    assert_ne!(isa, Isa::Amx, "{kind}: AMX claims a GEMM but packs nothing at load");
                }
                let act = kind.vec_dot_kind().unwrap();
                for c in 0..n {
                    let xq = aligned(act, &x[c * cols..(c + 1) * cols]);
                    let xb = &bytemuck::cast_slice::<u64, u8>(&xq)
                        [..crate::row_bytes(act, cols).unwrap()];
                    for r in 0..rows {
                        let want =
                            crate::scalar::vec_dot(kind, &wb[r * rb..(r + 1) * rb], xb).unwrap();
                        let got = y[c * rows + r];
                        let tol = 2e-4 * want.abs().max(1.0);
                        assert!((got - want).abs() <= tol, "{kind} at {isa}, {rows}x{cols} n={n}: row {r} token {c}: {got} vs scalar {want}");
                    }
                }
            }
        }
    }
}
