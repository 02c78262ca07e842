//! The `ferrox` binary end to end: `info` and `quantize` on tiny models this
//! test writes, on the real Gemma 3 270M when it is present, and on bad input.
//! The Python `gguf` package (numpy reference) reads what `quantize` writes,
//! as the independent check that the output is a valid GGUF.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use ferrox_gguf::testing::{tiny_model, Fill, TinyTensor};
use ferrox_gguf::{GgufModel, Value};
use ferrox_quant::QuantKind::{self, *};

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Rows of 256 (whole K-quant blocks), of 96 (whole 32-blocks only) and of
/// 100 (no block size divides it), plus tensors llama-quantize never touches.
fn write_tiny(path: &Path) {
    let t = |n: &str, k: QuantKind, d: &[u64]| TinyTensor::new(n, k, d);
    let tensors = [
        t("token_embd.weight", F32, &[256, 8]),
        t("blk.0.attn_norm.weight", F32, &[256]),
        t("blk.0.attn_q.weight", F16, &[256, 16]),
        t("blk.0.ffn_down.weight", F32, &[96, 4]),
        t("blk.0.odd.weight", F32, &[100, 2]),
        t("blk.0.ffn_norm.weight", F16, &[256]),
        t("rope_freqs", I32, &[8]),
    ];
    let meta = vec![
        ("general.architecture".to_string(), Value::from("llama")),
        ("general.file_type".to_string(), Value::U32(0)),
    ];
    tiny_model(7, meta, &tensors, Fill::Quantize)
        .unwrap()
        .write_to(path)
        .unwrap();
}

fn tensor_f32(m: &GgufModel, name: &str) -> Vec<f32> {
    let t = m.tensor(name).unwrap_or_else(|| panic!("{name} missing"));
    let n = t.info.n_elements() as usize;
    ferrox_quant::dequantize_to_vec(t.info.kind, m.tensor_data(t).unwrap(), n).unwrap()
}

#[test]
fn quantize_follows_llama_quantizes_plan_and_keeps_values_close() {
    let input = scratch("plan-in.gguf");
    let output = scratch("plan-out.gguf");
    write_tiny(&input);
    let o = ferrox(&[
        "quantize",
        input.to_str().unwrap(),
        output.to_str().unwrap(),
        "q4_k",
        "-f",
    ]);
    assert!(o.status.success(), "quantize failed: {}", stderr(&o));
    assert!(
        stderr(&o).contains("fallback"),
        "the fallbacks must be reported: {}",
        stderr(&o)
    );

    let (src, out) = (
        GgufModel::open(&input).unwrap(),
        GgufModel::open(&output).unwrap(),
    );
    let kind = |name: &str| out.tensor(name).unwrap().info.kind;
    // `q4_k` is llama-quantize's alias of the Q4_K_M mix: the tied
    // embedding takes the output's Q6_K, ffn_down of the only layer Q6_K.
    assert_eq!(kind("token_embd.weight"), Q6K);
    assert_eq!(kind("blk.0.attn_q.weight"), Q4K);
    assert_eq!(
        kind("blk.0.ffn_down.weight"),
        Q8_0,
        "96 columns: Q6_K falls back to Q8_0"
    );
    assert_eq!(
        kind("blk.0.odd.weight"),
        F16,
        "100 columns: nothing but F16 fits"
    );
    assert_eq!(kind("blk.0.attn_norm.weight"), F32);
    assert_eq!(
        kind("blk.0.ffn_norm.weight"),
        F16,
        "1-D tensors are copied as they are, as llama-quantize does"
    );
    assert_eq!(kind("rope_freqs"), I32);
    let rope = |m: &GgufModel| {
        m.tensor_data(m.tensor("rope_freqs").unwrap())
            .unwrap()
            .to_vec()
    };
    assert_eq!(
        rope(&src),
        rope(&out),
        "integer tensors are copied byte for byte"
    );
    assert_eq!(
        out.metadata_file().get_uint("general.file_type").unwrap(),
        15
    );
    assert_eq!(
        out.metadata_file()
            .get_uint("general.quantization_version")
            .unwrap(),
        2
    );

    for (name, tol) in [
        ("token_embd.weight", 0.1),
        ("blk.0.attn_q.weight", 0.1),
        ("blk.0.ffn_down.weight", 0.07),
        ("blk.0.odd.weight", 1e-3),
        ("blk.0.ffn_norm.weight", 0.0),
    ] {
        let (a, b) = (tensor_f32(&src, name), tensor_f32(&out, name));
        let err = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(err <= tol, "{name}: max abs error {err} > {tol}");
    }
}

