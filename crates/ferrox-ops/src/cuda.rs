//! The CUDA backend's kernel table: per weight kind, the kernels
//! `kernels.cu` defines for it, and per matrix shape, the decode kernel a
//! matvec takes. `ferrox_cuda::Device` loads and chooses by these functions;
//! `ferrox_core`'s plan reports by them.

use ferrox_quant::QuantKind;

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
    /// The int8-activation streaming matvec and gate/up GLU, for the
    /// [`int8_kind`]s.
    pub int8: Option<(String, String)>,
}

/// The kernels `kind` needs, or `None` where CUDA claims none.
pub fn kind_kernels(kind: QuantKind) -> Option<KindKernels> {
    let s = kernel_suffix(kind)?;
    Some(KindKernels {
        matvec: format!("matvec_{s}"),
        get_rows: format!("get_rows_{s}"),
        dequant_f16: format!("dequant_f16_{s}"),
        int8: int8_kind(kind).then(|| (format!("mmvq_stream_{s}"), format!("mmvq_glu_{s}"))),
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
}
