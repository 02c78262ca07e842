//! The conformance suite: what every backend must compute, written once over
//! [`DeviceBackend`] and instantiated per backend by [`conformance_suite!`] —
//! the CPU in every build, each accelerator of [`gpu_backend_table!`] where
//! its feature is on (ggml's `test-backend-ops`, as one macro).
//!
//! The decision: the references are independent of every backend. Weights
//! are checked against ferrox-quant's scalar twins (dequantize, then an f64
//! dot), the other ops against plain f64 loops written here, at odd shapes
//! (rows and widths that are no power of two, token counts on both sides of
//! each backend's batch thresholds). Whole models: every architecture's tiny
//! model against llama.cpp's own logits (`testdata/llama_ref/tiny/`) on every
//! backend, and an accelerator's greedy decode against the CPU's. Which kinds a backend is held to comes from its
//! capability data (what it claims), never from a list here. Seeds are fixed
//! and printed.
//!
//! A backend's suite runs where its device opens; elsewhere each test says
//! loudly what it did not check, and with `FERROX_REQUIRE_GPU=1` (the GPU
//! machine's scripts set it) a device that does not open fails instead;
//! `FERROX_REQUIRE_<BACKEND>=1` does the same for one backend (CI's
//! `FERROX_REQUIRE_VULKAN=1` beside lavapipe).
//!
//! [`gpu_backend_table!`]: crate::backend::gpu_backend_table

use std::sync::Arc;

use ferrox_gguf::testing::SplitMix64;
use ferrox_gguf::{GgufModel, GgufWriter};
use ferrox_quant::QuantKind;
use half::f16;

use super::{AttnParams, BackendError, Batch, DeviceBackend, DeviceOptions, HostTensor, RopeParams, Staged};
use crate::arch::{Activation, RopeStyle};
use crate::kernel_registry::Backend;
use crate::model::Model;

/// Opens a `B` for one test, or says what was not checked (`None`). With
/// `FERROX_REQUIRE_GPU=1` an accelerator that does not open panics: a GPU
/// test must not pass by skipping where a GPU is meant to be.
pub(crate) fn open<B: DeviceBackend>(id: Backend, gpu_layers: Option<usize>, what: &str) -> Option<B> {
    match B::open(&DeviceOptions { backend: id, device: 0, threads: 2, gpu_layers }) {
        Ok(b) => Some(b),
        Err(e) if id.is_accelerator() && std::env::var_os("FERROX_REQUIRE_GPU").is_some_and(|v| v == "1") => {
            panic!("{id} did not open (FERROX_REQUIRE_GPU=1): {e}")
        }
        Err(e) if std::env::var_os(require_var(id)).is_some_and(|v| v == "1") => {
            panic!("{id} did not open ({}=1): {e}", require_var(id))
        }
        Err(e) => {
            eprintln!("NOT CHECKED on {id} ({e}): {what}");
            None
        }
    }
}

/// `FERROX_REQUIRE_<BACKEND>`: set to 1 where that one backend's device is
/// meant to be (CI sets `FERROX_REQUIRE_VULKAN=1` beside lavapipe), so its
/// suite fails rather than skips when the device does not open.
pub(crate) fn require_var(id: Backend) -> String {
    format!("FERROX_REQUIRE_{}", id.name().to_ascii_uppercase())
}

/// A generator with a fixed seed, printed so a failure can be replayed.
fn rng(seed: u64) -> SplitMix64 {
    eprintln!("seed {seed:#x}");
    SplitMix64(seed)
}

pub(crate) fn rand_vec(r: &mut SplitMix64, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| r.next_f32() * scale).collect()
}

/// ‖a − b‖ / ‖b‖; NaN never passes.
pub(crate) fn rel(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths");
    let (mut num, mut den) = (0.0f64, 0.0f64);
    for (&x, &y) in a.iter().zip(b) {
        num += (x as f64 - y as f64).powi(2);
        den += (y as f64).powi(2);
    }
    let e = (num / den.max(1e-30)).sqrt();
    if e.is_nan() {
        f64::INFINITY
    } else {
        e
    }
}

fn check(be: &str, what: &str, got: &[f32], want: &[f32], tol: f64) {
    let e = rel(got, want);
    assert!(e <= tol, "{be} {what}: relative error {e:e} (bound {tol:e})");
}

fn read<B: DeviceBackend>(be: &B, b: &B::Buf, len: usize) -> Vec<f32> {
    let mut v = vec![f32::NAN; len];
    be.read(b, &mut v).unwrap();
    v
}

fn up<B: DeviceBackend>(be: &B, v: &[f32]) -> B::Buf {
    be.upload(v).unwrap()
}

/// Weights as a model file holds them, so they are placed the way a loaded
/// model's are (a backend may borrow the mapping).
struct Weights {
    file: Arc<GgufModel>,
}

impl Weights {
    /// `(name, kind, rows, cols, bytes)` written to a scratch GGUF file.
    fn new(tensors: &[(String, QuantKind, usize, usize, Vec<u8>)]) -> Weights {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let mut w = GgufWriter::new();
        for (name, kind, rows, cols, bytes) in tensors {
            let dims: Vec<u64> = if *rows == 1 { vec![*cols as u64] } else { vec![*cols as u64, *rows as u64] };
            w.add_tensor(name.clone(), *kind, &dims, bytes.as_slice()).unwrap();
        }
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("ferrox-conformance-{}-{n}.gguf", std::process::id()));
        w.write_to(&path).unwrap();
        let file = Arc::new(GgufModel::open(&path).unwrap());
        let _ = std::fs::remove_file(&path);
        Weights { file }
    }

    /// The tensor `name` as `place` takes it.
    fn with<R>(&self, name: &str, place: impl FnOnce(&HostTensor<'_>) -> R) -> R {
        let t = self.file.tensor(name).unwrap();
        let (cols, rows) = (t.info.dims[0] as usize, t.info.dims.get(1).copied().unwrap_or(1) as usize);
        let bytes = self.file.tensor_data(t).unwrap();
        place(&HostTensor { name, kind: t.info.kind, rows, cols, bytes, owner: &self.file })
    }

    fn place<B: DeviceBackend>(&self, be: &B, name: &str) -> B::Matrix {
        self.with(name, |t| be.place_matrix(t)).unwrap()
    }
}

/// One f32 vector as a placed weight (norms, biases, RoPE factors).
pub(crate) fn vector<B: DeviceBackend>(be: &B, v: &[f32]) -> B::Vector {
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    Weights::new(&[("v".into(), QuantKind::F32, 1, v.len(), bytes)]).with("v", |t| be.place_vector(t)).unwrap()
}

/// A batch of `tokens` at positions `pos`, in `slot`.
pub(crate) fn batch(tokens: &[u32], pos: &[u32], slot: u32) -> Batch {
    let mut b = Batch::default();
    tokens.iter().zip(pos).for_each(|(&t, &p)| b.push(t, p, slot, true));
    b
}

/// `batch`'s lists and `rows` staged on `be` (its device copy).
pub(crate) fn stage<B: DeviceBackend>(be: &B, batch: &Batch, rows: &[u32]) -> B::Indices {
    let mut idx = be.indices(batch.len().max(rows.len())).unwrap();
    be.stage(&mut idx, Staged::of(batch, rows, &())).unwrap();
    idx
}

/// A random `rows x cols` matrix of `kind` and its dequantized values.
pub(crate) fn matrix(r: &mut SplitMix64, kind: QuantKind, rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
    let rb = ferrox_quant::row_bytes(kind, cols).unwrap();
    // The lattice kinds have no quantizer: random valid blocks.
    let bytes = ferrox_quant::random_lattice_blocks(kind, rb / kind.block_bytes() * rows, r.next_u64()).unwrap_or_else(|| {
        let src = rand_vec(r, rows * cols, 1.0);
        let mut bytes = vec![0u8; rb * rows];
        ferrox_quant::quantize(kind, &src, &mut bytes).unwrap();
        bytes
    });
    let mut deq = vec![0.0f32; rows * cols];
    ferrox_quant::dequantize(kind, &bytes, &mut deq).unwrap();
    (bytes, deq)
}

/// An odd number of rows, and columns that are an odd number of blocks
/// (for the float kinds an odd number of elements: no tail is whole).
pub(crate) fn odd_shape(kind: QuantKind) -> (usize, usize) {
    let be = kind.block_elems();
    (37, if be == 1 { 97 } else { be * 3 })
}

