#!/usr/bin/env python3
"""Reference token ids from llama.cpp's `llama-tokenize` for hard strings.

The ferrox tokenizer must give exactly llama.cpp's ids for the same GGUF and
text; this script records llama.cpp's answer so the Rust test
(`crates/ferrox-core/src/tokenizer/tests.rs`) can compare without llama.cpp.

Each case is tokenized through a file (`-f`, `--no-escape`) so every byte,
including invalid UTF-8, trailing newlines and the empty string, reaches the
tokenizer unchanged.

usage: gen.py --llama-tokenize BIN --model MODEL.gguf --out OUT.jsonl
             [--pre NAME] [--cases gpt4o --inp LLAMA/models/*.inp]
(MODEL may be a vocab-only copy made by vocab_only.py.) `--pre` tokenizes with
a copy of MODEL whose `tokenizer.ggml.pre` is NAME (the Rust test makes the
same copy in memory); `--cases gpt4o` adds GPT4O_CASES and every distinct
string of llama.cpp's test-tokenizer-0 inputs (`--inp`).

The committed files were made with llama.cpp at ggml 0c1e570 (LLAMA below):
  gen.py --model gemma-3-270m-q4_k_m.gguf                  --out crates/ferrox-core/testdata/tokenizer/gemma3.jsonl
  gen.py --model LLAMA/models/ggml-vocab-gpt-2.gguf        --out .../gpt-2.jsonl
  gen.py --model LLAMA/models/ggml-vocab-llama-bpe.gguf    --out .../llama-bpe.jsonl
  gen.py --model LLAMA/models/ggml-vocab-qwen2.gguf        --out .../qwen2.jsonl
and, with `llama-tokenize` built from the same tree (cmake, target llama-tokenize),
  gen.py --model crates/ferrox-core/testdata/tokenizer/ggml-vocab-gpt-2.gguf --pre gpt-4o \
         --cases gpt4o --inp LLAMA/models/*.inp --out .../gpt-4o.gpt-2.jsonl
  gen.py --model LLAMA/models/ggml-vocab-llama-bpe.gguf --pre gpt-4o \
         --cases gpt4o --inp LLAMA/models/*.inp --out .../gpt-4o.llama-bpe.jsonl
"""
import argparse
import json
import os
import subprocess
import tempfile

from gguf import GGUFReader, GGUFValueType, GGUFWriter

LONG_WORD = "Pneumonoultramicroscopicsilicovolcanoconiosis" * 8

