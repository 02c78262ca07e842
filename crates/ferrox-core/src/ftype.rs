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

/// One of llama-quantize's file types (`LLAMA_FTYPE_MOSTLY_*`): a default
/// kind for the matrices plus per-tensor rules (`requantize::plan_model`).
/// Each variant is spelled as llama-quantize's name for it.
#[allow(non_camel_case_types, missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mix {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q1_0,
    Q2_0,
    MXFP4_MOE,
    Q2_K,
    Q2_K_S,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    TQ1_0,
    TQ2_0,
    IQ1_S,
    IQ1_M,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ2_M,
    IQ3_XXS,
    IQ3_XS,
    IQ3_S,
    IQ3_M,
    IQ4_NL,
    IQ4_XS,
}

/// llama-quantize's `QUANT_OPTIONS`, in its order: the name a user types,
/// the mix, and the one-line description `--help` prints. Aliases (`Q4_K`
/// is `Q4_K_M`) are rows of their own.
pub const MIX_NAMES: &[(&str, Mix, &str)] = &[
    ("Q1_0", Mix::Q1_0, "1.125 bpw"),
    ("Q2_0", Mix::Q2_0, "2.25 bpw (group 64)"),
    ("Q4_0", Mix::Q4_0, "4.34G, +0.4685 ppl @ Llama-3-8B"),
    ("Q4_1", Mix::Q4_1, "4.78G, +0.4511 ppl @ Llama-3-8B"),
    ("MXFP4_MOE", Mix::MXFP4_MOE, "MXFP4 experts, Q8_0 elsewhere"),
    ("Q5_0", Mix::Q5_0, "5.21G, +0.1316 ppl @ Llama-3-8B"),
    ("Q5_1", Mix::Q5_1, "5.65G, +0.1062 ppl @ Llama-3-8B"),
    ("IQ2_XXS", Mix::IQ2_XXS, "2.06 bpw"),
    ("IQ2_XS", Mix::IQ2_XS, "2.31 bpw"),
    ("IQ2_S", Mix::IQ2_S, "2.5 bpw"),
    ("IQ2_M", Mix::IQ2_M, "2.7 bpw"),
    ("IQ1_S", Mix::IQ1_S, "1.56 bpw"),
    ("IQ1_M", Mix::IQ1_M, "1.75 bpw"),
    ("TQ1_0", Mix::TQ1_0, "1.69 bpw ternarization"),
    ("TQ2_0", Mix::TQ2_0, "2.06 bpw ternarization"),
    ("Q2_K", Mix::Q2_K, "2.96G, +3.5199 ppl @ Llama-3-8B"),
    ("Q2_K_S", Mix::Q2_K_S, "2.96G, +3.1836 ppl @ Llama-3-8B"),
    ("IQ3_XXS", Mix::IQ3_XXS, "3.06 bpw"),
    ("IQ3_S", Mix::IQ3_S, "3.44 bpw"),
    ("IQ3_M", Mix::IQ3_M, "3.66 bpw mix"),
    ("Q3_K", Mix::Q3_K_M, "alias for Q3_K_M"),
    ("IQ3_XS", Mix::IQ3_XS, "3.3 bpw"),
    ("Q3_K_S", Mix::Q3_K_S, "3.41G, +1.6321 ppl @ Llama-3-8B"),
    ("Q3_K_M", Mix::Q3_K_M, "3.74G, +0.6569 ppl @ Llama-3-8B"),
    ("Q3_K_L", Mix::Q3_K_L, "4.03G, +0.5562 ppl @ Llama-3-8B"),
    ("IQ4_NL", Mix::IQ4_NL, "4.50 bpw non-linear"),
    ("IQ4_XS", Mix::IQ4_XS, "4.25 bpw non-linear"),
    ("Q4_K", Mix::Q4_K_M, "alias for Q4_K_M"),
    ("Q4_K_S", Mix::Q4_K_S, "4.37G, +0.2689 ppl @ Llama-3-8B"),
    ("Q4_K_M", Mix::Q4_K_M, "4.58G, +0.1754 ppl @ Llama-3-8B"),
    ("Q5_K", Mix::Q5_K_M, "alias for Q5_K_M"),
    ("Q5_K_S", Mix::Q5_K_S, "5.21G, +0.1049 ppl @ Llama-3-8B"),
    ("Q5_K_M", Mix::Q5_K_M, "5.33G, +0.0569 ppl @ Llama-3-8B"),
    ("Q6_K", Mix::Q6_K, "6.14G, +0.0217 ppl @ Llama-3-8B"),
    ("Q8_0", Mix::Q8_0, "7.96G, +0.0026 ppl @ Llama-3-8B"),
    ("F16", Mix::F16, "14.00G, +0.0020 ppl @ Mistral-7B"),
    ("BF16", Mix::BF16, "14.00G, -0.0050 ppl @ Mistral-7B"),
    ("F32", Mix::F32, "26.00G @ 7B"),
];

impl Mix {
    /// Parses a name as llama-quantize does: case-insensitive, or the
    /// numeric `general.file_type` value.
    pub fn parse(s: &str) -> Option<Mix> {
        let s = s.trim();
        if let Some(r) = MIX_NAMES.iter().find(|r| r.0.eq_ignore_ascii_case(s)) {
            return Some(r.1);
        }
        let v: u32 = s.parse().ok()?;
        MIX_NAMES.iter().find(|r| r.1.file_type() == v).map(|r| r.1)
    }

