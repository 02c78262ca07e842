//! `ferrox chat [MODEL]`: an interactive, multi-turn conversation rendered
//! with the model's chat template. Each turn re-renders the whole
//! conversation; the session's cache already holds everything up to the
//! last reply, so only the new turn is evaluated. When the conversation no
//! longer fits the context, its oldest turns are dropped (the system message
//! stays), as a chat client would, rather than the turn failing.
//!
//! On a terminal, lines are read with rustyline (editing, history kept in
//! `~/.cache/ferrox/chat_history`, a paste of several lines as one message);
//! from a pipe, each line is a message. Either way `"""` opens and closes a
//! multi-line message (as in ollama) and a line ending in `\` continues.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use anyhow::{bail, Context, Result};
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

/// What `/help` prints.
const HELP: &str = "\
commands:
  /help            this list
  /clear, /reset   forget the conversation (the system message stays)
  /save FILE       write the conversation as JSON ([{\"role\": ..., \"content\": ...}, ...])
  /load FILE       replace the conversation with one /save wrote
  /exit, /quit     quit (also Ctrl-D)
a message: one line; \"\"\" opens and closes several lines; a line ending in \\ continues.
Ctrl-C stops a reply; at an empty prompt it clears the line.";

/// One read from the user.
enum Line {
    Text(String),
    /// Ctrl-C at the prompt.
    Interrupted,
    Eof,
}

/// Where the user's lines come from.
enum Input {
    /// A terminal: line editing and history on disk.
    Editor(Box<rustyline::DefaultEditor>, Option<PathBuf>),
    /// A pipe or file: plain lines.
    Lines(std::io::Lines<std::io::StdinLock<'static>>),
}

impl Input {
    fn open() -> Input {
        if std::io::stdin().is_terminal() {
            if let Ok(mut ed) = rustyline::DefaultEditor::new() {
                let history = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ferrox/chat_history"));
                if let Some(h) = &history {
                    // A first run has no history yet: nothing to load is fine.
                    let _ = ed.load_history(h);
                }
                return Input::Editor(Box::new(ed), history);
            }
        }
        Input::Lines(std::io::stdin().lock().lines())
    }

    fn read(&mut self, prompt: &str) -> Result<Line> {
        match self {
            Input::Editor(ed, _) => match ed.readline(prompt) {
                Ok(l) => Ok(Line::Text(l)),
                Err(rustyline::error::ReadlineError::Interrupted) => Ok(Line::Interrupted),
                Err(rustyline::error::ReadlineError::Eof) => Ok(Line::Eof),
                Err(e) => Err(e).context("cannot read the terminal"),
            },
            Input::Lines(lines) => match lines.next() {
                Some(l) => Ok(Line::Text(l.context("cannot read stdin")?)),
                None => Ok(Line::Eof),
            },
        }
    }

    /// Keeps `text` in the history (on disk at once, so a crash loses nothing).
    fn remember(&mut self, text: &str) {
        if let Input::Editor(ed, Some(path)) = self {
            let _ = ed.add_history_entry(text);
            if let Some(dir) = path.parent() {
                let _ = std::fs::create_dir_all(dir);
            }
            if let Err(e) = ed.save_history(path) {
                eprintln!("ferrox: warning: cannot save the history to {}: {e}", path.display());
            }
        }
    }

    /// The next message: one line, a `"""` block, or `\`-continued lines;
    /// `None` at the end of input.
    fn message(&mut self) -> Result<Option<String>> {
        loop {
            let first = match self.read("> ")? {
                Line::Eof => return Ok(None),
                Line::Interrupted => {
                    eprintln!("(Ctrl-D or /exit quits)");
                    continue;
                }
                Line::Text(t) => t,
            };
            let block = first.trim_start().strip_prefix("\"\"\"").map(str::to_string);
            let text = match block {
                Some(rest) if rest.trim_end().ends_with("\"\"\"") && !rest.trim().is_empty() => {
                    rest.trim_end().trim_end_matches("\"\"\"").to_string()
                }
                Some(rest) => {
                    let mut text = rest;
                    loop {
                        match self.read("... ")? {
                            Line::Eof => break,
                            Line::Interrupted => {
                                text.clear();
                                break;
                            }
                            Line::Text(l) => {
                                let end = l.trim_end().strip_suffix("\"\"\"").map(str::to_string);
                                if !text.is_empty() {
                                    text.push('\n');
                                }
                                text.push_str(end.as_deref().unwrap_or(&l));
                                if end.is_some() {
                                    break;
                                }
                            }
                        }
                    }
                    text
                }
                None => {
                    let mut text = first;
                    while let Some(cut) = text.strip_suffix('\\').map(str::len) {
                        text.truncate(cut);
                        text.push('\n');
                        match self.read("... ")? {
                            Line::Text(l) => text.push_str(&l),
                            Line::Eof | Line::Interrupted => break,
                        }
                    }
                    text
                }
            };
            if !text.trim().is_empty() {
                self.remember(&text);
            }
            return Ok(Some(text));
        }
    }
}

/// `/save`: the conversation as OpenAI-style messages.
fn save(path: &str, messages: &[ChatMessage]) -> Result<()> {
    let json = serde_json::to_string_pretty(messages)?;
    std::fs::write(path, json + "\n").with_context(|| format!("cannot write {path}"))
}

/// `/load`: messages as `/save` writes them (or any `[{role, content}]`).
fn load(path: &str) -> Result<Vec<ChatMessage>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{path} is not JSON"))?;
    let Some(items) = v.as_array() else { bail!("{path}: expected a list of {{\"role\", \"content\"}} messages") };
    items
        .iter()
        .enumerate()
        .map(|(i, m)| match (m["role"].as_str(), m["content"].as_str()) {
            (Some(r), Some(c)) => Ok(ChatMessage::new(r, c)),
            _ => bail!("{path}: message {i} needs a string \"role\" and a string \"content\""),
        })
        .collect()
}

/// Drops the oldest turn (the first message after the system messages, and
/// the reply that answers it); false when only the newest message is left.
fn drop_oldest_turn(messages: &mut Vec<ChatMessage>) -> bool {
    let Some(first) = messages.iter().position(|m| m.role != "system") else { return false };
    if first + 1 >= messages.len() {
        return false;
    }
    messages.remove(first);
    if first + 1 < messages.len() && messages[first].role == "assistant" {
        messages.remove(first);
    }
    true
}

fn converse<B: DeviceBackend>(a: Args, path: &Path, model: &Model<B>, tok: &Tokenizer) -> Result<()> {
    let template =
        ChatTemplate::from_gguf(model.file().metadata_file()).context("no usable chat template")?;
    if let Some(family) = template.builtin_family() {
        eprintln!(
            "ferrox: warning: the model file has no chat template (a base model may not follow a conversation); using ferrox's built-in {family:?} template"
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
    // Room kept for a reply when old turns are dropped to fit a new one.
    let reply_room = opts.max_tokens.unwrap_or(usize::MAX).min(n_ctx / 4);
    let cancel = crate::run::cancel_on_ctrl_c()?;
    let mut input = Input::open();
    if matches!(input, Input::Editor(..)) {
        eprintln!("ferrox: chat with {} (/help lists the commands; Ctrl-C stops a reply; /exit or Ctrl-D quits)", path.display());
    }
    while let Some(line) = input.message()? {
        let text = line.trim();
        let (command, arg) = text.split_once(' ').map_or((text, ""), |(c, r)| (c, r.trim()));
        match command {
            "" => continue,
            "/exit" | "/quit" | "/bye" => break,
            "/help" | "/?" => {
                eprintln!("{HELP}");
                continue;
            }
            "/reset" | "/clear" => {
                messages.retain(|m| m.role == "system");
                session.reset();
                eprintln!("ferrox: conversation cleared");
                continue;
            }
            "/save" | "/load" if arg.is_empty() => {
                eprintln!("ferrox: {command} needs a file name: {command} FILE");
                continue;
            }
            "/save" => {
                match save(arg, &messages) {
                    Ok(()) => eprintln!("ferrox: saved {} messages to {arg}", messages.len()),
                    Err(e) => eprintln!("ferrox: {e:#}"),
                }
                continue;
            }
            "/load" => {
                match load(arg) {
                    Ok(m) => {
                        messages = m;
                        eprintln!("ferrox: loaded {} messages from {arg}", messages.len());
                    }
                    Err(e) => eprintln!("ferrox: {e:#}"),
                }
                continue;
            }
            c if c.starts_with('/') && !c[1..].contains('/') => {
                eprintln!("ferrox: unknown command {c}; /help lists the commands (a message starting with / goes in a \"\"\" block)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", line.trim_end()));
        // The oldest turns go until the conversation fits with room to reply.
        let mut dropped = 0;
        let ids = loop {
            let rendered = template.render(&messages, true)?;
            // A template that writes BOS itself must not get a second one.
            let add_bos = !template.starts_with_bos(&rendered);
            let ids = tok.encode(rendered.as_bytes(), add_bos, true)?;
            if ids.len() + reply_room <= n_ctx || !drop_oldest_turn(&mut messages) {
                break ids;
            }
            dropped += 1;
        };
        if dropped > 0 {
            eprintln!("ferrox: the context ({n_ctx} positions) is full: dropped the oldest {dropped} turn(s)");
        }
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
                eprintln!("ferrox: {e}");
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        writeln!(out)?;
        if a.verbose {
            eprintln!(
                "ferrox: turn: prompt {} tokens, {} reused from the cache, {} generated (stopped: {})",
                done.n_prompt,
                done.n_cached,
                done.tokens.len(),
                crate::run::finish_words(done.finish, done.tokens.len(), n_ctx)
            );
        }
        messages.push(ChatMessage::new("assistant", done.text.trim_end()));
    }
    Ok(())
}
