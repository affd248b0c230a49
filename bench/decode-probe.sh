#!/usr/bin/env bash
# bench/decode-probe.sh: where a decode step's time goes on the GPU machine (issue 54's decode
# cells), tandem only, one call. For each SHAPE:DTYPE of CELLS (`engine synth` files), for each
# build directory of BUILDS (an engine with its plugins beside it) and each VARIANT of VARIANTS
# (`name` or `name:VAR=VAL,VAR=VAL`, environment for that run), `engine bench --backend vulkan
# --prompt-tokens 128 --gen-tokens GEN --repeat 3` and one `--profile` run, alternating ROUNDS
# times; prints the decode median and the decode profile's ops over 0.1 ms a step. JSON under
# $OUT (b-*.json, p-*.json).
# Here: strip a release build's engine and plugins into .bench/DIR. There (carrying those and
# .gl): CELLS="gemma3-27b:q4_k" BUILDS=".bench/old .bench/nrm" VARIANTS="base dot:TANDEM_VULKAN_DOT_Q4K1=1" bash bench/decode-probe.sh
set -uo pipefail
OUT=${OUT:-$PWD/bench-out}; GEN=${GEN:-128}; ROUNDS=${ROUNDS:-1}
mkdir -p "$OUT"; . "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh" >/dev/null 2>&1
read -ra builds <<<"${BUILDS:-.bench/new}"
for b in "${builds[@]}"; do chmod +x "$b/engine"; done
for cell in ${CELLS:-gemma3-4b:q4_k}; do
    shape=${cell%%:*}; dt=${cell##*:}; g=/tmp/$shape-$dt.gguf
    "${builds[0]}/engine" synth --shape "$shape" --dtype "$dt" --out "$g" --force >/dev/null || { echo "$cell: synth failed"; continue; }
    for r in $(seq "$ROUNDS"); do
        for b in "${builds[@]}"; do
            for v in ${VARIANTS:-base}; do
                name=${v%%:*}; envs=(); [ "$v" != "$name" ] && IFS=, read -ra envs <<<"${v#*:}"
                tag="$shape-$dt-$(basename "$b")-$name-$r"
                env "${envs[@]}" timeout 300 "$b/engine" bench --model "$g" --backend vulkan --prompt-tokens 128 \
                    --gen-tokens "$GEN" --repeat 3 --json >"$OUT/b-$tag.json" 2>"$OUT/e-$tag.txt"
                env "${envs[@]}" timeout 300 "$b/engine" bench --model "$g" --backend vulkan --prompt-tokens 128 \
                    --gen-tokens 16 --repeat 1 --profile --json >"$OUT/p-$tag.json" 2>/dev/null
                python3 - "$OUT/b-$tag.json" "$OUT/p-$tag.json" "$tag" <<'PY'
import json, sys
try:
    b = json.load(open(sys.argv[1]))["runs"][0]
except Exception as e:
    print(sys.argv[3], "failed", e); sys.exit()
try:
    prof = json.load(open(sys.argv[2]))["runs"][0].get("profile", {}).get("decode", [])
except Exception:
    prof = []
ops = {x["op"].split(":")[-1]: round(x["seconds"] * 1000, 2) for x in prof if x["seconds"] > 1e-4}
print(sys.argv[3], "decode", round(b["decode_tokens_per_s"]["median"], 1), "p50 ms", round(b["token_latency_ms"]["p50"], 3), ops)
PY
            done
        done
    done
    rm -f "$g"
done
