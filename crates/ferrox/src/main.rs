//! The `ferrox` command line. Subcommands are thin: each parses its
//! arguments, calls the library, and prints.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};

mod bench;
mod chat;
mod compat;
mod info;
mod kernels;
mod load;
mod perplexity;
mod quantize;
mod run;
mod serve;
mod speculative;
mod tokenize;

/// The environment variables a release build reads, for `--help`: the
/// same list as `docs/dev/configuration.md` (`tests/tidy.rs` holds the two,
/// and the sources, together). Measuring knobs are read only by a build
/// with `--features measure`.
const ENVIRONMENT: &str = "\
Environment (a value a variable does not take is an error, never a default):
  FERROX_MODEL        the default model file (else ~/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf)
  FERROX_API_KEY      serve: the API key, as --api-key
  FERROX_CPU_ISA      the CPU kernels' level, lowered: scalar, avx2, avx512, amx or neon (one this CPU has)
  FERROX_CPU_PREPACK  0: no unpacked copy of the layer matrices for the AMX GEMM (less memory, slower prompts); 1 (default)
  FERROX_AMX_GEMM     int8: 8-bit activations in every AMX product; bf16 (default): batches of 64+ in bf16
  FERROX_CUDA         (--features cuda) 0, off or cpu: never open the GPU; 1, on or cuda; auto (default)
  FERROX_CUDA_CACHE   (--features cuda) where compiled kernels are cached (default ~/.cache/ferrox/cuda)
  FERROX_VULKAN       (--features vulkan) 0, off or cpu: never open a Vulkan device; 1, on or vulkan; auto (default)
  FERROX_VULKAN_DEVICE (--features vulkan) the Vulkan device whose name contains this (lavapipe: llvmpipe; a CPU device only so)
  FERROX_METAL        (--features metal) 0, off or cpu: never open Metal; 1, on or metal; auto (default); shim: the kernels as C++ (not on Apple)
See docs/dev/configuration.md.";

#[derive(Parser)]
#[command(name = "ferrox", version, about = "Run quantized LLMs from GGUF files", after_help = ENVIRONMENT)]
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
    #[command(after_help = compat::HELP)]
    Run(run::Args),
    /// Talk to a model, multi-turn, with its chat template.
    #[command(after_help = compat::HELP)]
    Chat(chat::Args),
    /// Where every weight is placed and which kernel runs for it.
    Kernels(kernels::Args),
    /// Prompt and generation throughput, like llama-bench.
    Bench(bench::Args),
    /// Perplexity of a text (and KL divergence from a base run), like llama-perplexity.
    Perplexity(perplexity::Args),
    /// An OpenAI-compatible HTTP server with continuous batching.
    #[command(after_help = compat::HELP)]
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

/// Opens a (possibly split) model. Each failure is one message naming the
/// file once: a missing file, a directory, an empty file, or the reader's
/// error (which names the file itself, so its I/O cause is not repeated).
pub(crate) fn open_model(path: &std::path::Path) -> Result<ferrox_gguf::GgufModel> {
    let p = path.display();
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!("cannot load model {p}: no such file"),
        Err(e) => bail!("cannot load model {p}: {e}"),
        Ok(m) if m.is_dir() => bail!("cannot load model {p}: it is a directory; give a .gguf file"),
        Ok(m) if m.len() == 0 => bail!("cannot load model {p}: the file is empty (0 bytes), not a GGUF file"),
        Ok(_) => {}
    }
    ferrox_gguf::GgufModel::open(path).map_err(|e| anyhow::anyhow!("cannot load model {e}"))
}

fn main() -> ExitCode {
    let args = std::env::args_os().map(|a| match compat::SINGLE_DASH.iter().find(|(l, _)| a.to_str() == Some(l)) {
        Some((_, ours)) => (*ours).into(),
        None => a,
    });
    let cli = Cli::parse_from(args);
    // Every FERROX_* variable checked before any command runs, so a bad value
    // is this error and never a kernel's panic or a silent default.
    if let Err(e) = ferrox_core::backend::check_env() {
        eprintln!("ferrox: error: {e}");
        return ExitCode::FAILURE;
    }
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
        // A reader that stopped reading (`ferrox kernels M | head`): done,
        // quietly, as Unix tools end.
        Err(e) if e.chain().any(|c| c.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)) => {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("ferrox: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
