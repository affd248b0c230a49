#!/usr/bin/env bash
# bench/vs-llamacpp.sh: tandem's Vulkan backend beside llama.cpp's, in one device run on the same
# `engine synth` files (issue 21's measurement).
#
# Here, first: `../shared/peers/prepare-llamacpp-vulkan.sh .peer` (the llama.cpp kit, git-ignored),
# a release build stripped into .devcarry/ (engine and the plugins), and the Vulkan loader debs in
# .gl/ (see bench/device.sh). There (the device tool's `run`, carrying .peer .devcarry .gl):
#   SHAPES="gemma3-1b:q4_k gemma3-4b:q4_k" bash bench/vs-llamacpp.sh
# For each shape:dtype it writes one GGUF, warms llama.cpp up (its first run on a fresh machine is
# up to 3x slower in prefill), runs `llama-bench -p 512 -n 128 -fa 1 -ngl 99 -r 3`, then
# `engine bench --backend vulkan` (one warm-up repetition, then REPEAT timed) with the same prompt
# and generation lengths at batch 1 (and BATCHES), and deletes the file. $OUT gets the JSON of both,
# report.md with the ratios, and build.log.
#
# Parameters (environment): SHAPES (shape:dtype[:batches] triples), ENGINE (.devcarry/engine), PEER (.peer),
# BATCHES (1: tandem's batch sizes, comma-separated), REPEAT (3), CHUNK (512: tandem's prefill
# chunk, llama.cpp's default batch), WORK (/tmp/vs), OUT.
set -uo pipefail
SHAPES=${SHAPES:-"gemma3-1b:q4_k"}
ENGINE=${ENGINE:-.devcarry/engine}
PEER=${PEER:-.peer}
BATCHES=${BATCHES:-1}
REPEAT=${REPEAT:-3}
CHUNK=${CHUNK:-512}
WORK=${WORK:-/tmp/vs}
OUT=${OUT:-$PWD/bench-out}
mkdir -p "$OUT" "$WORK"

. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
chmod +x "$ENGINE" 2>/dev/null

t0=$(date +%s)
OUTDIR=$OUT bash "$PEER/build-and-bench.sh" || { echo "llama.cpp did not build"; exit 1; }
echo "peer built in $(( $(date +%s) - t0 )) s"
llama=/tmp/lcpp/build/bin/llama-bench
# The peer's Vulkan loader, for llama-bench only (tandem uses the one from .gl).
peer_env=(env LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu)

for pair in $SHAPES; do
    IFS=: read -r shape dtype batches <<<"$pair"
    batches=${batches:-$BATCHES}
    gguf="$WORK/$shape-$dtype.gguf"
    echo "== $shape $dtype"
    "$ENGINE" synth --shape "$shape" --dtype "$dtype" --out "$gguf" --force >/dev/null || { echo "synth failed"; continue; }
    "${peer_env[@]}" "$llama" -m "$gguf" -p 512 -n 32 -fa 1 -ngl 99 -r 1 >/dev/null 2>&1 || true
    "${peer_env[@]}" "$llama" -m "$gguf" -p 512 -n 128 -fa 1 -ngl 99 -r 3 -o json \
        >"$OUT/llamacpp-$shape-$dtype.json" 2>>"$OUT/build.log" || echo "llama-bench failed on $shape $dtype"
    timeout 400 "$ENGINE" bench --model "$gguf" --backend vulkan --prompt-tokens 512 --gen-tokens 128 \
        --batch "$batches" --chunk "$CHUNK" --repeat "$REPEAT" --json >"$OUT/tandem-$shape-$dtype.json" \
        || echo "engine bench failed on $shape $dtype"
    rm -f "$gguf"
done

python3 - "$OUT" <<'PY' | tee "$OUT/report.md"
import glob, json, os, sys
out = sys.argv[1]
print("| shape | tandem prefill 512 | llama.cpp pp512 | ratio | tandem decode b1 | llama.cpp tg128 | ratio | other batches (tok/s) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for t in sorted(glob.glob(f"{out}/tandem-*.json")):
    name = os.path.basename(t)[len("tandem-"):-len(".json")]
    try:
        runs = json.load(open(t))["runs"]
    except Exception as e:
        print(f"| {name} | no tandem result ({e}) | | | | | | |")
        continue
    b1 = next((r for r in runs if r["batch"] == 1), runs[0])
    tp, td = b1["prefill_tokens_per_s"]["median"], b1["decode_tokens_per_s"]["median"]
    lp = ld = None
    try:
        for r in json.load(open(f"{out}/llamacpp-{name}.json")):
            if r["n_prompt"] > 0 and r["n_gen"] == 0:
                lp = r["avg_ts"]
            if r["n_gen"] > 0 and r["n_prompt"] == 0:
                ld = r["avg_ts"]
    except Exception:
        pass
    fmt = lambda v: "-" if v is None else f"{v:,.1f}"
    ratio = lambda a, b: "-" if b is None else f"{a / b:.2f}"
    others = ", ".join(f"b{r['batch']}: {r['decode_tokens_per_s']['median']:,.0f}" for r in runs if r["batch"] != 1)
    print(f"| {name} | {fmt(tp)} | {fmt(lp)} | {ratio(tp, lp)} | {fmt(td)} | {fmt(ld)} | {ratio(td, ld)} | {others} |")
PY
