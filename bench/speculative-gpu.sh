#!/usr/bin/env bash
# bench/speculative-gpu.sh: speculative decoding's figures on the GPU machine (issue 57), in one
# device call: for each target shape, the verification cost curve on Vulkan (`engine bench
# --verify-rows 16`: one step of 1..16 rows of one sequence against one row, and the speedups it
# predicts at acceptance 0.5-0.9 for a draft that runs ahead); the draft's decode step on the CPU
# and on Vulkan (`engine bench` of the 270M shape, batch 1); and end to end, the target drafting
# for itself from the CPU (acceptance near 1 on greedy: the same weights; the draft runs ahead),
# `engine run --json` with and without `--draft-model`, so that the overlap shows.
#
# Here: `bash bench/package-device.sh .bench/new` (the release build, stripped) and the Vulkan
# loader debs in .gl/ (bench/device.sh). There (the device tool's `run`, carrying .bench and .gl):
#   SHAPES="gemma3-1b gemma3-4b gemma3-27b" ENGINE=.bench/new/engine bash bench/speculative-gpu.sh
# The models are `engine synth` files of real shapes (q4_k), written there and deleted after use.
#
# Parameters: SHAPES, ENGINE (.bench/new/engine), ROWS (16), PROMPT_TOKENS (512), GEN_TOKENS
# (128), REPEAT (3), E2E ("gemma3-1b": the shapes run end to end; 27B's own draft on the CPU is
# slower than its target), WORK (/tmp/spec), OUT.
set -uo pipefail
SHAPES=${SHAPES:-"gemma3-1b gemma3-4b gemma3-27b"}
E=${ENGINE:-.bench/new/engine}
ROWS=${ROWS:-16}
P=${PROMPT_TOKENS:-512}
G=${GEN_TOKENS:-128}
R=${REPEAT:-3}
E2E=${E2E:-gemma3-1b}
WORK=${WORK:-/tmp/spec}
OUT=${OUT:-$PWD/spec-gpu-out}
mkdir -p "$OUT" "$WORK"
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
chmod +x "$E" 2>/dev/null
echo "SHAPES=\"$SHAPES\" ROWS=$ROWS PROMPT_TOKENS=$P GEN_TOKENS=$G REPEAT=$R E2E=\"$E2E\" bash bench/speculative-gpu.sh" >"$OUT/command.txt"

# The draft's decode step (the 270M shape), on the CPU and on Vulkan.
"$E" synth --shape gemma3-270m --dtype q4_k --out "$WORK/draft.gguf" >/dev/null
for b in cpu vulkan; do
    "$E" bench --model "$WORK/draft.gguf" --backend "$b" --prompt-tokens "$P" --gen-tokens "$G" \
        --repeat "$R" --json --out "$OUT/draft-270m-$b.json" >/dev/null 2>"$OUT/draft-270m-$b.log"
done
for shape in $SHAPES; do
    m="$WORK/$shape.gguf"
    "$E" synth --shape "$shape" --dtype q4_k --out "$m" >/dev/null
    "$E" bench --model "$m" --backend vulkan --prompt-tokens "$P" --gen-tokens "$G" --repeat "$R" \
        --verify-rows "$ROWS" --out "$OUT/verify-$shape.json" >"$OUT/verify-$shape.txt" 2>&1
    if [[ " $E2E " == *" $shape "* ]]; then
        # Synthetic models have no tokenizer: token ids in.
        tokens=$(seq 2 201 | paste -sd, -)
        "$E" run --model "$m" --backend vulkan --tokens "$tokens" --max-tokens "$G" --temperature 0 --json \
            >"$OUT/e2e-$shape-plain.json" 2>/dev/null
        for overlap in on off; do
            "$E" run --model "$m" --backend vulkan --tokens "$tokens" --max-tokens "$G" --temperature 0 --json \
                --draft-model "$m" --draft-backend cpu --draft-tokens 4 --draft-fixed --draft-overlap "$overlap" \
                >"$OUT/e2e-$shape-self-draft-overlap-$overlap.json" 2>/dev/null
        done
    fi
    rm -f "$m"
done
for f in "$OUT"/verify-*.txt; do echo "== $f"; tail -16 "$f"; done
for f in "$OUT"/e2e-*.json; do
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], round(d['decode_tokens_per_second'],1), d.get('speculation'))" "$f"
done
for f in "$OUT"/draft-270m-*.json; do
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); r=d['runs'][0]; print(sys.argv[1], 'decode', round(r['decode_tokens_per_s']['median'],1), 'tok/s, p50', round(r['token_latency_ms']['p50'],3), 'ms')" "$f"
done
