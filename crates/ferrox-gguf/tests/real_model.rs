//! The real Gemma 3 270M Q4_K_M file, compared with gguf-py's reading of it
//! (`testdata/gemma-3-270m-q4_k_m.directory.txt`, made by `dump_directory.py`).
//!
//! Runs when the file is at `$FERROX_TEST_MODEL` or
//! `/root/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf`; otherwise it says
//! loudly what it did not check. Fetch it with
//! `shared/models/get-gemma3-270m.sh /root/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf`.

mod common;

use std::path::PathBuf;

use ferrox_gguf::{Array, GgufFile, GgufModel, GgufWriter, Value, ValueType};

fn model_path() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("FERROX_TEST_MODEL").map(PathBuf::from),
        Some(PathBuf::from(
            "/root/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf",
        )),
    ];
    let found = candidates.into_iter().flatten().find(|p| p.is_file());
    if found.is_none() {
        eprintln!(
            "SKIPPED: Gemma 3 270M not found (set FERROX_TEST_MODEL or fetch it to \
             /root/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf); the real-model \
             directory, metadata and byte-identical round trip were NOT checked"
        );
    }
    found
}

fn gguf_py_type_name(t: ValueType) -> &'static str {
    match t {
        ValueType::U8 => "UINT8",
        ValueType::I8 => "INT8",
        ValueType::U16 => "UINT16",
        ValueType::I16 => "INT16",
        ValueType::U32 => "UINT32",
        ValueType::I32 => "INT32",
        ValueType::F32 => "FLOAT32",
        ValueType::U64 => "UINT64",
        ValueType::I64 => "INT64",
        ValueType::F64 => "FLOAT64",
        ValueType::Bool => "BOOL",
        ValueType::String => "STRING",
        ValueType::Array => "ARRAY",
    }
}

/// This reader's view of the file in dump_directory.py's format.
fn describe(f: &GgufFile) -> String {
    let mut s = format!(
        "version {}\nalignment {}\ndata_offset {}\n",
        f.version(),
        f.alignment(),
        f.data_offset()
    );
    for (k, v) in f.metadata() {
        match v {
            Value::Array(a) => {
                s += &format!(
                    "kv {k} ARRAY/{}/{}\n",
                    gguf_py_type_name(a.elem_type()),
                    a.len()
                )
            }
            v => s += &format!("kv {k} {}\n", gguf_py_type_name(v.value_type())),
        }
    }
    for t in f.tensors() {
        let dims: Vec<String> = t.dims.iter().map(u64::to_string).collect();
        s += &format!(
            "tensor {} {} {} {} {}\n",
            t.name,
            t.kind.gguf_id(),
            dims.join(","),
            t.offset,
            t.n_bytes
        );
    }
    s
}

#[test]
fn gemma3_270m_reads_as_gguf_py_reads_it_and_round_trips() {
    let Some(path) = model_path() else { return };
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.tensors().len(), 236);
    assert_eq!(f.metadata().len(), 33);
    let want =
        std::fs::read_to_string(common::testdata("gemma-3-270m-q4_k_m.directory.txt")).unwrap();
    assert_eq!(describe(&f), want);

    assert_eq!(f.get_str("general.architecture").unwrap(), "gemma3");
    assert_eq!(f.get_u32("gemma3.block_count").unwrap(), 18);
    let Array::String(tokens) = f.get_array("tokenizer.ggml.tokens").unwrap() else {
        panic!("tokens")
    };
    assert_eq!(tokens.len(), 262_144);
    assert_eq!(tokens.get_str(2), Some("<bos>"));
    for t in f.tensors() {
        assert_eq!(
            f.tensor_data(t).unwrap().len() as u64,
            t.n_bytes,
            "{}",
            t.name
        );
    }

    let rewritten = GgufWriter::from_file(&f).unwrap().to_bytes();
    assert!(
        rewritten == f.as_bytes(),
        "rewrite differs from the original file"
    );

    let m = GgufModel::open(&path).unwrap();
    assert_eq!((m.parts().len(), m.tensors().len()), (1, 236));
}
