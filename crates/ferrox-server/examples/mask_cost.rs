//! What constrained decoding costs per token: the time to compute and apply
//! llguidance's mask over a real vocabulary, for `STREAMS` sequences stepped
//! together as the scheduler steps them (one mask per sequence per step).
//!
//! Each sequence is forced along a valid JSON document of a schema (its
//! tokens from the model's tokenizer), so every step computes the mask a
//! real reply would need. Prints one JSON line (benchmarks/results/ format).
//!
//! Usage: cargo run --release -p ferrox-server --example mask_cost -- MODEL.gguf [STREAMS] [ROUNDS]

use std::sync::Arc;
use std::time::Instant;

use ferrox_core::tokenizer::Tokenizer;
use ferrox_server::constrain::{Grammars, Spec};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).ok_or("usage: mask_cost MODEL.gguf [STREAMS] [ROUNDS]")?;
    let streams: usize = args.get(2).map_or(Ok(16), |s| s.parse())?;
    let rounds: usize = args.get(3).map_or(Ok(3), |s| s.parse())?;
    let file = ferrox_gguf::GgufFile::open(path)?;
    let tok = Arc::new(Tokenizer::from_gguf(&file)?);
    let t0 = Instant::now();
    let grammars = Grammars::new(Arc::clone(&tok))?;
    let setup_ms = t0.elapsed().as_secs_f64() * 1e3;
    let schema = json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.com$"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
            "address": {"$ref": "#/$defs/address"},
            "status": {"anyOf": [{"enum": ["active", "inactive"]}, {"type": "null"}]}
        },
        "required": ["name", "age", "email", "tags", "address", "status"],
        "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city", "zip"]}}
    });
    let t1 = Instant::now();
    let grammar = grammars.compile(&Spec::JsonSchema(schema))?;
    let compile_ms = t1.elapsed().as_secs_f64() * 1e3;
    // One document per stream, in the layout the compiler enforces.
    let docs: Vec<Vec<u32>> = (0..streams)
        .map(|i| {
            let text = format!(
                "{{\"name\": \"Person number {i} of the test\", \"age\": {}, \"email\": \"user{}@example.com\", \"tags\": [\"alpha\", \"beta {i}\", \"gamma\"], \"address\": {{\"street\": \"{i} Main Street\", \"city\": \"Springfield\", \"zip\": \"{:05}\"}}, \"status\": \"active\"}}",
                20 + i,
                "abcdefghijklmnop".chars().nth(i % 16).unwrap_or('a'),
                10000 + i
            );
            tok.encode(text.as_bytes(), false, false).unwrap_or_default()
        })
        .collect();
    let n_vocab = tok.n_vocab();
    let mut logits = vec![0.0f32; n_vocab];
    let (mut masks, mut off_path) = (0usize, 0usize);
    let mut mask_s = 0.0f64;
    for _ in 0..rounds {
        let mut cons: Vec<_> = (0..streams).map(|_| grammar.constraint()).collect();
        let longest = docs.iter().map(Vec::len).max().unwrap_or(0);
        for step in 0..longest {
            for (s, c) in cons.iter_mut().enumerate() {
                let Some(&t) = docs[s].get(step) else { continue };
                logits.iter_mut().for_each(|l| *l = 0.0);
                let start = Instant::now();
                c.mask(&mut logits);
                mask_s += start.elapsed().as_secs_f64();
                masks += 1;
                if logits[t as usize] == f32::NEG_INFINITY {
                    off_path += 1;
                }
                c.accept(t);
            }
        }
    }
    let per_mask_us = mask_s * 1e6 / masks.max(1) as f64;
    let line = json!({
        "bench": "mask_cost",
        "model": std::path::Path::new(path).file_name().map(|f| f.to_string_lossy().into_owned()),
        "n_vocab": n_vocab,
        "streams": streams,
        "masks": masks,
        "tokens_off_path": off_path,
        "trie_setup_ms": setup_ms,
        "schema_compile_ms": compile_ms,
        "mask_us_per_token": per_mask_us,
        "mask_ms_per_step_serial": per_mask_us * streams as f64 / 1e3,
    });
    println!("{line}");
    Ok(())
}
