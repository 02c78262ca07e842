//! The forward pass against llama.cpp's own answers.
//!
//! Reference data: `testdata/llama_ref/`, made by `tools/refllama/gen.py`
//! (llama.cpp from the llama-cpp-python 0.3.36 tree, through libllama).
//! - Real Gemma 3 270M (and ferrox re-quantizations of it to Q8_0 and Q4_0):
//!   prompt token ids, then 48 greedy steps with llama.cpp's top-10 logits.
//!   Comparison is teacher-forced: at every step ferrox's argmax must be
//!   llama.cpp's token — except where llama.cpp's own top two are within
//!   0.1 (a near tie may flip) — and its logits of llama.cpp's top 10 must
//!   be close. Then llama.cpp's token is fed, so one flip does not cascade.
//! - Tiny random models of every architecture, regenerated here from their
//!   seed (the SHA-256 must match the file llama.cpp read): every position's
//!   full logits.

use std::path::{Path, PathBuf};

use ferrox_core::arch::Arch;
use ferrox_core::backend::{cpu::Cpu, Batch};
use ferrox_core::model::Model;
use ferrox_core::tokenizer::Tokenizer;
use serde_json::Value;
use sha2::{Digest, Sha256};

fn testdata(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/llama_ref").join(name)
}

fn gemma() -> PathBuf {
    std::env::var_os("FERROX_TEST_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ferrox/models/gemma-3-270m-q4_k_m.gguf")
    })
}

fn sha256_file(path: &Path) -> String {
    let bytes = std::fs::read(path).unwrap();
    format!("{:x}", Sha256::digest(&bytes))
}

fn argmax(v: &[f32]) -> usize {
    v.iter().enumerate().fold(0, |best, (i, &x)| if x > v[best] { i } else { best })
}

/// What one reference file's comparison found.
#[derive(Default, Debug)]
struct Report {
    steps: usize,
    allowed_flips: usize,
    max_abs_diff: f32,
    failures: Vec<String>,
}

/// Teacher-forced comparison of every case of a reference file.
fn compare_greedy(model_path: &Path, reference: &str, tolerance: f32) -> Report {
    let r: Value = serde_json::from_str(&std::fs::read_to_string(testdata(reference)).unwrap()).unwrap();
    let want_sha = r["model_sha256"].as_str().unwrap();
    assert_eq!(sha256_file(model_path), want_sha, "{} is not the file {reference} was made from", model_path.display());
    let threshold = r["near_tie_threshold"].as_f64().unwrap() as f32;
    let model = Model::open(model_path, Cpu::new(2)).unwrap();
    let tok = Tokenizer::from_gguf(model.file().metadata_file()).unwrap();
    let mut rep = Report::default();
    for case in r["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let want_ids: Vec<u32> =
            case["prompt_tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let ids = tok.encode(case["prompt"].as_str().unwrap().as_bytes(), true, true).unwrap();
        if ids != want_ids {
            rep.failures.push(format!("{name}: prompt ids differ from llama.cpp's"));
            continue;
        }
        let steps = case["steps"].as_array().unwrap();
        let mut ctx = model.new_context(2048, 1).unwrap();
        let mut b = Batch::default();
        for (i, &t) in ids.iter().enumerate() {
            b.push(t, i as u32, 0, i + 1 == ids.len());
        }
        let mut logits = model.forward(&mut ctx, &b).unwrap();
        for (s, step) in steps.iter().enumerate() {
            let want = step["token"].as_u64().unwrap() as usize;
            let top: Vec<(usize, f32)> = step["top"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap() as f32))
                .collect();
            let got = argmax(&logits);
            if got != want {
                let near_tie = top.len() > 1 && top[0].1 - top[1].1 < threshold && got == top[1].0;
                if near_tie {
                    rep.allowed_flips += 1;
                } else {
                    rep.failures.push(format!(
                        "{name} step {s}: ferrox chose {got} ({}), llama.cpp {want} ({}); llama.cpp top-2 gap {}",
                        logits[got],
                        logits[want],
                        top[0].1 - top.get(1).map_or(f32::NEG_INFINITY, |t| t.1)
                    ));
                }
            }
            for &(id, l) in &top {
                rep.max_abs_diff = rep.max_abs_diff.max((logits[id] - l).abs());
            }
            rep.steps += 1;
            let pos = ids.len() + s;
            let mut b = Batch::default();
            b.push(want as u32, pos as u32, 0, true);
            logits = model.forward(&mut ctx, &b).unwrap();
        }
    }
    eprintln!("{reference}: {rep:?}");
    assert!(rep.failures.is_empty(), "{reference}: {} mismatches:\n{}", rep.failures.len(), rep.failures.join("\n"));
    assert!(rep.steps >= 96, "{reference}: only {} steps compared", rep.steps);
    assert!(
        rep.max_abs_diff <= tolerance,
        "{reference}: logits differ from llama.cpp's by up to {} (tolerance {tolerance})",
        rep.max_abs_diff
    );
    rep
}

