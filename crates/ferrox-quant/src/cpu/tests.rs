//! Claims ⇔ dispatch, and every SIMD kernel against its scalar twin.

use super::*;
use crate::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1};

type H = crate::blocks::F16;
type B16 = crate::blocks::BF16;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Weight-row lengths in blocks: odd, tiny and not a multiple of any unroll.
const BLOCK_COUNTS: &[usize] = &[1, 2, 3, 7, 33];
const ROWS: usize = 5;

#[test]
fn every_claimed_kernel_is_dispatched_and_nothing_else() {
    for &isa in Isa::ALL {
        if !isa.is_compiled() {
            eprintln!("NOT CHECKED: {isa} claims vs dispatch (not compiled for this architecture)");
            continue;
        }
        for &k in QuantKind::ALL {
            assert_eq!(
                simd_kernel(k, isa).is_some(),
                dot_fn(k, isa).is_some(),
                "{k} at {isa}: claimed {:?} but dispatch {}",
                simd_kernel(k, isa),
                if dot_fn(k, isa).is_some() { "has a kernel" } else { "has none" },
            );
        }
    }
}

#[test]
fn every_weight_kind_can_be_launched_at_every_level() {
    for &isa in Isa::ALL {
        for &k in QuantKind::ALL {
            let sel = select(k, isa);
            assert_eq!(sel.is_some(), k.vec_dot_kind().is_some(), "{k} at {isa}");
            if let Some(s) = sel {
                assert_eq!(simd_kernel(k, s.isa), Some(s.name), "{k} at {isa}");
            }
        }
    }
}

fn finite_f16(rng: &mut SmallRng, lo: f32, hi: f32) -> H {
    let m = rng.gen_range(lo..hi);
    H::from_f32(if rng.gen_bool(0.5) { m } else { -m })
}

/// Random blocks of `kind`: every packed field random, scales finite and
/// moderate (a NaN scale would make any comparison vacuous).
fn random_row(kind: QuantKind, n_blocks: usize, rng: &mut SmallRng) -> Vec<u8> {
    let bs = kind.block_bytes();
    let mut bytes: Vec<u8> = (0..n_blocks * bs).map(|_| rng.gen()).collect();
    for b in bytes.chunks_exact_mut(bs) {
        let h = |rng: &mut SmallRng| finite_f16(rng, 0.01, 2.0).to_le_bytes();
        let hpos = |rng: &mut SmallRng| H::from_f32(rng.gen_range(0.01..2.0)).to_le_bytes();
        use QuantKind::*;
        match kind {
            F32 => b.copy_from_slice(&rng.gen_range(-4.0f32..4.0).to_le_bytes()),
            F16 => b.copy_from_slice(&h(rng)),
            BF16 => b.copy_from_slice(&B16::from_f32(rng.gen_range(-4.0..4.0)).to_le_bytes()),
            Q4_0 | Q5_0 | IQ4NL => b[0..2].copy_from_slice(&h(rng)),
            Q4_1 | Q5_1 => {
                b[0..2].copy_from_slice(&h(rng));
                b[2..4].copy_from_slice(&h(rng));
            }
            Q8_0 | Q8_1 => b[0..2].copy_from_slice(&hpos(rng)),
            Q2K => {
                b[80..82].copy_from_slice(&h(rng));
                b[82..84].copy_from_slice(&h(rng));
            }
            Q3K => b[108..110].copy_from_slice(&h(rng)),
            Q4K | Q5K => {
                b[0..2].copy_from_slice(&h(rng));
                b[2..4].copy_from_slice(&h(rng));
            }
            Q6K => b[208..210].copy_from_slice(&h(rng)),
            IQ4XS => b[0..2].copy_from_slice(&h(rng)),
            MXFP4 => b[0] = rng.gen_range(110..140),
            // capability table: the layouts of kinds that have a SIMD kernel.
            _ => panic!("test generator has no layout for {kind}; add it with its SIMD kernel"),
        }
    }
    bytes
}

