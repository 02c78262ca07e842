//! ferrox's scalar reference against vectors produced by ggml's own C.
//!
//! The key decision: expected values come only from `testdata/` (written by
//! `tools/refgen/gen_quant_vectors.py` through libggml), never from ferrox,
//! and every kind is checked before anything is asserted. A kind whose
//! scalar code panics (`todo!()` while it is being written) or disagrees is
//! one row of a table printed in full, so one family's failure never hides
//! another's. The file format is in `testdata/README.md`.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use ferrox_quant::{dequantize, quantize, quantize_support, scalar, QuantKind};

const MAGIC: &[u8; 4] = b"FXQV";
const VERSION: u32 = 1;
const OP_DEQUANT: u32 = 1;
const OP_QUANT: u32 = 2;
const OP_DOT: u32 = 3;

/// Relative tolerance of a dot against ggml's result: the integer part of a
/// quantized dot is exact, only the f32 summation order of block partials
/// differs (ggml's is AVX-512). The tolerance also admits 1e-6 of the sum of
/// |terms|, the scale of that rounding when the terms nearly cancel.
const DOT_REL_TOL: f64 = 1e-4;
const DOT_MAG_TOL: f64 = 1e-6;

fn testdata() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata")
}

fn file_for(prefix: &str, kind: QuantKind) -> PathBuf {
    testdata().join(format!("{prefix}_{}.bin", kind.name().to_lowercase()))
}

/// A little-endian reader over a vector file that reports where it ran out.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            format!("truncated: need {n} bytes at offset {}, file has {}", self.pos, self.buf.len())
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn usize(&mut self) -> Result<usize, String> {
        Ok(self.u32()? as usize)
    }
    fn f32s(&mut self, n: usize) -> Result<Vec<f32>, String> {
        Ok(self.take(n * 4)?.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
    }
}

struct Case<'a> {
    label: String,
    r: Reader<'a>,
}

/// Reads the header, checks it names `op` and `kind`, and splits nothing
/// further: each case's payload is parsed by its op's checker, in order.
fn open(bytes: &[u8], op: u32, kind: QuantKind) -> Result<(usize, Reader<'_>), String> {
    let mut r = Reader { buf: bytes, pos: 0 };
    if r.take(4)? != MAGIC {
        return Err("bad magic".into());
    }
    let (version, file_op, type_id, n_cases) = (r.u32()?, r.u32()?, r.u32()?, r.usize()?);
    if version != VERSION || file_op != op || type_id != kind.gguf_id() {
        return Err(format!(
            "header says version {version} op {file_op} type {type_id}; expected {VERSION} {op} {}",
            kind.gguf_id()
        ));
    }
    Ok((n_cases, r))
}

fn next_case<'a>(r: &mut Reader<'a>) -> Result<Case<'a>, String> {
    let len = r.usize()?;
    let label = String::from_utf8_lossy(r.take(len)?).into_owned();
    Ok(Case { label, r: Reader { buf: r.buf, pos: r.pos } })
}

/// Bytes copied into 8-byte-aligned storage: block structs with an `f32` or
/// `u16` field must not be cast from an odd offset of the file buffer.
fn aligned(bytes: &[u8]) -> Vec<u64> {
    let mut v = vec![0u64; bytes.len().div_ceil(8)];
    bytemuck::cast_slice_mut::<u64, u8>(&mut v)[..bytes.len()].copy_from_slice(bytes);
    v
}

fn as_bytes(v: &[u64], len: usize) -> &[u8] {
    &bytemuck::cast_slice::<u64, u8>(v)[..len]
}

fn same_f32(a: f32, b: f32) -> bool {
    (a.is_nan() && b.is_nan()) || a.to_bits() == b.to_bits()
}

/// Outcome of one (kind, op) check.
enum Status {
    Ok(usize),
    NotApplicable,
    Fail(Vec<String>),
}

impl Status {
    fn cell(&self) -> String {
        match self {
            Status::Ok(n) => format!("ok ({n} cases)"),
            Status::NotApplicable => "-".into(),
            Status::Fail(why) => match why.as_slice() {
                [one] if one.starts_with("panicked: ") => {
                    let msg: String = one["panicked: ".len()..].chars().take(20).collect();
                    format!("PANIC {msg}")
                }
                _ => format!("FAIL ({} problems)", why.len()),
            },
        }
    }
}

