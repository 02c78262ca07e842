//! `ferrox run [MODEL] -p PROMPT`: stream a continuation of a prompt.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ferrox_core::backend::DeviceBackend;
use ferrox_core::generate::{FinishReason, GenerateError, GenerateOptions, Session, StreamEvent};
use ferrox_core::model::Model;
use ferrox_core::sampling::{SamplingError, SamplingParams};
use ferrox_core::tokenizer::Tokenizer;

/// Sampling flags, llama.cpp's names and defaults.
#[derive(clap::Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Temperature; 0 or below = greedy.
    #[arg(long = "temp", default_value_t = 0.8, allow_negative_numbers = true)]
    pub temp: f32,
    /// Top-k (0 = off).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Top-p (1 = off).
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    /// Min-p (0 = off).
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    /// Locally typical sampling (1 = off).
    #[arg(long = "typical", default_value_t = 1.0)]
    pub typical_p: f32,
    /// Repetition penalty (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    /// Tokens of history the penalties look at (0: none, -1: the whole context).
    #[arg(long, default_value_t = 64, allow_negative_numbers = true)]
    pub repeat_last_n: i64,
    /// Presence penalty.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Frequency penalty.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Logit bias, `ID=BIAS` (`ID=-inf` bans a token); repeatable.
    #[arg(long = "logit-bias", value_parser = parse_bias)]
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed (same seed, same output); random if not given.
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
}

fn parse_bias(s: &str) -> Result<(u32, f32), String> {
    let (id, b) = s.split_once('=').ok_or("expected ID=BIAS")?;
    let id = id
        .trim()
        .parse()
        .map_err(|e| format!("token id {id:?}: {e}"))?;
    let b = match b.trim() {
        "-inf" => f32::NEG_INFINITY,
        v => v.parse().map_err(|e| format!("bias {v:?}: {e}"))?,
    };
    Ok((id, b))
}

impl SamplingArgs {
    /// The sampler's parameters for a context of `n_ctx` positions (which
    /// `--repeat-last-n -1` means).
    pub fn params(&self, n_ctx: usize) -> SamplingParams {
        SamplingParams {
            temperature: self.temp,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            typical_p: self.typical_p,
            repeat_penalty: self.repeat_penalty,
            repeat_last_n: usize::try_from(self.repeat_last_n).unwrap_or(n_ctx),
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            logit_bias: self.logit_bias.clone(),
            seed: self.seed,
            top_logprobs: 0,
        }
    }

    /// Every sampling flag within its range, named as the user typed it;
    /// `--logit-bias` ids against `n_vocab` where the vocabulary is known.
    /// Run before the model loads, so a typo costs no load.
    pub fn check(&self, n_vocab: Option<usize>) -> Result<()> {
        if self.repeat_last_n < -1 {
            bail!("--repeat-last-n {} is out of range; allowed: 0 (off), a count of tokens, or -1 (the whole context)", self.repeat_last_n);
        }
        let n_vocab = n_vocab.unwrap_or(u32::MAX as usize + 1);
        self.params(0).validate(n_vocab).map_err(|e| anyhow::anyhow!(flag_error(e)))
    }
}

/// A sampler error in the words of the command line: the flag, not the
/// library's field name.
fn flag_error(e: SamplingError) -> String {
    match e {
        SamplingError::BadParam { field, value, allowed } => {
            let flag = match field {
                "temperature" => "temp",
                "typical_p" => "typical",
                f => f,
            };
            format!("--{} {value} is out of range; allowed: {allowed}", flag.replace('_', "-"))
        }
        SamplingError::BiasTokenOutOfRange { token, n_vocab, .. } => format!(
            "--logit-bias names token {token}, but the model's vocabulary has {n_vocab} tokens (ids 0 to {})",
            n_vocab.saturating_sub(1)
        ),
        SamplingError::BadBias { token, bias, .. } => {
            format!("--logit-bias {token}={bias}: a bias is a finite number, or -inf to ban the token")
        }
        e => e.to_string(),
    }
}

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: crate::load::ModelArg,
    /// The prompt, after the model (as `ollama run MODEL PROMPT`); or use -p / -f.
    #[arg(value_name = "PROMPT", conflicts_with_all = ["prompt", "file"])]
    prompt_arg: Option<String>,
    /// The prompt.
    #[arg(short = 'p', long)]
    prompt: Option<String>,
    /// Read the prompt from a file (`-` for stdin).
    #[arg(short = 'f', long, conflicts_with = "prompt")]
    file: Option<PathBuf>,
    /// Tokens to generate (-1: until end of text or a full context).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 256,
        allow_negative_numbers = true
    )]
    n_predict: i64,
    /// Context size (default: the model's, at most 4096; 0: the model's training context).
    #[arg(short = 'c', long = "ctx-size", value_parser = crate::load::parse_ctx_size, allow_negative_numbers = true)]
    ctx_size: Option<usize>,
    #[command(flatten)]
    backend: crate::load::BackendArgs,
    /// Stop before this string; repeatable (llama.cpp's -r/--reverse-prompt).
    #[arg(long, short = 'r', visible_alias = "reverse-prompt")]
    stop: Vec<String>,
    /// Keep generating past end-of-text tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Do not add the BOS token the model asks for.
    #[arg(long)]
    no_bos: bool,
    /// Do not echo the prompt before the continuation.
    #[arg(long, visible_alias = "no-display-prompt")]
    no_echo: bool,
    /// Print timings and why the generation ended to stderr at the end.
    #[arg(long, short = 'v')]
    verbose: bool,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    llama: crate::compat::LlamaFlags,
    #[command(flatten)]
    spec: crate::speculative::SpecArgs,
}

