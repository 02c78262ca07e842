//! `ferrox serve [MODEL]`: the OpenAI-compatible server. Loads the model,
//! starts core's continuous-batching engine on its own thread, and hands the
//! HTTP side to `ferrox-server`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ferrox_core::backend::DeviceBackend;
use ferrox_core::chat_template::ChatTemplate;
use ferrox_core::embed::Pooling;
use ferrox_core::model::Model;
use ferrox_core::scheduler::{Scheduler, SchedulerConfig, SpecConfig, SpecDrafter};
use ferrox_core::tokenizer::Tokenizer;
use ferrox_server::{AppState, ServerOptions};

#[derive(clap::Args)]
pub struct Args {
    /// The model file; the default model (Gemma 3 270M) when omitted.
    model: Option<PathBuf>,
    /// The model file (instead of the positional argument).
    #[arg(short = 'm', long = "model")]
    model_flag: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Sequences decoded together (KV slots); requests beyond this wait in
    /// the queue.
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 4)]
    parallel: usize,
    /// Positions of all slots together, divided among the --parallel slots
    /// as llama-server divides them (-c 16384 --parallel 4: 4096 per slot);
    /// 0: the model's training context. Default: each slot the model's
    /// training context, at most 4096.
    #[arg(short = 'c', long = "ctx-size", value_parser = crate::load::parse_ctx_size, allow_negative_numbers = true)]
    ctx_size: Option<usize>,
    /// Most tokens per forward pass: one per decoding sequence, the rest
    /// prompt chunks (smaller: decodes stall less behind long prompts).
    #[arg(short = 'b', long = "batch-size", default_value_t = 256)]
    batch_size: usize,
    /// Requests that may wait for a slot; more get 429 with Retry-After.
    #[arg(long = "queue", default_value_t = 64)]
    queue: usize,
    #[command(flatten)]
    backend: crate::load::BackendArgs,
    /// Require `Authorization: Bearer KEY` (also read from FERROX_API_KEY).
    #[arg(long = "api-key", env = "FERROX_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// The model name `/v1/models` reports (default: the file name).
    #[arg(short = 'a', long)]
    alias: Option<String>,
    /// Seconds running requests may finish after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 10)]
    shutdown_grace: u64,
    /// One line on stderr per finished request: tokens, times, and with
    /// speculative decoding the tokens drafted and accepted.
    #[arg(long, short = 'v')]
    verbose: bool,
    /// Every product on the per-token kernels (CPU only): a request's reply
    /// is then bit for bit the same whatever it is batched with and whether
    /// its prompt prefix was cached; prompts and busy steps run slower (no
    /// batched GEMM).
    #[arg(long = "batch-invariant")]
    batch_invariant: bool,
    /// Serve embeddings: /v1/embeddings (OpenAI) and /embeddings (llama-server's).
    #[arg(long = "embeddings", visible_alias = "embedding")]
    embeddings: bool,
    /// How an embedding pools the final hidden states: none (one vector per
    /// token; /embeddings only), mean, cls (first token), last. Default: the
    /// model's `<arch>.pooling_type`, else none (as llama-server).
    #[arg(long, value_parser = ["none", "mean", "cls", "last"])]
    pooling: Option<String>,
    #[command(flatten)]
    llama: crate::compat::LlamaFlags,
    /// Speculative decoding for every request (a request's
    /// `speculative.n_max` / `speculative.n_min` override the sizes).
    #[command(flatten)]
    spec: crate::speculative::SpecArgs,
}

pub fn run(a: Args) -> Result<()> {
    a.llama.check(crate::compat::Cmd::Serve)?;
    let path = crate::load::resolve_model(a.model.clone(), a.model_flag.clone())?;
    // The port is taken before the model loads: a busy port fails at once.
    let addr = format!("{}:{}", a.host, a.port);
    let listener = std::net::TcpListener::bind(&addr).with_context(|| format!("cannot listen on {addr}"))?;
    let backend = a.backend.clone();
    crate::load::with_model(&path.clone(), &backend, false, Serve { a, path, listener })
}

/// `serve`'s work once the model is loaded.
struct Serve {
    a: Args,
    path: PathBuf,
    listener: std::net::TcpListener,
}

impl crate::load::ModelJob for Serve {
    type Output = ();
    fn run<B: DeviceBackend + 'static>(self, model: Model<B>, tok: Tokenizer) -> Result<()> {
        serve(self.a, &self.path, self.listener, model, tok)
    }
    fn check(&self, file: &crate::load::FileFacts) -> Result<()> {
        // Each slot's share is what must fit the training context.
        if let (Some(c), Some(train)) = (self.a.ctx_size.filter(|&c| c > 0), file.n_ctx_train) {
            let per_slot = c / self.a.parallel.max(1);
            if per_slot > train {
                eprintln!("ferrox: warning: -c {c} gives each of the {} slots {per_slot} positions, past the model's training context ({train})", self.a.parallel);
            }
        }
        Ok(())
    }
}

