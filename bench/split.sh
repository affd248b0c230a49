#!/usr/bin/env bash
# bench/split.sh: what splitting a model across units costs, on the GPU machine (the device tool's
# `run`), in one run on the same files.
#
# Expects, carried with the working tree: the stripped release engine and its plugins in
# $CARRY (default .devcarry/), and .gl/*.deb (the Vulkan loader, see bench/device.sh).
# For each shape in SHAPES (q4_k, `engine synth`):
#   1. the greedy continuation of a fixed prompt on every placement in PLACEMENTS (they must agree);
#   2. `engine bench` for each placement in ROUNDS, interleaved (vulkan, vulkan+vulkan, vulkan, ...),
#      batches BATCHES, PROMPT_TOKENS prefill, GEN_TOKENS generated, REPEAT timed repeats. A round
#      `A+B@mbN` runs with `[placement] micro_batches = N` (decode pipelined across the units).
# The JSON results (in results.tar.gz) and the log come back under $OUT.
set -uo pipefail
CARRY=${CARRY:-.devcarry}
E=$CARRY/engine
SHAPES=${SHAPES:-"gemma3-1b gemma3-4b"}
PLACEMENTS=${PLACEMENTS:-"vulkan vulkan+vulkan cpu+vulkan"}
ROUNDS=${ROUNDS:-"vulkan vulkan+vulkan vulkan vulkan+vulkan cpu+vulkan"}
BATCHES=${BATCHES:-1,8}
PROMPT_TOKENS=${PROMPT_TOKENS:-512}
GEN_TOKENS=${GEN_TOKENS:-128}
REPEAT=${REPEAT:-3}
W=${WORK:-/tmp/tandem-split}
OUT=${OUT:-$PWD/split-out}
mkdir -p "$W" "$OUT"
{
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
"$E" backends
for s in $SHAPES; do
    g=$W/$s-q4_k.gguf
    [ -s "$g" ] || "$E" synth --shape "$s" --dtype q4_k --out "$g" >/dev/null || { echo "synth $s failed"; continue; }
    echo "== greedy $s"
    for b in $PLACEMENTS; do
        printf '%-14s ' "$b"
        "$E" run --model "$g" --backend "$b" --tokens 2,1000,2000,3000,4000 --max-tokens 16 --context 64 --json 2>/dev/null |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])' || echo failed
    done
    i=0
    for round in $ROUNDS; do
        i=$((i + 1))
        b=${round%@*}
        cfg=()
        case $round in
            *@mb*) n=${round##*@mb}; printf '[placement]\nmicro_batches = %s\n' "$n" >"$W/mb$n.toml"; cfg=(--config "$W/mb$n.toml") ;;
        esac
        echo "== bench $s $round (round $i)"
        timeout 300 "$E" "${cfg[@]}" bench --model "$g" --backend "$b" --prompt-tokens "$PROMPT_TOKENS" \
            --gen-tokens "$GEN_TOKENS" --batch "$BATCHES" --repeat "$REPEAT" --out "$OUT/$s-$round-$i.json"
    done
    rm -f "$g"
done
# The device tool brings back at most 8 files: the JSON results travel as one archive.
(cd "$OUT" && tar -czf results.tar.gz ./*.json && rm -f ./*.json)
} 2>&1 | tee "$OUT/split.log"
