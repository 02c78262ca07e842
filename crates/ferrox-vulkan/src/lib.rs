//! ferrox's Vulkan device: the loader opened at run time (`ash`'s `loaded`
//! entry, so every build builds and a machine without Vulkan says so), one
//! compute device and queue, buffers reached by device address, a compute
//! pipeline per shader (created on first use), and one command buffer that
//! records launches until something on the host needs their results.
//!
//! The decisions (`docs/decisions/0033-vulkan-backend.md`): shaders are GLSL
//! compiled to SPIR-V at build time (`build.rs`, the vendored glslang);
//! every buffer is passed to a shader as a 64-bit device address in its
//! push constants, so there are no descriptor sets and no per-binding size
//! limit (lavapipe's 128 MiB `maxStorageBufferRange` does not apply to a
//! tensor read through its address; the bound is `maxMemoryAllocationSize`).
//! Memory is host-visible (device-local too where the device offers both),
//! mapped for its lifetime: uploads and read-backs are copies.
//!
//! A CPU-type device (Mesa's lavapipe, `llvmpipe`) is used only when
//! `FERROX_VULKAN_DEVICE` names it: a machine whose only Vulkan device is a
//! software rasterizer has no Vulkan GPU.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ash::vk;

/// The compiled shaders (`build.rs`).
pub mod shaders {
    include!(concat!(env!("OUT_DIR"), "/shaders.rs"));
}

/// Whether a shader named `name` was compiled into this build.
pub fn has_shader(name: &str) -> bool {
    shaders::SHADERS.iter().any(|&(n, _)| n == name)
}

/// A Vulkan failure, with what was being done.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VulkanError {
    /// No loader, or no device that qualifies.
    #[error("{0}")]
    Unavailable(String),
    /// A Vulkan call failed.
    #[error("{what}: {result}")]
    Call {
        /// What was being done.
        what: &'static str,
        /// The driver's answer.
        result: String,
    },
    /// A request the device cannot serve (too large, unknown shader).
    #[error("{0}")]
    Refused(String),
}

/// This crate's results.
pub type Result<T> = std::result::Result<T, VulkanError>;

fn call(what: &'static str) -> impl FnOnce(vk::Result) -> VulkanError {
    move |r| VulkanError::Call { what, result: format!("{r:?}") }
}

/// The variable that names a device (any part of its name, case-insensitive;
/// `lavapipe` is taken for Mesa's `llvmpipe`).
pub const DEVICE_VAR: &str = "FERROX_VULKAN_DEVICE";

/// Largest workgroup count a launch puts in x (the spec's guaranteed
/// minimum); more wrap into y, and the shaders fold them back.
const MAX_GROUPS_X: u32 = 65535;

/// The largest staging buffer: a larger upload or read-back goes through
/// it in parts.
const STAGING_BYTES: usize = 64 << 20;

/// Bytes of push constants every pipeline takes (the spec's guaranteed minimum).
const PUSH_BYTES: u32 = 128;

struct Recording {
    pool: vk::CommandPool,
    cmd: vk::CommandBuffer,
    fence: vk::Fence,
    /// Commands are recorded and not yet submitted.
    open: bool,
    /// Buffers dropped while recorded commands may still use them.
    retired: Vec<(vk::Buffer, vk::DeviceMemory)>,
    /// The command buffer a decode step is being recorded into for replay
    /// ([`Device::begin_capture`]): launches go there, and a host access
    /// is refused until [`Device::end_capture`].
    capture: Option<vk::CommandBuffer>,
}

struct Inner {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    queue: vk::Queue,
    mem_props: vk::PhysicalDeviceMemoryProperties,
    name: String,
    max_alloc: u64,
    layout: vk::PipelineLayout,
    pipelines: Mutex<HashMap<&'static str, vk::Pipeline>>,
    /// The driver's pipeline cache, loaded from and saved to `cache_file`.
    cache: vk::PipelineCache,
    cache_file: Option<std::path::PathBuf>,
    /// Whether the cache file was read and taken.
    cache_loaded: bool,
    /// Integer dot products are enabled ([`Options::int_dot`] and the device has them).
    int_dot: bool,
    /// Buffers are device-local and reached through `staging` ([`Options::staged`]).
    staged: bool,
    /// The host-visible buffer uploads and read-backs of device-local
    /// buffers pass through (made on first use).
    staging: Mutex<Option<Staging>>,
    /// Pipelines created since the cache was loaded (it is saved when any were).
    created: std::sync::atomic::AtomicUsize,
    rec: Mutex<Recording>,
}

/// An opened Vulkan device.
pub struct Device {
    inner: Arc<Inner>,
}

/// A buffer on the device, mapped on the host, with its device address.
pub struct Buf {
    inner: Arc<Inner>,
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    addr: u64,
    bytes: usize,
    ptr: *mut u8,
}

// The mapping is owned by the buffer and only touched through `Device`,
// which serializes host access against the device's work.
unsafe impl Send for Buf {}
unsafe impl Sync for Buf {}

impl Buf {
    /// The device address of byte `offset`.
    pub fn addr(&self, offset: usize) -> u64 {
        self.addr + offset as u64
    }

    /// Bytes asked for.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        let mut rec = self.inner.rec.lock().unwrap_or_else(|e| e.into_inner());
        if rec.open || rec.capture.is_some() {
            rec.retired.push((self.buffer, self.memory));
        } else {
            // SAFETY: the buffer and memory were made by this device and no recorded or running command uses them (none is open, or they were retired above).
            unsafe {
                self.inner.device.destroy_buffer(self.buffer, None);
                self.inner.device.free_memory(self.memory, None);
            }
        }
    }
}

