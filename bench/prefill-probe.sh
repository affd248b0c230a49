#!/usr/bin/env bash
# bench/prefill-probe.sh: where a 512-row prefill step's time goes on the GPU machine (issue 54's
# prefill cells), tandem only, one call. For each SHAPE:DTYPE of CELLS (`engine synth` files),
# each build directory of BUILDS (an engine with its plugins beside it) and each VARIANT of
# VARIANTS (`name` or `name:VAR=VAL,VAR=VAL`, environment for that run), `engine bench --backend
# vulkan --prompt-tokens 512 --chunk 512 --gen-tokens 4 --repeat 3` and one `--profile` run,
# alternating ROUNDS times; prints the prefill median and the prefill profile's ops over 0.3 ms
# a step. JSON under $OUT (b-*.json, p-*.json). With CONFORM="name:VAR=VAL,... ..." the
# conformance binary of the first build (DIR/t/deps/conformance, bench/package-device.sh) runs
# first once per entry, Vulkan alone, its summary in $OUT/c-<name>.txt.
# Here: `bash bench/package-device.sh .bench/new`. There (carrying .bench and .gl):
#   CELLS="gemma3-4b:q4_k" VARIANTS="khr cm2:TANDEM_VULKAN_CM2_Q4K=1,TANDEM_VULKAN_CM2_DEQUANT=0" bash bench/prefill-probe.sh
set -uo pipefail
OUT=${OUT:-$PWD/bench-out}; ROUNDS=${ROUNDS:-1}
mkdir -p "$OUT"; . "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh" >/dev/null 2>&1
read -ra builds <<<"${BUILDS:-.bench/new}"
for b in "${builds[@]}"; do chmod +x "$b/engine" "$b"/t/deps/* 2>/dev/null; done
for v in ${CONFORM:-}; do
    name=${v%%:*}; envs=(); [ "$v" != "$name" ] && IFS=, read -ra envs <<<"${v#*:}"
    env "${envs[@]}" TANDEM_CONFORMANCE_VALIDATION=0 TANDEM_CONFORMANCE_BACKENDS=vulkan \
        timeout 240 "${builds[0]}/t/deps/conformance" >"$OUT/c-$name.txt" 2>&1
    echo "conformance $name rc=$? $(grep -E '^test result' "$OUT/c-$name.txt" | head -1)"
    grep -E "panicked|FAILED|failed" "$OUT/c-$name.txt" | head -5
done
for cell in ${CELLS:-gemma3-4b:q4_k}; do
    shape=${cell%%:*}; dt=${cell##*:}; g=/tmp/$shape-$dt.gguf
    "${builds[0]}/engine" synth --shape "$shape" --dtype "$dt" --out "$g" --force >/dev/null || { echo "$cell: synth failed"; continue; }
    for r in $(seq "$ROUNDS"); do
        for b in "${builds[@]}"; do
            for v in ${VARIANTS:-base}; do
                name=${v%%:*}; envs=(); [ "$v" != "$name" ] && IFS=, read -ra envs <<<"${v#*:}"
                tag="$shape-$dt-$(basename "$b")-$name-$r"
                env "${envs[@]}" timeout 300 "$b/engine" bench --model "$g" --backend vulkan --prompt-tokens 512 \
                    --chunk 512 --gen-tokens 4 --repeat 3 --json >"$OUT/b-$tag.json" 2>"$OUT/e-$tag.txt"
                env "${envs[@]}" timeout 300 "$b/engine" bench --model "$g" --backend vulkan --prompt-tokens 512 \
                    --chunk 512 --gen-tokens 4 --repeat 1 --profile --json >"$OUT/p-$tag.json" 2>/dev/null
                python3 - "$OUT/b-$tag.json" "$OUT/p-$tag.json" "$tag" <<'PY'
import json, sys
try:
    b = json.load(open(sys.argv[1]))["runs"][0]
except Exception as e:
    print(sys.argv[3], "failed", e); sys.exit()
try:
    prof = json.load(open(sys.argv[2]))["runs"][0].get("profile", {}).get("prefill", [])
except Exception:
    prof = []
ops = {x["op"].split(":")[-1]: round(x["seconds"] * 1000, 2) for x in prof if x["seconds"] > 3e-4}
print(sys.argv[3], "prefill", round(b["prefill_tokens_per_s"]["median"], 1), ops)
PY
            done
        done
    done
    rm -f "$g"
done
