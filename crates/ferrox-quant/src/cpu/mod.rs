//! CPU dot-product kernels, picked at run time per instruction set.
//!
//! The key decision: **two tables, one test**. [`simd_kernel`] says what each
//! `(kind, Isa)` pair *claims* (a name, written by hand), [`dot_fn`] says what
//! *exists* (a function pointer); `every_claimed_kernel_is_dispatched_and_nothing_else`
//! ties them over `QuantKind::ALL` x [`Isa::ALL`], and every claimed SIMD
//! kernel is compared with its scalar twin (`scalar::vec_dot`). A kind with
//! no SIMD kernel for an Isa falls back down the chain (AVX-512 → AVX2 →
//! scalar) in [`select`], so every weight kind can be launched on every CPU.
//!
//! Activations are quantized exactly as ggml does (the kind's `vec_dot_type`);
//! the SIMD quantizers are byte-exact with the scalar [`crate::Quantize`]
//! because a one-ulp difference in a Q8 activation changes every dot.

use crate::blocks::*;
use crate::{QuantError, QuantKind, VecDot};

mod pool;
mod vecops;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;
#[cfg(target_arch = "aarch64")]
mod neon;

#[cfg(test)]
mod tests;

pub use pool::ThreadPool;
pub use vecops::{attn_scores, attn_values, axpy_f32_f16, dot_f32_f16, softmax};

/// An instruction-set level a kernel is written for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Isa {
    /// Portable Rust: the scalar twins in [`crate::scalar`].
    Scalar,
    /// x86-64 AVX2 + FMA + F16C (Haswell, Zen 1 and later).
    Avx2,
    /// x86-64 AVX-512 F/BW/VL + VNNI (Ice Lake, Zen 4 and later).
    Avx512Vnni,
    /// x86-64 AVX-512 VNNI + AMX-TILE/AMX-INT8 (Sapphire Rapids and later),
    /// with the tile state granted by the OS. Only the batched GEMM has AMX
    /// kernels; everything else falls back to [`Isa::Avx512Vnni`].
    Amx,
    /// aarch64 NEON (+ dotprod where present).
    Neon,
}

impl Isa {
    /// Every level, scalar first.
    pub const ALL: &'static [Isa] = &[Isa::Scalar, Isa::Avx2, Isa::Avx512Vnni, Isa::Amx, Isa::Neon];

