//! Mechanical style rules, checked on every `cargo test` (docs/dev/style.md
//! gives each rule's rationale). A rule that only lives in a document is a
//! rule that erodes; this makes breaking one a red build.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = p
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if p.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

fn sources() -> Vec<(PathBuf, String)> {
    let root = workspace_root();
    let mut files = Vec::new();
    rust_files(&root.join("crates"), &mut files);
    rust_files(&root.join("fuzz"), &mut files);
    assert!(
        files.len() > 5,
        "tidy found only {} files under {root:?}",
        files.len()
    );
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// `file:line` of every line (other than in this file, which spells the
/// rules out) for which `bad(lines, i)` holds.
fn violations(bad: impl Fn(&[&str], usize) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for (p, text) in sources() {
        if p.ends_with("tidy.rs") {
            continue;
        }
        let lines: Vec<&str> = text.lines().collect();
        for i in 0..lines.len() {
            if bad(&lines, i) {
                found.push(format!("{}:{}", p.display(), i + 1));
            }
        }
    }
    found
}

/// A line without its `//` comment.
fn code(line: &str) -> &str {
    line.split("//").next().unwrap_or("")
}

#[test]
fn no_test_is_ignored() {
    let bad = violations(|l, i| l[i].trim_start().starts_with("#[ignore"));
    assert!(
        bad.is_empty(),
        "#[ignore] hides a test that must run or be deleted: {bad:?}"
    );
}

#[test]
fn no_stub_bodies_remain() {
    let bad =
        violations(|l, i| code(l[i]).contains("todo!(") || code(l[i]).contains("unimplemented!("));
    assert!(bad.is_empty(), "a stub is not done: {bad:?}");
}

#[test]
fn every_unsafe_block_says_why_it_is_sound() {
    // `unsafe {` opens a block; `unsafe fn`/`unsafe impl` carry a `# Safety`
    // doc instead, and `unsafe extern` is a declaration.
    let bad = violations(|l, i| {
        code(l[i]).contains("unsafe {")
            && !l[i.saturating_sub(6)..=i]
                .iter()
                .any(|w| w.contains("SAFETY:"))
    });
    assert!(
        bad.is_empty(),
        "unsafe blocks without a `// SAFETY:` line: {bad:?}"
    );
}

/// A `_ =>` in a match over `QuantKind` lets a new kind slip through
/// silently. Capability tables are partial by design and say so on the
/// arm (or the line above) with the words "capability table".
#[test]
fn no_wildcard_arm_over_quant_kinds_outside_capability_tables() {
    let bad = violations(|l, i| {
        if !l[i].trim_start().starts_with("_ =>") {
            return false;
        }
        // The nearest arm above decides which match this is.
        let over_kinds = l[i.saturating_sub(40)..i]
            .iter()
            .rev()
            .find(|a| a.contains("=>"))
            .is_some_and(|a| {
                a.contains("QuantKind::") || a.trim_start().starts_with("$(QuantKind::")
            });
        let marked = l[i].contains("capability table")
            || l[i.saturating_sub(1)].contains("capability table");
        over_kinds && !marked
    });
    assert!(bad.is_empty(), "wildcard arms over QuantKind: {bad:?}");
}

/// Subcommands reach backends only through the seam's generated dispatch
/// (`with_backend`, from `gpu_backend_table!`): an arm per backend in a
/// command is how a backend ends up reachable from some commands and not
/// others.
#[test]
fn no_command_dispatches_on_a_backend_feature() {
    let bad = violations(|l, i| code(l[i]).contains("#[cfg(feature") || code(l[i]).contains("Backend::Cuda =>"));
    let bad: Vec<&String> = bad.iter().filter(|v| v.contains("crates/ferrox/src/")).collect();
    assert!(bad.is_empty(), "per-backend arms in commands: {bad:?}");
}