/// Runs `f`, turning a panic (a `todo!()` body) into a failure line instead
/// of ending the test, so every other kind is still checked.
fn guarded(f: impl FnOnce() -> Result<Vec<String>, String>, cases: usize) -> Status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(fails)) if fails.is_empty() => Status::Ok(cases),
        Ok(Ok(fails)) => Status::Fail(fails),
        Ok(Err(e)) => Status::Fail(vec![e]),
        Err(p) => {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic".into());
            Status::Fail(vec![format!("panicked: {msg}")])
        }
    }
}

fn read(path: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn check_dequant(kind: QuantKind) -> Status {
    let Ok(bytes) = read(&file_for("dequant", kind)) else {
        return Status::Fail(vec!["no dequant vectors".into()]);
    };
    let n_cases = match open(&bytes, OP_DEQUANT, kind) {
        Ok((n, _)) => n,
        Err(e) => return Status::Fail(vec![e]),
    };
    guarded(
        || {
            let (n_cases, mut r) = open(&bytes, OP_DEQUANT, kind)?;
            let mut fails = Vec::new();
            for _ in 0..n_cases {
                let mut c = next_case(&mut r)?;
                let n_blocks = c.r.usize()?;
                let raw = aligned(c.r.take(n_blocks * kind.block_bytes())?);
                let want = c.r.f32s(n_blocks * kind.block_elems())?;
                r.pos = c.r.pos;
                let mut got = vec![0f32; want.len()];
                if let Err(e) = dequantize(kind, as_bytes(&raw, n_blocks * kind.block_bytes()), &mut got) {
                    fails.push(format!("{}: error {e}", c.label));
                    continue;
                }
                let bad: Vec<usize> = (0..want.len()).filter(|&i| !same_f32(got[i], want[i])).collect();
                if let Some(&i) = bad.first() {
                    fails.push(format!(
                        "{}: {} of {} values differ; first: block {} elem {}: got {:e} ({:#010x}) want {:e} ({:#010x})",
                        c.label, bad.len(), want.len(), i / kind.block_elems(), i % kind.block_elems(),
                        got[i], got[i].to_bits(), want[i], want[i].to_bits()
                    ));
                }
            }
            Ok(fails)
        },
        n_cases,
    )
}

fn check_quant(kind: QuantKind) -> Status {
    check_quant_with("quant", kind, quantize)
}

/// Whether byte `i` differs only as the sign of an f16 NaN (bytes `i - 1`,
/// `i`) NaN on both sides: a NaN made by arithmetic (the 1e30 rows' scales)
/// takes the CPU's default sign, negative on x86-64, where ggml wrote these
/// vectors, and positive on aarch64, where ggml writes the other sign too.
fn nan_sign_only(got: &[u8], want: &[u8], i: usize) -> bool {
    let nan = |b: &[u8]| {
        let h = u16::from_le_bytes([b[i - 1], b[i]]);
        h & 0x7c00 == 0x7c00 && h & 0x03ff != 0
    };
    i % 2 == 1 && got[i] ^ want[i] == 0x80 && nan(got) && nan(want)
}

/// A row quantizer's signature (`quantize`, `quantize_chunk`).
type Quantizer = fn(QuantKind, &[f32], &mut [u8]) -> Result<(), ferrox_quant::QuantError>;

/// Checks `quantizer` against the `prefix` vectors of `kind` (ggml's
/// reference row quantizer for `quant`, `ggml_quantize_chunk` for
/// `quant_chunk`).
fn check_quant_with(
    prefix: &str,
    kind: QuantKind,
    quantizer: Quantizer,
) -> Status {
    if quantize_support(kind).is_err() {
        return Status::NotApplicable;
    }
    let Ok(bytes) = read(&file_for(prefix, kind)) else {
        return Status::Fail(vec!["no quant vectors".into()]);
    };
    let n_cases = match open(&bytes, OP_QUANT, kind) {
        Ok((n, _)) => n,
        Err(e) => return Status::Fail(vec![e]),
    };
    guarded(
        || {
            let (n_cases, mut r) = open(&bytes, OP_QUANT, kind)?;
            let mut fails = Vec::new();
            for _ in 0..n_cases {
                let mut c = next_case(&mut r)?;
                let n = c.r.usize()?;
                let x = c.r.f32s(n)?;
                let want = c.r.take(n / kind.block_elems() * kind.block_bytes())?;
                r.pos = c.r.pos;
                let mut got = vec![0u8; want.len()];
                if let Err(e) = quantizer(kind, &x, &mut got) {
                    fails.push(format!("{}: error {e}", c.label));
                    continue;
                }
                if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i] && !nan_sign_only(&got, want, i)) {
                    let bb = kind.block_bytes();
                    fails.push(format!(
                        "{}: bytes differ from block {} byte {}: got {:02x?} want {:02x?}",
                        c.label, i / bb, i % bb,
                        &got[i / bb * bb..(i / bb + 1) * bb], &want[i / bb * bb..(i / bb + 1) * bb]
                    ));
                }
            }
            Ok(fails)
        },
        n_cases,
    )
}

