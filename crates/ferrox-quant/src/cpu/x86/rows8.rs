//! The 32-element kinds (and IQ4_XS, whose sub-blocks are IQ4_NL's, and
//! the K kinds) re-laid at load eight rows at a time, for AVX2 CPUs (no AVX-512): the decode
//! matvec and the GEMM panels of the matrices.
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
//! IQ4_XS keeps its super-block's scale words beside the other rows' and
//! its eight sub-blocks' codes as IQ4_NL's; its 6-bit sub-block scales are
//! unpacked for the eight rows at once (one dword lane a row) and multiply
//! the 32-bit sub-block sums, so a super-block still ends in one convert and
//! one FMA for eight rows.
//!
//! The K kinds of 16-element sub-blocks keep the same code registers:
//! Q6_K's nibbles as Q4_K's (a 16-element sub-block two registers), its top
//! two bits in a high plane beside them (64 bytes a 32-element chunk, as
//! Q5's fifth bits); Q3_K's and Q2_K's low two bits a plane of their own (a
//! 16-element sub-block one register), Q3_K's third bit a high plane. The
//! sixteen scales of a row sit two at a time side by side (Q3_K's twelve
//! bytes as stored, decoded for the eight rows in registers), so one
//! 16-byte load widened to 16 bits holds a sub-block pair's scales for the
//! eight rows. The codes' 16-bit
//! sums meet them by `vpmaddwd` per sub-block, as ggml's row kernels do,
//! and the codes' offset is taken off once a super-block against the
//! activation's 16-element sums (`bsums`).
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
/// them: the one table every function here reads. A group block is the
/// header pieces, each the eight rows' side by side (the f16 scale first),
/// then per 32-element chunk the codes' high plane (Q5's fifth bits, Q6_K's
/// top two bits, Q3_K's third bit) and their low plane. A plane of `b` bits a code
/// holds a 32-element chunk in `32 * b` bytes: the code of element `4g + e`
/// of the chunk and row `r` sits in byte `32 * (g * b / 8) + 4r + e`, at
/// bit `g * b % 8` (nibbles: group `2j` low, `2j + 1` high, in register
/// `j`; Q8_0's bytes: group `g` in register `g`).
#[derive(Clone, Copy)]
pub(crate) struct Form {
    /// Stored block bytes.
    block: usize,
    /// The stored block's header pieces `(offset, bytes)`, in group order.
    head: &'static [(usize, usize)],
    /// Offset of the codes' high bits in the stored block.
    qh: Option<usize>,
    /// Offset of the codes' low bits in the stored block.
    qs: usize,
    /// Bits a code in the low plane (4: nibbles; 8: Q8_0; 2).
    lo: usize,
    /// Bits a code in the high plane (0: none).
    hi: usize,
    /// 32-element chunks a block (the K kinds and IQ4_XS: 8).
    subs: usize,
    /// How the stored block orders its codes ([`code_at`]).
    order: Order,
}

/// How a stored block orders its codes ([`code_at`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Order {
    /// 32-element sub-blocks: 16 bytes of nibbles (the low nibbles the
    /// first 16 elements) or 32 code bytes, the fifth bits in element order.
    Sub32,
    /// Q4_K / Q5_K: 64-element chunks, the low nibbles the chunk's first 32
    /// elements; their 6-bit scales and mins re-packed ([`K4_SCALES`]).
    K4,
    /// Q6_K: per 128-element half, `ql`'s 64 bytes hold four nibble streams
    /// (bytes 0..32 low, 32..64 low, 0..32 high, 32..64 high), `qh`'s 32
    /// their top two bits, stream `j` at bit `2j`.
    K6,
    /// Q3_K / Q2_K: per 128-element half, 32 bytes of four 2-bit streams
    /// (stream `j` at bit `2j`); Q3_K's third bits in `hmask` byte `e % 32`,
    /// bit `e / 32`.
    K2,
}

impl Form {
    /// The kinds with this layout, or `None`.
    pub(crate) fn of(kind: QuantKind) -> Option<Form> {
        use QuantKind::*;
        match kind {
            Q4_0 | IQ4NL => Some(Form::nib(false, false)),
            Q5_0 => Some(Form::nib(true, false)),
            Q5_1 => Some(Form::nib(true, true)),
            Q8_0 => Some(Form { block: 34, head: &[(0, 2)], qh: None, qs: 2, lo: 8, hi: 0, subs: 1, order: Order::Sub32 }),
            IQ4XS => Some(Form::IQ4_XS),
            Q4K => Some(Form::Q4_K),
            Q5K => Some(Form::Q5_K),
            Q6K => Some(Form::Q6_K),
            Q3K => Some(Form::Q3_K),
            Q2K => Some(Form::Q2_K),
            _ => None, // capability table: the kinds measured to pay
        }
    }

    /// IQ4_XS: `d`, `scales_h` (u16) and `scales_l` (4 bytes), then eight
    /// sub-blocks of IQ4_NL codes.
    const IQ4_XS: Form = Form { block: 136, head: &[(0, 2), (2, 2), (4, 4)], qh: None, qs: 8, lo: 4, hi: 0, subs: 8, order: Order::Sub32 };

    /// Q4_K: `d` and `dmin`, then the scales and mins re-packed as two
    /// planes (96 bytes for the eight rows, [`K4_SCALES`]), then eight
    /// sub-blocks of codes.
    const Q4_K: Form = Form { block: 144, head: &[(0, 2), (2, 2), (4, 12)], qh: None, qs: 16, lo: 4, hi: 0, subs: 8, order: Order::K4 };

    /// Q5_K: as Q4_K, with a fifth-bits plane a sub-block (256 bytes).
    const Q5_K: Form = Form { block: 176, head: &[(0, 2), (2, 2), (4, 12)], qh: Some(16), qs: 48, lo: 4, hi: 1, subs: 8, order: Order::K4 };

    /// Q6_K: `d`, then its sixteen i8 scales two at a time (a 16-byte piece
    /// holds sub-blocks `2k` and `2k + 1` of the eight rows, row `r` at
    /// bytes `2r`, `2r + 1`), then the top two bits (64 bytes a chunk: a
    /// 16-element sub-block's in one register) and the nibbles.
    const Q6_K: Form = Form {
        block: 210,
        head: &[(208, 2), (192, 2), (194, 2), (196, 2), (198, 2), (200, 2), (202, 2), (204, 2), (206, 2)],
        qh: Some(128),
        qs: 0,
        lo: 4,
        hi: 2,
        subs: 8,
        order: Order::K6,
    };

