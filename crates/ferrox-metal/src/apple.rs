//! The Metal device (Apple targets): `objc2-metal` over the system's
//! default device, the kernels' library compiled from [`crate::SOURCE`]
//! when the device opens (fast math off: the kernels' softcaps and
//! softmax are written for IEEE arithmetic), one pipeline per kernel made on
//! first use, buffers in shared storage, and one command buffer with one
//! serial compute encoder that takes launches until the host reads or
//! writes a buffer. Never run on Apple hardware by this project's CI: it
//! type-checks there (`cargo check --target aarch64-apple-darwin`).

use std::any::Any;
use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use objc2::rc::Retained;
use objc2::runtime::ProtocolObject;
use objc2_foundation::NSString;
use objc2_metal::{
    MTLBuffer, MTLCommandBuffer, MTLCommandBufferStatus, MTLCommandEncoder, MTLCommandQueue, MTLCompileOptions, MTLComputeCommandEncoder,
    MTLComputePipelineState, MTLCreateSystemDefaultDevice, MTLDevice, MTLLibrary, MTLResourceOptions, MTLSize,
};

use crate::{Args, MetalError, Result};

/// The OS page: what `newBufferWithBytesNoCopy` wraps whole.
const PAGE: usize = if cfg!(target_arch = "aarch64") { 16384 } else { 4096 };

type Dev = ProtocolObject<dyn MTLDevice>;
type Pipeline = Retained<ProtocolObject<dyn MTLComputePipelineState>>;

/// The command buffer being encoded and its encoder.
struct Recording {
    cmd: Retained<ProtocolObject<dyn MTLCommandBuffer>>,
    enc: Retained<ProtocolObject<dyn MTLComputeCommandEncoder>>,
}

struct Inner {
    device: Retained<Dev>,
    queue: Retained<ProtocolObject<dyn MTLCommandQueue>>,
    library: Retained<ProtocolObject<dyn MTLLibrary>>,
    name: String,
    max_buffer: usize,
    pipelines: Mutex<HashMap<String, Pipeline>>,
    rec: Mutex<Option<Recording>>,
}

// Metal's device, queue, library and pipelines may be used from any thread;
// the command buffer and encoder are touched only under `rec`'s lock.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

/// An opened Metal device.
pub struct Device {
    inner: Arc<Inner>,
}

/// A buffer in shared storage (the CPU and GPU see one memory), owned or
/// wrapping a mapping without a copy.
pub struct Buf {
    inner: Arc<Inner>,
    buf: Retained<ProtocolObject<dyn MTLBuffer>>,
    bytes: usize,
    ptr: *mut u8,
    borrowed: bool,
    _keep: Option<Arc<dyn Any + Send + Sync>>,
}

// The contents are reached only through `Device`, which finishes the
// recorded work before any host read or write.
unsafe impl Send for Buf {}
unsafe impl Sync for Buf {}

impl Buf {
    /// Bytes asked for.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether it wraps memory it does not own (a borrowed mapping).
    pub fn is_borrowed(&self) -> bool {
        self.borrowed
    }
}

fn ns_err(what: &'static str) -> impl FnOnce(Retained<objc2_foundation::NSError>) -> MetalError {
    move |e| MetalError::Call { what, result: e.localizedDescription().to_string() }
}

impl Device {
    /// Whether a device would open.
    pub fn probe() -> bool {
        Device::open(0).is_ok()
    }

