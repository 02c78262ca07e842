//! Speculative decoding: a cheap drafter proposes the next tokens, and the
//! target model checks them all in one forward pass.
//!
//! The decision: the output is the target's, exactly. A step evaluates the
//! token just chosen and the `k` drafted after it as one batch, every row's
//! logits kept; row `i` is the target's distribution after draft `i`, so
//! each draft is checked with the very sampler plain decoding uses
//! ([`Sampler::verify`]): greedy keeps a draft only when it is the argmax,
//! sampling keeps it with the target's probability and otherwise draws from
//! the rest (rejection sampling with a point-mass proposal, which preserves
//! the target's distribution). The first rejected draft ends the step: its
//! replacement, or after `k` accepted drafts the next token, is the target's
//! own. Drafters propose with certainty (a draft model's argmax, or tokens
//! copied from the context), which is what makes that rule exact.
//!
//! Rolling back is free: a cache row is written at its token's position and
//! attention reads only positions up to each token's own, so the rows of
//! rejected drafts are garbage past the session's history that the next
//! step overwrites (a test holds the caches to that). The draft model keeps
//! its own history and re-evaluates from the first token where it and the
//! target's differ.
//!
//! Greedy output is bit-identical to plain decoding only when the target's
//! kernels give every row of a small batch the bits a single-token pass
//! gives: true on the CPU below [`ferrox_quant::gemm::MIN_BATCH`] tokens
//! (the per-row dot kernels run per token; the GEMM, which sums in another
//! order, starts there). A step therefore verifies at most
//! [`MAX_VERIFY`] tokens.

use std::time::{Duration, Instant};

use crate::backend::{Batch, DeviceBackend};
use crate::generate::{GenerateError, Session};
use crate::model::{Context, Model, ModelError};
use crate::sampling::{Sampled, Sampler};
use crate::tokenizer::Tokenizer;

/// Most tokens one verify pass evaluates (the chosen token and its drafts):
/// below the CPU GEMM's smallest batch, so every row takes the kernels a
/// single-token decode step takes, bit for bit.
pub const MAX_VERIFY: usize = ferrox_quant::gemm::MIN_BATCH - 1;

/// The most drafts a step verifies.
pub const MAX_DRAFT: usize = MAX_VERIFY - 1;

/// Proposes tokens that may continue a sequence.
pub trait Drafter {
    /// Appends to `out` up to `max` tokens that may follow `context` (every
    /// token of the sequence so far, the prompt included).
    fn draft(&mut self, context: &[u32], max: usize, out: &mut Vec<u32>) -> Result<(), GenerateError>;
}

/// How many tokens to draft per step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftParams {
    /// At most this many drafts per step (capped at [`MAX_DRAFT`]).
    pub max: usize,
    /// Fewer drafts than this are not verified (the step is a plain one).
    pub min: usize,
}

impl DraftParams {
    /// Whether the sizes can be served: at most [`MAX_DRAFT`] drafts, and
    /// a fewest no larger than the most.
    pub fn is_valid(&self) -> bool {
        self.max <= MAX_DRAFT && self.min <= self.max
    }
}

/// A drafter and how much to draft, for one generation.
pub struct Speculation<'d> {
    /// The drafter.
    pub drafter: &'d mut dyn Drafter,
    /// Draft sizes.
    pub params: DraftParams,
}

/// What speculation did in one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SpecStats {
    /// Target forward passes during decode.
    pub target_passes: usize,
    /// Tokens drafted and verified.
    pub drafted: usize,
    /// Drafts the target kept.
    pub accepted: usize,
    /// Time spent drafting.
    pub draft_time: Duration,
    /// Time spent in the target's verify passes (and their sampling).
    pub verify_time: Duration,
}

impl SpecStats {
    /// Accepted over drafted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }

    /// Tokens decided per target pass: each pass yields its accepted drafts
    /// and one token of the target's own.
    pub fn tokens_per_pass(&self) -> f64 {
        if self.target_passes == 0 {
            0.0
        } else {
            (self.accepted + self.target_passes) as f64 / self.target_passes as f64
        }
    }

    /// Adds another generation's counts.
    pub fn add(&mut self, o: &SpecStats) {
        self.target_passes += o.target_passes;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.draft_time += o.draft_time;
        self.verify_time += o.verify_time;
    }
}

/// One speculative step's inputs from the generation loop.
pub(crate) struct Step {
    /// The token just chosen (emitted, not yet in the cache).
    pub token: u32,
    /// Tokens the generation may still emit, this one included.
    pub budget: usize,
    /// Plain greedy without logprobs: the target's argmax taken on the backend.
    pub device_greedy: bool,
}

