//! The interleaved Q8_0 copy's products on Gemma 3 270M's output head shape
//! (262144 x 640): token by token (VNNI, or AVX2's group kernel) against AMX
//! tiles and against the GEMM packing the stored matrix per call (what
//! batches of the head take without the copy), per batch size.
//!
//! `cargo bench -p ferrox-quant --bench interleaved -- [THREADS]` prints a
//! markdown table of milliseconds per call (medians); `matmul` takes the
//! tiles from `AMX_MIN_TOKENS` tokens, which this table should justify.

use std::time::Instant;

use ferrox_quant::cpu::Isa;
use ferrox_quant::gemm::PackedMatrix;
use ferrox_quant::matvec::{InterleavedQ8_0, AMX_MIN_TOKENS};
use ferrox_quant::QuantKind;

fn median_ms(mut f: impl FnMut(), budget: f64) -> f64 {
    f(); // warm-up: page faults, pool threads
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 3 || (times.len() < 15 && start.elapsed().as_secs_f64() < budget) {
        let t = Instant::now();
        f();
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let threads: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(2);
    let (rows, cols) = (262_144usize, 640usize);
    // 64 quantized rows tiled over the matrix: real scales, quick to make.
    let src: Vec<f32> = (0..64 * cols).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
    let tile = ferrox_quant::quantize_to_vec(QuantKind::Q8_0, &src).expect("Q8_0 quantizes");
    let total = tile.len() / 64 * rows;
    let mut w = vec![0u64; total.div_ceil(8)];
    for c in bytemuck::cast_slice_mut::<u64, u8>(&mut w)[..total].chunks_mut(tile.len()) {
        c.copy_from_slice(&tile[..c.len()]);
    }
    let Some(m) = InterleavedQ8_0::new(Isa::active(), &bytemuck::cast_slice::<u64, u8>(&w)[..total], rows, cols).expect("valid shape") else {
        eprintln!("no interleaved form on this CPU (needs AVX2)");
        return;
    };
    println!("{rows}x{cols} Q8_0, {threads} threads, AMX_MIN_TOKENS = {AMX_MIN_TOKENS}");
    // The stored matrix read in place by the AMX GEMM (what served batches
    // of the head before the copy took them), integer and bf16.
    let wb = &bytemuck::cast_slice::<u64, u8>(&w)[..total];
    let packed = PackedMatrix::new(Isa::active(), QuantKind::Q8_0, wb, rows, cols, threads).expect("valid shape");
    println!("| n | per token ms | tiles (AMX) ms | per token / tiles | copy, AMX bf16 ms | stored, AMX int8 ms | stored, AMX bf16 ms | stored, GEMM packed per call ms |");
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|");
    for n in [1usize, 2, 4, 8, 16, 32, 64, 128, 256, 512] {
        let x: Vec<f32> = (0..n * cols).map(|i| ((i * 104_729) % 3001) as f32 / 1500.0 - 1.0).collect();
        let mut y = vec![0f32; n * rows];
        let vnni = (n <= 64).then(|| median_ms(|| m.matmul_per_token(&x, &mut y, n, threads).expect("valid shape"), 1.0));
        let amx = m.has_tiles().then(|| median_ms(|| assert!(m.matmul_tiles(&x, &mut y, n, threads).expect("valid shape")), 1.0));
        let mut copy_bf16 = None;
        if n >= 64 && m.matmul_bf16(&x, &mut y, n, threads).expect("valid shape") {
            copy_bf16 = Some(median_ms(|| assert!(m.matmul_bf16(&x, &mut y, n, threads).expect("valid shape")), 1.0));
        }
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        let ratio = match (vnni, amx) {
            (Some(a), Some(b)) => format!("{:.2}x", a / b),
            _ => "-".into(),
        };
        let mut stored = |bf16: bool| packed.as_ref().filter(|_| n >= 8).map(|p| median_ms(|| p.matmul(wb, &x, &mut y, n, threads, bf16).expect("valid shape"), 1.0));
        let (i8, b16) = (stored(false), stored(true).filter(|_| n >= 64));
        let per_call = (n >= 16).then(|| {
            median_ms(
                || ferrox_quant::matvec::matmul_on(Isa::active(), QuantKind::Q8_0, wb, rows, cols, &x, &mut y, n, threads, ferrox_quant::matvec::Products::Exact).expect("valid shape"),
                1.0,
            )
        });
        println!("| {n} | {} | {} | {ratio} | {} | {} | {} | {} |", fmt(vnni), fmt(amx), fmt(copy_bf16), fmt(i8), fmt(b16), fmt(per_call));
    }
}
