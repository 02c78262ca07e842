//! The CUDA backend's kernel table: per weight kind, the kernels
//! `kernels.cu` defines for it, and per matrix shape, the decode kernel a
//! matvec takes. `ferrox_cuda::Device` loads and chooses by these functions;
//! `ferrox_core`'s plan reports by them.

use ferrox_quant::QuantKind;

pub use crate::Mat;

/// Expands `$mac!` with every row of the CUDA kind table:
/// `(kind, kernel suffix, int8)`. `int8`: the decode matvec runs on int8
/// activations (`mmvq_stream_<suffix>`, `__dp4a`) and the gate/up GLU has
/// its own kernel (`mmvq_glu_<suffix>`). Every row has the unit decoder's
/// `matvec_`, `get_rows_` and `dequant_f16_` (the GEMM's weight side).
macro_rules! cuda_kinds {
    ($mac:ident) => {
        $mac! {
            (F32, "f32", false),
            (F16, "f16", false),
            (BF16, "bf16", false),
            (Q4_0, "q4_0", true),
            (Q4_1, "q4_1", false),
            (Q5_0, "q5_0", true),
            (Q5_1, "q5_1", false),
            (Q8_0, "q8_0", true),
            (Q8_1, "q8_1", false),
            (Q2K, "q2_k", false),
            (Q3K, "q3_k", false),
            (Q4K, "q4_k", true),
            (Q5K, "q5_k", false),
            (Q6K, "q6_k", true),
            (Q8K, "q8_k", false),
            (IQ2XXS, "iq2_xxs", false),
            (IQ2XS, "iq2_xs", false),
            (IQ2S, "iq2_s", false),
            (IQ3XXS, "iq3_xxs", false),
            (IQ3S, "iq3_s", false),
            (IQ1S, "iq1_s", false),
            (IQ1M, "iq1_m", false),
            (IQ4NL, "iq4_nl", false),
            (IQ4XS, "iq4_xs", false),
            (TQ1_0, "tq1_0", false),
            (TQ2_0, "tq2_0", false),
            (MXFP4, "mxfp4", false),
            (NVFP4, "nvfp4", false),
            (Q1_0, "q1_0", false),
            (Q2_0, "q2_0", false),
        }
    };
}

macro_rules! kind_fns {
    ($(($kind:ident, $suffix:literal, $int8:literal)),* $(,)?) => {
        /// The suffix of `kind`'s kernels in `kernels.cu` (`matvec_q4_k`),
        /// or `None`: a kind CUDA has no kernels for (F64 and the integer
        /// kinds, which are not weight formats).
        pub fn kernel_suffix(kind: QuantKind) -> Option<&'static str> {
            match kind {
                $(QuantKind::$kind => Some($suffix),)*
                _ => None, // capability table: the kinds above are the claimed ones
            }
        }

        /// Whether `kind`'s decode matvec and gate/up GLU run on int8
        /// activations (`mmvq_stream_<suffix>`, `mmvq_glu_<suffix>`).
        pub fn int8_kind(kind: QuantKind) -> bool {
            match kind {
                $(QuantKind::$kind => $int8,)*
                _ => false, // capability table: the kinds above are the claimed ones
            }
        }
    };
}
cuda_kinds!(kind_fns);

/// Batches above this many tokens take the GEMM (weights dequantized to
/// f16, cuBLAS) where cuBLAS loaded; smaller ones the matvec per token.
pub const GEMM_MIN_TOKENS: usize = 8;

/// The token tiles of the small-batch tensor-core GEMM: `mmq_<suffix>_n<t>`
/// takes up to `8 t` tokens, a larger batch goes in pieces of the largest
/// (64 tokens: the largest whose two stages of activations fit the 48 KiB of
/// static shared memory; a 128-token tile measured no faster than two 64s).
/// Batches above [`GEMM_MIN_TOKENS`] and up to [`MMA_MAX_TOKENS`] of an
/// [`int8_kind`] whose width is a multiple of 32 take it on sm_80 and later
/// instead of dequantizing every weight to f16 for cuBLAS (a whole f16
/// copy of the weights written and read again per matmul, which made a
/// server's 9–80-token decode steps slower than 8-token ones).
pub const MMA_TILES: [usize; 4] = [1, 2, 4, 8];

