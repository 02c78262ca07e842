//! `ferrox bench` and `ferrox perplexity` end to end on tiny random models:
//! the bench's three output formats carry llama-bench's field names and
//! positive rates; perplexity equals a computation done here, independently,
//! from the model's own logits (chunking, BOS replacement and log-softmax
//! written out again in the test); KL divergence against a base is zero for
//! the same model and equals the full KL computed here when the base keeps
//! every token; bad input is a clean error.

mod common;
use common::*;
use std::path::PathBuf;

use ferrox_core::arch::Arch;
use ferrox_core::backend::cpu::Cpu;
use ferrox_core::backend::Batch;
use ferrox_core::model::Model;
use ferrox_core::tokenizer::Tokenizer;

fn tiny(arch: Arch, seed: u64) -> PathBuf {
    let path = scratch(&format!("tiny-{arch:?}-{seed}.gguf"));
    if !path.exists() {
        // Tests run in parallel: write aside, then rename into place whole.
        let tmp = scratch(&format!(
            "tiny-{arch:?}-{seed}.{:?}.tmp",
            std::thread::current().id()
        ));
        ferrox_core::testing::tiny_arch_model(arch, seed)
            .unwrap()
            .write_to(&tmp)
            .unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

/// A text of in-vocabulary words (a fixed pseudo-random walk), `n` words long.
fn words_text(n: usize) -> String {
    let words: Vec<&str> = "the of and to in is was he for it with as his on be at by had are but from or she an which \
                            you one we all were her would there their will when who him been has more if no out do so"
        .split_whitespace()
        .collect();
    let mut x = 12345u64;
    let mut out = Vec::new();
    for _ in 0..n {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push(words[(x >> 33) as usize % words.len()]);
    }
    out.join(" ")
}

fn write_text(name: &str, n_words: usize) -> PathBuf {
    let p = scratch(name);
    std::fs::write(&p, words_text(n_words)).unwrap();
    p
}

const FIELDS: [&str; 12] = [
    "model_filename",
    "model_type",
    "model_size",
    "model_n_params",
    "backends",
    "n_threads",
    "n_prompt",
    "n_gen",
    "avg_ts",
    "stddev_ts",
    "samples_ts",
    "samples_ns",
];

fn check_rows(rows: &[serde_json::Value], model: &str) {
    assert_eq!(rows.len(), 2, "one pp and one tg row: {rows:?}");
    for r in rows {
        for f in FIELDS {
            assert!(r.get(f).is_some(), "row lacks llama-bench's field {f}: {r}");
        }
        assert_eq!(r["model_filename"], model);
        assert!(
            r["avg_ts"].as_f64().unwrap() > 0.0,
            "t/s must be positive: {r}"
        );
        let samples = r["samples_ts"].as_array().unwrap();
        assert_eq!(samples.len(), 2, "-r 2 gives two samples");
        assert!(samples.iter().all(|s| s.as_f64().unwrap() > 0.0));
        assert!(
            r["peak_rss_bytes"].as_u64().unwrap() > 0,
            "peak RSS is read from /proc: {r}"
        );
        assert!(r["load_time_ns"].as_u64().unwrap() > 0);
        assert!(
            r["model_type"].as_str().unwrap().starts_with("llama "),
            "{r}"
        );
        assert!(r["model_size"].as_u64().unwrap() > 0 && r["model_n_params"].as_u64().unwrap() > 0);
        assert_eq!(r["n_threads"], 1);
    }
    assert_eq!(
        (rows[0]["n_prompt"].as_u64(), rows[0]["n_gen"].as_u64()),
        (Some(24), Some(0))
    );
    assert_eq!(
        (rows[1]["n_prompt"].as_u64(), rows[1]["n_gen"].as_u64()),
        (Some(0), Some(6))
    );
}

#[test]
fn bench_emits_json_and_jsonl_with_llama_bench_fields_and_positive_rates() {
    let model = tiny(Arch::Llama, 1);
    let m = model.to_str().unwrap();
    let args = [
        "bench", "-m", m, "-p", "24", "-n", "6", "-r", "2", "-t", "1", "-b", "8",
    ];
    let o = ferrox(&[&args[..], &["-o", "json"]].concat());
    assert!(o.status.success(), "{}", text(&o.stderr));
    let rows: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&o.stdout)));
    check_rows(&rows, m);

    let o = ferrox(&[&args[..], &["-o", "jsonl"]].concat());
    assert!(o.status.success(), "{}", text(&o.stderr));
    let rows: Vec<serde_json::Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("line not JSON ({e}): {l}")))
        .collect();
    check_rows(&rows, m);
}

