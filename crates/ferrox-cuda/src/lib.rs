//! The CUDA backend's device layer: kernels as CUDA C compiled at run time,
//! buffers on one stream, nothing CUDA needed to build.
//!
//! The decision: the driver, NVRTC and cuBLAS are `dlopen()`ed at run time
//! (cudarc's dynamic loading), and every kernel is CUDA C in
//! `kernels.cu`, compiled by NVRTC at first use for the device's own
//! architecture and cached on disk. So this crate builds and tests on any
//! machine; [`compile_check`] compiles every kernel for sm_90 with NVRTC
//! alone (no GPU), which is how CI keeps a kernel that does not compile from
//! landing. A [`Device`] is opened explicitly (no hidden global) and owns
//! one stream; every operation is enqueued on it, so ordering is the
//! stream's and only [`Device::read`] waits.
//!
//! This crate imports `ferrox-quant` (for [`QuantKind`]) and never
//! `ferrox-core`: the seam (`ferrox_core::backend::cuda`) sits on top.
//!
//! # The kernels (`kernels.cu`)
//!
//! Every kernel is CUDA C with no headers. The measuring knobs named below
//! (`FERROX_CUDA_*` at run time, `FERROX_CUDA_DEFINES` at compile time) are
//! listed in `docs/dev/cuda-knobs.md` and read only in a build with the
//! `measure` feature (without it each is its measured default, fixed at
//! compile time: `docs/dev/configuration.md`); why each design was kept, and
//! what was tried instead, with its numbers, is in `docs/decisions/`.
//!
//! **Weight kinds.** A kind is one `deq_<kind>` that expands a 32-element
//! unit; `DEFINE_KIND` builds its matvec, get_rows and dequantize-to-f16
//! (the GEMM is that plus cuBLAS), so every weight kind the CPU has has one
//! (all but F64 and the integer kinds). 16-entry code tables (IQ4_NL/IQ4_XS,
//! MXFP4, NVFP4) are four words in registers read with `__byte_perm`
//! (`lut16`): lanes reading different entries of a `__constant__` array
//! serialize. The IQ1/IQ2/IQ3 lattice grids are `static __device__ const`
//! arrays read with `__ldg`, which `compile.rs` prints from ferrox-quant's
//! `scalar::iq_grids` before `kernels.cu`: one source of truth, and the PTX
//! cache key hashes them.
//!
//! **Decode kinds and int8 activations.** Q4_0, Q5_0, Q8_0, Q4_K and Q6_K
//! also have an `ld_<kind>` (a unit's weight loads, read-only, into a small
//! struct) and a `dot_<kind>` (that unit against its int8 activations,
//! `__dp4a`). Their matvecs read the activations from a q8 buffer written
//! once per input (`quant_lane`, fused into `add_rms_norm`, `glu`, the
//! gate/up matvec and the grouped attention's fast path, else one
//! `quantize_q8` launch). Q4_0, Q8_0 and Q6_K rows are stored repacked on
//! the device (quants block after block, 16-byte aligned, then the f16
//! scales), Q4_K rows too (each unit's 16 quant bytes in Q4_0's nibble
//! order, then the blocks' 16-byte heads: two loads a unit, not three);
//! every `deq_`/`dot_` of those kinds reads that layout.
//!
//! **Small batches on the tensor cores** (`mmq_<kind>_n<t>`, the int8 kinds,
//! sm_80+): batches of 9 to `MMA_MAX_TOKENS` (128) tokens, in pieces of up
//! to 64. A warp takes 16 rows and every token; each lane decodes one
//! 32-element unit of two rows into f16x2 mma fragments in registers (its
//! `load` and `dec` apart, so the next group's bytes are in flight while this
//! one's multiply), and since the k order inside an mma is free, the
//! activations' fragment is 8 contiguous bytes of their f16 copy, which the
//! block stages in shared memory a 128-column group at a time (two stages,
//! cp.async). Blocks split k where rows are few and `mmq_reduce` adds the
//! splits in order. Larger batches dequantize to f16 and call cuBLAS
//! (docs/decisions/0041).
//!
//! **Streaming decode matvecs** (`mmvq_stream_<kind>`, and for F16
//! `matvec_f16_stream` / `matvec_f16_glu_stream`). A warp takes a row; the
//! grid is one wave of blocks (two 256-thread blocks an SM,
//! `__launch_bounds__(256, 2)`) whose warps stride over the rows; a lane
//! holds two steps of loads in registers and issues the next step's (the
//! next row's, across a row's end) before the current step's dots, the first
//! two steps loaded before `PDL_ENTER`. Loads past a row's end are clamped
//! (unconditional) and their dots dropped. F16 warps start their row at a
//! rotated step (warps at the same step of 16 KiB rows were ~10% slower).
//! The matvecs share one loop, `mats_stream` (a kind gives its step's `load`
//! and `dots`); the F16 GLU keeps its own (two matrices a row). Steps are
//! per kind (`MMVQS_STEP_<kind>`, `MMVQ_GSTEP_<kind>`: Q4_0's 18-byte units
//! take 4 a step in the matvec and 8 in the GLU, where two and four left a
//! lane too few bytes in flight). One launch covers up to three matrices
//! (`MmvqMats`: Q/K/V), picked with selects (indexing the parameter at run
//! time copies it to local memory).
//!
//! **What a matvec's row becomes.** `MmvqMats` also says that: `acc` adds
//! the dot into `y` (the O and down projections straight into the residual
//! stream); `rope` makes the launch a layer's Q, K and V whose epilogue
//! (`rope_epilogue`) rotates adjacent row pairs (a warp and its neighbour
//! hold a pair at the same step: they swap dots through shared memory under
//! a two-warp named barrier) and stores keys and values into the cache.
//! NeoX pairs, partial rotation and mixed kinds keep `rope_kv` instead (a
//! warp whose rows alternate across n_rot would skip every other pair
//! barrier). The F16 `_norm` kernels (`matvec_f16_norm_stream`,
//! `matvec_f16_glu_norm_stream`) fuse the RMS norm before QKV and gate/up:
//! the norm's weights into shared memory before `PDL_ENTER`, then `x * w`
//! and one block reduction; 1/rms scales each row's dot.
//! `DEFINE_MMVQ_GLU` builds the int8 gate and up matvecs with the GLU after
//! them (8–32 lanes a row, so 8–32 rows a short block; `h` and its q8 copy
//! written: the last of a 32-row unit's blocks to finish quantizes it,
//! `glu_unit_q8`, counted with a per-unit atomic counter that block resets,
//! so it is zero between launches). `rope_kv` rotates q and k and stores k
//! and v into the cache in one launch where the QKV matvec cannot.
//!
//! **Launch boundaries.** Every kernel enters through `PDL_ENTER`
//! (programmatic dependent launch: wait for the previous kernel, let the
//! next one launch). Before it a kernel touches only immutable memory (the
//! streaming matvecs load their first weights, the int8 gate/up kernels
//! prefetch their rows into L2, the norms read their weights) and the
//! staged slot and position lists (written by host copies, never by a
//! kernel). The host launches with `cuLaunchKernelEx` and the
//! programmatic-serialization attribute on compute capability 9+, and
//! always defines `FERROX_SMS`; the PTX cache key hashes every define.
//!
//! **Attention** has four kernels. `attention_dec` serves decode batches: a
//! block per token and query head, each 128-key chunk's keys and values
//! staged in shared memory by `cp.async`, all of a chunk's loads issued at
//! once, the next chunk's before this one is computed. A token with at
//! least 256 keys in its window is split, flash-decoding style, into up to
//! 16 runs of whole chunks, one per 128 keys, a block per run taking its KV
//! head's whole group (or the largest divisor of it whose heads hold at
//! most 512 value dims: 4 of a group of 8 heads of 128); each run writes its softmax max, sum and
//! unnormalized values to a scratch and the last run to finish (an atomic
//! counter it resets) merges them. The run count is picked in the kernel
//! from the token's position, so one CUDA graph serves every position.
//! `attention_mma` serves one-slot prefill batches, flash-attention style on
//! the tensor cores (64 queries of a head a block, 64-key f16 tiles in
//! shared memory, `mma.sync` m16n8k16 for QK^T and PV, the online softmax on
//! the accumulators). The grouped kernel (a block per token and KV head, a
//! thread per key for scores, a warp per head for the softmax, a warp per
//! key for values) takes the other batches — the two grouped kernels share
//! those phases (`ga_scores`, `ga_softmax`, `ga_values`, `ga_finish`) over
//! generic addresses, the cache or its staged copy — and the per-head one
//! takes shapes none of those take (the core marks one-slot batches,
//! `AttnShape::one_slot`).
//!
//! **Read-backs.** `argmax_rows` is greedy decode's only read-back
//! (2048-wide slices of a row a block, the last block of a row merging their
//! u64 keys). A server's sampled steps read back `top_k_rows` (a block a
//! row: max, log-sum-exp, and the best k finite logits by a radix select
//! over an order-preserving u32 key, ties to lower ids; ferrox-core's
//! `TopRows::select` is its host twin) instead of the rows.
//! Read-backs ([`Device::read`], the argmax ids, the selections) land in one
//! page-locked buffer, a long one in pipelined 256 KiB pieces (a pageable
//! destination costs the step ~4% at 1b F16).
//!
//! # The host side (`device.rs`)
//!
//! [`Device`] holds one context, one stream and cuBLAS if present, and
//! every forward-pass operation on device buffers, plus stream capture into
//! a [`Graph`] and its replay. It launches by `ferrox-ops`' CUDA kernel
//! table ([`kernel_suffix`]; [`mmvq_kind`], the int8-activation kinds), and
//! [`mmvq_quantize_activations`] is the host twin of what those kernels do
//! to activations. The q8 scratch has two slots (a launch that reads one q8
//! input and writes the next, the gate/up matvec with the GLU, writes the
//! other) and is tagged with the [`Buf`] (unique id) and slot it holds;
//! every launch but the int8 matvec's, every copy and every GEMM clears the
//! tag, so a matvec never reads a stale quantized copy. An outgrown scratch
//! is retired, not freed (recorded graphs hold its address).
//!
//! # Measuring
//!
//! With `FERROX_CUDA_DEFINES=FERROX_TRACE=1` every kernel's first thread
//! records the timer at its entry and when its wait returns, with the line
//! of its `PDL_ENTER` (`compile::kernel_at_line` names the kernel);
//! `FERROX_CUDA_TRACE=<file>` writes the records when the `Device` closes,
//! and `tools/cuda/trace.py` sums a decode step's critical path per kernel
//! (the graph's real timeline: ncu serializes kernels). `tools/cuda/regs.py`
//! prints every kernel's registers and stack from an NVRTC cubin made
//! without a GPU (`cuobjdump -sass` on it shows the schedule);
//! `tools/cuda/boundary_bench.cu` measures what a kernel boundary costs.

