//! `QuantKind`: every tensor type a GGUF file can hold, declared once.
//!
//! One row of [`quant_kinds!`] per kind gives the enum variant, the display
//! name, the GGUF type id, the elements per block, the `#[repr(C)]` block type
//! (whose `size_of` *is* the block's byte size, asserted at compile time in
//! [`crate::blocks`]) and the kind the activation is quantized to for a dot
//! product (ggml's `vec_dot_type`). Everything that must agree about a kind is
//! generated from that row, so adding a kind is one line and the compiler
//! finds every exhaustive `match` that must learn it.

use crate::blocks::*;

/// Expands `$mac!` once with every row of the kind table.
///
/// Row: `(Variant, "NAME", gguf_id, block_elems, BlockType, vec_dot_kind)`.
/// `vec_dot_kind` is the kind an activation row is converted to before a
/// dot product against a weight row of this kind, or `None` where the kind is
/// not a weight format (integers, F64).
#[macro_export]
macro_rules! quant_kinds {
    ($mac:ident) => {
        $mac! {
            (F32,     "F32",     0,  1,   f32,          Some(F32)),
            (F16,     "F16",     1,  1,   F16,          Some(F16)),
            (Q4_0,    "Q4_0",    2,  32,  BlockQ4_0,    Some(Q8_0)),
            (Q4_1,    "Q4_1",    3,  32,  BlockQ4_1,    Some(Q8_1)),
            (Q5_0,    "Q5_0",    6,  32,  BlockQ5_0,    Some(Q8_0)),
            (Q5_1,    "Q5_1",    7,  32,  BlockQ5_1,    Some(Q8_1)),
            (Q8_0,    "Q8_0",    8,  32,  BlockQ8_0,    Some(Q8_0)),
            (Q8_1,    "Q8_1",    9,  32,  BlockQ8_1,    Some(Q8_1)),
            (Q2K,     "Q2_K",    10, 256, BlockQ2K,     Some(Q8K)),
            (Q3K,     "Q3_K",    11, 256, BlockQ3K,     Some(Q8K)),
            (Q4K,     "Q4_K",    12, 256, BlockQ4K,     Some(Q8K)),
            (Q5K,     "Q5_K",    13, 256, BlockQ5K,     Some(Q8K)),
            (Q6K,     "Q6_K",    14, 256, BlockQ6K,     Some(Q8K)),
            (Q8K,     "Q8_K",    15, 256, BlockQ8K,     Some(Q8K)),
            (IQ2XXS,  "IQ2_XXS", 16, 256, BlockIQ2XXS,  Some(Q8K)),
            (IQ2XS,   "IQ2_XS",  17, 256, BlockIQ2XS,   Some(Q8K)),
            (IQ3XXS,  "IQ3_XXS", 18, 256, BlockIQ3XXS,  Some(Q8K)),
            (IQ1S,    "IQ1_S",   19, 256, BlockIQ1S,    Some(Q8K)),
            (IQ4NL,   "IQ4_NL",  20, 32,  BlockIQ4NL,   Some(Q8_0)),
            (IQ3S,    "IQ3_S",   21, 256, BlockIQ3S,    Some(Q8K)),
            (IQ2S,    "IQ2_S",   22, 256, BlockIQ2S,    Some(Q8K)),
            (IQ4XS,   "IQ4_XS",  23, 256, BlockIQ4XS,   Some(Q8K)),
            (I8,      "I8",      24, 1,   i8,           None),
            (I16,     "I16",     25, 1,   i16,          None),
            (I32,     "I32",     26, 1,   i32,          None),
            (I64,     "I64",     27, 1,   i64,          None),
            (F64,     "F64",     28, 1,   f64,          None),
            (IQ1M,    "IQ1_M",   29, 256, BlockIQ1M,    Some(Q8K)),
            (BF16,    "BF16",    30, 1,   BF16,         Some(BF16)),
            (TQ1_0,   "TQ1_0",   34, 256, BlockTQ1_0,   Some(Q8K)),
            (TQ2_0,   "TQ2_0",   35, 256, BlockTQ2_0,   Some(Q8K)),
            (MXFP4,   "MXFP4",   39, 32,  BlockMXFP4,   Some(Q8_0)),
            (NVFP4,   "NVFP4",   40, 64,  BlockNVFP4,   Some(Q8_0)),
            (Q1_0,    "Q1_0",    41, 128, BlockQ1_0,    Some(Q8_0)),
            (Q2_0,    "Q2_0",    42, 64,  BlockQ2_0,    Some(Q8_0)),
        }
    };
}