/// The staging buffer: a [`Buf`] without its hold on the device (the
/// device holds it, and frees it when it closes).
struct Staging {
    buffer: vk::Buffer,
    memory: vk::DeviceMemory,
    bytes: usize,
    ptr: *mut u8,
}

// As for `Buf`: touched only under the device's staging lock.
unsafe impl Send for Staging {}

impl Staging {
    fn of(b: Buf) -> Staging {
        let b = std::mem::ManuallyDrop::new(b);
        // The Arc is released; the Vulkan objects now belong to the Staging.
        // SAFETY: `b` is never dropped (ManuallyDrop), so its Arc is read out exactly once and released here.
        let _inner = unsafe { std::ptr::read(&b.inner) };
        Staging { buffer: b.buffer, memory: b.memory, bytes: b.bytes, ptr: b.ptr }
    }

    unsafe fn destroy(self, d: &ash::Device) {
        d.destroy_buffer(self.buffer, None);
        d.free_memory(self.memory, None);
    }
}

/// A shader's push constants, written in its block's order: the buffer
/// addresses first (8 bytes each), then 4-byte scalars.
#[derive(Default)]
pub struct Push(Vec<u8>);

impl Push {
    /// A buffer address.
    pub fn ptr(mut self, addr: u64) -> Push {
        debug_assert!(self.0.len().is_multiple_of(8), "addresses come before scalars");
        self.0.extend_from_slice(&addr.to_le_bytes());
        self
    }

    /// A `uint`.
    pub fn u32(mut self, v: u32) -> Push {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A `float`.
    pub fn f32(mut self, v: f32) -> Push {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
}

/// How a device is opened, beyond which one.
#[derive(Debug, Clone)]
pub struct Options {
    /// The folder the pipeline cache is kept in
    /// (`pipelines-<the device's pipeline-cache UUID>.bin`); `None`: not kept.
    pub cache_dir: Option<std::path::PathBuf>,
    /// Whether buffers live in device-local memory reached through a
    /// staging buffer (`Some(true)`) or in host-visible memory mapped for
    /// their lifetime (`Some(false)`); `None`: staged on a discrete GPU,
    /// whose host-visible memory is either the host's, read over the bus,
    /// or a small window, and mapped elsewhere (a CPU device such as
    /// lavapipe, an integrated GPU: one memory).
    pub staged: Option<bool>,
    /// Whether integer dot products are used where the device has them
    /// (`false`: the float path everywhere, as on a device without them).
    pub int_dot: bool,
}

impl Default for Options {
    /// The pipeline cache under `~/.cache/ferrox/vulkan/`.
    fn default() -> Options {
        Options { cache_dir: std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".cache/ferrox/vulkan")), staged: None, int_dot: true }
    }
}

/// What a pipeline-cache file starts with (then the data's length and its
/// FNV-1a hash, each a little-endian u64, then the driver's data).
const CACHE_MAGIC: &[u8; 8] = b"FXVKPC1\0";

fn fnv1a(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// A pipeline-cache file's contents wrapped for storing.
fn cache_file_bytes(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 24);
    out.extend_from_slice(CACHE_MAGIC);
    out.extend_from_slice(&(data.len() as u64).to_le_bytes());
    out.extend_from_slice(&fnv1a(data).to_le_bytes());
    out.extend_from_slice(data);
    out
}

/// The driver's data in a stored pipeline-cache file, checked whole (its
/// length and hash) and against the device (the Vulkan header's vendor,
/// device and cache UUID), or why it is not taken. A driver is not trusted
/// to survive a damaged cache, so nothing unchecked reaches it.
fn cache_data_of<'a>(file: &'a [u8], props: &vk::PhysicalDeviceProperties) -> std::result::Result<&'a [u8], String> {
    let word = |b: &[u8], at: usize| b.get(at..at + 8).map(|w| u64::from_le_bytes(w.try_into().unwrap()));
    if file.get(..8) != Some(&CACHE_MAGIC[..]) {
        return Err("not a ferrox pipeline cache".into());
    }
    let (Some(len), Some(hash)) = (word(file, 8), word(file, 16)) else {
        return Err("truncated header".into());
    };
    let data = &file[24..];
    if data.len() as u64 != len {
        return Err(format!("{} bytes of data where the header says {len}", data.len()));
    }
    if fnv1a(data) != hash {
        return Err("its data does not match its hash (damaged)".into());
    }
    let u32at = |at: usize| data.get(at..at + 4).map(|w| u32::from_le_bytes(w.try_into().unwrap()));
    let header = (u32at(0), u32at(4), u32at(8), u32at(12), data.get(16..32));
    let want = (
        Some(32u32),
        Some(vk::PipelineCacheHeaderVersion::ONE.as_raw() as u32),
        Some(props.vendor_id),
        Some(props.device_id),
        Some(&props.pipeline_cache_uuid[..]),
    );
    if header != want {
        return Err("made by another device or driver".into());
    }
    Ok(data)
}

fn uuid_hex(uuid: &[u8]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}

/// What one physical device is, for choosing.
struct Candidate {
    pdev: vk::PhysicalDevice,
    name: String,
    cpu: bool,
}

fn wants(name: &str, asked: &str) -> bool {
    let (name, asked) = (name.to_ascii_lowercase(), asked.trim().to_ascii_lowercase());
    let asked = if asked == "lavapipe" { "llvmpipe".to_string() } else { asked };
    !asked.is_empty() && name.contains(&asked)
}

impl Device {
    /// Whether a device would open (`FERROX_VULKAN_DEVICE` as [`Device::open`] reads it).
    pub fn probe() -> bool {
        Device::open(0).is_ok()
    }

