#!/usr/bin/env python3
"""Lists a GGUF file's metadata keys and tensor directory as gguf-py reads it.

Used to make `gemma-3-270m-q4_k_m.directory.txt`, the independent expectation
the real-model test compares ferrox-gguf's reader with:

    python3 dump_directory.py /root/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf \
        > gemma-3-270m-q4_k_m.directory.txt

Format: `version V`, `alignment A`, `data_offset D`, then one `kv KEY TYPE` line
per key in file order (TYPE = gguf-py's GGUFValueType name; for arrays
`ARRAY/ELEMTYPE/COUNT`), then one `tensor NAME TYPEID DIMS OFFSET NBYTES` line
per tensor (DIMS ne0 first, comma-separated; OFFSET relative to the data section).
"""
import sys
from gguf import GGUFReader, GGUFValueType

r = GGUFReader(sys.argv[1])
version = int(r.fields["GGUF.version"].parts[-1][0])
print(f"version {version}")
print(f"alignment {r.alignment}")
print(f"data_offset {r.data_offset}")
for name, f in r.fields.items():
    if name.startswith("GGUF."):
        continue
    t = f.types[0]
    if t == GGUFValueType.ARRAY:
        elem = f.types[1].name if len(f.types) > 1 else "?"
        print(f"kv {name} ARRAY/{elem}/{len(f.data)}")
    else:
        print(f"kv {name} {t.name}")
for t in r.tensors:
    dims = ",".join(str(int(d)) for d in t.shape)
    off = int(t.data_offset) - r.data_offset
    print(f"tensor {t.name} {int(t.tensor_type)} {dims} {off} {int(t.n_bytes)}")
