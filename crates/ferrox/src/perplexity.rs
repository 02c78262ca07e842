//! `ferrox perplexity -m MODEL -f TEXT -c 512`: llama-perplexity's measure,
//! printed as it prints it (`[i]ppl,` per chunk, then `Final estimate`), so
//! the two outputs can be compared line for line.
//!
//! With `--kl-divergence-base FILE` alone the run also saves its top-k
//! log-probabilities to FILE; with `--kl-divergence` too it reads FILE
//! instead, evaluates the tokens stored there (no text needed) and reports
//! the KL divergence from that base and how often the top token agrees.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ferrox_core::backend::DeviceBackend;
use ferrox_core::model::Model;
use ferrox_core::perplexity::{
    evaluate, BaseHeader, BaseLogitsReader, BaseLogitsWriter, KlStats, NllStats, PerplexityError,
    PerplexityOptions,
};
use ferrox_core::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: crate::load::ModelArg,
    /// The text to score.
    #[arg(short = 'f', long = "file")]
    file: Option<PathBuf>,
    /// Tokens per chunk; the second half of each is scored.
    #[arg(short = 'c', long = "ctx-size", default_value_t = 512)]
    ctx_size: usize,
    /// Tokens per forward pass.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
    /// Evaluate at most this many chunks.
    #[arg(long)]
    chunks: Option<usize>,
    #[command(flatten)]
    backend: crate::load::BackendArgs,
    /// Base log-probabilities: written by a plain run, read with --kl-divergence.
    #[arg(long = "kl-divergence-base")]
    kl_base: Option<PathBuf>,
    /// Compare with the base in --kl-divergence-base instead of scoring a text.
    #[arg(long = "kl-divergence", requires = "kl_base")]
    kl: bool,
    /// Log-probabilities kept per position in a base file.
    #[arg(long = "kl-top-k", default_value_t = 32)]
    kl_top_k: usize,
}

pub fn run(a: Args) -> Result<()> {
    if a.ctx_size == 0 {
        bail!("the context size (-c) must be positive");
    }
    if a.kl {
        return run_kl(a);
    }
    let Some(file) = &a.file else {
        bail!("give the text to score with -f FILE")
    };
    let text =
        std::fs::read(file).with_context(|| format!("cannot read text file {}", file.display()))?;
    let (path, backend, file) = (a.model.or_default()?, a.backend.clone(), file.clone());
    crate::load::with_model(&path, &backend, false, Job::Score { a, file, text })
}

/// What `perplexity` does once the model is loaded.
enum Job {
    /// Score a text.
    Score { a: Args, file: PathBuf, text: Vec<u8> },
    /// Compare with a base run's log-probabilities.
    Compare { a: Args, base_path: PathBuf, base: BaseLogitsReader<std::io::BufReader<std::fs::File>> },
}

impl crate::load::ModelJob for Job {
    type Output = ();
    fn run<B: DeviceBackend + 'static>(self, model: Model<B>, tok: Tokenizer) -> Result<()> {
        match self {
            Job::Score { a, file, text } => score(a, &file, text, model, tok),
            Job::Compare { a, base_path, base } => compare(a, &base_path, base, model, tok),
        }
    }
}

fn score<B: DeviceBackend>(a: Args, file: &Path, text: Vec<u8>, model: Model<B>, tok: Tokenizer) -> Result<()> {
    // llama-perplexity tokenizes with BOS (when the vocabulary adds one) and
    // without parsing special tokens in the text.
    let tokens = tok
        .encode(&text, true, false)
        .with_context(|| format!("cannot tokenize {}", file.display()))?;
    let opts = PerplexityOptions {
        n_ctx: a.ctx_size,
        n_batch: a.batch_size,
        max_chunks: a.chunks,
        bos: tok.add_bos().then(|| tok.bos()).flatten(),
    };
    let n_chunk = opts.n_chunks(tokens.len())?;
    eprintln!(
        "ferrox: {} tokens; {n_chunk} chunks of {} ({} scored each)",
        tokens.len(),
        opts.n_ctx,
        opts.scored_per_chunk()
    );
    let mut writer = match &a.kl_base {
        Some(p) => {
            let f = std::fs::File::create(p)
                .with_context(|| format!("cannot create {}", p.display()))?;
            let header = BaseHeader {
                n_ctx: opts.n_ctx,
                n_vocab: model.n_vocab(),
                n_chunk,
                top_k: a.kl_top_k.clamp(1, model.n_vocab()),
                tokens: tokens[..n_chunk * opts.n_ctx].to_vec(),
            };
            Some(BaseLogitsWriter::new(std::io::BufWriter::new(f), &header)?)
        }
        None => None,
    };
    let cancel = crate::run::cancel_on_ctrl_c()?;
    let mut stats = NllStats::default();
    let mut out = std::io::stdout().lock();
    evaluate(&model, &tokens, &opts, &cancel, |s| {
        stats.add_scored(&s);
        if let Some(w) = writer.as_mut() {
            w.write_scored(&s)?;
        }
        if s.end_of_chunk {
            write!(out, "[{}]{:.4},", s.chunk + 1, stats.ppl())
                .and_then(|()| out.flush())
                .map_err(PerplexityError::Io)?;
        }
        Ok(())
    })?;
    writeln!(out)?;
    if let Some(w) = writer {
        w.finish()?;
    }
    match stats.ppl_error() {
        Some(e) => writeln!(out, "Final estimate: PPL = {:.4} +/- {:.5}", stats.ppl(), e)?,
        None => writeln!(
            out,
            "Final estimate: PPL = {:.4} (no error estimate: no spread)",
            stats.ppl()
        )?,
    }
    Ok(())
}