/// A random activation row of `act`, as the ggml quantizer could produce it
/// (`qs` in -127..=127, Q8_1's `s` and Q8_K's `bsums` consistent).
fn random_act(act: QuantKind, n_elems: usize, rng: &mut SmallRng) -> Vec<u8> {
    match act {
        QuantKind::Q8_0 | QuantKind::Q8_1 | QuantKind::Q8K => {}
        _ => return random_row(act, n_elems, rng), // capability table: float activations
    }
    let n_blocks = n_elems / act.block_elems();
    let mut out = vec![0u8; n_blocks * act.block_bytes()];
    for b in out.chunks_exact_mut(act.block_bytes()) {
        let qs: Vec<i8> = (0..act.block_elems()).map(|_| rng.gen_range(-127..=127)).collect();
        match act {
            QuantKind::Q8_0 => {
                let mut blk: BlockQ8_0 = bytemuck::Zeroable::zeroed();
                blk.d = H::from_f32(rng.gen_range(0.001..0.1));
                blk.qs.copy_from_slice(&qs);
                b.copy_from_slice(bytemuck::bytes_of(&blk));
            }
            QuantKind::Q8_1 => {
                let mut blk: BlockQ8_1 = bytemuck::Zeroable::zeroed();
                let d = rng.gen_range(0.001..0.1f32);
                blk.d = H::from_f32(d);
                blk.qs.copy_from_slice(&qs);
                blk.s = H::from_f32(qs.iter().map(|&q| i32::from(q)).sum::<i32>() as f32 * d);
                b.copy_from_slice(bytemuck::bytes_of(&blk));
            }
            QuantKind::Q8K => {
                let mut blk: BlockQ8K = bytemuck::Zeroable::zeroed();
                blk.d = rng.gen_range(0.001..0.1);
                blk.qs.copy_from_slice(&qs);
                for (s, q) in blk.bsums.iter_mut().zip(qs.chunks_exact(16)) {
                    *s = q.iter().map(|&v| i16::from(v)).sum();
                }
                b.copy_from_slice(bytemuck::bytes_of(&blk));
            }
            // capability table: only the three 8-bit activation kinds reach here.
            _ => unreachable!("returned above"),
        }
    }
    out
}

/// Copies bytes into an 8-aligned buffer (what the loaders and matvec give
/// kernels) and returns it as a slice of the right length.
fn aligned(bytes: &[u8]) -> (Vec<u64>, usize) {
    let mut v = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
    (v, bytes.len())
}

/// |simd - scalar| within f32 rounding of the sum of |terms|: the two add
/// the same exact integer block sums in different orders.
fn close(simd: f32, scalar: f32, scale: f64) -> bool {
    ((simd as f64) - (scalar as f64)).abs() <= 2e-5 * scale + 1e-6
}

/// The kernels that promise the scalar twin's exact bits: NEON's quantized
/// kinds, which follow the twins' float operations (the float kinds' twins
/// sum in f64).
fn bit_exact(isa: Isa, kind: QuantKind) -> bool {
    isa == Isa::Neon && !matches!(kind, QuantKind::F32 | QuantKind::F16 | QuantKind::BF16)
}

