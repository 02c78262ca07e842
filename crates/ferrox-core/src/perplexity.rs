//! Perplexity and KL divergence of a model over a text, by llama-perplexity's
//! method so the numbers can be put beside its own.
//!
//! The decision: copy llama-perplexity's chunking exactly, because a
//! perplexity is only comparable under the same protocol. The token stream
//! (BOS included when the vocabulary adds one) is cut into
//! `n_tokens / n_ctx` chunks of `n_ctx`; each chunk starts from an empty
//! cache with its first token replaced by BOS (when the model adds BOS); the
//! first half is context only, and the logits at positions
//! `n_ctx/2 ..= n_ctx-2` are scored against the token that follows each.
//! The error bar is the standard error of the mean negative log-likelihood,
//! carried through `exp` (llama-perplexity's formula).
//!
//! KL divergence compares against a *base* run saved to a file. llama's file
//! stores every log-probability of every scored position (≈ 0.5 MiB per
//! position on a 262k vocabulary); ours stores the base's top-k
//! log-probabilities and the log-probability of the true token, a few
//! hundred bytes per position. KL is then taken over the base's top-k tokens
//! plus one "everything else" bucket: the KL of that coarsening, which is a
//! lower bound of the full KL and equals it when the top-k hold all the
//! base's mass. The file format is documented on [`BaseLogitsWriter`].

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::backend::{Batch, DeviceBackend};
use crate::model::{Model, ModelError};

/// Why perplexity cannot be computed.
#[derive(Debug, thiserror::Error)]
pub enum PerplexityError {
    /// A context that scores nothing (`n_ctx - 1 - n_ctx/2` must be positive).
    #[error("a context of {n_ctx} tokens scores nothing; use at least 3 (-c)")]
    ContextTooSmall {
        /// The context size asked for.
        n_ctx: usize,
    },
    /// A batch size of zero.
    #[error("the batch size must be at least 1")]
    ZeroBatch,
    /// Fewer tokens than two chunks (llama-perplexity's minimum).
    #[error("the text is {n_tokens} tokens; perplexity with a context of {n_ctx} needs at least {}", 2 * n_ctx)]
    TooFewTokens {
        /// Tokens in the text.
        n_tokens: usize,
        /// The context size.
        n_ctx: usize,
    },
    /// The model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The caller cancelled.
    #[error("cancelled")]
    Cancelled,
    /// Reading or writing the base-logits file failed.
    #[error("base logits file: {0}")]
    Io(#[from] std::io::Error),
    /// A base-logits file that is malformed (offset in bytes from its start).
    #[error("base logits file, byte {offset}: {why}")]
    BadBase {
        /// Where the problem was found.
        offset: u64,
        /// What was wrong.
        why: String,
    },
    /// A base-logits file made with another model or setting.
    #[error("base logits file was made with {what} = {file}, this run has {run}")]
    BaseMismatch {
        /// What differs.
        what: &'static str,
        /// The file's value.
        file: usize,
        /// This run's value.
        run: usize,
    },
}

/// How to cut and evaluate the text.
#[derive(Debug, Clone, PartialEq)]
pub struct PerplexityOptions {
    /// Tokens per chunk (llama's `-c`).
    pub n_ctx: usize,
    /// Tokens per forward pass (at most `n_ctx` are used).
    pub n_batch: usize,
    /// Evaluate at most this many chunks (llama's `--chunks`).
    pub max_chunks: Option<usize>,
    /// The token that replaces the first of every chunk: the BOS id when
    /// the vocabulary adds BOS, else `None`.
    pub bos: Option<u32>,
}

impl PerplexityOptions {
    /// First scored position of a chunk: logits from here on are scored.
    pub fn first(&self) -> usize {
        self.n_ctx / 2
    }

    /// Scored tokens per chunk.
    pub fn scored_per_chunk(&self) -> usize {
        self.n_ctx.saturating_sub(1 + self.first())
    }

