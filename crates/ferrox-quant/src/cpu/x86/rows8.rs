//! 32-element kinds re-laid at load eight rows at a time, for AVX2 CPUs
//! (no AVX-512): the layer matrices' decode matvec and their GEMM panels.
//!
//! The key decision: **the decode layout is the GEMM panel, compressed**.
//! Per 8-row group and block, the eight rows' scales (and Q5_1's mins) side
//! by side, then the codes as the rows-in-lanes GEMM ([`super::avx2_gemm`])
//! takes them: each 32 bytes hold four consecutive codes of each of the
//! eight rows. Nibble kinds keep their 4 bits a code (two such 32-byte
//! groups share one register: low nibbles elements `8j..8j+4`, high nibbles
//! `8j+4..8j+8`) and Q5's fifth bits sit in a 32-byte plane beside them.
//! Decode then broadcasts four activation bytes against eight rows' codes:
//! one `vpmaddubsw` makes two products for each of eight rows, a lane's sums
//! stay one row's, the 16-bit sums of several groups add up before any
//! widening, and a block costs one convert and one or two FMAs for the eight
//! rows with no horizontal sum. The row-major one-row kernel spends about
//! four times the instructions per byte (Q5_1: a scalar f16 conversion of
//! `d` and `m` per row and block, a horizontal sum per row), so it ran at a
//! third of the memory bandwidth. The same bytes make the GEMM's panel by
//! unpacking alone, without the row-major path's 8x8 transpose.
//!
//! The copy is the stored matrix's size exactly (the same bytes, moved) and
//! the stored blocks come back bit for bit ([`deinterleave_row`]).
//!
//! Every `unsafe fn` here is so for one reason, stated once: it must only
//! run on a CPU with AVX2, FMA and F16C, with the lengths its doc states.

use core::arch::x86_64::*;

use super::avx2::KVALUES_IQ4NL;
use crate::cpu::ActPrep;
use crate::QuantKind;

/// Where a kind's block keeps its parts, and where its group block keeps
/// them: the one table every function here reads.
#[derive(Clone, Copy)]
pub(crate) struct Form {
    /// Stored block bytes.
    block: usize,
    /// Offset of the f16 min in the stored block (Q5_1).
    min: Option<usize>,
    /// Offset of the 32 fifth bits in the stored block (Q5_0, Q5_1).
    qh: Option<usize>,
    /// Offset of the codes in the stored block.
    qs: usize,
    /// Codes are nibbles (else whole bytes: Q8_0).
    nibbles: bool,
}

impl Form {
    /// The kinds with this layout, or `None`.
    pub(crate) fn of(kind: QuantKind) -> Option<Form> {
        use QuantKind::*;
        match kind {
            Q4_0 | IQ4NL => Some(Form::nib(false, false)),
            Q5_0 => Some(Form::nib(true, false)),
            Q5_1 => Some(Form::nib(true, true)),
            Q8_0 => Some(Form { block: 34, min: None, qh: None, qs: 2, nibbles: false }),
            _ => None, // capability table: the 32-element kinds measured to pay
        }
    }

    /// A nibble kind's form with (`hb`) fifth bits and (`min`) a min: the
    /// kernels' view, which needs only the group block's offsets.
    const fn nib(hb: bool, min: bool) -> Form {
        let block = 18 + if hb { 4 } else { 0 } + if min { 2 } else { 0 };
        Form { block, min: if min { Some(2) } else { None }, qh: if hb { Some(block - 20) } else { None }, qs: block - 16, nibbles: true }
    }

    /// Bytes of one stored block.
    pub(crate) fn block_bytes(self) -> usize {
        self.block
    }

    /// Bytes of one group block (eight stored blocks).
    pub(crate) fn group_block(self) -> usize {
        8 * self.block
    }

    /// Offset of the mins plane in a group block.
    fn min_at(self) -> usize {
        16
    }

    /// Offset of the fifth-bits plane.
    fn qh_at(self) -> usize {
        16 + if self.min.is_some() { 16 } else { 0 }
    }

    /// Offset of the codes.
    fn codes_at(self) -> usize {
        self.qh_at() + if self.qh.is_some() { 32 } else { 0 }
    }
}

/// Element `e`'s low four bits (nibble kinds) of a stored block.
fn nibble(f: Form, blk: &[u8], e: usize) -> u8 {
    let q = blk[f.qs + e % 16];
    if e < 16 {
        q & 0x0F
    } else {
        q >> 4
    }
}

/// Element `e`'s fifth bit (0 or 1) of a stored Q5 block.
fn fifth(f: Form, blk: &[u8], e: usize) -> u8 {
    f.qh.map_or(0, |at| (blk[at + e / 8] >> (e % 8)) & 1)
}