    /// Opens the system's default Metal device (`ordinal` 0; a Mac has one
    /// GPU for compute) and compiles the kernels' library.
    pub fn open(ordinal: usize) -> Result<Device> {
        if ordinal != 0 {
            return Err(MetalError::Unavailable(format!("Metal device {ordinal}: only the system's default device (0) is opened")));
        }
        let device = MTLCreateSystemDefaultDevice().ok_or_else(|| MetalError::Unavailable("no Metal device (MTLCreateSystemDefaultDevice)".into()))?;
        let name = device.name().to_string();
        let options = MTLCompileOptions::new();
        #[allow(deprecated)]
        options.setFastMathEnabled(false);
        let library = device.newLibraryWithSource_options_error(&NSString::from_str(crate::SOURCE), Some(&options)).map_err(ns_err("compiling the Metal kernels"))?;
        let queue = device.newCommandQueue().ok_or_else(|| MetalError::Unavailable(format!("{name}: no command queue")))?;
        let max_buffer = device.maxBufferLength();
        Ok(Device {
            inner: Arc::new(Inner { device, queue, library, name, max_buffer, pipelines: Mutex::new(HashMap::new()), rec: Mutex::new(None) }),
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    fn wrap(&self, buf: Retained<ProtocolObject<dyn MTLBuffer>>, bytes: usize, borrowed: bool, keep: Option<Arc<dyn Any + Send + Sync>>) -> Buf {
        let ptr = buf.contents().as_ptr() as *mut u8;
        Buf { inner: self.inner.clone(), buf, bytes, ptr, borrowed, _keep: keep }
    }

    /// A zeroed buffer of `bytes`.
    pub fn alloc(&self, bytes: usize) -> Result<Buf> {
        let size = bytes.max(4).div_ceil(16) * 16;
        if size > self.inner.max_buffer {
            return Err(MetalError::Refused(format!("a buffer of {bytes} bytes is past {}'s largest ({} bytes)", self.inner.name, self.inner.max_buffer)));
        }
        let buf = self
            .inner
            .device
            .newBufferWithLength_options(size, MTLResourceOptions::StorageModeShared)
            .ok_or_else(|| MetalError::Refused(format!("{}: no buffer of {bytes} bytes", self.inner.name)))?;
        let b = self.wrap(buf, bytes, false, None);
        // SAFETY: a new shared buffer of `size` bytes, mapped at `ptr`.
        unsafe { std::ptr::write_bytes(b.ptr, 0, size) };
        Ok(b)
    }

    /// A buffer holding a copy of `src`.
    pub fn upload(&self, src: &[u8]) -> Result<Buf> {
        let b = self.alloc(src.len())?;
        // SAFETY: `b` holds at least `src.len()` bytes and is not yet shared.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), b.ptr, src.len()) };
        Ok(b)
    }

    /// `bytes` without a copy (`newBufferWithBytesNoCopy`): the whole pages
    /// around it, which must lie in `region` (a mapping `keep` holds alive),
    /// and where `bytes` starts in them; `None` where they do not or Metal
    /// declines (copy it instead).
    pub fn borrow(&self, region: &[u8], bytes: &[u8], keep: Arc<dyn Any + Send + Sync>) -> Option<(Buf, usize)> {
        let (lo, len, at) = crate::page_range(region, bytes, PAGE)?;
        if len > self.inner.max_buffer {
            return None;
        }
        let ptr = NonNull::new(lo as *mut c_void)?;
        // SAFETY: [lo, lo + len) is whole pages of a live mapping that `keep`
        // holds for the buffer's lifetime; the kernels only read it, and no
        // deallocator is given (the mapping is not Metal's to free).
        let buf = unsafe { self.inner.device.newBufferWithBytesNoCopy_length_options_deallocator(ptr, len, MTLResourceOptions::StorageModeShared, None) }?;
        Some((self.wrap(buf, len, true, Some(keep)), at))
    }

    /// Writes `src` into `dst` at byte `offset`, after every encoded launch
    /// has run (one may read what is overwritten).
    pub fn write(&self, dst: &Buf, offset: usize, src: &[u8]) -> Result<()> {
        if dst.borrowed || offset.checked_add(src.len()).is_none_or(|end| end > dst.bytes) {
            return Err(MetalError::Refused(format!("a write of {} bytes at {offset} into a buffer of {}", src.len(), dst.bytes)));
        }
        self.flush()?;
        // SAFETY: in bounds (checked) of shared memory no GPU work is using.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.ptr.add(offset), src.len()) };
        Ok(())
    }

    /// Copies `dst.len()` bytes from `src` at byte `offset`, after every
    /// encoded launch has run.
    pub fn read(&self, src: &Buf, offset: usize, dst: &mut [u8]) -> Result<()> {
        if offset.checked_add(dst.len()).is_none_or(|end| end > src.bytes) {
            return Err(MetalError::Refused(format!("a read of {} bytes at {offset} from a buffer of {}", dst.len(), src.bytes)));
        }
        self.flush()?;
        // SAFETY: in bounds (checked) of shared memory no GPU work is using.
        unsafe { std::ptr::copy_nonoverlapping(src.ptr.add(offset), dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn pipeline(&self, name: &str) -> Result<Pipeline> {
        let mut map = self.inner.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = map.get(name) {
            return Ok(p.clone());
        }
        if !crate::has_kernel(name) {
            return Err(MetalError::Refused(format!("no kernel {name} in the Metal source")));
        }
        let f = self.inner.library.newFunctionWithName(&NSString::from_str(name)).ok_or_else(|| MetalError::Refused(format!("no function {name} in the compiled library")))?;
        let p = self.inner.device.newComputePipelineStateWithFunction_error(&f).map_err(ns_err("making a compute pipeline"))?;
        if p.maxTotalThreadsPerThreadgroup() < crate::THREADS {
            return Err(MetalError::Refused(format!("{name}: {} threads a threadgroup at most; the kernels run {}", p.maxTotalThreadsPerThreadgroup(), crate::THREADS)));
        }
        map.insert(name.to_string(), p.clone());
        Ok(p)
    }

    /// Encodes one launch of `kernel` over `groups` x `z` threadgroups of
    /// 64 threads. The encoder is serial: each launch sees the writes of
    /// the ones before it.
    pub fn launch(&self, kernel: &str, args: &Args<'_>, groups: usize, z: usize) -> Result<()> {
        if groups == 0 || z == 0 {
            return Ok(());
        }
        if args.bytes.len() > 4096 {
            return Err(MetalError::Refused(format!("{kernel}: {} bytes of parameters", args.bytes.len())));
        }
        for &(b, off) in &args.bufs {
            if off > b.bytes {
                return Err(MetalError::Refused(format!("{kernel}: offset {off} past a buffer of {}", b.bytes)));
            }
        }
        let pipeline = self.pipeline(kernel)?;
        let mut rec = self.inner.rec.lock().unwrap_or_else(|e| e.into_inner());
        if rec.is_none() {
            let cmd = self.inner.queue.commandBuffer().ok_or_else(|| MetalError::Refused("no command buffer".into()))?;
            let enc = cmd.computeCommandEncoder().ok_or_else(|| MetalError::Refused("no compute encoder".into()))?;
            *rec = Some(Recording { cmd, enc });
        }
        let Some(r) = rec.as_ref() else { unreachable!("just set") };
        r.enc.setComputePipelineState(&pipeline);
        // Every kernel takes a parameter struct; four zero bytes stand in
        // for an empty one (Metal refuses a zero length).
        let bytes: &[u8] = if args.bytes.is_empty() { &[0; 4] } else { &args.bytes };
        let params = NonNull::from(bytes).cast::<c_void>();
        // SAFETY: Metal copies the parameter bytes when encoding (setBytes);
        // the buffers are live and their offsets inside them (checked), and
        // the command buffer retains them until it completes.
        unsafe {
            r.enc.setBytes_length_atIndex(params, bytes.len(), 0);
            for (i, &(b, off)) in args.bufs.iter().enumerate() {
                r.enc.setBuffer_offset_atIndex(Some(&b.buf), off, i + 1);
            }
        }
        r.enc.dispatchThreadgroups_threadsPerThreadgroup(
            MTLSize { width: groups, height: 1, depth: z },
            MTLSize { width: crate::THREADS, height: 1, depth: 1 },
        );
        Ok(())
    }

    /// Commits what is encoded and waits for it.
    pub fn flush(&self) -> Result<()> {
        self.inner.flush()
    }
}

impl Inner {
    fn flush(&self) -> Result<()> {
        let Some(r) = self.rec.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return Ok(());
        };
        r.enc.endEncoding();
        r.cmd.commit();
        r.cmd.waitUntilCompleted();
        if r.cmd.status() == MTLCommandBufferStatus::Error {
            let why = r.cmd.error().map(|e| e.localizedDescription().to_string()).unwrap_or_else(|| "no reason given".into());
            return Err(MetalError::Call { what: "running the command buffer", result: why });
        }
        Ok(())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let _ = self.flush();
    }
}

impl Drop for Buf {
    /// A borrowed buffer's mapping may go with it: encoded work that reads
    /// it runs first (Metal retains the buffer object, not the mapping).
    fn drop(&mut self) {
        if self.borrowed {
            let _ = self.inner.flush();
        }
    }
}