    /// Q3_K: `d`, then its twelve scale bytes two at a time side by side
    /// (as they are: [`q3_scales8`] decodes them for the eight rows), then
    /// the third bits (32 bytes a chunk) and the low two bits (64 bytes a
    /// chunk: a 16-element sub-block's in one register).
    const Q3_K: Form = Form {
        block: 110,
        head: &[(108, 2), (96, 2), (98, 2), (100, 2), (102, 2), (104, 2), (106, 2)],
        qh: Some(0),
        qs: 32,
        lo: 2,
        hi: 1,
        subs: 8,
        order: Order::K2,
    };

    /// Q2_K: `d` and `dmin`, then its sixteen scale bytes (`scale | min <<
    /// 4`) two at a time as Q6_K's, then the codes (64 bytes a chunk).
    const Q2_K: Form = Form {
        block: 84,
        head: &[(80, 2), (82, 2), (0, 2), (2, 2), (4, 2), (6, 2), (8, 2), (10, 2), (12, 2), (14, 2)],
        qh: None,
        qs: 16,
        lo: 2,
        hi: 0,
        subs: 8,
        order: Order::K2,
    };

    /// A 32-element nibble kind's form with (`hb`) fifth bits and (`min`)
    /// an f16 min after its scale.
    const fn nib(hb: bool, min: bool) -> Form {
        let block = 18 + if hb { 4 } else { 0 } + if min { 2 } else { 0 };
        let head: &'static [(usize, usize)] = if min { &[(0, 2), (2, 2)] } else { &[(0, 2)] };
        Form { block, head, qh: if hb { Some(block - 20) } else { None }, qs: block - 16, lo: 4, hi: if hb { 1 } else { 0 }, subs: 1, order: Order::Sub32 }
    }

    /// Bytes of one stored block.
    pub(crate) fn block_bytes(self) -> usize {
        self.block
    }

    /// Bytes of one group block (eight stored blocks).
    pub(crate) fn group_block(self) -> usize {
        8 * self.block
    }

    /// Offset of header piece `i` in a group block.
    const fn head_at(self, i: usize) -> usize {
        let mut at = 0;
        let mut k = 0;
        while k < i {
            at += 8 * self.head[k].1;
            k += 1;
        }
        at
    }

    /// Offset of 32-element chunk `sub`'s high plane (Q5's fifth bits):
    /// each chunk's two planes sit together, so a kernel reads the group
    /// block front to back.
    const fn hi_at(self, sub: usize) -> usize {
        self.head_at(self.head.len()) + 32 * (self.hi + self.lo) * sub
    }

    /// Offset of chunk `sub`'s low plane (the codes, or their low bits).
    const fn lo_at(self, sub: usize) -> usize {
        self.hi_at(sub) + 32 * self.hi
    }

    /// Header pieces copied as they are (Q4_K / Q5_K's third, the scales,
    /// is re-packed: [`K4_SCALES`]).
    fn plain_head(self) -> &'static [(usize, usize)] {
        if self.order == Order::K4 {
            &self.head[..2]
        } else {
            self.head
        }
    }
}

/// Where a stored block keeps element `e`'s code: the byte and shift of its
/// low bits, and the byte and shift of its high bits ([`Order`]).
fn code_at(f: Form, e: usize) -> (usize, u32, Option<(usize, u32)>) {
    let (half, j, l) = (e / 128, (e % 128) / 32, e % 32);
    match f.order {
        Order::Sub32 if f.lo == 8 => (f.qs + e, 0, None),
        Order::Sub32 => {
            let (sub, el) = (e / 32, e % 32);
            (f.qs + 16 * sub + el % 16, if el < 16 { 0 } else { 4 }, f.qh.map(|at| (at + e / 8, (e % 8) as u32)))
        }
        Order::K4 => {
            let (c, l, h) = (e / 64, e % 32, (e / 32) % 2);
            (f.qs + 32 * c + l, 4 * h as u32, f.qh.map(|at| (at + l, (2 * c + h) as u32)))
        }
        Order::K6 => (f.qs + 64 * half + 32 * (j % 2) + l, 4 * (j / 2) as u32, f.qh.map(|at| (at + 32 * half + l, 2 * j as u32))),
        Order::K2 => (f.qs + 32 * half + l, 2 * j as u32, f.qh.map(|at| (at + l, (e / 32) as u32))),
    }
}

/// The low `bits` bits of a byte.
const fn mask(bits: usize) -> u8 {
    ((1u16 << bits) - 1) as u8
}

/// Element `e`'s code ORed into a stored block (zeroed first).
fn set_code(f: Form, blk: &mut [u8], e: usize, code: u8) {
    let (at, shift, hb) = code_at(f, e);
    blk[at] |= (code & mask(f.lo)) << shift;
    if let Some((at, bit)) = hb {
        blk[at] |= (code >> f.lo) << bit;
    }
}

/// Where the code of element `4g + e` of chunk `sub` and row `r` sits in a
/// group block: the byte and shift of its low bits, and of its high bits.
fn plane_at(f: Form, sub: usize, g: usize, e: usize, r: usize) -> ((usize, u32), (usize, u32)) {
    let at = 4 * r + e;
    let lo = (f.lo_at(sub) + 32 * (g * f.lo / 8) + at, (g * f.lo % 8) as u32);
    let hi = (f.hi_at(sub) + 32 * (g * f.hi / 8) + at, (g * f.hi % 8) as u32);
    (lo, hi)
}

/// How Q4_K / Q5_K's twelve scale bytes sit in a group block (offset
/// [`Form::head_at`]`(2)`, 96 bytes): plane A, a byte per sub-block and row
/// (`A[8 * ib + r] = sc | (m & 3) << 6`), then plane B, a nibble per
/// sub-block and row (`B[8 * (ib / 2) + r]`, sub-block `ib`'s `m >> 2` in
/// nibble `ib % 2`). The same 96 bits as the stored encoding, moved so that
/// a sub-block's eight scales and mins are two 8-byte loads.
const K4_SCALES: (usize, usize) = (0, 64);

