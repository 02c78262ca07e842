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
//!
//!   llama.cpp has two CPU paths for the same file: its canonical one
//!   (`--repack 0`: weights read as stored, which is what ferrox's kernels
//!   mirror) and its default, which repacks some weights into interleaved
//!   layouts with their own activation quantization. On this model the two
//!   differ from *each other* by up to 1.7 in a top-10 logit and pick
//!   different greedy tokens at steps whose top-2 gap is up to 0.29
//!   (`gemma3-270m-q4_k_m*.json`, compared in the module's last test). So:
//!   against the canonical path the rule holds as stated; against
//!   the default path a step where the two llama.cpp paths themselves
//!   disagree has no single right answer and is not counted as a mismatch.
//! - Tiny random models of every architecture: every position's full logits,
//!   checked on every backend by the conformance suite
//!   (`src/backend/conformance.rs`, `every_architecture_matches_llama_cpp`).

use std::path::{Path, PathBuf};

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
    /// The same with each side's logits taken relative to its logit of
    /// llama.cpp's top token (a shift of all logits, which softmax ignores,
    /// does not count).
    max_rel_diff: f32,
    failures: Vec<String>,
}

/// Teacher-forced comparison of every case of a reference file.
fn load(reference: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(testdata(reference)).unwrap()).unwrap()
}

/// One greedy step of a reference: the chosen token and llama.cpp's top-k.
#[derive(Clone)]
struct Step {
    token: u64,
    top: Vec<(u64, f32)>,
}

fn steps_of(case: &Value) -> Vec<Step> {
    case["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|st| Step {
            token: st["token"].as_u64().unwrap(),
            top: st["top"].as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap() as f32)).collect(),
        })
        .collect()
}

/// The steps of each case of a reference file, by case name.
fn steps_by_case(r: &Value) -> std::collections::HashMap<String, Vec<Step>> {
    r["cases"].as_array().unwrap().iter().map(|c| (c["name"].as_str().unwrap().to_string(), steps_of(c))).collect()
}

/// Whether `got` is within `threshold` of the top logit of `step` (a near
/// tie that rounding may legitimately resolve either way).
fn near_tie(step: &Step, got: u64, threshold: f32) -> bool {
    step.top.iter().any(|&(id, l)| id == got && step.top[0].1 - l < threshold)
}

