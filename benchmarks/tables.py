#!/usr/bin/env python3
"""Generates the tables of benchmarks/*.md from benchmarks/results/*.jsonl (python3 stdlib only).

A table lives in a .md file between `<!-- table:NAME -->` and `<!-- /table -->`; everything
between the markers is this script's. Each table takes the lines its spec selects (a results
file and field values), keeps the newest line per row and reference (by date, then file order:
a new run of the same script replaces the figures it measured again), and says where the figures
were measured and the one command that reproduces them from main.

  python3 benchmarks/tables.py            rewrite the tables in place
  python3 benchmarks/tables.py --check    exit 1 when a table differs from what the data gives,
                                          or a results line lacks `commit` or `machine`
  python3 benchmarks/tables.py --ranges   the ratio ranges of each comparison table (what the
                                          README quotes)
"""
import glob
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")

AMX = "llama.cpp default (repack)"
PLAIN = "llama.cpp --repack 0"
CUDA = "llama.cpp CUDA (-ngl 99 -fa 1)"


def load(name):
    out = []
    path = os.path.join(RESULTS, name)
    for i, line in enumerate(open(path)):
        if line.strip():
            d = json.loads(line)
            d["_order"] = i
            out.append(d)
    return out


def select(lines, where):
    return [l for l in lines if all(l.get(k) == v for k, v in where.items())]


def newest(lines, key):
    """The newest line per key (date, then position in the file)."""
    best = {}
    for l in lines:
        k = key(l)
        if k not in best or (l["date"], l["_order"]) >= (best[k]["date"], best[k]["_order"]):
            best[k] = l
    return best


def num(x, sd=None):
    if x is None:
        return ""
    if isinstance(x, float) and x >= 10000:
        s = f"{x:,.0f}".replace(",", " ")
    elif isinstance(x, float):
        s = f"{x:.1f}"
    else:
        s = str(x)
    if sd:
        s += f" ± {sd:.0f}" if x >= 10000 else f" ± {sd:.1f}"
    return s


def caption(lines, command, note=""):
    seen = []
    for l in sorted(lines, key=lambda l: (l["date"], l["commit"])):
        t = (l["machine"], l["commit"], l["date"])
        if t not in seen:
            seen.append(t)
    where = "; ".join(f"`{m}` at commit `{c}` ({d})" for m, c, d in seen)
    notes = sorted({l["commit_note"] for l in lines if l.get("commit_note")})
    out = f"Measured on {where}."
    if notes:
        out += " " + " ".join(f"({n})" for n in notes)
    return out + f"\nReproduce from main: `{command}`" + (f" {note}" if note else "") + "\n"


