//! Embeddings against llama.cpp's own (`llama-embedding`).
//!
//! Reference data: `testdata/llama_ref/gemma3-270m-q4_k_m.embed.json`, made
//! by `tools/refllama/embed.py`: per prompt, llama.cpp's L2-normalized
//! embedding for each pooling mode (mean, cls, last; and one vector per
//! token for `none` on the first prompt). ferrox's come from the engine the
//! server runs ([`Scheduler`] with embedding requests), with a small batch
//! so every prompt is evaluated in chunks through the KV cache, several at
//! once. The rule: cosine similarity ≥ 0.999 for every input of every mode
//! (every token with `none`).

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

const MIN_COSINE: f64 = 0.999;

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
        constraint: None,
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
    let reference = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/llama_ref/gemma3-270m-q4_k_m.embed.json");
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&reference).unwrap()).unwrap();
    assert_eq!(sha256_file(&path), r["model_sha256"].as_str().unwrap(), "{} is not the file the reference was made from", path.display());
    let model = Model::open(&path, Cpu::new(2)).unwrap();
    let tok = Arc::new(Tokenizer::from_gguf(model.file().metadata_file()).unwrap());
    let n_embd = model.config().n_embd;
    // A batch of 16 tokens: every prompt is evaluated in chunks, three at a time.
    let cfg = SchedulerConfig { n_slots: 3, n_ctx: 512, n_batch: 16, queue_capacity: 64 };
    let (sched, engine) = Scheduler::start(model, Arc::clone(&tok), cfg).unwrap();
    // (case, pooling, reference rows, receiver)
    let mut runs = Vec::new();
    for case in r["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap().to_string();
        let ids = tok.encode(case["prompt"].as_str().unwrap().as_bytes(), true, true).unwrap();
        for pooling in Pooling::ALL {
            let want: Vec<Vec<f32>> = match (pooling, &case[pooling.name()]) {
                (_, Value::Null) => continue,
                (Pooling::None, rows) => rows.as_array().unwrap().iter().map(floats).collect(),
                (_, row) => vec![floats(row)],
            };
            if pooling == Pooling::None {
                assert_eq!(ids.len(), case["n_tokens"].as_u64().unwrap() as usize, "{name}: llama.cpp's token count");
            }
            let (req, rx) = request(ids.clone(), pooling);
            sched.submit(req).unwrap();
            runs.push((name.clone(), pooling, want, rx));
        }
    }
    let mut worst: Vec<(Pooling, f64, String)> = Vec::new();
    let mut failures = Vec::new();
    for (name, pooling, want, rx) in &runs {
        let got = embedding(rx);
        assert_eq!(got.len(), want.len() * n_embd, "{name} {pooling:?}: rows");
        for (t, (g, w)) in got.chunks_exact(n_embd).zip(want).enumerate() {
            let c = cosine(g, w);
            if c < MIN_COSINE {
                failures.push(format!("{name} {}: row {t}: cosine {c:.6}", pooling.name()));
            }
            match worst.iter_mut().find(|(p, ..)| p == pooling) {
                Some(e) if c < e.1 => *e = (*pooling, c, format!("{name} row {t}")),
                Some(_) => {}
                None => worst.push((*pooling, c, format!("{name} row {t}"))),
            }
        }
    }
    sched.shutdown();
    engine.join().unwrap();
    for (p, c, at) in &worst {
        eprintln!("pooling {}: lowest cosine {c:.6} ({at})", p.name());
    }
    assert_eq!(worst.len(), 4, "every pooling mode was compared: {worst:?}");
    assert!(failures.is_empty(), "cosine below {MIN_COSINE}:\n{}", failures.join("\n"));
}
