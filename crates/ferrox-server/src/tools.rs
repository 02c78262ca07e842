//! OpenAI function calling: the `tools` a request offers, how the model's
//! chat template family spells a call, the grammar that forces one, and the
//! parse of a reply back into `tool_calls`.
//!
//! The decision (docs/decisions/0031): the family comes from the template's
//! text, as llama.cpp's chat handling detects it — Hermes/Qwen
//! (`<tool_call>{json}</tool_call>`), Llama 3.x (a bare
//! `{"name", "parameters"}` object after the `ipython` role), Mistral
//! (`[TOOL_CALLS][{...}]`), gpt-oss's harmony (a message
//! `to=functions.NAME` on the commentary channel, read by [`crate::harmony`])
//! — and a template that knows no tools gets the
//! generic form: the tools described in the system turn and a reply of
//! `{"tool_calls": [{"name", "arguments"}]}`. With `tool_choice` `required`
//! or a named function the reply is constrained by a Lark grammar whose
//! calls are `%json` of the functions' own parameter schemas, so even a
//! base model produces a call whose arguments validate.

use ferrox_core::tokenizer::{attr, Tokenizer};
use serde_json::{json, Value};

use crate::constrain::{with_json_options, Spec};
use crate::error::ApiError;
use crate::openai::{Tool, ToolChoice};

/// How a chat template family writes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `<tool_call>\n{"name": .., "arguments": ..}\n</tool_call>` (Hermes, Qwen 2.5/3).
    Hermes,
    /// `{"name": .., "parameters": ..}` (Llama 3.x).
    Llama3,
    /// `[TOOL_CALLS][{"name": .., "arguments": ..}]` (Mistral).
    Mistral,
    /// gpt-oss's harmony: `<|channel|>commentary to=functions.NAME
    /// <|constrain|>json<|message|>{..}<|call|>`; its replies' channels
    /// are split whether or not tools are offered ([`crate::harmony`]).
    Harmony,
    /// `{"tool_calls": [{"name": .., "arguments": ..}]}`, tools described in
    /// the system turn (templates without tool support).
    Generic,
}

impl Family {
    /// The family a template's source speaks.
    pub fn detect(source: &str) -> Family {
        // llama.cpp's test too (`common_chat_try_specialized_template`).
        if source.contains("<|channel|>") {
            Family::Harmony
        } else if source.contains("<tool_call>") {
            Family::Hermes
        } else if source.contains("[TOOL_CALLS]") {
            Family::Mistral
        } else if source.contains("<|start_header_id|>ipython<|end_header_id|>")
            || source.contains("<|python_tag|>")
        {
            Family::Llama3
        } else {
            Family::Generic
        }
    }

    fn args_key(self) -> &'static str {
        if self == Family::Llama3 {
            "parameters"
        } else {
            "arguments"
        }
    }
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    /// The model may answer or call.
    Auto,
    /// The model must call one (or, with parallel calls, several) of the tools.
    Required,
    /// The model must call this function.
    Named(String),
}

/// One function the model may call.
#[derive(Debug, Clone)]
pub struct Function {
    pub name: String,
    pub description: Option<String>,
    pub parameters: Value,
}

/// The tools of one request, validated.
#[derive(Debug, Clone)]
pub struct ToolSet {
    pub functions: Vec<Function>,
    pub mode: Mode,
    pub parallel: bool,
    pub family: Family,
}

/// A call parsed from the reply.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub name: String,
    /// The arguments as a JSON text (OpenAI sends them as a string).
    pub arguments: String,
}

