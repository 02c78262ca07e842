//! The Metal backend's kernel table: the weight kinds its Metal Shading
//! Language kernels decode. `ferrox-metal` compiles one library from its
//! MSL source at run time (`newLibraryWithSource`), with a `matmul_<suffix>`
//! and a `get_rows_<suffix>` kernel instantiated per row of this table;
//! `ferrox_core`'s plan claims exactly these kinds, and its claims⇔launch
//! test checks the kernel names in the MSL source against them.
//!
//! The kernels' logic is the Vulkan shaders' (`ferrox-vulkan/shaders/`),
//! written again in MSL; none of it has run on Apple hardware
//! ([`UNVERIFIED`]).

use ferrox_quant::QuantKind;

/// `(kind, kernel suffix)` for every kind the kernels decode.
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
    (QuantKind::Q4K, "q4_k"),
    (QuantKind::Q5K, "q5_k"),
    (QuantKind::Q6K, "q6_k"),
];

/// What the plan says of every Metal kernel: the project has no Apple
/// machine, so none of them has run on one.
pub const UNVERIFIED: &str = "never run on Apple hardware";

/// The kernel suffix of `kind`, or `None`: the Metal backend does not
/// decode it.
pub fn suffix(kind: QuantKind) -> Option<&'static str> {
    KINDS.iter().find(|&&(k, _)| k == kind).map(|&(_, s)| s)
}

/// The product kernel of `kind` (decode and prefill alike: [`MATMUL_ROWS`]
/// output rows per threadgroup, up to [`MATMUL_TILE`] tokens per pass over them).
pub fn matmul_kernel(kind: QuantKind) -> Option<String> {
    suffix(kind).map(|s| format!("matmul_{s}"))
}

/// The embedding-lookup kernel of `kind`.
pub fn get_rows_kernel(kind: QuantKind) -> Option<String> {
    suffix(kind).map(|s| format!("get_rows_{s}"))
}

/// Tokens one threadgroup of a product kernel multiplies per read of its
/// weight rows.
pub const MATMUL_TILE: usize = 8;

/// Output rows per threadgroup of a product kernel (of 64 threads: 8 on a row).
pub const MATMUL_ROWS: usize = 8;

/// Threads per threadgroup, every kernel.
pub const THREADS: usize = 64;

/// The largest head size the attention kernel holds (four values per
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
        assert_eq!(matmul_kernel(QuantKind::Q4K).as_deref(), Some("matmul_q4_k"));
    }
}
