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

/// Whether a `cfg` predicate is false in a release build: `test`, the
/// `measure` feature, an `all(...)` with one of them, an `any(...)` of only
/// them.
fn out_of_release(pred: &str) -> bool {
    let p = pred.trim();
    let args = |inner: &str| -> Vec<String> {
        let (mut depth, mut cur, mut out) = (0, String::new(), Vec::new());
        for c in inner.chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    out.push(std::mem::take(&mut cur));
                    continue;
                }
                _ => {}
            }
            cur.push(c);
        }
        out.push(cur);
        out.into_iter().filter(|a| !a.trim().is_empty()).collect()
    };
    if p == "test" || p.replace(' ', "") == "feature=\"measure\"" {
        true
    } else if let Some(inner) = p.strip_prefix("all(").and_then(|r| r.strip_suffix(')')) {
        args(inner).iter().any(|a| out_of_release(a))
    } else if let Some(inner) = p.strip_prefix("any(").and_then(|r| r.strip_suffix(')')) {
        args(inner).iter().all(|a| out_of_release(a))
    } else {
        false
    }
}

/// Every `"FERROX_..."` string literal in the workspace's code, split into
/// those a release build compiles and those only tests or the `measure`
/// feature do: test and bench and example files, `tests.rs`, and items
/// under a `#[cfg]` that [`out_of_release`] (a `mod x;` so gated takes its
/// file with it).
fn ferrox_names() -> (std::collections::BTreeSet<String>, std::collections::BTreeSet<String>) {
    let (mut release, mut gated) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
    let files = sources();
    let mut gated_files: Vec<PathBuf> = Vec::new();
    let mut per_file = Vec::new();
    for (p, text) in &files {
        let lines: Vec<&str> = text.lines().collect();
        let mut out = vec![false; lines.len()];
        let mut i = 0;
        while i < lines.len() {
            let t = lines[i].trim_start();
            let gate = t
                .strip_prefix("#[cfg(")
                .and_then(|r| r.trim_end().strip_suffix(")]"))
                .is_some_and(out_of_release);
            if !gate {
                i += 1;
                continue;
            }
            // The item the attribute is on: to its closing bracket, or its
            // `;` or `,` when it opens none.
            let mut j = i + 1;
            while j < lines.len() && (lines[j].trim_start().starts_with("#[") || lines[j].trim_start().starts_with("//")) {
                j += 1;
            }
            let (mut depth, mut end) = (0i64, lines.len() - 1);
            for (k, l) in lines.iter().enumerate().skip(j) {
                let c = code(l);
                let count = |set: &[char]| c.chars().filter(|ch| set.contains(ch)).count() as i64;
                let (o, cl) = (count(&['{', '[', '(']), count(&['}', ']', ')']));
                depth += o - cl;
                let tail = c.trim_end();
                if depth <= 0 && (tail.ends_with('}') || tail.ends_with(';') || tail.ends_with(',')) {
                    end = k;
                    break;
                }
            }
            if let Some(m) = lines[j..=end].concat().trim().strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                let dir = if ["mod.rs", "lib.rs", "main.rs"].iter().any(|n| p.ends_with(n)) {
                    p.parent().unwrap().to_path_buf()
                } else {
                    p.with_extension("")
                };
                gated_files.push(dir.join(format!("{}.rs", m.trim())));
                gated_files.push(dir.join(m.trim()).join("mod.rs"));
            }
            out[i..=end].iter_mut().for_each(|o| *o = true);
            i = end + 1;
        }
        per_file.push((p.clone(), lines.iter().map(|l| l.to_string()).collect::<Vec<_>>(), out));
    }
    for (p, lines, out) in per_file {
        let s = p.to_string_lossy().replace('\\', "/");
        let test_file = ["/tests/", "/benches/", "/examples/", "/fuzz/"].iter().any(|d| s.contains(d))
            || p.ends_with("tests.rs")
            || gated_files.contains(&p);
        for (line, gated_line) in lines.iter().zip(out) {
            let mut rest = code(line);
            while let Some(at) = rest.find("\"FERROX_") {
                let name: String = rest[at + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                let after = &rest[at + 1 + name.len()..];
                if after.starts_with('"') {
                    if test_file || gated_line {
                        gated.insert(name);
                    } else {
                        release.insert(name);
                    }
                }
                rest = &rest[at + 1..];
            }
        }
    }
    (release, gated)
}

/// The `FERROX_*` names in the backticked first column of `section`'s
/// table in `docs/dev/configuration.md`.
fn documented(doc: &str, section: &str) -> std::collections::BTreeSet<String> {
    let body = doc.split("\n## ").find(|s| s.starts_with(section)).unwrap_or_else(|| panic!("no section {section:?}"));
    body.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .filter(|n| n.starts_with("FERROX_"))
        .map(str::to_string)
        .collect()
}

/// A release build reads at most 10 `FERROX_*` variables, and exactly the
/// ones `docs/dev/configuration.md` lists and `ferrox --help` shows; every
/// measuring knob and test variable is read only under `cfg(test)` or the
/// `measure` feature (or in test files), so a release build can neither
/// run a configuration the user did not ask for nor one that is wrong on
/// purpose (`FERROX_CUDA_SKIP`).
#[test]
fn a_release_build_reads_only_the_documented_environment() {
    let (release, gated) = ferrox_names();
    let doc = std::fs::read_to_string(workspace_root().join("docs/dev/configuration.md")).unwrap();
    let listed = documented(&doc, "Read by a release build");
    assert_eq!(release, listed, "FERROX_* names a release build reads (left) vs docs/dev/configuration.md (right)");
    assert!(release.len() <= 10, "a release build reads {} FERROX_* variables: {release:?}", release.len());
    for m in ["FERROX_CUDA_SKIP", "FERROX_CUDA_DEFINES", "FERROX_CUDA_TRACE", "FERROX_CUDA_GRAPHS", "FERROX_CUDA_DEC_SPLIT"] {
        assert!(gated.contains(m) && !release.contains(m), "{m} must be read only in a measure build");
    }
    let measure = documented(&doc, "Measuring knobs");
    for m in &measure {
        assert!(gated.contains(m), "{m} is documented as a measuring knob but no measure code reads it");
    }
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_ferrox")).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let env = help.split("Environment").nth(1).expect("--help has an Environment section");
    let shown: std::collections::BTreeSet<String> = env
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.starts_with("FERROX_"))
        .map(str::to_string)
        .collect();
    assert_eq!(shown, listed, "ferrox --help's environment (left) vs docs/dev/configuration.md (right)");
}
