//! `ferrox quantize` against llama-quantize itself: from the same input
//! (Gemma 3 270M Q4_K_M) every tensor of the output has llama-quantize's
//! kind and llama-quantize's bytes, for the seven mixes. The
//! reference is llama.cpp's binary (`$LLAMA_BIN/llama-quantize`, by default
//! `~/.cache/ferrox/llama.cpp-build/bin`); where it or the model is absent
//! the test says so loudly and checks nothing. Also the command's own
//! contract: names in any case, `--help` lists the targets, re-quantizing
//! needs `--allow-requantize`, and a bad output path fails before any
//! tensor is converted.

mod common;
use common::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use ferrox_gguf::testing::{tiny_model, Fill, TinyTensor};
use ferrox_gguf::{GgufModel, Value};
use ferrox_quant::QuantKind::{self, *};

/// The seven targets (each one llama-quantize run and one ferrox
/// run on 2 cores: keep the list short).
const TARGETS: &[&str] = &["Q5_K_M", "Q3_K_M", "Q2_K", "Q6_K", "IQ4_XS", "Q4_0", "Q8_0"];

fn home() -> PathBuf {
    PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
}

fn real_model() -> Option<PathBuf> {
    let p = std::env::var_os("FERROX_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/ferrox/models/gemma-3-270m-q4_k_m.gguf"));
    p.exists().then_some(p)
}