/// `y = x W^T` for every claimed kind, against the scalar twin's
/// dequantized weights and an f64 dot, at one token (decode), a few, past a
/// GEMM threshold (11: CUDA takes cuBLAS above 8) and a prefill batch (70:
/// the CPU's bf16 product from 64). Backends quantize activations (to 8
/// bits, or bf16/f16 for products), so the bound is percent-level for the
/// block kinds; a wrong kernel is off by order one.
pub(crate) fn matmul_matches_the_scalar_twin<B: DeviceBackend>(be: &B, claims: impl Fn(QuantKind) -> bool) {
    let name = be.id();
    let mut r = rng(0x5eed_0001);
    let kinds: Vec<QuantKind> = QuantKind::ALL.iter().copied().filter(|&k| claims(k)).collect();
    assert!(kinds.len() >= 10, "{name} claims only {kinds:?}");
    for kind in kinds {
        let (rows, cols) = odd_shape(kind);
        let (bytes, deq) = matrix(&mut r, kind, rows, cols);
        let w = Weights::new(&[("w".into(), kind, rows, cols, bytes)]);
        let wp = w.place(be, "w");
        let float = matches!(kind, QuantKind::F32 | QuantKind::F16 | QuantKind::BF16);
        for n in [1usize, 3, 11, 70] {
            let x = rand_vec(&mut r, n * cols, 1.0);
            let want: Vec<f32> = x
                .chunks(cols)
                .flat_map(|xt| {
                    (0..rows).map(|o| (0..cols).map(|i| deq[o * cols + i] as f64 * xt[i] as f64).sum::<f64>() as f32)
                })
                .collect();
            let xb = up(be, &x);
            let mut y = up(be, &vec![f32::NAN; n * rows]);
            be.matmul(&wp, &xb, &mut y, n).unwrap();
            let tol = if float { 1e-2 } else { 3e-2 };
            check(&name.to_string(), &format!("matmul {kind} {rows}x{cols}, {n} tokens"), &read(be, &y, n * rows), &want, tol);
        }
        // Shapes that do not fit are errors, never a panic or a write past the end.
        let (xb, mut small) = (up(be, &vec![0.0; cols]), up(be, &vec![0.0; rows - 1]));
        assert!(be.matmul(&wp, &xb, &mut small, 1).is_err(), "{name} {kind}: an output too short must be an error");
    }
}

/// Embedding rows of every claimed kind, dequantized, equal the scalar twin;
/// an id outside the table is an error.
pub(crate) fn get_rows_matches_the_scalar_twin<B: DeviceBackend>(be: &B, claims: impl Fn(QuantKind) -> bool) {
    let name = be.id();
    let mut r = rng(0x5eed_0002);
    for kind in QuantKind::ALL.iter().copied().filter(|&k| claims(k)) {
        let (rows, cols) = (5, odd_shape(kind).1);
        let (bytes, deq) = matrix(&mut r, kind, rows, cols);
        let w = Weights::new(&[("t".into(), kind, rows, cols, bytes)]);
        let t = w.place(be, "t");
        let ids = [4u32, 0, 2, 4];
        let ids_b = batch(&ids, &[0, 1, 2, 3], 0);
        let idx = stage(be, &ids_b, &[]);
        let mut out = up(be, &vec![f32::NAN; ids.len() * cols]);
        be.get_rows(&t, Staged::of(&ids_b, &[], &idx), &mut out).unwrap();
        let want: Vec<f32> = ids.iter().flat_map(|&i| deq[i as usize * cols..][..cols].to_vec()).collect();
        check(&name.to_string(), &format!("get_rows {kind}"), &read(be, &out, want.len()), &want, 1e-6);
        let past = batch(&[5], &[0], 0);
        let idx = stage(be, &past, &[]);
        assert!(be.get_rows(&t, Staged::of(&past, &[], &idx), &mut out).is_err(), "{name} {kind}: an id past the table must be an error");
    }
}

fn rms_norm_ref(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    x.chunks(w.len())
        .flat_map(|row| {
            let ms = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / row.len() as f64;
            let inv = 1.0 / (ms + eps as f64).sqrt();
            row.iter().zip(w).map(move |(&v, &g)| (v as f64 * inv * g as f64) as f32)
        })
        .collect()
}

fn act_ref(act: Activation, g: f32) -> f64 {
    let g = g as f64;
    match act {
        Activation::SiluGated => g / (1.0 + (-g).exp()),
        Activation::GeluGated => 0.5 * g * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (g + 0.044715 * g * g * g)).tanh()),
    }
}

/// Norms, biases, residual adds, scaling, softcaps, the gated activations,
/// copies and row/column selection, against f64 loops.
pub(crate) fn element_wise_ops_match_the_reference<B: DeviceBackend>(be: &B) {
    let name = be.id().to_string();
    let mut r = rng(0x5eed_0003);
    let (n, w) = (7, 83);
    let x = rand_vec(&mut r, n * w, 3.0);
    let y = rand_vec(&mut r, n * w, 2.0);
    let g = rand_vec(&mut r, w, 1.5);
    let gw = vector(be, &g);
    let len = n * w;

    let mut b = up(be, &x);
    be.rms_norm(&mut b, &gw, 1e-6).unwrap();
    check(&name, "rms_norm", &read(be, &b, len), &rms_norm_ref(&x, &g, 1e-6), 1e-5);

    let mut b = up(be, &x);
    be.add_bias(&mut b, &gw, n).unwrap();
    let want: Vec<f32> = x.iter().enumerate().map(|(i, &v)| v + g[i % w]).collect();
    check(&name, "add_bias", &read(be, &b, len), &want, 1e-6);

    let (mut b, yb) = (up(be, &x), up(be, &y));
    be.add(&mut b, &yb).unwrap();
    let sum: Vec<f32> = x.iter().zip(&y).map(|(a, b)| a + b).collect();
    check(&name, "add", &read(be, &b, len), &sum, 1e-6);

    let mut b = up(be, &x);
    be.scale(&mut b, 0.37).unwrap();
    let want: Vec<f32> = x.iter().map(|v| v * 0.37).collect();
    check(&name, "scale", &read(be, &b, len), &want, 1e-6);

    let big = rand_vec(&mut r, len, 80.0);
    let mut b = up(be, &big);
    be.softcap(&mut b, 30.0).unwrap();
    let want: Vec<f32> = big.iter().map(|&v| (30.0 * (v as f64 / 30.0).tanh()) as f32).collect();
    check(&name, "softcap", &read(be, &b, len), &want, 1e-5);

    for (act, tol) in [(Activation::SiluGated, 1e-5), (Activation::GeluGated, 2e-3)] {
        let want: Vec<f32> = x.iter().zip(&y).map(|(&g, &u)| (act_ref(act, g) * u as f64) as f32).collect();
        let (gb, ub, mut out) = (up(be, &x), up(be, &y), up(be, &vec![f32::NAN; len]));
        be.glu(act, &gb, &ub, &mut out).unwrap();
        check(&name, &format!("glu {act:?}"), &read(be, &out, len), &want, tol);
        // The fused form: each row is [gate | up].
        let fused: Vec<f32> = (0..n).flat_map(|t| [&x[t * w..][..w], &y[t * w..][..w]].concat()).collect();
        let (fb, mut out) = (up(be, &fused), up(be, &vec![f32::NAN; len]));
        be.glu_fused(act, &fb, &mut out, w).unwrap();
        check(&name, &format!("glu_fused {act:?}"), &read(be, &out, len), &want, tol);
    }

    let (xb, mut d) = (up(be, &x), up(be, &vec![f32::NAN; len]));
    be.copy(&xb, &mut d).unwrap();
    check(&name, "copy", &read(be, &d, len), &x, 0.0);

    let rows = [6u32, 0, 3];
    let all = batch(&[0; 7], &[0, 1, 2, 3, 4, 5, 6], 0);
    let idx = stage(be, &all, &rows);
    let mut d = up(be, &vec![f32::NAN; rows.len() * w]);
    be.gather_rows(&xb, Staged::of(&all, &rows, &idx), w, &mut d).unwrap();
    let want: Vec<f32> = rows.iter().flat_map(|&i| x[i as usize * w..][..w].to_vec()).collect();
    check(&name, "gather_rows", &read(be, &d, want.len()), &want, 0.0);
    let idx = stage(be, &all, &[7]);
    assert!(be.gather_rows(&xb, Staged::of(&all, &[7], &idx), w, &mut d).is_err(), "{name}: a row outside the buffer must be an error");

    let (c0, dw) = (11, 29);
    let mut d = up(be, &vec![f32::NAN; n * dw]);
    be.split_cols(&xb, w, c0, &mut d, dw).unwrap();
    let want: Vec<f32> = (0..n).flat_map(|t| x[t * w + c0..][..dw].to_vec()).collect();
    check(&name, "split_cols", &read(be, &d, want.len()), &want, 0.0);

    // The residual add and the next norm: the residual written back, the normed copy out.
    for with_add in [false, true] {
        let (mut xb, yb, mut out) = (up(be, &x), up(be, &y), up(be, &vec![f32::NAN; len]));
        be.add_rms_norm(&mut xb, with_add.then_some(&yb), &gw, 1e-6, &mut out).unwrap();
        let res = if with_add { sum.clone() } else { x.clone() };
        check(&name, &format!("add_rms_norm residual (add {with_add})"), &read(be, &xb, len), &res, 1e-6);
        check(&name, &format!("add_rms_norm output (add {with_add})"), &read(be, &out, len), &rms_norm_ref(&res, &g, 1e-6), 1e-5);
    }
}

