//! NVRTC: the one kernel source, compiled per architecture and cached on
//! disk under `~/.cache/ferrox/cuda/<hash>.ptx`, keyed by the source, the
//! architecture and NVRTC's version, so an edited kernel or another
//! toolkit never loads a stale file.

use std::fmt::Write;
use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};
use sha2::{Digest, Sha256};

use crate::CudaError;

const KERNELS: &str = include_str!("kernels.cu");

/// The CUDA C source of every kernel: the IQ lattice tables, printed from
/// ferrox-quant's (the CPU reference's own, so the two cannot disagree),
/// then `kernels.cu`. The disk cache's key hashes all of it.
pub fn kernel_source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| {
        let mut s = iq_tables();
        s.push_str(KERNELS);
        s
    })
}

/// `static __device__ const` arrays, not `__constant__`: lanes of a warp
/// index them at different places, which serializes constant memory; the
/// kernels read them with `__ldg` (through L1).
fn iq_tables() -> String {
    use ferrox_quant::scalar::iq_grids as g;
    fn table<T: Copy + Into<u64>>(s: &mut String, ctype: &str, suffix: &str, name: &str, v: &[T]) {
        let _ = write!(
            s,
            "static __device__ const {ctype} {name}[{}] = {{",
            v.len()
        );
        for (i, &x) in v.iter().enumerate() {
            let sep = if i % 8 == 0 { "\n    " } else { " " };
            let _ = write!(s, "{sep}0x{:x}{suffix},", x.into());
        }
        s.push_str("\n};\n");
    }
    let mut s = String::from(
        "// IQ lattice grids, printed by compile.rs from ferrox_quant::scalar::iq_grids.\n",
    );
    let u64t = "unsigned long long";
    table(&mut s, u64t, "ull", "iq2xxs_grid", &g::IQ2XXS_GRID);
    table(&mut s, u64t, "ull", "iq2xs_grid", &g::IQ2XS_GRID);
    table(&mut s, u64t, "ull", "iq2s_grid", &g::IQ2S_GRID);
    table(&mut s, "unsigned int", "u", "iq3xxs_grid", &g::IQ3XXS_GRID);
    table(&mut s, "unsigned int", "u", "iq3s_grid", &g::IQ3S_GRID);
    table(&mut s, u64t, "ull", "iq1s_grid", &g::IQ1S_GRID);
    s.push('\n');
    s
}

/// The kernel whose `PDL_ENTER` is at 1-based `line` of [`kernel_source`]
/// (what `FERROX_TRACE` records): the macro call for a kernel a `DEFINE_...`
/// line makes (one line may make several: `DEFINE_KIND(q4_0)`), else the
/// name after the nearest `__global__ void` at or above the line.
pub fn kernel_at_line(src: &str, line: usize) -> String {
    let lines: Vec<&str> = src.lines().collect();
    let Some(at) = line.checked_sub(1).filter(|&i| i < lines.len()) else {
        return format!("line {line}");
    };
    let t = lines[at].trim();
    if t.starts_with("DEFINE_") {
        return t.trim_end_matches(';').to_string();
    }
    for l in lines[..=at].iter().rev() {
        if let Some(p) = l.find("__global__ void ") {
            // Skip `__launch_bounds__(..)` and upper-case bound macros.
            let name = l[p + 16..]
                .split_whitespace()
                .find(|w| w.starts_with(|c: char| c.is_ascii_lowercase()) && w.contains('('))
                .and_then(|w| w.split('(').next());
            return name.map_or_else(|| format!("line {line}"), str::to_string);
        }
    }
    format!("line {line}")
}

/// Every kernel entry point [`kernel_source`] defines, by name: each
/// `extern "C" __global__` function, with the `DEFINE_...(arg)` macro calls
/// expanded (a `name_##ARG(` in the macro's body names `name_arg`).
///
/// This is the launch side of the CUDA backend's claims⇔launch test: the
/// names `Device::open` looks up must be here (a claimed kind whose
/// `DEFINE_KIND` line is gone fails it without a GPU).
pub fn defined_kernels(src: &str) -> std::collections::BTreeSet<String> {
    kernel_signatures(src).into_keys().collect()
}

