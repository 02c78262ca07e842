//! `ferrox bench`: prompt-processing and generation throughput, measured as
//! llama-bench measures it and reported under llama-bench's field names, so
//! a row of ours can sit beside a row of theirs.
//!
//! The decision: copy llama-bench's protocol, not just its output. A `ppN`
//! test evaluates N random tokens (BOS first when the model adds one) in
//! batches of `-b`, asking for the logits of each batch's last token only; a
//! `tgN` test decodes N tokens one at a time from an empty cache, each a
//! forward pass with its logits read back. With `-d D` a test starts with D
//! tokens already in the cache (a pp pass of random tokens before each
//! repetition, not timed), as llama-bench's `-d`: decode and prefill at
//! depth, where attention over the cache costs more. Each test runs once as a warmup
//! (`pp`: the whole prompt; `tg`: one token), then `-r` timed repetitions;
//! t/s is tokens over wall time per repetition, reported as mean and sample
//! standard deviation. We add what llama-bench lacks: the load time
//! (`Model::open` + tokenizer) and the process's peak RSS (`VmHWM`, reset
//! before each model where the kernel allows it).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use ferrox_core::backend::{Batch, DeviceBackend};
use ferrox_core::kernel_registry::Backend;
use ferrox_core::model::{Model, ModelError};
use ferrox_core::tokenizer::Tokenizer;
use serde::{Deserialize, Serialize};

/// Output formats, llama-bench's names.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// A markdown table.
    Md,
    /// One JSON array of rows.
    Json,
    /// One JSON object per line.
    Jsonl,
}

#[derive(clap::Args)]
pub struct Args {
    /// Model files; repeat -m for several.
    #[arg(short = 'm', long = "model")]
    models: Vec<PathBuf>,
    /// The checkpoints of a suite file (benchmarks/suite.json) instead of -m.
    #[arg(long, conflicts_with = "models")]
    suite: Option<PathBuf>,
    /// Prompt lengths, one pp test each (comma-separated; 0 for none).
    #[arg(short = 'p', long = "n-prompt", value_delimiter = ',', default_value = "512")]
    n_prompt: Vec<usize>,
    /// Generation lengths, one tg test each (comma-separated; 0 for none).
    #[arg(short = 'n', long = "n-gen", value_delimiter = ',', default_value = "128")]
    n_gen: Vec<usize>,
    /// Tokens in the cache before each test (comma-separated; every test
    /// runs at each depth).
    #[arg(short = 'd', long = "n-depth", value_delimiter = ',', default_value = "0")]
    n_depth: Vec<usize>,
    /// Tokens per forward pass in pp tests.
    #[arg(short = 'b', long = "batch-size", default_value_t = 512)]
    batch_size: usize,
    /// Thread counts (comma-separated; 0: all cores).
    #[arg(short = 't', long = "threads", value_delimiter = ',', default_value = "0")]
    threads: Vec<usize>,
    /// Timed repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    repetitions: usize,
    /// The backend to run on (default: cpu, or the first accelerator when
    /// --n-gpu-layers asks for layers on one).
    #[arg(long, value_parser = crate::load::parse_backend)]
    backend: Option<Backend>,
    /// Which device of the backend.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Blocks on the accelerator (llama-bench's -ngl; `all` by default): the
    /// last N, the rest on the CPU.
    #[arg(long = "n-gpu-layers", visible_alias = "gpu-layers", value_parser = crate::load::parse_gpu_layers)]
    gpu_layers: Option<usize>,
    /// Speculative decoding: with a draft model or --lookup, each -n length
    /// also runs as an `sgN` test — greedy decoding of N tokens of real text
    /// (from --spec-prompt-file) plainly and speculatively, with the rates.
    #[command(flatten)]
    spec: crate::speculative::SpecArgs,
    /// The prompt of the `sgN` tests (default: a short built-in story
    /// opening; an editing prompt shows prompt lookup at its best).
    #[arg(long = "spec-prompt-file")]
    spec_prompt_file: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "md")]
    output: Format,
}