/// RoPE of `x` (`[positions, heads x head_dim]`) in f64: ggml's angles
/// (`freq_scale * pos * base^(-2i/n_rot) / factor_i`, magnitudes scaled by
/// `attn_factor`), adjacent pairs or halves, dimensions past `n_rot` untouched.
fn rope_ref(x: &[f32], positions: &[u32], head_dim: usize, p: &RopeParams, factors: Option<&[f32]>) -> Vec<f32> {
    let half = p.n_rot / 2;
    let mut out = x.to_vec();
    let row = x.len() / positions.len();
    for (t, &pos) in positions.iter().enumerate() {
        for h in out[t * row..(t + 1) * row].chunks_exact_mut(head_dim) {
            for i in 0..half {
                let ff = factors.map_or(1.0, |f| f[i] as f64);
                let theta = p.freq_scale as f64 * pos as f64 * (p.base as f64).powf(-2.0 * i as f64 / p.n_rot as f64) / ff;
                let (c, s) = (theta.cos() * p.attn_factor as f64, theta.sin() * p.attn_factor as f64);
                let (a, b) = match p.style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Halves => (i, i + half),
                };
                let (x0, x1) = (h[a] as f64, h[b] as f64);
                h[a] = (x0 * c - x1 * s) as f32;
                h[b] = (x0 * s + x1 * c) as f32;
            }
        }
    }
    out
}

/// RoPE in both pairings, whole and partial rotation, with and without
/// frequency factors, and the query/key pair form.
pub(crate) fn rope_matches_the_reference<B: DeviceBackend>(be: &B) {
    let name = be.id().to_string();
    let mut r = rng(0x5eed_0004);
    let (hd, heads, kv_heads) = (64, 3, 1);
    let positions = [0u32, 1, 7, 30, 93];
    let n = positions.len();
    let at = batch(&[0; 5], &positions, 0);
    let idx = stage(be, &at, &[]);
    let b = Staged::of(&at, &[], &idx);
    let factors: Vec<f32> = (0..hd / 2).map(|i| 1.0 + i as f32 * 0.25).collect();
    for style in [RopeStyle::Interleaved, RopeStyle::Halves] {
        for (n_rot, with_factors) in [(hd, false), (hd, true), (hd / 2, false)] {
            let p = RopeParams { style, n_rot, base: 10000.0, freq_scale: 0.5, attn_factor: 1.1 };
            let f = with_factors.then(|| vector(be, &factors[..n_rot / 2]));
            let fr = with_factors.then_some(&factors[..n_rot / 2]);
            let what = format!("rope {style:?} n_rot {n_rot} factors {with_factors}");
            let x = rand_vec(&mut r, n * heads * hd, 2.0);
            let mut xb = up(be, &x);
            be.rope(&mut xb, b, heads, hd, &p, f.as_ref()).unwrap();
            check(&name, &what, &read(be, &xb, x.len()), &rope_ref(&x, &positions, hd, &p, fr), 1e-4);
            let k = rand_vec(&mut r, n * kv_heads * hd, 2.0);
            let mut kb = up(be, &k);
            be.rope(&mut kb, b, kv_heads, hd, &p, f.as_ref()).unwrap();
            check(&name, &format!("{what} ({kv_heads} head)"), &read(be, &kb, k.len()), &rope_ref(&k, &positions, hd, &p, fr), 1e-4);
        }
    }
    let p = RopeParams { style: RopeStyle::Halves, n_rot: hd + 2, base: 1e4, freq_scale: 1.0, attn_factor: 1.0 };
    let mut xb = up(be, &vec![0.0; n * heads * hd]);
    assert!(be.rope(&mut xb, b, heads, hd, &p, None).is_err(), "{name}: n_rot past the head must be an error");
}

/// A KV cache and causal attention in f64 (keys and values rounded to f16
/// as every backend's cache stores them).
struct AttnRef {
    n_ctx: usize,
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
}

impl AttnRef {
    fn new(n_slots: usize, n_ctx: usize, kd: usize, vd: usize) -> AttnRef {
        AttnRef { n_ctx, k: vec![vec![0.0; kd]; n_slots * n_ctx], v: vec![vec![0.0; vd]; n_slots * n_ctx] }
    }

    /// `sinks`: a logit a head in each softmax's denominator (gpt-oss).
    fn run(&mut self, batch: &Batch, q: &[f32], k: &[f32], v: &[f32], p: &AttnParams, sinks: Option<&[f32]>) -> Vec<f32> {
        let (hd, hdv, n) = (p.head_dim, p.head_dim_v, batch.len());
        let (kd, vd) = (p.n_head_kv * hd, p.n_head_kv * hdv);
        let r16 = |x: &[f32]| x.iter().map(|&v| f16::from_f32(v).to_f32()).collect::<Vec<f32>>();
        for t in 0..n {
            let at = batch.seq[t] as usize * self.n_ctx + batch.pos[t] as usize;
            self.k[at] = r16(&k[t * kd..(t + 1) * kd]);
            self.v[at] = r16(&v[t * vd..(t + 1) * vd]);
        }
        let group = p.n_head / p.n_head_kv;
        let mut out = vec![0.0f32; n * p.n_head * hdv];
        for t in 0..n {
            let (s, pos) = (batch.seq[t] as usize, batch.pos[t] as usize);
            let lo = p.window.map_or(0, |w| (pos + 1).saturating_sub(w as usize));
            for h in 0..p.n_head {
                let kvh = h / group;
                let qh = &q[(t * p.n_head + h) * hd..][..hd];
                let scores: Vec<f64> = (lo..=pos)
                    .map(|j| {
                        let kr = &self.k[s * self.n_ctx + j][kvh * hd..][..hd];
                        let d = qh.iter().zip(kr).map(|(&a, &b)| a as f64 * b as f64).sum::<f64>() * p.scale as f64;
                        p.softcap.map_or(d, |c| c as f64 * (d / c as f64).tanh())
                    })
                    .collect();
                let sink = sinks.map(|s| s[h] as f64);
                let m = scores.iter().cloned().fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
                for c in 0..hdv {
                    let o: f64 = (lo..=pos).zip(&e).map(|(j, w)| w * self.v[s * self.n_ctx + j][kvh * hdv + c] as f64).sum();
                    out[(t * p.n_head + h) * hdv + c] = (o / z) as f32;
                }
            }
        }
        out
    }
}

/// Attention over the backend's KV cache: two sequences in two slots, a
/// prompt then decode steps, grouped heads, sliding windows and softcaps,
/// a batch that mixes slots, against the f64 reference.
pub(crate) fn attention_matches_the_reference<B: DeviceBackend>(be: &B) {
    let name = be.id().to_string();
    let mut r = rng(0x5eed_0005);
    let shapes = [
        AttnParams { n_head: 4, n_head_kv: 2, head_dim: 64, head_dim_v: 64, scale: 0.125, softcap: None, window: None },
        AttnParams { n_head: 6, n_head_kv: 1, head_dim: 128, head_dim_v: 128, scale: 0.09, softcap: Some(20.0), window: Some(5) },
        AttnParams { n_head: 3, n_head_kv: 3, head_dim: 40, head_dim_v: 40, scale: 0.2, softcap: None, window: None },
    ];
    for p in shapes {
        let (kd, vd, (n_slots, n_ctx)) = (p.n_head_kv * p.head_dim, p.n_head_kv * p.head_dim_v, (2, 48));
        let mut kv = be.kv_cache(n_slots, n_ctx, &[kd, kd], &[vd, vd]).unwrap();
        let mut want_cache = AttnRef::new(n_slots, n_ctx, kd, vd);
        // Slot 1: a 13-token prompt; slot 0: a 9-token prompt; then three
        // steps decoding both slots in one batch.
        let mut steps = vec![Batch::default(), Batch::default()];
        (0..13).for_each(|i| steps[0].push(0, i, 1, true));
        (0..9).for_each(|i| steps[1].push(0, i, 0, true));
        for s in 0..3 {
            let mut b = Batch::default();
            b.push(0, 9 + s, 0, true);
            b.push(0, 13 + s, 1, true);
            steps.push(b);
        }
        for (i, batch) in steps.iter().enumerate() {
            let (got, want) = attention_step(be, &mut r, &mut kv, &mut want_cache, batch, &p, None).unwrap();
            check(&name, &format!("attention {p:?} step {i}"), &got, &want, 3e-3);
        }
        let mut bad = Batch::default();
        bad.push(0, n_ctx as u32, 0, true);
        let (q, k, v) = (up(be, &vec![0.0; p.n_head * p.head_dim]), up(be, &vec![0.0; kd]), up(be, &vec![0.0; vd]));
        let mut out = up(be, &vec![0.0; p.n_head * p.head_dim_v]);
        let idx = stage(be, &bad, &[]);
        assert!(be.attention(&mut kv, 1, Staged::of(&bad, &[], &idx), [&q, &k, &v], &mut out, &p).is_err(), "{name}: a position past the cache must be an error");
    }
    // Attention sinks (gpt-oss's shape: heads of 64, a window), where the
    // backend has them: a prompt and two decode steps, the sinks wide
    // enough to take a real share of each softmax.
    let p = AttnParams { n_head: 8, n_head_kv: 2, head_dim: 64, head_dim_v: 64, scale: 0.125, softcap: None, window: Some(7) };
    let (kd, vd, n_ctx) = (p.n_head_kv * p.head_dim, p.n_head_kv * p.head_dim_v, 32);
    let mut kv = be.kv_cache(1, n_ctx, &[kd, kd], &[vd, vd]).unwrap();
    let mut want_cache = AttnRef::new(1, n_ctx, kd, vd);
    let sinks = rand_vec(&mut r, p.n_head, 3.0);
    let sinks_dev = vector(be, &sinks);
    let mut steps = vec![Batch::default()];
    (0..11).for_each(|i| steps[0].push(0, i, 0, true));
    for s in 0..2 {
        let mut b = Batch::default();
        b.push(0, 11 + s, 0, true);
        steps.push(b);
    }
    for (i, batch) in steps.iter().enumerate() {
        match attention_step(be, &mut r, &mut kv, &mut want_cache, batch, &p, Some((&sinks, &sinks_dev))) {
            Err(e) if e.0.contains("has no attention-sinks kernel") => {
                eprintln!("NOT CHECKED on {name}: attention sinks (no kernel: {e})");
                return;
            }
            step => {
                let (got, want) = step.unwrap();
                check(&name, &format!("attention with sinks {p:?} step {i}"), &got, &want, 3e-3);
            }
        }
    }
}

