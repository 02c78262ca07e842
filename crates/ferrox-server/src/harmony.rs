//! gpt-oss's harmony replies split into what an OpenAI client reads: the
//! `analysis` channel as `reasoning_content`, the `final` channel (and
//! `commentary` preambles) as `content`, and messages addressed
//! `to=functions.NAME` as tool calls.
//!
//! The decision: parse the reply's text, not its tokens, as llama.cpp's
//! gpt-oss parser (`common/parsers/gpt-oss.cpp`) does: the markup tokens
//! (`<|channel|>`, `<|message|>`, `<|end|>`, `<|start|>`, `<|constrain|>`)
//! print as their text, so the text is the whole reply. A reply is a run of
//! messages, each `HEADER<|message|>BODY` closed by `<|end|>` (the next one
//! opening with `<|start|>assistant`) or by the end of the reply
//! (`<|return|>` and `<|call|>` end generation and never reach the text).
//! The header names the channel (`<|channel|>analysis`) and, for a call,
//! the recipient (` to=functions.get_weather`, before or after the
//! channel), and may constrain the body (` <|constrain|>json`). Messages to
//! other recipients (built-in tools the request did not offer) are dropped,
//! as llama.cpp drops them. A reply that does not open with markup (a
//! response format forced JSON from the first token) is all content.
//!
//! [`Harmony`] is incremental: [`Harmony::push`] returns the reasoning and
//! content a piece of text settles, holding back only a tail that may be the
//! start of a marker, so a stream's deltas concatenate to the whole reply's
//! fields.

/// The header of the reply's final message, as the model writes it after
/// the generation prompt's `<|start|>assistant`.
pub const FINAL_HEADER: &str = "<|channel|>final<|message|>";

/// Text a header may not outgrow: past it the "header" is taken for text.
const MAX_HEADER: usize = 512;

/// Where a message's body goes.
#[derive(Debug, Clone, PartialEq)]
enum Route {
    Reasoning,
    Content,
    /// A call to `functions.NAME`: the body is its arguments.
    Call(String),
    /// Addressed elsewhere: dropped.
    Drop,
}

#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Reading a header up to `<|message|>`.
    Header(String),
    /// In a body.
    Body(Route),
}

/// What a piece of a reply settled.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Delta {
    /// Text of the `analysis` channel.
    pub reasoning: String,
    /// Text for `content`.
    pub content: String,
}

impl Delta {
    /// Nothing settled.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }
}

/// A call the reply made: the function's name and its arguments' text.
#[derive(Debug, Clone, PartialEq)]
pub struct RawCall {
    /// After `functions.`.
    pub name: String,
    /// The message body, trimmed.
    pub arguments: String,
}

/// A whole reply, parsed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    /// The analysis channel's messages, joined.
    pub reasoning: String,
    /// The final channel's (and preambles') messages, joined.
    pub content: String,
    /// The calls, in order.
    pub calls: Vec<RawCall>,
}

/// The incremental parser of one reply.
#[derive(Debug, Clone)]
pub struct Harmony {
    state: State,
    /// Body text not yet settled (a possible marker's start).
    held: String,
    /// The arguments of the call being read.
    args: String,
    calls: Vec<RawCall>,
    /// Whether anything was read yet (only the first header may turn out to be text).
    started: bool,
}

impl Default for Harmony {
    fn default() -> Self {
        Harmony::new()
    }
}

/// Markers that close a body.
const BODY_ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];

impl Harmony {
    /// A parser at the start of the assistant's turn (the template's
    /// generation prompt ends with `<|start|>assistant`).
    pub fn new() -> Harmony {
        Harmony { state: State::Header(String::new()), held: String::new(), args: String::new(), calls: Vec::new(), started: false }
    }