    /// Opens the device `FERROX_VULKAN_DEVICE` names, else the `ordinal`-th
    /// Vulkan device that is not a CPU.
    pub fn open(ordinal: usize) -> Result<Device> {
        Device::open_with(ordinal, &Options::default())
    }

    /// [`Device::open`] with `opts`.
    pub fn open_with(ordinal: usize, opts: &Options) -> Result<Device> {
        let asked = std::env::var(DEVICE_VAR).ok().filter(|v| !v.trim().is_empty());
        // SAFETY: `open_inner` only makes Vulkan calls on objects it creates, and destroys what it made on every error path.
        unsafe { Device::open_inner(ordinal, asked.as_deref(), opts) }
    }

    unsafe fn open_inner(ordinal: usize, asked: Option<&str>, opts: &Options) -> Result<Device> {
        let entry = ash::Entry::load().map_err(|e| VulkanError::Unavailable(format!("no Vulkan loader (libvulkan.so.1): {e}")))?;
        let version = entry.try_enumerate_instance_version().ok().flatten().unwrap_or(vk::API_VERSION_1_0);
        if version < vk::API_VERSION_1_2 {
            return Err(VulkanError::Unavailable(format!(
                "the Vulkan loader offers {}.{}; 1.2 is needed",
                vk::api_version_major(version),
                vk::api_version_minor(version)
            )));
        }
        // 1.3 where the loader has it: integer dot products are core there.
        let app = vk::ApplicationInfo::default().api_version(version.min(vk::API_VERSION_1_3));
        let instance = entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None).map_err(call("vkCreateInstance"))?;
        let done = Device::choose(&entry, &instance, ordinal, asked);
        match done {
            Ok((pdev, name)) => match Device::on(entry, instance.clone(), pdev, name, opts) {
                Ok(d) => Ok(d),
                Err(e) => {
                    instance.destroy_instance(None);
                    Err(e)
                }
            },
            Err(e) => {
                instance.destroy_instance(None);
                Err(e)
            }
        }
    }

    unsafe fn choose(_entry: &ash::Entry, instance: &ash::Instance, ordinal: usize, asked: Option<&str>) -> Result<(vk::PhysicalDevice, String)> {
        let pdevs = instance.enumerate_physical_devices().map_err(call("vkEnumeratePhysicalDevices"))?;
        let all: Vec<Candidate> = pdevs
            .into_iter()
            .map(|pdev| {
                let p = instance.get_physical_device_properties(pdev);
                let name = p.device_name_as_c_str().map(|c| c.to_string_lossy().into_owned()).unwrap_or_default();
                Candidate { pdev, name, cpu: p.device_type == vk::PhysicalDeviceType::CPU }
            })
            .collect();
        let names = || all.iter().map(|c| format!("{}{}", c.name, if c.cpu { " (CPU)" } else { "" })).collect::<Vec<_>>().join(", ");
        let pick = match asked {
            Some(a) => all.iter().find(|c| wants(&c.name, a)).ok_or_else(|| {
                VulkanError::Unavailable(format!("{DEVICE_VAR}={a} names no Vulkan device (found: {})", if all.is_empty() { "none".into() } else { names() }))
            })?,
            None => all.iter().filter(|c| !c.cpu).nth(ordinal).ok_or_else(|| {
                VulkanError::Unavailable(format!(
                    "no Vulkan GPU {ordinal} (found: {}; a CPU device such as lavapipe is used only when {DEVICE_VAR} names it)",
                    if all.is_empty() { "none".into() } else { names() }
                ))
            })?,
        };
        Ok((pick.pdev, pick.name.clone()))
    }

    unsafe fn on(entry: ash::Entry, instance: ash::Instance, pdev: vk::PhysicalDevice, name: String, opts: &Options) -> Result<Device> {
        let props = instance.get_physical_device_properties(pdev);
        if props.api_version < vk::API_VERSION_1_2 {
            return Err(VulkanError::Unavailable(format!("{name}: Vulkan 1.2 is needed")));
        }
        let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut v12);
        instance.get_physical_device_features2(pdev, &mut f2);
        let (bda, s8, i8) = (v12.buffer_device_address, v12.storage_buffer8_bit_access, v12.shader_int8);
        if bda == 0 || s8 == 0 || i8 == 0 {
            return Err(VulkanError::Unavailable(format!(
                "{name}: lacks buffer device addresses ({bda}), 8-bit storage ({s8}) or 8-bit integers ({i8})"
            )));
        }
        let mut m3 = vk::PhysicalDeviceMaintenance3Properties::default();
        let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut m3);
        instance.get_physical_device_properties2(pdev, &mut p2);
        let max_alloc = m3.max_memory_allocation_size;
        let family = instance
            .get_physical_device_queue_family_properties(pdev)
            .iter()
            .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .ok_or_else(|| VulkanError::Unavailable(format!("{name}: no compute queue")))? as u32;
        let prio = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default().queue_family_index(family).queue_priorities(&prio)];
        // Integer dot products (`GL_EXT_integer_dot_product`): Vulkan 1.3 core.
        let int_dot = props.api_version >= vk::API_VERSION_1_3 && {
            let mut v13 = vk::PhysicalDeviceVulkan13Features::default();
            let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut v13);
            instance.get_physical_device_features2(pdev, &mut f2);
            v13.shader_integer_dot_product != 0
        } && opts.int_dot;
        let mut want12 = vk::PhysicalDeviceVulkan12Features::default().buffer_device_address(true).storage_buffer8_bit_access(true).shader_int8(true);
        let mut want13 = vk::PhysicalDeviceVulkan13Features::default().shader_integer_dot_product(true);
        let mut info = vk::DeviceCreateInfo::default().queue_create_infos(&queues).push_next(&mut want12);
        if int_dot {
            info = info.push_next(&mut want13);
        }
        let device = instance.create_device(pdev, &info, None).map_err(call("vkCreateDevice"))?;
        let queue = device.get_device_queue(family, 0);
        let ranges = [vk::PushConstantRange::default().stage_flags(vk::ShaderStageFlags::COMPUTE).size(PUSH_BYTES)];
        let layout = device.create_pipeline_layout(&vk::PipelineLayoutCreateInfo::default().push_constant_ranges(&ranges), None).map_err(call("vkCreatePipelineLayout"))?;
        let pool = device
            .create_command_pool(&vk::CommandPoolCreateInfo::default().queue_family_index(family).flags(vk::CommandPoolCreateFlags::RESET_COMMAND_BUFFER), None)
            .map_err(call("vkCreateCommandPool"))?;
        let cmd = device
            .allocate_command_buffers(&vk::CommandBufferAllocateInfo::default().command_pool(pool).level(vk::CommandBufferLevel::PRIMARY).command_buffer_count(1))
            .map_err(call("vkAllocateCommandBuffers"))?[0];
        let fence = device.create_fence(&vk::FenceCreateInfo::default(), None).map_err(call("vkCreateFence"))?;
        let mem_props = instance.get_physical_device_memory_properties(pdev);
        let cache_file = opts.cache_dir.as_ref().map(|d| d.join(format!("pipelines-{}.bin", uuid_hex(&props.pipeline_cache_uuid))));
        let stored = cache_file.as_ref().and_then(|f| std::fs::read(f).ok());
        let taken = stored.as_deref().and_then(|bytes| match cache_data_of(bytes, &props) {
            Ok(data) => Some(data),
            Err(why) => {
                eprintln!("warning: ignoring the Vulkan pipeline cache {}: {why}", cache_file.as_ref().unwrap().display());
                None
            }
        });
        let made = |data: &[u8]| device.create_pipeline_cache(&vk::PipelineCacheCreateInfo::default().initial_data(data), None);
        let (cache, cache_loaded) = match taken.map(made) {
            Some(Ok(c)) => (c, true),
            Some(Err(e)) => {
                eprintln!("warning: the Vulkan driver refused the pipeline cache {} ({e:?}); starting an empty one", cache_file.as_ref().unwrap().display());
                (made(&[]).map_err(call("vkCreatePipelineCache"))?, false)
            }
            None => (made(&[]).map_err(call("vkCreatePipelineCache"))?, false),
        };
        Ok(Device {
            inner: Arc::new(Inner {
                _entry: entry,
                instance,
                device,
                queue,
                mem_props,
                name,
                max_alloc,
                layout,
                pipelines: Mutex::new(HashMap::new()),
                cache,
                cache_file,
                cache_loaded,
                int_dot,
                staged: opts.staged.unwrap_or(props.device_type == vk::PhysicalDeviceType::DISCRETE_GPU),
                staging: Mutex::new(None),
                created: std::sync::atomic::AtomicUsize::new(0),
                rec: Mutex::new(Recording { pool, cmd, fence, open: false, retired: Vec::new(), capture: None }),
            }),
        })
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Whether the pipeline cache was read from its file at open.
    pub fn pipeline_cache_loaded(&self) -> bool {
        self.inner.cache_loaded
    }

    /// The largest single buffer the device allocates.
    pub fn max_buffer_bytes(&self) -> u64 {
        self.inner.max_alloc
    }

    /// A zeroed buffer of `bytes`: mapped on the host where the device's
    /// memory is the host's ([`Options::staged`]), else device-local and
    /// reached through the staging buffer.
    pub fn alloc(&self, bytes: usize) -> Result<Buf> {
        let staged = self.inner.staged;
        let b = self.alloc_as(bytes, !staged, false)?;
        if staged {
            // SAFETY: `b` is a live buffer of this device with TRANSFER_DST usage; the fill is recorded into the device's own command buffer.
            self.transfer(|d, cmd| unsafe { d.cmd_fill_buffer(cmd, b.buffer, 0, vk::WHOLE_SIZE, 0) })?;
        }
        Ok(b)
    }

    /// A buffer of `bytes` (zeroed when `mapped`): mapped host-visible and
    /// coherent memory (device-local too where offered), or device-local
    /// memory only; `staging` for the staging buffer itself.
    fn alloc_as(&self, bytes: usize, mapped: bool, staging: bool) -> Result<Buf> {
        let size = (bytes.max(4).div_ceil(16) * 16) as u64;
        if size > self.inner.max_alloc {
            return Err(VulkanError::Refused(format!(
                "a buffer of {bytes} bytes is past {}'s largest allocation ({} bytes)",
                self.inner.name, self.inner.max_alloc
            )));
        }
        let d = &self.inner.device;
        // SAFETY: every handle passed is created in this block from the live device; each error path destroys what was made before it.
        unsafe {
            let usage = match staging {
                true => vk::BufferUsageFlags::TRANSFER_SRC | vk::BufferUsageFlags::TRANSFER_DST,
                false => {
                    vk::BufferUsageFlags::STORAGE_BUFFER
                        | vk::BufferUsageFlags::SHADER_DEVICE_ADDRESS
                        | vk::BufferUsageFlags::TRANSFER_SRC
                        | vk::BufferUsageFlags::TRANSFER_DST
                }
            };
            let buffer = d.create_buffer(&vk::BufferCreateInfo::default().size(size).usage(usage), None).map_err(call("vkCreateBuffer"))?;
            let req = d.get_buffer_memory_requirements(buffer);
            let Some(ty) = self.memory_type(req.memory_type_bits, mapped, staging) else {
                d.destroy_buffer(buffer, None);
                return Err(VulkanError::Refused(format!("{}: no {} memory for a buffer", self.inner.name, if mapped { "host-visible, coherent" } else { "device-local" })));
            };
            let mut flags = vk::MemoryAllocateFlagsInfo::default().flags(vk::MemoryAllocateFlags::DEVICE_ADDRESS);
            let mut info = vk::MemoryAllocateInfo::default().allocation_size(req.size).memory_type_index(ty);
            if !staging {
                info = info.push_next(&mut flags);
            }
            let memory = match d.allocate_memory(&info, None) {
                Ok(m) => m,
                Err(e) => {
                    d.destroy_buffer(buffer, None);
                    return Err(call("vkAllocateMemory")(e));
                }
            };
            let bound = d.bind_buffer_memory(buffer, memory, 0).map_err(call("vkBindBufferMemory"));
            let mapped = bound.and_then(|_| match mapped {
                true => d.map_memory(memory, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty()).map_err(call("vkMapMemory")).map(|p| p as *mut u8),
                false => Ok(std::ptr::null_mut()),
            });
            let ptr = match mapped {
                Ok(p) => p,
                Err(e) => {
                    d.destroy_buffer(buffer, None);
                    d.free_memory(memory, None);
                    return Err(e);
                }
            };
            if !ptr.is_null() {
                std::ptr::write_bytes(ptr, 0, size as usize);
            }
            let addr = if staging { 0 } else { d.get_buffer_device_address(&vk::BufferDeviceAddressInfo::default().buffer(buffer)) };
            Ok(Buf { inner: self.inner.clone(), buffer, memory, addr, bytes, ptr })
        }
    }

    /// A memory type of `bits`: host-visible and coherent when `mapped`
    /// (device-local too where offered; host-cached first for `staging`,
    /// which the host reads), else device-local.
    fn memory_type(&self, bits: u32, mapped: bool, staging: bool) -> Option<u32> {
        let p = &self.inner.mem_props;
        let flags = |i: u32| p.memory_types[i as usize].property_flags;
        let want = match mapped {
            true => vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT,
            false => vk::MemoryPropertyFlags::DEVICE_LOCAL,
        };
        let prefer = match staging {
            true => vk::MemoryPropertyFlags::HOST_CACHED,
            false => vk::MemoryPropertyFlags::DEVICE_LOCAL,
        };
        let ok = |i: u32| bits & (1 << i) != 0 && flags(i).contains(want);
        let n = p.memory_type_count;
        (0..n).find(|&i| ok(i) && flags(i).contains(prefer)).or_else(|| (0..n).find(|&i| ok(i)))
    }

    /// Whether the integer-dot shaders may run (the device has
    /// `shaderIntegerDotProduct` and [`Options::int_dot`] asked for them).
    pub fn int_dot(&self) -> bool {
        self.inner.int_dot
    }

    /// A buffer of `bytes` whose contents start undefined: scratch a
    /// shader writes before anything reads it. Unlike [`Device::alloc`] it
    /// records nothing, so it may be made inside a recording.
    pub fn alloc_scratch(&self, bytes: usize) -> Result<Buf> {
        self.alloc_as(bytes, !self.inner.staged, false)
    }

    /// Whether buffers live in device-local memory reached through a
    /// staging buffer (a discrete GPU), not mapped on the host.
    pub fn staged(&self) -> bool {
        self.inner.staged
    }

    /// Runs what is recorded, then one command buffer of transfers `f`
    /// records, fenced by barriers against the launches before and after.
    fn transfer(&self, f: impl FnOnce(&ash::Device, vk::CommandBuffer)) -> Result<()> {
        self.flush()?;
        let d = &self.inner.device;
        {
            let mut rec = self.inner.rec.lock().unwrap_or_else(|e| e.into_inner());
            // SAFETY: the command buffer is the device's own, under its lock; the barriers and `f`'s transfers name only live buffers.
            unsafe {
                d.begin_command_buffer(rec.cmd, &vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT))
                    .map_err(call("vkBeginCommandBuffer"))?;
                rec.open = true;
                let before = [vk::MemoryBarrier::default()
                    .src_access_mask(vk::AccessFlags::MEMORY_WRITE)
                    .dst_access_mask(vk::AccessFlags::TRANSFER_READ | vk::AccessFlags::TRANSFER_WRITE)];
                d.cmd_pipeline_barrier(rec.cmd, vk::PipelineStageFlags::ALL_COMMANDS, vk::PipelineStageFlags::TRANSFER, vk::DependencyFlags::empty(), &before, &[], &[]);
                f(d, rec.cmd);
                let after = [vk::MemoryBarrier::default()
                    .src_access_mask(vk::AccessFlags::TRANSFER_WRITE)
                    .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::HOST_READ)];
                d.cmd_pipeline_barrier(
                    rec.cmd,
                    vk::PipelineStageFlags::TRANSFER,
                    vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::HOST,
                    vk::DependencyFlags::empty(),
                    &after,
                    &[],
                    &[],
                );
            }
        }
        self.flush()
    }

    /// Runs `f` over the staging buffer, grown to at least `bytes` (up to
    /// [`STAGING_BYTES`]).
    fn with_staging<R>(&self, bytes: usize, f: impl FnOnce(&Staging) -> Result<R>) -> Result<R> {
        let mut st = self.inner.staging.lock().unwrap_or_else(|e| e.into_inner());
        if st.as_ref().is_none_or(|b| b.bytes < bytes) {
            if let Some(old) = st.take() {
                // Every transfer through it was waited for.
                // SAFETY: every transfer through the old staging buffer was waited for (`transfer` flushes), so nothing uses it.
                unsafe { old.destroy(&self.inner.device) };
            }
            *st = Some(Staging::of(self.alloc_as(bytes.clamp(1 << 20, STAGING_BYTES), true, true)?));
        }
        f(st.as_ref().unwrap())
    }

    /// A buffer holding `src`.
    pub fn upload(&self, src: &[u8]) -> Result<Buf> {
        let b = self.alloc_as(src.len(), !self.inner.staged, false)?;
        self.write(&b, 0, src)?;
        Ok(b)
    }

    /// Writes `src` into `dst` at byte `offset`, after every recorded
    /// launch has run (one may read what is overwritten).
    pub fn write(&self, dst: &Buf, offset: usize, src: &[u8]) -> Result<()> {
        if offset.checked_add(src.len()).is_none_or(|end| end > dst.bytes) {
            return Err(VulkanError::Refused(format!("a write of {} bytes at {offset} into a buffer of {}", src.len(), dst.bytes)));
        }
        self.flush()?;
        if !dst.ptr.is_null() {
            // SAFETY: `dst` is mapped for `dst.bytes`, the range was checked above, and the flush ran every launch that could touch it.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.ptr.add(offset), src.len()) };
            return Ok(());
        }
        for (i, part) in src.chunks(STAGING_BYTES).enumerate() {
            self.with_staging(part.len(), |st| {
                // SAFETY: the staging buffer is mapped for at least `part.len()` bytes (grown above) and no transfer through it is in flight.
                unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), st.ptr, part.len()) };
                let region = [vk::BufferCopy { src_offset: 0, dst_offset: (offset + i * STAGING_BYTES) as u64, size: part.len() as u64 }];
                // SAFETY: both buffers are live with TRANSFER usage, and the region lies inside both (checked above, and the staging buffer is at least `part.len()`).
                self.transfer(|d, cmd| unsafe { d.cmd_copy_buffer(cmd, st.buffer, dst.buffer, &region) })
            })?;
        }
        Ok(())
    }

    /// Copies `dst.len()` bytes from `src` at byte `offset`, after every
    /// recorded launch has run.
    pub fn read(&self, src: &Buf, offset: usize, dst: &mut [u8]) -> Result<()> {
        if offset.checked_add(dst.len()).is_none_or(|end| end > src.bytes) {
            return Err(VulkanError::Refused(format!("a read of {} bytes at {offset} from a buffer of {}", dst.len(), src.bytes)));
        }
        self.flush()?;
        if !src.ptr.is_null() {
            // SAFETY: `src` is mapped for `src.bytes`, the range was checked above, and the flush ran every launch that could write it.
            unsafe { std::ptr::copy_nonoverlapping(src.ptr.add(offset), dst.as_mut_ptr(), dst.len()) };
            return Ok(());
        }
        for (i, part) in dst.chunks_mut(STAGING_BYTES).enumerate() {
            self.with_staging(part.len(), |st| {
                let region = [vk::BufferCopy { src_offset: (offset + i * STAGING_BYTES) as u64, dst_offset: 0, size: part.len() as u64 }];
                // SAFETY: both buffers are live with TRANSFER usage, and the region lies inside both (checked above, and the staging buffer is at least `part.len()`).
                self.transfer(|d, cmd| unsafe { d.cmd_copy_buffer(cmd, src.buffer, st.buffer, &region) })?;
                // SAFETY: `transfer` waited for the copy; the staging buffer is mapped for at least `part.len()` bytes.
                unsafe { std::ptr::copy_nonoverlapping(st.ptr, part.as_mut_ptr(), part.len()) };
                Ok(())
            })?;
        }
        Ok(())
    }

    fn pipeline(&self, name: &str) -> Result<vk::Pipeline> {
        let mut map = self.inner.pipelines.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&p) = map.get(name) {
            return Ok(p);
        }
        let &(name, spv) =
            shaders::SHADERS.iter().find(|&&(n, _)| n == name).ok_or_else(|| VulkanError::Refused(format!("no shader {name} in this build")))?;
        let words = ash::util::read_spv(&mut std::io::Cursor::new(spv)).map_err(|e| VulkanError::Refused(format!("shader {name}: {e}")))?;
        let d = &self.inner.device;
        // SAFETY: the module is made from SPIR-V the build checked, and destroyed once the pipeline holds it.
        unsafe {
            let module = d.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(&words), None).map_err(call("vkCreateShaderModule"))?;
            let stage = vk::PipelineShaderStageCreateInfo::default().stage(vk::ShaderStageFlags::COMPUTE).module(module).name(c"main");
            let info = [vk::ComputePipelineCreateInfo::default().stage(stage).layout(self.inner.layout)];
            let made = d.create_compute_pipelines(self.inner.cache, &info, None);
            self.inner.created.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            d.destroy_shader_module(module, None);
            let p = made.map_err(|(_, e)| call("vkCreateComputePipelines")(e))?[0];
            map.insert(name, p);
            Ok(p)
        }
    }

    /// Records one launch of `shader` over `groups` workgroups (wrapped
    /// past 65535 into y) and `z` in z, with `push` as its constants; a
    /// barrier after it orders it before the next launch.
    pub fn launch(&self, shader: &str, push: &Push, groups: usize, z: usize) -> Result<()> {
        if groups == 0 || z == 0 {
            return Ok(());
        }
        if push.0.len() > PUSH_BYTES as usize {
            return Err(VulkanError::Refused(format!("{shader}: {} bytes of push constants", push.0.len())));
        }
        let gy = groups.div_ceil(MAX_GROUPS_X as usize);
        let gx = groups.min(MAX_GROUPS_X as usize);
        if gy > MAX_GROUPS_X as usize || z > MAX_GROUPS_X as usize {
            return Err(VulkanError::Refused(format!("{shader}: {groups} x {z} workgroups")));
        }
        let pipeline = self.pipeline(shader)?;
        let d = &self.inner.device;
        let mut rec = self.inner.rec.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the command buffer is the device's own (or the open recording), under its lock; the pipeline and layout are live.
        unsafe {
            if rec.capture.is_none() && !rec.open {
                d.begin_command_buffer(rec.cmd, &vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::ONE_TIME_SUBMIT))
                    .map_err(call("vkBeginCommandBuffer"))?;
                rec.open = true;
            }
            let cmd = rec.capture.unwrap_or(rec.cmd);
            d.cmd_bind_pipeline(cmd, vk::PipelineBindPoint::COMPUTE, pipeline);
            d.cmd_push_constants(cmd, self.inner.layout, vk::ShaderStageFlags::COMPUTE, 0, &push.0);
            d.cmd_dispatch(cmd, gx as u32, gy as u32, z as u32);
            let barrier = [vk::MemoryBarrier::default()
                .src_access_mask(vk::AccessFlags::SHADER_WRITE)
                .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::HOST_READ)];
            d.cmd_pipeline_barrier(
                cmd,
                vk::PipelineStageFlags::COMPUTE_SHADER,
                vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::HOST,
                vk::DependencyFlags::empty(),
                &barrier,
                &[],
                &[],
            );
        }
        Ok(())
    }

    /// Submits what is recorded and waits for it.
    pub fn flush(&self) -> Result<()> {
        let d = &self.inner.device;
        let mut rec = self.inner.rec.lock().unwrap_or_else(|e| e.into_inner());
        if rec.capture.is_some() {
            return Err(VulkanError::Refused("a host access while a decode step is being recorded for replay".into()));
        }
        if !rec.open {
            return Ok(());
        }
        rec.open = false;
        // SAFETY: the command buffer is under the device's lock, recorded and ended once; the fence is waited for before it is reused.
        let run = unsafe {
            d.end_command_buffer(rec.cmd).map_err(call("vkEndCommandBuffer")).and_then(|_| {
                let cmds = [rec.cmd];
                let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
                d.queue_submit(self.inner.queue, &submit, rec.fence).map_err(call("vkQueueSubmit"))?;
                d.wait_for_fences(&[rec.fence], true, u64::MAX).map_err(call("vkWaitForFences"))?;
                d.reset_fences(&[rec.fence]).map_err(call("vkResetFences"))?;
                d.reset_command_buffer(rec.cmd, vk::CommandBufferResetFlags::empty()).map_err(call("vkResetCommandBuffer"))
            })
        };
        for (b, m) in std::mem::take(&mut rec.retired) {
            // SAFETY: the fence wait above ran every command that could use the retired buffers.
            unsafe {
                d.destroy_buffer(b, None);
                d.free_memory(m, None);
            }
        }
        run
    }
}