fn run_kl(a: Args) -> Result<()> {
    let Some(base_path) = &a.kl_base else {
        bail!("--kl-divergence needs --kl-divergence-base FILE")
    };
    let f = std::fs::File::open(base_path)
        .with_context(|| format!("cannot open base logits {}", base_path.display()))?;
    let len = f.metadata()?.len();
    let base = BaseLogitsReader::new(std::io::BufReader::new(f), len)
        .with_context(|| format!("cannot read base logits {}", base_path.display()))?;
    let (path, backend, base_path) = (a.model.or_default()?, a.backend.clone(), base_path.clone());
    crate::load::with_model(&path, &backend, false, Job::Compare { a, base_path, base })
}

fn compare<B: DeviceBackend>(
    a: Args,
    base_path: &Path,
    mut base: BaseLogitsReader<std::io::BufReader<std::fs::File>>,
    model: Model<B>,
    tok: Tokenizer,
) -> Result<()> {
    let h = base.header().clone();
    if h.n_vocab != model.n_vocab() {
        return Err(PerplexityError::BaseMismatch {
            what: "n_vocab",
            file: h.n_vocab,
            run: model.n_vocab(),
        }
        .into());
    }
    let opts = PerplexityOptions {
        n_ctx: h.n_ctx,
        n_batch: a.batch_size,
        max_chunks: Some(h.n_chunk),
        bos: tok.add_bos().then(|| tok.bos()).flatten(),
    };
    eprintln!(
        "ferrox: comparing with {} ({} chunks of {}, top-{})",
        base_path.display(),
        h.n_chunk,
        h.n_ctx,
        h.top_k
    );
    let cancel = crate::run::cancel_on_ctrl_c()?;
    let mut kl = KlStats::default();
    let mut out = std::io::stdout().lock();
    writeln!(out, "chunk        PPL   PPL(base)   mean KLD   same top")?;
    evaluate(&model, &h.tokens, &opts, &cancel, |s| {
        let n_vocab = s.logits.len() / s.targets.len();
        for (row, &t) in s.logits.chunks_exact(n_vocab).zip(s.targets) {
            kl.add(row, t, &base.next_position()?);
        }
        if s.end_of_chunk {
            writeln!(
                out,
                "{:5} {:10.4} {:11.4} {:10.6} {:9.3}%",
                s.chunk + 1,
                kl.nll.ppl(),
                kl.nll_base.ppl(),
                kl.kld.mean(),
                100.0 * kl.same_top_fraction()
            )
            .map_err(PerplexityError::Io)?;
        }
        Ok(())
    })?;
    let pm = |s: &NllStats| {
        s.mean_error()
            .map_or(String::from("n/a"), |e| format!("{e:.6}"))
    };
    writeln!(
        out,
        "Mean PPL(Q)    : {:.6} +/- {}",
        kl.nll.ppl(),
        kl.nll
            .ppl_error()
            .map_or("n/a".into(), |e| format!("{e:.6}"))
    )?;
    writeln!(out, "Mean PPL(base) : {:.6}", kl.nll_base.ppl())?;
    writeln!(
        out,
        "Mean KLD       : {:.6} +/- {} (top-{} + rest; a lower bound of the full KLD)",
        kl.kld.mean(),
        pm(&kl.kld),
        h.top_k
    )?;
    writeln!(
        out,
        "Same top p     : {:.3}%",
        100.0 * kl.same_top_fraction()
    )?;
    Ok(())
}