    /// The name `FERROX_CPU_ISA` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::Avx512Vnni => "avx512",
            Isa::Amx => "amx",
            Isa::Neon => "neon",
        }
    }

    /// Parses a `FERROX_CPU_ISA` value.
    pub fn from_name(s: &str) -> Option<Isa> {
        Isa::ALL.iter().copied().find(|i| i.name().eq_ignore_ascii_case(s))
    }

    /// Whether this CPU can run kernels of this level.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => {
                Isa::Avx2.is_available()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Amx => Isa::Avx512Vnni.is_available() && x86::amx::usable(),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)] // the other architecture's levels
            _ => false,
        }
    }

    /// Whether this build has kernels of this level at all (x86 levels on
    /// x86-64, NEON on aarch64); the capability table is not gated, so tests
    /// compare it with dispatch only for compiled levels.
    pub const fn is_compiled(self) -> bool {
        match self {
            Isa::Scalar => true,
            Isa::Avx2 | Isa::Avx512Vnni | Isa::Amx => cfg!(target_arch = "x86_64"),
            Isa::Neon => cfg!(target_arch = "aarch64"),
        }
    }

    /// The level to fall back to when this one has no kernel for a kind.
    pub const fn fallback(self) -> Option<Isa> {
        match self {
            Isa::Scalar => None,
            Isa::Avx2 | Isa::Neon => Some(Isa::Scalar),
            Isa::Avx512Vnni => Some(Isa::Avx2),
            Isa::Amx => Some(Isa::Avx512Vnni),
        }
    }

    /// The best level this CPU has, detected once; `FERROX_CPU_ISA` can lower
    /// it (benchmarks and users compare levels on one machine). A value that
    /// is not a level, or a level this CPU lacks (running it would be
    /// undefined behaviour), is [`Isa::configured`]'s error, which every
    /// backend's open and the `ferrox` binary check first; reaching a kernel
    /// past them with a bad value panics with that error rather than run
    /// another level than the one asked for.
    pub fn active() -> Isa {
        Isa::configured().unwrap_or_else(|e| panic!("{e}"))
    }

    /// The level `FERROX_CPU_ISA` asks for (unset: [`Isa::detect`]), read
    /// and checked once.
    pub fn configured() -> Result<Isa, crate::knob::BadValue> {
        static ACTIVE: std::sync::OnceLock<Result<Isa, crate::knob::BadValue>> = std::sync::OnceLock::new();
        ACTIVE
            .get_or_init(|| {
                let value = crate::knob::raw("FERROX_CPU_ISA")?;
                Isa::parse_level(value.as_deref())
            })
            .clone()
    }

    /// A `FERROX_CPU_ISA` value as a level this CPU has (`None`: the best).
    pub fn parse_level(value: Option<&str>) -> Result<Isa, crate::knob::BadValue> {
        let has: Vec<&str> = Isa::ALL.iter().filter(|i| i.is_available()).map(|i| i.name()).collect();
        let expected = format!("a level this CPU has: {}", has.join(", "));
        let level = crate::knob::parse_with("FERROX_CPU_ISA", value, &expected, |v| {
            Isa::from_name(v).filter(|i| i.is_available())
        })?;
        Ok(level.unwrap_or_else(Isa::detect))
    }

    /// The level whose dot kernels this level runs: itself, except AMX,
    /// which has GEMM kernels only and runs AVX-512's dot products by design
    /// (so that is no fallback to report).
    pub const fn dot_level(self) -> Isa {
        match self {
            Isa::Amx => Isa::Avx512Vnni,
            other => other,
        }
    }

    /// Whether this level has `other`'s instructions (it is `other` or falls
    /// back to it).
    pub fn includes(self, other: Isa) -> bool {
        let mut level = Some(self);
        while let Some(i) = level {
            if i == other {
                return true;
            }
            level = i.fallback();
        }
        false
    }

    /// The best level this CPU has, ignoring the environment.
    pub fn detect() -> Isa {
        [Isa::Amx, Isa::Avx512Vnni, Isa::Avx2, Isa::Neon]
            .into_iter()
            .find(|i| i.is_available())
            .unwrap_or(Isa::Scalar)
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A dot product of one weight row with one activation row, as raw bytes.
///
/// # Safety
/// - the CPU supports the [`Isa`] the pointer was obtained for;
/// - `w` is whole blocks of the weight kind and `a` whole blocks of its
///   `vec_dot_kind`, holding the same number of elements;
/// - both are aligned for their block structs (checked once per matrix by
///   [`crate::matvec`], not per row, since rows can be 20 blocks short);
/// - quantized activations come from the ggml quantizer, so their `qs` lie
///   in `-127..=127` (the sign trick of the 8-bit kernels needs it).
pub type DotFn = unsafe fn(w: &[u8], a: &[u8]) -> f32;

/// What the scalar level claims: every kind with a dot product.
const SCALAR_KERNEL: &str = "scalar::vec_dot";

/// The kernel `(kind, isa)` claims, by name, or `None`: the capability
/// table, written by hand and independent of [`dot_fn`] so a test can catch
/// either drifting. Partial by design.
pub fn simd_kernel(kind: QuantKind, isa: Isa) -> Option<&'static str> {
    use QuantKind::*;
    match isa {
        Isa::Scalar => kind.vec_dot_kind().map(|_| SCALAR_KERNEL),
        Isa::Avx2 => match kind {
            F32 => Some("avx2::dot_f32"),
            F16 => Some("avx2::dot_f16"),
            BF16 => Some("avx2::dot_bf16"),
            Q8_0 => Some("avx2::dot_q8_0_q8_0"),
            Q4_0 => Some("avx2::dot_q4_0_q8_0"),
            Q5_0 => Some("avx2::dot_q5_0_q8_0"),
            Q4_1 => Some("avx2::dot_q4_1_q8_1"),
            Q5_1 => Some("avx2::dot_q5_1_q8_1"),
            IQ4NL => Some("avx2::dot_iq4_nl_q8_0"),
            MXFP4 => Some("avx2::dot_mxfp4_q8_0"),
            Q2K => Some("avx2::dot_q2_k_q8_k"),
            Q3K => Some("avx2::dot_q3_k_q8_k"),
            Q4K => Some("avx2::dot_q4_k_q8_k"),
            Q5K => Some("avx2::dot_q5_k_q8_k"),
            Q6K => Some("avx2::dot_q6_k_q8_k"),
            IQ4XS => Some("avx2::dot_iq4_xs_q8_k"),
            _ => None, // capability table: partial by design
        },
        Isa::Avx512Vnni => match kind {
            Q8_0 => Some("avx512::dot_q8_0_q8_0"),
            Q4_0 => Some("avx512::dot_q4_0_q8_0"),
            Q5_0 => Some("avx512::dot_q5_0_q8_0"),
            Q5_1 => Some("avx512::dot_q5_1_q8_1"),
            IQ4NL => Some("avx512::dot_iq4_nl_q8_0"),
            MXFP4 => Some("avx512::dot_mxfp4_q8_0"),
            Q4K => Some("avx512::dot_q4_k_q8_k"),
            Q5K => Some("avx512::dot_q5_k_q8_k"),
            Q6K => Some("avx512::dot_q6_k_q8_k"),
            Q3K => Some("avx512::dot_q3_k_q8_k"),
            Q2K => Some("avx512::dot_q2_k_q8_k"),
            _ => None, // capability table: partial by design
        },
        Isa::Amx => None, // no dot kernels of its own: AVX-512's serve (fallback)
        Isa::Neon => match kind {
            F32 => Some("neon::dot_f32"),
            F16 => Some("neon::dot_f16"),
            BF16 => Some("neon::dot_bf16"),
            Q8_0 => Some("neon::dot_q8_0_q8_0"),
            Q4_0 => Some("neon::dot_q4_0_q8_0"),
            Q4_1 => Some("neon::dot_q4_1_q8_1"),
            Q5_0 => Some("neon::dot_q5_0_q8_0"),
            Q5_1 => Some("neon::dot_q5_1_q8_1"),
            IQ4NL => Some("neon::dot_iq4_nl_q8_0"),
            MXFP4 => Some("neon::dot_mxfp4_q8_0"),
            Q2K => Some("neon::dot_q2_k_q8_k"),
            Q3K => Some("neon::dot_q3_k_q8_k"),
            Q4K => Some("neon::dot_q4_k_q8_k"),
            Q5K => Some("neon::dot_q5_k_q8_k"),
            Q6K => Some("neon::dot_q6_k_q8_k"),
            IQ4XS => Some("neon::dot_iq4_xs_q8_k"),
            _ => None, // capability table: partial by design
        },
    }
}

