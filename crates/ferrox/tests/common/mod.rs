//! Helpers shared by the end-to-end tests of the `ferrox` binary.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs the built `ferrox` binary.
pub fn ferrox(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrox")).args(args).output().expect("run ferrox")
}

/// A path in this test process's own scratch directory.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrox-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Output bytes as text.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A failure that is a clean error: non-zero exit, the expected words, no panic.
pub fn assert_clean_error(o: &Output, expect: &str) {
    let err = text(&o.stderr);
    assert!(!o.status.success(), "expected failure, got success; stdout: {}; stderr: {err}", text(&o.stdout));
    assert!(err.contains(expect), "stderr should mention {expect:?}: {err}");
    assert!(!err.contains("panicked"), "a panic is not an error message: {err}");
}
