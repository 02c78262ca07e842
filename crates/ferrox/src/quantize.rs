//! `ferrox quantize IN.gguf OUT.gguf KIND`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use ferrox_core::requantize::{requantize, TensorPlan};
use ferrox_quant::QuantKind;

#[derive(clap::Args)]
pub struct Args {
    /// IN.gguf OUT.gguf KIND, or OUT.gguf KIND with -m IN.gguf.
    #[arg(num_args = 2..=3, required = true, value_names = ["IN", "OUT", "KIND"])]
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
}

pub fn run(a: Args) -> Result<()> {
    let (input, out, kind) = match (a.args.as_slice(), a.model) {
        ([i, o, k], None) => (PathBuf::from(i), PathBuf::from(o), k.clone()),
        ([o, k], Some(m)) => (m, PathBuf::from(o), k.clone()),
        ([_, _, _], Some(_)) => bail!("give the input either as IN or as -m, not both"),
        _ => bail!("usage: ferrox quantize IN.gguf OUT.gguf KIND (or -m IN.gguf OUT.gguf KIND)"),
    };
    let target = QuantKind::from_name(&kind).with_context(|| {
        let names: Vec<_> = QuantKind::ALL.iter().map(|k| k.name()).collect();
        format!("unknown kind {kind:?}; kinds are {}", names.join(", "))
    })?;
    ferrox_quant::quantize_support(target)?;
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

    let model = crate::open_model(&input)?;
    let mut fallbacks = 0usize;
    let stderr = std::io::stderr();
    let writer = requantize(&model, target, threads, |p| {
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
        let _ = writeln!(
            stderr.lock(),
            "[{:>4}/{}] {:<40} {:<16} {}",
            p.index,
            p.count,
            p.name,
            dims.join("x"),
            what
        );
    })
    .with_context(|| format!("cannot quantize {} to {target}", input.display()))?;

    // Write to a temporary name and rename, so an interrupted run never
    // leaves a truncated file under the output name.
    let tmp = out.with_extension("gguf.partial");
    writer
        .write_to(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &out)
        .with_context(|| format!("cannot rename {} to {}", tmp.display(), out.display()))?;
    let size = std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "wrote {} ({:.1} MiB, {target}){}",
        out.display(),
        size as f64 / (1u64 << 20) as f64,
        if fallbacks > 0 {
            format!("; {fallbacks} tensor(s) used a fallback kind")
        } else {
            String::new()
        }
    );
    Ok(())
}
