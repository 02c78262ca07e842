//! `ferrox tokenize MODEL TEXT [--ids]`: the model's token ids for a text,
//! the same ids llama.cpp's `llama-tokenize` prints.

use std::path::PathBuf;

use std::io::Write;

use anyhow::Result;
use ferrox_core::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// The model file (or give it with -m; then the only positional is TEXT).
    #[arg(num_args = 1..=2, value_name = "MODEL TEXT")]
    positional: Vec<String>,
    /// The model file (instead of the first positional argument).
    #[arg(short = 'm', long = "model")]
    model_flag: Option<PathBuf>,
    /// Print only the ids, as one `[a, b, c]` list (llama-tokenize's format).
    #[arg(long)]
    ids: bool,
    /// Do not add the BOS token the model asks for.
    #[arg(long)]
    no_bos: bool,
    /// Treat control-token text such as `<start_of_turn>` as plain text.
    #[arg(long)]
    no_parse_special: bool,
}

pub fn run(a: Args) -> Result<()> {
    let (model, text) = match (a.positional.as_slice(), a.model_flag) {
        ([m, t], None) => (PathBuf::from(m), t.clone()),
        ([t], Some(m)) => (m, t.clone()),
        ([m, _], Some(f)) => {
            anyhow::bail!("two models given ({m} and -m {}); give one", f.display())
        }
        _ => anyhow::bail!("give MODEL and TEXT (or -m MODEL TEXT)"),
    };
    let model = crate::open_model(&model)?;
    let tok = Tokenizer::from_gguf(model.metadata_file())?;
    let ids = tok.encode(text.as_bytes(), !a.no_bos, !a.no_parse_special)?;
    let mut out = std::io::stdout().lock();
    if a.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        writeln!(out, "[{}]", list.join(", "))?;
    } else {
        for id in ids {
            let piece = tok.piece(id, true)?;
            writeln!(out, "{id} '{}'", String::from_utf8_lossy(piece))?;
        }
    }
    Ok(())
}