/// `tools`, `tool_choice` and `parallel_tool_calls` checked; `None` when no
/// tool may be called (none offered, or `tool_choice: "none"`).
pub fn validate(
    tools: Option<&[Tool]>,
    choice: Option<&ToolChoice>,
    parallel: Option<bool>,
    family: Family,
) -> Result<Option<ToolSet>, ApiError> {
    let tools = tools.unwrap_or_default();
    let mut functions = Vec::with_capacity(tools.len());
    for (i, t) in tools.iter().enumerate() {
        let bad = |m: &str| ApiError::invalid(Some(format!("tools[{i}]")), m.to_string());
        if t.kind != "function" {
            return Err(bad(&format!("tool type {:?} is not supported (only \"function\")", t.kind)));
        }
        let f = t.function.as_ref().ok_or_else(|| bad("a function tool needs `function`"))?;
        if f.name.is_empty() || functions.iter().any(|g: &Function| g.name == f.name) {
            return Err(bad(&format!("function names must be unique and non-empty: {:?}", f.name)));
        }
        let parameters = match &f.parameters {
            None => json!({"type": "object"}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return Err(bad("`parameters` is a JSON Schema object")),
        };
        functions.push(Function {
            name: f.name.clone(),
            description: f.description.clone(),
            parameters,
        });
    }
    let mode = match choice {
        None => Mode::Auto,
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => return Ok(None),
            "auto" => Mode::Auto,
            "required" => Mode::Required,
            other => {
                return Err(ApiError::invalid(
                    Some("tool_choice".into()),
                    format!("unknown tool_choice {other:?} (none, auto, required, or {{\"type\": \"function\", \"function\": {{\"name\": ..}}}})"),
                ))
            }
        },
        Some(ToolChoice::Named { function, .. }) => {
            if !functions.iter().any(|f| f.name == function.name) {
                return Err(ApiError::invalid(
                    Some("tool_choice".into()),
                    format!("tool_choice names {:?}, which is not among `tools`", function.name),
                ));
            }
            Mode::Named(function.name.clone())
        }
    };
    if functions.is_empty() {
        if mode == Mode::Auto {
            return Ok(None);
        }
        return Err(ApiError::invalid(
            Some("tool_choice".into()),
            "tool_choice requires a call but `tools` is empty",
        ));
    }
    Ok(Some(ToolSet {
        functions,
        mode,
        parallel: parallel.unwrap_or(true),
        family,
    }))
}

impl ToolSet {
    /// The `tools` the template sees, in OpenAI's shape (as HF and llama.cpp pass them).
    pub fn template_tools(&self) -> Value {
        Value::Array(
            self.functions
                .iter()
                .map(|f| {
                    json!({"type": "function", "function": {
                        "name": f.name,
                        "description": f.description.clone().unwrap_or_default(),
                        "parameters": f.parameters,
                    }})
                })
                .collect(),
        )
    }

    /// For the generic family: the system text that describes the tools
    /// and the reply format.
    pub fn generic_prompt(&self) -> String {
        let list: Vec<Value> = self
            .functions
            .iter()
            .map(|f| json!({"name": f.name, "description": f.description, "parameters": f.parameters}))
            .collect();
        let mut s = format!(
            "You can call these tools:\n{}\n\nTo call tools, reply with only this JSON: {{\"tool_calls\": [{{\"name\": \"<tool name>\", \"arguments\": {{...}}}}]}}",
            Value::Array(list)
        );
        if self.mode == Mode::Auto {
            s.push_str("\nOtherwise reply in plain text.");
        }
        s
    }

    /// The functions a call may name.
    fn callable(&self) -> Vec<&Function> {
        match &self.mode {
            Mode::Named(n) => self.functions.iter().filter(|f| &f.name == n).collect(),
            _ => self.functions.iter().collect(),
        }
    }

    /// The schema of one call in this family.
    fn call_schema(&self) -> Value {
        let key = self.family.args_key();
        let one: Vec<Value> = self
            .callable()
            .into_iter()
            .map(|f| {
                json!({"type": "object",
                       "properties": {"name": {"const": f.name}, key: f.parameters},
                       "required": ["name", key],
                       "additionalProperties": false})
            })
            .collect();
        if one.len() == 1 {
            one.into_iter().next().unwrap_or_default()
        } else {
            json!({"anyOf": one})
        }
    }

