//! The one typed reader of the `FERROX_*` environment variables, shared by
//! every crate (this is the leaf all of them import).
//!
//! The key decision: **a value that does not parse is an error naming the
//! variable and the values it takes, never a silent default** — a typo in
//! `FERROX_CPU_ISA` must not quietly run another configuration than the one
//! asked for. Unset (or set to the empty string, the shell's way of unsetting
//! in a prefix) is the default. Parsing is split from reading so the grammar
//! is tested without touching the process environment.
//!
//! Which variables a release build reads at all, and which only a
//! `measure` build reads, is `docs/dev/configuration.md` (held to the
//! sources by `crates/ferrox/tests/tidy.rs`).

/// A `FERROX_*` variable set to a value it does not take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name}={value:?} is not a value it takes: expected {expected}")]
pub struct BadValue {
    /// The variable.
    pub name: &'static str,
    /// What it was set to.
    pub value: String,
    /// The values it takes, in words.
    pub expected: String,
}

/// The words a switch takes for off and on.
pub const SWITCH: &str = "0, 1, off, on, false or true";

/// `name`'s value: `None` when unset or empty; a value that is not
/// Unicode is a [`BadValue`].
pub fn raw(name: &'static str) -> Result<Option<String>, BadValue> {
    match std::env::var(name) {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(v)) => Err(BadValue {
            name,
            value: v.to_string_lossy().into_owned(),
            expected: "a UTF-8 value".into(),
        }),
    }
}

/// `value` of `name` through `parse`; `None` (unset) is `Ok(None)`, a value
/// `parse` refuses a [`BadValue`] saying `expected`.
pub fn parse_with<T>(
    name: &'static str,
    value: Option<&str>,
    expected: &str,
    parse: impl FnOnce(&str) -> Option<T>,
) -> Result<Option<T>, BadValue> {
    match value {
        None => Ok(None),
        Some(v) => parse(v.trim()).map(Some).ok_or_else(|| BadValue {
            name,
            value: v.to_string(),
            expected: expected.to_string(),
        }),
    }
}

/// A switch: `0|off|false` and `1|on|true` (any case), else `default`.
pub fn parse_switch(name: &'static str, value: Option<&str>, default: bool) -> Result<bool, BadValue> {
    let on = parse_with(name, value, SWITCH, |v| match v.to_ascii_lowercase().as_str() {
        "0" | "off" | "false" => Some(false),
        "1" | "on" | "true" => Some(true),
        _ => None,
    })?;
    Ok(on.unwrap_or(default))
}

/// A count (a non-negative integer) that `ok` accepts, else `default`.
pub fn parse_count(
    name: &'static str,
    value: Option<&str>,
    default: usize,
    expected: &str,
    ok: impl Fn(usize) -> bool,
) -> Result<usize, BadValue> {
    let n = parse_with(name, value, expected, |v| v.parse::<usize>().ok().filter(|&n| ok(n)))?;
    Ok(n.unwrap_or(default))
}

/// [`parse_switch`] over the environment.
pub fn switch(name: &'static str, default: bool) -> Result<bool, BadValue> {
    parse_switch(name, raw(name)?.as_deref(), default)
}

/// [`parse_count`] over the environment.
pub fn count(
    name: &'static str,
    default: usize,
    expected: &str,
    ok: impl Fn(usize) -> bool,
) -> Result<usize, BadValue> {
    parse_count(name, raw(name)?.as_deref(), default, expected, ok)
}

/// Every variable this crate reads, checked: the CPU level
/// (`FERROX_CPU_ISA`) and the AMX GEMM's product (`FERROX_AMX_GEMM`). A
/// backend's open and the binary call it first, so a bad value is an error
/// there and not a panic deep in a kernel.
pub fn check() -> Result<(), BadValue> {
    crate::cpu::Isa::configured()?;
    crate::gemm::amx_gemm_bf16()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_that_does_not_parse_is_an_error_naming_the_variable_and_its_values() {
        let e = parse_switch("FERROX_CPU_PREPACK", Some("banana"), true).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("FERROX_CPU_PREPACK") && msg.contains("\"banana\""), "{msg}");
        assert!(msg.contains(SWITCH), "{msg}");
    }

    #[test]
    fn a_switch_takes_its_words_in_any_case_and_unset_is_the_default() {
        for (v, want) in [("0", false), ("OFF", false), ("false", false), ("1", true), ("On", true), ("TRUE", true)] {
            assert_eq!(parse_switch("X", Some(v), !want), Ok(want), "{v}");
        }
        assert_eq!(parse_switch("X", None, true), Ok(true));
        assert_eq!(parse_switch("X", None, false), Ok(false));
    }

    #[test]
    fn a_count_out_of_its_set_or_not_a_number_is_an_error() {
        let pow2 = |n: usize| matches!(n, 32 | 64 | 128);
        assert_eq!(parse_count("X", Some("64"), 128, "32, 64 or 128", pow2), Ok(64));
        assert_eq!(parse_count("X", None, 128, "32, 64 or 128", pow2), Ok(128));
        for bad in ["banana", "-1", "48", "1.5"] {
            let e = parse_count("FERROX_CUDA_DEC_CHUNK", Some(bad), 128, "32, 64 or 128", pow2).unwrap_err();
            assert_eq!(e.name, "FERROX_CUDA_DEC_CHUNK");
            assert!(e.to_string().contains("32, 64 or 128"), "{e}");
        }
    }
}