/// Launches recorded once into their own command buffer
/// ([`Device::begin_capture`] .. [`Device::end_capture`]) and submitted again
/// by [`Device::replay`]: a decode step over the same buffers, whose
/// per-step inputs (token, position) are read from a device buffer written
/// before each replay. The launches reach buffers only by the addresses in
/// their push constants, so a recording stays valid while those buffers live.
pub struct Recorded {
    inner: Arc<Inner>,
    cmd: vk::CommandBuffer,
}

impl Drop for Recorded {
    fn drop(&mut self) {
        let rec = self.inner.rec.lock().unwrap_or_else(|e| e.into_inner());
        // A replay waits for its submission, so nothing of it is in flight.
        // SAFETY: a replay waits for its submission, so the command buffer is not in flight; the pool is used under the device's lock.
        unsafe { self.inner.device.free_command_buffers(rec.pool, &[self.cmd]) };
    }
}

impl Device {
    /// Runs what is recorded, then sends every launch until
    /// [`Device::end_capture`] into a command buffer of its own instead of
    /// running it. A host access in between is an error.
    pub fn begin_capture(&self) -> Result<()> {
        self.flush()?;
        let d = &self.inner.device;
        let mut rec = self.inner.rec.lock().unwrap_or_else(|e| e.into_inner());
        if rec.capture.is_some() {
            return Err(VulkanError::Refused("a recording for replay is already open".into()));
        }
        // SAFETY: the pool is used under the device's lock; a command buffer that fails to begin is freed before returning.
        unsafe {
            let info = vk::CommandBufferAllocateInfo::default().command_pool(rec.pool).level(vk::CommandBufferLevel::PRIMARY).command_buffer_count(1);
            let cmd = d.allocate_command_buffers(&info).map_err(call("vkAllocateCommandBuffers"))?[0];
            if let Err(e) = d.begin_command_buffer(cmd, &vk::CommandBufferBeginInfo::default()) {
                d.free_command_buffers(rec.pool, &[cmd]);
                return Err(call("vkBeginCommandBuffer")(e));
            }
            rec.capture = Some(cmd);
        }
        Ok(())
    }