/// Reinterprets whole, aligned blocks as a slice.
///
/// # Safety
/// `bytes` is aligned for `B` and its length a multiple of `size_of::<B>()`
/// (the [`DotFn`] contract).
#[inline(always)]
pub(crate) unsafe fn blocks_of<B: Block>(bytes: &[u8]) -> &[B] {
    // SAFETY: B is Pod (any bytes are a valid B); alignment and length are
    // the caller's contract.
    unsafe { core::slice::from_raw_parts(bytes.as_ptr().cast::<B>(), bytes.len() / core::mem::size_of::<B>()) }
}

/// The `R` consecutive rows of `w` (`R` x `row_bytes`) as blocks of `B`:
/// the four-row kernels' operands.
///
/// # Safety
/// Each row is as [`blocks_of`] requires; `w` holds `R * row_bytes` bytes.
#[inline]
#[cfg(target_arch = "x86_64")]
pub(crate) unsafe fn rows_n<B: Block, const R: usize>(w: &[u8], row_bytes: usize) -> [&[B]; R] {
    // SAFETY: the caller's contract, row by row.
    core::array::from_fn(|r| unsafe { blocks_of::<B>(&w[r * row_bytes..(r + 1) * row_bytes]) })
}

/// The scalar twin behind a [`DotFn`].
///
/// # Safety
/// The [`DotFn`] contract (no CPU feature needed).
unsafe fn scalar_dot<B: VecDot>(w: &[u8], a: &[u8]) -> f32 {
    // SAFETY: forwarded DotFn contract: aligned whole blocks.
    let (w, a) = unsafe { (blocks_of::<B>(w), blocks_of::<B::Act>(a)) };
    B::vec_dot(w, a)
}

