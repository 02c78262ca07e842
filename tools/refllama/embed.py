#!/usr/bin/env python3
"""llama.cpp's embeddings of fixed prompts as test data.

ferrox's embeddings (the hidden state after the output norm, pooled) must
point the way llama.cpp's do for the same GGUF and text; this script records
`llama-embedding`'s answer for each pooling mode, L2-normalized
(`--embd-normalize 2`, what OpenAI returns), so the Rust test
(`crates/ferrox-core/tests/llama_embed.rs`) compares without llama.cpp.
See README.md.

usage:
  embed.py [--no-repack]    writes testdata/llama_ref/gemma3-270m-q4_k_m.embed[.norepack].json

Needs `llama-embedding` in LLAMA_BIN (`cmake --build LLAMA_BUILD --target
llama-embedding`). Each prompt runs alone (one llama-embedding call per prompt
and pooling mode), twice: the two outputs must be byte-identical.
"""
import argparse
import json
import os
import subprocess

import gen

EMBED_BIN = os.path.join(gen.LLAMA_BIN, "llama-embedding")
CTX = 2048
THREADS = 2
# A separator no prompt holds, so prompts keep their newlines.
SEP = "<#ferrox-sep#>"
# Digits kept per value (values of a unit vector of 640 are ~0.04).
DIGITS = 6

# (name, prompt). Every pooled mode runs all of them; `none` (one vector per
# token) only the first, to keep the file small.
CASES = [
    ("english", "The old lighthouse keeper climbed the stairs every evening, and"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("question", "Question: Why is the sky blue?\nAnswer:"),
    ("cjk", "東京は日本の首都です。東京の人口は"),
    ("long_paragraph", gen.LONG_PARAGRAPH),
]
POOLINGS = ["mean", "cls", "last", "none"]
NONE_CASES = 1


def embed(model, prompt, pooling, extra):
    cmd = [EMBED_BIN, "-m", model, "-c", str(CTX), "-t", str(THREADS), "--pooling", pooling,
           "--embd-normalize", "2", "--embd-output-format", "json", "--embd-separator", SEP,
           "-p", prompt] + extra
    outs = [subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
            for _ in range(2)]
    if outs[0] != outs[1]:
        raise SystemExit(f"NONDETERMINISTIC: {pooling} {prompt[:30]!r}: two runs differ")
    text = outs[0].decode()
    doc = json.loads(text[text.index("{"):text.rindex("}") + 1])
    rows = [d["embedding"] for d in sorted(doc["data"], key=lambda d: d["index"])]
    for r in rows:
        norm = sum(x * x for x in r) ** 0.5
        assert abs(norm - 1.0) < 1e-4, (pooling, prompt[:30], norm)
    return [[float(f"{x:.{DIGITS}g}") for x in r] for r in rows]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--no-repack", action="store_true", help="llama.cpp's canonical CPU path")
    a = ap.parse_args()
    extra = ["--no-repack"] if a.no_repack else []
    model = gen.REAL_MODEL
    cases = []
    for i, (name, prompt) in enumerate(CASES):
        case = {"name": name, "prompt": prompt}
        for pooling in POOLINGS:
            if pooling == "none" and i >= NONE_CASES:
                continue
            rows = embed(model, prompt, pooling, extra)
            if pooling == "none":
                case["none"] = rows
                case["n_tokens"] = len(rows)
            else:
                assert len(rows) == 1, (name, pooling, len(rows))
                case[pooling] = rows[0]
        print(f"  {name}: {', '.join(p for p in POOLINGS if p in case)}")
        cases.append(case)
    doc = {
        "generator": "tools/refllama/embed.py (see tools/refllama/README.md)",
        "llama_cpp": gen.LLAMA_VERSION,
        "model": os.path.basename(model),
        "model_sha256": gen.sha256(model),
        "command": f"llama-embedding -m MODEL -c {CTX} -t {THREADS} --pooling P --embd-normalize 2 "
                   f"--embd-output-format json -p PROMPT" + "".join(" " + e for e in extra),
        "normalized": "L2 (--embd-normalize 2)",
        "digits": DIGITS,
        "cases": cases,
    }
    suffix = ".norepack" if a.no_repack else ""
    gen.write_json(os.path.join(gen.OUT_DIR, f"gemma3-270m-q4_k_m.embed{suffix}.json"), doc,
                   line_keys=("none",))


if __name__ == "__main__":
    main()