/// One step of [`attention_matches_the_reference`]: random q, k, v for
/// `batch`, through the backend's attention (with `sinks`, host and placed
/// copies, its `attention_sinks`) and the f64 reference: (got, want).
#[allow(clippy::too_many_arguments)]
fn attention_step<B: DeviceBackend>(
    be: &B,
    r: &mut SplitMix64,
    kv: &mut B::Kv,
    want_cache: &mut AttnRef,
    batch: &Batch,
    p: &AttnParams,
    sinks: Option<(&[f32], &B::Vector)>,
) -> Result<(Vec<f32>, Vec<f32>), BackendError> {
    let (n, kd, vd) = (batch.len(), p.n_head_kv * p.head_dim, p.n_head_kv * p.head_dim_v);
    let q = rand_vec(r, n * p.n_head * p.head_dim, 1.0);
    let k = rand_vec(r, n * kd, 1.0);
    let v = rand_vec(r, n * vd, 1.0);
    let want = want_cache.run(batch, &q, &k, &v, p, sinks.map(|s| s.0));
    let mut out = up(be, &vec![f32::NAN; want.len()]);
    let idx = stage(be, batch, &[]);
    let (b, qkv) = (Staged::of(batch, &[], &idx), [&up(be, &q), &up(be, &k), &up(be, &v)]);
    match sinks {
        Some((_, placed)) => be.attention_sinks(kv, 1, b, qkv, &mut out, p, placed)?,
        None => be.attention(kv, 1, b, qkv, &mut out, p)?,
    }
    Ok((read(be, &out, want.len()), want))
}

/// The activation buffers of one block test, as `Scratch` borrows them.
struct Bufs<Buf> {
    all: Vec<Buf>,
    qkv: Option<Buf>,
}

impl<Buf> Bufs<Buf> {
    fn scratch(&mut self, pending: bool) -> super::Scratch<'_, Buf> {
        let [x, cur, q, k, v, attn, o, gate, up, h] = &mut self.all[..] else { unreachable!("ten buffers") };
        super::Scratch { x, cur, q, k, v, qkv: self.qkv.as_mut(), attn, o, gate, up, h, pending }
    }
}

/// A block's weights: `(name, kind, rows, cols, values)`.
type BlockTensors = Vec<(String, QuantKind, usize, usize, Vec<u8>)>;

/// The blocks as a backend runs them (its fusions: `attention_block` and
/// `ffn_block` overridden) against the CPU's composition of plain ops, one
/// layer in each form a model takes — separate Q/K/V without biases (the
/// form the fused decode launches take), with biases, per-head norms and
/// post-norms, a fused Q/K/V and a fused gate/up — a residual output
/// pending on entry or not, over a prompt and then decode steps into the
/// same cache, per weight kind.
pub(crate) fn blocks_match_the_cpu<B: DeviceBackend>(be: &B) {
    use super::{AttnBlock, FfnBlock, QkvWeights};
    let name = be.id().to_string();
    let cpu = super::cpu::Cpu::new(2);
    let mut r = rng(0x5eed_0006);
    let (e, nh, nkv, hd, ff) = (256usize, 4usize, 2usize, 64usize, 512usize);
    let (qd, kd) = (nh * hd, nkv * hd);
    // Scores of random projections are large (q·k ~ 200): a scale that keeps the softmax
    // smooth, where a near-one-hot softmax would amplify activation rounding into flips.
    let attn = AttnParams { n_head: nh, n_head_kv: nkv, head_dim: hd, head_dim_v: hd, scale: 0.002, softcap: None, window: None };
    let rope = RopeParams { style: RopeStyle::Halves, n_rot: hd, base: 10000.0, freq_scale: 1.0, attn_factor: 1.0 };
    let mut worst = Vec::new();
    for kind in [QuantKind::F16, QuantKind::Q8_0, QuantKind::Q4K] {
        let mut worst_kind = 0.0f64;
        for form in ["plain", "biased-normed", "fused", "plain-pending"] {
            let mut t: BlockTensors = Vec::new();
            let mut mat = |t: &mut BlockTensors, n: &str, rows, cols| t.push((n.into(), kind, rows, cols, matrix(&mut r, kind, rows, cols).0));
            if form == "fused" {
                mat(&mut t, "qkv", qd + 2 * kd, e);
                mat(&mut t, "gate_up", 2 * ff, e);
            } else {
                mat(&mut t, "q", qd, e);
                mat(&mut t, "k", kd, e);
                mat(&mut t, "v", kd, e);
                mat(&mut t, "gate", ff, e);
                mat(&mut t, "up", ff, e);
            }
            mat(&mut t, "out", e, qd);
            mat(&mut t, "down", e, ff);
            let w = Weights::new(&t);
            let norm = rand_vec(&mut r, e, 1.0);
            let (hn, bq, bk, pn) = (rand_vec(&mut r, hd, 1.0), rand_vec(&mut r, qd, 0.5), rand_vec(&mut r, kd, 0.5), rand_vec(&mut r, e, 1.0));
            let biased = form == "biased-normed";
            let mut kv_be = be.kv_cache(1, 16, &[kd], &[kd]).unwrap();
            let mut kv_cpu = cpu.kv_cache(1, 16, &[kd], &[kd]).unwrap();
            let steps: [&[u32]; 3] = [&[0, 1, 2, 3, 4], &[5], &[6]];
            for (step, pos) in steps.iter().enumerate() {
                let n = pos.len();
                let bt = batch(&vec![0; n], pos, 0);
                let x = rand_vec(&mut r, n * e, 1.0);
                let o = rand_vec(&mut r, n * e, 1.0);
                let pending = form == "plain-pending";
                // One run of both blocks on a backend; the residual stream
                // and the pending output after each.
                macro_rules! run {
                    ($be:expr, $kv:expr) => {{
                        let be = $be;
                        let (m, v) = (|n: &str| w.place(be, n), |x: &[f32]| vector(be, x));
                        let (fused, mats) = (form == "fused", ["q", "k", "v", "gate", "up"]);
                        let sep: Vec<_> = if fused { Vec::new() } else { mats.iter().map(|n| m(n)).collect() };
                        let (wqkv, wgu) = if fused { (Some(m("qkv")), Some(m("gate_up"))) } else { (None, None) };
                        let (out, down) = (m("out"), m("down"));
                        let (nv, hv, bqv, bkv, pnv) = (v(&norm), v(&hn), v(&bq), v(&bk), v(&pn));
                        let len = |w: usize| n * w;
                        let sizes = [e, e, qd, kd, kd, qd, e, ff, if fused { 2 * ff } else { ff }, ff];
                        let mut bufs = Bufs {
                            all: sizes.iter().map(|&s| be.upload(&vec![f32::NAN; len(s)]).unwrap()).collect(),
                            qkv: fused.then(|| be.alloc(len(qd + 2 * kd)).unwrap()),
                        };
                        bufs.all[0] = be.upload(&x).unwrap();
                        bufs.all[6] = be.upload(&o).unwrap();
                        let ab = AttnBlock {
                            layer: 0,
                            eps: 1e-6,
                            norm: &nv,
                            qkv: match &wqkv {
                                Some(f) => QkvWeights::Fused(f, None),
                                None => QkvWeights::Separate([&sep[0], &sep[1], &sep[2]], [biased.then_some(&bqv), biased.then_some(&bkv), None]),
                            },
                            qk_norm: biased.then_some((&hv, &hv)),
                            out: &out,
                            out_bias: None,
                            post_norm: biased.then_some(&pnv),
                            rope,
                            factors: None,
                            attn,
                            sinks: None,
                        };
                        let fb = FfnBlock {
                            eps: 1e-6,
                            act: Activation::SiluGated,
                            norm: &nv,
                            gate: if fused { None } else { Some(&sep[3]) },
                            up: wgu.as_ref().unwrap_or_else(|| &sep[4]),
                            down: &down,
                            post_norm: biased.then_some(&pnv),
                            n_ff: ff,
                        };
                        let idx = stage(be, &bt, &[]);
                        let mut s = bufs.scratch(pending);
                        be.attention_block($kv, Staged::of(&bt, &[], &idx), &ab, &mut s).unwrap();
                        let after_attn = (s.pending, read(be, s.x, n * e), if s.pending { read(be, s.o, n * e) } else { Vec::new() });
                        be.ffn_block(n, &fb, &mut s).unwrap();
                        let after_ffn = (s.pending, read(be, s.x, n * e), if s.pending { read(be, s.o, n * e) } else { Vec::new() });
                        [after_attn, after_ffn]
                    }};
                }
                let got = run!(be, &mut kv_be);
                let want = run!(&cpu, &mut kv_cpu);
                for (part, (g, w)) in ["attention", "ffn"].iter().zip(got.iter().zip(&want)) {
                    let what = format!("{part} block, {form}, {kind}, step {step} ({n} tokens)");
                    assert_eq!(g.0, w.0, "{name} {what}: output pending {} where the CPU's is {}", g.0, w.0);
                    // Activations are quantized per backend; the block's error compounds a few products.
                    let tol = if kind == QuantKind::F16 { 1e-2 } else { 4e-2 };
                    check(&name, &format!("{what}: residual"), &g.1, &w.1, tol);
                    check(&name, &format!("{what}: pending output"), &g.2, &w.2, tol);
                    worst_kind = worst_kind.max(rel(&g.1, &w.1)).max(if g.0 { rel(&g.2, &w.2) } else { 0.0 });
                }
            }
        }
        worst.push(format!("{kind} {worst_kind:.1e}"));
    }
    eprintln!("{name} blocks vs the CPU, largest relative error per kind: {}", worst.join(", "));
}

