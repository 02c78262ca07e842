//! Model loading shared by the subcommands that run a model: the default
//! model's place, a progress line, and the backend choice.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ferrox_core::backend::cpu::Cpu;
use ferrox_core::backend::DeviceBackend;
use ferrox_core::kernel_registry::Backend;
use ferrox_core::model::Model;
use ferrox_core::tokenizer::Tokenizer;

/// The default model's file name (Gemma 3 270M, Q4_K_M).
pub const DEFAULT_MODEL_FILE: &str = "gemma-3-270m-q4_k_m.gguf";

/// Where the default model lives: `$FERROX_MODEL`, else
/// `$HOME/.cache/ferrox/models/…` — where `scripts/get-model.sh` puts it.
pub fn default_model_path() -> PathBuf {
    if let Some(file) = std::env::var_os("FERROX_MODEL") {
        return PathBuf::from(file);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache/ferrox/models").join(DEFAULT_MODEL_FILE)
}

/// `MODEL` as the first positional argument or as `-m MODEL` — every
/// subcommand that takes one flattens this.
#[derive(clap::Args, Debug, Clone)]
pub struct ModelArg {
    /// The model file (any part of a split model); for run/chat/bench/perplexity/kernels, the
    /// default model (Gemma 3 270M) when omitted.
    model: Option<PathBuf>,
    /// The model file (instead of the positional argument).
    #[arg(short = 'm', long = "model")]
    model_flag: Option<PathBuf>,
}

impl ModelArg {
    /// The model given, or the default model when none was.
    pub fn or_default(&self) -> Result<PathBuf> {
        resolve_model(self.model.clone(), self.model_flag.clone())
    }

    /// The model given; an error when none was.
    pub fn required(&self) -> Result<PathBuf> {
        crate::model_path(self.model.clone(), self.model_flag.clone())
    }
}

/// The model to run: the one given, or the default if it is there.
pub fn resolve_model(positional: Option<PathBuf>, flag: Option<PathBuf>) -> Result<PathBuf> {
    match (positional, flag) {
        (None, None) => {
            let p = default_model_path();
            if !p.exists() {
                bail!(
                    "no model given, and the default model (Gemma 3 270M) is not at {}.\n\
                     Get it with `scripts/get-model.sh` (from the ferrox repository), or pass MODEL / -m MODEL.",
                    p.display()
                );
            }
            eprintln!("ferrox: using the default model {}", p.display());
            Ok(p)
        }
        (p, f) => crate::model_path(p, f),
    }
}

/// The backend a user named (`--backend`); only those in this build exist.
pub fn parse_backend(name: &str) -> Result<Backend> {
    let b = Backend::from_name(name).with_context(|| {
        let known: Vec<&str> = Backend::ALL.iter().map(|b| b.name()).collect();
        format!(
            "unknown backend {name:?} (this build has: {})",
            known.join(", ")
        )
    })?;
    Ok(b)
}

/// A model loaded on the CPU with its tokenizer, reporting progress on stderr.
pub fn load_cpu(path: &Path, threads: usize, quiet: bool) -> Result<(Model<Cpu>, Tokenizer)> {
    load_on(path, Cpu::new(threads), quiet)
}

/// A model loaded on `backend` with its tokenizer, reporting progress on stderr.
pub fn load_on<B: DeviceBackend>(
    path: &Path,
    backend: B,
    quiet: bool,
) -> Result<(Model<B>, Tokenizer)> {
    let t0 = Instant::now();
    if !quiet {
        eprint!("ferrox: loading {} ... ", path.display());
    }
    let model = Model::open(path, backend)
        .with_context(|| format!("cannot load model {}", path.display()))?;
    let tok = Tokenizer::from_gguf(model.file().metadata_file())
        .with_context(|| format!("cannot read the tokenizer of {}", path.display()))?;
    if !quiet {
        let c = model.config();
        let bytes: u64 = model.file().tensors().iter().map(|t| t.info.n_bytes).sum();
        eprintln!(
            "{} ({}, {} layers, {} MiB) in {:.2}s on {}",
            c.name.as_deref().unwrap_or("model"),
            c.arch,
            c.n_layer,
            bytes >> 20,
            t0.elapsed().as_secs_f64(),
            model.plan().device
        );
    }
    Ok((model, tok))
}

/// The context size: the flag, else the model's training context capped at 4096.
pub fn context_size<B: DeviceBackend>(flag: Option<usize>, model: &Model<B>) -> usize {
    flag.unwrap_or_else(|| model.config().n_ctx_train.clamp(1, 4096))
}
