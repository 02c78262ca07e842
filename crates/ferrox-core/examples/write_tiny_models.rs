//! Writes the tiny random-weight model of every case (each architecture,
//! and the variants a row allows) into DIR (`tiny-<label>.gguf`), for
//! `tools/refllama/gen.py tiny DIR`; with `--quant-ref`, the F16 model
//! llama.cpp quantizes for the per-kind reference instead
//! (`quant-ref-f16.gguf`, for `gen.py quant`).

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quant_ref = args.iter().any(|a| a == "--quant-ref");
    let dir = args.iter().find(|a| !a.starts_with("--")).ok_or("usage: write_tiny_models [--quant-ref] DIR")?;
    std::fs::create_dir_all(dir)?;
    if quant_ref {
        let path = std::path::Path::new(dir).join("quant-ref-f16.gguf");
        ferrox_core::testing::quant_ref_model(ferrox_core::testing::QUANT_REF_SEED)?.write_to(&path)?;
        println!("{}", path.display());
        return Ok(());
    }
    for case in ferrox_core::testing::tiny_cases() {
        let path = std::path::Path::new(dir).join(format!("tiny-{}.gguf", case.label));
        ferrox_core::testing::tiny_model(case, 42)?.write_to(&path)?;
        println!("{}", path.display());
    }
    Ok(())
}