macro_rules! scalar_dot_table {
    ($($k:ident => $b:ty),* $(,)?) => {
        fn scalar_dot_fn(kind: QuantKind) -> Option<DotFn> {
            match kind {
                $(QuantKind::$k => Some(scalar_dot::<$b> as DotFn),)*
                #[allow(unreachable_patterns)] // capability table: partial by design
                _ => None,
            }
        }
    };
}
crate::scalar::with_dot_kinds!(scalar_dot_table);

macro_rules! block_align_table {
    ($(($v:ident, $name:literal, $id:literal, $elems:literal, $block:ty, $dot:expr)),* $(,)?) => {
        /// Alignment of `kind`'s block struct (what its rows need).
        pub(crate) const fn block_align(kind: QuantKind) -> usize {
            match kind {
                $(QuantKind::$v => core::mem::align_of::<$block>(),)*
            }
        }
    };
}
crate::quant_kinds!(block_align_table);

/// Whether `bytes` starts where a block of `kind` may start (what every
/// kernel's block casts rely on).
pub(crate) fn check_aligned(kind: QuantKind, bytes: &[u8]) -> Result<(), QuantError> {
    let (addr, align) = (bytes.as_ptr() as usize, block_align(kind));
    if addr.is_multiple_of(align) {
        Ok(())
    } else {
        Err(QuantError::Misaligned { kind, addr, align })
    }
}

/// The kernel that exists for `(kind, isa)`, with no fallback: the dispatch
/// table. Partial by design; must agree with [`simd_kernel`].
pub fn dot_fn(kind: QuantKind, isa: Isa) -> Option<DotFn> {
    match isa {
        Isa::Scalar => scalar_dot_fn(kind),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::avx2_dot_fn(kind),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => x86::avx512_dot_fn(kind),
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => neon::dot_fn(kind),
        #[allow(unreachable_patterns)] // levels with no kernels on this architecture
        _ => None,
    }
}

/// A kernel chosen for a kind on this CPU.
#[derive(Clone, Copy)]
pub struct Kernel {
    /// The level the kernel is written for (may be below the one asked for).
    pub isa: Isa,
    /// Its name in the capability table.
    pub name: &'static str,
    /// The function; calling it needs `isa` to be available.
    pub f: DotFn,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Kernel({}, {})", self.isa, self.name)
    }
}

/// The best kernel for `kind` at level `isa` or below, or `None` when the
/// kind has no dot product at all (integers, F64).
pub fn select(kind: QuantKind, isa: Isa) -> Option<Kernel> {
    let mut level = Some(isa);
    while let Some(i) = level {
        if let (Some(name), Some(f)) = (simd_kernel(kind, i), dot_fn(kind, i)) {
            return Some(Kernel { isa: i, name, f });
        }
        level = i.fallback();
    }
    None
}

