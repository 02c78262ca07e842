//! `ferrox info MODEL [--json]`: what gguf-dump shows, for one file or a split.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use std::io::Write;

use anyhow::Result;
use ferrox_gguf::{Array, GgufModel, Value};
use ferrox_quant::QuantKind;
use serde_json::{json, Value as Json};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    model: crate::load::ModelArg,
    /// Print JSON instead of tables.
    #[arg(long)]
    json: bool,
    /// How many elements of an array to show before summarizing.
    #[arg(long, default_value_t = 8)]
    array_items: usize,
}

pub fn run(a: Args) -> Result<()> {
    let path = a.model.or_default()?;
    let model = crate::open_model(&path)?;
    let mut out = std::io::stdout().lock();
    if a.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&to_json(&model, a.array_items))?)?;
    } else {
        write!(out, "{}", to_text(&model, a.array_items))?;
    }
    Ok(())
}

fn short_str(bytes: &[u8], max: usize) -> String {
    let s = String::from_utf8_lossy(bytes);
    let mut out: String = s.chars().take(max).collect();
    if s.chars().count() > max {
        out.push('…');
    }
    format!("{out:?}")
}

fn value_text(v: &Value, items: usize) -> String {
    match v {
        Value::String(s) => short_str(s.as_bytes(), 120),
        Value::Array(a) => array_text(a, items),
        Value::U8(x) => x.to_string(),
        Value::I8(x) => x.to_string(),
        Value::U16(x) => x.to_string(),
        Value::I16(x) => x.to_string(),
        Value::U32(x) => x.to_string(),
        Value::I32(x) => x.to_string(),
        Value::U64(x) => x.to_string(),
        Value::I64(x) => x.to_string(),
        Value::F32(x) => x.to_string(),
        Value::F64(x) => x.to_string(),
        Value::Bool(x) => x.to_string(),
    }
}

fn array_elems(a: &Array, items: usize) -> Vec<String> {
    fn nums<T: ToString>(v: &[T], n: usize) -> Vec<String> {
        v.iter().take(n).map(T::to_string).collect()
    }
    match a {
        Array::U8(v) => nums(v, items),
        Array::I8(v) => nums(v, items),
        Array::U16(v) => nums(v, items),
        Array::I16(v) => nums(v, items),
        Array::U32(v) => nums(v, items),
        Array::I32(v) => nums(v, items),
        Array::U64(v) => nums(v, items),
        Array::I64(v) => nums(v, items),
        Array::F32(v) => nums(v, items),
        Array::F64(v) => nums(v, items),
        Array::Bool(v) => nums(v, items),
        Array::String(v) => v
            .iter()
            .take(items)
            .map(|s| short_str(s, 40))
            .collect(),
        Array::Array(v) => v.iter().take(items).map(|x| array_text(x, items)).collect(),
    }
}

fn array_text(a: &Array, items: usize) -> String {
    let elems = array_elems(a, items);
    let more = if a.len() > elems.len() { ", …" } else { "" };
    format!(
        "[{}; {}] [{}{more}]",
        a.elem_type(),
        a.len(),
        elems.join(", ")
    )
}