/// Interleaves `rows` (a multiple of 8) rows of stored blocks (`row_bytes`
/// each) into `out` (the same length).
pub(crate) fn interleave(f: Form, src: &[u8], rows: usize, row_bytes: usize, out: &mut [u8]) {
    let (nb, gb) = (row_bytes / f.block, f.group_block());
    for g in 0..rows / 8 {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * gb..][..gb];
            for r in 0..8 {
                let blk = &src[(g * 8 + r) * row_bytes + b * f.block..][..f.block];
                dst[2 * r..2 * r + 2].copy_from_slice(&blk[..2]);
                if let Some(m) = f.min {
                    dst[f.min_at() + 2 * r..][..2].copy_from_slice(&blk[m..m + 2]);
                }
                for e in 0..4 {
                    let at = 4 * r + e;
                    if f.nibbles {
                        let mut bits = 0u8;
                        for j in 0..4 {
                            let (lo, hi) = (8 * j + e, 8 * j + 4 + e);
                            dst[f.codes_at() + 32 * j + at] = nibble(f, blk, lo) | nibble(f, blk, hi) << 4;
                            bits |= fifth(f, blk, lo) << (2 * j) | fifth(f, blk, hi) << (2 * j + 1);
                        }
                        if f.qh.is_some() {
                            dst[f.qh_at() + at] = bits;
                        }
                    } else {
                        for k in 0..8 {
                            dst[f.codes_at() + 32 * k + at] = blk[f.qs + 4 * k + e];
                        }
                    }
                }
            }
        }
    }
}

/// Row `lane` of group `w` (`nb` group blocks) back as its stored blocks,
/// bit for bit, into `out` (`nb` blocks).
pub(crate) fn deinterleave_row(f: Form, w: &[u8], nb: usize, lane: usize, out: &mut [u8]) {
    let gb = f.group_block();
    for (src, blk) in w.chunks_exact(gb).take(nb).zip(out.chunks_exact_mut(f.block)) {
        blk.fill(0);
        blk[..2].copy_from_slice(&src[2 * lane..2 * lane + 2]);
        if let Some(m) = f.min {
            blk[m..m + 2].copy_from_slice(&src[f.min_at() + 2 * lane..][..2]);
        }
        for e in 0..4 {
            let at = 4 * lane + e;
            if f.nibbles {
                let bits = src[f.qh_at() + at];
                for j in 0..4 {
                    let pair = src[f.codes_at() + 32 * j + at];
                    for (h, el) in [(0, 8 * j + e), (1, 8 * j + 4 + e)] {
                        let q = (pair >> (4 * h)) & 0x0F;
                        blk[f.qs + el % 16] |= if el < 16 { q } else { q << 4 };
                        if let Some(qh) = f.qh {
                            blk[qh + el / 8] |= ((bits >> (2 * j + h)) & 1) << (el % 8);
                        }
                    }
                }
            } else {
                for k in 0..8 {
                    blk[f.qs + 4 * k + e] = src[f.codes_at() + 32 * k + at];
                }
            }
        }
    }
}

/// The decode kernel of a kind: the eight rows of a group (`nb` group
/// blocks) against one activation row prepared as `p` (Q8_0, or Q8_1 for
/// Q5_1), prefetching `prefetch` bytes ahead into L2.
///
/// # Safety
/// See the module doc; `w` holds `nb` group blocks of the kind, `p` `nb`
/// blocks.
pub(crate) type GroupDotFn = unsafe fn(w: &[u8], nb: usize, p: &ActPrep, prefetch: usize) -> [f32; 8];

/// The GEMM panel ([`crate::gemm::Rows8`]) of a group: `u` its codes as the
/// kind's `avx2` packer makes them (`256` bytes a block), `s` the eight
/// rows' scales and `bias` their own biases (Q5_1's mins, else zero; the
/// caller folds the offset in), 8 floats a block each.
///
/// # Safety
/// See the module doc; `w` holds `nb` group blocks, `u` `256 * nb` bytes,
/// `s` and `bias` `8 * nb` floats.
pub(crate) type GroupPackFn = unsafe fn(w: &[u8], nb: usize, u: &mut [u8], s: &mut [f32], bias: &mut [f32]);

/// The decode kernel and the panel packer of `kind`, by name, and as functions.
pub(crate) fn kernels(kind: QuantKind) -> Option<(&'static str, GroupDotFn, GroupPackFn)> {
    use QuantKind::*;
    Some(match kind {
        Q4_0 => ("avx2::rows8_q4_0", group_dot_nib::<false, false, false, 8> as GroupDotFn, pack_nib::<false, false, false> as GroupPackFn),
        Q5_0 => ("avx2::rows8_q5_0", group_dot_nib::<true, false, false, 16>, pack_nib::<true, false, false>),
        Q5_1 => ("avx2::rows8_q5_1", group_dot_nib::<true, true, false, 0>, pack_nib::<true, true, false>),
        IQ4NL => ("avx2::rows8_iq4_nl", group_dot_nib::<false, false, true, 0>, pack_nib::<false, false, true>),
        Q8_0 => ("avx2::rows8_q8_0", group_dot_q8_0, pack_q8_0),
        _ => return None, // capability table: as `Form::of`
    })
}

