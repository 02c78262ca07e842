//! Token sampling: one position's logits in, the next token (and its
//! log-probabilities) out.
//!
//! Key decision: the chain and its formulas are llama.cpp's common sampler
//! (logit bias → repeat/presence/frequency penalties → top-k → typical-p →
//! top-p → min-p → temperature → draw), so a `--temp`/`--top-k`/… flag means
//! here what it means there; but one seed gives one token sequence on every
//! platform *by construction*. Every ordering the chain relies on is a total
//! order (logit descending, then id ascending), so neither the std sort
//! algorithm nor the order candidates arrive in can change which token a
//! random number lands on; the exponentials are our own IEEE-only polynomial
//! ([`exp_fast`]) rather than the platform's `expf`; and the random stream is
//! our own xoshiro256** ([`rng`]), not a `rand` generator whose algorithm may
//! change between versions. (The few remaining `ln` calls only place a cut-off
//! threshold; a one-ulp libm difference there could matter only for a
//! candidate sitting exactly on the threshold.)
//!
//! Cost on a 262144-token vocabulary: one pass that sanitizes and finds the
//! maximum, one vectorizable exp-sum for the log-probabilities, and for the
//! default `top_k = 40` a bounded-heap scan (one comparison per token), after
//! which everything works on 40 candidates. Only typical-p, or top-p without
//! top-k on a distribution whose nucleus is wide, sort the whole vocabulary,
//! as they do in llama.cpp. Buffers live in the [`Sampler`] and are reused.
//!
//! Negative temperature is accepted and means greedy, as in llama.cpp (the CLI
//! passes `--temp` through); non-finite temperature is rejected.

mod rng;

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use rng::Xoshiro256;

/// The most alternatives [`Sampled::top`] may report (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// The most candidates a row's selection ([`TopRows`]) keeps; a sampler
/// that needs more takes the whole row.
pub const TOP_ROWS_MAX_K: usize = 256;

/// What a top-k sampler needs of each row of logits, taken where the
/// logits are (a device's kernel; [`TopRows::select`] is the host's, the
/// reference the kernels are held to): the row's largest canonical logit
/// (NaN as -inf, +inf as `f32::MAX`, -0 as +0), its log-sum-exp, and its
/// best `k` finite logits — by logit, then lower id — in any order, so
/// only `k` values a row cross the bus instead of the vocabulary.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TopRows {
    /// Candidates a row holds room for.
    pub k: usize,
    /// Per row: how many candidates it has (`k`, or its finite logits if fewer).
    pub counts: Vec<u32>,
    /// Per row: the largest canonical logit (-inf when none is finite).
    pub max: Vec<f32>,
    /// Per row: `max + ln Σ e^(l - max)` (-inf when none is finite).
    pub lse: Vec<f32>,
    /// `rows x k`: the candidates' ids (the first `counts[r]` of a row).
    pub ids: Vec<u32>,
    /// `rows x k`: their canonical logits.
    pub logits: Vec<f32>,
}

/// One row of a [`TopRows`].
#[derive(Clone, Copy, Debug)]
pub struct TopRow<'a> {
    /// Candidates the selection had room for (the row has fewer only when
    /// fewer logits are finite).
    pub k: usize,
    /// The candidates' ids, any order.
    pub ids: &'a [u32],
    /// Their canonical logits.
    pub logits: &'a [f32],
    /// The row's largest canonical logit.
    pub max: f32,
    /// The row's log-sum-exp.
    pub lse: f32,
}

impl TopRows {
    /// Rows held.
    pub fn rows(&self) -> usize {
        self.counts.len()
    }

    /// Room for `rows` rows of `k` candidates (contents unspecified).
    pub fn reset(&mut self, rows: usize, k: usize) {
        self.k = k;
        self.counts.resize(rows, 0);
        self.max.resize(rows, 0.0);
        self.lse.resize(rows, 0.0);
        self.ids.resize(rows * k, 0);
        self.logits.resize(rows * k, 0.0);
    }

