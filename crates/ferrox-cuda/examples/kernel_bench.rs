//! Matvec and GEMM throughput of every kind in the launch table, timed with
//! CUDA events on the device's stream (median of repeats after a warm-up).
//! `cargo run --release -p ferrox-cuda --example kernel_bench [ROWS COLS]`;
//! on the H200 it runs in `scripts/cuda-side-by-side.sh` / `cuda-dev.sh`, and
//! the figures that decided the kernels are in `docs/decisions/`.
//! `KB_KINDS=Q4_0,Q4_K` limits the kinds (the IQ1/IQ2/IQ3 lattice kinds get
//! random valid blocks: ferrox has no quantizer for them); `KB_GEMM=0` skips the GEMM column.
//! The "chained" line times 24 launches back to back (per launch): what a
//! decode step sees; the table's single launches include the host's launch
//! latency, which dominates below ~20 MB. The int8 kinds also get the
//! small-batch tensor-core GEMM against dequantize + cuBLAS at 16, 32 and
//! 64 tokens (sm_80+; decision 0041).

use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use ferrox_cuda::{Device, MatmulPath};
use ferrox_quant::QuantKind;

fn quantize_par(kind: QuantKind, src: &[f32], rows: usize, cols: usize) -> Vec<u8> {
    let rb = ferrox_quant::row_bytes(kind, cols).unwrap();
    // The lattice kinds have no quantizer: random valid blocks.
    if let Some(b) = ferrox_quant::random_lattice_blocks(kind, rb / kind.block_bytes() * rows, 7) {
        return b;
    }
    let mut out = vec![0u8; rb * rows];
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let per = rows.div_ceil(threads);
    std::thread::scope(|s| {
        for (o, i) in out.chunks_mut(per * rb).zip(src.chunks(per * cols)) {
            s.spawn(move || ferrox_quant::quantize(kind, i, o).unwrap());
        }
    });
    out
}