/// The largest batch the small-batch tensor-core GEMM takes by default:
/// on an H100 (8b Q4_K_M prefill, docs/decisions/0041) the staged GEMM is
/// 3.2x the dequantize + cuBLAS path at 16 tokens and 2.0x at 64; two
/// 64-token pieces still beat cuBLAS at 128.
pub const MMA_MAX_TOKENS: usize = 128;

/// The index into [`MMA_TILES`] of the smallest tile that holds `n`
/// tokens (8 a step), if one does.
pub fn mma_tile(n: usize) -> Option<usize> {
    MMA_TILES.iter().position(|t| 8 * t >= n)
}

/// The `mmq_<suffix>_n<t>` kernel for a piece of `n` tokens (1 to 64).
pub fn mma_kernel(kind: QuantKind, n: usize) -> Option<String> {
    let s = kernel_suffix(kind).filter(|_| int8_kind(kind))?;
    let t = MMA_TILES[mma_tile(n)?];
    (n > 0).then(|| format!("mmq_{s}_n{t}"))
}

/// Whether a `kind` matrix of `cols` columns has a small-batch tensor-core
/// GEMM kernel for `n` tokens (taken on sm_80 and later above
/// [`GEMM_MIN_TOKENS`]).
pub fn mma_fits(kind: QuantKind, cols: usize, n: usize) -> bool {
    cols.is_multiple_of(32) && mma_kernel(kind, n.min(8 * MMA_TILES[MMA_TILES.len() - 1])).is_some()
}

/// The kernels a kind's matrices need loaded, by name: what `Device::open`
/// looks up and what the claims⇔launch test finds in the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindKernels {
    /// The unit decoder's matvec (every shape).
    pub matvec: String,
    /// Embedding rows dequantized to f32.
    pub get_rows: String,
    /// Weights dequantized to f16 for the cuBLAS GEMM (prefill).
    pub dequant_f16: String,
    /// The routed experts' matvec over a stack of experts (decode and
    /// prefill of a mixture of experts).
    pub matvec_id: String,
    /// The int8-activation streaming matvec and gate/up GLU, for the
    /// [`int8_kind`]s.
    pub int8: Option<(String, String)>,
    /// The small-batch tensor-core GEMM, one kernel per [`MMA_TILES`]
    /// entry, for the [`int8_kind`]s.
    pub mma: Option<Vec<String>>,
    /// The routed experts' matvec on int8 activations (`mmvq_id_<suffix>`,
    /// a mixture of experts' decode) and the grouped GEMM over a batch's
    /// pairs sorted by expert, one per [`MMA_TILES`] entry
    /// (`mmq_id_<suffix>_n<t>`, prefill), for the [`int8_kind`]s.
    pub experts_int8: Option<(String, Vec<String>)>,
}

/// The kernels `kind` needs, or `None` where CUDA claims none.
pub fn kind_kernels(kind: QuantKind) -> Option<KindKernels> {
    let s = kernel_suffix(kind)?;
    Some(KindKernels {
        matvec: format!("matvec_{s}"),
        get_rows: format!("get_rows_{s}"),
        dequant_f16: format!("dequant_f16_{s}"),
        matvec_id: format!("matvec_id_{s}"),
        int8: int8_kind(kind).then(|| (format!("mmvq_stream_{s}"), format!("mmvq_glu_{s}"))),
        mma: int8_kind(kind).then(|| MMA_TILES.iter().map(|t| format!("mmq_{s}_n{t}")).collect()),
        experts_int8: int8_kind(kind)
            .then(|| (format!("mmvq_id_{s}"), MMA_TILES.iter().map(|t| format!("mmq_id_{s}_n{t}")).collect())),
    })
}

/// Which matvec kernel a matrix takes at decode (batches up to
/// [`GEMM_MIN_TOKENS`], or every batch without cuBLAS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Matvec {
    /// `mmvq_stream_<kind>`: activations quantized to int8 once per input,
    /// a warp a row, `__dp4a` dots (whole 32-element units).
    Int8Stream,
    /// `matvec_f16_stream`: 16-byte loads of F16 rows (widths a multiple of 8).
    F16Stream,
    /// `matvec_<kind>`: the 32-element unit decoder, any kind and width.
    Unit,
}

