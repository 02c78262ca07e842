//! NVRTC: the one kernel source, compiled per architecture and cached on
//! disk under `~/.cache/ferrox/cuda/<hash>.ptx`, keyed by the source, the
//! architecture and NVRTC's version, so an edited kernel or another
//! toolkit never loads a stale file.

use std::path::PathBuf;

use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};
use sha2::{Digest, Sha256};

use crate::CudaError;

const SOURCE: &str = include_str!("kernels.cu");

/// The CUDA C source of every kernel.
pub fn kernel_source() -> &'static str {
    SOURCE
}

/// Whether `libnvrtc` can be loaded; cudarc panics on first use otherwise.
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library by its candidate names; no
    // symbol is resolved or called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

fn options(arch: &str) -> CompileOptions {
    CompileOptions {
        options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
        ..Default::default()
    }
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

fn compile(arch: &str) -> Result<Ptx, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::MissingLibrary { lib: "libnvrtc" });
    }
    cudarc::nvrtc::compile_ptx_with_opts(SOURCE, options(arch)).map_err(|e| CudaError::Compile {
        arch: arch.to_string(),
        log: match e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => other.to_string(),
        },
    })
}

/// Compiles every kernel for `arch` (e.g. [`crate::CHECK_ARCH`]) with NVRTC
/// alone: no driver, no device. Returns the PTX's size.
pub fn compile_check(arch: &str) -> Result<usize, CudaError> {
    Ok(compile(arch)?.to_src().len())
}

fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("FERROX_CUDA_CACHE") {
        return Some(PathBuf::from(d));
    }
    let home = std::env::var_os("HOME")?;
    Some(PathBuf::from(home).join(".cache/ferrox/cuda"))
}

/// The module for `arch`: from the disk cache, or compiled and stored. A
/// cache that cannot be written only costs a compile per process.
pub(crate) fn ptx_for(arch: &str) -> Result<Ptx, CudaError> {
    if !nvrtc_present() {
        return Err(CudaError::MissingLibrary { lib: "libnvrtc" });
    }
    let mut h = Sha256::new();
    h.update(SOURCE.as_bytes());
    h.update(arch.as_bytes());
    h.update(nvrtc_version().as_bytes());
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
    let ptx = compile(arch)?;
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
