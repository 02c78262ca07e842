#!/usr/bin/env python3
"""Generate `quant_chunk_<kind>.bin`: ggml's `ggml_quantize_chunk` (no
importance matrix), the quantizer llama-quantize calls, on the same rows as
`gen_quant_vectors.py`'s quantize cases.

For every kind but IQ4_NL it writes what the reference row quantizer writes;
IQ4_NL's chunk quantizer searches the scale further (`ntry = 7`) and so
differs. Each case is quantized twice into differently pre-filled buffers and
dropped if the two differ (uninitialized memory is not a reference).

Usage (the library directory of any llama.cpp / ggml build of this tree):
    python3 tools/refgen/gen_quant_chunk_vectors.py \
        --lib-dir ~/.cache/ferrox/llama.cpp-build/bin --out crates/ferrox-quant/testdata
"""
from __future__ import annotations

import argparse
import ctypes as C
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from gen_quant_vectors import BY_NAME, OP_QUANT, SEED, Ggml, VecFile, f32b, quant_rows  # noqa: E402

# The kinds ggml_quantize_chunk handles that ferrox quantizes (F32 is a copy).
CHUNK_KINDS = ["F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K",
               "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "MXFP4",
               "NVFP4", "Q1_0", "Q2_0"]


def quantize_chunk(g: Ggml, name: str, x: np.ndarray, fill: int) -> bytes:
    _, tid, elems, nbytes, _ = BY_NAME[name]
    x = np.ascontiguousarray(x, dtype=np.float32)
    size = len(x) // elems * nbytes
    out = (C.c_uint8 * size)(*([fill] * size))
    f = g.base.ggml_quantize_chunk
    f.restype = C.c_size_t
    f.argtypes = [C.c_int, C.c_void_p, C.c_void_p, C.c_int64, C.c_int64, C.c_int64, C.c_void_p]
    n = f(tid, x.ctypes.data, C.cast(out, C.c_void_p), 0, 1, len(x), None)
    assert n == size, (name, n, size)
    return bytes(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib-dir", default=os.path.expanduser("~/.cache/ferrox/llama.cpp-build/bin"))
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                  "crates", "ferrox-quant", "testdata"))
    args = ap.parse_args()
    g = Ggml(args.lib_dir)
    for i, name in enumerate(CHUNK_KINDS):
        rng = np.random.default_rng([SEED, 1000 + i])
        elems = BY_NAME[name][2]
        n = max(256, elems)
        vf = VecFile(OP_QUANT, name)
        for label, x in quant_rows(rng, n):
            a, b = quantize_chunk(g, name, x, 0x00), quantize_chunk(g, name, x, 0xFF)
            if a != b:
                print(f"{name}: case '{label}' depends on the buffer's old contents; skipped")
                continue
            vf.add(label, struct.pack("<I", n) + f32b(x) + a)
        vf.write(args.out, "quant_chunk")
    print(f"wrote quant_chunk_*.bin for {len(CHUNK_KINDS)} kinds to {args.out}")


if __name__ == "__main__":
    main()
