//! The writer and reader agree with each other and with gguf-py, byte for byte.

mod common;

use ferrox_gguf::testing::{tiny_model, Fill, TinyTensor};
use ferrox_gguf::{
    Array, ErrorKind, GgufFile, GgufModel, GgufString, GgufWriter, Value, ValueType,
};
use ferrox_quant::QuantKind;

fn rewrite(bytes: &[u8]) -> Vec<u8> {
    let f = GgufFile::from_bytes(bytes).unwrap();
    GgufWriter::from_file(&f).unwrap().to_bytes()
}

/// The values make_gguf_py_fixtures.py wrote, restated here by hand.
fn check_all_types(f: &GgufFile) {
    assert_eq!(f.get_str("general.architecture").unwrap(), "ferrox-test");
    assert_eq!(f.get_u8("test.u8").unwrap(), 200);
    assert_eq!(f.get_i8("test.i8").unwrap(), -100);
    assert_eq!(f.get_u16("test.u16").unwrap(), 60000);
    assert_eq!(f.get_i16("test.i16").unwrap(), -30000);
    assert_eq!(f.get_u32("test.u32").unwrap(), 4_000_000_000);
    assert_eq!(f.get_i32("test.i32").unwrap(), -2_000_000_000);
    assert_eq!(f.get_f32("test.f32").unwrap(), 0.1f32);
    assert_eq!(f.get_u64("test.u64").unwrap(), (1u64 << 63) + 5);
    assert_eq!(f.get_i64("test.i64").unwrap(), -(1i64 << 62));
    assert_eq!(f.get_f64("test.f64").unwrap(), -1.0e-300);
    assert!(f.get_bool("test.bool_true").unwrap());
    assert!(!f.get_bool("test.bool_false").unwrap());
    assert_eq!(f.get_str("test.string").unwrap(), "héllo wörld ✓");
    assert_eq!(
        f.get_array("test.strings").unwrap(),
        &Array::from(vec!["a", "", "ünïcode", "tab\there"])
    );
    assert_eq!(
        f.get_array("test.u8s").unwrap(),
        &Array::U8(vec![1, 2, 255])
    );
    assert_eq!(
        f.get_array("test.f32s").unwrap(),
        &Array::F32(vec![1.5, -2.25, 3.0e38])
    );
    assert_eq!(
        f.get_array("test.i64s").unwrap(),
        &Array::I64(vec![-1, 1 << 62])
    );
    assert_eq!(
        f.get_array("test.bools").unwrap(),
        &Array::Bool(vec![true, false, true])
    );
    // gguf-py stores Python ints as INT32 in an untyped array.
    assert_eq!(
        f.get_array("test.nested").unwrap(),
        &Array::Array(vec![
            Array::I32(vec![1, 2, 3]),
            Array::I32(vec![4]),
            Array::I32(vec![5, 6])
        ])
    );
    assert_eq!(
        f.get_array("test.nested_strings").unwrap(),
        &Array::Array(vec![vec!["x", "y"].into(), vec!["z"].into()])
    );
    let dir: Vec<(&str, QuantKind, Vec<u64>)> = f
        .tensors()
        .iter()
        .map(|t| (t.name.as_str(), t.kind, t.dims.clone()))
        .collect();
    assert_eq!(
        dir,
        vec![
            ("f32.weight", QuantKind::F32, vec![5, 3]),
            ("f16.weight", QuantKind::F16, vec![7]),
            ("i32.weight", QuantKind::I32, vec![3, 2]),
            ("q8_0.weight", QuantKind::Q8_0, vec![32, 2]),
            ("q4_k.weight", QuantKind::Q4K, vec![256, 1]),
        ]
    );
    let i32s = f.tensor_data(f.tensor("i32.weight").unwrap()).unwrap();
    let want: Vec<u8> = (0..6i32).flat_map(|x| x.to_le_bytes()).collect();
    assert_eq!(i32s, &want[..]);
}

#[test]
fn a_gguf_py_file_reads_with_every_value_type() {
    let f = GgufFile::open(common::testdata("gguf_py_all_types.gguf")).unwrap();
    assert_eq!((f.version(), f.alignment()), (3, 32));
    check_all_types(&f);
}