    /// Closes the recording [`Device::begin_capture`] opened; nothing of it
    /// has run.
    pub fn end_capture(&self) -> Result<Recorded> {
        let mut rec = self.inner.rec.lock().unwrap_or_else(|e| e.into_inner());
        let cmd = rec.capture.take().ok_or_else(|| VulkanError::Refused("no recording for replay is open".into()))?;
        let recorded = Recorded { inner: self.inner.clone(), cmd };
        drop(rec);
        // SAFETY: the recording was taken out of the device's state above, so nothing records into it any more.
        unsafe { self.inner.device.end_command_buffer(cmd).map_err(call("vkEndCommandBuffer"))? };
        Ok(recorded)
    }

    /// Runs what is recorded, then `r`'s launches, and waits for them.
    pub fn replay(&self, r: &Recorded) -> Result<()> {
        if !Arc::ptr_eq(&self.inner, &r.inner) {
            return Err(VulkanError::Refused("a recording replayed on another device".into()));
        }
        self.flush()?;
        let d = &self.inner.device;
        let mut rec = self.inner.rec.lock().unwrap_or_else(|e| e.into_inner());
        if rec.capture.is_some() {
            return Err(VulkanError::Refused("a replay while a decode step is being recorded".into()));
        }
        // SAFETY: `r` belongs to this device (checked above) and is ended; the fence is waited for and reset before it is reused.
        let run = unsafe {
            let cmds = [r.cmd];
            let submit = [vk::SubmitInfo::default().command_buffers(&cmds)];
            d.queue_submit(self.inner.queue, &submit, rec.fence).map_err(call("vkQueueSubmit")).and_then(|_| {
                d.wait_for_fences(&[rec.fence], true, u64::MAX).map_err(call("vkWaitForFences"))?;
                d.reset_fences(&[rec.fence]).map_err(call("vkResetFences"))
            })
        };
        for (b, m) in std::mem::take(&mut rec.retired) {
            // SAFETY: the fence wait above ran every command that could use the retired buffers.
            unsafe {
                d.destroy_buffer(b, None);
                d.free_memory(m, None);
            }
        }
        run
    }
}