    /// The chunks `n_tokens` give, or why they cannot be evaluated.
    pub fn n_chunks(&self, n_tokens: usize) -> Result<usize, PerplexityError> {
        if self.scored_per_chunk() == 0 {
            return Err(PerplexityError::ContextTooSmall { n_ctx: self.n_ctx });
        }
        if self.n_batch == 0 {
            return Err(PerplexityError::ZeroBatch);
        }
        if n_tokens < 2 * self.n_ctx {
            return Err(PerplexityError::TooFewTokens {
                n_tokens,
                n_ctx: self.n_ctx,
            });
        }
        let n = n_tokens / self.n_ctx;
        Ok(self.max_chunks.map_or(n, |m| m.min(n)))
    }
}

/// The logits of one forward pass's scored positions, with what each predicts.
#[derive(Debug)]
pub struct Scored<'a> {
    /// Chunk index (0-based).
    pub chunk: usize,
    /// `targets.len() x n_vocab` logits, in position order.
    pub logits: &'a [f32],
    /// The token that follows each scored position.
    pub targets: &'a [u32],
    /// Whether this is the last part of its chunk.
    pub end_of_chunk: bool,
}

/// Runs every chunk of `tokens` through `model` and hands the scored logits
/// to `score`, pass by pass. Returns the number of chunks evaluated.
pub fn evaluate<B: DeviceBackend>(
    model: &Model<B>,
    tokens: &[u32],
    opts: &PerplexityOptions,
    cancel: &AtomicBool,
    mut score: impl FnMut(Scored<'_>) -> Result<(), PerplexityError>,
) -> Result<usize, PerplexityError> {
    let n_chunk = opts.n_chunks(tokens.len())?;
    let (n_ctx, first) = (opts.n_ctx, opts.first());
    let n_batch = opts.n_batch.min(n_ctx);
    // One cache for all chunks: positions refill from 0 and attention reads
    // only 0..=pos of the slot, so an old chunk's keys are never seen.
    let mut ctx = model.new_context(n_ctx, 1)?;
    // The last position's logits would predict past the chunk and nothing
    // after it attends to it, so it is not evaluated at all.
    let end = n_ctx - 1;
    for chunk in 0..n_chunk {
        let start = chunk * n_ctx;
        let mut b0 = 0;
        while b0 < end {
            if cancel.load(Ordering::Relaxed) {
                return Err(PerplexityError::Cancelled);
            }
            let b1 = (b0 + n_batch).min(end);
            let mut batch = Batch::default();
            for pos in b0..b1 {
                let tok = match (pos, opts.bos) {
                    (0, Some(bos)) => bos,
                    _ => tokens[start + pos],
                };
                batch.push(tok, pos as u32, 0, pos >= first);
            }
            let logits = model.forward(&mut ctx, &batch)?;
            let lo = b0.max(first);
            if lo < b1 {
                score(Scored {
                    chunk,
                    logits: &logits,
                    targets: &tokens[start + lo + 1..start + b1 + 1],
                    end_of_chunk: b1 == end,
                })?;
            }
            b0 = b1;
        }
    }
    Ok(n_chunk)
}

/// `-ln softmax(logits)[target]`: max and sum of exponentials taken as
/// llama-perplexity takes them (f32 exponentials summed in f64).
pub fn token_nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    f64::from(max) + sum.ln() - f64::from(logits[target as usize])
}

/// Running sums of negative log-likelihoods: perplexity and its error.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NllStats {
    /// Σ nll.
    pub sum: f64,
    /// Σ nll².
    pub sum2: f64,
    /// Tokens scored.
    pub count: usize,
}