fn python_gguf_available() -> bool {
    Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// gguf-py reads the file and dequantizes every tensor with its own numpy
/// code; prints `name TYPE dims checksum` per tensor.
const PY_READ: &str = r#"
import sys, numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize
r = GGUFReader(sys.argv[1])
for t in r.tensors:
    if t.tensor_type.name in ("I8", "I16", "I32", "I64"):  # stored as numbers; gguf-py has no "dequantize"
        x = np.asarray(t.data, dtype=np.float64)
    else:
        x = dequantize(t.data, t.tensor_type).astype(np.float64)
    print(t.name, t.tensor_type.name, ",".join(str(int(d)) for d in t.shape), repr(float(np.abs(x).sum())))
"#;

fn check_with_gguf_py(path: &Path) {
    let o = Command::new("python3")
        .args(["-c", PY_READ, path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "gguf-py could not read {}: {}",
        path.display(),
        stderr(&o)
    );
    let m = GgufModel::open(path).unwrap();
    let lines: Vec<String> = String::from_utf8(o.stdout)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(lines.len(), m.tensors().len());
    for (line, t) in lines.iter().zip(m.tensors()) {
        let f: Vec<&str> = line.split(' ').collect();
        assert_eq!(f[0], t.info.name);
        assert_eq!(f[1], t.info.kind.name(), "{}", t.info.name);
        let dims: Vec<String> = t.info.dims.iter().map(u64::to_string).collect();
        assert_eq!(f[2], dims.join(","), "{}", t.info.name);
        let theirs: f64 = f[3].parse().unwrap();
        let ours: f64 = tensor_f32(&m, &t.info.name)
            .iter()
            .map(|&x| f64::from(x).abs())
            .sum();
        assert!(
            (theirs - ours).abs() <= 1e-6 * theirs.abs().max(1.0),
            "{}: gguf-py {theirs} vs ferrox {ours}",
            t.info.name
        );
    }
}

#[test]
fn the_python_gguf_package_reads_what_quantize_writes() {
    if !python_gguf_available() {
        eprintln!("SKIPPED: python3 with the `gguf` package is not installed (pip install gguf numpy); the output of `ferrox quantize` was NOT checked by an independent reader");
        return;
    }
    let input = scratch("py-in.gguf");
    write_tiny(&input);
    for kind in ["Q8_0", "Q4_0", "Q6_K", "Q5_1"] {
        let output = scratch(&format!("py-out-{kind}.gguf"));
        let o = ferrox(&[
            "quantize",
            "-m",
            input.to_str().unwrap(),
            output.to_str().unwrap(),
            kind,
            "-f",
        ]);
        assert!(o.status.success(), "{kind}: {}", stderr(&o));
        check_with_gguf_py(&output);
    }
}

#[test]
fn bad_requests_fail_with_a_clear_message_and_no_panic() {
    let input = scratch("bad-in.gguf");
    write_tiny(&input);
    let out = scratch("bad-out.gguf");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["quantize", i, o, "Q9_9", "-f"], "unknown kind"),
        (
            vec!["quantize", i, o, "IQ2_XXS", "-f"],
            "cannot quantize to IQ2_XXS",
        ),
        (vec!["quantize", i, i, "Q8_0", "-f"], "overwrite the input"),
        (vec!["info", "/nonexistent/model.gguf"], "cannot load model"),
    ];
    for (args, want) in cases {
        let r = ferrox(&args);
        let e = stderr(&r);
        assert!(!r.status.success(), "{args:?} succeeded");
        assert!(e.contains(want), "{args:?}: expected {want:?} in {e:?}");
        assert!(!e.contains("panicked"), "{args:?} panicked: {e}");
    }
    // A truncated file: every cut must be an error naming the file, never a panic.
    let bytes = std::fs::read(&input).unwrap();
    let cut = scratch("truncated.gguf");
    for len in [0, 3, 7, 24, 100, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&cut, &bytes[..len]).unwrap();
        let r = ferrox(&["info", cut.to_str().unwrap()]);
        let e = stderr(&r);
        assert!(
            !r.status.success() && e.contains("truncated.gguf") && !e.contains("panicked"),
            "cut at {len}: {e}"
        );
    }
}

/// Every `FERROX_*` variable this build reads refuses a value it does not
/// take: the binary stops before the command, naming the variable and the
/// values it takes — never running on a default the user did not ask for.
#[test]
fn a_ferrox_variable_set_to_a_bad_value_is_an_error_naming_it() {
    let input = scratch("env-in.gguf");
    write_tiny(&input);
    let i = input.to_str().unwrap();
    let mut cases = vec![
        ("FERROX_CPU_ISA", "avx9", "scalar"),
        ("FERROX_CPU_PREPACK", "banana", "0, 1, off, on"),
        ("FERROX_AMX_GEMM", "fp8", "int8 or bf16"),
    ];
    if cfg!(feature = "cuda") {
        cases.push(("FERROX_CUDA", "banana", "auto"));
    }
    if cfg!(feature = "vulkan") {
        cases.push(("FERROX_VULKAN", "banana", "auto"));
    }
    if cfg!(feature = "metal") {
        cases.push(("FERROX_METAL", "banana", "auto"));
    }
    if cfg!(feature = "measure") {
        cases.push(("FERROX_CPU_INTERLEAVE", "maybe", "0, 1, off, on"));
    }
    for (name, bad, takes) in cases {
        let o = Command::new(env!("CARGO_BIN_EXE_ferrox")).args(["info", i]).env(name, bad).output().unwrap();
        assert_clean_error(&o, &format!("{name}=\"{bad}\""));
        assert!(stderr(&o).contains(takes), "{name}={bad}: {}", stderr(&o));
    }
    for (name, good) in [("FERROX_CPU_ISA", "scalar"), ("FERROX_CPU_PREPACK", "0"), ("FERROX_AMX_GEMM", "int8")] {
        let o = Command::new(env!("CARGO_BIN_EXE_ferrox")).args(["info", i]).env(name, good).output().unwrap();
        assert!(o.status.success(), "{name}={good}: {}", stderr(&o));
    }
}

