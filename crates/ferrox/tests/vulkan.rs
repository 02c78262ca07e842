//! The Vulkan backend end to end on the real Gemma 3 270M: `ferrox run
//! --backend vulkan` greedy text equals the CPU's, token for token.
//!
//! Where it runs: a `vulkan` build on a machine with a Vulkan device. CI has
//! Mesa's lavapipe and names it (`FERROX_VULKAN_DEVICE=llvmpipe`; a CPU
//! device is used only when named) and sets `FERROX_REQUIRE_VULKAN=1`, so a
//! device that does not open fails there; anywhere else the test says
//! loudly what it did not check.

mod common;
use common::*;
use std::path::PathBuf;

fn gemma() -> PathBuf {
    std::env::var_os("FERROX_TEST_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ferrox/models/gemma-3-270m-q4_k_m.gguf")
    })
}

fn required() -> bool {
    std::env::var_os("FERROX_REQUIRE_VULKAN").is_some_and(|v| v == "1")
}

/// Greedy text on `backend` (the prompt not echoed).
fn greedy(model: &str, backend: &str) -> std::process::Output {
    ferrox(&["run", model, "-p", "The capital of France is a city that", "-n", "24", "--temp", "0", "--no-echo", "-t", "2", "--backend", backend])
}

#[test]
fn vulkan_greedy_on_gemma_equals_the_cpu() {
    let model = gemma();
    if !model.exists() {
        eprintln!("NOT CHECKED: {} not found; Vulkan greedy text vs the CPU's", model.display());
        return;
    }
    let m = model.to_str().unwrap();
    if !cfg!(feature = "vulkan") {
        assert!(!required(), "FERROX_REQUIRE_VULKAN=1 in a build without the vulkan feature");
        assert_clean_error(&greedy(m, "vulkan"), "--features vulkan");
        eprintln!("NOT CHECKED: this build has no `vulkan` feature; Vulkan greedy text vs the CPU's");
        return;
    }
    let gpu = greedy(m, "vulkan");
    if !gpu.status.success() {
        let err = text(&gpu.stderr);
        assert!(!required(), "FERROX_REQUIRE_VULKAN=1 and the Vulkan run failed: {err}");
        assert_clean_error(&gpu, "Vulkan");
        eprintln!("NOT CHECKED: no Vulkan device opened ({}); Vulkan greedy text vs the CPU's", err.trim());
        return;
    }
    let cpu = greedy(m, "cpu");
    assert!(cpu.status.success(), "cpu run failed: {}", text(&cpu.stderr));
    let (got, want) = (text(&gpu.stdout), text(&cpu.stdout));
    assert!(want.trim().len() > 40, "too short for 24 tokens: {want:?}");
    assert_eq!(got, want, "Vulkan's greedy text left the CPU's");
    eprintln!("vulkan ({}) greedy equals the CPU's: {got:?}", text(&gpu.stderr).lines().find(|l| l.contains("vulkan")).unwrap_or("?"));
}