impl NllStats {
    /// Adds one token's negative log-likelihood.
    pub fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum2 += nll * nll;
        self.count += 1;
    }

    /// Mean negative log-likelihood (NaN before any token).
    pub fn mean(&self) -> f64 {
        self.sum / self.count as f64
    }

    /// `exp(mean nll)`.
    pub fn ppl(&self) -> f64 {
        self.mean().exp()
    }

    /// Standard error of the mean nll, `None` with fewer than two tokens or
    /// no spread.
    pub fn mean_error(&self) -> Option<f64> {
        if self.count < 2 {
            return None;
        }
        let m = self.mean();
        let var = self.sum2 / self.count as f64 - m * m;
        (var > 0.0).then(|| (var / (self.count - 1) as f64).sqrt())
    }

    /// The error of [`NllStats::ppl`]: `ppl * mean_error` (first-order).
    pub fn ppl_error(&self) -> Option<f64> {
        self.mean_error().map(|e| e * self.ppl())
    }

    /// Adds every scored token of a pass.
    pub fn add_scored(&mut self, s: &Scored<'_>) {
        let n_vocab = s.logits.len() / s.targets.len().max(1);
        for (row, &t) in s.logits.chunks_exact(n_vocab).zip(s.targets) {
            self.add(token_nll(row, t));
        }
    }
}

/// Perplexity of `tokens` under `model`; `on_chunk(chunk, stats)` sees the
/// running figures after each chunk.
pub fn perplexity<B: DeviceBackend>(
    model: &Model<B>,
    tokens: &[u32],
    opts: &PerplexityOptions,
    cancel: &AtomicBool,
    mut on_chunk: impl FnMut(usize, &NllStats),
) -> Result<NllStats, PerplexityError> {
    let mut stats = NllStats::default();
    evaluate(model, tokens, opts, cancel, |s| {
        stats.add_scored(&s);
        if s.end_of_chunk {
            on_chunk(s.chunk, &stats);
        }
        Ok(())
    })?;
    Ok(stats)
}

/// One scored position of a base run: the true token's log-probability and
/// the `k` most likely tokens with theirs, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct BasePosition {
    /// `ln p(target)`.
    pub target_logprob: f32,
    /// Token ids, most likely first.
    pub ids: Vec<u32>,
    /// Their log-probabilities.
    pub logprobs: Vec<f32>,
}

impl BasePosition {
    /// The base record of one row of logits.
    pub fn from_logits(logits: &[f32], target: u32, k: usize) -> BasePosition {
        let lse = log_sum_exp(logits);
        let k = k.min(logits.len());
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let by_logit = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        if k < idx.len() {
            idx.select_nth_unstable_by(k, by_logit);
            idx.truncate(k);
        }
        idx.sort_unstable_by(by_logit);
        BasePosition {
            target_logprob: (f64::from(logits[target as usize]) - lse) as f32,
            logprobs: idx
                .iter()
                .map(|&i| (f64::from(logits[i as usize]) - lse) as f32)
                .collect(),
            ids: idx,
        }
    }
}

fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from((l - max).exp())).sum();
    f64::from(max) + sum.ln()
}

const BASE_MAGIC: &[u8; 8] = b"FXKLBASE";
const BASE_VERSION: u32 = 1;

/// What a base-logits file was made from.
#[derive(Debug, Clone, PartialEq)]
pub struct BaseHeader {
    /// Context size of the base run.
    pub n_ctx: usize,
    /// Vocabulary size.
    pub n_vocab: usize,
    /// Chunks evaluated.
    pub n_chunk: usize,
    /// Log-probabilities kept per position.
    pub top_k: usize,
    /// The evaluated tokens (`n_chunk * n_ctx`), so a comparison run feeds
    /// exactly what the base saw, whatever its tokenizer would make of the text.
    pub tokens: Vec<u32>,
}

/// Writes a base-logits file. Little-endian throughout:
///
/// ```text
/// magic    8 bytes  "FXKLBASE"
/// version  u32      1
/// n_ctx    u32
/// n_vocab  u32
/// n_chunk  u32
/// top_k    u32
/// tokens   u32 x (n_chunk * n_ctx)
/// then for each chunk, for each scored position (n_ctx - 1 - n_ctx/2 per chunk):
///   target_logprob  f32
///   top_k x (id u32, logprob f32), most likely first
/// ```
pub struct BaseLogitsWriter<W: Write> {
    out: W,
    top_k: usize,
}