macro_rules! define_quant_kind {
    ($(($v:ident, $name:literal, $id:literal, $elems:literal, $block:ty, $dot:expr)),* $(,)?) => {
        /// A GGML tensor type, as stored in a GGUF tensor directory.
        #[allow(non_camel_case_types)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum QuantKind {
            $(
                #[doc = concat!("GGML type `", $name, "` (GGUF id ", stringify!($id), ").")]
                $v,
            )*
        }

        impl QuantKind {
            /// Every kind, in table order.
            pub const ALL: &'static [QuantKind] = &[$(QuantKind::$v),*];

            /// The canonical name (`Q4_K`, `IQ2_XXS`, `BF16`), as gguf-dump prints it.
            pub const fn name(self) -> &'static str {
                match self { $(QuantKind::$v => $name),* }
            }

            /// The type id a GGUF tensor directory stores.
            pub const fn gguf_id(self) -> u32 {
                match self { $(QuantKind::$v => $id),* }
            }

            /// The kind with GGUF type id `id`, or `None` for an id no kind has
            /// (including the removed Q4_2/Q4_3 and the Q4_0_4_4-style repacks).
            pub const fn from_gguf_id(id: u32) -> Option<QuantKind> {
                match id { $($id => Some(QuantKind::$v),)* _ => None }
            }

            /// Elements per block (1 for plain float and integer kinds).
            pub const fn block_elems(self) -> usize {
                match self { $(QuantKind::$v => $elems),* }
            }

            /// Bytes per block: the `size_of` of the kind's block struct.
            /// Total over every kind.
            pub const fn block_bytes(self) -> usize {
                match self { $(QuantKind::$v => core::mem::size_of::<$block>()),* }
            }

            /// The kind an activation is converted to for a dot product with a
            /// weight of this kind (ggml's `vec_dot_type`); `None` for kinds
            /// that are not weight formats.
            pub const fn vec_dot_kind(self) -> Option<QuantKind> {
                use QuantKind::*;
                match self { $($v => $dot),* }
            }
        }

        // Each row's element count must match the block struct's own constant,
        // so the table and the struct cannot disagree.
        const _: () = {
            $(assert!(<$block as $crate::blocks::Block>::ELEMS == $elems, concat!("block elems of ", $name));)*
        };
    };
}
quant_kinds!(define_quant_kind);

impl QuantKind {
    /// Parses a kind name case-insensitively (`q4_k`, `Q4_K`, `iq4_xs`).
    pub fn from_name(s: &str) -> Option<QuantKind> {
        QuantKind::ALL
            .iter()
            .copied()
            .find(|k| k.name().eq_ignore_ascii_case(s))
    }

    /// Whether blocks hold more than one element (a "quantized" kind).
    pub const fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes needed for `n_elems` elements, or `None` when `n_elems` is not a
    /// whole number of blocks or the size overflows `usize`.
    pub const fn bytes_for(self, n_elems: u64) -> Option<u64> {
        let be = self.block_elems() as u64;
        if !n_elems.is_multiple_of(be) {
            return None;
        }
        (n_elems / be).checked_mul(self.block_bytes() as u64)
    }
}

impl std::fmt::Display for QuantKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_round_trips_through_its_gguf_id_and_name() {
        for &k in QuantKind::ALL {
            assert_eq!(QuantKind::from_gguf_id(k.gguf_id()), Some(k));
            assert_eq!(QuantKind::from_name(k.name()), Some(k));
            assert_eq!(QuantKind::from_name(&k.name().to_lowercase()), Some(k));
        }
        assert_eq!(QuantKind::ALL.len(), 35);
    }

    #[test]
    fn removed_and_repacked_type_ids_are_not_kinds() {
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, u32::MAX] {
            assert_eq!(QuantKind::from_gguf_id(id), None, "id {id}");
        }
    }

    /// Sizes as ggml's `type_traits` table states them (`blck_size`, `type_size`).
    #[test]
    fn block_sizes_match_ggml_type_traits() {
        use QuantKind::*;
        let want: &[(QuantKind, usize, usize)] = &[
            (F32, 1, 4), (F16, 1, 2), (BF16, 1, 2), (F64, 1, 8),
            (I8, 1, 1), (I16, 1, 2), (I32, 1, 4), (I64, 1, 8),
            (Q4_0, 32, 18), (Q4_1, 32, 20), (Q5_0, 32, 22), (Q5_1, 32, 24),
            (Q8_0, 32, 34), (Q8_1, 32, 36), (Q2K, 256, 84), (Q3K, 256, 110),
            (Q4K, 256, 144), (Q5K, 256, 176), (Q6K, 256, 210), (Q8K, 256, 292),
            (IQ1S, 256, 50), (IQ1M, 256, 56), (IQ2XXS, 256, 66), (IQ2XS, 256, 74),
            (IQ2S, 256, 82), (IQ3XXS, 256, 98), (IQ3S, 256, 110), (IQ4NL, 32, 18),
            (IQ4XS, 256, 136), (TQ1_0, 256, 54), (TQ2_0, 256, 66), (MXFP4, 32, 17),
            (NVFP4, 64, 36), (Q1_0, 128, 18), (Q2_0, 64, 18),
        ];
        assert_eq!(want.len(), QuantKind::ALL.len());
        for &(k, elems, bytes) in want {
            assert_eq!((k.block_elems(), k.block_bytes()), (elems, bytes), "{k}");
        }
    }
}
