//! Helpers shared by the end-to-end tests of the `ferrox` binary.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the built `ferrox` binary.
pub fn ferrox(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrox")).args(args).output().expect("run ferrox")
}

/// A path in this test process's own scratch directory.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrox-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Output bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A failure that is a clean error: non-zero exit, the expected words, no panic.
pub fn assert_clean_error(o: &Output, expect: &str) {
    let err = text(&o.stderr);
    assert!(!o.status.success(), "expected failure, got success; stdout: {}; stderr: {err}", text(&o.stdout));
    assert!(err.contains(expect), "stderr should mention {expect:?}: {err}");
    assert!(!err.contains("panicked"), "a panic is not an error message: {err}");
}

/// The real test model: `FERROX_TEST_MODEL`, or where `scripts/get-model.sh` puts Gemma 3 270M.
pub fn gemma() -> PathBuf {
    std::env::var_os("FERROX_TEST_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ferrox/models/gemma-3-270m-q4_k_m.gguf")
    })
}

/// English prose (182 Gemma tokens) that a device backend's logits are
/// scored on against the CPU's.
pub const PROSE: &str = "The history of the printing press begins long before Johannes Gutenberg. \
Woodblock printing was practised in China by the seventh century, and movable type made of baked clay \
was described by Shen Kuo in the eleventh. What changed in Mainz around 1450 was not a single idea but a \
system: a hand mould that cast thousands of identical metal letters, an oil-based ink that clung to \
metal, and a screw press adapted from the wine and paper trades. Within fifty years more than a thousand \
presses were working across Europe, and the price of a book fell so far that a clerk could own several. \
Historians still argue about the consequences. Some credit the press with the Reformation, the \
scientific revolution and the rise of national languages; others point out that literacy grew slowly, \
that manuscripts were copied for another century, and that the most printed books were calendars, \
prayers and school grammars.";

/// How a device backend's next-token distributions compare with the CPU's
/// over [`PROSE`], teacher-forced (`ferrox perplexity --kl-divergence`).
#[derive(Debug)]
pub struct Agreement {
    /// Mean KL divergence from the CPU's distribution (top-32 + rest).
    pub kld: f64,
    /// The share of scored positions whose top token is the CPU's.
    pub same_top: f64,
}

/// The value after `label` on the line of `out` that starts with it.
fn field(out: &str, label: &str) -> f64 {
    let line = out.lines().find(|l| l.starts_with(label)).unwrap_or_else(|| panic!("no {label:?} in: {out}"));
    let v = line.split(':').nth(1).and_then(|v| v.split_whitespace().next()).unwrap();
    v.trim_end_matches('%').parse().unwrap_or_else(|e| panic!("{label}: {v:?}: {e}"))
}

/// [`Agreement`] of `backend` with the CPU on `model`, in chunks of `ctx`
/// tokens fed `batch` at a time (1: the one-token decode path, as `run`
/// steps; `ctx`: the batched prefill path), at most `chunks` of them.
pub fn agreement_with_the_cpu(model: &str, backend: &str, ctx: usize, batch: usize, chunks: usize) -> Agreement {
    let prose = scratch("prose.txt");
    std::fs::write(&prose, PROSE).unwrap();
    let base = scratch(&format!("cpu-logits-c{ctx}-n{chunks}.bin"));
    let (t, c, b, n, bs) = (prose.to_str().unwrap(), ctx.to_string(), batch.to_string(), chunks.to_string(), base.to_str().unwrap());
    let common = ["perplexity", model, "-f", t, "-c", &c, "--chunks", &n, "-t", "2", "--kl-divergence-base", bs];
    let cpu = ferrox(&[&common[..], &["--backend", "cpu"]].concat());
    assert!(cpu.status.success(), "the CPU's base run failed: {}", text_of(&cpu));
    let dev = ferrox(&[&common[..], &["--kl-divergence", "-b", &b, "--backend", backend]].concat());
    assert!(dev.status.success(), "{backend}'s comparison run failed: {}", text_of(&dev));
    let out = text(&dev.stdout);
    Agreement { kld: field(&out, "Mean KLD"), same_top: field(&out, "Same top p") / 100.0 }
}

fn text_of(o: &Output) -> String {
    format!("{}{}", text(&o.stdout), text(&o.stderr))
}

/// A device backend end to end on the real Gemma 3 270M, as `ferrox`'s
/// commands reach it: `run` greedy on `backend` gives text, and its logits
/// follow the CPU's over [`PROSE`] through the batched path (chunks of 64)
/// and the one-token decode path (two chunks of 32). `built`: this build has
/// the backend's feature. With `FERROX_REQUIRE_<BACKEND>=1` a device that
/// does not open fails the test instead of skipping it. The bars: a mean KL divergence under
/// 0.01 and the same top token at nine positions in ten or more. Metal's
/// shim and lavapipe measure 0.004 and 95–97% (float activations on the
/// devices, ggml's 8-bit activations on the CPU); an error in one kernel
/// moves them far past that. Greedy text is not compared token for token:
/// two correct backends part at the first near tie (decision 0048).
pub fn device_follows_the_cpu(backend: &str, name: &str, built: bool) {
    let model = gemma();
    let what = format!("{name}'s logits vs the CPU's on Gemma 3 270M");
    if !model.exists() {
        eprintln!("NOT CHECKED: {} not found; {what}", model.display());
        return;
    }
    let m = model.to_str().unwrap();
    let greedy = ferrox(&["run", m, "-p", "The capital of France is a city that", "-n", "24", "--temp", "0", "--no-echo", "-t", "2", "--backend", backend]);
    let env = format!("FERROX_REQUIRE_{}", backend.to_uppercase());
    let required = std::env::var_os(&env).is_some_and(|v| v == "1");
    if !built {
        assert!(!required, "{env}=1 in a build without the {backend} feature");
        assert_clean_error(&greedy, &format!("--features {backend}"));
        eprintln!("NOT CHECKED: this build has no `{backend}` feature; {what}");
        return;
    }
    if !greedy.status.success() {
        let err = text(&greedy.stderr);
        assert!(!required, "{env}=1 and the {name} run failed: {err}");
        assert_clean_error(&greedy, name);
        eprintln!("NOT CHECKED: no {name} device opened ({}); {what}", err.trim());
        return;
    }
    let got = text(&greedy.stdout);
    assert!(got.trim().len() > 40, "too short for 24 tokens: {got:?}");
    for (ctx, batch, chunks) in [(64, 64, 2), (32, 1, 2)] {
        let a = agreement_with_the_cpu(m, backend, ctx, batch, chunks);
        eprintln!("{name}, chunks of {ctx} fed {batch} at a time: {a:?}");
        assert!(a.kld < 0.01 && a.same_top >= 0.9, "{name}'s logits left the CPU's (chunks of {ctx}, batch {batch}): {a:?}");
    }
    eprintln!("{name} greedy: {got:?}");
}