    /// Row `r`.
    pub fn row(&self, r: usize) -> TopRow<'_> {
        let n = (self.counts[r] as usize).min(self.k);
        let at = r * self.k;
        TopRow { k: self.k, ids: &self.ids[at..at + n], logits: &self.logits[at..at + n], max: self.max[r], lse: self.lse[r] }
    }

    /// The selection on the host, of each `width`-wide row of `x`.
    pub fn select(&mut self, x: &[f32], width: usize, k: usize) {
        let width = width.max(1);
        let rows = x.len() / width;
        self.reset(rows, k);
        let mut canon_row = Vec::with_capacity(width);
        let mut cands: Vec<Cand> = Vec::new();
        for (r, row) in x.chunks_exact(width).enumerate() {
            canon_row.clear();
            canon_row.extend_from_slice(row);
            let max = canon_max(&mut canon_row);
            self.max[r] = max;
            self.lse[r] = if max == f32::NEG_INFINITY { max } else { max + sum_exp(&canon_row, max).ln() };
            best_finite(&canon_row, k, &mut cands);
            self.counts[r] = cands.len() as u32;
            for (j, c) in cands.iter().enumerate() {
                self.ids[r * k + j] = c.id;
                self.logits[r * k + j] = c.logit;
            }
        }
    }
}

/// Up to this `top_k`, top-k keeps a bounded heap while scanning the logits
/// instead of materializing every token as a candidate first.
const HEAP_TOP_K_MAX: usize = 1024;

/// Top-p first sorts only this many best candidates when there are more than
/// [`TOP_P_PARTIAL_FROM`]; the nucleus usually fits, and if not the rest is sorted.
const TOP_P_PARTIAL: usize = 256;
const TOP_P_PARTIAL_FROM: usize = 1024;

/// What to sample with; field semantics are llama.cpp's unless noted.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// `<= 0.0` means greedy: argmax after bias and penalties, ties to the lowest id.
    pub temperature: f32,
    /// Keep the `top_k` highest logits; 0 = off.
    pub top_k: usize,
    /// Keep the smallest most-likely set whose probability reaches `top_p`; 1.0 = off.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0.0 = off.
    pub min_p: f32,
    /// Locally typical sampling mass; 1.0 = off.
    pub typical_p: f32,
    /// Divides positive logits and multiplies non-positive ones of tokens in the window; 1.0 = off.
    pub repeat_penalty: f32,
    /// How many of the most recent history tokens the three penalties look at; 0 = off.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every token in the window (OpenAI, -2..=2).
    pub presence_penalty: f32,
    /// Subtracted per occurrence in the window (OpenAI, -2..=2).
    pub frequency_penalty: f32,
    /// Added to a token's logit; `f32::NEG_INFINITY` bans it. Entries for one id add up.
    pub logit_bias: Vec<(u32, f32)>,
    /// `None`: seeded from the OS once, at [`Sampler::new`] ([`Sampler::seed`] tells which).
    pub seed: Option<u64>,
    /// How many top alternatives [`Sampled::top`] reports (0..=[`MAX_TOP_LOGPROBS`]).
    pub top_logprobs: usize,
}

impl Default for SamplingParams {
    /// llama.cpp's defaults (`common_params_sampling`).
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            typical_p: 1.0,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
            top_logprobs: 0,
        }
    }
}

impl SamplingParams {
    /// Plain argmax: no truncation, no penalties, no bias.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            ..SamplingParams::default()
        }
    }

    /// Every field within its range for a vocabulary of `n_vocab` tokens.
    pub fn validate(&self, n_vocab: usize) -> Result<(), SamplingError> {
        if n_vocab == 0 || n_vocab > u32::MAX as usize + 1 {
            return Err(SamplingError::BadVocab { n_vocab });
        }
        fn bad(
            field: &'static str,
            value: impl std::fmt::Debug,
            allowed: &'static str,
        ) -> SamplingError {
            SamplingError::BadParam {
                field,
                value: format!("{value:?}"),
                allowed,
            }
        }
        let p = self;
        if !p.temperature.is_finite() {
            return Err(bad(
                "temperature",
                p.temperature,
                "a finite number (<= 0 means greedy)",
            ));
        }
        if !(p.top_p > 0.0 && p.top_p <= 1.0) {
            return Err(bad("top_p", p.top_p, "(0, 1]; 1 = off"));
        }
        if !(0.0..=1.0).contains(&p.min_p) {
            return Err(bad("min_p", p.min_p, "[0, 1]; 0 = off"));
        }
        if !(p.typical_p > 0.0 && p.typical_p <= 1.0) {
            return Err(bad("typical_p", p.typical_p, "(0, 1]; 1 = off"));
        }
        if !(p.repeat_penalty.is_finite() && p.repeat_penalty > 0.0) {
            return Err(bad(
                "repeat_penalty",
                p.repeat_penalty,
                "a finite number > 0; 1 = off",
            ));
        }
        if !(-2.0..=2.0).contains(&p.presence_penalty) {
            return Err(bad(
                "presence_penalty",
                p.presence_penalty,
                "[-2, 2]; 0 = off",
            ));
        }
        if !(-2.0..=2.0).contains(&p.frequency_penalty) {
            return Err(bad(
                "frequency_penalty",
                p.frequency_penalty,
                "[-2, 2]; 0 = off",
            ));
        }
        if p.top_logprobs > MAX_TOP_LOGPROBS || p.top_logprobs > n_vocab {
            return Err(bad(
                "top_logprobs",
                p.top_logprobs,
                "0..=20, and at most the vocabulary size",
            ));
        }
        for (index, &(token, bias)) in p.logit_bias.iter().enumerate() {
            if token as usize >= n_vocab {
                return Err(SamplingError::BiasTokenOutOfRange {
                    index,
                    token,
                    n_vocab,
                });
            }
            if !(bias.is_finite() || bias == f32::NEG_INFINITY) {
                return Err(SamplingError::BadBias { index, token, bias });
            }
        }
        Ok(())
    }

    /// Plain argmax: greedy with no bias, no penalties and no top
    /// logprobs asked — what [`crate::model::Model::forward_argmax`] computes.
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature <= 0.0
            && self.logit_bias.is_empty()
            && !self.penalties_active()
            && self.top_logprobs == 0
    }

    fn penalties_active(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.presence_penalty != 0.0
                || self.frequency_penalty != 0.0)
    }
}

