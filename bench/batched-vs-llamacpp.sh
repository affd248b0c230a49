#!/usr/bin/env bash
# bench/batched-vs-llamacpp.sh: batched decode on the GPU (issue 31's measurement): tandem's Vulkan
# backend at batches 1, 8 and 32 beside `llama-batched-bench`, in one device run on the same
# `engine synth` files.
#
# Here, first: `../shared/peers/prepare-llamacpp-vulkan.sh .peer` (the llama.cpp kit), a release
# build stripped into .devcarry/ (engine, libtandem_backend_vulkan.so, libtandem_backend_cpu.so)
# and the Vulkan loader debs in .gl/ (see bench/device.sh); optionally a baseline build (another
# commit) stripped the same way into .devbase/, run beside it in the same call. There (the device
# tool's `run`, carrying .peer .devcarry .gl [.devbase]):
#   SHAPES="gemma3-1b gemma3-4b" bash bench/batched-vs-llamacpp.sh
# For each shape and weight format: one GGUF; `llama-batched-bench -npp P -ntg G -npl BATCHES -fa on -ngl 99`
# (after an untimed run at every batch size; S_TG is its decode rate over all sequences, S_PP its
# prefill rate); then `engine bench --backend vulkan --batch BATCHES` (one warm-up repetition,
# then REPEAT timed) with the same prompt and generation lengths, for .devcarry and .devbase.
# $OUT gets llama.cpp's JSON lines, tandem's JSON, summary.tsv (shape, engine, batch, prefill,
# decode) and batched.log.
#
# Parameters (environment): SHAPES ("gemma3-1b gemma3-4b"), BATCHES ("1,8,32"), PROMPT_TOKENS
# (512), GEN_TOKENS (128), REPEAT (2), KV (tandem's KV cache types, "f32 f16"; llama.cpp keeps
# its default f16), DTYPES (weight formats, "q4_k"; f16 too for the issue's 4B f16 row), PEER
# (.peer), OUT.
set -uo pipefail
SHAPES=${SHAPES:-"gemma3-1b gemma3-4b"}
BATCHES=${BATCHES:-1,8,32}
P=${PROMPT_TOKENS:-512}
G=${GEN_TOKENS:-128}
R=${REPEAT:-2}
# tandem's KV cache types: its default f32, and f16 (llama.cpp's default cache type).
KV=${KV:-"f32 f16"}
DTYPES=${DTYPES:-q4_k}
PEER=${PEER:-.peer}
OUT=${OUT:-$PWD/batched-out}
W=/tmp/tandem-batched
mkdir -p "$OUT" "$W"
{
echo "SHAPES=\"$SHAPES\" BATCHES=$BATCHES PROMPT_TOKENS=$P GEN_TOKENS=$G REPEAT=$R bash bench/batched-vs-llamacpp.sh"
. "$(dirname "${BASH_SOURCE[0]}")/vulkan-env.sh"
LLAMA=/tmp/lcpp/build/bin/llama-batched-bench
if [ ! -x "$LLAMA" ]; then
    OUTDIR=$W/peer TARGETS="llama-bench llama-batched-bench" MODELS="" bash "$PEER/build-and-bench.sh" >"$W/peer-build.log" 2>&1 ||
        { tail -20 "$W/peer-build.log"; echo "llama-batched-bench did not build"; }
    grep -h "built in" "$W/peer-build.log"
fi
# The kit's Vulkan loader for llama.cpp's build.
[ -d /tmp/vk/usr/lib/x86_64-linux-gnu ] && export LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
max_b=$(tr ',' '\n' <<<"$BATCHES" | sort -n | tail -1)
ctx=$((max_b * (P + G)))
printf 'shape\tengine\tbatch\tprefill_tok_s\tdecode_tok_s\n' >"$OUT/summary.tsv"
for combo in $(for s in $SHAPES; do for d in $DTYPES; do echo "$s:$d"; done; done); do
    shape=${combo%%:*}-${combo##*:}
    g=$W/$shape.gguf
    [ -s "$g" ] || .devcarry/engine synth --shape "${combo%%:*}" --dtype "${combo##*:}" --out "$g" >/dev/null || { echo "synth $shape failed"; continue; }
    echo "== $shape: llama-batched-bench -npp $P -ntg $G -npl $BATCHES -c $ctx -fa on -ngl 99"
    # Warm-up at every batch size: llama.cpp builds some pipelines on a shape's first use (in
    # 2026-11-25's run, warmed at one sequence only, its first 8-sequence prefill took 13 s).
    "$LLAMA" -m "$g" -npp "$P" -ntg 16 -npl "$BATCHES" -c "$ctx" -fa on -ngl 99 >/dev/null 2>&1
    "$LLAMA" -m "$g" -npp "$P" -ntg "$G" -npl "$BATCHES" -c "$ctx" -fa on -ngl 99 --output-format jsonl \
        2>"$W/llama.err" | grep '^{' >"$OUT/$shape-llamacpp.jsonl" || { echo "   llama-batched-bench failed"; tail -3 "$W/llama.err"; }
    python3 - "$OUT/$shape-llamacpp.jsonl" "$shape" >>"$OUT/summary.tsv" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{sys.argv[2]}\tllamacpp\t{r['pl']}\t{r['speed_pp']:.1f}\t{r['speed_tg']:.1f}")
PY
    for eng in devcarry devbase; do
        [ -x ".$eng/engine" ] || continue
        for kv in $KV; do
        echo "== $shape: .$eng/engine bench --backend vulkan --batch $BATCHES --prompt-tokens $P --gen-tokens $G --repeat $R --kv-cache $kv"
        timeout 500 ".$eng/engine" bench --model "$g" --backend vulkan --batch "$BATCHES" --prompt-tokens "$P" \
            --gen-tokens "$G" --repeat "$R" --kv-cache "$kv" --json --out "$OUT/$shape-tandem-$eng-$kv.json" >/dev/null 2>"$W/tandem.err" ||
            { echo "   engine bench failed"; tail -3 "$W/tandem.err"; }
        python3 - "$OUT/$shape-tandem-$eng-$kv.json" "$shape" "tandem-$eng-kv-$kv" >>"$OUT/summary.tsv" <<'PY'
import json, sys
try:
    runs = json.load(open(sys.argv[1]))["runs"]
except Exception:
    sys.exit(0)
for r in runs:
    print(f"{sys.argv[2]}\t{sys.argv[3]}\t{r['batch']}\t{r['prefill_tokens_per_s']['median']:.1f}\t{r['decode_tokens_per_s']['median']:.1f}")
PY
        done
    done
    grep "^$shape" "$OUT/summary.tsv"
done
} 2>&1 | tee "$OUT/batched.log"
