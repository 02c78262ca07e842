//! The kernel registry: which backend each weight is placed on and which
//! kernel really runs for it, decided once at load.
//!
//! The decision: the plan is *data* computed from the same capability
//! tables dispatch reads ([`crate::backend::BackendCaps`], the CPU's
//! `ferrox_quant::cpu::select`), so `ferrox kernels` cannot report a kernel
//! that is not the one a forward pass calls. A fallback is named, never
//! silent, and the per-token totals (bytes read, host↔device crossings) come
//! from the same plan.

use ferrox_quant::QuantKind;
use serde::Serialize;

use crate::arch::{Feeds, Role};
use crate::backend::gpu_backend_table;

macro_rules! registry_backend_enum {
    ([$($extra:tt),*] $(($variant:ident, $feature:literal, $ty:ident)),* $(,)?) => {
        /// Where a kernel runs: the CPU, then every accelerator of the
        /// backend table, generated from it so the two cannot disagree.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
        #[serde(rename_all = "lowercase")]
        pub enum Backend {
            /// The host CPU (the reference backend).
            Cpu,
            $(#[doc = $feature] $variant,)*
        }

        impl Backend {
            /// Every backend: the CPU, then the table's rows in order.
            pub const ALL: &'static [Backend] = &[Backend::Cpu, $(Backend::$variant),*];

            /// The name users type (`--backend cpu`) and `FERROX_<NAME>` uses.
            pub const fn name(self) -> &'static str {
                match self {
                    Backend::Cpu => "cpu",
                    $(Backend::$variant => $feature,)*
                }
            }
        }
    };
}
gpu_backend_table!(registry_backend_enum);

impl Backend {
    /// Whether this is an accelerator (anything but the CPU).
    pub const fn is_accelerator(self) -> bool {
        !matches!(self, Backend::Cpu)
    }

    /// The backend a user named, if it exists in this build's table.
    pub fn from_name(name: &str) -> Option<Backend> {
        Backend::ALL.iter().copied().find(|b| b.name().eq_ignore_ascii_case(name))
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One weight tensor's placement and kernels.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Placement {
    /// GGUF name.
    pub name: String,
    /// Its role (`None`: a tensor the architecture does not use).
    pub role: Option<String>,
    /// Storage kind.
    pub kind: String,
    /// Dimensions, ggml order.
    pub dims: Vec<u64>,
    /// Bytes in the file.
    pub bytes: u64,
    /// Where it lives.
    pub backend: Backend,
    /// What a decode step (one token) runs for it.
    pub decode: String,
    /// What a prefill (many tokens) runs for it.
    pub prefill: String,
    /// A fallback, by name, when the best path for this kind does not exist.
    pub fallback: Option<String>,
    /// Bytes a decode step reads from it.
    pub bytes_per_token: u64,
}

/// The whole placement plan of a loaded model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelPlan {
    /// The backend the forward pass runs on.
    pub backend: Backend,
    /// Instruction set (CPU) or device name.
    pub device: String,
    /// Every tensor of the file, in file order.
    pub tensors: Vec<Placement>,
    /// Weight bytes read per decoded token.
    pub bytes_per_token: u64,
    /// Host↔device copies per decoded token (ids in, logits out).
    pub crossings_per_token: u32,
    /// File tensors the model does not use (reported, never silently dropped).
    pub unused: Vec<String>,
    /// What the backend cannot run for this model, by its limits (a head
    /// size past its attention kernels'…): the model does not load there,
    /// and the plan says why before a weight is read.
    pub refused: Vec<String>,
    /// What the plan's kernels have never been checked on, per backend that
    /// says so ([`BackendCaps::unverified`](crate::backend::BackendCaps::unverified)):
    /// Metal's, which no Apple machine has run.
    pub unverified: Vec<String>,
}

/// What `backend`'s kernels have never been checked on, by its capability
/// data (`None`: its suite runs somewhere).
pub(crate) fn unverified(backend: Backend) -> Option<String> {
    #[allow(unused_mut)]
    let mut out = None;
    #[allow(unused_macros)]
    macro_rules! accel {
        ($b:ty) => {
            if <$b as crate::backend::BackendCaps>::ID == backend {
                out = <$b as crate::backend::BackendCaps>::unverified().map(|why| format!("{}: {why}", <$b as crate::backend::BackendCaps>::NAME));
            }
        };
    }
    crate::backend::with_gpu_backend_caps!(accel);
    out
}