/// Checks the activation quantization (byte-exact against ggml's reference
/// quantizer) and the dot (within tolerance of ggml's `vec_dot`) separately.
fn check_dot(kind: QuantKind) -> (Status, Status) {
    let Some(act_kind) = kind.vec_dot_kind() else {
        return (Status::NotApplicable, Status::NotApplicable);
    };
    let Ok(bytes) = read(&file_for("dot", kind)) else {
        let missing = || Status::Fail(vec!["no dot vectors".into()]);
        return (missing(), missing());
    };
    let n_cases = match open(&bytes, OP_DOT, kind) {
        Ok((n, _)) => n,
        Err(e) => return (Status::Fail(vec![e.clone()]), Status::Fail(vec![e])),
    };
    // Parse every case up front so the two checks below only run ferrox code.
    struct DotCase {
        label: String,
        n: usize,
        rows: Vec<Vec<u64>>,
        row_bytes: usize,
        x: Vec<f32>,
        act: Vec<u64>,
        act_ref: Vec<u8>,
        want: Vec<f32>,
        mag: Vec<f32>,
    }
    let parse = || -> Result<Vec<DotCase>, String> {
        let (_, mut r) = open(&bytes, OP_DOT, kind)?;
        let mut out = Vec::new();
        for _ in 0..n_cases {
            let mut c = next_case(&mut r)?;
            let (act_id, n, n_rows) = (c.r.u32()?, c.r.usize()?, c.r.usize()?);
            if act_id != act_kind.gguf_id() {
                return Err(format!("file's activation type {act_id}, ferrox's {act_kind}"));
            }
            let row_bytes = n / kind.block_elems() * kind.block_bytes();
            let act_bytes = n / act_kind.block_elems() * act_kind.block_bytes();
            let rows = (0..n_rows).map(|_| c.r.take(row_bytes).map(aligned)).collect::<Result<_, _>>()?;
            let x = c.r.f32s(n)?;
            let act = aligned(c.r.take(act_bytes)?);
            let act_ref = c.r.take(act_bytes)?.to_vec();
            let want = c.r.f32s(n_rows)?;
            let mag = c.r.f32s(n_rows)?;
            r.pos = c.r.pos;
            out.push(DotCase { label: c.label, n, rows, row_bytes, x, act, act_ref, want, mag });
        }
        Ok(out)
    };
    let cases = match parse() {
        Ok(c) => c,
        Err(e) => return (Status::Fail(vec![e.clone()]), Status::Fail(vec![e])),
    };
    let act_status = guarded(
        || {
            let mut fails = Vec::new();
            for c in &cases {
                let mut got = vec![0u8; c.act_ref.len()];
                match quantize(act_kind, &c.x, &mut got) {
                    Err(e) => fails.push(format!("{}: {act_kind} error {e}", c.label)),
                    Ok(()) if got != c.act_ref => {
                        let i = (0..got.len()).find(|&i| got[i] != c.act_ref[i]).unwrap_or(0);
                        fails.push(format!("{}: {act_kind} activation bytes differ from byte {i}", c.label));
                    }
                    Ok(()) => {}
                }
            }
            Ok(fails)
        },
        cases.len(),
    );
    let dot_status = guarded(
        || {
            let mut fails = Vec::new();
            for c in &cases {
                let act = as_bytes(&c.act, c.act_ref.len());
                for (i, row) in c.rows.iter().enumerate() {
                    let want = f64::from(c.want[i]);
                    match scalar::vec_dot(kind, as_bytes(row, c.row_bytes), act) {
                        Err(e) => fails.push(format!("{} row {i}: error {e}", c.label)),
                        Ok(got) => {
                            let tol = DOT_REL_TOL * want.abs() + DOT_MAG_TOL * f64::from(c.mag[i]);
                            let got = f64::from(got);
                            if !((got - want).abs() <= tol) {
                                fails.push(format!(
                                    "{} row {i} (n={}): got {got:e} want {want:e} (tol {tol:e})",
                                    c.label, c.n
                                ));
                            }
                        }
                    }
                }
            }
            Ok(fails)
        },
        cases.len(),
    );
    (act_status, dot_status)
}

