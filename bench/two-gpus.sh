#!/usr/bin/env bash
# bench/two-gpus.sh: a model split by layers across two GPUs, tandem beside llama.cpp's default
# multi-GPU layer split, in one device call on the two-GPU machine (the device tool's kind
# nvidia-h200-x2 or nvidia-h100-x2; issue 55's two-GPU table).
#
# Here, first: `bench/package-device.sh .bench/new` and `../shared/peers/prepare-llamacpp-vulkan.sh
# .peer`; carry [".bench", ".gl", ".peer"]. There:
#   SHAPE=gemma3-27b:q4_k bash bench/two-gpus.sh
# It writes one GGUF, then:
#   1. llama-bench -p 512 -n 128 -fa 1 -ngl 99 -sm layer (both GPUs; a warm-up run first);
#   2. tandem with `[backend.vulkan] devices = [0, 1]` (one instance per GPU, the layers spread
#      by their memory: halves on two like GPUs, the embedding on the first, the head on the
#      second), `engine bench --backend vulkan --prompt-tokens 512 --gen-tokens 128 --chunk 512`
#      (a warm-up repetition, REPEAT timed); then, for each N of PIECES, the same with
#      `[placement] prefill_micro_batches = N` (the prompt step in N pieces pipelined over the
#      two GPUs); then the same on one GPU alone where it fits, for scale.
# The 27B synth takes one to three minutes there; KEEP=1 leaves the file in WORK for the next
# call on a machine still warm (the script then skips the synth).
# $OUT gets report.md (every ratio ours / peer) and results.tar.gz (the JSON).
#
# Parameters (environment): SHAPE (gemma3-27b:q4_k), ENGINE (.bench/new/engine), PEER (.peer), REPEAT (3),
# PIECES ("2 4"), KEEP (0), WORK (/tmp/tg), OUT.
set -uo pipefail
SHAPE=${SHAPE:-gemma3-27b:q4_k}
ENGINE=${ENGINE:-.bench/new/engine}
PEER=${PEER:-.peer}
REPEAT=${REPEAT:-3}
PIECES=${PIECES-2 4}
KEEP=${KEEP:-0}
WORK=${WORK:-/tmp/tg}
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT" "$WORK"

. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
chmod +x "$ENGINE"
TARGETS="llama-bench" OUTDIR=$OUT bash "$PEER/build-and-bench.sh" >"$OUT/build.log" 2>&1 || { echo "llama.cpp did not build"; tail -20 "$OUT/build.log"; exit 1; }
llama=/tmp/lcpp/build/bin/llama-bench
peer_env=(env LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu)

IFS=: read -r shape dtype <<<"$SHAPE"
gguf="$WORK/$shape-$dtype.gguf"
if [ ! -s "$gguf" ]; then
    "$ENGINE" synth --shape "$shape" --dtype "$dtype" --out "$gguf" --force >/dev/null || { echo "synth failed"; exit 1; }
fi
printf '[backend.vulkan]\ndevices = [0, 1]\n' >"$WORK/two.toml"

"${peer_env[@]}" "$llama" -m "$gguf" -p 512 -n 16 -fa 1 -ngl 99 -sm layer -r 1 >/dev/null 2>&1
"${peer_env[@]}" "$llama" -m "$gguf" -p 512 -n 128 -fa 1 -ngl 99 -sm layer -r "$REPEAT" -o json \
    >"$OUT/llamacpp-two.json" 2>>"$OUT/build.log" || echo "llama-bench failed"
"$ENGINE" --config "$WORK/two.toml" placement --model "$gguf" --backend vulkan >"$OUT/placement.txt" 2>&1
timeout 500 "$ENGINE" --config "$WORK/two.toml" bench --model "$gguf" --backend vulkan --prompt-tokens 512 \
    --gen-tokens 128 --chunk 512 --repeat "$REPEAT" --json >"$OUT/tandem-two.json" || echo "engine bench (two GPUs) failed"
for n in $PIECES; do
    printf '[backend.vulkan]\ndevices = [0, 1]\n[placement]\nprefill_micro_batches = %s\n' "$n" >"$WORK/two-$n.toml"
    timeout 500 "$ENGINE" --config "$WORK/two-$n.toml" bench --model "$gguf" --backend vulkan --prompt-tokens 512 \
        --gen-tokens 128 --chunk 512 --repeat "$REPEAT" --json >"$OUT/tandem-two-$n.json" ||
        echo "engine bench (two GPUs, $n pieces) failed"
done
timeout 300 "$ENGINE" bench --model "$gguf" --backend vulkan --prompt-tokens 512 --gen-tokens 128 --chunk 512 \
    --repeat "$REPEAT" --json >"$OUT/tandem-one.json" || echo "engine bench (one GPU) failed"
[ "$KEEP" = 1 ] || rm -f "$gguf"

python3 - "$OUT" "$SHAPE" "$PIECES" <<'PY' | tee "$OUT/report.md"
import json, os, sys
out, shape, pieces = sys.argv[1], sys.argv[2], sys.argv[3].split()
def tandem(name):
    try:
        r = json.load(open(f"{out}/tandem-{name}.json"))["runs"][0]
        return r["prefill_tokens_per_s"]["median"], r["decode_tokens_per_s"]["median"]
    except Exception:
        return None, None
lp = ld = None
try:
    for x in json.load(open(f"{out}/llamacpp-two.json")):
        if x["n_prompt"] > 0 and x["n_gen"] == 0:
            lp = x["avg_ts"]
        if x["n_gen"] > 0 and x["n_prompt"] == 0:
            ld = x["avg_ts"]
except Exception:
    pass
cell = lambda a, b: "-" if a is None else (f"{a:,.1f} / -" if b is None else f"{a:,.1f} / {b:,.1f} = {a / b:.2f}")
print(f"GPUs: {open(f'{out}/gpu.txt').read().strip()}\n")
print("| shape | tandem | prefill 512: ours / llama.cpp -sm layer | decode: ours / llama.cpp |")
print("| --- | --- | --- | --- |")
rows = [("two", "two GPUs, devices = [0, 1]")]
rows += [(f"two-{n}", f"two GPUs, prompt in {n} pieces (prefill_micro_batches = {n})") for n in pieces]
rows += [("one", "one GPU (scale)")]
for name, label in rows:
    p, d = tandem(name)
    print(f"| {shape} | {label} | {cell(p, lp)} | {cell(d, ld)} |")
PY
tar -czf "$OUT/results.tar.gz" -C "$OUT" $(cd "$OUT" && ls *.json) && rm -f "$OUT"/*.json
