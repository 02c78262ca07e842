//! `ferrox serve [MODEL]`: the OpenAI-compatible server. Loads the model,
//! starts core's continuous-batching engine on its own thread, and hands the
//! HTTP side to `ferrox-server`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use ferrox_core::backend::DeviceBackend;
use ferrox_core::chat_template::ChatTemplate;
use ferrox_core::model::Model;
use ferrox_core::scheduler::{Scheduler, SchedulerConfig};
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
    /// Sequences decoded together (KV slots). Each holds `--ctx-size`
    /// positions; requests beyond this wait in the queue.
    #[arg(long = "parallel", visible_alias = "np", default_value_t = 4)]
    parallel: usize,
    /// Positions per slot (prompt + completion of one sequence); default: the
    /// model's training context, at most 4096.
    #[arg(short = 'c', long = "ctx-size")]
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
    #[arg(long)]
    alias: Option<String>,
    /// Seconds running requests may finish after SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 10)]
    shutdown_grace: u64,
}

pub fn run(a: Args) -> Result<()> {
    let path = crate::load::resolve_model(a.model.clone(), a.model_flag.clone())?;
    let backend = a.backend.clone();
    crate::load::with_model(&path.clone(), &backend, false, Serve { a, path })
}

/// `serve`'s work once the model is loaded.
struct Serve {
    a: Args,
    path: PathBuf,
}

impl crate::load::ModelJob for Serve {
    type Output = ();
    fn run<B: DeviceBackend + 'static>(self, model: Model<B>, tok: Tokenizer) -> Result<()> {
        serve(self.a, &self.path, model, tok)
    }
}

fn serve<B: DeviceBackend + 'static>(a: Args, path: &Path, model: Model<B>, tok: Tokenizer) -> Result<()> {
    let n_ctx = crate::load::context_size(a.ctx_size, &model);
    let template = ChatTemplate::from_gguf(model.file().metadata_file()).map_err(|e| e.to_string());
    if let Err(e) = &template {
        eprintln!("ferrox: warning: {e}; /v1/chat/completions will refuse requests");
    }
    let name = a.alias.unwrap_or_else(|| {
        path.file_name()
            .map_or("model".into(), |f| f.to_string_lossy().into_owned())
    });
    let tok = Arc::new(tok);
    let cfg = SchedulerConfig {
        n_slots: a.parallel,
        n_ctx,
        n_batch: a.batch_size,
        queue_capacity: a.queue,
    };
    let (sched, engine) =
        Scheduler::start(model, Arc::clone(&tok), cfg).context("cannot start the engine")?;
    let opts = ServerOptions {
        model_name: name,
        api_key: a.api_key,
        shutdown_grace: Duration::from_secs(a.shutdown_grace),
    };
    let state = AppState::new(sched, tok, template, opts);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let addr = format!("{}:{}", a.host, a.port);
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        eprintln!(
            "ferrox: serving on http://{} ({} slots x {n_ctx} positions, batch {}, queue {})",
            listener
                .local_addr()
                .map_or(addr.clone(), |a| a.to_string()),
            cfg.n_slots,
            cfg.n_batch,
            cfg.queue_capacity
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
