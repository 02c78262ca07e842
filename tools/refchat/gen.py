#!/usr/bin/env python3
"""Reference renders of chat templates by jinja2, the engine HF transformers uses.

ferrox renders chat templates with minijinja; this script records what jinja2,
configured as transformers' `apply_chat_template` configures it, produces for
the same template and conversation, so the Rust test
(`crates/ferrox-core/src/chat_template/tests.rs`) can compare byte for byte.

The environment mirrors transformers (utils/chat_template_utils.py):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols and AssistantTracker (`{% generation %}`) extensions, `tojson` = json.dumps(ensure_ascii=False, ...),
globals `raise_exception` and `strftime_now`, and the render variables
messages, tools=None, add_generation_prompt, bos_token, eos_token.
`strftime_now` is pinned to NOW (UTC) so the expected text is reproducible;
the Rust side pins the same instant with `ChatTemplate::with_time`.

usage: gen.py [--templates DIR] [--out DIR]
  defaults: crates/ferrox-core/testdata/chat_template/{templates,.}

For every DIR/*.jinja it writes OUT/<stem>.json:
  {"template": "templates/<stem>.jinja", "bos_token", "eos_token", "now",
   "cases": [{"name", "messages", "add_generation_prompt",
              "expected": str | null, "raised": str | null}]}
`raised` is the message of a `raise_exception` call (expected is then null).
A case on which jinja2 itself fails otherwise (e.g. a template that needs
`tools`) is left out and reported.

To check every template llama.cpp ships (not committed; all of them agreed
when this was written):
  gen.py --templates LLAMA/models/templates --out /tmp/all
  FERROX_CHAT_TEMPLATE_REF=/tmp/all cargo test -p ferrox-core --lib chat_template

Template provenance (see templates/README.md): most are llama.cpp's copies
(LLAMA/models/templates, fetched from the HF hubs by its get_chat_template.py);
Gemma 3 and Llama 2 are the tokenizer_config.json templates of
google/gemma-3-*-it and meta-llama/Llama-2-7b-chat-hf; python_methods.jinja is
ferrox's own probe of Python string methods and `tojson`.
"""
import argparse
import json
import os
from datetime import datetime, timezone

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", ".."))
DATA = os.path.join(ROOT, "crates", "ferrox-core", "testdata", "chat_template")

# 2024-12-24 00:26:40 UTC: not the "26 Jul 2024" some templates hard-code,
# so a template that calls strftime_now is seen to.
NOW = 1_735_000_000

# bos/eos as each family's GGUF vocabulary spells them.
SPECIALS = {
    "google-gemma": ("<bos>", "<eos>"),
    "meta-llama-Llama-2": ("<s>", "</s>"),
    "meta-llama-Llama-3": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen": ("<|endoftext|>", "<|im_end|>"),
    "microsoft-Phi": ("<s>", "<|endoftext|>"),
}


def specials(stem):
    for prefix, be in SPECIALS.items():
        if stem.startswith(prefix):
            return be
    return ("<s>", "</s>")


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    ("user_only", [m("user", "Hello")]),
    ("system_multi_turn", [
        m("system", "You are a helpful assistant."),
        m("user", "Hi there"),
        m("assistant", "Hello! How can I help?"),
        m("user", "What is 2+2?"),
    ]),
    ("multi_turn_no_system", [
        m("user", "First question"),
        m("assistant", "First answer"),
        m("user", "Second question"),
        m("assistant", "Second answer"),
        m("user", "Third question"),
    ]),
    ("ends_with_assistant", [m("user", "Say hi"), m("assistant", "Hi!")]),
    ("whitespace", [
        m("system", "  Be brief.\n"),
        m("user", "  padded question \n"),
        m("assistant", "\n answer with newlines\n\n"),
        m("user", "\tnext\t"),
    ]),
    ("unicode", [
        m("system", "日本語で答えてください。"),
        m("user", "Grüß Gott — 你好，世界 🌍 ½ café\u00a0ok"),
        m("assistant", "Привет! 👋 ﬁne"),
        m("user", "🙂🙃 emoji only"),
    ]),
    ("template_syntax_in_content", [
        m("user", "{{ bos_token }} {% if x %}y{% endif %} {# c #} \\n 'quote' \"dq\""),
    ]),
    ("control_chars", [m("user", "ctrl \x01\x1f\x7f bell\x07 tab\t cr\r nul\x00 end\x1c\x1f")]),
    ("empty_content", [m("user", "")]),
    ("reasoning_in_history", [
        m("user", "Think about it"),
        m("assistant", "<think>\nsome reasoning\n</think>\n\nThe answer is 4."),
        m("user", "And again?"),
        m("assistant", "<think>\nmore reasoning\n</think>\n\nStill 4."),
    ]),
    ("non_alternating", [m("user", "one"), m("user", "two")]),
    ("system_only", [m("system", "Only a system prompt")]),
]


class AssistantTracker(jinja2.ext.Extension):
    """transformers' `{% generation %}` block, minus the index tracking: the
    body renders unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


class Raised(Exception):
    pass


def raise_exception(message):
    raise Raised(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return datetime.fromtimestamp(NOW, timezone.utc).strftime(fmt)


def environment():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--templates", default=os.path.join(DATA, "templates"))
    ap.add_argument("--out", default=DATA)
    args = ap.parse_args()
    env = environment()
    os.makedirs(args.out, exist_ok=True)
    for fname in sorted(os.listdir(args.templates)):
        if not fname.endswith(".jinja"):
            continue
        stem = fname[: -len(".jinja")]
        with open(os.path.join(args.templates, fname), encoding="utf-8") as f:
            source = f.read()
        try:
            tmpl = env.from_string(source)
        except jinja2.TemplateSyntaxError as e:
            print(f"{stem}: jinja2 cannot compile it ({e}); skipped")
            continue
        bos, eos = specials(stem)
        cases = []
        for name, messages in CONVERSATIONS:
            for agp in (False, True):
                case = {"name": f"{name}/{'gen' if agp else 'nogen'}", "messages": messages,
                        "add_generation_prompt": agp, "expected": None, "raised": None}
                try:
                    case["expected"] = tmpl.render(messages=messages, tools=None, add_generation_prompt=agp,
                                                   bos_token=bos, eos_token=eos)
                except Raised as e:
                    case["raised"] = str(e)
                except jinja2.TemplateError as e:
                    print(f"  {stem} {case['name']}: jinja2 fails ({type(e).__name__}: {e}); case left out")
                    continue
                except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
                    print(f"  {stem} {case['name']}: jinja2 fails ({type(e).__name__}: {e}); case left out")
                    continue
                cases.append(case)
        rel = os.path.relpath(os.path.join(args.templates, fname), args.out)
        out = {"template": rel, "bos_token": bos, "eos_token": eos, "now": NOW, "cases": cases}
        with open(os.path.join(args.out, stem + ".json"), "w", encoding="utf-8") as f:
            json.dump(out, f, ensure_ascii=False, indent=1)
            f.write("\n")
        n_raised = sum(c["raised"] is not None for c in cases)
        print(f"{stem}: {len(cases)} cases, {n_raised} raised")


if __name__ == "__main__":
    main()
