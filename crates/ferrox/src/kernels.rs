//! `ferrox kernels MODEL [--backend B] [--json]`: where every weight is
//! placed and which kernel runs for it, decode and prefill, with fallbacks
//! named and per-token totals.

use std::io::Write;

use anyhow::{Context, Result};
use ferrox_core::backend::DeviceBackend;
use ferrox_core::kernel_registry::Backend;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: crate::load::ModelArg,
    /// The backend to plan for (`--backend`: any backend ferrox knows,
    /// whether or not this build or machine has it — the capability tables
    /// are compiled in every build), and `--n-gpu-layers` for a split.
    #[command(flatten)]
    backend: crate::load::BackendArgs,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

pub fn run(a: Args) -> Result<()> {
    let path = a.model.or_default()?;
    let file = crate::open_model(&path)?;
    // No device is opened and no weight read: the plan is the capability
    // tables' answer for this file, the same function a loaded model's plan is.
    let opts = a.backend.options_for(&file)?;
    let device = match (opts.backend, opts.gpu_layers) {
        (Backend::Cpu, _) => ferrox_core::backend::cpu::Cpu::new(opts.threads).describe(),
        (b, None) => format!("{b} (planned from its capability table; no device opened)"),
        (b, Some(g)) => format!("cpu + {b}: the last {g} layers on {b} (planned from the capability tables; no device opened)"),
    };
    let plan = ferrox_core::model::plan(&file, opts.backend, opts.gpu_layers, device)
        .with_context(|| format!("cannot plan model {}", path.display()))?;
    let plan = &plan;
    // Written, not printed: a reader that closes the pipe (`| head`) ends
    // the command quietly (main), where `println!` would panic.
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(plan)?)?;
        return Ok(());
    }
    writeln!(out, "backend: {}  device: {}", plan.backend, plan.device)?;
    let row = |out: &mut std::io::StdoutLock, cells: [&str; 6]| {
        let [name, kind, shape, on, decode, fallback] = cells;
        writeln!(out, "{name:<34} {kind:<7} {shape:<16} {on:<8} {decode:<44} {fallback}")
    };
    row(&mut out, ["tensor", "kind", "shape", "on", "decode kernel", "fallback"])?;
    for t in &plan.tensors {
        let shape: Vec<String> = t.dims.iter().map(u64::to_string).collect();
        let on = t.backend.to_string();
        row(&mut out, [&t.name, &t.kind, &shape.join("x"), &on, &t.decode, t.fallback.as_deref().unwrap_or("-")])?;
    }
    let prefill: std::collections::BTreeSet<&str> = plan.tensors.iter().map(|t| t.prefill.as_str()).collect();
    writeln!(out, "\nprefill kernels:")?;
    for p in prefill {
        writeln!(out, "  {p}")?;
    }
    writeln!(
        out,
        "\nper decoded token: {:.1} MiB of weights read, {} host<->device crossings",
        plan.bytes_per_token as f64 / (1 << 20) as f64,
        plan.crossings_per_token
    )?;
    let fallbacks = plan.tensors.iter().filter(|t| t.fallback.is_some()).count();
    writeln!(out, "fallbacks: {fallbacks}; unused file tensors: {}", plan.unused.len())?;
    for u in &plan.unused {
        writeln!(out, "  unused: {u}")?;
    }
    for u in &plan.unverified {
        writeln!(out, "unverified: {u}")?;
    }
    for r in &plan.refused {
        writeln!(out, "cannot run on {}: {r}", plan.backend)?;
    }
    Ok(())
}
