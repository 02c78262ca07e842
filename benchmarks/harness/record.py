#!/usr/bin/env python3
"""Turns what the benchmark scripts measure into normalized result lines and appends them to a
benchmarks/results/*.jsonl file (python3 stdlib only). One line per measurement and reference:

  what        the test: "pp512", "tg128", "tg128@d4096", "matvec", "serve_tok_s", "ttft_median", ...
  model, file the model (or matrix shape) and the file it was read from
  kind        the weight kind (Q4_K_M, Q8_0, F16, ...)
  backend     "cpu" or "cuda"
  figure, sd, unit, stat   ferrox's figure, its spread, its unit, how it was summarized
  ref, ref_figure, ref_sd  the reference it is held against (a llama.cpp build or mode) and its figure
  commit      the ferrox commit measured (`git rev-parse --short HEAD`; commit_note says when the
              tree had uncommitted changes or the commit is inferred)
  machine     a short label: "xeon-amx-2c", "epyc-avx512-2c", "h200" (MACHINE overrides it)
  date        UTC day of the measurement
  set, source the table family ("bar", "side-by-side", "matvec", "serve") and the script

Subcommands (each reads its input files, prints the lines it appends):

  record.py bench   --out F --set S [--backend cpu|cuda] [--ref LABEL=NAME ...] [--rss] RAW
        RAW holds lines "<label> <kind> <json>", <json> a row of `ferrox bench -o jsonl` or
        `llama-bench -o jsonl`; the label "ferrox" is ours, every other label a reference.
  record.py matvec  --out F RUN.txt ...      outputs of benchmarks/run_matvec.sh (medians over runs)
  record.py serve   --out F --model M RAW    JSON lines of tools/serve/bench.sh
  record.py line    --out F --set S FIELD=VALUE ...   one line from a script's own figures
                    (VALUE read as JSON where it parses: numbers stay numbers)
  record.py kind    FILE                     the weight kind a file's name says (…-q4_k_m.gguf: Q4_K_M)

Scripts call it after a run; benchmarks/tables.py then regenerates the tables from the lines.
"""
import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git(*args):
    try:
        return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def commit_fields():
    """The measured commit, from COMMIT or git; a note when the tree differs from it."""
    if os.environ.get("COMMIT"):
        out = {"commit": os.environ["COMMIT"]}
        if os.environ.get("COMMIT_NOTE"):
            out["commit_note"] = os.environ["COMMIT_NOTE"]
        return out
    c = git("rev-parse", "--short", "HEAD") or "unknown"
    out = {"commit": c}
    # (results files the run itself appends to do not make the tree differ)
    if git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results"):
        out["commit_note"] = "tracked files differed from the commit when measured"
    if c == "unknown":
        out["commit_note"] = "no git checkout where it ran"
    return out


def machine_label():
    """MACHINE, else a label from the hardware: the GPU's name, or vendor-isa-cores for a CPU."""
    if os.environ.get("MACHINE"):
        return os.environ["MACHINE"]
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        gpu = ""
    if gpu:
        return re.sub(r"^nvidia ", "", gpu.splitlines()[0].lower()).replace(" ", "-")
    model, flags = "", set()
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name") and not model:
                model = line.split(":", 1)[1].lower()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    vendor = next((v for v in ("xeon", "epyc", "ryzen", "core") if v in model), "cpu")
    isa = ("amx" if "amx_tile" in flags else "avx512" if "avx512f" in flags
           else "avx2" if "avx2" in flags else "neon" if "asimd" in flags else "scalar")
    return f"{vendor}-{isa}-{os.cpu_count()}c"