/// How far ahead, in rows, matvecs prefetch weights: one core keeps more DRAM
/// reads in flight than its hardware prefetcher would. Shared by the
/// four-row kernels and the one-row path of `matvec` (`prefetch_row`, into
/// L2). The 32-element kinds' four-row kernels prefetch into L2 too
/// (262144x640 Q8_0 head, 2 threads, into L1: none 14.1 GB/s, 4 rows 20.0,
/// 8 rows 21.7, 16 rows 21.2; into L2 about 10% more, 8 rows as good as any
/// of 4–24); the K kinds' (`avx512::prefetch_block`) into L1, measured the
/// same either way on Gemma's files.
pub(crate) const PREFETCH_ROWS: usize = 8;

/// An activation row's per-block scales (f32) and quant sums, computed once
/// per matvec for the four-row kernels (Q8_0 rows; a Q8_K row needs none).
#[derive(Debug, Default, Clone)]
pub struct ActPrep {
    /// Block scales.
    pub d: Vec<f32>,
    /// Sums of each block's quants.
    pub sum: Vec<i32>,
    /// Q8_1 only: each block's stored `d * sum` (its f16 `s`), for the
    /// weight kinds with a per-block min.
    pub s: Vec<f32>,
    /// The blocks' quants without their scales, 32 bytes a block, padded
    /// with zeros to an even block count: two blocks are one 64-byte load
    /// for the 512-bit four-row kernels of the 32-element kinds.
    pub qs: Vec<i8>,
}

impl ActPrep {
    /// Prepares an activation row of `act` for the four-row kernels: Q8_0
    /// as [`ActPrep::q8_0`], Q8_1 as [`ActPrep::q8_1`]; Q8_K is only checked
    /// (whole, aligned blocks), since its blocks already hold an f32 scale
    /// and 16-element sums.
    pub fn prepare(&mut self, act: QuantKind, a: &[u8]) -> Result<(), CpuError> {
        match act {
            QuantKind::Q8_0 => self.q8_0(a),
            QuantKind::Q8_1 => self.q8_1(a),
            QuantKind::Q8K => {
                check_aligned(act, a)?;
                let bb = act.block_bytes();
                if !a.len().is_multiple_of(bb) {
                    return Err(CpuError::Shape { what: "Q8_K activation bytes", expected: a.len() / bb * bb, got: a.len() });
                }
                self.d.clear();
                self.sum.clear();
                self.s.clear();
                self.qs.clear();
                Ok(())
            }
            _ => Err(QuantError::NoDot { kind: act }.into()), // capability table: the preps that exist
        }
    }

    /// Prepares a Q8_0 activation row (whole, aligned blocks).
    pub fn q8_0(&mut self, a: &[u8]) -> Result<(), CpuError> {
        self.blocks::<BlockQ8_0>(QuantKind::Q8_0, a, |b| (b.d.to_f32(), &b.qs, None))
    }

    /// Prepares a Q8_1 activation row (whole, aligned blocks): as Q8_0, and
    /// each block's stored `s` (`d * sum`, f16) for the min term.
    pub fn q8_1(&mut self, a: &[u8]) -> Result<(), CpuError> {
        self.blocks::<BlockQ8_1>(QuantKind::Q8_1, a, |b| (b.d.to_f32(), &b.qs, Some(b.s.to_f32())))
    }

