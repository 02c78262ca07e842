#!/usr/bin/env python3
"""llama.cpp's forward-pass answers (greedy tokens and top-k logits) as test data.

ferrox's forward pass must reproduce llama.cpp's logits for the same GGUF and
token ids; this script records llama.cpp's answer through the `refllama`
harness (refllama.cpp, built here with one g++ line against a llama.cpp
build) so the Rust tests can compare without llama.cpp. See README.md.

usage:
  gen.py [real]               Gemma 3 270M Q4_K_M (8+ prompts) and ferrox's own
                              q8_0 / q4_0 re-quantizations of it (3 prompts each)
  gen.py requant              only the q8_0 / q4_0 re-quantizations (after ferrox's
                              quantizer changes the files' bytes)
  gen.py norepack             the Gemma files again through llama.cpp's --no-repack path
  gen.py tiny DIR             every DIR/*.gguf with --all-logits over TINY_TOKENS
         [--out-dir D] [--tokens 1,2,3] [--n-predict N]
  gen.py quant [WORKDIR]      ferrox's F16 quant-ref model, llama-quantize'd to each
                              of QUANT_KINDS: the files and llama.cpp's top-k logits
                              at every prompt position and greedy step

Every case is run twice and the two outputs must be byte-identical; a step's
token must be the argmax of its recorded top-k; steps whose top-2 logits are
within NEAR_TIE are listed in the output (ferrox may pick the other one).
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CACHE = os.path.expanduser("~/.cache/ferrox")
LLAMA = os.environ.get(
    "LLAMA_SRC", os.path.join(CACHE, "ref/llama_cpp_python-0.3.36/vendor/llama.cpp"))
LLAMA_BIN = os.environ.get("LLAMA_BIN", os.path.join(CACHE, "llama.cpp-build/bin"))
LLAMA_VERSION = "llama.cpp vendored in llama_cpp_python 0.3.36 (ggml 0c1e570), CPU build, GGML_NATIVE"
HARNESS = os.path.join(CACHE, "refllama", "refllama")
MODELS = os.path.join(CACHE, "models")
REAL_MODEL = os.path.join(MODELS, "gemma-3-270m-q4_k_m.gguf")
OUT_DIR = os.path.join(ROOT, "crates", "ferrox-core", "testdata", "llama_ref")

N_PREDICT = 48
TOP_K = 10
CTX = 2048
THREADS = 2
NEAR_TIE = 0.1

# Fixed ids for tiny models, taken modulo the model's vocabulary size so the
# same list works on any GGUF; no BOS is added (--tokens is used verbatim).
# Equal to `ferrox_core::testing::tiny_tokens()` (the tests check the file's list).
TINY_TOKENS = [1, 259, 260, 261, 300, 45, 260, 262, 263, 120, 259, 260, 264]
TINY_N_PREDICT = 8

# The per-kind reference (`quant` mode): ferrox's F16 `quant_ref_model`
# (every row 256 wide), quantized by llama.cpp's own llama-quantize. The F16
# file is not committed (the test rewrites it and checks its SHA-256); the
# quantized files are, next to their JSON.
QUANT_DIR = os.path.join(OUT_DIR, "quant")
QUANT_KINDS = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0"]
QUANT_N_PREDICT = 16
QUANT_TOP_K = 16
# BOS, a 31-token walk over the vocabulary, then the first 16 again (so
# attention has repeats to find): 48 positions.
_walk = [3 + (i * 97 + 11) % 317 for i in range(31)]
QUANT_TOKENS = [1] + _walk + [1] + _walk[:15]

LONG_PARAGRAPH = (
    "The history of the printing press begins long before Johannes Gutenberg. Woodblock "
    "printing was practised in China by the seventh century, and movable type made of baked "
    "clay was described by Shen Kuo in the eleventh. What changed in Mainz around 1450 was not "
    "a single idea but a system: a hand mould that cast thousands of identical metal letters, "
    "an oil-based ink that clung to metal, and a screw press adapted from the wine and paper "
    "trades. Within fifty years more than a thousand presses were working across Europe, and "
    "the price of a book fell so far that a clerk could own several. Historians still argue "
    "about the consequences. Some credit the press with the Reformation, the scientific "
    "revolution and the rise of national languages; others point out that literacy grew "
    "slowly, that manuscripts were copied for another century, and that the most printed "
    "books were calendars, prayers and school grammars. Either way,"
)

SWA_TEXT = (
    "Chapter one. The village sat where the river bent twice before reaching the sea, and its "
    "people measured the year by the water. In spring the snowmelt came down brown and fast, "
    "carrying branches, fence posts and once, memorably, a wooden bathtub that the miller's "
    "children rode for half a mile before it sank. In summer the river thinned to a string of "
    "pools where trout hung motionless in the shade of the alders. Autumn brought the salmon, "
    "and with them the herons, the otters and the bailiff, a thin man named Aldous Pell who had "
    "never been seen to smile. Winter froze the shallows into plates of grey glass.\n\n"
    "Chapter two. Mara was eleven the year the bridge fell. She had crossed it that morning with "
    "a basket of eggs for her aunt, counting the planks as she always did: forty-one, with the "
    "twenty-third loose and the thirty-eighth patched with tin. By noon the rain had been falling "
    "for three days, and by evening the bridge was gone, taken so cleanly that only the iron pins "
    "remained in the stone piers, bent like fingers pointing downstream. The village council met "
    "in the school room because the inn's roof leaked. They argued until midnight about timber, "
    "about money, about whose cousin in the city might lend a barge.\n\n"
    "Chapter three. The engineer arrived in March with a leather case of drawings and a cough "
    "that never quite left him. He walked the banks for a week, throwing sticks into the current "
    "and timing them with a brass watch, sketching the piers from every side. He asked the old "
    "men where the ice jammed in hard winters and the women where the washing stones had been "
    "when they were girls. Mara followed him at a distance, then closer, until one afternoon he "
    "handed her the watch and asked her to call out the seconds. She learned that a river is "
    "faster in the middle than at the edges, faster at the top than at the bottom, and that the "
    "old bridge had failed because its piers stood exactly where the water most wanted to go.\n\n"
    "Chapter four. The new bridge took two summers to build. It had a single arch, wider than "
    "anyone believed stone could span, and its footings were set back into the banks so the "
    "river could pass untouched. On the day it opened the miller's children, older now, walked "
    "across it holding the remains of the bathtub above their heads like a trophy. Aldous Pell "
    "was seen, briefly, to smile. And Mara, standing in the middle of the arch with the brass "
    "watch in her pocket, decided"
)

# (name, prompt) for the real model; the first three also run on the re-quantized copies.
REAL_CASES = [
    ("english", "The old lighthouse keeper climbed the stairs every evening, and"),
    ("chat_turn",
     "<start_of_turn>user\nWrite a haiku about the sea.<end_of_turn>\n<start_of_turn>model\n"),
    ("code", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("question", "Question: Why is the sky blue?\nAnswer:"),
    ("list", "Things to pack for a camping trip:\n1. Tent\n2. Sleeping bag\n3."),
    ("cjk", "東京は日本の首都です。東京の人口は"),
    ("unicode_emoji", "Weather 🌦️ today: 23°C — naïve café ☕, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 ✓ 👨‍👩‍👧 and"),
    ("long_paragraph", LONG_PARAGRAPH),
    # Longer than Gemma 3's 512-token sliding window and llama.cpp's 512-token
    # ubatch: pins the SWA mask and a prompt decoded in two physical batches.
    ("past_sliding_window", SWA_TEXT),
]
REQUANT_CASES = 3
REQUANT_KINDS = ["q8_0", "q4_0"]


def build():
    os.makedirs(os.path.dirname(HARNESS), exist_ok=True)
    cmd = ["g++", "-std=c++17", "-O2", "-Wall", "-Wextra",
           "-I" + os.path.join(LLAMA, "include"), "-I" + os.path.join(LLAMA, "ggml", "include"),
           os.path.join(ROOT, "tools", "refllama", "refllama.cpp"), "-o", HARNESS,
           "-L" + LLAMA_BIN, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + LLAMA_BIN]
    subprocess.run(cmd, check=True)


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# Extra harness flags for every run (`norepack` mode sets ["--no-repack"]).
HARNESS_EXTRA = []


def harness(model, args):
    """Runs the harness twice; its stdout must not change between runs."""
    cmd = [HARNESS, model, "--ctx", str(CTX), "--threads", str(THREADS)] + args + HARNESS_EXTRA
    outs = [subprocess.run(cmd, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL).stdout
            for _ in range(2)]
    if outs[0] != outs[1]:
        a = json.loads(outs[0])
        b = json.loads(outs[1])
        raise SystemExit(f"NONDETERMINISTIC: {model} {args}: two runs differ "
                         f"(tokens equal: {[s['token'] for s in a['steps']] == [s['token'] for s in b['steps']]})")
    return json.loads(outs[0])


def check_and_ties(name, run):
    """Asserts each step's token is its top-1 (ties to the lowest id); returns near ties."""
    ties = []
    for i, step in enumerate(run["steps"]):
        top = step["top"]
        assert step["pos"] == len(run["prompt_tokens"]) - 1 + i, (name, i, step["pos"])
        assert all(top[j][1] >= top[j + 1][1] for j in range(len(top) - 1)), (name, i, "top not sorted")
        best = max(v for _, v in top)
        lowest = min(t for t, v in top if v == best)
        assert step["token"] == top[0][0] == lowest, (name, i, step["token"], top[:2])
        if len(top) > 1 and top[0][1] - top[1][1] < NEAR_TIE:
            ties.append({"case": name, "step": i, "pos": step["pos"],
                         "ids": [top[0][0], top[1][0]], "gap": round(top[0][1] - top[1][1], 7)})
    return ties


