//! The AMX-INT8 micro-kernel of the packed GEMM ([`crate::gemm`]).
//!
//! The key decision: AMX tiles do only the integer part, one sub-block at a
//! time. Per sub-block `k` of 16 or 32 elements, one `tdpbusd` multiplies 16
//! weight rows (u8, straight from the row-major panel, stride = padded row)
//! by 16 tokens (s8, packed four bytes per token per tile row, as the
//! instruction wants) into 16x16 exact i32 sums. The accumulator tile starts
//! at `-OFFSET * sum(q_a)` per token (a stride-0 load), so the unsigned codes'
//! offset is gone before any rounding. AVX-512 then scales each row of sums
//! by `scale[row] * d[token]` into 16 float accumulators (token lanes). The
//! scales differ per sub-block, so no int sums can be carried further.
//!
//! Stable Rust has no AMX intrinsics: the five tile instructions are inline
//! assembly (the assembler knows them); tile registers are never touched by
//! compiled code, so state across `asm!` blocks is ours alone.
//!
//! Every function here is `unsafe` for one reason, stated once: it must only
//! run on a CPU with AMX-TILE/AMX-INT8 and AVX-512 F/BW/VL/VNNI, in a thread
//! whose process was granted the tile data state ([`usable`]), with pointers
//! as [`crate::gemm`] documents.

use core::arch::asm;
use core::arch::x86_64::*;

/// Whether this CPU has AMX-TILE and AMX-INT8 and Linux granted the process
/// the tile data state (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`),
/// asked once.
pub(crate) fn usable() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        let l7 = __cpuid_count(7, 0);
        let (tile, int8) = (l7.edx & (1 << 24) != 0, l7.edx & (1 << 25) != 0);
        if !(tile && int8) {
            return false;
        }
        request_tile_permission()
    })
}

/// Whether [`usable`] holds and the CPU also has AMX-BF16 and AVX512-BF16
/// (the bf16 product, [`gemm_bf16_32x32`]), asked once: `cpuid`
/// traps to the hypervisor in a VM (microseconds).
pub(crate) fn bf16_usable() -> bool {
    static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OK.get_or_init(|| {
        let l7 = __cpuid_count(7, 0);
        let l71 = __cpuid_count(7, 1);
        usable() && l7.edx & (1 << 22) != 0 && l71.eax & (1 << 5) != 0
    })
}

#[cfg(target_os = "linux")]
fn request_tile_permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: i64 = 0x1023;
    const XFEATURE_XTILEDATA: i64 = 18;
    let ret: i64;
    // SAFETY: the arch_prctl system call (158 on x86-64) with a request that
    // only changes this process's permitted xsave features; it reads no
    // memory of ours. The kernel clobbers rcx and r11.
    unsafe {
        asm!("syscall", inlateout("rax") 158i64 => ret, in("rdi") ARCH_REQ_XCOMP_PERM,
             in("rsi") XFEATURE_XTILEDATA, lateout("rcx") _, lateout("r11") _, options(nostack));
    }
    ret == 0
}

#[cfg(not(target_os = "linux"))]
fn request_tile_permission() -> bool {
    false // other kernels: not wired; the rows-in-lanes GEMM serves
}

/// The 64-byte tile configuration (palette 1): tile 0 = weights (16 rows x
/// `sub` bytes), 1 = activations (`sub / 4` rows x 64 bytes), 2 = sums
/// (16 x 64 bytes).
#[repr(C, align(64))]
struct TileConfig([u8; 64]);

impl TileConfig {
    fn new(sub: usize) -> TileConfig {
        let mut c = [0u8; 64];
        c[0] = 1;
        let mut set = |t: usize, rows: u8, colsb: u16| {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
            c[48 + t] = rows;
        };
        set(0, 16, sub as u16);
        set(1, (sub / 4) as u8, 64);
        set(2, 16, 64);
        TileConfig(c)
    }
}