    /// With `required` or a named function, the grammar that forces a call
    /// (`None` with `auto`).
    pub fn forced(&self, tok: &Tokenizer) -> Option<Spec> {
        if self.mode == Mode::Auto {
            return None;
        }
        let call = with_json_options(self.call_schema());
        let list = |call: Value| {
            let mut a = json!({"type": "array", "items": call, "minItems": 1});
            if !self.parallel {
                a["maxItems"] = json!(1);
            }
            a
        };
        let lark = match self.family {
            Family::Hermes => {
                let (open, close) = (literal(tok, "<tool_call>"), literal(tok, "</tool_call>"));
                let more = if self.parallel { " (\"\\n\" call)*" } else { "" };
                format!("start: call{more}\ncall: {open} \"\\n\" %json {call} \"\\n\" {close}\n")
            }
            Family::Llama3 => format!("start: %json {call}\n"),
            Family::Harmony => {
                // The call at once, one a turn (`<|call|>` ends it), each
                // function with its own schema. (llama.cpp lets analysis
                // messages come first; an unbounded free-text channel in
                // the grammar would let a weak model never reach the call.)
                let calls: Vec<String> = self
                    .callable()
                    .into_iter()
                    .map(|f| {
                        let open = serde_json::to_string(&format!("<|channel|>commentary to=functions.{} <|constrain|>json<|message|>", f.name)).unwrap_or_default();
                        format!("{open} %json {}", with_json_options(f.parameters.clone()))
                    })
                    .collect();
                format!("start: {}\n", calls.join(" | "))
            }
            Family::Mistral => format!(
                "start: {} %json {}\n",
                literal(tok, "[TOOL_CALLS]"),
                with_json_options(list(call))
            ),
            Family::Generic => {
                let s = json!({"type": "object",
                               "properties": {"tool_calls": list(call)},
                               "required": ["tool_calls"],
                               "additionalProperties": false});
                format!("start: %json {}\n", with_json_options(s))
            }
        };
        Some(Spec::Lark(lark))
    }

    /// The reply split into its text and its calls (no calls: all text).
    pub fn parse(&self, text: &str) -> (String, Vec<Call>) {
        let calls = match self.family {
            Family::Hermes => return parse_hermes(text, self),
            Family::Harmony => {
                let r = crate::harmony::Harmony::parse(text);
                return (r.content, self.harmony_calls(r.calls));
            }
            Family::Llama3 => {
                let t = text.trim().trim_start_matches("<|python_tag|>").trim();
                serde_json::from_str::<Value>(t).ok().and_then(|v| self.call_of(&v)).map(|c| vec![c])
            }
            Family::Mistral => {
                let t = text.trim().trim_start_matches("[TOOL_CALLS]").trim();
                self.calls_of(serde_json::from_str::<Value>(t).ok())
            }
            Family::Generic => {
                let v: Option<Value> = serde_json::from_str(text.trim()).ok();
                match v {
                    Some(Value::Object(mut o)) => match (o.remove("tool_calls"), o.remove("tool_call")) {
                        (Some(list), _) => self.calls_of(Some(list)),
                        (None, Some(one)) => self.call_of(&one).map(|c| vec![c]),
                        _ => self.call_of(&Value::Object(o)).map(|c| vec![c]),
                    },
                    _ => None,
                }
            }
        };
        match calls {
            Some(c) if !c.is_empty() => (String::new(), c),
            _ => (text.to_string(), Vec::new()),
        }
    }

    /// Harmony's calls that name one of the tools (others are dropped, as
    /// calls to built-in tools are); arguments as the model wrote them.
    pub fn harmony_calls(&self, raw: Vec<crate::harmony::RawCall>) -> Vec<Call> {
        raw.into_iter()
            .filter(|c| self.functions.iter().any(|f| f.name == c.name))
            .map(|c| Call { name: c.name, arguments: c.arguments })
            .collect()
    }

    fn calls_of(&self, v: Option<Value>) -> Option<Vec<Call>> {
        match v? {
            Value::Array(items) => items.iter().map(|i| self.call_of(i)).collect(),
            one => self.call_of(&one).map(|c| vec![c]),
        }
    }

    /// `{"name": .., "arguments"|"parameters": ..}` naming one of the tools.
    fn call_of(&self, v: &Value) -> Option<Call> {
        let name = v.get("name")?.as_str()?;
        if !self.functions.iter().any(|f| f.name == name) {
            return None;
        }
        let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or(json!({}));
        let arguments = match args {
            Value::String(s) => s,
            other => other.to_string(),
        };
        Some(Call {
            name: name.to_string(),
            arguments,
        })
    }
}

fn parse_hermes(text: &str, set: &ToolSet) -> (String, Vec<Call>) {
    let mut rest = text;
    let mut content = String::new();
    let mut calls = Vec::new();
    while let Some(at) = rest.find("<tool_call>") {
        content.push_str(&rest[..at]);
        let after = &rest[at + "<tool_call>".len()..];
        let (inner, next) = match after.find("</tool_call>") {
            Some(end) => (&after[..end], &after[end + "</tool_call>".len()..]),
            None => (after, ""),
        };
        match serde_json::from_str::<Value>(inner.trim()).ok().and_then(|v| set.call_of(&v)) {
            Some(c) => calls.push(c),
            None => return (text.to_string(), Vec::new()),
        }
        rest = next;
    }
    content.push_str(rest);
    if calls.is_empty() {
        return (text.to_string(), calls);
    }
    (content.trim().to_string(), calls)
}