/// A mixture-of-experts block as a backend runs it against the CPU's (the
/// router read back, routes chosen on the host, each expert's rows
/// multiplied): per claimed kind among those a model's experts come in, a
/// prompt and single tokens, routing weights normalized or scaled, with and
/// without a post-norm. The experts are 8 of 256 x 256, 3 per token.
pub(crate) fn moe_block_matches_the_cpu<B: DeviceBackend>(be: &B, claims: impl Fn(QuantKind) -> bool) {
    use super::MoeBlock;
    let name = be.id().to_string();
    if be.id() == Backend::Cpu {
        eprintln!("the CPU is the reference of the mixture-of-experts block");
        return;
    }
    let cpu = super::cpu::Cpu::new(2);
    let mut r = rng(0x5eed_0007);
    let (e, ff, ne, k) = (256usize, 256usize, 8usize, 3usize);
    let mut worst = Vec::new();
    let kinds = [QuantKind::F16, QuantKind::Q8_0, QuantKind::Q4_0, QuantKind::Q5_0, QuantKind::Q4K, QuantKind::Q5K, QuantKind::Q6K, QuantKind::IQ4XS];
    for kind in kinds.into_iter().filter(|&k| claims(k)) {
        let mut t: BlockTensors = Vec::new();
        t.push(("router".into(), QuantKind::F32, ne, e, matrix(&mut r, QuantKind::F32, ne, e).0));
        for (n, rows, cols) in [("gate", ff, e), ("up", ff, e), ("down", e, ff)] {
            t.push((n.into(), kind, ne * rows, cols, matrix(&mut r, kind, ne * rows, cols).0));
        }
        let w = Weights::new(&t);
        let (norm, pn) = (rand_vec(&mut r, e, 1.0), rand_vec(&mut r, e, 1.0));
        let mut worst_kind = 0.0f64;
        // The scale shows only without a post-norm (a norm undoes it).
        for (case, (norm_weights, scale, post)) in [(true, 1.0f32, false), (false, 2.5, false), (false, 2.5, true)].into_iter().enumerate() {
            let experts = crate::model::Experts { n_expert: ne, n_used: k, n_ff: ff, norm_weights, scale, ..Default::default() };
            for n in [5usize, 1, 13, 70] {
                let x = rand_vec(&mut r, n * e, 1.0);
                macro_rules! run {
                    ($be:expr) => {{
                        let be = $be;
                        let m = |n: &str| w.place(be, n);
                        let (router, gate, up, down) = (m("router"), m("gate"), m("up"), m("down"));
                        let (nv, pnv) = (vector(be, &norm), vector(be, &pn));
                        let wide = ne.max(k * ff).max(k * e);
                        let sizes = [e, e, 2 * k, 1, 1, 1, e, wide, k * ff, k * ff];
                        let mut bufs = Bufs { all: sizes.iter().map(|&s| be.upload(&vec![f32::NAN; n * s]).unwrap()).collect(), qkv: None };
                        bufs.all[0] = be.upload(&x).unwrap();
                        let mb = MoeBlock {
                            eps: 1e-6,
                            act: Activation::SiluGated,
                            norm: &nv,
                            router: &router,
                            gate: &gate,
                            up: &up,
                            down: &down,
                            post_norm: post.then_some(&pnv),
                            n_embd: e,
                            experts,
                            shared: None,
                            biases: None,
                        };
                        let mut s = bufs.scratch(false);
                        be.moe_block(n, &mb, &mut s).unwrap();
                        (s.pending, read(be, s.x, n * e), if s.pending { read(be, s.o, n * e) } else { Vec::new() })
                    }};
                }
                let got = run!(be);
                let want = run!(&cpu);
                let what = format!("experts block, {kind}, case {case}, {n} tokens");
                assert_eq!(got.0, want.0, "{name} {what}: output pending {} where the CPU's is {}", got.0, want.0);
                let tol = if kind == QuantKind::F16 { 1e-2 } else { 4e-2 };
                check(&name, &format!("{what}: residual"), &got.1, &want.1, tol);
                check(&name, &format!("{what}: pending output"), &got.2, &want.2, tol);
                worst_kind = worst_kind.max(rel(&got.1, &want.1)).max(rel(&got.2, &want.2));
            }
        }
        worst.push(format!("{kind} {worst_kind:.1e}"));
    }
    if worst.is_empty() {
        // No expert kernels: the plan refuses a model with experts before a
        // weight is read (`BackendCaps::experts_kernel`), and the tiny
        // mixture-of-experts models are checked to be refused.
        eprintln!("{name} has no mixture-of-experts kernels: the experts block is not run");
        return;
    }
    eprintln!("{name} experts block vs the CPU, largest relative error per kind: {}", worst.join(", "));
}

/// The tiny random-weight model of `arch` drawn from `seed`, written to a
/// scratch file.
fn tiny(case: crate::testing::TinyCase, tag: &str, seed: u64) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("ferrox-conf-{tag}-{}-{seed}-{}.gguf", case.label, std::process::id()));
    crate::testing::tiny_model(case, seed).unwrap().write_to(&path).unwrap();
    path
}

/// A routing margin (the logit gap between the last expert chosen and the
/// first passed over, [`super::blocks::margins`]) below this is a near tie:
/// another backend's rounding of the router's input (f16 GEMMs upstream,
/// other summation orders) may choose the other expert, and the token's
/// output then differs by a whole expert's share — no kernel's fault, as a
/// near tie of the top two logits is none. Measured: CUDA chose otherwise
/// at margins of about 5e-4 and 6e-3.
const ROUTE_TIE: f32 = 2e-2;

/// The greedy path [`every_architecture_follows_the_cpu`] takes on the CPU
/// (the prompt, then 16 steps): the smallest routing margin along it.
fn cpu_path_margin(path: &std::path::Path) -> f32 {
    let cpu = Model::open(path, super::cpu::Cpu::new(2)).unwrap();
    let n_vocab = cpu.n_vocab();
    let prompt = crate::testing::tiny_tokens();
    let mut ctx = cpu.new_context(96, 1).unwrap();
    let mut b = Batch::default();
    for (i, &t) in prompt.iter().enumerate() {
        b.push(t, i as u32, 0, true);
    }
    let (mut h, m) = super::blocks::margins::watch(|| cpu.forward(&mut ctx, &b).unwrap());
    let mut least = m.into_iter().fold(f32::INFINITY, f32::min);
    for pos in (prompt.len() as u32..).take(16) {
        let mut b = Batch::default();
        b.push(top2(&h[h.len() - n_vocab..]).0 as u32, pos, 0, true);
        let (next, m) = super::blocks::margins::watch(|| cpu.forward(&mut ctx, &b).unwrap());
        h = next;
        least = m.into_iter().fold(least, f32::min);
    }
    least
}

/// The seed of `case`'s tiny model for [`every_architecture_follows_the_cpu`]:
/// 11, or for a mixture of experts the first seed from 11 whose CPU path
/// routes every token with a margin of at least [`ROUTE_TIE`]. Chosen from
/// the reference alone, before any device runs.
fn calm_seed(case: crate::testing::TinyCase) -> u64 {
    if !case.experts {
        return 11;
    }
    for seed in 11..=74 {
        let path = tiny(case, "calm", seed);
        let least = cpu_path_margin(&path);
        let _ = std::fs::remove_file(&path);
        if least >= ROUTE_TIE {
            eprintln!("{}: seed {seed} (its path's least routing margin {least:.1e})", case.label);
            return seed;
        }
    }
    panic!("{}: no seed in 11..=74 routes the test's path without a near tie", case.label)
}

/// The last position of `tokens` up to `upto` whose routing on the CPU is a
/// near tie (margin below [`ROUTE_TIE`]), and that margin.
fn routing_tie_before(path: &std::path::Path, tokens: &[u32], upto: usize) -> Option<(usize, f32)> {
    let cpu = Model::open(path, super::cpu::Cpu::new(2)).unwrap();
    let mut ctx = cpu.new_context(64, 1).unwrap();
    let mut b = Batch::default();
    for (i, &t) in tokens.iter().enumerate() {
        b.push(t, i as u32, 0, true);
    }
    let (_, m) = super::blocks::margins::watch(|| cpu.forward(&mut ctx, &b).unwrap());
    m.into_iter().enumerate().take(upto + 1).filter(|&(_, g)| g < ROUTE_TIE).last()
}

