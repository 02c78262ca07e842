//! Embeddings against llama.cpp's own (`llama-embedding`).
//!
//! Reference data: `testdata/llama_ref/gemma3-270m-q4_k_m.embed.norepack.json`, made
//! by `tools/refllama/embed.py`: per prompt, llama.cpp's L2-normalized
//! embedding for each pooling mode (mean, cls, last; and one vector per
//! token for `none` on the first prompt). ferrox's come from the engine the
//! server runs ([`Scheduler`] with embedding requests), with a small batch
//! so every prompt is evaluated in chunks through the KV cache, several at
//! once.
//!
//! The rule, as `llama_ref.rs` has it for the logits: ferrox may be as far
//! from llama.cpp as twice llama.cpp's own spread. llama.cpp has two CPU
//! paths for this file (its default, with repacked weights, and
//! `--no-repack`, `...embed.norepack.json`); the lowest cosine between their
//! answers over every vector of the file is `c_llama` (0.99798, a last-token
//! vector), and every ferrox vector (every token's with `none`) must have
//! cosine ≥ `1 - 2 (1 - c_llama)` (0.99596) with the default path. A flat
//! 0.999 does not hold, for ferrox or for llama.cpp against itself: past the
//! first position a last-bit difference (a sum taken in another order, f32
//! attention where llama.cpp's batches of under 64 tokens sum in f16) is
//! turned into whole 8-bit steps by the next activation quantization and
//! grows layer by layer, and llama.cpp's two paths, equal to 2e-8 after the
//! first layer, end 5% apart on a code prompt's hidden states (decision
//! 0048). ferrox's lowest: 0.99755 (last; llama.cpp's paths 0.99798),
//! 0.99855 (none; 0.99845), 0.99927 (mean; 0.99976), 1.0 (cls).
//!
//! The first position is held tighter: its state is the BOS token's alone,
//! the same for every prompt, with nothing before it to amplify a
//! difference, and llama.cpp's two paths agree on it to 1e-7 relative. Every
//! vector of that position (`cls`, and `none`'s first row) must have cosine
//! ≥ [`BOS_COSINE`]. ferrox's cosine there was 0.99953 while its 8-bit
//! activations rounded ties away from zero where llama.cpp rounds them to
//! even; it is 1 - 7e-13 now. The test prints the figures.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use ferrox_core::backend::cpu::Cpu;
use ferrox_core::embed::{cosine, Pooling};
use ferrox_core::model::Model;
use ferrox_core::sampling::SamplingParams;
use ferrox_core::scheduler::{EventSink, Scheduler, SchedulerConfig, SeqEvent, SeqRequest};
use ferrox_core::tokenizer::Tokenizer;
use serde_json::Value;
use sha2::{Digest, Sha256};


/// The lowest cosine with llama.cpp allowed for the first position's
/// vectors. Measured: 1 - 7e-13 (AVX2; the reference keeps 6 significant
/// digits, itself a few 1e-13). Kept at 1 - 1e-5: room for a few 8-bit
/// codes resolved the other way on another CPU level (two such codes in
/// Gemma's first layer moved its Q projection by 2.5e-4 relative, about
/// 1 - 3e-8 in cosine), and still fifty times below the 1 - 4.7e-4 that
/// rounding ties the other way cost.
const BOS_COSINE: f64 = 0.99999;

fn gemma() -> PathBuf {
    std::env::var_os("FERROX_TEST_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ferrox/models/gemma-3-270m-q4_k_m.gguf")
    })
}

struct Sink(mpsc::Sender<SeqEvent>);

impl EventSink for Sink {
    fn send(&mut self, event: SeqEvent) -> bool {
        self.0.send(event).is_ok()
    }
    fn is_closed(&self) -> bool {
        false
    }
}

fn request(prompt: Vec<u32>, pooling: Pooling) -> (SeqRequest, mpsc::Receiver<SeqEvent>) {
    let (tx, rx) = mpsc::channel();
    let req = SeqRequest {
        prompt,
        max_tokens: None,
        stop: Vec::new(),
        sampling: SamplingParams::default(),
        ignore_eos: false,
        cache_prompt: true,
        constraint: None,
        draft: None,
        embed: Some(pooling),
        sink: Box::new(Sink(tx)),
    };
    (req, rx)
}

fn embedding(rx: &mpsc::Receiver<SeqEvent>) -> Vec<f32> {
    let mut out = None;
    loop {
        match rx.recv_timeout(Duration::from_secs(300)).expect("the embedding never ended") {
            SeqEvent::Embedding(v) => out = Some(v),
            SeqEvent::Done(_) => return out.expect("Done without an embedding"),
            SeqEvent::Failed(e) => panic!("the engine failed: {e}"),
            SeqEvent::Started { .. } | SeqEvent::Token(_) => {}
        }
    }
}