#[test]
fn every_simd_kernel_matches_its_scalar_twin() {
    let mut rng = SmallRng::seed_from_u64(0x51D);
    let mut checked = 0;
    for &isa in Isa::ALL.iter().filter(|&&i| i != Isa::Scalar) {
        if !isa.is_compiled() || !isa.is_available() {
            let claimed: Vec<_> = QuantKind::ALL.iter().filter(|&&k| simd_kernel(k, isa).is_some()).collect();
            eprintln!("NOT CHECKED: {isa} kernels for {claimed:?}: this CPU/build cannot run {isa}");
            continue;
        }
        for &k in QuantKind::ALL {
            let Some(f) = dot_fn(k, isa) else { continue };
            let act = k.vec_dot_kind().unwrap();
            for &nb in BLOCK_COUNTS {
                let n = nb * k.block_elems();
                let (a_buf, a_len) = aligned(&random_act(act, n, &mut rng));
                let a = &bytemuck::cast_slice::<u64, u8>(&a_buf)[..a_len];
                let deq_a = crate::dequantize_to_vec(act, a, n).unwrap();
                for row in 0..ROWS {
                    let (w_buf, w_len) = aligned(&random_row(k, nb, &mut rng));
                    let w = &bytemuck::cast_slice::<u64, u8>(&w_buf)[..w_len];
                    let twin = crate::scalar::vec_dot(k, w, a).unwrap();
                    // SAFETY: isa available (checked above); aligned whole
                    // blocks of equal element count; act qs in -127..=127.
                    let simd = unsafe { f(w, a) };
                    let deq_w = crate::dequantize_to_vec(k, w, n).unwrap();
                    let scale: f64 = deq_w.iter().zip(&deq_a).map(|(x, y)| (x * y).abs() as f64).sum();
                    if bit_exact(isa, k) {
                        assert_eq!(
                            simd.to_bits(),
                            twin.to_bits(),
                            "{k} at {isa}, {nb} blocks, row {row}: simd {simd} vs scalar {twin}: this level promises bit-exact"
                        );
                    }
                    assert!(
                        close(simd, twin, scale),
                        "{k} at {isa}, {nb} blocks, row {row}: simd {simd} vs scalar {twin} (sum|terms| {scale})"
                    );
                    checked += 1;
                }
            }
        }
    }
    eprintln!("compared {checked} SIMD rows with the scalar twins");
}

/// Activation rows that exercise the quantizers' corners: exact .5 ties
/// (ggml's Q8_0/Q8_1 round them away from zero, Q8_K to even), an all-zero
/// block, a negative maximum, repeated maxima of both signs, huge and tiny.
fn quantizer_inputs(n: usize, rng: &mut SmallRng) -> Vec<Vec<f32>> {
    let mut rows = Vec::new();
    rows.push((0..n).map(|_| rng.gen_range(-3.0f32..3.0)).collect());
    rows.push((0..n).map(|_| rng.gen_range(-1e30f32..1e30)).collect());
    rows.push((0..n).map(|_| rng.gen_range(-1e-30f32..1e-30)).collect());
    // amax 127 → d = 1, id = 1: every x.5 is a tie.
    rows.push((0..n).map(|i| if i % 32 == 0 { 127.0 } else { (i % 40) as f32 - 20.5 }).collect());
    rows.push((0..n).map(|i| if i % 32 == 5 { -127.0 } else { -((i % 30) as f32) + 14.5 }).collect());
    let mut z: Vec<f32> = (0..n).map(|_| rng.gen_range(-1.0f32..1.0)).collect();
    z[..32].fill(0.0);
    if n >= 256 {
        z[256..512.min(n)].fill(0.0);
    }
    rows.push(z);
    rows.push((0..n).map(|i| if i % 7 == 0 { -2.0 } else if i % 7 == 3 { 2.0 } else { 0.3 }).collect());
    rows
}

#[test]
fn simd_activation_quantizers_are_byte_exact_with_the_scalar_quantizers() {
    let mut rng = SmallRng::seed_from_u64(0xAC7);
    let mut checked = 0;
    for &isa in Isa::ALL.iter().filter(|&&i| i != Isa::Scalar) {
        if !isa.is_available() {
            eprintln!("NOT CHECKED: {isa} activation quantizers: this CPU/build cannot run {isa}");
            continue;
        }
        for act in [QuantKind::Q8_0, QuantKind::Q8_1, QuantKind::Q8K] {
            for n in [256, 512, 33 * 256] {
                for x in quantizer_inputs(n, &mut rng) {
                    let mut want = vec![0u8; crate::row_bytes(act, x.len()).unwrap()];
                    crate::quantize_activation(act, &x, &mut want).unwrap();
                    let (mut buf, len) = aligned(&vec![0xA5; want.len()]);
                    let got = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut buf)[..len];
                    quantize_act(act, isa, &x, got).unwrap();
                    if let Some(i) = (0..len).find(|&i| got[i] != want[i]) {
                        let bb = act.block_bytes();
                        panic!(
                            "{act} at {isa}, n {n}: first difference in block {} byte {}: simd {:?} vs scalar {:?}",
                            i / bb,
                            i % bb,
                            &got[i / bb * bb..(i / bb + 1) * bb],
                            &want[i / bb * bb..(i / bb + 1) * bb]
                        );
                    }
                    checked += 1;
                }
            }
        }
    }
    eprintln!("compared {checked} SIMD-quantized activation rows byte for byte");
}

