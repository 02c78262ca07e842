//! Built-in templates for files that carry no `tokenizer.chat_template`.
//!
//! Each is a compact rewrite of the family's published template restricted to
//! system/user/assistant turns (no tools), and renders those turns to exactly
//! the bytes the published one does; `tests.rs` checks that against jinja2
//! running the published template. Where the published template refuses input
//! (Gemma and Llama 2 require user/assistant alternation), so does the copy:
//! the model was trained on nothing else.

/// A prompt format ferrox knows without the file's help.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BuiltinTemplate {
    /// Gemma 2 / Gemma 3: `<start_of_turn>user … <end_of_turn>`, the system
    /// prompt folded into the first user turn (Gemma 3's rule; Gemma 2's
    /// template refuses a system turn).
    Gemma,
    /// Llama 2 chat: `<s>[INST] <<SYS>>…<</SYS>> … [/INST] answer </s>`.
    Llama2,
    /// Llama 3.1 / 3.3: `<|start_header_id|>role<|end_header_id|>`, always a
    /// system header with the knowledge-cutoff lines.
    Llama3,
    /// Qwen 2 / 2.5: ChatML with Qwen's default system prompt.
    Qwen2,
    /// Qwen 3: ChatML, no default system prompt, an empty `<think>` block on
    /// the final assistant turn and reasoning stripped from earlier ones.
    Qwen3,
    /// Phi-3 / Phi-3.5: `<|user|>\n…<|end|>\n<|assistant|>\n`.
    Phi3,
}

impl BuiltinTemplate {
    /// Every built-in template.
    pub const ALL: [BuiltinTemplate; 6] = [
        BuiltinTemplate::Gemma,
        BuiltinTemplate::Llama2,
        BuiltinTemplate::Llama3,
        BuiltinTemplate::Qwen2,
        BuiltinTemplate::Qwen3,
        BuiltinTemplate::Phi3,
    ];

    /// A short name ("gemma", "llama3", …).
    pub fn name(self) -> &'static str {
        match self {
            BuiltinTemplate::Gemma => "gemma",
            BuiltinTemplate::Llama2 => "llama2",
            BuiltinTemplate::Llama3 => "llama3",
            BuiltinTemplate::Qwen2 => "qwen2",
            BuiltinTemplate::Qwen3 => "qwen3",
            BuiltinTemplate::Phi3 => "phi3",
        }
    }

    /// The template for a GGUF `general.architecture`, or `None` when ferrox
    /// has none. `has_token(text)` says whether the vocabulary holds a token
    /// with that text: a `llama` file is Llama 3 when it has
    /// `<|start_header_id|>`, Llama 2 otherwise.
    pub fn for_arch(arch: &str, has_token: impl Fn(&str) -> bool) -> Option<BuiltinTemplate> {
        match arch {
            "gemma" | "gemma2" | "gemma3" => Some(BuiltinTemplate::Gemma),
            "llama" if has_token("<|start_header_id|>") => Some(BuiltinTemplate::Llama3),
            "llama" => Some(BuiltinTemplate::Llama2),
            "qwen2" | "qwen2moe" => Some(BuiltinTemplate::Qwen2),
            "qwen3" | "qwen3moe" => Some(BuiltinTemplate::Qwen3),
            "phi3" => Some(BuiltinTemplate::Phi3),
            _ => None,
        }
    }

    /// The Jinja source.
    pub fn source(self) -> &'static str {
        match self {
            BuiltinTemplate::Gemma => GEMMA,
            BuiltinTemplate::Llama2 => LLAMA2,
            BuiltinTemplate::Llama3 => LLAMA3,
            BuiltinTemplate::Qwen2 => QWEN2,
            BuiltinTemplate::Qwen3 => QWEN3,
            BuiltinTemplate::Phi3 => PHI3,
        }
    }
}

// The sources use `{%- -%}` throughout, so their own line breaks never reach
// the output and they can be laid out as code.
macro_rules! alternation_check {
    () => {
        "{%- if (m.role == 'user') != (loop.index0 % 2 == 0) -%}\n\
         {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') -}}\n\
         {%- endif -%}\n"
    };
}

const GEMMA: &str = concat!(
    "{{- bos_token -}}\n",
    "{%- if messages and messages[0].role == 'system' -%}\n",
    "  {%- set first_prefix = messages[0].content + '\\n\\n' -%}\n",
    "  {%- set turns = messages[1:] -%}\n",
    "{%- else -%}\n",
    "  {%- set first_prefix = '' -%}\n",
    "  {%- set turns = messages -%}\n",
    "{%- endif -%}\n",
    "{%- for m in turns -%}\n",
    alternation_check!(),
    "  {{- '<start_of_turn>' + ('model' if m.role == 'assistant' else m.role) + '\\n' -}}\n",
    "  {{- (first_prefix if loop.first else '') + m.content | trim + '<end_of_turn>\\n' -}}\n",
    "{%- endfor -%}\n",
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}\n",
);

