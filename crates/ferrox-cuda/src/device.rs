//! One opened GPU: its stream, its compiled kernels, cuBLAS if present,
//! and every operation a forward pass needs, on device buffers.
//!
//! The decision: kernels take raw device pointers and the context's event
//! tracking is off. With a single stream the stream itself orders every
//! launch, copy and cuBLAS call, so per-argument events would only add
//! driver calls to a decode step that is already launch-bound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::cublas::{sys as blas_sys, CudaBlas};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, LaunchConfig, PushKernelArg,
};
use ferrox_ops::cuda as cuda_ops;
use ferrox_ops::{Activation, AttnShape, RopeShape};
use ferrox_quant::QuantKind;

use crate::{drv, CudaError, GEMM_MIN_TOKENS};

/// An f32 activation buffer on the device.
pub struct Buf {
    s: CudaSlice<f32>,
    len: usize,
    /// Unique per buffer (never reused, unlike a device address): names
    /// the buffer whose quantized copy the q8 scratch holds.
    id: u64,
}

pub use cuda_ops::MOE_GROUPED_PAIRS;

/// Where [`Device::mmvq_id`] puts its rows.
#[derive(Clone, Copy)]
enum MmvqIdOut {
    /// A row a (token, expert) pair; with a slot (the gate/up launch with
    /// its GLU) also the rows' q8 copy, into that slot of the q8 scratch.
    Pairs(Option<usize>),
    /// A row a token: its pairs' rows (the down stack over each pair's own
    /// activations) summed by their routing weights.
    Summed,
}

/// `moe_sort`'s table in the device scratch: the tile (its index into
/// `MMA_TILES`), the most tiles a batch can make, and the three arrays'
/// addresses.
struct MoeSort {
    tile: usize,
    max_tiles: usize,
    tiles: u64,
    order: u64,
    count: u64,
}

/// A mixture of experts' sizes for [`Device::moe`].
#[derive(Debug, Clone, Copy)]
pub struct MoeShape {
    /// Tokens.
    pub n: usize,
    /// Model width.
    pub n_embd: usize,
    /// One expert's hidden width.
    pub ff: usize,
    /// Experts in the stacks.
    pub n_expert: usize,
    /// Experts each token is routed to.
    pub n_used: usize,
    /// Whether the chosen experts' weights are divided by their sum.
    pub norm_weights: bool,
    /// A factor on every weight.
    pub scale: f32,
    /// The experts' gated activation.
    pub act: Activation,
}

/// The scratch [`Device::moe`] writes (each at least the size it names).
pub struct MoeBufs<'a> {
    /// The route table: `2 * n * n_used` floats.
    pub route: &'a mut Buf,
    /// Gate products, then the down products: `n * n_used * max(ff, n_embd)`.
    pub gate: &'a mut Buf,
    /// Up products: `n * n_used * ff`.
    pub up: &'a mut Buf,
    /// The GLU: `n * n_used * ff`.
    pub h: &'a mut Buf,
}

/// The most experts `moe_route` takes (its shared-memory row).
pub const MOE_MAX_EXPERTS: usize = 1024;

/// Rows a unit-decoder matvec block computes (`MATVEC_ROWS` in `kernels.cu`).
const MATVEC_ROWS: usize = 4;

fn next_buf_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

impl Buf {
    /// Floats it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Indices on the device (token ids, positions, slots, rows).
pub struct Indices {
    s: CudaSlice<u32>,
    len: usize,
}

impl Indices {
    /// How many.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// All of them, as a kernel argument.
    pub fn all(&self) -> IndexView<'_> {
        IndexView {
            ptr: self.s.device_ptr(self.s.stream()).0,
            len: self.len,
            _of: std::marker::PhantomData,
        }
    }

    /// `[start, start + len)` of them, or `None` outside.
    pub fn part(&self, start: usize, len: usize) -> Option<IndexView<'_>> {
        (start.checked_add(len)? <= self.len).then(|| {
            let all = self.all();
            IndexView {
                ptr: all.ptr + 4 * start as u64,
                len,
                _of: std::marker::PhantomData,
            }
        })
    }
}

/// A recorded, instantiated sequence of launches on a [`Device`]'s stream
/// (a CUDA graph), replayed with [`Device::replay`].
pub struct Graph(cudarc::driver::CudaGraph);

// SAFETY: the graph handles are only used through `&Graph` by
// `Device::replay`, and every owner in this workspace keeps a `Graph` behind
// a mutex, which serializes the launches the driver requires serialized.
unsafe impl Send for Graph {}

/// A borrowed run of [`Indices`].
#[derive(Clone, Copy)]
pub struct IndexView<'a> {
    ptr: u64,
    len: usize,
    _of: std::marker::PhantomData<&'a Indices>,
}

impl<'a> IndexView<'a> {
    /// How many.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `[start, start + len)` of them, or `None` outside.
    pub fn part(&self, start: usize, len: usize) -> Option<IndexView<'a>> {
        (start.checked_add(len)? <= self.len).then_some(IndexView {
            ptr: self.ptr + 4 * start as u64,
            len,
            _of: std::marker::PhantomData,
        })
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A weight matrix resident on the device, in its file's block format.
pub struct Matrix {
    /// Storage kind.
    pub kind: QuantKind,
    /// Rows (outputs).
    pub rows: usize,
    /// Columns (inputs, the contiguous dimension).
    pub cols: usize,
    row_bytes: usize,
    data: CudaSlice<u8>,
}

/// The KV cache: per layer, `n_slots * n_ctx` positions of f16 keys and
/// values, slot-major (as the CPU's).
pub struct Kv {
    n_slots: usize,
    n_ctx: usize,
    k_dims: Vec<usize>,
    v_dims: Vec<usize>,
    k: Vec<CudaSlice<u16>>,
    v: Vec<CudaSlice<u16>>,
}

impl Kv {
    /// Positions per slot.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Sequence slots.
    pub fn n_slots(&self) -> usize {
        self.n_slots
    }
}

/// How a matmul of `n` tokens runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulPath {
    /// The per-kind matvec kernel, once per token (decode, small batches).
    Matvec,
    /// Weights dequantized to f16, activations converted to f16, cuBLAS
    /// GEMM with f32 accumulation and output (prefill).
    Gemm,
    /// The small-batch tensor-core GEMM (`mmq_<kind>_n<t>`): weights
    /// dequantized to f16 in registers, activations converted to f16 once,
    /// f32 sums (a server's 9–64-token decode steps).
    Mma,
}



/// The most warps a block of the small-batch GEMM takes (`MMQ_MAX_WARPS`
/// in `kernels.cu`, its launch bound), 16 rows each: the knob's range.
#[cfg(any(test, feature = "measure"))]
const MMQ_MAX_WARPS: usize = 8;
/// The most k splits of one small-batch GEMM, and the fewest groups of
/// four 32-element units a split takes.
const MMQ_MAX_SPLITS: usize = 8;
const MMQ_MIN_GROUPS: usize = 4;

/// The `act` argument of the `glu`, `mmvq_glu_<kind>` and `matvec_f16_glu_stream` kernels.
fn act_code(a: Activation) -> i32 {
    match a {
        Activation::SiluGated => 0,
        Activation::GeluGated => 1,
    }
}

struct KindFns {
    matvec: CudaFunction,
    /// The int8-activation (dp4a) matvec (`mmvq_stream_<kind>`: a warp a
    /// row), for the kinds that have one.
    mmvq: Option<CudaFunction>,
    /// The gate and up matvecs with the GLU (`mmvq_glu_<kind>`).
    mmvq_glu: Option<CudaFunction>,
    get_rows: CudaFunction,
    dequant: CudaFunction,
    /// The routed experts' matvec (`matvec_id_<kind>`).
    matvec_id: CudaFunction,
    /// The small-batch tensor-core GEMM, one per `cuda_ops::MMA_TILES`
    /// entry (`mmq_<kind>_n<t>`), for the kinds that have one.
    mma: Option<Vec<CudaFunction>>,
    /// The routed experts' int8 matvec (`mmvq_id_<kind>`) and grouped GEMM
    /// (`mmq_id_<kind>_n<t>`), for the kinds that have the small-batch GEMM.
    experts_int8: Option<(CudaFunction, Vec<CudaFunction>)>,
}

/// The activations as the mmvq kernels see them: quantized per 32 elements
/// (`d = max|x| / 127`, `q = round(x / d)`) and expanded back to `q * d`,
/// so a test can compute the kernel's exact function with the scalar twin.
pub fn mmvq_quantize_activations(x: &[f32]) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    for (o, u) in out.chunks_mut(32).zip(x.chunks(32)) {
        let amax = u.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
        let d = amax / 127.0;
        for (o, &v) in o.iter_mut().zip(u) {
            *o = if d > 0.0 { (v / d).round() * d } else { 0.0 };
        }
    }
    out
}

struct Fns {
    kinds: HashMap<QuantKind, KindFns>,
    f32_to_f16: CudaFunction,
    /// Adds the small-batch GEMM's split-k partial sums.
    mmq_reduce: CudaFunction,
    quantize_q8: CudaFunction,
    rms_norm: CudaFunction,
    add_rms_norm: CudaFunction,
    argmax_rows: CudaFunction,
    top_k_rows: CudaFunction,
    matvec_f16_stream: CudaFunction,
    matvec_f16_glu_stream: CudaFunction,
    matvec_f16_norm_stream: CudaFunction,
    matvec_f16_glu_norm_stream: CudaFunction,
    rope: CudaFunction,
    kv_store: CudaFunction,
    rope_kv: CudaFunction,
    attention: CudaFunction,
    attention_gqa: CudaFunction,
    attention_dec: CudaFunction,
    attention_mma: CudaFunction,
    glu: CudaFunction,
    add: CudaFunction,
    add_bias: CudaFunction,
    scale: CudaFunction,
    softcap: CudaFunction,
    copy_cols: CudaFunction,
    moe_route: CudaFunction,
    moe_sort: CudaFunction,
    moe_sum: CudaFunction,
}

#[derive(Default)]
struct Scratch {
    w16: Option<CudaSlice<u16>>,
    x16: Option<CudaSlice<u16>>,
    /// The small-batch GEMM's f16 activations and split-k partial sums
    /// (outgrown: `retired`, as the q8 slots).
    mmq_x: Option<CudaSlice<u8>>,
    mmq_part: Option<CudaSlice<u8>>,
    /// `moe_sort`'s table: the pairs in expert order, the tiles, their count.
    moe_sort: Option<CudaSlice<u8>>,
    /// `argmax_rows`: the ids, the slices' keys and the per-row u32
    /// counters (zero between launches).
    ids: Option<CudaSlice<u32>>,
    amax_keys: Option<CudaSlice<u8>>,
    amax_cnt: Option<CudaSlice<u8>>,
    /// `top_k_rows`: its ids, values and per-row words, in one buffer
    /// read back at once.
    topk: Option<CudaSlice<u8>>,
    /// The page-locked buffer read-backs land in (`read`, the argmax ids)
    /// and the events of a chunked read's two halves.
    host: Option<Pinned>,
    host_events: Option<[cudarc::driver::CudaEvent; 2]>,
    /// The q8 activations of the decode matvecs: int8 values, then the
    /// per-unit (d, d * sum) pairs (`quant_lane` in `kernels.cu`). Two
    /// slots: a launch that reads one q8 input and writes the next (the
    /// gate/up matvec with the GLU) writes slot 1.
    q8: [Option<CudaSlice<u8>>; 2],
    /// q8 buffers outgrown: kept, since a recorded graph may still read
    /// them (a graph holds raw addresses).
    retired: Vec<CudaSlice<u8>>,
    /// The GLU kernels' per-unit u32 counters (`glu_unit_q8`): zero
    /// between launches. Grows like the q8 slots (outgrown: `retired`).
    cnt: Option<CudaSlice<u8>>,
    /// Split decode attention's runs (max, sum, values per head) and its
    /// per-(token, head block) u32 counters, zero between launches.
    runs: Option<CudaSlice<u8>>,
    runs_cnt: Option<CudaSlice<u8>>,
}

/// Page-locked host memory that read-backs land in: a pageable
/// destination makes the driver stage the copy through its own buffer, on
/// the step's critical path.
struct Pinned {
    ptr: *mut u8,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

// SAFETY: the allocation is owned by the value; it is only touched through
// `&mut self` (behind the scratch lock), and freed once, on drop.
unsafe impl Send for Pinned {}

impl Pinned {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, CudaError> {
        ctx.bind_to_thread().map_err(drv("binding the context"))?;
        // SAFETY: a fresh allocation, written only by copies the caller
        // synchronizes before reading it (flags 0: cached, not write-combined,
        // since the host reads it).
        let ptr = unsafe { cudarc::driver::result::malloc_host(bytes.max(4), 0) }
            .map_err(drv(format!("allocating {bytes} page-locked bytes")))?;
        Ok(Pinned { ptr: ptr.cast(), bytes, ctx: Arc::clone(ctx) })
    }

    /// `slot`, grown to at least `bytes`.
    fn at_least<'a>(slot: &'a mut Option<Pinned>, ctx: &Arc<CudaContext>, bytes: usize) -> Result<&'a mut Pinned, CudaError> {
        if slot.as_ref().is_none_or(|p| p.bytes < bytes) {
            *slot = None;
            *slot = Some(Pinned::new(ctx, bytes.next_power_of_two())?);
        }
        slot.as_mut().ok_or_else(|| shape("read", "page-locked buffer not allocated".into()))
    }

    /// Copies `n` values of `src` (device address) into this buffer from
    /// byte `at` on, in stream order.
    fn copy_from<T>(&mut self, at: usize, src: u64, n: usize, stream: &CudaStream) -> Result<(), CudaError> {
        let size = std::mem::size_of::<T>();
        if !at.is_multiple_of(size) || at + n * size > self.bytes {
            return Err(shape("read", format!("{n} values at byte {at} of {}", self.bytes)));
        }
        // SAFETY: in bounds and aligned (checked above; the allocation is
        // page-aligned); nothing reads the destination before the caller
        // synchronizes the stream or an event recorded after this copy.
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(
                std::slice::from_raw_parts_mut(self.ptr.add(at).cast::<T>(), n),
                src,
                stream.cu_stream(),
            )
        }
        .map_err(drv("reading back"))
    }

    /// The `n` values from byte `at` on; the copies into them must have
    /// completed (the caller synchronized).
    fn values<T>(&self, at: usize, n: usize) -> &[T] {
        let size = std::mem::size_of::<T>();
        assert!(at.is_multiple_of(size) && at + n * size <= self.bytes, "pinned read out of bounds");
        // SAFETY: in bounds and aligned (asserted); every copy into the range
        // has completed, so nothing writes it while the slice lives.
        unsafe { std::slice::from_raw_parts(self.ptr.add(at).cast::<T>(), n) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by `malloc_host` in `new`; every copy into it was
        // synchronized by the call that issued it.
        let _ = self.ctx.bind_to_thread();
        let _ = unsafe { cudarc::driver::result::free_host(self.ptr.cast()) };
    }
}

/// Makes `slot` at least `bytes` long, zeroed when new (a power of two, at
/// least 4 KiB); the outgrown buffer goes to `retired`, not freed: a
/// recorded graph may still use its address.
fn grow_retiring(
    stream: &Arc<CudaStream>,
    slot: &mut Option<CudaSlice<u8>>,
    retired: &mut Vec<CudaSlice<u8>>,
    bytes: usize,
    what: &str,
) -> Result<(), CudaError> {
    if slot.as_ref().is_none_or(|s| s.len() < bytes) {
        let fresh = stream
            .alloc_zeros::<u8>(bytes.max(4096).next_power_of_two())
            .map_err(drv(format!("allocating {bytes} bytes of {what}")))?;
        if let Some(old) = slot.replace(fresh) {
            retired.push(old);
        }
    }
    Ok(())
}

/// Which input the q8 scratch holds right now: the buffer, how many floats
/// of it, in rows of how many. Set by the launch that wrote it, cleared by
/// every other launch or copy (any of them may have changed that input).
#[derive(Clone, Copy, PartialEq, Debug)]
struct Q8Tag {
    buf: u64,
    elems: usize,
    width: usize,
    /// The scratch slot ([`Scratch::q8`]).
    slot: usize,
}

/// One opened GPU with one stream. Opened once and passed around; dropping
/// it releases everything it allocated.
pub struct Device {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    fns: Fns,
    /// Kernel names by driver handle.
    names: HashMap<usize, String>,
    /// Each kernel's parameter types (`kernel_signatures`), for the debug
    /// builds' launch check.
    signatures: std::collections::BTreeMap<String, Vec<String>>,
    /// The names of the kernels launched since [`Device::log_launches`]
    /// turned the log on (`None`: off).
    launched: Mutex<Option<Vec<String>>>,
    /// Whether the launch log is on (checked without the lock).
    logging: std::sync::atomic::AtomicBool,
    blas: Option<CudaBlas>,
    name: String,
    arch: String,
    scratch: Mutex<Scratch>,
    /// The measuring knobs it opened with (`pdl`, `mma_attn` and `mma_max`
    /// only where the architecture has them).
    knobs: Knobs,
    q8_tag: Mutex<Option<Q8Tag>>,
    /// The device's multiprocessors.
    sms: usize,
    /// Dynamic shared memory `attention_dec` may use (the device's opt-in
    /// limit per block, set on the function at open).
    dec_smem: usize,
    /// The module, kept when the kernels were compiled with `FERROX_TRACE`
    /// (its `ferrox_trace` records; [`Device::write_trace`]).
    trace: Option<Arc<cudarc::driver::CudaModule>>,
}

/// Launch kinds `FERROX_CUDA_SKIP` leaves out (see [`Device`]).
#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
struct Skip {
    norm: bool,
    attn: bool,
    rope: bool,
}