impl Matvec {
    /// The kernel's name in `kernels.cu` for `kind`.
    pub fn kernel(self, kind: QuantKind) -> String {
        let s = kernel_suffix(kind).unwrap_or("?");
        match self {
            Matvec::Int8Stream => format!("mmvq_stream_{s}"),
            Matvec::F16Stream => "matvec_f16_stream".to_string(),
            Matvec::Unit => format!("matvec_{s}"),
        }
    }
}

/// The matvec a `kind` matrix of `cols` columns takes, or `None` where
/// CUDA has no kernel for the kind.
pub fn matvec(kind: QuantKind, cols: usize) -> Option<Matvec> {
    kernel_suffix(kind)?;
    Some(if int8_kind(kind) && cols.is_multiple_of(32) {
        Matvec::Int8Stream
    } else if kind == QuantKind::F16 && cols.is_multiple_of(8) {
        Matvec::F16Stream
    } else {
        Matvec::Unit
    })
}

/// The streaming kernel that takes two or three matrices over the same input
/// in one decode launch (a layer's Q, K and V; gate and up): one kind, one
/// width, a streaming kind. `None`: one launch each.
pub fn one_launch(mats: &[Mat]) -> Option<Matvec> {
    let first = mats.first()?;
    let m = matvec(first.kind, first.cols)?;
    let same = mats.iter().all(|w| w.kind == first.kind && w.cols == first.cols);
    ((2..=3).contains(&mats.len()) && same && m != Matvec::Unit).then_some(m)
}

/// The most dynamic shared memory an RMS norm fused into a streaming F16
/// matvec takes for its input row: a launch's default limit (48 KiB, no
/// opt-in) covers static and dynamic shared memory together, so 1 KiB is
/// left for the kernels' static arrays: rows up to 12032 wide.
pub const NORM_SMEM_MAX: usize = 47 * 1024;

/// Whether the RMS norm of `cols`-wide rows fuses into the streaming F16
/// matvecs over them (`matvec_f16_norm_stream`, `matvec_f16_glu_norm_stream`).
pub fn norm_fuses(cols: usize) -> bool {
    4 * cols <= NORM_SMEM_MAX
}

/// The kernel that takes gate, up and the GLU in one decode launch:
/// `matvec_f16_glu_stream` for F16, `mmvq_glu_<kind>` for the int8 kinds
/// (whole 32-row units); both matrices laid out alike. `None`: two matvecs
/// and the GLU apart.
pub fn glu_launch(gate: Mat, up: Mat) -> Option<String> {
    if gate != up {
        return None;
    }
    match matvec(gate.kind, gate.cols)? {
        Matvec::F16Stream => Some("matvec_f16_glu_stream".into()),
        Matvec::Int8Stream if gate.rows.is_multiple_of(32) => kind_kernels(gate.kind)?.int8.map(|(_, glu)| glu),
        _ => None,
    }
}

/// Whether RoPE and the KV-cache store run in the epilogue of the Q/K/V
/// launch: one launch for the three, adjacent pairs (not NeoX halves) and
/// whole-head rotation (a warp whose rows alternate across `n_rot` would
/// reuse a pair slot with one barrier between).
pub fn qkv_rope_epilogue(qkv: [Mat; 3], halves: bool, n_rot: usize, head_dim: usize) -> bool {
    one_launch(&qkv).is_some() && !halves && n_rot == head_dim && head_dim.is_multiple_of(2)
}

