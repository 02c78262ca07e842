//! Model loading shared by the subcommands that run a model: the default
//! model's place, a progress line, and the backend choice.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use ferrox_core::backend::{with_backend, DeviceBackend, DeviceOptions, WithBackend};
use ferrox_core::kernel_registry::Backend;
use ferrox_core::model::Model;
use ferrox_core::tokenizer::Tokenizer;
use ferrox_gguf::GgufModel;

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
    /// The model file (any part of a split model); the default model (Gemma 3 270M) when omitted.
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

    /// `run MODEL PROMPT` (ollama's order): the prompt positional where one
    /// was given; with `-m MODEL`, the one positional is the prompt.
    pub fn prompt_after_model(&mut self, prompt: Option<String>) -> Option<String> {
        if prompt.is_some() {
            return prompt;
        }
        match (&self.model, &self.model_flag) {
            (Some(_), Some(_)) => self.model.take().map(|p| p.to_string_lossy().into_owned()),
            _ => None,
        }
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

/// The backend a user named (`--backend`): any of the table's, compiled in
/// or not (opening one that is not compiled in says which feature builds it).
pub fn parse_backend(name: &str) -> Result<Backend, String> {
    Backend::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = Backend::ALL.iter().map(|b| b.name()).collect();
        format!("unknown backend {name:?} (known: {})", known.join(", "))
    })
}

/// `--n-gpu-layers`: a count of blocks, or `all`.
pub fn parse_gpu_layers(v: &str) -> Result<usize, String> {
    match v {
        "all" | "auto" => Ok(usize::MAX),
        n => n.parse().map_err(|_| format!("{n:?} is not a number of layers (or `all`)")),
    }
}

/// Where a model runs: `--backend`, `--device`, `--threads`,
/// `--n-gpu-layers` (`-ngl`). Every subcommand that runs a model flattens this.
#[derive(clap::Args, Debug, Clone)]
pub struct BackendArgs {
    /// Where the model runs: cpu, or an accelerator (cuda; a build without its
    /// feature says so). Default: cpu, or the first accelerator when
    /// --n-gpu-layers asks for layers on one.
    #[arg(long, value_parser = parse_backend)]
    pub backend: Option<Backend>,
    /// Which device of the backend (its ordinal).
    #[arg(long, default_value_t = 0)]
    pub device: usize,
    /// CPU threads (0: all cores).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// Blocks on the accelerator (llama.cpp's -ngl): the last N, the rest on
    /// the CPU, activations crossing once; `all` (the default with an
    /// accelerator) is the whole model; 0 is the CPU alone.
    #[arg(long = "n-gpu-layers", visible_alias = "gpu-layers", value_parser = parse_gpu_layers)]
    pub gpu_layers: Option<usize>,
}

impl BackendArgs {
    /// The seam's options for these flags and a model of `n_layer` blocks:
    /// the backend named (or the first accelerator where `-ngl` asks for
    /// one), the whole model on it unless fewer blocks than it has were asked
    /// for, and `-ngl 0` as the CPU.
    pub fn options(&self, n_layer: usize) -> DeviceOptions {
        let first_accelerator = Backend::ALL.iter().copied().find(|b| b.is_accelerator()).unwrap_or(Backend::Cpu);
        let backend = match (self.backend, self.gpu_layers) {
            (_, Some(0)) => Backend::Cpu,
            (Some(b), _) => b,
            (None, Some(_)) => first_accelerator,
            (None, None) => Backend::Cpu,
        };
        let gpu_layers = self.gpu_layers.filter(|&g| backend.is_accelerator() && g < n_layer);
        DeviceOptions { backend, device: self.device, threads: self.threads, gpu_layers }
    }

    /// [`BackendArgs::options`] for the model in `file` (its block count read
    /// only when a layer count was asked for).
    pub fn options_for(&self, file: &GgufModel) -> Result<DeviceOptions> {
        let n_layer = match self.gpu_layers {
            Some(g) if g > 0 && g < usize::MAX => {
                let meta = file.metadata_file();
                let arch = ferrox_core::model::arch_of(meta).context("cannot split the model by layer")?;
                ferrox_core::model::ModelConfig::from_gguf(meta, arch).context("cannot split the model by layer")?.n_layer
            }
            _ => usize::MAX,
        };
        Ok(self.options(n_layer))
    }
}

/// What a subcommand does with a loaded model, on whichever backend it was
/// loaded (the decoder is compiled once per backend).
pub trait ModelJob {
    /// What the job returns.
    type Output;
    /// Runs the job.
    fn run<B: DeviceBackend + 'static>(self, model: Model<B>, tok: Tokenizer) -> Result<Self::Output>;
    /// Checks what can be checked against the file before the weights are
    /// loaded (a vocabulary a `--logit-bias` id must be in, a context past
    /// the training one): a bad option fails in milliseconds, not after a load.
    fn check(&self, _file: &FileFacts) -> Result<()> {
        Ok(())
    }
}