/// Every kernel entry point of `src` (as [`defined_kernels`]) with the C
/// types of its parameters, in order, as a launch must pass them: `ptr` for
/// any pointer, else the type without qualifiers (`int`, `long long`,
/// `float`, `MmvqMats`). A debug build's `Device` checks every launch's
/// arguments against this, so an argument-order slip fails the GPU tests.
pub fn kernel_signatures(src: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    // Macro bodies as one logical line each.
    let joined = src.replace("\\\n", " ");
    // Per macro: its parameters, and its kernels' names (as pieces between
    // `##`) with their parameter types.
    type Kernel = (Vec<String>, Vec<String>);
    let mut macros: std::collections::HashMap<String, (Vec<String>, Vec<Kernel>)> = Default::default();
    let mut out = std::collections::BTreeMap::new();
    let mut plain = String::new();
    for line in joined.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("#define ") {
            // `#define MAC(A, B) ... name_##A##_x##B(...)`: the parameters,
            // and each kernel's name as pasted pieces.
            let rest = rest.replace(", ", ",");
            let head = rest.split_whitespace().next().unwrap_or("").to_string();
            let (mac, params) = head.split_once('(').map_or((head.as_str(), ""), |(m, p)| (m, p.trim_end_matches(')')));
            let params: Vec<&str> = params.split(',').filter(|p| !p.is_empty()).collect();
            let kernels: Vec<Kernel> = globals(&rest)
                .map(|(name, types)| (name.split("##").map(str::to_string).collect::<Vec<_>>(), types))
                .filter(|(pieces, _)| pieces.iter().any(|p| params.contains(&p.as_str())))
                .collect();
            if !kernels.is_empty() {
                let params = params.iter().map(|p| p.to_string()).collect();
                macros.insert(mac.to_string(), (params, kernels));
            }
        } else if let Some((mac, args)) = t.strip_suffix(')').and_then(|c| c.split_once('(')) {
            let args: Vec<&str> = args.split(',').map(str::trim).collect();
            match macros.get(mac) {
                Some((params, kernels)) => out.extend(kernels.iter().map(|(pieces, types)| {
                    let name: String = pieces
                        .iter()
                        .map(|p| params.iter().position(|q| q == p).and_then(|i| args.get(i).copied()).unwrap_or(p))
                        .collect();
                    (name, types.clone())
                })),
                None => {
                    plain.push_str(line);
                    plain.push('\n');
                }
            }
        } else {
            plain.push_str(line);
            plain.push('\n');
        }
    }
    out.extend(globals(&plain).map(|(name, params)| (name.to_string(), params)));
    out
}

/// The `__global__ void NAME(PARAMS)` definitions in `text`: each name and
/// its parameters' C types (see [`kernel_signatures`]).
fn globals(text: &str) -> impl Iterator<Item = (&str, Vec<String>)> {
    text.match_indices("__global__ void ").filter_map(move |(at, m)| {
        let mut rest = text[at + m.len()..].trim_start();
        if let Some(after) = rest.strip_prefix("__launch_bounds__") {
            rest = after[balanced(after)?..].trim_start();
        }
        let open = rest.find('(')?;
        let name = rest[..open].trim();
        let close = balanced(&rest[open..])?;
        let params = rest[open + 1..open + close - 1]
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| match p.contains('*') {
                true => "ptr".to_string(),
                false => {
                    let words: Vec<&str> = p.split_whitespace().filter(|w| !matches!(*w, "const" | "__restrict__")).collect();
                    words[..words.len().saturating_sub(1)].join(" ")
                }
            })
            .collect();
        Some((name, params))
    })
}

/// The length of the balanced parenthesized group `s` starts with.
fn balanced(s: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ if depth == 0 => return None,
            _ => {}
        }
    }
    None
}

/// Whether `libnvrtc` can be loaded; cudarc panics on first use otherwise.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names; no
    // symbol is resolved or called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn options(arch: &str, defines: &[String]) -> CompileOptions {
    let mut options = vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()];
    options.extend(defines.iter().map(|d| format!("-D{d}")));
    CompileOptions {
        options,
        ..Default::default()
    }
}