/// Interleaves `rows` (a multiple of 8) rows of stored blocks (`row_bytes`
/// each) into `out` (the same length, zeroed): the header pieces side by
/// side (Q4_K / Q5_K's scales as [`K4_SCALES`]), the codes as [`Form`]'s
/// planes.
pub(crate) fn interleave(f: Form, src: &[u8], rows: usize, row_bytes: usize, out: &mut [u8]) {
    let (nb, gb) = (row_bytes / f.block, f.group_block());
    // Each code's place, worked out once a call rather than once a row and
    // block: where the stored block keeps it ([`code_at`]) and where row
    // 0's copy goes ([`plane_at`]; row r's is 4r bytes on).
    struct Move {
        at: usize,
        shift: u32,
        high: Option<(usize, u32)>,
        lo: (usize, u32),
        hi: (usize, u32),
    }
    let moves: Vec<Move> = (0..f.subs)
        .flat_map(|sub| (0..8).flat_map(move |cg| (0..4).map(move |e| (sub, cg, e))))
        .map(|(sub, cg, e)| {
            let (at, shift, high) = code_at(f, 32 * sub + 4 * cg + e);
            let (lo, hi) = plane_at(f, sub, cg, e, 0);
            Move { at, shift, high, lo, hi }
        })
        .collect();
    let (lo_mask, hi_mask) = (mask(f.lo), mask(f.hi));
    for g in 0..rows / 8 {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * gb..][..gb];
            for r in 0..8 {
                let blk = &src[(g * 8 + r) * row_bytes + b * f.block..][..f.block];
                for (i, &(off, len)) in f.plain_head().iter().enumerate() {
                    dst[f.head_at(i) + len * r..][..len].copy_from_slice(&blk[off..off + len]);
                }
                if f.order == Order::K4 {
                    let mut q = [0u8; 12];
                    q.copy_from_slice(&blk[4..16]);
                    let (sc, m) = crate::scalar::k4_scales_mins(&q);
                    let at = f.head_at(2);
                    for ib in 0..8 {
                        dst[at + K4_SCALES.0 + 8 * ib + r] = sc[ib] | (m[ib] & 3) << 6;
                        dst[at + K4_SCALES.1 + 8 * (ib / 2) + r] |= (m[ib] >> 2) << (4 * (ib % 2));
                    }
                }
                for m in &moves {
                    let c = (blk[m.at] >> m.shift) & lo_mask | m.high.map_or(0, |(at, bit)| ((blk[at] >> bit) & hi_mask) << f.lo);
                    dst[m.lo.0 + 4 * r] |= (c & lo_mask) << m.lo.1;
                    if f.hi > 0 {
                        dst[m.hi.0 + 4 * r] |= (c >> f.lo) << m.hi.1;
                    }
                }
            }
        }
    }
}

/// Row `lane` of group `w` (`nb` group blocks) back as its stored blocks,
/// bit for bit, into `out` (`nb` blocks); Q4_K / Q5_K's scale encoding is
/// made again (its 96 bits are the planes' 96, a bijection).
pub(crate) fn deinterleave_row(f: Form, w: &[u8], nb: usize, lane: usize, out: &mut [u8]) {
    let gb = f.group_block();
    for (src, blk) in w.chunks_exact(gb).take(nb).zip(out.chunks_exact_mut(f.block)) {
        blk.fill(0);
        for (i, &(off, len)) in f.plain_head().iter().enumerate() {
            blk[off..off + len].copy_from_slice(&src[f.head_at(i) + len * lane..][..len]);
        }
        if f.order == Order::K4 {
            let at = f.head_at(2);
            let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
            for ib in 0..8 {
                let a = src[at + K4_SCALES.0 + 8 * ib + lane];
                let hi = (src[at + K4_SCALES.1 + 8 * (ib / 2) + lane] >> (4 * (ib % 2))) & 0x0F;
                (sc[ib], m[ib]) = (a & 63, (a >> 6) | hi << 2);
            }
            for j in 0..4 {
                blk[4 + j] = sc[j] | (sc[j + 4] >> 4) << 6;
                blk[8 + j] = m[j] | (m[j + 4] >> 4) << 6;
                blk[12 + j] = (sc[j + 4] & 0x0F) | (m[j + 4] & 0x0F) << 4;
            }
        }
        for sub in 0..f.subs {
            for cg in 0..8 {
                for e in 0..4 {
                    let ((lo, ls), (hi, hs)) = plane_at(f, sub, cg, e, lane);
                    let high = if f.hi > 0 { ((src[hi] >> hs) & mask(f.hi)) << f.lo } else { 0 };
                    set_code(f, blk, 32 * sub + 4 * cg + e, (src[lo] >> ls) & mask(f.lo) | high);
                }
            }
        }
    }
}

/// The decode kernel of a kind: the eight rows of a group (`n32`
/// 32-element chunks a row) against one activation row `a` of the kind's
/// activation kind (Q8_0, Q8_1 for Q5_1, Q8_K for IQ4_XS and the K kinds)
/// prepared as `p`, prefetching `prefetch` bytes ahead into L2.
///
/// # Safety
/// See the module doc; `w` holds the group's `n32` sub-blocks of the kind,
/// `a` and `p` one activation row of as many elements.
pub(crate) type GroupDotFn = unsafe fn(w: &[u8], n32: usize, a: &[u8], p: &ActPrep, prefetch: usize) -> [f32; 8];

/// The GEMM panel ([`crate::gemm::Rows8`]) of a group: `u` its codes as the
/// kind's unpack gives them (`q + OFFSET`; `8 * SUB` bytes a sub-block of
/// the kind's [`crate::Unpack::SUB`] elements, 32 or 16), `s` the eight
/// rows' sub-block scales and `bias` their own biases (Q5_1's and the K
/// kinds' mins, else zero; the caller folds the offset in), 8 floats a
/// sub-block each, the same floats as the stored rows give.
///
/// # Safety
/// See the module doc; `w` holds the group's `subs` sub-blocks, `u` `8 *
/// SUB * subs` bytes, `s` and `bias` `8 * subs` floats.
pub(crate) type GroupPackFn = unsafe fn(w: &[u8], subs: usize, u: &mut [u8], s: &mut [f32], bias: &mut [f32]);

