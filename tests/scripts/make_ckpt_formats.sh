#!/usr/bin/env bash
# dspark_make_ckpt's --format and --config-layout: the defaults write what --format bf16 --config-layout dspark
# writes; --format fp8 --config-layout release writes F8_E4M3 / I8 weights with F8_E8M0 scales and a config.json
# with text_config, and dspark_draft drafts on it (ids in the vocabulary, confidences in (0, 1)).
# Usage: make_ckpt_formats.sh BUILD_DIR
set -euo pipefail
build=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
make_ckpt=$build/apps/dspark_make_ckpt

"$make_ckpt" --preset tiny --seed 2 --out "$work/default" 2>/dev/null
"$make_ckpt" --preset tiny --seed 2 --format bf16 --config-layout dspark --out "$work/bf16" 2>/dev/null
for f in config.json model.safetensors; do
  if ! cmp -s "$work/default/$f" "$work/bf16/$f"; then
    echo "FAIL: the default output's $f differs from --format bf16 --config-layout dspark's" >&2
    exit 1
  fi
done

"$make_ckpt" --preset tiny --seed 2 --format fp8 --config-layout release --out "$work/fp8" 2>"$work/err"
grep -q "wrote 240 tensors (fp8)" "$work/err" || { cat "$work/err" >&2; echo "FAIL: not 240 tensors" >&2; exit 1; }
"$build/apps/dspark_draft" "$work/fp8" --random-rows 0:24 --random-rows 1:9 --seed 1 --json "$work/d.json" \
  >/dev/null 2>&1
python3 - "$work" <<'PY'
import json, struct, sys
work = sys.argv[1]
cfg = json.load(open(f"{work}/fp8/config.json"))
assert "text_config" in cfg and cfg["quantization_config"]["quant_method"] == "fp8", cfg
with open(f"{work}/fp8/model.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
assert header["mtp.0.attn.wkv.weight"]["dtype"] == "F8_E4M3", header["mtp.0.attn.wkv.weight"]
assert header["mtp.0.attn.wkv.scale"]["dtype"] == "F8_E8M0"
w1 = header["mtp.0.ffn.experts.0.w1.weight"]
assert w1["dtype"] == "I8" and w1["shape"] == [512, 128], w1
d = json.load(open(f"{work}/d.json"))
ids = [i for r in d["ids"] for i in r]
conf = [c for r in d["conf"] for c in r]
assert len(ids) == 10 and all(0 <= i < 1024 for i in ids), ids
assert all(0 < c < 1 for c in conf), conf
print("PASS: defaults are bf16 / dspark; fp8 + release drafts", d["ids"])
PY