/// Loads the bf16 tile configuration: eight tiles of 16 rows x 64 bytes —
/// 0 and 1 weights (16 rows x 32 bf16 each), 2 and 3 activations (16 rows
/// of 16 token pairs each), 4–7 the f32 sums of the four products.
///
/// # Safety
/// See the module doc.
pub(crate) unsafe fn configure_bf16() {
    let mut c = [0u8; 64];
    c[0] = 1;
    for t in 0..8 {
        c[16 + 2 * t..18 + 2 * t].copy_from_slice(&64u16.to_le_bytes());
        c[48 + t] = 16;
    }
    let cfg = TileConfig(c);
    asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
}

/// `out[p][q][row][token]`: the f32 dot products of two 16-row bf16 weight
/// panels (`a`, row-major, rows `a_stride` bytes apart, panel 1 sixteen rows
/// on) with two 16-token tiles (`b[q]`: per 32-element chunk, 16 rows of 16
/// (x[2i], x[2i+1]) pairs, 1 KiB), over `chunks` chunks. Four independent
/// accumulators keep the tile unit busy (one alone waits out each
/// product's latency), and the sums stay in the tiles across the whole row:
/// no per-block scaling, which is what bounds the integer path. The tile
/// unit is configured by [`configure_bf16`].
///
/// # Safety
/// See the module doc; `a` covers 32 rows of `chunks * 64` bytes, each
/// `b[q]` `chunks` KiB.
pub(crate) unsafe fn gemm_bf16_32x32(a: *const u16, a_stride: usize, b: [*const u16; 2], chunks: usize, out: &mut [[[[f32; 16]; 16]; 2]; 2]) {
    asm!("tilezero tmm4", "tilezero tmm5", "tilezero tmm6", "tilezero tmm7", options(nostack, nomem));
    let a1 = a.cast::<u8>().add(16 * a_stride).cast::<u16>();
    for kc in 0..chunks {
        asm!(
            "tileloadd tmm0, [{a0} + {sa}*1]",
            "tileloadd tmm2, [{b0} + {sb}*1]",
            "tdpbf16ps tmm4, tmm0, tmm2",
            "tileloadd tmm3, [{b1} + {sb}*1]",
            "tdpbf16ps tmm5, tmm0, tmm3",
            "tileloadd tmm1, [{a1} + {sa}*1]",
            "tdpbf16ps tmm6, tmm1, tmm2",
            "tdpbf16ps tmm7, tmm1, tmm3",
            a0 = in(reg) a.add(kc * 32),
            a1 = in(reg) a1.add(kc * 32),
            sa = in(reg) a_stride,
            b0 = in(reg) b[0].add(kc * 512),
            b1 = in(reg) b[1].add(kc * 512),
            sb = in(reg) 64usize,
            options(nostack, readonly),
        );
    }
    asm!(
        "tilestored [{c00} + {sc}*1], tmm4",
        "tilestored [{c01} + {sc}*1], tmm5",
        "tilestored [{c10} + {sc}*1], tmm6",
        "tilestored [{c11} + {sc}*1], tmm7",
        c00 = in(reg) out[0][0].as_mut_ptr(),
        c01 = in(reg) out[0][1].as_mut_ptr(),
        c10 = in(reg) out[1][0].as_mut_ptr(),
        c11 = in(reg) out[1][1].as_mut_ptr(),
        sc = in(reg) 64usize,
        options(nostack),
    );
}

/// One panel of 16 rows against one tile of 16 tokens over `subs` sub-blocks.
pub(crate) struct AmxTile {
    /// Row-major weight codes, 16 rows of `stride` bytes.
    pub(crate) u: *const u8,
    /// Bytes from one row to the next.
    pub(crate) stride: usize,
    /// Bytes from one sub-block of a row to the next (`sub` when packed; 34
    /// when reading Q8_0 blocks in place, past each block's scale).
    pub(crate) sub_step: usize,
    /// Weights are signed bytes read in place (Q8_0: `tdpbssd`, no offset,
    /// `init` unused) rather than packed unsigned codes (`tdpbusd`).
    pub(crate) signed: bool,
    /// Per sub-block, the 16 rows' scales.
    pub(crate) scale: *const f32,
    /// Per sub-block, the 16 rows' own biases (the kind's minimum), or null.
    pub(crate) bias: *const f32,
    /// Per sub-block, the token tile's bytes (`sub / 4` rows of 64).
    pub(crate) q: *const i8,
    /// Per sub-block, the 16 tokens' scales.
    pub(crate) d: *const f32,
    /// Per sub-block, the 16 tokens' `-OFFSET * sum(q_a)` (i32).
    pub(crate) init: *const i32,
    /// Per sub-block, the 16 tokens' `d * sum(q_a)` (used with `bias`).
    pub(crate) sums: *const f32,
    /// Prefetch the weight rows ahead (the panel meets few token tiles).
    pub(crate) prefetch: bool,
}