impl Inner {
    /// Writes the pipeline cache to its file (through a temporary file
    /// and a rename, so a reader never sees half of one) when pipelines
    /// were created since it was loaded. A cache that cannot be written
    /// only costs pipeline compiles in the next process.
    fn save_cache(&self) {
        let Some(path) = &self.cache_file else { return };
        if self.created.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            return;
        }
        // SAFETY: the pipeline cache is live until this device is dropped, which is where this runs.
        let Ok(data) = (unsafe { self.device.get_pipeline_cache_data(self.cache) }) else { return };
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let stored = path.parent().map(std::fs::create_dir_all).transpose().is_ok()
            && std::fs::write(&tmp, cache_file_bytes(&data)).is_ok()
            && std::fs::rename(&tmp, path).is_ok();
        if !stored {
            let _ = std::fs::remove_file(&tmp);
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.save_cache();
        // SAFETY: the device is idle after the wait below, so no object destroyed here is in use.
        unsafe {
            let _ = self.device.device_wait_idle();
            if let Some(st) = self.staging.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
                st.destroy(&self.device);
            }
            let rec = self.rec.get_mut().unwrap_or_else(|e| e.into_inner());
            for (b, m) in rec.retired.drain(..) {
                self.device.destroy_buffer(b, None);
                self.device.free_memory(m, None);
            }
            self.device.destroy_fence(rec.fence, None);
            self.device.destroy_command_pool(rec.pool, None);
            for (_, p) in self.pipelines.get_mut().unwrap_or_else(|e| e.into_inner()).drain() {
                self.device.destroy_pipeline(p, None);
            }
            self.device.destroy_pipeline_cache(self.cache, None);
            self.device.destroy_pipeline_layout(self.layout, None);
            self.device.destroy_device(None);
            self.instance.destroy_instance(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_asked_for_by_any_part_of_its_name() {
        assert!(wants("llvmpipe (LLVM 15.0.6, 256 bits)", "lavapipe"));
        assert!(wants("llvmpipe (LLVM 15.0.6, 256 bits)", "LLVMpipe"));
        assert!(wants("NVIDIA H200", "h200"));
        assert!(!wants("NVIDIA H200", "llvmpipe"));
        assert!(!wants("NVIDIA H200", " "));
    }

    #[test]
    fn every_kind_of_the_table_has_its_shaders_and_every_op_shader_is_built() {
        for &(k, s) in ferrox_ops::vulkan::KINDS {
            assert!(has_shader(&format!("matmul_{s}")) && has_shader(&format!("get_rows_{s}")), "{k}");
        }
        for &k in ferrox_ops::vulkan::DP_KINDS {
            assert!(has_shader(&ferrox_ops::vulkan::dp_shader(k).unwrap()), "{k}: no integer-dot product");
        }
        for op in ["unary", "glu", "select", "rms_norm", "rope", "kv_store", "attention", "quantize_q8"] {
            assert!(has_shader(op), "{op}");
        }
        assert!(!has_shader("matmul_iq2_xxs"));
    }

    #[test]
    fn a_stored_pipeline_cache_is_taken_only_whole_and_from_its_own_device() {
        let mut props = vk::PhysicalDeviceProperties { vendor_id: 0x10de, device_id: 0x2335, ..Default::default() };
        props.pipeline_cache_uuid = [7; 16];
        let mut data = Vec::new();
        for w in [32u32, 1, 0x10de, 0x2335] {
            data.extend_from_slice(&w.to_le_bytes());
        }
        data.extend_from_slice(&[7; 16]);
        data.extend_from_slice(b"the driver's pipelines");
        let file = cache_file_bytes(&data);
        assert_eq!(cache_data_of(&file, &props), Ok(&data[..]));
        for at in [0, 9, 17, 24, 30, file.len() - 1] {
            let mut bad = file.clone();
            bad[at] ^= 1;
            assert!(cache_data_of(&bad, &props).is_err(), "a flipped bit at {at} was taken");
        }
        for len in [0, 5, 23, 24, file.len() - 1] {
            assert!(cache_data_of(&file[..len], &props).is_err(), "{len} bytes were taken");
        }
        let mut other = props;
        other.pipeline_cache_uuid[3] = 8;
        assert!(cache_data_of(&file, &other).unwrap_err().contains("another device"));
        other = props;
        other.device_id = 1;
        assert!(cache_data_of(&file, &other).is_err());
    }
}
