//! Continuous batching: many sequences share one model, one forward pass per
//! engine step.
//!
//! The decision: one engine thread owns the model and a [`Context`] of
//! `n_slots` KV slots, and every step builds *one* [`Batch`] holding the next
//! token of every decoding sequence plus at most `n_batch` tokens in total, the
//! rest filled with prompt chunks of sequences still prefilling. A long prompt
//! therefore never stalls the decodes of the others for longer than one
//! bounded step, and every decode step shares the weight reads of one pass.
//! Requests wait in a bounded queue; a full queue is an immediate
//! [`SubmitError::QueueFull`], never an unbounded wait. A freed slot keeps
//! the tokens its cache holds, and a new request takes the free slot whose
//! history shares the longest prefix with its prompt, so a follow-up chat turn
//! evaluates only what is new.
//!
//! The engine knows no transport: results go out through an [`EventSink`]
//! per sequence, and a sink whose receiver has gone (a client that hung up)
//! cancels its sequence at the next step and frees the slot. Per-sequence
//! text handling (stop strings held back until they can no longer match,
//! UTF-8 never split) is [`crate::generate::Session`]'s, so a batched
//! sequence produces exactly what a lone session would.
//!
//! Speculative decoding ([`Scheduler::start_speculative`]) works per
//! sequence inside the same step: each decoding sequence's drafter (a
//! draft model, batched over the sequences in passes of its own, or prompt
//! lookup) proposes up to [`DraftParams::max`] tokens, and the step's one
//! target pass evaluates each sequence's pending token and its drafts, every
//! row with logits. Each row is sampled with the sequence's own sampler,
//! exactly as plain decoding would sample it, and the sampled token is
//! compared with the draft ("sample and compare",
//! `docs/decisions/0030-server-speculation-sample-and-compare.md`): equal,
//! the draft is kept and the next row is sampled; different, the sampled
//! token replaces the draft and the sequence's step ends. So a seeded
//! request draws the very stream of random numbers plain decoding draws,
//! and a constraint (JSON mode) masks every row as it masks a plain one.
//! Rolling back is free: rows of rejected drafts lie past the slot's
//! history and the next pass overwrites them (target and draft caches alike).
//!
//! An embedding request ([`SeqRequest::embed`]) is a sequence that only
//! prefills: it queues, takes a slot and is chunked within the same `n_batch`
//! budget as any prompt, but its chunks go through a second forward pass of
//! the step that returns the normed hidden states
//! ([`Model::forward_hidden`]) instead of logits — the vocabulary-wide head
//! would cost more than the rest of the model on a small one, and a mixed
//! pass would run it for every pooled row. Pooled as its
//! [`Pooling`] says, the vector goes out as [`SeqEvent::Embedding`].

use crate::generate::held_back;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::backend::{Batch, DeviceBackend};
use crate::embed::Pooling;
use crate::generate::{FinishReason, GeneratedToken};
use crate::model::{Context, Model, ModelError};
use crate::sampling::{Sampled, Sampler, SamplingError, SamplingParams, TopRows};
use crate::speculative::{DraftParams, Drafter, Lookup, MAX_DRAFT};
use crate::tokenizer::{Detokenizer, Tokenizer};

/// How the engine is sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Sequences decoded together (KV slots).
    pub n_slots: usize,
    /// Positions per slot (prompt plus generated tokens of one sequence).
    pub n_ctx: usize,
    /// Most tokens in one forward pass (decode tokens first, then prefill).
    pub n_batch: usize,
    /// Requests that may wait for a slot; more are refused.
    pub queue_capacity: usize,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            n_slots: 4,
            n_ctx: 4096,
            n_batch: 256,
            queue_capacity: 64,
        }
    }
}

/// What drafts for the engine's speculative decoding.
pub enum SpecDrafter<B: DeviceBackend> {
    /// A smaller model with the target's vocabulary (checked by the caller,
    /// [`crate::speculative::check_vocab`]), drafting greedily; drafting
    /// stops at a token it gives less than `p_min` probability (0: never).
    Model {
        /// The draft model (boxed: the variants differ much in size).
        model: Box<Model<B>>,
        /// llama.cpp's `--draft-p-min`.
        p_min: f32,
    },
    /// Prompt lookup: no model.
    Lookup(Lookup),
}

/// Speculative decoding for every sequence (see the module doc).
pub struct SpecConfig<B: DeviceBackend> {
    /// The drafter.
    pub drafter: SpecDrafter<B>,
    /// Draft sizes of a request that names none ([`SeqRequest::draft`]).
    pub params: DraftParams,
}

/// Why the engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum SchedulerError {
    /// A configuration value that cannot work.
    #[error("scheduler configuration: {0}")]
    Config(String),
    /// The KV cache could not be made.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// The engine thread could not be spawned.
    #[error("cannot start the engine thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// Why a request was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The wait queue is full; try again later.
    #[error("the server is busy: {waiting} requests are already waiting (capacity {capacity})")]
    QueueFull {
        /// Requests waiting.
        waiting: usize,
        /// The queue's capacity.
        capacity: usize,
    },
    /// The engine is shutting down and takes no new work.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// An empty prompt.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt leaves no room in a slot for even one generated token (an
    /// embedding's input: does not fit a slot).
    #[error("the prompt is {n_prompt} tokens, but a sequence holds at most {n_ctx} tokens (prompt and completion); shorten the prompt")]
    PromptTooLong {
        /// Prompt tokens.
        n_prompt: usize,
        /// Positions per slot.
        n_ctx: usize,
    },
    /// A prompt token outside the vocabulary.
    #[error("prompt token {token} at position {position} is outside the vocabulary of {n_vocab}")]
    BadToken {
        /// Where in the prompt.
        position: usize,
        /// The id.
        token: u32,
        /// Vocabulary size.
        n_vocab: usize,
    },
    /// Sampling parameters out of range.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// Draft sizes out of range.
    #[error("draft sizes: at most {max} drafts (allowed 0..={MAX_DRAFT}) and at least {min} (allowed 0..=max)")]
    Draft {
        /// The most drafts asked for.
        max: usize,
        /// The fewest.
        min: usize,
    },
}

/// Restricts which tokens may come next (JSON mode, grammars). The engine
/// calls [`mask`](TokenConstraint::mask) on the raw logits before sampling and
/// [`accept`](TokenConstraint::accept) with the token sampled.
pub trait TokenConstraint: Send {
    /// Sets the logit of every token that may not come next to `-inf`.
    fn mask(&mut self, logits: &mut [f32]);
    /// Advances past `token` (one [`mask`](TokenConstraint::mask) allowed).
    fn accept(&mut self, token: u32);
    /// The output is complete: the sequence ends with [`FinishReason::Stop`].
    fn is_complete(&self) -> bool;
}

/// What a sequence reports, in order: `Started`, any `Token`s, then exactly
/// one of `Done` or `Failed`.
#[derive(Debug, Clone, PartialEq)]
pub enum SeqEvent {
    /// The sequence has a slot and its prompt is being evaluated.
    Started {
        /// Prompt tokens found in the slot's cache (not evaluated again).
        n_cached: usize,
    },
    /// A generated token with the text it released.
    Token(GeneratedToken),
    /// An embedding request's vector, pooled but not normalized (with
    /// [`Pooling::None`], one `n_embd` row per prompt token, in order);
    /// `Done` follows.
    Embedding(Vec<f32>),
    /// The sequence ended.
    Done(SeqSummary),
    /// The engine failed on this sequence (a backend error).
    Failed(String),
}

/// How a sequence ended.
#[derive(Debug, Clone, PartialEq)]
pub struct SeqSummary {
    /// Why it ended.
    pub finish: FinishReason,
    /// Text released at the end that no token carried (see [`crate::generate::StreamEvent::Tail`]).
    pub tail: String,
    /// Prompt tokens.
    pub n_prompt: usize,
    /// Prompt tokens reused from the cache.
    pub n_cached: usize,
    /// Tokens generated (including a final end-of-generation token).
    pub n_generated: usize,
    /// From submission to the first token (or to the end, if none came).
    pub time_to_first_token: Duration,
    /// From the first token to the end.
    pub decode_time: Duration,
    /// Drafted tokens the target verified (0 without speculation).
    pub n_drafted: usize,
    /// Of those, tokens the target kept.
    pub n_draft_accepted: usize,
}

/// Where a sequence's events go. Implemented by the transport (a channel to an
/// HTTP response); `send` returning `false` means nobody is listening any more.
pub trait EventSink: Send {
    /// Delivers one event; `false` if the receiver is gone.
    fn send(&mut self, event: SeqEvent) -> bool;
    /// Whether the receiver is gone (checked every step, so a sequence whose
    /// client hung up stops even while it produces no text).
    fn is_closed(&self) -> bool;
}

/// One sequence to generate.
pub struct SeqRequest {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Most tokens to generate (`None`: until a stop or a full slot).
    pub max_tokens: Option<usize>,
    /// Stop strings: generation ends before the first occurrence.
    pub stop: Vec<String>,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Keep going past end-of-generation tokens.
    pub ignore_eos: bool,
    /// Reuse the cached prefix a slot holds of the prompt (llama-server's
    /// `cache_prompt`). The batched products round differently from one
    /// token's, so a reused prefix can move a token at a near tie; false
    /// evaluates the whole prompt, as the first request for it did.
    pub cache_prompt: bool,
    /// Restricts the tokens sampled.
    pub constraint: Option<Box<dyn TokenConstraint>>,
    /// Draft sizes for this sequence (`None`: the engine's; `max` 0: no
    /// speculation). Ignored by an engine started without a drafter.
    pub draft: Option<DraftParams>,
    /// An embedding instead of a completion: the prompt is evaluated (it
    /// may fill the slot), nothing is generated, and the final hidden
    /// states pooled this way come back as [`SeqEvent::Embedding`]. The
    /// generation fields are ignored.
    pub embed: Option<Pooling>,
    /// Where the events go.
    pub sink: Box<dyn EventSink>,
}

