#!/usr/bin/env bash
# bench/tower-probe.sh: the Vulkan vision tower on the GPU machine, per op kind, with
# block_attention_coopmat's probe bits (issue 58). Runs, in one device call:
# - the conformance binary with the Vulkan backend alone, coopmat2 off then on, at the
#   tensor-core floor (TANDEM_CONFORMANCE_MIN_TOL=3e-3; no validation layer there), which runs
#   the block-attention cases through block_attention_coopmat where the device has cooperative
#   matrices;
# - `engine synth --shape gemma3-4b --dtype q4_k --mmproj`, then for each probe mode of MODES
#   `TANDEM_VULKAN_ATTN_MODE=M engine bench --image IMAGE --profile` and one line: the
#   encoding (ms, profiled: device timestamps after every node serialise the work) and the
#   block_attention and matmul(f16) nodes' sums (ms). Mode 0 is the real kernel; bits skip
#   parts of block_attention_coopmat's work (1 score products, 2 P V products, 4 global loads
#   after the first tile, 8 the softmax's exponentials) and give wrong results.
# Here, first: `bash bench/package-device.sh .bench/new`. There (carrying .bench/new and .gl):
#   MODES="0 4" bash bench/tower-probe.sh
# Parameters (environment): MODES ("0 1 2 4 8 15"), BIN (.bench/new), IMAGE
# (tests/fixtures/images/photo.png), OUT (the profiles' JSON: prof<M>.json).
set -uo pipefail
BIN=${BIN:-.bench/new}
IMAGE=${IMAGE:-tests/fixtures/images/photo.png}
OUT=${OUT:-$PWD/tower-probe}
mkdir -p "$OUT"
chmod +x "$BIN/engine" "$BIN"/t/deps/* 2>/dev/null
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
for cm2 in 0 1; do
    echo "== conformance, coopmat2=$cm2"
    TANDEM_VULKAN_COOPMAT2=$cm2 TANDEM_CONFORMANCE_VALIDATION=0 TANDEM_CONFORMANCE_BACKENDS=vulkan \
        TANDEM_CONFORMANCE_MIN_TOL=3e-3 timeout 150 "$BIN/t/deps/conformance" 2>&1 |
        grep -E "^test |panicked|FAILED|left|right" | head -20
done
"$BIN/engine" synth --shape gemma3-4b --dtype q4_k --out /tmp/m.gguf --mmproj /tmp/mm.gguf --force >/dev/null
for mode in ${MODES:-0 1 2 4 8 15}; do
    TANDEM_VULKAN_ATTN_MODE=$mode "$BIN/engine" bench --model /tmp/m.gguf --mmproj /tmp/mm.gguf --backend vulkan \
        --image "$IMAGE" --prompt-tokens 8 --gen-tokens 2 --repeat 1 --profile --json --out "$OUT/prof$mode.json" \
        >/dev/null 2>"$OUT/prof$mode.err"
    python3 - "$OUT/prof$mode.json" "$mode" <<'PY' || tail -3 "$OUT/prof$mode.err"
import json, sys
d = json.load(open(sys.argv[1]))["image"]
ms = {x["op"]: round(x["seconds"] * 1000, 2) for x in d["profile"]}
print(f"mode {sys.argv[2]}: encode {d['encode_ms']:.1f} ms, block_attention {ms.get('block_attention')} ms, matmul(f16) {ms.get('matmul(f16)')} ms")
PY
done