    /// Feeds the next piece of the reply; returns what it settled.
    pub fn push(&mut self, text: &str) -> Delta {
        let mut out = Delta::default();
        let mut rest = text.to_string();
        while !rest.is_empty() {
            rest = match &mut self.state {
                State::Header(h) => {
                    h.push_str(&rest);
                    if let Some(at) = h.find("<|message|>") {
                        let after = h[at + "<|message|>".len()..].to_string();
                        let route = route_of(&h[..at]);
                        self.started = true;
                        self.state = State::Body(route);
                        after
                    } else if (!self.started && !looks_like_header(h)) || h.len() > MAX_HEADER {
                        // Not markup: the reply is plain text from here.
                        let t = std::mem::take(h);
                        self.started = true;
                        self.state = State::Body(Route::Content);
                        t
                    } else {
                        String::new()
                    }
                }
                State::Body(_) => {
                    self.held.push_str(&rest);
                    let held = std::mem::take(&mut self.held);
                    match BODY_ENDS.iter().filter_map(|m| held.find(m).map(|at| (at, m.len()))).min() {
                        Some((at, len)) => {
                            self.emit(&held[..at], &mut out);
                            self.close();
                            held[at + len..].to_string()
                        }
                        None => {
                            let keep = partial_marker_len(&held);
                            self.emit(&held[..held.len() - keep], &mut out);
                            self.held = held[held.len() - keep..].to_string();
                            String::new()
                        }
                    }
                }
            };
        }
        out
    }

    /// Ends the reply: flushes held text and returns the last of it and the calls.
    pub fn finish(mut self) -> (Delta, Vec<RawCall>) {
        let mut out = Delta::default();
        match &self.state {
            State::Body(_) => {
                let held = std::mem::take(&mut self.held);
                self.emit(&held, &mut out);
                self.close();
            }
            // A reply cut inside a header (max_tokens) says nothing more,
            // unless the "header" was only a word that began like one.
            State::Header(h) if !self.started && !h.starts_with("<|") && !h.starts_with(" to=") => {
                out.content.push_str(h)
            }
            State::Header(_) => {}
        }
        (out, self.calls)
    }

    /// Parses a whole reply.
    pub fn parse(text: &str) -> Reply {
        let mut h = Harmony::new();
        let mut d = h.push(text);
        let (tail, calls) = h.finish();
        d.reasoning.push_str(&tail.reasoning);
        d.content.push_str(&tail.content);
        Reply { reasoning: d.reasoning, content: d.content, calls }
    }

    fn emit(&mut self, text: &str, out: &mut Delta) {
        match &self.state {
            State::Body(Route::Reasoning) => out.reasoning.push_str(text),
            State::Body(Route::Content) => out.content.push_str(text),
            State::Body(Route::Call(_)) => self.args.push_str(text),
            _ => {}
        }
    }

    /// The body ended: a call is complete; the next header begins.
    fn close(&mut self) {
        if let State::Body(Route::Call(name)) = &self.state {
            let arguments = std::mem::take(&mut self.args).trim().to_string();
            self.calls.push(RawCall { name: name.clone(), arguments });
        }
        self.state = State::Header(String::new());
    }
}

/// Whether `h` (a header read so far) can still be harmony markup: it opens
/// with `<|` or ` to=` (or is a prefix of one).
fn looks_like_header(h: &str) -> bool {
    ["<|", " to=", "to="].iter().any(|m| h.starts_with(m) || m.starts_with(h))
}

/// The longest tail of `s` that is a proper prefix of a body-closing marker.
fn partial_marker_len(s: &str) -> usize {
    let mut best = 0;
    for m in BODY_ENDS {
        for n in (1..m.len()).rev() {
            if n > best && s.ends_with(&m[..n]) {
                best = n;
                break;
            }
        }
    }
    best
}