/// An assistant turn's call as templates read it: `function.arguments` an
/// object (HF templates apply `tojson` to it), not OpenAI's JSON string.
pub fn calls_for_template(call: &Value) -> Value {
    let mut c = call.clone();
    if let Some(Value::String(s)) = c.pointer("/function/arguments") {
        if let Ok(v) = serde_json::from_str::<Value>(s) {
            c["function"]["arguments"] = v;
        }
    }
    c
}

/// For a template that knows no tools (llama.cpp's polyfill): an
/// assistant's calls become its text in the generic reply form, a `tool`
/// turn becomes a user turn carrying `{"tool_response": ..}`, and turns of
/// one role in a row merge (such templates insist roles alternate).
pub fn generic_turns(values: Vec<Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::with_capacity(values.len());
    for mut v in values {
        if let Some(Value::Array(calls)) = v.get("tool_calls").cloned() {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| json!({"name": c.pointer("/function/name"), "arguments": c.pointer("/function/arguments")}))
                .collect();
            let text = v["content"].as_str().unwrap_or_default().to_string();
            let json = json!({"tool_calls": calls}).to_string();
            v = json!({"role": "assistant", "content": if text.is_empty() { json } else { format!("{text}\n{json}") }});
        } else if v["role"] == "tool" {
            let resp = json!({"tool_response": {"tool_call_id": v.get("tool_call_id"), "name": v.get("name"), "content": v["content"]}});
            v = json!({"role": "user", "content": resp.to_string()});
        }
        match out.last_mut() {
            Some(last) if last["role"] == v["role"] && v["role"] != "system" => {
                let merged = format!("{}\n{}", last["content"].as_str().unwrap_or_default(), v["content"].as_str().unwrap_or_default());
                last["content"] = json!(merged);
            }
            _ => out.push(v),
        }
    }
    out
}

/// `text` in a Lark grammar: a control token by id (`<[id]>`), else a string.
fn literal(tok: &Tokenizer, text: &str) -> String {
    match tok.token_id(text) {
        Some(id) if tok.token_attr(id).unwrap_or(0) & attr::CONTROL != 0 => format!("<[{id}]>"),
        _ => serde_json::to_string(text).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(family: Family) -> ToolSet {
        ToolSet {
            functions: vec![Function {
                name: "get_weather".into(),
                description: None,
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
            }],
            mode: Mode::Auto,
            parallel: true,
            family,
        }
    }

    #[test]
    fn families_are_detected_from_the_template_text() {
        assert_eq!(Family::detect("{{ '<tool_call>\\n' }}"), Family::Hermes);
        assert_eq!(Family::detect("[TOOL_CALLS] {{ x }}"), Family::Mistral);
        assert_eq!(Family::detect("<|start_header_id|>ipython<|end_header_id|>"), Family::Llama3);
        assert_eq!(Family::detect("<start_of_turn>model"), Family::Generic);
        assert_eq!(Family::detect("{{- \"<|start|>assistant<|channel|>final<|message|>\" }}"), Family::Harmony);
    }

    #[test]
    fn each_family_spelling_parses_to_calls() {
        let want = vec![Call { name: "get_weather".into(), arguments: r#"{"city":"Oslo"}"#.into() }];
        let h = set(Family::Hermes).parse("ok <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>");
        assert_eq!(h, ("ok".to_string(), want.clone()));
        let l = set(Family::Llama3).parse("<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}");
        assert_eq!(l.1, want);
        let m = set(Family::Mistral).parse("[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]");
        assert_eq!(m.1, want);
        let g = set(Family::Generic).parse("{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}]}");
        assert_eq!(g.1, want);
        let h = set(Family::Harmony).parse("<|channel|>analysis<|message|>Use the tool.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\":\"Oslo\"}");
        assert_eq!(h, (String::new(), want.clone()));
        let h = set(Family::Harmony).parse("<|channel|>commentary to=functions.other <|constrain|>json<|message|>{}<|call|>");
        assert!(h.1.is_empty());
        // Unknown functions and plain text stay text.
        let t = set(Family::Hermes).parse("<tool_call>{\"name\": \"other\", \"arguments\": {}}</tool_call>");
        assert!(t.1.is_empty());
        assert!(set(Family::Generic).parse("hello").1.is_empty());
    }
}
