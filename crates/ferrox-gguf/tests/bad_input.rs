//! Every class of malformed file gets its own typed error, with the byte
//! offset of the offending item; and no input panics or over-allocates.

mod common;

use common::Raw;
use ferrox_gguf::{ErrorKind, GgufFile, GgufWriter, Value};
use ferrox_quant::QuantKind;

fn err(bytes: &[u8]) -> ferrox_gguf::GgufError {
    match GgufFile::from_bytes(bytes) {
        Ok(f) => panic!("expected an error, parsed {f:?}"),
        Err(e) => e,
    }
}

/// Header (24) + one tensor info for "t" (8+1 name, 4 n_dims, 8 per dim, 4
/// type, 8 offset): 57 bytes with one dim, 65 with two; padded to 64 or 96.
fn one_tensor(dims: &[u64], type_id: u32, offset: u64, data_len: usize) -> Vec<u8> {
    Raw::header(3, 1, 0)
        .tensor("t", dims, type_id, offset)
        .pad(32)
        .zeros(data_len)
        .0
}

#[test]
fn a_valid_hand_built_file_parses() {
    // The baseline the other tests break one field of.
    let f = GgufFile::from_bytes(&one_tensor(&[4, 2], 0, 0, 32)).unwrap();
    assert_eq!(f.data_offset(), 96);
    assert_eq!(f.tensors()[0].n_bytes, 32);
    assert_eq!(f.tensor_data(&f.tensors()[0]).unwrap().len(), 32);
}

#[test]
fn every_truncation_of_a_valid_file_is_a_truncation_or_bounds_error() {
    let good = one_tensor(&[4, 2], 0, 0, 32);
    for len in 0..good.len() {
        let e = err(&good[..len]);
        assert!(
            matches!(
                e.kind,
                ErrorKind::Truncated { .. }
                    | ErrorKind::CountExceedsFile { .. }
                    | ErrorKind::TensorOutOfBounds { .. }
            ),
            "len {len}: {e}"
        );
    }
    // Cut inside the tensor info's type field: offset 24 + 8+1+4+16 = 53.
    let e = err(&good[..55]);
    assert!(
        matches!(
            e.kind,
            ErrorKind::Truncated {
                what: "tensor type",
                needed: 4,
                available: 2
            }
        ),
        "{e}"
    );
    assert_eq!(e.offset, Some(53));
}

#[test]
fn bad_magic_is_reported_with_the_bytes_found() {
    let mut b = one_tensor(&[4], 0, 0, 16);
    b[..4].copy_from_slice(b"GGML");
    let e = err(&b);
    assert!(
        matches!(e.kind, ErrorKind::BadMagic { found } if &found == b"GGML"),
        "{e}"
    );
    assert_eq!(e.offset, Some(0));
}

#[test]
fn version_1_and_unknown_versions_are_rejected() {
    for v in [0u32, 1, 4, 1000] {
        let e = err(&Raw::header(v, 0, 0).0);
        assert!(
            matches!(e.kind, ErrorKind::UnsupportedVersion { found } if found == v),
            "{e}"
        );
        assert_eq!(e.offset, Some(4));
    }
    assert!(err(&Raw::header(1, 0, 0).0)
        .to_string()
        .contains("version 1"));
}

#[test]
fn versions_2_and_3_are_both_accepted() {
    for v in [2u32, 3] {
        let f = GgufFile::from_bytes(&Raw::header(v, 0, 1).kv_u32("k", 9).0).unwrap();
        assert_eq!(f.version(), v);
        assert_eq!(f.get_u32("k").unwrap(), 9);
    }
}

#[test]
fn a_big_endian_file_is_named_as_such() {
    let e = err(&Raw::default()
        .bytes(b"GGUF")
        .bytes(&3u32.to_be_bytes())
        .u64(0)
        .u64(0)
        .0);
    assert!(
        matches!(e.kind, ErrorKind::BigEndian { field: "version" }),
        "{e}"
    );
    assert!(e.to_string().contains("big-endian"));
    let e = err(&Raw::default().bytes(b"FUGG").u32(3).u64(0).u64(0).0);
    assert!(
        matches!(e.kind, ErrorKind::BigEndian { field: "magic" }),
        "{e}"
    );
}