def common_settings(runs):
    """The settings every case ran under; they must agree (the log may differ)."""
    strip = [{k: v for k, v in r["settings"].items() if k != "log"} for r in runs]
    for s in strip[1:]:
        assert s == strip[0], ("settings differ between cases", s, strip[0])
    return runs[0]["settings"]


def ferrox_commit():
    return subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], check=True,
                          stdout=subprocess.PIPE, text=True).stdout.strip()


def thread_invariance(model, cases):
    """Per case, whether 1 thread gives the same bits as THREADS (informational).

    llama.cpp's CPU flash attention splits the KV sequence over threads once
    it holds >= 512 cells, so long contexts are expected to differ in the last bits.
    """
    return {name: same_with_one_thread(model, prompt) for name, prompt in cases}


def same_with_one_thread(model, prompt):
    cmd = [HARNESS, model, "--ctx", str(CTX), "--prompt", prompt, "--n-predict", "8",
           "--top-k", str(TOP_K)]
    one, many = (subprocess.run(cmd + ["--threads", t], check=True, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL).stdout for t in ("1", str(THREADS)))
    strip = lambda b: [(s["token"], s["top"]) for s in json.loads(b)["steps"]]
    return strip(one) == strip(many)


def write_json(path, doc, line_keys=("steps", "all_logits")):
    """JSON with one step / one logits row per line: diffable, still plain JSON."""
    def dump(v, indent):
        pad = " " * indent
        if isinstance(v, dict):
            items = []
            for k, x in v.items():
                if k in line_keys and isinstance(x, list):
                    rows = (",\n" + pad + "    ").join(json.dumps(r, ensure_ascii=False) for r in x)
                    items.append(f'{pad}  {json.dumps(k)}: [\n{pad}    {rows}\n{pad}  ]'
                                 if x else f'{pad}  {json.dumps(k)}: []')
                else:
                    items.append(f"{pad}  {json.dumps(k)}: {dump(x, indent + 2).lstrip()}")
            return pad + "{\n" + ",\n".join(items) + "\n" + pad + "}"
        if isinstance(v, list) and v and isinstance(v[0], dict):
            return pad + "[\n" + ",\n".join(dump(x, indent + 2) for x in v) + "\n" + pad + "]"
        return pad + json.dumps(v, ensure_ascii=False)

    os.makedirs(os.path.dirname(path), exist_ok=True)
    text = dump(doc, 0) + "\n"
    assert json.loads(text) == doc
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    shown = os.path.relpath(path, ROOT) if path.startswith(ROOT + os.sep) else path
    print(f"wrote {shown} ({len(text)} bytes)")