/// The decode kernel and the panel packer of `kind`, by name, and as functions.
pub(crate) fn kernels(kind: QuantKind) -> Option<(&'static str, GroupDotFn, GroupPackFn)> {
    use QuantKind::*;
    Some(match kind {
        Q4_0 => ("avx2::rows8_q4_0", group_dot_nib::<false, false, false, 8> as GroupDotFn, pack_nib::<false, false, false> as GroupPackFn),
        Q5_0 => ("avx2::rows8_q5_0", group_dot_nib::<true, false, false, 16>, pack_nib::<true, false, false>),
        Q5_1 => ("avx2::rows8_q5_1", group_dot_nib::<true, true, false, 0>, pack_nib::<true, true, false>),
        IQ4NL => ("avx2::rows8_iq4_nl", group_dot_nib::<false, false, true, 0>, pack_nib::<false, false, true>),
        Q8_0 => ("avx2::rows8_q8_0", group_dot_q8_0, pack_q8_0),
        IQ4XS => ("avx2::rows8_iq4_xs", group_dot_iq4_xs, pack_iq4_xs),
        Q4K => ("avx2::rows8_q4_k", group_dot_k4::<false>, pack_k4::<false>),
        Q5K => ("avx2::rows8_q5_k", group_dot_k4::<true>, pack_k4::<true>),
        Q6K => ("avx2::rows8_q6_k", group_dot_q6_k, pack_q6_k),
        Q3K => ("avx2::rows8_q3_k", group_dot_q3_k, pack_q3_k),
        Q2K => ("avx2::rows8_q2_k", group_dot_q2_k, pack_q2_k),
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

/// The `bytes` of a group block at `blk`, `prefetch` bytes further on,
/// into L2 (an address past the copy's end is only a hint: never read).
#[inline(always)]
unsafe fn prefetch_ahead(blk: *const u8, bytes: usize, prefetch: usize) {
    for l in (0..bytes).step_by(64) {
        _mm_prefetch::<_MM_HINT_T1>(blk.cast::<i8>().wrapping_add(prefetch + l));
    }
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
    _a: &[u8],
    p: &ActPrep,
    prefetch: usize,
) -> [f32; 8] {
    let f = Form::nib(HB, MIN);
    let (gb, codes_at, qh_at) = (f.group_block(), f.lo_at(0), f.hi_at(0));
    let ones = _mm256_set1_epi16(1);
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    let (mut acc, mut accm) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (wp, aq) = (w.as_ptr(), p.qs.as_ptr());
    for b in 0..nb {
        let blk = wp.add(b * gb);
        prefetch_ahead(blk, gb, prefetch);
        let codes = blk.add(codes_at);
        let h = if HB { _mm256_loadu_si256(blk.add(qh_at).cast()) } else { _mm256_setzero_si256() };
        let a = aq.add(32 * b);
        let s32 = if TABLE {
            signed_sub(codes, table, a)
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
            let s32 = _mm256_add_epi32(_mm256_madd_epi16(s16[0], ones), _mm256_madd_epi16(s16[1], ones));
            if OFF != 0 {
                _mm256_sub_epi32(s32, _mm256_set1_epi32(OFF * *p.sum.get_unchecked(b)))
            } else {
                s32
            }
        };
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

/// The eight rows' i32 sums of one 32-element sub-block of IQ4 codes at
/// `codes` (looked up in `table`, signed) against the activation bytes at
/// `a`: the sign trick, each product widened to 32 bits (a pair sum can
/// reach `2 * 127 * 127`).
#[inline(always)]
unsafe fn signed_sub(codes: *const u8, table: __m256i, a: *const i8) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let mut s32 = _mm256_setzero_si256();
    for j in 0..4 {
        let (lo, hi) = unpack_nib::<false, true>(codes, _mm256_setzero_si256(), table, j);
        let pl = _mm256_maddubs_epi16(_mm256_sign_epi8(lo, lo), _mm256_sign_epi8(bcast(a, 2 * j), lo));
        let ph = _mm256_maddubs_epi16(_mm256_sign_epi8(hi, hi), _mm256_sign_epi8(bcast(a, 2 * j + 1), hi));
        s32 = _mm256_add_epi32(s32, _mm256_add_epi32(_mm256_madd_epi16(pl, ones), _mm256_madd_epi16(ph, ones)));
    }
    s32
}

/// IQ4_XS's eight rows' signed 6-bit scales (`ls - 32`) of sub-block `ib`:
/// `sl` each row's four `scales_l` bytes as one dword, `sh` its `scales_h`
/// zero-extended to a dword.
#[inline(always)]
unsafe fn xs_scales(sl: __m256i, sh: __m256i, ib: usize) -> __m256i {
    let lo = _mm256_and_si256(_mm256_srl_epi32(sl, _mm_cvtsi32_si128((8 * (ib / 2) + 4 * (ib % 2)) as i32)), _mm256_set1_epi32(0x0F));
    let hi = _mm256_and_si256(_mm256_srl_epi32(sh, _mm_cvtsi32_si128((2 * ib) as i32)), _mm256_set1_epi32(3));
    _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32::<4>(hi)), _mm256_set1_epi32(32))
}

/// The group block's `scales_l` and `scales_h` as [`xs_scales`] takes them.
#[inline(always)]
unsafe fn xs_scale_words(blk: *const u8) -> (__m256i, __m256i) {
    const F: Form = Form::IQ4_XS;
    let sl = _mm256_loadu_si256(blk.add(F.head_at(2)).cast());
    let sh = _mm256_cvtepu16_epi32(_mm_loadu_si128(blk.add(F.head_at(1)).cast()));
    (sl, sh)
}

/// [`GroupDotFn`] of IQ4_XS against Q8_K: per sub-block the IQ4_NL sums,
/// times the eight rows' 6-bit scales in 32 bits (at most `8 * 32 * 32 *
/// 127 * 127`, no overflow), then one convert and FMA a super-block.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_dot_iq4_xs(w: &[u8], n32: usize, a: &[u8], _p: &ActPrep, prefetch: usize) -> [f32; 8] {
    const F: Form = Form::IQ4_XS;
    let gb = F.group_block();
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    let mut acc = _mm256_setzero_ps();
    let ya = crate::cpu::blocks_of::<crate::blocks::BlockQ8K>(a);
    for (b, y) in ya.iter().enumerate().take(n32 / 8) {
        let blk = w.as_ptr().add(b * gb);
        prefetch_ahead(blk, gb, prefetch);
        let (sl, sh) = xs_scale_words(blk);
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let s32 = signed_sub(blk.add(F.lo_at(ib)), table, y.qs.as_ptr().add(32 * ib));
            sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(s32, xs_scales(sl, sh, ib)));
        }
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_mul_ps(d, _mm256_set1_ps(y.d)), acc);
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// Q4_K / Q5_K's eight rows' 6-bit scale and min of sub-block `ib`, one
/// dword lane a row, from the [`K4_SCALES`] planes at `sc`.
#[inline(always)]
unsafe fn k4_scales(sc: *const u8, ib: usize) -> (__m256i, __m256i) {
    let a = _mm256_cvtepu8_epi32(_mm_loadl_epi64(sc.add(K4_SCALES.0 + 8 * ib).cast()));
    let b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(sc.add(K4_SCALES.1 + 8 * (ib / 2)).cast()));
    let hi = _mm256_and_si256(_mm256_srl_epi32(b, _mm_cvtsi32_si128((4 * (ib % 2)) as i32)), _mm256_set1_epi32(0x0F));
    let scale = _mm256_and_si256(a, _mm256_set1_epi32(63));
    let min = _mm256_or_si256(_mm256_srli_epi32::<6>(a), _mm256_slli_epi32::<2>(hi));
    (scale, min)
}