/// The `(lo, hi)` code registers of nibble group `j` of a block at `blk`
/// (`HB`: with the fifth bits of plane `h`; `TABLE`: looked up in IQ4_NL's
/// values, signed): four codes of each of eight rows for elements
/// `8j..8j+4` and `8j+4..8j+8`.
#[inline(always)]
unsafe fn unpack_nib<const HB: bool, const TABLE: bool>(codes: *const u8, h: __m256i, table: __m256i, j: usize) -> (__m256i, __m256i) {
    let m4 = _mm256_set1_epi8(0x0F);
    let v = _mm256_loadu_si256(codes.add(32 * j).cast());
    let (mut lo, mut hi) = (_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4));
    if HB {
        // Bit 2j (lo) and 2j+1 (hi) of each byte moved to bit 4. A 16-bit
        // shift by at most 4 keeps bit 4 of each byte its own byte's.
        let b4 = _mm256_set1_epi8(0x10);
        let (l, u) = match j {
            0 => (_mm256_slli_epi16::<4>(h), _mm256_slli_epi16::<3>(h)),
            1 => (_mm256_slli_epi16::<2>(h), _mm256_slli_epi16::<1>(h)),
            2 => (h, _mm256_srli_epi16::<1>(h)),
            _ => (_mm256_srli_epi16::<2>(h), _mm256_srli_epi16::<3>(h)),
        };
        lo = _mm256_or_si256(lo, _mm256_and_si256(l, b4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(u, b4));
    }
    if TABLE {
        lo = _mm256_shuffle_epi8(table, lo);
        hi = _mm256_shuffle_epi8(table, hi);
    }
    (lo, hi)
}

/// Four activation bytes (elements `4k..4k+4` from `a`) in every lane.
#[inline(always)]
unsafe fn bcast(a: *const i8, k: usize) -> __m256i {
    _mm256_set1_epi32(a.add(4 * k).cast::<i32>().read_unaligned())
}

/// [`GroupDotFn`] of the nibble kinds: `HB` Q5's fifth bits, `MIN` Q5_1's
/// per-block min (`+ m * s` with the activation's `s`), `TABLE` IQ4_NL's
/// signed values (multiplied with the sign trick, one 32-bit widening a
/// group), `OFF` the code offset (`(q - OFF) . a` as `q . a - OFF * sum(a)`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_dot_nib<const HB: bool, const MIN: bool, const TABLE: bool, const OFF: i32>(
    w: &[u8],
    nb: usize,
    p: &ActPrep,
    prefetch: usize,
) -> [f32; 8] {
    let f = Form::nib(HB, MIN);
    let (gb, codes_at, qh_at) = (f.group_block(), f.codes_at(), f.qh_at());
    let ones = _mm256_set1_epi16(1);
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    let (mut acc, mut accm) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (wp, aq) = (w.as_ptr(), p.qs.as_ptr());
    for b in 0..nb {
        let blk = wp.add(b * gb);
        for l in (0..gb).step_by(64) {
            _mm_prefetch::<_MM_HINT_T1>(blk.cast::<i8>().wrapping_add(prefetch + l));
        }
        let codes = blk.add(codes_at);
        let h = if HB { _mm256_loadu_si256(blk.add(qh_at).cast()) } else { _mm256_setzero_si256() };
        let a = aq.add(32 * b);
        let mut s32 = _mm256_setzero_si256();
        if TABLE {
            for j in 0..4 {
                let (lo, hi) = unpack_nib::<HB, TABLE>(codes, h, table, j);
                let pl = _mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(bcast(a, 2 * j), lo));
                let ph = _mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(bcast(a, 2 * j + 1), hi));
                s32 = _mm256_add_epi32(s32, _mm256_add_epi32(_mm256_madd_epi16(pl, ones), _mm256_madd_epi16(ph, ones)));
            }
        } else {
            // 16-bit sums: a pair is at most 2 * 31 * 127, so four products
            // (two groups) fit for 5-bit codes, eight for 4-bit ones.
            let mut s16 = [_mm256_setzero_si256(); 2];
            for j in 0..4 {
                let (lo, hi) = unpack_nib::<HB, TABLE>(codes, h, table, j);
                let pl = _mm256_maddubs_epi16(lo, bcast(a, 2 * j));
                let ph = _mm256_maddubs_epi16(hi, bcast(a, 2 * j + 1));
                let k = if HB { j / 2 } else { j % 2 };
                s16[k] = _mm256_add_epi16(s16[k], _mm256_add_epi16(pl, ph));
            }
            s32 = _mm256_add_epi32(_mm256_madd_epi16(s16[0], ones), _mm256_madd_epi16(s16[1], ones));
            if OFF != 0 {
                s32 = _mm256_sub_epi32(s32, _mm256_set1_epi32(OFF * *p.sum.get_unchecked(b)));
            }
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(d, _mm256_set1_ps(*p.d.get_unchecked(b))), acc);
        if MIN {
            let m = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16).cast()));
            accm = _mm256_fmadd_ps(m, _mm256_set1_ps(*p.s.get_unchecked(b)), accm);
        }
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), _mm256_add_ps(acc, accm));
    out
}