fn real_model() -> Option<PathBuf> {
    let p = std::env::var_os("FERROX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/ferrox/models/gemma-3-270m-q4_k_m.gguf")
        });
    p.exists().then_some(p)
}

/// The directory gguf-py lists for the real model (ferrox-gguf's testdata).
fn gguf_py_directory() -> Vec<(String, String, String)> {
    let text = include_str!("../../ferrox-gguf/testdata/gemma-3-270m-q4_k_m.directory.txt");
    text.lines()
        .filter_map(|l| l.strip_prefix("tensor "))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let kind = QuantKind::from_gguf_id(f[1].parse().unwrap())
                .unwrap()
                .name()
                .to_string();
            (f[0].to_string(), kind, f[2].to_string())
        })
        .collect()
}

#[test]
fn info_on_gemma3_lists_every_tensor_and_key_as_gguf_py_does() {
    let Some(model) = real_model() else {
        eprintln!("SKIPPED: Gemma 3 270M not found (scripts/get-model.sh fetches it); `ferrox info` on the real model was NOT checked");
        return;
    };
    let o = ferrox(&["info", model.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json output parses");
    assert_eq!(j["metadata"].as_array().unwrap().len(), 33);
    let ours: Vec<(String, String, String)> = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let dims: Vec<String> = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.to_string())
                .collect();
            (
                t["name"].as_str().unwrap().to_string(),
                t["kind"].as_str().unwrap().to_string(),
                dims.join(","),
            )
        })
        .collect();
    assert_eq!(ours.len(), 236);
    assert_eq!(ours, gguf_py_directory());

    let text = ferrox(&["info", "-m", model.to_str().unwrap()]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(
        text.contains("tokenizer.ggml.tokens") && text.contains("[string; 262144]"),
        "arrays are summarized"
    );
    assert!(
        text.lines().count() < 400,
        "long arrays must not be printed whole"
    );
}

#[test]
fn gemma3_requantized_to_q8_0_is_read_back_by_gguf_py() {
    let Some(model) = real_model() else {
        eprintln!("SKIPPED: Gemma 3 270M not found; re-quantizing the real model was NOT checked");
        return;
    };
    if !python_gguf_available() {
        eprintln!("SKIPPED: python3 with `gguf` not installed; the re-quantized real model was NOT checked by gguf-py");
        return;
    }
    let out = scratch("gemma-q8_0.gguf");
    let o = ferrox(&[
        "quantize",
        model.to_str().unwrap(),
        out.to_str().unwrap(),
        "Q8_0",
        "-f",
        "--allow-requantize",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    check_with_gguf_py(&out);
    let m = GgufModel::open(&out).unwrap();
    let kinds: std::collections::BTreeSet<_> = m.tensors().iter().map(|t| t.info.kind).collect();
    assert_eq!(kinds.into_iter().collect::<Vec<_>>(), vec![F32, Q8_0]);
    std::fs::remove_file(&out).unwrap();
}

/// `ferrox tokenize` prints llama-tokenize's ids: checked on the GPT-2 vocab
/// llama.cpp ships, against ids recorded from llama-tokenize itself
/// (`crates/ferrox-core/testdata/tokenizer/gpt-2.jsonl`, case "leading_space").
#[test]
fn tokenize_prints_llama_tokenizes_ids() {
    let vocab = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../ferrox-core/testdata/tokenizer/ggml-vocab-gpt-2.gguf"
    );
    let o = ferrox(&["tokenize", vocab, " Hello world", "--ids"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[18435, 995]");
    let o = ferrox(&["tokenize", "-m", vocab, " Hello world"]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        out.contains("18435 ' Hello'") && out.contains("995 ' world'"),
        "{out}"
    );
    let o = ferrox(&["tokenize", "/nonexistent.gguf", "x"]);
    assert!(
        !o.status.success() && stderr(&o).contains("cannot load model"),
        "{}",
        stderr(&o)
    );
}

/// A split model is one model: naming any part lists every part's tensors.
/// The parts were written by gguf-py (`ferrox-gguf/testdata/make_gguf_py_fixtures.py`).
#[test]
fn info_on_any_part_of_a_split_model_lists_the_whole_model() {
    let part2 = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../ferrox-gguf/testdata/gguf_py_split-00002-of-00003.gguf"
    );
    let o = ferrox(&["info", part2, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["parts"].as_array().unwrap().len(), 3);
    let names: Vec<&str> = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "f32.weight",
            "f16.weight",
            "i32.weight",
            "q8_0.weight",
            "q4_k.weight"
        ]
    );
    let parts: Vec<u64> = j["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["part"].as_u64().unwrap())
        .collect();
    assert_eq!(parts, [0, 0, 1, 1, 2]);
}