# (name, text as bytes, add_special, parse_special)
CASES = [
    ("empty", b"", True, True),
    ("empty_no_bos", b"", False, True),
    ("hello", b"Hello world", True, True),
    ("hello_no_bos", b"Hello world", False, True),
    ("leading_space", b" Hello world", True, True),
    ("leading_spaces", b"   Hello", True, True),
    ("one_space", b" ", True, True),
    ("two_spaces", b"  ", True, True),
    ("space_runs", b"a  b   c    d     e" + b" " * 40 + b"f", True, True),
    ("trailing_spaces", b"end   ", True, True),
    ("tab", b"\t", True, True),
    ("tabs_and_newlines", b"\tindented\n\n\tline\r\n\r\n\t\tdone\n", True, True),
    ("newline_runs", b"\n\n\n\n\n\nx\n\n", True, True),
    ("mixed_ws", b" \t \n \r\n\t\t  \n", True, True),
    ("punct", b"Hello, world! How's it going? (fine) [ok] {yes}...", True, True),
    ("contractions", b"I'm sure you'll say they've I'd we're", True, True),
    ("numbers", b"3 33 333 3333 33333 1234567890 3.14159 -42 1e10", True, True),
    ("umlaut", "Äpfel über Straße naïve café".encode(), True, True),
    ("cyrillic", "нещо на Български".encode(), True, True),
    ("khmer", "កាន់តែពិសេសអាចខលចេញ".encode(), True, True),
    ("cjk", "我想在apple工作1314151天～ 日本語のテキスト 한국어 텍스트".encode(), True, True),
    ("emoji", "🚀 (normal) 😶‍🌫️ (multiple emojis concatenated) ✅ 🦙🦙 👨‍👩‍👧‍👦".encode(), True, True),
    ("rare_chars", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ∮ E⋅da = Q ⅋ ᚠᛇᚻ ꙮ \u200b\u2060\ufeff".encode(), True, True),
    ("vietnamese", "Cửa Việt".encode(), True, True),
    ("code_py", b"def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n", True, True),
    ("code_c", b"int main(void) {\n\tfor (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }\n}\n", True, True),
    ("long_word", LONG_WORD.encode(), True, True),
    ("long_digits", b"9" * 300, True, True),
    ("long_repeat", b"!!!!!!" * 50, True, True),
    ("turn_template",
     b"<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n", True, True),
    ("turn_template_no_parse",
     b"<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n", True, False),
    ("bos_in_text", b"<bos>Hello<eos>", True, True),
    ("bos_in_text_no_parse", b"<bos>Hello<eos>", False, False),
    ("special_adjacent", b"<start_of_turn><end_of_turn><start_of_turn>", False, True),
    ("special_with_spaces", b"  <start_of_turn>  user  <end_of_turn>  ", True, True),
    ("unused_token", b"<unused0> <unused99>", True, True),
    ("angle_not_special", b"<start_of_turn <end_of_turn >< b>", True, True),
    ("html", b"<html><body><div class=\"x\">hi</div></body></html>", True, True),
    ("invalid_utf8_lone_cont", b"ab\x80cd\xbf", True, True),
    ("invalid_utf8_truncated", b"x\xe2\x82", True, True),
    ("invalid_utf8_bad_lead", b"\xff\xfe\xc0\xc1 ok", True, True),
    ("invalid_utf8_overlong", b"\xe0\x80\xaf\xc3\x28", True, True),
    ("nul_and_controls", b"a\x00b\x01c\x1b[0m\x7f", True, True),
    ("escaped_space_char", "▁literal▁ ▁".encode(), True, True),
    ("byte_fallback_rare", "\U0010fffd\U000e0001 \u0378".encode(), True, True),
    ("mixed_scripts", "Hello мир 世界 🌍 مرحبا שלום नमस्ते".encode(), True, True),
    ("markdown", b"# Title\n\n* item 1\n* item 2\n\n```rust\nfn main() {}\n```\n", True, True),
    ("url", b"https://example.com/path?q=1&r=two#frag", True, True),
    ("apostrophe_start", b"' era", True, True),
    ("only_newline", b"\n", True, True),
    ("user_defined_no_parse", b"[multimodal]  x \n\n\n<mask>" + b" " * 45 + b"y" + b"\n" * 40, True, False),
    ("user_defined_parse", b"[multimodal]  x \n\n\n<mask>" + b" " * 45 + b"y" + b"\n" * 40, True, True),
    ("tabs_run", b"\t\t\t\tx\t \t", False, True),
    ("chat_two_turns",
     b"<start_of_turn>user\nHi!<end_of_turn>\n<start_of_turn>model\nHello! How can I help?<end_of_turn>\n", True, True),
]

# What the gpt-4o (o200k) split is about: letter case inside words (ASCII and
# not), contractions in both cases, digit runs, punctuation with trailing
# newlines and slashes, whitespace runs of every kind, combining marks (not
# letters to llama.cpp), scripts without case, emoji sequences.
GPT4O_CASES = [
    ("camel_case", b"HelloWorld camelCaseString XMLHttpRequest getHTTPResponseCode iOS McDonald", True, True),
    ("all_caps", b"THE QUICK BROWN FOX, JUMPED! OK? ABCdef abcDEF aBcDeF", True, True),
    ("caps_contractions", b"I'M DON'T WE'LL THEY'VE YOU'RE SHE'D IT'S it'S It'Ll i'M", True, True),
    ("contraction_edges", "'s 'S ''s x'' 's' rock'n'roll o'clock y'all don\u2019t".encode(), True, True),
    ("curly_apostrophe", "don\u2019t it\u2019s \u2018quoted\u2019".encode(), True, True),
    ("nonascii_case", "ÀÉÎÕÜ àéîõü Àbc aÉc ÉCOLE École STRASSE Straße ΣΊΣΥΦΟΣ Σίσυφος İstanbul".encode(), True, True),
    ("nonascii_after_ascii_caps", "ABCé ABCÉ abcÉ Éabc ÉABC ñAndú".encode(), True, True),
    ("nonascii_as_upper", "ÉTat ÀLa ÑAndú ÖsTeRrEiCh çA ßBc éÉa ÆGIS ǅemal".encode(), True, True),
    ("combining_marks", "e\u0301 cafe\u0301 a\u0300\u0301b E\u0301COLE \u0301start n\u0303o".encode(), True, True),
    ("devanagari", "नमस्ते दुनिया हिन्दी".encode(), True, True),
    ("thai_bengali", "สวัสดีครับ বাংলা ভাষা".encode(), True, True),
    ("arabic_hebrew", "مرحبا بالعالم ١٢٣٤٥ שלום עולם".encode(), True, True),
    ("cjk_mixed", "東京タワーは333mです。漢字かなカナ混じり文 한국어입니다 ABC漢字abc".encode(), True, True),
    ("digits", b"1 12 123 1234 12345 123456 1234567 0.5 1,000,000 3x4 x86_64 v1.2.3 2024-01-01", True, True),
    ("unicode_digits", "١٢٣٤ ½ ¾ ²³ ⅷ 𝟙𝟚𝟛 ①②③ ٣٫١٤".encode(), True, True),
    ("punct_newline_tail", b"end.\nnext!\n\n\nmore?\r\nok;/\n//\n/x */\n", True, True),
    ("slash_runs", b"a/b //c ///d http://x.y/z/ ../..//", True, True),
    ("ws_kinds", "a\u00a0b\u3000c\u2028d\u2003e\u0085f\u200bg\u00a0\u00a0h".encode(), True, True),
    ("ws_runs_newlines", b"a \n b  \n\n c   \r\n\r\n   d\t\n\t e \n", True, True),
    ("ws_before_letter", "x  y   Z    \u00e9  1  !".encode(), True, True),
    ("leading_trailing_ws", b"   \n\n  text  \n\n   ", True, True),
    ("ascii_controls", b"a\x1cb\x1dc\x1ed\x1fe\x0bf\x0cg", True, True),
    ("emoji_sequences", "👍🏽 👨‍👩‍👧 🇺🇸🇯🇵 1️⃣ ❤️ 🏳️‍🌈 hi🙂there".encode(), True, True),
    ("symbols", "price: $5 + €3 = ¥8 ≈ £7 ± 0.1 © ™ → ⇒ ∞ ∑ √".encode(), True, True),
    ("code_mixed", b"fn main() {\n    let xMax = foo_bar(1234, \"It's\");\n    // TODO: fixMe\n}\n", True, True),
    ("long_caps", b"A" * 600 + b"b", True, True),
    ("long_nonascii", ("é" * 500 + "É" * 300).encode(), True, True),
    ("harmony_markup", b"<|start|>user<|message|>Hi<|end|><|start|>assistant<|channel|>final<|message|>", True, True),
]


def inp_cases(paths: list[str]) -> list:
    """Distinct strings of llama.cpp's `.inp` files, in first-seen order."""
    seen = []
    for path in paths:
        with open(path, "rb") as f:
            for text in f.read().split(b"\n__ggml_vocab_test__\n"):
                if text not in seen:
                    seen.append(text)
    return [(f"inp_{i:02}", t, False, False) for i, t in enumerate(seen)]


def retag(src: str, dst: str, pre: str) -> None:
    """A copy of `src`'s metadata with `tokenizer.ggml.pre` set to `pre`."""
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "tokenizer.ggml.pre":
            w.add_key_value(key, pre, GGUFValueType.STRING)
            continue
        main_type = f.types[0]
        sub_type = f.types[1] if main_type == GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), main_type, sub_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def run(bin_path: str, model: str, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
    with tempfile.NamedTemporaryFile(delete=False) as f:
        f.write(text)
        path = f.name
    try:
        cmd = [bin_path, "-m", model, "-f", path, "--no-escape", "--ids", "--log-disable"]
        if not add_special:
            cmd.append("--no-bos")
        if not parse_special:
            cmd.append("--no-parse-special")
        out = subprocess.run(cmd, check=True, capture_output=True).stdout.decode()
    finally:
        os.unlink(path)
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-tokenize", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--pre")
    ap.add_argument("--cases", choices=["default", "gpt4o"], default="default")
    ap.add_argument("--inp", nargs="*", default=[])
    a = ap.parse_args()
    model = a.model
    if a.pre:
        model = os.path.join(tempfile.mkdtemp(), "retagged.gguf")
        retag(a.model, model, a.pre)
    cases = CASES
    if a.cases == "gpt4o":
        cases = CASES + GPT4O_CASES + inp_cases(a.inp)
    with open(a.out, "w") as out:
        for name, text, add_special, parse_special in cases:
            ids = run(a.llama_tokenize, model, text, add_special, parse_special)
            out.write(json.dumps({
                "name": name,
                "text_hex": text.hex(),
                "add_special": add_special,
                "parse_special": parse_special,
                "ids": ids,
            }, ensure_ascii=False) + "\n")
            print(name, len(ids))


if __name__ == "__main__":
    main()