def case_doc(name, run):
    return {"name": name, "prompt": run["prompt"], "prompt_tokens": run["prompt_tokens"],
            "completion": run["completion"], "steps": run["steps"]}


def gen_model(model, cases, out, extra):
    runs, ties = [], []
    for name, prompt in cases:
        run = harness(model, ["--prompt", prompt, "--n-predict", str(N_PREDICT), "--top-k", str(TOP_K)])
        ties += check_and_ties(name, run)
        runs.append((name, run))
        print(f"  {name}: {len(run['prompt_tokens'])} prompt tokens -> {run['completion'][:60]!r}")
    doc = {
        "generator": "tools/refllama/gen.py (see tools/refllama/README.md)",
        "llama_cpp": LLAMA_VERSION,
        "model": os.path.basename(model),
        "model_sha256": sha256(model),
        **extra,
        "n_predict": N_PREDICT,
        "top_k": TOP_K,
        "deterministic": True,
        "thread_invariant": thread_invariance(model, [cases[0], max(cases, key=lambda c: len(c[1]))]),
        "settings": common_settings([r for _, r in runs]),
        "near_tie_threshold": NEAR_TIE,
        "near_ties": ties,
        "cases": [case_doc(n, r) for n, r in runs],
    }
    for _, r in runs:
        assert r["model_sha256"] == doc["model_sha256"]
    return doc


