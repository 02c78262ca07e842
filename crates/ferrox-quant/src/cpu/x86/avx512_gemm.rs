//! The AVX-512 VNNI micro-kernel of the packed GEMM ([`crate::gemm`]).
//!
//! The key decision: full 512-bit registers and a 4x4 register tile. Per
//! 64-byte step each of the 4 weight rows and 4 tokens is loaded once and
//! meets the other side 4 times: `vpdpbusd` (u8 weights x s8 activations,
//! exact i32 sums of 4 products per lane), one conversion and one FMA with
//! the per-lane product of the two scales. 16 accumulators, 8 operand
//! registers and a few temporaries fit the 32 zmm registers.
//!
//! Every function here is `unsafe` for one reason, stated once: it must only
//! run on a CPU with AVX-512 F/BW/VL/VNNI, with pointers as
//! [`crate::gemm::TileFn`] requires.

use core::arch::x86_64::*;

use crate::gemm::{TileCols, TileRows, CHUNK, RM, RN};

/// # Safety
/// See the module doc.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemm_u8s8_4x4(w: &TileRows, a: &TileCols, chunks: usize, sub_chunks: usize, out: &mut [[f32; RN]; RM]) {
    let mut acc = [[_mm512_setzero_ps(); RN]; RM];
    for ch in 0..chunks {
        let (ob, of) = (ch * CHUNK, ch * CHUNK / 4);
        let wu: [__m512i; RM] = core::array::from_fn(|r| _mm512_loadu_si512(w.u[r].add(ob).cast()));
        let ws: [__m512; RM] = core::array::from_fn(|r| _mm512_loadu_ps(w.s[r].add(of)));
        for c in 0..RN {
            let aq = _mm512_loadu_si512(a.q[c].add(ob).cast());
            let ad = _mm512_loadu_ps(a.d[c].add(of));
            for r in 0..RM {
                let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wu[r], aq);
                let sd = _mm512_mul_ps(ws[r], ad);
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), sd, acc[r][c]);
            }
        }
    }
    // The bias term: a dot over sub-blocks, into the same lanes.
    for ch in 0..sub_chunks {
        let o = ch * 16;
        let wb: [__m512; RM] = core::array::from_fn(|r| _mm512_loadu_ps(w.bias[r].add(o)));
        for c in 0..RN {
            let s = _mm512_loadu_ps(a.sums[c].add(o));
            for r in 0..RM {
                acc[r][c] = _mm512_fmadd_ps(wb[r], s, acc[r][c]);
            }
        }
    }
    for r in 0..RM {
        for c in 0..RN {
            out[r][c] = _mm512_reduce_add_ps(acc[r][c]);
        }
    }
}
