//! The Metal backend end to end on the real Gemma 3 270M: `ferrox run
//! --backend metal` greedy text equals the CPU's, token for token.
//!
//! Where it runs: a `metal` build whose Metal device opens. Off Apple
//! targets that is the shim (the Metal kernels compiled as C++, run on the
//! CPU), opened by `FERROX_METAL=shim`; CI sets it with
//! `FERROX_REQUIRE_METAL=1`, so a device that does not open fails there.
//! On a Mac it is the GPU — which this project has never run it on.
//! Anywhere else the test says loudly what it did not check.

mod common;
use common::*;
use std::path::PathBuf;

fn gemma() -> PathBuf {
    std::env::var_os("FERROX_TEST_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ferrox/models/gemma-3-270m-q4_k_m.gguf")
    })
}

fn required() -> bool {
    std::env::var_os("FERROX_REQUIRE_METAL").is_some_and(|v| v == "1")
}

/// Greedy text on `backend` (the prompt not echoed).
fn greedy(model: &str, backend: &str) -> std::process::Output {
    ferrox(&["run", model, "-p", "The capital of France is a city that", "-n", "24", "--temp", "0", "--no-echo", "-t", "2", "--backend", backend])
}

#[test]
fn metal_greedy_on_gemma_equals_the_cpu() {
    let model = gemma();
    if !model.exists() {
        eprintln!("NOT CHECKED: {} not found; Metal greedy text vs the CPU's", model.display());
        return;
    }
    let m = model.to_str().unwrap();
    if !cfg!(feature = "metal") {
        assert!(!required(), "FERROX_REQUIRE_METAL=1 in a build without the metal feature");
        assert_clean_error(&greedy(m, "metal"), "--features metal");
        eprintln!("NOT CHECKED: this build has no `metal` feature; Metal greedy text vs the CPU's");
        return;
    }
    let dev = greedy(m, "metal");
    if !dev.status.success() {
        let err = text(&dev.stderr);
        assert!(!required(), "FERROX_REQUIRE_METAL=1 and the Metal run failed: {err}");
        assert_clean_error(&dev, "Metal");
        eprintln!("NOT CHECKED: no Metal device opened ({}); Metal greedy text vs the CPU's", err.trim());
        return;
    }
    let cpu = greedy(m, "cpu");
    assert!(cpu.status.success(), "cpu run failed: {}", text(&cpu.stderr));
    let (got, want) = (text(&dev.stdout), text(&cpu.stdout));
    assert!(want.trim().len() > 40, "too short for 24 tokens: {want:?}");
    assert_eq!(got, want, "Metal's greedy text left the CPU's");
    eprintln!("metal ({}) greedy equals the CPU's: {got:?}", text(&dev.stderr).lines().find(|l| l.contains("metal")).unwrap_or("?"));
}
