//! llama.cpp's `general.file_type` values (`LLAMA_FTYPE_*`), written once:
//! what `ferrox quantize` writes into a file and what `ferrox bench` reads
//! back as the model's description. Two hand-kept tables had drifted (one
//! wrote NVFP4 = 39, the other did not know 39); a value is now one row.

use ferrox_quant::QuantKind;

/// `(value, llama.cpp's name, the kind a file whose matrices are all of it
/// has)`; mixes (`Q4_K - Medium` is also written for a plain Q4_K file, as
/// llama-quantize does) and retired values as llama.cpp's `llama_ftype_name`.
const FTYPES: &[(u32, &str, Option<QuantKind>)] = &[
    (0, "all F32", Some(QuantKind::F32)),
    (1, "F16", Some(QuantKind::F16)),
    (2, "Q4_0", Some(QuantKind::Q4_0)),
    (3, "Q4_1", Some(QuantKind::Q4_1)),
    (7, "Q8_0", Some(QuantKind::Q8_0)),
    (8, "Q5_0", Some(QuantKind::Q5_0)),
    (9, "Q5_1", Some(QuantKind::Q5_1)),
    (10, "Q2_K - Medium", Some(QuantKind::Q2K)),
    (11, "Q3_K - Small", None),
    (12, "Q3_K - Medium", Some(QuantKind::Q3K)),
    (13, "Q3_K - Large", None),
    (14, "Q4_K - Small", None),
    (15, "Q4_K - Medium", Some(QuantKind::Q4K)),
    (16, "Q5_K - Small", None),
    (17, "Q5_K - Medium", Some(QuantKind::Q5K)),
    (18, "Q6_K", Some(QuantKind::Q6K)),
    (19, "IQ2_XXS - 2.0625 bpw", Some(QuantKind::IQ2XXS)),
    (20, "IQ2_XS - 2.3125 bpw", Some(QuantKind::IQ2XS)),
    (21, "Q2_K - Small", None),
    (22, "IQ3_XS - 3.3 bpw", None),
    (23, "IQ3_XXS - 3.0625 bpw", Some(QuantKind::IQ3XXS)),
    (24, "IQ1_S - 1.5625 bpw", Some(QuantKind::IQ1S)),
    (25, "IQ4_NL - 4.5 bpw", Some(QuantKind::IQ4NL)),
    (26, "IQ3_S - 3.4375 bpw", Some(QuantKind::IQ3S)),
    (27, "IQ3_S mix - 3.66 bpw", None),
    (28, "IQ2_S - 2.5 bpw", Some(QuantKind::IQ2S)),
    (29, "IQ2_M - 2.7 bpw", None),
    (30, "IQ4_XS - 4.25 bpw", Some(QuantKind::IQ4XS)),
    (31, "IQ1_M - 1.75 bpw", Some(QuantKind::IQ1M)),
    (32, "BF16", Some(QuantKind::BF16)),
    (36, "TQ1_0 - 1.69 bpw ternary", Some(QuantKind::TQ1_0)),
    (37, "TQ2_0 - 2.06 bpw ternary", Some(QuantKind::TQ2_0)),
    (38, "MXFP4 MoE", Some(QuantKind::MXFP4)),
    (39, "NVFP4", Some(QuantKind::NVFP4)),
    (40, "Q1_0", Some(QuantKind::Q1_0)),
    (41, "Q2_0", Some(QuantKind::Q2_0)),
];

/// The `general.file_type` of a model whose matrices are all `kind`, or
/// `None` where llama.cpp has none (Q8_1, Q8_K, F64 and the integer kinds).
pub fn of_kind(kind: QuantKind) -> Option<u32> {
    FTYPES.iter().find(|r| r.2 == Some(kind)).map(|r| r.0)
}

/// llama.cpp's name of a `general.file_type` value (its `llama_ftype_name`).
pub fn name(value: u64) -> Option<&'static str> {
    FTYPES.iter().find(|r| u64::from(r.0) == value).map(|r| r.1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every value a file can be written with has a name to read it back by,
    /// and every weight kind llama.cpp has a file type for is in the table.
    #[test]
    fn every_written_file_type_reads_back_by_name() {
        let mut written = 0;
        for &k in QuantKind::ALL {
            match of_kind(k) {
                Some(v) => {
                    written += 1;
                    assert!(name(v.into()).is_some(), "{k} writes file type {v}, which has no name");
                }
                None => assert!(
                    matches!(k, QuantKind::Q8_1 | QuantKind::Q8K | QuantKind::F64) || k.vec_dot_kind().is_none(),
                    "{k} is a weight format with no file type"
                ),
            }
        }
        assert_eq!(written, 28, "every weight kind but Q8_1 and Q8_K");
        assert_eq!((of_kind(QuantKind::NVFP4), name(39)), (Some(39), Some("NVFP4")));
        assert_eq!(name(5), None, "retired values have no name");
    }

    #[test]
    fn values_are_distinct() {
        for (i, a) in FTYPES.iter().enumerate() {
            assert!(FTYPES[i + 1..].iter().all(|b| b.0 != a.0), "{} twice", a.0);
        }
    }
}