fn main() {
    if !Device::probe() {
        eprintln!("NOT RUN: no CUDA device here");
        return;
    }
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rows, cols) = (
        args.first().copied().unwrap_or(16384),
        args.get(1).copied().unwrap_or(8192),
    );
    let dev = Device::open(0).unwrap();
    println!(
        "device {} ({}), cuBLAS {}",
        dev.name(),
        dev.arch(),
        dev.has_blas()
    );
    let mut seed = 0x1234_5678_9abc_def0u64;
    let src: Vec<f32> = (0..rows * cols)
        .map(|_| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((seed >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect();
    let time = |f: &mut dyn FnMut()| -> f64 {
        for _ in 0..3 {
            f();
        }
        let mut ms = Vec::new();
        for _ in 0..20 {
            let a = dev
                .context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .unwrap();
            let b = dev
                .context()
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .unwrap();
            a.record(dev.stream()).unwrap();
            f();
            b.record(dev.stream()).unwrap();
            b.synchronize().unwrap();
            ms.push(a.elapsed_ms(&b).unwrap() as f64);
        }
        ms.sort_by(f64::total_cmp);
        ms[ms.len() / 2]
    };
    // The same, a chain of CHAIN calls between the events, per call: the
    // host's launch latency is paid once, and each launch overlaps the
    // previous one as in a decode step (programmatic dependent launch).
    const CHAIN: usize = 24;
    let time_chain = |f: &mut dyn FnMut()| -> f64 {
        time(&mut || {
            for _ in 0..CHAIN {
                f();
            }
        }) / CHAIN as f64
    };
    println!(
        "{:<7} {:>10} {:>12} {:>10} {:>14} {:>12}",
        "kind", "MiB", "matvec us", "GB/s", "gemm512 ms", "TFLOP/s"
    );
    let only: Option<Vec<String>> = std::env::var("KB_KINDS")
        .ok()
        .map(|v| v.split(',').map(|k| k.trim().to_string()).collect());
    let gemm = std::env::var("KB_GEMM").map_or(true, |v| v != "0");
    for &kind in QuantKind::ALL {
        if ferrox_cuda::kernel_suffix(kind).is_none()
            || only.as_ref().is_some_and(|o| !o.iter().any(|k| k == kind.name()))
        {
            continue;
        }
        let t0 = Instant::now();
        let bytes = quantize_par(kind, &src, rows, cols);
        let q_s = t0.elapsed().as_secs_f64();
        // Copies alternated, at least 256 MB of them, so the 60 MB L2 does
        // not hold the weights (decode streams each matrix from DRAM).
        let copies = (256usize << 20).div_ceil(bytes.len()).clamp(2, 128);
        let w: Vec<_> = (0..copies)
            .map(|_| dev.upload_matrix(kind, &bytes, rows, cols).unwrap())
            .collect();
        let x = dev.upload_f32(&src[..512.min(rows) * cols]).unwrap();
        let mut y = dev.alloc(512 * rows).unwrap();
        let mut i = 0;
        let (mv, mv_chain) = {
            let mut call = || {
                dev.matmul_with(MatmulPath::Matvec, &w[i % copies], &x, &mut y, 1)
                    .unwrap();
                i += 1;
            };
            (time(&mut call), time_chain(&mut call))
        };
        let gm = if gemm {
            time(&mut || {
                dev.matmul_with(MatmulPath::Gemm, &w[i % copies], &x, &mut y, 512)
                    .unwrap();
                i += 1;
            })
        } else {
            f64::NAN
        };
        // The gate/up matvec with the GLU over two of the copies (int8
        // kinds, F16; the int8 output's q8 copy makes the next call quantize
        // x again, a small launch counted in).
        let fused_glu = (ferrox_cuda::mmvq_kind(kind) && rows.is_multiple_of(32))
            || (kind == QuantKind::F16 && cols.is_multiple_of(8));
        // Single launches, then chained.
        let (glu, glu_chain) = if fused_glu {
            let mut h = dev.alloc(rows).unwrap();
            let mut call = || {
                dev.gate_up_glu(ferrox_ops::Activation::SiluGated, &x, 1, &w[i % copies], &w[(i + 1) % copies], &mut h)
                    .unwrap();
                i += 2;
            };
            (time(&mut call), time_chain(&mut call))
        } else {
            (f64::NAN, f64::NAN)
        };
        // The same apart: two matvecs and the GLU launch (what the fused
        // launch replaces).
        let apart = if fused_glu {
            let (mut g, mut u, mut h) = (dev.alloc(rows).unwrap(), dev.alloc(rows).unwrap(), dev.alloc(rows).unwrap());
            time(&mut || {
                dev.matmul_with(MatmulPath::Matvec, &w[i % copies], &x, &mut g, 1).unwrap();
                dev.matmul_with(MatmulPath::Matvec, &w[(i + 1) % copies], &x, &mut u, 1).unwrap();
                dev.glu(ferrox_ops::Activation::SiluGated, &g, &u, &mut h).unwrap();
                i += 2;
            })
        } else {
            f64::NAN
        };
        // Three copies through matmul_many (one launch where the kind has
        // one) against three matvecs: Q, K and V.
        let (many, three) = if copies >= 3 {
            let mut ys: Vec<_> = (0..3).map(|_| dev.alloc(rows).unwrap()).collect();
            let m = time(&mut || {
                let [a, b, c] = &mut ys[..] else { unreachable!() };
                let mut outs = [(&w[i % copies], a), (&w[(i + 1) % copies], b), (&w[(i + 2) % copies], c)];
                dev.matmul_many(&x, 1, &mut outs).unwrap();
                i += 3;
            });
            let t = time(&mut || {
                for y in ys.iter_mut() {
                    dev.matmul_with(MatmulPath::Matvec, &w[i % copies], &x, y, 1).unwrap();
                    i += 1;
                }
            });
            (m, t)
        } else {
            (f64::NAN, f64::NAN)
        };
        println!("{:<6} matmul_many x3 {:.1} us, three matvecs {:.1} us", kind.name(), many * 1e3, three * 1e3);
        // The small-batch tensor-core GEMM (the int8 kinds, sm_80+) at a
        // server's decode-step sizes, chained, against dequantize + cuBLAS:
        // per launch, and the weights' bytes over that time.
        if dev.small_batch_gemm() && ferrox_cuda::mmvq_kind(kind) && cols.is_multiple_of(32) {
            for n in [16usize, 32, 64] {
                let mut per_path = |path: MatmulPath| {
                    time_chain(&mut || {
                        dev.matmul_with(path, &w[i % copies], &x, &mut y, n).unwrap();
                        i += 1;
                    })
                };
                let (mma, gemm16) = (per_path(MatmulPath::Mma), per_path(MatmulPath::Gemm));
                let gbs = |ms: f64| bytes.len() as f64 / (ms * 1e-3) / 1e9;
                println!(
                    "{:<6} {n:>3} tokens: mmq {:.1} us ({:.0} GB/s), dequantize + cuBLAS {:.1} us ({:.0} GB/s)",
                    kind.name(),
                    mma * 1e3,
                    gbs(mma),
                    gemm16 * 1e3,
                    gbs(gemm16)
                );
            }
        }
        let gbs = |ms: f64, n: f64| n * bytes.len() as f64 / (ms * 1e-3) / 1e9;
        println!(
            "{:<6} chained x{CHAIN}: matvec {:.2} us ({:.0} GB/s), gate/up+GLU {:.2} us ({:.0} GB/s)",
            kind.name(),
            mv_chain * 1e3,
            gbs(mv_chain, 1.0),
            glu_chain * 1e3,
            gbs(glu_chain, 2.0)
        );
        let gb = bytes.len() as f64 / (mv * 1e-3) / 1e9;
        let tflops = 2.0 * rows as f64 * cols as f64 * 512.0 / (gm * 1e-3) / 1e12;
        println!(
            "{:<7} {:>10.1} {:>12.1} {:>10.0} {:>14.3} {:>12.1}   (quantized in {q_s:.1}s; gate/up+GLU {:.1} us, {:.0} GB/s; apart {:.1} us)",
            kind.name(),
            bytes.len() as f64 / (1 << 20) as f64,
            mv * 1e3,
            gb,
            gm,
            tflops,
            glu * 1e3,
            2.0 * bytes.len() as f64 / (glu * 1e-3) / 1e9,
            apart * 1e3
        );
    }
}