fn top2(v: &[f32]) -> (usize, f32) {
    let mut s: Vec<(usize, f32)> = v.iter().copied().enumerate().collect();
    s.sort_by(|a, b| b.1.total_cmp(&a.1));
    (s[0].0, s[0].1 - s[1].1)
}

/// Logits close, and the top token the same wherever the reference's top
/// two are not a near tie (backends quantize activations differently).
fn agree(what: &str, got: &[f32], want: &[f32], n_vocab: usize) {
    let e = rel(got, want);
    assert!(e < 3e-2, "{what}: logits differ by {e:e} relative");
    for (i, (g, h)) in got.chunks(n_vocab).zip(want.chunks(n_vocab)).enumerate() {
        let ((tg, _), (th, margin)) = (top2(g), top2(h));
        let scale = h.iter().fold(0.0f32, |a, &x| a.max(x.abs()));
        if margin > 2e-2 * scale {
            assert_eq!(tg, th, "{what}: position {i} top-1 {tg}, reference {th} (margin {margin})");
        }
    }
}

/// `path` loaded on `be`, or `None`, loudly, where `be`'s plan refuses a
/// mixture of experts (a backend without expert kernels yet); any other
/// failure fails the test.
pub(crate) fn load_or_refused<B: DeviceBackend>(path: &std::path::Path, be: B, case: crate::testing::TinyCase) -> Option<Model<B>> {
    let name = be.id();
    let arch = case.label;
    match Model::open(path, be) {
        Ok(m) => Some(m),
        Err(crate::model::ModelError::Unsupported { what }) if case.experts && what.contains("mixture-of-experts") => {
            eprintln!("NOT CHECKED on {name}: {arch} (its plan refuses it: {what})");
            None
        }
        Err(e) => panic!("{name} {arch}: {e}"),
    }
}

/// Every architecture's tiny model: a prompt's logits at every position,
/// then greedy decode steps one token a pass (each step's argmax also taken
/// on the device, as `ferrox run` does), against the CPU — teacher-forced
/// on the CPU's tokens so one near tie cannot cascade. A mixture of experts
/// is drawn from a seed whose path routes without a near tie ([`calm_seed`]).
pub(crate) fn every_architecture_follows_the_cpu<B: DeviceBackend>(open: impl Fn() -> Option<B>) {
    use crate::backend::cpu::Cpu;
    for case in crate::testing::tiny_cases() {
        let arch = case.label;
        let Some(be) = open() else { return };
        let name = be.id();
        let seed = calm_seed(case);
        let path = tiny(case, name.name(), seed);
        let cpu = Model::open(&path, Cpu::new(2)).unwrap();
        let dev = load_or_refused(&path, be, case);
        let _ = std::fs::remove_file(&path);
        let Some(dev) = dev else { continue };
        let n_vocab = cpu.n_vocab();
        let prompt = crate::testing::tiny_tokens();
        let (mut hctx, mut dctx, mut actx) = (cpu.new_context(96, 1).unwrap(), dev.new_context(96, 1).unwrap(), dev.new_context(96, 1).unwrap());
        let mut b = Batch::default();
        for (i, &t) in prompt.iter().enumerate() {
            b.push(t, i as u32, 0, true);
        }
        let (mut h, mut d) = (cpu.forward(&mut hctx, &b).unwrap(), dev.forward(&mut dctx, &b).unwrap());
        agree(&format!("{name} {arch:?} prompt"), &d, &h, n_vocab);
        let mut ids = dev.forward_argmax(&mut actx, &b).unwrap();
        for (step, pos) in (0..16).zip(prompt.len() as u32..) {
            let last = &h[h.len() - n_vocab..];
            let (next, margin) = top2(last);
            let scale = last.iter().fold(0.0f32, |a, &x| a.max(x.abs()));
            if margin > 2e-2 * scale {
                assert_eq!(*ids.last().unwrap() as usize, next, "{name} {arch:?} step {step}: device argmax vs the CPU");
            }
            let mut b = Batch::default();
            b.push(next as u32, pos, 0, true);
            h = cpu.forward(&mut hctx, &b).unwrap();
            d = dev.forward(&mut dctx, &b).unwrap();
            agree(&format!("{name} {arch:?} step {step}"), &d, &h, n_vocab);
            ids = dev.forward_argmax(&mut actx, &b).unwrap();
        }
    }
}

/// A server's steps on the tiny llama model: three sequences prefilled in
/// one pass, then passes of one token per sequence with every row's logits
/// (the slots in changing order, one sequence sitting a step out, one
/// sequence verifying three tokens of its own in a pass of the same size),
/// every pass against the CPU's, teacher-forced on its tokens. A backend
/// that records batches ([`DeviceBackend::records`]: CUDA graphs) replays
/// the same-size passes from the third on, so a recording that kept a
/// step's positions, slots or tokens instead of reading the staged lists
/// fails here.
pub(crate) fn batched_steps_follow_the_cpu<B: DeviceBackend>(open: impl Fn() -> Option<B>) {
    use crate::backend::cpu::Cpu;
    let case = crate::testing::tiny_cases().into_iter().find(|c| c.label == "llama").expect("the tiny llama case");
    let Some(be) = open() else { return };
    let name = be.id();
    let path = tiny(case, &format!("{name}-steps"), 11);
    let cpu = Model::open(&path, Cpu::new(2)).unwrap();
    let dev = Model::open(&path, be).unwrap();
    let _ = std::fs::remove_file(&path);
    let n_vocab = cpu.n_vocab();
    let (mut hctx, mut dctx) = (cpu.new_context(64, 3).unwrap(), dev.new_context(64, 3).unwrap());
    let prompt = crate::testing::tiny_tokens();
    let mut pos = [5u32, 8, 11];
    let mut b = Batch::default();
    for (s, &len) in pos.iter().enumerate() {
        for (i, &t) in prompt[..len as usize].iter().enumerate() {
            b.push(t, i as u32, s as u32, i + 1 == len as usize);
        }
    }
    let mut h = cpu.forward(&mut hctx, &b).unwrap();
    agree(&format!("{name} three prompts"), &dev.forward(&mut dctx, &b).unwrap(), &h, n_vocab);
    let mut next: Vec<u32> = h.chunks(n_vocab).map(|r| top2(r).0 as u32).collect();
    for step in 0..10 {
        // The slots this pass takes, in order: rotated each step; slot 1 out at step 4.
        let order: Vec<usize> = match step {
            4 => vec![2, 0],
            _ => (0..3).map(|i| (i + step) % 3).collect(),
        };
        let mut b = Batch::default();
        if step == 6 {
            // Slot 0 verifies three tokens in one pass (a speculative check's
            // shape), the same size as the other passes but one slot's.
            for i in 0..3u32 {
                b.push(if i == 0 { next[0] } else { prompt[i as usize] }, pos[0] + i, 0, true);
            }
        } else {
            for &s in &order {
                b.push(next[s], pos[s], s as u32, true);
            }
        }
        h = cpu.forward(&mut hctx, &b).unwrap();
        agree(&format!("{name} step {step} (slots {:?}, positions {:?})", b.seq, b.pos), &dev.forward(&mut dctx, &b).unwrap(), &h, n_vocab);
        for (r, row) in h.chunks(n_vocab).enumerate() {
            let s = b.seq[r] as usize;
            pos[s] = b.pos[r] + 1;
            next[s] = top2(row).0 as u32;
        }
    }
}

/// A file of `testdata/llama_ref/` (from the source tree, or from the
/// working directory on a machine the test binary was carried to).
fn llama_ref(name: &str) -> std::path::PathBuf {
    let built = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/llama_ref").join(name);
    if built.exists() {
        return built;
    }
    std::path::Path::new("crates/ferrox-core/testdata/llama_ref").join(name)
}

