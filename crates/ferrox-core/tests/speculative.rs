//! Speculative decoding on the real Gemma 3 270M: greedy output is the
//! token ids of plain greedy decoding, for the pair (an F16 target
//! and a Q4_0 draft, both re-quantized from the published Q4_K_M file here)
//! and for prompt lookup, on the F16 and the Q4_K_M targets.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use ferrox_core::backend::cpu::Cpu;
use ferrox_core::generate::{GenerateOptions, Session};
use ferrox_core::model::Model;
use ferrox_core::sampling::SamplingParams;
use ferrox_core::speculative::{DraftModel, DraftParams, Drafter, Lookup, Speculation, MAX_DRAFT};
use ferrox_core::tokenizer::Tokenizer;
use ferrox_gguf::GgufModel;
use ferrox_quant::QuantKind;

fn gemma() -> PathBuf {
    std::env::var_os("FERROX_TEST_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ferrox/models/gemma-3-270m-q4_k_m.gguf")
    })
}

fn requantized(src: &GgufModel, kind: QuantKind, dir: &std::path::Path) -> Model<Cpu> {
    let path = dir.join(format!("{kind:?}.gguf"));
    ferrox_core::requantize::requantize(src, kind, 2, |_| {}).unwrap().write_to(&path).unwrap();
    Model::open(&path, Cpu::new(2)).unwrap()
}

const PROMPTS: [&str; 3] = [
    "The capital of France is",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    // An editing prompt: the text, then the start of its corrected copy.
    "Fix the typos.\nText: The quick brwn fox jumps over the lazzy dog near the river bank.\nFixed: The quick brown fox",
];

fn greedy(model: &Model<Cpu>, tok: &Tokenizer, prompt: &[u32], spec: Option<&mut Speculation<'_>>) -> Vec<u32> {
    let opts = GenerateOptions { max_tokens: Some(40), sampling: SamplingParams::greedy(), ignore_eos: true, logprobs: false, ..Default::default() };
    let mut s = Session::new(model, tok, 512).unwrap();
    let c = s.generate_with(prompt, &opts, spec, &AtomicBool::new(false), &mut |_| {}).unwrap();
    c.tokens.iter().map(|t| t.sampled.token).collect()
}

#[test]
fn greedy_speculation_on_gemma_gives_the_ids_of_plain_greedy_decoding() {
    let path = gemma();
    let Ok(src) = GgufModel::open(&path) else {
        eprintln!("NOT CHECKED: speculative decoding on Gemma 3 (no model at {})", path.display());
        return;
    };
    let dir = std::env::temp_dir().join(format!("ferrox-spec-gemma-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let f16 = requantized(&src, QuantKind::F16, &dir);
    let mut q4_0 = requantized(&src, QuantKind::Q4_0, &dir);
    q4_0.trim_head(65536).unwrap();
    let q4_k_m = Model::open(&path, Cpu::new(2)).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    let tok = Tokenizer::from_gguf(f16.file().metadata_file()).unwrap();
    ferrox_core::speculative::check_vocab(&tok, &Tokenizer::from_gguf(q4_0.file().metadata_file()).unwrap()).unwrap();
    let params = DraftParams { max: MAX_DRAFT, min: 0 };
    for text in PROMPTS {
        let prompt = tok.encode(text.as_bytes(), true, true).unwrap();
        for (name, target) in [("F16", &f16), ("Q4_K_M", &q4_k_m)] {
            let want = greedy(target, &tok, &prompt, None);
            let mut lookup = Lookup::default();
            let mut draft = DraftModel::new(&q4_0, 512, 0.0).unwrap();
            let drafters: Vec<(&str, &mut dyn Drafter)> = vec![("lookup", &mut lookup), ("Q4_0 draft", &mut draft)];
            for (how, d) in drafters {
                let mut spec = Speculation { drafter: d, params };
                let got = greedy(target, &tok, &prompt, Some(&mut spec));
                assert_eq!(got, want, "{name} target, {how}, prompt {text:?}");
            }
        }
    }
}