/// [`GroupDotFn`] of Q4_K (`HB` Q5_K) against Q8_K, as ggml sums them: per
/// sub-block the codes' 16-bit sums widened once, times the eight rows'
/// scales in 32 bits; the mins against the activation's sub-block sums
/// (its `bsums`) in 32 bits too; one convert and two FMAs a super-block.
/// At most `8 * 63 * 32 * 31 * 127` a lane: no overflow.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_dot_k4<const HB: bool>(w: &[u8], n32: usize, a: &[u8], _p: &ActPrep, prefetch: usize) -> [f32; 8] {
    let f = if HB { Form::Q5_K } else { Form::Q4_K };
    let (gb, sc_at) = (f.group_block(), f.head_at(2));
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let ya = crate::cpu::blocks_of::<crate::blocks::BlockQ8K>(a);
    for (b, y) in ya.iter().enumerate().take(n32 / 8) {
        let blk = w.as_ptr().add(b * gb);
        prefetch_ahead(blk, gb, prefetch);
        let (mut sumi, mut summ) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for ib in 0..8 {
            let codes = blk.add(f.lo_at(ib));
            let h = if HB { _mm256_loadu_si256(blk.add(f.hi_at(ib)).cast()) } else { _mm256_setzero_si256() };
            let aq = y.qs.as_ptr().add(32 * ib);
            // 16-bit sums: eight products of 4-bit codes fit, four of 5-bit.
            let mut s16 = [_mm256_setzero_si256(); 2];
            for j in 0..4 {
                let (lo, hi) = unpack_nib::<HB, false>(codes, h, _mm256_setzero_si256(), j);
                let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast(aq, 2 * j)), _mm256_maddubs_epi16(hi, bcast(aq, 2 * j + 1)));
                let k = if HB { j / 2 } else { 0 };
                s16[k] = _mm256_add_epi16(s16[k], p);
            }
            let s32 = _mm256_add_epi32(_mm256_madd_epi16(s16[0], ones), _mm256_madd_epi16(s16[1], ones));
            let (scale, min) = k4_scales(blk.add(sc_at), ib);
            sumi = _mm256_add_epi32(sumi, _mm256_mullo_epi32(s32, scale));
            let bsum = i32::from(y.bsums[2 * ib]) + i32::from(y.bsums[2 * ib + 1]);
            summ = _mm256_add_epi32(summ, _mm256_mullo_epi32(min, _mm256_set1_epi32(bsum)));
        }
        let d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(blk.cast())), _mm256_set1_ps(y.d));
        let dmin = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(blk.add(16).cast())), _mm256_set1_ps(y.d));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, acc);
        acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), dmin, acc);
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// The eight rows' scales of a pair of 16-element sub-blocks as 16-bit
/// words (`pair`: row `r`'s two in dword `r`) made those of sub-block
/// `i` of the pair, in both words of each dword: what `vpmaddwd` takes
/// against the 16-bit code sums of that sub-block.
#[inline(always)]
unsafe fn scale_words(pair: __m256i, i: usize) -> __m256i {
    let dup = if i == 0 {
        _mm256_setr_epi8(0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13, 0, 1, 0, 1, 4, 5, 4, 5, 8, 9, 8, 9, 12, 13, 12, 13)
    } else {
        _mm256_setr_epi8(2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15, 2, 3, 2, 3, 6, 7, 6, 7, 10, 11, 10, 11, 14, 15, 14, 15)
    };
    _mm256_shuffle_epi8(pair, dup)
}

/// Q6_K's `(lo, hi)` code registers of nibble group `j` (0..4) of a
/// 32-element chunk at `codes`, the top two bits from `h`, the high plane's
/// register of 16-element sub-block `j / 2` (group `g`'s two bits at bit
/// `2 * (g % 4)` of its byte, moved to bits 4 and 5; a 16-bit shift by at
/// most 4 keeps those bits their own byte's).
#[inline(always)]
unsafe fn unpack_q6(codes: *const u8, h: __m256i, j: usize) -> (__m256i, __m256i) {
    let (lo, hi) = unpack_nib::<false, false>(codes, _mm256_setzero_si256(), _mm256_setzero_si256(), j);
    let m = _mm256_set1_epi8(0x30);
    let (l, u) = if j.is_multiple_of(2) { (_mm256_slli_epi16::<4>(h), _mm256_slli_epi16::<2>(h)) } else { (h, _mm256_srli_epi16::<2>(h)) };
    (_mm256_or_si256(lo, _mm256_and_si256(l, m)), _mm256_or_si256(hi, _mm256_and_si256(u, m)))
}

