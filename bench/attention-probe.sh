#!/usr/bin/env bash
# bench/attention-probe.sh: where prefill attention's time goes on the GPU machine (issue 54).
# For each SHAPES entry (an `engine synth` file) and each CFGS entry (label=ENV,ENV... or
# label=- ; `kv16` in a label adds `--kv-cache f16`), one `engine bench --profile` prefill step
# of 512 rows on the Vulkan backend, printing the attention op's time and the step's total.
# `TANDEM_VULKAN_ATTN_MODE` bits skip parts of `attention_coopmat` (1 the score products, 2 the
# P V products, 4 the global loads after the first tile, 8 the output stores: wrong results,
# times only).
# Here: `bash bench/package-device.sh .bench/new`; there (carrying .bench/new and .gl):
#   CFGS="base=- scores=TANDEM_VULKAN_ATTN_MODE=1" bash bench/attention-probe.sh
# Parameters (environment): BIN (.bench/new), SHAPES ("gemma3-4b:q4_k"), CFGS, PATH_ENV
# (TANDEM_VULKAN_COOPMAT2=0: the KHR path), WORK (/tmp/ap), OUT (its log: attention-probe.txt).
set -uo pipefail
BIN=${BIN:-.bench/new}
SHAPES=${SHAPES:-"gemma3-4b:q4_k"}
CFGS=${CFGS:-"base=-"}
WORK=${WORK:-/tmp/ap}
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT" "$WORK"
log="$OUT/attention-probe.txt"
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
export ${PATH_ENV:-TANDEM_VULKAN_COOPMAT2=0}
chmod +x "$BIN/engine"
for pair in $SHAPES; do
    IFS=: read -r shape dtype <<<"$pair"
    gguf="$WORK/$shape-$dtype.gguf"
    "$BIN/engine" synth --shape "$shape" --dtype "$dtype" --out "$gguf" --force >/dev/null || continue
    for cfg in $CFGS; do
        label=${cfg%%=*}
        envs=${cfg#*=}
        envs=${envs//,/ }
        [ "$envs" = "-" ] && envs=""
        extra=()
        [[ $label == *kv16* ]] && extra=(--kv-cache f16)
        env $envs timeout 120 "$BIN/engine" bench --model "$gguf" --backend vulkan --prompt-tokens 512 \
            --gen-tokens 4 --chunk 512 --repeat 2 --profile --json "${extra[@]}" >"$WORK/p.json" 2>"$WORK/e.txt" \
            || { echo "$pair $label failed: $(tail -2 "$WORK/e.txt")" | tee -a "$log"; continue; }
        python3 - "$WORK/p.json" "$pair" "$label" <<'PY' | tee -a "$log"
import json, sys
run = json.load(open(sys.argv[1]))["runs"][0]
ops = {o["op"]: o["seconds"] * 1e3 for o in run["profile"]["prefill"]}
attn = sum(v for k, v in ops.items() if k.startswith("attention"))
print("%-16s %-12s attention %7.3f ms  step %7.2f ms  prefill %9.1f tok/s" % (
    sys.argv[2], sys.argv[3], attn, sum(ops.values()), run["prefill_tokens_per_s"]["median"]))
PY
    done
    rm -f "$gguf"
done