#[test]
fn a_gguf_py_file_round_trips_byte_identically() {
    for name in ["gguf_py_all_types.gguf", "gguf_py_align64.gguf"] {
        let orig = std::fs::read(common::testdata(name)).unwrap();
        assert_eq!(rewrite(&orig), orig, "{name}");
    }
}

#[test]
fn a_gguf_py_file_with_alignment_64_reads_with_that_alignment() {
    let f = GgufFile::open(common::testdata("gguf_py_align64.gguf")).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    assert!(f.tensors().iter().all(|t| t.offset % 64 == 0));
    check_all_types(&f);
}

fn every_value() -> Vec<(String, Value)> {
    let v: Vec<(&str, Value)> = vec![
        ("u8", 1u8.into()),
        ("i8", (-2i8).into()),
        ("u16", 3u16.into()),
        ("i16", (-4i16).into()),
        ("u32", 5u32.into()),
        ("i32", (-6i32).into()),
        ("f32", f32::from_bits(0x7fc0_1234).into()), // a NaN payload must survive
        ("u64", u64::MAX.into()),
        ("i64", i64::MIN.into()),
        ("f64", (-0.0f64).into()),
        ("bool", true.into()),
        ("str", "ok".into()),
        ("bytes", Value::String(GgufString(vec![0xff, 0x00, 0x41]))),
        ("empty_f32s", Value::Array(Array::F32(vec![]))),
        ("empty_arrays", Value::Array(Array::Array(vec![]))),
        (
            "nested3",
            Value::Array(Array::Array(vec![Array::Array(vec![
                vec![1u16, 2].into(),
                Array::Bool(vec![]),
            ])])),
        ),
        (
            "mixed_inner",
            Value::Array(Array::Array(vec![vec!["s"].into(), vec![1.0f64].into()])),
        ),
    ];
    v.into_iter().map(|(k, v)| (format!("t.{k}"), v)).collect()
}

#[test]
fn written_files_read_back_equal_and_rewrite_byte_identically() {
    for version in [2u32, 3] {
        for align in [None, Some(1u32), Some(8), Some(256)] {
            let mut w = GgufWriter::new();
            w.set_version(version).unwrap();
            if let Some(a) = align {
                w.set("general.alignment", a).unwrap();
            }
            for (k, v) in every_value() {
                w.set(k, v).unwrap();
            }
            w.add_tensor("a", QuantKind::F32, &[3], vec![1u8; 12])
                .unwrap();
            w.add_tensor("b", QuantKind::Q4_0, &[64, 1, 1, 1], vec![2u8; 36])
                .unwrap();
            w.add_tensor("empty", QuantKind::F16, &[0, 5], Vec::new())
                .unwrap();
            w.add_tensor("c", QuantKind::IQ2XXS, &[256], vec![3u8; 66])
                .unwrap();
            let bytes = w.to_bytes();
            let f = GgufFile::from_bytes(&bytes).unwrap();
            assert_eq!(f.version(), version);
            assert_eq!(f.alignment(), align.map_or(32, u64::from));
            let got: Vec<_> = f
                .metadata()
                .iter()
                .filter(|(k, _)| k != "general.alignment")
                .cloned()
                .collect();
            // Compare floats by bits: NaN != NaN.
            assert_eq!(format!("{:?}", got), format!("{:?}", every_value()));
            assert_eq!(
                f.get("t.f32").map(|v| if let Value::F32(x) = v {
                    x.to_bits()
                } else {
                    0
                }),
                Some(0x7fc0_1234)
            );
            assert_eq!(
                f.tensor_data(f.tensor("b").unwrap()).unwrap(),
                &[2u8; 36][..]
            );
            assert_eq!(
                f.tensor_data(f.tensor("c").unwrap()).unwrap(),
                &[3u8; 66][..]
            );
            assert_eq!(f.tensor("empty").unwrap().n_bytes, 0);
            assert_eq!(rewrite(&bytes), bytes, "version {version} align {align:?}");
            // Data section and every tensor sit on the alignment, padding is zeros.
            let a = f.alignment();
            assert_eq!(f.data_offset() % a, 0);
            assert_eq!(bytes.len() as u64 % a, 0);
        }
    }
}