/// Counters the engine keeps (all monotonic except the gauges noted).
#[derive(Debug, Default)]
pub struct SchedulerStats {
    /// Sequences accepted into the queue.
    pub submitted: AtomicU64,
    /// Sequences refused because the queue was full.
    pub rejected_full: AtomicU64,
    /// Sequences that ended (any reason).
    pub finished: AtomicU64,
    /// Sequences ended because their client went away or shutdown cancelled them.
    pub cancelled: AtomicU64,
    /// Sequences that failed in the engine.
    pub failed: AtomicU64,
    /// Prompt tokens of started sequences.
    pub prompt_tokens: AtomicU64,
    /// Of those, tokens reused from a slot's cache.
    pub cached_prompt_tokens: AtomicU64,
    /// Tokens generated.
    pub generated_tokens: AtomicU64,
    /// Forward passes.
    pub steps: AtomicU64,
    /// Tokens in all forward passes.
    pub batch_tokens: AtomicU64,
    /// Microseconds spent in forward passes and sampling.
    pub busy_us: AtomicU64,
    /// Of those, nanoseconds in the forward passes (the logits read back
    /// included).
    pub forward_ns: AtomicU64,
    /// Of those, nanoseconds drawing the samples (every sequence's, on the
    /// host's threads).
    pub sample_ns: AtomicU64,
    /// Sum of times to first token, microseconds.
    pub ttft_us_sum: AtomicU64,
    /// Sequences that reached a first token (or ended before one).
    pub ttft_count: AtomicU64,
    /// Gauge: sequences holding a slot.
    pub active: AtomicU64,
    /// Gauge: sequences waiting for a slot.
    pub waiting: AtomicU64,
    /// Gauge: the device's memory in use, bytes, read at most once a second
    /// by the engine (0 on the host: [`DeviceBackend::device_memory`]).
    pub device_memory_used: AtomicU64,
    /// Gauge: the device's memory in all, bytes (0 on the host).
    pub device_memory_total: AtomicU64,
    /// Time to first token histogram: counts at or below each bound of [`TTFT_BUCKETS_S`] (cumulative).
    pub ttft_buckets: [AtomicU64; TTFT_BUCKETS_S.len()],
    /// Drafted tokens the target verified.
    pub draft_tokens: AtomicU64,
    /// Of those, tokens the target kept.
    pub draft_tokens_accepted: AtomicU64,
    /// Logits rows sampled from a top-k selection made where the logits
    /// are ([`DeviceBackend::selects_top_k`]).
    pub rows_selected: AtomicU64,
    /// Logits rows read back whole and sampled on the host.
    pub rows_whole: AtomicU64,
    /// Gauge: positions the KV cache holds over every slot (running
    /// sequences and the prefixes finished ones keep for reuse), set each
    /// step before its replies go out.
    pub kv_cache_tokens: AtomicU64,
}

/// Upper bounds (seconds) of the time-to-first-token histogram buckets.
pub const TTFT_BUCKETS_S: [f64; 10] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

impl SchedulerStats {
    fn record_ttft(&self, d: Duration) {
        self.ttft_us_sum
            .fetch_add(d.as_micros() as u64, Ordering::Relaxed);
        self.ttft_count.fetch_add(1, Ordering::Relaxed);
        let s = d.as_secs_f64();
        for (b, c) in TTFT_BUCKETS_S.iter().zip(&self.ttft_buckets) {
            if s <= *b {
                c.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

struct Queued {
    req: SeqRequest,
    sampler: Sampler,
    submitted: Instant,
}

struct QueueState {
    items: VecDeque<Queued>,
    /// No new submissions.
    draining: bool,
    /// Cancel everything active and queued, then exit.
    stop: bool,
}

struct Shared {
    cfg: SchedulerConfig,
    n_vocab: usize,
    /// Default draft sizes, when the engine speculates.
    spec: Option<DraftParams>,
    n_embd: usize,
    /// Sample from top-k selections made where the logits are
    /// ([`DeviceBackend::selects_top_k`]) when the samplers can.
    select_top: bool,
    queue: Mutex<QueueState>,
    wake: Condvar,
    stats: SchedulerStats,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A handle to the engine: submit work, read stats, shut down. Cheap to clone.
#[derive(Clone)]
pub struct Scheduler {
    shared: Arc<Shared>,
}

impl Scheduler {
    /// Starts the engine thread, which owns `model`. The thread ends after
    /// [`Scheduler::shutdown`] once its sequences are done.
    pub fn start<B: DeviceBackend + 'static>(
        model: Model<B>,
        tokenizer: Arc<Tokenizer>,
        cfg: SchedulerConfig,
    ) -> Result<(Scheduler, JoinHandle<()>), SchedulerError> {
        Scheduler::start_speculative(model, tokenizer, cfg, None)
    }

    /// As [`Scheduler::start`], decoding every sequence speculatively with
    /// `spec`'s drafter (none: plainly). A draft model gets a KV cache of its
    /// own, as many slots of as many positions as the target's.
    pub fn start_speculative<B: DeviceBackend + 'static>(
        model: Model<B>,
        tokenizer: Arc<Tokenizer>,
        cfg: SchedulerConfig,
        spec: Option<SpecConfig<B>>,
    ) -> Result<(Scheduler, JoinHandle<()>), SchedulerError> {
        let select_top = model.backend().selects_top_k();
        Scheduler::launch(model, tokenizer, cfg, spec, select_top)
    }

    /// As [`Scheduler::start`], sampling from top-k selections wherever the
    /// samplers can, whatever the backend (the tests' way onto the path a
    /// GPU takes, with the host's selection).
    #[cfg(test)]
    fn start_selecting_top_k<B: DeviceBackend + 'static>(
        model: Model<B>,
        tokenizer: Arc<Tokenizer>,
        cfg: SchedulerConfig,
    ) -> Result<(Scheduler, JoinHandle<()>), SchedulerError> {
        Scheduler::launch(model, tokenizer, cfg, None, true)
    }

    fn launch<B: DeviceBackend + 'static>(
        model: Model<B>,
        tokenizer: Arc<Tokenizer>,
        cfg: SchedulerConfig,
        spec: Option<SpecConfig<B>>,
        select_top: bool,
    ) -> Result<(Scheduler, JoinHandle<()>), SchedulerError> {
        if let Some(p) = spec.as_ref().map(|s| s.params).filter(|p| !p.is_valid()) {
            return Err(SchedulerError::Config(SubmitError::Draft { max: p.max, min: p.min }.to_string()));
        }
        if cfg.n_slots == 0 || cfg.n_ctx < 2 || cfg.n_batch == 0 {
            return Err(SchedulerError::Config(format!(
                "need at least 1 slot, 2 positions and a batch of 1 (got {} slots, {} positions, batch {})",
                cfg.n_slots, cfg.n_ctx, cfg.n_batch
            )));
        }
        // Batches here depend on load, and prompt prefixes are reused: one
        // rounding (8-bit activations) at every batch size. The batched
        // GEMM still sums in another order than one token's dot products,
        // so a request is reproduced exactly only at the same batch sizes
        // (README, "CPU kernels").
        model.backend().prefer_exact_products();
        let ctx = model.new_context(cfg.n_ctx, cfg.n_slots)?;
        let draft_ctx = match spec.as_ref().map(|s| &s.drafter) {
            Some(SpecDrafter::Model { model: d, .. }) => {
                if d.n_logits() > model.n_vocab() {
                    return Err(SchedulerError::Config(format!(
                        "the draft model has {} logits per token but the target's vocabulary {} tokens",
                        d.n_logits(),
                        model.n_vocab()
                    )));
                }
                // Its passes are batched by load as well: keep its drafts reproducible.
                d.backend().prefer_exact_products();
                Some(d.new_context(cfg.n_ctx, cfg.n_slots)?)
            }
            _ => None,
        };
        let shared = Arc::new(Shared {
            cfg,
            n_vocab: model.n_vocab(),
            spec: spec.as_ref().map(|s| s.params),
            n_embd: model.config().n_embd,
            select_top,
            queue: Mutex::new(QueueState {
                items: VecDeque::new(),
                draining: false,
                stop: false,
            }),
            wake: Condvar::new(),
            stats: SchedulerStats::default(),
        });
        let s2 = Arc::clone(&shared);
        let handle = std::thread::Builder::new()
            .name("ferrox-engine".into())
            .spawn(move || {
                let drafter = match (&spec, draft_ctx) {
                    (Some(SpecConfig { drafter: SpecDrafter::Model { model: d, p_min }, .. }), Some(dctx)) => {
                        Some(EngineDrafter::Model { model: &**d, ctx: dctx, p_min: *p_min })
                    }
                    (Some(SpecConfig { drafter: SpecDrafter::Lookup(l), .. }), _) => Some(EngineDrafter::Lookup(*l)),
                    _ => None,
                };
                Engine::new(&model, &tokenizer, ctx, &s2, drafter).run()
            })?;
        Ok((Scheduler { shared }, handle))
    }

    /// The configuration in use.
    pub fn config(&self) -> SchedulerConfig {
        self.shared.cfg
    }

    /// The default draft sizes when the engine decodes speculatively.
    pub fn speculative(&self) -> Option<DraftParams> {
        self.shared.spec
    }

    /// The width of an embedding (the model's hidden size).
    pub fn n_embd(&self) -> usize {
        self.shared.n_embd
    }

    /// The engine's counters.
    pub fn stats(&self) -> &SchedulerStats {
        &self.shared.stats
    }

    /// Queues one sequence.
    pub fn submit(&self, req: SeqRequest) -> Result<(), SubmitError> {
        self.submit_all(vec![req])
    }

    /// Queues sequences all together or none (the `n` choices of one request).
    pub fn submit_all(&self, reqs: Vec<SeqRequest>) -> Result<(), SubmitError> {
        let cfg = self.shared.cfg;
        let mut prepared = Vec::with_capacity(reqs.len());
        for req in reqs {
            if req.prompt.is_empty() {
                return Err(SubmitError::EmptyPrompt);
            }
            // A completion needs room for one generated token; an embedding does not.
            let room = usize::from(req.embed.is_none());
            if req.prompt.len() + room > cfg.n_ctx {
                return Err(SubmitError::PromptTooLong {
                    n_prompt: req.prompt.len(),
                    n_ctx: cfg.n_ctx,
                });
            }
            if let Some((position, &token)) = req
                .prompt
                .iter()
                .enumerate()
                .find(|(_, &t)| t as usize >= self.shared.n_vocab)
            {
                return Err(SubmitError::BadToken {
                    position,
                    token,
                    n_vocab: self.shared.n_vocab,
                });
            }
            if let Some(p) = req.draft.filter(|p| !p.is_valid()) {
                return Err(SubmitError::Draft { max: p.max, min: p.min });
            }
            let sampler = Sampler::new(req.sampling.clone(), self.shared.n_vocab)?;
            prepared.push(Queued {
                req,
                sampler,
                submitted: Instant::now(),
            });
        }
        let stats = &self.shared.stats;
        let mut q = self.shared.lock();
        if q.draining || q.stop {
            return Err(SubmitError::ShuttingDown);
        }
        if q.items.len() + prepared.len() > cfg.queue_capacity {
            stats
                .rejected_full
                .fetch_add(prepared.len() as u64, Ordering::Relaxed);
            return Err(SubmitError::QueueFull {
                waiting: q.items.len(),
                capacity: cfg.queue_capacity,
            });
        }
        stats
            .submitted
            .fetch_add(prepared.len() as u64, Ordering::Relaxed);
        q.items.extend(prepared);
        stats.waiting.store(q.items.len() as u64, Ordering::Relaxed);
        drop(q);
        self.shared.wake.notify_all();
        Ok(())
    }

    /// Stops taking new work; what is queued or running continues.
    pub fn drain(&self) {
        self.shared.lock().draining = true;
        self.shared.wake.notify_all();
    }

    /// Cancels everything queued or running (each ends with
    /// [`FinishReason::Cancelled`]) and ends the engine thread.
    pub fn shutdown(&self) {
        let mut q = self.shared.lock();
        q.draining = true;
        q.stop = true;
        drop(q);
        self.shared.wake.notify_all();
    }

    /// Sequences waiting or running.
    pub fn in_flight(&self) -> usize {
        let q = self.shared.lock();
        q.items.len() + self.shared.stats.active.load(Ordering::Relaxed) as usize
    }
}

/// A sequence holding a slot.
struct Active<'t> {
    req: SeqRequest,
    sampler: Sampler,
    detok: Detokenizer<'t>,
    text: String,
    emitted: usize,
    n_cached: usize,
    n_generated: usize,
    /// Next prompt index to evaluate; `prompt.len()` once prefilled.
    prefill_pos: usize,
    /// A sampled token whose KV is not yet in the cache.
    pending: Option<u32>,
    submitted: Instant,
    first_token: Option<Instant>,
    /// Draft sizes in force (`max` 0: none).
    draft: DraftParams,
    /// Drafts verified, and kept.
    n_drafted: usize,
    n_draft_accepted: usize,
    /// An embedding's hidden states read so far.
    embed: Option<EmbedAcc>,
}