def common(source, set_name):
    out = commit_fields()
    out["machine"] = machine_label()
    out["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    out["set"] = set_name
    out["source"] = source
    return out


def append(path, lines):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        for line in lines:
            text = json.dumps(line, sort_keys=False)
            f.write(text + "\n")
            print(text)


def kind_of(path):
    name = os.path.basename(path).lower()
    m = re.search(r"(iq\d_[a-z0-9]+|q\d_[a-z0-9]+(?:_[ms])?|bf16|f16|f32)", name.removesuffix(".gguf"))
    return m.group(1).upper() if m else name


def test_name(r):
    t = "pp%d" % r["n_prompt"] if r.get("n_prompt") else "tg%d" % r["n_gen"]
    return t + ("@d%d" % r["n_depth"] if r.get("n_depth") else "")


def bench_lines(rows, refs, backend, rss, base):
    """rows: (label, kind, json row). One line per ferrox test and reference label."""
    by = {}
    order = []
    for label, kind, r in rows:
        if "avg_ts" not in r:
            continue  # a suite's skipped checkpoint
        key = (kind, test_name(r))
        if key not in order:
            order.append(key)
        by[(label,) + key] = r
    out = []
    for kind, what in order:
        f = by.get(("ferrox", kind, what))
        if not f:
            continue
        n = len(f.get("samples_ts", [])) or None
        line = {"what": what, "model": f.get("model_type", ""),
                "file": os.path.basename(f.get("model_filename", "")), "kind": kind,
                "backend": backend, "threads": f.get("n_threads"),
                "figure": round(f["avg_ts"], 2), "sd": round(f.get("stddev_ts", 0), 2),
                "unit": "t/s", "stat": f"mean of {n}" if n else "mean",
                "size_mib": round(f.get("model_size", 0) / 2**20)}
        found = False
        for label, name in refs.items():
            r = by.get((label, kind, what))
            if r:
                found = True
                out.append({**line, "ref": name, "ref_figure": round(r["avg_ts"], 2),
                            "ref_sd": round(r.get("stddev_ts", 0), 2), **base})
        if not found:
            out.append({**line, **base})
        if rss and f.get("peak_rss_bytes"):
            out.append({**line, "what": "peak_rss:" + what,
                        "figure": round(f["peak_rss_bytes"] / 2**20), "sd": 0, "unit": "MiB",
                        "stat": "VmHWM of the bench process", **base})
    return out


def parse_matvec(text):
    """(llama.cpp table, ferrox table) of one run_matvec.sh output: {(kind, shape): [values]}."""
    tables, sec = ({}, {"level": ""}), None
    for line in text.splitlines():
        lv = re.match(r"best level on this CPU: (\S+)", line)
        if lv:
            tables[1]["level"] = lv.group(1).rstrip(";")
        if line.startswith("## llama"):
            sec = tables[0]
        elif line.startswith("## ferrox"):
            sec = tables[1]
        m = re.match(r"\| (\S+) \| (\d+x\d+) \| (.*) \|$", line)
        if m and sec is not None:
            try:
                sec[(m.group(1), m.group(2))] = [float(x) for x in m.group(3).split(" | ")]
            except ValueError:
                pass
    return tables


def matvec_lines(texts, base, threads=(1, 2)):
    runs = [parse_matvec(t) for t in texts]
    out = []
    level = runs[0][1].get("level", "")
    for key in runs[0][0]:
        if not all(key in r[0] and key in r[1] for r in runs):
            continue
        nt = len(threads)
        g = [statistics.median(r[0][key][i] for r in runs) for i in range(nt)]
        f = [statistics.median(r[1][key][i] for r in runs) for i in range(2 * nt)]
        for i, t in enumerate(threads):
            out.append({"what": "matvec", "model": key[1], "file": "", "kind": key[0],
                        "backend": "cpu", "level": level, "threads": t,
                        "figure": round(f[nt + i], 2),
                        "scalar_figure": round(f[i], 2), "unit": "GB/s",
                        "stat": f"median of {len(runs)} runs' medians",
                        "ref": "ggml CPU backend", "ref_figure": round(g[i], 2), **base})
    return out


def serve_lines(rows, model, base):
    by = {(r["server"], r["parallel"]): r["result"] for r in rows}
    out = []
    for (server, n), res in by.items():
        if server != "ferrox":
            continue
        ref = by.get(("llama", n), {})
        common_ = {"model": os.path.basename(model), "file": os.path.basename(model), "kind": "", "backend": "cpu",
                   "streams": n, "failures": res.get("failures"), "stat": "one run"}
        for what, field, unit in (("serve_tok_s", "tokens_per_s", "tok/s"),
                                  ("ttft_median", "ttft_median_s", "s"),
                                  ("ttft_p90", "ttft_p90_s", "s")):
            line = {"what": what, **common_, "figure": res.get(field), "unit": unit}
            if ref:
                line.update({"ref": "llama-server", "ref_figure": ref.get(field),
                             "ref_failures": ref.get("failures")})
            out.append({**line, **base})
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--out", required=True)
    b.add_argument("--set", required=True)
    b.add_argument("--source", default="")
    b.add_argument("--backend", default="cpu")
    b.add_argument("--ref", action="append", default=[], help="LABEL=NAME")
    b.add_argument("--rss", action="store_true")
    b.add_argument("--model", default="", help="the model's name in every line (else llama-bench's)")
    b.add_argument("raw")
    one = sub.add_parser("line")
    one.add_argument("--out", required=True)
    one.add_argument("--set", required=True)
    one.add_argument("--source", default="")
    one.add_argument("fields", nargs="+")
    kd = sub.add_parser("kind")
    kd.add_argument("file")
    m = sub.add_parser("matvec")
    m.add_argument("--out", required=True)
    m.add_argument("--source", default="benchmarks/run_matvec.sh")
    m.add_argument("--threads", default="1,2")
    m.add_argument("runs", nargs="+")
    s = sub.add_parser("serve")
    s.add_argument("--out", required=True)
    s.add_argument("--model", required=True)
    s.add_argument("--source", default="tools/serve/bench.sh")
    s.add_argument("raw")
    a = p.parse_args()
    if a.cmd == "kind":
        print(kind_of(a.file))
        return
    if a.cmd == "bench":
        rows = []
        for line in open(a.raw):
            parts = line.rstrip("\n").split(" ", 2)
            if len(parts) == 3 and parts[2].startswith("{"):
                rows.append((parts[0], parts[1], json.loads(parts[2])))
        refs = dict(r.split("=", 1) for r in a.ref)
        lines = bench_lines(rows, refs, a.backend, a.rss, common(a.source, a.set))
        for line in lines:
            line["model"] = a.model or line["model"]
    elif a.cmd == "line":
        line = {}
        for kv in a.fields:
            k, v = kv.split("=", 1)
            try:
                line[k] = json.loads(v)
            except ValueError:
                line[k] = v
        lines = [{**line, **common(a.source, a.set)}]
    elif a.cmd == "matvec":
        threads = tuple(int(t) for t in a.threads.split(","))
        lines = matvec_lines([open(r).read() for r in a.runs], common(a.source, "matvec"), threads)
    else:
        rows = [json.loads(l) for l in open(a.raw) if l.strip().startswith("{")]
        lines = serve_lines(rows, a.model, common(a.source, "serve"))
    append(a.out, lines)
    if not lines:
        print("record.py: nothing to record", file=sys.stderr)


if __name__ == "__main__":
    main()