#[test]
fn every_claimed_four_row_kernel_is_dispatched_and_nothing_else() {
    for &isa in Isa::ALL.iter().filter(|i| i.is_compiled()) {
        for &k in QuantKind::ALL {
            assert_eq!(dot4_kernel(k, isa).is_some(), dot4_fn(k, isa).is_some(), "{k} at {isa}");
            if dot4_kernel(k, isa).is_some() {
                let act = k.vec_dot_kind();
                assert!(
                    matches!(act, Some(QuantKind::Q8_0 | QuantKind::Q8_1 | QuantKind::Q8K)),
                    "{k}: activation {act:?} has no four-row prep (ActPrep::prepare)"
                );
            }
        }
    }
}

/// Each four-row kernel against the scalar twin row by row, on rows
/// quantized from floats (all-extreme ones too: the unsigned-code offset
/// and the sign trick at their limits) and on rows of random bytes (every
/// packed field, e.g. the K kinds' 6-bit scales and mins, at any value).
#[test]
fn four_row_kernels_match_the_scalar_twin() {
    let mut rng = SmallRng::seed_from_u64(21);
    let mut checked = 0;
    for &isa in Isa::ALL {
        for &kind in QuantKind::ALL {
            let Some(f) = dot4_fn(kind, isa) else { continue };
            if !isa.is_available() {
                eprintln!("NOT CHECKED: {kind} four-row kernel at {isa} (this CPU lacks it)");
                continue;
            }
            let act = kind.vec_dot_kind().unwrap();
            for nb in [1usize, 2, 3, 7, 20] {
                let cols = nb * kind.block_elems();
                let rb = crate::row_bytes(kind, cols).unwrap();
                let ab = crate::row_bytes(act, cols).unwrap();
                for source in ["floats", "extreme", "bytes"] {
                    let gen = |rng: &mut SmallRng| -> f32 {
                        if source == "extreme" { if rng.gen_bool(0.5) { 1.0 } else { -1.0 } } else { rng.gen_range(-1.0..1.0) }
                    };
                    let w: Vec<f32> = (0..4 * cols).map(|_| gen(&mut rng)).collect();
                    let x: Vec<f32> = (0..cols).map(|_| gen(&mut rng)).collect();
                    let wq = if source == "bytes" {
                        aligned_bytes(&random_row(kind, 4 * nb, &mut rng))
                    } else {
                        aligned_bytes(&crate::quantize_to_vec(kind, &w).unwrap())
                    };
                    let xq = aligned_bytes(&crate::quantize_to_vec(act, &x).unwrap());
                    let (wb, xb) = (&as_bytes(&wq)[..4 * rb], &as_bytes(&xq)[..ab]);
                    let mut p = ActPrep::default();
                    p.prepare(act, xb).unwrap();
                    // SAFETY: level available (checked); four whole aligned rows and one prepared activation row.
                    let got = unsafe { f(wb, rb, xb, &p) };
                    for r in 0..4 {
                        let w_r = &wb[r * rb..(r + 1) * rb];
                        let want = crate::scalar::vec_dot(kind, w_r, xb).unwrap();
                        let deq_w = crate::dequantize_to_vec(kind, w_r, cols).unwrap();
                        let deq_a = crate::dequantize_to_vec(act, xb, cols).unwrap();
                        let scale: f64 = deq_w.iter().zip(&deq_a).map(|(x, y)| (x * y).abs() as f64).sum();
                        assert!(
                            (got[r] - want).abs() <= 1e-4 * want.abs().max(1.0) || close(got[r], want, scale),
                            "{kind} at {isa}, {nb} blocks, {source}, row {r}: {} vs {want} (sum|terms| {scale})",
                            got[r]
                        );
                        checked += 1;
                    }
                }
            }
        }
    }
    eprintln!("compared {checked} four-row kernel rows with the scalar twins");
}