/// Positions per slot: `-c` divided among the slots, as llama-server
/// divides it (so its command lines hold the memory they hold there).
fn slot_context<B: DeviceBackend>(ctx: Option<usize>, parallel: usize, model: &Model<B>) -> Result<usize> {
    anyhow::ensure!(parallel > 0, "--parallel 0: the server needs at least one slot");
    let Some(flag) = ctx else { return Ok(crate::load::context_size(None, model)) };
    let total = crate::load::context_size(Some(flag), model);
    let per_slot = total / parallel;
    anyhow::ensure!(
        per_slot > 0,
        "-c {total} divided among --parallel {parallel} slots leaves no position per slot; raise -c (it is the total of all slots, as in llama-server)"
    );
    Ok(per_slot)
}

fn serve<B: DeviceBackend + 'static>(
    a: Args,
    path: &Path,
    listener: std::net::TcpListener,
    model: Model<B>,
    tok: Tokenizer,
) -> Result<()> {
    let n_ctx = slot_context(a.ctx_size, a.parallel, &model)?;
    if a.batch_invariant {
        anyhow::ensure!(
            model.backend().prefer_row_products(),
            "--batch-invariant: {} has no per-token products at every batch size (its batched products round differently); serve with --backend cpu",
            model.backend().describe()
        );
    }
    let template = ChatTemplate::from_gguf(model.file().metadata_file()).map_err(|e| e.to_string());
    if let Err(e) = &template {
        eprintln!("ferrox: warning: {e}; /v1/chat/completions will refuse requests");
    }
    let pooling = match a.pooling.as_deref().and_then(Pooling::from_name) {
        Some(p) => p,
        None => {
            let meta = model.file().metadata_file();
            let arch = meta.get_str("general.architecture").unwrap_or_default();
            match Pooling::from_gguf(meta, arch) {
                Ok(p) => p,
                Err(e) if a.embeddings => anyhow::bail!("{e}; pass --pooling mean, cls or last"),
                Err(_) => Pooling::None,
            }
        }
    };
    if a.embeddings && pooling == Pooling::None {
        eprintln!("ferrox: note: pooling is none: /v1/embeddings refuses requests, /embeddings answers one vector per token; pass --pooling mean, cls or last for OpenAI's shape");
    }
    let name = a.alias.unwrap_or_else(|| {
        path.file_name()
            .map_or("model".into(), |f| f.to_string_lossy().into_owned())
    });
    // The draft is loaded and its vocabulary checked before the engine starts.
    let spec = match crate::speculative::load::<B>(&a.spec, &a.backend, (&tok, model.n_vocab()), false)? {
        None => None,
        Some(crate::speculative::LoadedDraft::Model(m)) => Some(SpecConfig {
            drafter: SpecDrafter::Model { model: m, p_min: a.spec.draft_p_min },
            params: a.spec.params()?,
        }),
        Some(crate::speculative::LoadedDraft::Lookup(l)) => Some(SpecConfig { drafter: SpecDrafter::Lookup(l), params: a.spec.params()? }),
    };
    let spec_line = spec.as_ref().map(|s| {
        let what = match &s.drafter {
            SpecDrafter::Model { .. } => format!("draft model {}", a.spec.model_draft.as_ref().map_or(String::new(), |p| p.display().to_string())),
            SpecDrafter::Lookup(_) => "prompt lookup".to_string(),
        };
        format!(", speculative: {what}, {}..={} drafts", s.params.min, s.params.max)
    });
    let tok = Arc::new(tok);
    let cfg = SchedulerConfig {
        n_slots: a.parallel,
        n_ctx,
        n_batch: a.batch_size,
        queue_capacity: a.queue,
    };
    let (sched, engine) = Scheduler::start_speculative(model, Arc::clone(&tok), cfg, spec)
        .context("cannot start the engine")?;
    let opts = ServerOptions {
        model_name: name,
        api_key: a.api_key,
        shutdown_grace: Duration::from_secs(a.shutdown_grace),
        verbose: a.verbose,
        embeddings: a.embeddings,
        pooling,
        model_path: path.display().to_string(),
    };
    let state = AppState::new(sched, tok, template, opts);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let addr = format!("{}:{}", a.host, a.port);
    rt.block_on(async {
        listener.set_nonblocking(true).context("cannot listen")?;
        let listener = tokio::net::TcpListener::from_std(listener).context("cannot listen")?;
        eprintln!(
            "ferrox: serving on http://{} ({} slots x {n_ctx} positions per slot, batch {}, queue {}{})",
            listener
                .local_addr()
                .map_or(addr.clone(), |a| a.to_string()),
            cfg.n_slots,
            cfg.n_batch,
            cfg.queue_capacity,
            spec_line.as_deref().unwrap_or("")
        );
        ferrox_server::serve(listener, state, ferrox_server::termination_signal())
            .await
            .context("the server failed")
    })?;
    engine
        .join()
        .map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    eprintln!("ferrox: server stopped");
    Ok(())
}