/// Every architecture's tiny model (seed 42, the file llama.cpp ran:
/// its SHA-256 is checked), and the tiny files llama-quantize made
/// (committed, hash checked too), against llama.cpp's logits at every prompt
/// position (`testdata/llama_ref/tiny/`, `tools/refllama/gen.py`): top-1
/// the same unless llama.cpp's own top two are a near tie, every logit
/// within 0.08 (random weights make these models maximally sensitive to
/// rounding: float models agree to ~1e-3, 4-bit ones to a few 1e-2).
pub(crate) fn every_architecture_matches_llama_cpp<B: DeviceBackend>(open: impl Fn() -> Option<B>) {
    use sha2::Digest;
    let mut checked = Vec::new();
    let regenerated = crate::testing::tiny_cases().into_iter().map(|c| (c, false));
    for (case, committed) in regenerated.chain(crate::testing::llama_quantized_tiny_cases().into_iter().map(|c| (c, true))) {
        let arch = case.label;
        let Some(be) = open() else { return };
        let name = be.id();
        let reference = llama_ref(&format!("tiny/tiny-{arch}.json"));
        let text = std::fs::read_to_string(&reference)
            .unwrap_or_else(|e| panic!("{}: {e} (every architecture needs llama.cpp reference logits)", reference.display()));
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        // The CPU and the split-over-CPU suites both name themselves "cpu"
        // and run at once: a counter keeps their files apart.
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let nth = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = match committed {
            true => llama_ref(&format!("tiny/tiny-{arch}.gguf")),
            false => {
                let path = std::env::temp_dir().join(format!("ferrox-conf-ref-{name}-{arch}-{}-{nth}.gguf", std::process::id()));
                crate::testing::tiny_model(case, 42).unwrap().write_to(&path).unwrap();
                path
            }
        };
        let sha = format!("{:x}", sha2::Sha256::digest(std::fs::read(&path).unwrap()));
        assert_eq!(sha, r["model_sha256"].as_str().unwrap(), "{arch}: the tiny model is not the one llama.cpp ran");
        let tokens: Vec<u32> = r["prompt_tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
        let want: Vec<Vec<f32>> = r["all_logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|row| row.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
            .collect();
        let model = load_or_refused(&path, be, case);
        let Some(model) = model else {
            if !committed {
                let _ = std::fs::remove_file(&path);
            }
            continue;
        };
        let mut ctx = model.new_context(64, 1).unwrap();
        let mut b = Batch::default();
        for (i, &t) in tokens.iter().enumerate() {
            b.push(t, i as u32, 0, true);
        }
        let got = model.forward(&mut ctx, &b).unwrap();
        assert_eq!(want.len(), tokens.len(), "{arch}: reference positions");
        let tie = r["near_tie_threshold"].as_f64().unwrap() as f32;
        // Per position: the largest |diff| and what is wrong there, if anything.
        let mut seen = Vec::new();
        for (p, (g, w)) in got.chunks(model.n_vocab()).zip(&want).enumerate() {
            assert_eq!(g.len(), w.len(), "{name} {arch}: vocabulary size");
            let (gm, wm) = (top2(g).0, top2(w).0);
            let d = g.iter().zip(w).fold(0.0f32, |m, (a, b)| m.max((a - b).abs()));
            let wrong = if gm != wm && w[wm] - w[gm] >= tie {
                Some(format!("top-1 differs at position {p}: {gm} vs llama.cpp's {wm}"))
            } else if d >= 0.08 {
                Some(format!("logits differ from llama.cpp's by up to {d} at position {p}"))
            } else {
                None
            };
            seen.push((d, wrong));
        }
        // A mixture of experts may route a token the other way where its
        // routing is a near tie: from the last such position before the
        // first difference on (later ones attend to it), differences are
        // excused, loudly.
        let mut upto = seen.len();
        if let Some(first) = seen.iter().position(|(_, w)| w.is_some()) {
            let why = seen[first].1.clone().unwrap_or_default();
            match case.experts.then(|| routing_tie_before(&path, &tokens, first)).flatten() {
                Some((q, margin)) if q <= first => {
                    eprintln!("NOT COMPARED on {name}: {arch} from position {q} (a routing near tie there, margin {margin:.1e} < {ROUTE_TIE:e}; {why})");
                    upto = q;
                }
                _ => panic!("{name} {arch}: {why}"),
            }
        }
        if !committed {
            let _ = std::fs::remove_file(&path);
        }
        let max = seen[..upto].iter().fold(0.0f32, |m, s| m.max(s.0));
        checked.push(format!("{arch}: max |diff| {max:.4}"));
    }
    eprintln!("{}", checked.join("; "));
}

/// The per-kind files of `testdata/llama_ref/quant/` and each kind's bound
/// `δ` on |ferrox − llama.cpp| over llama.cpp's top-16 logits at every
/// position (prompt and teacher-forced greedy steps), and `ρ` on their RMS.
///
/// How the bounds are derived. The F16 file measures the two engines' path
/// difference with the weights exactly equal and activations rounded to f16
/// (relative step 2^-11) before each product: ferrox's CPU is within 0.05 of
/// llama.cpp there (logits of std ~8, top ~30; position 0, where attention
/// is a copy, within 0.001). F16's bound is twice that. Every quantized kind
/// rounds activations to 8 bits per block (Q8_0 or Q8_K, step 1/127 of the
/// block's largest, ~16x f16's) in both engines; with the same weights and
/// inputs the two round identically (position 0 of Q8_0, Q6_K, Q5_K_M and
/// Q4_0 agrees to the bit), but any last-bit difference upstream (attention
/// order, the f16 KV cache) flips some 8-bit roundings, and each flip is a
/// whole step, which this model's gain carries to the logits: F16's 0.05 x 16
/// ≈ 0.8, so δ = 1.0 for every quantized kind (the CPU measures 0.37 for Q8_0
/// up to 0.77). The RMS stays far lower (flips are sporadic): F16's 0.01
/// measured, 0.02 bound, x16 ≈ 0.3 for the quantized kinds (measured
/// 0.11-0.17); it is what catches a systematic error. A wrong kernel (a scale misread, a block
/// misplaced) moves logits by whole units. The top-1 threshold follows from
/// `δ`: if every logit is within `δ`, the engine's top token has a llama.cpp
/// logit within `2δ` of llama.cpp's top, so `2δ` is the margin beyond which
/// the top token must be llama.cpp's.
const QUANT_KINDS: [(&str, f32, f32); 6] =
    [("f16", 0.1, 0.02), ("q8_0", 1.0, 0.3), ("q6_k", 1.0, 0.3), ("q5_k_m", 1.0, 0.3), ("q4_k_m", 1.0, 0.3), ("q4_0", 1.0, 0.3)];

/// A tiny Llama (every row 256 wide, logits of std ~8) in F16 and as
/// llama-quantize made it in Q8_0, Q6_K, Q5_K_M, Q4_K_M and Q4_0 (the files
/// and their SHA-256 are committed; F16 is rewritten from its seed and
/// checked), against llama.cpp's logits for a 48-token prompt at every
/// position and 15 greedy steps teacher-forced on llama.cpp's tokens (`gen.py
/// quant`). Per kind (bounds and their derivation at [`QUANT_KINDS`]): every
/// compared logit within `δ`; the engine's top token never more than `2δ`
/// below llama.cpp's top logit, which means the same top token wherever
/// llama.cpp's top-2 margin exceeds `2δ`.
pub(crate) fn every_kind_matches_llama_cpp<B: DeviceBackend>(open: impl Fn() -> Option<B>) {
    use sha2::Digest;
    let mut report = Vec::new();
    for (file, bound, rms_bound) in QUANT_KINDS {
        let Some(be) = open() else { return };
        let name = be.id();
        let reference = llama_ref(&format!("quant/llama-{file}.json"));
        let text = std::fs::read_to_string(&reference).unwrap_or_else(|e| panic!("{}: {e}", reference.display()));
        let r: serde_json::Value = serde_json::from_str(&text).unwrap();
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let scratch = std::env::temp_dir().join(format!("ferrox-conf-quant-{name}-{}-{n}.gguf", std::process::id()));
        let path = if file == "f16" {
            crate::testing::quant_ref_model(crate::testing::QUANT_REF_SEED).unwrap().write_to(&scratch).unwrap();
            scratch.clone()
        } else {
            llama_ref(&format!("quant/llama-{file}.gguf"))
        };
        let sha = format!("{:x}", sha2::Sha256::digest(std::fs::read(&path).unwrap()));
        assert_eq!(sha, r["model_sha256"].as_str().unwrap(), "{file}: {} is not the file llama.cpp ran", path.display());
        let model = Model::open(&path, be).unwrap();
        let _ = std::fs::remove_file(&scratch);
        let n_vocab = model.n_vocab();
        assert_eq!(n_vocab as u64, r["n_vocab"].as_u64().unwrap(), "{file}: vocabulary size");
        let ids = |v: &serde_json::Value| -> Vec<u32> { v.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect() };
        let top = |v: &serde_json::Value| -> Vec<(usize, f32)> {
            v.as_array().unwrap().iter().map(|p| (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap() as f32)).collect()
        };
        let tokens = ids(&r["prompt_tokens"]);
        let steps = r["steps"].as_array().unwrap();
        // llama.cpp's answer per position: the prompt's, then each greedy
        // step's after feeding llama.cpp's previous token.
        let mut want: Vec<Vec<(usize, f32)>> = r["prompt_top"].as_array().unwrap().iter().map(top).collect();
        assert_eq!(want.len(), tokens.len(), "{file}: reference positions");
        want.extend(steps[1..].iter().map(|s| top(&s["top"])));
        let mut ctx = model.new_context(96, 1).unwrap();
        let mut got = model.forward(&mut ctx, &batch(&tokens, &(0..tokens.len() as u32).collect::<Vec<_>>(), 0)).unwrap();
        for (i, s) in steps[..steps.len() - 1].iter().enumerate() {
            let pos = (tokens.len() + i) as u32;
            got.extend(model.forward(&mut ctx, &batch(&[s["token"].as_u64().unwrap() as u32], &[pos], 0)).unwrap());
        }
        assert_eq!(got.len(), want.len() * n_vocab, "{name} {file}: logits rows");
        let (tau, mut max, mut wide, mut sq) = (2.0 * bound, 0.0f32, 0, 0.0f64);
        for (p, (g, w)) in got.chunks(n_vocab).zip(&want).enumerate() {
            let (best, margin) = (w[0].1, w[0].1 - w[1].1);
            for &(id, v) in w {
                max = max.max((g[id] - v).abs());
                sq += f64::from(g[id] - v).powi(2);
            }
            let mine = top2(g).0;
            let theirs = w.iter().find(|&&(id, _)| id == mine).map(|&(_, v)| v);
            assert!(
                theirs.is_some_and(|v| v >= best - tau),
                "{name} {file}: position {p}: top-1 {mine} (llama.cpp's logit {theirs:?}) where llama.cpp's is {} at {best} (top-2 margin {margin}, allowed {tau})",
                w[0].0
            );
            wide += usize::from(margin > tau);
        }
        let rms = (sq / (want.len() * want[0].len()) as f64).sqrt() as f32;
        report.push(format!(
            "{file}: margin > {tau:.2} at {wide}/{} positions (top-1 equal there), max |diff| {max:.4} (bound {bound}), RMS {rms:.4} (bound {rms_bound})",
            want.len()
        ));
        assert!(max <= bound && rms <= rms_bound, "{name} {}", report.last().unwrap());
    }
    eprintln!("{} vs llama.cpp per kind:\n  {}", open().map_or("?".into(), |b| b.id().to_string()), report.join("\n  "));
}

/// Instantiates the suite for one backend: `$module` is the test module's
/// name, `$ty` the backend and `$id` its registry identity, `$gpu` the
/// blocks a split puts on its device, `$claims` which kinds it is held to, and
/// `$experts` which kinds its experts block is held to, and
/// `$model_level` whether the greedy decode against the CPU runs (not for
/// the CPU itself, which is held to llama.cpp by the check before it and by
/// `tests/llama_ref.rs` on the real model).
macro_rules! conformance_suite {
    ($module:ident, $ty:ty, $id:expr, $gpu:expr, $claims:expr, $experts:expr, $model_level:expr) => {
        mod $module {
            use crate::backend::conformance as c;

            /// One device for the suite's op tests (opening may compile kernels).
            fn dev(what: &str) -> Option<&'static $ty> {
                static DEV: std::sync::OnceLock<Option<$ty>> = std::sync::OnceLock::new();
                let d = DEV.get_or_init(|| c::open::<$ty>($id, $gpu, "the conformance suite")).as_ref();
                if d.is_none() {
                    eprintln!("NOT CHECKED on {}: {what}", $id);
                }
                d
            }

            #[test]
            fn matmul_of_every_claimed_kind_matches_the_scalar_twin() {
                if let Some(be) = dev("matmul of every claimed kind vs the scalar twin") {
                    c::matmul_matches_the_scalar_twin(be, $claims);
                }
            }

            #[test]
            fn get_rows_of_every_claimed_kind_matches_the_scalar_twin() {
                if let Some(be) = dev("get_rows of every claimed kind vs the scalar twin") {
                    c::get_rows_matches_the_scalar_twin(be, $claims);
                }
            }

            #[test]
            fn element_wise_ops_match_the_reference() {
                if let Some(be) = dev("element-wise ops vs f64 loops") {
                    c::element_wise_ops_match_the_reference(be);
                }
            }

            #[test]
            fn rope_matches_the_reference() {
                if let Some(be) = dev("RoPE vs the f64 reference") {
                    c::rope_matches_the_reference(be);
                }
            }

            #[test]
            fn attention_matches_the_reference() {
                if let Some(be) = dev("attention over the KV cache vs the f64 reference") {
                    c::attention_matches_the_reference(be);
                }
            }

            #[test]
            fn blocks_match_the_cpu() {
                if let Some(be) = dev("attention and feed-forward blocks as the backend runs them vs the CPU's composition") {
                    c::blocks_match_the_cpu(be);
                }
            }

            #[test]
            fn moe_block_matches_the_cpu() {
                if let Some(be) = dev("the mixture-of-experts block as the backend runs it vs the CPU's") {
                    c::moe_block_matches_the_cpu(be, $experts);
                }
            }

            #[test]
            fn every_architecture_matches_llama_cpp() {
                c::every_architecture_matches_llama_cpp(|| c::open::<$ty>($id, $gpu, "every architecture's tiny model vs llama.cpp's logits"));
            }

            #[test]
            fn every_kind_matches_llama_cpp() {
                c::every_kind_matches_llama_cpp(|| c::open::<$ty>($id, $gpu, "each kind's llama-quantized file vs llama.cpp's logits"));
            }

            #[test]
            fn batched_steps_follow_the_cpu() {
                if $model_level {
                    c::batched_steps_follow_the_cpu(|| c::open::<$ty>($id, $gpu, "a server's batched steps vs the CPU"));
                } else {
                    eprintln!("the CPU is the reference of this check");
                }
            }

            #[test]
            fn every_architecture_follows_the_cpu() {
                if $model_level {
                    c::every_architecture_follows_the_cpu(|| c::open::<$ty>($id, $gpu, "every architecture's tiny model vs the CPU"));
                } else {
                    eprintln!("the CPU is the reference of this check (itself held to llama.cpp)");
                }
            }
        }
    };
}

conformance_suite!(
    cpu,
    crate::backend::cpu::Cpu,
    crate::kernel_registry::Backend::Cpu,
    None,
    |k| crate::backend::cpu::kernel_for(k).is_some(),
    |k| crate::backend::cpu::kernel_for(k).is_some(),
    false
);

// A split over two CPUs: the split's own mechanics (each weight on its
// layer's side, buffers crossing, the KV cache per side, a tied embedding on
// both sides) checked in every build; its greedy decode against the CPU's.
conformance_suite!(
    split_cpu,
    crate::backend::split::Split<crate::backend::cpu::Cpu>,
    crate::kernel_registry::Backend::Cpu,
    Some(1),
    |k| crate::backend::cpu::kernel_for(k).is_some(),
    |k| crate::backend::cpu::kernel_for(k).is_some(),
    true
);

/// Every compiled-in accelerator gets the suite by its row in the backend
/// table (a module named after its registry variant), held to the kinds its
/// capability table claims (products, and expert kernels for the experts block).
macro_rules! accelerator_suites {
    ([] $(($variant:ident, $feature:literal, $ty:ident)),* $(,)?) => {
        $(
            #[cfg(feature = $feature)]
            #[allow(non_snake_case)]
            mod $variant {
                conformance_suite!(
                    suite,
                    crate::backend::$ty,
                    <crate::backend::$ty as crate::backend::BackendCaps>::ID,
                    None,
                    |k| <crate::backend::$ty as crate::backend::BackendCaps>::matvec_kernel(k).is_some(),
                    |k| <crate::backend::$ty as crate::backend::BackendCaps>::experts_kernel(k).is_some(),
                    true
                );
                // The last block on the device, the rest on the CPU (-ngl 1).
                conformance_suite!(
                    split,
                    crate::backend::split::Split<crate::backend::$ty>,
                    <crate::backend::$ty as crate::backend::BackendCaps>::ID,
                    Some(1),
                    |k| {
                        <crate::backend::$ty as crate::backend::BackendCaps>::matvec_kernel(k).is_some()
                            && crate::backend::cpu::kernel_for(k).is_some()
                    },
                    |k| {
                        <crate::backend::$ty as crate::backend::BackendCaps>::experts_kernel(k).is_some()
                            && crate::backend::cpu::kernel_for(k).is_some()
                    },
                    true
                );
            }
        )*
    };
}
crate::backend::gpu_backend_table!(accelerator_suites);

/// With `prefer_row_products` the CPU's products over a 40-token batch
/// are bit for bit each token's alone, for kinds the GEMM takes (packed at
/// load under AMX, per call from `gemm::min_batch_unpacked` tokens under
/// VNNI): what
/// `ferrox serve --batch-invariant` promises. Without it they differ in the
/// last bits (the GEMM sums in another order).
#[test]
fn cpu_row_products_are_batch_invariant() {
    let cpu = super::cpu::Cpu::new(2);
    assert!(cpu.prefer_row_products(), "the CPU has per-token products at every batch size");
    let mut r = rng(0x5eed_00b1);
    let (rows, cols, n) = (64usize, 512usize, 40usize);
    // The output head's Q8_0 is re-laid at load where the CPU has VNNI (its
    // batches then take AMX tiles or the group kernel).
    let cases = [
        ("blk.0.ffn_down.weight", QuantKind::Q4_0),
        ("blk.0.ffn_down.weight", QuantKind::Q8_0),
        ("blk.0.ffn_down.weight", QuantKind::Q4K),
        ("blk.0.ffn_down.weight", QuantKind::Q6K),
        ("output.weight", QuantKind::Q8_0),
    ];
    for (name, kind) in cases {
        let w = Weights::new(&[(name.into(), kind, rows, cols, matrix(&mut r, kind, rows, cols).0)]);
        let m = w.place(&cpu, name);
        let x = rand_vec(&mut r, n * cols, 1.0);
        let mut y = vec![f32::NAN; n * rows];
        cpu.matmul(&m, &x, &mut y, n).unwrap();
        for c in 0..n {
            let xc = x[c * cols..(c + 1) * cols].to_vec();
            let mut yc = vec![f32::NAN; rows];
            cpu.matmul(&m, &xc, &mut yc, 1).unwrap();
            let batch = &y[c * rows..(c + 1) * rows];
            assert!(
                yc.iter().zip(batch).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{name} {kind}: token {c} of a {n}-token batch differs from the token alone"
            );
        }
    }
}