const LLAMA2: &str = concat!(
    "{%- if messages and messages[0].role == 'system' -%}\n",
    "  {%- set sys = messages[0].content -%}\n",
    "  {%- set turns = messages[1:] -%}\n",
    "{%- else -%}\n",
    "  {%- set sys = none -%}\n",
    "  {%- set turns = messages -%}\n",
    "{%- endif -%}\n",
    "{%- for m in turns -%}\n",
    alternation_check!(),
    "  {%- if loop.first and sys is not none -%}\n",
    "    {%- set content = '<<SYS>>\\n' + sys + '\\n<</SYS>>\\n\\n' + m.content -%}\n",
    "  {%- else -%}\n",
    "    {%- set content = m.content -%}\n",
    "  {%- endif -%}\n",
    "  {%- if m.role == 'user' -%}\n",
    "    {{- bos_token + '[INST] ' + content | trim + ' [/INST]' -}}\n",
    "  {%- elif m.role == 'assistant' -%}\n",
    "    {{- ' ' + content | trim + ' ' + eos_token -}}\n",
    "  {%- endif -%}\n",
    "{%- endfor -%}\n",
);

const LLAMA3: &str = concat!(
    "{{- bos_token -}}\n",
    "{%- if messages and messages[0].role == 'system' -%}\n",
    "  {%- set sys = messages[0].content | trim -%}\n",
    "  {%- set turns = messages[1:] -%}\n",
    "{%- else -%}\n",
    "  {%- set sys = '' -%}\n",
    "  {%- set turns = messages -%}\n",
    "{%- endif -%}\n",
    "{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' -}}\n",
    "{{- 'Cutting Knowledge Date: December 2023\\nToday Date: 26 Jul 2024\\n\\n' + sys + '<|eot_id|>' -}}\n",
    "{%- for m in turns -%}\n",
    "  {{- '<|start_header_id|>' + m.role + '<|end_header_id|>\\n\\n' + m.content | trim + '<|eot_id|>' -}}\n",
    "{%- endfor -%}\n",
    "{%- if add_generation_prompt -%}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}{%- endif -%}\n",
);

const QWEN2: &str = concat!(
    "{%- if messages and messages[0].role == 'system' -%}\n",
    "  {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}\n",
    "{%- else -%}\n",
    "  {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' -}}\n",
    "{%- endif -%}\n",
    "{%- for m in messages -%}\n",
    "  {%- if not (loop.first and m.role == 'system') -%}\n",
    "    {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}\n",
    "  {%- endif -%}\n",
    "{%- endfor -%}\n",
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n",
);

// The last "real" user turn (not a tool response wrapped as a user turn)
// decides which assistant turns keep their reasoning.
const QWEN3: &str = concat!(
    "{%- if messages and messages[0].role == 'system' -%}\n",
    "  {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' -}}\n",
    "{%- endif -%}\n",
    "{%- set ns = namespace(last_query=messages | length - 1) -%}\n",
    "{%- for m in messages -%}\n",
    "  {%- if m.role == 'user' and not (m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) -%}\n",
    "    {%- set ns.last_query = loop.index0 -%}\n",
    "  {%- endif -%}\n",
    "{%- endfor -%}\n",
    "{%- for m in messages -%}\n",
    "  {%- if m.role == 'assistant' -%}\n",
    "    {%- set content = m.content -%}\n",
    "    {%- set reasoning = '' -%}\n",
    "    {%- if '</think>' in content -%}\n",
    "      {%- set reasoning = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') -%}\n",
    "      {%- set content = content.split('</think>')[-1].lstrip('\\n') -%}\n",
    "    {%- endif -%}\n",
    "    {%- if loop.index0 > ns.last_query and (loop.last or reasoning) -%}\n",
    "      {{- '<|im_start|>assistant\\n<think>\\n' + reasoning.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') -}}\n",
    "    {%- else -%}\n",
    "      {{- '<|im_start|>assistant\\n' + content -}}\n",
    "    {%- endif -%}\n",
    "    {{- '<|im_end|>\\n' -}}\n",
    "  {%- elif not (loop.first and m.role == 'system') -%}\n",
    "    {{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}\n",
    "  {%- endif -%}\n",
    "{%- endfor -%}\n",
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n",
);

const PHI3: &str = concat!(
    "{%- for m in messages -%}\n",
    "  {%- if m.role == 'system' and m.content -%}\n",
    "    {{- '<|system|>\\n' + m.content + '<|end|>\\n' -}}\n",
    "  {%- elif m.role == 'user' or m.role == 'assistant' -%}\n",
    "    {{- '<|' + m.role + '|>\\n' + m.content + '<|end|>\\n' -}}\n",
    "  {%- endif -%}\n",
    "{%- endfor -%}\n",
    "{%- if add_generation_prompt -%}{{- '<|assistant|>\\n' -}}{%- else -%}{{- eos_token -}}{%- endif -%}\n",
);