/// One test's result, llama-bench's field names where the meaning is the
/// same (`model_type`, `model_size`, `model_n_params`, `backends`,
/// `n_threads`, `n_prompt`, `n_gen`, `avg_ts`, `stddev_ts`, `samples_ts` …).
#[derive(Serialize, Debug, Clone)]
pub struct TestResult {
    /// ferrox's version.
    pub ferrox_version: String,
    /// The CPU's model name.
    pub cpu_info: String,
    /// Backends used.
    pub backends: String,
    /// The device as its backend describes it (the CPU: the instruction-set
    /// level its kernels run at and the threads; CUDA: the GPU and the
    /// architecture its kernels were compiled for).
    pub cpu_isa: String,
    /// The model file.
    pub model_filename: String,
    /// Architecture, size label and file type, as llama's model description.
    pub model_type: String,
    /// Bytes of tensor data.
    pub model_size: u64,
    /// Parameters (tensor elements).
    pub model_n_params: u64,
    /// Tokens per forward pass in pp tests.
    pub n_batch: usize,
    /// Threads.
    pub n_threads: usize,
    /// Prompt tokens.
    pub n_prompt: usize,
    /// Generated tokens.
    pub n_gen: usize,
    /// Tokens in the cache before the test (`-d`).
    pub n_depth: usize,
    /// When the test ran (RFC 3339, UTC).
    pub test_time: String,
    /// Mean time per repetition.
    pub avg_ns: u64,
    /// Its sample standard deviation.
    pub stddev_ns: u64,
    /// Mean tokens per second.
    pub avg_ts: f64,
    /// Its sample standard deviation.
    pub stddev_ts: f64,
    /// Each repetition's time.
    pub samples_ns: Vec<u64>,
    /// Each repetition's tokens per second.
    pub samples_ts: Vec<f64>,
    /// Wall time of `Model::open` and the tokenizer.
    pub load_time_ns: u64,
    /// Peak resident set size (VmHWM) after the test.
    pub peak_rss_bytes: u64,
    /// An `sgN` test's speculative figures (`avg_ts` is then its
    /// speculative decode rate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speculative: Option<SpecResult>,
}

/// What an `sgN` test measured beside the speculative decode rate.
#[derive(Serialize, Debug, Clone)]
pub struct SpecResult {
    /// `draft` (a draft model) or `lookup`.
    pub spec_type: String,
    /// The draft model file, if any.
    pub draft_model: Option<String>,
    /// `--draft-max`.
    pub draft_max: usize,
    /// `--draft-vocab` (0: the whole vocabulary).
    pub draft_vocab: usize,
    /// Plain greedy decode of the same tokens: mean t/s and each repetition's.
    pub plain_avg_ts: f64,
    /// Each plain repetition's t/s.
    pub plain_samples_ts: Vec<f64>,
    /// Mean speculative t/s over mean plain t/s.
    pub speedup: f64,
    /// Tokens drafted (one repetition).
    pub drafted: usize,
    /// Drafts accepted.
    pub accepted: usize,
    /// Accepted over drafted.
    pub acceptance: f64,
    /// Tokens decided per target forward pass.
    pub tokens_per_pass: f64,
    /// Whether the speculative tokens equal the plain ones (they must).
    pub same_tokens: bool,
}

/// A row of the report: a result, or a checkpoint that could not be run.
#[derive(Serialize, Debug, Clone)]
#[serde(untagged)]
pub enum Row {
    /// A test that ran.
    Ran(Box<TestResult>),
    /// A checkpoint that could not be run, and why.
    Skipped {
        /// The model file.
        model_filename: String,
        /// Why it did not run.
        skipped: String,
    },
}

/// `benchmarks/suite.json`: the checkpoints a full run covers.
#[derive(Deserialize, Debug)]
struct Suite {
    checkpoints: Vec<Checkpoint>,
}

#[derive(Deserialize, Debug)]
struct Checkpoint {
    /// A path, absolute or relative to the models directory.
    file: String,
    /// Set when the checkpoint is listed but known not to run, saying why.
    #[serde(default)]
    skip: Option<String>,
}