/// What `backend` refuses for a model of `head_dim`/`head_dim_v`, by its
/// capability data ([`BackendCaps::max_head_dim`](crate::backend::BackendCaps::max_head_dim)).
pub(crate) fn refusals(backend: Backend, head_dim: usize, head_dim_v: usize) -> Vec<String> {
    #[allow(unused_mut)]
    let mut out = Vec::new();
    #[allow(unused_macros)]
    macro_rules! accel {
        ($b:ty) => {
            if <$b as crate::backend::BackendCaps>::ID == backend {
                if let Some(max) = <$b as crate::backend::BackendCaps>::max_head_dim() {
                    if head_dim.max(head_dim_v) > max {
                        out.push(format!(
                            "{}'s attention kernels take head sizes up to {max}; this model's are {head_dim}/{head_dim_v}",
                            <$b as crate::backend::BackendCaps>::NAME
                        ));
                    }
                }
            }
        };
    }
    crate::backend::with_gpu_backend_caps!(accel);
    out
}

/// Why the weights `plan` puts on an accelerator do not fit in `free` bytes
/// of its memory, with the `-ngl` that would (blocks are `blk.N.` tensors of
/// `n_layer`), or `None` when they fit.
pub fn memory_refusal(plan: &KernelPlan, free: u64, n_layer: usize) -> Option<String> {
    let on_device = plan.tensors.iter().filter(|p| p.backend.is_accelerator());
    let need: u64 = on_device.clone().map(|p| p.bytes).sum();
    if need <= free {
        return None;
    }
    let blocks: u64 = on_device.filter(|p| p.name.starts_with("blk.")).map(|p| p.bytes).sum();
    let fixed = need - blocks;
    let per_layer = blocks / n_layer.max(1) as u64;
    let fit = match per_layer {
        0 => 0,
        b => (free.saturating_sub(fixed) / b).min(n_layer as u64),
    };
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    Some(format!(
        "the model's weights on {} take {:.2} GiB and the device has {:.2} GiB free: put fewer layers on it with -ngl N (about {fit} of {n_layer} fit)",
        plan.backend,
        gib(need),
        gib(free)
    ))
}

/// One layer's matrices and the facts its decode fusions depend on, as the
/// decoder (`Model::forward`) will call the seam for it: what a backend's
/// [`BackendCaps::fused_decode`](crate::backend::BackendCaps::fused_decode) reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerMats {
    /// Separate Q, K and V projections (`None` with a fused QKV matrix).
    pub qkv: Option<[ferrox_ops::Mat; 3]>,
    /// Gate (`None` where gate and up are one matrix) and up.
    pub gate_up: Option<[ferrox_ops::Mat; 2]>,
    /// The attention's output projection.
    pub out: ferrox_ops::Mat,
    /// The FFN's down projection (`None` in a layer of experts).
    pub down: Option<ferrox_ops::Mat>,
    /// Q, K and V go straight to RoPE (no biases, no Q/K norms): a backend's
    /// attention block may project, rotate and store them in one launch.
    pub qkv_direct: bool,
    /// The output projection adds straight into the residual (no bias, no post-norm).
    pub out_direct: bool,
    /// The down projection adds straight into the residual (no post-norm).
    pub down_direct: bool,
    /// Whether this is the first block (nothing is pending before its norm).
    pub first: bool,
    /// NeoX pairing (halves) rather than adjacent pairs.
    pub halves: bool,
    /// Rotated dimensions and the head size.
    pub n_rot: usize,
    /// Head size.
    pub head_dim: usize,
}

/// A placement's decode line with a backend's fusion for the layer, where it has one.
pub(crate) fn fuse_decode(p: &mut Placement, role: Role, l: &LayerMats) {
    #[allow(unused_macros)]
    macro_rules! accel {
        ($b:ty) => {
            if <$b as crate::backend::BackendCaps>::ID == p.backend {
                if let Some(d) = <$b as crate::backend::BackendCaps>::fused_decode(role, l) {
                    p.decode = d;
                }
            }
        };
    }
    crate::backend::with_gpu_backend_caps!(accel);
}