/// Evaluates `step.token` and the drafts proposed after it in one target
/// pass, pushes the accepted drafts (in the cache) and the target's next
/// token (not) onto `ready`, and extends the session's history by what the
/// cache now validly holds.
pub(crate) fn step<B: DeviceBackend>(
    s: &mut Session<'_, B>,
    spec: &mut Speculation<'_>,
    step: &Step,
    sampler: &mut Sampler,
    logits: &mut Vec<f32>,
    ready: &mut std::collections::VecDeque<(Sampled, bool)>,
    stats: &mut SpecStats,
) -> Result<(), GenerateError> {
    let n = s.history.len();
    // The drafts' positions must fit the context, and no more are useful
    // than the generation may still emit.
    let room = s.ctx.n_ctx().saturating_sub(n + 1);
    let k_max = spec.params.max.min(MAX_DRAFT).min(room).min(step.budget);
    s.history.push(step.token);
    let mut drafts = Vec::with_capacity(k_max);
    if k_max > 0 && k_max >= spec.params.min {
        let t = Instant::now();
        spec.drafter.draft(&s.history, k_max, &mut drafts)?;
        drafts.truncate(k_max);
        stats.draft_time += t.elapsed();
        if drafts.len() < spec.params.min {
            drafts.clear();
        }
    }
    let t = Instant::now();
    let k = drafts.len();
    let mut b = Batch::default();
    b.push(step.token, n as u32, 0, true);
    for (i, &d) in drafts.iter().enumerate() {
        b.push(d, (n + 1 + i) as u32, 0, true);
    }
    // Validate before the pass so a bad draft is a clear error, not a batch one.
    if let Some(&d) = drafts.iter().find(|&&d| d as usize >= s.model.n_vocab()) {
        s.history.truncate(n);
        return Err(GenerateError::Model(ModelError::Batch(format!("drafted token {d} is outside the target's vocabulary"))));
    }
    let mut accepted = 0;
    if step.device_greedy {
        let ids = s.model.forward_argmax(&mut s.ctx, &b)?;
        if ids.len() != k + 1 {
            return Err(GenerateError::Model(ModelError::Batch("the verify pass returned the wrong number of tokens".into())));
        }
        while accepted < k && ids[accepted] == drafts[accepted] {
            ready.push_back((Sampled { token: drafts[accepted], logprob: f32::NAN, top: Vec::new() }, true));
            accepted += 1;
        }
        ready.push_back((Sampled { token: ids[accepted], logprob: f32::NAN, top: Vec::new() }, false));
    } else {
        s.model.forward_into(&mut s.ctx, &b, logits)?;
        let v = s.model.n_vocab();
        // The sampler's penalty window sees each row's own history.
        s.history.extend_from_slice(&drafts);
        let mut done = false;
        for (i, row) in logits.chunks_exact_mut(v).enumerate() {
            let hist = &s.history[..n + 1 + i];
            if i < k {
                let (t, kept) = sampler.verify(row, hist, drafts[i])?;
                ready.push_back((t, kept));
                if !kept {
                    done = true;
                    break;
                }
                accepted += 1;
            } else {
                ready.push_back((sampler.sample(row, hist)?, false));
                done = true;
            }
        }
        if !done {
            return Err(GenerateError::Model(ModelError::Batch("the verify pass returned too few rows".into())));
        }
    }
    // The cache holds the token and the accepted drafts; later rows are
    // overwritten by the next pass.
    s.history.truncate(n + 1);
    s.history.extend_from_slice(&drafts[..accepted]);
    stats.target_passes += 1;
    stats.drafted += k;
    stats.accepted += accepted;
    stats.verify_time += t.elapsed();
    Ok(())
}

/// Why a draft model cannot draft for a target.
#[derive(Debug, thiserror::Error)]
pub enum DraftError {
    /// The two vocabularies differ in size.
    #[error("the draft model's vocabulary has {draft} tokens but the target's has {target}; speculative decoding needs one tokenizer")]
    VocabSize {
        /// Target tokens.
        target: usize,
        /// Draft tokens.
        draft: usize,
    },
    /// A token's text differs.
    #[error("token {id} is {target:?} in the target's vocabulary but {draft:?} in the draft's; speculative decoding needs one tokenizer")]
    TokenText {
        /// The first differing id.
        id: u32,
        /// Its text in the target.
        target: String,
        /// Its text in the draft.
        draft: String,
    },
    /// The embedding matrices disagree with the vocabularies (the logits
    /// would not line up).
    #[error("the draft model has {draft} logits but the target {target}")]
    Logits {
        /// Target logits.
        target: usize,
        /// Draft logits.
        draft: usize,
    },
}

/// Refuses a draft whose vocabulary is not the target's: the token count
/// and every token's text must agree (llama.cpp's speculative compares the
/// same), or a drafted id would mean another token to the target.
pub fn check_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<(), DraftError> {
    let (nt, nd) = (target.n_vocab(), draft.n_vocab());
    if nt != nd {
        return Err(DraftError::VocabSize { target: nt, draft: nd });
    }
    for id in 0..nt as u32 {
        let (a, b) = (target.token_text(id), draft.token_text(id));
        if a != b {
            return Err(DraftError::TokenText {
                id,
                target: String::from_utf8_lossy(a.unwrap_or_default()).into_owned(),
                draft: String::from_utf8_lossy(b.unwrap_or_default()).into_owned(),
            });
        }
    }
    Ok(())
}

