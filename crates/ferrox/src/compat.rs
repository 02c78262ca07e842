//! llama.cpp's flags that have no ferrox option of their own: each is
//! accepted where ferrox already does what it asks, and otherwise refused
//! with the ferrox way to get it. The decision: a user's llama.cpp command
//! line must never be silently misread — clap parses these (hidden, so
//! `--help` shows ferrox's own options), and [`LlamaFlags::check`] says what
//! each means here before anything is loaded. llama.cpp's single-dash
//! multi-letter spellings (`-fa`, `-ctk`) reach clap through `main`'s rewrite.

use anyhow::{bail, Result};

/// Which command the flags were given to (they mean different things).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Cmd {
    /// `ferrox run`: one completion.
    Run,
    /// `ferrox chat`: a conversation.
    Chat,
    /// `ferrox serve`: the server.
    Serve,
}

/// llama.cpp's flags, parsed so they can be answered (see the module doc).
#[derive(clap::Args, Debug, Clone)]
pub struct LlamaFlags {
    #[arg(long = "flash-attn", hide = true, num_args = 0..=1, default_missing_value = "on")]
    flash_attn: Option<String>,
    #[arg(long = "cache-type-k", hide = true)]
    cache_type_k: Option<String>,
    #[arg(long = "cache-type-v", hide = true)]
    cache_type_v: Option<String>,
    #[arg(long = "mlock", hide = true)]
    mlock: bool,
    #[arg(long = "no-mmap", hide = true)]
    no_mmap: bool,
    #[arg(long = "mmap", hide = true)]
    mmap: bool,
    #[arg(long = "hf-repo", alias = "hfr", hide = true)]
    hf_repo: Option<String>,
    #[arg(long = "conversation", short = 'i', alias = "interactive", hide = true)]
    conversation: bool,
    #[arg(long = "no-conversation", hide = true)]
    no_conversation: bool,
    #[arg(long = "system-prompt", hide = true)]
    system_prompt: Option<String>,
    #[arg(long = "jinja", hide = true)]
    jinja: bool,
    #[arg(long = "cont-batching", hide = true)]
    cont_batching: bool,
    #[arg(long = "no-cont-batching", hide = true)]
    no_cont_batching: bool,
}

/// What `--help` says about these flags (the commands' `after_help`).
pub const HELP: &str = "\
llama.cpp's spellings are read too: -ngl, -np, -r/--reverse-prompt, -sys/--system-prompt (chat),
--no-display-prompt, -no-cnv (run), -cnv (chat), -fa, -ctk/-ctv f16, -cb (serve), --jinja, --mmap;
flags ferrox cannot honour (--mlock, --no-mmap, -hf, -ctk q8_0, ...) are refused, naming the ferrox way.";

impl LlamaFlags {
    /// Accepts what ferrox already does, refuses the rest with the ferrox
    /// equivalent; notes on stderr for flags that change nothing.
    pub fn check(&self, cmd: Cmd) -> Result<()> {
        if let Some(v) = &self.flash_attn {
            if !matches!(v.as_str(), "on" | "off" | "auto" | "1" | "0" | "true" | "false" | "enabled" | "disabled") {
                bail!("-fa {v:?}: llama.cpp's --flash-attn takes on, off or auto");
            }
            eprintln!("ferrox: note: -fa changes nothing: ferrox picks its attention kernel itself");
        }
        for (flag, v) in [("-ctk", &self.cache_type_k), ("-ctv", &self.cache_type_v)] {
            if let Some(v) = v {
                if !v.eq_ignore_ascii_case("f16") {
                    bail!("{flag} {v}: ferrox's KV cache is F16 only; drop {flag} (or pass f16)");
                }
            }
        }
        if self.mlock {
            bail!("--mlock is not supported: ferrox does not lock the model in memory; drop the flag");
        }
        if self.no_mmap {
            bail!("--no-mmap is not supported: ferrox always memory-maps the model file; drop the flag");
        }
        if let Some(repo) = &self.hf_repo {
            bail!("-hf {repo}: ferrox never downloads; fetch the GGUF file (e.g. `huggingface-cli download`) and pass its path as MODEL");
        }
        match cmd {
            Cmd::Run if self.conversation => {
                bail!("`ferrox run` completes one prompt; for a conversation (llama.cpp's -cnv / -i) use `ferrox chat`")
            }
            Cmd::Run if self.system_prompt.is_some() => {
                bail!("-sys sets a chat system message: use `ferrox chat --system TEXT`")
            }
            Cmd::Chat if self.no_conversation => {
                bail!("-no-cnv asks for a plain completion: use `ferrox run MODEL -p PROMPT`")
            }
            Cmd::Serve if self.conversation || self.no_conversation => {
                bail!("-cnv / -no-cnv are llama-cli's; `ferrox serve` takes neither")
            }
            Cmd::Serve if self.system_prompt.is_some() => {
                bail!("-sys: `ferrox serve` takes the system message from each request's messages")
            }
            Cmd::Serve if self.no_cont_batching => {
                bail!("-nocb: `ferrox serve` always batches continuously; --parallel 1 decodes one request at a time")
            }
            _ => Ok(()),
        }
    }

    /// `-sys`/`--system-prompt`, which `chat` takes as `--system`.
    pub fn system_prompt(&self) -> Option<&str> {
        self.system_prompt.as_deref()
    }
}

/// llama.cpp's multi-letter single-dash flags, as long spellings clap reads
/// (clap reads `-ngl` as `-n gl`).
pub const SINGLE_DASH: &[(&str, &str)] = &[
    ("-ngl", "--n-gpu-layers"),
    ("-np", "--parallel"),
    ("-md", "--model-draft"),
    ("-sys", "--system-prompt"),
    ("-cnv", "--conversation"),
    ("-no-cnv", "--no-conversation"),
    ("-fa", "--flash-attn"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
    ("-cb", "--cont-batching"),
    ("-nocb", "--no-cont-batching"),
    ("-hf", "--hf-repo"),
    ("-hfr", "--hf-repo"),
];
