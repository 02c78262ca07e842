//! The `ferrox` command line. Subcommands are thin: each parses its
//! arguments, calls the library, and prints.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

mod bench;
mod chat;
mod info;
mod kernels;
mod load;
mod perplexity;
mod quantize;
mod run;
mod serve;
mod tokenize;

#[derive(Parser)]
#[command(name = "ferrox", version, about = "Run quantized LLMs from GGUF files")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a model's metadata, tensor table and per-kind totals (like gguf-dump).
    Info(info::Args),
    /// Re-quantize every matrix of a model to one kind.
    Quantize(quantize::Args),
    /// Print the token ids of a text (like llama-tokenize).
    Tokenize(tokenize::Args),
    /// Generate a continuation of a prompt, streamed.
    Run(run::Args),
    /// Talk to a model, multi-turn, with its chat template.
    Chat(chat::Args),
    /// Where every weight is placed and which kernel runs for it.
    Kernels(kernels::Args),
    /// Prompt and generation throughput, like llama-bench.
    Bench(bench::Args),
    /// Perplexity of a text (and KL divergence from a base run), like llama-perplexity.
    Perplexity(perplexity::Args),
    /// An OpenAI-compatible HTTP server with continuous batching.
    Serve(serve::Args),
}

/// The model path, given either as the first positional argument or as `-m`.
pub(crate) fn model_path(positional: Option<PathBuf>, flag: Option<PathBuf>) -> Result<PathBuf> {
    match (positional, flag) {
        (Some(p), None) | (None, Some(p)) => Ok(p),
        (Some(a), Some(b)) => bail!(
            "two models given ({} and -m {}); give one",
            a.display(),
            b.display()
        ),
        (None, None) => bail!("no model given: pass MODEL or -m MODEL"),
    }
}

/// Opens a (possibly split) model with the path in the error.
pub(crate) fn open_model(path: &std::path::Path) -> Result<ferrox_gguf::GgufModel> {
    ferrox_gguf::GgufModel::open(path)
        .with_context(|| format!("cannot load model {}", path.display()))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Info(a) => info::run(a),
        Command::Quantize(a) => quantize::run(a),
        Command::Tokenize(a) => tokenize::run(a),
        Command::Run(a) => run::run(a),
        Command::Chat(a) => chat::run(a),
        Command::Kernels(a) => kernels::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Perplexity(a) => perplexity::run(a),
        Command::Serve(a) => serve::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ferrox: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
