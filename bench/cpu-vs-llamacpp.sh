#!/usr/bin/env bash
# bench/cpu-vs-llamacpp.sh: tandem's CPU backend beside llama.cpp's CPU path, in one run on the
# same `engine synth` files (issue 30's measurement), here (2 cores) or on the GPU machine's host
# (the device tool's `run`, carrying .devcarry and .peer; there llama-bench is built from the kit
# with Vulkan and the GPU is hidden from it: `VK_DRIVER_FILES=/nonexistent -ngl 0`, as
# ../shared/peers/README.md says).
#
# For each shape: one GGUF (the default model's file where SHAPES names `default`), a warm-up of
# each engine, then `engine bench --backend cpu` with `[backend.cpu] threads = T` (one warm-up repetition,
# then REPEAT timed) and `llama-bench -p P -n G -t T -r REPEAT`, for each T of THREADS.
# $OUT gets every JSON (tandem's bench schema, llama.cpp's through bench/peer_llamacpp.py),
# summary.tsv (shape, threads, engine, prefill, decode) and cpu.log.
#
# Parameters: SHAPES ("gemma3-1b gemma3-4b"; `default` = the cached default model), DTYPE (the
# synth files' weight format: q4_k; bf16 for a Hugging Face checkpoint's), THREADS
# ("16"), PROMPT_TOKENS (512), GEN_TOKENS (128), REPEAT (2), ENGINE (.devcarry/engine, else
# target/release/engine), LLAMA_BENCH (built from PEER=.peer into /tmp/lcpp when unset and
# absent), CPU_OPTIONS (more `[backend.cpu]` lines for tandem, e.g. 'spin = false'), OUT.
set -uo pipefail
SHAPES=${SHAPES:-"gemma3-1b gemma3-4b"}
DTYPE=${DTYPE:-q4_k}
THREADS=${THREADS:-16}
P=${PROMPT_TOKENS:-512}
G=${GEN_TOKENS:-128}
R=${REPEAT:-2}
E=${ENGINE:-.devcarry/engine}
[ -x "$E" ] || chmod +x "$E" 2>/dev/null || E=target/release/engine
PEER=${PEER:-.peer}
OUT=${OUT:-$PWD/cpu-out}
W=/tmp/tandem-cpu-bench
mkdir -p "$OUT" "$W"
COMMAND="SHAPES=\"$SHAPES\" DTYPE=$DTYPE THREADS=\"$THREADS\" PROMPT_TOKENS=$P GEN_TOKENS=$G REPEAT=$R${CPU_OPTIONS:+ CPU_OPTIONS=\"$CPU_OPTIONS\"} bash bench/cpu-vs-llamacpp.sh"
{
echo "$COMMAND"
"$E" --version
LLAMA=${LLAMA_BENCH:-/tmp/lcpp/build/bin/llama-bench}
if [ ! -x "$LLAMA" ]; then
    s=$(date +%s)
    OUTDIR=$W/peer TARGETS=llama-bench MODELS="" bash "$PEER/build-and-bench.sh" >"$W/peer-build.log" 2>&1 ||
        { tail -20 "$W/peer-build.log"; echo "llama-bench did not build"; }
    echo "llama-bench built in $(($(date +%s) - s)) s"
fi
# The kit's Vulkan loader for its build; no GPU for llama.cpp: that build finds no driver.
[ -d /tmp/vk/usr/lib/x86_64-linux-gnu ] && export LD_LIBRARY_PATH=/tmp/vk/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export VK_DRIVER_FILES=/nonexistent
printf 'shape\tthreads\tengine\tprefill_tok_s\tdecode_tok_s\n' >"$OUT/summary.tsv"
for shape in $SHAPES; do
    if [ "$shape" = default ]; then
        g=${DEFAULT_MODEL:-$HOME/.cache/tandem/gemma-3-270m-q4_k_m.gguf}
    else
        g=$W/$shape-$DTYPE.gguf
        [ -s "$g" ] || "$E" synth --shape "$shape" --dtype "$DTYPE" --out "$g" >/dev/null || { echo "synth $shape failed"; continue; }
    fi
    # Warm-up of both (page cache, CPU clocks).
    "$LLAMA" -m "$g" -p 64 -n 16 -ngl 0 -r 1 -t "${THREADS%% *}" >/dev/null 2>&1
    for t in $THREADS; do
        printf '[backend.cpu]\nthreads = %s\n%s\n' "$t" "${CPU_OPTIONS:-}" >"$W/t$t.toml"
        echo "== $shape, $t threads: engine bench --backend cpu --prompt-tokens $P --gen-tokens $G --repeat $R"
        timeout 400 "$E" --config "$W/t$t.toml" bench --model "$g" --backend cpu --prompt-tokens "$P" --gen-tokens "$G" \
            --repeat "$R" --json --out "$OUT/$shape-t$t-tandem.json" >/dev/null 2>"$W/tandem.err" ||
            { echo "   engine bench failed"; tail -3 "$W/tandem.err"; }
        echo "== $shape, $t threads: llama-bench -p $P -n $G -ngl 0 -t $t -r $R"
        timeout 400 python3 bench/peer_llamacpp.py --llama-bench "$LLAMA" --model "$g" --threads "$t" \
            --prompt-tokens "$P" --gen-tokens "$G" --repeat "$R" --peak-from "$OUT/$shape-t$t-tandem.json" --out "$OUT/$shape-t$t-llamacpp.json" >/dev/null 2>"$W/peer.err" ||
            { echo "   llama-bench failed"; tail -3 "$W/peer.err"; }
        for eng in llamacpp tandem; do
            python3 - "$OUT/$shape-t$t-$eng.json" "$shape" "$t" "$eng" >>"$OUT/summary.tsv" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))["runs"][0]
except Exception:
    sys.exit(0)
print(f"{sys.argv[2]}\t{sys.argv[3]}\t{sys.argv[4]}\t{r['prefill_tokens_per_s']['median']:.1f}\t{r['decode_tokens_per_s']['median']:.1f}")
PY
        done
        tail -2 "$OUT/summary.tsv"
    done
done
} 2>&1 | tee "$OUT/cpu.log"