/// Loads the tile configuration for sub-blocks of `sub` elements into this
/// thread's tile unit.
///
/// # Safety
/// See the module doc.
pub(crate) unsafe fn configure(sub: usize) {
    let cfg = TileConfig::new(sub);
    asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
}

/// Releases this thread's tile state (so context switches stop saving it).
///
/// # Safety
/// See the module doc.
pub(crate) unsafe fn release() {
    asm!("tilerelease", options(nostack, nomem));
}

/// Sub-block `k`'s exact integer sums (16 rows x 16 tokens) into `sums`.
///
/// # Safety
/// See the module doc; `k` is inside the tile's sub-blocks.
#[inline(always)]
unsafe fn tile_product(t: &AmxTile, sub: usize, k: usize, sums: &mut [[i32; 16]; 16]) {
    let qbytes = sub * 16;
    if t.signed {
        asm!(
            "tilezero tmm2",
            "tileloadd tmm0, [{u} + {su}*1]",
            "tileloadd tmm1, [{q} + {sq}*1]",
            "tdpbssd tmm2, tmm0, tmm1",
            "tilestored [{c} + {sc}*1], tmm2",
            u = in(reg) t.u.add(k * t.sub_step),
            su = in(reg) t.stride,
            q = in(reg) t.q.add(k * qbytes),
            sq = in(reg) 64usize,
            c = in(reg) sums.as_mut_ptr(),
            sc = in(reg) 64usize,
            options(nostack),
        );
    } else {
        asm!(
            "tileloadd tmm2, [{init} + {zero}*1]",
            "tileloadd tmm0, [{u} + {su}*1]",
            "tileloadd tmm1, [{q} + {sq}*1]",
            "tdpbusd tmm2, tmm0, tmm1",
            "tilestored [{c} + {sc}*1], tmm2",
            init = in(reg) t.init.add(16 * k),
            zero = in(reg) 0usize,
            u = in(reg) t.u.add(k * t.sub_step),
            su = in(reg) t.stride,
            q = in(reg) t.q.add(k * qbytes),
            sq = in(reg) 64usize,
            c = in(reg) sums.as_mut_ptr(),
            sc = in(reg) 64usize,
            options(nostack),
        );
    }
}

/// `out[row][token]` for 16 rows x 16 tokens. The tile unit is configured
/// for `sub` ([`configure`]).
///
/// # Safety
/// See the module doc; every pointer covers `subs` sub-blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn gemm_16x16(t: &AmxTile, sub: usize, subs: usize, out: &mut [[f32; 16]; 16]) {
    let mut acc = [_mm512_setzero_ps(); 16];
    let mut sums = [[0i32; 16]; 16];
    for k in 0..subs {
        // With one token tile (a server's decode step) every weight tile
        // comes from DRAM and is used once: ask for the rows' bytes four
        // sub-blocks ahead (hints; never fault).
        if t.prefetch {
            let ahead = t.u.wrapping_add((k + 4) * t.sub_step);
            for r in 0..16 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(r * t.stride).cast());
            }
        }
        tile_product(t, sub, k, &mut sums);
        let d = _mm512_loadu_ps(t.d.add(16 * k));
        let scale = t.scale.add(16 * k);
        for (r, a) in acc.iter_mut().enumerate() {
            let s = _mm512_mul_ps(_mm512_set1_ps(*scale.add(r)), d);
            let v = _mm512_cvtepi32_ps(_mm512_loadu_si512(sums[r].as_ptr().cast()));
            *a = _mm512_fmadd_ps(v, s, *a);
        }
        if !t.bias.is_null() {
            let sv = _mm512_loadu_ps(t.sums.add(16 * k));
            let bias = t.bias.add(16 * k);
            for (r, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_set1_ps(*bias.add(r)), sv, *a);
            }
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        _mm512_storeu_ps(o.as_mut_ptr(), *a);
    }
}

