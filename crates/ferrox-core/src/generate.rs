//! Generation: a session that owns one sequence's KV cache and turns
//! prompts into streamed text.
//!
//! The decision: a [`Session`] remembers the tokens its cache holds, so a
//! follow-up prompt that extends them (the next chat turn, a retried
//! request) only evaluates what is new. Stop strings are matched on the
//! decoded text, and text that could still become a stop string is held
//! back, so a streamed response never shows a stop string it then
//! retracts. Every way a generation ends is a [`FinishReason`]; running out
//! of context is one of them, not an error, once the prompt fits.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::backend::{Batch, DeviceBackend};
use crate::model::{Context, Model, ModelError};
use crate::sampling::{Sampled, Sampler, SamplingError, SamplingParams};
use crate::speculative::{SpecStats, Speculation};
use crate::tokenizer::{Detokenizer, Tokenizer, TokenizerError};

/// Why a generation could not run.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Sampling parameters or logits were unusable.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// Tokenization failed.
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    /// The prompt does not fit the context.
    #[error("the prompt is {n_prompt} tokens but the context holds {n_ctx}; shorten it or raise the context size (-c)")]
    PromptTooLong {
        /// Prompt tokens.
        n_prompt: usize,
        /// Context size.
        n_ctx: usize,
    },
    /// An empty prompt (there is nothing to condition on).
    #[error("the prompt is empty")]
    EmptyPrompt,
}

/// How a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-generation token (EOS/EOT) or a stop string.
    Stop,
    /// The token budget (`max_tokens`) ran out.
    Length,
    /// The context is full.
    ContextFull,
    /// The caller cancelled it.
    Cancelled,
}

impl FinishReason {
    /// OpenAI's name for it (`stop` / `length`; cancellation reads as stop).
    pub fn openai(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::Cancelled => "stop",
            FinishReason::Length | FinishReason::ContextFull => "length",
        }
    }
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Most tokens to generate (`None`: until a stop or a full context).
    pub max_tokens: Option<usize>,
    /// Stop strings: generation ends before the first occurrence.
    pub stop: Vec<String>,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Tokens per prefill forward pass.
    pub n_batch: usize,
    /// Whether each token's logprob is wanted. When it is not and sampling
    /// is plain greedy, decode takes the argmax on the backend
    /// ([`Model::forward_argmax`](crate::model::Model::forward_argmax)): the
    /// logits stay on the device, and those tokens report a NaN logprob.
    pub logprobs: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_tokens: Some(128),
            stop: Vec::new(),
            sampling: SamplingParams::default(),
            ignore_eos: false,
            n_batch: 512,
            logprobs: true,
        }
    }
}

/// One generated token, as streamed.
#[derive(Debug, Clone, PartialEq)]
pub struct GeneratedToken {
    /// The sample (id, logprob, top alternatives).
    pub sampled: Sampled,
    /// Text this token released (may be empty while a UTF-8 character or a
    /// possible stop string is incomplete).
    pub text: String,
}

/// What a generation streams.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StreamEvent<'a> {
    /// A token was generated.
    Token(&'a GeneratedToken),
    /// Text released at the end that no token carried (held back for a stop
    /// string that never came, or an incomplete character flushed).
    Tail(&'a str),
}

/// Wall time of the two phases.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Evaluating the (uncached part of the) prompt.
    pub prefill: Duration,
    /// Generating, from the first sampled token to the last.
    pub decode: Duration,
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// The generated tokens (including a final EOS/EOT, if any).
    pub tokens: Vec<GeneratedToken>,
    /// The generated text, stop string excluded.
    pub text: String,
    /// How it ended.
    pub finish: FinishReason,
    /// Prompt tokens.
    pub n_prompt: usize,
    /// Prompt tokens found already in the cache (not evaluated again).
    pub n_cached: usize,
    /// Phase timings.
    pub timings: Timings,
    /// Drafting and acceptance, when the generation was speculative.
    pub speculative: Option<SpecStats>,
}

/// One sequence on a model: its KV cache and the tokens the cache holds.
pub struct Session<'m, B: DeviceBackend> {
    pub(crate) model: &'m Model<B>,
    tokenizer: &'m Tokenizer,
    pub(crate) ctx: Context<B>,
    pub(crate) history: Vec<u32>,
}