/// The kernel source's compile-time knobs from `FERROX_CUDA_DEFINES`
/// ([`parse_defines`]): a measuring aid for trying a kernel variant without
/// a new build; the defaults in `kernels.cu` are the measured choices.
/// Read only in a `measure` build; a release build compiles the defaults.
#[cfg(feature = "measure")]
pub(crate) fn env_defines() -> Result<Vec<String>, CudaError> {
    std::env::var("FERROX_CUDA_DEFINES").map_or(Ok(Vec::new()), |v| parse_defines(&v))
}

/// Without the `measure` feature, no defines: the kernels as `kernels.cu`
/// sets them.
#[cfg(not(feature = "measure"))]
pub(crate) fn env_defines() -> Result<Vec<String>, CudaError> {
    Ok(Vec::new())
}

/// `NAME` or `NAME=VALUE` items separated by spaces or commas (e.g.
/// `FERROX_PREFETCH=0,MMVQ_STEP=8`); anything but identifiers and plain
/// values is refused, so nothing else reaches NVRTC's command line.
#[cfg(any(test, feature = "measure"))]
pub(crate) fn parse_defines(v: &str) -> Result<Vec<String>, CudaError> {
    let ident = |s: &str| {
        !s.is_empty()
            && !s.starts_with(|c: char| c.is_ascii_digit())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    v.split(|c: char| c == ',' || c.is_whitespace())
        .filter(|d| !d.is_empty())
        .map(|d| {
            let (name, value) = d.split_once('=').unwrap_or((d, "1"));
            let plain = !value.is_empty() && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if name == "FERROX_SMS" {
                Err(CudaError::Compile {
                    arch: String::new(),
                    log: "FERROX_CUDA_DEFINES: FERROX_SMS is the device's, set by the host".into(),
                })
            } else if ident(name) && plain {
                Ok(d.to_string())
            } else {
                Err(CudaError::Compile {
                    arch: String::new(),
                    log: format!("FERROX_CUDA_DEFINES: {d:?} is not NAME or NAME=VALUE"),
                })
            }
        })
        .collect()
}

fn nvrtc_version() -> String {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: called only after `nvrtc_present` loaded the library; writes
    // two ints through valid pointers.
    let ok = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    if ok == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS {
        format!("{major}.{minor}")
    } else {
        "unknown".into()
    }
}

fn compile(arch: &str, defines: &[String]) -> Result<Ptx, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::MissingLibrary { lib: "libnvrtc" });
    }
    cudarc::nvrtc::compile_ptx_with_opts(kernel_source(), options(arch, defines)).map_err(|e| {
        CudaError::Compile {
            arch: arch.to_string(),
            log: match e {
                CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
                other => other.to_string(),
            },
        }
    })
}

/// Compiles every kernel for `arch` (e.g. [`crate::CHECK_ARCH`]) with NVRTC
/// alone: no driver, no device. Returns the PTX's size.
pub fn compile_check(arch: &str) -> Result<usize, CudaError> {
    Ok(compile(arch, &[])?.to_src().len())
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("FERROX_CUDA_CACHE") {
        return Some(PathBuf::from(d));
    }
    let home = std::env::var_os("HOME")?;
    Some(PathBuf::from(home).join(".cache/ferrox/cuda"))
}

