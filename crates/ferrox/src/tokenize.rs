//! `ferrox tokenize [MODEL] [TEXT]`: the model's token ids for a text, the
//! same ids llama.cpp's `llama-tokenize` prints. The text comes as `run`
//! takes its prompt (positional, `-p`, `-f FILE`, `-f -`), or from stdin when
//! none is given and stdin is not a terminal; the model, as `run` finds it.

use std::io::{IsTerminal, Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use ferrox_core::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    /// The model file, then the text (with -m, the only positional is the
    /// text); the default model (Gemma 3 270M) when omitted.
    #[arg(num_args = 0..=2, value_name = "MODEL TEXT")]
    positional: Vec<String>,
    /// The model file (instead of the first positional argument).
    #[arg(short = 'm', long = "model")]
    model_flag: Option<PathBuf>,
    /// The text (instead of the positional TEXT).
    #[arg(short = 'p', long = "prompt")]
    prompt: Option<String>,
    /// Read the text from a file (`-` for stdin).
    #[arg(short = 'f', long = "file", conflicts_with = "prompt")]
    file: Option<PathBuf>,
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

fn read_stdin() -> Result<String> {
    let mut s = String::new();
    std::io::stdin().read_to_string(&mut s).context("cannot read the text from stdin")?;
    Ok(s)
}

pub fn run(a: Args) -> Result<()> {
    let flagged = a.prompt.is_some() || a.file.is_some();
    // The positionals are [MODEL] [TEXT]; with -m or -p/-f, one fewer.
    let (model, text) = match (a.positional.as_slice(), &a.model_flag, flagged) {
        ([], m, _) => (m.clone(), None),
        ([x], None, _) => (Some(PathBuf::from(x)), None),
        ([t], Some(m), false) => (Some(m.clone()), Some(t.clone())),
        ([m, t], None, false) => (Some(PathBuf::from(m)), Some(t.clone())),
        ([m, _], Some(f), _) => bail!("two models given ({m} and -m {}); give one", f.display()),
        _ => bail!("the text given twice (a positional TEXT and -p/-f); give one"),
    };
    let path = crate::load::resolve_model(model, None)?;
    let model = crate::open_model(&path)?;
    let text = match (text, a.prompt.clone(), &a.file) {
        (Some(t), None, None) | (None, Some(t), None) => t,
        (None, None, Some(f)) if f.as_os_str() == "-" => read_stdin()?,
        (None, None, Some(f)) => std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
        (None, None, None) if !std::io::stdin().is_terminal() => read_stdin()?,
        _ => bail!("give the text: ferrox tokenize [MODEL] TEXT, -p TEXT, -f FILE, or on stdin"),
    };
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