/// The route a header gives its body.
fn route_of(header: &str) -> Route {
    let word_after = |key: &str, from_end: bool| {
        let at = if from_end { header.rfind(key) } else { header.find(key) }?;
        let w: String = header[at + key.len()..].chars().take_while(|c| !c.is_whitespace() && *c != '<').collect();
        Some(w)
    };
    let channel = word_after("<|channel|>", true);
    // ` to=assistant` before a channel is a stray prefix, not a recipient.
    let to = word_after("to=", false).filter(|r| r != "assistant");
    match (to, channel.as_deref()) {
        (Some(r), _) => match r.strip_prefix("functions.") {
            Some(name) if !name.is_empty() => Route::Call(name.to_string()),
            _ => Route::Drop,
        },
        (None, Some("analysis")) => Route::Reasoning,
        (None, _) => Route::Content,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPLY: &str = "<|channel|>analysis<|message|>User says hi. Reply.<|end|><|start|>assistant<|channel|>final<|message|>Hello! <b>Hi</b> <|x";

    #[test]
    fn analysis_is_reasoning_and_final_is_content() {
        let r = Harmony::parse(REPLY);
        assert_eq!(r.reasoning, "User says hi. Reply.");
        assert_eq!(r.content, "Hello! <b>Hi</b> <|x");
        assert!(r.calls.is_empty());
    }

    /// Every way of cutting the reply into pieces (here: after each byte
    /// boundary, and token-like pieces) streams the same fields.
    #[test]
    fn streamed_pieces_concatenate_to_the_whole_parse() {
        let whole = Harmony::parse(REPLY);
        for step in 1..=REPLY.len() {
            let mut h = Harmony::new();
            let (mut reasoning, mut content) = (String::new(), String::new());
            let mut at = 0;
            while at < REPLY.len() {
                let mut end = (at + step).min(REPLY.len());
                while !REPLY.is_char_boundary(end) {
                    end += 1;
                }
                let d = h.push(&REPLY[at..end]);
                reasoning.push_str(&d.reasoning);
                content.push_str(&d.content);
                at = end;
            }
            let (d, calls) = h.finish();
            reasoning.push_str(&d.reasoning);
            content.push_str(&d.content);
            assert_eq!((reasoning.as_str(), content.as_str(), calls.len()), (whole.reasoning.as_str(), whole.content.as_str(), 0), "step {step}");
        }
    }

    #[test]
    fn reasoning_streams_before_the_message_ends() {
        let mut h = Harmony::new();
        assert!(h.push("<|channel|>").is_empty());
        assert!(h.push("analysis").is_empty());
        assert!(h.push("<|message|>").is_empty());
        assert_eq!(h.push("Think").reasoning, "Think");
        // "<|" may open `<|end|>`: held, then released as text.
        assert_eq!(h.push(" <|").reasoning, " ");
        assert_eq!(h.push("b").reasoning, "<|b");
        assert!(h.push("<|end|>").is_empty());
    }

    #[test]
    fn calls_are_read_with_the_recipient_in_either_place() {
        let in_role = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary <|constrain|>json<|message|>{\"city\": \"Oslo\"}";
        let r = Harmony::parse(in_role);
        assert_eq!(r.reasoning, "Need weather.");
        assert_eq!(r.content, "");
        assert_eq!(r.calls, vec![RawCall { name: "get_weather".into(), arguments: "{\"city\": \"Oslo\"}".into() }]);
        let in_channel = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\"}<|call|>";
        let r = Harmony::parse(in_channel);
        assert_eq!(r.calls, vec![RawCall { name: "get_weather".into(), arguments: "{\"city\":\"Paris\"}".into() }]);
        // A preamble on commentary without a recipient is content; a
        // built-in tool's message is dropped.
        let r = Harmony::parse("<|channel|>commentary<|message|>Checking.<|end|><|start|>assistant<|channel|>analysis to=browser.search<|message|>{\"q\":1}<|end|><|start|>assistant<|channel|>final<|message|>Done.");
        assert_eq!((r.reasoning.as_str(), r.content.as_str(), r.calls.len()), ("", "Checking.Done.", 0));
    }

    #[test]
    fn a_stray_commentary_prefix_and_unmarked_text() {
        let r = Harmony::parse("<|channel|>commentary to=assistant<|channel|>analysis<|message|>hmm<|end|><|start|>assistant<|channel|>final<|message|>ok");
        assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("hmm", "ok"));
        // JSON forced from the first token: all content.
        let r = Harmony::parse("{\"a\": 1}");
        assert_eq!((r.reasoning.as_str(), r.content.as_str()), ("", "{\"a\": 1}"));
        let r = Harmony::parse("t");
        assert_eq!(r.content, "t", "a reply that only began like ` to=` is text");
        let r = Harmony::parse("Hello");
        assert_eq!(r.content, "Hello");
        // Cut inside a header: nothing.
        assert_eq!(Harmony::parse("<|channel|>anal"), Reply::default());
        // A header that never ends is text after MAX_HEADER bytes.
        let long = format!("<|channel|>{}", "x".repeat(MAX_HEADER));
        assert_eq!(Harmony::parse(&long).content, long);
    }
}