/// Where suite files live: `$FERROX_MODELS`, else `~/.cache/ferrox/models`.
fn models_dir() -> PathBuf {
    crate::load::default_model_path()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

pub fn run(a: Args) -> Result<()> {
    let backend = a.backend;
    if a.repetitions == 0 {
        bail!("-r must be at least 1");
    }
    if a.batch_size == 0 {
        bail!("-b must be at least 1");
    }
    let targets: Vec<(PathBuf, Option<String>)> = match &a.suite {
        Some(s) => {
            let text = std::fs::read_to_string(s)
                .with_context(|| format!("cannot read suite {}", s.display()))?;
            let suite: Suite = serde_json::from_str(&text)
                .with_context(|| format!("bad suite file {}", s.display()))?;
            let dir = models_dir();
            suite
                .checkpoints
                .into_iter()
                .map(|c| (dir.join(&c.file), c.skip))
                .collect()
        }
        None if a.models.is_empty() => vec![(crate::load::resolve_model(None, None)?, None)],
        None => a.models.iter().map(|m| (m.clone(), None)).collect(),
    };
    let mut printer = Printer::new(a.output);
    for (path, skip) in &targets {
        let name = path.display().to_string();
        if let Some(why) = skip {
            printer.row(&Row::Skipped {
                model_filename: name,
                skipped: why.clone(),
            });
            continue;
        }
        if !path.exists() {
            // A missing checkpoint of a suite is a row; a missing -m is an error.
            if a.suite.is_none() {
                bail!("model file {name} not found");
            }
            printer.row(&Row::Skipped {
                model_filename: name,
                skipped: "file not found".into(),
            });
            continue;
        }
        for &t in &a.threads {
            match bench_on(backend, path, t, &a, &mut printer) {
                Ok(()) => {}
                Err(e) if a.suite.is_some() => {
                    printer.row(&Row::Skipped {
                        model_filename: name.clone(),
                        skipped: format!("{e:#}"),
                    });
                }
                Err(e) => return Err(e),
            }
        }
    }
    printer.finish();
    Ok(())
}

/// Opens `backend` and benchmarks `path` on it.
fn bench_on(
    backend: Option<Backend>,
    path: &Path,
    threads: usize,
    a: &Args,
    printer: &mut Printer,
) -> Result<()> {
    struct Bench<'a> {
        path: &'a Path,
        file: Arc<ferrox_gguf::GgufModel>,
        a: &'a Args,
        printer: &'a mut Printer,
        t0: Instant,
    }
    impl ferrox_core::backend::WithBackend for Bench<'_> {
        type Output = Result<()>;
        fn run<B: DeviceBackend + 'static>(self, backend: B) -> Result<()> {
            bench_model(self.path, self.file, backend, self.t0, self.a, self.printer)
        }
    }
    // Load time includes opening the file and, for a device, opening it
    // (kernels compiled or loaded).
    let t0 = Instant::now();
    let file = Arc::new(crate::open_model(path)?);
    let flags = crate::load::BackendArgs { backend, device: a.device, threads, gpu_layers: a.gpu_layers };
    let opts = flags.options_for(&file)?;
    let job = Bench { path, file, a, printer, t0 };
    ferrox_core::backend::with_backend(&opts, job)?
}

