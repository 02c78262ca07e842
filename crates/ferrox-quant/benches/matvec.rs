//! Weight bandwidth of the CPU matvec per kind: scalar twin vs the best SIMD
//! level, 1 and 2 threads, on a square layer and Gemma 3 270M's output head.
//!
//! `cargo bench -p ferrox-quant --bench matvec -- [KIND...]` prints a markdown
//! table of GB/s of weight bytes (medians); on AVX2-only CPUs also over the
//! eight-row copy re-laid at load (`Interleaved8`) where the kind has one.
//! Decode is bound by reading the weights once, so this is the number to
//! hold against DRAM bandwidth.

use std::time::Instant;

use ferrox_quant::cpu::Isa;
use ferrox_quant::matvec::{matmul_with, Interleaved8, Products};
use ferrox_quant::QuantKind;

/// Quantizes 64 random rows properly and tiles them: real scales (no NaN or
/// denormal slow paths) without quantizing 167M floats per kind.
fn weights(kind: QuantKind, rows: usize, cols: usize) -> Vec<u64> {
    let mut s = 0x9E37_79B9_7F4A_7C15_u64;
    let mut rnd = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    };
    let tile_rows = 64.min(rows);
    let src: Vec<f32> = (0..tile_rows * cols).map(|_| rnd()).collect();
    let tile = ferrox_quant::quantize_to_vec(kind, &src).expect("bench kinds quantize");
    let total = tile.len() / tile_rows * rows;
    let mut out = vec![0u64; total.div_ceil(8)];
    let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
    for chunk in bytes[..total].chunks_mut(tile.len()) {
        chunk.copy_from_slice(&tile[..chunk.len()]);
    }
    out
}

fn median_gbs(kind: QuantKind, isa: Isa, w: &[u8], rows: usize, cols: usize, threads: usize) -> f64 {
    let x: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut y = vec![0.0f32; rows];
    let once = |y: &mut [f32]| {
        let t = Instant::now();
        matmul_with(isa, kind, w, rows, cols, &x, y, 1, threads).expect("bench shapes are valid");
        t.elapsed().as_secs_f64()
    };
    once(&mut y); // warm-up: page faults, pool threads
    let budget = 0.6;
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || (times.len() < 25 && start.elapsed().as_secs_f64() < budget) {
        times.push(once(&mut y));
    }
    times.sort_by(f64::total_cmp);
    w.len() as f64 / times[times.len() / 2] / 1e9
}

/// As [`median_gbs`] over the eight-row re-laid copy, where the kind has
/// one at `isa` (`None` elsewhere).
fn median_gbs_rows8(kind: QuantKind, isa: Isa, w: &[u8], rows: usize, cols: usize, threads: usize) -> Option<f64> {
    let m = Interleaved8::new(isa, kind, w, rows, cols).expect("bench shapes are valid")?;
    let x: Vec<f32> = (0..cols).map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0).collect();
    let mut y = vec![0.0f32; rows];
    let mut once = || {
        let t = Instant::now();
        m.matmul(&x, &mut y, 1, threads, Products::Exact).expect("bench shapes are valid");
        t.elapsed().as_secs_f64()
    };
    once();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || (times.len() < 25 && start.elapsed().as_secs_f64() < 0.6) {
        times.push(once());
    }
    times.sort_by(f64::total_cmp);
    Some(w.len() as f64 / times[times.len() / 2] / 1e9)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let kinds: Vec<QuantKind> = if args.is_empty() {
        [QuantKind::Q8_0, QuantKind::Q4K, QuantKind::Q6K, QuantKind::Q5_0].to_vec()
    } else {
        args.iter().filter_map(|a| QuantKind::from_name(a)).collect()
    };
    // FERROX_CPU_ISA=avx2 lowers the level, to compare levels on one CPU.
    let best = Isa::active();
    // FERROX_BENCH_THREADS=1,2,8 to measure a bigger machine.
    let threads: Vec<usize> = std::env::var("FERROX_BENCH_THREADS")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![1, 2]);
    println!("best level on this CPU: {best}; GB/s of weight bytes, median of repeats\n");
    // Where the eight-row re-laid copy applies (decisions 0046, 0054), its columns too.
    let rows8 = Interleaved8::applies(QuantKind::Q4_0, best, 8);
    let heads: Vec<String> = [Isa::Scalar, best]
        .iter()
        .flat_map(|i| threads.iter().map(move |t| format!("{i} {t}t")))
        .chain(threads.iter().filter(|_| rows8).map(|t| format!("re-laid 8 rows {t}t")))
        .collect();
    println!("| kind | shape | {} |", heads.join(" | "));
    println!("|---|---|{}", "---:|".repeat(heads.len()));
    for &kind in &kinds {
        // 640 columns are not whole 256-element blocks: K kinds take the
        // head shape with 768 columns (what a Q4_K/Q6_K head would need).
        let head_cols = if 640 % kind.block_elems() == 0 { 640 } else { 768 };
        for (rows, cols) in [(4096, 4096), (262_144, head_cols)] {
            let w = weights(kind, rows, cols);
            let len = ferrox_quant::row_bytes(kind, cols).expect("whole blocks") * rows;
            let wb = &bytemuck::cast_slice::<u64, u8>(&w)[..len];
            let mut cells = Vec::new();
            for isa in [Isa::Scalar, best] {
                for &t in &threads {
                    cells.push(format!("{:.2}", median_gbs(kind, isa, wb, rows, cols, t)));
                }
            }
            for &t in threads.iter().filter(|_| rows8) {
                cells.push(median_gbs_rows8(kind, best, wb, rows, cols, t).map_or("-".into(), |g| format!("{g:.2}")));
            }
            println!("| {kind} | {rows}x{cols} | {} |", cells.join(" | "));
        }
    }
}
