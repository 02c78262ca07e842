//! The Vulkan backend's kernel table: the weight kinds its shaders decode.
//! `ferrox-vulkan`'s build script compiles a `matmul_<suffix>` and a
//! `get_rows_<suffix>` shader for each row (from the one dequantizer the
//! shaders share, selected by `KIND_<SUFFIX>`); `ferrox_core`'s plan claims
//! exactly these kinds, and its claims⇔launch test checks the compiled
//! shader list against them.

use ferrox_quant::QuantKind;

/// `(kind, shader suffix)` for every kind the shaders decode.
pub const KINDS: &[(QuantKind, &str)] = &[
    (QuantKind::F32, "f32"),
    (QuantKind::F16, "f16"),
    (QuantKind::BF16, "bf16"),
    (QuantKind::Q4_0, "q4_0"),
    (QuantKind::Q4_1, "q4_1"),
    (QuantKind::Q5_0, "q5_0"),
    (QuantKind::Q5_1, "q5_1"),
    (QuantKind::Q8_0, "q8_0"),
    (QuantKind::Q2K, "q2_k"),
    (QuantKind::Q3K, "q3_k"),
    (QuantKind::Q4K, "q4_k"),
    (QuantKind::Q5K, "q5_k"),
    (QuantKind::Q6K, "q6_k"),
    (QuantKind::IQ4NL, "iq4_nl"),
    (QuantKind::IQ4XS, "iq4_xs"),
    (QuantKind::MXFP4, "mxfp4"),
];

/// The kinds with an integer-dot product (`matmul_dp_<suffix>`: their
/// values as int8 against activations quantized to int8 per 32), run
/// where the device has `shaderIntegerDotProduct`; each keeps its float
/// product as the fallback.
pub const DP_KINDS: &[QuantKind] = &[QuantKind::Q8_0, QuantKind::Q4_0];

/// The integer-dot product shader of `kind`, if it has one.
pub fn dp_shader(kind: QuantKind) -> Option<String> {
    DP_KINDS.contains(&kind).then(|| suffix(kind).map(|s| format!("matmul_dp_{s}"))).flatten()
}

/// The shader suffix of `kind`, or `None`: the Vulkan backend does not
/// decode it.
pub fn suffix(kind: QuantKind) -> Option<&'static str> {
    KINDS.iter().find(|&&(k, _)| k == kind).map(|&(_, s)| s)
}

/// The product shader of `kind` (decode and prefill alike: [`MATMUL_ROWS`]
/// output rows per workgroup, up to [`MATMUL_TILE`] tokens per pass over them).
pub fn matmul_shader(kind: QuantKind) -> Option<String> {
    suffix(kind).map(|s| format!("matmul_{s}"))
}

/// The embedding-lookup shader of `kind`.
pub fn get_rows_shader(kind: QuantKind) -> Option<String> {
    suffix(kind).map(|s| format!("get_rows_{s}"))
}

/// Tokens one workgroup of a product shader multiplies per read of its
/// weight rows.
pub const MATMUL_TILE: usize = 8;

/// Output rows per workgroup of a product shader (of 64 threads: 8 on a
/// row, so a narrow row such as Gemma 3 270M's 640 columns keeps them busy).
pub const MATMUL_ROWS: usize = 8;

/// The largest head size the attention shader holds (four values per
/// thread of its 64).
pub const MAX_HEAD_DIM: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_are_the_lowercase_kind_names_and_unique() {
        for (i, &(k, s)) in KINDS.iter().enumerate() {
            assert_eq!(s, k.name().to_ascii_lowercase(), "{k}");
            assert!(KINDS[i + 1..].iter().all(|&(o, _)| o != k), "{k} twice");
        }
        assert_eq!(suffix(QuantKind::IQ2XXS), None);
    }
}
