//! `ferrox chat [MODEL]`: an interactive, multi-turn conversation rendered
//! with the model's chat template. Each turn re-renders the whole
//! conversation; the session's cache already holds everything up to the
//! last reply, so only the new turn is evaluated.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use anyhow::{Context, Result};
use ferrox_core::backend::DeviceBackend;
use ferrox_core::chat_template::{ChatMessage, ChatTemplate};
use ferrox_core::generate::{GenerateOptions, Session, StreamEvent};
use ferrox_core::model::Model;
use ferrox_core::tokenizer::Tokenizer;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: crate::load::ModelArg,
    /// A system message for the conversation (llama.cpp's -sys/--system-prompt).
    #[arg(long)]
    system: Option<String>,
    /// Most tokens per reply (-1: until end of turn or a full context).
    #[arg(
        short = 'n',
        long = "n-predict",
        default_value_t = 512,
        allow_negative_numbers = true
    )]
    n_predict: i64,
    /// Context size (default: the model's, at most 4096; 0: the model's training context).
    #[arg(short = 'c', long = "ctx-size", value_parser = crate::load::parse_ctx_size, allow_negative_numbers = true)]
    ctx_size: Option<usize>,
    #[command(flatten)]
    backend: crate::load::BackendArgs,
    /// Print per-turn token counts (prompt, reused from the cache, generated) to stderr.
    #[arg(short = 'v', long)]
    verbose: bool,
    #[command(flatten)]
    sampling: crate::run::SamplingArgs,
    #[command(flatten)]
    llama: crate::compat::LlamaFlags,
}

pub fn run(mut a: Args) -> Result<()> {
    a.llama.check(crate::compat::Cmd::Chat)?;
    if let Some(s) = a.llama.system_prompt() {
        anyhow::ensure!(a.system.is_none(), "two system messages given (--system and -sys); give one");
        a.system = Some(s.to_string());
    }
    a.sampling.check(None)?;
    let path = a.model.or_default()?;
    let backend = a.backend.clone();
    crate::load::with_model(&path.clone(), &backend, false, Chat { a, path })
}

/// `chat`'s work once the model is loaded.
struct Chat {
    a: Args,
    path: PathBuf,
}

impl crate::load::ModelJob for Chat {
    type Output = ();
    fn run<B: DeviceBackend + 'static>(self, model: Model<B>, tok: Tokenizer) -> Result<()> {
        converse(self.a, &self.path, &model, &tok)
    }
    fn check(&self, file: &crate::load::FileFacts) -> Result<()> {
        self.a.sampling.check(file.n_vocab)?;
        crate::load::warn_ctx(self.a.ctx_size, file);
        Ok(())
    }
}

fn converse<B: DeviceBackend>(a: Args, path: &Path, model: &Model<B>, tok: &Tokenizer) -> Result<()> {
    let template =
        ChatTemplate::from_gguf(model.file().metadata_file()).context("no usable chat template")?;
    if template.is_builtin() {
        eprintln!(
            "ferrox: the model has no chat template; using the built-in {:?} one",
            template.builtin_family()
        );
    }
    let n_ctx = crate::load::context_size(a.ctx_size, model);
    let mut session = Session::new(model, tok, n_ctx)?;
    let mut messages: Vec<ChatMessage> = a
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.as_str()))
        .collect();
    let opts = GenerateOptions {
        max_tokens: usize::try_from(a.n_predict).ok(),
        sampling: a.sampling.params(n_ctx),
        ..GenerateOptions::default()
    };
    let cancel = crate::run::cancel_on_ctrl_c()?;
    let interactive = std::io::stdin().is_terminal();
    if interactive {
        eprintln!("ferrox: chat with {} (Ctrl-C stops a reply; /reset forgets the conversation; /exit or Ctrl-D quits)", path.display());
    }
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line.context("cannot read stdin")?;
        let text = line.trim();
        match text {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages.retain(|m| m.role == "system");
                session.reset();
                eprintln!("ferrox: conversation reset");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", text));
        let rendered = template.render(&messages, true)?;
        // A template that writes BOS itself must not get a second one.
        let add_bos = !template.starts_with_bos(&rendered);
        let ids = tok.encode(rendered.as_bytes(), add_bos, true)?;
        cancel.store(false, Ordering::Relaxed);
        let mut out = std::io::stdout().lock();
        let done = match session.generate(&ids, &opts, &cancel, &mut |e| {
            let t = match e {
                StreamEvent::Token(t) => t.text.as_str(),
                StreamEvent::Tail(s) => s,
            };
            // A closed stdout ends the reply at the next token check.
            if out
                .write_all(t.as_bytes())
                .and_then(|()| out.flush())
                .is_err()
            {
                cancel.store(true, Ordering::Relaxed);
            }
        }) {
            Ok(d) => d,
            Err(e @ ferrox_core::generate::GenerateError::PromptTooLong { .. }) => {
                messages.pop();
                eprintln!("ferrox: {e}; use /reset or a larger -c");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        writeln!(out)?;
        if a.verbose {
            eprintln!(
                "ferrox: turn: prompt {} tokens, {} reused from the cache, {} generated ({:?})",
                done.n_prompt,
                done.n_cached,
                done.tokens.len(),
                done.finish
            );
        }
        messages.push(ChatMessage::new("assistant", done.text.trim_end()));
    }
    Ok(())
}