#[test]
fn written_files_match_a_hand_computed_layout() {
    let mut w = GgufWriter::new();
    w.set("k", 7u32).unwrap();
    w.add_tensor("t", QuantKind::F32, &[2], vec![0xAA; 8])
        .unwrap();
    let b = w.to_bytes();
    let mut want = Vec::new();
    want.extend_from_slice(b"GGUF");
    want.extend_from_slice(&3u32.to_le_bytes());
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(b"k");
    want.extend_from_slice(&4u32.to_le_bytes());
    want.extend_from_slice(&7u32.to_le_bytes());
    want.extend_from_slice(&1u64.to_le_bytes());
    want.extend_from_slice(b"t");
    want.extend_from_slice(&1u32.to_le_bytes());
    want.extend_from_slice(&2u64.to_le_bytes());
    want.extend_from_slice(&0u32.to_le_bytes());
    want.extend_from_slice(&0u64.to_le_bytes());
    assert_eq!(want.len(), 24 + 17 + 33);
    want.resize(96, 0);
    want.extend_from_slice(&[0xAA; 8]);
    want.resize(128, 0);
    assert_eq!(b, want);
}

#[test]
fn the_writer_refuses_inputs_the_reader_would_refuse() {
    let mut w = GgufWriter::new();
    w.set("k", 1u32).unwrap();
    assert!(matches!(
        w.set("k", 2u32).unwrap_err().kind,
        ErrorKind::DuplicateKey { .. }
    ));
    assert!(matches!(
        w.set("general.alignment", 24u32).unwrap_err().kind,
        ErrorKind::BadAlignment { .. }
    ));
    assert!(matches!(
        w.set("general.alignment", 32u64).unwrap_err().kind,
        ErrorKind::BadAlignment { .. }
    ));
    assert!(matches!(
        w.set_version(1).unwrap_err().kind,
        ErrorKind::UnwritableVersion { found: 1 }
    ));
    let e = w
        .add_tensor("q", QuantKind::Q4K, &[100], vec![0u8; 144])
        .unwrap_err();
    assert!(
        matches!(
            e.kind,
            ErrorKind::NotWholeBlocks {
                ne0: 100,
                block_elems: 256,
                ..
            }
        ),
        "{e}"
    );
    let e = w
        .add_tensor("q", QuantKind::Q4K, &[256], vec![0u8; 143])
        .unwrap_err();
    assert!(
        matches!(
            e.kind,
            ErrorKind::TensorDataLength {
                expected: 144,
                found: 143,
                ..
            }
        ),
        "{e}"
    );
    let e = w
        .add_tensor("q", QuantKind::F32, &[1, 1, 1, 1, 1], vec![0u8; 4])
        .unwrap_err();
    assert!(
        matches!(e.kind, ErrorKind::TooManyDims { n_dims: 5, .. }),
        "{e}"
    );
    w.add_tensor("q", QuantKind::F32, &[1], vec![0u8; 4])
        .unwrap();
    assert!(matches!(
        w.add_tensor("q", QuantKind::F32, &[1], vec![0u8; 4])
            .unwrap_err()
            .kind,
        ErrorKind::DuplicateTensor { .. }
    ));
    let mut deep = Array::U8(vec![]);
    for _ in 0..ferrox_gguf::MAX_ARRAY_DEPTH {
        deep = Array::Array(vec![deep]);
    }
    assert!(matches!(
        w.set("deep", Value::Array(deep)).unwrap_err().kind,
        ErrorKind::NestingTooDeep { .. }
    ));
}

#[test]
fn arrays_nested_to_the_depth_limit_round_trip() {
    let mut deep = Array::U8(vec![9]);
    for _ in 1..ferrox_gguf::MAX_ARRAY_DEPTH {
        deep = Array::Array(vec![deep]);
    }
    let mut w = GgufWriter::new();
    w.set("deep", Value::Array(deep.clone())).unwrap();
    let f = GgufFile::from_bytes(&w.to_bytes()).unwrap();
    assert_eq!(f.get_array("deep").unwrap(), &deep);
}