fn bench_model<B: DeviceBackend>(
    path: &Path,
    file: Arc<ferrox_gguf::GgufModel>,
    backend: B,
    t0: Instant,
    a: &Args,
    printer: &mut Printer,
) -> Result<()> {
    reset_peak_rss();
    let model = Model::load(file, backend)
        .with_context(|| format!("cannot load model {}", path.display()))?;
    // Described once loaded: a layer split knows its layers then.
    let be = model.backend();
    let (n_threads, backends, isa) = (be.threads(), be.id().name().to_ascii_uppercase(), be.describe());
    let tok = Tokenizer::from_gguf(model.file().metadata_file())
        .with_context(|| format!("cannot read the tokenizer of {}", path.display()))?;
    // For a device, load time includes opening it (kernels compiled or loaded).
    let load_time_ns = t0.elapsed().as_nanos() as u64;
    let file = model.file();
    let model_size = file.tensors().iter().map(|t| t.info.n_bytes).sum();
    let model_n_params = file.tensors().iter().map(|t| t.info.n_elements()).sum();
    let base = TestResult {
        ferrox_version: env!("CARGO_PKG_VERSION").to_string(),
        cpu_info: cpu_info(),
        backends,
        cpu_isa: isa,
        model_filename: path.display().to_string(),
        model_type: model_type(file.metadata_file(), model_n_params),
        model_size,
        model_n_params,
        n_batch: a.batch_size,
        n_threads,
        n_prompt: 0,
        n_gen: 0,
        n_depth: 0,
        test_time: String::new(),
        avg_ns: 0,
        stddev_ns: 0,
        avg_ts: 0.0,
        stddev_ts: 0.0,
        samples_ns: vec![],
        samples_ts: vec![],
        load_time_ns,
        peak_rss_bytes: 0,
        speculative: None,
    };
    let first = tok.add_bos().then(|| tok.bos()).flatten();
    // Every test at every depth, each checked to fit before any runs.
    let runs: Vec<(usize, usize, usize)> = a
        .n_prompt
        .iter()
        .filter(|&&n| n > 0)
        .map(|&n| (n, 0))
        .chain(a.n_gen.iter().filter(|&&n| n > 0).map(|&n| (0, n)))
        .flat_map(|(p, g)| a.n_depth.iter().map(move |&d| (p, g, d)))
        .collect();
    let n_ctx_train = model.config().n_ctx_train;
    for &(n_prompt, n_gen, depth) in &runs {
        let need = depth + n_prompt + n_gen;
        if need > n_ctx_train {
            bail!(
                "{} at depth {depth} needs {need} positions; {} was trained for {n_ctx_train} (context_length)",
                test_name(n_prompt, n_gen, 0),
                path.display()
            );
        }
    }
    for (n_prompt, n_gen, depth) in runs {
        let test_time = rfc3339_now();
        let mut ctx = model.new_context(depth + n_prompt + n_gen, 1)?;
        let mut rng = SplitMix(0x5eed ^ ((n_prompt as u64) << 20) ^ (n_gen as u64) ^ ((depth as u64) << 40));
        let mut run_once = |n_prompt: usize, n_gen: usize| -> Result<u64, ModelError> {
            // The cache's first `depth` positions, refilled before each
            // repetition (not timed).
            if depth > 0 {
                prompt_pass(&model, &mut ctx, 0, depth, a.batch_size, first, &mut rng)?;
            }
            let t = Instant::now();
            if n_prompt > 0 {
                prompt_pass(&model, &mut ctx, depth, n_prompt, a.batch_size, first, &mut rng)?;
            }
            if n_gen > 0 {
                gen_pass(&model, &mut ctx, depth, n_gen, first, &mut rng)?;
            }
            Ok(t.elapsed().as_nanos() as u64)
        };
        // Warmup as llama-bench does it: the whole prompt, one generated token.
        run_once(n_prompt, n_gen.min(1))?;
        let samples_ns: Vec<u64> = (0..a.repetitions)
            .map(|_| run_once(n_prompt, n_gen))
            .collect::<Result<_, _>>()?;
        let n_tok = (n_prompt + n_gen) as f64;
        let samples_ts: Vec<f64> = samples_ns
            .iter()
            .map(|&ns| n_tok * 1e9 / ns.max(1) as f64)
            .collect();
        let ns_f: Vec<f64> = samples_ns.iter().map(|&n| n as f64).collect();
        let row = TestResult {
            n_prompt,
            n_gen,
            n_depth: depth,
            test_time,
            avg_ns: mean(&ns_f) as u64,
            stddev_ns: stddev(&ns_f) as u64,
            avg_ts: mean(&samples_ts),
            stddev_ts: stddev(&samples_ts),
            samples_ns,
            samples_ts,
            peak_rss_bytes: peak_rss(),
            ..base.clone()
        };
        printer.row(&Row::Ran(Box::new(row)));
    }
    if a.spec.active() {
        let flags = crate::load::BackendArgs { backend: Some(model.backend().id()), device: a.device, threads: n_threads, gpu_layers: a.gpu_layers };
        let draft = crate::speculative::load::<B>(&a.spec, &flags, (&tok, model.n_vocab()), true)?;
        let text = match &a.spec_prompt_file {
            Some(f) => std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?,
            None => SPEC_PROMPT.to_string(),
        };
        let prompt = tok.encode(text.as_bytes(), true, true)?;
        for &n_gen in a.n_gen.iter().filter(|&&n| n > 0) {
            let row = spec_test(&model, &tok, &prompt, n_gen, draft.as_ref(), a)?;
            printer.row(&Row::Ran(Box::new(TestResult { peak_rss_bytes: peak_rss(), ..row.into_result(base.clone()) })));
        }
    }
    Ok(())
}