/// [`GroupDotFn`] of Q8_0: signed codes with the sign trick, two chains.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_dot_q8_0(w: &[u8], nb: usize, p: &ActPrep, prefetch: usize) -> [f32; 8] {
    const GB: usize = 8 * 34;
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let (wp, aq) = (w.as_ptr(), p.qs.as_ptr());
    for b in 0..nb {
        let blk = wp.add(b * GB);
        for l in (0..GB).step_by(64) {
            _mm_prefetch::<_MM_HINT_T1>(blk.cast::<i8>().wrapping_add(prefetch + l));
        }
        let a = aq.add(32 * b);
        let mut s = [_mm256_setzero_si256(); 2];
        for k in 0..8 {
            let q = _mm256_loadu_si256(blk.add(16 + 32 * k).cast());
            let pr = _mm256_maddubs_epi16(_mm256_sign_epi8(q, q), _mm256_sign_epi8(bcast(a, k), q));
            s[k % 2] = _mm256_add_epi32(s[k % 2], _mm256_madd_epi16(pr, ones));
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        let s32 = _mm256_add_epi32(s[0], s[1]);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s32), _mm256_mul_ps(d, _mm256_set1_ps(*p.d.get_unchecked(b))), acc);
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// The eight scales (and `MIN`: mins, else zeros) of a group block into
/// `s` and `bias` at block `b`.
#[inline(always)]
unsafe fn pack_scales<const MIN: bool>(blk: *const u8, b: usize, s: &mut [f32], bias: &mut [f32]) {
    _mm256_storeu_ps(s.as_mut_ptr().add(8 * b), _mm256_cvtph_ps(_mm_loadu_si128(blk.cast())));
    let m = if MIN { _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16).cast())) } else { _mm256_setzero_ps() };
    _mm256_storeu_ps(bias.as_mut_ptr().add(8 * b), m);
}

/// [`GroupPackFn`] of the nibble kinds (as [`group_dot_nib`]'s flags); the
/// IQ4_NL codes as their packer has them (`value ^ 0x80`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_nib<const HB: bool, const MIN: bool, const TABLE: bool>(w: &[u8], nb: usize, u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    let f = Form::nib(HB, MIN);
    let (gb, codes_at, qh_at) = (f.group_block(), f.codes_at(), f.qh_at());
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    let flip = _mm256_set1_epi8(-128);
    for b in 0..nb {
        let blk = w.as_ptr().add(b * gb);
        let h = if HB { _mm256_loadu_si256(blk.add(qh_at).cast()) } else { _mm256_setzero_si256() };
        for j in 0..4 {
            let (mut lo, mut hi) = unpack_nib::<HB, TABLE>(blk.add(codes_at), h, table, j);
            if TABLE {
                (lo, hi) = (_mm256_xor_si256(lo, flip), _mm256_xor_si256(hi, flip));
            }
            _mm256_storeu_si256(u.as_mut_ptr().add(256 * b + 64 * j).cast(), lo);
            _mm256_storeu_si256(u.as_mut_ptr().add(256 * b + 64 * j + 32).cast(), hi);
        }
        pack_scales::<MIN>(blk, b, s, bias);
    }
}

/// [`GroupPackFn`] of Q8_0: the codes as its packer has them (`q ^ 0x80`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_q8_0(w: &[u8], nb: usize, u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    let flip = _mm256_set1_epi8(-128);
    for b in 0..nb {
        let blk = w.as_ptr().add(b * 8 * 34);
        for k in 0..8 {
            let q = _mm256_loadu_si256(blk.add(16 + 32 * k).cast());
            _mm256_storeu_si256(u.as_mut_ptr().add(256 * b + 32 * k).cast(), _mm256_xor_si256(q, flip));
        }
        pack_scales::<false>(blk, b, s, bias);
    }
}
