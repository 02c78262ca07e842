#!/usr/bin/env python3
"""scripts/cuda-mma.sh's raw prefill lines (bench-mma.jsonl: one per variant and batch) as
benchmarks/results/cuda-mma.jsonl lines (set "mma-prefill": one per variant, tok/s by batch).
Usage: mma-results.py RAW COMMIT MACHINE GPU [COMMIT_NOTE] >> benchmarks/results/cuda-mma.jsonl"""
import datetime
import json
import sys

raw, commit, machine, gpu = sys.argv[1:5]
note = sys.argv[5] if len(sys.argv) > 5 else ""
by = {}
for line in open(raw):
    if line.strip():
        d = json.loads(line)
        v = by.setdefault(d["variant"], {"tok_s": {}, "sd": {}})
        v["tok_s"][str(d["n_prompt"])] = round(d["avg_ts"], 1)
        v["sd"][str(d["n_prompt"])] = round(d["stddev_ts"], 1)
for variant, v in by.items():
    out = {"set": "mma-prefill", "what": "prefill tok/s by batch (ferrox bench -p N -n 0 -r 5); figure: 64 tokens",
           "model": "llama-8b (synthetic, seed 0)", "kind": "Q4_K_M", "backend": "cuda",
           "variant": variant, "knobs": "" if variant == "default" else variant,
           "tok_s": v["tok_s"], "sd": v["sd"], "figure": v["tok_s"].get("64"), "unit": "tok/s", "gpu": gpu, "commit": commit,
           "machine": machine, "date": datetime.date.today().isoformat(), "source": "scripts/cuda-mma.sh"}
    if note:
        out["commit_note"] = note
    print(json.dumps(out))
