#!/usr/bin/env python3
"""llama.cpp's own pre-tokenizer words for the `gpt-4o` split.

Token ids show a word boundary only where the vocabulary has a merge across
it, and no vocabulary llama.cpp ships is o200k; so besides the ids
(gen.py --pre gpt-4o), the words themselves are recorded: `split_words.cpp`
calls llama.cpp's `unicode_regex_split` with the GPT4O regex exactly as
`src/llama-vocab.cpp` has it (extracted from there, and recorded on the
first line so the Rust test can check its own copy of the pattern).

Build the helper against a static llama.cpp build (any build dir made with
-DBUILD_SHARED_LIBS=OFF, e.g. the one `llama-tokenize` was built in; B below):
  g++ -std=c++17 -O1 -ILLAMA/src -ILLAMA/include \\
      -ILLAMA/ggml/include tools/reftok/split_words.cpp B/src/libllama.a \\
      B/ggml/src/libggml.a B/ggml/src/libggml-cpu.a B/ggml/src/libggml-base.a \\
      -lpthread -fopenmp -o split_words

usage: gen_split.py --split-words BIN --llama LLAMA --out OUT.jsonl
The committed crates/ferrox-core/testdata/tokenizer/gpt-4o.words.jsonl was
made with llama.cpp at ggml 0c1e570 (LLAMA), the cases of gen.py's
`--cases gpt4o` with `--inp LLAMA/models/*.inp`.
"""
import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen import CASES, GPT4O_CASES, inp_cases  # noqa: E402


def gpt4o_regex(llama: str) -> str:
    """The GPT4O case's regex literal in llama-vocab.cpp (the first one
    not commented out), C escapes undone."""
    src = open(os.path.join(llama, "src", "llama-vocab.cpp"), encoding="utf-8").read()
    at = src.index("case LLAMA_VOCAB_PRE_TYPE_GPT4O:")
    block = src[at:src.index("break;", at)]
    lits = [l.strip().rstrip(",") for l in block.splitlines() if l.strip().startswith('"')]
    if len(lits) != 1:
        raise SystemExit(f"expected one regex in the GPT4O case, found {len(lits)}")
    lit = lits[0]
    assert lit.startswith('"') and lit.endswith('"'), lit
    body = lit[1:-1]
    # Only escaped backslashes are expected (the regex's own escapes).
    if "\\" in body.replace("\\\\", "") or '"' in body:
        raise SystemExit("unexpected escapes in the GPT4O regex literal")
    return body.replace("\\\\", "\\")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split-words", required=True)
    ap.add_argument("--llama", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rx = gpt4o_regex(a.llama)
    cases = CASES + GPT4O_CASES + inp_cases(sorted(glob.glob(os.path.join(a.llama, "models", "*.inp"))))
    tmp = tempfile.mkdtemp()
    rx_path = os.path.join(tmp, "regex")
    with open(rx_path, "w", encoding="utf-8") as f:
        f.write(rx)
    with open(a.out, "w") as out:
        out.write(json.dumps({"regex": rx}) + "\n")
        for name, text, _, _ in cases:
            text_path = os.path.join(tmp, "text")
            with open(text_path, "wb") as f:
                f.write(text)
            res = subprocess.run([a.split_words, rx_path, text_path], check=True, capture_output=True)
            words = [w for w in res.stdout.decode().split("\n") if w]
            out.write(json.dumps({"name": name, "text_hex": text.hex(), "words_hex": words}) + "\n")
            print(name, len(words))


if __name__ == "__main__":
    main()
