//! What a speculative verify pass costs: the median time of one forward pass
//! of `n` tokens (every row's argmax wanted) at a depth of 64, for n = 1..=7
//! — `verify_cost MODEL [REPS]`. A pass of k+1 tokens near one decode step
//! is what makes verifying k drafts pay.
use ferrox_core::backend::{cpu::Cpu, Batch};
use ferrox_core::model::Model;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let model = Model::open(&args[1], Cpu::new(0))?;
    let reps: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(15);
    let mut ctx = model.new_context(256, 1)?;
    let mut b = Batch::default();
    for i in 0..64u32 {
        b.push(1000 + i, i, 0, i == 63);
    }
    model.forward(&mut ctx, &b)?;
    for n in 1..=ferrox_core::speculative::MAX_VERIFY {
        let mut times = Vec::new();
        for _ in 0..reps {
            let mut b = Batch::default();
            for i in 0..n as u32 {
                b.push(2000 + i, 64 + i, 0, true);
            }
            let t = std::time::Instant::now();
            model.forward_argmax(&mut ctx, &b)?;
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        println!("n={n} median {:.2} ms ({:.2} ms/token)", times[reps / 2], times[reps / 2] / n as f64);
    }
    Ok(())
}