    /// The canonical name (`Q4_K_M`, never the alias `Q4_K`).
    pub fn name(self) -> &'static str {
        MIX_NAMES
            .iter()
            .rev()
            .find(|r| r.1 == self && !r.2.starts_with("alias"))
            .map_or("?", |r| r.0)
    }

    /// Its `general.file_type` value.
    pub fn file_type(self) -> u32 {
        use Mix::*;
        match self {
            F32 => 0,
            F16 => 1,
            Q4_0 => 2,
            Q4_1 => 3,
            Q8_0 => 7,
            Q5_0 => 8,
            Q5_1 => 9,
            Q2_K => 10,
            Q3_K_S => 11,
            Q3_K_M => 12,
            Q3_K_L => 13,
            Q4_K_S => 14,
            Q4_K_M => 15,
            Q5_K_S => 16,
            Q5_K_M => 17,
            Q6_K => 18,
            IQ2_XXS => 19,
            IQ2_XS => 20,
            Q2_K_S => 21,
            IQ3_XS => 22,
            IQ3_XXS => 23,
            IQ1_S => 24,
            IQ4_NL => 25,
            IQ3_S => 26,
            IQ3_M => 27,
            IQ2_S => 28,
            IQ2_M => 29,
            IQ4_XS => 30,
            IQ1_M => 31,
            BF16 => 32,
            TQ1_0 => 36,
            TQ2_0 => 37,
            MXFP4_MOE => 38,
            Q1_0 => 40,
            Q2_0 => 41,
        }
    }

    /// The kind a matrix gets before the per-tensor rules
    /// (`llama_ftype_get_default_type`).
    pub fn default_kind(self) -> QuantKind {
        use QuantKind as K;
        match self {
            Mix::F32 => K::F32,
            Mix::F16 => K::F16,
            Mix::BF16 => K::BF16,
            Mix::Q4_0 => K::Q4_0,
            Mix::Q4_1 => K::Q4_1,
            Mix::Q5_0 => K::Q5_0,
            Mix::Q5_1 => K::Q5_1,
            Mix::Q8_0 => K::Q8_0,
            Mix::Q1_0 => K::Q1_0,
            Mix::Q2_0 => K::Q2_0,
            Mix::MXFP4_MOE => K::MXFP4,
            Mix::Q2_K | Mix::Q2_K_S => K::Q2K,
            Mix::IQ3_XS => K::IQ3S,
            Mix::Q3_K_S | Mix::Q3_K_M | Mix::Q3_K_L => K::Q3K,
            Mix::Q4_K_S | Mix::Q4_K_M => K::Q4K,
            Mix::Q5_K_S | Mix::Q5_K_M => K::Q5K,
            Mix::Q6_K => K::Q6K,
            Mix::TQ1_0 => K::TQ1_0,
            Mix::TQ2_0 => K::TQ2_0,
            Mix::IQ2_XXS => K::IQ2XXS,
            Mix::IQ2_XS | Mix::IQ2_S => K::IQ2XS,
            Mix::IQ2_M => K::IQ2S,
            Mix::IQ3_XXS => K::IQ3XXS,
            Mix::IQ1_S => K::IQ1S,
            Mix::IQ1_M => K::IQ1M,
            Mix::IQ4_NL => K::IQ4NL,
            Mix::IQ4_XS => K::IQ4XS,
            Mix::IQ3_S | Mix::IQ3_M => K::IQ3S,
        }
    }

    /// The mix whose default kind is `kind` and that has no per-tensor
    /// rules of its own, for a plain kind name; `None` where llama-quantize
    /// has no such file type.
    pub fn of_kind(kind: QuantKind) -> Option<Mix> {
        MIX_NAMES.iter().map(|r| r.1).find(|m| m.default_kind() == kind)
    }
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

    /// Names are llama-quantize's (any case, or the number), every mix's
    /// value has a name in the file-type table, and canonical names parse
    /// back to their mix.
    #[test]
    fn mixes_parse_like_llama_quantize() {
        assert_eq!(Mix::parse("q4_k_m"), Some(Mix::Q4_K_M));
        assert_eq!(Mix::parse("Q4_K"), Some(Mix::Q4_K_M));
        assert_eq!(Mix::parse("15"), Some(Mix::Q4_K_M));
        assert_eq!(Mix::parse("iq4_xs"), Some(Mix::IQ4_XS));
        assert_eq!(Mix::parse("Q9_9"), None);
        assert_eq!(Mix::parse("5"), None);
        for r in MIX_NAMES {
            assert_eq!(Mix::parse(r.1.name()), Some(r.1), "{}", r.0);
            assert!(name(r.1.file_type().into()).is_some(), "{} has no file-type name", r.0);
        }
        assert_eq!(Mix::Q4_K_M.name(), "Q4_K_M");
        assert_eq!(Mix::Q3_K_M.default_kind(), QuantKind::Q3K);
    }

    #[test]
    fn values_are_distinct() {
        for (i, a) in FTYPES.iter().enumerate() {
            assert!(FTYPES[i + 1..].iter().all(|b| b.0 != a.0), "{} twice", a.0);
        }
    }
}