/// What a model file says about itself that options are checked against,
/// read from its metadata without loading a weight.
#[derive(Debug, Clone, Copy)]
pub struct FileFacts {
    /// Tokens in the vocabulary (`None` when the file has no tokenizer; the
    /// load then fails with the tokenizer's own error).
    pub n_vocab: Option<usize>,
    /// The training context (`None` when the architecture is not one ferrox
    /// runs; the load then names it).
    pub n_ctx_train: Option<usize>,
}

impl FileFacts {
    /// The facts of `file`.
    pub fn of(file: &GgufModel) -> FileFacts {
        let meta = file.metadata_file();
        let n_vocab = meta.get_array("tokenizer.ggml.tokens").ok().map(|a| a.len());
        let n_ctx_train = ferrox_core::model::arch_of(meta)
            .ok()
            .and_then(|arch| ferrox_core::model::ModelConfig::from_gguf(meta, arch).ok())
            .map(|c| c.n_ctx_train);
        FileFacts { n_vocab, n_ctx_train }
    }
}

/// `-c`/`--ctx-size` as llama.cpp reads it: 0 is the model's training
/// context; a negative size is refused before anything is loaded.
pub fn parse_ctx_size(v: &str) -> Result<usize, String> {
    v.parse::<i64>()
        .ok()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("{v:?} is not a context size (a count of positions; 0: the model's training context)"))
}

/// Warns about `-t` above the cores this process may use: the extra
/// threads only take turns on the same cores (slower, not faster).
pub fn warn_threads(threads: usize) {
    if let Ok(cores) = std::thread::available_parallelism() {
        if threads > cores.get() {
            eprintln!("ferrox: warning: -t {threads} is more threads than the {cores} cores this process may use; they will take turns (0: all cores)");
        }
    }
}

/// Warns, before the load, about a `-c` past the training context (llama.cpp
/// warns the same: positions past it are outside what the model learned).
pub fn warn_ctx(flag: Option<usize>, facts: &FileFacts) {
    if let (Some(c), Some(train)) = (flag, facts.n_ctx_train) {
        if c > train {
            eprintln!("ferrox: warning: -c {c} is past the model's training context ({train}); text past {train} positions may be incoherent");
        }
    }
}

/// Opens the backend `b` names, loads `path` on it and runs `job`: the one
/// place a subcommand reaches a backend (the choice is the seam's generated
/// `with_backend`, so no subcommand has an arm per backend).
pub fn with_model<J: ModelJob>(path: &Path, b: &BackendArgs, quiet: bool, job: J) -> Result<J::Output> {
    struct Load<'a, J> {
        path: &'a Path,
        file: Arc<GgufModel>,
        quiet: bool,
        job: J,
    }
    impl<J: ModelJob> WithBackend for Load<'_, J> {
        type Output = Result<J::Output>;
        fn run<B: DeviceBackend + 'static>(self, backend: B) -> Result<J::Output> {
            let (model, tok) = load_on(self.path, self.file, backend, self.quiet)?;
            self.job.run(model, tok)
        }
    }
    warn_threads(b.threads);
    let file = Arc::new(crate::open_model(path)?);
    job.check(&FileFacts::of(&file))?;
    with_backend(&b.options_for(&file)?, Load { path, file, quiet, job })?
}

/// The model in `file` (opened from `path`) loaded on `backend` with its
/// tokenizer, reporting progress on stderr.
pub fn load_on<B: DeviceBackend>(
    path: &Path,
    file: Arc<GgufModel>,
    backend: B,
    quiet: bool,
) -> Result<(Model<B>, Tokenizer)> {
    let t0 = Instant::now();
    // A bar on a terminal, where a large model's load takes a while; piped,
    // the plain line alone (no carriage returns in a log).
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let style = indicatif::ProgressStyle::with_template("ferrox: loading {msg} {bar:30} {bytes}/{total_bytes}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar());
        // The file name: a full path would wrap the bar on a narrow terminal.
        let name = path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        indicatif::ProgressBar::new(0).with_style(style).with_message(name)
    });
    if !quiet && bar.is_none() {
        eprint!("ferrox: loading {} ... ", path.display());
    }
    let progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let loaded = Model::load_with_progress(file, backend, &progress)
        .with_context(|| format!("cannot load model {}", path.display()))
        .and_then(|model| {
            let tok = Tokenizer::from_gguf(model.file().metadata_file())
                .with_context(|| format!("cannot read the tokenizer of {}", path.display()))?;
            Ok((model, tok))
        });
    if let Some(b) = &bar {
        b.finish_and_clear();
        eprint!("ferrox: loading {} ... ", path.display());
    }
    let (model, tok) = match loaded {
        Ok(l) => l,
        Err(e) => {
            // The progress line is ended, so the error is a line of its own.
            if !quiet {
                eprintln!("failed");
            }
            return Err(e);
        }
    };
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

/// The context size: the flag, 0 as the model's training context (as
/// llama.cpp reads `-c 0`), else the training context capped at 4096.
pub fn context_size<B: DeviceBackend>(flag: Option<usize>, model: &Model<B>) -> usize {
    let train = model.config().n_ctx_train.max(1);
    match flag {
        Some(0) => train,
        Some(c) => c,
        None => train.min(4096),
    }
}