/// The default prompt of `sgN` tests.
const SPEC_PROMPT: &str = "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker who";

/// An `sgN` test's measurements, before they become a row.
struct SpecRun {
    n_prompt: usize,
    n_gen: usize,
    test_time: String,
    samples_ns: Vec<u64>,
    samples_ts: Vec<f64>,
    spec: SpecResult,
}

impl SpecRun {
    fn into_result(self, base: TestResult) -> TestResult {
        let ns_f: Vec<f64> = self.samples_ns.iter().map(|&n| n as f64).collect();
        TestResult {
            n_prompt: self.n_prompt,
            n_gen: self.n_gen,
            n_depth: 0,
            test_time: self.test_time,
            avg_ns: mean(&ns_f) as u64,
            stddev_ns: stddev(&ns_f) as u64,
            avg_ts: mean(&self.samples_ts),
            stddev_ts: stddev(&self.samples_ts),
            samples_ns: self.samples_ns,
            samples_ts: self.samples_ts,
            speculative: Some(self.spec),
            ..base
        }
    }
}

/// Greedy decoding of `n_gen` tokens after `prompt`, plainly and with the
/// drafter, alternating repetitions (so a load change hits both alike);
/// decode time only (the prompt is evaluated before the clock starts).
fn spec_test<B: DeviceBackend>(
    model: &Model<B>,
    tok: &Tokenizer,
    prompt: &[u32],
    n_gen: usize,
    draft: Option<&crate::speculative::LoadedDraft<B>>,
    a: &Args,
) -> Result<SpecRun> {
    use ferrox_core::generate::{GenerateOptions, Session};
    use ferrox_core::speculative::Speculation;
    let test_time = rfc3339_now();
    let n_ctx = prompt.len() + n_gen + 1;
    let opts = GenerateOptions {
        max_tokens: Some(n_gen),
        sampling: ferrox_core::sampling::SamplingParams::greedy(),
        ignore_eos: true,
        logprobs: false,
        ..GenerateOptions::default()
    };
    let never = std::sync::atomic::AtomicBool::new(false);
    let params = a.spec.params()?;
    let once = |spec: bool| -> Result<(Vec<u32>, f64, Option<ferrox_core::speculative::SpecStats>)> {
        let mut s = Session::new(model, tok, n_ctx)?;
        let mut drafter = match (spec, draft) {
            (true, Some(d)) => Some(d.drafter(&a.spec, n_ctx)?),
            _ => None,
        };
        let mut sp = drafter.as_deref_mut().map(|d| Speculation { drafter: d, params });
        let c = s.generate_with(prompt, &opts, sp.as_mut(), &never, &mut |_| {})?;
        let ids = c.tokens.iter().map(|t| t.sampled.token).collect();
        Ok((ids, c.tokens.len() as f64 / c.timings.decode.as_secs_f64().max(1e-9), c.speculative))
    };
    once(false)?;
    once(true)?;
    let (mut plain_ts, mut spec_ts, mut spec_ns) = (Vec::new(), Vec::new(), Vec::new());
    let (mut same, mut stats) = (true, Default::default());
    for _ in 0..a.repetitions {
        let (p_ids, p_ts, _) = once(false)?;
        let (s_ids, s_ts, st) = once(true)?;
        same &= p_ids == s_ids;
        plain_ts.push(p_ts);
        spec_ts.push(s_ts);
        spec_ns.push((n_gen as f64 * 1e9 / s_ts) as u64);
        stats = st.unwrap_or_default();
    }
    let st: ferrox_core::speculative::SpecStats = stats;
    let spec = SpecResult {
        spec_type: if a.spec.lookup { "lookup".into() } else { "draft".into() },
        draft_model: a.spec.model_draft.as_ref().map(|p| p.display().to_string()),
        draft_max: a.spec.draft_max,
        draft_vocab: a.spec.draft_vocab,
        plain_avg_ts: mean(&plain_ts),
        plain_samples_ts: plain_ts.clone(),
        speedup: mean(&spec_ts) / mean(&plain_ts).max(1e-9),
        drafted: st.drafted,
        accepted: st.accepted,
        acceptance: st.acceptance(),
        tokens_per_pass: st.tokens_per_pass(),
        same_tokens: same,
    };
    if !same {
        bail!("speculative decoding gave other tokens than plain greedy decoding (a bug: please report it)");
    }
    Ok(SpecRun { n_prompt: prompt.len(), n_gen, test_time, samples_ns: spec_ns, samples_ts: spec_ts, spec })
}

