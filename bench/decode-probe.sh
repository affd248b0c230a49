#!/usr/bin/env bash
# bench/decode-probe.sh: where a decode step's (or, with PHASE=prefill, a 512-row prefill step's)
# time goes on the GPU machine (issue 54's cells), tandem only, one call. For each SHAPE:DTYPE of
# CELLS (`engine synth` files), for each build directory of BUILDS (an engine with its plugins
# beside it) and each VARIANT of VARIANTS (`name` or `name:VAR=VAL,VAR=VAL`, environment for that
# run), `engine bench --backend vulkan --repeat 3` and one `--profile` run, alternating ROUNDS
# times; prints the phase's median tok/s and its profile's ops over 0.1 ms (decode) or 0.3 ms
# (prefill) a step. Decode: `--prompt-tokens 128 --gen-tokens GEN`; prefill: `--prompt-tokens 512
# --chunk 512 --gen-tokens 4`. JSON under $OUT (b-*.json, p-*.json). With CONFORM="name:VAR=VAL,...
# ..." the conformance binary of the first build (DIR/t/deps/conformance,
# bench/package-device.sh) runs first once per entry, Vulkan alone, its summary in
# $OUT/c-<name>.txt. bench/prefill-probe.sh is this script with PHASE=prefill. The synth file
# is WORK/<shape>-<dtype>.gguf (WORK /tmp); an existing one is used as it is, and KEEP=1 keeps
# it for the next call on a warm machine (a 27B synth takes one to three minutes there;
# bench/two-gpus.sh and bench/layers.sh name theirs the same way in their WORK).
# Here: `bash bench/package-device.sh .bench/new` (or strip a release build's engine and plugins
# into .bench/DIR). There (carrying those and .gl):
#   CELLS="gemma3-27b:q4_k" BUILDS=".bench/old .bench/nrm" VARIANTS="base dot:TANDEM_VULKAN_DOT_Q4K1=1" bash bench/decode-probe.sh
set -uo pipefail
OUT=${OUT:-$PWD/bench-out}; GEN=${GEN:-128}; ROUNDS=${ROUNDS:-1}; PHASE=${PHASE:-decode}
mkdir -p "$OUT"; . "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh" >/dev/null 2>&1
read -ra builds <<<"${BUILDS:-.bench/new}"
for b in "${builds[@]}"; do chmod +x "$b/engine" "$b"/t/deps/* 2>/dev/null; done
if [ "$PHASE" = prefill ]; then
    timed=(--prompt-tokens 512 --chunk 512 --gen-tokens 4); profiled=("${timed[@]}"); floor=3e-4
else
    timed=(--prompt-tokens 128 --gen-tokens "$GEN"); profiled=(--prompt-tokens 128 --gen-tokens 16); floor=1e-4
fi
for v in ${CONFORM:-}; do
    name=${v%%:*}; envs=(); [ "$v" != "$name" ] && IFS=, read -ra envs <<<"${v#*:}"
    env "${envs[@]}" TANDEM_CONFORMANCE_VALIDATION=0 TANDEM_CONFORMANCE_BACKENDS=vulkan \
        timeout 240 "${builds[0]}/t/deps/conformance" >"$OUT/c-$name.txt" 2>&1
    echo "conformance $name rc=$? $(grep -E '^test result' "$OUT/c-$name.txt" | head -1)"
    grep -E "panicked|FAILED|failed" "$OUT/c-$name.txt" | head -5
done
for cell in ${CELLS-gemma3-4b:q4_k}; do
    shape=${cell%%:*}; dt=${cell##*:}; g=${WORK:-/tmp}/$shape-$dt.gguf
    mkdir -p "$(dirname "$g")"
    if [ ! -s "$g" ]; then
        "${builds[0]}/engine" synth --shape "$shape" --dtype "$dt" --out "$g" --force >/dev/null || { echo "$cell: synth failed"; continue; }
    fi
    for r in $(seq "$ROUNDS"); do
        for b in "${builds[@]}"; do
            for v in ${VARIANTS:-base}; do
                name=${v%%:*}; envs=(); [ "$v" != "$name" ] && IFS=, read -ra envs <<<"${v#*:}"
                tag="$shape-$dt-$(basename "$b")-$name-$r"
                env "${envs[@]}" timeout 300 "$b/engine" bench --model "$g" --backend vulkan "${timed[@]}" \
                    --repeat 3 --json >"$OUT/b-$tag.json" 2>"$OUT/e-$tag.txt"
                env "${envs[@]}" timeout 300 "$b/engine" bench --model "$g" --backend vulkan "${profiled[@]}" \
                    --repeat 1 --profile --json >"$OUT/p-$tag.json" 2>/dev/null
                python3 - "$OUT/b-$tag.json" "$OUT/p-$tag.json" "$tag" "$PHASE" "$floor" <<'PY'
import json, sys
tag, phase, floor = sys.argv[3], sys.argv[4], float(sys.argv[5])
try:
    b = json.load(open(sys.argv[1]))["runs"][0]
except Exception as e:
    print(tag, "failed", e); sys.exit()
try:
    prof = json.load(open(sys.argv[2]))["runs"][0].get("profile", {}).get(phase, [])
except Exception:
    prof = []
ops = {x["op"].split(":")[-1]: round(x["seconds"] * 1000, 2) for x in prof if x["seconds"] > floor}
extra = f" p50 ms {round(b['token_latency_ms']['p50'], 3)}" if phase == "decode" else ""
print(tag, phase, round(b[f"{phase}_tokens_per_s"]["median"], 1), extra, ops)
PY
            done
        done
    done
    [ "${KEEP:-0}" = 1 ] || rm -f "$g"
done