def norepack():
    """The same cases through llama.cpp's canonical CPU path (`--no-repack`:
    weights read as stored, no interleaved repacking). Its logits differ from
    the repacked path's by up to ~1.7 on this model, and the greedy paths of
    the two diverge on some prompts: the tests treat a step where the two
    llama.cpp paths disagree as having no single right answer."""
    HARNESS_EXTRA.append("--no-repack")
    print(f"{os.path.basename(REAL_MODEL)} (--no-repack):")
    doc = gen_model(REAL_MODEL, REAL_CASES, None, {"llama_cpp_flags": "--no-repack"})
    write_json(os.path.join(OUT_DIR, "gemma3-270m-q4_k_m.norepack.json"), doc)
    path = os.path.join(MODELS, "gemma-3-270m-q4_0.ferrox.gguf")
    if os.path.exists(path):
        print(f"{os.path.basename(path)} (--no-repack):")
        ref = json.load(open(os.path.join(OUT_DIR, "gemma3-270m-q4_0.json")))
        extra = {k: ref[k] for k in ("source_model", "source_model_sha256", "made_by", "ferrox_commit")}
        extra["llama_cpp_flags"] = "--no-repack"
        doc = gen_model(path, REAL_CASES[:REQUANT_CASES], None, extra)
        write_json(os.path.join(OUT_DIR, "gemma3-270m-q4_0.norepack.json"), doc)


def real():
    print(f"{os.path.basename(REAL_MODEL)}:")
    doc = gen_model(REAL_MODEL, REAL_CASES, None, {})
    write_json(os.path.join(OUT_DIR, "gemma3-270m-q4_k_m.json"), doc)
    requant()