def compare(spec):
    """Rows (kind, what); per reference its figure, then ferrox, then the ratios."""
    lines = select(load(spec["file"]), spec["where"])
    if "whats" in spec:
        keep = set(spec["whats"]) | {"peak_rss:" + w for w in spec["whats"]}
        lines = [l for l in lines if l["what"] in keep]
    refs = spec["refs"]
    cells = newest([l for l in lines if l.get("ref") in refs or "rss" in l["what"]],
                   lambda l: (l.get("model", ""), l["kind"], l["what"], l.get("ref")))
    rows = []
    for l in sorted(lines, key=lambda l: l["_order"]):
        k = (l.get("model", ""), l["kind"], l["what"])
        if "rss" not in l["what"] and k not in rows:
            rows.append(k)
    multi_model = spec.get("model_col", False)
    show_commit = len({c["commit"] for c in cells.values()}) > 1
    head = (["model"] if multi_model else []) + ["kind"]
    head += ["size MiB"] if spec.get("size") else []
    head += ["test"] + [f"{spec['ref_names'][r]} {spec['unit']}" for r in refs]
    head += [f"ferrox {spec['unit']}"] + [f"vs {spec['ref_short'][r]}" for r in refs]
    head += ["ferrox peak RSS MiB"] if spec.get("rss") else []
    # Decode's weight reads against the read bandwidth measured in the same run (issue 36's
    # bar): every tensor byte is read once a token (Gemma's head is the tied embedding).
    bw = {l["commit"]: l for l in load(spec["file"]) if l["what"] == "read_bw"
          and all(l.get(k) == v for k, v in spec["where"].items())} if spec.get("bw") else {}
    head += ["ferrox reads GB/s (% of read BW)"] if bw else []
    head += ["commit"] if show_commit else []
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join("---" if h in ("model", "kind", "test", "commit") else "---:" for h in head) + "|"]
    used = []
    ratios = {}
    for model, kind, what in rows:
        got = [cells.get((model, kind, what, r)) for r in refs]
        f = next((g for g in got if g), None)
        if not f:
            continue
        used += [g for g in got if g]
        row = ([model.split(" (")[0]] if multi_model else []) + [kind]
        row += [str(f.get("size_mib", ""))] if spec.get("size") else []
        row += [what] + [num(g["ref_figure"], g.get("ref_sd")) if g else "" for g in got]
        row += [num(f["figure"], f.get("sd"))]
        group = "F16" if kind in ("F16", "BF16", "F32") else "quantized"
        qs = []
        for r, g in zip(refs, got):
            if g:
                q = g["figure"] / g["ref_figure"]
                qs.append(q)
                ratios.setdefault((r, what, group), []).append(q)
                row.append(f"{q:.2f}")
            else:
                row.append("")
        if len(qs) > 1:
            ratios.setdefault(("the better reference of the row", what, group), []).append(min(qs))
        if spec.get("rss"):
            rss = cells.get((model, kind, "peak_rss:" + what, None))
            row.append(str(rss["figure"]) if rss else "")
        if bw:
            b = bw.get(f["commit"]) if what.startswith("tg") else None
            gbs = f.get("size_mib", 0) * 2**20 * f["figure"] / 1e9
            row.append(f"{gbs:.1f} ({100 * gbs / b['figure']:.0f}%)" if b else "")
            used += [b] if b and b not in used else []
        row += [f["commit"]] if show_commit else []
        out.append("| " + " | ".join(row) + " |")
    return caption(used, spec["command"], spec.get("note", "")) + "\n" + "\n".join(out) + "\n", ratios


def listing(spec):
    """One row per selected line (newest per key), columns from functions of the line."""
    lines = select(load(spec["file"]), spec["where"])
    if "whats" in spec:
        lines = [l for l in lines if l["what"] in spec["whats"]]
    cells = newest(lines, spec["key"])
    chosen = sorted(cells.values(), key=lambda l: l["_order"])
    head = [c[0] for c in spec["cols"]]
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join(c[2] if len(c) > 2 else "---:" for c in spec["cols"]) + "|"]
    for l in chosen:
        out.append("| " + " | ".join(c[1](l) for c in spec["cols"]) + " |")
    return caption(chosen, spec["command"], spec.get("note", "")) + "\n" + "\n".join(out) + "\n", {}


def pct(x):
    return f"{100 * x:+.3f}%"


def ratio(l, digits=2):
    return f"{l['figure'] / l['ref_figure']:.{digits}f}" if l.get("ref_figure") else ""


BAR = dict(kind="compare", file="cpu-e2e.jsonl", refs=[AMX, PLAIN], unit="t/s", size=True, rss=True, bw=True,
           ref_names={AMX: "llama.cpp default", PLAIN: "llama.cpp --repack 0"},
           ref_short={AMX: "default", PLAIN: "plain"}, whats=["pp512", "tg128"])
CUDA_CMP = dict(kind="compare", file="cuda-h200.jsonl", refs=[CUDA], unit="t/s", model_col=True,
                ref_names={CUDA: "llama.cpp"}, ref_short={CUDA: "llama.cpp"})
LEFT = "---"


def step_cols(forward):
    """ferrox's /metrics split of a serving level: tokens a step, and forward ms a step (column `forward`)."""
    return [("tokens / step", lambda l: f"{l['engine']['tokens_per_step']}"),
            (forward, lambda l: f"{1e3 * l['engine']['forward_s'] / l['engine']['steps']:.1f}")]


