//! Prefill throughput of the CPU batched product per kind: the GEMM a
//! prompt's layer matrices take (`matmul_with` at 512 tokens), on Gemma 3
//! 270M's shapes (640 -> 2048 and 2048 -> 640; K kinds 768 / 2048 columns).
//!
//! `cargo bench -p ferrox-quant --bench gemm -- [KIND...]` prints a markdown
//! table of GMAC/s (multiply-adds per second): the best of the repeats, which
//! a noisy machine disturbs least, and the median. `FERROX_BENCH_N=8,16,32`
//! measures those batch sizes instead, beside the per-token row kernels
//! (`Products::Rows`), to place the crossover (`gemm::MIN_BATCH_UNPACKED`);
//! `FERROX_BENCH_SHAPES=768x2048,2048x768` other `rows x cols` shapes.

use std::time::Instant;

use ferrox_quant::cpu::Isa;
use ferrox_quant::matvec::{matmul_on, Products};
use ferrox_quant::QuantKind;

fn rnd(s: &mut u64) -> f32 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    (*s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
}

/// `rows x cols` random weights of `kind`, in an 8-aligned buffer.
fn weights(kind: QuantKind, rows: usize, cols: usize) -> Vec<u64> {
    let mut s = 0x9E37_79B9_7F4A_7C15_u64;
    let src: Vec<f32> = (0..rows * cols).map(|_| rnd(&mut s)).collect();
    let bytes = ferrox_quant::quantize_to_vec(kind, &src).expect("bench kinds quantize");
    let mut out = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut out)[..bytes.len()].copy_from_slice(&bytes);
    out
}

/// (best, median) GMAC/s of `n` tokens through `rows x cols`, taking `products`.
fn gmacs(kind: QuantKind, isa: Isa, rows: usize, cols: usize, n: usize, threads: usize, products: Products) -> (f64, f64) {
    let w = weights(kind, rows, cols);
    let wb = &bytemuck::cast_slice::<u64, u8>(&w)[..ferrox_quant::row_bytes(kind, cols).expect("whole blocks") * rows];
    let mut s = 7u64;
    let x: Vec<f32> = (0..n * cols).map(|_| rnd(&mut s)).collect();
    let mut y = vec![0.0f32; n * rows];
    let mut once = || {
        let t = Instant::now();
        matmul_on(isa, kind, wb, rows, cols, &x, &mut y, n, threads, products).expect("bench shapes are valid");
        t.elapsed().as_secs_f64()
    };
    once();
    let mut times: Vec<f64> = (0..9).map(|_| once()).collect();
    times.sort_by(f64::total_cmp);
    let macs = (rows * cols * n) as f64 / 1e9;
    (macs / times[0], macs / times[times.len() / 2])
}

fn list(var: &str) -> Option<Vec<String>> {
    std::env::var(var).ok().map(|v| v.split(',').map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let kinds: Vec<QuantKind> = if args.is_empty() {
        [QuantKind::Q4_0, QuantKind::Q8_0, QuantKind::Q5_0, QuantKind::IQ4NL, QuantKind::Q4K, QuantKind::Q6K].to_vec()
    } else {
        args.iter().filter_map(|a| QuantKind::from_name(a)).collect()
    };
    // FERROX_CPU_ISA=avx2 lowers the level, to compare levels on one CPU.
    let isa = Isa::active();
    let shapes = |kind: QuantKind| -> Vec<(usize, usize)> {
        match list("FERROX_BENCH_SHAPES") {
            Some(v) => v.iter().filter_map(|s| s.split_once('x')).filter_map(|(r, c)| Some((r.parse().ok()?, c.parse().ok()?))).collect(),
            None => {
                let k = if 640 % kind.block_elems() == 0 { 640 } else { 768 };
                vec![(2048, k), (k, 2048)]
            }
        }
    };
    if let Some(ns) = list("FERROX_BENCH_N") {
        println!("level {isa}; 2 threads; GMAC/s, best / median of 9: per-token rows, then the batched path\n");
        println!("| kind | shape | tokens | rows | batched |");
        println!("|---|---|---:|---:|---:|");
        for &kind in &kinds {
            for (rows, cols) in shapes(kind) {
                for n in ns.iter().filter_map(|n| n.parse::<usize>().ok()) {
                    let (rb, rm) = gmacs(kind, isa, rows, cols, n, 2, Products::Rows);
                    let (gb, gm) = gmacs(kind, isa, rows, cols, n, 2, Products::Exact);
                    println!("| {kind} | {rows}x{cols} | {n} | {rb:.1} / {rm:.1} | {gb:.1} / {gm:.1} |");
                }
            }
        }
        return;
    }
    let n = 512;
    println!("level {isa}; {n} tokens; GMAC/s, best / median of 9\n");
    println!("| kind | shape | 1 thread | 2 threads |");
    println!("|---|---|---:|---:|");
    for &kind in &kinds {
        for (rows, cols) in shapes(kind) {
            let cells: Vec<String> = [1, 2]
                .iter()
                .map(|&t| {
                    let (best, med) = gmacs(kind, isa, rows, cols, n, t, Products::Exact);
                    format!("{best:.1} / {med:.1}")
                })
                .collect();
            println!("| {kind} | {rows}x{cols} | {} |", cells.join(" | "));
        }
    }
}