/// Host↔device copies a decode step makes under `placements`: the token
/// ids (and positions) go up to the backend of the embedding lookup, the
/// activations cross wherever consecutive stages (embedding, each layer in
/// order, the head) sit on different backends, and the logits (or argmax
/// ids) come down from the head's backend. 0 on the CPU, 2 for a model
/// wholly on one device.
pub fn crossings_per_token(placements: &[Placement]) -> u32 {
    // Stage of a tensor: 0 the embedding, 1 + layer for a block, last the head.
    let stage = |p: &Placement| -> Option<usize> {
        match p.role.as_deref()? {
            r if r == Role::TokenEmbd.suffix() => Some(0),
            r if r == Role::Output.suffix() || r == Role::OutputNorm.suffix() => Some(usize::MAX),
            _ => p.name.strip_prefix("blk.")?.split('.').next()?.parse::<usize>().ok().map(|l| l + 1),
        }
    };
    let mut stages: Vec<(usize, Backend)> = placements.iter().filter_map(|p| Some((stage(p)?, p.backend))).collect();
    stages.sort_by_key(|&(s, _)| s);
    stages.dedup_by_key(|&mut (s, _)| s);
    let backends: Vec<Backend> = stages.iter().map(|&(_, b)| b).collect();
    let ends = [backends.first(), backends.last()].into_iter().flatten().filter(|b| b.is_accelerator()).count();
    let changes = backends.windows(2).filter(|w| w[0] != w[1]).count();
    (ends + changes) as u32
}

/// What a tensor of `role` (or no role) costs and runs on `backend`: the
/// CPU's kernel selection, or an accelerator's capability table.
pub(crate) fn placement(
    backend: Backend,
    name: &str,
    role: Option<Role>,
    kind: QuantKind,
    dims: &[u64],
    bytes: u64,
) -> Placement {
    let mut p = cpu_placement(name, role, kind, dims, bytes);
    if backend == Backend::Cpu {
        return p;
    }
    #[allow(unused_macros)]
    macro_rules! accel {
        ($b:ty) => {
            if <$b as crate::backend::BackendCaps>::ID == backend {
                let caps_name = <$b as crate::backend::BackendCaps>::NAME;
                p.backend = backend;
                match role.map(Role::feeds) {
                    Some(Feeds::Experts) => {
                        let k = <$b as crate::backend::BackendCaps>::experts_kernel(kind);
                        p.fallback = k.is_none().then(|| format!("no {caps_name} kernel for mixture-of-experts matrices: the model cannot load on {backend}"));
                        p.decode = k.unwrap_or_else(|| "none".to_string());
                        p.prefill = p.decode.clone();
                    }
                    Some(Feeds::Matmul | Feeds::Router) => {
                        let cols = dims.first().copied().unwrap_or(0) as usize;
                        let k = <$b as crate::backend::BackendCaps>::decode_kernel(kind, cols);
                        p.prefill = match k {
                            Some(_) => <$b as crate::backend::BackendCaps>::prefill_kernel(kind, cols),
                            None => "none".to_string(),
                        };
                        p.fallback = k.is_none().then(|| format!("no {caps_name} kernel for {kind}: the model cannot load on {backend}"));
                        p.decode = k.unwrap_or_else(|| "none".to_string());
                        // A router runs its matvec at every batch size:
                        // routing is a choice, and a GEMM's f16 rounding
                        // would move its near ties.
                        if role.map(Role::feeds) == Some(Feeds::Router) {
                            p.prefill = p.decode.clone();
                        }
                        if role == Some(Role::FfnGateInpShexp) {
                            match <$b as crate::backend::BackendCaps>::shared_expert_kernel() {
                                Some(k) => (p.decode, p.prefill) = (k.clone(), k),
                                None => {
                                    p.fallback = Some(format!(
                                        "no {caps_name} kernel for a mixture-of-experts shared expert (its sigmoid-gated output): the model cannot load on {backend}"
                                    ));
                                    p.decode = "none".to_string();
                                    p.prefill = "none".to_string();
                                }
                            }
                        }
                    }
                    Some(Feeds::Embedding) => {
                        p.decode = format!("{caps_name} get_rows ({kind})");
                        p.prefill = p.decode.clone();
                    }
                    Some(Feeds::Norm | Feeds::Bias | Feeds::RopeFactors) => {
                        p.decode = format!("{caps_name} f32 element-wise");
                        p.prefill = p.decode.clone();
                        // gpt-oss: a sink logit per head in attention's
                        // softmax, and experts with biases, the clamped
                        // SwiGLU and softmax after the top-k.
                        let (k, what) = match role {
                            Some(Role::AttnSinks) => (<$b as crate::backend::BackendCaps>::attention_sinks_kernel(), "attention sinks"),
                            Some(r) if r == Role::FfnGateInpBias || r.expert_bias() => (
                                <$b as crate::backend::BackendCaps>::oai_experts_kernel(),
                                "gpt-oss's mixture-of-experts blocks (biased router and experts, swiglu_oai, softmax after top-k)",
                            ),
                            _ => (Some(p.decode.clone()), ""),
                        };
                        match k {
                            Some(k) => (p.decode, p.prefill) = (k.clone(), k),
                            None => {
                                p.fallback = Some(format!("no {caps_name} kernel for {what}: the model cannot load on {backend}"));
                                p.decode = "none".to_string();
                                p.prefill = "none".to_string();
                            }
                        }
                    }
                    None => {}
                }
            }
        };
    }
    crate::backend::with_gpu_backend_caps!(accel);
    p
}