/// `n` random tokens from position `start` (the one at position 0 is BOS
/// when the model adds one) in batches, each asking for its last token's
/// logits, as llama-bench's prompt test.
fn prompt_pass<B: DeviceBackend>(
    model: &Model<B>,
    ctx: &mut ferrox_core::model::Context<B>,
    start: usize,
    n: usize,
    n_batch: usize,
    bos: Option<u32>,
    rng: &mut SplitMix,
) -> Result<(), ModelError> {
    let n_vocab = model.n_vocab() as u64;
    let mut done = 0;
    while done < n {
        let len = n_batch.min(n - done);
        let mut b = Batch::default();
        for i in 0..len {
            let pos = start + done + i;
            let tok = match (pos, bos) {
                (0, Some(t)) => t,
                _ => (rng.next() % n_vocab) as u32,
            };
            b.push(tok, pos as u32, 0, i + 1 == len);
        }
        model.forward(ctx, &b)?;
        done += len;
    }
    Ok(())
}

/// `n` single-token forward passes from position `start`, as llama-bench's
/// generation test (random tokens stand in for sampled ones; BOS first at
/// position 0 when the model adds one).
fn gen_pass<B: DeviceBackend>(
    model: &Model<B>,
    ctx: &mut ferrox_core::model::Context<B>,
    start: usize,
    n: usize,
    bos: Option<u32>,
    rng: &mut SplitMix,
) -> Result<(), ModelError> {
    let n_vocab = model.n_vocab() as u64;
    let mut tok = bos
        .filter(|_| start == 0)
        .unwrap_or_else(|| (rng.next() % n_vocab) as u32);
    let mut logits = Vec::new();
    for pos in start..start + n {
        let mut b = Batch::default();
        b.push(tok, pos as u32, 0, true);
        model.forward_into(ctx, &b, &mut logits)?;
        tok = (rng.next() % n_vocab) as u32;
    }
    Ok(())
}

struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

/// Sample standard deviation; 0 for fewer than two samples (llama-bench's).
fn stddev(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 0.0;
    }
    let m = mean(v);
    (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (v.len() - 1) as f64).sqrt()
}

/// "ARCH SIZE FTYPE", the shape of llama's model description: the size
/// label from the file when it has one, else the parameter count rounded.
fn model_type(meta: &ferrox_gguf::GgufFile, n_params: u64) -> String {
    let arch = meta.get_str("general.architecture").unwrap_or("?");
    let size = match meta.get_str("general.size_label").ok() {
        Some(s) => s.to_string(),
        None if n_params >= 1_000_000_000 => format!("{:.1}B", n_params as f64 / 1e9),
        None => format!("{}M", (n_params as f64 / 1e6).round()),
    };
    let ft = meta.get("general.file_type").and_then(|v| v.as_uint());
    let ftype = ft
        .and_then(ferrox_core::ftype::name)
        .map_or_else(|| "unknown file type".to_string(), str::to_string);
    format!("{arch} {size} {ftype}")
}