/// The matvec over row counts that leave every remainder of four (the
/// four-row kernel's tail goes to the one-row kernel) and several tasks,
/// for each kind with a four-row kernel, against the scalar twin per row.
#[test]
fn matvecs_with_four_row_kernels_match_the_twin_on_odd_row_counts() {
    let mut rng = SmallRng::seed_from_u64(0x4040);
    for &isa in Isa::ALL {
        for &kind in QuantKind::ALL {
            if dot4_fn(kind, isa).is_none() {
                continue;
            }
            if !isa.is_available() {
                eprintln!("NOT CHECKED: {kind} four-row matvec at {isa} (this CPU lacks it)");
                continue;
            }
            let act = kind.vec_dot_kind().unwrap();
            let cols = 768; // whole blocks of every kind: 3 K super-blocks, 24 legacy blocks
            for rows in [1usize, 2, 3, 5, 6, 7, 37, 70] {
                let wq = aligned_bytes(&random_row(kind, rows * cols / kind.block_elems(), &mut rng));
                let rb = crate::row_bytes(kind, cols).unwrap();
                let wb = &as_bytes(&wq)[..rows * rb];
                let x: Vec<f32> = (0..cols).map(|_| rng.gen_range(-2.0..2.0)).collect();
                let xq = aligned_bytes(&crate::quantize_to_vec(act, &x).unwrap());
                let xb = &as_bytes(&xq)[..crate::row_bytes(act, cols).unwrap()];
                for threads in [1, 2] {
                    let mut y = vec![f32::NAN; rows];
                    crate::matvec::matmul_with(isa, kind, wb, rows, cols, &x, &mut y, 1, threads).unwrap();
                    let deq_a = crate::dequantize_to_vec(act, xb, cols).unwrap();
                    for (r, &g) in y.iter().enumerate() {
                        let w_r = &wb[r * rb..(r + 1) * rb];
                        let want = crate::scalar::vec_dot(kind, w_r, xb).unwrap();
                        let deq_w = crate::dequantize_to_vec(kind, w_r, cols).unwrap();
                        let scale: f64 = deq_w.iter().zip(&deq_a).map(|(x, y)| (x * y).abs() as f64).sum();
                        assert!(
                            close(g, want, scale),
                            "{kind} at {isa}, {rows} rows, {threads} threads, row {r}: {g} vs {want} (sum|terms| {scale})"
                        );
                    }
                }
            }
        }
    }
}

fn aligned_bytes(b: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; b.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..b.len()].copy_from_slice(b);
    v
}

fn as_bytes(v: &[u64]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// `FERROX_CPU_ISA` takes a level this CPU has; anything else is an error
/// naming the variable and the levels it could take, never the detected
/// level in silence.
#[test]
fn a_cpu_isa_that_is_not_a_level_this_cpu_has_is_an_error_naming_it() {
    for bad in ["avx9", "avx2,avx512"] {
        let e = Isa::parse_level(Some(bad)).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("FERROX_CPU_ISA") && msg.contains("scalar"), "{msg}");
    }
    if let Some(&lacking) = Isa::ALL.iter().find(|i| !i.is_available()) {
        assert!(Isa::parse_level(Some(lacking.name())).is_err(), "{lacking} accepted on a CPU without it");
    }
    assert_eq!(Isa::parse_level(Some("SCALAR")), Ok(Isa::Scalar));
    assert_eq!(Isa::parse_level(None), Ok(Isa::detect()));
}