/// One sampled token.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampled {
    /// The chosen token id.
    pub token: u32,
    /// Log-softmax of the *raw* logits (before penalties, bias and temperature)
    /// at `token`, as OpenAI reports it.
    pub logprob: f32,
    /// The `top_logprobs` most likely tokens under the same raw log-softmax,
    /// most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// Why sampling could not start or could not produce a token.
#[derive(Debug, thiserror::Error)]
pub enum SamplingError {
    /// A parameter outside its range.
    #[error("sampling parameter `{field}` is {value}; allowed: {allowed}")]
    BadParam {
        /// The [`SamplingParams`] field.
        field: &'static str,
        /// The value given.
        value: String,
        /// What would have been accepted.
        allowed: &'static str,
    },
    /// A `logit_bias` entry for a token the vocabulary does not have.
    #[error(
        "logit_bias entry {index} names token {token}, but the vocabulary has {n_vocab} tokens"
    )]
    BiasTokenOutOfRange {
        /// Position in `logit_bias`.
        index: usize,
        /// The token id given.
        token: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// A `logit_bias` value that is NaN or +inf.
    #[error(
        "logit_bias entry {index} for token {token} is {bias}; a bias is finite, or -inf to ban"
    )]
    BadBias {
        /// Position in `logit_bias`.
        index: usize,
        /// The token id.
        token: u32,
        /// The bias given.
        bias: f32,
    },
    /// A vocabulary of no tokens, or of more than token ids can name.
    #[error("a vocabulary of {n_vocab} tokens cannot be sampled from (allowed: 1..=2^32)")]
    BadVocab {
        /// The vocabulary size given.
        n_vocab: usize,
    },
    /// The logits slice does not have one entry per vocabulary token.
    #[error("got {got} logits for a vocabulary of {n_vocab} tokens")]
    LogitsLength {
        /// `logits.len()`.
        got: usize,
        /// The vocabulary size the sampler was made for.
        n_vocab: usize,
    },
    /// A token in the penalty window that the vocabulary does not have.
    #[error(
        "history position {position} holds token {token}, outside the vocabulary of {n_vocab}"
    )]
    HistoryTokenOutOfRange {
        /// Index into `history`.
        position: usize,
        /// The token id found there.
        token: u32,
        /// The vocabulary size.
        n_vocab: usize,
    },
    /// Every logit is NaN or -inf once bias and penalties are applied.
    #[error("no token can be sampled: every logit is NaN or -inf after logit bias and penalties")]
    NoCandidates,
    /// [`Sampler::sample_top`] was given fewer candidates than the
    /// sampler needs, or the sampler needs the whole row.
    #[error("this sampler needs the whole row of logits, not a top-k selection")]
    NeedsWholeRow,
}

/// A surviving token; `p` and `s` are scratch (probability, typical-p score).
#[derive(Clone, Copy, Debug)]
struct Cand {
    id: u32,
    logit: f32,
    p: f32,
    s: f32,
}

/// The chain's one ordering: higher logit first, then lower id. Logits here
/// are never NaN and never -0.0 (see [`canon`]), so this is a total order
/// on distinct tokens and any correct sort gives the same sequence.
fn by_rank(a: &Cand, b: &Cand) -> Ordering {
    b.logit.total_cmp(&a.logit).then(a.id.cmp(&b.id))
}