/// Teacher-forced comparison with `reference`; when `other_path` is given
/// (the same cases through llama.cpp's other CPU path), a step where the two
/// llama.cpp paths choose differently is not held against ferrox.
fn compare_greedy(model_path: &Path, reference: &str, other_path: Option<&str>, tie: Option<f32>, tolerance: Spread) -> Report {
    let r = load(reference);
    let other = other_path.map(|o| steps_by_case(&load(o)));
    let want_sha = r["model_sha256"].as_str().unwrap();
    assert_eq!(sha256_file(model_path), want_sha, "{} is not the file {reference} was made from", model_path.display());
    let threshold = tie.unwrap_or(r["near_tie_threshold"].as_f64().unwrap() as f32);
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
                let this = steps_of(case);
                let tie_here = near_tie(&this[s], got as u64, threshold);
                // The other llama.cpp path on the same history (its tokens
                // agree with this file's up to here) chose ferrox's token, or
                // has it as a near tie.
                let other_step = other.as_ref().and_then(|o| o.get(name)).and_then(|o| {
                    let same_history = o.len() > s && o[..s].iter().zip(&this[..s]).all(|(a, b)| a.token == b.token);
                    same_history.then(|| o[s].clone())
                });
                let paths_disagree = other_step.is_some_and(|o| o.token == got as u64 || near_tie(&o, got as u64, threshold));
                let near_tie = tie_here;
                if near_tie || paths_disagree {
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
            let (top0, l0) = top[0];
            for &(id, l) in &top {
                rep.max_abs_diff = rep.max_abs_diff.max((logits[id] - l).abs());
                rep.max_rel_diff = rep.max_rel_diff.max(((logits[id] - logits[top0]) - (l - l0)).abs());
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
        rep.max_abs_diff <= tolerance.abs && rep.max_rel_diff <= tolerance.rel,
        "{reference}: logits differ from llama.cpp's by up to {} ({} relative to the top token's; tolerance {tolerance:?})",
        rep.max_abs_diff,
        rep.max_rel_diff
    );
    rep
}

/// The near-tie width for the real model, measured rather than chosen: on
/// the AVX-512/AMX Xeon (2026-12-02), ferrox's *scalar twins* — the
/// reference every kernel is tested against, differing from llama.cpp's
/// canonical path only in summation order — resolve `code` step 23 (top-2
/// gap 0.643) and `chat_turn` step 10 (0.194) the other way, while the SIMD
/// levels resolve them llama.cpp's way or not depending on the level. The
/// 8-bit activation quantization turns last-bit differences into whole
/// quantization steps, so gaps below this width are rounding, not math. The
/// logit tolerance ([`gemma_tolerance`]) and the requirement on every wider
/// step are what catch wrong math.
const GEMMA_TIE: Option<f32> = Some(0.7);

/// How far two sets of logits part: the largest difference of a top-k
/// logit, and of one taken relative to the top token's logit.
#[derive(Clone, Copy, Debug)]
struct Spread {
    abs: f32,
    rel: f32,
}

/// llama.cpp's own two CPU paths (repacked and canonical) on Gemma 3 270M
/// Q4_K_M, over the steps where their histories agree: how far they part
/// (abs ~1.73, rel ~1.04 in the committed files).
fn llama_cpp_path_spread() -> (Spread, usize) {
    let (a, b) = (load("gemma3-270m-q4_k_m.json"), load("gemma3-270m-q4_k_m.norepack.json"));
    let mut sp = Spread { abs: 0.0, rel: 0.0 };
    let mut diverged = 0;
    for (ca, cb) in a["cases"].as_array().unwrap().iter().zip(b["cases"].as_array().unwrap()) {
        assert_eq!(ca["prompt_tokens"], cb["prompt_tokens"]);
        for (sa, sb) in steps_of(ca).iter().zip(&steps_of(cb)) {
            let logit_b = |id: u64| sb.top.iter().find(|p| p.0 == id).map(|p| p.1);
            let (top0, l0) = sa.top[0];
            for &(id, la) in &sa.top {
                if let Some(lb) = logit_b(id) {
                    sp.abs = sp.abs.max((la - lb).abs());
                    if let Some(lb0) = logit_b(top0) {
                        sp.rel = sp.rel.max(((la - l0) - (lb - lb0)).abs());
                    }
                }
            }
            if sa.token != sb.token {
                diverged += 1;
                break;
            }
        }
    }
    (sp, diverged)
}

/// The logit tolerance on Gemma 3 270M: twice llama.cpp's own path-to-path
/// spread, in both measures. Why twice, and why both: ferrox's CPU levels
/// part from llama.cpp's canonical path by abs 1.84 (AVX2), 2.24 (its
/// scalar twins), 2.82 (AVX-512 without AMX, on an EPYC) and rel 1.25-1.54;
/// the 2.82 is the whole top-k shifted together at a flat step (`chat_turn`
/// step 18: every logit ~2.4 higher, relative ones within 0.05), which
/// sampling does not see, and the relative measure bounds what it does see.
/// Wrong math moves logits by whole units and flips wide steps.
fn gemma_tolerance() -> Spread {
    let (sp, _) = llama_cpp_path_spread();
    Spread { abs: 2.0 * sp.abs, rel: 2.0 * sp.rel }
}

#[test]
fn gemma3_270m_greedy_steps_and_logits_match_llama_cpp() {
    let path = gemma();
    if !path.exists() {
        eprintln!("SKIPPED: {} not found (set FERROX_TEST_MODEL); the forward pass was NOT checked against llama.cpp", path.display());
        return;
    }
    // The canonical path first, then the default one (where llama.cpp's own
    // paths disagreeing is not held against ferrox).
    let tol = gemma_tolerance();
    compare_greedy(&path, "gemma3-270m-q4_k_m.norepack.json", None, GEMMA_TIE, tol);
    compare_greedy(&path, "gemma3-270m-q4_k_m.json", Some("gemma3-270m-q4_k_m.norepack.json"), GEMMA_TIE, tol);
}

/// The tolerance above comes from llama.cpp's own two CPU paths: they must
/// part (so the evidence holds), and by no more than they did when the
/// factor of two was chosen (a regenerated reference cannot loosen it).
#[test]
fn llama_cpp_repacked_and_canonical_paths_differ_as_much_as_the_tolerance_allows_ferrox() {
    let (sp, diverged) = llama_cpp_path_spread();
    assert!(sp.abs > 1.0 && sp.rel > 0.5, "llama.cpp's two paths agree to {sp:?}: tighten the tolerance");
    assert!(sp.abs < 2.0 && sp.rel < 1.5, "llama.cpp's two paths part by {sp:?}: more than the tolerance was chosen for");
    assert!(diverged >= 3, "only {diverged} cases diverge between llama.cpp's paths");
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
    // Near ties are wider here, and measured: on these files a change of
    // summation order alone flips greedy steps whose top-2 gap is up to
    // ~0.3 (llama.cpp's repacked vs canonical Q4_0 paths part at `code` step
    // 31 with gaps 0.25/0.23; ferrox's scalar vs AVX2 kernels flip `code` at
    // gaps 0.19 and 0.24 on Q8_0), and Q4_0 has flat steps (five candidates
    // within 0.5 at `code` step 33). So 0.5 — about twice the measured
    // path-to-path spread — is the tie width here; wrong math is what the
    // tiny models catch (see tests/README.md).
    let tie = Some(0.5);
    let tol = gemma_tolerance();
    for (kind, reference, other) in [
        // Q8_0 is not repacked: its other llama.cpp path is an AVX2 build (tools/refllama/README.md).
        (ferrox_quant::QuantKind::Q8_0, "gemma3-270m-q8_0.json", Some("gemma3-270m-q8_0.avx2.json")),
        (ferrox_quant::QuantKind::Q4_0, "gemma3-270m-q4_0.json", Some("gemma3-270m-q4_0.norepack.json")),
    ] {
        let out = dir.join(format!("gemma-3-270m-{}.ferrox.gguf", kind.name().to_ascii_lowercase()));
        // `ferrox quantize --pure --allow-requantize`, the command gen.py ran.
        let mix = ferrox_core::ftype::Mix::parse(kind.name()).unwrap();
        let opts = ferrox_core::requantize::Options { pure: true, allow_requantize: true, ..ferrox_core::requantize::Options::new(mix) };
        let w = ferrox_core::requantize::requantize_mix(&src, &opts, 2, |_| {}).unwrap();
        w.write_to(&out).unwrap();
        let other = other.filter(|o| testdata(o).exists());
        compare_greedy(&out, reference, other, tie, tol);
        std::fs::remove_file(&out).ok();
    }
}

