//! Python's idea of whitespace for `str.strip()`, `str.split()` and the
//! `trim` filter (jinja2's `trim` is `str.strip`).
//!
//! Rust's `char::is_whitespace` (Unicode White_Space) and Python's
//! `str.isspace` agree except on U+001C..U+001F, the ASCII information
//! separators, which Python counts as whitespace. minijinja and its pycompat
//! follow Rust, so a turn ending in one of them would be trimmed differently
//! from the prompt the model was trained with; these few methods are
//! answered here and everything else is left to pycompat.

use minijinja::value::ValueKind;
use minijinja::{Error, State, Value};

fn is_py_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Method calls on values (`s.strip()`, `d.items()` …).
pub(crate) fn method_callback(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let (ValueKind::String, Some(s)) = (value.kind(), value.as_str()) {
        let no_chars = args.is_empty() || (args.len() == 1 && args[0].is_none());
        match method {
            "strip" if no_chars => return Ok(Value::from(s.trim_matches(is_py_space))),
            "lstrip" if no_chars => return Ok(Value::from(s.trim_start_matches(is_py_space))),
            "rstrip" if no_chars => return Ok(Value::from(s.trim_end_matches(is_py_space))),
            "split" if no_chars => {
                return Ok(Value::from(
                    s.split(is_py_space)
                        .filter(|w| !w.is_empty())
                        .map(Value::from)
                        .collect::<Vec<_>>(),
                ))
            }
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// The `trim` filter: `trim(s)` strips Python whitespace, `trim(s, chars)`
/// strips any of `chars`.
pub(crate) fn trim(s: &str, chars: Option<&str>) -> String {
    match chars {
        None => s.trim_matches(is_py_space).to_string(),
        Some(set) => s.trim_matches(|c| set.contains(c)).to_string(),
    }
}

/// The `iterable` test as Python answers it: strings, lists, dicts and
/// jinja2's Undefined iterate; `None` does not (minijinja would say it does,
/// and `tools is iterable and tools | length > 0` then fails on `none`).
pub(crate) fn is_iterable(v: &Value) -> bool {
    matches!(
        v.kind(),
        ValueKind::Seq
            | ValueKind::Map
            | ValueKind::Iterable
            | ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Undefined
    )
}

/// The `sequence` test as jinja2 answers it (has `len` and indexing):
/// strings and dicts are sequences too.
pub(crate) fn is_sequence(v: &Value) -> bool {
    matches!(
        v.kind(),
        ValueKind::Seq
            | ValueKind::Map
            | ValueKind::String
            | ValueKind::Bytes
            | ValueKind::Undefined
    )
}