#[test]
fn a_tensor_count_of_2_pow_60_is_refused_before_allocating() {
    let e = err(&Raw::header(3, 1 << 60, 0).0);
    assert!(
        matches!(e.kind, ErrorKind::CountExceedsFile { what: "tensor count", count, .. } if count == 1 << 60),
        "{e}"
    );
    assert_eq!(e.offset, Some(8));
    let e = err(&Raw::header(3, 0, 1 << 60).0);
    assert!(
        matches!(
            e.kind,
            ErrorKind::CountExceedsFile {
                what: "metadata key/value count",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.offset, Some(16));
}

#[test]
fn an_array_count_of_2_pow_60_is_refused_before_allocating() {
    for elem_type in 0..=12u32 {
        let b = Raw::header(3, 0, 1)
            .str(b"k")
            .u32(9)
            .u32(elem_type)
            .u64(1 << 60)
            .zeros(64)
            .0;
        let e = err(&b);
        assert!(
            matches!(e.kind, ErrorKind::CountExceedsFile { what: "array element count", count, .. } if count == 1 << 60),
            "type {elem_type}: {e}"
        );
        assert_eq!(e.offset, Some(24 + 9 + 4 + 4));
    }
}

#[test]
fn a_string_length_of_2_pow_60_is_refused_before_allocating() {
    // As a key, as a string value, and as a tensor name.
    let e = err(&Raw::header(3, 0, 1).u64(1 << 60).zeros(16).0);
    assert!(
        matches!(
            e.kind,
            ErrorKind::CountExceedsFile {
                what: "metadata key",
                ..
            }
        ),
        "{e}"
    );
    let e = err(&Raw::header(3, 0, 1)
        .str(b"k")
        .u32(8)
        .u64(1 << 60)
        .bytes(b"abc")
        .0);
    assert!(
        matches!(
            e.kind,
            ErrorKind::CountExceedsFile {
                what: "string length",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.offset, Some(24 + 9 + 4));
    let e = err(&Raw::header(3, 1, 0).u64(1 << 60).zeros(40).0);
    assert!(
        matches!(
            e.kind,
            ErrorKind::CountExceedsFile {
                what: "tensor name",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn an_unknown_value_type_is_an_error_at_its_type_field() {
    let e = err(&Raw::header(3, 0, 1).str(b"k").u32(13).u32(0).0);
    assert!(
        matches!(e.kind, ErrorKind::UnknownValueType { type_id: 13 }),
        "{e}"
    );
    assert_eq!(e.offset, Some(24 + 9));
}

#[test]
fn an_unknown_tensor_type_is_an_error_at_its_type_field() {
    // 4 was Q4_2, removed from ggml.
    let e = err(&one_tensor(&[32], 4, 0, 64));
    assert!(
        matches!(&e.kind, ErrorKind::UnknownTensorType { tensor, type_id: 4 } if tensor == "t"),
        "{e}"
    );
    assert_eq!(e.offset, Some(24 + 9 + 4 + 8));
}

#[test]
fn a_non_utf8_key_is_an_error() {
    let e = err(&Raw::header(3, 0, 1).str(b"bad\xffkey").u32(4).u32(1).0);
    assert!(
        matches!(&e.kind, ErrorKind::InvalidUtf8 { what, .. } if what == "metadata key"),
        "{e}"
    );
    assert_eq!(e.offset, Some(24));
}

#[test]
fn a_non_utf8_tensor_name_is_an_error() {
    let e = err(&Raw::header(3, 1, 0)
        .str(b"\xc3")
        .u32(1)
        .u64(4)
        .u32(0)
        .u64(0)
        .pad(32)
        .zeros(16)
        .0);
    assert!(
        matches!(&e.kind, ErrorKind::InvalidUtf8 { what, .. } if what == "tensor name"),
        "{e}"
    );
}

#[test]
fn a_non_utf8_string_value_is_kept_but_get_str_refuses_it() {
    let f =
        GgufFile::from_bytes(&Raw::header(3, 0, 1).str(b"k").u32(8).str(b"\xff\xfe").0).unwrap();
    assert_eq!(
        f.get("k").and_then(|v| if let Value::String(s) = v {
            Some(s.as_bytes())
        } else {
            None
        }),
        Some(&b"\xff\xfe"[..])
    );
    assert!(matches!(
        f.get_str("k").unwrap_err().kind,
        ErrorKind::InvalidUtf8 { .. }
    ));
}

#[test]
fn a_bool_other_than_0_or_1_is_an_error() {
    let e = err(&Raw::header(3, 0, 1).str(b"k").u32(7).u8(2).0);
    assert!(matches!(e.kind, ErrorKind::InvalidBool { found: 2 }), "{e}");
}

#[test]
fn a_duplicate_key_is_an_error() {
    let e = err(&Raw::header(3, 0, 2).kv_u32("k", 1).kv_u32("k", 2).0);
    assert!(
        matches!(&e.kind, ErrorKind::DuplicateKey { key } if key == "k"),
        "{e}"
    );
    assert_eq!(e.offset, Some(24 + 17));
}

#[test]
fn arrays_nested_too_deep_are_an_error_not_a_stack_overflow() {
    let mut r = Raw::header(3, 0, 1).str(b"k").u32(9);
    for _ in 0..100_000 {
        r = r.u32(9).u64(1);
    }
    let e = err(&r.u32(4).u64(0).0);
    assert!(matches!(e.kind, ErrorKind::NestingTooDeep { .. }), "{e}");
}

#[test]
fn a_shape_that_is_not_whole_blocks_is_an_error() {
    // Q4_K (id 12) blocks are 256 elements; ne0 = 100 is not whole blocks.
    let e = err(&one_tensor(&[100, 2], 12, 0, 288));
    assert!(
        matches!(&e.kind, ErrorKind::NotWholeBlocks { tensor, kind: QuantKind::Q4K, ne0: 100, block_elems: 256 } if tensor == "t"),
        "{e}"
    );
    assert_eq!(e.offset, Some(24));
}

#[test]
fn more_than_four_dims_is_an_error() {
    let e = err(&one_tensor(&[1, 1, 1, 1, 1], 0, 0, 32));
    assert!(
        matches!(e.kind, ErrorKind::TooManyDims { n_dims: 5, .. }),
        "{e}"
    );
}

#[test]
fn a_shape_whose_size_overflows_is_an_error() {
    let e = err(&one_tensor(&[1 << 40, 1 << 40], 0, 0, 32));
    assert!(matches!(e.kind, ErrorKind::ShapeOverflow { .. }), "{e}");
    let e = err(&one_tensor(&[u64::MAX], 0, 0, 32));
    assert!(matches!(e.kind, ErrorKind::ShapeOverflow { .. }), "{e}");
}

#[test]
fn a_misaligned_tensor_offset_is_an_error() {
    let e = err(&one_tensor(&[4], 0, 4, 64));
    assert!(
        matches!(
            e.kind,
            ErrorKind::MisalignedTensor {
                offset: 4,
                alignment: 32,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.offset, Some(24));
}

#[test]
fn tensor_data_past_the_end_of_the_file_is_an_error() {
    let e = err(&one_tensor(&[8, 2], 0, 0, 63));
    assert!(
        matches!(
            e.kind,
            ErrorKind::TensorOutOfBounds {
                start: 96,
                end: 160,
                file_len: 159,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.offset, Some(24));
    // An offset near 2^64 must not wrap around into the file.
    let e = err(&one_tensor(&[8], 0, u64::MAX - 31, 64));
    assert!(matches!(e.kind, ErrorKind::TensorOutOfBounds { .. }), "{e}");
}

#[test]
fn overlapping_tensors_are_an_error() {
    // a: 64 bytes at 0; b: 32 bytes at 32 (inside a).
    let b = Raw::header(3, 2, 0)
        .tensor("a", &[16], 0, 0)
        .tensor("b", &[8], 0, 32)
        .pad(32)
        .zeros(96)
        .0;
    let e = err(&b);
    assert!(
        matches!(&e.kind, ErrorKind::TensorOverlap { tensor, other, start: 32, other_end: 64, .. } if tensor == "b" && other == "a"),
        "{e}"
    );
    // Listed in the other order, the later-starting one is still named.
    let b = Raw::header(3, 2, 0)
        .tensor("b", &[8], 0, 32)
        .tensor("a", &[16], 0, 0)
        .pad(32)
        .zeros(96)
        .0;
    assert!(matches!(&err(&b).kind, ErrorKind::TensorOverlap { tensor, .. } if tensor == "b"));
}

#[test]
fn non_canonical_but_disjoint_tensor_order_is_accepted() {
    let b = Raw::header(3, 2, 0)
        .tensor("late", &[8], 0, 64)
        .tensor("early", &[8], 0, 0)
        .pad(32)
        .zeros(96)
        .0;
    let f = GgufFile::from_bytes(&b).unwrap();
    assert_eq!(f.tensor("late").unwrap().offset, 64);
}

#[test]
fn a_duplicate_tensor_name_is_an_error() {
    let b = Raw::header(3, 2, 0)
        .tensor("t", &[8], 0, 0)
        .tensor("t", &[8], 0, 32)
        .pad(32)
        .zeros(64)
        .0;
    assert!(matches!(&err(&b).kind, ErrorKind::DuplicateTensor { name } if name == "t"));
}

#[test]
fn a_bad_general_alignment_is_an_error() {
    for (ty, val) in [(4u32, 0u32), (4, 48)] {
        let b = Raw::header(3, 0, 1)
            .str(b"general.alignment")
            .u32(ty)
            .u32(val)
            .0;
        assert!(
            matches!(err(&b).kind, ErrorKind::BadAlignment { .. }),
            "{val}"
        );
    }
    // The right number with the wrong type (u64) is also refused.
    let b = Raw::header(3, 0, 1)
        .str(b"general.alignment")
        .u32(10)
        .u64(32)
        .0;
    let e = err(&b);
    assert!(matches!(e.kind, ErrorKind::BadAlignment { .. }), "{e}");
    assert_eq!(e.offset, Some(24));
}

#[test]
fn general_alignment_governs_the_data_section_and_offsets() {
    let b = Raw::header(3, 1, 1)
        .str(b"general.alignment")
        .u32(4)
        .u32(128)
        .tensor("t", &[4], 0, 0)
        .pad(128)
        .zeros(16)
        .0;
    let f = GgufFile::from_bytes(&b).unwrap();
    assert_eq!((f.alignment(), f.data_offset()), (128, 128));
    // An offset aligned to 32 but not to 128 is refused.
    let b = Raw::header(3, 1, 1)
        .str(b"general.alignment")
        .u32(4)
        .u32(128)
        .tensor("t", &[4], 0, 32)
        .pad(128)
        .zeros(64)
        .0;
    assert!(matches!(
        err(&b).kind,
        ErrorKind::MisalignedTensor { alignment: 128, .. }
    ));
}

#[test]
fn errors_from_a_file_name_the_file() {
    let dir = common::scratch_dir("errors_name_file");
    let p = dir.join("broken.gguf");
    std::fs::write(&p, one_tensor(&[4], 0, 4, 64)).unwrap();
    let e = GgufFile::open(&p).unwrap_err();
    assert_eq!(e.path.as_deref(), Some(p.as_path()));
    let msg = e.to_string();
    assert!(
        msg.contains("broken.gguf")
            && msg.contains("byte 24")
            && msg.contains("multiple of the alignment 32"),
        "{msg}"
    );
    let e = GgufFile::open(dir.join("absent.gguf")).unwrap_err();
    assert!(matches!(e.kind, ErrorKind::Io(_)), "{e}");
}

#[test]
fn typed_getters_name_a_missing_key_and_a_wrong_type() {
    let f = GgufFile::from_bytes(&Raw::header(3, 0, 1).kv_u32("n", 7).0).unwrap();
    assert!(
        matches!(&f.get_u32("m").unwrap_err().kind, ErrorKind::MissingKey { key } if key == "m")
    );
    let e = f.get_str("n").unwrap_err();
    assert!(
        matches!(&e.kind, ErrorKind::WrongType { key, found: ferrox_gguf::ValueType::U32, .. } if key == "n"),
        "{e}"
    );
    assert_eq!(e.offset, Some(24));
    assert!(matches!(
        f.get_u64("n").unwrap_err().kind,
        ErrorKind::WrongType { .. }
    ));
    assert_eq!(f.get_uint("n").unwrap(), 7);
}

#[test]
fn tensor_data_for_a_foreign_tensor_info_is_an_error_not_a_panic() {
    let f = GgufFile::from_bytes(&one_tensor(&[4], 0, 0, 32)).unwrap();
    let mut t = f.tensors()[0].clone();
    t.offset = 1 << 40;
    assert!(matches!(
        f.tensor_data(&t).unwrap_err().kind,
        ErrorKind::TensorOutOfBounds { .. }
    ));
}

/// A valid file with metadata of every type and several tensors, from the writer.
fn mutation_seed() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.set("general.architecture", "llama").unwrap();
    w.set("a.u32", 5u32).unwrap();
    w.set("a.f32s", Value::Array(vec![1.0f32, 2.0].into()))
        .unwrap();
    w.set("a.strs", Value::Array(vec!["x", "yz"].into()))
        .unwrap();
    w.set(
        "a.nested",
        Value::Array(vec![ferrox_gguf::Array::from(vec![1u8]), vec![true].into()].into()),
    )
    .unwrap();
    w.set("a.b", true).unwrap();
    w.add_tensor("t0", QuantKind::F32, &[4, 2], vec![0u8; 32])
        .unwrap();
    w.add_tensor("t1", QuantKind::Q8_0, &[32], vec![0u8; 34])
        .unwrap();
    w.add_tensor("t2", QuantKind::F16, &[3], vec![0u8; 6])
        .unwrap();
    w.to_bytes()
}

/// Thousands of flips, truncations and insertions: each parses or errors,
/// none panics, and whatever parses has every tensor's data in bounds.
#[test]
fn mutated_files_never_panic() {
    let seed = mutation_seed();
    GgufFile::from_bytes(&seed).expect("the seed itself is valid");
    let mut rng = ferrox_gguf::testing::SplitMix64(42);
    let (mut ok, mut errs) = (0, 0);
    for i in 0..20_000 {
        let mut b = seed.clone();
        for _ in 0..1 + rng.next_u64() % 4 {
            let at = (rng.next_u64() % b.len().max(1) as u64) as usize;
            match rng.next_u64() % 6 {
                0 => b[at] ^= 1 << (rng.next_u64() % 8),
                1 => b[at] = (rng.next_u64() >> 56) as u8,
                2 => b.truncate(at),
                3 => b.insert(at, (rng.next_u64() >> 56) as u8),
                4 => {
                    b.remove(at);
                }
                // Big little-endian numbers where counts live.
                _ => {
                    let v = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x0f];
                    let end = (at + 8).min(b.len());
                    b[at..end].copy_from_slice(&v[..end - at]);
                }
            }
            if b.is_empty() {
                break;
            }
        }
        match GgufFile::from_bytes(&b) {
            Ok(f) => {
                ok += 1;
                for t in f.tensors() {
                    assert_eq!(
                        f.tensor_data(t).unwrap().len() as u64,
                        t.n_bytes,
                        "mutation {i}"
                    );
                }
            }
            Err(_) => errs += 1,
        }
    }
    // Both outcomes must occur, or the mutations are not exercising the parser.
    assert!(ok > 100 && errs > 100, "ok {ok}, errors {errs}");
}

#[test]
fn an_empty_file_on_disk_is_a_truncation_error() {
    let dir = common::scratch_dir("empty_file");
    let p = dir.join("empty.gguf");
    std::fs::write(&p, b"").unwrap();
    let e = GgufFile::open(&p).unwrap_err();
    assert!(
        matches!(
            e.kind,
            ErrorKind::Truncated {
                what: "magic",
                needed: 4,
                available: 0
            }
        ),
        "{e}"
    );
}

/// A well-formed file cut short (a partial download) says "truncated" with
/// the bytes it has and the bytes it should have; tensors whose offsets do
/// not lie back to back are a corrupt table, not a truncation, and keep the
/// bounds message.
#[test]
fn a_file_cut_short_says_truncated_with_its_size_and_the_full_size() {
    // Two F32 tensors of 32 bytes back to back: data 96..160, cut at 150.
    let whole = Raw::header(3, 2, 0).tensor("a", &[8], 0, 0).tensor("b", &[8], 0, 32).pad(32).zeros(64).0;
    let full = whole.len() as u64;
    let e = err(&whole[..whole.len() - 10]);
    assert!(matches!(e.kind, ErrorKind::TensorOutOfBounds { full_len: Some(f), .. } if f == full), "{e}");
    assert!(e.to_string().contains(&format!("truncated: {} of {full} bytes", full - 10)), "{e}");
    // A gap between the tensors: not how any writer lays them out.
    let gap = Raw::header(3, 2, 0).tensor("a", &[8], 0, 0).tensor("b", &[8], 0, 64).pad(32).zeros(64).0;
    let e = err(&gap);
    assert!(matches!(e.kind, ErrorKind::TensorOutOfBounds { full_len: None, .. }), "{e}");
    assert!(!e.to_string().contains("truncated"), "{e}");
    // Text is not a GGUF file, said in words.
    let e = err(b"hello, this is text");
    assert!(e.to_string().contains("not a GGUF file: it starts with \"hell\""), "{e}");
}