/// [`GroupDotFn`] of Q6_K against Q8_K, as ggml sums it: per 16-element
/// sub-block the codes (`q + 32`, 0..63) times the activation in 16 bits
/// (two products a sum: `2 * 2 * 63 * 128 < 2^15`), times the eight rows'
/// i8 scales by `vpmaddwd` into 32 bits; the 32 taken off once a
/// super-block as `32 * sum(scale * bsum)` (the activation's 16-element
/// sums); one convert and one FMA a super-block. At most `256 * 63 * 128 *
/// 128` a lane: no overflow.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_dot_q6_k(w: &[u8], n32: usize, a: &[u8], _p: &ActPrep, prefetch: usize) -> [f32; 8] {
    const F: Form = Form::Q6_K;
    let (gb, sc_at) = (F.group_block(), F.head_at(1));
    let mut acc = _mm256_setzero_ps();
    let ya = crate::cpu::blocks_of::<crate::blocks::BlockQ8K>(a);
    for (b, y) in ya.iter().enumerate().take(n32 / 8) {
        let blk = w.as_ptr().add(b * gb);
        let (mut sumi, mut summ) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for k in 0..8 {
            // An eighth of the block's lines a chunk: its 27 prefetches in
            // one burst streamed the copy at 11-12 GB/s on one core,
            // spread 17-19 (`benches/matvec.rs`, decision 0046).
            prefetch_ahead(blk.add(k * gb / 8), gb / 8, prefetch);
            let pair = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(sc_at + 16 * k).cast()));
            let bsums = _mm256_set1_epi32(y.bsums.as_ptr().add(2 * k).cast::<i32>().read_unaligned());
            summ = _mm256_add_epi32(summ, _mm256_madd_epi16(pair, bsums));
            let (codes, aq) = (blk.add(F.lo_at(k)), y.qs.as_ptr().add(32 * k));
            for i in 0..2 {
                let h = _mm256_loadu_si256(blk.add(F.hi_at(k) + 32 * i).cast());
                let sc = scale_words(pair, i);
                for j in 2 * i..2 * i + 2 {
                    let (lo, hi) = unpack_q6(codes, h, j);
                    let p = _mm256_add_epi16(_mm256_maddubs_epi16(lo, bcast(aq, 2 * j)), _mm256_maddubs_epi16(hi, bcast(aq, 2 * j + 1)));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sc));
                }
            }
        }
        let sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<5>(summ));
        let d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(blk.cast())), _mm256_set1_ps(y.d));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, acc);
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// The panel scales (or biases) of one super-block of a 16-element kind:
/// `s[8 * (16b + ib) + r] = d[r] * scale(ib, r)`, `scale` given a
/// sub-block and row, one f32 product as the stored rows' unpack computes
/// it.
#[inline(always)]
unsafe fn pack_scales16(d: __m256, b: usize, s: &mut [f32], scale: impl Fn(usize, usize) -> f32) {
    let mut dr = [0f32; 8];
    _mm256_storeu_ps(dr.as_mut_ptr(), d);
    for ib in 0..16 {
        for (r, &dr) in dr.iter().enumerate() {
            s[8 * (16 * b + ib) + r] = dr * scale(ib, r);
        }
    }
}

/// The eight rows' 2-bit codes of group `g` (0..4) of a 16-element
/// sub-block's register `v`, a byte each.
#[inline(always)]
unsafe fn codes2(v: __m256i, g: usize) -> __m256i {
    _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * g as i32)), _mm256_set1_epi8(3))
}

/// Q3_K's codes (`q + 4`, 0..7) of group `g` (0..4) of 16-element
/// sub-block `i` (0 or 1) of a chunk: the low two bits from its register
/// `v`, the third from the chunk's plane `h` (group `4i + g`'s at that
/// bit, moved to bit 2; a 16-bit shift by at most 5 keeps it its own
/// byte's).
#[inline(always)]
unsafe fn q3_codes(v: __m256i, h: __m256i, i: usize, g: usize) -> __m256i {
    let bit = 4 * i + g;
    let h = if bit < 2 { _mm256_sll_epi16(h, _mm_cvtsi32_si128((2 - bit) as i32)) } else { _mm256_srl_epi16(h, _mm_cvtsi32_si128((bit - 2) as i32)) };
    _mm256_or_si256(codes2(v, g), _mm256_and_si256(h, _mm256_set1_epi8(4)))
}

/// Q3_K's eight rows' sixteen scales (`s - 32`, i8) from a group block's
/// scale bytes: register `q` holds sub-block pair `2q` in its low half and
/// `2q + 1` in its high half (row `r`'s two at bytes `2r`, `2r + 1`), as
/// Q6_K keeps its own. The stored bytes 0..8 (low nibbles; sub-blocks
/// `j` and `j + 8` in byte `j % 8`) sit as two registers, bytes 8..12 (top
/// two bits; sub-block `j`'s in byte `8 + j % 4` at bit `2 * (j / 4)`) as
/// one, so each register is a shift and a mask of them.
#[inline(always)]
unsafe fn q3_scales8(blk: *const u8) -> [__m256i; 4] {
    const F: Form = Form::Q3_K;
    let (x, y, z) = (
        _mm256_loadu_si256(blk.add(F.head_at(1)).cast()),
        _mm256_loadu_si256(blk.add(F.head_at(3)).cast()),
        _mm256_loadu_si256(blk.add(F.head_at(5)).cast()),
    );
    let (m4, m2, bias) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(3), _mm256_set1_epi8(32));
    let (xh, yh) = (_mm256_srli_epi16::<4>(x), _mm256_srli_epi16::<4>(y));
    // Sub-block `j`'s top two bits at bit `2 * (j / 4)`, moved to bits 4-5.
    let high = |z: __m256i| _mm256_slli_epi16::<4>(_mm256_and_si256(z, m2));
    let one = |low: __m256i, z: __m256i| _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(low, m4), high(z)), bias);
    // (Written out, not `array::from_fn`: its closure is not inlined into
    // this AVX2 context.)
    [one(x, z), one(y, _mm256_srli_epi16::<2>(z)), one(xh, _mm256_srli_epi16::<4>(z)), one(yh, _mm256_srli_epi16::<6>(z))]
}

/// Sub-block pair `k`'s half of a register of [`q3_scales8`] or Q2_K's
/// scale bytes (16 bytes).
#[inline(always)]
unsafe fn pair_half(regs: &[__m256i; 4], k: usize) -> __m128i {
    let r = regs[k / 2];
    if k.is_multiple_of(2) {
        _mm256_castsi256_si128(r)
    } else {
        _mm256_extracti128_si256::<1>(r)
    }
}