/// A smaller model sharing the target's tokenizer, drafting greedily.
pub struct DraftModel<'m, D: DeviceBackend> {
    model: &'m Model<D>,
    ctx: Context<D>,
    history: Vec<u32>,
    logits: Vec<f32>,
    p_min: f32,
    n_batch: usize,
}

impl<'m, D: DeviceBackend> DraftModel<'m, D> {
    /// A drafter on `model` for sequences of up to `n_ctx` tokens; drafting
    /// stops at a token whose draft probability is below `p_min` (0: never;
    /// llama.cpp's `--draft-p-min`).
    pub fn new(model: &'m Model<D>, n_ctx: usize, p_min: f32) -> Result<Self, GenerateError> {
        Ok(DraftModel { model, ctx: model.new_context(n_ctx, 1)?, history: Vec::new(), logits: Vec::new(), p_min, n_batch: 512 })
    }

    /// Evaluates `tokens[from..]` (the last with its output), returning the
    /// greedy next token and, when `p_min` is in use, its probability.
    fn eval(&mut self, tokens: &[u32], from: usize) -> Result<(u32, f32), GenerateError> {
        let mut out = (0, 1.0);
        for start in (from..tokens.len()).step_by(self.n_batch) {
            let end = (start + self.n_batch).min(tokens.len());
            let mut b = Batch::default();
            for (i, &t) in tokens[start..end].iter().enumerate() {
                b.push(t, (start + i) as u32, 0, start + i + 1 == tokens.len());
            }
            self.history.truncate(start);
            if end < tokens.len() {
                // A prompt chunk: no output wanted.
                self.model.forward_into(&mut self.ctx, &b, &mut self.logits)?;
            } else if self.p_min > 0.0 {
                self.model.forward_into(&mut self.ctx, &b, &mut self.logits)?;
                out = top_prob(&self.logits);
            } else {
                let ids = self.model.forward_argmax(&mut self.ctx, &b)?;
                out.0 = ids.first().copied().ok_or_else(|| ModelError::Batch("the draft pass returned no token".into()))?;
            }
            self.history.extend_from_slice(&tokens[start..end]);
        }
        Ok(out)
    }
}

/// The argmax (ties to the lowest id) and its softmax probability.
pub(crate) fn top_prob(logits: &[f32]) -> (u32, f32) {
    let mut best = (0usize, f32::NEG_INFINITY);
    for (i, &l) in logits.iter().enumerate() {
        if l > best.1 {
            best = (i, l);
        }
    }
    let sum: f64 = logits.iter().map(|&l| ((l - best.1) as f64).exp()).sum();
    (best.0 as u32, (1.0 / sum) as f32)
}

impl<D: DeviceBackend> Drafter for DraftModel<'_, D> {
    fn draft(&mut self, context: &[u32], max: usize, out: &mut Vec<u32>) -> Result<(), GenerateError> {
        if context.is_empty() || max == 0 {
            return Ok(());
        }
        // Re-evaluate from the first token where the draft's cache and the
        // sequence differ (at least the last one: its output is needed).
        let common = self.history.iter().zip(context).take_while(|(a, b)| a == b).count();
        let from = common.min(context.len() - 1);
        let mut seq = context.to_vec();
        let (mut tok, mut p) = self.eval(&seq, from)?;
        loop {
            if p < self.p_min {
                break;
            }
            out.push(tok);
            // The last draft is never evaluated here: the target does that.
            if out.len() == max || seq.len() + 1 >= self.ctx.n_ctx() {
                break;
            }
            seq.push(tok);
            (tok, p) = self.eval(&seq, seq.len() - 1)?;
        }
        Ok(())
    }
}

/// Prompt lookup: the tokens that followed the most recent earlier
/// occurrence of the sequence's last n-gram (longest n first), copied as
/// the draft. Free to run, and it pays where the output repeats its
/// context: editing code, summarizing, quoting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup {
    /// Shortest n-gram matched.
    pub ngram_min: usize,
    /// Longest n-gram matched (tried first).
    pub ngram_max: usize,
}

impl Default for Lookup {
    fn default() -> Self {
        Lookup { ngram_min: 2, ngram_max: 4 }
    }
}

impl Drafter for Lookup {
    fn draft(&mut self, context: &[u32], max: usize, out: &mut Vec<u32>) -> Result<(), GenerateError> {
        let len = context.len();
        for n in (self.ngram_min.max(1)..=self.ngram_max).rev() {
            if n >= len {
                continue;
            }
            let tail = &context[len - n..];
            // The most recent earlier occurrence with something after it.
            if let Some(at) = (0..len - n).rev().find(|&i| &context[i..i + n] == tail) {
                let from = at + n;
                out.extend_from_slice(&context[from..(from + max).min(len)]);
                return Ok(());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
