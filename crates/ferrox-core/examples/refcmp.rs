//! Teacher-forced comparison with a refllama JSON, step by step as llama.cpp
//! decoded (a diagnostic; the tests in tests/llama_ref.rs assert): prints per
//! case the largest |logit difference| over llama.cpp's top-k and every step
//! where the argmax differs, with llama.cpp's top-2 gap there.
use ferrox_core::backend::{cpu::Cpu, Batch};
use ferrox_core::model::Model;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().collect();
    let model = Model::open(&args[1], Cpu::new(2))?;
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&args[2])?)?;
    for case in r["cases"].as_array().ok_or("no cases")? {
        let ids: Vec<u32> = case["prompt_tokens"].as_array().ok_or("tokens")?.iter().map(|v| v.as_u64().unwrap_or(0) as u32).collect();
        let mut ctx = model.new_context(2048, 1)?;
        let mut b = Batch::default();
        for (i, &t) in ids.iter().enumerate() {
            b.push(t, i as u32, 0, i + 1 == ids.len());
        }
        let mut logits = model.forward(&mut ctx, &b)?;
        let (mut max, mut bad) = (0.0f32, Vec::new());
        for (s, st) in case["steps"].as_array().ok_or("steps")?.iter().enumerate() {
            let top: Vec<(usize, f32)> = st["top"].as_array().ok_or("top")?.iter().map(|p| (p[0].as_u64().unwrap_or(0) as usize, p[1].as_f64().unwrap_or(0.0) as f32)).collect();
            let got = logits.iter().enumerate().fold(0, |b, (i, &x)| if x > logits[b] { i } else { b });
            if got != top[0].0 {
                bad.push(format!("step {s}: gap {:.3}", top[0].1 - top[1].1));
            }
            for &(id, l) in &top {
                max = max.max((logits[id] - l).abs());
            }
            let mut b = Batch::default();
            b.push(top[0].0 as u32, (ids.len() + s) as u32, 0, true);
            logits = model.forward(&mut ctx, &b)?;
        }
        println!("{}: max |diff| {max:.3}; argmax differs at {bad:?}", case["name"]);
    }
    Ok(())
}
