//! `ferrox quantize IN.gguf OUT.gguf MIX`: llama-quantize's mixes, with its
//! per-tensor rules (`ferrox_core::requantize`), from the same input byte
//! for byte the tensors llama-quantize writes.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ferrox_core::ftype::{Mix, MIX_NAMES};
use ferrox_core::requantize::{requantize_mix, Options, TensorPlan};

/// The `--help` list of targets, from llama-quantize's table.
fn targets_help() -> String {
    let mut s = String::from(
        "Targets (llama-quantize's names, any case, or the file-type number):\n",
    );
    for (name, mix, what) in MIX_NAMES {
        let can = match ferrox_core::requantize::mix_support(*mix) {
            Ok(()) => String::new(),
            Err(_) => "  [not in ferrox yet]".to_string(),
        };
        s.push_str(&format!("  {:>2}  {name:<10} {what}{can}\n", mix.file_type()));
    }
    s
}

#[derive(clap::Args)]
#[command(after_help = targets_help())]
pub struct Args {
    /// IN.gguf OUT.gguf MIX, or OUT.gguf MIX with -m IN.gguf.
    #[arg(num_args = 2..=3, required = true, value_names = ["IN", "OUT", "MIX"])]
    args: Vec<String>,
    /// The input model (instead of the first positional argument).
    #[arg(short = 'm', long = "model")]
    model: Option<PathBuf>,
    /// Threads to quantize with (default: all cores).
    #[arg(short = 't', long)]
    threads: Option<usize>,
    /// Overwrite OUT if it exists.
    #[arg(short = 'f', long)]
    force: bool,
    /// Convert tensors that are already quantized (quality suffers compared
    /// with quantizing from 16 or 32 bits), as llama-quantize's flag.
    #[arg(long)]
    allow_requantize: bool,
    /// Every matrix at the mix's base kind: no per-tensor rules.
    #[arg(long)]
    pure: bool,
    /// Leave output.weight as it is.
    #[arg(long)]
    leave_output_tensor: bool,
}

/// Opens the output's temporary file before any work, so a missing or
/// read-only directory is reported at once.
fn create_partial(out: &Path) -> Result<(PathBuf, std::fs::File)> {
    let dir = match out.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!("cannot write {}: directory {} does not exist", out.display(), dir.display());
    }
    let tmp = out.with_extension("gguf.partial");
    let f = std::fs::File::create(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    Ok((tmp, f))
}

/// Progress on stderr: a bar on a terminal, one line per tensor otherwise.
enum Report {
    Bar(indicatif::ProgressBar),
    Lines,
}

impl Report {
    fn new(count: u64) -> Report {
        if std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(count);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:40} {pos}/{len} {elapsed} {msg}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            Report::Bar(bar)
        } else {
            Report::Lines
        }
    }

    fn tensor(&self, line: String, name: &str) {
        match self {
            Report::Bar(b) => {
                b.set_message(name.to_string());
                b.inc(1);
            }
            Report::Lines => {
                let _ = writeln!(std::io::stderr().lock(), "{line}");
            }
        }
    }

    fn finish(&self) {
        if let Report::Bar(b) = self {
            b.finish_and_clear();
        }
    }
}

pub fn run(a: Args) -> Result<()> {
    let (input, out, name) = match (a.args.as_slice(), a.model) {
        ([i, o, k], None) => (PathBuf::from(i), PathBuf::from(o), k.clone()),
        ([o, k], Some(m)) => (m, PathBuf::from(o), k.clone()),
        ([_, _, _], Some(_)) => bail!("give the input either as IN or as -m, not both"),
        _ => bail!("usage: ferrox quantize IN.gguf OUT.gguf MIX (or -m IN.gguf OUT.gguf MIX)"),
    };
    let mix = Mix::parse(&name).with_context(|| {
        let names: Vec<_> = MIX_NAMES.iter().map(|r| r.0).collect();
        format!("unknown kind {name:?}; targets are {} (see ferrox quantize --help)", names.join(", "))
    })?;
    ferrox_core::requantize::mix_support(mix)?;
    if out.exists() && !a.force {
        bail!("{} exists; pass -f to overwrite it", out.display());
    }
    if input.canonicalize().ok() == out.canonicalize().ok() {
        bail!("the output would overwrite the input {}", input.display());
    }
    let threads = a
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let opts = Options {
        mix,
        pure: a.pure,
        leave_output: a.leave_output_tensor,
        allow_requantize: a.allow_requantize,
    };

    let model = crate::open_model(&input)?;
    // The plan is checked (kinds, --allow-requantize) and the output opened
    // before any tensor is converted.
    ferrox_core::requantize::plan_for(&model, &opts)
        .with_context(|| format!("cannot quantize {} to {}", input.display(), mix.name()))?;
    let (tmp, file) = create_partial(&out)?;
    let result = convert_and_write(&model, &opts, threads, file, &input);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let fallbacks = result?;
    // Written under a temporary name and renamed, so an interrupted run
    // never leaves a truncated file under the output name.
    std::fs::rename(&tmp, &out)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), out.display()))?;
    let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({:.1} MiB, {}){}",
        out.display(),
        size as f64 / (1u64 << 20) as f64,
        mix.name(),
        if fallbacks > 0 {
            format!("; {fallbacks} tensor(s) used a fallback kind")
        } else {
            String::new()
        }
    );
    Ok(())
}

/// Converts every tensor and writes the file; returns how many tensors fell
/// back to another kind.
fn convert_and_write(
    model: &ferrox_gguf::GgufModel,
    opts: &Options,
    threads: usize,
    file: std::fs::File,
    input: &Path,
) -> Result<usize> {
    let report = Report::new(model.tensors().len() as u64);
    let mut fallbacks = 0usize;
    let writer = requantize_mix(model, opts, threads, |p| {
        let what = match p.plan {
            TensorPlan::Copy => format!("{} (kept)", p.from),
            TensorPlan::Convert(k) => format!("{} -> {k}", p.from),
            TensorPlan::Fallback { wanted, got } => {
                fallbacks += 1;
                format!(
                    "{} -> {got} (fallback: row of {} is not whole {wanted} blocks)",
                    p.from, p.dims[0]
                )
            }
        };
        let dims: Vec<String> = p.dims.iter().map(u64::to_string).collect();
        report.tensor(
            format!("[{:>4}/{}] {:<40} {:<16} {}", p.index, p.count, p.name, dims.join("x"), what),
            p.name,
        );
    });
    report.finish();
    let writer = writer
        .with_context(|| format!("cannot quantize {} to {}", input.display(), opts.mix.name()))?;
    let mut w = std::io::BufWriter::new(file);
    writer.write(&mut w).and_then(|()| w.flush()).context("cannot write the output")?;
    Ok(fallbacks)
}
