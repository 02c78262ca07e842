//! Writes the tiny random-weight model of every case (each architecture,
//! and the variants a row allows) into DIR (`tiny-<label>.gguf`), for `tools/refllama/gen.py tiny DIR`.

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = std::env::args().nth(1).ok_or("usage: write_tiny_models DIR")?;
    std::fs::create_dir_all(&dir)?;
    for case in ferrox_core::testing::tiny_cases() {
        let path = std::path::Path::new(&dir).join(format!("tiny-{}.gguf", case.label));
        ferrox_core::testing::tiny_model(case, 42)?.write_to(&path)?;
        println!("{}", path.display());
    }
    Ok(())
}