def requant():
    """The q8_0 / q4_0 files `ferrox quantize --pure --allow-requantize` makes
    from the real model, and llama.cpp's answers on them (the q4_0 one also
    through --no-repack)."""
    ferrox = os.path.join(os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target")),
                          "release", "ferrox")
    subprocess.run(["cargo", "build", "--release", "-p", "ferrox"], cwd=ROOT, check=True)
    commit = ferrox_commit()
    for kind in REQUANT_KINDS:
        path = os.path.join(MODELS, f"gemma-3-270m-{kind}.ferrox.gguf")
        cmd = [ferrox, "quantize", "--force", "--pure", "--allow-requantize", REAL_MODEL, path, kind]
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(f"{os.path.basename(path)}:")
        made_by = {"source_model": os.path.basename(REAL_MODEL),
                   "source_model_sha256": sha256(REAL_MODEL),
                   "made_by": f"ferrox quantize --pure --allow-requantize {os.path.basename(REAL_MODEL)} "
                              f"{os.path.basename(path)} {kind}",
                   "ferrox_commit": commit}
        doc = gen_model(path, REAL_CASES[:REQUANT_CASES], None, made_by)
        write_json(os.path.join(OUT_DIR, f"gemma3-270m-{kind}.json"), doc)
        if kind == "q4_0":
            print(f"{os.path.basename(path)} (--no-repack):")
            HARNESS_EXTRA.append("--no-repack")
            doc = gen_model(path, REAL_CASES[:REQUANT_CASES], None, {**made_by, "llama_cpp_flags": "--no-repack"})
            HARNESS_EXTRA.remove("--no-repack")
            write_json(os.path.join(OUT_DIR, "gemma3-270m-q4_0.norepack.json"), doc)


def tiny(directory, out_dir, tokens, n_predict):
    models = sorted(f for f in os.listdir(directory) if f.endswith(".gguf"))
    if not models:
        raise SystemExit(f"no *.gguf in {directory}")
    for f in models:
        model = os.path.join(directory, f)
        probe = harness(model, ["--tokens", "0", "--n-predict", "0"])
        ids = [t % probe["n_vocab"] for t in tokens]
        run = harness(model, ["--tokens", ",".join(map(str, ids)), "--n-predict", str(n_predict),
                              "--top-k", str(TOP_K), "--all-logits"])
        name = f[:-len(".gguf")]
        ties = check_and_ties(name, run)
        # The last prompt position's logits are step 0's; the two must agree.
        last = run["all_logits"][-1]
        for t, v in run["steps"][0]["top"]:
            assert last[t] == v, (name, t, last[t], v)
        assert len(run["all_logits"]) == len(ids)
        assert all(len(r) == run["n_vocab"] for r in run["all_logits"])
        doc = {
            "generator": "tools/refllama/gen.py tiny (see tools/refllama/README.md)",
            "llama_cpp": LLAMA_VERSION,
            "model": f,
            "model_sha256": run["model_sha256"],
            "n_vocab": run["n_vocab"],
            "n_predict": n_predict,
            "top_k": TOP_K,
            "deterministic": True,
            "settings": run["settings"],
            "near_tie_threshold": NEAR_TIE,
            "near_ties": ties,
            "prompt_tokens": run["prompt_tokens"],
            "steps": run["steps"],
            "all_logits": run["all_logits"],
        }
        write_json(os.path.join(out_dir, name + ".json"), doc)


def top_k(row, k):
    """The k largest logits of a row as [id, logit], descending, ties to the lower id."""
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))[:k]
    return [[i, row[i]] for i in order]