/// Text held back because it may be the start of a stop string (shared
/// with the scheduler: one rule for lone and batched sequences).
pub(crate) fn held_back(text: &str, stops: &[String]) -> usize {
    let mut hold = 0;
    for s in stops {
        for k in (1..s.len()).rev() {
            if k <= hold {
                break;
            }
            if s.is_char_boundary(k) && text.ends_with(&s[..k]) {
                hold = k;
                break;
            }
        }
    }
    hold
}

impl<'m, B: DeviceBackend> Session<'m, B> {
    /// A session with a context of `n_ctx` positions.
    pub fn new(model: &'m Model<B>, tokenizer: &'m Tokenizer, n_ctx: usize) -> Result<Self, GenerateError> {
        Ok(Session { model, tokenizer, ctx: model.new_context(n_ctx, 1)?, history: Vec::new() })
    }

    /// Positions this session can hold.
    pub fn n_ctx(&self) -> usize {
        self.ctx.n_ctx()
    }

    /// The tokens the cache holds, in order.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Forgets the cached tokens (the cache is overwritten from position 0).
    pub fn reset(&mut self) {
        self.history.clear();
    }

    /// Evaluates `prompt`, reusing the longest prefix the cache already
    /// holds, and returns the logits after its last token and the number of
    /// reused tokens.
    pub fn prefill(&mut self, prompt: &[u32], n_batch: usize, cancel: &AtomicBool) -> Result<(Vec<f32>, usize), GenerateError> {
        if prompt.is_empty() {
            return Err(GenerateError::EmptyPrompt);
        }
        if prompt.len() > self.ctx.n_ctx() {
            return Err(GenerateError::PromptTooLong { n_prompt: prompt.len(), n_ctx: self.ctx.n_ctx() });
        }
        let common = self.history.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        // The last prompt token is always evaluated: its logits are needed.
        let start = common.min(prompt.len() - 1);
        self.history.truncate(start);
        let mut logits = Vec::new();
        for chunk_start in (start..prompt.len()).step_by(n_batch.max(1)) {
            if cancel.load(Ordering::Relaxed) {
                return Ok((Vec::new(), start));
            }
            let end = (chunk_start + n_batch.max(1)).min(prompt.len());
            let mut b = Batch::default();
            for (i, &t) in prompt[chunk_start..end].iter().enumerate() {
                let pos = chunk_start + i;
                b.push(t, pos as u32, 0, pos + 1 == prompt.len());
            }
            logits = self.model.forward(&mut self.ctx, &b)?;
            self.history.extend_from_slice(&prompt[chunk_start..end]);
        }
        Ok((logits, start))
    }

