//! Reads the Metal kernels' source (`kernels/`) for the names of the
//! kernels it defines and writes `kernels.rs`, the list the device and the
//! claims⇔launch test read. Off Apple targets it also compiles the same
//! source as C++ against `shim/msl.h` (with `cc`) into the library the
//! shim device runs: every `kernel` of the source, by name.

use std::path::PathBuf;

/// The source files, in the order the library concatenates them.
const FILES: &[&str] = &["common.metal", "dequant.metal", "matmul.metal", "ops.metal"];

/// `(name, C++ expression of the function)` of every kernel: a template
/// instantiation (`template [[host_name("N")]] kernel T F<K>;`) or a plain
/// `kernel void N(` (not a template's own definition).
fn kernels(src: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut prev = "";
    for line in src.lines().map(str::trim) {
        let templated = prev.starts_with("template <");
        prev = line;
        if let Some(rest) = line.strip_prefix("template [[host_name(\"") {
            let (name, rest) = rest.split_once("\")]] kernel ").unwrap_or_else(|| panic!("kernel line {line:?}"));
            let f = rest.split_whitespace().nth(1).unwrap_or_else(|| panic!("kernel line {line:?}")).trim_end_matches(';');
            out.push((name.to_string(), f.to_string()));
        } else if let Some(rest) = line.strip_prefix("kernel void ").filter(|_| !templated) {
            let name = rest.split('(').next().unwrap_or_default().trim();
            out.push((name.to_string(), name.to_string()));
        }
    }
    out
}

fn main() {
    let dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    println!("cargo:rerun-if-changed=kernels");
    println!("cargo:rerun-if-changed=shim");
    let src: String = FILES.iter().map(|f| std::fs::read_to_string(dir.join("kernels").join(f)).unwrap_or_else(|e| panic!("kernels/{f}: {e}"))).collect::<Vec<_>>().join("\n");
    let ks = kernels(&src);
    let mut table = String::from("/// Every kernel the Metal source defines, by name.\npub static KERNELS: &[&str] = &[\n");
    for (name, _) in &ks {
        table.push_str(&format!("    {name:?},\n"));
    }
    table.push_str("];\n");
    std::fs::write(out.join("kernels.rs"), table).unwrap();
    if std::env::var("CARGO_CFG_TARGET_VENDOR").as_deref() == Ok("apple") {
        return;
    }
    // The shim: the kernels as C++, dispatched by name.
    let mut calls = String::new();
    for (name, f) in &ks {
        calls.push_str(&format!("    if (std::strcmp(name, {name:?}) == 0) return ferrox_shim::launch({f}, params, bytes, bufs, n_bufs, gx, gz);\n"));
    }
    std::fs::write(out.join("msl_kernels.inc"), calls).unwrap();
    std::fs::write(out.join("msl_source.inc"), &src).unwrap();
    cc::Build::new()
        .cpp(true)
        .std("c++20")
        .file(dir.join("shim/run.cpp"))
        .include(dir.join("shim"))
        .include(&out)
        .flag_if_supported("-Wno-attributes")
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-unknown-attributes")
        .opt_level(2)
        .compile("ferrox_msl_shim");
}