#[test]
fn bench_emits_a_markdown_table_with_llama_bench_columns() {
    let model = tiny(Arch::Llama, 1);
    let o = ferrox(&[
        "bench",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "16",
        "-n",
        "4",
        "-r",
        "2",
        "-t",
        "1",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 4, "header, rule, pp row, tg row: {out}");
    let cols = |l: &str| {
        l.trim()
            .trim_matches('|')
            .split('|')
            .map(|c| c.trim().to_string())
            .collect::<Vec<_>>()
    };
    let head = cols(lines[0]);
    for want in [
        "model", "size", "params", "backend", "threads", "test", "t/s",
    ] {
        assert!(head.iter().any(|h| h == want), "no {want} column: {out}");
    }
    let ts = head.iter().position(|h| h == "t/s").unwrap();
    let test = head.iter().position(|h| h == "test").unwrap();
    for (row, name) in [(lines[2], "pp16"), (lines[3], "tg4")] {
        let c = cols(row);
        assert_eq!(c.len(), head.len(), "{row}");
        assert_eq!(c[test], name);
        let mean: f64 = c[ts]
            .split(" ± ")
            .next()
            .unwrap()
            .parse()
            .unwrap_or_else(|e| panic!("{e}: {}", c[ts]));
        assert!(mean > 0.0, "{row}");
    }
}

/// `-d` runs every test at each depth: the rows carry `n_depth`, the
/// markdown names the test as llama-bench does (`tg4 @ d16`), and a depth
/// past the model's context is a clean error before anything runs.
#[test]
fn bench_at_depth_runs_every_test_at_each_depth() {
    let model = tiny(Arch::Llama, 1);
    let m = model.to_str().unwrap();
    let o = ferrox(&[
        "bench", "-m", m, "-p", "8", "-n", "4", "-d", "0,16", "-r", "1", "-t", "1", "-o", "jsonl",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let rows: Vec<serde_json::Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("line not JSON ({e}): {l}")))
        .collect();
    let got: Vec<(u64, u64, u64)> = rows
        .iter()
        .map(|r| {
            assert!(r["avg_ts"].as_f64().unwrap() > 0.0, "{r}");
            (
                r["n_prompt"].as_u64().unwrap(),
                r["n_gen"].as_u64().unwrap(),
                r["n_depth"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(got, [(8, 0, 0), (8, 0, 16), (0, 4, 0), (0, 4, 16)]);

    let o = ferrox(&["bench", "-m", m, "-p", "0", "-n", "4", "-d", "16", "-r", "1", "-t", "1"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.lines().any(|l| l.contains("| tg4 @ d16 |")), "{out}");

    // The tiny model's context_length is 256: 250 + 8 positions do not fit.
    assert_clean_error(
        &ferrox(&["bench", "-m", m, "-p", "8", "-n", "0", "-d", "250", "-r", "1", "-t", "1"]),
        "pp8 at depth 250 needs 258 positions",
    );
}

#[test]
fn a_suite_row_that_cannot_run_says_why() {
    let suite = scratch("suite.json");
    let model = tiny(Arch::Llama, 1);
    std::fs::write(
        &suite,
        serde_json::json!({"checkpoints": [
            {"file": model.to_str().unwrap()},
            {"file": "/nonexistent/missing.gguf"},
            {"file": model.to_str().unwrap(), "skip": "listed for later"}
        ]})
        .to_string(),
    )
    .unwrap();
    let o = ferrox(&[
        "bench",
        "--suite",
        suite.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "0",
        "-r",
        "1",
        "-t",
        "1",
        "-o",
        "jsonl",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let rows: Vec<serde_json::Value> = text(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3, "{rows:?}");
    assert!(rows[0]["avg_ts"].as_f64().unwrap() > 0.0);
    assert_eq!(rows[1]["skipped"], "file not found");
    assert_eq!(rows[2]["skipped"], "listed for later");
}

/// Perplexity of `text` computed here: llama-perplexity's method written
/// out again over `Model::forward`, with a log-softmax in f64.
fn reference_ppl(model_path: &PathBuf, text: &str, n_ctx: usize) -> (f64, f64) {
    let model = Model::open(model_path, Cpu::new(1)).unwrap();
    let tok = Tokenizer::from_gguf(model.file().metadata_file()).unwrap();
    let tokens = tok.encode(text.as_bytes(), true, false).unwrap();
    assert_eq!(tokens[0], tok.bos().unwrap(), "the text starts with BOS");
    let n_vocab = model.n_vocab();
    let mut nlls = Vec::new();
    for c in 0..tokens.len() / n_ctx {
        let chunk = &tokens[c * n_ctx..(c + 1) * n_ctx];
        let mut ctx = model.new_context(n_ctx, 1).unwrap();
        let mut b = Batch::default();
        for (pos, &t) in chunk.iter().enumerate() {
            b.push(
                if pos == 0 { tok.bos().unwrap() } else { t },
                pos as u32,
                0,
                true,
            );
        }
        let logits = model.forward(&mut ctx, &b).unwrap();
        for pos in n_ctx / 2..n_ctx - 1 {
            let row: Vec<f64> = logits[pos * n_vocab..(pos + 1) * n_vocab]
                .iter()
                .map(|&l| f64::from(l))
                .collect();
            let z: f64 = row.iter().map(|l| l.exp()).sum::<f64>().ln();
            nlls.push(z - row[chunk[pos + 1] as usize]);
        }
    }
    let n = nlls.len() as f64;
    let mean = nlls.iter().sum::<f64>() / n;
    let var = nlls.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let ppl = mean.exp();
    // llama-perplexity: the population variance over (n - 1).
    (ppl, ppl * (var / (n - 1.0)).sqrt())
}

fn final_estimate(out: &str) -> (f64, f64) {
    let line = out
        .lines()
        .find(|l| l.starts_with("Final estimate: PPL = "))
        .unwrap_or_else(|| panic!("no final estimate: {out}"));
    let rest = line.trim_start_matches("Final estimate: PPL = ");
    let (p, e) = rest.split_once(" +/- ").unwrap();
    (p.parse().unwrap(), e.parse().unwrap())
}

#[test]
fn perplexity_matches_an_independent_computation_from_the_models_logits() {
    let model = tiny(Arch::Gemma3, 3);
    let words = words_text(150);
    let file = scratch("words150.txt");
    std::fs::write(&file, &words).unwrap();
    let o = ferrox(&[
        "perplexity",
        "-m",
        model.to_str().unwrap(),
        "-f",
        file.to_str().unwrap(),
        "-c",
        "16",
        "-b",
        "5",
        "-t",
        "1",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let (ppl, err) = final_estimate(&out);
    let (want_ppl, want_err) = reference_ppl(&model, &words, 16);
    assert!(ppl.is_finite() && ppl > 1.0, "{out}");
    assert!(
        (ppl - want_ppl).abs() <= 1e-3 * want_ppl,
        "ferrox {ppl} vs computed here {want_ppl}"
    );
    assert!(
        (err - want_err).abs() <= 1e-3 * want_err + 1e-5,
        "error {err} vs {want_err}"
    );
    // Running estimates, one per chunk, the last equal to the final figure.
    let running: Vec<&str> = out
        .lines()
        .next()
        .unwrap()
        .trim_end_matches(',')
        .split(',')
        .collect();
    assert!(running.len() >= 2, "{out}");
    assert!(running[0].starts_with("[1]"));
    let last: f64 = running
        .last()
        .unwrap()
        .split(']')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!((last - ppl).abs() < 1e-3, "{last} vs {ppl}");
}

#[test]
fn perplexity_of_a_tiny_llama_over_a_short_text_is_finite() {
    let model = tiny(Arch::Llama, 1);
    let file = write_text("words80.txt", 80);
    let o = ferrox(&[
        "perplexity",
        "-m",
        model.to_str().unwrap(),
        "-f",
        file.to_str().unwrap(),
        "-c",
        "32",
        "-t",
        "1",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let (ppl, err) = final_estimate(&text(&o.stdout));
    assert!(ppl.is_finite() && ppl > 1.0 && ppl < 320.0 * 50.0, "{ppl}");
    assert!(err.is_finite() && err > 0.0);
}

/// Full `KL(base ‖ run)` over the whole vocabulary, computed here.
fn reference_kl(base: &PathBuf, run: &PathBuf, text: &str, n_ctx: usize) -> f64 {
    let logits_of = |p: &PathBuf| {
        let model = Model::open(p, Cpu::new(1)).unwrap();
        let tok = Tokenizer::from_gguf(model.file().metadata_file()).unwrap();
        let tokens = tok.encode(text.as_bytes(), true, false).unwrap();
        let mut rows = Vec::new();
        for c in 0..tokens.len() / n_ctx {
            let mut ctx = model.new_context(n_ctx, 1).unwrap();
            let mut b = Batch::default();
            for pos in 0..n_ctx {
                b.push(
                    if pos == 0 {
                        tok.bos().unwrap()
                    } else {
                        tokens[c * n_ctx + pos]
                    },
                    pos as u32,
                    0,
                    true,
                );
            }
            let l = model.forward(&mut ctx, &b).unwrap();
            let v = model.n_vocab();
            for pos in n_ctx / 2..n_ctx - 1 {
                let row: Vec<f64> = l[pos * v..(pos + 1) * v]
                    .iter()
                    .map(|&x| f64::from(x))
                    .collect();
                let z = row.iter().map(|x| x.exp()).sum::<f64>().ln();
                rows.push(row.iter().map(|x| x - z).collect::<Vec<f64>>());
            }
        }
        rows
    };
    let (p, q) = (logits_of(base), logits_of(run));
    let kls: Vec<f64> = p
        .iter()
        .zip(&q)
        .map(|(lp, lq)| lp.iter().zip(lq).map(|(a, b)| a.exp() * (a - b)).sum())
        .collect();
    kls.iter().sum::<f64>() / kls.len() as f64
}

fn kl_line(out: &str, key: &str) -> f64 {
    let l = out
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key}: {out}"));
    let v = l.split(':').nth(1).unwrap().trim();
    v.split([' ', '%']).next().unwrap().parse().unwrap()
}

#[test]
fn kl_divergence_is_zero_against_itself_and_the_full_kl_against_another_model() {
    let base = tiny(Arch::Gemma3, 3);
    let other = tiny(Arch::Gemma3, 4);
    let words = words_text(120);
    let file = scratch("words120.txt");
    std::fs::write(&file, &words).unwrap();
    let kl_file = scratch("base.kl");
    let (b, f, k) = (
        base.to_str().unwrap(),
        file.to_str().unwrap(),
        kl_file.to_str().unwrap(),
    );
    // Keeping all 320 tokens makes the top-k KL the full KL.
    let o = ferrox(&[
        "perplexity",
        "-m",
        b,
        "-f",
        f,
        "-c",
        "16",
        "-t",
        "1",
        "--kl-divergence-base",
        k,
        "--kl-top-k",
        "320",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let (base_ppl, _) = final_estimate(&text(&o.stdout));

    let o = ferrox(&[
        "perplexity",
        "-m",
        b,
        "-t",
        "1",
        "--kl-divergence-base",
        k,
        "--kl-divergence",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(kl_line(&out, "Mean KLD").abs() < 1e-5, "{out}");
    assert_eq!(kl_line(&out, "Same top p"), 100.0, "{out}");
    assert!(
        (kl_line(&out, "Mean PPL(base)") - base_ppl).abs() < 1e-3 * base_ppl,
        "{out}"
    );

    let o = ferrox(&[
        "perplexity",
        "-m",
        other.to_str().unwrap(),
        "-t",
        "1",
        "--kl-divergence-base",
        k,
        "--kl-divergence",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let want = reference_kl(&base, &other, &words, 16);
    let got = kl_line(&out, "Mean KLD");
    assert!(want > 0.01, "two random models should disagree: {want}");
    assert!(
        (got - want).abs() <= 1e-4 * want.max(1.0),
        "ferrox KLD {got} vs computed here {want}\n{out}"
    );
}

#[test]
fn perplexity_bad_input_is_a_clean_error() {
    let model = tiny(Arch::Llama, 1);
    let m = model.to_str().unwrap();
    let short = write_text("short.txt", 20);
    let n_short = {
        let f = ferrox_gguf::GgufModel::open(&model).unwrap();
        Tokenizer::from_gguf(f.metadata_file())
            .unwrap()
            .encode(words_text(20).as_bytes(), true, false)
            .unwrap()
            .len()
    };
    // A context just over half the text: one chunk short of the two needed.
    let c = (n_short / 2 + 1).to_string();
    let ok = write_text("ok.txt", 80);
    assert_clean_error(
        &ferrox(&[
            "perplexity",
            "-m",
            m,
            "-f",
            "/nonexistent/text.txt",
            "-c",
            "16",
        ]),
        "cannot read text file",
    );
    let need = format!("needs at least {}", 2 * (n_short / 2 + 1));
    assert_clean_error(
        &ferrox(&[
            "perplexity",
            "-m",
            m,
            "-f",
            short.to_str().unwrap(),
            "-c",
            &c,
        ]),
        &need,
    );
    assert_clean_error(
        &ferrox(&["perplexity", "-m", m, "-f", ok.to_str().unwrap(), "-c", "0"]),
        "must be positive",
    );
    assert_clean_error(
        &ferrox(&[
            "perplexity",
            "-m",
            "/nonexistent/model.gguf",
            "-f",
            ok.to_str().unwrap(),
        ]),
        "cannot load model",
    );
    let junk = scratch("junk.kl");
    std::fs::write(&junk, b"not a base file at all, just bytes").unwrap();
    assert_clean_error(
        &ferrox(&[
            "perplexity",
            "-m",
            m,
            "--kl-divergence-base",
            junk.to_str().unwrap(),
            "--kl-divergence",
        ]),
        "bad magic",
    );
}

#[test]
fn bench_bad_input_is_a_clean_error() {
    let model = tiny(Arch::Llama, 1);
    let m = model.to_str().unwrap();
    assert_clean_error(
        &ferrox(&["bench", "-m", "/nonexistent/model.gguf"]),
        "not found",
    );
    assert_clean_error(
        &ferrox(&["bench", "-m", m, "-r", "0"]),
        "-r must be at least 1",
    );
    assert_clean_error(
        &ferrox(&["bench", "-m", m, "--backend", "nosuch"]),
        "unknown backend",
    );
    // Without the feature the backend is not compiled in; with it, a machine
    // without a GPU (or FERROX_CUDA=0) cannot open the device. Either way a
    // clean error, never a CPU run reported as CUDA.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_ferrox"))
        .args(["bench", "-m", m, "--backend", "cuda", "-p", "8", "-n", "0", "-r", "1"])
        .env("FERROX_CUDA", "0")
        .output()
        .unwrap();
    let expect = if cfg!(feature = "cuda") {
        "cannot open CUDA"
    } else {
        "not compiled into this build"
    };
    assert_clean_error(&o, expect);
}