fn value_json(v: &Value, items: usize) -> Json {
    match v {
        Value::String(s) => match s.as_str() {
            Some(s) => json!(s),
            None => json!({ "non_utf8_bytes": s.as_bytes() }),
        },
        Value::Array(a) => array_json(a, items),
        Value::U8(x) => json!(x),
        Value::I8(x) => json!(x),
        Value::U16(x) => json!(x),
        Value::I16(x) => json!(x),
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::I64(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        Value::Bool(x) => json!(x),
    }
}

fn array_json(a: &Array, items: usize) -> Json {
    fn nums<T: serde::Serialize>(v: &[T], n: usize) -> Vec<Json> {
        v.iter().take(n).map(|x| json!(x)).collect()
    }
    let head: Vec<Json> = match a {
        Array::U8(v) => nums(v, items),
        Array::I8(v) => nums(v, items),
        Array::U16(v) => nums(v, items),
        Array::I16(v) => nums(v, items),
        Array::U32(v) => nums(v, items),
        Array::I32(v) => nums(v, items),
        Array::U64(v) => nums(v, items),
        Array::I64(v) => nums(v, items),
        Array::F32(v) => nums(v, items),
        Array::F64(v) => nums(v, items),
        Array::Bool(v) => nums(v, items),
        Array::String(v) => v
            .iter()
            .take(items)
            .map(|s| json!(String::from_utf8_lossy(s)))
            .collect(),
        Array::Array(v) => v.iter().take(items).map(|x| array_json(x, items)).collect(),
    };
    json!({ "type": a.elem_type().to_string(), "len": a.len(), "head": head })
}

struct Totals {
    tensors: usize,
    elements: u64,
    bytes: u64,
}

fn totals(model: &GgufModel) -> BTreeMap<QuantKind, Totals> {
    let mut by_kind: BTreeMap<QuantKind, Totals> = BTreeMap::new();
    for t in model.tensors() {
        let e = by_kind.entry(t.info.kind).or_insert(Totals {
            tensors: 0,
            elements: 0,
            bytes: 0,
        });
        e.tensors += 1;
        e.elements += t.info.n_elements();
        e.bytes += t.info.n_bytes;
    }
    by_kind
}

fn to_text(model: &GgufModel, items: usize) -> String {
    let mut s = String::new();
    let parts = model.parts();
    let meta = model.metadata_file();
    for (i, p) in parts.iter().enumerate() {
        let path = p
            .path()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "part {}/{}: {path}  (GGUF v{}, alignment {}, {} tensors, data at byte {})",
            i + 1,
            parts.len(),
            p.version(),
            p.alignment(),
            p.tensors().len(),
            p.data_offset()
        );
    }
    let _ = writeln!(s, "\nmetadata: {} keys", meta.metadata().len());
    let kw = meta
        .metadata()
        .iter()
        .map(|(k, _)| k.len())
        .max()
        .unwrap_or(0);
    for (k, v) in meta.metadata() {
        let ty = v.value_type().to_string();
        let _ = writeln!(s, "  {k:<kw$}  {ty:<6}  {}", value_text(v, items));
    }
    let _ = writeln!(s, "\ntensors: {}", model.tensors().len());
    let nw = model
        .tensors()
        .iter()
        .map(|t| t.info.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        s,
        "  {:>4}  {:<nw$}  {:<7}  {:<20}  {:>12}",
        "#", "name", "kind", "shape", "bytes"
    );
    for (i, t) in model.tensors().iter().enumerate() {
        let dims: Vec<String> = t.info.dims.iter().map(u64::to_string).collect();
        let _ = writeln!(
            s,
            "  {i:>4}  {:<nw$}  {:<7}  {:<20}  {:>12}",
            t.info.name,
            t.info.kind.name(),
            dims.join(" x "),
            t.info.n_bytes
        );
    }
    let _ = writeln!(s, "\ntotals per kind:");
    let _ = writeln!(
        s,
        "  {:<7}  {:>7}  {:>14}  {:>14}  {:>6}",
        "kind", "tensors", "elements", "bytes", "bpw"
    );
    let (mut te, mut tb, mut tt) = (0u64, 0u64, 0usize);
    for (k, t) in totals(model) {
        let bpw = t.bytes as f64 * 8.0 / t.elements.max(1) as f64;
        let _ = writeln!(
            s,
            "  {:<7}  {:>7}  {:>14}  {:>14}  {bpw:>6.2}",
            k.name(),
            t.tensors,
            t.elements,
            t.bytes
        );
        te += t.elements;
        tb += t.bytes;
        tt += t.tensors;
    }
    let bpw = tb as f64 * 8.0 / te.max(1) as f64;
    let _ = writeln!(
        s,
        "  {:<7}  {tt:>7}  {te:>14}  {tb:>14}  {bpw:>6.2}",
        "total"
    );
    s
}

fn to_json(model: &GgufModel, items: usize) -> Json {
    let meta = model.metadata_file();
    let parts: Vec<Json> = model
        .parts()
        .iter()
        .map(|p| {
            json!({
                "path": p.path().map(|p| p.display().to_string()),
                "version": p.version(),
                "alignment": p.alignment(),
                "data_offset": p.data_offset(),
                "n_tensors": p.tensors().len(),
            })
        })
        .collect();
    let metadata: Vec<Json> = meta
        .metadata()
        .iter()
        .map(|(k, v)| json!({ "key": k, "type": v.value_type().to_string(), "value": value_json(v, items) }))
        .collect();
    let tensors: Vec<Json> = model
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.info.name,
                "kind": t.info.kind.name(),
                "shape": t.info.dims,
                "n_elements": t.info.n_elements(),
                "n_bytes": t.info.n_bytes,
                "offset": t.info.offset,
                "part": t.part,
            })
        })
        .collect();
    let totals: Vec<Json> = totals(model)
        .into_iter()
        .map(|(k, t)| json!({ "kind": k.name(), "tensors": t.tensors, "elements": t.elements, "bytes": t.bytes }))
        .collect();
    json!({ "parts": parts, "metadata": metadata, "tensors": tensors, "totals": totals })
}