fn quantizable_list() -> BTreeSet<String> {
    let text = std::fs::read_to_string(testdata().join("quantizable.txt")).expect("testdata/quantizable.txt");
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(String::from).collect()
}

#[test]
fn every_kind_has_reference_vectors_and_quantize_support_matches_what_ggml_can_quantize() {
    let ggml_can = quantizable_list();
    let mut problems = Vec::new();
    for name in &ggml_can {
        if QuantKind::from_name(name).is_none() {
            problems.push(format!("quantizable.txt names {name}, which is not a QuantKind"));
        }
    }
    for &k in QuantKind::ALL {
        if !file_for("dequant", k).is_file() {
            problems.push(format!("{k}: no dequant vectors"));
        }
        let in_list = ggml_can.contains(k.name());
        if in_list != file_for("quant", k).is_file() {
            problems.push(format!("{k}: quantizable.txt and the quant_*.bin files disagree"));
        }
        match (quantize_support(k).is_ok(), in_list) {
            (true, false) => problems.push(format!("{k}: quantize_support accepts a kind ggml cannot quantize")),
            (false, true) => problems.push(format!("{k}: ggml quantizes it but quantize_support refuses")),
            _ => {}
        }
        if k.vec_dot_kind().is_some() != file_for("dot", k).is_file() {
            problems.push(format!("{k}: has a dot kind {:?} but dot vectors exist: {}", k.vec_dot_kind(), file_for("dot", k).is_file()));
        }
    }
    assert!(problems.is_empty(), "reference vector coverage:\n  {}", problems.join("\n  "));
}

#[test]
fn every_kind_dequantizes_quantizes_and_dots_like_ggml() {
    // Silence the default hook: a `todo!()` per kind would otherwise print a
    // backtrace banner for each; the message is kept in the table instead.
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut rows = Vec::new();
    for &k in QuantKind::ALL {
        let deq = check_dequant(k);
        let q = check_quant(k);
        let (act, dot) = check_dot(k);
        rows.push((k, deq, q, act, dot));
    }
    std::panic::set_hook(prev);

    let mut table = format!("{:<8} | {:<28} | {:<28} | {:<28} | {}\n", "kind", "dequant", "quant", "act quant", "dot");
    let mut failures = Vec::new();
    for (k, deq, q, act, dot) in &rows {
        table += &format!("{:<8} | {:<28} | {:<28} | {:<28} | {}\n", k.name(), deq.cell(), q.cell(), act.cell(), dot.cell());
        for (op, s) in [("dequant", deq), ("quant", q), ("act quant", act), ("dot", dot)] {
            if let Status::Fail(why) = s {
                for w in why {
                    failures.push(format!("{k} {op}: {w}"));
                }
            }
        }
    }
    println!("{table}");
    assert!(failures.is_empty(), "\n{table}\n{} failures:\n  {}", failures.len(), failures.join("\n  "));
}

/// `quantize_chunk` (what `ferrox quantize` writes) against ggml's
/// `ggml_quantize_chunk`, llama-quantize's quantizer
/// (`testdata/quant_chunk_*.bin`, from `tools/refgen/gen_quant_chunk_vectors.py`).
#[test]
fn every_kind_quantizes_in_chunks_like_ggml_quantize_chunk() {
    let mut checked = 0;
    let mut failures = Vec::new();
    for &k in QuantKind::ALL {
        if !file_for("quant_chunk", k).exists() {
            continue;
        }
        checked += 1;
        match check_quant_with("quant_chunk", k, ferrox_quant::quantize_chunk) {
            Status::Ok(n) if n > 0 => {}
            Status::Ok(_) | Status::NotApplicable => failures.push(format!("{k}: no case checked")),
            Status::Fail(why) => failures.extend(why.into_iter().map(|w| format!("{k}: {w}"))),
        }
    }
    assert_eq!(checked, 20, "every kind ggml_quantize_chunk writes and ferrox quantizes has vectors");
    assert!(failures.is_empty(), "{} failures:\n  {}", failures.len(), failures.join("\n  "));
}