fn cpu_info() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

/// Resets VmHWM to the current RSS (Linux: writing 5 to clear_refs), so each
/// model's peak is its own; where that is refused the peak is the process's.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// VmHWM in bytes, 0 where /proc is not there.
fn peak_rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn rfc3339_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Prints rows as they come (a long suite shows progress), closing the
/// JSON array at the end.
struct Printer {
    format: Format,
    n: usize,
}

impl Printer {
    fn new(format: Format) -> Printer {
        Printer { format, n: 0 }
    }

    fn row(&mut self, r: &Row) {
        match self.format {
            Format::Md => {
                if self.n == 0 {
                    println!("| model | size | params | backend | threads | test | t/s | load s | peak RSS |");
                    println!("| --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |");
                }
                println!("{}", md_row(r));
            }
            Format::Json => {
                let text = serde_json::to_string_pretty(r).unwrap_or_default();
                let indented: Vec<String> = text.lines().map(|l| format!("  {l}")).collect();
                println!(
                    "{}{}",
                    if self.n == 0 { "[\n" } else { ",\n" },
                    indented.join("\n")
                );
            }
            Format::Jsonl => println!("{}", serde_json::to_string(r).unwrap_or_default()),
        }
        self.n += 1;
    }

    fn finish(&self) {
        match self.format {
            Format::Json if self.n == 0 => println!("[]"),
            Format::Json => println!("\n]"),
            Format::Md | Format::Jsonl => {}
        }
    }
}

/// A test's name as llama-bench prints it: `pp512`, `tg128`, `tg128 @ d4096`.
fn test_name(n_prompt: usize, n_gen: usize, depth: usize) -> String {
    let test = match (n_prompt, n_gen) {
        (p, 0) => format!("pp{p}"),
        (0, g) => format!("tg{g}"),
        (p, g) => format!("pp{p}+tg{g}"),
    };
    if depth > 0 {
        format!("{test} @ d{depth}")
    } else {
        test
    }
}

fn md_row(r: &Row) -> String {
    match r {
        Row::Ran(t) => {
            let size = if t.model_size < 1 << 30 {
                format!("{:.2} MiB", t.model_size as f64 / (1u64 << 20) as f64)
            } else {
                format!("{:.2} GiB", t.model_size as f64 / (1u64 << 30) as f64)
            };
            let params = if t.model_n_params < 1_000_000_000 {
                format!("{:.2} M", t.model_n_params as f64 / 1e6)
            } else {
                format!("{:.2} B", t.model_n_params as f64 / 1e9)
            };
            let test = match &t.speculative {
                Some(s) => format!(
                    "sg{} {}: {:.0}% kept, {:.2} tok/pass, plain {:.2} t/s, x{:.2}",
                    t.n_gen,
                    s.spec_type,
                    100.0 * s.acceptance,
                    s.tokens_per_pass,
                    s.plain_avg_ts,
                    s.speedup
                ),
                None => test_name(t.n_prompt, t.n_gen, t.n_depth),
            };
            format!(
                "| {} | {size} | {params} | {} | {} | {test} | {:.2} ± {:.2} | {:.2} | {:.0} MiB |",
                t.model_type,
                t.backends,
                t.n_threads,
                t.avg_ts,
                t.stddev_ts,
                t.load_time_ns as f64 / 1e9,
                t.peak_rss_bytes as f64 / (1u64 << 20) as f64
            )
        }
        Row::Skipped {
            model_filename,
            skipped,
        } => {
            format!(
                "| {model_filename} | | | | | | skipped: {} | | |",
                skipped.replace('|', "\\|").replace('\n', " ")
            )
        }
    }
}
