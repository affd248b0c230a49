#!/usr/bin/env bash
# bench/split-order-probe.sh: which end of a layer split the GPU should hold (issue 55's split
# decode), tandem only, on the GPU machine. `--gpu-layers N` puts the embedding, layers 0..N-1
# and the head on the GPU, so a decode step crosses to the CPU and back and submits GPU work
# twice; llama.cpp's `-ngl` puts the last layers and the head there (one crossing, one
# submission). The latter is `[placement.layers]` with `--backend auto` (no code needed). For
# SHAPE (gemma3-1b) q4_k with N = NGL (13) of L = LAYERS (26): the greedy ids of one prompt on
# both placements, then ROUNDS (2) alternating rounds of `engine bench` on each. Prints each
# run's prefill and decode medians; JSON under $OUT.
# Here: `bash bench/package-device.sh .bench/new`. There (carrying .bench/new and .gl):
#   bash bench/split-order-probe.sh
set -uo pipefail
SHAPE=${SHAPE:-gemma3-1b}; NGL=${NGL:-13}; LAYERS=${LAYERS:-26}; ROUNDS=${ROUNDS:-2}
OUT=${OUT:-$PWD/bench-out}; E=${ENGINE:-.bench/new/engine}
mkdir -p "$OUT"; chmod +x "$E"; . "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh" >/dev/null 2>&1
g=/tmp/$SHAPE-q4_k.gguf
"$E" synth --shape "$SHAPE" --dtype q4_k --out "$g" --force >/dev/null || exit 1
cat >"$OUT/last.toml" <<TOML
[placement.layers]
cpu = "0-$((LAYERS - NGL - 1))"
vulkan = "$((LAYERS - NGL))-$((LAYERS - 1))"
embedding = "cpu"
head = "vulkan"
TOML
# Global flags (the config) before the subcommand, its flags after.
declare -A pre=([first]="" [last]="--config $OUT/last.toml")
declare -A post=([first]="--backend vulkan --gpu-layers $NGL" [last]="--backend auto")
for name in first last; do
    # shellcheck disable=SC2086
    ids=$(timeout 60 "$E" ${pre[$name]} run --model "$g" ${post[$name]} --tokens 2,100,200,300,400 \
        --max-tokens 16 --temperature 0 --context 64 --json 2>"$OUT/$name-run.err" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])' 2>/dev/null)
    echo "$name greedy: ${ids:-failed ($(tail -1 "$OUT/$name-run.err"))}"
done
for r in $(seq "$ROUNDS"); do
    for name in first last; do
        # shellcheck disable=SC2086
        timeout 120 "$E" ${pre[$name]} bench --model "$g" ${post[$name]} --prompt-tokens 64 --gen-tokens 64 --repeat 2 --json \
            >"$OUT/$name-$r.json" 2>"$OUT/$name-$r.err"
        python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['runs'][0]; print(sys.argv[2], 'prefill', round(r['prefill_tokens_per_s']['median'],1), 'decode', round(r['decode_tokens_per_s']['median'],1))" "$OUT/$name-$r.json" "$name-$r" 2>/dev/null || { echo "$name-$r failed"; tail -3 "$OUT/$name-$r.err"; }
    done
done