/// [`GroupDotFn`] of Q3_K against Q8_K, as Q6_K's: per 16-element
/// sub-block the codes (`q + 4`, 0..7) times the activation in 16 bits
/// (four products a sum), times the eight rows' scales by `vpmaddwd`; the
/// 4 taken off once a super-block against `bsums`. At most `256 * 7 * 128
/// * 32` a lane.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_dot_q3_k(w: &[u8], n32: usize, a: &[u8], _p: &ActPrep, prefetch: usize) -> [f32; 8] {
    const F: Form = Form::Q3_K;
    let gb = F.group_block();
    let mut acc = _mm256_setzero_ps();
    let ya = crate::cpu::blocks_of::<crate::blocks::BlockQ8K>(a);
    for (b, y) in ya.iter().enumerate().take(n32 / 8) {
        let blk = w.as_ptr().add(b * gb);
        prefetch_ahead(blk, gb, prefetch);
        let scales = q3_scales8(blk);
        let (mut sumi, mut summ) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for k in 0..8 {
            let pair = _mm256_cvtepi8_epi16(pair_half(&scales, k));
            let bsums = _mm256_set1_epi32(y.bsums.as_ptr().add(2 * k).cast::<i32>().read_unaligned());
            summ = _mm256_add_epi32(summ, _mm256_madd_epi16(pair, bsums));
            let h = _mm256_loadu_si256(blk.add(F.hi_at(k)).cast());
            for i in 0..2 {
                let v = _mm256_loadu_si256(blk.add(F.lo_at(k) + 32 * i).cast());
                let aq = y.qs.as_ptr().add(32 * k + 16 * i);
                let mut p = _mm256_setzero_si256();
                for g in 0..4 {
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(q3_codes(v, h, i, g), bcast(aq, g)));
                }
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale_words(pair, i)));
            }
        }
        let sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32::<2>(summ));
        let d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(blk.cast())), _mm256_set1_ps(y.d));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, acc);
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// [`GroupPackFn`] of Q3_K: the codes (`q + 4`) of each 16-element
/// sub-block, its scale `d * s` as the stored rows' unpack computes it, no
/// bias of its own.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_q3_k(w: &[u8], subs: usize, u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    const F: Form = Form::Q3_K;
    for b in 0..subs / 16 {
        let blk = w.as_ptr().add(b * F.group_block());
        for k in 0..8 {
            let h = _mm256_loadu_si256(blk.add(F.hi_at(k)).cast());
            for i in 0..2 {
                let v = _mm256_loadu_si256(blk.add(F.lo_at(k) + 32 * i).cast());
                for g in 0..4 {
                    _mm256_storeu_si256(u.as_mut_ptr().add(128 * (16 * b + 2 * k + i) + 32 * g).cast(), q3_codes(v, h, i, g));
                }
            }
        }
        let mut sc = [0u8; 128];
        for (q, r) in q3_scales8(blk).iter().enumerate() {
            _mm256_storeu_si256(sc.as_mut_ptr().add(32 * q).cast(), *r);
        }
        pack_scales16(_mm256_cvtph_ps(_mm_loadu_si128(blk.cast())), b, s, |ib, r| f32::from(sc[16 * (ib / 2) + 2 * r + ib % 2] as i8));
        bias[128 * b..128 * (b + 1)].fill(0.0);
    }
}

/// Q2_K's scale bytes of a group block as four registers (sub-block pair
/// `2q` in register `q`'s low half, `2q + 1` in its high).
#[inline(always)]
unsafe fn q2_scales8(blk: *const u8) -> [__m256i; 4] {
    const F: Form = Form::Q2_K;
    let at = |q: usize| _mm256_loadu_si256(blk.add(F.head_at(2) + 32 * q).cast());
    [at(0), at(1), at(2), at(3)]
}

/// [`GroupDotFn`] of Q2_K against Q8_K, as Q6_K's with no offset: per
/// 16-element sub-block the codes (0..3) times the activation in 16 bits,
/// times the eight rows' 4-bit scales by `vpmaddwd`; the 4-bit mins against
/// `bsums`; one convert and two FMAs a super-block.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_dot_q2_k(w: &[u8], n32: usize, a: &[u8], _p: &ActPrep, prefetch: usize) -> [f32; 8] {
    const F: Form = Form::Q2_K;
    let gb = F.group_block();
    let m4 = _mm256_set1_epi16(0x0F);
    let mut acc = _mm256_setzero_ps();
    let ya = crate::cpu::blocks_of::<crate::blocks::BlockQ8K>(a);
    for (b, y) in ya.iter().enumerate().take(n32 / 8) {
        let blk = w.as_ptr().add(b * gb);
        prefetch_ahead(blk, gb, prefetch);
        let scales = q2_scales8(blk);
        let (mut sumi, mut summ) = (_mm256_setzero_si256(), _mm256_setzero_si256());
        for k in 0..8 {
            let both = _mm256_cvtepu8_epi16(pair_half(&scales, k));
            let (pair, mins) = (_mm256_and_si256(both, m4), _mm256_srli_epi16::<4>(both));
            let bsums = _mm256_set1_epi32(y.bsums.as_ptr().add(2 * k).cast::<i32>().read_unaligned());
            summ = _mm256_add_epi32(summ, _mm256_madd_epi16(mins, bsums));
            for i in 0..2 {
                let v = _mm256_loadu_si256(blk.add(F.lo_at(k) + 32 * i).cast());
                let aq = y.qs.as_ptr().add(32 * k + 16 * i);
                let mut p = _mm256_setzero_si256();
                for g in 0..4 {
                    p = _mm256_add_epi16(p, _mm256_maddubs_epi16(codes2(v, g), bcast(aq, g)));
                }
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale_words(pair, i)));
            }
        }
        let yd = _mm256_set1_ps(y.d);
        let d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(blk.cast())), yd);
        let dmin = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128(blk.add(16).cast())), yd);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), d, acc);
        acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(summ), dmin, acc);
    }
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), acc);
    out
}

