#!/usr/bin/env python3
"""Per-op comparison of two forward passes dumped as OUT/<name>.f32 files.

`opdump.cpp` writes llama.cpp's intermediate tensors that way (llama.cpp's
callback names: `attn_norm-0`, `Vcur-0`, `ffn_geglu-3`, `result_norm`, ...).
This script builds it (one g++ line, as gen.py builds refllama), runs it, and
compares another directory of the same names (the engine under test) with it,
op by op in llama.cpp's evaluation order: relative error ||a - b|| / ||b||,
cosine, and the largest absolute difference.

usage:
  opdiff.py dump OUT --tokens 2 [--no-repack]      llama.cpp's tensors into OUT
  opdiff.py diff REF OTHER [--only REGEX]           REF (llama.cpp) vs OTHER
"""
import argparse
import os
import re
import struct
import subprocess
import sys

import gen

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(gen.CACHE, "refllama", "opdump")


def build():
    src = os.path.join(HERE, "opdump.cpp")
    if os.path.exists(BIN) and os.path.getmtime(BIN) >= os.path.getmtime(src):
        return
    os.makedirs(os.path.dirname(BIN), exist_ok=True)
    cmd = ["g++", "-std=c++17", "-O2", "-Wall", "-Wextra",
           "-I" + os.path.join(gen.LLAMA, "include"), "-I" + os.path.join(gen.LLAMA, "ggml", "include"),
           src, "-o", BIN,
           "-L" + gen.LLAMA_BIN, "-lllama", "-lggml", "-lggml-base", "-Wl,-rpath," + gen.LLAMA_BIN]
    subprocess.run(cmd, check=True)


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    return struct.unpack(f"<{len(data) // 4}f", data)


def order(ref):
    index = os.path.join(ref, "index.tsv")
    if os.path.exists(index):
        with open(index) as f:
            return [line.split("\t")[0] for line in f if line.strip()]
    return sorted(n[:-4] for n in os.listdir(ref) if n.endswith(".f32"))


def compare(a, b):
    """(relative error of a against b, cosine, largest |a - b|)."""
    d2 = sum((x - y) ** 2 for x, y in zip(a, b))
    b2 = sum(y * y for y in b)
    a2 = sum(x * x for x in a)
    ab = sum(x * y for x, y in zip(a, b))
    rel = (d2 / b2) ** 0.5 if b2 > 0 else float("inf")
    cos = ab / (a2 * b2) ** 0.5 if a2 > 0 and b2 > 0 else 0.0
    return rel, cos, max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    d.add_argument("--tokens", required=True)
    d.add_argument("--no-repack", action="store_true")
    d.add_argument("--model", default=gen.REAL_MODEL)
    c = sub.add_parser("diff")
    c.add_argument("ref")
    c.add_argument("other")
    c.add_argument("--only", default=None)
    a = ap.parse_args()
    if a.cmd == "dump":
        build()
        os.makedirs(a.out, exist_ok=True)
        cmd = [BIN, a.model, a.out, "--tokens", a.tokens] + (["--no-repack"] if a.no_repack else [])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return
    print(f"{'op':<24} {'n':>6} {'rel err':>10} {'cosine':>12} {'max |d|':>10}")
    for name in order(a.ref):
        if a.only and not re.search(a.only, name):
            continue
        other = os.path.join(a.other, name + ".f32")
        if not os.path.exists(other):
            continue
        x, y = read(other), read(os.path.join(a.ref, name + ".f32"))
        if len(x) != len(y):
            print(f"{name:<24} sizes differ: {len(x)} vs {len(y)}", file=sys.stderr)
            continue
        rel, cos, mx = compare(x, y)
        print(f"{name:<24} {len(y):>6} {rel:>10.2e} {cos:>12.9f} {mx:>10.3g}")


if __name__ == "__main__":
    main()