impl<W: Write> BaseLogitsWriter<W> {
    /// Writes the header.
    pub fn new(mut out: W, h: &BaseHeader) -> Result<Self, PerplexityError> {
        out.write_all(BASE_MAGIC)?;
        for v in [
            BASE_VERSION as usize,
            h.n_ctx,
            h.n_vocab,
            h.n_chunk,
            h.top_k,
        ] {
            out.write_all(&u32_of(v)?.to_le_bytes())?;
        }
        for &t in &h.tokens {
            out.write_all(&t.to_le_bytes())?;
        }
        Ok(BaseLogitsWriter {
            out,
            top_k: h.top_k,
        })
    }

    /// Appends every scored position of a pass.
    pub fn write_scored(&mut self, s: &Scored<'_>) -> Result<(), PerplexityError> {
        let n_vocab = s.logits.len() / s.targets.len().max(1);
        for (row, &t) in s.logits.chunks_exact(n_vocab).zip(s.targets) {
            let p = BasePosition::from_logits(row, t, self.top_k);
            self.out.write_all(&p.target_logprob.to_le_bytes())?;
            for (id, lp) in p.ids.iter().zip(&p.logprobs) {
                self.out.write_all(&id.to_le_bytes())?;
                self.out.write_all(&lp.to_le_bytes())?;
            }
        }
        Ok(())
    }

    /// Flushes and returns the writer.
    pub fn finish(mut self) -> Result<W, PerplexityError> {
        self.out.flush()?;
        Ok(self.out)
    }
}

fn u32_of(v: usize) -> Result<u32, PerplexityError> {
    u32::try_from(v).map_err(|_| PerplexityError::BadBase {
        offset: 0,
        why: format!("{v} does not fit the file's u32 fields"),
    })
}

/// Reads a base-logits file written by [`BaseLogitsWriter`].
pub struct BaseLogitsReader<R: Read> {
    input: R,
    offset: u64,
    header: BaseHeader,
}

impl<R: Read> BaseLogitsReader<R> {
    /// Reads and checks the header; `file_len` bounds what the header may
    /// claim, so a corrupt count cannot ask for a huge allocation.
    pub fn new(mut input: R, file_len: u64) -> Result<Self, PerplexityError> {
        let mut offset = 0u64;
        let mut magic = [0u8; 8];
        read_exact(&mut input, &mut magic, &mut offset)?;
        if &magic != BASE_MAGIC {
            return Err(PerplexityError::BadBase {
                offset: 0,
                why: "not a ferrox base-logits file (bad magic)".into(),
            });
        }
        let mut f = [0usize; 5];
        for v in &mut f {
            let mut b = [0u8; 4];
            read_exact(&mut input, &mut b, &mut offset)?;
            *v = u32::from_le_bytes(b) as usize;
        }
        let [version, n_ctx, n_vocab, n_chunk, top_k] = f;
        if version != BASE_VERSION as usize {
            return Err(PerplexityError::BadBase {
                offset: 8,
                why: format!("version {version}, this build reads {BASE_VERSION}"),
            });
        }
        let opts = PerplexityOptions {
            n_ctx,
            n_batch: 1,
            max_chunks: None,
            bos: None,
        };
        if opts.scored_per_chunk() == 0 || n_chunk == 0 || top_k == 0 || n_vocab == 0 {
            return Err(PerplexityError::BadBase {
                offset: 12,
                why: format!("empty run (n_ctx {n_ctx}, n_vocab {n_vocab}, n_chunk {n_chunk}, top_k {top_k})"),
            });
        }
        let n_tokens = n_ctx as u64 * n_chunk as u64;
        let per_pos = 4 + 8 * top_k as u64;
        let need = 28 + 4 * n_tokens + n_chunk as u64 * opts.scored_per_chunk() as u64 * per_pos;
        if need != file_len {
            return Err(PerplexityError::BadBase {
                offset: 28,
                why: format!("the header implies {need} bytes, the file has {file_len}"),
            });
        }
        let mut raw = vec![0u8; 4 * n_tokens as usize];
        read_exact(&mut input, &mut raw, &mut offset)?;
        let tokens = raw
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(BaseLogitsReader {
            input,
            offset,
            header: BaseHeader {
                n_ctx,
                n_vocab,
                n_chunk,
                top_k,
                tokens,
            },
        })
    }

