#!/usr/bin/env bash
# bench/auto-layers.sh: `--backend auto` by measurement over layer splits, on the GPU machine (the
# device tool's `run`). A model that does not fit the GPU's budget whole (4B q4_k under
# `[backend.vulkan] memory_limit = LIMIT`) is placed by `auto`: it measures each placement that
# fits (Vulkan with as many layers as fit it and the rest on the CPU; the CPU alone) and keeps
# the fastest decode. Then `engine run --backend auto` (answered from the calibration cache) and
# `engine bench` on each candidate named explicitly, for the same figures measured the long way.
#
# Expects, carried with the working tree: .devcarry/engine and its plugins, .gl/*.deb (the
# Vulkan loader, see bench/device.sh).
# Outputs in $OUT: placement.txt (`engine placement --backend auto`, notes included),
# run.stderr, calibration.json (the cache auto wrote), bench-*.json, auto-layers.log.
# Parameters: SHAPE (gemma3-4b), LIMIT (1536MiB), PROMPT_TOKENS (256), GEN_TOKENS (64).
set -u
SHAPE=${SHAPE:-gemma3-4b}
LIMIT=${LIMIT:-1536MiB}
P=${PROMPT_TOKENS:-256}
G=${GEN_TOKENS:-64}
E=${ENGINE:-.devcarry/engine}
OUT=${OUT:-/tmp/auto-layers-out}
W=/tmp/tandem-auto-layers
mkdir -p "$OUT" "$W"
export TANDEM_CACHE_DIR=$W/cache
rm -rf "$TANDEM_CACHE_DIR"
COMMAND="SHAPE=$SHAPE LIMIT=$LIMIT PROMPT_TOKENS=$P GEN_TOKENS=$G bash bench/auto-layers.sh"
{
echo "$COMMAND"
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
chmod +x "$E" 2>/dev/null
"$E" --version
"$E" backends
g=$W/$SHAPE-q4_k.gguf
if [ ! -s "$g" ]; then
    s=$(date +%s)
    "$E" synth --shape "$SHAPE" --dtype q4_k --out "$g" >/dev/null || { echo "synth failed"; exit 1; }
    echo "== synth in $(($(date +%s) - s)) s, $(du -h "$g" | cut -f1)"
fi
lim=$W/limit.toml
printf '[backend.vulkan]\nmemory_limit = "%s"\n' "$LIMIT" >"$lim"
ctx=$((P + G + 1))
echo "== engine placement --backend auto (memory_limit $LIMIT, --context $ctx)"
s=$(date +%s)
timeout -k 10 300 "$E" --config "$lim" placement --model "$g" --backend auto --context "$ctx" >"$OUT/placement.txt" 2>&1 ||
    echo "   engine placement failed (rc $?)"
echo "   $(($(date +%s) - s)) s (calibration included)"
sed 's/^/   | /' "$OUT/placement.txt"
cp "$TANDEM_CACHE_DIR/calibration.json" "$OUT/" 2>/dev/null || echo "   no calibration.json"
echo "== engine run --backend auto (the cache answers)"
s=$(date +%s)
timeout -k 10 120 "$E" --config "$lim" run --model "$g" --backend auto --tokens 2,818,5279,529,7001,563 \
    --max-tokens 16 --temperature 0 --context "$ctx" >"$W/run.txt" 2>"$OUT/run.stderr" || echo "   engine run failed (rc $?)"
echo "   $(($(date +%s) - s)) s"
sed 's/^/   | /' "$OUT/run.stderr"
# The candidates named explicitly, measured by engine bench.
python3 - "$OUT/calibration.json" >"$W/cands" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception:
    sys.exit(0)
for f in d["entries"][0]["figures"]:
    n = f.get("gpu_layers")
    print(f["placement"] + (f" {n}" if n is not None else ""))
PY
while read -r backend n; do
    label=$backend${n:+-ngl$n}
    echo "== engine bench --backend $backend ${n:+--gpu-layers $n} (-p $P -n $G, warm-up then 2 repeats)"
    timeout -k 10 150 "$E" --config "$lim" bench --model "$g" --backend "$backend" ${n:+--gpu-layers "$n"} \
        --prompt-tokens "$P" --gen-tokens "$G" --batch 1 --repeat 2 --json >"$OUT/bench-$label.json" 2>"$W/bench.err" ||
        { echo "   failed (rc $?)"; tail -3 "$W/bench.err"; }
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print("  ", {k: v for k, v in d.items() if "per_s" in k or "tokens_per" in k})' \
        "$OUT/bench-$label.json" 2>/dev/null
done <"$W/cands"
} 2>&1 | tee "$OUT/auto-layers.log"