/// Loads the tile configuration of the product over the interleaved Q8_0
/// copy ([`interleaved_16x16`]): tile 0 = one block of 16 tokens' quants
/// (16 rows x 32 bytes), 1 = one block of a 16-row group of the copy (8 rows
/// x 64 bytes: each row 4 quants of each of the 16 weight rows), 2 and 3 =
/// the 16 x 16 sums of two blocks.
///
/// # Safety
/// See the module doc.
pub(crate) unsafe fn configure_interleaved() {
    let mut c = [0u8; 64];
    c[0] = 1;
    for (t, rows, colsb) in [(0usize, 16u8, 32u16), (1, 8, 64), (2, 16, 64), (3, 16, 64)] {
        c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
        c[48 + t] = rows;
    }
    let cfg = TileConfig(c);
    asm!("ldtilecfg [{0}]", in(reg) cfg.0.as_ptr(), options(nostack, readonly));
}

/// `out[token][row]`: 16 tokens against the 16 rows of one group of the
/// interleaved Q8_0 copy (`cpu::x86::vnni16`'s layout, `nb` blocks of
/// `GROUP_BLOCK` bytes from `w`). The copy's block of 16 rows x 4 quants per
/// 64-byte line is exactly `tdpbsud`'s B tile (16 columns x 4 k-values a
/// row), so it is read where it is, stride 64; the tokens' Q8_0 quants are
/// the A tile (`a`: per block, the 16 tokens' 32 quants one after another,
/// 512 bytes). Per block the
/// exact sums `sum(a * (q + 128))` less `128 * sum(a)` are scaled into the
/// float accumulators just as [`super::vnni16::group_dot`] does it, so each
/// token's 16 results are bit for bit what that kernel gives for the token
/// alone. `d` and `sum` are the tokens' block scales and quant sums, per
/// block the 16 tokens'. The tile unit is configured by
/// [`configure_interleaved`].
///
/// # Safety
/// See the module doc; `w` covers `nb` group blocks, `a` `nb * 512` bytes,
/// `d` and `sum` `16 * nb` values.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn interleaved_16x16(w: *const u8, nb: usize, a: *const i8, d: *const f32, sum: *const i32, prefetch: bool, out: &mut [[f32; 16]; 16]) {
    use super::vnni16::GROUP_BLOCK;
    // Block b's tile product into sums[b % 2] (C tile 2 or 3 alike), issued
    // one block ahead of the vector work that scales it: the tile unit
    // computes block b + 1 while the vector units take block b.
    macro_rules! product {
        ($b:expr, $c:literal, $sums:expr) => {{
            let blk = w.add($b * GROUP_BLOCK);
            // With one token tile (a server's step) each block is read once,
            // from DRAM: ask for the one four blocks ahead (hints; never fault).
            if prefetch {
                for l in (0..GROUP_BLOCK).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(blk.wrapping_add(4 * GROUP_BLOCK + l).cast());
                }
            }
            asm!(
                concat!("tilezero ", $c),
                "tileloadd tmm0, [{a} + {sa}*1]",
                "tileloadd tmm1, [{w} + {sw}*1]",
                concat!("tdpbsud ", $c, ", tmm0, tmm1"),
                concat!("tilestored [{c} + {sc}*1], ", $c),
                a = in(reg) a.add($b * 512),
                sa = in(reg) 32usize,
                w = in(reg) blk.add(32),
                sw = in(reg) 64usize,
                c = in(reg) $sums.as_mut_ptr(),
                sc = in(reg) 64usize,
                options(nostack),
            );
        }};
    }
    let mut acc = [_mm512_setzero_ps(); 16];
    let mut sums = [[[0i32; 16]; 16]; 2];
    if nb > 0 {
        product!(0, "tmm2", sums[0]);
    }
    for b in 0..nb {
        if b + 1 < nb {
            if b % 2 == 0 {
                product!(b + 1, "tmm3", sums[1]);
            } else {
                product!(b + 1, "tmm2", sums[0]);
            }
        }
        let sums = &sums[b % 2];
        let scale = _mm512_cvtph_ps(_mm256_loadu_si256(w.add(b * GROUP_BLOCK).cast()));
        for (t, acc) in acc.iter_mut().enumerate() {
            let s = _mm512_add_epi32(_mm512_loadu_si512(sums[t].as_ptr().cast()), _mm512_set1_epi32(-128 * *sum.add(b * 16 + t)));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(scale, _mm512_set1_ps(*d.add(b * 16 + t))), *acc);
        }
    }
    for (o, a) in out.iter_mut().zip(&acc) {
        _mm512_storeu_ps(o.as_mut_ptr(), *a);
    }
}