#![deny(missing_docs)]

mod compile;
mod device;

pub use compile::{compile_check, defined_kernels, kernel_signatures, kernel_source, nvrtc_present};
pub use device::{
    mmvq_quantize_activations, Buf, Device, Graph, IndexView, Indices, Kv, MatmulPath, Matrix, MoeBufs,
    MoeShape, MOE_GROUPED_PAIRS, MOE_MAX_EXPERTS,
};
use ferrox_quant::QuantKind;

/// Everything that can go wrong on the CUDA side, naming what was attempted.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A CUDA library is not loadable (no driver, no NVRTC…).
    #[error("the CUDA library {lib} cannot be loaded (is it on LD_LIBRARY_PATH?)")]
    MissingLibrary {
        /// Which one.
        lib: &'static str,
    },
    /// The driver loaded but sees no device (or not the one asked for).
    #[error("no CUDA device {ordinal} ({count} found)")]
    NoDevice {
        /// The device asked for.
        ordinal: usize,
        /// Devices present.
        count: i32,
    },
    /// A driver call failed.
    #[error("CUDA {what}: {source}")]
    Driver {
        /// The operation.
        what: String,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// NVRTC rejected the kernel source.
    #[error("NVRTC cannot compile the kernels for {arch}: {log}")]
    Compile {
        /// Target architecture.
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// A cuBLAS call failed.
    #[error("cuBLAS {what}: {source}")]
    Blas {
        /// The operation.
        what: &'static str,
        /// cuBLAS's error.
        source: cudarc::cublas::result::CublasError,
    },
    /// Operands whose sizes disagree.
    #[error("shape mismatch in {op}: {why}")]
    Shape {
        /// The operation.
        op: &'static str,
        /// What disagrees.
        why: String,
    },
    /// A `FERROX_*` variable set to a value it does not take.
    #[error(transparent)]
    Config(#[from] ferrox_quant::knob::BadValue),
    /// A kind this backend has no kernel for.
    #[error("no CUDA {op} kernel for {kind}")]
    NoKernel {
        /// The operation.
        op: &'static str,
        /// The weight kind.
        kind: QuantKind,
    },
}

pub(crate) fn drv(
    what: impl Into<String>,
) -> impl FnOnce(cudarc::driver::DriverError) -> CudaError {
    let what = what.into();
    move |source| CudaError::Driver { what, source }
}

/// The kind table (suffixes, int8 kinds) and the per-shape matvec choice
/// live in `ferrox_ops::cuda`, where the engine's plan reads them too.
pub use ferrox_ops::cuda::{int8_kind as mmvq_kind, kernel_suffix, GEMM_MIN_TOKENS};

/// The architecture CI compiles for (the H200 this backend is measured on).
pub const CHECK_ARCH: &str = "compute_90";
