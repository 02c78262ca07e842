//! Split models load as one, and inconsistent or missing parts are errors.

mod common;

use std::path::Path;

use ferrox_gguf::{parse_split_name, ErrorKind, GgufModel, GgufWriter, Value};
use ferrox_quant::QuantKind;

#[test]
fn split_names_are_recognized_only_in_llama_cpp_format() {
    assert_eq!(
        parse_split_name(Path::new("/m/x-y-00002-of-00003.gguf")),
        Some(("x-y".into(), 2, 3))
    );
    for bad in [
        "x-2-of-3.gguf",
        "x-00002-of-00003.bin",
        "x-0002-of-00003.gguf",
        "x.gguf",
        "-of-.gguf",
    ] {
        assert_eq!(parse_split_name(Path::new(bad)), None, "{bad}");
    }
}

#[test]
fn a_gguf_py_split_loads_as_one_model_from_any_part() {
    for part in 1..=3 {
        let p = common::testdata(&format!("gguf_py_split-{part:05}-of-00003.gguf"));
        let m = GgufModel::open(&p).unwrap();
        assert_eq!(m.parts().len(), 3);
        let names: Vec<(&str, usize)> = m
            .tensors()
            .iter()
            .map(|t| (t.info.name.as_str(), t.part))
            .collect();
        assert_eq!(
            names,
            [
                ("f32.weight", 0),
                ("f16.weight", 0),
                ("i32.weight", 1),
                ("q8_0.weight", 1),
                ("q4_k.weight", 2)
            ]
        );
        assert_eq!(
            m.metadata_file().get_str("general.architecture").unwrap(),
            "ferrox-test"
        );
        assert_eq!(m.metadata_file().get_u32("test.u32").unwrap(), 7);
        let t = m.tensor("i32.weight").unwrap();
        let want: Vec<u8> = (0..6i32).flat_map(|x| x.to_le_bytes()).collect();
        assert_eq!(m.tensor_data(t).unwrap(), &want[..]);
    }
}

#[test]
fn a_missing_split_part_is_named() {
    let dir = common::scratch_dir("missing_part");
    for part in [1, 3] {
        let name = format!("gguf_py_split-{part:05}-of-00003.gguf");
        std::fs::copy(common::testdata(&name), dir.join(&name)).unwrap();
    }
    let e = GgufModel::open(dir.join("gguf_py_split-00001-of-00003.gguf")).unwrap_err();
    assert!(
        matches!(
            e.kind,
            ErrorKind::MissingSplitPart {
                part: 2,
                count: 3,
                ..
            }
        ),
        "{e}"
    );
    assert!(
        e.to_string().contains("gguf_py_split-00002-of-00003.gguf"),
        "{e}"
    );
}

/// `(split.no, split.count, split.tensors.count)` for each of two parts.
type SplitKeys = [(u16, u16, i32); 2];

/// Writes a two-part split with the given split keys per part.
fn write_split(dir: &Path, keys: SplitKeys) -> std::path::PathBuf {
    for (i, (no, count, tensors)) in keys.into_iter().enumerate() {
        let mut w = GgufWriter::new();
        if i == 0 {
            w.set("general.architecture", "llama").unwrap();
        }
        w.set("split.no", Value::U16(no)).unwrap();
        w.set("split.count", Value::U16(count)).unwrap();
        w.set("split.tensors.count", Value::I32(tensors)).unwrap();
        w.add_tensor(format!("t{i}"), QuantKind::F32, &[2], vec![i as u8; 8])
            .unwrap();
        w.write_to(dir.join(format!("m-{:05}-of-00002.gguf", i + 1)))
            .unwrap();
    }
    dir.join("m-00001-of-00002.gguf")
}

#[test]
fn a_consistent_written_split_loads() {
    let dir = common::scratch_dir("split_ok");
    let m = GgufModel::open(write_split(&dir, [(0, 2, 2), (1, 2, 2)])).unwrap();
    assert_eq!(m.tensors().len(), 2);
    assert_eq!(
        m.tensor_data(m.tensor("t1").unwrap()).unwrap(),
        &[1u8; 8][..]
    );
}

#[test]
fn inconsistent_split_keys_are_errors() {
    let cases: [(SplitKeys, &str); 4] = [
        ([(0, 2, 2), (0, 2, 2)], "split.no"),
        ([(0, 3, 2), (1, 3, 2)], "split.count"),
        ([(0, 2, 2), (1, 2, 3)], "split.tensors.count"),
        (
            [(0, 2, 5), (1, 2, 5)],
            "split.tensors.count vs tensors found in all parts",
        ),
    ];
    for (i, (keys, what_want)) in cases.into_iter().enumerate() {
        let dir = common::scratch_dir(&format!("split_bad_{i}"));
        let e = GgufModel::open(write_split(&dir, keys)).unwrap_err();
        assert!(
            matches!(&e.kind, ErrorKind::SplitMismatch { what, .. } if what == what_want),
            "{e}"
        );
    }
}

#[test]
fn a_part_file_under_a_plain_name_is_an_error() {
    let dir = common::scratch_dir("split_plain_name");
    let first = write_split(&dir, [(0, 2, 2), (1, 2, 2)]);
    let renamed = dir.join("model.gguf");
    std::fs::rename(first, &renamed).unwrap();
    let e = GgufModel::open(&renamed).unwrap_err();
    assert!(
        matches!(&e.kind, ErrorKind::SplitMismatch { what, expected: 1, found: 2 } if what == "split.count"),
        "{e}"
    );
}

#[test]
fn a_part_without_split_keys_is_a_missing_key_error() {
    let dir = common::scratch_dir("split_no_keys");
    for i in 1..=2 {
        let mut w = GgufWriter::new();
        w.add_tensor(format!("t{i}"), QuantKind::F32, &[1], vec![0u8; 4])
            .unwrap();
        w.write_to(dir.join(format!("m-{i:05}-of-00002.gguf")))
            .unwrap();
    }
    let e = GgufModel::open(dir.join("m-00002-of-00002.gguf")).unwrap_err();
    assert!(
        matches!(&e.kind, ErrorKind::MissingKey { key } if key == "split.no"),
        "{e}"
    );
}
