#!/usr/bin/env python3
"""Generate ferrox-quant's reference vectors from ggml itself.

The expected values come from ggml's own C (libggml-base / libggml-cpu, loaded
with ctypes), never from ferrox, so the Rust tests that read these files can
fail. Where the Python `gguf` package has a numpy quantizer or dequantizer for
a kind, the generator checks it against ggml bit for bit and reports every
kind where they disagree (the files always hold ggml's answer).

Usage:
    PYTHONPATH=$LLAMA/gguf-py python3 tools/refgen/gen_quant_vectors.py \
        --lib-dir /root/.cache/ferrox/ggml-ref/bin \
        --out crates/ferrox-quant/testdata

The file format is documented in crates/ferrox-quant/testdata/README.md.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import tempfile
import ctypes as C
import os
import struct
import sys
from dataclasses import dataclass, field

import numpy as np

MAGIC = b"FXQV"
VERSION = 1
OP_DEQUANT, OP_QUANT, OP_DOT = 1, 2, 3
SEED = 0x5EED_F0E5
QUANT_HASHES: dict[str, str] = {}
OTHER_HASHES: list[dict[str, str]] = []

# (name, ggml type id, block elems, block bytes, vec_dot type name or None).
# Mirrors ferrox's quant_kinds! table; the sizes are asserted against ggml's
# own type_traits at start-up, so a typo here cannot go unnoticed.
KINDS = [
    ("F32", 0, 1, 4, "F32"), ("F16", 1, 1, 2, "F16"),
    ("Q4_0", 2, 32, 18, "Q8_0"), ("Q4_1", 3, 32, 20, "Q8_1"),
    ("Q5_0", 6, 32, 22, "Q8_0"), ("Q5_1", 7, 32, 24, "Q8_1"),
    ("Q8_0", 8, 32, 34, "Q8_0"), ("Q8_1", 9, 32, 36, "Q8_1"),
    ("Q2_K", 10, 256, 84, "Q8_K"), ("Q3_K", 11, 256, 110, "Q8_K"),
    ("Q4_K", 12, 256, 144, "Q8_K"), ("Q5_K", 13, 256, 176, "Q8_K"),
    ("Q6_K", 14, 256, 210, "Q8_K"), ("Q8_K", 15, 256, 292, "Q8_K"),
    ("IQ2_XXS", 16, 256, 66, "Q8_K"), ("IQ2_XS", 17, 256, 74, "Q8_K"),
    ("IQ3_XXS", 18, 256, 98, "Q8_K"), ("IQ1_S", 19, 256, 50, "Q8_K"),
    ("IQ4_NL", 20, 32, 18, "Q8_0"), ("IQ3_S", 21, 256, 110, "Q8_K"),
    ("IQ2_S", 22, 256, 82, "Q8_K"), ("IQ4_XS", 23, 256, 136, "Q8_K"),
    ("I8", 24, 1, 1, None), ("I16", 25, 1, 2, None), ("I32", 26, 1, 4, None),
    ("I64", 27, 1, 8, None), ("F64", 28, 1, 8, None),
    ("IQ1_M", 29, 256, 56, "Q8_K"), ("BF16", 30, 1, 2, "BF16"),
    ("TQ1_0", 34, 256, 54, "Q8_K"), ("TQ2_0", 35, 256, 66, "Q8_K"),
    ("MXFP4", 39, 32, 17, "Q8_0"), ("NVFP4", 40, 64, 36, "Q8_0"),
    ("Q1_0", 41, 128, 18, "Q8_0"), ("Q2_0", 42, 64, 18, "Q8_0"),
]
BY_NAME = {k[0]: k for k in KINDS}

# Kinds ggml has a reference quantizer for that needs no global state
# (quantize_row_*_ref, or a plain cast). IQ2_S/IQ3_S/IQ3_XXS have a *_ref but
# it needs ggml_quantize_init's grid search tables; IQ1/IQ2_XXS/IQ2_XS have none.
QUANTIZABLE = ["F32", "F16", "BF16", "F64", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
               "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ4_NL", "IQ4_XS",
               "TQ1_0", "TQ2_0", "MXFP4", "NVFP4", "Q1_0", "Q2_0"]

# Scale fields per kind: (byte offset, encoding). Encodings: f16, f32, e8m0
# (MXFP4's exponent byte), ue4m3 (NVFP4's sub-block scales), iq1m (the f16
# spread over the top nibbles of IQ1_M's four u16 scales).
SCALES = {
    "Q4_0": [(0, "f16")], "Q4_1": [(0, "f16"), (2, "f16")],
    "Q5_0": [(0, "f16")], "Q5_1": [(0, "f16"), (2, "f16")],
    "Q8_0": [(0, "f16")], "Q8_1": [(0, "f16"), (2, "f16")],
    "Q2_K": [(80, "f16"), (82, "f16")], "Q3_K": [(108, "f16")],
    "Q4_K": [(0, "f16"), (2, "f16")], "Q5_K": [(0, "f16"), (2, "f16")],
    "Q6_K": [(208, "f16")], "Q8_K": [(0, "f32")],
    "IQ2_XXS": [(0, "f16")], "IQ2_XS": [(0, "f16")], "IQ3_XXS": [(0, "f16")],
    "IQ1_S": [(0, "f16")], "IQ4_NL": [(0, "f16")], "IQ3_S": [(0, "f16")],
    "IQ2_S": [(0, "f16")], "IQ4_XS": [(0, "f16")], "IQ1_M": [(48, "iq1m")],
    "TQ1_0": [(52, "f16")], "TQ2_0": [(64, "f16")], "MXFP4": [(0, "e8m0")],
    "NVFP4": [(0, "ue4m3"), (1, "ue4m3"), (2, "ue4m3"), (3, "ue4m3")],
    "Q1_0": [(0, "f16")], "Q2_0": [(0, "f16")],
}

# Edge values per encoding, as raw bits.
F16_EDGES = {"zero": 0x0000, "negzero": 0x8000, "max": 0x7BFF, "negmax": 0xFBFF, "nan": 0x7E00,
             "nan_payload": 0x7C01, "inf": 0x7C00, "neginf": 0xFC00, "subnormal_min": 0x0001,
             "subnormal_max": 0x03FF, "neg_subnormal": 0x8001}
F32_EDGES = {"zero": 0x00000000, "negzero": 0x80000000, "huge": 0x7F7FFFFF, "neghuge": 0xFF7FFFFF,
             "nan": 0x7FC00000, "inf": 0x7F800000, "neginf": 0xFF800000, "subnormal": 0x00000001}
E8M0_EDGES = {"e0": 0x00, "e1": 0x01, "e2": 0x02, "e127": 0x7F, "e254": 0xFE, "e255": 0xFF}
UE4M3_EDGES = {"zero": 0x00, "sub1": 0x01, "sub7": 0x07, "max": 0x7E, "nan7f": 0x7F,
               "signbit": 0x80, "ff": 0xFF}


class TypeTraits(C.Structure):
    _fields_ = [("type_name", C.c_char_p), ("blck_size", C.c_int64),
                ("blck_size_interleave", C.c_int64), ("type_size", C.c_size_t),
                ("is_quantized", C.c_bool), ("to_float", C.c_void_p),
                ("from_float_ref", C.c_void_p)]


class TypeTraitsCpu(C.Structure):
    _fields_ = [("from_float", C.c_void_p), ("vec_dot", C.c_void_p),
                ("vec_dot_type", C.c_int), ("nrows", C.c_int64)]


TO_FLOAT = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_int64)
FROM_FLOAT = C.CFUNCTYPE(None, C.c_void_p, C.c_void_p, C.c_int64)
VEC_DOT = C.CFUNCTYPE(None, C.c_int, C.c_void_p, C.c_size_t, C.c_void_p, C.c_size_t,
                      C.c_void_p, C.c_size_t, C.c_int)


class Ggml:
    def __init__(self, lib_dir: str):
        mode = getattr(C, "RTLD_GLOBAL", 0)
        self.base = C.CDLL(os.path.join(lib_dir, "libggml-base.so"), mode=mode)
        self.cpu = C.CDLL(os.path.join(lib_dir, "libggml-cpu.so"), mode=mode)
        self.base.ggml_get_type_traits.restype = C.POINTER(TypeTraits)
        self.base.ggml_get_type_traits.argtypes = [C.c_int]
        self.cpu.ggml_get_type_traits_cpu.restype = C.POINTER(TypeTraitsCpu)
        self.cpu.ggml_get_type_traits_cpu.argtypes = [C.c_int]
        self.cpu.ggml_cpu_init()
        for name, tid, elems, nbytes, _ in KINDS:
            t = self.traits(tid)
            assert (t.blck_size, t.type_size) == (elems, nbytes), (name, t.blck_size, t.type_size)

    def traits(self, tid: int) -> TypeTraits:
        return self.base.ggml_get_type_traits(tid).contents

    def traits_cpu(self, tid: int) -> TypeTraitsCpu:
        return self.cpu.ggml_get_type_traits_cpu(tid).contents

    def to_float(self, name: str, data: bytes) -> np.ndarray | None:
        _, tid, elems, nbytes, _ = BY_NAME[name]
        if name == "Q8_K":  # no to_float in type_traits, but ggml exports it
            fn = C.cast(self.base.dequantize_row_q8_K, C.c_void_p).value
        else:
            fn = self.traits(tid).to_float
        if not fn:
            return None
        n = len(data) // nbytes * elems
        src = C.create_string_buffer(bytes(data), len(data))
        out = np.zeros(n, dtype=np.float32)
        TO_FLOAT(fn)(C.cast(src, C.c_void_p), out.ctypes.data, n)
        return out

    def _from_float(self, fn: int, name: str, x: np.ndarray) -> bytes:
        _, _, elems, nbytes, _ = BY_NAME[name]
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = C.create_string_buffer(len(x) // elems * nbytes)
        FROM_FLOAT(fn)(x.ctypes.data, C.cast(out, C.c_void_p), len(x))
        return out.raw

    def from_float_ref(self, name: str, x: np.ndarray) -> bytes | None:
        tid = BY_NAME[name][1]
        fn = self.traits(tid).from_float_ref
        if name == "Q8_K":
            fn = C.cast(self.base.quantize_row_q8_K_ref, C.c_void_p).value
        return None if not fn else self._from_float(fn, name, x)

    def from_float_cpu(self, name: str, x: np.ndarray) -> bytes:
        fn = self.traits_cpu(BY_NAME[name][1]).from_float
        assert fn, name
        return self._from_float(fn, name, x)

    def vec_dot(self, name: str, w: bytes, a: bytes, n: int) -> float | None:
        fn = self.traits_cpu(BY_NAME[name][1]).vec_dot
        if not fn:
            return None
        s = C.c_float(0.0)
        wb = C.create_string_buffer(w, len(w))
        ab = C.create_string_buffer(a, len(a))
        VEC_DOT(fn)(n, C.byref(s), 0, C.cast(wb, C.c_void_p), 0, C.cast(ab, C.c_void_p), 0, 1)
        return s.value


# ----------------------------------------------------------------- file writer

@dataclass
class VecFile:
    op: int
    name: str
    cases: list[tuple[str, bytes]] = field(default_factory=list)

    def add(self, label: str, payload: bytes) -> None:
        self.cases.append((label, payload))

    def write(self, out_dir: str, prefix: str) -> int:
        tid = BY_NAME[self.name][1]
        buf = bytearray(MAGIC + struct.pack("<IIII", VERSION, self.op, tid, len(self.cases)))
        for label, payload in self.cases:
            lb = label.encode()
            buf += struct.pack("<I", len(lb)) + lb + payload
        path = os.path.join(out_dir, f"{prefix}_{self.name.lower()}.bin")
        with open(path, "wb") as f:
            f.write(buf)
        return len(buf)


def f32b(x: np.ndarray) -> bytes:
    return np.ascontiguousarray(x, dtype="<f4").tobytes()


# ------------------------------------------------------------- block builders

def sane_f16_bits(rng: np.random.Generator, n: int, lo=-8.0, hi=0.0) -> np.ndarray:
    mag = np.exp2(rng.uniform(lo, hi, n)).astype(np.float16)
    sign = rng.choice([-1.0, 1.0], n).astype(np.float16)
    return (mag * sign).view(np.uint16)


def set_scale(block: bytearray, off: int, enc: str, bits: int) -> None:
    if enc == "f16":
        block[off:off + 2] = struct.pack("<H", bits)
    elif enc == "f32":
        block[off:off + 4] = struct.pack("<I", bits)
    elif enc in ("e8m0", "ue4m3"):
        block[off] = bits
    elif enc == "iq1m":
        sc = list(struct.unpack("<4H", bytes(block[off:off + 8])))
        for i in range(4):
            sc[i] = (sc[i] & 0x0FFF) | (((bits >> (4 * i)) & 0xF) << 12)
        block[off:off + 8] = struct.pack("<4H", *sc)
    else:
        raise ValueError(enc)


def sane_scale_bits(rng: np.random.Generator, enc: str) -> int:
    if enc in ("f16", "iq1m"):
        return int(sane_f16_bits(rng, 1)[0])
    if enc == "f32":
        return int(np.array([np.exp2(rng.uniform(-12, -4)) * rng.choice([-1, 1])],
                            dtype=np.float32).view(np.uint32)[0])
    if enc == "e8m0":
        return int(rng.integers(118, 131))
    if enc == "ue4m3":
        return int(rng.integers(0x20, 0x48))
    raise ValueError(enc)


def random_block(rng: np.random.Generator, name: str, sane: bool = True) -> bytearray:
    nbytes = BY_NAME[name][3]
    block = bytearray(rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes())
    if sane:
        for off, enc in SCALES[name]:
            set_scale(block, off, enc, sane_scale_bits(rng, enc))
    return block


def fill_nonscale(name: str, block: bytearray, value: int) -> bytearray:
    """Every byte that is not a scale set to `value` (all-max / all-min quants)."""
    out = bytearray([value]) * len(block)
    for off, enc in SCALES[name]:
        width = {"f16": 2, "f32": 4, "e8m0": 1, "ue4m3": 1, "iq1m": 0}[enc]
        out[off:off + width] = block[off:off + width]
        if enc == "iq1m":  # the f16 lives in the top nibbles; keep them
            sc = struct.unpack("<4H", bytes(block[off:off + 8]))
            fill = value | (value << 8)
            out[off:off + 8] = struct.pack("<4H", *[(s & 0xF000) | (fill & 0x0FFF) for s in sc])
    return out


def edge_table(enc: str) -> dict[str, int]:
    return {"f16": F16_EDGES, "iq1m": F16_EDGES, "f32": F32_EDGES,
            "e8m0": E8M0_EDGES, "ue4m3": UE4M3_EDGES}[enc]


# ------------------------------------------------------------------ dequant

def plain_dequant_cases(rng: np.random.Generator, name: str) -> list[tuple[str, bytes, np.ndarray]]:
    """Float and integer kinds: element arrays and their f32 value by numpy cast."""
    cases = []
    if name in ("F32", "F16", "BF16"):
        width = {"F32": 4, "F16": 2, "BF16": 2}[name]
        udt = {4: np.uint32, 2: np.uint16}[width]
        specials = {
            "F32": [0, 0x80000000, 1, 0x807FFFFF, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000,
                    0x7F800001, 0xFFFFFFFF],
            "F16": list(F16_EDGES.values()) + [0x3C00, 0xBC00, 0x7FFF, 0xFFFF],
            "BF16": [0, 0x8000, 1, 0x807F, 0x7F7F, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x3F80],
        }[name]
        cases.append(("specials", np.array(specials, dtype=udt)))
        if name == "F32":
            cases.append(("random_bits", rng.integers(0, 2**32, 512, dtype=np.uint64).astype(np.uint32)))
        else:
            cases.append(("random_bits", rng.integers(0, 2**16, 1024, dtype=np.uint32).astype(np.uint16)))
        out = []
        for label, bits in cases:
            data = bits.astype(udt).tobytes()
            out.append((label, data, None))
        return out
    if name == "F64":
        vals = np.concatenate([
            np.array([0.0, -0.0, 1.0, -1.0, np.nan, np.inf, -np.inf, 1e300, -1e300, 1e-300, 5e-324,
                      3.4028235677973366e38, 3.4028235e38 * (1 + 2**-25), 1.401298464324817e-45,
                      0.7e-45, 1 + 2**-24, 1 + 3 * 2**-24, 2**-149 * 1.5]),
            rng.normal(0, 1, 256) * np.exp2(rng.uniform(-40, 40, 256)),
        ])
        return [("values", vals.astype("<f8").tobytes(), vals.astype(np.float32))]
    dt = {"I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64}[name]
    info = np.iinfo(dt)
    vals = np.concatenate([np.array([0, 1, -1, info.min, info.max, info.min + 1, info.max - 1], dtype=dt),
                           rng.integers(info.min, info.max, 256, dtype=dt, endpoint=True)])
    if name in ("I32", "I64"):  # values that round when cast to f32
        vals = np.concatenate([vals, np.array([2**24 + 1, 2**24 + 3, -(2**24 + 1), 2**31 - 1], dtype=dt)])
    return [("values", vals.astype(dt).tobytes(), vals.astype(np.float32))]


def q8_1_numpy_dequant(data: bytes) -> np.ndarray:
    np.seterr(all="ignore")  # NaN/Inf scales are deliberate edge cases
    blocks = np.frombuffer(data, dtype=np.uint8).reshape(-1, 36)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    q = blocks[:, 4:].copy().view(np.int8).astype(np.float32)
    return (d * q).reshape(-1)


def quant_dequant_cases(rng: np.random.Generator, name: str) -> list[tuple[str, bytes]]:
    cases = []
    cases.append(("random_sane", b"".join(bytes(random_block(rng, name)) for _ in range(6))))
    cases.append(("random_bytes", b"".join(bytes(random_block(rng, name, sane=False)) for _ in range(2))))
    base = random_block(rng, name)
    cases.append(("all_max_quants", bytes(fill_nonscale(name, base, 0xFF))))
    cases.append(("all_min_quants", bytes(fill_nonscale(name, base, 0x00))))
    for fi, (off, enc) in enumerate(SCALES[name]):
        blocks = []
        labels = []
        for ename, bits in edge_table(enc).items():
            b = random_block(rng, name)
            set_scale(b, off, enc, bits)
            blocks.append(bytes(b))
            labels.append(ename)
        cases.append((f"scale{fi}@{off}_{enc}:" + ",".join(labels), b"".join(blocks)))
    return cases


def gen_dequant(g: Ggml, rng: np.random.Generator, name: str, notes: list[str], gguf_check) -> VecFile:
    vf = VecFile(OP_DEQUANT, name)
    _, _, elems, nbytes, _ = BY_NAME[name]
    if elems == 1:
        for label, data, expected in plain_dequant_cases(rng, name):
            if expected is None:  # F32 identity, F16/BF16 through ggml
                if name == "F32":
                    expected = np.frombuffer(data, dtype="<f4").copy()
                else:
                    expected = g.to_float(name, data)
            vf.add(label, struct.pack("<I", len(data) // nbytes) + data + f32b(expected))
            gguf_check("dequant", name, label, data, expected)
        return vf
    for label, data in quant_dequant_cases(rng, name):
        if name == "Q8_1":
            expected = q8_1_numpy_dequant(data)
        else:
            expected = g.to_float(name, data)
            assert expected is not None, name
        vf.add(label, struct.pack("<I", len(data) // nbytes) + data + f32b(expected))
        gguf_check("dequant", name, label, data, expected)
    return vf


# -------------------------------------------------------------------- quant

def quant_rows(rng: np.random.Generator, n: int) -> list[tuple[str, np.ndarray]]:
    rows = [
        ("gaussian", rng.normal(0, 1, n)),
        ("gaussian_small", rng.normal(0, 0.02, n)),
        ("uniform", rng.uniform(-1, 1, n)),
        ("uniform_positive", rng.uniform(0, 3, n)),
    ]
    out = rng.normal(0, 1, n)
    out[rng.integers(0, n, max(1, n // 64))] *= 60.0
    rows.append(("outliers", out))
    rows.append(("zeros", np.zeros(n)))
    rows.append(("constant", np.full(n, 0.375)))
    rows.append(("constant_negative", np.full(n, -2.5)))
    rows.append(("tiny_1e-30", rng.normal(0, 1, n) * 1e-30))
    rows.append(("huge_1e30", rng.normal(0, 1, n) * 1e30))
    mixed = rng.normal(0, 1, n)
    mixed[::7] = 0.0
    rows.append(("sparse", mixed))
    ints = rng.integers(-8, 8, n).astype(np.float64) * 0.5  # exact ties for rounding
    rows.append(("half_integers", ints))
    return [(l, r.astype(np.float32)) for l, r in rows]


def gen_quant(g: Ggml, rng: np.random.Generator, name: str, notes: list[str], gguf_check) -> VecFile:
    vf = VecFile(OP_QUANT, name)
    _, _, elems, _, _ = BY_NAME[name]
    n = max(256, elems)
    rows = quant_rows(rng, n)
    nan_row = rng.normal(0, 1, n).astype(np.float32)
    nan_row[5] = np.nan
    for label, x in rows + [("one_nan", nan_row)]:
        if name == "F32":
            q = f32b(x)
        elif name == "F64":
            q = x.astype("<f8").tobytes()
        else:
            q = g.from_float_ref(name, x)
            assert q is not None, name
            # ggml's IQ4_NL quantizer packs an uninitialized L[] for a block
            # whose max |x| is below GROUP_MAX_EPS (1e-15): its bytes are
            # stack garbage, so such rows are not a reference.
            if name == "IQ4_NL" and np.any(np.abs(x.reshape(-1, 32)).max(axis=1) < 1e-15):
                notes.append(f"{name}: case '{label}' skipped (ggml packs uninitialized memory "
                             "for an all-below-1e-15 block)")
                continue
            # Any other case whose bytes differ between processes (ASLR moves
            # the garbage) is dropped too.
            key = f"{name}/{label}"
            QUANT_HASHES[key] = hashlib.sha256(q).hexdigest()
            if OTHER_HASHES and any(o.get(key) != QUANT_HASHES[key] for o in OTHER_HASHES):
                notes.append(f"{name}: ggml's quantize of case '{label}' differs between processes; skipped")
                continue
        vf.add(label, struct.pack("<I", n) + f32b(x) + q)
        gguf_check("quant", name, label, x, q)
    return vf


# ---------------------------------------------------------------------- dot

def weight_rows(g: Ggml, rng: np.random.Generator, name: str, n: int, n_rows: int) -> bytes:
    _, _, elems, nbytes, _ = BY_NAME[name]
    if name == "F32":
        return f32b(rng.normal(0, 1, n * n_rows))
    if name in ("F16", "BF16"):
        return g.from_float_ref(name, rng.normal(0, 1, n * n_rows).astype(np.float32))
    if name in QUANTIZABLE:
        return g.from_float_ref(name, rng.normal(0, 1, n * n_rows).astype(np.float32))
    return b"".join(bytes(random_block(rng, name)) for _ in range(n * n_rows // elems))


def numpy_dot(name: str, act_name: str, w: bytes, a: bytes) -> float:
    """Q8_1 and Q8_K have a vec_dot_type but no vec_dot in ggml-cpu: the
    exact block sum d_w*d_a*sum(q_w*q_a), in f64."""
    if name == "Q8_1":
        wb = np.frombuffer(w, np.uint8).reshape(-1, 36)
        ab = np.frombuffer(a, np.uint8).reshape(-1, 36)
        dw = wb[:, 0:2].copy().view(np.float16).astype(np.float64)[:, 0]
        da = ab[:, 0:2].copy().view(np.float16).astype(np.float64)[:, 0]
        qw, qa = (b[:, 4:].copy().view(np.int8).astype(np.int64) for b in (wb, ab))
    else:
        wb = np.frombuffer(w, np.uint8).reshape(-1, 292)
        ab = np.frombuffer(a, np.uint8).reshape(-1, 292)
        dw = wb[:, 0:4].copy().view("<f4").astype(np.float64)[:, 0]
        da = ab[:, 0:4].copy().view("<f4").astype(np.float64)[:, 0]
        qw, qa = (b[:, 4:260].copy().view(np.int8).astype(np.int64) for b in (wb, ab))
    return float(np.sum(dw * da * np.sum(qw * qa, axis=1)))


def gen_dot(g: Ggml, rng: np.random.Generator, name: str, notes: list[str]) -> VecFile | None:
    act_name = BY_NAME[name][4]
    if act_name is None:
        return None
    vf = VecFile(OP_DOT, name)
    _, _, elems, nbytes, _ = BY_NAME[name]
    act_tid = BY_NAME[act_name][1]
    ggml_vdt = g.traits_cpu(BY_NAME[name][1]).vec_dot_type
    if name == "Q8_K":
        # ggml-cpu gives Q8_K no vec_dot_type (it is only ever an activation);
        # ferrox dots Q8_K rows with Q8_K activations, checked against numpy.
        notes.append(f"Q8_K: ggml-cpu has no vec_dot_type for Q8_K (reads {ggml_vdt}); dot vectors use Q8_K")
    else:
        assert ggml_vdt == act_tid, (name, ggml_vdt)
    n, n_rows = 512, 4
    row_bytes = n // elems * nbytes
    for label, scale in (("gaussian", 1.0), ("gaussian_wide", 30.0)):
        w = weight_rows(g, rng, name, n, n_rows)
        x = (rng.normal(0, 1, n) * scale).astype(np.float32)
        act = g.from_float_cpu(act_name, x)
        if act_name == "F32":
            act_ref = f32b(x)
        else:
            act_ref = g.from_float_ref(act_name, x)
        if act != act_ref:
            notes.append(f"{name}/{label}: ggml-cpu from_float({act_name}) differs from from_float_ref; "
                         "the dot uses from_float's bytes")
        results, mags = [], []
        for r in range(n_rows):
            wr = w[r * row_bytes:(r + 1) * row_bytes]
            res = g.vec_dot(name, wr, act, n)
            if res is None:
                res = numpy_dot(name, act_name, wr, act)
                if f"{name}: numpy dot" not in " ".join(notes):
                    notes.append(f"{name}: numpy dot (ggml-cpu has no vec_dot for {name})")
            results.append(res)
            wf = g.to_float(name, wr) if name not in ("F32", "Q8_1") else (
                np.frombuffer(wr, "<f4") if name == "F32" else q8_1_numpy_dequant(wr))
            af = x if act_name == "F32" else (
                g.to_float(act_name, act) if act_name != "Q8_1" else q8_1_numpy_dequant(act))
            mags.append(float(np.sum(np.abs(wf.astype(np.float64) * af.astype(np.float64)))))
        payload = struct.pack("<III", act_tid, n, n_rows) + w + f32b(x) + act + act_ref \
            + f32b(np.array(results)) + f32b(np.array(mags))
        vf.add(label, payload)
    return vf


# -------------------------------------------------------------- gguf-py check

class GgufCheck:
    """Compares gguf-py's numpy (de)quantizers with ggml, collecting mismatches."""

    def __init__(self):
        try:
            import gguf.quants as gq
            from gguf.constants import GGMLQuantizationType as T
            self.gq, self.T = gq, T
        except Exception as e:  # reported, not fatal: ggml is the reference
            print(f"gguf-py not importable ({e}); skipping the cross-check", file=sys.stderr)
            self.gq = None
        self.agree: dict[str, set[str]] = {}
        self.disagree: dict[str, list[str]] = {}

    def __call__(self, op: str, name: str, label: str, inp, expected) -> None:
        if self.gq is None or name in ("F32", "F64", "I8", "I16", "I32", "I64"):
            return
        qt = getattr(self.T, name)
        try:
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with np.errstate(all="ignore"):
                    if op == "dequant":
                        got = self.gq.dequantize(np.frombuffer(inp, np.uint8).copy(), qt)
                    else:
                        got = self.gq.quantize(inp.copy(), qt)
        except NotImplementedError:
            return
        except Exception as e:
            self.disagree.setdefault(f"{op} {name}", []).append(f"{label}: raised {type(e).__name__}: {e}")
            return
        if op == "dequant":
            got = np.asarray(got, np.float32).reshape(-1)
            exp = np.asarray(expected, np.float32)
            same = got.shape == exp.shape and bool(np.all(
                (got.view(np.uint32) == exp.view(np.uint32)) | (np.isnan(got) & np.isnan(exp))))
        else:
            same = np.asarray(got).tobytes() == expected
        key = f"{op} {name}"
        if same:
            self.agree.setdefault(key, set()).add(label)
        else:
            self.disagree.setdefault(key, []).append(label)

    def report(self) -> list[str]:
        lines = []
        for key in sorted(set(self.agree) | set(self.disagree)):
            bad = self.disagree.get(key, [])
            ok = len(self.agree.get(key, ()))
            lines.append(f"gguf-py {key}: {ok} cases bit-identical"
                         + (f"; DIFFERS on {bad}" if bad else ""))
        return lines


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib-dir", default="/root/.cache/ferrox/ggml-ref/bin")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..",
                                                  "crates", "ferrox-quant", "testdata"))
    ap.add_argument("--hashes-only", action="store_true",
                    help="internal: print the quantize outputs' hashes as JSON and exit")
    args = ap.parse_args()
    if args.hashes_only:
        args.out = tempfile.mkdtemp()
    else:
        # Two more runs in fresh processes: a case whose bytes change with the
        # process (uninitialized memory) is not a reference and is dropped.
        for _ in range(2):
            r = subprocess.run([sys.executable, __file__, "--lib-dir", args.lib_dir, "--hashes-only"],
                               check=True, capture_output=True, text=True)
            OTHER_HASHES.append(json.loads(r.stdout))
    os.makedirs(args.out, exist_ok=True)
    g = Ggml(args.lib_dir)
    check = GgufCheck()
    notes: list[str] = ["Q8_1 dequantize: numpy d*q (ggml has no to_float for Q8_1)",
                        "I8/I16/I32/I64/F64 dequantize, F32 identity, F64 quantize: numpy casts"]
    total = 0
    for i, (name, *_rest) in enumerate(KINDS):
        rng = np.random.default_rng([SEED, i])
        total += gen_dequant(g, rng, name, notes, check).write(args.out, "dequant")
        if name in QUANTIZABLE:
            total += gen_quant(g, rng, name, notes, check).write(args.out, "quant")
        dot = gen_dot(g, rng, name, notes)
        if dot is not None:
            total += dot.write(args.out, "dot")
    with open(os.path.join(args.out, "quantizable.txt"), "w") as f:
        f.write("# kinds with a ggml reference quantizer (quant_*.bin exists for each)\n")
        f.write("\n".join(QUANTIZABLE) + "\n")
    if args.hashes_only:
        print(json.dumps(QUANT_HASHES))
        return
    for line in notes + check.report():
        print(line)
    print(f"wrote {total} bytes to {args.out}")


if __name__ == "__main__":
    main()
