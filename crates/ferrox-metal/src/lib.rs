//! ferrox's Metal device: one library of Metal Shading Language kernels
//! (`kernels/`) compiled from source at run time (`newLibraryWithSource`,
//! so building needs no Xcode), a compute pipeline per kernel (made on
//! first use), buffers in shared memory (Apple silicon's unified memory:
//! the mapped model file is wrapped with `newBufferWithBytesNoCopy` where
//! its pages allow, not copied), and one command buffer that encodes
//! launches until the host reads or writes a buffer.
//!
//! The decisions (`docs/decisions/0037-metal-backend.md`): the kernels are
//! the Vulkan shaders' logic in MSL, one kernel per op, 64 threads a
//! threadgroup, tensors bound by index and parameters by `setBytes`. On
//! Apple targets the device is Metal's (`objc2-metal`); elsewhere it is
//! the **shim**: the same MSL text compiled as C++ against `shim/msl.h`
//! and run on the CPU, opened only when `FERROX_METAL=shim` asks for it
//! (as lavapipe is opened for Vulkan only when named). The shim is how the kernels' logic and
//! the backend's dispatch are tested on Linux; Apple's compiler and GPU
//! are not, and nothing here has run on them.

/// The Metal source of every kernel, in the order it is compiled.
pub const SOURCE: &str = concat!(
    include_str!("../kernels/common.metal"),
    "\n",
    include_str!("../kernels/dequant.metal"),
    "\n",
    include_str!("../kernels/matmul.metal"),
    "\n",
    include_str!("../kernels/ops.metal"),
);

/// The kernels the source defines (`build.rs` reads them from it).
pub mod kernels {
    include!(concat!(env!("OUT_DIR"), "/kernels.rs"));
}

/// Whether the source defines a kernel named `name`.
pub fn has_kernel(name: &str) -> bool {
    kernels::KERNELS.contains(&name)
}

/// Threads per threadgroup, every kernel.
pub const THREADS: usize = 64;

/// The variable whose value `shim` opens the C++ build of the kernels,
/// the only Metal device off Apple targets (`ferrox-core` reads its other
/// values: whether Metal is used at all).
pub const ENV_VAR: &str = "FERROX_METAL";

/// A Metal failure, with what was being done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetalError {
    /// No device that qualifies.
    #[error("{0}")]
    Unavailable(String),
    /// A Metal call failed.
    #[error("{what}: {result}")]
    Call {
        /// What was being done.
        what: &'static str,
        /// Metal's answer.
        result: String,
    },
    /// A request the device cannot serve (too large, unknown kernel).
    #[error("{0}")]
    Refused(String),
}

/// This crate's results.
pub type Result<T> = std::result::Result<T, MetalError>;

/// A kernel's arguments: its tensors (bound at `buffer(1)` onwards, each at
/// a byte offset) and its parameter struct (`buffer(0)`), written field by
/// field in the struct's order.
#[derive(Default)]
pub struct Args<'a> {
    bufs: Vec<(&'a Buf, usize)>,
    bytes: Vec<u8>,
}

impl<'a> Args<'a> {
    /// The next tensor: `b` from byte `offset`.
    pub fn buf(mut self, b: &'a Buf, offset: usize) -> Args<'a> {
        self.bufs.push((b, offset));
        self
    }

    /// A `uint` field.
    pub fn u32(mut self, v: u32) -> Args<'a> {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A `float` field.
    pub fn f32(mut self, v: f32) -> Args<'a> {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// Wraps `bytes` where its pages lie within `region`: the page-aligned
/// range around it, and where `bytes` starts inside that range; `None`
/// where the range would reach outside `region` (then the bytes are
/// copied). `page` is a power of two.
pub fn page_range(region: &[u8], bytes: &[u8], page: usize) -> Option<(usize, usize, usize)> {
    let (r0, r1) = (region.as_ptr() as usize, region.as_ptr() as usize + region.len());
    let (b0, b1) = (bytes.as_ptr() as usize, bytes.as_ptr() as usize + bytes.len());
    if bytes.is_empty() || b0 < r0 || b1 > r1 {
        return None;
    }
    let lo = b0 & !(page - 1);
    let hi = b1.checked_next_multiple_of(page)?;
    (lo >= r0 && hi <= r1).then_some((lo, hi - lo, b0 - lo))
}

#[cfg(target_vendor = "apple")]
mod apple;
#[cfg(target_vendor = "apple")]
pub use apple::{Buf, Device};

#[cfg(not(target_vendor = "apple"))]
mod shim;
#[cfg(not(target_vendor = "apple"))]
pub use shim::{Buf, Device};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_the_table_has_its_kernels_and_every_op_kernel_is_defined() {
        for &(k, s) in ferrox_ops::metal::KINDS {
            assert!(has_kernel(&format!("matmul_{s}")) && has_kernel(&format!("get_rows_{s}")), "{k}");
        }
        for op in ["unary", "glu", "select_rows", "rms_norm", "rope", "kv_store", "attention"] {
            assert!(has_kernel(op), "{op}");
        }
        assert!(!has_kernel("matmul_iq2_xxs") && !has_kernel("matmul"), "a template is not a kernel");
        assert_eq!(kernels::KERNELS.len(), 2 * ferrox_ops::metal::KINDS.len() + 7);
    }

    /// Metal Shading Language is C++14 with address spaces and attributes:
    /// the kernels, with the shim's header standing in for those, must be
    /// C++14 as the standard says it (no later construct Apple's compiler
    /// would refuse), warnings as errors. Needs a C++ compiler (`CXX`, else
    /// `c++`; the shim's build needs one anyway).
    #[cfg(not(target_vendor = "apple"))]
    #[test]
    fn the_kernels_are_standard_cxx14_as_msl_is() {
        let dir = std::env::temp_dir().join(format!("ferrox-msl-cxx14-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let tu = dir.join("kernels.cpp");
        std::fs::write(&tu, format!("#include \"msl.h\"\n{SOURCE}")).unwrap();
        let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
        let shim = concat!(env!("CARGO_MANIFEST_DIR"), "/shim");
        let run = std::process::Command::new(&cxx)
            .args(["-std=c++14", "-pedantic", "-Werror", "-Wall", "-Wextra", "-Wno-attributes", "-Wno-unused-parameter", "-fsyntax-only", "-I", shim])
            .arg(&tu)
            .output();
        let _ = std::fs::remove_dir_all(&dir);
        let Ok(out) = run else {
            eprintln!("NOT CHECKED: no C++ compiler ({cxx}); the kernels as C++14");
            return;
        };
        assert!(out.status.success(), "the kernels are not C++14:\n{}", String::from_utf8_lossy(&out.stderr));
    }

    #[test]
    fn only_whole_pages_inside_the_region_are_wrapped() {
        let region = vec![0u8; 64 * 1024];
        // A region's start need not be page-aligned in a test; find one that is.
        let base = region.as_ptr() as usize;
        let at = base.next_multiple_of(4096) - base;
        let r = &region[at..at + 32 * 1024];
        assert_eq!(page_range(r, &r[100..200], 4096), Some((r.as_ptr() as usize, 4096, 100)));
        assert_eq!(page_range(r, &r[4000..4200], 4096), Some((r.as_ptr() as usize, 8192, 4000)));
        // The last page would reach past the region's end.
        assert_eq!(page_range(&r[..30000], &r[29000..29500], 4096), None);
        let past = at + 32 * 1024 + 10;
        assert_eq!(page_range(r, &region[past..past + 10], 4096), None, "outside the region");
        assert_eq!(page_range(r, &r[0..0], 4096), None);
    }
}