def serve_cuda(machine, command):
    """`ferrox serve --backend cuda` beside llama-server on `machine`, with ferrox's per-step split."""
    return dict(
        kind="list", file="serve.jsonl", where={"set": "serve-cuda", "machine": machine, "what": "serve_tok_s"},
        key=lambda l: (l["kind"], l["streams"]), command=command,
        cols=[("model", lambda l: f"{l['model']} {l['kind']}", LEFT), ("streams", lambda l: str(l["streams"])),
              ("ferrox tok/s", lambda l: f"{l['figure']:.1f}"),
              ("llama-server tok/s", lambda l: f"{l['ref_figure']:.1f}"
               + (f" ({l['ref_machine']}, {l['ref_date']})" if l.get("ref_machine") else " (same run)")),
              ("ratio", lambda l: f"{ratio(l)}x"), ("failures", lambda l: f"{l['failures']} / {l['ref_failures']}"),
              ("ferrox tokens / step", lambda l: f"{l['engine']['tokens_per_step']}" if l.get("engine") else "-"),
              ("ferrox ms / step: forward, sampling", lambda l: "{:.1f}, {:.2f}".format(
                  *(1e3 * l["engine"][k] / l["engine"]["steps"] for k in ("forward_s", "sample_s"))) if l.get("engine") else "-")])