/// Whether a projection's decode matvec adds into the residual stream
/// itself (the streaming kernels' add epilogue).
pub fn adds_into_residual(m: Mat) -> bool {
    matches!(matvec(m.kind, m.cols), Some(Matvec::Int8Stream | Matvec::F16Stream))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table's kinds are weight formats: each has a dot product on the
    /// CPU (the twin every CUDA kernel is tested against).
    #[test]
    fn every_claimed_kind_is_a_weight_format_with_a_cpu_twin() {
        for &k in QuantKind::ALL {
            if kernel_suffix(k).is_some() {
                assert!(k.vec_dot_kind().is_some(), "{k} is claimed but is not a weight format");
                assert_eq!(kernel_suffix(k).unwrap(), k.name().to_ascii_lowercase(), "{k}: suffix");
            }
        }
    }

    /// The streaming kernels take only the shapes they were written for;
    /// every other shape of a claimed kind falls to the unit decoder.
    #[test]
    fn the_streaming_matvecs_take_only_whole_units() {
        assert_eq!(matvec(QuantKind::Q4K, 4096), Some(Matvec::Int8Stream));
        assert_eq!(matvec(QuantKind::Q4K, 4096 + 16), Some(Matvec::Unit));
        assert_eq!(matvec(QuantKind::F16, 640), Some(Matvec::F16Stream));
        assert_eq!(matvec(QuantKind::F16, 644), Some(Matvec::Unit));
        assert_eq!(matvec(QuantKind::Q5K, 4096), Some(Matvec::Unit));
        assert_eq!(matvec(QuantKind::F64, 4096), None);
        assert_eq!(Matvec::Int8Stream.kernel(QuantKind::Q6K), "mmvq_stream_q6_k");
    }

    /// The small-batch GEMM's tile is the smallest that holds the batch (a
    /// larger batch goes in 128-token pieces), for the int8 kinds and whole
    /// 32-element units only.
    #[test]
    fn the_small_batch_gemm_takes_the_smallest_tile_that_holds_the_batch() {
        let k = |n| mma_kernel(QuantKind::Q4K, n);
        assert_eq!(k(0), None);
        assert_eq!(k(1).as_deref(), Some("mmq_q4_k_n1"));
        assert_eq!(k(8).as_deref(), Some("mmq_q4_k_n1"));
        assert_eq!(k(9).as_deref(), Some("mmq_q4_k_n2"));
        assert_eq!(k(64).as_deref(), Some("mmq_q4_k_n8"));
        assert_eq!(k(65), None, "a piece is at most 64 tokens");
        assert!(mma_fits(QuantKind::Q6K, 4096, 300), "larger batches go in pieces");
        assert!(!mma_fits(QuantKind::Q6K, 4096 + 16, 16), "a partial unit");
        assert!(!mma_fits(QuantKind::Q5K, 4096, 16), "not an int8 kind");
        assert!(!mma_fits(QuantKind::F16, 4096, 16), "F16 keeps cuBLAS");
        let tiles = kind_kernels(QuantKind::Q8_0).and_then(|k| k.mma).unwrap_or_default();
        assert_eq!(tiles.len(), MMA_TILES.len());
        assert!(tiles.iter().all(|t| t.starts_with("mmq_q8_0_n")));
        assert!(MMA_MAX_TOKENS > GEMM_MIN_TOKENS && mma_fits(QuantKind::Q4K, 4096, MMA_MAX_TOKENS));
    }

    /// Fusions need matrices alike: one kind, one width (and for the GLU
    /// one layout, whole 32-row units on the int8 kernels).
    #[test]
    fn fused_launches_take_matrices_alike() {
        let m = |kind, rows, cols| Mat { kind, rows, cols };
        let (q, k) = (m(QuantKind::Q8_0, 2048, 2048), m(QuantKind::Q8_0, 512, 2048));
        assert_eq!(one_launch(&[q, k, k]), Some(Matvec::Int8Stream));
        assert_eq!(one_launch(&[q, k, m(QuantKind::Q6K, 512, 2048)]), None, "mixed kinds");
        assert_eq!(one_launch(&[q]), None);
        assert_eq!(one_launch(&[m(QuantKind::Q5K, 64, 2048); 3]), None, "the unit decoder is one launch a matrix");
        assert_eq!(glu_launch(q, q).as_deref(), Some("mmvq_glu_q8_0"));
        assert_eq!(glu_launch(m(QuantKind::Q8_0, 40, 2048), m(QuantKind::Q8_0, 40, 2048)), None, "rows not whole units");
        assert_eq!(glu_launch(m(QuantKind::F16, 40, 64), m(QuantKind::F16, 40, 64)).as_deref(), Some("matvec_f16_glu_stream"));
        assert!(qkv_rope_epilogue([q, k, k], false, 64, 64));
        assert!(!qkv_rope_epilogue([q, k, k], true, 64, 64) && !qkv_rope_epilogue([q, k, k], false, 32, 64));
        assert!(norm_fuses(12032) && !norm_fuses(12288));
    }
}

/// The average pairs an expert takes in a batch from which the experts run
/// as the grouped GEMM (`mmq_id_<kind>_n<t>`) rather than one matvec a
/// (token, expert) pair: at two, the matvecs read each routed expert twice.
/// Here, not in the device crate, so the plan reports it in every build.
pub const MOE_GROUPED_PAIRS: usize = 2;
