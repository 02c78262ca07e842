//! Speculative decoding flags (`run`, `bench`, `serve`): a draft model
//! (llama.cpp's `-md`/`--model-draft`, `--draft-max`, `--draft-min`,
//! `--draft-p-min`) or prompt lookup (`--lookup`), and the drafter they make.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use ferrox_core::backend::DeviceBackend;
use ferrox_core::model::Model;
use ferrox_core::speculative::{DraftModel, DraftParams, Drafter, Lookup, SpecStats, MAX_DRAFT};
use ferrox_core::tokenizer::Tokenizer;

/// The speculative decoding flags.
#[derive(clap::Args, Debug, Clone)]
pub struct SpecArgs {
    /// Draft model for speculative decoding (llama.cpp's -md): a smaller
    /// model with the target's tokenizer; the output stays the target's.
    #[arg(long = "model-draft", visible_alias = "spec-draft-model", conflicts_with = "lookup")]
    pub model_draft: Option<PathBuf>,
    /// Most tokens drafted per target pass (at most 6: a verify pass stays
    /// below the CPU GEMM's batch, so its rows are bit-identical to decode).
    #[arg(long = "draft-max", visible_alias = "spec-draft-n-max", default_value_t = 4)]
    pub draft_max: usize,
    /// Fewer drafts than this are not verified (the step decodes one token).
    #[arg(long = "draft-min", visible_alias = "spec-draft-n-min", default_value_t = 0)]
    pub draft_min: usize,
    /// A draft model stops drafting at a token it gives less than this
    /// probability (0: never).
    #[arg(long = "draft-p-min", visible_alias = "spec-draft-p-min", default_value_t = 0.0)]
    pub draft_p_min: f32,
    /// The draft model's head computes logits for only the first N tokens of
    /// the vocabulary (ranked by frequency in SentencePiece and BPE
    /// vocabularies), so drafting costs less; 0: the whole vocabulary. The
    /// target still verifies over its whole vocabulary.
    #[arg(long = "draft-vocab", default_value_t = 0)]
    pub draft_vocab: usize,
    /// Prompt lookup decoding: draft the tokens that followed the latest
    /// earlier occurrence of the text's last n-gram (no draft model; pays
    /// when the output repeats the prompt, as in editing).
    #[arg(long)]
    pub lookup: bool,
    /// Shortest n-gram prompt lookup matches.
    #[arg(long = "lookup-ngram-min", default_value_t = 2, requires = "lookup")]
    pub lookup_ngram_min: usize,
    /// Longest n-gram prompt lookup matches (tried first).
    #[arg(long = "lookup-ngram-max", default_value_t = 4, requires = "lookup")]
    pub lookup_ngram_max: usize,
}

impl SpecArgs {
    /// Whether any speculation was asked for.
    pub fn active(&self) -> bool {
        self.model_draft.is_some() || self.lookup
    }

    /// The draft sizes, checked.
    pub fn params(&self) -> Result<DraftParams> {
        if self.draft_max == 0 || self.draft_max > MAX_DRAFT {
            bail!("--draft-max {} is outside 1..={MAX_DRAFT}", self.draft_max);
        }
        if self.draft_min > self.draft_max {
            bail!("--draft-min {} is above --draft-max {}", self.draft_min, self.draft_max);
        }
        if !(0.0..=1.0).contains(&self.draft_p_min) {
            bail!("--draft-p-min {} is outside 0..=1", self.draft_p_min);
        }
        if self.lookup && (self.lookup_ngram_min == 0 || self.lookup_ngram_min > self.lookup_ngram_max) {
            bail!(
                "--lookup-ngram-min {} and --lookup-ngram-max {} must satisfy 1 <= min <= max",
                self.lookup_ngram_min,
                self.lookup_ngram_max
            );
        }
        Ok(DraftParams { max: self.draft_max, min: self.draft_min })
    }
}

/// A loaded drafter: the draft model (loaded on the target's backend kind)
/// or the lookup.
pub enum LoadedDraft<B: DeviceBackend> {
    /// A draft model and its tokenizer.
    Model(Box<Model<B>>),
    /// Prompt lookup.
    Lookup(Lookup),
}

/// Loads what `a` asks for beside `target` (None when nothing was asked):
/// the draft model on a backend opened as the target's was, refused when
/// its vocabulary is not the target's.
pub fn load<B: DeviceBackend>(
    a: &SpecArgs,
    backend: &crate::load::BackendArgs,
    target: (&Tokenizer, usize),
    quiet: bool,
) -> Result<Option<LoadedDraft<B>>> {
    a.params()?;
    if a.lookup {
        return Ok(Some(LoadedDraft::Lookup(Lookup { ngram_min: a.lookup_ngram_min, ngram_max: a.lookup_ngram_max })));
    }
    let Some(path) = &a.model_draft else { return Ok(None) };
    let file = Arc::new(crate::open_model(path)?);
    let be = B::open(&backend.options_for(&file)?).context("cannot open the backend for the draft model")?;
    let (mut model, tok) = crate::load::load_on(path, file, be, quiet)?;
    ferrox_core::speculative::check_vocab(target.0, &tok)
        .with_context(|| format!("cannot draft with {}", path.display()))?;
    if model.n_vocab() != target.1 {
        bail!("cannot draft with {}: it has {} logits per token, the target {}", path.display(), model.n_vocab(), target.1);
    }
    model.trim_head(a.draft_vocab).with_context(|| format!("cannot trim the head of {}", path.display()))?;
    Ok(Some(LoadedDraft::Model(Box::new(model))))
}

impl<B: DeviceBackend> LoadedDraft<B> {
    /// A fresh drafter for sequences of up to `n_ctx` tokens.
    pub fn drafter<'a>(&'a self, a: &SpecArgs, n_ctx: usize) -> Result<Box<dyn Drafter + 'a>> {
        Ok(match self {
            LoadedDraft::Model(m) => Box::new(DraftModel::new(m, n_ctx, a.draft_p_min)?),
            LoadedDraft::Lookup(l) => Box::new(*l),
        })
    }
}

/// One line of speculative counts, for `-v`.
pub fn summary(s: &SpecStats) -> String {
    format!(
        "speculative: {} drafted, {} accepted ({:.1}%), {} target passes ({:.2} tokens/pass); drafting {:.3}s, verifying {:.3}s",
        s.drafted,
        s.accepted,
        100.0 * s.acceptance(),
        s.target_passes,
        s.tokens_per_pass(),
        s.draft_time.as_secs_f64(),
        s.verify_time.as_secs_f64()
    )
}
