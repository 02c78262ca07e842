//! Prints the logits of every position of a token list as JSON (a debugging
//! aid for comparisons with llama.cpp): `logits MODEL 1,2,3`.
use ferrox_core::backend::{cpu::Cpu, Batch};
use ferrox_core::model::Model;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().collect();
    let model = Model::open(&args[1], Cpu::new(2))?;
    let ids: Vec<u32> = args[2].split(',').map(|s| s.trim().parse()).collect::<Result<_, _>>()?;
    let mut ctx = model.new_context(512, 1)?;
    let mut b = Batch::default();
    for (i, &t) in ids.iter().enumerate() {
        b.push(t, i as u32, 0, true);
    }
    let logits = model.forward(&mut ctx, &b)?;
    let rows: Vec<&[f32]> = logits.chunks(model.n_vocab()).collect();
    println!("{}", serde_json::to_string(&rows)?);
    Ok(())
}