    /// The blocks of `a` (kind `kind`, whole and aligned: checked) into the
    /// prepared arrays; `parts` gives a block's scale, 32 codes and stored `s`.
    fn blocks<B: Block>(&mut self, kind: QuantKind, a: &[u8], parts: impl Fn(&B) -> (f32, &[i8; 32], Option<f32>)) -> Result<(), CpuError> {
        check_aligned(kind, a)?;
        let bb = core::mem::size_of::<B>();
        if !a.len().is_multiple_of(bb) {
            return Err(CpuError::Shape { what: "activation bytes", expected: a.len() / bb * bb, got: a.len() });
        }
        // SAFETY: aligned (checked) whole blocks (checked).
        let blocks = unsafe { blocks_of::<B>(a) };
        self.d.clear();
        self.sum.clear();
        self.s.clear();
        self.qs.clear();
        for b in blocks {
            let (d, qs, s) = parts(b);
            self.d.push(d);
            self.sum.push(qs.iter().map(|&q| i32::from(q)).sum());
            self.s.extend(s);
            self.qs.extend_from_slice(qs);
        }
        self.qs.resize(blocks.len().next_multiple_of(2) * 32, 0);
        Ok(())
    }
}

/// Four consecutive weight rows (`w`, 4 x `row_bytes`) against one
/// activation row `a` prepared as `p`.
///
/// # Safety
/// The [`DotFn`] contract for each row, and `p` prepared from `a`.
pub type Dot4Fn = unsafe fn(w: &[u8], row_bytes: usize, a: &[u8], p: &ActPrep) -> [f32; 4];

/// The four-row kernel `(kind, isa)` claims, by name (hand-written; a test
/// ties it to [`dot4_fn`]). Only kinds whose activation [`ActPrep::prepare`]
/// takes: Q8_0 and Q8_1 (prepared) and Q8_K (carries its f32 scale and sums itself).
pub fn dot4_kernel(kind: QuantKind, isa: Isa) -> Option<&'static str> {
    use QuantKind::*;
    match (isa, kind) {
        (Isa::Avx2, Q4_0) => Some("avx2::dot4_q4_0"),
        (Isa::Avx2, Q5_0) => Some("avx2::dot4_q5_0"),
        (Isa::Avx2, IQ4NL) => Some("avx2::dot4_iq4_nl"),
        (Isa::Avx512Vnni, Q8_0) => Some("avx512::dot4_q8_0"),
        (Isa::Avx512Vnni, Q4_0) => Some("avx512::dot4_q4_0"),
        (Isa::Avx512Vnni, Q5_0) => Some("avx512::dot4_q5_0"),
        (Isa::Avx512Vnni, Q5_1) => Some("avx512::dot4_q5_1"),
        (Isa::Avx512Vnni, IQ4NL) => Some("avx512::dot4_iq4_nl"),
        (Isa::Avx512Vnni, Q4K) => Some("avx512::dot4_q4_k"),
        (Isa::Avx512Vnni, Q5K) => Some("avx512::dot4_q5_k"),
        (Isa::Avx512Vnni, Q6K) => Some("avx512::dot4_q6_k"),
        (Isa::Avx512Vnni, Q3K) => Some("avx512::dot4_q3_k"),
        (Isa::Avx512Vnni, Q2K) => Some("avx512::dot4_q2_k"),
        _ => None, // capability table: partial by design
    }
}