/// The measuring knobs a [`Device`] opens with (docs/dev/cuda-knobs.md
/// says what each measured). Without the `measure` feature they are
/// [`Knobs::DEFAULT`], the measured best, and the environment is not read
/// for them at all: a release build runs one configuration, and none that
/// gives wrong output (`FERROX_CUDA_SKIP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Knobs {
    /// Units of a row one lane of the int8 gate/up GLU kernel takes
    /// (`FERROX_CUDA_MMVQ_UNITS`; unset, [`glu_units`] per kind): sets its
    /// lanes per row.
    mmvq_units: Option<usize>,
    /// Fused launches (RoPE with the cache store, the GLU in the gate/up
    /// matvec); `FERROX_CUDA_FUSE=0` turns them off, for measuring.
    fuse: bool,
    /// The RMS norm before a projection fused into its F16 matvec, and
    /// projections added into the residual stream by the matvec
    /// (`FERROX_CUDA_NORM_FUSE=0` turns both off, for measuring).
    norm_fuse: bool,
    /// RoPE and the cache store in the QKV matvec's epilogue
    /// (`FERROX_CUDA_QKV_ROPE=0` turns it off, for measuring).
    qkv_rope: bool,
    /// Blocks an SM of the streaming matvecs' grid (`matvec_f16_stream`,
    /// `matvec_f16_glu_stream`, `mmvq_stream_<kind>`;
    /// `FERROX_CUDA_STREAM_BLOCKS`, default 2: the kernels' launch bound).
    stream_blocks: usize,
    /// Kernels launched as programmatic dependent launches (Hopper and
    /// later; `FERROX_CUDA_PDL=0` turns it off).
    pdl: bool,
    /// Batches of at least this many tokens take the grouped attention
    /// kernel (`FERROX_CUDA_GQA_MIN`, default 1: it won at decode too,
    /// commit c0673a2); smaller batches take the per-head kernel.
    gqa_min: usize,
    /// Batches of at most this many tokens take `attention_dec`
    /// (`FERROX_CUDA_DEC_MAX`, default 16; 0 turns it off).
    dec_max: usize,
    /// Query heads a decode-attention block takes (`FERROX_CUDA_DEC_HEADS`:
    /// 0 the whole group of a KV head; default 1, a block per query head,
    /// each staging its KV head's keys itself: four times the blocks of a
    /// 4-head group, so more SMs read the cache. On the H200, tg128 at a
    /// 4096-token depth +12.5% (1b F16) and +13.5% (8b F16); at depth 0 1b
    /// F16 +1.8%, 8b Q8_0 +3.4%, 8b F16 -0.3%:
    /// docs/decisions/0015-block-per-query-head-decode-attention.md).
    dec_heads: usize,
    /// The largest key chunk `attention_dec` stages (`FERROX_CUDA_DEC_CHUNK`:
    /// 128, 64 or 32; default 128): a smaller one needs less shared memory.
    dec_chunk: usize,
    /// Split decode attention (flash-decoding): at most this many runs of
    /// a token and head block (`FERROX_CUDA_DEC_SPLIT`, default 16; 1 turns
    /// it off), one per `dec_span` keys of the token's window
    /// (`FERROX_CUDA_DEC_SPAN`, default 128). On the H200, 1b F16 tg128 at
    /// a 4096-token depth: 306 t/s unsplit, 792 split
    /// (docs/decisions/0016-split-decode-attention.md).
    dec_split: usize,
    dec_span: usize,
    /// Query heads a block of a split token takes (`FERROX_CUDA_DEC_SPLIT_HEADS`:
    /// 0, the default, the whole group; else a multiple of the unsplit
    /// tokens' `dec_heads` dividing the group).
    dec_split_heads: usize,
    /// How `read` brings floats back (`FERROX_CUDA_READ`): 0 straight into
    /// the caller's pageable memory (the driver stages it), 1 through a
    /// page-locked buffer in one piece, 2 (default) through one in
    /// pipelined pieces.
    read_mode: usize,
    /// Prefill attention on the tensor cores (`attention_mma`: sm_80 and
    /// later; `FERROX_CUDA_MMA_ATTN=0` turns it off, for measuring).
    mma_attn: bool,
    /// Batches above this many tokens take the F16 GEMM where cuBLAS
    /// loaded, smaller ones the int8/F16 matvecs per token
    /// (`FERROX_CUDA_GEMM_MIN`, default [`GEMM_MIN_TOKENS`]): the crossover
    /// a server's 9–64-token decode steps fall on either side of.
    gemm_min: usize,
    /// Batches of up to this many tokens above `gemm_min` take the
    /// small-batch tensor-core GEMM where the kind has one
    /// (`FERROX_CUDA_MMA_MAX`, default [`cuda_ops::MMA_MAX_TOKENS`]; 0 turns
    /// it off: the dequantize + cuBLAS GEMM, for measuring the crossover).
    mma_max: usize,
    /// Warps a block of the small-batch GEMM takes, 16 rows each
    /// (`FERROX_CUDA_MMQ_WARPS`, 1 to 8, default 4): the warps of a block
    /// share the activations they read through L1.
    mmq_warps: usize,
    /// Blocks a multiprocessor the small-batch GEMM's grid aims at: where
    /// the rows give fewer, blocks split k (`FERROX_CUDA_MMQ_WAVES`, default
    /// 8; at most 8 splits).
    mmq_waves: usize,
    /// Measuring only: launches skipped (`FERROX_CUDA_SKIP`, a comma list
    /// of `norm`, `attn`, `rope`). The output is then wrong; the decode
    /// time without them bounds what making them faster can give.
    skip: Skip,
}

impl Knobs {
    const DEFAULT: Knobs = Knobs {
        mmvq_units: None,
        fuse: true,
        norm_fuse: true,
        qkv_rope: true,
        stream_blocks: 2,
        pdl: true,
        gqa_min: 1,
        dec_max: 16,
        dec_heads: 1,
        dec_chunk: 128,
        dec_split: 16,
        dec_span: 128,
        dec_split_heads: 0,
        read_mode: 2,
        mma_attn: true,
        gemm_min: GEMM_MIN_TOKENS,
        mma_max: cuda_ops::MMA_MAX_TOKENS,
        mmq_warps: 4,
        mmq_waves: 8,
        skip: Skip { norm: false, attn: false, rope: false },
    };

    #[cfg(not(feature = "measure"))]
    fn read() -> Result<Knobs, CudaError> {
        Ok(Knobs::DEFAULT)
    }

    #[cfg(feature = "measure")]
    fn read() -> Result<Knobs, CudaError> {
        let mut raw = Vec::new();
        for name in MEASURE_KNOBS {
            raw.push((*name, ferrox_quant::knob::raw(name)?));
        }
        Ok(Knobs::parse(|n| raw.iter().find(|(k, _)| *k == n).and_then(|(_, v)| v.as_deref()))?)
    }

    /// The knobs from `get` (a variable's value, `None` unset): each the
    /// default when unset, a [`BadValue`] naming it when it does not parse.
    #[cfg(any(test, feature = "measure"))]
    fn parse<'a>(get: impl Fn(&str) -> Option<&'a str>) -> Result<Knobs, ferrox_quant::knob::BadValue> {
        use ferrox_quant::knob::{parse_count, parse_switch, parse_with};
        let d = Knobs::DEFAULT;
        let sw = |n: &'static str, def: bool| parse_switch(n, get(n), def);
        let any = |n: &'static str, def: usize| parse_count(n, get(n), def, "a count", |_| true);
        let skip_words = "a comma list of norm, attn, rope";
        let skip = parse_with("FERROX_CUDA_SKIP", get("FERROX_CUDA_SKIP"), skip_words, |v| {
            let mut s = Skip::default();
            for w in v.split(',').map(str::trim) {
                match w {
                    "norm" => s.norm = true,
                    "attn" => s.attn = true,
                    "rope" => s.rope = true,
                    _ => return None,
                }
            }
            Some(s)
        })?;
        Ok(Knobs {
            // 0 is the per-kind default, as unset.
            mmvq_units: Some(any("FERROX_CUDA_MMVQ_UNITS", 0)?).filter(|&v| v > 0),
            fuse: sw("FERROX_CUDA_FUSE", d.fuse)?,
            norm_fuse: sw("FERROX_CUDA_NORM_FUSE", d.norm_fuse)?,
            qkv_rope: sw("FERROX_CUDA_QKV_ROPE", d.qkv_rope)?,
            stream_blocks: parse_count(
                "FERROX_CUDA_STREAM_BLOCKS",
                get("FERROX_CUDA_STREAM_BLOCKS"),
                d.stream_blocks,
                "a count of at least 1",
                |n| n > 0,
            )?,
            pdl: sw("FERROX_CUDA_PDL", d.pdl)?,
            gqa_min: any("FERROX_CUDA_GQA_MIN", d.gqa_min)?,
            dec_max: any("FERROX_CUDA_DEC_MAX", d.dec_max)?,
            dec_heads: any("FERROX_CUDA_DEC_HEADS", d.dec_heads)?,
            dec_chunk: parse_count(
                "FERROX_CUDA_DEC_CHUNK",
                get("FERROX_CUDA_DEC_CHUNK"),
                d.dec_chunk,
                "32, 64 or 128",
                |n| matches!(n, 32 | 64 | 128),
            )?,
            dec_split: parse_count(
                "FERROX_CUDA_DEC_SPLIT",
                get("FERROX_CUDA_DEC_SPLIT"),
                d.dec_split,
                "a count from 1 to 32",
                |n| (1..=DEC_MAXSPLIT).contains(&n),
            )?,
            dec_span: parse_count(
                "FERROX_CUDA_DEC_SPAN",
                get("FERROX_CUDA_DEC_SPAN"),
                d.dec_span,
                "a count of at least 1",
                |n| n > 0,
            )?,
            dec_split_heads: any("FERROX_CUDA_DEC_SPLIT_HEADS", d.dec_split_heads)?,
            read_mode: parse_count("FERROX_CUDA_READ", get("FERROX_CUDA_READ"), d.read_mode, "0, 1 or 2", |n| n <= 2)?,
            mma_attn: sw("FERROX_CUDA_MMA_ATTN", d.mma_attn)?,
            gemm_min: any("FERROX_CUDA_GEMM_MIN", d.gemm_min)?,
            mma_max: any("FERROX_CUDA_MMA_MAX", d.mma_max)?,
            mmq_waves: parse_count("FERROX_CUDA_MMQ_WAVES", get("FERROX_CUDA_MMQ_WAVES"), d.mmq_waves, "a count of at least 1", |n| n > 0)?,
            mmq_warps: parse_count(
                "FERROX_CUDA_MMQ_WARPS",
                get("FERROX_CUDA_MMQ_WARPS"),
                d.mmq_warps,
                "a count from 1 to 8",
                |n| (1..=MMQ_MAX_WARPS).contains(&n),
            )?,
            skip: skip.unwrap_or_default(),
        })
    }
}

/// Every knob [`Knobs::read`] reads in a `measure` build.
#[cfg(feature = "measure")]
const MEASURE_KNOBS: &[&str] = &[
    "FERROX_CUDA_GEMM_MIN",
    "FERROX_CUDA_MMA_MAX",
    "FERROX_CUDA_MMQ_WARPS",
    "FERROX_CUDA_MMQ_WAVES",
    "FERROX_CUDA_MMVQ_UNITS",
    "FERROX_CUDA_FUSE",
    "FERROX_CUDA_NORM_FUSE",
    "FERROX_CUDA_QKV_ROPE",
    "FERROX_CUDA_STREAM_BLOCKS",
    "FERROX_CUDA_PDL",
    "FERROX_CUDA_GQA_MIN",
    "FERROX_CUDA_DEC_MAX",
    "FERROX_CUDA_DEC_HEADS",
    "FERROX_CUDA_DEC_CHUNK",
    "FERROX_CUDA_DEC_SPLIT",
    "FERROX_CUDA_DEC_SPAN",
    "FERROX_CUDA_DEC_SPLIT_HEADS",
    "FERROX_CUDA_READ",
    "FERROX_CUDA_MMA_ATTN",
    "FERROX_CUDA_SKIP",
];

fn shape(op: &'static str, why: String) -> CudaError {
    CudaError::Shape { op, why }
}

fn int(op: &'static str, v: usize) -> Result<i32, CudaError> {
    i32::try_from(v).map_err(|_| shape(op, format!("{v} does not fit a 32-bit kernel argument")))
}

