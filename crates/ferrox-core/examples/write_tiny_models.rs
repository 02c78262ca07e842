//! Writes the tiny random-weight model of every architecture into DIR
//! (`tiny-<arch>.gguf`), for `tools/refllama/gen.py tiny DIR`.
use ferrox_core::arch::Arch;

fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let dir = std::env::args().nth(1).ok_or("usage: write_tiny_models DIR")?;
    std::fs::create_dir_all(&dir)?;
    for &a in Arch::ALL {
        let path = std::path::Path::new(&dir).join(format!("tiny-{a}.gguf"));
        ferrox_core::testing::tiny_arch_model(a, 42)?.write_to(&path)?;
        println!("{}", path.display());
    }
    Ok(())
}