/// The four-row kernel that exists for `(kind, isa)`, with no fallback.
pub fn dot4_fn(kind: QuantKind, isa: Isa) -> Option<Dot4Fn> {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::avx2_dot4_fn(kind),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => x86::avx512_dot4_fn(kind),
        _ => None,
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::amx;

/// Up to eight tokens against one F16 weight row per call, each token's sum
/// bit-identical to the one-row F16 kernel's (`m` tokens at `a + t *
/// stride` floats, widened from their F16 activations; results in
/// `out[..m]`). See `x86::avx512::dot_f16_rows` and `x86::avx2::dot_f16_rows`.
///
/// # Safety
/// The level it was obtained for is available; `w` is whole F16 elements
/// and every activation row holds as many floats.
pub(crate) type F16RowsFn = unsafe fn(w: &[u8], a: *const f32, stride: usize, m: usize, out: &mut [f32; 8]);

/// The several-token F16 row kernel of `isa`, if it has one: the x86
/// levels (AVX-512's 32 registers hold eight tokens' sums, AVX2's sixteen
/// three at a time).
pub(crate) fn f16_rows_fn(isa: Isa) -> Option<F16RowsFn> {
    #[cfg(target_arch = "x86_64")]
    if isa.includes(Isa::Avx512Vnni) && isa.is_available() {
        return Some(x86::avx512_f16_rows);
    }
    #[cfg(target_arch = "x86_64")]
    if isa.includes(Isa::Avx2) && isa.is_available() {
        return Some(x86::avx2_f16_rows);
    }
    let _ = isa;
    None
}


/// Errors of the CPU kernels.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CpuError {
    /// A block-format error (lengths, alignment, kinds without a dot).
    #[error(transparent)]
    Quant(#[from] QuantError),
    /// An instruction-set level this CPU lacks.
    #[error("this CPU cannot run {isa} kernels")]
    IsaUnavailable {
        /// The level asked for.
        isa: Isa,
    },
    /// Matrix and vector shapes that do not fit together.
    #[error("shape mismatch: {what}: expected {expected}, got {got}")]
    Shape {
        /// Which operand.
        what: &'static str,
        /// Length it should have.
        expected: usize,
        /// Length given.
        got: usize,
    },
}

/// Checks a weight row and an activation row for a [`DotFn`] of `kind`.
pub(crate) fn check_dot_operands(kind: QuantKind, w: &[u8], a: &[u8]) -> Result<usize, CpuError> {
    let act = kind.vec_dot_kind().ok_or(QuantError::NoDot { kind })?;
    let wb = kind.block_bytes();
    if !w.len().is_multiple_of(wb) {
        return Err(CpuError::Shape { what: "weight bytes", expected: w.len() / wb * wb, got: w.len() });
    }
    let n = w.len() / wb * kind.block_elems();
    let expected = crate::row_bytes(act, n)?;
    if a.len() != expected {
        return Err(CpuError::Shape { what: "activation bytes", expected, got: a.len() });
    }
    check_aligned(kind, w)?;
    check_aligned(act, a)?;
    Ok(n)
}

/// A checked dot product of one weight row with one quantized activation
/// row, with the best kernel at level `isa` or below.
pub fn vec_dot(kind: QuantKind, isa: Isa, w: &[u8], a: &[u8]) -> Result<f32, CpuError> {
    if !isa.is_available() {
        return Err(CpuError::IsaUnavailable { isa });
    }
    check_dot_operands(kind, w, a)?;
    let k = select(kind, isa).ok_or(QuantError::NoDot { kind })?;
    // SAFETY: `k.isa` is `isa` or a fallback of it, both available (checked
    // above; every fallback is a subset); operands checked just now.
    Ok(unsafe { (k.f)(w, a) })
}

/// Quantizes an activation row `x` into `out` as `act` (a `vec_dot_kind`),
/// with SIMD where level `isa` has it. Byte-exact with
/// [`crate::quantize_activation`] (ggml's CPU `from_float`, which for Q8_0
/// and Q8_1 rounds ties to even, unlike the weight quantizer).
pub fn quantize_act(act: QuantKind, isa: Isa, x: &[f32], out: &mut [u8]) -> Result<(), CpuError> {
    if !isa.is_available() {
        return Err(CpuError::IsaUnavailable { isa });
    }
    let expected = crate::row_bytes(act, x.len())?;
    if out.len() != expected {
        return Err(CpuError::Shape { what: "quantized activation bytes", expected, got: out.len() });
    }
    check_aligned(act, out)?;
    #[cfg(target_arch = "x86_64")]
    if isa.includes(Isa::Avx2) && x86::quantize_act_avx2(act, x, out) {
        return Ok(());
    }
    crate::quantize_activation(act, x, out)?;
    Ok(())
}