/// What an embedding sequence has read of its hidden states.
struct EmbedAcc {
    pooling: Pooling,
    /// The rows read (none, cls, last).
    rows: Vec<f32>,
    /// Their sum, for the mean.
    sum: Vec<f64>,
}

/// What one logits row gave a sequence ([`Engine::step`]).
enum Outcome {
    /// A token, and whether the constraint (if any) is complete after it.
    Token(Sampled, bool),
    /// The slot's context is full: nothing was sampled.
    Full,
    /// Sampling failed.
    Failed(SamplingError),
}

/// One sequence's sampling, done on the pool ([`Engine::step`]): its rows
/// (the pending token's and one per draft), sampled in order until a draft
/// is rejected.
struct SampleJob<'s, 't> {
    slot_index: usize,
    slot: &'s mut Slot<'t>,
    rows: JobRows<'s>,
    /// The drafts verified after the pending token.
    drafts: &'s [u32],
    outcomes: Vec<Outcome>,
    accepted: usize,
}

/// A [`SampleJob`]'s rows: whole logits rows, or those rows' top-k
/// selections (`count` rows of `top` from row `first`).
enum JobRows<'s> {
    Logits(&'s mut [f32]),
    Top { top: &'s TopRows, first: usize, count: usize },
}

struct Slot<'t> {
    /// Tokens whose keys and values the slot's cache holds, in order.
    history: Vec<u32>,
    /// Tokens the draft model's cache holds for this slot, in order.
    draft_history: Vec<u32>,
    seq: Option<Active<'t>>,
    /// When the slot was last given a sequence (prefill goes oldest first).
    started: u64,
}

/// The engine's drafter (the model borrowed from the engine thread).
enum EngineDrafter<'a, B: DeviceBackend> {
    Model { model: &'a Model<B>, ctx: Context<B>, p_min: f32 },
    Lookup(Lookup),
}

struct Engine<'a, B: DeviceBackend> {
    model: &'a Model<B>,
    tok: &'a Tokenizer,
    ctx: Context<B>,
    shared: &'a Shared,
    slots: Vec<Slot<'a>>,
    admitted: u64,
    drafter: Option<EngineDrafter<'a, B>>,
    /// When the device's memory was last read into the stats.
    memory_read: Option<Instant>,
}

/// Where logits rows go after a forward pass: `rows` rows of one slot.
struct RowOwner {
    slot: usize,
    rows: usize,
}

impl<'a, B: DeviceBackend> Engine<'a, B> {
    fn new(model: &'a Model<B>, tok: &'a Tokenizer, ctx: Context<B>, shared: &'a Shared, drafter: Option<EngineDrafter<'a, B>>) -> Self {
        let slots = (0..shared.cfg.n_slots)
            .map(|_| Slot {
                history: Vec::new(),
                draft_history: Vec::new(),
                seq: None,
                started: 0,
            })
            .collect();
        Engine {
            model,
            tok,
            ctx,
            shared,
            slots,
            admitted: 0,
            drafter,
            memory_read: None,
        }
    }

    fn n_active(&self) -> usize {
        self.slots.iter().filter(|s| s.seq.is_some()).count()
    }