#[test]
fn gemma3_270m_greedy_steps_and_logits_match_llama_cpp() {
    let path = gemma();
    if !path.exists() {
        eprintln!("SKIPPED: {} not found (set FERROX_TEST_MODEL); the forward pass was NOT checked against llama.cpp", path.display());
        return;
    }
    compare_greedy(&path, "gemma3-270m-q4_k_m.json", 0.35);
}

/// The forward pass at other kinds: ferrox re-quantizes the real model
/// (bit-exact with ggml's reference quantizers), and llama.cpp's answers on
/// those very files are the reference.
#[test]
fn gemma3_270m_requantized_to_q8_0_and_q4_0_matches_llama_cpp() {
    let path = gemma();
    if !path.exists() {
        eprintln!("SKIPPED: {} not found; the Q8_0/Q4_0 forward passes were NOT checked", path.display());
        return;
    }
    let src = ferrox_gguf::GgufModel::open(&path).unwrap();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    for (kind, reference) in [(ferrox_quant::QuantKind::Q8_0, "gemma3-270m-q8_0.json"), (ferrox_quant::QuantKind::Q4_0, "gemma3-270m-q4_0.json")] {
        let out = dir.join(format!("gemma-3-270m-{}.ferrox.gguf", kind.name().to_ascii_lowercase()));
        let w = ferrox_core::requantize::requantize(&src, kind, 2, |_| {}).unwrap();
        w.write_to(&out).unwrap();
        compare_greedy(&out, reference, 0.35);
        std::fs::remove_file(&out).ok();
    }
}

#[test]
fn tiny_models_of_every_architecture_match_llama_cpp_logits() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let mut checked = Vec::new();
    for &arch in Arch::ALL {
        let reference = testdata(&format!("tiny/tiny-{arch}.json"));
        let r: Value = serde_json::from_str(&std::fs::read_to_string(&reference).unwrap_or_else(|e| {
            panic!("{}: {e} (every architecture needs llama.cpp reference logits)", reference.display())
        }))
        .unwrap();
        let path = dir.join(format!("tiny-{arch}.gguf"));
        ferrox_core::testing::tiny_arch_model(arch, 42).unwrap().write_to(&path).unwrap();
        assert_eq!(sha256_file(&path), r["model_sha256"].as_str().unwrap(), "{arch}: the regenerated tiny model is not the one llama.cpp ran");
        let tokens: Vec<u32> = r["prompt_tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        assert_eq!(tokens, ferrox_core::testing::tiny_tokens(), "{arch}: reference made from other tokens");
        let want: Vec<Vec<f32>> = r["all_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
            .collect();
        let model = Model::open(&path, Cpu::new(2)).unwrap();
        let mut ctx = model.new_context(64, 1).unwrap();
        let mut b = Batch::default();
        for (i, &t) in tokens.iter().enumerate() {
            b.push(t, i as u32, 0, true);
        }
        let got = model.forward(&mut ctx, &b).unwrap();
        assert_eq!(want.len(), tokens.len());
        let mut max = 0.0f32;
        for (p, (g, w)) in got.chunks(model.n_vocab()).zip(&want).enumerate() {
            assert_eq!(g.len(), w.len(), "{arch}: vocabulary size");
            assert_eq!(argmax(g), argmax(w), "{arch}: top-1 differs at position {p}");
            for (a, b) in g.iter().zip(w) {
                max = max.max((a - b).abs());
            }
        }
        // Random weights make these models maximally sensitive to rounding
        // (one flipped 8-bit activation rounding moves every later logit);
        // float models agree to ~1e-3, 4-bit ones to a few 1e-2.
        assert!(max < 0.08, "{arch}: logits differ from llama.cpp's by up to {max}");
        checked.push(format!("{arch}: max |diff| {max:.4}"));
        std::fs::remove_file(&path).ok();
    }
    eprintln!("{}", checked.join("; "));
}