fn llama_quantize() -> Option<PathBuf> {
    let dir = std::env::var_os("LLAMA_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| home().join(".cache/ferrox/llama.cpp-build/bin"));
    let p = dir.join("llama-quantize");
    p.exists().then_some(p)
}

/// The first difference between two files' tensors, or `None`: tensor
/// sets, then per tensor kind, shape and data (naming the first differing
/// block).
fn first_difference(ours: &GgufModel, theirs: &GgufModel) -> Option<String> {
    let names = |m: &GgufModel| m.tensors().iter().map(|t| t.info.name.clone()).collect::<BTreeSet<_>>();
    if names(ours) != names(theirs) {
        return Some(format!(
            "tensor sets differ: only ferrox {:?}, only llama-quantize {:?}",
            names(ours).difference(&names(theirs)).collect::<Vec<_>>(),
            names(theirs).difference(&names(ours)).collect::<Vec<_>>()
        ));
    }
    for t in theirs.tensors() {
        let o = ours.tensor(&t.info.name).unwrap();
        let name = &t.info.name;
        if o.info.kind != t.info.kind || o.info.dims != t.info.dims {
            return Some(format!(
                "{name}: ferrox {} {:?}, llama-quantize {} {:?}",
                o.info.kind, o.info.dims, t.info.kind, t.info.dims
            ));
        }
        let (a, b) = (ours.tensor_data(o).unwrap(), theirs.tensor_data(t).unwrap());
        if a != b {
            let bb = t.info.kind.block_bytes().max(1);
            let at = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
            let differing = a.chunks(bb).zip(b.chunks(bb)).filter(|(x, y)| x != y).count();
            return Some(format!(
                "{name} ({}): data differs first in block {} (byte {at}) of {}; {differing} blocks differ",
                t.info.kind,
                at / bb,
                b.len() / bb
            ));
        }
    }
    None
}

#[test]
fn quantize_writes_llama_quantizes_tensors_byte_for_byte() {
    let Some(model) = real_model() else {
        eprintln!("SKIPPED: Gemma 3 270M not found; ferrox quantize was NOT compared with llama-quantize");
        return;
    };
    let Some(llama) = llama_quantize() else {
        eprintln!(
            "SKIPPED: llama-quantize not found (set LLAMA_BIN to llama.cpp's bin directory); \
             ferrox quantize was NOT compared with llama-quantize"
        );
        return;
    };
    let mut failures = Vec::new();
    for target in TARGETS {
        let ours = scratch(&format!("gemma-{target}.ferrox.gguf"));
        let theirs = scratch(&format!("gemma-{target}.llama.gguf"));
        let o = ferrox(&[
            "quantize",
            "--allow-requantize",
            "-f",
            "-t",
            "2",
            model.to_str().unwrap(),
            ours.to_str().unwrap(),
            target,
        ]);
        assert!(o.status.success(), "ferrox quantize {target}: {}", text(&o.stderr));
        let l = Command::new(&llama)
            .args(["--allow-requantize"])
            .arg(&model)
            .arg(&theirs)
            .args([target, "2"])
            .output()
            .expect("run llama-quantize");
        assert!(l.status.success(), "llama-quantize {target}: {}", text(&l.stderr));

        let (a, b) = (GgufModel::open(&ours).unwrap(), GgufModel::open(&theirs).unwrap());
        if let Some(d) = first_difference(&a, &b) {
            failures.push(format!("{target}: {d}"));
        }
        // Metadata: the same keys, and llama-quantize's file type.
        let keys = |m: &GgufModel| m.metadata_file().metadata().iter().map(|(k, _)| k.clone()).collect::<BTreeSet<_>>();
        if keys(&a) != keys(&b) {
            failures.push(format!("{target}: metadata keys differ: {:?} vs {:?}", keys(&a), keys(&b)));
        }
        let ft = |m: &GgufModel| m.metadata_file().get_uint("general.file_type").ok();
        if ft(&a) != ft(&b) {
            failures.push(format!("{target}: general.file_type {:?}, llama-quantize {:?}", ft(&a), ft(&b)));
        }
        let same_file = std::fs::read(&ours).unwrap() == std::fs::read(&theirs).unwrap();
        let differs = failures.iter().any(|f| f.starts_with(&format!("{target}:")));
        eprintln!(
            "{target}: tensors {}; whole file (metadata order included) {}",
            if differs { "DIFFER" } else { "byte-identical" },
            if same_file { "byte-identical" } else { "differs" }
        );
        std::fs::remove_file(&ours).ok();
        std::fs::remove_file(&theirs).ok();
    }
    assert!(failures.is_empty(), "ferrox quantize differs from llama-quantize:\n{}", failures.join("\n"));
}

/// A model with one quantized matrix (Q8_0), one float matrix and a norm.
fn write_quantized_tiny(path: &Path) {
    let t = |n: &str, k: QuantKind, d: &[u64]| TinyTensor::new(n, k, d);
    let tensors = [
        t("token_embd.weight", Q8_0, &[256, 8]),
        t("blk.0.attn_q.weight", F32, &[256, 16]),
        t("blk.0.attn_norm.weight", F32, &[256]),
    ];
    let meta = vec![
        ("general.architecture".to_string(), Value::from("llama")),
        ("llama.block_count".to_string(), Value::U32(1)),
    ];
    tiny_model(3, meta, &tensors, Fill::Quantize).unwrap().write_to(path).unwrap();
}

#[test]
fn requantizing_needs_allow_requantize_and_names_are_case_insensitive() {
    let input = scratch("rq-in.gguf");
    write_quantized_tiny(&input);
    let out = scratch("rq-out.gguf");
    let (i, o) = (input.to_str().unwrap(), out.to_str().unwrap());

    let r = ferrox(&["quantize", i, o, "q4_k_m", "-f"]);
    assert_clean_error(&r, "--allow-requantize");
    assert!(!out.exists(), "a refused run must leave no output");

    let r = ferrox(&["quantize", i, o, "q4_k_m", "-f", "--allow-requantize"]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let m = GgufModel::open(&out).unwrap();
    let kind = |n: &str| m.tensor(n).unwrap().info.kind;
    // Tied embeddings take the output rule (Q6_K); attn_q the mix's Q4_K.
    assert_eq!(kind("token_embd.weight"), Q6K);
    assert_eq!(kind("blk.0.attn_q.weight"), Q4K);
    assert_eq!(kind("blk.0.attn_norm.weight"), F32);
    assert_eq!(m.metadata_file().get_uint("general.file_type").unwrap(), 15);

    // The file-type number works as llama-quantize's does.
    let r = ferrox(&["quantize", i, o, "7", "-f", "--allow-requantize"]);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let m = GgufModel::open(&out).unwrap();
    assert_eq!(m.tensor("blk.0.attn_q.weight").unwrap().info.kind, Q8_0);
    assert_eq!(m.metadata_file().get_uint("general.file_type").unwrap(), 7);
}

#[test]
fn a_bad_output_path_fails_before_any_tensor_is_converted() {
    let input = scratch("path-in.gguf");
    write_quantized_tiny(&input);
    let out = scratch("no-such-dir").join("out.gguf");
    let r = ferrox(&["quantize", input.to_str().unwrap(), out.to_str().unwrap(), "Q8_0", "--allow-requantize"]);
    assert_clean_error(&r, "does not exist");
    let err = text(&r.stderr);
    assert!(!err.contains("[   1/"), "tensors were converted before the path was checked: {err}");
}

#[test]
fn help_lists_the_targets() {
    let r = ferrox(&["quantize", "--help"]);
    assert!(r.status.success());
    let out = text(&r.stdout);
    for name in ["Q4_K_M", "Q3_K_S", "Q5_K_M", "IQ4_XS", "IQ4_NL", "Q8_0", "BF16", "--allow-requantize"] {
        assert!(out.contains(name), "--help should list {name}: {out}");
    }
}