fn grid(n: usize, block: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (n.div_ceil(block as usize).max(1) as u32, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// With tracing compiled in and `FERROX_CUDA_TRACE=<file>`, the trace is
/// written when the device closes (measuring only).
impl Drop for Device {
    fn drop(&mut self) {
        if self.trace.is_none() {
            return;
        }
        #[cfg(feature = "measure")]
        if let Some(p) = std::env::var_os("FERROX_CUDA_TRACE") {
            match self.write_trace(std::path::Path::new(&p)) {
                Ok(n) => eprintln!("ferrox: {n} kernel entries traced to {}", p.to_string_lossy()),
                Err(e) => eprintln!("ferrox: trace not written: {e}"),
            }
        }
    }
}

impl Device {
    /// Whether the driver library loads and sees at least one device. Never
    /// panics (cudarc does, on a missing library, so this probes first).
    pub fn probe() -> bool {
        // SAFETY: only tries to dlopen libcuda by its candidate names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return false;
        }
        CudaContext::device_count().is_ok_and(|n| n > 0)
    }

    /// Opens device `ordinal`: a context, one stream, the kernels compiled
    /// (or loaded from the disk cache) for its architecture, and cuBLAS when
    /// the library is there (without it prefill runs the matvec kernels).
    pub fn open(ordinal: usize) -> Result<Device, CudaError> {
        let k = Knobs::read()?;
        // SAFETY: only tries to dlopen libcuda by its candidate names.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(CudaError::MissingLibrary { lib: "libcuda" });
        }
        let count = CudaContext::device_count().map_err(drv("counting devices"))?;
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(drv("creating a context"))?;
        // SAFETY: called before any buffer or stream of this context exists,
        // and everything this Device does runs on its one stream, which
        // orders it without events.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(drv("creating a stream"))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(drv("reading the compute capability"))?;
        let arch = format!("compute_{major}{minor}");
        let name = ctx.name().map_err(drv("reading the device name"))?;
        let sms = ctx
            .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(drv("reading the multiprocessor count"))?;
        // The kernels' knobs (`FERROX_CUDA_DEFINES`, for measuring) and the
        // device's SM count (the first-wave prefetch bound).
        let mut defines = crate::compile::env_defines()?;
        defines.push(format!("FERROX_SMS={}", sms.max(1)));
        let ptx = crate::compile::ptx_for(&arch, &defines)?;
        let module = ctx
            .load_module(ptx)
            .map_err(drv(format!("loading the kernels for {arch}")))?;
        #[cfg(feature = "measure")]
        let traced = defines
            .iter()
            .any(|d| d == "FERROX_TRACE" || (d.starts_with("FERROX_TRACE=") && d != "FERROX_TRACE=0"));
        #[cfg(not(feature = "measure"))]
        let traced = false;
        let trace = traced.then(|| Arc::clone(&module));
        // Each kernel's name by its driver handle, for the launch log.
        let names = std::cell::RefCell::new(HashMap::new());
        let f = |n: &str| {
            let func = module
                .load_function(n)
                .map_err(drv(format!("finding kernel {n}")))?;
            names.borrow_mut().insert(func.cu_function() as usize, n.to_string());
            Ok::<_, CudaError>(func)
        };
        let mut kinds = HashMap::new();
        for &k in QuantKind::ALL {
            if let Some(names) = cuda_ops::kind_kernels(k) {
                let (mmvq, mmvq_glu) = match &names.int8 {
                    Some((stream, glu)) => (Some(f(stream)?), Some(f(glu)?)),
                    None => (None, None),
                };
                kinds.insert(
                    k,
                    KindFns {
                        matvec: f(&names.matvec)?,
                        mmvq,
                        mmvq_glu,
                        get_rows: f(&names.get_rows)?,
                        dequant: f(&names.dequant_f16)?,
                        matvec_id: f(&names.matvec_id)?,
                        mma: match &names.mma {
                            Some(v) => Some(v.iter().map(|n| f(n)).collect::<Result<_, _>>()?),
                            None => None,
                        },
                        experts_int8: match &names.experts_int8 {
                            Some((mv, g)) => Some((f(mv)?, g.iter().map(|n| f(n)).collect::<Result<_, _>>()?)),
                            None => None,
                        },
                    },
                );
            }
        }
        let fns = Fns {
            kinds,
            f32_to_f16: f("f32_to_f16")?,
            mmq_reduce: f("mmq_reduce")?,
            quantize_q8: f("quantize_q8")?,
            rms_norm: f("rms_norm")?,
            add_rms_norm: f("add_rms_norm")?,
            argmax_rows: f("argmax_rows")?,
            top_k_rows: f("top_k_rows")?,
            matvec_f16_stream: f("matvec_f16_stream")?,
            matvec_f16_glu_stream: f("matvec_f16_glu_stream")?,
            matvec_f16_norm_stream: f("matvec_f16_norm_stream")?,
            matvec_f16_glu_norm_stream: f("matvec_f16_glu_norm_stream")?,
            rope: f("rope")?,
            kv_store: f("kv_store")?,
            rope_kv: f("rope_kv")?,
            attention: f("attention")?,
            attention_gqa: f("attention_gqa")?,
            attention_dec: f("attention_dec")?,
            attention_mma: f("attention_mma")?,
            glu: f("glu")?,
            add: f("add")?,
            add_bias: f("add_bias")?,
            scale: f("scale")?,
            softcap: f("softcap")?,
            copy_cols: f("copy_cols")?,
            moe_route: f("moe_route")?,
            moe_sort: f("moe_sort")?,
            moe_sum: f("moe_sum")?,
        };
        // Up to the device's opt-in shared memory for the staged decode
        // attention (more than the default 48 KiB).
        let dec_smem = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )
            .map_err(drv("reading the shared memory limit"))?
            .max(0) as usize;
        // (Its static shared memory comes off the limit.)
        let static_smem = fns
            .attention_dec
            .shared_size_bytes()
            .map_err(drv("reading attention_dec's static shared memory"))?;
        let dec_smem = dec_smem.saturating_sub(static_smem.max(0) as usize);
        fns.attention_dec
            .set_attribute(
                cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dec_smem as i32,
            )
            .map_err(drv("raising attention_dec's shared memory"))?;
        // SAFETY: only tries to dlopen libcublas by its candidate names.
        let blas = if unsafe { cudarc::cublas::sys::is_culib_present() } {
            Some(
                CudaBlas::new(Arc::clone(&stream)).map_err(|source| CudaError::Blas {
                    what: "creating a handle",
                    source,
                })?,
            )
        } else {
            None
        };
        Ok(Device {
            ctx,
            stream,
            fns,
            names: names.into_inner(),
            signatures: if cfg!(debug_assertions) { crate::kernel_signatures(crate::kernel_source()) } else { Default::default() },
            launched: Mutex::new(None),
            logging: std::sync::atomic::AtomicBool::new(false),
            blas,
            name,
            arch,
            scratch: Mutex::new(Scratch::default()),
            knobs: Knobs {
                pdl: major >= 9 && k.pdl,
                mma_attn: major >= 8 && k.mma_attn,
                mma_max: if major >= 8 { k.mma_max } else { 0 },
                ..k
            },
            q8_tag: Mutex::new(None),
            sms: sms.max(1) as usize,
            dec_smem,
            trace,
        })
    }

    /// The scratch buffers, locked (`op` names the caller in the error a
    /// poisoned lock gives).
    fn scratch_guard(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, Scratch>, CudaError> {
        self.scratch.lock().map_err(|_| shape(op, "scratch lock poisoned".into()))
    }

    /// Split decode attention's scratch: `floats` for the runs, `counters`
    /// zeroed u32 counters.
    fn split_scratch(&self, floats: usize, counters: usize) -> Result<(u64, u64), CudaError> {
        let mut guard = self.scratch_guard("attention runs")?;
        let sc = &mut *guard;
        grow_retiring(&self.stream, &mut sc.runs, &mut sc.retired, 4 * floats, "attention runs")?;
        grow_retiring(&self.stream, &mut sc.runs_cnt, &mut sc.retired, 4 * counters, "attention run counters")?;
        let ptr = |o: &Option<CudaSlice<u8>>| o.as_ref().map_or(0, |c| self.ptr(c));
        Ok((ptr(&sc.runs), ptr(&sc.runs_cnt)))
    }

    /// Whether fused launches are on (`FERROX_CUDA_FUSE`, default on).
    pub fn fuses(&self) -> bool {
        self.knobs.fuse
    }

    /// Whether the QKV matvec applies RoPE and stores the cache
    /// (`FERROX_CUDA_QKV_ROPE`, default on; needs [`Device::fuses`] too).
    pub fn qkv_ropes(&self) -> bool {
        self.knobs.qkv_rope && self.knobs.fuse
    }

    /// Whether norms fuse into the F16 matvecs and projections add into
    /// the residual in the matvec (`FERROX_CUDA_NORM_FUSE`, default on;
    /// the gate/up GLU with the norm also needs [`Device::fuses`]).
    pub fn norm_fuses(&self) -> bool {
        self.knobs.norm_fuse
    }

    /// The device's name (`NVIDIA H200`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The architecture the kernels were compiled for (`compute_90`).
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// Whether `args` are what the kernel `f` declares (count and C types).
    fn check_args(&self, f: &CudaFunction, what: &str, args: &[&dyn Arg]) -> Result<(), CudaError> {
        let name = self.names.get(&(f.cu_function() as usize)).map_or(what, String::as_str);
        let Some(want) = self.signatures.get(name) else {
            return Ok(());
        };
        let got: Vec<&str> = args.iter().map(|a| a.c_type()).collect();
        if got.len() != want.len() || got.iter().zip(want).any(|(g, w)| g != w) {
            return Err(shape("launch", format!("{name} takes ({}), the launch passes ({})", want.join(", "), got.join(", "))));
        }
        Ok(())
    }

    /// Free device memory in bytes (what a model's weights must fit in).
    pub fn free_memory(&self) -> Result<u64, CudaError> {
        Ok(self.memory()?.0)
    }

    /// The device's free and total memory, bytes, as the driver counts them
    /// (every process's allocations).
    pub fn memory(&self) -> Result<(u64, u64), CudaError> {
        let (free, total) = self.ctx.mem_get_info().map_err(drv("reading the device memory"))?;
        Ok((free as u64, total as u64))
    }

    /// Starts a log of the kernels launched (by name), or stops it and
    /// returns what it holds: what a test compares with the plan.
    pub fn log_launches(&self, on: bool) -> Vec<String> {
        let mut log = self.launched.lock().unwrap_or_else(|e| e.into_inner());
        self.logging.store(on, std::sync::atomic::Ordering::Relaxed);
        std::mem::replace(&mut *log, on.then(Vec::new)).unwrap_or_default()
    }

    /// Whether cuBLAS was found (the GEMM prefill path).
    pub fn has_blas(&self) -> bool {
        self.blas.is_some()
    }

    /// Whether `n` tokens take the matvec path ([`Device::matmul_path`]).
    pub fn takes_matvec(&self, n: usize) -> bool {
        self.matmul_path(n) == MatmulPath::Matvec
    }

    /// Waits for everything enqueued so far.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.stream
            .synchronize()
            .map_err(drv("synchronizing the stream"))
    }

    /// Measuring only: with the kernels compiled with `FERROX_TRACE`
    /// (`FERROX_CUDA_DEFINES=FERROX_TRACE=1`), writes every kernel entry
    /// recorded so far to `path`, a line each in launch order: index, the
    /// ns timer when the kernel's first block reached its wait, when the
    /// wait returned, the source line and the kernel it names
    /// (`tools/cuda/trace.py` reads it). Returns the records written;
    /// without tracing, 0 and no file.
    pub fn write_trace(&self, path: &std::path::Path) -> Result<usize, CudaError> {
        let Some(m) = &self.trace else {
            return Ok(0);
        };
        self.synchronize()?;
        let read = |name: &str| -> Result<Vec<u8>, CudaError> {
            let g = m
                .get_global(name, &self.stream)
                .map_err(drv(format!("finding {name}")))?;
            self.stream
                .clone_dtoh(&g)
                .map_err(drv(format!("reading {name}")))
        };
        let n = read("ferrox_trace_n")?;
        let n = u32::from_le_bytes(n.get(..4).and_then(|b| b.try_into().ok()).unwrap_or([0; 4])) as usize;
        let recs = read("ferrox_trace")?;
        let words: Vec<u64> = recs
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        let kept = n.min(words.len() / 3);
        let src = crate::compile::kernel_source();
        let mut out = String::new();
        for (i, r) in words.chunks_exact(3).take(kept).enumerate() {
            let name = crate::compile::kernel_at_line(src, r[2] as usize);
            out.push_str(&format!("{i} {} {} {} {name}\n", r[0], r[1], r[2]));
        }
        std::fs::write(path, out).map_err(|e| CudaError::Shape {
            op: "write_trace",
            why: format!("{}: {e}", path.display()),
        })?;
        if n > kept {
            eprintln!("ferrox: trace kept the first {kept} of {n} kernel entries");
        }
        Ok(kept)
    }

    fn set_q8_tag(&self, t: Option<Q8Tag>) {
        if let Ok(mut g) = self.q8_tag.lock() {
            *g = t;
        }
    }

    fn q8_tag(&self) -> Option<Q8Tag> {
        self.q8_tag.lock().ok().and_then(|g| *g)
    }

    /// The q8 scratch for `elems` activations (a multiple of 32): the
    /// addresses of its int8 values and of its per-unit scales. Grows, never
    /// shrinks; an outgrown buffer is retired, not freed (graphs).
    fn q8_scratch(&self, elems: usize) -> Result<(u64, u64), CudaError> {
        self.q8_scratch_slot(elems, 0)
    }

    fn q8_scratch_slot(&self, elems: usize, slot: usize) -> Result<(u64, u64), CudaError> {
        let need = elems + elems / 32 * 8;
        let mut guard = self.scratch_guard("q8 scratch")?;
        let sc = &mut *guard;
        grow_retiring(&self.stream, &mut sc.q8[slot], &mut sc.retired, need, "q8 scratch")?;
        let p = sc.q8[slot].as_ref().map_or(0, |s| self.ptr(s));
        Ok((p, p + elems as u64))
    }

    /// At least `n` zeroed u32 counters for the GLU kernels' q8 units.
    fn unit_counters(&self, n: usize) -> Result<u64, CudaError> {
        let mut guard = self.scratch_guard("unit counters")?;
        let sc = &mut *guard;
        grow_retiring(&self.stream, &mut sc.cnt, &mut sc.retired, 4 * n, "unit counters")?;
        Ok(sc.cnt.as_ref().map_or(0, |c| self.ptr(c)))
    }

    /// The q8 copy of `x` (`elems` floats in rows of `width`): where the
    /// last launch left it, else quantized now into slot 0.
    fn q8_input(&self, x: &Buf, elems: usize, width: usize) -> Result<(u64, u64), CudaError> {
        if let Some(t) = self.q8_tag() {
            if t.buf == x.id && t.elems == elems && t.width == width {
                return self.q8_scratch_slot(elems, t.slot);
            }
        }
        let (qs, ds) = self.q8_scratch(elems)?;
        let ne = elems as i64;
        self.launch(
            &self.fns.quantize_q8,
            grid(elems, 256),
            "quantize_q8",
            &[&self.ptr(&x.s), &qs, &ds, &ne],
        )?;
        self.set_q8_tag(Some(Q8Tag {
            buf: x.id,
            elems,
            width,
            slot: 0,
        }));
        Ok((qs, ds))
    }

    /// Whether the q8 scratch holds `b`'s quantized copy right now (the
    /// last launch wrote it): the next int8 matvec over `b` reads it
    /// without quantizing again. For tests.
    pub fn q8_holds(&self, b: &Buf) -> bool {
        self.q8_tag().is_some_and(|t| t.buf == b.id)
    }

    /// Whether a launch over `rows x width` floats should also write the q8
    /// copy (the next matmul over them takes the int8 decode path).
    fn wants_q8(&self, rows: usize, width: usize) -> bool {
        width.is_multiple_of(32)
            && self.matmul_path(rows) == MatmulPath::Matvec
            && rows <= 65535
    }

    fn ptr<T>(&self, s: &CudaSlice<T>) -> u64 {
        // Event tracking is off, so the guard this returns does nothing.
        s.device_ptr(&self.stream).0
    }

    fn launch<'a>(
        &'a self,
        f: &'a CudaFunction,
        cfg: LaunchConfig,
        what: &'static str,
        args: &'a [&'a dyn Arg],
    ) -> Result<(), CudaError> {
        self.set_q8_tag(None);
        self.launch_keep(f, cfg, what, args)
    }

    /// [`Device::launch`] for the kernels that only read the q8 scratch's
    /// input: the tag stays.
    fn launch_keep<'a>(
        &'a self,
        f: &'a CudaFunction,
        cfg: LaunchConfig,
        what: &'static str,
        args: &'a [&'a dyn Arg],
    ) -> Result<(), CudaError> {
        // Debug builds (the GPU tests) hold every launch to the kernel's
        // parameter list in `kernels.cu`: an argument-order slip is an error
        // there, never a kernel reading a float as a pointer.
        if cfg!(debug_assertions) {
            self.check_args(f, what, args)?;
        }
        if self.logging.load(std::sync::atomic::Ordering::Relaxed) {
            if let Some(log) = self.launched.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                log.push(self.names.get(&(f.cu_function() as usize)).cloned().unwrap_or_else(|| what.to_string()));
            }
        }
        if self.knobs.pdl {
            return self.launch_pdl(f, cfg, what, args);
        }
        let mut b = self.stream.launch_builder(f);
        for a in args {
            a.push(&mut b);
        }
        // SAFETY: every caller passes the argument list its kernel in
        // `kernels.cu` declares, in order and with the C types the `Arg`
        // impls produce, and has checked that each pointer's buffer is large
        // enough for the grid it launches.
        unsafe { b.launch(cfg) }.map_err(drv(format!("launching {what}")))?;
        Ok(())
    }

    /// [`Device::launch_keep`] as a programmatic dependent launch: the
    /// kernel may start while the previous one on the stream still runs; it
    /// waits for it at its `PDL_ENTER` (every kernel in `kernels.cu` has one
    /// before it touches anything but weights).
    fn launch_pdl(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        what: &'static str,
        args: &[&dyn Arg],
    ) -> Result<(), CudaError> {
        use cudarc::driver::sys;
        self.ctx
            .bind_to_thread()
            .map_err(drv(format!("launching {what}")))?;
        let mut params: Vec<*mut std::ffi::c_void> = args.iter().map(|a| a.param()).collect();
        // SAFETY: a zeroed attribute is a valid plain-C value; the id and
        // the union member for that id are set below.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let lc = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: as in `launch_keep` (each caller passes its kernel's
        // argument list, in order, with buffers sized for the grid); `params`
        // points at `args`' values, which outlive the call, and the driver
        // copies them before returning.
        unsafe { sys::cuLaunchKernelEx(&lc, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }
            .result()
            .map_err(drv(format!("launching {what}")))
    }

    // ---- memory

    /// Uploads one weight matrix in its block format.
    pub fn upload_matrix(
        &self,
        kind: QuantKind,
        bytes: &[u8],
        rows: usize,
        cols: usize,
    ) -> Result<Matrix, CudaError> {
        let row_bytes =
            ferrox_quant::row_bytes(kind, cols).map_err(|e| shape("upload", e.to_string()))?;
        if Some(bytes.len()) != row_bytes.checked_mul(rows) {
            return Err(shape(
                "upload",
                format!("{} bytes for {rows}x{cols} {kind}", bytes.len()),
            ));
        }
        if bytes.is_empty() {
            return Err(shape(
                "upload",
                format!("an empty {rows}x{cols} {kind} matrix"),
            ));
        }
        let (data, row_bytes) = match repack(kind, bytes, rows, row_bytes) {
            Some((packed, rb)) => (
                self.stream
                    .clone_htod(&packed)
                    .map_err(drv(format!("uploading {} bytes", packed.len())))?,
                rb,
            ),
            None => (
                self.stream
                    .clone_htod(bytes)
                    .map_err(drv(format!("uploading {} bytes", bytes.len())))?,
                row_bytes,
            ),
        };
        Ok(Matrix {
            kind,
            rows,
            cols,
            row_bytes,
            data,
        })
    }

    /// Uploads floats (norm weights, biases, test inputs).
    pub fn upload_f32(&self, v: &[f32]) -> Result<Buf, CudaError> {
        if v.is_empty() {
            return self.alloc(0);
        }
        let s = self.stream.clone_htod(v).map_err(drv("uploading floats"))?;
        Ok(Buf { s, len: v.len(), id: next_buf_id() })
    }

    /// Uploads indices (token ids, positions, slots, rows).
    pub fn upload_u32(&self, v: &[u32]) -> Result<Indices, CudaError> {
        let s = if v.is_empty() {
            self.stream
                .alloc_zeros(1)
                .map_err(drv("allocating indices"))?
        } else {
            self.stream
                .clone_htod(v)
                .map_err(drv("uploading indices"))?
        };
        Ok(Indices { s, len: v.len() })
    }

    /// A zeroed buffer of `len` floats.
    pub fn alloc(&self, len: usize) -> Result<Buf, CudaError> {
        let s = self
            .stream
            .alloc_zeros(len.max(1))
            .map_err(drv(format!("allocating {len} floats")))?;
        Ok(Buf { s, len, id: next_buf_id() })
    }

    /// Copies the first `dst.len()` floats of `src` to the host, waiting for
    /// the work that produces them.
    pub fn read(&self, src: &Buf, dst: &mut [f32]) -> Result<(), CudaError> {
        if dst.len() > src.len {
            return Err(shape(
                "read",
                format!("{} floats from a buffer of {}", dst.len(), src.len),
            ));
        }
        if dst.is_empty() {
            return Ok(());
        }
        if self.knobs.read_mode == 0 {
            self.stream
                .memcpy_dtoh(&src.s.slice(..dst.len()), dst)
                .map_err(drv("reading back"))?;
            return self.synchronize();
        }
        // Through the page-locked buffer: in pieces of READ_CHUNK bytes,
        // two halves of it in turn, the copy of one piece out overlapping the
        // device's copy of the next into the other half (`FERROX_CUDA_READ=1`:
        // one piece).
        let n = dst.len();
        let per = if self.knobs.read_mode == 1 { n } else { READ_CHUNK / 4 };
        let pieces = n.div_ceil(per);
        let src0 = self.ptr(&src.s);
        let mut guard = self.scratch_guard("read")?;
        let sc = &mut *guard;
        if pieces == 1 {
            return self.read_pinned(&mut sc.host, src0, dst);
        }
        let events = match &mut sc.host_events {
            Some(e) => &*e,
            slot => {
                let ev = || self.ctx.new_event(None).map_err(drv("creating a read event"));
                &*slot.insert([ev()?, ev()?])
            }
        };
        let host = Pinned::at_least(&mut sc.host, &self.ctx, 2 * READ_CHUNK)?;
        let span = |i: usize| (i * per, per.min(n - i * per));
        let issue = |host: &mut Pinned, i: usize| -> Result<(), CudaError> {
            let (a, len) = span(i);
            host.copy_from::<f32>((i % 2) * READ_CHUNK, src0 + 4 * a as u64, len, &self.stream)?;
            events[i % 2].record(&self.stream).map_err(drv("recording a read event"))
        };
        issue(host, 0)?;
        issue(host, 1)?;
        for i in 0..pieces {
            events[i % 2].synchronize().map_err(drv("waiting for a read"))?;
            let (a, len) = span(i);
            dst[a..a + len].copy_from_slice(host.values((i % 2) * READ_CHUNK, len));
            if i + 2 < pieces {
                issue(host, i + 2)?;
            }
        }
        Ok(())
    }

    /// Copies `out.len()` values from device address `src` into `out`
    /// through the page-locked buffer in `slot` (grown as needed), waiting
    /// for the work that produces them.
    fn read_pinned<T: Copy>(&self, slot: &mut Option<Pinned>, src: u64, out: &mut [T]) -> Result<(), CudaError> {
        let host = Pinned::at_least(slot, &self.ctx, std::mem::size_of_val(out))?;
        host.copy_from::<T>(0, src, out.len(), &self.stream)?;
        self.synchronize()?;
        out.copy_from_slice(host.values(0, out.len()));
        Ok(())
    }

    /// A zeroed f16 KV cache.
    pub fn kv_cache(
        &self,
        n_slots: usize,
        n_ctx: usize,
        k_dims: &[usize],
        v_dims: &[usize],
    ) -> Result<Kv, CudaError> {
        if k_dims.len() != v_dims.len() {
            return Err(shape(
                "kv cache",
                format!("{} key layers, {} value layers", k_dims.len(), v_dims.len()),
            ));
        }
        let alloc = |d: usize| -> Result<CudaSlice<u16>, CudaError> {
            let n = n_slots
                .checked_mul(n_ctx)
                .and_then(|x| x.checked_mul(d))
                .ok_or_else(|| shape("kv cache", "size overflows".into()))?;
            self.stream.alloc_zeros(n.max(1)).map_err(drv(format!(
                "allocating a KV cache of {} MiB",
                (n * 2) >> 20
            )))
        };
        Ok(Kv {
            n_slots,
            n_ctx,
            k_dims: k_dims.to_vec(),
            v_dims: v_dims.to_vec(),
            k: k_dims.iter().map(|&d| alloc(d)).collect::<Result<_, _>>()?,
            v: v_dims.iter().map(|&d| alloc(d)).collect::<Result<_, _>>()?,
        })
    }

    // ---- weights

    fn kind_fns(&self, kind: QuantKind, op: &'static str) -> Result<&KindFns, CudaError> {
        self.fns
            .kinds
            .get(&kind)
            .ok_or(CudaError::NoKernel { op, kind })
    }

    /// `out[i] = table[ids[i]]`, dequantized; each id
    /// checked by the caller to be inside the table.
    pub fn get_rows(
        &self,
        table: &Matrix,
        ids: IndexView<'_>,
        out: &mut Buf,
    ) -> Result<(), CudaError> {
        let f = &self.kind_fns(table.kind, "get_rows")?.get_rows;
        let n = ids.len;
        if out.len != n * table.cols {
            return Err(shape(
                "get_rows",
                format!("{n} ids of {} into {} floats", table.cols, out.len),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (n as u32, 1, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        let (w, i, o) = (self.ptr(&table.data), ids.ptr, self.ptr(&out.s));
        self.launch(
            f,
            cfg,
            "get_rows",
            &[
                &w,
                &i,
                &o,
                &int("get_rows", table.cols)?,
                &(table.row_bytes as i64),
            ],
        )
    }

    /// Which path [`Device::matmul`] takes for `n` tokens.
    pub fn matmul_path(&self, n: usize) -> MatmulPath {
        if n > self.knobs.gemm_min && self.blas.is_some() {
            MatmulPath::Gemm
        } else {
            MatmulPath::Matvec
        }
    }

    /// `y = x W^T` for `n` rows of `x` (`[n, cols]` into `[n, rows]`).
    pub fn matmul(&self, w: &Matrix, x: &Buf, y: &mut Buf, n: usize) -> Result<(), CudaError> {
        self.matmul_with(self.matmul_path_for(w, n), w, x, y, n)
    }

    /// The path [`Device::matmul`] takes for `w` over `n` tokens: the
    /// small-batch tensor-core GEMM where [`Device::matmul_path`] says GEMM
    /// and `w`'s kind, width and `n` fit it (sm_80 and later).
    pub fn matmul_path_for(&self, w: &Matrix, n: usize) -> MatmulPath {
        // Only where the GEMM would run: without cuBLAS every batch stays on
        // the matvecs, whose fused launches (`stream_path`) decide by `n` alone.
        match self.matmul_path(n) {
            MatmulPath::Gemm if self.mma_fits(w, n) => MatmulPath::Mma,
            p => p,
        }
    }

    /// Whether the small-batch tensor-core GEMM is on here (sm_80 and
    /// later, unless `FERROX_CUDA_MMA_MAX=0` turned it off).
    pub fn small_batch_gemm(&self) -> bool {
        self.knobs.mma_max > 0
    }

    /// Whether `w` over `n` tokens can take the small-batch tensor-core
    /// GEMM here (its kernel loaded, sm_80 and later, the knob's bound).
    pub fn mma_fits(&self, w: &Matrix, n: usize) -> bool {
        n <= self.knobs.mma_max
            && cuda_ops::mma_fits(w.kind, w.cols, n)
            && self.fns.kinds.get(&w.kind).is_some_and(|k| k.mma.is_some())
    }

    /// [`Device::matmul`] on a chosen path (tests check each).
    pub fn matmul_with(
        &self,
        path: MatmulPath,
        w: &Matrix,
        x: &Buf,
        y: &mut Buf,
        n: usize,
    ) -> Result<(), CudaError> {
        matmul_shape(w, x, y, n)?;
        if n == 0 {
            return Ok(());
        }
        match path {
            MatmulPath::Matvec => {
                let fns = self.kind_fns(w.kind, "matvec")?;
                if n > 65535 {
                    return Err(shape("matvec", format!("{n} tokens in one launch")));
                }
                if mmvq_fits(w) {
                    return self.mmvq(&[(w, self.ptr(&y.s))], x, n, Epilogue::Store);
                }
                if f16_fits(w) {
                    return self.matvec_f16(&[(w, self.ptr(&y.s))], x, n, Epilogue::Store, None);
                }
                // Every other kind: the unit decoder.
                let (wp, xp, yp) = (self.ptr(&w.data), self.ptr(&x.s), self.ptr(&y.s));
                let cfg = LaunchConfig {
                    grid_dim: (w.rows.div_ceil(4) as u32, n as u32, 1),
                    block_dim: (32 * 4, 1, 1),
                    shared_mem_bytes: 0,
                };
                self.launch(
                    &fns.matvec,
                    cfg,
                    "matvec",
                    &[
                        &wp,
                        &xp,
                        &yp,
                        &int("matvec", w.rows)?,
                        &int("matvec", w.cols)?,
                        &(w.row_bytes as i64),
                    ],
                )
            }
            MatmulPath::Gemm => self.gemm(w, x, y, n),
            MatmulPath::Mma => {
                let x16 = self.x_f16(x, n * w.cols)?;
                self.mma(w, x16, y, n)
            }
        }
    }

    /// `ys[i] = x W_i^T` for up to three matrices over the same `n` rows of
    /// `x` — a layer's Q, K and V, or gate and up. On the matvec path, when
    /// every matrix has one int8-activation kernel (same kind and width), or
    /// all are F16 of one width for the 16-byte-load kernel, that is one
    /// launch; otherwise one [`Device::matmul`] each.
    pub fn matmul_many(
        &self,
        x: &Buf,
        n: usize,
        outs: &mut [(&Matrix, &mut Buf)],
    ) -> Result<(), CudaError> {
        let mats: Vec<cuda_ops::Mat> = outs.iter().map(|(w, _)| mat(w)).collect();
        let one = cuda_ops::one_launch(&mats).is_some() && outs.iter().all(|(w, _)| mmvq_fits(w) || f16_fits(w));
        let fused = one && self.stream_path(n);
        let mma = outs.len() > 1 && outs.iter().all(|(w, _)| self.matmul_path_for(w, n) == MatmulPath::Mma && w.cols == outs[0].0.cols);
        if mma {
            // The activations converted to f16 once for all the matrices.
            for (w, y) in outs.iter() {
                matmul_shape(w, x, y, n)?;
            }
            let x16 = self.x_f16(x, n * outs[0].0.cols)?;
            for (w, y) in outs.iter_mut() {
                self.mma(w, x16, y, n)?;
            }
            return Ok(());
        }
        if !fused {
            for (w, y) in outs.iter_mut() {
                self.matmul(w, x, y, n)?;
            }
            return Ok(());
        }
        for (w, y) in outs.iter() {
            matmul_shape(w, x, y, n)?;
        }
        let mats: Vec<(&Matrix, u64)> = outs.iter().map(|(w, y)| (*w, self.ptr(&y.s))).collect();
        if f16_fits(mats[0].0) {
            return self.matvec_f16(&mats, x, n, Epilogue::Store, None);
        }
        self.mmvq(&mats, x, n, Epilogue::Store)
    }

    /// One launch of the streaming F16 matvec over up to three F16
    /// matrices of one width (checked by the callers: [`f16_fits`], shapes),
    /// each row's dot taken as `epi` says; with `norm` (weights of `cols`
    /// floats, checked by the caller: [`Device::norm_fits`]), over
    /// `rms_norm(x) * norm` (`matvec_f16_norm_stream`).
    fn matvec_f16(
        &self,
        mats: &[(&Matrix, u64)],
        x: &Buf,
        n: usize,
        epi: Epilogue,
        norm: Option<(&Buf, f32)>,
    ) -> Result<(), CudaError> {
        let cols = mats[0].0.cols;
        let (m, mut cfg) = self.mats_launch("matvec_f16", mats, n, epi)?;
        let (xp, c) = (self.ptr(&x.s), int("matvec", cols)?);
        match norm {
            None => self.launch(&self.fns.matvec_f16_stream, cfg, "matvec", &[&m, &xp, &c]),
            Some((w, eps)) => {
                cfg.shared_mem_bytes = 4 * cols as u32;
                let f = &self.fns.matvec_f16_norm_stream;
                self.launch(f, cfg, "matvec with the norm", &[&m, &xp, &c, &self.ptr(&w.s), &eps])
            }
        }
    }

    /// Whether `n` tokens take the streaming matvecs in one launch: the
    /// matvec path, and a token a `blockIdx.y`.
    fn stream_path(&self, n: usize) -> bool {
        self.matmul_path(n) == MatmulPath::Matvec && n <= 65535
    }

    /// Whether gate `wg` and up `wu` take `matvec_f16_glu_stream` (fusing
    /// on, two F16 matrices laid out alike, a streaming batch).
    fn f16_glu_fits(&self, wg: &Matrix, wu: &Matrix, n: usize) -> bool {
        let launch = cuda_ops::glu_launch(mat(wg), mat(wu));
        self.knobs.fuse && launch.as_deref() == Some("matvec_f16_glu_stream") && same_layout(wg, wu) && f16_fits(wg) && self.stream_path(n)
    }

    /// Whether the RMS norm with weights `w` fuses into a streaming F16
    /// matvec over `width`-wide rows (the norm's input in shared memory).
    fn norm_fits(&self, w: &Buf, width: usize) -> bool {
        self.knobs.norm_fuse && w.len == width && cuda_ops::norm_fuses(width)
    }

    /// `ys[i] = rms_norm(x) * norm . W_i^T` in one launch, the norm
    /// fused into the matvec (the streaming F16 kernel, decode batches);
    /// returns false, launching nothing, where that does not hold: the
    /// caller then norms and multiplies apart.
    pub fn norm_matmul_many(
        &self,
        x: &Buf,
        norm: &Buf,
        eps: f32,
        n: usize,
        outs: &mut [(&Matrix, &mut Buf)],
    ) -> Result<bool, CudaError> {
        let Some(first) = outs.first().map(|(w, _)| *w) else {
            return Ok(false);
        };
        let fits = outs.len() <= 3
            && self.stream_path(n)
            && outs.iter().all(|(w, _)| f16_fits(w) && w.cols == first.cols)
            && self.norm_fits(norm, first.cols);
        if !fits || n == 0 {
            return Ok(fits);
        }
        for (w, y) in outs.iter() {
            matmul_shape(w, x, y, n)?;
        }
        let mats: Vec<(&Matrix, u64)> = outs.iter().map(|(w, y)| (*w, self.ptr(&y.s))).collect();
        self.matvec_f16(&mats, x, n, Epilogue::Store, Some((norm, eps))).map(|()| true)
    }

    /// `y += x W^T` in one launch (the streaming matvecs add into their
    /// output: a projection into the residual stream); returns false,
    /// launching nothing, where `w` or `n` takes another path.
    pub fn matmul_acc(&self, w: &Matrix, x: &Buf, y: &mut Buf, n: usize) -> Result<bool, CudaError> {
        let fits = self.knobs.norm_fuse && self.stream_path(n) && cuda_ops::adds_into_residual(mat(w)) && (f16_fits(w) || mmvq_fits(w));
        if !fits || n == 0 {
            return Ok(fits);
        }
        matmul_shape(w, x, y, n)?;
        let mats = [(w, self.ptr(&y.s))];
        match f16_fits(w) {
            true => self.matvec_f16(&mats, x, n, Epilogue::Add, None)?,
            false => self.mmvq(&mats, x, n, Epilogue::Add)?,
        }
        Ok(true)
    }

    /// The grid of a streaming matvec launch over `rows` rows and `n`
    /// tokens (a warp a row, the warps striding over the rows): one wave
    /// of `stream_blocks` 256-thread blocks an SM shared by the tokens,
    /// fewer where the rows are fewer than its warps.
    fn stream_grid(&self, rows: usize, n: usize) -> LaunchConfig {
        let wave = (self.sms * self.knobs.stream_blocks / n.max(1)).max(1);
        LaunchConfig {
            grid_dim: (rows.div_ceil(8).min(wave) as u32, n as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// A layer's Q, K and V projections (`ws`, into `qkv`) of `x`, or of
    /// `rms_norm(x) * norm` with `norm`, in one streaming matvec launch
    /// whose epilogue applies RoPE to the queries and keys and stores the
    /// keys and values into layer `layer` of the cache at the tokens'
    /// (slot, position) (`rope_epilogue`); then the attention of the
    /// queries into `out`, as [`Device::rope_attention`]. Returns false,
    /// launching nothing, where that launch does not apply (NeoX pairs, a
    /// batch past the matvec path, matrices of different kinds or widths,
    /// a norm that does not fuse, `FERROX_CUDA_QKV_ROPE=0`): the caller
    /// runs the ops apart.
    #[allow(clippy::too_many_arguments)]
    pub fn qkv_rope_attention(
        &self,
        kv: &mut Kv,
        layer: usize,
        seq: IndexView<'_>,
        pos: IndexView<'_>,
        x: &Buf,
        norm: Option<(&Buf, f32)>,
        ws: [&Matrix; 3],
        qkv: [&mut Buf; 3],
        out: &mut Buf,
        a: &AttnShape,
        r: &RopeShape,
        factors: Option<&Buf>,
    ) -> Result<bool, CudaError> {
        let n = seq.len;
        let (hd, hdv, cols) = (a.params.head_dim, a.params.head_dim_v, ws[0].cols);
        let uniform = ws.iter().all(|w| f16_fits(w) && w.cols == cols)
            || (norm.is_none() && ws.iter().all(|w| mmvq_fits(w) && w.kind == ws[0].kind && w.cols == cols));
        let fits = self.knobs.qkv_rope
            && self.knobs.fuse
            && uniform
            // One launch, adjacent pairs, whole-head rotation
            // (`ferrox_ops::cuda::qkv_rope_epilogue`, what the plan reports).
            && cuda_ops::qkv_rope_epilogue([mat(ws[0]), mat(ws[1]), mat(ws[2])], r.halves(), r.params.n_rot, hd)
            && (r.n_heads, r.head_dim) == (a.params.n_head, hd)
            && n > 0
            && pos.len == n
            && self.stream_path(n)
            && [a.params.n_head * hd, a.params.n_head_kv * hd, a.params.n_head_kv * hdv] == [ws[0].rows, ws[1].rows, ws[2].rows]
            && kv.k_dims.get(layer) == Some(&ws[1].rows)
            && kv.v_dims.get(layer) == Some(&ws[2].rows)
            && norm.is_none_or(|(w, _)| self.norm_fits(w, cols));
        if !fits {
            return Ok(false);
        }
        rope_check(n, [(qkv[0].len, a.params.n_head), (qkv[1].len, a.params.n_head_kv)].into_iter(), r, factors)?;
        for (w, y) in ws.iter().zip(&qkv) {
            matmul_shape(w, x, y, n)?;
        }
        let mats: Vec<(&Matrix, u64)> = ws.iter().zip(&qkv).map(|(w, y)| (*w, self.ptr(&y.s))).collect();
        let epi = Epilogue::Rope(RopeEpi {
            seq: seq.ptr,
            pos: pos.ptr,
            factors: factors.map_or(0, |f| self.ptr(&f.s)),
            kc: self.ptr(&kv.k[layer]),
            vc: self.ptr(&kv.v[layer]),
            hd: int("qkv_rope", hd)?,
            n_rot: int("qkv_rope", r.params.n_rot)?,
            n_ctx: int("qkv_rope", kv.n_ctx)?,
            base: r.params.base,
            freq_scale: r.params.freq_scale,
            attn_factor: r.params.attn_factor,
        });
        match f16_fits(ws[0]) {
            true => self.matvec_f16(&mats, x, n, epi, norm)?,
            false => self.mmvq(&mats, x, n, epi)?,
        }
        let [q, k, v] = qkv;
        self.attend(kv, layer, seq, pos, q, k, v, out, a, KvStore::Done).map(|()| true)
    }

    /// The argument and grid of a streaming matvec launch over up to three
    /// matrices (`MmvqMats`) and `n` tokens.
    fn mats_launch(
        &self,
        op: &'static str,
        mats: &[(&Matrix, u64)],
        n: usize,
        epi: Epilogue,
    ) -> Result<(MmvqMats, LaunchConfig), CudaError> {
        if mats.len() > 3 || n > 65535 {
            return Err(shape(op, format!("{} matrices, {n} tokens in one launch", mats.len())));
        }
        let m = mmvq_mats(self, mats, epi)?;
        let rows: usize = mats.iter().map(|(w, _)| w.rows).sum();
        Ok((m, self.stream_grid(rows, n)))
    }

    /// One launch of the int8-activation kernel over up to three matrices of
    /// one kind and width (checked by the callers: [`mmvq_fits`], shapes).
    /// The activations are quantized once into the q8 scratch, unless the
    /// launch that wrote `x` (the fused norm, the GLU) already did.
    fn mmvq(&self, mats: &[(&Matrix, u64)], x: &Buf, n: usize, epi: Epilogue) -> Result<(), CudaError> {
        let w0 = mats[0].0;
        let f = self
            .kind_fns(w0.kind, "matvec")?
            .mmvq
            .as_ref()
            .ok_or(CudaError::NoKernel {
                op: "int8 matvec",
                kind: w0.kind,
            })?;
        let cols = w0.cols;
        let (m, cfg) = self.mats_launch("mmvq", mats, n, epi)?;
        let (qs, ds) = self.q8_input(x, n * cols, cols)?;
        self.launch_keep(f, cfg, "int8 matvec", &[&m, &qs, &ds, &int("mmvq", cols)?])
    }

    /// `h = act(x Wg^T) * (x Wu^T)` in one launch (`mmvq_glu_<kind>`),
    /// with `h`'s q8 copy for the down matvec written beside it: for decode
    /// batches (the int8 matvec path) over two matrices of one kind and
    /// shape whose rows come in whole 32s. Two F16 matrices of one shape
    /// take `matvec_f16_glu_stream` (any rows; `h` alone, no q8 copy). Returns
    /// false, launching nothing, where that does not hold (or fusing is
    /// off): the caller then runs the matvecs and the GLU apart.
    pub fn gate_up_glu(
        &self,
        act: Activation,
        x: &Buf,
        n: usize,
        wg: &Matrix,
        wu: &Matrix,
        h: &mut Buf,
    ) -> Result<bool, CudaError> {
        let same = same_layout(wg, wu);
        if self.f16_glu_fits(wg, wu, n) {
            return self.f16_glu(act, x, n, wg, wu, h, None).map(|()| true);
        }
        let f = match self.kind_fns(wg.kind, "matvec")?.mmvq_glu.as_ref() {
            Some(f) => f,
            None => return Ok(false),
        };
        if !self.knobs.fuse
            || !same
            || !mmvq_fits(wg)
            || cuda_ops::glu_launch(mat(wg), mat(wu)).is_none()
            || self.matmul_path(n) != MatmulPath::Matvec
            || !self.wants_q8(n, wg.rows)
        {
            return Ok(false);
        }
        let (rows, cols) = (wg.rows, wg.cols);
        glu_shape(x, h, n, rows, cols)?;
        let (qs, ds) = self.q8_input(x, n * cols, cols)?;
        let slot = self.q8_tag().map_or(0, |t| t.slot);
        let out_slot = 1 - slot;
        let (hq, hds) = self.q8_scratch_slot(n * rows, out_slot)?;
        let cnt = self.unit_counters(n * rows / 32)?;
        let a = act_code(act);
        // A row within a warp (8 to 32 lanes), about `units` units of
        // each matrix a lane.
        // (rows % 32 == 0, so the 256 / lpr rows of a block, 8 to 32,
        // tile them and every 32-row unit.)
        let units = self.knobs.mmvq_units.unwrap_or_else(|| glu_units(wg.kind));
        let lpr = lanes_per_row(cols / 32, units).min(32);
        let cfg = LaunchConfig {
            grid_dim: ((rows / (256 / lpr)) as u32, n as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let lpr = lpr as i32;
        self.launch(
            f,
            cfg,
            "gate/up matvec with the GLU",
            &[
                &self.ptr(&wg.data),
                &self.ptr(&wu.data),
                &(wg.row_bytes as i64),
                &int("gate_up_glu", rows)?,
                &qs,
                &ds,
                &int("gate_up_glu", cols)?,
                &a,
                &self.ptr(&h.s),
                &hq,
                &hds,
                &lpr,
                &cnt,
            ],
        )?;
        self.set_q8_tag(Some(Q8Tag {
            buf: h.id,
            elems: n * rows,
            width: rows,
            slot: out_slot,
        }));
        Ok(true)
    }

    /// [`Device::gate_up_glu`] for two F16 matrices of one shape (checked
    /// by the caller: [`f16_fits`], the matvec path): `matvec_f16_stream`'s
    /// warp a row, over both matrices' rows. Writes no q8 copy of `h`
    /// (a 32-row unit of it spans blocks); an int8 down matvec quantizes
    /// `h` itself, since this launch clears the tag.
    /// With `norm`, over `rms_norm(x) * norm` (`matvec_f16_glu_norm_stream`,
    /// checked by the caller: [`Device::norm_fits`]).
    #[allow(clippy::too_many_arguments)]
    fn f16_glu(
        &self,
        act: Activation,
        x: &Buf,
        n: usize,
        wg: &Matrix,
        wu: &Matrix,
        h: &mut Buf,
        norm: Option<(&Buf, f32)>,
    ) -> Result<(), CudaError> {
        let (rows, cols) = (wg.rows, wg.cols);
        glu_shape(x, h, n, rows, cols)?;
        let a = act_code(act);
        let (wgp, wup, rb) = (self.ptr(&wg.data), self.ptr(&wu.data), wg.row_bytes as i64);
        let (r, c, xp, hp) = (int("gate_up_glu", rows)?, int("gate_up_glu", cols)?, self.ptr(&x.s), self.ptr(&h.s));
        let mut cfg = self.stream_grid(rows, n);
        match norm {
            None => self.launch(
                &self.fns.matvec_f16_glu_stream,
                cfg,
                "F16 gate/up matvec with the GLU",
                &[&wgp, &wup, &rb, &r, &xp, &c, &a, &hp],
            ),
            Some((w, eps)) => {
                cfg.shared_mem_bytes = 4 * cols as u32;
                self.launch(
                    &self.fns.matvec_f16_glu_norm_stream,
                    cfg,
                    "F16 gate/up matvec with the norm and the GLU",
                    &[&wgp, &wup, &rb, &r, &xp, &c, &a, &hp, &self.ptr(&w.s), &eps],
                )
            }
        }
    }

    /// `h = act(y Wg^T) * (y Wu^T)` with `y = rms_norm(x) * norm`, in one
    /// launch (two F16 matrices of one shape, decode batches); returns
    /// false, launching nothing, where that does not hold: the caller then
    /// norms apart and takes [`Device::gate_up_glu`].
    #[allow(clippy::too_many_arguments)]
    pub fn norm_gate_up_glu(
        &self,
        act: Activation,
        x: &Buf,
        norm: &Buf,
        eps: f32,
        n: usize,
        wg: &Matrix,
        wu: &Matrix,
        h: &mut Buf,
    ) -> Result<bool, CudaError> {
        let fits = self.f16_glu_fits(wg, wu, n) && self.norm_fits(norm, wg.cols);
        if !fits || n == 0 {
            return Ok(fits);
        }
        self.f16_glu(act, x, n, wg, wu, h, Some((norm, eps))).map(|()| true)
    }

    /// The f16 copy of the first `elems` floats of `x` for the small-batch
    /// GEMM, converted now: its address.
    fn x_f16(&self, x: &Buf, elems: usize) -> Result<u64, CudaError> {
        let p = {
            let mut guard = self.scratch_guard("mma activations")?;
            let sc = &mut *guard;
            grow_retiring(&self.stream, &mut sc.mmq_x, &mut sc.retired, 2 * elems, "mma activations")?;
            sc.mmq_x.as_ref().map_or(0, |b| self.ptr(b))
        };
        let ne = elems as i64;
        self.launch(&self.fns.f32_to_f16, grid(elems, 256), "f32 to f16", &[&self.ptr(&x.s), &p, &ne])?;
        Ok(p)
    }

    /// `y = x W^T` on the small-batch tensor-core GEMM (`mmq_<kind>_n<t>`),
    /// `x16` the f16 activations ([`Device::x_f16`]; the caller checked the
    /// shapes and [`Device::mma_fits`]). Where a block of rows a multiprocessor
    /// is too few to fill the device, blocks split k, and `mmq_reduce` adds
    /// their partial sums in a fixed order.
    fn mma(&self, w: &Matrix, x16: u64, y: &mut Buf, n: usize) -> Result<(), CudaError> {
        let fns = self.kind_fns(w.kind, "mma")?;
        let piece = 8 * cuda_ops::MMA_TILES[cuda_ops::MMA_TILES.len() - 1];
        let warps = self.knobs.mmq_warps;
        let blocks = w.rows.div_ceil(16 * warps);
        let groups = (w.cols / 32).div_ceil(4);
        let want = (self.knobs.mmq_waves * self.sms).div_ceil(blocks).clamp(1, MMQ_MAX_SPLITS);
        let splits = want.min((groups / MMQ_MIN_GROUPS).max(1));
        let gps = groups.div_ceil(splits);
        let splits = groups.div_ceil(gps);
        self.set_q8_tag(None);
        let part = if splits > 1 {
            let mut guard = self.scratch_guard("mma partial sums")?;
            let sc = &mut *guard;
            let bytes = 4 * splits * n.min(piece) * w.rows;
            grow_retiring(&self.stream, &mut sc.mmq_part, &mut sc.retired, bytes, "mma partial sums")?;
            sc.mmq_part.as_ref().map_or(0, |b| self.ptr(b))
        } else {
            0
        };
        let cfg = LaunchConfig {
            grid_dim: (blocks as u32, splits as u32, 1),
            block_dim: (32 * warps as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // Pieces of up to `piece` tokens, each its own launch.
        for start in (0..n).step_by(piece) {
            let m = piece.min(n - start);
            let t = cuda_ops::mma_tile(m);
            let Some(f) = fns.mma.as_ref().zip(t).and_then(|(v, i)| v.get(i)) else {
                return Err(shape("mma", format!("no small-batch GEMM for {:?} at {m} tokens", w.kind)));
            };
            let xp = x16 + (2 * start * w.cols) as u64;
            let yp = self.ptr(&y.s) + (4 * start * w.rows) as u64;
            self.launch(
                f,
                cfg,
                "small-batch GEMM",
                &[
                    &self.ptr(&w.data),
                    &xp,
                    &yp,
                    &part,
                    &int("mma", w.rows)?,
                    &int("mma", w.cols)?,
                    &(w.row_bytes as i64),
                    &int("mma", m)?,
                    &int("mma", gps)?,
                ],
            )?;
            if splits > 1 {
                let count = m * w.rows;
                let (c, sp) = (count as i64, int("mma", splits)?);
                self.launch(&self.fns.mmq_reduce, grid(count, 256), "mma split sums", &[&part, &yp, &c, &sp])?;
            }
        }
        Ok(())
    }

    fn gemm(&self, w: &Matrix, x: &Buf, y: &mut Buf, n: usize) -> Result<(), CudaError> {
        let blas = self
            .blas
            .as_ref()
            .ok_or(CudaError::MissingLibrary { lib: "libcublas" })?;
        let f = &self.kind_fns(w.kind, "dequantize")?.dequant;
        let (m, k) = (int("gemm", w.rows)?, int("gemm", w.cols)?);
        let nn = int("gemm", n)?;
        let mut sc = self.scratch_guard("gemm")?;
        let grow = |slot: &mut Option<CudaSlice<u16>>, need: usize| -> Result<(), CudaError> {
            if slot.as_ref().is_none_or(|s| s.len() < need) {
                *slot = None;
                *slot = Some(
                    self.stream
                        .alloc_zeros(need)
                        .map_err(drv(format!("allocating {need} halves of GEMM scratch")))?,
                );
            }
            Ok(())
        };
        // F16 weights are already what the GEMM reads: no copy.
        let direct = w.kind == QuantKind::F16 && w.row_bytes == 2 * w.cols;
        if !direct {
            grow(&mut sc.w16, w.rows * w.cols)?;
        }
        grow(&mut sc.x16, n * w.cols)?;
        let (w16, x16) = match (&sc.w16, &sc.x16) {
            (_, Some(b)) if direct => (self.ptr(&w.data), self.ptr(b)),
            (Some(a), Some(b)) => (self.ptr(a), self.ptr(b)),
            _ => return Err(shape("gemm", "scratch not allocated".into())),
        };
        if !direct {
            let cfg = LaunchConfig {
                grid_dim: (w.rows as u32, 1, 1),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            self.launch(
                f,
                cfg,
                "dequantize to f16",
                &[&self.ptr(&w.data), &w16, &k, &(w.row_bytes as i64)],
            )?;
        }
        let nx = (n * w.cols) as i64;
        self.launch(
            &self.fns.f32_to_f16,
            grid(n * w.cols, 256),
            "f32 to f16",
            &[&self.ptr(&x.s), &x16, &nx],
        )?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let yp = self.ptr(&y.s);
        self.set_q8_tag(None);
        // SAFETY: A is the rows x cols f16 copy of W (row-major, so column-
        // major cols x rows, transposed), B the n x cols f16 activations
        // (column-major cols x n), C the n x rows f32 output (column-major
        // rows x n); all three were sized above for these dimensions, and
        // the handle is bound to this device's stream.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                m,
                nn,
                k,
                (&alpha as *const f32).cast(),
                w16 as *const std::ffi::c_void,
                blas_sys::cudaDataType::CUDA_R_16F,
                k,
                x16 as *const std::ffi::c_void,
                blas_sys::cudaDataType::CUDA_R_16F,
                k,
                (&beta as *const f32).cast(),
                yp as *mut std::ffi::c_void,
                blas_sys::cudaDataType::CUDA_R_32F,
                m,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|source| CudaError::Blas {
            what: "GemmEx",
            source,
        })
    }

    // ---- element-wise and row operations

    /// `y[t] += b` for each of `n` rows.
    pub fn add_bias(&self, y: &mut Buf, b: &Buf, n: usize) -> Result<(), CudaError> {
        if b.len == 0 || y.len != n * b.len {
            return Err(shape(
                "add_bias",
                format!("{n} rows of {} in {} floats", b.len, y.len),
            ));
        }
        let total = y.len as i64;
        self.launch(
            &self.fns.add_bias,
            grid(y.len, 256),
            "add_bias",
            &[
                &self.ptr(&y.s),
                &self.ptr(&b.s),
                &total,
                &int("add_bias", b.len)?,
            ],
        )
    }

    /// RMS norm of each `w.len()`-wide row of `x`, times `w`, in place.
    pub fn rms_norm(&self, x: &mut Buf, w: &Buf, eps: f32) -> Result<(), CudaError> {
        if w.len == 0 || !x.len.is_multiple_of(w.len) {
            return Err(shape(
                "rms_norm",
                format!("rows of {} in {} floats", w.len, x.len),
            ));
        }
        let rows = x.len / w.len;
        if rows == 0 {
            return Ok(());
        }
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(
            &self.fns.rms_norm,
            cfg,
            "rms_norm",
            &[
                &self.ptr(&x.s),
                &self.ptr(&w.s),
                &int("rms_norm", w.len)?,
                &eps,
            ],
        )
    }

    /// `x += b` when `b` is given, then `out = rms_norm(x) * w`, in one
    /// launch (the residual add and the next block's norm).
    pub fn add_rms_norm(
        &self,
        x: &mut Buf,
        b: Option<&Buf>,
        w: &Buf,
        eps: f32,
        out: &mut Buf,
    ) -> Result<(), CudaError> {
        if w.len == 0
            || !x.len.is_multiple_of(w.len)
            || out.len != x.len
            || b.is_some_and(|b| b.len != x.len)
        {
            return Err(shape(
                "add_rms_norm",
                format!(
                    "rows of {} in {} floats, addend {:?}, output {}",
                    w.len,
                    x.len,
                    b.map(|b| b.len),
                    out.len
                ),
            ));
        }
        let rows = x.len / w.len;
        if rows == 0 {
            return Ok(());
        }
        // Up to 8 values a thread stay in registers: 1024 threads for rows
        // up to 8192 wide, in one pass over memory.
        // Two values a thread where the row allows (the q8 quantization after
        // the norm runs a warp reduction per value a thread holds).
        let threads = (w.len.div_ceil(2).next_power_of_two()).clamp(128, 1024) as u32;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        };
        let bp = b.map_or(0u64, |b| self.ptr(&b.s));
        // The normed rows feed a decode matvec next: quantize them here too.
        let q8 = self.wants_q8(rows, w.len);
        let (qs, ds) = if q8 { self.q8_scratch(out.len)? } else { (0, 0) };
        if !self.knobs.skip.norm {
            self.launch(
                &self.fns.add_rms_norm,
                cfg,
                "add_rms_norm",
                &[
                    &self.ptr(&x.s),
                    &bp,
                    &self.ptr(&w.s),
                    &self.ptr(&out.s),
                    &int("add_rms_norm", w.len)?,
                    &eps,
                    &qs,
                    &ds,
                ],
            )?;
        }
        if q8 {
            self.set_q8_tag(Some(Q8Tag {
                buf: out.id,
                elems: out.len,
                width: w.len,
                slot: 0,
            }));
        }
        Ok(())
    }

    /// The index of the largest value of each `width`-wide row of `x` (ties:
    /// the lowest index), computed on the device; only the ids come back.
    pub fn argmax_rows(&self, x: &Buf, width: usize, out: &mut [u32]) -> Result<(), CudaError> {
        if width == 0 || x.len != width * out.len() {
            return Err(shape(
                "argmax_rows",
                format!("{} rows of {width} in {} floats", out.len(), x.len),
            ));
        }
        if out.is_empty() {
            return Ok(());
        }
        let rows = out.len();
        // A launch takes at most ARGMAX_ROWS rows (the grid's y limit).
        let per = rows.min(ARGMAX_ROWS);
        let slices = width.div_ceil(ARGMAX_SPAN);
        let mut guard = self.scratch_guard("argmax_rows")?;
        let sc = &mut *guard;
        if sc.ids.as_ref().is_none_or(|s| s.len() < rows) {
            sc.ids = None;
            sc.ids = Some(self.stream.alloc_zeros(rows).map_err(drv("allocating argmax ids"))?);
        }
        grow_retiring(&self.stream, &mut sc.amax_keys, &mut sc.retired, 8 * slices * per, "argmax keys")?;
        grow_retiring(&self.stream, &mut sc.amax_cnt, &mut sc.retired, 4 * per, "argmax counters")?;
        let (Some(ids), Some(keys), Some(cnt)) = (&sc.ids, &sc.amax_keys, &sc.amax_cnt) else {
            return Err(shape("argmax_rows", "scratch not allocated".into()));
        };
        let (x0, ids0, keys, cnt) = (self.ptr(&x.s), self.ptr(ids), self.ptr(keys), self.ptr(cnt));
        let w = int("argmax_rows", width)?;
        for r0 in (0..rows).step_by(ARGMAX_ROWS) {
            let n = per.min(rows - r0);
            let cfg = LaunchConfig {
                grid_dim: (slices as u32, n as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let (xr, idr) = (x0 + 4 * (r0 * width) as u64, ids0 + 4 * r0 as u64);
            self.launch(&self.fns.argmax_rows, cfg, "argmax_rows", &[&xr, &w, &idr, &keys, &cnt])?;
        }
        self.read_pinned(&mut sc.host, ids0, out)
    }

    /// What a top-k sampler needs of each `width`-wide row of `x` (logits),
    /// read back in one copy into `out` (`rows * (2 k + 4)` words): the
    /// ids of each row's best `k` finite canonical logits (NaN as -inf,
    /// +inf as `f32::MAX`, -0 as +0; by logit, then lower id; any order)
    /// as `rows x k`, their values' bits as `rows x k`, then per row four
    /// words: how many it kept (`k`, or fewer finite), its largest
    /// canonical logit and its log-sum-exp as bits, and 0.
    pub fn top_k_rows(&self, x: &Buf, width: usize, k: usize, out: &mut [u32]) -> Result<(), CudaError> {
        let per_row = 2 * k + 4;
        // (the kernel counts a row's finite logits in floats: exact below 2^24)
        if width == 0 || width >= 1 << 24 || k == 0 || !out.len().is_multiple_of(per_row) || x.len != width * (out.len() / per_row) {
            return Err(shape(
                "top_k_rows",
                format!("{} words of top-{k} rows of {width} from {} floats", out.len(), x.len),
            ));
        }
        let rows = out.len() / per_row;
        if rows == 0 {
            return Ok(());
        }
        let mut guard = self.scratch_guard("top_k_rows")?;
        let sc = &mut *guard;
        grow_retiring(&self.stream, &mut sc.topk, &mut sc.retired, 4 * out.len(), "top-k rows")?;
        let Some(buf) = &sc.topk else {
            return Err(shape("top_k_rows", "scratch not allocated".into()));
        };
        let b0 = self.ptr(buf);
        let (ids, vals, stats) = (b0, b0 + 4 * (rows * k) as u64, b0 + 8 * (rows * k) as u64);
        let cfg = LaunchConfig { grid_dim: (int("top_k_rows", rows)? as u32, 1, 1), block_dim: (TOPK_THREADS, 1, 1), shared_mem_bytes: 0 };
        let (x0, w, kk) = (self.ptr(&x.s), int("top_k_rows", width)?, int("top_k_rows", k)?);
        self.launch(&self.fns.top_k_rows, cfg, "top_k_rows", &[&x0, &w, &kk, &ids, &vals, &stats])?;
        self.read_pinned(&mut sc.host, b0, out)
    }

    /// Rows `rows` of `x` (rows of `width` floats), in that order, into
    /// `out` (`rows.len() * width`): a copy a row into the page-locked
    /// buffer, one wait (the rows of a step's sequences that need them
    /// whole, beside the others' top-k selections).
    pub fn read_rows(&self, x: &Buf, width: usize, rows: &[usize], out: &mut [f32]) -> Result<(), CudaError> {
        let fits = |r: usize| r.checked_add(1).and_then(|e| e.checked_mul(width)).is_some_and(|e| e <= x.len);
        if Some(out.len()) != rows.len().checked_mul(width) || !rows.iter().all(|&r| fits(r)) {
            return Err(shape("read_rows", format!("{} rows of {width} into {} floats from {}", rows.len(), out.len(), x.len)));
        }
        if out.is_empty() {
            return Ok(());
        }
        let mut guard = self.scratch_guard("read_rows")?;
        let sc = &mut *guard;
        let host = Pinned::at_least(&mut sc.host, &self.ctx, 4 * out.len())?;
        let x0 = self.ptr(&x.s);
        for (j, &r) in rows.iter().enumerate() {
            host.copy_from::<f32>(4 * j * width, x0 + 4 * (r * width) as u64, width, &self.stream)?;
        }
        self.synchronize()?;
        out.copy_from_slice(host.values(0, out.len()));
        Ok(())
    }

    /// RoPE on `x` (`[pos.len(), n_heads * head_dim]`) in place.
    pub fn rope(
        &self,
        x: &mut Buf,
        pos: IndexView<'_>,
        r: &RopeShape,
        factors: Option<&Buf>,
    ) -> Result<(), CudaError> {
        self.rope2(x, None, pos, r, factors)
    }

    /// RoPE on queries `q` (`r.n_heads` heads) and keys `k` (`n_heads_k`
    /// heads) at the same positions, in one launch.
    pub fn rope_qk(
        &self,
        q: &mut Buf,
        k: &mut Buf,
        n_heads_k: usize,
        pos: IndexView<'_>,
        r: &RopeShape,
        factors: Option<&Buf>,
    ) -> Result<(), CudaError> {
        self.rope2(q, Some((k, n_heads_k)), pos, r, factors)
    }

    fn rope2(
        &self,
        x: &mut Buf,
        second: Option<(&mut Buf, usize)>,
        pos: IndexView<'_>,
        r: &RopeShape,
        factors: Option<&Buf>,
    ) -> Result<(), CudaError> {
        let n_tok = pos.len;
        rope_check(
            n_tok,
            [(x.len, r.n_heads)]
                .into_iter()
                .chain(second.as_ref().map(|(b, h)| (b.len, *h))),
            r,
            factors,
        )?;
        let heads2 = second.as_ref().map_or(0, |(_, h)| *h);
        let total = n_tok * r.n_heads.max(heads2) * (r.params.n_rot / 2);
        if total == 0 {
            return Ok(());
        }
        let fp = factors.map_or(0u64, |f| self.ptr(&f.s));
        let x2 = second.as_ref().map_or(0u64, |(b, _)| self.ptr(&b.s));
        let mut cfg = grid(total, 256);
        cfg.grid_dim.1 = if second.is_some() { 2 } else { 1 };
        self.launch(
            &self.fns.rope,
            cfg,
            "rope",
            &[
                &self.ptr(&x.s),
                &pos.ptr,
                &int("rope", n_tok)?,
                &int("rope", r.n_heads)?,
                &int("rope", r.head_dim)?,
                &int("rope", r.params.n_rot)?,
                &i32::from(r.halves()),
                &r.params.base,
                &r.params.freq_scale,
                &r.params.attn_factor,
                &fp,
                &x2,
                &int("rope", heads2)?,
            ],
        )
    }

    /// Stores `k`/`v` of the `seq.len()` tokens at their (slot, position) of
    /// layer `layer`, then writes causal attention of `q` into `out`. Each
    /// slot and position is checked by the caller to be inside the cache.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        kv: &mut Kv,
        layer: usize,
        seq: IndexView<'_>,
        pos: IndexView<'_>,
        q: &Buf,
        k: &Buf,
        v: &Buf,
        out: &mut Buf,
        a: &AttnShape,
    ) -> Result<(), CudaError> {
        self.attend(kv, layer, seq, pos, q, k, v, out, a, KvStore::Plain)
    }

    /// RoPE on `q` and `k` (as [`Device::rope_qk`], `r.n_heads` query heads,
    /// `a.params.n_head_kv` key heads), then [`Device::attention`]: the rotation
    /// and the cache store are one launch (`rope_kv`), so a layer's
    /// attention is two launches, not three.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_attention(
        &self,
        kv: &mut Kv,
        layer: usize,
        seq: IndexView<'_>,
        pos: IndexView<'_>,
        q: &mut Buf,
        k: &mut Buf,
        v: &Buf,
        out: &mut Buf,
        a: &AttnShape,
        r: &RopeShape,
        factors: Option<&Buf>,
    ) -> Result<(), CudaError> {
        rope_check(
            pos.len,
            [(q.len, r.n_heads), (k.len, a.params.n_head_kv)].into_iter(),
            r,
            factors,
        )?;
        if r.n_heads != a.params.n_head || r.head_dim != a.params.head_dim || !r.head_dim.is_multiple_of(2) {
            return Err(shape(
                "rope_attention",
                format!(
                    "RoPE over {}x{} but attention over {}x{}",
                    r.n_heads, r.head_dim, a.params.n_head, a.params.head_dim
                ),
            ));
        }
        self.attend(kv, layer, seq, pos, q, k, v, out, a, KvStore::Rope(r, factors))
    }

    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        kv: &mut Kv,
        layer: usize,
        seq: IndexView<'_>,
        pos: IndexView<'_>,
        q: &Buf,
        k: &Buf,
        v: &Buf,
        out: &mut Buf,
        a: &AttnShape,
        store: KvStore<'_>,
    ) -> Result<(), CudaError> {
        let n = seq.len;
        let (hd, hdv) = (a.params.head_dim, a.params.head_dim_v);
        let (kd, vd) = (a.params.n_head_kv * hd, a.params.n_head_kv * hdv);
        if a.params.n_head_kv == 0 || !a.params.n_head.is_multiple_of(a.params.n_head_kv) {
            return Err(shape(
                "attention",
                format!("{} heads cannot share {} KV heads", a.params.n_head, a.params.n_head_kv),
            ));
        }
        if hd > 256 || hdv > 256 || hd == 0 || hdv == 0 {
            return Err(shape(
                "attention",
                format!("head sizes {hd}/{hdv} (the kernel takes 1..=256)"),
            ));
        }
        if kv.k_dims.get(layer) != Some(&kd) || kv.v_dims.get(layer) != Some(&vd) {
            return Err(shape(
                "attention",
                format!("layer {layer}: KV cache not shaped for {kd}/{vd}"),
            ));
        }
        if q.len != n * a.params.n_head * hd
            || k.len != n * kd
            || v.len != n * vd
            || out.len != n * a.params.n_head * hdv
        {
            return Err(shape(
                "attention",
                format!(
                    "q/k/v/out of {}/{}/{}/{} floats for {n} tokens",
                    q.len, k.len, v.len, out.len
                ),
            ));
        }
        if pos.len != n {
            return Err(shape(
                "attention",
                format!("{n} slots but {} positions", pos.len),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        let n_ctx = int("attention", kv.n_ctx)?;
        let (sp, pp) = (seq.ptr, pos.ptr);
        if n > 65535 {
            return Err(shape("kv_store", format!("{n} tokens in one launch")));
        }
        if let KvStore::Rope(r, factors) = store {
            let most = (n * a.params.n_head * (r.params.n_rot / 2))
                .max(n * a.params.n_head_kv * (hd / 2))
                .max(n * vd);
            let mut cfg = grid(most, 256);
            cfg.grid_dim.1 = 3;
            if !self.knobs.skip.rope {
                self.launch(
                    &self.fns.rope_kv,
                    cfg,
                    "rope_kv",
                    &[
                        &self.ptr(&q.s),
                        &self.ptr(&k.s),
                        &self.ptr(&v.s),
                        &sp,
                        &pp,
                        &int("rope_kv", n)?,
                        &int("rope_kv", a.params.n_head)?,
                        &int("rope_kv", a.params.n_head_kv)?,
                        &int("rope_kv", hd)?,
                        &int("rope_kv", r.params.n_rot)?,
                        &i32::from(r.halves()),
                        &r.params.base,
                        &r.params.freq_scale,
                        &r.params.attn_factor,
                        &factors.map_or(0u64, |f| self.ptr(&f.s)),
                        &self.ptr(&kv.k[layer]),
                        &self.ptr(&kv.v[layer]),
                        &int("rope_kv", vd)?,
                        &n_ctx,
                    ],
                )?;
            }
        } else if let KvStore::Plain = store {
            let cfg = LaunchConfig {
                grid_dim: (kd.max(vd).div_ceil(128) as u32, n as u32, 2),
                block_dim: (128, 1, 1),
                shared_mem_bytes: 0,
            };
            self.launch(
                &self.fns.kv_store,
                cfg,
                "kv_store",
                &[
                    &self.ptr(&k.s),
                    &self.ptr(&kv.k[layer]),
                    &int("kv_store", kd)?,
                    &self.ptr(&v.s),
                    &self.ptr(&kv.v[layer]),
                    &int("kv_store", vd)?,
                    &sp,
                    &pp,
                    &n_ctx,
                ],
            )?;
        }
        // The grouped kernel (a block per token and KV head) where its
        // limits allow; the per-head one otherwise.
        let g = a.params.n_head / a.params.n_head_kv;
        // (`gqa_min`: a knob for measuring the two at small batches.)
        let gqa = n >= self.knobs.gqa_min
            && hd.is_multiple_of(8)
            && g <= 8
            && g * hd <= 2048
            && g * hdv <= 2048;
        // The grouped kernel's fast value path (`GA_FAST` in kernels.cu).
        let fast = |heads: usize| heads * hdv <= GA_FAST && hdv.is_multiple_of(32) && hdv <= 128;
        let ga_fast = fast(g);
        // Decode batches: the staged kernel (`attention_dec`), with the
        // largest chunk of keys (128, 64 or 32) its shared memory allows.
        // Query heads a decode block takes: the group, or a divisor of it.
        // A block's heads share its value registers and partial sums
        // (heads x head_dim_v <= `GA_FAST`): a group past that (8
        // heads of 128, Qwen3-30B-A3B's) is taken by blocks of the largest
        // divisor of it that fits, a multiple of `step`.
        let fits = |h: usize, step: usize| {
            (step..=h).rev().find(|&d| g.is_multiple_of(d) && d.is_multiple_of(step) && fast(d))
        };
        let gs = match self.knobs.dec_heads {
            h if h > 0 && h < g && g.is_multiple_of(h) => h,
            _ => g,
        };
        let gs = fits(gs, 1).unwrap_or(gs);
        // Query heads a block of a split token takes (a multiple of gs).
        let gss = match self.knobs.dec_split_heads {
            h if h >= gs && h < g && g.is_multiple_of(h) && h.is_multiple_of(gs) => h,
            _ => g,
        };
        let gss = fits(gss, gs).unwrap_or(gss);
        let dec_fast = fast(gs) && fast(gss);
        let dec_chunk = if gqa && dec_fast && n <= self.knobs.dec_max {
            [128usize, 64, 32]
                .into_iter()
                .filter(|&c| c <= self.knobs.dec_chunk.max(32))
                .find(|&c| dec_smem_bytes(c, gss, hd, hdv) <= self.dec_smem)
        } else {
            None
        };
        // Runs a decode token's keys may be split into (the kernel picks
        // per token from its position, so a graph serves every position).
        let span = self.knobs.dec_span.max(dec_chunk.unwrap_or(1));
        let nsplit = if dec_chunk.is_some() {
            self.knobs.dec_split.min(DEC_MAXSPLIT).min(kv.n_ctx / span).max(1)
        } else {
            1
        };
        // Prefill batches of one slot: the tensor-core kernel.
        let mma = dec_chunk.is_none()
            && self.knobs.mma_attn
            && a.one_slot
            && n > self.knobs.dec_max.max(16)
            && hd.is_multiple_of(16)
            && hd <= 128
            && hdv.is_multiple_of(8)
            && hdv <= 128;
        let (f, blocks, threads, smem) = if mma {
            (&self.fns.attention_mma, n.div_ceil(64), 128, (64 * (hd + 8) + hdv * (64 + 8)) * 2)
        } else if let Some(c) = dec_chunk {
            // (a token's blocks: its runs of gss heads, or its gs-head blocks)
            let per_token = (a.params.n_head / gss * nsplit).max(a.params.n_head / gs);
            (&self.fns.attention_dec, n * per_token, 256, dec_smem_bytes(c, gss, hd, hdv))
        } else if gqa {
            (
                &self.fns.attention_gqa,
                n * a.params.n_head_kv,
                256,
                // Queries, a chunk's scores, and (the fast value path,
                // `GA_FAST` in kernels.cu) 8 warps' partial sums.
                (g * hd + g * 256 + if ga_fast { 8 * g * hdv } else { 0 }) * 4,
            )
        } else {
            (&self.fns.attention, n * a.params.n_head, 128, 0)
        };
        // The grouped kernel's fast value path also quantizes its output
        // into the q8 scratch for the output projection (decode).
        let q8 = !mma && gqa && (ga_fast || dec_chunk.is_some()) && self.wants_q8(n, a.params.n_head * hdv);
        let (qs, ds) = if q8 { self.q8_scratch(n * a.params.n_head * hdv)? } else { (0, 0) };
        let cfg = LaunchConfig {
            // (the tensor-core kernel: a block per 64 queries and head)
            grid_dim: (int("attention", blocks)? as u32, if mma { a.params.n_head as u32 } else { 1 }, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        let (qp, kp, vp, op) = (
            self.ptr(&q.s),
            self.ptr(&kv.k[layer]),
            self.ptr(&kv.v[layer]),
            self.ptr(&out.s),
        );
        let (nh, nkv) = (int("attention", a.params.n_head)?, int("attention", a.params.n_head_kv)?);
        let (hd_, hdv_) = (int("attention", hd)?, int("attention", hdv)?);
        let softcap = a.params.softcap.unwrap_or(0.0);
        let window = a.params.window.map_or(0, |w| w.min(i32::MAX as u32)) as i32;
        if self.knobs.skip.attn {
            // (measuring only: see `Skip`)
        } else if mma {
            let nt = int("attention", n)?;
            self.launch(
                f,
                cfg,
                "attention",
                &[
                    &qp, &kp, &vp, &op, &sp, &pp, &nt, &nh, &nkv, &hd_, &hdv_, &n_ctx, &a.params.scale,
                    &softcap, &window,
                ],
            )?;
        } else if let Some(c) = dec_chunk {
            let (runs, cnt) = if nsplit > 1 {
                self.split_scratch(n * a.params.n_head * nsplit * (hdv + 2), n * a.params.n_head / gss)?
            } else {
                (0, 0)
            };
            let (c, gs, gss, ns, span) = (c as i32, gs as i32, gss as i32, nsplit as i32, int("attention", span)?);
            self.launch(
                f,
                cfg,
                "attention",
                &[
                    &qp, &kp, &vp, &op, &sp, &pp, &nh, &nkv, &hd_, &hdv_, &n_ctx, &a.params.scale,
                    &softcap, &window, &c, &qs, &ds, &gs, &ns, &span, &runs, &cnt, &gss,
                ],
            )?;
        } else {
            self.launch(
                f,
                cfg,
                "attention",
                &[
                    &qp, &kp, &vp, &op, &sp, &pp, &nh, &nkv, &hd_, &hdv_, &n_ctx, &a.params.scale,
                    &softcap, &window, &qs, &ds,
                ],
            )?;
        }
        if q8 {
            self.set_q8_tag(Some(Q8Tag {
                buf: out.id,
                elems: n * a.params.n_head * hdv,
                width: a.params.n_head * hdv,
                slot: 0,
            }));
        }
        Ok(())
    }

    /// A mixture of experts over the `m.n` normed rows `x` (`[n, n_embd]`):
    /// the router's logits (`[n, n_expert]`, into `b.gate`; on the f32
    /// matvec at every batch size, since f16 GEMM rounding would move
    /// routing's near ties), routed on the device into `b.route` (per token
    /// the chosen experts' ids, then their weights), each routed expert's gate and up rows
    /// (`b.gate`, `b.up`: `[n * n_used, ff]`), the GLU (`b.h`), its down rows
    /// (back into `b.gate`: `[n * n_used, n_embd]`), and their weighted sum
    /// into `out` (`[n, n_embd]`). No host round trip: a decode step with
    /// experts stays one recorded graph.
    pub fn moe(&self, m: &MoeShape, w: [&Matrix; 4], x: &Buf, b: MoeBufs<'_>, out: &mut Buf) -> Result<(), CudaError> {
        let [router, gate, up, down] = w;
        let (n, e, ff, ne, k) = (m.n, m.n_embd, m.ff, m.n_expert, m.n_used);
        if ne == 0 || ne > MOE_MAX_EXPERTS || k == 0 || k > ne || k > 32 {
            return Err(shape("moe", format!("{k} of {ne} experts a token (the kernels take 1 to 32 of at most {MOE_MAX_EXPERTS})")));
        }
        for (mat, rows, cols) in [(router, 1, e), (gate, ff, e), (up, ff, e), (down, e, ff)] {
            if mat.rows != ne * rows || mat.cols != cols {
                return Err(shape("moe", format!("an expert stack of {}x{} where {ne} experts of {rows}x{cols} are expected", mat.rows, mat.cols)));
            }
        }
        let pairs = n * k;
        let need = [
            ("input", x.len, n * e),
            ("route", b.route.len, 2 * pairs),
            ("gate", b.gate.len, (n * ne).max(pairs * ff.max(e))),
            ("up", b.up.len, pairs * ff),
            ("hidden", b.h.len, pairs * ff),
            ("output", out.len, n * e),
        ];
        if let Some((what, have, want)) = need.iter().find(|(_, have, want)| have < want) {
            return Err(shape("moe", format!("{what} buffer of {have} floats where {want} are needed")));
        }
        if n == 0 {
            return Ok(());
        }
        if pairs > 65535 {
            return Err(shape("moe", format!("{n} tokens of {k} experts in one launch")));
        }
        let (ki, ni) = (int("moe", k)?, int("moe", n)?);
        let grouped = self.moe_grouped(m, [gate, up, down]);
        let int8_glu = !grouped && self.experts_int8(gate).is_some() && same_layout(gate, up);
        // The experts' q8 input before the router's matvec and the routing,
        // which leave the q8 scratch alone: the norm before this block has
        // usually written it already (the tag), so nothing launches for it.
        let qx = if int8_glu {
            let (qs, ds) = self.q8_input(x, n * e, e)?;
            Some((qs, ds, self.q8_tag().map_or(0, |t| t.slot)))
        } else {
            None
        };
        self.matmul_with(MatmulPath::Matvec, router, x, b.gate, n)?;
        let route = self.ptr(&b.route.s);
        self.launch(
            &self.fns.moe_route,
            LaunchConfig { grid_dim: (ni as u32, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 },
            "moe_route",
            &[&self.ptr(&b.gate.s), &route, &int("moe", ne)?, &ki, &i32::from(m.norm_weights), &m.scale],
        )?;
        let (g, u, h) = (self.ptr(&b.gate.s), self.ptr(&b.up.s), self.ptr(&b.h.s));
        let (len, ffi) = ((pairs * ff) as i64, int("moe", ff)?);
        let glu = || {
            let args: [&dyn Arg; 9] = [&g, &u, &h, &len, &ffi, &ffi, &act_code(m.act), &0u64, &0u64];
            self.launch(&self.fns.glu, grid(pairs * ff, 256), "glu", &args)
        };
        if grouped {
            // Prefill and large batches: the pairs sorted by expert, each
            // expert's rows read once a tile of its pairs (tensor cores).
            let tile = self.moe_tile(m);
            let sort = self.moe_sort(route, m, tile)?;
            let x16 = self.x_f16(x, n * e)?;
            self.mmq_id(gate, x16, g, &sort, m, false)?;
            self.mmq_id(up, x16, u, &sort, m, false)?;
            glu()?;
            // (the f16 scratch again: the gate and up launches have read x16)
            let h16 = self.x_f16(b.h, pairs * ff)?;
            self.mmq_id(down, h16, g, &sort, m, true)?;
            return self.moe_sum(g, route, out, m);
        }
        let int8_down = self.experts_int8(down).is_some();
        match qx {
            // Gate, up and the GLU in one launch, which also writes the
            // hidden rows' q8 copy where the down stack reads one.
            Some((qs, ds, slot)) => {
                let q8 = (int8_down && ff.is_multiple_of(32)).then_some(1 - slot);
                self.mmvq_id(gate, Some(up), qs, ds, h, route, m, MmvqIdOut::Pairs(q8))?;
                if let Some(slot) = q8 {
                    self.set_q8_tag(Some(Q8Tag { buf: b.h.id, elems: pairs * ff, width: ff, slot }));
                }
            }
            None => {
                self.matvec_id(gate, self.ptr(&x.s), g, route, m, false)?;
                self.matvec_id(up, self.ptr(&x.s), u, route, m, false)?;
                glu()?;
            }
        }
        if int8_down {
            // The down stack and the weighted sum in one launch.
            let (qs, ds) = self.q8_input(b.h, pairs * ff, ff)?;
            self.mmvq_id(down, None, qs, ds, self.ptr(&out.s), route, m, MmvqIdOut::Summed)
        } else {
            self.matvec_id(down, h, g, route, m, true)?;
            self.moe_sum(g, route, out, m)
        }
    }

    /// `moe_sum`: each token's routed experts' rows of `d` (a pair's
    /// `n_embd` floats each) by their routing weights into `out`.
    fn moe_sum(&self, d: u64, route: u64, out: &mut Buf, m: &MoeShape) -> Result<(), CudaError> {
        let total = (m.n * m.n_embd) as i64;
        let args: [&dyn Arg; 6] = [&d, &route, &self.ptr(&out.s), &int("moe", m.n_used)?, &int("moe", m.n_embd)?, &total];
        self.launch(&self.fns.moe_sum, grid(m.n * m.n_embd, 256), "moe_sum", &args)
    }

    /// Whether a mixture of experts' batch takes the grouped GEMM: some
    /// experts see at least [`MOE_GROUPED_PAIRS`] pairs on average (below
    /// it the per-pair matvecs read little more), the small-batch GEMM is
    /// on (sm_80 and later) and every stack's kind and width has it.
    fn moe_grouped(&self, m: &MoeShape, mats: [&Matrix; 3]) -> bool {
        m.n >= 2
            && m.n * m.n_used >= MOE_GROUPED_PAIRS * m.n_expert
            && self.small_batch_gemm()
            && mats.iter().all(|w| cuda_ops::mma_fits(w.kind, w.cols, 1) && self.experts_int8(w).is_some())
    }

    /// The grouped GEMM's tile, as its index into `cuda_ops::MMA_TILES`:
    /// the smallest (in pairs, 8 a step) that holds an expert's average
    /// share of the batch, else the largest.
    fn moe_tile(&self, m: &MoeShape) -> usize {
        let avg = (m.n * m.n_used).div_ceil(m.n_expert);
        cuda_ops::mma_tile(avg).unwrap_or(cuda_ops::MMA_TILES.len() - 1)
    }

    /// A kind's routed-experts int8 kernels, where it has them.
    fn experts_int8(&self, w: &Matrix) -> Option<&(CudaFunction, Vec<CudaFunction>)> {
        if !w.cols.is_multiple_of(32) {
            return None;
        }
        self.fns.kinds.get(&w.kind).and_then(|k| k.experts_int8.as_ref())
    }

    /// `moe_sort` over the route table: the pairs grouped by expert in
    /// tiles of up to `8 * MMA_TILES[tile]` pairs, in the device's scratch.
    fn moe_sort(&self, route: u64, m: &MoeShape, tile: usize) -> Result<MoeSort, CudaError> {
        let pairs = m.n * m.n_used;
        let per = 8 * cuda_ops::MMA_TILES[tile];
        let max_tiles = pairs.div_ceil(per) + m.n_expert;
        let (tiles_at, order_at, count_at) = (0, 16 * max_tiles, 16 * max_tiles + 4 * pairs);
        let base = {
            let mut guard = self.scratch_guard("experts sort")?;
            let sc = &mut *guard;
            grow_retiring(&self.stream, &mut sc.moe_sort, &mut sc.retired, count_at + 16, "experts sort")?;
            sc.moe_sort.as_ref().map_or(0, |b| self.ptr(b))
        };
        let sort = MoeSort {
            tile,
            max_tiles,
            tiles: base + tiles_at as u64,
            order: base + order_at as u64,
            count: base + count_at as u64,
        };
        let cfg = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1024, 1, 1), shared_mem_bytes: 0 };
        let args: [&dyn Arg; 8] = [
            &route,
            &int("moe", pairs)?,
            &int("moe", m.n_used)?,
            &int("moe", m.n_expert)?,
            &int("moe", per)?,
            &sort.order,
            &sort.tiles,
            &sort.count,
        ];
        self.launch(&self.fns.moe_sort, cfg, "moe_sort", &args)?;
        Ok(sort)
    }

    /// The grouped GEMM (`mmq_id_<kind>_n<t>`) of one expert stack over
    /// the sorted pairs: `x16` the f16 activations (a token's row, or a
    /// pair's with `per_pair`), the sums into row `p` of `y` for pair `p`.
    fn mmq_id(&self, w: &Matrix, x16: u64, y: u64, sort: &MoeSort, m: &MoeShape, per_pair: bool) -> Result<(), CudaError> {
        let fns = self.experts_int8(w).ok_or(CudaError::NoKernel { op: "grouped experts GEMM", kind: w.kind })?;
        let f = fns.1.get(sort.tile).ok_or(CudaError::NoKernel { op: "grouped experts GEMM", kind: w.kind })?;
        let rows = w.rows / m.n_expert;
        let warps = self.knobs.mmq_warps;
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(16 * warps) as u32, sort.max_tiles as u32, 1),
            block_dim: (32 * warps as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let args: [&dyn Arg; 11] = [
            &self.ptr(&w.data),
            &x16,
            &y,
            &sort.order,
            &sort.tiles,
            &sort.count,
            &int("moe", rows)?,
            &int("moe", w.cols)?,
            &(w.row_bytes as i64),
            &int("moe", m.n_used)?,
            &i32::from(per_pair),
        ];
        self.launch(f, cfg, "grouped experts GEMM", &args)
    }

    /// The routed experts' int8 matvec (`mmvq_id_<kind>`) over the q8
    /// activations `(qs, ds)`, as `to` says: a row a pair over its token's
    /// activations (with `up`, `y = act(gate) * up`, the GLU in the launch),
    /// or a row a token over each pair's own activations, summed by the
    /// routing weights.
    #[allow(clippy::too_many_arguments)]
    fn mmvq_id(&self, w: &Matrix, up: Option<&Matrix>, qs: u64, ds: u64, y: u64, route: u64, m: &MoeShape, to: MmvqIdOut) -> Result<(), CudaError> {
        let f = &self.experts_int8(w).ok_or(CudaError::NoKernel { op: "routed experts int8 matvec", kind: w.kind })?.0;
        let rows = w.rows / m.n_expert;
        let pairs = m.n * m.n_used;
        let (summed, q8) = match to {
            MmvqIdOut::Pairs(q8) => (false, q8.filter(|_| up.is_some() && rows.is_multiple_of(32))),
            MmvqIdOut::Summed => (true, None),
        };
        // A block row a pair, or a token where the launch sums its pairs.
        let block_rows = if summed { m.n } else { pairs };
        // About a kind's GLU share of units a lane, more lanes a row while
        // the launch has fewer than two blocks an SM. (8 lanes a row or
        // more, so a block's rows lie within one 32-row q8 unit.)
        let mut lpr = lanes_per_row(w.cols / 32, glu_units(w.kind)).min(32);
        while lpr < 32 && rows.div_ceil(256 / lpr) * block_rows < 2 * self.sms {
            lpr *= 2;
        }
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(256 / lpr) as u32, block_rows as u32, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let (yq, yds, cnt) = match q8 {
            Some(slot) => {
                let (yq, yds) = self.q8_scratch_slot(pairs * rows, slot)?;
                (yq, yds, self.unit_counters(pairs * rows / 32)?)
            }
            None => (0, 0, 0),
        };
        let args: [&dyn Arg; 17] = [
            &self.ptr(&w.data),
            &up.map_or(0, |u| self.ptr(&u.data)),
            &(w.row_bytes as i64),
            &int("moe", rows)?,
            &qs,
            &ds,
            &int("moe", w.cols)?,
            &route,
            &int("moe", m.n_used)?,
            &i32::from(summed),
            &act_code(m.act),
            &y,
            &(lpr as i32),
            &yq,
            &yds,
            &cnt,
            &i32::from(summed),
        ];
        self.launch(f, cfg, "routed experts int8 matvec", &args)
    }

    /// The routed experts' matvec on the unit decoder (`matvec_id_<kind>`,
    /// every kind): a token's row of `x`, or a pair's with `per_pair`.
    fn matvec_id(&self, mat: &Matrix, xp: u64, y: u64, route: u64, m: &MoeShape, per_pair: bool) -> Result<(), CudaError> {
        let f = &self.kind_fns(mat.kind, "moe")?.matvec_id;
        let rows = mat.rows / m.n_expert;
        let pairs = m.n * m.n_used;
        let cfg = LaunchConfig {
            grid_dim: (rows.div_ceil(MATVEC_ROWS) as u32, pairs as u32, 1),
            block_dim: (32 * MATVEC_ROWS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let args: [&dyn Arg; 9] = [
            &self.ptr(&mat.data),
            &xp,
            &y,
            &route,
            &int("moe", rows)?,
            &int("moe", mat.cols)?,
            &(mat.row_bytes as i64),
            &int("moe", m.n_used)?,
            &i32::from(per_pair),
        ];
        self.launch(f, cfg, "matvec_id", &args)
    }

    /// `out = act(gate) * up` element-wise.
    pub fn glu(&self, act: Activation, gate: &Buf, up: &Buf, out: &mut Buf) -> Result<(), CudaError> {
        if up.len != gate.len || out.len != gate.len {
            return Err(shape(
                "glu",
                format!("gate {}, up {}, out {}", gate.len, up.len, out.len),
            ));
        }
        let w = int("glu", gate.len.max(1))?;
        self.glu_launch(act, self.ptr(&gate.s), self.ptr(&up.s), out, w, w)
    }

    /// Each `2 * width` row of `fused` is `[gate | up]`: `out = act(gate) * up`.
    pub fn glu_fused(
        &self,
        act: Activation,
        fused: &Buf,
        out: &mut Buf,
        width: usize,
    ) -> Result<(), CudaError> {
        if width == 0 || !fused.len.is_multiple_of(2 * width) || out.len != fused.len / 2 {
            return Err(shape(
                "glu_fused",
                format!("rows of 2x{width} in {} floats into {}", fused.len, out.len),
            ));
        }
        let g = self.ptr(&fused.s);
        let up = g + (width * 4) as u64;
        self.glu_launch(
            act,
            g,
            up,
            out,
            int("glu_fused", width)?,
            int("glu_fused", 2 * width)?,
        )
    }

    fn glu_launch(
        &self,
        act: Activation,
        gate: u64,
        up: u64,
        out: &mut Buf,
        width: i32,
        stride: i32,
    ) -> Result<(), CudaError> {
        if out.len == 0 {
            return Ok(());
        }
        let n = out.len as i64;
        let a = act_code(act);
        // The product feeds the down matvec next: quantize it here too.
        let wu = width as usize;
        let q8 = wu > 0 && self.wants_q8(out.len / wu, wu);
        let (qs, ds) = if q8 { self.q8_scratch(out.len)? } else { (0, 0) };
        self.launch(
            &self.fns.glu,
            grid(out.len, 256),
            "glu",
            &[&gate, &up, &self.ptr(&out.s), &n, &width, &stride, &a, &qs, &ds],
        )?;
        if q8 {
            self.set_q8_tag(Some(Q8Tag {
                buf: out.id,
                elems: out.len,
                width: wu,
                slot: 0,
            }));
        }
        Ok(())
    }

    /// `dst = src`.
    pub fn copy(&self, src: &Buf, dst: &mut Buf) -> Result<(), CudaError> {
        if src.len != dst.len {
            return Err(shape(
                "copy",
                format!("{} floats into {}", src.len, dst.len),
            ));
        }
        if src.len == 0 {
            return Ok(());
        }
        self.set_q8_tag(None);
        self.stream
            .memcpy_dtod(&src.s.slice(..src.len), &mut dst.s.slice_mut(..src.len))
            .map_err(drv("copying"))
    }

    /// `a += b`.
    pub fn add(&self, a: &mut Buf, b: &Buf) -> Result<(), CudaError> {
        if a.len != b.len {
            return Err(shape("add", format!("{} floats plus {}", a.len, b.len)));
        }
        let n = a.len as i64;
        self.launch(
            &self.fns.add,
            grid(a.len, 256),
            "add",
            &[&self.ptr(&a.s), &self.ptr(&b.s), &n],
        )
    }

    /// `x *= s`.
    pub fn scale(&self, x: &mut Buf, s: f32) -> Result<(), CudaError> {
        let n = x.len as i64;
        self.launch(
            &self.fns.scale,
            grid(x.len, 256),
            "scale",
            &[&self.ptr(&x.s), &s, &n],
        )
    }

    /// `x = cap * tanh(x / cap)`.
    pub fn softcap(&self, x: &mut Buf, cap: f32) -> Result<(), CudaError> {
        let n = x.len as i64;
        self.launch(
            &self.fns.softcap,
            grid(x.len, 256),
            "softcap",
            &[&self.ptr(&x.s), &cap, &n],
        )
    }

    /// `dst[r] = src[rows[r]]` for rows of `width`; each row index
    /// checked by the caller to be inside `src`.
    pub fn gather_rows(
        &self,
        src: &Buf,
        rows: IndexView<'_>,
        width: usize,
        dst: &mut Buf,
    ) -> Result<(), CudaError> {
        let n_rows = rows.len;
        if dst.len != n_rows * width {
            return Err(shape(
                "gather_rows",
                format!("{n_rows} rows of {width} into {} floats", dst.len),
            ));
        }
        self.copy_cols(rows.ptr, src, n_rows, width, 0, dst, width)
    }

    /// Columns `[c0, c0 + dst_width)` of each `src_width`-wide row of `src`.
    pub fn split_cols(
        &self,
        src: &Buf,
        src_width: usize,
        c0: usize,
        dst: &mut Buf,
        dst_width: usize,
    ) -> Result<(), CudaError> {
        if src_width == 0
            || c0 + dst_width > src_width
            || !src.len.is_multiple_of(src_width)
            || dst.len != src.len / src_width * dst_width
        {
            return Err(shape(
                "split_cols",
                format!(
                    "columns {c0}..{} of rows of {src_width} ({} floats) into {}",
                    c0 + dst_width,
                    src.len,
                    dst.len
                ),
            ));
        }
        self.copy_cols(0, src, src.len / src_width, src_width, c0, dst, dst_width)
    }

    #[allow(clippy::too_many_arguments)]
    fn copy_cols(
        &self,
        rows: u64,
        src: &Buf,
        n_rows: usize,
        src_width: usize,
        c0: usize,
        dst: &mut Buf,
        width: usize,
    ) -> Result<(), CudaError> {
        if n_rows == 0 || width == 0 {
            return Ok(());
        }
        if n_rows > 65535 {
            return Err(shape("copy_cols", format!("{n_rows} rows in one launch")));
        }
        let cfg = LaunchConfig {
            grid_dim: (width.div_ceil(128) as u32, n_rows as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: 0,
        };
        self.launch(
            &self.fns.copy_cols,
            cfg,
            "copy_cols",
            &[
                &self.ptr(&src.s),
                &rows,
                &self.ptr(&dst.s),
                &int("copy_cols", n_rows)?,
                &int("copy_cols", src_width)?,
                &int("copy_cols", c0)?,
                &int("copy_cols", width)?,
            ],
        )
    }

    // ---- recorded forward passes (CUDA graphs)

    /// Writes `src` into `dst` from element `start` on, in stream order (a
    /// staged index buffer rewritten in place, so a recorded graph that
    /// reads it sees each step's positions).
    pub fn write_u32(&self, dst: &Indices, start: usize, src: &[u32]) -> Result<(), CudaError> {
        if start
            .checked_add(src.len())
            .is_none_or(|end| end > dst.s.len())
        {
            return Err(shape(
                "write_u32",
                format!("{} indices at {start} into {}", src.len(), dst.s.len()),
            ));
        }
        if src.is_empty() {
            return Ok(());
        }
        let p = self.ptr(&dst.s) + 4 * start as u64;
        // SAFETY: `[start, start + src.len())` is inside `dst` (checked
        // above); the copy is ordered on this device's stream with every
        // kernel that reads `dst`, and the driver stages pageable memory
        // before the call returns.
        unsafe { cudarc::driver::result::memcpy_htod_async(p, src, self.stream.cu_stream()) }
            .map_err(drv("writing indices"))
    }

    /// Starts recording this device's stream: the launches that follow are
    /// captured, not run, until [`Device::end_capture`].
    pub fn begin_capture(&self) -> Result<(), CudaError> {
        self.stream
            .begin_capture(
                cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            )
            .map_err(drv("beginning a graph capture"))
    }

    /// Ends the recording and instantiates it.
    pub fn end_capture(&self) -> Result<Graph, CudaError> {
        let g = self
            .stream
            .end_capture(cudarc::driver::sys::CUgraphInstantiate_flags(0))
            .map_err(drv("ending a graph capture"))?;
        g.map(Graph)
            .ok_or_else(|| shape("graph capture", "nothing was captured".into()))
    }

    /// Enqueues a recorded graph on this device's stream.
    pub fn replay(&self, g: &Graph) -> Result<(), CudaError> {
        g.0.launch().map_err(drv("launching a graph"))
    }

    /// The context this device runs in (for tests that time with events).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The stream every operation is enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
}

/// A kernel argument by value: the C types `kernels.cu` declares.
trait Arg {
    fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>);
    /// The address of the value, as `cuLaunchKernelEx` takes each argument.
    fn param(&self) -> *mut std::ffi::c_void;
    /// The C parameter type this value passes as
    /// ([`crate::kernel_signatures`]' spelling).
    fn c_type(&self) -> &'static str;
}

macro_rules! arg {
    ($($t:ty => $c:literal),*) => {$(
        impl Arg for $t {
            fn push<'a>(&'a self, b: &mut cudarc::driver::LaunchArgs<'a>) {
                b.arg(self);
            }
            fn param(&self) -> *mut std::ffi::c_void {
                self as *const Self as *mut std::ffi::c_void
            }
            fn c_type(&self) -> &'static str {
                $c
            }
        }
    )*};
}
// A device pointer is a u64; no kernel takes a 64-bit unsigned scalar.
arg!(u64 => "ptr", i64 => "long long", i32 => "int", f32 => "float", MmvqMats => "MmvqMats");

/// How the attention's launch finds the step's keys and values in the cache.
#[derive(Clone, Copy)]
enum KvStore<'a> {
    /// RoPE on q and k, then both stored (`rope_kv`).
    Rope(&'a RopeShape, Option<&'a Buf>),
    /// Stored as they are (`kv_store`).
    Plain,
    /// Already rotated and stored (the QKV launch's epilogue).
    Done,
}

/// What a streaming matvec launch does with each row's dot.
#[derive(Clone, Copy)]
enum Epilogue {
    /// `y = dot`.
    Store,
    /// `y += dot` (a projection into the residual stream).
    Add,
    /// The launch is a layer's Q, K and V: RoPE on the queries and keys,
    /// the keys and values into the cache (`rope_epilogue`).
    Rope(RopeEpi),
}

/// The RoPE and cache fields of `MmvqMats` (device pointers, the
/// rotation's shape).
#[derive(Clone, Copy)]
struct RopeEpi {
    seq: u64,
    pos: u64,
    factors: u64,
    kc: u64,
    vc: u64,
    hd: i32,
    n_rot: i32,
    n_ctx: i32,
    base: f32,
    freq_scale: f32,
    attn_factor: f32,
}

/// The matrices of one int8-activation or F16 matvec launch (`MmvqMats`
/// in `kernels.cu`, field for field).
#[repr(C)]
#[derive(Clone, Copy)]
struct MmvqMats {
    w: [u64; 3],
    y: [u64; 3],
    rows: [i32; 3],
    acc: i32,
    row_bytes: [i64; 3],
    seq: u64,
    pos: u64,
    factors: u64,
    kc: u64,
    vc: u64,
    rope: i32,
    hd: i32,
    n_rot: i32,
    n_ctx: i32,
    base: f32,
    freq_scale: f32,
    attn_factor: f32,
}

// SAFETY: plain old data with the C layout the kernel declares.
unsafe impl cudarc::driver::DeviceRepr for MmvqMats {}

/// The device layout of the kinds whose blocks keep an f16 scale beside
/// 2-byte-aligned quants (Q4_0, Q8_0: scale first; Q6_K: scale last): per
/// row, every block's other bytes block after block (16, 32 or 208 bytes, so
/// each block's quants start 16-byte aligned and load as uint4), then the
/// blocks' scales, padded to 16 bytes; Q4_K has its own layout
/// ([`repack_q4_k`]). `None` for kinds kept as in the file. The kernels'
/// `deq_`/`dot_` functions read these layouts (`kernels.cu`).
fn repack(kind: QuantKind, bytes: &[u8], rows: usize, row_bytes: usize) -> Option<(Vec<u8>, usize)> {
    if kind == QuantKind::Q4K {
        return Some((repack_q4_k(bytes, row_bytes), row_bytes));
    }
    let (block, scale_at) = match kind {
        QuantKind::Q4_0 => (18, 0),
        QuantKind::Q8_0 => (34, 0),
        QuantKind::Q6K => (210, 208),
        _ => return None, // capability table: the other kinds stay as in the file
    };
    let nb = row_bytes / block;
    let body = block - 2;
    let rb = row_bytes.next_multiple_of(16);
    let mut out = vec![0u8; rb * rows];
    for (src, dst) in bytes.chunks_exact(row_bytes).zip(out.chunks_exact_mut(rb)) {
        let (bodies, scales) = dst.split_at_mut(nb * body);
        for (b, blk) in src.chunks_exact(block).enumerate() {
            let (lo, hi) = if scale_at == 0 { (2, block) } else { (0, scale_at) };
            bodies[b * body..][..body].copy_from_slice(&blk[lo..hi]);
            scales[2 * b..][..2].copy_from_slice(&blk[scale_at..scale_at + 2]);
        }
    }
    Some((out, rb))
}

/// The device layout of Q4_K (`deq_q4_k` in `kernels.cu`), the same size
/// as the file's: per row, each 32-element unit's 16 quant bytes (byte j:
/// element j in the low nibble, element j + 16 in the high, as Q4_0), then
/// each block's 16-byte head (d, dmin, 12 bytes of scales and mins). In the
/// file a block is the head and 128 quant bytes in which byte l of group g
/// holds element l of sub-block 2g (low nibble) and of 2g + 1 (high).
fn repack_q4_k(bytes: &[u8], row_bytes: usize) -> Vec<u8> {
    let nb = row_bytes / 144;
    let mut out = vec![0u8; bytes.len()];
    for (src, dst) in bytes.chunks_exact(row_bytes).zip(out.chunks_exact_mut(row_bytes)) {
        let (quants, heads) = dst.split_at_mut(nb * 128);
        for (b, blk) in src.chunks_exact(144).enumerate() {
            heads[16 * b..][..16].copy_from_slice(&blk[..16]);
            for s in 0..8 {
                let group = &blk[16 + 32 * (s / 2)..][..32];
                let shift = 4 * (s % 2);
                let nib = |l: usize| (group[l] >> shift) & 0xF;
                let unit = &mut quants[(8 * b + s) * 16..][..16];
                for (j, o) in unit.iter_mut().enumerate() {
                    *o = nib(j) | (nib(j + 16) << 4);
                }
            }
        }
    }
    out
}

/// The shape check of a fused gate/up + GLU launch: `n` tokens of `cols`
/// in, `n` of `rows` out.
fn glu_shape(x: &Buf, h: &Buf, n: usize, rows: usize, cols: usize) -> Result<(), CudaError> {
    if x.len < n * cols || h.len != n * rows {
        return Err(shape(
            "gate_up_glu",
            format!(
                "{n} tokens through 2x{rows}x{cols}: input {} floats, output {}",
                x.len, h.len
            ),
        ));
    }
    Ok(())
}

/// The pieces a read-back is copied out in (`Device::read`).
const READ_CHUNK: usize = 256 << 10;

/// Threads of a `top_k_rows` block (`TOPK_THREADS` in kernels.cu).
const TOPK_THREADS: u32 = 512;

/// Elements of a row one `argmax_rows` block reduces (`ARGMAX_SPAN` in
/// kernels.cu), and the most rows one launch takes (the grid's y limit).
const ARGMAX_SPAN: usize = 2048;
const ARGMAX_ROWS: usize = 65535;

/// The most runs a split decode-attention token has (`DEC_MAXSPLIT` in
/// kernels.cu: a warp's lanes merge them).
const DEC_MAXSPLIT: usize = 32;

/// The value dims a grouped attention block's heads hold in registers and
/// partial sums (`GA_FAST` in kernels.cu).
const GA_FAST: usize = 512;

/// Dynamic shared memory of `attention_dec` for `chunk` keys a stage
/// (its layout comment in `kernels.cu`).
fn dec_smem_bytes(chunk: usize, g: usize, hd: usize, hdv: usize) -> usize {
    2 * chunk * (hd + 8 + hdv) * 2 + (g * hd + g * chunk + 8 * g * hdv) * 4
}

/// Units of each matrix a lane of the int8 gate/up GLU takes: 8 for the
/// kinds whose units are 16 or 18 bytes (with 4, a lane had too few bytes
/// in flight: on the H200 8b Q4_K decode 403 -> 415 t/s, Q4_0 with its
/// 8-unit step 444 -> 459; docs/decisions/0009-per-kind-int8-steps.md),
/// else 4.
fn glu_units(kind: QuantKind) -> usize {
    match kind {
        QuantKind::Q4_0 | QuantKind::Q4K => 8,
        _ => 4, // capability table (a tuning): every other kind keeps 4
    }
}

/// Lanes of a 256-thread block that share one row of the int8 gate/up GLU
/// kernels (a power of two, 8 to 256; the caller caps it at a warp): about
/// `per_lane` loads (units) a lane, the kernels issuing `MMVQ_GSTEP_<kind>`
/// at a time.
fn lanes_per_row(loads: usize, per_lane: usize) -> usize {
    (loads / per_lane.max(1)).next_power_of_two().clamp(8, 256)
}

/// The kernel argument listing up to three matrices and their outputs.
fn mmvq_mats(d: &Device, mats: &[(&Matrix, u64)], epi: Epilogue) -> Result<MmvqMats, CudaError> {
    let mut m = MmvqMats {
        w: [0; 3],
        y: [0; 3],
        rows: [0; 3],
        acc: matches!(epi, Epilogue::Add) as i32,
        row_bytes: [0; 3],
        seq: 0,
        pos: 0,
        factors: 0,
        kc: 0,
        vc: 0,
        rope: 0,
        hd: 0,
        n_rot: 0,
        n_ctx: 0,
        base: 0.0,
        freq_scale: 0.0,
        attn_factor: 0.0,
    };
    if let Epilogue::Rope(r) = epi {
        (m.seq, m.pos, m.factors, m.kc, m.vc) = (r.seq, r.pos, r.factors, r.kc, r.vc);
        (m.rope, m.hd, m.n_rot, m.n_ctx) = (1, r.hd, r.n_rot, r.n_ctx);
        (m.base, m.freq_scale, m.attn_factor) = (r.base, r.freq_scale, r.attn_factor);
    }
    for (i, (w, y)) in mats.iter().enumerate().take(3) {
        m.w[i] = d.ptr(&w.data);
        m.y[i] = *y;
        m.rows[i] = int("matvec", w.rows)?;
        m.row_bytes[i] = w.row_bytes as i64;
    }
    Ok(m)
}

/// `w` as `ferrox_ops::cuda`'s fusion rules see it.
fn mat(w: &Matrix) -> cuda_ops::Mat {
    cuda_ops::Mat { kind: w.kind, rows: w.rows, cols: w.cols }
}

/// Whether the gate and up matrices `a` and `b` are laid out alike (one
/// fused launch walks both with the same offsets).
fn same_layout(a: &Matrix, b: &Matrix) -> bool {
    a.kind == b.kind && a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes
}

/// `n` rows of `x` through `w` into `y`: the buffers hold them.
fn matmul_shape(w: &Matrix, x: &Buf, y: &Buf, n: usize) -> Result<(), CudaError> {
    if x.len < n * w.cols || y.len < n * w.rows {
        return Err(shape(
            "matmul",
            format!("{n} tokens through {}x{}: input {} floats, output {}", w.rows, w.cols, x.len, y.len),
        ));
    }
    Ok(())
}

/// Whether `w` runs on the 16-byte-load F16 matvec (`ferrox_ops::cuda::matvec`,
/// the choice the engine's plan reports; the row stride as the file's).
fn f16_fits(w: &Matrix) -> bool {
    cuda_ops::matvec(w.kind, w.cols) == Some(cuda_ops::Matvec::F16Stream) && w.row_bytes == 2 * w.cols
}

/// Whether `w` runs on the int8-activation matvec (`ferrox_ops::cuda::matvec`).
fn mmvq_fits(w: &Matrix) -> bool {
    cuda_ops::matvec(w.kind, w.cols) == Some(cuda_ops::Matvec::Int8Stream)
}

/// The shape checks of a RoPE launch: each `(floats, heads)` buffer holds
/// `n_tok` tokens of `heads` heads, `n_rot` is even and fits the head, and
/// the frequency factors (if any) cover every pair.
fn rope_check(
    n_tok: usize,
    bufs: impl Iterator<Item = (usize, usize)>,
    r: &RopeShape,
    factors: Option<&Buf>,
) -> Result<(), CudaError> {
    for (len, heads) in bufs {
        if len != n_tok * heads * r.head_dim {
            return Err(shape(
                "rope",
                format!("{n_tok} tokens of {heads}x{} in {len} floats", r.head_dim),
            ));
        }
    }
    if r.params.n_rot > r.head_dim || !r.params.n_rot.is_multiple_of(2) {
        return Err(shape(
            "rope",
            format!("n_rot {} does not fit head size {}", r.params.n_rot, r.head_dim),
        ));
    }
    if let Some(f) = factors {
        if f.len < r.params.n_rot / 2 {
            return Err(shape(
                "rope",
                format!("{} frequency factors for {} pairs", f.len, r.params.n_rot / 2),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Unset knobs are the measured defaults a release build is fixed to.
    #[test]
    fn unset_knobs_are_the_release_defaults() {
        assert_eq!(Knobs::parse(|_| None), Ok(Knobs::DEFAULT));
    }

    /// A knob set to what it does not take is refused by name, with the
    /// values it takes — not run at its default.
    #[test]
    fn a_knob_that_does_not_parse_is_an_error_naming_it() {
        for (name, bad, expected) in [
            ("FERROX_CUDA_DEC_SPLIT", "banana", "1 to 32"),
            ("FERROX_CUDA_DEC_SPLIT", "33", "1 to 32"),
            ("FERROX_CUDA_DEC_CHUNK", "48", "32, 64 or 128"),
            ("FERROX_CUDA_FUSE", "yes please", "0, 1"),
            ("FERROX_CUDA_READ", "3", "0, 1 or 2"),
            ("FERROX_CUDA_SKIP", "norm,mlp", "norm, attn, rope"),
        ] {
            let e = Knobs::parse(|n| (n == name).then_some(bad)).unwrap_err();
            assert_eq!(e.name, name);
            assert!(e.to_string().contains(expected), "{name}={bad}: {e}");
        }
        let k = Knobs::parse(|n| match n {
            "FERROX_CUDA_DEC_SPLIT" => Some("1"),
            "FERROX_CUDA_SKIP" => Some("attn, rope"),
            "FERROX_CUDA_PDL" => Some("off"),
            _ => None,
        })
        .unwrap();
        assert_eq!((k.dec_split, k.pdl), (1, false));
        assert_eq!(k.skip, Skip { norm: false, attn: true, rope: true });
    }

    /// The Q4_K device layout holds each element's nibble where
    /// `deq_q4_k`/`ld_q4_k` read it: with d = 1, dmin = 0 and every scale 1
    /// a weight is its nibble, so element 32u + j of the file's row must be
    /// the low (j < 16) or high nibble of byte j % 16 of unit u; the heads
    /// follow the quants unchanged.
    #[test]
    fn q4_k_repack_puts_each_nibble_where_the_kernels_read_it() {
        let (rows, nb) = (3usize, 2usize);
        let row_bytes = nb * 144;
        let mut state = 0x9e3779b97f4a7c15u64;
        let mut bytes: Vec<u8> = (0..rows * row_bytes)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        for blk in bytes.chunks_exact_mut(144) {
            blk[..4].copy_from_slice(&[0x00, 0x3c, 0x00, 0x00]); // d = 1.0, dmin = 0
            blk[4..16].copy_from_slice(&[1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1]);
        }
        let want = ferrox_quant::dequantize_to_vec(QuantKind::Q4K, &bytes, rows * nb * 256).unwrap();
        let (packed, rb) = repack(QuantKind::Q4K, &bytes, rows, row_bytes).unwrap();
        assert_eq!(rb, row_bytes);
        for r in 0..rows {
            let (src, row) = (&bytes[r * rb..][..rb], &packed[r * rb..][..rb]);
            for i in 0..nb * 256 {
                let (u, j) = (i / 32, i % 32);
                let byte = row[u * 16 + j % 16];
                let nib = if j < 16 { byte & 0xF } else { byte >> 4 };
                assert_eq!(f32::from(nib), want[r * nb * 256 + i], "row {r} element {i}");
            }
            for b in 0..nb {
                assert_eq!(row[nb * 128 + 16 * b..][..16], src[144 * b..][..16], "row {r} head {b}");
            }
        }
    }
}