/// The module for `arch` (with `defines`, [`env_defines`]): from the disk
/// cache, or compiled and stored. A cache that cannot be written only costs
/// a compile per process.
pub(crate) fn ptx_for(arch: &str, defines: &[String]) -> Result<Ptx, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::MissingLibrary { lib: "libnvrtc" });
    }
    let mut h = Sha256::new();
    h.update(kernel_source().as_bytes());
    h.update(arch.as_bytes());
    h.update(nvrtc_version().as_bytes());
    for d in defines {
        h.update(b"\0");
        h.update(d.as_bytes());
    }
    let key: String = h
        .finalize()
        .iter()
        .take(12)
        .map(|b| format!("{b:02x}"))
        .collect();
    let path = cache_dir().map(|d| d.join(format!("{key}.ptx")));
    if let Some(text) = path.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
        return Ok(Ptx::from_src(text));
    }
    let ptx = compile(arch, defines)?;
    if let Some(p) = path {
        let text = ptx.to_src();
        let tmp = p.with_extension(format!("tmp{}", std::process::id()));
        let stored = p.parent().map(std::fs::create_dir_all).transpose().is_ok()
            && std::fs::write(&tmp, text).is_ok()
            && std::fs::rename(&tmp, &p).is_ok();
        if !stored {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(ptx)
}

#[cfg(test)]
mod tests {
    use ferrox_quant::scalar::iq_grids::{KMASK_IQ2XS, KSIGNS_IQ2XS};

    /// The IQ2/IQ3 decoders compute the sign byte of a 7-bit field (bit 7
    /// its parity: an even number of minus signs per 8) and the sign bit of
    /// element j (`1 << j`) instead of reading ggml's two small tables; this
    /// pins that they are those tables.
    #[test]
    fn iq_sign_tables_are_the_seven_bits_and_their_parity() {
        for (i, &s) in KSIGNS_IQ2XS.iter().enumerate() {
            assert_eq!(
                u32::from(s),
                i as u32 | (i.count_ones() & 1) << 7,
                "ksigns[{i}]"
            );
        }
        for (j, &m) in KMASK_IQ2XS.iter().enumerate() {
            assert_eq!(m, 1 << j);
        }
    }

    #[test]
    fn defines_take_names_and_plain_values_only() {
        let ok = super::parse_defines(" FERROX_PREFETCH=0,MMVQ_STEP=8  X ").unwrap();
        assert_eq!(ok, ["FERROX_PREFETCH=0", "MMVQ_STEP=8", "X"]);
        assert!(super::parse_defines("").unwrap().is_empty());
        for bad in ["A=", "=1", "1A=2", "A=1;rm", "A=\"x\"", "-DA", "A=(1)", "FERROX_SMS=4"] {
            assert!(super::parse_defines(bad).is_err(), "{bad}");
        }
    }

    /// Every kernel entry (`PDL_ENTER();` outside the macro's own
    /// definition) names a kernel or its DEFINE line, as the trace needs.
    #[test]
    fn every_pdl_enter_line_names_its_kernel() {
        let src = super::kernel_source();
        let mut seen = std::collections::BTreeSet::new();
        for (i, l) in src.lines().enumerate() {
            if l.contains("PDL_ENTER();") {
                let name = super::kernel_at_line(src, i + 1);
                assert!(!name.starts_with("line "), "line {}: {l}", i + 1);
                seen.insert(name);
            }
        }
        let at = |needle: &str| src.lines().position(|l| l.trim() == needle).map(|i| i + 1);
        for k in ["attention_dec", "add_rms_norm", "rms_norm", "matvec_f16_stream", "matvec_f16_glu_stream", "mmvq_stream_##NAME", "rope_kv"] {
            assert!(seen.contains(k), "{k} not among {seen:?}");
        }
        let q8 = at("DEFINE_MMVQ_STREAM(q8_0)").expect("DEFINE_MMVQ_STREAM(q8_0) line");
        assert_eq!(super::kernel_at_line(src, q8), "DEFINE_MMVQ_STREAM(q8_0)");
        assert_eq!(super::kernel_at_line(src, 0), "line 0");
        assert_eq!(super::kernel_at_line(src, usize::MAX), format!("line {}", usize::MAX));
    }

    /// Every table is there in full, so the hash that keys the PTX cache
    /// covers the grids too.
    #[test]
    fn the_source_begins_with_the_iq_grids() {
        let src = super::kernel_source();
        for (name, n) in [
            ("iq2xxs_grid", 256),
            ("iq2xs_grid", 512),
            ("iq2s_grid", 1024),
            ("iq3xxs_grid", 256),
            ("iq3s_grid", 512),
            ("iq1s_grid", 2048),
        ] {
            let decl = format!("{name}[{n}] = {{");
            let at = src.find(&decl).unwrap_or_else(|| panic!("no {decl}"));
            let body = &src[at..at + src[at..].find("};").unwrap()];
            assert_eq!(body.matches(',').count(), n, "{name}");
        }
        assert!(src.ends_with(super::KERNELS));
    }
}