    /// Generates a continuation of `prompt`, calling `on_token` for every
    /// token as it is produced (then once with any [`StreamEvent::Tail`]). `cancel` is checked before every step.
    pub fn generate(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        cancel: &AtomicBool,
        on_event: &mut dyn FnMut(StreamEvent<'_>),
    ) -> Result<Completion, GenerateError> {
        self.generate_with(prompt, opts, None, cancel, on_event)
    }

    /// As [`Session::generate`], decoding speculatively when `spec` is
    /// given: each target pass verifies the tokens its drafter proposes
    /// ([`crate::speculative`]). The tokens are the ones plain decoding
    /// gives (greedy: identical; sampling: the same distribution).
    pub fn generate_with(
        &mut self,
        prompt: &[u32],
        opts: &GenerateOptions,
        mut spec: Option<&mut Speculation<'_>>,
        cancel: &AtomicBool,
        on_event: &mut dyn FnMut(StreamEvent<'_>),
    ) -> Result<Completion, GenerateError> {
        let n_vocab = self.model.n_vocab();
        let mut sampler = Sampler::new(opts.sampling.clone(), n_vocab)?;
        let t0 = Instant::now();
        let (mut logits, n_cached) = self.prefill(prompt, opts.n_batch, cancel)?;
        let prefill = t0.elapsed();
        let t1 = Instant::now();
        let mut detok = Detokenizer::new(self.tokenizer, false);
        let mut text = String::new();
        let mut emitted = 0usize;
        let mut tokens = Vec::new();
        let device_greedy = !opts.logprobs && opts.sampling.is_plain_greedy();
        let mut next: Option<u32> = None;
        // Tokens a speculative step decided: accepted drafts (already in
        // the cache: `true`) and the target's own token after them (not yet).
        let mut ready: VecDeque<(Sampled, bool)> = VecDeque::new();
        let mut stats = SpecStats::default();
        let finish = loop {
            if cancel.load(Ordering::Relaxed) {
                break FinishReason::Cancelled;
            }
            if opts.max_tokens.is_some_and(|m| tokens.len() >= m) {
                break FinishReason::Length;
            }
            let in_cache = ready.front().is_some_and(|r| r.1);
            if !in_cache && self.history.len() >= self.ctx.n_ctx() {
                break FinishReason::ContextFull;
            }
            let sampled = match (ready.pop_front(), next.take()) {
                (Some((s, _)), _) => s,
                (None, Some(token)) => Sampled { token, logprob: f32::NAN, top: Vec::new() },
                (None, None) => sampler.sample(&mut logits, &self.history)?,
            };
            let id = sampled.token;
            let eog = self.tokenizer.is_eog(id) && !opts.ignore_eos;
            if !eog {
                text.push_str(&detok.push(id)?);
            }
            let stop_at = opts.stop.iter().filter(|s| !s.is_empty()).filter_map(|s| text.find(s.as_str())).min();
            if let Some(at) = stop_at {
                text.truncate(at);
            }
            let hold = if stop_at.is_some() || eog { 0 } else { held_back(&text, &opts.stop) };
            let upto = text.len() - hold;
            let released = text.get(emitted..upto).unwrap_or("").to_string();
            emitted = upto.max(emitted);
            let g = GeneratedToken { sampled, text: released };
            on_event(StreamEvent::Token(&g));
            tokens.push(g);
            if eog || stop_at.is_some() {
                break FinishReason::Stop;
            }
            if in_cache {
                continue;
            }
            if let Some(spec) = spec.as_deref_mut() {
                // Verify drafts after the new token in one target pass.
                let budget = opts.max_tokens.map_or(usize::MAX, |m| m - tokens.len());
                let step = crate::speculative::Step { token: id, budget, device_greedy };
                crate::speculative::step(self, spec, &step, &mut sampler, &mut logits, &mut ready, &mut stats)?;
                continue;
            }
            // Evaluate the new token so the next step has its logits.
            let pos = self.history.len();
            let mut b = Batch::default();
            b.push(id, pos as u32, 0, true);
            if device_greedy {
                let ids = self.model.forward_argmax(&mut self.ctx, &b)?;
                let id = ids.first().copied();
                next = Some(id.ok_or_else(|| ModelError::Batch("the decode step returned no token".into()))?);
            } else {
                self.model.forward_into(&mut self.ctx, &b, &mut logits)?;
            }
            self.history.push(id);
        };
        if finish != FinishReason::Stop {
            // Flush what was held back for a stop string that never came.
            let rest = detok.finish();
            text.push_str(&rest);
            if let Some(tail) = text.get(emitted..).filter(|t| !t.is_empty()) {
                on_event(StreamEvent::Tail(tail));
            }
        }
        Ok(Completion {
            tokens,
            text,
            finish,
            n_prompt: prompt.len(),
            n_cached,
            timings: Timings { prefill, decode: t1.elapsed() },
            speculative: spec.is_some().then_some(stats),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::held_back;

    #[test]
    fn text_that_may_begin_a_stop_string_is_held_back() {
        let stops = vec!["</end>".to_string(), "\n\n".to_string()];
        assert_eq!(held_back("hello </e", &stops), 3);
        assert_eq!(held_back("hello\n", &stops), 1);
        assert_eq!(held_back("hello", &stops), 0);
        assert_eq!(held_back("a <", &stops), 1);
        // A multi-byte stop string is only cut at character boundaries.
        let stops = vec!["é<9".to_string()];
        assert_eq!(held_back("abc\u{e9}", &stops), 2);
        assert_eq!(held_back("abc\u{e9}<", &stops), 3);
    }
}