/// A flag set by Ctrl-C, so a generation stops cleanly with what it has.
pub fn cancel_on_ctrl_c() -> Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, Arc::clone(&flag))
        .context("cannot install the Ctrl-C handler")?;
    Ok(flag)
}

pub fn run(mut a: Args) -> Result<()> {
    // Every option is checked before a prompt is read or a model is opened.
    a.llama.check(crate::compat::Cmd::Run)?;
    a.sampling.check(None)?;
    let positional = a.model.prompt_after_model(a.prompt_arg.take());
    let prompt = match (positional, a.prompt.clone(), &a.file) {
        (Some(p), None, None) | (None, Some(p), None) => p,
        (None, None, Some(f)) if f.as_os_str() == "-" => {
            let mut p = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut p).context("cannot read the prompt from stdin")?;
            p
        }
        (None, None, Some(f)) => std::fs::read_to_string(f)
            .with_context(|| format!("cannot read prompt file {}", f.display()))?,
        _ => bail!("give a prompt: ferrox run MODEL PROMPT, -p PROMPT, or -f FILE (- for stdin)"),
    };
    let path = a.model.or_default()?;
    let backend = a.backend.clone();
    crate::load::with_model(&path, &backend, false, Generate { a, prompt })
}

/// `run`'s work once the model is loaded.
struct Generate {
    a: Args,
    prompt: String,
}

impl crate::load::ModelJob for Generate {
    type Output = ();
    fn run<B: DeviceBackend + 'static>(self, model: Model<B>, tok: Tokenizer) -> Result<()> {
        generate(self.a, self.prompt, (model, tok))
    }
    fn check(&self, file: &crate::load::FileFacts) -> Result<()> {
        self.a.sampling.check(file.n_vocab)?;
        crate::load::warn_ctx(self.a.ctx_size, file);
        Ok(())
    }
}

fn generate<B: DeviceBackend>(
    a: Args,
    prompt: String,
    (model, tok): (Model<B>, Tokenizer),
) -> Result<()> {
    let n_ctx = crate::load::context_size(a.ctx_size, &model);
    let ids = tok.encode(prompt.as_bytes(), !a.no_bos, true)?;
    // What the generation would refuse is refused before the prompt is echoed.
    if ids.len() > n_ctx {
        return Err(GenerateError::PromptTooLong { n_prompt: ids.len(), n_ctx }.into());
    }
    let mut session = Session::new(&model, &tok, n_ctx)?;
    let draft = crate::speculative::load::<B>(&a.spec, &a.backend, (&tok, model.n_vocab()), false)?;
    let mut drafter = draft.as_ref().map(|d| d.drafter(&a.spec, n_ctx)).transpose()?;
    let mut spec = match drafter.as_deref_mut() {
        Some(d) => Some(ferrox_core::speculative::Speculation { drafter: d, params: a.spec.params()? }),
        None => None,
    };
    let opts = GenerateOptions {
        max_tokens: usize::try_from(a.n_predict).ok(),
        stop: a.stop.clone(),
        sampling: a.sampling.params(n_ctx),
        ignore_eos: a.ignore_eos,
        // `run` prints text only: a plain greedy decode takes its argmax on the device.
        logprobs: false,
        ..GenerateOptions::default()
    };
    let cancel = cancel_on_ctrl_c()?;
    let mut out = std::io::stdout().lock();
    if !a.no_echo {
        write!(out, "{prompt}")?;
        out.flush()?;
    }
    let mut write_err = None;
    let done = session.generate_with(&ids, &opts, spec.as_mut(), &cancel, &mut |e| {
        let text = match e {
            StreamEvent::Token(t) => t.text.as_str(),
            StreamEvent::Tail(s) => s,
        };
        if let Err(err) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            write_err.get_or_insert(err);
        }
    });
    // The text ends its line whatever happened, so an error is a line of its own.
    let newline = writeln!(out).and_then(|()| out.flush());
    let done = done?;
    newline?;
    if let Some(e) = write_err {
        return Err(e).context("cannot write to stdout");
    }
    // An interrupted run says what it had done, as llama.cpp does.
    if a.verbose || done.finish == FinishReason::Cancelled {
        let t = done.timings;
        let n = done.tokens.len();
        eprintln!(
            "ferrox: prompt {} tokens ({} cached) in {:.3}s ({:.1} t/s); generated {n} tokens in {:.3}s ({:.1} t/s); stopped: {}",
            done.n_prompt,
            done.n_cached,
            t.prefill.as_secs_f64(),
            (done.n_prompt - done.n_cached) as f64 / t.prefill.as_secs_f64().max(1e-9),
            t.decode.as_secs_f64(),
            n as f64 / t.decode.as_secs_f64().max(1e-9),
            finish_words(done.finish, n, n_ctx)
        );
        if let Some(s) = &done.speculative {
            eprintln!("ferrox: {}", crate::speculative::summary(s));
        }
    }
    Ok(())
}

/// Why a generation ended, in words (`-v`, and after Ctrl-C).
pub fn finish_words(f: FinishReason, n_generated: usize, n_ctx: usize) -> String {
    match f {
        FinishReason::Stop => "end of text or a stop string".into(),
        FinishReason::Length => format!("the -n limit ({n_generated} tokens)"),
        FinishReason::ContextFull => format!("the context is full ({n_ctx} positions; raise -c)"),
        FinishReason::Cancelled => "interrupted (Ctrl-C)".into(),
    }
}