/// The bf16 product that a matrix held for the AMX GEMM takes from
/// `BF16_MIN_BATCH` tokens, when this CPU has it (`dims[0]`: the row length).
fn bf16_note(dims: &[u64]) -> String {
    let cols = dims.first().copied().unwrap_or(0) as usize;
    match ferrox_quant::gemm::bf16_kernel(cols) {
        Some(g) => format!("; {g}, widened to bf16 per call (batches of {}+)", ferrox_quant::gemm::BF16_MIN_BATCH),
        None => String::new(),
    }
}

/// What a tensor of `role` (or no role) costs and runs on the CPU.
pub(crate) fn cpu_placement(
    name: &str,
    role: Option<Role>,
    kind: QuantKind,
    dims: &[u64],
    bytes: u64,
) -> Placement {
    let feeds = role.map(Role::feeds);
    let (decode, prefill, fallback, per_token) = match feeds {
        Some(Feeds::Experts) => match crate::backend::cpu::kernel_for(kind) {
            // What a token reads is its experts' rows: the plan scales the
            // bytes by the share of experts used.
            Some(k) => (
                format!("cpu matvec over the routed experts' rows: {} (act {})", k.name, k.act),
                format!("cpu matmul per expert over the tokens routed to it: {} (act {})", k.name, k.act),
                k.fallback,
                bytes,
            ),
            None => ("none".into(), "none".into(), Some(format!("{kind} has no dot product")), bytes),
        },
        Some(Feeds::Matmul | Feeds::Router) => {
            let k = crate::backend::cpu::kernel_for(kind);
            // The copies re-laid at load, which take every product over the matrix.
            let rows = dims.get(1).copied().unwrap_or(0) as usize;
            let (head16, rows8) = (crate::backend::cpu::interleaves(name, kind, rows), crate::backend::cpu::relays_rows8(name, kind, rows));
            match k {
                Some(k) => (
                    match k.four_rows {
                        _ if head16 => format!(
                            "cpu matvec: {}, 16 rows interleaved at load (act {})",
                            ferrox_quant::matvec::InterleavedQ8_0::kernel(ferrox_quant::cpu::Isa::active()),
                            k.act
                        ),
                        _ if rows8 => format!(
                            "cpu matvec: {}, 8 rows interleaved at load (act {})",
                            ferrox_quant::matvec::Interleaved8::kernel(kind).unwrap_or("none"),
                            k.act
                        ),
                        Some(f) => format!("cpu matvec: {f}, four rows per call (act {})", k.act),
                        None => format!("cpu matvec: {} (act {})", k.name, k.act),
                    },
                    match k.gemm {
                        // The interleaved copy takes every product (batches too).
                        _ if head16 => {
                            match k.gemm {
                                Some((ferrox_quant::cpu::Isa::Amx, _)) => format!(
                                    "cpu matmul: {} on the interleaved copy (batches of {}+; exact, as one token's){}",
                                    ferrox_quant::matvec::InterleavedQ8_0::TILE_KERNEL,
                                    ferrox_quant::matvec::AMX_MIN_TOKENS,
                                    match ferrox_quant::gemm::bf16_kernel(dims.first().copied().unwrap_or(0) as usize) {
                                        Some(g) => format!(
                                            "; {g}, the copy widened to bf16 per call (batches of {}+, not the server's)",
                                            ferrox_quant::matvec::BF16_MIN_TOKENS
                                        ),
                                        None => String::new(),
                                    }
                                ),
                                _ => format!(
                                    "cpu matmul: {} per token on the interleaved copy",
                                    ferrox_quant::matvec::InterleavedQ8_0::kernel(ferrox_quant::cpu::Isa::active())
                                ),
                            }
                        }
                        Some((isa, g)) if rows8 => format!(
                            "cpu gemm: {g}, its panel unpacked from the interleaved copy (batches of {}+)",
                            ferrox_quant::gemm::min_batch_unpacked(isa, kind)
                        ),
                        Some((isa, g)) if ferrox_quant::gemm::reads_in_place(kind, isa) => {
                            format!("cpu gemm: {g}, {kind} read in place (batches of {}+){}", ferrox_quant::gemm::MIN_BATCH, bf16_note(dims))
                        }
                        Some((ferrox_quant::cpu::Isa::Amx, g)) if crate::backend::cpu::prepacks(name) => {
                            format!("cpu gemm: {g}, packed at load (batches of {}+){}", ferrox_quant::gemm::MIN_BATCH, bf16_note(dims))
                        }
                        Some((isa, g)) => {
                            let cols = dims.first().copied().unwrap_or(0) as usize;
                            let bf16 = match ferrox_quant::gemm::bf16_kernel(cols) {
                                Some(b) if ferrox_quant::gemm::bf16_per_call(kind, isa, cols, usize::MAX) => format!(
                                    "; {b}, widened to bf16 per call (batches of {}+, not in exact mode)",
                                    ferrox_quant::gemm::BF16_PER_CALL_MIN_BATCH
                                ),
                                _ => String::new(),
                            };
                            format!("cpu gemm: {g}, packed per call (batches of {}+){bf16}", ferrox_quant::gemm::min_batch_unpacked(isa, kind))
                        }
                        None => format!("cpu matmul: act quantized once per batch, {} per (row, token)", k.name),
                    },
                    k.fallback,
                    bytes,
                ),
                None => ("none".into(), "none".into(), Some(format!("{kind} has no dot product")), bytes),
            }
        }
        Some(Feeds::Embedding) => {
            let row = dims.first().copied().unwrap_or(0);
            let row_bytes = ferrox_quant::row_bytes(kind, row as usize).unwrap_or(0) as u64;
            (format!("cpu get_rows: dequantize one {kind} row"), "cpu get_rows".into(), None, row_bytes)
        }
        Some(Feeds::Norm | Feeds::Bias | Feeds::RopeFactors) => {
            ("cpu f32 element-wise (converted at load)".into(), "cpu f32 element-wise".into(), None, bytes)
        }
        None => ("unused".into(), "unused".into(), None, 0),
    };
    Placement {
        name: name.to_string(),
        role: role.map(|r| r.suffix().to_string()),
        kind: kind.name().to_string(),
        dims: dims.to_vec(),
        bytes,
        backend: Backend::Cpu,
        decode,
        prefill,
        fallback,
        bytes_per_token: per_token,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_is_first_and_every_backend_name_parses() {
        assert_eq!(Backend::ALL[0], Backend::Cpu);
        assert!(!Backend::Cpu.is_accelerator());
        for &b in Backend::ALL {
            assert_eq!(Backend::from_name(b.name()), Some(b));
        }
        assert_eq!(Backend::from_name("tpu"), None);
    }

    #[test]
    fn a_matmul_weight_names_the_kernel_the_cpu_selects() {
        let p = cpu_placement("blk.0.attn_q.weight", Some(Role::AttnQ), QuantKind::Q4K, &[256, 4], 576);
        // The four-row kernel where the level has one for the kind, else the
        // one-row kernel `select` picks.
        let k = ferrox_quant::cpu::select(QuantKind::Q4K, ferrox_quant::cpu::Isa::active()).unwrap();
        let want = crate::backend::cpu::kernel_for(QuantKind::Q4K).and_then(|c| c.four_rows).unwrap_or(k.name);
        assert!(p.decode.contains(want), "{} vs {want}", p.decode);
        assert_eq!(p.bytes_per_token, 576);
        let e = cpu_placement("token_embd.weight", Some(Role::TokenEmbd), QuantKind::Q8_0, &[64, 100], 6800);
        assert_eq!(e.bytes_per_token, 68, "one 64-wide Q8_0 row per token");
    }

    /// Crossings follow the plan: none on the CPU, ids in and logits out
    /// for a model wholly on a device, and two more for each change of
    /// backend between consecutive layers.
    #[test]
    fn crossings_per_token_counts_the_plan_s_backend_changes() {
        let Some(&gpu) = Backend::ALL.iter().find(|b| b.is_accelerator()) else {
            eprintln!("NOT CHECKED: no accelerator in the backend table");
            return;
        };
        let at = |name: &str, role: Role, b: Backend| {
            let mut p = cpu_placement(name, Some(role), QuantKind::F32, &[4], 16);
            p.backend = b;
            p
        };
        let model = |bs: [Backend; 4]| {
            vec![
                at("token_embd.weight", Role::TokenEmbd, bs[0]),
                at("blk.0.attn_norm.weight", Role::AttnNorm, bs[1]),
                at("blk.1.attn_norm.weight", Role::AttnNorm, bs[2]),
                at("output_norm.weight", Role::OutputNorm, bs[3]),
            ]
        };
        let cpu = Backend::Cpu;
        assert_eq!(crossings_per_token(&model([cpu; 4])), 0);
        assert_eq!(crossings_per_token(&model([gpu; 4])), 2);
        assert_eq!(crossings_per_token(&model([cpu, cpu, gpu, gpu])), 2, "activations up once, logits down");
        assert_eq!(crossings_per_token(&model([gpu, cpu, gpu, gpu])), 4);
    }

    /// Weights past the device's free memory are refused with an `-ngl`
    /// that fits; weights that fit are not.
    #[test]
    fn weights_past_free_device_memory_are_refused_naming_an_ngl_that_fits() {
        let Some(&gpu) = Backend::ALL.iter().find(|b| b.is_accelerator()) else {
            eprintln!("NOT CHECKED: no accelerator in the backend table");
            return;
        };
        let t = |name: &str, bytes| {
            let mut p = cpu_placement(name, Some(Role::AttnQ), QuantKind::F32, &[4, 4], bytes);
            p.backend = gpu;
            p
        };
        let tensors = (0..4).map(|l| t(&format!("blk.{l}.attn_q.weight"), 100)).chain([t("output.weight", 50)]).collect();
        let plan = KernelPlan { backend: gpu, device: String::new(), tensors, bytes_per_token: 0, crossings_per_token: 2, unused: vec![], refused: vec![], unverified: vec![] };
        assert_eq!(memory_refusal(&plan, 450, 4), None);
        let why = memory_refusal(&plan, 300, 4).expect("450 bytes in 300");
        assert!(why.contains("-ngl N (about 2 of 4 fit)"), "{why}");
    }

    /// A backend's limits refuse a model at plan time, by its capability
    /// data: CUDA's attention takes heads up to 256; the CPU any.
    #[test]
    fn a_head_size_past_a_backend_s_limit_is_refused_in_the_plan() {
        assert!(refusals(Backend::Cpu, 512, 512).is_empty());
        for &b in Backend::ALL.iter().filter(|b| b.is_accelerator()) {
            assert!(refusals(b, 256, 256).is_empty(), "{b}");
            let r = refusals(b, 512, 256);
            assert_eq!(r.len(), 1, "{b}: {r:?}");
            assert!(r[0].contains("up to 256") && r[0].contains("512"), "{}", r[0]);
        }
    }

    /// An accelerator's plan comes from its own capability table (ungated:
    /// answerable on a build without it), never from the CPU's.
    #[test]
    fn an_accelerator_placement_names_its_own_kernel_or_the_missing_one() {
        for &b in Backend::ALL.iter().filter(|b| b.is_accelerator()) {
            let p = placement(b, "blk.0.attn_q.weight", Some(Role::AttnQ), QuantKind::Q8_0, &[256, 4], 1088);
            assert_eq!(p.backend, b);
            assert!(!p.decode.contains("avx") && !p.decode.starts_with("cpu"), "{b}: {}", p.decode);
            // Every weight kind: one without a kernel is named, one with none
            // is not (CUDA now has every kind, so no fixed kind is missing).
            for &kind in QuantKind::ALL.iter().filter(|k| k.vec_dot_kind().is_some()) {
                let p = placement(b, "blk.0.attn_q.weight", Some(Role::AttnQ), kind, &[256, 4], 200);
                assert_eq!(p.fallback.is_some(), p.decode == "none", "{b} {kind}: {p:?}");
            }
        }
    }
}