TABLES = {
    "bar-xeon": dict(BAR, where={"set": "bar", "machine": "xeon-amx-2c"},
                     command="FERROX=target/release/ferrox benchmarks/run_bar.sh"),
    "bar-epyc": dict(BAR, where={"set": "bar", "machine": "epyc-avx512-2c"},
                     command="FERROX=target/release/ferrox benchmarks/run_bar.sh"),
    "bar-epyc-avx2": dict(BAR, where={"set": "bar", "machine": "epyc-avx2-2c"},
                          command="FERROX=target/release/ferrox benchmarks/run_bar.sh"),
    "rss-process": dict(
        kind="list", file="cpu-e2e.jsonl", where={"set": "rss"},
        key=lambda l: (l["kind"], l["variant"]),
        command="FERROX=target/release/ferrox benchmarks/run_rss.sh",
        cols=[("kind", lambda l: l["kind"], LEFT), ("ferrox", lambda l: l["variant"], LEFT),
              ("ferrox MiB", lambda l: num(l["figure"])), ("llama.cpp", lambda l: l["ref"], LEFT),
              ("llama.cpp MiB", lambda l: num(l["ref_figure"]))]),
    "ttft": dict(
        kind="list", file="cpu-e2e.jsonl", where={"set": "ttft"}, key=lambda l: l["kind"],
        command="FERROX=target/release/ferrox benchmarks/run_ttft.sh MODEL...",
        cols=[("kind", lambda l: l["kind"], LEFT), ("ferrox run ms", lambda l: num(l["figure"])),
              ("llama-cli ms", lambda l: num(l["ref_figure"])),
              ("llama-cli / ferrox", lambda l: f"{l['ref_figure'] / l['figure']:.2f}")]),
    "perplexity": dict(
        kind="list", file="cpu-e2e.jsonl", where={"set": "perplexity"},
        key=lambda l: (l["kind"], l["variant"]),
        command="CHUNKS=20 benchmarks/run_suite.sh MODEL...",
        cols=[("kind", lambda l: l["kind"], LEFT), ("ferrox", lambda l: l["variant"], LEFT),
              ("ferrox PPL", lambda l: f"{l['figure']:.4f}" + (f" ± {l['sd']:.4f}" if l.get("sd") else "")),
              ("llama-perplexity", lambda l: f"{l['ref_figure']:.4f} ± {l['ref_sd']:.4f}"),
              ("difference", lambda l: pct(l['figure'] / l['ref_figure'] - 1))]),
    "noisy": dict(
        kind="list", file="cpu-e2e.jsonl", where={"set": "noisy"}, key=lambda l: l["ref"],
        command="benchmarks/run_noisy.sh",
        cols=[("engine", lambda l: l["ref"], LEFT),
              ("quiet t/s", lambda l: f"{l['ref_quiet']:.2f}"), ("noisy t/s", lambda l: f"{l['ref_noisy']:.2f}"),
              ("kept", lambda l: f"{l['ref_figure']}%"),
              ("ferrox quiet / noisy t/s", lambda l: f"{l['quiet']:.2f} / {l['noisy']:.2f}"),
              ("ferrox kept", lambda l: f"**{l['figure']}%**")]),
    "matvec-xeon": dict(
        kind="list", file="matvec.jsonl", where={"set": "matvec", "machine": "xeon-amx-2c"},
        key=lambda l: (l["kind"], l["model"], l["threads"]),
        command="GGML_REF=~/.cache/ferrox/llama.cpp-build benchmarks/run_matvec.sh KIND...",
        cols=[("kind", lambda l: l["kind"], LEFT), ("shape", lambda l: l["model"], LEFT),
              ("threads", lambda l: str(l["threads"])), ("ggml", lambda l: f"{l['ref_figure']:.2f}"),
              ("ferrox scalar", lambda l: f"{l['scalar_figure']:.2f}"),
              ("ferrox SIMD", lambda l: f"{l['figure']:.2f}"), ("ratio", lambda l: f"**{ratio(l)}**"),
              ("commit", lambda l: l["commit"], LEFT)]),
    "serve-xeon": dict(
        kind="list", file="serve.jsonl", where={"set": "serve", "machine": "xeon-amx-2c", "what": "serve_tok_s"},
        key=lambda l: l["streams"],
        command="SECONDS_PER=30 FERROX_BIN=target/release/ferrox tools/serve/bench.sh",
        cols=[("streams", lambda l: str(l["streams"])), ("ferrox tok/s", lambda l: f"{l['figure']:.2f}"),
              ("llama-server tok/s", lambda l: f"{l['ref_figure']:.2f}"), ("ratio", lambda l: f"{ratio(l)}x"),
              ("failures", lambda l: f"{l['failures']} / {l['ref_failures']}")]),
    "serve-ttft-xeon": dict(
        kind="list", file="serve.jsonl", where={"set": "serve", "machine": "xeon-amx-2c"},
        whats=["ttft_median", "ttft_p90"], key=lambda l: (l["streams"], l["what"]),
        command="SECONDS_PER=30 FERROX_BIN=target/release/ferrox tools/serve/bench.sh",
        cols=[("streams", lambda l: str(l["streams"])), ("measure", lambda l: l["what"], LEFT),
              ("ferrox", lambda l: f"{l['figure']} {l['unit']}"),
              ("llama-server", lambda l: f"{l['ref_figure']} {l['unit']}")]),
    "serve-cuda-h100": serve_cuda("h100", "D=target/devmoe bash scripts/cuda-serve.sh"),
    "serve-cuda-h200": serve_cuda("h200", "COMMIT=<sha> MACHINE=h200 D=target/devmoe bash scripts/cuda-serve.sh"),
    "serve-cuda-ab": dict(
        kind="list", file="serve.jsonl", where={"set": "serve-cuda-ab"},
        key=lambda l: (l["machine"], l["variant"], l["streams"]),
        command="COMMIT=<sha> MACHINE=<card> MIN=64 SKIP_TESTS=1 D=target/devmoe bash scripts/cuda-gemm-min.sh",
        cols=[("knobs", lambda l: f"`{l['knobs']}`", LEFT), ("streams", lambda l: str(l["streams"])),
              ("ferrox default tok/s", lambda l: f"{l['ref_figure']:.1f}"), ("with the knobs tok/s", lambda l: f"{l['figure']:.1f}"),
              ("ratio", lambda l: f"{ratio(l)}x")] + step_cols("forward ms / step with the knobs")),
    "serve-cuda-mma": dict(
        kind="list", file="serve.jsonl", where={"set": "serve-cuda-mma"},
        key=lambda l: (l["commit"], l.get("commit_note", ""), l.get("variant", "default"), l["streams"]),
        command="COMMIT=<sha> MACHINE=<card> VARIANTS=\"mma64=FERROX_CUDA_MMA_MAX=64\" CLIENTS=\"1 16 64\" bash scripts/cuda-mma.sh",
        note="(through the device tool, carrying target/devmoe; see the script's header)",
        cols=[("commit", lambda l: l["commit"] + (" (variant)" if l.get("commit_note") else ""), LEFT),
              ("knobs", lambda l: f"`{l['knobs']}`" if l.get("knobs") else "default", LEFT),
              ("streams", lambda l: str(l["streams"])), ("tok/s", lambda l: f"{l['figure']:.1f}"),
              ("vs the default", lambda l: f"{ratio(l)}x" if l.get("ref_figure") else "-")] + step_cols("forward ms / step")),
    "cuda-mma-prefill": dict(
        kind="list", file="cuda-mma.jsonl", where={"set": "mma-prefill"},
        key=lambda l: (l["commit"], l.get("commit_note", ""), l["variant"]),
        command="COMMIT=<sha> MACHINE=<card> SERVE=0 BENCH=\"default FERROX_CUDA_MMA_MAX=0 ...\" bash scripts/cuda-mma.sh",
        note="(through the device tool, carrying target/devmoe)",
        cols=[("commit", lambda l: l["commit"] + (" (variant)" if l.get("commit_note") else ""), LEFT),
              ("knobs", lambda l: f"`{l['knobs']}`" if l["knobs"] else "default", LEFT)]
             + [(f"{n} tokens", (lambda n: lambda l: f"{l['tok_s'][n]:.0f}" if n in l["tok_s"] else "-")(n))
                for n in ("16", "32", "64", "96", "128", "256")]),
    "vulkan-h200": dict(kind="compare", file="vulkan.jsonl", where={"set": "vulkan", "machine": "h200"},
                        refs=["ferrox Vulkan, replay off", "ferrox Vulkan, float products (FERROX_VULKAN_INT_DOT=0)", "ferrox CUDA"],
                        unit="t/s", model_col=True,
                        ref_names={"ferrox Vulkan, replay off": "Vulkan, replay off",
                                   "ferrox Vulkan, float products (FERROX_VULKAN_INT_DOT=0)": "Vulkan, float products",
                                   "ferrox CUDA": "ferrox CUDA"},
                        ref_short={"ferrox Vulkan, replay off": "no replay",
                                   "ferrox Vulkan, float products (FERROX_VULKAN_INT_DOT=0)": "float",
                                   "ferrox CUDA": "CUDA"},
                        command="COMMIT=<sha> MACHINE=h200 SHAPES=llama-1b bash scripts/vulkan-h200.sh (a device-tool call carrying target/devvk)"),
    "speculative": dict(
        kind="list", file="speculative.jsonl", where={"set": "speculative"},
        key=lambda l: (l["machine"], l["what"], l["variant"]),
        command="FERROX=target/release/ferrox MACHINE=<label> REPS=7 benchmarks/run_speculative.sh",
        cols=[("machine", lambda l: l["machine"], LEFT), ("test", lambda l: l["what"], LEFT), ("case", lambda l: l["variant"], LEFT),
              ("ferrox plain t/s", lambda l: f"{l['plain']:.2f}"),
              ("ferrox speculative t/s", lambda l: f"{l['figure']:.2f} ± {l['sd']:.2f}"),
              ("speedup", lambda l: f"**{l['speedup']:.2f}x**"),
              ("drafts kept", lambda l: f"{100 * l['acceptance']:.0f}%"),
              ("tokens / target pass", lambda l: f"{l['tokens_per_pass']:.2f}"),
              ("same ids", lambda l: "yes" if l["same_tokens"] else "NO"),
              ("llama-speculative t/s", lambda l: f"{l['ref_figure']:.2f}" if l.get("ref") else "-"),
              ("vs llama-speculative", lambda l: f"**{l['figure'] / l['ref_figure']:.2f}x**" if l.get("ref") else "-")]),
    "moe-cpu-epyc": dict(BAR, file="moe.jsonl", where={"set": "moe-cpu", "machine": "epyc-avx512-2c"},
                         model_col=True, size=False, command="REPS=3 benchmarks/run_moe_cpu.sh"),
    "moe-cpu-xeon": dict(BAR, file="moe.jsonl", where={"set": "moe-cpu", "machine": "xeon-amx-2c"},
                         model_col=True, size=False, command="REPS=3 benchmarks/run_moe_cpu.sh"),
    "moe-cpu-epyc-avx2": dict(BAR, file="moe.jsonl", where={"set": "moe-cpu", "machine": "epyc-avx2-2c"},
                              model_col=True, size=False, command="REPS=3 benchmarks/run_moe_cpu.sh"),
    "moe-cuda-h100": dict(CUDA_CMP, file="moe.jsonl", where={"set": "moe-cuda", "machine": "h100"},
                          command="SKIP_TESTS=1 LLAMA=1 LLAMA_TARGETS=llama-bench SHAPES=qwen3moe-30b-l8 KINDS=Q4_K_M bash scripts/cuda-moe.sh",
                          note="(through the device tool, carrying target/devmoe; see the script's header)"),
    "cuda-side-by-side": dict(CUDA_CMP, where={"set": "side-by-side", "machine": "h200"},
                              command="D=target/h-cuda REPS=3 bash scripts/cuda-side-by-side.sh",
                              note="(`SHAPE=llama-8b` for the 8b rows; through the device tool, see the "
                                   "script's header)"),
    "cuda-depth": dict(CUDA_CMP, where={"set": "depth", "machine": "h200"},
                       command="D=target/h-cuda DEPTH=0,1024,4096 KINDS=Q4_0 REPS=3 bash scripts/cuda-side-by-side.sh"),
    "cuda-boundary": dict(
        kind="list", file="cuda-h200.jsonl", where={"set": "boundary"}, key=lambda l: l["variant"],
        command="nvcc -O3 -arch=sm_90 tools/cuda/boundary_bench.cu -o /tmp/bb && /tmp/bb",
        cols=[("variant", lambda l: l["variant"], LEFT),
              ("step µs, round 0 / 1", lambda l: " / ".join(f"{x:.1f}" for x in l["step_us"])),
              ("a boundary costs µs", lambda l: f"{l['figure']:.1f}")]),
}

