#!/usr/bin/env python3
"""Copy a GGUF model's metadata (tokenizer included) into a tensor-free GGUF.

llama.cpp's `llama-tokenize` loads models with `vocab_only`, so a few-MB copy
of the metadata gives the same token ids as the full file; it lets reference
ids be produced on a machine the multi-hundred-MB model cannot be shipped to.

usage: vocab_only.py MODEL.gguf OUT.gguf
"""
import sys

from gguf import GGUFReader, GGUFValueType, GGUFWriter


def main() -> None:
    src, dst = sys.argv[1], sys.argv[2]
    r = GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    w = GGUFWriter(dst, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        main_type = f.types[0]
        sub_type = f.types[1] if main_type == GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), main_type, sub_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