/// [`GroupPackFn`] of Q2_K: the codes of each 16-element sub-block, its
/// scale `d * sc` and bias `-(dmin * m)` as the stored rows' unpack
/// computes them.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_q2_k(w: &[u8], subs: usize, u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    const F: Form = Form::Q2_K;
    for b in 0..subs / 16 {
        let blk = w.as_ptr().add(b * F.group_block());
        for k in 0..8 {
            for i in 0..2 {
                let v = _mm256_loadu_si256(blk.add(F.lo_at(k) + 32 * i).cast());
                for g in 0..4 {
                    _mm256_storeu_si256(u.as_mut_ptr().add(128 * (16 * b + 2 * k + i) + 32 * g).cast(), codes2(v, g));
                }
            }
        }
        let sc = &w[b * F.group_block() + F.head_at(2)..][..128];
        let at = |ib: usize, r: usize| sc[16 * (ib / 2) + 2 * r + ib % 2];
        pack_scales16(_mm256_cvtph_ps(_mm_loadu_si128(blk.cast())), b, s, |ib, r| f32::from(at(ib, r) & 0x0F));
        pack_scales16(_mm256_cvtph_ps(_mm_loadu_si128(blk.add(16).cast())), b, bias, |ib, r| f32::from(at(ib, r) >> 4));
        bias[128 * b..128 * (b + 1)].iter_mut().for_each(|v| *v = -*v);
    }
}

/// [`GroupPackFn`] of Q6_K: the codes (`q + 32`) of each 16-element
/// sub-block, its scale `d * scale` as the stored rows' unpack computes it,
/// no bias of its own.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_q6_k(w: &[u8], subs: usize, u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    const F: Form = Form::Q6_K;
    for b in 0..subs / 16 {
        let blk = w.as_ptr().add(b * F.group_block());
        for k in 0..8 {
            for j in 0..4 {
                let h = _mm256_loadu_si256(blk.add(F.hi_at(k) + 32 * (j / 2)).cast());
                let (lo, hi) = unpack_q6(blk.add(F.lo_at(k)), h, j);
                _mm256_storeu_si256(u.as_mut_ptr().add(256 * (8 * b + k) + 64 * j).cast(), lo);
                _mm256_storeu_si256(u.as_mut_ptr().add(256 * (8 * b + k) + 64 * j + 32).cast(), hi);
            }
        }
        let sc = &w[b * F.group_block() + F.head_at(1)..][..128];
        pack_scales16(_mm256_cvtph_ps(_mm_loadu_si128(blk.cast())), b, s, |ib, r| f32::from(sc[16 * (ib / 2) + 2 * r + ib % 2] as i8));
        bias[128 * b..128 * (b + 1)].fill(0.0);
    }
}

/// [`GroupDotFn`] of Q8_0: signed codes with the sign trick, two chains.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn group_dot_q8_0(w: &[u8], nb: usize, _a: &[u8], p: &ActPrep, prefetch: usize) -> [f32; 8] {
    const GB: usize = 8 * 34;
    let ones = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    let (wp, aq) = (w.as_ptr(), p.qs.as_ptr());
    for b in 0..nb {
        let blk = wp.add(b * GB);
        prefetch_ahead(blk, GB, prefetch);
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
    let (gb, codes_at, qh_at) = (f.group_block(), f.lo_at(0), f.hi_at(0));
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

/// [`GroupPackFn`] of IQ4_XS: IQ4_NL's codes a sub-block (`value ^ 0x80`),
/// each sub-block's scale `d * (ls - 32)` as its unpack computes it.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_iq4_xs(w: &[u8], n32: usize, u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    const F: Form = Form::IQ4_XS;
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    let flip = _mm256_set1_epi8(-128);
    for b in 0..n32 / 8 {
        let blk = w.as_ptr().add(b * F.group_block());
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        let (sl, sh) = xs_scale_words(blk);
        for ib in 0..8 {
            let k = 8 * b + ib;
            for j in 0..4 {
                let (lo, hi) = unpack_nib::<false, true>(blk.add(F.lo_at(ib)), _mm256_setzero_si256(), table, j);
                _mm256_storeu_si256(u.as_mut_ptr().add(256 * k + 64 * j).cast(), _mm256_xor_si256(lo, flip));
                _mm256_storeu_si256(u.as_mut_ptr().add(256 * k + 64 * j + 32).cast(), _mm256_xor_si256(hi, flip));
            }
            _mm256_storeu_ps(s.as_mut_ptr().add(8 * k), _mm256_mul_ps(d, _mm256_cvtepi32_ps(xs_scales(sl, sh, ib))));
            _mm256_storeu_ps(bias.as_mut_ptr().add(8 * k), _mm256_setzero_ps());
        }
    }
}

/// [`GroupPackFn`] of Q4_K (`HB` Q5_K): the codes as they are, each
/// sub-block's scale `d * sc` and bias `-(dmin * m)` as its unpack computes them.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_k4<const HB: bool>(w: &[u8], n32: usize, u: &mut [u8], s: &mut [f32], bias: &mut [f32]) {
    let f = if HB { Form::Q5_K } else { Form::Q4_K };
    let sign = _mm256_set1_ps(-0.0);
    for b in 0..n32 / 8 {
        let blk = w.as_ptr().add(b * f.group_block());
        let d = _mm256_cvtph_ps(_mm_loadu_si128(blk.cast()));
        let dmin = _mm256_cvtph_ps(_mm_loadu_si128(blk.add(16).cast()));
        for ib in 0..8 {
            let k = 8 * b + ib;
            let h = if HB { _mm256_loadu_si256(blk.add(f.hi_at(ib)).cast()) } else { _mm256_setzero_si256() };
            for j in 0..4 {
                let (lo, hi) = unpack_nib::<HB, false>(blk.add(f.lo_at(ib)), h, _mm256_setzero_si256(), j);
                _mm256_storeu_si256(u.as_mut_ptr().add(256 * k + 64 * j).cast(), lo);
                _mm256_storeu_si256(u.as_mut_ptr().add(256 * k + 64 * j + 32).cast(), hi);
            }
            let (scale, min) = k4_scales(blk.add(f.head_at(2)), ib);
            _mm256_storeu_ps(s.as_mut_ptr().add(8 * k), _mm256_mul_ps(d, _mm256_cvtepi32_ps(scale)));
            _mm256_storeu_ps(bias.as_mut_ptr().add(8 * k), _mm256_xor_ps(_mm256_mul_ps(dmin, _mm256_cvtepi32_ps(min)), sign));
        }
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