/// `m` transposed: `out[j][i] = m[i][j]` (rows x tokens to tokens x rows),
/// in registers: four rounds of in-lane and cross-lane shuffles.
///
/// # Safety
/// AVX-512F must be available.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn transpose_16x16(m: &[[f32; 16]; 16]) -> [[f32; 16]; 16] {
    let r: [__m512; 16] = core::array::from_fn(|i| _mm512_loadu_ps(m[i].as_ptr()));
    // Round 1: interleave pairs of rows, 32-bit elements.
    let mut a = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    // Round 2: 64-bit elements, rows four apart in groups of four.
    let mut b = [_mm512_setzero_ps(); 16];
    for g in 0..4 {
        let (x0, x1, x2, x3) = (a[4 * g], a[4 * g + 1], a[4 * g + 2], a[4 * g + 3]);
        b[4 * g] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x0), _mm512_castps_pd(x2)));
        b[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x0), _mm512_castps_pd(x2)));
        b[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x1), _mm512_castps_pd(x3)));
        b[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x1), _mm512_castps_pd(x3)));
    }
    // Now b[4g + k] holds, per 128-bit lane L, column 4L + k of rows 4g..4g+4.
    // Rounds 3 and 4: gather the four 128-bit lanes of column group L.
    let mut out = [[0f32; 16]; 16];
    for k in 0..4 {
        let (y0, y1, y2, y3) = (b[k], b[4 + k], b[8 + k], b[12 + k]);
        // lanes (y0.L0, y0.L1, y1.L0, y1.L1) and (y0.L2, y0.L3, y1.L2, y1.L3), same for y2/y3
        let lo01 = _mm512_shuffle_f32x4::<0b01_00_01_00>(y0, y1);
        let hi01 = _mm512_shuffle_f32x4::<0b11_10_11_10>(y0, y1);
        let lo23 = _mm512_shuffle_f32x4::<0b01_00_01_00>(y2, y3);
        let hi23 = _mm512_shuffle_f32x4::<0b11_10_11_10>(y2, y3);
        // column 4L + k = (y0.L, y1.L, y2.L, y3.L)
        let c0 = _mm512_shuffle_f32x4::<0b10_00_10_00>(lo01, lo23);
        let c1 = _mm512_shuffle_f32x4::<0b11_01_11_01>(lo01, lo23);
        let c2 = _mm512_shuffle_f32x4::<0b10_00_10_00>(hi01, hi23);
        let c3 = _mm512_shuffle_f32x4::<0b11_01_11_01>(hi01, hi23);
        _mm512_storeu_ps(out[k].as_mut_ptr(), c0);
        _mm512_storeu_ps(out[4 + k].as_mut_ptr(), c1);
        _mm512_storeu_ps(out[8 + k].as_mut_ptr(), c2);
        _mm512_storeu_ps(out[12 + k].as_mut_ptr(), c3);
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn transpose_16x16_matches_the_index_swap() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("NOT CHECKED: transpose_16x16 needs AVX-512F, which this CPU lacks");
            return;
        }
        let m: [[f32; 16]; 16] = core::array::from_fn(|i| core::array::from_fn(|j| (i * 16 + j) as f32));
        // SAFETY: AVX-512F checked above.
        let t = unsafe { super::transpose_16x16(&m) };
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(t[j][i], m[i][j], "at ({i}, {j})");
            }
        }
    }
}
