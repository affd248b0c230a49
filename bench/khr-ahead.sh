#!/usr/bin/env bash
# bench/khr-ahead.sh: one short device call (the device tool's `run`, carrying $BIN and .gl)
# that checks and times `matmul_khr2` (the KHR prefill product with its global loads two steps
# ahead, `TANDEM_VULKAN_COOPMAT_KERNEL=khr2`) against `matmul_khr` (one step ahead, the default)
# on the KHR path (coopmat2 off), alternating, and profiles one prefill step per op of each
# DTYPE under the default kernel. The variant exists only in the commit that added this script;
# it then replaced the one-step loop in `matmul_khr`, after which both settings run the same
# kernel (bench/results/2026-11-28-khr-ahead/report.md).
# Here first: `bash bench/package-device.sh $BIN`. There: `BIN=.bench/new bash bench/khr-ahead.sh`.
# $OUT gets khr2.txt and each run's JSON.
set -uo pipefail
BIN=${BIN:-.bench/new}
SHAPE=${SHAPE:-gemma3-4b}
DTYPES=${DTYPES:-"q4_k f16"}
ORDER=${ORDER:-"default khr2 default khr2"}
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT"
log="$OUT/khr2.txt"
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
export TANDEM_VULKAN_COOPMAT2=0 TANDEM_CONFORMANCE_VALIDATION=0
chmod +x "$BIN/engine" "$BIN"/t/deps/* 2>/dev/null
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$log"
if [ -x "$BIN/t/deps/vulkan_backend" ]; then
    echo "== vulkan_backend prefill, matmul_khr2 (KHR path)" | tee -a "$log"
    TANDEM_VULKAN_COOPMAT_KERNEL=khr2 timeout 90 "$BIN/t/deps/vulkan_backend" prefill 2>&1 \
        | grep -E "^test |panicked|left|right" | head -20 | tee -a "$log"
fi
for dt in $DTYPES; do
    gguf=/tmp/khr-$SHAPE-$dt.gguf
    "$BIN/engine" synth --shape "$SHAPE" --dtype "$dt" --out "$gguf" --force >/dev/null || continue
    i=0
    for c in $ORDER; do
        i=$((i + 1))
        envs=""
        [ "$c" = khr2 ] && envs=TANDEM_VULKAN_COOPMAT_KERNEL=khr2
        env $envs timeout 90 "$BIN/engine" bench --model "$gguf" --backend vulkan --prompt-tokens 512 \
            --gen-tokens 16 --chunk 512 --repeat 2 --json >"$OUT/$SHAPE-$dt-$c-$i.json" 2>/dev/null \
            || { echo "$dt $c: failed" | tee -a "$log"; continue; }
        python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; print('%-6s %-8s prefill %9.1f tok/s' % (sys.argv[2], sys.argv[3], r['prefill_tokens_per_s']['median']))" \
            "$OUT/$SHAPE-$dt-$c-$i.json" "$dt" "$c" | tee -a "$log"
    done
    "$BIN/engine" bench --model "$gguf" --backend vulkan --prompt-tokens 512 --gen-tokens 4 --chunk 512 \
        --repeat 1 --profile --json >"$OUT/profile-$SHAPE-$dt.json" 2>/dev/null \
        && python3 -c "
import json,sys
for o in json.load(open(sys.argv[1]))['runs'][0]['profile']['prefill'][:6]:
    print('    %-44s %3d %8.3f ms' % (o['op'], o['nodes'], o['seconds'] * 1e3))" "$OUT/profile-$SHAPE-$dt.json" | tee -a "$log"
    rm -f "$gguf"
done