def quant(work):
    os.makedirs(work, exist_ok=True)
    os.makedirs(QUANT_DIR, exist_ok=True)
    subprocess.run(["cargo", "run", "--release", "-q", "-p", "ferrox-core", "--example", "write_tiny_models",
                    "--", "--quant-ref", work], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    src = os.path.join(work, "quant-ref-f16.gguf")
    src_sha = sha256(src)
    quantize = os.path.join(LLAMA_BIN, "llama-quantize")
    for kind in ["F16"] + QUANT_KINDS:
        name = f"llama-{kind.lower()}"
        if kind == "F16":
            model, made_by = src, ("ferrox_core::testing::quant_ref_model(QUANT_REF_SEED) "
                                   "(crates/ferrox-core/examples/write_tiny_models.rs --quant-ref)")
        else:
            model = os.path.join(QUANT_DIR, name + ".gguf")
            subprocess.run([quantize, src, model, kind], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            made_by = f"llama-quantize quant-ref-f16.gguf {name}.gguf {kind}"
        run = harness(model, ["--tokens", ",".join(map(str, QUANT_TOKENS)),
                              "--n-predict", str(QUANT_N_PREDICT), "--top-k", str(QUANT_TOP_K),
                              "--all-logits"])
        ties = check_and_ties(name, run)
        rows = run["all_logits"]
        assert len(rows) == len(QUANT_TOKENS) and all(len(r) == run["n_vocab"] for r in rows)
        tops = [top_k(r, QUANT_TOP_K) for r in rows]
        assert tops[-1] == run["steps"][0]["top"], (name, tops[-1][:2], run["steps"][0]["top"][:2])
        stds = []
        for r in rows:
            m = sum(r) / len(r)
            stds.append((sum((x - m) ** 2 for x in r) / len(r)) ** 0.5)
        margins = [t[0][1] - t[1][1] for t in tops] + [s["top"][0][1] - s["top"][1][1] for s in run["steps"][1:]]
        doc = {
            "generator": "tools/refllama/gen.py quant (see tools/refllama/README.md)",
            "llama_cpp": LLAMA_VERSION,
            "kind": kind,
            "model": os.path.basename(model),
            "model_sha256": run["model_sha256"],
            "made_by": made_by,
            "source_model_sha256": src_sha,
            "n_vocab": run["n_vocab"],
            "n_predict": QUANT_N_PREDICT,
            "top_k": QUANT_TOP_K,
            "deterministic": True,
            "settings": run["settings"],
            "logit_std_min_max": [round(min(stds), 3), round(max(stds), 3)],
            "top2_margin_min_median": [round(min(margins), 5), round(sorted(margins)[len(margins) // 2], 3)],
            "near_tie_threshold": NEAR_TIE,
            "near_ties": ties,
            "prompt_tokens": run["prompt_tokens"],
            "prompt_top": tops,
            "steps": run["steps"],
        }
        write_json(os.path.join(QUANT_DIR, name + ".json"), doc, line_keys=("steps", "prompt_top"))
        print(f"  {kind}: logit std {doc['logit_std_min_max']}, top-2 margin min/median "
              f"{doc['top2_margin_min_median']}, {len(ties)} near ties")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", nargs="?", default="real", choices=["real", "requant", "tiny", "norepack", "quant"])
    ap.add_argument("dir", nargs="?", help="tiny: the folder of *.gguf files; quant: a scratch folder "
                    "for the F16 file (default ~/.cache/ferrox/quant-ref)")
    ap.add_argument("--out-dir", default=os.path.join(OUT_DIR, "tiny"), help="tiny: where the JSON goes")
    ap.add_argument("--tokens", help="tiny: comma-separated ids instead of TINY_TOKENS")
    ap.add_argument("--n-predict", type=int, default=TINY_N_PREDICT, help="tiny: greedy steps")
    a = ap.parse_args()
    build()
    if a.mode == "real":
        real()
    elif a.mode == "requant":
        requant()
    elif a.mode == "norepack":
        norepack()
    elif a.mode == "quant":
        quant(a.dir or os.path.join(CACHE, "quant-ref"))
    else:
        if not a.dir:
            ap.error("tiny needs DIR")
        tokens = [int(t) for t in a.tokens.split(",")] if a.tokens else TINY_TOKENS
        tiny(a.dir, a.out_dir, tokens, a.n_predict)


if __name__ == "__main__":
    sys.exit(main())
