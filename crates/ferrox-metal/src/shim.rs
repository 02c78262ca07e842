//! The shim device (targets other than Apple's): the kernels' MSL compiled
//! as C++ against `shim/msl.h` by the build script, run on the calling
//! thread when launched. Buffers are host memory; a borrowed one points
//! into the mapped model file, as a no-copy Metal buffer does.

use std::any::Any;
use std::sync::Arc;

use crate::{Args, MetalError, Result, ENV_VAR};

extern "C" {
    fn ferrox_msl_launch(name: *const std::ffi::c_char, params: *const u8, bytes: usize, bufs: *const *mut u8, n_bufs: usize, gx: u32, gz: u32) -> i32;
}

/// The page the shim wraps borrowed ranges by (as Metal does by the OS's).
const PAGE: usize = 4096;

/// The shim device.
pub struct Device {
    _private: (),
}

/// A buffer in host memory, owned or borrowed from a mapping.
pub struct Buf {
    ptr: *mut u8,
    bytes: usize,
    _owned: Option<Vec<u64>>,
    _keep: Option<Arc<dyn Any + Send + Sync>>,
}

// The memory is reached only through `Device`'s copies and launches, which
// run on the calling thread and return when done.
unsafe impl Send for Buf {}
unsafe impl Sync for Buf {}

impl Buf {
    /// Bytes asked for.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether it wraps memory it does not own (a borrowed mapping).
    pub fn is_borrowed(&self) -> bool {
        self._owned.is_none()
    }
}

impl Device {
    /// Whether a device would open.
    pub fn probe() -> bool {
        Device::open(0).is_ok()
    }

    /// Opens the shim when `FERROX_METAL=shim` asks for it; there is
    /// no other device off Apple targets.
    pub fn open(ordinal: usize) -> Result<Device> {
        let asked = std::env::var(ENV_VAR).unwrap_or_default();
        if asked.trim().eq_ignore_ascii_case("shim") && ordinal == 0 {
            return Ok(Device { _private: () });
        }
        Err(MetalError::Unavailable(format!(
            "no Metal device: Metal runs on Apple targets only (this build's one Metal device is the kernels' C++ shim, opened when {ENV_VAR}=shim)"
        )))
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        "shim (the Metal kernels as C++ on the CPU)"
    }

    /// A zeroed buffer of `bytes`.
    pub fn alloc(&self, bytes: usize) -> Result<Buf> {
        let words = bytes.div_ceil(8).max(1);
        let mut v: Vec<u64> = Vec::new();
        v.try_reserve_exact(words).map_err(|_| MetalError::Refused(format!("a buffer of {bytes} bytes")))?;
        v.resize(words, 0);
        let ptr = v.as_mut_ptr() as *mut u8;
        Ok(Buf { ptr, bytes, _owned: Some(v), _keep: None })
    }

    /// A buffer holding a copy of `src`.
    pub fn upload(&self, src: &[u8]) -> Result<Buf> {
        let b = self.alloc(src.len())?;
        // SAFETY: `b` owns at least `src.len()` bytes and nothing else sees it yet.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), b.ptr, src.len()) };
        Ok(b)
    }

    /// `bytes` without a copy: the whole pages around it, which must lie in
    /// `region` (a mapping `keep` holds alive), and where `bytes` starts in
    /// them; `None` where they do not (copy it instead).
    pub fn borrow(&self, region: &[u8], bytes: &[u8], keep: Arc<dyn Any + Send + Sync>) -> Option<(Buf, usize)> {
        let (lo, len, at) = crate::page_range(region, bytes, PAGE)?;
        Some((Buf { ptr: lo as *mut u8, bytes: len, _owned: None, _keep: Some(keep) }, at))
    }

    /// Writes `src` into `dst` at byte `offset`.
    pub fn write(&self, dst: &Buf, offset: usize, src: &[u8]) -> Result<()> {
        if dst.is_borrowed() || offset.checked_add(src.len()).is_none_or(|end| end > dst.bytes) {
            return Err(MetalError::Refused(format!("a write of {} bytes at {offset} into a buffer of {}", src.len(), dst.bytes)));
        }
        // SAFETY: in bounds (checked) of memory `dst` owns; launches have all returned.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.ptr.add(offset), src.len()) };
        Ok(())
    }

    /// Copies `dst.len()` bytes from `src` at byte `offset`.
    pub fn read(&self, src: &Buf, offset: usize, dst: &mut [u8]) -> Result<()> {
        if offset.checked_add(dst.len()).is_none_or(|end| end > src.bytes) {
            return Err(MetalError::Refused(format!("a read of {} bytes at {offset} from a buffer of {}", dst.len(), src.bytes)));
        }
        // SAFETY: in bounds (checked) of memory `src` owns or borrows; launches have all returned.
        unsafe { std::ptr::copy_nonoverlapping(src.ptr.add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Runs `kernel` over `groups` x `z` threadgroups of 64 threads.
    pub fn launch(&self, kernel: &str, args: &Args<'_>, groups: usize, z: usize) -> Result<()> {
        if groups == 0 || z == 0 {
            return Ok(());
        }
        let (Ok(gx), Ok(gz)) = (u32::try_from(groups), u32::try_from(z)) else {
            return Err(MetalError::Refused(format!("{kernel}: {groups} x {z} threadgroups")));
        };
        let mut ptrs = Vec::with_capacity(args.bufs.len());
        for &(b, off) in &args.bufs {
            if off > b.bytes {
                return Err(MetalError::Refused(format!("{kernel}: offset {off} past a buffer of {}", b.bytes)));
            }
            // SAFETY: `off` is at most the buffer's size (checked above).
            ptrs.push(unsafe { b.ptr.add(off) });
        }
        let name = std::ffi::CString::new(kernel).map_err(|_| MetalError::Refused(format!("kernel name {kernel:?}")))?;
        // SAFETY: the name is a C string; the parameter bytes and the pointer
        // list live through the call; each pointer is inside its buffer, and
        // the launcher checks the buffer count and parameter size against the
        // kernel's signature before running it. The kernels index within the
        // shapes `ferrox-core` checked before launching.
        let rc = unsafe { ferrox_msl_launch(name.as_ptr(), args.bytes.as_ptr(), args.bytes.len(), ptrs.as_ptr(), ptrs.len(), gx, gz) };
        match rc {
            0 => Ok(()),
            -1 => Err(MetalError::Refused(format!("no kernel {kernel} in the Metal source"))),
            -2 => Err(MetalError::Refused(format!("{kernel}: {} buffers bound, not the kernel's count", ptrs.len()))),
            _ => Err(MetalError::Refused(format!("{kernel}: {} bytes of parameters, not its struct's size", args.bytes.len()))),
        }
    }

    /// Waits for what is launched (the shim runs each launch when it is made).
    pub fn flush(&self) -> Result<()> {
        Ok(())
    }
}