    /// What the file was made from.
    pub fn header(&self) -> &BaseHeader {
        &self.header
    }

    /// The next scored position.
    pub fn next_position(&mut self) -> Result<BasePosition, PerplexityError> {
        let k = self.header.top_k;
        let mut raw = vec![0u8; 4 + 8 * k];
        let at = self.offset;
        read_exact(&mut self.input, &mut raw, &mut self.offset)?;
        let f = |i: usize| [raw[i], raw[i + 1], raw[i + 2], raw[i + 3]];
        let target_logprob = f32::from_le_bytes(f(0));
        let mut ids = Vec::with_capacity(k);
        let mut logprobs = Vec::with_capacity(k);
        for j in 0..k {
            let id = u32::from_le_bytes(f(4 + 8 * j));
            if id as usize >= self.header.n_vocab {
                return Err(PerplexityError::BadBase {
                    offset: at,
                    why: format!(
                        "token id {id} outside the vocabulary ({})",
                        self.header.n_vocab
                    ),
                });
            }
            ids.push(id);
            logprobs.push(f32::from_le_bytes(f(8 + 8 * j)));
        }
        Ok(BasePosition {
            target_logprob,
            ids,
            logprobs,
        })
    }
}

fn read_exact(r: &mut impl Read, buf: &mut [u8], offset: &mut u64) -> Result<(), PerplexityError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => PerplexityError::BadBase {
            offset: *offset,
            why: "truncated".into(),
        },
        _ => PerplexityError::Io(e),
    })?;
    *offset += buf.len() as u64;
    Ok(())
}

/// Running comparison of a run with its base: both perplexities, mean KL
/// divergence `KL(base ‖ run)` and how often the most likely token agrees.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct KlStats {
    /// This run's nll.
    pub nll: NllStats,
    /// The base's nll.
    pub nll_base: NllStats,
    /// Per-position KL divergence, summed the same way.
    pub kld: NllStats,
    /// Positions whose most likely token is the base's.
    pub same_top: usize,
}

impl KlStats {
    /// Compares one row of logits with its base record.
    pub fn add(&mut self, logits: &[f32], target: u32, base: &BasePosition) {
        let lse = log_sum_exp(logits);
        self.nll.add(lse - f64::from(logits[target as usize]));
        self.nll_base.add(-f64::from(base.target_logprob));
        let (mut kl, mut p_in, mut q_in) = (0.0f64, 0.0f64, 0.0f64);
        for (&id, &lp) in base.ids.iter().zip(&base.logprobs) {
            let lq = f64::from(logits[id as usize]) - lse;
            let lp = f64::from(lp);
            let p = lp.exp();
            kl += p * (lp - lq);
            p_in += p;
            q_in += lq.exp();
        }
        // The "everything else" bucket. Rounding can make the base's top-k
        // sum a hair over 1; that bucket is then empty.
        let p_rest = 1.0 - p_in;
        if p_rest > 1e-12 {
            let q_rest = (1.0 - q_in).max(f64::MIN_POSITIVE);
            kl += p_rest * (p_rest.ln() - q_rest.ln());
        }
        self.kld.add(kl.max(0.0));
        let top = logits
            .iter()
            .enumerate()
            .fold(0, |best, (i, &l)| if l > logits[best] { i } else { best });
        if base.ids.first().is_some_and(|&b| b as usize == top) {
            self.same_top += 1;
        }
    }

    /// Fraction of positions whose top token agrees with the base.
    pub fn same_top_fraction(&self) -> f64 {
        self.same_top as f64 / self.nll.count as f64
    }
}