MARK = re.compile(r"(<!-- table:([\w-]+) -->\n)(.*?)(<!-- /table -->)", re.S)


def render(name):
    spec = TABLES[name]
    return compare(spec) if spec["kind"] == "compare" else listing(spec)


def check_lines():
    bad = []
    for path in sorted(glob.glob(os.path.join(RESULTS, "*.jsonl"))):
        for i, line in enumerate(open(path), 1):
            if not line.strip():
                continue
            d = json.loads(line)
            for field in ("commit", "machine", "date", "what", "figure", "unit"):
                if d.get(field) in (None, ""):
                    bad.append(f"{os.path.relpath(path)}:{i}: no {field}")
    return bad


def main():
    check = "--check" in sys.argv
    if "--ranges" in sys.argv:
        for name, spec in TABLES.items():
            if spec["kind"] == "compare":
                for (ref, what, group), qs in sorted(render(name)[1].items()):
                    print(f"{name}: {what}, {group} files, vs {ref}: {min(qs):.2f}-{max(qs):.2f}x")
        return 0
    stale, unknown = [], []
    for md in sorted(glob.glob(os.path.join(HERE, "*.md"))):
        text = open(md).read()

        def sub(m):
            if m.group(2) not in TABLES:
                unknown.append(f"{os.path.basename(md)}: {m.group(2)}")
                return m.group(0)
            return m.group(1) + render(m.group(2))[0] + m.group(4)

        new = MARK.sub(sub, text)
        if new != text:
            stale.append(os.path.basename(md))
            if not check:
                open(md, "w").write(new)
    bad = check_lines()
    for u in unknown:
        print(f"unknown table {u}", file=sys.stderr)
    for b in bad:
        print(b, file=sys.stderr)
    if check:
        for s in stale:
            print(f"{s}: a table differs from benchmarks/results (run python3 benchmarks/tables.py)",
                  file=sys.stderr)
        return 1 if stale or bad or unknown else 0
    for s in stale:
        print(f"rewrote the tables of {s}")
    return 1 if bad or unknown else 0


if __name__ == "__main__":
    sys.exit(main())
