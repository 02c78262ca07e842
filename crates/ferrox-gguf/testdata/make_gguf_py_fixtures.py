#!/usr/bin/env python3
"""Writes the gguf-py fixtures the round-trip and split tests read.

Made with the `gguf` package from PyPI (0.19.0; its writer is llama.cpp's
gguf-py `GGUFWriter`), so the tests check ferrox-gguf against a writer it
does not share code with. Run from this directory:

    python3 make_gguf_py_fixtures.py

Outputs (all small; committed):
  gguf_py_all_types.gguf          every value type, nested arrays, F32/F16/I32/Q8_0/Q4_K tensors
  gguf_py_align64.gguf            the same tensors with general.alignment = 64
  gguf_py_split-0000{1,2,3}-of-00003.gguf   five tensors split two per part
"""
import numpy as np
from gguf import GGUFWriter, GGUFValueType, GGMLQuantizationType

rng = np.random.default_rng(1234)


def add_everything(w: GGUFWriter) -> None:
    w.add_uint8("test.u8", 200)
    w.add_int8("test.i8", -100)
    w.add_uint16("test.u16", 60000)
    w.add_int16("test.i16", -30000)
    w.add_uint32("test.u32", 4_000_000_000)
    w.add_int32("test.i32", -2_000_000_000)
    w.add_float32("test.f32", 0.1)
    w.add_uint64("test.u64", 2**63 + 5)
    w.add_int64("test.i64", -(2**62))
    w.add_float64("test.f64", -1.0e-300)
    w.add_bool("test.bool_true", True)
    w.add_bool("test.bool_false", False)
    w.add_string("test.string", "héllo wörld ✓")
    w.add_array("test.strings", ["a", "", "ünïcode", "tab\there"])
    w.add_key_value("test.u8s", [1, 2, 255], GGUFValueType.ARRAY, sub_type=GGUFValueType.UINT8)
    w.add_key_value("test.f32s", [1.5, -2.25, 3.0e38], GGUFValueType.ARRAY, sub_type=GGUFValueType.FLOAT32)
    w.add_key_value("test.i64s", [-1, 2**62], GGUFValueType.ARRAY, sub_type=GGUFValueType.INT64)
    w.add_array("test.bools", [True, False, True])
    w.add_array("test.nested", [[1, 2, 3], [4], [5, 6]])
    w.add_array("test.nested_strings", [["x", "y"], ["z"]])


def add_tensors(w: GGUFWriter) -> None:
    w.add_tensor("f32.weight", rng.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("f16.weight", rng.standard_normal((7,)).astype(np.float16))
    w.add_tensor("i32.weight", np.arange(6, dtype=np.int32).reshape(2, 3))
    # Quantized kinds as raw bytes with valid, finite scales: 2 rows of one Q8_0 block (34 bytes).
    q8 = rng.integers(0, 256, size=(2, 34), dtype=np.uint8)
    q8[:, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    w.add_tensor("q8_0.weight", q8, raw_dtype=GGMLQuantizationType.Q8_0)
    # One Q4_K block (144 bytes), ne0 = 256.
    q4k = rng.integers(0, 256, size=(1, 144), dtype=np.uint8)
    q4k[:, 0:4] = np.frombuffer(np.array([0.01, 0.001], dtype=np.float16).tobytes(), dtype=np.uint8)
    w.add_tensor("q4_k.weight", q4k, raw_dtype=GGMLQuantizationType.Q4_K)


def write(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


w = GGUFWriter("gguf_py_all_types.gguf", "ferrox-test")
add_everything(w)
add_tensors(w)
write(w)

w = GGUFWriter("gguf_py_align64.gguf", "ferrox-test")
w.add_custom_alignment(64)
add_everything(w)
add_tensors(w)
write(w)

w = GGUFWriter("gguf_py_split.gguf", "ferrox-test", split_max_tensors=2)
w.add_uint32("test.u32", 7)
add_tensors(w)
write(w)