/// Heap entry whose maximum is the *worst* kept candidate, so `peek` is the
/// one a better newcomer evicts.
struct Worst(Cand);
impl PartialEq for Worst {
    fn eq(&self, o: &Self) -> bool {
        by_rank(&self.0, &o.0) == Ordering::Equal
    }
}
impl Eq for Worst {}
impl PartialOrd for Worst {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Worst {
    fn cmp(&self, o: &Self) -> Ordering {
        by_rank(&self.0, &o.0)
    }
}

/// NaN → -inf (a NaN logit must neither win nor poison the softmax), +inf →
/// `f32::MAX` (so `x - max` stays finite), -0.0 → +0.0 (so `total_cmp`
/// agrees with `==` and top-k = 1 matches greedy's tie rule).
#[inline]
fn canon(x: f32) -> f32 {
    if x.is_nan() {
        f32::NEG_INFINITY
    } else if x == f32::INFINITY {
        f32::MAX
    } else {
        x + 0.0
    }
}

/// `e^x` from IEEE arithmetic only (no libm), so results are bit-identical on
/// every platform, and simple enough for the compiler to vectorize.
/// Relative error below 3e-7 on [-87, 88]; returns exactly 0 below -87.
#[inline]
pub(crate) fn exp_fast(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that `n * LN2_HI` is exact for |n| < 2^9.
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding 1.5 * 2^23 rounds to an integer without `round()` (a libm
    // call on baseline x86-64) and leaves that integer in the low mantissa
    // bits, from which 2^n is built with integer ops that vectorize.
    const ROUNDER: f32 = 12_582_912.0;
    const ROUNDER_BITS: u32 = 0x4b40_0000;
    // Comparisons rather than `f32::clamp`/`max`: selects, not branches or
    // NaN handling (callers never pass NaN), so the loops calling this vectorize.
    let lo = if x > -87.0 { x } else { -87.0 };
    let xc = if lo < 88.0 { lo } else { 88.0 };
    let t = xc * LOG2E + ROUNDER;
    let n = t - ROUNDER;
    let r = (xc - n * LN2_HI) - n * LN2_LO;
    let mut poly = 1.0 / 5040.0;
    poly = poly * r + 1.0 / 720.0;
    poly = poly * r + 1.0 / 120.0;
    poly = poly * r + 1.0 / 24.0;
    poly = poly * r + 1.0 / 6.0;
    poly = poly * r + 0.5;
    poly = poly * r + 1.0;
    poly = poly * r + 1.0;
    let scale = f32::from_bits(t.to_bits().wrapping_sub(ROUNDER_BITS).wrapping_add(127) << 23);
    let keep = ((x >= -87.0) as u32).wrapping_neg();
    f32::from_bits((poly * scale).to_bits() & keep)
}

/// `Σ e^(l - max)` over `logits` (which hold no NaN). The exponentials go
/// through a small block so that loop is a pure map the compiler vectorizes,
/// and the sum runs in eight fixed lanes so its rounding is the same everywhere.
fn sum_exp(logits: &[f32], max: f32) -> f32 {
    const BLOCK: usize = 256;
    let mut buf = [0.0f32; BLOCK];
    let mut lanes = [0.0f32; 8];
    let mut rest = 0.0f32;
    for block in logits.chunks(BLOCK) {
        let out = &mut buf[..block.len()];
        for (o, &l) in out.iter_mut().zip(block) {
            *o = exp_fast(l - max);
        }
        let chunks = out.chunks_exact(8);
        rest += chunks.remainder().iter().sum::<f32>();
        for c in chunks {
            for j in 0..8 {
                lanes[j] += c[j];
            }
        }
    }
    lanes.iter().sum::<f32>() + rest
}

/// [`canon`] over `logits` in place; returns the maximum.
fn canon_max(logits: &mut [f32]) -> f32 {
    for l in logits.iter_mut() {
        *l = canon(*l);
    }
    lane_max(logits)
}

/// The maximum of NaN-free `values`, in eight lanes so it vectorizes (a
/// running `f32::max` is a serial dependency chain).
fn lane_max(values: &[f32]) -> f32 {
    let larger = |a: f32, b: f32| if b > a { b } else { a };
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = values.chunks_exact(8);
    let mut max = chunks
        .remainder()
        .iter()
        .fold(f32::NEG_INFINITY, |m, &v| larger(m, v));
    for c in chunks {
        for j in 0..8 {
            lanes[j] = larger(lanes[j], c[j]);
        }
    }
    for l in lanes {
        max = larger(max, l);
    }
    max
}

/// Samples tokens for one sequence with fixed parameters; owns the random
/// stream and the scratch buffers.
pub struct Sampler {
    params: SamplingParams,
    n_vocab: usize,
    seed: u64,
    rng: Xoshiro256,
    cands: Vec<Cand>,
    heap: Vec<Worst>,
    window: Vec<u32>,
    /// `(token, raw logit)` for every entry bias or penalties change, so the
    /// chosen token's raw log-probability survives the in-place edits.
    saved: Vec<(u32, f32)>,
}

impl Sampler {
    /// Validates `params` for `n_vocab` tokens and seeds the random stream.
    pub fn new(params: SamplingParams, n_vocab: usize) -> Result<Sampler, SamplingError> {
        params.validate(n_vocab)?;
        let seed = params.seed.unwrap_or_else(rng::os_seed);
        Ok(Sampler {
            params,
            n_vocab,
            seed,
            rng: Xoshiro256::from_seed(seed),
            cands: Vec::new(),
            heap: Vec::new(),
            window: Vec::new(),
            saved: Vec::new(),
        })
    }

    /// The parameters in use.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed in use (the OS-drawn one when `params.seed` was `None`), so a
    /// run can be reproduced.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Samples the next token. `logits` is the model's raw output for the next
    /// position (one per vocabulary token; modified in place), `history` every
    /// token of the sequence so far (prompt and generated), for the penalties.
    pub fn sample(
        &mut self,
        logits: &mut [f32],
        history: &[u32],
    ) -> Result<Sampled, SamplingError> {
        if logits.len() != self.n_vocab {
            return Err(SamplingError::LogitsLength {
                got: logits.len(),
                n_vocab: self.n_vocab,
            });
        }
        let window_start = self.check_window(history)?;

        let max = canon_max(logits);
        // Bias and penalties never raise a -inf logit, so nothing can be sampled.
        if max == f32::NEG_INFINITY {
            return Err(SamplingError::NoCandidates);
        }
        let lse = max + sum_exp(logits, max).ln();
        let top = top_logprobs(logits, self.params.top_logprobs, lse);

        self.adjust(logits, &history[window_start..]);
        let token = if self.params.temperature <= 0.0 {
            argmax(logits)?
        } else {
            self.draw(logits)?
        };

        let raw = match self.saved.iter().find(|s| s.0 == token) {
            Some(&(_, raw)) => raw,
            None => logits[token as usize],
        };
        Ok(Sampled {
            token,
            logprob: raw - lse,
            top,
        })
    }

    /// How many of a row's best candidates ([`TopRows`]) this sampler needs
    /// to choose exactly the token [`Sampler::sample`] would on the whole
    /// row, or `None` when it needs the whole row: logit bias and
    /// penalties edit arbitrary tokens, top-k off (`0`) keeps every token,
    /// more than [`TOP_ROWS_MAX_K`] is more than a selection holds.
    pub fn needs_top(&self) -> Option<usize> {
        let p = &self.params;
        if !p.logit_bias.is_empty() || p.penalties_active() {
            return None;
        }
        let k = if p.temperature <= 0.0 { 1 } else { p.top_k };
        let k = k.max(p.top_logprobs);
        (k > 0 && k <= TOP_ROWS_MAX_K).then_some(k)
    }

    /// [`Sampler::sample`] from a row's best candidates instead of the row:
    /// the same token for the same random stream, whenever
    /// [`Sampler::needs_top`] is at most the candidates the selection kept
    /// (checked). Only the log-probabilities may differ, in their last
    /// bits, where the row's log-sum-exp was summed in another order.
    pub fn sample_top(&mut self, row: TopRow<'_>) -> Result<Sampled, SamplingError> {
        let need = self.needs_top().ok_or(SamplingError::NeedsWholeRow)?;
        if need > row.k {
            return Err(SamplingError::NeedsWholeRow);
        }
        if row.max == f32::NEG_INFINITY {
            return Err(SamplingError::NoCandidates);
        }
        self.cands.clear();
        self.cands.extend(row.ids.iter().zip(row.logits).map(|(&id, &logit)| Cand { id, logit, p: 0.0, s: 0.0 }));
        self.cands.sort_unstable_by(by_rank);
        let top: Vec<(u32, f32)> =
            self.cands.iter().take(self.params.top_logprobs).map(|c| (c.id, c.logit - row.lse)).collect();
        let Some(best) = self.cands.first().copied() else {
            return Err(SamplingError::NoCandidates);
        };
        let (token, raw) = if self.params.temperature <= 0.0 {
            (best.id, best.logit)
        } else {
            self.cands.truncate(self.params.top_k);
            self.truncate_rest()?;
            let id = self.draw_cands();
            let raw = self.cands.iter().find(|c| c.id == id).map_or(best.logit, |c| c.logit);
            (id, raw)
        };
        Ok(Sampled { token, logprob: raw - row.lse, top })
    }

    /// Speculative verification at one position: keeps `draft` (a token
    /// proposed with certainty — a greedy draft model, a prompt lookup) or
    /// samples the token that replaces it, so that the token returned is
    /// distributed exactly as [`Sampler::sample`]'s would be.
    ///
    /// Greedy: `draft` is kept when it is the argmax, and the argmax is
    /// returned either way. Sampling: with `p` the distribution `sample`
    /// draws from (after bias, penalties, truncation and temperature),
    /// `draft` is kept with probability `p(draft)`; otherwise the token is
    /// drawn from `p` with `draft` removed and renormalized — rejection
    /// sampling with a point-mass proposal, so P(x) = p(draft)·[x = draft] +
    /// (1 − p(draft))·p(x)/(1 − p(draft))·[x ≠ draft] = p(x). Returns the
    /// token and whether it is the draft.
    pub fn verify(&mut self, logits: &mut [f32], history: &[u32], draft: u32) -> Result<(Sampled, bool), SamplingError> {
        if logits.len() != self.n_vocab {
            return Err(SamplingError::LogitsLength { got: logits.len(), n_vocab: self.n_vocab });
        }
        let window_start = self.check_window(history)?;
        let max = canon_max(logits);
        if max == f32::NEG_INFINITY {
            return Err(SamplingError::NoCandidates);
        }
        let lse = max + sum_exp(logits, max).ln();
        let top = top_logprobs(logits, self.params.top_logprobs, lse);
        self.adjust(logits, &history[window_start..]);
        let token = if self.params.temperature <= 0.0 {
            argmax(logits)?
        } else {
            self.truncate(logits)?;
            let t = self.params.temperature;
            let max = self.cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
            let mut sum = 0.0f64;
            let mut w_draft = 0.0f64;
            for c in self.cands.iter_mut() {
                // The same weights as `draw`.
                c.p = exp_fast((c.logit - max) / t);
                sum += c.p as f64;
                if c.id == draft {
                    w_draft = c.p as f64;
                }
            }
            if self.rng.next_f64() * sum < w_draft {
                draft
            } else {
                // The residual max(0, p - δ_draft), renormalized: p without the draft.
                let rest = sum - w_draft;
                let target = rest * self.rng.next_f64();
                let mut run = 0.0f64;
                let mut chosen = None;
                for c in self.cands.iter().filter(|c| c.id != draft) {
                    run += c.p as f64;
                    if run > target {
                        chosen = Some(c.id);
                        break;
                    }
                }
                // Rounding left `target` at `rest`: the last candidate with weight.
                match chosen.or_else(|| self.cands.iter().rev().find(|c| c.id != draft && c.p > 0.0).map(|c| c.id)) {
                    Some(id) => id,
                    // Only the draft has weight: the rejection above had probability 0.
                    None => draft,
                }
            }
        };
        let raw = match self.saved.iter().find(|s| s.0 == token) {
            Some(&(_, raw)) => raw,
            None => logits[token as usize],
        };
        Ok((Sampled { token, logprob: raw - lse, top }, token == draft))
    }

    /// Start of the penalty window in `history`, after checking its tokens.
    fn check_window(&self, history: &[u32]) -> Result<usize, SamplingError> {
        if !self.params.penalties_active() {
            return Ok(history.len());
        }
        let start = history.len().saturating_sub(self.params.repeat_last_n);
        for (i, &token) in history[start..].iter().enumerate() {
            if token as usize >= self.n_vocab {
                return Err(SamplingError::HistoryTokenOutOfRange {
                    position: start + i,
                    token,
                    n_vocab: self.n_vocab,
                });
            }
        }
        Ok(start)
    }

    /// Logit bias, then the penalties over `window` (the last `repeat_last_n`
    /// history tokens, already range-checked; empty when penalties are off).
    fn adjust(&mut self, logits: &mut [f32], window: &[u32]) {
        self.saved.clear();
        for &(id, bias) in &self.params.logit_bias {
            let l = &mut logits[id as usize];
            self.saved.push((id, *l));
            *l += bias;
        }
        if window.is_empty() {
            return;
        }
        let p = &self.params;
        self.window.clear();
        self.window.extend_from_slice(window);
        self.window.sort_unstable();
        for run in self.window.chunk_by(|a, b| a == b) {
            let id = run[0];
            let l = &mut logits[id as usize];
            self.saved.push((id, *l));
            // Dividing a negative logit would make the token *more* likely.
            if *l <= 0.0 {
                *l *= p.repeat_penalty;
            } else {
                *l /= p.repeat_penalty;
            }
            *l -= run.len() as f32 * p.frequency_penalty + p.presence_penalty;
        }
    }

    /// Truncation (top-k, typical-p, top-p, min-p), then temperature and one
    /// draw from the seeded stream.
    fn draw(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        self.truncate(logits)?;
        Ok(self.draw_cands())
    }

    /// Temperature and one draw over `self.cands` (truncated, not empty).
    fn draw_cands(&mut self) -> u32 {
        let t = self.params.temperature;
        let max = self
            .cands
            .iter()
            .fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
        let mut sum = 0.0f64;
        for c in self.cands.iter_mut() {
            // (l - max) / T rather than l / T - max / T: never inf - inf, even for tiny T.
            c.p = exp_fast((c.logit - max) / t);
            sum += c.p as f64;
        }
        let target = sum * self.rng.next_f64();
        let mut run = 0.0f64;
        for c in &self.cands {
            run += c.p as f64;
            // Strictly greater: a zero-weight candidate is never chosen.
            if run > target {
                return c.id;
            }
        }
        // Rounding left `target` at `sum`: take the last candidate with weight.
        self.cands
            .iter()
            .rev()
            .find(|c| c.p > 0.0)
            .map_or(self.cands[0].id, |c| c.id)
    }

    /// Leaves in `self.cands` the tokens the truncation samplers keep, in an
    /// order fixed by the total orders used (not by the sort algorithm).
    fn truncate(&mut self, logits: &[f32]) -> Result<(), SamplingError> {
        let p = &self.params;
        self.cands.clear();
        let k = p.top_k;
        if k > 0 && k <= HEAP_TOP_K_MAX && k < logits.len() {
            let mut heap = BinaryHeap::from(std::mem::take(&mut self.heap));
            // Ids arrive ascending, so a token whose logit only ties the
            // worst kept one ranks below it: `<=` rejects almost every token
            // with one comparison (and -inf ones before the heap fills).
            let mut floor = f32::NEG_INFINITY;
            for (id, &l) in logits.iter().enumerate() {
                if l <= floor {
                    continue;
                }
                let c = Worst(Cand {
                    id: id as u32,
                    logit: canon(l),
                    p: 0.0,
                    s: 0.0,
                });
                if heap.len() < k {
                    heap.push(c);
                } else if let Some(mut worst) = heap.peek_mut() {
                    *worst = c;
                }
                if heap.len() == k {
                    floor = heap.peek().map_or(floor, |w| w.0.logit);
                }
            }
            self.cands.extend(heap.drain().map(|w| w.0));
            self.heap = heap.into_vec();
            self.cands.sort_unstable_by(by_rank);
        } else if best_finite(logits, if k == 0 { usize::MAX } else { k }, &mut self.cands) {
            self.cands.sort_unstable_by(by_rank);
        }
        self.truncate_rest()
    }

    /// The truncation after top-k (typical-p, top-p, min-p) over `self.cands`.
    fn truncate_rest(&mut self) -> Result<(), SamplingError> {
        let p = &self.params;
        if self.cands.is_empty() {
            return Err(SamplingError::NoCandidates);
        }
        if p.typical_p < 1.0 {
            typical(&mut self.cands, p.typical_p);
        }
        if p.top_p < 1.0 {
            top_p(&mut self.cands, p.top_p);
        }
        if p.min_p > 0.0 {
            let max = self
                .cands
                .iter()
                .fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
            // p_i >= min_p * p_max  <=>  l_i >= l_max + ln(min_p): no softmax needed.
            let floor = max + p.min_p.ln();
            self.cands.retain(|c| c.logit >= floor);
        }
        Ok(())
    }
}

/// The best `k` finite logits of `logits` (canonical; every finite one
/// when there are no more than `k`) into `cands`, in no useful order (the
/// top-k the sampler keeps, and what a [`TopRows`] selection holds).
/// Returns whether any were cut.
fn best_finite(logits: &[f32], k: usize, cands: &mut Vec<Cand>) -> bool {
    cands.clear();
    for (id, &l) in logits.iter().enumerate() {
        if l != f32::NEG_INFINITY {
            cands.push(Cand { id: id as u32, logit: canon(l), p: 0.0, s: 0.0 });
        }
    }
    if k >= cands.len() {
        return false;
    }
    if k > 0 {
        cands.select_nth_unstable_by(k - 1, by_rank);
    }
    cands.truncate(k);
    true
}

/// Softmax over `cands` into `c.p`; returns `(max logit, ln Σ e^(l - max))`.
fn softmax(cands: &mut [Cand]) -> (f32, f32) {
    let max = cands.iter().fold(f32::NEG_INFINITY, |m, c| m.max(c.logit));
    let mut sum = 0.0f32;
    for c in cands.iter_mut() {
        c.p = exp_fast(c.logit - max);
        sum += c.p;
    }
    for c in cands.iter_mut() {
        c.p /= sum;
    }
    (max, sum.ln())
}

/// Locally typical sampling: rank tokens by how far their surprise is from
/// the distribution's entropy, keep the closest until their mass exceeds `mass`.
fn typical(cands: &mut Vec<Cand>, mass: f32) {
    let (max, ln_sum) = softmax(cands);
    // ln p from the logits, not ln(p): p may underflow to 0 where ln p is finite.
    let ln_p = |c: &Cand| (c.logit - max) - ln_sum;
    let entropy: f32 = cands.iter().map(|c| -c.p * ln_p(c)).sum();
    for c in cands.iter_mut() {
        c.s = (-ln_p(c) - entropy).abs();
    }
    cands.sort_unstable_by(|a, b| a.s.total_cmp(&b.s).then(a.id.cmp(&b.id)));
    let mut cum = 0.0f64;
    let mut keep = cands.len();
    for (i, c) in cands.iter().enumerate() {
        cum += c.p as f64;
        if cum > mass as f64 {
            keep = i + 1;
            break;
        }
    }
    cands.truncate(keep);
}

/// Nucleus: the best-ranked prefix whose probability first reaches `mass`.
/// Sorts only the best [`TOP_P_PARTIAL`] first when there are many candidates.
fn top_p(cands: &mut Vec<Cand>, mass: f32) {
    softmax(cands);
    let n = cands.len();
    let mut sorted = n;
    if n > TOP_P_PARTIAL_FROM {
        cands.select_nth_unstable_by(TOP_P_PARTIAL - 1, by_rank);
        sorted = TOP_P_PARTIAL;
        cands[..sorted].sort_unstable_by(by_rank);
    } else {
        cands.sort_unstable_by(by_rank);
    }
    let mut cum = 0.0f64;
    let mut keep = n;
    for i in 0..n {
        if i == sorted {
            // Everything past the partial prefix ranks below it.
            cands[sorted..].sort_unstable_by(by_rank);
            sorted = n;
        }
        cum += cands[i].p as f64;
        if cum >= mass as f64 {
            keep = i + 1;
            break;
        }
    }
    cands.truncate(keep);
}

/// Argmax, ties to the lowest id; logits hold no NaN. The maximum first,
/// then its first position: two vectorizable passes beat one serial scan.
fn argmax(logits: &[f32]) -> Result<u32, SamplingError> {
    let max = lane_max(logits);
    match logits.iter().position(|&l| l == max) {
        Some(i) if max != f32::NEG_INFINITY => Ok(i as u32),
        _ => Err(SamplingError::NoCandidates),
    }
}

/// The `n` highest raw logits as log-probabilities, best first, ties to the
/// lower id. One comparison per token once `n` are held.
fn top_logprobs(logits: &[f32], n: usize, lse: f32) -> Vec<(u32, f32)> {
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n + 1);
    if n == 0 {
        return top;
    }
    for (id, &l) in logits.iter().enumerate() {
        if top.len() < n || l > top[n - 1].1 {
            // After every held entry with an equal logit: those have lower ids.
            let at = top.partition_point(|&(_, x)| x >= l);
            top.insert(at, (id as u32, l));
            top.truncate(n);
        }
    }
    // A token that cannot be drawn (its logit -inf: masked by a grammar)
    // is no alternative: fewer than `n` come back rather than a -inf
    // logprob, which JSON cannot carry.
    top.retain(|e| e.1.is_finite());
    for e in top.iter_mut() {
        e.1 -= lse;
    }
    top
}

#[cfg(test)]
mod tests;