fn floats(v: &Value) -> Vec<f32> {
    v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

fn sha256_file(path: &Path) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

#[test]
fn embeddings_point_where_llama_cpps_do_for_every_pooling_mode() {
    let path = gemma();
    if !path.exists() {
        eprintln!(
            "SKIPPED: {} not found (set FERROX_TEST_MODEL); embeddings were NOT checked against llama.cpp",
            path.display()
        );
        return;
    }
    let load = |name: &str| -> Value {
        let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/llama_ref").join(name);
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let r = load("gemma3-270m-q4_k_m.embed.json");
    let other = load("gemma3-270m-q4_k_m.embed.norepack.json");
    assert_eq!(r["model_sha256"], other["model_sha256"]);
    assert_eq!(sha256_file(&path), r["model_sha256"].as_str().unwrap(), "{} is not the file the reference was made from", path.display());
    let model = Model::open(&path, Cpu::new(2)).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(model.file().metadata_file()).unwrap());
    let n_embd = model.config().n_embd;
    // A batch of 16 tokens: every prompt is evaluated in chunks, three at a time.
    let cfg = SchedulerConfig { n_slots: 3, n_ctx: 512, n_batch: 16, queue_capacity: 64 };
    let (sched, engine) = Scheduler::start(model, Arc::clone(&tok), cfg).unwrap();
    // (case, pooling, reference rows, receiver)
    let mut runs = Vec::new();
    for (case, ocase) in r["cases"].as_array().unwrap().iter().zip(other["cases"].as_array().unwrap()) {
        let name = case["name"].as_str().unwrap().to_string();
        assert_eq!(ocase["name"], case["name"]);
        let ids = tok.encode(case["prompt"].as_str().unwrap().as_bytes(), true, true).unwrap();
        for pooling in Pooling::ALL {
            let rows_of = |c: &Value| -> Option<Vec<Vec<f32>>> {
                match (pooling, &c[pooling.name()]) {
                    (_, Value::Null) => None,
                    (Pooling::None, rows) => Some(rows.as_array().unwrap().iter().map(floats).collect()),
                    (_, row) => Some(vec![floats(row)]),
                }
            };
            let Some(want) = rows_of(case) else { continue };
            let alt = rows_of(ocase).expect("both references hold the same vectors");
            assert_eq!(alt.len(), want.len());
            if pooling == Pooling::None {
                assert_eq!(ids.len(), case["n_tokens"].as_u64().unwrap() as usize, "{name}: llama.cpp's token count");
            }
            let (req, rx) = request(ids.clone(), pooling);
            sched.submit(req).unwrap();
            runs.push((name.clone(), pooling, want, alt, rx));
        }
    }
    // Per mode: (lowest cosine with the default path, where, the same with
    // --no-repack, llama.cpp's own lowest path-to-path cosine, sum, count).
    let mut seen: Vec<(Pooling, f64, String, f64, f64, f64, usize)> = Vec::new();
    let mut results = Vec::new();
    // The first position's vectors: (where, cosine).
    let mut bos = Vec::new();
    for (name, pooling, want, alt, rx) in &runs {
        let got = embedding(rx);
        assert_eq!(got.len(), want.len() * n_embd, "{name} {pooling:?}: rows");
        for (t, ((g, w), a)) in got.chunks_exact(n_embd).zip(want).zip(alt).enumerate() {
            let (c, c_alt, c_llama) = (cosine(g, w), cosine(g, a), cosine(w, a));
            results.push((format!("{name} {} row {t}", pooling.name()), c));
            if *pooling == Pooling::Cls || (*pooling == Pooling::None && t == 0) {
                bos.push((format!("{name} {} row {t}", pooling.name()), c));
            }
            let i = match seen.iter().position(|e| e.0 == *pooling) {
                Some(i) => i,
                None => {
                    seen.push((*pooling, 2.0, String::new(), 2.0, 2.0, 0.0, 0));
                    seen.len() - 1
                }
            };
            let e = &mut seen[i];
            if c < e.1 {
                (e.1, e.2) = (c, format!("{name} row {t}"));
            }
            e.3 = e.3.min(c_alt);
            e.4 = e.4.min(c_llama);
            e.5 += c;
            e.6 += 1;
        }
    }
    sched.shutdown();
    engine.join().unwrap();
    for (p, c, at, c_alt, c_llama, sum, n) in &seen {
        eprintln!(
            "pooling {}: {n} vectors; cosine with llama.cpp lowest {c:.6} ({at}), mean {:.6}; with --no-repack lowest {c_alt:.6}; llama.cpp's two paths lowest {c_llama:.6}",
            p.name(),
            sum / *n as f64
        );
    }
    assert_eq!(seen.len(), 4, "every pooling mode was compared");
    let spread = seen.iter().map(|e| e.4).fold(1.0, f64::min);
    let bound = 1.0 - 2.0 * (1.0 - spread);
    eprintln!("llama.cpp's two paths: lowest cosine {spread:.6}; bound {bound:.6}");
    assert!(spread > 0.99, "the two llama.cpp references disagree too much to bound anything: {spread}");
    let failures: Vec<String> =
        results.iter().filter(|(_, c)| *c < bound).map(|(at, c)| format!("{at}: cosine {c:.6}")).collect();
    assert!(failures.is_empty(), "below {bound:.6}:\n{}", failures.join("\n"));
    let bos_low = bos.iter().map(|e| e.1).fold(1.0, f64::min);
    eprintln!("first position: {} vectors; lowest cosine 1 - {:.1e}; bound 1 - {:.0e}", bos.len(), 1.0 - bos_low, 1.0 - BOS_COSINE);
    assert!(bos.len() >= 6, "the first position was compared in cls and none");
    let failures: Vec<String> =
        bos.iter().filter(|(_, c)| *c < BOS_COSINE).map(|(at, c)| format!("{at}: cosine {c:.8}")).collect();
    assert!(failures.is_empty(), "the first position below {BOS_COSINE}:\n{}", failures.join("\n"));
}