    fn run(mut self) {
        self.read_memory();
        loop {
            let stop = {
                let mut q = self.shared.lock();
                while !q.stop && self.n_active() == 0 && q.items.is_empty() {
                    q = self.shared.wake.wait(q).unwrap_or_else(|p| p.into_inner());
                }
                if q.stop {
                    let queued: Vec<Queued> = q.items.drain(..).collect();
                    drop(q);
                    for mut item in queued {
                        self.shared.stats.cancelled.fetch_add(1, Ordering::Relaxed);
                        self.shared.stats.finished.fetch_add(1, Ordering::Relaxed);
                        let summary = SeqSummary {
                            finish: FinishReason::Cancelled,
                            tail: String::new(),
                            n_prompt: item.req.prompt.len(),
                            n_cached: 0,
                            n_generated: 0,
                            time_to_first_token: item.submitted.elapsed(),
                            decode_time: Duration::ZERO,
                            n_drafted: 0,
                            n_draft_accepted: 0,
                        };
                        item.req.sink.send(SeqEvent::Done(summary));
                    }
                    true
                } else {
                    self.admit(&mut q);
                    false
                }
            };
            self.shared
                .stats
                .waiting
                .store(self.shared.lock().items.len() as u64, Ordering::Relaxed);
            if stop {
                for i in 0..self.slots.len() {
                    if self.slots[i].seq.is_some() {
                        self.finish(i, FinishReason::Cancelled);
                    }
                }
                self.shared.stats.active.store(0, Ordering::Relaxed);
                return;
            }
            // A client that hung up frees its slot before the step is built.
            for i in 0..self.slots.len() {
                if self.slots[i]
                    .seq
                    .as_ref()
                    .is_some_and(|s| s.req.sink.is_closed())
                {
                    self.finish(i, FinishReason::Cancelled);
                }
            }
            self.shared
                .stats
                .active
                .store(self.n_active() as u64, Ordering::Relaxed);
            if self.n_active() > 0 {
                // A bug in one step must not take the server down: the
                // sequences of that step fail, their slots forget their
                // (possibly half-written) cache, and the engine goes on.
                if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.step())).is_err() {
                    self.fail_all("the engine hit an internal error on this request (a panic; see the server log)");
                }
                // The gauge must not show a finished sequence while the engine sleeps.
                self.shared
                    .stats
                    .active
                    .store(self.n_active() as u64, Ordering::Relaxed);
            }
        }
    }

    /// Moves queued requests into free slots, each into the free slot whose
    /// history shares the longest prefix with its prompt.
    fn admit(&mut self, q: &mut QueueState) {
        while !q.items.is_empty() {
            let free: Vec<usize> = (0..self.slots.len())
                .filter(|&i| self.slots[i].seq.is_none())
                .collect();
            if free.is_empty() {
                return;
            }
            let Some(item) = q.items.pop_front() else {
                return;
            };
            let prompt = &item.req.prompt;
            // Pooling other than the last token's needs the hidden state of
            // every token the pooling reads from the start, which no cache holds.
            let reuse = item.req.cache_prompt && matches!(item.req.embed, None | Some(Pooling::Last));
            let lcp = |h: &[u32]| match reuse {
                true => h.iter().zip(prompt).take_while(|(a, b)| a == b).count(),
                false => 0,
            };
            // Ties go to the shortest history, leaving long cached ones for
            // requests that may share them.
            let best = free
                .iter()
                .copied()
                .max_by_key(|&i| {
                    (
                        lcp(&self.slots[i].history),
                        std::cmp::Reverse(self.slots[i].history.len()),
                    )
                })
                .unwrap_or(free[0]);
            let slot = &mut self.slots[best];
            let common = lcp(&slot.history);
            // The last prompt token is always evaluated: its logits are needed.
            let start = common.min(prompt.len() - 1);
            let embed = item.req.embed.map(|pooling| EmbedAcc {
                pooling,
                rows: Vec::new(),
                sum: match pooling {
                    Pooling::Mean => vec![0.0; self.model.config().n_embd],
                    _ => Vec::new(),
                },
            });
            slot.history.truncate(start);
            self.admitted += 1;
            slot.started = self.admitted;
            let stats = &self.shared.stats;
            stats
                .prompt_tokens
                .fetch_add(prompt.len() as u64, Ordering::Relaxed);
            stats
                .cached_prompt_tokens
                .fetch_add(start as u64, Ordering::Relaxed);
            let Queued {
                mut req,
                sampler,
                submitted,
            } = item;
            req.sink.send(SeqEvent::Started { n_cached: start });
            let draft = match self.shared.spec {
                Some(default) => req.draft.unwrap_or(default),
                None => DraftParams { max: 0, min: 0 },
            };
            slot.seq = Some(Active {
                req,
                sampler,
                detok: Detokenizer::new(self.tok, false),
                text: String::new(),
                emitted: 0,
                n_cached: start,
                n_generated: 0,
                prefill_pos: start,
                pending: None,
                submitted,
                first_token: None,
                draft,
                n_drafted: 0,
                n_draft_accepted: 0,
                embed,
            });
        }
    }

    /// One forward pass over every active sequence, then the samples of each
    /// sequence that got logits: one, or with drafts up to one per draft
    /// kept plus the target's own next token.
    fn step(&mut self) {
        let t0 = Instant::now();
        let n_batch = self.shared.cfg.n_batch;
        let drafts = self.draft_all();
        let mut batch = Batch::default();
        let mut owners: Vec<RowOwner> = Vec::new();
        // Decode tokens first: one per decoding sequence, always, each
        // followed by its drafts (positions after it, every row with logits).
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(seq) = &slot.seq {
                if let Some(t) = seq.pending {
                    let at = slot.history.len() as u32;
                    batch.push(t, at, i as u32, true);
                    for (k, &d) in drafts[i].iter().enumerate() {
                        batch.push(d, at + 1 + k as u32, i as u32, true);
                    }
                    owners.push(RowOwner { slot: i, rows: 1 + drafts[i].len() });
                }
            }
        }
        // Then prompt chunks, oldest sequence first, within the budget.
        let mut prefilling: Vec<usize> = (0..self.slots.len())
            .filter(|&i| {
                self.slots[i]
                    .seq
                    .as_ref()
                    .is_some_and(|s| s.pending.is_none() && s.prefill_pos < s.req.prompt.len())
            })
            .collect();
        prefilling.sort_by_key(|&i| self.slots[i].started);
        let mut chunks: Vec<(usize, usize, usize)> = Vec::new();
        // Embedding chunks: their own pass, which reads hidden states.
        let mut ebatch = Batch::default();
        let mut erows: Vec<usize> = Vec::new();
        for i in prefilling {
            let budget = n_batch.saturating_sub(batch.len() + ebatch.len());
            if budget == 0 {
                break;
            }
            let slot = &self.slots[i];
            let Some(seq) = slot.seq.as_ref() else {
                continue;
            };
            let (from, to) = (
                seq.prefill_pos,
                (seq.prefill_pos + budget).min(seq.req.prompt.len()),
            );
            let len = seq.req.prompt.len();
            for (k, &t) in seq.req.prompt[from..to].iter().enumerate() {
                let pos = (slot.history.len() + k) as u32;
                match &seq.embed {
                    Some(e) => {
                        let read = e.pooling.reads(from + k, len);
                        ebatch.push(t, pos, i as u32, read);
                        if read {
                            erows.push(i);
                        }
                    }
                    None => {
                        let last = from + k + 1 == len;
                        batch.push(t, pos, i as u32, last);
                        if last {
                            owners.push(RowOwner { slot: i, rows: 1 });
                        }
                    }
                }
            }
            chunks.push((i, from, to));
        }
        if batch.is_empty() && ebatch.is_empty() {
            return;
        }
        let stats = &self.shared.stats;
        let passes = u64::from(!batch.is_empty()) + u64::from(!ebatch.is_empty());
        stats.steps.fetch_add(passes, Ordering::Relaxed);
        stats
            .batch_tokens
            .fetch_add((batch.len() + ebatch.len()) as u64, Ordering::Relaxed);
        // A device that selects the samplers' candidates where the logits
        // are sends back those instead of the rows for the sequences whose
        // samplers can take them (`Sampler::needs_top`), and the others'
        // rows whole (packed in owner order, as `forward` would give them).
        let top_k = self.top_k_for(&owners);
        let mut top = TopRows::default();
        let mut whole: Vec<usize> = Vec::new();
        if let Some((_, takes)) = &top_k {
            let mut first = 0;
            for (o, &t) in owners.iter().zip(takes) {
                if !t {
                    whole.extend(first..first + o.rows);
                }
                first += o.rows;
            }
        }
        let n_rows: usize = owners.iter().map(|o| o.rows).sum();
        let n_whole = if top_k.is_some() { whole.len() } else { n_rows };
        stats.rows_selected.fetch_add((n_rows - n_whole) as u64, Ordering::Relaxed);
        stats.rows_whole.fetch_add(n_whole as u64, Ordering::Relaxed);
        let t_forward = Instant::now();
        let forward = match (batch.is_empty(), &top_k) {
            (true, _) => Ok(Vec::new()),
            (false, Some((k, _))) => {
                let mut rows = Vec::new();
                self.model.forward_top_k(&mut self.ctx, &batch, *k, &mut top, &whole, &mut rows).map(|()| rows)
            }
            (false, None) => self.model.forward(&mut self.ctx, &batch),
        };
        let logits = match forward {
            Ok(l) => l,
            Err(e) => {
                let msg = format!("the forward pass failed: {e}");
                for i in 0..self.slots.len() {
                    if let Some(mut seq) = self.slots[i].seq.take() {
                        stats.failed.fetch_add(1, Ordering::Relaxed);
                        stats.finished.fetch_add(1, Ordering::Relaxed);
                        seq.req.sink.send(SeqEvent::Failed(msg.clone()));
                        self.slots[i].history.clear();
                    }
                }
                return;
            }
        };
        let hidden = match ebatch.is_empty() {
            true => Vec::new(),
            false => match self.model.forward_hidden(&mut self.ctx, &ebatch) {
                Ok(h) => h,
                Err(e) => {
                    // Only the embeddings of this pass fail; their slots
                    // forget what the pass may have half written.
                    let msg = format!("the forward pass failed: {e}");
                    let failed: Vec<usize> = ebatch.seq.iter().map(|&s| s as usize).collect();
                    for &i in &failed {
                        if let Some(mut seq) = self.slots[i].seq.take() {
                            stats.failed.fetch_add(1, Ordering::Relaxed);
                            stats.finished.fetch_add(1, Ordering::Relaxed);
                            seq.req.sink.send(SeqEvent::Failed(msg.clone()));
                            self.slots[i].history.clear();
                        }
                    }
                    chunks.retain(|&(i, _, _)| !failed.contains(&i));
                    erows.clear();
                    Vec::new()
                }
            },
        };
        // The cache now holds what the batch evaluated; the drafts are in
        // the history until sampling cuts it back past the first rejected one.
        for (slot, d) in self.slots.iter_mut().zip(&drafts) {
            if let Some(seq) = slot.seq.as_mut() {
                if let Some(t) = seq.pending.take() {
                    slot.history.push(t);
                    slot.history.extend_from_slice(d);
                }
            }
        }
        for &(i, from, to) in &chunks {
            let slot = &mut self.slots[i];
            if let Some(seq) = slot.seq.as_mut() {
                slot.history.extend_from_slice(&seq.req.prompt[from..to]);
                seq.prefill_pos = to;
            }
        }
        let forward_ns = t_forward.elapsed().as_nanos() as u64;
        self.take_hidden(&erows, &hidden, &chunks);
        let n_vocab = self.model.n_vocab().max(1);
        let mut logits = logits;
        // Sampling (a pass or two over 262144 logits per row) runs on the
        // pool, one sequence per task: each touches only its own slot's
        // sampler, constraint and logits. Streaming stays serial, in order.
        let n_ctx = self.shared.cfg.n_ctx;
        let mut by_slot: Vec<Option<&mut Slot<'_>>> = self.slots.iter_mut().map(Some).collect();
        let mut rest: &mut [f32] = &mut logits;
        let mut work: Vec<Mutex<SampleJob<'_, '_>>> = Vec::with_capacity(owners.len());
        let mut first = 0;
        for (i, owner) in owners.iter().enumerate() {
            let selected = top_k.as_ref().is_some_and(|(_, takes)| takes[i]);
            let rows = match selected {
                true => JobRows::Top { top: &top, first, count: owner.rows.min(top.rows().saturating_sub(first)) },
                false => {
                    let take = (owner.rows * n_vocab).min(rest.len());
                    let (l, r) = std::mem::take(&mut rest).split_at_mut(take);
                    rest = r;
                    JobRows::Logits(l)
                }
            };
            first += owner.rows;
            if let Some(slot) = by_slot.get_mut(owner.slot).and_then(Option::take) {
                work.push(Mutex::new(SampleJob {
                    slot_index: owner.slot,
                    slot,
                    rows,
                    drafts: &drafts[owner.slot][..owner.rows - 1],
                    outcomes: Vec::new(),
                    accepted: 0,
                }));
            }
        }
        let task = |k: usize| {
            let mut job = work[k].lock().unwrap_or_else(|e| e.into_inner());
            let SampleJob { slot, rows, drafts, outcomes, accepted, .. } = &mut *job;
            // The history before the pending token's successor: the rows
            // sample at base, base + 1, ... (each seeing its own history).
            let base = slot.history.len() - drafts.len();
            let Some(seq) = slot.seq.as_mut() else { return };
            let n_rows = match rows {
                JobRows::Logits(l) => l.len() / n_vocab,
                JobRows::Top { count, .. } => *count,
            };
            for r in 0..n_rows {
                let len = base + r;
                if len >= n_ctx {
                    outcomes.push(Outcome::Full); // the context is full
                    break;
                }
                let sampled = match rows {
                    JobRows::Logits(l) => {
                        let row = &mut l[r * n_vocab..(r + 1) * n_vocab];
                        if let Some(c) = seq.req.constraint.as_mut() {
                            c.mask(row);
                        }
                        seq.sampler.sample(row, &slot.history[..len])
                    }
                    // (no constraint: `top_k_for` gives such a sequence whole rows)
                    JobRows::Top { top, first, .. } => seq.sampler.sample_top(top.row(*first + r)),
                };
                match sampled {
                    Err(e) => {
                        outcomes.push(Outcome::Failed(e));
                        break;
                    }
                    Ok(s) => {
                        let id = s.token;
                        let complete = seq.req.constraint.as_mut().is_some_and(|c| {
                            c.accept(id);
                            c.is_complete()
                        });
                        outcomes.push(Outcome::Token(s, complete));
                        // Sample and compare: a draft equal to the target's
                        // own sample is kept, and the next row is valid.
                        if complete || drafts.get(r) != Some(&id) {
                            break;
                        }
                        *accepted += 1;
                    }
                }
            }
            slot.history.truncate(base + *accepted);
        };
        let t_sample = Instant::now();
        ferrox_quant::cpu::ThreadPool::global().run(self.model.backend().host_threads(), work.len(), &task);
        let sample_ns = t_sample.elapsed().as_nanos() as u64;
        let results: Vec<(usize, Vec<Outcome>, usize, usize)> = work
            .into_iter()
            .map(|m| {
                let job = m.into_inner().unwrap_or_else(|e| e.into_inner());
                (job.slot_index, job.outcomes, job.drafts.len(), job.accepted)
            })
            .collect();
        let held: usize = self.slots.iter().map(|s| s.history.len()).sum();
        stats.kv_cache_tokens.store(held as u64, Ordering::Relaxed);
        for (i, outcomes, drafted, accepted) in results {
            if drafted > 0 {
                stats.draft_tokens.fetch_add(drafted as u64, Ordering::Relaxed);
                stats.draft_tokens_accepted.fetch_add(accepted as u64, Ordering::Relaxed);
                if let Some(seq) = self.slots[i].seq.as_mut() {
                    seq.n_drafted += drafted;
                    seq.n_draft_accepted += accepted;
                }
            }
            for o in outcomes {
                if self.slots[i].seq.is_none() {
                    break;
                }
                self.sample_one(i, o);
            }
        }
        // The whole step first, then its parts: a reader between the adds
        // never sees the parts past the whole (the step's replies went out
        // above, so a client may read /metrics before this).
        stats
            .busy_us
            .fetch_add(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
        stats.forward_ns.fetch_add(forward_ns, Ordering::Release);
        stats.sample_ns.fetch_add(sample_ns, Ordering::Release);
        self.read_memory();
    }

    /// When the backend selects on the device and at least one sequence
    /// with rows this step can sample from a selection (no constraint, no
    /// bias or penalties, top-k on): the candidates a row the selection
    /// keeps, and per owner whether it takes the selection (the others
    /// get their rows whole). `None`: every row whole.
    fn top_k_for(&self, owners: &[RowOwner]) -> Option<(usize, Vec<bool>)> {
        if owners.is_empty() || !self.shared.select_top || self.model.n_logits() != self.model.n_vocab() {
            return None;
        }
        let mut k = 0;
        let mut takes = Vec::with_capacity(owners.len());
        for o in owners {
            let seq = self.slots.get(o.slot)?.seq.as_ref()?;
            let need = match seq.req.constraint {
                Some(_) => None,
                None => seq.sampler.needs_top(),
            };
            k = k.max(need.unwrap_or(0));
            takes.push(need.is_some());
        }
        (k > 0).then_some((k, takes))
    }

    /// The device's memory into the stats, at most once a second (a driver
    /// call, not free at every step).
    fn read_memory(&mut self) {
        if self.memory_read.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
            return;
        }
        self.memory_read = Some(Instant::now());
        if let Some((used, total)) = self.model.backend().device_memory() {
            let stats = &self.shared.stats;
            stats.device_memory_used.store(used, Ordering::Relaxed);
            stats.device_memory_total.store(total, Ordering::Relaxed);
        }
    }

    /// Drafts for every decoding sequence that speculates: per slot, the
    /// tokens to verify after its pending token (empty: none). At most
    /// `n_batch` minus the decode tokens in all, so the target pass keeps
    /// its bound.
    fn draft_all(&mut self) -> Vec<Vec<u32>> {
        let n = self.slots.len();
        let mut out: Vec<Vec<u32>> = vec![Vec::new(); n];
        if self.drafter.is_none() {
            return out;
        }
        let cfg = self.shared.cfg;
        let n_decoding = self.slots.iter().filter(|s| s.seq.as_ref().is_some_and(|q| q.pending.is_some())).count();
        let mut room = cfg.n_batch.saturating_sub(n_decoding);
        // (slot, most drafts, fewest) for the sequences that may speculate.
        let mut want: Vec<(usize, usize, usize)> = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let Some(seq) = slot.seq.as_ref() else { continue };
            if seq.pending.is_none() || seq.draft.max == 0 {
                continue;
            }
            // Drafts sit at positions after the pending token's, inside the
            // context, and no more are useful than the sequence may still
            // emit after the pending token's successor.
            let fits = cfg.n_ctx.saturating_sub(slot.history.len() + 1);
            let left = seq.req.max_tokens.map_or(usize::MAX, |m| m.saturating_sub(seq.n_generated + 1));
            let k = seq.draft.max.min(MAX_DRAFT).min(fits).min(left).min(room);
            if k == 0 || k < seq.draft.min {
                continue;
            }
            room -= k;
            want.push((i, k, seq.draft.min));
        }
        if want.is_empty() {
            return out;
        }
        let n_vocab = self.model.n_vocab();
        match self.drafter.as_mut() {
            None => {}
            Some(EngineDrafter::Lookup(l)) => {
                for &(i, k, _) in &want {
                    let slot = &mut self.slots[i];
                    let Some(t) = slot.seq.as_ref().and_then(|s| s.pending) else { continue };
                    slot.history.push(t);
                    // Lookup cannot fail; a failure would only mean no drafts.
                    let _ = l.draft(&slot.history, k, &mut out[i]);
                    slot.history.pop();
                }
            }
            Some(EngineDrafter::Model { model, ctx, p_min }) => {
                if let Err(e) = draft_with_model(model, ctx, *p_min, &mut self.slots, &want, cfg.n_batch, &mut out) {
                    // Drafts only speed decoding up: without them the step is a
                    // plain one. The draft cache may be half written: forget it.
                    eprintln!("ferrox: warning: the draft model failed ({e}); this step decodes without drafts");
                    for slot in &mut self.slots {
                        slot.draft_history.clear();
                    }
                    out.iter_mut().for_each(Vec::clear);
                }
            }
        }
        for &(i, k, min) in &want {
            let d = &mut out[i];
            d.truncate(k);
            // A token outside the target's vocabulary ends the draft.
            if let Some(bad) = d.iter().position(|&t| t as usize >= n_vocab) {
                d.truncate(bad);
            }
            if d.len() < min {
                d.clear();
            }
        }
        out
    }

    /// Streams what one row gave slot `i`'s sequence (the constraint has
    /// already accepted the token), ending the sequence where it must end.
    fn sample_one(&mut self, i: usize, outcome: Outcome) {
        let stats = &self.shared.stats;
        let slot = &mut self.slots[i];
        let Some(seq) = slot.seq.as_mut() else { return };
        let (sampled, complete) = match outcome {
            Outcome::Token(s, complete) => (s, complete),
            Outcome::Full => {
                self.finish(i, FinishReason::ContextFull);
                return;
            }
            Outcome::Failed(e) => {
                let msg = format!("sampling failed: {e}");
                if let Some(mut seq) = slot.seq.take() {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    stats.finished.fetch_add(1, Ordering::Relaxed);
                    seq.req.sink.send(SeqEvent::Failed(msg));
                }
                return;
            }
        };
        if seq.first_token.is_none() {
            let now = Instant::now();
            seq.first_token = Some(now);
            stats.record_ttft(now - seq.submitted);
        }
        let id = sampled.token;
        seq.n_generated += 1;
        stats.generated_tokens.fetch_add(1, Ordering::Relaxed);
        let eog = self.tok.is_eog(id) && !seq.req.ignore_eos;
        if !eog {
            match seq.detok.push(id) {
                Ok(s) => seq.text.push_str(&s),
                Err(e) => {
                    let msg = format!("detokenizing failed: {e}");
                    if let Some(mut seq) = slot.seq.take() {
                        stats.failed.fetch_add(1, Ordering::Relaxed);
                        stats.finished.fetch_add(1, Ordering::Relaxed);
                        seq.req.sink.send(SeqEvent::Failed(msg));
                    }
                    return;
                }
            }
        }
        let stops = &seq.req.stop;
        let stop_at = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| seq.text.find(s.as_str()))
            .min();
        if let Some(at) = stop_at {
            seq.text.truncate(at);
        }
        let hold = if stop_at.is_some() || eog {
            0
        } else {
            held_back(&seq.text, stops)
        };
        let upto = seq.text.len() - hold;
        let released = seq.text.get(seq.emitted..upto).unwrap_or("").to_string();
        seq.emitted = upto.max(seq.emitted);
        let alive = seq.req.sink.send(SeqEvent::Token(GeneratedToken {
            sampled,
            text: released,
        }));
        if !alive {
            self.finish(i, FinishReason::Cancelled);
        } else if eog || stop_at.is_some() || complete {
            self.finish(i, FinishReason::Stop);
        } else if seq.req.max_tokens.is_some_and(|m| seq.n_generated >= m) {
            self.finish(i, FinishReason::Length);
        } else {
            seq.pending = Some(id);
        }
    }

    /// Hands each embedding its rows of `hidden` (`erows[r]`: the slot of
    /// row `r`) and ends those whose prompt is now evaluated.
    fn take_hidden(&mut self, erows: &[usize], hidden: &[f32], chunks: &[(usize, usize, usize)]) {
        let n_embd = self.model.config().n_embd;
        for (&i, row) in erows.iter().zip(hidden.chunks_exact(n_embd.max(1))) {
            let Some(e) = self.slots[i].seq.as_mut().and_then(|s| s.embed.as_mut()) else { continue };
            match e.pooling {
                Pooling::Mean => e.sum.iter_mut().zip(row).for_each(|(s, &x)| *s += f64::from(x)),
                Pooling::None | Pooling::Cls | Pooling::Last => e.rows.extend_from_slice(row),
            }
        }
        for &(i, _, to) in chunks {
            let Some(seq) = self.slots[i].seq.as_mut() else { continue };
            if to < seq.req.prompt.len() {
                continue;
            }
            let n = seq.req.prompt.len();
            let Some(e) = seq.embed.take() else { continue };
            let v = match e.pooling {
                Pooling::Mean => e.sum.iter().map(|&s| (s / n as f64) as f32).collect(),
                Pooling::None | Pooling::Cls | Pooling::Last => e.rows,
            };
            let alive = seq.req.sink.send(SeqEvent::Embedding(v));
            self.finish(i, if alive { FinishReason::Stop } else { FinishReason::Cancelled });
        }
    }

    /// Fails every active sequence and clears its slot's history.
    fn fail_all(&mut self, msg: &str) {
        let stats = &self.shared.stats;
        for slot in &mut self.slots {
            if let Some(mut seq) = slot.seq.take() {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                stats.finished.fetch_add(1, Ordering::Relaxed);
                seq.req.sink.send(SeqEvent::Failed(msg.to_string()));
            }
            slot.history.clear();
            slot.draft_history.clear();
        }
    }

    /// Ends slot `i`'s sequence and frees the slot (its history stays cached).
    fn finish(&mut self, i: usize, finish: FinishReason) {
        let Some(mut seq) = self.slots[i].seq.take() else {
            return;
        };
        let stats = &self.shared.stats;
        let mut tail = String::new();
        if finish != FinishReason::Stop {
            // Release what was held back for a stop string that never came.
            let rest = seq.detok.finish();
            seq.text.push_str(&rest);
            tail = seq.text.get(seq.emitted..).unwrap_or("").to_string();
        }
        let now = Instant::now();
        let ttft = match seq.first_token {
            Some(t) => t - seq.submitted,
            // An embedding has no first token: it stays out of the histogram.
            None if seq.req.embed.is_some() => now - seq.submitted,
            None => {
                stats.record_ttft(now - seq.submitted);
                now - seq.submitted
            }
        };
        if finish == FinishReason::Cancelled {
            stats.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        stats.finished.fetch_add(1, Ordering::Relaxed);
        let summary = SeqSummary {
            finish,
            tail,
            n_prompt: seq.req.prompt.len(),
            n_cached: seq.n_cached,
            n_generated: seq.n_generated,
            time_to_first_token: ttft,
            decode_time: seq.first_token.map_or(Duration::ZERO, |t| now - t),
            n_drafted: seq.n_drafted,
            n_draft_accepted: seq.n_draft_accepted,
        };
        seq.req.sink.send(SeqEvent::Done(summary));
    }
}

