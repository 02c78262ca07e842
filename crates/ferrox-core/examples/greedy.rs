//! Greedy continuation of a prompt, printing ids: a smoke check of the decoder.
use ferrox_core::backend::{cpu::Cpu, Batch};
use ferrox_core::model::Model;
use ferrox_core::tokenizer::Tokenizer;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = Model::open(&args[1], Cpu::new(2))?;
    let tok = Tokenizer::from_gguf(model.file().metadata_file())?;
    let ids = tok.encode(args[2].as_bytes(), true, true)?;
    let n: usize = args.get(3).map(|s| s.parse().unwrap()).unwrap_or(16);
    let mut ctx = model.new_context(1024, 1)?;
    let mut b = Batch::default();
    for (i, &t) in ids.iter().enumerate() {
        b.push(t, i as u32, 0, i + 1 == ids.len());
    }
    let t0 = std::time::Instant::now();
    let mut logits = model.forward(&mut ctx, &b)?;
    let tp = t0.elapsed();
    let mut out = Vec::new();
    let t1 = std::time::Instant::now();
    for step in 0..n {
        let (best, _) = logits.iter().enumerate().fold((0, f32::NEG_INFINITY), |a, (i, &v)| if v > a.1 { (i, v) } else { a });
        out.push(best as u32);
        let mut b = Batch::default();
        b.push(best as u32, (ids.len() + step) as u32, 0, true);
        logits = model.forward(&mut ctx, &b)?;
    }
    let td = t1.elapsed();
    println!("prompt {:?}", ids);
    println!("ids {:?}", out);
    println!("text {:?}", String::from_utf8_lossy(&tok.decode(&out, false)?));
    eprintln!("prefill {} tok in {:?} ({:.1} t/s); decode {} tok in {:?} ({:.1} t/s)", ids.len(), tp, ids.len() as f64 / tp.as_secs_f64(), n, td, n as f64 / td.as_secs_f64());
    Ok(())
}