#[test]
fn a_tiny_random_model_is_deterministic_and_readable() {
    let tensors = [
        TinyTensor::new("token_embd.weight", QuantKind::F16, &[64, 10]),
        TinyTensor::new("blk.0.attn_q.weight", QuantKind::Q8_0, &[64, 64]),
        TinyTensor::new("blk.0.ffn_up.weight", QuantKind::IQ2XXS, &[256, 4]),
        TinyTensor::new("output_norm.weight", QuantKind::F32, &[64]),
    ];
    let meta = vec![("general.architecture".to_string(), Value::from("llama"))];
    let a = tiny_model(7, meta.clone(), &tensors, Fill::RawBytes)
        .unwrap()
        .to_bytes();
    let b = tiny_model(7, meta.clone(), &tensors, Fill::RawBytes)
        .unwrap()
        .to_bytes();
    let c = tiny_model(8, meta, &tensors, Fill::RawBytes)
        .unwrap()
        .to_bytes();
    assert_eq!(a, b);
    assert_ne!(a, c);
    let f = GgufFile::from_bytes(&a).unwrap();
    assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(f.tensors().len(), 4);
    assert_eq!(
        f.tensor("blk.0.attn_q.weight").unwrap().n_bytes,
        64 * 2 * 34
    );
    let norm = f
        .tensor_data(f.tensor("output_norm.weight").unwrap())
        .unwrap();
    let vals: Vec<f32> = norm
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(vals.iter().all(|v| (-1.0..1.0).contains(v)), "{vals:?}");
    assert!(vals.iter().any(|&v| v != vals[0]), "not random: {vals:?}");
    let e = tiny_model(
        1,
        vec![],
        &[TinyTensor::new("bad", QuantKind::Q4K, &[100])],
        Fill::RawBytes,
    )
    .unwrap_err();
    assert!(
        matches!(
            e.kind,
            ErrorKind::Quant { .. } | ErrorKind::NotWholeBlocks { .. }
        ),
        "{e}"
    );
}

#[test]
fn files_written_to_disk_open_with_mmap() {
    let dir = common::scratch_dir("mmap");
    let p = dir.join("m.gguf");
    let w = tiny_model(
        3,
        vec![],
        &[TinyTensor::new("x", QuantKind::F32, &[5])],
        Fill::RawBytes,
    )
    .unwrap();
    w.write_to(&p).unwrap();
    let f = GgufFile::open(&p).unwrap();
    assert_eq!(f.as_bytes(), &w.to_bytes()[..]);
    assert_eq!(f.get("x"), None);
    assert_eq!(ValueType::from_id(9), Some(ValueType::Array));
    let m = GgufModel::open(&p).unwrap();
    assert_eq!(m.parts().len(), 1);
    assert_eq!(m.tensor_data(m.tensor("x").unwrap()).unwrap().len(), 20);
}

#[test]
fn every_fuzz_seed_is_a_valid_file_that_rewrites_to_a_fixed_point() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/gguf_reader");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let p = entry.unwrap().path();
        let f = GgufFile::open(&p).unwrap();
        let once = GgufWriter::from_file(&f).unwrap().to_bytes();
        assert_eq!(rewrite(&once), once, "{}", p.display());
        n += 1;
    }
    assert!(
        n >= 5,
        "seed corpus missing: {n} files in {}",
        dir.display()
    );
}

#[test]
fn a_tiny_quantized_model_holds_its_random_values_quantized() {
    let tensors = [
        TinyTensor::new("w", QuantKind::Q8_0, &[64, 3]),
        TinyTensor::new("k", QuantKind::Q4K, &[256]),
    ];
    let bytes = tiny_model(11, vec![], &tensors, Fill::Quantize)
        .unwrap()
        .to_bytes();
    let f = GgufFile::from_bytes(&bytes).unwrap();
    // The same stream the helper drew from: the first 192 values are "w".
    let mut rng = ferrox_gguf::testing::SplitMix64(11);
    let want: Vec<f32> = (0..192).map(|_| rng.next_f32()).collect();
    let got = ferrox_quant::dequantize_to_vec(
        QuantKind::Q8_0,
        f.tensor_data(f.tensor("w").unwrap()).unwrap(),
        192,
    )
    .unwrap();
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() < 0.01, "w[{i}]: {g} vs {w}");
    }
    let k = ferrox_quant::dequantize_to_vec(
        QuantKind::Q4K,
        f.tensor_data(f.tensor("k").unwrap()).unwrap(),
        256,
    )
    .unwrap();
    assert!(k.iter().all(|x| x.is_finite() && x.abs() <= 1.1), "{k:?}");
}