/// The draft model's proposals for the slots of `want` (slot, most drafts,
/// fewest), into `out`: one pass brings each slot's draft cache up to its
/// sequence (the pending token included; at most `n_batch` tokens in all —
/// a slot that does not fit catches up in part and drafts at a later step),
/// then one pass per further draft over every slot still drafting. Greedy:
/// each draft is the draft model's argmax, stopping below `p_min`.
fn draft_with_model<B: DeviceBackend>(
    model: &Model<B>,
    ctx: &mut Context<B>,
    p_min: f32,
    slots: &mut [Slot<'_>],
    want: &[(usize, usize, usize)],
    n_batch: usize,
    out: &mut [Vec<u32>],
) -> Result<(), ModelError> {
    let pass = |ctx: &mut Context<B>, b: &Batch| -> Result<Vec<(u32, f32)>, ModelError> {
        if p_min > 0.0 {
            let logits = model.forward(ctx, b)?;
            Ok(logits.chunks_exact(model.n_logits().max(1)).map(crate::speculative::top_prob).collect())
        } else {
            Ok(model.forward_argmax(ctx, b)?.into_iter().map(|t| (t, 1.0)).collect())
        }
    };
    let mut budget = n_batch;
    let mut b = Batch::default();
    // (slot, most drafts) of the slots whose last token has an output row.
    let mut going: Vec<(usize, usize)> = Vec::new();
    for &(i, k, _) in want {
        let slot = &mut slots[i];
        let Some(pending) = slot.seq.as_ref().and_then(|s| s.pending) else { continue };
        let len = slot.history.len() + 1;
        let at = |p: usize| if p < slot.history.len() { slot.history[p] } else { pending };
        let common = (0..len.min(slot.draft_history.len())).take_while(|&p| slot.draft_history[p] == at(p)).count();
        // The last token is always evaluated: its output is the first draft.
        let from = common.min(len - 1);
        let to = len.min(from + budget);
        if to == from {
            continue;
        }
        let toks: Vec<u32> = (from..to).map(at).collect();
        for (j, &t) in toks.iter().enumerate() {
            b.push(t, (from + j) as u32, i as u32, from + j + 1 == len);
        }
        slot.draft_history.truncate(from);
        slot.draft_history.extend_from_slice(&toks);
        budget -= to - from;
        if to == len {
            going.push((i, k));
        }
    }
    if b.is_empty() {
        return Ok(());
    }
    let mut next = pass(ctx, &b)?;
    while !going.is_empty() {
        if next.len() != going.len() {
            return Err(ModelError::Batch("the draft pass returned the wrong number of tokens".into()));
        }
        let mut b = Batch::default();
        let mut still = Vec::with_capacity(going.len());
        for (&(i, k), &(t, p)) in going.iter().zip(&next) {
            if p < p_min {
                continue;
            }
            out[i].push(t);
            // The last draft is never evaluated here: the target does that.
            if out[i].len() < k {
                let h = &mut slots[i].draft_history;
                b.push(t, h.len() as u32, i as u32, true);
                h.push(t);
                still.push((i, k));
            }
        }
        going = still;
        if going.is_empty() {
            break;
        }
        next = pass(ctx, &b)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::Arch;
    use crate::backend::cpu::Cpu;
    use crate::generate::{GenerateOptions, Session};
    use std::sync::atomic::AtomicBool;
    use std::sync::mpsc;

    #[test]
    fn text_that_may_begin_a_stop_string_is_held_back() {
        let stops = vec!["</end>".to_string(), "\n\n".to_string()];
        assert_eq!(held_back("hello </e", &stops), 3);
        assert_eq!(held_back("hello\n", &stops), 1);
        assert_eq!(held_back("hello", &stops), 0);
    }

    #[test]
    fn a_stop_string_of_multibyte_characters_is_held_back_without_panicking() {
        let stops = vec!["é!".to_string(), "\u{1F600}x".to_string()];
        assert_eq!(held_back("caf\u{e9}", &stops), 2);
        assert_eq!(held_back("abc", &stops), 0);
        assert_eq!(held_back("a\u{1F600}", &stops), 4);
    }

    /// A sink over a std channel whose receiver can be declared gone.
    struct TestSink {
        tx: mpsc::Sender<SeqEvent>,
        closed: Arc<AtomicBool>,
    }

    impl EventSink for TestSink {
        fn send(&mut self, event: SeqEvent) -> bool {
            !self.closed.load(Ordering::Relaxed) && self.tx.send(event).is_ok()
        }
        fn is_closed(&self) -> bool {
            self.closed.load(Ordering::Relaxed)
        }
    }

    fn tiny(name: &str) -> (Model<Cpu>, Arc<Tokenizer>) {
        tiny_seeded(name, 7)
    }

    fn tiny_seeded(name: &str, seed: u64) -> (Model<Cpu>, Arc<Tokenizer>) {
        // Tests run in parallel and may load the same model: each load its own file.
        static LOADS: AtomicU64 = AtomicU64::new(0);
        let n = LOADS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ferrox-sched-{}-{name}-{seed}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tiny.gguf");
        crate::testing::tiny_arch_model(Arch::Gemma3, seed)
            .unwrap()
            .write_to(&path)
            .unwrap();
        let model = Model::open(&path, Cpu::new(2)).unwrap();
        let tok = Tokenizer::from_gguf(model.file().metadata_file()).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        (model, Arc::new(tok))
    }

    fn request(
        prompt: Vec<u32>,
        max: usize,
    ) -> (SeqRequest, mpsc::Receiver<SeqEvent>, Arc<AtomicBool>) {
        let (tx, rx) = mpsc::channel();
        let closed = Arc::new(AtomicBool::new(false));
        let req = SeqRequest {
            prompt,
            max_tokens: Some(max),
            stop: Vec::new(),
            sampling: SamplingParams::greedy(),
            ignore_eos: true,
            cache_prompt: true,
            constraint: None,
            draft: None,
            embed: None,
            sink: Box::new(TestSink {
                tx,
                closed: Arc::clone(&closed),
            }),
        };
        (req, rx, closed)
    }

    /// Every event of one sequence, to its end.
    fn collect(rx: &mpsc::Receiver<SeqEvent>) -> (Vec<u32>, SeqSummary, usize) {
        let mut toks = Vec::new();
        let mut cached = usize::MAX;
        loop {
            match rx
                .recv_timeout(Duration::from_secs(60))
                .expect("the sequence never ended")
            {
                SeqEvent::Started { n_cached } => cached = n_cached,
                SeqEvent::Token(t) => toks.push(t.sampled.token),
                SeqEvent::Done(s) => return (toks, s, cached),
                SeqEvent::Failed(e) => panic!("failed: {e}"),
                SeqEvent::Embedding(_) => panic!("an embedding for a completion"),
            }
        }
    }

    /// An embedding request and its events.
    fn embed_request(prompt: Vec<u32>, pooling: Pooling) -> (SeqRequest, mpsc::Receiver<SeqEvent>) {
        let (mut r, rx, _) = request(prompt, 1);
        r.embed = Some(pooling);
        (r, rx)
    }

    /// An embedding's vector and summary.
    fn collect_embedding(rx: &mpsc::Receiver<SeqEvent>) -> (Vec<f32>, SeqSummary) {
        let mut v = None;
        loop {
            match rx.recv_timeout(Duration::from_secs(60)).expect("the embedding never ended") {
                SeqEvent::Started { .. } => {}
                SeqEvent::Embedding(e) => v = Some(e),
                SeqEvent::Token(_) => panic!("an embedding generated a token"),
                SeqEvent::Done(s) => return (v.expect("Done before the embedding"), s),
                SeqEvent::Failed(e) => panic!("failed: {e}"),
            }
        }
    }

    /// The hidden states of every token of `prompt`, from one pass of a
    /// fresh context, pooled by hand.
    fn pooled_alone(model: &Model<Cpu>, prompt: &[u32], pooling: Pooling) -> Vec<f32> {
        let mut ctx = model.new_context(64, 1).unwrap();
        let mut b = Batch::default();
        for (i, &t) in prompt.iter().enumerate() {
            b.push(t, i as u32, 0, true);
        }
        let h = model.forward_hidden(&mut ctx, &b).unwrap();
        let d = model.config().n_embd;
        assert_eq!(h.len(), prompt.len() * d);
        match pooling {
            Pooling::None => h,
            Pooling::Cls => h[..d].to_vec(),
            Pooling::Last => h[h.len() - d..].to_vec(),
            Pooling::Mean => (0..d)
                .map(|j| h.chunks_exact(d).map(|r| r[j]).sum::<f32>() / prompt.len() as f32)
                .collect(),
        }
    }

    /// Embeddings chunked through the engine (a batch of 5 tokens), several
    /// at once and beside a running completion, equal one whole-prompt pass
    /// pooled by hand; the completion is unchanged by them.
    #[test]
    fn embeddings_through_the_engine_equal_one_whole_pass_pooled() {
        let (model, tok) = tiny("embed");
        let p = prompts();
        let want: Vec<(Pooling, Vec<u32>, Vec<f32>)> = Pooling::ALL
            .iter()
            .zip(p.iter().cycle())
            // Each mode on two prompts (one of them repeats a token, whose
            // rows are all alike).
            .chain(Pooling::ALL.iter().zip(p.iter().rev()))
            .map(|(&pl, pr)| (pl, pr.clone(), pooled_alone(&model, pr, pl)))
            .collect();
        let lone: Vec<u32> = {
            let mut s = Session::new(&model, &tok, 64).unwrap();
            let opts = GenerateOptions {
                max_tokens: Some(12),
                sampling: SamplingParams::greedy(),
                ignore_eos: true,
                ..GenerateOptions::default()
            };
            s.generate(&p[0], &opts, &AtomicBool::new(false), &mut |_| {}).unwrap().tokens.iter().map(|t| t.sampled.token).collect()
        };
        let d = model.config().n_embd;
        let cfg = SchedulerConfig { n_slots: 3, n_ctx: 64, n_batch: 5, queue_capacity: 16 };
        let (sched, engine) = Scheduler::start(model, Arc::clone(&tok), cfg).unwrap();
        let (r, gen_rx, _) = request(p[0].clone(), 12);
        sched.submit(r).unwrap();
        let mut rxs = Vec::new();
        for (pl, pr, _) in &want {
            let (r, rx) = embed_request(pr.clone(), *pl);
            sched.submit(r).unwrap();
            rxs.push(rx);
        }
        for ((pl, pr, w), rx) in want.iter().zip(&rxs) {
            let (got, summary) = collect_embedding(rx);
            let rows = if *pl == Pooling::None { pr.len() } else { 1 };
            assert_eq!(got.len(), rows * d, "{pl:?}");
            let diff = got.iter().zip(w).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(diff < 1e-4, "{pl:?} over {} tokens: off by {diff}", pr.len());
            assert_eq!(summary.finish, FinishReason::Stop);
            assert_eq!((summary.n_prompt, summary.n_generated), (pr.len(), 0));
        }
        let (got, _, _) = collect(&gen_rx);
        assert_eq!(got, lone, "the completion beside the embeddings");
        assert_eq!(sched.stats().ttft_count.load(Ordering::Relaxed), 1, "embeddings have no first token");
        sched.shutdown();
        engine.join().unwrap();
    }

    /// An embedding may fill its slot (nothing is generated after it); one
    /// token more is refused.
    #[test]
    fn an_embedding_may_fill_the_slot_but_not_more() {
        let (model, tok) = tiny("embed-long");
        let cfg = SchedulerConfig { n_slots: 1, n_ctx: 8, n_batch: 3, queue_capacity: 4 };
        let (sched, engine) = Scheduler::start(model, tok, cfg).unwrap();
        let (r, rx) = embed_request(vec![5; 8], Pooling::Last);
        sched.submit(r).unwrap();
        assert!(collect_embedding(&rx).0.iter().all(|x| x.is_finite()));
        let (r, _rx) = embed_request(vec![5; 9], Pooling::Mean);
        assert!(matches!(sched.submit(r), Err(SubmitError::PromptTooLong { n_prompt: 9, n_ctx: 8 })));
        sched.shutdown();
        engine.join().unwrap();
    }

    fn prompts() -> Vec<Vec<u32>> {
        let base = crate::testing::tiny_tokens();
        vec![
            base.clone(),
            base[..5].to_vec(),
            base.iter().rev().copied().collect(),
            vec![base[1]; 3],
        ]
    }

    #[test]
    fn batched_sequences_generate_exactly_what_lone_sessions_generate() {
        let (model, tok) = tiny("batched");
        let want: Vec<Vec<u32>> = prompts()
            .iter()
            .map(|p| {
                let mut s = Session::new(&model, &tok, 64).unwrap();
                let opts = GenerateOptions {
                    max_tokens: Some(12),
                    sampling: SamplingParams::greedy(),
                    ignore_eos: true,
                    ..GenerateOptions::default()
                };
                s.generate(p, &opts, &AtomicBool::new(false), &mut |_| {})
                    .unwrap()
                    .tokens
                    .iter()
                    .map(|t| t.sampled.token)
                    .collect()
            })
            .collect();
        // 3 slots for 4 sequences (one waits), and a batch of 5 tokens so
        // prompts are chunked and share passes with other sequences' decodes.
        let cfg = SchedulerConfig {
            n_slots: 3,
            n_ctx: 64,
            n_batch: 5,
            queue_capacity: 8,
        };
        let (sched, engine) = Scheduler::start(model, Arc::clone(&tok), cfg).unwrap();
        let mut rxs = Vec::new();
        let reqs: Vec<SeqRequest> = prompts()
            .into_iter()
            .map(|p| {
                let (r, rx, _) = request(p, 12);
                rxs.push(rx);
                r
            })
            .collect();
        sched.submit_all(reqs).unwrap();
        for (i, rx) in rxs.iter().enumerate() {
            let (got, summary, _) = collect(rx);
            assert_eq!(got, want[i], "sequence {i}");
            assert_eq!(summary.finish, FinishReason::Length);
            assert_eq!(summary.n_generated, 12);
        }
        let steps = sched.stats().steps.load(Ordering::Relaxed);
        let tokens = sched.stats().batch_tokens.load(Ordering::Relaxed);
        assert!(
            tokens > steps,
            "passes held more than one token on average ({tokens} tokens in {steps} steps)"
        );
        sched.shutdown();
        engine.join().unwrap();
    }

    /// What a GPU's engine does — sampling from top-k selections of the
    /// rows instead of the rows — gives every request the tokens and
    /// log-probabilities the whole rows give, seeded sampling and greedy
    /// alike, and a request that needs whole rows (penalties) in the same
    /// passes gets them whole beside the others' selections.
    #[test]
    fn sampling_from_top_k_selections_generates_what_whole_rows_generate() {
        let cfg = SchedulerConfig { n_slots: 3, n_ctx: 64, n_batch: 5, queue_capacity: 8 };
        let sampling = |i: usize| match i {
            0 => SamplingParams::greedy(),
            1 => SamplingParams { repeat_penalty: 1.3, seed: Some(5), ..SamplingParams::default() },
            _ => SamplingParams { temperature: 1.5, top_k: 30, top_p: 0.9, top_logprobs: 3, seed: Some(i as u64), ..SamplingParams::default() },
        };
        let run = |select: bool| {
            let (model, tok) = tiny("select");
            let (sched, engine) = match select {
                true => Scheduler::start_selecting_top_k(model, tok, cfg).unwrap(),
                false => Scheduler::start(model, tok, cfg).unwrap(),
            };
            let mut rxs = Vec::new();
            let reqs: Vec<SeqRequest> = prompts()
                .into_iter()
                .enumerate()
                .map(|(i, p)| {
                    let (mut r, rx, _) = request(p, 10);
                    r.sampling = sampling(i);
                    rxs.push(rx);
                    r
                })
                .collect();
            sched.submit_all(reqs).unwrap();
            let got: Vec<Vec<Sampled>> = rxs
                .iter()
                .map(|rx| {
                    let mut toks = Vec::new();
                    loop {
                        match rx.recv_timeout(Duration::from_secs(60)).expect("the sequence never ended") {
                            SeqEvent::Token(t) => toks.push(t.sampled),
                            SeqEvent::Done(_) => break toks,
                            SeqEvent::Failed(e) => panic!("failed: {e}"),
                            _ => {}
                        }
                    }
                })
                .collect();
            let rows = (sched.stats().rows_selected.load(Ordering::Relaxed), sched.stats().rows_whole.load(Ordering::Relaxed));
            sched.shutdown();
            engine.join().unwrap();
            (got, rows)
        };
        let ((whole, rows_whole), (selected, rows_sel)) = (run(false), run(true));
        assert_eq!(rows_whole.0, 0, "no selections where the backend does not select");
        assert!(rows_sel.0 > 0 && rows_sel.1 > 0, "selected and whole rows side by side: {rows_sel:?}");
        assert_eq!(rows_sel.0 + rows_sel.1, rows_whole.1, "every row sampled once, either way");
        for (i, (w, s)) in whole.iter().zip(&selected).enumerate() {
            assert_eq!(w.len(), 10, "sequence {i}");
            assert_eq!(s, w, "sequence {i}: tokens and log-probabilities");
        }
        assert!(selected[2].iter().all(|t| t.top.len() == 3), "top_logprobs come from the selection");
    }

    #[test]
    fn a_prompt_extending_a_finished_one_reuses_its_cached_prefix() {
        let (model, tok) = tiny("prefix");
        let cfg = SchedulerConfig {
            n_slots: 2,
            n_ctx: 64,
            n_batch: 32,
            queue_capacity: 4,
        };
        let (sched, engine) = Scheduler::start(model, tok, cfg).unwrap();
        let first = crate::testing::tiny_tokens();
        let (r, rx, _) = request(first.clone(), 4);
        sched.submit(r).unwrap();
        let (gen, _, cached) = collect(&rx);
        assert_eq!(cached, 0);
        // The next turn: the first prompt, what was generated (all but the
        // last token, which was never evaluated), then new tokens.
        let mut second = first.clone();
        second.extend_from_slice(&gen);
        second.extend_from_slice(&first[..3]);
        let (r, rx, _) = request(second, 4);
        sched.submit(r).unwrap();
        let (_, summary, cached) = collect(&rx);
        assert_eq!(cached, first.len() + gen.len() - 1);
        assert_eq!(summary.n_cached, cached);
        assert_eq!(
            sched.stats().cached_prompt_tokens.load(Ordering::Relaxed),
            cached as u64
        );
        sched.shutdown();
        engine.join().unwrap();
    }

    #[test]
    fn a_full_queue_refuses_instead_of_waiting() {
        let (model, tok) = tiny("queue");
        let cfg = SchedulerConfig {
            n_slots: 1,
            n_ctx: 512,
            n_batch: 32,
            queue_capacity: 1,
        };
        let (sched, engine) = Scheduler::start(model, tok, cfg).unwrap();
        let (r1, rx1, _) = request(vec![5, 6, 7], 400);
        sched.submit(r1).unwrap();
        assert!(matches!(
            rx1.recv_timeout(Duration::from_secs(30)).unwrap(),
            SeqEvent::Started { .. }
        ));
        let (r2, _rx2, _) = request(vec![5, 6, 7], 4);
        sched.submit(r2).unwrap();
        let (r3, _rx3, _) = request(vec![5, 6, 7], 4);
        assert!(matches!(
            sched.submit(r3),
            Err(SubmitError::QueueFull {
                waiting: 1,
                capacity: 1
            })
        ));
        sched.shutdown();
        engine.join().unwrap();
    }

    #[test]
    fn a_closed_sink_cancels_its_sequence_and_frees_the_slot() {
        let (model, tok) = tiny("cancel");
        let cfg = SchedulerConfig {
            n_slots: 1,
            n_ctx: 512,
            n_batch: 32,
            queue_capacity: 4,
        };
        let (sched, engine) = Scheduler::start(model, tok, cfg).unwrap();
        let (r1, rx1, closed) = request(vec![5, 6, 7], 500);
        sched.submit(r1).unwrap();
        let (r2, rx2, _) = request(vec![8, 9], 3);
        sched.submit(r2).unwrap();
        let mut n = 0;
        while n < 3 {
            if let SeqEvent::Token(_) = rx1.recv_timeout(Duration::from_secs(30)).unwrap() {
                n += 1;
            }
        }
        closed.store(true, Ordering::Relaxed);
        // The second request can only run once the first released the one slot.
        let (got, summary, _) = collect(&rx2);
        assert_eq!(got.len(), 3);
        assert_eq!(summary.finish, FinishReason::Length);
        assert_eq!(sched.stats().cancelled.load(Ordering::Relaxed), 1);
        // Not a count of "few" tokens: how many the engine makes before this
        // thread gets to set the flag depends on scheduling (with the faster
        // kernels a tiny model made over 100 on a loaded machine). What must
        // hold is that it stopped short of its 500 and that request 2 (3
        // tokens) ran after it.
        assert!(
            sched.stats().generated_tokens.load(Ordering::Relaxed) < 500 + 3,
            "the cancelled sequence kept generating to its limit"
        );
        sched.shutdown();
        engine.join().unwrap();
    }

    #[test]
    fn prompts_that_cannot_fit_a_slot_are_refused_at_submission() {
        let (model, tok) = tiny("long");
        let cfg = SchedulerConfig {
            n_slots: 1,
            n_ctx: 8,
            n_batch: 8,
            queue_capacity: 4,
        };
        let (sched, engine) = Scheduler::start(model, tok, cfg).unwrap();
        let (r, _rx, _) = request(vec![5; 8], 4);
        assert!(matches!(
            sched.submit(r),
            Err(SubmitError::PromptTooLong {
                n_prompt: 8,
                n_ctx: 8
            })
        ));
        let (r, _rx, _) = request(vec![], 4);
        assert!(matches!(sched.submit(r), Err(SubmitError::EmptyPrompt)));
        let (r, _rx, _) = request(vec![1_000_000], 4);
        assert!(matches!(
            sched.submit(r),
            Err(SubmitError::BadToken { position: 0, .. })
        ));
        sched.shutdown();
        engine.join().unwrap();
    }

    #[test]
    fn shutdown_ends_running_and_queued_sequences_as_cancelled() {
        let (model, tok) = tiny("shutdown");
        let cfg = SchedulerConfig {
            n_slots: 1,
            n_ctx: 512,
            n_batch: 32,
            queue_capacity: 4,
        };
        let (sched, engine) = Scheduler::start(model, tok, cfg).unwrap();
        let (r1, rx1, _) = request(vec![5, 6, 7], 500);
        let (r2, rx2, _) = request(vec![5, 6, 7], 500);
        sched.submit_all(vec![r1, r2]).unwrap();
        assert!(matches!(
            rx1.recv_timeout(Duration::from_secs(30)).unwrap(),
            SeqEvent::Started { .. }
        ));
        sched.shutdown();
        engine.join().unwrap();
        assert_eq!(collect(&rx1).1.finish, FinishReason::Cancelled);
        assert_eq!(collect(&rx2).1.finish, FinishReason::Cancelled);
        let (r3, _rx3, _) = request(vec![5], 1);
        assert!(matches!(sched.submit(r3), Err(SubmitError::ShuttingDown)));
    }

    /// Restricts output to even token ids and completes after `left` tokens.
    struct EvenOnly {
        left: usize,
    }

    impl TokenConstraint for EvenOnly {
        fn mask(&mut self, logits: &mut [f32]) {
            logits.iter_mut().skip(1).step_by(2).for_each(|l| *l = f32::NEG_INFINITY);
        }
        fn accept(&mut self, _token: u32) {
            self.left = self.left.saturating_sub(1);
        }
        fn is_complete(&self) -> bool {
            self.left == 0
        }
    }

    /// One sequence of a speculative test: prompt, budget, per-request draft sizes.
    type Job = (Vec<u32>, usize, Option<DraftParams>);

    /// Each sequence's tokens and summary, and the engine's (drafted, accepted).
    type Ran = (Vec<(Vec<u32>, SeqSummary)>, (u64, u64));

    /// Sequences of different prompts and lengths, one of them asking for
    /// no speculation.
    fn spec_jobs() -> Vec<Job> {
        let p = prompts();
        vec![
            (p[0].clone(), 14, None),
            (p[1].clone(), 9, None),
            (p[2].clone(), 20, Some(DraftParams { max: 0, min: 0 })),
            (p[3].clone(), 17, None),
        ]
    }

    /// Runs `jobs` together through an engine (3 slots, so one waits; a
    /// batch of 7 tokens, below the GEMM's, as the plain batching test) and
    /// returns each sequence's tokens and summary and the engine's
    /// (drafted, accepted) counters.
    fn run_jobs(
        spec: Option<SpecConfig<Cpu>>,
        jobs: &[Job],
        sampling: &SamplingParams,
        constraint: &dyn Fn() -> Option<Box<dyn TokenConstraint>>,
    ) -> Ran {
        let (model, tok) = tiny("spec-target");
        let cfg = SchedulerConfig {
            n_slots: 3,
            n_ctx: 64,
            n_batch: 7,
            queue_capacity: 8,
        };
        let (sched, engine) = Scheduler::start_speculative(model, tok, cfg, spec).unwrap();
        let mut rxs = Vec::new();
        let reqs: Vec<SeqRequest> = jobs
            .iter()
            .map(|(p, max, draft)| {
                let (mut r, rx, _) = request(p.clone(), *max);
                r.sampling = sampling.clone();
                r.constraint = constraint();
                r.draft = *draft;
                rxs.push(rx);
                r
            })
            .collect();
        sched.submit_all(reqs).unwrap();
        let out = rxs
            .iter()
            .map(|rx| {
                let (toks, summary, _) = collect(rx);
                (toks, summary)
            })
            .collect();
        let st = sched.stats();
        let counts = (
            st.draft_tokens.load(Ordering::Relaxed),
            st.draft_tokens_accepted.load(Ordering::Relaxed),
        );
        sched.shutdown();
        engine.join().unwrap();
        (out, counts)
    }

    /// The drafters a speculative test runs: another model (mostly
    /// rejected), the target's own weights (always right under greedy),
    /// the same with a p-min, and prompt lookup.
    fn drafters(params: DraftParams) -> Vec<(&'static str, SpecConfig<Cpu>)> {
        let model = |seed| tiny_seeded("spec-draft", seed).0;
        vec![
            ("other model", SpecConfig { drafter: SpecDrafter::Model { model: Box::new(model(8)), p_min: 0.0 }, params }),
            ("itself", SpecConfig { drafter: SpecDrafter::Model { model: Box::new(model(7)), p_min: 0.0 }, params }),
            ("itself, p-min", SpecConfig { drafter: SpecDrafter::Model { model: Box::new(model(7)), p_min: 0.5 }, params }),
            ("lookup", SpecConfig { drafter: SpecDrafter::Lookup(Lookup { ngram_min: 1, ngram_max: 3 }), params }),
        ]
    }

    fn no_constraint() -> Option<Box<dyn TokenConstraint>> {
        None
    }

    /// Greedy: several sequences of different lengths decoding together,
    /// speculatively, give the tokens the plain engine gives, whatever the
    /// drafter and the draft size; the counters add up, and a request
    /// asking for no speculation gets none.
    #[test]
    fn speculative_batched_sequences_generate_exactly_what_plain_batching_generates() {
        let jobs = spec_jobs();
        let greedy = SamplingParams::greedy();
        let (want, none) = run_jobs(None, &jobs, &greedy, &no_constraint);
        assert_eq!(none, (0, 0), "a plain engine drafts nothing");
        for max in [1, 3, MAX_DRAFT] {
            for (name, spec) in drafters(DraftParams { max, min: 0 }) {
                let (got, (drafted, accepted)) = run_jobs(Some(spec), &jobs, &greedy, &no_constraint);
                for (i, ((g, gs), (w, ws))) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g, w, "{name}, draft-max {max}, sequence {i}");
                    assert_eq!(gs.finish, ws.finish, "{name}, sequence {i}");
                    assert_eq!(gs.n_generated, jobs[i].1, "{name}, sequence {i}");
                    assert!(gs.n_draft_accepted <= gs.n_drafted);
                }
                assert_eq!(got[2].1.n_drafted, 0, "{name}: speculation was off for sequence 2");
                let sum: usize = got.iter().map(|(_, s)| s.n_drafted).sum();
                let sum_acc: usize = got.iter().map(|(_, s)| s.n_draft_accepted).sum();
                assert_eq!((sum as u64, sum_acc as u64), (drafted, accepted), "{name}");
                // (Lookup drafts only where the text repeats, p-min only where the draft is sure.)
                if name == "itself" || name == "other model" {
                    assert!(drafted > 0, "{name}, draft-max {max}: nothing was drafted");
                }
                match name {
                    "itself" => assert_eq!(accepted, drafted, "draft-max {max}: the target drafting for itself is always right"),
                    "other model" => assert!(accepted < drafted, "draft-max {max}: another model's drafts were all kept"),
                    _ => {}
                }
            }
        }
    }

    /// Sampling: the speculative engine draws, for a seeded request, the
    /// tokens the plain engine draws (sample and compare keeps the seeded
    /// stream), with drafts both kept and rejected; and the draw is not
    /// greedy decoding.
    #[test]
    fn a_seeded_sample_under_speculation_is_the_plain_engines() {
        let jobs = spec_jobs();
        let sampling = SamplingParams { temperature: 0.3, top_k: 0, top_p: 1.0, min_p: 0.0, seed: Some(5), ..SamplingParams::default() };
        let (want, _) = run_jobs(None, &jobs, &sampling, &no_constraint);
        let params = DraftParams { max: 4, min: 0 };
        for (name, spec) in drafters(params).into_iter().take(2) {
            let (got, (drafted, accepted)) = run_jobs(Some(spec), &jobs, &sampling, &no_constraint);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.0, w.0, "{name}, sequence {i}");
            }
            assert!(accepted < drafted, "{name}: {accepted} of {drafted} drafts kept");
            if name == "itself" {
                assert!(accepted > 0, "the target's own greedy drafts were never drawn");
            }
        }
        let (greedy, _) = run_jobs(None, &jobs, &SamplingParams::greedy(), &no_constraint);
        assert!(greedy.iter().zip(&want).any(|(g, w)| g.0 != w.0), "the sampler did not draw");
    }

    /// A constrained sequence speculates under its constraint: every row is
    /// masked as a plain one, so the tokens are the plain engine's, all
    /// allowed, and it ends where the constraint completes.
    #[test]
    fn a_constrained_sequence_speculates_within_its_constraint() {
        let jobs = spec_jobs();
        let greedy = SamplingParams::greedy();
        let even = || Some(Box::new(EvenOnly { left: 8 }) as Box<dyn TokenConstraint>);
        let (want, _) = run_jobs(None, &jobs, &greedy, &even);
        for (name, spec) in drafters(DraftParams { max: 4, min: 0 }).into_iter().take(2) {
            let (got, (drafted, _)) = run_jobs(Some(spec), &jobs, &greedy, &even);
            assert!(drafted > 0, "{name}: nothing was drafted");
            for (i, ((g, gs), (w, _))) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "{name}, sequence {i}");
                assert!(g.iter().all(|t| t % 2 == 0), "{name}, sequence {i}: {g:?}");
                let n = 8.min(jobs[i].1);
                assert_eq!(g.len(), n, "{name}, sequence {i}");
                let fin = if n == 8 { FinishReason::Stop } else { FinishReason::Length };
                assert_eq!(gs.finish, fin, "{name}, sequence {i}");
            }
        }
    }

    /// Draft sizes out of range are refused at submission, and a speculative
    /// engine refuses bad default sizes at start.
    #[test]
    fn draft_sizes_out_of_range_are_refused() {
        let (model, tok) = tiny("draft-sizes");
        let bad = SpecConfig::<Cpu> { drafter: SpecDrafter::Lookup(Lookup::default()), params: DraftParams { max: MAX_DRAFT + 1, min: 0 } };
        assert!(matches!(
            Scheduler::start_speculative(model, Arc::clone(&tok), SchedulerConfig::default(), Some(bad)),
            Err(SchedulerError::Config(_))
        ));
        let (model, _) = tiny("draft-sizes");
        let spec = SpecConfig::<Cpu> { drafter: SpecDrafter::Lookup(Lookup::default()), params: DraftParams { max: 2, min: 0 } };
        let (sched, engine) = Scheduler::start_speculative(model, tok, SchedulerConfig::default(), Some(spec)).unwrap();
        assert_eq!(sched.speculative(), Some(DraftParams { max: 2, min: 0 }));
        for (max, min) in [(MAX_DRAFT + 1, 0), (2, 3)] {
            let (mut r, _rx, _) = request(vec![5, 6], 4);
            r.draft = Some(DraftParams { max, min });
            assert!(matches!(sched.submit(r), Err(SubmitError::Draft { .. })), "max {max}, min {min}");
        }
        sched.shutdown();
        engine.join().unwrap();
    }
}
